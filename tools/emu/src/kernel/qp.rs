//! Queue pairs: CREATE_QP (legacy and extended), MODIFY_QP (legacy and extended) with the
//! kernel's transition table, QUERY_QP, DESTROY_QP.

use mlx5_ffi::cmd::cmds;
use mlx5_ffi::ioctl::{
    IB_QP_CREATE_SOURCE_QPN, IB_UVERBS_QP_CREATE_BLOCK_MULTICAST_LOOPBACK,
    IB_UVERBS_QP_CREATE_CVLAN_STRIPPING, IB_UVERBS_QP_CREATE_PCI_WRITE_END_PADDING,
    IB_UVERBS_QP_CREATE_SCATTER_FCS,
};
use mlx5_ffi::mlx5::{
    MLX5_QP_FLAG_ALLOW_SCATTER_CQE, MLX5_QP_FLAG_SCATTER_CQE, MLX5_QP_FLAG_SIGNATURE,
    MLX5_QP_FLAG_UAR_PAGE_INDEX, Mlx5IbCreateQp, Mlx5IbCreateQpResp, Mlx5IbModifyQpResp,
};
use mlx5_ffi::uverbs::{
    IB_UVERBS_CREATE_QP_SUP_COMP_MASK, IbUverbsCreateQpResp, IbUverbsDestroyQpResp,
    IbUverbsExCreateQp, IbUverbsExCreateQpResp, IbUverbsExModifyQp, IbUverbsExModifyQpResp,
    IbUverbsQpDest, IbUverbsQueryQpResp, mig_state, mtu, qp_attr,
};

use super::{
    EINVAL, EOPNOTSUPP, Req, bump, caps, cq_of, cq_use, gid_at, hca_of, new_handle, next_handle,
    next_id, pd_of, pd_use, pin_queue, qp_of, remove_handle, srq_of,
};
use crate::abi::Errno;
use crate::state::{Obj, Path, Qp, World, access, qps, qpt};

/// `MLX5_IB_INVALID_BFREG`: the QP rings a dynamic UAR, not a bfreg of the static table.
const INVALID_BFREG: u32 = 1 << 31;
/// No user index (CQE version 0).
const NO_UIDX: u32 = 0xff_ffff;

/// Take (`delta` 1) or drop (-1) a QP's references on its PD, CQs and SRQ.
pub(super) fn qp_refs(
    w: &mut World,
    hca: usize,
    (pdn, scq, rcq, srq): (u32, u32, u32, Option<u32>),
    delta: i32,
) {
    pd_use(w, hca, pdn, delta);
    cq_use(w, hca, scq, delta);
    cq_use(w, hca, rcq, delta);
    if let Some(s) = srq {
        bump(w.hcas[hca].srqs.get_mut(&s).map(|s| &mut s.users), delta);
    }
}

pub(super) fn create_qp(w: &mut World, ctx: u64, r: &Req) -> Result<(), Errno> {
    // Both framings as the extended request (the legacy one has no comp_mask/flags).
    let mut c = if r.ex {
        r.core::<cmds::ExCreateQp>()
    } else {
        let l = r.core::<cmds::CreateQp>();
        IbUverbsExCreateQp {
            user_handle: l.user_handle,
            pd_handle: l.pd_handle,
            send_cq_handle: l.send_cq_handle,
            recv_cq_handle: l.recv_cq_handle,
            srq_handle: l.srq_handle,
            max_send_wr: l.max_send_wr,
            max_recv_wr: l.max_recv_wr,
            max_send_sge: l.max_send_sge,
            max_recv_sge: l.max_recv_sge,
            max_inline_data: l.max_inline_data,
            sq_sig_all: l.sq_sig_all,
            qp_type: l.qp_type,
            is_srq: l.is_srq,
            ..Default::default()
        }
    };
    if r.ex {
        // ib_uverbs_ex_create_qp: comp_mask bits it does not know and create flags outside
        // its list are EINVAL; the listed ones reach mlx5_ib, which answers EOPNOTSUPP for
        // those the HCA lacks (process_create_flags): here, all of them.
        let core_flags = IB_UVERBS_QP_CREATE_BLOCK_MULTICAST_LOOPBACK
            | IB_UVERBS_QP_CREATE_SCATTER_FCS
            | IB_UVERBS_QP_CREATE_CVLAN_STRIPPING
            | IB_QP_CREATE_SOURCE_QPN
            | IB_UVERBS_QP_CREATE_PCI_WRITE_END_PADDING;
        if c.comp_mask & !IB_UVERBS_CREATE_QP_SUP_COMP_MASK != 0
            || c.create_flags & !core_flags != 0
        {
            return Err(EINVAL);
        }
        if c.create_flags != 0 || c.comp_mask != 0 {
            return Err(EOPNOTSUPP);
        }
    }
    // XRC and DC (kernel/xrc.rs, kernel/dc.rs): targets are made there; initiators go on
    // as RC-engine QPs of that kind.
    let Some(kind) = super::xrc::create_qp_xrc(w, ctx, r, &mut c)? else {
        return Ok(());
    };
    let Some(kind) = super::dc::create_qp_dc(w, ctx, r, &mut c, kind)? else {
        return Ok(());
    };
    let qp_type = c.qp_type;
    let raw = qp_type == qpt::RAW_PACKET;
    if !caps::qp_type_supported(qp_type) {
        return Err(EOPNOTSUPP);
    }
    if raw {
        super::flow::check_raw_qp(w, ctx)?;
    }
    let pdn = pd_of(w, ctx, c.pd_handle)?;
    let send_cq = cq_of(w, ctx, c.send_cq_handle)?;
    let recv_cq = cq_of(w, ctx, c.recv_cq_handle)?;
    let is_srq = c.is_srq != 0;
    let srq = if is_srq {
        let n = srq_of(w, ctx, c.srq_handle)?;
        // ib_uverbs' create_qp: an XRC SRQ serves XRC targets only (`srq_type == IB_SRQT_XRC`
        // is EINVAL for every other QP type).
        if w.hcas[hca_of(w, ctx)].hpc.xrc_srqs.contains_key(&n) {
            return Err(EINVAL);
        }
        Some(n)
    } else {
        None
    };
    let cap = [
        c.max_send_wr,
        c.max_recv_wr,
        c.max_send_sge,
        c.max_recv_sge,
        c.max_inline_data,
    ];
    if cap[0] > caps::MAX_QP_WR
        || cap[1] > caps::MAX_QP_WR
        || cap[2] > caps::MAX_SGE
        || cap[3] > caps::MAX_SGE
        || cap[4] > caps::MAX_INLINE
    {
        return Err(EINVAL);
    }
    let cqe_version = w.contexts[&ctx].cqe_version;
    // Driver data up to `uidx` (CQE version 0) or `bfreg_index` (version 1).
    let min_drv = if cqe_version != 0 {
        std::mem::offset_of!(Mlx5IbCreateQp, bfreg_index)
    } else {
        std::mem::offset_of!(Mlx5IbCreateQp, uidx)
    };
    if r.drv_in.len() < min_drv {
        return Err(EINVAL);
    }
    let d = r.drv::<cmds::CreateQp>()?;
    let (sq_cnt, rq_cnt, rq_shift, flags) =
        (d.sq_wqe_count, d.rq_wqe_count, d.rq_wqe_shift, d.flags);
    let uidx = if cqe_version != 0 { d.uidx } else { NO_UIDX };
    let known = MLX5_QP_FLAG_SIGNATURE
        | MLX5_QP_FLAG_SCATTER_CQE
        | MLX5_QP_FLAG_ALLOW_SCATTER_CQE
        | MLX5_QP_FLAG_UAR_PAGE_INDEX
        | super::dc::driver_flags(&kind);
    if flags & !known != 0 {
        return Err(EINVAL);
    }
    let uar_page = flags & MLX5_QP_FLAG_UAR_PAGE_INDEX != 0;
    let cx = &w.contexts[&ctx];
    if uar_page && !cx.dyn_pages.contains_key(&d.bfreg_index) || !uar_page && cx.dyn_uar {
        return Err(EINVAL);
    }
    if uidx > NO_UIDX || (cqe_version != 0 && uidx == NO_UIDX) {
        return Err(EINVAL);
    }
    if (sq_cnt != 0 && !sq_cnt.is_power_of_two())
        || sq_cnt > caps::MAX_QP_WR
        || (sq_cnt == 0 && cap[0] > 0)
    {
        return Err(EINVAL);
    }
    if is_srq && rq_cnt != 0 {
        return Err(EINVAL);
    }
    if rq_cnt != 0
        && (!rq_cnt.is_power_of_two() || rq_cnt > caps::MAX_QP_WR || !(4..=11).contains(&rq_shift))
    {
        return Err(EINVAL);
    }
    if !is_srq && rq_cnt < cap[1] {
        return Err(EINVAL);
    }
    if rq_cnt != 0 && (1u32 << rq_shift) / 16 < cap[3].max(1) {
        return Err(EINVAL);
    }
    // Without an RQ its shift is not checked (the kernel ignores it): no shift by it then.
    let rq_bytes = if rq_cnt == 0 {
        0
    } else {
        u64::from(rq_cnt) << rq_shift
    };
    // RAW_PACKET: the SQ has its own buffer (`sq_buf_addr`), pinned on its own.
    let sq_bytes = u64::from(sq_cnt) * 64;
    let bytes = rq_bytes + if raw { 0 } else { sq_bytes };
    pin_queue(d.buf_addr, bytes, d.db_addr, 8, 4)?;
    if raw && sq_cnt != 0 {
        pin_queue(d.sq_buf_addr, sq_bytes, d.db_addr, 8, 4)?;
    }
    let sq_base = if raw {
        d.sq_buf_addr
    } else {
        d.buf_addr + rq_bytes
    };
    let hca = hca_of(w, ctx);
    // bfreg choice, static scheme: dedicated low-latency bfregs from the top first, then the
    // least used medium one, else bfreg 0 (doorbell only).
    let bfreg = if uar_page {
        u32::MAX // the QP rings the dynamic UAR it named
    } else {
        let cx = w.contexts.get_mut(&ctx).expect("context exists");
        let t = cx.tot_bfregs as usize;
        let first_hi = t - cx.num_low_lat as usize;
        let pick = (first_hi..t)
            .find(|&i| cx.bfreg_users[i] == 0)
            .or_else(|| (1..first_hi).min_by_key(|&i| cx.bfreg_users[i]))
            .unwrap_or(0);
        cx.bfreg_users[pick] += 1;
        pick as u32
    };
    let qpn = next_id(w, hca);
    let o = IbUverbsExCreateQpResp {
        base: IbUverbsCreateQpResp {
            qp_handle: next_handle(w, ctx),
            qpn,
            max_send_wr: cap[0],
            max_recv_wr: cap[1],
            max_send_sge: cap[2],
            max_recv_sge: cap[3],
            max_inline_data: cap[4],
            reserved: 0,
        },
        comp_mask: 0,
        response_length: Req::len_for(r.out_len, size_of::<IbUverbsExCreateQpResp>()),
    };
    // bfreg_index: libmlx5's table index (two bfregs per UAR page, four table slots).
    let dr = Mlx5IbCreateQpResp {
        bfreg_index: if uar_page {
            INVALID_BFREG
        } else {
            bfreg / 2 * 4 + bfreg % 2
        },
        ..Default::default()
    };
    let res = if r.ex {
        r.respond(&o)
    } else {
        r.respond(&o.base)
    }
    .and_then(|()| r.respond_drv(&dr));
    if let Err(e) = res {
        if let Some(u) = w
            .contexts
            .get_mut(&ctx)
            .and_then(|cx| cx.bfreg_users.get_mut(bfreg as usize))
        {
            *u -= 1;
        }
        return Err(e);
    }
    new_handle(w, ctx, Obj::Qp(qpn));
    qp_refs(w, hca, (pdn, send_cq, recv_cq, srq), 1);
    let sq_sig_all = c.sq_sig_all != 0;
    w.hcas[hca].qps.insert(
        qpn,
        Qp {
            ctx,
            qpn,
            qp_type,
            state: qps::RESET,
            pdn,
            send_cq,
            recv_cq,
            srq,
            user_handle: c.user_handle,
            sq_sig_all,
            buf: d.buf_addr,
            db: d.db_addr,
            sq_base,
            sq_wqe_cnt: sq_cnt,
            rq_wqe_cnt: rq_cnt,
            rq_wqe_shift: rq_shift,
            rq_max_gs: if rq_cnt == 0 {
                0
            } else {
                (1u32 << rq_shift) / 16 - u32::from(flags & MLX5_QP_FLAG_SIGNATURE != 0)
            },
            uidx,
            bfreg,
            scatter_cqe: flags & MLX5_QP_FLAG_SCATTER_CQE != 0,
            req_scatter: flags & MLX5_QP_FLAG_SCATTER_CQE != 0
                && (sq_sig_all || flags & MLX5_QP_FLAG_ALLOW_SCATTER_CQE != 0),
            cap,
            port: 1,
            pkey_index: 0,
            qkey: 0,
            access: 0,
            path_mtu: mtu::MTU_4096,
            dest_qpn: 0,
            rq_psn: 0,
            sq_psn: 0,
            timeout: 0,
            retry_cnt: 0,
            rnr_retry: 0,
            min_rnr_timer: 0,
            max_rd_atomic: 0,
            max_dest_rd_atomic: 0,
            path: Path::default(),
            sq_head: 0,
            sq_rung: 0,
            rq_head: 0,
            rq_pi_seen: 0,
            rq_prefetch: (0, Vec::new()),
            rc: Default::default(),
            sqd_notify: false,
            hpc: crate::xrc_dc::QpExt {
                kind,
                ..Default::default()
            },
        },
    );
    Ok(())
}

/// The kernel's transition table (`ib_modify_qp_is_ok`): (required, optional) attribute
/// masks for `cur -> next` on a QP of type `t`, or None if the transition is invalid.
pub(crate) fn transition(cur: u8, next: u8, t: u8) -> Option<(u32, u32)> {
    use qp_attr::*;
    if t == qpt::RAW_PACKET {
        return super::flow::raw_transition(cur, next);
    }
    let by = |ud: u32, uc: u32, rc: u32| match t {
        qpt::UD => ud,
        qpt::UC => uc,
        _ => rc,
    };
    Some(match (cur, next) {
        (_, qps::RESET) | (_, qps::ERR) => (0, 0),
        (qps::RESET, qps::INIT) => (
            by(
                PKEY_INDEX | PORT | QKEY,
                PKEY_INDEX | PORT | ACCESS_FLAGS,
                PKEY_INDEX | PORT | ACCESS_FLAGS,
            ),
            0,
        ),
        (qps::INIT, qps::INIT) => (
            0,
            by(
                PKEY_INDEX | PORT | QKEY,
                PKEY_INDEX | PORT | ACCESS_FLAGS,
                PKEY_INDEX | PORT | ACCESS_FLAGS,
            ),
        ),
        (qps::INIT, qps::RTR) => (
            by(
                0,
                AV | PATH_MTU | DEST_QPN | RQ_PSN,
                AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER,
            ),
            by(
                PKEY_INDEX | QKEY,
                ALT_PATH | ACCESS_FLAGS | PKEY_INDEX,
                ALT_PATH | ACCESS_FLAGS | PKEY_INDEX,
            ),
        ),
        (qps::RTR, qps::RTS) => (
            by(
                SQ_PSN,
                SQ_PSN,
                SQ_PSN | TIMEOUT | RETRY_CNT | RNR_RETRY | MAX_QP_RD_ATOMIC,
            ),
            by(
                CUR_STATE | QKEY,
                CUR_STATE | ALT_PATH | ACCESS_FLAGS | PATH_MIG_STATE,
                CUR_STATE | ALT_PATH | ACCESS_FLAGS | MIN_RNR_TIMER | PATH_MIG_STATE,
            ),
        ),
        (qps::RTS, qps::RTS) | (qps::SQD, qps::RTS) => (
            0,
            by(
                CUR_STATE | QKEY,
                CUR_STATE | ACCESS_FLAGS | ALT_PATH | PATH_MIG_STATE,
                CUR_STATE | ACCESS_FLAGS | ALT_PATH | PATH_MIG_STATE | MIN_RNR_TIMER,
            ),
        ),
        (qps::RTS, qps::SQD) => (0, EN_SQD_ASYNC_NOTIFY),
        (qps::SQD, qps::SQD) => (
            0,
            by(
                PKEY_INDEX | QKEY,
                AV | ALT_PATH | ACCESS_FLAGS | PKEY_INDEX | PATH_MIG_STATE,
                PORT | AV
                    | TIMEOUT
                    | RETRY_CNT
                    | RNR_RETRY
                    | MAX_QP_RD_ATOMIC
                    | MAX_DEST_RD_ATOMIC
                    | ALT_PATH
                    | ACCESS_FLAGS
                    | PKEY_INDEX
                    | MIN_RNR_TIMER
                    | PATH_MIG_STATE,
            ),
        ),
        (qps::SQE, qps::RTS) if t != qpt::RC => {
            (0, by(CUR_STATE | QKEY, CUR_STATE | ACCESS_FLAGS, 0))
        }
        _ => return None,
    })
}

pub(super) fn modify_qp(w: &mut World, ctx: u64, r: &Req) -> Result<(), Errno> {
    // Both framings as the extended request (the legacy one has no rate limit).
    let ex = if r.ex {
        r.core::<cmds::ExModifyQp>()
    } else {
        IbUverbsExModifyQp {
            base: r.core::<cmds::ModifyQp>(),
            ..Default::default()
        }
    };
    if ex.reserved != 0 {
        return Err(EOPNOTSUPP);
    }
    let c = ex.base;
    let qpn = qp_of(w, ctx, c.qp_handle)?;
    let mut m = c.attr_mask;
    let hca = hca_of(w, ctx);
    let qp = w.hcas[hca].qps.get(&qpn).ok_or(EINVAL)?;
    if m & !(qp_attr::KNOWN | mlx5_ffi::uverbs::IB_QP_RATE_LIMIT) != 0 {
        return Err(EINVAL);
    }
    let cur = if m & qp_attr::CUR_STATE != 0 {
        c.cur_qp_state
    } else {
        qp.state
    };
    if cur > qps::ERR {
        return Err(EINVAL);
    }
    if m & qp_attr::CUR_STATE != 0 && cur != qp.state && !(cur == qps::SQE && qp.state == qps::RTS)
    {
        return Err(EINVAL);
    }
    let next = if m & qp_attr::STATE != 0 {
        c.qp_state
    } else {
        cur
    };
    if next > qps::ERR {
        return Err(EINVAL);
    }
    // XRC and DC: the kernel's table knows them by their own types (kernel/xrc.rs); a DCT
    // has its own modify (kernel/dc.rs) and a DCI's attributes are not checked by mlx5_ib.
    let vt = qp.hpc.verbs_type(qp.qp_type);
    if matches!(qp.hpc.kind, crate::xrc_dc::QpKind::Dct { .. }) {
        return super::dc::modify_dct(w, ctx, r, qpn, &ex);
    }
    let dci = qp.hpc.kind == crate::xrc_dc::QpKind::Dci;
    m = super::xrc::modify_qp_mask(vt, m);
    let (req, opt) = transition(cur, next, vt)
        .map(|t| super::xrc::xrc_transition(cur, next, vt, t))
        .ok_or(EINVAL)?;
    if !dci && (m & req != req || m & !(req | opt | qp_attr::STATE) != 0) {
        return Err(EINVAL);
    }
    // Value checks.
    if m & qp_attr::PORT != 0 && c.port_num != 1 {
        return Err(EINVAL);
    }
    if m & qp_attr::PKEY_INDEX != 0 && c.pkey_index >= 1 {
        return Err(EINVAL);
    }
    if m & qp_attr::PATH_MTU != 0 && !(mtu::MTU_256..=mtu::MTU_4096).contains(&c.path_mtu) {
        return Err(EINVAL);
    }
    if m & qp_attr::MAX_QP_RD_ATOMIC != 0 && u32::from(c.max_rd_atomic) > caps::MAX_RD_ATOM {
        return Err(EINVAL);
    }
    if m & qp_attr::MAX_DEST_RD_ATOMIC != 0 && u32::from(c.max_dest_rd_atomic) > caps::MAX_RD_ATOM {
        return Err(EINVAL);
    }
    if m & qp_attr::TIMEOUT != 0 && c.timeout > 31
        || m & qp_attr::RETRY_CNT != 0 && c.retry_cnt > 7
        || m & qp_attr::RNR_RETRY != 0 && c.rnr_retry > 7
        || m & qp_attr::MIN_RNR_TIMER != 0 && c.min_rnr_timer > 31
    {
        return Err(EINVAL);
    }
    if m & qp_attr::DEST_QPN != 0 && c.dest_qp_num > 0xff_ffff {
        return Err(EINVAL);
    }
    let qp_access = access::LOCAL_WRITE
        | access::REMOTE_WRITE
        | access::REMOTE_READ
        | access::REMOTE_ATOMIC
        | access::RELAXED_ORDERING;
    if m & qp_attr::ACCESS_FLAGS != 0 && c.qp_access_flags & !qp_access != 0 {
        return Err(EINVAL);
    }
    let dest: IbUverbsQpDest = c.dest;
    if m & qp_attr::AV != 0 && dest.port_num > 1 {
        return Err(EINVAL);
    }
    if m & qp_attr::PATH_MIG_STATE != 0 && c.path_mig_state > mig_state::ARMED {
        return Err(EINVAL);
    }
    // RoCE (mlx5_set_path): an address vector must carry a GRH (is_global) whose source
    // GID index names a valid GID table entry; the destination MAC is resolved from the
    // GID and the DLID is not used.
    let roce = w.hcas[hca].info.is_roce();
    let mut dmac = [0u8; 6];
    if roce && m & qp_attr::AV != 0 {
        if dest.is_global == 0 || gid_at(w, hca, u32::from(dest.sgid_index)).is_none() {
            return Err(EINVAL);
        }
        dmac = crate::roce::resolve_dmac(&dest.dgid).ok_or(Errno(libc::EHOSTUNREACH))?;
    }
    if r.ex {
        // mlx5_ib_modify_qp: no comp_mask bit (burst info, ECE) is supported.
        if r.drv::<cmds::ExModifyQp>()?.comp_mask != 0 {
            return Err(EOPNOTSUPP);
        }
    }
    super::flow::set_rate_limit(w, hca, qpn, m, ex.rate_limit)?;
    let qp = w.hcas[hca].qps.get_mut(&qpn).ok_or(EINVAL)?;
    for (bit, value, field) in [
        (qp_attr::PORT, c.port_num, &mut qp.port),
        (qp_attr::PATH_MTU, c.path_mtu, &mut qp.path_mtu),
        (qp_attr::TIMEOUT, c.timeout, &mut qp.timeout),
        (qp_attr::RETRY_CNT, c.retry_cnt, &mut qp.retry_cnt),
        (qp_attr::RNR_RETRY, c.rnr_retry, &mut qp.rnr_retry),
        (
            qp_attr::MAX_QP_RD_ATOMIC,
            c.max_rd_atomic,
            &mut qp.max_rd_atomic,
        ),
        (
            qp_attr::MAX_DEST_RD_ATOMIC,
            c.max_dest_rd_atomic,
            &mut qp.max_dest_rd_atomic,
        ),
        (
            qp_attr::MIN_RNR_TIMER,
            c.min_rnr_timer,
            &mut qp.min_rnr_timer,
        ),
    ] {
        if m & bit != 0 {
            *field = value;
        }
    }
    // 32-bit attributes; PSNs are 24 bits.
    for (bit, value, keep, field) in [
        (
            qp_attr::ACCESS_FLAGS,
            c.qp_access_flags,
            u32::MAX,
            &mut qp.access,
        ),
        (qp_attr::QKEY, c.qkey, u32::MAX, &mut qp.qkey),
        (qp_attr::RQ_PSN, c.rq_psn, 0xff_ffff, &mut qp.rq_psn),
        (qp_attr::SQ_PSN, c.sq_psn, 0xff_ffff, &mut qp.sq_psn),
        (qp_attr::DEST_QPN, c.dest_qp_num, u32::MAX, &mut qp.dest_qpn),
    ] {
        if m & bit != 0 {
            *field = value & keep;
        }
    }
    if m & qp_attr::PKEY_INDEX != 0 {
        qp.pkey_index = c.pkey_index;
    }
    if m & qp_attr::AV != 0 {
        qp.path = Path {
            // RoCE: no LIDs; the address is the GID (QUERY_QP reports DLID 0).
            dlid: if roce { 0 } else { dest.dlid },
            dgid: dest.dgid,
            is_global: dest.is_global != 0,
            sl: dest.sl,
            port: dest.port_num,
            sgid_index: dest.sgid_index,
            flow_label: dest.flow_label & 0xf_ffff,
            hop_limit: dest.hop_limit,
            tclass: dest.traffic_class,
            dmac,
        };
    }
    if next == qps::RESET {
        qp.sq_head = 0;
        qp.sq_rung = 0;
        qp.rq_head = 0;
        qp.rq_pi_seen = 0;
        qp.rq_prefetch = (0, Vec::new());
        qp.rc = Default::default();
    }
    if next == qps::RTS && cur == qps::RTR {
        qp.rc.retries_left = qp.retry_cnt;
        qp.rc.rnr_left = qp.rnr_retry;
    }
    if next == qps::SQD && cur == qps::RTS {
        // SQ drain: no new WQEs start; IBV_EVENT_SQ_DRAINED once the outstanding ones are done.
        qp.sqd_notify = m & qp_attr::EN_SQD_ASYNC_NOTIFY != 0 && c.en_sqd_async_notify != 0;
    }
    qp.state = next;
    if r.ex && r.drv_out_len > 0 {
        r.respond_drv(&Mlx5IbModifyQpResp {
            response_length: Req::len_for(r.drv_out_len, size_of::<Mlx5IbModifyQpResp>()),
            ..Default::default()
        })?;
    }
    if r.ex && r.out_len > 0 {
        r.respond(&IbUverbsExModifyQpResp {
            comp_mask: 0,
            response_length: Req::len_for(r.out_len, size_of::<IbUverbsExModifyQpResp>()),
        })?;
    }
    Ok(())
}

pub(super) fn query_qp(w: &mut World, ctx: u64, r: &Req) -> Result<(), Errno> {
    let qpn = qp_of(w, ctx, r.core::<cmds::QueryQp>().qp_handle)?;
    let q = &w.hcas[hca_of(w, ctx)].qps[&qpn];
    let o = IbUverbsQueryQpResp {
        dest: IbUverbsQpDest {
            dgid: q.path.dgid,
            flow_label: q.path.flow_label,
            dlid: q.path.dlid,
            sgid_index: q.path.sgid_index,
            hop_limit: q.path.hop_limit,
            traffic_class: q.path.tclass,
            sl: q.path.sl,
            is_global: u8::from(q.path.is_global),
            port_num: q.path.port,
            ..Default::default()
        },
        // As mlx5_ib_query_qp for a user QP: the receive queue as created (its WQE count, not
        // the depth asked for, so a program is told how many receives the ring holds), and no
        // send capabilities (user space owns the SQ; libmlx5 fills them in itself).
        max_send_wr: 0,
        max_recv_wr: q.rq_wqe_cnt,
        max_send_sge: 0,
        max_recv_sge: q.rq_max_gs,
        max_inline_data: q.cap[4],
        qkey: q.qkey,
        rq_psn: q.rq_psn,
        sq_psn: q.sq_psn,
        dest_qp_num: q.dest_qpn,
        qp_access_flags: q.access,
        pkey_index: q.pkey_index,
        qp_state: q.state,
        cur_qp_state: q.state,
        path_mtu: q.path_mtu,
        // As before: 2 (IB_MIG_ARMED).
        path_mig_state: mig_state::ARMED,
        max_rd_atomic: q.max_rd_atomic,
        max_dest_rd_atomic: q.max_dest_rd_atomic,
        min_rnr_timer: q.min_rnr_timer,
        port_num: q.port,
        timeout: q.timeout,
        retry_cnt: q.retry_cnt,
        rnr_retry: q.rnr_retry,
        sq_sig_all: u8::from(q.sq_sig_all),
        ..Default::default()
    };
    r.respond(&o)
}

pub(super) fn destroy_qp(w: &mut World, ctx: u64, r: &Req) -> Result<(), Errno> {
    let handle = r.core::<cmds::DestroyQp>().qp_handle;
    let qpn = qp_of(w, ctx, handle)?;
    let hca = hca_of(w, ctx);
    super::flow::check_qp_unused(w, hca, qpn)?;
    super::flow::drain_before_destroy(w, hca, qpn);
    if super::xrc::close_shared_qp(w, ctx, handle, qpn) {
        return r.respond(&IbUverbsDestroyQpResp { events_reported: 0 });
    }
    let events_reported =
        super::events::release_async_events(w, ctx, crate::fds::EvObj::Qp(hca, qpn));
    r.respond(&IbUverbsDestroyQpResp { events_reported })?;
    let q = w.hcas[hca].qps.remove(&qpn).ok_or(EINVAL)?;
    super::mcast::forget_qp(w, hca, qpn);
    qp_refs(w, hca, (q.pdn, q.send_cq, q.recv_cq, q.srq), -1);
    if let Some(u) = w
        .contexts
        .get_mut(&ctx)
        .and_then(|cx| cx.bfreg_users.get_mut(q.bfreg as usize))
    {
        *u = u.saturating_sub(1);
    }
    remove_handle(w, ctx, handle);
    Ok(())
}
