//! `mlx5 lat raw` (tools/cli/src/raw_lat.rs): raw Ethernet latency through the driver's
//! RAW_PACKET QP, in loopback on two emulated HCAs and against Debian's unmodified
//! `raw_ethernet_lat` (under the preload, UDP fabric) in both roles, with and without IPv4/UDP
//! headers. The raw tools have no TCP exchange: the client starts once the server is ready
//! (ours: its report header on stdout, printed after its rule is installed; perftest's: its
//! emulator's trace of the rule and the QP transitions). Needs `CAP_NET_RAW` (CI runs as root).

mod common;

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{one_pair_at_a_time, preload_so};

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

/// The MAC of emulated node `n` (docs/raw-ethernet.md).
fn mac(n: u16) -> String {
    format!("00:02:c9:ab:cd:{n:02x}")
}

fn clean(cmd: &mut Command) {
    for (k, _) in std::env::vars() {
        if k.starts_with("MLX5_EMU_") {
            cmd.env_remove(&k);
        }
    }
}

fn ours(node: u16, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mlx5"));
    clean(&mut cmd);
    cmd.args(["lat", "raw"])
        .args(args)
        .env("MLX5_EMU_NODE", node.to_string());
    cmd
}

fn perftest(node: u16, args: &[&str]) -> Command {
    let mut cmd = Command::new("raw_ethernet_lat");
    clean(&mut cmd);
    cmd.env("LD_PRELOAD", preload_so())
        .env("MLX5_EMU_LINK_LAYER", "eth")
        .env("MLX5_EMU_FABRIC", "udp")
        .env("MLX5_EMU_NODE", node.to_string())
        .args(["-d", "mlx5_0"])
        .args(args);
    cmd
}

/// A running side: stdout and stderr collected, each line also sent on `lines`.
struct Running {
    child: Child,
    out: std::thread::JoinHandle<String>,
    err: std::thread::JoinHandle<String>,
    lines: mpsc::Receiver<String>,
}

fn start(mut cmd: Command) -> Running {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let (tx, lines) = mpsc::channel();
    let tx2 = tx.clone();
    let so = child.stdout.take().expect("stdout");
    let se = child.stderr.take().expect("stderr");
    let pump = |r: Box<dyn Read + Send>, tx: mpsc::Sender<String>| {
        std::thread::spawn(move || {
            let mut all = String::new();
            for l in BufReader::new(r).lines().map_while(Result::ok) {
                all.push_str(&l);
                all.push('\n');
                let _ = tx.send(l);
            }
            all
        })
    };
    Running {
        out: pump(Box::new(so), tx),
        err: pump(Box::new(se), tx2),
        child,
        lines,
    }
}

impl Running {
    /// Wait until lines containing each of `marks` have appeared, in order.
    fn wait_for(&mut self, marks: &[&str], who: &str) {
        let t = Instant::now();
        let mut next = 0;
        while next < marks.len() {
            match self.lines.recv_timeout(Duration::from_millis(50)) {
                Ok(l) if l.contains(marks[next]) => next += 1,
                Ok(_) | Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    panic!("{who} exited before it was ready (saw {next} of {marks:?})")
                }
            }
            if t.elapsed() > Duration::from_secs(30) {
                let _ = self.child.kill();
                panic!("{who} not ready in 30 s (saw {next} of {marks:?})");
            }
        }
    }

    fn finish(mut self, who: &str) -> String {
        let t = Instant::now();
        let st = loop {
            if let Some(s) = self.child.try_wait().expect("wait") {
                break Some(s);
            }
            if t.elapsed() > Duration::from_secs(60) {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        drop(self.lines);
        let text = format!(
            "{}{}",
            self.out.join().unwrap_or_default(),
            self.err.join().unwrap_or_default()
        );
        match st {
            Some(s) if s.success() => text,
            Some(s) => panic!("{who} failed ({s}):\n{text}"),
            None => panic!("{who} did not finish in 60 s:\n{text}"),
        }
    }
}

/// The numbers of the row after the table header (ours and perftest's print the same one).
fn row(out: &str) -> Vec<f64> {
    let mut l = out.lines();
    l.by_ref()
        .find(|x| x.contains("t_min[usec]"))
        .unwrap_or_else(|| panic!("no result table in:\n{out}"));
    let r = l.next().expect("a row");
    r.split_whitespace()
        .map(|w| w.parse().unwrap_or_else(|_| panic!("bad row {r:?}")))
        .collect()
}

/// Ours as the server (-Z), raw_ethernet_lat as the client (-P).
fn ours_serves_perftest(s: u16, extra: &[&str]) {
    let _one = one_pair_at_a_time();
    let c = s + 1;
    let (ms, mc) = (mac(s), mac(c));
    let mut args = vec!["-Z", "-B", &ms, "-E", &mc, "-n", "200"];
    args.extend_from_slice(extra);
    let mut server = start(ours(s, &args));
    server.wait_for(&["#bytes"], "mlx5 lat raw -Z");
    let mut args = vec!["-P", "-B", &mc, "-E", &ms, "-n", "200"];
    args.extend_from_slice(extra);
    let co = start(perftest(c, &args)).finish("raw_ethernet_lat -P");
    let so = server.finish("mlx5 lat raw -Z");
    let r = row(&co);
    assert_eq!((r[0], r[1]), (64.0, 200.0), "{co}");
    assert!(r[2] > 0.0 && r[2] <= r[3], "t_min <= t_max: {r:?}");
    assert!(so.contains("server: answered 200 frames"), "{so}");
}

/// raw_ethernet_lat as the server (-Z), ours as the client (-P).
fn perftest_serves_ours(s: u16, extra: &[&str]) {
    let _one = one_pair_at_a_time();
    let c = s + 1;
    let (ms, mc) = (mac(s), mac(c));
    let mut args = vec!["-Z", "-B", &ms, "-E", &mc, "-n", "200"];
    args.extend_from_slice(extra);
    let mut cmd = perftest(s, &args);
    cmd.env("MLX5_EMU_TRACE", "1");
    let mut server = start(cmd);
    // Its rule, then RTR and RTS (trace lines of the emulator under it).
    server.wait_for(
        &["EX_CREATE_FLOW", "MODIFY_QP", "MODIFY_QP"],
        "raw_ethernet_lat -Z",
    );
    let mut args = vec!["-P", "-B", &mc, "-E", &ms, "-n", "200"];
    args.extend_from_slice(extra);
    let co = start(ours(c, &args)).finish("mlx5 lat raw -P");
    let so = server.finish("raw_ethernet_lat -Z");
    let r = row(&co);
    assert_eq!((r[0], r[1]), (64.0, 200.0), "{co}");
    assert!(r[2] > 0.0 && r[2] <= r[3], "t_min <= t_max: {r:?}");
    assert_eq!(row(&so)[1], 200.0, "{so}");
    assert!(co.contains("Raw Ethernet Latency Test"), "{co}");
}

#[test]
fn ours_serves_raw_ethernet_lat() {
    ours_serves_perftest(232, &[]);
}

#[test]
fn ours_serves_raw_ethernet_lat_with_ip_udp_headers() {
    ours_serves_perftest(234, IP_UDP);
}

#[test]
fn raw_ethernet_lat_serves_ours() {
    perftest_serves_ours(236, &[]);
}

#[test]
fn raw_ethernet_lat_serves_ours_with_ip_udp_headers() {
    perftest_serves_ours(238, IP_UDP);
}

#[test]
fn loopback_on_two_emulated_hcas_reports_like_lat_send() {
    let dir = std::env::temp_dir().join(format!("mlx5-lat-raw-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let svg = dir.join("raw.svg");
    let json = dir.join("raw.json");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mlx5"));
    clean(&mut cmd);
    cmd.args([
        "lat",
        "raw",
        "--emu",
        "-n",
        "300",
        "-s",
        "128",
        "--histogram",
    ])
    .arg(&svg)
    .arg("--json")
    .arg(&json)
    .args(IP_UDP);
    let out = cmd.output().expect("run");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = row(&text);
    assert_eq!((r[0], r[1]), (128.0, 300.0), "{text}");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parse");
    assert_eq!(doc["test"], "Raw Ethernet Latency Test");
    assert_eq!(doc["results"][0]["iterations"], 300, "{doc}");
    let pic = std::fs::read_to_string(&svg).expect("svg");
    assert!(
        pic.starts_with("<svg") || pic.starts_with("<?xml"),
        "an SVG"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn raw_options_are_refused_elsewhere_and_checked_by_name() {
    let run = |args: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_mlx5"));
        clean(&mut cmd);
        let o = cmd.args(args).output().expect("run");
        assert!(!o.status.success(), "{args:?} succeeded");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let e = run(&["lat", "send", "--emu", "-B", "00:02:c9:ab:cd:01"]);
    assert!(
        e.contains("-B/--source_mac") && e.contains("lat raw"),
        "{e}"
    );
    let e = run(&["bw", "send", "--emu", "-Z"]);
    assert!(e.contains("-Z"), "{e}");
    let e = run(&["lat", "raw", "-P", "-B", "00:02:c9:ab:cd:01", "--emu"]);
    assert!(e.contains("-E"), "{e}");
    let e = run(&["lat", "raw", "--emu", "-J", "10.0.0.1"]);
    assert!(e.contains("-J and -j"), "{e}");
    let e = run(&[
        "lat", "raw", "--emu", "-s", "20", "-J", "10.0.0.1", "-j", "10.0.0.2",
    ]);
    assert!(e.contains("-s 20"), "{e}");
}
