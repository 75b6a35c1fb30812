//! "Their" side: the C harness (`harness.c`) built against libibverbs/libmlx5 and run under
//! the preload with the emulator's WQE log enabled.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mlx5_emu::WqeRecord;

use crate::driver::{NODE, SideRun};
use crate::{Knobs, SideInfo};

/// The harness source, next to this crate's manifest.
pub fn source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("harness.c")
}

/// Compile the harness into `out_dir` with the system C compiler (`cc`, or `$CC`).
///
/// # Errors
/// A message naming the missing package when the libibverbs development files are absent
/// (`libibverbs-dev`: `infiniband/verbs.h`, `libibverbs.so`; libmlx5's `mlx5dv.h` comes
/// with it), or the compiler's output.
pub fn build(out_dir: &Path) -> Result<PathBuf, String> {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    build_with(&cc, out_dir)
}

/// [`build`] with the compiler `cc`.
///
/// # Errors
/// As [`build`].
pub fn build_with(cc: &str, out_dir: &Path) -> Result<PathBuf, String> {
    let exe = out_dir.join("wqe-harness");
    let flags = ["-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror"];
    mlx5_emu::cprog::compile_verbs_program(cc, &flags, &source(), &exe)?;
    Ok(exe)
}

/// The preload shared object (see [`mlx5_emu::cprog::preload_so`]).
///
/// # Errors
/// Where it looked.
pub fn preload_so() -> Result<PathBuf, String> {
    mlx5_emu::cprog::preload_so()
}

/// Run the harness on `corpus_file` under the preload with `knobs`; the emulator writes its
/// WQE log to `log`. Returns the harness's report and the parsed log.
///
/// Environment of the run: every `MLX5_*` variable of ours removed, then
/// `MLX5_EMU_FABRIC=inprocess`, `MLX5_EMU_NODE=`[`NODE`], `MLX5_EMU_HCAS=1`,
/// `MLX5_EMU_WQE_LOG=<log>`, `MLX5_EMU_BF_REG_SIZE`, `MLX5_EMU_DYN_UAR`, and for libmlx5
/// `MLX5_SCATTER_TO_CQE=0` (and the `mlx5` crate's QPs are created with `scatter_to_cqe = false`,
/// so both sides run without it; it changes CQEs, not WQEs), `MLX5_NUM_LOW_LAT_UUARS`,
/// `MLX5_POST_SEND_PREFER_BF=0` unless
/// `knobs.prefer_bf`, `MLX5_SHUT_UP_BF=1` if `knobs.shut_up_bf`, `MLX5_EMU_LINK_LAYER=eth`
/// if `knobs.roce`.
///
/// # Errors
/// Start failure, timeout, non-zero exit (with its output), or a malformed log.
pub fn run(
    exe: &Path,
    corpus_file: &Path,
    log: &Path,
    knobs: &Knobs,
    limit: Duration,
) -> Result<SideRun, String> {
    let so = preload_so()?;
    let _ = std::fs::remove_file(log);
    let mut cmd = Command::new(exe);
    cmd.arg(corpus_file)
        .arg(if knobs.wr_api { "wr" } else { "post" });
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("MLX5_") {
            cmd.env_remove(&k);
        }
    }
    cmd.env_remove("SYSFS_PATH")
        .env("LD_PRELOAD", &so)
        .env("MLX5_EMU_FABRIC", "inprocess")
        .env("MLX5_EMU_NODE", NODE.to_string())
        .env("MLX5_EMU_HCAS", "1")
        .env("MLX5_EMU_WQE_LOG", log)
        .env("MLX5_EMU_BF_REG_SIZE", knobs.bf_reg_size.to_string())
        .env("MLX5_EMU_DYN_UAR", if knobs.dyn_uar { "1" } else { "0" })
        .env("MLX5_SCATTER_TO_CQE", "0")
        .env(
            "MLX5_NUM_LOW_LAT_UUARS",
            knobs.low_latency_bfregs.to_string(),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if !knobs.prefer_bf {
        cmd.env("MLX5_POST_SEND_PREFER_BF", "0");
    }
    if knobs.shut_up_bf {
        cmd.env("MLX5_SHUT_UP_BF", "1");
    }
    if knobs.roce {
        cmd.env("MLX5_EMU_LINK_LAYER", "eth");
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let out = std::thread::spawn(move || stdout.map(std::io::read_to_string));
    let err = std::thread::spawn(move || stderr.map(std::io::read_to_string));
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().map_err(|e| e.to_string())? {
            break Some(s);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout = out
        .join()
        .ok()
        .flatten()
        .and_then(Result::ok)
        .unwrap_or_default();
    let stderr = err
        .join()
        .ok()
        .flatten()
        .and_then(Result::ok)
        .unwrap_or_default();
    let ctx = || format!("\n--- harness stdout:\n{stdout}\n--- stderr:\n{stderr}");
    match status {
        None => return Err(format!("harness did not finish in {limit:?}{}", ctx())),
        Some(s) if !s.success() => return Err(format!("harness failed ({s}){}", ctx())),
        Some(_) => {}
    }
    let info = SideInfo::parse(&stdout).map_err(|e| format!("{e}{}", ctx()))?;
    let text = std::fs::read_to_string(log).map_err(|e| {
        format!(
            "no WQE log at {} ({e}): does the preload honour MLX5_EMU_WQE_LOG?{}",
            log.display(),
            ctx()
        )
    })?;
    let records = WqeRecord::parse_log(&text)?;
    Ok(SideRun { info, records })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A "compiler" that fails like gcc does without the libibverbs headers.
    fn fake_cc(dir: &Path, stderr: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join("fake-cc");
        let script = format!("#!/bin/sh\necho '{stderr}' >&2\nexit 1\n");
        std::fs::write(&p, script).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    #[test]
    fn missing_verbs_headers_name_the_package() {
        let dir = std::env::temp_dir().join(format!("wqe-compare-cc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing =
            "harness.c:22:10: fatal error: infiniband/mlx5dv.h: No such file or directory";
        let cc = fake_cc(&dir, missing);
        let e = build_with(cc.to_str().unwrap(), &dir).unwrap_err();
        assert!(e.contains("libibverbs-dev"), "{e}");
        let other = fake_cc(&dir, "harness.c:1:1: error: expected expression");
        let e = build_with(other.to_str().unwrap(), &dir).unwrap_err();
        assert!(
            !e.contains("libibverbs-dev") && e.contains("expected expression"),
            "{e}"
        );
        let e = build_with("/nonexistent/cc", &dir).unwrap_err();
        assert!(e.contains("cannot run the C compiler"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
