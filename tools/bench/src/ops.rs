//! The measured operations and the two API levels.

/// One measured operation at one API level.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpSpec {
    /// Operation key: `send_inline64`, `send_sge64`, `chain32`, `poll_cqe`, `recv1`,
    /// `recv_chain32`, `poll_recv`.
    pub op: &'static str,
    /// API level: `verbs`, `lowlevel` or `unchecked` (the `unsafe` tier).
    pub api: &'static str,
    /// Work requests (or CQEs) per wrapper call; costs are reported per WR.
    pub per_call: u32,
    /// What the row means, for the table.
    pub label: &'static str,
    /// The `mlx5` crate calls measured.
    pub ours: &'static str,
    /// The libibverbs/libmlx5 calls measured.
    pub theirs: &'static str,
}

impl OpSpec {
    /// Name of our wrapper function (`bench_rs_<op>_<api>`), a callgrind toggle.
    pub fn ours_symbol(&self) -> String {
        format!("bench_rs_{}_{}", self.op, self.api)
    }

    /// Name of the C harness's wrapper function (`bench_c_<op>_<api>`).
    pub fn theirs_symbol(&self) -> String {
        if self.api == "unchecked" {
            // libmlx5 has no unchecked tier: a name the C harness does not define (no figure).
            return format!("bench_c_none_{}_{}", self.op, self.api);
        }
        format!("bench_c_{}_{}", self.op_c(), self.api_c())
    }

    fn op_c(&self) -> &'static str {
        match self.op {
            "send_inline64" => "send_inline",
            "send_inline32" => "send_inline32",
            "send_sge64" => "send_sge",
            "chain32" => "chain",
            "recv1" => "recv",
            "recv_chain32" => "recv_chain",
            "poll_recv" => "poll_recv",
            _ => "poll",
        }
    }

    fn api_c(&self) -> &'static str {
        if self.api == "verbs" { "verbs" } else { "wr" }
    }
}

/// CQEs in the CQ when a polling batch starts (the unchecked batch poller takes them in one
/// call).
pub const FILL_CQES: u32 = 2 * CHAIN as u32;

/// WRs per chain in `chain32`.
pub const CHAIN: usize = 32;
/// Payload bytes of every SEND.
pub const PAYLOAD: usize = 64;

/// Payload bytes of the one-WQEBB inline SEND (`send_inline32`: ctrl + 4-byte header + 32
/// bytes = 3 units, one WQEBB).
pub const PAYLOAD_SMALL: usize = 32;

/// Every row of the table, in order.
pub const OPS: [OpSpec; 24] = [
    OpSpec {
        op: "send_inline32",
        api: "verbs",
        per_call: 1,
        label: "post 1 inline 32 B SEND (1 WQEBB, BF)",
        ours: "Qp::post_send",
        theirs: "ibv_post_send",
    },
    OpSpec {
        op: "send_inline32",
        api: "lowlevel",
        per_call: 1,
        label: "post 1 inline 32 B SEND (1 WQEBB, BF)",
        ours: "send_inline_now",
        theirs: "ibv_wr_*",
    },
    OpSpec {
        op: "send_inline64",
        api: "verbs",
        per_call: 1,
        label: "post 1 inline 64 B SEND (BlueFlame)",
        ours: "Qp::post_send",
        theirs: "ibv_post_send",
    },
    OpSpec {
        op: "send_inline64",
        api: "lowlevel",
        per_call: 1,
        label: "post 1 inline 64 B SEND (BlueFlame)",
        ours: "send_inline_now",
        theirs: "ibv_wr_*",
    },
    OpSpec {
        op: "send_sge64",
        api: "verbs",
        per_call: 1,
        label: "post 1 SEND, 1 SGE (8 B doorbell)",
        ours: "Qp::post_send",
        theirs: "ibv_post_send",
    },
    OpSpec {
        op: "send_sge64",
        api: "lowlevel",
        per_call: 1,
        label: "post 1 SEND, 1 SGE (8 B doorbell)",
        ours: "send/sge/finish/ring",
        theirs: "ibv_wr_*",
    },
    OpSpec {
        op: "chain32",
        api: "verbs",
        per_call: CHAIN as u32,
        label: "post chain of 32 SENDs (per WR)",
        ours: "Qp::post_send",
        theirs: "ibv_post_send",
    },
    OpSpec {
        op: "chain32",
        api: "lowlevel",
        per_call: CHAIN as u32,
        label: "post chain of 32 SENDs (per WR)",
        ours: "send/sge/finish x32, ring",
        theirs: "ibv_wr_*",
    },
    OpSpec {
        op: "poll_cqe",
        api: "verbs",
        per_call: 1,
        label: "poll 1 CQE (CQ holds 64)",
        ours: "Cq::poll",
        theirs: "ibv_poll_cq",
    },
    OpSpec {
        op: "poll_cqe",
        api: "lowlevel",
        per_call: 1,
        label: "poll 1 CQE (CQ holds 64)",
        ours: "RawCq::next/retire/publish_ci",
        theirs: "ibv_start/end_poll",
    },
    OpSpec {
        op: "recv1",
        api: "verbs",
        per_call: 1,
        label: "post 1 receive, 1 SGE",
        ours: "Qp::post_recv",
        theirs: "ibv_post_recv",
    },
    OpSpec {
        op: "recv1",
        api: "lowlevel",
        per_call: 1,
        label: "post 1 receive, 1 SGE",
        ours: "RecvQueue::push/publish",
        theirs: "ibv_post_recv (only API)",
    },
    OpSpec {
        op: "recv_chain32",
        api: "verbs",
        per_call: CHAIN as u32,
        label: "post chain of 32 receives (per WR)",
        ours: "Qp::post_recv",
        theirs: "ibv_post_recv",
    },
    OpSpec {
        op: "recv_chain32",
        api: "lowlevel",
        per_call: CHAIN as u32,
        label: "post chain of 32 receives (per WR)",
        ours: "push x32, publish",
        theirs: "ibv_post_recv (only API)",
    },
    OpSpec {
        op: "poll_recv",
        api: "verbs",
        per_call: 1,
        label: "poll 1 receive CQE (SEND, CQ holds 64)",
        ours: "Cq::poll",
        theirs: "ibv_poll_cq",
    },
    OpSpec {
        op: "poll_recv",
        api: "lowlevel",
        per_call: 1,
        label: "poll 1 receive CQE (SEND, CQ holds 64)",
        ours: "RawCq::next/RecvQueue::retire/publish_ci",
        theirs: "ibv_start/end_poll",
    },
    // The unchecked tier (`unsafe fn`s, contracts instead of checks; no libmlx5 counterpart).
    OpSpec {
        op: "send_inline32",
        api: "unchecked",
        per_call: 1,
        label: "post 1 inline 32 B SEND (1 WQEBB, BF)",
        ours: "send_inline_unchecked",
        theirs: "-",
    },
    OpSpec {
        op: "send_inline64",
        api: "unchecked",
        per_call: 1,
        label: "post 1 inline 64 B SEND (BlueFlame)",
        ours: "send_inline_unchecked",
        theirs: "-",
    },
    OpSpec {
        op: "write_inline8",
        api: "unchecked",
        per_call: 1,
        label: "post 1 inline 8 B RDMA WRITE (BF; UCX put_short 216-263)",
        ours: "write_inline_unchecked",
        theirs: "-",
    },
    OpSpec {
        op: "chain32",
        api: "unchecked",
        per_call: CHAIN as u32,
        label: "post chain of 32 SENDs (per WR)",
        ours: "credits + unchecked(send_sge x32)",
        theirs: "-",
    },
    OpSpec {
        op: "poll_cqe",
        api: "unchecked",
        per_call: FILL_CQES,
        label: "poll 1 CQE (CQ holds 64)",
        ours: "poll_batch_unchecked (64 per call)",
        theirs: "-",
    },
    OpSpec {
        op: "recv1",
        api: "unchecked",
        per_call: 1,
        label: "post 1 receive, 1 SGE",
        ours: "push_unchecked/publish",
        theirs: "-",
    },
    OpSpec {
        op: "recv_chain32",
        api: "unchecked",
        per_call: CHAIN as u32,
        label: "post chain of 32 receives (per WR)",
        ours: "push_unchecked x32, publish",
        theirs: "-",
    },
    OpSpec {
        op: "poll_recv",
        api: "unchecked",
        per_call: 1,
        label: "poll 1 receive CQE (SEND, CQ holds 64)",
        ours: "RecvQueue::poll_unchecked",
        theirs: "-",
    },
];

/// One side's timer figures for one operation, per WR.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TimeResult {
    /// Measured wrapper calls.
    pub calls: u64,
    /// WRs (or CQEs) per call.
    pub per_call: u32,
    /// Median nanoseconds per WR, timer overhead subtracted.
    pub ns: f64,
    /// Median TSC ticks per WR, timer overhead subtracted (`None` without a TSC).
    pub ticks: Option<f64>,
}

/// One `result` line as printed by both sides.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResultLine {
    /// Operation key (or `timer_overhead`, `warmup`).
    pub op: String,
    /// API level.
    pub api: String,
    /// Wrapper calls in total.
    pub calls: u64,
    /// Calls per timed region.
    pub batch: u64,
    /// WRs per call.
    pub per_call: u32,
    /// Median nanoseconds per timed region.
    pub ns: u64,
    /// Median TSC ticks per timed region (0: no TSC).
    pub ticks: u64,
}

/// Parse the `result <op> <api> calls=.. batch=.. wrs_per_call=.. ns=.. ticks=..` lines both
/// sides print; other lines are skipped.
pub fn parse_results(text: &str) -> Vec<ResultLine> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut it = line.split_whitespace();
        if it.next() != Some("result") {
            continue;
        }
        let (Some(op), Some(api)) = (it.next(), it.next()) else {
            continue;
        };
        let mut vals = [None::<u64>; 5];
        for kv in it {
            let Some((k, v)) = kv.split_once('=') else {
                continue;
            };
            let slot = match k {
                "calls" => 0,
                "batch" => 1,
                "wrs_per_call" => 2,
                "ns" => 3,
                "ticks" => 4,
                _ => continue,
            };
            vals[slot] = v.parse().ok();
        }
        if let [
            Some(calls),
            Some(batch),
            Some(per_call),
            Some(ns),
            Some(ticks),
        ] = vals
        {
            out.push(ResultLine {
                op: op.to_string(),
                api: api.to_string(),
                calls,
                batch: batch.max(1),
                per_call: u32::try_from(per_call).unwrap_or(u32::MAX).max(1),
                ns,
                ticks,
            });
        }
    }
    out
}

/// Turn the `result` lines into per-WR [`TimeResult`]s of the known operations: the median
/// region time minus the median empty-region time (`timer_overhead`), divided by the WRs in
/// a region.
pub fn time_results(text: &str) -> Vec<(OpSpec, TimeResult)> {
    let rows = parse_results(text);
    let (o_ns, o_tk) = rows
        .iter()
        .find(|r| r.op == "timer_overhead")
        .map_or((0, 0), |r| (r.ns, r.ticks));
    let mut out = Vec::new();
    for spec in OPS {
        if let Some(r) = rows.iter().find(|r| r.op == spec.op && r.api == spec.api) {
            let wrs = (r.batch * u64::from(r.per_call)) as f64;
            out.push((
                spec,
                TimeResult {
                    calls: r.calls,
                    per_call: r.per_call,
                    ns: r.ns.saturating_sub(o_ns) as f64 / wrs,
                    ticks: (r.ticks > 0).then(|| r.ticks.saturating_sub(o_tk) as f64 / wrs),
                },
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_lines_parse_and_overhead_is_subtracted() {
        let text = "info x=1\n\
            result timer_overhead none calls=10 batch=1 wrs_per_call=1 ns=20 ticks=30\n\
            result chain32 verbs calls=5 batch=1 wrs_per_call=32 ns=660 ticks=990\n\
            result poll_cqe lowlevel calls=128 batch=64 wrs_per_call=1 ns=660 ticks=0\n\
            result bogus\n";
        let r = time_results(text);
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].0.op, "chain32");
        assert_eq!(r[0].1.calls, 5);
        assert!((r[0].1.ns - 20.0).abs() < 1e-9);
        assert_eq!(r[0].1.ticks, Some(30.0));
        assert_eq!((r[1].0.op, r[1].0.api), ("poll_cqe", "lowlevel"));
        assert!((r[1].1.ns - 10.0).abs() < 1e-9);
        assert_eq!(r[1].1.ticks, None);
    }

    #[test]
    fn symbols_are_distinct() {
        let mut names: Vec<String> = OPS
            .iter()
            .flat_map(|s| [s.ours_symbol(), s.theirs_symbol()])
            .collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), 2 * OPS.len());
        // No name is a prefix of another (callgrind toggles are matched as patterns).
        for a in &names {
            for b in &names {
                assert!(a == b || !b.starts_with(a.as_str()), "{a} / {b}");
            }
        }
    }
}
