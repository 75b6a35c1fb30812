//! No wrong completion from safe code (issue 24): the two findings, each failing on the code
//! before the fix. 1. A reset while `report_unsignaled` reports were pending inside the `Cq`
//! made the next poll report new WRs the device had not executed, plus a stale one, and left
//! `outstanding()` at 2^32 - 1. 2. `SendQueue::retire` took any counter: lying let 36 WRs into
//! a 16-slot ring, and a counter of no posted WQE returned wr_id 0.

mod common;

use common::{PairOpts, Rig};
use mlx5::{CqeKind, PostError, QpState, QpType, RecvWr, SendFlags, SendWr, WorkCompletion, WrOp};

fn reset(qp: &mut mlx5::Qp) {
    qp.modify(
        &mlx5::QpAttr {
            qp_state: Some(QpState::Reset),
            ..Default::default()
        },
        mlx5::ffi::uverbs::IB_QP_STATE,
    )
    .unwrap();
}

#[test]
fn a_reset_drops_pending_reports_and_nothing_completes_early() {
    let rig = common::EmuRig::stepped();
    let o = PairOpts {
        report_unsignaled: true,
        ..PairOpts::new(QpType::Rc)
    };
    let (mut a, mut b) = common::pair(&rig, o);
    let s = [a.mr.sge(0, 8)];
    let (raddr, rkey) = (b.mr.addr(), b.mr.rkey());
    let w = |id, f| SendWr {
        op: WrOp::Write { raddr, rkey },
        ..SendWr::send(id, &s, f)
    };
    // WRs 0-3 unsignaled, 4 signaled; a poll with room for one leaves 1-4 inside the Cq.
    let wrs: Vec<SendWr<'_>> = (0..5)
        .map(|i| {
            w(
                i,
                if i == 4 {
                    SendFlags::SIGNALED
                } else {
                    SendFlags::NONE
                },
            )
        })
        .collect();
    a.qp.post_send(&wrs).unwrap();
    let mut one = [WorkCompletion::default(); 1];
    while a.cq.poll(&mut one) == 0 {
        rig.progress();
    }
    assert_eq!(one[0].wr_id, 0);
    // Both QPs reset and reconnected; WRs 100-103 posted, the device not run.
    reset(&mut a.qp);
    reset(&mut b.qp);
    common::connect(
        (&mut a.qp, &a.ctx),
        (&mut b.qp, &b.ctx),
        mlx5::Access::LOCAL_WRITE | mlx5::Access::REMOTE_WRITE,
        7,
    );
    assert_eq!(
        a.qp.sq_ref().outstanding(),
        0,
        "the reset discarded the old WRs"
    );
    let new: Vec<SendWr<'_>> = (100..104).map(|i| w(i, SendFlags::SIGNALED)).collect();
    a.qp.post_send(&new).unwrap();
    let mut wcs = [WorkCompletion::default(); 16];
    let n = a.cq.poll(&mut wcs);
    assert_eq!(n, 0, "completions before the device ran: {:?}", &wcs[..n]);
    assert_eq!(a.qp.sq_ref().outstanding(), 4);
    // The device runs: each of 100-103 completes exactly once.
    let got = common::poll_n(&rig, &mut a.cq, 4);
    let mut ids: Vec<u64> = got.iter().map(|wc| wc.wr_id).collect();
    ids.sort_unstable();
    assert_eq!(ids, [100, 101, 102, 103], "{got:?}");
    assert!(got.iter().all(|wc| wc.is_ok()), "{got:?}");
    for _ in 0..20 {
        rig.progress();
    }
    assert_eq!(a.cq.poll(&mut wcs), 0, "nothing twice");
    assert_eq!(a.qp.sq_ref().outstanding(), 0);
}

#[test]
fn retire_refuses_counters_of_no_outstanding_wqe() {
    let rig = common::EmuRig::stepped();
    let (mut a, b) = common::pair(&rig, PairOpts::new(QpType::Rc));
    // A fresh queue: nothing is outstanding, whatever the counter.
    for c in [0, 1, 0xffff] {
        assert_eq!(
            a.qp.sq().retire(c),
            Err(PostError::NotOutstanding { wqe_counter: c })
        );
    }
    let s = [a.mr.sge(0, 8)];
    let (raddr, rkey) = (b.mr.addr(), b.mr.rkey());
    let w = |id| SendWr {
        op: WrOp::Write { raddr, rkey },
        ..SendWr::send(id, &s, SendFlags::SIGNALED)
    };
    let cap = a.qp.sq_ref().geometry().max_post;
    let wrs: Vec<SendWr<'_>> = (0..u64::from(cap)).map(w).collect();
    a.qp.post_send(&wrs).unwrap();
    let p = a.qp.sq_ref().producer();
    // Lies: the producer (no WQE yet), a counter far ahead, one behind the tail: all refused,
    // and the queue stays full (no room for a WQE the device still owns).
    for c in [p as u16, (p + 7) as u16, 0u16.wrapping_sub(1)] {
        assert_eq!(
            a.qp.sq().retire(c),
            Err(PostError::NotOutstanding { wqe_counter: c }),
            "counter {c}"
        );
    }
    assert_eq!(a.qp.sq_ref().outstanding(), cap);
    assert!(matches!(
        a.qp.post_send(&[w(99)]),
        Err((0, PostError::Full { .. }))
    ));
    // The truth retires, once: WR 0 at counter 0, then the same counter again is refused.
    common::with_raw(&mut a.cq, &a.ctx, |raw| {
        let c = loop {
            if let Some(c) = raw.next() {
                break c;
            }
            rig.progress();
        };
        assert_eq!(c.kind(), CqeKind::Send);
        assert_eq!(a.qp.sq().retire(c.wqe_counter()), Ok(0));
        assert_eq!(
            a.qp.sq().retire(c.wqe_counter()),
            Err(PostError::NotOutstanding {
                wqe_counter: c.wqe_counter()
            })
        );
        raw.publish_ci();
    });
    assert_eq!(a.qp.sq_ref().outstanding(), cap - 1);
}

#[test]
fn receive_retire_refuses_counters_out_of_order() {
    let rig = common::EmuRig::stepped();
    let (_a, mut b) = common::pair(&rig, PairOpts::new(QpType::Rc));
    let rq = b.qp.rq().unwrap();
    assert_eq!(
        rq.retire(0),
        Err(PostError::NotOutstanding { wqe_counter: 0 })
    );
    let r = [b.mr.sge(0, 64)];
    b.qp.post_recv(&[
        RecvWr {
            wr_id: 7,
            sg_list: &r,
        },
        RecvWr {
            wr_id: 8,
            sg_list: &r,
        },
    ])
    .unwrap();
    let rq = b.qp.rq().unwrap();
    // Receives complete in order: only the oldest (counter 0) may be retired first.
    assert_eq!(
        rq.retire(1),
        Err(PostError::NotOutstanding { wqe_counter: 1 })
    );
    assert_eq!(rq.retire(0), Ok(7));
    assert_eq!(
        rq.retire(0),
        Err(PostError::NotOutstanding { wqe_counter: 0 })
    );
    assert_eq!(rq.retire(1), Ok(8));
    assert_eq!(
        rq.retire(2),
        Err(PostError::NotOutstanding { wqe_counter: 2 })
    );
    assert_eq!(rq.outstanding(), 0);
}

/// Every one of the 65,536 counters against a full queue of mixed WQE sizes (1 to 3 WQEBBs):
/// only those naming the first WQEBB of an outstanding WR are accepted (old code: any, so a
/// caller could post past the ring's room), and refused ones change nothing.
#[test]
fn every_lying_counter_is_refused_on_a_full_queue() {
    let rig = common::EmuRig::stepped();
    let o = PairOpts::new(QpType::Rc).caps(16, 16, 4, 4, 128);
    let (mut a, b) = common::pair(&rig, o);
    let (raddr, rkey) = (b.mr.addr(), b.mr.rkey());
    let sges: Vec<_> = (0..4).map(|i| a.mr.sge(i * 16, 8)).collect();
    let mut starts = Vec::new();
    let mut i = 0u64;
    loop {
        let n = 1 + (i % 4) as usize;
        let wr = SendWr {
            op: WrOp::Write { raddr, rkey },
            ..SendWr::send(i, &sges[..n], SendFlags::SIGNALED)
        };
        let p = a.qp.sq_ref().producer();
        match a.qp.post_send(&[wr]) {
            Ok(()) => starts.push((p, i)),
            Err((0, PostError::Full { .. })) => break,
            Err(e) => panic!("{e:?}"),
        }
        i += 1;
    }
    let cap = a.qp.sq_ref().geometry().max_post;
    let mask = a.qp.sq_ref().geometry().wqe_cnt - 1;
    assert_eq!(starts.len() as u32, cap);
    for c in 0..=u16::MAX {
        let start = starts.iter().any(|&(p, _)| p & mask == u32::from(c) & mask);
        if !start {
            assert_eq!(
                a.qp.sq().retire(c),
                Err(PostError::NotOutstanding { wqe_counter: c }),
                "counter {c}"
            );
        }
    }
    assert_eq!(a.qp.sq_ref().outstanding(), cap, "nothing retired by a lie");
    // The newest WR's counter names an outstanding start (what the check can see: whether
    // the device executed it is known only from its CQE): it retires every WR, in order, and
    // afterwards none of the old counters is accepted.
    let &(last, id) = starts.last().unwrap();
    assert_eq!(a.qp.sq().retire(last as u16), Ok(id));
    assert_eq!(a.qp.sq_ref().outstanding(), 0);
    for &(p, _) in &starts {
        assert!(a.qp.sq().retire(p as u16).is_err());
    }
}

/// Found by the extended property test (issue 24): the device executed a WRITE and its CQE sat
/// in the CQ ring, unpolled, when both QPs were reset and reconnected; the new WR posted at the
/// same WQEBB (counter 0) was then completed by that old CQE before the device ran it, through
/// `Cq::poll` and through `RawCq::next` + `retire` alike. A reset (and a destroy) now makes
/// every CQE of the QP's old life in the ring complete nothing.
#[test]
fn cqes_left_in_the_ring_at_a_reset_complete_nothing_new() {
    for raw in [false, true] {
        let rig = common::EmuRig::stepped();
        let (mut a, mut b) = common::pair(&rig, PairOpts::new(QpType::Rc));
        let s = [a.mr.sge(0, 8)];
        let (raddr, rkey) = (b.mr.addr(), b.mr.rkey());
        let w = |id| SendWr {
            op: WrOp::Write { raddr, rkey },
            ..SendWr::send(id, &s, SendFlags::SIGNALED)
        };
        a.qp.post_send(&[w(1), w(2)]).unwrap();
        // The device executes both; their CQEs wait in the ring.
        for _ in 0..50 {
            rig.progress();
        }
        assert_eq!(a.cq.consumer_index(), 0);
        reset(&mut a.qp);
        reset(&mut b.qp);
        common::connect(
            (&mut a.qp, &a.ctx),
            (&mut b.qp, &b.ctx),
            mlx5::Access::LOCAL_WRITE | mlx5::Access::REMOTE_WRITE,
            7,
        );
        // New WRs at counters 0 and 1, the device not run.
        a.qp.post_send(&[w(100), w(101)]).unwrap();
        let early: Vec<u64> = if raw {
            let mut ids = Vec::new();
            common::with_raw(&mut a.cq, &a.ctx, |r| {
                for c in r.by_ref() {
                    if let Ok(id) = a.qp.sq().retire(c.wqe_counter()) {
                        ids.push(id);
                    }
                }
                r.publish_ci();
            });
            ids
        } else {
            let mut wcs = [WorkCompletion::default(); 8];
            let n = a.cq.poll(&mut wcs);
            wcs[..n].iter().map(|wc| wc.wr_id).collect()
        };
        assert_eq!(
            early, [0u64; 0],
            "raw {raw}: completed before the device ran"
        );
        assert_eq!(a.qp.sq_ref().outstanding(), 2, "raw {raw}");
        let got = common::poll_n(&rig, &mut a.cq, 2);
        let ids: Vec<u64> = got.iter().map(|wc| wc.wr_id).collect();
        assert_eq!(ids, [100, 101], "raw {raw}: {got:?}");
        assert!(got.iter().all(|wc| wc.is_ok()), "{got:?}");
    }
}

/// The same with a destroy: the QP's CQEs wait in the ring when it is destroyed, and a new QP
/// on the same CQ (which may get the old QP number or user index) must not inherit them.
#[test]
fn cqes_of_a_destroyed_qp_complete_nothing_of_its_successor() {
    let rig = common::EmuRig::stepped();
    let (mut a, b) = common::pair(&rig, PairOpts::new(QpType::Rc));
    let s = [a.mr.sge(0, 8)];
    let (raddr, rkey) = (b.mr.addr(), b.mr.rkey());
    let w = |id| SendWr {
        op: WrOp::Write { raddr, rkey },
        ..SendWr::send(id, &s, SendFlags::SIGNALED)
    };
    a.qp.post_send(&[w(1), w(2)]).unwrap();
    for _ in 0..50 {
        rig.progress();
    }
    let old = (a.qp.qpn(), a.qp.user_handle());
    let init = mlx5::QpInitAttr::new(QpType::Rc, &a.cq, &a.cq);
    let fresh = mlx5::Qp::new(&a.pd, &init).unwrap();
    drop(std::mem::replace(&mut a.qp, fresh));
    let mut b = b;
    reset(&mut b.qp);
    common::connect(
        (&mut a.qp, &a.ctx),
        (&mut b.qp, &b.ctx),
        mlx5::Access::LOCAL_WRITE | mlx5::Access::REMOTE_WRITE,
        7,
    );
    a.qp.post_send(&[w(100), w(101)]).unwrap();
    let mut wcs = [WorkCompletion::default(); 8];
    let n = a.cq.poll(&mut wcs);
    assert_eq!(
        n,
        0,
        "QP {:?} -> {}: completions before the device ran: {:?}",
        old,
        a.qp.qpn(),
        &wcs[..n]
    );
    let got = common::poll_n(&rig, &mut a.cq, 2);
    let ids: Vec<u64> = got.iter().map(|wc| wc.wr_id).collect();
    assert_eq!(ids, [100, 101], "{got:?}");
}
