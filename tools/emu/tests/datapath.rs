//! End-to-end data path: WQEs built by hand with mlx5-hw, objects created with raw
//! commands, data verified in memory and CQEs checked field by field.

mod common;

use common::*;
use mlx5_hw::opcodes::SendOpcode;
use mlx5_hw::wqe::{
    AtomicSeg, DataSeg, DatagramSeg, FM_CE_SE_CQ_UPDATE, FM_CE_SE_SOLICITED, InlineHdr, RaddrSeg,
};
use zerocopy::IntoBytes;

const SIG: u8 = FM_CE_SE_CQ_UPDATE;

fn pattern(seed: u8, n: usize) -> Vec<u8> {
    (0..n).map(|i| seed.wrapping_add((i * 7) as u8)).collect()
}

fn dseg(len: u32, lkey: u32, addr: u64) -> Vec<u8> {
    DataSeg::new(len, lkey, addr).as_bytes().to_vec()
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

#[test]
fn rc_send_lands_in_receive_buffer_and_both_sides_complete() {
    let mut p = pair(RC, Knobs::default());
    let data = pattern(3, 100);
    p.ma.0.write(0, &data);
    p.qb.post_recv(&[(p.mb.0.addr(), 256, p.mb.1)]);
    let idx = p.send(
        SendOpcode::SEND,
        SIG,
        [0; 4],
        &dseg(100, p.ma.1, p.ma.0.addr()),
    );
    let ca = drain(&mut p.cqa);
    let cb = drain(&mut p.cqb);
    assert_eq!(ca.len(), 1, "{ca:?}");
    assert_eq!(ca[0].opcode, 0, "REQ");
    assert_eq!(ca[0].send_op, SendOpcode::SEND.0);
    assert_eq!(ca[0].wqe_counter, idx);
    assert_eq!(ca[0].qpn, p.qa.qpn);
    assert_eq!(ca[0].uidx, p.qa.uidx);
    assert_eq!(cb.len(), 1, "{cb:?}");
    assert_eq!(cb[0].opcode, 2, "RESP_SEND");
    assert_eq!(cb[0].byte_cnt, 100);
    assert_eq!(cb[0].wqe_counter, 0);
    assert_eq!(cb[0].src_qp, p.qa.qpn);
    assert_eq!(cb[0].uidx, p.qb.uidx);
    assert_eq!(p.mb.0.read(0, 100), data);
    assert_eq!(p.mb.0.load(100), 0, "nothing beyond the message");
    let c = p.emu.counters(0);
    assert_eq!(c.doorbells, 1);
    assert_eq!(c.wqes_executed, 1);
}

#[test]
fn record_only_is_not_executed_until_the_doorbell_rings() {
    let mut p = pair(RC, Knobs::default());
    p.ma.0.write(0, b"hello");
    p.qb.post_recv(&[(p.mb.0.addr(), 64, p.mb.1)]);
    let idx = p.qa.build_send(
        SendOpcode::SEND,
        0,
        SIG,
        [0; 4],
        &dseg(5, p.ma.1, p.ma.0.addr()),
    );
    p.qa.ring(&p.a, idx, Ring::RecordOnly);
    p.emu.run_until_idle();
    assert!(p.cqa.poll().is_none());
    assert!(p.cqb.poll().is_none());
    assert_eq!(p.emu.counters(0).wqes_executed, 0);
    assert_eq!(p.mb.0.read(0, 5), vec![0; 5]);
    // Ring now (8-byte doorbell for the same WQE): it executes.
    p.qa.ring(&p.a, idx, Ring::Doorbell);
    p.emu.run_until_idle();
    assert_eq!(drain(&mut p.cqa).len(), 1);
    assert_eq!(drain(&mut p.cqb).len(), 1);
    assert_eq!(p.mb.0.read(0, 5), b"hello");
}

#[test]
fn blueflame_copy_is_counted_and_matches_the_ring() {
    let mut p = pair(RC, Knobs::default());
    p.ma.0.write(0, &pattern(9, 40));
    for _ in 0..3 {
        p.qb.post_recv(&[(p.mb.0.addr(), 64, p.mb.1)]);
    }
    for _ in 0..3 {
        let idx = p.qa.build_send(
            SendOpcode::SEND,
            0,
            SIG,
            [0; 4],
            &dseg(40, p.ma.1, p.ma.0.addr()),
        );
        p.qa.ring(&p.a, idx, Ring::BlueFlame);
        p.emu.run_until_idle();
    }
    let c = p.emu.counters(0);
    assert_eq!(c.bf_writes, 3);
    assert_eq!(c.bf_mismatches, 0);
    assert_eq!(drain(&mut p.cqa).len(), 3);
    assert_eq!(drain(&mut p.cqb).len(), 3);
}

#[test]
fn rc_every_opcode_end_to_end() {
    let mut p = pair(RC, Knobs::default());
    let (ba, la) = (p.ma.0.addr(), p.ma.1);
    let (bb, rb) = (p.mb.0.addr(), p.mb.2);
    // SEND_IMM
    p.qb.post_recv(&[(bb, 64, p.mb.1)]);
    p.ma.0.write(0, b"imm-data");
    p.send(
        SendOpcode::SEND_IMM,
        SIG | FM_CE_SE_SOLICITED,
        [1, 2, 3, 4],
        &dseg(8, la, ba),
    );
    let cb = drain(&mut p.cqb);
    assert_eq!(
        (cb[0].opcode, cb[0].imm, cb[0].byte_cnt),
        (3, [1, 2, 3, 4], 8)
    );
    assert_eq!(p.mb.0.read(0, 8), b"imm-data");
    assert_eq!(drain(&mut p.cqa)[0].send_op, SendOpcode::SEND_IMM.0);
    // SEND_INV: the invalidated rkey arrives in the CQE.
    p.qb.post_recv(&[(bb + 64, 64, p.mb.1)]);
    p.send(
        SendOpcode::SEND_INVAL,
        SIG,
        0x1234u32.to_be_bytes(),
        &dseg(4, la, ba),
    );
    let cb = drain(&mut p.cqb);
    assert_eq!((cb[0].opcode, cb[0].imm), (4, 0x1234u32.to_be_bytes()));
    assert_eq!(drain(&mut p.cqa)[0].send_op, SendOpcode::SEND_INVAL.0);
    // RDMA_WRITE (two gather entries) to offset 1000.
    p.ma.0.write(100, &pattern(1, 50));
    p.ma.0.write(300, &pattern(2, 30));
    let segs = cat(&[
        RaddrSeg::new(bb + 1000, rb).as_bytes(),
        &dseg(50, la, ba + 100),
        &dseg(30, la, ba + 300),
    ]);
    p.send(SendOpcode::RDMA_WRITE, SIG, [0; 4], &segs);
    assert_eq!(p.mb.0.read(1000, 50), pattern(1, 50));
    assert_eq!(p.mb.0.read(1050, 30), pattern(2, 30));
    assert!(p.cqb.poll().is_none(), "plain WRITE consumes no receive");
    let ca = drain(&mut p.cqa);
    assert_eq!((ca[0].opcode, ca[0].send_op), (0, SendOpcode::RDMA_WRITE.0));
    // RDMA_WRITE_IMM consumes a receive and reports the length.
    p.qb.post_recv(&[(bb + 128, 64, p.mb.1)]);
    let segs = cat(&[
        RaddrSeg::new(bb + 2000, rb).as_bytes(),
        &dseg(16, la, ba + 100),
    ]);
    p.send(SendOpcode::RDMA_WRITE_IMM, SIG, [9, 9, 9, 9], &segs);
    let cb = drain(&mut p.cqb);
    assert_eq!((cb[0].opcode, cb[0].byte_cnt, cb[0].imm), (1, 16, [9; 4]));
    assert_eq!(p.mb.0.read(2000, 16), pattern(1, 16));
    drain(&mut p.cqa);
    // RDMA_READ into offset 3000 of a.
    p.mb.0.write(500, &pattern(5, 77));
    let segs = cat(&[
        RaddrSeg::new(bb + 500, rb).as_bytes(),
        &dseg(77, la, ba + 3000),
    ]);
    p.send(SendOpcode::RDMA_READ, SIG, [0; 4], &segs);
    assert_eq!(p.ma.0.read(3000, 77), pattern(5, 77));
    let ca = drain(&mut p.cqa);
    assert_eq!(
        (ca[0].send_op, ca[0].byte_cnt),
        (SendOpcode::RDMA_READ.0, 77)
    );
    // ATOMIC_CS (match) then ATOMIC_FA.
    p.mb.0.write(4000, &100u64.to_ne_bytes());
    let segs = cat(&[
        RaddrSeg::new(bb + 4000, rb).as_bytes(),
        AtomicSeg::new(555, 100).as_bytes(),
        &dseg(8, la, ba + 4000),
    ]);
    p.send(SendOpcode::ATOMIC_CS, SIG, [0; 4], &segs);
    assert_eq!(p.mb.0.read(4000, 8), 555u64.to_ne_bytes());
    assert_eq!(
        p.ma.0.read(4000, 8),
        100u64.to_ne_bytes(),
        "original value returned"
    );
    let segs = cat(&[
        RaddrSeg::new(bb + 4000, rb).as_bytes(),
        AtomicSeg::new(45, 0).as_bytes(),
        &dseg(8, la, ba + 4008),
    ]);
    p.send(SendOpcode::ATOMIC_FA, SIG, [0; 4], &segs);
    assert_eq!(p.mb.0.read(4000, 8), 600u64.to_ne_bytes());
    assert_eq!(p.ma.0.read(4008, 8), 555u64.to_ne_bytes());
    let ca = drain(&mut p.cqa);
    assert_eq!(
        ca.iter().map(|c| c.send_op).collect::<Vec<_>>(),
        vec![0x11, 0x12]
    );
    assert!(ca.iter().all(|c| c.byte_cnt == 8));
    // Masked FA, 8-byte operands (opmod 0x09): add 1 to two 32-bit fields.
    p.mb.0.write(4112, &0x0000_0001_ffff_ffffu64.to_ne_bytes());
    let mut seg = 0x0000_0001_0000_0001u64.to_be_bytes().to_vec();
    seg.extend_from_slice(&0x8000_0000_8000_0000u64.to_be_bytes());
    let segs = cat(&[
        RaddrSeg::new(bb + 4112, rb).as_bytes(),
        &seg,
        &dseg(8, la, ba + 4112),
    ]);
    let i =
        p.qa.build_send(SendOpcode::ATOMIC_MASKED_FA, 0x09, SIG, [0; 4], &segs);
    p.qa.ring(&p.a, i, Ring::Doorbell);
    p.emu.run_until_idle();
    let ca = drain(&mut p.cqa);
    assert_eq!((ca[0].opcode, ca[0].send_op), (0, 0x15), "{ca:?}");
    assert_eq!(
        p.mb.0.read(4112, 8),
        0x0000_0002_0000_0000u64.to_ne_bytes(),
        "carry stops at the field boundary"
    );
    // NOP and an inline SEND.
    let i = p.qa.build_send(SendOpcode::NOP, 0, SIG, [0; 4], &[]);
    p.qa.ring(&p.a, i, Ring::Doorbell);
    p.qb.post_recv(&[(bb + 192, 64, p.mb.1)]);
    let mut inl = InlineHdr::new(11).as_bytes().to_vec();
    inl.extend_from_slice(b"inline-data");
    let i = p.qa.build_send(SendOpcode::SEND, 0, SIG, [0; 4], &inl);
    p.qa.ring(&p.a, i, Ring::BlueFlame);
    p.emu.run_until_idle();
    assert_eq!(p.mb.0.read(192, 11), b"inline-data");
    let ca = drain(&mut p.cqa);
    assert_eq!(
        ca.iter().map(|c| c.send_op).collect::<Vec<_>>(),
        vec![0x00, 0x0A]
    );
    assert_eq!(p.emu.counters(0).inline_wqes, 1);
}

#[test]
fn unsignaled_wqes_complete_silently_and_the_ring_wraps() {
    let mut p = pair(RC, Knobs::default());
    let (ba, la) = (p.ma.0.addr(), p.ma.1);
    let rb = p.mb.2;
    // 100 WRITEs of 2 WQEBBs each (3 data segs) through a 64-WQEBB ring: wraps 3 times.
    let mut last = 0;
    for n in 0..100u32 {
        p.ma.0.write(n as usize, &[n as u8]);
        let segs = cat(&[
            RaddrSeg::new(p.mb.0.addr() + u64::from(n) * 3, rb).as_bytes(),
            &dseg(1, la, ba + u64::from(n)),
            &dseg(1, la, ba + u64::from(n)),
            &dseg(1, la, ba + u64::from(n)),
        ]);
        let sig = if n % 10 == 9 { SIG } else { 0 };
        last =
            p.qa.build_send(SendOpcode::RDMA_WRITE, 0, sig, [0; 4], &segs);
        p.qa.ring(&p.a, last, Ring::Doorbell);
        if n % 10 == 9 {
            p.emu.run_until_idle();
            assert_eq!(drain(&mut p.cqa).len(), 1);
        }
    }
    assert_eq!(last, 198);
    for n in 0..100usize {
        assert_eq!(p.mb.0.read(n * 3, 3), vec![n as u8; 3]);
    }
}

#[test]
fn uc_send_write_and_write_imm() {
    let mut p = pair(UC, Knobs::default());
    let (ba, la, bb, rb) = (p.ma.0.addr(), p.ma.1, p.mb.0.addr(), p.mb.2);
    p.ma.0.write(0, &pattern(4, 64));
    p.qb.post_recv(&[(bb, 64, p.mb.1)]);
    p.qb.post_recv(&[(bb + 64, 64, p.mb.1)]);
    let i =
        p.qa.build_send(SendOpcode::SEND, 0, SIG, [0; 4], &dseg(64, la, ba));
    p.qa.ring(&p.a, i, Ring::Doorbell);
    let segs = cat(&[RaddrSeg::new(bb + 1000, rb).as_bytes(), &dseg(32, la, ba)]);
    let i =
        p.qa.build_send(SendOpcode::RDMA_WRITE, 0, SIG, [0; 4], &segs);
    p.qa.ring(&p.a, i, Ring::Doorbell);
    let segs = cat(&[
        RaddrSeg::new(bb + 2000, rb).as_bytes(),
        &dseg(16, la, ba + 16),
    ]);
    p.send(SendOpcode::RDMA_WRITE_IMM, SIG, [7; 4], &segs);
    assert_eq!(p.mb.0.read(0, 64), pattern(4, 64));
    assert_eq!(p.mb.0.read(1000, 32), pattern(4, 32));
    assert_eq!(p.mb.0.read(2000, 16), p.ma.0.read(16, 16));
    let ca = drain(&mut p.cqa);
    assert_eq!(
        ca.iter().map(|c| c.send_op).collect::<Vec<_>>(),
        vec![0x0A, 0x08, 0x09]
    );
    let cb = drain(&mut p.cqb);
    assert_eq!(cb.iter().map(|c| c.opcode).collect::<Vec<_>>(), vec![2, 1]);
    assert_eq!(cb[1].imm, [7; 4]);
    // READ is not a UC operation: local QP operation error.
    let segs = cat(&[RaddrSeg::new(bb, rb).as_bytes(), &dseg(8, la, ba)]);
    p.send(SendOpcode::RDMA_READ, SIG, [0; 4], &segs);
    let ca = drain(&mut p.cqa);
    assert_eq!((ca[0].opcode, ca[0].syndrome), (13, 0x02));
}

#[test]
fn ud_send_and_send_imm_with_grh_area_and_source_qp() {
    let mut p = pair(UD, Knobs::default());
    let (ba, la, bb) = (p.ma.0.addr(), p.ma.1, p.mb.0.addr());
    p.ma.0.write(0, &pattern(8, 200));
    p.mb.0.write(0, &[0xEE; 40]);
    p.qb.post_recv(&[(bb, 40 + 256, p.mb.1)]);
    p.qb.post_recv(&[(bb + 512, 40 + 256, p.mb.1)]);
    let segs = cat(&[&ud_av(p.qb.qpn, 2, 0x1111_1111), &dseg(200, la, ba)]);
    let i = p.qa.build_send(SendOpcode::SEND, 0, SIG, [0; 4], &segs);
    p.qa.ring(&p.a, i, Ring::Doorbell);
    let segs = cat(&[&ud_av(p.qb.qpn, 2, 0x1111_1111), &dseg(10, la, ba)]);
    let i =
        p.qa.build_send(SendOpcode::SEND_IMM, 0, SIG, [5, 6, 7, 8], &segs);
    p.qa.ring(&p.a, i, Ring::Doorbell);
    // Wrong Q_Key: silently dropped at the receiver.
    let segs = cat(&[&ud_av(p.qb.qpn, 2, 0x2222), &dseg(10, la, ba)]);
    p.send(SendOpcode::SEND, SIG, [0; 4], &segs);
    let cb = drain(&mut p.cqb);
    assert_eq!(cb.len(), 2, "{cb:?}");
    assert_eq!(
        (cb[0].opcode, cb[0].byte_cnt, cb[0].src_qp, cb[0].grh),
        (2, 240, p.qa.qpn, false)
    );
    assert_eq!(
        p.mb.0.read(0, 40),
        vec![0xEE; 40],
        "no GRH: the 40-byte area is left alone"
    );
    assert_eq!(p.mb.0.read(40, 200), pattern(8, 200));
    assert_eq!(
        (cb[1].opcode, cb[1].imm, cb[1].byte_cnt),
        (3, [5, 6, 7, 8], 50)
    );
    assert_eq!(
        drain(&mut p.cqa).len(),
        3,
        "UD sends complete at once, even when dropped remotely"
    );
}

#[test]
fn cqe_128_bytes_and_scatter_into_cqe_format_bits() {
    let mut p = pair_cfg(RC, Knobs::default(), 128);
    p.ma.0.write(0, &pattern(6, 20));
    p.qb.post_recv(&[(p.mb.0.addr(), 64, p.mb.1)]);
    p.send(
        SendOpcode::SEND,
        SIG,
        [0; 4],
        &dseg(20, p.ma.1, p.ma.0.addr()),
    );
    let (d, first) = p.cqb.poll().expect("a 128-byte CQE");
    let c = decode(&d);
    assert_eq!(
        (c.opcode, c.byte_cnt, c.format),
        (2, 20, 0),
        "no scatter flag: data in the buffer"
    );
    assert_eq!(first.len(), 64);
    assert_eq!(p.mb.0.read(0, 20), pattern(6, 20));
    assert!(p.cqa.poll().is_some());
}

/// One context on a stepped emulator: a CQ on a completion channel and an RC QP connected
/// to a second QP of the same context, both on that CQ.
fn one_cq_with_a_channel() -> (mlx5_emu::Emulator, Ctx, i32, Cq, Qp) {
    let emu = stepped(1);
    let mut a = Ctx::open(&emu, 0);
    let ch = a.comp_channel();
    let pd = a.alloc_pd();
    let cq = a.create_cq(16, 64, ch);
    let q1 = a.create_qp(pd, &cq, &cq, RC, 16, 8, None);
    let q2 = a.create_qp(pd, &cq, &cq, RC, 16, 8, None);
    bring_up(&a, &q1, 1, q2.qpn, Knobs::default());
    bring_up(&a, &q2, 1, q1.qpn, Knobs::default());
    (emu, a, ch, cq, q1)
}

#[test]
fn completion_event_after_arm_and_sn_repeat_is_ignored() {
    let (emu, a, ch, mut cq, mut q1) = one_cq_with_a_channel();
    a.arm_cq(&mut cq, false);
    emu.run_until_idle();
    let i = q1.build_send(SendOpcode::NOP, 0, SIG, [0; 4], &[]);
    q1.ring(&a, i, Ring::Doorbell);
    emu.run_until_idle();
    let mut ev = [0u8; 8];
    // SAFETY: reading 8 bytes into a local buffer from the channel fd.
    let n = unsafe { libc::read(ch, ev.as_mut_ptr().cast(), 8) };
    assert_eq!(n, 8);
    assert_eq!(u64::from_ne_bytes(ev), 0xC0FFEE, "the CQ's user handle");
    let c = emu.counters(0);
    assert_eq!((c.cq_arms, c.comp_events), (1, 1));
    // Re-arming with the same sn (event not acknowledged) is ignored.
    drain(&mut cq);
    a.arm_cq(&mut cq, false);
    let i = q1.build_send(SendOpcode::NOP, 0, SIG, [0; 4], &[]);
    q1.ring(&a, i, Ring::Doorbell);
    emu.run_until_idle();
    assert_eq!(emu.counters(0).comp_events, 1);
    // With the next sn it fires again.
    drain(&mut cq);
    cq.arm_sn = 1;
    a.arm_cq(&mut cq, false);
    let i = q1.build_send(SendOpcode::NOP, 0, SIG, [0; 4], &[]);
    q1.ring(&a, i, Ring::Doorbell);
    emu.run_until_idle();
    assert_eq!(emu.counters(0).comp_events, 2);
}

/// The arm's consumer index decides: a CQ armed while a CQE it has not consumed is in the
/// ring fires at once (the kernel's mlx5 netdev and mlx5_ib's `arm_cq` rely on it: neither
/// polls again after arming), one armed with every CQE consumed waits for the next. This is
/// what an unmodified `ib_send_lat -e` trips on (docs/emulator-wake.md).
#[test]
fn an_arm_behind_an_unconsumed_cqe_fires_at_once_and_one_after_all_waits() {
    let (emu, a, _, mut cq, mut q1) = one_cq_with_a_channel();
    // A CQE written while the CQ is not armed, left in the ring.
    let i = q1.build_send(SendOpcode::NOP, 0, SIG, [0; 4], &[]);
    q1.ring(&a, i, Ring::Doorbell);
    emu.run_until_idle();
    assert_eq!(emu.counters(0).comp_events, 0, "not armed: no event");
    a.arm_cq(&mut cq, false);
    emu.run_until_idle();
    assert_eq!(
        emu.counters(0).comp_events,
        1,
        "armed behind an unconsumed CQE: the event comes at once"
    );
    // Consume it, arm with the next sequence number: nothing until a new CQE.
    assert_eq!(drain(&mut cq).len(), 1);
    cq.arm_sn = 1;
    a.arm_cq(&mut cq, false);
    emu.run_until_idle();
    assert_eq!(
        emu.counters(0).comp_events,
        1,
        "all consumed: the arm waits"
    );
    let i = q1.build_send(SendOpcode::NOP, 0, SIG, [0; 4], &[]);
    q1.ring(&a, i, Ring::Doorbell);
    emu.run_until_idle();
    assert_eq!(emu.counters(0).comp_events, 2, "the next CQE fires it");
}

#[test]
fn sq_drain_stops_new_work_and_reports_sq_drained() {
    let mut p = pair(RC, Knobs::default());
    let mut m = modify_base(&p.qa);
    m.attr_mask = M_STATE | (1 << 2); // EN_SQD_ASYNC_NOTIFY
    m.qp_state = 4; // SQD
    m.en_sqd_async_notify = 1;
    p.a.modify(&m).expect("RTS -> SQD");
    p.qb.post_recv(&[(p.mb.0.addr(), 64, p.mb.1)]);
    p.ma.0.write(0, b"later");
    let i = p.send(
        SendOpcode::SEND,
        SIG,
        [0; 4],
        &dseg(5, p.ma.1, p.ma.0.addr()),
    );
    let mut rec = [0u8; 16];
    // SAFETY: non-blocking read of one 16-byte async event record into a local buffer.
    let n = unsafe {
        libc::recv(
            p.a.async_fd,
            rec.as_mut_ptr().cast(),
            16,
            libc::MSG_DONTWAIT,
        )
    };
    assert_eq!(n, 16);
    assert_eq!(
        u32::from_ne_bytes(rec[8..12].try_into().unwrap()),
        mlx5_ffi::uverbs::IB_EVENT_SQ_DRAINED,
        "IBV_EVENT_SQ_DRAINED (5, not PATH_MIG_ERR's 7)"
    );
    assert!(p.cqa.poll().is_none(), "no new WQE starts in SQD");
    let mut m = modify_base(&p.qa);
    m.attr_mask = M_STATE;
    m.qp_state = 3;
    p.a.modify(&m).expect("SQD -> RTS");
    // The doorbell already rang; the device resumes with the next one.
    let j = p.send(SendOpcode::NOP, SIG, [0; 4], &[]);
    assert_eq!(
        drain(&mut p.cqa)
            .iter()
            .map(|c| c.wqe_counter)
            .collect::<Vec<_>>(),
        vec![i, j]
    );
    assert_eq!(p.mb.0.read(0, 5), b"later");
}

/// Two RC QPs on one HCA with SCATTER_CQE (all-signaled) and CQEs of `cqe_size` bytes.
fn scatter_pair(cqe_size: u32) -> (mlx5_emu::Emulator, Ctx, Cq, Qp, Qp, Buf, u32, u32) {
    let emu = stepped(1);
    let mut a = Ctx::open(&emu, 0);
    let pd = a.alloc_pd();
    let cq = a.create_cq(32, cqe_size, -1);
    let spec = QpSpec {
        qp_type: RC,
        sq_cnt: 64,
        rq_cnt: 8,
        srq: None,
        flags: 0x2,
        sig_all: true,
    };
    let q1 = a.create_qp_spec(pd, &cq, &cq, spec);
    let q2 = a.create_qp_spec(pd, &cq, &cq, spec);
    let lid = emu.hca_info(0).unwrap().lid;
    bring_up(&a, &q1, lid, q2.qpn, Knobs::default());
    bring_up(&a, &q2, lid, q1.qpn, Knobs::default());
    let m = Buf::new(8192);
    let (_, lkey, rkey) = a.reg_mr(pd, m.addr(), 8192, ALL_ACCESS).unwrap();
    (emu, a, cq, q1, q2, m, lkey, rkey)
}

#[test]
fn scatter_to_cqe_for_small_receives_and_read_results() {
    // 64-byte CQEs: a 20-byte SEND lands in the CQE (format 1), not in the buffer.
    let (emu, a, mut cq, mut q1, mut q2, m, lkey, rkey) = scatter_pair(64);
    m.write(0, &pattern(7, 32));
    q2.post_recv(&[(m.addr() + 4096, 64, lkey)]);
    let i = q1.build_send(SendOpcode::SEND, 0, SIG, [0; 4], &dseg(32, lkey, m.addr()));
    q1.ring(&a, i, Ring::Doorbell);
    emu.run_until_idle();
    let mut seen = Vec::new();
    while let Some((d, _)) = cq.poll() {
        seen.push((decode(&d), d));
    }
    let (c, d) = seen
        .iter()
        .find(|(c, _)| c.opcode == 2)
        .expect("a receive CQE");
    assert_eq!((c.format, c.byte_cnt), (1, 32));
    assert_eq!(
        d[..32],
        pattern(7, 32)[..],
        "payload in CQE bytes 0..32, none overwritten by CQE fields"
    );
    assert_eq!(
        m.read(4096, 32),
        vec![0; 32],
        "and not in the receive buffer"
    );
    // A 40-byte SEND does not fit a 64-byte CQE: normal placement.
    q2.post_recv(&[(m.addr() + 4096, 64, lkey)]);
    let i = q1.build_send(SendOpcode::SEND, 0, SIG, [0; 4], &dseg(40, lkey, m.addr()));
    q1.ring(&a, i, Ring::Doorbell);
    emu.run_until_idle();
    let c = drain(&mut cq);
    assert!(
        c.iter()
            .any(|c| c.opcode == 2 && c.format == 0 && c.byte_cnt == 40)
    );
    // Requester scatter: a 16-byte READ on an all-signaled QP returns its data in the CQE.
    m.write(6000, &pattern(9, 16));
    let segs = [
        RaddrSeg::new(m.addr() + 6000, rkey).as_bytes(),
        &dseg(16, lkey, m.addr() + 7000),
    ]
    .concat();
    let i = q1.build_send(SendOpcode::RDMA_READ, 0, SIG, [0; 4], &segs);
    q1.ring(&a, i, Ring::Doorbell);
    emu.run_until_idle();
    let (d, _) = cq.poll().expect("the READ completion");
    let c = decode(&d);
    assert_eq!(
        (c.opcode, c.send_op, c.format, c.byte_cnt),
        (0, 0x10, 1, 16)
    );
    assert_eq!(d[..16], pattern(9, 16)[..]);
    assert_eq!(
        m.read(7000, 16),
        vec![0; 16],
        "the provider copies it, not the device"
    );

    // 128-byte CQEs: up to 64 bytes go into the first half of the entry (format 2).
    let (emu, a, mut cq, mut q1, mut q2, m, lkey, _) = scatter_pair(128);
    m.write(0, &pattern(3, 50));
    q2.post_recv(&[(m.addr() + 4096, 64, lkey)]);
    let i = q1.build_send(SendOpcode::SEND, 0, SIG, [0; 4], &dseg(50, lkey, m.addr()));
    q1.ring(&a, i, Ring::Doorbell);
    emu.run_until_idle();
    let mut found = false;
    while let Some((d, first)) = cq.poll() {
        let c = decode(&d);
        if c.opcode == 2 {
            assert_eq!((c.format, c.byte_cnt), (2, 50));
            assert_eq!(first[..50], pattern(3, 50)[..]);
            found = true;
        }
    }
    assert!(found);
}

#[test]
fn ud_with_a_global_route_gets_a_grh_in_the_buffer() {
    let mut p = pair(UD, Knobs::default());
    let info_a = p.emu.hca_info(0).unwrap();
    let info_b = p.emu.hca_info(1).unwrap();
    p.ma.0.write(0, b"with grh");
    p.qb.post_recv(&[(p.mb.0.addr(), 128, p.mb.1)]);
    let mut av = DatagramSeg::zeroed();
    av.set_qkey(0x1111_1111);
    av.set_dqpn(p.qb.qpn);
    av.grh_gid_fl = mlx5_hw::types::Be32::new(mlx5_hw::wqe::AV_GRH_PRESENT | 0x12345);
    av.hop_limit = 64;
    av.tclass = 3;
    av.rgid = info_b.port_gid;
    let segs = [av.as_bytes(), &dseg(8, p.ma.1, p.ma.0.addr())].concat();
    p.send(SendOpcode::SEND, SIG, [0; 4], &segs);
    let cb = drain(&mut p.cqb);
    assert_eq!(
        (cb[0].opcode, cb[0].byte_cnt, cb[0].grh, cb[0].src_qp),
        (2, 48, true, p.qa.qpn)
    );
    let grh = p.mb.0.read(0, 40);
    assert_eq!(grh[0] >> 4, 6, "IP version 6");
    assert_eq!(grh[6], 0x1B, "next header: IB BTH");
    assert_eq!(grh[7], 64, "hop limit");
    assert_eq!(grh[8..24], info_a.port_gid, "source GID");
    assert_eq!(grh[24..40], info_b.port_gid, "destination GID");
    assert_eq!(p.mb.0.read(40, 8), b"with grh");
}

/// Two CQs of one context armed back to back, before the device scans: both arm doorbells go
/// to the one CQ doorbell register of the UAR page, so the second store overwrites the first
/// (on hardware each 8-byte MMIO write is its own transaction). The device finds the first
/// arm in that CQ's arm doorbell record, written just before its doorbell, and both CQs
/// report their completion event (before: the first CQ's arm was lost, and a program waiting
/// for its event waited for ever).
#[test]
fn two_cqs_armed_between_two_scans_both_report_their_event() {
    let emu = stepped(1);
    let mut a = Ctx::open(&emu, 0);
    let ch1 = a.comp_channel();
    let ch2 = a.comp_channel();
    let pd = a.alloc_pd();
    let mut cq1 = a.create_cq(16, 64, ch1);
    let mut cq2 = a.create_cq(16, 64, ch2);
    let q1 = a.create_qp(pd, &cq1, &cq1, RC, 16, 8, None);
    let q2 = a.create_qp(pd, &cq2, &cq2, RC, 16, 8, None);
    bring_up(&a, &q1, 1, q2.qpn, Knobs::default());
    bring_up(&a, &q2, 1, q1.qpn, Knobs::default());
    let (mut q1, mut q2) = (q1, q2);
    emu.run_until_idle();
    // The first arm of each CQ (sequence number 0, consumer index 0): both stores before a scan.
    a.arm_cq(&mut cq1, false);
    a.arm_cq(&mut cq2, false);
    let i = q1.build_send(SendOpcode::NOP, 0, SIG, [0; 4], &[]);
    q1.ring(&a, i, Ring::Doorbell);
    let i = q2.build_send(SendOpcode::NOP, 0, SIG, [0; 4], &[]);
    q2.ring(&a, i, Ring::Doorbell);
    emu.run_until_idle();
    for (ch, cq) in [(ch1, &cq1), (ch2, &cq2)] {
        let mut ev = [0u8; 8];
        // SAFETY: fcntl on the channel descriptor this test created; no memory is passed.
        let fl = unsafe { libc::fcntl(ch, libc::F_GETFL) };
        // SAFETY: as above: only the descriptor's flags change (non-blocking).
        unsafe { libc::fcntl(ch, libc::F_SETFL, fl | libc::O_NONBLOCK) };
        // SAFETY: reads at most 8 bytes into `ev`, a live local buffer of 8 bytes.
        let n = unsafe { libc::read(ch, ev.as_mut_ptr().cast(), 8) };
        assert_eq!(n, 8, "CQ {:#x}: its completion event", cq.cqn);
    }
    let c = emu.counters(0);
    assert_eq!((c.cq_arms, c.comp_events), (2, 2), "each arm counted once");
    // The next arms (sequence number 1) of both, again between two scans: both fire again.
    drain(&mut cq1);
    drain(&mut cq2);
    cq1.arm_sn = 1;
    cq2.arm_sn = 1;
    a.arm_cq(&mut cq1, false);
    a.arm_cq(&mut cq2, false);
    let i = q1.build_send(SendOpcode::NOP, 0, SIG, [0; 4], &[]);
    q1.ring(&a, i, Ring::Doorbell);
    let i = q2.build_send(SendOpcode::NOP, 0, SIG, [0; 4], &[]);
    q2.ring(&a, i, Ring::Doorbell);
    emu.run_until_idle();
    let c = emu.counters(0);
    assert_eq!((c.cq_arms, c.comp_events), (4, 4));
}
