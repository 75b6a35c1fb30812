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
pub(crate) struct Wake {
    fd: OwnedFd,
    /// A watched page could not be entered in the fault table: the device must poll.
    pub(crate) unwatched: std::sync::atomic::AtomicBool,
    /// Doorbell stores to this emulator's pages are emulated and run by the ringing thread
    /// (set at the start when [`emulating`] and the fabric is UDP); else the page is opened
    /// and the device thread woken.
    pub(crate) ring_here: AtomicBool,
    /// The device's next deadline (a timer, a held datagram): a `CLOCK_MONOTONIC` timerfd
    /// the device thread waits on beside the eventfd, re-armed by whoever ran the device
    /// last (the device thread before it blocks, a ringing thread after its run), so a
    /// deadline a ringing thread sets or removes moves the wake-up without a poke.
    timer: Option<OwnedFd>,
    /// The deadline the timer is armed for (`CLOCK_MONOTONIC` ns; 0: disarmed).
    armed: AtomicU64,
    /// The BlueFlame half size of the device's UAR pages (bytes; 0: no BlueFlame).
    pub(crate) half: AtomicUsize,
    /// Runs the device in the ringing thread (set once by the emulator, see [`Runner`]).
    pub(crate) runner: std::sync::OnceLock<Runner>,
}

/// The device's work done by a thread whose doorbell store was emulated
/// (`docs/emulator-wake.md`, *Doorbell stores emulated in the ringing thread*): true if it
/// ran the device; false if it could not (the world is locked, the emulator is going), and
/// the device thread must be poked instead. Called from the SIGSEGV handler, so it takes no
/// blocking lock.
pub(crate) type Runner = Box<dyn Fn() -> bool + Send + Sync>;

impl std::fmt::Debug for Wake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wake")
            .field("fd", &self.fd)
            .field("ring_here", &self.ring_here)
            .field("runner", &self.runner.get().is_some())
            .finish_non_exhaustive()
    }
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
            ring_here: AtomicBool::new(false),
            timer: timerfd(),
            armed: AtomicU64::new(0),
            half: AtomicUsize::new(0),
            runner: std::sync::OnceLock::new(),
        }))
    }

    /// The descriptor to poll for POLLIN.
    pub(crate) fn fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// The deadline timer's descriptor to poll for POLLIN (None: no timerfd, the device
    /// thread then waits with a timeout).
    pub(crate) fn timer_fd(&self) -> Option<i32> {
        self.timer.as_ref().map(AsRawFd::as_raw_fd)
    }

    /// Arm the deadline timer `in_ns` from now (None: disarm). One `timerfd_settime` when
    /// the deadline moves by more than a microsecond; async-signal-safe.
    pub(crate) fn arm(&self, in_ns: Option<u64>) {
        let Some(t) = &self.timer else { return };
        let at = in_ns.map_or(0, |d| mono_ns().saturating_add(d).max(1));
        let was = self.armed.load(Ordering::Relaxed);
        if at.abs_diff(was) < 1_000 && (at == 0) == (was == 0) {
            return;
        }
        self.armed.store(at, Ordering::Relaxed);
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: (at / 1_000_000_000) as libc::time_t,
                tv_nsec: (at % 1_000_000_000) as libc::c_long,
            },
        };
        // SAFETY: timerfd_settime on our own timerfd with a live itimerspec; an all-zero
        // value disarms it.
        unsafe {
            libc::timerfd_settime(
                t.as_raw_fd(),
                libc::TFD_TIMER_ABSTIME,
                &raw const spec,
                std::ptr::null_mut(),
            )
        };
    }

    /// Consume an expiry of the deadline timer (the device thread, after its wait).
    pub(crate) fn drain_timer(&self) {
        let Some(t) = &self.timer else { return };
        let mut v = 0u64;
        // SAFETY: reads 8 bytes into our own u64 from our non-blocking timerfd.
        unsafe { libc::read(t.as_raw_fd(), (&raw mut v).cast(), 8) };
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

/// A non-blocking `CLOCK_MONOTONIC` timerfd (None if the process has none left).
fn timerfd() -> Option<OwnedFd> {
    // SAFETY: timerfd_create with no pointer arguments.
    let raw = unsafe {
        libc::timerfd_create(
            libc::CLOCK_MONOTONIC,
            libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
        )
    };
    // SAFETY: timerfd_create returned a fresh descriptor owned by nobody else.
    (raw >= 0).then(|| unsafe { OwnedFd::from_raw_fd(raw) })
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
    /// The owning emulator's wake-up line (valid while `key` is not 0, see [`detach`]).
    wake: std::sync::atomic::AtomicPtr<Wake>,
    /// Fault handlers using `key` and `wake` right now ([`detach`] waits for none).
    busy: AtomicU32,
    /// Bit `h`: BlueFlame half `h` of the page had its doorbell word taken by a run of the
    /// device in the ringing thread; stores to its interior until its next doorbell word
    /// are the tail of that copy (blocks after the first fault separately) and consumed.
    tails: AtomicU32,
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
    wake: std::sync::atomic::AtomicPtr::new(std::ptr::null_mut()),
    busy: AtomicU32::new(0),
    tails: AtomicU32::new(0),
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
    s.key.store(key, Ordering::SeqCst);
    s.wake
        .store(std::ptr::from_ref(wake).cast_mut(), Ordering::SeqCst);
    s.rung.store(0, Ordering::Relaxed);
    s.tails.store(0, Ordering::Relaxed);
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
            s.page.store(0, Ordering::SeqCst);
            // A fault handler emulating a store into this page finishes first.
            while s.busy.load(Ordering::SeqCst) != 0 {
                std::hint::spin_loop();
            }
            s.state.store(FREE, Ordering::Relaxed);
        }
    }
    // SAFETY: forwarded contract.
    unsafe { libc::munmap(addr, len) }
}

/// The device's mapping `[base, base + len)` goes away (its `UarRegion` drops): the user
/// mappings of it that are still in the table stop being emulated into it (their stores
/// fall back to opening the page). Returns once no fault handler uses it any more.
pub(crate) fn detach(base: usize, len: usize) {
    let _g = edit();
    for s in &TABLE[..HIGH.load(Ordering::Acquire)] {
        let k = s.key.load(Ordering::SeqCst);
        if k != 0 && k >= base && k < base + len {
            s.key.store(0, Ordering::SeqCst);
            while s.busy.load(Ordering::SeqCst) != 0 {
                std::hint::spin_loop();
            }
            s.wake.store(std::ptr::null_mut(), Ordering::SeqCst);
        }
    }
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
/// page is left open), which the device must look again by, and whether any page was open
/// at all (if none was, every store since the last call faulted, and the scan after the
/// protection has nothing to find). The state is set before the
/// protection changes, so a fault racing with us (its handler opens the page after our
/// mprotect) leaves the slot `OPEN` for the next call, never `ARMED` on a writable page.
pub(crate) fn protect_pages(wake: &Wake) -> (Option<std::time::Duration>, bool) {
    let fd = wake.fd();
    let _g = edit();
    let now = mono_ns();
    let grace = GRACE.as_nanos() as u64;
    let mut left: Option<u64> = None;
    let mut any = false;
    for s in &TABLE[..HIGH.load(Ordering::Acquire)] {
        if s.state.load(Ordering::Acquire) != OPEN || s.efd.load(Ordering::Relaxed) != fd {
            continue;
        }
        let p = s.page.load(Ordering::Relaxed);
        if p == 0 {
            continue;
        }
        any = true;
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
    (left.map(std::time::Duration::from_nanos), any)
}

/// The CPU the last doorbell fault was taken on (-1: none yet): where the ringing thread
/// runs, which the device thread keeps off (`lib.rs`, `Sched::avoid`).
static FAULT_CPU: AtomicI32 = AtomicI32::new(-1);

/// The CPU of the last doorbell fault in this process (-1: none yet).
pub(crate) fn fault_cpu() -> i32 {
    FAULT_CPU.load(Ordering::Relaxed)
}

/// The fault handler's part: if `addr` lies in a watched page, either emulate the store
/// (and what follows it, `store.rs`) and run the device in this thread, or give the page its
/// protection back, mark it open, poke its device (the faulting store is then retried), and
/// return true. `ctx` is the handler's `ucontext_t`. Async-signal-safe: atomics, `mprotect`,
/// `write`, `futex` and a `try_lock`, no blocking lock.
/// `read` reads ordinary memory without faulting (for the loads of an emulated run).
///
/// # Safety
/// Called only from a SIGSEGV handler installed with `SA_SIGINFO`, for the fault it is
/// handling: `ctx` is null or the `ucontext_t` the kernel passed to it, valid and this
/// thread's alone until the handler returns, and the interrupted thread resumes from it.
pub(crate) unsafe fn on_write_fault(addr: usize, ctx: *mut libc::c_void, read: Reader) -> bool {
    let page = addr & !(PAGE - 1);
    if page == 0 {
        return false;
    }
    for s in &TABLE[..HIGH.load(Ordering::Acquire).min(SLOTS)] {
        if s.page.load(Ordering::Acquire) != page {
            continue;
        }
        // SAFETY: forwarded contract (`ctx` is the handler's context).
        if unsafe { emulated(s, page, ctx, read) } {
            return true;
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

// ---------------------------------------------------------------------------------------
// Doorbell stores emulated in the ringing thread (`docs/emulator-wake.md`)

/// Whether faulting doorbell stores are emulated (`MLX5_EMU_RING=device` turns it off: every
/// fault opens the page and wakes the device thread, as before). Process-wide.
static EMULATE: AtomicBool = AtomicBool::new(true);

/// Whether doorbell stores are emulated (and run by the ringing thread).
pub(crate) fn emulating() -> bool {
    EMULATE.load(Ordering::Relaxed) && cfg!(all(target_arch = "x86_64", target_os = "linux"))
}

/// Choose whether doorbell stores are emulated (the emulator, when it starts).
pub(crate) fn set_emulate(on: bool) {
    EMULATE.store(on, Ordering::Relaxed);
}

/// Faults whose store was emulated, and runs of the device in a ringing thread (for the
/// bench and the tests).
static EMULATED: AtomicU64 = AtomicU64::new(0);
static RAN_HERE: AtomicU64 = AtomicU64::new(0);

/// (faults emulated, device runs in the ringing thread) so far in this process.
pub(crate) fn emulation_counts() -> (u64, u64) {
    (
        EMULATED.load(Ordering::Relaxed),
        RAN_HERE.load(Ordering::Relaxed),
    )
}

/// Reads `buf.len()` bytes at an address from a signal handler, false if not all readable
/// (`mem::read_in_handler`, given by the handler: the memory room is above this one).
pub(crate) type Reader = fn(u64, &mut [u8]) -> bool;

/// Emulate the faulting store on slot `s`'s page and run or poke the device; false: not
/// done (lending, an emulator that does not ring here, an instruction we do not decode, the
/// page's region is going, the page was unmapped meanwhile), the caller opens the page.
///
/// # Safety
/// As [`on_write_fault`]'s: `ctx` is null or the running SIGSEGV handler's context.
unsafe fn emulated(s: &Slot, page: usize, ctx: *mut libc::c_void, read: Reader) -> bool {
    if !EMULATE.load(Ordering::Relaxed) || LEND.load(Ordering::Relaxed) || ctx.is_null() {
        return false;
    }
    s.busy.fetch_add(1, Ordering::SeqCst);
    // Still our page, now that we are busy: `unmap_user` clears the page before it waits
    // for no handler to be busy, so either we see it cleared or it waits for us (both
    // SeqCst), and the slot cannot be given to another page under us.
    if s.page.load(Ordering::SeqCst) != page {
        s.busy.fetch_sub(1, Ordering::SeqCst);
        return false;
    }
    // SAFETY: forwarded contract; `ctx` is not null (checked above).
    let done = unsafe { emulated_busy(s, page, ctx, read) };
    s.busy.fetch_sub(1, Ordering::SeqCst);
    done
}

/// Elsewhere than x86-64 Linux no store is decoded: the page is opened, as before.
#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
unsafe fn emulated_busy(_: &Slot, _: usize, _: *mut libc::c_void, _: Reader) -> bool {
    false
}

/// # Safety
/// `ctx` is the running SIGSEGV handler's context (not null), as for [`on_write_fault`].
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
unsafe fn emulated_busy(s: &Slot, page: usize, ctx: *mut libc::c_void, read: Reader) -> bool {
    let key = s.key.load(Ordering::SeqCst);
    let wake = s.wake.load(Ordering::SeqCst);
    if key == 0 || wake.is_null() {
        return false;
    }
    // SAFETY: `wake` is the Wake of the region that owns `key`; it stays alive until
    // `detach` has seen `busy` at 0, and we hold `busy` (incremented before `key` was read).
    let wake = unsafe { &*wake };
    if !wake.ring_here.load(Ordering::Relaxed) {
        return false;
    }
    let half = wake.half.load(Ordering::Relaxed);
    // SAFETY: `ctx` is the handler's context (this function's contract); `key` is the
    // device's live mapping of `page` while we are busy (checked above).
    let Some(mut m) = (unsafe { sig::Context::new(ctx, page, key, half, read, &s.tails) }) else {
        return false;
    };
    let ran = crate::store::run(&mut m, page as u64);
    if ran.stores == 0 {
        return false;
    }
    EMULATED.fetch_add(1, Ordering::Relaxed);
    // SAFETY: sched_getcpu has no arguments and takes no lock (an rseq or vDSO read).
    FAULT_CPU.store(unsafe { libc::sched_getcpu() }, Ordering::Relaxed);
    let here = wake
        .runner
        .get()
        // SAFETY: `ctx` is the handler's context (this function's contract).
        .is_some_and(|r| unsafe { sig::on_thread_stack(ctx, &|| r()) });
    if here {
        RAN_HERE.fetch_add(1, Ordering::Relaxed);
        m.mark_taken_tails();
    } else {
        wake.poke();
    }
    true
}

/// The interrupted thread's registers and memory, for `store::run` (x86-64 Linux).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod sig {
    use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

    use crate::store::Machine;

    pub(super) struct Context<'a> {
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        uc: *mut libc::ucontext_t,
        /// The user's page and the device's mapping of it.
        page: usize,
        key: usize,
        /// BlueFlame half size (0: none).
        half: usize,
        read: super::Reader,
        /// The slot's consumed-tail halves, and the halves whose doorbell word this run wrote.
        tails: &'a AtomicU32,
        heads: u32,
    }

    /// glibc's `REG_*` index of each register in the encoding's numbering (rax, rcx, rdx,
    /// rbx, rsp, rbp, rsi, rdi, r8..r15).
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    const GREG: [libc::c_int; 16] = [
        libc::REG_RAX,
        libc::REG_RCX,
        libc::REG_RDX,
        libc::REG_RBX,
        libc::REG_RSP,
        libc::REG_RBP,
        libc::REG_RSI,
        libc::REG_RDI,
        libc::REG_R8,
        libc::REG_R9,
        libc::REG_R10,
        libc::REG_R11,
        libc::REG_R12,
        libc::REG_R13,
        libc::REG_R14,
        libc::REG_R15,
    ];

    impl<'a> Context<'a> {
        /// # Safety
        /// `ctx` is the running signal handler's `ucontext_t` (not null), which the
        /// context's methods read and edit until it is dropped, before the handler
        /// returns; `key` is the device's mapping of the user page `page`, live while the
        /// context is.
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        pub(super) unsafe fn new(
            ctx: *mut libc::c_void,
            page: usize,
            key: usize,
            half: usize,
            read: super::Reader,
            tails: &'a AtomicU32,
        ) -> Option<Self> {
            Some(Context {
                uc: ctx.cast(),
                page,
                key,
                half,
                read,
                tails,
                heads: 0,
            })
        }

        /// The 512-byte FXSAVE area of the interrupted context (None: the kernel gave none).
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        fn fxsave(&self) -> Option<&[u8]> {
            let fp = self.fp()?;
            // SAFETY: a non-null `fpregs` points at the frame's FXSAVE area, 512 bytes,
            // valid for the handler's call (which `self` does not outlive).
            Some(unsafe { std::slice::from_raw_parts(fp, 512) })
        }

        /// The FXSAVE area's address (None: the kernel gave none).
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        fn fp(&self) -> Option<*const u8> {
            // SAFETY: `uc` is the ucontext the kernel passed to the handler, valid for the
            // call; `fpregs` points into the signal frame or is null.
            let p = unsafe { (*self.uc).uc_mcontext.fpregs };
            (!p.is_null()).then_some(p.cast::<u8>().cast_const())
        }
    }

    /// Bytes 464.. of the FXSAVE area carry the kernel's XSAVE frame description
    /// (`struct _fpx_sw_bytes`): magic, extended size, features present.
    const FP_XSTATE_MAGIC1: u32 = 0x4650_5853;
    /// The AVX state (YMM_Hi128) component's bit and its offset in the standard XSAVE format.
    const XFEATURE_YMM: u64 = 1 << 2;
    const YMM_OFFSET: usize = 576;

    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    impl Machine for Context<'_> {
        fn gpr(&self, r: u8) -> u64 {
            // SAFETY: `uc` is valid for the call (see `fp`); `GREG` indexes within `gregs`.
            unsafe { (*self.uc).uc_mcontext.gregs[GREG[usize::from(r & 15)] as usize] as u64 }
        }

        fn set_gpr(&mut self, r: u8, v: u64) {
            // SAFETY: as in `gpr`; the kernel restores the registers from this frame.
            unsafe {
                (*self.uc).uc_mcontext.gregs[GREG[usize::from(r & 15)] as usize] = v as i64;
            }
        }

        fn rip(&self) -> u64 {
            // SAFETY: as in `gpr`.
            unsafe { (*self.uc).uc_mcontext.gregs[libc::REG_RIP as usize] as u64 }
        }

        fn set_rip(&mut self, v: u64) {
            // SAFETY: as in `set_gpr`.
            unsafe { (*self.uc).uc_mcontext.gregs[libc::REG_RIP as usize] = v as i64 };
        }

        fn xmm(&self, r: u8) -> [u8; 16] {
            let Some(area) = self.fxsave() else {
                return [0; 16];
            };
            // The 16 XMM registers are at 160.. of the FXSAVE area, 16 bytes each.
            let at = 160 + 16 * usize::from(r & 15);
            area[at..at + 16].try_into().unwrap_or([0; 16])
        }

        fn ymm_hi(&self, r: u8) -> Option<[u8; 16]> {
            let area = self.fxsave()?;
            let u32_at =
                |o: usize| u32::from_ne_bytes([area[o], area[o + 1], area[o + 2], area[o + 3]]);
            let (magic, size) = (u32_at(464), u32_at(468) as usize);
            let features = u64::from(u32_at(472)) | u64::from(u32_at(476)) << 32;
            if magic != FP_XSTATE_MAGIC1 || features & XFEATURE_YMM == 0 || size < YMM_OFFSET + 256
            {
                return None;
            }
            let fp = self.fp()?;
            // SAFETY: the kernel's magic says the frame is an XSAVE area of `size` bytes from
            // `fp` (the FXSAVE part first), valid for the handler's call.
            let xsave = unsafe { std::slice::from_raw_parts(fp, size) };
            // The header's XSTATE_BV at 512: the AVX state in its initial (zero) state when
            // its bit is clear; the YMM upper halves at 576.., 16 bytes each.
            let bv = u64::from_ne_bytes(xsave[512..520].try_into().ok()?);
            if bv & XFEATURE_YMM == 0 {
                return Some([0; 16]);
            }
            let at = YMM_OFFSET + 16 * usize::from(r & 15);
            xsave[at..at + 16].try_into().ok()
        }

        fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
            (self.read)(addr, buf)
        }

        fn store(&mut self, addr: u64, bytes: &[u8]) -> bool {
            let off = (addr as usize).wrapping_sub(self.page);
            let len = bytes.len();
            if off >= super::PAGE || off + len > super::PAGE {
                return false;
            }
            // The interior of a BlueFlame half whose doorbell word a run in this thread
            // already took: the tail of a copy of more than one block (a fault per block).
            // The device has taken that MMIO write (the WQE from the ring, the doorbell from
            // the record); left in the page, its tail would be read as part of the half's
            // next doorbell. A write of a doorbell word starts the half afresh.
            if let Some(h) = self.half_of(off) {
                let start = 0x800 + h * self.half;
                if off < start + 8 {
                    self.tails.fetch_and(!(1 << h), Ordering::Relaxed);
                    self.heads |= 1 << h;
                } else if self.tails.load(Ordering::Relaxed) & (1 << h) != 0
                    && self.word(start).load(Ordering::Acquire) == 0
                {
                    return true;
                }
            }
            let dev = self.key + off;
            if len % 8 == 0 && off % 8 == 0 {
                for (i, c) in bytes.chunks_exact(8).enumerate() {
                    let v = u64::from_ne_bytes(c.try_into().unwrap_or([0; 8]));
                    self.word(off + 8 * i).store(v, Ordering::Release);
                }
                true
            } else if len == 4 && off % 4 == 0 {
                // SAFETY: `dev` is 4-byte aligned and within the device's live mapping of
                // the page (`key` is not detached while we are `busy`).
                let w = unsafe { AtomicU32::from_ptr(dev as *mut u32) };
                w.store(
                    u32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]),
                    Ordering::Release,
                );
                true
            } else {
                false
            }
        }
    }

    /// Run `f` on the interrupted thread's own stack: the handler may be running on a small
    /// alternate signal stack (Rust gives every thread one of a few KiB for its overflow
    /// report), too small for the device's step. If the handler already runs on the thread's
    /// stack (`sigaltstack` says it is not on the alternate one), `f` is called here; else
    /// the stack pointer is moved to 256 bytes below the interrupted one (past the
    /// red zone) for the call. A stack too short for `f` there overflows as the program
    /// itself would, into its guard page.
    ///
    /// # Safety
    /// `ctx` is the running signal handler's `ucontext_t` (not null), whose saved stack
    /// pointer is the interrupted thread's.
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    pub(super) unsafe fn on_thread_stack(ctx: *mut libc::c_void, f: &dyn Fn() -> bool) -> bool {
        let uc = ctx.cast::<libc::ucontext_t>();
        // SAFETY: `uc` is the ucontext the kernel passed to the handler, valid for the call.
        let rsp = unsafe { (*uc).uc_mcontext.gregs[libc::REG_RSP as usize] } as usize;
        let mut cur = libc::stack_t {
            ss_sp: std::ptr::null_mut(),
            ss_flags: 0,
            ss_size: 0,
        };
        // SAFETY: sigaltstack only reads the current alternate stack into our own stack_t;
        // it is async-signal-safe.
        let got = unsafe { libc::sigaltstack(std::ptr::null(), &mut cur) };
        let on_alt = got == 0 && cur.ss_flags & libc::SS_ONSTACK != 0;
        if !on_alt {
            return f();
        }
        struct Call<'a> {
            f: &'a dyn Fn() -> bool,
            ran: bool,
        }
        extern "C" fn trampoline(c: *mut Call<'_>) {
            // SAFETY: `c` points at the live `Call` below, passed by the asm block, which
            // waits for this call to return.
            let c = unsafe { &mut *c };
            c.ran = (c.f)();
        }
        let mut call = Call { f, ran: false };
        let sp = (rsp - 256) & !15;
        // SAFETY: `sp` is 16-byte aligned and below the interrupted thread's stack pointer
        // and its red zone, in its stack, which nothing else uses while this thread is in its
        // signal handler; the old stack pointer is kept in r12 (callee-saved) and restored;
        // `trampoline` follows the C ABI (clobber_abi), and gets a live `Call`.
        unsafe {
            core::arch::asm!(
                "mov r12, rsp",
                "mov rsp, {sp}",
                "call {f}",
                "mov rsp, r12",
                sp = in(reg) sp,
                f = in(reg) trampoline as extern "C" fn(*mut Call<'_>),
                in("rdi") &raw mut call,
                out("r12") _,
                clobber_abi("C"),
            );
        }
        call.ran
    }

    impl Context<'_> {
        /// The BlueFlame half (index from 0x800) that byte offset `off` lies in.
        fn half_of(&self, off: usize) -> Option<usize> {
            let h = off.checked_sub(0x800)?.checked_div(self.half)?;
            (h < 32).then_some(h)
        }

        /// After a run of the device: every half whose doorbell word this run wrote and the
        /// device took has its tail consumed from now on.
        pub(super) fn mark_taken_tails(&self) {
            for h in 0..32 {
                if self.heads & (1 << h) != 0
                    && self.word(0x800 + h * self.half).load(Ordering::Acquire) == 0
                {
                    self.tails.fetch_or(1 << h, Ordering::Relaxed);
                }
            }
        }

        /// The device's word at byte offset `off` (8-aligned, < PAGE) of the page.
        fn word(&self, off: usize) -> &AtomicU64 {
            // SAFETY: `key` is the device's live, page-aligned mapping of the page (not
            // detached while the handler is `busy`), `off` is 8-aligned and within it; the
            // device accesses these words only atomically.
            unsafe { AtomicU64::from_ptr((self.key + off) as *mut u64) }
        }
    }
}

#[cfg(all(test, target_arch = "x86_64", target_os = "linux"))]
mod tests {
    use super::*;

    /// The device's step may need more stack than a thread's alternate signal stack has:
    /// `on_thread_stack` runs it on the interrupted thread's stack.
    #[test]
    fn the_ringing_threads_work_runs_on_its_own_stack_not_the_small_signal_stack() {
        use std::sync::atomic::AtomicBool;
        static RAN: AtomicBool = AtomicBool::new(false);
        /// 256 KiB of stack: far more than the 16 KiB signal stack below.
        #[inline(never)]
        fn deep() -> bool {
            let big = std::hint::black_box([7u8; 256 * 1024]);
            big.iter().map(|&b| u64::from(b)).sum::<u64>() == 7 * 256 * 1024
        }
        extern "C" fn on_usr1(_: libc::c_int, _: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
            let f: fn() -> bool = std::hint::black_box(deep);
            // SAFETY: `ctx` is this handler's context, from the kernel.
            let ok = unsafe { sig::on_thread_stack(ctx, &|| f()) };
            RAN.store(ok, Ordering::SeqCst);
        }
        std::thread::Builder::new()
            .stack_size(4 << 20)
            .spawn(|| {
                let mut alt = vec![0u8; 16 * 1024];
                let ss = libc::stack_t {
                    ss_sp: alt.as_mut_ptr().cast(),
                    ss_flags: 0,
                    ss_size: alt.len(),
                };
                let mut old = libc::stack_t {
                    ss_sp: std::ptr::null_mut(),
                    ss_flags: 0,
                    ss_size: 0,
                };
                // SAFETY: a live buffer as this thread's alternate stack; restored below.
                assert_eq!(unsafe { libc::sigaltstack(&ss, &mut old) }, 0);
                // SAFETY: a zeroed sigaction is valid; handler, flags and an empty mask.
                let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
                sa.sa_sigaction = on_usr1 as *const () as libc::sighandler_t;
                sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
                // SAFETY: `sa.sa_mask` is our own sigset_t.
                unsafe { libc::sigemptyset(&mut sa.sa_mask) };
                // SAFETY: installs our handler for SIGUSR1 (no other test uses it).
                let r = unsafe { libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()) };
                assert_eq!(r, 0);
                // SAFETY: raises SIGUSR1 on this thread, whose handler is ours.
                unsafe { libc::raise(libc::SIGUSR1) };
                // SAFETY: the previous alternate stack back; ours is unused from here.
                unsafe { libc::sigaltstack(&old, std::ptr::null_mut()) };
                drop(alt);
            })
            .expect("thread")
            .join()
            .expect("no crash");
        assert!(RAN.load(Ordering::SeqCst));
    }
}
