//! Retransmission and timers: go-back-N from a PSN, the ACK timeout with its retry count,
//! RNR back-off, and the next deadline (for stepped mode's virtual time).

// The stages share the device's imports and one another's `pub(super)` items (device/mod.rs).
use super::*;

/// The timers of one RC QP.
#[derive(Clone, Debug, Default)]
pub(crate) struct TimerState {
    /// When the ACK timeout expires.
    pub(super) deadline: Option<u64>,
    /// Time before which no retransmission happens (RNR back-off).
    pub(super) rnr_wait_until: Option<u64>,
    /// PSN from which to retransmit when `rnr_wait_until` expires.
    pub(super) rnr_from: u32,
    /// When the requester last made progress (or started waiting): threaded mode fails a
    /// request with RETRY_EXC only when its retries are used up AND this is longer ago
    /// than the longest timeout the IB specification allows for them (see
    /// [`retry_budget_ns`]).
    pub(super) silent_since: u64,
}

/// Threaded mode: how long a requester must have heard nothing before its retries can be
/// exhausted: `retry_cnt + 1` timeouts of four times the configured one, the upper end of
/// the range IBA allows a transport timer (the configured value to four times it). In the
/// emulator the peer's HCA is a thread of another process, which stops whenever that
/// process is not scheduled (on a loaded 2-core machine, seen for up to ~1 s); a real HCA
/// answers regardless of its host. Retransmissions still go out at the configured timeout;
/// only the verdict waits. Stepped mode (virtual time, no scheduling) fails after exactly
/// `retry_cnt + 1` timeouts.
pub(super) fn retry_budget_ns(timeout: u8, retry_cnt: u8) -> u64 {
    transport::ack_timeout_ns(timeout).map_or(0, |t| t * 4 * (u64::from(retry_cnt) + 1))
}

/// Go back N: everything from the oldest PSN still needed is sent again (through the
/// window): a READ resumes at its first missing response (a new request for the rest of its
/// current part, which the responder serves like a duplicate, from the adjusted address),
/// an atomic is asked again whole (the responder answers it from its replay state), a
/// SEND/WRITE from its first unacknowledged packet.
pub(super) fn retransmit(w: &mut World, hca: usize, qpn: u32) {
    let Some(q) = w.hcas[hca].qps.get_mut(&qpn) else {
        return;
    };
    let mut start = None;
    for o in q.rc.req.outstanding.iter_mut() {
        if o.done || o.error.is_some() {
            continue;
        }
        if o.is_read_like {
            if o.packets.first().is_some_and(|p| p.atomic.is_some()) || o.read_mtu == 0 {
                o.read_buf.clear();
                o.read_next = o.psn;
            } else {
                let got = o.read_buf.len() as u64;
                let part_bytes = u64::from(TX_WINDOW) * u64::from(o.read_mtu);
                let k = (got / part_bytes) as usize;
                let end = ((k as u64 + 1) * part_bytes).min(u64::from(o.len));
                let read_next = o.read_next;
                if let Some(p) = o.packets.get_mut(k) {
                    p.psn = read_next;
                    if let Some(r) = p.reth.as_mut() {
                        r.va = o.read_va.wrapping_add(got);
                        r.len = (end - got) as u32;
                    }
                }
            }
        }
        if start.is_none() {
            let mut s = resume_point(o);
            if !o.is_read_like {
                if let Some(a) = q.rc.req.acked.map(|a| (a + 1) & 0xff_ffff) {
                    if psn_before(s, a) && !psn_before(o.last_psn, a) {
                        s = a;
                    }
                }
            }
            start = Some(s);
        }
    }
    q.rc.req.tx_next = start;
    pump(w, hca, qpn);
}

pub(super) fn run_timers(w: &mut World) -> usize {
    let now = w.now();
    let mut work = 0;
    for_each_qp(w, |w, hca, qpn| {
        let Some(q) = w.hcas[hca].qps.get_mut(&qpn) else {
            return;
        };
        if q.qp_type != qpt::RC || !matches!(q.state, qps::RTS | qps::SQD) {
            return;
        }
        if q.rc.timer.rnr_wait_until.is_some_and(|t| t <= now) {
            q.rc.timer.rnr_wait_until = None;
            q.rc.timer.deadline = transport::ack_timeout_ns(q.timeout).map(|t| now + t);
            q.rc.req.restarted_at = None;
            retransmit(w, hca, qpn);
            work += 1;
            return;
        }
        if q.rc.timer.deadline.is_none_or(|d| d > now) {
            return;
        }
        work += 1;
        let Some(first) =
            q.rc.req
                .outstanding
                .iter()
                .position(|o| !o.done && o.error.is_none())
        else {
            q.rc.timer.deadline = None;
            return;
        };
        w.hcas[hca].counters.local_ack_timeout_err += 1;
        let q = w.hcas[hca].qps.get_mut(&qpn).expect("exists");
        let threaded = w.cfg.mode == RunMode::Threaded;
        let silent = now.saturating_sub(q.rc.timer.silent_since);
        let verdict = !threaded || silent >= retry_budget_ns(q.timeout, q.retry_cnt);
        if q.rc.retries_left == 0 && verdict {
            // Everything before the oldest waiting request is complete: it fails, the
            // rest is flushed behind it.
            q.rc.req.outstanding[first].error = Some(Syndrome::TRANSPORT_RETRY_EXC);
            q.rc.timer.deadline = None;
            retire(w, hca, qpn);
            return;
        }
        q.rc.retries_left = q.rc.retries_left.saturating_sub(1);
        q.rc.timer.deadline = transport::ack_timeout_ns(q.timeout).map(|t| now + t);
        q.rc.req.restarted_at = None;
        retransmit(w, hca, qpn);
    });
    work
}

/// The earliest time at which the device has something timed to do: a packet in flight
/// due for delivery, a datagram due to be sent, an ACK timeout or an RNR back-off ending.
/// The same time base as [`World::now`] (virtual nanoseconds in stepped mode). None:
/// nothing is timed; only a doorbell, an arm or an arriving packet brings work.
pub(crate) fn next_deadline(w: &World) -> Option<u64> {
    let wire = w
        .wire
        .queue
        .iter()
        .map(|(t, _)| *t)
        .chain(w.outbox.iter().map(|o| o.due))
        .chain(super::raw::pacing_deadline(w))
        .chain(super::raw::held_deadline(w))
        .min();
    let timers = w
        .hcas
        .iter()
        .flat_map(|h| h.qps.values())
        .filter(|q| matches!(q.state, qps::RTS | qps::SQD))
        .flat_map(|q| [q.rc.timer.deadline, q.rc.timer.rnr_wait_until])
        .flatten()
        .min();
    let timers = match (timers, crate::kernel::ucma::next_deadline(w)) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    match (wire, timers) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
