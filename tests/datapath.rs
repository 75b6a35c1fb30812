//! Data-path details: WQEs and inline payloads that wrap at the SQ end (and the BlueFlame copy
//! of them), the low-level reserve/push/ring API, SRQs, 128-byte CQEs with hugepage buffers,
//! and QP reuse through RESET.

mod common;

use std::sync::Arc;

use common::{PairOpts, Rig, connect, pair, poll_n, side};
use mlx5::hw::opcodes::CqeOpcode;
use mlx5::{
    Access, Cq, CqInit, DmaBuf, HugePolicy, Qp, QpInitAttr, QpType, RecvWr, SendFlags, SendWr, Srq,
    WcOpcode, WcStatus, WrOp,
};

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect()
}

/// A small SQ (16 WQEBBs) with WQEs of 1 to 4 WQEBBs: WQEs, inline payloads split across parts
/// and data segments all cross the ring end many times; every payload arrives intact.
fn wqes_wrap_at_the_ring_end(rig: &dyn Rig) {
    let mut o = PairOpts::new(QpType::Rc);
    o = o.caps(4, 256, 8, 1, 200);
    let (mut a, mut b) = pair(rig, o);
    let geo = a.qp.sq_ref().geometry();
    assert_eq!((geo.wqe_size, geo.wqe_cnt), (256, 16), "{geo:?}");
    assert!(geo.max_inline >= 200);
    let before = rig.counters(0);
    for i in 0..300usize {
        let len = 1 + (i * 37) % 200;
        let data = pattern(len, i as u8);
        let rsge = [b.mr.sge(0, 4096)];
        b.qp.post_recv(&[RecvWr {
            wr_id: i as u64,
            sg_list: &rsge,
        }])
        .unwrap();
        if i % 3 == 2 {
            // Gathered from up to 8 SGEs.
            a.buf.write(8192, &data);
            let n = 1 + i % 8;
            let step = len.div_ceil(n);
            let sges: Vec<_> = (0..n)
                .map(|k| (k * step, ((k + 1) * step).min(len)))
                .filter(|(s, e)| s < e)
                .map(|(s, e)| a.mr.sge(8192 + s as u64, (e - s) as u32))
                .collect();
            a.qp.post_send(&[SendWr::send(i as u64, &sges, SendFlags::SIGNALED)])
                .unwrap();
        } else {
            let cut = len / 3;
            let parts: [&[u8]; 3] = [&data[..cut], &[], &data[cut..]];
            a.qp.post_send(&[SendWr::send_inline(i as u64, &parts, SendFlags::SIGNALED)])
                .unwrap();
        }
        let s = poll_n(rig, &mut a.cq, 1);
        assert_eq!(
            (s[0].wr_id, s[0].status),
            (i as u64, WcStatus::SUCCESS),
            "{:?}",
            s[0]
        );
        let r = poll_n(rig, &mut b.cq, 1);
        assert_eq!(
            (r[0].wr_id, r[0].status, r[0].byte_len),
            (i as u64, WcStatus::SUCCESS, len as u32)
        );
        let mut got = vec![0u8; len];
        b.buf.read(0, &mut got);
        assert_eq!(got, data, "message {i}");
    }
    assert!(
        a.qp.sq_ref().producer() > 16 * 20,
        "the ring wrapped many times"
    );
    if let (Some(c0), Some(c1)) = (before, rig.counters(0)) {
        assert!(
            c1.bf_writes - c0.bf_writes > 0,
            "single small posts use BlueFlame"
        );
        assert_eq!(
            c1.bf_mismatches, 0,
            "every BlueFlame copy (source wrapped) matches the ring"
        );
    }
}

/// The low-level API: build three WQEs segment by segment, ring once; read raw CQEs (whose
/// small payloads were scattered into them: the raw poller puts them in place).
fn low_level_reserve_push_ring(rig: &dyn Rig) {
    let (mut a, mut b) = pair(rig, PairOpts::new(QpType::Rc));
    let r1 = [b.mr.sge(0, 1024)];
    let r2 = [b.mr.sge(4096, 1024)];
    b.qp.post_recv(&[
        RecvWr {
            wr_id: 1,
            sg_list: &r1,
        },
        RecvWr {
            wr_id: 2,
            sg_list: &r2,
        },
    ])
    .unwrap();
    a.buf.write(0, b"gathered!");
    let stats0 = a.qp.sq_ref().stats();
    let raddr = b.mr.addr() + 2048;
    let rkey = b.mr.rkey();
    {
        let sq = a.qp.sq();
        sq.send(SendFlags::SIGNALED)
            .unwrap()
            .inline(b"hello ")
            .unwrap()
            .inline(b"world")
            .unwrap()
            .finish(100);
        sq.write(SendFlags::NONE, raddr, rkey, None)
            .unwrap()
            .sge(&a.mr.sge(0, 9))
            .unwrap()
            .finish(101);
        sq.send_imm(SendFlags::SIGNALED, [0xde, 0xad, 0xbe, 0xef])
            .unwrap()
            .sge(&a.mr.sge(0, 9))
            .unwrap()
            .finish(102);
        sq.ring();
        sq.ring(); // nothing pending: no second doorbell
    }
    let stats1 = a.qp.sq_ref().stats();
    assert_eq!(
        (
            stats1.wqes - stats0.wqes,
            stats1.doorbells - stats0.doorbells + stats1.bf_copies - stats0.bf_copies
        ),
        (3, 1)
    );
    // Raw CQEs on the receiver.
    let cqes: Vec<mlx5::RawCqe> = common::with_raw(&mut b.cq, &b.ctx, |raw| {
        let mut cqes = Vec::new();
        for _ in 0..100_000 {
            if let Some(c) = raw.next() {
                // Scatter-to-CQE is on by default: these small payloads came in the CQEs, and
                // the poller copied them into the receive buffers.
                assert!(c.scattered());
                cqes.push(c);
                if cqes.len() == 2 {
                    break;
                }
            } else {
                rig.progress();
            }
        }
        raw.publish_ci();
        cqes
    });
    assert_eq!(cqes.len(), 2);
    assert_eq!((cqes[0].cqe().format(), cqes[1].cqe().format()), (1, 1));
    // Typed retirement on the low level: the receive queue hands back the wr_ids.
    let rq = b.qp.rq().unwrap();
    assert_eq!(rq.retire(cqes[0].wqe_counter()).unwrap(), 1);
    assert_eq!(rq.retire(cqes[1].wqe_counter()).unwrap(), 2);
    assert_eq!(rq.outstanding(), 0);
    assert_eq!(
        (cqes[0].opcode(), cqes[0].byte_len()),
        (CqeOpcode::RESP_SEND, 11)
    );
    assert_eq!(
        (cqes[1].opcode(), cqes[1].byte_len()),
        (CqeOpcode::RESP_SEND_IMM, 9)
    );
    assert_eq!(cqes[1].imm_data(), [0xde, 0xad, 0xbe, 0xef]);
    assert_eq!(b.cq.consumer_index(), 2);
    let mut got = [0u8; 11];
    b.buf.read(0, &mut got);
    assert_eq!(&got, b"hello world" as &[u8]);
    let mut got = [0u8; 9];
    b.buf.read(2048, &mut got);
    assert_eq!(&got, b"gathered!");
    b.buf.read(4096, &mut got);
    assert_eq!(&got, b"gathered!");
    // Requester: two signaled CQEs; the unsignaled WRITE retired silently by the third.
    let s = poll_n(rig, &mut a.cq, 2);
    assert_eq!((s[0].wr_id, s[1].wr_id), (100, 102));
    assert_eq!(a.qp.sq_ref().outstanding(), 0);
}

/// An SRQ shared by two QPs; more receives than its capacity over time (WQEs are recycled).
fn srq_shared_by_two_qps(rig: &dyn Rig) {
    let o = PairOpts::new(QpType::Rc);
    let mut a1 = side(rig, 0, &o);
    let mut a2 = side(rig, 0, &o);
    let bctx = rig.open(1);
    let bpd = mlx5::Pd::new(&bctx).unwrap();
    let mut bcq = Cq::new(&bctx, CqInit::default(), None).unwrap();
    let mut srq = Srq::new(&bpd, 15, 1).unwrap();
    assert_eq!(srq.capacity(), 15);
    let bbuf = Arc::new(DmaBuf::new(16 * 4096).unwrap());
    let bmr = bpd.reg_mr(&bbuf, Access::ALL).unwrap();
    let mk = || {
        let mut init = QpInitAttr::new(QpType::Rc, &bcq, &bcq);
        init.srq = Some(&srq);
        init.cap.max_recv_wr = 0;
        Qp::new(&bpd, &init).unwrap()
    };
    let mut b1 = mk();
    let mut b2 = mk();
    connect((&mut a1.qp, &a1.ctx), (&mut b1, &bctx), Access::ALL, 7);
    connect((&mut a2.qp, &a2.ctx), (&mut b2, &bctx), Access::ALL, 7);
    let mut next_id = 0u64;
    let mut post = |srq: &mut Srq, n: usize| {
        for _ in 0..n {
            let slot = next_id % 16;
            let sge = [bmr.sge(slot * 4096, 4096)];
            srq.post_recv(&[RecvWr {
                wr_id: 1000 + next_id,
                sg_list: &sge,
            }])
            .unwrap();
            next_id += 1;
        }
    };
    post(&mut srq, 15);
    let sge = [bmr.sge(0, 1)];
    assert!(matches!(
        srq.post_recv(&[RecvWr {
            wr_id: 0,
            sg_list: &sge
        }]),
        Err((0, mlx5::PostError::Full { .. }))
    ));
    let mut seen = std::collections::BTreeSet::new();
    for round in 0..6 {
        for k in 0..10u64 {
            let (side, id) = if k % 2 == 0 {
                (&mut a1, round * 10 + k)
            } else {
                (&mut a2, round * 10 + k)
            };
            side.buf.write(0, &id.to_le_bytes());
            let s = [side.mr.sge(0, 8)];
            side.qp
                .post_send(&[SendWr::send(id, &s, SendFlags::SIGNALED)])
                .unwrap();
        }
        poll_n(rig, &mut a1.cq, 5);
        poll_n(rig, &mut a2.cq, 5);
        let r = poll_n(rig, &mut bcq, 10);
        for wc in &r {
            assert_eq!(wc.status, WcStatus::SUCCESS, "{wc:?}");
            assert!(wc.qp_num == b1.qpn() || wc.qp_num == b2.qpn());
            assert!(seen.insert(wc.wr_id), "wr_id {} reported twice", wc.wr_id);
        }
        post(&mut srq, 10);
    }
    assert_eq!(seen.len(), 60);
    assert_eq!(*seen.iter().next().unwrap(), 1000);
}

/// 128-byte CQEs, and buffers on huge pages (or the documented fallback) registered as MRs.
fn cqe128_and_hugepage_buffers(rig: &dyn Rig) {
    let o = PairOpts::new(QpType::Rc);
    let mut a = side(rig, 0, &o);
    let bctx = rig.open(1);
    let bpd = mlx5::Pd::new(&bctx).unwrap();
    let mut bcq = Cq::new(
        &bctx,
        CqInit {
            cqe: 63,
            cqe_size: 128,
            comp_vector: 0,
        },
        None,
    )
    .unwrap();
    assert_eq!(bcq.capacity(), 64);
    let mut bqp = Qp::new(&bpd, &QpInitAttr::new(QpType::Rc, &bcq, &bcq)).unwrap();
    let huge = Arc::new(DmaBuf::with_policy(4 << 20, HugePolicy::Auto).unwrap());
    if let Some(n) = huge.note() {
        eprintln!("hugepage fallback: {n}");
    }
    let bmr = bpd.reg_mr(&huge, Access::ALL).unwrap();
    connect((&mut a.qp, &a.ctx), (&mut bqp, &bctx), Access::ALL, 7);
    // More completions than the CQ has entries, to cross the owner-bit flip twice.
    for i in 0..150u64 {
        let off = (i * 8192) % (4 << 20);
        let sge = [bmr.sge(off, 64)];
        bqp.post_recv(&[RecvWr {
            wr_id: i,
            sg_list: &sge,
        }])
        .unwrap();
        a.buf.write(0, &i.to_le_bytes());
        let s = [a.mr.sge(0, 8)];
        a.qp.post_send(&[SendWr::send(i, &s, SendFlags::NONE)])
            .unwrap();
        let r = poll_n(rig, &mut bcq, 1);
        assert_eq!(
            (r[0].wr_id, r[0].byte_len, r[0].opcode),
            (i, 8, WcOpcode::RECV)
        );
        assert_eq!(huge.read_u64(off as usize), i);
        if i % 32 == 31 {
            // Unsignaled sends still need a CQE now and then to retire them.
            let s = [a.mr.sge(0, 8)];
            let op = WrOp::Write {
                raddr: bmr.addr() + (4 << 20) - 8,
                rkey: bmr.rkey(),
            };
            a.qp.post_send(&[SendWr::new(9999, op, &s, SendFlags::SIGNALED)])
                .unwrap();
            assert_eq!(poll_n(rig, &mut a.cq, 1)[0].wr_id, 9999);
        }
    }
}

/// One SEND from `a` to `b`; both completions succeed.
fn send_once(rig: &dyn Rig, a: &mut common::Side, b: &mut common::Side, id: u64) {
    let s = [a.mr.sge(0, 8)];
    let rsge = [b.mr.sge(0, 64)];
    b.qp.post_recv(&[RecvWr {
        wr_id: id,
        sg_list: &rsge,
    }])
    .unwrap();
    a.qp.post_send(&[SendWr::send(id, &s, SendFlags::SIGNALED)])
        .unwrap();
    let sc = poll_n(rig, &mut a.cq, 1);
    assert_eq!(
        (sc[0].wr_id, sc[0].status),
        (id, WcStatus::SUCCESS),
        "{sc:?}"
    );
    let rc = poll_n(rig, &mut b.cq, 1);
    assert_eq!(
        (rc[0].wr_id, rc[0].status),
        (id, WcStatus::SUCCESS),
        "{rc:?}"
    );
}

/// ERR -> RESET -> INIT -> RTR -> RTS on both sides, and the pair works again.
fn qp_reuse_after_reset(rig: &dyn Rig) {
    let (mut a, mut b) = pair(rig, PairOpts::new(QpType::Rc));
    send_once(rig, &mut a, &mut b, 1);
    for q in [&mut a.qp, &mut b.qp] {
        q.to_error().unwrap();
        let reset = mlx5::QpAttr {
            qp_state: Some(mlx5::QpState::Reset),
            ..Default::default()
        };
        q.modify(&reset, 1).unwrap();
        assert_eq!(q.query().unwrap().0, mlx5::QpState::Reset);
        assert_eq!(q.sq_ref().producer(), 0);
    }
    connect((&mut a.qp, &a.ctx), (&mut b.qp, &b.ctx), Access::ALL, 7);
    send_once(rig, &mut a, &mut b, 2);
}

/// `to_rtr_with_sl` carries the service level into the RTR address vector (QUERY_QP reports
/// it back); an SL above 15 is refused before any command; plain `to_rtr` sends SL 0.
fn rtr_carries_the_service_level(rig: &dyn Rig) {
    let o = PairOpts::new(QpType::Rc);
    let mut a = side(rig, 0, &o);
    let mut b = side(rig, 1, &o);
    let (to_a, sgid_a) = common::address(&a.qp, &a.ctx, 0);
    let (to_b, sgid_b) = common::address(&b.qp, &b.ctx, 0);
    a.qp.to_init(1, Access::ALL).unwrap();
    let e = a.qp.to_rtr_with_sl(&to_b, 3, sgid_a, 16).unwrap_err();
    assert!(
        matches!(e, mlx5::Error::InvalidArgument { attr: "sl", .. }),
        "SL 16 is out of range: {e}"
    );
    assert_eq!(a.qp.query().unwrap().0, mlx5::QpState::Init);
    a.qp.to_rtr_with_sl(&to_b, 3, sgid_a, 5).unwrap();
    let (st, q) = a.qp.query().unwrap();
    assert_eq!((st, q.dest.sl), (mlx5::QpState::Rtr, 5));
    b.qp.to_init(1, Access::ALL).unwrap();
    b.qp.to_rtr(&to_a, 3, sgid_b).unwrap();
    assert_eq!(b.qp.query().unwrap().1.dest.sl, 0);
}

scenarios!(
    rtr_carries_the_service_level,
    wqes_wrap_at_the_ring_end,
    low_level_reserve_push_ring,
    srq_shared_by_two_qps,
    cqe128_and_hugepage_buffers,
    qp_reuse_after_reset
);
