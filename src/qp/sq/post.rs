//! Verbs-shaped posting: the fused single-WQE SEND ([`SendQueue::post_send`] of one plain WR,
//! [`SendQueue::send_inline_now`]) and chains through a [`Batch`] that keeps the counters in
//! registers; both produce the builder's bytes.

use mlx5_hw::opcodes::SendOpcode;
use mlx5_hw::wqe::{AtomicSeg, RaddrSeg};

use crate::ledger::SqShared;
use crate::mem::wq::WqWriter;
use crate::mmio::barrier;
use crate::types::{QpState, QpType};
use crate::wr::{PostError, SendFlags, SendWr, Sge, WrOp};

use super::builder::{av_bytes, commit, data_seg_words, inline_hdr};
use super::*;

/// A send queue's hot state while a verbs `post_send` chain is built: the counters by value,
/// so that the compiler keeps them in registers across the chain instead of re-reading the
/// queue's fields after every store into the ring, and the read-only configuration by
/// reference. [`SendQueue::end_batch`] takes the counters back.
pub(super) struct Batch<'q> {
    pub(super) ring: WqWriter<'q>,
    pub(super) shared: &'q SqShared,
    pub(super) cfg: &'q SqConfig,
    pub(super) state: QpState,
    pub(super) qpn_word: u32,
    pub(super) credits: u32,
    pub(super) cur_post: u32,
    pub(super) head: u32,
    /// WQEBB counter of the last WQE built, and whether it is inline (for the doorbell).
    pub(super) last: u32,
    pub(super) last_inline: bool,
}

/// The counters at the end of a [`Batch`].
pub(super) struct BatchEnd {
    pub(super) cur_post: u32,
    pub(super) head: u32,
    pub(super) credits: u32,
    pub(super) last: u32,
    pub(super) last_inline: bool,
}

/// The payload of a WQE the fused path ([`SendQueue::fast_send`]) builds.
#[derive(Clone, Copy)]
pub(super) enum Fast<'a> {
    /// One inline buffer.
    Inline(&'a [u8]),
    /// One data segment.
    Sge(&'a Sge),
}

/// What a verbs-shaped WR's WQE carries besides its segments.
#[derive(Clone, Copy)]
pub(super) struct Plan {
    pub(super) opcode: SendOpcode,
    pub(super) imm: [u8; 4],
    /// The payload is `wr.inline` (not the gather list).
    pub(super) inline: bool,
}

impl Batch<'_> {
    #[inline(always)]
    pub(super) fn end(self) -> BatchEnd {
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
    pub(super) fn reserve(&mut self) -> Result<(), PostError> {
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
    pub(super) fn commit(&mut self, ds: u32, plan: Plan, fm_ce_se: u8, wr_id: u64) {
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
    pub(super) fn build(&mut self, wr: &SendWr<'_>) -> Result<(), PostError> {
        let cfg = self.cfg;
        // The usual traffic, SEND and SEND with immediate on a connected QP, stays in line and
        // needs no more checks than these; everything else takes the general path.
        let imm = match wr.op {
            WrOp::Send => [0; 4],
            WrOp::SendImm { imm } => imm,
            _ => return self.build_general(wr),
        };
        if !cfg.qp_type.is_plain_connected() {
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
    pub(super) fn build_general(&mut self, wr: &SendWr<'_>) -> Result<(), PostError> {
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
pub(super) fn plan_general(cfg: &SqConfig, wr: &SendWr<'_>) -> Result<Plan, PostError> {
    let qp_type = cfg.qp_type;
    if !matches!(qp_type, QpType::Rc | QpType::Uc | QpType::Ud) {
        // A verbs-shaped WR has no field yet for the transport segment these need (XRC SRQ
        // number, DC address, Ethernet headers): refused until their transports add it.
        return Err(PostError::BadOpcode);
    }
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
pub(super) fn write_general(
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
pub(super) fn write_inline(
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
pub(super) fn inline_too_large(cfg: &SqConfig, wr: &SendWr<'_>) -> PostError {
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
pub(super) fn write_payload(
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

impl SendQueue {
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
    pub(super) fn send_inline_general(
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
    pub(super) fn fast_send(
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
        if !q.cfg.qp_type.is_plain_connected() || q.credits == 0 {
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
    pub(super) fn post_fast(&mut self, wr: &SendWr<'_>) -> bool {
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
    pub(super) fn post_send_general(
        &mut self,
        wrs: &[SendWr<'_>],
    ) -> Result<(), (usize, PostError)> {
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
    pub(super) fn post_one(&mut self, wr: &SendWr<'_>) -> Option<Result<(), PostError>> {
        let (op, imm) = match wr.op {
            WrOp::Send => (SendOpcode::SEND, [0; 4]),
            WrOp::SendImm { imm } => (SendOpcode::SEND_IMM, imm),
            _ => return None,
        };
        if !self.q.cfg.qp_type.is_plain_connected() || wr.ud.is_some() {
            return None;
        }
        Some(self.post_one_send(wr, op, imm))
    }

    /// [`post_one`](Self::post_one) once the WR is known to be a connected SEND.
    #[inline(always)]
    pub(super) fn post_one_send(
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
    pub(super) fn batch(&mut self) -> Batch<'_> {
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
    pub(super) fn end_batch(&mut self, e: BatchEnd) {
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
