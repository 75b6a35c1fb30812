//! The Ethernet (RoCE) port mode: link layer, GID table, MAC addresses, and the routing of
//! RoCE addresses (GIDs) to fabric nodes.
//!
//! What a RoCE port of mlx5_ib looks like, and what this module reproduces:
//! * the GID table is filled by the core's RoCE GID management from the addresses of the
//!   port's netdev: for every address one entry per GID type the port supports (RoCE v1,
//!   then RoCE v2). Index 0/1: the default link-local GID `fe80::` + the modified EUI-64 of
//!   the MAC; index 2/3: the IPv4-mapped `::ffff:a.b.c.d` of the netdev's IPv4 address.
//! * the node's MAC: the node GUID of an Ethernet ConnectX is its MAC with `03:00` (or
//!   `ff:fe`) inserted after the OUI, so the MAC here is the GUID without those two bytes.
//! * the netdev of the emulated port is the loopback interface, which carries the fabric
//!   addresses `127.1.x.y` (see [`crate::transport::node_ip`]).

/// GUID of node 0; node (LID) n has GUID `BASE_GUID + n`.
pub const BASE_GUID: u64 = 0x0002_c903_00ab_cd00;

/// Link layer of the emulated port ([`crate::EmuConfig::link_layer`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum LinkLayer {
    /// InfiniBand: LID-routed, one GID (link-local prefix + node GUID).
    #[default]
    InfiniBand,
    /// Ethernet (RoCE): GID-routed, LID 0, a GID table of RoCE v1/v2 entries.
    Ethernet,
}

/// Type of a GID table entry (`enum ib_uverbs_gid_type` numbering).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GidType {
    /// InfiniBand GID (0).
    Ib = 0,
    /// RoCE v1: GRH over Ethernet (1). sysfs calls it "IB/RoCE v1".
    RoceV1 = 1,
    /// RoCE v2: UDP/IP encapsulation (2). sysfs: "RoCE v2".
    RoceV2 = 2,
}

impl GidType {
    /// The string sysfs shows in `ports/N/gid_attrs/types/I`.
    pub fn sysfs_name(self) -> &'static str {
        match self {
            GidType::Ib | GidType::RoceV1 => "IB/RoCE v1",
            GidType::RoceV2 => "RoCE v2",
        }
    }
}

/// One valid entry of a port's GID table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GidEntry {
    /// Table index.
    pub index: u32,
    /// The GID, network order.
    pub gid: [u8; 16],
    /// Its type.
    pub gid_type: GidType,
    /// ifindex of the netdev the entry belongs to (0 on InfiniBand).
    pub ndev_ifindex: u32,
}

/// ifindex of the netdev of an emulated RoCE port: the loopback interface.
pub const NDEV_IFINDEX: u32 = 1;
/// Name of that netdev (sysfs `gid_attrs/ndevs/I`).
pub const NDEV_NAME: &str = "lo";
/// GID table length a ConnectX-5 RoCE port reports (`roce_address_table_size`).
pub const ROCE_GID_TBL_LEN: u32 = 255;

/// The MAC of a node with node GUID `guid`: the GUID without its bytes 3 and 4.
pub(crate) fn mac_of_guid(guid: u64) -> [u8; 6] {
    let g = guid.to_be_bytes();
    [g[0], g[1], g[2], g[5], g[6], g[7]]
}

/// `fe80::` + modified EUI-64 of `mac` (U/L bit flipped, `ff:fe` in the middle).
pub(crate) fn link_local_gid(mac: [u8; 6]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[0] = 0xfe;
    g[1] = 0x80;
    g[8] = mac[0] ^ 2;
    g[9] = mac[1];
    g[10] = mac[2];
    g[11] = 0xff;
    g[12] = 0xfe;
    g[13] = mac[3];
    g[14] = mac[4];
    g[15] = mac[5];
    g
}

/// The IPv4-mapped GID `::ffff:a.b.c.d`.
pub(crate) fn ipv4_mapped_gid(ip: [u8; 4]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&ip);
    g
}

/// The IPv4 address of an IPv4-mapped GID.
pub(crate) fn gid_ipv4(gid: &[u8; 16]) -> Option<[u8; 4]> {
    (gid[..10].iter().all(|&b| b == 0) && gid[10] == 0xff && gid[11] == 0xff).then(|| {
        let mut ip = [0u8; 4];
        ip.copy_from_slice(&gid[12..]);
        ip
    })
}

/// The MAC behind a link-local GID built from a modified EUI-64.
pub(crate) fn link_local_mac(gid: &[u8; 16]) -> Option<[u8; 6]> {
    (gid[0] == 0xfe
        && gid[1] & 0xc0 == 0x80
        && gid[2..8].iter().all(|&b| b == 0)
        && gid[11] == 0xff
        && gid[12] == 0xfe)
        .then(|| [gid[8] ^ 2, gid[9], gid[10], gid[13], gid[14], gid[15]])
}

/// The multicast MAC of a multicast GID (`ff..`): IPv4-mapped `01:00:5e` + 23 bits,
/// otherwise `33:33` + the low 32 bits.
fn multicast_mac(gid: &[u8; 16]) -> Option<[u8; 6]> {
    if let Some(ip) = gid_ipv4(gid) {
        return (ip[0] & 0xf0 == 0xe0).then_some([0x01, 0x00, 0x5e, ip[1] & 0x7f, ip[2], ip[3]]);
    }
    (gid[0] == 0xff).then_some([0x33, 0x33, gid[12], gid[13], gid[14], gid[15]])
}

/// The RoCE GID table of a node with `mac` and IPv4 address `ip`.
pub(crate) fn gid_table(mac: [u8; 6], ip: [u8; 4]) -> Vec<GidEntry> {
    let ll = link_local_gid(mac);
    let v4 = ipv4_mapped_gid(ip);
    [
        (ll, GidType::RoceV1),
        (ll, GidType::RoceV2),
        (v4, GidType::RoceV1),
        (v4, GidType::RoceV2),
    ]
    .iter()
    .enumerate()
    .map(|(i, &(gid, gid_type))| GidEntry {
        index: i as u32,
        gid,
        gid_type,
        ndev_ifindex: NDEV_IFINDEX,
    })
    .collect()
}

/// The fabric node (LID) a RoCE destination GID names: the node whose IPv4 address an
/// IPv4-mapped GID carries, or whose MAC a link-local GID encodes.
pub(crate) fn node_of_gid(gid: &[u8; 16]) -> Option<u16> {
    if let Some(ip) = gid_ipv4(gid) {
        let n = u16::from_be_bytes([ip[2], ip[3]]);
        return (ip[..2] == crate::transport::node_ip(n)[..2] && n != 0).then_some(n);
    }
    let mac = link_local_mac(gid)?;
    node_of_mac(mac)
}

/// The fabric node whose MAC is `mac`.
pub(crate) fn node_of_mac(mac: [u8; 6]) -> Option<u16> {
    (1..255u16).find(|&n| mac_of_guid(BASE_GUID + u64::from(n)) == mac)
}

/// Destination MAC for `dgid`, as the kernel resolves it for CREATE_AH and modify-QP on a
/// RoCE port: multicast GIDs map to multicast MACs, fabric nodes to their MACs. None: the
/// address does not resolve (`EHOSTUNREACH`).
pub(crate) fn resolve_dmac(dgid: &[u8; 16]) -> Option<[u8; 6]> {
    if let Some(m) = multicast_mac(dgid) {
        return Some(m);
    }
    if let Some(m) = link_local_mac(dgid) {
        return Some(m);
    }
    let n = node_of_gid(dgid)?;
    Some(mac_of_guid(BASE_GUID + u64::from(n)))
}

/// The IPv4 header of a RoCEv2 packet as the receiver's HCA writes it into the last 20
/// bytes of a UD receive's 40-byte GRH area: version 4, IHL 5, the TOS (traffic class),
/// total length, DF, TTL (hop limit), protocol UDP, a valid header checksum.
pub(crate) fn ipv4_header(
    src: [u8; 4],
    dst: [u8; 4],
    tos: u8,
    ttl: u8,
    udp_len: usize,
) -> [u8; 20] {
    let mut h = [0u8; 20];
    h[0] = 0x45;
    h[1] = tos;
    h[2..4].copy_from_slice(&((20 + udp_len) as u16).to_be_bytes());
    h[6] = 0x40;
    h[8] = ttl;
    h[9] = 17;
    h[12..16].copy_from_slice(&src);
    h[16..20].copy_from_slice(&dst);
    let sum = crate::transport::ipv4_checksum(&h[..20]);
    h[10..12].copy_from_slice(&sum.to_be_bytes());
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_round_trip() {
        let guid = BASE_GUID + 7;
        let mac = mac_of_guid(guid);
        assert_eq!(mac, [0x00, 0x02, 0xc9, 0xab, 0xcd, 7]);
        let ll = link_local_gid(mac);
        assert_eq!(ll[8], 0x02, "U/L bit flipped");
        assert_eq!(link_local_mac(&ll), Some(mac));
        assert_eq!(node_of_gid(&ll), Some(7));
        let v4 = ipv4_mapped_gid(crate::transport::node_ip(7));
        assert_eq!(node_of_gid(&v4), Some(7));
        assert_eq!(resolve_dmac(&v4), Some(mac));
        assert_eq!(node_of_gid(&ipv4_mapped_gid([10, 0, 0, 7])), None);
        assert_eq!(
            resolve_dmac(&ipv4_mapped_gid([224, 1, 2, 3])),
            Some([1, 0, 0x5e, 1, 2, 3])
        );
        let h = ipv4_header([1, 2, 3, 4], [5, 6, 7, 8], 0, 64, 100);
        let mut sum = 0u32;
        for i in (0..20).step_by(2) {
            sum += u32::from(u16::from_be_bytes([h[i], h[i + 1]]));
        }
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        assert_eq!(sum, 0xffff, "checksum verifies");
    }
}
