//! Error classes: each yields its PRM syndrome (and vendor syndrome), the QP goes to the
//! error state, later work is flushed, async events are raised, and memory beside every
//! registered region is never touched.

mod common;

use common::*;
use mlx5_hw::opcodes::{SendOpcode, Syndrome, VendorSyndrome};
use mlx5_hw::wqe::{DataSeg, FM_CE_SE_CQ_UPDATE, RaddrSeg};
use zerocopy::IntoBytes;

const SIG: u8 = FM_CE_SE_CQ_UPDATE;
const CANARY: u8 = 0xA5;

fn dseg(len: u32, lkey: u32, addr: u64) -> Vec<u8> {
    DataSeg::new(len, lkey, addr).as_bytes().to_vec()
}

/// A region registered over the middle page of three; the outer pages are canaries.
struct Guarded {
    buf: Buf,
    lkey: u32,
    rkey: u32,
}

impl Guarded {
    fn new(ctx: &Ctx, pd: u32, access: u32) -> Guarded {
        let buf = Buf::new(3 * 4096);
        buf.write(0, &[CANARY; 4096]);
        buf.write(2 * 4096, &[CANARY; 4096]);
        let (_, lkey, rkey) = ctx
            .reg_mr(pd, buf.addr() + 4096, 4096, access)
            .expect("reg_mr");
        Guarded { buf, lkey, rkey }
    }
    fn addr(&self) -> u64 {
        self.buf.addr() + 4096
    }
    fn assert_canaries(&self) {
        assert!(
            self.buf.read(0, 4096).iter().all(|&b| b == CANARY),
            "canary before the MR was touched"
        );
        assert!(
            self.buf.read(2 * 4096, 4096).iter().all(|&b| b == CANARY),
            "canary after the MR was touched"
        );
    }
}

fn async_event(fd: i32) -> Option<u32> {
    let mut rec = [0u8; 16];
    // SAFETY: non-blocking read of up to 16 bytes into a local buffer.
    let n = unsafe { libc::recv(fd, rec.as_mut_ptr().cast(), 16, libc::MSG_DONTWAIT) };
    (n == 16).then(|| u32::from_ne_bytes([rec[8], rec[9], rec[10], rec[11]]))
}

/// One signaled 8-byte SEND from a's buffer, run to idle.
fn send8(p: &mut Pair) -> u16 {
    p.send(
        SendOpcode::SEND,
        SIG,
        [0; 4],
        &dseg(8, p.ma.1, p.ma.0.addr()),
    )
}

/// Post one more signaled SEND and check it is flushed.
fn assert_flushes(p: &mut Pair) {
    let i = p.send(SendOpcode::SEND, 0, [0; 4], &dseg(4, p.ma.1, p.ma.0.addr()));
    let ca = drain(&mut p.cqa);
    assert_eq!(
        ca.len(),
        1,
        "an unsignaled WQE is still flushed with a CQE: {ca:?}"
    );
    assert_eq!(
        (ca[0].opcode, ca[0].syndrome, ca[0].vendor),
        (13, 0x05, VendorSyndrome::WR_FLUSH.0)
    );
    assert_eq!(ca[0].wqe_counter, i);
}

#[test]
fn local_protection_on_a_bad_lkey_then_flush() {
    let mut p = pair(RC, Knobs::default());
    p.qb.post_recv(&[(p.mb.0.addr(), 64, p.mb.1)]);
    let i = p.send(
        SendOpcode::SEND,
        SIG,
        [0; 4],
        &dseg(8, p.ma.1 ^ 0x100, p.ma.0.addr()),
    );
    let ca = drain(&mut p.cqa);
    assert_eq!(
        (ca[0].opcode, ca[0].syndrome, ca[0].vendor),
        (13, Syndrome::LOCAL_PROT.0, VendorSyndrome::LOCAL_PROT_KEY.0)
    );
    assert_eq!((ca[0].wqe_counter, ca[0].send_op), (i, SendOpcode::SEND.0));
    // The CQE is the report: no affiliated async event for a requester error (IBA 11.6.3;
    // an unread one would also be an event `ibv_destroy_qp` waits to see acknowledged).
    assert_eq!(async_event(p.a.async_fd), None, "no IBV_EVENT_QP_FATAL");
    assert_flushes(&mut p);
    assert!(p.cqb.poll().is_none(), "nothing reached the responder");
    let c = p.emu.counters(0);
    assert_eq!((c.req_cqe_error, c.req_cqe_flush_error), (1, 1));
}

#[test]
fn gather_beyond_the_mr_is_local_protection_and_reads_nothing() {
    let mut p = pair(RC, Knobs::default());
    let g = Guarded::new(&p.a, p.pda, ALL_ACCESS);
    p.qb.post_recv(&[(p.mb.0.addr(), 8192, p.mb.1)]);
    p.send(SendOpcode::SEND, SIG, [0; 4], &dseg(4097, g.lkey, g.addr()));
    assert_eq!(drain(&mut p.cqa)[0].syndrome, Syndrome::LOCAL_PROT.0);
    assert!(p.mb.0.read(0, 64).iter().all(|&b| b == 0));
    g.assert_canaries();
}

#[test]
fn local_length_at_the_responder_is_remote_invalid_request_at_the_requester() {
    let mut p = pair(RC, Knobs::default());
    let g = Guarded::new(&p.b, p.pdb, ALL_ACCESS);
    // Receive buffer: the last 16 bytes of the guarded MR.
    p.qb.post_recv(&[(g.addr() + 4096 - 16, 16, g.lkey)]);
    p.qb.post_recv(&[(g.addr(), 16, g.lkey)]);
    p.ma.0.write(0, &[0x77; 100]);
    p.send(
        SendOpcode::SEND,
        SIG,
        [0; 4],
        &dseg(100, p.ma.1, p.ma.0.addr()),
    );
    let cb = drain(&mut p.cqb);
    assert_eq!(
        (cb[0].opcode, cb[0].syndrome),
        (14, Syndrome::LOCAL_LENGTH.0)
    );
    assert_eq!(
        (cb[1].opcode, cb[1].syndrome),
        (14, Syndrome::WR_FLUSH.0),
        "the second receive is flushed"
    );
    let ca = drain(&mut p.cqa);
    assert_eq!(
        (ca[0].opcode, ca[0].syndrome),
        (13, Syndrome::REMOTE_INVAL_REQ.0)
    );
    assert_eq!(ca[0].vendor, VendorSyndrome::REMOTE_INVAL_REQ.0);
    g.assert_canaries();
    assert_flushes(&mut p);
    assert_eq!(
        async_event(p.b.async_fd),
        Some(2),
        "responder: IBV_EVENT_QP_REQ_ERR"
    );
}

#[test]
fn remote_access_errors_bad_rkey_bounds_and_rights() {
    // (description, rkey tweak, offset, length, opcode)
    let cases: [(&str, u32, u64, u32, SendOpcode); 3] = [
        ("wrong rkey", 1, 0, 8, SendOpcode::RDMA_WRITE),
        ("beyond the MR", 0, 4090, 8, SendOpcode::RDMA_WRITE),
        ("no remote read right", 0, 0, 8, SendOpcode::RDMA_READ),
    ];
    for (what, tweak, off, len, opcode) in cases {
        let mut p = pair(RC, Knobs::default());
        let g = Guarded::new(&p.b, p.pdb, LOCAL_WRITE | REMOTE_WRITE);
        p.ma.0.write(0, &[0x33; 64]);
        let segs = [
            RaddrSeg::new(g.addr() + off, g.rkey ^ tweak).as_bytes(),
            &dseg(len, p.ma.1, p.ma.0.addr()),
        ]
        .concat();
        p.send(opcode, SIG, [0; 4], &segs);
        let ca = drain(&mut p.cqa);
        assert_eq!(
            (ca[0].opcode, ca[0].syndrome),
            (13, Syndrome::REMOTE_ACCESS.0),
            "{what}"
        );
        assert_eq!(ca[0].vendor, VendorSyndrome::REMOTE_ACCESS.0, "{what}");
        assert!(
            g.buf.read(4096, 4096).iter().all(|&b| b == 0),
            "{what}: nothing written"
        );
        g.assert_canaries();
        assert_eq!(
            async_event(p.b.async_fd),
            Some(3),
            "{what}: responder IBV_EVENT_QP_ACCESS_ERR"
        );
        assert_flushes(&mut p);
    }
}

#[test]
fn write_with_immediate_and_a_bad_rkey_is_a_local_access_error_at_the_responder() {
    let mut p = pair(RC, Knobs::default());
    p.qb.post_recv(&[(p.mb.0.addr(), 64, p.mb.1)]);
    p.qb.post_recv(&[(p.mb.0.addr() + 64, 64, p.mb.1)]);
    let segs = [
        RaddrSeg::new(p.mb.0.addr(), p.mb.2 ^ 0x200).as_bytes(),
        &dseg(8, p.ma.1, p.ma.0.addr()),
    ]
    .concat();
    p.send(SendOpcode::RDMA_WRITE_IMM, SIG, [1; 4], &segs);
    let cb = drain(&mut p.cqb);
    assert_eq!(
        (cb[0].opcode, cb[0].syndrome),
        (14, Syndrome::LOCAL_ACCESS.0),
        "{cb:?}"
    );
    assert_eq!((cb[1].opcode, cb[1].syndrome), (14, Syndrome::WR_FLUSH.0));
    let ca = drain(&mut p.cqa);
    assert_eq!(
        (ca[0].opcode, ca[0].syndrome),
        (13, Syndrome::REMOTE_ACCESS.0)
    );
}

#[test]
fn bad_receive_lkey_is_remote_operation_error() {
    let mut p = pair(RC, Knobs::default());
    p.qb.post_recv(&[(p.mb.0.addr(), 64, p.mb.1 ^ 0x100)]);
    send8(&mut p);
    let cb = drain(&mut p.cqb);
    assert_eq!(
        (cb[0].opcode, cb[0].syndrome, cb[0].vendor),
        (14, 0x04, VendorSyndrome::LOCAL_PROT_RESP_KEY.0)
    );
    let ca = drain(&mut p.cqa);
    assert_eq!(
        (ca[0].syndrome, ca[0].vendor),
        (Syndrome::REMOTE_OP.0, VendorSyndrome::REMOTE_OP.0)
    );
    assert_eq!(p.emu.counters(1).resp_cqe_error, 1);
}

#[test]
fn unknown_opcode_and_bad_ctrl_are_local_qp_operation_errors() {
    let mut p = pair(RC, Knobs::default());
    p.send(
        SendOpcode(0x3E),
        SIG,
        [0; 4],
        &dseg(8, p.ma.1, p.ma.0.addr()),
    );
    let ca = drain(&mut p.cqa);
    assert_eq!(
        (ca[0].opcode, ca[0].syndrome, ca[0].send_op),
        (13, Syndrome::LOCAL_QP_OP.0, 0x3E)
    );
    assert_flushes(&mut p);
}

#[test]
fn transport_retry_exceeded_when_nobody_answers() {
    let emu = stepped(2);
    let mut a = Ctx::open(&emu, 0);
    let pd = a.alloc_pd();
    let mut cq = a.create_cq(16, 64, -1);
    let q = a.create_qp(pd, &cq, &cq, RC, 16, 8, None);
    let k = Knobs {
        timeout: 1,
        retry_cnt: 2,
        ..Knobs::default()
    };
    bring_up(&a, &q, 2, 0xABCD, k); // no such QP on HCA 1
    let mut q = q;
    let i = q.build_send(SendOpcode::NOP, 0, SIG, [0; 4], &[]);
    let j = q.build_send(SendOpcode::SEND, 0, SIG, [0; 4], &[]);
    q.ring(&a, j, Ring::Doorbell);
    emu.run_until_idle();
    let c = drain(&mut cq);
    assert_eq!(c[0].wqe_counter, i, "the NOP completes first");
    assert_eq!(
        (c[1].opcode, c[1].syndrome, c[1].vendor),
        (13, 0x15, VendorSyndrome::TRANSPORT_RETRY_EXC.0)
    );
    let n = emu.counters(0);
    assert_eq!(
        n.local_ack_timeout_err, 3,
        "initial try + 2 retries each time out"
    );
    assert_eq!(n.req_transport_retries_exceeded, 1);
    assert_eq!(n.packets_sent, 3);
}

#[test]
fn rnr_retry_exceeded_without_a_receive_then_success_with_one() {
    let k = Knobs {
        rnr_retry: 2,
        min_rnr_timer: 1,
        ..Knobs::default()
    };
    let mut p = pair(RC, k);
    send8(&mut p);
    let ca = drain(&mut p.cqa);
    assert_eq!(
        (ca[0].syndrome, ca[0].vendor),
        (0x16, VendorSyndrome::RNR_RETRY_EXC.0)
    );
    assert_eq!(p.emu.counters(0).rnr_nak_retry_err, 3);
    assert_eq!(p.emu.counters(0).req_rnr_retries_exceeded, 1);
    assert!(p.emu.counters(1).out_of_buffer >= 3);

    // A receive posted while the requester backs off: the retry succeeds.
    let mut p = pair(
        RC,
        Knobs {
            rnr_retry: 7,
            min_rnr_timer: 1,
            ..Knobs::default()
        },
    );
    p.ma.0.write(0, b"late");
    let i = p.qa.build_send(
        SendOpcode::SEND,
        0,
        SIG,
        [0; 4],
        &dseg(4, p.ma.1, p.ma.0.addr()),
    );
    p.qa.ring(&p.a, i, Ring::Doorbell);
    for _ in 0..3 {
        p.emu.step();
    }
    assert!(p.cqa.poll().is_none());
    p.qb.post_recv(&[(p.mb.0.addr(), 64, p.mb.1)]);
    p.emu.run_until_idle();
    assert_eq!(drain(&mut p.cqa)[0].syndrome, 0);
    assert_eq!(p.mb.0.read(0, 4), b"late");
}

#[test]
fn modify_to_error_flushes_receives_and_later_sends() {
    let mut p = pair(RC, Knobs::default());
    for k in 0..3 {
        p.qa.post_recv(&[(p.ma.0.addr() + k * 64, 64, p.ma.1)]);
    }
    let mut m = modify_base(&p.qa);
    m.attr_mask = M_STATE;
    m.qp_state = 6;
    p.a.modify(&m).expect("to ERR");
    p.emu.run_until_idle();
    let ca = drain(&mut p.cqa);
    assert_eq!(ca.len(), 3);
    assert!(ca.iter().all(|c| c.opcode == 14 && c.syndrome == 5));
    assert_eq!(
        ca.iter().map(|c| c.wqe_counter).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    assert_flushes(&mut p);
    assert_eq!(p.emu.counters(0).resp_cqe_flush_error, 3);
}

#[test]
fn cq_overrun_raises_the_cq_error_event() {
    let emu = stepped(1);
    let mut a = Ctx::open(&emu, 0);
    let pd = a.alloc_pd();
    let cq = a.create_cq(2, 64, -1);
    let q1 = a.create_qp(pd, &cq, &cq, RC, 16, 8, None);
    let q2 = a.create_qp(pd, &cq, &cq, RC, 16, 8, None);
    bring_up(&a, &q1, 1, q2.qpn, Knobs::default());
    bring_up(&a, &q2, 1, q1.qpn, Knobs::default());
    let mut q1 = q1;
    for _ in 0..3 {
        let i = q1.build_send(SendOpcode::NOP, 0, SIG, [0; 4], &[]);
        q1.ring(&a, i, Ring::Doorbell);
    }
    emu.run_until_idle();
    assert_eq!(
        emu.counters(0).cqes_written,
        2,
        "the third CQE does not fit"
    );
    assert_eq!(async_event(a.async_fd), Some(0), "IBV_EVENT_CQ_ERR");
}

#[test]
fn hw_counters_are_listed_by_their_sysfs_names() {
    let k = Knobs {
        rnr_retry: 0,
        min_rnr_timer: 1,
        ..Knobs::default()
    };
    let mut p = pair(RC, k);
    send8(&mut p);
    let a: Vec<(&str, u64)> = p.emu.counters(0).hw_counters().collect();
    assert_eq!(a.len(), 15);
    assert!(a.contains(&("req_rnr_retries_exceeded", 1)), "{a:?}");
    assert!(a.contains(&("rnr_nak_retry_err", 1)), "{a:?}");
    assert!(a.contains(&("req_cqe_error", 1)), "{a:?}");
    let b = p.emu.counters(1);
    assert_eq!(b.get("out_of_buffer"), Some(1));
    assert_eq!(b.get("no_such_counter"), None);
}

#[test]
fn a_ud_send_error_moves_the_qp_to_sqe_the_rq_goes_on_and_rts_resumes_the_sq() {
    let mut p = pair(UD, Knobs::default());
    let (ba, la) = (p.ma.0.addr(), p.ma.1);
    let (bb, lb) = (p.mb.0.addr(), p.mb.1);
    p.ma.0.write(0, b"good-send");
    let qpn_b = p.qb.qpn;
    let to_b = |len, lkey| [ud_av(qpn_b, 2, 0x1111_1111), dseg(len, lkey, ba)].concat();
    let bad = p.send(SendOpcode::SEND, SIG, [0; 4], &to_b(8, la ^ 0x100));
    let ca = drain(&mut p.cqa);
    assert_eq!(ca.len(), 1, "{ca:?}");
    assert_eq!(
        (ca[0].opcode, ca[0].syndrome, ca[0].wqe_counter),
        (13, Syndrome::LOCAL_PROT.0, bad)
    );
    assert_eq!(qp_state(&p.a, &p.qa), 5, "UD: send queue error, not error");
    assert_eq!(async_event(p.a.async_fd), None, "no QP_FATAL for SQE");

    // In SQE a newly posted send is flushed, not executed (IBA 10.3.1)...
    p.qb.post_recv(&[(bb, 40 + 64, lb)]);
    let flushed = p.send(SendOpcode::SEND, SIG, [0; 4], &to_b(9, la));
    let ca = drain(&mut p.cqa);
    assert_eq!(
        ca.iter()
            .map(|c| (c.opcode, c.syndrome, c.wqe_counter))
            .collect::<Vec<_>>(),
        [(13, Syndrome::WR_FLUSH.0, flushed)],
        "a send posted in SQE completes with a flush error"
    );
    assert!(drain(&mut p.cqb).is_empty(), "nothing reached b");
    // ...while the receive side keeps working: b sends to a.
    p.qa.post_recv(&[(ba + 512, 40 + 64, la)]);
    let to_a = [ud_av(p.qa.qpn, 1, 0x1111_1111), dseg(4, lb, bb)].concat();
    let i = p.qb.build_send(SendOpcode::SEND, 0, SIG, [0; 4], &to_a);
    p.qb.ring(&p.b, i, Ring::Doorbell);
    p.emu.run_until_idle();
    let ca = drain(&mut p.cqa);
    assert_eq!(
        (ca.len(), ca[0].opcode, ca[0].byte_cnt),
        (1, 2, 44),
        "{ca:?}"
    );
    assert_eq!(drain(&mut p.cqb).len(), 1, "b's send completed");

    // SQE -> RTS: sends run again.
    let mut m = modify_base(&p.qa);
    m.qp_state = 3;
    m.attr_mask = M_STATE;
    p.a.modify(&m).expect("SQE -> RTS");
    let good = p.send(SendOpcode::SEND, SIG, [0; 4], &to_b(9, la));
    p.emu.run_until_idle();
    let ca = drain(&mut p.cqa);
    assert_eq!(
        (ca.len(), ca[0].opcode, ca[0].syndrome, ca[0].wqe_counter),
        (1, 0, 0, good),
        "{ca:?}"
    );
    let cb = drain(&mut p.cqb);
    assert_eq!((cb.len(), cb[0].byte_cnt), (1, 40 + 9));
    assert_eq!(p.mb.0.read(40, 9), b"good-send");
    assert_eq!(qp_state(&p.a, &p.qa), 3);
}

#[test]
fn an_rc_send_error_still_moves_the_qp_to_error() {
    let mut p = pair(RC, Knobs::default());
    p.send(
        SendOpcode::SEND,
        SIG,
        [0; 4],
        &dseg(8, p.ma.1 ^ 0x100, p.ma.0.addr()),
    );
    assert_eq!(drain(&mut p.cqa)[0].syndrome, Syndrome::LOCAL_PROT.0);
    assert_eq!(qp_state(&p.a, &p.qa), 6);
    let mut m = modify_base(&p.qa);
    m.qp_state = 3;
    m.attr_mask = M_STATE;
    assert!(p.a.modify(&m).is_err(), "ERR -> RTS is not a transition");
}

#[test]
fn a_uc_send_error_is_a_send_queue_error_too() {
    let mut p = pair(UC, Knobs::default());
    let (ba, la) = (p.ma.0.addr(), p.ma.1);
    p.ma.0.write(0, b"uc");
    p.send(SendOpcode::SEND, SIG, [0; 4], &dseg(2, la ^ 0x100, ba));
    assert_eq!(drain(&mut p.cqa)[0].syndrome, Syndrome::LOCAL_PROT.0);
    assert_eq!(qp_state(&p.a, &p.qa), 5);
    assert_eq!(async_event(p.a.async_fd), None);
    p.qb.post_recv(&[(p.mb.0.addr(), 64, p.mb.1)]);
    // Two sends posted in SQE (one unsignaled): both flushed, in order, nothing sent.
    let f1 = p.send(SendOpcode::SEND, SIG, [0; 4], &dseg(2, la, ba));
    let f2 = p.send(SendOpcode::SEND, 0, [0; 4], &dseg(2, la, ba));
    let ca = drain(&mut p.cqa);
    assert_eq!(
        ca.iter()
            .map(|c| (c.opcode, c.syndrome, c.wqe_counter))
            .collect::<Vec<_>>(),
        [
            (13, Syndrome::WR_FLUSH.0, f1),
            (13, Syndrome::WR_FLUSH.0, f2)
        ]
    );
    assert!(drain(&mut p.cqb).is_empty(), "nothing reached b");
    assert_eq!(qp_state(&p.a, &p.qa), 5, "still SQE");
    let mut m = modify_base(&p.qa);
    m.qp_state = 3;
    m.attr_mask = M_STATE;
    p.a.modify(&m).expect("SQE -> RTS");
    let good = p.send(SendOpcode::SEND, SIG, [0; 4], &dseg(2, la, ba));
    assert_eq!(drain(&mut p.cqa)[0].wqe_counter, good);
    assert_eq!(drain(&mut p.cqb)[0].byte_cnt, 2);
    assert_eq!(p.mb.0.read(0, 2), b"uc");
}
