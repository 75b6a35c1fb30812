//! Helpers shared by the integration tests that run the `mlx5` binary.
#![allow(dead_code)] // each test file uses its own subset of the helpers

use std::process::Command;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Serialises the tests that start a pair of processes: four processes with emulator device
/// threads on a 2-core machine starve each other's retransmission timers under load.
pub fn one_pair_at_a_time() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A free TCP port on the loopback interface (released again before use; good enough here).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The LD_PRELOAD shim that puts unmodified rdma-core programs on the emulator: next to our
/// binary when the workspace was built, else built now (same target directory and profile).
pub fn preload_so() -> std::path::PathBuf {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_mlx5"));
    let profile_dir = bin.parent().unwrap();
    let so = profile_dir.join("libmlx5_emu_preload.so");
    if !so.exists() {
        let target_dir = profile_dir.parent().unwrap();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-q", "-p", "mlx5-emu-preload", "--target-dir"])
            .arg(target_dir);
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let st = cmd.status().expect("run cargo build -p mlx5-emu-preload");
        assert!(st.success(), "building the preload shim failed");
    }
    assert!(so.exists(), "{} missing", so.display());
    so
}

/// Whether a socket listens on TCP `port`, from `/proc/net/tcp*` (a probing connection would
/// be taken for the peer by ibv_rc_pingpong's server).
pub fn listening(port: u16) -> bool {
    let want = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f)
            .unwrap_or_default()
            .lines()
            .skip(1)
            .any(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                // local address "ADDR:PORT" in column 1, state in column 3 (0A = LISTEN)
                cols.len() > 3 && cols[1].ends_with(&want) && cols[3] == "0A"
            })
    })
}

/// Wait (at most `limit`) until a socket listens on TCP `port`; `server` names the program
/// in the panic message when it never does.
pub fn wait_listening(port: u16, limit: std::time::Duration, server: &str) {
    let until = std::time::Instant::now() + limit;
    while !listening(port) {
        assert!(
            std::time::Instant::now() < until,
            "{server} never listened on {port}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// perftest's own binary (Debian package `perftest`) on the emulator through the shim
/// (cross-process fabric), its output piped.
pub fn perftest(program: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env("LD_PRELOAD", preload_so())
        .env("MLX5_EMU_FABRIC", "udp")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    cmd
}

/// The `mlx5` binary with `args`, its output piped.
pub fn ours(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mlx5"));
    cmd.args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    cmd
}

/// A finished process's standard output then standard error, as text.
pub fn text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}
