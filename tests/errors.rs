//! One test per error class, each followed by the flush: every outstanding WR is reported
//! exactly once, the failing one with the real status and syndrome, the rest as flushed.

mod common;

use common::{PairOpts, Rig, Side, drain, pair, poll_n};
use mlx5::{
    Access, Ah, AhAttr, QpAttr, QpState, QpType, RecvWr, SendFlags, SendWr, Sge, Syndrome, UdDest,
    WcOpcode, WcStatus, WorkCompletion, WrOp,
};

/// After a failure on `s`'s send queue: post `n` more WRs (half unsignaled) and check that
/// each comes back once as a flush error, and nothing else arrives.
fn expect_send_flush(rig: &dyn Rig, s: &mut Side, first_id: u64, n: u64) {
    let sge = [s.mr.sge(0, 8)];
    let wrs: Vec<_> = (0..n)
        .map(|i| {
            let f = if i % 2 == 0 {
                SendFlags::SIGNALED
            } else {
                SendFlags::NONE
            };
            SendWr::send(first_id + i, &sge, f)
        })
        .collect();
    s.qp.post_send(&wrs)
        .expect("posting in ERR is allowed (flushed)");
    let wcs = poll_n(rig, &mut s.cq, n as usize);
    for (i, wc) in wcs.iter().enumerate() {
        assert_eq!(wc.wr_id, first_id + i as u64, "{wcs:?}");
        assert_eq!(wc.status, WcStatus::WR_FLUSH_ERR, "{wc:?}");
        assert_eq!(wc.syndrome, Syndrome::WR_FLUSH);
    }
    assert!(
        drain(rig, &mut s.cq, 50).is_empty(),
        "each WR is reported exactly once"
    );
}

fn check_err(wc: &WorkCompletion, id: u64, status: WcStatus, syndrome: Syndrome) {
    assert_eq!(
        (wc.wr_id, wc.status, wc.syndrome),
        (id, status, syndrome),
        "{wc:?}"
    );
    assert_eq!(syndrome.wc_status(), status);
}

/// A local SGE with a wrong lkey: LOC_PROT_ERR (syndrome 0x04); the chain's next WRs flush.
fn bad_lkey(rig: &dyn Rig) {
    let (mut a, _b) = pair(rig, PairOpts::new(QpType::Rc));
    let bad = [Sge {
        lkey: a.mr.lkey() ^ 0x00ff_ff00,
        ..a.mr.sge(0, 64)
    }];
    let good = [a.mr.sge(0, 64)];
    let wrs = [
        SendWr::send(1, &bad, SendFlags::SIGNALED),
        SendWr::send(2, &good, SendFlags::NONE),
        SendWr::send(3, &good, SendFlags::SIGNALED),
    ];
    a.qp.post_send(&wrs).unwrap();
    let wcs = poll_n(rig, &mut a.cq, 3);
    check_err(&wcs[0], 1, WcStatus::LOC_PROT_ERR, Syndrome::LOCAL_PROT);
    assert_eq!(
        wcs[0].opcode,
        WcOpcode::SEND,
        "error completions carry the WR's opcode"
    );
    check_err(&wcs[1], 2, WcStatus::WR_FLUSH_ERR, Syndrome::WR_FLUSH);
    check_err(&wcs[2], 3, WcStatus::WR_FLUSH_ERR, Syndrome::WR_FLUSH);
    expect_send_flush(rig, &mut a, 10, 4);
    assert_eq!(a.qp.query().unwrap().0, mlx5::QpState::Err);
    // The error CQE is the report: a requester error raises no affiliated async event (IBA
    // 11.6.3: a work queue catastrophic error is one no completion can report).
    let ev = a.ctx.get_async_event(200).unwrap();
    assert!(
        ev.is_none(),
        "no async event for a CQE-reported error: {ev:?}"
    );
}

/// A remote operation the responder refuses: REM_ACCESS_ERR (0x13) carrying the WR's opcode,
/// then the flush of `flushes` later WRs.
fn remote_access_error(
    rig: &dyn Rig,
    o: PairOpts,
    op: impl Fn(&Side) -> WrOp,
    opcode: WcOpcode,
    flushes: u64,
) {
    let (mut a, b) = pair(rig, o);
    let sge = [a.mr.sge(0, 64)];
    a.qp.post_send(&[SendWr::new(7, op(&b), &sge, SendFlags::SIGNALED)])
        .unwrap();
    let wcs = poll_n(rig, &mut a.cq, 1);
    check_err(
        &wcs[0],
        7,
        WcStatus::REM_ACCESS_ERR,
        Syndrome::REMOTE_ACCESS,
    );
    assert_eq!(wcs[0].opcode, opcode);
    expect_send_flush(rig, &mut a, 10, flushes);
}

/// RDMA WRITE with a wrong rkey: REM_ACCESS_ERR (0x13), then flush.
fn bad_rkey(rig: &dyn Rig) {
    let op = |b: &Side| WrOp::Write {
        raddr: b.mr.addr(),
        rkey: b.mr.rkey() ^ 0x0010_0000,
    };
    remote_access_error(rig, PairOpts::new(QpType::Rc), op, WcOpcode::RDMA_WRITE, 3);
}

/// RDMA READ of a region registered without REMOTE_READ: REM_ACCESS_ERR, then flush.
fn read_without_remote_read(rig: &dyn Rig) {
    let mut o = PairOpts::new(QpType::Rc);
    o.access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let op = |b: &Side| WrOp::Read {
        raddr: b.mr.addr(),
        rkey: b.mr.rkey(),
    };
    remote_access_error(rig, o, op, WcOpcode::RDMA_READ, 2);
}

/// A SEND larger than the receive buffer: the responder gets LOC_LEN_ERR (0x01) and its other
/// receives flush; the requester gets REM_INV_REQ_ERR (0x12).
fn receive_buffer_too_small(rig: &dyn Rig) {
    let (mut a, mut b) = pair(rig, PairOpts::new(QpType::Rc));
    let small = [b.mr.sge(0, 16)];
    let big = [b.mr.sge(1024, 1024)];
    b.qp.post_recv(&[
        RecvWr {
            wr_id: 100,
            sg_list: &small,
        },
        RecvWr {
            wr_id: 101,
            sg_list: &big,
        },
        RecvWr {
            wr_id: 102,
            sg_list: &big,
        },
    ])
    .unwrap();
    let sge = [a.mr.sge(0, 100)];
    a.qp.post_send(&[SendWr::send(1, &sge, SendFlags::SIGNALED)])
        .unwrap();
    let r = poll_n(rig, &mut b.cq, 3);
    check_err(&r[0], 100, WcStatus::LOC_LEN_ERR, Syndrome::LOCAL_LENGTH);
    assert_eq!(r[0].opcode, WcOpcode::RECV);
    check_err(&r[1], 101, WcStatus::WR_FLUSH_ERR, Syndrome::WR_FLUSH);
    check_err(&r[2], 102, WcStatus::WR_FLUSH_ERR, Syndrome::WR_FLUSH);
    let s = poll_n(rig, &mut a.cq, 1);
    check_err(
        &s[0],
        1,
        WcStatus::REM_INV_REQ_ERR,
        Syndrome::REMOTE_INVAL_REQ,
    );
    expect_send_flush(rig, &mut a, 10, 2);
    assert!(drain(rig, &mut b.cq, 50).is_empty());
}

/// A SEND with no receive posted and rnr_retry 0: RNR_RETRY_EXC_ERR (0x16), then flush.
fn rnr_retry_exceeded(rig: &dyn Rig) {
    let mut o = PairOpts::new(QpType::Rc);
    o.rnr_retry = 0;
    let (mut a, _b) = pair(rig, o);
    let sge = [a.mr.sge(0, 32)];
    a.qp.post_send(&[
        SendWr::send(5, &sge, SendFlags::SIGNALED),
        SendWr::send(6, &sge, SendFlags::NONE),
    ])
    .unwrap();
    let wcs = poll_n(rig, &mut a.cq, 2);
    check_err(
        &wcs[0],
        5,
        WcStatus::RNR_RETRY_EXC_ERR,
        Syndrome::RNR_RETRY_EXC,
    );
    check_err(&wcs[1], 6, WcStatus::WR_FLUSH_ERR, Syndrome::WR_FLUSH);
    expect_send_flush(rig, &mut a, 10, 2);
}

/// Moving a healthy QP to ERR flushes every posted receive and send exactly once.
fn modify_to_error_flushes_everything(rig: &dyn Rig) {
    let (mut a, _b) = pair(rig, PairOpts::new(QpType::Rc));
    let r = [a.mr.sge(4096, 64)];
    let recvs: Vec<_> = (0..5)
        .map(|i| RecvWr {
            wr_id: 200 + i,
            sg_list: &r,
        })
        .collect();
    a.qp.post_recv(&recvs).unwrap();
    a.qp.to_error().unwrap();
    let wcs = poll_n(rig, &mut a.cq, 5);
    for (i, wc) in wcs.iter().enumerate() {
        check_err(
            wc,
            200 + i as u64,
            WcStatus::WR_FLUSH_ERR,
            Syndrome::WR_FLUSH,
        );
    }
    expect_send_flush(rig, &mut a, 300, 3);
}

/// A CQ too small for the completions it gets overruns: the CQ error async event names it.
/// (The consumer index is published only by polling, so the device sees the ring full.)
fn cq_overrun_raises_async_event(rig: &dyn Rig) {
    let mut o = PairOpts::new(QpType::Rc);
    o.cqe = 3;
    let (mut a, b) = pair(rig, o);
    assert_eq!(a.cq.capacity(), 4);
    let sge = [a.mr.sge(0, 8)];
    let op = WrOp::Write {
        raddr: b.mr.addr(),
        rkey: b.mr.rkey(),
    };
    let wrs: Vec<_> = (0..8)
        .map(|i| SendWr::new(i, op, &sge, SendFlags::SIGNALED))
        .collect();
    a.qp.post_send(&wrs).unwrap();
    let mut ev = None;
    for _ in 0..10_000 {
        rig.progress();
        if let Some(e) = a.ctx.get_async_event(0).unwrap() {
            ev = Some(e);
            break;
        }
    }
    let ev = ev.expect("a CQ error event");
    assert_eq!(ev.event_type, mlx5::ffi::uverbs::IB_EVENT_CQ_ERR, "{ev:?}");
    assert_eq!(ev.element, a.cq.user_handle());
}

/// A UD or UC send error puts the QP in the send queue error state (IBA 10.3.1): the
/// failing WR completes with LOC_PROT_ERR, the WRs posted after it (in the same chain, and
/// later ones) complete with WR_FLUSH_ERR and send nothing, the receive queue still works, and
/// a modify to RTS (the kernel's SQE -> RTS) sends again.
fn send_queue_error(rig: &dyn Rig, t: QpType) {
    let (mut a, mut b) = pair(rig, PairOpts::new(t));
    let ah = Ah::new(
        &a.pd,
        AhAttr {
            dlid: b.ctx.query_port(1).unwrap().lid,
            port_num: 1,
            ..AhAttr::default()
        },
    )
    .unwrap();
    let to = UdDest {
        ah: &ah,
        remote_qpn: b.qp.qpn(),
        remote_qkey: common::QKEY,
    };
    fn dest<'a>(t: QpType, to: UdDest<'a>, wr: SendWr<'a>) -> SendWr<'a> {
        if t == QpType::Ud { wr.to(to) } else { wr }
    }
    let grh: u64 = if t == QpType::Ud { 40 } else { 0 };
    let rsge = [b.mr.sge(0, grh as u32 + 64)];
    b.qp.post_recv(&[RecvWr {
        wr_id: 90,
        sg_list: &rsge,
    }])
    .unwrap();
    a.buf.write(0, b"after-sqe");
    let bad = [Sge {
        lkey: a.mr.lkey() ^ 0x00ff_ff00,
        ..a.mr.sge(0, 9)
    }];
    let good = [a.mr.sge(0, 9)];
    let wrs = [
        dest(t, to, SendWr::send(1, &bad, SendFlags::SIGNALED)),
        dest(t, to, SendWr::send(2, &good, SendFlags::SIGNALED)),
    ];
    a.qp.post_send(&wrs).unwrap();
    let wcs = poll_n(rig, &mut a.cq, 2);
    check_err(&wcs[0], 1, WcStatus::LOC_PROT_ERR, Syndrome::LOCAL_PROT);
    check_err(&wcs[1], 2, WcStatus::WR_FLUSH_ERR, Syndrome::WR_FLUSH);
    assert_eq!(a.qp.query_state().unwrap(), QpState::Sqe);
    // Posted in SQE: accepted (as libmlx5 does) and flushed by the device, signaled or not.
    let later = [
        dest(t, to, SendWr::send(3, &good, SendFlags::NONE)),
        dest(t, to, SendWr::send(4, &good, SendFlags::SIGNALED)),
    ];
    a.qp.post_send(&later).expect("posting in SQE is allowed");
    let wcs = poll_n(rig, &mut a.cq, 2);
    check_err(&wcs[0], 3, WcStatus::WR_FLUSH_ERR, Syndrome::WR_FLUSH);
    check_err(&wcs[1], 4, WcStatus::WR_FLUSH_ERR, Syndrome::WR_FLUSH);
    assert!(
        drain(rig, &mut b.cq, 50).is_empty(),
        "nothing was sent in SQE"
    );
    assert_eq!(a.qp.query_state().unwrap(), QpState::Sqe, "still SQE");
    let rts = QpAttr {
        qp_state: Some(QpState::Rts),
        ..QpAttr::default()
    };
    a.qp.modify(&rts, mlx5::ffi::uverbs::IB_QP_STATE)
        .expect("SQE -> RTS");
    assert_eq!(a.qp.query_state().unwrap(), QpState::Rts);
    a.qp.post_send(&[dest(t, to, SendWr::send(5, &good, SendFlags::SIGNALED))])
        .unwrap();
    let wcs = poll_n(rig, &mut a.cq, 1);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (5, WcStatus::SUCCESS));
    let r = poll_n(rig, &mut b.cq, 1);
    assert_eq!(
        (r[0].wr_id, r[0].status, r[0].byte_len),
        (90, WcStatus::SUCCESS, grh as u32 + 9)
    );
    let mut got = [0u8; 9];
    b.buf.read(grh as usize, &mut got);
    assert_eq!(&got, b"after-sqe");
}

fn ud_send_queue_error(rig: &dyn Rig) {
    send_queue_error(rig, QpType::Ud);
}

fn uc_send_queue_error(rig: &dyn Rig) {
    send_queue_error(rig, QpType::Uc);
}

scenarios!(
    ud_send_queue_error,
    uc_send_queue_error,
    bad_lkey,
    bad_rkey,
    read_without_remote_read,
    receive_buffer_too_small,
    rnr_retry_exceeded,
    modify_to_error_flushes_everything,
    cq_overrun_raises_async_event
);
