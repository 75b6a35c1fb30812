//! Flow steering: typed rules for the port's steering table, sent to the kernel as
//! `ibv_create_flow` sends them (the extended CREATE_FLOW command, `ib_uverbs_flow_attr`
//! followed by `ib_uverbs_flow_spec_*`; `mlx5_ffi::flow`).
//!
//! A [`FlowRule`] says which frames a RAW_PACKET QP receives: an Ethernet match
//! (destination MAC, unicast or multicast, source MAC, EtherType, VLAN id), an IPv4 or IPv6
//! match (addresses, protocol), a UDP or TCP match (ports), a priority (lower first), or
//! that the frames it matches are dropped. Every field left unset matches anything. A rule
//! lives as long as its [`Flow`]; dropping the [`Flow`] destroys it.
//!
//! ```
//! use mlx5::flow::{FlowRule, ipv4_multicast_mac};
//! use std::net::Ipv4Addr;
//! let group = Ipv4Addr::new(239, 1, 2, 3);
//! let rule = FlowRule::new()
//!     .dst_mac(ipv4_multicast_mac(group))
//!     .ipv4_dst(group)
//!     .udp_dst_port(31_001)
//!     .priority(1);
//! assert_eq!(rule.specs().len(), 3);
//! ```

use std::net::{Ipv4Addr, Ipv6Addr};

use mlx5_ffi::flow::*;
use zerocopy::IntoBytes;

use crate::context::Context;
use crate::error::{Error, Result};

/// The multicast MAC an IPv4 group is sent to (RFC 1112: `01:00:5e` and the group's low 23
/// bits).
pub fn ipv4_multicast_mac(group: Ipv4Addr) -> [u8; 6] {
    let o = group.octets();
    [0x01, 0x00, 0x5e, o[1] & 0x7f, o[2], o[3]]
}

/// The multicast MAC an IPv6 group is sent to (RFC 2464: `33:33` and its low 32 bits).
pub fn ipv6_multicast_mac(group: Ipv6Addr) -> [u8; 6] {
    let o = group.octets();
    [0x33, 0x33, o[12], o[13], o[14], o[15]]
}

/// One match of a [`FlowRule`] (value and mask pairs; a zero mask matches anything).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlowSpec {
    /// Ethernet header.
    Eth {
        /// Destination MAC and mask.
        dst_mac: ([u8; 6], [u8; 6]),
        /// Source MAC and mask.
        src_mac: ([u8; 6], [u8; 6]),
        /// EtherType and mask.
        ether_type: (u16, u16),
        /// VLAN TCI and mask (a non-zero mask matches tagged frames only).
        vlan_tag: (u16, u16),
    },
    /// IPv4 header.
    Ipv4 {
        /// Source address and mask.
        src: (Ipv4Addr, Ipv4Addr),
        /// Destination address and mask.
        dst: (Ipv4Addr, Ipv4Addr),
        /// Protocol and mask.
        proto: (u8, u8),
    },
    /// IPv6 header.
    Ipv6 {
        /// Source address and mask.
        src: (Ipv6Addr, Ipv6Addr),
        /// Destination address and mask.
        dst: (Ipv6Addr, Ipv6Addr),
        /// Next header and mask.
        next_hdr: (u8, u8),
    },
    /// UDP ports (destination, source), each with its mask.
    Udp {
        /// Destination port and mask.
        dst_port: (u16, u16),
        /// Source port and mask.
        src_port: (u16, u16),
    },
    /// TCP ports.
    Tcp {
        /// Destination port and mask.
        dst_port: (u16, u16),
        /// Source port and mask.
        src_port: (u16, u16),
    },
}

/// A steering rule: the frames it matches go to the QP it is attached to (or are dropped).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FlowRule {
    specs: Vec<FlowSpec>,
    priority: u16,
    drop: bool,
}

const ETH_ANY: FlowSpec = FlowSpec::Eth {
    dst_mac: ([0; 6], [0; 6]),
    src_mac: ([0; 6], [0; 6]),
    ether_type: (0, 0),
    vlan_tag: (0, 0),
};

impl FlowRule {
    /// A rule that matches every frame, priority 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// The matches, in the order they go to the kernel.
    pub fn specs(&self) -> &[FlowSpec] {
        &self.specs
    }

    /// The rule's priority (lower is tried first).
    pub fn get_priority(&self) -> u16 {
        self.priority
    }

    /// Whether the rule drops what it matches.
    pub fn is_drop(&self) -> bool {
        self.drop
    }

    fn eth(&mut self) -> &mut FlowSpec {
        if !matches!(self.specs.first(), Some(FlowSpec::Eth { .. })) {
            self.specs.insert(0, ETH_ANY);
        }
        &mut self.specs[0]
    }

    fn l3_index(&self) -> Option<usize> {
        self.specs
            .iter()
            .position(|s| matches!(s, FlowSpec::Ipv4 { .. } | FlowSpec::Ipv6 { .. }))
    }

    fn ipv4(&mut self) -> &mut FlowSpec {
        let i = match self.l3_index() {
            Some(i) if matches!(self.specs[i], FlowSpec::Ipv4 { .. }) => i,
            Some(i) => {
                self.specs[i] = FlowSpec::Ipv4 {
                    src: (Ipv4Addr::UNSPECIFIED, Ipv4Addr::UNSPECIFIED),
                    dst: (Ipv4Addr::UNSPECIFIED, Ipv4Addr::UNSPECIFIED),
                    proto: (0, 0),
                };
                i
            }
            None => {
                let at = usize::from(matches!(self.specs.first(), Some(FlowSpec::Eth { .. })));
                self.specs.insert(
                    at,
                    FlowSpec::Ipv4 {
                        src: (Ipv4Addr::UNSPECIFIED, Ipv4Addr::UNSPECIFIED),
                        dst: (Ipv4Addr::UNSPECIFIED, Ipv4Addr::UNSPECIFIED),
                        proto: (0, 0),
                    },
                );
                at
            }
        };
        &mut self.specs[i]
    }

    fn ipv6(&mut self) -> &mut FlowSpec {
        let blank = FlowSpec::Ipv6 {
            src: (Ipv6Addr::UNSPECIFIED, Ipv6Addr::UNSPECIFIED),
            dst: (Ipv6Addr::UNSPECIFIED, Ipv6Addr::UNSPECIFIED),
            next_hdr: (0, 0),
        };
        let i = match self.l3_index() {
            Some(i) if matches!(self.specs[i], FlowSpec::Ipv6 { .. }) => i,
            Some(i) => {
                self.specs[i] = blank;
                i
            }
            None => {
                let at = usize::from(matches!(self.specs.first(), Some(FlowSpec::Eth { .. })));
                self.specs.insert(at, blank);
                at
            }
        };
        &mut self.specs[i]
    }

    fn l4(&mut self, tcp: bool) -> &mut FlowSpec {
        let blank = if tcp {
            FlowSpec::Tcp {
                dst_port: (0, 0),
                src_port: (0, 0),
            }
        } else {
            FlowSpec::Udp {
                dst_port: (0, 0),
                src_port: (0, 0),
            }
        };
        let pos = self
            .specs
            .iter()
            .position(|s| matches!(s, FlowSpec::Udp { .. } | FlowSpec::Tcp { .. }));
        let i = match pos {
            Some(i) if matches!(self.specs[i], FlowSpec::Tcp { .. }) == tcp => i,
            Some(i) => {
                self.specs[i] = blank;
                i
            }
            None => {
                self.specs.push(blank);
                self.specs.len() - 1
            }
        };
        &mut self.specs[i]
    }

    /// Match the destination MAC (unicast, or a group address: [`ipv4_multicast_mac`]).
    pub fn dst_mac(mut self, mac: [u8; 6]) -> Self {
        if let FlowSpec::Eth { dst_mac, .. } = self.eth() {
            *dst_mac = (mac, [0xff; 6]);
        }
        self
    }

    /// Match the source MAC.
    pub fn src_mac(mut self, mac: [u8; 6]) -> Self {
        if let FlowSpec::Eth { src_mac, .. } = self.eth() {
            *src_mac = (mac, [0xff; 6]);
        }
        self
    }

    /// Match the EtherType (after a VLAN tag).
    pub fn ether_type(mut self, t: u16) -> Self {
        if let FlowSpec::Eth { ether_type, .. } = self.eth() {
            *ether_type = (t, 0xffff);
        }
        self
    }

    /// Match frames tagged with VLAN id `vid` (the low 12 bits of the TCI; any priority).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a VLAN id above 4095.
    pub fn vlan(mut self, vid: u16) -> Result<Self> {
        if vid > 0x0fff {
            return Err(Error::InvalidArgument {
                attr: "vlan id",
                reason: "above 4095 (a VLAN id is 12 bits)",
            });
        }
        if let FlowSpec::Eth { vlan_tag, .. } = self.eth() {
            *vlan_tag = (vid, 0x0fff);
        }
        Ok(self)
    }

    /// Match the IPv4 destination address (a unicast address or a multicast group).
    pub fn ipv4_dst(mut self, a: Ipv4Addr) -> Self {
        if let FlowSpec::Ipv4 { dst, .. } = self.ipv4() {
            *dst = (a, Ipv4Addr::BROADCAST);
        }
        self
    }

    /// Match the IPv4 source address.
    pub fn ipv4_src(mut self, a: Ipv4Addr) -> Self {
        if let FlowSpec::Ipv4 { src, .. } = self.ipv4() {
            *src = (a, Ipv4Addr::BROADCAST);
        }
        self
    }

    /// Match the IPv6 destination address.
    pub fn ipv6_dst(mut self, a: Ipv6Addr) -> Self {
        if let FlowSpec::Ipv6 { dst, .. } = self.ipv6() {
            *dst = (a, Ipv6Addr::from([0xff; 16]));
        }
        self
    }

    /// Match the IPv6 source address.
    pub fn ipv6_src(mut self, a: Ipv6Addr) -> Self {
        if let FlowSpec::Ipv6 { src, .. } = self.ipv6() {
            *src = (a, Ipv6Addr::from([0xff; 16]));
        }
        self
    }

    /// Match UDP destination port `p` (replaces a TCP match).
    pub fn udp_dst_port(mut self, p: u16) -> Self {
        if let FlowSpec::Udp { dst_port, .. } = self.l4(false) {
            *dst_port = (p, 0xffff);
        }
        self
    }

    /// Match UDP source port `p`.
    pub fn udp_src_port(mut self, p: u16) -> Self {
        if let FlowSpec::Udp { src_port, .. } = self.l4(false) {
            *src_port = (p, 0xffff);
        }
        self
    }

    /// Match TCP destination port `p` (replaces a UDP match).
    pub fn tcp_dst_port(mut self, p: u16) -> Self {
        if let FlowSpec::Tcp { dst_port, .. } = self.l4(true) {
            *dst_port = (p, 0xffff);
        }
        self
    }

    /// Match TCP source port `p`.
    pub fn tcp_src_port(mut self, p: u16) -> Self {
        if let FlowSpec::Tcp { src_port, .. } = self.l4(true) {
            *src_port = (p, 0xffff);
        }
        self
    }

    /// Set the priority (lower is tried first; among equals the older rule wins).
    pub fn priority(mut self, p: u16) -> Self {
        self.priority = p;
        self
    }

    /// Drop the frames this rule matches instead of delivering them.
    pub fn drop_frames(mut self) -> Self {
        self.drop = true;
        self
    }

    /// The CREATE_FLOW request core: `ib_uverbs_create_flow` for `qp_handle` followed by
    /// the specs (and the drop action), exactly as `ibv_create_flow` encodes them.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for more specs than the kernel accepts (10).
    pub fn encode(&self, qp_handle: u32) -> Result<Vec<u8>> {
        let n = self.specs.len() + usize::from(self.drop);
        if n > usize::from(IB_FLOW_SPEC_SUPPORT_LAYERS) {
            return Err(Error::InvalidArgument {
                attr: "flow specs",
                reason: "more than the 10 layers the kernel accepts",
            });
        }
        let mut specs = Vec::new();
        let hdr = |t: u32, size: usize| IbUverbsFlowSpecHdr {
            type_: t,
            size: size as u16,
            reserved: 0,
        };
        for s in &self.specs {
            match *s {
                FlowSpec::Eth {
                    dst_mac,
                    src_mac,
                    ether_type,
                    vlan_tag,
                } => {
                    let f = |i: usize| IbUverbsFlowEthFilter {
                        dst_mac: if i == 0 { dst_mac.0 } else { dst_mac.1 },
                        src_mac: if i == 0 { src_mac.0 } else { src_mac.1 },
                        ether_type: if i == 0 { ether_type.0 } else { ether_type.1 }.to_be_bytes(),
                        vlan_tag: if i == 0 { vlan_tag.0 } else { vlan_tag.1 }.to_be_bytes(),
                    };
                    let spec = IbUverbsFlowSpecEth {
                        hdr: hdr(IB_FLOW_SPEC_ETH, size_of::<IbUverbsFlowSpecEth>()),
                        val: f(0),
                        mask: f(1),
                    };
                    specs.extend_from_slice(spec.as_bytes());
                }
                FlowSpec::Ipv4 { src, dst, proto } => {
                    let f = |i: usize| IbUverbsFlowIpv4Filter {
                        src_ip: if i == 0 { src.0 } else { src.1 }.octets(),
                        dst_ip: if i == 0 { dst.0 } else { dst.1 }.octets(),
                        proto: if i == 0 { proto.0 } else { proto.1 },
                        ..Default::default()
                    };
                    let spec = IbUverbsFlowSpecIpv4 {
                        hdr: hdr(IB_FLOW_SPEC_IPV4, size_of::<IbUverbsFlowSpecIpv4>()),
                        val: f(0),
                        mask: f(1),
                    };
                    specs.extend_from_slice(spec.as_bytes());
                }
                FlowSpec::Ipv6 { src, dst, next_hdr } => {
                    let f = |i: usize| IbUverbsFlowIpv6Filter {
                        src_ip: if i == 0 { src.0 } else { src.1 }.octets(),
                        dst_ip: if i == 0 { dst.0 } else { dst.1 }.octets(),
                        next_hdr: if i == 0 { next_hdr.0 } else { next_hdr.1 },
                        ..Default::default()
                    };
                    let spec = IbUverbsFlowSpecIpv6 {
                        hdr: hdr(IB_FLOW_SPEC_IPV6, size_of::<IbUverbsFlowSpecIpv6>()),
                        val: f(0),
                        mask: f(1),
                    };
                    specs.extend_from_slice(spec.as_bytes());
                }
                FlowSpec::Udp { dst_port, src_port } | FlowSpec::Tcp { dst_port, src_port } => {
                    let t = if matches!(s, FlowSpec::Tcp { .. }) {
                        IB_FLOW_SPEC_TCP
                    } else {
                        IB_FLOW_SPEC_UDP
                    };
                    let f = |i: usize| IbUverbsFlowTcpUdpFilter {
                        dst_port: if i == 0 { dst_port.0 } else { dst_port.1 }.to_be_bytes(),
                        src_port: if i == 0 { src_port.0 } else { src_port.1 }.to_be_bytes(),
                    };
                    let spec = IbUverbsFlowSpecTcpUdp {
                        hdr: hdr(t, size_of::<IbUverbsFlowSpecTcpUdp>()),
                        val: f(0),
                        mask: f(1),
                    };
                    specs.extend_from_slice(spec.as_bytes());
                }
            }
        }
        if self.drop {
            let spec = IbUverbsFlowSpecActionDrop {
                hdr: hdr(
                    IB_FLOW_SPEC_ACTION_DROP,
                    size_of::<IbUverbsFlowSpecActionDrop>(),
                ),
            };
            specs.extend_from_slice(spec.as_bytes());
        }
        let core = IbUverbsCreateFlow {
            comp_mask: 0,
            qp_handle,
            flow_attr: IbUverbsFlowAttr {
                type_: IB_FLOW_ATTR_NORMAL,
                size: specs.len() as u16,
                priority: self.priority,
                num_of_specs: n as u8,
                reserved: [0; 2],
                port: 1,
                flags: 0,
            },
        };
        let mut out = core.as_bytes().to_vec();
        out.extend_from_slice(&specs);
        Ok(out)
    }
}

impl crate::qp::Qp {
    /// Install `rule` in the port's steering table: the frames it matches are delivered to
    /// this QP (a RAW_PACKET QP), or dropped for a drop rule. The rule lives as long as
    /// the returned [`Flow`].
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a rule of more than 10 specs; [`Error::Uverbs`] naming
    /// EX_CREATE_FLOW: `EPERM` without `CAP_NET_RAW`, `EINVAL` for a QP that is not
    /// RAW_PACKET, `EOPNOTSUPP` for matches the device does not offer.
    pub fn attach_flow(&self, rule: &FlowRule) -> Result<Flow> {
        let (ctx, handle) = self.flow_target();
        Flow::create(ctx, handle, rule)
    }
}

/// A steering rule installed in the device; destroyed on drop.
#[derive(Debug)]
pub struct Flow {
    ctx: Context,
    handle: u32,
}

impl Flow {
    /// Install `rule` for the QP whose uverbs handle is `qp_handle` in `ctx`.
    pub(crate) fn create(ctx: &Context, qp_handle: u32, rule: &FlowRule) -> Result<Flow> {
        let core = rule.encode(qp_handle)?;
        let handle = crate::uverbs::create_flow(ctx.surface(), &core)?;
        Ok(Flow {
            ctx: ctx.clone(),
            handle,
        })
    }

    /// The kernel's handle of the rule.
    pub fn handle(&self) -> u32 {
        self.handle
    }
}

impl Drop for Flow {
    fn drop(&mut self) {
        let _ = crate::uverbs::destroy_flow(self.ctx.surface(), self.handle);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multicast_macs_follow_the_rfcs() {
        assert_eq!(
            ipv4_multicast_mac(Ipv4Addr::new(239, 129, 2, 3)),
            [0x01, 0x00, 0x5e, 0x01, 0x02, 0x03]
        );
        assert_eq!(
            ipv6_multicast_mac("ff02::1:ff00:1234".parse().unwrap()),
            [0x33, 0x33, 0xff, 0x00, 0x12, 0x34]
        );
    }

    #[test]
    fn a_rule_encodes_as_ibv_create_flow_does() {
        let r = FlowRule::new()
            .udp_dst_port(0x1234)
            .ipv4_dst(Ipv4Addr::new(239, 1, 1, 1))
            .dst_mac([1, 0, 0x5e, 1, 1, 1])
            .vlan(7)
            .unwrap()
            .priority(3)
            .drop_frames();
        // Eth first, then IPv4, then UDP, whatever order the calls came in.
        assert!(matches!(r.specs()[0], FlowSpec::Eth { .. }));
        assert!(matches!(r.specs()[1], FlowSpec::Ipv4 { .. }));
        assert!(matches!(r.specs()[2], FlowSpec::Udp { .. }));
        let b = r.encode(9).unwrap();
        assert_eq!(b.len(), 24 + 40 + 32 + 16 + 8);
        assert_eq!(&b[4..8], &9u32.to_ne_bytes());
        assert_eq!(u16::from_ne_bytes([b[12], b[13]]), 40 + 32 + 16 + 8); // size
        assert_eq!(u16::from_ne_bytes([b[14], b[15]]), 3); // priority
        assert_eq!((b[16], b[19]), (4, 1)); // specs, port
        // Eth spec: type 0x20, size 40, dst MAC and its full mask, VLAN 7 / 0x0fff.
        assert_eq!(&b[24..30], &[0x20, 0, 0, 0, 40, 0]);
        assert_eq!(&b[32..38], &[1, 0, 0x5e, 1, 1, 1]);
        assert_eq!(&b[46..48], &[0, 7]);
        assert_eq!(&b[48..54], &[0xff; 6]);
        assert_eq!(&b[62..64], &[0x0f, 0xff]);
        // IPv4 dst at value offset 4, mask all ones.
        assert_eq!(&b[64..66], &[0x30, 0]);
        assert_eq!(&b[76..80], &[239, 1, 1, 1]);
        assert_eq!(&b[88..92], &[0xff; 4]);
        // UDP dst port, big-endian.
        assert_eq!(&b[96..98], &[0x41, 0]);
        assert_eq!(&b[104..106], &[0x12, 0x34]);
        // The drop action last.
        assert_eq!(&b[112..120], &[0x01, 0x10, 0, 0, 8, 0, 0, 0]);
        assert!(FlowRule::new().vlan(4096).is_err());
        let tcp = FlowRule::new().udp_dst_port(1).tcp_dst_port(2);
        assert_eq!(tcp.specs().len(), 1);
        assert!(matches!(
            tcp.specs()[0],
            FlowSpec::Tcp {
                dst_port: (2, 0xffff),
                ..
            }
        ));
    }
}
