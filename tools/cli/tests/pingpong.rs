//! `mlx5 pingpong` against Debian's unmodified `ibv_rc_pingpong` in both roles, each on its
//! own emulated ConnectX (ours in-process, theirs through `LD_PRELOAD` of the preload shim),
//! the two reaching each other over the emulator's UDP fabric, addresses exchanged over TCP in
//! ibv_rc_pingpong's format. Every pair must exit 0 on both sides, print both result lines
//! with the right byte and iteration counts, and print address lines that agree crosswise.

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::{JoinHandle, sleep};
use std::time::{Duration, Instant};

mod common;
use common::{free_port, preload_so};

/// How long one side may take before the test fails (a hang must not stall the run).
const LIMIT: Duration = Duration::from_secs(90);

/// A started process whose output is collected; killed if dropped while still running.
struct Running {
    what: String,
    child: Child,
    out: Option<JoinHandle<String>>,
    err: Option<JoinHandle<String>>,
}

/// What a finished process left.
#[derive(Debug)]
struct Done {
    what: String,
    status: ExitStatus,
    out: String,
    err: String,
}

fn collect(r: Option<impl Read + Send + 'static>) -> Option<JoinHandle<String>> {
    r.map(|mut r| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    })
}

impl Running {
    fn start(mut cmd: Command) -> Self {
        let what = format!("{cmd:?}");
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{what}: {e} (is ibverbs-utils installed?)"));
        let out = collect(child.stdout.take());
        let err = collect(child.stderr.take());
        Self {
            what,
            child,
            out,
            err,
        }
    }

    /// Waits until `until`; kills the process then. `Err` carries what it printed so far.
    fn finish(mut self, until: Instant) -> Result<Done, String> {
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(st)) => break Some(st),
                Ok(None) if Instant::now() < until => sleep(Duration::from_millis(20)),
                _ => break None,
            }
        };
        if status.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let text =
            |h: Option<JoinHandle<String>>| h.and_then(|h| h.join().ok()).unwrap_or_default();
        let (out, err) = (text(self.out.take()), text(self.err.take()));
        match status {
            Some(status) => Ok(Done {
                what: self.what.clone(),
                status,
                out,
                err,
            }),
            None => Err(format!("{} timed out (killed)\n{out}\n{err}", self.what)),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // a process still running here belongs to a failed test: stop it
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Debian's ibv_rc_pingpong on an emulated HCA of its own (the shim, UDP fabric).
fn ibv(args: &[&str]) -> Command {
    let mut cmd = Command::new("ibv_rc_pingpong");
    for (k, _) in std::env::vars() {
        if k.starts_with("MLX5_EMU_") || k == "MLX5_PINGPONG_CORRUPT" {
            cmd.env_remove(&k);
        }
    }
    cmd.args(args)
        .env("LD_PRELOAD", preload_so())
        .env("MLX5_EMU_FABRIC", "udp");
    cmd
}

/// `mlx5 pingpong --emu ARGS`.
fn ours(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mlx5"));
    for (k, _) in std::env::vars() {
        if k.starts_with("MLX5_EMU_") || k == "MLX5_PINGPONG_CORRUPT" {
            cmd.env_remove(&k);
        }
    }
    cmd.args(["pingpong", "--emu"]).args(args);
    cmd
}

/// The server's options (`-p PORT` and `--bind` for ours are added by [`pair`]).
enum Side<'a> {
    Ours(&'a [&'a str]),
    Ibv(&'a [&'a str]),
}

impl Side<'_> {
    /// The command of this side; `host` makes it the client.
    fn command(&self, port: &str, host: Option<&str>) -> Command {
        match self {
            Side::Ours(a) => {
                let mut c = ours(a);
                c.args(["-p", port]);
                match host {
                    Some(h) => c.arg(h),
                    None => c.args(["--bind", "127.0.0.1"]),
                };
                c
            }
            Side::Ibv(a) => {
                let mut c = ibv(a);
                c.args(["-p", port]).args(host);
                c
            }
        }
    }
}

/// Runs `server` and then `client` (which connects to 127.0.0.1) on a fresh port, with the
/// extra environment `client_env`/`server_env`; returns both results (whatever the status).
fn pair(
    server: Side<'_>,
    server_env: &[(&str, &str)],
    client: Side<'_>,
    client_env: &[(&str, &str)],
) -> (Done, Done) {
    let _one = common::one_pair_at_a_time();
    let port = free_port();
    let p = port.to_string();
    let mut cmd = server.command(&p, None);
    cmd.envs(server_env.iter().copied());
    let srv = Running::start(cmd);
    common::wait_listening(port, LIMIT, "the server");
    let mut cmd = client.command(&p, Some("127.0.0.1"));
    cmd.envs(client_env.iter().copied());
    let cli = Running::start(cmd);
    let cli = cli.finish(Instant::now() + LIMIT);
    let srv = srv.finish(Instant::now() + Duration::from_secs(20));
    match (srv, cli) {
        (Ok(s), Ok(c)) => (s, c),
        (s, c) => panic!("a side did not finish:\nserver: {s:?}\nclient: {c:?}"),
    }
}

/// One address line (`local` or `remote`) as its four fields `[LID, QPN, PSN, GID]`.
fn address(out: &str, which: &str) -> [String; 4] {
    let line = out
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with(&format!("{which} address:")))
        .unwrap_or_else(|| panic!("no {which} address line in\n{out}"));
    let field = |name: &str| -> String {
        let at = line
            .find(&format!("{name} "))
            .unwrap_or_else(|| panic!("no {name} in {line:?}"));
        line[at + name.len() + 1..]
            .split(',')
            .next()
            .unwrap_or_default()
            .trim()
            .to_owned()
    };
    ["LID", "QPN", "PSN", "GID"].map(field)
}

/// Both sides succeeded, printed ibv_rc_pingpong's two result lines for `size` bytes and
/// `iters` iterations, and what each calls local the other calls remote. Returns the server's
/// and the client's local address.
fn check_pair(s: &Done, c: &Done, size: u64, iters: u64) -> ([String; 4], [String; 4]) {
    let both = format!(
        "server {}:\n{}\n{}\nclient {}:\n{}\n{}",
        s.what, s.out, s.err, c.what, c.out, c.err
    );
    assert!(s.status.success(), "server failed ({})\n{both}", s.status);
    assert!(c.status.success(), "client failed ({})\n{both}", c.status);
    for d in [s, c] {
        let bytes = format!("{} bytes in ", size * iters * 2);
        let per_iter = format!("{iters} iters in ");
        for (start, unit) in [(&bytes, " Mbit/sec"), (&per_iter, " usec/iter")] {
            let line = d
                .out
                .lines()
                .find(|l| l.starts_with(start.as_str()))
                .unwrap_or_else(|| panic!("no line {start:?}...\n{both}"));
            // "N bytes in S seconds = X Mbit/sec": S and X are numbers, X positive
            let w: Vec<&str> = line.split_whitespace().collect();
            assert!(line.ends_with(unit) && w.len() == 8, "{line}");
            assert!(w[3].parse::<f64>().is_ok_and(|x| x >= 0.0), "{line}");
            assert!(w[6].parse::<f64>().is_ok_and(|x| x > 0.0), "{line}");
        }
        assert!(!d.out.contains("invalid data"), "{both}");
    }
    let (sl, sr) = (address(&s.out, "local"), address(&s.out, "remote"));
    let (cl, cr) = (address(&c.out, "local"), address(&c.out, "remote"));
    assert_eq!(sl, cr, "server local vs client remote\n{both}");
    assert_eq!(cl, sr, "client local vs server remote\n{both}");
    assert_ne!(sl[0], cl[0], "two HCAs, two LIDs\n{both}");
    (sl, cl)
}

#[test]
fn ours_serves_ibv_rc_pingpong_with_data_checks() {
    // (a) + (c): -c on both sides, inline-sized and ibv_rc_pingpong's default size
    for size in ["32", "4096"] {
        let args = ["-n", "50", "-s", size, "-c"];
        let (s, c) = pair(Side::Ours(&args), &[], Side::Ibv(&args), &[]);
        check_pair(&s, &c, size.parse().unwrap(), 50);
    }
}

#[test]
fn ibv_rc_pingpong_serves_ours_with_data_checks() {
    // (b) + (c)
    for size in ["32", "4096"] {
        let args = ["-n", "50", "-s", size, "-c"];
        let (s, c) = pair(Side::Ibv(&args), &[], Side::Ours(&args), &[]);
        check_pair(&s, &c, size.parse().unwrap(), 50);
    }
}

#[test]
fn every_byte_arrives_between_ibv_rc_pingpong_and_ours() {
    // --chk-all: every byte of every message received, both directions (sizes above the
    // 32 bytes a receive CQE can carry: docs/datapath.md §4.1)
    let theirs = ["-n", "30", "-s", "5000", "-c"];
    let mine = ["-n", "30", "-s", "5000", "--chk-all"];
    let (s, c) = pair(Side::Ibv(&theirs), &[], Side::Ours(&mine), &[]);
    check_pair(&s, &c, 5000, 30);
    let (s, c) = pair(Side::Ours(&mine), &[], Side::Ibv(&theirs), &[]);
    check_pair(&s, &c, 5000, 30);
}

#[test]
fn completion_events_on_both_sides() {
    // (d) -e: both sleep on the completion channel
    let args = ["-n", "40", "-s", "1024", "-e", "-c"];
    let (s, c) = pair(Side::Ibv(&args), &[], Side::Ours(&args), &[]);
    check_pair(&s, &c, 1024, 40);
}

#[test]
fn global_routing_with_gid_index_0() {
    // (d) -g 0: both send their port GID and put a GRH on the path
    let args = ["-n", "40", "-s", "1024", "-g", "0", "-c"];
    let (s, c) = pair(Side::Ours(&args), &[], Side::Ibv(&args), &[]);
    let (sl, cl) = check_pair(&s, &c, 1024, 40);
    for gid in [&sl[3], &cl[3]] {
        let g: std::net::Ipv6Addr = gid.parse().unwrap_or_else(|e| panic!("{gid}: {e}"));
        assert!(!g.is_unspecified(), "GID {gid}: -g 0 sends the port's GID");
    }
    assert_ne!(sl[3], cl[3], "two HCAs, two GIDs");
}

#[test]
fn corrupted_data_fails_the_peers_check() {
    let args = ["-n", "20", "-s", "4096", "-c"];
    let corrupt = [("MLX5_PINGPONG_CORRUPT", "1")];
    // ibv_rc_pingpong's -c server checks the last message of its -c client: our client's
    // corrupted first byte is reported (ibv_rc_pingpong still exits 0); ours, receiving the
    // echo of it, fails its own check
    let (s, c) = pair(Side::Ibv(&args), &[], Side::Ours(&args), &corrupt);
    assert!(s.status.success(), "{s:?}");
    assert!(s.out.contains("invalid data in page 0"), "{s:?}");
    assert!(!c.status.success(), "{c:?}");
    assert!(c.out.contains("invalid data in page 0"), "{c:?}");
    // the same pair without the corruption is clean: the reports above are the check's doing
    let (s, c) = pair(Side::Ibv(&args), &[], Side::Ours(&args), &[]);
    check_pair(&s, &c, 4096, 20);
    // our -c server fails when ibv_rc_pingpong's client sends without the pattern
    let (s, c) = pair(
        Side::Ours(&args),
        &[],
        Side::Ibv(&["-n", "20", "-s", "4096"]),
        &[],
    );
    assert!(c.status.success(), "{c:?}");
    assert!(!s.status.success(), "{s:?}");
    assert!(s.out.contains("invalid data in page 0"), "{s:?}");
    assert!(s.err.contains("-c:"), "{s:?}");
    // our -c client fails against our corrupting server (which checks nothing itself)
    let (s, c) = pair(
        Side::Ours(&["-n", "20", "-s", "4096"]),
        &corrupt,
        Side::Ours(&args),
        &[],
    );
    assert!(s.status.success(), "{s:?}");
    assert!(!c.status.success(), "{c:?}");
    assert!(c.out.contains("invalid data in page 0"), "{c:?}");
}
