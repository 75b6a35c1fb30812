//! The corpus posted through the `mlx5` crate on an in-process (stepped) emulator with WQE
//! recording on: "our" side of the comparison.

use std::sync::Mutex;

use mlx5::{
    Access, Ah, AhAttr, BfPolicy, Context, ContextConfig, Cq, CqInit, GlobalRoute, Mr, Pd, Qp,
    QpCap, QpInitAttr, QpType, RecvWr, RemoteQp, SendFlags, SendWr, Sge, UdDest, UserMemory,
    WorkCompletion, WrOp,
};
use mlx5_emu::{EmuConfig, Emulator, Fabric, LinkLayer, RunMode, WqeRecord};

use crate::corpus::{
    BUF_LEN, BUF_VA, Caps, Corpus, QKEY, QpSel, RECV_LEN, SRC_OFF, Wr, flag, op, src_byte,
};
use crate::{FixedBuf, Knobs, QpInfo, SideInfo};

/// The buffer lives at one fixed address: one run at a time per process.
static FIXED_VA: Mutex<()> = Mutex::new(());

/// Node (LID) of the emulated HCA on both sides: same LID, GUID and first object numbers.
pub const NODE: u16 = 9;

/// Path MTU for the RC pair (`IBV_MTU_1024`).
pub const PATH_MTU: u8 = 3;

/// Everything one side produced.
#[derive(Debug)]
pub struct SideRun {
    /// Object numbers, keys and reported caps.
    pub info: SideInfo,
    /// The WQEs the device fetched, in fetch order.
    pub records: Vec<WqeRecord>,
}

fn err(what: &str, e: impl std::fmt::Display) -> String {
    format!("driver side: {what}: {e}")
}

fn qp_type(sel: QpSel) -> QpType {
    match sel {
        QpSel::Rc => QpType::Rc,
        QpSel::Ud => QpType::Ud,
        QpSel::Uc => QpType::Uc,
    }
}

fn qp_cap(c: Caps) -> QpCap {
    QpCap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: 1,
        max_inline_data: c.max_inline_data,
    }
}

/// Run `corpus` through the `mlx5` crate with `knobs`. Objects are created in the same order
/// as the C harness creates them (PD, MR, send CQ, receive CQ, RC requester, RC responder,
/// UD requester, UD responder, UC requester, UC responder, AH), so the emulator hands out
/// the same numbers.
///
/// # Errors
/// A description of the first failure (object creation, post, error completion).
pub fn run(corpus: &Corpus, knobs: &Knobs) -> Result<SideRun, String> {
    let _one_at_a_time = FIXED_VA
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let emu = Emulator::new(EmuConfig {
        num_hcas: 1,
        mode: RunMode::Stepped,
        fabric: Fabric::InProcess,
        node: Some(NODE),
        bf_reg_size: knobs.bf_reg_size,
        dyn_uar: knobs.dyn_uar,
        link_layer: if knobs.roce {
            LinkLayer::Ethernet
        } else {
            LinkLayer::InfiniBand
        },
        ..EmuConfig::default()
    });
    emu.record_wqes(true);
    let buf = FixedBuf::map(BUF_VA, BUF_LEN as usize).map_err(|e| err("fixed mapping", e))?;
    let src: Vec<u8> = (0..crate::corpus::REMOTE_OFF).map(src_byte).collect();
    buf.write(SRC_OFF as usize, &src);

    let surface = emu.open(0).map_err(|e| err("open", e))?;
    // libmlx5's defaults (16 static bfregs, 4 low-latency, ask for dynamic UARs, CQE v1),
    // and MLX5_SHUT_UP_BF's counterpart; explicit, so our own environment cannot change it.
    let config = ContextConfig {
        no_bf: knobs.shut_up_bf,
        low_latency_bfregs: knobs.low_latency_bfregs,
        ..ContextConfig::default()
    };
    let ctx = Context::open_with(surface, config).map_err(|e| err("Context::open", e))?;
    let lid = ctx.query_port(1).map_err(|e| err("query_port", e))?.lid;
    // RoCE: everything addressed to the port's own GID at the route's index, with its GRH.
    let grh = match corpus.roce {
        Some(r) => Some(GlobalRoute {
            dgid: ctx
                .query_gid(1, u32::from(r.sgid_index))
                .map_err(|e| err("query_gid", e))?,
            flow_label: r.flow_label,
            sgid_index: r.sgid_index,
            hop_limit: r.hop_limit,
            traffic_class: r.traffic_class,
        }),
        None => None,
    };
    let pd = Pd::new(&ctx).map_err(|e| err("Pd::new", e))?;
    // SAFETY: `buf` is a private anonymous mapping owned by this function; it stays mapped
    // until `buf` drops, after every object registered over it (declared later, dropped
    // earlier).
    let mem = unsafe { UserMemory::from_raw_parts(buf.ptr(), buf.len()) };
    let mr = pd
        .reg_user_mr(mem, Access::ALL)
        .map_err(|e| err("reg_user_mr", e))?;
    let cq_init = |cqe| CqInit {
        cqe,
        ..CqInit::default()
    };
    let mut scq = Cq::new(&ctx, cq_init(256), None).map_err(|e| err("send CQ", e))?;
    let mut rcq = Cq::new(&ctx, cq_init(1024), None).map_err(|e| err("recv CQ", e))?;
    let new_qp = |t: QpType, caps: Caps, sig_all: bool| {
        let mut a = QpInitAttr::new(t, &scq, &rcq);
        a.cap = qp_cap(caps);
        a.bf_policy = if knobs.prefer_bf {
            BfPolicy::PreferBf
        } else {
            BfPolicy::InlineOnly
        };
        a.sq_sig_all = sig_all;
        // As libmlx5 under MLX5_SCATTER_TO_CQE=0 (see `harness::run`).
        a.scatter_to_cqe = false;
        Qp::new(&pd, &a).map_err(|e| err("Qp::new", e))
    };
    // Requester and responder of each QpSel, in the order the harness creates them.
    let mut req: Vec<Qp> = Vec::new();
    let mut peer: Vec<Qp> = Vec::new();
    for sel in QpSel::ALL {
        let t = qp_type(sel);
        req.push(new_qp(t, sel.caps(), corpus.sq_sig_all)?);
        peer.push(new_qp(t, sel.caps(), false)?);
    }
    let ah = Ah::new(
        &pd,
        AhAttr {
            dlid: lid,
            port_num: 1,
            sl: corpus.roce.map_or(0, |r| r.sl),
            grh,
            ..AhAttr::default()
        },
    )
    .map_err(|e| err("Ah::new", e))?;

    // Connect: RC and UC in loopback (same attributes as the harness), UD to RTS.
    for sel in QpSel::ALL {
        let i = sel as usize;
        let (a, b) = (req[i].qpn(), peer[i].qpn());
        for (qp, remote) in [(&mut req[i], b), (&mut peer[i], a)] {
            let (access, qkey) = match sel {
                QpSel::Rc => (Access::ALL, 0),
                QpSel::Uc => (Access::LOCAL_WRITE | Access::REMOTE_WRITE, 0),
                QpSel::Ud => (Access::LOCAL_WRITE, QKEY),
            };
            qp.to_init_with(1, access, qkey, &Default::default())
                .map_err(|e| err(&format!("{} INIT", sel.name()), e))?;
            let r = RemoteQp {
                qpn: remote,
                psn: 0,
                lid,
                gid: grh.map(|g| g.dgid),
            };
            qp.to_rtr(&r, PATH_MTU, grh.map_or(0, |g| g.sgid_index))
                .map_err(|e| err(&format!("{} RTR", sel.name()), e))?;
            qp.to_rts(0, 7)
                .map_err(|e| err(&format!("{} RTS", sel.name()), e))?;
        }
        // Receives for every WR that consumes one.
        let sge = [mr.sge(sel.recv_off(), RECV_LEN)];
        for n in 0..corpus.recvs_needed(sel) {
            let wr = RecvWr {
                wr_id: u64::from(n),
                sg_list: &sge,
            };
            peer[i]
                .post_recv(&[wr])
                .map_err(|(_, e)| err("post_recv", e))?;
        }
    }

    let mut posted = [0u64; 3];
    let mut wcs = [WorkCompletion::default(); 32];
    let ud_dest = UdDest {
        ah: &ah,
        remote_qpn: peer[QpSel::Ud as usize].qpn(),
        remote_qkey: QKEY,
    };
    for (n, post) in corpus.posts.iter().enumerate() {
        let sel = post[0].qp;
        let qp = &mut req[sel as usize];
        let sges: Vec<Vec<Sge>> = post.iter().map(|w| gather(w, &mr)).collect();
        let inl: Vec<Vec<&[u8]>> = post.iter().map(|w| inline(w, &src)).collect();
        let wrs: Vec<SendWr<'_>> = post
            .iter()
            .zip(&sges)
            .zip(&inl)
            .enumerate()
            .map(|(i, ((w, s), d))| {
                let mut wr = SendWr::new(
                    n as u64 * 8 + i as u64,
                    wr_op(w, &mr),
                    s,
                    SendFlags(w.flags),
                );
                if w.has(flag::INLINE) {
                    wr = wr.with_inline(d);
                }
                if sel == QpSel::Ud {
                    wr = wr.to(ud_dest);
                }
                wr
            })
            .collect();
        qp.post_send(&wrs)
            .map_err(|(i, e)| err(&format!("post {n} WR {i} ({})", post[i].describe()), e))?;
        posted[sel as usize] += post.len() as u64;
        emu.run_until_idle();
        // Wait for this post's signaled WRs (all earlier ones are then retired too).
        let mut want = corpus.completions(post);
        let mut spins = 0;
        while want > 0 {
            let got = scq.poll(&mut wcs);
            for wc in &wcs[..got] {
                if !wc.is_ok() {
                    return Err(err(
                        &format!("post {n}: send completion"),
                        format!("{wc:?}"),
                    ));
                }
            }
            want = want.saturating_sub(got);
            drain(&mut rcq, &mut wcs)?;
            if got == 0 {
                spins += 1;
                if spins > 10_000 {
                    return Err(err(&format!("post {n}"), "no send completion"));
                }
                emu.run_until_idle();
            }
        }
        drain(&mut rcq, &mut wcs)?;
    }
    let mut info = SideInfo {
        lkey: mr.lkey(),
        rkey: mr.rkey(),
        ..SideInfo::default()
    };
    for sel in QpSel::ALL {
        let (q, p) = (&req[sel as usize], &peer[sel as usize]);
        info.qps[sel as usize] = QpInfo {
            qpn: q.qpn(),
            peer_qpn: p.qpn(),
            max_send_wr: q.cap().max_send_wr,
            max_inline: q.cap().max_inline_data,
            sq_wqe_cnt: q.sq_ref().geometry().wqe_cnt,
            posted: posted[sel as usize],
            bfreg_shared: !q.sq_ref().bfreg().dedicated,
        };
    }
    let records = emu.wqe_log(0);
    drop((ah, req, peer, scq, rcq, mr, pd, ctx));
    drop(buf);
    Ok(SideRun { info, records })
}

fn drain(cq: &mut Cq, wcs: &mut [WorkCompletion]) -> Result<(), String> {
    loop {
        let n = cq.poll(wcs);
        if let Some(bad) = wcs[..n].iter().find(|wc| !wc.is_ok()) {
            return Err(err("receive completion", format!("{bad:?}")));
        }
        if n < wcs.len() {
            return Ok(());
        }
    }
}

fn gather(w: &Wr, mr: &Mr) -> Vec<Sge> {
    w.sges
        .iter()
        .map(|&(off, len)| Sge {
            addr: BUF_VA + off,
            length: len,
            lkey: mr.lkey(),
        })
        .collect()
}

/// The inline pieces: the same bytes the C harness's SGEs point at.
fn inline<'s>(w: &Wr, src: &'s [u8]) -> Vec<&'s [u8]> {
    if !w.has(flag::INLINE) {
        return Vec::new();
    }
    w.sges
        .iter()
        .map(|&(off, len)| &src[off as usize..off as usize + len as usize])
        .collect()
}

fn wr_op(w: &Wr, mr: &Mr) -> WrOp {
    let raddr = BUF_VA + w.remote_off;
    let rkey = mr.rkey();
    match w.opcode {
        op::SEND_WITH_IMM => WrOp::SendImm {
            imm: w.imm.to_be_bytes(),
        },
        op::SEND_WITH_INV => WrOp::SendInv { rkey: w.imm },
        op::RDMA_WRITE => WrOp::Write { raddr, rkey },
        op::RDMA_WRITE_WITH_IMM => WrOp::WriteImm {
            raddr,
            rkey,
            imm: w.imm.to_be_bytes(),
        },
        op::RDMA_READ => WrOp::Read { raddr, rkey },
        op::ATOMIC_CMP_AND_SWP => WrOp::CompareSwap {
            raddr,
            rkey,
            compare: w.compare,
            swap: w.swap_add,
        },
        op::ATOMIC_FETCH_AND_ADD => WrOp::FetchAdd {
            raddr,
            rkey,
            add: w.swap_add,
        },
        _ => WrOp::Send,
    }
}
