//! `mlx5 tune`: the tuning knobs as an experiment on the current device, one knob at
//! a time from a baseline.
//!
//! Each setting is run `reps` times; each run opens a fresh connected pair (`backend.rs`) and
//! makes two measurements of RC SENDs of one size:
//! - a ping-pong (as `mlx5 lat send`) for the latency percentiles;
//! - a stream (as `mlx5 bw send`) with the setting's SQ depth, post list and signaling
//!   interval, around which the emulated device's counters are read: doorbells, BlueFlame
//!   writes, WQE fetches, payload DMA reads, CQEs and the link traffic as PCIe would carry it
//!   (`tools/emu/src/trace.rs`), each divided by the messages streamed.
//!
//! Then one line per knob judges each setting against the first: the timed figures
//! (message rate, p50, p99, p99.9) are better or worse only beyond the spread measured
//! between the runs ([`judge`]), noisy runs are flagged, and the device figures that moved are
//! named with the reason. CQ moderation is reported as not supported: neither the driver nor
//! the emulated device moderates CQ events.

use std::io::Write;

use serde_json::{Value, json};

use crate::app::TestbedConfig;
use crate::bench::{self, Op, RunParams};
use crate::cli::PollMode;
use crate::stats::LatencyStats;

/// The knobs, in the order they are tried.
pub const KNOBS: [&str; 7] = [
    "inline",
    "sq_depth",
    "post_list",
    "signal_interval",
    "poll",
    "blueflame",
    "cq_moderation",
];

/// One setting of the experiment.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Setting {
    /// Inline threshold (bytes): messages up to it go inline.
    pub inline: u32,
    /// SQ depth (outstanding WRs in the stream).
    pub sq_depth: u32,
    /// WRs per doorbell.
    pub post_list: u32,
    /// One signaled WR every this many.
    pub signal_interval: u32,
    /// How completions are waited for.
    pub poll: PollMode,
    /// BlueFlame allowed.
    pub bf: bool,
    /// A test knob, 0 in every real setting: a busy wait of this many nanoseconds before
    /// every post, on both sides (a setting made slower on purpose, to check the verdicts).
    pub post_delay_ns: u64,
}

/// The baseline every knob starts from.
pub const BASELINE: Setting = Setting {
    inline: 0,
    sq_depth: 128,
    post_list: 1,
    signal_interval: 1,
    poll: PollMode::Busy,
    bf: true,
    post_delay_ns: 0,
};

/// The settings of one knob (the first is the baseline's value).
pub fn settings(knob: &str) -> Vec<(String, Setting)> {
    let b = BASELINE;
    match knob {
        "inline" => [0u32, 64, 128]
            .iter()
            .map(|&v| (v.to_string(), Setting { inline: v, ..b }))
            .collect(),
        "sq_depth" => [128u32, 512, 1024]
            .iter()
            .map(|&v| (v.to_string(), Setting { sq_depth: v, ..b }))
            .collect(),
        "post_list" => [1u32, 8, 32]
            .iter()
            .map(|&v| (v.to_string(), Setting { post_list: v, ..b }))
            .collect(),
        "signal_interval" => [1u32, 16, 64]
            .iter()
            .map(|&v| {
                (
                    v.to_string(),
                    Setting {
                        signal_interval: v,
                        ..b
                    },
                )
            })
            .collect(),
        "poll" => [PollMode::Busy, PollMode::Interval(50), PollMode::Event]
            .iter()
            .map(|&p| {
                let name = match p {
                    PollMode::Busy => "busy".to_owned(),
                    PollMode::Interval(us) => format!("interval:{us}"),
                    PollMode::Event => "event".to_owned(),
                };
                (name, Setting { poll: p, ..b })
            })
            .collect(),
        "blueflame" => [true, false]
            .iter()
            .map(|&v| {
                (
                    if v { "on" } else { "off" }.to_owned(),
                    Setting { bf: v, ..b },
                )
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// Per-message figures of one setting's stream (device counters divided by the messages).
pub const FIGURES: [(&str, &str); 14] = [
    ("doorbells", "doorbells"),
    ("bf_writes", "BlueFlame writes"),
    ("wqe_fetches", "WQE fetch reads"),
    ("wqe_fetch_bytes", "WQE fetch bytes"),
    ("payload_reads", "payload DMA reads"),
    ("payload_read_bytes", "payload read bytes"),
    ("cqes_written", "CQEs"),
    ("mmio_writes", "MMIO writes"),
    ("mmio_bytes", "MMIO bytes"),
    ("dma_read_requests", "DMA read requests"),
    ("dma_read_completions", "DMA read completions"),
    ("dma_read_bytes", "DMA read bytes"),
    ("dma_writes", "DMA writes"),
    ("dma_write_bytes", "DMA write bytes"),
];

/// The timed figures of one run of a setting (they vary from run to run; the device's
/// counters do not).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timed {
    /// Stream rate (messages per second).
    pub msg_rate: f64,
    /// Ping-pong latency p50 (µs).
    pub p50: f64,
    /// p99 (µs).
    pub p99: f64,
    /// p99.9 (µs).
    pub p99_9: f64,
}

/// One timed figure: name, unit, whether higher is better, its value in a run.
pub type TimedFigure = (&'static str, &'static str, bool, fn(&Timed) -> f64);

/// The timed figures tune judges.
pub const TIMED: [TimedFigure; 4] = [
    ("message rate", "msg/s", true, |t| t.msg_rate),
    ("latency p50", "us", false, |t| t.p50),
    ("latency p99", "us", false, |t| t.p99),
    ("latency p99.9", "us", false, |t| t.p99_9),
];

/// A figure's change counts only when it is at least this (relative to the baseline's
/// median) and beyond both settings' run-to-run spread.
pub const MIN_EFFECT: f64 = 0.10;

/// A figure whose runs spread by more than this (relative to their median) is flagged noisy.
pub const NOISY: f64 = 0.25;

/// What the runs of a setting say about one figure against the baseline's runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Better beyond the spread of both.
    Better,
    /// Worse beyond the spread of both.
    Worse,
    /// The change is within the run-to-run spread (or below [`MIN_EFFECT`]).
    NoChange,
    /// Too few runs to measure a spread (one run each).
    NotJudged,
}

/// Median of `v` (mean of the two middle values for an even count); 0 for none.
pub fn median(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => 0.0,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// Relative spread of `v`: (max - min) / median; 0 for fewer than two values or a zero
/// median.
pub fn spread(v: &[f64]) -> f64 {
    let m = median(v);
    if v.len() < 2 || m == 0.0 {
        return 0.0;
    }
    let (lo, hi) = v
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| {
            (a.min(x), b.max(x))
        });
    (hi - lo) / m.abs()
}

/// Judge runs `other` of a setting against the baseline's runs `base` for a figure where
/// higher is better (`higher_better`) or lower is. Better or worse only when every run of one
/// is beyond every run of the other (the ranges do not overlap) and the medians differ by at
/// least [`MIN_EFFECT`] and by more than either setting's relative spread. Returns the
/// verdict and the relative change of the medians.
pub fn judge(base: &[f64], other: &[f64], higher_better: bool) -> (Verdict, f64) {
    let (m0, m1) = (median(base), median(other));
    let change = if m0 == 0.0 { 0.0 } else { (m1 - m0) / m0.abs() };
    if base.len() < 2 || other.len() < 2 {
        return (Verdict::NotJudged, change);
    }
    let lo = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = |v: &[f64]| v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let up = lo(other) > hi(base);
    let down = hi(other) < lo(base);
    let margin = MIN_EFFECT.max(spread(base)).max(spread(other));
    if (up || down) && change.abs() >= margin {
        let better = up == higher_better;
        (
            if better {
                Verdict::Better
            } else {
                Verdict::Worse
            },
            change,
        )
    } else {
        (Verdict::NoChange, change)
    }
}

/// What one setting measured.
#[derive(Clone, Debug)]
pub struct Measured {
    /// Knob.
    pub knob: &'static str,
    /// The knob's value, as shown.
    pub value: String,
    /// The setting.
    pub setting: Setting,
    /// Ping-pong latency (µs, RTT/2).
    pub lat: LatencyStats,
    /// Messages streamed.
    pub messages: u64,
    /// Stream rate (messages per second).
    pub msg_rate: f64,
    /// Per-message figures, in [`FIGURES`] order (None on a real device: no device counters).
    pub per_msg: Option<Vec<f64>>,
    /// The raw counter deltas of the stream, in [`FIGURES`] order.
    pub totals: Option<Vec<u64>>,
    /// Host instructions per message (callgrind), when measured.
    pub instr_per_msg: Option<f64>,
    /// The timed figures of every run (repetition) of the setting; `lat` pools the latency
    /// samples of all of them, `msg_rate` is their median.
    pub runs: Vec<Timed>,
}

impl Measured {
    /// One timed figure over the runs.
    pub fn timed(&self, f: fn(&Timed) -> f64) -> Vec<f64> {
        self.runs.iter().map(f).collect()
    }

    /// Whether any timed figure spreads by more than [`NOISY`] over the runs.
    pub fn noisy(&self) -> Vec<&'static str> {
        TIMED
            .iter()
            .filter(|(_, _, _, f)| spread(&self.timed(*f)) > NOISY)
            .map(|(n, ..)| *n)
            .collect()
    }
}

impl Measured {
    /// A per-message figure by counter name.
    pub fn figure(&self, name: &str) -> Option<f64> {
        let i = FIGURES.iter().position(|f| f.0 == name)?;
        self.per_msg.as_ref().map(|v| v[i])
    }
}

/// Options of the experiment.
#[derive(Clone, Debug)]
pub struct TuneOpts {
    /// Message size.
    pub size: u32,
    /// Messages per stream (the ping-pong runs a quarter of it, at least 50).
    pub iters: u64,
    /// Device name.
    pub dev: Option<String>,
    /// Force the emulator.
    pub force_emu: bool,
    /// Runs (repetitions) of each setting; the spread between them is what a change must
    /// exceed.
    pub reps: u32,
}

/// Runs per setting by default (and with `--quick`).
pub const DEFAULT_REPS: u32 = 3;

fn config(o: &TuneOpts, s: &Setting) -> TestbedConfig {
    TestbedConfig {
        dev: o.dev.clone(),
        force_emu: o.force_emu,
        max_size: u64::from(o.size),
        sq_depth: s.sq_depth,
        rq_depth: s.sq_depth,
        max_inline: s.inline,
        bf: Some(s.bf),
        events: s.poll == PollMode::Event,
        hugepages: false,
        mtu: 1024,
        max_rd_atomic: 1,
        cross_process: false,
        pcap: None,
        cpu_cost: false,
        ib_port: 1,
        gid_index: None,
        echo: false,
        conn: crate::cli::Conn::Rc,
        sl: 0,
        timeout: 14,
        log_dci_streams: 0,
    }
}

/// Measure one setting.
///
/// # Errors
/// The testbed or a run failed.
pub fn measure(
    o: &TuneOpts,
    knob: &'static str,
    value: &str,
    s: &Setting,
) -> Result<Measured, String> {
    let mut runs = Vec::new();
    let mut samples = Vec::new();
    let mut emulated = false;
    for _ in 0..o.reps.max(1) {
        let (t, lat, emu) = measure_once(o, s)?;
        runs.push(t);
        samples.extend(lat);
        emulated = emu;
    }
    let lat = LatencyStats::from_samples(&samples).ok_or("no latency samples")?;
    let msg_rate = median(&runs.iter().map(|t| t.msg_rate).collect::<Vec<_>>());
    let totals = if emulated {
        Some(device_figures(o.size, s, o.iters)?)
    } else {
        None
    };
    let per_msg = totals
        .as_ref()
        .map(|t| t.iter().map(|&v| v as f64 / o.iters as f64).collect());
    Ok(Measured {
        knob,
        value: value.to_owned(),
        setting: *s,
        lat,
        messages: o.iters,
        msg_rate,
        per_msg,
        totals,
        instr_per_msg: None,
        runs,
    })
}

/// A side whose every post first waits `delay` (busy): the test knob `post_delay_ns`.
struct Slowed<'a> {
    inner: &'a mut dyn bench::Side,
    delay: std::time::Duration,
}

impl bench::Side for Slowed<'_> {
    fn post_send(&mut self, wrs: &[bench::Wr]) -> bench::BenchResult<()> {
        let t = std::time::Instant::now();
        while t.elapsed() < self.delay {
            std::hint::spin_loop();
        }
        self.inner.post_send(wrs)
    }
    fn post_recv(&mut self, n: u32, len: u32) -> bench::BenchResult<()> {
        self.inner.post_recv(n, len)
    }
    fn recv_outstanding(&self) -> u32 {
        self.inner.recv_outstanding()
    }
    fn poll_send(&mut self, max: usize) -> bench::BenchResult<usize> {
        self.inner.poll_send(max)
    }
    fn poll_recv(&mut self, max: usize) -> bench::BenchResult<usize> {
        self.inner.poll_recv(max)
    }
    fn arm(&mut self, recv: bool) -> bench::BenchResult<()> {
        self.inner.arm(recv)
    }
    fn wait_event(&mut self, recv: bool) -> bench::BenchResult<()> {
        self.inner.wait_event(recv)
    }
    fn read_byte(&self, off: usize) -> u8 {
        self.inner.read_byte(off)
    }
    fn write_byte(&mut self, off: usize, v: u8) {
        self.inner.write_byte(off, v);
    }
    fn read_rx(&self, off: usize, out: &mut [u8]) {
        self.inner.read_rx(off, out);
    }
    fn write_rx(&mut self, off: usize, data: &[u8]) {
        self.inner.write_rx(off, data);
    }
}

/// One run of setting `s` on a fresh testbed: its timed figures, its latency samples, and
/// whether the device is the emulated one.
fn measure_once(o: &TuneOpts, s: &Setting) -> Result<(Timed, Vec<f64>, bool), String> {
    let mut tb = crate::backend::open(&config(o, s))?;
    let lat_iters = (o.iters / 4).max(50);
    let p = RunParams {
        size: o.size,
        iters: lat_iters,
        duration: None,
        inline_max: s.inline,
        tx_depth: 1,
        post_list: 1,
        cq_mod: 1,
        poll: s.poll,
        warm_up: 10,
        patience: Some(std::time::Duration::from_secs(10)),
        rx_depth: 1,
    };
    let delay = std::time::Duration::from_nanos(s.post_delay_ns);
    let (a, b) = tb.sides();
    let (mut a, mut b) = (Slowed { inner: a, delay }, Slowed { inner: b, delay });
    let run = bench::lat_pingpong(Op::Send, &mut a, &mut b, &p, "")?;
    let lat = LatencyStats::from_samples(&run.samples_us).ok_or("no latency samples")?;
    let sp = RunParams {
        iters: o.iters,
        tx_depth: s.sq_depth,
        post_list: s.post_list,
        cq_mod: s.signal_interval,
        rx_depth: s.sq_depth,
        ..p
    };
    let (a, b) = tb.sides();
    let (mut a, mut b) = (Slowed { inner: a, delay }, Slowed { inner: b, delay });
    let bw = bench::bw_stream(Op::Send, &mut a, Some(&mut b), &sp, "")?;
    let emulated = tb.emu_counters().is_some();
    drop(tb);
    let span = bw
        .completed_ns
        .last()
        .map_or(0, |&l| {
            l.saturating_sub(bw.posted_ns.first().copied().unwrap_or(0))
        })
        .max(1);
    let msg_rate = o.iters as f64 * 1e9 / span as f64;
    let t = Timed {
        msg_rate,
        p50: lat.p50,
        p99: lat.p99,
        p99_9: lat.p99_9,
    };
    Ok((t, run.samples_us, emulated))
}

/// The device's counters (in [`FIGURES`] order) over a stream of `n` RC SENDs of `size`
/// bytes with setting `s`, on a stepped emulated HCA that runs after every post (a device
/// that keeps up): exact and repeatable. The poll mode does not change them (the device
/// does the same work however the host waits).
///
/// # Errors
/// The emulator or the driver failed, or the stream stalled.
pub fn device_figures(size: u32, s: &Setting, n: u64) -> Result<Vec<u64>, String> {
    use mlx5::{RecvWr, SendFlags, SendWr, Sge, WorkCompletion, WrOp};
    let size = size.max(1);
    let depth = s.sq_depth.max(1);
    let mut r = crate::trace::rig(size, s.inline, s.bf, depth)?;
    let area = r.area as u64;
    let pattern: Vec<u8> = (0..size).map(|i| i as u8).collect();
    r.a.buf.write(0, &pattern);
    let rx = [Sge {
        addr: r.b.mr.addr() + area,
        length: size,
        lkey: r.b.mr.lkey(),
    }];
    let post_recvs = |b: &mut crate::trace::End, k: u64| -> Result<(), String> {
        for _ in 0..k {
            tune_host_recv(
                &mut b.qp,
                &[RecvWr {
                    wr_id: 0,
                    sg_list: &rx,
                }],
            )
            .map_err(|(_, e)| format!("post_recv: {e}"))?;
        }
        Ok(())
    };
    // Instructions count from here: the first receives are part of the stream's cost.
    tune_zero_stats();
    let mut recv_posted = u64::from(depth).min(n);
    post_recvs(&mut r.b, recv_posted)?;
    r.emu.run_until_idle();
    let before = r.emu.counters(0);
    let tx = [Sge {
        addr: r.a.mr.addr(),
        length: size,
        lkey: r.a.mr.lkey(),
    }];
    let inl: [&[u8]; 1] = [&pattern];
    let inline = size <= s.inline;
    let pl = u64::from(s.post_list.max(1)).min(u64::from(depth));
    let cq_mod = u64::from(s.signal_interval.max(1)).min(u64::from(depth) - pl + 1);
    let (mut posted, mut completed, mut received) = (0u64, 0u64, 0u64);
    let mut wcs = [WorkCompletion::default(); 64];
    let mut idle_rounds = 0;
    while completed < n {
        let mut did = false;
        while posted < n
            && posted - completed + pl.min(n - posted) <= u64::from(depth)
            && posted + pl.min(n - posted) <= recv_posted
        {
            let k = pl.min(n - posted);
            let wrs: Vec<SendWr<'_>> = (posted..posted + k)
                .map(|idx| {
                    let mut f = if (idx + 1) % cq_mod == 0 || idx + 1 == n {
                        SendFlags::SIGNALED
                    } else {
                        SendFlags::NONE
                    };
                    if inline {
                        f |= SendFlags::INLINE;
                    }
                    let w = SendWr::new(idx, WrOp::Send, &tx, f);
                    if inline { w.with_inline(&inl) } else { w }
                })
                .collect();
            tune_host_post(&mut r.a.qp, &wrs)
                .map_err(|(i, e)| format!("post_send (WR {i} of {k}): {e}"))?;
            posted += k;
            r.emu.run_until_idle();
            did = true;
        }
        r.emu.run_until_idle();
        let got = tune_host_poll(&mut r.b.rcq, &mut wcs) as u64;
        if got > 0 {
            received += got;
            let k = got.min(n - recv_posted);
            post_recvs(&mut r.b, k)?;
            recv_posted += k;
            did = true;
        }
        let c = tune_host_poll(&mut r.a.scq, &mut wcs);
        for wc in &wcs[..c] {
            if !wc.is_ok() {
                return Err(format!(
                    "stream: completion {} failed: {:?}",
                    wc.wr_id, wc.status
                ));
            }
            // A CQE retires its WR and the unsignaled ones before it.
            completed = wc.wr_id + 1;
            did = true;
        }
        idle_rounds = if did { 0 } else { idle_rounds + 1 };
        if idle_rounds > 1000 {
            return Err(format!(
                "stream stalled: {posted} posted, {completed} completed, {received} received"
            ));
        }
    }
    let after = r.emu.counters(0);
    Ok(FIGURES
        .iter()
        .map(|(name, _)| {
            after
                .get(name)
                .unwrap_or(0)
                .saturating_sub(before.get(name).unwrap_or(0))
        })
        .collect())
}

// The host's data-path calls of the stream, each in a function of its own so that callgrind
// counts the instructions inside them (`--toggle-collect`) and nothing of the emulated
// device, which runs between them in the same thread.

/// callgrind zeroes its counts on entering this (after the setup).
#[inline(never)]
fn tune_zero_stats() {
    std::hint::black_box(());
}

#[inline(never)]
fn tune_host_post(
    qp: &mut mlx5::Qp,
    wrs: &[mlx5::SendWr<'_>],
) -> Result<(), (usize, mlx5::PostError)> {
    qp.post_send(wrs)
}

#[inline(never)]
fn tune_host_recv(
    qp: &mut mlx5::Qp,
    wrs: &[mlx5::RecvWr<'_>],
) -> Result<(), (usize, mlx5::PostError)> {
    qp.post_recv(wrs)
}

#[inline(never)]
fn tune_host_poll(cq: &mut mlx5::Cq, wcs: &mut [mlx5::WorkCompletion]) -> usize {
    cq.poll(wcs)
}

/// Messages of the stream counted under callgrind.
pub const INSTR_MESSAGES: u64 = 500;

/// The host functions callgrind counts in.
pub const HOST_SYMBOLS: [&str; 3] = ["tune_host_post", "tune_host_recv", "tune_host_poll"];

/// Instructions the host spent per message in the stream of setting `value` of `knob`
/// (post, poll and receive re-post together), counted by valgrind's callgrind in a child run
/// of this program (`mlx5 tune --instr-one KNOB=VALUE`). None when valgrind cannot be run.
///
/// # Errors
/// valgrind ran but failed, or its output could not be read.
pub fn instructions_per_message(
    knob: &str,
    value: &str,
    size: u32,
    n: u64,
) -> Result<Option<f64>, String> {
    let valgrind = std::env::var("MLX5_BENCH_VALGRIND").unwrap_or_else(|_| "valgrind".into());
    let present = std::process::Command::new(&valgrind)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !present {
        return Ok(None);
    }
    let exe = std::env::current_exe().map_err(|e| format!("this program's path: {e}"))?;
    let out = std::env::temp_dir().join(
        format!("mlx5-tune-{}-{knob}-{value}.callgrind", std::process::id()).replace(':', "_"),
    );
    let mut cmd = std::process::Command::new(&valgrind);
    cmd.args([
        "--tool=callgrind",
        "--collect-atstart=no",
        "--zero-before=*tune_zero_stats*",
    ])
    .arg(format!("--callgrind-out-file={}", out.display()));
    for s in HOST_SYMBOLS {
        cmd.arg(format!("--toggle-collect=*{s}*"));
    }
    let st = cmd
        .arg(exe)
        .args(["tune", "--instr-one", &format!("{knob}={value}")])
        .args(["-s", &size.to_string(), "-n", &n.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .output()
        .map_err(|e| format!("{valgrind}: {e}"))?;
    let text = std::fs::read_to_string(&out);
    let _ = std::fs::remove_file(&out);
    if !st.status.success() {
        return Err(format!(
            "valgrind run of {knob}={value} failed: {}",
            String::from_utf8_lossy(&st.stderr)
                .lines()
                .last()
                .unwrap_or("")
        ));
    }
    let text = text.map_err(|e| format!("{}: {e}", out.display()))?;
    let total = callgrind_total(&text)?;
    Ok(Some(total as f64 / n as f64))
}

/// The total of the first event (instructions) in a callgrind output: its `summary:` or
/// `totals:` line.
///
/// # Errors
/// Neither line is there.
pub fn callgrind_total(text: &str) -> Result<u64, String> {
    text.lines()
        .find_map(|l| {
            l.strip_prefix("summary:")
                .or_else(|| l.strip_prefix("totals:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
        })
        .ok_or_else(|| "callgrind output has no summary or totals line".to_owned())
}

/// `mlx5 tune --instr-one KNOB=VALUE`: run that setting's stream (the child of
/// [`instructions_per_message`]).
///
/// # Errors
/// An unknown knob or value, or the stream failed.
pub fn instr_one(spec: &str, size: u32, n: u64) -> Result<(), String> {
    let (knob, value) = spec
        .split_once('=')
        .ok_or_else(|| format!("--instr-one {spec:?}: expected KNOB=VALUE"))?;
    let s = settings(knob)
        .into_iter()
        .find(|(v, _)| v == value)
        .map(|(_, s)| s)
        .ok_or_else(|| format!("--instr-one: no setting {value:?} of knob {knob:?}"))?;
    device_figures(size, &s, n).map(|_| ())
}

/// Why a figure moves, by figure and direction (up = true).
fn reason(name: &str, up: bool, knob: &str) -> &'static str {
    match (name, up) {
        ("payload_reads", false) => "the payload rides in the WQE: one DMA read less per WQE",
        ("payload_reads", true) => "the payload is gathered by DMA again",
        ("wqe_fetch_bytes", true) if knob == "inline" => "the inline data makes the WQE bigger",
        ("wqe_fetch_bytes", _) => "more or fewer WQE bytes fetched",
        ("doorbells", false) if knob == "post_list" => "one doorbell rings a whole post list",
        ("doorbells", _) => "doorbells per message changed",
        ("bf_writes", false) => "fewer BlueFlame copies",
        ("bf_writes", true) => "more WQEs go by BlueFlame",
        ("mmio_bytes", true) => "the WQE crosses the link in the BlueFlame copy",
        ("mmio_bytes", false) => "8-byte doorbells instead of BlueFlame copies, or fewer rings",
        ("mmio_writes", _) => "MMIO writes follow the rings",
        ("cqes_written", false) => "fewer signaled WRs: fewer CQEs written and polled",
        ("cqes_written", true) => "more CQEs written",
        ("wqe_fetches", false) => "the device fetches several WQEs in one read after one doorbell",
        ("wqe_fetches", true) => "more separate WQE fetches",
        ("dma_read_requests", _) | ("dma_read_completions", _) | ("dma_read_bytes", _) => {
            "the device's reads over the link changed"
        }
        ("dma_writes", _) | ("dma_write_bytes", _) => "the device's writes over the link changed",
        ("payload_read_bytes", _) => "payload bytes read by DMA changed",
        _ => "",
    }
}

/// The line of one knob: for each setting against the first, first the verdict on the timed
/// figures (message rate, latency p50, p99, p99.9: better or worse only beyond the
/// run-to-run spread, [`judge`]; noisy runs flagged), then which device figures moved and why
/// (exact counters: a move is at least 10% and 0.05 per message).
pub fn knob_line(knob: &str, rows: &[&Measured]) -> String {
    let Some(base) = rows.first() else {
        return format!("{knob}: no settings measured");
    };
    let mut parts = Vec::new();
    for r in rows.iter().skip(1) {
        let mut moved = Vec::new();
        let mut better = Vec::new();
        let mut worse = Vec::new();
        let mut within = Vec::new();
        for (name, unit, higher, f) in TIMED {
            let (x, y) = (base.timed(f), r.timed(f));
            let (v, change) = judge(&x, &y, higher);
            let (mx, my) = (median(&x), median(&y));
            let fmt = |m: f64| {
                if unit == "msg/s" {
                    format!("{m:.0}")
                } else {
                    format!("{m:.2}")
                }
            };
            let what = format!(
                "{name} {} -> {} {unit} ({:+.0}%, run-to-run spread {:.0}%/{:.0}%)",
                fmt(mx),
                fmt(my),
                change * 100.0,
                spread(&x) * 100.0,
                spread(&y) * 100.0
            );
            match v {
                Verdict::Better => better.push(what),
                Verdict::Worse => worse.push(what),
                Verdict::NoChange => within.push(name),
                Verdict::NotJudged => within.push(name),
            }
        }
        let judged = r.runs.len() >= 2 && base.runs.len() >= 2;
        let mut verdict = match (better.is_empty(), worse.is_empty()) {
            (false, true) => format!("better: {}", better.join("; ")),
            (true, false) => format!("worse: {}", worse.join("; ")),
            (false, false) => format!(
                "mixed: better {}; worse {}",
                better.join("; "),
                worse.join("; ")
            ),
            (true, true) if judged => format!(
                "no change beyond the run-to-run spread in {}",
                within.join(", ")
            ),
            (true, true) => {
                "timed figures not judged (one run each: no spread measured)".to_owned()
            }
        };
        if knob == "poll" && worse.iter().any(|w| w.starts_with("latency")) {
            verdict.push_str(" (the poller sleeps or waits for an event between polls)");
        }
        let noisy: Vec<String> = [(&base.value, base.noisy()), (&r.value, r.noisy())]
            .into_iter()
            .filter(|(_, n)| !n.is_empty())
            .map(|(v, n)| format!("{v}: {}", n.join(", ")))
            .collect();
        if !noisy.is_empty() {
            verdict.push_str(&format!(
                " [noisy runs, spread over {}%: {}]",
                (NOISY * 100.0) as u32,
                noisy.join("; ")
            ));
        }
        moved.push(verdict);
        if let (Some(x), Some(y)) = (base.instr_per_msg, r.instr_per_msg) {
            let d = (y - x).abs();
            if d >= 1.0 && d >= 0.1 * x.abs() {
                moved.push(format!(
                    "host instructions/msg {x:.0} -> {y:.0}{}",
                    match (knob, y < x) {
                        ("post_list", true) => " (one doorbell and one chain walk per list)",
                        ("signal_interval", true) => " (fewer CQEs to poll)",
                        ("inline", false) => " (the CPU copies the payload into the WQE)",
                        ("blueflame", false) => " (a 64-byte copy instead of an 8-byte store)",
                        _ => "",
                    }
                ));
            }
        }
        if let (Some(a), Some(b)) = (&base.per_msg, &r.per_msg) {
            for (i, (name, label)) in FIGURES.iter().enumerate() {
                let (x, y) = (a[i], b[i]);
                let d = (y - x).abs();
                if d >= 0.05 && d >= 0.1 * x.abs() {
                    let why = reason(name, y > x, knob);
                    moved.push(format!(
                        "{label}/msg {x:.2} -> {y:.2}{}",
                        if why.is_empty() {
                            String::new()
                        } else {
                            format!(" ({why})")
                        }
                    ));
                }
            }
        }
        if moved.len() == 1 {
            moved.push("no device figure moved by 10% or more".to_owned());
        }
        parts.push(format!(
            "{} -> {}: {}",
            base.value,
            r.value,
            moved.join("; ")
        ));
    }
    format!("{knob}: {}", parts.join(" | "))
}

/// The CQ moderation line: not supported here.
pub const CQ_MODERATION: &str = "cq_moderation: not supported (the driver has no modify-CQ moderation and the emulated device raises an event per armed completion); not measured";

/// Run the whole experiment: every knob's settings.
///
/// # Errors
/// A setting failed.
pub fn run(o: &TuneOpts, mut progress: impl FnMut(&Measured)) -> Result<Vec<Measured>, String> {
    let mut out = Vec::new();
    for knob in KNOBS {
        out.extend(run_settings(o, knob, &settings(knob), &mut progress)?);
    }
    Ok(out)
}

/// Measure `set` (the first is the one the others are judged against) as knob `knob`.
///
/// # Errors
/// A setting failed.
pub fn run_settings(
    o: &TuneOpts,
    knob: &'static str,
    set: &[(String, Setting)],
    mut progress: impl FnMut(&Measured),
) -> Result<Vec<Measured>, String> {
    let mut out = Vec::new();
    for (value, s) in set {
        let m = measure(o, knob, value, s)?;
        progress(&m);
        out.push(m);
    }
    Ok(out)
}

/// The table (one row per setting).
pub fn table(rows: &[Measured]) -> String {
    let mut s = format!(
        "{:<16} {:>9} {:>8} {:>8} {:>8} {:>10} {:>12} {:>6} {:>6} {:>6} {:>7} {:>6} {:>9} {:>8} {:>8} {:>9} {:>7} {:>9} {:>7}\n",
        "knob",
        "value",
        "p50 us",
        "p99 us",
        "p99.9",
        "msg/s",
        "spread",
        "db",
        "bf",
        "fetch",
        "fetchB",
        "pay",
        "CQEs",
        "mmio",
        "mmioB",
        "rdreq/cpl",
        "rdB",
        "wr/wrB",
        "instr"
    );
    for r in rows {
        let f = |n: &str| r.figure(n).map_or("-".to_owned(), |v| format!("{v:.2}"));
        let sp = |f: fn(&Timed) -> f64| format!("{:.0}", spread(&r.timed(f)) * 100.0);
        s.push_str(&format!(
            "{:<16} {:>9} {:>8.2} {:>8.2} {:>8.2} {:>10.0} {:>12} {:>6} {:>6} {:>6} {:>7} {:>6} {:>9} {:>8} {:>8} {:>9} {:>7} {:>9} {:>7}\n",
            r.knob,
            r.value,
            median(&r.timed(|t| t.p50)),
            median(&r.timed(|t| t.p99)),
            median(&r.timed(|t| t.p99_9)),
            r.msg_rate,
            format!("{}%/{}%", sp(|t| t.msg_rate), sp(|t| t.p50)),
            f("doorbells"),
            f("bf_writes"),
            f("wqe_fetches"),
            f("wqe_fetch_bytes"),
            f("payload_reads"),
            f("cqes_written"),
            f("mmio_writes"),
            f("mmio_bytes"),
            format!("{}/{}", f("dma_read_requests"), f("dma_read_completions")),
            f("dma_read_bytes"),
            format!("{}/{}", f("dma_writes"), f("dma_write_bytes")),
            r.instr_per_msg.map_or("-".to_owned(), |v| format!("{v:.0}")),
        ));
    }
    s
}

/// The lines per knob, in [`KNOBS`] order.
pub fn lines(rows: &[Measured]) -> Vec<String> {
    KNOBS
        .iter()
        .map(|&k| {
            if k == "cq_moderation" {
                return CQ_MODERATION.to_owned();
            }
            let rs: Vec<&Measured> = rows.iter().filter(|r| r.knob == k).collect();
            knob_line(k, &rs)
        })
        .chain({
            // Knobs outside the standard list (the test knob), each once, in row order.
            let mut extra: Vec<&str> = Vec::new();
            for r in rows {
                if !KNOBS.contains(&r.knob) && !extra.contains(&r.knob) {
                    extra.push(r.knob);
                }
            }
            extra
                .into_iter()
                .map(|k| {
                    let rs: Vec<&Measured> = rows.iter().filter(|r| r.knob == k).collect();
                    knob_line(k, &rs)
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// JSON of the experiment.
pub fn to_json(o: &TuneOpts, rows: &[Measured], instr_note: &str) -> Value {
    json!({
        "size": o.size,
        "messages_per_setting": o.iters,
        "runs_per_setting": o.reps,
        "baseline": setting_json(&BASELINE),
        "instructions_per_message": instr_note,
        "settings": rows.iter().map(|r| {
            let figs: serde_json::Map<String, Value> = FIGURES.iter().enumerate().filter_map(|(i, (n, _))| {
                r.per_msg.as_ref().map(|v| ((*n).to_owned(), json!(v[i])))
            }).collect();
            let totals: serde_json::Map<String, Value> = FIGURES.iter().enumerate().filter_map(|(i, (n, _))| {
                r.totals.as_ref().map(|v| ((*n).to_owned(), json!(v[i])))
            }).collect();
            json!({
                "knob": r.knob, "value": r.value, "setting": setting_json(&r.setting),
                "latency_us": {"p50": r.lat.p50, "p99": r.lat.p99, "p99_9": r.lat.p99_9,
                                "avg": r.lat.avg, "min": r.lat.min, "max": r.lat.max},
                "messages": r.messages, "msg_rate": r.msg_rate, "instr_per_msg": r.instr_per_msg,
                "runs": r.runs.iter().map(|t| json!({"msg_rate": t.msg_rate, "p50": t.p50,
                    "p99": t.p99, "p99_9": t.p99_9})).collect::<Vec<_>>(),
                "spread": TIMED.iter().map(|(n, _, _, f)| ((*n).to_owned(), json!(spread(&r.timed(*f)))))
                    .collect::<serde_json::Map<String, Value>>(),
                "noisy": r.noisy(),
                "per_message": figs, "totals": totals,
            })
        }).collect::<Vec<_>>(),
        "lines": lines(rows),
    })
}

fn setting_json(s: &Setting) -> Value {
    json!({"inline": s.inline, "sq_depth": s.sq_depth, "post_list": s.post_list,
           "signal_interval": s.signal_interval, "poll": s.poll.to_string(), "bf": s.bf})
}

/// The figures [`plot`] draws, one row of panels each: title, value of a setting, and the
/// runs' values (timed figures: drawn as a min..max whisker over the bar).
type PlotRow = (
    &'static str,
    fn(&Measured) -> f64,
    Option<fn(&Timed) -> f64>,
);

fn link_bytes(r: &Measured) -> f64 {
    ["mmio_bytes", "dma_read_bytes", "dma_write_bytes"]
        .iter()
        .filter_map(|n| r.figure(n))
        .sum::<f64>()
}

const PLOT_ROWS: [PlotRow; 4] = [
    (
        "latency p50 (us)",
        |r| median(&r.timed(|t| t.p50)),
        Some(|t| t.p50),
    ),
    (
        "latency p99 (us)",
        |r| median(&r.timed(|t| t.p99)),
        Some(|t| t.p99),
    ),
    ("message rate (msg/s)", |r| r.msg_rate, Some(|t| t.msg_rate)),
    ("link bytes/msg", link_bytes, None),
];

/// An SVG plot: one column per knob, one row per figure (latency p50, latency p99, message
/// rate, link bytes per message), a bar per setting. Every panel has its own y scale (0 to
/// its largest value, printed at its top), so that a knob whose latency is microseconds is
/// not flattened by one whose latency is milliseconds; timed figures carry the min..max of
/// their runs as a whisker.
pub fn plot(rows: &[Measured]) -> String {
    let mut knobs: Vec<&str> = KNOBS
        .iter()
        .copied()
        .filter(|k| rows.iter().any(|r| r.knob == *k))
        .collect();
    for r in rows {
        if !knobs.contains(&r.knob) {
            knobs.push(r.knob);
        }
    }
    let (pw, ph) = (220.0, 170.0);
    let w = pw * knobs.len().max(1) as f64 + 20.0;
    let h = ph * PLOT_ROWS.len() as f64 + 60.0;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"10\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"10\" y=\"15\" font-size=\"13\">mlx5 tune: per knob and setting, latency p50, latency p99, message rate (medians of the runs, whisker = min..max) and link bytes per message; each panel on its own y scale</text>\n"
    );
    for (row, (title, get, runs)) in PLOT_ROWS.iter().enumerate() {
        let y0 = 30.0 + row as f64 * ph;
        for (k, knob) in knobs.iter().enumerate() {
            let x0 = 10.0 + k as f64 * pw;
            let rs: Vec<&Measured> = rows.iter().filter(|r| r.knob == *knob).collect();
            // This panel's own scale: its largest bar or whisker.
            let top = rs
                .iter()
                .map(|r| {
                    let v = get(r);
                    runs.map_or(v, |f| r.timed(f).into_iter().fold(v, f64::max))
                })
                .filter(|v| v.is_finite())
                .fold(0.0f64, f64::max)
                .max(1e-9);
            s.push_str(&format!(
                "<text x=\"{x0}\" y=\"{}\">{knob}: {title}</text>\n<text x=\"{x0}\" y=\"{}\" fill=\"#666\">scale 0..{top:.1}</text>\n",
                y0 + 10.0,
                y0 + 22.0
            ));
            let bw = (pw - 40.0) / rs.len().max(1) as f64;
            let base = y0 + ph - 30.0;
            let hgt = ph - 70.0;
            for (j, r) in rs.iter().enumerate() {
                let v = get(r);
                let v = if v.is_finite() { v.max(0.0) } else { 0.0 };
                let bh = hgt * v / top;
                let x = x0 + j as f64 * bw;
                s.push_str(&format!(
                    "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{bh:.1}\" fill=\"#4a7bd0\"/>\n<text x=\"{x:.1}\" y=\"{:.1}\">{}</text>\n<text x=\"{x:.1}\" y=\"{:.1}\">{v:.1}</text>\n",
                    base - bh,
                    bw * 0.8,
                    base + 12.0,
                    r.value,
                    base - bh - 3.0
                ));
                if let Some(f) = runs {
                    let t = r.timed(*f);
                    if t.len() >= 2 {
                        let lo = t.iter().copied().fold(f64::INFINITY, f64::min).max(0.0);
                        let hi = t.iter().copied().fold(0.0f64, f64::max);
                        let cx = x + bw * 0.4;
                        s.push_str(&format!(
                            "<line x1=\"{cx:.1}\" x2=\"{cx:.1}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"black\"/>\n",
                            base - hgt * lo / top,
                            base - hgt * hi / top
                        ));
                    }
                }
            }
        }
    }
    s.push_str("</svg>\n");
    s
}

/// `mlx5 tune`.
///
/// # Errors
/// A setting failed, or the plot could not be written.
pub fn command(a: &crate::cli::TuneArgs) -> Result<(), String> {
    let o = TuneOpts {
        size: a.size.max(1),
        iters: a.iters.unwrap_or(if a.quick { 300 } else { 2000 }).max(16),
        dev: a.dev.clone(),
        force_emu: a.emu,
        reps: a.reps,
    };
    if let Some(spec) = &a.instr_one {
        return instr_one(spec, o.size, o.iters);
    }
    let json = a.json;
    let progress = |m: &Measured| {
        if !json {
            eprintln!(
                "  measured {} = {} ({} runs)",
                m.knob,
                m.value,
                m.runs.len()
            );
        }
    };
    let mut rows = run(&o, progress)?;
    if let Some(us) = a.slow_us {
        let slow = Setting {
            post_delay_ns: us.saturating_mul(1000),
            ..BASELINE
        };
        let set = [("0".to_owned(), BASELINE), (format!("{us}us"), slow)];
        rows.extend(run_settings(&o, "post_delay", &set, progress)?);
    }
    let instr_n = o.iters.min(INSTR_MESSAGES);
    let instr_note = if a.quick {
        "not measured (--quick)".to_owned()
    } else {
        let mut found = true;
        for r in &mut rows {
            if !json {
                eprintln!("  counting instructions: {} = {}", r.knob, r.value);
            }
            match instructions_per_message(r.knob, &r.value, o.size, instr_n)? {
                Some(v) => r.instr_per_msg = Some(v),
                None => {
                    found = false;
                    break;
                }
            }
        }
        if found {
            format!(
                "callgrind, host instructions in post_send + poll + post_recv per message over a stepped stream of {instr_n} (the poll mode does not enter it)"
            )
        } else {
            "not measured: valgrind is not installed".to_owned()
        }
    };
    if let Some(path) = &a.plot {
        std::fs::write(path, plot(&rows)).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let mut out = std::io::stdout().lock();
    let w = |out: &mut std::io::StdoutLock<'_>, s: &str| {
        out.write_all(s.as_bytes()).map_err(|e| e.to_string())
    };
    if json {
        let v = to_json(&o, &rows, &instr_note);
        w(
            &mut out,
            &(serde_json::to_string_pretty(&v).map_err(|e| e.to_string())? + "\n"),
        )?;
        return Ok(());
    }
    w(
        &mut out,
        &format!(
            "mlx5 tune: RC SEND {} B, {} runs per setting of {} messages streamed (ping-pong: {}), baseline inline {} / SQ depth {} / post list {} / signal every {} / {} / BlueFlame {}\nper-message figures are the emulated device's counters over the stream divided by the messages (exact: the same in every run); link = PCIe model (MMIO writes, DMA read requests/completions, DMA writes)\ntimed figures (msg/s, p50, p99, p99.9) are the medians of the runs; spread = (max - min) / median of msg/s and p50 over the runs; a setting is better or worse only beyond both settings' spread and by {}% or more; runs spreading over {}% are flagged noisy\ninstructions per message: {instr_note}\n\n",
            o.size,
            o.reps,
            o.iters,
            (o.iters / 4).max(50),
            BASELINE.inline,
            BASELINE.sq_depth,
            BASELINE.post_list,
            BASELINE.signal_interval,
            BASELINE.poll,
            if BASELINE.bf { "on" } else { "off" },
            (MIN_EFFECT * 100.0) as u32,
            (NOISY * 100.0) as u32,
        ),
    )?;
    w(&mut out, &table(&rows))?;
    w(&mut out, "\n")?;
    for l in lines(&rows) {
        w(&mut out, &(l + "\n"))?;
    }
    Ok(())
}
