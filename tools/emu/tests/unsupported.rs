//! What the emulated kernel answers for features the emulated HCA does not implement, and
//! for bad flows: the errno and capability bits a real mlx5_ib gives (one test per line of
//! the table in docs/emulator-kernel.md), so programs that probe for a feature see it as
//! absent, not as broken.

mod common;

use common::*;
use mlx5_emu::{EmuConfig, Emulator, Errno, LinkLayer, RunMode};
use mlx5_ffi::ioctl::*;
use mlx5_ffi::mlx5::*;
use mlx5_ffi::uverbs::*;
use zerocopy::{FromBytes, IntoBytes};

const EINVAL: Errno = Errno(libc::EINVAL);
const EOPNOTSUPP: Errno = Errno(libc::EOPNOTSUPP);

fn emu() -> Emulator {
    stepped(1)
}

/// A PRM command mailbox whose opcode is `op` (big-endian, first 16 bits).
fn prm_cmd(op: u16) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[..2].copy_from_slice(&op.to_be_bytes());
    c
}

fn devx_call(
    ctx: &Ctx,
    object: u16,
    method: u16,
    cmd_in: u16,
    cmd_out: u16,
    op: u16,
) -> Result<(), Errno> {
    let cmd = prm_cmd(op);
    let mut out = [0u8; 64];
    let mut b = IoctlBuilder::new(object, method)
        .in_ptr(cmd_in, cmd.as_ptr() as u64, cmd.len() as u16)
        .out_ptr(cmd_out, out.as_mut_ptr() as u64, out.len() as u16)
        .build()
        .unwrap();
    ctx.dev.cmd_ioctl(&mut b)
}

#[test]
fn devx_general_command_probe_is_eopnotsupp_and_other_general_commands_einval() {
    let e = emu();
    let ctx = Ctx::open(&e, 0);
    // QUERY_HCA_CAP (whitelisted): mlx5_ib would use the device uid, which this HCA lacks.
    let r = devx_call(
        &ctx,
        MLX5_IB_OBJECT_DEVX,
        MLX5_IB_METHOD_DEVX_OTHER,
        MLX5_IB_ATTR_DEVX_OTHER_CMD_IN,
        MLX5_IB_ATTR_DEVX_OTHER_CMD_OUT,
        MLX5_DEVX_WHITELIST_OPCODES[0],
    );
    assert_eq!(r, Err(EOPNOTSUPP), "was EPROTONOSUPPORT (method unknown)");
    // A non-whitelisted general command needs a DEVX context.
    let r = devx_call(
        &ctx,
        MLX5_IB_OBJECT_DEVX,
        MLX5_IB_METHOD_DEVX_OTHER,
        MLX5_IB_ATTR_DEVX_OTHER_CMD_IN,
        MLX5_IB_ATTR_DEVX_OTHER_CMD_OUT,
        0x0101, // QUERY_ADAPTER
    );
    assert_eq!(r, Err(EINVAL));
}

#[test]
fn devx_object_create_of_an_mkey_is_einval_without_a_devx_context() {
    let e = emu();
    let ctx = Ctx::open(&e, 0);
    let cmd = prm_cmd(0x200); // CREATE_MKEY
    let mut out = [0u8; 64];
    let mut b = IoctlBuilder::new(MLX5_IB_OBJECT_DEVX_OBJ, MLX5_IB_METHOD_DEVX_OBJ_CREATE)
        .out_obj(MLX5_IB_ATTR_DEVX_OBJ_CREATE_HANDLE)
        .in_ptr(MLX5_IB_ATTR_DEVX_OBJ_CREATE_CMD_IN, cmd.as_ptr() as u64, 16)
        .out_ptr(
            MLX5_IB_ATTR_DEVX_OBJ_CREATE_CMD_OUT,
            out.as_mut_ptr() as u64,
            64,
        )
        .build()
        .unwrap();
    assert_eq!(
        ctx.dev.cmd_ioctl(&mut b),
        Err(EINVAL),
        "was EPROTONOSUPPORT (method unknown)"
    );
}

#[test]
fn devx_context_opens_and_its_unimplemented_general_commands_fail_in_the_firmware() {
    // libmlx5 asks for a DEVX context on every open (and, if refused, retries with ever
    // shorter requests down to the v1 one, losing CQE version 1 and the UAR capabilities), so
    // the context is granted as on a DEVX-capable mlx5_ib; its general commands reach the
    // emulated firmware, which answers QUERY_HCA_CAP (tests/devx.rs) and fails the other
    // general queries with "bad opcode": EREMOTEIO, as mlx5_ib's mlx5_cmd_do answers.
    let e = emu();
    let dev = e.open(0).unwrap();
    let req = Mlx5IbAllocUcontextReqV2 {
        total_num_bfregs: 16,
        num_low_latency_bfregs: 4,
        flags: MLX5_IB_ALLOC_UCTX_DEVX,
        max_cqe_version: 1,
        ..Default::default()
    };
    let (core, drv) = write_cmd(
        &dev,
        IB_USER_VERBS_CMD_GET_CONTEXT,
        &[0u8; 8],
        req.as_bytes(),
        8,
        size_of::<Mlx5IbAllocUcontextResp>(),
    )
    .expect("a DEVX context, with its v2 request");
    let resp = Mlx5IbAllocUcontextResp::read_from_bytes(&drv).unwrap();
    assert_eq!(resp.cqe_version, 1, "the v2 request was honoured");
    let async_fd = IbUverbsGetContextResp::read_from_bytes(&core)
        .unwrap()
        .async_fd as i32;
    let ctx = Ctx::from_parts(e.clone(), dev, async_fd, resp, Vec::new());
    for (op, want) in [
        (MLX5_DEVX_WHITELIST_OPCODES[0], Ok(())),
        (0x0101, Err(Errno(libc::EREMOTEIO))),
        (0x0842, Err(Errno(libc::EREMOTEIO))),
        // Not a general command (CREATE_QP): refused before the firmware.
        (0x0500, Err(EINVAL)),
    ] {
        let r = devx_call(
            &ctx,
            MLX5_IB_OBJECT_DEVX,
            MLX5_IB_METHOD_DEVX_OTHER,
            MLX5_IB_ATTR_DEVX_OTHER_CMD_IN,
            MLX5_IB_ATTR_DEVX_OTHER_CMD_OUT,
            op,
        );
        assert_eq!(r, want, "opcode {op:#x} on a DEVX context");
    }
}

#[test]
fn odp_memory_registration_is_eopnotsupp_and_odp_caps_are_zero() {
    let e = emu();
    let ctx = Ctx::open(&e, 0);
    let pd = ctx.alloc_pd();
    let mem = Buf::new(4096);
    assert_eq!(
        ctx.reg_mr(
            pd,
            mem.addr(),
            4096,
            access::LOCAL_WRITE | access::ON_DEMAND
        )
        .map(|_| ()),
        Err(EOPNOTSUPP),
        "was EINVAL"
    );
    // The huge-page hint is a supported flag: accepted.
    ctx.reg_mr(pd, mem.addr(), 4096, access::LOCAL_WRITE | access::HUGETLB)
        .expect("IBV_ACCESS_HUGETLB is only a hint");
    // An unknown optional flag is ignored, an unknown mandatory one is EINVAL.
    ctx.reg_mr(pd, mem.addr(), 4096, access::LOCAL_WRITE | (1 << 25))
        .expect("unknown optional access flag");
    assert_eq!(
        ctx.reg_mr(pd, mem.addr(), 4096, access::LOCAL_WRITE | (1 << 12))
            .map(|_| ()),
        Err(EINVAL)
    );
    let (core, _) = ex_query_device(&ctx);
    assert_eq!(core.odp_caps.general_caps, 0, "no IB_ODP_SUPPORT");
}

/// Extended QUERY_DEVICE: (core, mlx5) responses.
fn ex_query_device(ctx: &Ctx) -> (IbUverbsExQueryDeviceResp, Mlx5IbQueryDeviceResp) {
    let mut out = vec![0u8; 304 + 104];
    let b = mlx5_ffi::cmd::build_write_ex(
        IB_USER_VERBS_CMD_QUERY_DEVICE,
        out.as_mut_ptr() as u64,
        &[0u8; 8],
        304,
        &[],
        104,
    )
    .unwrap();
    ctx.dev.cmd_write(&b).expect("EX_QUERY_DEVICE");
    (
        IbUverbsExQueryDeviceResp::read_from_bytes(&out[..304]).unwrap(),
        Mlx5IbQueryDeviceResp::read_from_bytes(&out[304..]).unwrap(),
    )
}

#[test]
fn query_device_reports_unimplemented_features_as_absent() {
    let e = emu();
    let ctx = Ctx::open(&e, 0);
    let (core, mlx5) = ex_query_device(&ctx);
    let b = core.base;
    let flags = u64::from(b.device_cap_flags);
    for (flag, name) in [
        (IB_UVERBS_DEVICE_MEM_WINDOW, "MEM_WINDOW"),
        (IB_UVERBS_DEVICE_MEM_WINDOW_TYPE_2A, "MEM_WINDOW_TYPE_2A"),
        (IB_UVERBS_DEVICE_MEM_WINDOW_TYPE_2B, "MEM_WINDOW_TYPE_2B"),
        (IB_UVERBS_DEVICE_UD_IP_CSUM, "UD_IP_CSUM"),
        (
            IB_UVERBS_DEVICE_MANAGED_FLOW_STEERING,
            "MANAGED_FLOW_STEERING",
        ),
    ] {
        assert_eq!(flags & flag, 0, "{name} is not implemented");
    }
    assert_eq!(b.max_mw, 0, "memory windows: was 1 << 24");
    assert_eq!(core.max_dm_size, 0, "no device memory");
    assert_eq!(core.tm_caps.max_num_tags, 0, "no tag matching");
    assert_eq!(core.rss_caps.supported_qpts, 0, "no RSS");
    assert_eq!(core.max_wq_type_rq, 0, "no WQs");
    assert_eq!(mlx5.tso_caps.max_tso, 0);
    assert_eq!(mlx5.cqe_comp_caps.max_num, 0, "no CQE compression");
    assert_eq!(mlx5.striding_rq_caps.supported_qpts, 0);
    assert_eq!(mlx5.packet_pacing_caps.qp_rate_limit_max, 0);
    assert_eq!(mlx5.response_length, 104);
}

#[test]
fn device_memory_allocation_is_eopnotsupp() {
    let e = emu();
    let ctx = Ctx::open(&e, 0);
    let mut b = IoctlBuilder::new(UVERBS_OBJECT_DM, UVERBS_METHOD_DM_ALLOC)
        .out_obj(UVERBS_ATTR_ALLOC_DM_HANDLE)
        .in_u64(UVERBS_ATTR_ALLOC_DM_LENGTH, 4096)
        .in_u32(UVERBS_ATTR_ALLOC_DM_ALIGNMENT, 12)
        .build()
        .unwrap();
    assert_eq!(
        ctx.dev.cmd_ioctl(&mut b),
        Err(EOPNOTSUPP),
        "was EPROTONOSUPPORT (method unknown)"
    );
}

#[test]
fn uar_allocation_of_an_unknown_type_is_eopnotsupp() {
    let e = emu();
    let ctx = Ctx::open(&e, 0);
    let mut off = 0u64;
    let mut len = 0u32;
    let mut id = 0u32;
    let mut b = IoctlBuilder::new(MLX5_IB_OBJECT_UAR, MLX5_IB_METHOD_UAR_OBJ_ALLOC)
        .out_obj(MLX5_IB_ATTR_UAR_OBJ_ALLOC_HANDLE)
        .in_u32(MLX5_IB_ATTR_UAR_OBJ_ALLOC_TYPE, 7)
        .out_ptr(
            MLX5_IB_ATTR_UAR_OBJ_ALLOC_MMAP_OFFSET,
            (&raw mut off) as u64,
            8,
        )
        .out_ptr(
            MLX5_IB_ATTR_UAR_OBJ_ALLOC_MMAP_LENGTH,
            (&raw mut len) as u64,
            4,
        )
        .out_ptr(MLX5_IB_ATTR_UAR_OBJ_ALLOC_PAGE_ID, (&raw mut id) as u64, 4)
        .build()
        .unwrap();
    assert_eq!(ctx.dev.cmd_ioctl(&mut b), Err(EOPNOTSUPP), "was EINVAL");
}

/// Extended CREATE_QP with `create_flags` (everything else valid).
fn ex_create_qp(ctx: &mut Ctx, flags: u32) -> Result<(), Errno> {
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(8, 64, -1);
    let buf = Buf::new(8 * 64 + 4 * 16);
    let db = ctx.db();
    let core = IbUverbsExCreateQp {
        pd_handle: pd,
        send_cq_handle: cq.handle,
        recv_cq_handle: cq.handle,
        max_send_wr: 8,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        qp_type: qp_type::RC,
        create_flags: flags,
        ..Default::default()
    };
    let drv = Mlx5IbCreateQp {
        buf_addr: buf.addr(),
        db_addr: db,
        sq_wqe_count: 8,
        rq_wqe_count: 4,
        rq_wqe_shift: 4,
        uidx: 1,
        ..Default::default()
    };
    let mut out = vec![0u8; 40 + 40];
    let b = mlx5_ffi::cmd::build_write_ex(
        IB_USER_VERBS_CMD_CREATE_QP,
        out.as_mut_ptr() as u64,
        core.as_bytes(),
        40,
        drv.as_bytes(),
        40,
    )
    .unwrap();
    ctx.dev.cmd_write(&b).map(|_| ())
}

#[test]
fn qp_create_flags_the_hca_lacks_are_eopnotsupp_unknown_ones_einval() {
    let e = emu();
    let mut ctx = Ctx::open(&e, 0);
    ex_create_qp(&mut ctx, 0).expect("plain extended CREATE_QP");
    for f in [
        IB_UVERBS_QP_CREATE_BLOCK_MULTICAST_LOOPBACK,
        IB_UVERBS_QP_CREATE_SCATTER_FCS,
        IB_UVERBS_QP_CREATE_CVLAN_STRIPPING,
        IB_QP_CREATE_SOURCE_QPN,
        IB_UVERBS_QP_CREATE_PCI_WRITE_END_PADDING,
    ] {
        assert_eq!(
            ex_create_qp(&mut ctx, f),
            Err(EOPNOTSUPP),
            "flag {f:#x}: was EINVAL"
        );
    }
    assert_eq!(
        ex_create_qp(&mut ctx, 1 << 20),
        Err(EINVAL),
        "not a create flag"
    );
    // Over ioctl: unknown bits EINVAL, known-but-absent EOPNOTSUPP.
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(8, 64, -1);
    for (flags, want) in [
        (1u32 << 20, EINVAL),
        (IB_UVERBS_QP_CREATE_SCATTER_FCS, EOPNOTSUPP),
    ] {
        let cap = IbUverbsQpCap {
            max_send_wr: 8,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let mut b = IoctlBuilder::new(UVERBS_OBJECT_QP, UVERBS_METHOD_QP_CREATE)
            .out_obj(UVERBS_ATTR_CREATE_QP_HANDLE)
            .in_obj(UVERBS_ATTR_CREATE_QP_PD_HANDLE, pd)
            .in_obj(UVERBS_ATTR_CREATE_QP_SEND_CQ_HANDLE, cq.handle)
            .in_obj(UVERBS_ATTR_CREATE_QP_RECV_CQ_HANDLE, cq.handle)
            .in_ptr(
                UVERBS_ATTR_CREATE_QP_CAP,
                cap.as_bytes().as_ptr() as u64,
                20,
            )
            .in_u32(UVERBS_ATTR_CREATE_QP_TYPE, IB_UVERBS_QPT_RC)
            .in_u32(UVERBS_ATTR_CREATE_QP_FLAGS, flags)
            .build()
            .unwrap();
        assert_eq!(ctx.dev.cmd_ioctl(&mut b), Err(want), "flags {flags:#x}");
    }
}

#[test]
fn qp_types_the_hca_lacks_are_eopnotsupp() {
    let e = emu();
    let mut ctx = Ctx::open(&e, 0);
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(8, 64, -1);
    // (XRC_INI, XRC_TGT and DRIVER (DC) are implemented: tools/emu/tests/xrc_dc.rs.)
    #[allow(clippy::single_element_loop)]
    for t in [qp_type::RAW_PACKET] {
        let c = IbUverbsCreateQp {
            pd_handle: pd,
            send_cq_handle: cq.handle,
            recv_cq_handle: cq.handle,
            max_send_wr: 1,
            qp_type: t,
            ..Default::default()
        };
        let r = run_cmd(
            &ctx.dev,
            IB_USER_VERBS_CMD_CREATE_QP,
            c.as_bytes(),
            Mlx5IbCreateQp::default().as_bytes(),
            (32, 40),
        );
        assert_eq!(r, Err(EOPNOTSUPP), "QP type {t}");
    }
}

#[test]
fn gid_table_query_with_a_buffer_too_small_for_the_table_is_einval() {
    let e = Emulator::new(EmuConfig {
        mode: RunMode::Stepped,
        link_layer: LinkLayer::Ethernet,
        ..EmuConfig::default()
    });
    let ctx = Ctx::open(&e, 0);
    let query = |room: usize, entry_size: u64| {
        let mut entries = vec![IbUverbsGidEntry::default(); room.max(1)];
        let mut n = 0u64;
        let mut b = IoctlBuilder::new(UVERBS_OBJECT_DEVICE, UVERBS_METHOD_QUERY_GID_TABLE)
            .in_u64(UVERBS_ATTR_QUERY_GID_TABLE_ENTRY_SIZE, entry_size)
            .out_ptr(
                UVERBS_ATTR_QUERY_GID_TABLE_RESP_ENTRIES,
                entries.as_mut_bytes().as_mut_ptr() as u64,
                (32 * room) as u16,
            )
            .out_ptr(
                UVERBS_ATTR_QUERY_GID_TABLE_RESP_NUM_ENTRIES,
                (&raw mut n) as u64,
                8,
            )
            .build()
            .unwrap();
        ctx.dev.cmd_ioctl(&mut b).map(|()| n)
    };
    let n = query(16, 32).expect("room for the whole table");
    assert!(n >= 2, "a RoCE port has several GIDs ({n})");
    assert_eq!(query(1, 32), Err(EINVAL), "was Ok with a cut table");
    assert_eq!(query(n as usize - 1, 32), Err(EINVAL));
    assert_eq!(query(0, 32), Err(EINVAL), "no room at all");
    assert_eq!(query(n as usize, 32), Ok(n), "exactly the table");
}

#[test]
fn depths_are_rounded_as_mlx5_ib_rounds_them() {
    let e = emu();
    let mut ctx = Ctx::open(&e, 0);
    // CQ: entries + 1 rounded up to a power of two, minus one reported.
    for (asked, told) in [(1u32, 1u32), (7, 7), (8, 15), (100, 127)] {
        let ncqe = (asked + 1).next_power_of_two();
        let buf = Buf::new((ncqe * 64) as usize);
        let db = ctx.db();
        let c = IbUverbsCreateCq {
            cqe: asked,
            comp_channel: -1,
            ..Default::default()
        };
        let d = Mlx5IbCreateCq {
            buf_addr: buf.addr(),
            db_addr: db,
            cqe_size: 64,
            ..Default::default()
        };
        let (core, _) = write_cmd(
            &ctx.dev,
            IB_USER_VERBS_CMD_CREATE_CQ,
            c.as_bytes(),
            d.as_bytes(),
            8,
            8,
        )
        .expect("CREATE_CQ");
        let r = IbUverbsCreateCqResp::read_from_bytes(&core).unwrap();
        assert_eq!(r.cqe, told, "CQ of {asked}");
    }
    // SRQ: max_wr + 1 rounded up to a power of two, minus one reported.
    let pd = ctx.alloc_pd();
    for (asked, told) in [(1u32, 1u32), (3, 3), (4, 7), (100, 127)] {
        let buf = Buf::new(((asked + 1).next_power_of_two() * 32) as usize);
        let db = ctx.db();
        let c = IbUverbsCreateSrq {
            pd_handle: pd,
            max_wr: asked,
            max_sge: 1,
            ..Default::default()
        };
        let d = Mlx5IbCreateSrq {
            buf_addr: buf.addr(),
            db_addr: db,
            ..Default::default()
        };
        let (core, _) = write_cmd(
            &ctx.dev,
            IB_USER_VERBS_CMD_CREATE_SRQ,
            c.as_bytes(),
            d.as_bytes(),
            16,
            8,
        )
        .expect("CREATE_SRQ");
        let r = IbUverbsCreateSrqResp::read_from_bytes(&core).unwrap();
        assert_eq!(r.max_wr, told, "SRQ of {asked}");
    }
}
