//! UCX's verbs transports on our provider: `ucx_perftest` tag_lat, ucp_put_lat, ucp_get and
//! tag_bw with `UCX_TLS=rc_v` and `ud_v` (plus `self`), both processes on ours. UCX's
//! `rc_mlx5`/`ud_mlx5` write their own WQEs through mlx5dv and stay on libmlx5
//! (docs/provider.md). UCX's mmap hooks stay on (the emulator's syscall trap serves mmap of
//! the device's descriptors, docs/emulator-preload.md).

mod common;
use common::{Side, opened, preload_env};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn ucx(tls: &str, test: &str) -> Result<(), String> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let env = |c: &mut Command| {
        c.envs(preload_env(Side::Ours))
            .env("UCX_TLS", format!("{tls},self"))
            .env("UCX_NET_DEVICES", format!("{}:1", common::device()))
            .stdin(Stdio::null());
    };
    let mut s = Command::new("timeout");
    s.args(["60", "ucx_perftest", "-p", &port, "-t", test, "-n", "100"]);
    env(&mut s);
    let server = s
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let start = Instant::now();
    let listening = || {
        let want = format!(":{:04X} ", port.parse::<u16>().unwrap());
        ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
            std::fs::read_to_string(f)
                .unwrap_or_default()
                .lines()
                .any(|l| l.contains(&want) && l.split_whitespace().nth(3) == Some("0A"))
        })
    };
    while !listening() && start.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut c = Command::new("timeout");
    c.args([
        "60",
        "ucx_perftest",
        "-p",
        &port,
        "-t",
        test,
        "-n",
        "100",
        "localhost",
    ]);
    env(&mut c);
    let client = c.output().map_err(|e| e.to_string())?;
    let server = server.wait_with_output().map_err(|e| e.to_string())?;
    let (co, ce, se) = (
        String::from_utf8_lossy(&client.stdout),
        String::from_utf8_lossy(&client.stderr),
        String::from_utf8_lossy(&server.stderr),
    );
    if client.status.success() && server.status.success() && opened(&ce) >= 1 && opened(&se) >= 1 {
        Ok(())
    } else {
        Err(format!(
            "{tls} {test}: client {} server {}\n{co}\n{ce}\n--- server\n{se}",
            client.status, server.status
        ))
    }
}

#[test]
fn ucx_perftest_over_rc_verbs_and_ud_verbs_on_ours() {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut failures = Vec::new();
    for tls in ["rc_v", "ud_v"] {
        for test in ["tag_lat", "ucp_put_lat", "ucp_get", "tag_bw"] {
            if let Err(e) = ucx(tls, test) {
                failures.push(e);
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
