//! UC and UD under the campaign's faults keep their own semantics: UC delivers each
//! message whole or not at all (a lost packet drops the message), never twice, in order; UD
//! delivers each datagram intact or not at all. The sender completes every WR at once, in
//! order.

mod common;

use common::*;
use mlx5_emu::{EmuConfig, Emulator, FaultConfig, RunMode};
use mlx5_hw::opcodes::SendOpcode;
use mlx5_hw::wqe::{DataSeg, FM_CE_SE_CQ_UPDATE, RaddrSeg};
use zerocopy::IntoBytes;

const RQ: usize = 64;
const SLOT: usize = 4096;

fn byte(wr: u32, j: usize) -> u8 {
    (wr.wrapping_mul(2_654_435_761) >> 13) as u8 ^ (j as u8).wrapping_mul(7) ^ (j >> 8) as u8
}

fn faulty(qp_type: u8, seed: u64, fault: FaultConfig, corrupt_ppm: u32) -> Pair {
    let emu = Emulator::new(EmuConfig {
        num_hcas: 2,
        mode: RunMode::Stepped,
        fault: FaultConfig { seed, ..fault },
        corrupt_ppm,
        ..EmuConfig::default()
    });
    pair_in(emu, qp_type, Knobs::default(), 64, 1024, RQ as u32)
}

/// Send `n` messages (SEND_IMM or, on UC, also WRITE_IMM; up to `max` bytes) from a to b
/// under `fault`; returns (delivered WR numbers in delivery order, messages sent).
fn run(qp_type: u8, seed: u64, n: u32, max: usize, fault: FaultConfig, corrupt: u32) -> Vec<u32> {
    let mut p = faulty(qp_type, seed, fault, corrupt);
    let rbuf = Buf::new(RQ * SLOT);
    let (_, rl, _) =
        p.b.reg_mr(p.pdb, rbuf.addr(), rbuf.len as u64, LOCAL_WRITE)
            .expect("recv mr");
    for _ in 0..RQ {
        let at = rbuf.addr() + (p.qb.rq_pi as usize % RQ * SLOT) as u64;
        p.qb.post_recv(&[(at, SLOT as u32, rl)]);
    }
    let mut rng = Rng(seed | 1);
    let mut sent = Vec::new();
    let mut delivered = Vec::new();
    let dlid = p.emu.hca_info(1).unwrap().lid;
    for wr in 0..n {
        let len = 1 + rng.pick(max);
        let slot = wr as usize % 4;
        let data: Vec<u8> = (0..len).map(|j| byte(wr, j)).collect();
        p.ma.0.write(slot * SLOT, &data);
        let local = DataSeg::new(len as u32, p.ma.1, p.ma.0.addr() + (slot * SLOT) as u64);
        let write = qp_type == UC && rng.below(2) == 0;
        let (op, segs) = if qp_type == UD {
            let av = ud_av(p.qb.qpn, dlid, 0x1111_1111);
            (SendOpcode::SEND_IMM, [&av[..], local.as_bytes()].concat())
        } else if write {
            let r = RaddrSeg::new(p.mb.0.addr() + (slot * SLOT) as u64, p.mb.2);
            (
                SendOpcode::RDMA_WRITE_IMM,
                [r.as_bytes(), local.as_bytes()].concat(),
            )
        } else {
            (SendOpcode::SEND_IMM, local.as_bytes().to_vec())
        };
        let idx =
            p.qa.build_send(op, 0, FM_CE_SE_CQ_UPDATE, wr.to_be_bytes(), &segs);
        p.qa.ring(&p.a, idx, Ring::Doorbell);
        p.emu.run_until_idle();
        let c = drain(&mut p.cqa);
        assert_eq!(c.len(), 1, "seed {seed} WR {wr}: {c:?}");
        assert_eq!(
            (c[0].opcode, c[0].wqe_counter),
            (0, idx),
            "seed {seed} WR {wr}"
        );
        sent.push((len, write));
        for c in drain(&mut p.cqb) {
            let got = u32::from_be_bytes(c.imm);
            assert!(got <= wr, "seed {seed}: delivered WR {got} never sent");
            let (len, write) = sent[got as usize];
            let grh = if qp_type == UD { 40 } else { 0 };
            assert_eq!(
                (c.opcode, c.byte_cnt as usize),
                (if write { 1 } else { 3 }, len + grh),
                "seed {seed}: WR {got}"
            );
            let at = if write {
                p.mb.0.read((got as usize % 4) * SLOT, len)
            } else {
                rbuf.read(c.wqe_counter as usize % RQ * SLOT + grh, len)
            };
            let want: Vec<u8> = (0..len).map(|j| byte(got, j)).collect();
            assert!(at == want, "seed {seed}: WR {got} ({len} B) arrived intact");
            delivered.push(got);
            let at = rbuf.addr() + (p.qb.rq_pi as usize % RQ * SLOT) as u64;
            p.qb.post_recv(&[(at, SLOT as u32, rl)]);
        }
    }
    delivered
}

const PROFILES: [(u32, u32, u32, u32); 5] = [
    (50_000, 10_000, 10_000, 0),
    (10_000, 10_000, 10_000, 10_000),
    (0, 200_000, 0, 0),
    (0, 0, 200_000, 0),
    (0, 0, 0, 10_000),
];

fn fault(p: (u32, u32, u32, u32)) -> (FaultConfig, u32) {
    let f = FaultConfig {
        drop_ppm: p.0,
        dup_ppm: p.1,
        reorder_ppm: p.2,
        ..Default::default()
    };
    (f, p.3)
}

#[test]
fn uc_delivers_whole_messages_once_in_order_or_drops_them() {
    for (k, &prof) in PROFILES.iter().enumerate() {
        let (f, corrupt) = fault(prof);
        let mut lost = 0;
        for seed in 1..=4u64 {
            let n = 400;
            let d = run(UC, seed * 10 + k as u64, n, 4096, f, corrupt);
            assert!(
                d.windows(2).all(|w| w[0] < w[1]),
                "profile {k} seed {seed}: in order, never twice: {d:?}"
            );
            lost += n as usize - d.len();
        }
        if prof.0 > 0 || prof.3 > 0 {
            assert!(lost > 0, "profile {k}: losses dropped messages");
        }
    }
}

#[test]
fn ud_delivers_intact_datagrams_or_drops_them() {
    for (k, &prof) in PROFILES.iter().enumerate() {
        let (f, corrupt) = fault(prof);
        for seed in 1..=4u64 {
            let n = 400;
            let d = run(UD, seed * 10 + k as u64, n, 256, f, corrupt);
            if prof.1 == 0 && prof.2 == 0 {
                assert!(d.windows(2).all(|w| w[0] < w[1]), "profile {k}: {d:?}");
            }
            if prof.1 == 0 {
                assert!(d.len() <= n as usize, "profile {k}: no datagram twice");
            }
            assert!(!d.is_empty());
        }
    }
}
