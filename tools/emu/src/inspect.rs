//! The emulator's instruments, for diagnostics and tools: read-only views of the device's
//! state of one QP or CQ (`mlx5 diag --emu`): what the device knows about a queue and the
//! doorbell records as the device reads them from host memory at this moment; the switches
//! and readers of the device trace (`trace.rs`) and of the WQE record (`record.rs`). Nothing
//! here changes the device's state.

use crate::mem;
use crate::record::WqeRecord;
use crate::shared::Emulator;
use crate::trace::{Recorder as TraceRecorder, SqView, TraceEvent};

/// The device's view of one QP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QpView {
    /// QP number.
    pub qpn: u32,
    /// `ib_uverbs` QP type (2 RC, 3 UC, 4 UD).
    pub qp_type: u8,
    /// QP state (0 RESET, 1 INIT, 2 RTR, 3 RTS, 4 SQD, 5 SQE, 6 ERR).
    pub state: u8,
    /// Send queue size in WQEBBs.
    pub sq_wqe_cnt: u32,
    /// Receive queue size in WQEs.
    pub rq_wqe_cnt: u32,
    /// Free-running WQEBB counter of the next send WQE the device will execute (its consumer).
    pub sq_head: u32,
    /// Send producer index (16 bits) seen with the last doorbell.
    pub sq_rung: u16,
    /// Receive WQEs consumed by the device (free-running).
    pub rq_head: u32,
    /// Receive producer index (16 bits) last read from the doorbell record.
    pub rq_pi_seen: u16,
    /// Doorbell record word 0 (receive counter) as read now; `None` if unreadable.
    pub dbrec_rq: Option<u32>,
    /// Doorbell record word 1 (send counter) as read now; `None` if unreadable.
    pub dbrec_sq: Option<u32>,
    /// Send CQ number.
    pub send_cq: u32,
    /// Receive CQ number.
    pub recv_cq: u32,
    /// Connected remote QPN (RC/UC).
    pub dest_qpn: u32,
    /// Next send PSN.
    pub sq_psn: u32,
    /// Expected receive PSN.
    pub rq_psn: u32,
}

/// The device's view of one CQ.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CqView {
    /// CQ number.
    pub cqn: u32,
    /// Number of CQEs.
    pub ncqe: u32,
    /// 64 or 128.
    pub cqe_size: u32,
    /// CQEs written (free-running producer).
    pub pi: u32,
    /// Consumer index the device last read from the doorbell record.
    pub ci_seen: u32,
    /// Doorbell record word 0 (consumer counter, 24 bits) as read now.
    pub dbrec_ci: Option<u32>,
    /// Doorbell record word 1 (arm word) as read now.
    pub dbrec_arm: Option<u32>,
    /// The CQ overran and is in the error state.
    pub in_error: bool,
}

impl Emulator {
    /// The device's view of QP `qpn` on HCA `hca`, `None` if there is no such QP.
    pub fn inspect_qp(&self, hca: usize, qpn: u32) -> Option<QpView> {
        let w = self.shared.lock_quiet();
        let q = w.hcas.get(hca)?.qps.get(&qpn)?;
        Some(QpView {
            qpn: q.qpn,
            qp_type: q.qp_type,
            state: q.state,
            sq_wqe_cnt: q.sq_wqe_cnt,
            rq_wqe_cnt: q.rq_wqe_cnt,
            sq_head: q.sq_head,
            sq_rung: q.sq_rung,
            rq_head: q.rq_head,
            rq_pi_seen: q.rq_pi_seen,
            dbrec_rq: (q.db != 0).then(|| mem::read_be32(q.db).ok()).flatten(),
            dbrec_sq: (q.db != 0)
                .then(|| mem::read_be32(q.db.wrapping_add(4)).ok())
                .flatten(),
            send_cq: q.send_cq,
            recv_cq: q.recv_cq,
            dest_qpn: q.dest_qpn,
            sq_psn: q.sq_psn,
            rq_psn: q.rq_psn,
        })
    }

    /// The device's view of CQ `cqn` on HCA `hca`, `None` if there is no such CQ.
    pub fn inspect_cq(&self, hca: usize, cqn: u32) -> Option<CqView> {
        let w = self.shared.lock_quiet();
        let c = w.hcas.get(hca)?.cqs.get(&cqn)?;
        Some(CqView {
            cqn,
            ncqe: c.ncqe,
            cqe_size: c.cqe_size,
            pi: c.pi,
            ci_seen: c.ci_seen,
            dbrec_ci: (c.db != 0).then(|| mem::read_be32(c.db).ok()).flatten(),
            dbrec_arm: (c.db != 0)
                .then(|| mem::read_be32(c.db.wrapping_add(4)).ok())
                .flatten(),
            in_error: c.in_error,
        })
    }

    /// The CQE the device wrote (or would write) at free-running counter `k` of CQ `cqn`, read
    /// from the ring in host memory now; `None` if there is no such CQ or the ring is not
    /// readable.
    pub fn read_cqe(&self, hca: usize, cqn: u32, k: u32) -> Option<Vec<u8>> {
        let w = self.shared.lock_quiet();
        let c = w.hcas.get(hca)?.cqs.get(&cqn)?;
        if c.ncqe == 0 || c.buf == 0 {
            return None;
        }
        let slot = u64::from(k % c.ncqe);
        let addr = c
            .buf
            .checked_add(slot.checked_mul(u64::from(c.cqe_size))?)?;
        mem::read_vec(addr, c.cqe_size as usize).ok()
    }
}

impl Emulator {
    /// Turn the device trace on (clearing what was recorded) or off. While it is on, the
    /// link counters count too.
    pub fn trace(&self, on: bool) {
        let mut w = self.shared.lock_quiet();
        let link = w.trace.link;
        w.trace = TraceRecorder {
            on,
            link,
            active: on || link,
            started: on.then(std::time::Instant::now),
            seq: 0,
            events: Vec::new(),
        };
    }

    /// Count the link traffic (the link counters of [`Counters`](crate::Counters): MMIO writes, DMA reads and
    /// writes, WQE fetches, payload reads) from now on, or stop. Off by default, so that a
    /// device nobody measures pays one branch per hook.
    pub fn count_link(&self, on: bool) {
        let mut w = self.shared.lock_quiet();
        w.trace.link = on;
        w.trace.active = on || w.trace.on;
    }

    /// Take the events recorded so far (tracing stays as it is).
    pub fn take_trace(&self) -> Vec<TraceEvent> {
        std::mem::take(&mut self.shared.lock_quiet().trace.events)
    }

    /// Nanoseconds since tracing was turned on (0 when it is off): the time base of
    /// [`TraceEvent::wall_ns`], for stamping what a tool observes on the host's side.
    pub fn trace_clock(&self) -> u64 {
        self.shared.lock_quiet().trace.started.map_or(0, |s| {
            s.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64
        })
    }

    /// The device's view of its errors: the checks that failed (which key check, with the
    /// expected and the actual value; no receive WQE; no ACK; length), oldest first, the last
    /// [`FAILED_CHECKS_KEPT`](crate::model::checks::FAILED_CHECKS_KEPT). Recorded with tracing
    /// on or off (error paths only).
    pub fn failed_checks(&self) -> Vec<crate::model::checks::FailedCheck> {
        self.shared
            .lock_quiet()
            .checks
            .failed
            .iter()
            .cloned()
            .collect()
    }

    /// The emulated clock (ns): virtual in stepped mode.
    pub fn clock(&self) -> u64 {
        self.shared.lock_quiet().now()
    }

    /// The send queue of QP `qpn` on HCA `hca` as the device sees it (None if there is no
    /// such QP). Reads the doorbell record from host memory.
    pub fn sq_view(&self, hca: usize, qpn: u32) -> Option<SqView> {
        let w = self.shared.lock_quiet();
        let q = w.hcas.get(hca)?.qps.get(&qpn)?;
        let rd = |a: u64| mem::read_be32(a).unwrap_or(0);
        Some(SqView {
            sq_addr: q.sq_base,
            sq_wqebbs: q.sq_wqe_cnt,
            dbrec_addr: q.db,
            rq_dbrec: rd(q.db),
            sq_dbrec: rd(q.db + 4),
            sq_head: q.sq_head,
            state: u32::from(q.state),
        })
    }
}

impl Emulator {
    /// Start (`true`) or stop recording every fetched send WQE in memory; see
    /// [`Emulator::wqe_log`]. Stopping discards what was recorded.
    pub fn record_wqes(&self, on: bool) {
        let mut w = self.shared.lock();
        w.wqe_log.memory = on;
        if !on {
            w.wqe_log.records.clear();
        }
    }

    /// The send WQEs of HCA `hca` fetched since recording started, in fetch order.
    pub fn wqe_log(&self, hca: usize) -> Vec<WqeRecord> {
        let w = self.shared.lock();
        w.wqe_log
            .records
            .iter()
            .filter(|r| r.hca == hca)
            .cloned()
            .collect()
    }

    /// Append one line per fetched send WQE ([`WqeRecord::to_line`]) to the file at `path`
    /// (created if needed), from now on.
    ///
    /// # Errors
    /// The error of opening the file.
    pub fn log_wqes_to(&self, path: &std::path::Path) -> std::io::Result<()> {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        self.shared.lock().wqe_log.file = Some(f);
        Ok(())
    }
}
