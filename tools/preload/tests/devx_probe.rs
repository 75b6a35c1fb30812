//! DEVX through libmlx5's own `mlx5dv_devx_*` calls (`c/devx_probe.c`), as rdma-core's users
//! probe it: the capability pages QUERY_HCA_CAP answers, a general command the emulated
//! firmware does not implement (EREMOTEIO with "bad opcode" in the mailbox), a umem, the
//! BlueFlame DEVX UAR (libmlx5's legacy dynamic UAR: mmap `ALLOC_WC` and DEVX_QUERY_UAR) and
//! the NC one (refused by libmlx5 itself on a static-bfreg context, EOPNOTSUPP, as on a real
//! one), an event channel. Before `kernel/devx.rs`, QUERY_HCA_CAP answered EOPNOTSUPP, the
//! BlueFlame UAR EINVAL and the event channel EPROTONOSUPPORT.

use std::path::PathBuf;
use std::process::Command;

#[test]
fn libmlx5_devx_calls_get_what_mlx5_ib_and_the_firmware_answer() {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/c/devx_probe.c");
    let exe = std::env::temp_dir().join(format!("mlx5-devx-probe-{}", std::process::id()));
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
    let out = cmd.output().expect("run the program");
    let _ = std::fs::remove_file(&exe);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let report = format!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{report}");
    for line in [
        "general_rc 0",
        "log_max_msg 30",
        "atomic 1",
        "dct 1",
        "atomic_rc 0",
        "atomic_operations 15",
        "atomic_size_qp 12",
        // EREMOTEIO, firmware status 2 (bad opcode).
        "query_lag 121 errno 121 status 2",
        "umem 0 id_nonzero 1",
        "umem_dereg 0",
        "uar_bf 0 page_id_nonzero 1",
        // EOPNOTSUPP from libmlx5 (no singleton NC UAR on a static-bfreg context).
        "uar_nc 95",
        "event_channel 0 fd_valid 1",
    ] {
        assert!(
            stdout.lines().any(|l| l == line),
            "missing `{line}`\n{report}"
        );
    }
}
