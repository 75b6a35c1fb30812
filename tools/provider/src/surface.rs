//! The uverbs surface over the command fd libibverbs opened and owns (`ibv_context.cmd_fd`).
//!
//! The same four syscalls a real `/dev/infiniband/uverbsN` takes. Under the emulator's
//! `LD_PRELOAD` front door the descriptor is the preload's emulated one and libc's
//! `write`/`ioctl`/`mmap` on it reach the emulated kernel: nothing here knows the difference.

use core::ptr::NonNull;
use std::os::fd::RawFd;

use mlx5_ffi::ioctl::{IbUverbsIoctlHdr, RDMA_VERBS_IOCTL};
use mlx5_ffi::surface::{Errno, UverbsSurface};

/// A command fd borrowed from libibverbs: never closed here (`verbs_uninit_context` does).
#[derive(Debug)]
pub struct BorrowedCmdFd {
    fd: RawFd,
    name: String,
}

impl BorrowedCmdFd {
    /// Wrap `fd` (the `cmd_fd` of `alloc_context`), naming the device for diagnostics.
    pub fn new(fd: RawFd, name: String) -> Self {
        BorrowedCmdFd { fd, name }
    }
}

fn last() -> Errno {
    Errno::last()
}

// SAFETY: the calls are the kernel's (or the emulated kernel's, which implements the same
// contract): `mmap` returns a fresh MAP_SHARED mapping of `len` bytes that stays until
// munmap; `write`/`ioctl` touch only what the command names. The fd stays open for the life
// of the context (libibverbs closes it in `verbs_uninit_context`, after `free_context` has
// dropped every object built on this surface).
unsafe impl UverbsSurface for BorrowedCmdFd {
    unsafe fn write(&self, cmd: &[u8]) -> Result<usize, Errno> {
        // SAFETY: `cmd` is a live slice; its embedded pointers are valid by this fn's contract.
        let n = unsafe { libc::write(self.fd, cmd.as_ptr().cast(), cmd.len()) };
        if n < 0 {
            return Err(last());
        }
        Ok(n as usize)
    }

    unsafe fn ioctl(&self, buf: &mut [u8]) -> Result<(), Errno> {
        if buf.len() < size_of::<IbUverbsIoctlHdr>() {
            return Err(Errno::EINVAL);
        }
        let declared = usize::from(u16::from_ne_bytes([buf[0], buf[1]]));
        if declared > buf.len() {
            return Err(Errno::EINVAL);
        }
        // SAFETY: `buf` is live and writable for the `hdr.length` bytes the kernel reads.
        let rc = unsafe { libc::ioctl(self.fd, RDMA_VERBS_IOCTL as _, buf.as_mut_ptr()) };
        if rc < 0 {
            return Err(last());
        }
        Ok(())
    }

    fn mmap(&self, len: usize, prot: i32, offset: u64) -> Result<NonNull<u8>, Errno> {
        let off = libc::off_t::try_from(offset).map_err(|_| Errno::EINVAL)?;
        // SAFETY: a new shared mapping at an address the kernel chooses aliases nothing.
        let addr = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                self.fd,
                off,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(last());
        }
        NonNull::new(addr.cast::<u8>()).ok_or(Errno::EFAULT)
    }

    unsafe fn munmap(&self, addr: NonNull<u8>, len: usize) -> Result<(), Errno> {
        // SAFETY: the caller passes a mapping of ours that nothing uses any more.
        if unsafe { libc::munmap(addr.as_ptr().cast(), len) } < 0 {
            return Err(last());
        }
        Ok(())
    }

    fn describe(&self) -> String {
        format!("{} (libibverbs cmd_fd {})", self.name, self.fd)
    }
}
