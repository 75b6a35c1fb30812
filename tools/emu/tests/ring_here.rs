//! Doorbell stores emulated in the ringing thread (the default between nodes of a UDP
//! fabric; `docs/emulator-wake.md`, *Doorbell stores emulated in the ringing thread*): the
//! fault handler writes the store itself (the page stays protected) and runs the device in
//! the ringing thread, so the WQE has run when the store returns. In its own test binary:
//! the counts of `Emulator::ringing_thread_counts` are process-wide.

mod common;

use std::time::{Duration, Instant};

use common::*;
use mlx5_emu::{EmuConfig, Emulator, Fabric, RunMode, WakeMode};
use mlx5_hw::opcodes::SendOpcode;
use mlx5_hw::wqe::{DataSeg, FM_CE_SE_CQ_UPDATE};
use zerocopy::IntoBytes;

#[test]
fn the_ringing_thread_runs_its_doorbell_and_blueflame_copy_exactly_once() {
    let here = std::env::var("MLX5_EMU_RING").map_or(true, |v| v.trim() != "device")
        && !std::env::var("MLX5_EMU_LEND").is_ok_and(|v| v.trim() == "1")
        && cfg!(target_arch = "x86_64");
    // Two nodes of a UDP fabric (as two processes are), each with its waking device.
    let node = || {
        Emulator::with_wake(
            EmuConfig {
                mode: RunMode::Threaded,
                fabric: Fabric::Udp,
                ..EmuConfig::default()
            },
            WakeMode::Fault,
        )
    };
    let (emu, eb) = (node(), node());
    let (ia, ib) = (emu.hca_info(0).expect("a"), eb.hca_info(0).expect("b"));
    let mut a = Ctx::open(&emu, 0);
    let mut b = Ctx::open(&eb, 0);
    let (pd, pdb) = (a.alloc_pd(), b.alloc_pd());
    let mut cq = a.create_cq(256, 64, -1);
    let mut cqb = b.create_cq(256, 64, -1);
    let mut tx = a.create_qp(pd, &cq, &cq, RC, 64, 64, None);
    let mut rx = b.create_qp(pdb, &cqb, &cqb, RC, 64, 64, None);
    bring_up(&a, &tx, ib.lid, rx.qpn, Knobs::default());
    bring_up(&b, &rx, ia.lid, tx.qpn, Knobs::default());
    let (buf, bufb) = (Buf::new(8192), Buf::new(8192));
    let (_, lkey, _) = a.reg_mr(pd, buf.addr(), 8192, ALL_ACCESS).expect("mr");
    let (_, lkeyb, _) = b.reg_mr(pdb, bufb.addr(), 8192, ALL_ACCESS).expect("mr b");
    let (e0, r0) = Emulator::ringing_thread_counts();
    // The doorbell record alone still runs nothing.
    rx.post_recv(&[(bufb.addr(), 64, lkeyb)]);
    let send = |tx: &mut Qp, len: u32| {
        let seg = DataSeg::new(len, lkey, buf.addr());
        tx.build_send(
            SendOpcode::SEND,
            0,
            FM_CE_SE_CQ_UPDATE,
            [0; 4],
            seg.as_bytes(),
        )
    };
    let i = send(&mut tx, 8);
    tx.ring(&a, i, Ring::RecordOnly);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        emu.counters(0).wqes_executed,
        0,
        "executed without a doorbell"
    );
    tx.ring(&a, i, Ring::Doorbell);
    let rounds = 200u64;
    let mut done_at_return = 0;
    let mut got = 0;
    for round in 0..=rounds {
        if round > 0 {
            // Past the device thread's work: it blocks, the next store faults.
            std::thread::sleep(Duration::from_millis(2));
            rx.post_recv(&[(bufb.addr(), 64, lkeyb)]);
            // Data 8..=64 bytes, the doorbell word alternating with a BlueFlame copy.
            let i = send(&mut tx, 8 + (round as u32 % 57));
            let how = if round % 2 == 0 {
                Ring::Doorbell
            } else {
                Ring::BlueFlame
            };
            tx.ring(&a, i, how);
            if emu.counters(0).wqes_executed == round + 1 {
                done_at_return += 1;
            }
        }
        // The send's completion (after the peer's ACK) and the receive's.
        let t0 = Instant::now();
        while got < 2 * (round + 1) {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "round {round}: lost"
            );
            got += u64::from(cq.poll().is_some()) + u64::from(cqb.poll().is_some());
        }
    }
    let n = rounds + 1;
    let t0 = Instant::now();
    while emu.counters(0).doorbells < n && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(20));
    let c = emu.counters(0);
    assert_eq!(c.doorbells, n, "doorbells counted once each");
    assert_eq!(
        c.bf_writes,
        rounds / 2,
        "BlueFlame copies counted once each"
    );
    assert_eq!(c.wqes_executed, n, "WQEs executed once each");
    assert_eq!(c.cqes_written, n, "send CQEs");
    assert_eq!(eb.counters(0).cqes_written, n, "receive CQEs");
    assert!(cq.poll().is_none(), "no send CQE beyond one per round");
    assert!(cqb.poll().is_none(), "no receive CQE beyond one per round");
    let (e1, r1) = Emulator::ringing_thread_counts();
    if here {
        // A machine under load may find the world busy (the store then wakes the device
        // thread) for some rounds; most must be run here.
        assert!(
            done_at_return > rounds * 3 / 4,
            "the WQE had run when the store returned in {done_at_return} of {rounds} rounds"
        );
        assert!(
            r1 - r0 >= done_at_return,
            "runs here {} < {done_at_return}",
            r1 - r0
        );
        assert!(e1 - e0 >= r1 - r0);
    } else {
        assert_eq!(e1 - e0, 0, "nothing emulated when switched off");
    }
}
