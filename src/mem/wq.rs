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
/// of two of at least 16; `base` is 16-byte aligned (64-byte for send rings, whose length is a
/// multiple of 64).
#[derive(Debug)]
pub struct WqRing {
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
    /// If the window is out of bounds, `len` is not a power of two of at least 64 bytes, or
    /// `offset` is not 64-byte aligned (internal invariants of queue creation).
    pub fn new(buf: Arc<DmaBuf>, offset: usize, len: usize) -> Self {
        assert!(len.is_power_of_two() && len >= 16 && offset % 16 == 0);
        assert!(offset + len <= buf.len());
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
    pub fn len(&self) -> usize {
        self.mask + 1
    }

    /// Always false.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Address of the ring start, as the device sees it.
    pub fn addr(&self) -> u64 {
        self.base.as_ptr() as u64
    }

    /// The buffer the ring lives in.
    pub fn buf(&self) -> &Arc<DmaBuf> {
        &self.buf
    }

    /// A writer for this ring: the base and mask by value, so a loop that builds many WQEs keeps
    /// them in registers instead of reloading them through `&mut self` after every store.
    #[inline(always)]
    pub fn writer(&mut self) -> WqWriter<'_> {
        WqWriter {
            base: self.base,
            mask: self.mask,
            _ring: PhantomData,
        }
    }

    /// Copy `src` into the ring at byte position `pos` (taken modulo the ring length); a copy
    /// that reaches the end continues at the start.
    #[inline(always)]
    pub fn write(&mut self, pos: usize, src: &[u8]) {
        self.writer().write(pos, src);
    }

    /// Store a fixed-size block of whole segments at byte position `pos`; see
    /// [`WqWriter::write_segs`].
    #[inline(always)]
    pub fn write_segs<const N: usize>(&mut self, pos: usize, seg: &[u8; N]) {
        self.writer().write_segs(pos, seg);
    }

    /// Store 4 bytes as they are at byte position `pos`; see [`WqWriter::write4`].
    #[inline(always)]
    pub fn write4(&mut self, pos: usize, bytes: [u8; 4]) {
        self.writer().write4(pos, bytes);
    }

    /// Copy `dst.len()` bytes out of the ring from byte position `pos` (modulo, wrapping).
    pub fn read(&self, pos: usize, dst: &mut [u8]) {
        read_ring(self.base, self.mask, pos, dst);
    }

    /// A read-only view of the ring for another owner (the completion poller reading the
    /// scatter list of a completed WQE); it keeps the buffer mapped.
    pub fn reader(&self) -> WqReader {
        WqReader {
            _buf: self.buf.clone(),
            base: self.base,
            mask: self.mask,
        }
    }

    /// The 64-byte block at position `pos` (64-aligned, modulo the ring) as native words, for a
    /// BlueFlame copy.
    #[inline(always)]
    pub fn chunk64(&self, pos: usize) -> [u64; 8] {
        let start = pos & self.mask & !63;
        #[expect(
            clippy::cast_ptr_alignment,
            reason = "base is 64-byte aligned (type invariant)"
        )]
        let p = self.base.as_ptr().cast::<u64>();
        let mut out = [0u64; 8];
        for (i, w) in out.iter_mut().enumerate() {
            // SAFETY: `start` is 64-aligned and `start + 64 <= len` (len is a multiple of 64 for
            // send rings, the only caller); base is 64-aligned, so the u64 read is aligned.
            *w = unsafe { p.wrapping_add(start / 8 + i).read() };
        }
        out
    }

    /// Zero the whole ring.
    pub fn zero(&mut self) {
        // SAFETY: the whole ring is in bounds (type invariant).
        unsafe { core::ptr::write_bytes(self.base.as_ptr(), 0, self.len()) };
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

/// A read-only view of a [`WqRing`] ([`WqRing::reader`]), shared with the completion poller.
///
/// # Invariants
/// As [`WqRing`]'s: `base .. base + mask + 1` lies inside `_buf`, which this value keeps
/// mapped. It only ever copies bytes out with raw pointers; which slots it may read (those of
/// completed WQEs, which the poster does not write until they are retired) is the owner's
/// accounting.
#[derive(Clone, Debug)]
pub struct WqReader {
    /// Keeps the mapping alive (never read).
    _buf: Arc<DmaBuf>,
    base: NonNull<u8>,
    mask: usize,
}

// SAFETY: reads are raw copies of a mapping that `buf` keeps alive; no reference into it exists.
unsafe impl Send for WqReader {}
// SAFETY: as above: `&self` only performs raw copies out of the mapping.
unsafe impl Sync for WqReader {}

impl WqReader {
    /// Copy `dst.len()` bytes from byte position `pos` (modulo the ring, wrapping).
    pub fn read(&self, pos: usize, dst: &mut [u8]) {
        read_ring(self.base, self.mask, pos, dst);
    }

    /// The 16-byte segment at byte position `pos` (16-aligned, modulo the ring).
    pub fn seg16(&self, pos: usize) -> [u8; 16] {
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
pub struct WqWriter<'a> {
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
    /// that reaches the end continues at the start.
    #[inline(always)]
    pub fn write(&self, pos: usize, src: &[u8]) {
        let start = pos & self.mask;
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
    pub fn write_segs<const N: usize>(&self, pos: usize, seg: &[u8; N]) {
        const { assert!(N % 16 == 0 && N > 0) };
        debug_assert!(pos % 16 == 0);
        #[expect(
            clippy::cast_ptr_alignment,
            reason = "base is 16-byte aligned and every word offset is a multiple of 8"
        )]
        let p = self.base.as_ptr().cast::<u64>();
        for (i, seg16) in seg.chunks_exact(16).enumerate() {
            let (lo, hi) = seg16.split_at(8);
            let mut b = [[0u8; 8]; 2];
            b[0].copy_from_slice(lo);
            b[1].copy_from_slice(hi);
            // A 16-byte unit at a 16-aligned position never straddles the ring end.
            let at = ((pos + i * 16) & self.mask) / 8;
            for (k, w) in b.iter().enumerate() {
                // SAFETY: `at * 8 + 16 <= len` (len and `pos` are multiples of 16, so the unit
                // starts at a multiple of 16 below len) and 8-byte aligned (base is 16-aligned,
                // type invariant); one volatile u64 store inside the ring, no reference into it.
                unsafe {
                    p.wrapping_add(at + k)
                        .write_volatile(u64::from_ne_bytes(*w))
                };
            }
        }
    }

    /// Store 4 bytes as they are at byte position `pos` (4-byte aligned, modulo the ring) as one
    /// native-width store (an inline-segment header).
    #[inline(always)]
    pub fn write4(&self, pos: usize, bytes: [u8; 4]) {
        debug_assert!(pos % 4 == 0);
        #[expect(
            clippy::cast_ptr_alignment,
            reason = "base is 16-byte aligned and the offset is a multiple of 4"
        )]
        let p = self.base.as_ptr().cast::<u32>();
        let at = pos & self.mask & !3;
        // SAFETY: `at + 4 <= len` (`at` is a multiple of 4 below len, a multiple of 16) and
        // 4-byte aligned (base is 16-aligned, type invariant); one volatile u32 store.
        unsafe {
            p.wrapping_add(at / 4)
                .write_volatile(u32::from_ne_bytes(bytes))
        };
    }
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
        assert_eq!(r.chunk64(64)[0], u64::from_ne_bytes([9; 8]));
        // A 48-byte segment block at 240 wraps after its first 16 bytes, word by word.
        let seg: [u8; 48] = core::array::from_fn(|i| i as u8 + 1);
        r.write_segs(240, &seg);
        let mut back = [0u8; 48];
        r.read(240, &mut back);
        assert_eq!(back, seg);
        let mut start = [0u8; 32];
        buf.read(1024, &mut start);
        assert_eq!(&start[..], &seg[16..]);
        r.write4(256 + 4, [0xA, 0xB, 0xC, 0xD]);
        let mut w = [0u8; 8];
        buf.read(1024, &mut w);
        assert_eq!(w, [17, 18, 19, 20, 0xA, 0xB, 0xC, 0xD]);
    }
}
