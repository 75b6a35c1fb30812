//! Access to user memory of the own process without trusting the pointer.
//!
//! Everything the emulated kernel and device read from or write to "user" memory goes
//! through `process_vm_readv`/`process_vm_writev` on the own pid. A pointer that is not
//! mapped (or not writable) therefore yields `EFAULT` instead of a crash, exactly as the
//! kernel's `copy_from_user`/`copy_to_user` and an IOMMU-protected DMA would.

use std::sync::Once;
use std::sync::atomic::{AtomicI32, Ordering, fence};

use crate::abi::Errno;

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

/// Copy `buf.len()` bytes from user address `addr` into `buf`.
pub(crate) fn read(addr: u64, buf: &mut [u8]) -> Result<(), Errno> {
    if buf.is_empty() {
        return Ok(());
    }
    if addr == 0 || addr.checked_add(buf.len() as u64).is_none() {
        return Err(Errno(libc::EFAULT));
    }
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
    let n = unsafe { libc::process_vm_readv(pid(), &local, 1, &remote, 1, 0) };
    if n < 0 || n as usize != buf.len() {
        return Err(Errno(libc::EFAULT));
    }
    fence(Ordering::Acquire);
    Ok(())
}

/// Copy `data` to user address `addr`.
pub(crate) fn write(addr: u64, data: &[u8]) -> Result<(), Errno> {
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

/// Copy `data` to user address `addr` so that its last byte lands after all the others (a
/// CQE body, then its ownership byte). On x86_64 this is one `process_vm_writev` with two
/// remote ranges, which the kernel copies in order (and stops at the first fault), and
/// x86 stores become visible in program order; elsewhere two calls with a fence between.
pub(crate) fn write_last_byte_last(addr: u64, data: &[u8]) -> Result<(), Errno> {
    let Some((_, body)) = data.split_last() else {
        return Ok(());
    };
    let tail = addr
        .checked_add(body.len() as u64)
        .ok_or(Errno(libc::EFAULT))?;
    if !cfg!(target_arch = "x86_64") || body.is_empty() {
        write(addr, body)?;
        return write(tail, &data[body.len()..]);
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
