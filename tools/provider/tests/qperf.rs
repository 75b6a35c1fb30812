//! qperf, unmodified, on our provider (both sides): RC/UC/UD latency, RC/UC/UD bandwidth,
//! RDMA WRITE and READ latency and bandwidth, and the atomics, one second each. (`uc_bw` and
//! `ud_bw` report a receive rate below the send rate on the emulator: its fabric between
//! processes drops datagrams a busy receiver cannot take, docs/provider.md; qperf is timed
//! and tolerates it.)

mod common;
use common::{Side, opened, preload_env};
use std::process::{Command, Stdio};

#[test]
fn qperf_rc_uc_ud_rdma_and_atomics_on_ours() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let mut server = Command::new("qperf")
        .args(["-lp", &port])
        .envs(preload_env(Side::Ours))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("qperf");
    // Wait for the listener (not a fixed sleep: the machine may be loaded).
    let start = std::time::Instant::now();
    let portn: u16 = port.parse().unwrap();
    while !common::listening(portn) && start.elapsed() < std::time::Duration::from_secs(30) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let dev = format!("{}:1", common::device());
    let mut failures = Vec::new();
    for (test, want) in [
        ("rc_lat", "latency"),
        ("uc_lat", "latency"),
        ("ud_lat", "latency"),
        ("rc_bw", "bw"),
        ("uc_bw", "recv_bw"),
        ("ud_bw", "recv_bw"),
        ("rc_rdma_write_lat", "latency"),
        ("rc_rdma_read_lat", "latency"),
        ("rc_rdma_write_bw", "bw"),
        ("rc_rdma_read_bw", "bw"),
        ("rc_compare_swap_mr", "msg_rate"),
        ("rc_fetch_add_mr", "msg_rate"),
    ] {
        let out = Command::new("timeout")
            .args([
                "60", "qperf", "-lp", &port, "-t", "1", "-i", &dev, "-ri", &dev,
            ])
            .args(["localhost", test])
            .envs(preload_env(Side::Ours))
            .output()
            .unwrap();
        let (o, e) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        if !(out.status.success() && o.contains(want) && opened(&e) == 1) {
            failures.push(format!("{test}: {}\n{o}\n{e}", out.status));
        }
    }
    let _ = server.kill();
    let _ = server.wait();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
