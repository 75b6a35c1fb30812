//! Threaded mode: the device thread makes progress on its own, and an idle HCA costs
//! well under 5% of a core (once idle for more than a second). (One test in this binary, so nothing else burns CPU meanwhile.)

mod common;

use std::time::{Duration, Instant};

use common::*;
use mlx5_emu::{EmuConfig, Emulator, RunMode};
use mlx5_hw::opcodes::SendOpcode;
use mlx5_hw::wqe::{DataSeg, FM_CE_SE_CQ_UPDATE};
use zerocopy::IntoBytes;

fn wait_cqe(cq: &mut Cq) -> Cqe {
    let t0 = Instant::now();
    loop {
        if let Some((d, _)) = cq.poll() {
            return decode(&d);
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no completion from the device thread"
        );
        std::thread::yield_now();
    }
}

#[test]
fn device_thread_progresses_and_idles_cheaply() {
    let emu = Emulator::new(EmuConfig {
        mode: RunMode::Threaded,
        ..EmuConfig::default()
    });
    let mut a = Ctx::open(&emu, 0);
    let pd = a.alloc_pd();
    let mut cq = a.create_cq(64, 64, -1);
    let q1 = a.create_qp(pd, &cq, &cq, RC, 64, 16, None);
    let mut q2 = a.create_qp(pd, &cq, &cq, RC, 64, 16, None);
    bring_up(&a, &q1, 1, q2.qpn, Knobs::default());
    bring_up(&a, &q2, 1, q1.qpn, Knobs::default());
    let mut q1 = q1;
    let buf = Buf::new(8192);
    let (_, lkey, _) = a.reg_mr(pd, buf.addr(), 8192, ALL_ACCESS).unwrap();
    buf.write(0, b"threaded!");
    for round in 0..100u64 {
        q2.post_recv(&[(buf.addr() + 4096, 64, lkey)]);
        let seg = DataSeg::new(9, lkey, buf.addr());
        let i = q1.build_send(
            SendOpcode::SEND,
            0,
            FM_CE_SE_CQ_UPDATE,
            [0; 4],
            seg.as_bytes(),
        );
        q1.ring(
            &a,
            i,
            if round % 2 == 0 {
                Ring::Doorbell
            } else {
                Ring::BlueFlame
            },
        );
        let c1 = wait_cqe(&mut cq);
        let c2 = wait_cqe(&mut cq);
        let mut ops = [c1.opcode, c2.opcode];
        ops.sort_unstable();
        assert_eq!(ops, [0, 2], "round {round}");
    }
    assert_eq!(buf.read(4096, 9), b"threaded!");
    // Idle: past the one-second "recently active" window the thread backs off; measure then.
    std::thread::sleep(Duration::from_millis(1300));
    // The least of three half-second windows: a loaded machine may add a one-off spike.
    let share = (0..3)
        .map(|_| {
            let (c0, t0) = (cpu_seconds(), Instant::now());
            std::thread::sleep(Duration::from_millis(500));
            (cpu_seconds() - c0) / t0.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min);
    println!("idle threaded HCA: {:.2}% of a core", share * 100.0);
    assert!(
        share < 0.05,
        "idle device thread used {:.1}% of a core",
        share * 100.0
    );
}
