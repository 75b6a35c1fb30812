//! Which file descriptors and mappings of the host process belong to the emulator.
//!
//! Lookups happen on every intercepted `write`/`ioctl`/`close` of the process, so
//! descriptor membership is a lock-free bitmap: a descriptor that is not ours (stderr, a
//! socket, ...) never takes a lock, even from a signal handler that interrupted a lookup.
//! Mappings have an atomic population count that lets the common case (no emulated
//! mapping) skip their lock. Surfaces are handed out as `Arc` clones and every lock is
//! released before the caller talks to the emulator: the emulator itself calls
//! `close`/`mmap`/`munmap` (which land in our interposers again).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use mlx5_emu::UverbsSurface;

/// An open emulated device file, as seen through one descriptor number.
#[derive(Clone, Debug)]
pub(crate) struct DevFile {
    /// Index of the HCA (`uverbs<hca>`).
    pub(crate) hca: usize,
    /// The emulator's open file (shared by `dup`ed descriptors and live mappings).
    pub(crate) surface: Arc<dyn UverbsSurface>,
}

#[derive(Debug)]
struct Mapping {
    addr: usize,
    len: usize,
    file: DevFile,
}

/// Descriptors below this number are tracked in the bitmap.
const BITMAP_FDS: usize = 4096;

/// The tables. One static instance lives in the shim; tests make their own.
#[derive(Debug)]
pub(crate) struct Registry {
    fds: Mutex<Vec<(i32, DevFile)>>,
    /// Bit `fd` set while `fd` (< [`BITMAP_FDS`]) is in `fds`. Written under the `fds` lock.
    bitmap: [AtomicU64; BITMAP_FDS / 64],
    /// Entries in `fds` at or above [`BITMAP_FDS`].
    high_fds: AtomicUsize,
    maps: Mutex<Vec<Mapping>>,
    map_count: AtomicUsize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Registry {
    /// Empty tables.
    pub(crate) const fn new() -> Self {
        Self {
            fds: Mutex::new(Vec::new()),
            bitmap: [const { AtomicU64::new(0) }; BITMAP_FDS / 64],
            high_fds: AtomicUsize::new(0),
            maps: Mutex::new(Vec::new()),
            map_count: AtomicUsize::new(0),
        }
    }

    /// Record that descriptor `fd` now refers to `file`. Returns the entry it replaced (a
    /// stale one: the number was reused behind our back), to be dropped by the caller
    /// outside any lock.
    pub(crate) fn insert_fd(&self, fd: i32, file: DevFile) -> Option<DevFile> {
        let mut fds = lock(&self.fds);
        let old = fds
            .iter()
            .position(|(f, _)| *f == fd)
            .map(|i| fds.swap_remove(i).1);
        fds.push((fd, file));
        if old.is_none() {
            self.mark(fd, true);
        }
        old
    }

    /// Record (`ours`) or clear the membership of `fd`; called with the `fds` lock held.
    fn mark(&self, fd: i32, ours: bool) {
        match usize::try_from(fd) {
            Ok(n) if n < BITMAP_FDS => {
                let bit = 1u64 << (n % 64);
                if ours {
                    self.bitmap[n / 64].fetch_or(bit, Ordering::Release);
                } else {
                    self.bitmap[n / 64].fetch_and(!bit, Ordering::Release);
                }
            }
            _ if ours => {
                self.high_fds.fetch_add(1, Ordering::Release);
            }
            _ => {
                self.high_fds.fetch_sub(1, Ordering::Release);
            }
        }
    }

    /// Whether `fd` may be ours, without taking a lock (exact below [`BITMAP_FDS`]).
    fn maybe_ours(&self, fd: i32) -> bool {
        match usize::try_from(fd) {
            Ok(n) if n < BITMAP_FDS => {
                self.bitmap[n / 64].load(Ordering::Acquire) & (1u64 << (n % 64)) != 0
            }
            Ok(_) => self.high_fds.load(Ordering::Acquire) != 0,
            Err(_) => false,
        }
    }

    /// The emulated file behind `fd`, if it is one of ours.
    pub(crate) fn fd(&self, fd: i32) -> Option<DevFile> {
        if !self.maybe_ours(fd) {
            return None;
        }
        lock(&self.fds)
            .iter()
            .find(|(f, _)| *f == fd)
            .map(|(_, d)| d.clone())
    }

    /// Forget `fd` (it is being closed or overwritten); returns its entry if it was ours.
    pub(crate) fn remove_fd(&self, fd: i32) -> Option<DevFile> {
        if !self.maybe_ours(fd) {
            return None;
        }
        let mut fds = lock(&self.fds);
        let old = fds
            .iter()
            .position(|(f, _)| *f == fd)
            .map(|i| fds.swap_remove(i).1);
        if old.is_some() {
            self.mark(fd, false);
        }
        old
    }

    /// Forget every descriptor in `first..=last`; returns the removed entries.
    pub(crate) fn remove_fd_range(&self, first: u32, last: u32) -> Vec<DevFile> {
        let mut fds = lock(&self.fds);
        let mut removed = Vec::new();
        fds.retain(|(f, d)| {
            let inside = u32::try_from(*f).is_ok_and(|f| (first..=last).contains(&f));
            if inside {
                removed.push((*f, d.clone()));
            }
            !inside
        });
        removed
            .into_iter()
            .map(|(f, d)| {
                self.mark(f, false);
                d
            })
            .collect()
    }

    /// Record a mapping returned by the emulator.
    pub(crate) fn insert_map(&self, addr: usize, len: usize, file: DevFile) {
        let mut maps = lock(&self.maps);
        maps.push(Mapping { addr, len, file });
        self.map_count.store(maps.len(), Ordering::Release);
    }

    /// If `addr` starts a mapping of ours, forget it and return its file and length.
    pub(crate) fn take_map(&self, addr: usize) -> Option<(DevFile, usize)> {
        if self.map_count.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut maps = lock(&self.maps);
        let i = maps.iter().position(|m| m.addr == addr)?;
        let m = maps.swap_remove(i);
        self.map_count.store(maps.len(), Ordering::Release);
        Some((m.file, m.len))
    }

    /// Number of open descriptors and live mappings.
    #[cfg(test)]
    pub(crate) fn population(&self) -> (usize, usize) {
        (
            lock(&self.fds).len(),
            self.map_count.load(Ordering::Acquire),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx5_emu::{EmuConfig, Emulator, RunMode};

    fn file(emu: &Emulator) -> DevFile {
        DevFile {
            hca: 1,
            surface: emu.open(1).unwrap(),
        }
    }

    fn emulator() -> Emulator {
        Emulator::new(EmuConfig {
            num_hcas: 2,
            mode: RunMode::Stepped,
            ..EmuConfig::default()
        })
    }

    #[test]
    fn descriptors_are_tracked_replaced_and_removed() {
        let emu = emulator();
        let r = Registry::new();
        assert!(r.fd(5).is_none());
        assert!(r.insert_fd(5, file(&emu)).is_none());
        let a = r.fd(5).unwrap();
        assert_eq!(a.hca, 1);
        assert!(r.fd(6).is_none() && r.fd(-1).is_none());
        // dup: a second number for the same open file.
        assert!(r.insert_fd(9, a.clone()).is_none());
        assert!(Arc::ptr_eq(&r.fd(9).unwrap().surface, &a.surface));
        // A stale entry under a reused number is handed back.
        let stale = r.insert_fd(5, file(&emu)).unwrap();
        assert!(Arc::ptr_eq(&stale.surface, &a.surface));
        assert_eq!(r.population(), (2, 0));
        assert!(r.remove_fd(9).is_some());
        assert!(r.remove_fd(9).is_none());
        assert_eq!(r.remove_fd_range(0, 4).len(), 0);
        assert_eq!(r.remove_fd_range(5, u32::MAX).len(), 1);
        assert_eq!(r.population(), (0, 0));
        assert!(r.fd(5).is_none() && !r.maybe_ours(5) && !r.maybe_ours(9));
        // Descriptors beyond the bitmap take the locked path.
        let high = BITMAP_FDS as i32 + 10;
        assert!(r.insert_fd(high, file(&emu)).is_none());
        assert!(r.maybe_ours(high + 1));
        assert!(r.fd(high + 1).is_none());
        assert_eq!(r.fd(high).unwrap().hca, 1);
        assert_eq!(r.remove_fd_range(high as u32, high as u32).len(), 1);
        assert!(!r.maybe_ours(high));
    }

    #[test]
    fn mappings_are_found_by_start_address_once() {
        let emu = emulator();
        let r = Registry::new();
        r.insert_map(0x1000, 4096, file(&emu));
        r.insert_map(0x3000, 8192, file(&emu));
        assert!(r.take_map(0x2000).is_none());
        let (_, len) = r.take_map(0x3000).unwrap();
        assert_eq!(len, 8192);
        assert!(r.take_map(0x3000).is_none());
        assert_eq!(r.population(), (0, 1));
    }
}
