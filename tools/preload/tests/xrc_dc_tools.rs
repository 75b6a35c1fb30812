//! XRC and DC through unmodified rdma-core and perftest (Debian's `ibverbs-utils`,
//! `perftest`) on the emulated HCA, `LD_PRELOAD=libmlx5_emu_preload.so`: server and client
//! in two processes, each on its own emulator, over the UDP fabric, with libmlx5 building
//! every WQE (XRC's SRQ-number segment, DC's address vector) and parsing every CQE.
//!
//! - `ibv_xsrq_pingpong`: XRC domains, XRC SRQs, XRC send and receive QPs, both roles;
//! - perftest `-c XRC` and `-c DC` (`--log_dci_streams` too) for `ib_send_lat`,
//!   `ib_write_lat`, `ib_read_lat` and `ib_write_bw`: short runs, every one must exit 0 and
//!   print its result line, both sides through the emulated kernel's XRC/DC objects.

mod common;

use std::process::Command;
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::{Bg, free_port, listening, wait_limited};

/// A command with the shim preloaded, its trace on (the tests count the verbs it shows), a
/// clean environment, then `env` (`common::tool`).
fn tool(program: &str, env: &[(&str, &str)]) -> Command {
    let mut cmd = common::tool(program, &[("MLX5_EMU_TRACE", "1")]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// Successful calls of `verb` in a shim trace (write, INVOKE_WRITE or ioctl method alike).
fn ok_verbs(trace: &str, verb: &str) -> usize {
    trace
        .lines()
        .filter(|l| l.contains(verb) && l.contains("-> ok"))
        .count()
}

/// What both sides of a run left: (server stdout, server trace, client stdout, client
/// trace). Panics unless both exit 0 within the limits.
fn pair(program: &str, args: &[&str], env: &[(&str, &str)]) -> [String; 4] {
    // One pair at a time: four processes with device threads on a 2-core machine starve
    // each other's retransmission timers.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let port = free_port().to_string();
    let mut cmd = tool(program, env);
    cmd.args(["-d", "mlx5_0", "-p", &port]).args(args);
    let mut server = Bg::start(cmd, &format!("{program}-{port}-server"));
    let up = Instant::now();
    while !listening(port.parse().unwrap()) && up.elapsed() < Duration::from_secs(20) {
        sleep(Duration::from_millis(50));
    }
    let mut cmd = tool(program, env);
    cmd.args(["-d", "mlx5_0", "-p", &port])
        .args(args)
        .arg("localhost");
    let mut client = Bg::start(cmd, &format!("{program}-{port}-client"));
    let cs = wait_limited(&mut client.child, Duration::from_secs(60));
    let ss = wait_limited(&mut server.child, Duration::from_secs(10));
    let all = [
        server.stdout(),
        server.stderr(),
        client.stdout(),
        client.stderr(),
    ];
    let report = || {
        format!(
            "{program} {args:?}\nserver:\n{}\n{}\nclient:\n{}\n{}",
            all[0], all[1], all[2], all[3]
        )
    };
    for (who, s) in [("client", cs), ("server", ss)] {
        let s = s.unwrap_or_else(|| panic!("{who} did not finish\n{}", report()));
        assert!(s.success(), "{who} failed ({s})\n{}", report());
    }
    all
}

#[test]
fn ibv_xsrq_pingpong_runs_both_roles_over_xrc() {
    for env in [
        &[("MLX5_EMU_FLAVOUR", "modern")][..],
        &[("MLX5_EMU_FLAVOUR", "write-only")][..],
        &[("MLX5_EMU_LINK_LAYER", "eth")][..],
    ] {
        let roce = env[0].0 == "MLX5_EMU_LINK_LAYER";
        let args: &[&str] = if roce {
            &["-n", "20", "-s", "1024", "-g", "3"]
        } else {
            &["-n", "20", "-s", "1024"]
        };
        let [so, st, co, ct] = pair("ibv_xsrq_pingpong", args, env);
        for (who, out, trace) in [("server", &so, &st), ("client", &co, &ct)] {
            assert!(
                out.lines().any(|l| l.trim() == "success"),
                "{env:?} {who}:\n{out}"
            );
            // Through the XRC objects of the emulated kernel: a domain, an XRC SRQ, send
            // and receive QPs, each QP connected.
            assert!(ok_verbs(trace, "OPEN_XRCD") >= 1, "{who}:\n{trace}");
            assert!(ok_verbs(trace, "CREATE_QP") >= 2, "{who}:\n{trace}");
            assert!(ok_verbs(trace, "MODIFY_QP") >= 4, "{who}:\n{trace}");
        }
        // Each side names the other's receive QPs and SRQ: what it printed as remote is
        // what the other printed as local.
        let line = |out: &str, which: &str| {
            out.lines()
                .find(|l| l.trim_start().starts_with(which))
                .map(|l| l.trim()[which.len()..].to_string())
                .unwrap_or_else(|| panic!("no {which} in {out}"))
        };
        assert_eq!(line(&so, "remote:"), line(&co, "local:"));
        assert_eq!(line(&co, "remote:"), line(&so, "local:"));
    }
}

/// perftest's result line: `#bytes #iterations ...` followed by the numbers.
fn result_row(out: &str) -> Vec<String> {
    let mut lines = out
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("#bytes"));
    lines.next();
    lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// One perftest tool between two processes with `-c conn`, `iters` iterations: the client
/// reports one result row for that many iterations, both sides say the connection type.
fn perftest(program: &str, conn: &str, iters: &str, more: &[&str]) {
    let mut args = vec!["-c", conn, "-n", iters];
    args.extend_from_slice(more);
    let [so, _, co, ct] = pair(program, &args, &[("MLX5_EMU_FLAVOUR", "modern")]);
    for out in [&so, &co] {
        assert!(
            out.contains(&format!("Connection type : {conn}")),
            "{program} -c {conn}:\n{out}"
        );
    }
    let row = result_row(&co);
    assert!(
        row.len() >= 2 && row[1] == iters,
        "{program} -c {conn}: no result row for {iters} iterations:\n{co}"
    );
    assert!(ok_verbs(&ct, "CREATE_QP") >= 1, "{ct}");
}

#[test]
fn perftest_latency_and_bandwidth_run_over_xrc() {
    for t in ["ib_send_lat", "ib_write_lat", "ib_read_lat"] {
        perftest(t, "XRC", "100", &[]);
    }
    perftest("ib_write_bw", "XRC", "100", &[]);
}

#[test]
fn perftest_latency_and_bandwidth_run_over_dc() {
    for t in ["ib_send_lat", "ib_write_lat", "ib_read_lat"] {
        perftest(t, "DC", "100", &[]);
    }
    perftest("ib_write_bw", "DC", "100", &[]);
    // DCI streams, as libmlx5 asks for them (the HCA offers 2^4).
    perftest("ib_send_lat", "DC", "100", &["--log_dci_streams=2"]);
}
