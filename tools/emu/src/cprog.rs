//! C programs against rdma-core on the emulator: for tools that run libibverbs/libmlx5 code
//! next to ours (the WQE comparison, the CPU-cost benchmark). The programs reach the emulator
//! through the `LD_PRELOAD` shim (crate `mlx5-emu-preload`), which is found here, not linked:
//! linking it would interpose libc calls in the tool itself.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Compile the C file `source` into `exe` with the compiler `cc` and the extra `flags`
/// (before the sources), linked against libibverbs and libmlx5.
///
/// # Errors
/// A message naming the Debian package `libibverbs-dev` when the verbs headers or libraries
/// are missing, a message when `cc` cannot be run, or the compiler's output.
pub fn compile_verbs_program(
    cc: &str,
    flags: &[&str],
    source: &Path,
    exe: &Path,
) -> Result<(), String> {
    let out = Command::new(cc)
        .args(flags)
        .arg("-o")
        .arg(exe)
        .arg(source)
        .args(["-libverbs", "-lmlx5"])
        .output()
        .map_err(|e| format!("cannot run the C compiler `{cc}`: {e} (install gcc or set CC)"))?;
    if out.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    if err.contains("infiniband/") || err.contains("-libverbs") || err.contains("-lmlx5") {
        return Err(format!(
            "the libibverbs development files are missing: install the package \
             `libibverbs-dev` (rdma-core; it brings infiniband/verbs.h, mlx5dv.h, \
             libibverbs.so and libmlx5.so)\n{err}"
        ));
    }
    Err(format!("compiling {} failed:\n{err}", source.display()))
}

/// The shim's shared object: `$MLX5_EMU_PRELOAD_SO`, or `libmlx5_emu_preload.so` that cargo
/// built into the target directory the running executable lives in (its directory, `deps/`,
/// or up to two parents).
///
/// # Errors
/// Where it looked.
pub fn preload_so() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("MLX5_EMU_PRELOAD_SO") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let name = "libmlx5_emu_preload.so";
    let mut tried = Vec::new();
    for dir in exe.ancestors().skip(1).take(3) {
        // `deps/` first: `cargo test` refreshes it on every build, while the copy a `cargo build`
        // put beside it can be older than the sources.
        for p in [dir.join("deps").join(name), dir.join(name)] {
            if p.exists() {
                return Ok(p);
            }
            tried.push(p.display().to_string());
        }
    }
    Err(format!(
        "{name} not found (looked at {}); build it with `cargo build --release -p \
         mlx5-emu-preload` or set MLX5_EMU_PRELOAD_SO",
        tried.join(", ")
    ))
}
