//! The waking device places itself relative to the CPU of the thread that rang it
//! (`MLX5_EMU_AVOID`, on by default; `docs/emulator-wake.md`, *Scheduling*): on it while the
//! answer to a request sent over the UDP fabric comes next; while a doorbell comes next, on
//! it too when the ringing thread lends its CPU (a real-time device, `MLX5_EMU_LEND=1`:
//! the thread waits for the device in its fault handler, *Lending*), else off it; and, on a
//! UDP fabric, always on it while the ringing threads run their doorbells themselves (the
//! default, *Doorbell stores emulated in the ringing thread*). In its own test binary: the CPU of the last doorbell fault is process-wide, and
//! other tests ringing from other CPUs would move it. The two tests run one after the other
//! (a lock), as each pins its thread and rings from it.

mod common;

use std::time::{Duration, Instant};

use common::*;
use mlx5_emu::{EmuConfig, Emulator, Fabric, RunMode, WakeMode};
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

/// The waking device thread's id, once it has started.
fn device_tid(emu: &Emulator) -> i32 {
    let t0 = Instant::now();
    loop {
        if let Some(tid) = emu.device_thread_id() {
            return tid;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no waking device thread"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Whether the device waits for a doorbell on the ringing CPU: a real-time device whose
/// ringing threads lend it their CPU.
fn lends(emu: &Emulator) -> bool {
    matches!(emu.device_sched(), mlx5_emu::DeviceSched::RealTime(_))
        && std::env::var("MLX5_EMU_LEND").is_ok_and(|v| v.trim() == "1")
}

/// Whether doorbells are run by the ringing thread (the default on a UDP fabric;
/// `MLX5_EMU_RING=device` wakes the device thread for them): the device then waits on the
/// ringing CPU for everything, as it only ever waits for packets and timers.
fn rings_here() -> bool {
    std::env::var("MLX5_EMU_RING").map_or(true, |v| v.trim() != "device")
        && !std::env::var("MLX5_EMU_LEND").is_ok_and(|v| v.trim() == "1")
}

/// One test at a time: each pins its thread and expects the last fault to be its own.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Poll `cond` on the device thread's CPUs for up to 5 s.
fn eventually(tid: i32, what: &str, cond: impl Fn(&[usize]) -> bool) {
    let t0 = Instant::now();
    loop {
        let cpus = affinity(tid);
        if cond(&cpus) {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "{what}: device on {cpus:?}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn the_device_waits_for_a_doorbell_relative_to_the_cpu_of_the_thread_that_rang() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
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
    let tid = device_tid(&emu);
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
    // (In one process the doorbells are the device thread's: the rule applies.)
    if avoid && allowed.len() > 1 && lends(&emu) {
        assert_eq!(device, [ringer], "lending: on the ringing thread's CPU");
    } else if avoid && allowed.len() > 1 {
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

#[test]
fn the_device_waits_for_an_answer_on_the_ringing_cpu_and_for_a_doorbell_by_the_rule() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let avoid = std::env::var("MLX5_EMU_AVOID").map_or(true, |v| v.trim() != "0");
    let allowed = affinity(0);
    // a: a threaded device on the UDP fabric; b: a stepped one, which answers only when
    // stepped, so a's wait for the answer can be looked at.
    let ea = Emulator::with_wake(
        EmuConfig {
            mode: RunMode::Threaded,
            fabric: Fabric::Udp,
            ..EmuConfig::default()
        },
        WakeMode::Fault,
    );
    let eb = Emulator::new(EmuConfig {
        mode: RunMode::Stepped,
        fabric: Fabric::Udp,
        ..EmuConfig::default()
    });
    let ringer = allowed[0];
    pin(ringer);
    let (ia, ib) = (ea.hca_info(0).expect("a"), eb.hca_info(0).expect("b"));
    let mut a = Ctx::open(&ea, 0);
    let mut b = Ctx::open(&eb, 0);
    let (pda, pdb) = (a.alloc_pd(), b.alloc_pd());
    let mut cqa = a.create_cq(16, 64, -1);
    let mut cqb = b.create_cq(16, 64, -1);
    let mut qa = a.create_qp(pda, &cqa, &cqa, RC, 16, 8, None);
    let mut qb = b.create_qp(pdb, &cqb, &cqb, RC, 16, 8, None);
    let (ma, mb) = (Buf::new(4096), Buf::new(4096));
    let (_, la, _) = a.reg_mr(pda, ma.addr(), 4096, ALL_ACCESS).expect("mr a");
    let (_, lb, _) = b.reg_mr(pdb, mb.addr(), 4096, ALL_ACCESS).expect("mr b");
    bring_up(&a, &qa, ib.lid, qb.qpn, Knobs::default());
    bring_up(&b, &qb, ia.lid, qa.qpn, Knobs::default());
    let tid = device_tid(&ea);
    let two = avoid && allowed.len() > 1;
    for round in 0..3 {
        qb.post_recv(&[(mb.addr(), 64, lb)]);
        // Past the spin window: the page is protected, the store faults on `ringer`.
        std::thread::sleep(Duration::from_millis(5));
        let i = qa.build_send(
            SendOpcode::SEND,
            0,
            FM_CE_SE_CQ_UPDATE,
            [0; 4],
            DataSeg::new(8, la, ma.addr()).as_bytes(),
        );
        qa.ring(&a, i, Ring::Doorbell);
        if two {
            // The request is out; b has not answered: a waits on the ringing CPU alone,
            // also across its 10 ms clock ticks.
            eventually(tid, "awaiting the answer", |c| c == [ringer]);
            std::thread::sleep(Duration::from_millis(25));
            assert_eq!(affinity(tid), [ringer], "round {round}: after a clock tick");
        }
        // b receives the SEND and ACKs it; a completes it.
        let t0 = Instant::now();
        let cqe = loop {
            eb.run_until_idle();
            if let Some((d, _)) = cqa.poll() {
                break decode(&d);
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "round {round}: no CQE"
            );
            std::thread::sleep(Duration::from_millis(1));
        };
        assert_eq!(cqe.opcode, 0, "round {round}: a send completion");
        assert!(
            cqb.poll().is_some(),
            "round {round}: b's receive completion"
        );
        if two && (lends(&ea) || rings_here()) {
            // Nothing awaited, but the ringing thread lends its CPU or runs the doorbell
            // itself: a waits on it.
            std::thread::sleep(Duration::from_millis(25));
            assert_eq!(
                affinity(tid),
                [ringer],
                "round {round}: awaiting a doorbell"
            );
        } else if two {
            // Nothing awaited: a waits for the next doorbell off the ringing CPU.
            eventually(tid, "awaiting a doorbell", |c| {
                !c.contains(&ringer) && !c.is_empty() && c.iter().all(|x| allowed.contains(x))
            });
        } else {
            assert_eq!(
                affinity(tid),
                allowed,
                "one CPU or placement off: untouched"
            );
        }
    }
}
