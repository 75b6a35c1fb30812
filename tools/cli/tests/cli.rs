//! Runs the real `mlx5` binary on the emulated ConnectX and checks what it prints, the JSON it
//! writes, and that each perftest knob changes what reaches the device (the emulator's
//! counters: doorbells, BlueFlame writes, inline WQEs, CQEs, CQ arms).

use std::process::{Command, Output};

use serde_json::Value;

mod common;
use common::{free_port, ours, perftest, preload_so};

fn mlx5(args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_mlx5"))
        .args(args)
        .output()
        .expect("run the mlx5 binary");
    assert!(
        out.status.success(),
        "mlx5 {args:?} failed: {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs with `--json` (to stdout) and returns the document.
fn json(args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["--emu", "--json"]);
    let out = mlx5(&all);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout of {all:?} is not JSON ({e}):\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

fn driver(doc: &Value, name: &str) -> u64 {
    doc["driver_counters"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("no driver_counters.{name} in {doc:#}"))
}

fn counter(doc: &Value, name: &str) -> u64 {
    doc["emu_counters"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("no emu_counters.{name} in {doc:#}"))
}

#[test]
fn lat_send_prints_perftest_table_and_extra_statistics() {
    let out = mlx5(&["lat", "send", "--emu", "-n", "200"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("running on the emulated ConnectX (mlx5-emu)"),
        "{text}"
    );
    assert!(
        text.contains("                    Send Latency Test\n"),
        "{text}"
    );
    assert!(text.contains(" Max inline data : 236[B]"), "{text}");
    assert!(text.contains(mlx5_tools::report::LAT_HEADER), "{text}");
    assert!(
        text.contains("one-way latency = RTT/2, as perftest reports"),
        "{text}"
    );
    assert!(text.contains(mlx5_tools::report::EXTRA_HEADER), "{text}");
    // the perftest row: 9 columns, size 2, 200 iterations, t_min <= t_typical <= t_max
    let row = text
        .lines()
        .find(|l| l.split_whitespace().count() == 9 && l.trim_start().starts_with("2 "))
        .unwrap_or_else(|| panic!("no result row in\n{text}"));
    let v: Vec<f64> = row.split_whitespace().map(|c| c.parse().unwrap()).collect();
    assert_eq!((v[0], v[1]), (2.0, 200.0));
    assert!(v[2] > 0.0 && v[2] <= v[4] && v[4] <= v[3], "{row}");
    // the extra row: #bytes #samples p50 p99 p99.9 p99.99 max, nothing dropped
    let extra = text
        .lines()
        .skip_while(|l| *l != mlx5_tools::report::EXTRA_HEADER)
        .nth(1)
        .unwrap();
    let e: Vec<f64> = extra
        .split_whitespace()
        .map(|c| c.parse().unwrap())
        .collect();
    assert_eq!(e.len(), 7, "{extra}");
    assert_eq!(e[1], 200.0);
    assert!(
        e[2] <= e[3] && e[3] <= e[4] && e[4] <= e[5] && e[5] <= e[6],
        "{extra}"
    );
    // perftest's t_max column is our true max
    assert!((e[6] - v[3]).abs() < 0.01, "{row} vs {extra}");
}

#[test]
fn default_run_says_why_it_uses_the_emulator() {
    // the README's main job: no options at all
    let out = mlx5(&["lat", "send", "-n", "50"]);
    let text = String::from_utf8(out.stdout).unwrap();
    let first = text.lines().next().unwrap();
    if mlx5::devices().is_ok_and(|d| !d.is_empty()) {
        assert!(!first.contains("emulated"), "a NIC is present but: {first}");
    } else {
        assert_eq!(
            first,
            "running on the emulated ConnectX (mlx5-emu): no NIC found"
        );
    }
    assert!(text.contains(mlx5_tools::report::LAT_HEADER));
}

#[test]
fn json_carries_perftest_keys_and_ours() {
    let doc = json(&["lat", "send", "-n", "100"]);
    assert_eq!(doc["test"], "Send Latency Test");
    assert_eq!(doc["emulated"], true);
    assert_eq!(doc["rtt_or_half"], "RTT/2");
    let r = &doc["results"][0];
    for k in [
        "t_min",
        "t_max",
        "t_typical",
        "t_avg",
        "t_stdev",
        "percentile_99",
        "percentile_99.9",
        "p50",
        "p99",
        "p99_9",
        "p99_99",
        "max",
    ] {
        assert!(
            r[k].as_f64().is_some_and(|x| x > 0.0 || k == "t_stdev"),
            "{k} in {r}"
        );
    }
    assert_eq!(r["samples"], 100);
    assert!(r["t_min"].as_f64() <= r["t_avg"].as_f64());
    assert!(doc["device"].as_str().unwrap().contains("emulated"));
}

#[test]
fn read_and_atomic_latency_are_full_round_trips() {
    let doc = json(&["lat", "read", "-n", "50"]);
    assert_eq!(doc["rtt_or_half"], "RTT");
    assert_eq!(doc["results"][0]["samples"], 50);
    assert_eq!(counter(&doc, "rx_read_requests"), 50);
    let doc = json(&["lat", "atomic", "-n", "40"]);
    assert_eq!(doc["test"], "Atomic FETCH_AND_ADD Latency Test");
    assert_eq!(doc["rtt_or_half"], "RTT");
    assert_eq!(counter(&doc, "rx_atomic_requests"), 40);
}

#[test]
fn bw_prints_perftest_columns() {
    let out = mlx5(&["bw", "write", "--emu", "-n", "500", "-s", "4096"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains(mlx5_tools::report::BW_HEADER), "{text}");
    assert!(text.contains(" CQ Moderation   : 100"), "{text}");
    let row = text
        .lines()
        .find(|l| l.trim_start().starts_with("4096 "))
        .unwrap_or_else(|| panic!("no row in\n{text}"));
    let v: Vec<f64> = row.split_whitespace().map(|c| c.parse().unwrap()).collect();
    assert_eq!(v.len(), 5, "{row}");
    assert_eq!(v[1], 500.0);
    assert!(v[2] >= v[3] && v[3] > 0.0 && v[4] > 0.0, "{row}");
}

#[test]
fn inline_knob_moves_payload_into_the_wqe() {
    let on = json(&["lat", "send", "-n", "100"]);
    let off = json(&["lat", "send", "-n", "100", "-I", "0"]);
    // both sides send once per iteration; every one of those WQEs is inline by default
    assert_eq!(counter(&on, "inline_wqes"), counter(&on, "wqes_executed"));
    assert!(counter(&on, "inline_wqes") >= 200);
    assert_eq!(counter(&off, "inline_wqes"), 0);
    assert_eq!(
        counter(&off, "wqes_executed"),
        counter(&on, "wqes_executed")
    );
}

#[test]
fn post_list_knob_batches_doorbells() {
    let one = json(&[
        "bw", "write", "-n", "256", "-l", "1", "-t", "64", "-s", "64",
    ]);
    let eight = json(&[
        "bw", "write", "-n", "256", "-l", "8", "-t", "64", "-s", "64",
    ]);
    assert_eq!(counter(&one, "wqes_executed"), 256);
    assert_eq!(counter(&eight, "wqes_executed"), 256);
    // the driver rings once per chain
    assert_eq!(driver(&one, "rings"), 256);
    assert_eq!(driver(&eight, "rings"), 32);
    assert_eq!(driver(&eight, "wqes"), 256);
    // the device observes at most that many (writes between two of its scans coalesce)
    assert!(
        (1..=32).contains(&counter(&eight, "doorbells")),
        "{eight:#}"
    );
    assert!(counter(&one, "doorbells") <= 256);
}

#[test]
fn bf_knob_selects_blueflame_or_plain_doorbells() {
    let on = json(&["lat", "send", "-n", "100", "--bf", "on"]);
    let off = json(&["lat", "send", "-n", "100", "--bf", "off"]);
    assert_eq!(on["bf"], true);
    assert_eq!(off["bf"], false);
    // driver: every single-WQE ring is a BlueFlame copy with --bf on, none with --bf off
    assert_eq!(driver(&on, "bf_copies"), driver(&on, "rings"));
    assert_eq!(driver(&on, "doorbells"), 0);
    assert_eq!(driver(&off, "bf_copies"), 0);
    assert_eq!(driver(&off, "doorbells"), driver(&on, "rings"));
    // device: ping-pong keeps one doorbell in flight, so it sees each one
    assert_eq!(counter(&off, "bf_writes"), 0);
    assert_eq!(counter(&on, "bf_writes"), driver(&on, "bf_copies"));
    assert_eq!(counter(&on, "doorbells"), counter(&off, "doorbells"));
}

#[test]
fn cq_moderation_knob_thins_completions() {
    // RDMA WRITE raises no responder CQEs: every CQE is a requester completion
    let q1 = json(&["bw", "write", "-n", "1000", "-Q", "1", "-s", "64"]);
    let q100 = json(&["bw", "write", "-n", "1000", "-Q", "100", "-s", "64"]);
    assert_eq!(counter(&q1, "cqes_written"), 1000);
    assert_eq!(counter(&q100, "cqes_written"), 10);
}

#[test]
fn event_mode_arms_the_cq_and_waits_on_the_channel() {
    let busy = json(&["lat", "send", "-n", "50"]);
    let event = json(&["lat", "send", "-n", "50", "--poll", "event"]);
    assert_eq!(counter(&busy, "cq_arms"), 0);
    assert_eq!(counter(&busy, "comp_events"), 0);
    assert!(counter(&event, "cq_arms") > 0);
    assert!(counter(&event, "comp_events") > 0);
    assert!(counter(&event, "comp_events") <= counter(&event, "cq_arms"));
    assert_eq!(event["results"][0]["samples"], 50);
}

#[test]
fn histogram_and_json_file_are_written() {
    let dir = std::env::temp_dir().join(format!("mlx5-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("lat.svg");
    let js = dir.join("lat.json");
    let out = mlx5(&[
        "lat",
        "write",
        "--emu",
        "-n",
        "100",
        "--histogram",
        svg.to_str().unwrap(),
        "--json",
        js.to_str().unwrap(),
    ]);
    // with a JSON file the table still goes to stdout
    assert!(String::from_utf8_lossy(&out.stdout).contains("RDMA_Write Latency Test"));
    let text = std::fs::read_to_string(&svg).unwrap();
    let doc = roxmltree::Document::parse(&text).unwrap();
    let labels: Vec<&str> = doc.descendants().filter_map(|n| n.text()).collect();
    // the percentile plot beside the log-count histogram, with the percentile markers
    for want in [
        "latency [usec]",
        "samples per bin (log)",
        "percentile (axis: 1/(1-p), log)",
        "p50",
        "p99.99",
        "max",
    ] {
        assert!(labels.contains(&want), "{want} in {labels:?}");
    }
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&js).unwrap()).unwrap();
    assert_eq!(v["results"][0]["samples"], 100);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_options_fail_with_a_message() {
    for args in [
        &["lat", "send", "--emu", "-Q", "0"][..],
        &["lat", "send", "--emu", "-n", "0"],
        &["lat", "read", "--emu", "-I", "64"],
        &["lat", "send", "--emu", "-m", "1000"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_mlx5"))
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.starts_with("mlx5: "), "{args:?}: {err}");
    }
}

#[test]
fn devices_lists_the_emulated_hca() {
    let out = mlx5(&["devices"]);
    let text = String::from_utf8(out.stdout).unwrap();
    let row = text
        .lines()
        .find(|l| l.contains("(emulated)"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(row.contains("mlx5_0"), "{row}");
    // a 16-digit node GUID
    assert!(
        row.split_whitespace()
            .any(|w| w.len() == 16 && w.bytes().all(|b| b.is_ascii_hexdigit())),
        "{row}"
    );
}

#[test]
fn info_shows_port_and_derived_limits() {
    let out = mlx5(&["info", "--emu", "-v"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("hca_id:\tmlx5_0 (emulated)"), "{text}");
    assert!(text.contains("PORT_ACTIVE (4)"), "{text}");
    assert!(text.contains("max_sq_desc_sz"), "{text}");
    // the derived table has one row per QP type with a positive max inline
    for t in ["RC", "UC", "UD"] {
        let row = text
            .lines()
            .map(str::trim)
            .find(|l| l.starts_with(&format!("{t}  ")))
            .unwrap_or_else(|| panic!("no {t} row in {text}"));
        let inline: u32 = row.split_whitespace().nth(1).unwrap().parse().unwrap();
        assert!(inline > 0 && inline < 1024, "{row}");
    }
    // the lat test inlines 236 bytes by default, so RC must allow at least that
    let rc = text
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("RC  "))
        .unwrap();
    assert!(
        rc.split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<u32>()
            .unwrap()
            >= 236
    );
}

#[test]
fn all_sizes_and_duration_modes_run() {
    let doc = json(&["lat", "send", "-a", "-n", "1"]);
    let sizes: Vec<u64> = doc["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["bytes"].as_u64().unwrap())
        .collect();
    assert_eq!(sizes.first(), Some(&2));
    assert_eq!(sizes.last(), Some(&(8 << 20)));
    assert_eq!(sizes.len(), 23);
    // large messages are not inline: fewer inline WQEs than WQEs
    assert!(counter(&doc, "inline_wqes") < counter(&doc, "wqes_executed"));
    let doc = json(&["bw", "write", "-D", "0.3", "-s", "1024", "-Q", "16"]);
    let n = doc["results"][0]["iterations"].as_u64().unwrap();
    assert!(n > 0 && n % 16 == 0, "{n}");
    assert_eq!(counter(&doc, "wqes_executed"), n);
}

fn address_line<'a>(text: &'a str, which: &str) -> &'a str {
    text.lines()
        .find(|l| l.starts_with(&format!(" {which} address:")))
        .unwrap_or_else(|| panic!("no {which} address line in\n{text}"))
}

fn field<'a>(line: &'a str, name: &str) -> &'a str {
    let mut it = line.split_whitespace();
    it.by_ref().find(|w| *w == name);
    it.next().unwrap_or_else(|| panic!("no {name} in {line}"))
}

#[test]
fn client_and_server_processes_exchange_keys_and_measure() {
    let _one = common::one_pair_at_a_time();
    for op in ["send", "write"] {
        let port = free_port().to_string();
        let server = Command::new(env!("CARGO_BIN_EXE_mlx5"))
            .args([
                "lat",
                op,
                "--emu",
                "--server",
                "--bind",
                "127.0.0.1",
                "-p",
                &port,
                "-n",
                "20",
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let client = mlx5(&[
            "lat",
            op,
            "127.0.0.1",
            "--emu",
            "-p",
            &port,
            "-n",
            "20",
            "--json",
        ]);
        let server = server.wait_with_output().unwrap();
        assert!(
            server.status.success(),
            "{}",
            String::from_utf8_lossy(&server.stderr)
        );
        let s_text = String::from_utf8(server.stdout).unwrap();
        let c_text = String::from_utf8(client.stderr).unwrap();
        // what each side calls local, the other calls remote (PSNs are random per process)
        let (sl, sr) = (
            address_line(&s_text, "local"),
            address_line(&s_text, "remote"),
        );
        let (cl, cr) = (
            address_line(&c_text, "local"),
            address_line(&c_text, "remote"),
        );
        for f in ["LID", "QPN", "PSN"] {
            assert_eq!(field(sl, f), field(cr, f), "{f}: {sl} vs {cr}");
            assert_eq!(field(cl, f), field(sr, f), "{f}: {cl} vs {sr}");
        }
        assert_ne!(field(sl, "QPN"), field(cl, "QPN"));
        if op == "write" {
            assert_eq!(field(sl, "RKey"), field(cr, "RKey"));
            assert_eq!(field(sl, "VAddr"), field(cr, "VAddr"));
        }
        let doc: Value = serde_json::from_slice(&client.stdout).unwrap();
        assert_eq!(doc["data_ex"], "Ethernet");
        // SEND: the client posts first (20 round trips); WRITE: the server does, so the client
        // has 19 intervals between its 20 posts (as perftest: client first in SEND, server in WRITE)
        assert_eq!(
            doc["results"][0]["samples"],
            if op == "send" { 20 } else { 19 }
        );
        // the client's device sent exactly its own 20 messages
        assert_eq!(counter(&doc, "wqes_executed"), 20);
        assert!(s_text.contains(mlx5_tools::report::LAT_HEADER));
    }
}

#[test]
fn hugepages_option_changes_the_buffer_backing() {
    let plain = json(&["lat", "write", "-n", "10"]);
    let huge = json(&["lat", "write", "-n", "10", "--use_hugepages"]);
    assert_eq!(plain["buffers"], "4 KiB pages");
    // hugetlb when pages are reserved, else transparent huge pages, else a note saying why not
    let h = huge["buffers"].as_str().unwrap();
    assert!(h.contains("huge pages") || h.contains("MAP_HUGETLB"), "{h}");
    assert_ne!(h, "4 KiB pages");
}

#[test]
fn pcap_capture_of_the_emulated_fabric() {
    let path = std::env::temp_dir().join(format!("mlx5-cli-{}.pcap", std::process::id()));
    let doc = json(&["lat", "send", "-n", "10", "--pcap", path.to_str().unwrap()]);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    // classic pcap global header (either byte order), then one record per packet
    let magic = u32::from_le_bytes(bytes[..4].try_into().unwrap());
    assert!(
        magic == 0xa1b2_c3d4 || magic.swap_bytes() == 0xa1b2_c3d4,
        "{magic:#x}"
    );
    assert!(bytes.len() > 24 + 16 * counter(&doc, "packets_sent") as usize);
}

fn run_pair(server: &mut Command, client: &mut Command) -> (String, String) {
    let _one = common::one_pair_at_a_time();
    let srv = server
        .spawn()
        .unwrap_or_else(|e| panic!("{server:?}: {e} (is perftest installed?)"));
    // The client must not start before the server listens (perftest clients do not retry).
    let port: u16 = server
        .get_args()
        .skip_while(|a| *a != "-p")
        .nth(1)
        .and_then(|p| p.to_str()?.parse().ok())
        .expect("run_pair servers are given -p PORT");
    common::wait_listening(
        port,
        std::time::Duration::from_secs(20),
        &format!("{server:?}"),
    );
    let cli = client
        .output()
        .unwrap_or_else(|e| panic!("{client:?}: {e} (is perftest installed?)"));
    let srv = srv.wait_with_output().unwrap();
    let text = |o: &Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    assert!(
        srv.status.success(),
        "server {server:?} failed:\n{}\nclient:\n{}",
        text(&srv),
        text(&cli)
    );
    assert!(
        cli.status.success(),
        "client {client:?} failed:\n{}\nserver:\n{}",
        text(&cli),
        text(&srv)
    );
    (
        String::from_utf8(srv.stdout).unwrap(),
        String::from_utf8(cli.stdout).unwrap(),
    )
}

/// `mlx5 TEST OP --server --emu --bind 127.0.0.1 -p PORT EXTRA...` (see [`ours`]).
fn ours_server(test: &str, op: &str, port: &str, extra: &[&str]) -> Command {
    let mut cmd = ours(&[
        test,
        op,
        "--server",
        "--emu",
        "--bind",
        "127.0.0.1",
        "-p",
        port,
    ]);
    cmd.args(extra);
    cmd
}

/// `mlx5 TEST OP 127.0.0.1 --emu -p PORT EXTRA...` (see [`ours`]).
fn ours_client(test: &str, op: &str, port: &str, extra: &[&str]) -> Command {
    let mut cmd = ours(&[test, op, "127.0.0.1", "--emu", "-p", port]);
    cmd.args(extra);
    cmd
}

/// The numbers of a table row starting with `first` (perftest separates with tabs, too).
fn row(text: &str, first: &str) -> Vec<f64> {
    let line = text
        .lines()
        .find(|l| l.split_whitespace().next() == Some(first) && l.split_whitespace().count() >= 5)
        .unwrap_or_else(|| panic!("no row {first} in\n{text}"));
    line.split_whitespace()
        .map(|c| c.parse().unwrap())
        .collect()
}

#[test]
fn interoperates_with_perftest_binaries() {
    // ib_send_lat serves, we are the client
    let port = free_port().to_string();
    let (srv, cli) = run_pair(
        &mut perftest("ib_send_lat", &["-p", &port, "-n", "20"]),
        &mut ours_client("lat", "send", &port, &["-n", "20"]),
    );
    assert_eq!(row(&srv, "2")[1], 20.0, "{srv}");
    assert_eq!(row(&cli, "2")[1], 20.0, "{cli}");
    // their address lines and ours agree crosswise
    for f in ["QPN", "PSN"] {
        assert_eq!(
            field(address_line(&srv, "local"), f),
            field(address_line(&cli, "remote"), f)
        );
        assert_eq!(
            field(address_line(&srv, "remote"), f),
            field(address_line(&cli, "local"), f)
        );
    }

    // we serve ib_write_lat's client (the server writes first in WRITE latency)
    let port = free_port().to_string();
    let (srv, cli) = run_pair(
        &mut ours_server("lat", "write", &port, &["-n", "20"]),
        &mut perftest("ib_write_lat", &["127.0.0.1", "-p", &port, "-n", "20"]),
    );
    assert_eq!(row(&cli, "2")[1], 20.0, "{cli}");
    assert!(srv.contains("RDMA_Write Latency Test"), "{srv}");

    // ib_write_bw serves and prints the figures our client sends in perftest's report exchange
    let port = free_port().to_string();
    let (srv, cli) = run_pair(
        &mut perftest("ib_write_bw", &["-p", &port, "-n", "200", "-s", "4096"]),
        &mut ours_client("bw", "write", &port, &["-n", "200", "-s", "4096"]),
    );
    let theirs = row(&srv, "4096");
    let mine = row(&cli, "4096");
    assert_eq!(theirs[1], 200.0, "{srv}");
    for i in 2..5 {
        assert!(
            (theirs[i] - mine[i]).abs() <= 0.01 * mine[i].max(0.01),
            "column {i}: {srv} vs {cli}"
        );
    }
}

/// `mlx5 lat`/`bw` in one process on an emulated RoCE port: connected by GID (the port's RoCE
/// v2 GID without -x, perftest's choice; the one given with -x), reported as perftest does; a
/// bad MLX5_EMU_LINK_LAYER is refused by name.
#[test]
fn lat_and_bw_run_on_a_roce_port() {
    let run = |args: &[&str], link: &str| {
        Command::new(env!("CARGO_BIN_EXE_mlx5"))
            .args(args)
            .env("MLX5_EMU_LINK_LAYER", link)
            .output()
            .expect("run the mlx5 binary")
    };
    let text = |o: &Output| String::from_utf8_lossy(&o.stdout).into_owned();
    let lat = run(&["lat", "send", "--emu", "-n", "50"], "eth");
    assert!(lat.status.success(), "{lat:?}");
    let t = text(&lat);
    assert_eq!(row(&t, "2")[1], 50.0, "{t}");
    assert!(
        t.contains(" Link type       : Ethernet\n GID index       : 3\n"),
        "{t}"
    );
    assert_eq!(t.matches(" GID: ").count(), 2, "{t}");
    let bw = run(&["bw", "read", "--emu", "-n", "64", "-x", "1"], "roce");
    assert!(bw.status.success(), "{bw:?}");
    let t = text(&bw);
    assert_eq!(row(&t, "65536")[1], 64.0, "{t}");
    assert!(t.contains(" GID index       : 1\n"), "{t}");
    // InfiniBand stays the default: no GID, LID routing
    let ib = mlx5(&["lat", "send", "--emu", "-n", "10"]);
    let t = text(&ib);
    assert!(
        t.contains(" Link type       : IB\n") && !t.contains("GID"),
        "{t}"
    );
    let bad = run(&["lat", "send", "--emu", "-n", "10"], "fddi");
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("MLX5_EMU_LINK_LAYER"),
        "{bad:?}"
    );
}

/// A RoCE port (`MLX5_EMU_LINK_LAYER=eth` for both processes): perftest's ib_send_lat with
/// `-x 3` (the IPv4-mapped RoCE v2 GID) and our `-x 3` exchange keys with GIDs (perftest's
/// 108-byte format), connect by GID and measure, in both roles.
#[test]
fn roce_port_interoperates_with_ib_send_lat_by_gid() {
    // Both processes on a RoCE port.
    let run_eth = |mut srv: Command, mut cli: Command| {
        for c in [&mut srv, &mut cli] {
            c.env("MLX5_EMU_LINK_LAYER", "eth");
        }
        run_pair(&mut srv, &mut cli)
    };
    // ib_send_lat serves, we are the client
    let port = free_port().to_string();
    let (srv, cli) = run_eth(
        perftest("ib_send_lat", &["-p", &port, "-n", "20", "-x", "3"]),
        ours_client("lat", "send", &port, &["-n", "20", "-x", "3"]),
    );
    assert_eq!(row(&srv, "2")[1], 20.0, "{srv}");
    assert_eq!(row(&cli, "2")[1], 20.0, "{cli}");
    assert!(srv.contains("Ethernet"), "perftest saw a RoCE port:\n{srv}");
    assert!(cli.contains("Link type       : Ethernet"), "{cli}");
    for f in ["QPN", "PSN"] {
        assert_eq!(
            field(address_line(&srv, "local"), f),
            field(address_line(&cli, "remote"), f)
        );
    }
    // perftest prints the peer's GID (decimal bytes): ours, the IPv4-mapped one
    let gid_lines: Vec<&str> = srv.lines().filter(|l| l.contains("GID:")).collect();
    assert_eq!(gid_lines.len(), 2, "{srv}");
    assert!(
        gid_lines
            .iter()
            .all(|l| l.contains(":00:00:255:255:127:01:")),
        "{gid_lines:?}"
    );

    // we serve ib_send_lat's client
    let port = free_port().to_string();
    let (srv, cli) = run_eth(
        ours_server("lat", "send", &port, &["-n", "20", "-x", "3"]),
        perftest(
            "ib_send_lat",
            &["127.0.0.1", "-p", &port, "-n", "20", "-x", "3"],
        ),
    );
    assert_eq!(row(&cli, "2")[1], 20.0, "{cli}");
    // SEND: the client posts first, so our server times 19 intervals between its 20 posts,
    // and prints the 20 iterations of the run, as perftest's server does
    assert_eq!(row(&srv, "2")[1], 20.0, "{srv}");
    assert!(srv.contains("GID index       : 3"), "{srv}");
    assert!(cli.contains("Ethernet"), "{cli}");
}

#[test]
fn emu_run_puts_an_unmodified_program_on_the_emulator() {
    let so = preload_so();
    let out = mlx5(&[
        "emu",
        "run",
        "--so",
        so.to_str().unwrap(),
        "--hcas",
        "2",
        "--fabric",
        "inprocess",
        "--",
        "ibv_devinfo",
    ]);
    let text = String::from_utf8(out.stdout).unwrap();
    // libibverbs found both emulated HCAs through the shim
    assert!(text.contains("hca_id:\tmlx5_0"), "{text}");
    assert!(text.contains("hca_id:\tmlx5_1"), "{text}");
    assert!(text.contains("PORT_ACTIVE"), "{text}");
    // the program's exit status is ours
    let st = Command::new(env!("CARGO_BIN_EXE_mlx5"))
        .args([
            "emu",
            "run",
            "--so",
            so.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            "exit 3",
        ])
        .status()
        .unwrap();
    assert_eq!(st.code(), Some(3));
}

#[test]
fn cpu_cost_times_every_driver_call() {
    let doc = json(&["lat", "send", "-n", "100", "--cpu_cost"]);
    let c = &doc["cpu_cost"];
    // both sides post once per iteration, one WR each
    assert_eq!(c["post_send"]["calls"], 200, "{c:#}");
    assert_eq!(c["post_send"]["items"], 200);
    // every send and every receive completes with one CQE, all reaped
    assert_eq!(c["poll_cq"]["items"], 400, "{c:#}");
    assert!(c["post_send"]["p50_ns"].as_f64().unwrap() > 0.0);
    assert!(c["post_send"]["p50_ns"].as_f64() <= c["post_send"]["p99_ns"].as_f64());
    let doc = json(&[
        "bw",
        "write",
        "-n",
        "256",
        "-l",
        "8",
        "-t",
        "64",
        "-s",
        "64",
        "--cpu_cost",
    ]);
    assert_eq!(doc["cpu_cost"]["post_send"]["calls"], 32);
    assert_eq!(doc["cpu_cost"]["post_send"]["items"], 256);
    // without the flag nothing is timed
    assert!(json(&["lat", "send", "-n", "10"]).get("cpu_cost").is_none());
}

/// `mlx5 ARGS...` expected to fail: its stderr.
fn refused(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_mlx5"))
        .args(args)
        .output()
        .unwrap();
    assert!(!out.status.success(), "{args:?} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// perftest's options that are not supported yet are refused by name, with the reason, not
/// by clap's "unexpected argument"; so are options given to a test they do not apply to.
#[test]
fn unsupported_perftest_options_are_refused_by_name() {
    for (args, name) in [
        (&["lat", "send", "--emu", "-R"][..], "-R/--rdma_cm"),
        (&["bw", "write", "--emu", "-b"], "-b/--bidirectional"),
        (&["bw", "write", "--emu", "--report-both"], "--report-both"),
        (
            &["bw", "write", "--emu", "--rate_limit", "5"],
            "--rate_limit",
        ),
        (&["lat", "send", "--emu", "-C"], "-C/--report-cycles"),
        (&["lat", "send", "--emu", "-z"], "-z/--com_rdma_cm"),
        (&["lat", "send", "--emu", "-c", "XRC"], "-c XRC"),
        (&["lat", "send", "--emu", "-c", "DC"], "-c DC"),
        (&["lat", "read", "--emu", "-c", "UC"], "-c UC"),
        (&["bw", "write", "--emu", "-c", "UD"], "-c UD"),
        (&["lat", "send", "--emu", "-c", "UD", "-s", "8192"], "-c UD"),
        (&["bw", "write", "--emu", "-q", "2"], "-q 2"),
        (&["lat", "send", "--emu", "-q", "2"], "-q 2"),
        (&["bw", "write", "--emu", "-q", "0"], "-q 0"),
        (&["bw", "send", "--emu", "-H"], "-H/--report-histogram"),
        (&["bw", "send", "--emu", "-U"], "-U/--report-unsorted"),
        (&["lat", "send", "--emu", "-N"], "-N/--noPeak"),
        (
            &["lat", "send", "--emu", "--report_gbits"],
            "--report_gbits",
        ),
        (&["lat", "send", "--emu", "-o", "4"], "-o/--outs"),
        (
            &["bw", "write", "--emu", "-A", "CMP_AND_SWAP"],
            "-A/--atomic_type",
        ),
        (
            &["lat", "send", "--emu", "-e", "--poll", "interval:5"],
            "-e",
        ),
        (&["lat", "send", "--emu", "-S", "16"], "-S 16"),
        (&["lat", "send", "--emu", "-u", "32"], "-u 32"),
        // options of the TCP exchange where there is none
        (&["lat", "send", "--emu", "-p", "4000"], "-p/--bind"),
        (
            &["bw", "write", "--emu", "--bind", "127.0.0.1"],
            "-p/--bind",
        ),
        (
            &["lat", "send", "127.0.0.1", "--emu", "--bind", "0.0.0.0"],
            "--bind",
        ),
        (
            &["pingpong", "--loopback", "--emu", "-p", "4000"],
            "-p/--bind",
        ),
        (
            &["pingpong", "127.0.0.1", "--emu", "--bind", "0.0.0.0"],
            "--bind",
        ),
    ] {
        let err = refused(args);
        assert!(
            err.starts_with("mlx5: ") && err.contains(name),
            "{args:?}: {err}"
        );
        assert!(!err.contains("unexpected argument"), "{args:?}: {err}");
    }
    // --poll interval has a maximum (it was accepted up to u64::MAX and slept for ever)
    for v in ["interval:18446744073709551615", "interval:1000001"] {
        let err = refused(&["lat", "send", "--emu", "--poll", v]);
        assert!(err.contains("at most 1000000"), "{v}: {err}");
    }
}

/// Every option of [`REFUSED`] is refused by name on `lat` and `bw`, and is in the README's
/// options table as not supported.
#[test]
fn every_refused_option_is_refused_and_in_the_readme_table() {
    use mlx5_tools::cli::REFUSED;
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    for r in REFUSED {
        let spelled = match r.short {
            Some(c) => format!("-{c}, --{}", r.long),
            None => format!("--{}", r.long),
        };
        let cell = if r.value {
            format!("| `{spelled} X` | no |")
        } else {
            format!("| `{spelled}` | no |")
        };
        assert!(readme.contains(&cell), "README lacks the row {cell}");
        for test in ["lat", "bw"] {
            let long = format!("--{}", r.long);
            let mut args = vec![test, "write", "--emu", long.as_str()];
            if r.value {
                args.push("1");
            }
            let err = refused(&args);
            assert!(
                err.contains(&format!(
                    "{}: not supported (perftest option): {}",
                    r.spelling(),
                    r.why
                )),
                "{args:?}: {err}"
            );
            if let Some(c) = r.short {
                let short = format!("-{c}");
                let mut args = vec![test, "write", "--emu", short.as_str()];
                if r.value {
                    args.push("1");
                }
                assert!(refused(&args).contains(&r.spelling()), "{args:?}");
            }
        }
    }
}

/// `bw send --histogram h.svg` exited 0 and wrote nothing: now it is refused and writes
/// nothing; `lat -a --histogram` names the files it writes.
#[test]
fn histogram_is_refused_on_bw_and_named_when_split_by_size() {
    let dir = std::env::temp_dir().join(format!("mlx5-cli-hist-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let h = dir.join("h.svg");
    let err = refused(&["bw", "send", "--emu", "--histogram", h.to_str().unwrap()]);
    assert!(err.contains("--histogram: latency tests only"), "{err}");
    assert!(!h.exists());
    // UD: -a runs the sizes up to the MTU (2 .. 4096: 12 sizes), one file each
    let ha = dir.join("ha.svg");
    let out = mlx5(&[
        "lat",
        "send",
        "--emu",
        "-c",
        "UD",
        "-a",
        "-n",
        "5",
        "--histogram",
        ha.to_str().unwrap(),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    let first = dir.join("ha-2.svg");
    let last = dir.join("ha-4096.svg");
    assert!(
        text.contains(&format!(
            "12 histograms written, one per size: {} ... {}",
            first.display(),
            last.display()
        )),
        "{text}"
    );
    let files = std::fs::read_dir(&dir).unwrap().count();
    assert_eq!(files, 12);
    assert!(!ha.exists());
    // one size: one file, named
    let one = dir.join("one.svg");
    let out = mlx5(&[
        "lat",
        "send",
        "--emu",
        "-n",
        "5",
        "--histogram",
        one.to_str().unwrap(),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("histogram written to {}", one.display())),
        "{text}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The perftest options that are accepted do what perftest's do.
#[test]
fn accepted_perftest_options_take_effect() {
    // UC with perftest's -F -i -S -u -r -e: a run over UC QPs with events
    let doc = json(&[
        "lat", "send", "-c", "UC", "-F", "-i", "1", "-S", "3", "-u", "10", "-r", "64", "-e", "-n",
        "30",
    ]);
    assert_eq!(doc["connection"], "UC");
    assert_eq!(doc["results"][0]["samples"], 30);
    assert!(counter(&doc, "cq_arms") > 0, "-e arms the CQ");
    // UD SEND bandwidth; a datagram SEND carries perftest's UD inline default in latency
    let doc = json(&["bw", "send", "-c", "UD", "-s", "1024", "-n", "300"]);
    assert_eq!(doc["connection"], "UD");
    assert_eq!(doc["results"][0]["iterations"], 300);
    let doc = json(&["lat", "send", "-c", "UD", "-n", "10"]);
    assert_eq!(doc["inline_size"], 188);
    // -N: no peak; --report_gbits: perftest's Gb/sec columns
    let doc = json(&["bw", "write", "-N", "-n", "300", "-s", "4096"]);
    assert_eq!(doc["results"][0]["BW_peak"], 0.0);
    let out = mlx5(&["bw", "write", "--emu", "--report_gbits", "-n", "300"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("BW peak[Gb/sec]    BW average[Gb/sec]"),
        "{text}"
    );
    // -H prints every sample sorted, -U in the order measured
    let out = mlx5(&["lat", "write", "--emu", "-n", "40", "-H"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let samples: Vec<f64> = text
        .lines()
        .filter_map(|l| l.split_once(", "))
        .filter_map(|(i, v)| i.trim().parse::<u32>().ok().and(v.trim().parse().ok()))
        .collect();
    assert_eq!(samples.len(), 40, "{text}");
    assert!(samples.windows(2).all(|w| w[0] <= w[1]), "-H sorts");
    let out = mlx5(&["lat", "write", "--emu", "-n", "40", "-U"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(" #, RTT/2 of 2 B\n"), "{text}");
    // -U: 40 samples numbered 1..=40 whose mean is the table's t_avg
    let unsorted: Vec<(u32, f64)> = text
        .lines()
        .filter_map(|l| l.split_once(", "))
        .filter_map(|(i, v)| Some((i.trim().parse().ok()?, v.trim().parse().ok()?)))
        .collect();
    assert_eq!(
        unsorted.iter().map(|s| s.0).collect::<Vec<_>>(),
        (1..=40).collect::<Vec<_>>()
    );
    let avg = row(&text, "2")[5];
    let sum: f64 = unsorted.iter().map(|s| s.1).sum();
    assert!(
        (sum / 40.0 - avg).abs() < 0.01 + 0.001 * avg,
        "{sum} vs {avg}"
    );
    // --perform_warm_up runs unmeasured WRs first in bandwidth tests too (it was ignored)
    let doc = json(&[
        "bw",
        "write",
        "--perform_warm_up",
        "-n",
        "500",
        "-s",
        "1024",
    ]);
    assert_eq!(doc["results"][0]["iterations"], 500);
    assert_eq!(driver(&doc, "wqes"), 550);
    let err = refused(&["bw", "send", "--emu", "--perform_warm_up"]);
    assert!(err.contains("--perform_warm_up"), "{err}");
    // -o sets the outstanding READs the header reports
    let out = mlx5(&["lat", "read", "--emu", "-n", "20", "-o", "4"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Outstand reads  : 4"), "{text}");
}

/// `bw write -s 64 -l 16 -Q 32` reported a peak of 1,478 MiB/s against an average of 10.6:
/// the peak now spans from a post to a completion, as perftest's does, so it is never below
/// the average and comes from a real span of messages.
#[test]
fn bw_peak_is_perftests() {
    let doc = json(&[
        "bw", "write", "-s", "64", "-l", "16", "-Q", "32", "-n", "2000",
    ]);
    let r = &doc["results"][0];
    let (peak, avg) = (
        r["BW_peak"].as_f64().unwrap(),
        r["BW_average"].as_f64().unwrap(),
    );
    let span = r["peak_window"].as_u64().unwrap();
    assert!(peak >= 0.999 * avg, "peak {peak} < average {avg}");
    assert!((1..=2000).contains(&span), "{r}");
    // -D: perftest computes no peak
    let doc = json(&["bw", "write", "-D", "0.3", "-s", "1024"]);
    assert_eq!(doc["results"][0]["BW_peak"], 0.0);
}

/// `lat send -D 3` showed `2/1000 (0%)` while tens of thousands of iterations ran: the
/// progress of a timed run counts iterations and seconds.
#[test]
fn duration_progress_counts_iterations_and_seconds() {
    let out = mlx5(&["lat", "send", "--emu", "-D", "3.5"]);
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err
        .lines()
        .find(|l| l.contains("Send Latency Test 2 B:"))
        .unwrap_or_else(|| panic!("no progress line in {err}"));
    assert!(
        line.contains(" iterations, ") && line.contains("/3.5 s ("),
        "{line}"
    );
    assert!(!line.contains("/1000"), "{line}");
}

/// A server whose client vanishes ends with an error after `--peer_timeout`, for `bw` and
/// `pingpong` (they waited for ever).
#[test]
fn a_server_whose_peer_vanishes_times_out() {
    for (server, client) in [
        (
            &["bw", "send", "-n", "10000000", "-s", "64"][..],
            &["bw", "send", "-n", "10000000", "-s", "64"][..],
        ),
        (
            &["pingpong", "-n", "10000000", "-s", "64"],
            &["pingpong", "-n", "10000000", "-s", "64"],
        ),
    ] {
        let _one = common::one_pair_at_a_time();
        let port = free_port().to_string();
        let mut srv = ours(server);
        srv.args([
            "--emu",
            "--bind",
            "127.0.0.1",
            "-p",
            &port,
            "--peer_timeout",
            "2",
        ]);
        if server[0] == "bw" {
            srv.arg("--server");
        }
        let srv = srv.spawn().unwrap();
        common::wait_listening(
            port.parse().unwrap(),
            std::time::Duration::from_secs(20),
            "server",
        );
        let mut cli = ours(client);
        cli.args(["127.0.0.1", "--emu", "-p", &port]);
        let mut cli = cli.spawn().unwrap();
        // let the run get going, then the client vanishes
        std::thread::sleep(std::time::Duration::from_millis(2500));
        cli.kill().unwrap();
        let _ = cli.wait();
        let t0 = std::time::Instant::now();
        let out = srv.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{server:?}: {err}");
        assert!(
            err.contains("for 2 s: the peer is gone or a message was lost (--peer_timeout)"),
            "{server:?}: {err}"
        );
        assert!(t0.elapsed() < std::time::Duration::from_secs(30));
    }
}

/// perftest runs UD for SEND and UC for SEND and WRITE: our client and server interoperate
/// with its binaries over both, in both roles.
#[test]
fn interoperates_with_perftest_over_uc_and_ud() {
    // ib_send_lat -c UD serves, we are the client
    let port = free_port().to_string();
    let (srv, cli) = run_pair(
        &mut perftest("ib_send_lat", &["-c", "UD", "-p", &port, "-n", "20"]),
        &mut ours_client("lat", "send", &port, &["-c", "UD", "-n", "20"]),
    );
    assert_eq!(row(&srv, "2")[1], 20.0, "{srv}");
    assert_eq!(row(&cli, "2")[1], 20.0, "{cli}");
    assert!(cli.contains("Connection type : UD"), "{cli}");
    // we serve ib_send_lat -c UD's client
    let port = free_port().to_string();
    let (srv, cli) = run_pair(
        &mut ours_server("lat", "send", &port, &["-c", "UD", "-n", "20"]),
        &mut perftest(
            "ib_send_lat",
            &["-c", "UD", "127.0.0.1", "-p", &port, "-n", "20"],
        ),
    );
    assert_eq!(row(&cli, "2")[1], 20.0, "{cli}");
    assert!(srv.contains("Send Latency Test"), "{srv}");
    // ib_write_bw -c UC serves and prints our client's figures
    let port = free_port().to_string();
    let (srv, cli) = run_pair(
        &mut perftest(
            "ib_write_bw",
            &["-c", "UC", "-p", &port, "-n", "200", "-s", "4096"],
        ),
        &mut ours_client(
            "bw",
            "write",
            &port,
            &["-c", "UC", "-n", "200", "-s", "4096"],
        ),
    );
    assert_eq!(row(&srv, "4096")[1], 200.0, "{srv}");
    assert_eq!(row(&cli, "4096")[1], 200.0, "{cli}");
    // we serve ib_write_bw -c UC's client and print its figures
    let port = free_port().to_string();
    let (srv, cli) = run_pair(
        &mut ours_server(
            "bw",
            "write",
            &port,
            &["-c", "UC", "-n", "200", "-s", "4096"],
        ),
        &mut perftest(
            "ib_write_bw",
            &[
                "-c",
                "UC",
                "127.0.0.1",
                "-p",
                &port,
                "-n",
                "200",
                "-s",
                "4096",
            ],
        ),
    );
    let (theirs, mine) = (row(&cli, "4096"), row(&srv, "4096"));
    assert_eq!(mine[1], 200.0, "{srv}");
    assert!(
        (theirs[3] - mine[3]).abs() <= 0.01 * theirs[3].max(0.01),
        "{srv} vs {cli}"
    );
}

/// `bw atomic` is ib_atomic_bw's twin, and our server's window takes perftest's small WRITEs
/// and atomics, which perftest spreads over a page of the peer's buffer (the window was the
/// message size rounded to 64 bytes: ib_atomic_bw and `ib_write_bw -s 64` against our server
/// failed with a remote access error).
#[test]
fn interoperates_with_ib_atomic_bw_and_small_writes() {
    // ib_atomic_bw serves and prints our client's figures
    let port = free_port().to_string();
    let (srv, cli) = run_pair(
        &mut perftest("ib_atomic_bw", &["-p", &port, "-n", "300"]),
        &mut ours_client("bw", "atomic", &port, &["-n", "300"]),
    );
    assert!(srv.contains("Atomic FETCH_AND_ADD BW Test"), "{srv}");
    assert!(cli.contains("Atomic FETCH_AND_ADD BW Test"), "{cli}");
    assert_eq!(row(&srv, "8")[1], 300.0, "{srv}");
    assert_eq!(row(&cli, "8")[1], 300.0, "{cli}");
    // we serve ib_atomic_bw -A CMP_AND_SWAP's client
    let port = free_port().to_string();
    let (srv, cli) = run_pair(
        &mut ours_server("bw", "atomic", &port, &["-n", "300", "-A", "CMP_AND_SWAP"]),
        &mut perftest(
            "ib_atomic_bw",
            &["127.0.0.1", "-p", &port, "-n", "300", "-A", "CMP_AND_SWAP"],
        ),
    );
    assert_eq!(row(&cli, "8")[1], 300.0, "{cli}");
    assert_eq!(row(&srv, "8")[1], 300.0, "{srv}");
    // we serve ib_write_bw -s 64's client
    let port = free_port().to_string();
    let (srv, cli) = run_pair(
        &mut ours_server("bw", "write", &port, &["-n", "300", "-s", "64"]),
        &mut perftest(
            "ib_write_bw",
            &["127.0.0.1", "-p", &port, "-n", "300", "-s", "64"],
        ),
    );
    assert_eq!(row(&cli, "64")[1], 300.0, "{cli}");
    assert_eq!(row(&srv, "64")[1], 300.0, "{srv}");
}
