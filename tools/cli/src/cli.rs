//! Command-line definition (clap derive). Option names mirror perftest's where perftest has one.

use std::path::PathBuf;
use std::str::FromStr;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// The mlx5 tool, on a ConnectX or the emulated one: devices, info, lat and bw (perftest's
/// tests and options), pingpong, decode (WQEs, CQEs), diag, counters, trace, tune, and emu
/// (run any program on the emulated HCA).
#[derive(Debug, Parser)]
#[command(name = "mlx5", version, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub cmd: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// List RDMA devices: real mlx5 devices, and the emulated one marked "(emulated)".
    Devices(DevicesArgs),
    /// Device attributes and the limits derived from them.
    Info(InfoArgs),
    /// Latency test, as ib_{send,write,read,atomic}_lat.
    Lat(TestArgs<LatOp>),
    /// Bandwidth test, as ib_{send,write,read,atomic}_bw.
    Bw(TestArgs<BwOp>),
    /// RC ping-pong, as ibv_rc_pingpong.
    Pingpong(PingpongArgs),
    /// Decode a send WQE or a CQE given as hex bytes: every field by name.
    Decode(DecodeArgs),
    /// State of a QP and its CQs (indices, doorbell records, rings decoded, the error CQE and
    /// its WQE explained), from a flight-recorder dump or a live emulated run.
    Diag(DiagArgs),
    /// Port counters and hw_counters of a device (sysfs, or the emulator's), with deltas per
    /// interval.
    Counters(CountersArgs),
    /// The life of one operation stage by stage on the emulated ConnectX: work request,
    /// checks, WQE, doorbell, DMA, packets, responder, CQEs, poll.
    Trace(TraceArgs),
    /// The tuning knobs (inline, SQ depth, post list, signaling, poll mode, BlueFlame, CQ
    /// moderation) one at a time from a baseline: latency, doorbells, DMA and link traffic.
    Tune(TuneArgs),
    /// Emulator control.
    Emu {
        /// What to do with the emulator.
        #[command(subcommand)]
        cmd: EmuCommand,
    },
}

/// `mlx5 devices`.
#[derive(Debug, Args)]
pub struct DevicesArgs {
    /// List only the emulated device.
    #[arg(long)]
    pub emu: bool,
}

/// `mlx5 info`.
#[derive(Debug, Args)]
pub struct InfoArgs {
    /// Device name (default: the first one found).
    #[arg(short = 'd', long = "ib-dev", value_name = "DEV")]
    pub dev: Option<String>,
    /// Print every attribute.
    #[arg(short, long)]
    pub verbose: bool,
    /// Use the emulated HCA even if a real device exists.
    #[arg(long)]
    pub emu: bool,
}

/// `mlx5 emu ...`.
#[derive(Debug, Subcommand)]
pub enum EmuCommand {
    /// Run an unmodified rdma-core program (ibv_devinfo, ibv_rc_pingpong, ib_send_lat, ...) on
    /// the emulated ConnectX, through the LD_PRELOAD front door (`libmlx5_emu_preload.so`).
    Run(EmuRunArgs),
    /// Attach the emulated Ethernet port to a Linux interface: `up` creates a network
    /// namespace with a TAP interface in it, `down` removes them (needs CAP_NET_ADMIN;
    /// docs/raw-ethernet.md). Programs then run with `MLX5_EMU_TAP=<netns>/<ifname>`.
    Net(crate::net::NetArgs),
}

/// `mlx5 emu run [OPTIONS] -- PROGRAM [ARGS...]`.
#[derive(Debug, Args)]
pub struct EmuRunArgs {
    /// Number of emulated HCAs (mlx5_0, mlx5_1, ...).
    #[arg(long, default_value_t = 1)]
    pub hcas: u32,
    /// Fabric: `udp` (processes reach each other over RoCEv2 on the loopback interface) or
    /// `inprocess`.
    #[arg(long, default_value = "udp", value_parser = ["udp", "inprocess"])]
    pub fabric: String,
    /// LID of HCA 0 (1..=254); default: the first free one.
    #[arg(long)]
    pub node: Option<u16>,
    /// Capture both directions of the program's HCAs to this pcap file (processes of one run
    /// may share it); tshark: `--disable-protocol rpcordma` (docs/diagnostics.md).
    #[arg(long, value_name = "FILE.pcap")]
    pub pcap: Option<PathBuf>,
    /// One line per intercepted device call on stderr.
    #[arg(long)]
    pub trace: bool,
    /// The preload library (default: `MLX5_EMU_PRELOAD_SO`, else next to this binary, built there
    /// by cargo on first use).
    #[arg(long = "so", value_name = "PATH")]
    pub so: Option<PathBuf>,
    /// Which libibverbs provider serves the program's devices: `libmlx5` (rdma-core's) or
    /// `ours` (this driver as a provider, `libmlx5rs.so`, preloaded after the emulator's front
    /// door and built next to this binary on first use; docs/provider.md).
    #[arg(long, default_value = "libmlx5", value_parser = ["libmlx5", "ours"])]
    pub provider: String,
    /// The program and its arguments.
    #[arg(required = true, last = true, value_name = "PROGRAM")]
    pub program: Vec<String>,
}

/// `mlx5 pingpong`: ibv_rc_pingpong's options, names and defaults.
#[derive(Debug, Args)]
pub struct PingpongArgs {
    /// Peer host: connect to the server there. Without it, wait for a client (server), as
    /// ibv_rc_pingpong does.
    pub host: Option<String>,
    /// Wait for a client to connect (the default without HOST).
    #[arg(long, conflicts_with = "host")]
    pub server: bool,
    /// Both ends in this process: no peer, no TCP exchange.
    #[arg(long, conflicts_with_all = ["host", "server"])]
    pub loopback: bool,
    /// Address the server listens on (default 0.0.0.0; the server only).
    #[arg(long, value_name = "ADDR")]
    pub bind: Option<String>,
    /// Device name (default: the first one found).
    #[arg(short = 'd', long = "ib-dev", value_name = "DEV")]
    pub dev: Option<String>,
    /// Port of the device.
    #[arg(
        short = 'i',
        long = "ib-port",
        value_name = "PORT",
        default_value_t = 1
    )]
    pub ib_port: u8,
    /// Message size.
    #[arg(short = 's', long, default_value_t = 4096)]
    pub size: u32,
    /// Path MTU (256, 512, 1024, 2048, 4096).
    #[arg(short = 'm', long, default_value_t = 1024)]
    pub mtu: u32,
    /// Receives posted at a time.
    #[arg(
        short = 'r',
        long = "rx-depth",
        value_name = "DEPTH",
        default_value_t = 500
    )]
    pub rx_depth: u32,
    /// Iterations (exchanges).
    #[arg(short = 'n', long, default_value_t = 1000)]
    pub iters: u64,
    /// Service level.
    #[arg(short = 'l', long, default_value_t = 0)]
    pub sl: u8,
    /// Sleep on completion events (arm the CQ, wait on the channel) instead of polling.
    #[arg(short = 'e', long)]
    pub events: bool,
    /// Local GID index: the path carries a GRH and the GID is sent to the peer.
    #[arg(short = 'g', long = "gid-idx", value_name = "INDEX")]
    pub gid_idx: Option<u8>,
    /// Validate the received data as ibv_rc_pingpong does: the client zeroes the first byte of
    /// every page of its 0x7b-filled buffer, each side echoes what it receives, and that first
    /// byte of every page is checked (ibv_rc_pingpong: by the server, after the run; here: on
    /// both sides, in every message received). Mismatches are printed as "invalid data in
    /// page N" and fail the run.
    #[arg(short = 'c', long)]
    pub chk: bool,
    /// As -c, and check every byte of every message received (ibv_rc_pingpong checks the
    /// first byte of each page).
    #[arg(long = "chk-all")]
    pub chk_all: bool,
    /// TCP port for the address exchange (default 18515; not with --loopback).
    #[arg(short = 'p', long)]
    pub port: Option<u16>,
    /// Use the emulated HCA even if a real device exists.
    #[arg(long)]
    pub emu: bool,
    /// Fail when nothing arrives from the peer for this many seconds (0: wait for ever).
    #[arg(long = "peer_timeout", value_name = "SECS", default_value_t = DEFAULT_PEER_TIMEOUT_S)]
    pub peer_timeout: u64,
    /// Connect the QP through rdma_cm (to HOST:PORT) instead of the TCP address exchange.
    #[arg(short = 'R', long = "rdma_cm", conflicts_with = "loopback")]
    pub rdma_cm: bool,
}

/// Latency test operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LatOp {
    /// SEND / RECV ping-pong.
    Send,
    /// RDMA WRITE ping-pong (each side polls its buffer for the peer's write).
    Write,
    /// RDMA READ round trips.
    Read,
    /// Atomic round trips (fetch-and-add or compare-and-swap).
    Atomic,
    /// Raw Ethernet frames ping-pong on RAW_PACKET QPs, as raw_ethernet_lat (-Z/-P, -B/-E;
    /// -J/-j/-K/-k for IPv4/UDP headers): `tools/cli/src/raw_lat.rs`.
    Raw,
}

/// Bandwidth test operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BwOp {
    /// SEND stream into posted receives.
    Send,
    /// RDMA WRITE stream.
    Write,
    /// RDMA READ stream.
    Read,
    /// Atomic stream (fetch-and-add or compare-and-swap, -A), as ib_atomic_bw.
    Atomic,
}

/// Atomic operation of `lat atomic`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[allow(non_camel_case_types)]
pub enum AtomicType {
    /// Fetch and add.
    #[value(name = "FETCH_AND_ADD")]
    FETCH_AND_ADD,
    /// Compare and swap.
    #[value(name = "CMP_AND_SWAP")]
    CMP_AND_SWAP,
}

/// `on` / `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnOff {
    /// Enabled.
    On,
    /// Disabled.
    Off,
}

/// How completions are waited for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PollMode {
    /// Spin on the CQ.
    Busy,
    /// Arm the CQ and block on the completion channel.
    Event,
    /// Poll, then sleep this many microseconds when the CQ is empty.
    Interval(u64),
}

impl FromStr for PollMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "busy" => Ok(Self::Busy),
            "event" => Ok(Self::Event),
            _ => match s.strip_prefix("interval:") {
                Some(us) => match us.parse::<u64>() {
                    Ok(n) if n <= MAX_POLL_INTERVAL_US => Ok(Self::Interval(n)),
                    Ok(n) => Err(format!(
                        "interval {n} usec: at most {MAX_POLL_INTERVAL_US} (one second)"
                    )),
                    Err(e) => Err(format!("bad interval {us:?}: {e}")),
                },
                None => Err(format!("expected busy, event or interval:USEC, got {s:?}")),
            },
        }
    }
}

impl std::fmt::Display for PollMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Busy => f.write_str("busy poll"),
            Self::Event => f.write_str("event (CQ armed, channel wait)"),
            Self::Interval(us) => write!(f, "poll every {us} usec"),
        }
    }
}

/// Options shared by `lat` and `bw`, named as perftest names them.
#[derive(Debug, Args)]
pub struct TestArgs<Op: ValueEnum + Clone + Send + Sync + 'static> {
    /// The operation to measure.
    #[arg(value_enum)]
    pub op: Op,
    /// Peer host (client mode, as perftest). Without it and without --server, both ends run
    /// in this process (--loopback).
    pub host: Option<String>,
    /// Wait for a client to connect (perftest's server side).
    #[arg(long, conflicts_with_all = ["host", "loopback"])]
    pub server: bool,
    /// Both ends in this process (the default when no peer is given).
    #[arg(long, conflicts_with = "host")]
    pub loopback: bool,
    /// Device name.
    #[arg(short = 'd', long = "ib-dev", value_name = "DEV")]
    pub dev: Option<String>,
    /// Message size in bytes (default 2 for lat, 65536 for bw).
    #[arg(short = 's', long, value_name = "SIZE")]
    pub size: Option<u64>,
    /// Run all sizes 2..2^23.
    #[arg(short = 'a', long, conflicts_with = "size")]
    pub all: bool,
    /// Iterations (default 1000 for lat, 5000 for bw).
    #[arg(short = 'n', long, value_name = "ITERS")]
    pub iters: Option<u64>,
    /// Run for this many seconds instead of a number of iterations.
    #[arg(short = 'D', long, value_name = "SECS", conflicts_with = "iters")]
    pub duration: Option<f64>,
    /// Inline size: messages up to this size are copied into the WQE.
    #[arg(short = 'I', long = "inline_size", value_name = "INLINE")]
    pub inline_size: Option<u32>,
    /// Send queue depth (default 1 for lat, 128 for bw).
    #[arg(short = 't', long = "tx-depth", value_name = "TX_DEPTH")]
    pub tx_depth: Option<u32>,
    /// Work requests per doorbell (post list).
    #[arg(
        short = 'l',
        long = "post_list",
        value_name = "POST_LIST",
        default_value_t = 1
    )]
    pub post_list: u32,
    /// Request a completion every N work requests (default 1 for lat, 100 for bw).
    #[arg(short = 'Q', long = "cq-mod", value_name = "CQ_MOD")]
    pub cq_mod: Option<u32>,
    /// Path MTU (256, 512, 1024, 2048, 4096).
    #[arg(short = 'm', long, value_name = "MTU")]
    pub mtu: Option<u32>,
    /// Atomic operation of `lat atomic` and `bw atomic` (default FETCH_AND_ADD).
    #[arg(short = 'A', long = "atomic_type", value_enum)]
    pub atomic_type: Option<AtomicType>,
    /// Back the buffers with huge pages.
    #[arg(long = "use_hugepages")]
    pub use_hugepages: bool,
    /// Run unmeasured warm-up iterations first.
    #[arg(long = "perform_warm_up")]
    pub perform_warm_up: bool,
    /// TCP port for the address exchange (default 18515; with a peer only).
    #[arg(short = 'p', long)]
    pub port: Option<u16>,
    /// Address the server listens on (default 0.0.0.0; --server only).
    #[arg(long, value_name = "ADDR")]
    pub bind: Option<String>,
    /// With a peer: exchange addresses (perftest's format), connect the QPs, print the header
    /// block, and stop without measuring.
    #[arg(long = "connect_only")]
    pub connect_only: bool,
    /// Completion wait: busy, event, or interval:USEC.
    #[arg(long, value_name = "MODE", default_value = "busy")]
    pub poll: PollMode,
    /// BlueFlame writes (on) or 8-byte doorbells (off). Default: on where the device has it.
    #[arg(long, value_enum)]
    pub bf: Option<OnOff>,
    /// Write the results as JSON to FILE, or to stdout (the table then goes to stderr).
    #[arg(long, value_name = "FILE", num_args = 0..=1)]
    pub json: Option<Option<PathBuf>>,
    /// Latency tests: write the latency picture as SVG (latency by percentile beside a
    /// histogram with log counts; markers at p50, p99, p99.9, p99.99, max). With -a one file
    /// per size, FILE-SIZE.svg; the report names what it wrote.
    #[arg(long, value_name = "FILE.svg")]
    pub histogram: Option<PathBuf>,
    /// Source GID index (perftest's -x): the path carries a GRH and the GID goes to the peer.
    /// RoCE ports always use one: without -x, the port's RoCE v2 GID.
    #[arg(short = 'x', long = "gid-index", value_name = "INDEX")]
    pub gid_index: Option<u8>,
    /// Use the emulated HCA (its port: MLX5_EMU_LINK_LAYER=ib|eth) even if a real device exists.
    #[arg(long)]
    pub emu: bool,
    /// Emulator only: write every packet it puts on its fabric to this pcap file (RoCEv2 over
    /// UDP 4791, readable by Wireshark/tshark).
    #[arg(long, value_name = "FILE.pcap")]
    pub pcap: Option<PathBuf>,
    /// Time every driver call on the data path (post_send, poll_cq) and report the CPU cost
    /// per call, per WR and per CQE (adds two clock reads per call).
    #[arg(long = "cpu_cost")]
    pub cpu_cost: bool,
    /// Print the emulated device's counters (doorbells, BlueFlame writes, CQEs, ...) after the run.
    #[arg(long)]
    pub counters: bool,
    /// Connection type (perftest's -c): RC (default), UC (SEND and WRITE), UD (SEND; messages
    /// up to the path MTU); XRC and DC with a peer (HOST or --server): perftest's initiator and
    /// target QPs, SRQs and key exchange. SRD is refused by name.
    #[arg(short = 'c', long = "connection", value_enum, default_value_t = Conn::Rc)]
    pub connection: Conn,
    /// Sleep on CQ events (perftest's -e): the same as --poll event.
    #[arg(short = 'e', long = "events")]
    pub events: bool,
    /// perftest's -F (no warning about CPU frequency scaling): accepted; this tool prints no
    /// such warning.
    #[arg(short = 'F', long = "CPU-freq")]
    pub cpu_freq: bool,
    /// Latency tests: print every sample after the summary (perftest's -H), sorted.
    #[arg(short = 'H', long = "report-histogram")]
    pub report_histogram: bool,
    /// Latency tests: print every sample in the order measured (implies -H).
    #[arg(short = 'U', long = "report-unsorted")]
    pub report_unsorted: bool,
    /// Port of the device (1-based).
    #[arg(
        short = 'i',
        long = "ib-port",
        value_name = "PORT",
        default_value_t = 1
    )]
    pub ib_port: u8,
    /// Number of QPs (perftest's -q): only 1 is supported.
    #[arg(short = 'q', long = "qp", value_name = "NUM_QP", default_value_t = 1)]
    pub num_qps: u32,
    /// Service level of the path (0..=15).
    #[arg(short = 'S', long = "sl", value_name = "SL", default_value_t = 0)]
    pub sl: u8,
    /// RC retransmission timeout: 4.096 usec * 2^TIMEOUT (0..=31).
    #[arg(
        short = 'u',
        long = "qp-timeout",
        value_name = "TIMEOUT",
        default_value_t = 14
    )]
    pub qp_timeout: u8,
    /// Receive queue depth (perftest's default 512; SEND tests).
    #[arg(short = 'r', long = "rx-depth", value_name = "DEPTH")]
    pub rx_depth: Option<u32>,
    /// Bandwidth tests: no peak (perftest's -N): the peak column shows 0.
    #[arg(short = 'N', long = "noPeak")]
    pub no_peak: bool,
    /// Outstanding RDMA READs and atomics (perftest's -o; default 16, the device's limit).
    #[arg(short = 'o', long = "outs", value_name = "NUM")]
    pub outs: Option<u8>,
    /// Bandwidth tests: report peak and average in Gbit/sec (10^9 bits) instead of MiB/sec.
    #[arg(long = "report_gbits")]
    pub report_gbits: bool,
    /// With a peer: fail when nothing arrives from it for this many seconds (a server whose
    /// client vanished, a lost message on UC/UD). 0 waits for ever.
    #[arg(long = "peer_timeout", value_name = "SECS", default_value_t = DEFAULT_PEER_TIMEOUT_S)]
    pub peer_timeout: u64,
    /// With a peer: connect the QPs through rdma_cm (perftest's -R): the exchange travels on
    /// an rdma_cm connection of its own, the test's QP is connected by the connection
    /// manager (RC only).
    #[arg(short = 'R', long = "rdma_cm")]
    pub rdma_cm: bool,
    /// -c DC: ask for 2^N DCI stream channels (perftest's --log_dci_streams; 0 = none).
    #[arg(long = "log_dci_streams", value_name = "LOG_NUM", default_value_t = 0)]
    pub log_dci_streams: u16,
    /// perftest options this tool does not support yet: accepted by the parser only so that
    /// they are refused by name.
    #[command(flatten)]
    pub unsupported: Unsupported,
    /// perftest's raw Ethernet options (`lat raw` only).
    #[command(flatten)]
    pub raw: crate::raw_lat::RawArgs,
}

/// perftest's TCP port of the address exchange.
pub const DEFAULT_PORT: u16 = 18515;

/// Default of `--peer_timeout` (seconds).
pub const DEFAULT_PEER_TIMEOUT_S: u64 = 30;

/// Largest `--poll interval:USEC` (one second).
pub const MAX_POLL_INTERVAL_US: u64 = 1_000_000;

/// Connection type (perftest's `-c`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Conn {
    /// Reliable connected.
    #[value(name = "RC")]
    Rc,
    /// Unreliable connected.
    #[value(name = "UC")]
    Uc,
    /// Unreliable datagram.
    #[value(name = "UD")]
    Ud,
    /// Extended reliable connected (with a peer).
    #[value(name = "XRC")]
    Xrc,
    /// Dynamically connected (with a peer).
    #[value(name = "DC")]
    Dc,
    /// Scalable reliable datagram (refused).
    #[value(name = "SRD")]
    Srd,
}

impl Conn {
    /// perftest's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Rc => "RC",
            Self::Uc => "UC",
            Self::Ud => "UD",
            Self::Xrc => "XRC",
            Self::Dc => "DC",
            Self::Srd => "SRD",
        }
    }
}

/// One perftest option that is not supported yet.
#[derive(Debug, Clone, Copy)]
pub struct Refused {
    /// Short name, if any.
    pub short: Option<char>,
    /// Long name.
    pub long: &'static str,
    /// Takes a value.
    pub value: bool,
    /// Why, for the user.
    pub why: &'static str,
}

const fn refused(
    short: Option<char>,
    long: &'static str,
    value: bool,
    why: &'static str,
) -> Refused {
    Refused {
        short,
        long,
        value,
        why,
    }
}

/// perftest 4.5's options of ib_{send,write,read,atomic}_{lat,bw} that are not supported:
/// each is parsed, then refused with its reason.
pub const REFUSED: &[Refused] = &[
    refused(
        Some('b'),
        "bidirectional",
        false,
        "bidirectional bandwidth is not supported yet",
    ),
    refused(
        Some('C'),
        "report-cycles",
        false,
        "reports are in microseconds only",
    ),
    refused(
        Some('z'),
        "com_rdma_cm",
        false,
        "exchanging addresses through rdma_cm is not supported yet",
    ),
    refused(
        Some('X'),
        "vector",
        true,
        "completion vectors are not supported",
    ),
    refused(Some('g'), "mcg", false, "multicast is not supported"),
    refused(Some('M'), "MGID", true, "multicast is not supported"),
    refused(
        Some('L'),
        "hop_limit",
        true,
        "raw Ethernet QPs are not supported",
    ),
    refused(Some('T'), "tos", true, "not supported with -R yet"),
    refused(
        Some('W'),
        "report-counters",
        true,
        "use --counters (the emulated device's counters)",
    ),
    refused(
        Some('O'),
        "dualport",
        false,
        "dual-port runs are not supported",
    ),
    refused(
        Some('w'),
        "limit_bw",
        true,
        "result verification limits are not supported",
    ),
    refused(
        Some('y'),
        "limit_msgrate",
        true,
        "result verification limits are not supported",
    ),
    refused(
        Some('f'),
        "margin",
        true,
        "margins apply to -D runs with a peer, not supported yet",
    ),
    refused(Some('V'), "version", false, "use `mlx5 --version`"),
    refused(None, "out_json", false, "use --json [FILE]"),
    refused(None, "out_json_file", true, "use --json FILE"),
    refused(
        None,
        "cpu_util",
        false,
        "CPU utilisation is not reported; see --cpu_cost",
    ),
    refused(
        None,
        "dlid",
        true,
        "the destination LID always comes from the exchange",
    ),
    refused(
        None,
        "dont_xchg_versions",
        false,
        "the version exchange is always made",
    ),
    refused(
        None,
        "force-link",
        true,
        "the link layer is the port's (emulator: MLX5_EMU_LINK_LAYER)",
    ),
    refused(
        None,
        "inline_recv",
        true,
        "inline receive (scatter to CQE) is not supported",
    ),
    refused(
        None,
        "use-srq",
        false,
        "shared receive queues are not supported by this tool yet",
    ),
    refused(None, "ipv6", false, "the GID is chosen by -x"),
    refused(None, "source_ip", true, "not supported with -R yet"),
    refused(
        None,
        "latency_gap",
        true,
        "a delay between posts is not supported",
    ),
    refused(None, "mmap", true, "buffers are allocated by the tool"),
    refused(
        None,
        "mmap-offset",
        true,
        "buffers are allocated by the tool",
    ),
    refused(None, "odp", false, "on-demand paging is not supported"),
    refused(None, "output", true, "the full report is always printed"),
    refused(
        None,
        "use_old_post_send",
        false,
        "the driver has one post path",
    ),
    refused(None, "pkey_index", true, "P_Key index 0 only"),
    refused(None, "retry_count", true, "not supported with -R yet"),
    refused(None, "tclass", true, "the traffic class is 0"),
    refused(
        None,
        "recv_post_list",
        true,
        "receives are posted in lists of up to 64",
    ),
    refused(None, "mr_per_qp", false, "one QP, one MR"),
    refused(
        None,
        "report-both",
        false,
        "bidirectional bandwidth is not supported yet",
    ),
    refused(
        None,
        "report-per-port",
        false,
        "dual-port runs are not supported",
    ),
    refused(None, "reversed", false, "the client always sends"),
    refused(None, "run_infinitely", false, "use -D SECS"),
    refused(
        None,
        "wait_destroy",
        true,
        "resources are destroyed at once",
    ),
    refused(
        None,
        "disable_pcie_relaxed",
        false,
        "relaxed ordering is not requested",
    ),
    refused(None, "burst_size", true, "rate limiting is not supported"),
    refused(
        None,
        "typical_pkt_size",
        true,
        "rate limiting is not supported",
    ),
    refused(None, "rate_limit", true, "rate limiting is not supported"),
    refused(None, "rate_units", true, "rate limiting is not supported"),
    refused(
        None,
        "rate_limit_type",
        true,
        "rate limiting is not supported",
    ),
    refused(
        None,
        "log_active_dci_streams",
        true,
        "every DCI stream channel is active",
    ),
    refused(None, "aes_xts", false, "encryption is not supported"),
    refused(None, "encrypt_on_tx", false, "encryption is not supported"),
    refused(None, "sig_before", false, "encryption is not supported"),
    refused(None, "aes_block_size", true, "encryption is not supported"),
    refused(
        None,
        "data_enc_keys_number",
        true,
        "encryption is not supported",
    ),
    refused(None, "kek_path", true, "encryption is not supported"),
    refused(
        None,
        "credentials_path",
        true,
        "encryption is not supported",
    ),
    refused(
        None,
        "data_enc_key_app_path",
        true,
        "encryption is not supported",
    ),
];

impl Refused {
    /// How the option is written (`-R/--rdma_cm`).
    pub fn spelling(&self) -> String {
        match self.short {
            Some(c) => format!("-{c}/--{}", self.long),
            None => format!("--{}", self.long),
        }
    }
}

/// The unsupported perftest options given on the command line (see [`REFUSED`]).
#[derive(Debug, Clone, Default)]
pub struct Unsupported(pub Vec<&'static Refused>);

impl Unsupported {
    /// The error naming the first option given, if any.
    pub fn check(&self) -> Result<(), String> {
        match self.0.first() {
            None => Ok(()),
            Some(r) => Err(format!(
                "{}: not supported (perftest option): {}",
                r.spelling(),
                r.why
            )),
        }
    }
}

impl clap::FromArgMatches for Unsupported {
    fn from_arg_matches(m: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let mut s = Self::default();
        s.update_from_arg_matches(m)?;
        Ok(s)
    }
    fn update_from_arg_matches(&mut self, m: &clap::ArgMatches) -> Result<(), clap::Error> {
        self.0 = REFUSED
            .iter()
            .filter(|r| m.value_source(r.long) == Some(clap::parser::ValueSource::CommandLine))
            .collect();
        Ok(())
    }
}

impl Args for Unsupported {
    fn augment_args(mut cmd: clap::Command) -> clap::Command {
        for r in REFUSED {
            let mut a = clap::Arg::new(r.long).long(r.long).hide(true);
            if let Some(c) = r.short {
                a = a.short(c);
            }
            a = if r.value {
                a.action(clap::ArgAction::Set).value_name("VALUE")
            } else {
                a.action(clap::ArgAction::SetTrue)
            };
            cmd = cmd.arg(a);
        }
        cmd
    }
    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

/// All sizes of `-a`: 2, 4, ..., 2^23.
pub fn all_sizes() -> impl Iterator<Item = u64> {
    (1..=23).map(|k| 1u64 << k)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn parses_perftest_style_options() {
        let cli = Cli::try_parse_from([
            "mlx5",
            "lat",
            "send",
            "peer",
            "-s",
            "64",
            "-n",
            "10",
            "-I",
            "0",
            "-t",
            "4",
            "-l",
            "2",
            "-Q",
            "3",
            "--poll",
            "interval:50",
            "--bf",
            "off",
            "--json",
        ])
        .unwrap();
        let Command::Lat(a) = cli.cmd else {
            panic!("not lat")
        };
        assert_eq!(a.op, LatOp::Send);
        assert_eq!(a.host.as_deref(), Some("peer"));
        assert_eq!(a.size, Some(64));
        assert_eq!(a.iters, Some(10));
        assert_eq!(a.inline_size, Some(0));
        assert_eq!(a.tx_depth, Some(4));
        assert_eq!(a.post_list, 2);
        assert_eq!(a.cq_mod, Some(3));
        assert_eq!(a.poll, PollMode::Interval(50));
        assert_eq!(a.bf, Some(OnOff::Off));
        assert_eq!(a.json, Some(None));
    }

    #[test]
    fn json_takes_an_optional_file_and_bad_poll_is_refused() {
        let cli = Cli::try_parse_from(["mlx5", "bw", "write", "--json", "out.json"]).unwrap();
        let Command::Bw(a) = cli.cmd else {
            panic!("not bw")
        };
        assert_eq!(a.json, Some(Some(PathBuf::from("out.json"))));
        assert_eq!(a.op, BwOp::Write);
        assert!(Cli::try_parse_from(["mlx5", "lat", "send", "--poll", "sometimes"]).is_err());
        assert!(Cli::try_parse_from(["mlx5", "lat", "send", "--server", "host"]).is_err());
        assert!(Cli::try_parse_from(["mlx5", "bw", "atomic"]).is_ok());
        assert!(Cli::try_parse_from(["mlx5", "bw", "fetch"]).is_err());
        // perftest's spelling of the atomic type
        let cli = Cli::try_parse_from(["mlx5", "lat", "atomic", "-A", "CMP_AND_SWAP"]).unwrap();
        let Command::Lat(a) = cli.cmd else {
            panic!("not lat")
        };
        assert_eq!(a.atomic_type, Some(AtomicType::CMP_AND_SWAP));
    }

    #[test]
    fn emu_run_takes_the_program_after_dashes() {
        let cli = Cli::try_parse_from([
            "mlx5",
            "emu",
            "run",
            "--hcas",
            "2",
            "--",
            "ibv_devinfo",
            "-v",
        ])
        .unwrap();
        let Command::Emu {
            cmd: EmuCommand::Run(r),
        } = cli.cmd
        else {
            panic!("not emu run")
        };
        assert_eq!(r.hcas, 2);
        assert_eq!(r.program, ["ibv_devinfo", "-v"]);
        assert!(Cli::try_parse_from(["mlx5", "emu", "run"]).is_err());
        assert!(Cli::try_parse_from(["mlx5", "emu", "run", "--fabric", "x", "--", "a"]).is_err());
    }

    #[test]
    fn pingpong_takes_ibv_rc_pingpongs_options_and_defaults() {
        let parse = |args: &[&str]| match Cli::try_parse_from(args).map(|c| c.cmd) {
            Ok(Command::Pingpong(a)) => Ok(a),
            Ok(other) => panic!("not pingpong: {other:?}"),
            Err(e) => Err(e),
        };
        let a = parse(&["mlx5", "pingpong"]).unwrap();
        // no host: the server, with ibv_rc_pingpong's defaults
        assert_eq!(a.host, None);
        assert!(!a.loopback && !a.chk && !a.events);
        assert_eq!((a.port, a.ib_port, a.size, a.mtu), (None, 1, 4096, 1024));
        assert_eq!((a.rx_depth, a.iters, a.sl, a.gid_idx), (500, 1000, 0, None));
        let a = parse(&[
            "mlx5", "pingpong", "-p", "4000", "-d", "mlx5_1", "-i", "1", "-s", "32", "-m", "2048",
            "-r", "16", "-n", "7", "-l", "0", "-e", "-g", "0", "-c", "peer",
        ])
        .unwrap();
        assert_eq!(a.host.as_deref(), Some("peer"));
        assert_eq!(a.dev.as_deref(), Some("mlx5_1"));
        assert_eq!(
            (a.port, a.size, a.mtu, a.rx_depth, a.iters),
            (Some(4000), 32, 2048, 16, 7)
        );
        assert!(a.events && a.chk);
        assert_eq!(a.gid_idx, Some(0));
        // ibv_rc_pingpong's long names
        let a = parse(&[
            "mlx5",
            "pingpong",
            "--rx-depth",
            "8",
            "--gid-idx",
            "1",
            "--chk",
        ])
        .unwrap();
        assert_eq!((a.rx_depth, a.gid_idx, a.chk), (8, Some(1), true));
        assert!(parse(&["mlx5", "pingpong", "--loopback", "peer"]).is_err());
        assert!(parse(&["mlx5", "pingpong", "--server", "peer"]).is_err());
    }

    #[test]
    fn all_sizes_span_2_to_8_mib() {
        let v: Vec<u64> = all_sizes().collect();
        assert_eq!(v.first(), Some(&2));
        assert_eq!(v.last(), Some(&(8 << 20)));
        assert_eq!(v.len(), 23);
    }
}

/// What `mlx5 decode` decodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DecodeWhat {
    /// A send WQE: control segment and the segments its opcode implies.
    Wqe,
    /// A 64- or 128-byte CQE (normal or error).
    Cqe,
}

/// `mlx5 decode wqe|cqe [HEX...]`.
#[derive(Debug, Args)]
pub struct DecodeArgs {
    /// WQE or CQE.
    #[arg(value_enum)]
    pub what: DecodeWhat,
    /// Hex bytes (whitespace, commas, `0x`, xxd / `hexdump -C` columns and MLX5_EMU_WQE_LOG
    /// lines are accepted); read from stdin when absent.
    #[arg(value_name = "HEX")]
    pub hex: Vec<String>,
    /// The WQE is on a UD QP: an address vector follows the control segment of a SEND.
    #[arg(long, conflicts_with_all = ["xrc", "dc"])]
    pub ud: bool,
    /// The WQE is on an XRC initiator: an XRC segment (remote XRC SRQ number) follows the
    /// control segment.
    #[arg(long, conflicts_with = "dc")]
    pub xrc: bool,
    /// The WQE is on a DC initiator: an address vector (DCT number, DC access key) follows
    /// the control segment.
    #[arg(long)]
    pub dc: bool,
    /// CQE size, 64 or 128 (default: 128 if at least 128 bytes are given, else 64).
    #[arg(long, value_name = "BYTES", value_parser = ["64", "128"])]
    pub cqe_size: Option<String>,
    /// Machine-readable JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// `mlx5 trace send|write|read|atomic`.
#[derive(Debug, Args)]
pub struct TraceArgs {
    /// The operation.
    #[arg(value_enum)]
    pub op: crate::trace::TraceOp,
    /// Message size in bytes (atomics: 8).
    #[arg(short = 's', long = "size", default_value_t = 64)]
    pub size: u32,
    /// Messages up to this size go inline (also the QP's max_inline_data).
    #[arg(short = 'I', long = "inline_size", default_value_t = 0)]
    pub inline: u32,
    /// BlueFlame (`off`: the 8-byte doorbell only).
    #[arg(long = "bf", value_enum, default_value = "on")]
    pub bf: OnOff,
    /// Operations to trace, one after the other.
    #[arg(short = 'n', long = "iters", default_value_t = 1)]
    pub iters: u32,
    /// Make the operation fail and trace its error: `bad-lkey` (the local key is no MR's:
    /// LOCAL_PROT; the payload is gathered, not inline) or `bad-rkey` (write/read/atomic: the
    /// responder's rkey check fails, NAK, REM_ACCESS_ERR). The work completion prints with its
    /// explanation (`causes:`, `check:`).
    #[arg(long, value_enum, value_name = "FAULT")]
    pub fault: Option<crate::trace::Fault>,
    /// Trace on the emulated ConnectX even if a real mlx5 device exists (on a real device only
    /// the host's stages are observable).
    #[arg(long)]
    pub emu: bool,
    /// JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Transport: RC (default), or DC (`trace send`: a DCI's SEND to a DCT on the emulated
    /// HCA, its connect on the wire).
    #[arg(short = 'c', long = "connection", value_enum, default_value_t = Conn::Rc)]
    pub connection: Conn,
}

/// `mlx5 tune`.
#[derive(Debug, Args)]
pub struct TuneArgs {
    /// A short run (fewer messages per setting, no instruction counts).
    #[arg(long)]
    pub quick: bool,
    /// Message size of the experiment.
    #[arg(short = 's', long = "size", default_value_t = 64)]
    pub size: u32,
    /// Messages per setting (default: 2000, 300 with --quick).
    #[arg(short = 'n', long = "iters")]
    pub iters: Option<u64>,
    /// Runs of each setting: a change counts only beyond the spread between them (1: not
    /// judged).
    #[arg(short = 'r', long = "reps", default_value_t = crate::tune::DEFAULT_REPS,
          value_parser = clap::value_parser!(u32).range(1..=50))]
    pub reps: u32,
    /// Test knob: also measure a setting whose every post waits this many microseconds (a
    /// deliberately slowed setting: tune must call it worse).
    #[arg(long, hide = true, value_name = "US")]
    pub slow_us: Option<u64>,
    /// JSON instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Write a plot of the settings (SVG).
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Device name (default: the first one found, else the emulated one).
    #[arg(short = 'd', long = "ib-dev", value_name = "DEV")]
    pub dev: Option<String>,
    /// Use the emulated HCA even if a real device exists.
    #[arg(long)]
    pub emu: bool,
    /// Internal: run one setting's stream (KNOB=VALUE) for the instruction count under
    /// callgrind.
    #[arg(long, hide = true, value_name = "KNOB=VALUE")]
    pub instr_one: Option<String>,
}

/// `mlx5 diag`.
#[derive(Debug, Args)]
pub struct DiagArgs {
    /// A flight-recorder dump file (format v1; `-` for stdin).
    #[arg(long, value_name = "FILE")]
    pub dump: Option<PathBuf>,
    /// Live: a QP pair on the in-process emulator, a few SENDs, then a forced error; shows the
    /// driver's and the emulator's view of the same QP.
    #[arg(long, conflicts_with = "dump")]
    pub emu: bool,
    /// With --emu: also write the state as a flight-recorder dump (v1) to FILE.
    #[arg(long, value_name = "FILE", requires = "emu")]
    pub save: Option<PathBuf>,
    /// With --dump: the report as JSON.
    #[arg(long, requires = "dump")]
    pub json: bool,
    /// With --dump: decode only the records within N places of the error CQE and its WQE
    /// (the last N when there is no error).
    #[arg(long, value_name = "N", requires = "dump", conflicts_with = "json")]
    pub around: Option<usize>,
}

/// `mlx5 counters`.
#[derive(Debug, Args)]
pub struct CountersArgs {
    /// Device name (default: the first in sysfs; with --emu, the emulated mlx5_0).
    #[arg(short = 'd', long = "ib-dev", value_name = "DEV")]
    pub dev: Option<String>,
    /// Seconds between samples (default 1); each sample after the first prints the deltas.
    #[arg(short = 'i', long = "interval", value_name = "SECS")]
    pub interval: Option<f64>,
    /// Number of samples (default: 1 without -i, until interrupted with -i).
    #[arg(short = 'n', long = "count", value_name = "COUNT")]
    pub count: Option<u32>,
    /// Port (default: every port of the device).
    #[arg(short = 'p', long = "port", value_name = "PORT")]
    pub port: Option<u8>,
    /// The emulated device's own counters (an in-process emulator).
    #[arg(long)]
    pub emu: bool,
    /// The counters of the emulated devices of process PID (a program running under the
    /// emulator's preload, e.g. `mlx5 emu run`): its emulated sysfs tree, which the preload
    /// refreshes every 100 ms.
    #[arg(long, value_name = "PID", conflicts_with = "emu")]
    pub emu_pid: Option<u32>,
    /// With --emu: traffic between samples, so the deltas show something: `send` runs
    /// --ops SENDs (64 bytes) between two QPs of the emulated device per interval.
    #[arg(long, value_name = "KIND", requires = "emu", value_parser = ["send"])]
    pub load: Option<String>,
    /// With --load: operations per interval.
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub ops: u32,
    /// Print every counter, also those that are 0 and did not change.
    #[arg(short = 'a', long)]
    pub all: bool,
}
