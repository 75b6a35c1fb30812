//! `mlx5 lat`/`bw` against perftest 4.5's own binaries on the emulator, in both roles: the
//! report says what perftest's says (the bandwidth header and its unit, the server's
//! iterations and depth lines, one median), the JSON carries the digits the text prints, and
//! `-q N` runs N QPs per side with one key exchange per QP and the figures summed over them,
//! as perftest's `ib_write_bw -q 4` and `ib_send_bw -q 2` do.

use std::process::Command;

use serde_json::Value;

mod common;
use common::{free_port, ours, perftest, text};

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

fn ours_client(test: &str, op: &str, port: &str, extra: &[&str]) -> Command {
    let mut cmd = ours(&[test, op, "127.0.0.1", "--emu", "-p", port]);
    cmd.args(extra);
    cmd
}

/// Runs a server (given `-p PORT`) and then its client; both must succeed. Their stdouts.
fn run_pair(mut server: Command, mut client: Command) -> (String, String) {
    let _one = common::one_pair_at_a_time();
    let port: u16 = server
        .get_args()
        .skip_while(|a| *a != "-p")
        .nth(1)
        .and_then(|p| p.to_str()?.parse().ok())
        .expect("servers are given -p PORT");
    let srv = server
        .spawn()
        .unwrap_or_else(|e| panic!("{server:?}: {e} (is perftest installed?)"));
    common::wait_listening(
        port,
        std::time::Duration::from_secs(20),
        &format!("{server:?}"),
    );
    let cli = client
        .output()
        .unwrap_or_else(|e| panic!("{client:?}: {e} (is perftest installed?)"));
    let srv = srv.wait_with_output().unwrap();
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

/// The numbers of the table row starting with `first`.
fn row(text: &str, first: &str) -> Vec<f64> {
    let line = text
        .lines()
        .find(|l| l.split_whitespace().next() == Some(first) && l.split_whitespace().count() >= 5)
        .unwrap_or_else(|| panic!("no row {first} in\n{text}"));
    line.split_whitespace()
        .map(|c| c.parse().unwrap())
        .collect()
}

/// The header-block lines perftest varies by role: which of them a report has.
fn depth_lines(text: &str) -> (bool, bool) {
    (
        text.contains(" TX depth        : "),
        text.contains(" RX depth        : "),
    )
}

fn line_with<'a>(text: &'a str, start: &str) -> &'a str {
    text.lines()
        .find(|l| l.starts_with(start))
        .unwrap_or_else(|| panic!("no line {start:?} in\n{text}"))
}

/// QPNs of the `local` or `remote` address lines, in order.
fn qpns(text: &str, which: &str) -> Vec<String> {
    text.lines()
        .filter(|l| l.starts_with(&format!(" {which} address:")))
        .map(|l| {
            let mut it = l.split_whitespace();
            it.by_ref().find(|w| *w == "QPN");
            it.next().unwrap().to_owned()
        })
        .collect()
}

#[test]
fn bandwidth_header_is_perftests_verbatim() {
    // perftest serves, we are the client: the table header line is the same string
    let port = free_port().to_string();
    let (srv, cli) = run_pair(
        perftest("ib_write_bw", &["-p", &port, "-n", "100", "-s", "4096"]),
        ours_client("bw", "write", &port, &["-n", "100", "-s", "4096"]),
    );
    let theirs = line_with(&srv, " #bytes ");
    assert!(theirs.contains("BW peak[MB/sec]"), "{srv}");
    assert_eq!(theirs.trim_end(), line_with(&cli, " #bytes ").trim_end());
    assert!(!cli.contains("MiB/sec"), "{cli}");
    // what the unit means is said once, under the table
    assert!(
        cli.contains(" MB/sec = 2^20 bytes per second, as perftest counts\n"),
        "{cli}"
    );
    // the same figures: perftest's server prints the report our client sent it
    let (t, m) = (row(&srv, "4096"), row(&cli, "4096"));
    assert_eq!((t[1], m[1]), (100.0, 100.0));
    for i in 2..5 {
        assert!((t[i] - m[i]).abs() <= 0.01 * m[i].max(0.01), "{srv}\n{cli}");
    }
}

#[test]
fn send_latency_server_reports_as_perftests_server() {
    // reference: perftest in both roles
    let port = free_port().to_string();
    let (p_srv, p_cli) = run_pair(
        perftest("ib_send_lat", &["-p", &port, "-n", "30"]),
        perftest("ib_send_lat", &["127.0.0.1", "-p", &port, "-n", "30"]),
    );
    // we serve perftest's client
    let port = free_port().to_string();
    let (srv, _) = run_pair(
        ours_server("lat", "send", &port, &["-n", "30"]),
        perftest("ib_send_lat", &["127.0.0.1", "-p", &port, "-n", "30"]),
    );
    // perftest's server prints the run's iterations, RX depth and no TX depth
    assert_eq!(row(&p_srv, "2")[1], 30.0, "{p_srv}");
    assert_eq!(row(&srv, "2")[1], 30.0, "{srv}");
    assert_eq!(depth_lines(&p_srv), (false, true), "{p_srv}");
    assert_eq!(depth_lines(&srv), depth_lines(&p_srv), "{srv}");
    assert_eq!(
        line_with(&srv, " RX depth"),
        line_with(&p_srv, " RX depth"),
        "{srv}\n{p_srv}"
    );
    // our server timed the 29 intervals between its 30 posts and says so
    let extra = srv
        .lines()
        .skip_while(|l| !l.starts_with(" #bytes #samples"))
        .nth(1)
        .unwrap();
    assert_eq!(extra.split_whitespace().nth(1), Some("29"), "{srv}");
    // we are perftest's server's client: the client's lines as perftest's client prints them
    let port = free_port().to_string();
    let (_, cli) = run_pair(
        perftest("ib_send_lat", &["-p", &port, "-n", "30"]),
        ours_client("lat", "send", &port, &["-n", "30"]),
    );
    assert_eq!(depth_lines(&p_cli), (true, false), "{p_cli}");
    assert_eq!(depth_lines(&cli), depth_lines(&p_cli), "{cli}");
    assert_eq!(line_with(&cli, " TX depth"), line_with(&p_cli, " TX depth"));
    assert_eq!(row(&cli, "2")[1], 30.0, "{cli}");
}

#[test]
fn write_bw_server_prints_no_depth_line_as_perftest() {
    let port = free_port().to_string();
    let (p_srv, _) = run_pair(
        perftest("ib_write_bw", &["-p", &port, "-n", "50"]),
        perftest("ib_write_bw", &["127.0.0.1", "-p", &port, "-n", "50"]),
    );
    let port = free_port().to_string();
    let (srv, _) = run_pair(
        ours_server("bw", "write", &port, &["-n", "50"]),
        perftest("ib_write_bw", &["127.0.0.1", "-p", &port, "-n", "50"]),
    );
    assert_eq!(depth_lines(&p_srv), (false, false), "{p_srv}");
    assert_eq!(depth_lines(&srv), (false, false), "{srv}");
    // 64 KiB messages: perftest signals every WR unless -Q is given; so do we
    assert_eq!(
        line_with(&srv, " CQ Moderation"),
        line_with(&p_srv, " CQ Moderation"),
        "{srv}\n{p_srv}"
    );
    assert_eq!(line_with(&srv, " CQ Moderation"), " CQ Moderation   : 1");
    assert_eq!(row(&srv, "65536")[1], 50.0, "{srv}");
}

/// Every float of a JSON text has at most `max` decimals.
fn decimals_at_most(json: &str, max: usize) {
    for num in json
        .split(|c: char| !(c.is_ascii_digit() || c == '.' || c == 'e' || c == '-'))
        .filter(|t| t.contains('.'))
    {
        assert!(!num.contains('e'), "{num} in exponent form");
        let d = num.split('.').nth(1).unwrap().len();
        assert!(d <= max, "{num} has {d} decimals");
    }
}

#[test]
fn one_median_and_rounded_json_in_one_report() {
    for (test, op) in [("lat", "send"), ("lat", "write"), ("lat", "read")] {
        let out = ours(&[test, op, "--emu", "-n", "300", "--json"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        let raw = String::from_utf8(out.stdout).unwrap();
        let table = String::from_utf8(out.stderr).unwrap();
        let doc: Value = serde_json::from_str(&raw).unwrap();
        let r = &doc["results"][0];
        // t_typical and p50 are one value (perftest's median), in the JSON and in the text
        let (typ, p50) = (r["t_typical"].as_f64().unwrap(), r["p50"].as_f64().unwrap());
        assert!((typ - p50).abs() <= 0.005 + 1e-9, "{r}");
        let lat = row(&table, "2");
        let extra = table
            .lines()
            .skip_while(|l| !l.starts_with(" #bytes #samples"))
            .nth(1)
            .unwrap();
        let e: Vec<f64> = extra
            .split_whitespace()
            .map(|c| c.parse().unwrap())
            .collect();
        assert!((lat[4] - e[2]).abs() <= 0.005 + 1e-9, "{table}");
        // perftest's keys carry 2 decimals, ours 3: the digits the text prints
        for k in [
            "t_min",
            "t_max",
            "t_typical",
            "t_avg",
            "t_stdev",
            "percentile_99",
        ] {
            let x = r[k].as_f64().unwrap();
            assert_eq!(
                format!("{x}"),
                format!("{}", (x * 100.0).round() / 100.0),
                "{k}"
            );
        }
        let results = serde_json::to_string(&doc["results"]).unwrap();
        decimals_at_most(&results, 3);
    }
    let out = ours(&["bw", "write", "--emu", "-n", "300", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["bw_unit"], "MB/sec");
    let results = serde_json::to_string(&doc["results"]).unwrap();
    decimals_at_most(&results, 6);
    for k in ["BW_peak", "BW_average"] {
        let x = doc["results"][0][k].as_f64().unwrap();
        assert_eq!(x, (x * 100.0).round() / 100.0, "{k}: {x}");
    }
}

/// `-q 4` WRITE bandwidth against `ib_write_bw -q 4`, both roles: four QPs a side, each
/// address printed (all local lines, then all remote ones) and crosswise equal, the
/// iterations of all four summed (4 x -n) as perftest's, and the figures our client sends
/// printed by perftest's server.
#[test]
fn write_bw_with_four_qps_interoperates_with_perftest() {
    let port = free_port().to_string();
    let (srv, cli) = run_pair(
        perftest(
            "ib_write_bw",
            &["-p", &port, "-n", "100", "-q", "4", "-s", "4096"],
        ),
        ours_client(
            "bw",
            "write",
            &port,
            &["-n", "100", "-q", "4", "-s", "4096"],
        ),
    );
    assert!(cli.contains(" Number of qps   : 4\t\t"), "{cli}");
    let (mine_l, mine_r) = (qpns(&cli, "local"), qpns(&cli, "remote"));
    assert_eq!((mine_l.len(), mine_r.len()), (4, 4), "{cli}");
    assert_eq!(qpns(&srv, "local"), mine_r, "{srv}\n{cli}");
    assert_eq!(qpns(&srv, "remote"), mine_l, "{srv}\n{cli}");
    let (t, m) = (row(&srv, "4096"), row(&cli, "4096"));
    assert_eq!((t[1], m[1]), (400.0, 400.0), "{srv}\n{cli}");
    for i in 2..5 {
        assert!((t[i] - m[i]).abs() <= 0.01 * m[i].max(0.01), "{srv}\n{cli}");
    }
    // perftest's client, our server
    let port = free_port().to_string();
    let (srv, cli) = run_pair(
        ours_server(
            "bw",
            "write",
            &port,
            &["-n", "100", "-q", "4", "-s", "4096"],
        ),
        perftest(
            "ib_write_bw",
            &[
                "127.0.0.1",
                "-p",
                &port,
                "-n",
                "100",
                "-q",
                "4",
                "-s",
                "4096",
            ],
        ),
    );
    assert_eq!(qpns(&srv, "local"), qpns(&cli, "remote"), "{srv}\n{cli}");
    assert_eq!(qpns(&srv, "remote"), qpns(&cli, "local"), "{srv}\n{cli}");
    let (t, m) = (row(&cli, "4096"), row(&srv, "4096"));
    assert_eq!((t[1], m[1]), (400.0, 400.0), "{srv}\n{cli}");
    assert!((t[3] - m[3]).abs() <= 0.01 * t[3].max(0.01), "{srv}\n{cli}");
}

/// `-q 2` SEND bandwidth against `ib_send_bw -q 2`, both roles: every SEND of both QPs is
/// received (the server's iterations are 2 x -n, as perftest's server prints), and each
/// server prints its own receive-side figures with no peak, as perftest's does.
#[test]
fn send_bw_with_two_qps_interoperates_with_perftest() {
    let port = free_port().to_string();
    let (srv, cli) = run_pair(
        ours_server("bw", "send", &port, &["-n", "150", "-q", "2", "-s", "4096"]),
        perftest(
            "ib_send_bw",
            &[
                "127.0.0.1",
                "-p",
                &port,
                "-n",
                "150",
                "-q",
                "2",
                "-s",
                "4096",
            ],
        ),
    );
    let (m, t) = (row(&srv, "4096"), row(&cli, "4096"));
    assert_eq!((m[1], t[1]), (300.0, 300.0), "{srv}\n{cli}");
    assert_eq!(m[2], 0.0, "a SEND server has no peak, as perftest's: {srv}");
    assert!(m[3] > 0.0 && m[4] > 0.0, "{srv}");
    assert_eq!(depth_lines(&srv), (false, true), "{srv}");
    assert_eq!(qpns(&srv, "local"), qpns(&cli, "remote"), "{srv}\n{cli}");
    // perftest serves our client
    let port = free_port().to_string();
    let (srv, cli) = run_pair(
        perftest(
            "ib_send_bw",
            &["-p", &port, "-n", "150", "-q", "2", "-s", "4096"],
        ),
        ours_client("bw", "send", &port, &["-n", "150", "-q", "2", "-s", "4096"]),
    );
    let (t, m) = (row(&srv, "4096"), row(&cli, "4096"));
    assert_eq!((t[1], m[1]), (300.0, 300.0), "{srv}\n{cli}");
    assert_eq!(qpns(&srv, "remote"), qpns(&cli, "local"), "{srv}\n{cli}");
    assert_eq!(qpns(&cli, "local").len(), 2, "{cli}");
}

/// perftest refuses `-q` in latency tests ("Multiple QPs only available on bw tests"); so do
/// we, by name.
#[test]
fn several_qps_are_for_bandwidth_only() {
    let out = ours(&["lat", "send", "--emu", "-q", "2", "127.0.0.1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("-q 2") && err.contains("bandwidth"), "{err}");
    let theirs = perftest("ib_send_lat", &["-q", "2"]).output().unwrap();
    assert!(
        text(&theirs).contains("Multiple QPs only available on bw tests"),
        "{}",
        text(&theirs)
    );
}
