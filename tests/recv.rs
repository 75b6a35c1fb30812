//! The receive queue: the low-level push/publish API, validation of receive WRs (state, SGE
//! count, room), and posting again after completions free room (the poster counts room once
//! and re-reads the poller's tail only when it is used up).

mod common;

use std::collections::VecDeque;

use common::{PairOpts, Rig, drain, pair, poll_n};
use mlx5::{PostError, QpState, QpType, RecvWr, SendFlags, SendWr, WcOpcode, WcStatus};

/// Send `n` 8-byte messages from `a` to `b` (unsignaled but the last).
fn send_n(a: &mut common::Side, n: usize, first_id: u64) {
    let s = [a.mr.sge(0, 8)];
    for i in 0..n {
        let f = if i + 1 == n {
            SendFlags::SIGNALED
        } else {
            SendFlags::NONE
        };
        a.qp.post_send(&[SendWr::send(first_id + i as u64, &s, f)])
            .unwrap();
    }
}

/// Receives pushed without `publish` are invisible to the device; `publish` makes all of them
/// visible at once, and they complete in order with their wr_ids and data.
fn push_then_publish(rig: &dyn Rig) {
    let (mut a, mut b) = pair(rig, PairOpts::new(QpType::Rc));
    let r1 = [b.mr.sge(0, 64)];
    let r2 = [b.mr.sge(4096, 32), b.mr.sge(8192, 32)];
    {
        let rq = b.qp.rq().unwrap();
        rq.push(11, &r1).unwrap();
        rq.push(12, &r2).unwrap();
        assert_eq!(rq.outstanding(), 2);
    }
    let msg: Vec<u8> = (0..48u8).collect();
    a.buf.write(0, &msg);
    let s = [a.mr.sge(0, 48)];
    a.qp.post_send(&[
        SendWr::send(1, &s, SendFlags::NONE),
        SendWr::send(2, &s, SendFlags::SIGNALED),
    ])
    .unwrap();
    // Not published: the sender gets RNR NAKs (infinite retry), nothing arrives.
    if rig.stepped() {
        assert!(drain(rig, &mut b.cq, 200).is_empty());
    }
    b.qp.rq().unwrap().publish();
    let r = poll_n(rig, &mut b.cq, 2);
    assert_eq!(
        r.iter()
            .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len))
            .collect::<Vec<_>>(),
        [
            (11, WcStatus::SUCCESS, WcOpcode::RECV, 48),
            (12, WcStatus::SUCCESS, WcOpcode::RECV, 48)
        ]
    );
    let mut got = [0u8; 48];
    b.buf.read(0, &mut got);
    assert_eq!(&got[..], &msg[..]);
    // The second receive scattered over two SGEs of 32 bytes.
    b.buf.read(4096, &mut got[..32]);
    b.buf.read(8192, &mut got[32..]);
    assert_eq!(&got[..], &msg[..]);
    assert_eq!(poll_n(rig, &mut a.cq, 1)[0].wr_id, 2);
    assert_eq!(b.qp.rq().unwrap().outstanding(), 0);
}

/// Bad receive WRs are refused with the reason, before anything is written: before INIT, more
/// SGEs than `max_recv_sge`, a full queue; a chain stops at its first bad WR with the WRs
/// before it posted. After completions, exactly the freed room can be posted again.
fn bad_receives_are_refused(rig: &dyn Rig) {
    let o = PairOpts::new(QpType::Rc);
    // Before INIT: refused by both APIs.
    let mut lone = common::side(rig, 1, &o);
    let sge = [lone.mr.sge(0, 16)];
    let e = lone
        .qp
        .post_recv(&[RecvWr {
            wr_id: 1,
            sg_list: &sge,
        }])
        .unwrap_err();
    assert_eq!(
        e,
        (
            0,
            PostError::BadState {
                state: QpState::Reset
            }
        )
    );
    assert!(
        e.1.to_string().contains("does not allow posting"),
        "{}",
        e.1
    );
    let rq = lone.qp.rq().unwrap();
    assert!(matches!(rq.push(1, &sge), Err(PostError::BadState { .. })));
    assert_eq!(rq.outstanding(), 0);
    drop(lone);

    let (mut a, mut b) = pair(rig, o);
    let max = b.qp.cap().max_recv_sge;
    let cap = b.qp.cap().max_recv_wr;
    assert_eq!((max, cap), (4, 64));
    let five: Vec<_> = (0..5).map(|k| b.mr.sge(k * 64, 64)).collect();
    let one = [b.mr.sge(0, 64)];
    let e = b.qp.rq().unwrap().push(7, &five).unwrap_err();
    assert_eq!(e, PostError::TooManySges { n: 5, max: 4 });
    assert_eq!(e.to_string(), "num_sge 5 exceeds max_sge 4");
    // A chain: two good WRs, a bad one, a good one: the first two are posted.
    let wr = |id, sg_list| RecvWr { wr_id: id, sg_list };
    let e =
        b.qp.post_recv(&[
            wr(1, &one[..]),
            wr(2, &one[..]),
            wr(3, &five[..]),
            wr(4, &one[..]),
        ])
        .unwrap_err();
    assert_eq!(e, (2, PostError::TooManySges { n: 5, max: 4 }));
    assert_eq!(b.qp.rq().unwrap().outstanding(), 2);
    // Fill the queue, half through each API; one more is refused by both.
    let ids: Vec<u64> = (3..=cap as u64).collect();
    let (lo, hi) = ids.split_at(ids.len() / 2);
    let wrs: Vec<_> = lo.iter().map(|&i| wr(i, &one[..])).collect();
    b.qp.post_recv(&wrs).unwrap();
    let rq = b.qp.rq().unwrap();
    for &i in hi {
        rq.push(i, &one).unwrap();
    }
    rq.publish();
    let full = PostError::Full {
        outstanding: cap,
        capacity: cap,
    };
    assert_eq!(rq.push(99, &one), Err(full));
    assert_eq!(b.qp.post_recv(&[wr(99, &one[..])]), Err((0, full)));
    assert!(full.to_string().contains("queue full"));
    // Five messages consume five receives; exactly five more fit.
    send_n(&mut a, 5, 500);
    let r = poll_n(rig, &mut b.cq, 5);
    assert_eq!(
        r.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5]
    );
    assert_eq!(poll_n(rig, &mut a.cq, 1)[0].wr_id, 504);
    let wrs: Vec<_> = (0..6).map(|i| wr(1000 + i, &one[..])).collect();
    let e = b.qp.post_recv(&wrs).unwrap_err();
    assert_eq!(
        e,
        (
            5,
            PostError::Full {
                outstanding: cap,
                capacity: cap
            }
        )
    );
    // The queue keeps working across many wraps: receives complete in the order they were
    // posted, whichever API posted them.
    let mut expect: VecDeque<u64> = (1..=cap as u64).chain(1000..1005).collect();
    expect.drain(..5);
    for round in 0..20u64 {
        send_n(&mut a, 16, 600 + round * 16);
        let r = poll_n(rig, &mut b.cq, 16);
        for w in &r {
            assert_eq!(w.status, WcStatus::SUCCESS);
            assert_eq!(Some(w.wr_id), expect.pop_front());
        }
        poll_n(rig, &mut a.cq, 1);
        let rq = b.qp.rq().unwrap();
        for k in 0..16 {
            let id = 2000 + round * 16 + k;
            rq.push(id, &one).unwrap();
            expect.push_back(id);
        }
        rq.publish();
        assert_eq!(rq.outstanding(), cap);
        assert_eq!(expect.len(), cap as usize);
    }
}

scenarios!(push_then_publish, bad_receives_are_refused);
