//! Completion queues: CREATE_CQ (legacy and extended), DESTROY_CQ.

use mlx5_ffi::cmd::cmds;
use mlx5_ffi::mlx5::{
    MLX5_IB_CREATE_CQ_FLAGS_CQE_128B_PAD, MLX5_IB_CREATE_CQ_FLAGS_REAL_TIME_TS,
    MLX5_IB_CREATE_CQ_FLAGS_UAR_PAGE_INDEX, Mlx5IbCreateCq, Mlx5IbCreateCqResp,
};
use mlx5_ffi::uverbs::{
    IB_UVERBS_CQ_FLAGS_IGNORE_OVERRUN, IB_UVERBS_CQ_FLAGS_TIMESTAMP_COMPLETION,
    IbUverbsCreateCqResp, IbUverbsDestroyCqResp, IbUverbsExCreateCq, IbUverbsExCreateCqResp,
};

use super::events::{comp_channel_of, release_closed_channels};
use super::{
    EBUSY, EFAULT, EINVAL, EOPNOTSUPP, Req, caps, cq_of, hca_of, new_handle, next_handle, next_id,
    pin_queue, remove_handle,
};
use crate::abi::Errno;
use crate::state::{Cq, Obj, World};

/// The driver data up to `uar_page_index` is what every libmlx5 sends; shorter is EFAULT.
const MIN_DRV: usize = std::mem::offset_of!(Mlx5IbCreateCq, uar_page_index);

pub(super) fn create_cq(w: &mut World, ctx: u64, r: &Req) -> Result<(), Errno> {
    // Both framings as the extended request (the legacy one has no comp_mask/flags).
    let c = if r.ex {
        r.core::<cmds::ExCreateCq>()
    } else {
        let l = r.core::<cmds::CreateCq>();
        IbUverbsExCreateCq {
            user_handle: l.user_handle,
            cqe: l.cqe,
            comp_vector: l.comp_vector,
            comp_channel: l.comp_channel,
            ..Default::default()
        }
    };
    if r.ex {
        if c.comp_mask != 0 {
            return Err(EINVAL);
        }
        if c.flags & !(IB_UVERBS_CQ_FLAGS_TIMESTAMP_COMPLETION | IB_UVERBS_CQ_FLAGS_IGNORE_OVERRUN)
            != 0
        {
            return Err(EOPNOTSUPP);
        }
    }
    if c.cqe == 0 || c.cqe > caps::MAX_CQE || c.comp_vector >= 1 {
        return Err(EINVAL);
    }
    let channel = if c.comp_channel >= 0 {
        release_closed_channels(w, ctx);
        Some(comp_channel_of(w, ctx, c.comp_channel)?)
    } else {
        None
    };
    if r.drv_in.len() < MIN_DRV {
        return Err(EFAULT);
    }
    let d = r.drv::<cmds::CreateCq>()?;
    let known = MLX5_IB_CREATE_CQ_FLAGS_CQE_128B_PAD
        | MLX5_IB_CREATE_CQ_FLAGS_UAR_PAGE_INDEX
        | MLX5_IB_CREATE_CQ_FLAGS_REAL_TIME_TS;
    if d.flags & !known != 0 || d.reserved0 != 0 || d.reserved1 != 0 {
        return Err(EINVAL);
    }
    let cx = &w.contexts[&ctx];
    if d.flags & MLX5_IB_CREATE_CQ_FLAGS_UAR_PAGE_INDEX != 0 {
        // UAR_PAGE_INDEX must name a UAR object of this context.
        if !cx.dyn_pages.contains_key(&u32::from(d.uar_page_index)) {
            return Err(EINVAL);
        }
    } else if cx.dyn_uar {
        // A dynamic-UAR context has no default UAR for CQs.
        return Err(EINVAL);
    }
    if d.cqe_size != 64 && d.cqe_size != 128 {
        return Err(EINVAL);
    }
    // CQE compression is not implemented; mlx5_ib refuses it where the device lacks it.
    if d.cqe_comp_en != 0 {
        return Err(EOPNOTSUPP);
    }
    let ncqe = (c.cqe + 1).next_power_of_two();
    pin_queue(
        d.buf_addr,
        u64::from(ncqe) * u64::from(d.cqe_size),
        d.db_addr,
        8,
        8,
    )?;
    let hca = hca_of(w, ctx);
    let cqn = next_id(w, hca);
    let o = IbUverbsExCreateCqResp {
        base: IbUverbsCreateCqResp {
            cq_handle: next_handle(w, ctx),
            cqe: ncqe - 1,
        },
        comp_mask: 0,
        response_length: Req::len_for(r.out_len, size_of::<IbUverbsExCreateCqResp>()),
    };
    if r.ex {
        r.respond(&o)?;
    } else {
        r.respond(&o.base)?;
    }
    r.respond_drv(&Mlx5IbCreateCqResp { cqn, reserved: 0 })?;
    // The arm doorbell record starts as "never armed" (device/fetch.rs, `arms_from_records`:
    // the device recovers an arm whose doorbell a later arm on the same UAR register
    // overwrote). Software only writes this word; a record that cannot be written keeps 0,
    // which only loses that recovery for the CQ's first arm.
    let _ = crate::mem::write(
        d.db_addr.wrapping_add(4),
        &crate::state::ARM_DBR_UNSET.to_be_bytes(),
    );
    new_handle(w, ctx, Obj::Cq(cqn));
    w.hcas[hca].cqs.insert(
        cqn,
        Cq {
            ctx,
            user_handle: c.user_handle,
            buf: d.buf_addr,
            db: d.db_addr,
            ncqe,
            cqe_size: d.cqe_size,
            pi: 0,
            ci_seen: 0,
            channel,
            armed: None,
            armed_sn: 0,
            last_fired_sn: None,
            arm_dbr_seen: crate::state::ARM_DBR_UNSET,
            arm_dbr_unrung: false,
            ignore_overrun: c.flags & IB_UVERBS_CQ_FLAGS_IGNORE_OVERRUN != 0,
            in_error: false,
            users: 0,
        },
    );
    Ok(())
}

pub(super) fn destroy_cq(w: &mut World, ctx: u64, r: &Req) -> Result<(), Errno> {
    let handle = r.core::<cmds::DestroyCq>().cq_handle;
    let cqn = cq_of(w, ctx, handle)?;
    let hca = hca_of(w, ctx);
    let cq = &w.hcas[hca].cqs[&cqn];
    if cq.users > 0 {
        return Err(EBUSY);
    }
    let channel = cq.channel;
    let obj = crate::fds::EvObj::Cq(hca, cqn);
    let comp_events_reported = super::events::release_events(w, channel, obj);
    let async_events_reported = super::events::release_async_events(w, ctx, obj);
    r.respond(&IbUverbsDestroyCqResp {
        comp_events_reported,
        async_events_reported,
    })?;
    w.hcas[hca].cqs.remove(&cqn);
    remove_handle(w, ctx, handle);
    release_closed_channels(w, ctx);
    Ok(())
}
