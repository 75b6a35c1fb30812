//! RC transport under packet faults: drops, duplicates and reordering from a seed must not
//! change what the application sees (in-order, exactly-once delivery and completions).

mod common;

use common::*;
use mlx5_emu::{EmuConfig, Emulator, FaultConfig, RunMode};
use mlx5_hw::opcodes::SendOpcode;
use mlx5_hw::wqe::{AtomicSeg, DataSeg, FM_CE_SE_CQ_UPDATE, RaddrSeg};
use zerocopy::IntoBytes;

fn faulty_pair(seed: u64) -> Pair {
    let emu = Emulator::new(EmuConfig {
        num_hcas: 2,
        mode: RunMode::Stepped,
        fault: FaultConfig {
            seed,
            drop_ppm: 150_000,
            dup_ppm: 100_000,
            reorder_ppm: 100_000,
            delay_ns: 0,
        },
        corrupt_ppm: 50_000,
        ..EmuConfig::default()
    });
    let k = Knobs {
        timeout: 1,
        retry_cnt: 7,
        rnr_retry: 7,
        min_rnr_timer: 1,
        access: ALL_ACCESS,
    };
    pair_in(emu, RC, k, 64, 256, 64)
}

#[test]
fn rc_delivers_in_order_exactly_once_despite_faults() {
    for seed in [1u64, 2, 3] {
        let mut p = faulty_pair(seed);
        let n = 40usize;
        for i in 0..n {
            p.qb.post_recv(&[(p.mb.0.addr() + i as u64 * 64, 64, p.mb.1)]);
            p.ma.0.write(i * 64, &[i as u8; 32]);
        }
        let mut posted = 0;
        let mut done = 0;
        // Keep at most 16 in flight (the SQ has 64 WQEBBs).
        while done < n {
            while posted < n && posted - done < 16 {
                let seg = DataSeg::new(32, p.ma.1, p.ma.0.addr() + posted as u64 * 64);
                let i = p.qa.build_send(
                    SendOpcode::SEND,
                    0,
                    FM_CE_SE_CQ_UPDATE,
                    [0; 4],
                    seg.as_bytes(),
                );
                p.qa.ring(&p.a, i, Ring::Doorbell);
                posted += 1;
            }
            p.emu.run_until_idle();
            let c = drain(&mut p.cqa);
            assert!(c.iter().all(|c| c.opcode == 0), "seed {seed}: {c:?}");
            done += c.len();
        }
        let cb = drain(&mut p.cqb);
        assert_eq!(
            cb.len(),
            n,
            "seed {seed}: each message delivered exactly once"
        );
        for (i, c) in cb.iter().enumerate() {
            assert_eq!(c.wqe_counter as usize, i, "seed {seed}: in order");
            assert_eq!(p.mb.0.read(i * 64, 32), vec![i as u8; 32]);
        }
        // An atomic under the same faults executes at most once.
        p.mb.0.write(8192, &0u64.to_ne_bytes());
        for k in 0..10u64 {
            let segs = [
                RaddrSeg::new(p.mb.0.addr() + 8192, p.mb.2).as_bytes(),
                AtomicSeg::new(1, 0).as_bytes(),
                DataSeg::new(8, p.ma.1, p.ma.0.addr() + 8192 + k * 8).as_bytes(),
            ]
            .concat();
            p.send(SendOpcode::ATOMIC_FA, FM_CE_SE_CQ_UPDATE, [0; 4], &segs);
        }
        assert_eq!(drain(&mut p.cqa).len(), 10);
        assert_eq!(
            p.mb.0.read(8192, 8),
            10u64.to_ne_bytes(),
            "seed {seed}: at-most-once atomics"
        );
        let ca = p.emu.counters(0);
        let cb = p.emu.counters(1);
        assert!(
            ca.packets_dropped + cb.packets_dropped > 0,
            "seed {seed}: faults were injected"
        );
        assert!(
            ca.local_ack_timeout_err + ca.packet_seq_err > 0,
            "seed {seed}: recovery happened"
        );
        assert!(cb.duplicate_request + cb.out_of_sequence > 0, "seed {seed}");
    }
}

#[test]
fn same_seed_same_history() {
    let run = |seed| {
        let mut p = faulty_pair(seed);
        for i in 0..10u64 {
            p.qb.post_recv(&[(p.mb.0.addr() + i * 64, 64, p.mb.1)]);
            let seg = DataSeg::new(16, p.ma.1, p.ma.0.addr());
            let w = p.qa.build_send(
                SendOpcode::SEND,
                0,
                FM_CE_SE_CQ_UPDATE,
                [0; 4],
                seg.as_bytes(),
            );
            p.qa.ring(&p.a, w, Ring::Doorbell);
        }
        p.emu.run_until_idle();
        (p.emu.counters(0), p.emu.counters(1))
    };
    assert_eq!(run(9), run(9));
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn messages_larger_than_the_mtu_travel_as_several_packets() {
    // Path MTU 1024 (bring_up sets 3): SEND 10000 B = 10 packets, WRITE_IMM 5000 B = 5,
    // READ 7000 B = 1 request + 7 responses.
    for qp_type in [RC, UC] {
        let mut p = pair(qp_type, Knobs::default());
        let (ba, la, bb, lb, rb) = (p.ma.0.addr(), p.ma.1, p.mb.0.addr(), p.mb.1, p.mb.2);
        p.ma.0.write(0, &pattern(10000, 1));
        p.qb.post_recv(&[(bb, 6000, lb), (bb + 8192, 6000, lb)]);
        p.send(
            SendOpcode::SEND,
            FM_CE_SE_CQ_UPDATE,
            [0; 4],
            DataSeg::new(10000, la, ba).as_bytes(),
        );
        let cb = drain(&mut p.cqb);
        assert_eq!((cb[0].opcode, cb[0].byte_cnt), (2, 10000), "{qp_type}");
        assert!(p.mb.0.read(0, 6000) == pattern(10000, 1)[..6000]);
        assert!(p.mb.0.read(8192, 4000) == pattern(10000, 1)[6000..]);
        assert_eq!(p.emu.counters(0).packets_sent, 10);
        assert_eq!(drain(&mut p.cqa).len(), 1);
        p.qb.post_recv(&[(bb, 64, lb)]);
        let segs = [
            RaddrSeg::new(bb + 16384 - 5000, rb).as_bytes(),
            DataSeg::new(5000, la, ba).as_bytes(),
        ]
        .concat();
        p.send(
            SendOpcode::RDMA_WRITE_IMM,
            FM_CE_SE_CQ_UPDATE,
            [4; 4],
            &segs,
        );
        let cb = drain(&mut p.cqb);
        assert_eq!((cb[0].opcode, cb[0].byte_cnt, cb[0].imm), (1, 5000, [4; 4]));
        assert!(p.mb.0.read(16384 - 5000, 5000) == pattern(10000, 1)[..5000]);
        assert_eq!(p.emu.counters(0).packets_sent, 15);
        if qp_type == RC {
            p.mb.0.write(0, &pattern(7000, 9));
            let segs = [
                RaddrSeg::new(bb, rb).as_bytes(),
                DataSeg::new(7000, la, ba + 2 * 4096).as_bytes(),
            ]
            .concat();
            p.send(SendOpcode::RDMA_READ, FM_CE_SE_CQ_UPDATE, [0; 4], &segs);
            let ca = drain(&mut p.cqa);
            assert_eq!(
                (ca.last().unwrap().send_op, ca.last().unwrap().byte_cnt),
                (0x10, 7000),
                "{ca:?}"
            );
            assert!(p.ma.0.read(2 * 4096, 7000) == pattern(7000, 9));
            // 10 SEND packets + 5 WRITE packets + ACKs; 7 READ responses from b.
            assert_eq!(p.emu.counters(0).packets_sent, 16);
            assert_eq!(p.emu.counters(1).packets_sent, 2 + 7);
        }
    }
}

#[test]
fn large_messages_survive_faults() {
    for seed in [4u64, 5] {
        let mut p = faulty_pair(seed);
        let (ba, la, bb, lb) = (p.ma.0.addr(), p.ma.1, p.mb.0.addr(), p.mb.1);
        for k in 0..6usize {
            p.ma.0.write(0, &pattern(3000, k as u8));
            p.qb.post_recv(&[(bb, 4096, lb)]);
            p.send(
                SendOpcode::SEND,
                FM_CE_SE_CQ_UPDATE,
                [0; 4],
                DataSeg::new(3000, la, ba).as_bytes(),
            );
            assert_eq!(drain(&mut p.cqa).len(), 1, "seed {seed} msg {k}");
            let cb = drain(&mut p.cqb);
            assert_eq!((cb.len(), cb[0].byte_cnt), (1, 3000), "seed {seed} msg {k}");
            assert!(
                p.mb.0.read(0, 3000) == pattern(3000, k as u8),
                "seed {seed} msg {k}"
            );
            // And a READ of the same size back.
            let segs = [
                RaddrSeg::new(bb, p.mb.2).as_bytes(),
                DataSeg::new(3000, la, ba + 8192).as_bytes(),
            ]
            .concat();
            p.send(SendOpcode::RDMA_READ, FM_CE_SE_CQ_UPDATE, [0; 4], &segs);
            assert_eq!(drain(&mut p.cqa).len(), 1);
            assert!(
                p.ma.0.read(8192, 3000) == pattern(3000, k as u8),
                "seed {seed} read {k}"
            );
        }
    }
}

#[test]
fn a_read_of_several_parts_survives_faults() {
    for seed in [6u64, 7] {
        let mut p = faulty_pair(seed);
        let size = 300 * 1024; // 300 response packets at the 1024-byte MTU: two READ parts
        let (src, dst) = (Buf::new(size), Buf::new(size));
        let data = pattern(size, 42);
        src.write(0, &data);
        let (_, _, rsrc) =
            p.b.reg_mr(p.pdb, src.addr(), size as u64, ALL_ACCESS)
                .unwrap();
        let (_, ldst, _) =
            p.a.reg_mr(p.pda, dst.addr(), size as u64, ALL_ACCESS)
                .unwrap();
        let segs = [
            RaddrSeg::new(src.addr(), rsrc).as_bytes(),
            DataSeg::new(size as u32, ldst, dst.addr()).as_bytes(),
        ]
        .concat();
        p.send(SendOpcode::RDMA_READ, FM_CE_SE_CQ_UPDATE, [0; 4], &segs);
        let ca = drain(&mut p.cqa);
        assert_eq!(
            (ca.len(), ca[0].opcode, ca[0].byte_cnt),
            (1, 0, size as u32),
            "seed {seed}"
        );
        assert!(
            dst.read(0, size) == data,
            "seed {seed}: every byte, in place"
        );
        let c = p.emu.counters(0);
        assert!(
            c.local_ack_timeout_err > 0
                || c.packets_dropped + p.emu.counters(1).packets_dropped > 0
        );
    }
}
