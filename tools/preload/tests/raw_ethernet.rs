//! perftest's raw Ethernet tools, unmodified (Debian's `perftest`), between two processes
//! on the emulated Ethernet port: RAW_PACKET QPs and `ibv_create_flow` through libmlx5,
//! frames between the processes' HCAs as one UDP datagram per frame on loopback
//! (`docs/raw-ethernet.md`). Server `-Z`, client `-P`, both MACs on the command line; the
//! MAC of node N is `00:02:c9:ab:cd:NN` (`HcaInfo::mac`), pinned with `MLX5_EMU_NODE`.
//! Short runs: each pair finishes in a few seconds.

use std::process::{Child, Command, Stdio};
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

fn finish(mut child: Child, limit: Duration, who: &str) -> String {
    let t = Instant::now();
    loop {
        if let Some(st) = child.try_wait().expect("wait") {
            let out = child.wait_with_output().expect("output");
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(st.success(), "{who} failed ({st}):\n{text}");
            return text;
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "{who} did not finish in {limit:?}:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        sleep(Duration::from_millis(20));
    }
}

/// Run `program` as server (node `s`) and client (node `s + 1`) with `extra` options on
/// both; returns (server output, client output).
fn pair(program: &str, s: u16, extra: &[&str]) -> (String, String) {
    let c = s + 1;
    let (ms, mc) = (mac(s), mac(c));
    let args = |me: &str, peer: &str, role: &str| {
        let mut v: Vec<String> = vec!["-B".into(), me.into(), "-E".into(), peer.into()];
        v.extend(extra.iter().map(|s| s.to_string()));
        v.push(role.into());
        v
    };
    let server = tool(program, s, &args(&ms, &mc, "-Z"))
        .spawn()
        .expect("spawn server");
    sleep(Duration::from_millis(500));
    let client = tool(program, c, &args(&mc, &ms, "-P"))
        .spawn()
        .expect("spawn client");
    let co = finish(client, Duration::from_secs(60), "client");
    let so = finish(server, Duration::from_secs(60), "server");
    (so, co)
}

/// The numbers of the result line that follows the header containing `header`.
fn result_row(out: &str, header: &str) -> Vec<f64> {
    let mut lines = out.lines();
    lines
        .by_ref()
        .find(|l| l.contains(header))
        .unwrap_or_else(|| panic!("no {header:?} header in:\n{out}"));
    let row = lines.next().expect("a result row");
    row.split_whitespace()
        .map(|w| {
            w.parse::<f64>()
                .unwrap_or_else(|_| panic!("bad row {row:?}"))
        })
        .collect()
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
    let (so, co) = pair("raw_ethernet_lat", 240, &extra);
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
    let (so, co) = pair("raw_ethernet_bw", 242, &extra);
    for out in [&so, &co] {
        let row = result_row(out, "BW peak[MB/sec]");
        assert_eq!((row[0], row[1]), (1518.0, 2000.0), "{out}");
        assert!(row[3] > 0.0, "average bandwidth: {row:?}");
    }
}

#[test]
fn raw_ethernet_fs_rate_creates_and_destroys_flows_on_both_sides() {
    let (so, co) = pair("raw_ethernet_fs_rate", 244, &["-n", "20"]);
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
    let (so, co) = pair("raw_ethernet_burst_lat", 246, &extra);
    let row = result_row(&co, "t_min[usec]");
    assert_eq!(row[1], 200.0, "iterations: {co}");
    assert!(row[2] > 0.0 && row[2] <= row[3], "t_min <= t_max: {row:?}");
    // Paced at 1 MB/s (8192 kbit/s) on both sides, 200 round trips of 60-byte frames take
    // at least 200 * 2 * 58.6 us less the pacing credit: the average shows the limit.
    assert!(row[5] > 50.0, "paced: t_avg {row:?}");
    assert!(!so.contains("failed"), "{so}");
}
