//! The responder: packet checks, PSN sequence and duplicates, receive WQEs, execution
//! of SEND/WRITE/READ/atomic requests and their replies.

// The stages share the device's imports and one another's `pub(super)` items (device/mod.rs).
use super::*;

/// Take the next receive WQE of a QP (its own RQ or its SRQ). Returns (scatter segments
/// bytes, wqe_counter, srqn) or None when none is posted. The bytes are in the device's
/// reusable receive buffer: give it back with [`recv_done`].
pub(super) fn take_recv_wqe(w: &mut World, hca: usize, qpn: u32) -> Option<(Vec<u8>, u16, u32)> {
    let mut buf = std::mem::take(&mut w.wire.recv);
    buf.clear();
    match fetch_recv_wqe(w, hca, qpn, &mut buf) {
        Some((ctr, srqn)) => Some((buf, ctr, srqn)),
        None => {
            w.wire.recv = buf;
            None
        }
    }
}

/// Hand the buffer of [`take_recv_wqe`] back for reuse.
pub(super) fn recv_done(w: &mut World, buf: Vec<u8>) {
    w.wire.recv = buf;
}

/// [`take_recv_wqe`] into `out` (empty): returns (wqe_counter, srqn).
pub(super) fn fetch_recv_wqe(
    w: &mut World,
    hca: usize,
    qpn: u32,
    out: &mut Vec<u8>,
) -> Option<(u16, u32)> {
    let clock = tclock(w);
    let h = &mut w.hcas[hca];
    let q = h.qps.get_mut(&qpn)?;
    if let Some(srqn) = q.srq {
        let s = w.hcas[hca].srqs.get_mut(&srqn)?;
        let posted = mem::read_be32(s.db).ok()? & WQ_PI_MASK;
        if (posted as u16).wrapping_sub(s.consumed as u16) == 0 {
            return None;
        }
        let idx = s.head & (s.wqe_cnt - 1) as u16;
        out.resize(s.stride as usize, 0);
        mem::read(s.buf + u64::from(idx) * u64::from(s.stride), out).ok()?;
        let wqe = &out[..];
        s.head = u16::from_be_bytes([wqe[2], wqe[3]]);
        s.consumed = s.consumed.wrapping_add(1);
        let avail = (posted as u16).wrapping_sub(s.consumed as u16) as u32;
        if s.limit > 0 && avail < s.limit {
            s.limit = 0;
            let (ctx, uh) = (s.ctx, s.user_handle);
            w.async_event(ctx, uh, 14, EvObj::Srq(hca, srqn)); // IBV_EVENT_SRQ_LIMIT_REACHED
        }
        out.drain(..16.min(out.len()));
        return Some((idx, srqn));
    }
    if q.rq_wqe_cnt == 0 {
        return None;
    }
    let stride = 1u64 << q.rq_wqe_shift;
    if !rq_cached_avail(q) {
        let db = q.db;
        let first = q.buf + u64::from(q.rq_head & (q.rq_wqe_cnt - 1)) * stride;
        q.rq_pi_seen = (mem::read_be32(db).ok()? & WQ_PI_MASK) as u16;
        let empty = q.rq_pi_seen == q.rq_head as u16;
        let data = if empty {
            None
        } else {
            let mut d = std::mem::take(&mut q.rq_prefetch.1);
            if prefetch_rq(q, stride, &mut d).is_none() {
                d.clear();
            }
            Some(d)
        };
        let (pi, n) = (q.rq_pi_seen, data.as_ref().map_or(0, |d| d.len() as u64));
        if w.trace.active() {
            let c = &mut h.counters;
            crate::trace::dma_read(c, db, 4);
            // The prefetch: one read, two when it wraps (counted as one here).
            crate::trace::dma_read(c, first, n);
        }
        if w.trace.on() {
            w.trace.push(
                hca,
                clock,
                "mlx5_emu::device::responder::fetch_recv_wqe",
                crate::trace::TraceWhat::DbrecRead {
                    queue: "rq",
                    num: qpn,
                    addr: db,
                    value: u32::from(pi),
                },
            );
        }
        let data = data?;
        q.rq_prefetch = (q.rq_head, data);
    }
    let off = q.rq_head.wrapping_sub(q.rq_prefetch.0) as usize * stride as usize;
    match q.rq_prefetch.1.get(off..off + stride as usize) {
        Some(b) => out.extend_from_slice(b),
        None => {
            let slot = u64::from(q.rq_head & (q.rq_wqe_cnt - 1));
            out.resize(stride as usize, 0);
            mem::read(q.buf + slot * stride, out).ok()?;
        }
    }
    let ctr = q.rq_head as u16;
    q.rq_head = q.rq_head.wrapping_add(1);
    Some((ctr, 0))
}

/// The clock for trace events: the world's time when tracing is on, else 0 (not read).
#[inline(always)]
pub(super) fn tclock(w: &World) -> u64 {
    if w.trace.on() { w.now() } else { 0 }
}

/// Trace one responder check (nothing when tracing is off: `detail` is not even built).
/// Takes the recorder alone so that the caller may keep its QP borrowed.
#[inline(always)]
pub(super) fn rcheck(
    t: &mut crate::trace::Recorder,
    clock: u64,
    hca: usize,
    qpn: u32,
    check: &'static str,
    ok: bool,
    detail: impl FnOnce() -> String,
) {
    if t.on() {
        t.push(
            hca,
            clock,
            "mlx5_emu::device::responder::responder",
            crate::trace::TraceWhat::Check {
                qpn,
                check,
                detail: detail(),
                ok,
            },
        );
    }
}

/// Trace the checks [`responder`] is about to make on `pkt`, in its order, with the values
/// compared (tracing only: the responder's own decisions are made below, from the same
/// state).
#[cold]
fn trace_checks(w: &mut World, pkt: &Packet) {
    let hca = pkt.dst_hca;
    let clock = w.now();
    let dq = pkt.dst_qpn;
    let Some(q) = w.hcas.get(hca).and_then(|h| h.qps.get(&dq)) else {
        if hca < w.hcas.len() {
            rcheck(
                &mut w.trace,
                clock,
                hca,
                dq,
                "destination QP",
                false,
                || format!("BTH dest QP {dq:#08x} unknown"),
            );
        }
        return;
    };
    rcheck(&mut w.trace, clock, hca, dq, "destination QP", true, || {
        format!("BTH dest QP {dq:#08x} exists")
    });
    let qt = q.qp_type;
    let t = pkt.transport();
    let ok_type = match t {
        0x00 => qt == qpt::RC,
        0x20 => qt == qpt::UC,
        _ => qt == qpt::UD,
    };
    let st = q.state;
    let ok_state = matches!(st, qps::RTR | qps::RTS | qps::SQD | qps::SQE);
    let tn = match qt {
        qpt::RC => "RC",
        qpt::UC => "UC",
        _ => "UD",
    };
    let sn = match st {
        qps::RTR => "RTR",
        qps::RTS => "RTS",
        qps::SQD => "SQD",
        qps::SQE => "SQE",
        qps::ERR => "ERR",
        qps::INIT => "INIT",
        _ => "RESET",
    };
    rcheck(
        &mut w.trace,
        clock,
        hca,
        dq,
        "QP type and state",
        ok_type && ok_state,
        || {
            format!(
                "transport {t:#04x} on a {tn} QP in state {sn} (receiving needs RTR, RTS, SQD or SQE)"
            )
        },
    );
    if !ok_type || !ok_state {
        return;
    }
    if qt == qpt::UD {
        let (got, want) = (pkt.qkey, q.qkey);
        rcheck(&mut w.trace, clock, hca, dq, "Q_Key", got == want, || {
            format!("Q_Key {got:#010x}, the QP's {want:#010x}")
        });
        return;
    }
    let peer = from_peer(w, hca, q, pkt);
    let (slid, dqp, epsn) = (pkt.slid, q.dest_qpn, q.rq_psn);
    rcheck(&mut w.trace, clock, hca, dq, "connected peer", peer, || {
        format!("source LID {slid} is the connected peer's (its QP {dqp:#08x})")
    });
    if !peer {
        return;
    }
    let got = pkt.psn;
    rcheck(&mut w.trace, clock, hca, dq, "PSN", got == epsn, || {
        format!("PSN {got:#08x}, expected {epsn:#08x}")
    });
}

/// A remote access refused by the responder's key check `f` (`op` READ, WRITE, atomic): the
/// trace's failed check and the device's record of it, both naming the check with the
/// expected and the actual value (cold: error paths only).
#[cold]
fn remote_refused(w: &mut World, hca: usize, qpn: u32, op: &str, f: KeyFault) {
    w.checks.last.set(None);
    let d = f.describe("rkey", "at the responder");
    let clock = tclock(w);
    rcheck(&mut w.trace, clock, hca, qpn, f.check(), false, || {
        format!("{op} {d}")
    });
    note_failed(w, hca, qpn, "responder", f.check(), format!("{op} {d}"));
}

/// A receive WQE whose scatter list failed its key check: the device's record of it and the
/// vendor syndrome (data buffer 0x30 | the check's detail).
#[cold]
fn recv_key_refused(w: &mut World, hca: usize, qpn: u32) -> u8 {
    if let Some(f) = w.checks.last.get() {
        let d = f.describe("lkey", "at the responder (receive WQE)");
        let clock = tclock(w);
        rcheck(&mut w.trace, clock, hca, qpn, f.check(), false, || {
            d.clone()
        });
        note_failed(w, hca, qpn, "responder", f.check(), d);
    }
    take_tpt_vendor(w, 0x30)
}

/// A message longer than the receive WQE's scatter list (cold).
#[cold]
fn recv_too_long(w: &mut World, hca: usize, qpn: u32, len: u64, cap: u64) {
    let d =
        format!("message of at least {len} B longer than the receive WQE's scatter list ({cap} B)");
    let clock = tclock(w);
    rcheck(&mut w.trace, clock, hca, qpn, "length", false, || d.clone());
    note_failed(w, hca, qpn, "responder", "length", d);
}

/// No receive WQE for a SEND: the device's record (once per run of RNR NAKs of a QP).
#[cold]
fn no_recv_wqe(w: &mut World, hca: usize, qpn: u32) {
    let repeat = w
        .checks
        .failed
        .back()
        .is_some_and(|c| c.hca == hca && c.qpn == qpn && c.check == "receive WQE");
    if !repeat {
        let d = "no receive WQE posted when a SEND arrived: RNR NAK".to_owned();
        note_failed(w, hca, qpn, "responder", "receive WQE", d);
    }
}

pub(super) fn responder(w: &mut World, pkt: &mut Packet) {
    let hca = pkt.dst_hca;
    if w.trace.on() {
        trace_checks(w, pkt);
    }
    let Some(q) = w.hcas.get(hca).and_then(|h| h.qps.get(&pkt.dst_qpn)) else {
        if let Some(h) = w.hcas.get_mut(hca) {
            h.counters.rx_foreign += 1;
            h.counters.packets_dropped += 1;
        }
        return;
    };
    let qpn = q.qpn;
    let qt = q.qp_type;
    let ok_type = match pkt.transport() {
        0x00 => qt == qpt::RC,
        0x20 => qt == qpt::UC,
        _ => qt == qpt::UD,
    };
    if !ok_type || !matches!(q.state, qps::RTR | qps::RTS | qps::SQD | qps::SQE) {
        w.hcas[hca].counters.packets_dropped += 1;
        return;
    }
    if qt == qpt::UD {
        if pkt.qkey != q.qkey {
            w.hcas[hca].counters.packets_dropped += 1;
            return;
        }
    } else if !from_peer(w, hca, q, pkt) {
        // Not the connected peer (source node or QP): dropped, the connection intact.
        w.hcas[hca].counters.rx_foreign += 1;
        w.hcas[hca].counters.packets_dropped += 1;
        return;
    }
    if qt != qpt::UD {
        // RC/UC packets do not carry the source QP; the QP context knows its peer.
        pkt.src_qpn = q.dest_qpn;
    }
    let epsn = q.rq_psn;
    if qt == qpt::RC && pkt.psn != epsn {
        if psn_before(pkt.psn, epsn) {
            w.hcas[hca].counters.duplicate_request += 1;
            duplicate(w, pkt, epsn);
        } else {
            w.hcas[hca].counters.out_of_sequence += 1;
            let q = w.hcas[hca].qps.get_mut(&qpn).expect("looked up above");
            if !q.rc.resp.nak_sent {
                q.rc.resp.nak_sent = true;
                let mut n = reply(w, pkt, op::RC_ACK, aeth::NAK_PSN_SEQ);
                n.psn = epsn;
                send_packet(w, n);
            }
        }
        return;
    }
    if qt == qpt::UC && psn_before(pkt.psn, epsn) {
        // UC: a packet from the past (a duplicate) is dropped; the state is untouched.
        w.hcas[hca].counters.packets_dropped += 1;
        return;
    }
    if qt == qpt::UC && pkt.psn != epsn {
        // UC: a gap kills the message in progress; resynchronise on a first packet.
        let q = w.hcas[hca].qps.get_mut(&qpn).expect("looked up above");
        q.rc.resp.rx = None;
        if !first_of_message(pkt.opcode) {
            q.rq_psn = (pkt.psn + 1) & 0xff_ffff;
            w.hcas[hca].counters.packets_dropped += 1;
            return;
        }
    }
    // Execute.
    let result = execute_request(w, hca, qpn, pkt);
    let q = w.hcas[hca].qps.get_mut(&qpn).expect("responder QP exists");
    match result {
        Ok((replies, span)) => {
            if qt != qpt::UD {
                q.rq_psn = (pkt.psn + span) & 0xff_ffff;
                q.rc.resp.nak_sent = false;
            }
            if qt == qpt::RC {
                match replies {
                    Reply::None => {}
                    Reply::Ack => {
                        let ack = reply(w, pkt, op::RC_ACK, aeth::ACK);
                        send_packet(w, ack);
                    }
                    Reply::AtomicAck(orig) => {
                        let mut resp = reply(w, pkt, op::RC_ATOMIC_ACK, aeth::ACK);
                        resp.atomic_ack = Some(orig);
                        send_packet(w, resp);
                    }
                    Reply::Packets(ps) => {
                        for r in ps {
                            send_packet(w, r);
                        }
                    }
                }
            }
        }
        Err(RespErr::Rnr) => {
            w.hcas[hca].counters.out_of_buffer += 1;
            if qt == qpt::RC {
                let t = w.hcas[hca].qps[&qpn].min_rnr_timer;
                nak(w, pkt, aeth::RNR_NAK | (t & 0x1f));
            } else if let Some(q) = w.hcas[hca].qps.get_mut(&qpn).filter(|_| qt == qpt::UC) {
                q.rc.resp.rx = None;
                q.rq_psn = (pkt.psn + 1) & 0xff_ffff;
            }
        }
        Err(RespErr::Nak(code, event)) => {
            if let Some(q) = w.hcas[hca].qps.get_mut(&qpn) {
                q.rc.resp.rx = None;
            }
            if qt == qpt::RC {
                nak(w, pkt, code);
                qp_to_err(w, hca, qpn, event);
            }
        }
        Err(RespErr::Silent) => {
            if let Some(q) = w.hcas[hca].qps.get_mut(&qpn) {
                q.rc.resp.rx = None;
                if qt == qpt::UC {
                    q.rq_psn = (pkt.psn + 1) & 0xff_ffff;
                }
            }
        }
    }
}

pub(super) fn first_of_message(opcode: u8) -> bool {
    matches!(
        opcode & 0x1f,
        0x00 | 0x04 | 0x05 | 0x06 | 0x0A | 0x0B | 0x0C | 0x13 | 0x14 | 0x17
    ) || opcode == op::RC_MASKED_ATOMIC
}

pub(super) fn last_of_message(opcode: u8) -> bool {
    matches!(opcode & 0x1f, 0x02..=0x05 | 0x08..=0x0B | 0x16 | 0x17)
}

/// What an executed request is answered with (RC), built when it is sent.
pub(super) enum Reply {
    None,
    /// An ACK of the request's PSN.
    Ack,
    /// An atomic acknowledgement carrying the original value.
    AtomicAck(u64),
    /// READ responses.
    Packets(Packets),
}

pub(super) enum RespErr {
    /// No receive WQE.
    Rnr,
    /// NAK with this AETH code; the responder QP goes to error with this async event.
    Nak(u8, u32),
    /// Drop without answer (UC/UD errors after the CQE was written).
    Silent,
}

/// Read `len` bytes at `va`/`rkey` for a READ request and build the response packets
/// (path-MTU sized, FIRST/MIDDLE/LAST or ONLY, PSNs from the request's).
pub(super) fn read_response(
    w: &mut World,
    hca: usize,
    qpn: u32,
    req: &Packet,
) -> Result<Packets, RespErr> {
    let q = &w.hcas[hca].qps[&qpn];
    let (pdn, qacc, mtu) = (q.pdn, q.access, transport::mtu_bytes(q.path_mtu) as usize);
    let r = req.reth.unwrap_or_default();
    let found = remote_reth(w, hca, pdn, qacc, r, access::REMOTE_READ);
    let pieces = match found {
        Err(KeyFault::Range { .. }) => indirect_pieces(w, hca, pdn, qacc, r, access::REMOTE_READ),
        _ => None,
    };
    let addr = match (found, &pieces) {
        (_, Some(sgl)) => sgl.first().map_or(0, |p| p.0),
        (Ok(a), None) => a,
        (Err(f), None) => {
            remote_refused(w, hca, qpn, "READ", f);
            return Err(RespErr::Nak(aeth::NAK_REM_ACCESS, ev::QP_ACCESS_ERR));
        }
    };
    let clock = tclock(w);
    rcheck(
        &mut w.trace,
        clock,
        hca,
        qpn,
        "rkey and access",
        true,
        || {
            format!(
                "READ rkey {:#010x} va {:#x} len {}: inside an MR with remote read",
                r.rkey, r.va, r.len
            )
        },
    );
    let data = match &pieces {
        Some(sgl) => gather(sgl).ok(),
        None => Payload::build(r.len as usize, |buf| mem::read(addr, buf)).ok(),
    }
    .ok_or(RespErr::Nak(aeth::NAK_REM_OP, ev::QP_FATAL))?;
    if r.len > 0 {
        note_read(w, hca, qpn, addr, r.va, r.rkey, r.len, "read response");
    }
    // MTU-sized parts of the data (one empty response for a zero-length READ).
    let n = data.len().div_ceil(mtu).max(1);
    let responses = (0..n)
        .map(|i| {
            let opcode = match (i == 0, i + 1 == n) {
                (true, true) => op::RC_READ_RESPONSE_ONLY,
                (true, false) => op::RC_READ_RESPONSE_FIRST,
                (false, false) => op::RC_READ_RESPONSE_MIDDLE,
                (false, true) => op::RC_READ_RESPONSE_LAST,
            };
            let mut p = reply(w, req, opcode, aeth::ACK);
            p.psn = (req.psn + i as u32) & 0xff_ffff;
            if opcode == op::RC_READ_RESPONSE_MIDDLE {
                p.aeth = None;
            }
            p.payload = data.part(i * mtu..((i + 1) * mtu).min(data.len()));
            p
        })
        .collect();
    Ok(Packets::Many(responses))
}

/// Execute one in-sequence request packet at the responder. Returns the reply (RC) and
/// how many PSNs the request consumed.
pub(super) fn execute_request(
    w: &mut World,
    hca: usize,
    qpn: u32,
    pkt: &Packet,
) -> Result<(Reply, u32), RespErr> {
    let q = &w.hcas[hca].qps[&qpn];
    let (pdn, qacc, qt, uidx) = (q.pdn, q.access, q.qp_type, q.uidx);
    let cqe_v1 = w.contexts.get(&q.ctx).is_some_and(|c| c.cqe_version == 1);
    let (recv_cq, scatter_ok, srq) = (q.recv_cq, q.scatter_cqe, q.srq);
    let rx = q.rc.resp.rx.clone();
    let had_rx = rx.is_some();
    let base = pkt.opcode & 0x1F;
    let ud = qt == qpt::UD;
    if pkt.opcode == op::RC_READ_REQUEST {
        w.hcas[hca].counters.rx_read_requests += 1;
        let resp = read_response(w, hca, qpn, pkt)?;
        let span = resp.len() as u32;
        return Ok((Reply::Packets(resp), span));
    }
    if let Some(a) = pkt.atomic.as_deref() {
        w.hcas[hca].counters.rx_atomic_requests += 1;
        let size = a.masked.map_or(8, |m| m.3);
        if a.va % u64::from(size) != 0 {
            return Err(RespErr::Nak(aeth::NAK_INV_REQ, ev::QP_REQ_ERR));
        }
        let found = remote(
            w,
            hca,
            pdn,
            qacc,
            a.rkey,
            a.va,
            u64::from(size),
            access::REMOTE_ATOMIC,
        );
        let addr = match found {
            Ok(a) => a,
            Err(f) => {
                remote_refused(w, hca, qpn, "atomic", f);
                return Err(RespErr::Nak(aeth::NAK_REM_ACCESS, ev::QP_ACCESS_ERR));
            }
        };
        let clock = tclock(w);
        rcheck(
            &mut w.trace,
            clock,
            hca,
            qpn,
            "rkey and access",
            true,
            || {
                format!(
                    "atomic rkey {:#010x} va {:#x} size {size}: aligned, inside an MR with remote atomic",
                    a.rkey, a.va
                )
            },
        );
        let orig = do_atomic(addr, pkt.opcode, a)
            .map_err(|_| RespErr::Nak(aeth::NAK_REM_OP, ev::QP_FATAL))?;
        note_read(
            w,
            hca,
            qpn,
            addr,
            a.va,
            a.rkey,
            u32::from(size),
            "atomic operand",
        );
        let new = orig.to_ne_bytes();
        note_write(
            w,
            hca,
            qpn,
            addr,
            usize::from(size),
            &new[..0],
            "atomic result",
        );
        let q = w.hcas[hca].qps.get_mut(&qpn).expect("responder QP exists");
        // The replay state holds the results of the last max_dest_rd_atomic atomics: as
        // many as a requester may have outstanding towards this QP.
        let keep = usize::from(q.max_dest_rd_atomic.max(1));
        while q.rc.resp.atomic_cache.len() >= keep {
            q.rc.resp.atomic_cache.pop_front();
        }
        q.rc.resp.atomic_cache.push_back((pkt.psn, orig));
        return Ok((Reply::AtomicAck(orig), 1));
    }
    let is_send = matches!(base, 0x00..=0x05 | 0x16 | 0x17);
    let is_write = matches!(base, 0x06..=0x0B) && !ud;
    if !is_send && !is_write {
        return Err(if qt == qpt::RC {
            RespErr::Nak(aeth::NAK_INV_REQ, ev::QP_REQ_ERR)
        } else {
            RespErr::Silent
        });
    }
    let (first, last) = (first_of_message(pkt.opcode), last_of_message(pkt.opcode));
    let inv = |qt| {
        if qt == qpt::RC {
            RespErr::Nak(aeth::NAK_INV_REQ, ev::QP_REQ_ERR)
        } else {
            RespErr::Silent
        }
    };
    // The message this packet belongs to.
    let mut msg = match (first, rx) {
        (true, Some(_)) if qt == qpt::RC => return Err(inv(qt)),
        (false, None) => return Err(inv(qt)),
        (false, Some(m)) if m.write != is_write => return Err(inv(qt)),
        (false, Some(m)) => m,
        (true, _) if is_write => {
            w.hcas[hca].counters.rx_write_requests += 1;
            let r = pkt.reth.unwrap_or_default();
            let found = remote_reth(w, hca, pdn, qacc, r, access::REMOTE_WRITE);
            if found.is_ok() {
                let clock = tclock(w);
                rcheck(
                    &mut w.trace,
                    clock,
                    hca,
                    qpn,
                    "rkey and access",
                    true,
                    || {
                        format!(
                            "WRITE rkey {:#010x} va {:#x} len {}: inside an MR with remote write",
                            r.rkey, r.va, r.len
                        )
                    },
                );
            }
            let pieces = match found {
                Err(KeyFault::Range { .. }) => {
                    indirect_pieces(w, hca, pdn, qacc, r, access::REMOTE_WRITE)
                }
                _ => None,
            };
            let (addr, scattered, sgl) = match (found, pieces) {
                (_, Some(sgl)) => (0, true, sgl),
                (Ok(a), None) => (a, false, Sgl::default()),
                (Err(f), None) => {
                    remote_refused(w, hca, qpn, "WRITE", f);
                    // A WRITE with immediate consumes a receive WQE even when its rkey check
                    // fails: that WQE completes with a local access error.
                    if pkt.imm.is_some() {
                        if let Some((segs, ctr, srqn)) = take_recv_wqe(w, hca, qpn) {
                            recv_done(w, segs);
                            let s = Syndrome::LOCAL_ACCESS;
                            let vend = VendorSyndrome::for_responder_syndrome(s).0;
                            responder_error_cqe(w, hca, qpn, ctr, srqn, s, vend);
                        }
                    }
                    return Err(if qt == qpt::RC {
                        RespErr::Nak(aeth::NAK_REM_ACCESS, ev::QP_ACCESS_ERR)
                    } else {
                        RespErr::Silent
                    });
                }
            };
            RxMsg {
                write: true,
                addr,
                scattered,
                sgl,
                total: u64::from(r.len),
                ..Default::default()
            }
        }
        (true, _) => {
            let Some((segs, ctr, srqn)) = take_recv_wqe(w, hca, qpn) else {
                if w.trace.on() {
                    let clock = w.now();
                    rcheck(&mut w.trace, clock, hca, qpn, "receive WQE", false, || {
                        "no receive WQE posted: RNR NAK".into()
                    });
                }
                no_recv_wqe(w, hca, qpn);
                return Err(RespErr::Rnr);
            };
            if w.trace.on() {
                let clock = w.now();
                rcheck(&mut w.trace, clock, hca, qpn, "receive WQE", true, || {
                    "a receive WQE is posted".into()
                });
                let sges = segs
                    .chunks_exact(16)
                    .filter_map(|c| DataSeg::read_from_bytes(c).ok())
                    .take_while(|d| d.lkey() != INVALID_LKEY)
                    .map(|d| (d.addr(), d.byte_count(), d.lkey()))
                    .collect();
                let now = w.now();
                w.trace.push(
                    hca,
                    now,
                    "mlx5_emu::device::responder::take_recv_wqe",
                    crate::trace::TraceWhat::RecvWqe {
                        qpn,
                        wqe_counter: ctr,
                        sges,
                    },
                );
            }
            let srq_pdn = srq
                .and_then(|s| w.hcas[hca].srqs.get(&s))
                .map_or(pdn, |s| s.pdn);
            let sgl = data_segs(w, hca, srq_pdn, &segs, access::LOCAL_WRITE, true);
            recv_done(w, segs);
            let sgl = match sgl {
                Ok(s) => s,
                Err(s) => {
                    let vend = if s == Syndrome::LOCAL_PROT {
                        recv_key_refused(w, hca, qpn)
                    } else {
                        VendorSyndrome::for_responder_syndrome(s).0
                    };
                    responder_error_cqe(w, hca, qpn, ctr, srqn, s, vend);
                    qp_to_err(w, hca, qpn, ev::QP_ACCESS_ERR);
                    return Err(if qt == qpt::RC {
                        RespErr::Nak(aeth::NAK_REM_OP, ev::QP_ACCESS_ERR)
                    } else {
                        RespErr::Silent
                    });
                }
            };
            let mut m = RxMsg {
                sgl,
                ctr,
                srqn,
                has_wqe: true,
                ..Default::default()
            };
            if ud {
                // The 40-byte GRH area heads the buffer; written only if a GRH came along.
                if pkt.grh.is_some() {
                    let _ = scatter_at(&m.sgl, 0, &grh_bytes(pkt));
                }
                m.offset = 40;
            }
            m
        }
    };
    // WRITE with immediate needs a receive WQE at the last packet: RNR before any effect.
    let needs_wqe_now = is_write && last && pkt.imm.is_some();
    if needs_wqe_now && !has_recv_wqe(w, hca, qpn) {
        return Err(RespErr::Rnr);
    }
    // The most a receive CQE takes in (scatter-to-CQE): 32 bytes, 64 in a 128-byte CQE.
    let limit = || {
        let cqe_size = w.hcas[hca].cqs.get(&recv_cq).map_or(64, |c| c.cqe_size);
        if cqe_size == 128 { 64 } else { 32 }
    };
    let mut cqe_scatter = None;
    if is_write {
        if msg.offset + pkt.payload.len() as u64 > msg.total {
            return Err(inv(qt));
        }
        let placed = if pkt.payload.is_empty() {
            Ok(())
        } else if msg.scattered {
            scatter_at(&msg.sgl, msg.offset, &pkt.payload).map_err(|_| ())
        } else {
            mem::write(msg.addr + msg.offset, &pkt.payload).map_err(|_| ())
        };
        if placed.is_err() {
            return Err(RespErr::Nak(aeth::NAK_REM_OP, ev::QP_FATAL));
        }
        if w.trace.active() && !pkt.payload.is_empty() {
            let at = msg.addr + msg.offset;
            note_write(
                w,
                hca,
                qpn,
                at,
                pkt.payload.len(),
                &pkt.payload,
                "write data",
            );
        }
        msg.offset += pkt.payload.len() as u64;
    } else if first && last && scatter_ok && !ud && pkt.payload.len() <= limit() {
        let cap: u64 = msg.sgl.iter().map(|s| u64::from(s.1)).sum();
        if pkt.payload.len() as u64 > cap {
            recv_too_long(w, hca, qpn, pkt.payload.len() as u64, cap);
            responder_error_cqe(
                w,
                hca,
                qpn,
                msg.ctr,
                msg.srqn,
                Syndrome::LOCAL_LENGTH,
                VendorSyndrome::for_responder_syndrome(Syndrome::LOCAL_LENGTH).0,
            );
            qp_to_err(w, hca, qpn, ev::QP_REQ_ERR);
            return Err(if qt == qpt::RC {
                RespErr::Nak(aeth::NAK_INV_REQ, ev::QP_REQ_ERR)
            } else {
                RespErr::Silent
            });
        }
        cqe_scatter = Some(pkt.payload.to_vec());
        msg.offset += pkt.payload.len() as u64;
    } else {
        if let Err(s) = scatter_at(&msg.sgl, msg.offset, &pkt.payload) {
            if s == Syndrome::LOCAL_LENGTH {
                let cap: u64 = msg.sgl.iter().map(|s| u64::from(s.1)).sum();
                recv_too_long(w, hca, qpn, msg.offset + pkt.payload.len() as u64, cap);
            }
            responder_error_cqe(
                w,
                hca,
                qpn,
                msg.ctr,
                msg.srqn,
                s,
                VendorSyndrome::for_responder_syndrome(s).0,
            );
            let code = if s == Syndrome::LOCAL_LENGTH {
                aeth::NAK_INV_REQ
            } else {
                aeth::NAK_REM_OP
            };
            qp_to_err(w, hca, qpn, ev::QP_REQ_ERR);
            return Err(if qt == qpt::RC {
                RespErr::Nak(code, ev::QP_REQ_ERR)
            } else {
                RespErr::Silent
            });
        }
        if w.trace.active() {
            note_scatter(
                w,
                hca,
                qpn,
                &msg.sgl,
                msg.offset,
                pkt.payload.len(),
                &pkt.payload,
                "send data",
            );
        }
        msg.offset += pkt.payload.len() as u64;
    }
    if !last {
        w.hcas[hca]
            .qps
            .get_mut(&qpn)
            .expect("responder QP exists")
            .rc
            .resp
            .rx = Some(msg);
        // Mid-message AckReq: acknowledge the progress (coalesced ACK of this PSN).
        let acks = if qt == qpt::RC && pkt.ack_req {
            Reply::Ack
        } else {
            Reply::None
        };
        return Ok((acks, 1));
    }
    if had_rx {
        // (Nothing since the start has set it: only a message in progress is to end.)
        w.hcas[hca]
            .qps
            .get_mut(&qpn)
            .expect("responder QP exists")
            .rc
            .resp
            .rx = None;
    }
    if is_write && pkt.imm.is_some() {
        let Some((segs, ctr, srqn)) = take_recv_wqe(w, hca, qpn) else {
            return Err(RespErr::Rnr);
        };
        recv_done(w, segs);
        msg.ctr = ctr;
        msg.srqn = srqn;
        msg.has_wqe = true;
    }
    if msg.has_wqe {
        let spec = CqeSpec {
            opcode: if is_write {
                CqeOpcode::RESP_RDMA_WRITE_IMM.0
            } else if pkt.imm.is_some() {
                CqeOpcode::RESP_SEND_IMM.0
            } else if pkt.inv_rkey.is_some() {
                CqeOpcode::RESP_SEND_INV.0
            } else {
                CqeOpcode::RESP_SEND.0
            },
            qpn,
            srqn_uidx: if cqe_v1 { uidx } else { msg.srqn },
            byte_cnt: if is_write {
                msg.total as u32
            } else {
                msg.offset as u32
            },
            imm: pkt
                .imm
                .or(pkt.inv_rkey.map(u32::to_be_bytes))
                .unwrap_or_default(),
            wqe_counter: msg.ctr,
            src_qp: pkt.src_qpn,
            grh: ud && pkt.grh.is_some(),
            roce: pkt.roce,
            slid: if pkt.roce.is_some() { 0 } else { pkt.slid },
            sl: pkt.sl,
            se: pkt.se,
            scatter: cqe_scatter,
            ..Default::default()
        };
        post_cqe(w, hca, recv_cq, &spec);
    }
    if qt == qpt::RC {
        Ok((Reply::Ack, 1))
    } else {
        Ok((Reply::None, 1))
    }
}

/// Scatter `data` at byte `offset` of the scatter list. Err(LOCAL_LENGTH) if it does not fit.
pub(super) fn scatter_at(sgl: &[(u64, u32)], offset: u64, data: &[u8]) -> Result<(), Syndrome> {
    let cap: u64 = sgl.iter().map(|s| u64::from(s.1)).sum();
    if offset + data.len() as u64 > cap {
        return Err(Syndrome::LOCAL_LENGTH);
    }
    let mut pos = 0u64; // start of the current segment in message space
    let mut done = 0usize;
    for &(a, l) in sgl {
        let l = u64::from(l);
        let want_start = offset + done as u64;
        if done < data.len() && want_start < pos + l {
            let inner = want_start - pos;
            let n = ((l - inner) as usize).min(data.len() - done);
            mem::write(a + inner, &data[done..done + n]).map_err(|_| Syndrome::LOCAL_PROT)?;
            done += n;
        }
        pos += l;
        if done >= data.len() {
            break;
        }
    }
    Ok(())
}

/// Read the posted receive WQEs `rq_head..rq_pi_seen` (at most one ring) into `data` in
/// one or two DMA reads. None if a read fails: the WQEs are then read one by one.
pub(super) fn prefetch_rq(q: &crate::state::Qp, stride: u64, data: &mut Vec<u8>) -> Option<()> {
    let n = u32::from(q.rq_pi_seen.wrapping_sub(q.rq_head as u16)).min(q.rq_wqe_cnt);
    let first = q.rq_head & (q.rq_wqe_cnt - 1);
    let till_end = (q.rq_wqe_cnt - first).min(n);
    data.clear();
    data.resize(n as usize * stride as usize, 0);
    let (a, b) = data.split_at_mut(till_end as usize * stride as usize);
    mem::read(q.buf + u64::from(first) * stride, a).ok()?;
    mem::read(q.buf, b).ok()?;
    Some(())
}

/// Whether the receive producer index cached from the doorbell record shows a posted WQE
/// (anything outside `1..=rq_wqe_cnt` ahead of `rq_head` is stale: re-read the record).
pub(super) fn rq_cached_avail(q: &crate::state::Qp) -> bool {
    let ahead = q.rq_pi_seen.wrapping_sub(q.rq_head as u16);
    ahead != 0 && u32::from(ahead) <= q.rq_wqe_cnt
}

pub(super) fn has_recv_wqe(w: &World, hca: usize, qpn: u32) -> bool {
    let q = &w.hcas[hca].qps[&qpn];
    if let Some(s) = q.srq.and_then(|s| w.hcas[hca].srqs.get(&s)) {
        return mem::read_be32(s.db)
            .is_ok_and(|p| ((p & WQ_PI_MASK) as u16).wrapping_sub(s.consumed as u16) != 0);
    }
    q.rq_wqe_cnt > 0
        && (rq_cached_avail(q)
            || mem::read_be32(q.db).is_ok_and(|p| (p & WQ_PI_MASK) as u16 != q.rq_head as u16))
}

/// The 40-byte GRH placed at the head of a UD receive buffer (IPv6-style header).
pub(super) fn grh_bytes(pkt: &Packet) -> [u8; 40] {
    let mut g = [0u8; 40];
    // RoCE v2: the UDP datagram is UDP (8) + BTH (12) + DETH (8) + ImmDt + payload + ICRC.
    let udp_len = 8 + 12 + 8 + if pkt.imm.is_some() { 4 } else { 0 } + pkt.payload.len() + 4;
    match (pkt.roce, pkt.grh.as_deref()) {
        (Some(2), Some(h)) => {
            // RoCE v2 over IPv4: the first 20 bytes are undefined (left zero), the IPv4
            // header fills the last 20.
            let ip = |gid: &[u8; 16]| crate::roce::gid_ipv4(gid).unwrap_or_default();
            g[20..].copy_from_slice(&crate::roce::ipv4_header(
                ip(&h.sgid),
                ip(&h.dgid),
                h.tclass,
                h.hop_limit,
                udp_len,
            ));
            return g;
        }
        (Some(1), Some(h)) => {
            // RoCE v2 over IPv6: the IPv6 header, next header UDP.
            let w0 = (6u32 << 28) | (u32::from(h.tclass) << 20) | (h.flow_label & 0xf_ffff);
            g[0..4].copy_from_slice(&w0.to_be_bytes());
            g[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
            g[6] = 17;
            g[7] = h.hop_limit;
            g[8..24].copy_from_slice(&h.sgid);
            g[24..40].copy_from_slice(&h.dgid);
            return g;
        }
        _ => {}
    }
    if let Some(h) = pkt.grh.as_deref() {
        let w0 = (6u32 << 28) | (u32::from(h.tclass) << 20) | (h.flow_label & 0xf_ffff);
        g[0..4].copy_from_slice(&w0.to_be_bytes());
        g[4..6].copy_from_slice(&((pkt.payload.len() + 12) as u16).to_be_bytes());
        g[6] = 0x1B;
        g[7] = h.hop_limit;
        g[8..24].copy_from_slice(&h.sgid);
        g[24..40].copy_from_slice(&h.dgid);
    }
    g
}

/// Perform an atomic on process memory at `addr` (validated); returns the original value
/// (host order, as `atomic_req_8B_endianness_mode` = host gives).
pub(super) fn do_atomic(addr: u64, opcode: u8, a: &AtomicEth) -> Result<u64, crate::abi::Errno> {
    let size = a.masked.map_or(8, |m| m.3);
    let mut buf = [0u8; 8];
    mem::read(addr, &mut buf[..size as usize])?;
    let orig = if size == 4 {
        u64::from(u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]))
    } else {
        u64::from_ne_bytes(buf)
    };
    let mask_all = if size == 4 { 0xffff_ffffu64 } else { u64::MAX };
    let new = match (opcode, a.masked) {
        (op::RC_CMP_SWAP, _) => {
            if orig == a.compare {
                a.swap_add
            } else {
                orig
            }
        }
        (op::RC_FETCH_ADD, _) => orig.wrapping_add(a.swap_add),
        (_, Some((m1, m2, true, _))) => {
            // masked CS: compare under compare_mask, swap the bits under swap_mask.
            if (orig ^ a.compare) & m2 == 0 {
                (orig & !m1) | (a.swap_add & m1)
            } else {
                orig
            }
        }
        (_, Some((boundary, _, false, _))) => {
            // masked FA: field_boundary bits mark the MSB of each field; carries stop there.
            let mut result = 0u64;
            let mut carry = 0u64;
            for bit in 0..u64::from(size) * 8 {
                let m = 1u64 << bit;
                let s = ((orig & m) >> bit) + ((a.swap_add & m) >> bit) + carry;
                result |= (s & 1) << bit;
                carry = if boundary & m != 0 { 0 } else { s >> 1 };
            }
            result
        }
        _ => orig,
    } & mask_all;
    if size == 4 {
        mem::write(addr, &(new as u32).to_ne_bytes())?;
    } else {
        mem::write(addr, &new.to_ne_bytes())?;
    }
    Ok(orig)
}

pub(super) fn duplicate(w: &mut World, pkt: &Packet, epsn: u32) {
    let hca = pkt.dst_hca;
    if pkt.opcode == op::RC_READ_REQUEST {
        // Re-execute the read (idempotent) with the original PSNs.
        if let Ok(resp) = read_response(w, hca, pkt.dst_qpn, pkt) {
            for p in resp {
                send_packet(w, p);
            }
        }
        return;
    }
    if pkt.atomic.is_some() {
        let cached = w.hcas[hca].qps[&pkt.dst_qpn]
            .rc
            .resp
            .atomic_cache
            .iter()
            .find(|(p, _)| *p == pkt.psn)
            .map(|c| c.1);
        if let Some(v) = cached {
            let mut resp = reply(w, pkt, op::RC_ATOMIC_ACK, aeth::ACK);
            resp.atomic_ack = Some(v);
            send_packet(w, resp);
        }
        return;
    }
    // SEND/WRITE: acknowledge everything received so far.
    let mut ack = reply(w, pkt, op::RC_ACK, aeth::ACK);
    ack.psn = epsn.wrapping_sub(1) & 0xff_ffff;
    send_packet(w, ack);
}
