//! The receive queue: data segments into the RQ ring, the invalid-lkey terminator, and the RQ
//! doorbell record (no MMIO: the device learns about receives only from record word 0).
//!
//! # Ownership rule
//! RQ slots `[head, tail + max_post)` are driver-owned; `tail` advances once per receive CQE
//! (completions are in order), written only by the CQ poller.
//!
//! # Ordering rule
//! WQE stores, `to_device()`, then record word 0 = `head & 0xFFFF`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use mlx5_hw::wqe::DataSeg;
use zerocopy::IntoBytes;

use crate::mem::DbRec;
use crate::mem::wq::WqRing;
use crate::mmio::barrier;
use crate::wr::{PostError, RecvWr, Sge};

/// Geometry of a receive queue (mlx5-datapath.md §2.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RqGeometry {
    /// WQE stride in bytes (power of two, >= 16).
    pub stride: u32,
    /// Number of WQEs (power of two); also the number of WRs that may be outstanding.
    pub wqe_cnt: u32,
    /// SGEs per WR.
    pub max_gs: u32,
}

/// Compute the RQ geometry for the requested caps.
///
/// # Errors
/// [`Error::Limit`](crate::Error::Limit) naming `max_recv_sge` or `max_recv_wr`.
pub fn rq_geometry(
    max_recv_wr: u32,
    max_recv_sge: u32,
    max_rq_desc_sz: u32,
    max_recv_wr_limit: u32,
    context: &'static str,
) -> crate::Result<RqGeometry> {
    use crate::Error;
    let max_sge = (max_rq_desc_sz.max(16).next_power_of_two() / 16).max(1);
    let max_sge = if (max_sge * 16) > max_rq_desc_sz.max(16) {
        max_sge / 2
    } else {
        max_sge
    }
    .max(1);
    Error::check_limit("max_recv_sge", max_recv_sge.into(), max_sge.into(), context)?;
    Error::check_limit(
        "max_recv_wr",
        max_recv_wr.into(),
        max_recv_wr_limit.into(),
        context,
    )?;
    let stride = (16 * max_recv_sge.max(1)).next_power_of_two();
    // The RQ producer counter published in the doorbell record is 16 bits wide.
    Error::check_limit("max_recv_wr", max_recv_wr.into(), 1 << 15, context)?;
    let bytes = (max_recv_wr.max(1).next_power_of_two() * stride).max(64);
    let wqe_cnt = bytes / stride;
    Ok(RqGeometry {
        stride,
        wqe_cnt,
        max_gs: stride / 16,
    })
}

/// Write the data segments of one receive WQE at `base`: one per non-empty SGE (a 0-byte data
/// segment would mean 2 GiB), then the invalid-lkey terminator if fewer than `max_gs` were used.
/// Shared by RQs and SRQs (whose WQEs start with a 16-byte next segment, so `base` is past it).
pub(crate) fn write_scatter(ring: &mut WqRing, base: usize, sg_list: &[Sge], max_gs: u32) {
    let mut k = 0usize;
    for s in sg_list.iter().filter(|s| s.length != 0) {
        ring.write(
            base + k * 16,
            DataSeg::new(s.length, s.lkey, s.addr).as_bytes(),
        );
        k += 1;
    }
    if k < max_gs as usize {
        ring.write(base + k * 16, DataSeg::terminator().as_bytes());
    }
}

/// Publish receive WQEs to the device: WQE stores before the record, then record word 0 =
/// the low 16 bits of `counter` (RQ producer count or SRQ posted counter). No MMIO.
pub(crate) fn publish_recv(dbrec: &DbRec, counter: u32) {
    barrier::to_device();
    dbrec.word0().store_be32(counter & 0xFFFF);
}

/// State shared between a receive queue and the completion poller.
#[derive(Debug)]
pub(crate) struct RqShared {
    wr_ids: Box<[AtomicU64]>,
    pub tail: AtomicU32,
    mask: u32,
}

impl RqShared {
    /// Tables for a ring of `wqe_cnt` (a power of two) receive WQEs.
    pub(crate) fn new(wqe_cnt: u32) -> Self {
        Self {
            wr_ids: (0..wqe_cnt).map(|_| AtomicU64::new(0)).collect(),
            tail: AtomicU32::new(0),
            mask: wqe_cnt - 1,
        }
    }

    /// Record the wr_id of the receive WQE at `slot`.
    pub(crate) fn record(&self, slot: u32, wr_id: u64) {
        self.wr_ids[(slot & self.mask) as usize].store(wr_id, Ordering::Relaxed);
    }

    /// A receive CQE for RQ WQE counter `counter` arrived: its wr_id; retire it.
    pub(crate) fn complete(&self, counter: u16) -> u64 {
        let id = self.wr_ids[(u32::from(counter) & self.mask) as usize].load(Ordering::Relaxed);
        self.tail.fetch_add(1, Ordering::Release);
        id
    }
}

/// The receive queue of a QP. Posting takes `&mut self`.
#[derive(Debug)]
pub struct RecvQueue {
    ring: WqRing,
    geo: RqGeometry,
    head: u32,
    shared: Arc<RqShared>,
    dbrec: Arc<DbRec>,
    pub(crate) enabled: bool,
}

impl RecvQueue {
    pub(crate) fn new(ring: WqRing, geo: RqGeometry, dbrec: Arc<DbRec>) -> Self {
        let shared = Arc::new(RqShared::new(geo.wqe_cnt));
        Self {
            ring,
            geo,
            head: 0,
            shared,
            dbrec,
            enabled: false,
        }
    }

    pub(crate) fn shared(&self) -> &Arc<RqShared> {
        &self.shared
    }

    /// The geometry.
    pub fn geometry(&self) -> RqGeometry {
        self.geo
    }

    /// WRs posted and not yet completed.
    pub fn outstanding(&self) -> u32 {
        self.head
            .wrapping_sub(self.shared.tail.load(Ordering::Acquire))
    }

    /// Low-level completion: a receive CQE with `wqe_counter` was consumed by the caller's own
    /// poll loop; retires it and returns its `wr_id`.
    #[inline]
    pub fn retire(&mut self, wqe_counter: u16) -> u64 {
        self.shared.complete(wqe_counter)
    }

    pub(crate) fn reset(&mut self) {
        self.head = 0;
        self.shared.tail.store(0, Ordering::Release);
        self.ring.zero();
    }

    /// Post receive work requests; updates the doorbell record once.
    ///
    /// # Errors
    /// The index of the first bad WR and why; WRs before it are posted.
    pub fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> Result<(), (usize, PostError)> {
        let mut res = Ok(());
        let mut n = 0;
        for (i, wr) in wrs.iter().enumerate() {
            if !self.enabled {
                res = Err((
                    i,
                    PostError::BadState {
                        state: crate::QpState::Reset,
                    },
                ));
                break;
            }
            let outstanding = self.outstanding();
            if outstanding >= self.geo.wqe_cnt {
                res = Err((
                    i,
                    PostError::Full {
                        outstanding,
                        capacity: self.geo.wqe_cnt,
                    },
                ));
                break;
            }
            if wr.sg_list.len() > self.geo.max_gs as usize {
                res = Err((
                    i,
                    PostError::TooManySges {
                        n: wr.sg_list.len(),
                        max: self.geo.max_gs,
                    },
                ));
                break;
            }
            let slot = self.head & (self.geo.wqe_cnt - 1);
            let base = (slot * self.geo.stride) as usize;
            write_scatter(&mut self.ring, base, wr.sg_list, self.geo.max_gs);
            self.shared.record(slot, wr.wr_id);
            self.head = self.head.wrapping_add(1);
            n += 1;
        }
        if n > 0 {
            publish_recv(&self.dbrec, self.head);
        }
        res
    }
}
