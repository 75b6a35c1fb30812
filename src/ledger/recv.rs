//! The receive side's ledger: the wr_id of every RQ and SRQ WQE, the tail the poller moves,
//! and the receive WQE's scatter list -- written by the poster ([`write_scatter`],
//! [`publish_recv`]) and read back by the poller when the device put the payload in the CQE
//! ([`ScatterTarget`]). RQs and SRQs share the format, past an SRQ WQE's next segment.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use mlx5_hw::opcodes::WcStatus;
use mlx5_hw::wqe::DataSeg;

use crate::mem::DbRec;
use crate::mem::scatter::{MrCache, MrTable};
use crate::mem::table::RingTable;
use crate::mem::wq::{WqReader, WqWriter};
use crate::mmio::barrier;
use crate::recorder::{QpRecorder, RqRetired};
use crate::wr::Sge;

/// Write the data segments of one receive WQE at byte `base` of the ring: one per non-empty
/// SGE (a 0-byte data segment would mean 2 GiB), then the invalid-lkey terminator if fewer than
/// `max_gs` were used. Shared by RQs and SRQs (whose WQEs start with a 16-byte next segment, so
/// `base` is past it). The caller has checked `sg_list.len() <= max_gs`; each segment is two
/// 8-byte stores (no `memcpy`).
#[inline(always)]
pub(crate) fn write_scatter(ring: WqWriter<'_>, base: usize, sg_list: &[Sge], max_gs: u32) {
    let mut at = base;
    for s in sg_list {
        if s.length != 0 {
            ring.write_segs::<16>(
                at,
                &zerocopy::transmute!(DataSeg::new(s.length, s.lkey, s.addr)),
            );
            at += 16;
        }
    }
    if at - base < max_gs as usize * 16 {
        ring.write_segs::<16>(at, &zerocopy::transmute!(DataSeg::terminator()));
    }
}

/// Publish receive WQEs to the device: WQE stores before the record, then record word 0 =
/// the low 16 bits of `counter` (RQ producer count or SRQ posted counter). No MMIO.
#[inline(always)]
pub(crate) fn publish_recv(dbrec: &DbRec, counter: u32) {
    barrier::to_device();
    dbrec.word0().store_be32(counter & 0xFFFF);
}

/// Where the poller copies a payload that the device scattered into a receive CQE: the data
/// segments of the receive WQE it consumed (RQ or SRQ), read back from the ring.
#[derive(Debug)]
pub(crate) struct ScatterTarget {
    ring: WqReader,
    /// log2 of the WQE stride.
    log_stride: u32,
    /// Byte offset of the first data segment in a WQE (16 on SRQs: past the next segment).
    first: usize,
    max_gs: u32,
    /// Kernel handle of the protection domain the WQEs' lkeys must belong to.
    pd: u32,
    mrs: Arc<MrTable>,
}

impl ScatterTarget {
    /// The data segments of WQEs with `stride` bytes (a power of two) in `ring`, the first at
    /// byte `first` of each, at most `max_gs` of them.
    pub(crate) fn new(
        ring: WqReader,
        stride: u32,
        first: usize,
        max_gs: u32,
        pd: u32,
        mrs: Arc<MrTable>,
    ) -> Self {
        Self {
            ring,
            log_stride: stride.trailing_zeros(),
            first,
            max_gs,
            pd,
            mrs,
        }
    }

    /// Copy `data` into the scatter list of WQE `index` (taken modulo the ring), finding the
    /// regions through the poller's last-hit `cache` (no lock unless it misses). Call before
    /// the WQE is retired (the poster may reuse it from then on).
    ///
    /// # Errors
    /// As [`MrTable::copy_to_segs_cached`].
    #[inline]
    pub(crate) fn copy(
        &self,
        index: u32,
        data: &[u8],
        cache: &mut MrCache,
    ) -> Result<(), WcStatus> {
        let base = ((index as usize) << self.log_stride) + self.first;
        let segs = (0..self.max_gs as usize)
            .map(|k| -> DataSeg { zerocopy::transmute!(self.ring.seg16(base + k * 16)) });
        self.mrs.copy_to_segs_cached(cache, self.pd, data, segs)
    }
}

/// State shared between a receive queue and the completion poller.
#[derive(Debug)]
pub(crate) struct RqShared {
    /// The wr_id of every RQ slot, indexed by the WQE counter.
    wr_ids: RingTable<AtomicU64>,
    /// Receives retired by completions (free-running); written only by the poller.
    pub tail: AtomicU32,
    /// Where scattered receive payloads go (absent only in unit tests of the poller).
    pub scatter: Option<ScatterTarget>,
    /// The QP's flight recorder, once enabled. Receive WQEs are recorded by the recording
    /// poller before it records a CQE of this queue, and by dumps: posting does nothing more.
    pub rec: OnceLock<Arc<QpRecorder>>,
}

impl RqShared {
    /// Tables for a ring of `wqe_cnt` (a power of two) receive WQEs.
    pub(crate) fn new(wqe_cnt: u32) -> Self {
        Self {
            wr_ids: RingTable::new(wqe_cnt as usize, || AtomicU64::new(0)),
            tail: AtomicU32::new(0),
            scatter: None,
            rec: OnceLock::new(),
        }
    }

    /// Record the wr_id of the receive WQE with counter `counter` (what posting does).
    #[inline(always)]
    pub(crate) fn set_wr_id(&self, counter: u32, wr_id: u64) {
        self.wr_ids.get(counter).store(wr_id, Ordering::Relaxed);
    }

    /// A receive CQE for RQ WQE counter `counter` arrived: its wr_id; retire it.
    #[inline(always)]
    pub(crate) fn complete(&self, counter: u16) -> u64 {
        let id = self.wr_ids.get(u32::from(counter)).load(Ordering::Relaxed);
        // The poller is the only writer of `tail` (ownership rule): no read-modify-write.
        let t = self.tail.load(Ordering::Relaxed);
        self.tail.store(t.wrapping_add(1), Ordering::Release);
        id
    }
}

impl RqRetired for RqShared {
    fn retired(&self) -> u32 {
        self.tail.load(Ordering::Acquire)
    }
}

/// State shared between a shared receive queue and the completion poller(s): the wr_id of
/// every WQE, and which WQEs the poller has freed (the poster re-links them).
#[derive(Debug)]
pub(crate) struct SrqShared {
    wr_ids: Box<[AtomicU64]>,
    freed: Box<[AtomicBool]>,
    /// Where scattered receive payloads go.
    pub(crate) scatter: ScatterTarget,
}

impl SrqShared {
    /// Tables for `n` WQEs whose scatter lists `scatter` reads back.
    pub(crate) fn new(n: u32, scatter: ScatterTarget) -> Self {
        Self {
            wr_ids: (0..n).map(|_| AtomicU64::new(0)).collect(),
            freed: (0..n).map(|_| AtomicBool::new(false)).collect(),
            scatter,
        }
    }

    /// Record the wr_id of WQE `index` (what posting does).
    pub(crate) fn set_wr_id(&self, index: u32, wr_id: u64) {
        self.wr_ids[index as usize % self.wr_ids.len()].store(wr_id, Ordering::Relaxed);
    }

    /// Whether the poller freed WQE `index` since the last call (and forget it).
    pub(crate) fn take_freed(&self, index: u32) -> bool {
        self.freed[index as usize % self.freed.len()].swap(false, Ordering::Acquire)
    }

    /// Copy a payload the device scattered into the CQE of SRQ WQE `index` into that WQE's
    /// scatter list (before [`complete`](Self::complete) frees it).
    ///
    /// # Errors
    /// As [`MrTable::copy_to_segs`](crate::mem::scatter::MrTable::copy_to_segs).
    pub(crate) fn copy_scattered(
        &self,
        index: u16,
        data: &[u8],
        cache: &mut MrCache,
    ) -> Result<(), WcStatus> {
        let i = usize::from(index) % self.wr_ids.len();
        self.scatter.copy(i as u32, data, cache)
    }

    /// A receive CQE for SRQ WQE `index`: its wr_id; the WQE becomes free.
    pub(crate) fn complete(&self, index: u16) -> u64 {
        let i = usize::from(index) % self.wr_ids.len();
        let id = self.wr_ids[i].load(Ordering::Relaxed);
        self.freed[i].store(true, Ordering::Release);
        id
    }
}
