//! DEVX on a DEVX context (`kernel/devx*.rs`): the capability pages QUERY_HCA_CAP answers,
//! umems, the legacy dynamic UAR and its device index, a DEVX QP through its life (and the
//! firmware's refusals of forged creates and transitions), the SRQ_LAST_WQE event on a
//! subscribed channel, and forged mailboxes by the thousand that never crash anything.

mod common;

use std::sync::Arc;

use common::*;
use mlx5_emu::{Emulator, Errno, UverbsSurface};
use mlx5_ffi::ioctl::*;
use mlx5_ffi::mlx5::*;
use mlx5_ffi::prm::{self, Field, ads, cap_type, hca_cap, hdr, mkey, op, qp, qpc, rmp, status};
use mlx5_ffi::uverbs::*;
use mlx5_hw::opcodes::{SendOpcode, Syndrome};
use mlx5_hw::wqe::{AtomicSeg, DataSeg, FM_CE_SE_CQ_UPDATE, RaddrSeg};
use zerocopy::{FromBytes, IntoBytes};

const EINVAL: Errno = Errno(libc::EINVAL);
const EREMOTEIO: Errno = Errno(libc::EREMOTEIO);

/// A context of HCA 0 opened with `MLX5_IB_ALLOC_UCTX_DEVX`.
fn devx_ctx(e: &Emulator) -> Ctx {
    devx_ctx_on(e, 0)
}

/// A context of HCA `hca` opened with `MLX5_IB_ALLOC_UCTX_DEVX`.
fn devx_ctx_on(e: &Emulator, hca: usize) -> Ctx {
    let dev = e.open(hca).unwrap();
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
    .expect("a DEVX context");
    let resp = Mlx5IbAllocUcontextResp::read_from_bytes(&drv).unwrap();
    let async_fd = IbUverbsGetContextResp::read_from_bytes(&core)
        .unwrap()
        .async_fd as i32;
    Ctx::from_parts(e.clone(), dev, async_fd, resp, Vec::new())
}

/// A PRM command (in, out) pair through a DEVX method; the output mailbox either way.
fn prm_call(
    dev: &Arc<dyn UverbsSurface>,
    object: u16,
    method: u16,
    handle: Option<(u16, u32)>,
    ids: (u16, u16),
    cmd: &[u8],
    out_len: usize,
) -> (Result<(), Errno>, Vec<u8>, Vec<u8>) {
    let mut out = vec![0u8; out_len];
    let mut b = IoctlBuilder::new(object, method);
    if let Some((id, h)) = handle {
        b.in_obj(id, h);
    }
    if method == MLX5_IB_METHOD_DEVX_OBJ_CREATE && object == MLX5_IB_OBJECT_DEVX_OBJ {
        b.out_obj(MLX5_IB_ATTR_DEVX_OBJ_CREATE_HANDLE);
    }
    let mut buf = b
        .in_ptr(ids.0, cmd.as_ptr() as u64, cmd.len() as u16)
        .out_ptr(ids.1, out.as_mut_ptr() as u64, out.len() as u16)
        .build()
        .unwrap();
    let r = dev.cmd_ioctl(&mut buf);
    (r, out, buf)
}

fn general(ctx: &Ctx, cmd: &[u8], out_len: usize) -> (Result<(), Errno>, Vec<u8>) {
    let (r, out, _) = prm_call(
        &ctx.dev,
        MLX5_IB_OBJECT_DEVX,
        MLX5_IB_METHOD_DEVX_OTHER,
        None,
        (
            MLX5_IB_ATTR_DEVX_OTHER_CMD_IN,
            MLX5_IB_ATTR_DEVX_OTHER_CMD_OUT,
        ),
        cmd,
        out_len,
    );
    (r, out)
}

/// DEVX_OBJ create: (result, output mailbox, new handle).
fn obj_create(ctx: &Ctx, cmd: &[u8]) -> (Result<(), Errno>, Vec<u8>, u32) {
    let (r, out, buf) = prm_call(
        &ctx.dev,
        MLX5_IB_OBJECT_DEVX_OBJ,
        MLX5_IB_METHOD_DEVX_OBJ_CREATE,
        None,
        (
            MLX5_IB_ATTR_DEVX_OBJ_CREATE_CMD_IN,
            MLX5_IB_ATTR_DEVX_OBJ_CREATE_CMD_OUT,
        ),
        cmd,
        64,
    );
    let h = parse_ioctl(&buf)
        .unwrap()
        .find(MLX5_IB_ATTR_DEVX_OBJ_CREATE_HANDLE)
        .map_or(u32::MAX, |(_, a)| a.data as u32);
    (r, out, h)
}

fn obj_modify(ctx: &Ctx, h: u32, cmd: &[u8], query: bool) -> (Result<(), Errno>, Vec<u8>) {
    let method = if query {
        MLX5_IB_METHOD_DEVX_OBJ_QUERY
    } else {
        MLX5_IB_METHOD_DEVX_OBJ_MODIFY
    };
    let (r, out, _) = prm_call(
        &ctx.dev,
        MLX5_IB_OBJECT_DEVX_OBJ,
        method,
        Some((MLX5_IB_ATTR_DEVX_OBJ_MODIFY_HANDLE, h)),
        (
            MLX5_IB_ATTR_DEVX_OBJ_MODIFY_CMD_IN,
            MLX5_IB_ATTR_DEVX_OBJ_MODIFY_CMD_OUT,
        ),
        cmd,
        qp::QUERY_OUT_BYTES,
    );
    (r, out)
}

fn obj_destroy(ctx: &Ctx, h: u32) -> Result<(), Errno> {
    let mut b = IoctlBuilder::new(MLX5_IB_OBJECT_DEVX_OBJ, MLX5_IB_METHOD_DEVX_OBJ_DESTROY)
        .in_obj(MLX5_IB_ATTR_DEVX_OBJ_DESTROY_HANDLE, h)
        .build()
        .unwrap();
    ctx.dev.cmd_ioctl(&mut b)
}

/// UMEM_REG of `buf`: (handle, umem id).
fn umem_reg(ctx: &Ctx, addr: u64, len: u64) -> Result<(u32, u32), Errno> {
    let mut id = 0u32;
    let mut b = IoctlBuilder::new(MLX5_IB_OBJECT_DEVX_UMEM, MLX5_IB_METHOD_DEVX_UMEM_REG)
        .out_obj(MLX5_IB_ATTR_DEVX_UMEM_REG_HANDLE)
        .in_u64(MLX5_IB_ATTR_DEVX_UMEM_REG_ADDR, addr)
        .in_u64(MLX5_IB_ATTR_DEVX_UMEM_REG_LEN, len)
        .in_u32(MLX5_IB_ATTR_DEVX_UMEM_REG_ACCESS, LOCAL_WRITE)
        .out_ptr(
            MLX5_IB_ATTR_DEVX_UMEM_REG_OUT_ID,
            &mut id as *mut u32 as u64,
            4,
        )
        .build()
        .unwrap();
    ctx.dev.cmd_ioctl(&mut b)?;
    let h = parse_ioctl(&b)
        .unwrap()
        .find(MLX5_IB_ATTR_DEVX_UMEM_REG_HANDLE)
        .unwrap()
        .1
        .data as u32;
    Ok((h, id))
}

fn umem_dereg(ctx: &Ctx, h: u32) -> Result<(), Errno> {
    let mut b = IoctlBuilder::new(MLX5_IB_OBJECT_DEVX_UMEM, MLX5_IB_METHOD_DEVX_UMEM_DEREG)
        .in_obj(MLX5_IB_ATTR_DEVX_UMEM_DEREG_HANDLE, h)
        .build()
        .unwrap();
    ctx.dev.cmd_ioctl(&mut b)
}

/// libmlx5's legacy dynamic UAR: mmap `ALLOC_WC` page `i`, then its device index.
fn legacy_uar(ctx: &Ctx, i: u64) -> u32 {
    let off = ((u64::from(MLX5_IB_MMAP_ALLOC_WC) << 8) | i) * 4096;
    ctx.dev
        .mmap(4096, libc::PROT_WRITE, off)
        .expect("ALLOC_WC mmap");
    let mut id = 0u32;
    let mut b = IoctlBuilder::new(MLX5_IB_OBJECT_DEVX, MLX5_IB_METHOD_DEVX_QUERY_UAR)
        .in_u32(MLX5_IB_ATTR_DEVX_QUERY_UAR_USER_IDX, (i * 2) as u32)
        .out_ptr(
            MLX5_IB_ATTR_DEVX_QUERY_UAR_DEV_IDX,
            &mut id as *mut u32 as u64,
            4,
        )
        .build()
        .unwrap();
    ctx.dev.cmd_ioctl(&mut b).expect("DEVX_QUERY_UAR");
    id
}

/// ALLOC_PD: the PD number (driver data).
fn pdn(ctx: &Ctx) -> u32 {
    let (_, drv) =
        write_cmd(&ctx.dev, IB_USER_VERBS_CMD_ALLOC_PD, &[0u8; 8], &[], 4, 4).expect("ALLOC_PD");
    u32::from_ne_bytes([drv[0], drv[1], drv[2], drv[3]])
}

fn q(f: Field) -> Field {
    f.at(qp::QPC)
}

fn p(f: Field) -> Field {
    f.at(qp::QPC + qpc::PRIMARY_PATH)
}

fn get_status(out: &[u8]) -> u8 {
    prm::get(out, hdr::STATUS) as u8
}

/// Everything a DEVX RC QP needs: PD, CQ, umems, UAR page.
struct Rig {
    ctx: Ctx,
    pdn: u32,
    cq: Cq,
    wq: Buf,
    wq_umem: (u32, u32),
    dbr: Buf,
    dbr_umem: (u32, u32),
    uar: u32,
}

fn rig(e: &Emulator) -> Rig {
    let mut ctx = devx_ctx(e);
    let pdn = pdn(&ctx);
    let cq = ctx.create_cq(64, 64, -1);
    let wq = Buf::new(1 << 16);
    let wq_umem = umem_reg(&ctx, wq.addr(), 1 << 16).unwrap();
    let dbr = Buf::new(4096);
    let dbr_umem = umem_reg(&ctx, dbr.addr(), 4096).unwrap();
    let uar = legacy_uar(&ctx, 0);
    Rig {
        ctx,
        pdn,
        cq,
        wq,
        wq_umem,
        dbr,
        dbr_umem,
        uar,
    }
}

/// A CREATE_QP of an RC QP with an SQ of 2^6 WQEBBs and no RQ (rq_type "zero").
fn create_qp_cmd(r: &Rig) -> Vec<u8> {
    let mut c = vec![0u8; qp::IN_BYTES];
    let mut set = |f: Field, v: u64| prm::set(&mut c, f, v);
    set(hdr::OPCODE, u64::from(op::CREATE_QP));
    set(q(qpc::ST), qpc::ST_RC);
    set(q(qpc::PD), u64::from(r.pdn));
    set(q(qpc::CQN_SND), u64::from(r.cq.cqn));
    set(q(qpc::CQN_RCV), u64::from(r.cq.cqn));
    set(q(qpc::RQ_TYPE), qpc::RQ_ZERO);
    set(q(qpc::LOG_SQ_SIZE), 6);
    set(q(qpc::UAR_PAGE), u64::from(r.uar));
    set(q(qpc::DBR_UMEM_ID), u64::from(r.dbr_umem.1));
    set(q(qpc::DBR_ADDR), 64);
    set(q(qpc::USER_INDEX), 7);
    set(qp::WQ_UMEM_ID, u64::from(r.wq_umem.1));
    c
}

fn transition(opcode: u16, qpn: u32) -> Vec<u8> {
    let mut c = vec![0u8; qp::IN_BYTES];
    prm::set(&mut c, hdr::OPCODE, u64::from(opcode));
    prm::set(&mut c, hdr::QPN, u64::from(qpn));
    c
}

#[test]
fn query_hca_cap_answers_what_the_emulated_device_does() {
    let e = stepped(1);
    let ctx = devx_ctx(&e);
    let cap = |ty: u16| {
        let mut c = [0u8; 16];
        prm::set(&mut c, hdr::OPCODE, u64::from(op::QUERY_HCA_CAP));
        prm::set(&mut c, hdr::OP_MOD, u64::from(ty << 1 | 1));
        general(&ctx, &c, hca_cap::OUT_BYTES)
    };
    let page = |f: Field| f.at(hca_cap::PAGE);
    let (r, g) = cap(cap_type::GENERAL);
    assert_eq!(r, Ok(()));
    assert_eq!(get_status(&g), status::OK);
    // UCX gives up on a device whose log_max_msg is not 30.
    assert_eq!(prm::get(&g, page(hca_cap::LOG_MAX_MSG)), 30);
    assert_eq!(prm::get(&g, page(hca_cap::CQE_VERSION)), 1);
    assert_eq!(prm::get(&g, page(hca_cap::ATOMIC)), 1);
    assert_eq!(prm::get(&g, page(hca_cap::RC)), 1);
    assert_eq!(prm::get(&g, page(hca_cap::UD)), 1);
    assert_eq!(prm::get(&g, page(hca_cap::DCT)), 1);
    assert_eq!(
        prm::get(&g, page(hca_cap::PORT_TYPE)),
        hca_cap::PORT_TYPE_IB
    );
    assert_eq!(prm::get(&g, page(hca_cap::NUM_PORTS)), 1);
    assert_eq!(prm::get(&g, page(hca_cap::LOG_MAX_RA_REQ_QP)), 4);
    assert!(prm::get(&g, page(hca_cap::LOG_MAX_RMP)) > 0);
    // No UMR, no LAG.
    assert_eq!(prm::get(&g, page(hca_cap::UMR_MODIFY_ATOMIC_DISABLED)), 1);
    assert_eq!(prm::get(&g, page(hca_cap::NUM_LAG_PORTS)), 0);
    let (r, a) = cap(cap_type::ATOMIC);
    assert_eq!(r, Ok(()));
    // CS, FA, masked CS, masked FA on 4 and 8 bytes: what device/responder.rs executes.
    assert_eq!(prm::get(&a, page(hca_cap::ATOMIC_OPERATIONS)), 0xf);
    assert_eq!(prm::get(&a, page(hca_cap::ATOMIC_SIZE_QP)), 0xc);
    assert_eq!(prm::get(&a, page(hca_cap::ATOMIC_SIZE_DC)), 0xc);
    assert_eq!(
        prm::get(&a, page(hca_cap::ATOMIC_REQ_8B_ENDIANNESS_MODE)),
        1
    );
    // ODP: every bit clear.
    let (r, o) = cap(cap_type::ODP);
    assert_eq!(r, Ok(()));
    assert!(o[16..].iter().all(|&b| b == 0));
    // A capability type this firmware has no page for: bad parameter.
    let (r, x) = cap(0x11);
    assert_eq!(r, Err(EREMOTEIO));
    assert_eq!(get_status(&x), status::BAD_PARAM);
    // A mailbox shorter than its header: EINVAL before the firmware.
    assert_eq!(general(&ctx, &[1, 0, 0], 64).0, Err(EINVAL));
}

#[test]
fn a_devx_qp_goes_through_its_life_and_forged_commands_are_refused() {
    let e = stepped(1);
    let r = rig(&e);
    let ctx = &r.ctx;
    // Forged creates: each refused by the firmware with its status, nothing created.
    let forged: [(&str, Field, u64, u8); 5] = [
        ("an unknown PD", q(qpc::PD), 0xabcd, status::BAD_RES),
        ("an unknown CQ", q(qpc::CQN_SND), 0xabcd, status::BAD_RES),
        ("an unknown WQ umem", qp::WQ_UMEM_ID, 999, status::BAD_PARAM),
        (
            "an SQ larger than its umem",
            q(qpc::LOG_SQ_SIZE),
            15,
            status::BAD_PARAM,
        ),
        (
            "a UAR page it never mapped",
            q(qpc::UAR_PAGE),
            3,
            status::BAD_PARAM,
        ),
    ];
    for (what, f, v, st) in forged {
        let mut c = create_qp_cmd(&r);
        prm::set(&mut c, f, v);
        let (res, out, _) = obj_create(ctx, &c);
        assert_eq!(res, Err(EREMOTEIO), "{what}");
        assert_eq!(get_status(&out), st, "{what}");
    }
    let mut c = create_qp_cmd(&r);
    prm::set(&mut c, q(qpc::ST), 0x9);
    assert_eq!(obj_create(ctx, &c).0, Err(EREMOTEIO), "a raw datagram QP");
    // A create the kernel does not know as one: EINVAL.
    let mut c = create_qp_cmd(&r);
    prm::set(&mut c, hdr::OPCODE, u64::from(op::QUERY_QP));
    assert_eq!(obj_create(ctx, &c).0, Err(EINVAL));

    let (res, out, h) = obj_create(ctx, &create_qp_cmd(&r));
    assert_eq!(res, Ok(()));
    let qpn = prm::get(&out, qp::OUT_QPN) as u32;
    assert_ne!(qpn, 0);
    // The umems are in use now.
    assert_eq!(umem_dereg(ctx, r.wq_umem.0), Err(Errno(libc::EBUSY)));
    // RTR2RTS from RESET: bad QP state.
    let (res, out) = obj_modify(ctx, h, &transition(op::RTR2RTS_QP, qpn), false);
    assert_eq!(res, Err(EREMOTEIO));
    assert_eq!(get_status(&out), status::BAD_QP_STATE);
    // A command naming another QP than the handle's: EINVAL.
    assert_eq!(
        obj_modify(ctx, h, &transition(op::RST2INIT_QP, qpn + 1), false).0,
        Err(EINVAL)
    );
    // Port 2 does not exist.
    let mut c = transition(op::RST2INIT_QP, qpn);
    prm::set(&mut c, p(ads::VHCA_PORT_NUM), 2);
    assert_eq!(obj_modify(ctx, h, &c, false).0, Err(EREMOTEIO));
    let mut c = transition(op::RST2INIT_QP, qpn);
    prm::set(&mut c, p(ads::VHCA_PORT_NUM), 1);
    prm::set(&mut c, q(qpc::RWE), 1);
    prm::set(&mut c, q(qpc::RAE), 1);
    assert_eq!(obj_modify(ctx, h, &c, false).0, Ok(()));
    let mut c = transition(op::INIT2RTR_QP, qpn);
    prm::set(&mut c, q(qpc::MTU), 3);
    prm::set(&mut c, q(qpc::REMOTE_QPN), 0x1234);
    prm::set(&mut c, q(qpc::NEXT_RCV_PSN), 77);
    prm::set(&mut c, q(qpc::LOG_RRA_MAX), 2);
    prm::set(&mut c, p(ads::RLID), 5);
    prm::set(&mut c, p(ads::VHCA_PORT_NUM), 1);
    assert_eq!(obj_modify(ctx, h, &c, false).0, Ok(()));
    let mut c = transition(op::RTR2RTS_QP, qpn);
    prm::set(&mut c, q(qpc::NEXT_SEND_PSN), 99);
    prm::set(&mut c, q(qpc::RETRY_COUNT), 7);
    prm::set(&mut c, q(qpc::LOG_SRA_MAX), 3);
    prm::set(&mut c, p(ads::ACK_TIMEOUT), 14);
    assert_eq!(obj_modify(ctx, h, &c, false).0, Ok(()));
    // QUERY_QP reports what was set.
    let (res, out) = obj_modify(ctx, h, &transition(op::QUERY_QP, qpn)[..16], true);
    assert_eq!(res, Ok(()));
    for (f, v) in [
        (q(qpc::STATE), qpc::STATE_RTS),
        (q(qpc::MTU), 3),
        (q(qpc::REMOTE_QPN), 0x1234),
        (q(qpc::NEXT_RCV_PSN), 77),
        (q(qpc::NEXT_SEND_PSN), 99),
        (q(qpc::LOG_RRA_MAX), 2),
        (q(qpc::LOG_SRA_MAX), 3),
        (q(qpc::RETRY_COUNT), 7),
        (q(qpc::RWE), 1),
        (q(qpc::RAE), 1),
        (q(qpc::RRE), 0),
        (q(qpc::LOG_SQ_SIZE), 6),
        (q(qpc::USER_INDEX), 7),
        (q(qpc::UAR_PAGE), u64::from(r.uar)),
        (q(qpc::CQN_SND), u64::from(r.cq.cqn)),
        (p(ads::RLID), 5),
        (p(ads::ACK_TIMEOUT), 14),
    ] {
        assert_eq!(prm::get(&out, f), v, "{f:?}");
    }
    // 2ERR and 2RST from anywhere.
    let short = |o: u16| transition(o, qpn)[..16].to_vec();
    assert_eq!(obj_modify(ctx, h, &short(op::TO_ERR_QP), false).0, Ok(()));
    assert_eq!(obj_modify(ctx, h, &short(op::TO_RST_QP), false).0, Ok(()));
    let (_, out) = obj_modify(ctx, h, &short(op::QUERY_QP), true);
    assert_eq!(prm::get(&out, q(qpc::STATE)), qpc::STATE_RST);
    // A verbs command on the DEVX handle is not a QP of the verbs table: EINVAL.
    let d = IbUverbsDestroyQp {
        qp_handle: h,
        ..Default::default()
    };
    assert_eq!(
        write_cmd(
            &ctx.dev,
            IB_USER_VERBS_CMD_DESTROY_QP,
            d.as_bytes(),
            &[],
            4,
            0
        )
        .map(|_| ()),
        Err(EINVAL)
    );
    assert_eq!(obj_destroy(ctx, h), Ok(()));
    assert_eq!(obj_destroy(ctx, h), Err(EINVAL));
    assert_eq!(umem_dereg(ctx, r.wq_umem.0), Ok(()));
    assert_eq!(umem_dereg(ctx, r.wq_umem.0), Err(EINVAL));
    assert_eq!(umem_dereg(ctx, r.dbr_umem.0), Ok(()));
    let _ = (&r.wq, &r.dbr);
}

#[test]
fn umems_and_uars_are_checked_as_the_kernel_checks_them() {
    let e = stepped(1);
    let ctx = devx_ctx(&e);
    let b = Buf::new(8192);
    assert_eq!(umem_reg(&ctx, b.addr(), 0), Err(EINVAL));
    assert_eq!(umem_reg(&ctx, u64::MAX - 10, 4096), Err(EINVAL));
    assert_eq!(umem_reg(&ctx, 0x1000, 4096), Err(Errno(libc::EFAULT)));
    assert!(umem_reg(&ctx, b.addr(), 8192).is_ok());
    // The device index of a legacy dynamic UAR; a page never mapped has none.
    let id = legacy_uar(&ctx, 0);
    assert_ne!(id, 0);
    let mut out = 0u32;
    let mut q = IoctlBuilder::new(MLX5_IB_OBJECT_DEVX, MLX5_IB_METHOD_DEVX_QUERY_UAR)
        .in_u32(MLX5_IB_ATTR_DEVX_QUERY_UAR_USER_IDX, 6)
        .out_ptr(
            MLX5_IB_ATTR_DEVX_QUERY_UAR_DEV_IDX,
            &mut out as *mut u32 as u64,
            4,
        )
        .build()
        .unwrap();
    assert_eq!(ctx.dev.cmd_ioctl(&mut q), Err(EINVAL));
    // The same page twice: EINVAL.
    let off = (u64::from(MLX5_IB_MMAP_ALLOC_WC) << 8) * 4096;
    assert_eq!(
        ctx.dev.mmap(4096, libc::PROT_WRITE, off).map(|_| ()),
        Err(EINVAL)
    );
    // Without a DEVX context none of it exists.
    let plain = Ctx::open(&e, 0);
    assert_eq!(umem_reg(&plain, b.addr(), 4096), Err(EINVAL));
}

#[test]
fn srq_last_wqe_reaches_the_subscribed_event_channel() {
    let e = stepped(1);
    let r = rig(&e);
    let ctx = &r.ctx;
    // An RMP (an SRQ on umems) for the QP to receive through.
    let rq = Buf::new(64 * 32);
    let rq_umem = umem_reg(ctx, rq.addr(), 64 * 32).unwrap();
    let mut c = vec![0u8; rmp::IN_BYTES];
    let w = |f: Field| f.at(rmp::WQ);
    prm::set(&mut c, hdr::OPCODE, u64::from(op::CREATE_RMP));
    prm::set(&mut c, rmp::STATE, rmp::STATE_RDY);
    prm::set(&mut c, w(rmp::WQ_TYPE), rmp::WQ_CYCLIC);
    prm::set(&mut c, w(rmp::PD), u64::from(r.pdn));
    prm::set(&mut c, w(rmp::LOG_WQ_SZ), 6);
    prm::set(&mut c, w(rmp::LOG_WQ_STRIDE), 5);
    prm::set(&mut c, w(rmp::WQ_UMEM_ID), u64::from(rq_umem.1));
    prm::set(&mut c, w(rmp::DBR_UMEM_ID), u64::from(r.dbr_umem.1));
    prm::set(&mut c, w(rmp::DBR_ADDR), 128);
    let (res, out, rmp_h) = obj_create(ctx, &c);
    assert_eq!(res, Ok(()));
    let srqn = prm::get(&out, rmp::OUT_RMPN);
    let mut c = create_qp_cmd(&r);
    prm::set(&mut c, q(qpc::RQ_TYPE), qpc::RQ_SRQ);
    prm::set(&mut c, q(qpc::SRQN_RMPN_XRQN), srqn);
    let (res, out, h) = obj_create(ctx, &c);
    assert_eq!(res, Ok(()));
    let qpn = prm::get(&out, qp::OUT_QPN) as u32;
    // The channel, as UCX creates it (cookie only).
    let mut b = IoctlBuilder::new(
        MLX5_IB_OBJECT_DEVX_ASYNC_EVENT_FD,
        MLX5_IB_METHOD_DEVX_ASYNC_EVENT_FD_ALLOC,
    )
    .out_fd(MLX5_IB_ATTR_DEVX_ASYNC_EVENT_FD_ALLOC_HANDLE)
    .in_u32(
        MLX5_IB_ATTR_DEVX_ASYNC_EVENT_FD_ALLOC_FLAGS,
        MLX5_IB_UAPI_DEVX_CR_EV_CH_FLAGS_OMIT_DATA,
    )
    .build()
    .unwrap();
    ctx.dev.cmd_ioctl(&mut b).unwrap();
    let fd = parse_ioctl(&b)
        .unwrap()
        .find(MLX5_IB_ATTR_DEVX_ASYNC_EVENT_FD_ALLOC_HANDLE)
        .unwrap()
        .1
        .data as i32;
    let subscribe = |fd: i32, events: &[u16]| {
        let list: Vec<u8> = events.iter().flat_map(|e| e.to_ne_bytes()).collect();
        // Up to 8 bytes travel inline, as libibverbs' fill_attr_in puts them.
        let mut b = IoctlBuilder::new(MLX5_IB_OBJECT_DEVX, MLX5_IB_METHOD_DEVX_SUBSCRIBE_EVENT);
        b.in_fd(MLX5_IB_ATTR_DEVX_SUBSCRIBE_EVENT_FD_HANDLE, fd)
            .in_obj(MLX5_IB_ATTR_DEVX_SUBSCRIBE_EVENT_OBJ_HANDLE, h)
            .in_inline(MLX5_IB_ATTR_DEVX_SUBSCRIBE_EVENT_TYPE_NUM_LIST, &list)
            .unwrap()
            .in_u64(MLX5_IB_ATTR_DEVX_SUBSCRIBE_EVENT_COOKIE, 0xc0ffee);
        let mut b = b.build().unwrap();
        ctx.dev.cmd_ioctl(&mut b)
    };
    assert_eq!(subscribe(ctx.async_fd, &[0x13]), Err(Errno(libc::EBADF)));
    assert_eq!(subscribe(fd, &[0x99]), Err(EINVAL));
    assert_eq!(subscribe(fd, &[0x13]), Ok(()));
    // Nothing yet.
    let mut ev = [0u8; 8];
    // SAFETY: `fd` is the channel's descriptor; `ev` is 8 writable bytes.
    let n = unsafe { libc::recv(fd, ev.as_mut_ptr().cast(), 8, libc::MSG_DONTWAIT) };
    assert_eq!(n, -1);
    let mut c = vec![0u8; 16];
    prm::set(&mut c, hdr::OPCODE, u64::from(op::TO_ERR_QP));
    prm::set(&mut c, hdr::QPN, u64::from(qpn));
    assert_eq!(obj_modify(ctx, h, &c, false).0, Ok(()));
    // SAFETY: as above.
    let n = unsafe { libc::recv(fd, ev.as_mut_ptr().cast(), 8, libc::MSG_DONTWAIT) };
    assert_eq!(n, 8);
    assert_eq!(u64::from_ne_bytes(ev), 0xc0ffee);
    assert_eq!(obj_destroy(ctx, h), Ok(()));
    assert_eq!(obj_destroy(ctx, rmp_h), Ok(()));
    // SAFETY: our descriptor, closed once.
    unsafe { libc::close(fd) };
}

/// xorshift64*.
fn rand(s: &mut u64) -> u64 {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    s.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

#[test]
fn forged_devx_mailboxes_never_crash_and_get_a_kernel_or_firmware_errno() {
    let e = stepped(1);
    let r = rig(&e);
    let ctx = &r.ctx;
    let good = create_qp_cmd(&r);
    let (_, out, h) = obj_create(ctx, &good);
    let qpn = prm::get(&out, qp::OUT_QPN) as u32;
    let opcodes = [
        op::QUERY_HCA_CAP,
        op::QUERY_LAG,
        op::CREATE_QP,
        op::CREATE_DCT,
        op::CREATE_RMP,
        op::CREATE_MKEY,
        op::RST2INIT_QP,
        op::INIT2RTR_QP,
        op::RTR2RTS_QP,
        op::TO_ERR_QP,
        op::TO_RST_QP,
        op::QUERY_QP,
        op::QUERY_DCT,
        0xffff,
    ];
    let allowed = [
        EINVAL,
        EREMOTEIO,
        Errno(libc::EFAULT),
        Errno(libc::EOPNOTSUPP),
    ];
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    let mut created = Vec::new();
    for i in 0..3000 {
        let len = (rand(&mut s) % 320) as usize;
        let mut c: Vec<u8> = (0..len).map(|_| rand(&mut s) as u8).collect();
        // Half of them start from a valid command with a few bits flipped.
        if i % 2 == 0 {
            c = good.clone();
            for _ in 0..4 {
                let bit = (rand(&mut s) % (c.len() as u64 * 8)) as usize;
                c[bit / 8] ^= 1 << (bit % 8);
            }
        }
        if c.len() >= 2 {
            let o = opcodes[(rand(&mut s) % opcodes.len() as u64) as usize];
            c[..2].copy_from_slice(&o.to_be_bytes());
        }
        if c.len() >= 12 && rand(&mut s) % 2 == 0 {
            prm::set(&mut c, hdr::QPN, u64::from(qpn));
        }
        let res = match rand(&mut s) % 3 {
            0 => general(ctx, &c, 64 + (rand(&mut s) % 4200) as usize).0,
            1 => {
                let (res, _, nh) = obj_create(ctx, &c);
                if res.is_ok() {
                    created.push(nh);
                }
                res
            }
            _ => obj_modify(ctx, h, &c, rand(&mut s) % 2 == 0).0,
        };
        if let Err(err) = res {
            assert!(allowed.contains(&err), "command {i}: {err:?}");
        }
    }
    for nh in created {
        assert_eq!(obj_destroy(ctx, nh), Ok(()));
    }
    assert_eq!(obj_destroy(ctx, h), Ok(()));
    // The QP table is back to where it was: the good create still works.
    assert_eq!(obj_create(ctx, &good).0, Ok(()));
}

/// mlx5_ib (`devx.c`, on `mlx5_cmd_do`): a command the firmware fails returns `-EREMOTEIO`
/// and the output mailbox reaches the caller anyway (`uverbs_copy_to`, which sets
/// `UVERBS_ATTR_F_VALID_OUTPUT` in the caller's attribute at once); DEVX_OBJ_CREATE copies it
/// only then, and its new-object handle is no output. A command refused before the firmware
/// (EINVAL) leaves the mailbox untouched and unmarked.
#[test]
fn a_firmware_failure_is_eremoteio_with_the_mailbox_copied_and_marked() {
    let e = stepped(1);
    let r = rig(&e);
    let ctx = &r.ctx;
    let valid = |buf: &[u8], id: u16| {
        parse_ioctl(buf)
            .unwrap()
            .find(id)
            .is_some_and(|(_, a)| a.flags & UVERBS_ATTR_F_VALID_OUTPUT != 0)
    };
    // DEVX_OTHER: QUERY_HCA_CAP of a capability type the firmware has no page for.
    let mut c = [0u8; 16];
    prm::set(&mut c, hdr::OPCODE, u64::from(op::QUERY_HCA_CAP));
    prm::set(&mut c, hdr::OP_MOD, u64::from(0x11u16 << 1 | 1));
    let ids = (
        MLX5_IB_ATTR_DEVX_OTHER_CMD_IN,
        MLX5_IB_ATTR_DEVX_OTHER_CMD_OUT,
    );
    let (res, out, buf) = prm_call(
        &ctx.dev,
        MLX5_IB_OBJECT_DEVX,
        MLX5_IB_METHOD_DEVX_OTHER,
        None,
        ids,
        &c,
        64,
    );
    assert_eq!(res, Err(EREMOTEIO));
    assert_eq!(get_status(&out), status::BAD_PARAM);
    assert!(valid(&buf, MLX5_IB_ATTR_DEVX_OTHER_CMD_OUT));
    // A general command mlx5_ib does not pass to the firmware: EINVAL, nothing written.
    prm::set(&mut c, hdr::OPCODE, u64::from(op::CREATE_QP));
    let (res, out, buf) = prm_call(
        &ctx.dev,
        MLX5_IB_OBJECT_DEVX,
        MLX5_IB_METHOD_DEVX_OTHER,
        None,
        ids,
        &c,
        64,
    );
    assert_eq!(res, Err(EINVAL));
    assert!(out.iter().all(|&b| b == 0));
    assert!(!valid(&buf, MLX5_IB_ATTR_DEVX_OTHER_CMD_OUT));
    // DEVX_OBJ_CREATE of a QP the firmware refuses (a UAR page never mapped).
    let mut c = create_qp_cmd(&r);
    prm::set(&mut c, q(qpc::UAR_PAGE), 3);
    let mut out = vec![0u8; 64];
    let mut buf = IoctlBuilder::new(MLX5_IB_OBJECT_DEVX_OBJ, MLX5_IB_METHOD_DEVX_OBJ_CREATE)
        .out_obj(MLX5_IB_ATTR_DEVX_OBJ_CREATE_HANDLE)
        .in_ptr(
            MLX5_IB_ATTR_DEVX_OBJ_CREATE_CMD_IN,
            c.as_ptr() as u64,
            c.len() as u16,
        )
        .out_ptr(
            MLX5_IB_ATTR_DEVX_OBJ_CREATE_CMD_OUT,
            out.as_mut_ptr() as u64,
            out.len() as u16,
        )
        .build()
        .unwrap();
    assert_eq!(ctx.dev.cmd_ioctl(&mut buf), Err(EREMOTEIO));
    assert_eq!(get_status(&out), status::BAD_PARAM);
    assert!(valid(&buf, MLX5_IB_ATTR_DEVX_OBJ_CREATE_CMD_OUT));
    assert!(!valid(&buf, MLX5_IB_ATTR_DEVX_OBJ_CREATE_HANDLE));
}

/// A CREATE_MKEY of an indirect key over `entries` ((key, address, byte count) each):
/// KSM with entities of `2^log` bytes when `log` is given, else KLM.
fn create_mkey_cmd(
    pdn: u32,
    start: u64,
    len: u64,
    log: Option<u8>,
    entries: &[(u32, u64, u32)],
) -> Vec<u8> {
    let mut c = vec![0u8; mkey::ENTRIES_BYTE + entries.len() * mkey::ENTRY_BYTES];
    let m = |f: Field| f.at(mkey::MKC);
    let mut set = |f: Field, v: u64| prm::set(&mut c, f, v);
    set(hdr::OPCODE, u64::from(op::CREATE_MKEY));
    set(
        m(mkey::ACCESS_MODE_1_0),
        if log.is_some() {
            mkey::MODE_KSM
        } else {
            mkey::MODE_KLM
        },
    );
    for f in [mkey::A, mkey::RW, mkey::RR, mkey::LW, mkey::LR] {
        set(m(f), 1);
    }
    set(m(mkey::QPN), 0xff_ffff);
    set(m(mkey::MKEY_7_0), 0x5a);
    set(m(mkey::PD), u64::from(pdn));
    set(m(mkey::START_ADDR), start);
    set(m(mkey::LEN), len);
    set(m(mkey::TRANSLATIONS_OCTWORD_SIZE), entries.len() as u64);
    set(m(mkey::LOG_ENTITY_SIZE), u64::from(log.unwrap_or(0)));
    set(mkey::ACTUAL_SIZE, entries.len() as u64);
    for (i, &(key, addr, bytes)) in entries.iter().enumerate() {
        let e = |f: Field| f.at(((mkey::ENTRIES_BYTE + i * mkey::ENTRY_BYTES) * 8) as u32);
        set(e(mkey::E_BYTE_COUNT), u64::from(bytes));
        set(e(mkey::E_MKEY), u64::from(key));
        set(e(mkey::E_ADDRESS), addr);
    }
    c
}

/// An RC pair whose responder (HCA 1) has a DEVX context, and its PD number there.
fn devx_responder_pair() -> (Pair, u32) {
    let emu = stepped(2);
    let a = Ctx::open(&emu, 0);
    let b = devx_ctx_on(&emu, 1);
    let pda = a.alloc_pd();
    let (o, drv) =
        write_cmd(&b.dev, IB_USER_VERBS_CMD_ALLOC_PD, &[0u8; 8], &[], 4, 4).expect("ALLOC_PD");
    let pdb = u32::from_ne_bytes([o[0], o[1], o[2], o[3]]);
    let pdnb = u32::from_ne_bytes([drv[0], drv[1], drv[2], drv[3]]);
    let p = pair_of(emu, (a, pda), (b, pdb), RC, ALL_ACCESS, (64, 64, 16));
    let k = Knobs::default();
    bring_up(&p.a, &p.qa, p.emu.hca_info(1).unwrap().lid, p.qb.qpn, k);
    bring_up(&p.b, &p.qb, p.emu.hca_info(0).unwrap().lid, p.qa.qpn, k);
    (p, pdnb)
}

fn dseg(len: u32, lkey: u32, addr: u64) -> Vec<u8> {
    DataSeg::new(len, lkey, addr).as_bytes().to_vec()
}

/// UCX's atomic and strict-order keys (`uct_ib_mlx5_devx_reg_ksm_data_contig`): a KSM key
/// whose space starts at the region's address rounded down to 2 GiB plus a per-process offset,
/// one 2 GiB entry per step mapping back onto the region's own key. A WRITE, a READ and a
/// fetch-and-add sent to `address + offset` under that key land at `address`, never at
/// `address + offset` (which a device that took the key for a direct one would write: seen
/// with UCX on a CPU where it turns on relaxed ordering, every put 0x180 bytes past its
/// buffer); an access past the key's length, one after the key is destroyed and one through an
/// entry whose key is gone all fail as remote access errors.
#[test]
fn a_ksm_key_translates_writes_reads_and_atomics_onto_its_entries() {
    let (mut p, pdnb) = devx_responder_pair();
    let (bb, lb) = (p.mb.0.addr(), p.mb.1);
    let (ba, la) = (p.ma.0.addr(), p.ma.1);
    const OFF: u64 = 0x180;
    let base = bb & !((1u64 << 31) - 1);
    let len = bb + p.mb.0.len as u64 - base;
    let n = (len + OFF).div_ceil(1 << 31);
    let entries: Vec<_> = (0..n).map(|i| (lb, base + (i << 31), 0)).collect();
    let (r, out, h) = obj_create(
        &p.b,
        &create_mkey_cmd(pdnb, base + OFF, len, Some(31), &entries),
    );
    assert_eq!(r, Ok(()), "CREATE_MKEY: status {:#x}", get_status(&out));
    let key = ((prm::get(&out, mkey::INDEX) as u32) << 8) | 0x5a;
    // WRITE 16 bytes to bb + 100 through the key.
    p.ma.0.write(0, &[0x77; 16]);
    let segs = [
        RaddrSeg::new(bb + 100 + OFF, key).as_bytes(),
        &dseg(16, la, ba),
    ]
    .concat();
    p.send(SendOpcode::RDMA_WRITE, FM_CE_SE_CQ_UPDATE, [0; 4], &segs);
    let ca = drain(&mut p.cqa);
    assert_eq!(ca[0].syndrome, 0, "{ca:?}");
    assert_eq!(
        p.mb.0.read(100, 16),
        vec![0x77; 16],
        "the write landed at the region's address"
    );
    assert!(
        p.mb.0.read(100 + OFF as usize, 16).iter().all(|&b| b == 0),
        "not past it"
    );
    // READ it back through the key.
    p.mb.0.write(2000, &[0x42; 32]);
    let segs = [
        RaddrSeg::new(bb + 2000 + OFF, key).as_bytes(),
        &dseg(32, la, ba + 512),
    ]
    .concat();
    p.send(SendOpcode::RDMA_READ, FM_CE_SE_CQ_UPDATE, [0; 4], &segs);
    assert_eq!(drain(&mut p.cqa)[0].syndrome, 0);
    assert_eq!(p.ma.0.read(512, 32), vec![0x42; 32]);
    // Fetch-and-add through the key.
    p.mb.0.write(4000, &100u64.to_ne_bytes());
    let segs = [
        RaddrSeg::new(bb + 4000 + OFF, key).as_bytes(),
        AtomicSeg::new(45, 0).as_bytes(),
        &dseg(8, la, ba + 1024),
    ]
    .concat();
    p.send(SendOpcode::ATOMIC_FA, FM_CE_SE_CQ_UPDATE, [0; 4], &segs);
    assert_eq!(drain(&mut p.cqa)[0].syndrome, 0);
    assert_eq!(p.mb.0.read(4000, 8), 145u64.to_ne_bytes().to_vec());
    assert_eq!(p.ma.0.read(1024, 8), 100u64.to_ne_bytes().to_vec());
    // Past the key's length: a remote access error, nothing written.
    let segs = [
        RaddrSeg::new(base + OFF + len - 4, key).as_bytes(),
        &dseg(8, la, ba),
    ]
    .concat();
    p.send(SendOpcode::RDMA_WRITE, FM_CE_SE_CQ_UPDATE, [0; 4], &segs);
    let ca = drain(&mut p.cqa);
    assert_eq!(ca[0].syndrome, Syndrome::REMOTE_ACCESS.0, "{ca:?}");
    // A destroyed key translates nothing (a fresh pair: the first is in error now).
    let (mut p, pdnb) = devx_responder_pair();
    let (bb, lb) = (p.mb.0.addr(), p.mb.1);
    let (ba, la) = (p.ma.0.addr(), p.ma.1);
    let cmd = create_mkey_cmd(pdnb, bb, 4096, None, &[(lb, bb, 4096)]);
    let (r, out, h2) = obj_create(&p.b, &cmd);
    assert_eq!(r, Ok(()), "KLM CREATE_MKEY: status {:#x}", get_status(&out));
    let key2 = ((prm::get(&out, mkey::INDEX) as u32) << 8) | 0x5a;
    let segs = [RaddrSeg::new(bb + 8, key2).as_bytes(), &dseg(8, la, ba)].concat();
    p.send(SendOpcode::RDMA_WRITE, FM_CE_SE_CQ_UPDATE, [0; 4], &segs);
    assert_eq!(drain(&mut p.cqa)[0].syndrome, 0, "through a KLM key");
    assert_eq!(obj_destroy(&p.b, h2), Ok(()));
    assert_eq!(obj_destroy(&p.b, h2), Err(EINVAL), "destroyed once");
    p.mb.0.write(8, &[0; 8]);
    p.ma.0.write(0, &[9; 8]);
    p.send(SendOpcode::RDMA_WRITE, FM_CE_SE_CQ_UPDATE, [0; 4], &segs);
    assert_eq!(drain(&mut p.cqa)[0].syndrome, Syndrome::REMOTE_ACCESS.0);
    assert_eq!(
        p.mb.0.read(8, 8),
        vec![0; 8],
        "nothing written through a destroyed key"
    );
    let _ = h;
}

/// What this firmware does not make is refused with a status, and an indirect key whose
/// entry names another indirect key (or a key that never existed) translates nothing.
#[test]
fn forged_mkey_creates_are_refused_and_nested_or_dangling_entries_fail_at_access() {
    let (p, pdnb) = devx_responder_pair();
    let (bb, lb) = (p.mb.0.addr(), p.mb.1);
    let good = create_mkey_cmd(pdnb, bb, 4096, Some(12), &[(lb, bb, 0)]);
    let m = |f: Field| f.at(mkey::MKC);
    let forged: Vec<(&str, Vec<u8>, u8)> = vec![
        (
            "MTT mode",
            {
                let mut c = good.clone();
                prm::set(&mut c, m(mkey::ACCESS_MODE_1_0), 1);
                c
            },
            status::BAD_PARAM,
        ),
        (
            "bound to a QP",
            {
                let mut c = good.clone();
                prm::set(&mut c, m(mkey::QPN), 5);
                c
            },
            status::BAD_PARAM,
        ),
        (
            "UMR-enabled",
            {
                let mut c = good.clone();
                prm::set(&mut c, m(mkey::UMR_EN), 1);
                c
            },
            status::BAD_PARAM,
        ),
        (
            "on a umem",
            {
                let mut c = good.clone();
                prm::set(&mut c, mkey::UMEM_VALID, 1);
                c
            },
            status::BAD_PARAM,
        ),
        (
            "length 0",
            {
                let mut c = good.clone();
                prm::set(&mut c, m(mkey::LEN), 0);
                c
            },
            status::BAD_PARAM,
        ),
        (
            "no entries",
            {
                let mut c = good.clone();
                prm::set(&mut c, mkey::ACTUAL_SIZE, 0);
                c
            },
            status::BAD_PARAM,
        ),
        (
            "more entries than the mailbox",
            {
                let mut c = good.clone();
                prm::set(&mut c, mkey::ACTUAL_SIZE, 1);
                prm::set(&mut c, m(mkey::TRANSLATIONS_OCTWORD_SIZE), 9);
                prm::set(&mut c, mkey::ACTUAL_SIZE, 9);
                c
            },
            status::BAD_INP_LEN,
        ),
        (
            "unknown PD",
            {
                let mut c = good.clone();
                prm::set(&mut c, m(mkey::PD), u64::from(pdnb) + 77);
                c
            },
            status::BAD_RES,
        ),
        ("short", good[..0x40].to_vec(), status::BAD_INP_LEN),
    ];
    for (what, cmd, st) in forged {
        let (r, out, _) = obj_create(&p.b, &cmd);
        assert_eq!((r, get_status(&out)), (Err(EREMOTEIO), st), "{what}");
    }
    drop(p);
    for what in ["nested", "dangling"] {
        let (mut p, pdnb) = devx_responder_pair();
        let (bb, lb) = (p.mb.0.addr(), p.mb.1);
        let (ba, la) = (p.ma.0.addr(), p.ma.1);
        let entry_key = if what == "nested" {
            let (r, out, _) = obj_create(
                &p.b,
                &create_mkey_cmd(pdnb, bb, 4096, Some(12), &[(lb, bb, 0)]),
            );
            assert_eq!(r, Ok(()));
            ((prm::get(&out, mkey::INDEX) as u32) << 8) | 0x5a
        } else {
            0x00ab_cd00
        };
        let cmd = create_mkey_cmd(pdnb, bb, 4096, Some(12), &[(entry_key, bb, 0)]);
        let (r, out, _) = obj_create(&p.b, &cmd);
        assert_eq!(
            r,
            Ok(()),
            "{what}: created (the entry is checked at access)"
        );
        let key = ((prm::get(&out, mkey::INDEX) as u32) << 8) | 0x5a;
        p.ma.0.write(0, &[3; 8]);
        let segs = [RaddrSeg::new(bb, key).as_bytes(), &dseg(8, la, ba)].concat();
        p.send(SendOpcode::RDMA_WRITE, FM_CE_SE_CQ_UPDATE, [0; 4], &segs);
        let ca = drain(&mut p.cqa);
        assert_eq!(ca[0].syndrome, Syndrome::REMOTE_ACCESS.0, "{what}: {ca:?}");
        assert_eq!(p.mb.0.read(0, 8), vec![0; 8], "{what}: nothing written");
    }
}

/// Where byte `o` of an indirect key's space lands in the responder's region (an offset
/// into it), by an independent model of the entries: KSM entries of `2^log` bytes each,
/// KLM entries of their own byte counts, in order. `None` past the last entry.
fn model_offset(entries: &[(u64, u64)], log: Option<u8>, o: u64) -> Option<u64> {
    if let Some(log) = log {
        let (at, _) = entries.get((o >> log) as usize)?;
        return Some(at + (o & ((1 << log) - 1)));
    }
    let mut left = o;
    for &(at, bytes) in entries {
        if left < bytes {
            return Some(at + left);
        }
        left -= bytes;
    }
    None
}

#[test]
fn random_klm_and_ksm_keys_put_every_byte_where_an_independent_model_of_the_entries_says() {
    let mut s = 0x6b6c_6d5f_6b73_6d31u64;
    for case in 0..24 {
        let (mut p, pdnb) = devx_responder_pair();
        let (bb, lb) = (p.mb.0.addr(), p.mb.1);
        let (ba, la) = (p.ma.0.addr(), p.ma.1);
        let region = p.mb.0.len as u64;
        // Entries (offset into the region, bytes); KSM on odd cases, of 64..512-byte
        // entities. Entries may overlap and come in any order.
        let log = (case % 2 == 1).then(|| 6 + (rand(&mut s) % 4) as u8);
        let n = 1 + rand(&mut s) % 6;
        let entries: Vec<(u64, u64)> = (0..n)
            .map(|_| {
                let bytes = match log {
                    Some(l) => 1 << l,
                    None => 1 + rand(&mut s) % 700,
                };
                (rand(&mut s) % (region - bytes), bytes)
            })
            .collect();
        let len: u64 = entries.iter().map(|e| e.1).sum();
        let start = 0x7100_0000_0000 + (rand(&mut s) % (1 << 20)) * 8;
        let wire: Vec<_> = entries
            .iter()
            .map(|&(at, bytes)| (lb, bb + at, if log.is_some() { 0 } else { bytes as u32 }))
            .collect();
        let (r, out, _h) = obj_create(&p.b, &create_mkey_cmd(pdnb, start, len, log, &wire));
        assert_eq!(r, Ok(()), "case {case}: status {:#x}", get_status(&out));
        let key = ((prm::get(&out, mkey::INDEX) as u32) << 8) | 0x5a;
        let mut model = p.mb.0.read(0, region as usize);
        // Writes of random ranges of the key's space, each checked byte by byte.
        for w in 0..4 {
            let o = rand(&mut s) % len;
            let l = 1 + rand(&mut s) % (len - o).min(2048);
            let data: Vec<u8> = (0..l).map(|_| rand(&mut s) as u8 | 1).collect();
            p.ma.0.write(0, &data);
            let segs = [
                RaddrSeg::new(start + o, key).as_bytes(),
                &dseg(l as u32, la, ba),
            ]
            .concat();
            p.send(SendOpcode::RDMA_WRITE, FM_CE_SE_CQ_UPDATE, [0; 4], &segs);
            let c = drain(&mut p.cqa);
            assert_eq!(
                c[0].syndrome, 0,
                "case {case} write {w}: {c:?} (entries {entries:?}, log {log:?}, offset {o}, {l} bytes, key length {len})"
            );
            for (i, &b) in data.iter().enumerate() {
                let at = model_offset(&entries, log, o + i as u64).expect("inside the key");
                model[at as usize] = b;
            }
            assert!(
                p.mb.0.read(0, region as usize) == model,
                "case {case} write {w}: the region differs from the model \
                 (entries {entries:?}, log {log:?}, offset {o}, {l} bytes)"
            );
        }
        // A READ of a random range gathers what the model says is there.
        let o = rand(&mut s) % len;
        let l = 1 + rand(&mut s) % (len - o).min(2048);
        let segs = [
            RaddrSeg::new(start + o, key).as_bytes(),
            &dseg(l as u32, la, ba + 4096),
        ]
        .concat();
        p.send(SendOpcode::RDMA_READ, FM_CE_SE_CQ_UPDATE, [0; 4], &segs);
        assert_eq!(drain(&mut p.cqa)[0].syndrome, 0, "case {case} read");
        let want: Vec<u8> = (0..l)
            .map(|i| model[model_offset(&entries, log, o + i).unwrap() as usize])
            .collect();
        assert_eq!(p.ma.0.read(4096, l as usize), want, "case {case} read");
        // A write that runs past the key's end: a remote access error, not one byte
        // written anywhere in the region.
        let o = len - 1 - rand(&mut s) % len.min(64);
        let l = len - o + 1 + rand(&mut s) % 64;
        p.ma.0.write(0, &vec![0xee; l as usize]);
        let segs = [
            RaddrSeg::new(start + o, key).as_bytes(),
            &dseg(l as u32, la, ba),
        ]
        .concat();
        p.send(SendOpcode::RDMA_WRITE, FM_CE_SE_CQ_UPDATE, [0; 4], &segs);
        let c = drain(&mut p.cqa);
        assert_eq!(
            c[0].syndrome,
            Syndrome::REMOTE_ACCESS.0,
            "case {case}: {c:?}"
        );
        assert!(
            p.mb.0.read(0, region as usize) == model,
            "case {case}: a refused write changed the region"
        );
    }
}
