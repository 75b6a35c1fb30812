//! Scatter-to-CQE copies: small payloads that the device wrote into a CQE instead of memory
//! are copied by the CPU into the scatter list of the WQE they belong to.
//!
//! The destinations are addresses from data segments the application posted, so every one is
//! checked against the context's table of live memory regions ([`MrTable`]) before a byte is
//! written: the segment's lkey must name a registered region of the queue's protection domain
//! with local write access, and the copied range must lie inside it, as the device itself
//! would check before a DMA write. Pollers find regions through a last-hit cache ([`MrCache`]),
//! so the table's lock is taken only on a miss; each copy pins its region's span, and a region
//! leaves the table, marked dead with the pins drained, before it is deregistered, so the
//! memory cannot go away during a copy.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use mlx5_hw::opcodes::WcStatus;
use mlx5_hw::wqe::DataSeg;

/// What the table knows about one registered memory region, and the pins of copies in flight.
///
/// # Invariants
/// While `state` has no [`DEAD`] bit, the region is registered and `[addr, addr + len)` is
/// mapped writable (see [`MrTable`]). A copier pins the span (`state += 1`) and checks `DEAD`
/// before writing; [`MrTable::remove`] sets `DEAD` and waits for the pins to drain before it
/// returns (and so before the region is deregistered and its memory may go away).
#[derive(Debug)]
struct MrSpan {
    lkey: u32,
    addr: u64,
    len: u64,
    pd: u32,
    local_write: bool,
    state: AtomicU32,
}

/// [`MrSpan::state`] bit: the region is being deregistered; no new copy may start.
const DEAD: u32 = 1 << 31;

impl MrSpan {
    /// Whether `n` bytes at `addr` lie inside the region and it may be written for `pd`.
    #[inline(always)]
    fn admits(&self, pd: u32, addr: u64, n: usize) -> bool {
        self.pd == pd
            && self.local_write
            && addr >= self.addr
            && (addr - self.addr)
                .checked_add(n as u64)
                .is_some_and(|end| end <= self.len)
    }
}

/// A poller's last-hit cache of memory regions, so that scatter-to-CQE copies find their
/// region without the table's lock in steady state. Owned by one poller (`&mut`).
#[derive(Debug, Default)]
pub(crate) struct MrCache {
    last: Option<Arc<MrSpan>>,
    /// Times the table's lock was taken because the cache missed.
    pub(crate) misses: u64,
}

/// The live memory regions of a context, by lkey.
///
/// # Invariants
/// An entry exists only while its region is registered and its memory is mapped writable:
/// a `DmaBuf` the region keeps alive, or `UserMemory` whose creator promised that it stays
/// mapped while the region exists (a region with local write access needs a writable mapping:
/// the kernel refuses to pin read-only pages for it). Entries are removed (and their spans
/// marked dead, with every copy in flight finished) before the region is deregistered.
#[derive(Debug, Default)]
pub struct MrTable {
    spans: Mutex<HashMap<u32, Arc<MrSpan>>>,
}

impl MrTable {
    /// Record the region `lkey` of protection domain `pd` over `[addr, addr + len)`.
    pub(crate) fn insert(&self, lkey: u32, addr: u64, len: u64, pd: u32, local_write: bool) {
        let mut t = self.spans.lock().unwrap_or_else(|p| p.into_inner());
        let span = Arc::new(MrSpan {
            lkey,
            addr,
            len,
            pd,
            local_write,
            state: AtomicU32::new(0),
        });
        if let Some(old) = t.insert(lkey, span) {
            Self::kill(&old);
        }
    }

    /// Forget region `lkey` (before it is deregistered): no copy starts into it from now on,
    /// and every copy that had started has finished when this returns.
    pub(crate) fn remove(&self, lkey: u32) {
        let old = {
            let mut t = self.spans.lock().unwrap_or_else(|p| p.into_inner());
            t.remove(&lkey)
        };
        if let Some(old) = old {
            Self::kill(&old);
        }
    }

    /// Mark `span` dead and wait until no copy holds a pin on it (copies are at most 64 bytes,
    /// so this waits for nanoseconds unless a copier thread was preempted mid-copy).
    fn kill(span: &MrSpan) {
        span.state.fetch_or(DEAD, Ordering::AcqRel);
        while span.state.load(Ordering::Acquire) & !DEAD != 0 {
            std::thread::yield_now();
        }
    }

    /// The span of `lkey` from the table (locked: the cold path).
    #[cold]
    #[inline(never)]
    fn lookup(&self, lkey: u32) -> Option<Arc<MrSpan>> {
        let t = self.spans.lock().unwrap_or_else(|p| p.into_inner());
        t.get(&lkey).cloned()
    }

    /// Copy `data` into the data segments `segs` (in order, up to a terminator) of a WQE of
    /// protection domain `pd`, filling each segment before the next, as the device scatters.
    /// Regions are found through `cache` (the table's lock only on a miss) and pinned during
    /// each segment's copy.
    ///
    /// # Errors
    /// [`WcStatus::LOC_PROT_ERR`] for a segment whose lkey is unknown, of another PD, without
    /// local write access, or whose range leaves its region (nothing more is copied);
    /// [`WcStatus::LOC_LEN_ERR`] if the segments hold fewer bytes than `data`.
    pub(crate) fn copy_to_segs_cached(
        &self,
        cache: &mut MrCache,
        pd: u32,
        data: &[u8],
        segs: impl Iterator<Item = DataSeg>,
    ) -> Result<(), WcStatus> {
        if data.is_empty() {
            return Ok(());
        }
        let mut rest = data;
        for seg in segs {
            if seg.is_terminator() {
                break;
            }
            // A byte count of 0 means 2 GiB.
            let cap = match seg.byte_count() {
                0 => 1usize << 31,
                n => n as usize,
            };
            let n = rest.len().min(cap);
            let span = self.find(cache, seg.lkey()).ok_or(WcStatus::LOC_PROT_ERR)?;
            copy_pinned(span, pd, seg.addr(), &rest[..n])?;
            rest = &rest[n..];
            if rest.is_empty() {
                return Ok(());
            }
        }
        Err(WcStatus::LOC_LEN_ERR)
    }

    /// The live span of `lkey`: the cached one, or (on a miss, or if the cached region died)
    /// the table's.
    #[inline(always)]
    fn find<'c>(&self, cache: &'c mut MrCache, lkey: u32) -> Option<&'c MrSpan> {
        let hit = cache
            .last
            .as_ref()
            .is_some_and(|s| s.lkey == lkey && s.state.load(Ordering::Relaxed) & DEAD == 0);
        if !hit {
            cache.misses += 1;
            cache.last = self.lookup(lkey);
        }
        cache.last.as_deref()
    }

    /// [`copy_to_segs_cached`](Self::copy_to_segs_cached) without a cache (every segment's
    /// region looked up under the table's lock): for the rare paths (SRQ-less requester
    /// READ/atomic results).
    ///
    /// # Errors
    /// As [`copy_to_segs_cached`](Self::copy_to_segs_cached).
    pub fn copy_to_segs(
        &self,
        pd: u32,
        data: &[u8],
        segs: impl Iterator<Item = DataSeg>,
    ) -> Result<(), WcStatus> {
        let mut cache = MrCache::default();
        self.copy_to_segs_cached(&mut cache, pd, data, segs)
    }
}

/// Copy `src` to `addr` inside `span`'s region if it admits the write: pin, check `DEAD`, check
/// the range, copy, unpin.
///
/// # Errors
/// [`WcStatus::LOC_PROT_ERR`] if the region is dead or does not admit the write.
#[inline]
fn copy_pinned(span: &MrSpan, pd: u32, addr: u64, src: &[u8]) -> Result<(), WcStatus> {
    let prev = span.state.fetch_add(1, Ordering::Acquire);
    let ok = prev & DEAD == 0 && span.admits(pd, addr, src.len());
    if ok {
        // SAFETY: `[addr, addr + src.len())` lies inside a region of this PD with local write
        // access (`admits`), and the span is pinned without the DEAD bit: `MrTable::remove`
        // (which runs before the region is deregistered and its memory may be unmapped) waits
        // for this pin to go, so the memory is mapped writable for the whole copy (type
        // invariant of `MrSpan`). The source is a Rust slice in process memory the device does
        // not own, so the two cannot overlap. This is the write the device would have made by
        // DMA.
        unsafe {
            core::ptr::copy_nonoverlapping(src.as_ptr(), addr as usize as *mut u8, src.len());
        }
    }
    span.state.fetch_sub(1, Ordering::Release);
    if ok {
        Ok(())
    } else {
        Err(WcStatus::LOC_PROT_ERR)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::DmaBuf;

    #[test]
    fn copies_fill_segments_in_order_and_bad_segments_are_refused() {
        let buf = DmaBuf::new(4096).unwrap();
        let t = MrTable::default();
        t.insert(7, buf.addr(), 4096, 1, true);
        t.insert(8, buf.addr(), 4096, 1, false);
        let data: Vec<u8> = (1..=40).collect();
        let segs = [
            DataSeg::new(16, 7, buf.addr() + 100),
            DataSeg::new(16, 7, buf.addr() + 300),
            DataSeg::new(64, 7, buf.addr() + 500),
            DataSeg::terminator(),
        ];
        assert_eq!(t.copy_to_segs(1, &data, segs.into_iter()), Ok(()));
        let mut got = [0u8; 16];
        buf.read(100, &mut got);
        assert_eq!(&got[..], &data[..16]);
        buf.read(300, &mut got);
        assert_eq!(&got[..], &data[16..32]);
        let mut tail = [0u8; 9];
        buf.read(500, &mut tail);
        assert_eq!(&tail[..8], &data[32..]);
        assert_eq!(tail[8], 0, "nothing past the payload");
        // Too small: a length error after the segments are used up (or at the terminator).
        let small = [DataSeg::new(8, 7, buf.addr()), DataSeg::terminator()];
        assert_eq!(
            t.copy_to_segs(1, &data, small.into_iter()),
            Err(WcStatus::LOC_LEN_ERR)
        );
        // Unknown lkey, other PD, no local write, outside the region, wrapping address.
        for (seg, pd) in [
            (DataSeg::new(64, 9, buf.addr()), 1),
            (DataSeg::new(64, 7, buf.addr()), 2),
            (DataSeg::new(64, 8, buf.addr()), 1),
            (DataSeg::new(64, 7, buf.addr() + 4090), 1),
            (DataSeg::new(64, 7, buf.addr() - 8), 1),
            (DataSeg::new(64, 7, u64::MAX - 3), 1),
        ] {
            assert_eq!(
                t.copy_to_segs(pd, &data, [seg].into_iter()),
                Err(WcStatus::LOC_PROT_ERR),
                "{seg:?}"
            );
        }
        // Nothing to copy: success without looking at the segments.
        assert_eq!(t.copy_to_segs(1, &[], [segs[3]].into_iter()), Ok(()));
        t.remove(7);
        assert_eq!(
            t.copy_to_segs(1, &data, segs.into_iter()),
            Err(WcStatus::LOC_PROT_ERR)
        );
    }
}
