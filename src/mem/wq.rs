//! Work-queue rings: a power-of-two byte window inside a queue buffer ([`DmaBuf`]) that WQEs are
//! written into, wrapping byte-granular at the end (a WQE may straddle the end of the SQ).
//!
//! # Ownership rule
//! The ring itself only guarantees that every access is in bounds and made through raw
//! pointers (no reference into memory the device reads). Which slots are driver-owned is the
//! send/receive queue's accounting (`qp::sq`, `qp::rq`): they write only slots in
//! `[producer, retired + capacity)`, which the device no longer (or not yet) reads.
//!
//! # Ordering rule
//! Nothing here orders anything: the queue that owns the ring issues
//! [`to_device`](crate::mmio::barrier::to_device) before it publishes the producer counter.

use std::sync::Arc;

use core::marker::PhantomData;
use core::ptr::NonNull;

use super::dma_buf::DmaBuf;

/// A power-of-two byte ring inside a [`DmaBuf`].
///
/// # Invariants
/// `base .. base + mask + 1` lies inside `buf`, which `self` keeps mapped; `mask + 1` is a power
/// of two of at least 16; `base` is 16-byte aligned.
#[derive(Debug)]
pub(crate) struct WqRing {
    buf: Arc<DmaBuf>,
    base: NonNull<u8>,
    mask: usize,
}

// SAFETY: the ring is written through `&mut self` and read through `&self` with raw-pointer
// copies only; moving it to another thread moves those paths with it. The device is ordered by
// the owner's barriers.
unsafe impl Send for WqRing {}

impl WqRing {
    /// The ring of `len` bytes at `offset` in `buf`.
    ///
    /// # Panics
    /// If the window is out of bounds, `len` is not a power of two of at least 16 bytes, or
    /// `offset` is not 16-byte aligned (internal invariants of queue creation).
    pub(crate) fn new(buf: Arc<DmaBuf>, offset: usize, len: usize) -> Self {
        assert!(len.is_power_of_two() && len >= 16 && offset % 16 == 0);
        assert!(offset.checked_add(len).is_some_and(|e| e <= buf.len()));
        // `offset + len <= buf.len()` (asserted), so the pointer is inside the mapping.
        let p = buf.as_ptr().as_ptr().wrapping_add(offset);
        let base = NonNull::new(p).unwrap_or(buf.as_ptr());
        Self {
            buf,
            base,
            mask: len - 1,
        }
    }

    /// Ring length in bytes.
    #[inline(always)]
    pub(crate) fn len(&self) -> usize {
        self.mask + 1
    }

    /// Address of the ring start, as the device sees it.
    #[cfg(test)]
    pub(crate) fn addr(&self) -> u64 {
        self.base.as_ptr() as u64
    }

    /// A writer for this ring: the base and mask by value, so a loop that builds many WQEs keeps
    /// them in registers instead of reloading them through `&mut self` after every store.
    #[inline(always)]
    pub(crate) fn writer(&mut self) -> WqWriter<'_> {
        WqWriter {
            base: self.base,
            mask: self.mask,
            _ring: PhantomData,
        }
    }

    /// Copy `src` into the ring at byte position `pos` (taken modulo the ring length); a copy
    /// that reaches the end continues at the start.
    #[inline(always)]
    pub(crate) fn write(&mut self, pos: usize, src: &[u8]) {
        self.writer().write(pos, src);
    }

    /// Copy `dst.len()` bytes out of the ring from byte position `pos` (modulo, wrapping).
    pub(crate) fn read(&self, pos: usize, dst: &mut [u8]) {
        read_ring(self.base, self.mask, pos, dst);
    }

    /// A read-only view of the ring for the completion poller, which reads the scatter list of
    /// a completed WQE (see [`WqReader`]); it keeps the buffer mapped.
    pub(crate) fn reader(&self) -> WqReader {
        WqReader {
            _buf: self.buf.clone(),
            base: self.base,
            mask: self.mask,
        }
    }

    /// Zero the whole ring.
    pub(crate) fn zero(&mut self) {
        // SAFETY: the whole ring is in bounds (type invariant).
        unsafe { core::ptr::write_bytes(self.base.as_ptr(), 0, self.len()) };
    }
}

/// A send ring: a [`WqRing`] of whole 64-byte WQE basic blocks, which the BlueFlame copy reads
/// back 64 bytes at a time.
///
/// # Invariants
/// As [`WqRing`]'s, and the length is at least 64 (so a multiple of 64, being a power of two)
/// and `base` is 64-byte aligned: every 64-aligned position modulo the length starts 64 bytes
/// inside the ring.
#[derive(Debug)]
pub(crate) struct SqRing {
    ring: WqRing,
}

impl SqRing {
    /// `ring` as a send ring, or `None` if it is shorter than 64 bytes or not 64-byte aligned.
    pub(crate) fn new(ring: WqRing) -> Option<Self> {
        (ring.len() >= 64 && ring.base.as_ptr() as usize % 64 == 0).then_some(Self { ring })
    }

    /// The ring as a plain [`WqRing`].
    #[inline(always)]
    pub(crate) fn ring(&self) -> &WqRing {
        &self.ring
    }

    /// Mutable access to the plain ring (writes, zeroing).
    #[inline(always)]
    pub(crate) fn ring_mut(&mut self) -> &mut WqRing {
        &mut self.ring
    }

    /// The first 8 bytes of the 64-byte block holding byte position `pos` (modulo the ring), as
    /// one native word (a control segment's first half, for the 8-byte doorbell).
    #[inline(always)]
    pub(crate) fn word0(&self, pos: usize) -> u64 {
        #[expect(
            clippy::cast_ptr_alignment,
            reason = "blocks are 64-byte aligned (`block`)"
        )]
        let p = self.block(pos).as_ptr().cast::<u64>();
        // SAFETY: the first word of a 64-byte aligned block inside the ring (`block`); a plain
        // raw load of memory only this queue writes (the device only reads the ring).
        unsafe { p.read() }
    }

    /// The blocks from the one holding byte position `pos` (modulo the ring) on: a 64-byte
    /// aligned pointer valid for reads of 64 bytes times the number of blocks before the ring
    /// end (that number is the second value, at least 1), for the BlueFlame copy
    /// ([`crate::mem::uar`]).
    #[inline(always)]
    pub(crate) fn blocks(&self, pos: usize) -> (NonNull<u8>, usize) {
        let start = pos & self.ring.mask & !63;
        (self.block(pos), (self.ring.len() - start) / 64)
    }

    /// The 64-byte block that holds byte position `pos` (modulo the ring): a pointer valid for
    /// 64 bytes of reads, 64-byte aligned, for the BlueFlame copy ([`crate::mem::uar`]).
    #[inline(always)]
    pub(crate) fn block(&self, pos: usize) -> NonNull<u8> {
        let start = pos & self.ring.mask & !63;
        // SAFETY: `start + 64 <= len` (len is a multiple of 64 of at least 64, type invariant),
        // so the pointer stays inside the ring (and is not null).
        unsafe { self.ring.base.add(start) }
    }
}

/// Copy `dst.len()` bytes out of the ring at `base` (`mask + 1` bytes) from byte position `pos`
/// (modulo, wrapping); `base .. base + mask + 1` must be a live ring (the callers' invariant).
fn read_ring(base: NonNull<u8>, mask: usize, pos: usize, dst: &mut [u8]) {
    let len = mask + 1;
    let start = pos & mask;
    let first = dst.len().min(len - start);
    // SAFETY: `start + first <= len`, inside the ring (callers' invariant), as in
    // `WqWriter::write`; raw copy into a Rust slice that cannot overlap the mapping.
    unsafe {
        core::ptr::copy_nonoverlapping(base.as_ptr().wrapping_add(start), dst.as_mut_ptr(), first)
    };
    if first < dst.len() {
        let rest = (dst.len() - first).min(len);
        // SAFETY: `rest <= len`, read from the ring start.
        unsafe {
            core::ptr::copy_nonoverlapping(
                base.as_ptr(),
                dst.as_mut_ptr().wrapping_add(first),
                rest,
            )
        };
    }
}

/// A read-only view of a [`WqRing`] ([`WqRing::reader`]), held by the completion poller.
///
/// Crate-private: its only user is the poller's scatter-to-CQE copy, which reads the WQE a CQE
/// names before it retires that WQE (`Cq::poll`); the poster writes a slot only after it was
/// retired (the queues' ownership rule), so the reads and the poster's writes never overlap in
/// time. Safe code outside the crate cannot make one.
///
/// # Invariants
/// As [`WqRing`]'s: `base .. base + mask + 1` lies inside `_buf`, which this value keeps
/// mapped. It only ever copies bytes out with raw pointers (no reference into the ring).
#[derive(Clone, Debug)]
pub(crate) struct WqReader {
    /// Keeps the mapping alive (never read).
    _buf: Arc<DmaBuf>,
    base: NonNull<u8>,
    mask: usize,
}

// SAFETY: reads are raw copies of a mapping that `buf` keeps alive; no reference into it exists.
unsafe impl Send for WqReader {}
// SAFETY: as above: `&self` only performs raw copies out of the mapping, and the crate reads
// only WQEs the poster does not write until they are retired (see the type's documentation).
unsafe impl Sync for WqReader {}

impl WqReader {
    /// Copy `dst.len()` bytes from byte position `pos` (modulo the ring, wrapping).
    pub(crate) fn read(&self, pos: usize, dst: &mut [u8]) {
        read_ring(self.base, self.mask, pos, dst);
    }

    /// The 16-byte segment at byte position `pos` (16-aligned, modulo the ring).
    pub(crate) fn seg16(&self, pos: usize) -> [u8; 16] {
        let mut b = [0u8; 16];
        self.read(pos, &mut b);
        b
    }
}

/// The store side of a [`WqRing`], borrowed from it ([`WqRing::writer`]).
///
/// # Invariants
/// As [`WqRing`]'s: `base .. base + mask + 1` is inside the ring's buffer, which the borrowed
/// ring keeps mapped for `'a`; `mask + 1` is a power of two of at least 16; `base` is 16-byte
/// aligned. Copies of a writer only store through raw pointers, like the ring itself.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WqWriter<'a> {
    base: NonNull<u8>,
    mask: usize,
    _ring: PhantomData<&'a mut WqRing>,
}

impl WqWriter<'_> {
    /// Ring length in bytes.
    #[inline(always)]
    fn len(&self) -> usize {
        self.mask + 1
    }

    /// Copy `src` into the ring at byte position `pos` (taken modulo the ring length); a copy
    /// that reaches the end continues at the start. Up to 64 bytes that do not reach the end
    /// are a few fixed (overlapping) loads and stores, never a `memcpy` call.
    #[inline(always)]
    pub(crate) fn write(&self, pos: usize, src: &[u8]) {
        let start = pos & self.mask;
        let n = src.len();
        if n <= self.len() - start {
            // SAFETY: `start + n <= len`, inside the ring (type invariant); the source is a
            // Rust slice of `n` bytes that cannot overlap the mapping.
            unsafe { copy_short(self.base.as_ptr().wrapping_add(start), src.as_ptr(), n) };
            return;
        }
        self.write_wrapping(start, src);
    }

    /// [`write`](Self::write) of at most 64 bytes that does not reach the ring end, as a few
    /// fixed loads and stores with no call in any branch (the fused send paths); `false`, and
    /// nothing written, for a longer copy or one that would wrap.
    #[inline(always)]
    pub(crate) fn write_short(&self, pos: usize, src: &[u8]) -> bool {
        let start = pos & self.mask;
        let n = src.len();
        if n > 64 || n > self.len() - start {
            return false;
        }
        // SAFETY: `start + n <= len`, inside the ring (type invariant), and `n <= 64`; the
        // source is a Rust slice of `n` bytes that cannot overlap the mapping.
        unsafe { copy_upto64(self.base.as_ptr().wrapping_add(start), src.as_ptr(), n) };
        true
    }

    /// [`write`](Self::write) for a copy that reaches the ring end.
    #[cold]
    #[inline(never)]
    fn write_wrapping(self, start: usize, src: &[u8]) {
        let first = src.len().min(self.len() - start);
        // SAFETY: `start + first <= len`, inside the ring (type invariant); raw copy from a Rust
        // slice that cannot overlap the mapping.
        unsafe {
            core::ptr::copy_nonoverlapping(
                src.as_ptr(),
                self.base.as_ptr().wrapping_add(start),
                first,
            )
        };
        if first < src.len() {
            let rest = (src.len() - first).min(self.len());
            // SAFETY: `rest <= len`, written from the ring start.
            unsafe {
                core::ptr::copy_nonoverlapping(
                    src.as_ptr().wrapping_add(first),
                    self.base.as_ptr(),
                    rest,
                )
            };
        }
    }

    /// Store a fixed-size block of whole segments (`N` a multiple of 16) at byte position `pos`
    /// (16-byte aligned, modulo the ring) as native-width 8-byte stores of the bytes as they are
    /// (no byte swap), wrapping per 16-byte unit at the ring end. Small segments thus never
    /// become a `memcpy` call.
    #[inline(always)]
    pub(crate) fn write_segs<const N: usize>(&self, pos: usize, seg: &[u8; N]) {
        const { assert!(N % 16 == 0 && N > 0) };
        for (i, seg16) in seg.chunks_exact(16).enumerate() {
            let (lo, hi) = seg16.split_at(8);
            let mut b = [[0u8; 8]; 2];
            b[0].copy_from_slice(lo);
            b[1].copy_from_slice(hi);
            self.store16(
                pos + i * 16,
                u64::from_ne_bytes(b[0]),
                u64::from_ne_bytes(b[1]),
            );
        }
    }

    /// Store one 16-byte unit as two native 8-byte words (`lo` at the lower address) at byte
    /// position `pos` rounded down to 16, modulo the ring.
    #[inline(always)]
    pub(crate) fn store16(&self, pos: usize, lo: u64, hi: u64) {
        #[expect(
            clippy::cast_ptr_alignment,
            reason = "base is 16-byte aligned and the offset is a multiple of 16"
        )]
        let p = self
            .base
            .as_ptr()
            .wrapping_add(pos & self.mask & !15)
            .cast::<u64>();
        // SAFETY: the unit starts at a multiple of 16 below len, a multiple of 16, so all 16
        // bytes are inside the ring, and the words are 8-byte aligned (base is 16-aligned, type
        // invariant); plain raw stores, no reference into the ring.
        unsafe { p.write(lo) };
        // SAFETY: the second word of the same unit (as above).
        unsafe { p.wrapping_add(1).write(hi) };
    }

    /// Store 4 bytes as they are at byte position `pos` (rounded down to 4, modulo the ring) as
    /// one native-width store (an inline-segment header).
    #[inline(always)]
    pub(crate) fn write4(&self, pos: usize, bytes: [u8; 4]) {
        #[expect(
            clippy::cast_ptr_alignment,
            reason = "base is 16-byte aligned and the offset is a multiple of 4"
        )]
        let p = self.base.as_ptr().cast::<u32>();
        let at = pos & self.mask & !3;
        // SAFETY: `at + 4 <= len` (`at` is a multiple of 4 below len, a multiple of 16) and
        // 4-byte aligned (base is 16-aligned, type invariant); one raw u32 store.
        unsafe { p.wrapping_add(at / 4).write(u32::from_ne_bytes(bytes)) };
    }
}

/// Copy `n` bytes from `src` to `dst` with at most four fixed-size unaligned loads and stores
/// when `n <= 64` ([`copy_upto64`]), else one `copy_nonoverlapping` (out of line).
///
/// # Safety
/// `src` valid for `n` bytes of reads, `dst` for `n` bytes of writes, not overlapping.
#[inline(always)]
unsafe fn copy_short(dst: *mut u8, src: *const u8, n: usize) {
    if n <= 64 {
        // SAFETY: the caller's contract, and `n <= 64`.
        unsafe { copy_upto64(dst, src, n) };
    } else {
        // SAFETY: `n` bytes in both buffers, not overlapping (caller's contract).
        unsafe { copy_long(dst, src, n) };
    }
}

/// Copy `n <= 64` bytes from `src` to `dst` with at most four fixed-size unaligned loads and
/// stores (the two halves overlap when `n` is not a power of two). Written out because LLVM
/// turns a copy loop into a `memcpy` call.
///
/// # Safety
/// `n <= 64`; `src` valid for `n` bytes of reads, `dst` for `n` bytes of writes, not
/// overlapping.
#[inline(always)]
unsafe fn copy_upto64(dst: *mut u8, src: *const u8, n: usize) {
    type B16 = [u8; 16];
    // SAFETY (each `mov` below): the offset `k` and width `w` satisfy `k + w <= n` by the
    // branch conditions, so the access is inside both buffers (caller's contract).
    if n >= 16 {
        if n <= 32 {
            // SAFETY: see above (16 <= n).
            unsafe { mov::<B16>(dst, src, 0) };
            // SAFETY: see above (16 <= n).
            unsafe { mov::<B16>(dst, src, n - 16) };
        } else {
            // SAFETY: see above (32 < n <= 64).
            unsafe { mov::<[B16; 2]>(dst, src, 0) };
            // SAFETY: see above (32 < n <= 64).
            unsafe { mov::<[B16; 2]>(dst, src, n - 32) };
        }
    } else if n >= 8 {
        // SAFETY: see above (8 <= n).
        unsafe { mov::<u64>(dst, src, 0) };
        // SAFETY: see above (8 <= n).
        unsafe { mov::<u64>(dst, src, n - 8) };
    } else if n >= 4 {
        // SAFETY: see above (4 <= n).
        unsafe { mov::<u32>(dst, src, 0) };
        // SAFETY: see above (4 <= n).
        unsafe { mov::<u32>(dst, src, n - 4) };
    } else if n > 0 {
        // SAFETY: see above (1 <= n; n / 2 < n).
        unsafe { mov::<u8>(dst, src, 0) };
        // SAFETY: see above.
        unsafe { mov::<u8>(dst, src, n / 2) };
        // SAFETY: see above.
        unsafe { mov::<u8>(dst, src, n - 1) };
    }
}

/// [`copy_short`] of more than 64 bytes: out of line and cold, so the `memcpy` call does not
/// make the hot path save registers around it.
///
/// # Safety
/// As [`copy_short`]'s.
#[cold]
#[inline(never)]
unsafe fn copy_long(dst: *mut u8, src: *const u8, n: usize) {
    // SAFETY: `n` bytes in both buffers, not overlapping (caller's contract).
    unsafe { core::ptr::copy_nonoverlapping(src, dst, n) };
}

/// Copy one `T` of plain bytes from `src + k` to `dst + k`, unaligned.
///
/// # Safety
/// `[k, k + size_of::<T>())` is inside both the source and the destination buffer.
#[inline(always)]
unsafe fn mov<T: Copy>(dst: *mut u8, src: *const u8, k: usize) {
    // SAFETY: inside the source (caller's contract); an unaligned read of plain bytes.
    let v = unsafe { src.wrapping_add(k).cast::<T>().read_unaligned() };
    // SAFETY: inside the destination (caller's contract); an unaligned write.
    unsafe { dst.wrapping_add(k).cast::<T>().write_unaligned(v) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_wrap_at_the_end() {
        let buf = Arc::new(DmaBuf::new(4096).unwrap());
        let mut r = WqRing::new(buf.clone(), 1024, 256);
        r.write(250, &[1, 2, 3, 4, 5, 6, 7, 8]);
        let mut out = [0u8; 8];
        r.read(250, &mut out);
        assert_eq!(out, [1, 2, 3, 4, 5, 6, 7, 8]);
        let mut head = [0u8; 2];
        buf.read(1024, &mut head);
        assert_eq!(head, [7, 8]);
        let mut tail = [0u8; 6];
        buf.read(1024 + 250, &mut tail);
        assert_eq!(tail, [1, 2, 3, 4, 5, 6]);
        r.write(256 + 64, &[9; 8]);
        let sq = SqRing::new(WqRing::new(buf.clone(), 1024, 256)).unwrap();
        let mut first = [0u8; 8];
        buf.read(1024 + 64, &mut first);
        assert_eq!(
            sq.block(64 + 300 * 256).as_ptr() as u64,
            sq.ring().addr() + 64
        );
        assert_eq!(first, [9; 8]);
        // A 48-byte segment block at 240 wraps after its first 16 bytes, word by word.
        let seg: [u8; 48] = core::array::from_fn(|i| i as u8 + 1);
        r.writer().write_segs(240, &seg);
        let mut back = [0u8; 48];
        r.read(240, &mut back);
        assert_eq!(back, seg);
        let mut start = [0u8; 32];
        buf.read(1024, &mut start);
        assert_eq!(&start[..], &seg[16..]);
        r.writer().write4(256 + 4, [0xA, 0xB, 0xC, 0xD]);
        let mut w = [0u8; 8];
        buf.read(1024, &mut w);
        assert_eq!(w, [17, 18, 19, 20, 0xA, 0xB, 0xC, 0xD]);
    }

    /// Finding: `WqRing::new(buf, 4080, 16).chunk64(0)` read 48 bytes past the mapping
    /// (SIGSEGV): a 16-byte ring was accepted while the BlueFlame read took 64. Now the 64-byte
    /// reads exist only on an `SqRing`, which refuses rings shorter than 64 bytes or not
    /// 64-byte aligned; every block pointer of one stays inside it.
    #[test]
    fn send_rings_are_whole_blocks_and_block_reads_stay_inside() {
        let buf = Arc::new(DmaBuf::new(4096).unwrap());
        assert!(SqRing::new(WqRing::new(buf.clone(), 4080, 16)).is_none());
        assert!(SqRing::new(WqRing::new(buf.clone(), 4064, 32)).is_none());
        assert!(
            SqRing::new(WqRing::new(buf.clone(), 16, 64)).is_none(),
            "misaligned"
        );
        let r = SqRing::new(WqRing::new(buf.clone(), 4032, 64)).unwrap();
        for pos in [0usize, 1, 63, 64, 4095, usize::MAX] {
            assert_eq!(r.block(pos).as_ptr() as u64, buf.addr() + 4032);
        }
        let r = SqRing::new(WqRing::new(buf.clone(), 0, 4096)).unwrap();
        for pos in [0usize, 100, 4095, 4096 + 130, usize::MAX] {
            let off = r.block(pos).as_ptr() as u64 - buf.addr();
            assert!(off % 64 == 0 && off + 64 <= 4096, "{pos}: {off}");
        }
    }

    /// The short copy writes exactly `[pos, pos + n)` (wrapping), for every length.
    #[test]
    fn short_copies_write_exactly_their_bytes() {
        let buf = Arc::new(DmaBuf::new(4096).unwrap());
        let mut r = WqRing::new(buf.clone(), 1024, 256);
        let src: Vec<u8> = (0..200u8).map(|i| i.wrapping_mul(7) | 1).collect();
        for n in 0..=200usize {
            for pos in [0usize, 4, 20, 100, 250, 252] {
                r.zero();
                r.write(pos, &src[..n]);
                let mut all = [0u8; 256];
                r.read(0, &mut all);
                for (i, b) in all.iter().enumerate() {
                    let k = (i + 256 - pos) % 256;
                    let want = if k < n { src[k] } else { 0 };
                    assert_eq!(*b, want, "n {n} pos {pos} byte {i}");
                }
            }
        }
        let mut outside = [0u8; 16];
        buf.read(1024 - 16, &mut outside);
        assert_eq!(outside, [0; 16]);
        buf.read(1024 + 256, &mut outside);
        assert_eq!(outside, [0; 16]);
    }
}
