//! `-R`/`--rdma_cm`: our `mlx5 lat -R` / `mlx5 bw -R` against unmodified perftest
//! `ib_send_lat -R` / `ib_write_bw -R` (under the preload, on the emulator's UDP fabric), in
//! both roles, and `mlx5 pingpong -R` against itself. Every pair gets its own rdma_cm port
//! space (`MLX5_EMU_CM_DIR`); the client starts once the server's rdma_cm port is claimed
//! (perftest's client does not retry its first connection).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, preload_so};

/// A fresh rdma_cm port space for one pair, removed at the end.
struct Space(PathBuf);

impl Space {
    fn new(tag: &str) -> Self {
        let d = std::env::temp_dir().join(format!(
            "mlx5-cli-rdma-cm-{tag}-{}-{:?}",
            std::process::id(),
            Instant::now()
        ));
        std::fs::create_dir_all(&d).unwrap();
        Self(d)
    }

    /// Wait until the rdma_cm TCP port `port` is claimed (the server bound it), or the
    /// server exited.
    fn wait_bound(&self, port: u16, server: &mut Child, what: &str) {
        let claim = self.0.join(format!("ps0106-port{port}"));
        let until = Instant::now() + Duration::from_secs(30);
        while !claim.exists() {
            if let Some(st) = server.try_wait().unwrap() {
                panic!("{what} exited ({st}) before binding rdma_cm port {port}");
            }
            assert!(
                Instant::now() < until,
                "{what} never bound rdma_cm port {port}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Space {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn in_space(mut c: Command, space: &Path) -> Command {
    c.env("MLX5_EMU_CM_DIR", space)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

fn perftest(program: &str, args: &[&str]) -> Command {
    let mut c = Command::new(program);
    c.args(args)
        .env("LD_PRELOAD", preload_so())
        .env("MLX5_EMU_FABRIC", "udp");
    c
}

fn ours(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_mlx5"));
    c.args(args);
    c
}

/// Wait at most `limit`, then kill; the output and whether it exited by itself with 0.
fn finish(mut child: Child, limit: Duration) -> (bool, String) {
    let start = Instant::now();
    let killed = loop {
        if child.try_wait().unwrap().is_some() {
            break false;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            break true;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let Output {
        status,
        stdout,
        stderr,
    } = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&stdout),
        String::from_utf8_lossy(&stderr)
    );
    (!killed && status.success(), text)
}

/// Runs `server`, waits for its rdma_cm port, runs `client`; both must exit 0.
fn pair(tag: &str, port: u16, server: Command, client: Command) -> (String, String) {
    let _one = common::one_pair_at_a_time();
    let space = Space::new(tag);
    let what = format!("{server:?}");
    let mut s = in_space(server, &space.0)
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: {e} (is perftest installed?)"));
    space.wait_bound(port, &mut s, &what);
    let c = in_space(client, &space.0).spawn().expect("spawn client");
    let (c_ok, cout) = finish(c, Duration::from_secs(90));
    let (s_ok, sout) = finish(s, Duration::from_secs(30));
    assert!(c_ok, "client failed:\n{cout}\nserver:\n{sout}");
    assert!(s_ok, "server failed:\n{sout}\nclient:\n{cout}");
    (sout, cout)
}

/// The numbers of a table row starting with `first`.
fn row(text: &str, first: &str) -> Vec<f64> {
    let line = text
        .lines()
        .find(|l| l.split_whitespace().next() == Some(first) && l.split_whitespace().count() >= 5)
        .unwrap_or_else(|| panic!("no row {first} in\n{text}"));
    line.split_whitespace()
        .map(|c| c.parse().unwrap())
        .collect()
}

fn cm_mode(text: &str) -> bool {
    text.contains("rdma_cm QPs\t : ON") && text.contains("Data ex. method : rdma_cm")
}

#[test]
fn send_lat_with_perftest_in_both_roles() {
    // ib_send_lat -R serves, we connect
    let port = free_port();
    let p = port.to_string();
    let (srv, cli) = pair(
        "send-lat-theirs",
        port,
        perftest("ib_send_lat", &["-R", "-p", &p, "-n", "20"]),
        ours(&[
            "lat",
            "send",
            "127.0.0.1",
            "--emu",
            "-R",
            "-p",
            &p,
            "-n",
            "20",
        ]),
    );
    assert_eq!(row(&srv, "2")[1], 20.0, "{srv}");
    assert_eq!(row(&cli, "2")[1], 20.0, "{cli}");
    assert!(cm_mode(&srv) && cm_mode(&cli), "{srv}\n{cli}");

    // we serve ib_send_lat -R's client
    let port = free_port();
    let p = port.to_string();
    let (srv, cli) = pair(
        "send-lat-ours",
        port,
        ours(&[
            "lat",
            "send",
            "--server",
            "--bind",
            "127.0.0.1",
            "--emu",
            "-R",
            "-p",
            &p,
            "-n",
            "20",
        ]),
        perftest("ib_send_lat", &["-R", "127.0.0.1", "-p", &p, "-n", "20"]),
    );
    assert_eq!(row(&cli, "2")[1], 20.0, "{cli}");
    // SEND: the client posts first, so our server times 19 intervals between its 20 posts,
    // and prints the 20 iterations of the run, as perftest's server does
    assert_eq!(row(&srv, "2")[1], 20.0, "{srv}");
    assert!(cm_mode(&srv) && cm_mode(&cli), "{srv}\n{cli}");
}

#[test]
fn write_bw_with_perftest_in_both_roles() {
    let args = ["-R", "-n", "200", "-s", "4096"];
    // ib_write_bw -R serves and prints the figures our client sends on the rdma_cm QP
    let port = free_port();
    let p = port.to_string();
    let mut theirs_args = vec!["-p", &p];
    theirs_args.extend(args);
    let mut ours_args = vec!["bw", "write", "127.0.0.1", "--emu", "-p", &p];
    ours_args.extend(args);
    let (srv, cli) = pair(
        "write-bw-theirs",
        port,
        perftest("ib_write_bw", &theirs_args),
        ours(&ours_args),
    );
    let (theirs, mine) = (row(&srv, "4096"), row(&cli, "4096"));
    assert_eq!(theirs[1], 200.0, "{srv}");
    for i in 2..5 {
        assert!(
            (theirs[i] - mine[i]).abs() <= 0.01 * mine[i].max(0.01),
            "column {i}: {srv} vs {cli}"
        );
    }
    assert!(cm_mode(&cli), "{cli}");

    // we serve ib_write_bw -R's client and print its report
    let port = free_port();
    let p = port.to_string();
    let mut ours_args = vec![
        "bw",
        "write",
        "--server",
        "--bind",
        "127.0.0.1",
        "--emu",
        "-p",
        &p,
    ];
    ours_args.extend(args);
    let mut theirs_args = vec!["127.0.0.1", "-p", &p];
    theirs_args.extend(args);
    let (srv, cli) = pair(
        "write-bw-ours",
        port,
        ours(&ours_args),
        perftest("ib_write_bw", &theirs_args),
    );
    let (theirs, mine) = (row(&cli, "4096"), row(&srv, "4096"));
    assert_eq!(theirs[1], 200.0, "{cli}");
    assert_eq!(mine[1], 200.0, "{srv}");
    assert!(cm_mode(&srv), "{srv}");
}

#[test]
fn pingpong_connects_through_rdma_cm_and_checks_the_data() {
    let port = free_port();
    let p = port.to_string();
    let common = ["--emu", "-R", "-p", &p, "-n", "50", "-c"];
    let mut s = vec!["pingpong", "--bind", "127.0.0.1"];
    s.extend(common);
    let mut c = vec!["pingpong", "127.0.0.1"];
    c.extend(common);
    let (srv, cli) = pair("pingpong", port, ours(&s), ours(&c));
    for out in [&srv, &cli] {
        assert!(out.contains("connected through rdma_cm"), "{out}");
        assert!(out.contains("50 iters in"), "{out}");
        assert!(!out.contains("invalid data"), "{out}");
    }
}

#[test]
fn rdma_cm_needs_a_peer_and_rc() {
    for (args, want) in [
        (&["lat", "send", "--emu", "-R"][..], "needs a peer"),
        (
            &["lat", "send", "127.0.0.1", "--emu", "-R", "-c", "UC"],
            "UC is not supported in librdmacm",
        ),
    ] {
        let out = ours(args).output().unwrap();
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
    }
}
