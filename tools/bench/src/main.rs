//! `mlx5-bench`: CPU cost per data-path operation, the `mlx5` crate vs libmlx5, on the same
//! emulated ConnectX. See the library documentation (`mlx5_bench`) for what is measured.
//!
//! ```text
//! mlx5-bench [--quick] [--json] [--calls N] [--cg-calls N] [--no-valgrind]
//! ```

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use mlx5_bench::callgrind;
use mlx5_bench::harness;
use mlx5_bench::ops::{OPS, time_results};
use mlx5_bench::ours;
use mlx5_bench::provider;
use mlx5_bench::report::{Row, json, table};

const USAGE: &str =
    "usage: mlx5-bench [--quick] [--json] [--calls N] [--cg-calls N] [--no-valgrind]
  --quick        few iterations (64 timed calls, 64 under callgrind)
  --json         print JSON instead of the table
  --calls N      timed calls per operation (default 10000)
  --cg-calls N   calls per operation under callgrind (default 1000)
  --no-valgrind  timer figures only
environment:
  MLX5_BENCH_RECORDER=N  run our side with the flight recorder on (N records per queue)";

/// Command-line options.
#[derive(Debug)]
struct Opts {
    json: bool,
    calls: usize,
    cg_calls: usize,
    valgrind: bool,
}

fn parse_args(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts {
        json: false,
        calls: 10_000,
        cg_calls: 1_000,
        valgrind: true,
    };
    let mut it = args.iter();
    let number = |v: Option<&String>, name: &str| -> Result<usize, String> {
        v.and_then(|v| v.parse::<usize>().ok())
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("{name} needs a positive number\n{USAGE}"))
    };
    while let Some(a) = it.next() {
        match a.as_str() {
            "--json" => o.json = true,
            "--quick" => {
                o.calls = mlx5_bench::QUICK_CALLS;
                o.cg_calls = mlx5_bench::QUICK_CALLS;
            }
            "--calls" => o.calls = number(it.next(), "--calls")?,
            "--cg-calls" => o.cg_calls = number(it.next(), "--cg-calls")?,
            "--no-valgrind" => o.valgrind = false,
            "-h" | "--help" => return Err(USAGE.to_string()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    Ok(o)
}

/// A scratch directory removed on drop.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Instructions per WR of every operation from one callgrind run: `stdout` carries the
/// `result` lines (call counts), `out_file` the callgrind output. A wrapper that callgrind
/// saw called a different number of times than the side reports (inlined, or merged with
/// another) is an error rather than a wrong figure.
fn per_wr_instr(
    stdout: &str,
    out_file: &Path,
    symbol: impl Fn(&mlx5_bench::ops::OpSpec) -> String,
) -> Result<Vec<Option<f64>>, String> {
    let text = std::fs::read_to_string(out_file)
        .map_err(|e| format!("no callgrind output at {}: {e}", out_file.display()))?;
    let syms: Vec<String> = OPS.iter().map(&symbol).collect();
    let costs = callgrind::inclusive_costs(&text, &syms)?;
    let calls = time_results(stdout);
    let mut out = Vec::new();
    for spec in OPS {
        let name = symbol(&spec);
        let (Some(c), Some((_, t))) = (costs.get(&name), calls.iter().find(|(s, _)| *s == spec))
        else {
            out.push(None);
            continue;
        };
        if c.calls != t.calls {
            return Err(format!(
                "callgrind saw {} calls of {name}, the run reports {}: was the wrapper inlined \
                 or merged with another function?",
                c.calls, t.calls
            ));
        }
        let wrs = t.calls * u64::from(t.per_call);
        out.push((wrs > 0).then(|| c.ir as f64 / wrs as f64));
    }
    Ok(out)
}

fn run(o: &Opts) -> (Vec<Row>, Option<String>, Vec<String>, bool) {
    let mut rows = Row::all();
    let mut notes = Vec::new();
    let mut ok = true;
    let vg = if o.valgrind {
        let v = callgrind::valgrind_version();
        if v.is_none() {
            notes.push(
                "valgrind not found: instruction counts skipped, timer figures only".to_string(),
            );
        }
        v
    } else {
        notes.push("--no-valgrind: instruction counts skipped".to_string());
        None
    };
    let scratch = Scratch(std::env::temp_dir().join(format!("mlx5-bench-{}", std::process::id())));
    if let Err(e) = std::fs::create_dir_all(&scratch.0) {
        notes.push(format!("cannot create {}: {e}", scratch.0.display()));
        return (rows, vg, notes, false);
    }

    // Our side, timed in this process.
    match ours::run(o.calls) {
        Ok(lines) => {
            let text = lines.join("\n");
            for (spec, t) in time_results(&text) {
                if let Some(r) = rows.iter_mut().find(|r| r.spec == spec) {
                    r.ours_time = Some(t);
                }
            }
            if let Some(info) = lines.iter().find(|l| l.starts_with("info ")) {
                notes.push(format!("ours: {}", &info[5..]));
            }
        }
        Err(e) => {
            ok = false;
            notes.push(format!("our side failed: {e}"));
        }
    }

    // The C harness, timed.
    let c = harness::build(&scratch.0).and_then(|exe| Ok((exe, harness::preload_so()?)));
    match &c {
        Ok((exe, so)) => {
            match harness::run(harness::command(exe, so, o.calls, &[]), "the C harness") {
                Ok(text) => {
                    for (spec, t) in time_results(&text) {
                        if let Some(r) = rows.iter_mut().find(|r| r.spec == spec) {
                            r.theirs_time = Some(t);
                        }
                    }
                    if let Some(info) = text.lines().find(|l| l.starts_with("info ")) {
                        notes.push(format!("libmlx5: {}", &info[5..]));
                    }
                }
                Err(e) => {
                    ok = false;
                    notes.push(e);
                }
            }
        }
        Err(e) => {
            ok = false;
            notes.push(format!("libmlx5 side unavailable: {e}"));
        }
    }

    if vg.is_some() {
        // Our side under callgrind: this executable in worker mode.
        let out = scratch.0.join("ours.callgrind");
        let syms: Vec<String> = OPS.iter().map(|s| s.ours_symbol()).collect();
        let r = std::env::current_exe()
            .map_err(|e| e.to_string())
            .and_then(|exe| {
                let mut cmd = Command::new(callgrind::valgrind_program());
                cmd.args(callgrind::valgrind_args(&syms, &out))
                    .arg(exe)
                    .args(["--worker-ours", &o.cg_calls.to_string()]);
                harness::run(cmd, "our side under callgrind")
            })
            .and_then(|stdout| per_wr_instr(&stdout, &out, |s| s.ours_symbol()));
        match r {
            Ok(v) => {
                for (row, x) in rows.iter_mut().zip(v) {
                    row.ours_instr = x;
                }
            }
            Err(e) => {
                ok = false;
                notes.push(e);
            }
        }
        if let Ok((exe, so)) = &c {
            // libmlx5 as configured by default, then single-threaded (no locks).
            for single_threaded in [false, true] {
                let out = scratch.0.join(if single_threaded {
                    "libmlx5-st.callgrind"
                } else {
                    "libmlx5.callgrind"
                });
                let syms: Vec<String> = OPS.iter().map(|s| s.theirs_symbol()).collect();
                let mut prefix = vec![callgrind::valgrind_program()];
                prefix.extend(callgrind::valgrind_args(&syms, &out));
                let mut cmd = harness::command(exe, so, o.cg_calls, &prefix);
                if single_threaded {
                    cmd.env("MLX5_SINGLE_THREADED", "1");
                }
                let r = harness::run(cmd, "the C harness under callgrind")
                    .and_then(|stdout| per_wr_instr(&stdout, &out, |s| s.theirs_symbol()));
                match r {
                    Ok(v) => {
                        for (row, x) in rows.iter_mut().zip(v) {
                            if single_threaded {
                                row.theirs_st_instr = x;
                            } else {
                                row.theirs_instr = x;
                            }
                        }
                    }
                    Err(e) => {
                        ok = false;
                        notes.push(e);
                    }
                }
            }
        }
    }
    notes.push(format!(
        "timed calls per operation: {}; under callgrind: {}",
        o.calls,
        if vg.is_some() {
            o.cg_calls.to_string()
        } else {
            "-".to_string()
        }
    ));
    (rows, vg, notes, ok)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // Worker mode (run under callgrind by the main mode): our side only, `result` lines.
    if args.first().map(String::as_str) == Some("--worker-ours") {
        let calls = args.get(1).and_then(|v| v.parse().ok()).unwrap_or(1000);
        return match ours::run(calls) {
            Ok(lines) => {
                for l in lines {
                    println!("{l}");
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("mlx5-bench worker: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let o = match parse_args(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let (rows, vg, notes, ok) = run(&o);
    let (prows, pnotes, pok) = provider::run_scratch(o.calls, o.cg_calls, vg.is_some());
    if o.json {
        let mut notes = notes;
        notes.extend(pnotes);
        let j = json(&rows, vg.as_deref(), &notes);
        print!("{}", provider::with_provider_rows(&j, &prows));
    } else {
        println!(
            "mlx5-bench ({} build; {})",
            if cfg!(debug_assertions) {
                "DEBUG: numbers meaningless"
            } else {
                "release"
            },
            vg.as_deref().unwrap_or("no valgrind")
        );
        print!("{}", table(&rows, &notes));
        print!("\n{}", provider::table(&prows, &pnotes));
    }
    if ok && pok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn options_parse() {
        let o = parse_args(&args(&["--quick", "--json", "--no-valgrind"])).unwrap();
        assert!(o.json && !o.valgrind);
        assert_eq!((o.calls, o.cg_calls), (64, 64));
        let o = parse_args(&args(&["--calls", "500", "--cg-calls", "7"])).unwrap();
        assert_eq!(
            (o.calls, o.cg_calls, o.json, o.valgrind),
            (500, 7, false, true)
        );
        assert!(parse_args(&args(&["--calls", "0"])).is_err());
        assert!(parse_args(&args(&["--calls"])).is_err());
        assert!(
            parse_args(&args(&["--bogus"]))
                .unwrap_err()
                .contains("usage")
        );
    }
}
