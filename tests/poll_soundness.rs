//! Soundness of the completion side from safe code, each a finding of issue 11 that failed on
//! the old code: buffer sizes that overflow, SGEs past a region, raw polling that lost every
//! payload scattered into a CQE, raw and verbs polling of one CQ corrupting each other's
//! bookkeeping; plus the lock-free steady state (no lock per CQE, counted), QPs found by
//! index among many on one CQ, and a region deregistered under an outstanding receive.

mod common;

use std::sync::Arc;

use common::{PairOpts, Rig};
use mlx5::{
    Access, Cq, CqInit, CqeKind, DmaBuf, Qp, QpInitAttr, QpType, RawCq, RawCqe, RecvWr, SendFlags,
    SendWr, WcStatus, WorkCompletion, WrOp,
};

#[test]
fn dma_buf_of_usize_max_is_an_error() {
    for len in [usize::MAX, usize::MAX - 4095, usize::MAX / 2 + 2] {
        let r = DmaBuf::new(len);
        assert!(r.is_err(), "len {len}: {:?}", r.map(|b| b.len()));
    }
}

#[test]
fn mr_sge_past_the_end_panics() {
    let rig = common::EmuRig::stepped();
    let a = common::side(&rig, 0, &PairOpts::new(QpType::Rc));
    for (off, len) in [
        (u64::MAX, 2),
        (u64::MAX - 1, 2),
        (a.mr.len(), 1),
        (1, u32::MAX),
    ] {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| a.mr.sge(off, len)));
        assert!(r.is_err(), "sge({off}, {len}) gave {r:?}");
    }
    let last = a.mr.sge(a.mr.len() - 1, 1);
    assert_eq!(last.addr, a.mr.addr() + a.mr.len() - 1);
}

fn next_raw(rig: &dyn Rig, cq: &mut RawCq) -> RawCqe {
    for _ in 0..1_000_000 {
        if let Some(c) = cq.next() {
            return c;
        }
        rig.progress();
    }
    panic!("no CQE");
}

/// A ping of `len` bytes, polled raw on the receiver, `n` times: every payload must be in the
/// receive buffer when the completion is returned (old code: 200 of 200 16-byte messages
/// wrong, the data only in the CQE).
fn raw_ping(cqe_size: u32, len: usize, n: u32) {
    let rig = common::EmuRig::stepped();
    let o = PairOpts {
        cqe_size,
        ..PairOpts::new(QpType::Rc)
    };
    let (mut a, mut b) = common::pair(&rig, o);
    let mut wrong = 0;
    let mut scattered = 0;
    common::with_raw(&mut b.cq, &b.ctx, |raw| {
        for i in 0..n {
            let msg: Vec<u8> = (0..len)
                .map(|k| (i as u8).wrapping_add(k as u8) | 1)
                .collect();
            b.buf.fill(0, len + 1, 0);
            let r = [b.mr.sge(0, len as u32 + 1)];
            b.qp.post_recv(&[RecvWr {
                wr_id: u64::from(i),
                sg_list: &r,
            }])
            .unwrap();
            a.buf.write(0, &msg);
            let s = [a.mr.sge(0, len as u32)];
            a.qp.post_send(&[SendWr::send(1, &s, SendFlags::SIGNALED)])
                .unwrap();
            let c = next_raw(&rig, raw);
            assert_eq!((c.kind(), c.status()), (CqeKind::Recv, WcStatus::SUCCESS));
            scattered += u32::from(c.scattered());
            assert_eq!(
                b.qp.rq().unwrap().retire(c.wqe_counter()).unwrap(),
                u64::from(i)
            );
            raw.publish_ci();
            let mut got = vec![0u8; len + 1];
            b.buf.read(0, &mut got);
            if got[..len] != msg[..] || got[len] != 0 {
                wrong += 1;
            }
            common::poll_n(&rig, &mut a.cq, 1);
        }
    });
    assert_eq!(
        scattered, n,
        "the emulator scatters {len} B into {cqe_size}-B CQEs"
    );
    assert_eq!(wrong, 0, "{wrong} of {n} messages wrong");
}

#[test]
fn raw_polling_loses_no_scattered_payload() {
    raw_ping(64, 16, 500);
    raw_ping(64, 32, 100);
    raw_ping(128, 64, 100);
}

/// Raw polling and verbs polling are different types over a CQ, converted by value; the
/// conversion is refused while `report_unsignaled` reports are pending, so the send queue's
/// bookkeeping stays consistent (old code: one `next_cqe` between two `poll`s left the SQ
/// with 1 WR outstanding after everything completed).
#[test]
fn raw_and_verbs_polling_of_one_cq_stay_consistent() {
    let rig = common::EmuRig::stepped();
    let o = PairOpts {
        report_unsignaled: true,
        ..PairOpts::new(QpType::Rc)
    };
    let (mut a, b) = common::pair(&rig, o);
    let s = [a.mr.sge(0, 8)];
    let (raddr, rkey) = (b.mr.addr(), b.mr.rkey());
    let w = |id, f| SendWr {
        op: WrOp::Write { raddr, rkey },
        ..SendWr::send(id, &s, f)
    };
    a.qp.post_send(&[
        w(1, SendFlags::NONE),
        w(2, SendFlags::NONE),
        w(3, SendFlags::SIGNALED),
    ])
    .unwrap();
    let mut wc = [WorkCompletion::default(); 1];
    while a.cq.poll(&mut wc) == 0 {
        rig.progress();
    }
    assert_eq!(wc[0].wr_id, 1);
    // Two reports still pending: the raw poller is refused, the CQ handed back.
    let cq = a.cq.into_raw().expect_err("reports pending");
    a.cq = cq;
    let mut rest = [WorkCompletion::default(); 8];
    assert_eq!(a.cq.poll(&mut rest), 2);
    assert_eq!((rest[0].wr_id, rest[1].wr_id), (2, 3));
    a.qp.post_send(&[w(4, SendFlags::SIGNALED)]).unwrap();
    common::with_raw(&mut a.cq, &a.ctx, |raw| {
        let c = next_raw(&rig, raw);
        assert_eq!(c.kind(), CqeKind::Send);
        assert_eq!(a.qp.sq().retire(c.wqe_counter()).unwrap(), 4);
        raw.publish_ci();
    });
    assert_eq!(a.cq.poll(&mut rest), 0);
    assert_eq!(a.qp.sq_ref().outstanding(), 0);
}

/// Steady state takes no lock: 1,000 small receives (scattered into CQEs, copied through the
/// memory-region cache) polled with `Cq::poll` and with `RawCq::next` leave the lock counter
/// where the first completion left it (one QP-list copy, one region lookup).
#[test]
fn polling_takes_no_lock_in_steady_state() {
    let rig = common::EmuRig::stepped();
    let (mut a, mut b) = common::pair(&rig, PairOpts::new(QpType::Rc));
    let r = [b.mr.sge(0, 64)];
    let s = [a.mr.sge(0, 16)];
    let mut round = |b: &mut common::Side, raw: Option<&mut RawCq>| {
        b.qp.post_recv(&[RecvWr {
            wr_id: 7,
            sg_list: &r,
        }])
        .unwrap();
        a.qp.post_send(&[SendWr::send(1, &s, SendFlags::SIGNALED)])
            .unwrap();
        match raw {
            Some(raw) => {
                let c = next_raw(&rig, raw);
                assert!(c.scattered());
                b.qp.rq().unwrap().retire(c.wqe_counter()).unwrap();
                raw.publish_ci();
            }
            None => {
                let w = common::poll_n(&rig, &mut b.cq, 1);
                assert_eq!(w[0].status, WcStatus::SUCCESS);
            }
        }
        common::poll_n(&rig, &mut a.cq, 1);
    };
    round(&mut b, None);
    let first = b.cq.locks_taken();
    assert!(first >= 1, "the first poll copies the QP list");
    for _ in 0..1000 {
        round(&mut b, None);
    }
    assert_eq!(b.cq.locks_taken(), first, "Cq::poll took a lock");
    let stand_in = Cq::new(&b.ctx, CqInit::default(), None).unwrap();
    let mut raw = std::mem::replace(&mut b.cq, stand_in).into_raw().unwrap();
    for _ in 0..1000 {
        round(&mut b, Some(&mut raw));
    }
    assert_eq!(raw.locks_taken(), first, "RawCq::next took a lock");
    assert!(
        a.cq.locks_taken() <= 1,
        "send completions: one QP-list copy"
    );
}

/// Twelve QPs on one receive CQ: every completion is attributed to its own QP (found by index,
/// not by the last one that hit), in any order of arrival.
#[test]
fn many_qps_on_one_cq_are_found_by_index() {
    let rig = common::EmuRig::stepped();
    let o = PairOpts::new(QpType::Rc);
    let a = common::side(&rig, 0, &o);
    let b = common::side(&rig, 1, &o);
    let mut acq = Cq::new(&a.ctx, CqInit::default(), None).unwrap();
    let mut bcq = Cq::new(&b.ctx, CqInit::default(), None).unwrap();
    let mut pairs: Vec<(Qp, Qp)> = (0..12)
        .map(|_| {
            let mut qa = Qp::new(&a.pd, &QpInitAttr::new(QpType::Rc, &acq, &acq)).unwrap();
            let mut qb = Qp::new(&b.pd, &QpInitAttr::new(QpType::Rc, &bcq, &bcq)).unwrap();
            common::connect((&mut qa, &a.ctx), (&mut qb, &b.ctx), Access::ALL, 7);
            (qa, qb)
        })
        .collect();
    let s = [a.mr.sge(0, 8)];
    for round in 0..3u64 {
        for (i, (qa, qb)) in pairs.iter_mut().enumerate() {
            let r = [b.mr.sge(64 * i as u64, 64)];
            let id = round * 1000 + i as u64;
            qb.post_recv(&[RecvWr {
                wr_id: id,
                sg_list: &r,
            }])
            .unwrap();
            qa.post_send(&[SendWr::send(id, &s, SendFlags::SIGNALED)])
                .unwrap();
        }
        // Interleave the order the QPs are polled in.
        let got = common::poll_n(&rig, &mut bcq, pairs.len());
        let mut seen: Vec<_> = got.iter().map(|w| (w.qp_num, w.wr_id)).collect();
        seen.sort_unstable();
        let mut want: Vec<_> = pairs
            .iter()
            .enumerate()
            .map(|(i, (_, qb))| (qb.qpn(), round * 1000 + i as u64))
            .collect();
        want.sort_unstable();
        assert_eq!(seen, want);
        assert_eq!(
            common::poll_n(&rig, &mut acq, pairs.len()).len(),
            pairs.len()
        );
    }
}

/// A region deregistered (and its buffer freed) while a receive into it is outstanding: the
/// payload that comes in the CQE is not copied into freed memory; the receive completes with
/// a local protection error, on both pollers.
#[test]
fn a_region_gone_under_an_outstanding_receive_is_a_protection_error() {
    for raw in [false, true] {
        let rig = common::EmuRig::stepped();
        let (mut a, mut b) = common::pair(&rig, PairOpts::new(QpType::Rc));
        let s = [a.mr.sge(0, 16)];
        let buf = Arc::new(DmaBuf::new(4096).unwrap());
        let mr = b.pd.reg_mr(&buf, Access::LOCAL_WRITE).unwrap();
        let r = [mr.sge(0, 64)];
        b.qp.post_recv(&[RecvWr {
            wr_id: 9,
            sg_list: &r,
        }])
        .unwrap();
        drop(mr);
        drop(buf);
        a.qp.post_send(&[SendWr::send(1, &s, SendFlags::SIGNALED)])
            .unwrap();
        let st = if raw {
            common::with_raw(&mut b.cq, &b.ctx, |cq| {
                let c = next_raw(&rig, cq);
                b.qp.rq().unwrap().retire(c.wqe_counter()).unwrap();
                cq.publish_ci();
                c.status()
            })
        } else {
            common::poll_n(&rig, &mut b.cq, 1)[0].status
        };
        // The device may refuse the lkey itself; if it scattered the payload into the CQE,
        // the poller refuses to copy it into memory that is gone.
        assert_eq!(st, WcStatus::LOC_PROT_ERR, "raw {raw}");
    }
}

/// Waiting on a channel the CQ was not created with can never see its event: a named error,
/// not a 20-second timeout.
#[test]
fn waiting_on_a_foreign_channel_is_an_error() {
    let rig = common::EmuRig::stepped();
    let ctx = rig.open(0);
    let own = Arc::new(ctx.create_comp_channel().unwrap());
    let other = ctx.create_comp_channel().unwrap();
    let mut cq = Cq::new(&ctx, CqInit::default(), Some(&own)).unwrap();
    let e = cq.wait(&other, 20_000).unwrap_err();
    assert!(e.to_string().contains("channel"), "{e}");
    assert!(!cq.wait(&own, 0).unwrap(), "no event yet");
    let mut bare = Cq::new(&ctx, CqInit::default(), None).unwrap();
    assert!(bare.wait(&own, 20_000).is_err());
}
