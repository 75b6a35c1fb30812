//! `mlx5 counters --emu-pid PID` watching a program that runs under `mlx5 emu run`: an
//! unmodified `ib_send_bw` client in another process, sampled twice while it sends. Its
//! port transmits 64 KiB SENDs as full 4096-byte packets (the emulated port's MTU), each
//! LRH 8 + BTH 12 + 4096 + ICRC 4 octets: the port_xmit_data delta is 1030 words per packet
//! of the port_xmit_packets delta, and both grow.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// The delta column of `name` in the second sample of `out` (0 if it did not move: only
/// the counters that moved are listed).
fn delta(out: &str, name: &str) -> u64 {
    let (_, second) = out
        .split_once("sample 2")
        .unwrap_or_else(|| panic!("no second sample in\n{out}"));
    let Some(line) = second
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
    else {
        return 0;
    };
    let d = line
        .split_whitespace()
        .nth(2)
        .unwrap_or_else(|| panic!("no delta in {line:?}"));
    d.trim_start_matches('+')
        .parse()
        .unwrap_or_else(|_| panic!("delta {d:?} in {line:?}"))
}

#[test]
fn counters_by_pid_watch_a_running_ib_send_bw() {
    let mlx5 = env!("CARGO_BIN_EXE_mlx5");
    let port = free_port().to_string();
    let bw = |peer: Option<&str>| {
        let mut c = Command::new(mlx5);
        c.args([
            "emu",
            "run",
            "--",
            "ib_send_bw",
            "-d",
            "mlx5_0",
            "-p",
            &port,
            "-D",
            "15",
        ])
        .args(peer)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        c.spawn().expect("mlx5 emu run ib_send_bw")
    };
    let mut server = bw(None);
    std::thread::sleep(Duration::from_millis(1500));
    let mut client = bw(Some("localhost"));
    // Until the client has opened its device and sent (its tree exists and counts).
    let pid = client.id().to_string();
    let start = Instant::now();
    loop {
        let once = Command::new(mlx5)
            .args(["counters", "--emu-pid", &pid])
            .output()
            .unwrap();
        if String::from_utf8_lossy(&once.stdout).contains("port1/counters/port_xmit_packets") {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the client's counters never showed traffic: {}",
            String::from_utf8_lossy(&once.stderr)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Each file is whole, but a sample reads ~36 files one by one while the preload may be
    // renaming a refresh into place: on a loaded machine a sample can mix two refreshes.
    // Under load the refresher may also miss a second. The rule must hold exactly, with
    // traffic, in one of up to five readings (a wrong rule holds in none).
    let mut texts = Vec::new();
    let mut held = false;
    for _ in 0..5 {
        let out = Command::new(mlx5)
            .args(["counters", "--emu-pid", &pid, "-i", "1", "-n", "2"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains("sample 2"), "{text}");
        let pk = delta(&text, "port1/counters/port_xmit_packets");
        let data = delta(&text, "port1/counters/port_xmit_data");
        let rp = delta(&text, "port1/counters/port_rcv_packets");
        let rd = delta(&text, "port1/counters/port_rcv_data");
        texts.push(text);
        // 64 KiB SENDs at MTU 4096: 1030 words a packet; the ACKs received: 7 words each
        // (LRH, BTH, AETH, ICRC).
        if pk > 0 && rp > 0 && data == pk * (8 + 12 + 4096 + 4) / 4 && rd == rp * 7 {
            held = true;
            break;
        }
    }
    let start = Instant::now();
    for p in [&mut client, &mut server] {
        while p.try_wait().unwrap().is_none() && start.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = p.kill();
        let _ = p.wait();
    }
    assert!(
        held,
        "the words/packet rule held in no reading:\n{}",
        texts.join("\n")
    );
}

#[test]
fn counters_by_pid_name_the_missing_tree() {
    // PID 1 runs no emulated device (and has no child that does).
    let out = Command::new(env!("CARGO_BIN_EXE_mlx5"))
        .args(["counters", "--emu-pid", "1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--emu-pid 1: no emulated sysfs tree at") && err.contains("mlx5-emu-sysfs.1"),
        "{err}"
    );
}
