//! The wire: fault injection, the in-process fabric, the UDP fabric (RoCEv2 datagrams)
//! and the dispatch of delivered packets to the responder or requester.

// The stages share the device's imports and one another's `pub(super)` items (device/mod.rs).
use super::*;
use crate::model::mcast::MCAST_QPN;

/// The copies of a UD SEND to a multicast group, one per attached QP (None: `pkt` is not
/// a multicast packet).
pub(crate) fn fan_out(w: &World, pkt: &Packet) -> Option<Vec<Packet>> {
    if pkt.dst_qpn != MCAST_QPN || pkt.transport() != 0x60 {
        return None;
    }
    let mgid = pkt.grh.as_ref().map(|g| g.dgid).filter(|g| g[0] == 0xff)?;
    let mut out = Vec::new();
    for (&(hca, _), qps) in w.mcast.iter().filter(|((_, g), _)| *g == mgid) {
        for &qpn in qps {
            if hca == pkt.src_hca && qpn == pkt.src_qpn {
                continue;
            }
            let mut p = pkt.clone();
            p.dst_lid = w.hcas[hca].info.lid;
            p.dst_qpn = qpn;
            out.push(p);
        }
    }
    Some(out)
}

/// Put a packet on the fabric (in process, or UDP when the destination LID is not one of
/// ours), applying fault injection and pcap capture.
pub(crate) fn send_packet(w: &mut World, mut pkt: Packet) {
    // A UD SEND to a multicast group: one copy per attached QP (attached by kernel/mcast.rs).
    if let Some(copies) = fan_out(w, &pkt) {
        if copies.is_empty() {
            w.hcas[pkt.src_hca].counters.packets_dropped += 1;
        }
        return copies.into_iter().for_each(|p| send_packet(w, p));
    }
    dc::mark_connect(w, &mut pkt);
    let now = w.now();
    let f = w.cfg.fault;
    let src = pkt.src_hca;
    w.hcas[src].counters.packets_sent += 1;
    super::counters::transmitted(w, src, &pkt);
    let local = w
        .hcas
        .iter()
        .position(|h| h.info.lid == pkt.dst_lid && pkt.dst_lid != 0);
    let remote = local.is_none() && pkt.dst_lid != 0 && w.hcas[src].sock.is_some();
    if local.is_none() && !remote {
        w.hcas[src].counters.packets_dropped += 1;
        return;
    }
    if w.trace.on() {
        let (sip, dip) = (node_ip(w.hcas[src].info.lid), node_ip(pkt.dst_lid));
        let bytes = encode(&pkt, sip, dip);
        w.trace.push(
            src,
            now,
            "mlx5_emu::device::wire::send_packet",
            crate::trace::TraceWhat::Packet(crate::trace::WirePacket {
                src_hca: src,
                dst_lid: pkt.dst_lid,
                bytes,
            }),
        );
    }
    let roll = |w: &mut World, ppm: u32| ppm > 0 && (w.rand() % 1_000_000) < u64::from(ppm);
    if roll(w, f.drop_ppm) {
        w.hcas[src].counters.packets_dropped += 1;
        return;
    }
    let dup = roll(w, f.dup_ppm);
    let reorder = roll(w, f.reorder_ppm);
    let corrupt = roll(w, w.cfg.corrupt_ppm);
    let flip = w.rand();
    let (sip, dip) = (node_ip(w.hcas[src].info.lid), node_ip(pkt.dst_lid));
    if w.pcap.is_some() || remote {
        let mut bytes = encode(&pkt, sip, dip);
        if corrupt {
            // One flipped bit anywhere: the receiver's ICRC check discards the packet.
            let bit = (flip % (bytes.len() as u64 * 8)) as usize;
            bytes[bit / 8] ^= 1 << (bit % 8);
        }
        crate::pcap::capture(&mut w.pcap, w.cfg.link_layer, sip, dip, &bytes);
        if remote {
            // The same faults as in process: delay every datagram by `delay_ns`; a
            // reordered one is held back until the next one has gone out (or, if none
            // comes, for REORDER_HOLD_NS).
            let to = std::net::SocketAddrV4::new(dip.into(), ROCE_PORT);
            let at = now + f.delay_ns;
            // A plain ACK waits a little for a datagram to the same node to go out with
            // (the responder's own answer, in a ping-pong): the requester's device then
            // wakes once for both (`ACK_DELAY`).
            let ack = pkt.opcode == op::RC_ACK
                && pkt.atomic_ack.is_none()
                && pkt.aeth.is_some_and(|(s, _)| s & 0xe0 == aeth::ACK)
                && w.cfg.mode == RunMode::Threaded;
            let hold_ack = if ack { ack_delay_ns() } else { 0 };
            let out = |held: bool, bytes: Vec<u8>| Outgoing {
                due: if held {
                    at + REORDER_HOLD_NS
                } else {
                    at + hold_ack
                },
                held,
                ack: hold_ack > 0,
                src,
                to,
                bytes,
            };
            if dup {
                queue_udp(w, out(false, bytes.clone()));
            }
            queue_udp(w, out(reorder, bytes));
            if f.delay_ns == 0 && !reorder {
                flush_udp(w);
            }
            return;
        }
    }
    pkt.dst_hca = local.unwrap_or(0);
    if corrupt {
        // In process there is no ICRC to compute: a corrupted packet is one the receiver
        // discards, exactly as it would on the wire.
        w.hcas[pkt.dst_hca].counters.packets_dropped += 1;
        return;
    }
    let at = now + f.delay_ns;
    if dup {
        w.wire.queue.push_back((at, pkt.clone()));
    }
    if reorder && !w.wire.queue.is_empty() {
        let pos = w.wire.queue.len() - 1;
        w.wire.queue.insert(pos, (at, pkt));
    } else {
        w.wire.queue.push_back((at, pkt));
    }
}

/// How long a plain RC ACK to another process may wait for a datagram to the same node
/// (`MLX5_EMU_ACK_DELAY_US`, default 50; 0: never), far below any ACK timeout. Read once
/// when the first emulator starts ([`read_ack_delay`]): the device also runs in signal
/// handlers, which must not read the environment.
static ACK_DELAY_NS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(50_000);

fn ack_delay_ns() -> u64 {
    ACK_DELAY_NS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Take `MLX5_EMU_ACK_DELAY_US` from the environment (an emulator being created).
pub(crate) fn read_ack_delay() {
    if let Some(us) = std::env::var("MLX5_EMU_ACK_DELAY_US")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
    {
        ACK_DELAY_NS.store(
            us.saturating_mul(1000),
            std::sync::atomic::Ordering::Relaxed,
        );
    }
}

/// How long a datagram held back for reordering waits for a successor before it goes out
/// anyway (virtual time in stepped mode). Far below the shortest useful ACK timeout.
pub(super) const REORDER_HOLD_NS: u64 = 20_000;

/// Queue a datagram for another process. A datagram that is not itself held back releases
/// the held ones before it: they now go out right after it.
pub(super) fn queue_udp(w: &mut World, out: Outgoing) {
    if !out.ack {
        // A held ACK to the same node goes out with this datagram, before it.
        for o in w.outbox.iter_mut() {
            if o.ack && o.src == out.src && o.to == out.to {
                o.due = o.due.min(out.due);
                o.ack = false;
            }
        }
    }
    if out.held || !w.outbox.iter().any(|o| o.held) {
        w.outbox.push_back(out);
        return;
    }
    let due = out.due;
    let (held, mut rest): (VecDeque<Outgoing>, VecDeque<Outgoing>) =
        w.outbox.drain(..).partition(|o| o.held);
    rest.push_back(out);
    rest.extend(held.into_iter().map(|o| Outgoing {
        due: due.max(o.due.saturating_sub(REORDER_HOLD_NS)),
        held: false,
        ..o
    }));
    w.outbox = rest;
}

/// Send every queued datagram that is due, in queue order. Returns how many went out.
pub(super) fn flush_udp(w: &mut World) -> usize {
    if w.outbox.is_empty() {
        return 0;
    }
    let now = w.now();
    let mut n = 0;
    let mut keep = VecDeque::with_capacity(w.outbox.len());
    for o in std::mem::take(&mut w.outbox) {
        if o.due > now {
            keep.push_back(o);
            continue;
        }
        let sent = w.hcas[o.src]
            .sock
            .as_ref()
            .is_some_and(|s| s.send_to(&o.bytes, o.to).is_ok());
        if !sent {
            w.hcas[o.src].counters.packets_dropped += 1;
        }
        n += 1;
    }
    w.outbox = keep;
    n
}

/// Receive RoCEv2 packets from the UDP sockets into the delivery queue.
pub(super) fn receive_udp(w: &mut World) -> usize {
    if w.hcas.iter().all(|h| h.sock.is_none()) {
        return 0;
    }
    let now = w.now();
    let mut n = 0;
    let mut buf = std::mem::take(&mut w.rx_buf);
    buf.resize(65536, 0);
    for hca in 0..w.hcas.len() {
        for _ in 0..256 {
            let Some(sock) = &w.hcas[hca].sock else { break };
            let Ok((len, from)) = sock.recv_from(&mut buf) else {
                break;
            };
            let std::net::SocketAddr::V4(from) = from else {
                continue;
            };
            let sip = from.ip().octets();
            let lid = w.hcas[hca].info.lid;
            if sip[..2] != node_ip(0)[..2] || from.port() != ROCE_PORT {
                // Not a node of this fabric (127.1.x.y:4791): nobody we can be connected to.
                w.hcas[hca].counters.rx_foreign += 1;
                w.hcas[hca].counters.packets_dropped += 1;
                continue;
            }
            if w.pcap.is_some() {
                // What arrives is recorded too (unless its sender writes this capture).
                crate::pcap::capture_arrival(
                    &mut w.pcap,
                    w.cfg.link_layer,
                    sip,
                    node_ip(lid),
                    &buf[..len],
                );
            }
            match decode(&buf[..len], sip, node_ip(lid)) {
                Some(mut p) => {
                    p.dst_hca = hca;
                    p.slid = u16::from_be_bytes([sip[2], sip[3]]);
                    p.dst_lid = lid;
                    if w.hcas[hca].info.is_roce() {
                        // RoCEv2 over IPv4: the IP header is the "GRH" of a UD receive.
                        // (TOS and TTL as this fabric sends them: 0 and 64.)
                        p.roce = Some(2);
                        if p.transport() == 0x60 {
                            p.grh = Some(Box::new(Grh {
                                tclass: 0,
                                flow_label: 0,
                                hop_limit: 64,
                                sgid: crate::roce::ipv4_mapped_gid(sip),
                                dgid: crate::roce::ipv4_mapped_gid(node_ip(lid)),
                            }));
                        }
                    }
                    w.wire.queue.push_back((now, p));
                    n += 1;
                }
                None => {
                    // Short, truncated, malformed or with a bad ICRC.
                    w.hcas[hca].counters.rx_bad_packets += 1;
                    w.hcas[hca].counters.packets_dropped += 1;
                }
            }
        }
    }
    w.rx_buf = buf;
    n
}

pub(super) fn deliver_wire(w: &mut World) -> usize {
    let now = w.now();
    let mut n = 0;
    // Deliver everything due now, in order, including packets generated while delivering
    // (bounded).
    while n < 4096 {
        let Some(pos) = w.wire.queue.iter().position(|(t, _)| *t <= now) else {
            break;
        };
        // Usually the oldest packet is due: take it off the front.
        let taken = if pos == 0 {
            w.wire.queue.pop_front()
        } else {
            w.wire.queue.remove(pos)
        };
        let Some((_, mut pkt)) = taken else {
            break;
        };
        super::counters::received(w, pkt.dst_hca, &pkt);
        if pkt.dst_qpn == 1 && pkt.transport() == 0x60 {
            // QP1 (GSI): the CM's MADs go to the emulated kernel's CM.
            (w.kernel.gsi_receive)(w, &pkt);
        } else if pkt.is_request() {
            hpc_responder(w, &mut pkt);
        } else {
            requester_response(w, &pkt);
        }
        n += 1;
    }
    n
}

pub(super) fn reply(w: &mut World, req: &Packet, opcode: u8, syndrome: u8) -> Packet {
    let lid = w.hcas[req.dst_hca].info.lid;
    Packet {
        src_hca: req.dst_hca,
        dst_lid: req.slid,
        slid: lid,
        opcode,
        dst_qpn: req.src_qpn,
        src_qpn: req.dst_qpn,
        psn: req.psn,
        aeth: Some((syndrome, 0)),
        ..Default::default()
    }
}

pub(super) fn nak(w: &mut World, req: &Packet, syndrome: u8) {
    let p = reply(w, req, op::RC_ACK, syndrome);
    send_packet(w, p);
}
