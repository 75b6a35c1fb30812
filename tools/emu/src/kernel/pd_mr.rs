//! Protection domains and memory regions: ALLOC_PD, DEALLOC_PD, REG_MR, DEREG_MR.

use mlx5_ffi::cmd::cmds;
use mlx5_ffi::mlx5::Mlx5IbAllocPdResp;
use mlx5_ffi::uverbs::{IbUverbsAllocPdResp, IbUverbsRegMrResp};

use mlx5_ffi::ioctl::IB_UVERBS_ACCESS_OPTIONAL_RANGE;

use super::{
    EBUSY, EINVAL, EOPNOTSUPP, Req, handle_of, hca_of, new_handle, next_handle, next_id, pd_of,
    pd_use, remove_handle,
};
use crate::abi::Errno;
use crate::mem;
use crate::state::{Hca, Mr, Obj, Pd, World, access};
use crate::uar::PAGE;

pub(super) fn alloc_pd(w: &mut World, ctx: u64, r: &Req) -> Result<(), Errno> {
    let hca = hca_of(w, ctx);
    let pdn = next_id(w, hca);
    r.respond(&IbUverbsAllocPdResp {
        pd_handle: next_handle(w, ctx),
    })?;
    r.respond_drv(&Mlx5IbAllocPdResp { pdn })?;
    new_handle(w, ctx, Obj::Pd(pdn));
    w.hcas[hca].pds.insert(pdn, Pd { ctx, users: 0 });
    Ok(())
}

pub(super) fn dealloc_pd(w: &mut World, ctx: u64, r: &Req) -> Result<(), Errno> {
    let handle = r.core::<cmds::DeallocPd>().pd_handle;
    let pdn = pd_of(w, ctx, handle)?;
    let hca = hca_of(w, ctx);
    if w.hcas[hca].pds.get(&pdn).is_some_and(|p| p.users > 0) {
        return Err(EBUSY);
    }
    w.hcas[hca].pds.remove(&pdn);
    remove_handle(w, ctx, handle);
    Ok(())
}

pub(super) fn reg_mr(w: &mut World, ctx: u64, r: &Req) -> Result<(), Errno> {
    let c = r.core::<cmds::RegMr>();
    let (start, length, iova, acc) = (c.start, c.length, c.hca_va, c.access_flags);
    let pdn = pd_of(w, ctx, c.pd_handle)?;
    // ib_check_mr_access: remote write/atomic need local write; only the flags up to
    // HUGETLB and the optional range exist (unknown optional flags are ignored); on-demand
    // paging needs the device's ODP capability, which this HCA does not report.
    if acc & (access::REMOTE_WRITE | access::REMOTE_ATOMIC) != 0 && acc & access::LOCAL_WRITE == 0 {
        return Err(EINVAL);
    }
    let supported = ((access::HUGETLB << 1) - 1) | IB_UVERBS_ACCESS_OPTIONAL_RANGE;
    if acc & !supported != 0 {
        return Err(EINVAL);
    }
    if acc & access::ON_DEMAND != 0 {
        return Err(EOPNOTSUPP);
    }
    if (start ^ iova) & (PAGE as u64 - 1) != 0 || length == 0 || start.checked_add(length).is_none()
    {
        return Err(EINVAL);
    }
    mem::probe(start, length)?;
    let hca = hca_of(w, ctx);
    let h = &mut w.hcas[hca];
    let idx = h.next_key;
    h.next_key = (h.next_key + 1) & 0xff_ffff;
    let key = (idx << 8) | ((idx.wrapping_mul(0x5b) + 0x11) & 0xff);
    r.respond(&IbUverbsRegMrResp {
        mr_handle: next_handle(w, ctx),
        lkey: key,
        rkey: key,
    })?;
    new_handle(w, ctx, Obj::Mr(idx));
    w.hcas[hca].mrs.insert(
        idx,
        Mr {
            ctx,
            pdn,
            start,
            length,
            iova,
            access: acc,
            key,
            indirect: None,
        },
    );
    pd_use(w, hca, pdn, 1);
    Ok(())
}

pub(super) fn dereg_mr(w: &mut World, ctx: u64, r: &Req) -> Result<(), Errno> {
    let handle = r.core::<cmds::DeregMr>().mr_handle;
    destroy_pd_child(w, ctx, handle, Obj::Mr, |h, id| {
        h.mrs.remove(&id).map(|m| m.pdn)
    })
}

/// Destroy an object that only holds a reference on its PD (MR, AH): `remove` takes it out
/// of the HCA and returns its PD number.
pub(super) fn destroy_pd_child(
    w: &mut World,
    ctx: u64,
    handle: u32,
    kind: fn(u32) -> Obj,
    remove: impl FnOnce(&mut Hca, u32) -> Option<u32>,
) -> Result<(), Errno> {
    let id = handle_of(w, ctx, handle, kind)?;
    let hca = hca_of(w, ctx);
    if let Some(pdn) = remove(&mut w.hcas[hca], id) {
        pd_use(w, hca, pdn, -1);
    }
    remove_handle(w, ctx, handle);
    Ok(())
}
