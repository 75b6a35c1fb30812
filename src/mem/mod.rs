//! Memory the device touches: page-aligned and hugepage DMA buffers, doorbell-record pages,
//! the send/receive work-queue rings and the mapped UAR pages.
//!
//! This is one of the three modules where `unsafe` is allowed. The rule (STYLE P5): memory the
//! device may be reading or writing is reachable only through raw-pointer handles; the types
//! here that hand out `&mut` windows (the WQE writer) do so only over slots the counters prove
//! are driver-owned.
#![allow(unsafe_code)]

pub mod dbrec;
pub mod dma_buf;
pub(crate) mod scatter;
pub mod table;
pub mod wq;

pub use dbrec::{DbRec, DbRecPool};
pub use dma_buf::{Backing, DmaBuf, HugePolicy};

pub mod uar;

use std::sync::Arc;

use crate::error::Result;
use crate::mmio::access::CqeRing;

/// A completion-queue buffer: `count` entries of `stride` bytes in a page-aligned [`DmaBuf`],
/// every descriptor initialised to "invalid, owner 0" (`op_own = 0xF0`).
///
/// # Invariants
/// `ring` points into `buf`, which this value keeps mapped.
#[derive(Debug)]
pub struct CqBuf {
    ring: CqeRing,
    buf: Arc<DmaBuf>,
}

impl CqBuf {
    /// Allocate and initialise `count` (a power of two) entries of `stride` (64 or 128) bytes.
    ///
    /// # Errors
    /// [`Error::Os`](crate::Error::Os) if the memory cannot be mapped.
    ///
    /// # Panics
    /// If `count` is not a power of two or `stride` is not 64 or 128 (internal invariants).
    pub fn new(count: u32, stride: usize) -> Result<Self> {
        assert!(count.is_power_of_two() && (stride == 64 || stride == 128));
        let buf = Arc::new(DmaBuf::new(count as usize * stride)?);
        // SAFETY: `buf` is page aligned (so 64-byte aligned) and holds `count * stride` bytes;
        // it lives as long as `self`, which owns both.
        let mut ring = unsafe { CqeRing::from_raw(buf.as_ptr(), count, stride) };
        ring.init_invalid();
        Ok(Self { ring, buf })
    }

    /// The descriptor ring.
    #[inline(always)]
    pub fn ring(&self) -> &CqeRing {
        &self.ring
    }

    /// Address of the buffer (for CREATE_CQ).
    pub fn addr(&self) -> u64 {
        self.buf.addr()
    }
}

/// A stand-in for the uverbs file in unit tests: `mmap` hands out pages of an anonymous buffer,
/// so UAR registers can be written and inspected without a device.
#[cfg(test)]
pub(crate) mod fake {
    use std::ptr::NonNull;
    use std::sync::Arc;

    use mlx5_ffi::surface::{Errno, UverbsSurface};

    use super::DmaBuf;

    #[derive(Debug)]
    pub(crate) struct FakeSurface {
        pub uar: DmaBuf,
    }

    // SAFETY: `mmap` hands out the owned `uar` DmaBuf (at least `len` bytes, checked), which
    // lives as long as the surface; `write`/`ioctl` touch no memory at all.
    unsafe impl UverbsSurface for FakeSurface {
        unsafe fn write(&self, _cmd: &[u8]) -> Result<usize, Errno> {
            Err(Errno::ENOSYS)
        }
        unsafe fn ioctl(&self, _buf: &mut [u8]) -> Result<(), Errno> {
            Err(Errno::ENOTTY)
        }
        fn mmap(&self, len: usize, _prot: i32, _offset: u64) -> Result<NonNull<u8>, Errno> {
            if len > self.uar.len() {
                Err(Errno::EINVAL)
            } else {
                Ok(self.uar.as_ptr())
            }
        }
        // SAFETY: the trait's contract (a mapping from this surface, no longer used) is what a
        // caller promises; this test surface unmaps nothing, so it relies on nothing.
        unsafe fn munmap(&self, _addr: NonNull<u8>, _len: usize) -> Result<(), Errno> {
            Ok(())
        }
        fn describe(&self) -> String {
            "fake".into()
        }
    }

    /// A fake surface with one 4 KiB "UAR" page.
    pub(crate) fn surface() -> (Arc<FakeSurface>, Arc<dyn UverbsSurface>) {
        let f = Arc::new(FakeSurface {
            uar: DmaBuf::new(4096).expect("map"),
        });
        let s: Arc<dyn UverbsSurface> = f.clone();
        (f, s)
    }
}
