//! The driver on a RoCE (Ethernet) port of the emulator: the port and its typed GID table,
//! connected QPs addressed by GID (and the refusal of a path without GRH), UD through an
//! address handle made by GID, and the address-vector bytes libmlx5 builds for RoCE v1 and
//! RoCE v2 source GIDs. (opcodes.rs runs all its RC/UC opcode scenarios on a RoCE port too.)

mod common;

use common::{EmuRig, PairOpts, QKEY, Rig, Side, pair, poll_n, side};
use mlx5::ah::{AvLink, ROCE_UDP_SPORT_MIN, build_av, roce_udp_sport};
use mlx5::ffi::ioctl::{IB_UVERBS_GID_TYPE_ROCE_V1, IB_UVERBS_GID_TYPE_ROCE_V2};
use mlx5::ffi::uverbs::IB_LINK_LAYER_ETHERNET;
use mlx5::{
    Access, Ah, AhAttr, Error, GlobalRoute, QpState, QpType, RecvWr, RemoteQp, SendFlags, SendWr,
    UdDest, WcFlags, WcOpcode, WcStatus, WorkCompletion, WrOp,
};
use mlx5_emu::HcaInfo;
use zerocopy::IntoBytes;

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed))
        .collect()
}

/// `::ffff:a.b.c.d`, written out here rather than taken from the emulator.
fn v4_gid(ip: [u8; 4]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&ip);
    g
}

fn info(rig: &EmuRig, side: usize) -> HcaInfo {
    rig.emu.hca_info(side).expect("emulated HCA")
}

/// Post one receive of `len` bytes at `off` of `b`'s buffer.
fn post_recv_at(b: &mut Side, wr_id: u64, off: u64, len: u32) {
    let rsge = [b.mr.sge(off, len)];
    b.qp.post_recv(&[RecvWr {
        wr_id,
        sg_list: &rsge,
    }])
    .unwrap();
}

/// Post `wr` on `a` and poll one completion on each side: `a`'s must be a successful SEND,
/// `b`'s a successful receive of `wr_id` with `byte_len` bytes from `a`'s QP (returned).
fn send_received(
    rig: &EmuRig,
    a: &mut Side,
    b: &mut Side,
    wr: SendWr<'_>,
    wr_id: u64,
    byte_len: u32,
) -> WorkCompletion {
    a.qp.post_send(&[wr]).unwrap();
    let s = poll_n(rig, &mut a.cq, 1);
    assert_eq!(
        (s[0].status, s[0].opcode),
        (WcStatus::SUCCESS, WcOpcode::SEND)
    );
    let r = poll_n(rig, &mut b.cq, 1);
    assert_eq!(
        (r[0].status, r[0].wr_id, r[0].byte_len, r[0].src_qp),
        (WcStatus::SUCCESS, wr_id, byte_len, a.qp.qpn())
    );
    r[0]
}

/// Index 3 of the emulated RoCE GID table: the IPv4-mapped RoCE v2 GID.
const V2_V4: u8 = 3;
/// Index 2: the same address as RoCE v1.
const V1_V4: u8 = 2;
/// Index 0: the link-local GID as RoCE v1.
const V1_LL: u8 = 0;

#[test]
fn port_is_ethernet_with_a_typed_gid_table() {
    let rig = EmuRig::roce();
    for s in 0..2 {
        let ctx = rig.open(s);
        let hca = info(&rig, s);
        let p = ctx.query_port(1).unwrap();
        assert!(p.is_roce());
        assert_eq!((p.link_layer, p.lid), (IB_LINK_LAYER_ETHERNET, 0));
        assert!(p.gid_tbl_len >= 4, "gid_tbl_len {}", p.gid_tbl_len);
        let e: Vec<_> = (0..4).map(|i| ctx.query_gid_entry(1, i).unwrap()).collect();
        // Link-local fe80:: + EUI-64 of the MAC (U/L bit flipped), as v1 then v2.
        let ll = e[0].gid;
        assert_eq!(ll[..8], [0xfe, 0x80, 0, 0, 0, 0, 0, 0]);
        assert_eq!(
            (ll[8], ll[9], ll[10], ll[11], ll[12]),
            (hca.mac[0] ^ 2, hca.mac[1], hca.mac[2], 0xff, 0xfe)
        );
        assert_eq!(ll[13..], hca.mac[3..]);
        assert_eq!(e[1].gid, ll);
        // The node's IPv4 address, mapped, as v1 then v2.
        assert_eq!(e[2].gid, v4_gid(hca.ipv4));
        assert_eq!(e[3].gid, v4_gid(hca.ipv4));
        let types: Vec<u32> = e.iter().map(|e| e.gid_type).collect();
        assert_eq!(
            types,
            [
                IB_UVERBS_GID_TYPE_ROCE_V1,
                IB_UVERBS_GID_TYPE_ROCE_V2,
                IB_UVERBS_GID_TYPE_ROCE_V1,
                IB_UVERBS_GID_TYPE_ROCE_V2
            ]
        );
        // The GID to connect with: RoCE v2, IPv4-mapped preferred.
        assert_eq!(
            ctx.find_gid(1).unwrap(),
            Some((u32::from(V2_V4), v4_gid(hca.ipv4)))
        );
        // Past the valid entries: an error, not a zero GID.
        assert!(ctx.query_gid_entry(1, 4).is_err());
    }
}

/// RC connected by GID: the kernel keeps the GRH of the path; SEND, WRITE, READ and an atomic
/// go through.
#[test]
fn rc_connected_by_gid_moves_data() {
    let rig = EmuRig::roce();
    let (mut a, mut b) = pair(&rig, PairOpts::new(QpType::Rc));
    let ib = info(&rig, 1);
    let (st, attr, _) = a.qp.query_attr().unwrap();
    assert_eq!(st, QpState::Rts);
    let g = attr.ah_attr.grh.expect("the path keeps its GRH");
    assert_eq!((g.dgid, g.sgid_index), (v4_gid(ib.ipv4), V2_V4));

    let data = pattern(3000, 3);
    a.buf.write(0, &data);
    post_recv_at(&mut b, 1, 4096, 4096);
    let sges = [a.mr.sge(0, 3000)];
    let wr = SendWr::send(2, &sges, SendFlags::SIGNALED);
    let r = send_received(&rig, &mut a, &mut b, wr, 1, 3000);
    assert!(!r.wc_flags.contains(WcFlags::GRH), "no GRH on RC");
    let mut got = vec![0u8; 3000];
    b.buf.read(4096, &mut got);
    assert_eq!(got, data);

    // WRITE 1000 bytes, READ them back elsewhere, then fetch-and-add.
    let op = WrOp::Write {
        raddr: b.mr.addr() + 20000,
        rkey: b.mr.rkey(),
    };
    let sges = [a.mr.sge(0, 1000)];
    a.qp.post_send(&[SendWr::new(3, op, &sges, SendFlags::SIGNALED)])
        .unwrap();
    let op = WrOp::Read {
        raddr: b.mr.addr() + 20000,
        rkey: b.mr.rkey(),
    };
    let sges = [a.mr.sge(30000, 1000)];
    a.qp.post_send(&[SendWr::new(4, op, &sges, SendFlags::SIGNALED)])
        .unwrap();
    let s = poll_n(&rig, &mut a.cq, 2);
    assert_eq!(
        s.iter().map(|w| (w.status, w.opcode)).collect::<Vec<_>>(),
        [
            (WcStatus::SUCCESS, WcOpcode::RDMA_WRITE),
            (WcStatus::SUCCESS, WcOpcode::RDMA_READ)
        ]
    );
    let mut got = vec![0u8; 1000];
    a.buf.read(30000, &mut got);
    assert_eq!(got, data[..1000]);
    b.buf.write(64, &40u64.to_ne_bytes());
    let op = WrOp::FetchAdd {
        raddr: b.mr.addr() + 64,
        rkey: b.mr.rkey(),
        add: 2,
    };
    let res = [a.mr.sge(8, 8)];
    a.qp.post_send(&[SendWr::new(5, op, &res, SendFlags::SIGNALED)])
        .unwrap();
    let s = poll_n(&rig, &mut a.cq, 1);
    assert_eq!(
        (s[0].status, s[0].opcode, s[0].byte_len),
        (WcStatus::SUCCESS, WcOpcode::FETCH_ADD, 8)
    );
    assert_eq!((a.buf.read_u64(8), b.buf.read_u64(64)), (40, 42));
}

/// A path without GRH on a RoCE port is refused by the driver with an error naming the GRH,
/// before the kernel is asked: the QP stays in INIT and connects fine with a GRH afterwards.
/// An address handle without GRH is refused the same way. On InfiniBand nothing changes.
#[test]
fn rtr_without_grh_is_refused_with_a_clear_error() {
    let rig = EmuRig::roce();
    let o = PairOpts::new(QpType::Rc);
    let mut a = side(&rig, 0, &o);
    let b = side(&rig, 1, &o);
    a.qp.to_init(1, Access::ALL).unwrap();
    let mut remote = RemoteQp {
        qpn: b.qp.qpn(),
        psn: 0x200,
        lid: 0,
        gid: None,
    };
    let err = a.qp.to_rtr(&remote, 3, V2_V4).unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidArgument {
                attr: "ah_attr.grh",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("GRH"), "{err}");
    let (st, _, _) = a.qp.query_attr().unwrap();
    assert_eq!(st, QpState::Init, "the kernel never saw the modify");
    remote.gid = Some(v4_gid(info(&rig, 1).ipv4));
    a.qp.to_rtr(&remote, 3, V2_V4).unwrap();
    assert_eq!(a.qp.query_attr().unwrap().0, QpState::Rtr);

    let err = Ah::new(
        &a.pd,
        AhAttr {
            port_num: 1,
            ..AhAttr::default()
        },
    )
    .unwrap_err();
    assert!(
        matches!(err, Error::InvalidArgument { attr: "grh", .. }),
        "{err:?}"
    );

    // InfiniBand: a LID-only path is fine.
    let ib = EmuRig::stepped();
    let mut x = side(&ib, 0, &o);
    let y = side(&ib, 1, &o);
    x.qp.to_init(1, Access::ALL).unwrap();
    let lid = y.ctx.query_port(1).unwrap().lid;
    x.qp.to_rtr(
        &RemoteQp {
            qpn: y.qp.qpn(),
            psn: 0,
            lid,
            gid: None,
        },
        3,
        0,
    )
    .unwrap();
}

/// UD through an AH made by GID: the kernel's destination MAC is in the AV, the data arrives,
/// the receive's 40-byte GRH area holds the IPv4 header of the RoCE v2 packet (bytes 20..40),
/// and the completion reports GRH as libmlx5 does (`flags_rqpn` 29:28 non-zero).
#[test]
fn ud_send_by_gid_carries_the_ipv4_header() {
    let rig = EmuRig::roce();
    let (mut a, mut b) = pair(&rig, PairOpts::new(QpType::Ud));
    let (ia, ib) = (info(&rig, 0), info(&rig, 1));
    let ah = Ah::new(
        &a.pd,
        AhAttr {
            port_num: 1,
            grh: Some(GlobalRoute {
                dgid: v4_gid(ib.ipv4),
                sgid_index: V2_V4,
                hop_limit: 64,
                flow_label: 0x5_4321,
                traffic_class: 0,
            }),
            ..AhAttr::default()
        },
    )
    .unwrap();
    assert_eq!(ah.av().rmac, ib.mac, "dmac from CREATE_AH");
    assert_eq!(
        ah.av().rlid.get(),
        roce_udp_sport(0x5_4321, || unreachable!())
    );

    b.buf.write(0, &[0xEE; 40]);
    post_recv_at(&mut b, 7, 0, 40 + 512);
    let data = pattern(300, 9);
    a.buf.write(1000, &data);
    let sges = [a.mr.sge(1000, 300)];
    let dest = UdDest {
        ah: &ah,
        remote_qpn: b.qp.qpn(),
        remote_qkey: QKEY,
    };
    let wr = SendWr::send(6, &sges, SendFlags::SIGNALED).to(dest);
    let r = send_received(&rig, &mut a, &mut b, wr, 7, 40 + 300);
    assert!(r.wc_flags.contains(WcFlags::GRH), "{r:?}");
    // As libmlx5: `sl` is bits 27:24 of the CQE's flags_rqpn, whose low two bits on RoCE are
    // the L3 header type (IPv4 = 2); no LID on Ethernet.
    assert_eq!((r.sl, r.slid), (2, 0), "{r:?}");
    let mut grh = [0u8; 40];
    b.buf.read(0, &mut grh);
    assert_eq!(grh[..20], [0u8; 20], "no IPv6 header in the first 20 bytes");
    let ip = &grh[20..];
    assert_eq!((ip[0], ip[9]), (0x45, 17), "IPv4 without options, UDP");
    assert_eq!(ip[12..16], ia.ipv4, "source");
    assert_eq!(ip[16..20], ib.ipv4, "destination");
    let mut got = vec![0u8; 300];
    b.buf.read(40, &mut got);
    assert_eq!(got, data);
}

/// The AV bytes libmlx5's `mlx5_create_ah` builds on a RoCE port, written out here from its
/// rules: extended-AV flag, rate and SL in bits 3:1, no path bits, the UDP source port in
/// `rlid` only for a RoCE v2 source GID (0 for v1), the kernel's MAC, tclass, hop limit, the
/// sgid index and flow label without the GRH bit, the destination GID.
fn expected_av(attr: &AhAttr, sport: u16, dmac: [u8; 6]) -> [u8; 48] {
    let g = attr.grh.unwrap();
    let mut b = [0u8; 48];
    b[8] = 0x80;
    b[12] = (attr.sl & 7) << 1;
    b[14..16].copy_from_slice(&sport.to_be_bytes());
    b[20..26].copy_from_slice(&dmac);
    b[26] = g.traffic_class;
    b[27] = g.hop_limit;
    let w = (u32::from(g.sgid_index) << 20) | g.flow_label;
    b[28..32].copy_from_slice(&w.to_be_bytes());
    b[32..48].copy_from_slice(&g.dgid);
    b
}

#[test]
fn roce_v1_and_v2_source_gids_build_the_av_as_libmlx5() {
    let rig = EmuRig::roce();
    let (mut a, mut b) = pair(&rig, PairOpts::new(QpType::Ud));
    let ib = info(&rig, 1);
    let attr = |sgid_index: u8, dgid: [u8; 16], flow_label: u32| AhAttr {
        sl: 5,
        dlid: 0x77, // ignored on RoCE
        port_num: 1,
        grh: Some(GlobalRoute {
            dgid,
            sgid_index,
            flow_label,
            hop_limit: 9,
            traffic_class: 0x20,
        }),
        ..AhAttr::default()
    };
    // RoCE v2 with a flow label: the port derived from it.
    let at = attr(V2_V4, v4_gid(ib.ipv4), 0xA_BCDE);
    let ah = Ah::new(&a.pd, at).unwrap();
    // 0xABCDE: low 14 bits 0x3CDE ^ high 6 bits 0x2A = 0x3CF4.
    assert_eq!(
        ah.av().as_bytes(),
        &expected_av(&at, 0xFCF4, ib.mac),
        "v2, flow label"
    );
    // RoCE v2 without a flow label: a random port in 0xC000..=0xFFFF, the rest as above.
    let at0 = attr(V2_V4, v4_gid(ib.ipv4), 0);
    let ports: Vec<u16> = (0..8)
        .map(|_| {
            let ah = Ah::new(&a.pd, at0).unwrap();
            let sport = ah.av().rlid.get();
            assert!(sport >= ROCE_UDP_SPORT_MIN, "{sport:#x}");
            assert_eq!(ah.av().as_bytes(), &expected_av(&at0, sport, ib.mac));
            sport
        })
        .collect();
    assert!(
        ports.iter().any(|&p| p != ports[0]),
        "random per AH: {ports:x?}"
    );
    // RoCE v1 (IPv4-mapped and link-local source GIDs): rlid 0, flow label kept.
    let v1 = attr(V1_V4, v4_gid(ib.ipv4), 0xA_BCDE);
    let ah_v1 = Ah::new(&a.pd, v1).unwrap();
    assert_eq!(ah_v1.av().as_bytes(), &expected_av(&v1, 0, ib.mac), "v1");
    let ll = attr(V1_LL, ib.port_gid, 0);
    let ah_ll = Ah::new(&a.pd, ll).unwrap();
    assert_eq!(ah_ll.av().as_bytes(), &expected_av(&ll, 0, ib.mac), "v1 ll");
    // The pure function agrees with what Ah::new built.
    let built = build_av(
        &v1,
        AvLink::Roce {
            dmac: ib.mac,
            udp_sport: None,
        },
    );
    assert_eq!(built.as_bytes(), ah_v1.av().as_bytes());

    // Traffic over the RoCE v1 link-local AH: the GRH area holds a real GRH (IPv6 version,
    // next header 0x1B = the BTH) between the two link-local GIDs.
    post_recv_at(&mut b, 1, 0, 40 + 64);
    let sges = [a.mr.sge(0, 64)];
    let dest = UdDest {
        ah: &ah_ll,
        remote_qpn: b.qp.qpn(),
        remote_qkey: QKEY,
    };
    a.qp.post_send(&[SendWr::send(2, &sges, SendFlags::SIGNALED).to(dest)])
        .unwrap();
    poll_n(&rig, &mut a.cq, 1);
    let r = poll_n(&rig, &mut b.cq, 1);
    assert_eq!((r[0].status, r[0].byte_len), (WcStatus::SUCCESS, 104));
    assert!(r[0].wc_flags.contains(WcFlags::GRH));
    let mut grh = [0u8; 40];
    b.buf.read(0, &mut grh);
    assert_eq!((grh[0] >> 4, grh[6]), (6, 0x1B));
    assert_eq!(grh[8..24], info(&rig, 0).port_gid);
    assert_eq!(grh[24..40], ib.port_gid);
}
