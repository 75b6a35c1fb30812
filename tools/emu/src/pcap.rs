//! pcap capture of fabric traffic as Ethernet/IPv4/UDP(4791)/RoCEv2, readable by
//! Wireshark/tshark (which dissect UDP port 4791 as RoCEv2: BTH and the extended headers).

use std::io::Write;

use crate::state::World;
use crate::transport::ip_udp_headers;

/// Open a capture file and write the pcap global header (link type 1, Ethernet).
pub(crate) fn open(path: &std::path::Path) -> Option<std::io::BufWriter<std::fs::File>> {
    let f = std::fs::File::create(path).ok()?;
    let mut w = std::io::BufWriter::new(f);
    let mut h = Vec::with_capacity(24);
    h.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes()); // magic, microsecond timestamps
    h.extend_from_slice(&2u16.to_le_bytes());
    h.extend_from_slice(&4u16.to_le_bytes());
    h.extend_from_slice(&0i32.to_le_bytes());
    h.extend_from_slice(&0u32.to_le_bytes());
    h.extend_from_slice(&65535u32.to_le_bytes());
    h.extend_from_slice(&1u32.to_le_bytes());
    w.write_all(&h).ok()?;
    w.flush().ok()?;
    Some(w)
}

/// Append one packet (`udp_payload` = BTH..ICRC) sent from `src` to `dst` at `now_ns`.
pub(crate) fn capture(w: &mut World, src: [u8; 4], dst: [u8; 4], udp_payload: &[u8], now_ns: u64) {
    if w.pcap.is_none() {
        return;
    }
    let mut frame = Vec::with_capacity(14 + 28 + udp_payload.len());
    // Ethernet, type IPv4: on a RoCE port the nodes' MACs; otherwise locally administered
    // MACs derived from the node addresses.
    let mac = |ip: [u8; 4]| {
        if w.cfg.link_layer == crate::roce::LinkLayer::Ethernet {
            let node = u16::from_be_bytes([ip[2], ip[3]]);
            crate::roce::mac_of_guid(crate::roce::BASE_GUID + u64::from(node))
        } else {
            [0x02, 0, ip[0], ip[1], ip[2], ip[3]]
        }
    };
    let (dmac, smac) = (mac(dst), mac(src));
    let Some(out) = w.pcap.as_mut() else { return };
    frame.extend_from_slice(&dmac);
    frame.extend_from_slice(&smac);
    frame.extend_from_slice(&0x0800u16.to_be_bytes());
    frame.extend_from_slice(&ip_udp_headers(src, dst, udp_payload.len(), false));
    frame.extend_from_slice(udp_payload);
    let mut rec = Vec::with_capacity(16);
    rec.extend_from_slice(&((now_ns / 1_000_000_000) as u32).to_le_bytes());
    rec.extend_from_slice(&(((now_ns / 1000) % 1_000_000) as u32).to_le_bytes());
    rec.extend_from_slice(&(frame.len() as u32).to_le_bytes());
    rec.extend_from_slice(&(frame.len() as u32).to_le_bytes());
    let ok = out
        .write_all(&rec)
        .and_then(|()| out.write_all(&frame))
        .and_then(|()| out.flush());
    if ok.is_err() {
        w.pcap = None;
    }
}
