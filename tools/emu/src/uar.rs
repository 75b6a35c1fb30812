//! UAR pages: ordinary shared memory that the device watches.
//!
//! A context's UAR pages (plus its core-clock and clock-info pages) live in one `memfd`.
//! The device keeps its own mapping of the whole file for its lifetime; every user `mmap`
//! is a second, independent mapping of one page of the same file. So the user's
//! doorbell stores and the device's atomic swaps hit the same physical memory, and a user
//! `munmap` can never pull memory from under the device.
//!
//! **Waking the device** (threaded mode, `docs/emulator-wake.md`): a region given a [`Wake`]
//! maps every writable user page read-only and enters it in a process-wide table. The first
//! store to such a page faults; the fault handler ([`on_write_fault`], called from the
//! SIGSEGV handler in `mem/direct.rs`) gives the page its requested protection back, marks
//! it unprotected and pokes the emulator's eventfd; the store is then retried by the CPU and
//! lands. Before the device thread blocks it drains the eventfd, re-protects every page it
//! unprotected ([`protect_pages`]), and only then scans once more: a store that landed before
//! the protection is seen by that scan, and one after it faults again and pokes the eventfd,
//! which the drain can no longer swallow.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, AtomicU8, AtomicU64, AtomicUsize, Ordering};

use crate::abi::Errno;

/// Size of one UAR page (and of the system page we support).
pub(crate) const PAGE: usize = 4096;

/// The memfd-backed page set of one context.
#[derive(Debug)]
pub(crate) struct UarRegion {
    fd: OwnedFd,
    /// The device's mapping of the whole file, as 64-bit words.
    base: *mut u64,
    /// Total pages in the file (UAR pages + 2 clock pages).
    pages: usize,
    /// Threaded wake mode: the eventfd a store to one of our user pages pokes.
    wake: Option<Arc<Wake>>,
}

// SAFETY: `base` points at a MAP_SHARED mapping owned by this struct; all device accesses
// through it are atomic or volatile, so sharing the pointer across threads is sound.
unsafe impl Send for UarRegion {}

impl UarRegion {
    /// Create `pages` zeroed pages.
    pub(crate) fn new(pages: usize) -> Result<Self, Errno> {
        let name = c"mlx5-emu-uar";
        // SAFETY: `name` is a valid NUL-terminated string.
        let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(Errno(libc::ENOMEM));
        }
        // SAFETY: memfd_create returned a fresh descriptor owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let len = pages * PAGE;
        // SAFETY: ftruncate on our own memfd.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(Errno(libc::ENOMEM));
        }
        // SAFETY: mapping `len` bytes of our memfd, shared, at a kernel-chosen address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Errno(libc::ENOMEM));
        }
        Ok(Self {
            fd,
            base: p.cast::<u64>(),
            pages,
            wake: None,
        })
    }

    /// From now on, map writable user pages read-only and wake `wake` on their first store
    /// (`None`: plain shared pages that the device polls, as in stepped mode).
    pub(crate) fn set_wake(&mut self, wake: Option<Arc<Wake>>) {
        self.wake = wake;
    }

    /// Map page `page` for the user with protection `prot`.
    pub(crate) fn map_user(
        &self,
        page: usize,
        len: usize,
        prot: i32,
    ) -> Result<std::ptr::NonNull<u8>, Errno> {
        if page >= self.pages || len != PAGE {
            return Err(Errno(libc::EINVAL));
        }
        // A writable page of a waking region starts out protected: its first store faults.
        let watched = self
            .wake
            .as_ref()
            .filter(|_| prot & libc::PROT_WRITE != 0 && crate::mem::fault_handler_installed());
        let map_prot = if watched.is_some() { PROTECTED } else { prot };
        // SAFETY: a fresh shared mapping of one page of our memfd at a kernel-chosen address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                map_prot,
                libc::MAP_SHARED,
                self.fd.as_raw_fd(),
                (page * PAGE) as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Errno(
                std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::ENOMEM),
            ));
        }
        let Some(p) = std::ptr::NonNull::new(p.cast::<u8>()) else {
            return Err(Errno(libc::ENOMEM));
        };
        if let Some(wake) = watched {
            if !register(p.as_ptr() as usize, prot, wake) {
                // The table is full: give the page its protection and let the device poll.
                // SAFETY: our fresh mapping of one page.
                unsafe { libc::mprotect(p.as_ptr().cast(), PAGE, prot) };
                wake.unwatched.store(true, Ordering::Relaxed);
            }
        }
        Ok(p)
    }

    fn word(&self, page: usize, off: usize) -> Option<&AtomicU64> {
        if page >= self.pages || off % 8 != 0 || off + 8 > PAGE {
            return None;
        }
        let p = self.base.wrapping_add((page * PAGE + off) / 8);
        // SAFETY: page/off are bounds-checked above, the mapping lives as long as `self`, the
        // address is 8-byte aligned (page aligned base + multiple of 8), and the memory is
        // only ever accessed atomically/volatilely by the device.
        Some(unsafe { AtomicU64::from_ptr(p) })
    }

    /// The 512 words of page `page` (None past the end), for scanning a page without a
    /// bounds check per word: take a doorbell word at byte offset `off` with
    /// [`take_word`]`(&words[off / 8])`.
    pub(crate) fn page_words(&self, page: usize) -> Option<&[AtomicU64]> {
        if page >= self.pages {
            return None;
        }
        let p = self.base.wrapping_add(page * PAGE / 8);
        // SAFETY: the page is within the mapping (checked above), which lives as long as
        // `self`; `p` is page aligned, so every word is 8-byte aligned; `AtomicU64` has the
        // size and layout of `u64`, and the memory is only ever accessed atomically or
        // volatilely by the device.
        Some(unsafe { std::slice::from_raw_parts(p.cast_const().cast::<AtomicU64>(), PAGE / 8) })
    }

    /// Read `len` bytes at `off` of `page` (word by word), then clear them (each word as
    /// [`take_word`] does: a zero word needs no atomic swap).
    pub(crate) fn take_bytes(&self, page: usize, off: usize, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len);
        let mut o = off;
        while o < off + len {
            let v = self.word(page, o).map_or(0, take_word);
            out.extend_from_slice(&v.to_ne_bytes());
            o += 8;
        }
        out
    }

    /// Store 8 bytes (used for the clock pages).
    pub(crate) fn store(&self, page: usize, off: usize, bytes: [u8; 8]) {
        if let Some(w) = self.word(page, off) {
            w.store(u64::from_ne_bytes(bytes), Ordering::Release);
        }
    }
}

/// Take (and clear) a doorbell word: 0 if it is 0 (one plain load, the common case), else
/// its value, swapped out atomically.
pub(crate) fn take_word(w: &AtomicU64) -> u64 {
    if w.load(Ordering::Relaxed) == 0 {
        0
    } else {
        w.swap(0, Ordering::AcqRel)
    }
}

impl Drop for UarRegion {
    fn drop(&mut self) {
        // SAFETY: `base`/len is exactly the mapping created in `new`, unused after this.
        unsafe { libc::munmap(self.base.cast(), self.pages * PAGE) };
    }
}

// ---------------------------------------------------------------------------------------
// Waking the device on the first store to a UAR page

/// How a watched page is mapped between scans: readable (a load of a doorbell page is
/// harmless), not writable.
const PROTECTED: i32 = libc::PROT_READ;

/// The wake-up line of one emulator's device thread: a non-blocking eventfd, poked by the
/// fault handler (one `write`, async-signal-safe) and by kernel commands, waited on with
/// `ppoll` next to the UDP sockets.
#[derive(Debug)]
pub(crate) struct Wake {
    fd: OwnedFd,
    /// A watched page could not be entered in the fault table: the device must poll.
    pub(crate) unwatched: std::sync::atomic::AtomicBool,
}

impl Wake {
    /// A fresh eventfd, or `None` if the process has none left.
    pub(crate) fn new() -> Option<Arc<Wake>> {
        // SAFETY: eventfd with no pointer arguments.
        let raw = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if raw < 0 {
            return None;
        }
        Some(Arc::new(Wake {
            // SAFETY: eventfd returned a fresh descriptor owned by nobody else.
            fd: unsafe { OwnedFd::from_raw_fd(raw) },
            unwatched: std::sync::atomic::AtomicBool::new(false),
        }))
    }

    /// The descriptor to poll for POLLIN.
    pub(crate) fn fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// Wake the device thread (from any thread, or a signal handler).
    pub(crate) fn poke(&self) {
        poke_fd(self.fd.as_raw_fd());
    }

    /// Consume every poke so far (the device thread, before it re-protects).
    pub(crate) fn drain(&self) {
        let mut v = 0u64;
        // SAFETY: reads 8 bytes into our own u64 from our non-blocking eventfd.
        unsafe { libc::read(self.fd.as_raw_fd(), (&raw mut v).cast(), 8) };
    }
}

fn poke_fd(fd: i32) {
    let one = 1u64;
    // SAFETY: writes 8 bytes of a live u64 to an eventfd; write(2) is async-signal-safe. A
    // full counter (EAGAIN) already means "awake".
    unsafe { libc::write(fd, (&raw const one).cast(), 8) };
}

/// Slot states.
const FREE: u8 = 0;
/// Mapped [`PROTECTED`]: the next store faults.
const ARMED: u8 = 1;
/// Given its protection back by the fault handler: the device re-arms it before it sleeps.
const OPEN: u8 = 2;

/// One watched user page.
struct Slot {
    /// Page address, 0 = free. Written last on registration (Release), cleared first on
    /// removal; the fault handler reads it with Acquire.
    page: AtomicUsize,
    /// The protection the user asked for.
    prot: AtomicI32,
    /// The eventfd of the owning emulator.
    efd: AtomicI32,
    state: AtomicU8,
    /// When the fault handler opened the page (CLOCK_MONOTONIC ns).
    opened: AtomicU64,
}

const SLOTS: usize = 4096;

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Slot = Slot {
    page: AtomicUsize::new(0),
    prot: AtomicI32::new(0),
    efd: AtomicI32::new(-1),
    state: AtomicU8::new(FREE),
    opened: AtomicU64::new(0),
};

/// The process-wide table the fault handler searches (lock-free, up to [`HIGH`]).
static TABLE: [Slot; SLOTS] = [EMPTY; SLOTS];
/// One past the highest slot ever used.
static HIGH: AtomicUsize = AtomicUsize::new(0);
/// Serializes registration, removal (with the munmap) and re-protection, so the device
/// never changes the protection of an address that has been unmapped and reused.
static EDIT: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn edit() -> std::sync::MutexGuard<'static, ()> {
    EDIT.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn register(page: usize, prot: i32, wake: &Wake) -> bool {
    let _g = edit();
    let Some(i) = TABLE
        .iter()
        .position(|s| s.page.load(Ordering::Relaxed) == 0)
    else {
        return false;
    };
    let s = &TABLE[i];
    // Reads stay allowed once open (x86 implies them anyway; valgrind tracks them).
    s.prot.store(prot | libc::PROT_READ, Ordering::Relaxed);
    s.efd.store(wake.fd(), Ordering::Relaxed);
    s.state.store(ARMED, Ordering::Relaxed);
    s.page.store(page, Ordering::Release);
    HIGH.fetch_max(i + 1, Ordering::Release);
    true
}

/// Unmap a user mapping made by [`UarRegion::map_user`], first taking its pages out of the
/// fault table. Returns munmap's result.
///
/// # Safety
/// `(addr, len)` is a mapping returned by `map_user` that nothing uses any more.
pub(crate) unsafe fn unmap_user(addr: *mut libc::c_void, len: usize) -> i32 {
    let _g = edit();
    let (lo, hi) = (addr as usize, addr as usize + len);
    for s in &TABLE[..HIGH.load(Ordering::Acquire)] {
        let p = s.page.load(Ordering::Relaxed);
        if p != 0 && p >= lo && p < hi {
            s.page.store(0, Ordering::Release);
            s.state.store(FREE, Ordering::Relaxed);
        }
    }
    // SAFETY: forwarded contract.
    unsafe { libc::munmap(addr, len) }
}

/// How long a page stays open after the fault that opened it before the device may re-arm
/// it. The faulting store is retried only after the handler returns (sigreturn, and on a
/// busy CPU after the woken device thread gives the core back); re-arming before that
/// makes the retry fault again, and on a fast device over and over (a livelock seen with
/// libmlx5, whose doorbell follows the WQE by a few instructions).
pub(crate) const GRACE: std::time::Duration = std::time::Duration::from_micros(20);

/// CLOCK_MONOTONIC in nanoseconds (async-signal-safe: clock_gettime).
fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime into our own timespec; async-signal-safe.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Re-arm every page of `wake` that the fault handler opened at least [`GRACE`] ago.
/// Returns how long until the youngest of the pages left open may be re-armed (`None`: no
/// page is left open); the device must look again by then. The state is set before the
/// protection changes, so a fault racing with us (its handler opens the page after our
/// mprotect) leaves the slot `OPEN` for the next call, never `ARMED` on a writable page.
pub(crate) fn protect_pages(wake: &Wake) -> Option<std::time::Duration> {
    let fd = wake.fd();
    let _g = edit();
    let now = mono_ns();
    let grace = GRACE.as_nanos() as u64;
    let mut left: Option<u64> = None;
    for s in &TABLE[..HIGH.load(Ordering::Acquire)] {
        if s.state.load(Ordering::Acquire) != OPEN || s.efd.load(Ordering::Relaxed) != fd {
            continue;
        }
        let p = s.page.load(Ordering::Relaxed);
        if p == 0 {
            continue;
        }
        let age = now.saturating_sub(s.opened.load(Ordering::Relaxed));
        if age < grace {
            left = Some(left.map_or(grace - age, |l| l.min(grace - age)));
            continue;
        }
        s.state.store(ARMED, Ordering::SeqCst);
        // SAFETY: `p` is a live one-page user mapping of a UAR region: entries leave the
        // table (under EDIT, which we hold) before their page is unmapped.
        unsafe { libc::mprotect(p as *mut libc::c_void, PAGE, PROTECTED) };
    }
    left.map(std::time::Duration::from_nanos)
}

/// The CPU the last doorbell fault was taken on (-1: none yet): where the ringing thread
/// runs, which the device thread keeps off (`lib.rs`, `Sched::avoid`).
static FAULT_CPU: AtomicI32 = AtomicI32::new(-1);

/// The CPU of the last doorbell fault in this process (-1: none yet).
pub(crate) fn fault_cpu() -> i32 {
    FAULT_CPU.load(Ordering::Relaxed)
}

/// The fault handler's part: if `addr` lies in a watched page, give the page its protection
/// back, mark it open, poke its device and return true (the faulting store is retried).
/// Async-signal-safe: atomics, `mprotect` and `write` only, no lock.
pub(crate) fn on_write_fault(addr: usize) -> bool {
    let page = addr & !(PAGE - 1);
    if page == 0 {
        return false;
    }
    for s in &TABLE[..HIGH.load(Ordering::Acquire).min(SLOTS)] {
        if s.page.load(Ordering::Acquire) != page {
            continue;
        }
        let prot = s.prot.load(Ordering::Relaxed);
        // SAFETY: the page is a watched user mapping (in the table); only its protection
        // changes, to what its user asked for.
        if unsafe { libc::mprotect(page as *mut libc::c_void, PAGE, prot) } != 0 {
            return false;
        }
        s.opened.store(mono_ns(), Ordering::Relaxed);
        s.state.store(OPEN, Ordering::SeqCst);
        // SAFETY: sched_getcpu has no arguments and takes no lock (an rseq or vDSO read).
        FAULT_CPU.store(unsafe { libc::sched_getcpu() }, Ordering::Relaxed);
        poke_fd(s.efd.load(Ordering::Relaxed));
        return true;
    }
    false
}

/// A doorbell seen on a *shared* register (a medium-latency bfreg, or bfreg 0, used by
/// several QPs of the context): the doorbell of another QP on that register may have been
/// overwritten by this one between two scans (UAR memory keeps only the last value, where a
/// real MMIO write is never lost). So every other QP bound to the register whose doorbell
/// record has moved past what it was rung to is taken as rung too. A deviation from the
/// hardware, limited to QPs that share a register with one whose doorbell was just written:
/// such a QP may run a WQE it published only in its doorbell record. Not counted in
/// `doorbells` (that counts the doorbell words seen).
pub(crate) fn rung_shared_register(
    w: &mut crate::state::World,
    hca: usize,
    ctx: u64,
    qpn: u32,
    bfreg: u32,
) {
    let shared = w
        .contexts
        .get(&ctx)
        .and_then(|c| c.bfreg_users.get(bfreg as usize))
        .is_some_and(|&n| n > 1)
        || bfreg & crate::kernel::devx::DEVX_UAR_BFREG != 0 && bfreg != u32::MAX;
    if !shared {
        return;
    }
    for (&n, q) in w.hcas[hca].qps.iter_mut() {
        if n == qpn || q.ctx != ctx || q.bfreg != bfreg {
            continue;
        }
        if let Ok(pi) = crate::mem::read_be32(q.db + 4) {
            q.sq_rung = (pi & mlx5_hw::doorbell::WQ_PI_MASK) as u16;
        }
    }
}
