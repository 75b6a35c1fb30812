//! The waking device keeps off the CPU of the thread that rang it (`MLX5_EMU_AVOID`, on by
//! default; `docs/emulator-wake.md`, *Scheduling*). In its own test binary: the CPU of the
//! last doorbell fault is process-wide, and other tests ringing from other CPUs would move it.

mod common;

use std::time::{Duration, Instant};

use common::*;
use mlx5_emu::{EmuConfig, Emulator, RunMode, WakeMode};
use mlx5_hw::opcodes::SendOpcode;
use mlx5_hw::wqe::{DataSeg, FM_CE_SE_CQ_UPDATE};
use zerocopy::IntoBytes;

/// The CPUs thread `tid` (0 = the caller) may run on.
fn affinity(tid: i32) -> Vec<usize> {
    // SAFETY: cpu_set_t is a plain bit array; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: sched_getaffinity(a thread of this process, the size of `set`, a live `set`).
    let r = unsafe { libc::sched_getaffinity(tid, size_of::<libc::cpu_set_t>(), &mut set) };
    assert_eq!(r, 0, "sched_getaffinity({tid})");
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `c` is below CPU_SETSIZE; `set` is a live cpu_set_t.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

/// Pin the calling thread to `cpu`.
fn pin(cpu: usize) {
    // SAFETY: as in `affinity`.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is one of this thread's allowed CPUs, below CPU_SETSIZE.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: sched_setaffinity(0 = this thread, the size of a live set, it).
    let r = unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) };
    assert_eq!(r, 0, "pin to CPU {cpu}");
}

#[test]
fn the_device_moves_off_the_cpu_of_the_thread_that_rang() {
    let avoid = std::env::var("MLX5_EMU_AVOID").map_or(true, |v| v.trim() != "0");
    let allowed = affinity(0);
    // The device thread inherits its creator's CPUs: create it first, then pin this thread.
    let emu = Emulator::with_wake(
        EmuConfig {
            mode: RunMode::Threaded,
            ..EmuConfig::default()
        },
        WakeMode::Fault,
    );
    let ringer = allowed[0];
    pin(ringer);
    let mut a = Ctx::open(&emu, 0);
    let pd = a.alloc_pd();
    let mut cq = a.create_cq(256, 64, -1);
    let mut tx = a.create_qp(pd, &cq, &cq, RC, 64, 64, None);
    let mut rx = a.create_qp(pd, &cq, &cq, RC, 64, 64, None);
    bring_up(&a, &tx, 1, rx.qpn, Knobs::default());
    bring_up(&a, &rx, 1, tx.qpn, Knobs::default());
    let buf = Buf::new(8192);
    let (_, lkey, _) = a.reg_mr(pd, buf.addr(), 8192, ALL_ACCESS).expect("mr");
    let tid = emu.device_thread_id().expect("a waking device thread");
    for round in 0..20 {
        // Past the spin window: the page is protected again, the next store faults here.
        std::thread::sleep(Duration::from_millis(5));
        rx.post_recv(&[(buf.addr() + 4096, 64, lkey)]);
        let seg = DataSeg::new(8, lkey, buf.addr());
        let i = tx.build_send(
            SendOpcode::SEND,
            0,
            FM_CE_SE_CQ_UPDATE,
            [0; 4],
            seg.as_bytes(),
        );
        tx.ring(&a, i, Ring::Doorbell);
        let (mut got, t0) = (0, Instant::now());
        while got < 2 {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "round {round}: lost"
            );
            if cq.poll().is_some() {
                got += 1;
            }
        }
    }
    std::thread::sleep(Duration::from_millis(20));
    let device = affinity(tid);
    if avoid && allowed.len() > 1 {
        assert!(
            !device.contains(&ringer),
            "device on {device:?}, the ringing thread on CPU {ringer}"
        );
        assert!(!device.is_empty() && device.iter().all(|c| allowed.contains(c)));
    } else {
        // One CPU (or the rule turned off): the device keeps what it was given.
        assert_eq!(device, allowed);
    }
}
