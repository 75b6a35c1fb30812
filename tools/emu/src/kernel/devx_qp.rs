//! DEVX QP and DCT objects: the PRM `CREATE_QP` (RC, DC initiator) and `CREATE_DCT`
//! commands decoded into the emulator's QP model (`state::Qp`, run by the same device code
//! as a verbs QP), their transitions (`RST2INIT_QP` ... `2RST_QP`), `QUERY_QP` and destroy.
//! The work queue and the doorbell record live in DEVX umems (`kernel/devx.rs`).
//!
//! The firmware's checks answer with a failed status (EREMOTEIO, `kernel/devx.rs`): an
//! unknown PD, CQ, SRQ or UAR page, a umem too small for the queue, a transition from the
//! wrong state, a port other than 1.

use mlx5_ffi::prm::{self, Field, ads, dct, hdr, op, qp, qpc, rmp, status};

use super::devx::{DEVX_DC, FwResult, Object, fw_error, umem_range, umem_use};
use super::{EINVAL, caps, hca_of, next_id};
use crate::abi::Errno;
use crate::state::{Path, Qp, Srq, World, access, qps, qpt};
use crate::xrc_dc::{QpExt, QpKind};

use crate::uar::DEVX_UAR_BFREG;

/// A QPC field of a command whose QPC starts at `qp::QPC`.
fn q(f: Field) -> Field {
    f.at(qp::QPC)
}

/// A primary-path field of such a command.
fn p(f: Field) -> Field {
    f.at(qp::QPC + qpc::PRIMARY_PATH)
}

fn bad(st: u8) -> Vec<u8> {
    fw_error(st, 0)
}

/// CREATE_QP: Ok((output, object)) or the firmware's failure.
pub(super) fn create_qp(w: &mut World, ctx: u64, cmd: &[u8]) -> Result<(Vec<u8>, Object), Vec<u8>> {
    if cmd.len() < qp::IN_BYTES {
        return Err(bad(status::BAD_INP_LEN));
    }
    let g = |f: Field| prm::get(cmd, f);
    let st = g(q(qpc::ST));
    let dci = match st {
        qpc::ST_RC => false,
        qpc::ST_DCI if caps::FEATURES.dc && DEVX_DC => true,
        _ => return Err(bad(status::BAD_PARAM)),
    };
    let hca = hca_of(w, ctx);
    let h = &w.hcas[hca];
    let pdn = g(q(qpc::PD)) as u32;
    let scq = g(q(qpc::CQN_SND)) as u32;
    let rcq = g(q(qpc::CQN_RCV)) as u32;
    if h.pds.get(&pdn).is_none_or(|x| x.ctx != ctx) {
        return Err(bad(status::BAD_RES));
    }
    if ![scq, rcq]
        .iter()
        .all(|c| h.cqs.get(c).is_some_and(|x| x.ctx == ctx))
    {
        return Err(bad(status::BAD_RES));
    }
    let rq_type = g(q(qpc::RQ_TYPE));
    let srq = match rq_type {
        _ if dci => None,
        qpc::RQ_SRQ => {
            let n = g(q(qpc::SRQN_RMPN_XRQN)) as u32;
            if h.srqs.get(&n).is_none_or(|x| x.ctx != ctx) {
                return Err(bad(status::BAD_RES));
            }
            Some(n)
        }
        qpc::RQ_REGULAR | qpc::RQ_ZERO => None,
        _ => return Err(bad(status::BAD_PARAM)),
    };
    // Queue sizes: a DCI has no receive queue; an RQ of type "regular" has
    // 2^log_rq_size WQEs of 16 << log_rq_stride bytes ahead of the SQ in the WQ buffer.
    let (rq_cnt, rq_shift) = if dci || rq_type != qpc::RQ_REGULAR {
        (0, 0)
    } else {
        (
            1u32 << g(q(qpc::LOG_RQ_SIZE)),
            4 + g(q(qpc::LOG_RQ_STRIDE)) as u32,
        )
    };
    let no_sq = g(q(qpc::NO_SQ)) != 0;
    let sq_cnt = if no_sq {
        0
    } else {
        1u32 << g(q(qpc::LOG_SQ_SIZE))
    };
    if sq_cnt > caps::MAX_QP_WR || rq_cnt > caps::MAX_QP_WR || rq_shift > 11 {
        return Err(bad(status::BAD_PARAM));
    }
    let rq_bytes = u64::from(rq_cnt) << rq_shift;
    let sq_bytes = u64::from(sq_cnt) * 64;
    let wq_id = g(qp::WQ_UMEM_ID) as u32;
    let wq_off = g(qp::WQ_UMEM_OFFSET);
    let dbr_id = g(q(qpc::DBR_UMEM_ID)) as u32;
    let dbr_off = g(q(qpc::DBR_ADDR));
    let buf = umem_range(w, ctx, wq_id, wq_off, rq_bytes + sq_bytes.max(1))
        .ok_or_else(|| bad(status::BAD_PARAM))?;
    let db = umem_range(w, ctx, dbr_id, dbr_off, 8).ok_or_else(|| bad(status::BAD_PARAM))?;
    if db % 4 != 0 {
        return Err(bad(status::BAD_PARAM));
    }
    let uar_page = g(q(qpc::UAR_PAGE)) as u32;
    if !w.contexts[&ctx].dyn_pages.contains_key(&uar_page) {
        return Err(bad(status::BAD_PARAM));
    }
    let qpn = next_id(w, hca);
    super::qp::qp_refs(w, hca, (pdn, scq, rcq, srq), 1);
    umem_use(w, ctx, wq_id, 1);
    umem_use(w, ctx, dbr_id, 1);
    w.hcas[hca].qps.insert(
        qpn,
        Qp {
            ctx,
            qpn,
            qp_type: qpt::RC,
            state: qps::RESET,
            pdn,
            send_cq: scq,
            recv_cq: rcq,
            srq,
            buf,
            db,
            sq_base: buf + rq_bytes,
            sq_wqe_cnt: sq_cnt,
            rq_wqe_cnt: rq_cnt,
            rq_wqe_shift: rq_shift,
            rq_max_gs: if rq_cnt == 0 {
                0
            } else {
                (1u32 << rq_shift) / 16 - u32::from(g(q(qpc::WQ_SIGNATURE)) != 0)
            },
            uidx: g(q(qpc::USER_INDEX)) as u32,
            bfreg: DEVX_UAR_BFREG | uar_page,
            cap: [sq_cnt, rq_cnt, 0, 0, 0],
            port: 1,
            path_mtu: mlx5_ffi::uverbs::mtu::MTU_4096,
            hpc: QpExt {
                kind: if dci { QpKind::Dci } else { QpKind::Plain },
                ..Default::default()
            },
            ..Default::default()
        },
    );
    let mut out = vec![0u8; qp::OUT_BYTES];
    prm::set(&mut out, qp::OUT_QPN, u64::from(qpn));
    Ok((
        out,
        Object::Qp {
            qpn,
            wq: wq_id,
            dbr: dbr_id,
        },
    ))
}

/// CREATE_DCT: a DC target, active at once (the firmware arms it on creation).
pub(super) fn create_dct(
    w: &mut World,
    ctx: u64,
    cmd: &[u8],
) -> Result<(Vec<u8>, Object), Vec<u8>> {
    if !(caps::FEATURES.dc && DEVX_DC) {
        return Err(bad(status::BAD_OP));
    }
    if cmd.len() < dct::IN_BYTES {
        return Err(bad(status::BAD_INP_LEN));
    }
    let g = |f: Field| prm::get(cmd, f.at(dct::DCTC));
    let hca = hca_of(w, ctx);
    let h = &w.hcas[hca];
    let pdn = g(dct::PD) as u32;
    let cqn = g(dct::CQN) as u32;
    let srqn = g(dct::SRQN_XRQN) as u32;
    if h.pds.get(&pdn).is_none_or(|x| x.ctx != ctx)
        || h.cqs.get(&cqn).is_none_or(|x| x.ctx != ctx)
        || h.srqs.get(&srqn).is_none_or(|x| x.ctx != ctx)
    {
        return Err(bad(status::BAD_RES));
    }
    if g(dct::PORT) > 1 {
        return Err(bad(status::BAD_PARAM));
    }
    let mtu = g(dct::MTU) as u8;
    let mtu = if (1..=5).contains(&mtu) { mtu } else { 5 };
    let mut acc = access::LOCAL_WRITE;
    for (f, a) in [
        (dct::RRE, access::REMOTE_READ),
        (dct::RWE, access::REMOTE_WRITE),
        (dct::RAE, access::REMOTE_ATOMIC),
    ] {
        if g(f) != 0 {
            acc |= a;
        }
    }
    let dctn = next_id(w, hca);
    super::qp::qp_refs(w, hca, (pdn, cqn, cqn, Some(srqn)), 1);
    w.hcas[hca].qps.insert(
        dctn,
        Qp {
            ctx,
            qpn: dctn,
            qp_type: qpt::RC,
            state: qps::RTR,
            pdn,
            send_cq: cqn,
            recv_cq: cqn,
            srq: Some(srqn),
            uidx: g(dct::USER_INDEX) as u32,
            bfreg: u32::MAX,
            port: 1,
            path_mtu: mtu,
            access: acc,
            min_rnr_timer: g(dct::MIN_RNR_NAK) as u8,
            hpc: QpExt {
                kind: QpKind::Dct {
                    key: g(dct::DC_ACCESS_KEY),
                },
                ..Default::default()
            },
            ..Default::default()
        },
    );
    let mut out = vec![0u8; dct::OUT_BYTES];
    prm::set(&mut out, dct::OUT_DCTN, u64::from(dctn));
    Ok((out, Object::Dct { dctn }))
}

/// CREATE_RMP: a receive memory pool, i.e. an SRQ whose ring and doorbell record are in
/// umems (linked-list or cyclic WQ, no striding). The device consumes it as any SRQ.
pub(super) fn create_rmp(
    w: &mut World,
    ctx: u64,
    cmd: &[u8],
) -> Result<(Vec<u8>, Object), Vec<u8>> {
    if cmd.len() < rmp::IN_BYTES {
        return Err(bad(status::BAD_INP_LEN));
    }
    let g = |f: Field| prm::get(cmd, f.at(rmp::WQ));
    let hca = hca_of(w, ctx);
    let pdn = g(rmp::PD) as u32;
    if w.hcas[hca].pds.get(&pdn).is_none_or(|x| x.ctx != ctx) {
        return Err(bad(status::BAD_RES));
    }
    let ty = g(rmp::WQ_TYPE);
    if prm::get(cmd, rmp::STATE) != rmp::STATE_RDY
        || !(ty == rmp::WQ_LINKED_LIST || ty == rmp::WQ_CYCLIC)
    {
        return Err(bad(status::BAD_PARAM));
    }
    let log_stride = g(rmp::LOG_WQ_STRIDE) as u32;
    let log_sz = g(rmp::LOG_WQ_SZ) as u32;
    // A WQE holds its 16-byte next segment and at least one data segment.
    if !(5..=11).contains(&log_stride) || log_sz > 15 {
        return Err(bad(status::BAD_PARAM));
    }
    let (cnt, stride) = (1u32 << log_sz, 1u32 << log_stride);
    let (wq_id, dbr_id) = (g(rmp::WQ_UMEM_ID) as u32, g(rmp::DBR_UMEM_ID) as u32);
    let buf = umem_range(w, ctx, wq_id, 0, u64::from(cnt) * u64::from(stride))
        .ok_or_else(|| bad(status::BAD_PARAM))?;
    let db =
        umem_range(w, ctx, dbr_id, g(rmp::DBR_ADDR), 4).ok_or_else(|| bad(status::BAD_PARAM))?;
    if db % 4 != 0 {
        return Err(bad(status::BAD_PARAM));
    }
    let srqn = next_id(w, hca);
    super::pd_use(w, hca, pdn, 1);
    umem_use(w, ctx, wq_id, 1);
    umem_use(w, ctx, dbr_id, 1);
    w.hcas[hca].srqs.insert(
        srqn,
        Srq {
            ctx,
            pdn,
            user_handle: 0,
            buf,
            db,
            wqe_cnt: cnt,
            stride,
            max_wr: cnt - 1,
            max_sge: stride / 16 - 1 - u32::from(g(rmp::WQ_SIGNATURE) != 0),
            limit: 0,
            consumed: 0,
            head: 0,
            users: 0,
        },
    );
    let mut out = vec![0u8; rmp::OUT_BYTES];
    prm::set(&mut out, rmp::OUT_RMPN, u64::from(srqn));
    Ok((
        out,
        Object::Rmp {
            srqn,
            wq: wq_id,
            dbr: dbr_id,
        },
    ))
}

/// Destroy: the QP, DCT or RMP leaves the device; its references go.
pub(super) fn destroy(w: &mut World, ctx: u64, obj: Object) {
    let hca = hca_of(w, ctx);
    let num = match obj {
        Object::Rmp { srqn, wq, dbr } => {
            umem_use(w, ctx, wq, -1);
            umem_use(w, ctx, dbr, -1);
            if let Some(s) = w.hcas[hca].srqs.remove(&srqn) {
                super::pd_use(w, hca, s.pdn, -1);
            }
            return;
        }
        Object::Qp { qpn, wq, dbr } => {
            umem_use(w, ctx, wq, -1);
            umem_use(w, ctx, dbr, -1);
            qpn
        }
        Object::Dct { dctn } => dctn,
        Object::Mkey { idx } => {
            super::devx_mkey::destroy_mkey(w, ctx, idx);
            return;
        }
    };
    super::devx::unsubscribe(w, ctx, num);
    if let Some(q) = w.hcas[hca].qps.remove(&num) {
        super::qp::qp_refs(w, hca, (q.pdn, q.send_cq, q.recv_cq, q.srq), -1);
    }
}

/// PRM state of a verbs state.
fn prm_state(s: u8) -> u64 {
    match s {
        qps::INIT => qpc::STATE_INIT,
        qps::RTR => qpc::STATE_RTR,
        qps::RTS => qpc::STATE_RTS,
        qps::SQD => qpc::STATE_SQD,
        qps::SQE => qpc::STATE_SQER,
        qps::ERR => qpc::STATE_ERR,
        _ => qpc::STATE_RST,
    }
}

/// The QP commands an object handle may carry to modify (`devx_is_obj_modify_cmd`).
pub(super) fn is_qp_modify(opcode: u16) -> bool {
    matches!(
        opcode,
        op::RST2INIT_QP
            | op::INIT2INIT_QP
            | op::INIT2RTR_QP
            | op::RTR2RTS_QP
            | op::RTS2RTS_QP
            | op::SQERR2RTS_QP
            | op::TO_ERR_QP
            | op::TO_RST_QP
    )
}

/// A QP transition command on QP `qpn` (a DEVX QP or a verbs QP of the context).
pub(super) fn modify_qp(w: &mut World, ctx: u64, qpn: u32, cmd: &[u8]) -> FwResult {
    let opcode = prm::get(cmd, hdr::OPCODE) as u16;
    let short = matches!(opcode, op::TO_ERR_QP | op::TO_RST_QP);
    let need = if short {
        qp::SHORT_IN_BYTES
    } else {
        qp::IN_BYTES
    };
    if cmd.len() < need {
        return Err(bad(status::BAD_INP_LEN));
    }
    let hca = hca_of(w, ctx);
    let roce = w.hcas[hca].info.is_roce();
    let g = |f: Field| prm::get(cmd, f);
    let q0 = w.hcas[hca]
        .qps
        .get(&qpn)
        .ok_or_else(|| bad(status::BAD_RES))?;
    let cur = q0.state;
    let dci = q0.hpc.kind == QpKind::Dci;
    let (from, next): (&[u8], u8) = match opcode {
        op::RST2INIT_QP => (&[qps::RESET], qps::INIT),
        op::INIT2INIT_QP => (&[qps::INIT], qps::INIT),
        op::INIT2RTR_QP => (&[qps::INIT], qps::RTR),
        op::RTR2RTS_QP => (&[qps::RTR], qps::RTS),
        op::RTS2RTS_QP => (&[qps::RTS], qps::RTS),
        op::SQERR2RTS_QP => (&[qps::SQE], qps::RTS),
        op::TO_ERR_QP => (&[], qps::ERR),
        _ => (&[], qps::RESET),
    };
    if !from.is_empty() && !from.contains(&cur) {
        return Err(bad(status::BAD_QP_STATE));
    }
    // Address path checks before anything changes.
    let mut path = None;
    if matches!(opcode, op::RST2INIT_QP | op::INIT2INIT_QP | op::INIT2RTR_QP) {
        let port = g(p(ads::VHCA_PORT_NUM));
        if port > 1 || g(p(ads::PKEY_INDEX)) != 0 {
            return Err(bad(status::BAD_PARAM));
        }
    }
    if opcode == op::INIT2RTR_QP {
        let mut dgid = [0u8; 16];
        let start = p(ads::RGID_RIP).byte();
        dgid.copy_from_slice(&cmd[start..start + 16]);
        let sgid_index = g(p(ads::SRC_ADDR_INDEX)) as u8;
        let mut dmac = [0u8; 6];
        // A DCI's destination comes with each WQE (its datagram segment): only the source
        // side of the path is checked.
        if roce && super::gid_at(w, hca, u32::from(sgid_index)).is_none() {
            return Err(bad(status::BAD_PARAM));
        }
        if roce && !dci {
            dmac = crate::roce::resolve_dmac(&dgid).ok_or_else(|| bad(status::BAD_PARAM))?;
        }
        let grh = roce || g(p(ads::GRH)) != 0;
        path = Some(Path {
            dlid: if roce { 0 } else { g(p(ads::RLID)) as u16 },
            dgid: if grh { dgid } else { [0; 16] },
            is_global: grh,
            sl: g(p(ads::SL)) as u8,
            port: 1,
            sgid_index,
            flow_label: g(p(ads::FLOW_LABEL)) as u32,
            hop_limit: g(p(ads::HOP_LIMIT)) as u8,
            tclass: g(p(ads::TCLASS)) as u8,
            dmac,
        });
    }
    let mtu = g(q(qpc::MTU)) as u8;
    if opcode == op::INIT2RTR_QP && !(1..=5).contains(&mtu) {
        return Err(bad(status::BAD_PARAM));
    }
    let ra = |f: Field| (1u32 << g(q(f)).min(7)).min(caps::MAX_RD_ATOM) as u8;
    // RST2INIT sets the remote access enables; later transitions change those whose
    // optional-parameter bit is set.
    let opt = if opcode == op::RST2INIT_QP {
        u64::MAX
    } else {
        g(qp::OPT_PARAM_MASK)
    };
    let access_of = |old: u32| {
        let mut a = old | access::LOCAL_WRITE;
        for (f, par, bit) in [
            (qpc::RRE, qp::OPTPAR_RRE, access::REMOTE_READ),
            (qpc::RWE, qp::OPTPAR_RWE, access::REMOTE_WRITE),
            (qpc::RAE, qp::OPTPAR_RAE, access::REMOTE_ATOMIC),
        ] {
            if opt & par != 0 {
                a = if g(q(f)) != 0 { a | bit } else { a & !bit };
            }
        }
        a
    };
    let qp = w.hcas[hca]
        .qps
        .get_mut(&qpn)
        .ok_or_else(|| bad(status::BAD_RES))?;
    match opcode {
        op::RST2INIT_QP | op::INIT2INIT_QP => {
            qp.port = 1;
            qp.pkey_index = 0;
            qp.access = access_of(qp.access);
        }
        op::INIT2RTR_QP => {
            qp.path_mtu = mtu;
            qp.min_rnr_timer = g(q(qpc::MIN_RNR_NAK)) as u8;
            if !dci {
                qp.dest_qpn = g(q(qpc::REMOTE_QPN)) as u32;
                qp.rq_psn = g(q(qpc::NEXT_RCV_PSN)) as u32;
                qp.max_dest_rd_atomic = ra(qpc::LOG_RRA_MAX);
                qp.access = access_of(qp.access);
            }
            if let Some(path) = path {
                qp.path = path;
            }
        }
        op::RTS2RTS_QP | op::SQERR2RTS_QP => qp.access = access_of(qp.access),
        op::RTR2RTS_QP => {
            qp.access = access_of(qp.access);
            qp.max_rd_atomic = ra(qpc::LOG_SRA_MAX);
            qp.retry_cnt = g(q(qpc::RETRY_COUNT)) as u8;
            qp.rnr_retry = g(q(qpc::RNR_RETRY)) as u8;
            qp.timeout = g(p(ads::ACK_TIMEOUT)) as u8;
            qp.sq_psn = g(q(qpc::NEXT_SEND_PSN)) as u32;
            qp.rc.retries_left = qp.retry_cnt;
            qp.rc.rnr_left = qp.rnr_retry;
        }
        _ => {}
    }
    if next == qps::RESET {
        qp.sq_head = 0;
        qp.sq_rung = 0;
        qp.rq_head = 0;
        qp.rq_pi_seen = 0;
        qp.rq_prefetch = (0, Vec::new());
        qp.rc = Default::default();
    }
    let raise = next == qps::ERR && cur != qps::ERR && qp.srq.is_some();
    qp.state = next;
    if raise {
        super::devx::raise(w, ctx, qpn, super::devx::EVENT_SRQ_LAST_WQE);
    }
    Ok(vec![0u8; qp::OUT_BYTES])
}

/// QUERY_QP of QP `qpn`: its context as the firmware reports it.
pub(super) fn query_qp(w: &World, ctx: u64, qpn: u32, cmd: &[u8]) -> FwResult {
    if cmd.len() < qp::SHORT_IN_BYTES {
        return Err(bad(status::BAD_INP_LEN));
    }
    let hca = hca_of(w, ctx);
    let x = w.hcas[hca]
        .qps
        .get(&qpn)
        .ok_or_else(|| bad(status::BAD_RES))?;
    let mut out = vec![0u8; qp::QUERY_OUT_BYTES];
    let mut put = |f: Field, v: u64| prm::set(&mut out, f, v);
    let log = |n: u32| u64::from(n.checked_ilog2().unwrap_or(0));
    put(q(qpc::STATE), prm_state(x.state));
    put(
        q(qpc::ST),
        if x.hpc.kind == QpKind::Dci {
            qpc::ST_DCI
        } else {
            qpc::ST_RC
        },
    );
    put(q(qpc::PM_STATE), 3);
    put(q(qpc::PD), u64::from(x.pdn));
    put(q(qpc::MTU), u64::from(x.path_mtu));
    put(q(qpc::LOG_MSG_MAX), u64::from(caps::LOG_MAX_MSG));
    put(q(qpc::LOG_SQ_SIZE), log(x.sq_wqe_cnt));
    put(q(qpc::NO_SQ), u64::from(x.sq_wqe_cnt == 0));
    put(q(qpc::LOG_RQ_SIZE), log(x.rq_wqe_cnt));
    if x.rq_wqe_cnt != 0 {
        put(q(qpc::LOG_RQ_STRIDE), u64::from(x.rq_wqe_shift - 4));
    }
    put(q(qpc::USER_INDEX), u64::from(x.uidx & 0xff_ffff));
    put(q(qpc::REMOTE_QPN), u64::from(x.dest_qpn));
    put(p(ads::RLID), u64::from(x.path.dlid));
    put(p(ads::GRH), u64::from(x.path.is_global));
    put(p(ads::SL), u64::from(x.path.sl));
    put(p(ads::VHCA_PORT_NUM), u64::from(x.port));
    put(p(ads::SRC_ADDR_INDEX), u64::from(x.path.sgid_index));
    put(p(ads::HOP_LIMIT), u64::from(x.path.hop_limit));
    put(p(ads::TCLASS), u64::from(x.path.tclass));
    put(p(ads::FLOW_LABEL), u64::from(x.path.flow_label));
    put(p(ads::ACK_TIMEOUT), u64::from(x.timeout));
    put(q(qpc::LOG_SRA_MAX), log(u32::from(x.max_rd_atomic)));
    put(q(qpc::LOG_RRA_MAX), log(u32::from(x.max_dest_rd_atomic)));
    put(q(qpc::RETRY_COUNT), u64::from(x.retry_cnt));
    put(q(qpc::RNR_RETRY), u64::from(x.rnr_retry));
    put(q(qpc::MIN_RNR_NAK), u64::from(x.min_rnr_timer));
    put(q(qpc::NEXT_SEND_PSN), u64::from(x.sq_psn));
    put(q(qpc::NEXT_RCV_PSN), u64::from(x.rq_psn));
    put(q(qpc::CQN_SND), u64::from(x.send_cq));
    put(q(qpc::CQN_RCV), u64::from(x.recv_cq));
    put(q(qpc::RRE), u64::from(x.access & access::REMOTE_READ != 0));
    put(q(qpc::RWE), u64::from(x.access & access::REMOTE_WRITE != 0));
    put(
        q(qpc::RAE),
        u64::from(x.access & access::REMOTE_ATOMIC != 0),
    );
    match x.srq {
        Some(s) => {
            put(q(qpc::RQ_TYPE), qpc::RQ_SRQ);
            put(q(qpc::SRQN_RMPN_XRQN), u64::from(s));
        }
        None if x.rq_wqe_cnt == 0 => put(q(qpc::RQ_TYPE), qpc::RQ_ZERO),
        None => {}
    }
    if x.bfreg & DEVX_UAR_BFREG != 0 && x.bfreg != u32::MAX {
        put(q(qpc::UAR_PAGE), u64::from(x.bfreg & !DEVX_UAR_BFREG));
    }
    let gid = p(ads::RGID_RIP).byte();
    out[gid..gid + 16].copy_from_slice(&x.path.dgid);
    Ok(out)
}

/// QUERY_DCT: the DCT context (state active) with its numbers.
pub(super) fn query_dct(w: &World, ctx: u64, dctn: u32, cmd: &[u8]) -> FwResult {
    if cmd.len() < HDR {
        return Err(bad(status::BAD_INP_LEN));
    }
    let hca = hca_of(w, ctx);
    let x = w.hcas[hca]
        .qps
        .get(&dctn)
        .ok_or_else(|| bad(status::BAD_RES))?;
    let QpKind::Dct { key } = x.hpc.kind else {
        return Err(bad(status::BAD_RES));
    };
    let mut out = vec![0u8; dct::QUERY_OUT_BYTES.max(0x80 + 64)];
    let mut put = |f: Field, v: u64| prm::set(&mut out, f.at(dct::DCTC), v);
    put(dct::STATE, dct::STATE_ACTIVE);
    put(dct::CQN, u64::from(x.recv_cq));
    put(dct::SRQN_XRQN, u64::from(x.srq.unwrap_or(0)));
    put(dct::PD, u64::from(x.pdn));
    put(dct::DC_ACCESS_KEY, key);
    put(dct::MTU, u64::from(x.path_mtu));
    put(dct::PORT, 1);
    put(dct::MIN_RNR_NAK, u64::from(x.min_rnr_timer));
    put(dct::USER_INDEX, u64::from(x.uidx & 0xff_ffff));
    Ok(out)
}

const HDR: usize = super::devx::HDR_BYTES;

/// Whether a command's object number names `num` (`devx_is_valid_obj_id`: a command on
/// another object than the handle's is EINVAL).
pub(super) fn names(cmd: &[u8], num: u32) -> bool {
    let opcode = prm::get(cmd, hdr::OPCODE) as u16;
    let field = match opcode {
        op::QUERY_DCT | op::DRAIN_DCT | op::ARM_DCT_FOR_KEY_VIOLATION => dct::IN_DCTN,
        _ => hdr::QPN,
    };
    prm::get(cmd, field) as u32 == num
}

/// Reject a DEVX command on a handle mlx5_ib does not recognise.
pub(super) fn no_object() -> Errno {
    EINVAL
}
