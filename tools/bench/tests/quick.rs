//! Runs the benchmark binary in its quick mode and checks the shape of its output: every
//! row present, every figure positive. (Benchmarks print numbers; this test asserts no speed.)

use std::process::Command;

use mlx5_bench::callgrind::valgrind_version;
use mlx5_bench::ops::OPS;
use mlx5_bench::{QUICK_CALLS, harness, ours};
use mlx5_emu::{WqeRecord, WqeVia};

fn bench(args: &[&str], envs: &[(&str, &str)]) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mlx5-bench"));
    cmd.args(args);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run mlx5-bench");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "mlx5-bench {args:?} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The numeric cells of the table row whose first three cells are `label`, `ours`, `theirs`.
fn row_cells(table: &str, label: &str, ours: &str, theirs: &str) -> Vec<String> {
    let row = table
        .lines()
        .map(|l| l.split('|').map(str::trim).collect::<Vec<_>>())
        .find(|c| c.len() > 4 && c[1] == label && c[2] == ours && c[3] == theirs)
        .unwrap_or_else(|| panic!("no row {label} / {ours} / {theirs} in:\n{table}"));
    row[4..row.len() - 1]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

fn positive(cell: &str, what: &str) {
    let v: f64 = cell
        .parse()
        .unwrap_or_else(|_| panic!("{what}: {cell:?} is not a number"));
    assert!(v > 0.0 && v.is_finite(), "{what}: {v} is not positive");
}

/// One full quick run: both sides timed and, when valgrind exists, one callgrind
/// measurement of each side.
#[test]
fn quick_run_prints_every_row_with_positive_numbers() {
    let vg = valgrind_version();
    let out = bench(&["--quick"], &[]);
    let columns = [
        "ours instr",
        "libmlx5 instr",
        "instr ratio",
        "libmlx5 ST instr",
        "instr ratio ST",
        "ours ns",
        "libmlx5 ns",
        "ns ratio",
        "ours ticks",
        "libmlx5 ticks",
    ];
    for spec in OPS {
        let cells = row_cells(&out, spec.label, spec.ours, spec.theirs);
        assert_eq!(cells.len(), columns.len(), "{cells:?}");
        for (i, (cell, col)) in cells.iter().zip(columns).enumerate() {
            let what = format!("{} {} {col}", spec.op, spec.api);
            let instr = i < 5;
            let ticks = i >= 8;
            // The unchecked tier has no libmlx5 counterpart: its libmlx5 and ratio cells are empty.
            let theirs = col.contains("libmlx5") || col.contains("ratio");
            if (spec.api == "unchecked" && theirs)
                || (instr && vg.is_none())
                || (ticks && !cfg!(target_arch = "x86_64"))
            {
                assert_eq!(cell, "n/a", "{what}");
            } else {
                positive(cell, &what);
            }
        }
    }
    if vg.is_none() {
        assert!(out.contains("valgrind not found"), "{out}");
    }
    // Our side took BlueFlame for exactly the single inline posts (both APIs, warm-up and
    // measured pass) and 8-byte doorbells for everything else.
    let note = out
        .lines()
        .find(|l| l.starts_with("note: ours:"))
        .unwrap_or_else(|| panic!("no note on our side's doorbells:\n{out}"));
    let field = |k: &str| -> u64 {
        note.split_whitespace()
            .find_map(|kv| kv.strip_prefix(k))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {k} in {note}"))
    };
    // Two inline SEND rows (32 and 64 bytes), three APIs each (verbs, low-level, unchecked),
    // and the unchecked inline WRITE.
    assert_eq!(
        field("bf_copies="),
        7 * (ours::WARMUP + QUICK_CALLS) as u64,
        "{note}"
    );
    assert!(field("doorbells=") > 0, "{note}");
}

/// The C harness on the emulator (no valgrind): every inline WQE reaches the device, and
/// BlueFlame carries inline WQEs only (`MLX5_POST_SEND_PREFER_BF=0`, like our
/// `BfPolicy::InlineOnly`). Back-to-back posts let the device fetch most WQEs through the
/// doorbell record before it sees their BlueFlame copy, so not every inline WQE is recorded
/// as BlueFlame.
#[test]
fn libmlx5_side_uses_blueflame_for_inline_wqes_only() {
    let dir = std::env::temp_dir().join(format!("mlx5-bench-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = harness::build(&dir).expect("build the C harness");
    let so = harness::preload_so().expect("preload shared object");
    let log = dir.join("wqes.log");
    let mut cmd = harness::command(&exe, &so, QUICK_CALLS, &[]);
    cmd.env("MLX5_EMU_WQE_LOG", &log);
    let stdout = harness::run(cmd, "the C harness").unwrap();
    assert!(stdout.contains("result poll_cqe lowlevel"), "{stdout}");
    let records = WqeRecord::parse_log(&std::fs::read_to_string(&log).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    // 64 B inline SEND: ctrl 16 + inline header 4 + 64 bytes -> 6 DS (96 bytes); 32 B: 4 DS
    // (64 bytes, one WQEBB); one-SGE SEND: ctrl + data segment, 2 DS (32 bytes).
    let is_inline = |r: &WqeRecord| r.bytes.len() == 96 || r.bytes.len() == 64;
    let inline = records.iter().filter(|r| is_inline(r)).count();
    assert_eq!(
        inline,
        4 * (ours::WARMUP + QUICK_CALLS),
        "inline WQEs fetched"
    );
    let bf: Vec<&WqeRecord> = records
        .iter()
        .filter(|r| r.via == WqeVia::BlueFlame)
        .collect();
    assert!(!bf.is_empty(), "no BlueFlame doorbell at all");
    assert!(
        bf.iter().all(|r| is_inline(r)),
        "a non-inline WQE came by BlueFlame"
    );
}

/// Without valgrind the tool says so and still prints the timer figures (JSON form).
#[test]
fn without_valgrind_json_has_timer_figures_only() {
    let out = bench(
        &["--quick", "--json"],
        &[("MLX5_BENCH_VALGRIND", "/nonexistent/valgrind")],
    );
    assert!(out.contains("\"valgrind\": null"), "{out}");
    assert!(out.contains("valgrind not found"), "{out}");
    // The native rows, then the provider's (`tools/bench/src/provider.rs`).
    let provider = mlx5_bench::provider::PROVIDER_OPS.len();
    assert_eq!(
        out.matches("\"op\":").count(),
        OPS.len() + provider,
        "{out}"
    );
    assert_eq!(
        out.matches("\"ours_instr\": null").count(),
        OPS.len() + provider,
        "{out}"
    );
    let unchecked = OPS.iter().filter(|s| s.api == "unchecked").count();
    for (key, nulls) in [("\"ours_ns\": ", 0), ("\"libmlx5_ns\": ", unchecked)] {
        let cells: Vec<&str> = out
            .match_indices(key)
            .map(|(i, _)| {
                let rest = &out[i + key.len()..];
                let end = rest.find([',', '}']).unwrap_or(rest.len());
                rest[..end].trim()
            })
            .collect();
        assert_eq!(cells.len(), OPS.len());
        assert_eq!(
            cells.iter().filter(|c| **c == "null").count(),
            nulls,
            "{key}"
        );
        let values: Vec<f64> = cells
            .iter()
            .filter(|c| **c != "null")
            .map(|c| c.parse().unwrap_or_else(|_| panic!("{key} {c:?}")))
            .collect();
        assert!(values.iter().all(|v| *v > 0.0), "{key}: {values:?}");
    }
}
