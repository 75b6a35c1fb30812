//! The `"api": "provider"` rows: the same binary (`provider.c`, plain libibverbs calls only:
//! the inline `ibv_post_send` and `ibv_poll_cq` of `verbs.h`) run once per provider on the
//! emulator, so the rows compare our provider (`libmlx5rs.so`, `tools/provider`) with libmlx5
//! through exactly the calls unmodified programs make.
//!
//! Four runs under callgrind: ours and libmlx5, each as configured by default (locks on) and
//! with `MLX5_SINGLE_THREADED=1` (no locks: both providers honour the variable); two timed
//! runs, single-threaded. The figures are per WR (per CQE for `poll_cqe`).
//!
//! The harness cannot peek at the rings (libmlx5's `mlx5dv_init_obj` refuses a context it
//! did not make), so it waits for completions; before the measured polls it uses an RDMA
//! READ as a barrier (see the head of `provider.c`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::callgrind;
use crate::harness;
use crate::ops::{CHAIN, OpSpec, parse_results};

/// The provider rows, in table order.
pub const PROVIDER_OPS: [OpSpec; 4] = [
    OpSpec {
        op: "send_inline64",
        api: "provider",
        per_call: 1,
        label: "post 1 inline 64 B SEND (BlueFlame)",
        ours: "ibv_post_send (libmlx5rs)",
        theirs: "ibv_post_send (libmlx5)",
    },
    OpSpec {
        op: "send_sge64",
        api: "provider",
        per_call: 1,
        label: "post 1 SEND, 1 SGE (8 B doorbell)",
        ours: "ibv_post_send (libmlx5rs)",
        theirs: "ibv_post_send (libmlx5)",
    },
    OpSpec {
        op: "chain32",
        api: "provider",
        per_call: CHAIN as u32,
        label: "post chain of 32 SENDs (per WR)",
        ours: "ibv_post_send (libmlx5rs)",
        theirs: "ibv_post_send (libmlx5)",
    },
    OpSpec {
        op: "poll_cqe",
        api: "provider",
        per_call: 1,
        label: "poll 1 CQE (CQ holds 64)",
        ours: "ibv_poll_cq (libmlx5rs)",
        theirs: "ibv_poll_cq (libmlx5)",
    },
];

/// The harness's wrapper for `spec` (`bench_p_<op>`), a callgrind toggle.
pub fn symbol(spec: &OpSpec) -> String {
    format!("bench_p_{}", spec.op)
}

/// Everything measured for one provider row (per WR or CQE).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProviderRow {
    /// Instructions, ours, locks on.
    pub ours: Option<f64>,
    /// Instructions, ours, `MLX5_SINGLE_THREADED=1`.
    pub ours_st: Option<f64>,
    /// Instructions, libmlx5, locks on.
    pub theirs: Option<f64>,
    /// Instructions, libmlx5, `MLX5_SINGLE_THREADED=1`.
    pub theirs_st: Option<f64>,
    /// Nanoseconds (median, timer overhead subtracted), ours single-threaded.
    pub ours_st_ns: Option<f64>,
    /// Nanoseconds, libmlx5 single-threaded.
    pub theirs_st_ns: Option<f64>,
}

/// Who serves the harness in one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provider {
    /// `libmlx5rs.so` preloaded, `MLX5RS_PROVIDER=ours`.
    Ours,
    /// rdma-core's libmlx5 (ours not preloaded).
    Libmlx5,
}

/// The harness source, next to this crate's manifest.
pub fn source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("provider.c")
}

/// Compile the provider harness into `out_dir` (flags as [`harness::build`]).
///
/// # Errors
/// As [`harness::build`].
pub fn build(out_dir: &Path) -> Result<PathBuf, String> {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let exe = out_dir.join("provider-harness");
    let flags = [
        "-std=gnu11",
        "-O2",
        "-g",
        "-fno-ipa-icf",
        "-Wall",
        "-Wextra",
        "-Werror",
    ];
    mlx5_emu::cprog::compile_verbs_program(&cc, &flags, &source(), &exe)?;
    Ok(exe)
}

/// Our provider's shared object: `$MLX5RS_SO`, else `libmlx5rs.so` that cargo built into the
/// target directory of the running executable (`deps/` first, as
/// [`mlx5_emu::cprog::preload_so`]).
///
/// # Errors
/// Where it looked.
pub fn provider_so() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("MLX5RS_SO") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let name = "libmlx5rs.so";
    let mut tried = Vec::new();
    for dir in exe.ancestors().skip(1).take(3) {
        for p in [dir.join("deps").join(name), dir.join(name)] {
            if p.exists() {
                return Ok(p);
            }
            tried.push(p.display().to_string());
        }
    }
    Err(format!(
        "{name} not found (looked at {}); build it with `cargo build --release -p \
         mlx5-provider` or set MLX5RS_SO",
        tried.join(", ")
    ))
}

/// The command of one run: [`harness::command`]'s environment (the emulator's front door,
/// in-process fabric, libmlx5's knobs), plus ours preloaded after the front door for
/// [`Provider::Ours`], plus `MLX5_SINGLE_THREADED=1` when `single_threaded`.
pub fn command(
    exe: &Path,
    emu: &Path,
    ours: &Path,
    who: Provider,
    single_threaded: bool,
    calls: usize,
    prefix: &[String],
) -> std::process::Command {
    let mut cmd = harness::command(exe, emu, calls, prefix);
    if who == Provider::Ours {
        cmd.env(
            "LD_PRELOAD",
            format!("{}:{}", emu.display(), ours.display()),
        )
        .env("MLX5RS_PROVIDER", "ours")
        .env("MLX5RS_LOG", "1");
    } else {
        cmd.env_remove("MLX5RS_PROVIDER").env_remove("MLX5RS_LOG");
    }
    if single_threaded {
        cmd.env("MLX5_SINGLE_THREADED", "1");
    }
    cmd
}

/// Per-WR instructions of every provider row from one callgrind run (`stdout`: its `result`
/// lines; `text`: the callgrind output file). A wrapper whose call count differs from the
/// run's own is an error.
///
/// # Errors
/// As [`callgrind::inclusive_costs`], or a call-count mismatch.
pub fn per_wr(stdout: &str, text: &str) -> Result<Vec<Option<f64>>, String> {
    let syms: Vec<String> = PROVIDER_OPS.iter().map(symbol).collect();
    let costs = callgrind::inclusive_costs(text, &syms)?;
    let results = parse_results(stdout);
    let mut out = Vec::new();
    for spec in PROVIDER_OPS {
        let name = symbol(&spec);
        let r = results
            .iter()
            .find(|r| r.op == spec.op && r.api == spec.api);
        let (Some(c), Some(r)) = (costs.get(&name), r) else {
            out.push(None);
            continue;
        };
        if c.calls != r.calls {
            return Err(format!(
                "callgrind saw {} calls of {name}, the run reports {}",
                c.calls, r.calls
            ));
        }
        let wrs = r.calls * u64::from(r.per_call);
        out.push((wrs > 0).then(|| c.ir as f64 / wrs as f64));
    }
    Ok(out)
}

/// Per-WR nanoseconds of every provider row from a timed run's `result` lines.
pub fn per_wr_ns(stdout: &str) -> Vec<Option<f64>> {
    let rows = parse_results(stdout);
    let overhead = rows
        .iter()
        .find(|r| r.op == "timer_overhead")
        .map_or(0, |r| r.ns);
    PROVIDER_OPS
        .iter()
        .map(|spec| {
            rows.iter()
                .find(|r| r.op == spec.op && r.api == spec.api)
                .map(|r| {
                    r.ns.saturating_sub(overhead) as f64 / (r.batch * u64::from(r.per_call)) as f64
                })
        })
        .collect()
}

/// Run `cmd` to completion; its stdout. Ours must have said that it served the device
/// (`MLX5RS_LOG`'s `libmlx5rs: opened` line on stderr), and must not have for libmlx5: a row is
/// never measured on the wrong provider.
///
/// # Errors
/// Start failure, non-zero exit, or the wrong provider, with the output.
pub fn run_served(
    mut cmd: std::process::Command,
    what: &str,
    who: Provider,
) -> Result<String, String> {
    let out = cmd
        .output()
        .map_err(|e| format!("cannot start {what}: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let tail = || {
        let t: Vec<&str> = stderr.lines().rev().take(30).collect();
        t.into_iter().rev().collect::<Vec<_>>().join("\n")
    };
    if !out.status.success() {
        return Err(format!(
            "{what} failed ({}):\n--- stdout:\n{stdout}\n--- stderr (tail):\n{}",
            out.status,
            tail()
        ));
    }
    let served = stderr.contains("libmlx5rs: opened");
    if served != (who == Provider::Ours) {
        return Err(format!(
            "{what}: the device was served by the wrong provider (libmlx5rs log line {}):\n{}",
            if served { "present" } else { "absent" },
            tail()
        ));
    }
    Ok(stdout)
}

/// Measure every provider row: `calls` timed calls, `cg_calls` under callgrind (skipped when
/// `valgrind` is false). Returns the rows, notes, and whether everything ran.
pub fn run(
    scratch: &Path,
    calls: usize,
    cg_calls: usize,
    valgrind: bool,
) -> (Vec<ProviderRow>, Vec<String>, bool) {
    let mut rows = vec![ProviderRow::default(); PROVIDER_OPS.len()];
    let mut notes = Vec::new();
    let setup = build(scratch).and_then(|exe| Ok((exe, harness::preload_so()?, provider_so()?)));
    let (exe, emu, ours) = match setup {
        Ok(s) => s,
        Err(e) => {
            notes.push(format!("provider rows unavailable: {e}"));
            return (rows, notes, false);
        }
    };
    let mut ok = true;
    let configs = [
        (Provider::Ours, false),
        (Provider::Ours, true),
        (Provider::Libmlx5, false),
        (Provider::Libmlx5, true),
    ];
    for (who, st) in configs {
        let what = format!(
            "the provider harness ({}{})",
            if who == Provider::Ours {
                "libmlx5rs"
            } else {
                "libmlx5"
            },
            if st { ", single-threaded" } else { "" }
        );
        if st {
            let r = run_served(command(&exe, &emu, &ours, who, st, calls, &[]), &what, who);
            match r {
                Ok(o) => {
                    for (row, v) in rows.iter_mut().zip(per_wr_ns(&o)) {
                        if who == Provider::Ours {
                            row.ours_st_ns = v;
                        } else {
                            row.theirs_st_ns = v;
                        }
                    }
                }
                Err(e) => {
                    ok = false;
                    notes.push(e);
                }
            }
        }
        if !valgrind {
            continue;
        }
        let out = scratch.join(format!(
            "provider-{}{}.callgrind",
            if who == Provider::Ours {
                "ours"
            } else {
                "libmlx5"
            },
            if st { "-st" } else { "" }
        ));
        let syms: Vec<String> = PROVIDER_OPS.iter().map(symbol).collect();
        let mut prefix = vec![callgrind::valgrind_program()];
        prefix.extend(callgrind::valgrind_args(&syms, &out));
        let r = run_served(
            command(&exe, &emu, &ours, who, st, cg_calls, &prefix),
            &format!("{what} under callgrind"),
            who,
        )
        .and_then(|stdout| {
            let text = std::fs::read_to_string(&out)
                .map_err(|e| format!("no callgrind output at {}: {e}", out.display()))?;
            per_wr(&stdout, &text)
        });
        match r {
            Ok(v) => {
                for (row, x) in rows.iter_mut().zip(v) {
                    match (who, st) {
                        (Provider::Ours, false) => row.ours = x,
                        (Provider::Ours, true) => row.ours_st = x,
                        (Provider::Libmlx5, false) => row.theirs = x,
                        (Provider::Libmlx5, true) => row.theirs_st = x,
                    }
                }
            }
            Err(e) => {
                ok = false;
                notes.push(e);
            }
        }
    }
    (rows, notes, ok)
}

/// [`run`] in a scratch directory of its own under the system's temporary directory,
/// removed afterwards.
pub fn run_scratch(
    calls: usize,
    cg_calls: usize,
    valgrind: bool,
) -> (Vec<ProviderRow>, Vec<String>, bool) {
    let dir = std::env::temp_dir().join(format!("mlx5-bench-provider-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        let rows = vec![ProviderRow::default(); PROVIDER_OPS.len()];
        return (
            rows,
            vec![format!("cannot create {}: {e}", dir.display())],
            false,
        );
    }
    let r = run(&dir, calls, cg_calls, valgrind);
    let _ = std::fs::remove_dir_all(&dir);
    r
}

fn cell(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "n/a".to_string(), |v| format!("{v:.decimals$}"))
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    crate::report::ratio(a, b)
}

/// The provider table (text), in the style of [`crate::report::table`].
pub fn table(rows: &[ProviderRow], notes: &[String]) -> String {
    let head = [
        "operation (api: provider)",
        "ours",
        "libmlx5",
        "ours (instr)",
        "libmlx5 (instr)",
        "ratio",
        "ours ST (instr)",
        "libmlx5 ST (instr)",
        "ratio ST",
        "ours ST (ns)",
        "libmlx5 ST (ns)",
    ];
    let mut lines: Vec<Vec<String>> = vec![head.iter().map(|s| s.to_string()).collect()];
    for (spec, r) in PROVIDER_OPS.iter().zip(rows) {
        lines.push(vec![
            spec.label.to_string(),
            spec.ours.to_string(),
            spec.theirs.to_string(),
            cell(r.ours, 1),
            cell(r.theirs, 1),
            cell(ratio(r.ours, r.theirs), 2),
            cell(r.ours_st, 1),
            cell(r.theirs_st, 1),
            cell(ratio(r.ours_st, r.theirs_st), 2),
            cell(r.ours_st_ns, 1),
            cell(r.theirs_st_ns, 1),
        ]);
    }
    let widths: Vec<usize> = (0..head.len())
        .map(|c| lines.iter().map(|l| l[c].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for (i, l) in lines.iter().enumerate() {
        let cells: Vec<String> = l
            .iter()
            .enumerate()
            .map(|(c, s)| {
                if c < 3 {
                    format!("{s:<w$}", w = widths[c])
                } else {
                    format!("{s:>w$}", w = widths[c])
                }
            })
            .collect();
        let _ = writeln!(out, "| {} |", cells.join(" | "));
        if i == 0 {
            let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
            let _ = writeln!(out, "|-{}-|", rule.join("-|-"));
        }
    }
    out.push_str(
        "provider rows: one C program (tools/bench/provider.c) calling libibverbs' inline \
         ibv_post_send/ibv_poll_cq, served by our provider (libmlx5rs) or by libmlx5; \
         instructions per WR/CQE (callgrind); ST: MLX5_SINGLE_THREADED=1 on both (no locks); \
         ratio = ours / libmlx5.\n",
    );
    for n in notes {
        let _ = writeln!(out, "note: {n}");
    }
    out
}

fn json_num(v: Option<f64>) -> String {
    match v {
        Some(v) if v.is_finite() => format!("{v:.3}"),
        _ => "null".to_string(),
    }
}

/// The provider rows as JSON objects (one per line, no trailing comma), with
/// `"api": "provider"`.
pub fn json_rows(rows: &[ProviderRow]) -> Vec<String> {
    PROVIDER_OPS
        .iter()
        .zip(rows)
        .map(|(spec, r)| {
            format!(
                "    {{\"op\": \"{}\", \"api\": \"{}\", \"label\": \"{}\", \"ours_api\": \"{}\", \
                 \"libmlx5_api\": \"{}\", \"wrs_per_call\": {}, \"ours_instr\": {}, \
                 \"libmlx5_instr\": {}, \"instr_ratio\": {}, \"ours_st_instr\": {}, \
                 \"libmlx5_st_instr\": {}, \"instr_ratio_st\": {}, \"ours_st_ns\": {}, \
                 \"libmlx5_st_ns\": {}}}",
                spec.op,
                spec.api,
                spec.label,
                spec.ours,
                spec.theirs,
                spec.per_call,
                json_num(r.ours),
                json_num(r.theirs),
                json_num(ratio(r.ours, r.theirs)),
                json_num(r.ours_st),
                json_num(r.theirs_st),
                json_num(ratio(r.ours_st, r.theirs_st)),
                json_num(r.ours_st_ns),
                json_num(r.theirs_st_ns),
            )
        })
        .collect()
}

/// `json` (the document [`crate::report::json`] prints) with the provider rows appended to
/// its `"rows"` array and `notes` to its `"notes"`; unchanged if it does not end as that
/// function ends it.
pub fn with_provider_rows(json: &str, rows: &[ProviderRow]) -> String {
    let tail = "\n  ]\n}\n";
    let Some(body) = json.strip_suffix(tail) else {
        return json.to_string();
    };
    let mut out = body.to_string();
    for r in json_rows(rows) {
        out.push_str(",\n");
        out.push_str(&r);
    }
    out.push_str(tail);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symbols_are_distinct_and_not_prefixes() {
        let names: Vec<String> = PROVIDER_OPS.iter().map(symbol).collect();
        for (i, a) in names.iter().enumerate() {
            for (j, b) in names.iter().enumerate() {
                assert!(i == j || !b.starts_with(a.as_str()), "{a} / {b}");
            }
        }
        // Nor of the other harness's or our side's wrappers.
        for s in crate::ops::OPS {
            for n in &names {
                assert!(!s.theirs_symbol().starts_with(n.as_str()));
                assert!(!s.ours_symbol().starts_with(n.as_str()));
            }
        }
    }

    const RUN: &str = "result timer_overhead none calls=10 batch=1 wrs_per_call=1 ns=20 ticks=0\n\
        result send_inline64 provider calls=64 batch=32 wrs_per_call=1 ns=660 ticks=0\n\
        result chain32 provider calls=2 batch=1 wrs_per_call=32 ns=340 ticks=0\n";

    #[test]
    fn per_wr_divides_by_wrs_and_checks_counts() {
        let cg = "events: Ir\nfn=(1) main\ncfn=(2) bench_p_send_inline64\ncalls=64 0\n0 6400\n\
                  cfn=(3) bench_p_chain32\ncalls=2 0\n0 6400\nfn=(2)\n0 6400\nfn=(3)\n0 6400\n";
        let v = per_wr(RUN, cg).unwrap();
        assert_eq!(v, vec![Some(100.0), None, Some(100.0), None]);
        let bad = cg.replace("calls=64", "calls=63");
        assert!(per_wr(RUN, &bad).unwrap_err().contains("63"));
        let ns = per_wr_ns(RUN);
        assert_eq!(ns, vec![Some(20.0), None, Some(10.0), None]);
    }

    #[test]
    fn table_and_json_carry_every_row() {
        let mut rows = vec![ProviderRow::default(); 4];
        rows[3] = ProviderRow {
            ours: Some(60.0),
            ours_st: Some(50.0),
            theirs: Some(200.0),
            theirs_st: Some(100.0),
            ours_st_ns: Some(5.0),
            theirs_st_ns: None,
        };
        let t = table(&rows, &["n".to_string()]);
        for s in PROVIDER_OPS {
            assert!(t.contains(s.label), "{t}");
        }
        assert!(t.contains(" 0.30 ") && t.contains(" 0.50 "), "{t}");
        let lines: Vec<&str> = t.lines().filter(|l| l.starts_with('|')).collect();
        assert_eq!(lines.len(), 2 + PROVIDER_OPS.len());
        assert!(lines.iter().all(|l| l.len() == lines[0].len()));
        let base = crate::report::json(&crate::report::Row::all(), None, &[]);
        let j = with_provider_rows(&base, &rows);
        assert_eq!(j.matches("\"api\": \"provider\"").count(), 4, "{j}");
        assert!(j.contains("\"instr_ratio_st\": 0.500"), "{j}");
        assert!(j.ends_with("\n  ]\n}\n"));
        assert_eq!(
            j.matches("\"op\":").count(),
            crate::ops::OPS.len() + PROVIDER_OPS.len()
        );
        assert_eq!(with_provider_rows("x", &rows), "x");
    }
}
