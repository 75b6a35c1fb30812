//! XRC and DC on the emulated HCA, with WQEs built by hand (mlx5-hw), on the stepped
//! emulator: the kernel objects and their errnos (XRC domains shared by file, CLOSE_XRCD
//! while in use, OPEN_QP, DC targets reporting their number at RTR), the device's XRC
//! receive through the SRQ the XRCETH names (wrong SRQ, other domain), DC connections (a DCI
//! round-robin over 8 DCTs, a wrong key, an absent DCT) and both under the seeded fault
//! campaign: every WR completes once, in order per initiator, with the right bytes.

mod common;

use std::collections::BTreeMap;

use common::*;
use mlx5_emu::{EmuConfig, Emulator, FaultConfig, RunMode};
use mlx5_ffi::mlx5::{
    MLX5_QP_FLAG_TYPE_DCI, MLX5_QP_FLAG_TYPE_DCT, Mlx5IbCreateQp, Mlx5IbCreateSrq,
    Mlx5IbModifyQpResp,
};
use mlx5_ffi::surface::Errno;
use mlx5_ffi::uverbs::*;
use mlx5_ffi::xrc_dc::*;
use mlx5_hw::opcodes::SendOpcode;
use mlx5_hw::wqe::{DataSeg, DatagramSeg, FM_CE_SE_CQ_UPDATE, SrqNextSeg};
use zerocopy::{FromBytes, IntoBytes};

const EINVAL: Errno = Errno(libc::EINVAL);
const EBUSY: Errno = Errno(libc::EBUSY);
const EAGAIN: Errno = Errno(libc::EAGAIN);
const EBADF: Errno = Errno(libc::EBADF);

/// CQE opcodes and syndromes the tests expect.
const CQE_REQ: u8 = 0;
const CQE_RECV: u8 = 2;
const CQE_REQ_ERR: u8 = 13;
const SYND_REM_INV_REQ: u8 = 0x12;
const SYND_RETRY_EXC: u8 = 0x15;

const XRC_INI: u8 = qp_type::XRC_INI;
const XRC_TGT: u8 = qp_type::XRC_TGT;

fn open_xrcd(ctx: &Ctx, fd: i32, oflags: i32) -> Result<u32, Errno> {
    let c = IbUverbsOpenXrcd {
        response: 0,
        fd: fd as u32,
        oflags: oflags as u32,
    };
    let (o, _) = write_cmd(
        &ctx.dev,
        IB_USER_VERBS_CMD_OPEN_XRCD,
        c.as_bytes(),
        &[],
        4,
        0,
    )?;
    Ok(u32::from_ne_bytes([o[0], o[1], o[2], o[3]]))
}

fn close_xrcd(ctx: &Ctx, h: u32) -> Result<(), Errno> {
    write_noresp(
        &ctx.dev,
        IB_USER_VERBS_CMD_CLOSE_XRCD,
        IbUverbsCloseXrcd { xrcd_handle: h }.as_bytes(),
        &[],
    )
}

/// An SRQ with its ring (stride 32: next segment + one data segment).
struct Srq {
    handle: u32,
    srqn: u32,
    buf: Buf,
    db: u64,
    posted: u32,
    uidx: u32,
}

impl Srq {
    /// Post WQE `i` (linked to `i + 1`) receiving into `addr`.
    fn post(&mut self, i: u32, addr: u64, len: u32, lkey: u32) {
        let mut w = SrqNextSeg::new((i + 1) as u16).as_bytes().to_vec();
        w.extend_from_slice(DataSeg::new(len, lkey, addr).as_bytes());
        self.buf.write(i as usize * 32, &w);
        self.posted += 1;
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        store32(self.db, (self.posted & 0xffff).to_be());
    }
}

/// CREATE_XSRQ of type XRC (`xrcd`, completing to `cq`), `wqes` WQEs.
fn create_xsrq(ctx: &mut Ctx, pd: u32, xrcd: u32, cq: &Cq, wqes: u32) -> Result<Srq, Errno> {
    let buf = Buf::new(wqes as usize * 32);
    let db = ctx.db();
    let uidx = 0x7000 + (db & 0xfff) as u32;
    let c = IbUverbsCreateXsrq {
        user_handle: 9,
        srq_type: 1,
        pd_handle: pd,
        max_wr: wqes - 1,
        max_sge: 1,
        xrcd_handle: xrcd,
        cq_handle: cq.handle,
        ..Default::default()
    };
    let d = Mlx5IbCreateSrq {
        buf_addr: buf.addr(),
        db_addr: db,
        uidx,
        ..Default::default()
    };
    let (o, _) = write_cmd(
        &ctx.dev,
        IB_USER_VERBS_CMD_CREATE_XSRQ,
        c.as_bytes(),
        d.as_bytes(),
        16,
        8,
    )?;
    let r = IbUverbsCreateSrqResp::read_from_bytes(&o).expect("16 bytes");
    Ok(Srq {
        handle: r.srq_handle,
        srqn: r.srqn,
        buf,
        db,
        posted: 0,
        uidx,
    })
}

/// An XRC target QP in domain `xrcd`: (handle, QPN).
fn create_tgt(ctx: &Ctx, xrcd: u32) -> Result<(u32, u32), Errno> {
    let c = IbUverbsCreateQp {
        pd_handle: xrcd,
        qp_type: XRC_TGT,
        ..Default::default()
    };
    let (o, _) = write_cmd(
        &ctx.dev,
        IB_USER_VERBS_CMD_CREATE_QP,
        c.as_bytes(),
        Mlx5IbCreateQp::default().as_bytes(),
        32,
        40,
    )?;
    let r = IbUverbsCreateQpResp::read_from_bytes(&o).expect("32 bytes");
    Ok((r.qp_handle, r.qpn))
}

fn open_qp(ctx: &Ctx, xrcd: u32, qpn: u32) -> Result<u32, Errno> {
    let c = IbUverbsOpenQp {
        pd_handle: xrcd,
        qpn,
        qp_type: XRC_TGT,
        ..Default::default()
    };
    let (o, _) = write_cmd(
        &ctx.dev,
        IB_USER_VERBS_CMD_OPEN_QP,
        c.as_bytes(),
        &[],
        32,
        0,
    )?;
    Ok(u32::from_ne_bytes([o[0], o[1], o[2], o[3]]))
}

fn destroy_qp(ctx: &Ctx, handle: u32) -> Result<(), Errno> {
    let c = IbUverbsDestroyQp {
        qp_handle: handle,
        ..Default::default()
    };
    run_cmd(
        &ctx.dev,
        IB_USER_VERBS_CMD_DESTROY_QP,
        c.as_bytes(),
        &[],
        (4, 0),
    )
}

fn destroy_srq(ctx: &Ctx, handle: u32) -> Result<(), Errno> {
    let c = IbUverbsDestroySrq {
        srq_handle: handle,
        ..Default::default()
    };
    run_cmd(
        &ctx.dev,
        IB_USER_VERBS_CMD_DESTROY_SRQ,
        c.as_bytes(),
        &[],
        (4, 0),
    )
}

/// Modify a QP by handle (legacy MODIFY_QP).
fn modify(ctx: &Ctx, handle: u32, f: impl FnOnce(&mut IbUverbsModifyQp)) -> Result<(), Errno> {
    let mut m = IbUverbsModifyQp {
        qp_handle: handle,
        ..Default::default()
    };
    f(&mut m);
    ctx.modify(&m)
}

/// XRC initiator `h` to RTS towards (`dlid`, `dest`), PSNs 0x100.
fn ini_up(ctx: &Ctx, h: u32, dlid: u16, dest: u32, k: Knobs) {
    modify(ctx, h, |m| {
        m.attr_mask = M_STATE | M_PKEY | M_PORT | M_ACCESS;
        (m.qp_state, m.port_num, m.qp_access_flags) = (1, 1, k.access);
    })
    .expect("INI INIT");
    modify(ctx, h, |m| {
        // RC's full mask, as perftest sends it: the kernel drops what an initiator lacks.
        m.attr_mask = M_STATE | M_AV | M_MTU | M_DEST_QPN | M_RQ_PSN | M_MAX_DEST_RD | M_MIN_RNR;
        (m.qp_state, m.path_mtu, m.dest_qp_num, m.rq_psn) = (2, 3, dest, 0x100);
        (m.dest.dlid, m.dest.port_num) = (dlid, 1);
    })
    .expect("INI RTR");
    modify(ctx, h, |m| {
        m.attr_mask = M_STATE | M_TIMEOUT | M_RETRY | M_RNR_RETRY | M_SQ_PSN | M_MAX_RD;
        (m.qp_state, m.timeout, m.retry_cnt, m.rnr_retry) = (3, k.timeout, k.retry_cnt, 7);
        (m.sq_psn, m.max_rd_atomic) = (0x100, 4);
    })
    .expect("INI RTS");
}

/// XRC target `h` to RTR (and RTS) towards (`dlid`, `dest`).
fn tgt_up(ctx: &Ctx, h: u32, dlid: u16, dest: u32) {
    modify(ctx, h, |m| {
        m.attr_mask = M_STATE | M_PKEY | M_PORT | M_ACCESS;
        (m.qp_state, m.port_num, m.qp_access_flags) = (1, 1, ALL_ACCESS);
    })
    .expect("TGT INIT");
    modify(ctx, h, |m| {
        m.attr_mask = M_STATE | M_AV | M_MTU | M_DEST_QPN | M_RQ_PSN | M_MAX_DEST_RD | M_MIN_RNR;
        (m.qp_state, m.path_mtu, m.dest_qp_num, m.rq_psn) = (2, 3, dest, 0x100);
        (m.dest.dlid, m.dest.port_num) = (dlid, 1);
        (m.max_dest_rd_atomic, m.min_rnr_timer) = (4, 1);
    })
    .expect("TGT RTR");
    modify(ctx, h, |m| {
        // A target needs only TIMEOUT and SQ_PSN (the kernel drops RETRY_CNT).
        m.attr_mask = M_STATE | M_TIMEOUT | M_SQ_PSN | M_RETRY;
        (m.qp_state, m.timeout, m.sq_psn, m.retry_cnt) = (3, 14, 0x100, 7);
    })
    .expect("TGT RTS");
}

/// The XRC segment naming `srqn`.
fn xrc_seg(srqn: u32) -> [u8; 16] {
    let mut s = [0u8; 16];
    s[..4].copy_from_slice(&srqn.to_be_bytes());
    s
}

fn temp_file(tag: &str) -> (std::fs::File, std::path::PathBuf) {
    let p = std::env::temp_dir().join(format!("mlx5-xrcd-{tag}-{}", std::process::id()));
    (std::fs::File::create(&p).expect("temp file"), p)
}

#[test]
fn xrc_domains_are_shared_by_file_and_refuse_what_the_kernel_refuses() {
    use std::os::fd::AsRawFd;
    let emu = stepped(1);
    let mut a = Ctx::open(&emu, 0);
    let b = Ctx::open(&emu, 0);
    let (f, path) = temp_file("share");
    let (g, path2) = temp_file("fresh");
    let fd = f.as_raw_fd();
    assert_eq!(
        open_xrcd(&a, fd, 0),
        Err(EAGAIN),
        "no domain yet, no O_CREAT"
    );
    assert_eq!(open_xrcd(&a, 1 << 20, libc::O_CREAT), Err(EBADF));
    let xa = open_xrcd(&a, fd, libc::O_CREAT).expect("create");
    assert_eq!(
        open_xrcd(&b, fd, libc::O_CREAT | libc::O_EXCL),
        Err(EINVAL),
        "O_EXCL on an existing domain"
    );
    let xb = open_xrcd(&b, fd, 0).expect("the same domain, from another context");
    let xg = open_xrcd(&b, g.as_raw_fd(), libc::O_CREAT).expect("another file's domain");
    let xp = open_xrcd(&b, -1, 0).expect("a private domain");
    // A target QP of A's domain: B opens it through its handle of the same domain only.
    let (ta, tqpn) = create_tgt(&a, xa).expect("target QP");
    let tb = open_qp(&b, xb, tqpn).expect("open through the shared domain");
    assert_eq!(open_qp(&b, xg, tqpn), Err(EINVAL), "another file's domain");
    assert_eq!(open_qp(&b, xp, tqpn), Err(EINVAL), "a private domain");
    assert_eq!(open_qp(&b, 0xdead, tqpn), Err(EINVAL), "no such handle");
    // In use: A's last handle of the domain cannot close while its target QP and XRC SRQ
    // exist; B's opened QP handle closes without destroying the QP.
    let pd = a.alloc_pd();
    let cq = a.create_cq(8, 64, -1);
    let srq = create_xsrq(&mut a, pd, xa, &cq, 8).expect("XRC SRQ");
    // An XRC SRQ serves XRC targets only: an RC QP on it is EINVAL (ib_uverbs' create_qp).
    let buf = Buf::new(64 * 64);
    let c = IbUverbsCreateQp {
        user_handle: 1,
        pd_handle: pd,
        send_cq_handle: cq.handle,
        recv_cq_handle: cq.handle,
        srq_handle: srq.handle,
        max_send_wr: 32,
        max_send_sge: 1,
        qp_type: RC,
        is_srq: 1,
        ..Default::default()
    };
    let d = Mlx5IbCreateQp {
        buf_addr: buf.addr(),
        db_addr: a.db(),
        sq_wqe_count: 64,
        uidx: 0x6100,
        ..Default::default()
    };
    assert_eq!(
        write_cmd(
            &a.dev,
            IB_USER_VERBS_CMD_CREATE_QP,
            c.as_bytes(),
            d.as_bytes(),
            32,
            40
        )
        .map(|_| ()),
        Err(EINVAL),
        "an RC QP on an XRC SRQ"
    );
    assert_eq!(close_xrcd(&a, xa), Err(EBUSY));
    destroy_qp(&b, tb).expect("close B's handle");
    let tb2 = open_qp(&b, xb, tqpn).expect("the QP lives on with its creator");
    // The creator's handle goes; the QP lives on with B, which now holds the domain busy.
    destroy_qp(&a, ta).expect("the creator's handle");
    assert_eq!(close_xrcd(&b, xb), Err(EBUSY), "B's target QP uses it");
    destroy_qp(&b, tb2).expect("the last handle destroys the QP");
    assert_eq!(
        open_qp(&b, xb, tqpn),
        Err(EINVAL),
        "gone with its last handle"
    );
    assert_eq!(close_xrcd(&a, xa), Err(EBUSY), "the SRQ still uses it");
    destroy_srq(&a, srq.handle).expect("destroy SRQ");
    close_xrcd(&a, xa).expect("A closes");
    close_xrcd(&b, xb).expect("B closes; the domain goes with its last open");
    assert_eq!(
        open_xrcd(&a, fd, 0),
        Err(EAGAIN),
        "gone with its last handle"
    );
    // An XRC SRQ needs a domain and a CQ.
    assert_eq!(
        create_xsrq(&mut a, pd, 0xbeef, &cq, 8).map(|_| ()),
        Err(EINVAL)
    );
    drop((f, g));
    let _ = std::fs::remove_file(path);
    let _ = std::fs::remove_file(path2);
}

/// Two HCAs: `n` XRC initiators on HCA 0, as many targets on HCA 1 in one domain, one XRC
/// SRQ of `wqes` WQEs (each a `msg`-byte buffer) behind them.
struct XrcRig {
    emu: Emulator,
    a: Ctx,
    b: Ctx,
    inis: Vec<Qp>,
    tgts: Vec<u32>,
    srq: Srq,
    cqa: Cq,
    cqb: Cq,
    src: (Buf, u32),
    dst: (Buf, u32),
}

fn xrc_rig(emu: Emulator, n: usize, wqes: u32, msg: usize, k: Knobs) -> XrcRig {
    let mut a = Ctx::open(&emu, 0);
    let mut b = Ctx::open(&emu, 1);
    let (lid_a, lid_b) = (emu.hca_info(0).unwrap().lid, emu.hca_info(1).unwrap().lid);
    let pda = a.alloc_pd();
    let pdb = b.alloc_pd();
    let cqa = a.create_cq(1024, 64, -1);
    let cqb = b.create_cq(wqes.max(64), 64, -1);
    let xrcd = open_xrcd(&b, -1, 0).expect("domain");
    let mut srq = create_xsrq(&mut b, pdb, xrcd, &cqb, wqes).expect("XRC SRQ");
    let src = Buf::new(64 * msg);
    let (_, lsrc, _) = a
        .reg_mr(pda, src.addr(), src.len as u64, LOCAL_WRITE)
        .expect("mr");
    let dst = Buf::new(wqes as usize * msg);
    let (_, ldst, _) = b
        .reg_mr(pdb, dst.addr(), dst.len as u64, ALL_ACCESS | LOCAL_WRITE)
        .expect("mr");
    for i in 0..wqes - 1 {
        srq.post(i, dst.addr() + u64::from(i) * msg as u64, msg as u32, ldst);
    }
    let mut inis = Vec::new();
    let mut tgts = Vec::new();
    for _ in 0..n {
        let q = a.create_qp(pda, &cqa, &cqa, XRC_INI, 64, 0, None);
        let (th, tq) = create_tgt(&b, xrcd).expect("target");
        ini_up(&a, q.handle, lid_b, tq, k);
        tgt_up(&b, th, lid_a, q.qpn);
        inis.push(q);
        tgts.push(tq);
    }
    XrcRig {
        emu,
        a,
        b,
        inis,
        tgts,
        srq,
        cqa,
        cqb,
        src: (src, lsrc),
        dst: (dst, ldst),
    }
}

/// The bytes of message `wr`, `len` long; the first 8 name it.
fn message(wr: u64, len: usize) -> Vec<u8> {
    let mut m: Vec<u8> = (0..len)
        .map(|j| (wr.wrapping_mul(0x9E37_79B9) as usize ^ j.wrapping_mul(131)) as u8)
        .collect();
    m[..8].copy_from_slice(&wr.to_le_bytes());
    m
}

#[test]
fn an_xrc_target_receives_through_the_srq_the_packet_names_and_naks_a_bad_one() {
    let mut r = xrc_rig(stepped(2), 1, 16, 256, Knobs::default());
    let (src, lsrc) = (r.src.0.addr(), r.src.1);
    r.src.0.write(0, &message(1, 200));
    let mut segs = xrc_seg(r.srq.srqn).to_vec();
    segs.extend_from_slice(DataSeg::new(200, lsrc, src).as_bytes());
    let q = &mut r.inis[0];
    let i = q.build_send(SendOpcode::SEND, 0, FM_CE_SE_CQ_UPDATE, [0; 4], &segs);
    q.ring(&r.a, i, Ring::Doorbell);
    r.emu.run_until_idle();
    let sent = drain(&mut r.cqa);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].opcode, CQE_REQ, "{sent:?}");
    let got = drain(&mut r.cqb);
    assert_eq!(got.len(), 1, "the SRQ's CQ");
    let c = got[0];
    assert_eq!(c.opcode, CQE_RECV);
    assert_eq!(c.byte_cnt, 200);
    assert_eq!(c.qpn, r.tgts[0], "the target QP received it");
    assert_eq!(c.uidx, r.srq.uidx, "CQE v1: the XRC SRQ's user index");
    assert_eq!(c.wqe_counter, 0);
    assert_eq!(r.dst.0.read(0, 200), message(1, 200));
    // An SRQ number that is no XRC SRQ of the target's domain: NAK invalid request, the
    // initiator's WR fails with a remote invalid-request error; nothing is received.
    let q = &mut r.inis[0];
    let mut bad = xrc_seg(r.srq.srqn ^ 0x55).to_vec();
    bad.extend_from_slice(DataSeg::new(200, lsrc, src).as_bytes());
    let i = q.build_send(SendOpcode::SEND, 0, FM_CE_SE_CQ_UPDATE, [0; 4], &bad);
    q.ring(&r.a, i, Ring::Doorbell);
    r.emu.run_until_idle();
    let sent = drain(&mut r.cqa);
    assert_eq!(sent.len(), 1);
    assert_eq!(
        (sent[0].opcode, sent[0].syndrome),
        (CQE_REQ_ERR, SYND_REM_INV_REQ),
        "{sent:?}"
    );
    assert!(drain(&mut r.cqb).is_empty());
}

#[test]
fn an_xrc_initiator_answers_no_request() {
    // An RC QP on the target's HCA connected to an XRC initiator: its SEND finds no receive
    // side there (no ACK, no NAK) and ends in a transport-retry error.
    let mut r = xrc_rig(stepped(2), 1, 16, 256, Knobs::default());
    let lid_a = r.emu.hca_info(0).unwrap().lid;
    let pd = r.b.alloc_pd();
    let mut cq = r.b.create_cq(16, 64, -1);
    let mut q = r.b.create_qp(pd, &cq, &cq, RC, 16, 4, None);
    bring_up(&r.b, &q, lid_a, r.inis[0].qpn, Knobs::default());
    let i = q.build_send(SendOpcode::SEND, 0, FM_CE_SE_CQ_UPDATE, [0; 4], &[]);
    q.ring(&r.b, i, Ring::Doorbell);
    r.emu.run_until_idle();
    let got = drain(&mut cq);
    assert_eq!(
        got.iter()
            .map(|c| (c.opcode, c.syndrome))
            .collect::<Vec<_>>(),
        [(CQE_REQ_ERR, SYND_RETRY_EXC)]
    );
    assert!(drain(&mut r.cqa).is_empty());
}

#[test]
fn an_xrc_srq_of_another_domain_is_refused() {
    let mut r = xrc_rig(stepped(2), 1, 16, 256, Knobs::default());
    // A second domain with its own XRC SRQ on the target's HCA.
    let other = open_xrcd(&r.b, -1, 0).expect("domain");
    let pd = r.b.alloc_pd();
    let cq = r.b.create_cq(8, 64, -1);
    let foreign = create_xsrq(&mut r.b, pd, other, &cq, 8).expect("SRQ");
    let (src, lsrc) = (r.src.0.addr(), r.src.1);
    let mut segs = xrc_seg(foreign.srqn).to_vec();
    segs.extend_from_slice(DataSeg::new(16, lsrc, src).as_bytes());
    let q = &mut r.inis[0];
    let i = q.build_send(SendOpcode::SEND, 0, FM_CE_SE_CQ_UPDATE, [0; 4], &segs);
    q.ring(&r.a, i, Ring::Doorbell);
    r.emu.run_until_idle();
    let sent = drain(&mut r.cqa);
    assert_eq!(
        sent.iter()
            .map(|c| (c.opcode, c.syndrome))
            .collect::<Vec<_>>(),
        [(CQE_REQ_ERR, SYND_REM_INV_REQ)]
    );
}

fn faulty(seed: u64) -> Emulator {
    Emulator::new(EmuConfig {
        num_hcas: 2,
        mode: RunMode::Stepped,
        fault: FaultConfig {
            seed,
            drop_ppm: 10_000,
            dup_ppm: 10_000,
            reorder_ppm: 10_000,
            delay_ns: 0,
        },
        corrupt_ppm: 10_000,
        ..EmuConfig::default()
    })
}

/// Knobs for the campaigns: a short ACK timeout (virtual time), many retries.
fn campaign_knobs() -> Knobs {
    Knobs {
        timeout: 8,
        retry_cnt: 7,
        ..Knobs::default()
    }
}

#[test]
fn four_xrc_initiators_into_one_srq_under_faults_deliver_every_wr_once_in_order() {
    const WRS: u64 = 10_000;
    const MSG: usize = 512;
    let mut r = xrc_rig(faulty(0x5eed_0022), 4, 16_384, MSG, campaign_knobs());
    let (src, lsrc) = (r.src.0.addr(), r.src.1);
    let srqn = r.srq.srqn;
    let n = r.inis.len();
    let mut next = 0u64;
    let mut in_flight = vec![0usize; n];
    let mut sent_done = 0u64;
    // Received: by target QP, the WR numbers in arrival order.
    let mut by_tgt: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    let mut seen = vec![false; WRS as usize];
    let mut received = 0u64;
    let mut rounds = 0;
    while sent_done < WRS || received < WRS {
        rounds += 1;
        assert!(
            rounds < 200_000,
            "no progress: {sent_done} sent, {received} received"
        );
        while next < WRS {
            let k = (next % n as u64) as usize;
            if in_flight[k] >= 8 {
                break;
            }
            let len = 8 + (next as usize * 37) % (MSG - 8);
            let slot = (next % 64) as usize;
            r.src.0.write(slot * MSG, &message(next, len));
            let mut segs = xrc_seg(srqn).to_vec();
            segs.extend_from_slice(
                DataSeg::new(len as u32, lsrc, src + (slot * MSG) as u64).as_bytes(),
            );
            let q = &mut r.inis[k];
            let i = q.build_send(SendOpcode::SEND, 0, FM_CE_SE_CQ_UPDATE, [0; 4], &segs);
            q.ring(&r.a, i, Ring::Doorbell);
            in_flight[k] += 1;
            next += 1;
        }
        r.emu.run_until_idle();
        for c in drain(&mut r.cqa) {
            assert_eq!(c.opcode, CQE_REQ, "send completion {c:?}");
            let k = r.inis.iter().position(|q| q.qpn == c.qpn).expect("an INI");
            in_flight[k] -= 1;
            sent_done += 1;
        }
        for c in drain(&mut r.cqb) {
            assert_eq!(c.opcode, CQE_RECV, "{c:?}");
            let off = c.wqe_counter as usize * MSG;
            let head = r.dst.0.read(off, 8);
            let wr = u64::from_le_bytes(head.try_into().unwrap());
            assert!(wr < WRS && !seen[wr as usize], "WR {wr} twice or unknown");
            seen[wr as usize] = true;
            let len = 8 + (wr as usize * 37) % (MSG - 8);
            assert_eq!(c.byte_cnt as usize, len, "WR {wr}");
            assert_eq!(r.dst.0.read(off, len), message(wr, len), "bytes of WR {wr}");
            // Initiator k sends WRs k, k+n, ...: its target is tgts[k].
            assert_eq!(c.qpn, r.tgts[(wr % n as u64) as usize], "WR {wr}'s target");
            by_tgt.entry(c.qpn).or_default().push(wr);
            received += 1;
        }
    }
    for (t, wrs) in &by_tgt {
        assert!(
            wrs.windows(2).all(|p| p[0] < p[1]),
            "target {t:#x}: out of order"
        );
        assert_eq!(wrs.len(), WRS as usize / n, "target {t:#x}");
    }
    assert!(seen.iter().all(|&s| s));
    // The faults happened (and were recovered from): the fabric lost and doubled packets.
    let dropped = r.emu.counters(0).packets_dropped + r.emu.counters(1).packets_dropped;
    assert!(dropped > 0, "the campaign dropped nothing");
}

// ----------------------------------------------------------------------------------------
// DC

/// A DCI (driver QP with `MLX5_QP_FLAG_TYPE_DCI`) brought to RTS.
fn create_dci(ctx: &mut Ctx, pd: u32, cq: &Cq, k: Knobs) -> Qp {
    let q = ctx.create_qp_spec(
        pd,
        cq,
        cq,
        QpSpec {
            qp_type: IBV_QPT_DRIVER,
            sq_cnt: 64,
            rq_cnt: 0,
            srq: None,
            flags: MLX5_QP_FLAG_TYPE_DCI,
            sig_all: false,
        },
    );
    // perftest's masks: no access flags at INIT, no destination at RTR.
    modify(ctx, q.handle, |m| {
        m.attr_mask = M_STATE | M_PKEY | M_PORT;
        (m.qp_state, m.port_num) = (1, 1);
    })
    .expect("DCI INIT");
    modify(ctx, q.handle, |m| {
        m.attr_mask = M_STATE | M_AV | M_MTU;
        (m.qp_state, m.path_mtu, m.dest.port_num) = (2, 3, 1);
    })
    .expect("DCI RTR");
    modify(ctx, q.handle, |m| {
        m.attr_mask = M_STATE | M_TIMEOUT | M_RETRY | M_RNR_RETRY | M_SQ_PSN | M_MAX_RD;
        (m.qp_state, m.timeout, m.retry_cnt, m.rnr_retry) = (3, k.timeout, k.retry_cnt, 7);
        (m.sq_psn, m.max_rd_atomic) = (0x100, 4);
    })
    .expect("DCI RTS");
    q
}

/// Extended MODIFY_QP with a driver response: (result, the response's DCT number).
fn modify_ex(ctx: &Ctx, m: &IbUverbsModifyQp) -> Result<u32, Errno> {
    let ex = IbUverbsExModifyQp {
        base: *m,
        ..Default::default()
    };
    let mut out = [0u8; 8 + 16];
    let buf = mlx5_ffi::cmd::build_write_ex(
        IB_USER_VERBS_EX_CMD_MODIFY_QP,
        out.as_mut_ptr() as u64,
        ex.as_bytes(),
        8,
        &[0u8; 16],
        16,
    )?;
    ctx.dev.cmd_write(&buf)?;
    let r = Mlx5IbModifyQpResp::read_from_bytes(&out[8..]).expect("16 bytes");
    Ok(r.dctn)
}

/// A DCT on `srq` with access `key`, brought to RTR: its number (from the RTR answer).
fn create_dct(ctx: &mut Ctx, pd: u32, cq: &Cq, srq: u32, key: u64) -> u32 {
    let c = IbUverbsCreateQp {
        pd_handle: pd,
        send_cq_handle: cq.handle,
        recv_cq_handle: cq.handle,
        srq_handle: srq,
        is_srq: 1,
        qp_type: IBV_QPT_DRIVER,
        ..Default::default()
    };
    let d = Mlx5IbCreateQp {
        flags: MLX5_QP_FLAG_TYPE_DCT,
        sq_buf_addr: key,
        uidx: 0x300 + (ctx.db() & 0xfff) as u32 / 64,
        ..Default::default()
    };
    let (o, _) = write_cmd(
        &ctx.dev,
        IB_USER_VERBS_CMD_CREATE_QP,
        c.as_bytes(),
        d.as_bytes(),
        32,
        40,
    )
    .expect("DCT");
    let r = IbUverbsCreateQpResp::read_from_bytes(&o).expect("32 bytes");
    assert_eq!(r.qpn, 0, "a DCT has no number before RTR");
    let mut m = IbUverbsModifyQp {
        qp_handle: r.qp_handle,
        ..Default::default()
    };
    m.attr_mask = M_STATE | M_PKEY | M_PORT | M_ACCESS;
    (m.qp_state, m.port_num, m.qp_access_flags) = (1, 1, ALL_ACCESS);
    modify_ex(ctx, &m).expect("DCT INIT");
    // RTR without MIN_RNR_TIMER: EINVAL (mlx5_ib_modify_dct).
    m.attr_mask = M_STATE | M_AV | M_MTU;
    (m.qp_state, m.path_mtu, m.dest.port_num, m.min_rnr_timer) = (2, 3, 1, 1);
    assert_eq!(modify_ex(ctx, &m), Err(EINVAL));
    m.attr_mask |= M_MIN_RNR;
    let dctn = modify_ex(ctx, &m).expect("DCT RTR");
    assert_ne!(dctn, 0);
    // A DCT goes no further than RTR.
    m.attr_mask = M_STATE | M_SQ_PSN;
    m.qp_state = 3;
    assert_eq!(modify_ex(ctx, &m), Err(EINVAL));
    dctn
}

/// A basic SRQ of `wqes` WQEs, every one posted, `msg` bytes each, into `dst`.
fn basic_srq(ctx: &mut Ctx, pd: u32, wqes: u32, msg: usize, dst: &(Buf, u32)) -> Srq {
    let buf = Buf::new(wqes as usize * 32);
    let db = ctx.db();
    let c = IbUverbsCreateSrq {
        pd_handle: pd,
        max_wr: wqes - 1,
        max_sge: 1,
        ..Default::default()
    };
    let d = Mlx5IbCreateSrq {
        buf_addr: buf.addr(),
        db_addr: db,
        ..Default::default()
    };
    let (o, _) = write_cmd(
        &ctx.dev,
        IB_USER_VERBS_CMD_CREATE_SRQ,
        c.as_bytes(),
        d.as_bytes(),
        16,
        8,
    )
    .expect("SRQ");
    let r = IbUverbsCreateSrqResp::read_from_bytes(&o).expect("16 bytes");
    let mut s = Srq {
        handle: r.srq_handle,
        srqn: r.srqn,
        buf,
        db,
        posted: 0,
        uidx: 0,
    };
    for i in 0..wqes - 1 {
        s.post(
            i,
            dst.0.addr() + u64::from(i) * msg as u64,
            msg as u32,
            dst.1,
        );
    }
    s
}

/// The address vector of a DC WQE: DCT `dctn` at `lid`, access `key`.
fn dc_av(dctn: u32, lid: u16, key: u64) -> Vec<u8> {
    let mut av = DatagramSeg::zeroed();
    av.set_dqpn(dctn);
    av.rlid = mlx5_hw::types::Be16::new(lid);
    let mut b = av.as_bytes().to_vec();
    b[..8].copy_from_slice(&key.to_be_bytes());
    b
}

struct DcRig {
    emu: Emulator,
    a: Ctx,
    /// The targets' context and SRQ (kept: dropping them would destroy the targets and
    /// unmap the ring).
    _b: (Ctx, Srq),
    dci: Qp,
    cqa: Cq,
    cqb: Cq,
    dcts: Vec<u32>,
    lid_b: u16,
    src: (Buf, u32),
    dst: (Buf, u32),
    msg: usize,
}

const KEY: u64 = 0x0123_4567_89ab_cdef;

fn dc_rig(emu: Emulator, n: usize, wqes: u32, msg: usize, k: Knobs) -> DcRig {
    let mut a = Ctx::open(&emu, 0);
    let mut b = Ctx::open(&emu, 1);
    let lid_b = emu.hca_info(1).unwrap().lid;
    let pda = a.alloc_pd();
    let pdb = b.alloc_pd();
    let cqa = a.create_cq(1024, 64, -1);
    let cqb = b.create_cq(wqes.max(64), 64, -1);
    let src = Buf::new(64 * msg);
    let (_, lsrc, _) = a
        .reg_mr(pda, src.addr(), src.len as u64, LOCAL_WRITE)
        .expect("mr");
    let dst = Buf::new(wqes as usize * msg);
    let (_, ldst, _) = b
        .reg_mr(pdb, dst.addr(), dst.len as u64, ALL_ACCESS | LOCAL_WRITE)
        .expect("mr");
    let dst = (dst, ldst);
    let srq = basic_srq(&mut b, pdb, wqes, msg, &dst);
    let dcts = (0..n)
        .map(|_| create_dct(&mut b, pdb, &cqb, srq.handle, KEY))
        .collect();
    let dci = create_dci(&mut a, pda, &cqa, k);
    DcRig {
        emu,
        a,
        _b: (b, srq),
        dci,
        cqa,
        cqb,
        dcts,
        lid_b,
        src: (src, lsrc),
        dst,
        msg,
    }
}

impl DcRig {
    /// Post SEND `wr` (`len` bytes from source slot `wr % 64`) to DCT `dctn` with `key`.
    fn post(&mut self, wr: u64, len: usize, dctn: u32, key: u64) {
        let slot = (wr % 64) as usize;
        self.src.0.write(slot * self.msg, &message(wr, len));
        let mut segs = dc_av(dctn, self.lid_b, key);
        segs.extend_from_slice(
            DataSeg::new(
                len as u32,
                self.src.1,
                self.src.0.addr() + (slot * self.msg) as u64,
            )
            .as_bytes(),
        );
        let i = self
            .dci
            .build_send(SendOpcode::SEND, 0, FM_CE_SE_CQ_UPDATE, [0; 4], &segs);
        self.dci.ring(&self.a, i, Ring::Doorbell);
    }
}

#[test]
fn a_dci_reaches_each_dct_its_wqe_names_and_a_wrong_key_or_absent_dct_is_a_retry_error() {
    let mut r = dc_rig(stepped(2), 3, 64, 256, Knobs::default());
    // One WR to each DCT, posted together: the DCI reconnects between them.
    for (wr, &d) in r.dcts.clone().iter().enumerate() {
        r.post(wr as u64, 100 + wr, d, KEY);
    }
    r.emu.run_until_idle();
    let sent = drain(&mut r.cqa);
    assert_eq!(
        sent.iter().map(|c| c.opcode).collect::<Vec<_>>(),
        [CQE_REQ; 3],
        "{sent:?}"
    );
    let got = drain(&mut r.cqb);
    assert_eq!(got.len(), 3);
    for (wr, c) in got.iter().enumerate() {
        assert_eq!(c.opcode, CQE_RECV);
        assert_eq!(c.qpn, r.dcts[wr], "received by the DCT the WQE named");
        assert_eq!(c.src_qp, r.dci.qpn, "from the DCI");
        assert_eq!(c.byte_cnt as usize, 100 + wr);
        let off = c.wqe_counter as usize * r.msg;
        assert_eq!(r.dst.0.read(off, 100 + wr), message(wr as u64, 100 + wr));
    }
    // A wrong key: the DCT drops the requests; the DCI retries and fails with a transport
    // retry error; nothing is received.
    let d0 = r.dcts[0];
    r.post(10, 64, d0, KEY ^ 1);
    r.emu.run_until_idle();
    let sent = drain(&mut r.cqa);
    assert_eq!(
        sent.iter()
            .map(|c| (c.opcode, c.syndrome))
            .collect::<Vec<_>>(),
        [(CQE_REQ_ERR, SYND_RETRY_EXC)]
    );
    assert!(drain(&mut r.cqb).is_empty());
}

#[test]
fn a_dci_sending_to_a_dct_that_does_not_exist_fails_with_a_retry_error() {
    let mut r = dc_rig(stepped(2), 1, 16, 256, Knobs::default());
    r.post(0, 64, 0x00ab_cdef, KEY);
    r.emu.run_until_idle();
    let sent = drain(&mut r.cqa);
    assert_eq!(
        sent.iter()
            .map(|c| (c.opcode, c.syndrome))
            .collect::<Vec<_>>(),
        [(CQE_REQ_ERR, SYND_RETRY_EXC)]
    );
}

#[test]
fn one_dci_round_robin_over_8_dcts_under_faults_delivers_every_wr_once_in_order() {
    const WRS: u64 = 10_000;
    const MSG: usize = 256;
    let mut r = dc_rig(faulty(0xdc_0022), 8, 16_384, MSG, campaign_knobs());
    let n = r.dcts.len() as u64;
    let mut next = 0u64;
    let mut in_flight = 0;
    let mut done = 0u64;
    let mut received = 0u64;
    let mut by_dct: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    let mut seen = vec![false; WRS as usize];
    let mut rounds = 0;
    while done < WRS || received < WRS {
        rounds += 1;
        assert!(
            rounds < 400_000,
            "no progress: {done} done, {received} received"
        );
        while next < WRS && in_flight < 16 {
            let len = 8 + (next as usize * 29) % (MSG - 8);
            let d = r.dcts[(next % n) as usize];
            r.post(next, len, d, KEY);
            next += 1;
            in_flight += 1;
        }
        r.emu.run_until_idle();
        for c in drain(&mut r.cqa) {
            assert_eq!(c.opcode, CQE_REQ, "{c:?}");
            in_flight -= 1;
            done += 1;
        }
        for c in drain(&mut r.cqb) {
            assert_eq!(c.opcode, CQE_RECV, "{c:?}");
            let off = c.wqe_counter as usize * MSG;
            let wr = u64::from_le_bytes(r.dst.0.read(off, 8).try_into().unwrap());
            assert!(wr < WRS && !seen[wr as usize], "WR {wr} twice or unknown");
            seen[wr as usize] = true;
            let len = 8 + (wr as usize * 29) % (MSG - 8);
            assert_eq!(c.byte_cnt as usize, len);
            assert_eq!(r.dst.0.read(off, len), message(wr, len), "bytes of WR {wr}");
            assert_eq!(c.qpn, r.dcts[(wr % n) as usize], "WR {wr}'s DCT");
            assert_eq!(c.src_qp, r.dci.qpn);
            by_dct.entry(c.qpn).or_default().push(wr);
            received += 1;
        }
    }
    assert!(seen.iter().all(|&s| s));
    let (ca, cb) = (r.emu.counters(0), r.emu.counters(1));
    assert!(
        ca.packets_dropped + cb.packets_dropped > 0 && cb.duplicate_request > 0,
        "the campaign lost and doubled packets: {ca:?} {cb:?}"
    );
    for (d, wrs) in &by_dct {
        assert!(
            wrs.windows(2).all(|p| p[0] < p[1]),
            "DCT {d:#x}: out of order"
        );
        assert_eq!(wrs.len() as u64, WRS / n);
    }
}
