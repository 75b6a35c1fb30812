//! Latency statistics over a complete sample set.
//!
//! perftest sorts its samples, silently drops the two largest (`LAT_MEASURE_TAIL`) and computes
//! the standard deviation with integer intermediates, so deviations under 1 usec vanish. Here
//! every sample is kept, the deviation is a true population standard deviation in `f64`, and
//! the percentiles use the nearest-rank definition on the full sorted set, except the 50th:
//! `p50` is perftest's median (`get_median` in its `perftest_parameters.c`: the middle sample,
//! or the mean of the two middle ones for an even count), the value printed as `t_typical`, so
//! that one report never shows two different medians.

/// Summary of one latency run, all values in microseconds.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LatencyStats {
    /// Number of samples (nothing dropped).
    pub samples: usize,
    /// Smallest sample.
    pub min: f64,
    /// Largest sample (perftest's `t_max` would be the third largest).
    pub max: f64,
    /// Median: the middle sample, or the mean of the two middle samples for an even count
    /// (perftest's `t_typical`).
    pub median: f64,
    /// Arithmetic mean.
    pub avg: f64,
    /// Population standard deviation (divides by n), computed in `f64`.
    pub stdev: f64,
    /// The median again, as perftest defines it: equal to `median` (`t_typical`) by
    /// construction.
    pub p50: f64,
    /// Nearest-rank 99th percentile.
    pub p99: f64,
    /// Nearest-rank 99.9th percentile.
    pub p99_9: f64,
    /// Nearest-rank 99.99th percentile.
    pub p99_99: f64,
}

/// Nearest-rank percentile of an ascending slice: the smallest sample such that at least
/// `pct` percent of the samples are less than or equal to it. `None` for an empty slice.
pub fn percentile(sorted: &[f64], pct: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let n = sorted.len();
    // rank = ceil(pct/100 * n), clamped to 1..=n. Computed in integer per-million steps so that
    // e.g. 99.9% of 1000 is exactly rank 999 (f64 would give 999.0000000000001 -> 1000).
    let ppm = (pct * 10_000.0).round().clamp(0.0, 1_000_000.0) as u128;
    let rank = (ppm * n as u128).div_ceil(1_000_000).clamp(1, n as u128) as usize;
    Some(sorted[rank - 1])
}

impl LatencyStats {
    /// Computes the statistics of `samples` (any order; NaNs are not expected and sort last).
    /// Returns `None` when there are no samples.
    pub fn from_samples(samples: &[f64]) -> Option<Self> {
        if samples.is_empty() {
            return None;
        }
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        Self::from_sorted(&sorted)
    }

    /// As [`LatencyStats::from_samples`] for an already ascending slice.
    pub fn from_sorted(sorted: &[f64]) -> Option<Self> {
        let n = sorted.len();
        let first = *sorted.first()?;
        let last = *sorted.last()?;
        let median = if n % 2 == 1 {
            sorted[n / 2]
        } else {
            (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
        };
        let avg = sorted.iter().sum::<f64>() / n as f64;
        let var = sorted.iter().map(|x| (x - avg) * (x - avg)).sum::<f64>() / n as f64;
        Some(Self {
            samples: n,
            min: first,
            max: last,
            median,
            avg,
            stdev: var.sqrt(),
            p50: median,
            p99: percentile(sorted, 99.0)?,
            p99_9: percentile(sorted, 99.9)?,
            p99_99: percentile(sorted, 99.99)?,
        })
    }
}

/// Summary of one bandwidth run.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct BwStats {
    /// Message size in bytes.
    pub bytes: u64,
    /// Messages completed.
    pub iterations: u64,
    /// perftest's peak, MiB/s: the message size over the least average time per message of any
    /// span of messages i..=j, from the post of message i to the completion of message j. 0
    /// when not computed (`-N`, `-D`, or more than [`PEAK_MAX_ITERS`] messages, as perftest).
    pub bw_peak_mib: f64,
    /// Total bytes over the time from the first post to the last completion, MiB/s.
    pub bw_average_mib: f64,
    /// Messages per second over the same time, in millions.
    pub msg_rate_mpps: f64,
    /// Messages in the span that gave the peak (0 when no peak was computed).
    pub peak_window: usize,
}

const MIB: f64 = 1024.0 * 1024.0;

/// perftest computes the peak only for runs of up to this many messages (`-N` is implied
/// beyond, as its `--help` says).
pub const PEAK_MAX_ITERS: usize = 20_000;

/// Indices where a run of equal values ends (`last == true`) or starts: the messages of one
/// post list share their post time, those one CQE retires share its completion time.
fn group_edges(t: &[u64], last: bool) -> Vec<usize> {
    (0..t.len())
        .filter(|&k| {
            if last {
                k + 1 == t.len() || t[k + 1] != t[k]
            } else {
                k == 0 || t[k - 1] != t[k]
            }
        })
        .collect()
}

impl BwStats {
    /// Computes bandwidth figures from the post time (ns) and the completion time (ns, same
    /// clock, non-decreasing) of every message. With `peak`, the peak as perftest computes it:
    /// `min over i <= j of (completed[j] - posted[i]) / (j - i + 1)`, over the first message
    /// of each post list and the last message of each CQE (the other messages share those
    /// times and can only give longer per-message times). `None` when nothing completed or no
    /// time elapsed.
    pub fn from_completions(
        bytes: u64,
        posted_ns: &[u64],
        completed_ns: &[u64],
        peak: bool,
    ) -> Option<Self> {
        let n = completed_ns.len();
        let first = *posted_ns.first()?;
        let last = *completed_ns.last()?;
        let total_ns = last.checked_sub(first).filter(|&t| t > 0)?;
        let total_s = total_ns as f64 * 1e-9;
        let avg = bytes as f64 * n as f64 / total_s / MIB;
        let (mut peak_mib, mut window) = (0.0, 0);
        if peak && n <= PEAK_MAX_ITERS && posted_ns.len() >= n {
            let starts = group_edges(&posted_ns[..n], false);
            let ends = group_edges(completed_ns, true);
            // best per-message time as a fraction dt / msgs, compared without division
            let (mut best_dt, mut best_msgs) = (u64::MAX, 1u64);
            for &j in &ends {
                for &i in starts.iter().take_while(|&&i| i <= j) {
                    let Some(dt) = completed_ns[j].checked_sub(posted_ns[i]) else {
                        continue;
                    };
                    let msgs = (j - i + 1) as u64;
                    if dt > 0
                        && u128::from(dt) * u128::from(best_msgs)
                            < u128::from(best_dt) * u128::from(msgs)
                    {
                        (best_dt, best_msgs) = (dt, msgs);
                    }
                }
            }
            if best_dt != u64::MAX {
                peak_mib = bytes as f64 * best_msgs as f64 / (best_dt as f64 * 1e-9) / MIB;
                window = best_msgs as usize;
            }
        }
        Some(Self {
            bytes,
            iterations: n as u64,
            bw_peak_mib: peak_mib,
            bw_average_mib: avg,
            msg_rate_mpps: n as f64 / total_s / 1e6,
            peak_window: window,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn classic_population_stdev_is_exact() {
        // The textbook set whose population standard deviation is exactly 2.
        let s = LatencyStats::from_samples(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]).unwrap();
        assert_eq!(s.samples, 8);
        assert!(close(s.avg, 5.0), "{}", s.avg);
        assert!(close(s.stdev, 2.0), "{}", s.stdev);
        assert!(close(s.min, 2.0));
        assert!(close(s.max, 9.0));
        // even count: mean of the two middle samples (4 and 5)
        assert!(close(s.median, 4.5), "{}", s.median);
        // p50 is that same median (perftest's get_median), not the nearest-rank 4th sample
        assert!(close(s.p50, 4.5), "{}", s.p50);
        assert!(close(
            percentile(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0], 50.0).unwrap(),
            4.0
        ));
    }

    /// perftest's `get_median` written out from its definition, to compare with.
    fn perftest_median(sorted: &[f64]) -> f64 {
        let n = sorted.len();
        if (n - 1) % 2 != 0 {
            (sorted[n / 2] + sorted[n / 2 - 1]) / 2.0
        } else {
            sorted[n / 2]
        }
    }

    #[test]
    fn p50_is_t_typical_on_random_sets() {
        // xorshift: sets of 1..=400 samples with ties and a heavy tail, odd and even counts
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..500 {
            let n = (next() % 400 + 1) as usize;
            let v: Vec<f64> = (0..n)
                .map(|_| {
                    let r = next();
                    let base = (r % 50) as f64 / 8.0;
                    if r % 97 == 0 { base * 1000.0 } else { base }
                })
                .collect();
            let s = LatencyStats::from_samples(&v).unwrap();
            let mut sorted = v.clone();
            sorted.sort_by(f64::total_cmp);
            assert_eq!(s.p50.to_bits(), s.median.to_bits(), "{v:?}");
            assert_eq!(
                s.median.to_bits(),
                perftest_median(&sorted).to_bits(),
                "{v:?}"
            );
        }
    }

    #[test]
    fn sub_microsecond_stdev_is_not_truncated() {
        // perftest's integer arithmetic would report 0 here.
        let samples = [1.00, 1.02, 1.04, 1.06];
        let s = LatencyStats::from_samples(&samples).unwrap();
        let mean = 1.03;
        let var = samples.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / 4.0;
        assert!(close(s.stdev, var.sqrt()), "{}", s.stdev);
        assert!(s.stdev > 0.02 && s.stdev < 0.03, "{}", s.stdev);
    }

    #[test]
    fn percentiles_on_one_to_ten_thousand() {
        // samples 1..=10000 shuffled deterministically: rank r holds value r.
        let mut v: Vec<f64> = (1..=10_000).map(f64::from).collect();
        v.reverse();
        v.swap(17, 9_000);
        let s = LatencyStats::from_samples(&v).unwrap();
        assert!(close(s.p50, 5_000.5), "{}", s.p50);
        assert!(close(s.p99, 9_900.0), "{}", s.p99);
        assert!(close(s.p99_9, 9_990.0), "{}", s.p99_9);
        assert!(close(s.p99_99, 9_999.0), "{}", s.p99_99);
        assert!(close(s.max, 10_000.0));
        assert!(close(s.min, 1.0));
        assert!(close(s.median, 5_000.5), "{}", s.median);
        assert!(close(s.avg, 5_000.5));
        // population stdev of 1..=n is sqrt((n^2 - 1) / 12)
        assert!(
            close(s.stdev, ((1e8 - 1.0) / 12.0f64).sqrt()),
            "{}",
            s.stdev
        );
    }

    #[test]
    fn nothing_is_dropped_from_the_tail() {
        // perftest would drop the two outliers and report t_max = 1.0.
        let mut v = vec![1.0; 98];
        v.push(50.0);
        v.push(100.0);
        let s = LatencyStats::from_samples(&v).unwrap();
        assert_eq!(s.samples, 100);
        assert!(close(s.max, 100.0));
        // 99% of 100 = rank 99 -> the 50.0 outlier
        assert!(close(s.p99, 50.0), "{}", s.p99);
        assert!(close(s.p99_9, 100.0));
        assert!(close(s.avg, (98.0 + 150.0) / 100.0));
    }

    #[test]
    fn percentile_edge_cases() {
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(percentile(&[3.0], 0.0), Some(3.0));
        assert_eq!(percentile(&[3.0], 99.99), Some(3.0));
        assert_eq!(percentile(&[1.0, 2.0, 3.0], 100.0), Some(3.0));
        // 99.9% of 1000 is rank 999 exactly, not 1000 through rounding error
        let v: Vec<f64> = (1..=1000).map(f64::from).collect();
        assert_eq!(percentile(&v, 99.9), Some(999.0));
        assert!(LatencyStats::from_samples(&[]).is_none());
        let one = LatencyStats::from_samples(&[7.5]).unwrap();
        assert!(close(one.median, 7.5) && close(one.stdev, 0.0));
    }

    #[test]
    fn bandwidth_from_even_completions() {
        // 1000 messages of 1 MiB posted back to back at t=0, one completing every microsecond:
        // 1000 MiB in 1 ms = 1e6 MiB/s, 1 Mpps; every span from the start is as good, and the
        // first one found (as perftest's strict comparison) is kept.
        let posted = vec![0u64; 1000];
        let done: Vec<u64> = (1..=1000).map(|i| i * 1_000).collect();
        let b = BwStats::from_completions(1 << 20, &posted, &done, true).unwrap();
        assert_eq!(b.iterations, 1000);
        assert!(
            (b.bw_average_mib - 1e6).abs() < 1e-3,
            "{}",
            b.bw_average_mib
        );
        assert!((b.msg_rate_mpps - 1.0).abs() < 1e-9);
        assert!((b.bw_peak_mib - 1e6).abs() < 1e-3, "{}", b.bw_peak_mib);
        assert_eq!(b.peak_window, 1);
        let none = BwStats::from_completions(1 << 20, &posted, &done, false).unwrap();
        assert_eq!((none.bw_peak_mib, none.peak_window), (0.0, 0));
    }

    #[test]
    fn peak_is_perftests_post_to_completion_span_not_a_completion_burst() {
        // The failure the issue measured: 16-WR post lists, a CQE every 32 WRs, the device
        // slow (10 us per message) but CQEs reaped in bursts. A window over completion times
        // alone sees two CQEs reaped 1 us apart (64 messages) and reports a peak 160 times the
        // average; perftest's span from a post to a completion cannot beat the device's rate.
        let n = 320u64;
        let posted: Vec<u64> = (0..n).map(|i| (i / 16) * 160_000).collect();
        // CQE k (messages 32k..32k+31) is due at (k+1) * 320 us, reaped in pairs
        let done: Vec<u64> = (0..n)
            .map(|i| {
                let k = i / 32;
                let due = (k | 1) * 320_000 + 320_000;
                due + (k & 1) * 1_000
            })
            .collect();
        let b = BwStats::from_completions(64, &posted, &done, true).unwrap();
        assert!(
            b.bw_peak_mib < 2.5 * b.bw_average_mib,
            "peak {} vs average {}",
            b.bw_peak_mib,
            b.bw_average_mib
        );
        assert!(b.bw_peak_mib >= b.bw_average_mib);
    }

    #[test]
    fn bandwidth_peak_sees_a_fast_burst() {
        // 200 messages posted and completed 1 us apart (one at a time), then 20 posted
        // together at 200 us and all done 2 us later.
        let mut posted: Vec<u64> = (0..200).map(|i| i * 1_000).collect();
        let mut done: Vec<u64> = (1..=200).map(|i| i * 1_000).collect();
        posted.extend([200_000; 20]);
        done.extend([202_000; 20]);
        let b = BwStats::from_completions(1024, &posted, &done, true).unwrap();
        // best span: the 20 in 2 us = 1e7 msg/s * 1 KiB
        let expect = 1024.0 * 1e7 / MIB;
        assert!(
            (b.bw_peak_mib - expect).abs() < 1e-6,
            "{} vs {}",
            b.bw_peak_mib,
            expect
        );
        assert_eq!(b.peak_window, 20);
        assert!(b.bw_peak_mib > 5.0 * b.bw_average_mib);
        assert!(BwStats::from_completions(8, &[10], &[], true).is_none());
        assert!(BwStats::from_completions(8, &[10], &[10], true).is_none());
        // more than perftest's limit: no peak
        let many = vec![0u64; PEAK_MAX_ITERS + 1];
        let fin: Vec<u64> = (1..=PEAK_MAX_ITERS as u64 + 1).collect();
        let b = BwStats::from_completions(8, &many, &fin, true).unwrap();
        assert_eq!(b.bw_peak_mib, 0.0);
    }
}
