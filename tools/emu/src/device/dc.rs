//! DC in the device: a DCI connects to the DCT its WQE names, one at a time; a DCT keeps an
//! RC responder context per connected DCI (state: `crate::xrc_dc`).
//!
//! The protocol on this fabric:
//! - every DC request carries a DCETH (`transport::DcEth`): the DC access key and the DCI's
//!   number; the packet with the first PSN of a connection is the connect (its flag set,
//!   on retransmissions too);
//! - a DCI whose next WQE names another DCT (or node) waits until everything outstanding is
//!   acknowledged, then reconnects: new destination, new connect PSN (its PSNs run on);
//! - a DCT answers a connect by making (or, with a new start PSN, renewing) the DCI's
//!   context; a request without a context, or with a key that is not the DCT's, is dropped
//!   (counted: `dc_no_stream`, `dc_key_violations`), as the hardware drops it, so the DCI
//!   retries and ends in a transport-retry error (an absent DCT: the same).
//! - everything else is RC: ACKs, NAKs, go-back-N, RNR, duplicates, per connection.

// The stages share the device's imports and one another's `pub(super)` items (device/mod.rs).
use super::*;

use crate::xrc_dc::{DcStream, QpKind};

/// The DC access key of an address vector: its first 8 bytes, big-endian.
pub(super) fn av_key(b: &[u8]) -> u64 {
    b.iter().take(8).fold(0u64, |k, &x| (k << 8) | u64::from(x))
}

/// The node and DCT number an address vector names (RoCE: by its GID; IB: its LID, or
/// the GID with the GRH bit).
pub(super) fn av_target(w: &World, hca: usize, av: &DatagramSeg) -> Option<(u16, u32)> {
    let lid = if w.hcas[hca].info.is_roce() {
        crate::roce::node_of_gid(&av.rgid)?
    } else {
        route(w, av.rlid(), av.grh().then_some(av.rgid))?
    };
    Some((lid, av.dqpn() & 0xff_ffff))
}

/// Before a DCI executes the WQE in `bytes`: connected to the DCT it names? If it names
/// another one, reconnect when nothing is outstanding (returns true: go on), else wait
/// (false: the WQE stays until the acknowledgements are in).
pub(super) fn dci_ready(w: &mut World, hca: usize, qpn: u32, bytes: &[u8]) -> bool {
    let Some(q) = w.hcas[hca].qps.get(&qpn) else {
        return true;
    };
    if q.hpc.kind != QpKind::Dci {
        return true;
    }
    let Some(av) = bytes
        .get(16..64)
        .and_then(|b| DatagramSeg::read_from_bytes(b).ok())
    else {
        return true; // too short: execute fails it
    };
    let Some((lid, dct)) = av_target(w, hca, &av) else {
        return true;
    };
    let key = av_key(&bytes[16..24]);
    let roce = w.hcas[hca].info.is_roce();
    let q = &w.hcas[hca].qps[&qpn];
    if q.hpc.dc_peer == Some((lid, dct)) && q.hpc.dc_key == key {
        return true;
    }
    if !q.rc.req.outstanding.is_empty() {
        return false;
    }
    let q = w.hcas[hca].qps.get_mut(&qpn).expect("looked up above");
    q.hpc.dc_peer = Some((lid, dct));
    q.hpc.dc_key = key;
    q.hpc.dc_connect_psn = q.sq_psn;
    q.dest_qpn = dct;
    q.path.dlid = if roce { 0 } else { lid };
    q.path.is_global = roce || av.grh();
    q.path.dgid = if roce || av.grh() { av.rgid } else { [0; 16] };
    w.hcas[hca].hpc.dc_connects += 1;
    true
}

/// A DC request leaving its DCI: the connect flag on the connection's first PSN.
pub(super) fn mark_connect(w: &World, pkt: &mut Packet) {
    let (psn, src_hca, src_qpn) = (pkt.psn, pkt.src_hca, pkt.src_qpn);
    let Some(transport::HpcEth::Dc(d)) = pkt.hpc.as_deref_mut() else {
        return;
    };
    if let Some(q) = w.hcas.get(src_hca).and_then(|h| h.qps.get(&src_qpn)) {
        d.connect = psn == q.hpc.dc_connect_psn;
    }
}

/// A request for a DCT: key check, the sending DCI's context (made by a connect), then
/// RC's responder with that context in place.
pub(super) fn dct_responder(w: &mut World, pkt: &mut Packet, key: u64) {
    let hca = pkt.dst_hca;
    let qpn = pkt.dst_qpn;
    let Some(d) = pkt.dc() else {
        w.hcas[hca].counters.packets_dropped += 1;
        return;
    };
    if d.key != key {
        w.hcas[hca].hpc.dc_key_violations += 1;
        w.hcas[hca].counters.packets_dropped += 1;
        return;
    }
    let roce = w.hcas[hca].info.is_roce();
    let id = (pkt.slid, d.dci);
    let q = w.hcas[hca].qps.get_mut(&qpn).expect("caller looked it up");
    let fresh = match q.hpc.streams.get(&id) {
        Some(s) => d.connect && pkt.psn != s.start_psn,
        None => d.connect,
    };
    if fresh {
        let path = crate::model::path::Path {
            dlid: if roce { 0 } else { pkt.slid },
            dgid: if roce {
                crate::roce::ipv4_mapped_gid(node_ip(pkt.slid))
            } else {
                [0; 16]
            },
            is_global: roce,
            port: 1,
            ..Default::default()
        };
        q.hpc.streams.insert(
            id,
            DcStream {
                start_psn: pkt.psn,
                epsn: pkt.psn,
                resp: Default::default(),
                path,
            },
        );
        w.hcas[hca].hpc.dc_connects += 1;
    }
    let q = w.hcas[hca].qps.get_mut(&qpn).expect("caller looked it up");
    let Some(s) = q.hpc.streams.get_mut(&id) else {
        w.hcas[hca].hpc.dc_no_stream += 1;
        w.hcas[hca].counters.packets_dropped += 1;
        return;
    };
    // The DCI's context in place of the DCT's own, RC's responder, and back.
    let resp = std::mem::take(&mut s.resp);
    let (epsn, path) = (s.epsn, s.path.clone());
    let saved = (q.rq_psn, q.dest_qpn, std::mem::replace(&mut q.path, path));
    q.rq_psn = epsn;
    q.dest_qpn = d.dci;
    q.rc.resp = resp;
    pkt.src_qpn = d.dci;
    responder(w, pkt);
    let Some(q) = w.hcas[hca].qps.get_mut(&qpn) else {
        return;
    };
    let resp = std::mem::take(&mut q.rc.resp);
    let epsn = q.rq_psn;
    (q.rq_psn, q.dest_qpn, q.path) = saved;
    if let Some(s) = q.hpc.streams.get_mut(&id) {
        s.resp = resp;
        s.epsn = epsn;
    }
}
