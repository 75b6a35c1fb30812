//! The pcap capture as ibdump makes one: both directions of every QP, wall-clock
//! timestamps, one capture for several nodes of a fabric (each packet once), a loud refusal
//! of a path that cannot be written. Two emulators on the UDP fabric stand for two processes
//! (each opens the file itself, as a process would).

mod common;

use common::*;
use mlx5_emu::{EmuConfig, Emulator, Fabric, RunMode};
use mlx5_hw::opcodes::SendOpcode;
use mlx5_hw::wqe::{DataSeg, FM_CE_SE_CQ_UPDATE, RaddrSeg};
use zerocopy::IntoBytes;

fn node(pcap: Option<std::path::PathBuf>) -> Emulator {
    Emulator::try_new(EmuConfig {
        mode: RunMode::Stepped,
        fabric: Fabric::Udp,
        pcap,
        ..EmuConfig::default()
    })
    .expect("a writable capture")
}

fn temp(tag: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!(
        "mlx5-emu-capture-{tag}-{}.pcap",
        std::process::id()
    ))
}

fn ip_of(lid: u16) -> [u8; 4] {
    [127, 1, (lid >> 8) as u8, lid as u8]
}

/// One record of a capture: (seconds, source IP, destination IP, BTH opcode).
type Rec = (u32, [u8; 4], [u8; 4], u8);

/// The records of a classic little-endian pcap file of Ethernet/IPv4/UDP 4791 frames.
fn records(path: &std::path::Path) -> Vec<Rec> {
    let cap = std::fs::read(path).unwrap();
    assert_eq!(&cap[..4], &0xa1b2_c3d4u32.to_le_bytes(), "pcap magic");
    assert_eq!(
        u32::from_le_bytes(cap[20..24].try_into().unwrap()),
        1,
        "Ethernet"
    );
    let mut off = 24;
    let mut out = Vec::new();
    while off + 16 <= cap.len() {
        let sec = u32::from_le_bytes(cap[off..off + 4].try_into().unwrap());
        let usec = u32::from_le_bytes(cap[off + 4..off + 8].try_into().unwrap());
        assert!(usec < 1_000_000);
        let len = u32::from_le_bytes(cap[off + 8..off + 12].try_into().unwrap()) as usize;
        let f = &cap[off + 16..off + 16 + len];
        assert_eq!(&f[12..14], &[0x08, 0x00], "IPv4");
        assert_eq!(u16::from_be_bytes([f[36], f[37]]), 4791, "RoCEv2");
        let ip = |at: usize| -> [u8; 4] { f[at..at + 4].try_into().unwrap() };
        out.push((sec, ip(26), ip(30), f[42]));
        off += 16 + len;
    }
    assert_eq!(off, cap.len(), "whole records only");
    out
}

/// a SENDs to b and READs from b: on the wire a->b SEND_ONLY_IMM and READ_REQUEST, b->a
/// the ACK and READ_RESPONSE_ONLY. Returns the two LIDs.
fn exchange(ea: &Emulator, eb: &Emulator) -> (u16, u16) {
    let (ia, ib) = (ea.hca_info(0).unwrap(), eb.hca_info(0).unwrap());
    let mut a = Ctx::open(ea, 0);
    let mut b = Ctx::open(eb, 0);
    let (pda, pdb) = (a.alloc_pd(), b.alloc_pd());
    let mut cqa = a.create_cq(16, 64, -1);
    let mut cqb = b.create_cq(16, 64, -1);
    let mut qa = a.create_qp(pda, &cqa, &cqa, RC, 16, 8, None);
    let mut qb = b.create_qp(pdb, &cqb, &cqb, RC, 16, 8, None);
    let (ma, mb) = (Buf::new(4096), Buf::new(4096));
    let (_, la, _) = a.reg_mr(pda, ma.addr(), 4096, ALL_ACCESS).unwrap();
    let (_, lb, rb) = b.reg_mr(pdb, mb.addr(), 4096, ALL_ACCESS).unwrap();
    bring_up(&a, &qa, ib.lid, qb.qpn, Knobs::default());
    bring_up(&b, &qb, ia.lid, qa.qpn, Knobs::default());
    qb.post_recv(&[(mb.addr(), 64, lb)]);
    let seg = DataSeg::new(13, la, ma.addr());
    let i = qa.build_send(
        SendOpcode::SEND_IMM,
        0,
        FM_CE_SE_CQ_UPDATE,
        [1; 4],
        seg.as_bytes(),
    );
    qa.ring(&a, i, Ring::Doorbell);
    let segs = [
        RaddrSeg::new(mb.addr() + 1000, rb).as_bytes(),
        DataSeg::new(12, la, ma.addr() + 100).as_bytes(),
    ]
    .concat();
    let i = qa.build_send(SendOpcode::RDMA_READ, 0, FM_CE_SE_CQ_UPDATE, [0; 4], &segs);
    qa.ring(&a, i, Ring::Doorbell);
    settle(ea, eb);
    assert_eq!(drain(&mut cqa).len(), 2);
    assert_eq!(drain(&mut cqb).len(), 1);
    (ia.lid, ib.lid)
}

/// The four packets of [`exchange`], each once, in a capture, stamped with the wall clock.
fn assert_both_directions(recs: &[Rec], la: u16, lb: u16) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    for r in recs {
        assert!(
            now.abs_diff(u64::from(r.0)) < 600,
            "wall-clock timestamp: {} vs now {now}",
            r.0
        );
    }
    let mut dirs: Vec<([u8; 4], [u8; 4], u8)> = recs.iter().map(|r| (r.1, r.2, r.3)).collect();
    dirs.sort();
    let (a, b) = (ip_of(la), ip_of(lb));
    let mut want = vec![
        (a, b, 0x05), // SEND_ONLY_IMM
        (a, b, 0x0C), // READ_REQUEST
        (b, a, 0x10), // READ_RESPONSE_ONLY
        (b, a, 0x11), // ACKNOWLEDGE
    ];
    want.sort();
    assert_eq!(dirs, want, "each packet of both directions exactly once");
}

#[test]
fn two_nodes_writing_one_capture_record_each_packet_once_in_both_directions() {
    let path = temp("shared");
    let ea = node(Some(path.clone()));
    let eb = node(Some(path.clone()));
    let (la, lb) = exchange(&ea, &eb);
    drop((ea, eb));
    let recs = records(&path);
    let _ = std::fs::remove_file(&path);
    assert_both_directions(&recs, la, lb);
}

#[test]
fn each_node_capturing_alone_records_what_it_sends_and_what_arrives() {
    let (pa, pb) = (temp("a"), temp("b"));
    let ea = node(Some(pa.clone()));
    let eb = node(Some(pb.clone()));
    let (la, lb) = exchange(&ea, &eb);
    drop((ea, eb));
    for p in [&pa, &pb] {
        let recs = records(p);
        let _ = std::fs::remove_file(p);
        assert_both_directions(&recs, la, lb);
    }
}

#[test]
fn a_node_without_a_capture_is_recorded_on_arrival_by_the_one_with_it() {
    let path = temp("one-side");
    let ea = node(None);
    let eb = node(Some(path.clone()));
    let (la, lb) = exchange(&ea, &eb);
    drop((ea, eb));
    let recs = records(&path);
    let _ = std::fs::remove_file(&path);
    assert_both_directions(&recs, la, lb);
}

#[test]
fn a_stale_file_from_an_earlier_run_is_replaced() {
    let path = temp("stale");
    std::fs::write(&path, vec![0xEE; 1000]).unwrap();
    let ea = node(Some(path.clone()));
    let eb = node(None);
    let (la, lb) = exchange(&ea, &eb);
    drop((ea, eb));
    let recs = records(&path);
    let _ = std::fs::remove_file(&path);
    assert_both_directions(&recs, la, lb);
}

#[test]
fn a_capture_that_cannot_be_written_is_refused_with_its_path() {
    let dir = std::env::temp_dir().join(format!("mlx5-emu-no-such-dir-{}", std::process::id()));
    let missing = dir.join("x.pcap");
    for (path, why) in [
        (missing.clone(), "No such file or directory"),
        (std::env::temp_dir(), "Is a directory"),
        // Writable, but no capture file: refused too (nothing could read it back).
        (std::path::PathBuf::from("/dev/null"), "not a regular file"),
    ] {
        let e = Emulator::try_new(EmuConfig {
            mode: RunMode::Stepped,
            pcap: Some(path.clone()),
            ..EmuConfig::default()
        })
        .expect_err("an unwritable capture");
        assert!(e.contains(&path.display().to_string()), "{e}");
        assert!(e.contains(why), "{e}");
    }
    assert!(!missing.exists());
}
