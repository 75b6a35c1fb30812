//! Multicast for UD through `mlx5::cm`: three receivers on three emulated HCAs join a group
//! (JOIN_MCAST, the MULTICAST_JOIN event, ATTACH_MCAST), a UD SEND to the group reaches each
//! of them with its bytes, a receiver that left gets nothing more while the others still
//! do; and the refusals (a TCP-space id, a unicast address, a RC QP, a detach of a group
//! never attached) name their problem.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mlx5::cm::{EventChannel, MCAST_QPN, McastGroup, PortSpace};
use mlx5::emulator::{EmuConfig, Emulator, Fabric, Hca, LinkLayer};
use mlx5::{
    Access, Ah, Context, Cq, CqInit, DmaBuf, Mr, Pd, Qp, QpInitAttr, QpType, RecvWr, SendFlags,
    SendWr, UdDest, WorkCompletion,
};

const GRH: usize = 40;
const MSG: usize = 64;

struct Member {
    _ctx: Context,
    pd: Pd,
    cq: Cq,
    qp: Qp,
    buf: Arc<DmaBuf>,
    mr: Mr,
    ip: [u8; 4],
}

fn member(emu: &Emulator, hca: usize) -> Member {
    let ctx = Context::open(emu.open(hca).unwrap()).unwrap();
    let pd = Pd::new(&ctx).unwrap();
    let cq = Cq::new(&ctx, CqInit::default(), None).unwrap();
    let qp = Qp::new(&pd, &QpInitAttr::new(QpType::Ud, &cq, &cq)).unwrap();
    let buf = Arc::new(DmaBuf::new(4096).unwrap());
    let mr = pd.reg_mr(&buf, Access::LOCAL_WRITE).unwrap();
    Member {
        _ctx: ctx,
        pd,
        cq,
        qp,
        buf,
        mr,
        ip: emu.hca_info(hca).unwrap().ipv4,
    }
}

impl Member {
    fn post_recvs(&mut self, n: usize) {
        for i in 0..n {
            let sge = [self.mr.sge((i * 128) as u64, (GRH + MSG) as u32)];
            self.qp
                .post_recv(&[RecvWr {
                    wr_id: i as u64,
                    sg_list: &sge,
                }])
                .unwrap();
        }
    }

    /// The next completion within `limit`, if any.
    fn poll(&mut self, limit: Duration) -> Option<WorkCompletion> {
        let until = Instant::now() + limit;
        let mut wc = [WorkCompletion::default(); 1];
        while self.cq.poll(&mut wc) == 0 {
            if Instant::now() > until {
                return None;
            }
            std::thread::yield_now();
        }
        assert!(wc[0].is_ok(), "{}", wc[0]);
        Some(wc[0])
    }

    /// The payload of receive `wr_id`.
    fn payload(&self, wr_id: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        self.buf.read(wr_id as usize * 128 + GRH, &mut b);
        b
    }
}

fn msg(n: u8) -> Vec<u8> {
    (0..MSG as u8).map(|i| i.wrapping_mul(7) ^ n).collect()
}

/// SEND `n`'s message from `tx` to the group and wait for its completion.
fn send(tx: &mut Member, ah: &Ah, g: &McastGroup, n: u8) {
    tx.buf.write(2048, &msg(n));
    let sge = [tx.mr.sge(2048, MSG as u32)];
    let wr = SendWr::send(100 + u64::from(n), &sge, SendFlags::SIGNALED).to(UdDest {
        ah,
        remote_qpn: MCAST_QPN,
        remote_qkey: g.qkey,
    });
    tx.qp.post_send(&[wr]).map_err(|(_, e)| e).unwrap();
    let wc = tx.poll(Duration::from_secs(20)).expect("send completion");
    assert_eq!(wc.wr_id, 100 + u64::from(n));
}

#[test]
fn a_send_to_the_group_reaches_every_member_and_not_one_that_left() {
    group_traffic(LinkLayer::InfiniBand);
}

#[test]
fn the_same_on_roce_ports() {
    group_traffic(LinkLayer::Ethernet);
}

fn group_traffic(link_layer: LinkLayer) {
    let emu = Emulator::new(EmuConfig {
        num_hcas: 4,
        fabric: Fabric::InProcess,
        link_layer,
        ..EmuConfig::default()
    });
    let hca = Hca::Emulated(emu.clone());
    let group = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(239, 1, 2, 3)), 0);
    let chan = EventChannel::open(&hca).unwrap();
    // the sender on HCA 0, the receivers on HCAs 1..=3
    let mut tx = member(&emu, 0);
    let mut rx: Vec<Member> = (1..4).map(|i| member(&emu, i)).collect();
    let tx_id = chan.create_id(PortSpace::Udp).unwrap();
    tx_id.bind(SocketAddr::new(IpAddr::from(tx.ip), 0)).unwrap();
    let mut joins = Vec::new();
    let mut ids = Vec::new();
    for r in &mut rx {
        let id = chan.create_id(PortSpace::Udp).unwrap();
        id.bind(SocketAddr::new(IpAddr::from(r.ip), 0)).unwrap();
        let g = id.join_multicast(group, &mut r.qp).unwrap();
        r.post_recvs(4);
        joins.push(g);
        ids.push(id);
    }
    // every member learned the same group; the sender joins too, for the address vector
    let g = tx_id.join_multicast(group, &mut tx.qp).unwrap();
    for j in &joins {
        assert_eq!((j.mgid, j.mlid, j.qkey), (g.mgid, g.mlid, g.qkey));
    }
    assert_eq!(
        &g.mgid[..4],
        &[0xff, 0x12, 0x40, 0x1b],
        "an IPv4 group's MGID"
    );
    assert_eq!(&g.mgid[12..], &[239 & 0x0f, 1, 2, 3]);
    assert_eq!(g.qkey, mlx5::ffi::ucma::RDMA_UDP_QKEY);
    let ah = Ah::new(&tx.pd, g.ah).unwrap();

    // 1. every receiver gets the message, bytes intact, from the sender's QP
    send(&mut tx, &ah, &g, 1);
    for (i, r) in rx.iter_mut().enumerate() {
        let wc = r
            .poll(Duration::from_secs(20))
            .unwrap_or_else(|| panic!("receiver {i} got nothing"));
        assert_eq!(wc.byte_len as usize, GRH + MSG, "receiver {i}");
        assert_eq!(wc.src_qp, tx.qp.qpn(), "receiver {i}");
        assert_eq!(r.payload(wc.wr_id, MSG), msg(1), "receiver {i}");
    }
    // the sender is a member too, but its own SEND does not come back to it
    assert!(tx.poll(Duration::from_millis(50)).is_none());

    // 2. receiver 1 leaves: the next two messages reach receivers 0 and 2 only
    ids[1].leave_multicast(&joins[1], &rx[1].qp).unwrap();
    for n in [2, 3] {
        send(&mut tx, &ah, &g, n);
        for i in [0, 2] {
            let wc = rx[i]
                .poll(Duration::from_secs(20))
                .expect("a member's copy");
            assert_eq!(rx[i].payload(wc.wr_id, MSG), msg(n));
        }
    }
    // copies are made at the send, so the left one's would be there by now
    assert!(
        rx[1].poll(Duration::from_millis(200)).is_none(),
        "a receiver that left still got a message"
    );
    // leaving twice: the QP is no longer attached
    let again = ids[1].leave_multicast(&joins[1], &rx[1].qp).unwrap_err();
    assert!(format!("{again}").contains("DETACH_MCAST"), "{again}");

    // 3. a destroyed QP leaves its groups: receiver 2's QP goes, receiver 0 still gets it
    let gone = rx.pop().unwrap();
    drop(gone);
    send(&mut tx, &ah, &g, 4);
    let wc = rx[0].poll(Duration::from_secs(20)).expect("receiver 0");
    assert_eq!(rx[0].payload(wc.wr_id, MSG), msg(4));
}

#[test]
fn refusals_name_the_problem() {
    let emu = Emulator::new(EmuConfig {
        fabric: Fabric::InProcess,
        ..EmuConfig::default()
    });
    let hca = Hca::Emulated(emu.clone());
    let chan = EventChannel::open(&hca).unwrap();
    let mut m = member(&emu, 0);
    let group = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(239, 9, 9, 9)), 0);
    let local = SocketAddr::new(IpAddr::from(m.ip), 0);
    // a TCP-space id
    let tcp = chan.create_id(PortSpace::Tcp).unwrap();
    let e = tcp.join_multicast(group, &mut m.qp).unwrap_err();
    assert!(format!("{e}").contains("UDP-space"), "{e}");
    // a unicast address
    let udp = chan.create_id(PortSpace::Udp).unwrap();
    udp.bind(local).unwrap();
    let e = udp.join_multicast(local, &mut m.qp).unwrap_err();
    assert!(format!("{e}").contains("not a multicast address"), "{e}");
    // an RC QP cannot be attached; a UD QP not attached cannot be detached
    let rc = Qp::new(&m.pd, &QpInitAttr::new(QpType::Rc, &m.cq, &m.cq)).unwrap();
    let g = udp.join_multicast(group, &mut m.qp).unwrap();
    // an unbound id (its QP ready): the kernel's ENODEV
    let unbound = chan.create_id(PortSpace::Udp).unwrap();
    let e = unbound.join_multicast(group, &mut m.qp).unwrap_err();
    assert!(format!("{e}").contains("ENODEV"), "{e}");
    assert!(rc.attach_mcast(g.mgid, g.mlid).is_err());
    let other = Qp::new(&m.pd, &QpInitAttr::new(QpType::Ud, &m.cq, &m.cq)).unwrap();
    let e = other.detach_mcast(g.mgid, g.mlid).unwrap_err();
    assert!(format!("{e}").contains("EINVAL"), "{e}");
    // a unicast GID is refused before the kernel
    assert!(other.attach_mcast([0xfe; 16], g.mlid).is_err());
    // attaching twice is accepted (one attachment), detaching once undoes it
    m.qp.attach_mcast(g.mgid, g.mlid).unwrap();
    udp.leave_multicast(&g, &m.qp).unwrap();
    assert!(m.qp.detach_mcast(g.mgid, g.mlid).is_err());
}
