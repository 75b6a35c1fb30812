//! The seeded fault campaign: RC under drop, duplication, reordering and corruption, every
//! opcode mixed (SEND, SEND_IMM, SEND_INV, WRITE, WRITE_IMM, READ, CAS, FETCH_ADD), sizes up to 16 KiB at
//! path MTU 256, on the stepped emulator with WQEs built by hand. Every WR must complete
//! exactly once, in WQE order, successfully, with the right bytes at both ends, and every
//! atomic must be applied exactly once.

mod common;

use std::collections::VecDeque;

use common::*;
use mlx5_emu::{EmuConfig, Emulator, FaultConfig, RunMode};
use mlx5_hw::opcodes::SendOpcode;
use mlx5_hw::wqe::{AtomicSeg, DataSeg, FM_CE_SE_CQ_UPDATE, RaddrSeg};
use zerocopy::IntoBytes;

/// The largest message.
const MAX_LEN: usize = 16 * 1024;
/// Slots of `MAX_LEN` bytes: sources and READ targets at A, WRITE targets at B.
const SLOTS: usize = 32;
/// Receive WQEs (each with a `MAX_LEN` buffer) at B.
const RQ: usize = 64;
/// WRs in flight at most.
const WINDOW: usize = 16;
/// B's READ source (a fixed pattern) and its atomic words follow its slots.
const READ_SRC: usize = SLOTS * MAX_LEN;
const FA_WORD: usize = READ_SRC + 4 * MAX_LEN;
const CAS_WORD: usize = FA_WORD + 64;
const B_LEN: usize = CAS_WORD + 4096;

/// The byte `j` of message `wr` (every message has its own content).
fn byte(wr: u64, j: usize) -> u8 {
    let x = (wr.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 24) as usize;
    (x.wrapping_add(j.wrapping_mul(131)) ^ (j >> 8)) as u8
}

fn message(wr: u64, len: usize) -> Vec<u8> {
    (0..len).map(|j| byte(wr, j)).collect()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Send,
    SendImm,
    SendInv,
    Write,
    WriteImm,
    Read,
    Cas,
    FetchAdd,
}

/// What a posted WR must produce.
#[derive(Debug)]
struct Expect {
    wr: u64,
    idx: u16,
    kind: Kind,
    len: usize,
    slot: usize,
    /// READ: offset in B's READ source. Atomics: the value they must return.
    arg: u64,
}

struct Rig {
    emu: Emulator,
    a: Ctx,
    b: Ctx,
    qa: Qp,
    qb: Qp,
    cqa: Cq,
    cqb: Cq,
    ma: (Buf, u32),
    mb: (Buf, u32, u32),
    /// B's receive buffers and their lkey.
    rq: (Buf, u32),
}

fn rig(fault: FaultConfig, corrupt_ppm: u32) -> Rig {
    let emu = Emulator::new(EmuConfig {
        num_hcas: 2,
        mode: RunMode::Stepped,
        fault,
        corrupt_ppm,
        ..EmuConfig::default()
    });
    let mut a = Ctx::open(&emu, 0);
    let mut b = Ctx::open(&emu, 1);
    let pda = a.alloc_pd();
    let pdb = b.alloc_pd();
    let cqa = a.create_cq(1024, 64, -1);
    let cqb = b.create_cq(1024, 64, -1);
    let qa = a.create_qp(pda, &cqa, &cqa, RC, 256, RQ as u32, None);
    let qb = b.create_qp(pdb, &cqb, &cqb, RC, 256, RQ as u32, None);
    let bufa = Buf::new(SLOTS * MAX_LEN);
    let bufb = Buf::new(B_LEN);
    let (_, la, _) = a
        .reg_mr(pda, bufa.addr(), bufa.len as u64, ALL_ACCESS)
        .expect("mr a");
    let (_, lb, rb) = b
        .reg_mr(pdb, bufb.addr(), bufb.len as u64, ALL_ACCESS)
        .expect("mr b");
    let rbuf = Buf::new(RQ * MAX_LEN);
    let k = Knobs {
        timeout: 6,
        retry_cnt: 7,
        rnr_retry: 7,
        min_rnr_timer: 1,
        access: ALL_ACCESS,
    };
    for (ctx, qp, peer, dqpn) in [(&a, &qa, 1, qb.qpn), (&b, &qb, 0, qa.qpn)] {
        to_init(ctx, qp, ALL_ACCESS);
        let lid = emu.hca_info(peer).expect("hca").lid;
        let mut m = rtr_modify(qp, lid, dqpn, k);
        m.path_mtu = 1; // 256 bytes
        ctx.modify(&m).expect("RTR");
        to_rts(ctx, qp, k);
    }
    // B's receive buffers live in a region of their own, registered on B.
    let (_, lr, _) = b
        .reg_mr(pdb, rbuf.addr(), rbuf.len as u64, LOCAL_WRITE)
        .expect("mr recv");
    bufb.write(READ_SRC, &message(u64::MAX, 4 * MAX_LEN));
    bufb.write(FA_WORD, &0u64.to_ne_bytes());
    bufb.write(CAS_WORD, &0u64.to_ne_bytes());
    let mut r = Rig {
        emu,
        a,
        b,
        qa,
        qb,
        cqa,
        cqb,
        ma: (bufa, la),
        mb: (bufb, lb, rb),
        rq: (rbuf, lr),
    };
    for _ in 0..RQ {
        post_recv(&mut r);
    }
    r
}

/// Post one receive WQE with its `MAX_LEN` buffer (slot = its counter modulo `RQ`).
fn post_recv(r: &mut Rig) {
    let at = r.rq.0.addr() + (r.qb.rq_pi as usize % RQ * MAX_LEN) as u64;
    r.qb.post_recv(&[(at, MAX_LEN as u32, r.rq.1)]);
}

/// Run one seed: `n` WRs of the mix. Panics with the seed and WR on any deviation.
fn run(
    seed: u64,
    n: u64,
    fault: FaultConfig,
    corrupt_ppm: u32,
) -> (mlx5_emu::Counters, mlx5_emu::Counters) {
    let mut r = rig(FaultConfig { seed, ..fault }, corrupt_ppm);
    let mut rng = Rng(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1);
    let mut pending: VecDeque<Expect> = VecDeque::new();
    // Messages B must receive, in order: (wr, kind, len, slot).
    let mut inbound: VecDeque<(u64, Kind, usize, usize)> = VecDeque::new();
    let (mut posted, mut fa_value, mut cas_value) = (0u64, 0u64, 0u64);
    let mut fa_count = 0u64;
    let mut stalls = 0;
    while posted < n || !pending.is_empty() {
        while posted < n && pending.len() < WINDOW {
            let wr = posted;
            let kind = match rng.below(16) {
                0 | 1 => Kind::Send,
                2 | 3 => Kind::SendImm,
                4 => Kind::SendInv,
                5 => Kind::Write,
                6..=8 => Kind::WriteImm,
                9..=11 => Kind::Read,
                12 | 13 => Kind::Cas,
                _ => Kind::FetchAdd,
            };
            let e = rng.below(15) as u32;
            let len = ((1usize << e) + rng.pick(1 << e)).clamp(1, MAX_LEN);
            let slot = (wr as usize) % SLOTS;
            let la = r.ma.0.addr() + (slot * MAX_LEN) as u64;
            let imm = (wr as u32).to_be_bytes();
            let (op, segs, arg, len) = match kind {
                Kind::Send | Kind::SendImm | Kind::SendInv => {
                    r.ma.0.write(slot * MAX_LEN, &message(wr, len));
                    let op = match kind {
                        Kind::Send => SendOpcode::SEND,
                        Kind::SendImm => SendOpcode::SEND_IMM,
                        _ => SendOpcode::SEND_INVAL,
                    };
                    let seg = DataSeg::new(len as u32, r.ma.1, la);
                    (op, seg.as_bytes().to_vec(), 0, len)
                }
                Kind::Write | Kind::WriteImm => {
                    r.ma.0.write(slot * MAX_LEN, &message(wr, len));
                    let ra = r.mb.0.addr() + (slot * MAX_LEN) as u64;
                    let segs = [
                        RaddrSeg::new(ra, r.mb.2).as_bytes(),
                        DataSeg::new(len as u32, r.ma.1, la).as_bytes(),
                    ]
                    .concat();
                    let op = if kind == Kind::Write {
                        SendOpcode::RDMA_WRITE
                    } else {
                        SendOpcode::RDMA_WRITE_IMM
                    };
                    (op, segs, 0, len)
                }
                Kind::Read => {
                    r.ma.0.write(slot * MAX_LEN, &vec![0xEE; len]);
                    let off = rng.pick(3 * MAX_LEN);
                    let ra = r.mb.0.addr() + (READ_SRC + off) as u64;
                    let segs = [
                        RaddrSeg::new(ra, r.mb.2).as_bytes(),
                        DataSeg::new(len as u32, r.ma.1, la).as_bytes(),
                    ]
                    .concat();
                    (SendOpcode::RDMA_READ, segs, off as u64, len)
                }
                Kind::Cas | Kind::FetchAdd => {
                    r.ma.0.write(slot * MAX_LEN, &[0xEE; 8]);
                    let (op, word, seg, expect) = if kind == Kind::Cas {
                        let s = AtomicSeg::new(cas_value + 1, cas_value);
                        cas_value += 1;
                        (SendOpcode::ATOMIC_CS, CAS_WORD, s, cas_value - 1)
                    } else {
                        let add = 1 + rng.below(1000);
                        let s = AtomicSeg::new(add, 0);
                        fa_value += add;
                        fa_count += 1;
                        (SendOpcode::ATOMIC_FA, FA_WORD, s, fa_value - add)
                    };
                    let ra = r.mb.0.addr() + word as u64;
                    let segs = [
                        RaddrSeg::new(ra, r.mb.2).as_bytes(),
                        seg.as_bytes(),
                        DataSeg::new(8, r.ma.1, la).as_bytes(),
                    ]
                    .concat();
                    (op, segs, expect, 8)
                }
            };
            let idx = r.qa.build_send(op, 0, FM_CE_SE_CQ_UPDATE, imm, &segs);
            r.qa.ring(&r.a, idx, Ring::Doorbell);
            if matches!(
                kind,
                Kind::Send | Kind::SendImm | Kind::SendInv | Kind::WriteImm
            ) {
                inbound.push_back((wr, kind, len, slot));
            }
            pending.push_back(Expect {
                wr,
                idx,
                kind,
                len,
                slot,
                arg,
            });
            posted += 1;
        }
        let work = r.emu.run_until_idle();
        // Requester completions: exactly the next pending WR, successful, right data.
        let mut got = 0;
        while let Some((d, _)) = r.cqa.poll() {
            let c = decode(&d);
            let x = pending
                .pop_front()
                .unwrap_or_else(|| panic!("seed {seed}: extra completion {c:?}"));
            got += 1;
            assert_eq!(
                (c.opcode, c.wqe_counter),
                (0, x.idx),
                "seed {seed}: WR {} ({:?}, {} B) completed as {c:?}",
                x.wr,
                x.kind,
                x.len
            );
            let at = x.slot * MAX_LEN;
            match x.kind {
                Kind::Write => assert!(
                    r.mb.0.read(at, x.len) == message(x.wr, x.len),
                    "seed {seed}: WRITE WR {} of {} B placed its bytes",
                    x.wr,
                    x.len
                ),
                Kind::Read => {
                    let want =
                        &message(u64::MAX, 4 * MAX_LEN)[x.arg as usize..x.arg as usize + x.len];
                    assert!(
                        r.ma.0.read(at, x.len) == want,
                        "seed {seed}: READ WR {} of {} B returned wrong bytes",
                        x.wr,
                        x.len
                    );
                }
                Kind::Cas | Kind::FetchAdd => assert_eq!(
                    r.ma.0.read(at, 8),
                    x.arg.to_ne_bytes(),
                    "seed {seed}: {:?} WR {} returned the wrong original value",
                    x.kind,
                    x.wr
                ),
                _ => {}
            }
        }
        // Responder completions: the inbound messages, in order, once each.
        while let Some((d, _)) = r.cqb.poll() {
            let c = decode(&d);
            let (wr, kind, len, slot) = inbound
                .pop_front()
                .unwrap_or_else(|| panic!("seed {seed}: extra receive completion {c:?}"));
            let want_op = match kind {
                Kind::WriteImm => 1,
                Kind::Send => 2,
                Kind::SendImm => 3,
                _ => 4,
            };
            assert_eq!(
                (c.opcode, c.byte_cnt as usize),
                (want_op, len),
                "seed {seed}: receive of WR {wr} ({kind:?}): {c:?}"
            );
            if kind != Kind::Send {
                assert_eq!(c.imm, (wr as u32).to_be_bytes(), "seed {seed}: WR {wr}");
            }
            let data = if kind == Kind::WriteImm {
                r.mb.0.read(slot * MAX_LEN, len)
            } else {
                r.rq.0.read(c.wqe_counter as usize % RQ * MAX_LEN, len)
            };
            assert!(
                data == message(wr, len),
                "seed {seed}: WR {wr} ({kind:?}, {len} B) arrived with wrong bytes"
            );
            post_recv(&mut r);
        }
        stalls = if got == 0 && work == 0 { stalls + 1 } else { 0 };
        assert!(
            stalls < 3,
            "seed {seed}: no progress with {} WRs pending, first {:?}",
            pending.len(),
            pending.front()
        );
    }
    assert!(
        inbound.is_empty(),
        "seed {seed}: undelivered {:?}",
        inbound.front()
    );
    assert_eq!(
        r.mb.0.read(FA_WORD, 8),
        fa_value.to_ne_bytes(),
        "seed {seed}: {fa_count} fetch-adds applied exactly once"
    );
    assert_eq!(
        r.mb.0.read(CAS_WORD, 8),
        cas_value.to_ne_bytes(),
        "seed {seed}"
    );
    let _ = (&r.b, &r.qb);
    (r.emu.counters(0), r.emu.counters(1))
}

const SEEDS: u64 = 10;
const WRS: u64 = 2000;

fn campaign(name: &str, fault: FaultConfig, corrupt_ppm: u32) {
    let (mut injected, mut recovered) = (0, 0);
    for seed in 1..=SEEDS {
        let (ca, cb) = run(seed, WRS, fault, corrupt_ppm);
        injected += ca.packets_dropped + cb.packets_dropped + cb.duplicate_request;
        recovered += ca.local_ack_timeout_err + ca.packet_seq_err + cb.out_of_sequence;
    }
    eprintln!(
        "{name}: {SEEDS} seeds x {WRS} WRs; drops+duplicates {injected}, recoveries {recovered}"
    );
    assert!(injected > 0, "{name}: the faults happened");
    if fault.drop_ppm > 0 || fault.reorder_ppm > 0 || corrupt_ppm > 0 {
        assert!(recovered > 0, "{name}: losses were recovered");
    }
}

#[test]
fn no_faults_baseline() {
    let (ca, cb) = run(7, WRS, FaultConfig::default(), 0);
    assert_eq!(ca.packets_dropped + cb.packets_dropped, 0);
    assert_eq!(ca.local_ack_timeout_err, 0, "no timeout on a clean fabric");
}

const PPM: u32 = 10_000; // 1%

#[test]
fn drop5_dup1_reorder1() {
    let f = FaultConfig {
        drop_ppm: 5 * PPM,
        dup_ppm: PPM,
        reorder_ppm: PPM,
        ..Default::default()
    };
    campaign("5% drop + 1% dup + 1% reorder", f, 0);
}

#[test]
fn one_percent_of_each() {
    let f = FaultConfig {
        drop_ppm: PPM,
        dup_ppm: PPM,
        reorder_ppm: PPM,
        ..Default::default()
    };
    campaign("1% of each", f, PPM);
}

#[test]
fn duplication_20() {
    let f = FaultConfig {
        dup_ppm: 20 * PPM,
        ..Default::default()
    };
    campaign("20% duplication", f, 0);
}

#[test]
fn reordering_20() {
    let f = FaultConfig {
        reorder_ppm: 20 * PPM,
        ..Default::default()
    };
    campaign("20% reordering", f, 0);
}

#[test]
fn corruption_1() {
    campaign("1% corruption", FaultConfig::default(), PPM);
}
