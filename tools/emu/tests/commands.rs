//! The emulated kernel's command validation: sizes, handles, pointers, masks, flavours.

mod common;

use common::*;
use mlx5_emu::{EmuConfig, Emulator, Errno, Flavour, RunMode};
use mlx5_ffi::ioctl::*;
use mlx5_ffi::mlx5::*;
use mlx5_ffi::uverbs::*;
use zerocopy::{FromBytes, IntoBytes};

const EINVAL: Errno = Errno(libc::EINVAL);
const ENOSPC: Errno = Errno(libc::ENOSPC);
const EFAULT: Errno = Errno(libc::EFAULT);
const EBUSY: Errno = Errno(libc::EBUSY);

fn emu_with(flavour: Flavour) -> Emulator {
    Emulator::new(EmuConfig {
        mode: RunMode::Stepped,
        flavour,
        ..EmuConfig::default()
    })
}

fn hdr(command: u32, in_words: u16, out_words: u16) -> Vec<u8> {
    IbUverbsCmdHdr {
        command,
        in_words,
        out_words,
    }
    .as_bytes()
    .to_vec()
}

#[test]
fn header_and_size_validation() {
    let emu = stepped(1);
    let dev = emu.open(0).unwrap();
    assert_eq!(
        dev.cmd_write(&[0u8; 4]),
        Err(EINVAL),
        "shorter than the header"
    );
    assert_eq!(
        dev.cmd_write(&hdr(0x4000_0001, 2, 0)),
        Err(EINVAL),
        "bits beyond the command mask"
    );
    assert_eq!(
        dev.cmd_write(&hdr(99, 2, 0)),
        Err(Errno(libc::EOPNOTSUPP)),
        "unknown command"
    );
    let mut b = hdr(IB_USER_VERBS_CMD_ALLOC_PD, 5, 1);
    b.extend_from_slice(&[0u8; 8]);
    assert_eq!(
        dev.cmd_write(&b),
        Err(EINVAL),
        "in_words disagrees with the length"
    );
    // No context yet.
    assert_eq!(
        run_cmd(&dev, IB_USER_VERBS_CMD_ALLOC_PD, &[0u8; 8], &[], (4, 0)),
        Err(EINVAL)
    );
    let ctx = Ctx::open(&emu, 0);
    // GET_CONTEXT twice on one file.
    let req = Mlx5IbAllocUcontextReqV2 {
        total_num_bfregs: 4,
        max_cqe_version: 1,
        ..Default::default()
    };
    assert_eq!(
        run_cmd(
            &ctx.dev,
            IB_USER_VERBS_CMD_GET_CONTEXT,
            &[0u8; 8],
            req.as_bytes(),
            (8, 72)
        ),
        Err(EINVAL)
    );
    // Core request shorter than the struct, response shorter than the struct.
    let mut b = hdr(IB_USER_VERBS_CMD_REG_MR, 2 + 4, 3);
    b.extend_from_slice(&[0u8; 16]);
    assert_eq!(ctx.dev.cmd_write(&b), Err(ENOSPC));
    let mut out = [0u8; 16];
    let mut b = hdr(IB_USER_VERBS_CMD_ALLOC_PD, 4, 0);
    b.extend_from_slice(&(out.as_mut_ptr() as u64).to_ne_bytes());
    assert_eq!(ctx.dev.cmd_write(&b), Err(ENOSPC), "out_words too small");
}

#[test]
fn bad_pointers_are_efault_and_bad_handles_einval() {
    let emu = stepped(1);
    let mut ctx = Ctx::open(&emu, 0);
    // Response pointer into nowhere.
    let mut b = hdr(IB_USER_VERBS_CMD_ALLOC_PD, 4, 2);
    b.extend_from_slice(&0x10u64.to_ne_bytes());
    assert_eq!(ctx.dev.cmd_write(&b), Err(EFAULT));
    let pd = ctx.alloc_pd();
    // An MR over unmapped memory.
    // Below mmap_min_addr: never mapped.
    let addr = 0x1000u64;
    assert_eq!(
        ctx.reg_mr(pd, addr, 4096, LOCAL_WRITE).map(|_| ()),
        Err(EFAULT)
    );
    // REMOTE_WRITE without LOCAL_WRITE.
    let buf = Buf::new(4096);
    assert_eq!(
        ctx.reg_mr(pd, buf.addr(), 4096, REMOTE_WRITE).map(|_| ()),
        Err(EINVAL)
    );
    // Unknown handles and handles of the wrong type.
    assert_eq!(
        write_noresp(
            &ctx.dev,
            IB_USER_VERBS_CMD_DEALLOC_PD,
            &999u32.to_ne_bytes(),
            &[]
        ),
        Err(EINVAL)
    );
    let cq = ctx.create_cq(8, 64, -1);
    assert_eq!(
        write_noresp(
            &ctx.dev,
            IB_USER_VERBS_CMD_DEALLOC_PD,
            &cq.handle.to_ne_bytes(),
            &[]
        ),
        Err(EINVAL)
    );
    // CQ with an unmapped buffer, a bad CQE size, non-zero reserved fields.
    let c = IbUverbsCreateCq {
        cqe: 7,
        comp_channel: -1,
        ..Default::default()
    };
    let db = ctx.db();
    let d = Mlx5IbCreateCq {
        buf_addr: addr,
        db_addr: db,
        cqe_size: 64,
        ..Default::default()
    };
    let r = write_cmd(
        &ctx.dev,
        IB_USER_VERBS_CMD_CREATE_CQ,
        c.as_bytes(),
        d.as_bytes(),
        8,
        8,
    );
    assert_eq!(r.map(|_| ()), Err(EFAULT));
    let cqbuf = Buf::new(8192);
    for (size, rsv, want) in [(96, 0, EINVAL), (64, 1, EINVAL)] {
        let d = Mlx5IbCreateCq {
            buf_addr: cqbuf.addr(),
            db_addr: db,
            cqe_size: size,
            reserved1: rsv,
            ..Default::default()
        };
        let r = write_cmd(
            &ctx.dev,
            IB_USER_VERBS_CMD_CREATE_CQ,
            c.as_bytes(),
            d.as_bytes(),
            8,
            8,
        );
        assert_eq!(r.map(|_| ()), Err(want), "cqe_size {size} reserved {rsv}");
    }
    // QP: non power-of-two SQ, and the reserved user index with CQE v1.
    let qbuf = Buf::new(8192);
    let core = IbUverbsCreateQp {
        pd_handle: pd,
        send_cq_handle: cq.handle,
        recv_cq_handle: cq.handle,
        max_send_wr: 1,
        max_recv_wr: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
        qp_type: RC,
        ..Default::default()
    };
    for (sq, uidx) in [(3, 1), (4, 0xFF_FFFF)] {
        let d = Mlx5IbCreateQp {
            buf_addr: qbuf.addr(),
            db_addr: db + 64,
            sq_wqe_count: sq,
            rq_wqe_count: 4,
            rq_wqe_shift: 4,
            uidx,
            ..Default::default()
        };
        let r = write_cmd(
            &ctx.dev,
            IB_USER_VERBS_CMD_CREATE_QP,
            core.as_bytes(),
            d.as_bytes(),
            32,
            40,
        );
        assert_eq!(r.map(|_| ()), Err(EINVAL), "sq {sq} uidx {uidx:#x}");
    }
    // Objects in use cannot be destroyed.
    let _qp = ctx.create_qp(pd, &cq, &cq, RC, 16, 8, None);
    assert_eq!(
        write_noresp(
            &ctx.dev,
            IB_USER_VERBS_CMD_DEALLOC_PD,
            &pd.to_ne_bytes(),
            &[]
        ),
        Err(EBUSY)
    );
    let d = IbUverbsDestroyCq {
        response: 0,
        cq_handle: cq.handle,
        reserved: 0,
    };
    assert_eq!(
        run_cmd(
            &ctx.dev,
            IB_USER_VERBS_CMD_DESTROY_CQ,
            d.as_bytes(),
            &[],
            (8, 0)
        ),
        Err(EBUSY)
    );
}

#[test]
fn modify_qp_masks_follow_the_kernel_table() {
    let emu = stepped(1);
    let mut ctx = Ctx::open(&emu, 0);
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(8, 64, -1);
    let qp = ctx.create_qp(pd, &cq, &cq, RC, 16, 8, None);
    let ud = ctx.create_qp(pd, &cq, &cq, UD, 16, 8, None);
    let base = |q: &Qp, state: u8, mask: u32| {
        let mut m = modify_base(q);
        m.qp_state = state;
        m.attr_mask = mask;
        m.port_num = 1;
        m
    };
    // RESET -> INIT without PORT; with a QKEY (not allowed for RC); RESET -> RTR.
    assert_eq!(
        ctx.modify(&base(&qp, 1, M_STATE | M_PKEY | M_ACCESS)),
        Err(EINVAL)
    );
    assert_eq!(
        ctx.modify(&base(&qp, 1, M_STATE | M_PKEY | M_PORT | M_ACCESS | M_QKEY)),
        Err(EINVAL)
    );
    assert_eq!(ctx.modify(&base(&qp, 2, M_STATE)), Err(EINVAL));
    // Port 2 does not exist.
    let mut m = base(&qp, 1, M_STATE | M_PKEY | M_PORT | M_ACCESS);
    m.port_num = 2;
    assert_eq!(ctx.modify(&m), Err(EINVAL));
    assert_eq!(
        ctx.modify(&base(&qp, 1, M_STATE | M_PKEY | M_PORT | M_ACCESS)),
        Ok(())
    );
    // INIT -> RTR for RC needs MAX_DEST_RD_ATOMIC and MIN_RNR_TIMER.
    let mut m = base(&qp, 2, M_STATE | M_AV | M_MTU | M_DEST_QPN | M_RQ_PSN);
    m.path_mtu = 3;
    m.dest.port_num = 1;
    assert_eq!(ctx.modify(&m), Err(EINVAL));
    m.attr_mask |= M_MAX_DEST_RD | M_MIN_RNR;
    m.path_mtu = 9;
    assert_eq!(ctx.modify(&m), Err(EINVAL), "bad path MTU");
    m.path_mtu = 3;
    assert_eq!(ctx.modify(&m), Ok(()));
    // UD: RESET -> INIT needs a QKEY.
    assert_eq!(
        ctx.modify(&base(&ud, 1, M_STATE | M_PKEY | M_PORT)),
        Err(EINVAL)
    );
    assert_eq!(
        ctx.modify(&base(&ud, 1, M_STATE | M_PKEY | M_PORT | M_QKEY)),
        Ok(())
    );
    // QUERY_QP reports the state.
    let r = query_qp(&ctx, &qp);
    assert_eq!((r.qp_state, r.path_mtu, r.port_num), (2, 3, 1));
    // Any state -> ERR -> RESET is always allowed.
    assert_eq!(ctx.modify(&base(&qp, 6, M_STATE)), Ok(()));
    assert_eq!(ctx.modify(&base(&qp, 0, M_STATE)), Ok(()));
}

#[test]
fn queries_and_extended_commands() {
    let emu = stepped(1);
    let ctx = Ctx::open(&emu, 0);
    assert_eq!(ctx.resp.cqe_version, 1);
    assert_eq!(ctx.resp.bf_reg_size, 512);
    assert_eq!(ctx.resp.tot_bfregs, 16);
    let info = emu.hca_info(0).unwrap();
    let (o, _) = write_cmd(
        &ctx.dev,
        IB_USER_VERBS_CMD_QUERY_DEVICE,
        &[0u8; 8],
        &[],
        176,
        0,
    )
    .unwrap();
    let d = IbUverbsQueryDeviceResp::read_from_bytes(&o).unwrap();
    assert_eq!(d.fw_ver, info.fw_ver_raw);
    assert_eq!(d.node_guid, info.node_guid.to_be());
    assert_eq!(d.phys_port_cnt, 1);
    let pr = query_port(&ctx, 1).unwrap();
    assert_eq!((pr.lid, pr.state, pr.active_mtu), (info.lid, 4, 5));
    assert_eq!(query_port(&ctx, 2).err(), Some(EINVAL));
    // Extended QUERY_DEVICE: 304-byte core + mlx5 part.
    let mut out = vec![0u8; 304 + 104];
    let core = IbUverbsExQueryDevice::default();
    let b = mlx5_ffi::cmd::build_write_ex(
        IB_USER_VERBS_CMD_QUERY_DEVICE,
        out.as_mut_ptr() as u64,
        core.as_bytes(),
        304,
        &[],
        104,
    )
    .unwrap();
    ctx.dev.cmd_write(&b).unwrap();
    let r = IbUverbsExQueryDeviceResp::read_from_bytes(&out[..304]).unwrap();
    assert_eq!((r.base.fw_ver, r.response_length), (info.fw_ver_raw, 304));
    assert_eq!(r.hca_core_clock, 1_000_000);
    let bad = IbUverbsExQueryDevice {
        comp_mask: 1,
        reserved: 0,
    };
    let b = mlx5_ffi::cmd::build_write_ex(
        IB_USER_VERBS_CMD_QUERY_DEVICE,
        out.as_mut_ptr() as u64,
        bad.as_bytes(),
        304,
        &[],
        0,
    )
    .unwrap();
    assert_eq!(ctx.dev.cmd_write(&b), Err(EINVAL));
    let mut b = mlx5_ffi::cmd::build_write_ex(
        IB_USER_VERBS_CMD_QUERY_DEVICE,
        out.as_mut_ptr() as u64,
        core.as_bytes(),
        304,
        &[],
        0,
    )
    .unwrap();
    b[20] = 1; // cmd_hdr_reserved
    assert_eq!(ctx.dev.cmd_write(&b), Err(EINVAL));
}

#[test]
fn ioctl_flavours_and_invoke_write() {
    let e = emu_with(Flavour::WriteOnly);
    let dev = e.open(0).unwrap();
    let mut probe = IoctlBuilder::new(UVERBS_OBJECT_DEVICE, UVERBS_METHOD_INVOKE_WRITE)
        .in_u64(
            UVERBS_ATTR_WRITE_CMD,
            u64::from(IB_USER_VERBS_CMD_QUERY_DEVICE),
        )
        .build()
        .unwrap();
    assert_eq!(dev.cmd_ioctl(&mut probe), Err(Errno(libc::ENOTTY)));
    let e = emu_with(Flavour::Eproto);
    assert_eq!(
        e.open(0).unwrap().cmd_ioctl(&mut probe),
        Err(Errno(libc::EPROTONOSUPPORT))
    );
    let e = emu_with(Flavour::Modern);
    let ctx = Ctx::open(&e, 0);
    assert_eq!(
        ctx.dev.cmd_ioctl(&mut probe),
        Err(ENOSPC),
        "the has_ioctl_write() probe"
    );
    // ALLOC_PD through INVOKE_WRITE.
    let mut core_out = [0u8; 4];
    let mut drv_out = [0u8; 4];
    let mut b = IoctlBuilder::new(UVERBS_OBJECT_DEVICE, UVERBS_METHOD_INVOKE_WRITE)
        .in_u64(UVERBS_ATTR_WRITE_CMD, u64::from(IB_USER_VERBS_CMD_ALLOC_PD))
        .in_u64(UVERBS_ATTR_CORE_IN, 0)
        .out_ptr(UVERBS_ATTR_CORE_OUT, core_out.as_mut_ptr() as u64, 4)
        .out_ptr(UVERBS_ATTR_UHW_OUT, drv_out.as_mut_ptr() as u64, 4)
        .build()
        .unwrap();
    ctx.dev.cmd_ioctl(&mut b).unwrap();
    let pdn = u32::from_ne_bytes(drv_out);
    assert_ne!(pdn, 0);
    let flags = u16::from_ne_bytes([b[24 + 2 * 16 + 4], b[24 + 2 * 16 + 5]]);
    assert_ne!(
        flags & UVERBS_ATTR_F_VALID_OUTPUT,
        0,
        "CORE_OUT marked valid"
    );
    let handle = u32::from_ne_bytes(core_out);
    assert_eq!(
        write_noresp(
            &ctx.dev,
            IB_USER_VERBS_CMD_DEALLOC_PD,
            &handle.to_ne_bytes(),
            &[]
        ),
        Ok(())
    );
    // A mandatory attribute the method does not know; a bad length; another method.
    let mut b = IoctlBuilder::new(UVERBS_OBJECT_DEVICE, UVERBS_METHOD_INVOKE_WRITE)
        .in_u64(UVERBS_ATTR_WRITE_CMD, u64::from(IB_USER_VERBS_CMD_ALLOC_PD))
        .in_u64(77, 0)
        .build()
        .unwrap();
    assert_eq!(ctx.dev.cmd_ioctl(&mut b), Err(Errno(libc::EPROTONOSUPPORT)));
    b[0] = 200;
    assert_eq!(ctx.dev.cmd_ioctl(&mut b), Err(EINVAL));
    let mut b = IoctlBuilder::new(UVERBS_OBJECT_CQ, 7).build().unwrap();
    assert_eq!(
        ctx.dev.cmd_ioctl(&mut b),
        Err(Errno(libc::EPROTONOSUPPORT)),
        "no such method"
    );
    let mut b = IoctlBuilder::new(UVERBS_OBJECT_CQ, UVERBS_METHOD_CQ_CREATE)
        .build()
        .unwrap();
    assert_eq!(
        ctx.dev.cmd_ioctl(&mut b),
        Err(EINVAL),
        "CQ create without its mandatory CQE"
    );
}

#[test]
fn mmap_offsets_and_protections() {
    let emu = stepped(1);
    let ctx = Ctx::open(&emu, 0);
    assert_eq!(ctx.uars.len(), 8);
    assert_eq!(
        ctx.dev
            .mmap(4096, libc::PROT_WRITE, mmap_offset(0, 8) * 4096)
            .map(|_| ()),
        Err(EINVAL)
    );
    assert_eq!(
        ctx.dev.mmap(8192, libc::PROT_WRITE, 0).map(|_| ()),
        Err(EINVAL),
        "one page only"
    );
    assert_eq!(
        ctx.dev
            .mmap(
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                mmap_offset(5, 0) * 4096
            )
            .map(|_| ()),
        Err(Errno(libc::EPERM))
    );
    let clock = ctx
        .dev
        .mmap(4096, libc::PROT_READ, mmap_offset(5, 0) * 4096)
        .unwrap();
    emu.step();
    let hi = |p: std::ptr::NonNull<u8>| {
        let a = p.as_ptr() as usize + ctx.resp.hca_core_clock_offset as usize;
        // SAFETY: the clock page is mapped readable; the offset is inside it.
        unsafe { std::ptr::with_exposed_provenance::<u64>(a).read_volatile() }
    };
    let _ = hi(clock);
    let info = ctx
        .dev
        .mmap(4096, libc::PROT_READ, mmap_offset(7, 0) * 4096)
        .unwrap();
    assert_eq!(
        ctx.dev
            .mmap(4096, libc::PROT_READ, mmap_offset(9, 0) * 4096)
            .map(|_| ()),
        Err(EINVAL)
    );
    // SAFETY: both were returned by this surface's mmap and are no longer used.
    unsafe {
        ctx.dev.munmap(info, 4096).unwrap();
    }
    // SAFETY: as above (the surface must refuse a mapping it no longer tracks).
    let again = unsafe { ctx.dev.munmap(info, 4096) };
    assert_eq!(again, Err(EINVAL), "already unmapped");
}

#[test]
fn srq_receives_from_two_qps() {
    let emu = stepped(1);
    let mut ctx = Ctx::open(&emu, 0);
    let pd = ctx.alloc_pd();
    let mut cq = ctx.create_cq(32, 64, -1);
    let srq_buf = Buf::new(4096);
    let db = ctx.db();
    let c = IbUverbsCreateSrq {
        response: 0,
        user_handle: 7,
        pd_handle: pd,
        max_wr: 7,
        max_sge: 1,
        srq_limit: 0,
    };
    let d = Mlx5IbCreateSrq {
        buf_addr: srq_buf.addr(),
        db_addr: db,
        ..Default::default()
    };
    let (o, _) = write_cmd(
        &ctx.dev,
        IB_USER_VERBS_CMD_CREATE_SRQ,
        c.as_bytes(),
        d.as_bytes(),
        16,
        8,
    )
    .unwrap();
    let r = IbUverbsCreateSrqResp::read_from_bytes(&o).unwrap();
    assert_eq!((r.max_wr, r.max_sge), (7, 1));
    // Stride 32: next segment + one data segment; link 0 -> 1 -> ... -> 7.
    let data = Buf::new(4096);
    let (_, lkey, _) = ctx.reg_mr(pd, data.addr(), 4096, ALL_ACCESS).unwrap();
    for i in 0..8u16 {
        let mut w = mlx5_hw::wqe::SrqNextSeg::new(i + 1).as_bytes().to_vec();
        w.extend_from_slice(
            mlx5_hw::wqe::DataSeg::new(64, lkey, data.addr() + u64::from(i) * 64).as_bytes(),
        );
        srq_buf.write(i as usize * 32, &w);
    }
    store32(db, 3u32.to_be()); // three posted
    let a = ctx.create_qp(pd, &cq, &cq, RC, 16, 0, None);
    let b = ctx.create_qp(pd, &cq, &cq, RC, 16, 0, Some(r.srq_handle));
    let c2 = ctx.create_qp(pd, &cq, &cq, RC, 16, 0, Some(r.srq_handle));
    let d2 = ctx.create_qp(pd, &cq, &cq, RC, 16, 0, None);
    bring_up(&ctx, &a, 1, b.qpn, Knobs::default());
    bring_up(&ctx, &b, 1, a.qpn, Knobs::default());
    bring_up(&ctx, &d2, 1, c2.qpn, Knobs::default());
    bring_up(&ctx, &c2, 1, d2.qpn, Knobs::default());
    let (mut a, mut d2) = (a, d2);
    data.write(1024, b"from-a");
    data.write(1100, b"from-d");
    for (qp, off) in [(&mut a, 1024u64), (&mut d2, 1100)] {
        let seg = mlx5_hw::wqe::DataSeg::new(6, lkey, data.addr() + off);
        let i = qp.build_send(
            mlx5_hw::opcodes::SendOpcode::SEND,
            0,
            8,
            [0; 4],
            seg.as_bytes(),
        );
        qp.ring(&ctx, i, Ring::Doorbell);
    }
    emu.run_until_idle();
    let all = drain(&mut cq);
    let recv: Vec<_> = all.iter().filter(|c| c.opcode == 2).collect();
    assert_eq!(recv.len(), 2);
    assert_eq!(recv[0].wqe_counter, 0, "SRQ WQE index");
    assert_eq!(recv[1].wqe_counter, 1);
    assert_eq!(data.read(0, 6), b"from-a");
    assert_eq!(data.read(64, 6), b"from-d");
}

/// Extreme values in size fields the kernel shifts or multiplies (a QP without RQ but with
/// `rq_wqe_shift` 200, counts and sizes at `u32::MAX`): every one is an errno, never an
/// arithmetic overflow (which a debug build of the emulated kernel would turn into a panic).
#[test]
fn extreme_size_fields_are_errnos_not_overflows() {
    let emu = stepped(1);
    let mut ctx = Ctx::open(&emu, 0);
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(8, 64, -1);
    let buf = Buf::new(4096);
    for (sq, rq, shift, max_send, max_recv) in [
        (0u32, 0u32, 200u32, 0u32, 0u32),
        (0, 0, u32::MAX, 0, 0),
        (u32::MAX, u32::MAX, u32::MAX, u32::MAX, u32::MAX),
        (1 << 31, 0, 31, 1, 0),
    ] {
        let db = ctx.db();
        let c = IbUverbsCreateQp {
            pd_handle: pd,
            send_cq_handle: cq.handle,
            recv_cq_handle: cq.handle,
            max_send_wr: max_send,
            max_recv_wr: max_recv,
            qp_type: RC,
            ..Default::default()
        };
        let d = Mlx5IbCreateQp {
            buf_addr: buf.addr(),
            db_addr: db,
            sq_wqe_count: sq,
            rq_wqe_count: rq,
            rq_wqe_shift: shift,
            uidx: 7,
            ..Default::default()
        };
        // Answered (success or an errno) without a panic: that is the assertion.
        let r = run_cmd(
            &ctx.dev,
            IB_USER_VERBS_CMD_CREATE_QP,
            c.as_bytes(),
            d.as_bytes(),
            (32, 40),
        );
        if let Err(Errno(e)) = r {
            assert!(e > 0, "errno {e}");
        }
    }
    for (cqe, size) in [(u32::MAX, 64u32), ((1 << 22) - 1, u32::MAX)] {
        let c = IbUverbsCreateCq {
            cqe,
            comp_channel: -1,
            ..Default::default()
        };
        let d = Mlx5IbCreateCq {
            buf_addr: buf.addr(),
            db_addr: ctx.db(),
            cqe_size: size,
            ..Default::default()
        };
        assert_eq!(
            run_cmd(
                &ctx.dev,
                IB_USER_VERBS_CMD_CREATE_CQ,
                c.as_bytes(),
                d.as_bytes(),
                (8, 8)
            ),
            Err(EINVAL)
        );
    }
    for (max_wr, max_sge) in [(u32::MAX, 1u32), (1, u32::MAX)] {
        let c = IbUverbsCreateSrq {
            pd_handle: pd,
            max_wr,
            max_sge,
            ..Default::default()
        };
        let d = Mlx5IbCreateSrq {
            buf_addr: buf.addr(),
            db_addr: ctx.db(),
            ..Default::default()
        };
        assert_eq!(
            run_cmd(
                &ctx.dev,
                IB_USER_VERBS_CMD_CREATE_SRQ,
                c.as_bytes(),
                d.as_bytes(),
                (16, 8)
            ),
            Err(EINVAL)
        );
    }
}
