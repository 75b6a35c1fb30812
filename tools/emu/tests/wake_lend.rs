//! Lending (`MLX5_EMU_LEND=1`, `docs/emulator-wake.md`, *Lending*): a thread whose doorbell
//! store faults waits in the fault handler while the real-time device takes the doorbell
//! from the doorbell record. In its own test binary: lending is process-wide and switched on
//! from the environment before the first emulator starts its device thread.

mod common;

use std::time::{Duration, Instant};

use common::*;
use mlx5_emu::{DeviceSched, EmuConfig, Emulator, RunMode, WakeMode};
use mlx5_hw::opcodes::SendOpcode;
use mlx5_hw::wqe::{DataSeg, FM_CE_SE_CQ_UPDATE};
use zerocopy::IntoBytes;

#[test]
fn a_lending_thread_finds_its_wqe_run_when_its_doorbell_store_returns() {
    // SAFETY: the only test of this binary, before any emulator (and its threads) exists;
    // nothing else of the process reads the environment concurrently.
    unsafe { std::env::set_var("MLX5_EMU_LEND", "1") };
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
    let t0 = Instant::now();
    while emu.device_sched() == DeviceSched::Unknown && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let lends = matches!(emu.device_sched(), DeviceSched::RealTime(_));
    let send = |tx: &mut Qp| {
        let seg = DataSeg::new(8, lkey, buf.addr());
        tx.build_send(
            SendOpcode::SEND,
            0,
            FM_CE_SE_CQ_UPDATE,
            [0; 4],
            seg.as_bytes(),
        )
    };
    // The doorbell record alone still runs nothing: no store, no fault, no note.
    rx.post_recv(&[(buf.addr() + 4096, 64, lkey)]);
    let i = send(&mut tx);
    tx.ring(&a, i, Ring::RecordOnly);
    std::thread::sleep(Duration::from_millis(100));
    assert!(cq.poll().is_none(), "executed without a doorbell");
    assert_eq!(emu.counters(0).wqes_executed, 0);
    tx.ring(&a, i, Ring::Doorbell);
    let mut done_at_return = 0;
    let mut got = 0;
    let rounds = 200;
    for round in 0..=rounds {
        if round > 0 {
            // Past the spin window: the page is protected again, the next store faults.
            std::thread::sleep(Duration::from_millis(3));
            rx.post_recv(&[(buf.addr() + 4096, 64, lkey)]);
            let i = send(&mut tx);
            tx.ring(&a, i, Ring::Doorbell);
            // Lending: the send ran while this thread waited in its fault handler.
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
    // Every doorbell word is counted once, when it lands (after its WQE ran, when lent).
    let n = rounds + 1;
    let t0 = Instant::now();
    while emu.counters(0).doorbells < n && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let c = emu.counters(0);
    assert_eq!(c.doorbells, n, "doorbells");
    assert_eq!(c.wqes_executed, n, "WQEs executed once each");
    assert_eq!(c.cqes_written, 2 * n, "CQEs");
    if lends {
        // Under load a wait may end by its 200 us bound first; most must not.
        assert!(
            done_at_return > rounds / 2,
            "the WQE had run when the store returned in {done_at_return} of {rounds} rounds"
        );
    } else {
        println!("device not real-time: no lending; {done_at_return} of {rounds} rounds ran early");
    }
}
