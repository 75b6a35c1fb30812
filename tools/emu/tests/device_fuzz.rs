//! Device-side fuzzing: random WQEs (random opcodes, segment bytes, lengths and offsets
//! around real MRs, random keys) must never crash the device nor touch memory outside the
//! registered regions; QPs that fall into the error state are reset and reused.

mod common;

use common::*;
use mlx5_hw::opcodes::SendOpcode;
use mlx5_hw::wqe::{DataSeg, RaddrSeg};
use zerocopy::IntoBytes;

const CANARY: u8 = 0x5A;

fn reset_and_reconnect(p: &mut Pair, k: Knobs) {
    for (ctx, qp, cq) in [(&p.a, &mut p.qa, &mut p.cqa), (&p.b, &mut p.qb, &mut p.cqb)] {
        reset_qp(ctx, qp);
        drain(cq);
    }
    let (qa, qb) = (p.qa.qpn, p.qb.qpn);
    bring_up(&p.a, &p.qa, 2, qb, k);
    bring_up(&p.b, &p.qb, 1, qa, k);
}

#[test]
fn random_wqes_never_escape_the_registered_regions() {
    let k = Knobs {
        timeout: 1,
        retry_cnt: 1,
        rnr_retry: 1,
        min_rnr_timer: 1,
        access: ALL_ACCESS,
    };
    let mut p = pair(RC, k);
    // Guarded regions on both sides: MR = middle page of three, outer pages are canaries.
    let ga = Buf::new(3 * 4096);
    let gb = Buf::new(3 * 4096);
    for g in [&ga, &gb] {
        g.write(0, &[CANARY; 4096]);
        g.write(2 * 4096, &[CANARY; 4096]);
    }
    let (_, la, _) =
        p.a.reg_mr(p.pda, ga.addr() + 4096, 4096, ALL_ACCESS)
            .unwrap();
    let (_, lb, rb) =
        p.b.reg_mr(p.pdb, gb.addr() + 4096, 4096, ALL_ACCESS)
            .unwrap();
    let mut rng = Rng(0xDEAD_BEEF_1234_5678);
    let opcodes = [
        0x00u8, 0x01, 0x08, 0x09, 0x0A, 0x0B, 0x10, 0x11, 0x12, 0x14, 0x15, 0x25, 0x3F,
    ];
    let mut errors = 0;
    for round in 0..3000u32 {
        // Receives with random offsets/lengths around b's MR.
        if rng.below(2) == 0 {
            let off = rng.below(3 * 4096) as i64 - 4096;
            let len = rng.below(6000) as u32;
            let key = if rng.below(8) == 0 {
                rng.next() as u32
            } else {
                lb
            };
            p.qb.post_recv(&[((gb.addr() as i64 + 4096 + off) as u64, len, key)]);
        }
        let op = opcodes[rng.below(opcodes.len() as u64) as usize];
        let off = rng.below(3 * 4096) as i64 - 4096;
        let len = rng.below(6000) as u32;
        let lkey = if rng.below(8) == 0 {
            rng.next() as u32
        } else {
            la
        };
        let rkey = if rng.below(8) == 0 {
            rng.next() as u32
        } else {
            rb
        };
        let raddr = (gb.addr() as i64 + 4096 + rng.below(3 * 4096) as i64 - 4096) as u64;
        let local = (ga.addr() as i64 + 4096 + off) as u64;
        let mut segs = Vec::new();
        if matches!(op, 0x08..=0x15) {
            segs.extend_from_slice(RaddrSeg::new(raddr, rkey).as_bytes());
        }
        if matches!(op, 0x11 | 0x12 | 0x14 | 0x15) {
            segs.extend((0..16).map(|_| rng.next() as u8));
        }
        segs.extend_from_slice(DataSeg::new(len, lkey, local).as_bytes());
        if rng.below(4) == 0 {
            // Garbage tail segment.
            segs.extend((0..16).map(|_| rng.next() as u8));
        }
        let fm = (rng.next() as u8) & 0xEE;
        let opmod = if rng.below(2) == 0 {
            0
        } else {
            0x08 | (rng.next() as u8 & 1)
        };
        let i =
            p.qa.build_send(SendOpcode(op), opmod, fm | 0x08, [1, 2, 3, 4], &segs);
        let ring = if rng.below(3) == 0 {
            Ring::BlueFlame
        } else {
            Ring::Doorbell
        };
        p.qa.ring(&p.a, i, ring);
        p.emu.run_until_idle();
        let ca = drain(&mut p.cqa);
        drain(&mut p.cqb);
        if ca.iter().any(|c| c.opcode == 13) || round % 97 == 0 {
            errors += usize::from(ca.iter().any(|c| c.opcode == 13));
            reset_and_reconnect(&mut p, k);
        }
    }
    for g in [&ga, &gb] {
        assert!(
            g.read(0, 4096).iter().all(|&b| b == CANARY),
            "memory before an MR was touched"
        );
        assert!(
            g.read(2 * 4096, 4096).iter().all(|&b| b == CANARY),
            "memory after an MR was touched"
        );
    }
    assert!(errors > 100, "the fuzzer did provoke errors ({errors})");
    let c = p.emu.counters(0);
    assert!(c.wqes_executed > 1000);
}
