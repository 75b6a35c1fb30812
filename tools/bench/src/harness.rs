//! The libmlx5 side: the C harness (`harness.c`), built against libibverbs/libmlx5 and run
//! under the `LD_PRELOAD` front door of the emulator.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The harness source, next to this crate's manifest.
pub fn source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("harness.c")
}

/// Compile the harness into `out_dir` with `$CC` (default `cc`), optimised, with symbols
/// (callgrind needs the wrapper names) and without identical-code folding (the wrappers of
/// different operations must stay different functions).
///
/// # Errors
/// A message naming `libibverbs-dev` when the verbs headers or libraries are missing, or the
/// compiler's output.
pub fn build(out_dir: &Path) -> Result<PathBuf, String> {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let exe = out_dir.join("bench-harness");
    let flags = [
        "-std=gnu11",
        "-O2",
        "-g",
        "-fno-ipa-icf",
        "-Wall",
        "-Wextra",
        "-Werror",
    ];
    mlx5_emu::cprog::compile_verbs_program(&cc, &flags, &source(), &exe)?;
    Ok(exe)
}

/// The preload's shared object (see [`mlx5_emu::cprog::preload_so`]).
///
/// # Errors
/// Where it looked.
pub fn preload_so() -> Result<PathBuf, String> {
    mlx5_emu::cprog::preload_so()
}

/// The command that runs the harness (`exe`, `calls` per operation) on the emulator, behind
/// `prefix` (e.g. valgrind and its options; empty for a plain run).
///
/// Environment: every `MLX5_*` variable removed, then `LD_PRELOAD=<so>`,
/// `MLX5_EMU_FABRIC=inprocess`, `MLX5_EMU_HCAS=1`, and for libmlx5
/// `MLX5_SCATTER_TO_CQE=0` (our side creates its QP with `scatter_to_cqe = false`) and
/// `MLX5_POST_SEND_PREFER_BF=0` (BlueFlame for single inline WQEs only, as
/// [`mlx5::BfPolicy::InlineOnly`] on our side), and `MLX5_EMU_WAKE=poll` (the polling
/// device: with the waking one the first doorbell of every timed batch would pay a fault).
pub fn command(exe: &Path, so: &Path, calls: usize, prefix: &[String]) -> Command {
    let mut cmd = match prefix.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(exe);
            c
        }
        None => Command::new(exe),
    };
    cmd.arg(calls.to_string());
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("MLX5_") {
            cmd.env_remove(&k);
        }
    }
    cmd.env_remove("SYSFS_PATH")
        .env("LD_PRELOAD", so)
        .env("MLX5_EMU_FABRIC", "inprocess")
        .env("MLX5_EMU_HCAS", "1")
        .env("MLX5_SCATTER_TO_CQE", "0")
        .env("MLX5_POST_SEND_PREFER_BF", "0")
        .env("MLX5_EMU_WAKE", "poll")
        .stdin(Stdio::null());
    cmd
}

/// Run `cmd` to completion and return its stdout.
///
/// # Errors
/// Start failure or non-zero exit, with the output.
pub fn run(mut cmd: Command, what: &str) -> Result<String, String> {
    let out = cmd
        .output()
        .map_err(|e| format!("cannot start {what}: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(30).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        return Err(format!(
            "{what} failed ({}):\n--- stdout:\n{stdout}\n--- stderr (tail):\n{}",
            out.status,
            tail.join("\n")
        ));
    }
    Ok(stdout)
}
