//! Address handles: CREATE_AH, DESTROY_AH.

use mlx5_ffi::cmd::cmds;
use mlx5_ffi::mlx5::Mlx5IbCreateAhResp;
use mlx5_ffi::uverbs::IbUverbsCreateAhResp;

use super::{EINVAL, Req, gid_at, hca_of, new_handle, next_handle, next_id, pd_of, pd_use};
use crate::abi::Errno;
use crate::state::{Ah, Obj, World};

/// `response_length` of the RoCE answer: up to and including the destination MAC.
const AH_RESP_LEN: usize = std::mem::offset_of!(Mlx5IbCreateAhResp, reserved);

pub(super) fn create_ah(w: &mut World, ctx: u64, r: &Req) -> Result<(), Errno> {
    let c = r.core::<cmds::CreateAh>();
    let pdn = pd_of(w, ctx, c.pd_handle)?;
    let hca = hca_of(w, ctx);
    let roce = w.hcas[hca].info.is_roce();
    let a = c.attr;
    let (sgid_index, is_global) = (a.grh.sgid_index, a.is_global != 0);
    if a.port_num != 1 {
        return Err(EINVAL);
    }
    let dgid = a.grh.dgid;
    let mut dmac = [0u8; 6];
    if roce {
        // RoCE: the AH must be global, with a valid source GID; the kernel resolves the
        // destination MAC and (with udata) returns it in mlx5_ib_create_ah_resp.
        if !is_global || gid_at(w, hca, u32::from(sgid_index)).is_none() {
            return Err(EINVAL);
        }
        dmac = crate::roce::resolve_dmac(&dgid).ok_or(Errno(libc::EHOSTUNREACH))?;
        if r.drv_out_len > 0 && r.drv_out_len < AH_RESP_LEN {
            return Err(EINVAL);
        }
    } else if sgid_index != 0 && is_global {
        return Err(EINVAL);
    }
    let id = next_id(w, hca);
    r.respond(&IbUverbsCreateAhResp {
        ah_handle: next_handle(w, ctx),
    })?;
    if roce && r.drv_out_len >= AH_RESP_LEN {
        r.respond_drv(&Mlx5IbCreateAhResp {
            response_length: AH_RESP_LEN as u32,
            dmac,
            reserved: [0; 6],
        })?;
    }
    new_handle(w, ctx, Obj::Ah(id));
    w.hcas[hca].ahs.insert(
        id,
        Ah {
            ctx,
            pdn,
            dlid: a.dlid,
            dgid,
            is_global,
            sgid_index,
            dmac,
        },
    );
    pd_use(w, hca, pdn, 1);
    Ok(())
}

pub(super) fn destroy_ah(w: &mut World, ctx: u64, r: &Req) -> Result<(), Errno> {
    let handle = r.core::<cmds::DestroyAh>().ah_handle;
    super::pd_mr::destroy_pd_child(w, ctx, handle, Obj::Ah, |h, id| {
        h.ahs.remove(&id).map(|a| a.pdn)
    })
}
