//! XRC and DC in the device pipeline (the state is `crate::xrc_dc`):
//!
//! - execute: the transport segment after the control segment ([`transport_segment`]):
//!   XRC's SRQ-number segment (16 bytes) goes into the request's XRCETH, DC's address vector
//!   (48 bytes) names the DCT, its key and its node; the rest of the WQE is read as RC's;
//! - responder: an XRC target takes each request through the XRC SRQ its XRCETH names
//!   ([`hpc_responder`]), a DCT through the responder context of the DCI that sent it
//!   (`dc.rs`).

// The stages share the device's imports and one another's `pub(super)` items (device/mod.rs).
use super::*;

use crate::xrc_dc::QpKind;

/// Bytes of the XRC segment and of DC's address vector after the control segment.
const XRC_SEG: usize = 16;
const DC_AV: usize = 48;

/// For an XRC initiator or a DCI: read the transport segment of `bytes` (the WQE) into the
/// request `p`, and copy the WQE without it (control segment, then the rest) into
/// `joined`, so that it reads as an RC WQE. Returns the length in `joined`, or None for any
/// other QP (use `bytes` as it is).
pub(super) fn transport_segment(
    w: &World,
    hca: usize,
    qpn: u32,
    bytes: &[u8],
    joined: &mut [u8; 1024],
    p: &mut Packet,
) -> Result<Option<usize>, Syndrome> {
    let Some(q) = w.hcas[hca].qps.get(&qpn) else {
        return Ok(None);
    };
    let seg = match q.hpc.kind {
        QpKind::XrcIni => XRC_SEG,
        QpKind::Dci => DC_AV,
        _ => return Ok(None),
    };
    let rest = bytes.get(16 + seg..).ok_or(Syndrome::LOCAL_QP_OP)?;
    let n = 16 + rest.len();
    if n > joined.len() {
        return Err(Syndrome::LOCAL_LENGTH);
    }
    joined[..16].copy_from_slice(&bytes[..16]);
    joined[16..n].copy_from_slice(rest);
    if seg == XRC_SEG {
        let s = &bytes[16..20];
        let srqn = u32::from_be_bytes([s[0], s[1], s[2], s[3]]) & 0xff_ffff;
        p.hpc = Some(Box::new(transport::HpcEth::Xrc(srqn)));
    } else {
        let av = DatagramSeg::read_from_bytes(&bytes[16..64]).map_err(|_| Syndrome::LOCAL_QP_OP)?;
        let (lid, dct) = super::dc::av_target(w, hca, &av).ok_or(Syndrome::LOCAL_QP_OP)?;
        p.dst_lid = lid;
        p.dst_qpn = dct;
        p.hpc = Some(Box::new(transport::HpcEth::Dc(transport::DcEth {
            key: super::dc::av_key(&bytes[16..24]),
            connect: false,
            dci: qpn,
        })));
    }
    Ok(Some(n))
}

/// The responder for every request: XRC targets and DCTs through their own paths, every
/// other QP as it is.
pub(super) fn hpc_responder(w: &mut World, pkt: &mut Packet) {
    let hca = pkt.dst_hca;
    let kind = w
        .hcas
        .get(hca)
        .and_then(|h| h.qps.get(&pkt.dst_qpn))
        .map(|q| q.hpc.kind.clone());
    match kind {
        Some(QpKind::XrcTgt { xrcdn }) => xrc_target(w, pkt, xrcdn),
        Some(QpKind::Dct { key }) => super::dc::dct_responder(w, pkt, key),
        Some(QpKind::XrcIni | QpKind::Dci) => {
            // Initiators have no receive side: a request for one is nobody's.
            w.hcas[hca].counters.rx_foreign += 1;
            w.hcas[hca].counters.packets_dropped += 1;
        }
        Some(_) if pkt.hpc.is_some() => {
            // An XRC or DC request for a QP that is neither: not its transport.
            w.hcas[hca].counters.packets_dropped += 1;
        }
        _ => responder(w, pkt),
    }
}

/// An XRC target's request: the SRQ named by the XRCETH must be an XRC SRQ of the target's
/// domain (else NAK invalid request, as the IB spec's XRC checks answer a bad XRCETH; the
/// target stays up); its WQE, CQ, PD and user index then take the request.
fn xrc_target(w: &mut World, pkt: &mut Packet, xrcdn: u32) {
    let hca = pkt.dst_hca;
    let Some(srqn) = pkt.xrc_srqn() else {
        // Not an XRC packet: an XRC target receives nothing else.
        w.hcas[hca].counters.packets_dropped += 1;
        return;
    };
    let h = &w.hcas[hca];
    let q = &h.qps[&pkt.dst_qpn];
    let target = h
        .hpc
        .xrc_srqs
        .get(&srqn)
        .filter(|s| s.xrcdn == xrcdn)
        .and_then(|s| h.srqs.get(&srqn).map(|srq| (s.cqn, s.uidx, srq.pdn)));
    let Some((cqn, uidx, pdn)) = target else {
        let live = matches!(q.state, qps::RTR | qps::RTS | qps::SQD | qps::SQE);
        if live && from_peer(w, hca, q, pkt) {
            pkt.src_qpn = q.dest_qpn;
            w.hcas[hca].counters.packets_dropped += 1;
            nak(w, pkt, aeth::NAK_INV_REQ);
        } else {
            w.hcas[hca].counters.packets_dropped += 1;
        }
        return;
    };
    let qpn = pkt.dst_qpn;
    let q = w.hcas[hca].qps.get_mut(&qpn).expect("looked up above");
    let saved = (q.srq, q.recv_cq, q.uidx, q.pdn);
    (q.srq, q.recv_cq, q.uidx, q.pdn) = (Some(srqn), cqn, uidx, pdn);
    responder(w, pkt);
    if let Some(q) = w.hcas[hca].qps.get_mut(&qpn) {
        (q.srq, q.recv_cq, q.uidx, q.pdn) = saved;
    }
}
