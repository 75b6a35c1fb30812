//! The send queue: WQE building straight into the SQ ring, the doorbell, and the bookkeeping the
//! completion poller uses to turn a CQE's `wqe_counter` back into work-request ids.
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

use std::sync::Arc;
use std::sync::atomic::Ordering;

use mlx5_hw::opcodes::SendOpcode;
use mlx5_hw::wqe::{
    AtomicSeg, FM_CE_SE_CQ_UPDATE, FM_CE_SE_FENCE, FM_CE_SE_SOLICITED, INLINE_SEG_FLAG, MAX_DS,
    RaddrSeg,
};

use core::marker::PhantomData;

use crate::ledger::{SqScatter, SqShared};
use crate::mem::DbRec;
use crate::mem::scatter::MrTable;
use crate::mem::uar::{SqDoorbell, UarReg};
use crate::mem::wq::{SqRing, WqRing, WqWriter};
use crate::mmio::barrier;
use crate::recorder::QpRecorder;
use crate::ring::RingSize;
use crate::types::{QpState, QpType};
use crate::wr::{PostError, SendFlags, SendWr, Sge, UdDest, WrOp};

/// When the doorbell is a BlueFlame copy of the WQE instead of an 8-byte store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BfPolicy {
    /// As libmlx5 by default (`MLX5_POST_SEND_PREFER_BF` on): BlueFlame for every single-WQE
    /// ring whose WQE fits half the register, when the QP has a BlueFlame register.
    #[default]
    PreferBf,
    /// BlueFlame only for single-WQE rings of inline WQEs (`MLX5_POST_SEND_PREFER_BF=0`).
    InlineOnly,
    /// Always the 8-byte doorbell (`MLX5_SHUT_UP_BF`).
    AlwaysDoorbell,
}

/// The doorbell register a QP rings, and how it may be used.
#[derive(Debug)]
pub struct Bfreg {
    /// The register, its BlueFlame halves (none when shared) and the half to use next.
    db: SqDoorbell,
    /// Whether this QP is the register's only user.
    dedicated: bool,
    /// A stable id of the register within its context (to see which QPs share one).
    id: u32,
}

impl Bfreg {
    /// A register `reg` with BlueFlame halves of `half` bytes (0 for none).
    pub(crate) fn new(reg: UarReg, half: usize, dedicated: bool, id: u32) -> Self {
        // A shared register is never used for BlueFlame: its halves would need a lock.
        let half = if dedicated { half } else { 0 };
        Self {
            db: SqDoorbell::new(reg, half),
            dedicated,
            id,
        }
    }
}

/// Which register a QP rings; QPs with the same `id` share one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BfregInfo {
    /// Register id within the context.
    pub id: u32,
    /// UAR page index.
    pub uar_page: u32,
    /// Whether the QP is the only user (lock-free BlueFlame possible).
    pub dedicated: bool,
    /// BlueFlame half size in bytes (0: 8-byte doorbell only).
    pub bf_size: usize,
}

/// Geometry of a send queue (docs/datapath.md §2.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SqGeometry {
    /// Worst-case WQE size in bytes (a multiple of 64).
    pub wqe_size: u32,
    /// WQEBBs in the ring (power of two).
    pub wqe_cnt: u32,
    /// WRs that may be outstanding (reported back as `max_send_wr`).
    pub max_post: u32,
    /// SGEs per WR.
    pub max_gs: u32,
    /// Inline bytes per WR (reported back as `max_inline_data`).
    pub max_inline: u32,
}

/// Worst-case bytes of the segments before the payload for `qp_type` (ctrl + op segments +
/// transport), over the operations this driver posts (no UMR/LOCAL_INV/BIND_MW, so RC is 48,
/// not libmlx5's 192; see docs/datapath.md §2.1).
pub fn sq_overhead(qp_type: QpType) -> u32 {
    match qp_type {
        QpType::Rc => 16 + 16 + 16, // ctrl + raddr + atomic
        QpType::Uc => 16 + 16,      // ctrl + raddr
        QpType::Ud => 16 + 48,      // ctrl + AV
    }
}

/// Compute the SQ geometry for the requested caps, or the first limit violated.
///
/// `max_sq_desc_sz` and `max_send_wqebb` are the device limits from the ucontext.
///
/// # Errors
/// [`Error::Limit`](crate::Error::Limit) naming `max_send_sge`, `max_inline_data` or
/// `max_send_wr` with the value and the limit for this QP type.
pub fn sq_geometry(
    qp_type: QpType,
    max_send_wr: u32,
    max_send_sge: u32,
    max_inline_data: u32,
    max_sq_desc_sz: u32,
    max_send_wqebb: u32,
) -> crate::Result<SqGeometry> {
    use crate::Error;
    // The WQE index in the control segment and the SQ doorbell record are 16 bits wide.
    let max_send_wqebb = max_send_wqebb.min(1 << 16);
    let ctx = qp_type.limit_context();
    let ov = sq_overhead(qp_type);
    let desc = max_sq_desc_sz.min(MAX_DS * 16) & !63;
    let max_sge = desc.saturating_sub(ov) / 16;
    Error::check_limit("max_send_sge", max_send_sge.into(), max_sge.into(), ctx)?;
    let max_inl = desc.saturating_sub(ov + 4);
    Error::check_limit(
        "max_inline_data",
        max_inline_data.into(),
        max_inl.into(),
        ctx,
    )?;
    let size = ov + 16 * max_send_sge.max(1);
    let inl = if max_inline_data > 0 {
        ov + (4 + max_inline_data).next_multiple_of(16)
    } else {
        0
    };
    let wqe_size = size.max(inl).next_multiple_of(64);
    // Largest number of WRs whose worst-case WQEs fit the largest ring.
    let max_wr = (u64::from(max_send_wqebb) * 64 / u64::from(wqe_size)) as u32;
    Error::check_limit("max_send_wr", max_send_wr.into(), max_wr.into(), ctx)?;
    let bytes = (u64::from(max_send_wr.max(1)) * u64::from(wqe_size)).next_power_of_two();
    let wqe_cnt = (bytes / 64) as u32;
    Error::check_limit("max_send_wr", max_send_wr.into(), max_wr.into(), ctx)?;
    if wqe_cnt > max_send_wqebb {
        return Err(Error::Limit {
            attr: "max_send_wr",
            value: max_send_wr.into(),
            limit: (u64::from(max_send_wqebb) * 64 / u64::from(wqe_size)) / 2,
            context: ctx,
        });
    }
    Ok(SqGeometry {
        wqe_size,
        wqe_cnt,
        max_post: (bytes / u64::from(wqe_size)) as u32,
        max_gs: (wqe_size - ov) / 16,
        max_inline: wqe_size - ov - 4,
    })
}

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

/// The first 8 bytes of a control segment as one native word: `opmod_idx_opcode` (opmod 0)
/// then `qpn_ds`, both big-endian, exactly as [`CtrlSeg`](mlx5_hw::wqe::CtrlSeg) lays them out.
#[inline(always)]
fn ctrl_word0(opcode: SendOpcode, wqe_index: u32, qpn_word: u32, ds: u32) -> u64 {
    // opmod 0 | wqe_index (16 bits) | opcode, big-endian.
    let w = ((wqe_index & 0xFFFF) << 8 | u32::from(opcode.0)).to_be();
    let q = qpn_word | u32::from_ne_bytes([0, 0, 0, ds as u8]);
    u64::from(w) | u64::from(q) << 32
}

/// Bytes 8..16 of a control segment as one native word: signature and stream id 0, `fm_ce_se`,
/// then the immediate bytes as given (network order).
#[inline(always)]
fn ctrl_word1(fm_ce_se: u8, imm: [u8; 4]) -> u64 {
    u64::from_ne_bytes([0, 0, 0, fm_ce_se, imm[0], imm[1], imm[2], imm[3]])
}

/// A data segment as two native words (byte count and lkey, then the address; big-endian).
#[inline(always)]
fn data_seg_words(length: u32, lkey: u32, addr: u64) -> (u64, u64) {
    let a = length.to_be_bytes();
    let b = lkey.to_be_bytes();
    let lo = u64::from_ne_bytes([a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]]);
    (lo, u64::from_ne_bytes(addr.to_be_bytes()))
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

    /// Which register this queue rings.
    pub fn bfreg(&self) -> BfregInfo {
        BfregInfo {
            id: self.q.bf.id,
            uar_page: self.q.bf.db.page().page_id,
            dedicated: self.q.bf.dedicated,
            bf_size: self.q.bf.db.half(),
        }
    }

    /// Change the BlueFlame policy.
    pub fn set_bf_policy(&mut self, policy: BfPolicy) {
        self.q.bf.db.set_bf_max(match policy {
            BfPolicy::AlwaysDoorbell => 0,
            BfPolicy::PreferBf | BfPolicy::InlineOnly => self.q.bf.db.half(),
        });
        self.q.bf_any = policy == BfPolicy::PreferBf;
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
    #[inline]
    pub fn retire(&mut self, wqe_counter: u16) -> u64 {
        let sh = &self.q.shared;
        let ord = sh.ordinal_at(wqe_counter);
        sh.tail.store(ord.wrapping_add(1), Ordering::Release);
        sh.wr_id_at(wqe_counter)
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
        self.q.cur_post = 0;
        self.q.head = 0;
        self.q.credits = 0;
        self.q.shared.tail.store(0, Ordering::Release);
        self.q.shared.clear_records();
        self.q.pend = Pending::default();
        self.ring.ring_mut().zero();
        if let Some(r) = self.q.shared.rec.get() {
            r.sq_reset();
        }
    }

    /// Start recording this queue's WQEs in `rec` (at most `records`): from now on every post
    /// takes the credit re-count, which records the WQEs finished before it.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) naming `recorder` if one is
    /// already recording this queue.
    pub(crate) fn attach_recorder(
        &mut self,
        rec: &Arc<QpRecorder>,
        records: usize,
    ) -> crate::Result<()> {
        self.q
            .shared
            .rec
            .set(rec.clone())
            .map_err(|_| crate::Error::InvalidArgument {
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

    /// Take one credit and open a WQE of `ds` units so far (ctrl plus the segments the caller
    /// writes next) at the producer.
    #[inline(always)]
    fn begin<P>(
        &mut self,
        opcode: SendOpcode,
        flags: SendFlags,
        imm: [u8; 4],
        ds: u32,
    ) -> Result<WqeBuilder<'_, P>, PostError> {
        let q = &mut self.q;
        if q.credits == 0 && !q.refill() {
            return Err(q.no_credit());
        }
        q.credits -= 1;
        Ok(WqeBuilder {
            w: self.ring.ring_mut().writer(),
            start: q.cur_post,
            ds,
            payload: 0,
            opcode,
            fm_ce_se: q.cfg.fm_ce_se(flags),
            imm,
            q,
            _kind: PhantomData,
        })
    }

    /// Ring byte position of the segment `unit` 16-byte units into the WQE at the producer.
    #[inline(always)]
    fn seg_pos(&self, unit: u32) -> usize {
        self.q.cur_post as usize * 64 + unit as usize * 16
    }

    /// Refuse an operation of a connected QP on UD (and vice versa for `connected == false`).
    #[inline(always)]
    fn need_connected(&self, connected: bool, err: PostError) -> Result<(), PostError> {
        if (self.q.cfg.qp_type != QpType::Ud) == connected {
            Ok(())
        } else {
            Err(err)
        }
    }

    /// Start a SEND (low-level API) on an RC or UC QP. Segments follow
    /// ([`WqeBuilder::sge`] or [`WqeBuilder::inline`]); nothing is visible to the device until
    /// [`WqeBuilder::finish`] and then [`ring`](Self::ring).
    ///
    /// `fm_ce_se` flags come from `flags` (SIGNALED, SOLICITED, FENCE; INLINE is ignored here).
    ///
    /// # Errors
    /// [`PostError::BadDestination`] on a UD QP (use [`send_ud`](Self::send_ud));
    /// [`PostError::BadState`] naming the state outside RTS/SQD/SQE/ERR;
    /// [`PostError::Full`] when `max_post` WRs are outstanding.
    #[inline(always)]
    pub fn send(&mut self, flags: SendFlags) -> Result<WqeBuilder<'_, AnyPayload>, PostError> {
        self.need_connected(true, PostError::BadDestination)?;
        self.begin(SendOpcode::SEND, flags, [0; 4], 1)
    }

    /// Start a SEND with immediate data (`imm` in network byte order) on an RC or UC QP.
    ///
    /// # Errors
    /// As [`send`](Self::send).
    #[inline(always)]
    pub fn send_imm(
        &mut self,
        flags: SendFlags,
        imm: [u8; 4],
    ) -> Result<WqeBuilder<'_, AnyPayload>, PostError> {
        self.need_connected(true, PostError::BadDestination)?;
        self.begin(SendOpcode::SEND_IMM, flags, imm, 1)
    }

    /// Start a SEND with invalidate of `rkey` on an RC or UC QP.
    ///
    /// # Errors
    /// [`PostError::BadOpcode`] on UD; otherwise as [`send`](Self::send).
    #[inline(always)]
    pub fn send_inv(
        &mut self,
        flags: SendFlags,
        rkey: u32,
    ) -> Result<WqeBuilder<'_, AnyPayload>, PostError> {
        self.need_connected(true, PostError::BadOpcode)?;
        self.begin(SendOpcode::SEND_INVAL, flags, rkey.to_be_bytes(), 1)
    }

    /// Start a UD SEND to `dest` (its address vector, QPN and Q_Key are written right after the
    /// control segment), with immediate data if `imm` is `Some`.
    ///
    /// # Errors
    /// [`PostError::BadDestination`] on a connected QP; [`PostError::ForeignAh`] if `dest.ah`
    /// belongs to another device context; otherwise as [`send`](Self::send).
    #[inline(always)]
    pub fn send_ud(
        &mut self,
        flags: SendFlags,
        dest: &UdDest<'_>,
        imm: Option<[u8; 4]>,
    ) -> Result<WqeBuilder<'_, AnyPayload>, PostError> {
        self.need_connected(false, PostError::BadDestination)?;
        if dest.ah.context_id() != self.q.cfg.ctx_id {
            return Err(PostError::ForeignAh);
        }
        let (op, imm) = match imm {
            Some(imm) => (SendOpcode::SEND_IMM, imm),
            None => (SendOpcode::SEND, [0; 4]),
        };
        let pos = self.seg_pos(1);
        let b = self.begin(op, flags, imm, 4)?;
        b.w.write_segs(pos, &av_bytes(dest));
        Ok(b)
    }

    /// Start an RDMA WRITE to `raddr`/`rkey` (RC, UC), with immediate data if `imm` is `Some`;
    /// the remote-address segment is written here.
    ///
    /// # Errors
    /// [`PostError::BadOpcode`] on UD; otherwise as [`send`](Self::send).
    #[inline(always)]
    pub fn write(
        &mut self,
        flags: SendFlags,
        raddr: u64,
        rkey: u32,
        imm: Option<[u8; 4]>,
    ) -> Result<WqeBuilder<'_, AnyPayload>, PostError> {
        self.need_connected(true, PostError::BadOpcode)?;
        let (op, imm) = match imm {
            Some(imm) => (SendOpcode::RDMA_WRITE_IMM, imm),
            None => (SendOpcode::RDMA_WRITE, [0; 4]),
        };
        let pos = self.seg_pos(1);
        let b = self.begin(op, flags, imm, 2)?;
        b.w.write_segs::<16>(pos, &zerocopy::transmute!(RaddrSeg::new(raddr, rkey)));
        Ok(b)
    }

    /// Start an RDMA READ from `raddr`/`rkey` into the data segments that follow (RC only; no
    /// inline payload).
    ///
    /// # Errors
    /// [`PostError::BadOpcode`] on UC or UD; otherwise as [`send`](Self::send).
    #[inline(always)]
    pub fn read(
        &mut self,
        flags: SendFlags,
        raddr: u64,
        rkey: u32,
    ) -> Result<WqeBuilder<'_, Gather>, PostError> {
        if self.q.cfg.qp_type != QpType::Rc {
            return Err(PostError::BadOpcode);
        }
        let pos = self.seg_pos(1);
        let b = self.begin(SendOpcode::RDMA_READ, flags, [0; 4], 2)?;
        b.w.write_segs::<16>(pos, &zerocopy::transmute!(RaddrSeg::new(raddr, rkey)));
        Ok(b)
    }

    /// Start an 8-byte atomic on `raddr`/`rkey` (RC only): compare-and-swap when `compare` is
    /// `Some`, else fetch-and-add of `swap_add`. The original value lands in the first 8 bytes
    /// of `result`. All segments are written here; only [`WqeBuilder::finish`] remains.
    ///
    /// # Errors
    /// [`PostError::BadOpcode`] on UC or UD; [`PostError::BadAtomicSge`] if `result` is shorter
    /// than 8 bytes; otherwise as [`send`](Self::send).
    #[inline(always)]
    pub fn atomic(
        &mut self,
        flags: SendFlags,
        raddr: u64,
        rkey: u32,
        swap_add: u64,
        compare: Option<u64>,
        result: &Sge,
    ) -> Result<WqeBuilder<'_, NoPayload>, PostError> {
        if self.q.cfg.qp_type != QpType::Rc {
            return Err(PostError::BadOpcode);
        }
        if result.length < 8 {
            return Err(PostError::BadAtomicSge);
        }
        let (op, compare) = match compare {
            Some(c) => (SendOpcode::ATOMIC_CS, c),
            None => (SendOpcode::ATOMIC_FA, 0),
        };
        let pos = self.seg_pos(1);
        let b = self.begin(op, flags, [0; 4], 4)?;
        let w = b.w;
        w.write_segs::<16>(pos, &zerocopy::transmute!(RaddrSeg::new(raddr, rkey)));
        w.write_segs::<16>(
            pos + 16,
            &zerocopy::transmute!(AtomicSeg::new(swap_add, compare)),
        );
        let (lo, hi) = data_seg_words(8, result.lkey, result.addr);
        w.store16(pos + 32, lo, hi);
        Ok(b)
    }

    /// Ring the doorbell for every WQE finished since the last ring (one doorbell per batch).
    /// Does nothing if there is none.
    #[inline(always)]
    pub fn ring(&mut self) {
        let p = &self.q.pend;
        if self.q.cur_post == p.rung {
            return;
        }
        // The last WQE's first 8 bytes (the 8-byte doorbell) and its `ds` (their byte 7).
        let head = self.ring.word0(p.last as usize * 64);
        let ds = u32::from(head.to_ne_bytes()[7] & 0x3F);
        let pos = p.last as usize * 64;
        // BlueFlame only for a single WQE of more than the control segment, inline unless
        // `PreferBf`; whether it fits the policy's limit (and the half) is the doorbell's check.
        let try_bf = p.last == p.rung && ds > 1 && (self.q.bf_any | p.inline);
        self.q.pend.rung = self.q.cur_post;

        // 1. WQE bytes before the doorbell record.
        barrier::to_device();
        // 2. SQ record (word 1) = next free WQEBB counter, low 16 bits.
        self.q.dbrec.word1().store_be32(self.q.cur_post & 0xFFFF);
        // 3. Record before the write-combining MMIO store.
        barrier::wc_start();
        // 4a. BlueFlame: the WQE in ascending 64-byte blocks, the source wrapping at the end.
        if try_bf && self.q.bf.db.blueflame(&self.ring, pos, ds) {
            self.q.stats.bf_copies += 1;
        } else {
            // 4b. The first 8 bytes of the last ctrl segment, verbatim.
            self.q.bf.db.ring8(head);
            self.q.stats.doorbells += 1;
        }
        // 5. Flush the write-combining buffer before anyone rings again.
        barrier::wc_flush();
        // 6. Alternate BlueFlame halves (no-op for doorbell-only registers).
        self.q.bf.db.flip();
    }

    /// Post one inline SEND of `data` on an RC or UC QP and ring at once: the same WQE and
    /// doorbell as `send(flags)?.inline(data)?.finish(wr_id)` then [`ring`](Self::ring), in one
    /// call. The usual case (a credit in hand, 1 to 64 bytes, a WQE that does not reach the
    /// ring end) keeps no state between the steps and reads nothing back from the ring.
    ///
    /// # Errors
    /// As [`send`](Self::send) and [`WqeBuilder::inline`]; nothing is posted then.
    #[inline(always)]
    pub fn send_inline_now(
        &mut self,
        flags: SendFlags,
        data: &[u8],
        wr_id: u64,
    ) -> Result<(), PostError> {
        if self.fast_send(SendOpcode::SEND, [0; 4], flags, Fast::Inline(data), wr_id) {
            return Ok(());
        }
        self.send_inline_general(flags, data, wr_id)
    }

    /// [`send_inline_now`](Self::send_inline_now) through the builder: every case the fused
    /// path does not take, and every refusal.
    #[inline(never)]
    fn send_inline_general(
        &mut self,
        flags: SendFlags,
        data: &[u8],
        wr_id: u64,
    ) -> Result<(), PostError> {
        self.send(flags)?.inline(data)?.finish(wr_id);
        self.ring();
        Ok(())
    }

    /// The fused single-WQE SEND (`op` is SEND or SEND with immediate `imm`) on a connected
    /// QP: WQE, WR record and doorbell in one pass with no call on any branch, for a queue in
    /// a posting state with a credit in hand and a payload of one non-empty inline buffer of
    /// at most 64 bytes (and `max_inline_data`) that does not reach the ring end, or one
    /// non-empty SGE. Returns `false` with nothing posted otherwise (stores into the WQE's own
    /// driver-owned space may have happened); the caller then takes the builder, which
    /// produces the same WQE and reports every refusal.
    ///
    /// The bytes are the builder's: the same encoders ([`inline_hdr`], [`data_seg_words`],
    /// [`commit`]) in the same order, and the doorbell of [`ring`](Self::ring) for a WQE
    /// rung at once (BlueFlame only if no earlier WQE is waiting for a doorbell).
    #[inline(always)]
    fn fast_send(
        &mut self,
        op: SendOpcode,
        imm: [u8; 4],
        flags: SendFlags,
        p: Fast<'_>,
        wr_id: u64,
    ) -> bool {
        let q = &mut self.q;
        // INVARIANT (capacity rule): a credit means the slots from the producer on are ours;
        // `credits` is 0 outside the posting states.
        if q.cfg.qp_type == QpType::Ud || q.credits == 0 {
            return false;
        }
        let start = q.cur_post;
        let pos = start as usize * 64;
        let w = self.ring.ring_mut().writer();
        let (ds, inline) = match p {
            Fast::Inline(data) => {
                let len = data.len();
                // `len <= max_inline`: inside the worst-case WQE `sq_geometry` reserved.
                if len == 0 || len > q.cfg.geo.max_inline as usize || !w.write_short(pos + 20, data)
                {
                    return false;
                }
                w.write4(pos + 16, inline_hdr(len as u32));
                // `len <= 64`: no overflow.
                (1 + ((len as u32 + 4 + 15) >> 4), true)
            }
            Fast::Sge(sge) => {
                // Zero-length SGEs are skipped by the builder (0 would mean 2 GiB).
                if sge.length == 0 || q.cfg.geo.max_gs == 0 {
                    return false;
                }
                let (lo, hi) = data_seg_words(sge.length, sge.lkey, sge.addr);
                w.store16(pos + 16, lo, hi);
                (2, false)
            }
        };
        q.credits -= 1;
        let fm = q.cfg.fm_ce_se(flags);
        let w0 = commit(
            w, &q.shared, q.qpn_word, start, q.head, ds, op, fm, imm, wr_id,
        );
        q.head = q.head.wrapping_add(1);
        let next = start.wrapping_add((ds + 3) >> 2);
        q.cur_post = next;
        q.stats.wqes += 1;
        // The doorbell, as `ring` (its steps 1..6) with what it would read back known here.
        let single = q.pend.rung == start;
        q.pend.rung = next;
        barrier::to_device();
        q.dbrec.word1().store_be32(next & 0xFFFF);
        barrier::wc_start();
        // The WQE does not reach the ring end (checked above), so the copy never wraps.
        if single && (q.bf_any | inline) && q.bf.db.blueflame_contig(&self.ring, pos, ds) {
            q.stats.bf_copies += 1;
        } else {
            q.bf.db.ring8(w0);
            q.stats.doorbells += 1;
        }
        barrier::wc_flush();
        q.bf.db.flip();
        true
    }

    /// Post a chain of verbs-shaped work requests and ring once.
    ///
    /// # Errors
    /// On the first bad WR: its index and the reason. WRs before it are posted and rung
    /// (as `ibv_post_send`'s `bad_wr`).
    #[inline(always)]
    pub fn post_send(&mut self, wrs: &[SendWr<'_>]) -> Result<(), (usize, PostError)> {
        if let [wr] = wrs
            && self.post_fast(wr)
        {
            return Ok(());
        }
        self.post_send_general(wrs)
    }

    /// A single verbs-shaped SEND or SEND with immediate on a connected QP whose payload is
    /// one inline buffer or one SGE: the fused path ([`fast_send`](Self::fast_send)) if it
    /// applies; `false` (nothing done) otherwise.
    #[inline(always)]
    fn post_fast(&mut self, wr: &SendWr<'_>) -> bool {
        let (op, imm) = match wr.op {
            WrOp::Send => (SendOpcode::SEND, [0; 4]),
            WrOp::SendImm { imm } => (SendOpcode::SEND_IMM, imm),
            _ => return false,
        };
        if wr.ud.is_some() {
            return false;
        }
        // One call per payload kind, so each inlined copy is specialised to its kind.
        match (wr.inline, wr.sg_list) {
            ([one], _) => self.fast_send(op, imm, wr.flags, Fast::Inline(one), wr.wr_id),
            ([], [sge]) => self.fast_send(op, imm, wr.flags, Fast::Sge(sge), wr.wr_id),
            _ => false,
        }
    }

    /// [`post_send`](Self::post_send) of everything the fused path does not take: chains, and
    /// single WRs that are not a plain one-buffer SEND (or have no credit in hand, or reach the
    /// ring end); also every refusal is reported from here.
    #[inline(never)]
    fn post_send_general(&mut self, wrs: &[SendWr<'_>]) -> Result<(), (usize, PostError)> {
        if let [wr] = wrs {
            // The usual single SEND on a connected QP: the low-level builder, rung at once.
            if let Some(r) = self.post_one(wr) {
                return r.map_err(|e| (0, e));
            }
        }
        let mut b = self.batch();
        let mut res = Ok(());
        for (i, wr) in wrs.iter().enumerate() {
            if let Err(e) = b.build(wr) {
                res = Err((i, e));
                break;
            }
        }
        let e = b.end();
        self.end_batch(e);
        self.ring();
        res
    }

    /// One verbs-shaped SEND or SEND with immediate on a connected QP through the low-level
    /// builder, rung at once; `None` (nothing done) for every other WR, which the general
    /// chain path takes. The checks come in the same order as there: destination, gather
    /// list, then state and room, then the payload.
    #[inline(always)]
    fn post_one(&mut self, wr: &SendWr<'_>) -> Option<Result<(), PostError>> {
        let (op, imm) = match wr.op {
            WrOp::Send => (SendOpcode::SEND, [0; 4]),
            WrOp::SendImm { imm } => (SendOpcode::SEND_IMM, imm),
            _ => return None,
        };
        if self.q.cfg.qp_type == QpType::Ud || wr.ud.is_some() {
            return None;
        }
        Some(self.post_one_send(wr, op, imm))
    }

    /// [`post_one`](Self::post_one) once the WR is known to be a connected SEND.
    #[inline(always)]
    fn post_one_send(
        &mut self,
        wr: &SendWr<'_>,
        op: SendOpcode,
        imm: [u8; 4],
    ) -> Result<(), PostError> {
        let max_gs = self.q.cfg.geo.max_gs;
        let inline = !wr.inline.is_empty();
        if !inline && wr.sg_list.len() > max_gs as usize {
            return Err(PostError::TooManySges {
                n: wr.sg_list.len(),
                max: max_gs,
            });
        }
        let b = self.begin::<AnyPayload>(op, wr.flags, imm, 1)?;
        if inline {
            let max = b.q.cfg.geo.max_inline;
            let mut b = b.into_kind::<Inline>();
            for part in wr.inline {
                if b.push_inline(part).is_err() {
                    // The total of every part, as the chain path reports it.
                    let len = wr.inline.iter().map(|s| s.len()).sum();
                    return Err(PostError::InlineTooLarge { len, max });
                }
            }
            b.finish(wr.wr_id);
        } else {
            let mut b = b.into_kind::<Gather>();
            for sge in wr.sg_list {
                // Counted above: never more than `max_gs`.
                b.push_sge(sge)?;
            }
            b.finish(wr.wr_id);
        }
        self.ring();
        Ok(())
    }

    /// The queue's hot state by value, for building WQEs (see [`Batch`]); hand it back with
    /// [`end_batch`](Self::end_batch).
    #[inline(always)]
    fn batch(&mut self) -> Batch<'_> {
        Batch {
            ring: self.ring.ring_mut().writer(),
            shared: &self.q.shared,
            cfg: &self.q.cfg,
            state: self.q.state,
            qpn_word: self.q.qpn_word,
            credits: self.q.credits,
            cur_post: self.q.cur_post,
            head: self.q.head,
            last: 0,
            last_inline: false,
        }
    }

    /// Take back what a [`Batch`] built (its counters and the last WQE for the doorbell).
    #[inline(always)]
    fn end_batch(&mut self, e: BatchEnd) {
        let built = e.head.wrapping_sub(self.q.head);
        self.q.cur_post = e.cur_post;
        self.q.head = e.head;
        self.q.credits = e.credits;
        if built != 0 {
            self.q.pend.last = e.last;
            self.q.pend.inline = e.last_inline;
            self.q.stats.wqes += u64::from(built);
        }
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

/// The UD address vector of `dest` with its destination QPN and Q_Key.
#[inline(always)]
fn av_bytes(dest: &UdDest<'_>) -> [u8; 48] {
    let mut av = *dest.ah.av();
    av.set_dqpn(dest.remote_qpn);
    av.set_qkey(dest.remote_qkey);
    zerocopy::transmute!(av)
}

/// Write the control segment of the WQE of `ds` units starting at WQEBB counter `start` and
/// record `wr_id`; returns the control segment's first 8 bytes (the 8-byte doorbell). Shared by
/// both APIs and the fused paths.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn commit(
    ring: WqWriter<'_>,
    shared: &SqShared,
    qpn_word: u32,
    start: u32,
    ordinal: u32,
    ds: u32,
    opcode: SendOpcode,
    fm_ce_se: u8,
    imm: [u8; 4],
    wr_id: u64,
) -> u64 {
    let w0 = ctrl_word0(opcode, start, qpn_word, ds);
    ring.store16(start as usize * 64, w0, ctrl_word1(fm_ce_se, imm));
    shared.record(ordinal, start, wr_id, opcode);
    w0
}

/// A send queue's hot state while a verbs `post_send` chain is built: the counters by value,
/// so that the compiler keeps them in registers across the chain instead of re-reading the
/// queue's fields after every store into the ring, and the read-only configuration by
/// reference. [`SendQueue::end_batch`] takes the counters back.
struct Batch<'q> {
    ring: WqWriter<'q>,
    shared: &'q SqShared,
    cfg: &'q SqConfig,
    state: QpState,
    qpn_word: u32,
    credits: u32,
    cur_post: u32,
    head: u32,
    /// WQEBB counter of the last WQE built, and whether it is inline (for the doorbell).
    last: u32,
    last_inline: bool,
}

/// The counters at the end of a [`Batch`].
struct BatchEnd {
    cur_post: u32,
    head: u32,
    credits: u32,
    last: u32,
    last_inline: bool,
}

/// The payload of a WQE the fused path ([`SendQueue::fast_send`]) builds.
#[derive(Clone, Copy)]
enum Fast<'a> {
    /// One inline buffer.
    Inline(&'a [u8]),
    /// One data segment.
    Sge(&'a Sge),
}

/// What a verbs-shaped WR's WQE carries besides its segments.
#[derive(Clone, Copy)]
struct Plan {
    opcode: SendOpcode,
    imm: [u8; 4],
    /// The payload is `wr.inline` (not the gather list).
    inline: bool,
}

impl Batch<'_> {
    #[inline(always)]
    fn end(self) -> BatchEnd {
        BatchEnd {
            cur_post: self.cur_post,
            head: self.head,
            credits: self.credits,
            last: self.last,
            last_inline: self.last_inline,
        }
    }

    /// Take one credit, re-counting them from the poller's tail only when they are used up.
    #[inline(always)]
    fn reserve(&mut self) -> Result<(), PostError> {
        if self.credits == 0 {
            self.credits = credits(self.state, self.head, self.shared, self.cfg.geo.max_post)?;
            if let Some(r) = self.shared.rec.get() {
                // A recording queue: one credit at a time, each post records the last.
                r.sq_posted(self.cur_post);
                self.credits = 1;
            }
        }
        Ok(())
    }

    /// Finish the WQE of `ds` units that starts at the producer counter (every other segment
    /// is written): write its control segment, record `wr_id`, advance the producer and note
    /// the WQE for the doorbell.
    #[inline(always)]
    fn commit(&mut self, ds: u32, plan: Plan, fm_ce_se: u8, wr_id: u64) {
        let start = self.cur_post;
        commit(
            self.ring,
            self.shared,
            self.qpn_word,
            start,
            self.head,
            ds,
            plan.opcode,
            fm_ce_se,
            plan.imm,
            wr_id,
        );
        self.head = self.head.wrapping_add(1);
        self.cur_post = start.wrapping_add((ds + 3) >> 2);
        self.credits -= 1;
        self.last = start;
        self.last_inline = plan.inline;
    }

    /// Validate one verbs-shaped WR and build its WQE. The checks come in the order of the
    /// low-level calls: operation, destination, gather list, then state and room, then the
    /// payload (whose errors leave at most stores in the WQE's own uncommitted space).
    #[inline(always)]
    fn build(&mut self, wr: &SendWr<'_>) -> Result<(), PostError> {
        let cfg = self.cfg;
        // The usual traffic, SEND and SEND with immediate on a connected QP, stays in line and
        // needs no more checks than these; everything else takes the general path.
        let imm = match wr.op {
            WrOp::Send => [0; 4],
            WrOp::SendImm { imm } => imm,
            _ => return self.build_general(wr),
        };
        if cfg.qp_type == QpType::Ud {
            return self.build_general(wr);
        }
        if wr.ud.is_some() {
            return Err(PostError::BadDestination);
        }
        let opcode = if wr.op == WrOp::Send {
            SendOpcode::SEND
        } else {
            SendOpcode::SEND_IMM
        };
        if let ([], [sge]) = (wr.inline, wr.sg_list)
            && sge.length != 0
            && cfg.geo.max_gs != 0
        {
            // The usual single non-empty SGE: one data segment, no loop.
            self.reserve()?;
            let start = self.cur_post as usize * 64;
            let (lo, hi) = data_seg_words(sge.length, sge.lkey, sge.addr);
            self.ring.store16(start + 16, lo, hi);
            let plan = Plan {
                opcode,
                imm,
                inline: false,
            };
            self.commit(2, plan, cfg.fm_ce_se(wr.flags), wr.wr_id);
            return Ok(());
        }
        let inline = !wr.inline.is_empty();
        if !inline && wr.sg_list.len() > cfg.geo.max_gs as usize {
            return Err(PostError::TooManySges {
                n: wr.sg_list.len(),
                max: cfg.geo.max_gs,
            });
        }
        self.reserve()?;
        let start = self.cur_post as usize * 64;
        let end = write_payload(self.ring, cfg, start + 16, wr, inline)?;
        let plan = Plan {
            opcode,
            imm,
            inline,
        };
        self.commit(
            ((end - start) / 16) as u32,
            plan,
            cfg.fm_ce_se(wr.flags),
            wr.wr_id,
        );
        Ok(())
    }

    /// [`build`](Self::build) for every other WR: RDMA, atomics, UD, bad requests.
    #[inline(always)]
    fn build_general(&mut self, wr: &SendWr<'_>) -> Result<(), PostError> {
        let plan = plan_general(self.cfg, wr)?;
        self.reserve()?;
        let start = self.cur_post as usize * 64;
        let end = write_general(self.ring, self.cfg, start, wr, plan)?;
        let fm = self.cfg.fm_ce_se(wr.flags);
        self.commit(((end - start) / 16) as u32, plan, fm, wr.wr_id);
        Ok(())
    }
}

/// The checks of a general-path WR before state and room: operation for the QP type,
/// destination, gather list.
#[inline(never)]
fn plan_general(cfg: &SqConfig, wr: &SendWr<'_>) -> Result<Plan, PostError> {
    let qp_type = cfg.qp_type;
    let (opcode, imm) = match (wr.op, qp_type) {
        (WrOp::Send, _) => (SendOpcode::SEND, [0; 4]),
        (WrOp::SendImm { imm }, _) => (SendOpcode::SEND_IMM, imm),
        (WrOp::SendInv { rkey }, QpType::Rc | QpType::Uc) => {
            (SendOpcode::SEND_INVAL, rkey.to_be_bytes())
        }
        (WrOp::Write { .. }, QpType::Rc | QpType::Uc) => (SendOpcode::RDMA_WRITE, [0; 4]),
        (WrOp::WriteImm { imm, .. }, QpType::Rc | QpType::Uc) => (SendOpcode::RDMA_WRITE_IMM, imm),
        (WrOp::Read { .. }, QpType::Rc) => (SendOpcode::RDMA_READ, [0; 4]),
        (WrOp::CompareSwap { .. }, QpType::Rc) => (SendOpcode::ATOMIC_CS, [0; 4]),
        (WrOp::FetchAdd { .. }, QpType::Rc) => (SendOpcode::ATOMIC_FA, [0; 4]),
        _ => return Err(PostError::BadOpcode),
    };
    if (qp_type == QpType::Ud) != wr.ud.is_some() {
        return Err(PostError::BadDestination);
    }
    if wr.ud.is_some_and(|ud| ud.ah.context_id() != cfg.ctx_id) {
        return Err(PostError::ForeignAh);
    }
    let has_inline = !wr.inline.is_empty();
    if opcode == SendOpcode::RDMA_READ && has_inline {
        // READ data flows into local memory: there is nothing to inline.
        return Err(PostError::BadOpcode);
    }
    if wr.sg_list.len() > cfg.geo.max_gs as usize && !has_inline {
        return Err(PostError::TooManySges {
            n: wr.sg_list.len(),
            max: cfg.geo.max_gs,
        });
    }
    let atomic = matches!(wr.op, WrOp::CompareSwap { .. } | WrOp::FetchAdd { .. });
    Ok(Plan {
        opcode,
        imm,
        // An atomic carries its one 8-byte SGE and ignores any inline payload.
        inline: has_inline && !atomic,
    })
}

/// The segments of a general-path WR after its control segment (which starts at ring byte
/// position `start`); returns the position after the last one. An error may leave stores in
/// the WQE's own (driver-owned, uncommitted) space, never beyond it.
#[inline(never)]
fn write_general(
    ring: WqWriter<'_>,
    cfg: &SqConfig,
    start: usize,
    wr: &SendWr<'_>,
    plan: Plan,
) -> Result<usize, PostError> {
    let (raddr, atomic) = match wr.op {
        WrOp::Write { raddr, rkey }
        | WrOp::WriteImm { raddr, rkey, .. }
        | WrOp::Read { raddr, rkey } => (Some((raddr, rkey)), None),
        WrOp::CompareSwap {
            raddr,
            rkey,
            compare,
            swap,
        } => (Some((raddr, rkey)), Some((swap, compare))),
        WrOp::FetchAdd { raddr, rkey, add } => (Some((raddr, rkey)), Some((add, 0))),
        _ => (None, None),
    };
    let atomic_sge = match atomic {
        Some(_) => match wr.sg_list.first() {
            Some(sge) if sge.length >= 8 => Some(data_seg_words(8, sge.lkey, sge.addr)),
            _ => return Err(PostError::BadAtomicSge),
        },
        None => None,
    };
    let mut pos = start + 16;
    if let Some(ud) = wr.ud {
        ring.write_segs(pos, &av_bytes(&ud));
        pos += 48;
    }
    if let Some((raddr, rkey)) = raddr {
        ring.write_segs::<16>(pos, &zerocopy::transmute!(RaddrSeg::new(raddr, rkey)));
        pos += 16;
    }
    if let Some((swap_add, compare)) = atomic {
        let seg = AtomicSeg::new(swap_add, compare);
        ring.write_segs::<16>(pos, &zerocopy::transmute!(seg));
        pos += 16;
    }
    if let Some((lo, hi)) = atomic_sge {
        ring.store16(pos, lo, hi);
        Ok(pos + 16)
    } else {
        write_payload(ring, cfg, pos, wr, plan.inline)
    }
}

/// The inline segment of `wr` at ring byte position `pos` (see [`write_payload`]); the usual
/// single buffer is one bounds check and one copy.
#[inline(always)]
fn write_inline(
    ring: WqWriter<'_>,
    cfg: &SqConfig,
    pos: usize,
    wr: &SendWr<'_>,
) -> Result<usize, PostError> {
    let max = cfg.geo.max_inline as usize;
    let len = if let [one] = wr.inline {
        // The usual single buffer.
        if one.len() > max {
            return Err(inline_too_large(cfg, wr));
        }
        ring.write(pos + 4, one);
        one.len()
    } else {
        let mut len = 0usize;
        for s in wr.inline {
            // Checked before each copy, so nothing lands past the worst-case WQE.
            if len + s.len() > max {
                return Err(inline_too_large(cfg, wr));
            }
            ring.write(pos + 4 + len, s);
            len += s.len();
        }
        len
    };
    // A zero total length produces no segment at all (docs/datapath.md §1.8).
    if len == 0 {
        return Ok(pos);
    }
    ring.write4(pos, inline_hdr(len as u32));
    Ok(pos + (4 + len).next_multiple_of(16))
}

/// [`PostError::InlineTooLarge`] with the total inline bytes of `wr`.
#[cold]
fn inline_too_large(cfg: &SqConfig, wr: &SendWr<'_>) -> PostError {
    PostError::InlineTooLarge {
        len: wr.inline.iter().map(|s| s.len()).sum(),
        max: cfg.geo.max_inline,
    }
}

/// Write the payload of `wr` at ring byte position `pos`: one inline segment of `wr.inline`
/// (checked against `max_inline_data` part by part, before each copy) if `inline`, else a data
/// segment per non-empty SGE. Returns the position after it. `sq_geometry` sized the
/// worst-case WQE (overhead plus `max_gs` data segments or `max_inline` bytes, at most `MAX_DS`
/// units) and the caller checked the SGE count, so no per-segment check is needed.
#[inline(always)]
fn write_payload(
    ring: WqWriter<'_>,
    cfg: &SqConfig,
    mut pos: usize,
    wr: &SendWr<'_>,
    inline: bool,
) -> Result<usize, PostError> {
    if inline {
        pos = write_inline(ring, cfg, pos, wr)?;
    } else {
        for sge in wr.sg_list {
            // Zero-length SGEs are skipped (a byte count of 0 would mean 2 GiB).
            if sge.length != 0 {
                let (lo, hi) = data_seg_words(sge.length, sge.lkey, sge.addr);
                ring.store16(pos, lo, hi);
                pos += 16;
            }
        }
    }
    Ok(pos)
}

/// The inline segment header for `len` bytes (big-endian `INLINE_SEG_FLAG | len`).
#[inline(always)]
fn inline_hdr(len: u32) -> [u8; 4] {
    (INLINE_SEG_FLAG | len).to_be_bytes()
}

mod sealed {
    /// Seals [`PayloadKind`](super::PayloadKind): only this module's typestates implement it.
    #[expect(
        unnameable_types,
        reason = "a sealed trait is deliberately unnameable outside its module"
    )]
    pub trait Sealed {}
}

/// What a [`WqeBuilder`] may append next (a sealed typestate: [`AnyPayload`], [`Gather`],
/// [`Inline`], [`NoPayload`]).
pub trait PayloadKind: sealed::Sealed {
    /// Whether the payload is inline (for the BlueFlame policy).
    const INLINE: bool;
}

/// A fresh WQE of SEND or WRITE: takes data segments or inline bytes (not both).
#[derive(Debug)]
pub enum AnyPayload {}
/// A WQE whose payload is data segments (after [`WqeBuilder::sge`], or an RDMA READ).
#[derive(Debug)]
pub enum Gather {}
/// A WQE whose payload is inline bytes (after [`WqeBuilder::inline`]).
#[derive(Debug)]
pub enum Inline {}
/// A WQE with all its segments written (atomics): only [`WqeBuilder::finish`] remains.
#[derive(Debug)]
pub enum NoPayload {}

impl sealed::Sealed for AnyPayload {}
impl sealed::Sealed for Gather {}
impl sealed::Sealed for Inline {}
impl sealed::Sealed for NoPayload {}
impl PayloadKind for AnyPayload {
    const INLINE: bool = false;
}
impl PayloadKind for Gather {
    const INLINE: bool = false;
}
impl PayloadKind for Inline {
    const INLINE: bool = true;
}
impl PayloadKind for NoPayload {
    const INLINE: bool = false;
}

/// A WQE being built in the SQ ring (low-level API), opened by one of the queue's operation
/// starts ([`SendQueue::send`], [`write`](SendQueue::write), [`read`](SendQueue::read),
/// [`atomic`](SendQueue::atomic), [`send_ud`](SendQueue::send_ud), ...), which write the
/// control-adjacent segments the operation needs; the payload follows, and
/// [`finish`](Self::finish) writes the control segment and records the WR id.
///
/// The type says what may come next (`P`): an operation gets only the segments it may have,
/// in the order the device reads them, and each append is checked against the queue's
/// `max_send_sge` / `max_inline_data`, which are exactly what the queue reserved per WR: the
/// WQE never outgrows its reservation, and `ds` and the WQEBBs written always agree. Dropping
/// an unfinished builder abandons the WQE (nothing becomes visible).
#[derive(Debug)]
#[must_use = "a WQE is posted only by `finish` (and rung by `SendQueue::ring`)"]
pub struct WqeBuilder<'q, P> {
    /// The ring's writer, by value (kept in registers across the appends).
    w: WqWriter<'q>,
    q: &'q mut SqCore,
    /// WQEBB counter of the WQE.
    start: u32,
    /// 16-byte units written before the payload (ctrl and operation segments), plus the data
    /// segments appended so far.
    ds: u32,
    /// Data segments (`Gather`) or inline bytes (`Inline`) appended so far.
    payload: u32,
    opcode: SendOpcode,
    fm_ce_se: u8,
    imm: [u8; 4],
    _kind: PhantomData<P>,
}

impl<'q, P> WqeBuilder<'q, P> {
    /// The same WQE as the next typestate.
    #[inline(always)]
    fn into_kind<Q>(self) -> WqeBuilder<'q, Q> {
        WqeBuilder {
            w: self.w,
            q: self.q,
            start: self.start,
            ds: self.ds,
            payload: self.payload,
            opcode: self.opcode,
            fm_ce_se: self.fm_ce_se,
            imm: self.imm,
            _kind: PhantomData,
        }
    }

    /// Append a data segment; zero-length SGEs are skipped (0 would mean 2 GiB).
    #[inline(always)]
    fn push_sge(&mut self, sge: &Sge) -> Result<(), PostError> {
        if sge.length == 0 {
            return Ok(());
        }
        let max = self.q.cfg.geo.max_gs;
        if self.payload >= max {
            return Err(PostError::TooManySges {
                n: self.payload as usize + 1,
                max,
            });
        }
        self.payload += 1;
        let (lo, hi) = data_seg_words(sge.length, sge.lkey, sge.addr);
        let pos = self.start as usize * 64 + self.ds as usize * 16;
        self.w.store16(pos, lo, hi);
        self.ds += 1;
        Ok(())
    }

    /// Append inline payload bytes after those appended so far.
    #[inline(always)]
    fn push_inline(&mut self, data: &[u8]) -> Result<(), PostError> {
        let max = self.q.cfg.geo.max_inline;
        let total = self.payload as usize + data.len();
        if total > max as usize {
            return Err(PostError::InlineTooLarge { len: total, max });
        }
        let pos = self.start as usize * 64 + self.ds as usize * 16 + 4 + self.payload as usize;
        self.w.write(pos, data);
        self.payload = total as u32;
        Ok(())
    }
}

impl<'q> WqeBuilder<'q, AnyPayload> {
    /// Append a data (gather) segment; the WQE's payload is then data segments only.
    /// Zero-length SGEs are skipped (0 would mean 2 GiB).
    ///
    /// # Errors
    /// [`PostError::TooManySges`] past the queue's `max_send_sge` (the WQE is abandoned).
    #[inline(always)]
    pub fn sge(self, sge: &Sge) -> Result<WqeBuilder<'q, Gather>, PostError> {
        let mut b = self.into_kind::<Gather>();
        b.push_sge(sge)?;
        Ok(b)
    }

    /// Append inline payload bytes; the WQE's payload is then inline bytes only.
    ///
    /// # Errors
    /// [`PostError::InlineTooLarge`] when the WQE's inline total would exceed
    /// `max_inline_data` (the WQE is abandoned).
    #[inline(always)]
    pub fn inline(self, data: &[u8]) -> Result<WqeBuilder<'q, Inline>, PostError> {
        let mut b = self.into_kind::<Inline>();
        b.push_inline(data)?;
        Ok(b)
    }
}

impl WqeBuilder<'_, Gather> {
    /// Append another data segment (see [`WqeBuilder::<AnyPayload>::sge`]).
    ///
    /// # Errors
    /// [`PostError::TooManySges`] past the queue's `max_send_sge` (the WQE is abandoned).
    #[inline(always)]
    pub fn sge(mut self, sge: &Sge) -> Result<Self, PostError> {
        self.push_sge(sge)?;
        Ok(self)
    }
}

impl WqeBuilder<'_, Inline> {
    /// Append more inline bytes (concatenated with the earlier ones of this WQE).
    ///
    /// # Errors
    /// [`PostError::InlineTooLarge`] when the WQE's inline total would exceed
    /// `max_inline_data` (the WQE is abandoned).
    #[inline(always)]
    pub fn inline(mut self, data: &[u8]) -> Result<Self, PostError> {
        self.push_inline(data)?;
        Ok(self)
    }
}

impl<P: PayloadKind> WqeBuilder<'_, P> {
    /// Finish the WQE: write the inline header (if any inline byte was appended) and the
    /// control segment, record `wr_id`, advance the producer. The WQE is rung by the next
    /// [`SendQueue::ring`].
    #[inline(always)]
    pub fn finish(self, wr_id: u64) {
        let mut ds = self.ds;
        let q = self.q;
        // An inline WR counts as inline for the BlueFlame policy even with 0 bytes (libmlx5
        // sets its `inl` flag from IBV_SEND_INLINE), but a zero total length produces no
        // segment at all (docs/datapath.md §1.8).
        if P::INLINE && self.payload > 0 {
            let pos = self.start as usize * 64 + ds as usize * 16;
            self.w.write4(pos, inline_hdr(self.payload));
            // `payload <= max_inline` (< 1024): no overflow.
            ds += (self.payload + 4 + 15) >> 4;
        }
        commit(
            self.w,
            &q.shared,
            q.qpn_word,
            self.start,
            q.head,
            ds,
            self.opcode,
            self.fm_ce_se,
            self.imm,
            wr_id,
        );
        q.head = q.head.wrapping_add(1);
        q.cur_post = self.start.wrapping_add((ds + 3) >> 2);
        q.pend.last = self.start;
        q.pend.inline = P::INLINE;
        q.stats.wqes += 1;
    }
}

#[cfg(test)]
mod tests {
    //! WQE bytes and doorbells against the worked examples of docs/datapath.md §1.10, without a
    //! device: the UAR page is ordinary memory we can read back.
    use super::*;

    use crate::mem::uar::UarPage;
    use crate::mem::{DbRecPool, DmaBuf, fake};
    use crate::wr::WcOpcode;
    use mlx5_hw::types::Be32;
    use mlx5_hw::wqe::{CtrlSeg, DataSeg};
    use zerocopy::FromBytes;

    struct Rig {
        sq: SendQueue,
        fake: Arc<fake::FakeSurface>,
        dbrec: Arc<DbRec>,
        _page: Arc<UarPage>,
    }

    fn rig(qp_type: QpType, max_send_wr: u32, sge: u32, inline: u32, policy: BfPolicy) -> Rig {
        let geo = sq_geometry(qp_type, max_send_wr, sge, inline, 1008, 1 << 15).unwrap();
        let (fake, surface) = fake::surface();
        let page = UarPage::map(&surface, 0, 4096, 0, true).unwrap();
        let bf = Bfreg::new(page.bf_reg(0, 512), 256, true, 1);
        let buf = Arc::new(DmaBuf::new(geo.wqe_cnt as usize * 64).unwrap());
        let ring = WqRing::new(buf, 0, geo.wqe_cnt as usize * 64);
        let dbrec = Arc::new(DbRecPool::new(64).alloc().unwrap());
        let mut sq = SendQueue::new(
            ring,
            0x123,
            qp_type,
            geo,
            false,
            false,
            dbrec.clone(),
            bf,
            policy,
            None,
            7,
        );
        sq.set_state(QpState::Rts);
        Rig {
            sq,
            fake,
            dbrec,
            _page: page,
        }
    }

    fn ctrl_at(sq: &SendQueue, counter: u32) -> (CtrlSeg, [u8; 256]) {
        let mut w = [0u8; 256];
        sq.wqe_bytes(counter, &mut w);
        (CtrlSeg::read_from_bytes(&w[..16]).unwrap(), w)
    }

    fn sge(n: u64) -> Sge {
        Sge {
            addr: 0x1000 * n,
            length: 100,
            lkey: 7,
        }
    }

    #[test]
    fn ds_of_the_worked_examples() {
        let mut r = rig(QpType::Rc, 16, 4, 128, BfPolicy::AlwaysDoorbell);
        // RC SEND, 1 SGE: ds 2, 1 WQEBB.
        r.sq.post_send(&[SendWr::send(1, &[sge(1)], SendFlags::SIGNALED)])
            .unwrap();
        let (c, w) = ctrl_at(&r.sq, 0);
        assert_eq!(
            (c.opcode(), c.ds(), c.wqe_index(), c.qpn(), c.fm_ce_se),
            (SendOpcode::SEND, 2, 0, 0x123, 0x08)
        );
        let d = DataSeg::read_from_bytes(&w[16..32]).unwrap();
        assert_eq!((d.byte_count(), d.lkey(), d.addr()), (100, 7, 0x1000));
        assert_eq!(r.sq.producer(), 1);
        // RC WRITE, 3 SGEs: ds 5, 2 WQEBBs.
        let sges = [sge(1), sge(2), sge(3)];
        let op = WrOp::Write {
            raddr: 0xdead_0000,
            rkey: 9,
        };
        r.sq.post_send(&[SendWr::new(2, op, &sges, SendFlags::NONE)])
            .unwrap();
        let (c, _) = ctrl_at(&r.sq, 1);
        assert_eq!(
            (c.opcode(), c.ds(), c.wqe_index(), c.fm_ce_se),
            (SendOpcode::RDMA_WRITE, 5, 1, 0)
        );
        assert_eq!(r.sq.producer(), 3);
        // RC SEND inline 100 B: 1 + ceil(104 / 16) = 8 DS, 2 WQEBBs; header 0x80000064.
        let data = [0xABu8; 100];
        let parts: [&[u8]; 2] = [&data[..30], &data[30..]];
        r.sq.post_send(&[SendWr::send_inline(3, &parts, SendFlags::NONE)])
            .unwrap();
        let (c, w) = ctrl_at(&r.sq, 3);
        assert_eq!(c.ds(), 8);
        assert_eq!(
            Be32::read_from_bytes(&w[16..20]).unwrap().get(),
            INLINE_SEG_FLAG | 100
        );
        assert_eq!(&w[20..120], &data[..]);
        assert_eq!(r.sq.producer(), 5);
        // The doorbell record holds the next free WQEBB; the doorbell is ctrl bytes 0..8.
        assert_eq!(r.dbrec.word1().load_be32(), 5);
        let mut db = [0u8; 8];
        r.fake.uar.read(0x800, &mut db);
        assert_eq!(&db, &w[..8]);
        assert_eq!(r.sq.stats().doorbells, 3);
    }

    #[test]
    fn zero_length_inline_adds_no_segment() {
        let mut r = rig(QpType::Rc, 16, 1, 64, BfPolicy::PreferBf);
        let parts: [&[u8]; 2] = [&[], &[]];
        r.sq.post_send(&[SendWr::send_inline(1, &parts, SendFlags::SIGNALED)])
            .unwrap();
        let (c, _) = ctrl_at(&r.sq, 0);
        assert_eq!(c.ds(), 1, "ctrl only, as libmlx5");
        assert_eq!(r.sq.producer(), 1);
        // ds = 1 is never BlueFlamed (docs/datapath.md §3.4).
        assert_eq!((r.sq.stats().doorbells, r.sq.stats().bf_copies), (1, 0));
        // With BlueFlame for inline WRs only, a 0-byte inline WRITE (ds 2) still counts as inline.
        r.sq.set_bf_policy(BfPolicy::InlineOnly);
        let op = WrOp::Write {
            raddr: 0x100,
            rkey: 1,
        };
        let empty: [&[u8]; 1] = [&[]];
        let wr = SendWr::new(2, op, &[], SendFlags::NONE).with_inline(&empty);
        r.sq.post_send(&[wr]).unwrap();
        let (c, _) = ctrl_at(&r.sq, 1);
        assert_eq!(c.ds(), 2);
        assert_eq!(r.sq.stats().bf_copies, 1);
    }

    #[test]
    fn blueflame_copies_the_wrapped_wqe_and_alternates_halves() {
        let mut r = rig(QpType::Rc, 4, 1, 200, BfPolicy::PreferBf);
        assert_eq!(
            (r.sq.geometry().wqe_size, r.sq.geometry().wqe_cnt),
            (256, 16)
        );
        // Move the producer to WQEBB 14 with 1-WQEBB posts, then post a 4-WQEBB inline WQE
        // that wraps (slots 14, 15, 0, 1).
        for i in 0..14u64 {
            r.sq.post_send(&[SendWr::send(i, &[sge(1)], SendFlags::NONE)])
                .unwrap();
            r.sq.q.shared.tail.store(r.sq.q.head, Ordering::Relaxed); // pretend completed
        }
        let data: Vec<u8> = (0..180u8).collect();
        let parts: [&[u8]; 1] = [&data];
        r.sq.post_send(&[SendWr::send_inline(99, &parts, SendFlags::SIGNALED)])
            .unwrap();
        let (c, w) = ctrl_at(&r.sq, 14);
        assert_eq!(
            (c.ds(), c.wqe_index()),
            (1 + (4 + 180u32).div_ceil(16) as u8, 14)
        );
        assert_eq!(&w[20..200], &data[..]);
        assert_eq!(r.sq.producer(), 18);
        // 14 single posts alternated halves 14 times (even: back at half 0); this one went to
        // half 0 and is the whole WQE, source wrapped.
        let mut bf = [0u8; 256];
        r.fake.uar.read(0x800, &mut bf);
        assert_eq!(&bf[..], &w[..256]);
        assert_eq!(r.sq.stats().bf_copies, 15);
        // The next post goes to the other half (0x900).
        r.sq.q.shared.tail.store(r.sq.q.head, Ordering::Relaxed);
        r.sq.post_send(&[SendWr::send(100, &[sge(2)], SendFlags::NONE)])
            .unwrap();
        let (_, w) = ctrl_at(&r.sq, 18);
        let mut bf = [0u8; 64];
        r.fake.uar.read(0x900, &mut bf);
        assert_eq!(&bf[..32], &w[..32]);
    }

    #[test]
    fn full_queue_and_bad_requests_are_refused() {
        let mut r = rig(QpType::Uc, 4, 1, 0, BfPolicy::PreferBf);
        let cap = r.sq.geometry().max_post;
        for i in 0..cap {
            r.sq.post_send(&[SendWr::send(i.into(), &[sge(1)], SendFlags::NONE)])
                .unwrap();
        }
        let p = r.sq.producer();
        assert_eq!(
            r.sq.post_send(&[SendWr::send(9, &[sge(1)], SendFlags::NONE)]),
            Err((
                0,
                PostError::Full {
                    outstanding: cap,
                    capacity: cap
                }
            ))
        );
        assert_eq!(r.sq.producer(), p);
        let op = WrOp::Read { raddr: 0, rkey: 0 };
        let mut rc = rig(QpType::Rc, 4, 1, 16, BfPolicy::PreferBf);
        let data: [&[u8]; 1] = [b"x"];
        assert_eq!(
            rc.sq
                .post_send(&[SendWr::new(1, op, &[], SendFlags::NONE).with_inline(&data)]),
            Err((0, PostError::BadOpcode)),
            "an inline READ makes no sense"
        );
        assert_eq!(
            r.sq.post_send(&[SendWr::new(1, op, &[], SendFlags::NONE)]),
            Err((0, PostError::BadOpcode))
        );
        // max_send_sge 1 on UC gives a 64-byte WQE, which holds 2 data segments (reported back).
        assert_eq!(r.sq.geometry().max_gs, 2);
        let three = [sge(1), sge(2), sge(3)];
        r.sq.q.shared.tail.store(r.sq.q.head, Ordering::Relaxed);
        assert!(matches!(
            r.sq.post_send(&[SendWr::send(1, &three, SendFlags::NONE)]),
            Err((0, PostError::TooManySges { n: 3, max: 2 }))
        ));
        let big = [0u8; 64];
        let parts: [&[u8]; 1] = [&big];
        assert!(matches!(
            r.sq.post_send(&[SendWr::send_inline(1, &parts, SendFlags::NONE)]),
            Err((0, PostError::InlineTooLarge { len: 64, .. }))
        ));
    }

    #[test]
    fn a_chain_stops_at_the_first_bad_wr_and_rings_the_ones_before() {
        let mut r = rig(QpType::Rc, 16, 1, 64, BfPolicy::AlwaysDoorbell);
        let max = r.sq.geometry().max_inline;
        assert_eq!(max, 76);
        // Two parts that fit alone but not together: refused with the total, part by part
        // checks writing nothing past the WQE.
        let a = [1u8; 40];
        let parts: [&[u8]; 2] = [&a, &a];
        let (s1, s2) = ([sge(1)], [sge(2)]);
        let chain = [
            SendWr::send(1, &s1, SendFlags::SIGNALED),
            SendWr::send_inline(2, &parts, SendFlags::SIGNALED),
            SendWr::send(3, &s2, SendFlags::SIGNALED),
        ];
        assert_eq!(
            r.sq.post_send(&chain),
            Err((1, PostError::InlineTooLarge { len: 80, max: 76 }))
        );
        // WR 0 is posted and rung, nothing of WR 1 or 2 is.
        assert_eq!((r.sq.producer(), r.sq.outstanding()), (1, 1));
        assert_eq!((r.sq.stats().wqes, r.sq.stats().doorbells), (1, 1));
        assert_eq!(r.dbrec.word1().load_be32(), 1);
        // The next post reuses the refused WR's slot.
        r.sq.post_send(&chain[2..]).unwrap();
        let (c, w) = ctrl_at(&r.sq, 1);
        assert_eq!((c.ds(), c.wqe_index()), (2, 1));
        assert_eq!(DataSeg::read_from_bytes(&w[16..32]).unwrap().addr(), 0x2000);
        assert_eq!(r.sq.q.shared.wr_id(1), 3);
    }

    #[test]
    fn geometry_follows_the_reference() {
        // UD, 1 SGE: align64(64 + 16) = 128 B, max_inline 60 (docs/datapath.md §2.2).
        let g = sq_geometry(QpType::Ud, 64, 1, 0, 1008, 1 << 15).unwrap();
        assert_eq!((g.wqe_size, g.max_inline, g.max_gs), (128, 60, 4));
        assert_eq!(g.wqe_cnt, 128);
        // RC, 1 SGE, no inline: one WQEBB (no UMR ops in this driver: overhead 48).
        let g = sq_geometry(QpType::Rc, 100, 1, 0, 1008, 1 << 15).unwrap();
        assert_eq!(
            (g.wqe_size, g.wqe_cnt, g.max_post, g.max_inline),
            (64, 128, 128, 12)
        );
        let e = sq_geometry(QpType::Rc, 16, 1, 1100, 1008, 1 << 15).unwrap_err();
        assert_eq!(
            e.to_string(),
            "max_inline_data 1100 exceeds the device limit 908 for RC"
        );
        let e = sq_geometry(QpType::Rc, 1 << 16, 1, 0, 1008, 1 << 15).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("max_send_wr 65536 exceeds the device limit 32768"),
            "{e}"
        );
    }

    /// A tiny deterministic generator (xorshift64*), so the random tests need no dependency.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// The two control-segment words are the bytes of `CtrlSeg` (hw-layouts' encoder).
    #[test]
    fn ctrl_words_are_the_ctrl_segment() {
        let mut g = Rng(0x1234_5678_9abc_def1);
        for _ in 0..10_000 {
            let op = SendOpcode(g.next() as u8);
            let idx = g.next() as u32;
            let qpn = g.next() as u32 & 0xFF_FFFF;
            let ds = g.below(64) as u32;
            let fm = g.next() as u8;
            let imm = (g.next() as u32).to_ne_bytes();
            let want = CtrlSeg::new(op, 0, idx as u16, qpn, ds as u8, fm, 0).with_imm_bytes(imm);
            let want: [u8; 16] = zerocopy::transmute!(want);
            let qpn_word = u32::from_ne_bytes((qpn << 8).to_be_bytes());
            let w0 = ctrl_word0(op, idx, qpn_word, ds).to_ne_bytes();
            let w1 = ctrl_word1(fm, imm).to_ne_bytes();
            assert_eq!(&want[..8], &w0, "{op:?} {idx} {qpn} {ds}");
            assert_eq!(&want[8..], &w1);
        }
    }

    /// Finding: `PostError::BadState` always named RESET (`room()` hard-coded it); posting in
    /// INIT or RTR must name the real state, on both APIs.
    #[test]
    fn refusals_name_the_real_state() {
        let mut r = rig(QpType::Rc, 16, 1, 64, BfPolicy::PreferBf);
        for state in [QpState::Reset, QpState::Init, QpState::Rtr] {
            r.sq.set_state(state);
            assert_eq!(
                r.sq.send(SendFlags::NONE).map(|_| ()),
                Err(PostError::BadState { state })
            );
            assert_eq!(
                r.sq.post_send(&[SendWr::send(1, &[sge(1)], SendFlags::NONE)]),
                Err((0, PostError::BadState { state }))
            );
            let msg = PostError::BadState { state }.to_string();
            assert!(msg.contains(&format!("{state:?}")), "{msg}");
        }
        assert_eq!(r.sq.producer(), 0);
        r.sq.set_state(QpState::Sqd);
        r.sq.send(SendFlags::NONE).unwrap().finish(1);
        assert_eq!(r.sq.producer(), 1);
        // Credits taken in RTS do not survive a move out of it.
        r.sq.set_state(QpState::Rts);
        r.sq.send(SendFlags::NONE).unwrap().finish(2);
        r.sq.set_state(QpState::Rtr);
        assert_eq!(
            r.sq.send(SendFlags::NONE).map(|_| ()),
            Err(PostError::BadState {
                state: QpState::Rtr
            })
        );
    }

    /// An operation gets only the segments it may have (per QP type), and the atomic result
    /// SGE is checked.
    #[test]
    fn operations_are_refused_on_the_wrong_qp_type() {
        let mut uc = rig(QpType::Uc, 16, 2, 32, BfPolicy::PreferBf);
        let s = sge(1);
        assert_eq!(
            uc.sq.read(SendFlags::NONE, 1, 2).map(|_| ()),
            Err(PostError::BadOpcode)
        );
        assert_eq!(
            uc.sq.atomic(SendFlags::NONE, 1, 2, 3, None, &s).map(|_| ()),
            Err(PostError::BadOpcode)
        );
        let mut ud = rig(QpType::Ud, 16, 2, 32, BfPolicy::PreferBf);
        assert_eq!(
            ud.sq.send(SendFlags::NONE).map(|_| ()),
            Err(PostError::BadDestination)
        );
        assert_eq!(
            ud.sq.write(SendFlags::NONE, 1, 2, None).map(|_| ()),
            Err(PostError::BadOpcode)
        );
        let mut rc = rig(QpType::Rc, 16, 2, 32, BfPolicy::PreferBf);
        let short = Sge { length: 7, ..s };
        assert_eq!(
            rc.sq
                .atomic(SendFlags::NONE, 1, 2, 3, Some(4), &short)
                .map(|_| ()),
            Err(PostError::BadAtomicSge)
        );
        rc.sq
            .atomic(SendFlags::NONE, 0x1000, 5, 3, Some(4), &s)
            .unwrap()
            .finish(9);
        let (c, w) = ctrl_at(&rc.sq, 0);
        assert_eq!((c.opcode(), c.ds()), (SendOpcode::ATOMIC_CS, 4));
        let d = DataSeg::read_from_bytes(&w[48..64]).unwrap();
        assert_eq!((d.byte_count(), d.lkey(), d.addr()), (8, 7, 0x1000));
        assert_eq!(rc.sq.producer(), 1);
        // Nothing was refused silently: every refusal left the producer where it was.
        assert_eq!((uc.sq.producer(), ud.sq.producer()), (0, 0));
    }

    /// Finding: `raddr`, `atomic` and `av` never bounded the segment count (four `raddr()` on a
    /// 64-byte-WQE queue moved the producer 8 WQEBBs on a 4-WQEBB ring; 70 wrapped the 6-bit ds
    /// while the producer moved 18 WQEBBs). Now the operation start writes those segments once,
    /// and random builder sequences on random geometries never write outside the WQE's
    /// reservation: `ds` in the control segment is what was written, the producer moves
    /// `ceil(ds / 4)` WQEBBs, at most `wqe_size / 64`, and every byte of the ring outside the
    /// reservation is untouched.
    #[test]
    fn random_builders_stay_inside_their_reservation() {
        let mut g = Rng(0xfeed_f00d_dead_beef);
        let data = [0x5Au8; 1024];
        let (mut posted, mut refused) = (0, 0);
        for round in 0..300 {
            let qp_type = [QpType::Rc, QpType::Uc, QpType::Ud][g.below(3) as usize];
            let wrs = 1 + g.below(8) as u32;
            let sges = 1 + g.below(6) as u32;
            let inline = g.below(200) as u32;
            let Ok(geo) = sq_geometry(qp_type, wrs, sges, inline, 1008, 1 << 15) else {
                continue;
            };
            let mut r = rig(qp_type, wrs, sges, inline, BfPolicy::PreferBf);
            let ring_len = geo.wqe_cnt as usize * 64;
            for _ in 0..40 {
                // Retire everything, so only the capacity rule limits the next WQE.
                r.sq.q.shared.tail.store(r.sq.q.head, Ordering::Relaxed);
                let mut before = vec![0u8; ring_len];
                // Paint the ring so stray stores show.
                r.sq.ring.ring_mut().write(0, &vec![0xEE; ring_len]);
                r.sq.ring.ring().read(0, &mut before);
                let start = r.sq.producer();
                let s = Sge {
                    addr: g.next(),
                    length: 1 + g.below(1000) as u32,
                    lkey: 1,
                };
                let n_pay = g.below(12) as usize;
                let op = g.below(6);
                let inl = g.below(2) == 0;
                let chunk = g.below(80) as usize;
                let flags = SendFlags::NONE;
                let finished = match (qp_type, op) {
                    (QpType::Ud, _) => {
                        // UD needs an Ah; its segments are covered by the verbs tests.
                        false
                    }
                    (_, 0 | 1) => {
                        let b = if op == 0 {
                            r.sq.write(flags, 1, 2, None)
                        } else {
                            r.sq.send(flags)
                        }
                        .unwrap();
                        if inl {
                            let mut b = b.inline(&data[..chunk.min(data.len())]);
                            for _ in 0..n_pay {
                                b = b.and_then(|b| b.inline(&data[..chunk]));
                            }
                            b.map(|b| b.finish(1)).is_ok()
                        } else {
                            let mut b = b.sge(&s);
                            for _ in 0..n_pay {
                                b = b.and_then(|b| b.sge(&s));
                            }
                            b.map(|b| b.finish(1)).is_ok()
                        }
                    }
                    (QpType::Rc, 2) => {
                        let mut b = r.sq.read(flags, 1, 2).unwrap().sge(&s);
                        for _ in 0..n_pay {
                            b = b.and_then(|b| b.sge(&s));
                        }
                        b.map(|b| b.finish(1)).is_ok()
                    }
                    (QpType::Rc, 3) => {
                        let res = Sge {
                            length: s.length.max(8),
                            ..s
                        };
                        r.sq.atomic(flags, 1, 2, 3, None, &res).unwrap().finish(1);
                        true
                    }
                    _ => {
                        r.sq.send_imm(flags, [1, 2, 3, 4]).unwrap().finish(1);
                        true
                    }
                };
                r.sq.ring();
                let moved = r.sq.producer().wrapping_sub(start);
                let res = geo.wqe_size as usize;
                let mut after = vec![0u8; ring_len];
                r.sq.ring.ring().read(0, &mut after);
                let base = (start as usize % geo.wqe_cnt as usize) * 64;
                for i in 0..ring_len {
                    let k = (i + ring_len - base) % ring_len;
                    if k >= res {
                        assert_eq!(after[i], before[i], "round {round}: byte {i} outside");
                    }
                }
                if finished {
                    let (c, _) = ctrl_at(&r.sq, start);
                    assert_eq!(u32::from(c.ds()).div_ceil(4), moved, "round {round}");
                    assert!(moved as usize * 64 <= res && moved >= 1, "round {round}");
                    assert_eq!(c.wqe_index(), start as u16);
                    posted += 1;
                } else {
                    assert_eq!(moved, 0, "round {round}: refused WQE moved the producer");
                    refused += 1;
                }
            }
        }
        assert!(
            posted > 2000 && refused > 1000,
            "{posted} posted, {refused} refused"
        );
    }

    /// 8-byte doorbells and BlueFlame copies go to alternating halves, inside the register.
    #[test]
    fn doorbells_alternate_halves() {
        let mut r = rig(QpType::Rc, 16, 1, 64, BfPolicy::InlineOnly);
        for i in 0..6u64 {
            let before = r.sq.q.bf.db.offset();
            r.sq.send(SendFlags::NONE)
                .unwrap()
                .sge(&sge(1))
                .unwrap()
                .finish(i);
            r.sq.ring();
            let mut db = [0u8; 8];
            r.fake.uar.read(0x800 + before, &mut db);
            let (_, w) = ctrl_at(&r.sq, i as u32);
            assert_eq!(&db, &w[..8]);
            assert_eq!(r.sq.q.bf.db.offset(), before ^ 256);
        }
        assert_eq!((r.sq.stats().doorbells, r.sq.stats().bf_copies), (6, 0));
    }

    /// Ring bytes, SQ record, both BlueFlame halves, counters, producer, BlueFlame offset
    /// and the WR records of a rig.
    type Observed = (
        Vec<u8>,
        u32,
        Vec<u8>,
        SqStats,
        u32,
        u32,
        Vec<(u64, WcOpcode)>,
    );

    /// Everything observable of a rig: ring bytes, SQ record, both BlueFlame halves (the
    /// 8-byte doorbell lands at their start), counters and the WR records.
    fn observe(r: &Rig) -> Observed {
        let mut ring = vec![0u8; r.sq.ring.ring().len()];
        r.sq.ring.ring().read(0, &mut ring);
        let mut uar = vec![0u8; 512];
        r.fake.uar.read(0x800, &mut uar);
        let recs = (0..r.sq.q.head)
            .map(|o| (r.sq.q.shared.wr_id(o), r.sq.q.shared.wr_op(o)))
            .collect();
        (
            ring,
            r.dbrec.word1().load_be32(),
            uar,
            r.sq.stats(),
            r.sq.producer(),
            r.sq.q.bf.db.offset() as u32,
            recs,
        )
    }

    /// The fused paths (`send_inline_now`, and `post_send` of one WR) post exactly what the
    /// builder posts, with the same doorbell (BlueFlame or 8 bytes, same half) and the same
    /// refusals: random geometries, payload sizes around every limit, WQEs left unrung before
    /// them, wrap-around at the ring end, full queues, states that do not allow posting.
    #[test]
    fn fused_sends_match_the_builder() {
        let mut g = Rng(0x0bad_cafe_f00d_1234);
        let data: Vec<u8> = (0..1024u32).map(|i| (i * 7 + 3) as u8).collect();
        let mut fused_taken = 0;
        for round in 0..200 {
            let qp_type = [QpType::Rc, QpType::Uc, QpType::Ud][g.below(3) as usize];
            let wrs = 1 + g.below(6) as u32;
            let sges = 1 + g.below(3) as u32;
            let inline = g.below(120) as u32;
            let policy = [
                BfPolicy::PreferBf,
                BfPolicy::InlineOnly,
                BfPolicy::AlwaysDoorbell,
            ][g.below(3) as usize];
            if sq_geometry(qp_type, wrs, sges, inline, 1008, 1 << 15).is_err() {
                continue;
            }
            let mut a = rig(qp_type, wrs, sges, inline, policy);
            let mut b = rig(qp_type, wrs, sges, inline, policy);
            let max_inline = a.sq.geometry().max_inline as usize;
            for step in 0..60u64 {
                if g.below(4) == 0 {
                    let t = a.sq.q.head.wrapping_sub(g.below(3) as u32);
                    a.sq.q.shared.tail.store(t, Ordering::Relaxed);
                    b.sq.q.shared.tail.store(t, Ordering::Relaxed);
                }
                if g.below(25) == 0 {
                    let st = [QpState::Rts, QpState::Init, QpState::Err][g.below(3) as usize];
                    a.sq.set_state(st);
                    b.sq.set_state(st);
                }
                let flags = SendFlags(g.below(16) as u32);
                let id = (round << 8) | step;
                let len = match g.below(4) {
                    0 => g.below(8) as usize,
                    1 => max_inline.saturating_sub(2) + g.below(5) as usize,
                    _ => g.below(70) as usize,
                }
                .min(data.len());
                let payload = &data[step as usize % 64..][..len.min(data.len() - 64)];
                let sg = [Sge {
                    addr: g.next(),
                    length: g.below(3) as u32 * 0x1000,
                    lkey: 5,
                }];
                let parts = [payload];
                match g.below(6) {
                    // A chain of plain SENDs (the verbs chain path), rung once even on error.
                    5 => {
                        let sgs: Vec<[Sge; 1]> = (0..1 + g.below(4))
                            .map(|k| {
                                [Sge {
                                    addr: g.next(),
                                    length: (g.below(3) as u32) << k,
                                    lkey: k as u32,
                                }]
                            })
                            .collect();
                        let wrs: Vec<SendWr<'_>> = sgs
                            .iter()
                            .enumerate()
                            .map(|(k, sg)| SendWr::send(id + k as u64, sg, flags))
                            .collect();
                        let ra = a.sq.post_send(&wrs);
                        let mut rb = Ok(());
                        for (k, wr) in wrs.iter().enumerate() {
                            let r =
                                b.sq.send(wr.flags)
                                    .and_then(|w| w.sge(&wr.sg_list[0]))
                                    .map(|w| w.finish(wr.wr_id));
                            if let Err(e) = r {
                                rb = Err((k, e));
                                break;
                            }
                        }
                        if wrs.len() > 1 || rb.is_ok() {
                            b.sq.ring();
                        }
                        assert_eq!(ra, rb, "round {round} step {step}");
                    }
                    // A WQE left for a later doorbell (then no BlueFlame for the next one).
                    0 => {
                        let ra =
                            a.sq.send(flags)
                                .and_then(|w| w.sge(&sg[0]))
                                .map(|w| w.finish(id));
                        let rb =
                            b.sq.send(flags)
                                .and_then(|w| w.sge(&sg[0]))
                                .map(|w| w.finish(id));
                        assert_eq!(ra, rb);
                    }
                    1 | 2 => {
                        let ra = if g.below(2) == 0 {
                            a.sq.send_inline_now(flags, payload, id)
                        } else if a.sq.fast_send(
                            SendOpcode::SEND,
                            [0; 4],
                            flags,
                            Fast::Inline(payload),
                            id,
                        ) {
                            fused_taken += 1;
                            Ok(())
                        } else {
                            // Not taken: nothing posted; the builder posts (or refuses) it.
                            assert_eq!(a.sq.producer(), b.sq.producer());
                            a.sq.send_inline_general(flags, payload, id)
                        };
                        let rb =
                            b.sq.send(flags)
                                .and_then(|w| w.inline(payload))
                                .map(|w| w.finish(id));
                        if rb.is_ok() {
                            b.sq.ring();
                        }
                        assert_eq!(ra, rb, "round {round} step {step} len {len}");
                    }
                    3 => {
                        let wr = [SendWr::send_inline(id, &parts, flags)];
                        let ra = a.sq.post_send(&wr);
                        let rb =
                            b.sq.send(flags)
                                .and_then(|w| w.inline(payload))
                                .map(|w| w.finish(id))
                                .map_err(|e| (0, e));
                        if rb.is_ok() {
                            b.sq.ring();
                        }
                        assert_eq!(ra, rb, "round {round} step {step} len {len}");
                    }
                    _ => {
                        let wr = [SendWr::send(id, &sg, flags)];
                        let ra = a.sq.post_send(&wr);
                        let rb =
                            b.sq.send(flags)
                                .and_then(|w| w.sge(&sg[0]))
                                .map(|w| w.finish(id))
                                .map_err(|e| (0, e));
                        if rb.is_ok() {
                            b.sq.ring();
                        }
                        assert_eq!(ra, rb, "round {round} step {step}");
                    }
                }
                let (oa, ob) = (observe(&a), observe(&b));
                assert!(oa.0 == ob.0, "ring bytes, round {round} step {step}");
                assert_eq!(oa.1, ob.1, "SQ record, round {round} step {step}");
                assert!(oa.2 == ob.2, "UAR bytes, round {round} step {step}");
                assert_eq!(
                    (oa.3, oa.4, oa.5),
                    (ob.3, ob.4, ob.5),
                    "round {round} step {step}"
                );
                assert_eq!(oa.6, ob.6, "WR records, round {round} step {step}");
            }
        }
        assert!(fused_taken > 150, "fused path taken {fused_taken} times");
    }
}
