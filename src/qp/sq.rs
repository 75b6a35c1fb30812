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

use mlx5_hw::opcodes::SendOpcode;
use mlx5_hw::wqe::{
    AtomicSeg, CtrlSeg, DataSeg, DatagramSeg, FM_CE_SE_CQ_UPDATE, FM_CE_SE_FENCE,
    FM_CE_SE_SOLICITED, InlineHdr, MAX_DS, RaddrSeg,
};

use crate::QpType;
use crate::mem::DbRec;
use crate::mem::uar::UarReg;
use crate::mem::wq::WqRing;
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

/// State shared between a send queue and the completion poller(s).
#[derive(Debug)]
pub(crate) struct SqShared {
    /// Work-request ids by WR ordinal (`ordinal & wr_mask`).
    pub wr_ids: Box<[AtomicU64]>,
    /// [`WcOpcode`] of each WR by ordinal, as a byte.
    pub wr_ops: Box<[AtomicU8]>,
    /// WR ordinal of the WQE whose first WQEBB is at each SQ slot.
    pub wqe_head: Box<[AtomicU32]>,
    /// WRs retired by completions (free-running); written only by the poller.
    pub tail: AtomicU32,
    pub wqe_mask: u32,
    pub wr_mask: u32,
    pub report_unsignaled: bool,
    pub qpn: u32,
}

impl SqShared {
    /// Tables for `max_post` outstanding WRs on a ring of `wqe_cnt` (a power of two) WQEBBs.
    pub(crate) fn new(max_post: u32, wqe_cnt: u32, report_unsignaled: bool, qpn: u32) -> Self {
        let wr_slots = max_post.max(1).next_power_of_two() as usize;
        Self {
            wr_ids: (0..wr_slots).map(|_| AtomicU64::new(0)).collect(),
            wr_ops: (0..wr_slots).map(|_| AtomicU8::new(0)).collect(),
            wqe_head: (0..wqe_cnt).map(|_| AtomicU32::new(0)).collect(),
            tail: AtomicU32::new(0),
            wqe_mask: wqe_cnt - 1,
            wr_mask: wr_slots as u32 - 1,
            report_unsignaled,
            qpn,
        }
    }

    /// Record WR `ordinal` (id, opcode) as the WQE starting at WQEBB counter `wqe_counter`.
    #[inline]
    pub(crate) fn record(&self, ordinal: u32, wqe_counter: u32, wr_id: u64, op: WcOpcode) {
        let wi = (ordinal & self.wr_mask) as usize;
        self.wr_ids[wi].store(wr_id, Ordering::Relaxed);
        self.wr_ops[wi].store(op.0 as u8, Ordering::Relaxed);
        self.wqe_head[(wqe_counter & self.wqe_mask) as usize].store(ordinal, Ordering::Relaxed);
    }

    #[inline]
    pub(crate) fn wr_id(&self, ordinal: u32) -> u64 {
        self.wr_ids[(ordinal & self.wr_mask) as usize].load(Ordering::Relaxed)
    }

    #[inline]
    pub(crate) fn wr_op(&self, ordinal: u32) -> WcOpcode {
        WcOpcode(u32::from(
            self.wr_ops[(ordinal & self.wr_mask) as usize].load(Ordering::Relaxed),
        ))
    }

    /// The WR ordinal of the WQE that starts at WQEBB counter `wqe_counter`.
    #[inline]
    pub(crate) fn ordinal_at(&self, wqe_counter: u16) -> u32 {
        self.wqe_head[(u32::from(wqe_counter) & self.wqe_mask) as usize].load(Ordering::Relaxed)
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
    qpn: u32,
    qp_type: QpType,
    /// Free-running WQEBB producer counter.
    cur_post: u32,
    /// Free-running count of WRs built.
    head: u32,
    shared: Arc<SqShared>,
    geo: SqGeometry,
    sig_all: bool,
    /// Posting allowed (RTS, SQD, SQE, ERR).
    pub(crate) enabled: bool,
    dbrec: Arc<DbRec>,
    bf: Bfreg,
    policy: BfPolicy,
    // Pending ring: WQEs built since the last doorbell.
    pend_n: u32,
    pend_last: u32,
    pend_last_ds: u32,
    pend_inline: bool,
    /// The first 8 bytes of the last finished WQE's control segment (the 8-byte doorbell).
    pend_head: [u8; 8],
    stats: SqStats,
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
    ) -> Self {
        let shared = Arc::new(SqShared::new(
            geo.max_post,
            geo.wqe_cnt,
            report_unsignaled,
            qpn,
        ));
        // PANIC: `sq_geometry` makes `wqe_cnt` a power of two no larger than `max_send_wqebb`
        // (at most 2^16 on any device), well inside `RingSize`'s range.
        let size = RingSize::at_least(geo.wqe_cnt).expect("SQ size is a small power of two");
        Self {
            ring,
            size,
            qpn,
            qp_type,
            cur_post: 0,
            head: 0,
            shared,
            geo,
            sig_all,
            enabled: false,
            dbrec,
            bf,
            policy,
            pend_n: 0,
            pend_last: 0,
            pend_last_ds: 0,
            pend_inline: false,
            pend_head: [0; 8],
            stats: SqStats::default(),
        }
    }

    pub(crate) fn shared(&self) -> &Arc<SqShared> {
        &self.shared
    }

    /// The geometry (capacity, SGE and inline limits).
    pub fn geometry(&self) -> SqGeometry {
        self.geo
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
        self.policy = policy;
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
        self.geo.max_post.saturating_sub(self.outstanding())
    }

    /// Low-level completion: the requester CQE for the WQE at `wqe_counter` (its `wqe_counter`
    /// field) was consumed by the caller's own poll loop ([`Cq::next_cqe`](crate::Cq::next_cqe)).
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
        self.pend_n = 0;
        self.pend_inline = false;
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
        if !self.enabled {
            return Err(PostError::BadState {
                state: crate::QpState::Reset,
            });
        }
        let outstanding = self.outstanding();
        if outstanding >= self.geo.max_post {
            return Err(PostError::Full {
                outstanding,
                capacity: self.geo.max_post,
            });
        }
        let mut fm_ce_se = 0u8;
        if self.sig_all || flags.contains(SendFlags::SIGNALED) {
            fm_ce_se |= FM_CE_SE_CQ_UPDATE;
        }
        if flags.contains(SendFlags::SOLICITED) {
            fm_ce_se |= FM_CE_SE_SOLICITED;
        }
        if flags.contains(SendFlags::FENCE) {
            fm_ce_se |= FM_CE_SE_FENCE;
        }
        Ok(WqeBuilder {
            start: self.cur_post,
            ds: 1,
            data_segs: 0,
            inline_len: 0,
            inline_hdr: None,
            opcode,
            fm_ce_se,
            imm,
            sq: self,
        })
    }

    /// Ring the doorbell for every WQE finished since the last ring (one doorbell per batch).
    /// Does nothing if there is none.
    #[inline]
    pub fn ring(&mut self) {
        if self.pend_n == 0 {
            return;
        }
        let last = self.pend_last;
        let ds = self.pend_last_ds;
        // (`ds > 1` and `ds * 16 <= half` also mean the register has BlueFlame halves.)
        let use_bf = self.pend_n == 1
            && ds > 1
            && (ds as usize) * 16 <= self.bf.half
            && match self.policy {
                BfPolicy::PreferBf => true,
                BfPolicy::InlineOnly => self.pend_inline,
                BfPolicy::AlwaysDoorbell => false,
            };
        self.pend_n = 0;
        self.pend_inline = false;

        // 1. WQE bytes before the doorbell record.
        barrier::to_device();
        // 2. SQ record (word 1) = next free WQEBB counter, low 16 bits.
        self.dbrec.word1().store_be32(self.cur_post & 0xFFFF);
        // 3. Record before the write-combining MMIO store.
        barrier::wc_start();
        let pos = (self.size.slot(last) as usize) * 64;
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
            // 4b. The first 8 bytes of the last ctrl segment, verbatim (kept by `finish`).
            self.bf
                .reg
                .mmio()
                .store_raw64(self.bf.offset, self.pend_head);
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
        for (i, wr) in wrs.iter().enumerate() {
            if let Err(e) = self.build(wr) {
                self.ring();
                return Err((i, e));
            }
        }
        self.ring();
        Ok(())
    }

    #[inline]
    fn build(&mut self, wr: &SendWr<'_>) -> Result<(), PostError> {
        let qp_type = self.qp_type;
        let (opcode, imm) = match (wr.op, qp_type) {
            (WrOp::Send, _) => (SendOpcode::SEND, [0; 4]),
            (WrOp::SendImm { imm }, _) => (SendOpcode::SEND_IMM, imm),
            (WrOp::SendInv { rkey }, QpType::Rc | QpType::Uc) => {
                (SendOpcode::SEND_INVAL, rkey.to_be_bytes())
            }
            (WrOp::Write { .. }, QpType::Rc | QpType::Uc) => (SendOpcode::RDMA_WRITE, [0; 4]),
            (WrOp::WriteImm { imm, .. }, QpType::Rc | QpType::Uc) => {
                (SendOpcode::RDMA_WRITE_IMM, imm)
            }
            (WrOp::Read { .. }, QpType::Rc) => (SendOpcode::RDMA_READ, [0; 4]),
            (WrOp::CompareSwap { .. }, QpType::Rc) => (SendOpcode::ATOMIC_CS, [0; 4]),
            (WrOp::FetchAdd { .. }, QpType::Rc) => (SendOpcode::ATOMIC_FA, [0; 4]),
            _ => return Err(PostError::BadOpcode),
        };
        if (qp_type == QpType::Ud) != wr.ud.is_some() {
            return Err(PostError::BadDestination);
        }
        if opcode == SendOpcode::RDMA_READ && !wr.inline.is_empty() {
            // READ data flows into local memory: there is nothing to inline.
            return Err(PostError::BadOpcode);
        }
        if wr.sg_list.len() > self.geo.max_gs as usize && wr.inline.is_empty() {
            return Err(PostError::TooManySges {
                n: wr.sg_list.len(),
                max: self.geo.max_gs,
            });
        }
        let mut w = self.start(opcode, wr.flags, imm)?;
        if let Some(ud) = wr.ud {
            w.av(ud.ah.av(), ud.remote_qpn, ud.remote_qkey);
        }
        match wr.op {
            WrOp::Write { raddr, rkey }
            | WrOp::WriteImm { raddr, rkey, .. }
            | WrOp::Read { raddr, rkey } => {
                w.raddr(raddr, rkey);
            }
            WrOp::CompareSwap {
                raddr,
                rkey,
                compare,
                swap,
            } => {
                w.raddr(raddr, rkey);
                w.atomic(swap, compare);
            }
            WrOp::FetchAdd { raddr, rkey, add } => {
                w.raddr(raddr, rkey);
                w.atomic(add, 0);
            }
            _ => {}
        }
        let atomic = matches!(wr.op, WrOp::CompareSwap { .. } | WrOp::FetchAdd { .. });
        if atomic {
            let sge = wr.sg_list.first().ok_or(PostError::BadAtomicSge)?;
            if sge.length < 8 {
                return Err(PostError::BadAtomicSge);
            }
            w.sge(&Sge { length: 8, ..*sge })?;
        } else if !wr.inline.is_empty() {
            let total: usize = wr.inline.iter().map(|s| s.len()).sum();
            if total > w.sq.geo.max_inline as usize {
                return Err(PostError::InlineTooLarge {
                    len: total,
                    max: w.sq.geo.max_inline,
                });
            }
            for s in wr.inline {
                w.inline(s)?;
            }
        } else {
            for s in wr.sg_list {
                w.sge(s)?;
            }
        }
        w.finish(wr.wr_id);
        Ok(())
    }
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
        if self.data_segs >= self.sq.geo.max_gs || self.ds >= MAX_DS {
            return Err(PostError::TooManySges {
                n: self.data_segs as usize + 1,
                max: self.sq.geo.max_gs,
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
        if total > self.sq.geo.max_inline as usize {
            return Err(PostError::InlineTooLarge {
                len: total,
                max: self.sq.geo.max_inline,
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
            self.sq.pend_inline = true;
            let len = self.inline_len;
            if len > 0 {
                let h: [u8; 4] = zerocopy::transmute!(InlineHdr::new(len));
                self.sq.ring.write4(hdr as usize, h);
                self.ds += (4 + len).div_ceil(16);
            }
        }
        let sq = &mut *self.sq;
        let ds = self.ds;
        let ctrl = CtrlSeg::new(
            self.opcode,
            0,
            (self.start & 0xFFFF) as u16,
            sq.qpn,
            ds as u8,
            self.fm_ce_se,
            0,
        )
        .with_imm_bytes(self.imm);
        let ctrl: [u8; 16] = zerocopy::transmute!(ctrl);
        sq.ring.write_segs(self.start as usize * 64, &ctrl);
        sq.pend_head.copy_from_slice(&ctrl[..8]);
        let ord = sq.head;
        sq.shared
            .record(ord, self.start, wr_id, wc_opcode_of(self.opcode));
        sq.head = ord.wrapping_add(1);
        sq.cur_post = self.start.wrapping_add(ds.div_ceil(4));
        sq.pend_n += 1;
        sq.pend_last = self.start;
        sq.pend_last_ds = ds;
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
