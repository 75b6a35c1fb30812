//! Progress indication on stderr for runs longer than two seconds.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// Delay before the first progress report.
const QUIET_FOR: Duration = Duration::from_secs(2);

/// What a run is limited by.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Goal {
    /// A number of iterations (`-n`).
    Iters(u64),
    /// A time (`-D`): the iterations done are counted, not foreseen.
    Time(Duration),
}

/// Reports progress on stderr, but only once a run has lasted [`QUIET_FOR`]. On a terminal
/// the line is rewritten in place (4 times a second); otherwise one line is printed per second.
#[derive(Debug)]
pub struct Progress {
    label: String,
    goal: Goal,
    start: Instant,
    next: Instant,
    tty: bool,
    shown: bool,
}

/// The progress text after `elapsed` with `done` iterations: `done/total (pct%)` for a count,
/// `done iterations, secs/limit s (pct%)` for a time limit.
pub fn line(label: &str, goal: Goal, done: u64, elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64();
    match goal {
        Goal::Iters(total) => {
            let pct = if total == 0 {
                100.0
            } else {
                100.0 * done as f64 / total as f64
            };
            format!("{label}: {done}/{total} ({pct:.0}%) {secs:.1} s")
        }
        Goal::Time(limit) => {
            let lim = limit.as_secs_f64();
            let pct = if lim > 0.0 {
                (100.0 * secs / lim).min(100.0)
            } else {
                100.0
            };
            format!("{label}: {done} iterations, {secs:.1}/{lim} s ({pct:.0}%)")
        }
    }
}

impl Progress {
    /// Starts the clock for a run of `total` iterations.
    pub fn new(label: impl Into<String>, total: u64) -> Self {
        Self::with_goal(label, Goal::Iters(total))
    }

    /// Starts the clock for a run of `iters` iterations, or of `duration` when given (`-D`).
    pub fn for_run(label: impl Into<String>, iters: u64, duration: Option<Duration>) -> Self {
        Self::with_goal(label, duration.map_or(Goal::Iters(iters), Goal::Time))
    }

    fn with_goal(label: impl Into<String>, goal: Goal) -> Self {
        let start = Instant::now();
        Self {
            label: label.into(),
            goal,
            start,
            next: start + QUIET_FOR,
            tty: std::io::stderr().is_terminal(),
            shown: false,
        }
    }

    /// Call often with the iterations done so far; does nothing until the next report is due.
    /// Cheap: one clock read.
    pub fn tick(&mut self, done: u64) {
        let now = Instant::now();
        if now < self.next {
            return;
        }
        self.next = now
            + if self.tty {
                Duration::from_millis(250)
            } else {
                Duration::from_secs(1)
            };
        let text = line(&self.label, self.goal, done, now - self.start);
        let mut err = std::io::stderr().lock();
        if self.tty {
            let _ = write!(err, "\r {text} ");
        } else {
            let _ = writeln!(err, " {text}");
        }
        let _ = err.flush();
        self.shown = true;
    }

    /// Whether anything was printed (a run that took over two seconds).
    pub fn shown(&self) -> bool {
        self.shown
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if self.shown && self.tty {
            // erase the progress line
            let _ = write!(std::io::stderr(), "\r\x1b[2K");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timed_run_counts_iterations_and_seconds() {
        // `-D 2` after 1 s and 39424 iterations: not "2/1000 (0%)"
        let t = line(
            "lat",
            Goal::Time(Duration::from_secs(2)),
            39_424,
            Duration::from_secs(1),
        );
        assert_eq!(t, "lat: 39424 iterations, 1.0/2 s (50%)");
        let t = line("bw", Goal::Iters(1000), 250, Duration::from_millis(2500));
        assert_eq!(t, "bw: 250/1000 (25%) 2.5 s");
        // past the limit (finishing the last CQ batch) it stays at 100%
        let t = line(
            "x",
            Goal::Time(Duration::from_secs(1)),
            5,
            Duration::from_secs(3),
        );
        assert!(t.ends_with("(100%)"), "{t}");
    }
}
