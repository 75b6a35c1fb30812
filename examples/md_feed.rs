//! A market-data feed two ways: kernel bypass (a RAW_PACKET QP with a steering rule) beside
//! an ordinary kernel UDP socket, on the same multicast feed.
//!
//! ```sh
//! cargo run --release --example md_feed -- [-n PACKETS] [-r RATE] [-g GROUP] [-p PORT]
//! ```
//!
//! Needs `CAP_NET_ADMIN` (root): it creates a network namespace with a TAP interface
//! (`mlx5_emu::net_up`), attaches the emulated HCA's Ethernet port to it, and removes both at
//! the end. Inside the namespace a sender on an ordinary UDP socket publishes `PACKETS`
//! datagrams to `GROUP:PORT` at `RATE` per second, each carrying its sequence number and
//! its send time. Two receivers take the same feed:
//!
//! - **raw QP**: frames the namespace sends out of the TAP reach the emulated port, whose
//!   steering table gives those for the group's MAC, address and port to the QP
//!   ([`mlx5::raw::RawQp`], [`mlx5::flow::FlowRule`]); latency is from the NIC's receive
//!   timestamp (the device clock mapped to the host clock by a calibration of send
//!   completions), and also as the application sees it (host clock after the poll);
//! - **kernel socket**: a UDP socket in the namespace joined to the group (the kernel loops
//!   the namespace's own multicast back to it); latency when `recv` returns.
//!
//! Each receiver checks the sequence: every packet is received or reported in a gap with
//! its sequence numbers. Printed per receiver: received, gaps, duplicates, one-way latency
//! percentiles, and CPU time per packet of the receiving thread (the raw receiver polls, so
//! its CPU time includes the empty polls; the emulated device's own work runs on the
//! emulator's thread, as a NIC's runs in silicon, and is not in it). docs/raw-ethernet.md.

use std::error::Error;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use mlx5::emulator::{EmuConfig, Emulator, LinkLayer, RunMode};
use mlx5::flow::{FlowRule, ipv4_multicast_mac};
use mlx5::raw::{FramePayload, L3Type, L4Type, RawQp, RawQpInit, RxData, RxFrame, TxOffload};
use mlx5::{Context, Cq, CqInit, Pd, SendFlags};
use mlx5_emu::{NS_HOST_IP, TapConfig};

/// How long a receiver waits for more once the sender is done.
const GRACE: Duration = Duration::from_secs(2);
/// The whole run's limit.
const DEADLINE: Duration = Duration::from_secs(120);
/// Calibration round trips (send completions) for the device clock.
const CALIBRATIONS: usize = 64;
/// Empty polls before the raw receiver sleeps between polls.
const SPIN_POLLS: u32 = 2_000;

struct Opts {
    packets: u64,
    rate: u64,
    group: Ipv4Addr,
    port: u16,
}

fn opts() -> Result<Opts, Box<dyn Error>> {
    let mut o = Opts {
        packets: 100_000,
        rate: 20_000,
        group: Ipv4Addr::new(239, 77, 1, 1),
        port: 31_001,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = |what: &str| {
            args.next()
                .ok_or_else(|| format!("{a} needs a value ({what})"))
        };
        match a.as_str() {
            "-n" => o.packets = val("packets")?.parse().map_err(|e| format!("-n: {e}"))?,
            "-r" => {
                o.rate = val("packets per second")?
                    .parse()
                    .map_err(|e| format!("-r: {e}"))?
            }
            "-g" => {
                o.group = val("IPv4 multicast group")?
                    .parse()
                    .map_err(|e| format!("-g: {e}"))?
            }
            "-p" => o.port = val("UDP port")?.parse().map_err(|e| format!("-p: {e}"))?,
            _ => {
                return Err(format!(
                    "unknown argument {a:?} (-n PACKETS -r RATE -g GROUP -p PORT)"
                )
                .into());
            }
        }
    }
    if o.packets == 0 || o.packets > 10_000_000 {
        return Err("-n: 1 to 10000000 packets".into());
    }
    if o.rate == 0 || o.rate > 1_000_000 {
        return Err("-r: 1 to 1000000 packets per second".into());
    }
    if !o.group.is_multicast() {
        return Err(format!("-g: {} is not an IPv4 multicast group", o.group).into());
    }
    Ok(o)
}

/// Nanoseconds on one host clock shared by every thread of this process.
fn now_ns() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    BASE.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// CPU time of the calling thread, in nanoseconds.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// What one receiver saw.
struct Tally {
    name: &'static str,
    seen: Vec<bool>,
    dups: u64,
    bad: u64,
    lat_ns: Vec<i64>,
    cpu_ns: u64,
}

impl Tally {
    fn new(name: &'static str, n: u64) -> Self {
        Tally {
            name,
            seen: vec![false; n as usize],
            dups: 0,
            bad: 0,
            lat_ns: Vec::with_capacity(n as usize),
            cpu_ns: 0,
        }
    }

    /// Record datagram payload `p` (seq, send time) received at host time `at`.
    fn take(&mut self, p: &[u8], at: u64) -> bool {
        if p.len() < 16 {
            self.bad += 1;
            return false;
        }
        let seq = u64::from_be_bytes(p[..8].try_into().unwrap_or_default());
        let sent = u64::from_be_bytes(p[8..16].try_into().unwrap_or_default());
        match self.seen.get_mut(seq as usize) {
            Some(s) if *s => self.dups += 1,
            Some(s) => {
                *s = true;
                self.lat_ns.push(at as i64 - sent as i64);
            }
            None => self.bad += 1,
        }
        true
    }

    fn received(&self) -> u64 {
        self.seen.iter().filter(|s| **s).count() as u64
    }

    fn complete(&self) -> bool {
        self.seen.iter().all(|s| *s)
    }

    /// The missing sequence numbers as inclusive ranges.
    fn gaps(&self) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for (i, s) in self.seen.iter().enumerate() {
            if !s {
                match out.last_mut() {
                    Some(r) if r.1 + 1 == i as u64 => r.1 = i as u64,
                    _ => out.push((i as u64, i as u64)),
                }
            }
        }
        out
    }
}

/// Percentile `p` (0..=100) of sorted `v`, nearest rank.
fn pct(v: &[i64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1] as f64 / 1000.0
}

fn row(name: &str, t: &Tally, lat: &mut [i64]) -> String {
    lat.sort_unstable();
    let received = t.received();
    format!(
        "{name:<18} {received:>9} {:>6} {:>5} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>11.0}",
        t.seen.len() as u64 - received,
        t.dups,
        pct(lat, 50.0),
        pct(lat, 90.0),
        pct(lat, 99.0),
        pct(lat, 99.9),
        pct(lat, 100.0),
        t.cpu_ns as f64 / received.max(1) as f64,
    )
}

/// Map the device clock to the host clock: the send CQE's timestamp of a frame lies between
/// the host times just before the doorbell and just after the poll; the tightest of
/// [`CALIBRATIONS`] such windows gives the offset (host = device + offset) and its error.
fn calibrate(qp: &mut RawQp, scq: &mut Option<Cq>) -> Result<(i64, u64), Box<dyn Error>> {
    let raw_cq = scq.take().ok_or("send CQ")?;
    let mut raw_cq = raw_cq
        .into_raw()
        .map_err(|_| "send CQ has pending reports")?;
    // A frame nobody takes: a locally administered unicast MAC, the local experimental
    // EtherType; the namespace's stack drops it.
    let mut frame = [0u8; 60];
    frame[..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x01]);
    frame[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x02]);
    frame[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
    let hl = qp.min_inline().max(14);
    let mut best: Option<(u64, i64)> = None;
    for i in 0..CALIBRATIONS {
        let t0 = now_ns();
        qp.send(
            &frame[..hl],
            FramePayload::Inline(&frame[hl..]),
            TxOffload::default(),
            SendFlags::SIGNALED,
            i as u64,
        )?;
        qp.ring();
        let start = Instant::now();
        let ts = loop {
            if let Some(c) = raw_cq.next() {
                raw_cq.publish_ci();
                break qp.send_done(&c)?.1;
            }
            if start.elapsed() > Duration::from_secs(5) {
                return Err("no send completion within 5 s".into());
            }
            std::hint::spin_loop();
        };
        let t1 = now_ns();
        let width = t1 - t0;
        let offset = ((t0 + t1) / 2) as i64 - ts as i64;
        if best.is_none_or(|(w, _)| width < w) {
            best = Some((width, offset));
        }
    }
    *scq = Some(raw_cq.into_verbs());
    let (width, offset) = best.ok_or("no calibration")?;
    Ok((offset, width / 2))
}

fn run(o: &Opts, ns: &str, ifname: &str) -> Result<bool, Box<dyn Error>> {
    let emu = Emulator::new(EmuConfig {
        num_hcas: 1,
        mode: RunMode::Threaded,
        link_layer: LinkLayer::Ethernet,
        tap: Some(TapConfig {
            netns: ns.to_owned(),
            ifname: ifname.to_owned(),
        }),
        ..EmuConfig::default()
    });
    let ctx = Context::open(emu.open(0)?)?;
    let pd = Pd::new(&ctx)?;
    let scq = Cq::new(&ctx, CqInit::default(), None)?;
    let chan = Arc::new(ctx.create_comp_channel()?);
    let rcq = Cq::new(
        &ctx,
        CqInit {
            cqe: 8192,
            ..CqInit::default()
        },
        Some(&chan),
    )?;
    let mut init = RawQpInit::new(&scq, &rcq);
    init.rx_frames = 4096;
    init.rx_frame_bytes = 2048;
    init.max_send_wr = 64;
    let mut qp = RawQp::new(&pd, &init)?;
    qp.activate(1)?;
    let _flow = qp.attach_flow(
        &FlowRule::new()
            .dst_mac(ipv4_multicast_mac(o.group))
            .ipv4_dst(o.group)
            .udp_dst_port(o.port),
    )?;
    let mut scq = Some(scq);
    let (offset, err) = calibrate(&mut qp, &mut scq)?;
    let mut rcq = rcq
        .into_raw()
        .map_err(|_| "receive CQ has pending reports")?;
    println!(
        "md_feed: {} packets to {}:{} at {}/s from {} in namespace {ns} ({ifname})",
        o.packets,
        o.group,
        o.port,
        o.rate,
        Ipv4Addr::from(NS_HOST_IP)
    );
    println!(
        "clock: device clock to host clock from the tightest of {CALIBRATIONS} send completions, +-{:.2} us",
        err as f64 / 1000.0
    );

    let sender_done = Arc::new(AtomicBool::new(false));
    let ready = Arc::new(std::sync::Barrier::new(2));
    // The kernel socket receiver, in the namespace.
    let (n, group, port) = (o.packets, o.group, o.port);
    let (done2, ready2) = (sender_done.clone(), ready.clone());
    let ns2 = ns.to_owned();
    let kernel = std::thread::spawn(move || {
        mlx5_emu::in_netns(&ns2, move || -> Result<Tally, String> {
            let s = UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port))
                .map_err(|e| format!("socket receiver bind: {e}"))?;
            s.join_multicast_v4(&group, &Ipv4Addr::from(NS_HOST_IP))
                .map_err(|e| format!("join {group}: {e}"))?;
            s.set_read_timeout(Some(Duration::from_millis(50)))
                .map_err(|e| e.to_string())?;
            let big: libc::c_int = 16 << 20;
            // SAFETY: setsockopt with a c_int option value we own, on our socket.
            unsafe {
                libc::setsockopt(
                    std::os::fd::AsRawFd::as_raw_fd(&s),
                    libc::SOL_SOCKET,
                    libc::SO_RCVBUFFORCE,
                    (&big as *const libc::c_int).cast(),
                    size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            let mut t = Tally::new("kernel socket", n);
            ready2.wait();
            let cpu0 = thread_cpu_ns();
            let mut buf = [0u8; 2048];
            let mut idle_since: Option<Instant> = None;
            let start = Instant::now();
            while !t.complete() && start.elapsed() < DEADLINE {
                match s.recv(&mut buf) {
                    Ok(len) => {
                        t.take(&buf[..len], now_ns());
                        idle_since = None;
                    }
                    Err(_) if done2.load(Ordering::Acquire) => {
                        let since = *idle_since.get_or_insert_with(Instant::now);
                        if since.elapsed() > GRACE {
                            break;
                        }
                    }
                    Err(_) => {}
                }
            }
            t.cpu_ns = thread_cpu_ns() - cpu0;
            Ok(t)
        })
    });
    // The sender, in the namespace, once the socket receiver has joined.
    let (rate, done3, ready3) = (o.rate, sender_done.clone(), ready.clone());
    let ns3 = ns.to_owned();
    let sender = std::thread::spawn(move || {
        mlx5_emu::in_netns(&ns3, move || -> Result<(), String> {
            let s = UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::from(NS_HOST_IP), 0))
                .map_err(|e| format!("sender bind: {e}"))?;
            s.set_multicast_ttl_v4(1).map_err(|e| e.to_string())?;
            s.set_multicast_loop_v4(true).map_err(|e| e.to_string())?;
            ready3.wait();
            let to = SocketAddrV4::new(group, port);
            let period = 1_000_000_000 / rate;
            let t0 = now_ns();
            let mut msg = [0u8; 64];
            for seq in 0..n {
                let due = t0 + seq * period;
                loop {
                    let now = now_ns();
                    if now >= due {
                        break;
                    }
                    if due - now > 200_000 {
                        std::thread::sleep(Duration::from_nanos(due - now - 100_000));
                    } else {
                        std::thread::yield_now();
                    }
                }
                msg[..8].copy_from_slice(&seq.to_be_bytes());
                msg[8..16].copy_from_slice(&now_ns().to_be_bytes());
                // A full socket buffer (ENOBUFS) is retried: the feed sends every packet.
                let mut tries = 0;
                while let Err(e) = s.send_to(&msg, to) {
                    tries += 1;
                    if tries > 1000 {
                        done3.store(true, Ordering::Release);
                        return Err(format!("send of seq {seq}: {e}"));
                    }
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
            done3.store(true, Ordering::Release);
            Ok(())
        })
    });

    // The raw receiver, on this thread.
    let mut raw = Tally::new("raw QP", o.packets);
    let mut app_lat: Vec<i64> = Vec::with_capacity(o.packets as usize);
    let mut other = 0u64;
    let mut on_frame = |f: &RxFrame, d: &RxData<'_>| {
        let at = now_ns();
        let mut hdr = [0u8; 64];
        let len = d.read(0, &mut hdr);
        if f.l3 != L3Type::Ipv4 || f.l4 != L4Type::Udp || len < 34 {
            other += 1;
            return;
        }
        let ihl = usize::from(hdr[14] & 0x0f) * 4;
        let mut payload = [0u8; 16];
        if d.read(14 + ihl + 8, &mut payload) < 16 {
            raw.bad += 1;
            return;
        }
        let nic = f.timestamp_ns as i64 + offset;
        let before = raw.lat_ns.len();
        raw.take(&payload, nic.max(0) as u64);
        if raw.lat_ns.len() > before {
            let sent = u64::from_be_bytes(payload[8..16].try_into().unwrap_or_default());
            app_lat.push(at as i64 - sent as i64);
        }
    };
    let cpu0 = thread_cpu_ns();
    let start = Instant::now();
    let mut idle_since: Option<Instant> = None;
    let mut empty = 0u32;
    let mut received = 0u64;
    while received < o.packets && start.elapsed() < DEADLINE {
        let got = qp.recv_batch(&mut rcq, 64, &mut on_frame)?;
        if got > 0 {
            received += got as u64;
            idle_since = None;
            empty = 0;
            continue;
        }
        if sender_done.load(Ordering::Acquire) {
            let since = *idle_since.get_or_insert_with(Instant::now);
            if since.elapsed() > GRACE {
                break;
            }
        }
        // Busy polling, then (after a run of empty polls) arm the CQ and block on its
        // completion channel, as the socket receiver blocks in recv: on a machine with fewer
        // cores than busy threads the scheduler would otherwise starve a pure poller (a
        // trading host pins it to a core of its own instead).
        empty += 1;
        if empty < SPIN_POLLS {
            std::hint::spin_loop();
            continue;
        }
        empty = 0;
        rcq.req_notify(false);
        // A frame that completed before the arm raised no event: look once more.
        let got = qp.recv_batch(&mut rcq, 64, &mut on_frame)?;
        received += got as u64;
        if got == 0 {
            rcq.wait(&chan, 1)?;
        }
    }
    raw.cpu_ns = thread_cpu_ns() - cpu0;
    sender.join().map_err(|_| "sender panicked")???;
    let mut kern = kernel.join().map_err(|_| "socket receiver panicked")???;

    println!(
        "{:<18} {:>9} {:>6} {:>5} {:>9} {:>9} {:>9} {:>9} {:>9} {:>11}",
        "receiver",
        "received",
        "gaps",
        "dup",
        "p50 us",
        "p90 us",
        "p99 us",
        "p99.9 us",
        "max us",
        "cpu ns/pkt"
    );
    let mut nic_lat = std::mem::take(&mut raw.lat_ns);
    println!("{}", row("raw QP (NIC ts)", &raw, &mut nic_lat));
    println!("{}", row("raw QP (app)", &raw, &mut app_lat));
    let mut k_lat = std::mem::take(&mut kern.lat_ns);
    println!("{}", row("kernel socket", &kern, &mut k_lat));
    let mut all = true;
    for t in [&raw, &kern] {
        let gaps = t.gaps();
        let missing: u64 = gaps.iter().map(|(a, b)| b - a + 1).sum();
        if gaps.is_empty() {
            println!("{}: no gaps", t.name);
        }
        for (a, b) in gaps.iter().take(50) {
            if a == b {
                println!("{}: gap at seq {a}", t.name);
            } else {
                println!("{}: gap seq {a}..={b} ({} packets)", t.name, b - a + 1);
            }
        }
        if gaps.len() > 50 {
            println!("{}: ... {} more gaps", t.name, gaps.len() - 50);
        }
        let accounted = t.received() + missing;
        println!(
            "{}: accounted for {accounted} of {} (received {}, in gaps {missing}, duplicates {}, foreign {})",
            t.name,
            o.packets,
            t.received(),
            t.dups,
            t.bad
        );
        all &= accounted == o.packets && t.received() > 0;
    }
    if other > 0 {
        println!("raw QP: {other} frames that were not IPv4/UDP");
    }
    let c = emu.counters(0);
    println!(
        "device: raw_rx_frames {} rx_steer_missed {} out_of_buffer {}",
        c.raw_rx_frames, c.rx_steer_missed, c.out_of_buffer
    );
    Ok(all)
}

fn main() {
    let o = match opts() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("md_feed: {e}");
            std::process::exit(2);
        }
    };
    let ns = format!("m5feed{}", std::process::id());
    let ifname = "m5feed0";
    if let Err(e) = mlx5_emu::net_up(&ns, ifname) {
        eprintln!("md_feed: {e}");
        std::process::exit(2);
    }
    let r = run(&o, &ns, ifname);
    let down = mlx5_emu::net_down(&ns);
    match r {
        Ok(true) => println!("md_feed: ok"),
        Ok(false) => {
            eprintln!("md_feed: packets unaccounted for");
            std::process::exit(1);
        }
        Err(e) => {
            eprintln!("md_feed: {e}");
            std::process::exit(1);
        }
    }
    if let Err(e) = down {
        eprintln!("md_feed: {e}");
        std::process::exit(1);
    }
}
