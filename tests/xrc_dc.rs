//! XRC and DC through the driver's typed objects (`mlx5::xrc`, `mlx5::dc`) on the stepped
//! emulator: a SEND, WRITE and READ each way, the errors the device gives (an SRQ number of
//! another domain, a wrong DC key, an absent DCT), domains shared by file, and the seeded
//! fault campaigns of issue 22: 4 XRC initiators into one XRC SRQ and one DCI round-robin
//! over 8 DCTs, 10^4 WRs each at 1% loss, duplication, reordering and corruption, every WR
//! completing once, in order per target, with the right bytes.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::{EmuRig, Rig};
use mlx5::{
    Access, Ah, AhAttr, ConnectParams, Context, Cq, CqInit, DcAddr, DcWr, Dci, DciStreams, Dct,
    DmaBuf, Error, Mr, Pd, PostError, Qp, QpInitAttr, QpType, RecvWr, RemoteQp, SendFlags, SendWr,
    Srq, WcOpcode, WcStatus, WorkCompletion, WrOp, XrcDomain, XrcSendQp, XrcSrq, XrcSrqNum,
    XrcTgtQp, XrcWr, XrcdOpen,
};
use mlx5_emu::{EmuConfig, FaultConfig, RunMode};

fn cq(ctx: &Context, n: u32) -> Cq {
    Cq::new(
        ctx,
        CqInit {
            cqe: n,
            ..CqInit::default()
        },
        None,
    )
    .expect("CQ")
}

fn lid(ctx: &Context) -> u16 {
    ctx.query_port(1).expect("port").lid
}

/// Poll `cq` for up to `n` completions, stepping the emulator while none come; stops after
/// `idle` empty rounds.
fn collect(rig: &EmuRig, cq: &mut Cq, n: usize, idle: usize) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    let mut wcs = [WorkCompletion::default(); 64];
    let mut empty = 0;
    while out.len() < n && empty < idle {
        let k = cq.poll(&mut wcs);
        if k == 0 {
            empty += 1;
            rig.progress();
        } else {
            empty = 0;
            out.extend_from_slice(&wcs[..k]);
        }
    }
    out
}

/// The bytes of message `wr`, `len` long; the first 8 name it.
fn message(wr: u64, len: usize) -> Vec<u8> {
    let mut m: Vec<u8> = (0..len)
        .map(|j| (wr.wrapping_mul(0x9E37_79B9) as usize ^ j.wrapping_mul(131)) as u8)
        .collect();
    m[..8].copy_from_slice(&wr.to_le_bytes());
    m
}

fn knobs() -> ConnectParams {
    // Virtual time on the stepped emulator: a short ACK timeout, every retry.
    ConnectParams::new()
        .mtu(mlx5::Mtu::M1024)
        .timeout(8)
        .retry_cnt(7)
}

/// One side with a PD, a registered buffer of `len` bytes.
struct Mem {
    buf: Arc<DmaBuf>,
    mr: Mr,
}

fn mem(pd: &Pd, len: usize) -> Mem {
    let buf = Arc::new(DmaBuf::new(len).expect("buffer"));
    let mr = pd
        .reg_mr(&buf, Access::ALL | Access::LOCAL_WRITE)
        .expect("MR");
    Mem { buf, mr }
}

// ------------------------------------------------------------------------------------------
// XRC

/// HCA 0: `n` initiators on one CQ; HCA 1: `n` targets in a private domain, one XRC SRQ of
/// `wqes` receives of `msg` bytes.
struct Xrc {
    _a: Context,
    b: Context,
    cqa: Cq,
    cqb: Cq,
    inis: Vec<XrcSendQp>,
    tgts: Vec<XrcTgtQp>,
    srq: XrcSrq,
    src: Mem,
    dst: Mem,
    _pds: (Pd, Pd),
    _xrcd: XrcDomain,
}

fn xrc(rig: &EmuRig, n: usize, wqes: u32, msg: usize, p: ConnectParams) -> Xrc {
    let a = rig.open(0);
    let b = rig.open(1);
    let pda = Pd::new(&a).expect("PD");
    let pdb = Pd::new(&b).expect("PD");
    let cqa = cq(&a, 1024);
    let cqb = cq(&b, wqes.max(64));
    let xrcd = XrcDomain::private(&b).expect("XRC domain");
    let mut srq = XrcSrq::new(&xrcd, &pdb, &cqb, wqes - 1, 1).expect("XRC SRQ");
    let src = mem(&pda, 64 * msg + TAIL);
    let dst = mem(&pdb, wqes as usize * msg + TAIL);
    for i in 0..srq.capacity() {
        let sge = [dst.mr.sge(u64::from(i) * msg as u64, msg as u32)];
        srq.post_recv(&[RecvWr {
            wr_id: u64::from(i),
            sg_list: &sge,
        }])
        .expect("post SRQ");
    }
    let (la, lb) = (lid(&a), lid(&b));
    let mut inis = Vec::new();
    let mut tgts = Vec::new();
    for _ in 0..n {
        let mut init = QpInitAttr::new(QpType::XrcSend, &cqa, &cqa);
        init.cap.max_send_wr = 64;
        init.cap.max_send_sge = 3;
        init.cap.max_inline_data = 64;
        init.report_unsignaled = true;
        let mut q = XrcSendQp::new(&pda, &init).expect("XRC initiator");
        let mut t = XrcTgtQp::new(&xrcd).expect("XRC target");
        let to_t = RemoteQp {
            qpn: t.qpn(),
            psn: 0x200,
            lid: lb,
            gid: None,
        };
        let to_q = RemoteQp {
            qpn: q.qpn(),
            psn: 0x100,
            lid: la,
            gid: None,
        };
        q.to_init(1, &p).expect("INI INIT");
        q.to_rtr(&to_t, &p).expect("INI RTR");
        q.to_rts(0x100, &p).expect("INI RTS");
        t.to_init(1, Access::ALL, &p).expect("TGT INIT");
        t.to_rtr(&to_q, &p).expect("TGT RTR");
        t.to_rts(0x200, &p).expect("TGT RTS");
        inis.push(q);
        tgts.push(t);
    }
    Xrc {
        _a: a,
        b,
        cqa,
        cqb,
        inis,
        tgts,
        srq,
        src,
        dst,
        _pds: (pda, pdb),
        _xrcd: xrcd,
    }
}

#[test]
fn an_xrc_send_write_and_read_reach_the_srq_and_memory_the_wr_names() {
    let rig = EmuRig::stepped();
    let mut x = xrc(&rig, 1, 16, 256, knobs());
    let srqn = x.srq.number();
    x.src.buf.write(0, &message(7, 200));
    let sge = [x.src.mr.sge(0, 200)];
    let raddr = x.dst.buf.addr() + 4096 - 64;
    let wsge = [x.src.mr.sge(0, 32)];
    let rsge = [x.src.mr.sge(1024, 32)];
    let inline: [&[u8]; 2] = [b"in", b"line"];
    let wrs = [
        XrcWr {
            srqn,
            wr: SendWr::send(1, &sge, SendFlags::SIGNALED),
        },
        XrcWr {
            srqn,
            wr: SendWr::new(
                2,
                WrOp::Write {
                    raddr,
                    rkey: x.dst.mr.rkey(),
                },
                &wsge,
                SendFlags::SIGNALED,
            ),
        },
        XrcWr {
            srqn,
            wr: SendWr::new(
                3,
                WrOp::Read {
                    raddr,
                    rkey: x.dst.mr.rkey(),
                },
                &rsge,
                SendFlags::SIGNALED,
            ),
        },
        XrcWr {
            srqn,
            wr: SendWr::send_inline(4, &inline, SendFlags::SIGNALED),
        },
    ];
    x.inis[0].post_send(&wrs).expect("post");
    let sent = collect(&rig, &mut x.cqa, 4, 10_000);
    assert_eq!(
        sent.iter()
            .map(|w| (w.wr_id, w.status, w.opcode))
            .collect::<Vec<_>>(),
        [
            (1, WcStatus::SUCCESS, WcOpcode::SEND),
            (2, WcStatus::SUCCESS, WcOpcode::RDMA_WRITE),
            (3, WcStatus::SUCCESS, WcOpcode::RDMA_READ),
            (4, WcStatus::SUCCESS, WcOpcode::SEND),
        ]
    );
    let got = collect(&rig, &mut x.cqb, 2, 10_000);
    assert_eq!(got.len(), 2, "{got:?}");
    let tq = x.tgts[0].qpn();
    assert_eq!(
        (got[0].wr_id, got[0].byte_len, got[0].qp_num, got[0].opcode),
        (0, 200, tq, WcOpcode::RECV),
        "the SRQ's first WQE, naming the target QP"
    );
    assert_eq!((got[1].wr_id, got[1].byte_len), (1, 6));
    let mut b = vec![0u8; 200];
    x.dst.buf.read(0, &mut b);
    assert_eq!(b, message(7, 200));
    x.dst.buf.read(256, &mut b[..6]);
    assert_eq!(&b[..6], b"inline");
    // The WRITE landed, and the READ brought the same bytes back.
    let mut w = [0u8; 32];
    x.dst.buf.read(4096 - 64, &mut w);
    assert_eq!(&w[..], &message(7, 200)[..32]);
    x.src.buf.read(1024, &mut w);
    assert_eq!(&w[..], &message(7, 200)[..32]);
}

#[test]
fn an_srq_number_of_another_domain_fails_the_wr_with_a_remote_invalid_request() {
    let rig = EmuRig::stepped();
    let mut x = xrc(&rig, 1, 16, 256, knobs());
    let other = XrcDomain::private(&x.b).expect("domain");
    let pd = Pd::new(&x.b).expect("PD");
    let ocq = cq(&x.b, 8);
    let foreign = XrcSrq::new(&other, &pd, &ocq, 8, 1).expect("SRQ");
    let sge = [x.src.mr.sge(0, 16)];
    x.inis[0]
        .post_send(&[XrcWr {
            srqn: foreign.number(),
            wr: SendWr::send(9, &sge, SendFlags::SIGNALED),
        }])
        .expect("post");
    let sent = collect(&rig, &mut x.cqa, 1, 10_000);
    assert_eq!(
        sent.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(9, WcStatus::REM_INV_REQ_ERR)]
    );
    assert!(collect(&rig, &mut x.cqb, 1, 200).is_empty());
    // Nor does a number that is no SRQ at all reach anything.
    assert!(XrcSrqNum::new(1 << 24).is_err());
}

#[test]
fn xrc_objects_refuse_what_does_not_fit_them() {
    let rig = EmuRig::stepped();
    let a = rig.open(0);
    let pd = Pd::new(&a).expect("PD");
    let c = cq(&a, 8);
    // The untyped constructor points at the typed one.
    let init = QpInitAttr::new(QpType::XrcSend, &c, &c);
    match Qp::new(&pd, &init) {
        Err(Error::Unsupported { what }) => assert!(what.contains("XrcSendQp"), "{what}"),
        r => panic!("{r:?}"),
    }
    let rc = QpInitAttr::new(QpType::Rc, &c, &c);
    assert!(matches!(
        XrcSendQp::new(&pd, &rc),
        Err(Error::InvalidArgument {
            attr: "qp_type",
            ..
        })
    ));
    // An initiator's verbs path has no UD destination, and no SEND with invalidate.
    let mut q = XrcSendQp::new(&pd, &init).expect("initiator");
    let p = knobs();
    let me = RemoteQp {
        qpn: q.qpn(),
        psn: 0,
        lid: lid(&a),
        gid: None,
    };
    q.to_init(1, &p).expect("INIT");
    q.to_rtr(&me, &p).expect("RTR");
    q.to_rts(0, &p).expect("RTS");
    let srqn = XrcSrqNum::new(5).expect("number");
    let bad = SendWr::new(1, WrOp::SendInv { rkey: 1 }, &[], SendFlags::SIGNALED);
    assert_eq!(
        q.post_send(&[XrcWr { srqn, wr: bad }]),
        Err((0, PostError::BadOpcode))
    );
    // An atomic needs its 8-byte SGE.
    let atomic = SendWr::new(
        2,
        WrOp::FetchAdd {
            raddr: 0,
            rkey: 0,
            add: 1,
        },
        &[],
        SendFlags::SIGNALED,
    );
    assert_eq!(
        q.post_send(&[XrcWr { srqn, wr: atomic }]),
        Err((0, PostError::BadAtomicSge))
    );
    assert_eq!(q.qp().sq_ref().outstanding(), 0, "nothing was posted");
    // An XRC target goes INIT -> RTR with its receive attributes, not straight to RTS.
    let x = XrcDomain::private(&a).expect("domain");
    let mut t = XrcTgtQp::new(&x).expect("target");
    let rts = mlx5::QpAttr {
        qp_state: Some(mlx5::QpState::Rts),
        ..mlx5::QpAttr::default()
    };
    assert!(matches!(
        t.modify(&rts, mlx5::ffi::uverbs::IB_QP_STATE),
        Err(Error::InvalidArgument {
            attr: "qp_state",
            ..
        })
    ));
}

#[test]
fn a_domain_opened_on_one_file_is_shared_and_its_target_opens_by_number() {
    use std::os::fd::AsFd;
    let rig = EmuRig::stepped();
    let a = rig.open(1);
    let b = rig.open(1);
    let path = std::env::temp_dir().join(format!("mlx5-drv-xrcd-{}", std::process::id()));
    let f = std::fs::File::create(&path).expect("temp file");
    let r = XrcDomain::open(&a, f.as_fd(), XrcdOpen::Existing);
    assert!(
        matches!(&r, Err(Error::Uverbs { errno, .. }) if *errno == mlx5::error::Errno::EAGAIN),
        "{r:?}"
    );
    let xa = XrcDomain::open(&a, f.as_fd(), XrcdOpen::OrCreate).expect("create");
    let r = XrcDomain::open(&b, f.as_fd(), XrcdOpen::CreateNew);
    assert!(
        matches!(&r, Err(Error::Uverbs { errno, .. }) if *errno == mlx5::error::Errno::EINVAL),
        "{r:?}"
    );
    let xb = XrcDomain::open(&b, f.as_fd(), XrcdOpen::Existing).expect("shared");
    let t = XrcTgtQp::new(&xa).expect("target");
    let tb = XrcTgtQp::open(&xb, t.qpn()).expect("opened through the shared domain");
    assert_eq!(tb.qpn(), t.qpn());
    let private = XrcDomain::private(&b).expect("domain");
    assert!(XrcTgtQp::open(&private, t.qpn()).is_err(), "another domain");
    drop((tb, t, xa, xb));
    // Every handle gone: the file has no domain any more.
    let r = XrcDomain::open(&a, f.as_fd(), XrcdOpen::Existing);
    assert!(r.is_err(), "{r:?}");
    let _ = std::fs::remove_file(path);
}

fn faulty() -> EmuRig {
    EmuRig::with(EmuConfig {
        num_hcas: 2,
        mode: RunMode::Stepped,
        fault: FaultConfig {
            seed: 0x05ee_dd22,
            drop_ppm: 10_000,
            dup_ppm: 10_000,
            reorder_ppm: 10_000,
            delay_ns: 0,
        },
        corrupt_ppm: 10_000,
        ..EmuConfig::default()
    })
}

const WRS: u64 = 10_000;
/// Bytes after the receive slots (and the source slots) that the random sequences use.
const TAIL: usize = 65_536;
const MSG: usize = 256;

/// Check one receive completion of WR `wr` (its first 8 bytes) against the bytes sent and
/// record it; returns the WR number.
fn check_recv(
    wc: &WorkCompletion,
    dst: &Mem,
    seen: &mut [bool],
    by_qp: &mut BTreeMap<u32, Vec<u64>>,
) -> u64 {
    assert_eq!(wc.status, WcStatus::SUCCESS, "{wc:?}");
    let off = wc.wr_id as usize * MSG;
    let wr = dst.buf.read_u64(off);
    assert!(wr < WRS && !seen[wr as usize], "WR {wr} twice or unknown");
    seen[wr as usize] = true;
    let len = 8 + (wr as usize * 37) % (MSG - 8);
    assert_eq!(wc.byte_len as usize, len, "WR {wr}");
    let mut got = vec![0u8; len];
    dst.buf.read(off, &mut got);
    assert_eq!(got, message(wr, len), "bytes of WR {wr}");
    by_qp.entry(wc.qp_num).or_default().push(wr);
    wr
}

#[test]
fn four_xrc_initiators_into_one_srq_under_faults_deliver_every_wr_once_in_order() {
    let rig = faulty();
    let n = 4;
    let wqes = 16_384;
    let mut x = xrc(&rig, n, wqes, MSG, knobs());
    let srqn = x.srq.number();
    let (mut next, mut sent_done, mut received) = (0u64, 0u64, 0u64);
    let mut seen = vec![false; WRS as usize];
    let mut by_tgt = BTreeMap::new();
    let mut wcs = [WorkCompletion::default(); 64];
    let mut idle = 0u32;
    while sent_done < WRS || received < WRS {
        // Initiator k sends WRs k, k + n, ... (source slots reused only after their WR
        // completed: at most 48 of the 64 in flight).
        while next < WRS && next < sent_done + 48 {
            let k = (next % n as u64) as usize;
            let len = 8 + (next as usize * 37) % (MSG - 8);
            let slot = (next % 64) * MSG as u64;
            x.src.buf.write(slot as usize, &message(next, len));
            let sge = [x.src.mr.sge(slot, len as u32)];
            x.inis[k]
                .post_send(&[XrcWr {
                    srqn,
                    wr: SendWr::send(next, &sge, SendFlags::SIGNALED),
                }])
                .expect("post");
            next += 1;
        }
        let s = x.cqa.poll(&mut wcs);
        for wc in &wcs[..s] {
            assert_eq!(wc.status, WcStatus::SUCCESS, "{wc:?}");
            sent_done += 1;
        }
        let r = x.cqb.poll(&mut wcs);
        for wc in &wcs[..r] {
            let wr = check_recv(wc, &x.dst, &mut seen, &mut by_tgt);
            assert_eq!(
                wc.qp_num,
                x.tgts[(wr % n as u64) as usize].qpn(),
                "WR {wr}'s target"
            );
            received += 1;
        }
        if s + r == 0 {
            idle += 1;
            assert!(
                idle < 2_000_000,
                "stalled: posted {next}, sent {sent_done}, received {received}"
            );
            rig.progress();
        } else {
            idle = 0;
        }
    }
    assert!(seen.iter().all(|&s| s));
    for (t, wrs) in &by_tgt {
        assert!(
            wrs.windows(2).all(|p| p[0] < p[1]),
            "target {t:#x}: out of order"
        );
        assert_eq!(wrs.len() as u64, WRS / n as u64, "target {t:#x}");
    }
    let c = (rig.emu.counters(0), rig.emu.counters(1));
    let dropped = c.0.packets_dropped + c.1.packets_dropped;
    eprintln!(
        "XRC {WRS} WRs: packets sent {} dropped {dropped}; duplicates {}",
        c.0.packets_sent, c.1.duplicate_request
    );
    assert!(dropped > 0, "the campaign dropped nothing");
}

// ------------------------------------------------------------------------------------------
// DC

const KEY: u64 = 0x0123_4567_89ab_cdef;

struct DcRig {
    cqa: Cq,
    cqb: Cq,
    dci: Dci,
    dcts: Vec<Dct>,
    addrs: Vec<DcAddr>,
    ah: Ah,
    src: Mem,
    dst: Mem,
    srq_b: Srq,
    _ctx: (Context, Context, Pd, Pd),
}

fn dc(rig: &EmuRig, n: usize, wqes: u32, msg: usize, p: ConnectParams) -> DcRig {
    let a = rig.open(0);
    let b = rig.open(1);
    let pda = Pd::new(&a).expect("PD");
    let pdb = Pd::new(&b).expect("PD");
    let cqa = cq(&a, 1024);
    let cqb = cq(&b, wqes.max(64));
    let src = mem(&pda, 64 * msg + TAIL);
    let dst = mem(&pdb, wqes as usize * msg + TAIL);
    let mut srq = Srq::new(&pdb, wqes - 1, 1).expect("SRQ");
    for i in 0..srq.capacity() {
        let sge = [dst.mr.sge(u64::from(i) * msg as u64, msg as u32)];
        srq.post_recv(&[RecvWr {
            wr_id: u64::from(i),
            sg_list: &sge,
        }])
        .expect("post SRQ");
    }
    let mut dcts = Vec::new();
    for _ in 0..n {
        let mut d = Dct::new(&pdb, &cqb, &srq, KEY).expect("DCT");
        assert_eq!(d.number(), None, "no number before RTR");
        let num = d.activate(1, Access::ALL, &p).expect("DCT to RTR");
        assert_eq!(d.number(), Some(num));
        dcts.push(d);
    }
    let mut init = QpInitAttr::new(QpType::Dci, &cqa, &cqa);
    init.cap.max_send_wr = 64;
    init.cap.max_send_sge = 3;
    init.cap.max_inline_data = 64;
    init.report_unsignaled = true;
    let mut dci = Dci::new(&pda, &init).expect("DCI");
    dci.activate(1, 0x100, &p).expect("DCI to RTS");
    let ah = Ah::new(
        &pda,
        AhAttr {
            dlid: lid(&b),
            port_num: 1,
            ..AhAttr::default()
        },
    )
    .expect("AH");
    let addrs = dcts
        .iter()
        .map(|d| DcAddr::new(&ah, d.number().unwrap(), KEY).expect("address"))
        .collect();
    DcRig {
        cqa,
        cqb,
        dci,
        dcts,
        addrs,
        ah,
        src,
        dst,
        srq_b: srq,
        _ctx: (a, b, pda, pdb),
    }
}

#[test]
fn a_dci_reaches_each_dct_its_wr_names_and_fails_a_wrong_key_or_an_absent_dct() {
    let rig = EmuRig::stepped();
    let p = knobs().timeout(4).retry_cnt(1);
    let mut d = dc(&rig, 2, 16, 256, p);
    d.src.buf.write(0, &message(3, 100));
    let sge = [d.src.mr.sge(0, 100)];
    let raddr = d.dst.buf.addr() + 4000;
    let wsge = [d.src.mr.sge(0, 16)];
    let wrs = [
        DcWr {
            dest: &d.addrs[0],
            wr: SendWr::send(1, &sge, SendFlags::SIGNALED),
            stream: 0,
        },
        DcWr {
            dest: &d.addrs[1],
            wr: SendWr::send(2, &sge, SendFlags::SIGNALED),
            stream: 0,
        },
        DcWr {
            dest: &d.addrs[1],
            wr: SendWr::new(
                3,
                WrOp::Write {
                    raddr,
                    rkey: d.dst.mr.rkey(),
                },
                &wsge,
                SendFlags::SIGNALED,
            ),
            stream: 0,
        },
    ];
    d.dci.post_send(&wrs).expect("post");
    let sent = collect(&rig, &mut d.cqa, 3, 10_000);
    assert_eq!(
        sent.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [
            (1, WcStatus::SUCCESS),
            (2, WcStatus::SUCCESS),
            (3, WcStatus::SUCCESS)
        ]
    );
    let got = collect(&rig, &mut d.cqb, 2, 10_000);
    let by: Vec<_> = got.iter().map(|w| (w.qp_num, w.byte_len)).collect();
    assert_eq!(
        by,
        [
            (d.dcts[0].number().unwrap(), 100),
            (d.dcts[1].number().unwrap(), 100)
        ],
        "each DCT received its own WR"
    );
    let mut w = [0u8; 16];
    d.dst.buf.read(4000, &mut w);
    assert_eq!(&w[..], &message(3, 100)[..16]);
    // A wrong key: the target does not answer; the WR ends in a transport-retry error.
    let bad = DcAddr::new(&d.ah, d.dcts[0].number().unwrap(), KEY ^ 1).expect("address");
    d.dci
        .post_send(&[DcWr {
            dest: &bad,
            wr: SendWr::send(4, &sge, SendFlags::SIGNALED),
            stream: 0,
        }])
        .expect("post");
    let sent = collect(&rig, &mut d.cqa, 1, 1_000_000);
    assert_eq!(
        sent.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(4, WcStatus::RETRY_EXC_ERR)]
    );
    assert!(collect(&rig, &mut d.cqb, 1, 200).is_empty());
}

#[test]
fn an_absent_dct_fails_the_wr_and_a_foreign_address_is_refused() {
    let rig = EmuRig::stepped();
    let p = knobs().timeout(4).retry_cnt(1);
    let mut d = dc(&rig, 1, 16, 256, p);
    let sge = [d.src.mr.sge(0, 8)];
    let absent = DcAddr::new(&d.ah, 0xabcd, KEY).expect("address");
    d.dci
        .post_send(&[DcWr {
            dest: &absent,
            wr: SendWr::send(1, &sge, SendFlags::SIGNALED),
            stream: 0,
        }])
        .expect("post");
    let sent = collect(&rig, &mut d.cqa, 1, 1_000_000);
    assert_eq!(
        sent.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::RETRY_EXC_ERR)]
    );
    // An address built on another context's AH never reaches the ring.
    let other = rig.open(0);
    let opd = Pd::new(&other).expect("PD");
    let oah = Ah::new(
        &opd,
        AhAttr {
            dlid: 1,
            port_num: 1,
            ..AhAttr::default()
        },
    )
    .expect("AH");
    let foreign = DcAddr::new(&oah, 1, KEY).expect("address");
    let before = d.dci.qp().sq_ref().producer();
    assert_eq!(
        d.dci.post_send(&[DcWr {
            dest: &foreign,
            wr: SendWr::send(2, &sge, SendFlags::SIGNALED),
            stream: 0,
        }]),
        Err((0, PostError::ForeignAh))
    );
    assert_eq!(d.dci.qp().sq_ref().producer(), before);
    assert!(DcAddr::new(&d.ah, 1 << 24, KEY).is_err());
    let init = QpInitAttr::new(QpType::Dci, &d.cqa, &d.cqa);
    assert!(matches!(
        Qp::new(&opd, &init),
        Err(Error::Unsupported { .. })
    ));
}

#[test]
fn one_dci_round_robin_over_eight_dcts_under_faults_delivers_every_wr_once_in_order() {
    let rig = faulty();
    let n = 8;
    let mut d = dc(&rig, n, 16_384, MSG, knobs());
    let (mut next, mut sent_done, mut received) = (0u64, 0u64, 0u64);
    let mut seen = vec![false; WRS as usize];
    let mut by_dct = BTreeMap::new();
    let mut wcs = [WorkCompletion::default(); 64];
    let mut idle = 0u32;
    while sent_done < WRS || received < WRS {
        // WR i goes to DCT i % 8: every WR reconnects.
        while next < WRS && next < sent_done + 48 {
            let len = 8 + (next as usize * 37) % (MSG - 8);
            let slot = (next % 64) * MSG as u64;
            d.src.buf.write(slot as usize, &message(next, len));
            let sge = [d.src.mr.sge(slot, len as u32)];
            d.dci
                .post_send(&[DcWr {
                    dest: &d.addrs[(next % n as u64) as usize],
                    wr: SendWr::send(next, &sge, SendFlags::SIGNALED),
                    stream: 0,
                }])
                .expect("post");
            next += 1;
        }
        let s = d.cqa.poll(&mut wcs);
        for wc in &wcs[..s] {
            assert_eq!(
                (wc.wr_id, wc.status),
                (sent_done, WcStatus::SUCCESS),
                "send completions in order"
            );
            sent_done += 1;
        }
        let r = d.cqb.poll(&mut wcs);
        for wc in &wcs[..r] {
            let wr = check_recv(wc, &d.dst, &mut seen, &mut by_dct);
            assert_eq!(
                Some(wc.qp_num),
                d.dcts[(wr % n as u64) as usize].number(),
                "WR {wr}'s DCT"
            );
            received += 1;
        }
        if s + r == 0 {
            idle += 1;
            assert!(
                idle < 2_000_000,
                "stalled: posted {next}, sent {sent_done}, received {received}"
            );
            rig.progress();
        } else {
            idle = 0;
        }
    }
    assert!(seen.iter().all(|&s| s));
    assert_eq!(by_dct.len(), n);
    for (t, wrs) in &by_dct {
        assert!(
            wrs.windows(2).all(|p| p[0] < p[1]),
            "DCT {t:#x}: out of order"
        );
        assert_eq!(wrs.len() as u64, WRS / n as u64, "DCT {t:#x}");
    }
    let c = (rig.emu.counters(0), rig.emu.counters(1));
    let dropped = c.0.packets_dropped + c.1.packets_dropped;
    eprintln!(
        "DC {WRS} WRs over {n} DCTs: packets sent {} dropped {dropped}",
        c.0.packets_sent
    );
    assert!(dropped > 0, "the campaign dropped nothing");
}

// ------------------------------------------------------------------------------------------
// Random sequences

/// xorshift64*: a seeded sequence, so a failure names its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Random chains of every operation on one initiator, some with a bad WR in them (refused
/// with its index, the WRs before it posted and rung), unsignaled WRs reported when retired:
/// every posted WR completes exactly once, in posting order; every receive-consuming WR is
/// received once; the fetch-and-add counter ends at the sum of what was added; READs bring
/// back the target's bytes.
fn random_sequences(xrc_side: bool, seed: u64) {
    let rig = EmuRig::stepped();
    const RECV_SLOTS: u32 = 1024;
    const MSGB: usize = 64;
    let (mut x, mut d) = (None, None);
    if xrc_side {
        x = Some(xrc(&rig, 2, RECV_SLOTS, MSGB, knobs()));
    } else {
        d = Some(dc(&rig, 4, RECV_SLOTS, MSGB, knobs()));
    }
    let (src, dst) = match (&x, &d) {
        (Some(x), _) => (&x.src, &x.dst),
        (_, Some(d)) => (&d.src, &d.dst),
        _ => unreachable!(),
    };
    let (src_buf, dst_buf) = (src.buf.clone(), dst.buf.clone());
    let (lkey_mr, rkey) = (src.mr.sge(0, 1), dst.mr.rkey());
    let dst_addr = dst_buf.addr();
    // The target's memory after the receive slots: a READ source that nothing writes, the
    // atomic counter, the WRITE targets.
    let tail = u64::from(RECV_SLOTS) * MSGB as u64;
    let read_off = tail as usize;
    let counter_off = tail as usize + 1024;
    let write_at = dst_addr + tail + 4096;
    let pattern: Vec<u8> = (0..256u32).map(|i| (i * 7 + 3) as u8).collect();
    dst_buf.write(read_off, &pattern);
    dst_buf.write(counter_off, &0u64.to_ne_bytes());
    // This side: SEND/WRITE sources at 2048.. (never written), READ results at 16384..,
    // fetch-and-add results at 32768...
    let sge = |off: u64, len: u32| mlx5::Sge {
        addr: src_buf.addr() + off,
        length: len,
        lkey: lkey_mr.lkey,
    };
    let mut rng = Rng(seed);
    let mut refused = 0u32;
    let (mut next_id, mut done) = (0u64, 0u64);
    let (mut want_recv, mut got_recv, mut added) = (0u64, 0u64, 0u64);
    let mut reads: Vec<(u64, u64)> = Vec::new(); // (wr id, local offset)
    let mut wcs = [WorkCompletion::default(); 64];
    let inline_data = [0xabu8; 2048];
    for step in 0..1500 {
        let n = 1 + rng.below(4) as usize;
        let bad_at = (rng.below(20) == 0).then(|| rng.below(n as u64) as usize);
        let mut ops = Vec::new();
        let mut sges = Vec::new();
        for i in 0..n {
            let k = rng.below(8);
            let slot = (next_id + i as u64) % 32;
            let op = match k {
                0 | 1 => WrOp::Send,
                2 => WrOp::SendImm { imm: [1, 2, 3, 4] },
                3 => WrOp::Write {
                    raddr: write_at + rng.below(64) * 8,
                    rkey,
                },
                4 => WrOp::WriteImm {
                    raddr: write_at,
                    rkey,
                    imm: [9; 4],
                },
                5 => WrOp::Read {
                    raddr: dst_addr + read_off as u64,
                    rkey,
                },
                _ => WrOp::FetchAdd {
                    raddr: dst_addr + counter_off as u64,
                    rkey,
                    add: 1 + rng.below(5),
                },
            };
            let nsge = match op {
                WrOp::FetchAdd { .. } => 1,
                WrOp::Read { .. } => 1,
                _ => rng.below(4) as usize,
            };
            let len = match op {
                WrOp::FetchAdd { .. } => 8,
                WrOp::Read { .. } => 64,
                _ => 1 + rng.below(16) as u32,
            };
            let local = match op {
                WrOp::Read { .. } => 16_384 + 64 * slot,
                WrOp::FetchAdd { .. } => 32_768 + 8 * slot,
                _ => 2048 + 64 * slot,
            };
            let list: Vec<mlx5::Sge> = (0..nsge).map(|j| sge(local + 16 * j as u64, len)).collect();
            ops.push(op);
            sges.push(list);
        }
        let inline_parts: [&[u8]; 2] = [&inline_data[..20], &inline_data[..30]];
        let too_big: [&[u8]; 1] = [&inline_data[..]];
        let wrs: Vec<SendWr<'_>> = (0..n)
            .map(|i| {
                let id = next_id + i as u64;
                // The last WR of a chain is signaled: its CQE retires (and reports) the
                // unsignaled ones before it.
                let flags = if i + 1 == n || rng.below(3) == 0 {
                    SendFlags::SIGNALED
                } else {
                    SendFlags::NONE
                };
                let mut wr = SendWr::new(id, ops[i], &sges[i], flags);
                if matches!(ops[i], WrOp::Send) && rng.below(3) == 0 {
                    wr = wr.with_inline(&inline_parts);
                }
                if bad_at == Some(i) {
                    wr = match rng.below(3) {
                        0 => SendWr::new(id, WrOp::SendInv { rkey: 1 }, &[], flags),
                        1 => SendWr::new(
                            id,
                            WrOp::CompareSwap {
                                raddr: dst_addr,
                                rkey,
                                compare: 0,
                                swap: 0,
                            },
                            &[],
                            flags,
                        ),
                        _ => SendWr::new(id, WrOp::Send, &[], flags).with_inline(&too_big),
                    };
                }
                wr
            })
            .collect();
        let mut room_idle = 0;
        // Room: wait until the chain fits (every WR is reported, so `outstanding` drains).
        loop {
            let free = match (&x, &d) {
                (Some(x), _) => x.inis[0].qp().sq_ref().free(),
                (_, Some(d)) => d.dci.qp().sq_ref().free(),
                _ => unreachable!(),
            };
            if free as usize > n {
                break;
            }
            let cq = match (&mut x, &mut d) {
                (Some(x), _) => &mut x.cqa,
                (_, Some(d)) => &mut d.cqa,
                _ => unreachable!(),
            };
            let k = cq.poll(&mut wcs);
            for wc in &wcs[..k] {
                assert_eq!(
                    (wc.wr_id, wc.status),
                    (done, WcStatus::SUCCESS),
                    "seed {seed:#x}"
                );
                done += 1;
            }
            if k == 0 {
                room_idle += 1;
                assert!(room_idle < 100_000, "seed {seed:#x} step {step}: no room");
                rig.progress();
            }
        }
        let r = match (&mut x, &mut d) {
            (Some(x), _) => {
                let srqn = x.srq.number();
                let v: Vec<XrcWr<'_>> = wrs.iter().map(|&wr| XrcWr { srqn, wr }).collect();
                x.inis[0].post_send(&v)
            }
            (_, Some(d)) => {
                let v: Vec<DcWr<'_>> = wrs
                    .iter()
                    .enumerate()
                    .map(|(i, &wr)| DcWr {
                        dest: &d.addrs[(step + i) % d.addrs.len()],
                        wr,
                        stream: 0,
                    })
                    .collect();
                d.dci.post_send(&v)
            }
            _ => unreachable!(),
        };
        let posted = match (r, bad_at) {
            (Ok(()), None) => n,
            (Err((i, e)), Some(b)) => {
                refused += 1;
                assert_eq!(
                    i, b,
                    "seed {seed:#x} step {step}: refused {e:?} at {i}, bad WR at {b}"
                );
                b
            }
            (r, b) => panic!("seed {seed:#x} step {step}: {r:?} with bad WR at {b:?}"),
        };
        for (i, op) in ops.iter().enumerate().take(posted) {
            match op {
                WrOp::Send | WrOp::SendImm { .. } | WrOp::WriteImm { .. } => want_recv += 1,
                WrOp::FetchAdd { add, .. } => added += add,
                WrOp::Read { .. } => reads.push((
                    next_id + i as u64,
                    16_384 + 64 * ((next_id + i as u64) % 32),
                )),
                _ => {}
            }
        }
        next_id += posted as u64;
        if posted < n && posted > 0 {
            // A refused chain may end in unsignaled WRs: a signaled SEND retires them.
            flush(&mut x, &mut d, sge(2048, 8), next_id);
            next_id += 1;
            want_recv += 1;
        }
        // The refused WR and those after it were never posted: their ids are reused.
        // Receives: drain and replenish (the SRQs have room for all of them anyway).
        let rcq = match (&mut x, &mut d) {
            (Some(x), _) => &mut x.cqb,
            (_, Some(d)) => &mut d.cqb,
            _ => unreachable!(),
        };
        let k = rcq.poll(&mut wcs);
        for wc in &wcs[..k] {
            assert_eq!(wc.status, WcStatus::SUCCESS, "seed {seed:#x}: {wc:?}");
            got_recv += 1;
        }
        repost(&mut x, &mut d, &wcs[..k], MSGB);
    }
    // A last signaled SEND retires whatever unsignaled WRs a refused chain left behind.
    flush(&mut x, &mut d, sge(2048, 8), next_id);
    next_id += 1;
    want_recv += 1;
    // Drain everything.
    let mut idle = 0;
    while done < next_id || got_recv < want_recv {
        let (scq, rcq) = match (&mut x, &mut d) {
            (Some(x), _) => (&mut x.cqa, &mut x.cqb),
            (_, Some(d)) => (&mut d.cqa, &mut d.cqb),
            _ => unreachable!(),
        };
        let k = scq.poll(&mut wcs);
        for wc in &wcs[..k] {
            assert_eq!(
                (wc.wr_id, wc.status),
                (done, WcStatus::SUCCESS),
                "seed {seed:#x}"
            );
            done += 1;
        }
        let m = rcq.poll(&mut wcs);
        got_recv += m as u64;
        repost(&mut x, &mut d, &wcs[..m], MSGB);
        if k + m == 0 {
            idle += 1;
            assert!(
                idle < 100_000,
                "seed {seed:#x}: stalled at {done}/{next_id}, {got_recv}/{want_recv}"
            );
            rig.progress();
        }
    }
    assert_eq!(done, next_id, "seed {seed:#x}: every posted WR once");
    assert_eq!(got_recv, want_recv, "seed {seed:#x}: every receive once");
    assert!(
        collect(
            &rig,
            match (&mut x, &mut d) {
                (Some(x), _) => &mut x.cqa,
                (_, Some(d)) => &mut d.cqa,
                _ => unreachable!(),
            },
            1,
            100
        )
        .is_empty(),
        "nothing more"
    );
    assert_eq!(
        dst_buf.read_u64(counter_off),
        added,
        "seed {seed:#x}: the counter"
    );
    assert!(
        !reads.is_empty() && refused > 0,
        "seed {seed:#x}: {refused} refused chains"
    );
    eprintln!(
        "seed {seed:#x}: {next_id} WRs posted, {refused} chains refused at their bad WR, \
         {got_recv} received, {} READs, {added} added",
        reads.len()
    );
    for (id, off) in &reads {
        // Every READ of a slot brought the same bytes.
        let mut got = vec![0u8; 64];
        src_buf.read(*off as usize, &mut got);
        assert_eq!(got, pattern[..64], "seed {seed:#x}: READ {id}");
    }
}

/// Post one signaled SEND (`wr_id` `id`) of `sge` on whichever initiator the rig has.
fn flush(x: &mut Option<Xrc>, d: &mut Option<DcRig>, sge: mlx5::Sge, id: u64) {
    let list = [sge];
    let wr = SendWr::send(id, &list, SendFlags::SIGNALED);
    match (x, d) {
        (Some(x), _) => {
            let srqn = x.srq.number();
            x.inis[0].post_send(&[XrcWr { srqn, wr }])
        }
        (_, Some(d)) => d.dci.post_send(&[DcWr {
            dest: &d.addrs[0],
            wr,
            stream: 0,
        }]),
        _ => unreachable!(),
    }
    .expect("the flushing SEND");
}

/// Give the receives of `wcs` back to the SRQ, each into its own slot again.
fn repost(x: &mut Option<Xrc>, d: &mut Option<DcRig>, wcs: &[WorkCompletion], msg: usize) {
    for wc in wcs {
        match (&mut *x, &mut *d) {
            (Some(x), _) => {
                let sge = [x.dst.mr.sge(wc.wr_id * msg as u64, msg as u32)];
                x.srq.post_recv(&[RecvWr {
                    wr_id: wc.wr_id,
                    sg_list: &sge,
                }])
            }
            (_, Some(d)) => {
                let sge = [d.dst.mr.sge(wc.wr_id * msg as u64, msg as u32)];
                d.srq_b.post_recv(&[RecvWr {
                    wr_id: wc.wr_id,
                    sg_list: &sge,
                }])
            }
            _ => unreachable!(),
        }
        .expect("repost a receive");
    }
}

#[test]
fn random_xrc_chains_with_bad_wrs_complete_every_posted_wr_once_in_order() {
    for seed in [0x22_0001u64, 0x22_0002] {
        random_sequences(true, seed);
    }
}

#[test]
fn random_dc_chains_over_four_dcts_complete_every_posted_wr_once_in_order() {
    for seed in [0x22_0003u64, 0x22_0004] {
        random_sequences(false, seed);
    }
}

#[test]
fn on_a_roce_port_xrc_and_dc_route_by_gid() {
    use mlx5::GlobalRoute;
    let rig = EmuRig::roce();
    let a = rig.open(0);
    let b = rig.open(1);
    let (ga, gb) = (
        a.find_gid(1).expect("gids").expect("a RoCE v2 GID"),
        b.find_gid(1).expect("gids").expect("a RoCE v2 GID"),
    );
    let pda = Pd::new(&a).expect("PD");
    let pdb = Pd::new(&b).expect("PD");
    let mut cqa = cq(&a, 64);
    let mut cqb = cq(&b, 64);
    let src = mem(&pda, 4096);
    let dst = mem(&pdb, 4096);
    src.buf.write(0, &message(5, 64));
    let sge = [src.mr.sge(0, 64)];
    // XRC: initiator on A, target and SRQ on B, connected by GID.
    let xrcd = XrcDomain::private(&b).expect("domain");
    let mut xsrq = XrcSrq::new(&xrcd, &pdb, &cqb, 8, 1).expect("XRC SRQ");
    let mut srq = Srq::new(&pdb, 8, 1).expect("SRQ");
    for i in 0..4u64 {
        let r = [dst.mr.sge(i * 256, 256)];
        let w = [RecvWr {
            wr_id: i,
            sg_list: &r,
        }];
        xsrq.post_recv(&w).expect("recv");
        srq.post_recv(&w).expect("recv");
    }
    let mut init = QpInitAttr::new(QpType::XrcSend, &cqa, &cqa);
    init.cap.max_send_wr = 8;
    let mut ini = XrcSendQp::new(&pda, &init).expect("initiator");
    let mut tgt = XrcTgtQp::new(&xrcd).expect("target");
    let pa = knobs().sgid_index(ga.0 as u8);
    let pb = knobs().sgid_index(gb.0 as u8);
    let at = |qpn, g: (u32, [u8; 16])| RemoteQp {
        qpn,
        psn: 0,
        lid: 0,
        gid: Some(g.1),
    };
    ini.to_init(1, &pa).expect("INIT");
    ini.to_rtr(&at(tgt.qpn(), gb), &pa).expect("RTR");
    ini.to_rts(0, &pa).expect("RTS");
    tgt.to_init(1, Access::ALL, &pb).expect("INIT");
    tgt.to_rtr(&at(ini.qpn(), ga), &pb).expect("RTR");
    tgt.to_rts(0, &pb).expect("RTS");
    ini.post_send(&[XrcWr {
        srqn: xsrq.number(),
        wr: SendWr::send(1, &sge, SendFlags::SIGNALED),
    }])
    .expect("post");
    // DC: a DCI on A to a DCT on B, through an AH with the GRH.
    let mut dct = Dct::new(&pdb, &cqb, &srq, KEY).expect("DCT");
    let dctn = dct.activate(1, Access::ALL, &pb).expect("DCT RTR");
    let mut dinit = QpInitAttr::new(QpType::Dci, &cqa, &cqa);
    dinit.cap.max_send_wr = 8;
    let mut dci = Dci::new(&pda, &dinit).expect("DCI");
    dci.activate(1, 0, &pa).expect("DCI RTS");
    let ah = Ah::new(
        &pda,
        AhAttr {
            port_num: 1,
            grh: Some(GlobalRoute {
                dgid: gb.1,
                sgid_index: ga.0 as u8,
                hop_limit: 64,
                ..GlobalRoute::default()
            }),
            ..AhAttr::default()
        },
    )
    .expect("AH");
    let to = DcAddr::new(&ah, dctn, KEY).expect("address");
    dci.post_send(&[DcWr {
        dest: &to,
        wr: SendWr::send(2, &sge, SendFlags::SIGNALED),
        stream: 0,
    }])
    .expect("post");
    let sent = collect(&rig, &mut cqa, 2, 10_000);
    assert_eq!(
        sent.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::SUCCESS), (2, WcStatus::SUCCESS)]
    );
    let got = collect(&rig, &mut cqb, 2, 10_000);
    let mut by: Vec<_> = got.iter().map(|w| (w.qp_num, w.byte_len)).collect();
    by.sort();
    let mut want = vec![(tgt.qpn(), 64), (dctn, 64)];
    want.sort();
    assert_eq!(by, want, "{got:?}");
    let mut b = vec![0u8; 64];
    dst.buf.read(0, &mut b);
    assert_eq!(b, message(5, 64));
}

/// A DCI with streams (`Dci::with_streams`, perftest's `--log_dci_streams`): the stream id rides
/// in each WQE's control segment (byte-identical with libmlx5's `mlx5dv_wr_set_dc_addr_stream`
/// in `tools/wqe-compare`), every stream's WRs arrive, a stream the DCI does not have is refused
/// by name with nothing posted, and stream counts the device does not offer are refused at
/// creation.
#[test]
fn a_dci_with_streams_sends_on_every_stream_and_refuses_one_it_does_not_have() {
    let rig = EmuRig::stepped();
    let p = knobs();
    let mut d = dc(&rig, 2, 16, 256, p);
    let mut init = QpInitAttr::new(QpType::Dci, &d.cqa, &d.cqa);
    init.cap.max_send_wr = 64;
    init.cap.max_send_sge = 1;
    init.report_unsignaled = true;
    let pda = &d._ctx.2;
    for (s, attr) in [
        ((0, 0), "log_concurrent"),
        ((5, 0), "log_concurrent"),
        ((2, 3), "log_errored"),
    ] {
        let streams = DciStreams {
            log_concurrent: s.0,
            log_errored: s.1,
        };
        match Dci::with_streams(pda, &init, streams) {
            Err(Error::InvalidArgument { attr: a, .. }) => assert_eq!(a, attr, "{s:?}"),
            other => panic!("{s:?}: {other:?}"),
        }
    }
    let streams = DciStreams {
        log_concurrent: 2,
        log_errored: 0,
    };
    let mut s = Dci::with_streams(pda, &init, streams).expect("DCI with streams");
    assert_eq!((s.streams(), d.dci.streams()), (4, 1));
    s.activate(1, 0x200, &p).expect("to RTS");
    d.src.buf.write(0, &message(9, 64));
    let sge = [d.src.mr.sge(0, 64)];
    let wrs: Vec<DcWr<'_>> = (0..8u16)
        .map(|i| DcWr {
            dest: &d.addrs[usize::from(i % 2)],
            wr: SendWr::send(u64::from(i), &sge, SendFlags::SIGNALED),
            stream: i % 4,
        })
        .collect();
    s.post_send(&wrs).expect("post on streams 0..3");
    let sent = collect(&rig, &mut d.cqa, 8, 10_000);
    assert_eq!(
        sent.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        (0..8).map(|i| (i, WcStatus::SUCCESS)).collect::<Vec<_>>()
    );
    assert_eq!(
        collect(&rig, &mut d.cqb, 8, 10_000).len(),
        8,
        "every WR arrived"
    );
    let one = |stream| DcWr {
        dest: &d.addrs[0],
        wr: SendWr::send(99, &sge, SendFlags::SIGNALED),
        stream,
    };
    let before = s.sq().stats().wqes;
    assert_eq!(
        s.post_send(&[one(4)]),
        Err((
            0,
            PostError::BadStream {
                stream: 4,
                streams: 4
            }
        ))
    );
    assert_eq!(s.sq().stats().wqes, before, "nothing posted");
    assert_eq!(
        d.dci.post_send(&[one(1)]),
        Err((
            0,
            PostError::BadStream {
                stream: 1,
                streams: 1
            }
        )),
        "a DCI without streams has stream 0 only"
    );
    assert!(
        PostError::BadStream {
            stream: 4,
            streams: 4
        }
        .to_string()
        .contains("stream id 4")
    );
}
