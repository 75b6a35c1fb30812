//! Scatter-to-CQE copies: small payloads that the device wrote into a CQE instead of memory
//! are copied by the CPU into the scatter list of the WQE they belong to.
//!
//! The destinations are addresses from data segments the application posted, so every one is
//! checked against the context's table of live memory regions ([`MrTable`]) before a byte is
//! written: the segment's lkey must name a registered region of the queue's protection domain
//! with local write access, and the copied range must lie inside it, as the device itself
//! would check before a DMA write. The table's lock is held across the check and the copy,
//! and a region leaves the table (under that lock) before it is deregistered, so the memory
//! cannot go away in between.

use std::collections::HashMap;
use std::sync::Mutex;

use mlx5_hw::opcodes::WcStatus;
use mlx5_hw::wqe::DataSeg;

/// What the table knows about one registered memory region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct MrSpan {
    addr: u64,
    len: u64,
    pd: u32,
    local_write: bool,
}

/// The live memory regions of a context, by lkey.
///
/// # Invariants
/// An entry exists only while its region is registered and its memory is mapped writable:
/// a `DmaBuf` the region keeps alive, or `UserMemory` whose creator promised that it stays
/// mapped while the region exists (a region with local write access needs a writable mapping:
/// the kernel refuses to pin read-only pages for it). Entries are removed before the region
/// is deregistered.
#[derive(Debug, Default)]
pub struct MrTable {
    spans: Mutex<HashMap<u32, MrSpan>>,
}

impl MrTable {
    /// Record the region `lkey` of protection domain `pd` over `[addr, addr + len)`.
    pub(crate) fn insert(&self, lkey: u32, addr: u64, len: u64, pd: u32, local_write: bool) {
        let mut t = self.spans.lock().unwrap_or_else(|p| p.into_inner());
        t.insert(
            lkey,
            MrSpan {
                addr,
                len,
                pd,
                local_write,
            },
        );
    }

    /// Forget region `lkey` (before it is deregistered).
    pub(crate) fn remove(&self, lkey: u32) {
        let mut t = self.spans.lock().unwrap_or_else(|p| p.into_inner());
        t.remove(&lkey);
    }

    /// Copy `data` into the data segments `segs` (in order, up to a terminator) of a WQE of
    /// protection domain `pd`, filling each segment before the next, as the device scatters.
    ///
    /// # Errors
    /// [`WcStatus::LOC_PROT_ERR`] for a segment whose lkey is unknown, of another PD, without
    /// local write access, or whose range leaves its region (nothing more is copied);
    /// [`WcStatus::LOC_LEN_ERR`] if the segments hold fewer bytes than `data`.
    pub fn copy_to_segs(
        &self,
        pd: u32,
        data: &[u8],
        segs: impl Iterator<Item = DataSeg>,
    ) -> Result<(), WcStatus> {
        if data.is_empty() {
            return Ok(());
        }
        let t = self.spans.lock().unwrap_or_else(|p| p.into_inner());
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
            let addr = seg.addr();
            let fits = t.get(&seg.lkey()).is_some_and(|s| {
                s.pd == pd
                    && s.local_write
                    && addr >= s.addr
                    && (addr - s.addr)
                        .checked_add(n as u64)
                        .is_some_and(|end| end <= s.len)
            });
            if !fits {
                return Err(WcStatus::LOC_PROT_ERR);
            }
            // SAFETY: `[addr, addr + n)` lies inside a live region of this PD with local write
            // access (checked just above), whose memory is mapped writable while its table
            // entry exists (type invariant); the table lock is held, so the region cannot be
            // deregistered during the copy. The source is a Rust slice of at least `n` bytes
            // in process memory the device does not own, so the two cannot overlap. This is
            // the write the device would have made by DMA.
            unsafe {
                core::ptr::copy_nonoverlapping(rest.as_ptr(), addr as usize as *mut u8, n);
            }
            rest = &rest[n..];
            if rest.is_empty() {
                return Ok(());
            }
        }
        Err(WcStatus::LOC_LEN_ERR)
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
