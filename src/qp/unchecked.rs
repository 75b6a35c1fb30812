//! The unchecked tier's single-QP pollers: a CQ and the one queue whose completions it holds,
//! with the fence and QP-list checks of [`RawCq::next`](Iterator::next) replaced by a
//! contract and the consumer index published lazily (every half ring). Here, above both the
//! CQ and the queues, because each poller takes one of each.
//!
//! `unsafe` here is only the `unsafe fn` declarations of the tier (DESIGN.md §5) and the calls
//! to the queues' unchecked retires: no raw pointer.
#![allow(unsafe_code)]

use crate::cq::RawCq;

use super::{RecvQueue, SendQueue};

impl SendQueue {
    /// Unchecked tier, a single-QP send CQ: take the next CQE of `cq` if it is a successful
    /// requester CQE without scattered data, retire its WR and return its `wr_id`; `None`
    /// (and nothing taken) while the device owns the next entry or it is anything else (take
    /// that one with the safe [`RawCq::next`](Iterator::next)). The CQ's consumer index is
    /// published lazily, every half ring.
    ///
    /// # Safety
    /// - Every CQE in `cq` is of this queue's QP: `cq` is the send CQ of that QP only.
    /// - No CQE of an earlier life of the QP is left in `cq`: the QP was not reset (nor another
    ///   QP created or destroyed on `cq`) since a safe `next` or `Cq::poll` found `cq` empty.
    /// - At most half of `cq`'s entries are completions of outstanding WRs at any time (the
    ///   device may not run more than a ring past the published index).
    #[inline(always)]
    pub unsafe fn poll_unchecked(&mut self, cq: &mut RawCq) -> Option<u64> {
        let counter = cq.take_send_lazy()?;
        // SAFETY: a successful requester CQE of this queue's QP from its current life, taken
        // once (the caller's contract): it names a posted, unretired WR the device executed.
        Some(unsafe { self.retire_unchecked(counter) })
    }
}

impl SendQueue {
    /// [`poll_unchecked`](Self::poll_unchecked) of up to `max` CQEs in one call, `f` given
    /// each retired WR's `wr_id` in order; returns how many. The batch shape lets the
    /// compiler keep the ring's and the ledger's state in registers across the CQEs.
    ///
    /// # Safety
    /// As [`poll_unchecked`](Self::poll_unchecked).
    #[inline(always)]
    pub unsafe fn poll_batch_unchecked(
        &mut self,
        cq: &mut RawCq,
        max: usize,
        mut f: impl FnMut(u64),
    ) -> usize {
        let mut n = 0;
        while n < max {
            // SAFETY: the caller's contract is `poll_unchecked`'s.
            let Some(id) = (unsafe { self.poll_unchecked(cq) }) else {
                break;
            };
            f(id);
            n += 1;
        }
        n
    }
}

impl RecvQueue {
    /// Unchecked tier, a single-QP receive CQ: as
    /// [`SendQueue::poll_unchecked`](crate::SendQueue::poll_unchecked) for a successful SEND
    /// received into this queue without scattered data; its `wr_id` and byte count.
    ///
    /// # Safety
    /// As `SendQueue::poll_unchecked`, `cq` the receive CQ of this queue's QP only (no SRQ).
    #[inline(always)]
    #[allow(
        unsafe_code,
        reason = "the unchecked tier (DESIGN.md §5): a contract, no raw pointer"
    )]
    pub unsafe fn poll_unchecked(&mut self, cq: &mut RawCq) -> Option<(u64, u32)> {
        let (counter, len) = cq.take_recv_lazy()?;
        // SAFETY: a successful receive CQE of this queue from its current life, taken once (the
        // caller's contract).
        Some((unsafe { self.retire_unchecked(counter) }, len))
    }
}
