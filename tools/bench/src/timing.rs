//! Timing of regions (one call, or a batch of back-to-back calls): monotonic nanoseconds
//! and, on x86_64, TSC ticks.

use std::time::Instant;

/// Samples of one operation (one entry per timed region).
#[derive(Debug, Default)]
pub struct Samples {
    ns: Vec<u64>,
    ticks: Vec<u64>,
}

/// The time-stamp counter, or 0 where there is none.
#[inline(always)]
pub fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `rdtsc` only reads the time-stamp counter; it touches no memory and is
        // available on every x86_64 CPU (the intrinsic needs no target feature).
        unsafe { std::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        0
    }
}

impl Samples {
    /// Room for `n` samples.
    pub fn with_capacity(n: usize) -> Self {
        Self {
            ns: Vec::with_capacity(n),
            ticks: Vec::with_capacity(n),
        }
    }

    /// Run `f` once, timed, and keep the sample.
    #[inline(always)]
    pub fn time<R>(&mut self, f: impl FnOnce() -> R) -> R {
        let t0 = Instant::now();
        let k0 = ticks();
        let r = f();
        let k1 = ticks();
        let dt = t0.elapsed();
        self.ns.push(dt.as_nanos() as u64);
        self.ticks.push(k1.wrapping_sub(k0));
        r
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.ns.len()
    }

    /// Whether there is no sample.
    pub fn is_empty(&self) -> bool {
        self.ns.is_empty()
    }

    /// The `result` line for these samples, each a region of `batch` calls of `per_call` WRs
    /// (same format as the C harness prints), then clear.
    pub fn report(&mut self, op: &str, api: &str, batch: usize, per_call: u32) -> String {
        let line = format!(
            "result {op} {api} calls={} batch={batch} wrs_per_call={per_call} ns={} ticks={}",
            self.ns.len() * batch,
            median(&mut self.ns),
            median(&mut self.ticks)
        );
        self.ns.clear();
        self.ticks.clear();
        line
    }
}

/// The median (upper median for even counts) of `v`, 0 when empty; sorts `v`.
pub fn median(v: &mut [u64]) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&mut [5, 1, 3]), 3);
        assert_eq!(median(&mut [4, 1, 3, 2]), 3);
        assert_eq!(median(&mut []), 0);
    }

    #[test]
    fn samples_report_and_reset() {
        let mut s = Samples::with_capacity(4);
        for _ in 0..3 {
            s.time(|| std::hint::black_box(1 + 1));
        }
        assert_eq!(s.len(), 3);
        let line = s.report("op", "api", 4, 2);
        assert!(
            line.starts_with("result op api calls=12 batch=4 wrs_per_call=2 ns="),
            "{line}"
        );
        assert!(s.is_empty());
    }
}
