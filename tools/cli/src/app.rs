//! Running the subcommands: resolve perftest's defaults, open a testbed, run the measurement
//! loops, print the perftest report, write JSON and the histogram.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::bench::{self, Op, RunParams, Side};
use crate::cli::{AtomicType, BwOp, Command, Conn, LatOp, OnOff, PingpongArgs, PollMode, TestArgs};
use crate::report::{self, Endpoint, Header, LatencyBasis};
use crate::stats::{BwStats, LatencyStats};

/// Default iterations of a latency test on the emulator and on hardware (perftest: 1000).
pub const DEFAULT_LAT_ITERS: u64 = 1000;
/// Default iterations of a bandwidth test (perftest: 5000).
pub const DEFAULT_BW_ITERS: u64 = 5000;
/// perftest's default receive queue depth (`-r`).
pub const DEFAULT_RX_DEPTH: u32 = 512;
/// perftest's default inline sizes: RC SEND 236, WRITE 220.
pub const DEFAULT_INLINE_SEND: u32 = 236;
/// See [`DEFAULT_INLINE_SEND`].
pub const DEFAULT_INLINE_WRITE: u32 = 220;
/// perftest's default inline size of UD SENDs (the address vector takes WQE room).
pub const DEFAULT_INLINE_SEND_UD: u32 = 188;
/// perftest's default inline size of DC SENDs and WRITEs (`DEF_INLINE_DC`).
pub const DEFAULT_INLINE_DC: u32 = 150;
/// Largest `--log_dci_streams`: a DCI's stream id is 16 bits wide (perftest reads the option as
/// a `uint16_t`; the device may offer fewer).
pub const MAX_LOG_DCI_STREAMS: u16 = 15;

/// What a testbed must be created with.
#[derive(Debug, Clone)]
pub struct TestbedConfig {
    /// Device name to use, if given.
    pub dev: Option<String>,
    /// Use the emulator even if real devices exist.
    pub force_emu: bool,
    /// Largest message (buffer size per side).
    pub max_size: u64,
    /// Send queue depth.
    pub sq_depth: u32,
    /// Receive queue depth.
    pub rq_depth: u32,
    /// Inline data the QPs must accept.
    pub max_inline: u32,
    /// BlueFlame policy: `None` = the device's default.
    pub bf: Option<bool>,
    /// Create completion channels (event mode).
    pub events: bool,
    /// Back buffers with huge pages.
    pub hugepages: bool,
    /// Path MTU in bytes.
    pub mtu: u32,
    /// Outstanding RDMA reads/atomics.
    pub max_rd_atomic: u8,
    /// The peer is another process: an emulated HCA must join the cross-process (UDP) fabric.
    pub cross_process: bool,
    /// Emulator: packet capture file.
    pub pcap: Option<PathBuf>,
    /// Time the driver's data-path calls.
    pub cpu_cost: bool,
    /// Port of the device (1-based).
    pub ib_port: u8,
    /// GID index of the port: the path carries a GRH from this GID (`None`: only on RoCE,
    /// from index 0).
    pub gid_index: Option<u8>,
    /// SENDs go out of the receive area, as ibv_rc_pingpong's single buffer (each side echoes
    /// the message it last received).
    pub echo: bool,
    /// Transport of the QPs (RC, UC or UD).
    pub conn: Conn,
    /// Service level of the path.
    pub sl: u8,
    /// RC retransmission timeout exponent.
    pub timeout: u8,
    /// `-c DC`: log2 of the DCI stream channels asked for (0: none).
    pub log_dci_streams: u16,
}

/// A connected pair of RC QPs, both ends in this process.
pub trait Testbed {
    /// Device name as printed (e.g. "mlx5_0 (emulated)").
    fn device(&self) -> String;
    /// Whether this is the emulator.
    fn emulated(&self) -> bool;
    /// Whether sends ring the doorbell through BlueFlame.
    fn bf(&self) -> bool;
    /// Inline data the QPs were created with.
    fn max_inline(&self) -> u32;
    /// What backs the data buffers (and why, if huge pages were asked for and not had).
    fn buffers(&self) -> String;
    /// The two endpoints (initiator, responder) for the address lines.
    fn endpoints(&self) -> (Endpoint, Endpoint);
    /// Both sides, to hand to the measurement loops.
    fn sides(&mut self) -> (&mut dyn Side, &mut dyn Side);
    /// Device counters (emulator), as a JSON object; `None` on hardware.
    fn counters(&self) -> Option<serde_json::Value>;
    /// `--cpu_cost`: the per-call times of both QPs' driver calls, if recorded.
    fn cost(&self) -> Option<crate::cost::CostLog>;
    /// What the driver did, summed over both QPs (`wqes`, `doorbells` = 8-byte stores,
    /// `bf_copies`, `rings` = both kinds), as a JSON object.
    fn driver_counters(&self) -> serde_json::Value;
    /// The emulated device's counters (None on a real device).
    fn emu_counters(&self) -> Option<mlx5_emu::Counters> {
        None
    }
    /// The port is Ethernet (RoCE), and the source GID index of global paths.
    fn link(&self) -> (bool, Option<u8>) {
        (false, None)
    }
}

/// Runs a parsed command line.
pub fn run(cmd: Command) -> Result<(), String> {
    match cmd {
        Command::Lat(a) => {
            if a.op == LatOp::Raw {
                return crate::raw_lat::run(&a);
            }
            a.raw.refuse()?;
            let op = match (a.op, a.atomic_type) {
                (LatOp::Atomic, None | Some(AtomicType::FETCH_AND_ADD)) => Op::FetchAdd,
                (LatOp::Atomic, Some(AtomicType::CMP_AND_SWAP)) => Op::CmpSwap,
                (_, Some(_)) => return Err("-A/--atomic_type: `lat atomic` only".into()),
                (LatOp::Send, None) => Op::Send,
                (LatOp::Write, None) => Op::Write,
                (LatOp::Read, None) => Op::Read,
                (LatOp::Raw, None) => return crate::raw_lat::run(&a),
            };
            run_test(op, true, &a)
        }
        Command::Bw(a) => {
            a.raw.refuse()?;
            let op = match (a.op, a.atomic_type) {
                (BwOp::Atomic, None | Some(AtomicType::FETCH_AND_ADD)) => Op::FetchAdd,
                (BwOp::Atomic, Some(AtomicType::CMP_AND_SWAP)) => Op::CmpSwap,
                (_, Some(_)) => return Err("-A/--atomic_type: `bw atomic` only".into()),
                (BwOp::Send, None) => Op::Send,
                (BwOp::Write, None) => Op::Write,
                (BwOp::Read, None) => Op::Read,
            };
            run_test(op, false, &a)
        }
        Command::Devices(a) => crate::devinfo::list_devices(a.emu),
        Command::Info(a) => crate::devinfo::info(a.dev.as_deref(), a.verbose, a.emu),
        Command::Pingpong(a) => pingpong(&a),
        Command::Decode(a) => match crate::decode::command(&a)? {
            0 => Ok(()),
            // Decoded with warnings: the output is complete, the status says it is suspect.
            code => std::process::exit(code),
        },
        Command::Diag(a) => crate::diag::command(&a),
        Command::Counters(a) => crate::counters::command(&a),
        Command::Emu {
            cmd: crate::cli::EmuCommand::Run(r),
        } => emu_run(&r),
        Command::Emu {
            cmd: crate::cli::EmuCommand::Net(n),
        } => crate::net::command(&n),
        Command::Trace(a) => crate::trace::command(&a),
        Command::Tune(a) => crate::tune::command(&a),
    }
}

/// perftest's title of a test.
pub fn title(op: Op, lat: bool) -> &'static str {
    match (op, lat) {
        (Op::Send, true) => "Send Latency Test",
        (Op::Write, true) => "RDMA_Write Latency Test",
        (Op::Read, true) => "RDMA_Read Latency Test",
        (Op::FetchAdd, true) => "Atomic FETCH_AND_ADD Latency Test",
        (Op::CmpSwap, true) => "Atomic CMP_AND_SWAP Latency Test",
        (Op::Send, false) => "Send BW Test",
        (Op::Write, false) => "RDMA_Write BW Test",
        (Op::Read, false) => "RDMA_Read BW Test",
        (Op::FetchAdd, false) => "Atomic FETCH_AND_ADD BW Test",
        (Op::CmpSwap, false) => "Atomic CMP_AND_SWAP BW Test",
    }
}

/// The run parameters after perftest's defaults are applied.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Operation.
    pub op: Op,
    /// Latency (true) or bandwidth test.
    pub lat: bool,
    /// Message sizes to run.
    pub sizes: Vec<u64>,
    /// Parameters common to every size (the size field is set per run).
    pub params: RunParams,
    /// Testbed to create.
    pub testbed: TestbedConfig,
}

fn mtu_ok(m: u32) -> bool {
    matches!(m, 256 | 512 | 1024 | 2048 | 4096)
}

/// Applies perftest's defaults and checks the options.
pub fn plan<O>(op: Op, lat: bool, a: &TestArgs<O>) -> Result<Plan, String>
where
    O: clap::ValueEnum + Clone + Send + Sync + 'static,
{
    a.unsupported.check()?;
    let atomic = matches!(op, Op::FetchAdd | Op::CmpSwap);
    let conn = a.connection;
    match (conn, op) {
        (Conn::Rc | Conn::Xrc | Conn::Dc, _)
        | (Conn::Uc, Op::Send | Op::Write)
        | (Conn::Ud, Op::Send) => {}
        (Conn::Srd, _) => {
            return Err(format!(
                "-c {}: not supported (RC, UC, UD, XRC and DC are)",
                conn.name()
            ));
        }
        (Conn::Uc | Conn::Ud, _) => {
            return Err(format!(
                "-c {}: {} needs RC (perftest runs UC for SEND and WRITE, UD for SEND)",
                conn.name(),
                title(op, lat)
            ));
        }
    }
    let peer = a.host.is_some() || a.server;
    let hpc = matches!(conn, Conn::Xrc | Conn::Dc);
    if hpc && !peer {
        return Err(format!(
            "-c {}: with a peer only (HOST or --server), as perftest runs it: \
             initiators on one side, targets on the other",
            conn.name()
        ));
    }
    if hpc && a.rdma_cm {
        // perftest: "XRC does not support RDMA_CM", "DC does not support RDMA_CM"
        return Err(format!(
            "-c {} with -R/--rdma_cm: {} does not support rdma_cm (as perftest says)",
            conn.name(),
            conn.name()
        ));
    }
    if a.log_dci_streams > 0 && conn != Conn::Dc {
        return Err(format!(
            "--log_dci_streams {}: DC only (-c DC), as perftest",
            a.log_dci_streams
        ));
    }
    if a.log_dci_streams > MAX_LOG_DCI_STREAMS {
        return Err(format!(
            "--log_dci_streams {}: at most {MAX_LOG_DCI_STREAMS} (2^{MAX_LOG_DCI_STREAMS} \
             stream channels)",
            a.log_dci_streams
        ));
    }
    if !peer && (a.port.is_some() || a.bind.is_some()) {
        return Err("-p/--bind: the TCP exchange needs a peer (HOST or --server)".into());
    }
    if a.bind.is_some() && !a.server {
        return Err("--bind: the address a server listens on; add --server".into());
    }
    if a.num_qps == 0 || a.num_qps > MAX_QPS {
        return Err(format!("-q {}: 1..={MAX_QPS} QPs per side", a.num_qps));
    }
    if a.num_qps > 1 && lat {
        // perftest's parser: "Multiple QPs only available on bw tests"
        return Err(format!(
            "-q {}: several QPs are for bandwidth tests only (as perftest)",
            a.num_qps
        ));
    }
    if a.num_qps > 1 && !peer {
        return Err(format!(
            "-q {}: several QPs per side need a peer (HOST or --server): \
             in one process both sides share the CPU and the sum would measure nothing",
            a.num_qps
        ));
    }
    if a.num_qps > 1 && a.rdma_cm {
        return Err(format!(
            "-q {} with -R/--rdma_cm: one connection per side only, for now",
            a.num_qps
        ));
    }
    if a.ib_port == 0 {
        return Err("-i: ports are numbered from 1".into());
    }
    if a.sl > 15 {
        return Err(format!("-S {}: service levels are 0..=15", a.sl));
    }
    if a.qp_timeout > 31 {
        return Err(format!(
            "-u {}: the timeout exponent is 0..=31",
            a.qp_timeout
        ));
    }
    if !lat {
        for (given, name) in [
            (a.histogram.is_some(), "--histogram"),
            (a.report_histogram, "-H/--report-histogram"),
            (a.report_unsorted, "-U/--report-unsorted"),
        ] {
            if given {
                return Err(format!(
                    "{name}: latency tests only (a bandwidth test has no per-message latency)"
                ));
            }
        }
    } else {
        for (given, name) in [
            (a.no_peak, "-N/--noPeak"),
            (a.report_gbits, "--report_gbits"),
        ] {
            if given {
                return Err(format!("{name}: bandwidth tests only"));
            }
        }
    }
    if a.perform_warm_up && !lat && op == Op::Send {
        return Err(
            "--perform_warm_up: WRITE, READ and atomic bandwidth and latency tests (as perftest)"
                .into(),
        );
    }
    if a.outs.is_some() && !matches!(op, Op::Read | Op::FetchAdd | Op::CmpSwap) {
        return Err("-o/--outs: READ and atomic tests only".into());
    }
    let max_rd_atomic = a.outs.unwrap_or(16);
    if !(1..=16).contains(&max_rd_atomic) {
        return Err(format!("-o {max_rd_atomic}: 1..=16 outstanding"));
    }
    let poll = match (a.events, a.poll) {
        (false, p) => p,
        (true, PollMode::Busy | PollMode::Event) => PollMode::Event,
        (true, p) => return Err(format!("-e and --poll {p}: choose one")),
    };
    if a.rx_depth == Some(0) {
        return Err("-r must be at least 1".into());
    }
    let sizes: Vec<u64> = if atomic {
        if a.size.is_some_and(|s| s != 8) || a.all {
            return Err("atomic operations are 8 bytes: -s/-a do not apply".into());
        }
        vec![8]
    } else if a.all {
        // UD: perftest runs -a up to the MTU
        let cap = if conn == Conn::Ud {
            u64::from(a.mtu.unwrap_or(4096))
        } else {
            u64::MAX
        };
        crate::cli::all_sizes().filter(|&s| s <= cap).collect()
    } else {
        vec![a.size.unwrap_or(if lat { 2 } else { 65536 })]
    };
    let max_size = *sizes.iter().max().unwrap_or(&2);
    if max_size == 0 || max_size > 1 << 31 {
        return Err(format!("message size {max_size} out of 1..=2^31"));
    }
    let iters = a.iters.unwrap_or(if lat {
        DEFAULT_LAT_ITERS
    } else {
        DEFAULT_BW_ITERS
    });
    if iters == 0 {
        return Err("-n must be at least 1".into());
    }
    let duration = match a.duration {
        Some(d) if !(d > 0.0 && d < 1e6) => return Err(format!("-D {d}: must be positive")),
        Some(d) => Some(Duration::from_secs_f64(d)),
        None => None,
    };
    // perftest inlines by default in latency tests only
    let default_inline = match (op, lat) {
        (Op::Send | Op::Write, true) if conn == Conn::Dc => DEFAULT_INLINE_DC,
        (Op::Send, true) if conn == Conn::Ud => DEFAULT_INLINE_SEND_UD,
        (Op::Send, true) => DEFAULT_INLINE_SEND,
        (Op::Write, true) => DEFAULT_INLINE_WRITE,
        _ => 0,
    };
    let inline_max = a.inline_size.unwrap_or(default_inline);
    if inline_max > 0 && matches!(op, Op::Read | Op::FetchAdd | Op::CmpSwap) {
        return Err("-I: READ and atomic requests carry no payload to inline".into());
    }
    let tx_depth = a.tx_depth.unwrap_or(if lat { 1 } else { 128 });
    if tx_depth == 0 || a.post_list == 0 {
        return Err("-t and -l must be at least 1".into());
    }
    // perftest (force_dependecies): messages over 8 KiB get a CQE each unless -Q is given
    // (not UD, not -a, not with events); the moderation is at most the send queue's depth
    let large = max_size > CQ_MOD_SIZE_LIMIT && conn != Conn::Ud && !a.all && !a.events;
    let cq_mod = match a.cq_mod {
        Some(q) => q,
        None if lat || large => 1,
        None => 100,
    };
    let cq_mod = if lat {
        cq_mod
    } else {
        cq_mod.min(a.tx_depth.unwrap_or(128).max(1))
    };
    if cq_mod == 0 {
        return Err("-Q must be at least 1".into());
    }
    if lat && a.post_list > 1 {
        return Err(
            "-l (post list) applies to bandwidth tests: latency posts one WR at a time".into(),
        );
    }
    if a.post_list > crate::backend::MAX_POST_LIST {
        return Err(format!(
            "-l {}: at most {}",
            a.post_list,
            crate::backend::MAX_POST_LIST
        ));
    }
    if !lat && a.post_list > tx_depth {
        return Err(format!("-l {} exceeds -t {tx_depth}", a.post_list));
    }
    // Bandwidth: once the send queue cannot take another post list, a signaled WR must already
    // be posted, or no CQE would ever free it: at most tx_depth - post_list + 1 WRs per CQE.
    let cq_mod = if lat {
        cq_mod
    } else {
        cq_mod.min(tx_depth - a.post_list + 1)
    };
    let mtu = a.mtu.unwrap_or(4096);
    if !mtu_ok(mtu) {
        return Err(format!("-m {mtu}: one of 256, 512, 1024, 2048, 4096"));
    }
    if conn == Conn::Ud && max_size > u64::from(mtu) {
        return Err(format!(
            "-c UD: a datagram is at most one MTU ({mtu} bytes): -s {max_size} is larger"
        ));
    }
    let rx_depth = perftest_rx_depth(op, conn, a.rx_depth, duration.is_none().then_some(iters));
    // Unsignaled WRs hold their send-queue slot until a later CQE retires them.
    let sq_depth = tx_depth.max(cq_mod).max(a.post_list).max(2);
    let params = RunParams {
        size: 0,
        iters,
        duration,
        inline_max,
        tx_depth,
        post_list: a.post_list,
        cq_mod,
        poll,
        warm_up: if a.perform_warm_up {
            (iters / 10).clamp(10, 1000)
        } else {
            0
        },
        patience: (a.peer_timeout > 0).then(|| Duration::from_secs(a.peer_timeout)),
        rx_depth,
    };
    let testbed = TestbedConfig {
        dev: a.dev.clone(),
        force_emu: a.emu,
        max_size,
        sq_depth,
        rq_depth: rx_depth.max(tx_depth).max(2),
        max_inline: inline_max,
        bf: a.bf.map(|b| b == OnOff::On),
        events: poll == PollMode::Event,
        hugepages: a.use_hugepages,
        mtu,
        max_rd_atomic,
        cross_process: a.host.is_some() || a.server,
        pcap: a.pcap.clone(),
        cpu_cost: a.cpu_cost,
        ib_port: a.ib_port,
        gid_index: a.gid_index,
        echo: false,
        conn,
        sl: a.sl,
        timeout: a.qp_timeout,
        log_dci_streams: a.log_dci_streams,
    };
    Ok(Plan {
        op,
        lat,
        sizes,
        params,
        testbed,
    })
}

/// perftest's `MSG_SIZE_CQ_MOD_LIMIT`: above it bandwidth tests signal every WR by default.
pub const CQ_MOD_SIZE_LIMIT: u64 = 8192;

/// Most QPs per side (`-q`), as perftest's `MAX_QP_NUM`.
pub const MAX_QPS: u32 = 16_384;

/// perftest's UC and UD receive depth cap (`UC_MAX_RX`).
const UC_MAX_RX: u32 = 16_000;

/// The receive queue depth perftest works with (`force_dependecies` in its
/// `perftest_parameters.c`): `-r` or 512 (1 for RDMA tests); in an iterations run of SEND at
/// most the iterations, UC and UD taking the iterations (at most 16000) when `-r` is not given;
/// rounded up to even for SEND.
pub fn perftest_rx_depth(op: Op, conn: Conn, given: Option<u32>, iters: Option<u64>) -> u32 {
    let mut r = given.unwrap_or(DEFAULT_RX_DEPTH);
    if op != Op::Send {
        return r;
    }
    if let Some(n) = iters {
        let n = u32::try_from(n).unwrap_or(u32::MAX);
        r = r.min(n);
        if given.is_none() && matches!(conn, Conn::Uc | Conn::Ud) {
            r = n.min(UC_MAX_RX);
        }
    }
    if r % 2 == 1 { r + 1 } else { r }
}

fn run_test<O>(op: Op, lat: bool, a: &TestArgs<O>) -> Result<(), String>
where
    O: clap::ValueEnum + Clone + Send + Sync + 'static,
{
    let plan = plan(op, lat, a)?;
    if a.host.is_some() || a.server {
        return crate::remote::run(&plan, a);
    }
    if a.rdma_cm {
        return Err("-R/--rdma_cm needs a peer (HOST or --server)".into());
    }
    if a.connect_only {
        return Err("--connect_only needs a peer (HOST or --server)".into());
    }
    let mut tb = crate::backend::open(&plan.testbed)?;
    let (mut local, mut remote) = tb.endpoints();
    if op == Op::Send {
        // as perftest: buffer keys are shown for RDMA operations only
        local.rkey_vaddr = None;
        remote.rkey_vaddr = None;
    }
    let mut rep = Reporter::new(&plan, a);
    let mut header = rep.header(
        &plan,
        tb.device(),
        tb.bf(),
        tb.max_inline(),
        tb.buffers(),
        "loopback (both QPs in this process)",
        local,
        remote,
    );
    (header.ethernet, header.gid_index) = tb.link();
    rep.begin(tb.emulated(), &header)?;
    for &size in &plan.sizes {
        let mut p = plan.params;
        p.size = size as u32;
        let label = format!("{} {size} B", title(op, lat));
        let (a_side, b_side) = tb.sides();
        if lat {
            let run = match op {
                Op::Send | Op::Write => bench::lat_pingpong(op, a_side, b_side, &p, &label)?,
                _ => bench::lat_rtt(op, a_side, &p, &label)?,
            };
            rep.lat_result(size, &run.samples_us)?;
        } else {
            let run = bench::bw_stream(op, a_side, Some(b_side), &p, &label)?;
            rep.bw_result(size, &run)?;
        }
    }
    rep.finish(
        &header,
        tb.emulated(),
        tb.counters(),
        tb.driver_counters(),
        tb.cost(),
    )
}

/// Prints the perftest report as results come in, and writes JSON and histograms at the end.
pub struct Reporter {
    out: Box<dyn Write>,
    op: Op,
    lat: bool,
    basis: LatencyBasis,
    many_sizes: bool,
    histogram: Option<PathBuf>,
    json: Option<Option<PathBuf>>,
    counters: bool,
    cq_mod: u32,
    forced_emu: bool,
    json_rows: Vec<serde_json::Value>,
    lat_rows: Vec<(u64, LatencyStats)>,
    /// Compute perftest's bandwidth peak (not with `-N` or `-D`).
    peak: bool,
    /// `--report_gbits`.
    gbits: bool,
    /// `-H` (sorted) / `-U` (unsorted): print every sample.
    all_samples: Option<bool>,
    /// Histogram files written.
    written: Vec<PathBuf>,
    /// Connection type for the header.
    conn: &'static str,
    /// This side is `--server` of a peer run.
    server: bool,
    /// In one process both sides are here (perftest's duplex lines).
    loopback: bool,
    /// QPs per side.
    qps: u32,
    /// Iterations of the run (`None` with `-D`).
    iters: Option<u64>,
}

impl std::fmt::Debug for Reporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reporter")
            .field("op", &self.op)
            .finish_non_exhaustive()
    }
}

impl Reporter {
    /// A reporter for `plan` with the output options of `a`. With `--json` and no file, stdout
    /// carries only the JSON and the table goes to stderr.
    pub fn new<O>(plan: &Plan, a: &TestArgs<O>) -> Self
    where
        O: clap::ValueEnum + Clone + Send + Sync + 'static,
    {
        let json_to_stdout = matches!(a.json, Some(None));
        Self {
            out: if json_to_stdout {
                Box::new(std::io::stderr())
            } else {
                Box::new(std::io::stdout())
            },
            op: plan.op,
            lat: plan.lat,
            basis: match plan.op {
                Op::Send | Op::Write => LatencyBasis::HalfRtt,
                _ => LatencyBasis::Rtt,
            },
            many_sizes: plan.sizes.len() > 1,
            histogram: a.histogram.clone(),
            json: a.json.clone(),
            counters: a.counters,
            cq_mod: plan.params.cq_mod,
            forced_emu: plan.testbed.force_emu,
            json_rows: Vec::new(),
            lat_rows: Vec::new(),
            peak: !a.no_peak && plan.params.duration.is_none(),
            gbits: a.report_gbits,
            all_samples: if a.report_unsorted {
                Some(false)
            } else {
                a.report_histogram.then_some(true)
            },
            written: Vec::new(),
            conn: plan.testbed.conn.name(),
            server: a.server,
            loopback: a.host.is_none() && !a.server,
            qps: a.num_qps,
            iters: plan.params.duration.is_none().then_some(plan.params.iters),
        }
    }

    /// The header block for this run.
    #[allow(clippy::too_many_arguments)]
    pub fn header(
        &self,
        plan: &Plan,
        device: String,
        bf: bool,
        max_inline: u32,
        buffers: String,
        data_ex: &str,
        local: Endpoint,
        remote: Endpoint,
    ) -> Header {
        let op = plan.op;
        Header {
            title: title(op, plan.lat).to_owned(),
            device,
            connection: self.conn,
            srq: matches!(plan.testbed.conn, Conn::Xrc | Conn::Dc),
            // perftest's lines: TX depth on the client (and in duplex runs: one process holds
            // both sides here), RX depth in SEND tests on the server (and duplex), each as
            // perftest clamps it to the iterations of the run
            tx_depth: (!self.server).then(|| {
                let t = u64::from(plan.params.tx_depth);
                match plan.params.duration {
                    None => t.min(plan.params.iters) as u32,
                    Some(_) => t as u32,
                }
            }),
            rx_depth: (op == Op::Send && (self.server || self.loopback))
                .then_some(plan.params.rx_depth),
            qps: self.qps,
            more: Vec::new(),
            cq_mod: (!plan.lat).then_some(plan.params.cq_mod),
            mtu: plan.testbed.mtu,
            ethernet: false,
            gid_index: None,
            max_inline: max_inline.min(plan.params.inline_max),
            outstand_reads: matches!(op, Op::Read | Op::FetchAdd | Op::CmpSwap)
                .then_some(u32::from(plan.testbed.max_rd_atomic)),
            data_ex: data_ex.to_owned(),
            doorbell: if bf {
                "BlueFlame (64-byte WQE copy)".into()
            } else {
                "8-byte doorbell".into()
            },
            post_list: plan.params.post_list,
            poll: plan.params.poll.to_string(),
            buffers,
            local,
            remote,
        }
    }

    fn w(&mut self, s: &str) -> Result<(), String> {
        self.out
            .write_all(s.as_bytes())
            .map_err(|e| format!("write: {e}"))
    }

    /// Prints the emulator line, the header block and the table header.
    pub fn begin(&mut self, emulated: bool, header: &Header) -> Result<(), String> {
        if emulated {
            let line = emulator_line(self.forced_emu);
            self.w(&format!("{line}\n"))?;
        }
        self.w(&header.render())?;
        let th = match (self.lat, self.gbits) {
            (true, _) => report::LAT_HEADER,
            (false, false) => report::BW_HEADER,
            (false, true) => report::BW_HEADER_GBITS,
        };
        self.w(&format!("{th}\n"))
    }

    /// Prints one latency row and writes its histogram.
    pub fn lat_result(&mut self, size: u64, samples_us: &[f64]) -> Result<(), String> {
        let st = LatencyStats::from_samples(samples_us)
            .ok_or_else(|| format!("size {size}: no samples"))?;
        // perftest prints the iterations of the run (`-n`), whatever number of intervals
        // its side measured (a SEND latency server times n-1 of them); `samples` says that
        let iterations = self.iters.unwrap_or(st.samples as u64);
        self.w(&format!("{}\n", report::lat_row(size, iterations, &st)))?;
        self.json_rows.push(report::lat_json(size, iterations, &st));
        if let Some(sorted) = self.all_samples {
            let mut v = samples_us.to_vec();
            if sorted {
                v.sort_by(f64::total_cmp);
            }
            let mut t = format!(
                " #, {} of {size} B{}\n",
                self.basis.json_tag(),
                if sorted { ", sorted" } else { "" }
            );
            for (i, x) in v.iter().enumerate() {
                t.push_str(&format!("{}, {x:.3}\n", i + 1));
            }
            self.w(&t)?;
        }
        if let Some(path) = &self.histogram {
            let path = histogram_path(path, size, self.many_sizes);
            let t = format!(
                "{} {size} B, {}",
                title(self.op, true),
                self.basis.json_tag()
            );
            let svg = crate::svg::render(&t, samples_us).ok_or("no samples for the histogram")?;
            std::fs::write(&path, svg).map_err(|e| format!("{}: {e}", path.display()))?;
            self.written.push(path);
        }
        self.lat_rows.push((size, st));
        Ok(())
    }

    /// Prints one bandwidth row.
    pub fn bw_result(&mut self, size: u64, run: &bench::BwRun) -> Result<BwStats, String> {
        let st = BwStats::from_completions(size, &run.posted_ns, &run.completed_ns, self.peak)
            .ok_or_else(|| format!("size {size}: nothing completed"))?;
        self.bw_stats(&st)?;
        Ok(st)
    }

    /// Prints a bandwidth row computed elsewhere (the server's copy of the client's report).
    pub fn bw_stats(&mut self, st: &BwStats) -> Result<(), String> {
        self.w(&format!("{}\n", report::bw_row_in(st, self.gbits)))?;
        self.json_rows.push(report::bw_json(st));
        Ok(())
    }

    /// Prints a line of text inside the report.
    pub fn note(&mut self, s: &str) -> Result<(), String> {
        self.w(&format!(" {s}\n"))
    }

    /// Prints the footer and the counters, writes the JSON.
    pub fn finish(
        mut self,
        header: &Header,
        emulated: bool,
        counters: Option<serde_json::Value>,
        driver_counters: serde_json::Value,
        cost: Option<crate::cost::CostLog>,
    ) -> Result<(), String> {
        let cost = cost.map(|c| crate::cost::to_json(&c, crate::cost::clock_pair_ns()));
        if self.lat && !self.lat_rows.is_empty() {
            let f = report::lat_footer(self.basis, &self.lat_rows);
            self.w(&f)?;
        } else {
            self.w(&format!("{}\n", report::SEPARATOR))?;
            if !self.lat && !self.gbits && !self.json_rows.is_empty() {
                self.w(&format!(" {}\n", report::BW_UNIT_NOTE))?;
            }
        }
        match self.written.as_slice() {
            [] => {}
            [one] => self.w(&format!(" histogram written to {}\n", one.display()))?,
            [first, .., last] => {
                let t = format!(
                    " {} histograms written, one per size: {} ... {}\n",
                    self.written.len(),
                    first.display(),
                    last.display()
                );
                self.w(&t)?;
            }
        }
        if let Some(c) = &cost {
            let mut t = crate::cost::to_text(c);
            if emulated {
                t.push_str(&crate::cost::emulated_doorbell_note(c));
            }
            self.w(&t)?;
        }
        if self.counters {
            let t = counters_text(&driver_counters, counters.as_ref());
            self.w(&t)?;
        }
        if let Some(dest) = self.json.take() {
            let mut doc = serde_json::json!({
                "test": header.title,
                "device": header.device,
                "emulated": emulated,
                "connection": header.connection,
                "data_ex": header.data_ex,
                "bf": header.doorbell.starts_with("BlueFlame"),
                "post_list": header.post_list,
                "cq_mod": self.cq_mod,
                "tx_depth": header.tx_depth,
                "rx_depth": header.rx_depth,
                "num_qps": header.qps,
                "inline_size": header.max_inline,
                "poll": header.poll,
                "buffers": header.buffers,
                "results": std::mem::take(&mut self.json_rows),
            });
            if self.lat {
                doc["rtt_or_half"] = self.basis.json_tag().into();
                doc["dropped_samples"] = 0.into();
            } else {
                // the JSON figures are MB/sec (2^20 bytes) with or without --report_gbits
                doc["bw_unit"] = report::BW_UNIT.into();
            }
            doc["driver_counters"] = driver_counters;
            if let Some(c) = cost {
                doc["cpu_cost"] = c;
            }
            if let Some(c) = counters {
                doc["emu_counters"] = c;
            }
            let text = serde_json::to_string_pretty(&doc).map_err(|e| format!("json: {e}"))?;
            match dest {
                None => println!("{text}"),
                Some(path) => std::fs::write(&path, text + "\n")
                    .map_err(|e| format!("{}: {e}", path.display()))?,
            }
        }
        self.out.flush().map_err(|e| format!("write: {e}"))
    }
}

/// Name of the LD_PRELOAD front door's shared object.
pub const PRELOAD_SO: &str = "libmlx5_emu_preload.so";

/// The workspace this binary was built from (its manifest), for building the preload library
/// on first use.
const WORKSPACE_MANIFEST: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../Cargo.toml");

/// How to build the preload library next to a binary in `profile_dir` (a cargo output
/// directory `<target>/<profile>` or `<target>/<triple>/<profile>`): the `cargo build`
/// arguments after `build`.
pub fn preload_build_args(profile_dir: &Path) -> Result<Vec<std::ffi::OsString>, String> {
    build_args(profile_dir, "mlx5-emu-preload")
}

/// Name of the provider library `emu run --provider ours` preloads.
pub const PROVIDER_SO: &str = "libmlx5rs.so";

/// The `cargo build` arguments that build workspace package `package` next to a binary in
/// `profile_dir` (as [`preload_build_args`]).
pub fn build_args(profile_dir: &Path, package: &str) -> Result<Vec<std::ffi::OsString>, String> {
    let not_cargo = || {
        format!(
            "{} is not a cargo output directory (no CACHEDIR.TAG above it)",
            profile_dir.display()
        )
    };
    let profile = profile_dir
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(not_cargo)?;
    let parent = profile_dir.parent().ok_or_else(not_cargo)?;
    let (target_dir, triple) = if parent.join("CACHEDIR.TAG").exists() {
        (parent, None)
    } else {
        let grand = parent.parent().ok_or_else(not_cargo)?;
        if !grand.join("CACHEDIR.TAG").exists() {
            return Err(not_cargo());
        }
        (grand, parent.file_name())
    };
    let mut args: Vec<std::ffi::OsString> = vec![
        "build".into(),
        "--manifest-path".into(),
        WORKSPACE_MANIFEST.into(),
        "-p".into(),
        package.into(),
        "--target-dir".into(),
        target_dir.into(),
    ];
    match profile {
        "debug" => {}
        "release" => args.push("--release".into()),
        other => args.extend(["--profile".into(), other.into()]),
    }
    if let Some(t) = triple {
        args.extend(["--target".into(), t.to_owned()]);
    }
    Ok(args)
}

/// Build the preload library next to this binary (same workspace, target directory, profile
/// and target), once: the first `mlx5 emu run` after `cargo run -p mlx5-tools` needs no
/// separate build step. Cargo holds its build lock only while compiling, so this also works
/// from a test that `cargo test` runs.
fn build_preload(profile_dir: &Path, so: &Path) -> Result<(), String> {
    build_next_to(profile_dir, so, "mlx5-emu-preload", "or pass --so")
}

/// Build workspace package `package` (a cdylib whose product is `so`) next to this binary.
fn build_next_to(profile_dir: &Path, so: &Path, package: &str, or: &str) -> Result<(), String> {
    let name = so
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let how = format!(
        "build it with `cargo build -p {package}` (same profile) {or}; {} not found",
        so.display()
    );
    if !Path::new(WORKSPACE_MANIFEST).exists() {
        return Err(format!(
            "{how}, and the source tree this binary was built from is gone"
        ));
    }
    let args = build_args(profile_dir, package).map_err(|e| format!("{how}: {e}"))?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    eprintln!("mlx5 emu run: building {name} (first use; cargo build -p {package})");
    let start = std::time::Instant::now();
    let st = std::process::Command::new(&cargo)
        .args(&args)
        .status()
        .map_err(|e| format!("{how}: running {}: {e}", cargo.to_string_lossy()))?;
    if !st.success() {
        return Err(format!("{how}: cargo build -p {package} failed ({st})"));
    }
    if !so.exists() {
        return Err(format!("{how}: cargo built it elsewhere"));
    }
    eprintln!(
        "mlx5 emu run: built {} in {:.1} s",
        so.display(),
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The preload library `emu run` uses: `--so`, else `MLX5_EMU_PRELOAD_SO`, else the one next
/// to this binary, built there on first use when missing.
fn preload_so(r: &crate::cli::EmuRunArgs) -> Result<PathBuf, String> {
    let explicit =
        r.so.clone()
            .or_else(|| std::env::var_os("MLX5_EMU_PRELOAD_SO").map(PathBuf::from));
    if let Some(so) = explicit {
        if !so.exists() {
            return Err(format!(
                "{} not found (from --so or MLX5_EMU_PRELOAD_SO)",
                so.display()
            ));
        }
        return Ok(so);
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot locate this binary: {e}"))?;
    let dir = exe
        .parent()
        .ok_or("cannot locate this binary's directory")?;
    let so = dir.join(PRELOAD_SO);
    if !so.exists() {
        build_preload(dir, &so)?;
    }
    Ok(so)
}

/// The directory libraries are built next to: this binary's.
fn preload_dir(_r: &crate::cli::EmuRunArgs) -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot locate this binary: {e}"))?;
    exe.parent()
        .map(Path::to_path_buf)
        .ok_or_else(|| "cannot locate this binary's directory".to_owned())
}

/// The provider library for `--provider ours`: `MLX5RS_SO`, else next to this binary (built
/// there on first use).
fn provider_so(dir: &Path) -> Result<PathBuf, String> {
    if let Some(so) = std::env::var_os("MLX5RS_SO").map(PathBuf::from) {
        return if so.exists() {
            Ok(so)
        } else {
            Err(format!("{} not found (from MLX5RS_SO)", so.display()))
        };
    }
    let so = dir.join(PROVIDER_SO);
    if !so.exists() {
        build_next_to(dir, &so, "mlx5-provider", "or set MLX5RS_SO")?;
    }
    Ok(so)
}

/// `mlx5 emu run -- PROGRAM ...`: runs the program with the preload library and the emulator
/// settings in its environment, and exits with its status.
fn emu_run(r: &crate::cli::EmuRunArgs) -> Result<(), String> {
    let so = preload_so(r)?;
    let (program, args) = r.program.split_first().ok_or("no program given")?;
    let mut cmd = std::process::Command::new(program);
    let mut preload = so.into_os_string();
    if r.provider == "ours" {
        preload.push(":");
        preload.push(provider_so(&preload_dir(r)?)?);
        cmd.env("MLX5RS_PROVIDER", "ours");
    }
    cmd.args(args)
        .env("LD_PRELOAD", &preload)
        .env("MLX5_EMU_HCAS", r.hcas.to_string())
        .env("MLX5_EMU_FABRIC", &r.fabric);
    if let Some(n) = r.node {
        cmd.env("MLX5_EMU_NODE", n.to_string());
    }
    if let Some(p) = &r.pcap {
        // Refuse an unwritable capture before the program runs (the preload would stop it
        // at its first device use; this names the option). Opened without truncating: the
        // capture may be one another process of the fabric is writing.
        let writable = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(p);
        match writable.and_then(|f| f.metadata()) {
            Ok(m) if m.is_file() => {}
            Ok(_) => return Err(format!("--pcap {}: not a regular file", p.display())),
            Err(e) => return Err(format!("--pcap {}: cannot write: {e}", p.display())),
        }
        cmd.env("MLX5_EMU_PCAP", p);
    }
    if r.trace {
        cmd.env("MLX5_EMU_TRACE", "1");
    }
    let status = cmd.status().map_err(|e| format!("{program}: {e}"))?;
    match status.code() {
        Some(0) => Ok(()),
        Some(c) => std::process::exit(c),
        None => Err(format!("{program} was killed by a signal ({status})")),
    }
}

/// The first line of a run on the emulator.
pub fn emulator_line(forced: bool) -> &'static str {
    if forced {
        "running on the emulated ConnectX (mlx5-emu): --emu given"
    } else {
        "running on the emulated ConnectX (mlx5-emu): no NIC found"
    }
}

/// With several sizes, `lat.svg` becomes `lat-<size>.svg`.
fn histogram_path(path: &Path, size: u64, many: bool) -> PathBuf {
    if !many {
        return path.to_path_buf();
    }
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("histogram");
    let ext = path.extension().and_then(|s| s.to_str()).unwrap_or("svg");
    path.with_file_name(format!("{stem}-{size}.{ext}"))
}

/// The `--counters` text: the driver's own counts, then the emulated device's.
fn counters_text(driver: &serde_json::Value, device: Option<&serde_json::Value>) -> String {
    let mut s = String::from(" driver, both QPs (rings = 8-byte doorbells + BlueFlame copies):\n");
    if let serde_json::Value::Object(m) = driver {
        for (k, v) in m {
            s.push_str(&format!("   {k:<32} {v}\n"));
        }
    }
    match device {
        Some(serde_json::Value::Object(m)) => {
            s.push_str(
                " emulated device (doorbells = doorbell writes it observed; writes landing \
                 between two of its scans count once):\n",
            );
            for (k, v) in m {
                s.push_str(&format!("   {k:<32} {v}\n"));
            }
        }
        _ => s.push_str(" device counters: only the emulated device exposes them here\n"),
    }
    s
}

/// `mlx5 pingpong`: ibv_rc_pingpong's exchange of SENDs with its options and its two result
/// lines (full round trips per iteration, not halved): a server without HOST, a client with
/// one, both ends in this process with `--loopback`.
fn pingpong(a: &PingpongArgs) -> Result<(), String> {
    if a.iters == 0 || a.size == 0 || a.rx_depth == 0 {
        return Err("-n, -s and -r must be at least 1".into());
    }
    if !mtu_ok(a.mtu) {
        return Err(format!("-m {}: one of 256, 512, 1024, 2048, 4096", a.mtu));
    }
    if a.ib_port == 0 {
        return Err("-i: ports are numbered from 1".into());
    }
    if a.sl > 15 {
        return Err(format!("-l {}: service levels are 0..=15", a.sl));
    }
    if a.loopback && (a.port.is_some() || a.bind.is_some()) {
        return Err("-p/--bind: the TCP exchange needs a peer; drop --loopback".into());
    }
    if a.bind.is_some() && a.host.is_some() {
        return Err("--bind: the address the server listens on; a client has HOST".into());
    }
    if a.loopback && (a.chk || a.chk_all) {
        return Err("-c checks a peer's messages: drop --loopback".into());
    }
    let cfg = TestbedConfig {
        dev: a.dev.clone(),
        force_emu: a.emu,
        max_size: u64::from(a.size),
        sq_depth: 2,
        rq_depth: a.rx_depth.max(2),
        max_inline: 0,
        bf: None,
        events: a.events,
        hugepages: false,
        mtu: a.mtu,
        max_rd_atomic: 1,
        cross_process: !a.loopback,
        pcap: None,
        cpu_cost: false,
        ib_port: a.ib_port,
        gid_index: a.gid_idx,
        echo: !a.loopback,
        conn: Conn::Rc,
        sl: a.sl,
        timeout: 14,
        log_dci_streams: 0,
    };
    let p = RunParams {
        size: a.size,
        iters: a.iters,
        duration: None,
        inline_max: 0,
        tx_depth: 1,
        post_list: 1,
        cq_mod: 1,
        poll: if a.events {
            PollMode::Event
        } else {
            PollMode::Busy
        },
        warm_up: 0,
        patience: (a.peer_timeout > 0).then(|| Duration::from_secs(a.peer_timeout)),
        rx_depth: a.rx_depth,
    };
    if !a.loopback {
        return crate::remote::pingpong(a, &cfg, &p);
    }
    let mut tb = crate::backend::open(&cfg)?;
    if tb.emulated() {
        println!("{}", emulator_line(a.emu));
    }
    let (l, r) = tb.endpoints();
    println!(
        "{}",
        pingpong_address("local", l.lid, l.qpn, l.psn, &[0; 16])
    );
    println!(
        "{}",
        pingpong_address("remote", r.lid, r.qpn, r.psn, &[0; 16])
    );
    let (x, y) = tb.sides();
    let start = std::time::Instant::now();
    bench::lat_pingpong(Op::Send, x, y, &p, "pingpong")?;
    let usec = start.elapsed().as_secs_f64() * 1e6;
    let (line1, line2) = pingpong_lines(u64::from(a.size), a.iters, usec);
    println!("{line1}");
    println!("{line2}");
    Ok(())
}

/// ibv_rc_pingpong's address line; the GID as `inet_ntop` prints it (`::` when zero).
pub fn pingpong_address(which: &str, lid: u16, qpn: u32, psn: u32, gid: &[u8; 16]) -> String {
    let g = std::net::Ipv6Addr::from(*gid);
    let pad = if which == "local" { " " } else { "" };
    format!("  {which} address:{pad} LID {lid:#06x}, QPN {qpn:#08x}, PSN {psn:#08x}, GID {g}")
}

/// ibv_rc_pingpong's result lines: bytes both ways over the total time, and the time per
/// iteration (a full round trip, not halved).
pub fn pingpong_lines(size: u64, iters: u64, usec: f64) -> (String, String) {
    let bytes = size * iters * 2;
    let secs = usec / 1e6;
    let mbit = if usec > 0.0 {
        bytes as f64 * 8.0 / usec
    } else {
        0.0
    };
    let per_iter = if iters > 0 { usec / iters as f64 } else { 0.0 };
    (
        format!("{bytes} bytes in {secs:.2} seconds = {mbit:.2} Mbit/sec"),
        format!("{iters} iters in {secs:.2} seconds = {per_iter:.2} usec/iter"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pingpong_lines_use_full_round_trips() {
        // 1000 iterations of 10 us RTT (5 us halves) of 4096 bytes: 10 ms in total
        let (a, b) = pingpong_lines(4096, 1000, 10_000.0);
        assert_eq!(a, "8192000 bytes in 0.01 seconds = 6553.60 Mbit/sec");
        assert_eq!(b, "1000 iters in 0.01 seconds = 10.00 usec/iter");
        assert_eq!(
            pingpong_address("local", 1, 0x388a01, 0x1c36ee, &[0; 16]),
            "  local address:  LID 0x0001, QPN 0x388a01, PSN 0x1c36ee, GID ::"
        );
    }

    #[test]
    fn perftest_defaults_and_checks() {
        use clap::Parser;
        let parse = |args: &[&str]| {
            let cli = crate::cli::Cli::try_parse_from(args).unwrap();
            match cli.cmd {
                Command::Lat(a) => plan(Op::Send, true, &a),
                Command::Bw(a) => plan(Op::Write, false, &a),
                _ => unreachable!(),
            }
        };
        let p = parse(&["mlx5", "lat", "send"]).unwrap();
        assert_eq!(p.sizes, vec![2]);
        assert_eq!(p.params.iters, DEFAULT_LAT_ITERS);
        assert_eq!(p.params.inline_max, DEFAULT_INLINE_SEND);
        assert_eq!((p.params.tx_depth, p.params.cq_mod), (1, 1));
        let p = parse(&["mlx5", "bw", "write"]).unwrap();
        assert_eq!(p.sizes, vec![65536]);
        assert_eq!(p.params.iters, DEFAULT_BW_ITERS);
        assert_eq!(p.params.inline_max, 0);
        // perftest: over 8 KiB every WR is signaled unless -Q says otherwise
        assert_eq!((p.params.tx_depth, p.params.cq_mod), (128, 1));
        let p = parse(&["mlx5", "bw", "write", "-s", "8192"]).unwrap();
        assert_eq!(p.params.cq_mod, 100);
        let p = parse(&["mlx5", "bw", "write", "-s", "8193", "-Q", "16"]).unwrap();
        assert_eq!(p.params.cq_mod, 16);
        let p = parse(&["mlx5", "bw", "write", "-a"]).unwrap();
        assert_eq!(p.params.cq_mod, 100);
        let p = parse(&["mlx5", "bw", "write", "-s", "64", "-t", "32"]).unwrap();
        assert_eq!(p.params.cq_mod, 32);
        // unsignaled WRs need send-queue room until a CQE retires them
        let p = parse(&["mlx5", "lat", "send", "-Q", "50", "-t", "4"]).unwrap();
        assert_eq!(p.testbed.sq_depth, 50);
        // bandwidth cq_mod is capped so the queue cannot fill with unsignaled WRs
        let p = parse(&["mlx5", "bw", "write", "-Q", "500", "-t", "64"]).unwrap();
        assert_eq!(p.params.cq_mod, 64);
        let p = parse(&["mlx5", "bw", "write", "-l", "64", "-t", "128", "-s", "64"]).unwrap();
        assert_eq!(p.params.cq_mod, 65);
        assert!(parse(&["mlx5", "bw", "write", "-l", "65", "-t", "128"]).is_err());
        assert!(parse(&["mlx5", "bw", "write", "-l", "8", "-t", "4"]).is_err());
        assert!(parse(&["mlx5", "lat", "send", "-l", "2"]).is_err());
        assert!(parse(&["mlx5", "lat", "send", "-D", "0"]).is_err());
        assert!(parse(&["mlx5", "lat", "send", "-t", "0"]).is_err());
        // perftest's -r (512), -c, -o, -S, -u reach the testbed
        let p = parse(&["mlx5", "lat", "send"]).unwrap();
        assert_eq!((p.testbed.rq_depth, p.params.rx_depth), (512, 512));
        assert_eq!(
            (p.testbed.conn, p.testbed.sl, p.testbed.timeout),
            (Conn::Rc, 0, 14)
        );
        let p = parse(&[
            "mlx5", "lat", "send", "-c", "UD", "-a", "-S", "5", "-u", "9",
        ])
        .unwrap();
        assert_eq!(p.sizes.len(), 12, "UD: 2..=4096");
        assert_eq!(p.params.inline_max, DEFAULT_INLINE_SEND_UD);
        assert_eq!(
            (p.testbed.conn, p.testbed.sl, p.testbed.timeout),
            (Conn::Ud, 5, 9)
        );
        let p = parse(&["mlx5", "lat", "send", "-r", "64", "-e"]).unwrap();
        assert_eq!(p.testbed.rq_depth, 64);
        assert!(p.testbed.events && p.params.poll == PollMode::Event);
        let p = parse(&["mlx5", "bw", "write", "-D", "1"]).unwrap();
        assert!(p.params.duration.is_some());
        assert!(parse(&["mlx5", "bw", "write", "-o", "4"]).is_err());
    }
}
