//! Compile-fail tests: misuse that the types make impossible (`tests/ui/*.rs`, each with the
//! compiler's `.stderr`). Regenerate the expected output with `TRYBUILD=overwrite`.

#[test]
fn ui() {
    trybuild::TestCases::new().compile_fail("tests/ui/*.rs");
}
