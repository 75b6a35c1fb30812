//! XRC: OPEN_XRCD / CLOSE_XRCD (domains shared through a file, as the kernel shares them by
//! inode), CREATE_XSRQ (XRC SRQs: an SRQ with a domain and a CQ), XRC initiator and target
//! QPs (CREATE_QP of `IB_QPT_XRC_INI` / `IB_QPT_XRC_TGT`), OPEN_QP (a target QP opened by
//! number from another context of the domain), and the kernel's transition table for the
//! two XRC types. State: `crate::xrc_dc`.

use mlx5_ffi::cmd::{Command, cmds};
use mlx5_ffi::mlx5::{MLX5_QP_FLAG_UAR_PAGE_INDEX, Mlx5IbCreateQpResp};
use mlx5_ffi::uverbs::{
    IbUverbsCreateQpResp, IbUverbsCreateSrq, IbUverbsExCreateQp, IbUverbsExCreateQpResp, qp_attr,
};
use mlx5_ffi::xrc_dc::{IbUverbsCloseXrcd, IbUverbsOpenXrcdResp};
use zerocopy::IntoBytes;

use super::{
    EBUSY, EINVAL, EOPNOTSUPP, Req, caps, cq_of, cq_use, handle_of, hca_of, lookup, new_handle,
    next_handle, next_id, remove_handle,
};
use crate::abi::Errno;
use crate::state::{Obj, Qp, World, qps, qpt};
use crate::xrc_dc::{QpExt, QpKind, XrcSrq, Xrcd};

/// `IB_UVERBS_SRQT_*`.
const SRQT_BASIC: u32 = 0;
const SRQT_XRC: u32 = 1;
const SRQT_TM: u32 = 2;

fn xrcd_of(w: &World, ctx: u64, handle: u32) -> Result<u32, Errno> {
    handle_of(w, ctx, handle, Obj::Xrcd)
}

/// The (device, inode) of the caller's file descriptor `fd`; EBADF if it is not open.
fn inode_of(fd: i32) -> Result<(u64, u64), Errno> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat writes at most one `struct stat` into the buffer it is given, which is
    // exactly that size; any fd value is safe to pass (a bad one is EBADF).
    let rc = unsafe { libc::fstat(fd, st.as_mut_ptr()) };
    if rc != 0 {
        return Err(Errno(libc::EBADF));
    }
    // SAFETY: fstat returned 0, so it initialised the whole struct.
    let st = unsafe { st.assume_init() };
    Ok((st.st_dev, st.st_ino))
}

/// OPEN_XRCD (`ib_uverbs_open_xrcd`): `fd` -1 makes a domain of its own; otherwise the
/// domain of the file's inode is opened, created with `O_CREAT` (EAGAIN without it when
/// there is none yet), refused with `O_EXCL` when it exists (EINVAL).
pub(super) fn open_xrcd(w: &mut World, ctx: u64, r: &Req) -> Result<(), Errno> {
    let c = r.core::<cmds::OpenXrcd>();
    if !caps::FEATURES.xrc {
        // mlx5_ib_alloc_xrcd on an HCA without the XRC capability.
        return Err(EOPNOTSUPP);
    }
    let hca = hca_of(w, ctx);
    let inode = if c.fd as i32 == -1 {
        None
    } else {
        Some(inode_of(c.fd as i32)?)
    };
    let found = inode.and_then(|i| {
        w.hcas[hca]
            .hpc
            .xrcds
            .iter()
            .find(|(_, x)| x.inode == Some(i))
            .map(|(&n, _)| n)
    });
    let create = c.oflags & libc::O_CREAT as u32 != 0;
    let excl = c.oflags & libc::O_EXCL as u32 != 0;
    if inode.is_some() && found.is_none() && !create {
        return Err(Errno(libc::EAGAIN));
    }
    if found.is_some() && excl {
        return Err(EINVAL);
    }
    r.respond(&IbUverbsOpenXrcdResp {
        xrcd_handle: next_handle(w, ctx),
    })?;
    let x = &mut w.hcas[hca].hpc;
    let n = match found {
        Some(n) => n,
        None => {
            x.next_xrcdn += 1;
            x.xrcds.insert(x.next_xrcdn, Xrcd { inode, opens: 0 });
            x.next_xrcdn
        }
    };
    if let Some(d) = x.xrcds.get_mut(&n) {
        d.opens += 1;
    }
    new_handle(w, ctx, Obj::Xrcd(n));
    Ok(())
}

/// Objects of context `ctx` that use domain `xrcdn` (its XRC SRQs and target QPs).
fn users_in(w: &World, hca: usize, ctx: u64, xrcdn: u32) -> usize {
    let h = &w.hcas[hca];
    let srqs = h
        .hpc
        .xrc_srqs
        .values()
        .filter(|s| s.xrcdn == xrcdn && s.ctx == ctx)
        .count();
    let qps = h
        .qps
        .values()
        .filter(|q| q.ctx == ctx && q.hpc.kind == QpKind::XrcTgt { xrcdn })
        .count();
    srqs + qps
}

/// CLOSE_XRCD: EBUSY while the context's last handle of the domain still has XRC SRQs or
/// target QPs on it; the domain goes away with its last open handle.
pub(super) fn close_xrcd(w: &mut World, ctx: u64, r: &Req) -> Result<(), Errno> {
    let c: IbUverbsCloseXrcd = r.core::<cmds::CloseXrcd>();
    let n = xrcd_of(w, ctx, c.xrcd_handle)?;
    let hca = hca_of(w, ctx);
    let handles = w.contexts[&ctx]
        .handles
        .values()
        .filter(|o| **o == Obj::Xrcd(n))
        .count();
    if handles == 1 && users_in(w, hca, ctx, n) > 0 {
        return Err(EBUSY);
    }
    remove_handle(w, ctx, c.xrcd_handle);
    drop_open(w, hca, n);
    Ok(())
}

fn drop_open(w: &mut World, hca: usize, n: u32) {
    let x = &mut w.hcas[hca].hpc;
    if let Some(d) = x.xrcds.get_mut(&n) {
        d.opens = d.opens.saturating_sub(1);
        if d.opens == 0 {
            x.xrcds.remove(&n);
        }
    }
}

/// CREATE_XSRQ: a basic SRQ, or an XRC SRQ (in a domain, completing to a CQ). Tag-matching
/// SRQs: EOPNOTSUPP (the HCA has no tag matching).
pub(super) fn create_xsrq(w: &mut World, ctx: u64, r: &Req) -> Result<(), Errno> {
    let c = r.core::<cmds::CreateXsrq>();
    let xrc = match c.srq_type {
        SRQT_BASIC => None,
        SRQT_XRC if !caps::FEATURES.xrc => return Err(EOPNOTSUPP),
        SRQT_XRC => Some((xrcd_of(w, ctx, c.xrcd_handle)?, cq_of(w, ctx, c.cq_handle)?)),
        SRQT_TM => return Err(EOPNOTSUPP),
        _ => return Err(EINVAL),
    };
    let basic = IbUverbsCreateSrq {
        response: c.response,
        user_handle: c.user_handle,
        pd_handle: c.pd_handle,
        max_wr: c.max_wr,
        max_sge: c.max_sge,
        srq_limit: c.srq_limit,
    };
    let req = Req {
        command: cmds::CreateSrq::ID,
        ex: false,
        core: basic.as_bytes().to_vec(),
        drv_in: r.drv_in.clone(),
        out: r.out,
        out_len: r.out_len,
        drv_out: r.drv_out,
        drv_out_len: r.drv_out_len,
    };
    let handle = next_handle(w, ctx);
    super::srq::create_srq(w, ctx, &req)?;
    let Some((xrcdn, cqn)) = xrc else {
        return Ok(());
    };
    let Ok(Obj::Srq(srqn)) = lookup(w, ctx, handle) else {
        return Ok(());
    };
    let uidx = req
        .drv::<cmds::CreateSrq>()
        .map(|d| d.uidx)
        .unwrap_or(0xff_ffff);
    let hca = hca_of(w, ctx);
    cq_use(w, hca, cqn, 1);
    w.hcas[hca].hpc.xrc_srqs.insert(
        srqn,
        XrcSrq {
            xrcdn,
            cqn,
            uidx,
            ctx,
        },
    );
    Ok(())
}

/// After DESTROY_SRQ of `srqn`: drop its XRC part (and its CQ reference).
pub(super) fn srq_destroyed(w: &mut World, hca: usize, srqn: u32) {
    if let Some(x) = w.hcas[hca].hpc.xrc_srqs.remove(&srqn) {
        cq_use(w, hca, x.cqn, -1);
    }
}

/// What CREATE_QP makes of an XRC type, before the common path runs: an initiator is an
/// RC-engine QP with a send queue only (its receive CQ, SRQ and receive capabilities are
/// ignored, as `ib_uverbs_create_qp` ignores them); a target is created here, whole
/// (`Ok(None)`: done).
pub(super) fn create_qp_xrc(
    w: &mut World,
    ctx: u64,
    r: &Req,
    c: &mut IbUverbsExCreateQp,
) -> Result<Option<QpKind>, Errno> {
    match c.qp_type {
        // Without the feature: the common path refuses the type (EOPNOTSUPP).
        qpt::XRC_INI | qpt::XRC_TGT if !caps::FEATURES.xrc => Ok(Some(QpKind::Plain)),
        qpt::XRC_INI => {
            c.recv_cq_handle = c.send_cq_handle;
            c.is_srq = 0;
            c.srq_handle = 0;
            c.max_recv_wr = 0;
            c.max_recv_sge = 0;
            c.qp_type = qpt::RC;
            Ok(Some(QpKind::XrcIni))
        }
        qpt::XRC_TGT => {
            create_tgt(w, ctx, r, c)?;
            Ok(None)
        }
        _ => Ok(Some(QpKind::Plain)),
    }
}

/// An XRC target QP (`create_xrc_tgt_qp`): no queues, no CQs, no PD; the domain is named
/// by `pd_handle`. Its driver data is read only for the UAR flag the response mirrors.
fn create_tgt(w: &mut World, ctx: u64, r: &Req, c: &IbUverbsExCreateQp) -> Result<(), Errno> {
    let xrcdn = xrcd_of(w, ctx, c.pd_handle)?;
    let flags = r.drv::<cmds::CreateQp>().map(|d| d.flags).unwrap_or(0);
    let hca = hca_of(w, ctx);
    let qpn = next_id(w, hca);
    let o = IbUverbsExCreateQpResp {
        base: IbUverbsCreateQpResp {
            qp_handle: next_handle(w, ctx),
            qpn,
            ..Default::default()
        },
        comp_mask: 0,
        response_length: Req::len_for(r.out_len, size_of::<IbUverbsExCreateQpResp>()),
    };
    let dr = Mlx5IbCreateQpResp {
        bfreg_index: if flags & MLX5_QP_FLAG_UAR_PAGE_INDEX != 0 {
            1 << 31
        } else {
            0
        },
        ..Default::default()
    };
    if r.ex {
        r.respond(&o)?;
    } else {
        r.respond(&o.base)?;
    }
    r.respond_drv(&dr)?;
    new_handle(w, ctx, Obj::Qp(qpn));
    w.hcas[hca].qps.insert(
        qpn,
        Qp {
            ctx,
            qpn,
            qp_type: qpt::RC,
            state: qps::RESET,
            user_handle: c.user_handle,
            uidx: 0xff_ffff,
            bfreg: u32::MAX,
            port: 1,
            path_mtu: mlx5_ffi::uverbs::mtu::MTU_4096,
            hpc: QpExt {
                kind: QpKind::XrcTgt { xrcdn },
                ..Default::default()
            },
            ..Default::default()
        },
    );
    Ok(())
}

/// OPEN_QP: a handle on an existing XRC target QP of a domain the caller has open.
pub(super) fn open_qp(w: &mut World, ctx: u64, r: &Req) -> Result<(), Errno> {
    let c = r.core::<cmds::OpenQp>();
    let xrcdn = xrcd_of(w, ctx, c.pd_handle)?;
    if c.qp_type != qpt::XRC_TGT {
        return Err(EINVAL);
    }
    let hca = hca_of(w, ctx);
    let ok = w.hcas[hca]
        .qps
        .get(&c.qpn)
        .is_some_and(|q| q.hpc.kind == QpKind::XrcTgt { xrcdn });
    if !ok {
        return Err(EINVAL);
    }
    r.respond(&IbUverbsCreateQpResp {
        qp_handle: next_handle(w, ctx),
        qpn: c.qpn,
        ..Default::default()
    })?;
    new_handle(w, ctx, Obj::Qp(c.qpn));
    if let Some(q) = w.hcas[hca].qps.get_mut(&c.qpn) {
        *q.hpc.openers.entry(ctx).or_insert(0) += 1;
    }
    Ok(())
}

/// DESTROY_QP of a target QP through `handle`: a handle of an opener only closes; the
/// creator's hands the QP to an opener while there is one (the QP lives while anyone has
/// it open, as `__ib_destroy_shared_qp` keeps it). Returns false when the QP itself is to
/// be destroyed (the common path).
pub(super) fn close_shared_qp(w: &mut World, ctx: u64, handle: u32, qpn: u32) -> bool {
    let hca = hca_of(w, ctx);
    let Some(q) = w.hcas[hca].qps.get_mut(&qpn) else {
        return false;
    };
    if !matches!(q.hpc.kind, QpKind::XrcTgt { .. }) {
        return false;
    }
    let release = |m: &mut std::collections::BTreeMap<u64, u32>, who: u64| {
        if let Some(n) = m.get_mut(&who) {
            *n -= 1;
            if *n == 0 {
                m.remove(&who);
            }
        }
    };
    if q.ctx != ctx {
        release(&mut q.hpc.openers, ctx);
    } else if let Some(&heir) = q.hpc.openers.keys().next() {
        release(&mut q.hpc.openers, heir);
        q.ctx = heir;
    } else {
        return false;
    }
    remove_handle(w, ctx, handle);
    true
}

/// Before a context closes: its target QPs that others have open move to one of them, its
/// opens of other contexts' target QPs are released, its XRC SRQs' parts and its domain
/// opens are dropped.
pub(super) fn close_context(w: &mut World, ctx: u64) {
    let Some(c) = w.contexts.get(&ctx) else {
        return;
    };
    let hca = c.hca;
    let opens: Vec<u32> = c
        .handles
        .values()
        .filter_map(|o| match o {
            Obj::Xrcd(n) => Some(*n),
            _ => None,
        })
        .collect();
    for q in w.hcas[hca].qps.values_mut() {
        q.hpc.openers.remove(&ctx);
        if q.ctx == ctx && matches!(q.hpc.kind, QpKind::XrcTgt { .. }) {
            if let Some(&heir) = q.hpc.openers.keys().next() {
                q.ctx = heir;
                if let Some(n) = q.hpc.openers.get_mut(&heir) {
                    *n -= 1;
                    if *n == 0 {
                        q.hpc.openers.remove(&heir);
                    }
                }
            }
        }
    }
    let gone: Vec<u32> = w.hcas[hca]
        .hpc
        .xrc_srqs
        .iter()
        .filter(|(_, s)| s.ctx == ctx)
        .map(|(&n, _)| n)
        .collect();
    for n in gone {
        srq_destroyed(w, hca, n);
    }
    for n in opens {
        drop_open(w, hca, n);
    }
}

/// The kernel's transition table for the XRC types, from RC's (`rc`: required, optional):
/// an initiator has no receive side (no MAX_DEST_RD_ATOMIC, no MIN_RNR_TIMER), a target no
/// send side (RTR to RTS needs only TIMEOUT and SQ_PSN).
pub(super) fn xrc_transition(cur: u8, next: u8, t: u8, rc: (u32, u32)) -> (u32, u32) {
    use qp_attr::*;
    let (mut req, mut opt) = rc;
    match (t, cur, next) {
        (qpt::XRC_INI, _, _) => {
            req &= !(MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER);
            opt &= !(MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER);
        }
        (qpt::XRC_TGT, qps::RTR, qps::RTS) => req = TIMEOUT | SQ_PSN,
        (qpt::XRC_TGT, qps::SQD, qps::SQD) => opt &= !(RETRY_CNT | RNR_RETRY | MAX_QP_RD_ATOMIC),
        _ => {}
    }
    (req, opt)
}

/// `modify_qp_mask` of ib_uverbs: the attributes an XRC QP has no use for are dropped from
/// the mask before the transition table sees it (an initiator receives nothing, a target
/// sends nothing), so programs that set RC's full mask on them work.
pub(super) fn modify_qp_mask(t: u8, mask: u32) -> u32 {
    use qp_attr::*;
    match t {
        qpt::XRC_INI => mask & !(MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER),
        qpt::XRC_TGT => mask & !(MAX_QP_RD_ATOMIC | RETRY_CNT | RNR_RETRY),
        _ => mask,
    }
}
