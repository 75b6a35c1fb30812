//! The unchecked tier (issue 24) on the stepped emulator: the WQEs it builds are the safe API's
//! byte for byte (but for the QP number), and its single-QP pollers retire exactly the WRs the
//! device completed, in order, with the data in place. Each `unsafe` call states how the test
//! meets its contract.

mod common;

use common::{PairOpts, Rig};
use mlx5::{QpType, SendFlags, WrOp};

/// The WQE bytes from counter `c` on (`n` bytes) with the QP number (control segment bytes
/// 4..7) of each WQE blanked.
fn wqe(sq: &mlx5::SendQueue, c: u32, n: usize) -> Vec<u8> {
    let mut b = vec![0u8; n];
    sq.wqe_bytes(c, &mut b);
    let mut at = 0;
    while at < n {
        let ds = usize::from(b[at + 7] & 0x3F);
        b[at + 4..at + 7].fill(0);
        at += ds.div_ceil(4).max(1) * 64;
    }
    b
}

#[test]
fn unchecked_wqes_are_the_safe_apis_bytes() {
    let rig = common::EmuRig::stepped();
    let o = PairOpts::new(QpType::Rc);
    let (mut a, b) = common::pair(&rig, o);
    let (mut c, _d) = common::pair(&rig, o);
    let (raddr, rkey) = (b.mr.addr() + 64, b.mr.rkey());
    let sge = a.mr.sge(0, 48);
    let data: Vec<u8> = (0..100u8).collect();
    // Safe on A, unchecked on C: the same WRs at the same counters.
    for (i, len) in [1usize, 12, 32, 44, 45, 64, 100].into_iter().enumerate() {
        let id = i as u64;
        let s = &data[..len];
        let p = a.qp.sq_ref().producer();
        assert_eq!(p, c.qp.sq_ref().producer());
        a.qp.sq()
            .send_inline_now(SendFlags::SIGNALED, s, id)
            .unwrap();
        assert!(c.qp.sq().credits() > 0);
        // SAFETY: C is an RC QP in RTS with 64 WRs of room and nothing posted since `credits`
        // said so; `1 <= len <= 100 <= max_inline` (128 asked).
        unsafe { c.qp.sq().send_inline_unchecked(s, id, SendFlags::SIGNALED) };
        let n = (c.qp.sq_ref().producer() - p) as usize * 64;
        assert_eq!(
            wqe(a.qp.sq_ref(), p, n),
            wqe(c.qp.sq_ref(), p, n),
            "inline {len}"
        );
        let p = a.qp.sq_ref().producer();
        let w = mlx5::SendWr {
            op: WrOp::Write { raddr, rkey },
            inline: &[s],
            ..mlx5::SendWr::send(id, &[], SendFlags::SIGNALED | SendFlags::INLINE)
        };
        a.qp.post_send(&[w]).unwrap();
        // SAFETY: as above, one more WR against the 64 credits.
        unsafe {
            c.qp.sq()
                .write_inline_unchecked(s, raddr, rkey, id, SendFlags::SIGNALED)
        };
        let n = (c.qp.sq_ref().producer() - p) as usize * 64;
        assert_eq!(
            wqe(a.qp.sq_ref(), p, n),
            wqe(c.qp.sq_ref(), p, n),
            "write {len}"
        );
    }
    // A batch: inline, SGE and WRITE WQEs, against a chain on the safe side.
    let p = a.qp.sq_ref().producer();
    let mut sq = a.qp.sq();
    for (k, s) in [&data[..20], &data[..60]].into_iter().enumerate() {
        sq.send(SendFlags::NONE)
            .unwrap()
            .inline(s)
            .unwrap()
            .finish(100 + k as u64);
    }
    sq.send(SendFlags::NONE)
        .unwrap()
        .sge(&sge)
        .unwrap()
        .finish(102);
    sq.write(SendFlags::SIGNALED, raddr, rkey, None)
        .unwrap()
        .inline(&data[..8])
        .unwrap()
        .finish(103);
    sq.ring();
    sq = c.qp.sq();
    let credits = sq.credits();
    assert!(credits >= 4, "{credits}");
    sq.unchecked(|u| {
        // SAFETY: (each of the four) 4 WRs against `credits >= 4`; RC; lengths 20, 60 and 8
        // within max_inline; the SGE is 48 bytes.
        unsafe { u.send_inline(&data[..20], 100, SendFlags::NONE) };
        // SAFETY: as above.
        unsafe { u.send_inline(&data[..60], 101, SendFlags::NONE) };
        // SAFETY: as above.
        unsafe { u.send_sge(&sge, 102, SendFlags::NONE) };
        // SAFETY: as above.
        unsafe { u.write_inline(&data[..8], raddr, rkey, 103, SendFlags::SIGNALED) };
    });
    let n = (c.qp.sq_ref().producer() - p) as usize * 64;
    assert_eq!(wqe(a.qp.sq_ref(), p, n), wqe(c.qp.sq_ref(), p, n), "batch");
    assert_eq!(a.qp.sq_ref().outstanding(), c.qp.sq_ref().outstanding());
}

#[test]
fn unchecked_pollers_retire_what_the_device_completed() {
    let rig = common::EmuRig::stepped();
    // Receives land in memory (the unchecked pollers leave CQEs with scattered data to the
    // safe `next`).
    let o = PairOpts {
        scatter_to_cqe: false,
        ..PairOpts::new(QpType::Rc).caps(16, 16, 1, 1, 64)
    };
    let (mut a, mut b) = common::pair(&rig, o);
    let (raddr, rkey) = (b.mr.addr(), b.mr.rkey());
    let mut next_id = 0u64;
    let mut sent = std::collections::VecDeque::new();
    let mut recv_ids = std::collections::VecDeque::new();
    common::with_raw(&mut a.cq, &a.ctx, |acq| {
        common::with_raw(&mut b.cq, &b.ctx, |bcq| {
            // A safe `next` found both CQs empty: no CQE of an earlier life (contract).
            assert!(acq.next().is_none() && bcq.next().is_none());
            for round in 0..200u64 {
                // Receives: keep B's RQ full (room counted from `outstanding`).
                let rq = b.qp.rq().unwrap();
                while rq.outstanding() < 16 {
                    let slot = (recv_ids.len() as u64 + round) % 16;
                    let s = b.mr.sge(4096 + slot * 128, 128);
                    // SAFETY: B is in RTS; fewer than 16 outstanding counting this one; 128 B.
                    unsafe { rq.push_unchecked(1000 + next_id, &s) };
                    recv_ids.push_back(1000 + next_id);
                    next_id += 1;
                }
                rq.publish();
                // A: a batch of up to 4 (one credit check), alternating SEND and WRITE.
                let sq = a.qp.sq();
                let n = sq.credits().min(4).min(16 - sent.len() as u32);
                let payload = round.to_le_bytes();
                sq.unchecked(|u| {
                    for k in 0..n {
                        let id = next_id + u64::from(k);
                        if id % 2 == 0 {
                            // SAFETY: `k < n <= credits`; RC; 8 bytes <= max_inline 64.
                            unsafe { u.send_inline(&payload, id, SendFlags::SIGNALED) };
                        } else {
                            // SAFETY: as above.
                            unsafe {
                                u.write_inline(&payload, raddr, rkey, id, SendFlags::SIGNALED)
                            };
                        }
                    }
                });
                for k in 0..u64::from(n) {
                    sent.push_back(next_id + k);
                }
                next_id += u64::from(n);
                for _ in 0..3 {
                    rig.progress();
                }
                // SAFETY: A's CQ is the send CQ of A's QP only (and its receive CQ, which
                // gets no CQE: A posts no receive); at most 16 of its 1024 entries pend; no
                // reset since the empty safe `next`.
                while let Some(id) = unsafe { a.qp.sq().poll_unchecked(acq) } {
                    assert_eq!(sent.pop_front(), Some(id), "round {round}");
                }
                // SAFETY: B's CQ is B's QP's only (B sends nothing); as above.
                while let Some((id, len)) = unsafe { b.qp.rq().unwrap().poll_unchecked(bcq) } {
                    assert_eq!(recv_ids.pop_front(), Some(id), "round {round}");
                    assert_eq!(len, 8);
                }
                assert!(acq.next().is_none(), "a CQE the unchecked poller left");
                assert!(
                    bcq.next().is_none(),
                    "a receive CQE the unchecked poller left"
                );
            }
            // Drain, through the batch poller.
            for _ in 0..100 {
                rig.progress();
                // SAFETY: as above.
                unsafe {
                    a.qp.sq().poll_batch_unchecked(acq, 3, |id| {
                        assert_eq!(sent.pop_front(), Some(id));
                    })
                };
            }
            let left = acq.next().map(|c| (c.kind(), c.status(), c.syndrome()));
            assert!(left.is_none(), "{left:?}");
            acq.publish_ci();
            bcq.publish_ci();
        });
    });
    assert!(
        sent.is_empty(),
        "{sent:?} A {:?} B {:?} B rq out {} A {:?} B {:?}",
        a.qp.query_state(),
        b.qp.query_state(),
        b.qp.rq().unwrap().outstanding(),
        rig.counters(0),
        rig.counters(1)
    );
    assert_eq!(a.qp.sq_ref().outstanding(), 0);
    let mut w = [0u8; 8];
    b.buf.read(0, &mut w);
    assert!(
        u64::from_le_bytes(w) >= 190,
        "the last WRITEs landed: {w:?}"
    );
}
