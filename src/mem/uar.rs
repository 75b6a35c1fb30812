//! UAR pages mapped from the uverbs file, and the doorbell / BlueFlame registers inside them.
//!
//! A UAR page is MMIO: it is only ever touched through [`MmioReg`] (volatile 8-byte stores),
//! never through a reference. The page is unmapped when the last register using it is gone.

use std::sync::Arc;

use core::ptr::NonNull;

use mlx5_ffi::surface::UverbsSurface;
use mlx5_hw::doorbell::{UAR_BF_REG0, UAR_CQ_DOORBELL, UAR_SIZE};

use crate::error::{Error, Result};
use crate::mmio::access::MmioReg;

/// One mapped UAR page (4 KiB of adapter registers).
///
/// # Invariants
/// `ptr .. ptr + len` is a live mapping returned by `surface.mmap`, unmapped only in `Drop`.
pub struct UarPage {
    surface: Arc<dyn UverbsSurface>,
    ptr: NonNull<u8>,
    len: usize,
    /// The hardware UAR page index (`page_id` / static UAR number) the kernel knows it by.
    pub page_id: u32,
    /// `true` if mapped write-combining (BlueFlame capable), `false` for non-cached.
    pub write_combining: bool,
}

impl core::fmt::Debug for UarPage {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("UarPage")
            .field("ptr", &self.ptr)
            .field("page_id", &self.page_id)
            .field("write_combining", &self.write_combining)
            .finish()
    }
}

// SAFETY: the page is MMIO reached only through `MmioReg` volatile stores; the mapping is owned
// by this value and unmapped once, in `Drop`. The surface is `Send + Sync` by its trait bound.
unsafe impl Send for UarPage {}
// SAFETY: as above; `&UarPage` exposes no access to the memory itself.
unsafe impl Sync for UarPage {}

impl UarPage {
    /// Map `len` bytes at mmap `offset` (bytes) of the uverbs file.
    ///
    /// # Errors
    /// [`Error::Os`] naming `mmap(UAR)` with the errno.
    pub fn map(
        surface: &Arc<dyn UverbsSurface>,
        offset: u64,
        len: usize,
        page_id: u32,
        write_combining: bool,
    ) -> Result<Arc<Self>> {
        let ptr = surface
            .mmap(len, libc::PROT_WRITE, offset)
            .map_err(|e| Error::Os {
                op: "mmap(UAR)",
                errno: crate::error::Errno::from_raw(e.0),
            })?;
        if len < UAR_SIZE || ptr.as_ptr() as usize % 8 != 0 {
            // SAFETY: `ptr`/`len` is the mapping just returned by this surface, not used since.
            let _ = unsafe { surface.munmap(ptr, len) };
            return Err(Error::BadResponse {
                cmd: "mmap(UAR)",
                what: "mapping too small or misaligned",
            });
        }
        Ok(Arc::new(Self {
            surface: surface.clone(),
            ptr,
            len,
            page_id,
            write_combining,
        }))
    }

    /// A register window of `len` bytes at `offset` in this page.
    ///
    /// # Panics
    /// If the window is outside the page or misaligned (an internal invariant of the callers).
    pub fn reg(self: &Arc<Self>, offset: usize, len: usize) -> UarReg {
        assert!(
            offset % 8 == 0 && offset + len <= self.len,
            "UAR register {offset:#x}+{len} outside the page"
        );
        // `offset + len <= self.len`, so the pointer stays inside the mapping.
        let p = self.ptr.as_ptr().wrapping_add(offset);
        let p = NonNull::new(p).unwrap_or(self.ptr);
        UarReg {
            // SAFETY: 8-byte aligned (asserted, page base is page aligned) and valid for `len`
            // bytes while `page` (held next to it in `UarReg`) keeps the mapping alive.
            reg: unsafe { MmioReg::from_raw(p, len) },
            page: self.clone(),
        }
    }

    /// The CQ arm doorbell register (UAR base + 0x20).
    pub fn cq_doorbell(self: &Arc<Self>) -> UarReg {
        self.reg(UAR_CQ_DOORBELL, 8)
    }

    /// Like [`bf_reg`](Self::bf_reg) for the `uar`-th 4 KiB UAR of a larger system page.
    ///
    /// # Errors
    /// [`Error::BadResponse`] if that UAR is not inside the mapping.
    pub fn bf_reg_in(self: &Arc<Self>, uar: usize, index: usize, size: usize) -> Result<UarReg> {
        let base = uar * UAR_SIZE;
        let off = UAR_BF_REG0 + index * size.max(0x100);
        let len = if size == 0 { 8 } else { size };
        if base + off + len > self.len {
            return Err(Error::BadResponse {
                cmd: "CREATE_QP",
                what: "UAR outside the mapped page",
            });
        }
        Ok(self.reg(base + off, len))
    }

    /// BlueFlame register `index` (0-based, at 0x800 + index * bf_reg_size) of `size` bytes, or an
    /// 8-byte doorbell-only register at 0x800 + index * 0x100 when `size` is 0 (NC pages).
    pub fn bf_reg(self: &Arc<Self>, index: usize, size: usize) -> UarReg {
        if size == 0 {
            self.reg(UAR_BF_REG0 + index * 0x100, 8)
        } else {
            self.reg(UAR_BF_REG0 + index * size, size)
        }
    }
}

impl Drop for UarPage {
    fn drop(&mut self) {
        // SAFETY: the mapping came from this surface's `mmap` and no `UarReg` is left (each
        // holds an `Arc` to this page).
        let _ = unsafe { self.surface.munmap(self.ptr, self.len) };
    }
}

/// A register window inside a mapped UAR page that keeps the page mapped.
#[derive(Debug)]
pub struct UarReg {
    reg: MmioReg,
    page: Arc<UarPage>,
}

impl UarReg {
    /// The register.
    #[inline(always)]
    pub fn mmio(&self) -> &MmioReg {
        &self.reg
    }

    /// The page it is in.
    pub fn page(&self) -> &Arc<UarPage> {
        &self.page
    }
}
