//! The provider rows (`src/provider.rs`): one quick measurement of each provider through the
//! plain-verbs harness. Asserts that every figure exists and is positive, that each run was
//! served by the provider it is labelled with (`run_served` checks the `MLX5RS_LOG` line),
//! and nothing about speed.

use mlx5_bench::callgrind::valgrind_version;
use mlx5_bench::provider::{PROVIDER_OPS, ProviderRow, run_scratch, table};

fn positive(v: Option<f64>, what: &str) {
    let v = v.unwrap_or_else(|| panic!("{what}: not measured"));
    assert!(v > 0.0 && v.is_finite(), "{what}: {v}");
}

#[test]
fn provider_rows_are_measured_on_both_providers() {
    let vg = valgrind_version().is_some();
    let (rows, notes, ok) = run_scratch(mlx5_bench::QUICK_CALLS, mlx5_bench::QUICK_CALLS, vg);
    assert!(ok, "provider rows failed: {notes:?}");
    assert_eq!(rows.len(), PROVIDER_OPS.len());
    for (spec, r) in PROVIDER_OPS.iter().zip(&rows) {
        let ProviderRow {
            ours,
            ours_st,
            theirs,
            theirs_st,
            ours_st_ns,
            theirs_st_ns,
        } = *r;
        // Timed figures can round to 0 on a fast machine; they must exist.
        assert!(
            ours_st_ns.is_some() && theirs_st_ns.is_some(),
            "{}",
            spec.op
        );
        if vg {
            for (v, w) in [
                (ours, "ours"),
                (ours_st, "ours ST"),
                (theirs, "libmlx5"),
                (theirs_st, "libmlx5 ST"),
            ] {
                positive(v, &format!("{} {w}", spec.op));
            }
        }
    }
    let t = table(&rows, &notes);
    assert!(t.matches("libmlx5rs").count() >= PROVIDER_OPS.len(), "{t}");
}
