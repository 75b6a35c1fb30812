//! Completion order when a WR fails: every WR gets exactly one CQE, in WQE order, per
//! queue -- the WRs before the failed one (still awaiting their ACKs when it failed) first,
//! then its error, then flushes. libmlx5 retires the send queue up to each CQE's
//! wqe_counter, so a CQE out of order loses or repeats WRs.
//! Also: an atomic whose local SGE has an invalid lkey, and a CQ overrun.

mod common;

use common::*;
use mlx5_hw::opcodes::{SendOpcode, Syndrome};
use mlx5_hw::wqe::{AtomicSeg, DataSeg, FM_CE_SE_CQ_UPDATE, RaddrSeg};
use zerocopy::IntoBytes;

const SIG: u8 = FM_CE_SE_CQ_UPDATE;
const REQ: u8 = 0;
const REQ_ERR: u8 = 13;
/// `IBV_QPS_ERR`, `IBV_QPS_RTS`.
const QPS_ERR: u32 = 6;
const QPS_RTS: u32 = 3;
/// `IBV_EVENT_CQ_ERR`, `IBV_EVENT_QP_FATAL`.
const EV_CQ_ERR: u32 = 0;
const EV_QP_FATAL: u32 = 1;

fn async_event(fd: i32) -> Option<u32> {
    let mut rec = [0u8; 16];
    // SAFETY: non-blocking read of up to 16 bytes into a local buffer.
    let n = unsafe { libc::recv(fd, rec.as_mut_ptr().cast(), 16, libc::MSG_DONTWAIT) };
    (n == 16).then(|| u32::from_ne_bytes([rec[8], rec[9], rec[10], rec[11]]))
}

/// WRITE of 64 bytes from a's buffer (lkey `lkey`) to b's.
fn write_segs(p: &Pair, lkey: u32, i: usize) -> Vec<u8> {
    [
        RaddrSeg::new(p.mb.0.addr() + i as u64 * 64, p.mb.2).as_bytes(),
        DataSeg::new(64, lkey, p.ma.0.addr() + i as u64 * 64).as_bytes(),
    ]
    .concat()
}

/// Post 20 WRITEs in one doorbell, WR `bad` with an lkey that names no MR; `signaled(i)`
/// says which ask for a CQE. WRs before `bad` are on the wire, unacknowledged, when it
/// fails. Returns the CQEs.
fn twenty_writes(bad: usize, signaled: impl Fn(usize) -> bool) -> (Pair, Vec<Cqe>) {
    let mut p = pair(RC, Knobs::default());
    let mut last = 0;
    for i in 0..20 {
        let lkey = if i == bad { p.ma.1 ^ 0x5500 } else { p.ma.1 };
        let fm = if signaled(i) { SIG } else { 0 };
        last = p.qa.build_send(
            SendOpcode::RDMA_WRITE,
            0,
            fm,
            [0; 4],
            &write_segs(&p, lkey, i),
        );
    }
    p.qa.ring(&p.a, last, Ring::Doorbell);
    p.emu.run_until_idle();
    let c = drain(&mut p.cqa);
    (p, c)
}

#[test]
fn a_failed_wr_completes_after_the_earlier_ones_and_before_the_flushed_ones() {
    let (p, c) = twenty_writes(10, |_| true);
    let seen: Vec<(u16, u8, u8)> = c
        .iter()
        .map(|c| (c.wqe_counter, c.opcode, c.syndrome))
        .collect();
    let mut want = Vec::new();
    for i in 0..10u16 {
        want.push((i, REQ, 0));
    }
    want.push((10, REQ_ERR, Syndrome::LOCAL_PROT.0));
    for i in 11..20u16 {
        want.push((i, REQ_ERR, Syndrome::WR_FLUSH.0));
    }
    assert_eq!(seen, want, "one CQE per WR, in WQE order");
    // WRs 0..9 really executed; the failed one and the flushed ones did not.
    for i in 0..20 {
        let landed = p.mb.0.read(i * 64, 64) == p.ma.0.read(i * 64, 64);
        let zero = p.mb.0.read(i * 64, 64).iter().all(|&b| b == 0);
        if i < 10 {
            assert!(landed, "WR {i} was written");
        } else {
            assert!(zero, "WR {i} wrote nothing");
        }
    }
    assert_eq!(qp_state(&p.a, &p.qa), QPS_ERR);
    assert_eq!(
        async_event(p.a.async_fd),
        None,
        "the error CQE is the report"
    );
    let k = p.emu.counters(0);
    assert_eq!((k.req_cqe_error, k.req_cqe_flush_error), (1, 9));
}

#[test]
fn with_selective_signaling_the_wqe_counters_never_go_backwards() {
    // Every third WR signaled (0, 3, 6, 9 before the failure): the CQEs name increasing WQE
    // indexes, so a consumer that retires up to each wqe_counter never moves back.
    let (_, c) = twenty_writes(10, |i| i % 3 == 0);
    let idx: Vec<u16> = c.iter().map(|c| c.wqe_counter).collect();
    assert!(
        idx.windows(2).all(|w| w[0] < w[1]),
        "increasing wqe_counters: {idx:?}"
    );
    let ok: Vec<u16> = c
        .iter()
        .filter(|c| c.opcode == REQ)
        .map(|c| c.wqe_counter)
        .collect();
    assert_eq!(
        ok,
        [0, 3, 6, 9],
        "the signaled WRs before the failure succeed"
    );
    let err: Vec<(u16, u8)> = c
        .iter()
        .filter(|c| c.opcode == REQ_ERR)
        .map(|c| (c.wqe_counter, c.syndrome))
        .take(2)
        .collect();
    assert_eq!(
        err,
        [(10, Syndrome::LOCAL_PROT.0), (11, Syndrome::WR_FLUSH.0)],
        "then the failed WR (signaled or not, an error completes), then flushes"
    );
}

fn fetch_add(p: &Pair, lkey: u32) -> Vec<u8> {
    [
        RaddrSeg::new(p.mb.0.addr() + 4096, p.mb.2).as_bytes(),
        AtomicSeg::new(1, 0).as_bytes(),
        DataSeg::new(8, lkey, p.ma.0.addr() + 4096).as_bytes(),
    ]
    .concat()
}

#[test]
fn an_atomic_with_an_invalid_local_lkey_completes_in_error_and_flushes_the_rest() {
    for behind_writes in [false, true] {
        let mut p = pair(RC, Knobs::default());
        let mut n = 0;
        if behind_writes {
            for i in 0..3 {
                p.qa.build_send(
                    SendOpcode::RDMA_WRITE,
                    0,
                    SIG,
                    [0; 4],
                    &write_segs(&p, p.ma.1, i),
                );
                n += 1;
            }
        }
        let bad = p.qa.build_send(
            SendOpcode::ATOMIC_FA,
            0,
            SIG,
            [0; 4],
            &fetch_add(&p, 0xdead_be00),
        );
        let next = p.qa.build_send(
            SendOpcode::ATOMIC_FA,
            0,
            SIG,
            [0; 4],
            &fetch_add(&p, p.ma.1),
        );
        p.qa.ring(&p.a, next, Ring::Doorbell);
        p.emu.run_until_idle();
        let c = drain(&mut p.cqa);
        let seen: Vec<(u16, u8, u8)> = c
            .iter()
            .map(|c| (c.wqe_counter, c.opcode, c.syndrome))
            .collect();
        let mut want: Vec<(u16, u8, u8)> = (0..n).map(|i| (i, REQ, 0)).collect();
        want.push((bad, REQ_ERR, Syndrome::LOCAL_PROT.0));
        want.push((next, REQ_ERR, Syndrome::WR_FLUSH.0));
        assert_eq!(seen, want, "behind writes: {behind_writes}");
        assert_eq!(
            p.mb.0.read(4096, 8),
            0u64.to_ne_bytes(),
            "no atomic executed"
        );
        assert_eq!(qp_state(&p.a, &p.qa), QPS_ERR);
    }
}

#[test]
fn a_cq_overrun_moves_the_qps_completing_into_it_to_the_error_state() {
    let emu = stepped(1);
    let mut a = Ctx::open(&emu, 0);
    let pd = a.alloc_pd();
    let mut cq = a.create_cq(2, 64, -1);
    let mut q1 = a.create_qp(pd, &cq, &cq, RC, 16, 8, None);
    let q2 = a.create_qp(pd, &cq, &cq, RC, 16, 8, None);
    bring_up(&a, &q1, 1, q2.qpn, Knobs::default());
    bring_up(&a, &q2, 1, q1.qpn, Knobs::default());
    for _ in 0..3 {
        let i = q1.build_send(SendOpcode::NOP, 0, SIG, [0; 4], &[]);
        q1.ring(&a, i, Ring::Doorbell);
        emu.run_until_idle();
    }
    assert_eq!(async_event(a.async_fd), Some(EV_CQ_ERR));
    // Both QPs complete into the CQ: both are in error, each with its fatal event.
    assert_eq!(qp_state(&a, &q1), QPS_ERR, "the QP whose CQE overran");
    assert_eq!(qp_state(&a, &q2), QPS_ERR, "the other QP on the CQ");
    let evs: Vec<Option<u32>> = (0..3).map(|_| async_event(a.async_fd)).collect();
    assert_eq!(evs, [Some(EV_QP_FATAL), Some(EV_QP_FATAL), None]);
    // Consuming the CQ does not bring it back: no SUCCESS after the overrun.
    let before = drain(&mut cq).len();
    let i = q1.build_send(SendOpcode::NOP, 0, SIG, [0; 4], &[]);
    q1.ring(&a, i, Ring::Doorbell);
    emu.run_until_idle();
    let after = drain(&mut cq);
    assert_eq!(before, 2);
    assert!(after.iter().all(|c| c.opcode != REQ), "{after:?}");
    // A QP on another CQ is not affected.
    let cq2 = a.create_cq(8, 64, -1);
    let q3 = a.create_qp(pd, &cq2, &cq2, RC, 16, 8, None);
    bring_up(&a, &q3, 1, q3.qpn, Knobs::default());
    assert_eq!(qp_state(&a, &q3), QPS_RTS);
}

#[test]
fn threaded_retry_exhaustion_waits_for_the_longest_timeout_the_spec_allows() {
    // A threaded HCA whose peer never answers (no node 77 on the fabric): timeout 10
    // (4.19 ms), 2 retries. The retransmissions go out every 4.19 ms, but RETRY_EXC comes
    // only after (2 + 1) x 4 x 4.19 ms = 50.3 ms of silence (a peer HCA that is a
    // descheduled thread of another process must not break the connection sooner).
    let emu = mlx5_emu::Emulator::new(mlx5_emu::EmuConfig::default());
    let mut a = Ctx::open(&emu, 0);
    let pd = a.alloc_pd();
    let mut cq = a.create_cq(8, 64, -1);
    let mut qp = a.create_qp(pd, &cq, &cq, RC, 16, 8, None);
    let k = Knobs {
        timeout: 10,
        retry_cnt: 2,
        ..Knobs::default()
    };
    bring_up(&a, &qp, 77, 0x123, k);
    let t0 = std::time::Instant::now();
    let i = qp.build_send(SendOpcode::NOP, 0, SIG, [0; 4], &[]);
    // A NOP completes at once: use it to know the device runs, then the real SEND.
    qp.ring(&a, i, Ring::Doorbell);
    let m = Buf::new(64);
    let (_, lkey, _) = a.reg_mr(pd, m.addr(), 64, ALL_ACCESS).unwrap();
    let i = qp.build_send(
        SendOpcode::SEND,
        0,
        SIG,
        [0; 4],
        DataSeg::new(8, lkey, m.addr()).as_bytes(),
    );
    qp.ring(&a, i, Ring::Doorbell);
    let mut c = Vec::new();
    while c.len() < 2 && t0.elapsed() < std::time::Duration::from_secs(10) {
        c.extend(drain(&mut cq));
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let waited = t0.elapsed();
    assert_eq!(c.len(), 2, "{c:?}");
    assert_eq!(
        (c[1].opcode, c[1].syndrome),
        (REQ_ERR, Syndrome::TRANSPORT_RETRY_EXC.0)
    );
    assert!(
        waited >= std::time::Duration::from_micros(50_300),
        "RETRY_EXC after {waited:?}"
    );
    assert!(emu.counters(0).local_ack_timeout_err >= 3);
}
