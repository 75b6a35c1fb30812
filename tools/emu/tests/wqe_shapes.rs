//! Every send WQE shape the PRM allows, checked against an independent model of the
//! segments: random WQEs (transport x opcode x sequence of inline and pointer segments x
//! lengths x ring position) built by hand with `mlx5-hw`, the bytes on the wire (the
//! emulator's pcap capture, parsed here from the RoCEv2 headers) and in the peer's memory
//! compared with what the model says the segments gather. Before `payload()` walked the
//! whole segment list, an inline segment followed by pointer segments put only the inline
//! bytes on the wire (UCX's `am_zcopy`: 10 of 1024 bytes over RC, 16 over UD).

mod common;

use common::*;
use mlx5_emu::{EmuConfig, Emulator, RunMode};
use mlx5_hw::opcodes::{SendOpcode, Syndrome};
use mlx5_hw::wqe::{DataSeg, FM_CE_SE_CQ_UPDATE, InlineHdr, RaddrSeg};
use zerocopy::IntoBytes;

const SIG: u8 = FM_CE_SE_CQ_UPDATE;
/// Send-queue depth of the pair, WQEBBs.
const SQ: u32 = 64;
/// Where receives land in B's buffer, and where WRITEs go.
const DST: usize = 8192;
/// Space before a UD receive's data: the GRH.
const GRH: usize = 40;

/// One payload segment of the model.
#[derive(Clone, Debug)]
enum Seg {
    Inline(Vec<u8>),
    /// (offset in A's registered buffer, length).
    Pointer(usize, u32),
}

/// The segments' bytes in the WQE, each inline segment padded to 16.
fn encode(segs: &[Seg], src: (u64, u32)) -> Vec<u8> {
    let mut out = Vec::new();
    for s in segs {
        match s {
            Seg::Inline(d) => {
                out.extend_from_slice(InlineHdr::new(d.len() as u32).as_bytes());
                out.extend_from_slice(d);
                out.resize(out.len().next_multiple_of(16), 0);
            }
            Seg::Pointer(off, len) => {
                out.extend_from_slice(DataSeg::new(*len, src.1, src.0 + *off as u64).as_bytes())
            }
        }
    }
    out
}

/// The model: the bytes the segments gather, in order (inline bytes as written, pointer
/// bytes as they are in A's buffer).
fn gathered(segs: &[Seg], a: &Buf) -> Vec<u8> {
    let mut out = Vec::new();
    for s in segs {
        match s {
            Seg::Inline(d) => out.extend_from_slice(d),
            Seg::Pointer(off, len) => out.extend_from_slice(&a.read(*off, *len as usize)),
        }
    }
    out
}

/// A capture's RoCEv2 request payloads from `src_ip` (ACKs and other nodes' packets left
/// out), parsed from the headers: BTH, then by opcode ImmDt / RETH / DETH, the pad count,
/// the ICRC.
fn wire_payloads(cap: &[u8], src_ip: [u8; 4]) -> Vec<(u8, Vec<u8>)> {
    let mut out = Vec::new();
    let mut at = 24;
    while at + 16 <= cap.len() {
        let incl = u32::from_le_bytes(cap[at + 8..at + 12].try_into().expect("4")) as usize;
        let frame = &cap[at + 16..at + 16 + incl];
        at += 16 + incl;
        if frame[14 + 12..14 + 16] != src_ip {
            continue;
        }
        let bth = &frame[14 + 20 + 8..];
        let opcode = bth[0];
        let pad = usize::from((bth[1] >> 4) & 3);
        let ext = match opcode {
            0x04 | 0x24 => 0,      // RC/UC SEND_ONLY
            0x05 | 0x25 => 4,      // SEND_ONLY with ImmDt
            0x0a | 0x2a => 16,     // WRITE_ONLY: RETH
            0x0b | 0x2b => 16 + 4, // WRITE_ONLY with immediate
            0x64 => 8,             // UD SEND_ONLY: DETH
            0x65 => 8 + 4,         // UD SEND_ONLY with ImmDt
            _ => continue,         // ACKs
        };
        let body = &bth[12 + ext..bth.len() - 4 - pad];
        out.push((opcode, body.to_vec()));
    }
    out
}

/// A connected (or UD) pair on a stepped emulator capturing to `pcap`.
fn capture_pair(qp_type: u8, pcap: &std::path::Path) -> Pair {
    let emu = Emulator::new(EmuConfig {
        num_hcas: 2,
        mode: RunMode::Stepped,
        pcap: Some(pcap.to_path_buf()),
        ..EmuConfig::default()
    });
    pair_in(emu, qp_type, Knobs::default(), 64, 64, 16)
}

fn temp_pcap(tag: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("mlx5-emu-shapes-{tag}-{}.pcap", std::process::id()))
}

/// Random segments: 1..=5 of them, inline (0..=96 bytes) or pointer (1..=300 bytes from a
/// random offset of A's buffer), at most `max` bytes in all and 63 - `fixed` 16-byte units
/// in the WQE.
fn random_segs(rng: &mut Rng, max: usize, fixed: usize) -> Vec<Seg> {
    loop {
        let n = 1 + rng.pick(5);
        let segs: Vec<Seg> = (0..n)
            .map(|_| {
                if rng.below(2) == 0 {
                    let len = rng.pick(97);
                    Seg::Inline((0..len).map(|_| rng.next() as u8).collect())
                } else {
                    let len = 1 + rng.below(300) as u32;
                    Seg::Pointer(rng.pick(8192 - 300), len)
                }
            })
            .collect();
        let total: usize = segs
            .iter()
            .map(|s| match s {
                Seg::Inline(d) => d.len(),
                Seg::Pointer(_, l) => *l as usize,
            })
            .sum();
        let units = encode(&segs, (0, 0)).len() / 16;
        if total <= max && 1 + fixed + units <= 63 {
            return segs;
        }
    }
}

struct Stats {
    wqes: usize,
    mixed: usize,
    wrapped: usize,
    inline_wrapped: usize,
}

/// Post `n` random WQEs of the opcodes `ops` on the pair and check each against the model,
/// in B's memory and on the wire.
fn run(qp_type: u8, ops: &[SendOpcode], seed: u64, n: usize) -> Stats {
    let path = temp_pcap(&format!("{qp_type}-{seed}"));
    let mut p = capture_pair(qp_type, &path);
    let mut rng = Rng(seed | 1);
    let src: Vec<u8> = (0..16384).map(|_| rng.next() as u8).collect();
    p.ma.0.write(0, &src);
    let dlid = p.emu.hca_info(1).expect("hca 1").lid;
    let mut expected_wire = Vec::new();
    let mut st = Stats {
        wqes: 0,
        mixed: 0,
        wrapped: 0,
        inline_wrapped: 0,
    };
    for i in 0..n {
        let op = ops[rng.pick(ops.len())];
        let is_write = matches!(op, SendOpcode::RDMA_WRITE | SendOpcode::RDMA_WRITE_IMM);
        let has_imm = matches!(op, SendOpcode::SEND_IMM | SendOpcode::RDMA_WRITE_IMM);
        // Fixed segments before the payload: a UD datagram segment (48 bytes) or a
        // remote-address segment (16).
        let (head, fixed) = if qp_type == UD {
            (ud_av(p.qb.qpn, dlid, 0x1111_1111), 3)
        } else if is_write {
            let dst = p.mb.0.addr() + DST as u64;
            (RaddrSeg::new(dst, p.mb.2).as_bytes().to_vec(), 1)
        } else {
            (Vec::new(), 0)
        };
        let segs = random_segs(&mut rng, 1024, fixed);
        let want = gathered(&segs, &p.ma.0);
        let body = encode(&segs, (p.ma.0.addr(), p.ma.1));
        let wqe = [head.as_slice(), &body].concat();
        // Ring position: where this WQE starts, and whether it (or an inline segment in
        // it) runs over the ring's end.
        let slot = (p.qa.sq_pi % SQ) as usize;
        let units = 1 + wqe.len() / 16;
        let end_of_ring = (SQ as usize - slot) * 64;
        st.wrapped += usize::from(units * 16 > end_of_ring);
        let mut at = 16 + head.len();
        for s in &segs {
            let len = encode(std::slice::from_ref(s), (0, 0)).len();
            if let Seg::Inline(d) = s {
                st.inline_wrapped +=
                    usize::from(at + 4 < end_of_ring && at + 4 + d.len() > end_of_ring);
            }
            at += len;
        }
        let kinds = (
            segs.iter().any(|s| matches!(s, Seg::Inline(_))),
            segs.iter().any(|s| matches!(s, Seg::Pointer(..))),
        );
        st.mixed += usize::from(kinds.0 && kinds.1);
        // B: a receive for SENDs and WRITE with immediate; a cleared target for WRITEs.
        p.mb.0.write(DST, &vec![0u8; 4096]);
        if !is_write || has_imm {
            p.qb.post_recv(&[(p.mb.0.addr() + DST as u64, 4096, p.mb.1)]);
        }
        let imm = (i as u32).to_be_bytes();
        p.send(op, SIG, imm, &wqe);
        let ca = drain(&mut p.cqa);
        assert_eq!(
            ca.len(),
            1,
            "WQE {i} ({op:?}, {segs:?}): one send completion"
        );
        assert_eq!(ca[0].syndrome, 0, "WQE {i} ({op:?}, {segs:?}): {:?}", ca[0]);
        let cb = drain(&mut p.cqb);
        let land = if qp_type == UD { DST + GRH } else { DST };
        if !is_write || has_imm {
            assert_eq!(cb.len(), 1, "WQE {i}: one receive completion");
            let extra = if qp_type == UD { GRH as u32 } else { 0 };
            assert_eq!(cb[0].syndrome, 0, "WQE {i}: {:?}", cb[0]);
            assert_eq!(
                cb[0].byte_cnt,
                want.len() as u32 + extra,
                "WQE {i}: byte count"
            );
            if has_imm {
                assert_eq!(cb[0].imm, imm, "WQE {i}: immediate");
            }
        } else {
            assert!(cb.is_empty(), "WQE {i}: a WRITE consumes no receive");
        }
        assert_eq!(
            p.mb.0.read(land, want.len()),
            want,
            "WQE {i} ({op:?}, segments {segs:?}): B's memory holds what the segments gather"
        );
        expected_wire.push(want);
        st.wqes += 1;
    }
    drop(p);
    let cap = std::fs::read(&path).expect("capture");
    let _ = std::fs::remove_file(&path);
    let src_ip = [127, 1, 0, 1];
    let wire = wire_payloads(&cap, src_ip);
    assert_eq!(
        wire.len(),
        expected_wire.len(),
        "one request packet per WQE"
    );
    for (k, ((opcode, got), want)) in wire.iter().zip(&expected_wire).enumerate() {
        assert_eq!(
            got, want,
            "WQE {k} (packet opcode {opcode:#x}): the bytes on the wire"
        );
    }
    st
}

#[test]
fn random_prm_valid_wqes_gather_what_an_independent_model_says_rc() {
    let ops = [
        SendOpcode::SEND,
        SendOpcode::SEND_IMM,
        SendOpcode::RDMA_WRITE,
        SendOpcode::RDMA_WRITE_IMM,
    ];
    let mut total = Stats {
        wqes: 0,
        mixed: 0,
        wrapped: 0,
        inline_wrapped: 0,
    };
    for seed in [1, 2, 3] {
        let s = run(RC, &ops, seed, 150);
        total.wqes += s.wqes;
        total.mixed += s.mixed;
        total.wrapped += s.wrapped;
        total.inline_wrapped += s.inline_wrapped;
    }
    // The shapes the test is about did occur.
    assert_eq!(total.wqes, 450);
    assert!(
        total.mixed > 50,
        "inline and pointer segments mixed: {}",
        total.mixed
    );
    assert!(
        total.wrapped > 5,
        "WQEs over the ring's end: {}",
        total.wrapped
    );
    assert!(
        total.inline_wrapped > 0,
        "inline data over the ring's end: {}",
        total.inline_wrapped
    );
}

#[test]
fn random_prm_valid_wqes_gather_what_an_independent_model_says_uc() {
    let ops = [
        SendOpcode::SEND,
        SendOpcode::RDMA_WRITE,
        SendOpcode::RDMA_WRITE_IMM,
    ];
    let s = run(UC, &ops, 7, 150);
    assert!(
        s.mixed > 10 && s.wrapped > 2,
        "mixed {} wrapped {}",
        s.mixed,
        s.wrapped
    );
}

#[test]
fn random_prm_valid_wqes_gather_what_an_independent_model_says_ud() {
    // A datagram segment first, then the payload segments.
    let ops = [SendOpcode::SEND, SendOpcode::SEND_IMM];
    let mut wrapped = 0;
    for seed in [11, 12] {
        let s = run(UD, &ops, seed, 150);
        assert!(s.mixed > 10, "mixed {}", s.mixed);
        wrapped += s.wrapped;
    }
    assert!(wrapped > 5, "WQEs over the ring's end: {wrapped}");
}

/// UCX's `am_zcopy` shape: the active-message header inline, the payload by pointer (one
/// or several iov entries). Before the fix: 10 of 1024 bytes arrived over RC, 16 over UD.
#[test]
fn ucx_am_zcopy_shape_carries_the_inline_header_and_every_pointer_byte() {
    for qp_type in [RC, UD] {
        let mut p = pair(qp_type, Knobs::default());
        let dlid = p.emu.hca_info(1).expect("hca 1").lid;
        let payload: Vec<u8> = (0..1024u32).map(|i| (i * 13 + 5) as u8).collect();
        p.ma.0.write(0, &payload);
        let header = b"AMHDR-0123".to_vec();
        for iovs in [1usize, 3] {
            let mut segs = vec![Seg::Inline(header.clone())];
            let step = 1024 / iovs;
            for k in 0..iovs {
                let len = if k + 1 == iovs { 1024 - step * k } else { step };
                segs.push(Seg::Pointer(step * k, len as u32));
            }
            let head = if qp_type == UD {
                ud_av(p.qb.qpn, dlid, 0x1111_1111)
            } else {
                Vec::new()
            };
            let wqe = [head, encode(&segs, (p.ma.0.addr(), p.ma.1))].concat();
            p.qb.post_recv(&[(p.mb.0.addr(), 4096, p.mb.1)]);
            p.send(SendOpcode::SEND, SIG, [0; 4], &wqe);
            let ca = drain(&mut p.cqa);
            assert_eq!(ca.len(), 1);
            assert_eq!(ca[0].syndrome, 0, "{ca:?}");
            let cb = drain(&mut p.cqb);
            assert_eq!(cb.len(), 1);
            let skip = if qp_type == UD { GRH } else { 0 };
            assert_eq!(
                cb[0].byte_cnt as usize,
                skip + 10 + 1024,
                "qp type {qp_type}, {iovs} iovs"
            );
            let want = [header.as_slice(), &payload].concat();
            assert_eq!(p.mb.0.read(skip, want.len()), want);
        }
    }
}

/// What the device refuses, as it refuses it: inline data running past the WQE's `ds`
/// (local length error), a zero byte count in a pointer segment (2 GiB, beyond the MR:
/// local protection error), a UD payload beyond the MTU (local length); a zero-length
/// inline segment is nothing, and is fine anywhere.
#[test]
fn refused_shapes_complete_with_the_devices_syndromes() {
    // Inline running past the WQE: a 200-byte header in a WQE of 2 units.
    let mut p = pair(RC, Knobs::default());
    p.qb.post_recv(&[(p.mb.0.addr(), 4096, p.mb.1)]);
    let mut seg = InlineHdr::new(200).as_bytes().to_vec();
    seg.resize(16, 7);
    p.send(SendOpcode::SEND, SIG, [0; 4], &seg);
    let ca = drain(&mut p.cqa);
    assert_eq!(ca.len(), 1);
    assert_eq!(ca[0].syndrome, Syndrome::LOCAL_LENGTH.0, "{ca:?}");
    assert!(drain(&mut p.cqb).is_empty(), "nothing sent");

    // Zero byte count in a pointer segment after an inline one.
    let mut p = pair(RC, Knobs::default());
    p.qb.post_recv(&[(p.mb.0.addr(), 4096, p.mb.1)]);
    let segs = [Seg::Inline(vec![1, 2, 3]), Seg::Pointer(0, 0)];
    p.send(
        SendOpcode::SEND,
        SIG,
        [0; 4],
        &encode(&segs, (p.ma.0.addr(), p.ma.1)),
    );
    let ca = drain(&mut p.cqa);
    assert_eq!(ca[0].syndrome, Syndrome::LOCAL_PROT.0, "{ca:?}");

    // UD: inline + pointers beyond the 4096-byte MTU.
    let mut p = pair(UD, Knobs::default());
    let dlid = p.emu.hca_info(1).expect("hca 1").lid;
    p.qb.post_recv(&[(p.mb.0.addr(), 8192, p.mb.1)]);
    let segs = [
        Seg::Inline(vec![9; 16]),
        Seg::Pointer(0, 4096),
        Seg::Pointer(4096, 16),
    ];
    let wqe = [
        ud_av(p.qb.qpn, dlid, 0x1111_1111),
        encode(&segs, (p.ma.0.addr(), p.ma.1)),
    ]
    .concat();
    p.send(SendOpcode::SEND, SIG, [0; 4], &wqe);
    let ca = drain(&mut p.cqa);
    assert_eq!(ca[0].syndrome, Syndrome::LOCAL_LENGTH.0, "{ca:?}");
    assert!(drain(&mut p.cqb).is_empty());

    // Zero-length inline segments, before, between and after pointers: nothing of them.
    let mut p = pair(RC, Knobs::default());
    p.ma.0.write(0, b"abcdefgh");
    p.qb.post_recv(&[(p.mb.0.addr(), 4096, p.mb.1)]);
    let segs = [
        Seg::Inline(Vec::new()),
        Seg::Pointer(0, 4),
        Seg::Inline(Vec::new()),
        Seg::Pointer(4, 4),
        Seg::Inline(Vec::new()),
    ];
    p.send(
        SendOpcode::SEND,
        SIG,
        [0; 4],
        &encode(&segs, (p.ma.0.addr(), p.ma.1)),
    );
    let ca = drain(&mut p.cqa);
    assert_eq!(ca[0].syndrome, 0, "{ca:?}");
    let cb = drain(&mut p.cqb);
    assert_eq!(cb[0].byte_cnt, 8);
    assert_eq!(p.mb.0.read(0, 8), b"abcdefgh");
    // A SEND of one zero-length inline segment: an empty message.
    p.qb.post_recv(&[(p.mb.0.addr(), 4096, p.mb.1)]);
    p.send(
        SendOpcode::SEND,
        SIG,
        [0; 4],
        &encode(&[Seg::Inline(Vec::new())], (0, 0)),
    );
    assert_eq!(drain(&mut p.cqa)[0].syndrome, 0);
    assert_eq!(drain(&mut p.cqb)[0].byte_cnt, 0);
}
