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
use std::sync::atomic::Ordering;

use crate::ledger::{RqShared, ScatterTarget, publish_recv, write_scatter};
use crate::mem::DbRec;
use crate::mem::scatter::MrTable;
use crate::mem::wq::{WqRing, WqWriter};
use crate::recorder::QpRecorder;
use crate::wr::{PostError, RecvWr, Sge};

/// Geometry of a receive queue (docs/datapath.md §2.3).
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
) -> crate::error::Result<RqGeometry> {
    use crate::error::Error;
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

/// The receive queue of a QP. Posting takes `&mut self`.
#[derive(Debug)]
pub struct RecvQueue {
    ring: WqRing,
    geo: RqGeometry,
    /// log2 of `geo.stride`.
    log_stride: u32,
    /// Free-running count of WQEs written.
    head: u32,
    /// Receives that may still be written without reading the poller's `tail` again (it
    /// only grows behind the poster's back; 0 means "count again"). Nonzero only while
    /// `enabled` (0 after creation and [`reset`](Self::reset)).
    room: u32,
    shared: Arc<RqShared>,
    dbrec: Arc<DbRec>,
    pub(crate) enabled: bool,
}

/// A receive queue's hot state while WQEs are written (a chain, or one low-level push): the
/// counters by value, so that they stay in registers across the chain instead of being
/// re-read after every store into the ring. [`RecvQueue::end_batch`] takes them back.
struct RqBatch<'q> {
    ring: WqWriter<'q>,
    shared: &'q RqShared,
    head: u32,
    room: u32,
    wqe_cnt: u32,
    max_gs: u32,
    log_stride: u32,
}

impl RqBatch<'_> {
    /// Validate one receive (room, SGE count), write its WQE and record `wr_id`.
    #[inline(always)]
    fn push(&mut self, wr_id: u64, sg_list: &[Sge]) -> Result<(), PostError> {
        if self.room == 0 {
            let outstanding = self
                .head
                .wrapping_sub(self.shared.tail.load(Ordering::Acquire));
            if outstanding >= self.wqe_cnt {
                return Err(PostError::Full {
                    outstanding,
                    capacity: self.wqe_cnt,
                });
            }
            self.room = self.wqe_cnt - outstanding;
        }
        if sg_list.len() > self.max_gs as usize {
            return Err(PostError::TooManySges {
                n: sg_list.len(),
                max: self.max_gs,
            });
        }
        let head = self.head;
        // The ring is exactly `wqe_cnt` strides long and takes positions modulo its length.
        write_scatter(
            self.ring,
            (head as usize) << self.log_stride,
            sg_list,
            self.max_gs,
        );
        self.shared.set_wr_id(head, wr_id);
        self.head = head.wrapping_add(1);
        self.room -= 1;
        Ok(())
    }
}

impl RecvQueue {
    /// A receive queue of geometry `geo` in `ring`, its WQEs' lkeys in protection domain
    /// `pd` (for scatter-to-CQE copies, checked against `mrs`).
    pub(crate) fn new(
        ring: WqRing,
        geo: RqGeometry,
        dbrec: Arc<DbRec>,
        pd: u32,
        mrs: Arc<MrTable>,
    ) -> Self {
        debug_assert_eq!(ring.len(), (geo.wqe_cnt * geo.stride) as usize);
        let mut shared = RqShared::new(geo.wqe_cnt);
        shared.scatter = Some(ScatterTarget::new(
            ring.reader(),
            geo.stride,
            0,
            geo.max_gs,
            pd,
            mrs,
        ));
        let shared = Arc::new(shared);
        Self {
            ring,
            geo,
            log_stride: geo.stride.trailing_zeros(),
            head: 0,
            room: 0,
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
    /// poll loop; retires it and returns its `wr_id`. Receives complete in order, so the
    /// counter must name the oldest outstanding receive (modulo the ring).
    ///
    /// # Errors
    /// [`PostError::NotOutstanding`] naming the counter when no receive is outstanding or the
    /// counter names another slot (nothing retired).
    #[inline]
    pub fn retire(&mut self, wqe_counter: u16) -> Result<u64, PostError> {
        let tail = self.shared.tail.load(Ordering::Relaxed);
        if tail == self.head || (u32::from(wqe_counter) ^ tail) & (self.geo.wqe_cnt - 1) != 0 {
            return Err(PostError::NotOutstanding { wqe_counter });
        }
        Ok(self.shared.complete(wqe_counter))
    }

    pub(crate) fn reset(&mut self) {
        self.head = 0;
        self.room = 0;
        self.shared.tail.store(0, Ordering::Release);
        self.ring.zero();
        if let Some(r) = self.shared.rec.get() {
            r.rq_reset();
        }
    }

    /// Start recording this queue's WQEs in `rec` (at most `records`), which the send queue
    /// attached first. Nothing changes on the posting path: a slot is rewritten only after its
    /// WQE completed, and the recording poller records the WQEs the doorbell record
    /// publishes before it records a CQE.
    pub(crate) fn attach_recorder(&mut self, rec: &Arc<QpRecorder>, records: usize) {
        if self.shared.rec.set(rec.clone()).is_err() {
            return;
        }
        rec.attach_rq(
            self.ring.reader(),
            self.geo.stride,
            self.geo.wqe_cnt,
            self.head,
            self.dbrec.clone(),
            records,
        );
    }

    /// Record every WQE written so far (for a dump on demand).
    pub(crate) fn record_posted(&self) {
        if let Some(r) = self.shared.rec.get() {
            r.rq_posted(self.head);
        }
    }

    /// The queue's hot state by value (see [`RqBatch`]).
    #[inline(always)]
    fn batch(&mut self) -> RqBatch<'_> {
        RqBatch {
            ring: self.ring.writer(),
            shared: &self.shared,
            head: self.head,
            room: self.room,
            wqe_cnt: self.geo.wqe_cnt,
            max_gs: self.geo.max_gs,
            log_stride: self.log_stride,
        }
    }

    /// Take back the counters of a batch that ended at `head` with `room` left.
    #[inline(always)]
    fn end_batch(&mut self, head: u32, room: u32) {
        self.head = head;
        self.room = room;
    }

    /// Why nothing may be posted before INIT.
    #[cold]
    fn not_ready() -> PostError {
        PostError::BadState {
            state: crate::types::QpState::Reset,
        }
    }

    /// Low-level post: check the state, room and SGE count, write one receive WQE and record
    /// `wr_id`. The device does not see it until [`publish`](Self::publish); push any number,
    /// then publish once.
    ///
    /// # Errors
    /// [`PostError::BadState`] before INIT, [`PostError::Full`] when the queue holds
    /// `wqe_cnt` receives, [`PostError::TooManySges`] past `max_gs`; nothing is written.
    #[inline]
    pub fn push(&mut self, wr_id: u64, sg_list: &[Sge]) -> Result<(), PostError> {
        if !self.enabled {
            return Err(Self::not_ready());
        }
        let mut b = self.batch();
        let r = b.push(wr_id, sg_list);
        let (head, room) = (b.head, b.room);
        self.end_batch(head, room);
        r
    }

    /// Low-level: make every receive pushed so far visible to the device (write barrier, then
    /// the doorbell record's word 0). No MMIO.
    #[inline]
    pub fn publish(&mut self) {
        publish_recv(&self.dbrec, self.head);
    }

    /// Unchecked tier: write one receive WQE of one data segment and record `wr_id`, without
    /// the checks of [`push`](Self::push); the device sees it after [`publish`](Self::publish).
    ///
    /// # Safety
    /// - The QP is past RESET (INIT, RTR, RTS, ...) and was not reset since the caller counted
    ///   room.
    /// - There is room: fewer than `wqe_cnt` ([`RqGeometry`]) receives are outstanding,
    ///   counting this one ([`outstanding`](Self::outstanding) before a batch, plus the
    ///   receives pushed in it).
    /// - `sge.length` is not 0 (the queue's `max_gs` is at least 1 for every RQ).
    #[inline(always)]
    #[allow(
        unsafe_code,
        reason = "the unchecked tier (DESIGN.md §5): a contract, no raw pointer"
    )]
    pub unsafe fn push_unchecked(&mut self, wr_id: u64, sge: &Sge) {
        let head = self.head;
        let base = (head as usize) << self.log_stride;
        let w = self.ring.writer();
        w.write_segs::<16>(
            base,
            &zerocopy::transmute!(mlx5_hw::wqe::DataSeg::new(sge.length, sge.lkey, sge.addr)),
        );
        if self.geo.max_gs > 1 {
            w.write_segs::<16>(
                base + 16,
                &zerocopy::transmute!(mlx5_hw::wqe::DataSeg::terminator()),
            );
        }
        self.shared.set_wr_id(head, wr_id);
        self.head = head.wrapping_add(1);
        // The safe path re-counts its room from the tail next time.
        self.room = 0;
    }

    /// Unchecked tier: retire the oldest receive (the CQE of `wqe_counter` consumed it);
    /// returns its `wr_id`.
    ///
    /// # Safety
    /// `wqe_counter` is the `wqe_counter` of a successful receive CQE of this queue taken from
    /// its CQ after the QP's last reset, not retired before.
    #[inline(always)]
    #[allow(
        unsafe_code,
        reason = "the unchecked tier (DESIGN.md §5): a contract, no raw pointer"
    )]
    pub unsafe fn retire_unchecked(&mut self, wqe_counter: u16) -> u64 {
        self.shared.complete(wqe_counter)
    }

    /// Post receive work requests; updates the doorbell record once.
    ///
    /// # Errors
    /// The index of the first bad WR and why; WRs before it are posted.
    #[inline]
    pub fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> Result<(), (usize, PostError)> {
        if wrs.is_empty() {
            return Ok(());
        }
        if !self.enabled {
            return Err((0, Self::not_ready()));
        }
        let mut b = self.batch();
        let mut res = Ok(());
        for (i, wr) in wrs.iter().enumerate() {
            if let Err(e) = b.push(wr.wr_id, wr.sg_list) {
                res = Err((i, e));
                break;
            }
        }
        let (head, room) = (b.head, b.room);
        let posted = head != self.head;
        self.end_batch(head, room);
        if posted {
            self.publish();
        }
        res
    }
}
