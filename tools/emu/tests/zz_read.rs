//! The UDP fabric: two emulators (as two processes would have) talk RoCEv2 over loopback,
//! and a pcap capture records the packets.

mod common;

use common::*;
use mlx5_emu::{EmuConfig, Emulator, Fabric, RunMode};
use mlx5_hw::opcodes::SendOpcode;
use mlx5_hw::wqe::{DataSeg, FM_CE_SE_CQ_UPDATE, RaddrSeg};
use zerocopy::IntoBytes;

fn node(pcap: Option<std::path::PathBuf>) -> Emulator {
    Emulator::new(EmuConfig {
        mode: RunMode::Stepped,
        fabric: Fabric::Udp,
        pcap,
        ..EmuConfig::default()
    })
}

fn settle(a: &Emulator, b: &Emulator) {
    let mut idle = 0;
    for _ in 0..100_000 {
        let n = a.step() + b.step();
        idle = if n == 0 { idle + 1 } else { 0 };
        if idle > 20 {
            return;
        }
    }
}

#[test]
fn zz_read() {
    let (ea, eb) = (node(None), node(None));
    let (ia, ib) = (ea.hca_info(0).unwrap(), eb.hca_info(0).unwrap());
    let mut a = Ctx::open(&ea, 0);
    let mut b = Ctx::open(&eb, 0);
    let (pda, pdb) = (a.alloc_pd(), b.alloc_pd());
    let mut cqa = a.create_cq(16, 64, -1);
    let mut qa = a.create_qp(pda, &cqa, &cqa, RC, 16, 8, None);
    let cqb = b.create_cq(16, 64, -1);
    let qb = b.create_qp(pdb, &cqb, &cqb, RC, 16, 8, None);
    let size: usize = std::env::var("SIZE").ok().and_then(|v| v.parse().ok()).unwrap_or(8 << 20);
    let src = Buf::new(size);
    let dst = Buf::new(size);
    let pattern: Vec<u8> = (0..size).map(|i| (i % 253) as u8).collect();
    src.write(0, &pattern);
    let (_, ls, _) = a.reg_mr(pda, src.addr(), size as u64, ALL_ACCESS).unwrap();
    let (_, _, rd) = b.reg_mr(pdb, dst.addr(), size as u64, ALL_ACCESS).unwrap();
    bring_up(&a, &qa, ib.lid, qb.qpn, Knobs::default());
    bring_up(&b, &qb, ia.lid, qa.qpn, Knobs::default());
    let segs = [
        RaddrSeg::new(dst.addr(), rd).as_bytes(),
        DataSeg::new(size as u32, ls, src.addr()).as_bytes(),
    ]
    .concat();
    let i = qa.build_send(SendOpcode::RDMA_READ, 0, FM_CE_SE_CQ_UPDATE, [0; 4], &segs);
    qa.ring(&a, i, Ring::Doorbell);
    settle(&ea, &eb);
    let ca = drain(&mut cqa);
    assert_eq!(
        (ca.len(), ca[0].opcode, ca[0].byte_cnt),
        (1, 0, size as u32)
    );
    println!("data ok: {}", dst.read(0, size) == pattern);
    println!("{:?}\n{:?}", ea.counters(0), eb.counters(0));
}
