//! RAW_PACKET QPs on the Ethernet port: the send WQE's Ethernet segment executed (inline
//! headers, VLAN insertion, checksum offload), frames on the emulated Ethernet (in process,
//! between processes as UDP datagrams, to and from a TAP interface), and receives through
//! the port's steering table into the receive queue of the QP a rule names, with the
//! CQE's packet flags and the device clock's timestamp. The pure parts (classification,
//! checksums, the table) are in `crate::eth`; `docs/raw-ethernet.md` has the whole story.

// The stages share the device's imports and one another's `pub(super)` items (device/mod.rs).
use super::*;
use crate::eth;

/// `cs_flags` of the Ethernet segment: compute the L4 (TCP/UDP) checksum.
const CS_L4: u8 = 0x80;
/// `cs_flags`: compute the IPv4 header checksum.
const CS_L3: u8 = 0x40;
/// The word at Ethernet-segment byte 12 with this bit set asks for VLAN insertion (the
/// low 16 bits are the TCI) instead of carrying `inline_hdr_sz`.
const VLAN_INSERT: u32 = 1 << 31;

/// Execute one send WQE of a RAW_PACKET QP (`wqe.bytes` is the whole WQE, ctrl first):
/// build the frame, transmit it, complete it. Errors become an error CQE (and the QP goes
/// to the error state) as for any QP.
pub(super) fn exec_raw(w: &mut World, hca: usize, qpn: u32, wqe: &Wqe<'_>) {
    match build_frame(w, hca, qpn, wqe) {
        Ok(Some(frame)) => {
            let len = frame.len() as u32;
            paced(w, hca, qpn, len);
            transmit(w, hca, frame);
            if wqe.signaled {
                requester_ok(w, hca, qpn, wqe.idx, wqe.opcode.0, len, None);
            }
        }
        Ok(None) => {
            if wqe.signaled {
                requester_ok(w, hca, qpn, wqe.idx, wqe.opcode.0, 0, None);
            }
        }
        Err(s) => fail_wqe(w, hca, qpn, wqe.idx, wqe.opcode.0, s),
    }
}

/// Whether the next send WQE of raw QP `qpn` must wait for its packet-pacing slot (the
/// rate limit set by `IB_QP_RATE_LIMIT`): the WQE stays in the ring until then, as the
/// NIC's rate limiter holds a queue back.
pub(super) fn pacing_wait(w: &World, hca: usize, qpn: u32) -> bool {
    let now = w.now();
    w.hcas[hca]
        .eth
        .pacing
        .get(&qpn)
        .is_some_and(|p| p.next_ns > now)
}

/// A frame of `len` bytes left paced QP `qpn`: the next may leave `len * 8` bits at the
/// QP's rate after this one's slot. A token bucket with [`PACING_BURST_NS`] of credit: a
/// device thread that fell behind (descheduled) catches up at full speed for that long,
/// as the NIC, which never falls behind, would have sent those frames on time.
fn paced(w: &mut World, hca: usize, qpn: u32, len: u32) {
    let now = w.now();
    if let Some(p) = w.hcas[hca].eth.pacing.get_mut(&qpn) {
        let gap = (u64::from(len) * 8 * 1_000_000).div_ceil(u64::from(p.kbps.max(1)));
        p.next_ns = p.next_ns.max(now.saturating_sub(PACING_BURST_NS)) + gap;
    }
}

/// The pacing credit a queue keeps while it is backlogged (see [`paced`]).
const PACING_BURST_NS: u64 = 1_000_000;

/// The earliest pacing slot a paced QP with rung WQEs waits for (the device wakes then).
pub(crate) fn pacing_deadline(w: &World) -> Option<u64> {
    w.hcas
        .iter()
        .flat_map(|h| {
            h.eth.pacing.iter().filter_map(|(qpn, p)| {
                let q = h.qps.get(qpn)?;
                (q.state == qps::RTS && (q.sq_head as u16) != q.sq_rung).then_some(p.next_ns)
            })
        })
        .min()
}

/// The frame a RAW_PACKET send WQE describes (None for a NOP).
fn build_frame(
    w: &mut World,
    hca: usize,
    qpn: u32,
    wqe: &Wqe<'_>,
) -> Result<Option<Vec<u8>>, Syndrome> {
    match wqe.opcode {
        SendOpcode::NOP => return Ok(None),
        SendOpcode::SEND => {}
        // TSO and the rest: not offered on this port (the device reports no TSO).
        _ => return Err(Syndrome::LOCAL_QP_OP),
    }
    let b = wqe.bytes;
    let eseg = b.get(16..32).ok_or(Syndrome::LOCAL_LENGTH)?;
    let cs_flags = eseg[4];
    let mss = u16::from_be_bytes([eseg[6], eseg[7]]);
    if mss != 0 {
        return Err(Syndrome::LOCAL_QP_OP);
    }
    let word = u32::from_be_bytes([eseg[12], eseg[13], eseg[14], eseg[15]]);
    let (inline_sz, vlan) = if word & VLAN_INSERT != 0 {
        (0, Some(word as u16))
    } else {
        ((word >> 16) as usize, None)
    };
    // The inline headers start at segment byte 14 and continue past the segment in
    // 16-byte units; the data segments (or an inline data segment) follow.
    let hdr = b
        .get(16 + 14..16 + 14 + inline_sz)
        .ok_or(Syndrome::LOCAL_LENGTH)?;
    let seg_end = 16 + (14 + inline_sz).div_ceil(16).max(1) * 16;
    let pdn = w.hcas[hca].qps[&qpn].pdn;
    let payload = payload(w, hca, qpn, pdn, b, seg_end)?;
    let mut frame = Vec::with_capacity(hdr.len() + payload.len() + 4);
    frame.extend_from_slice(hdr);
    frame.extend_from_slice(&payload);
    if let Some(tci) = vlan {
        if frame.len() < 12 {
            return Err(Syndrome::LOCAL_LENGTH);
        }
        let mut tag = [0u8; 4];
        tag[..2].copy_from_slice(&eth::ETH_P_8021Q.to_be_bytes());
        tag[2..].copy_from_slice(&tci.to_be_bytes());
        frame.splice(12..12, tag);
    }
    if frame.len() < eth::MIN_FRAME || frame.len() > eth::MAX_FRAME {
        return Err(Syndrome::LOCAL_LENGTH);
    }
    if cs_flags & (CS_L3 | CS_L4) != 0 {
        eth::fill_checksums(&mut frame, cs_flags & CS_L3 != 0, cs_flags & CS_L4 != 0);
    }
    Ok(Some(frame))
}

/// Put a frame on the emulated Ethernet from the port of `src`: to every other port of this
/// emulator whose MAC it is addressed to (all of them for a group address), to the TAP
/// interface if the port is attached to one, and on the UDP fabric to the node its
/// destination MAC names (group addresses: to nodes 1..=[`eth::FLOOD_NODES`]). A frame is
/// not looped back to the port that sent it.
pub(super) fn transmit(w: &mut World, src: usize, frame: Vec<u8>) {
    w.hcas[src].counters.raw_tx_frames += 1;
    crate::pcap::write_frame(&mut w.pcap, &frame);
    let mut dmac = [0u8; 6];
    dmac.copy_from_slice(&frame[..6]);
    let group = eth::is_group(&dmac);
    if let Some(t) = w.hcas[src].eth.tap.as_mut() {
        t.send(&frame);
    }
    let mut local_hit = false;
    for dst in 0..w.hcas.len() {
        if dst != src && (group || w.hcas[dst].info.mac == dmac) {
            local_hit = true;
            receive(w, dst, &frame);
        }
    }
    if local_hit && !group {
        return;
    }
    let Some(sock) = w.hcas[src].eth.sock.as_ref() else {
        return;
    };
    let me = w.hcas[src].info.lid;
    let send = |node: u16| {
        let to = std::net::SocketAddrV4::new(node_ip(node).into(), eth::RAW_PORT);
        let _ = sock.send_to(&frame, to);
    };
    if group {
        for node in (1..=eth::FLOOD_NODES).filter(|&n| n != me) {
            if !w.hcas.iter().any(|h| h.info.lid == node) {
                send(node);
            }
        }
    } else if let Some(node) = node_of_mac(&dmac).filter(|&n| n != me) {
        send(node);
    }
}

/// The fabric node a unicast MAC belongs to (the rule of `HcaInfo::mac`: the node GUID
/// `BASE_GUID + node` without its bytes 3 and 4).
fn node_of_mac(mac: &[u8; 6]) -> Option<u16> {
    (1..=254u16).find(|&n| crate::roce::mac_of_guid(crate::roce::BASE_GUID + u64::from(n)) == *mac)
}

/// Frames from other processes (the raw-frame sockets) and from TAP interfaces: each goes
/// through its port's receive path. Returns how many arrived.
pub(super) fn receive_external(w: &mut World) -> usize {
    let mut n = release_held(w);
    let mut buf = std::mem::take(&mut w.rx_buf);
    buf.resize(65536, 0);
    for hca in 0..w.hcas.len() {
        for _ in 0..256 {
            let got = {
                let p = &w.hcas[hca].eth;
                let from_sock = p.sock.as_ref().and_then(|s| match s.recv_from(&mut buf) {
                    Ok((len, std::net::SocketAddr::V4(from)))
                        if from.ip().octets()[..2] == node_ip(0)[..2]
                            && from.port() == eth::RAW_PORT =>
                    {
                        Some(Some(len))
                    }
                    // Not a node of this fabric: nothing we take frames from.
                    Ok(_) => Some(None),
                    Err(_) => None,
                });
                match from_sock {
                    Some(x) => Some(x),
                    None => p.tap.as_ref().and_then(|t| t.recv(&mut buf)).map(Some),
                }
            };
            match got {
                None => break,
                Some(None) => {
                    w.hcas[hca].counters.rx_foreign += 1;
                    w.hcas[hca].counters.packets_dropped += 1;
                }
                Some(Some(len)) => {
                    receive(w, hca, &buf[..len]);
                    n += 1;
                }
            }
        }
    }
    w.rx_buf = buf;
    n
}

/// A frame arrives at the port of `hca`: checked (runts, oversize: counted in
/// `rx_raw_bad_frames`), steered (no rule: `rx_steer_missed`; a drop rule:
/// `rx_steer_dropped`), and placed into the next receive WQE of the QP the rule names with
/// a CQE (no receive posted: `out_of_buffer`). Bad checksums are not dropped: the CQE says
/// so (`hds_ip_ext`), as the NIC does.
pub(super) fn receive(w: &mut World, hca: usize, frame: &[u8]) {
    let c = &mut w.hcas[hca].counters;
    if frame.len() > eth::MAX_FRAME {
        c.rx_raw_bad_frames += 1;
        c.packets_dropped += 1;
        return;
    }
    let Some(p) = eth::parse(frame) else {
        c.rx_raw_bad_frames += 1;
        c.packets_dropped += 1;
        return;
    };
    let (qpn, _rule) = match w.hcas[hca].eth.table.steer(&p) {
        eth::Verdict::Qp { qpn, rule } => (qpn, rule),
        eth::Verdict::Drop { .. } => {
            w.hcas[hca].counters.rx_steer_dropped += 1;
            return;
        }
        eth::Verdict::Miss => {
            w.hcas[hca].counters.rx_steer_missed += 1;
            return;
        }
    };
    let Some(q) = w.hcas[hca].qps.get(&qpn) else {
        w.hcas[hca].counters.rx_steer_missed += 1;
        return;
    };
    if !matches!(q.state, qps::RTR | qps::RTS | qps::SQD | qps::SQE) {
        // The QP's receive side is not ready: the frame is lost to it.
        w.hcas[hca].counters.packets_dropped += 1;
        return;
    }
    // Frames already waiting for this port go first (the buffer is in arrival order).
    if !w.hcas[hca].eth.held.is_empty() || !place(w, hca, qpn, frame, &p) {
        hold(w, hca, qpn, frame);
    }
}

/// Keep a frame in the port's receive buffer until its QP posts a receive; drop it
/// (`out_of_buffer`) when the buffer is full.
fn hold(w: &mut World, hca: usize, qpn: u32, frame: &[u8]) {
    let now = w.now();
    let port = &mut w.hcas[hca].eth;
    if port.held.len() >= eth::HELD_FRAMES {
        w.hcas[hca].counters.out_of_buffer += 1;
        return;
    }
    if port.held.is_empty() {
        port.held_since = now;
    }
    port.held.push_back((qpn, frame.to_vec()));
}

/// Deliver the frames of the ports' receive buffers whose QPs have posted receives since,
/// in order (a frame whose QP still has none keeps the ones behind it waiting). Returns
/// how many were placed.
pub(super) fn release_held(w: &mut World) -> usize {
    let mut n = 0;
    for hca in 0..w.hcas.len() {
        while let Some((qpn, frame)) = w.hcas[hca].eth.held.pop_front() {
            let ready = w.hcas[hca]
                .qps
                .get(&qpn)
                .is_some_and(|q| matches!(q.state, qps::RTR | qps::RTS | qps::SQD | qps::SQE));
            if !ready {
                // The QP went away or out of service: the frame is lost to it.
                w.hcas[hca].counters.packets_dropped += 1;
                continue;
            }
            let Some(p) = eth::parse(&frame) else {
                continue;
            };
            if !place(w, hca, qpn, &frame, &p) {
                w.hcas[hca].eth.held.push_front((qpn, frame));
                break;
            }
            n += 1;
            w.hcas[hca].eth.held_since = w.now();
        }
    }
    n
}

/// When the device next looks at the receive doorbell records of the QPs whose frames
/// wait in a port's receive buffer. Posting a receive only writes the doorbell record
/// (no doorbell register, no wake-up), and a NIC sees it at once; the device thread polls
/// instead: 1 us after the buffer's last progress, backing off to 1/64 of the time since,
/// at most 1 ms. Threaded mode only: in stepped mode the caller steps after posting, and
/// a virtual clock advanced for a receive that never comes would never go idle.
pub(crate) fn held_deadline(w: &World) -> Option<u64> {
    if w.cfg.mode != crate::config::RunMode::Threaded {
        return None;
    }
    let now = w.now();
    w.hcas
        .iter()
        .filter(|h| !h.eth.held.is_empty())
        .map(|h| {
            let quiet = now.saturating_sub(h.eth.held_since);
            now + (quiet / 64).clamp(HELD_POLL_MIN_NS, HELD_POLL_MAX_NS)
        })
        .min()
}

/// See [`held_deadline`].
const HELD_POLL_MIN_NS: u64 = 1_000;
/// See [`held_deadline`].
const HELD_POLL_MAX_NS: u64 = 1_000_000;

/// Place `frame` into the next receive WQE of `qpn` and write its CQE; false (nothing
/// done) if no receive is posted.
fn place(w: &mut World, hca: usize, qpn: u32, frame: &[u8], p: &eth::Parsed) -> bool {
    let Some(q) = w.hcas[hca].qps.get(&qpn) else {
        return true;
    };
    let (pdn, uidx, recv_cq) = (q.pdn, q.uidx, q.recv_cq);
    let Some((wqe, ctr, srqn)) = take_recv_wqe(w, hca, qpn) else {
        return false;
    };
    let placed = data_segs(w, hca, pdn, &wqe, access::LOCAL_WRITE, true)
        .and_then(|sgl| scatter(&sgl, frame));
    recv_done(w, wqe);
    if let Err(s) = placed {
        responder_error_cqe(w, hca, qpn, ctr, srqn, s, 0);
        qp_to_err(w, hca, qpn, ev::QP_FATAL);
        return true;
    }
    let cqe_v1 = w
        .contexts
        .get(&w.hcas[hca].qps[&qpn].ctx)
        .is_some_and(|c| c.cqe_version == 1);
    let (l4_l3, ext) = eth::cqe_flags(frame, p);
    w.hcas[hca].counters.raw_rx_frames += 1;
    let spec = CqeSpec {
        opcode: CqeOpcode::RESP_SEND.0,
        qpn,
        srqn_uidx: if cqe_v1 { uidx } else { srqn },
        byte_cnt: frame.len() as u32,
        wqe_counter: ctr,
        raw: Some((ext, l4_l3, 0)),
        ..Default::default()
    };
    post_cqe(w, hca, recv_cq, &spec);
    true
}

#[cfg(test)]
mod tests {
    use crate::config::{EmuConfig, RunMode};
    use crate::roce::LinkLayer;
    use crate::shared::Emulator;

    fn emu(mode: RunMode) -> Emulator {
        Emulator::new(EmuConfig {
            mode,
            link_layer: LinkLayer::Ethernet,
            ..EmuConfig::default()
        })
    }

    /// A frame held for want of a receive makes the device look again soon (posting a
    /// receive rings nothing), more slowly the longer nothing moved; in stepped mode the
    /// caller's next step does it.
    #[test]
    fn held_frames_bring_the_device_back_to_the_receive_doorbell() {
        let e = emu(RunMode::Threaded);
        let mut w = e.shared.lock_quiet();
        let now = w.now();
        assert_eq!(super::held_deadline(&w), None, "nothing held");
        w.hcas[0].eth.held.push_back((0x42, vec![0; 60]));
        w.hcas[0].eth.held_since = now;
        let d = super::super::next_deadline(&w).expect("a deadline while a frame waits");
        let now2 = w.now();
        assert!(
            d >= now && d <= now2 + 1_000 + (now2 - now) / 64,
            "soon after the last progress: {d} vs {now}..{now2}"
        );
        // Nothing moved for 70 ms (more than 64 ms): 1 ms between looks, no more. (The
        // world stays locked: the device thread would drop the frame of no QP.)
        std::thread::sleep(std::time::Duration::from_millis(70));
        let before = w.now();
        let d = super::held_deadline(&w).expect("deadline");
        let after = w.now();
        assert!(
            d >= before + 1_000_000 && d <= after + 1_000_000,
            "{d} vs {before}..{after}"
        );
        drop(w);
        let s = emu(RunMode::Stepped);
        let mut w = s.shared.lock_quiet();
        w.hcas[0].eth.held.push_back((0x42, vec![0; 60]));
        assert_eq!(
            super::held_deadline(&w),
            None,
            "stepped: no virtual deadline"
        );
    }
}
