//! The kernel-boundary vocabulary shared with the driver (contract: `mlx5_ffi::surface`).
pub use mlx5_ffi::surface::{Errno, UverbsSurface};
