//! perftest's raw Ethernet tools, unmodified (Debian's `perftest`), between two processes
//! on the emulated Ethernet port: RAW_PACKET QPs and `ibv_create_flow` through libmlx5,
//! frames between the processes' HCAs as one UDP datagram per frame on loopback
//! (`docs/raw-ethernet.md`). Server `-Z`, client `-P`, both MACs on the command line; the
//! MAC of node N is `00:02:c9:ab:cd:NN` (`HcaInfo::mac`), pinned with `MLX5_EMU_NODE`.
//! Short runs: each pair finishes in a few seconds.
//!
//! The raw tools have no TCP exchange, so the client is started when the server is ready:
//! its emulator traces every device call (`MLX5_EMU_TRACE=1`, one line per call on stderr,
//! unbuffered) and the test waits for the set-up calls after which a frame is taken
//! (steering rule installed, QP in RTR: a frame arriving then is received, or held in the
//! port's buffer until the receive is posted).

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread::sleep;
use std::time::{Duration, Instant};

use mlx5_emu::{EmuConfig, Emulator, LinkLayer, RunMode};

/// The MAC of fabric node `node`, as the emulator derives it (asked, not assumed).
fn mac(node: u16) -> String {
    let emu = Emulator::new(EmuConfig {
        mode: RunMode::Stepped,
        node: Some(node),
        link_layer: LinkLayer::Ethernet,
        ..EmuConfig::default()
    });
    let m = emu.hca_info(0).expect("HCA 0").mac;
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

fn tool(program: &str, node: u16, args: &[String]) -> Command {
    let mut cmd = Command::new(program);
    for (k, _) in std::env::vars() {
        if k.starts_with("MLX5_EMU_") {
            cmd.env_remove(k);
        }
    }
    cmd.env(
        "LD_PRELOAD",
        mlx5_emu::cprog::preload_so().expect("the preload library"),
    )
    .env("MLX5_EMU_LINK_LAYER", "eth")
    .env("MLX5_EMU_FABRIC", "udp")
    .env("MLX5_EMU_NODE", node.to_string())
    .args(["-d", "mlx5_0"])
    .args(args)
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    cmd
}

/// A started tool: its stdout and stderr read by threads as they come (stderr line by
/// line, each line also sent to `lines`).
struct Running {
    child: Child,
    out: std::thread::JoinHandle<String>,
    err: std::thread::JoinHandle<String>,
    lines: mpsc::Receiver<String>,
}

fn start(mut cmd: Command, who: &str) -> Running {
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {who}: {e}"));
    let mut stdout = child.stdout.take().expect("stdout");
    let stderr = child.stderr.take().expect("stderr");
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let (tx, lines) = mpsc::channel();
    let err = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            all.push_str(&line);
            all.push('\n');
            let _ = tx.send(line);
        }
        all
    });
    Running {
        child,
        out,
        err,
        lines,
    }
}

/// Wait until the trace on `r`'s stderr has shown, in this order, a successful call of each
/// of `calls` (a line naming it and ending in `-> ok ()`); the server is then ready. Panics
/// (killing it) after `limit` or if it exits first.
fn wait_ready(r: &mut Running, calls: &[&str], limit: Duration, who: &str) -> Duration {
    let t = Instant::now();
    let mut next = 0;
    while next < calls.len() {
        match r.lines.recv_timeout(Duration::from_millis(50)) {
            Ok(l) if l.contains(calls[next]) && l.ends_with("-> ok ()") => next += 1,
            Ok(_) => {}
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                panic!("{who} exited before it was ready (saw {next} of {calls:?})")
            }
        }
        if t.elapsed() > limit {
            let _ = r.child.kill();
            panic!("{who} not ready in {limit:?} (saw {next} of {calls:?})");
        }
    }
    t.elapsed()
}

fn finish(r: Running, limit: Duration, who: &str) -> String {
    let Running {
        mut child,
        out,
        err,
        lines,
    } = r;
    drop(lines);
    let t = Instant::now();
    let st = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break Some(st);
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        sleep(Duration::from_millis(20));
    };
    let text = format!(
        "{}{}",
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default()
    );
    match st {
        None => panic!("{who} did not finish in {limit:?}:\n{text}"),
        Some(st) => assert!(st.success(), "{who} failed ({st}):\n{text}"),
    }
    text
}

/// The server is ready once its steering rule is installed and its QP in RTR (and RTS,
/// for the tools whose server sends): the trace lines of those calls, in order.
const READY_LAT: &[&str] = &["EX_CREATE_FLOW", "MODIFY_QP", "MODIFY_QP"];
/// `raw_ethernet_bw`'s server only receives: INIT, the rule, RTR.
const READY_BW: &[&str] = &["EX_CREATE_FLOW", "MODIFY_QP"];
/// `raw_ethernet_fs_rate`'s sides only create and destroy rules, each on its own: the
/// server's first rule.
const READY_FS: &[&str] = &["EX_CREATE_FLOW"];

/// Run `program` as server (node `s`) and client (node `s + 1`) with `extra` options on
/// both, the client once the server's trace shows `ready`; returns (server output, client
/// output).
fn pair(program: &str, s: u16, extra: &[&str], ready: &[&str]) -> (String, String) {
    let c = s + 1;
    let (ms, mc) = (mac(s), mac(c));
    let args = |me: &str, peer: &str, role: &str| {
        let mut v: Vec<String> = vec!["-B".into(), me.into(), "-E".into(), peer.into()];
        v.extend(extra.iter().map(|s| s.to_string()));
        v.push(role.into());
        v
    };
    let mut cmd = tool(program, s, &args(&ms, &mc, "-Z"));
    cmd.env("MLX5_EMU_TRACE", "1");
    let mut server = start(cmd, "server");
    let waited = wait_ready(&mut server, ready, Duration::from_secs(30), "server");
    eprintln!("{program}: server ready after {waited:?}");
    let client = start(tool(program, c, &args(&mc, &ms, "-P")), "client");
    let co = finish(client, Duration::from_secs(60), "client");
    let so = finish(server, Duration::from_secs(60), "server");
    (so, co)
}

/// The numbers of the result line that follows the (last) header containing `header`.
/// perftest may dump every sample's cycle count ("#, cycles", then "i, n" lines) after a
/// header and print the header again before the row: the row is the first line made of
/// numbers only after the last header.
fn result_row(out: &str, header: &str) -> Vec<f64> {
    let lines: Vec<&str> = out.lines().collect();
    let at = lines
        .iter()
        .rposition(|l| l.contains(header))
        .unwrap_or_else(|| panic!("no {header:?} header in:\n{out}"));
    let numbers = |l: &str| -> Option<Vec<f64>> {
        let v: Option<Vec<f64>> = l.split_whitespace().map(|w| w.parse().ok()).collect();
        v.filter(|v| !v.is_empty())
    };
    lines[at + 1..]
        .iter()
        .find_map(|l| numbers(l))
        .unwrap_or_else(|| panic!("no result row after {header:?} in:\n{out}"))
}

const IP_UDP: &[&str] = &[
    "-J",
    "10.11.0.1",
    "-j",
    "10.11.0.2",
    "-K",
    "5000",
    "-k",
    "6000",
];

#[test]
fn raw_ethernet_lat_both_roles_with_ip_udp_headers() {
    let mut extra = vec!["-n", "200"];
    extra.extend_from_slice(IP_UDP);
    let (so, co) = pair("raw_ethernet_lat", 240, &extra, READY_LAT);
    for out in [&so, &co] {
        let row = result_row(out, "t_min[usec]");
        assert_eq!(row[1], 200.0, "iterations: {out}");
        assert!(row[2] > 0.0 && row[2] <= row[3], "t_min <= t_max: {row:?}");
    }
    assert!(
        co.contains("00:02:C9:AB:CD:F0"),
        "the client names the server's MAC"
    );
}

#[test]
fn raw_ethernet_bw_server_receives_every_frame() {
    let mut extra = vec!["-n", "2000"];
    extra.extend_from_slice(IP_UDP);
    let (so, co) = pair("raw_ethernet_bw", 242, &extra, READY_BW);
    for out in [&so, &co] {
        let row = result_row(out, "BW peak[MB/sec]");
        assert_eq!((row[0], row[1]), (1518.0, 2000.0), "{out}");
        assert!(row[3] > 0.0, "average bandwidth: {row:?}");
    }
}

#[test]
fn raw_ethernet_fs_rate_creates_and_destroys_flows_on_both_sides() {
    let (so, co) = pair("raw_ethernet_fs_rate", 244, &["-n", "20"], READY_FS);
    for out in [&so, &co] {
        let row = result_row(out, "fps[flow per sec]");
        assert_eq!(row[0], 20.0, "flows: {out}");
        assert!(row[5] > 0.0, "flows per second: {row:?}");
    }
}

/// `raw_ethernet_burst_lat` (latency under load): Debian's perftest 4.5 forces a rate limiter
/// on this test and refuses its software one for latency tests, so the test runs with the
/// NIC's packet pacing (`--rate_limit_type=PP`, MB/s units): the emulated HCA announces
/// `packet_pacing_caps` and paces each raw QP's frames at the rate MODIFY_QP set
/// (`IB_QP_RATE_LIMIT`). 1 MB/s on both sides, so the server's paced replies keep up with
/// the client's paced requests; every send signaled (`-Q 1`: perftest counts completions
/// to bound its window). The server answers a request only while fewer than `-t` of its
/// replies are uncompleted (and then never again for that request): `-t 256` above `-n 200`
/// so that a server whose emulated device falls behind on a loaded machine still answers
/// every request.
#[test]
fn raw_ethernet_burst_lat_both_roles_with_packet_pacing() {
    let extra = vec![
        "-n",
        "200",
        "-Q",
        "1",
        "-t",
        "256",
        "--rate_limit_type=PP",
        "--rate_units=M",
        "--rate_limit=1",
        "--burst_size=16",
    ];
    let (so, co) = pair("raw_ethernet_burst_lat", 246, &extra, READY_LAT);
    let row = result_row(&co, "t_min[usec]");
    assert_eq!(row[1], 200.0, "iterations: {co}");
    assert!(row[2] > 0.0 && row[2] <= row[3], "t_min <= t_max: {row:?}");
    // Paced at 1 MB/s (8192 kbit/s) on both sides, 200 round trips of 60-byte frames take
    // at least 200 * 2 * 58.6 us less the pacing credit: the average shows the limit.
    assert!(row[5] > 50.0, "paced: t_avg {row:?}");
    assert!(!so.contains("failed"), "{so}");
}

/// `raw_ethernet_burst_lat` with IP/UDP headers (`-J/-j/-K/-k`: the rules match the
/// addresses and ports, the frames carry them), paced as above.
#[test]
fn raw_ethernet_burst_lat_both_roles_with_ip_udp_headers() {
    let mut extra = vec![
        "-n",
        "200",
        "-Q",
        "1",
        "-t",
        "256",
        "--rate_limit_type=PP",
        "--rate_units=M",
        "--rate_limit=1",
        "--burst_size=16",
    ];
    extra.extend_from_slice(IP_UDP);
    let (so, co) = pair("raw_ethernet_burst_lat", 248, &extra, READY_LAT);
    let row = result_row(&co, "t_min[usec]");
    assert_eq!(row[1], 200.0, "iterations: {co}");
    assert!(row[2] > 0.0 && row[2] <= row[3], "t_min <= t_max: {row:?}");
    assert!(!so.contains("failed"), "{so}");
}
