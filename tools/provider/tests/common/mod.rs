//! Running unmodified rdma-core programs in two processes on the emulator, each side served by
//! a chosen provider, and proving from its stderr who served it.

#![allow(dead_code)]

use std::io::Read as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Who serves one side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// libmlx5rs (MLX5RS_PROVIDER=ours).
    Ours,
    /// libmlx5rs preloaded but declining (MLX5RS_PROVIDER=libmlx5): rdma-core's libmlx5.
    Libmlx5,
}

impl Side {
    pub fn name(self) -> &'static str {
        match self {
            Side::Ours => "ours",
            Side::Libmlx5 => "libmlx5",
        }
    }
}

pub const PAIRINGS: [(Side, Side); 4] = [
    (Side::Ours, Side::Ours),
    (Side::Ours, Side::Libmlx5),
    (Side::Libmlx5, Side::Ours),
    (Side::Libmlx5, Side::Libmlx5),
];

/// The cargo output directory holding both libraries.
pub fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target/<profile>");
    dir.to_path_buf()
}

/// A library cargo built for these tests: `target/<profile>/deps/NAME`, where `cargo test`
/// leaves a dependency's cdylib (fresh for this build: a clean clone running only `cargo test`
/// has it there alone), else the copy a `cargo build` put in `target/<profile>/`.
pub fn built_lib(name: &str) -> PathBuf {
    let d = lib_dir();
    let fresh = d.join("deps").join(name);
    if fresh.exists() { fresh } else { d.join(name) }
}

/// The real ConnectX the twin tests run on (`MLX5_TEST_DEVICE`), if any.
pub fn real_device() -> Option<String> {
    std::env::var("MLX5_TEST_DEVICE")
        .ok()
        .filter(|d| !d.is_empty())
}

/// The device the programs open: the real one, else the emulated `mlx5_0`.
pub fn device() -> String {
    real_device().unwrap_or_else(|| "mlx5_0".into())
}

/// The environment of one side: the emulator's front door (unless on a real NIC), then ours,
/// with the provider choice and the log line on.
pub fn preload_env(side: Side) -> Vec<(String, String)> {
    let (emu, ours) = (
        built_lib("libmlx5_emu_preload.so"),
        built_lib("libmlx5rs.so"),
    );
    assert!(ours.exists(), "{} missing", ours.display());
    let preload = if real_device().is_some() {
        ours.display().to_string()
    } else {
        assert!(
            emu.exists(),
            "{} missing (cargo builds it for these tests)",
            emu.display()
        );
        format!("{}:{}", emu.display(), ours.display())
    };
    vec![
        ("LD_PRELOAD".into(), preload),
        ("MLX5RS_PROVIDER".into(), side.name().into()),
        ("MLX5RS_LOG".into(), "1".into()),
    ]
}

pub struct Run {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

fn finish(mut child: Child, limit: Duration) -> Run {
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break Some(st);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stdout = String::new();
    let mut stderr = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut stdout);
    }
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut stderr);
    }
    if status.is_none() {
        stderr.push_str("\n[killed: time limit]");
    }
    Run {
        ok: status.is_some_and(|s| s.success()),
        stdout,
        stderr,
    }
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

pub fn listening(port: u16) -> bool {
    let want = format!(":{port:04X} ");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f)
            .unwrap_or_default()
            .lines()
            .skip(1)
            .any(|l| {
                l.split_whitespace()
                    .nth(1)
                    .is_some_and(|a| format!("{a} ").ends_with(&want))
                    && l.split_whitespace().nth(3) == Some("0A")
            })
    })
}

/// The number of `libmlx5rs: opened` lines: one per context ours served.
pub fn opened(stderr: &str) -> usize {
    let want = format!("libmlx5rs: opened {}", device());
    stderr.lines().filter(|l| l.contains(&want)).count()
}

/// Run `program` as server (`server`'s provider) and client (`client`'s) over the emulator's
/// UDP fabric; both must exit 0, and each side's stderr must show who served it.
pub fn pair(
    program: &str,
    args: &[&str],
    port_flag: &str,
    server: Side,
    client: Side,
    extra: &[(&str, &str)],
) -> [Run; 2] {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let port = free_port().to_string();
    let dev = device();
    let cmd = |side: Side| {
        let mut c = Command::new(program);
        c.envs(preload_env(side))
            .envs(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())))
            .args(["-d", &dev, port_flag, &port])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    };
    let s = cmd(server)
        .spawn()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    let portn: u16 = port.parse().unwrap();
    let start = Instant::now();
    while !listening(portn) && start.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let c = cmd(client).arg("localhost").spawn().expect("client");
    let cr = finish(c, Duration::from_secs(60));
    let sr = finish(s, Duration::from_secs(15));
    let tag = format!(
        "{program} {args:?} server={} client={}",
        server.name(),
        client.name()
    );
    let report = format!(
        "{tag}\n--- server stdout\n{}\n--- server stderr\n{}\n--- client stdout\n{}\n--- client stderr\n{}",
        sr.stdout, sr.stderr, cr.stdout, cr.stderr
    );
    assert!(sr.ok && cr.ok, "failed: {report}");
    for (side, r) in [(server, &sr), (client, &cr)] {
        match side {
            Side::Ours => assert!(opened(&r.stderr) >= 1, "ours did not serve: {report}"),
            Side::Libmlx5 => {
                assert_eq!(opened(&r.stderr), 0, "ours served a libmlx5 side: {report}")
            }
        }
    }
    [sr, cr]
}
