//! The verbs contract lets several threads post on one QP: four threads post 250 signaled
//! SENDs each on one RC QP through our provider (locks on), the main thread polls, and every
//! WR must complete exactly once (by wr_id) and arrive once at the peer QP
//! (`tests/c/four_threads.c`, compiled against the installed libibverbs).

mod common;
use common::{Side, opened, preload_env};

#[test]
fn four_threads_post_on_one_qp_and_every_wr_completes_once() {
    let dir = std::env::temp_dir().join(format!("mlx5rs-threads-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("four_threads");
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/four_threads.c");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = std::process::Command::new(&cc)
        .args(["-O1", "-o"])
        .arg(&exe)
        .arg(src)
        .args(["-libverbs", "-lpthread"])
        .output()
        .unwrap_or_else(|e| panic!("{cc}: {e} (install gcc and libibverbs-dev)"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = std::process::Command::new(&exe)
        .envs(preload_env(Side::Ours))
        .env("MLX5_EMU_FABRIC", "inprocess")
        .env_remove("MLX5_SINGLE_THREADED")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr),
    );
    assert!(run.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("ok 1000"), "{stdout}\n{stderr}");
    assert_eq!(opened(&stderr), 1, "{stderr}");
    assert!(stderr.contains("locks on"), "{stderr}");
}
