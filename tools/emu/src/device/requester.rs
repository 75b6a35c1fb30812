//! The RC requester: PSN assignment and segmentation, the outstanding requests, the
//! transmit window, responses (ACK/NAK, READ data, atomic results) and in-order retirement.

// The stages share the device's imports and one another's `pub(super)` items (device/mod.rs).
use super::*;

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
                error: None,
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
            q.rc.timer.silent_since = now;
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
            error: None,
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

/// Where a response came from and what it says, after the checks every response passes.
pub(super) fn requester_response(w: &mut World, pkt: &Packet) {
    let hca = pkt.dst_hca;
    let qpn = pkt.dst_qpn;
    let now = w.now();
    let Some(q) = w.hcas.get(hca).and_then(|h| h.qps.get(&qpn)) else {
        count_foreign(w, hca);
        return;
    };
    if q.qp_type != qpt::RC || !matches!(q.state, qps::RTS | qps::SQD) {
        w.hcas[hca].counters.packets_dropped += 1;
        return;
    }
    if !from_peer(w, hca, q, pkt) {
        count_foreign(w, hca);
        return;
    }
    let q = w.hcas[hca].qps.get_mut(&qpn).expect("looked up above");
    // The PSN window: a response names a PSN from the one before the oldest outstanding
    // request (a repeated ACK) up to the last PSN transmitted. Older: a stale duplicate,
    // ignored. Newer: nothing this QP sent can be answered by it (forged): dropped, counted.
    let Some(front_psn) = q.rc.req.outstanding.front().map(|o| o.psn) else {
        if q.rc.req.sent_high.is_some_and(|h| psn_before(h, pkt.psn)) {
            w.hcas[hca].counters.rx_out_of_window += 1;
        }
        return;
    };
    let lo = front_psn.wrapping_sub(1) & 0xff_ffff;
    let hi = q.rc.req.sent_high.unwrap_or(lo);
    if psn_before(pkt.psn, lo) {
        return;
    }
    if psn_before(hi, pkt.psn) {
        w.hcas[hca].counters.rx_out_of_window += 1;
        w.hcas[hca].counters.packets_dropped += 1;
        return;
    }
    let (syn, _) = pkt.aeth.unwrap_or((aeth::ACK, 0));
    let timeout = transport::ack_timeout_ns(q.timeout);
    let (retry_cnt, rnr_retry) = (q.retry_cnt, q.rnr_retry);
    let mtu = transport::mtu_bytes(q.path_mtu) as usize;
    let out = &mut q.rc.req.outstanding;
    let mut progressed = false;
    // Everything wholly before `psn` that is not a READ/atomic is acknowledged by any
    // response at `psn` (the responder executes in order). A READ/atomic before it whose
    // answer is still missing lost it on the way: an implied NAK, go back to it.
    let mut implied = false;
    let ack_before = |out: &mut VecDeque<Outstanding>, psn: u32, inclusive: bool| {
        let (mut prog, mut imp) = (false, false);
        for o in out.iter_mut() {
            let covered = if inclusive {
                !psn_before(psn, o.last_psn)
            } else {
                psn_before(o.last_psn, psn)
            };
            if !covered {
                break;
            }
            if o.done || o.error.is_some() {
                continue;
            }
            if o.is_read_like {
                imp = true;
            } else {
                o.done = true;
                prog = true;
            }
        }
        (prog, imp)
    };
    let mut err: Option<(usize, Syndrome)> = None;
    let mut retransmit_now = false;
    // A response of the wrong kind at the PSN of a pending request (READ data or an atomic
    // result for a SEND/WRITE, READ data for an atomic, an atomic result for a READ) is an
    // unexpected opcode, which an IB requester takes as a bad response.
    let unexpected = (pkt.opcode != op::RC_ACK)
        .then(|| {
            out.iter()
                .position(|o| !o.done && contains(o, pkt.psn) && !answers(o, pkt.opcode))
        })
        .flatten();
    match (pkt.opcode, syn & 0xE0) {
        _ if unexpected.is_some() => err = unexpected.map(|i| (i, Syndrome::BAD_RESP)),
        (op::RC_ATOMIC_ACK, _) => {
            let (p, i) = ack_before(out, pkt.psn, false);
            (progressed, implied) = (p, i);
            if let Some(o) = out
                .iter_mut()
                .find(|o| o.psn == pkt.psn && o.is_read_like && !o.done && o.error.is_none())
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
            let (p, i) = ack_before(out, pkt.psn, false);
            (progressed, implied) = (p, i);
            if let Some(o) = out
                .iter_mut()
                .find(|o| o.is_read_like && !o.done && o.error.is_none() && contains(o, pkt.psn))
            {
                // Every response but the last of the READ carries exactly one MTU; the
                // last, the rest. Anything else is not a response to this READ.
                let want = if pkt.psn == o.last_psn {
                    o.len as usize - mtu * (o.last_psn.wrapping_sub(o.psn) & 0xff_ffff) as usize
                } else {
                    mtu
                };
                if pkt.payload.len() != want {
                    w.hcas[hca].counters.rx_bad_packets += 1;
                    w.hcas[hca].counters.packets_dropped += 1;
                    return;
                }
                if pkt.psn == o.read_next {
                    o.read_buf.extend_from_slice(&pkt.payload);
                    o.read_next = (o.read_next + 1) & 0xff_ffff;
                    progressed = true;
                    if pkt.psn == o.last_psn {
                        o.done = true;
                    }
                } else if psn_before(o.read_next, pkt.psn) {
                    // A gap in the responses: re-read from the first missing one.
                    implied = true;
                }
            }
        }
        (_, 0x00) => {
            let (p, i) = ack_before(out, pkt.psn, true);
            (progressed, implied) = (p, i);
            // A coalesced ACK inside a multi-packet message is progress too.
            if q.rc.req.acked.is_none_or(|a| psn_before(a, pkt.psn)) {
                q.rc.req.acked = Some(pkt.psn);
                progressed = true;
            }
        }
        (_, 0x20) => {
            // RNR NAK: the request at `psn` found no receive WQE; everything before it
            // was executed.
            let (p, _) = ack_before(out, pkt.psn, false);
            progressed = p;
            if rnr_retry != 7 && q.rc.rnr_left == 0 {
                err = out
                    .iter()
                    .position(|o| contains(o, pkt.psn))
                    .map(|i| (i, Syndrome::RNR_RETRY_EXC));
            } else {
                if rnr_retry != 7 {
                    q.rc.rnr_left -= 1;
                }
                q.rc.timer.rnr_wait_until = Some(now + transport::rnr_timer_ns(syn & 0x1f));
                q.rc.timer.rnr_from = pkt.psn;
                q.rc.timer.deadline = None;
            }
        }
        (_, 0x60) if syn == aeth::NAK_PSN_SEQ => {
            // The responder expects `psn`: everything before it arrived.
            let (p, _) = ack_before(out, pkt.psn, false);
            progressed = p;
            retransmit_now = true;
        }
        (_, 0x60) => {
            let (p, _) = ack_before(out, pkt.psn, false);
            progressed = p;
            let s = match syn {
                aeth::NAK_INV_REQ => Syndrome::REMOTE_INVAL_REQ,
                aeth::NAK_REM_ACCESS => Syndrome::REMOTE_ACCESS,
                _ => Syndrome::REMOTE_OP,
            };
            err = out
                .iter()
                .position(|o| contains(o, pkt.psn))
                .map(|i| (i, s));
        }
        _ => {
            // A reserved AETH syndrome: a response the requester cannot accept, for the
            // request it names (else the oldest).
            let at = out.iter().position(|o| contains(o, pkt.psn)).unwrap_or(0);
            err = Some((at, Syndrome::BAD_RESP));
        }
    }
    if let Some((i, s)) = err {
        // Completions leave in WQE order, and a queue that has begun to flush never
        // completes anything with success again: the requests before the failing one that
        // are finished complete first; at the first that is not (it can no longer be
        // answered: the QP is going to the error state), or at the failing one, the error
        // completion; everything after it, finished or not, is flushed.
        let first_open = out
            .iter()
            .take(i)
            .position(|o| !o.done && o.error.is_none())
            .unwrap_or(i);
        for (k, o) in out.iter_mut().enumerate().skip(first_open) {
            o.error = Some(if k == first_open {
                s
            } else {
                Syndrome::WR_FLUSH
            });
        }
        q.rc.timer.deadline = None;
        q.rc.timer.rnr_wait_until = None;
    }
    if progressed {
        q.rc.retries_left = retry_cnt;
        q.rc.timer.silent_since = now;
        q.rc.rnr_left = if syn & 0xE0 == 0x20 {
            q.rc.rnr_left
        } else {
            rnr_retry
        };
        q.rc.timer.deadline = timeout.map(|t| now + t);
    }
    // An implied NAK restarts once per lost response (the resume point), not once per
    // later response that shows the loss.
    if implied && err.is_none() {
        let resume =
            q.rc.req
                .outstanding
                .iter()
                .find(|o| !o.done)
                .map(resume_point);
        if resume.is_some() && resume != q.rc.req.restarted_at {
            q.rc.req.restarted_at = resume;
            retransmit_now = true;
        }
    }
    let tx_pending = q.rc.req.tx_next.is_some();
    if pkt.opcode == op::RC_ACK && syn == aeth::NAK_PSN_SEQ {
        w.hcas[hca].counters.packet_seq_err += 1;
    }
    if syn & 0xE0 == 0x20 && pkt.opcode == op::RC_ACK {
        w.hcas[hca].counters.rnr_nak_retry_err += 1;
    }
    retire(w, hca, qpn);
    if retransmit_now {
        retransmit(w, hca, qpn);
    } else if tx_pending {
        pump(w, hca, qpn);
    }
}

/// Count a packet that is not from the connected peer (or for no QP of ours).
fn count_foreign(w: &mut World, hca: usize) {
    if let Some(h) = w.hcas.get_mut(hca) {
        h.counters.rx_foreign += 1;
        h.counters.packets_dropped += 1;
    }
}

/// Whether `pkt` comes from the connected peer of RC/UC QP `q`: its source node and (where
/// the packet says) its source QP. (RoCEv2 packets do not carry the source QP; the source
/// address then has to do.)
pub(super) fn from_peer(w: &World, hca: usize, q: &crate::state::Qp, pkt: &Packet) -> bool {
    let peer = peer_lid(w, hca, q);
    peer != 0 && pkt.slid == peer && (pkt.src_qpn == q.dest_qpn || pkt.src_qpn == UNKNOWN_QPN)
}

/// The fabric node of a connected QP's peer, as the requester addresses it.
pub(super) fn peer_lid(w: &World, hca: usize, q: &crate::state::Qp) -> u16 {
    if w.hcas[hca].info.is_roce() {
        crate::roce::node_of_gid(&q.path.dgid).unwrap_or(0)
    } else {
        route(w, q.path.dlid, q.path.is_global.then_some(q.path.dgid)).unwrap_or(0)
    }
}

/// The PSN from which request `o` has to be sent again: a READ at its first missing
/// response, an atomic whole, a SEND/WRITE after its last acknowledged packet.
pub(super) fn resume_point(o: &Outstanding) -> u32 {
    if o.is_read_like { o.read_next } else { o.psn }
}

/// A send WQE failed while being executed. With nothing outstanding it completes in error
/// now; behind outstanding requests it waits for them, in WQE order: the send queue stops
/// here, and the error completion is written when everything before it has completed.
pub(super) fn fail_wqe(w: &mut World, hca: usize, qpn: u32, idx: u16, op: u8, s: Syndrome) {
    let Some(q) = w.hcas[hca].qps.get_mut(&qpn) else {
        return;
    };
    if q.qp_type != qpt::RC || q.rc.req.outstanding.is_empty() {
        requester_error(w, hca, qpn, idx, op, s);
        return;
    }
    let psn = q.sq_psn.wrapping_sub(1) & 0xff_ffff;
    q.rc.req.halted = true;
    q.rc.req.outstanding.push_back(Outstanding {
        psn,
        last_psn: psn,
        wqe_idx: idx,
        opcode: op,
        signaled: true,
        packets: Packets::default(),
        local: Sgl::default(),
        len: 0,
        done: false,
        error: Some(s),
        is_read_like: false,
        read_buf: Vec::new(),
        read_next: psn,
        read_mtu: 0,
        read_va: 0,
    });
    retire(w, hca, qpn);
}

/// Complete finished requests in WQE order: successes, then (at the first request that
/// failed) its error completion and the QP to the error state, whose flush completes the
/// rest. Stops at the first request still waiting.
pub(super) fn retire(w: &mut World, hca: usize, qpn: u32) {
    loop {
        let Some(q) = w.hcas[hca].qps.get_mut(&qpn) else {
            return;
        };
        let Some(front) = q.rc.req.outstanding.front() else {
            q.rc.timer.deadline = None;
            return;
        };
        if let Some(s) = front.error {
            let o = q.rc.req.outstanding.pop_front().expect("front exists");
            if s == Syndrome::WR_FLUSH {
                flush_send(w, hca, qpn, o.wqe_idx, o.opcode);
                continue;
            }
            requester_error(w, hca, qpn, o.wqe_idx, o.opcode, s);
            return;
        }
        if !front.done {
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
            } else {
                let what = if o.opcode == SendOpcode::RDMA_READ.0 {
                    "read response"
                } else {
                    "atomic result"
                };
                note_scatter(w, hca, qpn, &o.local, 0, data.len(), data, what);
            }
        }
        if w.trace.on() {
            let now = w.now();
            w.trace.push(
                hca,
                now,
                "mlx5_emu::device::requester::retire",
                crate::trace::TraceWhat::Retire {
                    qpn,
                    wqe_counter: o.wqe_idx,
                    cqe: o.signaled,
                },
            );
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
    let Some(first) =
        q.rc.req
            .outstanding
            .iter()
            .find(|o| !o.done && o.error.is_none())
    else {
        q.rc.req.tx_next = None;
        return;
    };
    // The window starts at the oldest PSN still needed: a READ's first missing response,
    // an atomic, or the first unacknowledged packet of a SEND/WRITE.
    let mut start = resume_point(first);
    if !first.is_read_like {
        if let Some(a) = q.rc.req.acked.map(|a| (a + 1) & 0xff_ffff) {
            if psn_before(start, a) && !psn_before(first.last_psn, a) {
                start = a;
            }
        }
    }
    let in_window = |psn: u32| psn.wrapping_sub(start) & 0xff_ffff < TX_WINDOW;
    let mut out = std::mem::take(&mut w.wire.tx);
    out.clear();
    let mut blocked = false;
    let mut high: Option<u32> = None;
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
                let span = p.reth.map_or(1, |r| {
                    (r.len as usize).div_ceil(o.read_mtu.max(1) as usize).max(1) as u32
                });
                high = Some((p.psn + span - 1) & 0xff_ffff);
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
            high = Some(p.psn);
            next = (p.psn + 1) & 0xff_ffff;
        }
    }
    q.rc.req.tx_next = if blocked { Some(next) } else { None };
    if let Some(h) = high {
        if q.rc.req.sent_high.is_none_or(|s| psn_before(s, h)) {
            q.rc.req.sent_high = Some(h);
        }
    }
    for p in out.drain(..) {
        send_packet(w, p);
    }
    w.wire.tx = out;
}
