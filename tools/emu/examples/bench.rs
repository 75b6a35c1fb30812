//! Emulator benchmark, every figure of `docs/emulator-wake.md` in one run:
//!
//! 1. 64-byte RC SEND messages per second between two in-process QPs in stepped mode (with
//!    the fault-catching direct DMA copy, and, for the ratio, with every DMA through
//!    `process_vm_readv`/`writev`);
//! 2. the application's cost of a doorbell store: onto a protected UAR page (a fault that
//!    wakes the sleeping device) and onto an open one (the device is still scanning);
//! 3. the CPU share of an idle threaded HCA, waking and polling device;
//! 4. latency between two processes against the same in one process, for the waking device
//!    (`MLX5_EMU_WAKE=fault`; `fair`: the same with `MLX5_EMU_RT=0`, no real-time device
//!    thread; `near`: the same without `MLX5_EMU_AVOID`, the device may share the ringing
//!    thread's CPU) and the old polling one (`MLX5_EMU_WAKE=poll`): `mlx5 lat
//!    send` p50/p99, `ibv_rc_pingpong -s 64` and `ib_send_lat` (both unmodified, under the
//!    preload) against in-process `mlx5 pingpong --loopback` / `mlx5 lat send`, and the CPU
//!    an idle `ibv_rc_pingpong` server burns in 4 s; `lend`: the waking device with
//!    `MLX5_EMU_LEND=1` (the ringing thread waits for the device in its fault handler);
//!    `device`: `MLX5_EMU_RING=device`, every doorbell fault opens the page and wakes the
//!    device thread (`fault` and the others: the default, doorbells emulated and run by the
//!    ringing thread while the device thread is blocked). The two-process `mlx5 lat send` p50 is also given against this run's floor,
//!    the doorbell fault plus one UDP wake-up of a blocked real-time thread beside busy
//!    pollers; and qperf's memory-polling `rc_rdma_write_poll_lat` against its CQ-based
//!    `rc_rdma_write_lat` in the same qperf run. Needs the `mlx5` binary next to this
//!    example (`cargo build --release -p mlx5-tools -p mlx5-emu-preload`) and the rdma-core
//!    tools and qperf; what is missing is reported and skipped.
//!
//! `cargo run --release -p mlx5-emu --example bench [messages] [lat-iters] [modes]`: `modes`
//! a comma-separated subset of `fault,device,lend,fair,near,poll` (default all); `messages` 0
//! skips the in-process figures (1 to 3) and the idle CPU.

#[path = "../tests/common/mod.rs"]
mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use mlx5_emu::{DmaPath, EmuConfig, Emulator, RunMode, WakeMode};
use mlx5_hw::opcodes::SendOpcode;
use mlx5_hw::wqe::{DataSeg, FM_CE_SE_CQ_UPDATE};
use zerocopy::IntoBytes;

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let iters: u32 = std::env::args()
        .nth(2)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2000);
    let modes: Vec<String> = std::env::args()
        .nth(3)
        .unwrap_or_else(|| "fault,device,lend,fair,near,poll".into())
        .split(',')
        .map(str::to_owned)
        .collect();
    println!("load average at start: {}", loadavg());
    if n == 0 {
        // The floor as issue 20 defines it: the doorbell fault that opens the page and wakes
        // the device thread, plus one UDP wake-up; and the store as it costs now, emulated
        // and run by the ringing thread (the device's work for it included).
        Emulator::set_ring_in_thread(false);
        let (fault, _) = doorbell_cost(1000);
        Emulator::set_ring_in_thread(true);
        let (here, _) = doorbell_cost(1000);
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        let udp = wake_latency(WakeLine::Udp, true, cpus, 2000).map(|w| w.0);
        println!(
            "application CPU time of a doorbell store onto a protected page: {fault:.2} us \
             (fault, unprotect, wake: the floor's), {here:.2} us emulated and run here \
             (the device's work for the SEND included)"
        );
        println!(
            "wake latency, Udp -> blocked SCHED_FIFO 1 thread: p50 {:.1} us",
            udp.unwrap_or(f64::NAN)
        );
        processes(iters, udp.map(|u| fault + u), &modes);
        println!("load average at end: {}", loadavg());
        return;
    }
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

    Emulator::set_ring_in_thread(false);
    let (fault, open) = doorbell_cost(1000);
    Emulator::set_ring_in_thread(true);
    let (here, again) = doorbell_cost(1000);
    println!(
        "application CPU time of a doorbell store: {fault:.2} us onto a protected page (fault + \
         unprotect + wake), {open:.2} us onto an open one (median of 1000 each); emulated and \
         run by the ringing thread: {here:.2} us (the SEND executed and delivered), {again:.2} us \
         for the repeat"
    );

    let (alone, shared) = (mprotect_cost(false, 2000), mprotect_cost(true, 2000));
    println!(
        "mprotect of one page (a wake's unprotect, the device's re-arm): {:.2} / {:.2} us alone, \
         {:.2} / {:.2} us with a thread of the process running on another CPU (TLB shootdown)",
        alone.0, alone.1, shared.0, shared.1
    );

    // Where the microseconds of a two-process round trip go: how long a blocked thread
    // takes to run after an eventfd poke (a doorbell's wake) or a loopback UDP datagram (a
    // packet's), with every CPU held by a busy-polling fair thread, as the applications
    // hold them; real-time (the waking device's default) against fair.
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut udp_rt = None;
    for line in [WakeLine::Eventfd, WakeLine::Udp] {
        for rt in [true, false] {
            match wake_latency(line, rt, cpus, 2000) {
                Some((p50, p99)) => {
                    if rt && matches!(line, WakeLine::Udp) {
                        udp_rt = Some(p50);
                    }
                    println!(
                        "wake latency, {line:?} -> blocked {} thread, {cpus} busy pollers: p50 {p50:.1} us, p99 {p99:.1} us",
                        if rt { "SCHED_FIFO 1" } else { "fair" }
                    )
                }
                None => println!("wake latency, {line:?}, rt {rt}: not measured (no SCHED_FIFO?)"),
            }
        }
    }

    for mode in [WakeMode::Fault, WakeMode::Poll] {
        let emu = Emulator::with_wake(
            EmuConfig {
                mode: RunMode::Threaded,
                ..EmuConfig::default()
            },
            mode,
        );
        let _ctx = Ctx::open(&emu, 0);
        std::thread::sleep(Duration::from_millis(1300));
        let (c0, w0) = (cpu_seconds(), Instant::now());
        std::thread::sleep(Duration::from_secs(2));
        let share = (cpu_seconds() - c0) / w0.elapsed().as_secs_f64();
        println!(
            "idle threaded HCA CPU ({mode:?}): {:.3}% of one core",
            share * 100.0
        );
    }

    processes(iters, udp_rt.map(|u| fault + u), &modes);
    println!("load average at end: {}", loadavg());
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(4).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
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

/// The application's time for one 8-byte doorbell store (median, microseconds): right
/// after the waking device went to sleep (the page is protected: the store faults, the
/// handler unprotects the page and pokes the device), and right after a completion (the
/// device is still scanning, the page is open).
fn doorbell_cost(rounds: usize) -> (f64, f64) {
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
    let tx = a.create_qp(pd, &cq, &cq, RC, 64, 64, None);
    let mut rx = a.create_qp(pd, &cq, &cq, RC, 64, 64, None);
    bring_up(&a, &tx, 1, rx.qpn, Knobs::default());
    bring_up(&a, &rx, 1, tx.qpn, Knobs::default());
    let mut tx = tx;
    let buf = Buf::new(8192);
    let (_, lkey, _) = a.reg_mr(pd, buf.addr(), 8192, ALL_ACCESS).expect("mr");
    let mut times = [Vec::new(), Vec::new()];
    for _ in 0..rounds {
        // Past the spin window: the device has re-protected the page and blocks.
        std::thread::sleep(Duration::from_micros(500));
        rx.post_recv(&[(buf.addr() + 4096, 64, lkey)]);
        let seg = DataSeg::new(8, lkey, buf.addr());
        let i = tx.build_send(
            SendOpcode::SEND,
            0,
            FM_CE_SE_CQ_UPDATE,
            [0; 4],
            seg.as_bytes(),
        );
        let t0 = thread_cpu_us();
        tx.ring(&a, i, Ring::Doorbell);
        let t1 = thread_cpu_us();
        // The same doorbell again, onto the page the first store just opened (the device
        // takes it as a repeat: nothing new is posted).
        tx.ring(&a, i, Ring::Doorbell);
        let t2 = thread_cpu_us();
        times[0].push(t1 - t0);
        times[1].push(t2 - t1);
        let mut got = 0;
        let t = Instant::now();
        while got < 2 && t.elapsed() < Duration::from_secs(10) {
            if cq.poll().is_some() {
                got += 1;
            }
        }
        assert_eq!(got, 2, "no completion");
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let [mut f, mut o] = times;
    (med(&mut f), med(&mut o))
}

/// This thread's CPU time in microseconds (not the wall time: a store that wakes the
/// device may be preempted by it, which is the scheduler's cost, not the store's).
fn thread_cpu_us() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime into our own timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 * 1e6 + ts.tv_nsec as f64 / 1e3
}

/// Median wall time (microseconds) of `mprotect` on one shared page: to writable (what the
/// fault handler does) and back to read-only (the device's re-arm), with or without a
/// second thread of this process spinning (whose CPU must then drop the old translation).
fn mprotect_cost(sibling: bool, rounds: usize) -> (f64, f64) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let stop = Arc::new(AtomicBool::new(false));
    let spinner = sibling.then(|| {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        })
    });
    // SAFETY: a fresh anonymous shared mapping of 3 pages, unmapped below.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            3 * 4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    let mut up = Vec::with_capacity(rounds);
    let mut down = Vec::with_capacity(rounds);
    if base != libc::MAP_FAILED {
        // SAFETY: the middle page of our mapping.
        let page = unsafe { base.cast::<u8>().add(4096) }.cast::<libc::c_void>();
        for i in 0..rounds {
            let t0 = Instant::now();
            // SAFETY: `page` is one page of our own mapping.
            unsafe { libc::mprotect(page, 4096, libc::PROT_READ) };
            let t1 = Instant::now();
            // SAFETY: as above.
            unsafe { libc::mprotect(page, 4096, libc::PROT_READ | libc::PROT_WRITE) };
            let t2 = Instant::now();
            // SAFETY: the page is writable again; a volatile store makes it resident and
            // its translation cached, as a doorbell page is.
            unsafe { page.cast::<u64>().write_volatile(i as u64) };
            down.push((t1 - t0).as_secs_f64() * 1e6);
            up.push((t2 - t1).as_secs_f64() * 1e6);
        }
        // SAFETY: unmapping the mapping created above, unused after this.
        unsafe { libc::munmap(base, 3 * 4096) };
    }
    stop.store(true, Ordering::Relaxed);
    if let Some(h) = spinner {
        let _ = h.join();
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    (med(&mut up), med(&mut down))
}

#[derive(Clone, Copy, Debug)]
enum WakeLine {
    Eventfd,
    Udp,
}

fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime into our own timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// p50 and p99 (microseconds) of the time from a poke (an eventfd write or a loopback UDP
/// datagram, stamped just before) to the blocked waiter running again, while `hogs` fair
/// threads busy-poll. `rt`: the waiter is `SCHED_FIFO` 1 (None if the kernel refuses).
fn wake_latency(line: WakeLine, rt: bool, hogs: usize, samples: usize) -> Option<(f64, f64)> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let stop = Arc::new(AtomicBool::new(false));
    let stamp = Arc::new(AtomicU64::new(0));
    let seen = Arc::new(AtomicU64::new(0));
    // SAFETY: eventfd with no pointer arguments; checked below.
    let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK) };
    let rx = std::net::UdpSocket::bind("127.0.0.1:0").ok()?;
    let tx = std::net::UdpSocket::bind("127.0.0.1:0").ok()?;
    rx.set_nonblocking(true).ok()?;
    let to = rx.local_addr().ok()?;
    if efd < 0 {
        return None;
    }
    let fd = match line {
        WakeLine::Eventfd => efd,
        WakeLine::Udp => std::os::fd::AsRawFd::as_raw_fd(&rx),
    };
    let hog_threads: Vec<_> = (0..hogs)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    let waiter = {
        let (stop, stamp, seen) = (stop.clone(), stamp.clone(), seen.clone());
        std::thread::spawn(move || {
            let param = libc::sched_param { sched_priority: 1 };
            // SAFETY: sched_setscheduler(0 = this thread, a policy, a live sched_param).
            if rt && unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } != 0 {
                return None;
            }
            let mut lat = Vec::with_capacity(samples);
            let mut buf = [0u8; 64];
            while !stop.load(Ordering::Relaxed) && lat.len() < samples {
                let mut p = libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                let ts = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 100_000_000,
                };
                // SAFETY: one live pollfd, a live timespec.
                let r = unsafe { libc::ppoll(&mut p, 1, &ts, std::ptr::null()) };
                let now = mono_ns();
                if r <= 0 {
                    continue;
                }
                // SAFETY: read into our own buffer of its length (eventfd: 8 bytes).
                while unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) } > 0 {}
                lat.push(now.saturating_sub(stamp.load(Ordering::SeqCst)) as f64 / 1e3);
                seen.fetch_add(1, Ordering::SeqCst);
            }
            Some(lat)
        })
    };
    for i in 0..samples as u64 {
        // Let the waiter block again (and give up if it is gone).
        std::thread::sleep(Duration::from_micros(300));
        let t = Instant::now();
        while seen.load(Ordering::SeqCst) < i && t.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_micros(50));
        }
        if waiter.is_finished() {
            break;
        }
        stamp.store(mono_ns(), Ordering::SeqCst);
        match line {
            WakeLine::Eventfd => {
                let one = 1u64;
                // SAFETY: write 8 bytes from a live u64 to our eventfd.
                unsafe { libc::write(efd, (&raw const one).cast(), 8) };
            }
            WakeLine::Udp => {
                let _ = tx.send_to(&[0u8; 64], to);
            }
        }
    }
    let t = Instant::now();
    while seen.load(Ordering::SeqCst) < samples as u64 && t.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(1));
    }
    stop.store(true, Ordering::Relaxed);
    let lat = waiter.join().ok()?;
    for h in hog_threads {
        let _ = h.join();
    }
    // SAFETY: closing the eventfd we opened, once.
    unsafe { libc::close(efd) };
    let mut lat = lat?;
    if lat.is_empty() {
        return None;
    }
    lat.sort_by(f64::total_cmp);
    Some((lat[lat.len() / 2], lat[lat.len() * 99 / 100]))
}

// ---------------------------------------------------------------------------------------
// Between processes

/// The `mlx5` binary next to this example (target/<profile>/mlx5).
fn mlx5_bin() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let p = exe.parent()?.parent()?.join("mlx5");
    p.exists().then_some(p)
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).exists()))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(18515)
}

/// Whether a socket listens on TCP `port` (from /proc/net: connecting to probe would be
/// taken by the server as its client).
fn listening(port: u16) -> bool {
    let want = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f)
            .unwrap_or_default()
            .lines()
            .skip(1)
            .any(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                // local_address is column 1 ("ADDR:PORT"), st column 3 (0A = LISTEN).
                cols.len() > 3 && cols[1].ends_with(&want) && cols[3] == "0A"
            })
    })
}

/// Run to completion (killed after `limit`), returning stdout + stderr.
fn output(mut child: Child, limit: Duration) -> String {
    let t0 = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if t0.elapsed() < limit => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break;
            }
        }
    }
    let mut s = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut s);
    }
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut s);
    }
    s
}

fn command(program: &Path, args: &[&str], mode: &str, preload: Option<&Path>) -> Command {
    let mut c = Command::new(program);
    // "fair": the waking device without its real-time priority (MLX5_EMU_RT=0).
    // "near": without keeping the device off the ringing thread's CPU (MLX5_EMU_AVOID=0).
    let (wake, rt, avoid) = match mode {
        "fair" => ("fault", "0", "1"),
        "near" => ("fault", "1", "0"),
        "lend" | "device" => ("fault", "1", "1"),
        m => (m, "1", "1"),
    };
    c.args(args)
        .env("MLX5_EMU_WAKE", wake)
        .env("MLX5_EMU_RT", rt)
        .env("MLX5_EMU_AVOID", avoid)
        .env("MLX5_EMU_LEND", if mode == "lend" { "1" } else { "0" })
        // "device": every doorbell fault opens the page and wakes the device thread (the
        // mechanism before the ringing thread ran the device itself).
        .env(
            "MLX5_EMU_RING",
            if mode == "device" { "device" } else { "thread" },
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(so) = preload {
        c.env("LD_PRELOAD", so);
    }
    c
}

/// A server and a client of `program` (server args, then client args + "localhost").
fn two_process(
    program: &Path,
    args: &[&str],
    mode: &str,
    preload: Option<&Path>,
    peer: &str,
) -> Option<String> {
    let port = free_port().to_string();
    let mut sargs = args.to_vec();
    sargs.extend(["-p", &port]);
    let mut server_args = sargs.clone();
    if program.ends_with("mlx5") {
        server_args.push("--server");
    }
    let server = command(program, &server_args, mode, preload).spawn().ok()?;
    let t0 = Instant::now();
    let p: u16 = port.parse().ok()?;
    while !listening(p) && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut cargs = sargs;
    cargs.push(peer);
    let client = command(program, &cargs, mode, preload).spawn().ok()?;
    let out = output(client, Duration::from_secs(180));
    let _ = output(server, Duration::from_secs(10));
    Some(out)
}

/// `mlx5 lat`'s percentile line: (p50, p99) in microseconds.
fn lat_p50_p99(out: &str) -> Option<(f64, f64)> {
    let mut lines = out.lines();
    lines.find(|l| l.contains("p50[usec]"))?;
    let f: Vec<f64> = lines
        .next()?
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    Some((*f.get(2)?, *f.get(3)?))
}

/// `ibv_rc_pingpong`'s "N iters in S seconds = U usec/iter".
fn usec_per_iter(out: &str) -> Option<f64> {
    let l = out.lines().find(|l| l.contains("usec/iter"))?;
    let w: Vec<&str> = l.split_whitespace().collect();
    let i = w.iter().position(|&x| x == "usec/iter")?;
    w.get(i - 1)?.parse().ok()
}

/// perftest's result line under `t_typical`: (t_typical, 99%) in microseconds.
fn perftest_typical_p99(out: &str) -> Option<(f64, f64)> {
    let mut lines = out.lines();
    lines.find(|l| l.contains("t_typical"))?;
    let f: Vec<f64> = lines
        .next()?
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    Some((*f.get(4)?, *f.get(7)?))
}

/// CPU seconds (user + system) of process `pid`.
fn proc_cpu(pid: u32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let (u, k): (f64, f64) = (f.get(11)?.parse().ok()?, f.get(12)?.parse().ok()?);
    Some((u + k) / hz)
}

/// The two-process figures for each of `modes`; `floor`: this run's doorbell fault plus one
/// UDP wake-up of a blocked real-time thread [us], the least a one-way trip can cost.
fn processes(iters: u32, floor: Option<f64>, modes: &[String]) {
    let Some(mlx5) = mlx5_bin() else {
        println!("two-process figures skipped: build the mlx5 binary (-p mlx5-tools) first");
        return;
    };
    let preload = mlx5_emu::cprog::preload_so().ok();
    let rdma = preload.is_some() && on_path("ibv_rc_pingpong");
    let perftest = preload.is_some() && on_path("ib_send_lat");
    let n = iters.to_string();
    println!("[mode ] figure (ratios: two-process / in-process, same run)   value   target");
    let qperf = preload.is_some() && on_path("qperf");
    for mode in modes.iter().map(String::as_str) {
        // The polling device is slow between processes: fewer iterations.
        let k = if mode == "poll" {
            (iters / 5).max(100).to_string()
        } else {
            n.clone()
        };
        let inproc = output(
            command(&mlx5, &["lat", "send", "-n", &k], mode, None)
                .spawn()
                .expect("mlx5"),
            Duration::from_secs(120),
        );
        let two = two_process(&mlx5, &["lat", "send", "-n", &k], mode, None, "127.0.0.1");
        let (ip50, ip99) = lat_p50_p99(&inproc).unwrap_or((f64::NAN, f64::NAN));
        let (tp50, tp99) = two
            .as_deref()
            .and_then(lat_p50_p99)
            .unwrap_or((f64::NAN, f64::NAN));
        row(
            mode,
            "in-process mlx5 lat send p50 / p99 [us]",
            ip50,
            ip99,
            "p50 <= 1.5x today",
        );
        row(
            mode,
            "two-process mlx5 lat send p50 / p99 [us]",
            tp50,
            tp99,
            "",
        );
        row(
            mode,
            "  ratio p50 / p99",
            tp50 / ip50,
            tp99 / ip99,
            "<= 10x / <= 20x",
        );
        if let Some(f) = floor {
            row(
                mode,
                "  two-process p50 / floor (doorbell fault + UDP wake-up, this run)",
                tp50 / f,
                f64::NAN,
                "<= 1.5x",
            );
        }
        if qperf {
            let (cq, poll) = qperf_write_lat(&mlx5, mode).unwrap_or((f64::NAN, f64::NAN));
            row(
                mode,
                "qperf rc_rdma_write_lat / rc_rdma_write_poll_lat, one run [us]",
                cq,
                poll,
                "",
            );
            row(mode, "  ratio poll / CQ", poll / cq, f64::NAN, "<= 2x");
        }
        let pp_in = output(
            command(
                &mlx5,
                &["pingpong", "--loopback", "-s", "64", "-n", &k],
                mode,
                None,
            )
            .spawn()
            .expect("mlx5"),
            Duration::from_secs(120),
        );
        let pp_in = usec_per_iter(&pp_in).unwrap_or(f64::NAN);
        if rdma {
            let so = preload.as_deref();
            let args = ["-d", "mlx5_0", "-s", "64", "-n", &k];
            let two = two_process(Path::new("ibv_rc_pingpong"), &args, mode, so, "localhost");
            let us = two.as_deref().and_then(usec_per_iter).unwrap_or(f64::NAN);
            row(
                mode,
                "ibv_rc_pingpong -s 64 two-process / mlx5 pingpong in-process [us/iter]",
                us,
                pp_in,
                "",
            );
            row(mode, "  ratio", us / pp_in, f64::NAN, "<= 10x");
        }
        if perftest {
            let so = preload.as_deref();
            let two = two_process(
                Path::new("ib_send_lat"),
                &["-d", "mlx5_0", "-n", &k],
                mode,
                so,
                "localhost",
            );
            let (t, p99) = two
                .as_deref()
                .and_then(perftest_typical_p99)
                .unwrap_or((f64::NAN, f64::NAN));
            row(
                mode,
                "ib_send_lat two-process t_typical / 99% [us]",
                t,
                p99,
                "",
            );
            row(
                mode,
                "  ratio to in-process mlx5 lat send p50 / p99",
                t / ip50,
                p99 / ip99,
                "<= 10x",
            );
        }
        if rdma {
            let port = free_port().to_string();
            let server = command(
                Path::new("ibv_rc_pingpong"),
                &["-d", "mlx5_0", "-p", &port],
                mode,
                preload.as_deref(),
            )
            .spawn()
            .expect("ibv_rc_pingpong");
            let pid = server.id();
            std::thread::sleep(Duration::from_millis(1500));
            let c0 = proc_cpu(pid).unwrap_or(f64::NAN);
            std::thread::sleep(Duration::from_secs(4));
            let c1 = proc_cpu(pid).unwrap_or(f64::NAN);
            let mut server = server;
            let _ = server.kill();
            let _ = server.wait();
            row(
                mode,
                "idle ibv_rc_pingpong server CPU in 4 s [s]",
                c1 - c0,
                f64::NAN,
                "< 0.05 s",
            );
        }
    }
}

/// qperf's CQ-based and memory-polling RDMA WRITE latencies [us] in one qperf run of two
/// processes under `mlx5 emu run` (2 s each).
fn qperf_write_lat(mlx5: &Path, mode: &str) -> Option<(f64, f64)> {
    let port = free_port().to_string();
    let emu = |args: &[&str]| {
        let mut a = vec!["emu", "run", "--", "qperf", "-lp", &port];
        a.extend_from_slice(args);
        command(mlx5, &a, mode, None).spawn().ok()
    };
    let server = emu(&[])?;
    std::thread::sleep(Duration::from_millis(1000));
    let client = emu(&[
        "-t",
        "2",
        "localhost",
        "rc_rdma_write_lat",
        "rc_rdma_write_poll_lat",
    ]);
    let out = client.map(|c| output(c, Duration::from_secs(60)));
    // `mlx5 emu run` runs the program as its child: stop the qperf server by its pid, then
    // the wrapper.
    let pid = server.id();
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    for c in children
        .split_whitespace()
        .filter_map(|c| c.parse::<i32>().ok())
    {
        // SAFETY: kill(2) of our own child's child, by pid, with SIGTERM.
        unsafe { libc::kill(c, libc::SIGTERM) };
    }
    let mut server = server;
    let _ = server.kill();
    let _ = server.wait();
    let out = out?;
    // "latency  =  1.22 ms" under each test's name, in order.
    let v: Vec<f64> = out
        .lines()
        .filter(|l| l.trim_start().starts_with("latency"))
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let x: f64 = w.get(2)?.parse().ok()?;
            Some(match *w.get(3)? {
                "ns" => x / 1000.0,
                "us" => x,
                "ms" => x * 1000.0,
                "sec" | "s" => x * 1e6,
                _ => return None,
            })
        })
        .collect();
    Some((*v.first()?, *v.get(1)?))
}

fn row(mode: &str, what: &str, a: f64, b: f64, target: &str) {
    let v = if b.is_nan() {
        format!("{a:.3}")
    } else {
        format!("{a:.3} / {b:.3}")
    };
    println!("[{mode:>5}] {what:<70} {v:>24}   {target}");
}
