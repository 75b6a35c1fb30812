//! The direct path of [`super`]: a copy whose page faults are caught and turned into `EFAULT`.
//!
//! On x86_64 Linux the copy is a single `rep movsb` at a known address. A `SIGSEGV`/`SIGBUS`
//! handler checks the interrupted instruction pointer: if it is that instruction, it
//! resumes right after it (where `rcx` still holds the bytes not copied) and the copy reports
//! the fault; anything else is passed on to the handler that was installed before ours, or
//! to the default action. This is the shape of a kernel's exception-table fixup for
//! `copy_from_user`, and of how JIT runtimes (wasmtime, the JVM) recover from faults in
//! their own code while chaining everything else.
//!
//! Elsewhere (or when [`set_path`] chose [`DmaPath::Syscall`]) [`enabled`] is false and the
//! caller uses `process_vm_readv`/`process_vm_writev`.
//!
//! The handler is installed at the first DMA. A program that installs its own SIGSEGV/SIGBUS
//! handler after that without chaining to the previous one (ours) would receive the faults of
//! a bad pointer handed to the emulator instead of letting it become EFAULT; such a program
//! should run with `MLX5_EMU_DMA=syscall`.

use std::sync::atomic::{AtomicU8, Ordering};

use crate::abi::Errno;

/// How the emulator reaches user memory (process-wide).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DmaPath {
    /// A fault-catching `rep movsb` (x86_64 Linux only).
    Direct,
    /// `process_vm_readv`/`process_vm_writev` on the own process: one system call per copy.
    Syscall,
}

const UNKNOWN: u8 = 0;
const DIRECT: u8 = 1;
const SYSCALL: u8 = 2;

static PATH: AtomicU8 = AtomicU8::new(UNKNOWN);

/// True if copies go through [`copy`]. The first call decides: `MLX5_EMU_DMA=syscall` in the
/// environment, a target without the direct copy, or a failure to install the fault handler
/// choose the system-call path.
#[inline]
pub(crate) fn enabled() -> bool {
    match PATH.load(Ordering::Relaxed) {
        DIRECT => true,
        SYSCALL => false,
        _ => decide() == DmaPath::Direct,
    }
}

/// True if the direct copy has been chosen already (never decides: for a signal handler).
pub(crate) fn chosen_direct() -> bool {
    PATH.load(Ordering::Relaxed) == DIRECT
}

#[cold]
fn decide() -> DmaPath {
    let want_syscall = std::env::var_os("MLX5_EMU_DMA").is_some_and(|v| v == "syscall");
    let p = if want_syscall {
        DmaPath::Syscall
    } else {
        set_path(DmaPath::Direct)
    };
    if want_syscall {
        PATH.store(SYSCALL, Ordering::Relaxed);
    }
    p
}

/// Choose the path for the rest of the process (or until the next call). Asking for
/// [`DmaPath::Direct`] where it does not exist (or where the fault handler cannot be
/// installed) selects [`DmaPath::Syscall`]; the path in effect is returned.
pub fn set_path(want: DmaPath) -> DmaPath {
    let got = if want == DmaPath::Direct && imp::install() {
        DmaPath::Direct
    } else {
        DmaPath::Syscall
    };
    PATH.store(
        if got == DmaPath::Direct {
            DIRECT
        } else {
            SYSCALL
        },
        Ordering::Relaxed,
    );
    got
}

/// The path in effect (deciding it now if nothing has used user memory yet).
pub fn path() -> DmaPath {
    if enabled() {
        DmaPath::Direct
    } else {
        DmaPath::Syscall
    }
}

/// Copy `len` bytes from `src` to `dst`; `Err(EFAULT)` if either side faults part-way (the
/// bytes before the fault may have been copied, as with `copy_to_user`).
///
/// # Safety
/// Only callable when [`enabled`] returned true. One of the two ranges must be memory the
/// caller owns exclusively for the call (a live slice); the other is user memory, which may
/// be unmapped or read-only (that is the fault this catches) but must not overlap the first.
#[inline]
pub(crate) unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) -> Result<(), Errno> {
    // SAFETY: forwarded contract; `imp::copy` exists wherever `enabled` can be true.
    let left = unsafe { imp::copy(dst, src, len) };
    if left == 0 {
        Ok(())
    } else {
        Err(Errno(libc::EFAULT))
    }
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod imp {
    // `mlx5_emu_dma_copy(dst = rdi, src = rsi, len = rdx) -> rax = bytes not copied`.
    // The only instruction that touches memory is the `rep movsb` at
    // `mlx5_emu_dma_copy_insn`; on a fault the handler moves rip past it, so `rcx` (the
    // remaining count, which the CPU keeps exact when a string instruction faults) is the
    // return value, just as it is 0 after a complete copy. Hidden symbols: a cdylib that
    // links this crate does not export them.
    std::arch::global_asm!(
        ".pushsection .text.mlx5_emu_dma_copy,\"ax\",@progbits",
        ".p2align 4",
        ".globl mlx5_emu_dma_copy",
        ".hidden mlx5_emu_dma_copy",
        ".type mlx5_emu_dma_copy,@function",
        "mlx5_emu_dma_copy:",
        "mov rcx, rdx",
        ".globl mlx5_emu_dma_copy_insn",
        ".hidden mlx5_emu_dma_copy_insn",
        "mlx5_emu_dma_copy_insn:",
        "rep movsb",
        "mov rax, rcx",
        "ret",
        ".size mlx5_emu_dma_copy, .-mlx5_emu_dma_copy",
        ".popsection",
    );

    unsafe extern "C" {
        fn mlx5_emu_dma_copy(dst: *mut u8, src: *const u8, len: usize) -> usize;
        static mlx5_emu_dma_copy_insn: u8;
    }

    /// Length of `rep movsb` (f3 a4).
    const INSN_LEN: i64 = 2;

    /// See [`super::copy`].
    pub(super) unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) -> usize {
        // SAFETY: the routine follows the C ABI (rdi, rsi, rdx in; rax out; clobbers only
        // rcx/rsi/rdi, all caller-saved; DF is clear on entry by the ABI). The caller
        // guarantees the local side is valid; a fault on the user side lands in `on_fault`,
        // which resumes after the copy instruction, so the routine always returns.
        unsafe { mlx5_emu_dma_copy(dst, src, len) }
    }

    fn insn_addr() -> i64 {
        // Only the address of the label is taken; nothing is read through it.
        (&raw const mlx5_emu_dma_copy_insn) as i64
    }

    pub(super) fn install() -> bool {
        super::handler::install()
    }

    /// If the fault interrupted the copy instruction, resume after it (the copy then
    /// reports the bytes not copied) and return true.
    pub(super) fn fixup(ctx: *mut std::ffi::c_void) -> bool {
        let uc = ctx.cast::<libc::ucontext_t>();
        // SAFETY: the kernel passes a valid ucontext_t for an SA_SIGINFO handler; we
        // only touch the saved rip of the interrupted (same) thread.
        let rip = unsafe { &mut (*uc).uc_mcontext.gregs[libc::REG_RIP as usize] };
        if *rip == insn_addr() {
            *rip += INSN_LEN;
            return true;
        }
        false
    }
}

/// The process's SIGSEGV/SIGBUS handler: the copy's fixup, the first store to a watched UAR
/// page (which wakes the device, `crate::uar`), and everything else chained to the handler
/// that was installed before ours.
#[cfg(target_os = "linux")]
pub(crate) mod handler {
    use std::cell::UnsafeCell;
    use std::ffi::{c_int, c_void};
    use std::sync::Once;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// The actions in place before ours, for SIGSEGV and SIGBUS. Written once, before our
    /// handler is installed (the `sigaction` system call that installs it orders the
    /// write before any delivery), read-only afterwards.
    struct Saved([UnsafeCell<libc::sigaction>; 2]);
    // SAFETY: written only inside `INSTALL` before the handler that reads it can run, then
    // only read (see the type's doc).
    unsafe impl Sync for Saved {}

    static OLD: Saved = Saved([
        // SAFETY: `sigaction` is a plain C struct; all-zero is SIG_DFL, no flags, empty mask.
        UnsafeCell::new(unsafe { std::mem::zeroed() }),
        // SAFETY: as above.
        UnsafeCell::new(unsafe { std::mem::zeroed() }),
    ]);
    static INSTALL: Once = Once::new();
    static INSTALLED: AtomicBool = AtomicBool::new(false);

    const SIGNALS: [c_int; 2] = [libc::SIGSEGV, libc::SIGBUS];

    pub(crate) fn install() -> bool {
        INSTALL.call_once(|| {
            for (i, &sig) in SIGNALS.iter().enumerate() {
                // SAFETY: queries the current action into our own storage; nothing reads
                // OLD yet because our handler is not installed for `sig`.
                if unsafe { libc::sigaction(sig, std::ptr::null(), OLD.0[i].get()) } != 0 {
                    return;
                }
            }
            for &sig in &SIGNALS {
                // SAFETY: a zeroed sigaction is valid; we fill handler, flags and an empty mask.
                let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
                sa.sa_sigaction = on_fault as *const () as libc::sighandler_t;
                sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_NODEFER;
                // SAFETY: `sa.sa_mask` is our own sigset_t.
                unsafe { libc::sigemptyset(&mut sa.sa_mask) };
                // SAFETY: installs a handler that is async-signal-safe (it reads statics,
                // edits the interrupted context, and calls only mprotect, write and
                // sigaction).
                if unsafe { libc::sigaction(sig, &sa, std::ptr::null_mut()) } != 0 {
                    return;
                }
            }
            INSTALLED.store(true, Ordering::Release);
        });
        INSTALLED.load(Ordering::Acquire)
    }

    /// True once our handler is in place.
    pub(crate) fn installed() -> bool {
        INSTALLED.load(Ordering::Acquire)
    }

    extern "C" fn on_fault(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
        if sig == libc::SIGSEGV {
            // SAFETY: __errno_location has no preconditions and returns this thread's
            // errno slot, valid for the thread's lifetime.
            let slot = unsafe { libc::__errno_location() };
            // mprotect/write may set errno: the interrupted code must find its own.
            // SAFETY: `slot` is this thread's errno, readable and writable.
            let errno = unsafe { *slot };
            // SAFETY: the siginfo the kernel passes to an SA_SIGINFO handler is valid for
            // the call.
            let info_ref = unsafe { &*info };
            // SAFETY: for SIGSEGV the kernel fills si_addr with the faulting address.
            let addr = unsafe { info_ref.si_addr() } as usize;
            // SAFETY: this is the SA_SIGINFO SIGSEGV handler for the fault at hand and `ctx`
            // the context the kernel passed it.
            let handled =
                unsafe { crate::watch::on_write_fault(addr, ctx, crate::mem::read_in_handler) };
            // SAFETY: as above.
            unsafe { *slot = errno };
            if handled {
                return;
            }
        }
        if super::imp::fixup(ctx) {
            return;
        }
        let i = usize::from(sig == libc::SIGBUS);
        // SAFETY: OLD was written before this handler was installed and is read-only now.
        let old = unsafe { &*OLD.0[i].get() };
        let h = old.sa_sigaction;
        if h == libc::SIG_DFL || h == libc::SIG_IGN {
            // Back to the default action and return: the faulting instruction runs again
            // and the process dies of the signal, as it would have without us.
            // SAFETY: `sigaction` is a plain C struct; all-zero is SIG_DFL.
            let dfl: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: sigaction is async-signal-safe; `dfl` is a valid action.
            unsafe { libc::sigaction(sig, &dfl, std::ptr::null_mut()) };
        } else if old.sa_flags & libc::SA_SIGINFO != 0 {
            // SAFETY: with SA_SIGINFO the saved handler has the three-argument signature.
            let f: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) =
                unsafe { std::mem::transmute(h) };
            f(sig, info, ctx);
        } else {
            // SAFETY: without SA_SIGINFO the saved handler has the one-argument signature.
            let f: extern "C" fn(c_int) = unsafe { std::mem::transmute(h) };
            f(sig);
        }
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
mod imp {
    pub(super) fn install() -> bool {
        false
    }

    /// No copy instruction to resume here.
    #[cfg(target_os = "linux")]
    pub(super) fn fixup(_ctx: *mut std::ffi::c_void) -> bool {
        false
    }

    /// Never called: [`super::enabled`] is false here.
    pub(super) unsafe fn copy(_dst: *mut u8, _src: *const u8, len: usize) -> usize {
        len
    }
}
