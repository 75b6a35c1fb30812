//! The waking device (threaded mode, `MLX5_EMU_WAKE` unset = fault): it blocks until a
//! doorbell store faults on a protected UAR page, a kernel command, a packet or a timer
//! wakes it, and it loses none of them.

mod common;

use std::time::{Duration, Instant};

use common::*;
use mlx5_emu::{DeviceSched, EmuConfig, Emulator, RunMode, WakeMode};
use mlx5_hw::opcodes::SendOpcode;
use mlx5_hw::wqe::{DataSeg, FM_CE_SE_CQ_UPDATE};
use zerocopy::IntoBytes;

fn threaded() -> Emulator {
    let emu = Emulator::new(EmuConfig {
        mode: RunMode::Threaded,
        ..EmuConfig::default()
    });
    if std::env::var("MLX5_EMU_WAKE").as_deref() != Ok("poll") {
        assert_eq!(emu.wake_mode(), WakeMode::Fault);
    }
    emu
}

/// Wait (bounded) for one CQE.
fn wait_cqe(cq: &mut Cq, what: &str) -> Cqe {
    let t0 = Instant::now();
    loop {
        if let Some((d, _)) = cq.poll() {
            return decode(&d);
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "{what}: no completion (a lost wake-up)"
        );
        std::hint::spin_loop();
    }
}

/// A context shared by the posting threads: they only read it (the UAR addresses and the
/// BlueFlame size in `Qp::ring`).
struct Shared(Ctx);
// SAFETY: the threads only read `Ctx` (its `uars` pointers and `resp`); every store
// through a UAR pointer is an atomic-width volatile store to device memory, which the
// emulator's device is built to receive from any thread.
unsafe impl Sync for Shared {}

/// One loopback RC pair in context `a` with its own CQ, and a registered buffer.
struct Lane {
    tx: Qp,
    rx: Qp,
    cq: Cq,
    buf: Buf,
    lkey: u32,
}

fn lane(a: &mut Ctx, pd: u32) -> Lane {
    let cq = a.create_cq(256, 64, -1);
    let tx = a.create_qp(pd, &cq, &cq, RC, 64, 64, None);
    let rx = a.create_qp(pd, &cq, &cq, RC, 64, 64, None);
    bring_up(a, &tx, 1, rx.qpn, Knobs::default());
    bring_up(a, &rx, 1, tx.qpn, Knobs::default());
    let buf = Buf::new(8192);
    let (_, lkey, _) = a.reg_mr(pd, buf.addr(), 8192, ALL_ACCESS).expect("mr");
    Lane {
        tx,
        rx,
        cq,
        buf,
        lkey,
    }
}

/// `n` SENDs of an 8-byte sequence number on `l`, each rung by an 8-byte doorbell or a
/// BlueFlame copy (pseudo-randomly), each awaited (send and receive CQE) and its payload
/// checked: a WQE executed twice, or not at all, or a doorbell the device never saw, fails.
fn run_lane(ctx: &Ctx, l: &mut Lane, n: u64, seed: u64) -> u64 {
    let mut rng = Rng(seed);
    let mut bf = 0;
    for seq in 0..n {
        l.rx.post_recv(&[(l.buf.addr() + 4096, 64, l.lkey)]);
        l.buf.write(0, &seq.to_le_bytes());
        let seg = DataSeg::new(8, l.lkey, l.buf.addr());
        let i = l.tx.build_send(
            SendOpcode::SEND,
            0,
            FM_CE_SE_CQ_UPDATE,
            [0; 4],
            seg.as_bytes(),
        );
        let ring = if rng.below(2) == 0 {
            Ring::Doorbell
        } else {
            bf += 1;
            Ring::BlueFlame
        };
        l.tx.ring(ctx, i, ring);
        let a = wait_cqe(&mut l.cq, "first");
        let b = wait_cqe(&mut l.cq, "second");
        let mut ops = [a.opcode, b.opcode];
        ops.sort_unstable();
        assert_eq!(ops, [0, 2], "seq {seq}: one send and one receive CQE");
        let got = u64::from_le_bytes(l.buf.read(4096, 8).try_into().expect("8"));
        assert_eq!(got, seq, "payload of SEND {seq}");
        assert!(l.cq.poll().is_none(), "seq {seq}: an extra CQE");
    }
    bf
}

/// At least 10^5 doorbells from two threads on two QPs (sharing the context's UAR pages),
/// while the device thread sleeps and re-protects the pages between them: every WQE runs
/// exactly once, and the doorbell, WQE and CQE counters are exact (the BlueFlame count up to
/// a copy torn by a scan, see below).
#[test]
fn no_wake_up_is_lost_between_two_threads() {
    const N: u64 = 50_000;
    let emu = threaded();
    let mut a = Ctx::open(&emu, 0);
    let pd = a.alloc_pd();
    let mut l1 = lane(&mut a, pd);
    let mut l2 = lane(&mut a, pd);
    // Both lanes ring registers of one UAR page: two threads store to the same protected
    // page, one may fault while the other's store lands, and the device re-protects it
    // under both.
    l2.tx.bfreg = l1.tx.bfreg ^ 1;
    println!(
        "bfregs {} and {} (page {} and {})",
        l1.tx.bfreg,
        l2.tx.bfreg,
        l1.tx.bfreg / 4,
        l2.tx.bfreg / 4
    );
    let before = emu.counters(0);
    let shared = Shared(a);
    let t0 = Instant::now();
    let (bf1, bf2) = std::thread::scope(|s| {
        let c = &shared;
        let h1 = s.spawn(|| run_lane(&c.0, &mut l1, N, 1));
        let h2 = s.spawn(|| run_lane(&c.0, &mut l2, N, 2));
        (h1.join().expect("lane 1"), h2.join().expect("lane 2"))
    });
    let el = t0.elapsed();
    let c = emu.counters(0);
    println!(
        "{} SENDs in {el:?} ({:.1} us per round trip per thread); {c:?}",
        2 * N,
        el.as_secs_f64() * 1e6 / N as f64
    );
    assert_eq!(c.doorbells - before.doorbells, 2 * N, "doorbells");
    assert_eq!(c.doorbell_drops, 0);
    assert_eq!(
        c.wqes_executed - before.wqes_executed,
        2 * N,
        "WQEs executed"
    );
    assert_eq!(c.cqes_written - before.cqes_written, 4 * N, "CQEs");
    // A scan may take a BlueFlame half while its copy is still being written (the CPU
    // between the first and a later store of the 64 bytes, e.g. preempted); the tail then
    // lands after the scan: that doorbell may count as an 8-byte one, and the tail, left in
    // the half, makes the next 8-byte doorbell there count as a BlueFlame copy. So the count
    // can be off either way. Rare (0 in most runs on the 2-core machine; 1 too many in 1 of
    // 8 runs at load 7-8, the session-2 code path as well as the current one; the grace
    // period keeps a faulted page open for the whole copy), so the bound is tight: at most
    // 1 in 2,000 either way.
    let bf = c.bf_writes - before.bf_writes;
    let written = bf1 + bf2;
    assert!(
        bf.abs_diff(written) <= written / 2000,
        "BlueFlame copies: {bf} counted of {written}"
    );
    assert_eq!(c.packets_dropped, 0);
}

/// A WQE published only in the doorbell record is not executed by the sleeping device;
/// the doorbell store then wakes it.
#[test]
fn the_doorbell_record_alone_does_not_wake_the_device() {
    let emu = threaded();
    let mut a = Ctx::open(&emu, 0);
    let pd = a.alloc_pd();
    let mut l = lane(&mut a, pd);
    l.rx.post_recv(&[(l.buf.addr() + 4096, 64, l.lkey)]);
    let seg = DataSeg::new(8, l.lkey, l.buf.addr());
    let i = l.tx.build_send(
        SendOpcode::SEND,
        0,
        FM_CE_SE_CQ_UPDATE,
        [0; 4],
        seg.as_bytes(),
    );
    l.tx.ring(&a, i, Ring::RecordOnly);
    std::thread::sleep(Duration::from_millis(100));
    assert!(l.cq.poll().is_none(), "executed without a doorbell");
    assert_eq!(emu.counters(0).wqes_executed, 0);
    l.tx.ring(&a, i, Ring::Doorbell);
    wait_cqe(&mut l.cq, "after the doorbell");
    wait_cqe(&mut l.cq, "after the doorbell");
    // The doorbell word is counted when the device sees it land: with lending (the ringing
    // thread waits in its fault handler while the device takes the doorbell from the
    // record) that can be after the completions.
    let t0 = std::time::Instant::now();
    while emu.counters(0).doorbells == 0 && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(emu.counters(0).doorbells, 1);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(emu.counters(0).doorbells, 1, "one doorbell counted once");
    assert_eq!(emu.counters(0).wqes_executed, 1);
}

/// The CQ-arm doorbell wakes the device too: arm, then a completion raises the event.
#[test]
fn a_cq_arm_and_a_completion_event_wake_the_device() {
    let emu = threaded();
    let mut a = Ctx::open(&emu, 0);
    let pd = a.alloc_pd();
    let ch = a.comp_channel();
    let mut cq = a.create_cq(64, 64, ch);
    let tx = a.create_qp(pd, &cq, &cq, RC, 64, 64, None);
    let mut rx = a.create_qp(pd, &cq, &cq, RC, 64, 64, None);
    bring_up(&a, &tx, 1, rx.qpn, Knobs::default());
    bring_up(&a, &rx, 1, tx.qpn, Knobs::default());
    let mut tx = tx;
    let buf = Buf::new(8192);
    let (_, lkey, _) = a.reg_mr(pd, buf.addr(), 8192, ALL_ACCESS).expect("mr");
    a.arm_cq(&mut cq, false);
    // Let the device take the arm and go back to sleep before the send.
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(emu.counters(0).cq_arms, 1, "the arm store woke the device");
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
    let mut p = libc::pollfd {
        fd: ch,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd on our completion channel.
    let r = unsafe { libc::poll(&mut p, 1, 20_000) };
    assert_eq!(r, 1, "no completion event");
    assert_eq!(emu.counters(0).comp_events, 1);
}

/// A kernel command that gives the device work (moving a QP with posted receives to the
/// error state flushes them) wakes it: the flush CQEs appear without any doorbell.
#[test]
fn a_kernel_command_wakes_the_device() {
    let emu = threaded();
    let mut a = Ctx::open(&emu, 0);
    let pd = a.alloc_pd();
    let mut l = lane(&mut a, pd);
    for _ in 0..3 {
        l.rx.post_recv(&[(l.buf.addr() + 4096, 64, l.lkey)]);
    }
    std::thread::sleep(Duration::from_millis(50));
    let mut m = modify_base(&l.rx);
    m.attr_mask = M_STATE;
    m.qp_state = 6; // ERR
    a.modify(&m).expect("to ERR");
    for k in 0..3 {
        let c = wait_cqe(&mut l.cq, "flush");
        assert_ne!(c.opcode, 0, "flush CQE {k} is an error CQE");
    }
}

/// Two QPs on one shared (medium-latency) register ring it between two scans: UAR memory
/// keeps only the second doorbell word, yet both WQEs run (the device takes the other QPs of
/// a shared register as rung, `rung_shared_register` in `device/fetch.rs`). Stepped, so the two stores are
/// certainly between the same two scans; failed before (the first QP's WQE never ran).
#[test]
fn two_qps_ringing_one_shared_register_between_two_scans_both_run() {
    let emu = stepped(1);
    let mut a = Ctx::open(&emu, 0);
    let pd = a.alloc_pd();
    let mut cq = a.create_cq(256, 64, -1);
    // 4 dedicated low-latency bfregs, then 11 medium ones: the 16th QP shares with the 5th.
    let qps: Vec<Qp> = (0..16)
        .map(|_| a.create_qp(pd, &cq, &cq, RC, 64, 64, None))
        .collect();
    let (i, j) = (0..16)
        .flat_map(|i| (i + 1..16).map(move |j| (i, j)))
        .find(|&(i, j)| qps[i].bfreg == qps[j].bfreg)
        .expect("two QPs on one register");
    let mut qps = qps;
    let mut qj = qps.swap_remove(j);
    let mut qi = qps.swap_remove(i);
    assert_eq!(a.bfreg_addr(&qi), a.bfreg_addr(&qj), "one register");
    for q in [&qi, &qj] {
        bring_up(&a, q, 1, q.qpn, Knobs::default());
    }
    let buf = Buf::new(8192);
    let (_, lkey, _) = a.reg_mr(pd, buf.addr(), 8192, ALL_ACCESS).expect("mr");
    for (k, q) in [&mut qi, &mut qj].into_iter().enumerate() {
        q.post_recv(&[(buf.addr() + 4096 + 64 * k as u64, 64, lkey)]);
        let seg = DataSeg::new(8, lkey, buf.addr());
        let idx = q.build_send(
            SendOpcode::SEND,
            0,
            FM_CE_SE_CQ_UPDATE,
            [0; 4],
            seg.as_bytes(),
        );
        q.ring(&a, idx, Ring::Doorbell);
    }
    emu.run_until_idle();
    let cqes = drain(&mut cq);
    assert_eq!(cqes.len(), 4, "send + receive of both QPs: {cqes:?}");
    assert_eq!(emu.counters(0).wqes_executed, 2);
}

/// [`no_wake_up_is_lost_between_two_threads`] with the two sending QPs on one shared
/// register (the same doorbell word, written by two threads): every WQE still runs exactly
/// once. Doorbells written over by the other thread between two scans are recovered from
/// the doorbell records, so `doorbells` may count fewer than the stores.
#[test]
fn no_wqe_is_lost_when_two_threads_share_a_register() {
    const N: u64 = 20_000;
    let emu = threaded();
    let mut a = Ctx::open(&emu, 0);
    let pd = a.alloc_pd();
    let cq1 = a.create_cq(256, 64, -1);
    let cq2 = a.create_cq(256, 64, -1);
    let mut qps: Vec<(Qp, usize)> = (0..16)
        .map(|k| {
            let cq = if k % 2 == 0 { &cq1 } else { &cq2 };
            (a.create_qp(pd, cq, cq, RC, 64, 64, None), k % 2)
        })
        .collect();
    // Two QPs on one register, one on each CQ, and one peer for each on the same CQ.
    let (i, j) = (0..16)
        .flat_map(|i| (i + 1..16).map(move |j| (i, j)))
        .find(|&(i, j)| qps[i].0.bfreg == qps[j].0.bfreg && qps[i].1 != qps[j].1)
        .expect("two QPs on one register, on different CQs");
    let (tj, _) = qps.remove(j);
    let (ti, ci) = qps.remove(i);
    let peer = |qps: &mut Vec<(Qp, usize)>, c: usize| {
        let k = qps.iter().position(|q| q.1 == c).expect("a peer");
        qps.remove(k).0
    };
    let ri = peer(&mut qps, ci);
    let rj = peer(&mut qps, 1 - ci);
    let (cqi, cqj) = if ci == 0 { (cq1, cq2) } else { (cq2, cq1) };
    let mut lanes = Vec::new();
    for (tx, rx, cq) in [(ti, ri, cqi), (tj, rj, cqj)] {
        bring_up(&a, &tx, 1, rx.qpn, Knobs::default());
        bring_up(&a, &rx, 1, tx.qpn, Knobs::default());
        let buf = Buf::new(8192);
        let (_, lkey, _) = a.reg_mr(pd, buf.addr(), 8192, ALL_ACCESS).expect("mr");
        lanes.push(Lane {
            tx,
            rx,
            cq,
            buf,
            lkey,
        });
    }
    let mut l2 = lanes.pop().expect("lane");
    let mut l1 = lanes.pop().expect("lane");
    assert_eq!(a.bfreg_addr(&l1.tx), a.bfreg_addr(&l2.tx), "one register");
    let shared = Shared(a);
    let (bf1, bf2) = std::thread::scope(|s| {
        let c = &shared;
        let h1 = s.spawn(|| run_lane(&c.0, &mut l1, N, 3));
        let h2 = s.spawn(|| run_lane(&c.0, &mut l2, N, 4));
        (h1.join().expect("lane 1"), h2.join().expect("lane 2"))
    });
    let c = emu.counters(0);
    println!("{c:?}");
    assert_eq!(c.wqes_executed, 2 * N, "WQEs executed");
    assert_eq!(c.cqes_written, 4 * N, "CQEs");
    // On one word two writers' copies interleave, so `bf_writes` is not bounded by the
    // copies made (a BlueFlame tail can be taken with the other thread's 8-byte doorbell).
    let _ = (bf1, bf2);
    assert!(
        c.doorbells <= 2 * N,
        "doorbells {} > stores {}",
        c.doorbells,
        2 * N
    );
}

/// The scheduling policy of thread `tid` of this process (field 41 of its stat line:
/// 0 = SCHED_OTHER, 1 = SCHED_FIFO).
fn policy_of(tid: i32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    // `rest` starts at field 3.
    rest.split_whitespace().nth(41 - 3)?.parse().ok()
}

#[test]
fn the_waking_device_blocks_as_a_real_time_thread_and_stays_fair_when_denied() {
    let emu = Emulator::with_wake(
        EmuConfig {
            mode: RunMode::Threaded,
            ..EmuConfig::default()
        },
        WakeMode::Fault,
    );
    let mut a = Ctx::open(&emu, 0);
    let t0 = Instant::now();
    while emu.device_sched() == DeviceSched::Unknown {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "device never started"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let tid = emu.device_thread_id().expect("the device thread's id");
    // Work (the device spins in the fair class after it), then idle: it blocks real-time.
    let pd = a.alloc_pd();
    let mut l = lane(&mut a, pd);
    run_lane(&a, &mut l, 200, 7);
    // The idle thread wakes every 10 ms for the clock and spins a little (fair) after each
    // wake-up, and on a loaded machine it may wait for a CPU while fair: sample it. FIFO
    // seen once shows it blocks real-time; never seen in 5 s shows it does not.
    let t0 = Instant::now();
    let mut policy = policy_of(tid).expect("the device thread's stat");
    while policy != libc::SCHED_FIFO as u32 && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(1));
        policy = policy_of(tid).expect("the device thread's stat");
    }
    let want_rt =
        std::env::var("MLX5_EMU_RT").map_or(true, |v| !matches!(v.trim(), "0" | "off" | "no"));
    // Whether this process may make a thread SCHED_FIFO at all (asked from a fresh thread).
    let permitted = std::thread::spawn(|| {
        let param = libc::sched_param { sched_priority: 1 };
        // SAFETY: sched_setscheduler(0 = this thread, a policy, a live sched_param).
        unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) == 0 }
    })
    .join()
    .expect("probe thread");
    match emu.device_sched() {
        DeviceSched::RealTime(p) => {
            assert!(want_rt && permitted && (1..=99).contains(&p));
            assert_eq!(
                policy,
                libc::SCHED_FIFO as u32,
                "idle device thread not SCHED_FIFO"
            );
        }
        DeviceSched::FairDenied => {
            assert!(
                want_rt && !permitted,
                "SCHED_FIFO is permitted, yet reported denied"
            );
            assert_eq!(policy, libc::SCHED_OTHER as u32);
        }
        DeviceSched::Fair => {
            assert!(!want_rt);
            assert_eq!(policy, libc::SCHED_OTHER as u32);
        }
        DeviceSched::Unknown => unreachable!(),
    }
    // Stepped mode has no waking thread to report.
    let stepped = Emulator::new(EmuConfig {
        mode: RunMode::Stepped,
        ..EmuConfig::default()
    });
    assert_eq!(stepped.device_sched(), DeviceSched::Unknown);
    assert_eq!(stepped.device_thread_id(), None);
}

/// Between two nodes of a UDP fabric (as between processes) the ringing threads emulate
/// their doorbell stores and run the device themselves (`docs/emulator-wake.md`, *Doorbell
/// stores emulated in the ringing thread*). Two threads ring QPs on one UAR page of node a,
/// each SEND checked on node b; one round in eight sleeps first, so the device thread blocks
/// and wakes, the two threads contend for the world (one runs, the other pokes) and race
/// with the device thread's packets: every WQE runs exactly once, in order, its payload
/// arrives, and the counters are exact.
#[test]
fn no_doorbell_is_lost_when_two_threads_run_the_device_between_nodes() {
    const N: u64 = 3_000;
    let node = || {
        Emulator::new(EmuConfig {
            mode: RunMode::Threaded,
            fabric: mlx5_emu::Fabric::Udp,
            ..EmuConfig::default()
        })
    };
    let (ea, eb) = (node(), node());
    let (ia, ib) = (ea.hca_info(0).expect("a"), eb.hca_info(0).expect("b"));
    let mut a = Ctx::open(&ea, 0);
    let mut b = Ctx::open(&eb, 0);
    let (pda, pdb) = (a.alloc_pd(), b.alloc_pd());
    let lane = |a: &mut Ctx, b: &mut Ctx| {
        let cq = a.create_cq(256, 64, -1);
        let cqb = b.create_cq(256, 64, -1);
        let tx = a.create_qp(pda, &cq, &cq, RC, 64, 64, None);
        let rx = b.create_qp(pdb, &cqb, &cqb, RC, 64, 64, None);
        bring_up(a, &tx, ib.lid, rx.qpn, Knobs::default());
        bring_up(b, &rx, ia.lid, tx.qpn, Knobs::default());
        let (buf, bufb) = (Buf::new(4096), Buf::new(4096));
        let (_, lkey, _) = a.reg_mr(pda, buf.addr(), 4096, ALL_ACCESS).expect("mr a");
        let (_, lkeyb, _) = b.reg_mr(pdb, bufb.addr(), 4096, ALL_ACCESS).expect("mr b");
        (tx, cq, buf, lkey, rx, cqb, bufb, lkeyb)
    };
    let mut l1 = lane(&mut a, &mut b);
    let mut l2 = lane(&mut a, &mut b);
    // Both senders ring registers of one UAR page.
    l2.0.bfreg = l1.0.bfreg ^ 1;
    let before = ea.counters(0);
    let (_, r0) = Emulator::ringing_thread_counts();
    let shared = Shared(a);
    let sh = &shared;
    let run = |l: &mut (Qp, Cq, Buf, u32, Qp, Cq, Buf, u32), seed: u64| -> u64 {
        let (tx, cq, buf, lkey, rx, cqb, bufb, lkeyb) = l;
        let mut rng = Rng(seed);
        let mut bf = 0;
        for seq in 0..N {
            rx.post_recv(&[(bufb.addr(), 64, *lkeyb)]);
            buf.write(0, &(seed << 32 | seq).to_le_bytes());
            if rng.below(8) == 0 {
                std::thread::sleep(Duration::from_micros(300));
            }
            let seg = DataSeg::new(8, *lkey, buf.addr());
            let i = tx.build_send(
                SendOpcode::SEND,
                0,
                FM_CE_SE_CQ_UPDATE,
                [0; 4],
                seg.as_bytes(),
            );
            let ring = if rng.below(2) == 0 {
                Ring::Doorbell
            } else {
                bf += 1;
                Ring::BlueFlame
            };
            tx.ring(&sh.0, i, ring);
            assert_eq!(wait_cqe(cq, "send").opcode, 0, "seq {seq}: a send CQE");
            assert_eq!(
                wait_cqe(cqb, "receive").opcode,
                2,
                "seq {seq}: a receive CQE"
            );
            let got = u64::from_le_bytes(bufb.read(0, 8).try_into().expect("8"));
            assert_eq!(got, seed << 32 | seq, "payload of SEND {seq}");
            assert!(
                cq.poll().is_none() && cqb.poll().is_none(),
                "seq {seq}: an extra CQE"
            );
        }
        bf
    };
    let (bf1, bf2) = std::thread::scope(|s| {
        let h1 = s.spawn(|| run(&mut l1, 1));
        let h2 = s.spawn(|| run(&mut l2, 2));
        (h1.join().expect("lane 1"), h2.join().expect("lane 2"))
    });
    let c = ea.counters(0);
    let (_, r1) = Emulator::ringing_thread_counts();
    println!("{c:?}; device runs in the ringing threads: {}", r1 - r0);
    assert_eq!(c.doorbells - before.doorbells, 2 * N, "doorbells");
    assert_eq!(c.doorbell_drops, 0);
    assert_eq!(
        c.wqes_executed - before.wqes_executed,
        2 * N,
        "WQEs executed"
    );
    assert_eq!(c.cqes_written - before.cqes_written, 2 * N, "send CQEs");
    let bf = c.bf_writes - before.bf_writes;
    let written = bf1 + bf2;
    // As in the test above: a copy torn by a device thread's scan may count either way.
    assert!(
        bf.abs_diff(written) <= written / 2000,
        "BlueFlame copies: {bf} counted of {written}"
    );
    let here = std::env::var("MLX5_EMU_RING").map_or(true, |v| v.trim() != "device")
        && !std::env::var("MLX5_EMU_LEND").is_ok_and(|v| v.trim() == "1")
        && cfg!(target_arch = "x86_64");
    if here {
        assert!(r1 > r0, "no doorbell was run by a ringing thread");
    }
}
