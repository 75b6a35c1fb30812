//! The UDP fabric: two emulators (as two processes would have) talk RoCEv2 over loopback,
//! and a pcap capture records the packets.

mod common;

use common::*;
use mlx5_emu::{EmuConfig, Emulator, Fabric, FaultConfig, RunMode};
use mlx5_hw::opcodes::SendOpcode;
use mlx5_hw::wqe::{DataSeg, FM_CE_SE_CQ_UPDATE, RaddrSeg};
use zerocopy::IntoBytes;

fn node(pcap: Option<std::path::PathBuf>) -> Emulator {
    node_with(pcap, FaultConfig::default())
}

fn node_with(pcap: Option<std::path::PathBuf>, fault: FaultConfig) -> Emulator {
    Emulator::new(EmuConfig {
        mode: RunMode::Stepped,
        fabric: Fabric::Udp,
        pcap,
        fault,
        ..EmuConfig::default()
    })
}

#[test]
fn rc_between_two_emulators_over_udp_with_pcap() {
    let path = std::env::temp_dir().join(format!("mlx5-emu-udp-{}.pcap", std::process::id()));
    let ea = node(Some(path.clone()));
    let eb = node(None);
    let (ia, ib) = (ea.hca_info(0).unwrap(), eb.hca_info(0).unwrap());
    assert_ne!(ia.lid, ib.lid, "each emulator is its own node");
    assert_ne!(ia.node_guid, ib.node_guid);
    let mut a = Ctx::open(&ea, 0);
    let mut b = Ctx::open(&eb, 0);
    let (pda, pdb) = (a.alloc_pd(), b.alloc_pd());
    let mut cqa = a.create_cq(16, 64, -1);
    let mut cqb = b.create_cq(16, 64, -1);
    let mut qa = a.create_qp(pda, &cqa, &cqa, RC, 16, 8, None);
    let mut qb = b.create_qp(pdb, &cqb, &cqb, RC, 16, 8, None);
    assert_ne!(qa.qpn, qb.qpn, "QPNs are distinct across nodes");
    let ma = Buf::new(4096);
    let mb = Buf::new(4096);
    let (_, la, _) = a.reg_mr(pda, ma.addr(), 4096, ALL_ACCESS).unwrap();
    let (_, lb, rb) = b.reg_mr(pdb, mb.addr(), 4096, ALL_ACCESS).unwrap();
    bring_up(&a, &qa, ib.lid, qb.qpn, Knobs::default());
    bring_up(&b, &qb, ia.lid, qa.qpn, Knobs::default());
    ma.write(0, b"over the wire");
    qb.post_recv(&[(mb.addr(), 64, lb)]);
    let i = qa.build_send(
        SendOpcode::SEND_IMM,
        0,
        FM_CE_SE_CQ_UPDATE,
        [1, 2, 3, 4],
        DataSeg::new(13, la, ma.addr()).as_bytes(),
    );
    qa.ring(&a, i, Ring::Doorbell);
    mb.write(1000, b"read me back");
    let segs = [
        RaddrSeg::new(mb.addr() + 1000, rb).as_bytes(),
        DataSeg::new(12, la, ma.addr() + 100).as_bytes(),
    ]
    .concat();
    let i = qa.build_send(SendOpcode::RDMA_READ, 0, FM_CE_SE_CQ_UPDATE, [0; 4], &segs);
    qa.ring(&a, i, Ring::Doorbell);
    settle(&ea, &eb);
    let ca = drain(&mut cqa);
    assert_eq!(
        ca.iter().map(|c| (c.opcode, c.send_op)).collect::<Vec<_>>(),
        vec![(0, 0x0B), (0, 0x10)]
    );
    let cb = drain(&mut cqb);
    assert_eq!(
        (cb[0].opcode, cb[0].imm, cb[0].byte_cnt, cb[0].src_qp),
        (3, [1, 2, 3, 4], 13, qa.qpn)
    );
    assert_eq!(mb.read(0, 13), b"over the wire");
    assert_eq!(ma.read(100, 12), b"read me back");
    assert_eq!(ea.counters(0).packets_sent, 2);
    assert_eq!(eb.counters(0).packets_sent, 2, "ACK and READ response");
    // A WRITE larger than any UDP datagram: 96 packets of the 1024-byte path MTU.
    let big = Buf::new(100_000);
    let (_, lbig, _) = a
        .reg_mr(pda, big.addr(), big.len as u64, ALL_ACCESS)
        .unwrap();
    let dst = Buf::new(100_000);
    let (_, _, rdst) = b
        .reg_mr(pdb, dst.addr(), dst.len as u64, ALL_ACCESS)
        .unwrap();
    let data: Vec<u8> = (0..98_000u32).map(|i| (i % 251) as u8).collect();
    big.write(0, &data);
    let segs = [
        RaddrSeg::new(dst.addr(), rdst).as_bytes(),
        DataSeg::new(98_000, lbig, big.addr()).as_bytes(),
    ]
    .concat();
    let i = qa.build_send(SendOpcode::RDMA_WRITE, 0, FM_CE_SE_CQ_UPDATE, [0; 4], &segs);
    qa.ring(&a, i, Ring::Doorbell);
    settle(&ea, &eb);
    let ca = drain(&mut cqa);
    assert_eq!(
        (ca.len(), ca[0].opcode, ca[0].send_op),
        (1, 0, 0x08),
        "{ca:?} {:?} {:?}",
        ea.counters(0),
        eb.counters(0)
    );
    assert!(
        dst.read(0, 98_000) == data,
        "the large WRITE arrived intact"
    );
    assert_eq!(ea.counters(0).packets_sent, 2 + 96);
    // The capture: pcap header, then both directions as ibdump records them: what a sent
    // (SEND_ONLY_IMM, READ_REQUEST, the WRITE) and what arrived from b (its ACKs and the
    // READ response), each Ethernet/IPv4/UDP 4791.
    drop(big);
    drop(a);
    drop(ea);
    let cap = std::fs::read(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    assert_eq!(&cap[..4], &0xa1b2_c3d4u32.to_le_bytes());
    let mut off = 24;
    let (mut ops, mut arrived) = (Vec::new(), Vec::new());
    let ip_of = |lid: u16| [127, 1, (lid >> 8) as u8, lid as u8];
    while off + 16 <= cap.len() {
        let len = u32::from_le_bytes(cap[off + 8..off + 12].try_into().unwrap()) as usize;
        let f = &cap[off + 16..off + 16 + len];
        assert_eq!(&f[12..14], &[0x08, 0x00]);
        assert_eq!(u16::from_be_bytes([f[36], f[37]]), 4791, "UDP dst port");
        let (src, dst) = (&f[26..30], &f[30..34]);
        if src == ip_of(ia.lid) {
            assert_eq!(dst, ip_of(ib.lid));
            ops.push(f[42]);
        } else {
            assert_eq!((src, dst), (&ip_of(ib.lid)[..], &ip_of(ia.lid)[..]));
            arrived.push(f[42]);
        }
        off += 16 + len;
    }
    assert_eq!(off, cap.len(), "whole records");
    // b's answers: ACKs (0x11) and the READ response (0x0D..=0x10).
    assert!(arrived.contains(&0x11), "{arrived:x?}");
    assert!(
        arrived.iter().any(|o| (0x0D..=0x10).contains(o)),
        "{arrived:x?}"
    );
    assert!(
        arrived.iter().all(|o| (0x0D..=0x11).contains(o)),
        "{arrived:x?}"
    );
    assert_eq!(ops.len(), 2 + 96);
    assert_eq!(
        ops[..3],
        [0x05, 0x0C, 0x06],
        "SEND_ONLY_IMM, READ_REQUEST, WRITE_FIRST"
    );
    assert_eq!(ops[3..97], [0x07; 94], "WRITE_MIDDLE");
    assert_eq!(ops[97], 0x08, "WRITE_LAST");
}

/// Two emulators on the UDP fabric with one connected RC QP each (`qa` sends).
struct UdpPair {
    ea: Emulator,
    eb: Emulator,
    a: Ctx,
    b: Ctx,
    pda: u32,
    pdb: u32,
    cqa: Cq,
    qa: Qp,
    cqb: Cq,
    qb: Qp,
}

impl UdpPair {
    fn new(sq: u32, cq_entries: u32) -> UdpPair {
        Self::with(sq, cq_entries, FaultConfig::default(), Knobs::default())
    }

    /// Both emulators with fault injection `fault`, both QPs brought up with `knobs`; b's
    /// QP has 64 receive WQEs and a 64-entry CQ.
    fn with(sq: u32, cq_entries: u32, fault: FaultConfig, knobs: Knobs) -> UdpPair {
        let (ea, eb) = (node_with(None, fault), node_with(None, fault));
        let (ia, ib) = (ea.hca_info(0).unwrap(), eb.hca_info(0).unwrap());
        let mut a = Ctx::open(&ea, 0);
        let mut b = Ctx::open(&eb, 0);
        let (pda, pdb) = (a.alloc_pd(), b.alloc_pd());
        let cqa = a.create_cq(cq_entries, 64, -1);
        let qa = a.create_qp(pda, &cqa, &cqa, RC, sq, 8, None);
        let cqb = b.create_cq(64, 64, -1);
        let qb = b.create_qp(pdb, &cqb, &cqb, RC, 16, 64, None);
        bring_up(&a, &qa, ib.lid, qb.qpn, knobs);
        bring_up(&b, &qb, ia.lid, qa.qpn, knobs);
        UdpPair {
            ea,
            eb,
            a,
            b,
            pda,
            pdb,
            cqa,
            qa,
            cqb,
            qb,
        }
    }

    /// Post (without ringing) a signaled RDMA op between a local and a remote range.
    fn post(
        &mut self,
        op: SendOpcode,
        (raddr, rkey): (u64, u32),
        (laddr, lkey): (u64, u32),
        len: u32,
    ) -> u16 {
        let segs = [
            RaddrSeg::new(raddr, rkey).as_bytes(),
            DataSeg::new(len, lkey, laddr).as_bytes(),
        ]
        .concat();
        self.qa.build_send(op, 0, FM_CE_SE_CQ_UPDATE, [0; 4], &segs)
    }

    /// Ring for WQE `i`, let both sides run, and return a's completions.
    fn ring_and_settle(&mut self, i: u16) -> Vec<Cqe> {
        self.qa.ring(&self.a, i, Ring::Doorbell);
        settle(&self.ea, &self.eb);
        drain(&mut self.cqa)
    }
}

#[test]
fn a_burst_larger_than_the_socket_buffer_recovers() {
    let mut p = UdpPair::new(256, 512);
    let src = Buf::new(4096);
    let dst = Buf::new(256 * 4096);
    let (_, ls, _) = p.a.reg_mr(p.pda, src.addr(), 4096, ALL_ACCESS).unwrap();
    let (_, _, rd) =
        p.b.reg_mr(p.pdb, dst.addr(), dst.len as u64, ALL_ACCESS)
            .unwrap();
    src.write(0, &[0xAB; 4096]);
    let n = 120u64;
    let mut last = 0;
    for i in 0..n {
        last = p.post(
            SendOpcode::RDMA_WRITE,
            (dst.addr() + i * 4096, rd),
            (src.addr(), ls),
            4096,
        );
    }
    let ca = p.ring_and_settle(last);
    assert_eq!(
        ca.len(),
        n as usize,
        "{:?} {:?}",
        p.ea.counters(0),
        p.eb.counters(0)
    );
    assert!(
        ca.iter().all(|c| c.opcode == 0),
        "{:?}",
        ca.iter().find(|c| c.opcode != 0)
    );
    assert!(dst.read(0, 4096 * n as usize).iter().all(|&x| x == 0xAB));
}

#[test]
fn eight_mib_write_and_read_stream_through_the_window_without_retransmissions() {
    let mut p = UdpPair::new(16, 16);
    let size = 8usize << 20;
    let (src, dst, back) = (Buf::new(size), Buf::new(size), Buf::new(size));
    let pattern: Vec<u8> = (0..size).map(|i| (i % 253) as u8).collect();
    src.write(0, &pattern);
    let (_, ls, _) =
        p.a.reg_mr(p.pda, src.addr(), size as u64, ALL_ACCESS)
            .unwrap();
    let (_, lback, _) =
        p.a.reg_mr(p.pda, back.addr(), size as u64, ALL_ACCESS)
            .unwrap();
    let (_, _, rd) =
        p.b.reg_mr(p.pdb, dst.addr(), size as u64, ALL_ACCESS)
            .unwrap();
    let i = p.post(
        SendOpcode::RDMA_WRITE,
        (dst.addr(), rd),
        (src.addr(), ls),
        size as u32,
    );
    let ca = p.ring_and_settle(i);
    assert_eq!(
        (ca.len(), ca[0].opcode, ca[0].byte_cnt),
        (1, 0, size as u32)
    );
    assert!(dst.read(0, size) == pattern);
    // 8 MiB at the 1024-byte path MTU, each packet sent once: the window (not a burst of
    // 8192 packets) keeps the receiver's socket from overflowing.
    assert_eq!(p.ea.counters(0).packets_sent, 8192);
    assert_eq!(p.eb.counters(0).duplicate_request, 0);
    // And READ it all back: 32 requests of 256 response packets each, none lost.
    let i = p.post(
        SendOpcode::RDMA_READ,
        (dst.addr(), rd),
        (back.addr(), lback),
        size as u32,
    );
    let ca = p.ring_and_settle(i);
    assert_eq!(
        (ca.len(), ca[0].opcode, ca[0].send_op, ca[0].byte_cnt),
        (1, 0, 0x10, size as u32)
    );
    assert!(
        back.read(0, size) == pattern,
        "the READ brought back every byte"
    );
    assert_eq!(p.ea.counters(0).packets_sent, 8192 + 32);
    assert_eq!(
        p.eb.counters(0).packets_sent,
        8192 / 16 + 8192,
        "ACKs of the WRITE, READ responses"
    );
}

/// Send `N` messages of 1000..2000 bytes (two packets each at the 1024-byte MTU) from a to b
/// with 20 % of the datagrams reordered and every one delayed, no drops, no ACK timeout
/// (so only NAK-sequence-error recovery can repair the order). Checks that every message
/// arrives once, in order, intact; returns (b's out_of_sequence, a's packet_seq_err,
/// a's packets_sent).
fn reordered_sends(seed: u64) -> (u64, u64, u64) {
    const N: usize = 48;
    let fault = FaultConfig {
        seed,
        reorder_ppm: 200_000,
        delay_ns: 3_000,
        ..FaultConfig::default()
    };
    let knobs = Knobs {
        timeout: 0,
        ..Knobs::default()
    };
    let mut p = UdpPair::with(64, 64, fault, knobs);
    let (src, dst) = (Buf::new(N * 2048), Buf::new(N * 2048));
    let (_, ls, _) =
        p.a.reg_mr(p.pda, src.addr(), src.len as u64, ALL_ACCESS)
            .unwrap();
    let (_, ld, _) =
        p.b.reg_mr(p.pdb, dst.addr(), dst.len as u64, ALL_ACCESS)
            .unwrap();
    let len = |i: usize| 1000 + 20 * i;
    let mut last = 0;
    for i in 0..N {
        let off = (i * 2048) as u64;
        let msg: Vec<u8> = (0..len(i)).map(|j| (i * 7 + j) as u8).collect();
        src.write(off as usize, &msg);
        p.qb.post_recv(&[(dst.addr() + off, 2048, ld)]);
        last = p.qa.build_send(
            SendOpcode::SEND,
            0,
            FM_CE_SE_CQ_UPDATE,
            [0; 4],
            DataSeg::new(len(i) as u32, ls, src.addr() + off).as_bytes(),
        );
    }
    let ca = p.ring_and_settle(last);
    let (sa, sb) = (p.ea.counters(0), p.eb.counters(0));
    assert_eq!(ca.len(), N, "{sa:?} {sb:?}");
    assert!(ca.iter().all(|c| c.opcode == 0), "{ca:?}");
    let cb = drain(&mut p.cqb);
    assert_eq!(
        cb.iter()
            .map(|c| (c.opcode, c.byte_cnt))
            .collect::<Vec<_>>(),
        (0..N).map(|i| (2, len(i) as u32)).collect::<Vec<_>>(),
        "each message received once, in order"
    );
    for i in 0..N {
        let want: Vec<u8> = (0..len(i)).map(|j| (i * 7 + j) as u8).collect();
        assert_eq!(dst.read(i * 2048, len(i)), want, "message {i}");
    }
    assert_eq!(sa.packets_dropped + sb.packets_dropped, 0);
    (sb.out_of_sequence, sa.packet_seq_err, sa.packets_sent)
}

#[test]
fn reorder_and_delay_apply_to_udp_and_repeat_with_the_seed() {
    let first = reordered_sends(7);
    let (oos, seq_err, sent) = first;
    assert!(oos > 0, "the receiver saw PSNs beyond the expected one");
    assert!(seq_err > 0, "the requester got sequence-error NAKs");
    assert!(sent > 96, "the NAKed packets were sent again: {sent}");
    assert_eq!(reordered_sends(7), first, "same seed, same reordering");
}

#[test]
fn delayed_udp_datagrams_wait_for_their_time() {
    let fault = FaultConfig {
        delay_ns: 1_000_000,
        ..FaultConfig::default()
    };
    let mut p = UdpPair::with(16, 16, fault, Knobs::default());
    let (src, dst) = (Buf::new(4096), Buf::new(4096));
    let (_, ls, _) = p.a.reg_mr(p.pda, src.addr(), 4096, ALL_ACCESS).unwrap();
    let (_, ld, _) = p.b.reg_mr(p.pdb, dst.addr(), 4096, ALL_ACCESS).unwrap();
    src.write(0, b"later");
    p.qb.post_recv(&[(dst.addr(), 64, ld)]);
    let i = p.qa.build_send(
        SendOpcode::SEND,
        0,
        FM_CE_SE_CQ_UPDATE,
        [0; 4],
        DataSeg::new(5, ls, src.addr()).as_bytes(),
    );
    p.qa.ring(&p.a, i, Ring::Doorbell);
    // a executes the WQE in this step, but the datagram waits for a's clock to advance.
    assert!(p.ea.step() > 0);
    assert_eq!(p.ea.counters(0).packets_sent, 1);
    for _ in 0..50 {
        p.eb.step();
    }
    assert!(drain(&mut p.cqb).is_empty(), "nothing arrived yet");
    settle(&p.ea, &p.eb);
    let cb = drain(&mut p.cqb);
    assert_eq!((cb.len(), cb[0].opcode, cb[0].byte_cnt), (1, 2, 5));
    assert_eq!(dst.read(0, 5), b"later");
    assert_eq!(drain(&mut p.cqa).len(), 1);
}
