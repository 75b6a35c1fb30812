//! UCX (Debian's `ucx-utils`, unmodified, with its default memory hooks) on the emulated HCA
//! through the shim: `ucx_info -d` sees the mlx5 transports, and `ucx_perftest`'s UCP tests
//! pass between two processes over each of the four IB transports.
//!
//! UCX patches the `mmap` it finds first (the shim's) so that every mapping becomes a direct
//! system call; before the seccomp trap (`docs/emulator-preload.md`) `ibv_open_device` failed
//! and no `mlx5_0` transport was listed. It reads the PCI ids through the `realpath` of the
//! class entry; before the kernel's sysfs layout it saw a generic HCA and offered no
//! `rc_mlx5`/`ud_mlx5`. With DEVX (`kernel/devx.rs`) UCX opens its DEVX memory domain: RC
//! and DC QPs on umems, RMP receive queues, device atomics, and `dc_mlx5`.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{Bg, free_port, have, listening, one_at_a_time, run, tool, wait_until};

fn need(program: &str) {
    assert!(
        have(program),
        "{program} is not installed: install Debian's ucx-utils (tools/test.sh does)"
    );
}

/// The transports `ucx_info -d` lists on device `dev`.
fn transports_on(out: &str, dev: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut transport = None;
    for line in out.lines() {
        let line = line.trim_start_matches('#').trim();
        if let Some(t) = line.strip_prefix("Transport:") {
            transport = Some(t.trim().to_string());
        } else if let Some(d) = line.strip_prefix("Device:") {
            if d.trim() == dev {
                found.extend(transport.take());
            }
        }
    }
    found
}

#[test]
fn ucx_info_lists_the_mlx5_transports_with_no_setting_changed() {
    need("ucx_info");
    let _one = one_at_a_time();
    let cmd = tool("ucx_info", &[("MLX5_EMU_FABRIC", "inprocess")]);
    let mut cmd = cmd;
    cmd.arg("-d");
    let (status, out, err) = run(cmd, "ucx-info", Duration::from_secs(60));
    assert!(
        status.is_some_and(|s| s.success()),
        "ucx_info -d failed\n{out}\n{err}"
    );
    assert!(
        !out.contains("failed to open memory domain mlx5_0"),
        "{out}"
    );
    let got = transports_on(&out, "mlx5_0:1");
    for t in ["rc_mlx5", "ud_mlx5", "rc_verbs", "ud_verbs", "dc_mlx5"] {
        assert!(
            got.contains(t),
            "{t} missing on mlx5_0:1 (found {got:?})\n{out}"
        );
    }
}

/// Iterations per `ucx_perftest` run: each run is dominated by the two processes' start.
const ITERS: u32 = 20;

/// One `ucx_perftest` test between a server and a client process, both with `env`; the
/// client runs `test` with `extra` arguments. Both must succeed, every iteration complete and
/// neither print an error. Returns the client's standard output and error.
fn perftest_pair(tls: &str, test: &str, env: &[(&str, &str)], extra: &[&str]) -> (String, String) {
    let port = free_port();
    let mut env = env.to_vec();
    env.push(("UCX_TLS", tls));
    let mut cmd = tool("ucx_perftest", &env);
    cmd.args(["-p", &port.to_string()]);
    let mut server = Bg::start(cmd, &format!("perftest-{tls}-{test}-server"));
    assert!(
        wait_until(Duration::from_secs(30), || listening(port)),
        "{test} over {tls}: the server never listened\n{}\n{}",
        server.stdout(),
        server.stderr()
    );
    let mut cmd = tool("ucx_perftest", &env);
    cmd.args(["127.0.0.1", "-p", &port.to_string(), "-t", test])
        .args(["-n", &ITERS.to_string()])
        .args(extra);
    let (status, out, err) = run(
        cmd,
        &format!("perftest-{tls}-{test}-client"),
        Duration::from_secs(60),
    );
    let (sstatus, sout, serr) = server.finish(Duration::from_secs(20));
    let report = format!("client:\n{out}\n{err}\nserver:\n{sout}\n{serr}");
    assert!(
        status.is_some_and(|s| s.success()),
        "{test} over {tls}: the client failed\n{report}"
    );
    assert!(
        sstatus.is_some_and(|s| s.success()),
        "{test} over {tls}: the server failed\n{report}"
    );
    // "Final: <iterations> <latency columns> ...": every iteration completed.
    let fin = out
        .lines()
        .find_map(|l| l.strip_prefix("Final:"))
        .unwrap_or_else(|| panic!("{test} over {tls}: no final line\n{report}"));
    let n: u32 = fin
        .split_whitespace()
        .next()
        .and_then(|w| w.parse().ok())
        .unwrap_or(0);
    assert_eq!(n, ITERS, "{test} over {tls}\n{report}");
    assert!(
        !err.contains("rror") && !serr.contains("rror"),
        "{test} over {tls}\n{report}"
    );
    (out, err)
}

/// The UCP tests of the issue, over `tls` (one `UCX_TLS` alias), each between a server and
/// a client process.
fn ucp_tests_over(tls: &str) {
    need("ucx_perftest");
    let _one = one_at_a_time();
    for test in [
        "tag_lat",
        "ucp_am_lat",
        "ucp_put_lat",
        "ucp_get",
        "ucp_fadd",
        "ucp_cswap",
        "stream_lat",
        "tag_bw",
    ] {
        perftest_pair(tls, test, &[], &[]);
    }
}

#[test]
fn ucp_tests_pass_over_rc_mlx5() {
    ucp_tests_over("rc_x");
}

#[test]
fn ucp_tests_pass_over_ud_mlx5() {
    ucp_tests_over("ud_x");
}

#[test]
fn ucp_tests_pass_over_rc_verbs() {
    ucp_tests_over("rc_v");
}

#[test]
fn ucp_tests_pass_over_ud_verbs() {
    ucp_tests_over("ud_v");
}

/// Lengths of the packets in a pcap file (little-endian classic format, as the emulator
/// writes it).
fn pcap_lengths(path: &std::path::Path) -> Vec<usize> {
    let d = std::fs::read(path).unwrap_or_default();
    let mut out = Vec::new();
    let mut o = 24;
    while o + 16 <= d.len() {
        let incl = u32::from_le_bytes([d[o + 8], d[o + 9], d[o + 10], d[o + 11]]) as usize;
        out.push(incl);
        o += 16 + incl;
    }
    out
}

/// UCT `am_lat -D zcopy -s 1024` over `tl`: UCX writes an inline AM header followed by a
/// pointer to the payload; every message must put all 1024 bytes on the wire (the device
/// once sent only the inline bytes while the test reported success).
fn am_zcopy_carries_every_byte(tl: &str) {
    need("ucx_perftest");
    let _one = one_at_a_time();
    let port = free_port();
    let mut cmd = tool("ucx_perftest", &[]);
    cmd.args(["-p", &port.to_string()]);
    let mut server = Bg::start(cmd, &format!("uct-{tl}-server"));
    assert!(
        wait_until(Duration::from_secs(30), || listening(port)),
        "the server never listened\n{}",
        server.stderr()
    );
    let pcap = std::env::temp_dir().join(format!("mlx5-ucx-{}-{tl}.pcap", std::process::id()));
    let _ = std::fs::remove_file(&pcap);
    let pcap_s = pcap.to_string_lossy().into_owned();
    let mut cmd = tool("ucx_perftest", &[("MLX5_EMU_PCAP", &pcap_s)]);
    cmd.args([
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "-t",
        "am_lat",
        "-D",
        "zcopy",
    ])
    .args([
        "-s",
        "1024",
        "-x",
        tl,
        "-d",
        "mlx5_0:1",
        "-n",
        &ITERS.to_string(),
    ]);
    let (status, out, err) = run(cmd, &format!("uct-{tl}-client"), Duration::from_secs(60));
    let (sstatus, _, serr) = server.finish(Duration::from_secs(20));
    assert!(
        status.is_some_and(|s| s.success()),
        "{tl}: client failed\n{out}\n{err}\n{serr}"
    );
    assert!(
        sstatus.is_some_and(|s| s.success()),
        "{tl}: server failed\n{serr}"
    );
    let lens = pcap_lengths(&pcap);
    let _ = std::fs::remove_file(&pcap);
    // Ethernet 14 + IPv4 20 + UDP 8 + BTH 12 + ICRC 4 around at least the 1024 payload bytes
    // (UD adds its DETH; the AM header is on top).
    let full = lens.iter().filter(|&&l| l >= 1024 + 58).count();
    assert!(
        full >= ITERS as usize,
        "{tl}: {full} of the client's packets carry 1024 bytes, {ITERS} messages were sent \
         (packet lengths {lens:?})"
    );
}

#[test]
fn uct_am_zcopy_carries_every_byte_over_rc_mlx5() {
    am_zcopy_carries_every_byte("rc_mlx5");
}

#[test]
fn uct_am_zcopy_carries_every_byte_over_ud_mlx5() {
    am_zcopy_carries_every_byte("ud_mlx5");
}

/// With DEVX (`kernel/devx.rs`) UCX reads the atomic capability page and runs UCP atomics
/// on the device: its endpoint configuration has an `amo(rc_mlx5/...)` lane, not `amo_am`
/// (before, every atomic went over active messages and UCT `swap` was refused).
#[test]
fn ucp_atomics_run_on_the_device_and_uct_swap_runs_over_rc_mlx5() {
    need("ucx_perftest");
    let _one = one_at_a_time();
    let (out, err) = perftest_pair("rc_x", "ucp_fadd", &[("UCX_LOG_LEVEL", "info")], &[]);
    // UCX logs to standard output unless told otherwise.
    let log = format!("{out}{err}");
    let lanes: Vec<&str> = log.lines().filter(|l| l.contains("ep_cfg[")).collect();
    assert!(
        lanes.iter().any(|l| l.contains("amo(rc_mlx5/mlx5_0:1)")),
        "no device atomic lane\n{log}"
    );
    assert!(
        !lanes.iter().any(|l| l.contains("amo_am")),
        "atomics over active messages\n{log}"
    );
    // UCT: 8-byte swap and 4-byte masked compare-and-swap.
    for (test, size) in [("swap", "8"), ("cswap", "4")] {
        perftest_pair(
            "rc_x",
            test,
            &[],
            &["-x", "rc_mlx5", "-d", "mlx5_0:1", "-s", size],
        );
    }
}

/// UCX's DC transport (`dc_mlx5`, issue 22): DEVX DC initiators and a DEVX DC target on an
/// RMP, on the emulator's DC device support. UCP tag_lat, put_lat, get, tag_bw over
/// `UCX_TLS=dc_x`, and UCT am_lat and put_lat over `dc_mlx5`.
#[test]
fn ucp_and_uct_tests_pass_over_dc_mlx5() {
    need("ucx_perftest");
    let _one = one_at_a_time();
    for test in ["tag_lat", "ucp_put_lat", "ucp_get", "tag_bw"] {
        perftest_pair("dc_x", test, &[], &[]);
    }
    for test in ["am_lat", "put_lat"] {
        perftest_pair("dc_x", test, &[], &["-x", "dc_mlx5", "-d", "mlx5_0:1"]);
    }
}

/// UCX turns PCIe relaxed ordering on by itself on AMD Naples, Rome and Milan CPUs
/// (`UCX_IB_PCI_RELAXED_ORDERING=auto`). It then registers every region twice (relaxed and
/// strict order) and sends RMA and atomics under a KSM key of its own making, at the address
/// plus a per-process offset (`kernel/devx_mkey.rs`). Before the emulator made KSM keys, every
/// put on such a CPU landed that offset past the buffer, and `ucp_put_lat` hung over RC and DC
/// (two clean-clone CI runs, while the same commit passed on a Zen 5 machine). Forced on here,
/// so every machine runs that path.
#[test]
fn ucp_rma_and_atomics_pass_with_relaxed_ordering_as_ucx_turns_it_on_for_amd_cpus() {
    need("ucx_perftest");
    let _one = one_at_a_time();
    let ro = [("UCX_IB_PCI_RELAXED_ORDERING", "on")];
    for tls in ["rc_v", "rc_x", "dc_x"] {
        for test in ["ucp_put_lat", "ucp_get", "ucp_fadd", "ucp_cswap"] {
            perftest_pair(tls, test, &ro, &[]);
        }
    }
}
