//! Interception below libc: `mmap`/`munmap` system calls that never pass through our hooks.
//!
//! A program with its own memory hooks (UCX's bistro hooks patch the first `mmap` that
//! `dlsym` finds, ours, with a jump to a function that issues `syscall(SYS_mmap, ..)`), or
//! one that calls `syscall(SYS_mmap, ..)` itself, sends libmlx5's UAR `mmap` of the emulated
//! uverbs descriptor (a descriptor of the null device) straight to the kernel: `ENODEV`. So
//! at the first device open the shim installs a seccomp filter that makes the kernel refuse
//! exactly those calls with `SIGSYS` (`SECCOMP_RET_TRAP`) instead of running them:
//!
//! * `mmap` whose descriptor lies in [`FD_SLOTS`] numbers from a base chosen at
//!   installation; every device descriptor is moved into that range when it is opened
//!   ([`place`]);
//! * `munmap` of one page or less (every device mapping is one page).
//!
//! The `SIGSYS` handler ([`on_sigsys`]) runs in the calling thread, reads the arguments from
//! the saved registers and serves the call as the libc hook would (the emulator maps its
//! pages, watched by the doorbell fault handler exactly as before: `docs/emulator-preload.md`),
//! or, when the descriptor or address is not ours, performs the system call itself and
//! returns its result in the return register. That forwarding call is made from a gadget
//! page at a fixed address ([`GADGET_ADDR`]) that the filter lets through; the address is
//! the same in every process, so a program started by `exec` from a filtered one (the
//! filter survives `exec`), if the shim is loaded in it, forwards through its own copy.
//! The handler is installed with `SA_NODEFER`: the emulator's own `munmap` of a device page,
//! made while a trapped call is being served, traps again and is forwarded.
//!
//! Our traps carry [`TRAP_DATA`] in `si_errno`; any other `SIGSYS` goes to the handler that
//! was installed before ours.

#[cfg(not(test))]
use std::ffi::{c_int, c_long, c_void};

/// Device descriptors live in `base..base + FD_SLOTS`.
pub(crate) const FD_SLOTS: i32 = 64;
/// Highest descriptor number the range may end at (the registry's lock-free bitmap covers
/// descriptors below 4096).
#[cfg(not(test))]
const FD_CEILING: i32 = 4096;
/// `SECCOMP_RET_DATA` of our traps, delivered in `si_errno`: tells our `SIGSYS` from others.
pub(crate) const TRAP_DATA: u16 = 0x4d35;
/// The largest `munmap` length trapped (device mappings are one page).
const MUNMAP_TRAP_MAX: u32 = 4096;
/// Where the forwarding gadget is copied, in every process (below 2^39, so inside the
/// smallest AArch64 user address space, and far from where Linux puts programs, heaps and
/// libraries).
pub(crate) const GADGET_ADDR: usize = 0x3e_d5e0_0000;
/// `si_code` of a seccomp `SIGSYS`.
#[cfg(not(test))]
const SYS_SECCOMP: c_int = 1;

#[cfg(target_arch = "x86_64")]
mod arch {
    /// `AUDIT_ARCH_X86_64`.
    pub(crate) const AUDIT_ARCH: u32 = 0xc000_003e;
    /// x32 system calls have this bit set; they are let through untouched.
    pub(crate) const X32_BIT: Option<u32> = Some(0x4000_0000);
    pub(crate) const SYS_MMAP: u32 = 9;
    pub(crate) const SYS_MUNMAP: u32 = 11;

    #[cfg(not(test))]
    // The forwarding gadget: `fn(nr, a0, a1, a2, a3, a4, a5) -> ret` in the System V calling
    // convention (a5 on the stack), position independent so that it can be copied.
    std::arch::global_asm!(
        ".pushsection .text.mlx5_emu_preload_gadget,\"ax\",@progbits",
        ".globl mlx5_emu_preload_gadget",
        ".hidden mlx5_emu_preload_gadget",
        ".globl mlx5_emu_preload_gadget_ret",
        ".hidden mlx5_emu_preload_gadget_ret",
        ".globl mlx5_emu_preload_gadget_end",
        ".hidden mlx5_emu_preload_gadget_end",
        "mlx5_emu_preload_gadget:",
        "mov rax, rdi",
        "mov rdi, rsi",
        "mov rsi, rdx",
        "mov rdx, rcx",
        "mov r10, r8",
        "mov r8, r9",
        "mov r9, qword ptr [rsp + 8]",
        "syscall",
        "mlx5_emu_preload_gadget_ret:",
        "ret",
        "mlx5_emu_preload_gadget_end:",
        ".popsection",
    );

    /// The six system-call arguments and the number of a trapped call, from the saved
    /// registers; and where its result goes.
    ///
    /// # Safety
    /// `uc` is the `ucontext_t` the kernel passed to a `SA_SIGINFO` handler.
    #[cfg(not(test))]
    pub(crate) unsafe fn args(uc: *mut libc::c_void) -> [u64; 6] {
        // SAFETY: by the caller's contract.
        let g = unsafe { &(*uc.cast::<libc::ucontext_t>()).uc_mcontext.gregs };
        [
            libc::REG_RDI,
            libc::REG_RSI,
            libc::REG_RDX,
            libc::REG_R10,
            libc::REG_R8,
            libc::REG_R9,
        ]
        .map(|r| g[r as usize] as u64)
    }

    /// Store the result of the trapped call.
    ///
    /// # Safety
    /// As [`args`].
    #[cfg(not(test))]
    pub(crate) unsafe fn set_result(uc: *mut libc::c_void, ret: i64) {
        // SAFETY: by the caller's contract.
        unsafe { (*uc.cast::<libc::ucontext_t>()).uc_mcontext.gregs[libc::REG_RAX as usize] = ret };
    }

    /// Make freshly written code at `_p.._p + _len` visible to instruction fetch (x86 keeps
    /// the caches coherent).
    #[cfg(not(test))]
    pub(crate) fn sync_icache(_p: usize, _len: usize) {}
}

#[cfg(target_arch = "aarch64")]
mod arch {
    /// `AUDIT_ARCH_AARCH64`.
    pub(crate) const AUDIT_ARCH: u32 = 0xc000_00b7;
    pub(crate) const X32_BIT: Option<u32> = None;
    pub(crate) const SYS_MMAP: u32 = 222;
    pub(crate) const SYS_MUNMAP: u32 = 215;

    #[cfg(not(test))]
    // The forwarding gadget: `fn(nr, a0, .., a5) -> ret` in the AAPCS64 convention.
    std::arch::global_asm!(
        ".pushsection .text.mlx5_emu_preload_gadget,\"ax\",%progbits",
        ".globl mlx5_emu_preload_gadget",
        ".hidden mlx5_emu_preload_gadget",
        ".globl mlx5_emu_preload_gadget_ret",
        ".hidden mlx5_emu_preload_gadget_ret",
        ".globl mlx5_emu_preload_gadget_end",
        ".hidden mlx5_emu_preload_gadget_end",
        "mlx5_emu_preload_gadget:",
        "mov x8, x0",
        "mov x0, x1",
        "mov x1, x2",
        "mov x2, x3",
        "mov x3, x4",
        "mov x4, x5",
        "mov x5, x6",
        "svc #0",
        "mlx5_emu_preload_gadget_ret:",
        "ret",
        "mlx5_emu_preload_gadget_end:",
        ".popsection",
    );

    /// See the x86-64 version.
    ///
    /// # Safety
    /// `uc` is the `ucontext_t` the kernel passed to a `SA_SIGINFO` handler.
    #[cfg(not(test))]
    pub(crate) unsafe fn args(uc: *mut libc::c_void) -> [u64; 6] {
        // SAFETY: by the caller's contract.
        let r = unsafe { &(*uc.cast::<libc::ucontext_t>()).uc_mcontext.regs };
        [r[0], r[1], r[2], r[3], r[4], r[5]]
    }

    /// Store the result of the trapped call.
    ///
    /// # Safety
    /// As [`args`].
    #[cfg(not(test))]
    pub(crate) unsafe fn set_result(uc: *mut libc::c_void, ret: i64) {
        // SAFETY: by the caller's contract.
        unsafe { (*uc.cast::<libc::ucontext_t>()).uc_mcontext.regs[0] = ret as u64 };
    }

    /// Clean the data cache and invalidate the instruction cache over freshly written code.
    #[cfg(not(test))]
    pub(crate) fn sync_icache(p: usize, len: usize) {
        let mut a = p & !63;
        while a < p + len {
            // SAFETY: cache maintenance by virtual address on our own mapped page; no memory
            // is changed.
            unsafe { std::arch::asm!("dc cvau, {0}", "dsb ish", "ic ivau, {0}", in(reg) a) };
            a += 64;
        }
        // SAFETY: barriers only.
        unsafe { std::arch::asm!("dsb ish", "isb") };
    }
}

#[cfg(not(test))]
unsafe extern "C" {
    /// Start of the gadget's code (in our text; executed only through its copy).
    static mlx5_emu_preload_gadget: u8;
    /// The instruction after the system call instruction.
    static mlx5_emu_preload_gadget_ret: u8;
    /// End of the gadget's code.
    static mlx5_emu_preload_gadget_end: u8;
}

/// Prototype of the gadget.
#[cfg(not(test))]
type Gadget =
    unsafe extern "C" fn(c_long, c_long, c_long, c_long, c_long, c_long, c_long) -> c_long;

// ---------------------------------------------------------------------------------------
// The filter

/// One classic BPF instruction (`struct sock_filter`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Insn {
    pub(crate) code: u16,
    pub(crate) jt: u8,
    pub(crate) jf: u8,
    pub(crate) k: u32,
}

pub(crate) const LD_W_ABS: u16 = 0x20;
pub(crate) const JEQ_K: u16 = 0x15;
pub(crate) const JGT_K: u16 = 0x25;
pub(crate) const JGE_K: u16 = 0x35;
pub(crate) const RET_K: u16 = 0x06;
pub(crate) const RET_ALLOW: u32 = 0x7fff_0000;
pub(crate) const RET_TRAP: u32 = 0x0003_0000 | TRAP_DATA as u32;

/// `struct seccomp_data` offsets: `nr`, `arch`, `instruction_pointer`, `args[i]` (little
/// endian: the low word first).
pub(crate) const OFF_NR: u32 = 0;
pub(crate) const OFF_ARCH: u32 = 4;
pub(crate) const OFF_IP: u32 = 8;
pub(crate) const fn off_arg(i: u32) -> u32 {
    16 + 8 * i
}

/// A jump target while the program is assembled.
#[derive(Clone, Copy, PartialEq, Eq)]
enum To {
    /// The next instruction.
    Next,
    /// `n` instructions further.
    Skip(u8),
    Allow,
    Trap,
    Mmap,
    Munmap,
}

enum Op {
    Ld(u32),
    Jmp(u16, u32, To, To),
    Ret(u32),
    Mark(To),
}

/// The filter: let the gadget's own calls and other architectures through, trap `mmap` of a
/// descriptor in `fd_base..fd_base + FD_SLOTS` and `munmap` of one page at most, let
/// everything else through. `nrs` are the `mmap` and `munmap` numbers.
pub(crate) fn filter(
    arch: u32,
    x32_bit: Option<u32>,
    nrs: (u32, u32),
    fd_base: u32,
    gadget_ip: u64,
) -> Vec<Insn> {
    let (mmap, munmap) = nrs;
    let mut p = vec![
        Op::Ld(OFF_ARCH),
        Op::Jmp(JEQ_K, arch, To::Next, To::Allow),
        Op::Ld(OFF_NR),
    ];
    if let Some(bit) = x32_bit {
        p.push(Op::Jmp(JGE_K, bit, To::Allow, To::Next));
    }
    p.push(Op::Jmp(JEQ_K, mmap, To::Mmap, To::Next));
    p.push(Op::Jmp(JEQ_K, munmap, To::Munmap, To::Allow));
    // mmap: the gadget's call, or a descriptor outside the range, passes.
    p.push(Op::Mark(To::Mmap));
    p.extend(gadget_check(gadget_ip));
    p.push(Op::Ld(off_arg(4)));
    p.push(Op::Jmp(JGE_K, fd_base, To::Next, To::Allow));
    p.push(Op::Jmp(
        JGE_K,
        fd_base + FD_SLOTS as u32,
        To::Allow,
        To::Trap,
    ));
    // munmap: the gadget's call, a zero length, or more than a page passes.
    p.push(Op::Mark(To::Munmap));
    p.extend(gadget_check(gadget_ip));
    p.push(Op::Ld(off_arg(1) + 4));
    p.push(Op::Jmp(JEQ_K, 0, To::Next, To::Allow));
    p.push(Op::Ld(off_arg(1)));
    p.push(Op::Jmp(JEQ_K, 0, To::Allow, To::Next));
    p.push(Op::Jmp(JGT_K, MUNMAP_TRAP_MAX, To::Allow, To::Trap));
    p.push(Op::Mark(To::Allow));
    p.push(Op::Ret(RET_ALLOW));
    p.push(Op::Mark(To::Trap));
    p.push(Op::Ret(RET_TRAP));
    assemble(&p)
}

/// "If the instruction pointer is the gadget's, allow"; falls through otherwise.
fn gadget_check(ip: u64) -> [Op; 4] {
    [
        Op::Ld(OFF_IP),
        Op::Jmp(JEQ_K, ip as u32, To::Next, To::Skip(2)),
        Op::Ld(OFF_IP + 4),
        Op::Jmp(JEQ_K, (ip >> 32) as u32, To::Allow, To::Next),
    ]
}

/// Resolve the labels into relative jumps.
fn assemble(ops: &[Op]) -> Vec<Insn> {
    // Instruction index of every op (marks take none).
    let mut index = Vec::with_capacity(ops.len());
    let mut n = 0usize;
    for op in ops {
        index.push(n);
        if !matches!(op, Op::Mark(_)) {
            n += 1;
        }
    }
    let mark = |t: To| -> usize {
        ops.iter()
            .zip(&index)
            .find(|(op, _)| matches!(op, Op::Mark(a) if *a == t))
            .map_or(n, |(_, &i)| i)
    };
    let mut out = Vec::with_capacity(n);
    for (op, &i) in ops.iter().zip(&index) {
        match *op {
            Op::Ld(k) => out.push(Insn {
                code: LD_W_ABS,
                jt: 0,
                jf: 0,
                k,
            }),
            Op::Ret(k) => out.push(Insn {
                code: RET_K,
                jt: 0,
                jf: 0,
                k,
            }),
            Op::Mark(_) => {}
            Op::Jmp(code, k, t, f) => {
                let rel = |to: To| -> u8 {
                    let target = match to {
                        To::Next => i + 1,
                        To::Skip(s) => i + 1 + usize::from(s),
                        other => mark(other),
                    };
                    // Every target lies ahead, within a program far shorter than 256.
                    u8::try_from(target.saturating_sub(i + 1)).unwrap_or(u8::MAX)
                };
                out.push(Insn {
                    code,
                    jt: rel(t),
                    jf: rel(f),
                    k,
                });
            }
        }
    }
    out
}

/// Run `prog` on a `struct seccomp_data` image (a classic BPF interpreter for the
/// instructions [`filter`] uses); `None` for anything else or a jump out of the program.
#[cfg(test)]
pub(crate) fn run(prog: &[Insn], data: &[u8; 64]) -> Option<u32> {
    let mut acc = 0u32;
    let mut pc = 0usize;
    loop {
        let insn = prog.get(pc)?;
        pc += 1;
        match insn.code {
            LD_W_ABS => {
                let o = usize::try_from(insn.k).ok()?;
                let w = data.get(o..o + 4)?;
                acc = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
            }
            RET_K => return Some(insn.k),
            JEQ_K | JGT_K | JGE_K => {
                let taken = match insn.code {
                    JEQ_K => acc == insn.k,
                    JGT_K => acc > insn.k,
                    _ => acc >= insn.k,
                };
                pc += usize::from(if taken { insn.jt } else { insn.jf });
            }
            _ => return None,
        }
    }
}

/// A `struct seccomp_data` image.
#[cfg(test)]
pub(crate) fn seccomp_data(nr: u32, arch: u32, ip: u64, args: [u64; 6]) -> [u8; 64] {
    let mut d = [0u8; 64];
    d[0..4].copy_from_slice(&nr.to_le_bytes());
    d[4..8].copy_from_slice(&arch.to_le_bytes());
    d[8..16].copy_from_slice(&ip.to_le_bytes());
    for (i, a) in args.iter().enumerate() {
        d[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_le_bytes());
    }
    d
}

// ---------------------------------------------------------------------------------------
// Installation and the SIGSYS handler

#[cfg(not(test))]
pub(crate) use live::{inherited, place};

#[cfg(not(test))]
mod live {
    use super::*;
    use std::cell::UnsafeCell;
    use std::ptr::NonNull;
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicI32, AtomicU8, Ordering};

    use crate::shim::{self, REGISTRY};

    /// [`NEW`], [`BUSY`], [`ON`] or [`OFF`].
    static STATE: AtomicU8 = AtomicU8::new(NEW);
    const NEW: u8 = 0;
    const BUSY: u8 = 1;
    const ON: u8 = 2;
    const OFF: u8 = 3;
    /// First descriptor of the trapped range (valid once [`STATE`] is [`ON`]).
    static FD_BASE: AtomicI32 = AtomicI32::new(-1);
    /// Whether this process has its copy of the gadget at [`GADGET_ADDR`].
    static GADGET: OnceLock<bool> = OnceLock::new();
    /// Whether our handler is installed (and [`OLD`] written).
    static HANDLER: OnceLock<bool> = OnceLock::new();

    /// The `SIGSYS` action in place before ours. Written once, before our handler is
    /// installed (the `sigaction` call that installs it orders the write before any
    /// delivery), read only by the handler afterwards.
    struct Saved(UnsafeCell<libc::sigaction>);
    // SAFETY: see the type's comment: one write before publication, reads after.
    unsafe impl Sync for Saved {}
    static OLD: Saved = Saved(UnsafeCell::new(
        // SAFETY: `sigaction` is a plain C struct; all-zero is SIG_DFL, no flags.
        unsafe { std::mem::zeroed() },
    ));

    /// `siginfo_t` as the kernel fills it for `SIGSYS` (the `_sigsys` member).
    #[repr(C)]
    struct SigsysInfo {
        signo: c_int,
        errno: c_int,
        code: c_int,
        _pad: c_int,
        call_addr: *mut c_void,
        syscall: c_int,
        arch: u32,
    }

    /// Constructor: a process started by `exec` from a filtered one inherits the filter
    /// (but not our handler): install the handler, so that trapped calls are forwarded.
    pub(crate) fn inherited() {
        // SAFETY: PR_GET_SECCOMP takes no pointer arguments.
        if unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) } == 2 {
            map_gadget();
            install_handler();
        }
    }

    /// Move a freshly opened device descriptor into the trapped range (installing the
    /// traps at the first call). Returns the descriptor to use (`fd` itself when the traps
    /// are off or the range is full).
    pub(crate) fn place(fd: c_int, cloexec: bool) -> c_int {
        if !ensure() {
            return fd;
        }
        let base = FD_BASE.load(Ordering::Acquire);
        let cmd = if cloexec {
            libc::F_DUPFD_CLOEXEC
        } else {
            libc::F_DUPFD
        };
        let Some(fcntl) = crate::real::fcntl() else {
            return fd;
        };
        // SAFETY: F_DUPFD on a descriptor we just opened; no pointer arguments.
        let new = unsafe { fcntl(fd, cmd, base as libc::c_ulong) };
        if new < 0 {
            return fd;
        }
        let close = crate::real::close();
        let keep = new < base + FD_SLOTS;
        let (used, spare) = if keep { (new, fd) } else { (fd, new) };
        if let Some(close) = close {
            // SAFETY: closing our own spare descriptor, known to nobody.
            unsafe { close(spare) };
        }
        used
    }

    /// Install the traps once; whether they are on.
    fn ensure() -> bool {
        loop {
            match STATE.compare_exchange(NEW, BUSY, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    let on = install();
                    STATE.store(if on { ON } else { OFF }, Ordering::Release);
                    return on;
                }
                Err(BUSY) => std::thread::yield_now(),
                Err(s) => return s == ON,
            }
        }
    }

    fn install() -> bool {
        if !shim::config().syscall_trap {
            return false;
        }
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit into our own struct.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
            return false;
        }
        let top = i32::try_from(lim.rlim_cur)
            .unwrap_or(i32::MAX)
            .min(FD_CEILING);
        if top < 4 * FD_SLOTS {
            shim::log(
                "too few descriptors allowed to reserve a range: mmap/munmap system calls that bypass libc are not intercepted",
            );
            return false;
        }
        let base = top - FD_SLOTS;
        if !map_gadget() || !install_handler() {
            shim::log(&format!(
                "cannot place the system-call gadget at {GADGET_ADDR:#x}: mmap/munmap system calls that bypass libc are not intercepted"
            ));
            return false;
        }
        let ip = GADGET_ADDR as u64 + gadget_ret_offset() as u64;
        let prog: Vec<libc::sock_filter> = filter(
            arch::AUDIT_ARCH,
            arch::X32_BIT,
            (arch::SYS_MMAP, arch::SYS_MUNMAP),
            base as u32,
            ip,
        )
        .into_iter()
        .map(|i| libc::sock_filter {
            code: i.code,
            jt: i.jt,
            jf: i.jf,
            k: i.k,
        })
        .collect();
        let fprog = libc::sock_fprog {
            len: prog.len() as u16,
            filter: prog.as_ptr().cast_mut(),
        };
        let set = || {
            // SAFETY: seccomp(SET_MODE_FILTER) reads the program `fprog` points at, which
            // lives for the call; the kernel copies it.
            unsafe {
                libc::syscall(
                    libc::SYS_seccomp,
                    libc::SECCOMP_SET_MODE_FILTER,
                    libc::SECCOMP_FILTER_FLAG_TSYNC,
                    &raw const fprog,
                )
            }
        };
        let mut rc = set();
        if rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EACCES) {
            // Unprivileged: a filter needs no_new_privs (the process may no longer gain
            // privileges through exec of a set-user-ID program).
            // SAFETY: PR_SET_NO_NEW_PRIVS takes no pointer arguments.
            unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
            rc = set();
        }
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            shim::log(&format!(
                "cannot install the seccomp filter ({}): mmap/munmap system calls that bypass libc are not intercepted",
                if rc > 0 {
                    format!("thread {rc} cannot be synchronised")
                } else {
                    e.to_string()
                }
            ));
            return false;
        }
        FD_BASE.store(base, Ordering::Release);
        true
    }

    fn gadget_range() -> (usize, usize, usize) {
        (
            (&raw const mlx5_emu_preload_gadget) as usize,
            (&raw const mlx5_emu_preload_gadget_ret) as usize,
            (&raw const mlx5_emu_preload_gadget_end) as usize,
        )
    }

    fn gadget_ret_offset() -> usize {
        let (start, ret, _) = gadget_range();
        ret - start
    }

    /// Copy the gadget to [`GADGET_ADDR`] (once per process).
    fn map_gadget() -> bool {
        *GADGET.get_or_init(|| {
            let (start, _, end) = gadget_range();
            let len = end - start;
            // SAFETY: a fresh private anonymous page at a fixed address that must be free
            // (MAP_FIXED_NOREPLACE never replaces a mapping).
            let p = unsafe {
                libc::mmap(
                    GADGET_ADDR as *mut c_void,
                    4096,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return false;
            }
            if p as usize != GADGET_ADDR {
                // An old kernel took the address as a hint only.
                // SAFETY: our own fresh mapping.
                unsafe { libc::munmap(p, 4096) };
                return false;
            }
            // SAFETY: `start..end` is our gadget's code (readable text), the destination our
            // fresh writable page; `len` is a few dozen bytes.
            unsafe { std::ptr::copy_nonoverlapping(start as *const u8, p.cast::<u8>(), len) };
            arch::sync_icache(GADGET_ADDR, len);
            // SAFETY: our own page, now code.
            unsafe { libc::mprotect(p, 4096, libc::PROT_READ | libc::PROT_EXEC) == 0 }
        })
    }

    fn install_handler() -> bool {
        *HANDLER.get_or_init(|| {
            // SAFETY: reading the current action into OLD, before our handler exists.
            if unsafe { libc::sigaction(libc::SIGSYS, std::ptr::null(), OLD.0.get()) } != 0 {
                return false;
            }
            // SAFETY: a zeroed sigaction is valid; handler, flags and an empty mask are set.
            let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
            let handler: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) = on_sigsys;
            sa.sa_sigaction = handler as usize;
            // NODEFER: a trapped call made while one is being served (the emulator's own
            // munmap of a device page) is delivered, not fatal.
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER;
            // SAFETY: installing a valid handler for SIGSYS.
            unsafe { libc::sigaction(libc::SIGSYS, &sa, std::ptr::null_mut()) == 0 }
        })
    }

    /// Perform system call `nr` through the gadget (let through by the filter); `-ENOSYS`
    /// if this process has no gadget.
    fn forward(nr: u32, a: [u64; 6]) -> i64 {
        if GADGET.get() != Some(&true) {
            return -i64::from(libc::ENOSYS);
        }
        // SAFETY: GADGET_ADDR holds our copy of the gadget (GADGET is true), whose
        // signature is `Gadget`.
        let g = unsafe { std::mem::transmute::<usize, Gadget>(GADGET_ADDR) };
        let a = a.map(|v| v as c_long);
        // SAFETY: the arguments of a system call the program made, performed unchanged.
        unsafe { g(nr as c_long, a[0], a[1], a[2], a[3], a[4], a[5]) }
    }

    /// This thread's `errno`.
    fn errno() -> c_int {
        // SAFETY: __errno_location has no preconditions and returns this thread's errno slot.
        let slot = unsafe { libc::__errno_location() };
        // SAFETY: the slot is valid for the life of the thread.
        unsafe { *slot }
    }

    /// The result of a hook-style call (`-1`/`MAP_FAILED` and errno) as a system call's.
    fn as_syscall(ok: bool, value: i64) -> i64 {
        if ok { value } else { -i64::from(errno()) }
    }

    fn serve(nr: u32, a: [u64; 6]) -> i64 {
        if nr == arch::SYS_MMAP {
            let fd = a[4] as i32;
            if let Some(file) = REGISTRY.fd(fd) {
                let p = shim::device_mmap(
                    fd,
                    &file,
                    a[0] as *mut c_void,
                    a[1] as usize,
                    a[2] as c_int,
                    a[3] as c_int,
                    a[5] as i64,
                );
                return as_syscall(p != libc::MAP_FAILED, p as i64);
            }
        } else if nr == arch::SYS_MUNMAP {
            if let Some(nn) = NonNull::new(a[0] as *mut c_void) {
                if let Some((file, _)) = REGISTRY.take_map(a[0] as usize) {
                    let rc = shim::device_munmap(&file, nn, a[1] as usize);
                    return as_syscall(rc == 0, 0);
                }
            }
        }
        forward(nr, a)
    }

    /// The `SIGSYS` handler.
    extern "C" fn on_sigsys(sig: c_int, info: *mut libc::siginfo_t, uc: *mut c_void) {
        // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler; for SIGSYS it
        // has the `_sigsys` layout.
        let si = unsafe { &*info.cast::<SigsysInfo>() };
        if si.code != SYS_SECCOMP
            || si.errno != c_int::from(TRAP_DATA)
            || si.arch != arch::AUDIT_ARCH
        {
            chain(sig, info, uc);
            return;
        }
        let saved = errno();
        // SAFETY: `uc` is the kernel's ucontext for this delivery.
        let args = unsafe { arch::args(uc) };
        let nr = si.syscall as u32;
        let ret = shim::guard(-i64::from(libc::EIO), || serve(nr, args));
        // SAFETY: as above; the result register of the trapped call.
        unsafe { arch::set_result(uc, ret) };
        shim::set_errno(saved);
    }

    /// A `SIGSYS` that is not ours: to the handler installed before ours, or the default
    /// action.
    fn chain(sig: c_int, info: *mut libc::siginfo_t, uc: *mut c_void) {
        // SAFETY: OLD was written before our handler was installed and is never written
        // again.
        let old = unsafe { &*OLD.0.get() };
        let h = old.sa_sigaction;
        if h == libc::SIG_DFL || h == libc::SIG_IGN {
            // SAFETY: a zeroed sigaction is SIG_DFL.
            let dfl: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: restoring the default action; then the signal is raised again with it
            // (terminate with a core dump), as without us.
            unsafe { libc::sigaction(sig, &dfl, std::ptr::null_mut()) };
            // SAFETY: raise has no memory arguments.
            unsafe { libc::raise(sig) };
        } else if old.sa_flags & libc::SA_SIGINFO != 0 {
            // SAFETY: with SA_SIGINFO the saved handler has the three-argument signature.
            let f = unsafe {
                std::mem::transmute::<usize, extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void)>(
                    h,
                )
            };
            f(sig, info, uc);
        } else {
            // SAFETY: without SA_SIGINFO the saved handler has the one-argument signature.
            let f = unsafe { std::mem::transmute::<usize, extern "C" fn(c_int)>(h) };
            f(sig);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ARCH: u32 = arch::AUDIT_ARCH;
    const MMAP: u32 = arch::SYS_MMAP;
    const MUNMAP: u32 = arch::SYS_MUNMAP;
    const BASE: u32 = 4032;
    const IP: u64 = GADGET_ADDR as u64 + 27;

    fn prog() -> Vec<Insn> {
        filter(ARCH, arch::X32_BIT, (MMAP, MUNMAP), BASE, IP)
    }

    fn decide(nr: u32, arch: u32, ip: u64, args: [u64; 6]) -> u32 {
        run(&prog(), &seccomp_data(nr, arch, ip, args)).expect("the filter returns")
    }

    fn mmap_fd(fd: u64) -> [u64; 6] {
        [0, 4096, 3, 1, fd, 0]
    }

    #[test]
    fn traps_mmap_of_the_device_range_only() {
        let elsewhere = 0x7f00_0000_1234;
        for fd in [BASE, BASE + 1, BASE + FD_SLOTS as u32 - 1] {
            assert_eq!(decide(MMAP, ARCH, elsewhere, mmap_fd(fd.into())), RET_TRAP);
        }
        for fd in [0, 3, BASE - 1, BASE + FD_SLOTS as u32, u32::MAX] {
            assert_eq!(
                decide(MMAP, ARCH, elsewhere, mmap_fd(fd.into())),
                RET_ALLOW,
                "fd {fd}"
            );
        }
        // Anonymous mappings pass -1 (sign-extended or not).
        assert_eq!(decide(MMAP, ARCH, elsewhere, mmap_fd(u64::MAX)), RET_ALLOW);
        // The gadget's own call passes, whatever the descriptor; a near miss does not.
        assert_eq!(decide(MMAP, ARCH, IP, mmap_fd(BASE.into())), RET_ALLOW);
        assert_eq!(decide(MMAP, ARCH, IP + 1, mmap_fd(BASE.into())), RET_TRAP);
        assert_eq!(
            decide(MMAP, ARCH, IP ^ (1 << 40), mmap_fd(BASE.into())),
            RET_TRAP
        );
        assert_eq!(
            decide(MMAP, ARCH, IP & 0xffff_ffff, mmap_fd(BASE.into())),
            RET_TRAP
        );
    }

    #[test]
    fn traps_munmap_of_one_page_at_most() {
        let at = |len: u64| decide(MUNMAP, ARCH, 0x1000, [0x7f00_0000_0000, len, 0, 0, 0, 0]);
        for len in [1, 8, 4095, 4096] {
            assert_eq!(at(len), RET_TRAP, "len {len}");
        }
        for len in [0, 4097, 8192, 1 << 32, (1 << 32) + 4096, u64::MAX] {
            assert_eq!(at(len), RET_ALLOW, "len {len}");
        }
        assert_eq!(
            decide(MUNMAP, ARCH, IP, [0x1000, 4096, 0, 0, 0, 0]),
            RET_ALLOW
        );
    }

    #[test]
    fn everything_else_passes() {
        for nr in [0, 1, 2, 3, 10, 12, 25, 60, 231, 435] {
            if nr != MMAP && nr != MUNMAP {
                assert_eq!(
                    decide(nr, ARCH, 0, mmap_fd(BASE.into())),
                    RET_ALLOW,
                    "nr {nr}"
                );
            }
        }
        // Another architecture's calls (a 32-bit process image) are not ours to judge.
        assert_eq!(
            decide(MMAP, 0x4000_0003, 0, mmap_fd(BASE.into())),
            RET_ALLOW
        );
        if let Some(bit) = arch::X32_BIT {
            assert_eq!(decide(MMAP | bit, ARCH, 0, mmap_fd(BASE.into())), RET_ALLOW);
        }
    }

    #[test]
    fn random_inputs_get_a_decision_that_matches_the_rule() {
        // xorshift: reproducible.
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let p = prog();
        for _ in 0..20_000 {
            let nr = [MMAP, MUNMAP, next() as u32 % 512][next() as usize % 3];
            let ip = if next() % 4 == 0 { IP } else { next() };
            let mut args = [0u64; 6];
            for a in &mut args {
                *a = match next() % 3 {
                    0 => next() % 8192,
                    1 => u64::from(BASE) + next() % 128,
                    _ => next(),
                };
            }
            let want = if ip == IP {
                RET_ALLOW
            } else if nr == MMAP {
                let fd = args[4] as u32;
                if (BASE..BASE + FD_SLOTS as u32).contains(&fd) {
                    RET_TRAP
                } else {
                    RET_ALLOW
                }
            } else if nr == MUNMAP {
                if (1..=4096).contains(&args[1]) {
                    RET_TRAP
                } else {
                    RET_ALLOW
                }
            } else {
                RET_ALLOW
            };
            let got = run(&p, &seccomp_data(nr, ARCH, ip, args)).expect("a decision");
            assert_eq!(got, want, "nr {nr} ip {ip:#x} args {args:x?}");
        }
    }
}
