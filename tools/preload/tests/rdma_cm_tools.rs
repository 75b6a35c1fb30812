//! librdmacm's unmodified tools (Debian's `rdmacm-utils`) connect through the emulated
//! rdma_cm (`/dev/infiniband/rdma_cm` of the preload, the ucma of `mlx5-emu`): each pair
//! runs as two processes, server and client, on the UDP fabric, the client reaching the
//! server at 127.0.0.1. Every test gets its own rdma_cm port space (`MLX5_EMU_CM_DIR`), so
//! tests running at the same time cannot reach each other's listeners.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

/// The shim, next to this test binary; `MLX5_EMU_PRELOAD_SO` overrides.
fn preload_so() -> PathBuf {
    if let Some(p) = std::env::var_os("MLX5_EMU_PRELOAD_SO") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("deps dir");
    for dir in [deps, deps.parent().unwrap_or(deps)] {
        let p = dir.join("libmlx5_emu_preload.so");
        if p.exists() {
            return p;
        }
    }
    panic!("libmlx5_emu_preload.so not found next to {}", exe.display());
}

/// A private rdma_cm port space, removed at the end.
struct PortSpace(PathBuf);

impl PortSpace {
    fn new(tag: &str) -> PortSpace {
        let d = std::env::temp_dir().join(format!("mlx5-cm-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        PortSpace(d)
    }

    /// Wait until some process listens on (`ps`, `port`).
    fn wait_listener(&self, ps: u16, port: u16, server: &mut Child) {
        let f = self.0.join(format!("ps{ps:04x}-port{port}"));
        let start = Instant::now();
        while !f.exists() {
            if let Some(st) = server.try_wait().unwrap() {
                panic!("the server exited ({st}) before listening");
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "no listener on {port}"
            );
            sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for PortSpace {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tool(program: &str, args: &[&str], cm: &Path) -> Command {
    let mut c = Command::new(program);
    c.args(args)
        .env("LD_PRELOAD", preload_so())
        .env("MLX5_EMU_CM_DIR", cm);
    for (k, _) in std::env::vars() {
        if k.starts_with("MLX5_EMU_") && k != "MLX5_EMU_PRELOAD_SO" && k != "MLX5_EMU_CM_DIR" {
            c.env_remove(&k);
        }
    }
    c.env_remove("SYSFS_PATH")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Wait at most `limit`, then kill; the output either way.
fn finish(mut child: Child, limit: Duration) -> (Option<i32>, String) {
    let start = Instant::now();
    let killed = loop {
        if child.try_wait().unwrap().is_some() {
            break false;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            break true;
        }
        sleep(Duration::from_millis(10));
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
    ((!killed).then(|| status.code().unwrap_or(-1)), text)
}

fn available(program: &str) -> bool {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(program).exists()))
        .unwrap_or(false);
    // Not skipped silently: CI installs rdmacm-utils (tools/test.sh), so a missing tool
    // fails there; a developer machine without it is told what to install.
    assert!(
        found,
        "{program} not found: install the Debian package rdmacm-utils"
    );
    found
}

/// Run `server`, wait for its listener, run `client`. Returns (exit code, output) of the
/// client and of the server (`None` for a process killed at its time limit).
fn run_pair(
    tag: &str,
    ps: u16,
    port: u16,
    server: (&str, &[&str]),
    client: (&str, &[&str]),
) -> ((Option<i32>, String), (Option<i32>, String)) {
    available(server.0);
    let space = PortSpace::new(tag);
    let mut s = tool(server.0, server.1, &space.0)
        .spawn()
        .expect("spawn server");
    space.wait_listener(ps, port, &mut s);
    let c = tool(client.0, client.1, &space.0)
        .spawn()
        .expect("spawn client");
    let client_end = finish(c, Duration::from_secs(30));
    let server_end = finish(s, Duration::from_secs(10));
    (client_end, server_end)
}

/// Run `server`, wait for its listener, run `client`; both must exit 0. Returns the two
/// outputs.
fn pair(
    tag: &str,
    ps: u16,
    port: u16,
    server: (&str, &[&str]),
    client: (&str, &[&str]),
) -> (String, String) {
    let ((crc, cout), (src, sout)) = run_pair(tag, ps, port, server, client);
    assert_eq!(
        crc,
        Some(0),
        "client {}:\n{cout}\nserver:\n{sout}",
        client.0
    );
    assert_eq!(
        src,
        Some(0),
        "server {}:\n{sout}\nclient:\n{cout}",
        server.0
    );
    (sout, cout)
}

const PS_TCP: u16 = 0x0106;
const PS_UDP: u16 = 0x0111;

/// rdma-core 44's rping has a use-after-free at its end: `main` destroys the event
/// channel (`rdma_destroy_event_channel` closes and frees it) without joining the thread that
/// reads CM events, so when that thread is descheduled between acknowledging DISCONNECTED and
/// its next `rdma_get_cm_event`, it reads the freed channel and exits 255 with EBADF. On a
/// kernel the thread nearly always gets back into the blocking GET_EVENT first; on a loaded
/// machine here, where the teardown commands are fast, it loses about one run in fifty (later
/// rping joins the thread before destroying the channel). Whether `out` is that ending, after
/// every ping and the DISCONNECTED of `side` were printed.
fn rping_teardown_race(code: Option<i32>, out: &str, side: &str) -> bool {
    code == Some(255)
        && out.contains(&format!("{side} DISCONNECT EVENT"))
        && out
            .trim_end()
            .ends_with("rdma_get_cm_event: Bad file descriptor")
        && (0..10).all(|i| out.contains(&format!("ping data: rdma-ping-{i}: ")))
}

#[test]
fn rping_server_and_client_exchange_ten_verified_pings() {
    let server: &[&str] = &["-s", "-a", "127.0.0.1", "-p", "17301", "-C", "10", "-v"];
    let client: &[&str] = &["-c", "-a", "127.0.0.1", "-p", "17301", "-C", "10", "-v"];
    let mut raced = Vec::new();
    let (s, c) = loop {
        let tag = format!("rping{}", raced.len());
        let ((crc, c), (src, s)) =
            run_pair(&tag, PS_TCP, 17301, ("rping", server), ("rping", client));
        if crc == Some(0) && src == Some(0) {
            break (s, c);
        }
        // Only rping's own teardown race is run again, and only after the exchange itself
        // was complete and verified on both sides; anything else fails here.
        let race = (src == Some(0) || rping_teardown_race(src, &s, "server"))
            && (crc == Some(0) || rping_teardown_race(crc, &c, "client"));
        assert!(
            race && raced.len() < 2,
            "rping (attempt {}): client exit {crc:?}:\n{c}\nserver exit {src:?}:\n{s}",
            raced.len() + 1
        );
        raced.push((crc, src));
    };
    if !raced.is_empty() {
        eprintln!("rping's teardown race (exit codes client/server) ran again: {raced:?}");
    }
    // -v prints every ping's data on both sides: the server its RDMA READ of the client's
    // buffer, the client its RDMA READ back of the server's.
    for i in 0..10 {
        let line = format!("ping data: rdma-ping-{i}: ");
        assert!(c.contains(&line), "client lacks {line:?}:\n{c}");
        assert!(
            s.contains(&format!("server {line}")),
            "server lacks {line:?}:\n{s}"
        );
    }
    // The client's DREQ ends the server's connection (the client may exit before it
    // sees its own DISCONNECTED).
    assert!(s.contains("server DISCONNECT EVENT"), "{s}");
}

#[test]
fn ucmatose_connects_transfers_and_disconnects() {
    let (s, c) = pair(
        "ucmatose",
        PS_TCP,
        17302,
        ("ucmatose", &["-p", "17302", "-C", "20"]),
        ("ucmatose", &["-s", "127.0.0.1", "-p", "17302", "-C", "20"]),
    );
    for out in [&s, &c] {
        assert!(out.contains("data transfers complete"), "{out}");
        assert!(out.contains("return status 0"), "{out}");
    }
    assert!(s.contains("disconnected"), "{s}");
}

#[test]
fn udaddy_resolves_the_peer_through_sidr_and_exchanges_datagrams() {
    // udaddy's port is fixed (7174); the private port space keeps it ours.
    let (s, c) = pair(
        "udaddy",
        PS_UDP,
        7174,
        ("udaddy", &["-C", "20"]),
        ("udaddy", &["-s", "127.0.0.1", "-C", "20"]),
    );
    for out in [&s, &c] {
        assert!(out.contains("data transfers complete"), "{out}");
        assert!(out.contains("return status 0"), "{out}");
    }
}

#[test]
fn rdma_server_and_rdma_client_use_synchronous_ids() {
    let (s, c) = pair(
        "rdma_server",
        PS_TCP,
        17303,
        ("rdma_server", &["-p", "17303"]),
        ("rdma_client", &["-s", "127.0.0.1", "-p", "17303"]),
    );
    assert!(s.contains("rdma_server: end 0"), "{s}");
    assert!(c.contains("rdma_client: end 0"), "{c}");
}

/// Wait until a TCP socket listens on `port` (from `/proc/net/tcp{,6}`).
fn wait_tcp_listen(port: u16, server: &mut Child) {
    let needle = format!(":{port:04X} ");
    let start = Instant::now();
    loop {
        let listening = ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
            std::fs::read_to_string(f).is_ok_and(|t| {
                t.lines().any(|l| {
                    let cols: Vec<&str> = l.split_whitespace().collect();
                    cols.len() > 3 && format!("{} ", cols[1]).ends_with(&needle) && cols[3] == "0A"
                })
            })
        });
        if listening {
            return;
        }
        if let Some(st) = server.try_wait().unwrap() {
            panic!("the server exited ({st}) before listening on {port}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "nothing listens on {port}"
        );
        sleep(Duration::from_millis(10));
    }
}

/// qperf's server runs until killed: the client must finish; the server must still be
/// alive then (it served the test without failing).
fn qperf(test: &str, port: u16) -> String {
    available("qperf");
    let space = PortSpace::new(test);
    let p = port.to_string();
    let mut s = tool("qperf", &["-lp", &p], &space.0)
        .spawn()
        .expect("spawn qperf");
    wait_tcp_listen(port, &mut s);
    let c = tool(
        "qperf",
        &["-lp", &p, "127.0.0.1", "-t", "1", "-cm1", test],
        &space.0,
    )
    .spawn()
    .expect("spawn qperf client");
    let (crc, cout) = finish(c, Duration::from_secs(30));
    let alive = s.try_wait().unwrap().is_none();
    let (_, sout) = finish(s, Duration::ZERO);
    assert_eq!(crc, Some(0), "qperf {test}:\n{cout}\nserver:\n{sout}");
    assert!(alive, "the qperf server died:\n{sout}");
    cout
}

#[test]
fn qperf_rc_lat_over_rdma_cm() {
    let out = qperf("rc_lat", 19871);
    let us: f64 = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("latency  =  "))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no latency in:\n{out}"));
    assert!(us > 0.0, "{out}");
}

#[test]
fn qperf_rc_bw_over_rdma_cm() {
    let out = qperf("rc_bw", 19872);
    assert!(
        out.lines().any(|l| l.trim().starts_with("bw  =  ")),
        "no bandwidth in:\n{out}"
    );
}

/// libfabric's verbs provider: `FI_EP_MSG` connects through rdma_cm, `FI_EP_DGRAM`
/// resolves its peer through it (its event queue is an rdma_cm event channel).
fn fi_pingpong(ep: &str, port: u16) {
    available("fi_pingpong");
    let space = PortSpace::new(&format!("fi-{ep}"));
    let p = port.to_string();
    let args = ["-p", "verbs", "-e", ep, "-I", "10", "-S", "64"];
    let mut sargs = args.to_vec();
    sargs.extend(["-B", &p]);
    let mut s = tool("fi_pingpong", &sargs, &space.0)
        .spawn()
        .expect("spawn server");
    wait_tcp_listen(port, &mut s);
    let mut cargs = args.to_vec();
    cargs.extend(["-P", &p, "127.0.0.1"]);
    let c = tool("fi_pingpong", &cargs, &space.0)
        .spawn()
        .expect("spawn client");
    let (crc, cout) = finish(c, Duration::from_secs(30));
    let (src, sout) = finish(s, Duration::from_secs(10));
    assert_eq!(crc, Some(0), "client:\n{cout}\nserver:\n{sout}");
    assert_eq!(src, Some(0), "server:\n{sout}\nclient:\n{cout}");
    for out in [&cout, &sout] {
        // bytes #sent #ack: 10 sent, all 10 acknowledged.
        assert!(
            out.lines()
                .any(|l| l.split_whitespace().take(3).eq(["64", "10", "=10"])),
            "{out}"
        );
    }
}

#[test]
fn fi_pingpong_verbs_msg_endpoints() {
    fi_pingpong("msg", 17411);
}

#[test]
fn fi_pingpong_verbs_dgram_endpoints() {
    fi_pingpong("dgram", 17412);
}
