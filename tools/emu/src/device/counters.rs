//! The IB port counters (`ports/1/counters/` as mlx5_ib exposes them): every packet this
//! HCA puts on the fabric and every packet delivered to it, in packets and in data octets.
//!
//! The octets are counted as the IBA's PortXmitData/PortRcvData define them (16.1.3.5): the
//! packet from the LRH to the ICRC inclusive, the VCRC excluded: LRH 8, the GRH 40 when
//! present, BTH 12, the extended transport headers, the payload padded to 4 bytes, ICRC 4.
//! sysfs shows them divided by 4 (`port_xmit_data`, `port_rcv_data`), as IB does.

use crate::state::World;
use crate::transport::{HpcEth, Packet};

/// The octets of `p` as an IB port counts them (see the module comment).
pub(crate) fn ib_octets(p: &Packet) -> u64 {
    let t = p.transport();
    let base = p.opcode & 0x1f;
    let mut n = 8 + 12 + 4; // LRH, BTH, ICRC
    if p.grh.is_some() {
        n += 40;
    }
    if t == 0x60 {
        n += 8; // DETH
    }
    match p.hpc.as_deref() {
        _ if p.opcode & 0xE0 != 0 => {}
        Some(HpcEth::Xrc(_)) => n += 4,
        Some(HpcEth::Dc(_)) => n += 12,
        None => {}
    }
    if p.reth.is_some() && t != 0x60 && matches!(base, 0x06 | 0x0A..=0x0C) {
        n += 16;
    }
    if p.atomic.is_some() {
        n += 28;
    }
    if p.aeth.is_some() {
        n += 4;
    }
    if p.atomic_ack.is_some() {
        n += 8;
    }
    if p.imm.is_some() {
        n += 4;
    }
    if p.inv_rkey.is_some() {
        n += 4;
    }
    n += p.payload.len().next_multiple_of(4);
    n as u64
}

/// A packet put on the fabric by HCA `src`.
pub(crate) fn transmitted(w: &mut World, src: usize, p: &Packet) {
    let c = &mut w.hcas[src].counters;
    c.port_xmit_packets += 1;
    c.port_xmit_octets += ib_octets(p);
}

/// A packet delivered to HCA `dst` (whatever the QP then does with it).
pub(crate) fn received(w: &mut World, dst: usize, p: &Packet) {
    let Some(h) = w.hcas.get_mut(dst) else { return };
    h.counters.port_rcv_packets += 1;
    h.counters.port_rcv_octets += ib_octets(p);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::{Payload, Reth, encode, node_ip, op};

    #[test]
    fn octets_are_the_encoded_packet_plus_lrh_and_padding() {
        let cases = [
            Packet {
                opcode: op::RC_WRITE_ONLY_IMM,
                reth: Some(Reth {
                    va: 1,
                    rkey: 2,
                    len: 5,
                }),
                imm: Some([1, 2, 3, 4]),
                payload: Payload::from_slice(b"hello"),
                ..Default::default()
            },
            Packet {
                opcode: op::UD_SEND_ONLY_IMM,
                qkey: 7,
                src_qpn: 9,
                imm: Some([0; 4]),
                payload: Payload::from_slice(&[0; 1024]),
                ..Default::default()
            },
            Packet {
                opcode: op::RC_ACK,
                aeth: Some((0, 3)),
                ..Default::default()
            },
        ];
        for p in &cases {
            let wire = encode(p, node_ip(1), node_ip(2)).len();
            let pad = (4 - p.payload.len() % 4) % 4;
            assert_eq!(ib_octets(p), (8 + wire + pad) as u64, "{p:?}");
            assert_eq!(ib_octets(p) % 4, 0);
        }
        // A SEND of 1024 bytes on RC: LRH 8 + BTH 12 + 1024 + ICRC 4.
        let send = Packet {
            opcode: op::RC_SEND_ONLY,
            payload: Payload::from_slice(&[0; 1024]),
            ..Default::default()
        };
        assert_eq!(ib_octets(&send), 1048);
    }
}
