//! Packets on the fabric, modelled after the InfiniBand headers they stand for.
//!
//! One [`Packet`] is one IB packet: the BTH fields (opcode, destination QP, PSN, SE and
//! AckReq) plus whichever extended headers the opcode carries (RETH, AtomicETH, AETH,
//! AtomicAckETH, ImmDt, IETH, DETH) and the GRH. The in-process fabric moves these structs;
//! a wire transport can serialise them to RoCEv2 without changing the engine.

/// IB BTH opcodes (RC 0x00.., UC 0x20.. with the same low bits, UD 0x60..). Messages
/// longer than the path MTU travel as FIRST/MIDDLE/LAST packets.
pub(crate) mod op {
    pub(crate) const RC_SEND_FIRST: u8 = 0x00;
    pub(crate) const RC_SEND_MIDDLE: u8 = 0x01;
    pub(crate) const RC_SEND_LAST: u8 = 0x02;
    pub(crate) const RC_SEND_LAST_IMM: u8 = 0x03;
    pub(crate) const RC_SEND_ONLY: u8 = 0x04;
    pub(crate) const RC_SEND_ONLY_IMM: u8 = 0x05;
    pub(crate) const RC_WRITE_FIRST: u8 = 0x06;
    pub(crate) const RC_WRITE_MIDDLE: u8 = 0x07;
    pub(crate) const RC_WRITE_LAST: u8 = 0x08;
    pub(crate) const RC_WRITE_LAST_IMM: u8 = 0x09;
    pub(crate) const RC_WRITE_ONLY: u8 = 0x0A;
    pub(crate) const RC_WRITE_ONLY_IMM: u8 = 0x0B;
    pub(crate) const RC_READ_REQUEST: u8 = 0x0C;
    pub(crate) const RC_READ_RESPONSE_FIRST: u8 = 0x0D;
    pub(crate) const RC_READ_RESPONSE_MIDDLE: u8 = 0x0E;
    pub(crate) const RC_READ_RESPONSE_LAST: u8 = 0x0F;
    pub(crate) const RC_READ_RESPONSE_ONLY: u8 = 0x10;
    pub(crate) const RC_ACK: u8 = 0x11;
    pub(crate) const RC_ATOMIC_ACK: u8 = 0x12;
    pub(crate) const RC_CMP_SWAP: u8 = 0x13;
    pub(crate) const RC_FETCH_ADD: u8 = 0x14;
    pub(crate) const RC_SEND_LAST_INV: u8 = 0x16;
    pub(crate) const RC_SEND_ONLY_INV: u8 = 0x17;
    /// Vendor-specific "masked atomic" request (ConnectX extended atomics).
    pub(crate) const RC_MASKED_ATOMIC: u8 = 0xC0;
    /// Transport bits: 0x00 RC, 0x20 UC, 0x60 UD.
    pub(crate) const UC: u8 = 0x20;
    pub(crate) const UD_SEND_ONLY: u8 = 0x64;
    pub(crate) const UD_SEND_ONLY_IMM: u8 = 0x65;
}

/// AETH syndromes (bits 7..5 type, 4..0 value).
pub(crate) mod aeth {
    pub(crate) const ACK: u8 = 0x00;
    pub(crate) const RNR_NAK: u8 = 0x20;
    pub(crate) const NAK_PSN_SEQ: u8 = 0x60;
    pub(crate) const NAK_INV_REQ: u8 = 0x61;
    pub(crate) const NAK_REM_ACCESS: u8 = 0x62;
    pub(crate) const NAK_REM_OP: u8 = 0x63;
}

/// RDMA extended transport header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Reth {
    pub(crate) va: u64,
    pub(crate) rkey: u32,
    pub(crate) len: u32,
}

/// Atomic extended transport header (plus the ConnectX masks for extended atomics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct AtomicEth {
    pub(crate) va: u64,
    pub(crate) rkey: u32,
    pub(crate) swap_add: u64,
    pub(crate) compare: u64,
    /// Masked atomics only: (swap_mask or field boundary, compare_mask, is_cs, size 4/8).
    pub(crate) masked: Option<(u64, u64, bool, u8)>,
}

/// Global route header fields we carry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Grh {
    pub(crate) tclass: u8,
    pub(crate) flow_label: u32,
    pub(crate) hop_limit: u8,
    pub(crate) sgid: [u8; 16],
    pub(crate) dgid: [u8; 16],
}

/// One packet.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Packet {
    pub(crate) src_hca: usize,
    pub(crate) dst_hca: usize,
    /// Destination LID (LRH; on RoCEv2 the node number in the destination IP).
    pub(crate) dst_lid: u16,
    /// Source LID (LRH).
    pub(crate) slid: u16,
    pub(crate) sl: u8,
    /// Boxed, like the AtomicETH: rare, and a small packet is cheap to move.
    pub(crate) grh: Option<Box<Grh>>,
    /// Sent by a RoCE port: the network header type the receiving CQE reports
    /// (`MLX5_CQE_ROCE_L3_HEADER_TYPE_*`: 0 GRH (RoCE v1), 1 IPv6, 2 IPv4).
    pub(crate) roce: Option<u8>,
    // BTH
    pub(crate) opcode: u8,
    pub(crate) se: bool,
    pub(crate) dst_qpn: u32,
    pub(crate) ack_req: bool,
    pub(crate) psn: u32,
    /// Source QPN: the DETH source QP for UD; for RC/UC the connection's requester/responder
    /// (what a real HCA knows from its QP context).
    pub(crate) src_qpn: u32,
    // Extended headers
    pub(crate) qkey: u32,
    pub(crate) reth: Option<Reth>,
    pub(crate) atomic: Option<Box<AtomicEth>>,
    /// AETH: (syndrome, MSN).
    pub(crate) aeth: Option<(u8, u32)>,
    pub(crate) atomic_ack: Option<u64>,
    /// ImmDt as it sits on the wire (network order bytes).
    pub(crate) imm: Option<[u8; 4]>,
    /// IETH rkey.
    pub(crate) inv_rkey: Option<u32>,
    /// The XRCETH or DCETH of a request from an XRC or DC initiator (`xrc_dc.rs`); boxed
    /// like the AtomicETH, so that a packet stays small.
    pub(crate) hpc: Option<Box<HpcEth>>,
    pub(crate) payload: Payload,
}

/// The extended header of an XRC or DC request. On the wire its opcode is in the XRC class
/// (0xA0) or this fabric's DC class (0xE0); inside the device it stays in RC's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HpcEth {
    /// XRCETH: the XRC SRQ number.
    Xrc(u32),
    Dc(DcEth),
}

impl Packet {
    /// The XRCETH's SRQ number, if the packet has one.
    pub(crate) fn xrc_srqn(&self) -> Option<u32> {
        match self.hpc.as_deref() {
            Some(HpcEth::Xrc(n)) => Some(*n),
            _ => None,
        }
    }

    /// The DCETH, if the packet has one.
    pub(crate) fn dc(&self) -> Option<DcEth> {
        match self.hpc.as_deref() {
            Some(HpcEth::Dc(d)) => Some(*d),
            _ => None,
        }
    }
}

/// The DC extended transport header this fabric carries right after the BTH of a DC
/// request (16 bytes: the DC access key, the connect flag and the DCI's QP number, 4
/// reserved bytes). Its opcode is in the manufacturer-specific class 0xE0 on the wire (the
/// RC opcode's low 5 bits), as RC's inside the device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct DcEth {
    pub(crate) key: u64,
    /// The first packet of a DCI's connection to this DCT.
    pub(crate) connect: bool,
    pub(crate) dci: u32,
}

/// Opcode classes on the wire: XRC (IBTA) and this fabric's DC.
pub(crate) const XRC_CLASS: u8 = 0xA0;
pub(crate) const DC_CLASS: u8 = 0xE0;

impl Packet {
    /// True for request packets (handled by the responder), false for ACK/responses.
    pub(crate) fn is_request(&self) -> bool {
        !(op::RC_READ_RESPONSE_FIRST..=op::RC_ATOMIC_ACK).contains(&self.opcode)
    }

    /// Transport class bits of the opcode (0x00 RC, 0x20 UC, 0x60 UD).
    pub(crate) fn transport(&self) -> u8 {
        if self.opcode == op::RC_MASKED_ATOMIC {
            0
        } else {
            self.opcode & 0xE0
        }
    }
}

/// Payloads up to this many bytes are stored inside the [`Packet`] (no allocation).
pub(crate) const INLINE_PAYLOAD: usize = 64;

/// The payload of a [`Packet`]: short ones in place, longer ones as a range of a shared
/// buffer, so that the copy an RC requester keeps for retransmission, the copy on the
/// fabric and the MTU-sized parts of a long message cost no allocation (short) or no data
/// copy (long). Dereferences to the bytes.
#[derive(Clone)]
pub(crate) enum Payload {
    /// `len` bytes at the start of `buf`.
    Inline { len: u8, buf: [u8; INLINE_PAYLOAD] },
    /// Bytes `start..end` of a shared buffer.
    Shared {
        buf: std::sync::Arc<Vec<u8>>,
        start: usize,
        end: usize,
    },
}

impl Payload {
    /// A payload holding a copy of `data`.
    pub(crate) fn from_slice(data: &[u8]) -> Self {
        if data.len() <= INLINE_PAYLOAD {
            let mut buf = [0u8; INLINE_PAYLOAD];
            buf[..data.len()].copy_from_slice(data);
            Payload::Inline {
                len: data.len() as u8,
                buf,
            }
        } else {
            Self::from_vec(data.to_vec())
        }
    }

    /// A payload taking over `v` (copied in place when short).
    pub(crate) fn from_vec(v: Vec<u8>) -> Self {
        if v.len() <= INLINE_PAYLOAD {
            return Self::from_slice(&v);
        }
        let end = v.len();
        Payload::Shared {
            buf: std::sync::Arc::new(v),
            start: 0,
            end,
        }
    }

    /// A payload of `len` bytes produced by `fill`, which gets a zeroed buffer of exactly
    /// `len` bytes (in place when short). `fill`'s error is passed on.
    pub(crate) fn build<E>(
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
    ) -> Result<Self, E> {
        if len <= INLINE_PAYLOAD {
            let mut buf = [0u8; INLINE_PAYLOAD];
            fill(&mut buf[..len])?;
            Ok(Payload::Inline {
                len: len as u8,
                buf,
            })
        } else {
            let mut v = vec![0u8; len];
            fill(&mut v)?;
            Ok(Self::from_vec(v))
        }
    }

    /// Bytes `range` of this payload (sharing the buffer of a long one). The range must
    /// lie within the payload.
    pub(crate) fn part(&self, range: std::ops::Range<usize>) -> Self {
        match self {
            Payload::Shared { buf, start, .. } => Payload::Shared {
                buf: buf.clone(),
                start: start + range.start,
                end: start + range.end,
            },
            Payload::Inline { .. } => Self::from_slice(&self[range]),
        }
    }
}

impl Default for Payload {
    fn default() -> Self {
        Payload::Inline {
            len: 0,
            buf: [0; INLINE_PAYLOAD],
        }
    }
}

impl std::ops::Deref for Payload {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Payload::Inline { len, buf } => &buf[..usize::from(*len)],
            Payload::Shared { buf, start, end } => buf.get(*start..*end).unwrap_or(&[]),
        }
    }
}

impl PartialEq for Payload {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for Payload {}

impl std::fmt::Debug for Payload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// The packets of one request: usually one, kept without an allocation. Dereferences to
/// the packet slice.
#[derive(Clone, Debug)]
pub(crate) enum Packets {
    /// A single packet.
    One(Packet),
    /// Any number (a multi-packet message, READ parts, or none).
    Many(Vec<Packet>),
}

impl Default for Packets {
    fn default() -> Self {
        Packets::Many(Vec::new())
    }
}

impl std::ops::Deref for Packets {
    type Target = [Packet];

    fn deref(&self) -> &[Packet] {
        match self {
            Packets::One(p) => std::slice::from_ref(p),
            Packets::Many(v) => v,
        }
    }
}

impl std::ops::DerefMut for Packets {
    fn deref_mut(&mut self) -> &mut [Packet] {
        match self {
            Packets::One(p) => std::slice::from_mut(p),
            Packets::Many(v) => v,
        }
    }
}

impl IntoIterator for Packets {
    type Item = Packet;
    type IntoIter = PacketsIter;

    fn into_iter(self) -> PacketsIter {
        match self {
            Packets::One(p) => PacketsIter::One(Some(p)),
            Packets::Many(v) => PacketsIter::Many(v.into_iter()),
        }
    }
}

/// By-value iterator of [`Packets`].
pub(crate) enum PacketsIter {
    One(Option<Packet>),
    Many(std::vec::IntoIter<Packet>),
}

impl Iterator for PacketsIter {
    type Item = Packet;

    fn next(&mut self) -> Option<Packet> {
        match self {
            PacketsIter::One(p) => p.take(),
            PacketsIter::Many(it) => it.next(),
        }
    }
}

/// 24-bit PSN arithmetic: is `a` strictly before `b` (within half the space)?
pub(crate) fn psn_before(a: u32, b: u32) -> bool {
    let d = b.wrapping_sub(a) & 0xff_ffff;
    d != 0 && d <= 0x80_0000
}

/// Local ACK timeout in ns: 4.096 us * 2^timeout (0 = infinite).
pub(crate) fn ack_timeout_ns(timeout: u8) -> Option<u64> {
    if timeout == 0 {
        None
    } else {
        Some(4096u64 << timeout.min(31))
    }
}

/// RNR NAK timer encoding (IBA table 45) in nanoseconds.
pub(crate) fn rnr_timer_ns(t: u8) -> u64 {
    const US: [u64; 32] = [
        655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560, 3840,
        5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122_880, 163_840, 245_760,
        327_680, 491_520,
    ];
    US[(t & 31) as usize] * 1000
}

/// Path MTU enum (1..5) to bytes.
pub(crate) fn mtu_bytes(mtu: u8) -> u32 {
    256u32 << (mtu.clamp(1, 5) - 1)
}

/// The IPv4 header checksum of `header` (its checksum field zero): the one's complement of
/// the one's-complement sum of its 16-bit words.
pub(crate) fn ipv4_checksum(header: &[u8]) -> u16 {
    let mut sum = header
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w.get(1).copied().unwrap_or(0)])))
        .sum::<u32>();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psn_window() {
        assert!(psn_before(1, 2));
        assert!(!psn_before(2, 2));
        assert!(psn_before(0xff_ffff, 0));
        assert!(!psn_before(0, 0xff_ffff));
    }

    #[test]
    fn timers() {
        assert_eq!(ack_timeout_ns(0), None);
        assert_eq!(ack_timeout_ns(1), Some(8192));
        assert_eq!(rnr_timer_ns(1), 10_000);
        assert_eq!(mtu_bytes(3), 1024);
    }
}

// ---------------------------------------------------------------------------------------
// RoCEv2 wire format

/// The RoCEv2 UDP destination port.
pub(crate) const ROCE_PORT: u16 = 4791;

/// Receive buffer of a node's RoCE socket: a burst of 6,400 MTU-sized datagrams (100 UC
/// SENDs of 64 KiB) fits (each takes about 2.3 KiB of buffer).
pub(crate) const ROCE_RCVBUF: i32 = 32 << 20;

/// Ask for a receive buffer of `bytes`, so bursts of MTU-sized packets are not tail-dropped
/// (the fabric a RoCE NIC sits on is lossless; only the fault model drops). With
/// `CAP_NET_ADMIN` (CI runs as root) `SO_RCVBUFFORCE` gets it whole; otherwise the kernel caps
/// `SO_RCVBUF` at `net.core.rmem_max` (4 MiB on a default Debian).
pub(crate) fn set_rcvbuf(s: &std::net::UdpSocket, bytes: i32) {
    use std::os::fd::AsRawFd;
    let set = |opt: libc::c_int| {
        // SAFETY: setsockopt on a socket we own, with a pointer to a live c_int and its size.
        unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&raw const bytes).cast(),
                size_of::<i32>() as libc::socklen_t,
            )
        }
    };
    if set(libc::SO_RCVBUFFORCE) != 0 {
        set(libc::SO_RCVBUF);
    }
}

/// The loopback address of fabric node `n` (its LID): 127.1.0.n.
pub(crate) fn node_ip(n: u16) -> [u8; 4] {
    [127, 1, (n >> 8) as u8, n as u8]
}

/// CRC-32 (IEEE 802.3, reflected, polynomial 0xEDB88320) lookup table.
const CRC_TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0xEDB8_8320
            } else {
                c >> 1
            };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

fn crc32(data: &[&[u8]]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for part in data {
        for &b in *part {
            crc = CRC_TABLE[((crc ^ u32::from(b)) & 0xff) as usize] ^ (crc >> 8);
        }
    }
    !crc
}

/// The IPv4 + UDP headers of a RoCEv2 packet carrying `udp_payload` bytes. With `masked`,
/// the variant fields (TOS, TTL, checksums) are all ones, as the ICRC computation wants.
pub(crate) fn ip_udp_headers(
    src: [u8; 4],
    dst: [u8; 4],
    udp_payload: usize,
    masked: bool,
) -> [u8; 28] {
    let mut h = [0u8; 28];
    let total = (20 + 8 + udp_payload) as u16;
    h[0] = 0x45;
    h[1] = if masked { 0xff } else { 0 };
    h[2..4].copy_from_slice(&total.to_be_bytes());
    h[6] = 0x40; // don't fragment
    h[8] = if masked { 0xff } else { 64 };
    h[9] = 17;
    h[12..16].copy_from_slice(&src);
    h[16..20].copy_from_slice(&dst);
    if masked {
        h[10] = 0xff;
        h[11] = 0xff;
    } else {
        let sum = ipv4_checksum(&h[..20]);
        h[10..12].copy_from_slice(&sum.to_be_bytes());
    }
    h[20..22].copy_from_slice(&ROCE_PORT.to_be_bytes());
    h[22..24].copy_from_slice(&ROCE_PORT.to_be_bytes());
    h[24..26].copy_from_slice(&((8 + udp_payload) as u16).to_be_bytes());
    if masked {
        h[26] = 0xff;
        h[27] = 0xff;
    }
    h
}

/// Serialise a packet as the UDP payload of a RoCEv2 packet: BTH, extended headers,
/// payload, ICRC.
pub(crate) fn encode(p: &Packet, src: [u8; 4], dst: [u8; 4]) -> Vec<u8> {
    let mut v = Vec::with_capacity(64 + p.payload.len());
    // BTH (12 bytes); XRC and DC requests carry their class on the wire.
    let class = match p.hpc.as_deref() {
        _ if p.opcode & 0xE0 != 0 => 0,
        Some(HpcEth::Xrc(_)) => XRC_CLASS,
        Some(HpcEth::Dc(_)) => DC_CLASS,
        None => 0,
    };
    v.push(p.opcode | class);
    v.push(u8::from(p.se) << 7 | 1 << 6); // SE, MigReq, pad 0, TVer 0
    v.extend_from_slice(&0xFFFFu16.to_be_bytes());
    v.extend_from_slice(&(p.dst_qpn & 0xff_ffff).to_be_bytes());
    v.extend_from_slice(&((u32::from(p.ack_req) << 31) | (p.psn & 0xff_ffff)).to_be_bytes());
    let t = p.transport();
    let base = p.opcode & 0x1f;
    if t == 0x60 {
        // DETH
        v.extend_from_slice(&p.qkey.to_be_bytes());
        v.extend_from_slice(&(p.src_qpn & 0xff_ffff).to_be_bytes());
    }
    if class == XRC_CLASS {
        // XRCETH
        v.extend_from_slice(&(p.xrc_srqn().unwrap_or(0) & 0xff_ffff).to_be_bytes());
    }
    if let Some(d) = p.dc().filter(|_| class == DC_CLASS) {
        v.extend_from_slice(&d.key.to_be_bytes());
        v.extend_from_slice(&((u32::from(d.connect) << 31) | (d.dci & 0xff_ffff)).to_be_bytes());
        v.extend_from_slice(&[0; 4]);
    }
    if let Some(r) = p
        .reth
        .filter(|_| t != 0x60 && matches!(base, 0x06 | 0x0A..=0x0C))
    {
        v.extend_from_slice(&r.va.to_be_bytes());
        v.extend_from_slice(&r.rkey.to_be_bytes());
        v.extend_from_slice(&r.len.to_be_bytes());
    }
    if let Some(a) = p.atomic.as_deref() {
        v.extend_from_slice(&a.va.to_be_bytes());
        v.extend_from_slice(&a.rkey.to_be_bytes());
        v.extend_from_slice(&a.swap_add.to_be_bytes());
        v.extend_from_slice(&a.compare.to_be_bytes());
        if p.opcode == op::RC_MASKED_ATOMIC {
            let (m1, m2, cs, size) = a.masked.unwrap_or_default();
            v.extend_from_slice(&m1.to_be_bytes());
            v.extend_from_slice(&m2.to_be_bytes());
            v.extend_from_slice(&[u8::from(cs), size, 0, 0]);
        }
    }
    if let Some((syn, msn)) = p.aeth {
        v.extend_from_slice(&((u32::from(syn) << 24) | (msn & 0xff_ffff)).to_be_bytes());
    }
    if let Some(x) = p.atomic_ack {
        v.extend_from_slice(&x.to_be_bytes());
    }
    if let Some(i) = p.imm {
        v.extend_from_slice(&i);
    }
    if let Some(k) = p.inv_rkey {
        v.extend_from_slice(&k.to_be_bytes());
    }
    v.extend_from_slice(&p.payload);
    let icrc = icrc(&v, src, dst);
    v.extend_from_slice(&icrc.to_le_bytes());
    v
}

/// The ICRC of a RoCEv2 UDP payload (`bth_on`: BTH onwards, without the ICRC).
pub(crate) fn icrc(bth_on: &[u8], src: [u8; 4], dst: [u8; 4]) -> u32 {
    let hdr = ip_udp_headers(src, dst, bth_on.len() + 4, true);
    let mut bth = [0u8; 12];
    bth.copy_from_slice(&bth_on[..12]);
    bth[4] = 0xff; // resv8a (FECN/BECN) is variant
    crc32(&[&[0xff; 8], &hdr, &bth, &bth_on[12..]])
}

/// Parse a RoCEv2 UDP payload. None if it is malformed or the ICRC is wrong.
pub(crate) fn decode(b: &[u8], src: [u8; 4], dst: [u8; 4]) -> Option<Packet> {
    if b.len() < 16 {
        return None;
    }
    let (body, crc) = b.split_at(b.len() - 4);
    if icrc(body, src, dst).to_le_bytes() != crc {
        return None;
    }
    let be32 = |o: usize| {
        body.get(o..o + 4)
            .map(|s| u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
    };
    let be64 = |o: usize| {
        body.get(o..o + 8)
            .map(|s| u64::from_be_bytes(s.try_into().unwrap_or([0; 8])))
    };
    let mut p = Packet {
        opcode: body[0],
        se: body[1] & 0x80 != 0,
        dst_qpn: be32(4)? & 0xff_ffff,
        ack_req: body[8] & 0x80 != 0,
        psn: be32(8)? & 0xff_ffff,
        src_qpn: UNKNOWN_QPN,
        ..Default::default()
    };
    let mut o = 12;
    // XRC and DC requests: the extended header, and the opcode back in RC's class.
    match p.opcode & 0xE0 {
        XRC_CLASS if p.opcode & 0x1f <= 0x17 => {
            p.hpc = Some(Box::new(HpcEth::Xrc(be32(o)? & 0xff_ffff)));
            p.opcode &= 0x1f;
            o += 4;
        }
        DC_CLASS if p.opcode & 0x1f <= 0x17 => {
            let w = be32(o + 8)?;
            be32(o + 12)?;
            p.hpc = Some(Box::new(HpcEth::Dc(DcEth {
                key: be64(o)?,
                connect: w & 0x8000_0000 != 0,
                dci: w & 0xff_ffff,
            })));
            p.src_qpn = w & 0xff_ffff;
            p.opcode &= 0x1f;
            o += 16;
        }
        _ => {}
    }
    let t = p.transport();
    let base = p.opcode & 0x1f;
    if t == 0x60 {
        p.qkey = be32(o)?;
        p.src_qpn = be32(o + 4)? & 0xff_ffff;
        o += 8;
    } else if !matches!(t, 0x00 | 0x20) {
        return None;
    }
    let masked = p.opcode == op::RC_MASKED_ATOMIC;
    if t != 0x60 && matches!(base, 0x06 | 0x0A..=0x0C) {
        p.reth = Some(Reth {
            va: be64(o)?,
            rkey: be32(o + 8)?,
            len: be32(o + 12)?,
        });
        o += 16;
    }
    if t == 0 && (matches!(p.opcode, op::RC_CMP_SWAP | op::RC_FETCH_ADD) || masked) {
        let mut a = AtomicEth {
            va: be64(o)?,
            rkey: be32(o + 8)?,
            swap_add: be64(o + 12)?,
            compare: be64(o + 20)?,
            masked: None,
        };
        o += 28;
        if masked {
            let f = body.get(o + 16..o + 20)?;
            a.masked = Some((be64(o)?, be64(o + 8)?, f[0] != 0, f[1]));
            o += 20;
        }
        p.atomic = Some(Box::new(a));
    }
    if t == 0
        && matches!(
            p.opcode,
            op::RC_READ_RESPONSE_FIRST | op::RC_READ_RESPONSE_LAST..=op::RC_ATOMIC_ACK
        )
    {
        let w = be32(o)?;
        p.aeth = Some(((w >> 24) as u8, w & 0xff_ffff));
        o += 4;
    }
    if p.opcode == op::RC_ATOMIC_ACK {
        p.atomic_ack = Some(be64(o)?);
        o += 8;
    }
    if matches!(base, 0x03 | 0x05 | 0x09 | 0x0B) {
        let s = body.get(o..o + 4)?;
        p.imm = Some([s[0], s[1], s[2], s[3]]);
        o += 4;
    }
    if t == 0 && matches!(p.opcode, op::RC_SEND_LAST_INV | op::RC_SEND_ONLY_INV) {
        p.inv_rkey = Some(be32(o)?);
        o += 4;
    }
    p.payload = Payload::from_slice(body.get(o..)?);
    if let Some(r) = p
        .reth
        .as_mut()
        .filter(|_| t != 0x60 && (base == 0x0A || base == 0x0B))
    {
        // The WRITE length is the payload actually carried.
        if r.len as usize != p.payload.len() {
            return None;
        }
    }
    Some(p)
}

/// Placeholder source QPN of RC/UC packets from the wire (the BTH does not carry it; the
/// receiving QP's context knows its peer).
pub(crate) const UNKNOWN_QPN: u32 = u32::MAX;

#[cfg(test)]
mod wire_tests {
    use super::*;

    #[test]
    fn crc32_matches_the_ieee_check_value() {
        assert_eq!(crc32(&[b"123456789"]), 0xCBF4_3926);
        assert_eq!(crc32(&[b"1234", b"56789"]), 0xCBF4_3926);
    }

    #[test]
    fn encode_decode_round_trip_and_icrc() {
        let p = Packet {
            opcode: op::RC_WRITE_ONLY_IMM,
            se: true,
            dst_qpn: 0x12_3456,
            ack_req: true,
            psn: 0xab_cdef,
            reth: Some(Reth {
                va: 0x1122_3344_5566_7788,
                rkey: 0x99aa_bbcc,
                len: 5,
            }),
            imm: Some([1, 2, 3, 4]),
            payload: Payload::from_slice(b"hello"),
            src_qpn: UNKNOWN_QPN,
            ..Default::default()
        };
        let (s, d) = (node_ip(1), node_ip(2));
        let mut w = encode(&p, s, d);
        assert_eq!(w.len(), 12 + 16 + 4 + 5 + 4);
        assert_eq!(decode(&w, s, d), Some(p.clone()));
        assert_eq!(decode(&w, d, s), None, "the ICRC covers the addresses");
        w[20] ^= 1;
        assert_eq!(decode(&w, s, d), None, "corruption is caught");
        let ud = Packet {
            opcode: op::UD_SEND_ONLY_IMM,
            qkey: 7,
            src_qpn: 9,
            imm: Some([9; 4]),
            payload: Payload::from_slice(&[1; 3]),
            ..Default::default()
        };
        assert_eq!(decode(&encode(&ud, s, d), s, d), Some(ud));
        let ack = Packet {
            opcode: op::RC_ATOMIC_ACK,
            aeth: Some((0, 3)),
            atomic_ack: Some(42),
            src_qpn: UNKNOWN_QPN,
            ..Default::default()
        };
        assert_eq!(decode(&encode(&ack, s, d), s, d), Some(ack));
    }
}

#[cfg(test)]
mod payload_tests {
    use super::*;

    #[test]
    fn short_payloads_stay_in_place_and_long_ones_share_their_buffer() {
        let short = Payload::from_slice(&[7; INLINE_PAYLOAD]);
        assert!(matches!(short, Payload::Inline { .. }));
        assert_eq!(&short[..], &[7; INLINE_PAYLOAD][..]);
        let data: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
        let long = Payload::from_slice(&data);
        assert!(matches!(long, Payload::Shared { .. }));
        assert_eq!(&long[..], &data[..]);
        // Parts of a long payload share its buffer and see exactly their bytes.
        let part = long.part(300..900);
        assert_eq!(&part[..], &data[300..900]);
        let Payload::Shared { buf, .. } = &part else {
            panic!("a part of a shared payload is shared");
        };
        assert_eq!(std::sync::Arc::strong_count(buf), 2);
        // Equality is by content, whatever the representation.
        assert_eq!(
            Payload::from_vec(data[..10].to_vec()),
            Payload::from_slice(&data[..10])
        );
        assert_eq!(long.part(0..10), Payload::from_slice(&data[..10]));
        assert_ne!(long.part(1..11), Payload::from_slice(&data[..10]));
        assert!(Payload::default().is_empty());
    }

    #[test]
    fn build_fills_exactly_len_bytes_and_passes_errors_on() {
        for len in [0, 1, INLINE_PAYLOAD, INLINE_PAYLOAD + 1, 4096] {
            let p = Payload::build(len, |b| -> Result<(), ()> {
                assert_eq!(b.len(), len);
                assert!(b.iter().all(|&x| x == 0), "a zeroed buffer");
                b.iter_mut().enumerate().for_each(|(i, x)| *x = i as u8);
                Ok(())
            })
            .expect("fill succeeds");
            assert_eq!(p.len(), len);
            assert!(p.iter().enumerate().all(|(i, &x)| x == i as u8));
        }
        assert_eq!(Payload::build(8, |_| Err(5)), Err(5));
        assert_eq!(Payload::build(800, |_| Err(6)), Err(6));
    }

    #[test]
    fn packets_hold_one_or_many() {
        let one = Packets::One(Packet {
            psn: 5,
            ..Default::default()
        });
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].psn, 5);
        let many = Packets::Many(
            (0..3)
                .map(|psn| Packet {
                    psn,
                    ..Default::default()
                })
                .collect(),
        );
        assert_eq!(many.iter().map(|p| p.psn).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(many.into_iter().map(|p| p.psn).sum::<u32>(), 3);
        assert_eq!(one.into_iter().count(), 1);
        assert!(Packets::default().is_empty());
    }
}
