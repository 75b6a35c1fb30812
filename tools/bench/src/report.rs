//! The result table and its JSON form.

use std::fmt::Write as _;

use crate::ops::{OPS, OpSpec, TimeResult};

/// Everything measured for one row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Row {
    /// The operation.
    pub spec: OpSpec,
    /// Our instructions per WR (callgrind).
    pub ours_instr: Option<f64>,
    /// libmlx5's instructions per WR (callgrind).
    pub theirs_instr: Option<f64>,
    /// libmlx5's instructions per WR with `MLX5_SINGLE_THREADED=1` (no locks: its best
    /// configuration).
    pub theirs_st_instr: Option<f64>,
    /// Our timer figures per WR.
    pub ours_time: Option<TimeResult>,
    /// libmlx5's timer figures per WR.
    pub theirs_time: Option<TimeResult>,
}

impl Row {
    /// Empty rows for every operation, in table order.
    pub fn all() -> Vec<Row> {
        OPS.iter()
            .map(|&spec| Row {
                spec,
                ours_instr: None,
                theirs_instr: None,
                theirs_st_instr: None,
                ours_time: None,
                theirs_time: None,
            })
            .collect()
    }
}

/// ours / theirs, when both exist and theirs is positive.
pub fn ratio(ours: Option<f64>, theirs: Option<f64>) -> Option<f64> {
    match (ours, theirs) {
        (Some(o), Some(t)) if t > 0.0 => Some(o / t),
        _ => None,
    }
}

fn cell(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "n/a".to_string(), |v| format!("{v:.decimals$}"))
}

/// The text table: one line per row, instruction columns first, then the (noisy) timer
/// columns. `notes` are printed under it.
pub fn table(rows: &[Row], notes: &[String]) -> String {
    let head = [
        "operation",
        "ours API",
        "libmlx5 API",
        "ours (instr)",
        "libmlx5 (instr)",
        "ratio",
        "libmlx5 ST (instr)",
        "ratio ST",
        "ours (ns)",
        "libmlx5 (ns)",
        "ratio (ns)",
        "ours (TSC cycles)",
        "libmlx5 (TSC cycles)",
    ];
    let mut lines: Vec<Vec<String>> = vec![head.iter().map(|s| s.to_string()).collect()];
    for r in rows {
        let ons = r.ours_time.map(|t| t.ns);
        let tns = r.theirs_time.map(|t| t.ns);
        lines.push(vec![
            r.spec.label.to_string(),
            r.spec.ours.to_string(),
            r.spec.theirs.to_string(),
            cell(r.ours_instr, 1),
            cell(r.theirs_instr, 1),
            cell(ratio(r.ours_instr, r.theirs_instr), 2),
            cell(r.theirs_st_instr, 1),
            cell(ratio(r.ours_instr, r.theirs_st_instr), 2),
            cell(ons, 1),
            cell(tns, 1),
            cell(ratio(ons, tns), 2),
            cell(r.ours_time.and_then(|t| t.ticks), 1),
            cell(r.theirs_time.and_then(|t| t.ticks), 1),
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
        "instr: instructions per WR/CQE (callgrind, wrapper inclusive, repeatable). ns/TSC \
         cycles: per WR/CQE, median over timed batches (single posts: 32 calls, polls: 64, \
         chains: 1 call), timer overhead subtracted: NOISY. ratio = ours / libmlx5 (< 1: ours \
         cheaper). ST: libmlx5 with MLX5_SINGLE_THREADED=1 (no locks, its best \
         configuration).\n",
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

fn json_str(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for ch in s.chars() {
        match ch {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// The JSON form: `{"valgrind": .., "notes": [..], "rows": [{..}, ..]}`; every figure is per
/// WR (or CQE), `null` when not measured.
pub fn json(rows: &[Row], valgrind: Option<&str>, notes: &[String]) -> String {
    let mut out = String::from("{\n");
    let _ = writeln!(
        out,
        "  \"valgrind\": {},",
        valgrind.map_or_else(|| "null".to_string(), json_str)
    );
    let notes: Vec<String> = notes.iter().map(|n| json_str(n)).collect();
    let _ = writeln!(out, "  \"notes\": [{}],", notes.join(", "));
    out.push_str("  \"rows\": [\n");
    for (i, r) in rows.iter().enumerate() {
        let ons = r.ours_time.map(|t| t.ns);
        let tns = r.theirs_time.map(|t| t.ns);
        let _ = write!(
            out,
            "    {{\"op\": {}, \"api\": {}, \"label\": {}, \"ours_api\": {}, \"libmlx5_api\": {}, \
             \"wrs_per_call\": {}, \"ours_instr\": {}, \"libmlx5_instr\": {}, \"instr_ratio\": {}, \
             \"libmlx5_st_instr\": {}, \"instr_ratio_st\": {}, \
             \"ours_ns\": {}, \"libmlx5_ns\": {}, \"ns_ratio\": {}, \"ours_ticks\": {}, \
             \"libmlx5_ticks\": {}, \"ours_timed_calls\": {}, \"libmlx5_timed_calls\": {}}}",
            json_str(r.spec.op),
            json_str(r.spec.api),
            json_str(r.spec.label),
            json_str(r.spec.ours),
            json_str(r.spec.theirs),
            r.spec.per_call,
            json_num(r.ours_instr),
            json_num(r.theirs_instr),
            json_num(ratio(r.ours_instr, r.theirs_instr)),
            json_num(r.theirs_st_instr),
            json_num(ratio(r.ours_instr, r.theirs_st_instr)),
            json_num(ons),
            json_num(tns),
            json_num(ratio(ons, tns)),
            json_num(r.ours_time.and_then(|t| t.ticks)),
            json_num(r.theirs_time.and_then(|t| t.ticks)),
            r.ours_time.map_or(0, |t| t.calls),
            r.theirs_time.map_or(0, |t| t.calls),
        );
        out.push_str(if i + 1 < rows.len() { ",\n" } else { "\n" });
    }
    out.push_str("  ]\n}\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filled() -> Vec<Row> {
        let mut rows = Row::all();
        rows[0].ours_instr = Some(50.0);
        rows[0].theirs_instr = Some(100.0);
        rows[0].theirs_st_instr = Some(80.0);
        rows[0].ours_time = Some(TimeResult {
            calls: 3,
            per_call: 1,
            ns: 10.0,
            ticks: Some(30.0),
        });
        rows
    }

    #[test]
    fn table_has_every_row_and_the_ratio() {
        let t = table(&filled(), &["n1".to_string()]);
        for spec in OPS {
            assert!(t.contains(spec.label), "{t}");
        }
        assert!(t.contains(" 0.50 "), "{t}");
        assert!(
            t.contains(" 0.62 "),
            "ratio to the single-threaded libmlx5: {t}"
        );
        assert!(t.contains("note: n1"), "{t}");
        // Header + rule + one line per row, all the same width.
        let lines: Vec<&str> = t.lines().filter(|l| l.starts_with('|')).collect();
        assert_eq!(lines.len(), 2 + OPS.len());
        assert!(lines.iter().all(|l| l.len() == lines[0].len()));
    }

    #[test]
    fn json_has_nulls_for_missing_figures() {
        let j = json(&filled(), Some("valgrind-3.19.0"), &["a \"q\"".to_string()]);
        assert!(j.contains("\"instr_ratio\": 0.500"), "{j}");
        assert!(j.contains("\"instr_ratio_st\": 0.625"), "{j}");
        assert!(j.contains("\"libmlx5_ns\": null"), "{j}");
        assert!(j.contains("\"a \\\"q\\\"\""), "{j}");
        assert_eq!(j.matches("\"op\":").count(), OPS.len());
    }
}
