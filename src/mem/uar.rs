//! UAR pages mapped from the uverbs file, and the doorbell / BlueFlame registers inside them.
//!
//! A UAR page is MMIO: it is only ever touched through [`MmioReg`] (volatile 8-byte stores),
//! never through a reference. The page is unmapped when the last register using it is gone.

use std::sync::Arc;

use core::ptr::NonNull;

use mlx5_ffi::surface::UverbsSurface;
use mlx5_hw::doorbell::{UAR_BF_REG0, UAR_CQ_DOORBELL, UAR_SIZE};

use crate::error::{Error, Result};
use crate::mem::wq::SqRing;
use crate::mmio::access::{MmioReg, wc_copy64};

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

    /// A register window of `len` bytes at `offset` in this page (crate-private: the queues
    /// take their registers through [`cq_doorbell`](Self::cq_doorbell) and
    /// [`bf_reg`](Self::bf_reg)).
    ///
    /// # Panics
    /// If the window is outside the page or misaligned (an internal invariant of the callers).
    pub(crate) fn reg(self: &Arc<Self>, offset: usize, len: usize) -> UarReg {
        assert!(
            offset % 8 == 0 && offset.checked_add(len).is_some_and(|e| e <= self.len),
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
        let len = if size == 0 { 8 } else { size };
        let end = uar
            .checked_mul(UAR_SIZE)
            .zip(index.checked_mul(size.max(0x100)))
            .and_then(|(b, o)| b.checked_add(UAR_BF_REG0)?.checked_add(o));
        let Some(at) = end.filter(|a| a.checked_add(len).is_some_and(|e| e <= self.len)) else {
            return Err(Error::BadResponse {
                cmd: "CREATE_QP",
                what: "UAR outside the mapped page",
            });
        };
        Ok(self.reg(at, len))
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
    /// The register (crate-private: its stores are checked, but only the queues may ring).
    #[inline(always)]
    pub(crate) fn mmio(&self) -> &MmioReg {
        &self.reg
    }

    /// The page it is in.
    pub fn page(&self) -> &Arc<UarPage> {
        &self.page
    }
}

/// A send queue's doorbell register: BlueFlame halves it alternates between, or the 8-byte
/// doorbell only.
///
/// # Invariants
/// `half` is 0, or a multiple of 64 with `2 * half <= reg.len()` and the register 64-byte
/// aligned; `offset` is 0 or `half`; `bf_max <= half`; `reg.len() >= 8`. So an 8-byte store at
/// `offset` and `half / 64` blocks of 64 bytes from `offset` are inside the register, and a WQE
/// of at most `bf_max` bytes, rounded up to whole blocks, is at most `half / 64` blocks.
#[derive(Debug)]
pub(crate) struct SqDoorbell {
    reg: UarReg,
    offset: usize,
    half: usize,
    /// The largest WQE in bytes the BlueFlame policy copies (at most `half`).
    bf_max: usize,
}

impl SqDoorbell {
    /// The register `reg` with BlueFlame halves of `half` bytes; `half` becomes 0 (doorbell
    /// only) unless two halves fit the register and it is 64-byte aligned.
    ///
    /// # Panics
    /// If `reg` is shorter than 8 bytes (registers come from [`UarPage::bf_reg`], never).
    pub(crate) fn new(reg: UarReg, half: usize) -> Self {
        assert!(reg.reg.len() >= 8, "doorbell register shorter than 8 bytes");
        let fits = half % 64 == 0
            && half.checked_mul(2).is_some_and(|h| h <= reg.reg.len())
            && reg.reg.base().as_ptr() as usize % 64 == 0;
        let half = if fits { half } else { 0 };
        Self {
            reg,
            offset: 0,
            half,
            bf_max: half,
        }
    }

    /// BlueFlame half size in bytes (0: 8-byte doorbell only).
    #[inline(always)]
    pub(crate) fn half(&self) -> usize {
        self.half
    }

    /// Set the largest WQE in bytes that [`blueflame`](Self::blueflame) copies (the policy's
    /// limit; clamped to the half, 0 for never).
    pub(crate) fn set_bf_max(&mut self, max: usize) {
        // INVARIANT: `bf_max <= half`.
        self.bf_max = max.min(self.half);
    }

    /// The register's page.
    pub(crate) fn page(&self) -> &Arc<UarPage> {
        &self.reg.page
    }

    /// Which half is next (byte offset 0 or `half`), for tests.
    #[cfg(test)]
    pub(crate) fn offset(&self) -> usize {
        self.offset
    }

    /// The 8-byte doorbell: one volatile store of `word` (the first 8 bytes of the control
    /// segment, as they sit in memory) at the current half.
    #[inline(always)]
    pub(crate) fn ring8(&self, word: u64) {
        #[expect(
            clippy::cast_ptr_alignment,
            reason = "the register is 8-byte aligned and offset is 0 or a multiple of 64"
        )]
        let p = self
            .reg
            .reg
            .base()
            .as_ptr()
            .wrapping_add(self.offset)
            .cast::<u64>();
        // SAFETY: `offset + 8 <= len` and 8-byte aligned (type invariant); the page is mapped
        // while `reg` holds it; one volatile u64 store to MMIO.
        unsafe { p.write_volatile(word) };
    }

    /// The BlueFlame copy of the WQE of `ds` 16-byte units at byte position `pos` of `ring`, if
    /// it fits the policy's limit (`bf_max`, at most the half): its 64-byte blocks from `pos`
    /// (each taken modulo the ring, so the source wraps at the ring end) to the current half,
    /// ascending. Returns whether it copied (else the caller rings the 8-byte doorbell).
    #[inline(always)]
    pub(crate) fn blueflame(&self, ring: &SqRing, pos: usize, ds: u32) -> bool {
        let bytes = ds as usize * 16;
        if bytes > self.bf_max || bytes == 0 {
            return false;
        }
        // `bytes <= bf_max <= half` and `half` is a multiple of 64: `blocks <= half / 64`.
        let blocks = (bytes + 63) >> 6;
        let (src, before_end) = ring.blocks(pos);
        // SAFETY: `offset + half <= 2 * half <= len` (type invariant), so the pointer stays
        // inside the register and is not null.
        let dst = unsafe { self.reg.reg.base().add(self.offset) };
        if blocks <= before_end {
            // SAFETY: `dst` is 64-byte aligned with `64 * blocks <= half` writable bytes of the
            // mapped register behind it (type invariant); `src` is 64-byte aligned with
            // `64 * blocks <= 64 * before_end` readable ring bytes (`SqRing::blocks`);
            // `blocks >= 1` as `bytes >= 1`.
            unsafe { wc_copy64(dst, src, blocks) };
        } else {
            self.blueflame_wrapped(ring, pos, dst, blocks, before_end);
        }
        true
    }

    /// [`blueflame`](Self::blueflame) of a WQE that does not wrap at the ring end, with no call
    /// in any branch (the fused send paths, which check beforehand that the WQE does not
    /// wrap); `false`, and nothing copied, when it is over the policy's limit or would wrap.
    #[inline(always)]
    pub(crate) fn blueflame_contig(&self, ring: &SqRing, pos: usize, ds: u32) -> bool {
        let bytes = ds as usize * 16;
        let blocks = (bytes + 63) >> 6;
        let (src, before_end) = ring.blocks(pos);
        if bytes > self.bf_max || bytes == 0 || blocks > before_end {
            return false;
        }
        // SAFETY: `offset + half <= 2 * half <= len` (type invariant), so the pointer stays
        // inside the register and is not null.
        let dst = unsafe { self.reg.reg.base().add(self.offset) };
        // SAFETY: as in `blueflame`: `dst` is 64-byte aligned with `64 * blocks <= half`
        // writable register bytes behind it (`bytes <= bf_max <= half`, type invariant); `src`
        // is 64-byte aligned with `64 * blocks <= 64 * before_end` readable ring bytes
        // (checked above, `SqRing::blocks`); `blocks >= 1` as `bytes >= 1`.
        unsafe { wc_copy64(dst, src, blocks) };
        true
    }

    /// [`blueflame`](Self::blueflame) of a WQE that wraps at the ring end: the blocks before the
    /// end, then the rest from the ring start.
    #[cold]
    #[inline(never)]
    fn blueflame_wrapped(
        &self,
        ring: &SqRing,
        pos: usize,
        dst: NonNull<u8>,
        blocks: usize,
        first: usize,
    ) {
        let (src, _) = ring.blocks(pos);
        // SAFETY: `first < blocks <= half / 64` blocks of register at `dst` (type invariant, see
        // `blueflame`) and `first` ring blocks at `src` (`SqRing::blocks`); `first >= 1`.
        unsafe { wc_copy64(dst, src, first) };
        let (src, avail) = ring.blocks(0);
        let rest = (blocks - first).min(avail);
        // SAFETY: `64 * first < 64 * blocks <= half`, inside the register (see `blueflame`).
        let dst = unsafe { dst.add(64 * first) };
        // SAFETY: `dst` is inside the register with `64 * rest` bytes behind it
        // (`first + rest <= blocks <= half / 64`); `src` is the ring start with `avail >= rest`
        // blocks (`SqRing::blocks`); `rest >= 1` as `blocks > first` and `avail >= 1`.
        unsafe { wc_copy64(dst, src, rest) };
    }

    /// Move to the other half (no-op without halves).
    #[inline(always)]
    pub(crate) fn flip(&mut self) {
        // INVARIANT: `offset` stays 0 or `half`.
        self.offset ^= self.half;
    }
}
