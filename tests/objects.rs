//! Object lifetimes and the control path: every object destroys itself on drop in a safe order
//! (children hold their parents), whatever order the application drops them in; the driver
//! works on every kernel-ABI flavour the emulator presents; device, port and GID queries.

mod common;

use common::{EmuRig, PairOpts, Rig, pair, poll_n};
use mlx5::{QpType, RecvWr, SendFlags, SendWr, WcStatus};
use mlx5_emu::{EmuConfig, Flavour, RunMode};

/// Drop the context, PD, MR, buffer and CQ handles before the QPs: nothing fails (each destroy
/// is checked with a debug assertion) and the QPs stay usable until they go.
fn adversarial_drop_order(rig: &dyn Rig) {
    let (a, b) = pair(rig, PairOpts::new(QpType::Rc));
    let common::Side {
        ctx: actx,
        pd: apd,
        cq: acq,
        qp: mut aqp,
        buf: abuf,
        mr: amr,
    } = a;
    let common::Side {
        ctx: bctx,
        pd: bpd,
        cq: mut bcq,
        qp: mut bqp,
        buf: bbuf,
        mr: bmr,
    } = b;
    let sge = [amr.sge(0, 16)];
    let rsge = [bmr.sge(0, 16)];
    abuf.write(0, b"after the drops!");
    drop(actx);
    drop(apd);
    drop(acq); // the send CQ's poller is gone; the CQ itself lives while the QP does
    drop(bctx);
    drop(bpd);
    bqp.post_recv(&[RecvWr {
        wr_id: 1,
        sg_list: &rsge,
    }])
    .unwrap();
    aqp.post_send(&[SendWr::send(1, &sge, SendFlags::SIGNALED)])
        .unwrap();
    let r = poll_n(rig, &mut bcq, 1);
    assert_eq!(r[0].status, WcStatus::SUCCESS);
    let mut got = [0u8; 16];
    bbuf.read(0, &mut got);
    assert_eq!(&got, b"after the drops!");
    drop(amr);
    drop(abuf);
    drop(bcq);
    drop(aqp);
    drop(bmr);
    drop(bqp);
}

fn query_device_port_gid(rig: &dyn Rig) {
    let ctx = rig.open(0);
    let d = ctx.device_attr();
    assert!(
        d.raw.max_qp > 0 && d.raw.max_cqe > 0 && d.raw.max_qp_wr > 0,
        "{d:?}"
    );
    assert!(d.raw.phys_port_cnt >= 1);
    assert!(!d.fw_version().is_empty());
    let p = ctx.query_port(1).unwrap();
    assert_eq!(p.state, 4, "port ACTIVE");
    assert!(p.gid_tbl_len >= 1);
    let ucx = ctx.ucontext();
    assert_eq!(ctx.cqe_version(), 1, "asked for CQE version 1");
    assert!(ucx.max_sq_desc_sz >= 64 && ucx.max_send_wqebb > 0);
    // GID 0 is the link-local prefix plus the port GUID (IB) or the MAC-derived EUI-64 (RoCE).
    let e = ctx.query_gid_entry(1, 0).unwrap();
    assert_eq!(&e.gid[..2], &[0xfe, 0x80], "{e:?}");
    if p.is_roce() {
        let (i, g) = ctx.find_gid(1).unwrap().expect("a RoCE v2 GID");
        let t = ctx.query_gid_entry(1, i).unwrap();
        assert_eq!(
            (t.gid, t.gid_type),
            (g, mlx5::ffi::ioctl::IB_UVERBS_GID_TYPE_ROCE_V2)
        );
    } else {
        assert_eq!(e.gid_type, mlx5::ffi::ioctl::IB_UVERBS_GID_TYPE_IB);
        assert_eq!(ctx.find_gid(1).unwrap(), Some((0, e.gid)));
    }
}

/// A memory region over caller memory (a plain heap allocation), receiving a SEND.
fn mr_over_caller_memory(rig: &dyn Rig) {
    let (mut a, b) = pair(rig, PairOpts::new(QpType::Rc));
    let mut mem = vec![0u8; 8192].into_boxed_slice();
    // SAFETY: `mem` outlives the region (dropped after `mr` at the end of this function) and is
    // not touched through Rust references while the device may write it (read after the CQE).
    let user = unsafe { mlx5::UserMemory::from_raw_parts(mem.as_mut_ptr(), mem.len()) };
    let mr = b.pd.reg_user_mr(user, mlx5::Access::LOCAL_WRITE).unwrap();
    assert_eq!(mr.addr(), mem.as_ptr() as u64);
    let mut bqp = b.qp;
    let mut bcq = b.cq;
    let rsge = [mr.sge(100, 200)];
    bqp.post_recv(&[RecvWr {
        wr_id: 5,
        sg_list: &rsge,
    }])
    .unwrap();
    a.buf.write(0, b"into caller memory");
    let sge = [a.mr.sge(0, 18)];
    a.qp.post_send(&[SendWr::send(1, &sge, SendFlags::SIGNALED)])
        .unwrap();
    let r = poll_n(rig, &mut bcq, 1);
    assert_eq!(
        (r[0].wr_id, r[0].status, r[0].byte_len),
        (5, WcStatus::SUCCESS, 18)
    );
    drop(bqp);
    drop(mr);
    assert_eq!(&mem[100..118], b"into caller memory");
    // Remote write without local write is refused before the syscall, as in verbs.
    // SAFETY: as above; the registration is refused, so nothing references `mem`.
    let user = unsafe { mlx5::UserMemory::from_raw_parts(mem.as_mut_ptr(), mem.len()) };
    let e =
        b.pd.reg_user_mr(user, mlx5::Access::REMOTE_WRITE)
            .unwrap_err();
    assert!(
        matches!(e, mlx5::Error::InvalidArgument { attr: "access", .. }),
        "{e:?}"
    );
}

/// QUERY_QP reports what the connection set up.
fn query_qp_after_connect(rig: &dyn Rig) {
    let (a, b) = pair(rig, PairOpts::new(QpType::Rc));
    let (st, attr, cap) = a.qp.query_attr().unwrap();
    assert_eq!(st, mlx5::QpState::Rts);
    assert_eq!(attr.dest_qp_num, b.qp.qpn());
    assert_eq!((attr.sq_psn, attr.rq_psn), (0x100, 0x200));
    assert_eq!(
        (attr.path_mtu, attr.port_num, attr.retry_cnt, attr.rnr_retry),
        (Some(mlx5::Mtu::M1024), 1, 7, 7)
    );
    assert_eq!(attr.ah_attr.dlid, b.ctx.query_port(1).unwrap().lid);
    assert!(cap.max_send_wr >= 64, "{cap:?}");
}

scenarios!(
    adversarial_drop_order,
    query_device_port_gid,
    mr_over_caller_memory,
    query_qp_after_connect
);

/// The same SEND works whatever transport the kernel offers (write() only, ioctl answering
/// EPROTONOSUPPORT, modern ioctl), and with CQE version 0 (CQEs resolved by QPN).
#[test]
fn every_kernel_flavour_and_cqe_version() {
    for (flavour, cqe_version) in [
        (Flavour::WriteOnly, 1),
        (Flavour::Eproto, 1),
        (Flavour::Modern, 1),
        (Flavour::Modern, 0),
    ] {
        let rig = EmuRig::with(EmuConfig {
            num_hcas: 2,
            mode: RunMode::Stepped,
            flavour,
            cqe_version,
            ..EmuConfig::default()
        });
        let (mut a, mut b) = pair(&rig, PairOpts::new(QpType::Rc));
        assert_eq!(a.ctx.cqe_version(), cqe_version);
        let rsge = [b.mr.sge(0, 64)];
        b.qp.post_recv(&[RecvWr {
            wr_id: 9,
            sg_list: &rsge,
        }])
        .unwrap();
        let sge = [a.mr.sge(0, 32)];
        a.qp.post_send(&[SendWr::send(8, &sge, SendFlags::SIGNALED)])
            .unwrap();
        let s = poll_n(&rig, &mut a.cq, 1);
        let r = poll_n(&rig, &mut b.cq, 1);
        assert_eq!(
            (s[0].wr_id, s[0].status),
            (8, WcStatus::SUCCESS),
            "{flavour:?}"
        );
        assert_eq!(
            (r[0].wr_id, r[0].status, r[0].byte_len),
            (9, WcStatus::SUCCESS, 32),
            "{flavour:?}"
        );
    }
}

/// No BlueFlame on the device (bf_reg_size 0, as when the kernel's WC self-test fails): every
/// post is an 8-byte doorbell.
#[test]
fn no_blueflame_device_uses_doorbells() {
    let rig = EmuRig::with(EmuConfig {
        num_hcas: 2,
        mode: RunMode::Stepped,
        bf_reg_size: 0,
        ..EmuConfig::default()
    });
    let (mut a, b) = pair(&rig, PairOpts::new(QpType::Rc));
    assert_eq!(a.qp.sq_ref().bfreg().bf_size, 0);
    let sge = [a.mr.sge(0, 32)];
    let op = mlx5::WrOp::Write {
        raddr: b.mr.addr(),
        rkey: b.mr.rkey(),
    };
    for i in 0..10 {
        a.qp.post_send(&[SendWr::new(i, op, &sge, SendFlags::SIGNALED)])
            .unwrap();
        poll_n(&rig, &mut a.cq, 1);
    }
    let c = rig.emu.counters(0);
    assert_eq!((c.bf_writes, a.qp.sq_ref().stats().bf_copies), (0, 0));
    assert_eq!(a.qp.sq_ref().stats().doorbells, 10);
}

/// Dynamic UARs (a modern kernel answering `MLX5_LIB_CAP_DYN_UAR`): tot_bfregs = 0, the NC UAR
/// for CQ arming and shared doorbells, BlueFlame UARs allocated per QP (two dedicated registers
/// each) up to the low-latency budget, then the shared NC register; everything works.
#[test]
fn dynamic_uars_end_to_end() {
    let rig = EmuRig::with(EmuConfig {
        num_hcas: 2,
        mode: RunMode::Stepped,
        flavour: Flavour::Modern,
        dyn_uar: true,
        ..EmuConfig::default()
    });
    let (mut a, mut b) = pair(&rig, PairOpts::new(QpType::Rc));
    assert_eq!(a.ctx.uar_mode(), mlx5::UarMode::Dynamic);
    assert_eq!(a.ctx.ucontext().tot_bfregs, 0);
    let info = a.qp.sq_ref().bfreg();
    assert!(info.dedicated && info.bf_size == 256, "{info:?}");
    // SEND with BlueFlame, receive, and a CQ arm doorbell through the NC UAR.
    let rsge = [b.mr.sge(0, 64)];
    b.qp.post_recv(&[RecvWr {
        wr_id: 1,
        sg_list: &rsge,
    }])
    .unwrap();
    b.cq.req_notify(false);
    let sge = [a.mr.sge(0, 32)];
    a.qp.post_send(&[SendWr::send(1, &sge, SendFlags::SIGNALED)])
        .unwrap();
    assert_eq!(poll_n(&rig, &mut a.cq, 1)[0].status, WcStatus::SUCCESS);
    assert_eq!(poll_n(&rig, &mut b.cq, 1)[0].status, WcStatus::SUCCESS);
    assert_eq!(a.qp.sq_ref().stats().bf_copies, 1);
    let c = rig.emu.counters(0);
    assert_eq!((c.bf_writes, c.bf_mismatches), (1, 0));
    assert!(rig.emu.counters(1).cq_arms >= 1);
    // More QPs than the low-latency budget (4): the first get dedicated BlueFlame registers
    // (two per allocated UAR), the rest share the NC doorbell register.
    let mut qps = Vec::new();
    for _ in 0..6 {
        let init = mlx5::QpInitAttr::new(QpType::Rc, &a.cq, &a.cq);
        qps.push(mlx5::Qp::new(&a.pd, &init).unwrap());
    }
    let infos: Vec<_> = qps.iter().map(|q| q.sq_ref().bfreg()).collect();
    assert_eq!(infos.iter().filter(|i| i.dedicated).count(), 3, "{infos:?}");
    assert!(
        infos
            .iter()
            .filter(|i| !i.dedicated)
            .all(|i| i.bf_size == 0)
    );
    let shared: Vec<_> = a
        .ctx
        .bfreg_users()
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .collect();
    assert_eq!(shared.len(), 1, "one shared NC register: {shared:?}");
    assert_eq!(shared[0].1, 3);
    // Two dedicated registers per BF UAR page.
    let pages: std::collections::BTreeSet<u32> = infos
        .iter()
        .chain([&info])
        .filter(|i| i.dedicated)
        .map(|i| i.uar_page)
        .collect();
    assert_eq!(pages.len(), 2, "{infos:?}");
}
