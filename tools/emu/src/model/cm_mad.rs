//! The CM's messages as MADs (IBTA vol. 1 ch. 12, the layouts of `<rdma/ib_cm.h>`'s wire
//! formats): REQ, REP, RTU, REJ, DREQ, DREP, SIDR REQ and SIDR REP, each a 256-byte MAD of
//! management class 0x07 sent from QP1 to QP1 (GSI). Only the fields the emulated CM uses
//! are decoded; everything is encoded where IBTA puts it, so a capture decodes as CM
//! traffic. The rdma_cm header (version, IP version, port, addresses) opens the private
//! data of REQ and SIDR REQ, as the kernel's `cma.c` puts it there.

/// Size of a MAD.
pub(crate) const MAD_LEN: usize = 256;
/// Offset of the CM attribute data in a MAD.
const DATA: usize = 24;
/// Management class of the CM.
pub(crate) const CM_CLASS: u8 = 0x07;
/// The GSI QKey.
pub(crate) const GSI_QKEY: u32 = 0x8001_0000;
/// Bytes of the rdma_cm header at the start of REQ / SIDR REQ private data.
pub(crate) const CMA_HDR: usize = 36;

/// Attribute ids.
pub(crate) mod attr {
    pub(crate) const REQ: u16 = 0x0010;
    pub(crate) const REJ: u16 = 0x0012;
    pub(crate) const REP: u16 = 0x0013;
    pub(crate) const RTU: u16 = 0x0014;
    pub(crate) const DREQ: u16 = 0x0015;
    pub(crate) const DREP: u16 = 0x0016;
    pub(crate) const SIDR_REQ: u16 = 0x0017;
    pub(crate) const SIDR_REP: u16 = 0x0018;
}

/// Private data sizes (IB_CM_*_PRIVATE_DATA_SIZE).
pub(crate) mod pd {
    pub(crate) const REQ: usize = 92;
    pub(crate) const REP: usize = 196;
    pub(crate) const REJ: usize = 148;
    pub(crate) const SIDR_REQ: usize = 216;
    pub(crate) const SIDR_REP: usize = 136;
}

/// One CM message, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum CmMsg {
    Req(Req),
    Rep(Rep),
    Rtu {
        local_comm: u32,
        remote_comm: u32,
    },
    Rej {
        local_comm: u32,
        remote_comm: u32,
        reason: u16,
        private: Vec<u8>,
    },
    Dreq {
        local_comm: u32,
        remote_comm: u32,
        remote_qpn: u32,
    },
    Drep {
        local_comm: u32,
        remote_comm: u32,
    },
    SidrReq {
        request_id: u32,
        service_id: u64,
        private: Vec<u8>,
    },
    SidrRep {
        request_id: u32,
        status: u8,
        qpn: u32,
        qkey: u32,
        service_id: u64,
        private: Vec<u8>,
    },
}

/// A REQ (the fields the emulated CM uses).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Req {
    pub(crate) local_comm: u32,
    pub(crate) service_id: u64,
    pub(crate) ca_guid: u64,
    pub(crate) qpn: u32,
    pub(crate) responder_resources: u8,
    pub(crate) initiator_depth: u8,
    /// 0 RC, 1 UC.
    pub(crate) transport: u8,
    pub(crate) flow_control: bool,
    pub(crate) psn: u32,
    pub(crate) retry_count: u8,
    pub(crate) pkey: u16,
    pub(crate) mtu: u8,
    pub(crate) rnr_retry: u8,
    pub(crate) srq: bool,
    pub(crate) local_lid: u16,
    pub(crate) remote_lid: u16,
    pub(crate) local_gid: [u8; 16],
    pub(crate) remote_gid: [u8; 16],
    pub(crate) traffic_class: u8,
    pub(crate) hop_limit: u8,
    pub(crate) sl: u8,
    pub(crate) ack_timeout: u8,
    /// All 92 bytes (the rdma_cm header, then the user's).
    pub(crate) private: Vec<u8>,
}

/// A REP.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Rep {
    pub(crate) local_comm: u32,
    pub(crate) remote_comm: u32,
    pub(crate) qpn: u32,
    pub(crate) psn: u32,
    pub(crate) responder_resources: u8,
    pub(crate) initiator_depth: u8,
    pub(crate) flow_control: bool,
    pub(crate) rnr_retry: u8,
    pub(crate) srq: bool,
    pub(crate) ca_guid: u64,
    pub(crate) private: Vec<u8>,
}

fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}
fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}
fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_be_bytes());
}
fn get32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn get16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}
fn get64(b: &[u8], at: usize) -> u64 {
    (u64::from(get32(b, at)) << 32) | u64::from(get32(b, at + 4))
}
fn put_private(b: &mut [u8], at: usize, max: usize, data: &[u8]) {
    let n = data.len().min(max);
    b[at..at + n].copy_from_slice(&data[..n]);
}

impl CmMsg {
    /// The MAD (256 bytes) carrying this message, with transaction id `tid`.
    pub(crate) fn encode(&self, tid: u64) -> Vec<u8> {
        let mut m = vec![0u8; MAD_LEN];
        m[0] = 1; // base version
        m[1] = CM_CLASS;
        m[2] = 2; // class version
        m[3] = 0x03; // Send
        put64(&mut m, 8, tid);
        let (id, d) = (self.attr_id(), &mut m[DATA..]);
        match self {
            CmMsg::Req(r) => {
                put32(d, 0, r.local_comm);
                put64(d, 8, r.service_id);
                put64(d, 16, r.ca_guid);
                put32(d, 32, (r.qpn << 8) | u32::from(r.responder_resources));
                put32(d, 36, u32::from(r.initiator_depth));
                // remote CM response timeout 20, transport, flow control
                put32(
                    d,
                    40,
                    (20 << 3) | (u32::from(r.transport & 3) << 1) | u32::from(r.flow_control),
                );
                put32(
                    d,
                    44,
                    (r.psn << 8) | (20 << 3) | u32::from(r.retry_count & 7),
                );
                put16(d, 48, r.pkey);
                d[50] = (r.mtu << 4) | (r.rnr_retry & 7);
                d[51] = (15 << 4) | (u8::from(r.srq) << 3);
                put16(d, 52, r.local_lid);
                put16(d, 54, r.remote_lid);
                d[56..72].copy_from_slice(&r.local_gid);
                d[72..88].copy_from_slice(&r.remote_gid);
                put32(d, 88, 0x3); // flow label 0, packet rate 3 (2.5 Gb/s)
                d[92] = r.traffic_class;
                d[93] = r.hop_limit;
                d[94] = (r.sl << 4) | 0x08; // subnet local
                d[95] = r.ack_timeout << 3;
                put_private(d, 140, pd::REQ, &r.private);
            }
            CmMsg::Rep(r) => {
                put32(d, 0, r.local_comm);
                put32(d, 4, r.remote_comm);
                put32(d, 12, r.qpn << 8);
                put32(d, 20, r.psn << 8);
                d[24] = r.responder_resources;
                d[25] = r.initiator_depth;
                d[26] = (20 << 3) | u8::from(r.flow_control);
                d[27] = ((r.rnr_retry & 7) << 5) | (u8::from(r.srq) << 4);
                put64(d, 28, r.ca_guid);
                put_private(d, 36, pd::REP, &r.private);
            }
            CmMsg::Rtu {
                local_comm,
                remote_comm,
            }
            | CmMsg::Drep {
                local_comm,
                remote_comm,
            } => {
                put32(d, 0, *local_comm);
                put32(d, 4, *remote_comm);
            }
            CmMsg::Rej {
                local_comm,
                remote_comm,
                reason,
                private,
            } => {
                put32(d, 0, *local_comm);
                put32(d, 4, *remote_comm);
                put16(d, 10, *reason);
                put_private(d, 84, pd::REJ, private);
            }
            CmMsg::Dreq {
                local_comm,
                remote_comm,
                remote_qpn,
            } => {
                put32(d, 0, *local_comm);
                put32(d, 4, *remote_comm);
                put32(d, 8, remote_qpn << 8);
            }
            CmMsg::SidrReq {
                request_id,
                service_id,
                private,
            } => {
                put32(d, 0, *request_id);
                put16(d, 4, 0xffff);
                put64(d, 8, *service_id);
                put_private(d, 16, pd::SIDR_REQ, private);
            }
            CmMsg::SidrRep {
                request_id,
                status,
                qpn,
                qkey,
                service_id,
                private,
            } => {
                put32(d, 0, *request_id);
                d[4] = *status;
                put32(d, 8, qpn << 8);
                put64(d, 12, *service_id);
                put32(d, 20, *qkey);
                put_private(d, 96, pd::SIDR_REP, private);
            }
        }
        put16(&mut m, 16, id);
        m
    }

    fn attr_id(&self) -> u16 {
        match self {
            CmMsg::Req(_) => attr::REQ,
            CmMsg::Rep(_) => attr::REP,
            CmMsg::Rtu { .. } => attr::RTU,
            CmMsg::Rej { .. } => attr::REJ,
            CmMsg::Dreq { .. } => attr::DREQ,
            CmMsg::Drep { .. } => attr::DREP,
            CmMsg::SidrReq { .. } => attr::SIDR_REQ,
            CmMsg::SidrRep { .. } => attr::SIDR_REP,
        }
    }

    /// Decode a MAD: `None` unless it is a CM Send MAD of a known attribute and full size.
    pub(crate) fn decode(m: &[u8]) -> Option<(u64, CmMsg)> {
        if m.len() < MAD_LEN || m[0] != 1 || m[1] != CM_CLASS || m[2] != 2 || m[3] != 0x03 {
            return None;
        }
        let tid = get64(m, 8);
        let d = &m[DATA..MAD_LEN];
        let msg = match get16(m, 16) {
            attr::REQ => CmMsg::Req(Req {
                local_comm: get32(d, 0),
                service_id: get64(d, 8),
                ca_guid: get64(d, 16),
                qpn: get32(d, 32) >> 8,
                responder_resources: d[35],
                initiator_depth: d[39],
                transport: (d[43] >> 1) & 3,
                flow_control: d[43] & 1 != 0,
                psn: get32(d, 44) >> 8,
                retry_count: d[47] & 7,
                pkey: get16(d, 48),
                mtu: d[50] >> 4,
                rnr_retry: d[50] & 7,
                srq: d[51] & 0x08 != 0,
                local_lid: get16(d, 52),
                remote_lid: get16(d, 54),
                local_gid: d[56..72].try_into().ok()?,
                remote_gid: d[72..88].try_into().ok()?,
                traffic_class: d[92],
                hop_limit: d[93],
                sl: d[94] >> 4,
                ack_timeout: d[95] >> 3,
                private: d[140..140 + pd::REQ].to_vec(),
            }),
            attr::REP => CmMsg::Rep(Rep {
                local_comm: get32(d, 0),
                remote_comm: get32(d, 4),
                qpn: get32(d, 12) >> 8,
                psn: get32(d, 20) >> 8,
                responder_resources: d[24],
                initiator_depth: d[25],
                flow_control: d[26] & 1 != 0,
                rnr_retry: d[27] >> 5,
                srq: d[27] & 0x10 != 0,
                ca_guid: get64(d, 28),
                private: d[36..36 + pd::REP].to_vec(),
            }),
            attr::RTU => CmMsg::Rtu {
                local_comm: get32(d, 0),
                remote_comm: get32(d, 4),
            },
            attr::REJ => CmMsg::Rej {
                local_comm: get32(d, 0),
                remote_comm: get32(d, 4),
                reason: get16(d, 10),
                private: d[84..84 + pd::REJ].to_vec(),
            },
            attr::DREQ => CmMsg::Dreq {
                local_comm: get32(d, 0),
                remote_comm: get32(d, 4),
                remote_qpn: get32(d, 8) >> 8,
            },
            attr::DREP => CmMsg::Drep {
                local_comm: get32(d, 0),
                remote_comm: get32(d, 4),
            },
            attr::SIDR_REQ => CmMsg::SidrReq {
                request_id: get32(d, 0),
                service_id: get64(d, 8),
                private: d[16..16 + pd::SIDR_REQ].to_vec(),
            },
            attr::SIDR_REP => CmMsg::SidrRep {
                request_id: get32(d, 0),
                status: d[4],
                qpn: get32(d, 8) >> 8,
                service_id: get64(d, 12),
                qkey: get32(d, 20),
                private: d[96..96 + pd::SIDR_REP].to_vec(),
            },
            _ => return None,
        };
        Some((tid, msg))
    }
}

/// The rdma_cm header of a REQ / SIDR REQ: (source port, source IP, destination IP), IPs
/// as 16 bytes (IPv4 mapped), and whether they are IPv4. `None` for another version.
pub(crate) fn cma_hdr_decode(p: &[u8]) -> Option<(u16, [u8; 16], [u8; 16], bool)> {
    if p.len() < CMA_HDR || p[0] != 0 {
        return None;
    }
    let v4 = match p[1] >> 4 {
        4 => true,
        6 => false,
        _ => return None,
    };
    let port = get16(p, 2);
    let mut src: [u8; 16] = p[4..20].try_into().ok()?;
    let mut dst: [u8; 16] = p[20..36].try_into().ok()?;
    if v4 {
        for a in [&mut src, &mut dst] {
            a[..10].fill(0);
            a[10] = 0xff;
            a[11] = 0xff;
        }
    }
    Some((port, src, dst, v4))
}

/// Encode the rdma_cm header (IPv4 addresses go in the last four bytes of each field).
pub(crate) fn cma_hdr_encode(port: u16, src: [u8; 16], dst: [u8; 16], v4: bool) -> [u8; CMA_HDR] {
    let mut h = [0u8; CMA_HDR];
    h[1] = if v4 { 4 << 4 } else { 6 << 4 };
    put16(&mut h, 2, port);
    if v4 {
        h[16..20].copy_from_slice(&src[12..]);
        h[32..36].copy_from_slice(&dst[12..]);
    } else {
        h[4..20].copy_from_slice(&src);
        h[20..36].copy_from_slice(&dst);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_round_trips_through_its_mad() {
        let req = CmMsg::Req(Req {
            local_comm: 0x1234_5678,
            service_id: 0x0000_0000_0106_1c06,
            ca_guid: 0x0002_c903_00ab_cd05,
            qpn: 0x01_0203,
            responder_resources: 4,
            initiator_depth: 3,
            transport: 0,
            flow_control: true,
            psn: 0xab_cdef,
            retry_count: 7,
            pkey: 0xffff,
            mtu: 5,
            rnr_retry: 6,
            srq: true,
            local_lid: 5,
            remote_lid: 6,
            local_gid: [1; 16],
            remote_gid: [2; 16],
            traffic_class: 0,
            hop_limit: 64,
            sl: 0,
            ack_timeout: 18,
            private: (0..92).collect(),
        });
        let msgs = [
            req,
            CmMsg::Rep(Rep {
                local_comm: 1,
                remote_comm: 2,
                qpn: 0xff_ffff,
                psn: 3,
                responder_resources: 1,
                initiator_depth: 2,
                flow_control: true,
                rnr_retry: 7,
                srq: false,
                ca_guid: 9,
                private: vec![7; 196],
            }),
            CmMsg::Rtu {
                local_comm: 4,
                remote_comm: 5,
            },
            CmMsg::Rej {
                local_comm: 4,
                remote_comm: 5,
                reason: 28,
                private: vec![1; 148],
            },
            CmMsg::Dreq {
                local_comm: 4,
                remote_comm: 5,
                remote_qpn: 77,
            },
            CmMsg::Drep {
                local_comm: 4,
                remote_comm: 5,
            },
            CmMsg::SidrReq {
                request_id: 8,
                service_id: 0x111_0000,
                private: vec![3; 216],
            },
            CmMsg::SidrRep {
                request_id: 8,
                status: 0,
                qpn: 99,
                qkey: 0x0123_4567,
                service_id: 0x111_0000,
                private: vec![4; 136],
            },
        ];
        for m in msgs {
            let mad = m.encode(42);
            assert_eq!(mad.len(), MAD_LEN);
            assert_eq!(CmMsg::decode(&mad), Some((42, m)));
        }
    }

    #[test]
    fn garbage_is_not_a_cm_message() {
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..10_000 {
            let mut m = vec![0u8; (rng % 300) as usize];
            for b in &mut m {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                *b = rng as u8;
            }
            // Never panics; a random MAD is almost never a CM Send of a known attribute.
            let _ = CmMsg::decode(&m);
        }
        assert_eq!(CmMsg::decode(&[0u8; 255]), None);
        let mut bad = CmMsg::Rtu {
            local_comm: 1,
            remote_comm: 2,
        }
        .encode(1);
        bad[16] = 0x77;
        assert_eq!(CmMsg::decode(&bad), None);
    }

    #[test]
    fn the_rdma_cm_header_carries_ports_and_addresses() {
        let src = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 1, 0, 3];
        let dst = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1];
        let h = cma_hdr_encode(4242, src, dst, true);
        assert_eq!(cma_hdr_decode(&h), Some((4242, src, dst, true)));
        assert_eq!(cma_hdr_decode(&h[..20]), None);
    }
}
