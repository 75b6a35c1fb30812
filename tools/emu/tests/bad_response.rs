//! Bad response (PRM syndrome 0x10, IBV_WC_BAD_RESP_ERR): an RC requester on the UDP fabric
//! talks to a "peer" that is a plain UDP socket, not an emulator. The peer receives the real
//! request packets and answers with hand-built RoCEv2 responses the requester cannot accept.

mod common;

use common::*;
use mlx5_emu::{EmuConfig, Emulator, Fabric, RunMode, roce_icrc};
use mlx5_hw::opcodes::{SendOpcode, Syndrome, VendorSyndrome};
use mlx5_hw::wqe::{AtomicSeg, DataSeg, FM_CE_SE_CQ_UPDATE, RaddrSeg};
use std::net::UdpSocket;
use zerocopy::IntoBytes;

/// RoCEv2 UDP port.
/// The QPN the fake peer claims (any 24-bit value: the requester addresses it in the BTH).
const PEER_QPN: u32 = 0x00_BEEF;
/// The requester's first PSN (`bring_up` sets sq_psn 0x100).
const FIRST_PSN: u32 = 0x100;
/// BTH opcodes.
const RC_SEND_ONLY: u8 = 0x04;
const RC_READ_REQUEST: u8 = 0x0C;
const RC_FETCH_ADD: u8 = 0x14;
const RC_ATOMIC_ACK: u8 = 0x12;
const RC_READ_RESPONSE_ONLY: u8 = 0x10;
const RC_ACK: u8 = 0x11;
/// `IBV_QPS_ERR`.
const QPS_ERR: u32 = 6;

/// Bind the fake peer at the first free node counting down from 250 (emulators without an
/// explicit node count up from 1; other tests pin low nodes).
fn bind_peer() -> (UdpSocket, u16) {
    bind_node(200..=250)
}

/// One request packet as the peer saw it.
struct Request {
    opcode: u8,
    dst_qpn: u32,
    psn: u32,
    ack_req: bool,
}

/// Parse a received RoCEv2 request, checking its ICRC.
fn parse_request(b: &[u8], from_lid: u16, to_lid: u16) -> Request {
    assert!(b.len() >= 16, "a BTH and an ICRC: {b:?}");
    let (body, crc) = b.split_at(b.len() - 4);
    assert_eq!(
        roce_icrc(body, from_lid, to_lid).map(u32::to_le_bytes),
        Some(crc.try_into().unwrap()),
        "the request's ICRC"
    );
    let be = |o: usize| u32::from_be_bytes(body[o..o + 4].try_into().unwrap());
    Request {
        opcode: body[0],
        dst_qpn: be(4) & 0xff_ffff,
        psn: be(8) & 0xff_ffff,
        ack_req: body[8] & 0x80 != 0,
    }
}

/// A response packet to the requester's QP `qpn` on node `dst`: BTH (opcode, dest QPN,
/// PSN), AETH (syndrome, MSN), payload, ICRC.
fn response(
    opcode: u8,
    qpn: u32,
    psn: u32,
    syndrome: u8,
    payload: &[u8],
    src: u16,
    dst: u16,
) -> Vec<u8> {
    let mut v = vec![opcode, 0x40, 0xff, 0xff]; // SE 0, MigReq 1, pad 0, TVer 0; P_Key
    v.extend_from_slice(&(qpn & 0xff_ffff).to_be_bytes()); // resv8a 0, dest QP
    v.extend_from_slice(&(psn & 0xff_ffff).to_be_bytes()); // AckReq 0, PSN
    v.extend_from_slice(&(u32::from(syndrome) << 24 | 1).to_be_bytes()); // AETH, MSN 1
    v.extend_from_slice(payload);
    let icrc = roce_icrc(&v, src, dst).expect("longer than a BTH");
    v.extend_from_slice(&icrc.to_le_bytes());
    v
}

fn async_event(fd: i32) -> Option<u32> {
    let mut rec = [0u8; 16];
    // SAFETY: non-blocking read of up to 16 bytes into a local buffer.
    let n = unsafe { libc::recv(fd, rec.as_mut_ptr().cast(), 16, libc::MSG_DONTWAIT) };
    (n == 16).then(|| u32::from_ne_bytes([rec[8], rec[9], rec[10], rec[11]]))
}

/// The first request of [`run`] (the second is always a SEND): its send opcode, its WQE
/// segments after the control segment (local buffer `addr`/`lkey`), its BTH opcode.
fn first_request(op: SendOpcode, addr: u64, lkey: u32) -> (Vec<u8>, u8) {
    let local = DataSeg::new(8, lkey, addr);
    let raddr = RaddrSeg::new(0x1000, 0x42);
    match op {
        SendOpcode::RDMA_READ => (
            [raddr.as_bytes(), local.as_bytes()].concat(),
            RC_READ_REQUEST,
        ),
        SendOpcode::ATOMIC_FA => {
            let add = AtomicSeg::new(1, 0);
            let segs = [raddr.as_bytes(), add.as_bytes(), local.as_bytes()].concat();
            (segs, RC_FETCH_ADD)
        }
        _ => (local.as_bytes().to_vec(), RC_SEND_ONLY),
    }
}

/// Two signaled requests (the first `first`, the second a SEND) from a requester (stepped emulator on the UDP fabric) to the fake
/// peer, which answers the first with `opcode` / AETH `syndrome` / `payload`. Asserts
/// what the peer received and returns the requester's completions, its context, its QP and
/// the two WQE indices.
fn run(
    first: SendOpcode,
    opcode: u8,
    syndrome: u8,
    payload: &[u8],
) -> (Vec<Cqe>, Ctx, Qp, [u16; 2]) {
    let (peer, peer_lid) = bind_peer();
    peer.set_read_timeout(Some(std::time::Duration::from_millis(20)))
        .unwrap();
    let emu = Emulator::new(EmuConfig {
        mode: RunMode::Stepped,
        fabric: Fabric::Udp,
        ..EmuConfig::default()
    });
    let lid = emu.hca_info(0).unwrap().lid;
    assert_ne!(lid, peer_lid);
    let mut a = Ctx::open(&emu, 0);
    let pd = a.alloc_pd();
    let mut cq = a.create_cq(16, 64, -1);
    let mut qp = a.create_qp(pd, &cq, &cq, RC, 16, 8, None);
    bring_up(&a, &qp, peer_lid, PEER_QPN, Knobs::default());
    let m = Buf::new(64);
    let (_, lkey, _) = a.reg_mr(pd, m.addr(), 64, ALL_ACCESS).unwrap();
    m.write(0, b"to a peer that answers badly");
    let before = m.read(0, 64);
    let mut idx = [0u16; 2];
    let mut bth = [0u8; 2];
    for (k, op) in [first, SendOpcode::SEND].into_iter().enumerate() {
        let (segs, b) = first_request(op, m.addr(), lkey);
        idx[k] = qp.build_send(op, 0, FM_CE_SE_CQ_UPDATE, [0; 4], &segs);
        bth[k] = b;
    }
    qp.ring(&a, idx[1], Ring::Doorbell);
    // Both SENDs go out at once (they fit the window): collect them at the peer.
    let mut reqs = Vec::new();
    let mut buf = [0u8; 2048];
    for _ in 0..100 {
        if reqs.len() == 2 {
            break;
        }
        emu.step();
        if let Ok((n, from)) = peer.recv_from(&mut buf) {
            assert_eq!(
                from,
                node_addr(lid).into(),
                "sent from the requester's node"
            );
            reqs.push(parse_request(&buf[..n], lid, peer_lid));
        }
    }
    assert_eq!(reqs.len(), 2, "both requests reached the peer");
    for (k, r) in reqs.iter().enumerate() {
        assert_eq!(
            (r.opcode, r.dst_qpn, r.psn, r.ack_req),
            (bth[k], PEER_QPN, FIRST_PSN + k as u32, true)
        );
    }
    assert!(
        drain(&mut cq).is_empty(),
        "nothing completes before a response"
    );
    // The bad response to the first request.
    let pkt = response(opcode, qp.qpn, FIRST_PSN, syndrome, payload, peer_lid, lid);
    peer.send_to(&pkt, node_addr(lid)).unwrap();
    let mut cqes = Vec::new();
    for _ in 0..1000 {
        emu.step();
        cqes.extend(drain(&mut cq));
        if cqes.len() >= 2 {
            break;
        }
    }
    emu.run_until_idle();
    cqes.extend(drain(&mut cq));
    assert!(
        m.read(0, 64) == before,
        "no response byte landed in the registered buffer"
    );
    (cqes, a, qp, idx)
}

/// The requester's verdict on a bad response: BAD_RESP for the first request (send opcode
/// `first`), a flush for the second, the QP in ERR and no async event (the CQE reports it).
fn assert_bad_response(first: SendOpcode, cqes: &[Cqe], a: &Ctx, qp: &Qp, idx: [u16; 2]) {
    assert_eq!(cqes.len(), 2, "{cqes:?}");
    assert_eq!(
        (cqes[0].opcode, cqes[0].syndrome, cqes[0].vendor),
        (
            13,
            Syndrome::BAD_RESP.0,
            VendorSyndrome::for_syndrome(Syndrome::BAD_RESP).0
        ),
        "REQ_ERR with BAD_RESP (vendor syndrome as documented: none known, 0)"
    );
    assert_eq!(Syndrome::BAD_RESP.0, 0x10);
    assert_eq!(
        (cqes[0].wqe_counter, cqes[0].send_op, cqes[0].qpn),
        (idx[0], first.0, qp.qpn)
    );
    assert_eq!(
        (cqes[1].opcode, cqes[1].syndrome, cqes[1].vendor),
        (13, Syndrome::WR_FLUSH.0, VendorSyndrome::WR_FLUSH.0)
    );
    assert_eq!(Syndrome::WR_FLUSH.0, 0x05);
    assert_eq!(cqes[1].wqe_counter, idx[1]);
    assert_eq!(qp_state(a, qp), QPS_ERR);
    assert_eq!(
        async_event(a.async_fd),
        None,
        "the CQE is the report: no async event"
    );
    let c = a.emu.counters(0);
    assert_eq!((c.req_cqe_error, c.req_cqe_flush_error), (1, 1));
}

#[test]
fn an_ack_with_a_reserved_aeth_syndrome_is_a_bad_response() {
    // AETH syndrome type 01b (0x40..0x5f) is reserved.
    let (cqes, a, qp, idx) = run(SendOpcode::SEND, RC_ACK, 0x40, &[]);
    assert_bad_response(SendOpcode::SEND, &cqes, &a, &qp, idx);
}

#[test]
fn a_read_response_to_a_send_is_a_bad_response() {
    // Opcode and PSN valid, but a SEND is answered by an ACK, never by READ data.
    let (cqes, a, qp, idx) = run(SendOpcode::SEND, RC_READ_RESPONSE_ONLY, 0x00, &[0x5A; 8]);
    assert_bad_response(SendOpcode::SEND, &cqes, &a, &qp, idx);
}

#[test]
fn read_data_for_an_atomic_is_a_bad_response_and_lands_nowhere() {
    let fa = SendOpcode::ATOMIC_FA;
    let (cqes, a, qp, idx) = run(fa, RC_READ_RESPONSE_ONLY, 0x00, &[0x5A; 8]);
    assert_bad_response(fa, &cqes, &a, &qp, idx);
}

#[test]
fn an_atomic_result_for_a_read_is_a_bad_response_and_lands_nowhere() {
    let read = SendOpcode::RDMA_READ;
    let (cqes, a, qp, idx) = run(read, RC_ATOMIC_ACK, 0x00, &[0x5A; 8]);
    assert_bad_response(read, &cqes, &a, &qp, idx);
}
