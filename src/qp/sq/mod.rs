//! The send queue: its state, capacity (credits against the poller's tail), reset and the
//! low-level retire. Split by concern: [`geometry`] sizes the ring, [`builder`] writes WQEs
//! (the typed [`WqeBuilder`] and the segment encoders), [`post`] is the verbs-shaped posting
//! (the fused single-WR path and chains), [`doorbell`] rings the device. The per-WR records the
//! completion poller reads are the ledger's ([`SqShared`], `src/ledger/`).
//!
//! # Ownership rule
//! WQEBBs from `cur_post` on are driver-owned as long as fewer than `max_post` WRs are
//! outstanding (`head - tail < max_post`): every WR is accounted at the worst-case WQE size, and
//! `max_post * wqe_size` fits the ring (docs/datapath.md §2.2). `tail` only moves when the CQ
//! poller sees a CQE, so a full queue is refused ([`PostError::Full`]), never overwritten.
//!
//! # Ordering rule
//! [`SendQueue::ring`] is the one doorbell routine: WQE stores, `to_device`, SQ record (word 1),
//! `wc_start`, one MMIO (8-byte doorbell or BlueFlame copy), `wc_flush`, flip the BlueFlame half.

mod builder;
mod doorbell;
mod geometry;
mod post;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_segments;
mod unchecked;

pub use builder::{AnyPayload, Gather, Inline, NoPayload, PayloadKind, WqeBuilder};
pub(crate) use doorbell::Bfreg;
pub use doorbell::{BfPolicy, BfregInfo};
pub use geometry::{SqGeometry, sq_geometry, sq_overhead};
pub use unchecked::UncheckedBatch;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use mlx5_hw::wqe::{FM_CE_SE_CQ_UPDATE, FM_CE_SE_FENCE, FM_CE_SE_SOLICITED};

use crate::ledger::{SqScatter, SqShared};
use crate::mem::DbRec;
use crate::mem::scatter::MrTable;
use crate::mem::wq::{SqRing, WqRing};
use crate::recorder::QpRecorder;
use crate::ring::RingSize;
use crate::types::{QpState, QpType};
use crate::wr::{PostError, SendFlags};

/// The send queue of a QP. `Send`, not `Sync`; posting takes `&mut self`.
///
/// # Capacity rule
/// A WR is posted only against a credit: `credits` counts the WRs that may still be posted
/// before the poller's `tail` has to be read again, and is 0 whenever the QP state does not
/// allow posting, so the fast path is one test of one counter. Every WR is accounted at the
/// worst-case WQE size (`geo.wqe_size`), and the builder never writes more than that: its
/// checks against `max_gs` and `max_inline` are exactly the room [`sq_geometry`] reserved.
#[derive(Debug)]
pub struct SendQueue {
    ring: SqRing,
    /// Everything else, split from the ring so that a [`WqeBuilder`] can hold the ring's
    /// writer by value next to a borrow of the rest.
    q: SqCore,
}

/// A send queue's state besides its ring.
#[derive(Debug)]
struct SqCore {
    size: RingSize,
    /// Free-running WQEBB producer counter.
    cur_post: u32,
    /// Free-running count of WRs built.
    head: u32,
    /// WRs that may be posted before `tail` is read again (0 outside RTS/SQD/SQE/ERR).
    credits: u32,
    /// The QP state as last set by the QP ([`SendQueue::set_state`]).
    state: QpState,
    /// Bytes 4..8 of every control segment but the `ds` byte: the QP number, big-endian, in
    /// memory order.
    qpn_word: u32,
    shared: Arc<SqShared>,
    cfg: SqConfig,
    dbrec: Arc<DbRec>,
    bf: Bfreg,
    /// Whether a WQE need not be inline to be BlueFlamed ([`BfPolicy::PreferBf`]); the
    /// largest WQE that may be is the doorbell's (`SqDoorbell::set_bf_max`).
    bf_any: bool,
    pend: Pending,
    stats: SqStats,
}

/// WQEs built since the last doorbell, as two counters: none if the producer is where the
/// last ring left it, a single one if the last WQE starts there. The doorbell's other facts
/// (`ds`, the first 8 bytes) are read back from the last WQE's control segment.
#[derive(Debug, Default)]
struct Pending {
    /// The WQEBB producer counter at the last ring.
    rung: u32,
    /// WQEBB counter of the last WQE built.
    last: u32,
    /// Whether the last one is inline (BlueFlame policy).
    inline: bool,
}

/// What a send queue was created with: read-only on the data path.
#[derive(Debug)]
struct SqConfig {
    /// The identity of the QP's device context (a UD destination's address handle must
    /// belong to it: [`Ah::context_id`](crate::Ah)).
    ctx_id: u64,
    qp_type: QpType,
    geo: SqGeometry,
    /// The control segment's `fm_ce_se` byte by [`SendFlags`] bits 0..3, with the flags added
    /// to every WR (SIGNALED for `sq_sig_all`) folded in.
    fm: [u8; 8],
}

/// Counters of what a send queue has done (cheap, always on).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SqStats {
    /// WQEs posted.
    pub wqes: u64,
    /// 8-byte doorbells rung.
    pub doorbells: u64,
    /// BlueFlame copies written.
    pub bf_copies: u64,
}

/// Whether `state` lets a send queue post (RTS, SQD, SQE, ERR).
fn posting_state(state: QpState) -> bool {
    matches!(
        state,
        QpState::Rts | QpState::Sqd | QpState::Sqe | QpState::Err
    )
}

impl SendQueue {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        ring: WqRing,
        qpn: u32,
        qp_type: QpType,
        geo: SqGeometry,
        sig_all: bool,
        report_unsignaled: bool,
        dbrec: Arc<DbRec>,
        bf: Bfreg,
        policy: BfPolicy,
        scatter: Option<(u32, Arc<MrTable>)>,
        ctx_id: u64,
    ) -> Self {
        let mut shared = SqShared::new(geo.max_post, geo.wqe_cnt, report_unsignaled, qpn);
        shared.scatter = scatter.map(|(pd, mrs)| SqScatter::new(ring.reader(), pd, mrs));
        let shared = Arc::new(shared);
        // PANIC: `sq_geometry` makes `wqe_cnt` a power of two no larger than `max_send_wqebb`
        // (at most 2^16 on any device), well inside `RingSize`'s range.
        let size = RingSize::at_least(geo.wqe_cnt).expect("SQ size is a small power of two");
        // PANIC: queue creation lays the SQ out as `wqe_cnt` whole WQEBBs at a 64-byte aligned
        // offset of a page-aligned buffer.
        let ring = SqRing::new(ring).expect("SQ ring of whole, aligned 64-byte blocks");
        let mut sq = Self {
            ring,
            q: SqCore {
                size,
                cur_post: 0,
                head: 0,
                credits: 0,
                state: QpState::Reset,
                qpn_word: u32::from_ne_bytes((qpn << 8).to_be_bytes()),
                shared,
                cfg: SqConfig {
                    ctx_id,
                    qp_type,
                    geo,
                    fm: fm_table(if sig_all {
                        SendFlags::SIGNALED
                    } else {
                        SendFlags::NONE
                    }),
                },
                dbrec,
                bf,
                bf_any: false,
                pend: Pending::default(),
                stats: SqStats::default(),
            },
        };
        sq.set_bf_policy(policy);
        sq
    }

    pub(crate) fn shared(&self) -> &Arc<SqShared> {
        &self.q.shared
    }

    /// The QP moved to `state` (called by the QP after a successful modify): posting is
    /// allowed in RTS, SQD, SQE and ERR; refusals name `state`.
    pub(crate) fn set_state(&mut self, state: QpState) {
        self.q.state = state;
        if let Some(r) = self.q.shared.rec.get() {
            r.set_state(state);
        }
        // INVARIANT: 0 credits outside the posting states; re-counted on the next post.
        self.q.credits = 0;
    }

    /// The geometry (capacity, SGE and inline limits).
    pub fn geometry(&self) -> SqGeometry {
        self.q.cfg.geo
    }

    /// Counters.
    pub fn stats(&self) -> SqStats {
        self.q.stats
    }

    /// WRs posted and not yet retired.
    #[inline]
    pub fn outstanding(&self) -> u32 {
        self.q
            .head
            .wrapping_sub(self.q.shared.tail.load(Ordering::Acquire))
    }

    /// WRs that can still be posted.
    #[inline]
    pub fn free(&self) -> u32 {
        self.q.cfg.geo.max_post.saturating_sub(self.outstanding())
    }

    /// Low-level completion: the requester CQE for the WQE at `wqe_counter` (its `wqe_counter`
    /// field) was consumed by the caller's own poll loop ([`RawCq::next`](crate::RawCq::next)).
    /// Retires that WR and every earlier unsignaled one; returns its `wr_id`. (The verbs-level
    /// [`Cq::poll`](crate::Cq::poll) does this itself; use one or the other per CQ.)
    ///
    /// The counter must name the first WQEBB of a posted, unretired WR: its record's ordinal
    /// is in `[tail, head)`. A slot inside a longer WQE keeps the record of an older WR, which
    /// the ownership rule has retired (its WQEBBs were free again), so it is refused too.
    ///
    /// # Errors
    /// [`PostError::NotOutstanding`] naming the counter otherwise (nothing retired): a lying
    /// counter can neither free ring room the device still owns nor return another WR's id.
    #[inline]
    pub fn retire(&mut self, wqe_counter: u16) -> Result<u64, PostError> {
        let sh = &self.q.shared;
        let ord = sh.ordinal_at(wqe_counter);
        let tail = sh.tail.load(Ordering::Relaxed);
        if ord.wrapping_sub(tail) >= self.q.head.wrapping_sub(tail) {
            return Err(PostError::NotOutstanding { wqe_counter });
        }
        sh.tail.store(ord.wrapping_add(1), Ordering::Release);
        Ok(sh.wr_id_at(wqe_counter))
    }

    /// Copy `out.len()` bytes of the SQ ring starting at the WQE whose first WQEBB has
    /// free-running counter `wqe_counter` (wrapping at the ring end), for diagnostics: decode
    /// with [`mlx5_hw::wqe::WqeView`].
    pub fn wqe_bytes(&self, wqe_counter: u32, out: &mut [u8]) {
        let out_len = out.len().min(self.ring.ring().len());
        self.ring.ring().read(
            self.q.size.slot(wqe_counter) as usize * 64,
            &mut out[..out_len],
        );
    }

    /// The free-running WQEBB producer counter (the next WQE's index).
    pub fn producer(&self) -> u32 {
        self.q.cur_post
    }

    /// Zero both doorbell-record words (QP moved to RESET).
    pub(crate) fn clear_dbrec(&mut self) {
        self.q.dbrec.clear();
    }

    /// Reset all indices (QP moved to RESET).
    pub(crate) fn reset(&mut self) {
        // WR ordinals go on across the reset (the WQEBB counter restarts: the device's SQ does):
        // every WR outstanding now is discarded (tail = head), and no record, pending report
        // or CQE of the old WRs can name an ordinal a new WR takes (docs/datapath.md §4.5).
        self.q.cur_post = 0;
        self.q.credits = 0;
        self.q.shared.tail.store(self.q.head, Ordering::Release);
        self.q.shared.clear_records();
        self.q.pend = Pending::default();
        self.ring.ring_mut().zero();
        if let Some(r) = self.q.shared.rec.get() {
            r.sq_reset(self.q.head);
        }
    }

    /// Start recording this queue's WQEs in `rec` (at most `records`): from now on every post
    /// takes the credit re-count, which records the WQEs finished before it.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::error::Error::InvalidArgument) naming `recorder` if one is
    /// already recording this queue.
    pub(crate) fn attach_recorder(
        &mut self,
        rec: &Arc<QpRecorder>,
        records: usize,
    ) -> crate::error::Result<()> {
        self.q
            .shared
            .rec
            .set(rec.clone())
            .map_err(|_| crate::error::Error::InvalidArgument {
                attr: "recorder",
                reason: "the QP already has a flight recorder",
            })?;
        rec.attach_sq(
            self.ring.ring().reader(),
            self.q.size.len(),
            self.q.cur_post,
            self.q.head,
            self.q.dbrec.clone(),
            records,
        );
        // INVARIANT (recording): credits stay 0 between posts.
        self.q.credits = 0;
        Ok(())
    }

    /// Record every WQE finished so far (for a dump on demand).
    pub(crate) fn record_posted(&self) {
        if let Some(r) = self.q.shared.rec.get() {
            r.sq_posted(self.q.cur_post);
        }
    }
}

impl Drop for SendQueue {
    /// A destroyed queue's outstanding WRs are discarded, as at a reset: a `Cq` holding
    /// unsignaled reports of them drops them (it sees the tail move).
    fn drop(&mut self) {
        self.q.shared.tail.store(self.q.head, Ordering::Release);
    }
}

impl SqCore {
    /// Re-count the credits from the poller's `tail`; `false` if there is none (the reason
    /// is [`no_credit`](Self::no_credit)). Returns a flag, not a `Result`, so the fast path
    /// keeps everything in registers.
    #[inline(never)]
    fn refill(&mut self) -> bool {
        match credits(self.state, self.head, &self.shared, self.cfg.geo.max_post) {
            Ok(n) => {
                self.credits = n;
                if self.shared.rec.get().is_some() {
                    self.record();
                }
                true
            }
            Err(_) => false,
        }
    }

    /// The recording queue's side of [`refill`](Self::refill): record the WQEs finished since
    /// the last post and grant one credit only, so that the next post comes here again.
    #[cold]
    #[inline(never)]
    fn record(&mut self) {
        if let Some(r) = self.shared.rec.get() {
            r.sq_posted(self.cur_post);
            self.credits = 1;
        }
    }

    /// Why [`refill`](Self::refill) found no credit.
    #[cold]
    #[inline(never)]
    fn no_credit(&self) -> PostError {
        match credits(self.state, self.head, &self.shared, self.cfg.geo.max_post) {
            Err(e) => e,
            // The poller retired WRs in between: report the queue as it was (full).
            Ok(_) => PostError::Full {
                outstanding: self.cfg.geo.max_post,
                capacity: self.cfg.geo.max_post,
            },
        }
    }
}

/// The credits a queue at WR count `head` has now, or why it has none.
///
/// # Errors
/// [`PostError::BadState`] naming `state` unless it allows posting; [`PostError::Full`] when
/// `max_post` WRs are outstanding.
#[inline(always)]
fn credits(state: QpState, head: u32, shared: &SqShared, max_post: u32) -> Result<u32, PostError> {
    if !posting_state(state) {
        return Err(PostError::BadState { state });
    }
    let outstanding = head.wrapping_sub(shared.tail.load(Ordering::Acquire));
    if outstanding >= max_post {
        return Err(PostError::Full {
            outstanding,
            capacity: max_post,
        });
    }
    Ok(max_post - outstanding)
}

/// The control segment's `fm_ce_se` byte by [`SendFlags`] bits 0..3 (FENCE 1, SIGNALED 2,
/// SOLICITED 4).
const FM_CE_SE_BY_FLAGS: [u8; 8] = {
    let mut t = [0u8; 8];
    let mut i = 0;
    while i < 8 {
        let f = SendFlags(i as u32);
        if f.contains(SendFlags::SIGNALED) {
            t[i] |= FM_CE_SE_CQ_UPDATE;
        }
        if f.contains(SendFlags::SOLICITED) {
            t[i] |= FM_CE_SE_SOLICITED;
        }
        if f.contains(SendFlags::FENCE) {
            t[i] |= FM_CE_SE_FENCE;
        }
        i += 1;
    }
    t
};

/// [`FM_CE_SE_BY_FLAGS`] with `always` added to every entry.
fn fm_table(always: SendFlags) -> [u8; 8] {
    core::array::from_fn(|i| FM_CE_SE_BY_FLAGS[(i as u32 | always.0) as usize & 7])
}

impl SqConfig {
    /// The control segment's `fm_ce_se` byte for `flags` plus the queue's `sq_sig_all`
    /// (SIGNALED, SOLICITED, FENCE; INLINE is ignored here).
    #[inline(always)]
    fn fm_ce_se(&self, flags: SendFlags) -> u8 {
        self.fm[(flags.0 & 7) as usize]
    }
}
