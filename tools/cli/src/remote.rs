//! Client/server mode: one QP (or `-q N` QPs) in each of two processes, addresses exchanged over TCP in
//! perftest's format (version, system data, MTU, then `LID:OUT_READS:QPN:PSN:RKEY:VADDR:SRQN`
//! keys, repeated as barriers, and the client's closing `"done\0"`).
//!
//! The number of key exchanges before and after the measurement follows perftest 4.5 (see
//! [`handshakes`]), so that this tool and perftest's binaries can be each other's peer.

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use crate::app::{Plan, Reporter, TestbedConfig};
use crate::backend::SingleEnd;
use crate::bench::RunParams;
use crate::bench::{self, Op};
use crate::cli::{PingpongArgs, TestArgs};
use crate::exchange::{self, DONE, PINGPONG_MSG_LEN, PerftestKey, PingpongDest, Role};
use crate::xrc_dc::HpcPeer;

/// How long the client keeps trying to reach the server.
const CONNECT_PATIENCE: Duration = Duration::from_secs(10);

/// Key exchanges as perftest 4.5 (v4.5-0.17) does them in its non-duplex runs, so that either
/// side can be perftest's binary: `(before, per size before the run, per size after the run,
/// after)`; the first one before carries the keys. SEND tests: three before, one per size (after
/// posting receives), one when closing; with `-a` (`all`) SEND bandwidth also exchanges after
/// each size. WRITE latency: four before, none after. READ and atomic latency: four before, one
/// when closing. WRITE and READ bandwidth: three before, two after (the client's report goes
/// between them).
pub fn handshakes(op: Op, lat: bool, all: bool) -> (u32, u32, u32, u32) {
    match (op, lat) {
        (Op::Send, true) => (3, 1, 0, 1),
        (Op::Send, false) => (3, 1, u32::from(all), 1),
        (Op::Write, true) => (4, 0, 0, 0),
        (_, true) => (4, 0, 0, 1),
        (_, false) => (3, 0, 0, 2),
    }
}

/// One exchange of the connection setup: every QP's key in turn (perftest's loops of
/// `ctx_hand_shake` over `my_dest[i]`), or the first QP's alone (a barrier).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exchange {
    /// One key message per QP, in QP order.
    Keys,
    /// One message: the first QP's key.
    One,
}

/// The exchanges before the measurement, as perftest 4.5 orders them in its tests (the
/// `ctx_hand_shake` calls before `run_iter_*` in `send_lat.c`, `write_lat.c`, `read_lat.c`,
/// `atomic_lat.c`, `send_bw.c`, `write_bw.c`, `read_bw.c`, `atomic_bw.c`): the QPs are
/// connected after the first `Keys`; with one QP each is one message, `handshakes().0` in all.
pub fn setup_exchanges(op: Op, lat: bool) -> &'static [Exchange] {
    use Exchange::{Keys, One};
    match (op, lat) {
        (Op::Send, _) => &[Keys, One, Keys],
        (_, true) => &[One, Keys, Keys, One],
        (_, false) => &[Keys, Keys, One],
    }
}

/// This side of a run against a peer process: the QPs whose keys go into perftest's
/// exchange, connected from the peer's, and the ends the measurement loops drive.
/// [`SingleEnd`] holds RC, UC or UD QPs; [`HpcPeer`] XRC's and DC's initiators and targets.
pub trait PeerEnd {
    /// Our MTU as the ibv_mtu enum.
    fn mtu(&self) -> u8;
    /// The keys perftest sends for this side, one per QP, in its order (OUT_READS =
    /// `out_reads`); they may change once connected (a DCT's number).
    fn keys(&self, out_reads: u16) -> Vec<PerftestKey>;
    /// Connects our QPs from the peer's first round of keys.
    fn connect_all(&mut self, peers: &[PerftestKey], mtu: u8) -> Result<(), String>;
    /// Takes what the peer's later rounds of keys say (the numbers its targets got when
    /// connected), and checks the last one.
    fn refresh(&mut self, _peers: &[PerftestKey], _last: bool) -> Result<(), String> {
        Ok(())
    }
    /// Number of ends the bandwidth loops drive.
    fn qps(&self) -> usize;
    /// The first QP's endpoint for the address lines.
    fn endpoint(&self) -> crate::report::Endpoint;
    /// The other QPs' endpoints.
    fn more_endpoints(&self) -> Vec<crate::report::Endpoint>;
    /// The first end.
    fn side(&mut self) -> &mut dyn bench::Side;
    /// Every end.
    fn sides(&mut self) -> Vec<&mut dyn bench::Side>;
    /// Device name as printed.
    fn device(&self) -> String;
    /// Whether this is the emulator.
    fn emulated(&self) -> bool;
    /// Whether sends use BlueFlame.
    fn bf(&self) -> bool;
    /// Inline data the sending QPs were created with.
    fn max_inline(&self) -> u32;
    /// What backs the buffers.
    fn buffers(&self) -> String;
    /// The port is Ethernet (RoCE), and the source GID index of the path if global.
    fn link(&self) -> (bool, Option<u8>);
    /// Emulator counters, if emulated.
    fn counters(&self) -> Option<serde_json::Value>;
    /// The driver's counters.
    fn driver_counters(&self) -> serde_json::Value;
    /// `--cpu_cost`: per-call times, if recorded.
    fn cost(&self) -> Option<crate::cost::CostLog>;
}

macro_rules! peer_end_delegate {
    ($t:ty) => {
        fn mtu(&self) -> u8 {
            <$t>::mtu(self)
        }
        fn keys(&self, out_reads: u16) -> Vec<PerftestKey> {
            <$t>::keys(self, out_reads)
        }
        fn connect_all(&mut self, peers: &[PerftestKey], mtu: u8) -> Result<(), String> {
            <$t>::connect_all(self, peers, mtu)
        }
        fn qps(&self) -> usize {
            <$t>::qps(self)
        }
        fn endpoint(&self) -> crate::report::Endpoint {
            <$t>::endpoint(self)
        }
        fn more_endpoints(&self) -> Vec<crate::report::Endpoint> {
            <$t>::more_endpoints(self)
        }
        fn side(&mut self) -> &mut dyn bench::Side {
            <$t>::side(self)
        }
        fn sides(&mut self) -> Vec<&mut dyn bench::Side> {
            <$t>::sides(self)
        }
        fn device(&self) -> String {
            <$t>::device(self)
        }
        fn emulated(&self) -> bool {
            <$t>::emulated(self)
        }
        fn bf(&self) -> bool {
            <$t>::bf(self)
        }
        fn max_inline(&self) -> u32 {
            <$t>::max_inline(self)
        }
        fn buffers(&self) -> String {
            <$t>::buffers(self)
        }
        fn link(&self) -> (bool, Option<u8>) {
            <$t>::link(self)
        }
        fn counters(&self) -> Option<serde_json::Value> {
            <$t>::counters(self)
        }
        fn driver_counters(&self) -> serde_json::Value {
            <$t>::driver_counters(self)
        }
        fn cost(&self) -> Option<crate::cost::CostLog> {
            <$t>::cost(self)
        }
    };
}

impl PeerEnd for SingleEnd {
    peer_end_delegate!(SingleEnd);
}

impl PeerEnd for HpcPeer {
    peer_end_delegate!(HpcPeer);

    fn refresh(&mut self, peers: &[PerftestKey], last: bool) -> Result<(), String> {
        HpcPeer::refresh(self, peers)?;
        if last {
            self.check_peer(peers)?;
        }
        Ok(())
    }
}

fn io(what: &'static str) -> impl Fn(std::io::Error) -> String {
    move |e| format!("{what}: {e}")
}

fn tcp(role: Role, host: Option<&str>, bind: &str, port: u16) -> Result<TcpStream, String> {
    match role {
        Role::Server => {
            let l = TcpListener::bind((bind, port))
                .map_err(|e| format!("listen on {bind}:{port}: {e}"))?;
            eprintln!("************************************");
            eprintln!("* Waiting for client to connect... *");
            eprintln!("************************************");
            let (s, _) = l.accept().map_err(io("accept"))?;
            Ok(s)
        }
        Role::Client => {
            let host = host.unwrap_or("127.0.0.1");
            let until = Instant::now() + CONNECT_PATIENCE;
            loop {
                match TcpStream::connect((host, port)) {
                    Ok(s) => return Ok(s),
                    // the server may not be listening yet
                    Err(_) if Instant::now() < until => {
                        std::thread::sleep(Duration::from_millis(50))
                    }
                    Err(e) => return Err(format!("connect to {host}:{port}: {e}")),
                }
            }
        }
    }
}

/// Runs `plan` against a peer process.
pub fn run<O>(plan: &Plan, a: &TestArgs<O>) -> Result<(), String>
where
    O: clap::ValueEnum + Clone + Send + Sync + 'static,
{
    if a.rdma_cm {
        return crate::exchange_cm::run(plan, a);
    }
    if plan.params.duration.is_some() {
        return Err("-D is not supported with a peer yet: use -n (the same on both sides)".into());
    }
    let role = if a.server { Role::Server } else { Role::Client };
    let (op, lat) = (plan.op, plan.lat);
    let mut end: Box<dyn PeerEnd> = match plan.testbed.conn {
        crate::cli::Conn::Xrc | crate::cli::Conn::Dc => Box::new(HpcPeer::open(
            &plan.testbed,
            a.num_qps,
            lat,
            role == Role::Server,
        )?),
        _ => Box::new(SingleEnd::open_qps(&plan.testbed, a.num_qps)?),
    };
    let end = end.as_mut();
    let bind = a.bind.as_deref().unwrap_or("0.0.0.0");
    let port = a.port.unwrap_or(crate::cli::DEFAULT_PORT);
    let mut s = tcp(role, a.host.as_deref(), bind, port)?;
    s.set_nodelay(true).map_err(io("TCP_NODELAY"))?;
    // a peer that vanishes mid-exchange ends the run (--peer_timeout)
    s.set_read_timeout(plan.params.patience)
        .map_err(io("TCP read timeout"))?;
    let peer_mtu =
        exchange::perftest_preamble(&mut s, role, 4096, 64, end.mtu()).map_err(io("exchange"))?;
    let mtu = end.mtu().min(peer_mtu);
    let out_reads = u16::from(plan.testbed.max_rd_atomic);
    let mut peers: Option<Vec<PerftestKey>> = None;
    let steps = setup_exchanges(op, lat);
    let last_keys = steps.iter().rposition(|e| *e == Exchange::Keys);
    for (i, step) in steps.iter().enumerate() {
        // a DCT's number is known once connected: every round sends the keys as they are now
        let keys = end.keys(out_reads);
        let key = *keys.first().ok_or("no QP to exchange")?;
        match step {
            Exchange::One => {
                exchange::perftest_keys(&mut s, role, &key).map_err(io("barrier"))?;
            }
            Exchange::Keys => {
                let mut got = Vec::with_capacity(keys.len());
                for k in &keys {
                    got.push(exchange::perftest_keys(&mut s, role, k).map_err(io("key exchange"))?);
                }
                if peers.is_none() {
                    end.connect_all(&got, mtu)?;
                } else {
                    end.refresh(&got, Some(i) == last_keys)?;
                }
                peers = Some(got);
            }
        }
    }
    let peers = peers.ok_or("no key exchange")?;
    let peer = peers[0];
    let key = end.keys(out_reads)[0];
    let barrier = |s: &mut TcpStream, n: u32| -> Result<(), String> {
        for _ in 0..n {
            exchange::perftest_keys(s, role, &key).map_err(io("barrier"))?;
        }
        Ok(())
    };
    let (_, per_size, per_size_after, after) = handshakes(op, lat, plan.sizes.len() > 1);
    let rdma = matches!(op, Op::Write | Op::Read | Op::FetchAdd | Op::CmpSwap);
    let remote = crate::report::Endpoint {
        lid: peer.lid,
        qpn: peer.qpn,
        psn: peer.psn,
        rkey_vaddr: rdma.then_some((peer.rkey, peer.vaddr)),
        gid: peer.gid,
    };
    let mut local = end.endpoint();
    if !rdma {
        local.rkey_vaddr = None;
    }
    let mut rep = Reporter::new(plan, a);
    let mut header = rep.header(
        plan,
        end.device(),
        end.bf(),
        end.max_inline(),
        end.buffers(),
        "Ethernet",
        local,
        remote,
    );
    (header.ethernet, header.gid_index) = end.link();
    header.more = end
        .more_endpoints()
        .into_iter()
        .zip(&peers[1..])
        .map(|(mut l, p)| {
            let r = crate::report::Endpoint {
                lid: p.lid,
                qpn: p.qpn,
                psn: p.psn,
                rkey_vaddr: rdma.then_some((p.rkey, p.vaddr)),
                gid: p.gid,
            };
            if !rdma {
                l.rkey_vaddr = None;
            }
            (l, r)
        })
        .collect();
    rep.begin(end.emulated(), &header)?;
    if plan.testbed.log_dci_streams > 0 {
        rep.note(&format!(
            "DCS num streams : {} (2^{} DCI streams, WRs round-robin over them, as perftest)",
            plan.testbed.log_dci_streams, plan.testbed.log_dci_streams
        ))?;
    }
    let mut ours = exchange::BwReport::default();
    for &size in &plan.sizes {
        // receives first, then the barrier: the peer may send as soon as it is through
        if op == Op::Send && (lat || role == Role::Server) {
            let n = if lat {
                1
            } else {
                plan.params.rx_depth.max(plan.params.tx_depth).max(1)
            };
            if lat {
                // latency runs on the first QP only, as perftest's
                end.side().ensure_recv(n, size as u32)?;
            } else {
                for q in end.sides() {
                    q.ensure_recv(n, size as u32)?;
                }
            }
        }
        barrier(&mut s, per_size)?;
        if !a.connect_only {
            if let Some(report) = run_size(end, &mut rep, role, plan, size)? {
                ours = report;
            }
        }
        barrier(&mut s, per_size_after)?;
    }
    // who measures: both sides in SEND/WRITE latency, else the client
    let server_measures = lat && matches!(op, Op::Send | Op::Write);
    // WRITE and READ bandwidth: the client sends its figures to the server, which prints them
    let bw_report = !lat && op != Op::Send;
    if a.connect_only {
        rep.note("--connect_only: addresses exchanged and QPs connected; nothing measured")?;
    } else if role == Role::Server && !server_measures && !bw_report && op != Op::Send {
        rep.note("server side: the client issues the requests and reports the results")?;
    }
    for i in 0..after {
        barrier(&mut s, 1)?;
        if bw_report && i == 0 {
            let theirs =
                exchange::bw_reports(&mut s, role, &ours).map_err(io("report exchange"))?;
            if role == Role::Server && !a.connect_only {
                rep.bw_stats(&crate::stats::BwStats {
                    bytes: theirs.size,
                    iterations: theirs.iters,
                    bw_peak_mib: theirs.bw_peak,
                    bw_average_mib: theirs.bw_avg,
                    msg_rate_mpps: theirs.msg_rate,
                    peak_window: 0,
                })?;
            }
        }
    }
    match role {
        Role::Client => {
            use std::io::Write;
            // perftest's WRITE latency server does not wait for it and may be gone already
            let _ = s.write_all(DONE);
        }
        Role::Server => {
            // the client closes with "done\0"; an early EOF is fine too
            let mut buf = [0u8; 5];
            let _ = s.read_exact(&mut buf);
        }
    }
    rep.finish(
        &header,
        end.emulated(),
        end.counters(),
        end.driver_counters(),
        end.cost(),
    )
}

/// Runs one message size on this side and prints its row; a bandwidth client returns the
/// report perftest's server expects.
pub(crate) fn run_size(
    end: &mut dyn PeerEnd,
    rep: &mut Reporter,
    role: Role,
    plan: &Plan,
    size: u64,
) -> Result<Option<exchange::BwReport>, String> {
    let (op, lat) = (plan.op, plan.lat);
    let mut p = plan.params;
    p.size = size as u32;
    let label = format!("{} {size} B", crate::app::title(op, lat));
    match (role, lat, op) {
        (_, true, Op::Send | Op::Write) => {
            // perftest: the client sends first in SEND latency, the server in WRITE latency
            let first = (role == Role::Client) == (op == Op::Send);
            let run = bench::lat_remote(op, end.side(), &p, &label, first)?;
            rep.lat_result(size, &run.samples_us)?;
        }
        (Role::Client, true, _) => {
            let run = bench::lat_rtt(op, end.side(), &p, &label)?;
            rep.lat_result(size, &run.samples_us)?;
        }
        (Role::Client, false, _) => {
            let run = if end.qps() > 1 {
                bench::bw_stream_multi(op, &mut end.sides(), &p, &label)?
            } else {
                bench::bw_stream(op, end.side(), None, &p, &label)?
            };
            let st = rep.bw_result(size, &run)?;
            return Ok(Some(exchange::BwReport {
                size,
                iters: st.iterations,
                bw_peak: st.bw_peak_mib,
                bw_avg: st.bw_average_mib,
                msg_rate: st.msg_rate_mpps,
            }));
        }
        (Role::Server, false, Op::Send) => {
            let run = if end.qps() > 1 {
                bench::bw_server_multi(&mut end.sides(), &p, &label)?
            } else {
                bench::bw_server(end.side(), &p, &label)?
            };
            // perftest's SEND bandwidth server prints its own figures: no peak (it sets
            // noPeak), the average from its first receive to its last, over every QP's
            let st = crate::stats::BwStats::from_completions(
                size,
                &run.posted_ns,
                &run.completed_ns,
                false,
            )
            .ok_or_else(|| format!("size {size}: no time between the first and last receive"))?;
            rep.bw_stats(&st)?;
        }
        // the client issues the requests
        (Role::Server, _, _) => {}
    }
    Ok(None)
}

/// Test-only: set (to anything but `0`) to make `mlx5 pingpong` corrupt the first byte of
/// every message it sends (to 0xa5), so that a peer's `-c` check can be seen to fail.
pub const CORRUPT_ENV: &str = "MLX5_PINGPONG_CORRUPT";

/// ibv_rc_pingpong's fill byte of its buffer.
pub const PINGPONG_FILL: u8 = 0x7b;

/// The buffer ibv_rc_pingpong sends: `size` bytes of [`PINGPONG_FILL`]; with `-c` its client
/// zeroes the first byte of every page (`page` bytes) before the first SEND, and each side
/// echoes what it receives, so with `-c` every message carries that pattern.
pub fn pingpong_buffer(size: usize, page: usize, chk_client: bool) -> Vec<u8> {
    let mut buf = vec![PINGPONG_FILL; size];
    if chk_client {
        for b in buf.iter_mut().step_by(page.max(1)) {
            *b = 0;
        }
    }
    buf
}

/// The pages of a received message that differ from the `-c` pattern
/// (`pingpong_buffer(len, page, true)`): as ibv_rc_pingpong's server checks its last message,
/// the first byte of every page; with `every_byte` (`--chk-all`), all of them.
pub fn invalid_pages(got: &[u8], page: usize, every_byte: bool) -> Vec<usize> {
    let page = page.max(1);
    got.chunks(page)
        .enumerate()
        .filter(|(_, c)| {
            let checked = if every_byte { c.len() } else { 1 };
            c.iter()
                .take(checked)
                .enumerate()
                .any(|(i, &b)| b != if i == 0 { 0 } else { PINGPONG_FILL })
        })
        .map(|(n, _)| n)
        .collect()
}

/// The system's page size (ibv_rc_pingpong's unit of `-c`): `AT_PAGESZ` of the auxiliary
/// vector (pairs of native-endian words); 4096 if it cannot be read.
fn page_size() -> usize {
    const AT_PAGESZ: u64 = 6;
    const W: usize = size_of::<usize>();
    let auxv = std::fs::read("/proc/self/auxv").unwrap_or_default();
    auxv.chunks_exact(2 * W)
        .find_map(|e| {
            let word = |b: &[u8]| b.try_into().ok().map(usize::from_ne_bytes);
            (word(&e[..W])? as u64 == AT_PAGESZ)
                .then(|| word(&e[W..]))
                .flatten()
        })
        .filter(|&n| n.is_power_of_two())
        .unwrap_or(4096)
}

/// `mlx5 pingpong` against a peer process, in ibv_rc_pingpong's exchange: the client writes its
/// 52-byte `LID:QPN:PSN:GID`; the server reads it, connects its QP, answers with its own; the
/// client connects and writes `"done\0"`. Then the client SENDs first and each side answers
/// every SEND it receives with the message it received (one buffer, as ibv_rc_pingpong),
/// `iters` times. With `-c` each received message is checked against the pattern.
pub fn pingpong(a: &PingpongArgs, cfg: &TestbedConfig, p: &RunParams) -> Result<(), String> {
    use std::io::Write;
    let role = if a.host.is_some() {
        Role::Client
    } else {
        Role::Server
    };
    let mut end = SingleEnd::open(cfg)?;
    // receives before the exchange: the peer may send as soon as it is connected
    end.init()?;
    let page = page_size();
    let size = p.size as usize;
    end.side().write_rx(
        0,
        &pingpong_buffer(size, page, (a.chk || a.chk_all) && role == Role::Client),
    );
    end.side().ensure_recv(a.rx_depth, p.size)?;
    if end.emulated() {
        println!("{}", crate::app::emulator_line(a.emu));
    }
    let ours = end.pingpong_dest();
    println!(
        "{}",
        crate::app::pingpong_address("local", ours.lid, ours.qpn, ours.psn, &ours.gid)
    );
    if a.rdma_cm {
        return crate::exchange_cm::pingpong(&mut end, a, role, p);
    }
    let bind = a.bind.as_deref().unwrap_or("0.0.0.0");
    let mut s = tcp(
        role,
        a.host.as_deref(),
        bind,
        a.port.unwrap_or(crate::cli::DEFAULT_PORT),
    )?;
    s.set_nodelay(true).map_err(io("TCP_NODELAY"))?;
    s.set_read_timeout(p.patience)
        .map_err(io("TCP read timeout"))?;
    let mtu = end.mtu();
    let bad = |e: exchange::ParseError| format!("peer address: {e}");
    let peer = match role {
        Role::Client => {
            s.write_all(&ours.encode()).map_err(io("write address"))?;
            let mut buf = [0u8; PINGPONG_MSG_LEN];
            s.read_exact(&mut buf).map_err(io("read address"))?;
            let peer = PingpongDest::decode(&buf).map_err(bad)?;
            end.connect_pingpong(&peer, mtu)?;
            s.write_all(DONE).map_err(io("done"))?;
            peer
        }
        Role::Server => {
            let mut buf = [0u8; PINGPONG_MSG_LEN];
            s.read_exact(&mut buf).map_err(io("read address"))?;
            let peer = PingpongDest::decode(&buf).map_err(bad)?;
            end.connect_pingpong(&peer, mtu)?;
            s.write_all(&ours.encode()).map_err(io("write address"))?;
            let mut done = [0u8; 5];
            s.read_exact(&mut done).map_err(io("read done"))?;
            peer
        }
    };
    println!(
        "{}",
        crate::app::pingpong_address("remote", peer.lid, peer.qpn, peer.psn, &peer.gid)
    );
    pingpong_measure(&mut end, a, p, role)
}

/// The measurement of `mlx5 pingpong` on a connected end (its receives posted): the
/// client SENDs first, each side echoes what it receives, `-c` checks every message.
pub fn pingpong_measure(
    end: &mut SingleEnd,
    a: &PingpongArgs,
    p: &RunParams,
    role: Role,
) -> Result<(), String> {
    let page = page_size();
    let size = p.size as usize;
    let corrupt = std::env::var_os(CORRUPT_ENV).is_some_and(|v| v != "0");
    // overwrites the first byte of the message this side sends next with a value that is
    // neither the pattern's 0 nor its fill (a flip would undo itself on the way back)
    let tamper = |side: &mut dyn bench::Side| side.write_rx(0, &[0xa5]);
    if corrupt && role == Role::Client {
        tamper(end.side());
    }
    let mut invalid = std::collections::BTreeSet::new();
    let mut got = vec![0u8; size];
    let mut on_receive = |side: &mut dyn bench::Side, _n: u64| -> Result<(), String> {
        if a.chk || a.chk_all {
            side.read_rx(0, &mut got);
            invalid.extend(invalid_pages(&got, page, a.chk_all));
        }
        if corrupt {
            tamper(side);
        }
        Ok(())
    };
    let start = Instant::now();
    bench::lat_remote_checked(
        Op::Send,
        end.side(),
        p,
        "pingpong",
        role == Role::Client,
        &mut on_receive,
    )?;
    let usec = start.elapsed().as_secs_f64() * 1e6;
    let (l1, l2) = crate::app::pingpong_lines(u64::from(p.size), p.iters, usec);
    println!("{l1}");
    println!("{l2}");
    for n in &invalid {
        println!("invalid data in page {n}");
    }
    if invalid.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "-c: {} page(s) of the received messages differ from the pattern",
            invalid.len()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_size_comes_from_the_auxiliary_vector() {
        let n = page_size();
        assert!(n.is_power_of_two() && n >= 4096, "{n}");
    }

    #[test]
    fn chk_pattern_is_ibv_rc_pingpongs_and_every_byte_is_checked() {
        let buf = pingpong_buffer(10_000, 4096, true);
        assert_eq!((buf[0], buf[4096], buf[8192]), (0, 0, 0));
        assert_eq!(buf.iter().filter(|&&b| b == 0).count(), 3);
        for all in [false, true] {
            assert!(invalid_pages(&buf, 4096, all).is_empty());
        }
        // without the client's -c every page start is 0x7b: all three pages are invalid
        let plain = pingpong_buffer(10_000, 4096, false);
        assert_eq!(plain, vec![PINGPONG_FILL; 10_000]);
        assert_eq!(invalid_pages(&plain, 4096, false), vec![0, 1, 2]);
        // a flipped byte inside a page: only --chk-all sees it, in its page
        let mut one = buf.clone();
        one[5000] ^= 1;
        assert!(invalid_pages(&one, 4096, false).is_empty());
        assert_eq!(invalid_pages(&one, 4096, true), vec![1]);
        // a flipped page start: both
        let mut first = buf;
        first[8192] = !first[8192];
        assert_eq!(invalid_pages(&first, 4096, false), vec![2]);
        assert_eq!(invalid_pages(&first, 4096, true), vec![2]);
        // messages shorter than a page: one page start
        assert_eq!(pingpong_buffer(32, 4096, true)[..2], [0, PINGPONG_FILL]);
    }

    #[test]
    fn setup_exchanges_are_the_handshakes_before() {
        for op in [Op::Send, Op::Write, Op::Read, Op::FetchAdd, Op::CmpSwap] {
            for lat in [true, false] {
                let seq = setup_exchanges(op, lat);
                assert_eq!(
                    seq.len() as u32,
                    handshakes(op, lat, false).0,
                    "{op:?} {lat}"
                );
                // keys twice (connect, then print the peer's), as perftest
                let keys = seq.iter().filter(|e| **e == Exchange::Keys).count();
                assert_eq!(keys, 2, "{op:?} {lat}");
            }
        }
    }

    #[test]
    fn handshake_counts_match_perftest_4_5() {
        // observed totals for one size: ib_send_lat 5, ib_write_lat 4
        let total = |(b, s, sa, a): (u32, u32, u32, u32), sizes: u32| b + sizes * (s + sa) + a;
        assert_eq!(total(handshakes(Op::Send, true, false), 1), 5);
        assert_eq!(total(handshakes(Op::Write, true, false), 1), 4);
        assert_eq!(total(handshakes(Op::Read, true, false), 1), 5);
        assert_eq!(total(handshakes(Op::FetchAdd, true, false), 1), 5);
        assert_eq!(total(handshakes(Op::Send, false, false), 1), 5);
        assert_eq!(total(handshakes(Op::Write, false, false), 1), 5);
        // -a: SEND bandwidth exchanges before and after every size
        assert_eq!(total(handshakes(Op::Send, false, true), 23), 3 + 46 + 1);
        assert_eq!(total(handshakes(Op::Send, true, true), 23), 3 + 23 + 1);
        assert_eq!(total(handshakes(Op::Write, true, true), 23), 4);
    }
}
