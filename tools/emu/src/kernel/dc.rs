//! DC: mlx5's dynamically connected transport as `mlx5_ib` creates it. CREATE_QP of type
//! `IB_QPT_DRIVER` carries the kind in the driver data: `MLX5_QP_FLAG_TYPE_DCI` (an
//! initiator, an RC-engine QP with a send queue, whose WQEs name their target) or
//! `MLX5_QP_FLAG_TYPE_DCT` (a target on an SRQ, with its DC access key in the driver data's
//! `access_key`, no queues of its own; its number is reported when it moves to RTR, in
//! `mlx5_ib_modify_qp_resp.dctn`). A DCI's modify is not checked against the transition
//! table (mlx5_ib skips `ib_modify_qp_is_ok` for DCIs); a DCT has its own two steps
//! (`mlx5_ib_modify_dct`). State: `crate::xrc_dc`.

use mlx5_ffi::cmd::cmds;
use mlx5_ffi::mlx5::{
    MLX5_QP_FLAG_DCI_STREAM, MLX5_QP_FLAG_SCATTER_CQE, MLX5_QP_FLAG_TYPE_DCI,
    MLX5_QP_FLAG_TYPE_DCT, Mlx5IbCreateQpResp, Mlx5IbModifyQpResp,
};
use mlx5_ffi::uverbs::{
    IbUverbsCreateQpResp, IbUverbsExCreateQp, IbUverbsExCreateQpResp, IbUverbsExModifyQp,
    IbUverbsExModifyQpResp, access, mtu, qp_attr,
};
use mlx5_ffi::xrc_dc::IBV_QPT_DRIVER;

use super::{
    EINVAL, Req, bump, caps, cq_of, cq_use, hca_of, new_handle, next_handle, next_id, pd_of,
    pd_use, srq_of,
};
use crate::abi::Errno;
use crate::state::{Obj, Qp, World, qps, qpt};
use crate::xrc_dc::{QpExt, QpKind};

/// DCI streams the HCA offers (`mlx5_ib_query_device_resp.dci_streams_caps`): up to 2^4
/// stream channels, 2^4 of them errored at once. The device runs a DCI's streams in WQE
/// order (one valid schedule of independent streams; docs/xrc-dc.md).
pub(super) const DCI_STREAMS_CAPS: mlx5_ffi::mlx5::Mlx5IbDciStreamsCaps =
    mlx5_ffi::mlx5::Mlx5IbDciStreamsCaps {
        max_log_num_concurent: 4,
        max_log_num_errored: 4,
    };

/// Driver-data flags a QP of `kind` may carry beyond the common ones.
pub(super) fn driver_flags(kind: &QpKind) -> u32 {
    match kind {
        QpKind::Dci => MLX5_QP_FLAG_TYPE_DCI | MLX5_QP_FLAG_DCI_STREAM,
        _ => 0,
    }
}

/// What CREATE_QP makes of `IB_QPT_DRIVER`: a DCI goes on as an RC-engine QP; a DCT is
/// made here (`Ok(None)`); a driver QP that is neither is EINVAL (`create_driver_qp`).
pub(super) fn create_qp_dc(
    w: &mut World,
    ctx: u64,
    r: &Req,
    c: &mut IbUverbsExCreateQp,
    kind: QpKind,
) -> Result<Option<QpKind>, Errno> {
    if c.qp_type != IBV_QPT_DRIVER || !caps::FEATURES.dc {
        // Without the feature the common path refuses the driver type (EOPNOTSUPP).
        return Ok(Some(kind));
    }
    let d = r.drv::<cmds::CreateQp>()?;
    let dci = d.flags & MLX5_QP_FLAG_TYPE_DCI != 0;
    let dct = d.flags & MLX5_QP_FLAG_TYPE_DCT != 0;
    match (dci, dct) {
        (true, false) => {
            c.qp_type = qpt::RC;
            Ok(Some(QpKind::Dci))
        }
        (false, true) => {
            create_dct(w, ctx, r, c, d.flags, d.uidx, d.sq_buf_addr)?;
            Ok(None)
        }
        _ => Err(EINVAL),
    }
}

/// A DC target (`create_dct`): it needs a PD, a receive CQ and an SRQ, and only the
/// scatter-to-CQE flag besides its type; no buffers.
fn create_dct(
    w: &mut World,
    ctx: u64,
    r: &Req,
    c: &IbUverbsExCreateQp,
    flags: u32,
    uidx: u32,
    key: u64,
) -> Result<(), Errno> {
    if flags & !(MLX5_QP_FLAG_TYPE_DCT | MLX5_QP_FLAG_SCATTER_CQE) != 0 || c.is_srq == 0 {
        return Err(EINVAL);
    }
    let pdn = pd_of(w, ctx, c.pd_handle)?;
    let recv_cq = cq_of(w, ctx, c.recv_cq_handle)?;
    let send_cq = cq_of(w, ctx, c.send_cq_handle).unwrap_or(recv_cq);
    let srqn = srq_of(w, ctx, c.srq_handle)?;
    let cqe_v1 = w.contexts[&ctx].cqe_version != 0;
    if cqe_v1 && uidx >= 0xff_ffff {
        return Err(EINVAL);
    }
    let hca = hca_of(w, ctx);
    let qpn = next_id(w, hca);
    // The DCT has no number before RTR: the create response says 0.
    let o = IbUverbsExCreateQpResp {
        base: IbUverbsCreateQpResp {
            qp_handle: next_handle(w, ctx),
            qpn: 0,
            ..Default::default()
        },
        comp_mask: 0,
        response_length: Req::len_for(r.out_len, size_of::<IbUverbsExCreateQpResp>()),
    };
    if r.ex {
        r.respond(&o)?;
    } else {
        r.respond(&o.base)?;
    }
    r.respond_drv(&Mlx5IbCreateQpResp::default())?;
    new_handle(w, ctx, Obj::Qp(qpn));
    pd_use(w, hca, pdn, 1);
    cq_use(w, hca, send_cq, 1);
    cq_use(w, hca, recv_cq, 1);
    bump(w.hcas[hca].srqs.get_mut(&srqn).map(|s| &mut s.users), 1);
    w.hcas[hca].qps.insert(
        qpn,
        Qp {
            ctx,
            qpn,
            qp_type: qpt::RC,
            state: qps::RESET,
            pdn,
            send_cq,
            recv_cq,
            srq: Some(srqn),
            user_handle: c.user_handle,
            uidx: if cqe_v1 { uidx } else { 0xff_ffff },
            bfreg: u32::MAX,
            scatter_cqe: flags & MLX5_QP_FLAG_SCATTER_CQE != 0,
            port: 1,
            path_mtu: mtu::MTU_4096,
            hpc: QpExt {
                kind: QpKind::Dct { key },
                ..Default::default()
            },
            ..Default::default()
        },
    );
    Ok(())
}

/// MODIFY_QP of a DCT (`mlx5_ib_modify_dct`): RESET to INIT needs PKEY_INDEX, PORT and
/// ACCESS_FLAGS; INIT to RTR needs MIN_RNR_TIMER, AV and PATH_MTU and answers the DCT
/// number in the driver response; to RESET or ERR always; anything else EINVAL.
pub(super) fn modify_dct(
    w: &mut World,
    ctx: u64,
    r: &Req,
    qpn: u32,
    ex: &IbUverbsExModifyQp,
) -> Result<(), Errno> {
    use qp_attr::*;
    let c = &ex.base;
    let m = c.attr_mask;
    let hca = hca_of(w, ctx);
    let q = w.hcas[hca].qps.get(&qpn).ok_or(EINVAL)?;
    let cur = q.state;
    let next = if m & STATE != 0 { c.qp_state } else { cur };
    let allowed = match (cur, next) {
        (qps::RESET, qps::INIT) => {
            let req = PKEY_INDEX | PORT | ACCESS_FLAGS;
            m & req == req
        }
        (qps::INIT, qps::RTR) => {
            let req = MIN_RNR_TIMER | AV | PATH_MTU;
            m & req == req
                && (mtu::MTU_256..=mtu::MTU_4096).contains(&c.path_mtu)
                && c.min_rnr_timer <= 31
        }
        (_, qps::RESET) | (_, qps::ERR) => true,
        _ => false,
    };
    let dct_access = access::LOCAL_WRITE
        | access::REMOTE_WRITE
        | access::REMOTE_READ
        | access::REMOTE_ATOMIC
        | access::RELAXED_ORDERING;
    if !allowed
        || m & PORT != 0 && c.port_num != 1
        || m & PKEY_INDEX != 0 && c.pkey_index >= 1
        || m & ACCESS_FLAGS != 0 && c.qp_access_flags & !dct_access != 0
    {
        return Err(EINVAL);
    }
    let to_rtr = (cur, next) == (qps::INIT, qps::RTR);
    if to_rtr && r.drv_out_len < std::mem::offset_of!(Mlx5IbModifyQpResp, dctn) + 4 {
        // libmlx5 always asks for the DCT number; without room for it the kernel fails.
        return Err(EINVAL);
    }
    let q = w.hcas[hca].qps.get_mut(&qpn).ok_or(EINVAL)?;
    if m & ACCESS_FLAGS != 0 {
        q.access = c.qp_access_flags;
    }
    if m & PATH_MTU != 0 {
        q.path_mtu = c.path_mtu;
    }
    if m & MIN_RNR_TIMER != 0 {
        q.min_rnr_timer = c.min_rnr_timer;
    }
    if next == qps::RESET {
        q.hpc.streams.clear();
    }
    q.state = next;
    if to_rtr || (r.ex && r.drv_out_len > 0) {
        r.respond_drv(&Mlx5IbModifyQpResp {
            response_length: Req::len_for(r.drv_out_len, size_of::<Mlx5IbModifyQpResp>()),
            dctn: if to_rtr { qpn } else { 0 },
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
