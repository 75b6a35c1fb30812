//! A latency histogram as a self-contained SVG file (hand-written; no plotting crate).

use std::fmt::Write as _;

use crate::stats::percentile;

/// Plot geometry, in SVG user units.
const WIDTH: f64 = 800.0;
const HEIGHT: f64 = 480.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;
const BINS: usize = 60;

/// The bins of a histogram.
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    /// Lower edge of the first bin.
    pub lo: f64,
    /// Width of one bin.
    pub width: f64,
    /// Samples per bin.
    pub counts: Vec<u64>,
    /// Samples above the last bin (outliers beyond 1.5 x p99.9), not drawn as bars.
    pub above: u64,
}

impl Histogram {
    /// Bins `samples` into at most [`BINS`] equal bins from the minimum up to the maximum, or to
    /// 1.5 x p99.9 when the maximum lies far beyond it (those samples are counted in `above`).
    pub fn new(samples: &[f64]) -> Option<Self> {
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        let lo = *sorted.first()?;
        let max = *sorted.last()?;
        let cap = percentile(&sorted, 99.9)? * 1.5;
        let hi = if max > cap && cap > lo { cap } else { max };
        let span = hi - lo;
        let nbins = if span > 0.0 {
            BINS.min(sorted.len().max(1))
        } else {
            1
        };
        let width = if span > 0.0 { span / nbins as f64 } else { 1.0 };
        let mut counts = vec![0u64; nbins];
        let mut above = 0;
        for &x in &sorted {
            if x > hi {
                above += 1;
                continue;
            }
            let i = (((x - lo) / width) as usize).min(nbins - 1);
            counts[i] += 1;
        }
        Some(Self {
            lo,
            width,
            counts,
            above,
        })
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Renders the histogram of `samples` (usec) with `title`. `None` when there are no samples.
pub fn render(title: &str, samples: &[f64]) -> Option<String> {
    let h = Histogram::new(samples)?;
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let ymax = h.counts.iter().copied().max().unwrap_or(1).max(1);
    let bar_w = plot_w / h.counts.len() as f64;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        s,
        r#"<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>"#
    );
    let mut full_title = format!("{title} ({} samples", samples.len());
    if h.above > 0 {
        let _ = write!(
            full_title,
            ", {} above {:.2} usec not drawn",
            h.above,
            h.lo + h.width * h.counts.len() as f64
        );
    }
    full_title.push(')');
    let _ = writeln!(
        s,
        r#"<text id="title" x="{}" y="25" text-anchor="middle" font-size="16">{}</text>"#,
        WIDTH / 2.0,
        escape(&full_title)
    );
    // bars
    let _ = writeln!(s, r##"<g id="bars" fill="#3b6ea8">"##);
    for (i, &c) in h.counts.iter().enumerate() {
        if c == 0 {
            continue;
        }
        let bh = plot_h * c as f64 / ymax as f64;
        let x = LEFT + i as f64 * bar_w;
        let y = TOP + plot_h - bh;
        let lo = h.lo + i as f64 * h.width;
        let _ = writeln!(
            s,
            r#"<rect x="{x:.2}" y="{y:.2}" width="{:.2}" height="{bh:.2}"><title>{lo:.3}..{:.3} usec: {c}</title></rect>"#,
            (bar_w - 1.0).max(0.5),
            lo + h.width
        );
    }
    let _ = writeln!(s, "</g>");
    // axes
    let x0 = LEFT;
    let y0 = TOP + plot_h;
    let _ = writeln!(
        s,
        r#"<g id="axes" stroke="black"><line x1="{x0}" y1="{y0}" x2="{}" y2="{y0}"/><line x1="{x0}" y1="{TOP}" x2="{x0}" y2="{y0}"/></g>"#,
        x0 + plot_w
    );
    // ticks: 5 on each axis
    for k in 0..=4 {
        let f = k as f64 / 4.0;
        let xv = h.lo + f * h.width * h.counts.len() as f64;
        let xp = x0 + f * plot_w;
        // The last label ends at the axis end so that it stays inside the canvas.
        let anchor = if k == 4 { "end" } else { "middle" };
        let _ = writeln!(
            s,
            r#"<text class="xtick" x="{xp:.2}" y="{}" text-anchor="{anchor}">{xv:.2}</text>"#,
            y0 + 18.0
        );
        let yv = (ymax as f64 * f).round() as u64;
        let yp = y0 - f * plot_h;
        let _ = writeln!(
            s,
            r#"<text class="ytick" x="{}" y="{:.2}" text-anchor="end">{yv}</text>"#,
            x0 - 6.0,
            yp + 4.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text id="xlabel" x="{:.2}" y="{}" text-anchor="middle">latency [usec]</text>"#,
        x0 + plot_w / 2.0,
        HEIGHT - 15.0
    );
    let _ = writeln!(
        s,
        r#"<text id="ylabel" x="18" y="{:.2}" text-anchor="middle" transform="rotate(-90 18 {:.2})">samples</text>"#,
        TOP + plot_h / 2.0,
        TOP + plot_h / 2.0
    );
    let _ = writeln!(s, "</svg>");
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bins_hold_every_sample() {
        let v: Vec<f64> = (0..1000).map(|i| 1.0 + (i % 100) as f64 * 0.01).collect();
        let h = Histogram::new(&v).unwrap();
        assert_eq!(h.counts.iter().sum::<u64>() + h.above, 1000);
        assert_eq!(h.above, 0);
        assert_eq!(h.counts.len(), BINS);
        assert!(Histogram::new(&[]).is_none());
        let flat = Histogram::new(&[2.0; 10]).unwrap();
        assert_eq!(flat.counts, vec![10]);
    }

    #[test]
    fn far_outliers_are_counted_not_drawn() {
        let mut v = vec![1.0; 5000];
        v.extend((0..5000).map(|i| 1.0 + i as f64 * 1e-4));
        v.push(1000.0);
        let h = Histogram::new(&v).unwrap();
        assert_eq!(h.above, 1);
        assert_eq!(h.counts.iter().sum::<u64>(), 10_000);
    }

    #[test]
    fn svg_is_xml_with_labelled_axes() {
        let v: Vec<f64> = (0..500)
            .map(|i| 0.8 + (i * 37 % 101) as f64 / 100.0)
            .collect();
        let text = render("Send Latency Test <2 B>", &v).unwrap();
        let doc = roxmltree::Document::parse(&text).expect("valid XML");
        let root = doc.root_element();
        assert_eq!(root.tag_name().name(), "svg");
        let by_id = |id: &str| {
            doc.descendants()
                .find(|n| n.attribute("id") == Some(id))
                .and_then(|n| n.text())
                .map(str::to_owned)
        };
        assert_eq!(by_id("xlabel").as_deref(), Some("latency [usec]"));
        assert_eq!(by_id("ylabel").as_deref(), Some("samples"));
        assert!(
            by_id("title")
                .unwrap()
                .starts_with("Send Latency Test <2 B> (500 samples")
        );
        // the bars' tooltips add up to all samples
        let total: u64 = doc
            .descendants()
            .filter(|n| {
                n.tag_name().name() == "title"
                    && n.parent().is_some_and(|p| p.tag_name().name() == "rect")
            })
            .map(|n| {
                n.text()
                    .unwrap()
                    .rsplit(' ')
                    .next()
                    .unwrap()
                    .parse::<u64>()
                    .unwrap()
            })
            .sum();
        assert_eq!(total, 500);
    }
}
