//! The RC requester: PSN assignment and segmentation, the outstanding requests, the
//! transmit window, responses (ACK/NAK, READ data, atomic results) and in-order retirement.

#[allow(clippy::wildcard_imports)]
use super::*;

/// The requester's state of one RC QP.
#[derive(Clone, Debug, Default)]
pub(crate) struct ReqState {
    /// Sent, not yet completed requests, in PSN (= WQE) order.
    pub(super) outstanding: VecDeque<Outstanding>,
    /// The highest PSN acknowledged so far.
    pub(super) acked: Option<u32>,
    /// The next PSN to transmit (None: everything posted is on the wire).
    pub(super) tx_next: Option<u32>,
}

/// One outstanding RC request (sent, not yet acknowledged/answered).
#[derive(Clone, Debug)]
pub(crate) struct Outstanding {
    /// First and last PSN of the request (a READ spans its response packets).
    pub(super) psn: u32,
    pub(super) last_psn: u32,
    pub(super) wqe_idx: u16,
    pub(super) opcode: u8,
    pub(super) signaled: bool,
    /// The request packets, for retransmission.
    pub(super) packets: Packets,
    /// Local scatter list for READ/atomic responses: (addr, len) already translated.
    pub(super) local: Sgl,
    pub(super) len: u32,
    pub(super) done: bool,
    pub(super) is_read_like: bool,
    /// READ/atomic: the data returned so far, and the next response PSN expected.
    pub(super) read_buf: Vec<u8>,
    pub(super) read_next: u32,
    /// READ: the path MTU its responses come in (0 for other requests) and the remote
    /// address of its first byte, to resume after a lost response.
    pub(super) read_mtu: u32,
    pub(super) read_va: u64,
}

pub(super) fn post_request(
    w: &mut World,
    hca: usize,
    qpn: u32,
    wqe: &Wqe<'_>,
    pkt: Packet,
    local: Sgl,
    len: u32,
) {
    let now = w.now();
    let q = w.hcas[hca]
        .qps
        .get_mut(&qpn)
        .expect("caller checked the QP");
    let qt = q.qp_type;
    if pkt.opcode == 0xFF {
        // NOP: no packet; completes in order behind outstanding requests.
        if qt == qpt::RC && !q.rc.req.outstanding.is_empty() {
            let psn = q.sq_psn.wrapping_sub(1) & 0xff_ffff;
            q.rc.req.outstanding.push_back(Outstanding {
                psn,
                last_psn: psn,
                wqe_idx: wqe.idx,
                opcode: wqe.opcode.0,
                signaled: wqe.signaled,
                packets: Packets::default(),
                local,
                len: 0,
                done: true,
                is_read_like: false,
                read_buf: Vec::new(),
                read_next: psn,
                read_mtu: 0,
                read_va: 0,
            });
            return;
        }
        if wqe.signaled {
            requester_ok(w, hca, qpn, wqe.idx, wqe.opcode.0, 0, None);
        }
        return;
    }
    let mtu = transport::mtu_bytes(q.path_mtu) as usize;
    let first = q.sq_psn;
    let is_read = pkt.opcode == op::RC_READ_REQUEST;
    let packets = if qt == qpt::UD {
        Packets::One(Packet { psn: first, ..pkt })
    } else if is_read {
        split_read(pkt, mtu, first)
    } else {
        segment(pkt, mtu, first)
    };
    let span = if is_read {
        (len as usize).div_ceil(mtu).max(1) as u32
    } else {
        packets.len() as u32
    };
    q.sq_psn = (first + span) & 0xff_ffff;
    if qt == qpt::RC {
        let is_read_like = is_read || packets[0].atomic.is_some();
        let read_va = packets[0].reth.map_or(0, |r| r.va);
        if q.rc.req.outstanding.is_empty() {
            q.rc.retries_left = q.retry_cnt;
            q.rc.rnr_left = q.rnr_retry;
        }
        q.rc.req.outstanding.push_back(Outstanding {
            psn: first,
            last_psn: (first + span - 1) & 0xff_ffff,
            wqe_idx: wqe.idx,
            opcode: wqe.opcode.0,
            signaled: wqe.signaled,
            packets,
            local,
            len,
            done: false,
            is_read_like,
            read_buf: Vec::new(),
            read_next: first,
            read_mtu: mtu as u32,
            read_va,
        });
        if q.rc.timer.deadline.is_none() {
            q.rc.timer.deadline = transport::ack_timeout_ns(q.timeout).map(|t| now + t);
        }
        if q.rc.req.tx_next.is_none() {
            q.rc.req.tx_next = Some(first);
        }
        pump(w, hca, qpn);
    } else {
        let n: usize = packets.iter().map(|p| p.payload.len()).sum();
        for p in packets {
            send_packet(w, p);
        }
        if wqe.signaled {
            requester_ok(w, hca, qpn, wqe.idx, wqe.opcode.0, n as u32, None);
        }
    }
}

/// Split a READ into requests of at most [`TX_WINDOW`] response packets each, with the
/// PSNs and remote addresses of their parts of the span: the requester asks for the next
/// part only when the previous one has arrived, so no response burst outgrows the window.
pub(super) fn split_read(pkt: Packet, mtu: usize, first_psn: u32) -> Packets {
    let r = pkt.reth.unwrap_or_default();
    let part = (TX_WINDOW as usize * mtu) as u64;
    let total = u64::from(r.len);
    let mut out = Vec::new();
    let mut off = 0u64;
    loop {
        let len = (total - off).min(part);
        let psn = (first_psn + (off / mtu as u64) as u32) & 0xff_ffff;
        let reth = Reth {
            va: r.va.wrapping_add(off),
            rkey: r.rkey,
            len: len as u32,
        };
        out.push(Packet {
            psn,
            reth: Some(reth),
            ..pkt.clone()
        });
        off += len;
        if off >= total {
            return Packets::Many(out);
        }
    }
}

/// Split a SEND/WRITE message (built as one `_ONLY` packet) into path-MTU packets
/// (FIRST/MIDDLE/LAST) with consecutive PSNs. RETH rides on the first packet, ImmDt/IETH
/// and the solicited bit on the last; every other request is one packet.
pub(super) fn segment(pkt: Packet, mtu: usize, first_psn: u32) -> Packets {
    let base = pkt.opcode & 0x1f;
    let tbits = pkt.opcode & 0xe0;
    let is_send = matches!(base, 0x04 | 0x05 | 0x17);
    let is_write = matches!(base, 0x0A | 0x0B);
    if !(is_send || is_write) || pkt.payload.len() <= mtu || pkt.opcode == op::RC_MASKED_ATOMIC {
        return Packets::One(Packet {
            psn: first_psn,
            ..pkt
        });
    }
    // The header fields are copied into every packet; the payload only chunk by chunk
    // (parts of one shared buffer).
    let mut pkt = pkt;
    let payload = std::mem::take(&mut pkt.payload);
    let n = payload.len().div_ceil(mtu);
    let last_op = match base {
        0x04 => op::RC_SEND_LAST,
        0x05 => op::RC_SEND_LAST_IMM,
        0x17 => op::RC_SEND_LAST_INV,
        0x0A => op::RC_WRITE_LAST,
        _ => op::RC_WRITE_LAST_IMM,
    };
    let packets = (0..n)
        .map(|i| {
            let (first, last) = (i == 0, i + 1 == n);
            let opcode = tbits
                | match (is_send, first, last) {
                    (true, true, _) => op::RC_SEND_FIRST,
                    (true, false, false) => op::RC_SEND_MIDDLE,
                    (false, true, _) => op::RC_WRITE_FIRST,
                    (false, false, false) => op::RC_WRITE_MIDDLE,
                    (_, false, true) => last_op,
                };
            Packet {
                opcode,
                psn: (first_psn + i as u32) & 0xff_ffff,
                se: pkt.se && last,
                ack_req: last || i % 16 == 15,
                reth: if first { pkt.reth } else { None },
                imm: if last { pkt.imm } else { None },
                inv_rkey: if last { pkt.inv_rkey } else { None },
                payload: payload.part(i * mtu..((i + 1) * mtu).min(payload.len())),
                ..pkt.clone()
            }
        })
        .collect();
    Packets::Many(packets)
}

pub(super) fn requester_response(w: &mut World, pkt: &Packet) {
    let hca = pkt.dst_hca;
    let qpn = pkt.dst_qpn;
    let now = w.now();
    let Some(q) = w.hcas.get_mut(hca).and_then(|h| h.qps.get_mut(&qpn)) else {
        return;
    };
    if q.qp_type != qpt::RC
        || q.state != qps::RTS && q.state != qps::SQD
        || (pkt.src_qpn != q.dest_qpn && pkt.src_qpn != UNKNOWN_QPN)
    {
        return;
    }
    let (syn, _) = pkt.aeth.unwrap_or((aeth::ACK, 0));
    let timeout = transport::ack_timeout_ns(q.timeout);
    let (retry_cnt, rnr_retry) = (q.retry_cnt, q.rnr_retry);
    // Anything before pkt.psn that is not a READ/atomic is implicitly acknowledged. (The
    // outstanding list is in PSN order: the scans stop at the first request ending later.)
    let mut progressed = false;
    for o in q.rc.req.outstanding.iter_mut() {
        if !psn_before(o.last_psn, pkt.psn) {
            break;
        }
        if !o.is_read_like && !o.done {
            o.done = true;
            progressed = true;
        }
    }
    let mut err: Option<(u16, u8, Syndrome)> = None;
    let mut retransmit_from: Option<u32> = None;
    // A response of the wrong kind at the PSN of a pending request (READ data or an atomic
    // result for a SEND/WRITE, READ data for an atomic, an atomic result for a READ) is an
    // unexpected opcode, which an IB requester takes as a bad response.
    let unexpected = (pkt.opcode != op::RC_ACK)
        .then(|| {
            q.rc.req
                .outstanding
                .iter()
                .find(|o| !o.done && contains(o, pkt.psn) && !answers(o, pkt.opcode))
        })
        .flatten()
        .map(|o| (o.wqe_idx, o.opcode, Syndrome::BAD_RESP));
    match (pkt.opcode, syn & 0xE0) {
        _ if unexpected.is_some() => err = unexpected,
        (op::RC_ATOMIC_ACK, _) => {
            if let Some(o) =
                q.rc.req
                    .outstanding
                    .iter_mut()
                    .find(|o| o.psn == pkt.psn && o.is_read_like && !o.done)
            {
                let v = pkt.atomic_ack.unwrap_or(0);
                o.read_buf = if o.len == 4 {
                    (v as u32).to_ne_bytes().to_vec()
                } else {
                    v.to_ne_bytes().to_vec()
                };
                o.done = true;
                progressed = true;
            }
        }
        (op::RC_READ_RESPONSE_FIRST..=op::RC_READ_RESPONSE_ONLY, _) => {
            let in_span =
                |o: &Outstanding| !psn_before(pkt.psn, o.psn) && !psn_before(o.last_psn, pkt.psn);
            if let Some(o) =
                q.rc.req
                    .outstanding
                    .iter_mut()
                    .find(|o| o.is_read_like && !o.done && in_span(o))
            {
                // In-order response packets only; a gap is recovered by re-reading.
                if pkt.psn == o.read_next {
                    o.read_buf.extend_from_slice(&pkt.payload);
                    o.read_next = (o.read_next + 1) & 0xff_ffff;
                    progressed = true;
                    // The last response of the last part completes the READ.
                    if matches!(
                        pkt.opcode,
                        op::RC_READ_RESPONSE_LAST | op::RC_READ_RESPONSE_ONLY
                    ) && pkt.psn == o.last_psn
                    {
                        o.done = true;
                    }
                }
            }
        }
        (_, 0x00) => {
            for o in q.rc.req.outstanding.iter_mut() {
                if psn_before(pkt.psn, o.last_psn) {
                    break;
                }
                if !o.is_read_like && !o.done {
                    o.done = true;
                    progressed = true;
                }
            }
            // A coalesced ACK inside a multi-packet message is progress too.
            if q.rc.req.acked.is_none_or(|a| psn_before(a, pkt.psn)) {
                q.rc.req.acked = Some(pkt.psn);
                progressed = true;
            }
        }
        (_, 0x20) => {
            // RNR NAK
            if rnr_retry != 7 && q.rc.rnr_left == 0 {
                if let Some(o) = q.rc.req.outstanding.iter().find(|o| contains(o, pkt.psn)) {
                    err = Some((o.wqe_idx, o.opcode, Syndrome::RNR_RETRY_EXC));
                }
            } else {
                if rnr_retry != 7 {
                    q.rc.rnr_left -= 1;
                }
                q.rc.timer.rnr_wait_until = Some(now + transport::rnr_timer_ns(syn & 0x1f));
                q.rc.timer.rnr_from = pkt.psn;
                q.rc.timer.deadline = None;
            }
        }
        (_, 0x60) => {
            let code = syn;
            if code == aeth::NAK_PSN_SEQ {
                retransmit_from = Some(pkt.psn);
            } else if let Some(o) = q.rc.req.outstanding.iter().find(|o| contains(o, pkt.psn)) {
                let s = match code {
                    aeth::NAK_INV_REQ => Syndrome::REMOTE_INVAL_REQ,
                    aeth::NAK_REM_ACCESS => Syndrome::REMOTE_ACCESS,
                    _ => Syndrome::REMOTE_OP,
                };
                err = Some((o.wqe_idx, o.opcode, s));
            }
        }
        _ => {
            err =
                q.rc.req
                    .outstanding
                    .front()
                    .map(|o| (o.wqe_idx, o.opcode, Syndrome::BAD_RESP));
        }
    }
    if progressed {
        q.rc.retries_left = retry_cnt;
        q.rc.rnr_left = if syn & 0xE0 == 0x20 {
            q.rc.rnr_left
        } else {
            rnr_retry
        };
        q.rc.timer.deadline = timeout.map(|t| now + t);
    }
    // Whether anything waits for the window (retiring below does not change that).
    let tx_pending = q.rc.req.tx_next.is_some();
    if pkt.opcode == op::RC_ACK && syn & 0xE0 == 0x60 && syn == aeth::NAK_PSN_SEQ {
        w.hcas[hca].counters.packet_seq_err += 1;
    }
    if syn & 0xE0 == 0x20 && pkt.opcode == op::RC_ACK {
        w.hcas[hca].counters.rnr_nak_retry_err += 1;
    }
    retire(w, hca, qpn);
    if tx_pending {
        pump(w, hca, qpn);
    }
    if let Some((idx, opc, s)) = err {
        // Complete everything before the failed one, then fail it.
        drop_outstanding_until(w, hca, qpn, idx);
        requester_error(w, hca, qpn, idx, opc, s);
    }
    if let Some(from) = retransmit_from {
        retransmit(w, hca, qpn, from);
    }
}

/// Remove the failed WQE (and anything before it) from the outstanding list.
pub(super) fn drop_outstanding_until(w: &mut World, hca: usize, qpn: u32, idx: u16) {
    if let Some(q) = w.hcas[hca].qps.get_mut(&qpn) {
        while let Some(o) = q.rc.req.outstanding.pop_front() {
            if o.wqe_idx == idx {
                break;
            }
        }
        q.rc.timer.deadline = None;
        q.rc.timer.rnr_wait_until = None;
    }
}

/// Complete finished requests in order.
pub(super) fn retire(w: &mut World, hca: usize, qpn: u32) {
    loop {
        let Some(q) = w.hcas[hca].qps.get_mut(&qpn) else {
            return;
        };
        if !q.rc.req.outstanding.front().is_some_and(|o| o.done) {
            if q.rc.req.outstanding.is_empty() {
                q.rc.timer.deadline = None;
            }
            return;
        }
        let o = q.rc.req.outstanding.pop_front().expect("front exists");
        let req_scatter = q.req_scatter;
        let send_cq = q.send_cq;
        let mut scatter_data = None;
        if o.is_read_like {
            let data = &o.read_buf;
            let cqe_size = w.hcas[hca].cqs.get(&send_cq).map_or(64, |c| c.cqe_size);
            let limit = if cqe_size == 128 { 64 } else { 32 };
            if req_scatter && o.signaled && data.len() <= limit {
                scatter_data = Some(data.clone());
            } else if let Err(s) = scatter(&o.local, data) {
                requester_error(w, hca, qpn, o.wqe_idx, o.opcode, s);
                return;
            }
        }
        if o.signaled {
            requester_ok(w, hca, qpn, o.wqe_idx, o.opcode, o.len, scatter_data);
        }
    }
}

/// Whether response opcode `opcode` (not a plain ACK) is the kind that answers request `o`:
/// READ response packets answer a READ, an atomic acknowledge answers an atomic.
pub(super) fn answers(o: &Outstanding, opcode: u8) -> bool {
    let read = o.opcode == SendOpcode::RDMA_READ.0;
    match opcode {
        op::RC_READ_RESPONSE_FIRST..=op::RC_READ_RESPONSE_ONLY => read,
        op::RC_ATOMIC_ACK => o.is_read_like && !read,
        _ => false,
    }
}

pub(super) fn contains(o: &Outstanding, psn: u32) -> bool {
    !psn_before(psn, o.psn) && !psn_before(o.last_psn, psn)
}

/// Packets an RC requester may have in flight beyond the oldest unacknowledged PSN. Like
/// a real HCA's limit on outstanding packets, it keeps a go-back-N recovery of a multi-MiB
/// message from flooding the receiver (on UDP: its socket buffer).
pub(super) const TX_WINDOW: u32 = 256;

/// Transmit the requester's pending packets, in PSN order, as far as the window allows.
pub(super) fn pump(w: &mut World, hca: usize, qpn: u32) {
    let Some(q) = w.hcas[hca].qps.get_mut(&qpn) else {
        return;
    };
    let Some(mut next) = q.rc.req.tx_next else {
        return;
    };
    let Some(base) = q.rc.req.outstanding.iter().find(|o| !o.done).map(|o| o.psn) else {
        q.rc.req.tx_next = None;
        return;
    };
    // The window starts after the highest acknowledged PSN when that is newer.
    let start = match q.rc.req.acked.map(|a| (a + 1) & 0xff_ffff) {
        Some(a) if psn_before(base, a) => a,
        _ => base,
    };
    let in_window = |psn: u32| psn.wrapping_sub(start) & 0xff_ffff < TX_WINDOW;
    let mut out = std::mem::take(&mut w.wire.tx);
    out.clear();
    let mut blocked = false;
    // The list is in PSN order: the entries that end before `next` (all but the newest,
    // usually) have nothing left to send; start after the last of them.
    let skip =
        q.rc.req
            .outstanding
            .iter()
            .rposition(|o| psn_before(o.last_psn, next))
            .map_or(0, |i| i + 1);
    'entries: for o in
        q.rc.req
            .outstanding
            .range(skip..)
            .filter(|o| !o.done && !o.packets.is_empty())
    {
        if o.is_read_like {
            // READ parts (or one atomic request) in order; the response PSNs are the span.
            // A later part goes out only once the previous part has fully arrived.
            for (k, p) in o.packets.iter().enumerate() {
                if psn_before(p.psn, next) {
                    continue;
                }
                if (k == 0 && !in_window(p.psn)) || (k > 0 && p.psn != o.read_next) {
                    blocked = true;
                    break 'entries;
                }
                out.push(p.clone());
                next = o
                    .packets
                    .get(k + 1)
                    .map_or((o.last_psn + 1) & 0xff_ffff, |n| n.psn);
            }
            continue;
        }
        for p in o.packets.iter() {
            if psn_before(p.psn, next) {
                continue;
            }
            if !in_window(p.psn) {
                blocked = true;
                break 'entries;
            }
            out.push(p.clone());
            next = (p.psn + 1) & 0xff_ffff;
        }
    }
    q.rc.req.tx_next = if blocked { Some(next) } else { None };
    for p in out.drain(..) {
        send_packet(w, p);
    }
    w.wire.tx = out;
}
