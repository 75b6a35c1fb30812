//! The completion writer: CQEs exactly as hardware writes them, completion and async
//! events, requester/responder errors, the error state's flush.

// The stages share the device's imports and one another's `pub(super)` items (device/mod.rs).
use super::*;

pub(super) fn fire_event(w: &mut World, hca: usize, cqn: u32) {
    let Some(cq) = w.hcas[hca].cqs.get_mut(&cqn) else {
        return;
    };
    cq.armed = None;
    cq.last_fired_sn = Some(cq.armed_sn);
    let Some(ch) = cq.channel else { return };
    let handle = cq.user_handle;
    if let Some(Some(chan)) = w.channels.get_mut(ch) {
        if chan.push_for(&handle.to_ne_bytes(), EvObj::Cq(hca, cqn)) {
            w.hcas[hca].counters.comp_events += 1;
        }
    }
}

/// Everything a CQE says.
#[derive(Clone, Debug, Default)]
pub(super) struct CqeSpec {
    pub(super) opcode: u8,
    pub(super) qpn: u32,
    pub(super) srqn_uidx: u32,
    pub(super) byte_cnt: u32,
    pub(super) imm: [u8; 4],
    pub(super) wqe_counter: u16,
    pub(super) send_op: u8,
    pub(super) src_qp: u32,
    pub(super) grh: bool,
    /// Responder CQE of a RoCE packet: its network header type (0 GRH, 1 IPv6, 2 IPv4).
    pub(super) roce: Option<u8>,
    pub(super) slid: u16,
    pub(super) sl: u8,
    pub(super) se: bool,
    /// (syndrome, vendor syndrome) for error CQEs.
    pub(super) err: Option<(u8, u8)>,
    /// Data scattered into the CQE (format 1 or 2).
    pub(super) scatter: Option<Vec<u8>>,
    /// Raw Ethernet receive: (`hds_ip_ext`, `l4_hdr_type_etc`, `vlan_info`) (`raw.rs`).
    pub(super) raw: Option<(u8, u8, u16)>,
}

/// Write one CQE into CQ `cqn` of `hca` as hardware does; raises the completion event if
/// armed, the CQ error async event on overrun. Returns false if the CQE was not written.
pub(super) fn post_cqe(w: &mut World, hca: usize, cqn: u32, s: &CqeSpec) -> bool {
    let now = w.now();
    let Some(cq) = w.hcas[hca].cqs.get_mut(&cqn) else {
        return false;
    };
    if cq.in_error {
        return false;
    }
    // The consumer index only matters when the ring looks full: re-read it then.
    if cq.pi.wrapping_sub(cq.ci_seen) & CQ_CI_MASK >= cq.ncqe {
        cq.ci_seen = mem::read_be32(cq.db)
            .map(|v| v & CQ_CI_MASK)
            .unwrap_or(cq.ci_seen);
    }
    let ci = cq.ci_seen;
    if !cq.ignore_overrun && (cq.pi.wrapping_sub(ci) & CQ_CI_MASK) >= cq.ncqe {
        cq.in_error = true;
        let (ctx, uh) = (cq.ctx, cq.user_handle);
        w.async_event(ctx, uh, ev::CQ_ERR, EvObj::Cq(hca, cqn));
        // The QPs completing into it can report nothing more: each goes to the error
        // state with its fatal event (their flush CQEs are lost with the CQ).
        let mut at = None;
        while let Some(qpn) = next_qpn(w, hca, at) {
            at = Some(qpn);
            let q = &w.hcas[hca].qps[&qpn];
            let active = matches!(q.state, qps::RTR | qps::RTS | qps::SQD | qps::SQE);
            if active && (q.send_cq == cqn || q.recv_cq == cqn) {
                qp_to_err(w, hca, qpn, ev::QP_FATAL);
            }
        }
        return false;
    }
    let log = cq.ncqe.trailing_zeros();
    let owner = mlx5_hw::cqe::hw_owner_bit(cq.pi, log as u8);
    let entry = cq.buf + (cq.pi & (cq.ncqe - 1)) as u64 * cq.cqe_size as u64;
    let desc = entry + if cq.cqe_size == 128 { 64 } else { 0 };
    let mut format = 0;
    let mut bytes = [0u8; 64];
    if let Some(data) = &s.scatter {
        if cq.cqe_size == 128 && data.len() > 32 {
            format = 2;
            let mut first = [0u8; 64];
            first[..data.len().min(64)].copy_from_slice(&data[..data.len().min(64)]);
            if mem::write(entry, &first).is_err() {
                return false;
            }
        } else {
            format = 1;
            bytes[..data.len().min(32)].copy_from_slice(&data[..data.len().min(32)]);
        }
    }
    let opcode = CqeOpcode(s.opcode);
    if let Some((synd, vend)) = s.err {
        let mut e = ErrCqe::zeroed();
        e.srqn = Be32::new(s.srqn_uidx & 0xff_ffff);
        e.vendor_err_synd = vend;
        e.syndrome = synd;
        e.s_wqe_opcode_qpn = Be32::new((u32::from(s.send_op) << 24) | (s.qpn & 0xff_ffff));
        e.wqe_counter = Be16::new(s.wqe_counter);
        bytes.copy_from_slice(e.as_bytes());
    } else {
        let mut c = Cqe64::new_zeroed();
        c.slid = Be16::new(s.slid);
        // flags_rqpn: 29:28 GRH scattered to the buffer (1), 27:24 SL on InfiniBand; on
        // RoCE 25:24 carry the packet's network header type instead (and the SL, which
        // travels in the VLAN PCP, is absent without a VLAN).
        let l3 = match s.roce {
            Some(t) => u32::from(t & 3) << 24,
            None => u32::from(s.sl & 0xf) << 24,
        };
        c.flags_rqpn = Be32::new((s.src_qp & 0xff_ffff) | l3 | if s.grh { 1 << 28 } else { 0 });
        if let Some(t) = s.roce {
            // l4_hdr_type_etc: 6:4 L4 header type (2 = UDP for RoCE v2), 3:2 L3 header
            // type (1 IPv6, 2 IPv4; 0 for RoCE v1), 0 VLAN present (no VLAN here).
            let l4 = if t == 0 { 0 } else { 2 };
            c.l4_hdr_type_etc = (l4 << 4) | ((t & 3) << 2);
        }
        c.srqn_uidx = Be32::new(s.srqn_uidx & 0xff_ffff);
        c.imm_inval_pkey = Be32::from_bytes(s.imm);
        c.byte_cnt = Be32::new(s.byte_cnt);
        c.timestamp = Be64::new(now);
        if let Some((ext, l4_l3, vlan)) = s.raw {
            (c.hds_ip_ext, c.l4_hdr_type_etc, c.vlan_info) = (ext, l4_l3, Be16::new(vlan));
        }
        c.sop_drop_qpn = Be32::new((u32::from(s.send_op) << 24) | (s.qpn & 0xff_ffff));
        c.wqe_counter = Be16::new(s.wqe_counter);
        // Format 1 (32 bytes scattered into the CQE): the payload owns bytes 0..32, so the
        // fields there (slid, flags_rqpn, ...) are not written, as on hardware; the
        // provider copies `byte_cnt` bytes from the start of the descriptor.
        if format == 1 {
            bytes[32..].copy_from_slice(&c.as_bytes()[32..]);
        } else {
            bytes.copy_from_slice(c.as_bytes());
        }
    }
    // Body first, then the ownership byte, so the poller never sees a half-written CQE.
    bytes[63] = op_own(opcode, format, s.se, owner);
    if mem::write_last_byte_last(desc, &bytes).is_err() {
        return false;
    }
    let index = cq.pi;
    cq.pi = cq.pi.wrapping_add(1);
    let fire = match cq.armed {
        Some(sol) => !sol || s.se || s.err.is_some(),
        None => false,
    };
    let counters = &mut w.hcas[hca].counters;
    counters.cqes_written += 1;
    if w.trace.active() {
        let cqe_len = if format == 2 { 128 } else { 64 };
        crate::trace::dma_write(counters, entry, cqe_len);
        if w.trace.on() {
            w.trace.push(
                hca,
                now,
                "mlx5_emu::device::completion::post_cqe",
                crate::trace::TraceWhat::Cqe {
                    cqn,
                    index,
                    addr: desc,
                    bytes: bytes.to_vec(),
                },
            );
        }
    }
    let counters = &mut w.hcas[hca].counters;
    if let Some((synd, _)) = s.err {
        let flush = synd == Syndrome::WR_FLUSH.0;
        match (s.opcode == CqeOpcode::REQ_ERR.0, flush) {
            (true, true) => counters.req_cqe_flush_error += 1,
            (true, false) => counters.req_cqe_error += 1,
            (false, true) => counters.resp_cqe_flush_error += 1,
            (false, false) => counters.resp_cqe_error += 1,
        }
    }
    if fire {
        fire_event(w, hca, cqn);
    }
    true
}

/// Fill in the QP's number and user index and write `spec` to the QP's send CQ.
pub(super) fn post_send_cqe(w: &mut World, hca: usize, qpn: u32, spec: CqeSpec) {
    let Some(q) = w.hcas[hca].qps.get(&qpn) else {
        return;
    };
    let spec = CqeSpec {
        qpn,
        srqn_uidx: q.uidx,
        ..spec
    };
    let cq = q.send_cq;
    post_cqe(w, hca, cq, &spec);
}

/// Write a requester error CQE (REQ_ERR) for the send WQE at `idx`.
pub(super) fn req_err_cqe(
    w: &mut World,
    hca: usize,
    qpn: u32,
    idx: u16,
    send_op: u8,
    synd: Syndrome,
) {
    let vend = match synd {
        // A local protection error: the memory-translation code of the key check that failed
        // (gather list 0x50 | detail), noted as the device's view.
        Syndrome::LOCAL_PROT => {
            if let Some(f) = w.checks.last.get() {
                let d = f.describe("lkey", "at the requester");
                note_failed(w, hca, qpn, "requester", f.check(), d);
            }
            take_tpt_vendor(w, 0x50)
        }
        // The decoder's code for an RNR NAK with the retry limit exceeded (no public log
        // pairs it with the syndrome; docs/diagnostics.md).
        Syndrome::RNR_RETRY_EXC => {
            let d = "RNR NAKs from the responder after rnr_retry retries: it had no receive WQE"
                .to_owned();
            note_failed(w, hca, qpn, "requester", "receive WQE", d);
            0x87
        }
        Syndrome::TRANSPORT_RETRY_EXC => {
            let d = "no ACK from the responder after retry_cnt retransmissions".to_owned();
            note_failed(w, hca, qpn, "requester", "ACK", d);
            VendorSyndrome::for_syndrome(synd).0
        }
        _ => VendorSyndrome::for_syndrome(synd).0,
    };
    let err = Some((synd.0, vend));
    let spec = CqeSpec {
        opcode: CqeOpcode::REQ_ERR.0,
        wqe_counter: idx,
        send_op,
        err,
        ..Default::default()
    };
    post_send_cqe(w, hca, qpn, spec);
}

/// A send WQE failed: its error CQE, the counters, and the QP to the error state (a UD QP
/// to the send queue error state).
pub(super) fn requester_error(
    w: &mut World,
    hca: usize,
    qpn: u32,
    idx: u16,
    send_op: u8,
    synd: Syndrome,
) {
    req_err_cqe(w, hca, qpn, idx, send_op, synd);
    match synd {
        Syndrome::TRANSPORT_RETRY_EXC => w.hcas[hca].counters.req_transport_retries_exceeded += 1,
        Syndrome::RNR_RETRY_EXC => w.hcas[hca].counters.req_rnr_retries_exceeded += 1,
        _ => {}
    }
    let rc = w.hcas[hca]
        .qps
        .get(&qpn)
        .is_none_or(|q| q.qp_type == qpt::RC);
    if rc {
        // The error CQE is the report: mlx5 raises no affiliated async event for an error
        // its CQE carries (IBA 11.6.3: a work queue catastrophic error is one that cannot
        // be reported through a completion), so a program that never reads async events
        // has none to acknowledge before `ibv_destroy_qp` returns.
        if let Some(q) = w.hcas[hca].qps.get_mut(&qpn) {
            q.state = qps::ERR;
        }
        return;
    }
    // A UD or UC QP's send error is not fatal (IBA 10.3.1, the SQEr state): the QP goes to
    // the send queue error state, where its receive queue goes on and every send WQE after
    // the failed one (outstanding or posted later) completes with a flush error until a
    // modify back to RTS (`flush_sq`); no async event (the CQE is the report).
    if let Some(q) = w.hcas[hca].qps.get_mut(&qpn) {
        if matches!(q.state, qps::RTS | qps::SQD) {
            q.state = qps::SQE;
        }
    }
}

pub(super) fn qp_to_err(w: &mut World, hca: usize, qpn: u32, event: u32) {
    let Some(q) = w.hcas[hca].qps.get_mut(&qpn) else {
        return;
    };
    if q.state == qps::ERR {
        return;
    }
    q.state = qps::ERR;
    let (ctx, uh) = (q.ctx, q.user_handle);
    w.async_event(ctx, uh, event, EvObj::Qp(hca, qpn));
}

pub(super) fn requester_ok(
    w: &mut World,
    hca: usize,
    qpn: u32,
    idx: u16,
    send_op: u8,
    byte_cnt: u32,
    scatter: Option<Vec<u8>>,
) {
    let spec = CqeSpec {
        opcode: CqeOpcode::REQ.0,
        byte_cnt,
        wqe_counter: idx,
        send_op,
        scatter,
        ..Default::default()
    };
    post_send_cqe(w, hca, qpn, spec);
}

pub(super) fn responder_error_cqe(
    w: &mut World,
    hca: usize,
    qpn: u32,
    ctr: u16,
    srqn: u32,
    synd: Syndrome,
    vend: u8,
) {
    let Some(q) = w.hcas[hca].qps.get(&qpn) else {
        return;
    };
    let cqe_v1 = w.contexts.get(&q.ctx).is_some_and(|c| c.cqe_version == 1);
    let spec = CqeSpec {
        opcode: CqeOpcode::RESP_ERR.0,
        qpn,
        srqn_uidx: if cqe_v1 { q.uidx } else { srqn },
        wqe_counter: ctr,
        err: Some((synd.0, vend)),
        ..Default::default()
    };
    let cq = q.recv_cq;
    post_cqe(w, hca, cq, &spec);
}

pub(super) fn flush_qp(w: &mut World, hca: usize, qpn: u32) -> usize {
    let mut n = flush_sq(w, hca, qpn);
    // And every posted receive WQE (not SRQ WQEs: the SRQ is shared).
    for _ in 0..MAX_WQES_PER_QP_STEP {
        let Some(q) = w.hcas[hca].qps.get(&qpn) else {
            return n;
        };
        if q.srq.is_some() || q.rq_wqe_cnt == 0 {
            break;
        }
        let Ok(pi) = mem::read_be32(q.db) else { break };
        if (pi & WQ_PI_MASK) as u16 == (q.rq_head as u16) {
            break;
        }
        let ctr = q.rq_head as u16;
        if let Some(q) = w.hcas[hca].qps.get_mut(&qpn) {
            q.rq_head = q.rq_head.wrapping_add(1);
        }
        responder_error_cqe(
            w,
            hca,
            qpn,
            ctr,
            0,
            Syndrome::WR_FLUSH,
            VendorSyndrome::WR_FLUSH.0,
        );
        n += 1;
    }
    n
}

/// Complete every outstanding request and every WQE rung on the send queue with a flush
/// error, in order: the error state's send half, and all of the send queue error state
/// (SQE: the send queue flushes, the receive queue works on; IBA 10.3.1).
pub(super) fn flush_sq(w: &mut World, hca: usize, qpn: u32) -> usize {
    let mut n = 0;
    // Outstanding requests first (they are older than anything still in the SQ).
    loop {
        let Some(q) = w.hcas[hca].qps.get_mut(&qpn) else {
            return n;
        };
        let Some(o) = q.rc.req.outstanding.pop_front() else {
            break;
        };
        flush_send(w, hca, qpn, o.wqe_idx, o.opcode);
        n += 1;
    }
    // Then every WQE rung on the SQ.
    for _ in 0..MAX_WQES_PER_QP_STEP {
        let Some(q) = w.hcas[hca].qps.get(&qpn) else {
            return n;
        };
        if (q.sq_head as u16) == q.sq_rung || q.sq_wqe_cnt == 0 {
            break;
        }
        let sq = q.sq_base;
        let head = q.sq_head;
        let (bbs, opc) = match read_wqe(sq, q.sq_wqe_cnt, head, 16)
            .ok()
            .and_then(|b| CtrlSeg::read_from_bytes(&b).ok())
        {
            Some(c) => ((c.ds() as u32).div_ceil(4).max(1), c.opcode().0),
            None => (1, 0),
        };
        flush_send(w, hca, qpn, head as u16, opc);
        if let Some(q) = w.hcas[hca].qps.get_mut(&qpn) {
            q.sq_head = q.sq_head.wrapping_add(bbs);
        }
        n += 1;
    }
    n
}

pub(super) fn flush_send(w: &mut World, hca: usize, qpn: u32, idx: u16, opcode: u8) {
    req_err_cqe(w, hca, qpn, idx, opcode, Syndrome::WR_FLUSH);
}
