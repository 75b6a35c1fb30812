//! The typed command table (`mlx5_ffi::cmd::cmds`): every command encodes to a buffer the
//! kernel-side parser accepts, with the response pointer where the kernel looks for it and the
//! response lengths the structs have; decoding gives back the same structs.

use mlx5_ffi::cmd::{
    Command, cmds, core_sizes, decode_drv, decode_req, decode_resp, encode_write, parse_write,
    resp_len,
};
use mlx5_ffi::mlx5::{MLX5_DEVX_WHITELIST_OPCODES, Mlx5IbCreateCq, prm_opcode};
use mlx5_ffi::surface::Errno;
use mlx5_ffi::uverbs::{IbUverbsCreateCq, IbUverbsCreateCqResp};
use zerocopy::{FromZeros, IntoBytes};

const PTR: u64 = 0x7f00_1234_5000;

/// Encode `C` with a request whose bytes are all 0x5a (then the response pointer), parse it as
/// the kernel does and check ids, lengths, response pointer and the decoded request.
fn roundtrip<C: Command>() {
    let mut req = C::Req::new_zeroed();
    req.as_mut_bytes().fill(0x5a);
    let mut drv = C::DrvReq::new_zeroed();
    drv.as_mut_bytes().fill(0xa5);
    let buf = encode_write::<C>(&req, &drv, PTR).unwrap_or_else(|e| panic!("{}: {e}", C::NAME));
    let cmd = parse_write(&buf).unwrap_or_else(|e| panic!("{}: parse {e}", C::NAME));
    assert_eq!(cmd.command, C::ID, "{}", C::NAME);
    assert_eq!(cmd.extended, C::EXTENDED, "{}", C::NAME);
    let sizes = core_sizes(C::ID, C::EXTENDED).expect("in core_sizes");
    assert_eq!(sizes.req, size_of::<C::Req>(), "{}", C::NAME);
    assert_eq!(sizes.resp, size_of::<C::Resp>(), "{}", C::NAME);
    let cmd = cmd
        .split()
        .unwrap_or_else(|e| panic!("{}: split {e}", C::NAME));
    assert_eq!(
        cmd.core_out_len + cmd.driver_out_len,
        resp_len::<C>(),
        "{}",
        C::NAME
    );
    if C::EXTENDED || C::RESPONSE_PTR {
        assert_eq!(cmd.response, PTR, "{}: response pointer", C::NAME);
    } else {
        assert_eq!(cmd.response, 0, "{}: no response pointer", C::NAME);
    }
    let mut want = req;
    if C::RESPONSE_PTR && !C::EXTENDED {
        want.as_mut_bytes()[..8].copy_from_slice(&PTR.to_ne_bytes());
    }
    assert_eq!(
        decode_req::<C>(cmd.core_in).as_bytes(),
        want.as_bytes(),
        "{}",
        C::NAME
    );
    assert_eq!(cmd.core::<C>().as_bytes(), want.as_bytes(), "{}", C::NAME);
    assert_eq!(
        decode_drv::<C>(cmd.driver_in).unwrap().as_bytes(),
        drv.as_bytes(),
        "{}",
        C::NAME
    );
}

#[test]
fn every_command_of_the_table_roundtrips() {
    use cmds::*;
    roundtrip::<GetContext>();
    roundtrip::<QueryDevice>();
    roundtrip::<QueryPort>();
    roundtrip::<AllocPd>();
    roundtrip::<DeallocPd>();
    roundtrip::<CreateAh>();
    roundtrip::<DestroyAh>();
    roundtrip::<RegMr>();
    roundtrip::<DeregMr>();
    roundtrip::<CreateCompChannel>();
    roundtrip::<CreateCq>();
    roundtrip::<DestroyCq>();
    roundtrip::<CreateQp>();
    roundtrip::<QueryQp>();
    roundtrip::<ModifyQp>();
    roundtrip::<DestroyQp>();
    roundtrip::<CreateSrq>();
    roundtrip::<ModifySrq>();
    roundtrip::<QuerySrq>();
    roundtrip::<DestroySrq>();
    roundtrip::<CreateXsrq>();
    roundtrip::<ExQueryDevice>();
    roundtrip::<ExCreateCq>();
    roundtrip::<ExCreateQp>();
    roundtrip::<ExModifyQp>();
}

#[test]
fn create_cq_golden_layout() {
    let req = IbUverbsCreateCq {
        response: 0,
        user_handle: 9,
        cqe: 63,
        comp_vector: 0,
        comp_channel: -1,
        reserved: 0,
    };
    let drv = Mlx5IbCreateCq {
        buf_addr: 0x1000,
        db_addr: 0x2000,
        cqe_size: 64,
        ..Default::default()
    };
    let b = encode_write::<cmds::CreateCq>(&req, &drv, PTR).unwrap();
    // header: command 18, in_words (8 + 32 + 32) / 4 = 18, out_words (8 + 8) / 4 = 4.
    assert_eq!(&b[..8], &[18, 0, 0, 0, 18, 0, 4, 0]);
    assert_eq!(&b[8..16], &PTR.to_ne_bytes(), "response pointer first");
    assert_eq!(&b[24..28], &63u32.to_ne_bytes(), "cqe at core offset 16");
    assert_eq!(
        &b[40..48],
        &0x1000u64.to_ne_bytes(),
        "driver data after the core"
    );
}

#[test]
fn responses_decode_zero_filled() {
    let r = IbUverbsCreateCqResp {
        cq_handle: 3,
        cqe: 63,
    };
    let mut bytes = r.as_bytes().to_vec();
    bytes.extend_from_slice(&77u32.to_ne_bytes());
    // The kernel wrote the core response and 4 of the 8 driver bytes.
    let (core, drv) = decode_resp::<cmds::CreateCq>(&bytes);
    assert_eq!(core, r);
    assert_eq!(drv.cqn, 77);
    assert_eq!(drv.reserved, 0);
    let (core, drv) = decode_resp::<cmds::CreateCq>(&[]);
    assert_eq!((core.cq_handle, drv.cqn), (0, 0));
}

#[test]
fn driver_data_past_the_struct_must_be_zero() {
    let mut d = vec![0u8; size_of::<Mlx5IbCreateCq>() + 8];
    assert!(decode_drv::<cmds::CreateCq>(&d).is_ok());
    d[size_of::<Mlx5IbCreateCq>() + 3] = 1;
    assert_eq!(decode_drv::<cmds::CreateCq>(&d).unwrap_err(), Errno::EINVAL);
    // Shorter driver data reads as zero past its end.
    let short = decode_drv::<cmds::CreateCq>(&0x1234u64.to_ne_bytes()).unwrap();
    assert_eq!((short.buf_addr, short.db_addr), (0x1234, 0));
}

#[test]
fn devx_whitelist_opcodes_are_the_prm_numbers() {
    // QUERY_HCA_CAP, QUERY_HCA_VPORT_CONTEXT, QUERY_ESW_VPORT_CONTEXT, QUERY_ESW_FUNCTIONS.
    assert_eq!(MLX5_DEVX_WHITELIST_OPCODES, [0x100, 0x762, 0x752, 0x740]);
    assert_eq!(prm_opcode(&[0x01, 0x00, 0xff, 0xff]), Some(0x100));
    assert_eq!(prm_opcode(&[0x07]), None);
}
