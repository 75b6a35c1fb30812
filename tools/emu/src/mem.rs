//! Access to user memory of the own process without trusting the pointer.
//!
//! Everything the emulated kernel and device read from or write to "user" memory goes
//! through this module, and a pointer that is not mapped (or not writable) yields `EFAULT`
//! instead of a crash, exactly as the kernel's `copy_from_user`/`copy_to_user` and an
//! IOMMU-protected DMA would. Two ways to get there:
//!
//! * **direct** (x86_64 Linux, the default): one `rep movsb` whose faults are caught. A
//!   `SIGSEGV`/`SIGBUS` handler recognises the copy instruction in the interrupted context
//!   and resumes after it with the count of bytes not copied, the way a kernel's exception
//!   table lands a faulting `copy_from_user` on its fixup. Any other fault goes on to the
//!   handler that was installed before ours (Rust's stack-overflow report, a sanitizer, or
//!   the default action), so a genuine crash is still a crash.
//! * **syscall** (other targets, or `MLX5_EMU_DMA=syscall`): `process_vm_readv` /
//!   `process_vm_writev` on the own pid, which the kernel checks against our address space.
//!   About 1.4 us per call, which is why it is not the default where the direct copy exists.

use std::sync::Once;
use std::sync::atomic::{AtomicI32, Ordering, fence};

use crate::abi::Errno;

mod direct;

pub use direct::{DmaPath, path as dma_path, set_path as set_dma_path};

/// Install the process's SIGSEGV/SIGBUS handler (the DMA copy's fixup and the UAR wake,
/// `crate::uar`) if it is not in place; true if it is.
pub(crate) fn install_fault_handler() -> bool {
    direct::handler::install()
}

/// True if the fault handler is in place (a watched UAR page may fault).
pub(crate) fn fault_handler_installed() -> bool {
    direct::handler::installed()
}

/// The own pid, cached: `getpid` is a system call (glibc no longer caches it) and the data
/// path would otherwise make one per DMA access. 0 means "not known"; a fork child resets
/// it (pthread_atfork), so a child never reads its parent's memory.
static PID: AtomicI32 = AtomicI32::new(0);
static ATFORK: Once = Once::new();

extern "C" fn forget_pid() {
    PID.store(0, Ordering::Relaxed);
}

/// The pid to hand `process_vm_readv`/`process_vm_writev`: our own.
fn pid() -> libc::pid_t {
    let p = PID.load(Ordering::Relaxed);
    if p != 0 {
        return p;
    }
    ATFORK.call_once(|| {
        // SAFETY: registers a child handler that only does an atomic store
        // (async-signal-safe); no prepare/parent handlers.
        unsafe { libc::pthread_atfork(None, None, Some(forget_pid)) };
    });
    // SAFETY: getpid has no preconditions.
    let p = unsafe { libc::getpid() };
    PID.store(p, Ordering::Relaxed);
    p
}

/// The highest user address plus one on x86_64 and aarch64 with 4-level paging (47 bits);
/// anything at or above it is refused before touching it, as the kernel's `access_ok` does.
const USER_END: u64 = 1 << 47;

/// `Err(EFAULT)` unless `[addr, addr + len)` is a non-null range below [`USER_END`].
fn range_ok(addr: u64, len: usize) -> Result<(), Errno> {
    match addr.checked_add(len as u64) {
        Some(end) if addr != 0 && end <= USER_END => Ok(()),
        _ => Err(Errno(libc::EFAULT)),
    }
}

/// Copy `buf.len()` bytes from user address `addr` into `buf`.
pub(crate) fn read(addr: u64, buf: &mut [u8]) -> Result<(), Errno> {
    if buf.is_empty() {
        return Ok(());
    }
    range_ok(addr, buf.len())?;
    if direct::enabled() {
        // SAFETY: the direct path is enabled; `buf` is ours exclusively for the call; the
        // source is user memory, checked by the copy itself (a fault is EFAULT).
        unsafe { direct::copy(buf.as_mut_ptr(), addr as usize as *const u8, buf.len()) }?;
        fence(Ordering::Acquire);
        return Ok(());
    }
    sys_read(addr, buf)
}

/// Copy `data` to user address `addr`.
/// Read `buf.len()` bytes at `addr` from a signal handler: false if they are not all
/// readable. Only the fault-catching copy (once chosen) or `process_vm_readv`, both
/// async-signal-safe; nothing is allocated and no decision is made here.
pub(crate) fn read_in_handler(addr: u64, buf: &mut [u8]) -> bool {
    if direct::chosen_direct() {
        // SAFETY: the direct copy is enabled; `buf` is our own exclusive slice, the source
        // is user memory whose faults the copy catches.
        return unsafe { direct::copy(buf.as_mut_ptr(), addr as usize as *const u8, buf.len()) }
            .is_ok();
    }
    // The cached pid if there is one (`pid` may register its fork handler on first use,
    // which a signal handler must not), else getpid's.
    let pid = match PID.load(Ordering::Relaxed) {
        0 => std::process::id() as libc::pid_t,
        p => p,
    };
    vm_read(pid, addr, buf).is_ok()
}

pub(crate) fn write(addr: u64, data: &[u8]) -> Result<(), Errno> {
    if data.is_empty() {
        return Ok(());
    }
    range_ok(addr, data.len())?;
    if direct::enabled() {
        fence(Ordering::Release);
        // SAFETY: the direct path is enabled; `data` is ours for the call; the destination
        // is user memory, checked by the copy itself (unmapped or read-only is EFAULT).
        unsafe { direct::copy(addr as usize as *mut u8, data.as_ptr(), data.len()) }?;
        fence(Ordering::Release);
        return Ok(());
    }
    sys_write(addr, data)
}

/// Copy `data` to user address `addr` so that its last byte lands after all the others (a
/// CQE body, then its ownership byte).
pub(crate) fn write_last_byte_last(addr: u64, data: &[u8]) -> Result<(), Errno> {
    let Some((_, body)) = data.split_last() else {
        return Ok(());
    };
    range_ok(addr, data.len())?;
    if direct::enabled() {
        // Two string operations: x86 never lets the stores of a later string operation pass
        // those of an earlier one (Intel SDM vol. 3, "Memory-Ordering Model for String Operations"), so the owner byte is seen last.
        write(addr, body)?;
        return write(addr + body.len() as u64, &data[body.len()..]);
    }
    sys_write_last_byte_last(addr, data)
}

/// `process_vm_readv` of `buf.len()` bytes at `addr` of process `pid` (ours), then an
/// acquire fence; EFAULT unless all were read. Async-signal-safe.
fn vm_read(pid: libc::pid_t, addr: u64, buf: &mut [u8]) -> Result<(), Errno> {
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as usize as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: `local` describes `buf`, which we own mutably for the call; `remote` is only
    // interpreted by the kernel, which checks it against our address space and fails with
    // EFAULT instead of faulting.
    let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
    if n < 0 || n as usize != buf.len() {
        return Err(Errno(libc::EFAULT));
    }
    fence(Ordering::Acquire);
    Ok(())
}

/// [`read`] through `process_vm_readv`.
fn sys_read(addr: u64, buf: &mut [u8]) -> Result<(), Errno> {
    if buf.is_empty() {
        return Ok(());
    }
    if addr == 0 || addr.checked_add(buf.len() as u64).is_none() {
        return Err(Errno(libc::EFAULT));
    }
    vm_read(pid(), addr, buf)
}

/// [`write`] through `process_vm_writev`.
fn sys_write(addr: u64, data: &[u8]) -> Result<(), Errno> {
    if data.is_empty() {
        return Ok(());
    }
    if addr == 0 || addr.checked_add(data.len() as u64).is_none() {
        return Err(Errno(libc::EFAULT));
    }
    fence(Ordering::Release);
    let local = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as usize as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: `local` describes `data`, only read by the kernel; `remote` is validated by the
    // kernel against our address space (EFAULT on a bad or read-only range).
    let n = unsafe { libc::process_vm_writev(pid(), &local, 1, &remote, 1, 0) };
    if n < 0 || n as usize != data.len() {
        return Err(Errno(libc::EFAULT));
    }
    fence(Ordering::Release);
    Ok(())
}

/// [`write_last_byte_last`] through `process_vm_writev`. On x86_64 this is one `process_vm_writev` with two
/// remote ranges, which the kernel copies in order (and stops at the first fault), and
/// x86 stores become visible in program order; elsewhere two calls with a fence between.
fn sys_write_last_byte_last(addr: u64, data: &[u8]) -> Result<(), Errno> {
    let Some((_, body)) = data.split_last() else {
        return Ok(());
    };
    let tail = addr
        .checked_add(body.len() as u64)
        .ok_or(Errno(libc::EFAULT))?;
    if !cfg!(target_arch = "x86_64") || body.is_empty() {
        sys_write(addr, body)?;
        return sys_write(tail, &data[body.len()..]);
    }
    if addr == 0 || tail.checked_add(1).is_none() {
        return Err(Errno(libc::EFAULT));
    }
    fence(Ordering::Release);
    let local = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let remote = [
        libc::iovec {
            iov_base: addr as usize as *mut libc::c_void,
            iov_len: body.len(),
        },
        libc::iovec {
            iov_base: tail as usize as *mut libc::c_void,
            iov_len: 1,
        },
    ];
    // SAFETY: `local` describes `data`, only read by the kernel; both remote ranges are
    // validated by the kernel against our address space (EFAULT on a bad range).
    let n = unsafe { libc::process_vm_writev(pid(), &local, 1, remote.as_ptr(), 2, 0) };
    if n < 0 || n as usize != data.len() {
        return Err(Errno(libc::EFAULT));
    }
    fence(Ordering::Release);
    Ok(())
}

/// Read `len` bytes into a new vector.
pub(crate) fn read_vec(addr: u64, len: usize) -> Result<Vec<u8>, Errno> {
    let mut v = vec![0u8; len];
    read(addr, &mut v)?;
    Ok(v)
}

/// Read a big-endian u32 (a doorbell-record word).
pub(crate) fn read_be32(addr: u64) -> Result<u32, Errno> {
    let mut b = [0u8; 4];
    read(addr, &mut b)?;
    Ok(u32::from_be_bytes(b))
}

/// Check that every page of `[addr, addr + len)` is readable (the "pinning" of reg_mr).
pub(crate) fn probe(addr: u64, len: u64) -> Result<(), Errno> {
    if len == 0 {
        return Ok(());
    }
    let end = addr.checked_add(len).ok_or(Errno(libc::EFAULT))?;
    let mut p = addr;
    let mut b = [0u8; 1];
    while p < end {
        read(p, &mut b)?;
        p = (p & !4095) + 4096;
    }
    read(end - 1, &mut b)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: usize = 4096;
    const EFAULT: Result<(), Errno> = Err(Errno(libc::EFAULT));

    /// Four pages: read-write (filled with 0x5a), read-only (0xa5), no access, unmapped.
    struct Pages(*mut u8);

    impl Pages {
        fn new() -> Self {
            // SAFETY: a fresh private anonymous mapping at a kernel-chosen address.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    4 * PAGE,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED);
            let p = p.cast::<u8>();
            // SAFETY: the first page is ours and writable.
            unsafe { std::ptr::write_bytes(p, 0x5a, PAGE) };
            let ro = p.wrapping_add(PAGE);
            // SAFETY: the second page is ours and still writable.
            unsafe { std::ptr::write_bytes(ro, 0xa5, PAGE) };
            // SAFETY: changes the protection of our own pages only.
            let r = unsafe { libc::mprotect(ro.cast(), PAGE, libc::PROT_READ) };
            assert_eq!(r, 0);
            // SAFETY: as above.
            let r =
                unsafe { libc::mprotect(p.wrapping_add(2 * PAGE).cast(), PAGE, libc::PROT_NONE) };
            assert_eq!(r, 0);
            // SAFETY: unmaps our own fourth page, never referenced again.
            let r = unsafe { libc::munmap(p.wrapping_add(3 * PAGE).cast(), PAGE) };
            assert_eq!(r, 0);
            Pages(p)
        }

        fn addr(&self, page: usize, off: usize) -> u64 {
            self.0 as u64 + (page * PAGE + off) as u64
        }
    }

    impl Drop for Pages {
        fn drop(&mut self) {
            // SAFETY: the first three pages are still our mapping (the fourth is gone).
            unsafe { libc::munmap(self.0.cast(), 3 * PAGE) };
        }
    }

    type Read = fn(u64, &mut [u8]) -> Result<(), Errno>;
    type Write = fn(u64, &[u8]) -> Result<(), Errno>;

    /// Every case through one implementation.
    fn check(path: &str, read: Read, write: Write, last_last: Write) {
        let m = Pages::new();
        let mut b = [0u8; 64];
        assert_eq!(read(m.addr(0, 100), &mut b), Ok(()), "{path}");
        assert_eq!(b, [0x5a; 64], "{path}");
        assert_eq!(
            read(m.addr(1, 0), &mut b),
            Ok(()),
            "{path}: read-only is readable"
        );
        assert_eq!(b, [0xa5; 64], "{path}");
        for (what, a) in [
            ("no-access page", m.addr(2, 0)),
            ("across into no-access", m.addr(1, PAGE - 8)),
            ("unmapped page", m.addr(3, 64)),
            ("null page", 0x10),
            ("kernel half", 0xffff_8000_0000_0000),
            ("non-canonical", 0x0000_8000_0000_0000),
            ("wrapping", u64::MAX - 8),
        ] {
            assert_eq!(read(a, &mut b), EFAULT, "{path}: read {what}");
            assert_eq!(write(a, &b), EFAULT, "{path}: write {what}");
            assert_eq!(last_last(a, &b), EFAULT, "{path}: CQE write {what}");
        }
        let data: Vec<u8> = (0..64).collect();
        assert_eq!(write(m.addr(0, 8), &data), Ok(()), "{path}");
        assert_eq!(last_last(m.addr(0, 200), &data), Ok(()), "{path}");
        read(m.addr(0, 8), &mut b).unwrap();
        assert_eq!(&b[..], &data[..], "{path}");
        read(m.addr(0, 200), &mut b).unwrap();
        assert_eq!(&b[..], &data[..], "{path}");
        assert_eq!(write(m.addr(1, 0), &data), EFAULT, "{path}: read-only page");
        assert_eq!(
            write(m.addr(0, PAGE - 8), &data),
            EFAULT,
            "{path}: across into read-only"
        );
        read(m.addr(1, 0), &mut b).unwrap();
        assert_eq!(b, [0xa5; 64], "{path}: the read-only page is unchanged");
        assert_eq!(read(m.addr(0, 0), &mut []), Ok(()), "{path}: empty");
    }

    #[test]
    fn bad_addresses_are_efault_through_syscalls() {
        check("syscall", sys_read, sys_write, sys_write_last_byte_last);
    }

    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    mod direct_path {
        use super::*;

        fn on() {
            assert_eq!(set_dma_path(DmaPath::Direct), DmaPath::Direct);
        }

        #[test]
        fn bad_addresses_are_efault_through_the_direct_copy() {
            on();
            check("direct", read, write, write_last_byte_last);
        }

        #[test]
        fn sigbus_beyond_the_end_of_a_file_is_efault() {
            on();
            let name = c"mem-test";
            // A memfd of one page mapped for two: the second page is past the end of the
            // file, where an access raises SIGBUS.
            // SAFETY: `name` is NUL-terminated.
            let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
            assert!(fd >= 0);
            // SAFETY: sizes our own memfd.
            assert_eq!(unsafe { libc::ftruncate(fd, PAGE as libc::off_t) }, 0);
            // SAFETY: a fresh shared mapping of our memfd at a kernel-chosen address.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    2 * PAGE,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    fd,
                    0,
                )
            };
            // SAFETY: our descriptor; the mapping keeps the file alive.
            unsafe { libc::close(fd) };
            assert_ne!(p, libc::MAP_FAILED);
            let p = p as u64;
            let mut b = [0u8; 16];
            assert_eq!(read(p, &mut b), Ok(()));
            assert_eq!(read(p + PAGE as u64, &mut b), EFAULT);
            assert_eq!(write(p + PAGE as u64 - 8, &b), EFAULT);
            // SAFETY: our two-page mapping.
            unsafe { libc::munmap(p as *mut libc::c_void, 2 * PAGE) };
        }

        #[inline(never)]
        fn recurse(n: u64) -> u64 {
            let a = std::hint::black_box([n; 128]);
            if std::hint::black_box(n) == u64::MAX {
                return 0;
            }
            recurse(n + 1).wrapping_add(a[5])
        }

        /// Fork a child that first proves the handler catches a faulting copy (it writes
        /// 'E' to a pipe), then runs `crash`. Returns (the child's wait status, what it
        /// wrote to the pipe and to stderr).
        fn child(crash: fn()) -> (i32, Vec<u8>) {
            on();
            let mut fds = [0; 2];
            // SAFETY: a pipe into our own array.
            assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
            // SAFETY: the child only makes async-signal-safe calls (copy, write, dup2,
            // setrlimit, _exit) before it crashes; the parent only waits and reads.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0);
            if pid == 0 {
                child_side(fds[1], crash);
            }
            // SAFETY: our copy of the write end, not used by the parent.
            unsafe { libc::close(fds[1]) };
            let mut status = 0;
            // SAFETY: waits for our own child into our own integer.
            assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
            let mut out = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                // SAFETY: reading into our own buffer from our pipe.
                let n = unsafe { libc::read(fds[0], buf.as_mut_ptr().cast(), buf.len()) };
                if n <= 0 {
                    break;
                }
                out.extend_from_slice(&buf[..n as usize]);
            }
            // SAFETY: our read end.
            unsafe { libc::close(fds[0]) };
            (status, out)
        }

        /// The forked child: no core file, stderr into the pipe, a faulting copy that must
        /// return (then 'E' into the pipe), then `crash`. Only async-signal-safe calls.
        fn child_side(w: i32, crash: fn()) -> ! {
            let no_core = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: sets our own resource limit from a valid struct.
            unsafe { libc::setrlimit(libc::RLIMIT_CORE, &no_core) };
            // SAFETY: `w` is our pipe's write end; fd 2 becomes a copy of it.
            unsafe { libc::dup2(w, 2) };
            let mut b = [0u8; 8];
            // SAFETY: the direct path is on (set before the fork); `b` is ours.
            let r = unsafe { direct::copy(b.as_mut_ptr(), 0x10 as *const u8, 8) };
            let tag = if r.is_err() { b"E" } else { b"?" };
            // SAFETY: writes one byte of a static to our pipe.
            unsafe { libc::write(w, tag.as_ptr().cast(), 1) };
            crash();
            // SAFETY: ends the child without running the parent's destructors.
            unsafe { libc::_exit(0) }
        }

        #[test]
        fn a_fault_outside_the_copy_still_kills_the_process() {
            let (status, out) = child(|| {
                // SAFETY: deliberately not: the child must die of SIGSEGV here.
                let v = unsafe { std::ptr::read_volatile(std::hint::black_box(8 as *const u8)) };
                std::hint::black_box(v);
            });
            assert_eq!(
                out.first(),
                Some(&b'E'),
                "the copy's fault was caught first"
            );
            assert!(libc::WIFSIGNALED(status), "status {status:#x}");
            assert_eq!(libc::WTERMSIG(status), libc::SIGSEGV);
        }

        #[test]
        fn a_stack_overflow_is_still_reported_by_the_runtime() {
            let (status, out) = child(|| {
                std::hint::black_box(recurse(0));
            });
            let text = String::from_utf8_lossy(&out);
            assert_eq!(
                out.first(),
                Some(&b'E'),
                "the copy's fault was caught first"
            );
            assert!(text.contains("has overflowed its stack"), "stderr: {text}");
            assert!(libc::WIFSIGNALED(status), "status {status:#x}");
            assert_eq!(libc::WTERMSIG(status), libc::SIGABRT);
        }
    }
}
