//! Two real processes, each with its own emulator on the UDP fabric (RoCEv2 on loopback),
//! both injecting faults from a seed (5 % drop, 1 % duplication, 1 % reordering): 100,000
//! RC WRs from one process -- SENDs, with an RDMA READ and a FETCH_ADD in every 16 -- are
//! executed at the other in order and exactly once (every READ returns the peer's bytes,
//! every fetch-add the count of those before it), and the counters show how the transport
//! recovered (timeouts, NAK sequence errors, duplicates).
//!
//! The test binary runs itself a second time as the receiving child (the same test,
//! selected by an environment variable); the two exchange LID and QPN over the child's
//! stdin/stdout. The sender (parent) runs its emulator threaded, so retransmission timers
//! run on real time while the peer process works (a stepped emulator jumps its virtual
//! clock to the next timeout whenever it is idle, i.e. whenever it waits for the other
//! process); the receiver (child) runs its emulator stepped from its own loop, which also
//! replenishes the RQ and checks every message. Drops and duplicates come from both
//! emulators' fault injection; the reordering from a relay ([`Relay`]) in the parent that
//! both sides address each other through, as the emulator sends datagrams to another
//! process in order.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::UdpSocket;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::*;
use mlx5_emu::{Counters, EmuConfig, Emulator, Fabric, FaultConfig, RunMode, roce_icrc};
use mlx5_hw::opcodes::SendOpcode;
use mlx5_hw::wqe::{AtomicSeg, DataSeg, FM_CE_SE_CQ_UPDATE, InlineHdr, RaddrSeg};
use zerocopy::IntoBytes;

/// Messages sent.
const N: u64 = 100_000;
/// Environment variable that turns the re-executed test binary into the receiver.
const ROLE: &str = "MLX5_EMU_TWO_PROCESS_ROLE";
/// Marks the lines of the parent/child protocol in the child's stdout (libtest prints too).
const TAG: &str = "MLX5EMU2P";
/// Name of the test, for re-executing exactly it.
const TEST: &str = "rc_over_lossy_udp_between_two_processes_in_order_exactly_once";
/// Sender: send-queue WQEBBs (one 32-byte inline SEND each), WQEs kept outstanding, and
/// one signaled WQE in every `SIGNAL`.
const SQ: u32 = 256;
const SQ_DEPTH: u64 = 32;
const SIGNAL: u64 = 8;
/// Receiver: receive WQEs (one 16-byte slot each) and CQ entries.
const RQ: u32 = 512;
/// Give up (and fail) after this long.
const LIMIT: Duration = Duration::from_secs(150);
/// Relay: probability (ppm) that a datagram is held back behind the next one.
const RELAY_REORDER_PPM: u64 = 10_000;
/// Of every 16 WRs, the one at this position is an RDMA READ of 8 bytes, and the one at
/// `FA_AT` a FETCH_ADD of 1; the others are SENDs.
const READ_AT: u64 = 5;
const FA_AT: u64 = 11;
/// The child's READ source (pattern) and the fetch-add word after it.
const REMOTE: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wr {
    Send,
    Read,
    FetchAdd,
}

fn kind(seq: u64) -> Wr {
    match seq % 16 {
        READ_AT => Wr::Read,
        FA_AT => Wr::FetchAdd,
        _ => Wr::Send,
    }
}

/// WRs of kind `k` among WRs 0..n.
fn count_below(n: u64, k: Wr) -> u64 {
    (0..n).filter(|&s| kind(s) == k).count() as u64
}

/// SENDs among WRs 0..n.
fn sends_below(n: u64) -> u64 {
    count_below(n, Wr::Send)
}

/// The byte at offset `i` of the child's READ source.
fn remote_byte(i: usize) -> u8 {
    (i as u8).wrapping_mul(7).wrapping_add(3)
}

/// Child pid, for the parent's watchdog to kill it.
static CHILD_PID: AtomicU32 = AtomicU32::new(0);

/// A reordering relay between the two processes' HCAs. The emulator's own fault injection
/// drops and duplicates datagrams sent to another process but sends them in order, so the
/// relay adds the reordering: each side addresses the other through a relay node (`near`
/// for the sender, `far` for the receiver); the relay forwards every datagram with its
/// ICRC recomputed for the new addresses and holds back [`RELAY_REORDER_PPM`] of them
/// behind the next datagram in the same direction (or ~1 ms if none follows).
struct Relay {
    near: u16,
    far: u16,
    stop: Arc<AtomicBool>,
    reordered: Arc<AtomicU64>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Relay {
    /// Bind two free relay nodes (high LIDs, away from the ones the emulators pick) and
    /// forward between `sender` and `receiver`.
    fn start(sender: u16, receiver: u16, seed: u64) -> Relay {
        let mut socks =
            (240..=254u16).filter_map(|lid| UdpSocket::bind(node_addr(lid)).ok().map(|s| (lid, s)));
        let (near, sn) = socks.next().expect("a free relay node");
        let (far, sf) = socks.next().expect("a second free relay node");
        let stop = Arc::new(AtomicBool::new(false));
        let reordered = Arc::new(AtomicU64::new(0));
        let mut threads = Vec::new();
        // sender -> near ... far -> receiver, and back.
        for (rx, tx, from, to, k) in [
            (&sn, &sf, far, receiver, 1u64),
            (&sf, &sn, near, sender, 2u64),
        ] {
            let rx = rx.try_clone().expect("socket");
            let tx = tx.try_clone().expect("socket");
            rx.set_read_timeout(Some(Duration::from_millis(1)))
                .expect("timeout");
            let (stop, reordered) = (stop.clone(), reordered.clone());
            let mut rng = Rng((seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ k) | 1);
            threads.push(std::thread::spawn(move || {
                let mut buf = [0u8; 4200];
                let mut held: Option<Vec<u8>> = None;
                let dst = node_addr(to);
                while !stop.load(Ordering::SeqCst) {
                    let Ok(len) = rx.recv(&mut buf) else {
                        if let Some(h) = held.take() {
                            let _ = tx.send_to(&h, dst);
                        }
                        continue;
                    };
                    let Some(body) = len.checked_sub(4).map(|n| &buf[..n]) else {
                        continue;
                    };
                    let Some(icrc) = roce_icrc(body, from, to) else {
                        continue;
                    };
                    let mut pkt = body.to_vec();
                    pkt.extend_from_slice(&icrc.to_le_bytes());
                    if let Some(h) = held.take() {
                        let _ = tx.send_to(&pkt, dst);
                        let _ = tx.send_to(&h, dst);
                    } else if rng.below(1_000_000) < RELAY_REORDER_PPM {
                        reordered.fetch_add(1, Ordering::Relaxed);
                        held = Some(pkt);
                    } else {
                        let _ = tx.send_to(&pkt, dst);
                    }
                }
            }));
        }
        Relay {
            near,
            far,
            stop,
            reordered,
            threads,
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn emulator(mode: RunMode, seed: u64) -> Emulator {
    Emulator::new(EmuConfig {
        mode,
        fabric: Fabric::Udp,
        fault: FaultConfig {
            seed,
            drop_ppm: 50_000,
            dup_ppm: 10_000,
            reorder_ppm: 10_000,
            delay_ns: 0,
        },
        ..EmuConfig::default()
    })
}

/// Transport knobs: a ~67 ms ACK timeout (timeout 14: 4.096 us << 14), 7 retries, RNR
/// retried forever. Retries reset on progress, so the QP fails only after 8 timeouts
/// without any progress (~540 ms): a peer process descheduled on a loaded machine must not
/// break the connection (with timeout 13, ~270 ms, it did once under a heavily loaded
/// machine), yet each timeout must be short, as a few hundred happen.
fn knobs() -> Knobs {
    Knobs {
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        min_rnr_timer: 1,
        access: ALL_ACCESS,
    }
}

/// The numbers after `TAG` on a protocol line.
fn fields(line: &str) -> Vec<u64> {
    let at = line.find(TAG).expect("tagged line");
    line[at + TAG.len()..]
        .split_whitespace()
        .map(|v| v.parse().expect("number"))
        .collect()
}

/// End the process (killing the child, if any) if the test has not finished in `secs`:
/// a stalled peer must fail the test, never hang the test run.
fn watchdog(who: &'static str, secs: u64) {
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(secs));
        eprintln!("{who}: not finished in {secs} s, giving up");
        let pid = CHILD_PID.load(Ordering::SeqCst);
        if pid != 0 {
            // SAFETY: plain kill(2) of the child process this test spawned.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        }
        std::process::exit(3);
    });
}

/// The receiver (child process): prints its address, connects, then steps its emulator,
/// keeps the RQ full and checks that message k carries sequence number k.
fn child() {
    watchdog("two-process child", 170);
    let emu = emulator(RunMode::Stepped, 7);
    let lid = emu.hca_info(0).expect("hca 0").lid;
    let mut ctx = Ctx::open(&emu, 0);
    let pd = ctx.alloc_pd();
    let mut cq = ctx.create_cq(2 * RQ, 64, -1);
    let mut qp = ctx.create_qp(pd, &cq, &cq, RC, 16, RQ, None);
    let buf = Buf::new(RQ as usize * 16);
    let (_, lkey, _) = ctx
        .reg_mr(pd, buf.addr(), buf.len as u64, ALL_ACCESS)
        .expect("MR");
    let remote = Buf::new(REMOTE + 64);
    remote.write(0, &(0..REMOTE).map(remote_byte).collect::<Vec<u8>>());
    remote.write(REMOTE, &0u64.to_ne_bytes());
    let (_, _, rkey) = ctx
        .reg_mr(pd, remote.addr(), remote.len as u64, ALL_ACCESS)
        .expect("remote MR");
    let mut out = std::io::stdout().lock();
    writeln!(out, "{TAG} {lid} {} {} {rkey}", qp.qpn, remote.addr()).expect("stdout");
    out.flush().expect("stdout");
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).expect("stdin");
    let peer = fields(&line);
    bring_up(&ctx, &qp, peer[0] as u16, peer[1] as u32, knobs());
    let slot = |i: u64| buf.addr() + (i % u64::from(RQ)) * 16;
    let mut posted = 0u64;
    while posted < u64::from(RQ) {
        qp.post_recv(&[(slot(posted), 16, lkey)]);
        posted += 1;
    }
    writeln!(out, "{TAG} 1").expect("stdout");
    out.flush().expect("stdout");
    // The parent closes our stdin when it is done; until then keep the HCA answering.
    let closed = Arc::new(AtomicBool::new(false));
    let flag = closed.clone();
    std::thread::spawn(move || {
        let mut rest = String::new();
        while std::io::stdin()
            .lock()
            .read_line(&mut rest)
            .is_ok_and(|n| n > 0)
        {}
        flag.store(true, Ordering::SeqCst);
    });
    let t0 = Instant::now();
    let mut got = 0u64;
    let mut next_seq = 0u64;
    let sends = sends_below(N);
    let mut extra = 0u64;
    let mut reported = false;
    while !closed.load(Ordering::SeqCst) {
        let n = emu.step();
        while let Some((d, _)) = cq.poll() {
            let c = decode(&d);
            assert_eq!(
                (c.opcode, c.byte_cnt),
                (2, 8),
                "child: message {got}: {c:?} {:?}",
                emu.counters(0)
            );
            let seq = u64::from_le_bytes(
                buf.read((u64::from(c.wqe_counter) % u64::from(RQ)) as usize * 16, 8)
                    .try_into()
                    .expect("8 bytes"),
            );
            if got >= sends {
                extra += 1;
                continue;
            }
            while kind(next_seq) != Wr::Send {
                next_seq += 1;
            }
            assert_eq!(
                (seq, c.wqe_counter),
                (next_seq, got as u16),
                "child: in order, no gap, no duplicate"
            );
            got += 1;
            next_seq += 1;
            qp.post_recv(&[(slot(posted), 16, lkey)]);
            posted += 1;
        }
        if got == sends && !reported {
            reported = true;
            let c = emu.counters(0);
            writeln!(
                out,
                "{TAG} {got} {} {} {} {} {}",
                c.packets_sent,
                c.packets_dropped,
                c.duplicate_request,
                c.out_of_sequence,
                t0.elapsed().as_millis()
            )
            .expect("stdout");
            out.flush().expect("stdout");
        }
        assert!(
            got == sends || t0.elapsed() < LIMIT,
            "child: only {got} of {sends} messages"
        );
        if n == 0 {
            std::thread::yield_now();
        }
    }
    assert_eq!(got, sends, "child: every message arrived");
    assert_eq!(
        remote.read(REMOTE, 8),
        count_below(N, Wr::FetchAdd).to_ne_bytes(),
        "child: every fetch-add applied once"
    );
    assert_eq!(
        extra, 0,
        "child: nothing arrived twice after the last message"
    );
}

/// The child process; killed (by its pid) if the test fails before it ends.
struct Kid(Child);

impl Drop for Kid {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// The next protocol line from the child's stdout.
fn tagged(r: &mut BufReader<ChildStdout>) -> Vec<u64> {
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            r.read_line(&mut line).expect("child stdout") > 0,
            "child exited early"
        );
        if line.contains(TAG) {
            return fields(&line);
        }
    }
}

/// One 8-byte inline SEND carrying `seq`, signaled if `signaled`. Returns the WQE index.
fn post_seq(qp: &mut Qp, seq: u64, signaled: bool) -> u16 {
    let mut seg = InlineHdr::new(8).as_bytes().to_vec();
    seg.extend_from_slice(&seq.to_le_bytes());
    let ce = if signaled { FM_CE_SE_CQ_UPDATE } else { 0 };
    qp.build_send(SendOpcode::SEND, 0, ce, [0; 4], &seg)
}

/// Where READ `seq` reads in the child's READ source.
fn read_offset(seq: u64) -> usize {
    (seq as usize * 8) % (REMOTE - 8)
}

/// A signaled 8-byte READ (from the child's READ source) or FETCH_ADD (of 1 on the child's
/// word) into local `at`/`lkey`. Returns the WQE index.
fn post_remote(qp: &mut Qp, k: Wr, seq: u64, raddr: u64, rkey: u32, at: u64, lkey: u32) -> u16 {
    let data = DataSeg::new(8, lkey, at);
    let (op, segs) = if k == Wr::Read {
        let r = RaddrSeg::new(raddr + read_offset(seq) as u64, rkey);
        (
            SendOpcode::RDMA_READ,
            [r.as_bytes(), data.as_bytes()].concat(),
        )
    } else {
        let r = RaddrSeg::new(raddr + REMOTE as u64, rkey);
        let a = AtomicSeg::new(1, 0);
        (
            SendOpcode::ATOMIC_FA,
            [r.as_bytes(), a.as_bytes(), data.as_bytes()].concat(),
        )
    };
    qp.build_send(op, 0, FM_CE_SE_CQ_UPDATE, [0; 4], &segs)
}

fn summary(name: &str, c: &Counters) -> String {
    format!(
        "{name}: sent {} dropped {} local_ack_timeout_err {} packet_seq_err {} \
         duplicate_request {} out_of_sequence {}",
        c.packets_sent,
        c.packets_dropped,
        c.local_ack_timeout_err,
        c.packet_seq_err,
        c.duplicate_request,
        c.out_of_sequence
    )
}

#[test]
fn rc_over_lossy_udp_between_two_processes_in_order_exactly_once() {
    if std::env::var(ROLE).as_deref() == Ok("child") {
        child();
        return;
    }
    watchdog("two-process parent", 175);
    let exe = std::env::current_exe().expect("test binary");
    let mut kid = Kid(Command::new(exe)
        .args(["--exact", TEST, "--nocapture", "--test-threads=1"])
        .env(ROLE, "child")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn child"));
    CHILD_PID.store(kid.0.id(), Ordering::SeqCst);
    let mut kid_out = BufReader::new(kid.0.stdout.take().expect("piped"));
    let mut kid_in = kid.0.stdin.take().expect("piped");
    let peer = tagged(&mut kid_out);
    let (clid, cqpn, raddr, rkey) = (peer[0] as u16, peer[1] as u32, peer[2], peer[3] as u32);

    let emu = emulator(RunMode::Threaded, 11);
    let lid = emu.hca_info(0).expect("hca 0").lid;
    assert_ne!(lid, clid, "the two processes are different fabric nodes");
    let mut ctx = Ctx::open(&emu, 0);
    let pd = ctx.alloc_pd();
    let mut cq = ctx.create_cq(64, 64, -1);
    let mut qp = ctx.create_qp(pd, &cq, &cq, RC, SQ, 16, None);
    assert_ne!(qp.qpn, cqpn, "QPNs differ between the nodes");
    // READ targets and fetch-add results: 8 bytes per WR, by sequence number.
    let local = Buf::new(8 * 2 * SQ_DEPTH as usize);
    let (_, lkey, _) = ctx
        .reg_mr(pd, local.addr(), local.len as u64, ALL_ACCESS)
        .expect("local MR");
    let slot = |seq: u64| (seq % (2 * SQ_DEPTH)) as usize * 8;
    let (mut reads, mut fetch_adds) = (0u64, 0u64);
    let relay = Relay::start(lid, clid, 5);
    bring_up(&ctx, &qp, relay.near, cqpn, knobs());
    writeln!(kid_in, "{TAG} {} {}", relay.far, qp.qpn).expect("child stdin");
    kid_in.flush().expect("child stdin");
    assert_eq!(tagged(&mut kid_out), [1], "child connected");

    let t0 = Instant::now();
    let mut sent = 0u64;
    let mut done = 0u64;
    let mut signaled = std::collections::VecDeque::new();
    while done < N {
        let mut last = None;
        while sent < N && sent - done < SQ_DEPTH {
            let k = kind(sent);
            let sig = k != Wr::Send || (sent + 1) % SIGNAL == 0 || sent + 1 == N;
            last = Some(match k {
                Wr::Send => post_seq(&mut qp, sent, sig),
                _ => {
                    let at = local.addr() + slot(sent) as u64;
                    local.write(slot(sent), &[0xEE; 8]);
                    post_remote(&mut qp, k, sent, raddr, rkey, at, lkey)
                }
            });
            if sig {
                signaled.push_back(sent);
            }
            sent += 1;
        }
        if let Some(i) = last {
            qp.ring(&ctx, i, Ring::Doorbell);
        }
        let mut polled = false;
        while let Some((d, _)) = cq.poll() {
            let c = decode(&d);
            let want = signaled
                .pop_front()
                .expect("a signaled WQE was outstanding");
            assert_eq!(
                (c.opcode, c.wqe_counter),
                (0, want as u16),
                "sender: completion of message {want}: {c:?} {}",
                summary("sender", &emu.counters(0))
            );
            let got = local.read(slot(want), 8);
            match kind(want) {
                Wr::Read => {
                    let off = read_offset(want);
                    let exp: Vec<u8> = (off..off + 8).map(remote_byte).collect();
                    assert_eq!(got, exp, "sender: READ {want} returned the peer's bytes");
                    reads += 1;
                }
                Wr::FetchAdd => {
                    assert_eq!(
                        got,
                        fetch_adds.to_ne_bytes(),
                        "sender: fetch-add {want} saw each earlier one once"
                    );
                    fetch_adds += 1;
                }
                Wr::Send => {}
            }
            done = want + 1;
            polled = true;
        }
        assert!(
            t0.elapsed() < LIMIT,
            "sender: only {done} of {N} completed; {}",
            summary("sender", &emu.counters(0))
        );
        if !polled {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let report = tagged(&mut kid_out);
    drop(kid_in);
    let status = kid.0.wait().expect("child status");
    assert!(status.success(), "child failed: {status:?}");
    let s = emu.counters(0);
    let r = Counters {
        packets_sent: report[1],
        packets_dropped: report[2],
        duplicate_request: report[3],
        out_of_sequence: report[4],
        ..Counters::default()
    };
    let retransmitted = s.packets_sent - N;
    let reordered = relay.reordered.load(Ordering::Relaxed);
    drop(relay);
    eprintln!(
        "{N} RC WRs (SEND, READ, FETCH_ADD) across two processes in {secs:.2} s ({:.0}/s): {} packets dropped, \
         {reordered} reordered, {retransmitted} retransmitted; {}; {}",
        N as f64 / secs,
        s.packets_dropped + r.packets_dropped,
        summary("sender", &s),
        summary("receiver", &r)
    );
    assert_eq!(report[0], sends_below(N), "the child received every SEND");
    assert_eq!(
        (reads, fetch_adds),
        (count_below(N, Wr::Read), count_below(N, Wr::FetchAdd)),
        "every READ and fetch-add completed"
    );
    assert!(
        s.packets_dropped > 0 && r.packets_dropped > 0,
        "both sides dropped packets"
    );
    assert!(retransmitted > 0, "losses forced retransmissions");
    assert!(reordered > 0, "the relay reordered datagrams");
    assert!(
        s.local_ack_timeout_err > 0 && s.packet_seq_err > 0,
        "the sender recovered by timeout and by NAK"
    );
    assert!(
        r.duplicate_request > 0 && r.out_of_sequence > 0,
        "the receiver saw duplicates and gaps"
    );
}
