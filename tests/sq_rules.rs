//! Send-queue rules: a full SQ is refused and never overwritten; the WQE bytes carry the fence,
//! solicited and signaled bits, the right index, ds and segments; posting needs RTS; arming for
//! the next completion fires once per arm.

mod common;

use std::sync::Arc;

use common::{PairOpts, Rig, connect, pair, poll_n, side};
use mlx5::hw::opcodes::SendOpcode;
use mlx5::hw::types::Be32;
use mlx5::hw::wqe::{
    CtrlSeg, DataSeg, FM_CE_SE_CQ_UPDATE, FM_CE_SE_FENCE, FM_CE_SE_SOLICITED, INLINE_SEG_FLAG,
    RaddrSeg, WqeView,
};
use mlx5::{
    Cq, CqInit, PostError, QpState, QpType, RecvWr, SendFlags, SendWr, WcStatus, WorkCompletion,
    WrOp,
};
use zerocopy::FromBytes;

/// Fill the SQ with unsignaled WRs: the next post is refused with `Full`, nothing is
/// overwritten; one signaled WR (after room is made) retires everything.
fn full_sq_is_refused(rig: &dyn Rig) {
    let mut o = PairOpts::new(QpType::Rc);
    o = o.caps(8, 8, 1, 1, 0);
    let (mut a, b) = pair(rig, o);
    let cap = a.qp.cap().max_send_wr;
    assert!(cap >= 8);
    let sge = [a.mr.sge(0, 8)];
    let op = WrOp::Write {
        raddr: b.mr.addr(),
        rkey: b.mr.rkey(),
    };
    let wrs: Vec<_> = (0..u64::from(cap))
        .map(|i| SendWr::new(i, op, &sge, SendFlags::NONE))
        .collect();
    a.qp.post_send(&wrs).unwrap();
    let before = a.qp.sq_ref().producer();
    let extra = [SendWr::new(99, op, &sge, SendFlags::SIGNALED)];
    let e = a.qp.post_send(&extra).unwrap_err();
    assert_eq!(
        e,
        (
            0,
            PostError::Full {
                outstanding: cap,
                capacity: cap
            }
        )
    );
    assert_eq!(
        a.qp.sq_ref().producer(),
        before,
        "a refused WR writes nothing"
    );
    // Unsignaled WRs are never retired without a CQE: the queue stays full even after the device
    // executed them.
    for _ in 0..200 {
        rig.progress();
    }
    assert_eq!(a.cq.poll(&mut [WorkCompletion::default(); 4]), 0);
    assert!(matches!(
        a.qp.post_send(&extra),
        Err((0, PostError::Full { .. }))
    ));
    // A chain longer than the room: the first WRs are posted, the rest refused at its index.
    let mut o2 = PairOpts::new(QpType::Rc);
    o2.cap = o.cap;
    o2.report_unsignaled = true;
    let (mut c, d) = pair(rig, o2);
    let op = WrOp::Write {
        raddr: d.mr.addr(),
        rkey: d.mr.rkey(),
    };
    let sge = [c.mr.sge(0, 8)];
    let n = u64::from(c.qp.cap().max_send_wr) + 3;
    let wrs: Vec<_> = (0..n)
        .map(|i| {
            SendWr::new(
                i,
                op,
                &sge,
                if i == n - 4 {
                    SendFlags::SIGNALED
                } else {
                    SendFlags::NONE
                },
            )
        })
        .collect();
    let e = c.qp.post_send(&wrs).unwrap_err();
    assert_eq!(e.0 as u64, n - 3);
    let wcs = poll_n(rig, &mut c.cq, (n - 3) as usize);
    assert!(
        wcs.iter()
            .enumerate()
            .all(|(i, w)| w.wr_id == i as u64 && w.status == WcStatus::SUCCESS)
    );
    assert_eq!(c.qp.sq_ref().free(), c.qp.cap().max_send_wr);
}

/// The bytes of posted WQEs, decoded with mlx5-hw.
fn wqe_bytes_carry_the_flags(rig: &dyn Rig) {
    let (mut a, b) = pair(rig, PairOpts::new(QpType::Rc));
    let sge = [a.mr.sge(64, 100)];
    let op = WrOp::Read {
        raddr: b.mr.addr() + 8,
        rkey: b.mr.rkey(),
    };
    let p0 = a.qp.sq_ref().producer();
    a.qp.post_send(&[SendWr::new(
        1,
        op,
        &sge,
        SendFlags::SIGNALED | SendFlags::FENCE,
    )])
    .unwrap();
    let mut w = [0u8; 64];
    a.qp.sq_ref().wqe_bytes(p0, &mut w);
    let ctrl = CtrlSeg::read_from_bytes(&w[..16]).unwrap();
    assert_eq!(ctrl.opcode(), SendOpcode::RDMA_READ);
    assert_eq!(u32::from(ctrl.wqe_index()), p0 & 0xFFFF);
    assert_eq!((ctrl.qpn(), ctrl.ds()), (a.qp.qpn(), 3));
    assert_eq!(ctrl.fm_ce_se, FM_CE_SE_FENCE | FM_CE_SE_CQ_UPDATE);
    let r = RaddrSeg::read_from_bytes(&w[16..32]).unwrap();
    assert_eq!((r.raddr(), r.rkey()), (b.mr.addr() + 8, b.mr.rkey()));
    let d = DataSeg::read_from_bytes(&w[32..48]).unwrap();
    assert_eq!(
        (d.byte_count(), d.lkey(), d.addr()),
        (100, a.mr.lkey(), a.mr.addr() + 64)
    );
    let text = WqeView::new(&w).to_string();
    assert!(text.contains("RDMA_READ"), "{text}");
    poll_n(rig, &mut a.cq, 1);

    // Inline SEND with immediate and solicited, unsignaled: header = len | 0x80000000.
    let p1 = a.qp.sq_ref().producer();
    let payload = [7u8; 40];
    let parts: [&[u8]; 1] = [&payload];
    let wr = SendWr::new(
        2,
        WrOp::SendImm { imm: [1, 2, 3, 4] },
        &[],
        SendFlags::SOLICITED,
    )
    .with_inline(&parts);
    // (No receive is posted at b; only the WQE bytes matter here.)
    a.qp.post_send(&[wr]).unwrap();
    let mut w = [0u8; 128];
    a.qp.sq_ref().wqe_bytes(p1, &mut w);
    let ctrl = CtrlSeg::read_from_bytes(&w[..16]).unwrap();
    assert_eq!(ctrl.opcode(), SendOpcode::SEND_IMM);
    assert_eq!(ctrl.fm_ce_se, FM_CE_SE_SOLICITED, "unsignaled: no CE bits");
    assert_eq!(&w[12..16], &[1, 2, 3, 4], "immediate copied verbatim");
    assert_eq!(ctrl.ds(), 1 + (4 + 40u8).div_ceil(16));
    let hdr = Be32::read_from_bytes(&w[16..20]).unwrap().get();
    assert_eq!(hdr, INLINE_SEG_FLAG | 40);
    assert_eq!(&w[20..60], &payload);
}

/// Posting before RTS is refused (sends) and allowed from INIT (receives).
fn posting_follows_qp_state(rig: &dyn Rig) {
    let mut s = side(rig, 0, &PairOpts::new(QpType::Rc));
    let sge = [s.mr.sge(0, 8)];
    assert_eq!(
        s.qp.post_send(&[SendWr::send(1, &sge, SendFlags::SIGNALED)])
            .unwrap_err()
            .1,
        PostError::BadState {
            state: QpState::Reset
        }
    );
    assert!(matches!(
        s.qp.post_recv(&[RecvWr {
            wr_id: 1,
            sg_list: &sge
        }]),
        Err((0, PostError::BadState { .. }))
    ));
    s.qp.to_init(1, mlx5::Access::ALL).unwrap();
    s.qp.post_recv(&[RecvWr {
        wr_id: 1,
        sg_list: &sge,
    }])
    .unwrap();
    assert!(
        s.qp.post_send(&[SendWr::send(1, &sge, SendFlags::SIGNALED)])
            .is_err()
    );
}

/// `req_notify(false)` fires on the next completion of any kind, once per arm; the arm
/// sequence number advances with each event.
fn arm_next_fires_once_per_arm(rig: &dyn Rig) {
    let o = PairOpts::new(QpType::Rc);
    let a = side(rig, 0, &o);
    let b = side(rig, 1, &o);
    // A QP whose CQ is bound to a completion channel, connected to a fresh QP at b.
    let chan = Arc::new(a.ctx.create_comp_channel().unwrap());
    let mut cq = Cq::new(&a.ctx, CqInit::default(), Some(&chan)).unwrap();
    let mut init = mlx5::QpInitAttr::new(QpType::Rc, &cq, &cq);
    init.cap.max_send_wr = 8;
    let mut qp = mlx5::Qp::new(&a.pd, &init).unwrap();
    let mut init_b = mlx5::QpInitAttr::new(QpType::Rc, &b.cq, &b.cq);
    init_b.cap.max_recv_wr = 8;
    let mut qb = mlx5::Qp::new(&b.pd, &init_b).unwrap();
    connect((&mut qp, &a.ctx), (&mut qb, &b.ctx), mlx5::Access::ALL, 7);
    let sge = [a.mr.sge(0, 8)];
    let op = WrOp::Write {
        raddr: b.mr.addr(),
        rkey: b.mr.rkey(),
    };
    for round in 0..3u64 {
        cq.req_notify(false);
        assert_eq!(
            chan.get_event(0).unwrap(),
            None,
            "no event before a completion"
        );
        qp.post_send(&[SendWr::new(round, op, &sge, SendFlags::SIGNALED)])
            .unwrap();
        let mut got = None;
        for _ in 0..100_000 {
            rig.progress();
            if let Some(h) = chan.get_event(0).unwrap() {
                got = Some(h);
                break;
            }
        }
        assert_eq!(
            got,
            Some(cq.user_handle()),
            "round {round}: the armed CQ fired"
        );
        cq.event_received();
        let wc = poll_n(rig, &mut cq, 1);
        assert_eq!(wc[0].wr_id, round);
        // Not re-armed: a second completion produces no event.
        qp.post_send(&[SendWr::new(100 + round, op, &sge, SendFlags::SIGNALED)])
            .unwrap();
        assert_eq!(poll_n(rig, &mut cq, 1)[0].wr_id, 100 + round);
        assert_eq!(chan.get_event(0).unwrap(), None, "one event per arm");
    }
    if let Some(c) = rig.counters(0) {
        assert!(c.cq_arms >= 3 && c.comp_events >= 3, "{c:?}");
    }
}

scenarios!(
    full_sq_is_refused,
    wqe_bytes_carry_the_flags,
    posting_follows_qp_state,
    arm_next_fires_once_per_arm
);
