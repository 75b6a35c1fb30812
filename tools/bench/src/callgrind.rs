//! Instruction counts with valgrind's callgrind.
//!
//! A program runs once under `valgrind --tool=callgrind --collect-atstart=no` with one
//! `--toggle-collect=*<wrapper>*` per measured operation: collection is on only while a
//! wrapper runs (per thread, so a device thread is never counted). The wrapper's inclusive
//! cost is then read from the output file ([`inclusive_costs`]): the sum of its own cost
//! lines and of the inclusive costs of the calls it makes.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

/// The valgrind executable: `$MLX5_BENCH_VALGRIND`, else `valgrind` from `PATH`.
pub fn valgrind_program() -> String {
    std::env::var("MLX5_BENCH_VALGRIND").unwrap_or_else(|_| "valgrind".to_string())
}

/// `valgrind --version` (e.g. `valgrind-3.19.0`), or `None` when valgrind cannot be run.
pub fn valgrind_version() -> Option<String> {
    let out = Command::new(valgrind_program())
        .arg("--version")
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The function both sides call once between their warm-up pass and the measured pass;
/// callgrind zeroes all costs on entering it, so one-time costs of the warm-up (lazy symbol
/// binding, first use of a path) are not counted.
pub const ZERO_SYMBOL: &str = "bench_zero_stats";

/// The valgrind options that run a program under callgrind, collecting only inside the
/// functions named by `symbols` (matched as `*<symbol>*`) and only after [`ZERO_SYMBOL`] was
/// entered, writing to `out_file`.
pub fn valgrind_args(symbols: &[String], out_file: &Path) -> Vec<String> {
    let mut a = vec![
        "--tool=callgrind".to_string(),
        "--collect-atstart=no".to_string(),
        format!("--zero-before=*{ZERO_SYMBOL}*"),
        format!("--callgrind-out-file={}", out_file.display()),
    ];
    for s in symbols {
        a.push(format!("--toggle-collect=*{s}*"));
    }
    a
}

/// What callgrind recorded for one wrapper function.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FnCost {
    /// Inclusive instructions (`Ir`): its own and those of everything it called.
    pub ir: u64,
    /// Calls of the function (summed over its callers' `calls=` lines).
    pub calls: u64,
}

/// The inclusive cost (first event, instructions `Ir`) and the call count of every function
/// whose (demangled) name is one of `symbols` (the symbol itself or a path ending in it),
/// summed over all its blocks, from a callgrind output file's text. Symbols without a block
/// get no entry.
///
/// # Errors
/// A file that does not look like callgrind output (no `events:` line, or events other than
/// `Ir` first).
pub fn inclusive_costs(text: &str, symbols: &[String]) -> Result<HashMap<String, FnCost>, String> {
    let mut names: HashMap<String, String> = HashMap::new(); // "(id)" -> name
    let mut costs: HashMap<String, FnCost> = HashMap::new();
    let mut events_ok = false;
    // The symbol the current `fn=` block belongs to, if it is one of ours.
    let mut current: Option<String> = None;
    // The symbol named by the last `cfn=` line, if it is one of ours (for `calls=`).
    let mut callee: Option<String> = None;
    // The line after `calls=` is the call's inclusive cost (counted like a cost line).
    for line in text.lines() {
        if let Some(ev) = line.strip_prefix("events:") {
            if ev.split_whitespace().next() != Some("Ir") {
                return Err(format!("callgrind events are {ev:?}, expected Ir first"));
            }
            events_ok = true;
            continue;
        }
        if let Some(spec) = line.strip_prefix("fn=") {
            let name = resolve(&mut names, spec);
            current = symbols.iter().find(|s| contains_symbol(&name, s)).cloned();
            continue;
        }
        if let Some(spec) = line.strip_prefix("cfn=") {
            let name = resolve(&mut names, spec);
            callee = symbols.iter().find(|s| contains_symbol(&name, s)).cloned();
            continue;
        }
        if let Some(rest) = line.strip_prefix("calls=") {
            if let Some(sym) = callee.take() {
                let n = rest
                    .split_whitespace()
                    .next()
                    .and_then(|n| n.parse::<u64>().ok())
                    .ok_or_else(|| format!("bad calls line {line:?}"))?;
                costs.entry(sym).or_default().calls += n;
            }
            continue;
        }
        let Some(first) = line.chars().next() else {
            continue;
        };
        if !(first.is_ascii_digit() || matches!(first, '+' | '-' | '*')) {
            continue;
        }
        let Some(sym) = &current else { continue };
        // A cost line: position, then events (Ir first); missing events count 0.
        let mut it = line.split_whitespace();
        it.next();
        let ir = match it.next() {
            Some(v) => v
                .parse::<u64>()
                .map_err(|e| format!("bad cost line {line:?}: {e}"))?,
            None => 0,
        };
        costs.entry(sym.clone()).or_default().ir += ir;
    }
    if !events_ok {
        return Err("not a callgrind output file (no `events:` line)".to_string());
    }
    Ok(costs)
}

/// `(id) name` defines id, `(id)` refers to it, a bare name is itself. Callee names share
/// the id space of `fn=` names.
fn resolve(names: &mut HashMap<String, String>, spec: &str) -> String {
    let spec = spec.trim();
    if let Some(rest) = spec.strip_prefix('(') {
        if let Some((id, name)) = rest.split_once(')') {
            let name = name.trim();
            if name.is_empty() {
                return names.get(id).cloned().unwrap_or_default();
            }
            names.insert(id.to_string(), name.to_string());
            return name.to_string();
        }
    }
    spec.to_string()
}

/// Whether the (demangled) function name `name` is the wrapper `sym`: the symbol itself,
/// or a path ending in it (`crate::module::sym`), possibly with a hash suffix.
fn contains_symbol(name: &str, sym: &str) -> bool {
    name.match_indices(sym).any(|(i, _)| {
        let before = &name[..i];
        let after = &name[i + sym.len()..];
        (before.is_empty() || before.ends_with("::") || before.ends_with('\''))
            && (after.is_empty()
                || after.starts_with("::h")
                || after.starts_with(' ')
                || after.starts_with('\''))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
# callgrind format
version: 1
creator: callgrind-3.19.0
positions: line
events: Ir
summary: 1000

ob=(1) /bin/x
fl=(1) ???
fn=(1) main
0 5
cfn=(2) mlx5_bench::ours::bench_rs_chain32_verbs
calls=2 0
0 400

fl=(2) ???
fn=(2)
0 40
+2 10
cfn=(3) libmlx5_post
calls=2 0
* 350

fn=(3)
0 350

fn=(4) bench_c_poll_verbs
0 7
cfn=(5) ibv_poll_cq
calls=1 0
0 20
";

    #[test]
    fn inclusive_cost_is_self_plus_calls() {
        let syms = vec![
            "bench_rs_chain32_verbs".to_string(),
            "bench_c_poll_verbs".to_string(),
            "bench_c_chain_wr".to_string(),
        ];
        let c = inclusive_costs(SAMPLE, &syms).unwrap();
        assert_eq!(
            c.get("bench_rs_chain32_verbs"),
            Some(&FnCost { ir: 400, calls: 2 })
        );
        // Called from nowhere in this file: a cost but no recorded call.
        assert_eq!(
            c.get("bench_c_poll_verbs"),
            Some(&FnCost { ir: 27, calls: 0 })
        );
        assert_eq!(c.get("bench_c_chain_wr"), None);
    }

    #[test]
    fn not_callgrind_output_is_an_error() {
        assert!(inclusive_costs("hello\n", &[]).is_err());
        assert!(inclusive_costs("events: Dr Ir\n", &[]).is_err());
    }

    #[test]
    fn symbol_match_is_whole_name() {
        assert!(contains_symbol(
            "mlx5_bench::ours::bench_rs_x",
            "bench_rs_x"
        ));
        assert!(contains_symbol(
            "mlx5_bench::ours::bench_rs_x::h0123",
            "bench_rs_x"
        ));
        assert!(contains_symbol("bench_c_poll_wr", "bench_c_poll_wr"));
        assert!(!contains_symbol("bench_c_poll_wrap", "bench_c_poll_wr"));
        assert!(!contains_symbol("xbench_c_poll_wr", "bench_c_poll_wr"));
    }

    #[test]
    fn toggles_name_every_symbol() {
        let a = valgrind_args(&["f".to_string(), "g".to_string()], Path::new("o"));
        assert!(a.contains(&"--toggle-collect=*f*".to_string()));
        assert!(a.contains(&"--toggle-collect=*g*".to_string()));
        assert!(a.contains(&"--collect-atstart=no".to_string()));
    }
}
