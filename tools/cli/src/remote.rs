//! Client/server mode: one QP in each of two processes, addresses exchanged over TCP in
//! perftest's format (version, system data, MTU, then `LID:OUT_READS:QPN:PSN:RKEY:VADDR:SRQN`
//! keys, repeated as barriers, and the client's closing `"done\0"`).
//!
//! The numbers of key exchanges match what was observed from perftest 4.5 (ib_send_lat: 5,
//! ib_write_lat: 4); where they sit between the phases is this tool's choice: one to exchange
//! the keys, the rest as barriers before the measurement, and one after it.

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use crate::app::{Plan, Reporter, TestbedConfig};
use crate::backend::SingleEnd;
use crate::bench::RunParams;
use crate::bench::{self, Op};
use crate::cli::{PingpongArgs, TestArgs};
use crate::exchange::{self, DONE, PINGPONG_MSG_LEN, PerftestKey, PingpongDest, Role};

/// How long the client keeps trying to reach the server.
const CONNECT_PATIENCE: Duration = Duration::from_secs(10);

/// Key exchanges before the measurement (including the one carrying the keys) and after it.
fn handshakes(op: Op, lat: bool) -> (u32, u32) {
    match (op, lat) {
        (Op::Send, true) => (4, 1),
        (Op::Write, true) => (3, 1),
        _ => (2, 1),
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
                    Err(e) if Instant::now() < until => {
                        let _ = e;
                        std::thread::sleep(Duration::from_millis(50));
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
    if plan.params.duration.is_some() {
        return Err("-D is not supported with a peer yet: use -n (the same on both sides)".into());
    }
    if plan.sizes.len() > 1 {
        return Err("-a is not supported with a peer yet: use -s".into());
    }
    let role = if a.server { Role::Server } else { Role::Client };
    let (op, lat) = (plan.op, plan.lat);
    let mut end = SingleEnd::open(&plan.testbed)?;
    let mut s = tcp(role, a.host.as_deref(), &a.bind, a.port)?;
    s.set_nodelay(true).map_err(io("TCP_NODELAY"))?;
    let peer_mtu =
        exchange::perftest_preamble(&mut s, role, 4096, 64, end.mtu()).map_err(io("exchange"))?;
    let mtu = end.mtu().min(peer_mtu);
    let key = end.key(u16::from(plan.testbed.max_rd_atomic));
    let peer: PerftestKey =
        exchange::perftest_keys(&mut s, role, &key).map_err(io("key exchange"))?;
    end.connect(&peer, mtu)?;
    let size = plan.sizes[0];
    let mut p = plan.params;
    p.size = size as u32;
    let (before, after) = handshakes(op, lat);
    // receives first, then the barriers: the peer may send as soon as they are done
    if op == Op::Send && (lat || role == Role::Server) {
        end.side()
            .ensure_recv(if lat { 1 } else { p.tx_depth.max(1) }, p.size)?;
    }
    for _ in 1..before {
        exchange::perftest_keys(&mut s, role, &key).map_err(io("barrier"))?;
    }
    let mut remote = crate::report::Endpoint {
        lid: peer.lid,
        qpn: peer.qpn,
        psn: peer.psn,
        rkey_vaddr: Some((peer.rkey, peer.vaddr)),
    };
    if !matches!(op, Op::Write | Op::Read | Op::FetchAdd | Op::CmpSwap) {
        remote.rkey_vaddr = None;
    }
    let mut local = end.endpoint();
    if remote.rkey_vaddr.is_none() {
        local.rkey_vaddr = None;
    }
    let mut rep = Reporter::new(plan, a);
    let header = rep.header(
        plan,
        end.device(),
        end.bf(),
        end.max_inline(),
        end.buffers(),
        "Ethernet",
        local,
        remote,
    );
    rep.begin(end.emulated(), &header)?;
    let label = format!("{} {size} B", crate::app::title(op, lat));
    if a.connect_only {
        rep.note("--connect_only: addresses exchanged and QPs connected; nothing measured")?;
    } else {
        match (role, lat, op) {
            (Role::Client, true, Op::Send | Op::Write) => {
                let run = bench::lat_client(op, end.side(), &p, &label)?;
                rep.lat_result(size, &run.samples_us)?;
            }
            (Role::Server, true, Op::Send | Op::Write) => {
                let run = bench::lat_server(op, end.side(), &p, &label)?;
                rep.lat_result(size, &run.samples_us)?;
            }
            (Role::Client, true, _) => {
                let run = bench::lat_rtt(op, end.side(), &p, &label)?;
                rep.lat_result(size, &run.samples_us)?;
            }
            (Role::Client, false, _) => {
                let run = bench::bw_stream(op, end.side(), None, &p, &label)?;
                rep.bw_result(size, &run)?;
            }
            (Role::Server, false, Op::Send) => {
                bench::bw_server(end.side(), &p, &label)?;
                rep.note("server side: the client reports the bandwidth")?;
            }
            (Role::Server, _, _) => {
                rep.note("server side: the client issues the requests and reports the results")?;
            }
        }
    }
    for _ in 0..after {
        exchange::perftest_keys(&mut s, role, &key).map_err(io("barrier"))?;
    }
    match role {
        Role::Client => {
            use std::io::Write;
            s.write_all(DONE).map_err(io("done"))?;
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
    )
}

/// `mlx5 pingpong` against a peer process, in ibv_rc_pingpong's exchange: the client writes its
/// 52-byte `LID:QPN:PSN:GID`; the server reads it, connects its QP, answers with its own; the
/// client connects and writes `"done\0"`. Then the client SENDs first and each side answers
/// every SEND it receives, `iters` times.
pub fn pingpong(a: &PingpongArgs, cfg: &TestbedConfig, p: &RunParams) -> Result<(), String> {
    use std::io::Write;
    let role = if a.server { Role::Server } else { Role::Client };
    let mut end = SingleEnd::open(cfg)?;
    // receives before the exchange: the peer may send as soon as it is connected
    end.init()?;
    end.side().ensure_recv(1, p.size)?;
    let mut s = tcp(role, a.host.as_deref(), &a.bind, a.port)?;
    s.set_nodelay(true).map_err(io("TCP_NODELAY"))?;
    let ours = end.pingpong_dest();
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
    if end.emulated() {
        println!("{}", crate::app::emulator_line(a.emu));
    }
    println!(
        "{}",
        crate::app::pingpong_address("local", ours.lid, ours.qpn, ours.psn, &ours.gid)
    );
    println!(
        "{}",
        crate::app::pingpong_address("remote", peer.lid, peer.qpn, peer.psn, &peer.gid)
    );
    let start = Instant::now();
    match role {
        Role::Client => bench::lat_client(Op::Send, end.side(), p, "pingpong")?,
        Role::Server => bench::lat_server(Op::Send, end.side(), p, "pingpong")?,
    };
    let usec = start.elapsed().as_secs_f64() * 1e6;
    let (l1, l2) = crate::app::pingpong_lines(u64::from(p.size), p.iters, usec);
    println!("{l1}");
    println!("{l2}");
    Ok(())
}
