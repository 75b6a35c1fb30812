//! The measurement loops of `lat` and `bw`, written against [`Side`]: one end of a connected RC
//! QP pair with its CQs and buffer. The driver-backed implementation lives in `backend`; a fake
//! in the tests checks the loops' bookkeeping (how many WRs, which are signaled, how many
//! doorbells).
//!
//! Latency follows perftest: the initiator timestamps each post; a sample is the time between
//! consecutive posts, i.e. one full round trip, divided by 2 for SEND and WRITE.

use std::time::{Duration, Instant};

use crate::cli::PollMode;
use crate::progress::Progress;

/// What one work request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// SEND into the peer's posted receive.
    Send,
    /// RDMA WRITE into the peer's buffer.
    Write,
    /// RDMA READ from the peer's buffer.
    Read,
    /// Atomic fetch-and-add on the peer's first 8 bytes.
    FetchAdd,
    /// Atomic compare-and-swap on the peer's first 8 bytes.
    CmpSwap,
}

/// One send-queue work request as the loops describe it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wr {
    /// Operation.
    pub op: Op,
    /// Payload bytes (8 for atomics).
    pub len: u32,
    /// Ask for a CQE.
    pub signaled: bool,
    /// Copy the payload into the WQE.
    pub inline: bool,
}

/// An error of the run, as text for the user.
pub type BenchResult<T> = Result<T, String>;

/// One end of a connected pair.
pub trait Side {
    /// Posts `wrs` as one chain: one doorbell (BlueFlame or 8-byte, by the side's policy).
    fn post_send(&mut self, wrs: &[Wr]) -> BenchResult<()>;
    /// Posts `n` receives of up to `len` bytes each.
    fn post_recv(&mut self, n: u32, len: u32) -> BenchResult<()>;
    /// Receives posted and not yet completed (left over from an earlier run, too).
    fn recv_outstanding(&self) -> u32;
    /// Tops the receive queue up to `n` outstanding receives.
    fn ensure_recv(&mut self, n: u32, len: u32) -> BenchResult<()> {
        let have = self.recv_outstanding();
        if have < n {
            self.post_recv(n - have, len)
        } else {
            Ok(())
        }
    }
    /// Polls the send CQ for up to `max` completions; an error completion is an error.
    fn poll_send(&mut self, max: usize) -> BenchResult<usize>;
    /// Polls the receive CQ likewise.
    fn poll_recv(&mut self, max: usize) -> BenchResult<usize>;
    /// Requests an event for the next completion on the send (`recv == false`) or receive CQ.
    fn arm(&mut self, recv: bool) -> BenchResult<()>;
    /// Blocks until the armed CQ's completion channel reports an event, and acknowledges it.
    fn wait_event(&mut self, recv: bool) -> BenchResult<()>;
    /// Volatile read of byte `off` of the local buffer (write latency polls it).
    fn read_byte(&self, off: usize) -> u8;
    /// Writes byte `off` of the local buffer (the payload of the next WRITE).
    fn write_byte(&mut self, off: usize, v: u8);
    /// Copies `out.len()` bytes of the receive area from `off` into `out`.
    fn read_rx(&self, off: usize, out: &mut [u8]) {
        for (i, b) in out.iter_mut().enumerate() {
            *b = self.read_byte(off + i);
        }
    }
    /// Writes `data` into the receive area at `off` (ibv_rc_pingpong's single buffer: what
    /// the next SEND echoes).
    fn write_rx(&mut self, off: usize, data: &[u8]);
}

/// Waits for at least one completion on one CQ of `side` in `mode`; returns how many came.
/// Waits for ever: see [`wait_cq_for`].
pub fn wait_cq<S: Side + ?Sized>(side: &mut S, recv: bool, mode: PollMode) -> BenchResult<usize> {
    wait_cq_for(side, recv, mode, None)
}

/// As [`wait_cq`], failing when nothing completes within `patience` (a peer that vanished,
/// a message an unreliable transport lost). The clock is read once every 1024 empty polls.
pub fn wait_cq_for<S: Side + ?Sized>(
    side: &mut S,
    recv: bool,
    mode: PollMode,
    patience: Option<Duration>,
) -> BenchResult<usize> {
    let poll = |s: &mut S| {
        if recv {
            s.poll_recv(16)
        } else {
            s.poll_send(16)
        }
    };
    let deadline = patience.map(|d| Instant::now() + d);
    let mut empty = 0u32;
    loop {
        let n = poll(side)?;
        if n > 0 {
            return Ok(n);
        }
        empty = empty.wrapping_add(1);
        if let Some(t) = deadline
            && (empty % 1024 == 0 || mode != PollMode::Busy)
            && Instant::now() > t
        {
            let what = if recv { "receive" } else { "send" };
            return Err(format!(
                "no {what} completion for {:.0} s: the peer is gone or a message was lost \
                 (--peer_timeout)",
                patience.unwrap_or_default().as_secs_f64()
            ));
        }
        match mode {
            PollMode::Busy => std::hint::spin_loop(),
            PollMode::Interval(us) => std::thread::sleep(Duration::from_micros(us)),
            PollMode::Event => {
                side.arm(recv)?;
                // A completion may have arrived between the poll and the arm.
                let n = poll(side)?;
                if n > 0 {
                    return Ok(n);
                }
                side.wait_event(recv)?;
            }
        }
    }
}

/// Parameters of one run at one message size.
#[derive(Debug, Clone, Copy)]
pub struct RunParams {
    /// Message size.
    pub size: u32,
    /// Iterations (ignored when `duration` is set).
    pub iters: u64,
    /// Run for this long instead.
    pub duration: Option<Duration>,
    /// Messages up to this size go inline.
    pub inline_max: u32,
    /// Send queue depth (bandwidth: outstanding WRs).
    pub tx_depth: u32,
    /// WRs per doorbell.
    pub post_list: u32,
    /// One signaled WR every `cq_mod`.
    pub cq_mod: u32,
    /// Completion wait mode.
    pub poll: PollMode,
    /// Unmeasured iterations first.
    pub warm_up: u64,
    /// Longest wait for anything from the peer (`None`: for ever).
    pub patience: Option<Duration>,
    /// Receives a SEND bandwidth server keeps posted (`-r`).
    pub rx_depth: u32,
}

impl RunParams {
    fn inline(&self, op: Op) -> bool {
        matches!(op, Op::Send | Op::Write) && self.size <= self.inline_max
    }
}

/// Raw latency samples in microseconds (already divided for RTT/2 tests).
#[derive(Debug, Clone, Default)]
pub struct LatRun {
    /// Samples, one per iteration.
    pub samples_us: Vec<f64>,
}

/// Time-limited or count-limited loop control.
struct Limit {
    iters: u64,
    until: Option<Instant>,
}

impl Limit {
    fn new(p: &RunParams) -> Self {
        Self {
            iters: p.iters,
            until: p.duration.map(|d| Instant::now() + d),
        }
    }
    fn more(&self, done: u64) -> bool {
        match self.until {
            Some(t) => done % 64 != 0 || Instant::now() < t,
            None => done < self.iters,
        }
    }
}

/// One side's half of a SEND/WRITE ping-pong iteration `n`: post the message (for WRITE,
/// stamped with the iteration in its last byte) and, when it is signaled, reap its CQE.
fn pp_send(s: &mut dyn Side, op: Op, n: u64, p: &RunParams) -> BenchResult<()> {
    let size = p.size.max(1);
    let signaled = (n + 1) % u64::from(p.cq_mod.max(1)) == 0;
    if op == Op::Write {
        s.write_byte((size - 1) as usize, (n as u8).wrapping_add(1));
    }
    s.post_send(&[Wr {
        op,
        len: size,
        signaled,
        inline: p.inline(op),
    }])?;
    if signaled {
        wait_cq_for(s, false, p.poll, p.patience)?;
    }
    Ok(())
}

/// The other half: wait for the peer's message of iteration `n` (a receive completion, or for
/// WRITE the stamp in the last byte of the local buffer) and re-post the receive.
fn pp_receive(s: &mut dyn Side, op: Op, n: u64, p: &RunParams) -> BenchResult<()> {
    let size = p.size.max(1);
    if op == Op::Send {
        wait_cq_for(s, true, p.poll, p.patience)?;
        return s.post_recv(1, size);
    }
    let last = (size - 1) as usize;
    let want = (n as u8).wrapping_add(1);
    let deadline = Instant::now() + p.patience.unwrap_or(Duration::from_secs(5));
    let mut spins = 0u32;
    while s.read_byte(last) != want {
        std::hint::spin_loop();
        spins = spins.wrapping_add(1);
        if spins % 1024 == 0 && Instant::now() > deadline {
            return Err(format!(
                "iteration {n}: the peer's RDMA WRITE never arrived"
            ));
        }
    }
    Ok(())
}

/// The measured ping-pong loop: `step(n)` runs iteration `n`; the post times of the measured
/// iterations (after `warm_up`) plus the end time are returned.
fn pp_loop(
    p: &RunParams,
    label: &str,
    mut step: impl FnMut(u64) -> BenchResult<()>,
) -> BenchResult<Vec<Instant>> {
    let mut stamps: Vec<Instant> = Vec::with_capacity(p.iters.min(1 << 26) as usize + 1);
    let mut progress = Progress::for_run(label, p.iters, p.duration);
    let limit = Limit::new(p);
    let mut iter = 0u64;
    while iter < p.warm_up || limit.more(iter - p.warm_up) {
        if iter >= p.warm_up {
            stamps.push(Instant::now());
        }
        step(iter)?;
        iter += 1;
        progress.tick(iter.saturating_sub(p.warm_up));
    }
    stamps.push(Instant::now());
    Ok(stamps)
}

/// Latency of SEND or WRITE ping-pong between `a` (initiator) and `b` (responder) driven from
/// one thread: `a` posts, `b` sees it and answers, `a` sees the answer. For WRITE each side
/// detects the peer's write by polling the last byte of its buffer, as perftest does; the sender
/// stamps an iteration number into that byte.
pub fn lat_pingpong(
    op: Op,
    a: &mut dyn Side,
    b: &mut dyn Side,
    p: &RunParams,
    label: &str,
) -> BenchResult<LatRun> {
    debug_assert!(matches!(op, Op::Send | Op::Write));
    if op == Op::Send {
        // keep a receive posted ahead on each side
        a.ensure_recv(1, p.size)?;
        b.ensure_recv(1, p.size)?;
    }
    let stamps = pp_loop(p, label, |n| {
        pp_send(a, op, n, p)?;
        pp_receive(b, op, n, p)?;
        pp_send(b, op, n, p)?;
        pp_receive(a, op, n, p)
    })?;
    Ok(LatRun {
        samples_us: deltas(&stamps, 2.0),
    })
}

/// One side of a SEND/WRITE ping-pong with a peer in another process. The side that
/// `sends_first` posts, then waits for the answer; the other waits, then answers (perftest: the
/// client sends first in SEND latency, the server in WRITE latency). Samples are the times
/// between this side's posts, halved; the side that waits first has one sample fewer than
/// iterations. Receives must already be posted on both sides.
pub fn lat_remote(
    op: Op,
    s: &mut dyn Side,
    p: &RunParams,
    label: &str,
    sends_first: bool,
) -> BenchResult<LatRun> {
    lat_remote_checked(op, s, p, label, sends_first, &mut |_, _| Ok(()))
}

/// [`lat_remote`] with `on_receive(side, n)` called after the peer's message of iteration `n`
/// has arrived and before this side answers it (ping-pong `-c`: check it, or tamper with it).
pub fn lat_remote_checked(
    op: Op,
    s: &mut dyn Side,
    p: &RunParams,
    label: &str,
    sends_first: bool,
    on_receive: &mut dyn FnMut(&mut dyn Side, u64) -> BenchResult<()>,
) -> BenchResult<LatRun> {
    let stamps = if sends_first {
        pp_loop(p, label, |n| {
            pp_send(s, op, n, p)?;
            pp_receive(s, op, n, p)?;
            on_receive(s, n)
        })?
    } else {
        let mut stamps = Vec::with_capacity(p.iters.min(1 << 26) as usize);
        let mut progress = Progress::new(label, p.iters);
        for n in 0..p.warm_up + p.iters {
            pp_receive(s, op, n, p)?;
            on_receive(s, n)?;
            if n >= p.warm_up {
                stamps.push(Instant::now());
            }
            pp_send(s, op, n, p)?;
            progress.tick(n.saturating_sub(p.warm_up));
        }
        stamps
    };
    Ok(LatRun {
        samples_us: deltas(&stamps, 2.0),
    })
}

/// Latency of READ or atomic round trips from `a` against `b`'s buffer: each iteration posts
/// one signaled WR and waits for its completion. Samples are full round trips.
pub fn lat_rtt(op: Op, a: &mut dyn Side, p: &RunParams, label: &str) -> BenchResult<LatRun> {
    let len = if matches!(op, Op::FetchAdd | Op::CmpSwap) {
        8
    } else {
        p.size.max(1)
    };
    let mut stamps: Vec<Instant> = Vec::with_capacity(p.iters as usize + 1);
    let mut progress = Progress::for_run(label, p.iters, p.duration);
    let limit = Limit::new(p);
    let mut iter = 0u64;
    while iter < p.warm_up || limit.more(iter - p.warm_up) {
        if iter >= p.warm_up {
            stamps.push(Instant::now());
        }
        a.post_send(&[Wr {
            op,
            len,
            signaled: true,
            inline: false,
        }])?;
        wait_cq_for(a, false, p.poll, p.patience)?;
        iter += 1;
        progress.tick(iter.saturating_sub(p.warm_up));
    }
    stamps.push(Instant::now());
    Ok(LatRun {
        samples_us: deltas(&stamps, 1.0),
    })
}

fn deltas(stamps: &[Instant], div: f64) -> Vec<f64> {
    stamps
        .windows(2)
        .map(|w| (w[1] - w[0]).as_secs_f64() * 1e6 / div)
        .collect()
}

/// The receiving side of a SEND bandwidth test with the sender in another process: keeps
/// `tx_depth` receives posted and reaps `p.iters` of them.
pub fn bw_server(s: &mut dyn Side, p: &RunParams, label: &str) -> BenchResult<BwRun> {
    let size = p.size.max(1);
    s.ensure_recv(p.rx_depth.max(p.tx_depth).max(1), size)?;
    let mut progress = Progress::new(label, p.iters);
    let mut received = 0u64;
    let mut run = BwRun::receiving(p.iters);
    let base = Instant::now();
    while received < p.iters {
        let r = wait_cq_for(s, true, p.poll, p.patience)
            .map_err(|e| format!("{e}; {received} of {} SENDs received", p.iters))?;
        run.received(base, r);
        received += r as u64;
        s.post_recv(r as u32, size)?;
        progress.tick(received);
    }
    Ok(run)
}

/// Polls without a completion before the clock is read for `patience` (as [`wait_cq_for`]).
const EMPTY_POLLS_PER_CLOCK: u32 = 1024;

/// Fails when nothing happened for `patience` since `last`; reads the clock only every
/// [`EMPTY_POLLS_PER_CLOCK`] empty rounds (or every round when not busy polling).
fn idle(
    empty: &mut u32,
    last: Instant,
    p: &RunParams,
    what: &str,
    done: u64,
    total: u64,
) -> BenchResult<()> {
    *empty = empty.wrapping_add(1);
    if let Some(d) = p.patience
        && (*empty % EMPTY_POLLS_PER_CLOCK == 0 || p.poll != PollMode::Busy)
        && last.elapsed() > d
    {
        return Err(format!(
            "no {what} completion for {:.0} s on any QP: the peer is gone or a message was \
             lost (--peer_timeout); {done} of {total} done",
            d.as_secs_f64()
        ));
    }
    match p.poll {
        PollMode::Interval(us) => std::thread::sleep(Duration::from_micros(us)),
        _ => std::hint::spin_loop(),
    }
    Ok(())
}

/// `-q N` with a peer in another process: receives SENDs on every QP until each has had
/// `iters` (perftest's `run_iter_bw_server` over all its QPs). Every QP keeps
/// `max(rx_depth, tx_depth)` receives posted, as [`bw_server`]. Busy or interval polling
/// over all receive CQs (no completion channel waits on several CQs).
pub fn bw_server_multi(
    qps: &mut [&mut dyn Side],
    p: &RunParams,
    label: &str,
) -> BenchResult<BwRun> {
    if p.poll == PollMode::Event {
        return Err("-e with -q N: events wait on one CQ; poll instead (--poll)".into());
    }
    let size = p.size.max(1);
    for s in qps.iter_mut() {
        s.ensure_recv(p.rx_depth.max(p.tx_depth).max(1), size)?;
    }
    let total = p.iters.saturating_mul(qps.len() as u64);
    let mut received = vec![0u64; qps.len()];
    let mut all = 0u64;
    let mut progress = Progress::new(label, total);
    let mut run = BwRun::receiving(total);
    let base = Instant::now();
    let (mut last, mut empty) = (base, 0u32);
    while all < total {
        let mut any = false;
        for (q, s) in qps.iter_mut().enumerate() {
            if received[q] >= p.iters {
                continue;
            }
            let r = s.poll_recv(16)?;
            if r > 0 {
                any = true;
                run.received(base, r);
                received[q] += r as u64;
                all += r as u64;
                s.post_recv(r as u32, size)?;
            }
        }
        if any {
            progress.tick(all);
            last = Instant::now();
        } else {
            idle(&mut empty, last, p, "receive", all, total)?;
        }
    }
    Ok(run)
}

/// `-q N` with a peer in another process: streams `op` over every QP as perftest's
/// `run_iter_bw` does. Each QP in turn posts while its own send queue has room (up to
/// `tx_depth` outstanding), `post_list` WRs at a time, `iters` WRs in all, one signaled every
/// `cq_mod` of its own and always its last; then every send CQ is polled. The post and the
/// completion times of all QPs go into one sequence each, in the order they happened
/// (perftest's `tposted`/`tcompleted` over `iters * N` messages), so the figures computed from
/// them are the sum over the QPs, as perftest reports them.
pub fn bw_stream_multi(
    op: Op,
    qps: &mut [&mut dyn Side],
    p: &RunParams,
    label: &str,
) -> BenchResult<BwRun> {
    if p.duration.is_some() {
        return Err("-D with -q N: not supported yet; use -n".into());
    }
    if p.poll == PollMode::Event {
        return Err("-e with -q N: events wait on one CQ; poll instead (--poll)".into());
    }
    if p.warm_up > 0 {
        let w = RunParams {
            iters: p.warm_up,
            warm_up: 0,
            ..*p
        };
        bw_stream_multi(op, qps, &w, label)?;
    }
    let size = p.size.max(1);
    let tx_depth = u64::from(p.tx_depth.max(1));
    let post_list = u64::from(p.post_list.max(1)).min(tx_depth);
    let cq_mod = u64::from(p.cq_mod.max(1)).min(tx_depth - post_list + 1);
    let iters = p.iters;
    let total = iters.saturating_mul(qps.len() as u64);
    let (mut posted, mut completed) = (vec![0u64; qps.len()], vec![0u64; qps.len()]);
    let mut done = 0u64;
    let cap = total.min(1 << 24) as usize;
    let (mut posted_ns, mut completed_ns) = (Vec::with_capacity(cap), Vec::with_capacity(cap));
    let mut progress = Progress::new(label, total);
    let mut wrs = Vec::with_capacity(post_list as usize);
    let base = Instant::now();
    let (mut last, mut empty) = (base, 0u32);
    while done < total {
        for (q, s) in qps.iter_mut().enumerate() {
            while posted[q] < iters
                && posted[q] - completed[q] + post_list.min(iters - posted[q]) <= tx_depth
            {
                let n = post_list.min(iters - posted[q]);
                wrs.clear();
                wrs.extend((posted[q]..posted[q] + n).map(|idx| Wr {
                    op,
                    len: size,
                    signaled: (idx + 1) % cq_mod == 0 || idx + 1 == iters,
                    inline: p.inline(op),
                }));
                posted_ns.extend(std::iter::repeat_n(
                    base.elapsed().as_nanos() as u64,
                    n as usize,
                ));
                s.post_send(&wrs)?;
                posted[q] += n;
            }
        }
        let mut any = false;
        for (q, s) in qps.iter_mut().enumerate() {
            let c = s.poll_send(16)?;
            if c == 0 {
                continue;
            }
            any = true;
            let now = base.elapsed().as_nanos() as u64;
            for _ in 0..c {
                // a CQE retires this QP's WRs up to and including its next signaled one
                let next = ((completed[q] / cq_mod + 1) * cq_mod)
                    .min(iters)
                    .min(posted[q]);
                let retire = next - completed[q];
                completed[q] = next;
                done += retire;
                completed_ns.extend(std::iter::repeat_n(now, retire as usize));
            }
        }
        if any {
            progress.tick(done);
            last = Instant::now();
        } else {
            idle(&mut empty, last, p, "send", done, total)?;
        }
    }
    Ok(BwRun {
        posted_ns,
        completed_ns,
    })
}

/// Raw bandwidth data: each message's post and completion time, ns from the start.
#[derive(Debug, Clone, Default)]
pub struct BwRun {
    /// Post time of every message (ns); the messages of one post list share it.
    pub posted_ns: Vec<u64>,
    /// Completion time of every message (ns); with CQ moderation, the messages retired by one
    /// CQE share its time.
    pub completed_ns: Vec<u64>,
}

impl BwRun {
    /// The record of a SEND bandwidth server: perftest's `run_iter_bw_server` starts its clock
    /// at the first receive completion and stops it at the last, so `posted_ns` holds that
    /// first time only and `completed_ns` the time of every receive.
    fn receiving(expected: u64) -> Self {
        Self {
            posted_ns: Vec::with_capacity(1),
            completed_ns: Vec::with_capacity(expected.min(1 << 24) as usize),
        }
    }

    /// `n` receives completed now.
    fn received(&mut self, base: Instant, n: usize) {
        let now = base.elapsed().as_nanos() as u64;
        if self.posted_ns.is_empty() {
            self.posted_ns.push(now);
        }
        self.completed_ns.extend(std::iter::repeat_n(now, n));
    }
}

/// Streams `op` from `a` to `b`: keeps up to `tx_depth` WRs outstanding, posted `post_list` at
/// a time, one signaled every `cq_mod` (and always the last). For SEND, `b` keeps `tx_depth`
/// receives posted and `a` never posts more SENDs than `b` has receives for. With `b` in
/// another process (`None`), SENDs that find no receive are retried by the RC transport (RNR)
/// and dropped by UC and UD (the server then reports how many arrived).
pub fn bw_stream(
    op: Op,
    a: &mut dyn Side,
    mut b: Option<&mut dyn Side>,
    p: &RunParams,
    label: &str,
) -> BenchResult<BwRun> {
    if p.warm_up > 0 {
        // --perform_warm_up: an unmeasured run first, as perftest's WRITE/READ bandwidth
        let w = RunParams {
            iters: p.warm_up,
            duration: None,
            warm_up: 0,
            ..*p
        };
        let peer: Option<&mut dyn Side> = match b {
            Some(ref mut x) => Some(&mut **x),
            None => None,
        };
        bw_stream(op, a, peer, &w, label)?;
    }
    let size = p.size.max(1);
    let tx_depth = u64::from(p.tx_depth.max(1));
    let post_list = u64::from(p.post_list.max(1)).min(tx_depth);
    // When no further post list fits, a signaled WR must be outstanding, or no CQE would ever
    // free the send queue: at most tx_depth - post_list + 1 WRs per CQE.
    let cq_mod = u64::from(p.cq_mod.max(1)).min(tx_depth - post_list + 1);
    let mut total = if p.duration.is_some() {
        u64::MAX
    } else {
        p.iters
    };
    let rx_depth = p.tx_depth.max(1);
    // SENDs are gated by the responder's receives only when it runs in this thread
    let local_send = op == Op::Send && b.is_some();
    if let Some(b) = b.as_deref_mut().filter(|_| local_send) {
        b.ensure_recv(rx_depth, size)?;
    }
    let base = Instant::now();
    let until = p.duration.map(|d| base + d);
    let (mut posted, mut completed, mut received) = (0u64, 0u64, 0u64);
    let mut completed_ns = Vec::with_capacity(p.iters.min(1 << 24) as usize);
    let mut posted_ns = Vec::with_capacity(p.iters.min(1 << 24) as usize);
    let mut progress = Progress::for_run(label, p.iters, p.duration);
    let mut wrs = Vec::with_capacity(post_list as usize);
    while completed < total {
        // post while the send queue (and for SEND the peer's receive queue) has room
        while posted < total
            && posted - completed + post_list.min(total - posted) <= tx_depth
            && (!local_send
                || posted + post_list.min(total - posted) <= received + u64::from(rx_depth))
        {
            let n = post_list.min(total - posted);
            wrs.clear();
            wrs.extend((posted..posted + n).map(|idx| Wr {
                op,
                len: size,
                signaled: (idx + 1) % cq_mod == 0 || idx + 1 == total,
                inline: p.inline(op),
            }));
            posted_ns.extend(std::iter::repeat_n(
                base.elapsed().as_nanos() as u64,
                n as usize,
            ));
            a.post_send(&wrs)?;
            posted += n;
            if let Some(t) = until
                && total == u64::MAX
                && Instant::now() >= t
            {
                // finish at the next signaled boundary
                total = posted.div_ceil(cq_mod) * cq_mod;
            }
        }
        if let Some(b) = b.as_deref_mut().filter(|_| local_send) {
            let r = b.poll_recv(64)?;
            if r > 0 {
                received += r as u64;
                b.post_recv(r as u32, size)?;
            }
        }
        let sq_blocked = posted == total || posted - completed + post_list > tx_depth;
        let c = if sq_blocked && !local_send && p.poll != PollMode::Busy {
            wait_cq_for(a, false, p.poll, p.patience)?
        } else {
            a.poll_send(16)?
        };
        if c > 0 {
            let now = base.elapsed().as_nanos() as u64;
            for _ in 0..c {
                // a CQE retires everything up to and including the next signaled WR
                let next_signaled = ((completed / cq_mod + 1) * cq_mod).min(total).min(posted);
                let retire = next_signaled - completed;
                completed = next_signaled;
                completed_ns.extend(std::iter::repeat_n(now, retire as usize));
            }
        }
        progress.tick(completed);
    }
    if let Some(b) = b.filter(|_| local_send) {
        // the responder must have seen every SEND
        let deadline = Instant::now() + Duration::from_secs(5);
        while received < posted {
            received += b.poll_recv(64)? as u64;
            if Instant::now() > deadline {
                return Err(format!("only {received} of {posted} SENDs arrived"));
            }
        }
    }
    Ok(BwRun {
        posted_ns,
        completed_ns,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::rc::Rc;

    /// Counters of one fake side.
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    struct Counts {
        doorbells: u64,
        wrs: u64,
        signaled: u64,
        inline: u64,
        arms: u64,
    }

    /// Two sides joined by an instant wire: a posted WR takes effect at once.
    #[derive(Debug, Default)]
    struct Wire {
        bufs: [Vec<u8>; 2],
        recv_posted: [u64; 2],
        recv_cqes: [usize; 2],
        send_cqes: [usize; 2],
        counts: [Counts; 2],
    }

    #[derive(Debug)]
    struct Fake {
        id: usize,
        wire: Rc<RefCell<Wire>>,
    }

    fn pair(size: usize) -> (Fake, Fake, Rc<RefCell<Wire>>) {
        let wire = Rc::new(RefCell::new(Wire::default()));
        wire.borrow_mut().bufs = [vec![0; size], vec![0; size]];
        (
            Fake {
                id: 0,
                wire: wire.clone(),
            },
            Fake {
                id: 1,
                wire: wire.clone(),
            },
            wire,
        )
    }

    impl Side for Fake {
        fn post_send(&mut self, wrs: &[Wr]) -> BenchResult<()> {
            let mut w = self.wire.borrow_mut();
            let (me, peer) = (self.id, 1 - self.id);
            w.counts[me].doorbells += 1;
            for wr in wrs {
                w.counts[me].wrs += 1;
                w.counts[me].signaled += u64::from(wr.signaled);
                w.counts[me].inline += u64::from(wr.inline);
                match wr.op {
                    Op::Send => {
                        if w.recv_posted[peer] == 0 {
                            return Err("RNR: no receive posted".into());
                        }
                        w.recv_posted[peer] -= 1;
                        w.recv_cqes[peer] += 1;
                    }
                    Op::Write => {
                        let last = wr.len as usize - 1;
                        let v = w.bufs[me][last];
                        w.bufs[peer][last] = v;
                    }
                    _ => {}
                }
                if wr.signaled {
                    w.send_cqes[me] += 1;
                }
            }
            Ok(())
        }
        fn post_recv(&mut self, n: u32, _len: u32) -> BenchResult<()> {
            self.wire.borrow_mut().recv_posted[self.id] += u64::from(n);
            Ok(())
        }
        fn recv_outstanding(&self) -> u32 {
            self.wire.borrow().recv_posted[self.id] as u32
        }
        fn poll_send(&mut self, max: usize) -> BenchResult<usize> {
            let mut w = self.wire.borrow_mut();
            let n = w.send_cqes[self.id].min(max);
            w.send_cqes[self.id] -= n;
            Ok(n)
        }
        fn poll_recv(&mut self, max: usize) -> BenchResult<usize> {
            let mut w = self.wire.borrow_mut();
            let n = w.recv_cqes[self.id].min(max);
            w.recv_cqes[self.id] -= n;
            Ok(n)
        }
        fn arm(&mut self, _recv: bool) -> BenchResult<()> {
            self.wire.borrow_mut().counts[self.id].arms += 1;
            Ok(())
        }
        fn wait_event(&mut self, _recv: bool) -> BenchResult<()> {
            Err("the instant wire never needs to wait".into())
        }
        fn read_byte(&self, off: usize) -> u8 {
            self.wire.borrow().bufs[self.id][off]
        }
        fn write_byte(&mut self, off: usize, v: u8) {
            self.wire.borrow_mut().bufs[self.id][off] = v;
        }
        fn write_rx(&mut self, off: usize, data: &[u8]) {
            self.wire.borrow_mut().bufs[self.id][off..off + data.len()].copy_from_slice(data);
        }
    }

    fn params(iters: u64) -> RunParams {
        RunParams {
            size: 2,
            iters,
            duration: None,
            inline_max: 236,
            tx_depth: 1,
            post_list: 1,
            cq_mod: 1,
            poll: PollMode::Busy,
            warm_up: 0,
            patience: None,
            rx_depth: 1,
        }
    }

    #[test]
    fn send_latency_posts_one_doorbell_per_iteration_per_side() {
        let (mut a, mut b, wire) = pair(64);
        let mut p = params(100);
        p.warm_up = 5;
        let run = lat_pingpong(Op::Send, &mut a, &mut b, &p, "t").unwrap();
        assert_eq!(run.samples_us.len(), 100);
        assert!(run.samples_us.iter().all(|&x| x >= 0.0));
        let w = wire.borrow();
        for side in 0..2 {
            assert_eq!(w.counts[side].doorbells, 105);
            assert_eq!(w.counts[side].signaled, 105);
            assert_eq!(w.counts[side].inline, 105);
            // one receive stays posted ahead
            assert_eq!(w.recv_posted[side], 1);
        }
    }

    #[test]
    fn cq_moderation_and_inline_threshold_change_the_wrs() {
        let (mut a, mut b, wire) = pair(64);
        let mut p = params(100);
        p.cq_mod = 10;
        p.size = 32;
        p.inline_max = 16;
        lat_pingpong(Op::Write, &mut a, &mut b, &p, "t").unwrap();
        let w = wire.borrow();
        assert_eq!(w.counts[0].wrs, 100);
        assert_eq!(w.counts[0].signaled, 10);
        assert_eq!(w.counts[0].inline, 0);
    }

    #[test]
    fn bandwidth_post_list_batches_doorbells_and_cq_mod_thins_cqes() {
        let (mut a, mut b, wire) = pair(64);
        let mut p = params(1000);
        p.tx_depth = 64;
        p.post_list = 8;
        p.cq_mod = 16;
        let run = bw_stream(Op::Send, &mut a, Some(&mut b), &p, "t").unwrap();
        assert_eq!(run.completed_ns.len(), 1000);
        assert!(run.completed_ns.windows(2).all(|w| w[0] <= w[1]));
        let w = wire.borrow();
        assert_eq!(w.counts[0].wrs, 1000);
        assert_eq!(w.counts[0].doorbells, 125);
        // every 16th WR, plus the last (1000 is not a multiple of 16)
        assert_eq!(w.counts[0].signaled, 1000 / 16 + 1);
        drop(w);
        // a second run tops the receives up instead of posting another full set
        bw_stream(Op::Send, &mut a, Some(&mut b), &p, "t").unwrap();
        assert_eq!(wire.borrow().recv_posted[1], 64);
    }

    #[test]
    fn bandwidth_never_waits_for_a_cqe_it_cannot_post() {
        // 128 deep, 64 per doorbell, asked for a CQE every 100: without the cap the queue
        // would hold 92 unsignaled WRs and no room for the 100th
        let (mut a, mut b, wire) = pair(64);
        let mut p = params(1000);
        p.tx_depth = 128;
        p.post_list = 64;
        p.cq_mod = 100;
        let run = bw_stream(Op::Read, &mut a, Some(&mut b), &p, "t").unwrap();
        assert_eq!(run.completed_ns.len(), 1000);
        assert_eq!(wire.borrow().counts[0].signaled, 1000 / 65 + 1);
    }

    #[test]
    fn bandwidth_by_duration_stops_on_a_signaled_boundary() {
        let (mut a, mut b, wire) = pair(64);
        let mut p = params(0);
        p.duration = Some(Duration::from_millis(50));
        p.tx_depth = 32;
        p.cq_mod = 8;
        let run = bw_stream(Op::Write, &mut a, Some(&mut b), &p, "t").unwrap();
        let n = run.completed_ns.len() as u64;
        assert!(n > 0 && n % 8 == 0, "{n}");
        assert_eq!(wire.borrow().counts[0].wrs, n);
    }

    #[test]
    fn read_latency_is_one_signaled_wr_per_sample() {
        let (mut a, _b, wire) = pair(64);
        let run = lat_rtt(Op::Read, &mut a, &params(50), "t").unwrap();
        assert_eq!(run.samples_us.len(), 50);
        assert_eq!(wire.borrow().counts[0].signaled, 50);
        assert_eq!(wire.borrow().counts[0].inline, 0);
    }
}
