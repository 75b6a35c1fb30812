//! Open MPI (unmodified, `pml ucx`) over UCX's `rc_verbs` transport (`UCX_TLS=rc_v`) on our
//! provider: `c/mpi_pingpong.c` ping-pongs 8 B .. 64 KiB between two ranks, each byte checked
//! both ways; both ranks must print the `MLX5RS_LOG` line (ours served them) and rank 0 `ok`.
//! UCX's `rc_mlx5` (its own WQEs through mlx5dv) is not asked for: it stays on libmlx5.

mod common;
use common::{Side, device, opened, preload_env};
use std::io::Read as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn have(p: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {p}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn open_mpi_pingpong_over_ucx_rc_verbs_on_ours_checks_its_data() {
    for p in ["mpicc", "mpirun"] {
        assert!(
            have(p),
            "{p} is not installed: install Debian's openmpi-bin and libopenmpi-dev (tools/test.sh does)"
        );
    }
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/mpi_pingpong.c");
    let exe = std::env::temp_dir().join(format!("mlx5rs-mpi-pingpong-{}", std::process::id()));
    let out = Command::new("mpicc")
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("run mpicc");
    assert!(
        out.status.success(),
        "mpicc failed\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let env = preload_env(Side::Ours);
    let mut cmd = Command::new("mpirun");
    // mpirun carries the preloads too (it opens no device); -x hands them to the ranks.
    cmd.envs(env.iter().cloned())
        .args(["--allow-run-as-root", "--oversubscribe", "-np", "2"])
        .args(["--mca", "pml", "ucx"]);
    for (k, v) in env.iter().cloned().chain([
        ("UCX_TLS".to_string(), "rc_v".to_string()),
        ("UCX_NET_DEVICES".to_string(), format!("{}:1", device())),
    ]) {
        cmd.arg("-x").arg(format!("{k}={v}"));
    }
    let mut child = cmd
        .arg(&exe)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mpirun");
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break Some(s);
        }
        if start.elapsed() > Duration::from_secs(180) {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (mut o, mut e) = (String::new(), String::new());
    let _ = child.stdout.take().map(|mut s| s.read_to_string(&mut o));
    let _ = child.stderr.take().map(|mut s| s.read_to_string(&mut e));
    let _ = std::fs::remove_file(&exe);
    assert!(
        status.is_some_and(|s| s.success()) && o.lines().any(|l| l == "ok"),
        "mpirun failed ({status:?})\n{o}\n{e}"
    );
    // One line per rank (mpirun gathers the ranks' stderr).
    assert_eq!(opened(&e), 2, "both ranks on ours:\n{e}");
}
