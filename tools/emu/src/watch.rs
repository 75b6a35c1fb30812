//! Waking the device on the first store to a UAR page (threaded mode,
//! `docs/emulator-wake.md`): the process-wide table of write-protected user pages that the
//! SIGSEGV handler (`mem/direct.rs`) consults, and each emulator's wake-up line. Below both
//! the UAR regions that enter pages here (`uar.rs`) and the fault handler that opens them.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};

/// Size of one UAR page (and of the system page we support).
pub(crate) const PAGE: usize = 4096;

/// How a watched page is mapped between scans: readable (a load of a doorbell page is
/// harmless), not writable.
pub(crate) const PROTECTED: i32 = libc::PROT_READ;

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
    /// The device's own address of the page (`UarRegion`'s mapping): which page of which
    /// region this user mapping shows, for the device's look at the notes.
    key: AtomicUsize,
    /// Lending: bit `i` = a store to the page's 64-byte block `i` faulted and the device has
    /// not taken the note yet.
    rung: AtomicU64,
    /// Lending: the device's acknowledgements of taken notes (a futex word).
    acked: AtomicU32,
}

const SLOTS: usize = 4096;

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Slot = Slot {
    page: AtomicUsize::new(0),
    prot: AtomicI32::new(0),
    efd: AtomicI32::new(-1),
    state: AtomicU8::new(FREE),
    opened: AtomicU64::new(0),
    key: AtomicUsize::new(0),
    rung: AtomicU64::new(0),
    acked: AtomicU32::new(0),
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

pub(crate) fn register(page: usize, prot: i32, wake: &Wake, key: usize) -> bool {
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
    s.key.store(key, Ordering::Relaxed);
    s.rung.store(0, Ordering::Relaxed);
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
        let lend = LEND.load(Ordering::Relaxed);
        // A lending thread's grace period starts when it stops waiting (below): the page
        // must not be re-armed before its store is retried.
        s.opened
            .store(if lend { u64::MAX } else { mono_ns() }, Ordering::Relaxed);
        s.state.store(OPEN, Ordering::SeqCst);
        // SAFETY: sched_getcpu has no arguments and takes no lock (an rseq or vDSO read).
        FAULT_CPU.store(unsafe { libc::sched_getcpu() }, Ordering::Relaxed);
        if lend {
            // Read the acknowledgement count before the note: an acknowledgement after this
            // read, of this note or of an earlier one, ends the wait below.
            let seq = s.acked.load(Ordering::Acquire);
            s.rung
                .fetch_or(1 << ((addr & (PAGE - 1)) / 64), Ordering::Release);
            NOTED.store(true, Ordering::Release);
            poke_fd(s.efd.load(Ordering::Relaxed));
            futex_wait(&s.acked, seq, LEND_WAIT);
            s.opened.store(mono_ns(), Ordering::Relaxed);
        } else {
            poke_fd(s.efd.load(Ordering::Relaxed));
        }
        return true;
    }
    false
}

// ---------------------------------------------------------------------------------------
// Lending the ringing thread's CPU to the device (`docs/emulator-wake.md`, *Lending*)

/// The faulting thread waits for the device's acknowledgement of its note (`MLX5_EMU_LEND=1`
/// with a real-time device, which runs on the CPU the waiting thread leaves; otherwise it
/// pokes and returns at once). Process-wide: set by the first lending device thread.
static LEND: AtomicBool = AtomicBool::new(false);
/// Some slot has a note the device has not taken.
static NOTED: AtomicBool = AtomicBool::new(false);
/// How long a faulting thread waits for the device at most: a device that cannot run (or
/// has nothing to take) costs the ringing thread no more than this.
pub(crate) const LEND_WAIT: std::time::Duration = std::time::Duration::from_micros(200);

/// Turn lending on or off for this process (the waking device thread, when it starts).
pub(crate) fn set_lend(on: bool) {
    LEND.store(on, Ordering::Relaxed);
}

/// Whether a note may be waiting (clears the flag: the caller then takes every note).
pub(crate) fn noted() -> bool {
    NOTED.swap(false, Ordering::AcqRel)
}

/// Take the notes of the user mappings of the page the device maps at `key`: the blocks
/// whose stores faulted, ORed. The slots taken from are pushed onto `acks`, to be
/// acknowledged ([`ack`]) once the device has done what the notes asked.
pub(crate) fn take_rung(key: usize, acks: &mut Vec<usize>) -> u64 {
    let mut bits = 0;
    for (i, s) in TABLE[..HIGH.load(Ordering::Acquire)].iter().enumerate() {
        if s.key.load(Ordering::Relaxed) != key || s.page.load(Ordering::Acquire) == 0 {
            continue;
        }
        let b = s.rung.swap(0, Ordering::AcqRel);
        if b != 0 {
            bits |= b;
            acks.push(i);
        }
    }
    bits
}

/// Acknowledge the notes taken from slot `i`: its waiting threads return.
pub(crate) fn ack(i: usize) {
    let Some(s) = TABLE.get(i) else { return };
    s.acked.fetch_add(1, Ordering::Release);
    // SAFETY: FUTEX_WAKE on a live word of a static; no other memory is touched.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            s.acked.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            i32::MAX,
        )
    };
}

/// Wait (async-signal-safe: one futex call) while `word` is `seq`, at most `timeout`.
fn futex_wait(word: &AtomicU32, seq: u32, timeout: std::time::Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT on a live word of a static with a live relative timespec; it only
    // reads the word and sleeps.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            seq,
            &raw const ts,
        )
    };
}
