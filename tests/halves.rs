//! A send half and a receive half: the SQ and the RQ of one QP, each with its own CQ, moved to
//! two threads and used at once (`Qp::split`; both halves and both CQs are `Send`), while the
//! peer sends to it and receives from it. Every message arrives byte-exact and every WR
//! completes exactly once, in order, on the right half.

mod common;

use std::sync::Arc;

use common::{EmuRig, Rig};
use mlx5::{
    Access, Cq, CqInit, DmaBuf, Pd, Qp, QpInitAttr, QpType, RecvWr, SendFlags, SendWr, WcOpcode,
    WcStatus, WorkCompletion,
};

const N: u64 = 2000;
const LEN: usize = 24;

fn msg(dir: u8, i: u64) -> [u8; LEN] {
    core::array::from_fn(|k| dir ^ (i as u8).wrapping_add(k as u8))
}

fn poll_one(cq: &mut Cq, rig: &dyn Rig) -> WorkCompletion {
    let mut wc = [WorkCompletion::default(); 1];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while cq.poll(&mut wc) == 0 {
        assert!(std::time::Instant::now() < deadline, "no completion");
        rig.progress();
    }
    wc[0]
}

struct End {
    ctx: mlx5::Context,
    _pd: Pd,
    scq: Cq,
    rcq: Cq,
    qp: Qp,
    buf: Arc<DmaBuf>,
    mr: mlx5::Mr,
}

fn end(rig: &dyn Rig, side: usize) -> End {
    let ctx = rig.open(side);
    let pd = Pd::new(&ctx).unwrap();
    let scq = Cq::new(&ctx, CqInit::default(), None).unwrap();
    let rcq = Cq::new(&ctx, CqInit::default(), None).unwrap();
    let qp = Qp::new(&pd, &QpInitAttr::new(QpType::Rc, &scq, &rcq)).unwrap();
    let buf = Arc::new(DmaBuf::new(1 << 20).unwrap());
    let mr = pd.reg_mr(&buf, Access::ALL).unwrap();
    End {
        ctx,
        _pd: pd,
        scq,
        rcq,
        qp,
        buf,
        mr,
    }
}

#[test]
fn send_and_receive_halves_run_on_two_threads() {
    halves(None);
}

/// The same two threads with B's flight recorder on for its QP and both CQs: the recorder is
/// shared by the halves (one thread records sends and send CQEs, the other receives and
/// receive CQEs, at once), and its dump must still be exactly the last N of each kind, in
/// order, with consecutive indices.
#[test]
fn the_flight_recorder_stays_exact_with_the_halves_on_two_threads() {
    halves(Some(7));
}

/// One record line: kind, queue number, index, bytes.
fn records(text: &str) -> Vec<(String, u32, u32, Vec<u8>)> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            matches!(f[0], "wqe" | "rwqe" | "cqe").then(|| {
                let q = u32::from_str_radix(f[1].trim_start_matches("0x"), 16).unwrap();
                let b = (0..f[4].len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(&f[4][i..i + 2], 16).unwrap())
                    .collect();
                (f[0].to_string(), q, f[2].parse().unwrap(), b)
            })
        })
        .collect()
}

fn halves(recorder: Option<usize>) {
    let rig = EmuRig::threaded();
    let mut a = end(&rig, 0);
    let mut b = end(&rig, 1);
    common::connect((&mut a.qp, &a.ctx), (&mut b.qp, &b.ctx), Access::ALL, 7);
    if let Some(n) = recorder {
        let cfg = mlx5::RecorderConfig::new(n);
        b.qp.enable_recorder(&cfg).unwrap();
        b.scq.enable_recorder(&cfg).unwrap();
        b.rcq.enable_recorder(&cfg).unwrap();
    }
    let depth = 16u64;
    let (sq, rq) = b.qp.split();
    let rq = rq.unwrap();
    let (bscq, brcq) = (&mut b.scq, &mut b.rcq);
    let (bbuf, bmr) = (&b.buf, &b.mr);
    let rig = &rig;
    std::thread::scope(|t| {
        // B's receive half: keep `depth` receives posted, check each message in order.
        t.spawn(move || {
            let slot = |i: u64| (i % depth) * 64;
            for i in 0..depth {
                let r = [bmr.sge(slot(i), 64)];
                rq.post_recv(&[RecvWr {
                    wr_id: i,
                    sg_list: &r,
                }])
                .unwrap();
            }
            for i in 0..N {
                let wc = poll_one(brcq, rig);
                assert_eq!(
                    (wc.wr_id, wc.status, wc.opcode),
                    (i, WcStatus::SUCCESS, WcOpcode::RECV)
                );
                assert_eq!(wc.byte_len as usize, LEN);
                let mut got = [0u8; LEN];
                bbuf.read(slot(i) as usize, &mut got);
                assert_eq!(got, msg(0xA0, i), "message {i}");
                if i + depth < N {
                    let r = [bmr.sge(slot(i + depth), 64)];
                    rq.post_recv(&[RecvWr {
                        wr_id: i + depth,
                        sg_list: &r,
                    }])
                    .unwrap();
                }
            }
        });
        // B's send half: N signaled SENDs, at most `depth` outstanding, completions in order.
        t.spawn(move || {
            let base = 1 << 19;
            let mut done = 0;
            for i in 0..N {
                if i >= done + depth {
                    let wc = poll_one(bscq, rig);
                    assert_eq!((wc.wr_id, wc.status), (done, WcStatus::SUCCESS));
                    done += 1;
                }
                let off = base + (i % depth) * 64;
                bbuf.write(off as usize, &msg(0xB0, i));
                let s = [bmr.sge(off, LEN as u32)];
                sq.post_send(&[SendWr::send(i, &s, SendFlags::SIGNALED)])
                    .unwrap();
            }
            while done < N {
                let wc = poll_one(bscq, rig);
                assert_eq!((wc.wr_id, wc.status), (done, WcStatus::SUCCESS));
                done += 1;
            }
        });
        // A (this thread): receives B's messages and sends its own.
        let slot = |i: u64| (i % depth) * 64;
        for i in 0..depth {
            let r = [a.mr.sge(slot(i), 64)];
            a.qp.post_recv(&[RecvWr {
                wr_id: i,
                sg_list: &r,
            }])
            .unwrap();
        }
        let (mut sent, mut sdone, mut rdone) = (0u64, 0u64, 0u64);
        while sdone < N || rdone < N {
            if sent < N && sent < sdone + depth {
                let off = (1 << 19) + (sent % depth) * 64;
                a.buf.write(off as usize, &msg(0xA0, sent));
                let s = [a.mr.sge(off, LEN as u32)];
                a.qp.post_send(&[SendWr::send(sent, &s, SendFlags::SIGNALED)])
                    .unwrap();
                sent += 1;
            }
            let mut wc = [WorkCompletion::default(); 8];
            let n = a.scq.poll(&mut wc);
            for w in &wc[..n] {
                assert_eq!((w.wr_id, w.status), (sdone, WcStatus::SUCCESS));
                sdone += 1;
            }
            let n = a.rcq.poll(&mut wc);
            for w in &wc[..n] {
                assert_eq!((w.wr_id, w.status), (rdone, WcStatus::SUCCESS));
                let mut got = [0u8; LEN];
                a.buf.read(slot(rdone) as usize, &mut got);
                assert_eq!(got, msg(0xB0, rdone));
                if rdone + depth < N {
                    let r = [a.mr.sge(slot(rdone + depth), 64)];
                    a.qp.post_recv(&[RecvWr {
                        wr_id: rdone + depth,
                        sg_list: &r,
                    }])
                    .unwrap();
                }
                rdone += 1;
            }
            rig.progress();
        }
    });
    assert_eq!(b.qp.sq_ref().outstanding(), 0);
    assert_eq!(b.qp.rq().unwrap().outstanding(), 0);
    let Some(n) = recorder else { return };
    let text = b.qp.recorder_dump().expect("the recorder is on");
    let recs = records(&text);
    let of = |kind: &str, q: u32| -> Vec<(u32, Vec<u8>)> {
        recs.iter()
            .filter(|r| r.0 == kind && r.1 == q)
            .map(|r| (r.2, r.3.clone()))
            .collect()
    };
    let n32 = n as u32;
    let last = |first: u32| (first..first + n32).collect::<Vec<u32>>();
    // Sends: one WQEBB each, so the last n WQEs sit at counters N-n..N.
    let wqes = of("wqe", b.qp.qpn());
    let idx: Vec<u32> = wqes.iter().map(|w| w.0).collect();
    assert_eq!(idx, last(N as u32 - n32), "{text}");
    for (i, w) in &wqes {
        assert_eq!(u16::from_be_bytes([w[1], w[2]]), *i as u16, "{text}");
    }
    let rwqes = of("rwqe", b.qp.qpn());
    assert_eq!(rwqes.len(), n, "{text}");
    assert!(rwqes.windows(2).all(|w| w[1].0 == w[0].0 + 1), "{text}");
    // Send CQEs: the last n, each naming its WQE; receive CQEs: the last n.
    let scqes = of("cqe", b.scq.cqn());
    let ci: Vec<u32> = scqes.iter().map(|c| c.0).collect();
    assert_eq!(ci, last(N as u32 - n32), "{text}");
    for (i, c) in &scqes {
        assert_eq!(u16::from_be_bytes([c[0x3c], c[0x3d]]), *i as u16, "{text}");
    }
    let rcqes = of("cqe", b.rcq.cqn());
    let ci: Vec<u32> = rcqes.iter().map(|c| c.0).collect();
    assert_eq!(ci, last(N as u32 - n32), "{text}");
}
