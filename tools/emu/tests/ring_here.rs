//! Doorbell stores emulated in the ringing thread (the default; `docs/emulator-wake.md`,
//! *Doorbell stores emulated in the ringing thread*): when the device thread is blocked, the
//! fault handler writes the store itself (the page stays protected) and runs the device in
//! the ringing thread, so the WQE has run when the store returns. In its own test binary:
//! the counts of `Emulator::ringing_thread_counts` are process-wide.

mod common;

use std::time::{Duration, Instant};

use common::*;
use mlx5_emu::{EmuConfig, Emulator, RunMode, WakeMode};
use mlx5_hw::opcodes::SendOpcode;
use mlx5_hw::wqe::{DataSeg, FM_CE_SE_CQ_UPDATE};
use zerocopy::IntoBytes;

#[test]
fn the_ringing_thread_runs_its_doorbell_and_blueflame_copy_exactly_once() {
    let here = std::env::var("MLX5_EMU_RING").map_or(true, |v| v.trim() != "device")
        && !std::env::var("MLX5_EMU_LEND").is_ok_and(|v| v.trim() == "1")
        && cfg!(target_arch = "x86_64");
    let emu = Emulator::with_wake(
        EmuConfig {
            mode: RunMode::Threaded,
            ..EmuConfig::default()
        },
        WakeMode::Fault,
    );
    let mut a = Ctx::open(&emu, 0);
    let pd = a.alloc_pd();
    let mut cq = a.create_cq(256, 64, -1);
    let mut tx = a.create_qp(pd, &cq, &cq, RC, 64, 64, None);
    let mut rx = a.create_qp(pd, &cq, &cq, RC, 64, 64, None);
    bring_up(&a, &tx, 1, rx.qpn, Knobs::default());
    bring_up(&a, &rx, 1, tx.qpn, Knobs::default());
    let buf = Buf::new(8192);
    let (_, lkey, _) = a.reg_mr(pd, buf.addr(), 8192, ALL_ACCESS).expect("mr");
    let (e0, r0) = Emulator::ringing_thread_counts();
    // The doorbell record alone still runs nothing.
    rx.post_recv(&[(buf.addr() + 4096, 64, lkey)]);
    let seg = DataSeg::new(8, lkey, buf.addr());
    let i = tx.build_send(
        SendOpcode::SEND,
        0,
        FM_CE_SE_CQ_UPDATE,
        [0; 4],
        seg.as_bytes(),
    );
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
            // Past the spin window: the device thread blocks, the next store faults.
            std::thread::sleep(Duration::from_millis(2));
            rx.post_recv(&[(buf.addr() + 4096, 64, lkey)]);
            // Data 8..=64 bytes, the doorbell word alternating with a BlueFlame copy.
            let seg = DataSeg::new(8 + (round as u32 % 57), lkey, buf.addr());
            let i = tx.build_send(
                SendOpcode::SEND,
                0,
                FM_CE_SE_CQ_UPDATE,
                [0; 4],
                seg.as_bytes(),
            );
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
        let t0 = Instant::now();
        while got < 2 * (round + 1) {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "round {round}: lost"
            );
            if cq.poll().is_some() {
                got += 1;
            }
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
    assert_eq!(c.cqes_written, 2 * n, "CQEs");
    assert_eq!(cq.poll().map(|_| ()), None, "no CQE beyond the 2 per round");
    let (e1, r1) = Emulator::ringing_thread_counts();
    if here {
        // A machine under load may find the device thread awake (its store then opens the
        // page, as before) for some rounds; most must be run here.
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
