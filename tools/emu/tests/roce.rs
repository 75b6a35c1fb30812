//! The Ethernet (RoCE) port mode: what the kernel side reports (QUERY_PORT, the GID table,
//! CREATE_AH's destination MAC, the GRH requirement of modify-QP) and what the device does
//! (GID routing, RoCE address vectors, the IPv4 header in a UD receive's GRH area and the
//! CQE's header-type bits). The InfiniBand default is checked to be unchanged.

mod common;

use common::*;
use mlx5_emu::{EmuConfig, Emulator, Errno, GidType, HcaInfo, LinkLayer, RunMode};
use mlx5_ffi::ioctl::*;
use mlx5_ffi::uverbs::*;
use mlx5_hw::opcodes::SendOpcode;
use mlx5_hw::wqe::{DataSeg, DatagramSeg, FM_CE_SE_CQ_UPDATE, RaddrSeg};
use zerocopy::{FromBytes, IntoBytes};

const EINVAL: Errno = Errno(libc::EINVAL);
const SIG: u8 = FM_CE_SE_CQ_UPDATE;

/// A stepped emulator with Ethernet (RoCE) ports, otherwise configured as `cfg`.
fn roce_emu_with(cfg: EmuConfig) -> Emulator {
    Emulator::new(EmuConfig {
        mode: RunMode::Stepped,
        link_layer: LinkLayer::Ethernet,
        ..cfg
    })
}

fn roce_emu(num_hcas: usize) -> Emulator {
    roce_emu_with(EmuConfig {
        num_hcas,
        ..EmuConfig::default()
    })
}

fn pattern(seed: u8, n: usize) -> Vec<u8> {
    (0..n).map(|i| seed.wrapping_add((i * 13) as u8)).collect()
}

fn dseg(len: u32, lkey: u32, addr: u64) -> Vec<u8> {
    DataSeg::new(len, lkey, addr).as_bytes().to_vec()
}

/// `::ffff:a.b.c.d`.
fn v4_gid(ip: [u8; 4]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&ip);
    g
}

/// QUERY_GID_TABLE over ioctl, room for 8 entries.
fn gid_table(ctx: &Ctx) -> Vec<IbUverbsGidEntry> {
    let mut entries = [IbUverbsGidEntry::default(); 8];
    let mut n = 0u64;
    let mut b = IoctlBuilder::new(UVERBS_OBJECT_DEVICE, UVERBS_METHOD_QUERY_GID_TABLE)
        .in_u64(UVERBS_ATTR_QUERY_GID_TABLE_ENTRY_SIZE, 32)
        .out_ptr(
            UVERBS_ATTR_QUERY_GID_TABLE_RESP_ENTRIES,
            entries.as_mut_bytes().as_mut_ptr() as u64,
            (32 * entries.len()) as u16,
        )
        .out_ptr(
            UVERBS_ATTR_QUERY_GID_TABLE_RESP_NUM_ENTRIES,
            (&raw mut n) as u64,
            8,
        )
        .build()
        .expect("build");
    ctx.dev.cmd_ioctl(&mut b).expect("QUERY_GID_TABLE");
    entries[..n as usize].to_vec()
}

/// CREATE_AH (write) with 16 bytes of driver response room; (core, driver) response.
fn create_ah(
    ctx: &Ctx,
    pd: u32,
    dgid: [u8; 16],
    sgid_index: u8,
    global: bool,
) -> Result<(Vec<u8>, Vec<u8>), Errno> {
    let c = IbUverbsCreateAh {
        pd_handle: pd,
        attr: IbUverbsAhAttr {
            grh: IbUverbsGlobalRoute {
                dgid,
                sgid_index,
                hop_limit: 64,
                ..Default::default()
            },
            dlid: 0x33,
            is_global: u8::from(global),
            port_num: 1,
            ..Default::default()
        },
        ..Default::default()
    };
    write_cmd(
        &ctx.dev,
        IB_USER_VERBS_CMD_CREATE_AH,
        c.as_bytes(),
        &[],
        4,
        16,
    )
}

/// The RTR modify of a connected QP towards `dgid` (GRH with `sgid_index` when `global`).
fn rtr(qp: &Qp, dest_qpn: u32, dgid: [u8; 16], sgid_index: u8, global: bool) -> IbUverbsModifyQp {
    // The DLID is not used for routing on RoCE: a LID no node has.
    let mut m = rtr_modify(qp, 0x4321, dest_qpn, Knobs::default());
    m.dest.dgid = dgid;
    m.dest.sgid_index = sgid_index;
    m.dest.hop_limit = 64;
    m.dest.is_global = u8::from(global);
    m
}

/// RESET -> RTS of a connected QP towards `peer_qpn` on the node `peer`, by its
/// IPv4-mapped RoCE v2 GID (index 3).
fn connect_by_gid(ctx: &Ctx, qp: &Qp, peer: &HcaInfo, peer_qpn: u32) {
    to_init(ctx, qp, ALL_ACCESS);
    ctx.modify(&rtr(qp, peer_qpn, v4_gid(peer.ipv4), 3, true))
        .expect("RTR");
    to_rts(ctx, qp, Knobs::default());
}

/// RESET -> RTS of a UD QP (no address: the AV is in each WQE).
fn ud_up(ctx: &Ctx, qp: &Qp) {
    bring_up(ctx, qp, 0, 0, Knobs::default());
}

/// A connected (or UD) pair on a two-HCA RoCE emulator, addressed by the IPv4-mapped
/// RoCE v2 GID (index 3).
fn roce_pair(qp_type: u8) -> Pair {
    let p = pair_objects(roce_emu(2), qp_type, ALL_ACCESS, 64, 64, 16);
    let (ia, ib) = (p.emu.hca_info(0).unwrap(), p.emu.hca_info(1).unwrap());
    for (ctx, qp, peer, peer_qpn) in [(&p.a, &p.qa, &ib, p.qb.qpn), (&p.b, &p.qb, &ia, p.qa.qpn)] {
        if qp_type == UD {
            ud_up(ctx, qp);
        } else {
            connect_by_gid(ctx, qp, peer, peer_qpn);
        }
    }
    p
}

/// Write a signalled SEND with the address vector `av` and the data segment `data` on the
/// UD QP `qp` and ring its doorbell (the caller runs the emulator).
fn post_ud_send(ctx: &Ctx, qp: &mut Qp, av: &DatagramSeg, data: &[u8]) {
    let i = qp.build_send(
        SendOpcode::SEND,
        0,
        SIG,
        [0; 4],
        &[av.as_bytes(), data].concat(),
    );
    qp.ring(ctx, i, Ring::Doorbell);
}

/// Post a SEND with the address vector `av` and `len` bytes of `p.ma` on `p.qa`, run the
/// emulator; the raw CQEs on `p.cqb`.
fn ud_send(p: &mut Pair, av: &DatagramSeg, len: u32) -> Vec<[u8; 64]> {
    let (ba, la) = (p.ma.0.addr(), p.ma.1);
    p.send(
        SendOpcode::SEND,
        SIG,
        [0; 4],
        &[av.as_bytes(), &dseg(len, la, ba)].concat(),
    );
    drain_raw(&mut p.cqb)
}

/// Raw descriptor of every CQE in `cq`.
fn drain_raw(cq: &mut Cq) -> Vec<[u8; 64]> {
    let mut v = Vec::new();
    while let Some((d, _)) = cq.poll() {
        v.push(d);
    }
    v
}

fn flags_rqpn(d: &[u8; 64]) -> u32 {
    u32::from_be_bytes([d[0x18], d[0x19], d[0x1a], d[0x1b]])
}

#[test]
fn roce_port_reports_ethernet_and_a_roce_v1_v2_gid_table() {
    let emu = roce_emu(2);
    let ctx = Ctx::open(&emu, 1);
    let info: HcaInfo = emu.hca_info(1).unwrap();
    assert_eq!(info.link_layer, LinkLayer::Ethernet);
    // GET_CONTEXT: CREATE_AH takes driver data (so libmlx5 asks the kernel for the MAC).
    assert_eq!(ctx.resp.cmds_supp_uhw, 1 | 2);
    assert_eq!(ctx.resp.eth_min_inline, 1, "inline mode none, plus one");
    let pr = query_port(&ctx, 1).expect("QUERY_PORT");
    assert_eq!(pr.link_layer, 2, "IBV_LINK_LAYER_ETHERNET");
    assert_eq!((pr.lid, pr.sm_lid, pr.lmc), (0, 0, 0));
    assert_eq!(pr.state, 4);
    assert_eq!(pr.active_mtu, 3, "1500-byte netdev: IB MTU 1024");
    assert_eq!(pr.max_mtu, 5);
    assert_ne!(pr.port_cap_flags & (1 << 16), 0, "CM_SUP");
    assert_ne!(pr.port_cap_flags & (1 << 26), 0, "IP_BASED_GIDS");
    assert_eq!(pr.gid_tbl_len, 255);
    assert_eq!(pr.pkey_tbl_len, 1);
    // The ioctl QUERY_PORT says the same.
    assert_eq!(query_port_ex(&ctx).legacy_resp, pr);
    // MAC from the node GUID (OUI + the GUID's last three bytes).
    let g = info.node_guid.to_be_bytes();
    assert_eq!(info.mac, [g[0], g[1], g[2], g[5], g[6], g[7]]);
    assert_eq!(info.mac[0] & 1, 0, "unicast");
    let mut ll = [0u8; 16];
    ll[..2].copy_from_slice(&[0xfe, 0x80]);
    ll[8..].copy_from_slice(&[
        info.mac[0] ^ 2,
        info.mac[1],
        info.mac[2],
        0xff,
        0xfe,
        info.mac[3],
        info.mac[4],
        info.mac[5],
    ]);
    let v4 = v4_gid(info.ipv4);
    assert_eq!(info.ipv4, [127, 1, 0, info.lid as u8]);
    let t = gid_table(&ctx);
    let got: Vec<_> = t
        .iter()
        .map(|e| {
            (
                e.gid_index,
                e.gid.as_bytes().to_vec(),
                e.gid_type,
                e.port_num,
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (0, ll.to_vec(), 1, 1),
            (1, ll.to_vec(), 2, 1),
            (2, v4.to_vec(), 1, 1),
            (3, v4.to_vec(), 2, 1),
        ]
    );
    assert!(t.iter().all(|e| e.netdev_ifindex == mlx5_emu::NDEV_IFINDEX));
    assert_eq!(info.port_gid, ll, "GID 0 is the link-local one");
    let e3 = gid_entry(&ctx, 3).unwrap();
    assert_eq!((e3.gid.as_bytes(), e3.gid_type), (&v4[..], 2));
    assert_eq!(gid_entry(&ctx, 4).err(), Some(Errno(libc::ENODATA)));
    // The library view agrees with the kernel one.
    let lib: Vec<_> = info
        .gid_table()
        .iter()
        .map(|e| (e.index, e.gid_type))
        .collect();
    assert_eq!(
        lib,
        vec![
            (0, GidType::RoceV1),
            (1, GidType::RoceV2),
            (2, GidType::RoceV1),
            (3, GidType::RoceV2),
        ]
    );
    assert_eq!(GidType::RoceV2.sysfs_name(), "RoCE v2");
}

#[test]
fn create_ah_returns_the_destination_mac_and_needs_a_grh() {
    let emu = roce_emu(2);
    let ctx = Ctx::open(&emu, 0);
    let pd = ctx.alloc_pd();
    let peer = emu.hca_info(1).unwrap();
    let (core, drv) = create_ah(&ctx, pd, v4_gid(peer.ipv4), 3, true).expect("AH by IPv4 GID");
    assert_eq!(core.len(), 4);
    assert_eq!(
        u32::from_ne_bytes(drv[0..4].try_into().unwrap()),
        10,
        "response_length: up to the end of dmac"
    );
    assert_eq!(
        drv[4..10],
        peer.mac,
        "dmac of the node owning the IPv4 address"
    );
    // By the link-local GID: the MAC is in the GID.
    let (_, drv) = create_ah(&ctx, pd, peer.port_gid, 1, true).expect("AH by link-local");
    assert_eq!(drv[4..10], peer.mac);
    // RoCE needs a GRH, and a valid source GID index.
    assert_eq!(
        create_ah(&ctx, pd, v4_gid(peer.ipv4), 3, false).err(),
        Some(EINVAL)
    );
    assert_eq!(
        create_ah(&ctx, pd, v4_gid(peer.ipv4), 4, true).err(),
        Some(EINVAL)
    );
    // An address that does not resolve.
    assert_eq!(
        create_ah(&ctx, pd, v4_gid([10, 9, 8, 7]), 3, true).err(),
        Some(Errno(libc::EHOSTUNREACH))
    );
}

#[test]
fn modify_to_rtr_needs_a_grh_and_a_valid_sgid_index() {
    let emu = roce_emu(2);
    let mut ctx = Ctx::open(&emu, 0);
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(16, 64, -1);
    let qp = ctx.create_qp(pd, &cq, &cq, RC, 16, 16, None);
    to_init(&ctx, &qp, ALL_ACCESS);
    let peer = v4_gid(emu.hca_info(1).unwrap().ipv4);
    assert_eq!(ctx.modify(&rtr(&qp, 0x77, peer, 3, false)), Err(EINVAL));
    assert_eq!(ctx.modify(&rtr(&qp, 0x77, peer, 4, true)), Err(EINVAL));
    assert_eq!(qp_state(&ctx, &qp), 1, "still INIT");
    ctx.modify(&rtr(&qp, 0x77, peer, 3, true))
        .expect("RTR with GRH");
    let q = query_qp(&ctx, &qp);
    assert_eq!(q.qp_state, 2);
    assert_eq!(
        (
            q.dest.dgid,
            q.dest.sgid_index,
            q.dest.is_global,
            q.dest.hop_limit
        ),
        (peer, 3, 1, 64)
    );
    assert_eq!(q.dest.dlid, 0, "no DLID on RoCE (the modify passed 0x4321)");
}

#[test]
fn rc_send_write_read_routed_by_gid() {
    let mut p = roce_pair(RC);
    let (ba, la, bb, lb, rb) = (p.ma.0.addr(), p.ma.1, p.mb.0.addr(), p.mb.1, p.mb.2);
    // SEND.
    let data = pattern(1, 3000);
    p.ma.0.write(0, &data);
    p.qb.post_recv(&[(bb, 4096, lb)]);
    p.send(SendOpcode::SEND, SIG, [0; 4], &dseg(3000, la, ba));
    assert_eq!(p.mb.0.read(0, 3000), data, "SEND data (3 packets of 1024)");
    let ca = drain_raw(&mut p.cqa);
    let cb = drain_raw(&mut p.cqb);
    assert_eq!((ca.len(), cb.len()), (1, 1));
    let c = decode(&cb[0]);
    assert_eq!(
        (c.opcode, c.byte_cnt, c.src_qp, c.grh),
        (2, 3000, p.qa.qpn, false)
    );
    let f = flags_rqpn(&cb[0]);
    assert_eq!(
        (f >> 24) & 3,
        2,
        "RoCE packet type IPv4 (RoCE v2 from an IPv4 GID)"
    );
    assert_eq!((f >> 28) & 3, 0, "no GRH scattered on RC");
    assert_eq!(cb[0][0x16..0x18], [0, 0], "no SLID on Ethernet");
    // WRITE.
    let data = pattern(2, 5000);
    p.ma.0.write(0, &data);
    let raddr = RaddrSeg::new(bb + 8192, rb);
    p.send(
        SendOpcode::RDMA_WRITE,
        SIG,
        [0; 4],
        &[raddr.as_bytes(), &dseg(5000, la, ba)].concat(),
    );
    assert_eq!(p.mb.0.read(8192, 5000), data, "WRITE data");
    assert_eq!(decode(&drain_raw(&mut p.cqa)[0]).syndrome, 0);
    // READ back into a's buffer at 8192.
    let raddr = RaddrSeg::new(bb + 8192, rb);
    p.send(
        SendOpcode::RDMA_READ,
        SIG,
        [0; 4],
        &[raddr.as_bytes(), &dseg(5000, la, ba + 8192)].concat(),
    );
    let ca = drain_raw(&mut p.cqa);
    assert_eq!(ca.len(), 1);
    assert_eq!(decode(&ca[0]).opcode, 0, "READ completes");
    assert_eq!(p.ma.0.read(8192, 5000), data, "READ data");
    assert_eq!(p.emu.counters(0).packets_dropped, 0);
}

/// A RoCE address vector as libmlx5 builds it: no GRH bit, sgid index, rmac, rgid, UDP
/// source port in rlid, SL in bits 3:1.
fn roce_av(dqpn: u32, rgid: [u8; 16], rmac: [u8; 6], sgid_index: u8) -> DatagramSeg {
    let mut av = DatagramSeg::zeroed();
    av.set_qkey(0x1111_1111);
    av.set_dqpn(dqpn);
    av.rlid = mlx5_hw::types::Be16::new(0xc123);
    av.stat_rate_sl = 0;
    av.rmac = rmac;
    av.tclass = 0x28;
    av.hop_limit = 17;
    av.grh_gid_fl = mlx5_hw::types::Be32::new(u32::from(sgid_index) << 20);
    av.rgid = rgid;
    av
}

#[test]
fn ud_send_with_a_roce_av_puts_the_ipv4_header_in_the_grh_area() {
    let mut p = roce_pair(UD);
    let (ia, ib) = (p.emu.hca_info(0).unwrap(), p.emu.hca_info(1).unwrap());
    let (bb, lb) = (p.mb.0.addr(), p.mb.1);
    p.ma.0.write(0, &pattern(5, 100));
    p.mb.0.write(0, &[0xEE; 40]);
    for k in 0..3 {
        p.qb.post_recv(&[(bb + k * 1024, 40 + 512, lb)]);
    }
    // RoCE v2 from the IPv4-mapped source GID (index 3).
    let av = roce_av(p.qb.qpn, v4_gid(ib.ipv4), ib.mac, 3);
    let cb = ud_send(&mut p, &av, 100);
    assert_eq!(cb.len(), 1);
    let c = decode(&cb[0]);
    assert_eq!((c.opcode, c.byte_cnt, c.src_qp), (2, 140, p.qa.qpn));
    assert!(c.grh, "IBV_WC_GRH: bits 29:28 of flags_rqpn");
    let f = flags_rqpn(&cb[0]);
    assert_eq!((f >> 28) & 3, 1, "GRH area in the buffer");
    assert_eq!((f >> 24) & 3, 2, "RoCE L3 header type IPv4");
    assert_eq!((cb[0][0x1d] >> 2) & 3, 2, "l3_hdr_type IPv4");
    assert_eq!(cb[0][0x1d] & 1, 0, "no VLAN");
    let grh = p.mb.0.read(0, 40);
    assert_eq!(grh[..20], [0u8; 20], "first 20 bytes: no IPv6 header");
    let ip = &grh[20..];
    assert_eq!(ip[0], 0x45, "IPv4, IHL 5");
    assert_eq!(ip[1], 0x28, "TOS = traffic class");
    let udp_len = 8 + 12 + 8 + 100 + 4;
    assert_eq!(
        u16::from_be_bytes([ip[2], ip[3]]) as usize,
        20 + udp_len,
        "total length"
    );
    assert_eq!((ip[8], ip[9]), (17, 17), "TTL = hop limit, protocol UDP");
    assert_eq!(ip[12..16], ia.ipv4, "source address");
    assert_eq!(ip[16..20], ib.ipv4, "destination address");
    let mut sum = 0u32;
    for i in (0..20).step_by(2) {
        sum += u32::from(u16::from_be_bytes([ip[i], ip[i + 1]]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    assert_eq!(sum, 0xffff, "header checksum verifies");
    assert_eq!(p.mb.0.read(40, 100), pattern(5, 100));
    // RoCE v1 (index 0, link-local): a real GRH (next header 0x1B), packet type GRH.
    let av = roce_av(p.qb.qpn, ib.port_gid, ib.mac, 0);
    let cb = ud_send(&mut p, &av, 10);
    assert_eq!(cb.len(), 1);
    assert_eq!((flags_rqpn(&cb[0]) >> 24) & 0x33, 0x10, "GRH, type 0");
    let grh = p.mb.0.read(1024, 40);
    assert_eq!((grh[0] >> 4, grh[6], grh[7]), (6, 0x1B, 17));
    assert_eq!(grh[8..24], ia.port_gid);
    assert_eq!(grh[24..40], ib.port_gid);
    // RoCE v2 from the link-local GID (index 1): IPv6 header, next header UDP, type IPv6.
    let av = roce_av(p.qb.qpn, ib.port_gid, ib.mac, 1);
    let cb = ud_send(&mut p, &av, 10);
    assert_eq!(cb.len(), 1);
    assert_eq!((flags_rqpn(&cb[0]) >> 24) & 0x33, 0x11, "GRH, type IPv6");
    assert_eq!((cb[0][0x1d] >> 2) & 3, 1, "l3_hdr_type IPv6");
    let grh = p.mb.0.read(2048, 40);
    assert_eq!((grh[0] >> 4, grh[6]), (6, 17));
    // A wrong destination MAC: the frame never reaches the node.
    let dropped = p.emu.counters(0).packets_dropped;
    let av = roce_av(p.qb.qpn, v4_gid(ib.ipv4), ia.mac, 3);
    p.qb.post_recv(&[(bb + 3072, 40 + 512, lb)]);
    assert!(ud_send(&mut p, &av, 10).is_empty(), "nothing received");
    assert_eq!(p.emu.counters(0).packets_dropped, dropped + 1);
    assert_eq!(
        drain(&mut p.cqa).iter().filter(|c| c.syndrome == 0).count(),
        4,
        "every UD send completes locally"
    );
    // An invalid source GID index: local QP operation error.
    let av = roce_av(p.qb.qpn, v4_gid(ib.ipv4), ib.mac, 9);
    ud_send(&mut p, &av, 10);
    let ca = drain(&mut p.cqa);
    assert_eq!(ca.len(), 1);
    assert_eq!(ca[0].opcode, 13, "requester error CQE");
}

#[test]
fn infiniband_default_is_unchanged() {
    let emu = stepped(2);
    let ctx = Ctx::open(&emu, 0);
    let info = emu.hca_info(0).unwrap();
    assert_eq!(info.link_layer, LinkLayer::InfiniBand);
    // mlx5_ib advertises CREATE_AH driver data on every port type...
    assert_eq!(ctx.resp.cmds_supp_uhw, 1 | 2);
    assert_eq!(ctx.resp.eth_min_inline, 0, "not an Ethernet port");
    let pr = query_port(&ctx, 1).expect("QUERY_PORT");
    assert_eq!((pr.link_layer, pr.lid, pr.sm_lid), (1, info.lid, 1));
    assert_ne!(pr.lid, 0);
    assert_eq!(pr.gid_tbl_len, 1);
    assert_eq!(pr.port_cap_flags & (1 << 26), 0, "no IP-based GIDs");
    let t = gid_table(&ctx);
    assert_eq!(t.len(), 1);
    assert_eq!((t[0].gid_type, t[0].netdev_ifindex), (0, 0));
    assert_eq!(t[0].gid.as_bytes(), &info.port_gid);
    assert_eq!(&info.port_gid[8..], &info.node_guid.to_be_bytes());
    // ...but answers it only on Ethernet. An AH without a GRH is fine on InfiniBand.
    let pd = ctx.alloc_pd();
    let (_, drv) = create_ah(&ctx, pd, [0; 16], 0, false).expect("LID-routed AH");
    assert_eq!(drv, vec![0u8; 16]);
}

#[test]
fn pcap_capture_on_a_roce_port_carries_the_node_macs() {
    let path = std::env::temp_dir().join(format!("mlx5-emu-roce-{}.pcap", std::process::id()));
    let emu = roce_emu_with(EmuConfig {
        num_hcas: 2,
        pcap: Some(path.clone()),
        ..EmuConfig::default()
    });
    let (ia, ib) = (emu.hca_info(0).unwrap(), emu.hca_info(1).unwrap());
    let mut a = Ctx::open(&emu, 0);
    let pd = a.alloc_pd();
    let cq = a.create_cq(16, 64, -1);
    let mut qp = a.create_qp(pd, &cq, &cq, UD, 16, 16, None);
    ud_up(&a, &qp);
    let buf = Buf::new(4096);
    let (_, lkey, _) = a.reg_mr(pd, buf.addr(), 4096, ALL_ACCESS).unwrap();
    let av = roce_av(0x99, v4_gid(ib.ipv4), ib.mac, 3);
    post_ud_send(&a, &mut qp, &av, &dseg(16, lkey, buf.addr()));
    emu.run_until_idle();
    drop(emu);
    let cap = std::fs::read(&path).expect("capture");
    let _ = std::fs::remove_file(&path);
    // 24-byte global header, 16-byte record header, then the Ethernet frame.
    assert!(cap.len() > 40 + 14 + 20, "one frame captured");
    let frame = &cap[40..];
    assert_eq!(frame[0..6], ib.mac, "destination MAC");
    assert_eq!(frame[6..12], ia.mac, "source MAC");
    assert_eq!(frame[12..14], [0x08, 0x00], "IPv4");
    assert_eq!(frame[14 + 12..14 + 16], ia.ipv4);
    assert_eq!(frame[14 + 16..14 + 20], ib.ipv4);
}

/// One RoCE node on the UDP fabric (as one process of a pair).
fn udp_node() -> Emulator {
    roce_emu_with(EmuConfig {
        fabric: mlx5_emu::Fabric::Udp,
        ..EmuConfig::default()
    })
}

#[test]
fn rc_and_ud_between_two_roce_nodes_over_udp() {
    let (ea, eb) = (udp_node(), udp_node());
    let (ia, ib) = (ea.hca_info(0).unwrap(), eb.hca_info(0).unwrap());
    assert_ne!(ia.ipv4, ib.ipv4);
    let mut a = Ctx::open(&ea, 0);
    let mut b = Ctx::open(&eb, 0);
    let (pda, pdb) = (a.alloc_pd(), b.alloc_pd());
    let mut cqa = a.create_cq(16, 64, -1);
    let mut cqb = b.create_cq(16, 64, -1);
    let ma = Buf::new(8192);
    let mb = Buf::new(8192);
    let (_, la, _) = a.reg_mr(pda, ma.addr(), 8192, ALL_ACCESS).unwrap();
    let (_, lb, _) = b.reg_mr(pdb, mb.addr(), 8192, ALL_ACCESS).unwrap();
    // RC, connected by the IPv4-mapped RoCE v2 GIDs.
    let mut qa = a.create_qp(pda, &cqa, &cqa, RC, 16, 8, None);
    let mut qb = b.create_qp(pdb, &cqb, &cqb, RC, 16, 8, None);
    connect_by_gid(&a, &qa, &ib, qb.qpn);
    connect_by_gid(&b, &qb, &ia, qa.qpn);
    let data = pattern(9, 2500);
    ma.write(0, &data);
    qb.post_recv(&[(mb.addr(), 4096, lb)]);
    let i = qa.build_send(SendOpcode::SEND, 0, SIG, [0; 4], &dseg(2500, la, ma.addr()));
    qa.ring(&a, i, Ring::Doorbell);
    settle(&ea, &eb);
    assert_eq!(mb.read(0, 2500), data, "RC SEND over RoCEv2/UDP");
    let cb = drain_raw(&mut cqb);
    assert_eq!(cb.len(), 1);
    assert_eq!((flags_rqpn(&cb[0]) >> 24) & 3, 2, "IPv4");
    assert_eq!(drain(&mut cqa).len(), 1);
    // UD: the receiver writes the IPv4 header of the datagram it got.
    let mut ua = a.create_qp(pda, &cqa, &cqa, UD, 16, 8, None);
    let ub = b.create_qp(pdb, &cqb, &cqb, UD, 16, 8, None);
    ud_up(&a, &ua);
    ud_up(&b, &ub);
    let mut ub = ub;
    ub.post_recv(&[(mb.addr() + 4096, 40 + 256, lb)]);
    let av = roce_av(ub.qpn, v4_gid(ib.ipv4), ib.mac, 3);
    post_ud_send(&a, &mut ua, &av, &dseg(64, la, ma.addr()));
    settle(&ea, &eb);
    let cb = drain_raw(&mut cqb);
    assert_eq!(cb.len(), 1);
    let c = decode(&cb[0]);
    assert_eq!((c.byte_cnt, c.src_qp, c.grh), (40 + 64, ua.qpn, true));
    let grh = mb.read(4096, 40);
    assert_eq!(grh[..20], [0u8; 20]);
    assert_eq!((grh[20], grh[29]), (0x45, 17), "IPv4 / UDP");
    assert_eq!(grh[32..36], ia.ipv4, "source: the sending node");
    assert_eq!(grh[36..40], ib.ipv4);
    assert_eq!(mb.read(4096 + 40, 64), data[..64]);
}

#[test]
fn random_roce_address_vectors_never_break_the_device() {
    let mut p = roce_pair(UD);
    let ib = p.emu.hca_info(1).unwrap();
    let (ba, la, bb, lb) = (p.ma.0.addr(), p.ma.1, p.mb.0.addr(), p.mb.1);
    let mut rng = Rng(0x0BAD_CAFE_F00D_1234);
    let mut delivered = 0;
    for round in 0..2000u32 {
        let mut bytes = [0u8; 48];
        for b in bytes.iter_mut() {
            *b = rng.next() as u8;
        }
        let mut av = DatagramSeg::read_from_bytes(&bytes).unwrap();
        // Often aim at the real peer so that some of them arrive.
        if rng.below(2) == 0 {
            av.set_dqpn(p.qb.qpn);
            av.set_qkey(0x1111_1111);
            av.rmac = ib.mac;
            av.rgid = v4_gid(ib.ipv4);
            // A source GID index in 0..6 (0..4 valid).
            av.grh_gid_fl = mlx5_hw::types::Be32::new((rng.below(6) as u32) << 20);
        }
        p.qb.post_recv(&[(bb, 40 + 256, lb)]);
        let len = rng.below(300) as u32;
        let segs = [av.as_bytes(), &dseg(len, la, ba)].concat();
        p.send(SendOpcode::SEND, SIG, [0; 4], &segs);
        delivered += drain(&mut p.cqb).len();
        let ca = drain(&mut p.cqa);
        assert_eq!(ca.len(), 1, "round {round}: one completion per send");
        if ca[0].opcode == 13 {
            // A bad AV or length puts the QP in error: reset and bring it back.
            reset_qp(&p.a, &mut p.qa);
            ud_up(&p.a, &p.qa);
        }
    }
    // About half aim at the peer, 2/3 of those with a valid source GID, most with a length
    // that fits the receive buffer.
    assert!(
        delivered > 400,
        "valid datagrams still arrive ({delivered})"
    );
}
