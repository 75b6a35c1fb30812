//! The Ethernet port of the emulated HCA, the parts that are pure functions of bytes:
//! frame classification (L2/L3/L4, VLAN), the Internet checksums the device verifies on
//! receive and fills in on send (checksum offload), and the port's flow steering table
//! (`ibv_create_flow` rules: match, priority, drop, and what happens to a frame no rule
//! takes). The device stages that use them are in `device/raw.rs`; the kernel commands that
//! fill the table in `kernel/flow.rs`. `docs/raw-ethernet.md` describes the whole.

pub(crate) mod tap;

/// Smallest frame the port accepts (destination, source, EtherType).
pub(crate) const MIN_FRAME: usize = 14;
/// Largest frame the port sends or accepts: a 9000-byte MTU, the Ethernet header and one
/// VLAN tag (the FCS is not part of what software sees).
pub(crate) const MAX_FRAME: usize = 9000 + 14 + 4;

/// EtherTypes the port classifies.
pub(crate) const ETH_P_IPV4: u16 = 0x0800;
/// IPv6.
pub(crate) const ETH_P_IPV6: u16 = 0x86dd;
/// 802.1Q C-VLAN tag.
pub(crate) const ETH_P_8021Q: u16 = 0x8100;
/// IP protocol numbers.
pub(crate) const IPPROTO_TCP: u8 = 6;
/// UDP.
pub(crate) const IPPROTO_UDP: u8 = 17;

/// Layer 3 of a frame as the device classifies it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum L3 {
    /// Not IP (or a truncated IP header).
    None,
    /// IPv4: header at `off`, `ihl` bytes long.
    Ipv4 {
        off: usize,
        ihl: usize,
        src: [u8; 4],
        dst: [u8; 4],
        proto: u8,
        tos: u8,
        ttl: u8,
        /// A fragment other than the first (no L4 header of its own).
        frag: bool,
    },
    /// IPv6: fixed header at `off` (extension headers are not walked).
    Ipv6 {
        off: usize,
        src: [u8; 16],
        dst: [u8; 16],
        next_hdr: u8,
        tclass: u8,
        hop_limit: u8,
        flow_label: u32,
    },
}

/// Layer 4 of a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum L4 {
    /// Neither TCP nor UDP, or truncated.
    None,
    /// TCP header at `off`: ports, whether ACK is set, whether data follows the header.
    Tcp {
        off: usize,
        sport: u16,
        dport: u16,
        ack: bool,
        data: bool,
    },
    /// UDP header at `off`.
    Udp { off: usize, sport: u16, dport: u16 },
}

/// What the device reads from a frame's headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Parsed {
    pub(crate) dmac: [u8; 6],
    pub(crate) smac: [u8; 6],
    /// The C-VLAN TCI, if the frame carries an 802.1Q tag.
    pub(crate) vlan: Option<u16>,
    /// The EtherType after the tag.
    pub(crate) ethertype: u16,
    pub(crate) l3: L3,
    pub(crate) l4: L4,
}

fn be16(b: &[u8], off: usize) -> u16 {
    u16::from_be_bytes([b[off], b[off + 1]])
}

/// Classify `frame`; None if it is shorter than an Ethernet header (a runt).
pub(crate) fn parse(frame: &[u8]) -> Option<Parsed> {
    if frame.len() < MIN_FRAME {
        return None;
    }
    let mut dmac = [0u8; 6];
    let mut smac = [0u8; 6];
    dmac.copy_from_slice(&frame[0..6]);
    smac.copy_from_slice(&frame[6..12]);
    let mut ethertype = be16(frame, 12);
    let mut off = 14;
    let mut vlan = None;
    if ethertype == ETH_P_8021Q && frame.len() >= 18 {
        vlan = Some(be16(frame, 14));
        ethertype = be16(frame, 16);
        off = 18;
    }
    let mut p = Parsed {
        dmac,
        smac,
        vlan,
        ethertype,
        l3: L3::None,
        l4: L4::None,
    };
    let (proto, l4_off, l4_end) = match ethertype {
        ETH_P_IPV4 => {
            let Some(h) = frame.get(off..off + 20) else {
                return Some(p);
            };
            let ihl = usize::from(h[0] & 0x0f) * 4;
            if h[0] >> 4 != 4 || ihl < 20 || frame.len() < off + ihl {
                return Some(p);
            }
            let total = usize::from(be16(h, 2));
            let frag_off = be16(h, 6) & 0x1fff;
            let mut src = [0u8; 4];
            let mut dst = [0u8; 4];
            src.copy_from_slice(&h[12..16]);
            dst.copy_from_slice(&h[16..20]);
            p.l3 = L3::Ipv4 {
                off,
                ihl,
                src,
                dst,
                proto: h[9],
                tos: h[1],
                ttl: h[8],
                frag: frag_off != 0,
            };
            if frag_off != 0 || total < ihl {
                return Some(p);
            }
            (h[9], off + ihl, (off + total).min(frame.len()))
        }
        ETH_P_IPV6 => {
            let Some(h) = frame.get(off..off + 40) else {
                return Some(p);
            };
            if h[0] >> 4 != 6 {
                return Some(p);
            }
            let mut src = [0u8; 16];
            let mut dst = [0u8; 16];
            src.copy_from_slice(&h[8..24]);
            dst.copy_from_slice(&h[24..40]);
            p.l3 = L3::Ipv6 {
                off,
                src,
                dst,
                next_hdr: h[6],
                tclass: (h[0] << 4) | (h[1] >> 4),
                hop_limit: h[7],
                flow_label: u32::from_be_bytes([0, h[1] & 0x0f, h[2], h[3]]),
            };
            let plen = usize::from(be16(h, 4));
            (h[6], off + 40, (off + 40 + plen).min(frame.len()))
        }
        _ => return Some(p),
    };
    match proto {
        IPPROTO_UDP if l4_end >= l4_off + 8 => {
            p.l4 = L4::Udp {
                off: l4_off,
                sport: be16(frame, l4_off),
                dport: be16(frame, l4_off + 2),
            };
        }
        IPPROTO_TCP if l4_end >= l4_off + 20 => {
            let doff = usize::from(frame[l4_off + 12] >> 4) * 4;
            p.l4 = L4::Tcp {
                off: l4_off,
                sport: be16(frame, l4_off),
                dport: be16(frame, l4_off + 2),
                ack: frame[l4_off + 13] & 0x10 != 0,
                data: l4_end > l4_off + doff.max(20),
            };
        }
        _ => {}
    }
    Some(p)
}

/// One's-complement sum of `data` (16-bit big-endian words, an odd last byte padded),
/// folded into `acc`.
fn sum16(data: &[u8], mut acc: u32) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        acc = acc.wrapping_add(u32::from(u16::from_be_bytes([c[0], c[1]])));
    }
    if let [last] = chunks.remainder() {
        acc = acc.wrapping_add(u32::from(*last) << 8);
    }
    acc
}

fn fold(mut acc: u32) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// The Internet checksum (RFC 1071) of `data`: the value to store, and 0 when `data`
/// already contains a correct checksum field.
pub(crate) fn internet_checksum(data: &[u8]) -> u16 {
    !fold(sum16(data, 0))
}

/// The L4 span of a parsed frame: (L4 header offset, end of the L4 data, pseudo-header sum).
fn l4_span(frame: &[u8], p: &Parsed) -> Option<(usize, usize, u32)> {
    let l4_off = match p.l4 {
        L4::Tcp { off, .. } | L4::Udp { off, .. } => off,
        L4::None => return None,
    };
    let proto = match p.l4 {
        L4::Tcp { .. } => IPPROTO_TCP,
        _ => IPPROTO_UDP,
    };
    match p.l3 {
        L3::Ipv4 { off, .. } => {
            let end = (off + usize::from(be16(frame, off + 2))).min(frame.len());
            let len = end.checked_sub(l4_off)?;
            let mut acc = sum16(&frame[off + 12..off + 20], 0);
            acc = acc.wrapping_add(u32::from(proto) + len as u32);
            Some((l4_off, end, acc))
        }
        L3::Ipv6 { off, .. } => {
            let end = (off + 40 + usize::from(be16(frame, off + 4))).min(frame.len());
            let len = end.checked_sub(l4_off)?;
            let mut acc = sum16(&frame[off + 8..off + 40], 0);
            acc = acc.wrapping_add(u32::from(proto) + len as u32);
            Some((l4_off, end, acc))
        }
        L3::None => None,
    }
}

/// Offset of the checksum field inside an L4 header.
fn l4_csum_field(l4: L4) -> usize {
    match l4 {
        L4::Tcp { .. } => 16,
        _ => 6,
    }
}

/// Checksum offload on send (`cs_flags` of the Ethernet segment): with `l3`, the IPv4
/// header checksum; with `l4`, the TCP or UDP checksum (over IPv4 or IPv6) is computed and
/// stored in the frame, as the NIC does. Frames that are not IP, or not TCP/UDP for `l4`,
/// are left alone.
pub(crate) fn fill_checksums(frame: &mut [u8], l3: bool, l4: bool) {
    let Some(p) = parse(frame) else { return };
    if l3 {
        if let L3::Ipv4 { off, ihl, .. } = p.l3 {
            frame[off + 10] = 0;
            frame[off + 11] = 0;
            let c = internet_checksum(&frame[off..off + ihl]);
            frame[off + 10..off + 12].copy_from_slice(&c.to_be_bytes());
        }
    }
    if l4 {
        if let Some((l4_off, end, pseudo)) = l4_span(frame, &p) {
            let f = l4_off + l4_csum_field(p.l4);
            if f + 2 > end {
                return;
            }
            frame[f] = 0;
            frame[f + 1] = 0;
            let mut c = !fold(sum16(&frame[l4_off..end], pseudo));
            if c == 0 && matches!(p.l4, L4::Udp { .. }) {
                // UDP sends a computed 0 as 0xffff (0 means "no checksum").
                c = 0xffff;
            }
            frame[f..f + 2].copy_from_slice(&c.to_be_bytes());
        }
    }
}

/// Receive-side verification: (L3 ok, L4 ok) as the CQE's `hds_ip_ext` reports them. An
/// IPv6 header has no checksum (ok); a UDP checksum of 0 over IPv4 means none (ok).
pub(crate) fn verify_checksums(frame: &[u8], p: &Parsed) -> (bool, bool) {
    let l3 = match p.l3 {
        L3::Ipv4 { off, ihl, .. } => internet_checksum(&frame[off..off + ihl]) == 0,
        L3::Ipv6 { .. } => true,
        L3::None => false,
    };
    let l4 = match l4_span(frame, p) {
        Some((l4_off, end, pseudo)) => {
            let f = l4_off + l4_csum_field(p.l4);
            let none = matches!(p.l4, L4::Udp { .. })
                && matches!(p.l3, L3::Ipv4 { .. })
                && frame.get(f..f + 2) == Some(&[0, 0]);
            none || fold(sum16(&frame[l4_off..end], pseudo)) == 0xffff
        }
        None => false,
    };
    (l3, l4)
}

/// `l4_hdr_type_etc` and `hds_ip_ext` of a receive CQE for `p` (PRM "Completion Queue
/// Entry Format": L4 type in bits 6:4 (1 TCP, 2 UDP, 3 TCP ACK without data, 4 TCP ACK with
/// data), L3 type in bits 3:2 (1 IPv6, 2 IPv4); L2/L3/L4 ok in bits 0/1/2 of `hds_ip_ext`).
pub(crate) fn cqe_flags(frame: &[u8], p: &Parsed) -> (u8, u8) {
    let l3t = match p.l3 {
        L3::Ipv6 { .. } => 1,
        L3::Ipv4 { .. } => 2,
        L3::None => 0,
    };
    let l4t = match p.l4 {
        L4::None => 0,
        L4::Udp { .. } => 2,
        L4::Tcp { ack: false, .. } => 1,
        L4::Tcp {
            ack: true,
            data: false,
            ..
        } => 3,
        L4::Tcp { .. } => 4,
    };
    let (l3ok, l4ok) = verify_checksums(frame, p);
    let ext = 1 | (u8::from(l3ok && l3t != 0) << 1) | (u8::from(l4ok && l4t != 0) << 2);
    ((l4t << 4) | (l3t << 2), ext)
}

/// Whether a MAC is a group (multicast or broadcast) address.
pub(crate) fn is_group(mac: &[u8; 6]) -> bool {
    mac[0] & 1 != 0
}

// ---------------------------------------------------------------------------------------
// Flow steering

/// One match of a rule (`ib_uverbs_flow_spec_*`, value and mask).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Spec {
    /// Ethernet: destination and source MAC, EtherType, VLAN TCI.
    Eth {
        dmac: [[u8; 6]; 2],
        smac: [[u8; 6]; 2],
        ethertype: [u16; 2],
        vlan: [u16; 2],
    },
    /// IPv4: addresses, protocol, TOS, TTL.
    Ipv4 {
        src: [[u8; 4]; 2],
        dst: [[u8; 4]; 2],
        proto: [u8; 2],
        tos: [u8; 2],
        ttl: [u8; 2],
    },
    /// IPv6: addresses, next header, traffic class, hop limit, flow label.
    Ipv6 {
        src: [[u8; 16]; 2],
        dst: [[u8; 16]; 2],
        next_hdr: [u8; 2],
        tclass: [u8; 2],
        hop_limit: [u8; 2],
        flow_label: [u32; 2],
    },
    /// TCP ports (`[value, mask]`, destination then source).
    Tcp { dport: [u16; 2], sport: [u16; 2] },
    /// UDP ports.
    Udp { dport: [u16; 2], sport: [u16; 2] },
}

fn m<const N: usize>(have: &[u8; N], want: &[[u8; N]; 2]) -> bool {
    (0..N).all(|i| have[i] & want[1][i] == want[0][i] & want[1][i])
}

fn m16(have: u16, want: [u16; 2]) -> bool {
    have & want[1] == want[0] & want[1]
}

fn m8(have: u8, want: [u8; 2]) -> bool {
    have & want[1] == want[0] & want[1]
}

impl Spec {
    /// Whether a frame with headers `p` matches this spec. A spec of a layer the frame
    /// lacks does not match (an IPv4 spec needs an IPv4 frame, a UDP spec a UDP header); a
    /// VLAN match with a non-zero mask needs a tagged frame.
    pub(crate) fn matches(&self, p: &Parsed) -> bool {
        match *self {
            Spec::Eth {
                dmac,
                smac,
                ethertype,
                vlan,
            } => {
                let tag_ok = match p.vlan {
                    Some(t) => m16(t, vlan),
                    None => vlan[1] == 0,
                };
                m(&p.dmac, &dmac) && m(&p.smac, &smac) && m16(p.ethertype, ethertype) && tag_ok
            }
            Spec::Ipv4 {
                src,
                dst,
                proto,
                tos,
                ttl,
            } => match p.l3 {
                L3::Ipv4 {
                    src: s,
                    dst: d,
                    proto: pr,
                    tos: t,
                    ttl: l,
                    ..
                } => m(&s, &src) && m(&d, &dst) && m8(pr, proto) && m8(t, tos) && m8(l, ttl),
                _ => false,
            },
            Spec::Ipv6 {
                src,
                dst,
                next_hdr,
                tclass,
                hop_limit,
                flow_label,
            } => match p.l3 {
                L3::Ipv6 {
                    src: s,
                    dst: d,
                    next_hdr: n,
                    tclass: t,
                    hop_limit: h,
                    flow_label: f,
                    ..
                } => {
                    m(&s, &src)
                        && m(&d, &dst)
                        && m8(n, next_hdr)
                        && m8(t, tclass)
                        && m8(h, hop_limit)
                        && f & flow_label[1] == flow_label[0] & flow_label[1]
                }
                _ => false,
            },
            Spec::Tcp { dport, sport } => match p.l4 {
                L4::Tcp {
                    sport: s, dport: d, ..
                } => m16(d, dport) && m16(s, sport),
                _ => false,
            },
            Spec::Udp { dport, sport } => match p.l4 {
                L4::Udp {
                    sport: s, dport: d, ..
                } => m16(d, dport) && m16(s, sport),
                _ => false,
            },
        }
    }
}

/// Which frames a rule is for (`ib_uverbs_flow_attr::type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RuleKind {
    /// Frames its specs match.
    Normal,
    /// Every frame no normal rule takes.
    AllDefault,
    /// Every group-addressed frame no normal rule takes.
    McDefault,
}

/// One rule of the port's steering table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Rule {
    /// The flow's number (unique per HCA).
    pub(crate) id: u32,
    /// The context that created it (rules die with it).
    pub(crate) ctx: u64,
    /// Destination QP (unused for a drop rule).
    pub(crate) qpn: u32,
    /// Lower is more important.
    pub(crate) priority: u16,
    pub(crate) kind: RuleKind,
    /// Drop what the rule matches (and count it).
    pub(crate) drop: bool,
    pub(crate) specs: Vec<Spec>,
}

/// What the steering table does with a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// To this QP, by the rule with this id.
    Qp { qpn: u32, rule: u32 },
    /// A drop rule took it.
    Drop { rule: u32 },
    /// No rule matched: counted (`rx_steer_missed`) and discarded, as the NIC discards a
    /// frame that misses every table entry.
    Miss,
}

/// The port's steering table: rules in the order they are tried (priority, then age).
#[derive(Clone, Debug, Default)]
pub(crate) struct Table {
    rules: Vec<Rule>,
}

impl Table {
    /// Add a rule; among rules of equal priority the older is tried first.
    pub(crate) fn insert(&mut self, r: Rule) {
        let at = self
            .rules
            .iter()
            .position(|x| (x.kind_rank(), x.priority) > (r.kind_rank(), r.priority))
            .unwrap_or(self.rules.len());
        self.rules.insert(at, r);
    }

    /// Remove the rule `id`; false if there is none.
    pub(crate) fn remove(&mut self, id: u32) -> bool {
        let before = self.rules.len();
        self.rules.retain(|r| r.id != id);
        self.rules.len() != before
    }

    /// Remove every rule `keep` refuses.
    pub(crate) fn retain(&mut self, keep: impl FnMut(&Rule) -> bool) {
        self.rules.retain(keep);
    }

    /// Whether a rule steers to QP `qpn`.
    pub(crate) fn targets(&self, qpn: u32) -> bool {
        self.rules.iter().any(|r| !r.drop && r.qpn == qpn)
    }

    /// The rules, in the order they are tried.
    #[cfg(test)]
    pub(crate) fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// The verdict for a frame with headers `p`: the first rule (highest priority, then
    /// oldest) whose specs all match; then the multicast default rules for a group
    /// address, then the catch-all ones.
    pub(crate) fn steer(&self, p: &Parsed) -> Verdict {
        for r in &self.rules {
            let hit = match r.kind {
                RuleKind::Normal => r.specs.iter().all(|s| s.matches(p)),
                RuleKind::McDefault => is_group(&p.dmac),
                RuleKind::AllDefault => true,
            };
            if hit {
                return if r.drop {
                    Verdict::Drop { rule: r.id }
                } else {
                    Verdict::Qp {
                        qpn: r.qpn,
                        rule: r.id,
                    }
                };
            }
        }
        Verdict::Miss
    }
}

impl Rule {
    fn kind_rank(&self) -> u8 {
        match self.kind {
            RuleKind::Normal => 0,
            RuleKind::McDefault => 1,
            RuleKind::AllDefault => 2,
        }
    }
}

/// How many header bytes the device needs inline in a raw send WQE's Ethernet segment (the
/// ucontext's `eth_min_inline`, the minimum inline mode + 1). `None`: ConnectX-5 and later,
/// the device reads the whole frame from the data segments; `L2`: ConnectX-4 Lx style, the
/// Ethernet header with one VLAN tag (18 bytes, libmlx5's `MLX5_ETH_L2_INLINE_HEADER_SIZE`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EthMinInline {
    /// No header bytes inline (`MLX5_USER_INLINE_MODE_NONE`).
    #[default]
    None,
    /// The L2 header inline (`MLX5_USER_INLINE_MODE_L2`).
    L2,
}

impl EthMinInline {
    /// The ucontext's `eth_min_inline` on an Ethernet port (`MLX5_USER_INLINE_MODE_*`).
    pub(crate) fn ucontext_value(self) -> u8 {
        match self {
            EthMinInline::None => mlx5_ffi::mlx5::MLX5_USER_INLINE_MODE_NONE,
            EthMinInline::L2 => mlx5_ffi::mlx5::MLX5_USER_INLINE_MODE_L2,
        }
    }
}

/// The Ethernet state of one HCA's port.
#[derive(Debug, Default)]
pub(crate) struct Port {
    /// The steering table.
    pub(crate) table: Table,
    /// Next flow number.
    pub(crate) next_flow: u32,
    /// Between processes: the raw-frame socket of this node (`127.1.x.y:4792`).
    pub(crate) sock: Option<std::net::UdpSocket>,
    /// The TAP attachment, when the port is wired to a Linux interface.
    pub(crate) tap: Option<tap::Tap>,
    /// Frames steered to a QP that had no receive posted, in arrival order, waiting in
    /// the port's receive buffer (at most [`HELD_FRAMES`]): (QPN, frame).
    pub(crate) held: std::collections::VecDeque<(u32, Vec<u8>)>,
    /// Device time (ns) of the receive buffer's last progress: when its first frame was
    /// held, or a held frame was last placed. The device polls the waiting QPs' receive
    /// doorbell records more slowly the longer nothing moved (`device/raw.rs`
    /// `held_deadline`).
    pub(crate) held_since: u64,
    /// Packet pacing (`IB_QP_RATE_LIMIT`): per raw QP, the rate in kbit/s and the device
    /// time before which its next frame may not leave (`device/raw.rs`).
    pub(crate) pacing: std::collections::BTreeMap<u32, Pacing>,
}

/// A raw QP's packet pacing: frames leave no faster than `kbps`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Pacing {
    /// The rate limit, kbit/s (never 0: an unlimited QP has no entry).
    pub(crate) kbps: u32,
    /// Device time (ns) when the next frame may be sent.
    pub(crate) next_ns: u64,
}

/// The packet-pacing range the port offers (`mlx5_packet_pacing_caps`, kbit/s): 1 Mbit/s
/// to 100 Gbit/s, the port's own rate.
pub(crate) const PP_MIN_KBPS: u32 = 1_000;
/// See [`PP_MIN_KBPS`].
pub(crate) const PP_MAX_KBPS: u32 = 100_000_000;

/// How many frames the port's receive buffer holds for QPs without a posted receive
/// before it drops (and counts `out_of_buffer`).
pub(crate) const HELD_FRAMES: usize = 4096;

/// The UDP port raw Ethernet frames travel on between processes (one datagram per frame).
pub(crate) const RAW_PORT: u16 = 4792;

/// The last node number the fabric floods a group-addressed frame to (nodes 1..=this).
pub(crate) const FLOOD_NODES: u16 = 32;

/// Bind the raw-frame socket of node `lid` (`127.1.x.y:4792`, non-blocking); None if the
/// address is taken.
pub(crate) fn bind_raw(lid: u16) -> Option<std::net::UdpSocket> {
    let ip = crate::transport::node_ip(lid);
    let s = std::net::UdpSocket::bind(std::net::SocketAddrV4::new(ip.into(), RAW_PORT)).ok()?;
    s.set_nonblocking(true).ok()?;
    crate::set_rcvbuf(&s, 4 << 20);
    Some(s)
}

#[cfg(test)]
mod tests;
