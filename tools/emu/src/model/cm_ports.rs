//! The host's rdma_cm port space, shared by every process on the emulator.
//!
//! On one host every rdma_cm id of every process binds in the same kernel, so two
//! listeners cannot share a port (`EADDRINUSE`) and a connect to `127.0.0.1` reaches
//! whichever process listens there. Here each process has its own emulated kernel, so the
//! claims live in a directory all of them see: one file per claimed (port space, port),
//! created exclusively, holding the fabric node (LID) of the claiming HCA and the claiming
//! process. A file whose process is gone is stale and taken over. The directory is
//! `MLX5_EMU_CM_DIR`, or `mlx5-emu-rdma-cm` in the temporary directory.

use std::io::Write as _;
use std::path::PathBuf;

use crate::abi::Errno;

/// A claimed port; dropping it gives the port back.
#[derive(Debug)]
pub(crate) struct PortClaim {
    path: PathBuf,
}

impl Drop for PortClaim {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn dir() -> PathBuf {
    match std::env::var_os("MLX5_EMU_CM_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => std::env::temp_dir().join("mlx5-emu-rdma-cm"),
    }
}

fn file(ps: u16, port: u16) -> PathBuf {
    dir().join(format!("ps{ps:04x}-port{port}"))
}

/// (lid, pid) of a live claim file's owner.
fn read_claim(path: &std::path::Path) -> Option<(u16, u32)> {
    let s = std::fs::read_to_string(path).ok()?;
    let mut it = s.split_whitespace();
    let lid = it.next()?.parse().ok()?;
    let pid: u32 = it.next()?.parse().ok()?;
    Some((lid, pid))
}

fn alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Claim (`ps`, `port`) for the HCA at fabric node `lid`: `EADDRINUSE` if a live claim
/// exists (in this process or another).
pub(crate) fn claim(ps: u16, port: u16, lid: u16) -> Result<PortClaim, Errno> {
    let d = dir();
    let _ = std::fs::create_dir_all(&d);
    let path = file(ps, port);
    for _ in 0..4 {
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(mut f) => {
                let _ = writeln!(f, "{lid} {}", std::process::id());
                return Ok(PortClaim { path });
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => match read_claim(&path) {
                Some((_, pid)) if alive(pid) => return Err(Errno(libc::EADDRINUSE)),
                // Stale (its process is gone) or half written: take it over.
                Some(_) => {
                    let _ = std::fs::remove_file(&path);
                }
                None => std::thread::sleep(std::time::Duration::from_millis(1)),
            },
            // No usable directory: the port space is this process's alone.
            Err(_) => {
                return Ok(PortClaim {
                    path: PathBuf::new(),
                });
            }
        }
    }
    Err(Errno(libc::EADDRINUSE))
}

/// The fabric node of the live claim of (`ps`, `port`), if any.
pub(crate) fn lookup(ps: u16, port: u16) -> Option<u16> {
    let (lid, pid) = read_claim(&file(ps, port))?;
    alive(pid).then_some(lid)
}
