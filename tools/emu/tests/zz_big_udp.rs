mod common;
use common::*;
use mlx5_emu::{EmuConfig, Emulator, Fabric, RunMode};
use mlx5_hw::opcodes::SendOpcode;
use mlx5_hw::wqe::{DataSeg, FM_CE_SE_CQ_UPDATE, RaddrSeg};
use zerocopy::IntoBytes;

#[test]
fn big() {
    let mode = if std::env::var("THREADED").is_ok() { RunMode::Threaded } else { RunMode::Stepped };
    let mk = || Emulator::new(EmuConfig { mode, fabric: Fabric::Udp, ..EmuConfig::default() });
    let (ea, eb) = (mk(), mk());
    let (ia, ib) = (ea.hca_info(0).unwrap(), eb.hca_info(0).unwrap());
    let mut a = Ctx::open(&ea, 0);
    let mut b = Ctx::open(&eb, 0);
    let (pda, pdb) = (a.alloc_pd(), b.alloc_pd());
    let mut cqa = a.create_cq(16, 64, -1);
    let qa = a.create_qp(pda, &cqa, &cqa, RC, 16, 8, None);
    let cqb = b.create_cq(16, 64, -1);
    let qb = b.create_qp(pdb, &cqb, &cqb, RC, 16, 8, None);
    let size: usize = std::env::var("SIZE").ok().and_then(|v| v.parse().ok()).unwrap_or(8 << 20);
    let src = Buf::new(size);
    let dst = Buf::new(size);
    let (_, ls, _) = a.reg_mr(pda, src.addr(), size as u64, ALL_ACCESS).unwrap();
    let (_, _, rd) = b.reg_mr(pdb, dst.addr(), size as u64, ALL_ACCESS).unwrap();
    let mut k = Knobs::default();
    k.timeout = 14;
    let mut qa = qa;
    bring_up(&a, &qa, ib.lid, qb.qpn, k);
    bring_up(&b, &qb, ia.lid, qa.qpn, k);
    // path mtu: bring_up sets 3 (1024)
    let segs = [RaddrSeg::new(dst.addr(), rd).as_bytes(), DataSeg::new(size as u32, ls, src.addr()).as_bytes()].concat();
    let i = qa.build_send(SendOpcode::RDMA_WRITE, 0, FM_CE_SE_CQ_UPDATE, [0; 4], &segs);
    qa.ring(&a, i, Ring::Doorbell);
    let t0 = std::time::Instant::now();
    loop {
        if mode == RunMode::Stepped { ea.step(); eb.step(); }
        if let Some((d, _)) = cqa.poll() { println!("{:?} after {:?}", decode(&d), t0.elapsed()); break; }
        if t0.elapsed().as_secs() > 60 { panic!("stuck"); }
    }
    println!("A {:?}\nB {:?}", ea.counters(0), eb.counters(0));
}
