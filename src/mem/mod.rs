//! Memory the device touches: page-aligned and hugepage DMA buffers, doorbell-record pages,
//! the send/receive work-queue rings, the completion rings and the mapped UAR pages.
//!
//! This is one of the three modules where `unsafe` is allowed. The rule (docs/safety.md,
//! "Device memory and rings"): memory the device may be reading or writing is reachable only
//! through raw-pointer handles; the types here that hand out `&mut` windows (the WQE writer) do
//! so only over slots the counters prove are driver-owned.
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

use core::marker::PhantomData;
use core::ptr::NonNull;

use mlx5_hw::cqe::{Cqe64, sw_owns};
use mlx5_hw::opcodes::WcStatus;

use crate::error::Result;
use crate::mmio::access::DbWord;
use crate::mmio::barrier;

/// Keep the memory behind `a` alive for the rest of the process (after a failed destroy or
/// deregistration, when the device may still use it).
pub(crate) fn leak<T>(a: &Arc<T>) {
    core::mem::forget(Arc::clone(a));
}

/// A completion-queue buffer: `count` entries of `stride` bytes in a page-aligned [`DmaBuf`],
/// every descriptor initialised to "invalid, owner 0" (`op_own = 0xF0`). Its one consumer is
/// the [`CqeReader`] made with it.
#[derive(Debug)]
pub(crate) struct CqBuf {
    buf: Arc<DmaBuf>,
}

impl CqBuf {
    /// Keep the ring's memory for the rest of the process (after a refused DESTROY_CQ, when
    /// the device may still write completions into it).
    pub(crate) fn leak(&self) {
        core::mem::forget(Arc::clone(&self.buf));
    }

    /// Allocate and initialise `count` (a power of two) entries of `stride` (64 or 128) bytes;
    /// returns the buffer and its only reader.
    ///
    /// # Errors
    /// [`Error::Os`](crate::Error::Os) if the memory cannot be mapped;
    /// [`Error::InvalidArgument`](crate::error::Error::InvalidArgument) if `count` is not a power of
    /// two of at most 2^24 or `stride` is not 64 or 128.
    pub(crate) fn new(count: u32, stride: usize, rec: &DbRec) -> Result<(Self, CqeReader)> {
        if !count.is_power_of_two() || count > 1 << 24 || (stride != 64 && stride != 128) {
            return Err(crate::error::Error::InvalidArgument {
                attr: "cqe",
                reason: "a CQ ring is a power of two of at most 2^24 entries of 64 or 128 bytes",
            });
        }
        let buf = Arc::new(DmaBuf::new(count as usize * stride)?);
        let (ci_word, rec_page) = rec.word0_with_page();
        // INVARIANT (CqeReader): the buffer is page aligned, holds `count * stride` bytes and
        // is kept mapped by the reader's own `Arc`; this is the only reader made for it.
        let reader = CqeReader {
            // The descriptor of entry 0: the last 64 bytes of the entry.
            desc0: buf.as_ptr().map_addr(|a| a.saturating_add(stride - 64)),
            mask: count - 1,
            log_n: count.trailing_zeros() as u8,
            stride_shift: stride.trailing_zeros() as u8,
            tag_base: if stride == 128 { WIDE } else { 0 },
            ci: 0,
            _buf: buf.clone(),
            ci_word,
            _rec_page: rec_page,
        };
        for i in 0..count as usize {
            // Byte 63 of each descriptor: the device does not know the CQ yet.
            buf.write(i * stride + stride - 1, &[0xF0]);
        }
        Ok((Self { buf }, reader))
    }

    /// Address of the buffer (for CREATE_CQ).
    pub(crate) fn addr(&self) -> u64 {
        self.buf.addr()
    }
    /// Copy bytes at `offset` of the ring out (each byte one relaxed atomic load: the device
    /// and the poller may be at work meanwhile); for the ownership scan of a CQ fence.
    pub(crate) fn read_byte(&self, offset: usize, dst: &mut [u8]) {
        self.buf.read(offset, dst);
    }
}

/// The consumer of a CQ ring: the free-running consumer index and the descriptors, read with
/// the ownership test first. There is exactly one per ring ([`CqBuf::new`]); it moves with the
/// poller (a `Cq` or `RawCq`), so two pollers can never consume one ring.
///
/// # Invariants
/// `desc0 - ((1 << stride_shift) - 64)` (the ring's start) is 64-byte aligned and points to
/// `(mask + 1) << stride_shift` bytes kept mapped by `_buf`, so `desc0` is the 64-byte
/// descriptor of entry 0 (the entry's last 64 bytes); `mask + 1 == 1 << log_n`, a power of two;
/// `stride_shift` is 6 or 7. Entries at consumer indices `>= ci` that pass the
/// ownership test, and entries below `ci` not yet released by [`publish`](Self::publish),
/// belong to software: the device writes an entry again only after the published consumer
/// index moved past it.
#[derive(Debug)]
pub(crate) struct CqeReader {
    desc0: NonNull<u8>,
    mask: u32,
    log_n: u8,
    stride_shift: u8,
    /// The `tag` of every [`TakenCqe`] but its `op_own` byte: [`WIDE`] for 128-byte entries,
    /// and bits ORed into that byte while the flight recorder is on ([`mark`](Self::mark)).
    tag_base: u32,
    ci: u32,
    _buf: Arc<DmaBuf>,
    /// Word 0 of the CQ's doorbell record (where the consumer index is published), kept
    /// mapped by `_rec_page`: one load less per publication than through the record's owner.
    ci_word: DbWord,
    _rec_page: Arc<DmaBuf>,
}

// SAFETY: the reader only copies out of (and, at creation, initialises) a mapping its `Arc`
// keeps alive, through raw pointers; moving it to another thread moves its one consumer with
// it. It is not `Sync` (the consumer index is `&mut`-only state).
unsafe impl Send for CqeReader {}

/// A descriptor software owns, borrowed from the reader that took it: while it exists the
/// consumer index cannot be published, so the device cannot rewrite the entry.
///
/// # Invariants
/// `desc` is the 64-byte descriptor (64-byte aligned) of a live entry of the borrowed reader's
/// ring that software owns (ownership bit tested, then `from_device()`); with [`WIDE`] set in
/// `tag` the entry is 128 bytes and starts 64 bytes before `desc`, else it is the descriptor.
/// Bits 7:0 of `tag` are the `op_own` byte the ownership test read (with the reader's mark
/// bits), bits 15:8 the poller's status (see [`status`](Self::status)).
///
/// Two scalars, so that it travels in registers (in and out of the cold scatter-to-CQE path).
#[derive(Debug, Clone, Copy)]
pub(crate) struct TakenCqe<'r> {
    desc: *const u8,
    tag: u32,
    _reader: PhantomData<&'r mut CqeReader>,
}

/// The bit of [`TakenCqe::tag`] saying the entry is 128 bytes.
const WIDE: u32 = 1 << 31;
/// The status bits of [`TakenCqe::tag`].
const STATUS: u32 = 0xFF00;

impl CqeReader {
    /// The free-running consumer index.
    #[inline(always)]
    pub(crate) fn ci(&self) -> u32 {
        self.ci
    }

    /// What [`TakenCqe::slot`] needs: the address of entry 0's descriptor, log2 of the entry
    /// size, the slot mask.
    pub(crate) fn geometry(&self) -> (usize, u8, u32) {
        (self.desc0.as_ptr().addr(), self.stride_shift, self.mask)
    }

    /// Whether entries are 128 bytes.
    pub(crate) fn wide(&self) -> bool {
        self.stride_shift == 7
    }

    /// Take the descriptor at the consumer index if software owns it (one volatile load of its
    /// `op_own` byte, the ownership test, then `from_device()`) and advance the index; `None`
    /// while the device owns it.
    #[inline(always)]
    pub(crate) fn take(&mut self) -> Option<TakenCqe<'_>> {
        let ci = self.ci;
        let slot = (ci & self.mask) as usize;
        // `slot <= mask`, so the entry's descriptor lies inside the ring (type invariant).
        let desc = self.desc0.as_ptr().wrapping_add(slot << self.stride_shift);
        // SAFETY: byte 63 of the entry's descriptor, inside the live ring (type invariant);
        // volatile because the device writes it.
        let op_own = unsafe { desc.wrapping_add(63).read_volatile() };
        // The ownership test of `sw_owns` with `log_n <= 24` (type invariant): opcode not
        // INVALID and the owner bit equal to the pass parity.
        // One compare for both tests: with the pass parity folded into bit 0 and that bit
        // rotated to the top, the entry is owned exactly when bit 7 is clear (owner bit equals
        // the parity) and the opcode, now bits 6:3, is not 0xF (INVALID): a value below 0x78.
        let pass = ((ci >> (self.log_n & 31)) & 1) as u8;
        if (op_own ^ pass).rotate_right(1) >= 0x78 {
            debug_assert!(!sw_owns(op_own, ci, self.log_n));
            return None;
        }
        debug_assert!(sw_owns(op_own, ci, self.log_n));
        barrier::from_device();
        self.ci = ci.wrapping_add(1);
        Some(TakenCqe {
            desc,
            tag: u32::from(op_own) | self.tag_base,
            _reader: PhantomData,
        })
    }

    /// [`take`](Self::take) of the entry at the consumer index only if software owns it and
    /// its `op_own` byte, masked with `mask`, is `want` (an opcode and format bits; the
    /// reader's [`mark`](Self::mark) bits count, so that a recording CQ never matches);
    /// otherwise `None` and nothing taken. The unchecked single-QP pollers' take.
    #[inline(always)]
    pub(crate) fn take_if(&mut self, want: u8, mask: u8) -> Option<TakenCqe<'_>> {
        let ci = self.ci;
        let slot = (ci & self.mask) as usize;
        // `slot <= mask`, so the entry's descriptor lies inside the ring (type invariant).
        let desc = self.desc0.as_ptr().wrapping_add(slot << self.stride_shift);
        // SAFETY: as in `take`: byte 63 of a descriptor inside the live ring, volatile.
        let op_own = unsafe { desc.wrapping_add(63).read_volatile() };
        let pass = ((ci >> (self.log_n & 31)) & 1) as u8;
        // Owned (owner bit equal to the pass parity; the opcode `want` is not INVALID) and
        // the wanted kind, in one compare.
        if (op_own | self.tag_base as u8) & mask != want || (op_own ^ pass) & 1 != 0 {
            return None;
        }
        barrier::from_device();
        self.ci = ci.wrapping_add(1);
        Some(TakenCqe {
            desc,
            tag: u32::from(op_own) | self.tag_base,
            _reader: PhantomData,
        })
    }

    /// Give back the entry the last [`take`](Self::take) took (its borrow ended, nothing was
    /// published since): the next `take` returns it again. Software still owns it.
    #[inline]
    pub(crate) fn untake(&mut self) {
        self.ci = self.ci.wrapping_sub(1);
    }

    /// OR `bits` into the `op_own` byte of every entry taken from now on
    /// ([`TakenCqe::op_own`]): the flight recorder's way to send every CQE to the pollers'
    /// cold paths.
    pub(crate) fn mark(&mut self, bits: u8) {
        self.tag_base = (self.tag_base & WIDE) | u32::from(bits);
    }

    /// Publish the consumer index in `word0` of the CQ's doorbell record (reads of the
    /// consumed entries before the store); the device may rewrite them from then on.
    #[inline(always)]
    pub(crate) fn publish(&mut self) {
        barrier::loads_before_release();
        self.ci_word.store_be32(self.ci & 0xFF_FFFF);
    }
}

impl TakenCqe<'_> {
    /// What the poller made of the entry (the scatter-to-CQE copy's outcome): `SUCCESS` when
    /// taken, else what [`set_status`](Self::set_status) stored.
    #[inline(always)]
    pub(crate) fn status(&self) -> WcStatus {
        WcStatus((self.tag & STATUS) >> 8)
    }

    /// Record the poller's status for the entry (statuses are below 256).
    #[inline(always)]
    pub(crate) fn set_status(&mut self, s: WcStatus) {
        self.tag = (self.tag & !STATUS) | ((s.0 << 8) & STATUS);
    }

    /// The low 24 bits of the big-endian word at byte `off` of the descriptor (`off` taken
    /// modulo 64, rounded down to a word): one load, for a field chosen at run time (the QP
    /// key of a CQE: user index at 0x20 or QPN at 0x38).
    #[inline(always)]
    pub(crate) fn be24_at(&self, off: u8) -> u32 {
        #[expect(
            clippy::cast_ptr_alignment,
            reason = "descriptors are 64-byte aligned (type invariant), the offset 4-aligned"
        )]
        let p = self
            .desc
            .wrapping_add(usize::from(off & 0x3C))
            .cast::<u32>();
        // SAFETY: a 4-byte aligned word inside the live descriptor that software owns (type
        // invariant; the offset is masked below 64): a plain load races with nothing, as in
        // `cqe`.
        u32::from_be(unsafe { p.read() }) & 0xFF_FFFF
    }

    /// The ring slot of the entry (its consumer index modulo the ring size).
    pub(crate) fn slot(&self, reader_geometry: (usize, u8, u32)) -> u32 {
        let (desc0, shift, mask) = reader_geometry;
        ((self.desc.addr().wrapping_sub(desc0) >> shift) as u32) & mask
    }

    /// The descriptor's `op_own` byte as the ownership test read it (the same value as
    /// [`cqe`](Self::cqe)'s: software owns the entry), with the reader's
    /// [`mark`](CqeReader::mark) bits ORed in.
    #[inline(always)]
    pub(crate) fn op_own(&self) -> u8 {
        self.tag as u8
    }

    /// The 64-byte descriptor, as the device wrote it (bytes in memory order).
    #[inline(always)]
    pub(crate) fn cqe(&self) -> Cqe64 {
        #[expect(
            clippy::cast_ptr_alignment,
            reason = "descriptors are 64-byte aligned (type invariant)"
        )]
        let p = self.desc.cast::<u64>();
        let mut words = [0u64; 8];
        for (i, w) in words.iter_mut().enumerate() {
            // SAFETY: word i of a live, 64-byte aligned descriptor that software owns (type
            // invariant): the device writes it again only after the consumer index is
            // published past it, which needs the reader this value borrows; so a plain load
            // races with nothing, and the compiler may skip the words never used.
            *w = unsafe { p.wrapping_add(i).read() };
        }
        zerocopy::transmute!(words)
    }

    /// The first 64 bytes of a 128-byte entry (where the device puts up to 64 bytes of
    /// scattered payload, CQE format 2); `None` on a ring of 64-byte entries.
    #[inline]
    pub(crate) fn first_half(&self) -> Option<[u8; 64]> {
        if self.tag & WIDE == 0 {
            return None;
        }
        let mut out = [0u8; 64];
        // SAFETY: the first 64 bytes of a live 128-byte entry that software owns, 64 bytes
        // before its descriptor (type invariant); raw copy into a local array.
        unsafe { core::ptr::copy_nonoverlapping(self.desc.wrapping_sub(64), out.as_mut_ptr(), 64) };
        Some(out)
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
