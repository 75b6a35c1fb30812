//! Retransmission and timers: go-back-N from a PSN, the ACK timeout with its retry count,
//! RNR back-off, and the next deadline (for stepped mode's virtual time).

#[allow(clippy::wildcard_imports)]
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
}

/// Go back to `from`: everything unacknowledged from that PSN on is sent again (through
/// the window). A READ whose span reaches `from` is re-requested whole.
pub(super) fn retransmit(w: &mut World, hca: usize, qpn: u32, from: u32) {
    let Some(q) = w.hcas[hca].qps.get_mut(&qpn) else {
        return;
    };
    let mut start = from;
    for o in q.rc.req.outstanding.iter_mut() {
        if o.done || psn_before(o.last_psn, from) || !o.is_read_like {
            continue;
        }
        let part = if o.packets.first().is_some_and(|p| p.atomic.is_some()) || o.read_mtu == 0 {
            // An atomic is asked again whole.
            o.read_buf.clear();
            o.read_next = o.psn;
            o.psn
        } else {
            // A READ resumes at its first missing response, as IB requesters do: a new
            // request with that PSN for the rest of the current part (the responder serves
            // it like a duplicate, from the adjusted address).
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
            read_next
        };
        if psn_before(part, start) {
            start = part;
        }
    }
    q.rc.req.tx_next = Some(start);
    pump(w, hca, qpn);
}

pub(super) fn run_timers(w: &mut World) -> usize {
    let now = w.now();
    let mut work = 0;
    for_each_qp(w, |w, hca, qpn| {
        let Some(q) = w.hcas[hca].qps.get_mut(&qpn) else {
            return;
        };
        if q.qp_type != qpt::RC || q.state != qps::RTS {
            return;
        }
        if let Some(t) = q.rc.timer.rnr_wait_until.filter(|&t| t <= now) {
            let _ = t;
            q.rc.timer.rnr_wait_until = None;
            q.rc.timer.deadline = transport::ack_timeout_ns(q.timeout).map(|t| now + t);
            let from = q.rc.timer.rnr_from;
            retransmit(w, hca, qpn, from);
            work += 1;
            return;
        }
        if q.rc.timer.deadline.is_some_and(|d| d <= now) {
            work += 1;
            if q.rc.req.outstanding.iter().all(|o| o.done) {
                q.rc.timer.deadline = None;
                return;
            }
            w.hcas[hca].counters.local_ack_timeout_err += 1;
            let q = w.hcas[hca].qps.get_mut(&qpn).expect("exists");
            if q.rc.retries_left == 0 {
                let front =
                    q.rc.req
                        .outstanding
                        .iter()
                        .find(|o| !o.done)
                        .map(|o| (o.wqe_idx, o.opcode));
                if let Some((idx, opc)) = front {
                    retire(w, hca, qpn);
                    drop_outstanding_until(w, hca, qpn, idx);
                    requester_error(w, hca, qpn, idx, opc, Syndrome::TRANSPORT_RETRY_EXC);
                }
                return;
            }
            q.rc.retries_left -= 1;
            q.rc.timer.deadline = transport::ack_timeout_ns(q.timeout).map(|t| now + t);
            let first =
                q.rc.req
                    .outstanding
                    .iter()
                    .find(|o| !o.done)
                    .map_or(0, |o| o.psn);
            // Resume after the highest acknowledged PSN when that lies inside the message.
            let from = match q.rc.req.acked.map(|a| (a + 1) & 0xff_ffff) {
                Some(next) if psn_before(first, next) => next,
                _ => first,
            };
            retransmit(w, hca, qpn, from);
        }
    });
    work
}

pub(super) fn next_deadline(w: &World) -> Option<u64> {
    let wire = w
        .wire
        .queue
        .iter()
        .map(|(t, _)| *t)
        .chain(w.outbox.iter().map(|o| o.due))
        .min();
    let timers = w
        .hcas
        .iter()
        .flat_map(|h| h.qps.values())
        .filter(|q| q.state == qps::RTS)
        .flat_map(|q| [q.rc.timer.deadline, q.rc.timer.rnr_wait_until])
        .flatten()
        .min();
    match (wire, timers) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
