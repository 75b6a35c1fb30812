//! `--cpu_cost`: the CPU time of each driver call on the data path (post_send, poll_cq), timed
//! with two clock reads around the call. What this project exists for is the CPU cost between
//! the application and the wire (`tools/bench` counts it in instructions); this shows it per
//! operation, next to the latency it produces. The clock reads' own cost is measured and
//! reported alongside.

use std::time::Instant;

use crate::stats::percentile;

/// Per-call times of one QP's driver calls.
#[derive(Debug, Clone, Default)]
pub struct CostLog {
    /// ns of each post_send call.
    pub post_ns: Vec<u32>,
    /// WRs posted by those calls.
    pub post_wrs: u64,
    /// ns of each poll call that returned completions.
    pub poll_ns: Vec<u32>,
    /// Completions those calls returned.
    pub poll_cqes: u64,
    /// Poll calls that found the CQ empty.
    pub empty_polls: u64,
    /// Their total time, ns.
    pub empty_ns: u64,
}

/// Nanoseconds since `t0`, saturated into `u32`.
pub fn ns_since(t0: Instant) -> u32 {
    u32::try_from(t0.elapsed().as_nanos()).unwrap_or(u32::MAX)
}

impl CostLog {
    /// Records a post_send of `wrs` WRs that took `ns`.
    pub fn post(&mut self, ns: u32, wrs: usize) {
        self.post_ns.push(ns);
        self.post_wrs += wrs as u64;
    }

    /// Records a poll that returned `n` completions and took `ns`.
    pub fn poll(&mut self, ns: u32, n: usize) {
        if n == 0 {
            self.empty_polls += 1;
            self.empty_ns += u64::from(ns);
        } else {
            self.poll_ns.push(ns);
            self.poll_cqes += n as u64;
        }
    }

    /// Adds `other` into `self`.
    pub fn merge(&mut self, other: &CostLog) {
        self.post_ns.extend_from_slice(&other.post_ns);
        self.post_wrs += other.post_wrs;
        self.poll_ns.extend_from_slice(&other.poll_ns);
        self.poll_cqes += other.poll_cqes;
        self.empty_polls += other.empty_polls;
        self.empty_ns += other.empty_ns;
    }
}

/// The cost of the timing itself: median of back-to-back `Instant::now()` pairs, ns.
pub fn clock_pair_ns() -> u32 {
    let mut v: Vec<f64> = (0..2001)
        .map(|_| {
            let t0 = Instant::now();
            f64::from(ns_since(t0))
        })
        .collect();
    v.sort_by(f64::total_cmp);
    percentile(&v, 50.0).unwrap_or(0.0) as u32
}

/// One row of the summary: calls, items, p50/p99 per call, mean per item.
fn summary(ns: &[u32], items: u64) -> serde_json::Value {
    let mut v: Vec<f64> = ns.iter().map(|&x| f64::from(x)).collect();
    v.sort_by(f64::total_cmp);
    let total: f64 = v.iter().sum();
    serde_json::json!({
        "calls": v.len(),
        "items": items,
        "p50_ns": percentile(&v, 50.0).unwrap_or(0.0),
        "p99_ns": percentile(&v, 99.0).unwrap_or(0.0),
        "mean_ns_per_item": if items > 0 { total / items as f64 } else { 0.0 },
    })
}

/// A post slower than this is counted as one that took the emulated doorbell's write fault
/// (or was preempted): a post that writes its WQE and rings takes well under it.
pub const SLOW_POST_NS: u32 = 1000;

/// Posts over [`SLOW_POST_NS`]: how many, and by how much they raise the mean per WR over
/// the mean of the others (ns; 0 when every post is fast or every post is slow).
pub fn slow_posts(log: &CostLog) -> (usize, f64) {
    let slow = log.post_ns.iter().filter(|&&t| t > SLOW_POST_NS).count();
    let fast = log.post_ns.len() - slow;
    if slow == 0 || fast == 0 || log.post_wrs == 0 {
        return (slow, 0.0);
    }
    let all: f64 = log.post_ns.iter().map(|&t| f64::from(t)).sum();
    let fast_sum: f64 = log
        .post_ns
        .iter()
        .filter(|&&t| t <= SLOW_POST_NS)
        .map(|&t| f64::from(t))
        .sum();
    // WRs per call as in the whole log, so that the two means are per WR alike
    let per_call = log.post_wrs as f64 / log.post_ns.len() as f64;
    let mean_all = all / log.post_wrs as f64;
    let mean_fast = fast_sum / (fast as f64 * per_call);
    (slow, (mean_all - mean_fast).max(0.0))
}

/// The JSON summary of a log.
pub fn to_json(log: &CostLog, clock_ns: u32) -> serde_json::Value {
    let (slow, inflation) = slow_posts(log);
    serde_json::json!({
        "slow_posts": slow,
        "slow_post_ns": SLOW_POST_NS,
        "slow_posts_add_ns_per_wr": (inflation * 10.0).round() / 10.0,
        "post_send": summary(&log.post_ns, log.post_wrs),
        "poll_cq": summary(&log.poll_ns, log.poll_cqes),
        "empty_polls": log.empty_polls,
        "empty_poll_mean_ns": if log.empty_polls > 0 { log.empty_ns as f64 / log.empty_polls as f64 } else { 0.0 },
        "clock_pair_ns": clock_ns,
    })
}

/// What `--cpu_cost` says on the emulator: its doorbell is not a device register.
pub fn emulated_doorbell_note(j: &serde_json::Value) -> String {
    format!(
        "   emulator: a doorbell store can take a write fault (MLX5_EMU_WAKE=fault, the default:\n   \
         the UAR page is write-protected between device scans; the first store after a scan runs\n   \
         the fault handler, which wakes the device thread); on a NIC it is one MMIO store.\n   \
         {} of {} post_send calls took over {} ns (the fault, or preemption), adding {:.1} ns\n   \
         per WR to the mean (p50 is unaffected); MLX5_EMU_WAKE=poll has no fault.\n",
        j["slow_posts"],
        j["post_send"]["calls"],
        j["slow_post_ns"],
        j["slow_posts_add_ns_per_wr"].as_f64().unwrap_or(0.0)
    )
}

/// The text block printed after the table.
pub fn to_text(j: &serde_json::Value) -> String {
    let f = |v: &serde_json::Value| v.as_f64().unwrap_or(0.0);
    let row = |name: &str, s: &serde_json::Value, items: &str, item: &str| {
        format!(
            "   {name:<16} calls {:<9} {items:<5} {:<9} p50 {:>6.0} ns  p99 {:>6.0} ns  per {item:<3} {:>6.1} ns\n",
            s["calls"],
            s["items"],
            f(&s["p50_ns"]),
            f(&s["p99_ns"]),
            f(&s["mean_ns_per_item"])
        )
    };
    let mut out = format!(
        " driver CPU time per call, both QPs (each timed by two clock reads costing {} ns together, included):\n",
        j["clock_pair_ns"]
    );
    out.push_str(&row("post_send", &j["post_send"], "WRs", "WR"));
    out.push_str(&row("poll_cq", &j["poll_cq"], "CQEs", "CQE"));
    out.push_str(&format!(
        "   {:<16} calls {:<9} mean {:.1} ns\n",
        "poll_cq (empty)",
        j["empty_polls"],
        f(&j["empty_poll_mean_ns"])
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slow_posts_are_counted_and_their_cost_isolated() {
        let mut a = CostLog::default();
        for _ in 0..98 {
            a.post(100, 1);
        }
        a.post(5100, 1);
        a.post(10_100, 1);
        let (n, add) = slow_posts(&a);
        assert_eq!(n, 2);
        // mean 250 ns per WR, 100 without the two slow ones
        assert!((add - 150.0).abs() < 1e-9, "{add}");
        let j = to_json(&a, 20);
        assert_eq!(j["slow_posts"], 2);
        assert_eq!(j["slow_posts_add_ns_per_wr"].as_f64(), Some(150.0));
        let note = emulated_doorbell_note(&j);
        assert!(
            note.contains("2 of 100 post_send calls took over 1000 ns"),
            "{note}"
        );
        assert!(note.contains("adding 150.0 ns\n"), "{note}");
        // none slow, or all slow: nothing to isolate
        let mut b = CostLog::default();
        b.post(100, 4);
        assert_eq!(slow_posts(&b), (0, 0.0));
        b = CostLog::default();
        b.post(2000, 1);
        assert_eq!(slow_posts(&b), (1, 0.0));
    }

    #[test]
    fn summary_counts_calls_and_items() {
        let mut a = CostLog::default();
        a.post(100, 1);
        a.post(300, 4);
        a.poll(50, 2);
        a.poll(10, 0);
        a.poll(30, 0);
        let mut b = CostLog::default();
        b.post(200, 1);
        a.merge(&b);
        let j = to_json(&a, 40);
        assert_eq!(j["post_send"]["calls"], 3);
        assert_eq!(j["post_send"]["items"], 6);
        assert_eq!(j["post_send"]["p50_ns"], 200.0);
        assert_eq!(j["post_send"]["mean_ns_per_item"], 100.0);
        assert_eq!(j["poll_cq"]["items"], 2);
        assert_eq!(j["poll_cq"]["mean_ns_per_item"], 25.0);
        assert_eq!(j["empty_polls"], 2);
        assert_eq!(j["empty_poll_mean_ns"], 20.0);
        let t = to_text(&j);
        assert!(
            t.contains("post_send") && t.contains("calls 3") && t.contains("40 ns"),
            "{t}"
        );
    }

    #[test]
    fn clock_pair_is_measured() {
        // two clock reads take some time, but far less than a millisecond
        assert!(clock_pair_ns() < 1_000_000);
    }
}
