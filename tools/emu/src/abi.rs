//! The kernel-boundary vocabulary shared with the driver (contract: `mlx5_ffi::surface`), and
//! the one question the emulated kernel asks of the real one: the caller's capabilities.
pub use mlx5_ffi::surface::{Errno, UverbsSurface};

/// Whether this process holds capability `cap` in its effective set (`CapEff` of
/// `/proc/thread-self/status`: capabilities are per thread), as
/// `capable(cap)` asks for the caller in the kernel.
pub(crate) fn has_cap(cap: u32) -> bool {
    let Ok(s) = std::fs::read_to_string("/proc/thread-self/status") else {
        return false;
    };
    s.lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|bits| bits & (1 << cap) != 0)
}
