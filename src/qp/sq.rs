//! The send queue: WQE building straight into the SQ ring, the doorbell, and the bookkeeping the
//! completion poller uses to turn a CQE's `wqe_counter` back into work-request ids.
//!
//! # Ownership rule
//! WQEBBs from `cur_post` on are driver-owned as long as fewer than `max_post` WRs are
//! outstanding (`head - tail < max_post`): every WR is accounted at the worst-case WQE size, and
//! `max_post * wqe_size` fits the ring (mlx5-datapath.md §2.2). `tail` only moves when the CQ
//! poller sees a CQE, so a full queue is refused ([`PostError::Full`]), never overwritten.
//!
//! # Ordering rule
//! [`SendQueue::ring`] is the one doorbell routine: WQE stores, `to_device`, SQ record (word 1),
//! `wc_start`, one MMIO (8-byte doorbell or BlueFlame copy), `wc_flush`, flip the BlueFlame half.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};

use mlx5_hw::opcodes::{SendOpcode, WcStatus};
use mlx5_hw::wqe::{
    AtomicSeg, CtrlSeg, DataSeg, DatagramSeg, FM_CE_SE_CQ_UPDATE, FM_CE_SE_FENCE,
    FM_CE_SE_SOLICITED, InlineHdr, MAX_DS, RaddrSeg,
};

use crate::QpType;
use crate::mem::DbRec;
use crate::mem::scatter::MrTable;
use crate::mem::table::RingTable;
use crate::mem::uar::UarReg;
use crate::mem::wq::{WqReader, WqRing, WqWriter};
use crate::mmio::barrier;
use crate::ring::RingSize;
use crate::wr::{PostError, SendFlags, SendWr, Sge, WcOpcode, WrOp};

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
    reg: UarReg,
    offset: usize,
    /// BlueFlame half size in bytes (0: doorbell only, no BlueFlame, no alternation).
    half: usize,
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
            reg,
            offset: 0,
            half,
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

/// One entry of the send queue's bookkeeping table. The table is indexed two ways with the same
/// mask: by WR ordinal (`wr_id`, `op`) and by WQEBB counter (`ordinal`).
#[derive(Debug, Default)]
pub(crate) struct SqSlot {
    /// Work-request id of the WR with this ordinal.
    wr_id: AtomicU64,
    /// WR ordinal of the WQE whose first WQEBB is this slot.
    ordinal: AtomicU32,
    /// [`SendOpcode`] of the WR with this ordinal (mapped to a [`WcOpcode`] only when an
    /// error or unsignaled completion needs it).
    op: AtomicU8,
}

/// State shared between a send queue and the completion poller(s).
#[derive(Debug)]
pub(crate) struct SqShared {
    /// `wr_mask + 1` slots (a power of two): one table for both indices.
    slots: RingTable<SqSlot>,
    /// WRs retired by completions (free-running); written only by the poller.
    pub tail: AtomicU32,
    /// Slot mask for both indices (`slots.len() - 1`).
    pub wr_mask: u32,
    pub report_unsignaled: bool,
    pub qpn: u32,
    /// Where READ/atomic results scattered into a CQE go (`None`: never expected).
    pub scatter: Option<SqScatter>,
}

/// The send ring as the poller reads it back for scatter-to-CQE copies (requester side: an
/// RDMA READ's or atomic's result lands in the CQE instead of the WQE's scatter list).
#[derive(Debug)]
pub(crate) struct SqScatter {
    ring: WqReader,
    /// Kernel handle of the QP's protection domain.
    pd: u32,
    mrs: Arc<MrTable>,
}

impl SqShared {
    /// Tables for `max_post` outstanding WRs on a ring of `wqe_cnt` (a power of two) WQEBBs.
    pub(crate) fn new(max_post: u32, wqe_cnt: u32, report_unsignaled: bool, qpn: u32) -> Self {
        // Every WR takes at least one WQEBB, so `max_post <= wqe_cnt` for real queues; the max
        // keeps the table large enough for both indices whatever the caller passes.
        let slots = RingTable::new(max_post.max(wqe_cnt) as usize, SqSlot::default);
        Self {
            wr_mask: slots.len() as u32 - 1,
            slots,
            tail: AtomicU32::new(0),
            report_unsignaled,
            qpn,
            scatter: None,
        }
    }

    /// Copy the result the device scattered into the CQE of the WQE at WQEBB counter
    /// `wqe_counter` (an RDMA READ or an atomic) into that WQE's data segments, read back from
    /// the ring: they follow the control and remote-address segments (and the atomic segment).
    ///
    /// # Errors
    /// [`WcStatus::GENERAL_ERR`] when this queue expects no scattered data or the WQE is not a
    /// READ or atomic; otherwise as
    /// [`MrTable::copy_to_segs`](crate::mem::scatter::MrTable::copy_to_segs).
    pub(crate) fn copy_scattered(&self, wqe_counter: u16, data: &[u8]) -> Result<(), WcStatus> {
        let sc = self.scatter.as_ref().ok_or(WcStatus::GENERAL_ERR)?;
        let base = usize::from(wqe_counter) * 64;
        let ctrl = sc.ring.seg16(base);
        // opmod_idx_opcode @0 (opcode in its low byte, @3); qpn_ds @4 (ds in the low 6 bits, @7).
        let skip = match SendOpcode(ctrl[3]) {
            SendOpcode::RDMA_READ => 2,
            SendOpcode::ATOMIC_CS | SendOpcode::ATOMIC_FA => 3,
            _ => return Err(WcStatus::GENERAL_ERR),
        };
        let ds = usize::from(ctrl[7] & 0x3F);
        let segs = (skip..ds.max(skip))
            .map(|k| -> DataSeg { zerocopy::transmute!(sc.ring.seg16(base + k * 16)) });
        sc.mrs.copy_to_segs(sc.pd, data, segs)
    }

    #[inline(always)]
    fn slot(&self, index: u32) -> &SqSlot {
        self.slots.get(index)
    }

    /// Record WR `ordinal` (id, opcode) as the WQE starting at WQEBB counter `wqe_counter`
    /// (what posting does; for tests of the poller).
    #[cfg(test)]
    pub(crate) fn record(&self, ordinal: u32, wqe_counter: u32, wr_id: u64, op: SendOpcode) {
        record(&self.slots, ordinal, wqe_counter, wr_id, op);
    }

    #[inline(always)]
    pub(crate) fn wr_id(&self, ordinal: u32) -> u64 {
        self.slot(ordinal).wr_id.load(Ordering::Relaxed)
    }

    #[inline(always)]
    pub(crate) fn wr_op(&self, ordinal: u32) -> WcOpcode {
        wc_opcode_of(SendOpcode(self.slot(ordinal).op.load(Ordering::Relaxed)))
    }

    /// The WR ordinal of the WQE that starts at WQEBB counter `wqe_counter`.
    #[inline(always)]
    pub(crate) fn ordinal_at(&self, wqe_counter: u16) -> u32 {
        self.slot(u32::from(wqe_counter))
            .ordinal
            .load(Ordering::Relaxed)
    }
}

/// Geometry of a send queue (mlx5-datapath.md §2.2).
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
/// not libmlx5's 192; see mlx5-datapath.md §2.1).
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
#[derive(Debug)]
pub struct SendQueue {
    ring: WqRing,
    size: RingSize,
    /// Free-running WQEBB producer counter.
    cur_post: u32,
    /// Free-running count of WRs built.
    head: u32,
    shared: Arc<SqShared>,
    cfg: SqConfig,
    /// Posting allowed (RTS, SQD, SQE, ERR).
    pub(crate) enabled: bool,
    dbrec: Arc<DbRec>,
    bf: Bfreg,
    /// The BlueFlame policy as two facts for [`ring`](Self::ring): the largest WQE it may
    /// BlueFlame (`bf.half`, or 0 for [`BfPolicy::AlwaysDoorbell`]), and whether that needs no
    /// inline WQE ([`BfPolicy::PreferBf`]).
    bf_max: usize,
    bf_any: bool,
    pend: Pending,
    stats: SqStats,
}

/// WQEs built since the last doorbell.
#[derive(Debug, Default)]
struct Pending {
    /// How many.
    n: u32,
    /// WQEBB counter of the last one.
    last: u32,
    /// `ds` of the last one.
    ds: u32,
    /// The first 8 bytes of the last one's control segment (the 8-byte doorbell).
    head: [u8; 8],
    /// Whether any is inline (BlueFlame policy; only a single WQE is ever BlueFlamed).
    inline: bool,
}

/// What a send queue was created with: read-only on the data path, borrowed as a whole by
/// [`Batch`] (so its fields are loaded where used, not copied up front).
#[derive(Debug)]
struct SqConfig {
    qpn: u32,
    qp_type: QpType,
    geo: SqGeometry,
    /// [`SendFlags`] added to every WR (SIGNALED for `sq_sig_all`).
    always: SendFlags,
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
    ) -> Self {
        let mut shared = SqShared::new(geo.max_post, geo.wqe_cnt, report_unsignaled, qpn);
        shared.scatter = scatter.map(|(pd, mrs)| SqScatter {
            ring: ring.reader(),
            pd,
            mrs,
        });
        let shared = Arc::new(shared);
        // PANIC: `sq_geometry` makes `wqe_cnt` a power of two no larger than `max_send_wqebb`
        // (at most 2^16 on any device), well inside `RingSize`'s range.
        let size = RingSize::at_least(geo.wqe_cnt).expect("SQ size is a small power of two");
        let mut sq = Self {
            ring,
            size,
            cur_post: 0,
            head: 0,
            shared,
            cfg: SqConfig {
                qpn,
                qp_type,
                geo,
                always: if sig_all {
                    SendFlags::SIGNALED
                } else {
                    SendFlags::NONE
                },
            },
            enabled: false,
            dbrec,
            bf,
            bf_max: 0,
            bf_any: false,
            pend: Pending::default(),
            stats: SqStats::default(),
        };
        sq.set_bf_policy(policy);
        sq
    }

    pub(crate) fn shared(&self) -> &Arc<SqShared> {
        &self.shared
    }

    /// The geometry (capacity, SGE and inline limits).
    pub fn geometry(&self) -> SqGeometry {
        self.cfg.geo
    }

    /// Counters.
    pub fn stats(&self) -> SqStats {
        self.stats
    }

    /// Which register this queue rings.
    pub fn bfreg(&self) -> BfregInfo {
        BfregInfo {
            id: self.bf.id,
            uar_page: self.bf.reg.page().page_id,
            dedicated: self.bf.dedicated,
            bf_size: self.bf.half,
        }
    }

    /// Change the BlueFlame policy.
    pub fn set_bf_policy(&mut self, policy: BfPolicy) {
        self.bf_max = match policy {
            BfPolicy::AlwaysDoorbell => 0,
            BfPolicy::PreferBf | BfPolicy::InlineOnly => self.bf.half,
        };
        self.bf_any = policy == BfPolicy::PreferBf;
    }

    /// WRs posted and not yet retired.
    #[inline]
    pub fn outstanding(&self) -> u32 {
        self.head
            .wrapping_sub(self.shared.tail.load(Ordering::Acquire))
    }

    /// WRs that can still be posted.
    #[inline]
    pub fn free(&self) -> u32 {
        self.cfg.geo.max_post.saturating_sub(self.outstanding())
    }

    /// Low-level completion: the requester CQE for the WQE at `wqe_counter` (its `wqe_counter`
    /// field) was consumed by the caller's own poll loop ([`RawCq::next`](crate::RawCq::next)).
    /// Retires that WR and every earlier unsignaled one; returns its `wr_id`. (The verbs-level
    /// [`Cq::poll`](crate::Cq::poll) does this itself; use one or the other per CQ.)
    #[inline]
    pub fn retire(&mut self, wqe_counter: u16) -> u64 {
        let ord = self.shared.ordinal_at(wqe_counter);
        self.shared
            .tail
            .store(ord.wrapping_add(1), Ordering::Release);
        self.shared.wr_id(ord)
    }

    /// Copy `out.len()` bytes of the SQ ring starting at the WQE whose first WQEBB has
    /// free-running counter `wqe_counter` (wrapping at the ring end), for diagnostics: decode
    /// with [`mlx5_hw::wqe::WqeView`].
    pub fn wqe_bytes(&self, wqe_counter: u32, out: &mut [u8]) {
        let out_len = out.len().min(self.ring.len());
        self.ring.read(
            self.size.slot(wqe_counter) as usize * 64,
            &mut out[..out_len],
        );
    }

    /// The free-running WQEBB producer counter (the next WQE's index).
    pub fn producer(&self) -> u32 {
        self.cur_post
    }

    /// Zero both doorbell-record words (QP moved to RESET).
    pub(crate) fn clear_dbrec(&mut self) {
        self.dbrec.clear();
    }

    /// Reset all indices (QP moved to RESET).
    pub(crate) fn reset(&mut self) {
        self.cur_post = 0;
        self.head = 0;
        self.shared.tail.store(0, Ordering::Release);
        self.pend = Pending::default();
        self.ring.zero();
    }

    /// Start a WQE (low-level API): checks state and room, then returns a builder that writes
    /// segments straight into the ring. Nothing is visible to the device until
    /// [`WqeBuilder::finish`] and then [`ring`](Self::ring).
    ///
    /// `fm_ce_se` flags come from `flags` (SIGNALED, SOLICITED, FENCE; INLINE is ignored here).
    ///
    /// # Errors
    /// [`PostError::BadState`] outside RTS/SQD/SQE/ERR; [`PostError::Full`] when `max_post` WRs
    /// are outstanding.
    #[inline]
    pub fn start(
        &mut self,
        opcode: SendOpcode,
        flags: SendFlags,
        imm: [u8; 4],
    ) -> Result<WqeBuilder<'_>, PostError> {
        room(self.enabled, self.outstanding(), self.cfg.geo.max_post)?;
        Ok(WqeBuilder {
            start: self.cur_post,
            ds: 1,
            data_segs: 0,
            inline_len: 0,
            inline_hdr: None,
            opcode,
            fm_ce_se: fm_ce_se(flags, self.cfg.always),
            imm,
            sq: self,
        })
    }

    /// The queue's hot state by value, for building WQEs (see [`Batch`]); hand it back with
    /// [`end_batch`](Self::end_batch).
    #[inline(always)]
    fn batch(&mut self) -> Batch<'_> {
        Batch {
            ring: self.ring.writer(),
            shared: &self.shared,
            cfg: &self.cfg,
            enabled: self.enabled,
            pend: &mut self.pend,
            room: 0,
            cur_post: self.cur_post,
            head: self.head,
        }
    }

    /// Take back what a [`Batch`] built (its producer counters).
    #[inline(always)]
    fn end_batch(&mut self, e: BatchEnd) {
        let built = e.head.wrapping_sub(self.head);
        self.cur_post = e.cur_post;
        self.head = e.head;
        self.pend.n += built;
        self.stats.wqes += u64::from(built);
    }

    /// Ring the doorbell for every WQE finished since the last ring (one doorbell per batch).
    /// Does nothing if there is none.
    #[inline]
    pub fn ring(&mut self) {
        if self.pend.n == 0 {
            return;
        }
        // (The ring takes positions modulo its length.)
        let pos = self.pend.last as usize * 64;
        let ds = self.pend.ds;
        // A single WQE of more than the control segment that fits a BlueFlame half (`bf_max`
        // is 0 without halves or under `AlwaysDoorbell`), inline unless `PreferBf`.
        let use_bf = self.pend.n == 1
            && ds > 1
            && (ds as usize) * 16 <= self.bf_max
            && (self.bf_any | self.pend.inline);
        self.pend.n = 0;
        self.pend.inline = false;

        // 1. WQE bytes before the doorbell record.
        barrier::to_device();
        // 2. SQ record (word 1) = next free WQEBB counter, low 16 bits.
        self.dbrec.word1().store_be32(self.cur_post & 0xFFFF);
        // 3. Record before the write-combining MMIO store.
        barrier::wc_start();
        if use_bf {
            // 4a. BlueFlame: the WQE in ascending 64-byte chunks, the source wrapping at the end.
            let chunks = (ds as usize * 16).div_ceil(64);
            for i in 0..chunks {
                let c = self.ring.chunk64(pos + i * 64);
                self.bf
                    .reg
                    .mmio()
                    .store_chunk64(self.bf.offset + i * 64, &c);
            }
            self.stats.bf_copies += 1;
        } else {
            // 4b. The first 8 bytes of the last ctrl segment, verbatim.
            self.bf
                .reg
                .mmio()
                .store_raw64(self.bf.offset, self.pend.head);
            self.stats.doorbells += 1;
        }
        // 5. Flush the write-combining buffer before anyone rings again.
        barrier::wc_flush();
        // 6. Alternate BlueFlame halves (no-op for doorbell-only registers).
        self.bf.offset ^= self.bf.half;
    }

    /// Post a chain of verbs-shaped work requests and ring once.
    ///
    /// # Errors
    /// On the first bad WR: its index and the reason. WRs before it are posted and rung
    /// (as `ibv_post_send`'s `bad_wr`).
    pub fn post_send(&mut self, wrs: &[SendWr<'_>]) -> Result<(), (usize, PostError)> {
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
}

/// How many more WRs may be posted now (at least 1), or why none may.
///
/// The count only grows behind the poster's back (the poller moves `tail` forward), so a poster
/// may spend it WR by WR and ask again only when it is used up.
///
/// # Errors
/// [`PostError::BadState`] unless `enabled` (RTS/SQD/SQE/ERR); [`PostError::Full`] when
/// `max_post` WRs are outstanding.
#[inline(always)]
fn room(enabled: bool, outstanding: u32, max_post: u32) -> Result<u32, PostError> {
    if !enabled {
        return Err(PostError::BadState {
            state: crate::QpState::Reset,
        });
    }
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

/// The control segment's `fm_ce_se` byte for `flags` plus `always` (SIGNALED, SOLICITED,
/// FENCE; INLINE is ignored here).
#[inline(always)]
fn fm_ce_se(flags: SendFlags, always: SendFlags) -> u8 {
    FM_CE_SE_BY_FLAGS[((flags.0 | always.0) & 7) as usize]
}

/// Record WR `ordinal` (id, send opcode) as the WQE starting at WQEBB counter `wqe_counter`.
#[inline(always)]
fn record(slots: &RingTable<SqSlot>, ordinal: u32, wqe_counter: u32, wr_id: u64, op: SendOpcode) {
    let s = slots.get(ordinal);
    s.wr_id.store(wr_id, Ordering::Relaxed);
    s.op.store(op.0, Ordering::Relaxed);
    slots
        .get(wqe_counter)
        .ordinal
        .store(ordinal, Ordering::Relaxed);
}

/// A send queue's hot state while WQEs are built (a verbs `post_send` chain, or one low-level
/// WQE): the producer counters by value, so that the compiler keeps them in registers across
/// the chain instead of re-reading the queue's fields after every store into the ring, and the
/// read-only configuration by reference. [`SendQueue::end_batch`] takes the counters back.
struct Batch<'q> {
    ring: WqWriter<'q>,
    shared: &'q SqShared,
    cfg: &'q SqConfig,
    enabled: bool,
    pend: &'q mut Pending,
    /// WRs that fit without looking at `tail` again (see [`room`]).
    room: u32,
    cur_post: u32,
    head: u32,
}

/// The producer counters at the end of a [`Batch`].
struct BatchEnd {
    cur_post: u32,
    head: u32,
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
        }
    }

    /// Make sure one more WR may be posted (state and room), re-reading the poller's tail only
    /// when the room counted so far is used up.
    #[inline(always)]
    fn reserve(&mut self) -> Result<(), PostError> {
        if self.room == 0 {
            let outstanding = self
                .head
                .wrapping_sub(self.shared.tail.load(Ordering::Acquire));
            self.room = room(self.enabled, outstanding, self.cfg.geo.max_post)?;
        }
        Ok(())
    }

    /// Finish the WQE of `ds` units that starts at the producer counter (every other segment
    /// is written): write its control segment, record `wr_id`, advance the producer and note
    /// the WQE for the next [`SendQueue::ring`] (`plan.inline` counts for the BlueFlame
    /// policy).
    #[inline(always)]
    fn commit(&mut self, ds: u32, plan: Plan, fm_ce_se: u8, wr_id: u64) {
        let start = self.cur_post;
        let ctrl = CtrlSeg::new(
            plan.opcode,
            0,
            (start & 0xFFFF) as u16,
            self.cfg.qpn,
            ds as u8,
            fm_ce_se,
            0,
        )
        .with_imm_bytes(plan.imm);
        let ctrl: [u8; 16] = zerocopy::transmute!(ctrl);
        self.ring.write_segs(start as usize * 64, &ctrl);
        let ord = self.head;
        record(&self.shared.slots, ord, start, wr_id, plan.opcode);
        self.head = ord.wrapping_add(1);
        self.cur_post = start.wrapping_add(ds.div_ceil(4));
        self.room -= 1;
        self.pend.last = start;
        self.pend.ds = ds;
        self.pend.head.copy_from_slice(&ctrl[..8]);
        if plan.inline {
            self.pend.inline = true;
        }
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
            opcode: if wr.op == WrOp::Send {
                SendOpcode::SEND
            } else {
                SendOpcode::SEND_IMM
            },
            imm,
            inline,
        };
        self.commit(
            ((end - start) / 16) as u32,
            plan,
            fm_ce_se(wr.flags, cfg.always),
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
        let fm = fm_ce_se(wr.flags, self.cfg.always);
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
            Some(sge) if sge.length >= 8 => Some(DataSeg::new(8, sge.lkey, sge.addr)),
            _ => return Err(PostError::BadAtomicSge),
        },
        None => None,
    };
    let mut pos = start + 16;
    if let Some(ud) = wr.ud {
        let mut av = *ud.ah.av();
        av.set_dqpn(ud.remote_qpn);
        av.set_qkey(ud.remote_qkey);
        let bytes: [u8; 48] = zerocopy::transmute!(av);
        ring.write_segs(pos, &bytes);
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
    if let Some(seg) = atomic_sge {
        ring.write_segs::<16>(pos, &zerocopy::transmute!(seg));
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
    // A zero total length produces no segment at all (mlx5-datapath.md §1.8).
    if len == 0 {
        return Ok(pos);
    }
    let hdr: [u8; 4] = zerocopy::transmute!(InlineHdr::new(len as u32));
    ring.write4(pos, hdr);
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
                let seg = DataSeg::new(sge.length, sge.lkey, sge.addr);
                ring.write_segs::<16>(pos, &zerocopy::transmute!(seg));
                pos += 16;
            }
        }
    }
    Ok(pos)
}

/// A WQE being built in the SQ ring (low-level API). Segments are appended in order; the control
/// segment is written by [`finish`](Self::finish), which also records the WR id. Dropping an
/// unfinished builder abandons the WQE (nothing becomes visible).
#[derive(Debug)]
pub struct WqeBuilder<'q> {
    sq: &'q mut SendQueue,
    start: u32,
    ds: u32,
    data_segs: u32,
    inline_len: u32,
    inline_hdr: Option<u32>,
    opcode: SendOpcode,
    fm_ce_se: u8,
    imm: [u8; 4],
}

impl WqeBuilder<'_> {
    #[inline(always)]
    fn pos(&self) -> usize {
        (self.start as usize) * 64 + (self.ds as usize) * 16
    }

    /// Append whole segments (`N` a multiple of 16 bytes) at the current position.
    #[inline(always)]
    fn push_segs<const N: usize>(&mut self, seg: &[u8; N]) {
        let pos = self.pos();
        self.sq.ring.write_segs(pos, seg);
        self.ds += (N / 16) as u32;
    }

    /// Append a remote-address segment (WRITE, READ, atomics).
    #[inline]
    pub fn raddr(&mut self, raddr: u64, rkey: u32) -> &mut Self {
        self.push_segs::<16>(&zerocopy::transmute!(RaddrSeg::new(raddr, rkey)));
        self
    }

    /// Append an atomic segment (swap/add and compare operands).
    #[inline]
    pub fn atomic(&mut self, swap_add: u64, compare: u64) -> &mut Self {
        self.push_segs::<16>(&zerocopy::transmute!(AtomicSeg::new(swap_add, compare)));
        self
    }

    /// Append the UD address vector (`av` from an [`Ah`](crate::Ah)) with the destination QPN
    /// and Q_Key. Must come first, right after the control segment.
    #[inline]
    pub fn av(&mut self, av: &DatagramSeg, remote_qpn: u32, qkey: u32) -> &mut Self {
        let mut av = *av;
        av.set_dqpn(remote_qpn);
        av.set_qkey(qkey);
        let bytes: [u8; 48] = zerocopy::transmute!(av);
        self.push_segs(&bytes);
        self
    }

    /// Append a data (gather) segment. Zero-length SGEs are skipped (0 would mean 2 GiB).
    ///
    /// # Errors
    /// [`PostError::TooManySges`] past the queue's `max_send_sge`.
    #[inline]
    pub fn sge(&mut self, sge: &Sge) -> Result<&mut Self, PostError> {
        if sge.length == 0 {
            return Ok(self);
        }
        if self.data_segs >= self.sq.cfg.geo.max_gs || self.ds >= MAX_DS {
            return Err(PostError::TooManySges {
                n: self.data_segs as usize + 1,
                max: self.sq.cfg.geo.max_gs,
            });
        }
        self.data_segs += 1;
        self.push_segs::<16>(&zerocopy::transmute!(DataSeg::new(
            sge.length, sge.lkey, sge.addr
        )));
        Ok(self)
    }

    /// Append inline payload bytes (concatenated with earlier inline bytes of this WQE).
    ///
    /// # Errors
    /// [`PostError::InlineTooLarge`] when the WQE's inline total would exceed
    /// `max_inline_data`.
    #[inline]
    pub fn inline(&mut self, data: &[u8]) -> Result<&mut Self, PostError> {
        let total = self.inline_len as usize + data.len();
        if total > self.sq.cfg.geo.max_inline as usize {
            return Err(PostError::InlineTooLarge {
                len: total,
                max: self.sq.cfg.geo.max_inline,
            });
        }
        let hdr = self.inline_start();
        let pos = hdr as usize + 4 + self.inline_len as usize;
        self.sq.ring.write(pos, data);
        self.inline_len = total as u32;
        Ok(self)
    }

    fn inline_start(&mut self) -> u32 {
        match self.inline_hdr {
            Some(p) => p,
            None => {
                let p = self.pos() as u32;
                self.inline_hdr = Some(p);
                p
            }
        }
    }

    /// Finish the WQE: write the inline header (if any inline byte was pushed) and the control
    /// segment, record `wr_id`, advance the producer. The WQE is rung by the next [`SendQueue::ring`].
    #[inline]
    pub fn finish(mut self, wr_id: u64) {
        // An inline WR counts as inline for the BlueFlame policy even with 0 bytes (libmlx5
        // sets its `inl` flag from IBV_SEND_INLINE), but a zero total length produces no
        // segment at all (mlx5-datapath.md §1.8).
        if let Some(hdr) = self.inline_hdr {
            let len = self.inline_len;
            if len > 0 {
                let h: [u8; 4] = zerocopy::transmute!(InlineHdr::new(len));
                self.sq.ring.write4(hdr as usize, h);
                self.ds += (4 + len).div_ceil(16);
            }
        }
        let plan = Plan {
            opcode: self.opcode,
            imm: self.imm,
            inline: self.inline_hdr.is_some(),
        };
        let mut b = self.sq.batch();
        // `start` checked state and room.
        b.room = 1;
        b.commit(self.ds, plan, self.fm_ce_se, wr_id);
        let e = b.end();
        let sq = &mut *self.sq;
        sq.cur_post = e.cur_post;
        sq.head = e.head;
        sq.pend.n += 1;
        sq.stats.wqes += 1;
    }
}

/// The work-completion opcode a send opcode completes as.
pub(crate) fn wc_opcode_of(op: SendOpcode) -> WcOpcode {
    match op {
        SendOpcode::RDMA_WRITE | SendOpcode::RDMA_WRITE_IMM => WcOpcode::RDMA_WRITE,
        SendOpcode::RDMA_READ => WcOpcode::RDMA_READ,
        SendOpcode::ATOMIC_CS => WcOpcode::COMP_SWAP,
        SendOpcode::ATOMIC_FA => WcOpcode::FETCH_ADD,
        _ => WcOpcode::SEND,
    }
}

#[cfg(test)]
mod tests {
    //! WQE bytes and doorbells against the worked examples of mlx5-datapath.md §1.13, without a
    //! device: the UAR page is ordinary memory we can read back.
    use super::*;
    use crate::mem::uar::UarPage;
    use crate::mem::{DbRecPool, DmaBuf, fake};
    use mlx5_hw::types::Be32;
    use mlx5_hw::wqe::INLINE_SEG_FLAG;
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
        );
        sq.enabled = true;
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
        // ds = 1 is never BlueFlamed (mlx5-datapath.md §3.4).
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
            r.sq.shared.tail.store(r.sq.head, Ordering::Relaxed); // pretend completed
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
        r.sq.shared.tail.store(r.sq.head, Ordering::Relaxed);
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
        r.sq.shared.tail.store(r.sq.head, Ordering::Relaxed);
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
        assert_eq!(r.sq.shared.wr_id(1), 3);
    }

    #[test]
    fn geometry_follows_the_reference() {
        // UD, 1 SGE: align64(64 + 16) = 128 B, max_inline 60 (mlx5-datapath.md §2.2).
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
}
