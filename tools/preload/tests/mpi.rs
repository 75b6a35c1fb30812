//! Open MPI (Debian's `openmpi-bin`, unmodified) over UCX (`pml ucx`, UCX's default
//! transports: on one node shared memory and `rc_mlx5` on the emulated HCA side by side) runs
//! `c/mpi_check.c` on 2 and 4 ranks: ping-pong of 8 B .. 256 KiB with every byte checked, an
//! `MPI_Allreduce` checked against its closed form, `MPI_Put`/`MPI_Get` between fences;
//! ten runs in a row, alternating 2 and 4 ranks, all must pass.
//!
//! Before the syscall trap and the kernel's sysfs layout (`docs/emulator-preload.md`), "PML
//! ucx cannot be selected"; before the device executed an inline segment followed by
//! pointers, UCX's UD connection request arrived truncated and a rank aborted.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::{have, one_at_a_time, run, tool};

#[test]
fn open_mpi_over_ucx_checks_every_byte_ten_runs_in_a_row() {
    for p in ["mpicc", "mpirun"] {
        assert!(
            have(p),
            "{p} is not installed: install Debian's openmpi-bin and libopenmpi-dev (tools/test.sh does)"
        );
    }
    let _one = one_at_a_time();
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/c/mpi_check.c");
    let exe = std::env::temp_dir().join(format!("mlx5-mpi-check-{}", std::process::id()));
    let out = std::process::Command::new("mpicc")
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
    let so = mlx5_emu::cprog::preload_so().unwrap_or_else(|e| panic!("{e}"));
    for run_no in 0..10 {
        let np = if run_no % 2 == 0 { 2 } else { 4 };
        let mut cmd = tool("mpirun", &[]);
        // mpirun itself carries the shim too (it opens no device: nothing is emulated there);
        // -x hands it to the ranks explicitly.
        cmd.args([
            "--allow-run-as-root",
            "--oversubscribe",
            "-np",
            &np.to_string(),
        ])
        .args(["--mca", "pml", "ucx"])
        .arg("-x")
        .arg(format!("LD_PRELOAD={}", so.display()))
        .arg(&exe);
        let (status, out, err) = run(cmd, &format!("mpi-{run_no}"), Duration::from_secs(120));
        assert!(
            status.is_some_and(|s| s.success()) && out.contains(&format!("ok ranks {np}\n")),
            "run {run_no} (-np {np}) failed ({status:?})\n{out}\n{err}"
        );
    }
    let _ = std::fs::remove_file(&exe);
}
