//! RAW_PACKET QPs and flow steering in the emulated kernel: the checks `ib_uverbs` and
//! `mlx5_ib` make before a raw QP or a flow rule exists (`CAP_NET_RAW`, an Ethernet port),
//! the RAW_PACKET rows of the QP transition table, and the extended commands CREATE_FLOW
//! and DESTROY_FLOW, which fill the port's steering table (`eth::Table`).

use mlx5_ffi::cmd::Command;
use mlx5_ffi::flow::*;
use mlx5_ffi::uverbs::{IB_QP_RATE_LIMIT, qp_attr};
use zerocopy::FromBytes;

use super::{EBUSY, EINVAL, EOPNOTSUPP, EPERM, Req, hca_of, lookup, new_handle, qp_of};
use crate::abi::{Errno, has_cap};
use crate::eth::{Rule, RuleKind, Spec};
use crate::state::{Obj, World, qps, qpt};

/// `CAP_NET_RAW` (capability number 13).
const CAP_NET_RAW: u32 = 13;

/// The checks before a RAW_PACKET QP is created: `ib_uverbs` refuses it without
/// `CAP_NET_RAW` (`EPERM`); `mlx5_ib` builds one only on an Ethernet port (`EOPNOTSUPP` on
/// InfiniBand, as a device without the capability answers).
pub(super) fn check_raw_qp(w: &World, ctx: u64) -> Result<(), Errno> {
    if !w.hcas[hca_of(w, ctx)].info.is_roce() {
        return Err(EOPNOTSUPP);
    }
    if !has_cap(CAP_NET_RAW) {
        return Err(EPERM);
    }
    Ok(())
}

/// The RAW_PACKET rows of `ib_modify_qp_is_ok`: RESET->INIT needs the port; INIT->RTR and
/// RTR->RTS need nothing; RTS->RTS may change the rate limit.
pub(super) fn raw_transition(cur: u8, next: u8) -> Option<(u32, u32)> {
    use qp_attr::*;
    Some(match (cur, next) {
        (_, qps::RESET) | (_, qps::ERR) => (0, 0),
        (qps::RESET, qps::INIT) => (PORT, 0),
        (qps::INIT, qps::INIT) => (0, PORT),
        (qps::INIT, qps::RTR) => (0, 0),
        (qps::RTR, qps::RTS) => (0, IB_QP_RATE_LIMIT),
        (qps::RTS, qps::RTS) => (0, IB_QP_RATE_LIMIT),
        _ => return None,
    })
}

/// `mlx5_ib_query_device_resp.packet_pacing_caps` on an Ethernet port: RAW_PACKET QPs may
/// be rate limited from 1 Mbit/s to 100 Gbit/s (`eth::PP_MIN_KBPS`..=`eth::PP_MAX_KBPS`);
/// no burst control. Zero (not supported) on InfiniBand.
pub(super) fn packet_pacing_caps(ethernet: bool) -> mlx5_ffi::mlx5::Mlx5PacketPacingCaps {
    if !(ethernet && crate::caps::FEATURES.raw_packet) {
        return Default::default();
    }
    mlx5_ffi::mlx5::Mlx5PacketPacingCaps {
        qp_rate_limit_min: crate::eth::PP_MIN_KBPS,
        qp_rate_limit_max: crate::eth::PP_MAX_KBPS,
        supported_qpts: 1 << qpt::RAW_PACKET,
        ..Default::default()
    }
}

/// `IB_QP_RATE_LIMIT` of a MODIFY_QP that passed the transition table (only RAW_PACKET
/// RTR->RTS and RTS->RTS take it): 0 lifts the limit; a rate outside the packet-pacing
/// range is `EINVAL`, as mlx5_ib answers (`modify_raw_packet_qp_sq`). Without the mask bit
/// the value is ignored.
pub(super) fn set_rate_limit(
    w: &mut World,
    hca: usize,
    qpn: u32,
    mask: u32,
    kbps: u32,
) -> Result<(), Errno> {
    if mask & IB_QP_RATE_LIMIT == 0 {
        return Ok(());
    }
    let pacing = &mut w.hcas[hca].eth.pacing;
    if kbps == 0 {
        pacing.remove(&qpn);
        return Ok(());
    }
    if !(crate::eth::PP_MIN_KBPS..=crate::eth::PP_MAX_KBPS).contains(&kbps) {
        return Err(EINVAL);
    }
    let next_ns = pacing.get(&qpn).map_or(0, |p| p.next_ns);
    pacing.insert(qpn, crate::eth::Pacing { kbps, next_ns });
    Ok(())
}

/// Before a RAW_PACKET QP is destroyed: let the device execute the send WQEs whose doorbell
/// was rung before DESTROY_QP. A NIC fetches a rung WQE within a microsecond, long before
/// a process gets from its last post to the destroy; the emulated device runs on a thread
/// that a busy machine may not have scheduled yet, and without this a program's last
/// frames (perftest's last replies) would vanish. Paced QPs get their pacing slots, up to
/// [`DRAIN_LIMIT`] of device time.
pub(super) fn drain_before_destroy(w: &mut World, hca: usize, qpn: u32) {
    let pending = |w: &World| {
        w.hcas[hca]
            .qps
            .get(&qpn)
            .is_some_and(|q| q.qp_type == qpt::RAW_PACKET && q.state == qps::RTS)
    };
    if !pending(w) {
        return;
    }
    let start = std::time::Instant::now();
    loop {
        crate::device::step(w);
        let q = &w.hcas[hca].qps[&qpn];
        if q.state != qps::RTS || (q.sq_head as u16) == q.sq_rung || start.elapsed() > DRAIN_LIMIT {
            return;
        }
        std::hint::spin_loop();
    }
}

/// How long [`drain_before_destroy`] waits for paced frames.
const DRAIN_LIMIT: std::time::Duration = std::time::Duration::from_millis(200);

/// Whether `command` is one of the flow commands, whose request carries its specs past the
/// core struct (so the extended framing's "longer request must be zero past what the
/// kernel knows" rule does not apply to them: the kernel walks the specs instead).
pub(super) fn is_flow_command(command: u32) -> bool {
    let c = command & !mlx5_ffi::uverbs::IB_USER_VERBS_CMD_FLAG_EXTENDED;
    c == ExCreateFlow::ID || c == ExDestroyFlow::ID
}

/// `union ib_uverbs_flow_spec`'s size: the largest spec (IPv6).
const MAX_SPEC: usize = size_of::<IbUverbsFlowSpecIpv6>();

/// The filter of one spec, as the kernel copies it: `size - 8` bytes, value then mask
/// halves; a half longer than the struct must be zero past it (`EINVAL`), a shorter one
/// reads as zero.
fn halves<T: FromBytes + zerocopy::IntoBytes + zerocopy::Immutable>(
    body: &[u8],
) -> Result<(T, T), Errno> {
    if body.len() % 2 != 0 {
        return Err(EINVAL);
    }
    let half = body.len() / 2;
    let (v, m) = body.split_at(half);
    let n = size_of::<T>();
    if half > n && (v[n..].iter().any(|&b| b != 0) || m[n..].iter().any(|&b| b != 0)) {
        return Err(EINVAL);
    }
    Ok((
        mlx5_ffi::cmd::read_prefix_zero_fill(v),
        mlx5_ffi::cmd::read_prefix_zero_fill(m),
    ))
}

fn be16(b: [u8; 2]) -> u16 {
    u16::from_be_bytes(b)
}

/// Parse the specs of a CREATE_FLOW (`bytes`: `size` bytes after `ib_uverbs_flow_attr`)
/// into match specs and the drop action, as `ib_uverbs_ex_create_flow` walks them.
fn parse_specs(bytes: &[u8], num: u8) -> Result<(Vec<Spec>, bool), Errno> {
    let mut specs = Vec::new();
    let mut drop = false;
    let mut rest = bytes;
    let mut i = 0u8;
    while rest.len() >= size_of::<IbUverbsFlowSpecHdr>() && i < num {
        let (h, _) = IbUverbsFlowSpecHdr::read_from_prefix(rest).map_err(|_| EINVAL)?;
        let size = usize::from(h.size);
        if size < size_of::<IbUverbsFlowSpecHdr>() || size > rest.len() || h.reserved != 0 {
            return Err(EINVAL);
        }
        let body = &rest[8..size];
        if h.type_ & IB_FLOW_SPEC_INNER != 0 {
            // Tunnel (inner header) matching: the emulated port has no tunnel offloads.
            return Err(EOPNOTSUPP);
        }
        match h.type_ {
            IB_FLOW_SPEC_ETH => {
                let (v, m) = halves::<IbUverbsFlowEthFilter>(body)?;
                specs.push(Spec::Eth {
                    dmac: [v.dst_mac, m.dst_mac],
                    smac: [v.src_mac, m.src_mac],
                    ethertype: [be16(v.ether_type), be16(m.ether_type)],
                    vlan: [be16(v.vlan_tag), be16(m.vlan_tag)],
                });
            }
            IB_FLOW_SPEC_IPV4 => {
                let (v, m) = halves::<IbUverbsFlowIpv4Filter>(body)?;
                if m.flags != 0 {
                    // IP flags matching (fragments) is not offered.
                    return Err(EOPNOTSUPP);
                }
                specs.push(Spec::Ipv4 {
                    src: [v.src_ip, m.src_ip],
                    dst: [v.dst_ip, m.dst_ip],
                    proto: [v.proto, m.proto],
                    tos: [v.tos, m.tos],
                    ttl: [v.ttl, m.ttl],
                });
            }
            IB_FLOW_SPEC_IPV6 => {
                let (v, m) = halves::<IbUverbsFlowIpv6Filter>(body)?;
                specs.push(Spec::Ipv6 {
                    src: [v.src_ip, m.src_ip],
                    dst: [v.dst_ip, m.dst_ip],
                    next_hdr: [v.next_hdr, m.next_hdr],
                    tclass: [v.traffic_class, m.traffic_class],
                    hop_limit: [v.hop_limit, m.hop_limit],
                    flow_label: [
                        u32::from_be_bytes(v.flow_label),
                        u32::from_be_bytes(m.flow_label),
                    ],
                });
            }
            IB_FLOW_SPEC_TCP | IB_FLOW_SPEC_UDP => {
                let (v, m) = halves::<IbUverbsFlowTcpUdpFilter>(body)?;
                let (dport, sport) = (
                    [be16(v.dst_port), be16(m.dst_port)],
                    [be16(v.src_port), be16(m.src_port)],
                );
                specs.push(if h.type_ == IB_FLOW_SPEC_TCP {
                    Spec::Tcp { dport, sport }
                } else {
                    Spec::Udp { dport, sport }
                });
            }
            IB_FLOW_SPEC_ACTION_DROP => {
                if size != size_of::<IbUverbsFlowSpecActionDrop>() {
                    return Err(EINVAL);
                }
                drop = true;
            }
            // IB (on an Ethernet port), tags, counters, flow actions, tunnels: not offered.
            IB_FLOW_SPEC_IB | IB_FLOW_SPEC_ACTION_TAG => return Err(EOPNOTSUPP),
            _ => return Err(EINVAL),
        }
        rest = &rest[size..];
        i += 1;
    }
    if !rest.is_empty() || i != num {
        return Err(EINVAL);
    }
    Ok((specs, drop))
}

/// Extended CREATE_FLOW (`ib_uverbs_ex_create_flow`, then `mlx5_ib_create_flow`).
pub(super) fn create_flow(w: &mut World, ctx: u64, r: &Req) -> Result<(), Errno> {
    let c = r.core::<ExCreateFlow>();
    let a = c.flow_attr;
    if c.comp_mask != 0 {
        return Err(EINVAL);
    }
    if !has_cap(CAP_NET_RAW) {
        return Err(EPERM);
    }
    if a.flags & !(IB_FLOW_ATTR_FLAGS_DONT_TRAP | IB_FLOW_ATTR_FLAGS_EGRESS) != 0 {
        return Err(EINVAL);
    }
    if a.flags & IB_FLOW_ATTR_FLAGS_DONT_TRAP != 0
        && !matches!(a.type_, IB_FLOW_ATTR_ALL_DEFAULT | IB_FLOW_ATTR_MC_DEFAULT)
    {
        return Err(EINVAL);
    }
    if a.num_of_specs > IB_FLOW_SPEC_SUPPORT_LAYERS {
        return Err(EINVAL);
    }
    let size = usize::from(a.size);
    let specs_at = size_of::<IbUverbsCreateFlow>();
    if size > r.core.len().saturating_sub(specs_at)
        || size > usize::from(a.num_of_specs) * MAX_SPEC
        || a.reserved != [0, 0]
    {
        return Err(EINVAL);
    }
    let qpn = qp_of(w, ctx, c.qp_handle)?;
    let hca = hca_of(w, ctx);
    if w.hcas[hca].qps[&qpn].qp_type != qpt::RAW_PACKET {
        return Err(EINVAL);
    }
    let (specs, drop) = parse_specs(&r.core[specs_at..specs_at + size], a.num_of_specs)?;
    let kind = match a.type_ {
        IB_FLOW_ATTR_NORMAL => RuleKind::Normal,
        IB_FLOW_ATTR_ALL_DEFAULT => RuleKind::AllDefault,
        IB_FLOW_ATTR_MC_DEFAULT => RuleKind::McDefault,
        // Sniffer rules (a copy of every frame) and egress rules are not offered.
        IB_FLOW_ATTR_SNIFFER => return Err(EOPNOTSUPP),
        _ => return Err(EINVAL),
    };
    if a.flags != 0 {
        return Err(EOPNOTSUPP);
    }
    if a.port != 1 {
        return Err(EINVAL);
    }
    let port = &mut w.hcas[hca].eth;
    port.next_flow = port.next_flow.wrapping_add(1);
    let id = port.next_flow;
    let handle = super::next_handle(w, ctx);
    r.respond(&IbUverbsCreateFlowResp {
        comp_mask: 0,
        flow_handle: handle,
    })?;
    new_handle(w, ctx, Obj::Flow(id));
    w.hcas[hca].eth.table.insert(Rule {
        id,
        ctx,
        qpn,
        priority: a.priority,
        kind,
        drop,
        specs,
    });
    Ok(())
}

/// Extended DESTROY_FLOW.
pub(super) fn destroy_flow(w: &mut World, ctx: u64, r: &Req) -> Result<(), Errno> {
    let c = r.core::<ExDestroyFlow>();
    if c.comp_mask != 0 {
        return Err(EINVAL);
    }
    let Obj::Flow(id) = lookup(w, ctx, c.flow_handle)? else {
        return Err(EINVAL);
    };
    let hca = hca_of(w, ctx);
    w.hcas[hca].eth.table.remove(id);
    super::remove_handle(w, ctx, c.flow_handle);
    Ok(())
}

/// DESTROY_QP of a QP flow rules still steer to: `EBUSY` (each rule holds a use of its
/// QP, as the kernel's `qp->usecnt`).
pub(super) fn check_qp_unused(w: &World, hca: usize, qpn: u32) -> Result<(), Errno> {
    if w.hcas[hca].eth.table.targets(qpn) {
        return Err(EBUSY);
    }
    Ok(())
}

/// A closing context's rules go with it.
pub(super) fn close(w: &mut World, hca: usize, ctx: u64) {
    w.hcas[hca].eth.table.retain(|r| r.ctx != ctx);
}

/// The device capability flags raw Ethernet adds on an Ethernet port (QUERY_DEVICE's
/// `device_cap_flags`): IPv4/TCP/UDP checksum offload for raw QPs and managed flow
/// steering (mlx5_ib sets both on an Ethernet port whose HCA has them).
pub(super) fn raw_device_caps(ethernet: bool) -> u64 {
    use mlx5_ffi::uverbs::{IB_UVERBS_DEVICE_MANAGED_FLOW_STEERING, IB_UVERBS_DEVICE_RAW_IP_CSUM};
    if ethernet && crate::caps::FEATURES.raw_packet {
        IB_UVERBS_DEVICE_RAW_IP_CSUM | IB_UVERBS_DEVICE_MANAGED_FLOW_STEERING
    } else {
        0
    }
}

/// Extended QUERY_DEVICE `raw_packet_caps` on an Ethernet port: IP checksum offload for raw
/// QPs (no CVLAN stripping, no FCS scatter, no delay drop).
pub(super) fn raw_packet_caps(ethernet: bool) -> u32 {
    if ethernet && crate::caps::FEATURES.raw_packet {
        mlx5_ffi::uverbs::IB_UVERBS_RAW_PACKET_CAP_IP_CSUM
    } else {
        0
    }
}
