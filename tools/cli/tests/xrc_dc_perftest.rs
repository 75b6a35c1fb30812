//! `mlx5 lat`/`bw -c XRC` and `-c DC` against perftest 4.5's own binaries (`ib_send_lat`,
//! `ib_write_lat`, `ib_read_lat`, `ib_write_bw`) on the emulator, in both roles, each side a
//! process of its own: every run completes all its iterations, both sides exit 0 and print
//! their results, and each side's remote QPs are the other's local ones (the DCT numbers and
//! XRC QPs travelled in perftest's key exchange). Then our tool against itself with several
//! QPs and the other operations, and what is refused.

use std::process::Command;

mod common;
use common::{free_port, ours, perftest, text};

/// Iterations of every run.
const ITERS: &str = "100";

/// Runs `server` (listening on `port`), then `client`; both must exit 0 within a minute.
/// Their stdouts.
fn run_pair(mut server: Command, mut client: Command, port: u16) -> (String, String) {
    let _one = common::one_pair_at_a_time();
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
        srv.status.success() && cli.status.success(),
        "{server:?} -> {}, {client:?} -> {}\nserver:\n{}\nclient:\n{}",
        srv.status,
        cli.status,
        text(&srv),
        text(&cli)
    );
    (
        String::from_utf8(srv.stdout).unwrap(),
        String::from_utf8(cli.stdout).unwrap(),
    )
}

/// The iterations column of the result row of `size` (perftest's table and ours).
fn iterations(out: &str, size: &str) -> Option<String> {
    out.lines()
        .map(str::split_whitespace)
        .find_map(|mut w| (w.next() == Some(size)).then(|| w.next().map(str::to_owned))?)
}

/// QPNs of the `local` or `remote` address lines, in order.
fn qpns(out: &str, which: &str) -> Vec<String> {
    out.lines()
        .filter(|l| l.starts_with(&format!(" {which} address:")))
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            it.by_ref().find(|w| *w == "QPN");
            it.next()
                .map(|q| u32::from_str_radix(q.trim_start_matches("0x"), 16))
        })
        .map(|q| format!("{:#x}", q.expect("a hex QPN")))
        .collect()
}

/// One perftest tool against `mlx5 KIND OP` with `-c conn`, in both roles.
fn mixed(tool: &str, kind: &str, op: &str, conn: &str, extra: &[&str]) {
    let lat = kind == "lat";
    let size = if lat { "2" } else { "65536" };
    let mut common_args = vec!["-c", conn, "-n", ITERS];
    common_args.extend_from_slice(extra);
    // who prints a result row: the client always; in SEND and WRITE latency the server too
    let server_measures = lat && matches!(op, "send" | "write");
    for ours_serves in [true, false] {
        let port = free_port();
        let p = port.to_string();
        let (server, client) = if ours_serves {
            let mut s = ours(&[
                kind,
                op,
                "--server",
                "--emu",
                "--bind",
                "127.0.0.1",
                "-p",
                &p,
            ]);
            s.args(&common_args);
            let mut c = perftest(tool, &["-d", "mlx5_0", "-p", &p]);
            c.args(&common_args).arg("127.0.0.1");
            (s, c)
        } else {
            let mut s = perftest(tool, &["-d", "mlx5_0", "-p", &p]);
            s.args(&common_args);
            let mut c = ours(&[kind, op, "127.0.0.1", "--emu", "-p", &p]);
            c.args(&common_args);
            (s, c)
        };
        let what = format!(
            "{tool} -c {conn} {extra:?} ({} serves)",
            if ours_serves { "mlx5" } else { "perftest" }
        );
        let (so, co) = run_pair(server, client, port);
        let both = format!("server:\n{so}\nclient:\n{co}");
        for out in [&so, &co] {
            assert!(
                out.contains(&format!(" Connection type : {conn}\t\tUsing SRQ      : ON")),
                "{what}: connection line\n{both}"
            );
        }
        assert_eq!(
            iterations(&co, size).as_deref(),
            Some(ITERS),
            "{what}: the client's result row\n{both}"
        );
        if server_measures {
            assert_eq!(
                iterations(&so, size).as_deref(),
                Some(ITERS),
                "{what}: the server's result row\n{both}"
            );
        }
        // latency doubles the QPs (initiator, target); bandwidth has one on each side
        let n = if lat { 2 } else { 1 };
        for (a, b) in [(&so, &co), (&co, &so)] {
            let (local, remote) = (qpns(a, "local"), qpns(b, "remote"));
            assert_eq!(local.len(), n, "{what}: local address lines\n{both}");
            assert_eq!(local, remote, "{what}: QPNs sent and received\n{both}");
        }
        if let Some(i) = extra.iter().position(|a| *a == "--log_dci_streams") {
            // ours makes a DCI with that many streams and says so, as perftest's header
            let ours_out = if ours_serves { &so } else { &co };
            let n = extra[i + 1];
            assert!(
                ours_out.contains(&format!("DCS num streams : {n}")),
                "{what}: streams line\n{both}"
            );
        }
        if conn == "DC" && ours_serves {
            // our target's number, as sent after RTR, is not 0 (the DCT's first key is)
            assert!(
                qpns(&so, "local").iter().all(|q| q != "0x0"),
                "{what}\n{both}"
            );
        }
    }
}

#[test]
fn xrc_latency_and_bandwidth_pair_with_perftest_in_both_roles() {
    mixed("ib_send_lat", "lat", "send", "XRC", &[]);
    mixed("ib_write_lat", "lat", "write", "XRC", &[]);
    mixed("ib_read_lat", "lat", "read", "XRC", &[]);
    mixed("ib_write_bw", "bw", "write", "XRC", &[]);
}

#[test]
fn dc_latency_and_bandwidth_pair_with_perftest_in_both_roles() {
    mixed("ib_send_lat", "lat", "send", "DC", &[]);
    mixed("ib_write_lat", "lat", "write", "DC", &[]);
    mixed("ib_read_lat", "lat", "read", "DC", &[]);
    mixed("ib_write_bw", "bw", "write", "DC", &[]);
    // DCI streams on both sides: 4 streams, WRs round-robin over them
    mixed(
        "ib_send_lat",
        "lat",
        "send",
        "DC",
        &["--log_dci_streams", "2"],
    );
}

/// Our tool on both sides: several QPs per side (one SRQ and target each on the server), and
/// the operations the perftest pairs above do not cover.
#[test]
fn our_tool_on_both_sides_runs_every_operation_over_xrc_and_dc() {
    for conn in ["XRC", "DC"] {
        for (kind, op, size, qps) in [
            ("bw", "send", "65536", "2"),
            ("bw", "write", "65536", "2"),
            ("bw", "read", "65536", "1"),
            ("lat", "atomic", "8", "1"),
        ] {
            let port = free_port();
            let p = port.to_string();
            let args = ["-c", conn, "-n", ITERS, "-q", qps];
            let mut s = ours(&[
                kind,
                op,
                "--server",
                "--emu",
                "--bind",
                "127.0.0.1",
                "-p",
                &p,
            ]);
            s.args(args);
            let mut c = ours(&[kind, op, "127.0.0.1", "--emu", "-p", &p]);
            c.args(args);
            let (so, co) = run_pair(s, c, port);
            let what = format!("{kind} {op} -c {conn} -q {qps}\nserver:\n{so}\nclient:\n{co}");
            // -q N: the client's row counts N x ITERS messages, as perftest's
            let total = (ITERS.parse::<u32>().unwrap() * qps.parse::<u32>().unwrap()).to_string();
            let want = if kind == "lat" { ITERS } else { total.as_str() };
            assert_eq!(iterations(&co, size).as_deref(), Some(want), "{what}");
            if op == "send" {
                // the SEND bandwidth server counts the receives its SRQs completed
                assert_eq!(iterations(&so, size).as_deref(), Some(want), "{what}");
            }
            let n: usize = if kind == "lat" {
                2
            } else {
                qps.parse().unwrap()
            };
            assert_eq!(qpns(&co, "remote"), qpns(&so, "local"), "{what}");
            assert_eq!(qpns(&so, "local").len(), n, "{what}");
        }
    }
}

#[test]
fn xrc_and_dc_refuse_what_perftest_refuses_by_name() {
    for (args, needle) in [
        // both ends in one process: perftest has initiators and targets in two
        (
            &["lat", "send", "--emu", "-c", "XRC"][..],
            "-c XRC: with a peer only",
        ),
        (
            &["bw", "write", "--emu", "-c", "DC"],
            "-c DC: with a peer only",
        ),
        (
            &["lat", "send", "--emu", "-c", "DC", "--server", "-R"],
            "DC does not support rdma_cm",
        ),
        (
            &["lat", "send", "--emu", "-c", "XRC", "--server", "-R"],
            "XRC does not support rdma_cm",
        ),
        (
            &["lat", "send", "--emu", "--server", "--log_dci_streams", "2"],
            "--log_dci_streams 2: DC only",
        ),
        (
            &[
                "lat",
                "send",
                "--emu",
                "-c",
                "DC",
                "--server",
                "--log_dci_streams",
                "16",
            ],
            "--log_dci_streams 16: at most 15",
        ),
        (
            &[
                "lat",
                "send",
                "--emu",
                "-c",
                "DC",
                "--server",
                "--log_active_dci_streams",
                "1",
            ],
            "--log_active_dci_streams",
        ),
        (
            &["lat", "send", "--emu", "-c", "SRD"],
            "-c SRD: not supported",
        ),
    ] {
        let out = ours(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

/// `mlx5 trace send -c DC`: the DCT's number from RTR, the WQE's DC address, the first
/// packet's DCETH with the connect flag, the receive from the SRQ and both completions.
#[test]
fn trace_send_over_dc_shows_the_connect() {
    let out = ours(&["trace", "send", "-c", "DC", "-s", "64"])
        .output()
        .unwrap();
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    let dctn = t
        .lines()
        .find_map(|l| l.trim().strip_prefix("DCT number "))
        .and_then(|r| r.split([' ', ',']).next())
        .unwrap_or_else(|| panic!("no DCT number in\n{t}"))
        .to_owned();
    for needle in [
        "dc_av @ 0x0010".to_owned(),
        format!("dctn           : {dctn}"),
        "dc_key         : 0x00000000ffeeddcc".to_owned(),
        format!("SEND_ONLY  se 0  pkey 0xffff  dest QP {dctn}"),
        "DCETH   DC key 0xffeeddcc  connect 1".to_owned(),
        format!("the DCT's receive CQ: 1 completion(s) (QP {dctn}, byte_len 64), data matches"),
    ] {
        assert!(t.contains(&needle), "missing {needle:?} in\n{t}");
    }
    // other transports and operations are refused by name
    for (args, needle) in [
        (&["trace", "write", "-c", "DC"][..], "trace -c DC"),
        (&["trace", "send", "-c", "XRC"], "trace -c XRC"),
    ] {
        let out = ours(args).output().unwrap();
        assert!(!out.status.success(), "{args:?}");
        assert!(text(&out).contains(needle), "{args:?}: {}", text(&out));
    }
}
