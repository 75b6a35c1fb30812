//! WQE execution: decode and validate one send WQE and build its request packet.

// The stages share the device's imports and one another's `pub(super)` items (device/mod.rs).
use super::*;

/// The parsed, validated form of one send WQE.
pub(super) struct Wqe<'a> {
    pub(super) idx: u16,
    pub(super) opcode: SendOpcode,
    pub(super) signaled: bool,
    pub(super) se: bool,
    pub(super) fence: bool,
    pub(super) imm: [u8; 4],
    /// Its `ds * 16` bytes, joined across the ring end.
    pub(super) bytes: &'a [u8],
    pub(super) wqebbs: u32,
}

/// Execute the send WQE at the QP's `sq_head`: from the prefetch `pf` when it covers the
/// WQE, else read from the ring into `buf` (a reused buffer).
pub(super) fn exec_wqe(
    w: &mut World,
    hca: usize,
    qpn: u32,
    pf: Option<&Prefetch>,
    buf: &mut Vec<u8>,
) -> Exec {
    let q = &w.hcas[hca].qps[&qpn];
    let sq = q.sq_base;
    let (cnt, head) = (q.sq_wqe_cnt, q.sq_head);
    let idx = head as u16;
    if q.rc.req.halted {
        return Exec::Blocked;
    }
    if cnt == 0 {
        return Exec::Done(1);
    }
    // The first WQEBB in one read; the rest (if any) after the ctrl segment is checked.
    buf.clear();
    let first_pf = pf.and_then(|p| p.get(head, 64));
    // Ring reads made here (not covered by the prefetch), for the link counters and the
    // trace: noted once the QP is no longer borrowed.
    let mut first_read = false;
    let mut rest_read = false;
    if first_pf.is_none() {
        if read_wqe_into(sq, cnt, head, 64, buf).is_err() {
            fail_wqe(w, hca, qpn, idx, 0, Syndrome::LOCAL_PROT);
            return Exec::Done(1);
        }
        first_read = true;
    }
    let first = first_pf.unwrap_or(&buf[..]);
    let ctrl = CtrlSeg::read_from_bytes(&first[..16]).unwrap_or_else(|_| CtrlSeg::new_zeroed());
    let ds = ctrl.ds() as u32;
    let wqebbs = ds.div_ceil(4).max(1);
    let opcode = ctrl.opcode();
    if ds == 0 || ctrl.qpn() != qpn || ctrl.wqe_index() != idx {
        if first_read {
            let b = std::mem::take(buf);
            note_fetch(w, hca, qpn, (sq, cnt), head, 64, &b);
            *buf = b;
        }
        fail_wqe(w, hca, qpn, idx, opcode.0, Syndrome::LOCAL_QP_OP);
        return Exec::Done(wqebbs);
    }
    let len = ds as usize * 16;
    let bytes: &[u8] = match pf.and_then(|p| p.get(head, len)) {
        Some(all) => all,
        None => {
            if let Some(f) = first_pf {
                buf.clear();
                buf.extend_from_slice(f);
            }
            if len <= 64 {
                buf.truncate(len);
            } else {
                let rest = head.wrapping_add(1);
                let got = match pf.and_then(|p| p.get(rest, len - 64)) {
                    Some(r) => {
                        buf.extend_from_slice(r);
                        Ok(())
                    }
                    None => {
                        let r = read_wqe_into(sq, cnt, rest, len - 64, buf);
                        rest_read = r.is_ok();
                        r
                    }
                };
                if got.is_err() {
                    fail_wqe(w, hca, qpn, idx, opcode.0, Syndrome::LOCAL_PROT);
                    return Exec::Done(wqebbs);
                }
            }
            buf
        }
    };
    let wqe = Wqe {
        idx,
        opcode,
        signaled: ctrl.fm_ce_se & 0x0C != 0,
        se: ctrl.solicited(),
        fence: ctrl.fm_ce_se & 0xE0 != 0,
        imm: ctrl.imm.to_bytes(),
        bytes,
        wqebbs,
    };
    let qt = q.qp_type;
    // Ordering constraints for RC: fence waits for outstanding READ/atomics; the number of
    // outstanding READ/atomics is bounded by max_rd_atomic.
    if qt == qpt::RC {
        // Every READ/atomic still on the outstanding list counts, answered or not: the
        // responder keeps the answers of that many for replay (max_dest_rd_atomic), and
        // one answered behind a lost answer is still outstanding until it retires.
        let reads = || {
            q.rc.req
                .outstanding
                .iter()
                .filter(|o| o.is_read_like)
                .count()
        };
        let is_read = matches!(
            opcode,
            SendOpcode::RDMA_READ
                | SendOpcode::ATOMIC_CS
                | SendOpcode::ATOMIC_FA
                | SendOpcode::ATOMIC_MASKED_CS
                | SendOpcode::ATOMIC_MASKED_FA
        );
        if (wqe.fence && reads() > 0) || (is_read && reads() >= usize::from(q.max_rd_atomic.max(1)))
        {
            note_wqe_reads(
                w,
                hca,
                qpn,
                (sq, cnt),
                head,
                (first_read, rest_read),
                wqe.bytes,
            );
            return Exec::Blocked;
        }
    }
    // DC (device/dc.rs): a WQE for another DCT waits until the current one is done with.
    let dc_wait = !dc::dci_ready(w, hca, qpn, wqe.bytes);
    note_wqe_reads(
        w,
        hca,
        qpn,
        (sq, cnt),
        head,
        (first_read, rest_read),
        wqe.bytes,
    );
    if dc_wait || qt == qpt::RAW_PACKET && super::raw::pacing_wait(w, hca, qpn) {
        return Exec::Blocked;
    }
    w.wqe_log.fetched(hca, qpn, idx, wqe.bytes);
    let c = &mut w.hcas[hca].counters;
    c.wqes_executed += 1;
    if qt == qpt::RAW_PACKET {
        exec_raw(w, hca, qpn, &wqe);
        return Exec::Done(wqe.wqebbs);
    }
    match build_request(w, hca, qpn, &wqe) {
        Ok((pkt, local, len)) => {
            post_request(w, hca, qpn, &wqe, pkt, local, len);
        }
        Err(s) => {
            fail_wqe(w, hca, qpn, idx, opcode.0, s);
        }
    }
    Exec::Done(wqe.wqebbs)
}

/// Note the ring reads [`exec_wqe`] made itself: its first WQEBB (64 bytes at `head`) and
/// the rest of the WQE (`bytes[64..]`).
#[inline(always)]
fn note_wqe_reads(
    w: &mut World,
    hca: usize,
    qpn: u32,
    ring: (u64, u32),
    head: u32,
    (first, rest): (bool, bool),
    bytes: &[u8],
) {
    if w.trace.active() && (first || rest) {
        if first {
            note_fetch(w, hca, qpn, ring, head, 64, &bytes[..bytes.len().min(64)]);
        }
        if rest && bytes.len() > 64 {
            let n = bytes.len() - 64;
            note_fetch(w, hca, qpn, ring, head.wrapping_add(1), n, &bytes[64..]);
        }
    }
}

/// One segment of a send WQE's payload part: inline data (its bytes, at `start..end` of the
/// WQE) or a data pointer.
#[derive(Clone, Copy)]
enum Seg {
    Inline { start: usize, end: usize },
    Pointer(DataSeg),
}

/// Walk the payload segments of `rest` (the WQE from the first payload segment to its last
/// byte, `ds * 16` in all), in order, as the device's gather engine does: a segment whose
/// first word has the inline bit set is an inline data segment of that many bytes, padded
/// to 16 (it may span WQEBBs, and the ring's end: `rest` is joined across it); any other
/// 16 bytes are a data pointer segment. The PRM allows them mixed, in any order (UCX sends
/// its active-message header inline and the payload by pointer). Inline data running past
/// the WQE's `ds` is a local length error.
fn walk_segs(rest: &[u8], mut f: impl FnMut(Seg) -> Result<(), Syndrome>) -> Result<(), Syndrome> {
    let mut at = 0;
    while at < rest.len() {
        let chunk = rest.get(at..at + 16).ok_or(Syndrome::LOCAL_LENGTH)?;
        let hdr = u32::from_be_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        if hdr & INLINE_SEG_FLAG != 0 {
            let len = (hdr & !INLINE_SEG_FLAG) as usize;
            let (start, end) = (at + 4, at + 4 + len);
            if end > rest.len() {
                return Err(Syndrome::LOCAL_LENGTH);
            }
            f(Seg::Inline { start, end })?;
            at = (end + 15) & !15;
        } else {
            let d = DataSeg::read_from_bytes(chunk).map_err(|_| Syndrome::LOCAL_QP_OP)?;
            f(Seg::Pointer(d))?;
            at += 16;
        }
    }
    Ok(())
}

/// Decode the payload part of a WQE at byte offset `off`: any sequence of inline data and
/// data pointer segments (see [`walk_segs`]), gathered in order into one payload.
pub(super) fn payload(
    w: &mut World,
    hca: usize,
    qpn: u32,
    pdn: u32,
    bytes: &[u8],
    off: usize,
) -> Result<Payload, Syndrome> {
    let rest = bytes.get(off..).unwrap_or(&[]);
    // Pass 1: validate and translate; the pointers' process addresses in order.
    let mut sgl = Sgl::default();
    let mut total: u64 = 0;
    let mut inline = false;
    let mut mixed = false;
    walk_segs(rest, |s| {
        match s {
            Seg::Inline { start, end } => {
                inline = true;
                total += (end - start) as u64;
            }
            Seg::Pointer(d) => {
                let len = d.byte_count();
                // A byte count of 0 is 2 GiB (PRM: the field's full range).
                let len = if len == 0 { 0x8000_0000 } else { len };
                let addr = translate(w, hca, d.lkey(), pdn, d.addr(), u64::from(len), 0)
                    .ok_or(Syndrome::LOCAL_PROT)?;
                sgl.push((addr, len));
                total += u64::from(len);
            }
        }
        mixed |= inline && !sgl.is_empty();
        if total > 0x8000_0000 {
            return Err(Syndrome::LOCAL_LENGTH);
        }
        Ok(())
    })?;
    if inline {
        w.hcas[hca].counters.inline_wqes += 1;
    }
    if !inline {
        note_gather(w, hca, qpn, rest, &sgl);
        return gather(&sgl);
    }
    if mixed && w.trace.active() {
        // The pointer segments alone, for the per-segment trace (cold: tracing only).
        let mut segs = Vec::new();
        let _ = walk_segs(rest, |s| {
            if let Seg::Pointer(d) = s {
                segs.extend_from_slice(d.as_bytes());
            }
            Ok(())
        });
        note_gather(w, hca, qpn, &segs, &sgl);
    }
    // Pass 2: copy, in segment order.
    Payload::build(total as usize, |buf| {
        let mut off = 0;
        let mut next = sgl.iter();
        walk_segs(rest, |s| {
            let part: usize = match s {
                Seg::Inline { start, end } => {
                    buf[off..off + (end - start)].copy_from_slice(&rest[start..end]);
                    end - start
                }
                Seg::Pointer(_) => {
                    let &(a, l) = next.next().ok_or(Syndrome::LOCAL_QP_OP)?;
                    let l = l as usize;
                    mem::read(a, &mut buf[off..off + l]).map_err(|_| Syndrome::LOCAL_PROT)?;
                    l
                }
            };
            off += part;
            Ok(())
        })
    })
}

/// Count (link counters) and trace the payload DMA reads of a gather: one read per data
/// segment of `segs` (translated in `sgl`).
#[inline(always)]
pub(super) fn note_gather(w: &mut World, hca: usize, qpn: u32, segs: &[u8], sgl: &[(u64, u32)]) {
    if w.trace.active() {
        note_gather_on(w, hca, qpn, segs, sgl);
    }
}

#[cold]
#[allow(clippy::too_many_arguments)]
fn note_gather_on(w: &mut World, hca: usize, qpn: u32, segs: &[u8], sgl: &[(u64, u32)]) {
    let c = &mut w.hcas[hca].counters;
    for &(addr, len) in sgl {
        crate::trace::dma_read(c, addr, u64::from(len));
        c.payload_reads += 1;
        c.payload_read_bytes += u64::from(len);
    }
    if w.trace.on() {
        let now = w.now();
        for (chunk, &(_, len)) in segs.chunks_exact(16).zip(sgl) {
            let Ok(d) = DataSeg::read_from_bytes(chunk) else {
                break;
            };
            w.trace.push(
                hca,
                now,
                "mlx5_emu::device::execute::payload",
                crate::trace::TraceWhat::DmaRead {
                    qpn,
                    va: d.addr(),
                    len,
                    key: d.lkey(),
                    purpose: "gather",
                },
            );
        }
    }
}

/// Validate a WQE and turn it into the request packet. Returns (packet, local scatter list
/// for responses, message length).
pub(super) fn build_request(
    w: &mut World,
    hca: usize,
    qpn: u32,
    wqe: &Wqe<'_>,
) -> Result<(Packet, Sgl, u32), Syndrome> {
    let q = &w.hcas[hca].qps[&qpn];
    let (qt, pdn, mtu) = (q.qp_type, q.pdn, transport::mtu_bytes(q.path_mtu));
    let me = &w.hcas[hca].info;
    let mut p = Packet {
        src_hca: hca,
        slid: me.lid,
        src_qpn: qpn,
        se: wqe.se,
        ack_req: true,
        sl: q.path.sl,
        ..Default::default()
    };
    let b = wqe.bytes;
    let tbits = match qt {
        qpt::UC => op::UC,
        _ => 0,
    };
    let mut local = Sgl::default();
    let mut len = 0u32;
    if qt == qpt::UD {
        let av = DatagramSeg::read_from_bytes(b.get(16..64).ok_or(Syndrome::LOCAL_QP_OP)?)
            .map_err(|_| Syndrome::LOCAL_QP_OP)?;
        p.opcode = match wqe.opcode {
            SendOpcode::SEND => op::UD_SEND_ONLY,
            SendOpcode::SEND_IMM => op::UD_SEND_ONLY_IMM,
            _ => return Err(Syndrome::LOCAL_QP_OP),
        };
        let qkey = av.qkey();
        p.qkey = if qkey & 0x8000_0000 != 0 {
            q.qkey
        } else {
            qkey
        };
        p.dst_qpn = av.dqpn();
        if w.hcas[hca].info.is_roce() {
            // RoCE address vector (as libmlx5 builds it): the GRH bit is reserved (every
            // packet has a network header), rgid is the destination, bits 27:20 of
            // grh_gid_fl the source GID index, rmac the destination MAC, rlid the UDP
            // source port (RoCE v2). The frame goes to rmac: a MAC that is not the
            // destination node's loses the packet on the way.
            let (sgid, l3) = roce_source(w, hca, av.sgid_index()).ok_or(Syndrome::LOCAL_QP_OP)?;
            let node = crate::roce::node_of_gid(&av.rgid);
            let mac_ok = node.is_some_and(|n| {
                av.rmac == crate::roce::mac_of_guid(crate::roce::BASE_GUID + u64::from(n))
            });
            p.dst_lid = if mac_ok { node.unwrap_or(0) } else { 0 };
            p.roce = Some(l3);
            p.sl = (av.stat_rate_sl >> 1) & 7;
            p.grh = Some(av_grh(&av, sgid));
        } else {
            p.dst_lid = route(w, av.rlid(), if av.grh() { Some(av.rgid) } else { None })
                .ok_or(Syndrome::LOCAL_QP_OP)?;
            if av.grh() {
                p.grh = Some(av_grh(&av, w.hcas[hca].info.port_gid));
            }
        }
        if wqe.opcode == SendOpcode::SEND_IMM {
            p.imm = Some(wqe.imm);
        }
        p.payload = payload(w, hca, qpn, pdn, b, 64)?;
        if p.payload.len() as u32 > mtu {
            return Err(Syndrome::LOCAL_LENGTH);
        }
        return Ok((p, local, 0));
    }
    // Connected: destination from the QP context.
    p.dst_qpn = q.dest_qpn;
    if me.is_roce() {
        // RoCE: routed by the destination GID (the DLID is not used); the packet type
        // follows the source GID's type.
        let (sgid_index, dgid) = (q.path.sgid_index, q.path.dgid);
        p.dst_lid = crate::roce::node_of_gid(&dgid).unwrap_or(0);
        p.roce = roce_source(w, hca, sgid_index).map(|(_, l3)| l3);
    } else {
        p.dst_lid = route(
            w,
            q.path.dlid,
            if q.path.is_global {
                Some(q.path.dgid)
            } else {
                None
            },
        )
        .unwrap_or(0);
    }
    // XRC and DC (device/xrc.rs): the transport segment after the control segment goes
    // into the packet; the rest reads as an RC WQE.
    let mut joined = [0u8; 1024];
    let b = match transport_segment(w, hca, qpn, b, &mut joined, &mut p)? {
        Some(n) => &joined[..n],
        None => b,
    };
    let raddr = || -> Result<RaddrSeg, Syndrome> {
        RaddrSeg::read_from_bytes(b.get(16..32).ok_or(Syndrome::LOCAL_QP_OP)?)
            .map_err(|_| Syndrome::LOCAL_QP_OP)
    };
    match wqe.opcode {
        SendOpcode::NOP => {
            p.opcode = 0xFF;
        }
        SendOpcode::SEND | SendOpcode::SEND_IMM | SendOpcode::SEND_INVAL => {
            p.opcode = tbits
                | match wqe.opcode {
                    SendOpcode::SEND => op::RC_SEND_ONLY,
                    SendOpcode::SEND_IMM => op::RC_SEND_ONLY_IMM,
                    _ if qt == qpt::RC => op::RC_SEND_ONLY_INV,
                    _ => return Err(Syndrome::LOCAL_QP_OP),
                };
            if wqe.opcode == SendOpcode::SEND_IMM {
                p.imm = Some(wqe.imm);
            }
            if wqe.opcode == SendOpcode::SEND_INVAL {
                p.inv_rkey = Some(u32::from_be_bytes(wqe.imm));
            }
            p.payload = payload(w, hca, qpn, pdn, b, 16)?;
            len = p.payload.len() as u32;
        }
        SendOpcode::RDMA_WRITE | SendOpcode::RDMA_WRITE_IMM => {
            let r = raddr()?;
            p.opcode = tbits
                | if wqe.opcode == SendOpcode::RDMA_WRITE {
                    op::RC_WRITE_ONLY
                } else {
                    op::RC_WRITE_ONLY_IMM
                };
            if wqe.opcode == SendOpcode::RDMA_WRITE_IMM {
                p.imm = Some(wqe.imm);
            }
            p.payload = payload(w, hca, qpn, pdn, b, 32)?;
            len = p.payload.len() as u32;
            p.reth = Some(Reth {
                va: r.raddr(),
                rkey: r.rkey(),
                len,
            });
        }
        SendOpcode::RDMA_READ if qt == qpt::RC => {
            let r = raddr()?;
            local = data_segs(w, hca, pdn, &b[32..], access::LOCAL_WRITE, false)?;
            let total: u64 = local.iter().map(|s| s.1 as u64).sum();
            if total > 0x8000_0000 {
                return Err(Syndrome::LOCAL_LENGTH);
            }
            len = total as u32;
            p.opcode = op::RC_READ_REQUEST;
            p.reth = Some(Reth {
                va: r.raddr(),
                rkey: r.rkey(),
                len,
            });
        }
        SendOpcode::ATOMIC_CS | SendOpcode::ATOMIC_FA if qt == qpt::RC => {
            let r = raddr()?;
            let a = AtomicSeg::read_from_bytes(b.get(32..48).ok_or(Syndrome::LOCAL_QP_OP)?)
                .map_err(|_| Syndrome::LOCAL_QP_OP)?;
            local = data_segs(
                w,
                hca,
                pdn,
                b.get(48..).unwrap_or(&[]),
                access::LOCAL_WRITE,
                false,
            )?;
            let total: u64 = local.iter().map(|s| s.1 as u64).sum();
            if total != 8 {
                return Err(Syndrome::LOCAL_LENGTH);
            }
            len = 8;
            p.opcode = if wqe.opcode == SendOpcode::ATOMIC_CS {
                op::RC_CMP_SWAP
            } else {
                op::RC_FETCH_ADD
            };
            p.atomic = Some(Box::new(AtomicEth {
                va: r.raddr(),
                rkey: r.rkey(),
                swap_add: a.swap_add(),
                compare: a.compare(),
                masked: None,
            }));
        }
        SendOpcode::ATOMIC_MASKED_CS | SendOpcode::ATOMIC_MASKED_FA if qt == qpt::RC => {
            let r = raddr()?;
            let opmod = (u32::from_be_bytes([b[0], b[1], b[2], b[3]]) >> 24) as u8;
            let size: u8 = match opmod {
                0x08 => 4,
                0x09 => 8,
                _ => return Err(Syndrome::LOCAL_QP_OP),
            };
            let is_cs = wqe.opcode == SendOpcode::ATOMIC_MASKED_CS;
            let be = |o: usize, n: u8| -> u64 {
                let s = b.get(o..o + n as usize).unwrap_or(&[]);
                s.iter().fold(0u64, |acc, &x| (acc << 8) | u64::from(x))
            };
            let (swap_add, compare, m1, m2, seg_len) = match (is_cs, size) {
                (true, 4) => (be(32, 4), be(36, 4), be(40, 4), be(44, 4), 16),
                (true, _) => (be(32, 8), be(40, 8), be(48, 8), be(56, 8), 32),
                (false, 4) => (be(32, 4), 0, be(36, 4), 0, 16),
                (false, _) => (be(32, 8), 0, be(40, 8), 0, 16),
            };
            local = data_segs(
                w,
                hca,
                pdn,
                b.get(32 + seg_len..).unwrap_or(&[]),
                access::LOCAL_WRITE,
                false,
            )?;
            let total: u64 = local.iter().map(|s| s.1 as u64).sum();
            if total != u64::from(size) {
                return Err(Syndrome::LOCAL_LENGTH);
            }
            len = u32::from(size);
            p.opcode = op::RC_MASKED_ATOMIC;
            p.atomic = Some(Box::new(AtomicEth {
                va: r.raddr(),
                rkey: r.rkey(),
                swap_add,
                compare,
                masked: Some((m1, m2, is_cs, size)),
            }));
        }
        _ => return Err(Syndrome::LOCAL_QP_OP),
    }
    if len > (1 << 30) {
        return Err(Syndrome::LOCAL_LENGTH);
    }
    Ok((p, local, len))
}

/// A RoCE port's source GID `index` and the network header type packets sent from it
/// carry: RoCE v1 -> 0 (GRH), RoCE v2 -> 2 (IPv4) for an IPv4-mapped GID, else 1 (IPv6).
pub(super) fn roce_source(w: &World, hca: usize, index: u8) -> Option<([u8; 16], u8)> {
    let e = crate::state::gid_at(w, hca, u32::from(index))?;
    let l3 = match e.gid_type {
        crate::roce::GidType::RoceV2 if crate::roce::gid_ipv4(&e.gid).is_some() => 2,
        crate::roce::GidType::RoceV2 => 1,
        _ => 0,
    };
    Some((e.gid, l3))
}

/// The destination LID of an address: the LID itself, or for a GID (link-local prefix +
/// node GUID) the node number the GUID encodes.
pub(super) fn route(w: &World, lid: u16, gid: Option<[u8; 16]>) -> Option<u16> {
    if let Some(g) = gid {
        if let Some(h) = w.hcas.iter().find(|h| h.info.port_gid == g) {
            return Some(h.info.lid);
        }
        let mut b = [0u8; 8];
        b.copy_from_slice(&g[8..]);
        let n = u64::from_be_bytes(b).wrapping_sub(crate::roce::BASE_GUID);
        if (1..0xffff).contains(&n) {
            return Some(n as u16);
        }
    }
    (lid != 0).then_some(lid)
}

/// The global route header a UD address vector asks for, from source GID `sgid`.
pub(super) fn av_grh(av: &DatagramSeg, sgid: [u8; 16]) -> Box<Grh> {
    Box::new(Grh {
        tclass: av.tclass,
        flow_label: av.flow_label(),
        hop_limit: av.hop_limit,
        sgid,
        dgid: av.rgid,
    })
}
