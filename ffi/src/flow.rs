//! Flow steering through ib_uverbs: the extended commands `CREATE_FLOW` / `DESTROY_FLOW`
//! (`ibv_create_flow`, `ibv_destroy_flow`) and the `ib_uverbs_flow_spec_*` structs of
//! `<rdma/ib_user_verbs.h>` that follow `ib_uverbs_flow_attr` in a CREATE_FLOW request.
//!
//! The spec type numbers and the flow attribute types are the kernel's `enum
//! ib_flow_spec_type` / `enum ib_flow_attr_type` (`<rdma/ib_verbs.h>`, not uapi), which
//! libibverbs repeats as `IBV_FLOW_SPEC_*` / `IBV_FLOW_ATTR_*` in `<infiniband/verbs.h>`.
//! `tests/header_check_flow.rs` proves every size, offset and constant here against the
//! installed headers.
//!
//! Integers are host order except the fields marked big-endian (MACs and IPv6 addresses are
//! raw bytes in network order, the `_be` fields hold network-order values).

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::cmd::Command;
use crate::uverbs::IB_USER_VERBS_CMD_THRESHOLD;

/// Extended command: create a flow steering rule.
pub const IB_USER_VERBS_EX_CMD_CREATE_FLOW: u32 = IB_USER_VERBS_CMD_THRESHOLD;
/// Extended command: destroy a flow steering rule.
pub const IB_USER_VERBS_EX_CMD_DESTROY_FLOW: u32 = IB_USER_VERBS_CMD_THRESHOLD + 1;

/// `IB_FLOW_SPEC_ETH`: Ethernet header match.
pub const IB_FLOW_SPEC_ETH: u32 = 0x20;
/// `IB_FLOW_SPEC_IB`: InfiniBand header match (not supported on an Ethernet port).
pub const IB_FLOW_SPEC_IB: u32 = 0x22;
/// `IB_FLOW_SPEC_IPV4`.
pub const IB_FLOW_SPEC_IPV4: u32 = 0x30;
/// `IB_FLOW_SPEC_IPV6`.
pub const IB_FLOW_SPEC_IPV6: u32 = 0x31;
/// `IB_FLOW_SPEC_TCP`.
pub const IB_FLOW_SPEC_TCP: u32 = 0x40;
/// `IB_FLOW_SPEC_UDP`.
pub const IB_FLOW_SPEC_UDP: u32 = 0x41;
/// `IB_FLOW_SPEC_INNER`: the spec matches the inner (tunnelled) headers.
pub const IB_FLOW_SPEC_INNER: u32 = 0x100;
/// `IB_FLOW_SPEC_ACTION_TAG`.
pub const IB_FLOW_SPEC_ACTION_TAG: u32 = 0x1000;
/// `IB_FLOW_SPEC_ACTION_DROP`: frames the rule matches are dropped.
pub const IB_FLOW_SPEC_ACTION_DROP: u32 = 0x1001;

/// `IB_FLOW_ATTR_NORMAL`: an ordinary rule.
pub const IB_FLOW_ATTR_NORMAL: u32 = 0;
/// `IB_FLOW_ATTR_ALL_DEFAULT`: every frame no other rule takes.
pub const IB_FLOW_ATTR_ALL_DEFAULT: u32 = 1;
/// `IB_FLOW_ATTR_MC_DEFAULT`: every multicast frame no other rule takes.
pub const IB_FLOW_ATTR_MC_DEFAULT: u32 = 2;
/// `IB_FLOW_ATTR_SNIFFER`: a copy of every frame.
pub const IB_FLOW_ATTR_SNIFFER: u32 = 3;
/// `IB_FLOW_ATTR_FLAGS_DONT_TRAP`: let the frame continue to lower-priority rules.
pub const IB_FLOW_ATTR_FLAGS_DONT_TRAP: u32 = 1 << 1;
/// `IB_FLOW_ATTR_FLAGS_EGRESS`.
pub const IB_FLOW_ATTR_FLAGS_EGRESS: u32 = 1 << 2;
/// `IB_FLOW_SPEC_SUPPORT_LAYERS`: at most this many specs per rule.
pub const IB_FLOW_SPEC_SUPPORT_LAYERS: u8 = 10;

/// `struct ib_uverbs_flow_spec_hdr` (8 B): type and size of the spec that follows.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsFlowSpecHdr {
    /// 0: `IB_FLOW_SPEC_*`.
    pub type_: u32,
    /// 4: size of the whole spec (this header included).
    pub size: u16,
    /// 6
    pub reserved: u16,
}
const _: () = assert!(size_of::<IbUverbsFlowSpecHdr>() == 8);

/// `struct ib_uverbs_flow_eth_filter` (16 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsFlowEthFilter {
    /// 0: destination MAC (network order bytes).
    pub dst_mac: [u8; 6],
    /// 6: source MAC.
    pub src_mac: [u8; 6],
    /// 12: EtherType (big-endian value).
    pub ether_type: [u8; 2],
    /// 14: VLAN TCI (big-endian value).
    pub vlan_tag: [u8; 2],
}
const _: () = assert!(size_of::<IbUverbsFlowEthFilter>() == 16);

/// `struct ib_uverbs_flow_spec_eth` (40 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsFlowSpecEth {
    /// 0
    pub hdr: IbUverbsFlowSpecHdr,
    /// 8
    pub val: IbUverbsFlowEthFilter,
    /// 24
    pub mask: IbUverbsFlowEthFilter,
}
const _: () = assert!(size_of::<IbUverbsFlowSpecEth>() == 40);

/// `struct ib_uverbs_flow_ipv4_filter` (12 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsFlowIpv4Filter {
    /// 0: source address (network order bytes).
    pub src_ip: [u8; 4],
    /// 4: destination address.
    pub dst_ip: [u8; 4],
    /// 8: IP protocol.
    pub proto: u8,
    /// 9
    pub tos: u8,
    /// 10
    pub ttl: u8,
    /// 11
    pub flags: u8,
}
const _: () = assert!(size_of::<IbUverbsFlowIpv4Filter>() == 12);

/// `struct ib_uverbs_flow_spec_ipv4` (32 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsFlowSpecIpv4 {
    /// 0
    pub hdr: IbUverbsFlowSpecHdr,
    /// 8
    pub val: IbUverbsFlowIpv4Filter,
    /// 20
    pub mask: IbUverbsFlowIpv4Filter,
}
const _: () = assert!(size_of::<IbUverbsFlowSpecIpv4>() == 32);

/// `struct ib_uverbs_flow_ipv6_filter` (40 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsFlowIpv6Filter {
    /// 0: source address (network order bytes).
    pub src_ip: [u8; 16],
    /// 16: destination address.
    pub dst_ip: [u8; 16],
    /// 32: flow label (big-endian value).
    pub flow_label: [u8; 4],
    /// 36
    pub next_hdr: u8,
    /// 37
    pub traffic_class: u8,
    /// 38
    pub hop_limit: u8,
    /// 39
    pub reserved: u8,
}
const _: () = assert!(size_of::<IbUverbsFlowIpv6Filter>() == 40);

/// `struct ib_uverbs_flow_spec_ipv6` (88 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsFlowSpecIpv6 {
    /// 0
    pub hdr: IbUverbsFlowSpecHdr,
    /// 8
    pub val: IbUverbsFlowIpv6Filter,
    /// 48
    pub mask: IbUverbsFlowIpv6Filter,
}
const _: () = assert!(size_of::<IbUverbsFlowSpecIpv6>() == 88);

/// `struct ib_uverbs_flow_tcp_udp_filter` (4 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsFlowTcpUdpFilter {
    /// 0: destination port (big-endian value).
    pub dst_port: [u8; 2],
    /// 2: source port (big-endian value).
    pub src_port: [u8; 2],
}
const _: () = assert!(size_of::<IbUverbsFlowTcpUdpFilter>() == 4);

/// `struct ib_uverbs_flow_spec_tcp_udp` (16 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsFlowSpecTcpUdp {
    /// 0
    pub hdr: IbUverbsFlowSpecHdr,
    /// 8
    pub val: IbUverbsFlowTcpUdpFilter,
    /// 12
    pub mask: IbUverbsFlowTcpUdpFilter,
}
const _: () = assert!(size_of::<IbUverbsFlowSpecTcpUdp>() == 16);

/// `struct ib_uverbs_flow_spec_action_drop` (8 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsFlowSpecActionDrop {
    /// 0
    pub hdr: IbUverbsFlowSpecHdr,
}
const _: () = assert!(size_of::<IbUverbsFlowSpecActionDrop>() == 8);

/// `struct ib_uverbs_flow_attr` (16 B); `num_of_specs` specs follow.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsFlowAttr {
    /// 0: `IB_FLOW_ATTR_*`.
    pub type_: u32,
    /// 4: bytes of the specs that follow (this struct excluded).
    pub size: u16,
    /// 6: lower is more important.
    pub priority: u16,
    /// 8
    pub num_of_specs: u8,
    /// 9: must be zero.
    pub reserved: [u8; 2],
    /// 11
    pub port: u8,
    /// 12: `IB_FLOW_ATTR_FLAGS_*`.
    pub flags: u32,
}
const _: () = assert!(size_of::<IbUverbsFlowAttr>() == 16);

/// `struct ib_uverbs_create_flow` (24 B): the core request; the specs follow it.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsCreateFlow {
    /// 0: must be zero.
    pub comp_mask: u32,
    /// 4: the QP the rule steers to.
    pub qp_handle: u32,
    /// 8
    pub flow_attr: IbUverbsFlowAttr,
}
const _: () = assert!(size_of::<IbUverbsCreateFlow>() == 24);

/// `struct ib_uverbs_create_flow_resp` (8 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsCreateFlowResp {
    /// 0
    pub comp_mask: u32,
    /// 4: the rule's handle.
    pub flow_handle: u32,
}
const _: () = assert!(size_of::<IbUverbsCreateFlowResp>() == 8);

/// `struct ib_uverbs_destroy_flow` (8 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsDestroyFlow {
    /// 0: must be zero.
    pub comp_mask: u32,
    /// 4
    pub flow_handle: u32,
}
const _: () = assert!(size_of::<IbUverbsDestroyFlow>() == 8);

/// Command marker: extended CREATE_FLOW.
#[derive(Debug, Clone, Copy)]
pub struct ExCreateFlow;
impl Command for ExCreateFlow {
    const ID: u32 = IB_USER_VERBS_EX_CMD_CREATE_FLOW;
    const NAME: &'static str = "EX_CREATE_FLOW";
    const EXTENDED: bool = true;
    const RESPONSE_PTR: bool = false;
    type Req = IbUverbsCreateFlow;
    type Resp = IbUverbsCreateFlowResp;
    type DrvReq = ();
    type DrvResp = ();
}

/// Command marker: extended DESTROY_FLOW.
#[derive(Debug, Clone, Copy)]
pub struct ExDestroyFlow;
impl Command for ExDestroyFlow {
    const ID: u32 = IB_USER_VERBS_EX_CMD_DESTROY_FLOW;
    const NAME: &'static str = "EX_DESTROY_FLOW";
    const EXTENDED: bool = true;
    const RESPONSE_PTR: bool = false;
    type Req = IbUverbsDestroyFlow;
    type Resp = ();
    type DrvReq = ();
    type DrvResp = ();
}
