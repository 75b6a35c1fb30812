//! The latency picture as a self-contained SVG file (hand-written; no plotting crate): on the
//! left a percentile plot (latency against percentile on a 1/(1-p) axis, as HdrHistogram
//! plots it), on the right a histogram with a logarithmic count axis; markers at p50, p99,
//! p99.9, p99.99 and the maximum on both; ticks in 1-2-5 steps.
//!
//! When the samples span more than [`LOG_SPAN`] (max / min), the latency axes are logarithmic
//! too, so that the body of the distribution and its tail are both readable.

use std::fmt::Write as _;

use crate::stats::percentile;

/// Canvas and panel geometry, in SVG user units.
const WIDTH: f64 = 1200.0;
const HEIGHT: f64 = 520.0;
const TOP: f64 = 60.0;
const BOTTOM: f64 = 70.0;
const PANEL_W: f64 = 480.0;
const LEFT_X: f64 = 80.0;
const RIGHT_X: f64 = 690.0;
/// Histogram bins.
const BINS: usize = 60;
/// max / min above which latency axes are logarithmic.
pub const LOG_SPAN: f64 = 20.0;

/// The percentiles marked, with their labels.
const MARKS: [(f64, &str); 4] = [
    (50.0, "p50"),
    (99.0, "p99"),
    (99.9, "p99.9"),
    (99.99, "p99.99"),
];

/// A number as a tick label: no trailing zeros, no exponent for the ranges latency takes.
pub fn fmt_num(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let digits = (3 - v.abs().log10().floor() as i32).clamp(0, 6) as usize;
    let s = format!("{v:.digits$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        s
    }
}

/// The 1-2-5 step nearest above `raw` (1, 2, 5, 10, 20, 50, ...).
pub fn nice_step(raw: f64) -> f64 {
    if raw <= 0.0 || !raw.is_finite() {
        return 1.0;
    }
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * mag)
        .find(|&s| s >= raw * (1.0 - 1e-12))
        .unwrap_or(10.0 * mag)
}

/// A value axis: linear from `lo` or logarithmic, with its ticks.
#[derive(Debug, Clone, PartialEq)]
pub struct Axis {
    /// Smallest value shown.
    pub lo: f64,
    /// Largest value shown.
    pub hi: f64,
    /// Logarithmic.
    pub log: bool,
    /// Tick values, ascending.
    pub ticks: Vec<f64>,
}

impl Axis {
    /// A linear axis from 0 over `[0, hi]` with about five 1-2-5 steps.
    pub fn linear(hi: f64) -> Self {
        let hi = if hi > 0.0 { hi } else { 1.0 };
        let step = nice_step(hi / 5.0);
        let top = (hi / step).ceil() * step;
        let n = (top / step).round() as usize;
        Self {
            lo: 0.0,
            hi: top,
            log: false,
            ticks: (0..=n).map(|i| i as f64 * step).collect(),
        }
    }

    /// A logarithmic axis over `[lo, hi]` (both > 0), extended to 1-2-5 values, ticked at
    /// 1, 2 and 5 of each decade (only 1 when it spans more than four decades).
    pub fn log(lo: f64, hi: f64) -> Self {
        let lo = if lo > 0.0 { lo } else { 1e-3 };
        let hi = hi.max(lo * 1.000_001);
        let below = |v: f64| {
            let mag = 10f64.powf(v.log10().floor());
            [5.0, 2.0, 1.0]
                .into_iter()
                .map(|m| m * mag)
                .find(|&s| s <= v * (1.0 + 1e-12))
                .unwrap_or(mag)
        };
        let start = below(lo);
        let end = nice_step(hi);
        let decades = (end / start).log10();
        let mults: &[f64] = if decades > 4.0 {
            &[1.0]
        } else {
            &[1.0, 2.0, 5.0]
        };
        let mut ticks = Vec::new();
        let mut mag = 10f64.powf(start.log10().floor());
        while mag <= end * (1.0 + 1e-12) {
            for m in mults {
                let t = m * mag;
                if t >= start * (1.0 - 1e-12) && t <= end * (1.0 + 1e-12) {
                    ticks.push(t);
                }
            }
            mag *= 10.0;
        }
        Self {
            lo: start,
            hi: end,
            log: true,
            ticks,
        }
    }

    /// Where `v` falls, 0 (at `lo`) to 1 (at `hi`), clamped.
    pub fn frac(&self, v: f64) -> f64 {
        let f = if self.log {
            (v.max(self.lo).ln() - self.lo.ln()) / (self.hi.ln() - self.lo.ln())
        } else {
            (v - self.lo) / (self.hi - self.lo)
        };
        f.clamp(0.0, 1.0)
    }
}

/// Bins of the histogram: equal in latency, or equal in log(latency) on a log axis.
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    /// Bin edges (`counts.len() + 1` of them), ascending.
    pub edges: Vec<f64>,
    /// Samples per bin; every sample is in one.
    pub counts: Vec<u64>,
}

impl Histogram {
    /// Bins sorted `samples` into [`BINS`] bins from the minimum to the maximum.
    pub fn new(sorted: &[f64], log: bool) -> Option<Self> {
        let lo = *sorted.first()?;
        let hi = *sorted.last()?;
        if hi <= lo {
            return Some(Self {
                edges: vec![lo, lo + lo.abs().max(1.0) * 0.01],
                counts: vec![sorted.len() as u64],
            });
        }
        let log = log && lo > 0.0;
        let (a, b) = if log { (lo.ln(), hi.ln()) } else { (lo, hi) };
        let edges: Vec<f64> = (0..=BINS)
            .map(|i| {
                let x = a + (b - a) * i as f64 / BINS as f64;
                if log { x.exp() } else { x }
            })
            .collect();
        let mut counts = vec![0u64; BINS];
        for &x in sorted {
            let t = if log { x.ln() } else { x };
            let i = (((t - a) / (b - a)) * BINS as f64) as usize;
            counts[i.min(BINS - 1)] += 1;
        }
        Some(Self { edges, counts })
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// x position (decades of 1/(1-p)) of the percentile `pct` on the percentile axis.
fn pct_x(pct: f64) -> f64 {
    let tail = (1.0 - pct / 100.0).max(1e-12);
    -tail.log10()
}

/// The label of the percentile at `d` decades: 0%, 90%, 99%, 99.9%, ...
fn pct_label(d: u32) -> String {
    match d {
        0 => "0%".into(),
        1 => "90%".into(),
        2 => "99%".into(),
        _ => format!("99.{}%", "9".repeat(d as usize - 2)),
    }
}

struct Svg(String);

impl Svg {
    fn line(&mut self, x1: f64, y1: f64, x2: f64, y2: f64, style: &str) {
        let _ = writeln!(
            self.0,
            r#"<line x1="{x1:.1}" y1="{y1:.1}" x2="{x2:.1}" y2="{y2:.1}" {style}/>"#
        );
    }
    fn text(&mut self, x: f64, y: f64, anchor: &str, extra: &str, s: &str) {
        let _ = writeln!(
            self.0,
            r#"<text x="{x:.1}" y="{y:.1}" text-anchor="{anchor}" {extra}>{}</text>"#,
            escape(s)
        );
    }
}

const GRID: &str = r##"stroke="#ddd" stroke-width="1""##;
const AXIS: &str = r##"stroke="#000" stroke-width="1""##;
const MARK_COLORS: [&str; 5] = ["#1a7f37", "#b35900", "#c2185b", "#6a1b9a", "#000000"];

/// Renders the percentile plot and the histogram of `samples` (usec) under `title`. `None`
/// when there are no samples.
pub fn render(title: &str, samples: &[f64]) -> Option<String> {
    let mut sorted: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    let (min, max) = (*sorted.first()?, *sorted.last()?);
    let log = min > 0.0 && max / min > LOG_SPAN;
    let lat_axis = if log {
        Axis::log(min, max)
    } else {
        Axis::linear(max)
    };
    let mut marks: Vec<(String, f64, f64)> = MARKS
        .iter()
        .filter_map(|&(p, name)| Some((name.to_owned(), p, percentile(&sorted, p)?)))
        .collect();
    marks.push(("max".into(), 100.0, max));

    let plot_h = HEIGHT - TOP - BOTTOM;
    let bottom = TOP + plot_h;
    let mut s = Svg(String::new());
    let _ = writeln!(
        s.0,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        s.0,
        r#"<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="white"/>"#
    );
    s.text(
        WIDTH / 2.0,
        24.0,
        "middle",
        r#"font-size="16""#,
        &format!("{title}: {n} samples"),
    );
    let summary = marks
        .iter()
        .map(|(name, _, v)| format!("{name} {}", fmt_num(*v)))
        .collect::<Vec<_>>()
        .join("   ");
    s.text(
        WIDTH / 2.0,
        44.0,
        "middle",
        r##"fill="#444""##,
        &format!("{summary}   [usec]"),
    );

    // ---- left: latency by percentile ----
    // the last sample holds the percentiles above (n-1)/n: drawn to one decade past log10(n)
    let decades = ((n.max(2) as f64).log10().ceil() as u32 + 1).max(2);
    let px = |d: f64| LEFT_X + PANEL_W * (d / f64::from(decades)).clamp(0.0, 1.0);
    let ly = |v: f64| bottom - plot_h * lat_axis.frac(v);
    for &t in &lat_axis.ticks {
        let y = ly(t);
        s.line(LEFT_X, y, LEFT_X + PANEL_W, y, GRID);
        s.text(LEFT_X - 6.0, y + 4.0, "end", "", &fmt_num(t));
    }
    for d in 0..=decades {
        let x = px(f64::from(d));
        s.line(x, TOP, x, bottom, GRID);
        s.text(x, bottom + 18.0, "middle", "", &pct_label(d));
    }
    // nearest-rank steps: percentiles in ((k-1)/n, k/n] have the k-th smallest sample
    // (vertices closer than half a unit to the last one drawn are left out: the file stays
    // small for millions of samples and the line looks the same)
    let mut path = String::new();
    let mut last = (f64::NAN, f64::NAN);
    let mut vertex = |x: f64, y: f64, force: bool| {
        if !force && (x - last.0).abs() < 0.5 && (y - last.1).abs() < 0.5 {
            return;
        }
        let _ = write!(
            path,
            "{}{x:.1},{y:.1}",
            if path.is_empty() { "M" } else { " L" }
        );
        last = (x, y);
    };
    for (k, &v) in sorted.iter().enumerate() {
        let x0 = pct_x(100.0 * k as f64 / n as f64);
        let x1 = if k + 1 == n {
            f64::from(decades)
        } else {
            pct_x(100.0 * (k + 1) as f64 / n as f64)
        };
        let (xa, xb, y) = (px(x0), px(x1), ly(v));
        vertex(xa, y, k == 0);
        vertex(xb, y, k + 1 == n);
    }
    let _ = writeln!(
        s.0,
        r##"<path d="{path}" fill="none" stroke="#1f5fbf" stroke-width="1.5"/>"##
    );
    for (i, (name, p, v)) in marks.iter().enumerate() {
        let x = if *p >= 100.0 {
            px(f64::from(decades))
        } else {
            px(pct_x(*p))
        };
        let (y, c) = (ly(*v), MARK_COLORS[i]);
        let _ = writeln!(
            s.0,
            r#"<circle cx="{x:.1}" cy="{y:.1}" r="3.5" fill="{c}"/>"#
        );
        // the legend sits top left, where a rising percentile curve never is
        let ly0 = TOP + 18.0 + 16.0 * i as f64;
        let _ = writeln!(
            s.0,
            r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{c}"/>"#,
            LEFT_X + 14.0,
            ly0 - 4.0
        );
        s.text(
            LEFT_X + 24.0,
            ly0,
            "start",
            &format!(r#"fill="{c}""#),
            &format!("{name} {} usec", fmt_num(*v)),
        );
    }
    s.line(LEFT_X, bottom, LEFT_X + PANEL_W, bottom, AXIS);
    s.line(LEFT_X, TOP, LEFT_X, bottom, AXIS);
    s.text(
        LEFT_X + PANEL_W / 2.0,
        bottom + 40.0,
        "middle",
        "",
        "percentile (axis: 1/(1-p), log)",
    );
    let _ = writeln!(
        s.0,
        r#"<text x="20" y="{:.1}" text-anchor="middle" transform="rotate(-90 20 {:.1})">latency [usec]</text>"#,
        TOP + plot_h / 2.0,
        TOP + plot_h / 2.0
    );

    // ---- right: histogram, log counts ----
    let h = Histogram::new(&sorted, log)?;
    let hx_axis = if log {
        lat_axis.clone()
    } else {
        // from the bins' first edge: the body of a narrow distribution fills the panel
        let lo = h.edges[0];
        let step = nice_step((max - lo).max(1e-9) / 5.0);
        let start = (lo / step).floor() * step;
        let top = (max / step).ceil() * step;
        let top = if top > start { top } else { start + step };
        let k = ((top - start) / step).round() as usize;
        Axis {
            lo: start,
            hi: top,
            log: false,
            ticks: (0..=k).map(|i| start + i as f64 * step).collect(),
        }
    };
    let hx = |v: f64| RIGHT_X + PANEL_W * hx_axis.frac(v);
    let peak = h.counts.iter().copied().max().unwrap_or(1).max(1);
    let count_axis = Axis::log(1.0, peak as f64);
    // counts from 1 upward: a bar of 1 sample has height above the axis's base (0.5)
    let cy = |c: f64| {
        let f = (c.ln() - (0.5f64).ln()) / (count_axis.hi.ln() - (0.5f64).ln());
        bottom - plot_h * f.clamp(0.0, 1.0)
    };
    for &t in &count_axis.ticks {
        let y = cy(t);
        s.line(RIGHT_X, y, RIGHT_X + PANEL_W, y, GRID);
        s.text(RIGHT_X - 6.0, y + 4.0, "end", "", &fmt_num(t));
    }
    for &t in &hx_axis.ticks {
        let x = hx(t);
        s.line(x, TOP, x, bottom, GRID);
        s.text(x, bottom + 18.0, "middle", "", &fmt_num(t));
    }
    for (i, &c) in h.counts.iter().enumerate() {
        if c == 0 {
            continue;
        }
        let (x0, x1) = (hx(h.edges[i]), hx(h.edges[i + 1]));
        let y = cy(c as f64);
        let _ = writeln!(
            s.0,
            r##"<rect x="{x0:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="#4a7fd4" stroke="#2b5aa8" stroke-width="0.5"/>"##,
            (x1 - x0).max(1.0),
            (bottom - y).max(0.5)
        );
    }
    for (i, (name, _, v)) in marks.iter().enumerate() {
        let (x, c) = (hx(*v), MARK_COLORS[i]);
        s.line(
            x,
            TOP,
            x,
            bottom,
            &format!(r#"stroke="{c}" stroke-width="1" stroke-dasharray="4 3""#),
        );
        let _ = writeln!(
            s.0,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="start" fill="{c}" transform="rotate(-90 {:.1} {:.1})">{name}</text>"#,
            x + 4.0,
            TOP + 50.0 + 60.0 * i as f64,
            x + 4.0,
            TOP + 50.0 + 60.0 * i as f64,
        );
    }
    s.line(RIGHT_X, bottom, RIGHT_X + PANEL_W, bottom, AXIS);
    s.line(RIGHT_X, TOP, RIGHT_X, bottom, AXIS);
    s.text(
        RIGHT_X + PANEL_W / 2.0,
        bottom + 40.0,
        "middle",
        "",
        if log {
            "latency [usec] (log)"
        } else {
            "latency [usec]"
        },
    );
    let _ = writeln!(
        s.0,
        r#"<text x="{x:.1}" y="{y:.1}" text-anchor="middle" transform="rotate(-90 {x:.1} {y:.1})">samples per bin (log)</text>"#,
        x = RIGHT_X - 50.0,
        y = TOP + plot_h / 2.0
    );
    s.0.push_str("</svg>\n");
    Some(s.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_1_2_5_steps() {
        assert_eq!(nice_step(0.7), 1.0);
        assert_eq!(nice_step(1.3), 2.0);
        assert_eq!(nice_step(2533.0), 5000.0);
        assert_eq!(nice_step(7596.0), 10000.0);
        // not 12665 and 37996: 0, 10000, 20000, 30000, 40000
        let a = Axis::linear(37_996.0);
        assert_eq!(a.ticks, vec![0.0, 10_000.0, 20_000.0, 30_000.0, 40_000.0]);
        let l = Axis::log(0.85, 13_309.0);
        assert_eq!((l.lo, l.hi), (0.5, 20_000.0));
        assert_eq!(l.ticks, vec![1.0, 10.0, 100.0, 1000.0, 10_000.0]);
        let l = Axis::log(3.0, 40.0);
        assert_eq!(l.ticks, vec![2.0, 5.0, 10.0, 20.0, 50.0]);
        for (v, s) in [
            (0.0, "0"),
            (0.5, "0.5"),
            (12.25, "12.25"),
            (20000.0, "20000"),
        ] {
            assert_eq!(fmt_num(v), s);
        }
        assert_eq!(
            (0..5).map(pct_label).collect::<Vec<_>>(),
            ["0%", "90%", "99%", "99.9%", "99.99%"]
        );
    }

    #[test]
    fn bins_hold_every_sample_including_the_tail() {
        let mut v: Vec<f64> = (1..=10_000)
            .map(|i| 1.0 + f64::from(i % 7) * 0.01)
            .collect();
        v.push(5_000.0);
        v.sort_by(f64::total_cmp);
        let h = Histogram::new(&v, true).unwrap();
        assert_eq!(h.counts.iter().sum::<u64>(), 10_001);
        // the far outlier has its own bar at the top end (not dropped, not clipped)
        assert_eq!(*h.counts.last().unwrap(), 1);
        assert_eq!(h.edges.len(), h.counts.len() + 1);
        assert!((h.edges[BINS] - 5_000.0).abs() < 1e-6);
        let same = Histogram::new(&[2.0, 2.0], false).unwrap();
        assert_eq!(same.counts, vec![2]);
        assert!(Histogram::new(&[], false).is_none());
    }

    #[test]
    fn svg_has_both_panels_markers_and_labelled_axes() {
        let mut v: Vec<f64> = (0..100_000)
            .map(|i| 2.0 + f64::from(i % 100) * 0.01)
            .collect();
        v.extend([50.0, 400.0]);
        let svg = render("Send Latency Test 2 B, RTT/2", &v).unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        for want in [
            ">latency [usec]</text>",
            ">percentile (axis: 1/(1-p), log)</text>",
            ">samples per bin (log)</text>",
            ">99.99%</text>",
            ">p99.9</text>",
            ">p99.9 2.99 usec</text>",
            ">max 400 usec</text>",
            ">max</text>",
            "<path d=\"M",
        ] {
            assert!(svg.contains(want), "{want}");
        }
        // the tail spans 200x: latency axes are logarithmic with 1-2-5 ticks
        assert!(svg.contains(">latency [usec] (log)</text>"));
        assert!(svg.contains(">500</text>") && svg.contains(">1</text>"));
        // 100,002 samples: the line is thinned to what can be seen
        assert!(svg.len() < 200_000, "{} bytes", svg.len());
        assert!(render("t", &[]).is_none());
        assert!(
            render("a < b & c", &[1.0])
                .unwrap()
                .contains("a &lt; b &amp; c")
        );
    }
}
