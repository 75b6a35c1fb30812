//! `mlx5 decode` of XRC and DC send WQEs (`--xrc`, `--dc`): the transport segment after
//! the control segment, then the operation's segments. The golden inputs are WQEs libmlx5
//! built (captured with `MLX5_EMU_WQE_LOG` from perftest `ib_write_lat -c XRC` and
//! `ib_send_lat -c DC` on the emulated HCA), so the decoder is checked against the real
//! layout, not against our own encoder.

use std::process::Command;

use mlx5_hw::opcodes::SendOpcode;
use mlx5_hw::wqe::{CtrlSeg, FM_CE_SE_CQ_UPDATE};
use mlx5_tools::decode::{Decoded, WqeTransport, decode_wqe_on};
use serde_json::Value;
use zerocopy::IntoBytes;

/// libmlx5's RDMA WRITE (2 bytes inline) on an XRC initiator to XRC SRQ 0x030003.
const XRC_WRITE: &str = "000000080600040400000008000000000003000300000000000000000000000000005559a9c8a0000030016c0000000080000002000100000000000000000000";
/// libmlx5's SEND (2 bytes inline) on a DCI to DCT 0x050006 at LID 5, DC key 0xffeeddcc.
const DC_SEND: &str = "0000000a02000505000000080000000000000000ffeeddcc8005000600000005000000000000000000000000000000000000000000000000000000000000000080000002e0df00000000000000000000";

fn bytes(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

fn num(d: &Decoded, sec: &str, field: &str) -> u64 {
    let v = d
        .value(sec, field)
        .unwrap_or_else(|| panic!("{sec}.{field} missing in\n{}", d.to_text()));
    v.as_u64()
        .or_else(|| v.get("value").and_then(Value::as_u64))
        .unwrap_or_else(|| panic!("{sec}.{field} = {v} is not a number"))
}

fn names(d: &Decoded) -> Vec<&str> {
    d.sections.iter().map(|s| s.name.as_str()).collect()
}

#[test]
fn an_xrc_write_decodes_its_srq_number_then_raddr_and_inline_data() {
    let d = decode_wqe_on(&bytes(XRC_WRITE), WqeTransport::Xrc).unwrap();
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    assert_eq!(names(&d), ["ctrl", "xrc", "raddr", "inline"]);
    assert_eq!(num(&d, "xrc", "xrc_srqn"), 0x03_0003);
    assert_eq!(num(&d, "raddr", "raddr"), 0x5559_a9c8_a000);
    assert_eq!(num(&d, "raddr", "rkey"), 0x0030_016c);
    assert_eq!(num(&d, "inline", "byte_count"), 2);
    // Read as an RC WQE, the XRC segment would be taken for the remote address.
    let rc = decode_wqe_on(&bytes(XRC_WRITE), WqeTransport::Connected).unwrap();
    assert_eq!(num(&rc, "raddr", "raddr") >> 32, 0x03_0003);
}

#[test]
fn a_dc_send_decodes_its_dct_key_and_address_then_inline_data() {
    let d = decode_wqe_on(&bytes(DC_SEND), WqeTransport::Dci).unwrap();
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    assert_eq!(names(&d), ["ctrl", "dc_av", "inline"]);
    assert_eq!(num(&d, "dc_av", "dctn"), 0x05_0006);
    assert_eq!(num(&d, "dc_av", "dc_key"), 0xffee_ddcc);
    assert_eq!(num(&d, "dc_av", "rlid"), 5);
    assert_eq!(num(&d, "inline", "byte_count"), 2);
}

#[test]
fn a_transport_segment_cut_short_is_a_warning() {
    // ds = 2 (32 bytes) on a DCI: no room for the 48-byte address vector.
    let ctrl = CtrlSeg::new(SendOpcode::SEND, 0, 0, 0x12, 2, FM_CE_SE_CQ_UPDATE, 0);
    let mut b = ctrl.as_bytes().to_vec();
    b.extend_from_slice(&[0; 16]);
    let d = decode_wqe_on(&b, WqeTransport::Dci).unwrap();
    assert!(
        d.warnings.iter().any(|w| w.contains("DC address vector")),
        "{:?}",
        d.warnings
    );
    // Non-zero reserved bytes of an XRC segment are pointed out.
    let mut x = bytes(XRC_WRITE);
    x[20] = 1;
    let d = decode_wqe_on(&x, WqeTransport::Xrc).unwrap();
    assert!(
        d.warnings.iter().any(|w| w.contains("reserved")),
        "{:?}",
        d.warnings
    );
}

#[test]
fn the_binary_takes_xrc_and_dc() {
    let run = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_mlx5"))
            .args(args)
            .output()
            .expect("run mlx5");
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
        )
    };
    let (code, out) = run(&["decode", "wqe", "--dc", DC_SEND]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("dctn") && out.contains("0x050006"), "{out}");
    let (code, out) = run(&["decode", "wqe", "--xrc", XRC_WRITE]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("xrc_srqn : 0x030003"), "{out}");
    let (code, _) = run(&["decode", "wqe", "--xrc", "--dc", XRC_WRITE]);
    assert_ne!(code, Some(0), "--xrc and --dc exclude each other");
}
