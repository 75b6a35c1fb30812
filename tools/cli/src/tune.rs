//! `mlx5 tune`.

/// `mlx5 tune`.
///
/// # Errors
/// Not yet.
pub fn command(_a: &crate::cli::TuneArgs) -> Result<(), String> {
    Err("tune: not built yet".into())
}
