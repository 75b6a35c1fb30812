//! `mlx5 emu run --pcap` as ibdump: ib_send_lat's server and client, two processes on the
//! UDP fabric, both given the same capture file, write ONE capture holding both directions,
//! which tshark decodes with no malformed packet when told not to take RoCE SENDs for
//! RPC-over-RDMA (`--disable-protocol rpcordma`, the line docs/diagnostics.md gives). An
//! unwritable `--pcap` path is refused before the program runs.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn have(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
}

/// `mlx5 emu run --pcap PCAP -- ib_send_lat ARGS` with a clean emulator environment.
fn emu_run(pcap: &Path, program_args: &[&str]) -> Command {
    let so = mlx5_emu::cprog::preload_so().unwrap_or_else(|e| panic!("{e}"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mlx5"));
    cmd.args(["emu", "run", "--so"])
        .arg(&so)
        .arg("--pcap")
        .arg(pcap)
        .arg("--")
        .args(program_args);
    for (k, _) in std::env::vars() {
        if k.starts_with("MLX5_") {
            cmd.env_remove(&k);
        }
    }
    cmd.env_remove("SYSFS_PATH");
    cmd
}

/// Wait for `child` at most `limit` (killed after it): its output, `None` if killed.
fn finish(mut child: Child, limit: Duration) -> Option<Output> {
    let start = Instant::now();
    while child.try_wait().expect("try_wait").is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(child.wait_with_output().expect("output"))
}

fn listening(port: u16) -> bool {
    std::fs::read_to_string("/proc/net/tcp")
        .unwrap_or_default()
        .lines()
        .chain(
            std::fs::read_to_string("/proc/net/tcp6")
                .unwrap_or_default()
                .lines(),
        )
        .any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3
                && f[3] == "0A"
                && f[1]
                    .rsplit(':')
                    .next()
                    .is_some_and(|p| u16::from_str_radix(p, 16) == Ok(port))
        })
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

fn tshark(pcap: &Path, extra: &[&str]) -> String {
    let out = Command::new("tshark")
        .arg("--disable-protocol")
        .arg("rpcordma")
        .arg("-r")
        .arg(pcap)
        .args(extra)
        .output()
        .expect("run tshark");
    assert!(
        out.status.success(),
        "tshark: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn one_capture_of_a_two_process_ib_send_lat_decodes_in_both_directions() {
    if !have("ib_send_lat") || !have("tshark") {
        // tools/test.sh installs both (perftest, tshark); without them this test cannot run.
        panic!("needs ib_send_lat (perftest) and tshark on PATH");
    }
    let pcap: PathBuf =
        std::env::temp_dir().join(format!("mlx5-emu-capture-{}.pcap", std::process::id()));
    let _ = std::fs::remove_file(&pcap);
    let iters = 50;
    let n = iters.to_string();
    let port = free_port().to_string();
    let server = emu_run(
        &pcap,
        &["ib_send_lat", "-d", "mlx5_0", "-p", &port, "-n", &n],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("start the server");
    let p: u16 = port.parse().unwrap();
    let start = Instant::now();
    while !listening(p) && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let client = emu_run(
        &pcap,
        &[
            "ib_send_lat",
            "-d",
            "mlx5_0",
            "-p",
            &port,
            "-n",
            &n,
            "localhost",
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("start the client");
    let c = finish(client, Duration::from_secs(90)).expect("the client finished");
    let s = finish(server, Duration::from_secs(20)).expect("the server finished");
    let show = |o: &Output| {
        format!(
            "{}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    assert!(c.status.success(), "client: {}", show(&c));
    assert!(s.status.success(), "server: {}", show(&s));

    let summary = tshark(&pcap, &[]);
    let fields = tshark(
        &pcap,
        &[
            "-T",
            "fields",
            "-e",
            "frame.time_epoch",
            "-e",
            "ip.src",
            "-e",
            "ip.dst",
            "-e",
            "infiniband.bth.opcode",
            "-e",
            "infiniband.bth.destqp",
        ],
    );
    let _ = std::fs::remove_file(&pcap);
    assert_eq!(
        summary.matches("Malformed").count(),
        0,
        "no malformed packet:\n{summary}"
    );
    let rows: Vec<Vec<&str>> = fields
        .lines()
        .map(|l| l.split('\t').collect::<Vec<_>>())
        .collect();
    assert!(rows.iter().all(|r| r.len() == 5), "{fields}");
    // Wall-clock timestamps: today, not 1970.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    for r in &rows {
        let t: f64 = r[0].parse().unwrap_or(0.0);
        assert!((now - t).abs() < 600.0, "timestamp {t} vs now {now}");
    }
    // Both directions: the two nodes each send `iters` SEND_ONLY (opcode 4) to the other's
    // QP and each acknowledges the other's (opcode 17); nothing is recorded twice.
    let mut ips: Vec<&str> = rows.iter().map(|r| r[1]).collect();
    ips.sort_unstable();
    ips.dedup();
    assert_eq!(ips.len(), 2, "packets from both nodes: {ips:?}\n{summary}");
    let (a, b) = (ips[0], ips[1]);
    let count = |src: &str, op: &str| rows.iter().filter(|r| r[1] == src && r[3] == op).count();
    for (src, dst) in [(a, b), (b, a)] {
        assert_eq!(count(src, "4"), iters, "SENDs {src} -> {dst}\n{summary}");
        assert_eq!(count(src, "17"), iters, "ACKs {src} -> {dst}\n{summary}");
        assert!(rows.iter().filter(|r| r[1] == src).all(|r| r[2] == dst));
    }
    // ...to one QP on each side.
    let mut qps: Vec<&str> = rows.iter().map(|r| r[4]).collect();
    qps.sort_unstable();
    qps.dedup();
    assert_eq!(qps.len(), 2, "one QP per side: {qps:?}");
    assert_eq!(
        rows.len(),
        4 * iters,
        "every packet exactly once\n{summary}"
    );
}

#[test]
fn an_unwritable_pcap_path_is_refused_before_the_program_runs() {
    let dir = std::env::temp_dir().join(format!("mlx5-no-such-dir-{}", std::process::id()));
    let pcap = dir.join("x.pcap");
    let out = emu_run(&pcap, &["true"]).output().expect("run");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("--pcap {}", pcap.display())) && err.contains("cannot write"),
        "{err}"
    );
    assert!(!dir.exists());
}

#[test]
fn an_unwritable_mlx5_emu_pcap_stops_the_program_with_a_message() {
    let pcap = std::env::temp_dir()
        .join(format!("mlx5-no-such-dir-{}", std::process::id()))
        .join("y.pcap");
    let so = mlx5_emu::cprog::preload_so().unwrap_or_else(|e| panic!("{e}"));
    if !have("ibv_devinfo") {
        panic!("needs ibv_devinfo (ibverbs-utils) on PATH");
    }
    let out = Command::new("ibv_devinfo")
        .env("LD_PRELOAD", &so)
        .env("MLX5_EMU_PCAP", &pcap)
        .env_remove("SYSFS_PATH")
        .output()
        .expect("run ibv_devinfo");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("MLX5_EMU_PCAP") && err.contains(&pcap.display().to_string()),
        "{err}"
    );
}
