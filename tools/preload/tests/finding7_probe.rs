//! Finding 7 of issue 20, re-checked through libmlx5 (`c/finding7_probe.c`): with
//! `MLX5_SRQ_ALLOC_TYPE`/`MLX5_CQ_ALLOC_TYPE`/`MLX5_QP_ALLOC_TYPE=PREFER_HUGE` and no huge
//! page free, libmlx5 falls back to ordinary memory and the emulated kernel creates the SRQ,
//! CQ and QP (it was said to answer CREATE_SRQ with EINVAL); `mlx5dv_create_qp` asking for
//! the MKEY configure or UMR send operations succeeds, as on mlx5_ib, which creates the QP
//! without looking at them; a flag libmlx5 44 does not know it refuses itself (`EOPNOTSUPP`).

use std::path::PathBuf;
use std::process::Command;

#[test]
fn prefer_huge_queues_and_umr_send_ops_are_created_as_mlx5_ib_creates_them() {
    let free_huge = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("HugePages_Free:"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0);
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/c/finding7_probe.c");
    let exe = std::env::temp_dir().join(format!("mlx5-finding7-probe-{}", std::process::id()));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    mlx5_emu::cprog::compile_verbs_program(&cc, &["-O1", "-Wall", "-Werror"], &src, &exe)
        .unwrap_or_else(|e| panic!("{e}"));
    let mut cmd = Command::new(&exe);
    cmd.env(
        "LD_PRELOAD",
        mlx5_emu::cprog::preload_so().unwrap_or_else(|e| panic!("{e}")),
    )
    .env_remove("SYSFS_PATH");
    for (k, _) in std::env::vars() {
        if k.starts_with("MLX5_") {
            cmd.env_remove(&k);
        }
    }
    cmd.env("MLX5_EMU_FABRIC", "inprocess");
    for q in ["SRQ", "CQ", "QP"] {
        cmd.env(format!("MLX5_{q}_ALLOC_TYPE"), "PREFER_HUGE");
    }
    let out = cmd.output().expect("run the program");
    let _ = std::fs::remove_file(&exe);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let report = format!(
        "{stdout}\n{}\n(huge pages free: {free_huge})",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{report}");
    for (key, errno) in [
        ("pd", 0),
        ("srq", 0),
        ("cq", 0),
        ("qp", 0),
        ("mkey_configure_qp", 0),
        ("mr_interleaved_qp", 0),
        ("mr_list_qp", 0),
        // Probing programs skip on EOPNOTSUPP: a send-ops flag libmlx5 does not know.
        ("unknown_ops_qp", libc::EOPNOTSUPP),
    ] {
        let line = format!("{key} {errno}");
        assert!(
            stdout.lines().any(|l| l == line),
            "`{line}` missing (errno after the name)\n{report}"
        );
    }
}
