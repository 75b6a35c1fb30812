//! Shared receive queues: CREATE_SRQ, MODIFY_SRQ, QUERY_SRQ, DESTROY_SRQ.

use mlx5_ffi::cmd::cmds;
use mlx5_ffi::mlx5::{MLX5_SRQ_FLAG_SIGNATURE, Mlx5IbCreateSrq, Mlx5IbCreateSrqResp};
use mlx5_ffi::uverbs::{
    IB_SRQ_LIMIT, IB_SRQ_MAX_WR, IbUverbsCreateSrqResp, IbUverbsDestroySrqResp,
    IbUverbsQuerySrqResp,
};

use super::{
    EBUSY, EINVAL, Req, caps, hca_of, new_handle, next_handle, next_id, pd_of, pd_use, pin_queue,
    remove_handle, srq_of,
};
use crate::abi::Errno;
use crate::state::{Obj, Srq, World};

/// Driver data up to `uidx` is the minimum libmlx5 sends.
const MIN_DRV: usize = std::mem::offset_of!(Mlx5IbCreateSrq, uidx);

pub(super) fn create_srq(w: &mut World, ctx: u64, r: &Req) -> Result<(), Errno> {
    let c = r.core::<cmds::CreateSrq>();
    let pdn = pd_of(w, ctx, c.pd_handle)?;
    let (max_wr, max_sge, limit) = (c.max_wr, c.max_sge, c.srq_limit);
    if max_wr == 0 || max_wr > caps::MAX_SRQ_WR || max_sge > caps::MAX_SRQ_SGE || limit > max_wr {
        return Err(EINVAL);
    }
    if r.drv_in.len() < MIN_DRV {
        return Err(EINVAL);
    }
    let d = r.drv::<cmds::CreateSrq>()?;
    if d.flags & !MLX5_SRQ_FLAG_SIGNATURE != 0 || d.reserved0 != 0 || d.reserved1 != 0 {
        return Err(EINVAL);
    }
    let wqe_cnt = (max_wr + 1).next_power_of_two();
    let stride = (16 + 16 * max_sge.max(1)).next_power_of_two().max(32);
    if stride > caps::MAX_RQ_DESC {
        return Err(EINVAL);
    }
    let eff_sge = (stride - 16) / 16;
    pin_queue(
        d.buf_addr,
        u64::from(wqe_cnt) * u64::from(stride),
        d.db_addr,
        4,
        4,
    )?;
    let hca = hca_of(w, ctx);
    let srqn = next_id(w, hca);
    r.respond(&IbUverbsCreateSrqResp {
        srq_handle: next_handle(w, ctx),
        max_wr: wqe_cnt - 1,
        max_sge: eff_sge,
        srqn,
    })?;
    r.respond_drv(&Mlx5IbCreateSrqResp { srqn, reserved: 0 })?;
    new_handle(w, ctx, Obj::Srq(srqn));
    pd_use(w, hca, pdn, 1);
    w.hcas[hca].srqs.insert(
        srqn,
        Srq {
            ctx,
            pdn,
            user_handle: c.user_handle,
            buf: d.buf_addr,
            db: d.db_addr,
            wqe_cnt,
            stride,
            max_wr: wqe_cnt - 1,
            max_sge: eff_sge,
            limit,
            consumed: 0,
            head: 0,
            users: 0,
        },
    );
    Ok(())
}

pub(super) fn modify_srq(w: &mut World, ctx: u64, r: &Req) -> Result<(), Errno> {
    let c = r.core::<cmds::ModifySrq>();
    let srqn = srq_of(w, ctx, c.srq_handle)?;
    let m = c.attr_mask;
    let hca = hca_of(w, ctx);
    let s = w.hcas[hca].srqs.get_mut(&srqn).ok_or(EINVAL)?;
    if m & !(IB_SRQ_MAX_WR | IB_SRQ_LIMIT) != 0 || m & IB_SRQ_MAX_WR != 0 {
        // IB_SRQ_MAX_WR (resize) is not supported by mlx5.
        return Err(EINVAL);
    }
    if m & IB_SRQ_LIMIT != 0 {
        if c.srq_limit > s.max_wr {
            return Err(EINVAL);
        }
        s.limit = c.srq_limit;
    }
    Ok(())
}

pub(super) fn query_srq(w: &mut World, ctx: u64, r: &Req) -> Result<(), Errno> {
    let srqn = srq_of(w, ctx, r.core::<cmds::QuerySrq>().srq_handle)?;
    let s = &w.hcas[hca_of(w, ctx)].srqs[&srqn];
    r.respond(&IbUverbsQuerySrqResp {
        max_wr: s.max_wr,
        max_sge: s.max_sge,
        srq_limit: s.limit,
        reserved: 0,
    })
}

pub(super) fn destroy_srq(w: &mut World, ctx: u64, r: &Req) -> Result<(), Errno> {
    let handle = r.core::<cmds::DestroySrq>().srq_handle;
    let srqn = srq_of(w, ctx, handle)?;
    let hca = hca_of(w, ctx);
    if w.hcas[hca].srqs[&srqn].users > 0 {
        return Err(EBUSY);
    }
    let events_reported =
        super::events::release_async_events(w, ctx, crate::fds::EvObj::Srq(hca, srqn));
    r.respond(&IbUverbsDestroySrqResp { events_reported })?;
    if let Some(s) = w.hcas[hca].srqs.remove(&srqn) {
        pd_use(w, hca, s.pdn, -1);
    }
    super::xrc::srq_destroyed(w, hca, srqn);
    remove_handle(w, ctx, handle);
    Ok(())
}
