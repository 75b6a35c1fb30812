//! Width-exact accessors for device-shared words: doorbell records (host memory the device
//! reads) and UAR registers (MMIO). (CQE rings are read by `mem::CqeReader`.)
//!
//! None of these types ever hands out a Rust reference to the memory it names. Their
//! constructors are `unsafe`: the caller promises the pointer stays valid for as long as the
//! accessor exists, which the owning types in `mem/` guarantee by holding the mapping next to
//! the accessor (their `# Invariants` say so).

use core::ptr::NonNull;
use core::sync::atomic::{AtomicU32, Ordering};

/// A 32-bit big-endian word in a doorbell record (host memory that the device reads by DMA).
///
/// # Invariants
/// `ptr` is 4-byte aligned and points into a mapping that outlives `self`; Rust code touches the
/// word only through this type (atomic stores and loads), the device only reads it.
#[derive(Debug)]
pub struct DbWord {
    ptr: NonNull<u32>,
}

// SAFETY: the word is only accessed atomically through `&self` methods; the mapping outlives
// `self` (type invariant), so using it from another thread is sound.
unsafe impl Send for DbWord {}
// SAFETY: as above: all access is single atomic operations.
unsafe impl Sync for DbWord {}

impl DbWord {
    /// # Safety
    /// `ptr` must be 4-byte aligned, valid for reads and writes, and stay valid for the whole
    /// life of the returned value; nothing else may access it non-atomically.
    pub unsafe fn from_raw(ptr: NonNull<u32>) -> Self {
        Self { ptr }
    }

    /// A second accessor for the same word.
    ///
    /// # Safety
    /// The word must stay valid for the whole life of the returned value (as for
    /// [`from_raw`](Self::from_raw)); the caller keeps its mapping alive.
    pub(crate) unsafe fn duplicate(&self) -> Self {
        Self { ptr: self.ptr }
    }

    /// Store `v` as one big-endian 32-bit store (untorn).
    #[inline(always)]
    pub fn store_be32(&self, v: u32) {
        // SAFETY: aligned, live and only accessed atomically (type invariant).
        let a = unsafe { AtomicU32::from_ptr(self.ptr.as_ptr()) };
        a.store(v.to_be(), Ordering::Relaxed);
    }

    /// Load the word and convert from big-endian.
    #[inline(always)]
    pub fn load_be32(&self) -> u32 {
        // SAFETY: aligned, live and only accessed atomically (type invariant).
        let a = unsafe { AtomicU32::from_ptr(self.ptr.as_ptr()) };
        u32::from_be(a.load(Ordering::Relaxed))
    }
}

/// One 64-bit doorbell register in a mapped UAR page (MMIO). Used for the 8-byte send doorbell,
/// the CQ arm doorbell and, for BlueFlame, as the destination of the WQE copy
/// ([`crate::mem::uar`]). Crate-private: made only by [`UarPage`](crate::mem::uar::UarPage).
///
/// # Invariants
/// `ptr` is 8-byte aligned, inside a UAR mapping that outlives `self`, and `ptr .. ptr + len`
/// bytes are writable MMIO space.
#[derive(Debug)]
pub(crate) struct MmioReg {
    ptr: NonNull<u64>,
    len: usize,
}

// SAFETY: an MMIO register has no Rust-visible contents; stores are single volatile stores and
// the mapping outlives `self`. Whether two holders may store concurrently is decided by the
// owner (a dedicated BlueFlame register is used by one QP only).
unsafe impl Send for MmioReg {}
// SAFETY: concurrent 8-byte doorbell stores are each one untorn 64-bit store; shared BlueFlame
// registers are never used for multi-word copies (see `mem::uar`).
unsafe impl Sync for MmioReg {}

impl MmioReg {
    /// # Safety
    /// `ptr` must be 8-byte aligned and valid for `len` bytes of writes for the life of the
    /// returned value.
    pub(crate) unsafe fn from_raw(ptr: NonNull<u8>, len: usize) -> Self {
        Self {
            ptr: ptr.cast(),
            len,
        }
    }

    /// Size of the register window in bytes.
    #[inline(always)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The start of the window (for the BlueFlame copy, whose bounds its owner proves).
    #[inline(always)]
    pub(crate) fn base(&self) -> NonNull<u8> {
        self.ptr.cast()
    }

    /// One 64-bit store of `bytes` exactly as they sit in memory (no byte swap), at byte
    /// `offset` of the window.
    ///
    /// # Panics
    /// If `offset` is not a multiple of 8 or `offset + 8` is past the window (a real check:
    /// the fast paths use [`crate::mem::uar`]'s doorbell type, whose invariant bounds it).
    #[inline(always)]
    pub(crate) fn store_raw64(&self, offset: usize, bytes: [u8; 8]) {
        assert!(
            offset % 8 == 0 && offset < self.len && self.len - offset >= 8,
            "MMIO store at {offset:#x} outside a {}-byte register",
            self.len
        );
        // SAFETY: offset is inside the window and 8-byte aligned (asserted), the window is live
        // (type invariant); one volatile u64 store to MMIO.
        unsafe {
            self.ptr
                .as_ptr()
                .wrapping_add(offset / 8)
                .write_volatile(u64::from_ne_bytes(bytes))
        };
    }
}

/// Copy `blocks` 64-byte blocks to write-combining MMIO space with the widest plain stores the
/// ISA offers, in ascending address order, never through `memcpy` (its string instructions may
/// reorder or split the stores): on x86-64 four 16-byte SSE2 stores per block (two 32-byte AVX
/// stores when the crate is built with AVX enabled), on aarch64 one NEON `ld4`/`st4` pair per
/// block as rdma-core's `mmio_memcpy_x64` (its `util/mmio.h`). The whole copy is one `asm!`
/// loop, so the compiler can neither merge, split nor reorder the stores, nor turn them into a
/// call.
///
/// # Safety
/// `src` must be valid for `64 * blocks` bytes of reads and `dst` for `64 * blocks` bytes of
/// writes, both 64-byte aligned, and `blocks >= 1`; the caller orders the copy with
/// [`wc_start`](super::barrier::wc_start) and [`wc_flush`](super::barrier::wc_flush).
#[inline(always)]
pub(crate) unsafe fn wc_copy64(dst: NonNull<u8>, src: NonNull<u8>, blocks: usize) {
    #[cfg(all(target_arch = "x86_64", not(target_feature = "avx")))]
    if blocks <= 2 {
        // One or two blocks (every WQE a single-WQE doorbell copies on the fused send paths):
        // the same stores, ascending, without the loop's counter.
        // SAFETY: `64 * blocks` bytes of aligned reads from `src` and writes to `dst`,
        // `blocks` is 1 or 2 (caller's contract, `blocks >= 1`); only the named registers
        // are clobbered.
        unsafe {
            core::arch::asm!(
                "movdqa xmm0, [{s}]",
                "movdqa xmm1, [{s} + 16]",
                "movdqa xmm2, [{s} + 32]",
                "movdqa xmm3, [{s} + 48]",
                "movdqa [{d}], xmm0",
                "movdqa [{d} + 16], xmm1",
                "movdqa [{d} + 32], xmm2",
                "movdqa [{d} + 48], xmm3",
                "cmp {n}, 1",
                "je 2f",
                "movdqa xmm0, [{s} + 64]",
                "movdqa xmm1, [{s} + 80]",
                "movdqa xmm2, [{s} + 96]",
                "movdqa xmm3, [{s} + 112]",
                "movdqa [{d} + 64], xmm0",
                "movdqa [{d} + 80], xmm1",
                "movdqa [{d} + 96], xmm2",
                "movdqa [{d} + 112], xmm3",
                "2:",
                s = in(reg) src.as_ptr(),
                d = in(reg) dst.as_ptr(),
                n = in(reg) blocks,
                out("xmm0") _, out("xmm1") _, out("xmm2") _, out("xmm3") _,
                options(nostack),
            );
        }
        return;
    }
    #[cfg(all(target_arch = "x86_64", not(target_feature = "avx")))]
    // SAFETY: `64 * blocks` bytes of aligned reads from `src` and writes to `dst`, `blocks >= 1`
    // (caller's contract); only the named registers are clobbered.
    unsafe {
        core::arch::asm!(
            "2:",
            "movdqa xmm0, [{s}]",
            "movdqa xmm1, [{s} + 16]",
            "movdqa xmm2, [{s} + 32]",
            "movdqa xmm3, [{s} + 48]",
            "movdqa [{d}], xmm0",
            "movdqa [{d} + 16], xmm1",
            "movdqa [{d} + 32], xmm2",
            "movdqa [{d} + 48], xmm3",
            "add {s}, 64",
            "add {d}, 64",
            "dec {n}",
            "jnz 2b",
            s = inout(reg) src.as_ptr() => _,
            d = inout(reg) dst.as_ptr() => _,
            n = inout(reg) blocks => _,
            out("xmm0") _, out("xmm1") _, out("xmm2") _, out("xmm3") _,
            options(nostack),
        );
    }
    #[cfg(all(target_arch = "x86_64", target_feature = "avx"))]
    // SAFETY: as above, with two ymm registers (AVX is enabled at compile time, so the CPU the
    // binary is built for has it).
    unsafe {
        core::arch::asm!(
            "2:",
            "vmovdqa ymm0, [{s}]",
            "vmovdqa ymm1, [{s} + 32]",
            "vmovdqa [{d}], ymm0",
            "vmovdqa [{d} + 32], ymm1",
            "add {s}, 64",
            "add {d}, 64",
            "dec {n}",
            "jnz 2b",
            s = inout(reg) src.as_ptr() => _,
            d = inout(reg) dst.as_ptr() => _,
            n = inout(reg) blocks => _,
            out("ymm0") _, out("ymm1") _,
            options(nostack),
        );
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: `64 * blocks` bytes of reads from `src` and writes to `dst`, `blocks >= 1`
    // (caller's contract); `ld4` de-interleaves into v0..v3 and `st4` interleaves back, so the
    // bytes land in order; both post-increment by 64; only v0..v3 and the flags are clobbered.
    unsafe {
        core::arch::asm!(
            "2:",
            "ld4 {{v0.2d, v1.2d, v2.2d, v3.2d}}, [{s}], #64",
            "st4 {{v0.2d, v1.2d, v2.2d, v3.2d}}, [{d}], #64",
            "subs {n}, {n}, #1",
            "b.ne 2b",
            s = inout(reg) src.as_ptr() => _,
            d = inout(reg) dst.as_ptr() => _,
            n = inout(reg) blocks => _,
            out("v0") _, out("v1") _, out("v2") _, out("v3") _,
            options(nostack),
        );
    }
}
