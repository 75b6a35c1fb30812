//! The emulated rdma_cm (`kernel/ucma.rs`) driven through its command ABI, as librdmacm
//! drives it, between emulators on the UDP fabric, and against a hostile fabric: peers
//! that vanish mid-handshake, a REQ nobody listens for, racing connects, forged and
//! garbage CM MADs from plain sockets. Each failure is a named event or a counted drop,
//! and nothing is left wedged.

mod ucma_common;

use std::net::{SocketAddrV4, UdpSocket};
use std::time::{Duration, Instant};

use mlx5_emu::{Emulator, roce_icrc};
use mlx5_ffi::ucma::*;
use ucma_common::*;

const ROCE_PORT: u16 = 4791;
const IB_QPS_RTR: u32 = 2;
const IB_QPS_RTS: u32 = 3;

/// A plain UDP socket that owns a free fabric node address.
fn fake_node() -> (UdpSocket, u16) {
    for n in (200..=253).rev() {
        let a = SocketAddrV4::new([127, 1, 0, n as u8].into(), ROCE_PORT);
        if let Ok(s) = UdpSocket::bind(a) {
            s.set_read_timeout(Some(Duration::from_millis(200)))
                .unwrap();
            return (s, n);
        }
    }
    panic!("no free fabric node");
}

/// A CM MAD (Send, class 0x07, version 2) with attribute `attr` and CM data `data`
/// (at most 232 bytes), written here byte by byte from IBTA's layout.
fn mad(attr: u16, data: &[u8]) -> Vec<u8> {
    let mut m = vec![0u8; 256];
    m[0] = 1;
    m[1] = 0x07;
    m[2] = 2;
    m[3] = 0x03;
    m[8..16].copy_from_slice(&0x1234u64.to_be_bytes());
    m[16..18].copy_from_slice(&attr.to_be_bytes());
    m[24..24 + data.len()].copy_from_slice(data);
    m
}

/// A RoCEv2 datagram from QP1 to QP1 carrying `payload`, node `src` -> `dst`.
fn gsi_datagram(payload: &[u8], src: u16, dst: u16, qkey: u32) -> Vec<u8> {
    let mut v = vec![0x64, 0x00, 0xff, 0xff, 0, 0, 0, 1, 0, 0, 0, 0];
    v.extend_from_slice(&qkey.to_be_bytes());
    v.extend_from_slice(&1u32.to_be_bytes());
    v.extend_from_slice(payload);
    let icrc = roce_icrc(&v, src, dst).unwrap();
    v.extend_from_slice(&icrc.to_le_bytes());
    v
}

/// A REQ from node `src` for TCP port `port`, local comm id `comm`, QPN 0x42, with an
/// rdma_cm header (IPv4) naming `sip` -> `dip`.
fn forged_req(comm: u32, port: u16, src: u16, sip: [u8; 4], dip: [u8; 4]) -> Vec<u8> {
    let mut d = vec![0u8; 232];
    d[0..4].copy_from_slice(&comm.to_be_bytes());
    d[8..16].copy_from_slice(&(0x0106_0000u64 | u64::from(port)).to_be_bytes());
    d[32..36].copy_from_slice(&((0x42u32 << 8) | 1).to_be_bytes());
    d[36..40].copy_from_slice(&1u32.to_be_bytes());
    d[44..48].copy_from_slice(&((0x777u32 << 8) | 7).to_be_bytes());
    d[48..50].copy_from_slice(&0xffffu16.to_be_bytes());
    d[50] = (5 << 4) | 7;
    d[52..54].copy_from_slice(&src.to_be_bytes());
    // rdma_cm header: version 0, IPv4, source port 5555, addresses.
    d[141] = 4 << 4;
    d[142..144].copy_from_slice(&5555u16.to_be_bytes());
    d[156..160].copy_from_slice(&sip);
    d[172..176].copy_from_slice(&dip);
    mad(0x0010, &d)
}

/// The MAD of a datagram (`None` if it is not a GSI datagram), and its attribute id.
fn received_mad(dgram: &[u8]) -> Option<(u16, Vec<u8>)> {
    if dgram.len() < 20 + 256 || dgram[0] != 0x64 {
        return None;
    }
    let m = dgram[20..276].to_vec();
    Some((u16::from_be_bytes([m[16], m[17]]), m))
}

fn listener(emu: &Emulator, port: u16) -> (Chan, u32) {
    let l = Chan::open(emu);
    let id = l.create_id(ps::TCP, 0x11).unwrap();
    l.bind(id, SockAddr::V4 { ip: [0; 4], port }).unwrap();
    l.listen(id).unwrap();
    (l, id)
}

#[test]
fn connect_accept_and_disconnect_between_two_emulators() {
    let (ea, ep) = (emulator(), emulator());
    let port = port(1);
    let (l, _lid) = listener(&ep, port);
    let a = Chan::open(&ea);
    let (id, pid) = connect_pair(&a, &l, addr_of(&ep, port), (0x111, 0x222));
    // The QP attributes each side gets name the other side's QP and PSNs.
    let (ar, pr) = (
        a.init_qp_attr(id, IB_QPS_RTR).unwrap(),
        l.init_qp_attr(pid, IB_QPS_RTR).unwrap(),
    );
    let (at, pt) = (
        a.init_qp_attr(id, IB_QPS_RTS).unwrap(),
        l.init_qp_attr(pid, IB_QPS_RTS).unwrap(),
    );
    assert_eq!(ar.dest_qp_num, 0x222);
    assert_eq!(pr.dest_qp_num, 0x111);
    assert_eq!(ar.rq_psn, pt.sq_psn);
    assert_eq!(pr.rq_psn, at.sq_psn);
    assert_eq!(ar.ah_attr.dlid, ep.hca_info(0).unwrap().lid);
    assert_eq!(pr.ah_attr.dlid, ea.hca_info(0).unwrap().lid);
    a.disconnect(id).unwrap();
    l.expect(event::DISCONNECTED);
    l.disconnect(pid).unwrap();
    a.expect(event::DISCONNECTED);
    // Events reported: ADDR, ROUTE, CONNECT_RESPONSE, DISCONNECTED.
    assert_eq!(a.destroy(id).unwrap(), 4);
    // ESTABLISHED, DISCONNECTED.
    assert_eq!(l.destroy(pid).unwrap(), 2);
}

#[test]
fn a_req_to_a_port_nobody_listens_on_is_rejected_with_invalid_service_id() {
    let (ea, ep) = (emulator(), emulator());
    let a = Chan::open(&ea);
    let id = a.create_id(ps::TCP, 1).unwrap();
    a.resolve(id, addr_of(&ep, port(2))).unwrap();
    a.expect(event::ADDR_RESOLVED);
    a.resolve_route(id).unwrap();
    a.expect(event::ROUTE_RESOLVED);
    a.connect(id, 0x1, &[]).unwrap();
    let e = a.expect(event::REJECTED);
    assert_eq!(e.status, u32::from(rej::INVALID_SERVICE_ID));
}

#[test]
fn a_listener_that_vanishes_after_the_req_leaves_the_connect_unreachable() {
    let ea = emulator();
    let (sock, node) = fake_node();
    let a = Chan::open(&ea);
    let id = a.create_id(ps::TCP, 1).unwrap();
    a.resolve(
        id,
        SockAddr::V4 {
            ip: [127, 1, 0, node as u8],
            port: 9,
        },
    )
    .unwrap();
    a.expect(event::ADDR_RESOLVED);
    a.resolve_route(id).unwrap();
    a.expect(event::ROUTE_RESOLVED);
    a.connect(id, 0x1, &[]).unwrap();
    // The REQ arrives, then again and again: nobody answers.
    let mut buf = [0u8; 2048];
    let mut reqs = 0;
    let start = Instant::now();
    let e = loop {
        if let Ok(n) = sock.recv(&mut buf) {
            if received_mad(&buf[..n]).is_some_and(|(attr, _)| attr == 0x0010) {
                reqs += 1;
            }
        }
        if let Some(e) = a.event(Duration::ZERO) {
            break e;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no timeout event"
        );
    };
    assert_eq!(e.event, event::UNREACHABLE);
    assert_eq!(e.status as i32, -libc::ETIMEDOUT);
    assert!(reqs >= 7, "{reqs} REQs seen");
}

#[test]
fn an_active_side_that_vanishes_after_the_rep_leaves_the_listener_unreachable() {
    let ep = emulator();
    let port = port(3);
    let (l, _) = listener(&ep, port);
    let (sock, node) = fake_node();
    let me = ep.hca_info(0).unwrap();
    let req = forged_req(0xabcd, port, node, [127, 1, 0, node as u8], me.ipv4);
    let to = SocketAddrV4::new(me.ipv4.into(), ROCE_PORT);
    sock.send_to(&gsi_datagram(&req, node, me.lid, 0x8001_0000), to)
        .unwrap();
    let e = l.expect(event::CONNECT_REQUEST);
    let p = e.conn();
    assert_eq!(p.qp_num, 0x42);
    assert_eq!(p.private_data_len, 56);
    l.accept(e.id, Some(Chan::conn_param(0x99, &[]))).unwrap();
    // A duplicate REQ is answered with the REP again, not a second CONNECT_REQUEST.
    sock.send_to(&gsi_datagram(&req, node, me.lid, 0x8001_0000), to)
        .unwrap();
    let mut buf = [0u8; 2048];
    let mut reps = 0;
    let start = Instant::now();
    let ev = loop {
        if let Ok(n) = sock.recv(&mut buf) {
            if let Some((0x0013, m)) = received_mad(&buf[..n]) {
                // The REP names our comm id as its remote comm id.
                assert_eq!(&m[28..32], &0xabcdu32.to_be_bytes());
                reps += 1;
            }
        }
        if let Some(e) = l.event(Duration::ZERO) {
            break e;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no timeout event"
        );
    };
    assert_eq!(ev.event, event::UNREACHABLE, "status {}", ev.status as i32);
    assert_eq!(ev.status as i32, -libc::ETIMEDOUT);
    assert!(reps >= 8, "{reps} REPs seen");
}

#[test]
fn two_racing_connects_both_reach_the_listener() {
    let ep = emulator();
    let port = port(4);
    let (l, _) = listener(&ep, port);
    let (e1, e2) = (emulator(), emulator());
    let (a1, a2) = (Chan::open(&e1), Chan::open(&e2));
    let mut ids = Vec::new();
    for a in [&a1, &a2] {
        let id = a.create_id(ps::TCP, 7).unwrap();
        a.resolve(id, addr_of(&ep, port)).unwrap();
        a.expect(event::ADDR_RESOLVED);
        a.resolve_route(id).unwrap();
        a.expect(event::ROUTE_RESOLVED);
        ids.push(id);
    }
    // Both REQs in flight at once.
    a1.connect(ids[0], 0x10, b"one").unwrap();
    a2.connect(ids[1], 0x20, b"two").unwrap();
    let r1 = l.expect(event::CONNECT_REQUEST);
    let r2 = l.expect(event::CONNECT_REQUEST);
    assert_ne!(r1.id, r2.id);
    let mut seen = [r1.conn().qp_num, r2.conn().qp_num];
    seen.sort();
    assert_eq!(seen, [0x10, 0x20]);
    for r in [&r1, &r2] {
        l.accept(r.id, Some(Chan::conn_param(0x30 + r.conn().qp_num, &[])))
            .unwrap();
    }
    for (a, id, qpn) in [(&a1, ids[0], 0x40), (&a2, ids[1], 0x50)] {
        let rep = a.expect(event::CONNECT_RESPONSE);
        assert_eq!(rep.conn().qp_num, qpn);
        a.accept(id, None).unwrap();
    }
    l.expect(event::ESTABLISHED);
    l.expect(event::ESTABLISHED);
}

#[test]
fn garbage_and_forged_cm_mads_are_counted_and_nothing_wedges() {
    let ep = emulator();
    let port = port(5);
    let (l, _) = listener(&ep, port);
    let (sock, node) = fake_node();
    let me = ep.hca_info(0).unwrap();
    let to = SocketAddrV4::new(me.ipv4.into(), ROCE_PORT);
    let before = ep.counters(0);
    let send = |p: &[u8], qkey: u32| {
        sock.send_to(&gsi_datagram(p, node, me.lid, qkey), to)
            .unwrap();
    };
    let mut rng = 0x2545_F491_4F6C_DD1Du64;
    let mut junk = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng as u8
            })
            .collect()
    };
    // Undecodable: random bytes, a short MAD, a MAD of another class, an unknown attribute.
    for _ in 0..20 {
        send(&junk(256), 0x8001_0000);
    }
    send(&junk(40), 0x8001_0000);
    let mut other = mad(0x0010, &[]);
    other[1] = 0x04;
    send(&other, 0x8001_0000);
    send(&mad(0x0099, &[]), 0x8001_0000);
    // Decodable but naming no connection: REP, RTU, REJ, DREP, SIDR REP for unknown ids.
    for attr in [0x0013u16, 0x0014, 0x0012, 0x0016, 0x0018] {
        let mut d = junk(232);
        d[0..8].fill(0x5a);
        send(&mad(attr, &d), 0x8001_0000);
    }
    // The wrong QKey.
    send(
        &forged_req(1, port, node, [127, 1, 0, node as u8], me.ipv4),
        0x1111_1111,
    );
    // A REQ whose rdma_cm header is garbage: rejected, no event.
    let mut bad = forged_req(2, port, node, [127, 1, 0, node as u8], me.ipv4);
    bad[24 + 141] = 0x90;
    send(&bad, 0x8001_0000);
    let mut buf = [0u8; 2048];
    let start = Instant::now();
    let rej = loop {
        if let Ok(n) = sock.recv(&mut buf) {
            if let Some((0x0012, m)) = received_mad(&buf[..n]) {
                break m;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no REJ for the bad REQ"
        );
    };
    assert_eq!(&rej[28..32], &2u32.to_be_bytes());
    // Counted: 23 undecodable, 5 unknown connections + 1 wrong QKey.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let c = ep.counters(0);
        let bad = c.rx_bad_packets - before.rx_bad_packets;
        let foreign = c.rx_foreign - before.rx_foreign;
        if bad >= 23 && foreign >= 6 {
            assert_eq!((bad, foreign), (23, 6));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "counted {bad} bad, {foreign} foreign"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        l.event(Duration::from_millis(100)).is_none(),
        "garbage made an event"
    );
    // The listener still works.
    let ea = emulator();
    let a = Chan::open(&ea);
    connect_pair(&a, &l, addr_of(&ep, port), (1, 2));
}

#[test]
fn bad_commands_get_the_kernels_errnos() {
    let emu = emulator();
    let c = Chan::open(&emu);
    let e = |r: Result<(), mlx5_emu::Errno>| r.unwrap_err().0;
    // Unknown command, short buffer, GET_OPTION.
    assert_eq!(
        c.file.command(&[99, 0, 0, 0, 0, 0, 0, 0]).unwrap_err().0,
        libc::EINVAL
    );
    assert_eq!(c.file.command(&[0, 0, 0]).unwrap_err().0, libc::EINVAL);
    assert_eq!(
        c.file
            .command(&encode_cmd(cmd::CREATE_ID, &RdmaUcmCreateId::default(), 4)[..12])
            .unwrap_err()
            .0,
        libc::EINVAL
    );
    assert_eq!(
        e(c.cmd(cmd::GET_OPTION, &RdmaUcmQuery::default(), 0)),
        libc::ENOSYS
    );
    // A port space that does not exist; a response buffer too small; a bad pointer.
    assert_eq!(c.create_id(0x7777, 1).unwrap_err().0, libc::EINVAL);
    assert_eq!(
        e(c.cmd(
            cmd::CREATE_ID,
            &RdmaUcmCreateId {
                ps: ps::TCP,
                ..Default::default()
            },
            2
        )),
        libc::ENOSPC
    );
    assert_eq!(
        e(c.cmd(
            cmd::CREATE_ID,
            &RdmaUcmCreateId {
                ps: ps::TCP,
                response: 8,
                ..Default::default()
            },
            4
        )),
        libc::EFAULT
    );
    // Ids: unknown, another file's, and commands in the wrong state.
    assert_eq!(c.destroy(12345).unwrap_err().0, libc::ENOENT);
    let other = Chan::open(&emu);
    let theirs = other.create_id(ps::TCP, 1).unwrap();
    assert_eq!(c.destroy(theirs).unwrap_err().0, libc::EINVAL);
    let id = c.create_id(ps::TCP, 1).unwrap();
    assert_eq!(e(c.resolve_route(id)), libc::EINVAL);
    assert_eq!(e(c.connect(id, 1, &[])), libc::EINVAL);
    assert_eq!(
        e(c.accept(id, Some(Chan::conn_param(1, &[])))),
        libc::EINVAL
    );
    assert_eq!(e(c.disconnect(id)), libc::EINVAL);
    assert_eq!(c.init_qp_attr(id, IB_QPS_RTR).unwrap_err().0, libc::EINVAL);
    // A port in use, in this file or another; an address that is not ours.
    let p = port(6);
    c.bind(
        id,
        SockAddr::V4 {
            ip: [0; 4],
            port: p,
        },
    )
    .unwrap();
    assert_eq!(
        e(c.bind(
            id,
            SockAddr::V4 {
                ip: [0; 4],
                port: p + 1
            }
        )),
        libc::EINVAL
    );
    let id2 = other.create_id(ps::TCP, 1).unwrap();
    assert_eq!(
        e(other.bind(
            id2,
            SockAddr::V4 {
                ip: [0; 4],
                port: p
            }
        )),
        libc::EADDRINUSE
    );
    assert_eq!(
        e(other.bind(
            id2,
            SockAddr::V4 {
                ip: [10, 9, 8, 7],
                port: p + 2
            }
        )),
        libc::EADDRNOTAVAIL
    );
    // More private data than a REQ carries after the rdma_cm header (56 bytes).
    let id3 = c.create_id(ps::TCP, 1).unwrap();
    c.resolve(id3, addr_of(&emu, 9)).unwrap();
    c.expect(event::ADDR_RESOLVED);
    c.resolve_route(id3).unwrap();
    c.expect(event::ROUTE_RESOLVED);
    assert_eq!(e(c.connect(id3, 1, &[0; 57])), libc::EINVAL);
    // A non-blocking channel with nothing queued: EAGAIN.
    let fd = std::os::fd::AsRawFd::as_raw_fd(&c.fd);
    // SAFETY: fcntl on a descriptor we own.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    unsafe { libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) };
    let mut r = RdmaUcmEventResp::default();
    let g = RdmaUcmGetEvent {
        response: zerocopy::IntoBytes::as_mut_bytes(&mut r).as_mut_ptr() as u64,
    };
    assert_eq!(
        e(c.cmd(cmd::GET_EVENT, &g, size_of::<RdmaUcmEventResp>())),
        libc::EAGAIN
    );
    // Destroying a bound id gives its port back.
    c.destroy(id).unwrap();
    other
        .bind(
            id2,
            SockAddr::V4 {
                ip: [0; 4],
                port: p,
            },
        )
        .unwrap();
}
