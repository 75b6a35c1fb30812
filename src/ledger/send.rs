//! The send queue's ledger: one record per WQEBB slot (the WR id, ordinal and opcode of the
//! WQE that starts there), the tail the poller moves, and the read-back of READ/atomic results
//! scattered into a CQE. The send queue writes it when it posts; the completion poller reads
//! it when a requester CQE names a `wqe_counter`.

use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use mlx5_hw::opcodes::{SendOpcode, WcStatus};
use mlx5_hw::wqe::DataSeg;

use crate::mem::scatter::MrTable;
use crate::mem::table::RingTable;
use crate::mem::wq::WqReader;
use crate::recorder::{QpRecorder, SqRetired};
use crate::wr::WcOpcode;

/// One entry of the send queue's bookkeeping table, indexed by WQEBB counter: what a
/// completion's `wqe_counter` finds in one step. Slots inside a longer WQE keep stale records of
/// older WRs (lower ordinals), so a WR's start is the slot holding its ordinal
/// ([`SqShared::find_start`], for reporting unsignaled WRs).
#[derive(Debug)]
pub(crate) struct SqSlot {
    /// Work-request id of the WR whose WQE's first WQEBB is this slot.
    wr_id: AtomicU64,
    /// WR ordinal of the WQE whose first WQEBB is this slot ([`NO_WR`] before any).
    ordinal: AtomicU32,
    /// [`SendOpcode`] of the WR whose WQE's first WQEBB is this slot (mapped to a
    /// [`WcOpcode`] only when an error or unsignaled completion needs it).
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
    /// The QP's flight recorder, once enabled (then `credits` stays 0, see `refill`).
    pub rec: OnceLock<Arc<QpRecorder>>,
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

impl SqScatter {
    /// The send ring read through `ring`, its WQEs' lkeys in protection domain `pd`.
    pub(crate) fn new(ring: WqReader, pd: u32, mrs: Arc<MrTable>) -> Self {
        Self { ring, pd, mrs }
    }
}

impl SqShared {
    /// Tables for `max_post` outstanding WRs on a ring of `wqe_cnt` (a power of two) WQEBBs.
    pub(crate) fn new(max_post: u32, wqe_cnt: u32, report_unsignaled: bool, qpn: u32) -> Self {
        // Every WR takes at least one WQEBB, so `max_post <= wqe_cnt` for real queues; the max
        // keeps the table large enough for both indices whatever the caller passes.
        let slots = RingTable::new(max_post.max(wqe_cnt) as usize, || SqSlot {
            wr_id: AtomicU64::new(0),
            ordinal: AtomicU32::new(NO_WR),
            op: AtomicU8::new(0),
        });
        Self {
            wr_mask: slots.len() as u32 - 1,
            slots,
            tail: AtomicU32::new(0),
            report_unsignaled,
            qpn,
            scatter: None,
            rec: OnceLock::new(),
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

    /// Record WR `ordinal` (id, send opcode) as the WQE starting at WQEBB counter
    /// `wqe_counter` (what posting does when it writes the control segment).
    #[inline(always)]
    pub(crate) fn record(&self, ordinal: u32, wqe_counter: u32, wr_id: u64, op: SendOpcode) {
        let s = self.slots.get(wqe_counter);
        s.wr_id.store(wr_id, Ordering::Relaxed);
        s.ordinal.store(ordinal, Ordering::Relaxed);
        s.op.store(op.0, Ordering::Relaxed);
    }

    /// Forget every record (the queue restarts at ordinal 0: QP reset), so that no stale
    /// record can match a new ordinal.
    pub(crate) fn clear_records(&self) {
        for i in 0..=self.wr_mask {
            self.slot(i).ordinal.store(NO_WR, Ordering::Relaxed);
        }
    }

    /// The WQEBB counter where WR `ordinal` starts: the slot holding its record, searched from
    /// counter `from` backwards (`back`, from `from - 1`) or forwards (from `from`) over at most
    /// one table's worth. The cold paths: reporting unsignaled WRs, dumps, tests. Records of
    /// WRs still outstanding are never overwritten, and stale records in the other slots hold
    /// lower ordinals, so the first match is the WR's (while ordinals do not wrap 2^32 within
    /// one ring).
    pub(crate) fn find_start(&self, ordinal: u32, from: u32, back: bool) -> Option<u32> {
        let mut c = from;
        for _ in 0..=self.wr_mask {
            if back {
                c = c.wrapping_sub(1);
            }
            if self.slot(c).ordinal.load(Ordering::Relaxed) == ordinal {
                return Some(c);
            }
            if !back {
                c = c.wrapping_add(1);
            }
        }
        None
    }

    /// The id of WR `ordinal`, its record found from counter 0 on (tests).
    #[cfg(test)]
    pub(crate) fn wr_id(&self, ordinal: u32) -> u64 {
        self.find_start(ordinal, 0, false)
            .map_or(0, |c| self.wr_id_at(c as u16))
    }

    /// The completion opcode of WR `ordinal`, as [`wr_id`](Self::wr_id) (tests).
    #[cfg(test)]
    pub(crate) fn wr_op(&self, ordinal: u32) -> WcOpcode {
        self.find_start(ordinal, 0, false)
            .map_or(WcOpcode::SEND, |c| self.wr_op_at(c as u16))
    }

    /// The id of the WR whose WQE starts at WQEBB counter `wqe_counter`.
    #[inline(always)]
    pub(crate) fn wr_id_at(&self, wqe_counter: u16) -> u64 {
        self.slot(u32::from(wqe_counter))
            .wr_id
            .load(Ordering::Relaxed)
    }

    /// The completion opcode of the WR whose WQE starts at WQEBB counter `wqe_counter`.
    #[inline(always)]
    pub(crate) fn wr_op_at(&self, wqe_counter: u16) -> WcOpcode {
        wc_opcode_of(SendOpcode(
            self.slot(u32::from(wqe_counter)).op.load(Ordering::Relaxed),
        ))
    }

    /// The WR ordinal of the WQE that starts at WQEBB counter `wqe_counter`.
    #[inline(always)]
    pub(crate) fn ordinal_at(&self, wqe_counter: u16) -> u32 {
        self.slot(u32::from(wqe_counter))
            .ordinal
            .load(Ordering::Relaxed)
    }
}

/// [`SqSlot::ordinal`] of a slot no WR has started at since the queue (re)started.
const NO_WR: u32 = u32::MAX;

/// The work-completion opcode a send opcode completes as.
pub(crate) const fn wc_opcode_of(op: SendOpcode) -> WcOpcode {
    match op {
        SendOpcode::RDMA_WRITE | SendOpcode::RDMA_WRITE_IMM => WcOpcode::RDMA_WRITE,
        SendOpcode::RDMA_READ => WcOpcode::RDMA_READ,
        SendOpcode::ATOMIC_CS => WcOpcode::COMP_SWAP,
        SendOpcode::ATOMIC_FA => WcOpcode::FETCH_ADD,
        _ => WcOpcode::SEND,
    }
}

/// What a requester completion of each send opcode (the CQE's byte 56) reports, one table
/// lookup instead of a branch ladder: bits 7:0 the [`WcOpcode`] ([`wc_opcode_of`]), bits
/// 15:8 a constant byte length (8 for atomics), bit 16 "the byte length is the CQE's byte
/// count" (RDMA READ).
pub(crate) static REQ_WC_BY_SEND_OP: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let op = SendOpcode(i as u8);
        let len = match op {
            SendOpcode::RDMA_READ => 1 << 16,
            SendOpcode::ATOMIC_CS | SendOpcode::ATOMIC_FA => 8 << 8,
            _ => 0,
        };
        t[i] = wc_opcode_of(op).0 | len;
        i += 1;
    }
    t
};

impl SqRetired for SqShared {
    fn retired(&self) -> u32 {
        self.tail.load(Ordering::Acquire)
    }

    fn start_before(&self, ordinal: u32, from: u32) -> Option<u32> {
        self.find_start(ordinal, from, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A WR's start is the slot holding its ordinal, never a stale record inside a longer WQE,
    /// and a reset queue forgets the records of its previous life (a stale record of the old
    /// WR 1 sat inside the new WR 0 and was found as the new WR 1).
    #[test]
    fn starts_are_found_past_stale_records_and_reset_forgets_them() {
        let sh = SqShared::new(8, 8, true, 1);
        for o in 0..4 {
            sh.record(o, o, 100 + u64::from(o), SendOpcode::SEND);
        }
        // The queue restarts: WR 0 takes WQEBBs 0 and 1, WR 1 starts at 2.
        sh.clear_records();
        sh.record(0, 0, 10, SendOpcode::SEND);
        sh.record(1, 2, 11, SendOpcode::RDMA_WRITE);
        assert_eq!(
            sh.find_start(1, 1, false),
            Some(2),
            "forward from inside WR 0"
        );
        assert_eq!(sh.find_start(0, 2, true), Some(0), "backward from WR 1");
        assert_eq!(sh.wr_id_at(2), 11);
        assert_eq!(sh.wr_op_at(2), WcOpcode::RDMA_WRITE);
        assert_eq!(sh.find_start(3, 2, true), None, "the old WR 3 is forgotten");
        // Records of other WRs are passed over.
        sh.record(4, 3, 14, SendOpcode::SEND);
        sh.record(2, 5, 12, SendOpcode::SEND);
        assert_eq!(sh.find_start(2, 3, false), Some(5));
    }
}
