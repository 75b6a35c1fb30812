//! Emulator benchmark: 64-byte RC SEND messages per second between two in-process QPs in
//! stepped mode (with the fault-catching direct DMA copy, and, for the ratio, with every
//! DMA through `process_vm_readv`/`writev`), and the CPU share of an idle threaded HCA
//! (getrusage).
//!
//! `cargo run --release -p mlx5-emu --example bench [messages]`

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::*;
use mlx5_emu::{DmaPath, EmuConfig, Emulator, RunMode};
use mlx5_hw::opcodes::SendOpcode;
use mlx5_hw::wqe::{DataSeg, FM_CE_SE_CQ_UPDATE};
use zerocopy::IntoBytes;

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let direct = mlx5_emu::set_dma_path(DmaPath::Direct);
    let rate = send_rate(n);
    println!("stepped RC SEND 64 B: {rate:.0} msgs/s ({n} messages, DMA path {direct:?})");
    if direct == DmaPath::Direct {
        // The same loop with every DMA through process_vm_readv/writev, for the ratio.
        mlx5_emu::set_dma_path(DmaPath::Syscall);
        let m = (n / 10).max(1000);
        let slow = send_rate(m);
        println!(
            "stepped RC SEND 64 B: {slow:.0} msgs/s ({m} messages, DMA path Syscall): direct is {:.1}x",
            rate / slow
        );
        mlx5_emu::set_dma_path(DmaPath::Direct);
    }

    let emu = Emulator::new(EmuConfig {
        mode: RunMode::Threaded,
        ..EmuConfig::default()
    });
    let _ctx = Ctx::open(&emu, 0);
    std::thread::sleep(Duration::from_millis(300));
    let (c0, w0) = (cpu_seconds(), Instant::now());
    std::thread::sleep(Duration::from_secs(2));
    let share = (cpu_seconds() - c0) / w0.elapsed().as_secs_f64();
    println!("idle threaded HCA CPU: {:.2}% of one core", share * 100.0);
}

/// Messages per second for `n` signaled 64-byte RC SENDs in batches of 16 (one doorbell
/// per batch), each batch run to idle and both CQs drained.
fn send_rate(n: usize) -> f64 {
    let batch = 16;
    let mut p = pair(RC, Knobs::default());
    let (ba, la, bb, lb) = (p.ma.0.addr(), p.ma.1, p.mb.0.addr(), p.mb.1);
    let t0 = Instant::now();
    let mut done = 0;
    while done < n {
        let k = batch.min(n - done);
        let mut last = 0;
        for _ in 0..k {
            p.qb.post_recv(&[(bb, 64, lb)]);
            let seg = DataSeg::new(64, la, ba);
            let sig = FM_CE_SE_CQ_UPDATE;
            last =
                p.qa.build_send(SendOpcode::SEND, 0, sig, [0; 4], seg.as_bytes());
        }
        p.qa.ring(&p.a, last, Ring::Doorbell);
        p.emu.run_until_idle();
        let (mut sa, mut sb) = (0, 0);
        while p.cqa.poll().is_some() {
            sa += 1;
        }
        while p.cqb.poll().is_some() {
            sb += 1;
        }
        assert_eq!((sa, sb), (k, k));
        done += k;
    }
    n as f64 / t0.elapsed().as_secs_f64()
}
