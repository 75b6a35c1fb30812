//! Multicast: ATTACH_MCAST / DETACH_MCAST (`ib_uverbs_attach_mcast`, what
//! `ibv_attach_mcast` and librdmacm's `rdma_join_multicast` issue after a MULTICAST_JOIN)
//! and the fan-out of a UD SEND to a group to every QP attached to it.
//!
//! The errnos are the kernel's (`ib_attach_mcast`, `ib_uverbs_attach_mcast`): a GID that is
//! not a multicast GID (first byte 0xff), a QP that is not UD, or on an InfiniBand port a
//! LID outside 0xc000..=0xfffe is `EINVAL`; attaching twice is accepted once (uverbs keeps
//! one entry); detaching what is not attached is `EINVAL`. A destroyed QP leaves its groups.
//!
//! Delivery: a UD packet whose destination QP is 0xFFFFFF and whose GRH names a multicast
//! GID is copied to every QP of this emulator attached to that GID (on any of its HCAs),
//! except the sending QP itself; each copy then travels the fabric as a unicast packet
//! would (faults, pcap). Groups do not span processes: the UDP fabric carries no multicast.
//! The groups are in the world (`model/mcast.rs`); the fan-out is the device's (`device/wire.rs`).

use mlx5_ffi::ucma::{AttachMcast, DetachMcast};

use super::{EINVAL, Req, hca_of, qp_of};
use crate::abi::Errno;
use crate::state::World;

fn checked(
    w: &World,
    ctx: u64,
    gid: [u8; 16],
    handle: u32,
    mlid: u16,
) -> Result<(usize, u32), Errno> {
    let qpn = qp_of(w, ctx, handle)?;
    let hca = hca_of(w, ctx);
    let q = w.hcas[hca].qps.get(&qpn).ok_or(EINVAL)?;
    if gid[0] != 0xff || q.qp_type != mlx5_ffi::uverbs::qp_type::UD {
        return Err(EINVAL);
    }
    if !w.hcas[hca].info.is_roce() && !(0xc000..=0xfffe).contains(&mlid) {
        return Err(EINVAL);
    }
    Ok((hca, qpn))
}

pub(super) fn attach(w: &mut World, ctx: u64, r: &Req) -> Result<(), Errno> {
    let c = r.core::<AttachMcast>();
    let (hca, qpn) = checked(w, ctx, c.gid, c.qp_handle, c.mlid)?;
    let qps = w.mcast.entry((hca, c.gid)).or_default();
    if !qps.contains(&qpn) {
        qps.push(qpn);
    }
    Ok(())
}

pub(super) fn detach(w: &mut World, ctx: u64, r: &Req) -> Result<(), Errno> {
    let c = r.core::<DetachMcast>();
    let qpn = qp_of(w, ctx, c.qp_handle)?;
    let hca = hca_of(w, ctx);
    let key = (hca, c.gid);
    let qps = w.mcast.get_mut(&key).ok_or(EINVAL)?;
    let at = qps.iter().position(|&q| q == qpn).ok_or(EINVAL)?;
    qps.remove(at);
    if qps.is_empty() {
        w.mcast.remove(&key);
    }
    Ok(())
}

/// QP `qpn` of `hca` is destroyed: it leaves every group.
pub(super) fn forget_qp(w: &mut World, hca: usize, qpn: u32) {
    w.mcast.retain(|&(h, _), qps| {
        if h == hca {
            qps.retain(|&q| q != qpn);
        }
        !qps.is_empty()
    });
}
