//! Progress indication on stderr for runs longer than two seconds.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// Delay before the first progress report.
const QUIET_FOR: Duration = Duration::from_secs(2);

/// Reports `done/total` on stderr, but only once a run has lasted [`QUIET_FOR`]. On a terminal
/// the line is rewritten in place (4 times a second); otherwise one line is printed per second.
#[derive(Debug)]
pub struct Progress {
    label: String,
    total: u64,
    start: Instant,
    next: Instant,
    tty: bool,
    shown: bool,
}

impl Progress {
    /// Starts the clock for a run of `total` units (iterations, or seconds with `-D`).
    pub fn new(label: impl Into<String>, total: u64) -> Self {
        let start = Instant::now();
        Self {
            label: label.into(),
            total,
            start,
            next: start + QUIET_FOR,
            tty: std::io::stderr().is_terminal(),
            shown: false,
        }
    }

    /// Call often; does nothing until the next report is due. Cheap: one clock read.
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
        let pct = if self.total == 0 {
            100.0
        } else {
            100.0 * done as f64 / self.total as f64
        };
        let secs = (now - self.start).as_secs_f64();
        let mut err = std::io::stderr().lock();
        if self.tty {
            let _ = write!(
                err,
                "\r {}: {done}/{} ({pct:.0}%) {secs:.1} s ",
                self.label, self.total
            );
        } else {
            let _ = writeln!(
                err,
                " {}: {done}/{} ({pct:.0}%) {secs:.1} s",
                self.label, self.total
            );
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
