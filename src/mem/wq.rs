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

use core::ptr::NonNull;

use super::dma_buf::DmaBuf;

/// A power-of-two byte ring inside a [`DmaBuf`].
///
/// # Invariants
/// `base .. base + mask + 1` lies inside `buf`, which `self` keeps mapped; `mask + 1` is a power
/// of two and a multiple of 64; `base` is 64-byte aligned.
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

    /// Copy `src` into the ring at byte position `pos` (taken modulo the ring length); a copy
    /// that reaches the end continues at the start.
    #[inline(always)]
    pub fn write(&mut self, pos: usize, src: &[u8]) {
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

    /// Copy `dst.len()` bytes out of the ring from byte position `pos` (modulo, wrapping).
    pub fn read(&self, pos: usize, dst: &mut [u8]) {
        let start = pos & self.mask;
        let first = dst.len().min(self.len() - start);
        // SAFETY: in bounds as in `write`.
        unsafe {
            core::ptr::copy_nonoverlapping(
                self.base.as_ptr().wrapping_add(start),
                dst.as_mut_ptr(),
                first,
            )
        };
        if first < dst.len() {
            let rest = (dst.len() - first).min(self.len());
            // SAFETY: `rest <= len`, read from the ring start.
            unsafe {
                core::ptr::copy_nonoverlapping(
                    self.base.as_ptr(),
                    dst.as_mut_ptr().wrapping_add(first),
                    rest,
                )
            };
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
    }
}
