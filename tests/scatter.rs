//! Scatter-to-CQE (`QpInitAttr::scatter_to_cqe`, on by default as in libmlx5): small payloads
//! that the device writes into the CQE instead of memory arrive byte-exact in the receive
//! WQE's scatter list (one or several SGEs), for 64- and 128-byte CQEs, with the knob on and
//! off; the CQE format bits show which path the data took, and the receive buffer is still
//! untouched until the driver copies it; SRQs too; READ and atomic results on `sq_sig_all`
//! requesters; a scatter list outside the registered memory completes with `LOC_PROT_ERR`.

mod common;

use std::sync::Arc;

use common::{PairOpts, Rig, Side, connect, poll_n};
use mlx5::hw::opcodes::CqeOpcode;
use mlx5::{
    Access, Cq, CqInit, CqeKind, DmaBuf, Pd, Qp, QpInitAttr, QpType, RawCq, RawCqe, RecvWr,
    SendFlags, SendWr, Sge, Srq, WcOpcode, WcStatus, WrOp,
};

const SIZES: [usize; 8] = [0, 1, 31, 32, 33, 64, 65, 100];
const SENTINEL: u8 = 0xEE;

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed))
        .collect()
}

/// One endpoint with `cqe_size`-byte CQEs and the scatter knob as given.
fn side_with(rig: &dyn Rig, n: usize, cqe_size: u32, scatter: bool, sig_all: bool) -> Side {
    let o = PairOpts {
        cqe: 255,
        cqe_size,
        scatter_to_cqe: scatter,
        sq_sig_all: sig_all,
        ..PairOpts::new(QpType::Rc)
    };
    common::side(rig, n, &o)
}

/// Whether the emulator scatters `len` bytes into a CQE of `cqe_size` (single-packet RC
/// messages up to the CQE's room), and the format it then uses.
fn expected_format(scatter: bool, cqe_size: u32, len: usize) -> u8 {
    let room = if cqe_size == 128 { 64 } else { 32 };
    match (scatter && len <= room, len > 32) {
        (false, _) => 0,
        (true, false) => 1,
        (true, true) => 2,
    }
}

/// Scatter lists the receives use: one SGE of 128 bytes, or three of 5, 20 and 103 bytes in
/// separate places (every size up to 100 fills a prefix of them).
fn recv_sges(b: &Side, three: bool) -> Vec<Sge> {
    if three {
        vec![b.mr.sge(1000, 5), b.mr.sge(2000, 20), b.mr.sge(3000, 103)]
    } else {
        vec![b.mr.sge(0, 128)]
    }
}

/// The bytes the scatter list holds, in order (`len` of them), and the byte after the data in
/// the segment where it ends (must still be the sentinel).
fn gathered(b: &Side, sges: &[Sge], len: usize) -> (Vec<u8>, u8) {
    let mut out = Vec::new();
    let mut after = SENTINEL;
    for s in sges {
        let off = (s.addr - b.mr.addr()) as usize;
        let take = (len - out.len()).min(s.length as usize);
        let mut part = vec![0u8; s.length as usize + 1];
        b.buf.read(off, &mut part);
        out.extend_from_slice(&part[..take]);
        after = part[take];
        if out.len() == len {
            break;
        }
    }
    (out, after)
}

/// Every boundary size arrives byte-exact, through the CQE exactly when the knob is on and
/// the payload fits (format 1: up to 32 bytes; format 2: up to 64 bytes, 128-byte CQEs), by
/// DMA otherwise. Each size is received twice: once polled with `Cq::poll`, once with the
/// low-level API, where the CQE's format is checked and the receive buffer is seen untouched
/// the low-level poller already copied it (`RawCq::next`): no loop can forget it.
fn boundary_sizes(rig: &dyn Rig, cqe_size: u32, scatter: bool) {
    let mut a = side_with(rig, 0, 64, false, false);
    let mut b = side_with(rig, 1, cqe_size, scatter, false);
    connect((&mut a.qp, &a.ctx), (&mut b.qp, &b.ctx), Access::ALL, 7);
    let mut id = 0u64;
    for &len in &SIZES {
        for three in [false, true] {
            for low_level in [false, true] {
                id += 1;
                let want = pattern(len, id as u8);
                b.buf.fill(0, common::BUF_LEN, SENTINEL);
                let sges = recv_sges(&b, three);
                b.qp.post_recv(&[RecvWr {
                    wr_id: id,
                    sg_list: &sges,
                }])
                .unwrap();
                a.buf.write(0, &want);
                let s = [a.mr.sge(0, len as u32)];
                a.qp.post_send(&[SendWr::send(id, &s, SendFlags::SIGNALED)])
                    .unwrap();
                let what =
                    format!("{len} bytes, cqe {cqe_size}, scatter {scatter}, 3 SGEs {three}");
                if low_level {
                    let c = common::with_raw(&mut b.cq, &b.ctx, |raw| {
                        let c = next_raw(rig, raw);
                        raw.publish_ci();
                        c
                    });
                    assert_eq!(c.opcode(), CqeOpcode::RESP_SEND, "{what}");
                    assert_eq!(c.kind(), CqeKind::Recv, "{what}");
                    assert_eq!(c.byte_len() as usize, len, "{what}");
                    assert_eq!(c.status(), WcStatus::SUCCESS, "{what}");
                    let format = expected_format(scatter, cqe_size, len);
                    if rig.stepped() {
                        assert_eq!(c.cqe().format(), format, "{what}");
                        assert_eq!(c.scattered(), format != 0, "{what}");
                    }
                    assert_eq!(b.qp.rq().unwrap().retire(c.wqe_counter()).unwrap(), id);
                } else {
                    let r = poll_n(rig, &mut b.cq, 1);
                    assert_eq!(
                        (r[0].wr_id, r[0].status, r[0].opcode, r[0].byte_len as usize),
                        (id, WcStatus::SUCCESS, WcOpcode::RECV, len),
                        "{what}"
                    );
                }
                let (got, after) = gathered(&b, &sges, len);
                assert_eq!(got, want, "{what}");
                assert_eq!(after, SENTINEL, "{what}: written past the payload");
                let s = poll_n(rig, &mut a.cq, 1);
                assert_eq!((s[0].wr_id, s[0].status), (id, WcStatus::SUCCESS));
            }
        }
    }
}

/// The next completion of the low-level poller, driving the rig.
fn next_raw(rig: &dyn Rig, cq: &mut RawCq) -> RawCqe {
    for _ in 0..1_000_000 {
        if let Some(c) = cq.next() {
            return c;
        }
        rig.progress();
    }
    panic!("no CQE");
}

fn cqe64_scatter_on(rig: &dyn Rig) {
    boundary_sizes(rig, 64, true);
}

fn cqe64_scatter_off(rig: &dyn Rig) {
    boundary_sizes(rig, 64, false);
}

fn cqe128_scatter_on(rig: &dyn Rig) {
    boundary_sizes(rig, 128, true);
}

fn cqe128_scatter_off(rig: &dyn Rig) {
    boundary_sizes(rig, 128, false);
}

/// Receives from an SRQ: small payloads scattered into 64- and 128-byte CQEs land in the SRQ
/// WQE's scatter list (past its next segment).
fn srq_receives(rig: &dyn Rig) {
    for cqe_size in [64, 128] {
        let mut a = side_with(rig, 0, 64, false, false);
        let bctx = rig.open(1);
        let bpd = Pd::new(&bctx).unwrap();
        let mut bcq = Cq::new(
            &bctx,
            CqInit {
                cqe: 63,
                cqe_size,
                comp_vector: 0,
            },
            None,
        )
        .unwrap();
        let mut srq = Srq::new(&bpd, 31, 2).unwrap();
        let mut init = QpInitAttr::new(QpType::Rc, &bcq, &bcq);
        init.srq = Some(&srq);
        init.cap.max_recv_wr = 0;
        let mut bqp = Qp::new(&bpd, &init).unwrap();
        let bbuf = Arc::new(DmaBuf::new(8192).unwrap());
        let bmr = bpd.reg_mr(&bbuf, Access::ALL).unwrap();
        connect((&mut a.qp, &a.ctx), (&mut bqp, &bctx), Access::ALL, 7);
        for (i, &len) in SIZES.iter().enumerate() {
            bbuf.fill(0, 8192, SENTINEL);
            let sges = [bmr.sge(100, 10), bmr.sge(500, 118)];
            srq.post_recv(&[RecvWr {
                wr_id: 70 + i as u64,
                sg_list: &sges,
            }])
            .unwrap();
            let want = pattern(len, i as u8);
            a.buf.write(0, &want);
            let s = [a.mr.sge(0, len as u32)];
            a.qp.post_send(&[SendWr::send(i as u64, &s, SendFlags::SIGNALED)])
                .unwrap();
            let r = poll_n(rig, &mut bcq, 1);
            let what = format!("SRQ, {len} bytes, cqe {cqe_size}");
            assert_eq!(
                (r[0].wr_id, r[0].status, r[0].byte_len as usize),
                (70 + i as u64, WcStatus::SUCCESS, len),
                "{what}"
            );
            let mut got = vec![0u8; len + 1];
            let first = len.min(10);
            bbuf.read(100, &mut got[..first]);
            if len > 10 {
                bbuf.read(500, &mut got[10..=len]);
            } else {
                let mut after = [0u8; 1];
                bbuf.read(100 + len, &mut after);
                got[len] = after[0];
            }
            assert_eq!(&got[..len], &want[..], "{what}");
            assert_eq!(got[len], SENTINEL, "{what}: written past the payload");
            poll_n(rig, &mut a.cq, 1);
        }
    }
}

/// Requester side: on an `sq_sig_all` QP (the kernel scatters READ/atomic results into the
/// CQE only there, or with the "allow" flag), READ results up to the CQE's room and atomic
/// results land byte-exact in the WQE's scatter list (two SGEs), for both CQE sizes and both
/// knob settings.
fn read_and_atomic_results(rig: &dyn Rig) {
    for cqe_size in [64, 128] {
        for scatter in [true, false] {
            let mut a = side_with(rig, 0, cqe_size, scatter, true);
            let mut b = side_with(rig, 1, 64, false, false);
            connect((&mut a.qp, &a.ctx), (&mut b.qp, &b.ctx), Access::ALL, 7);
            for (i, &len) in SIZES.iter().enumerate().filter(|(_, l)| **l > 0) {
                let want = pattern(len, 3 * i as u8);
                b.buf.write(4096, &want);
                a.buf.fill(0, common::BUF_LEN, SENTINEL);
                let split = len / 3;
                let sges = [
                    a.mr.sge(100, split as u32),
                    a.mr.sge(900, (len - split) as u32),
                ];
                let op = WrOp::Read {
                    raddr: b.mr.addr() + 4096,
                    rkey: b.mr.rkey(),
                };
                a.qp.post_send(&[SendWr::new(i as u64, op, &sges, SendFlags::NONE)])
                    .unwrap();
                let s = poll_n(rig, &mut a.cq, 1);
                let what = format!("READ {len}, cqe {cqe_size}, scatter {scatter}");
                assert_eq!(
                    (s[0].wr_id, s[0].status, s[0].byte_len as usize),
                    (i as u64, WcStatus::SUCCESS, len),
                    "{what}"
                );
                let mut got = vec![0u8; len + 1];
                a.buf.read(100, &mut got[..split]);
                a.buf.read(900, &mut got[split..]);
                assert_eq!(&got[..len], &want[..], "{what}");
                assert_eq!(got[len], SENTINEL, "{what}");
            }
            // Fetch-and-add and compare-and-swap: the original value in the first SGE.
            b.buf.write(8, &41u64.to_ne_bytes());
            let res = [a.mr.sge(2000, 8)];
            let fa = WrOp::FetchAdd {
                raddr: b.mr.addr() + 8,
                rkey: b.mr.rkey(),
                add: 1,
            };
            a.qp.post_send(&[SendWr::new(90, fa, &res, SendFlags::NONE)])
                .unwrap();
            let s = poll_n(rig, &mut a.cq, 1);
            assert_eq!((s[0].status, s[0].byte_len), (WcStatus::SUCCESS, 8));
            assert_eq!(a.buf.read_u64(2000), 41);
            let cs = WrOp::CompareSwap {
                raddr: b.mr.addr() + 8,
                rkey: b.mr.rkey(),
                compare: 42,
                swap: 7,
            };
            a.qp.post_send(&[SendWr::new(91, cs, &res, SendFlags::NONE)])
                .unwrap();
            let s = poll_n(rig, &mut a.cq, 1);
            assert_eq!((s[0].wr_id, s[0].status), (91, WcStatus::SUCCESS));
            assert_eq!(a.buf.read_u64(2000), 42);
            assert_eq!(b.buf.read_u64(8), 7);
        }
    }
}

/// A receive whose scatter list lies outside every registered region, on a QP with
/// scatter-to-CQE: a 16-byte message for it completes with `LOC_PROT_ERR` (on the emulator
/// the device catches it when it takes the WQE; the driver also checks every destination
/// before copying out of a CQE, see the unit tests of `mem::scatter`), nothing is written, and
/// the QP's later receives are flushed (the responder error moves the QP to ERR).
fn bad_destination_is_a_protection_error(rig: &dyn Rig) {
    let mut a = side_with(rig, 0, 64, false, false);
    let mut b = side_with(rig, 1, 64, true, false);
    connect((&mut a.qp, &a.ctx), (&mut b.qp, &b.ctx), Access::ALL, 7);
    b.buf.fill(0, common::BUF_LEN, SENTINEL);
    let outside = Sge {
        addr: b.mr.addr() + b.mr.len(),
        length: 64,
        lkey: b.mr.lkey(),
    };
    let good = [b.mr.sge(0, 64)];
    let bad = [outside];
    b.qp.post_recv(&[
        RecvWr {
            wr_id: 1,
            sg_list: &bad,
        },
        RecvWr {
            wr_id: 2,
            sg_list: &good,
        },
    ])
    .unwrap();
    a.buf.write(0, b"0123456789abcdef");
    let s = [a.mr.sge(0, 16)];
    a.qp.post_send(&[SendWr::send(1, &s, SendFlags::SIGNALED)])
        .unwrap();
    let r = poll_n(rig, &mut b.cq, 1);
    assert_eq!(
        (r[0].wr_id, r[0].status, r[0].opcode),
        (1, WcStatus::LOC_PROT_ERR, WcOpcode::RECV)
    );
    b.qp.to_error().unwrap();
    let r = poll_n(rig, &mut b.cq, 1);
    assert_eq!((r[0].wr_id, r[0].status), (2, WcStatus::WR_FLUSH_ERR));
    let mut got = [0u8; 16];
    b.buf.read(0, &mut got);
    assert_eq!(got, [SENTINEL; 16]);
}

scenarios!(
    cqe64_scatter_on,
    cqe64_scatter_off,
    cqe128_scatter_on,
    cqe128_scatter_off,
    srq_receives,
    read_and_atomic_results,
    bad_destination_is_a_protection_error
);
