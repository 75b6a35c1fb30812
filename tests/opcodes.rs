//! Every opcode moves the right bytes with the right completion fields: RC (all), UC (SEND,
//! WRITE), UD (SEND).

mod common;

use common::{PairOpts, QKEY, Rig, pair, poll_n};
use mlx5::{
    Ah, AhAttr, QpType, RecvWr, SendFlags, SendWr, UdDest, WcFlags, WcOpcode, WcStatus, WrOp,
};

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// SEND (gathered from 3 SGEs) -> RECV with byte_len, src_qp, opcode; the requester CQE says SEND.
fn rc_send_multi_sge(rig: &dyn Rig) {
    send_variants(rig, QpType::Rc);
}

fn uc_send(rig: &dyn Rig) {
    send_variants(rig, QpType::Uc);
}

fn send_variants(rig: &dyn Rig, t: QpType) {
    let (mut a, mut b) = pair(rig, PairOpts::new(t));
    let data = pattern(3000, 7);
    a.buf.write(0, &data);
    let rsge = [b.mr.sge(4096, 4096)];
    b.qp.post_recv(&[RecvWr {
        wr_id: 0xB1,
        sg_list: &rsge,
    }])
    .unwrap();
    let sges = [a.mr.sge(0, 1000), a.mr.sge(1000, 0), a.mr.sge(1000, 2000)];
    a.qp.post_send(&[SendWr::send(0xA1, &sges, SendFlags::SIGNALED)])
        .unwrap();
    let s = poll_n(rig, &mut a.cq, 1);
    assert_eq!(s[0].status, WcStatus::SUCCESS, "{:?}", s[0]);
    assert_eq!(
        (s[0].wr_id, s[0].opcode, s[0].qp_num),
        (0xA1, WcOpcode::SEND, a.qp.qpn())
    );
    let r = poll_n(rig, &mut b.cq, 1);
    assert_eq!(r[0].status, WcStatus::SUCCESS, "{:?}", r[0]);
    assert_eq!(
        (r[0].wr_id, r[0].opcode, r[0].byte_len),
        (0xB1, WcOpcode::RECV, 3000)
    );
    let first_ts = r[0].timestamp;
    assert_eq!(r[0].qp_num, b.qp.qpn());
    assert!(!r[0].wc_flags.contains(WcFlags::WITH_IMM));
    let mut got = vec![0u8; 3000];
    b.buf.read(4096, &mut got);
    assert_eq!(got, data);

    // SEND with immediate, inline, solicited.
    b.qp.post_recv(&[RecvWr {
        wr_id: 0xB2,
        sg_list: &rsge,
    }])
    .unwrap();
    let msg = b"inline immediate payload";
    let parts: [&[u8]; 2] = [&msg[..10], &msg[10..]];
    let wr = SendWr::new(
        0xA2,
        WrOp::SendImm { imm: [1, 2, 3, 4] },
        &[],
        SendFlags::SIGNALED | SendFlags::SOLICITED,
    )
    .with_inline(&parts);
    a.qp.post_send(&[wr]).unwrap();
    let s = poll_n(rig, &mut a.cq, 1);
    assert_eq!(
        (s[0].status, s[0].wr_id, s[0].opcode),
        (WcStatus::SUCCESS, 0xA2, WcOpcode::SEND)
    );
    let r = poll_n(rig, &mut b.cq, 1);
    // The CQE timestamp (raw HCA clock; virtual time on the stepped emulator) never goes back.
    assert!(
        r[0].timestamp >= first_ts,
        "{} vs {first_ts}",
        r[0].timestamp
    );
    assert_eq!(r[0].status, WcStatus::SUCCESS, "{:?}", r[0]);
    assert_eq!(
        (r[0].wr_id, r[0].byte_len, r[0].imm_data),
        (0xB2, msg.len() as u32, [1, 2, 3, 4])
    );
    assert!(r[0].wc_flags.contains(WcFlags::WITH_IMM));
    assert!(r[0].wc_flags.contains(WcFlags::SOLICITED));
    let mut got = vec![0u8; msg.len()];
    b.buf.read(4096, &mut got);
    assert_eq!(&got, msg);
}

/// RDMA WRITE (RC and UC), WRITE_IMM consuming a receive.
fn rc_write(rig: &dyn Rig) {
    write_variants(rig, QpType::Rc);
}

fn uc_write(rig: &dyn Rig) {
    write_variants(rig, QpType::Uc);
}

fn write_variants(rig: &dyn Rig, t: QpType) {
    let (mut a, mut b) = pair(rig, PairOpts::new(t));
    let data = pattern(5000, 3);
    a.buf.write(100, &data);
    let sges = [a.mr.sge(100, 5000)];
    let raddr = b.mr.addr() + 8192;
    a.qp.post_send(&[SendWr::new(
        1,
        WrOp::Write {
            raddr,
            rkey: b.mr.rkey(),
        },
        &sges,
        SendFlags::SIGNALED,
    )])
    .unwrap();
    let s = poll_n(rig, &mut a.cq, 1);
    assert_eq!(
        (s[0].status, s[0].wr_id, s[0].opcode),
        (WcStatus::SUCCESS, 1, WcOpcode::RDMA_WRITE),
        "{:?}",
        s[0]
    );
    let mut got = vec![0u8; 5000];
    // A WRITE produces no responder completion; the requester CQE (RC: after the ACK) orders it.
    // On UC the data may land after the local completion: drive the rig a little.
    for _ in 0..100 {
        b.buf.read(8192, &mut got);
        if got == data {
            break;
        }
        rig.progress();
    }
    assert_eq!(got, data);

    let rsge = [b.mr.sge(0, 16)];
    b.qp.post_recv(&[RecvWr {
        wr_id: 77,
        sg_list: &rsge,
    }])
    .unwrap();
    let sges = [a.mr.sge(100, 64)];
    let op = WrOp::WriteImm {
        raddr: b.mr.addr() + 20000,
        rkey: b.mr.rkey(),
        imm: [9, 8, 7, 6],
    };
    a.qp.post_send(&[SendWr::new(2, op, &sges, SendFlags::SIGNALED)])
        .unwrap();
    let s = poll_n(rig, &mut a.cq, 1);
    assert_eq!(
        (s[0].status, s[0].opcode),
        (WcStatus::SUCCESS, WcOpcode::RDMA_WRITE)
    );
    let r = poll_n(rig, &mut b.cq, 1);
    assert_eq!(r[0].status, WcStatus::SUCCESS, "{:?}", r[0]);
    assert_eq!(
        (r[0].wr_id, r[0].opcode, r[0].byte_len),
        (77, WcOpcode::RECV_RDMA_WITH_IMM, 64)
    );
    assert_eq!(r[0].imm_data, [9, 8, 7, 6]);
    let mut got = vec![0u8; 64];
    b.buf.read(20000, &mut got);
    assert_eq!(got, data[..64]);
}

/// RDMA READ brings remote bytes; byte_len is the length read.
fn rc_read(rig: &dyn Rig) {
    let (mut a, b) = pair(rig, PairOpts::new(QpType::Rc));
    let data = pattern(4000, 11);
    b.buf.write(30000, &data);
    let sges = [a.mr.sge(50000, 1500), a.mr.sge(51500, 2500)];
    let op = WrOp::Read {
        raddr: b.mr.addr() + 30000,
        rkey: b.mr.rkey(),
    };
    a.qp.post_send(&[SendWr::new(5, op, &sges, SendFlags::SIGNALED)])
        .unwrap();
    let s = poll_n(rig, &mut a.cq, 1);
    assert_eq!(s[0].status, WcStatus::SUCCESS, "{:?}", s[0]);
    assert_eq!(
        (s[0].wr_id, s[0].opcode, s[0].byte_len),
        (5, WcOpcode::RDMA_READ, 4000)
    );
    let mut got = vec![0u8; 4000];
    a.buf.read(50000, &mut got);
    assert_eq!(got, data);
}

/// Compare-and-swap and fetch-and-add: the old value comes back, the remote word changes.
fn rc_atomics(rig: &dyn Rig) {
    let (mut a, b) = pair(rig, PairOpts::new(QpType::Rc));
    b.buf.write(64, &100u64.to_ne_bytes());
    let rkey = b.mr.rkey();
    let raddr = b.mr.addr() + 64;
    let res = [a.mr.sge(8, 8)];
    let cs = WrOp::CompareSwap {
        raddr,
        rkey,
        compare: 100,
        swap: 555,
    };
    a.qp.post_send(&[SendWr::new(10, cs, &res, SendFlags::SIGNALED)])
        .unwrap();
    let s = poll_n(rig, &mut a.cq, 1);
    assert_eq!(s[0].status, WcStatus::SUCCESS, "{:?}", s[0]);
    assert_eq!(
        (s[0].wr_id, s[0].opcode, s[0].byte_len),
        (10, WcOpcode::COMP_SWAP, 8)
    );
    assert_eq!(a.buf.read_u64(8), 100);
    assert_eq!(b.buf.read_u64(64), 555);
    // A failing compare leaves the word alone and still returns it.
    let cs = WrOp::CompareSwap {
        raddr,
        rkey,
        compare: 1,
        swap: 2,
    };
    a.qp.post_send(&[SendWr::new(11, cs, &res, SendFlags::SIGNALED)])
        .unwrap();
    poll_n(rig, &mut a.cq, 1);
    assert_eq!(a.buf.read_u64(8), 555);
    assert_eq!(b.buf.read_u64(64), 555);
    let fa = WrOp::FetchAdd {
        raddr,
        rkey,
        add: 45,
    };
    a.qp.post_send(&[SendWr::new(12, fa, &res, SendFlags::SIGNALED)])
        .unwrap();
    let s = poll_n(rig, &mut a.cq, 1);
    assert_eq!(
        (s[0].status, s[0].wr_id, s[0].opcode, s[0].byte_len),
        (WcStatus::SUCCESS, 12, WcOpcode::FETCH_ADD, 8)
    );
    assert_eq!(a.buf.read_u64(8), 555);
    assert_eq!(b.buf.read_u64(64), 600);
}

/// SEND with invalidate: the responder sees WITH_INV and the rkey.
fn rc_send_inv(rig: &dyn Rig) {
    let (mut a, mut b) = pair(rig, PairOpts::new(QpType::Rc));
    let rsge = [b.mr.sge(0, 256)];
    b.qp.post_recv(&[RecvWr {
        wr_id: 3,
        sg_list: &rsge,
    }])
    .unwrap();
    a.buf.write(0, b"invalidate");
    let sges = [a.mr.sge(0, 10)];
    a.qp.post_send(&[SendWr::new(
        4,
        WrOp::SendInv { rkey: 0x1234_5678 },
        &sges,
        SendFlags::SIGNALED,
    )])
    .unwrap();
    let s = poll_n(rig, &mut a.cq, 1);
    let r = poll_n(rig, &mut b.cq, 1);
    assert_eq!(
        (s[0].status, s[0].opcode),
        (WcStatus::SUCCESS, WcOpcode::SEND),
        "{:?}",
        s[0]
    );
    assert_eq!(r[0].status, WcStatus::SUCCESS, "{:?}", r[0]);
    assert!(r[0].wc_flags.contains(WcFlags::WITH_INV), "{:?}", r[0]);
    assert_eq!((r[0].invalidated_rkey, r[0].byte_len), (0x1234_5678, 10));
}

/// UD SEND through an address handle: GRH flag, src_qp, payload after the 40-byte GRH space.
fn ud_send(rig: &dyn Rig) {
    let (mut a, mut b) = pair(rig, PairOpts::new(QpType::Ud));
    let pb = b.ctx.query_port(1).unwrap();
    let ah = Ah::new(
        &a.pd,
        AhAttr {
            dlid: pb.lid,
            port_num: 1,
            ..AhAttr::default()
        },
    )
    .unwrap();
    let rsge = [b.mr.sge(0, 40 + 512)];
    b.qp.post_recv(&[RecvWr {
        wr_id: 21,
        sg_list: &rsge,
    }])
    .unwrap();
    let data = pattern(200, 5);
    a.buf.write(1000, &data);
    let sges = [a.mr.sge(1000, 200)];
    let wr = SendWr::send(20, &sges, SendFlags::SIGNALED).to(UdDest {
        ah: &ah,
        remote_qpn: b.qp.qpn(),
        remote_qkey: QKEY,
    });
    a.qp.post_send(&[wr]).unwrap();
    let s = poll_n(rig, &mut a.cq, 1);
    assert_eq!(
        (s[0].status, s[0].wr_id, s[0].opcode),
        (WcStatus::SUCCESS, 20, WcOpcode::SEND),
        "{:?}",
        s[0]
    );
    let r = poll_n(rig, &mut b.cq, 1);
    assert_eq!(r[0].status, WcStatus::SUCCESS, "{:?}", r[0]);
    assert_eq!(
        (r[0].wr_id, r[0].byte_len, r[0].src_qp),
        (21, 240, a.qp.qpn())
    );
    let mut got = vec![0u8; 200];
    // The first 40 bytes of a UD receive buffer are reserved for the GRH.
    b.buf.read(40, &mut got);
    assert_eq!(got, data);

    // Inline SEND with immediate over UD: the inline segment follows the 48-byte address vector
    // (starting a new WQEBB); 200 of them (2 WQEBBs each) wrap the 256-WQEBB SQ.
    for i in 0..200u64 {
        let rsge = [b.mr.sge(4096, 40 + 128)];
        b.qp.post_recv(&[RecvWr {
            wr_id: 100 + i,
            sg_list: &rsge,
        }])
        .unwrap();
        let msg = pattern(20 + (i as usize % 40), i as u8);
        let parts: [&[u8]; 1] = [&msg];
        let dest = UdDest {
            ah: &ah,
            remote_qpn: b.qp.qpn(),
            remote_qkey: QKEY,
        };
        let imm = (i as u32).to_be_bytes();
        let p0 = a.qp.sq_ref().producer();
        let wr = SendWr::new(200 + i, WrOp::SendImm { imm }, &[], SendFlags::SIGNALED)
            .with_inline(&parts)
            .to(dest);
        a.qp.post_send(&[wr]).unwrap();
        let s = poll_n(rig, &mut a.cq, 1);
        assert_eq!(
            (s[0].wr_id, s[0].status),
            (200 + i, WcStatus::SUCCESS),
            "{:?}",
            s[0]
        );
        assert_eq!(
            a.qp.sq_ref().producer() - p0,
            2,
            "ctrl + AV, then the inline segment"
        );
        let r = poll_n(rig, &mut b.cq, 1);
        assert_eq!(
            (r[0].wr_id, r[0].status, r[0].imm_data),
            (100 + i, WcStatus::SUCCESS, imm),
            "{:?}",
            r[0]
        );
        assert_eq!(r[0].byte_len as usize, 40 + msg.len());
        let mut got = vec![0u8; msg.len()];
        b.buf.read(4096 + 40, &mut got);
        assert_eq!(got, msg);
    }
    // A wrong Q_Key is dropped silently at the responder (UD), the sender still completes.
    let rsge = [b.mr.sge(0, 256)];
    b.qp.post_recv(&[RecvWr {
        wr_id: 999,
        sg_list: &rsge,
    }])
    .unwrap();
    let dest = UdDest {
        ah: &ah,
        remote_qpn: b.qp.qpn(),
        remote_qkey: QKEY ^ 1,
    };
    a.qp.post_send(&[SendWr::send(300, &sges, SendFlags::SIGNALED).to(dest)])
        .unwrap();
    assert_eq!(poll_n(rig, &mut a.cq, 1)[0].status, WcStatus::SUCCESS);
    assert!(
        common::drain(rig, &mut b.cq, 50).is_empty(),
        "a Q_Key mismatch delivers nothing"
    );
}

scenarios!(
    rc_send_multi_sge,
    uc_send,
    rc_write,
    uc_write,
    rc_read,
    rc_atomics,
    rc_send_inv,
    ud_send
);

/// The same scenarios with the device running on its own thread (real concurrency between the
/// driver's stores and the device's reads).
#[test]
fn on_threaded_emulator_all_opcodes() {
    let rig = common::EmuRig::threaded();
    rc_send_multi_sge(&rig);
    rc_write(&rig);
    rc_read(&rig);
    rc_atomics(&rig);
    uc_send(&rig);
    ud_send(&rig);
}

/// The connected scenarios on RoCE ports: the pairs connect by GID (common::connect takes the
/// port's RoCE v2 GID), everything else is the same.
#[test]
fn on_roce_emulator_connected_opcodes() {
    let rig = common::EmuRig::roce();
    rc_send_multi_sge(&rig);
    uc_send(&rig);
    rc_write(&rig);
    uc_write(&rig);
    rc_read(&rig);
    rc_atomics(&rig);
    rc_send_inv(&rig);
}
