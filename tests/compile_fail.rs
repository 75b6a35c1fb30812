//! Compile-fail tests: what safe code must not be able to write.
//!
//! Every `tests/ui/*.rs` is a small program that must be rejected by the compiler with the
//! error recorded beside it in `tests/ui/*.stderr`. Each helper's cases are named
//! `tests/ui/<area>_*.rs`. To (re)generate an expected `.stderr` after a deliberate change, run
//! `TRYBUILD=overwrite cargo test --release -p mlx5 --test compile_fail` and review the diff.
//!
//! trybuild builds the cases in its own target directory (`target/tests/trybuild`), so the
//! first run compiles the driver's dependency tree once more; keep the number of cases modest.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
