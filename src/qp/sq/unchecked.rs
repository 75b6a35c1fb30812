//! The unchecked tier of the send queue (UCX's shape): `unsafe fn`s whose written contracts
//! replace the per-call checks of the safe API. One credit check per batch
//! ([`SendQueue::credits`]), the control segment from the queue's template (QP number word and
//! `fm_ce_se` table, fixed at creation), the BlueFlame decision taken at creation
//! ([`BfPolicy`]), and the counters in registers across a batch ([`SendQueue::unchecked`]
//! hands a closure an [`UncheckedBatch`] that holds them by value).
//!
//! What the contracts protect is the ring-ownership rule of `super` (a WQE is written only into
//! WQEBBs the device no longer owns, so the device never reads a half-written WQE and the
//! poller's scatter copy never reads one being overwritten) and the ledger (a record is
//! rewritten only after its WR retired). The bytes are the safe API's: the same encoders
//! ([`commit`], [`inline_hdr`], [`data_seg_words`]), so `tools/wqe-compare` covers both.
//!
//! `unsafe` here is only the `unsafe fn` declarations of the tier DESIGN.md §5 asks for and
//! the calls between them: no raw pointer, every store through the ring's writer
//! (`src/mem/wq.rs`), which keeps positions inside the ring whatever the counters say.
#![allow(unsafe_code)]

use mlx5_hw::opcodes::SendOpcode;
use mlx5_hw::wqe::RaddrSeg;

use crate::mmio::barrier;
use crate::wr::{SendFlags, Sge};

use super::builder::{commit, data_seg_words, inline_hdr};
use super::post::{Batch, Plan};
use super::*;

/// A batch of unchecked posts on one send queue: its counters by value (in registers) for the
/// closure of [`SendQueue::unchecked`], which takes them back and rings once.
pub struct UncheckedBatch<'q> {
    b: Batch<'q>,
}

impl core::fmt::Debug for UncheckedBatch<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("UncheckedBatch")
            .field("head", &self.b.head)
            .field("cur_post", &self.b.cur_post)
            .finish_non_exhaustive()
    }
}

impl SendQueue {
    /// The one credit check of a batch: how many WRs may be posted now, through any API, before
    /// the poller's tail has to be read again (0 outside RTS, SQD, SQE and ERR, or with the
    /// queue full). The unchecked calls' contract is "fewer WRs posted since this returned
    /// `n` than `n`".
    #[inline]
    pub fn credits(&mut self) -> u32 {
        let q = &mut self.q;
        if q.credits == 0 {
            q.refill();
        }
        q.credits
    }

    /// Run `f` on an [`UncheckedBatch`] of this queue, then ring once (the doorbell of
    /// [`ring`](Self::ring): BlueFlame for a single WQE as the queue's policy says, else the
    /// 8-byte doorbell). Safe in itself: what `f` posts is posted only through the batch's
    /// `unsafe fn`s, each with its contract. A panic inside `f` abandons its WQEs (nothing is
    /// rung or recorded as posted).
    #[inline(always)]
    pub fn unchecked<R>(&mut self, f: impl FnOnce(&mut UncheckedBatch<'_>) -> R) -> R {
        let mut u = UncheckedBatch { b: self.batch() };
        let r = f(&mut u);
        let e = u.b.end();
        self.end_batch(e);
        self.ring();
        r
    }

    /// Post one inline SEND of `data` and ring at once (BlueFlame as the queue's policy says):
    /// the WQE and doorbell of [`send_inline_now`](Self::send_inline_now) without its checks.
    ///
    /// # Safety
    /// - The queue holds a credit: fewer WRs were posted (through any API) since the last
    ///   [`credits`](Self::credits) returned `n` than `n`, and nothing reset the QP since.
    /// - The QP is RC or UC (a SEND needs no address vector).
    /// - `1 <= data.len() <= ` the queue's `max_inline` ([`SqGeometry`]).
    #[inline(always)]
    pub unsafe fn send_inline_unchecked(&mut self, data: &[u8], wr_id: u64, flags: SendFlags) {
        // SAFETY: the caller's contract is this function's.
        unsafe { self.inline_now(SendOpcode::SEND, None, data, wr_id, flags) }
    }

    /// Post one inline RDMA WRITE of `data` to `raddr`/`rkey` and ring at once: UCX's
    /// `put_short` shape (control, remote address and inline segments, BlueFlame).
    ///
    /// # Safety
    /// As [`send_inline_unchecked`](Self::send_inline_unchecked) (the QP RC or UC).
    #[inline(always)]
    pub unsafe fn write_inline_unchecked(
        &mut self,
        data: &[u8],
        raddr: u64,
        rkey: u32,
        wr_id: u64,
        flags: SendFlags,
    ) {
        // SAFETY: the caller's contract is this function's.
        unsafe {
            self.inline_now(
                SendOpcode::RDMA_WRITE,
                Some((raddr, rkey)),
                data,
                wr_id,
                flags,
            );
        }
    }

    /// The single inline WQE of the two calls above, rung at once.
    ///
    /// # Safety
    /// As [`send_inline_unchecked`](Self::send_inline_unchecked).
    #[inline(always)]
    unsafe fn inline_now(
        &mut self,
        op: SendOpcode,
        raddr: Option<(u64, u32)>,
        data: &[u8],
        wr_id: u64,
        flags: SendFlags,
    ) {
        let q = &mut self.q;
        let start = q.cur_post;
        let pos = start as usize * 64;
        let w = self.ring.ring_mut().writer();
        let mut at = pos + 16;
        if let Some((raddr, rkey)) = raddr {
            w.write_segs::<16>(at, &zerocopy::transmute!(RaddrSeg::new(raddr, rkey)));
            at += 16;
        }
        let len = data.len();
        // The caller's contract: `1 <= len <= max_inline`, inside the worst-case WQE
        // `sq_geometry` reserved, whose WQEBBs the credit makes ours (the writer takes
        // positions modulo the ring, so a WQE over the ring end wraps).
        if !w.write_short(at + 4, data) {
            w.write(at + 4, data);
        }
        w.write4(at, inline_hdr(len as u32));
        let ds = ((at - pos) as u32 >> 4) + ((len as u32 + 4 + 15) >> 4);
        q.credits = q.credits.wrapping_sub(1);
        let fm = q.cfg.fm_ce_se(flags);
        let w0 = commit(
            w, &q.shared, q.qpn_word, start, q.head, ds, op, fm, [0; 4], wr_id,
        );
        q.head = q.head.wrapping_add(1);
        let next = start.wrapping_add((ds + 3) >> 2);
        q.cur_post = next;
        q.stats.wqes += 1;
        let single = q.pend.rung == start;
        q.pend.rung = next;
        barrier::to_device();
        q.dbrec.word1().store_be32(next & 0xFFFF);
        barrier::wc_start();
        if single && q.bf.db.blueflame(&self.ring, pos, ds) {
            q.stats.bf_copies += 1;
        } else {
            q.bf.db.ring8(w0);
            q.stats.doorbells += 1;
        }
        barrier::wc_flush();
        q.bf.db.flip();
    }
}

impl UncheckedBatch<'_> {
    /// Append an inline SEND of `data` (rung when the batch ends).
    ///
    /// # Safety
    /// - The queue holds a credit for it: fewer WRs were posted (through any API, this batch
    ///   included) since the last [`SendQueue::credits`] returned `n` than `n`.
    /// - The QP is RC or UC.
    /// - `1 <= data.len() <= ` the queue's `max_inline`.
    #[inline(always)]
    pub unsafe fn send_inline(&mut self, data: &[u8], wr_id: u64, flags: SendFlags) {
        let b = &mut self.b;
        let pos = b.cur_post as usize * 64;
        // As `SendQueue::inline_now`: inside the reserved, credited worst-case WQE.
        if !b.ring.write_short(pos + 20, data) {
            b.ring.write(pos + 20, data);
        }
        let len = data.len() as u32;
        b.ring.write4(pos + 16, inline_hdr(len));
        let plan = Plan {
            opcode: SendOpcode::SEND,
            imm: [0; 4],
            inline: true,
        };
        let fm = b.cfg.fm_ce_se(flags);
        b.commit_unchecked(1 + ((len + 4 + 15) >> 4), plan, fm, wr_id);
    }

    /// Append a SEND of one data segment (rung when the batch ends).
    ///
    /// # Safety
    /// As [`send_inline`](Self::send_inline) for the credit and the QP type; `sge.length` is
    /// not 0 (a data segment of 0 bytes means 2 GiB) and the queue was created with
    /// `max_send_sge >= 1`.
    #[inline(always)]
    pub unsafe fn send_sge(&mut self, sge: &Sge, wr_id: u64, flags: SendFlags) {
        let b = &mut self.b;
        let pos = b.cur_post as usize * 64;
        let (lo, hi) = data_seg_words(sge.length, sge.lkey, sge.addr);
        b.ring.store16(pos + 16, lo, hi);
        let plan = Plan {
            opcode: SendOpcode::SEND,
            imm: [0; 4],
            inline: false,
        };
        let fm = b.cfg.fm_ce_se(flags);
        b.commit_unchecked(2, plan, fm, wr_id);
    }

    /// Append an inline RDMA WRITE of `data` to `raddr`/`rkey` (rung when the batch ends).
    ///
    /// # Safety
    /// As [`send_inline`](Self::send_inline).
    #[inline(always)]
    pub unsafe fn write_inline(
        &mut self,
        data: &[u8],
        raddr: u64,
        rkey: u32,
        wr_id: u64,
        flags: SendFlags,
    ) {
        let b = &mut self.b;
        let pos = b.cur_post as usize * 64;
        b.ring
            .write_segs::<16>(pos + 16, &zerocopy::transmute!(RaddrSeg::new(raddr, rkey)));
        if !b.ring.write_short(pos + 36, data) {
            b.ring.write(pos + 36, data);
        }
        let len = data.len() as u32;
        b.ring.write4(pos + 32, inline_hdr(len));
        let plan = Plan {
            opcode: SendOpcode::RDMA_WRITE,
            imm: [0; 4],
            inline: true,
        };
        let fm = b.cfg.fm_ce_se(flags);
        b.commit_unchecked(2 + ((len + 4 + 15) >> 4), plan, fm, wr_id);
    }
}

impl Batch<'_> {
    /// [`commit`](Batch::commit) with the credit taken on the caller's word (no underflow
    /// check: the unchecked tier's contract holds the credit).
    #[inline(always)]
    fn commit_unchecked(&mut self, ds: u32, plan: Plan, fm_ce_se: u8, wr_id: u64) {
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
        self.credits = self.credits.wrapping_sub(1);
        self.last = start;
        self.last_inline = plan.inline;
    }
}

impl SendQueue {
    /// Low-level completion without the check of [`retire`](Self::retire): retires the WR
    /// whose WQE starts at `wqe_counter` and every earlier one; returns its `wr_id`.
    ///
    /// # Safety
    /// `wqe_counter` is the `wqe_counter` of a successful requester CQE of this queue, taken
    /// from its CQ after the QP's last reset, and not retired before (the CQE names a posted,
    /// unretired WR, which the device executed).
    #[inline(always)]
    pub unsafe fn retire_unchecked(&mut self, wqe_counter: u16) -> u64 {
        let sh = &self.q.shared;
        let ord = sh.ordinal_at(wqe_counter);
        sh.tail.store(ord.wrapping_add(1), Ordering::Release);
        sh.wr_id_at(wqe_counter)
    }
}
