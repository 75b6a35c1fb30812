//! A hostile network: packets that are not the connected peer's, in the expected PSN
//! window, are dropped and counted, and the connection stays intact. A stepped emulator on
//! the UDP fabric is connected to a "peer" that is a plain UDP socket; other plain sockets
//! (on 127.0.0.1 and on other fabric addresses) forge packets by hand.

mod common;

use common::*;
use mlx5_emu::{Counters, EmuConfig, Emulator, Fabric, RunMode, roce_icrc};
use mlx5_hw::opcodes::SendOpcode;
use mlx5_hw::wqe::{DataSeg, FM_CE_SE_CQ_UPDATE};
use std::net::UdpSocket;
use zerocopy::IntoBytes;

const PEER_QPN: u32 = 0x00_CAFE;
/// `bring_up` sets sq_psn and rq_psn 0x100.
const PSN: u32 = 0x100;
const RC_SEND_ONLY: u8 = 0x04;
const RC_READ_RESPONSE_ONLY: u8 = 0x10;
const RC_ACK: u8 = 0x11;
const RC_ATOMIC_ACK: u8 = 0x12;
const QPS_RTS: u32 = 3;

/// BTH (opcode, dest QPN, PSN) + `ext` + payload + ICRC as node `src` -> `dst` computes it.
fn packet(
    opcode: u8,
    qpn: u32,
    psn: u32,
    ext: &[u8],
    payload: &[u8],
    src: u16,
    dst: u16,
) -> Vec<u8> {
    let mut v = vec![opcode, 0x40, 0xff, 0xff];
    v.extend_from_slice(&(qpn & 0xff_ffff).to_be_bytes());
    v.extend_from_slice(&(0x8000_0000 | (psn & 0xff_ffff)).to_be_bytes());
    v.extend_from_slice(ext);
    v.extend_from_slice(payload);
    let icrc = roce_icrc(&v, src, dst).expect("longer than a BTH");
    v.extend_from_slice(&icrc.to_le_bytes());
    v
}

/// An AETH with `syndrome` and MSN 1.
fn aeth(syndrome: u8) -> [u8; 4] {
    (u32::from(syndrome) << 24 | 1).to_be_bytes()
}

/// A requester QP of a stepped emulator on the UDP fabric, connected to the fake peer, with
/// one signaled 8-byte SEND on the wire (PSN 0x100), received by the peer.
struct Rig {
    emu: Emulator,
    a: Ctx,
    qp: Qp,
    cq: Cq,
    peer: UdpSocket,
    peer_lid: u16,
    lid: u16,
    _m: Buf,
}

fn rig() -> Rig {
    let (peer, peer_lid) = bind_node(150..=199);
    peer.set_read_timeout(Some(std::time::Duration::from_millis(20)))
        .unwrap();
    let emu = Emulator::new(EmuConfig {
        mode: RunMode::Stepped,
        fabric: Fabric::Udp,
        ..EmuConfig::default()
    });
    let lid = emu.hca_info(0).unwrap().lid;
    let mut a = Ctx::open(&emu, 0);
    let pd = a.alloc_pd();
    let cq = a.create_cq(16, 64, -1);
    let mut qp = a.create_qp(pd, &cq, &cq, RC, 16, 8, None);
    bring_up(&a, &qp, peer_lid, PEER_QPN, Knobs::default());
    let m = Buf::new(64);
    let (_, lkey, _) = a.reg_mr(pd, m.addr(), 64, ALL_ACCESS).unwrap();
    let i = qp.build_send(
        SendOpcode::SEND,
        0,
        FM_CE_SE_CQ_UPDATE,
        [0; 4],
        DataSeg::new(8, lkey, m.addr()).as_bytes(),
    );
    qp.ring(&a, i, Ring::Doorbell);
    let mut buf = [0u8; 2048];
    let mut got = false;
    for _ in 0..100 {
        emu.step();
        if let Ok((n, _)) = peer.recv_from(&mut buf) {
            assert_eq!((buf[0], n), (RC_SEND_ONLY, 12 + 8 + 4), "the SEND");
            got = true;
            break;
        }
    }
    assert!(got, "the SEND reached the peer");
    Rig {
        emu,
        a,
        qp,
        cq,
        peer,
        peer_lid,
        lid,
        _m: m,
    }
}

impl Rig {
    /// Let the emulator take in everything sent to it. (A stepped emulator with nothing to
    /// do moves its clock to the next timer: stop at the first step that took nothing in,
    /// so at most one ACK timeout elapses per call.)
    fn settle(&self) {
        for _ in 0..2000 {
            std::thread::sleep(std::time::Duration::from_micros(200));
            let before = self.emu.counters(0);
            self.emu.step();
            let after = self.emu.counters(0);
            let seen = |c: &Counters| c.packets_dropped + c.cqes_written + c.rx_out_of_window;
            if seen(&after) == seen(&before) {
                return;
            }
        }
    }

    fn peer_sends(&self, bytes: &[u8]) {
        self.peer.send_to(bytes, node_addr(self.lid)).unwrap();
    }

    /// The peer's honest ACK of the SEND completes it, once, successfully: the connection
    /// survived whatever came before.
    fn finish(mut self) -> Counters {
        assert!(
            drain(&mut self.cq).is_empty(),
            "nothing forged completed the SEND"
        );
        assert_eq!(qp_state(&self.a, &self.qp), QPS_RTS, "the QP is intact");
        let ack = packet(
            RC_ACK,
            self.qp.qpn,
            PSN,
            &aeth(0),
            &[],
            self.peer_lid,
            self.lid,
        );
        self.peer_sends(&ack);
        self.settle();
        let c = drain(&mut self.cq);
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!((c[0].opcode, c[0].wqe_counter), (0, 0), "SUCCESS");
        assert_eq!(qp_state(&self.a, &self.qp), QPS_RTS);
        self.emu.counters(0)
    }
}

#[test]
fn responses_beyond_the_last_psn_sent_are_dropped_and_counted() {
    let r = rig();
    let (q, p, l) = (r.qp.qpn, r.peer_lid, r.lid);
    // An ACK 1,000 PSNs ahead (it would acknowledge the SEND and far more), a NAK (remote
    // access error) ahead, READ data ahead, an atomic result ahead.
    r.peer_sends(&packet(RC_ACK, q, PSN + 1000, &aeth(0), &[], p, l));
    r.peer_sends(&packet(RC_ACK, q, PSN + 1, &aeth(0x62), &[], p, l));
    r.peer_sends(&packet(
        RC_READ_RESPONSE_ONLY,
        q,
        PSN + 7,
        &aeth(0),
        &[1; 8],
        p,
        l,
    ));
    let mut atomic = aeth(0).to_vec();
    atomic.extend_from_slice(&7u64.to_be_bytes());
    r.peer_sends(&packet(RC_ATOMIC_ACK, q, PSN + 2, &atomic, &[], p, l));
    r.settle();
    let c = r.finish();
    assert_eq!(c.rx_out_of_window, 4);
}

#[test]
fn packets_from_another_address_are_dropped_and_counted() {
    let r = rig();
    let (q, l) = (r.qp.qpn, r.lid);
    // The right QP and PSN, but from another fabric node (valid ICRC for that node) ...
    let (other, other_lid) = bind_node(100..=149);
    let ack = packet(RC_ACK, q, PSN, &aeth(0), &[], other_lid, l);
    other.send_to(&ack, node_addr(l)).unwrap();
    // ... and from a plain socket on 127.0.0.1.
    let local = UdpSocket::bind("127.0.0.1:0").unwrap();
    local.send_to(&ack, node_addr(l)).unwrap();
    // A NAK for a QP that does not exist, from the peer.
    r.peer_sends(&packet(
        RC_ACK,
        q ^ 0x77,
        PSN,
        &aeth(0x63),
        &[],
        r.peer_lid,
        l,
    ));
    r.settle();
    let c = r.finish();
    assert_eq!(c.rx_foreign, 3);
}

#[test]
fn short_truncated_and_corrupt_packets_are_dropped_and_counted() {
    let r = rig();
    let (q, p, l) = (r.qp.qpn, r.peer_lid, r.lid);
    let good = packet(RC_ACK, q, PSN, &aeth(0), &[], p, l);
    let mut flipped = good.clone();
    flipped[9] ^= 0x04; // a PSN bit: the ICRC no longer matches
    let mut bad_icrc = good.clone();
    let n = bad_icrc.len();
    bad_icrc[n - 1] ^= 0xff;
    // An ACK without its AETH (BTH + ICRC only), a READ response without payload room.
    let no_aeth = packet(RC_ACK, q, PSN, &[], &[], p, l);
    let cases: Vec<Vec<u8>> = vec![
        vec![],
        vec![RC_ACK; 5],
        good[..12].to_vec(),
        good[..good.len() - 1].to_vec(),
        flipped,
        bad_icrc,
        no_aeth,
    ];
    let k = cases.len() as u64;
    for c in &cases {
        r.peer_sends(c);
    }
    r.settle();
    let c = r.finish();
    assert_eq!(c.rx_bad_packets, k, "each malformed packet counted");
}

#[test]
fn a_flood_of_random_packets_at_far_psns_leaves_the_connection_intact() {
    let r = rig();
    let (q, p, l) = (r.qp.qpn, r.peer_lid, r.lid);
    let mut rng = Rng(0x5eed_1234_5678_9abc);
    let mut sent = 0u64;
    for i in 0..20_000u32 {
        let opcode = [
            RC_ACK,
            RC_ATOMIC_ACK,
            RC_READ_RESPONSE_ONLY,
            0x0D,
            0x0E,
            0x0F,
        ][rng.pick(6)];
        // Beyond the window: more than the one PSN sent ahead, not behind the oldest.
        let psn = PSN + 2 + (rng.below(1 << 22) as u32);
        let syn = [0x00, 0x20, 0x60, 0x61, 0x62, 0x63, 0x9f][rng.pick(7)];
        let mut ext = aeth(syn).to_vec();
        if opcode == RC_ATOMIC_ACK {
            ext.extend_from_slice(&rng.next().to_be_bytes());
        }
        let payload = vec![i as u8; rng.pick(300)];
        r.peer_sends(&packet(opcode, q, psn, &ext, &payload, p, l));
        sent += 1;
        if i % 64 == 63 {
            r.emu.step();
        }
    }
    r.settle();
    let c = r.finish();
    // Some may be lost in the socket buffer; every one that arrived was dropped.
    assert!(c.rx_out_of_window + c.rx_bad_packets > sent / 2, "{c:?}");
    assert_eq!(c.req_cqe_error, 0);
}

#[test]
fn a_request_from_another_node_is_not_executed() {
    // The emulator is the responder: the fake peer is its connected requester.
    let (peer, peer_lid) = bind_node(150..=199);
    peer.set_read_timeout(Some(std::time::Duration::from_millis(20)))
        .unwrap();
    let emu = Emulator::new(EmuConfig {
        mode: RunMode::Stepped,
        fabric: Fabric::Udp,
        ..EmuConfig::default()
    });
    let l = emu.hca_info(0).unwrap().lid;
    let mut a = Ctx::open(&emu, 0);
    let pd = a.alloc_pd();
    let mut cq = a.create_cq(16, 64, -1);
    let mut qp = a.create_qp(pd, &cq, &cq, RC, 16, 8, None);
    bring_up(&a, &qp, peer_lid, PEER_QPN, Knobs::default());
    let m = Buf::new(256);
    let (_, lkey, _) = a.reg_mr(pd, m.addr(), 256, ALL_ACCESS).unwrap();
    qp.post_recv(&[(m.addr(), 256, lkey)]);
    let (other, other_lid) = bind_node(100..=149);
    other
        .set_read_timeout(Some(std::time::Duration::from_millis(5)))
        .unwrap();
    let forged = packet(RC_SEND_ONLY, qp.qpn, PSN, &[], b"forged!!", other_lid, l);
    other.send_to(&forged, node_addr(l)).unwrap();
    let local = UdpSocket::bind("127.0.0.1:0").unwrap();
    local.send_to(&forged, node_addr(l)).unwrap();
    for _ in 0..50 {
        emu.step();
        std::thread::sleep(std::time::Duration::from_micros(100));
    }
    assert!(drain(&mut cq).is_empty(), "nothing delivered");
    let mut buf = [0u8; 256];
    assert!(other.recv_from(&mut buf).is_err(), "no ACK to the forger");
    assert_eq!(emu.counters(0).rx_foreign, 2);
    // The peer's own SEND with the same PSN is delivered, once, and acknowledged.
    let honest = packet(RC_SEND_ONLY, qp.qpn, PSN, &[], b"honest!!", peer_lid, l);
    peer.send_to(&honest, node_addr(l)).unwrap();
    let mut acked = false;
    for _ in 0..50 {
        emu.step();
        if let Ok((n, _)) = peer.recv_from(&mut buf) {
            assert!(n >= 16 && buf[0] == RC_ACK, "an ACK");
            assert_eq!(
                u32::from_be_bytes(buf[8..12].try_into().unwrap()) & 0xff_ffff,
                PSN
            );
            acked = true;
            break;
        }
    }
    assert!(acked);
    let c = drain(&mut cq);
    assert_eq!(c.len(), 1, "{c:?}");
    assert_eq!((c[0].opcode, c[0].byte_cnt), (2, 8));
    assert_eq!(m.read(0, 8), b"honest!!");
}
