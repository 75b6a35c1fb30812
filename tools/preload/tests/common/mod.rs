//! Shared by the tests that run independent software (UCX, Open MPI) under the shim: the
//! command with the shim preloaded and a clean `MLX5_EMU_*` environment, background
//! processes with their output in files, bounded waits, free TCP ports.

#![allow(dead_code)]

use std::fs;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

/// `program` with the shim preloaded, no inherited `MLX5_*`/`UCX_*`/`OMPI_*` setting, then
/// `env`.
pub fn tool(program: &str, env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(program);
    cmd.env(
        "LD_PRELOAD",
        mlx5_emu::cprog::preload_so().unwrap_or_else(|e| panic!("{e}")),
    );
    for (k, _) in std::env::vars() {
        if k.starts_with("MLX5_") || k.starts_with("UCX_") || k.starts_with("OMPI_MCA_") {
            cmd.env_remove(&k);
        }
    }
    cmd.env_remove("SYSFS_PATH");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// Whether `program` is on `PATH` (the Debian packages `tools/test.sh` installs).
pub fn have(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
}

/// Wait for `child` at most `limit`; kill it if it is still running. `None` = killed.
pub fn wait_limited(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Some(status);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        sleep(Duration::from_millis(10));
    }
}

/// A background process whose output goes to files we can read while it runs.
pub struct Bg {
    pub child: Child,
    out: PathBuf,
    err: PathBuf,
}

impl Bg {
    pub fn start(mut cmd: Command, tag: &str) -> Bg {
        let file = |ext: &str| {
            let name = format!("mlx5-emu-preload.{}.{tag}.{ext}", std::process::id());
            std::env::temp_dir().join(name)
        };
        let (out, err) = (file("out"), file("err"));
        let child = cmd
            .stdin(Stdio::null())
            .stdout(fs::File::create(&out).expect("output file"))
            .stderr(fs::File::create(&err).expect("error file"))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        Bg { child, out, err }
    }

    pub fn stdout(&self) -> String {
        fs::read_to_string(&self.out).unwrap_or_default()
    }

    pub fn stderr(&self) -> String {
        fs::read_to_string(&self.err).unwrap_or_default()
    }

    /// Wait at most `limit`; the exit status (`None`: killed) and the output.
    pub fn finish(&mut self, limit: Duration) -> (Option<ExitStatus>, String, String) {
        let status = wait_limited(&mut self.child, limit);
        (status, self.stdout(), self.stderr())
    }
}

impl Drop for Bg {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = fs::remove_file(&self.out);
        let _ = fs::remove_file(&self.err);
    }
}

/// Run `cmd` to completion (at most `limit`): exit status, stdout, stderr.
pub fn run(cmd: Command, tag: &str, limit: Duration) -> (Option<ExitStatus>, String, String) {
    Bg::start(cmd, tag).finish(limit)
}

/// A TCP port nobody listens on now (the kernel's pick).
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("local address").port()
}

/// Whether some socket listens on TCP `port`, from `/proc/net/tcp*` (never connecting: a
/// probe connection would be taken for the peer).
pub fn listening(port: u16) -> bool {
    let want = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        fs::read_to_string(f)
            .unwrap_or_default()
            .lines()
            .skip(1)
            .any(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols.len() > 3 && cols[1].ends_with(&want) && cols[3] == "0A"
            })
    })
}

/// Poll `cond` every 10 ms for at most `limit`.
pub fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if cond() {
            return true;
        }
        sleep(Duration::from_millis(10));
    }
    false
}

/// One pair of processes at a time in a test binary: several pairs with device threads on a
/// 2-core machine starve each other's timers.
pub fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
