//! XRC: `ibv_open_xrcd`/`ibv_close_xrcd`, `ibv_create_srq_ex` (`IBV_SRQT_XRC`),
//! `ibv_get_srq_num`, `ibv_open_qp`, and the XRC QPs' creation and posting, over the crate's
//! `mlx5::xrc` (`XrcDomain`, `XrcSrq`, `XrcSendQp`, `XrcTgtQp`).
//!
//! What libibverbs leaves to the provider (rdma-core v44): `ibv_create_srq_ex`,
//! `ibv_open_xrcd`, `ibv_get_srq_num` and `ibv_open_qp` are inline functions of `verbs.h`
//! that call the `verbs_context` slot directly, so the provider fills every field of the
//! returned `ibv_srq`/`ibv_xrcd`/`ibv_qp` itself (libmlx5 does it in `ibv_cmd_*`). An
//! `ibv_create_qp_ex` whose mask is only `PD` (an XRC_SEND QP, as `ibv_xsrq_pingpong` makes
//! it) arrives through `create_qp` instead, with no receive CQ.
//!
//! # Safety of the entry points
//! Every `unsafe extern "C" fn` here is an operation libibverbs calls through the
//! `verbs_context` table, and relies on what libibverbs guarantees for it: each object
//! pointer is null or one this provider returned and has not yet destroyed (so its
//! libibverbs struct heads our allocation), each attribute pointer is null or points to a
//! live struct of the `verbs.h` layout for the duration of the call, and no object is
//! destroyed while another call on it runs.
//!
//! A domain counts its SRQs and target QPs: closing it while any is alive is refused with
//! `EBUSY`, as the kernel refuses `CLOSE_XRCD` on a domain in use.

use core::cell::UnsafeCell;
use core::ffi::{c_int, c_void};
use core::mem::MaybeUninit;
use core::sync::atomic::{AtomicU32, Ordering};
use std::os::fd::BorrowedFd;

use mlx5::{PostError, SendFlags, SendWr, Sge, WrOp, XrcSrqNum, XrcWr, XrcdOpen};

use crate::abi::*;
use crate::cq::cq_of;
use crate::device::{errno_of, op, set_errno};
use crate::fast::{Lock, Op, Payload};
use crate::guard;
use crate::objects::{ProvSrq, SrqInner, init_mutex_cond, pd_of, st};
use crate::qp::{ProvQp, QpInner};
use crate::wr::MAX_WR_SGE;

pub const IBV_QPT_XRC_SEND: u32 = 9;
pub const IBV_QPT_XRC_RECV: u32 = 10;
const IBV_SRQT_BASIC: u32 = 0;
const IBV_SRQT_XRC: u32 = 1;
const IBV_XRCD_INIT_ATTR_FD: u32 = 1;
const IBV_XRCD_INIT_ATTR_OFLAGS: u32 = 2;
const IBV_SRQ_INIT_ATTR_TYPE: u32 = 1;
const IBV_SRQ_INIT_ATTR_PD: u32 = 2;
const IBV_SRQ_INIT_ATTR_XRCD: u32 = 4;
const IBV_SRQ_INIT_ATTR_CQ: u32 = 8;
pub const IBV_QP_INIT_ATTR_XRCD: u32 = 1 << 1;
const IBV_QP_OPEN_ATTR_NUM: u32 = 1;
const IBV_QP_OPEN_ATTR_XRCD: u32 = 2;
const IBV_QP_OPEN_ATTR_CONTEXT: u32 = 4;
const IBV_QP_OPEN_ATTR_TYPE: u32 = 8;
const VERBS_QP_XRCD: u32 = 1;

/// Our XRC domain: libibverbs' `verbs_xrcd` first.
#[repr(C)]
pub struct ProvXrcd {
    pub vx: verbs_xrcd,
    pub inner: mlx5::XrcDomain,
    /// SRQs and target QPs made in this domain and not yet destroyed.
    pub users: AtomicU32,
}

/// # Safety
/// `x` is a domain of ours, not yet closed.
pub unsafe fn xrcd_of<'a>(x: *mut ibv_xrcd) -> &'a ProvXrcd {
    // SAFETY: our domains are `ProvXrcd` with the ibv_xrcd at offset 0.
    unsafe { &*x.cast::<ProvXrcd>() }
}

fn refuse<T>(s: &crate::device::CtxState, what: &str, errno: c_int) -> *mut T {
    if s.log {
        eprintln!("libmlx5rs: {}: {what}", s.name);
    }
    set_errno(errno);
    core::ptr::null_mut()
}

/// `oflags` of `ibv_open_xrcd` as the crate's choice (`O_CREAT`, `O_CREAT | O_EXCL`, or
/// neither; any other bit is refused).
pub fn open_how(oflags: c_int) -> Option<XrcdOpen> {
    match oflags {
        0 => Some(XrcdOpen::Existing),
        libc::O_CREAT => Some(XrcdOpen::OrCreate),
        f if f == libc::O_CREAT | libc::O_EXCL => Some(XrcdOpen::CreateNew),
        _ => None,
    }
}

unsafe extern "C" fn open_xrcd(
    c: *mut ibv_context,
    attr: *mut ibv_xrcd_init_attr,
) -> *mut ibv_xrcd {
    guard("open_xrcd", || {
        // SAFETY: `c` is ours.
        let s = unsafe { st(c) };
        if attr.is_null() {
            return refuse(s, "open_xrcd: no attributes", libc::EINVAL);
        }
        // SAFETY: the caller's live attribute struct.
        let a = unsafe { &*attr };
        let need = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
        if a.comp_mask & !need != 0 {
            return refuse(
                s,
                &format!(
                    "open_xrcd: comp_mask {:#x} not served (FD and OFLAGS are)",
                    a.comp_mask
                ),
                libc::EOPNOTSUPP,
            );
        }
        if a.comp_mask & need != need {
            return refuse(
                s,
                "open_xrcd: comp_mask must carry FD and OFLAGS (as ibv_cmd_open_xrcd asks)",
                libc::EINVAL,
            );
        }
        let made = if a.fd == -1 {
            mlx5::XrcDomain::private(&s.ctx)
        } else if a.fd < 0 {
            return refuse(
                s,
                &format!("open_xrcd: fd {} is no descriptor", a.fd),
                libc::EBADF,
            );
        } else {
            let Some(how) = open_how(a.oflags) else {
                return refuse(
                    s,
                    &format!(
                        "open_xrcd: oflags {:#x} (O_CREAT and O_EXCL are the only ones)",
                        a.oflags
                    ),
                    libc::EINVAL,
                );
            };
            // SAFETY: the application's descriptor, open for the duration of the call
            // (the kernel only reads its inode).
            let fd = unsafe { BorrowedFd::borrow_raw(a.fd) };
            mlx5::XrcDomain::open(&s.ctx, fd, how)
        };
        match made {
            Ok(inner) => Box::into_raw(Box::new(ProvXrcd {
                vx: verbs_xrcd {
                    xrcd: ibv_xrcd { context: c },
                    comp_mask: 0,
                    handle: 0,
                },
                inner,
                users: AtomicU32::new(0),
            }))
            .cast(),
            Err(e) => {
                set_errno(errno_of(s, "open_xrcd", &e));
                core::ptr::null_mut()
            }
        }
    })
}

unsafe extern "C" fn close_xrcd(x: *mut ibv_xrcd) -> c_int {
    guard("close_xrcd", || {
        // SAFETY: `x` is ours, not yet closed.
        let d = unsafe { xrcd_of(x) };
        if d.users.load(Ordering::Acquire) != 0 {
            // SAFETY: its context is ours.
            let s = unsafe { st(d.vx.xrcd.context) };
            if s.log {
                eprintln!(
                    "libmlx5rs: {}: close_xrcd: the domain still has {} SRQs or target QPs",
                    s.name,
                    d.users.load(Ordering::Relaxed)
                );
            }
            return libc::EBUSY;
        }
        // SAFETY: ours, from open_xrcd, handed back once (the kernel handle closes when the
        // last crate object of the domain is gone: none is left).
        drop(unsafe { Box::from_raw(x.cast::<ProvXrcd>()) });
        0
    })
}

unsafe extern "C" fn create_srq_ex(
    c: *mut ibv_context,
    attr: *mut ibv_srq_init_attr_ex,
) -> *mut ibv_srq {
    guard("create_srq_ex", || {
        // SAFETY: `c` is ours.
        let s = unsafe { st(c) };
        // SAFETY: the caller's live attribute struct.
        let a = unsafe { &mut *attr };
        let m = a.comp_mask;
        let known = IBV_SRQ_INIT_ATTR_TYPE
            | IBV_SRQ_INIT_ATTR_PD
            | IBV_SRQ_INIT_ATTR_XRCD
            | IBV_SRQ_INIT_ATTR_CQ;
        if m & !known != 0 {
            return refuse(
                s,
                &format!("create_srq_ex: comp_mask {m:#x} not served (TYPE, PD, XRCD, CQ are)"),
                libc::EOPNOTSUPP,
            );
        }
        let ty = if m & IBV_SRQ_INIT_ATTR_TYPE != 0 {
            a.srq_type
        } else {
            IBV_SRQT_BASIC
        };
        if m & IBV_SRQ_INIT_ATTR_PD == 0 || a.pd.is_null() {
            return refuse(s, "create_srq_ex: no PD", libc::EINVAL);
        }
        match ty {
            IBV_SRQT_BASIC => {
                let mut base = ibv_srq_init_attr {
                    srq_context: a.srq_context,
                    attr: a.attr,
                };
                let r = crate::objects::create_srq_basic(a.pd, &mut base);
                a.attr = base.attr;
                r
            }
            IBV_SRQT_XRC => {
                let need = IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
                if m & need != need || a.xrcd.is_null() || a.cq.is_null() {
                    return refuse(
                        s,
                        "create_srq_ex: an XRC SRQ needs XRCD and CQ",
                        libc::EINVAL,
                    );
                }
                create_xsrq(a)
            }
            t => refuse(
                s,
                &format!("create_srq_ex: SRQ type {t} not served (BASIC and XRC are)"),
                libc::EOPNOTSUPP,
            ),
        }
    })
}

fn create_xsrq(a: &mut ibv_srq_init_attr_ex) -> *mut ibv_srq {
    // SAFETY: the PD, domain and CQ are ours (the application's, of this context).
    let (p, d, cq) = unsafe { (pd_of(a.pd), xrcd_of(a.xrcd), cq_of(a.cq)) };
    // SAFETY: the PD's context is ours.
    let s = unsafe { st(p.pd.context) };
    let mut b: Box<MaybeUninit<ProvSrq>> = Box::new(MaybeUninit::uninit());
    let ptr = b.as_mut_ptr();
    let made = {
        // Creating routes the SRQ's completions in the CQ: hold its lock against a poll.
        let _g = cq.lock.lock();
        // SAFETY: shared access under the CQ lock.
        let c = unsafe { &*cq.inner.get() };
        mlx5::with_user_handle(ptr as u64, || {
            mlx5::XrcSrq::new(&d.inner, &p.inner, c, a.attr.max_wr, a.attr.max_sge)
        })
    };
    let inner = match made {
        Ok(x) => x,
        Err(e) => {
            set_errno(errno_of(s, "create_srq_ex (XRC)", &e));
            return core::ptr::null_mut();
        }
    };
    d.users.fetch_add(1, Ordering::AcqRel);
    a.attr.max_wr = inner.capacity();
    let num = inner.number().get();
    // SAFETY: all-zero is a valid verbs_srq (pointers, integers, pthread objects
    // initialized below); the Rust fields are written before anyone sees the SRQ.
    unsafe {
        let v: *mut verbs_srq = &raw mut (*ptr).srq;
        v.write(MaybeUninit::zeroed().assume_init());
        (*v).srq.context = p.pd.context;
        (*v).srq.srq_context = a.srq_context;
        (*v).srq.pd = a.pd;
        init_mutex_cond(&raw mut (*v).srq.mutex, &raw mut (*v).srq.cond);
        (*v).srq_type = IBV_SRQT_XRC;
        (*v).xrcd = a.xrcd.cast();
        (*v).cq = a.cq;
        (*v).srq_num = num;
        (&raw mut (*ptr).lock).write(Lock::new(s.single_threaded));
        (&raw mut (*ptr).inner).write(UnsafeCell::new(SrqInner::Xrc(inner, a.xrcd.cast())));
    }
    Box::into_raw(b).cast()
}

unsafe extern "C" fn get_srq_num(srq: *mut ibv_srq, num: *mut u32) -> c_int {
    guard("get_srq_num", || {
        // SAFETY: `srq` is ours; every SRQ of ours records its number.
        let v = unsafe { &*srq.cast::<verbs_srq>() };
        // SAFETY: the caller's output.
        unsafe { num.write(v.srq_num) };
        0
    })
}

/// An XRC_SEND QP (from `create_qp`, or `create_qp_ex` with a PD): the send side only.
pub fn create_send(
    pd: *mut ibv_pd,
    qp_context: *mut c_void,
    send_cq: *mut ibv_cq,
    cap: &mut ibv_qp_cap,
    sq_sig_all: bool,
) -> *mut ibv_qp {
    // SAFETY: `pd` is ours.
    let p = unsafe { pd_of(pd) };
    // SAFETY: its context is ours.
    let s = unsafe { st(p.pd.context) };
    if send_cq.is_null() {
        return refuse(s, "create_qp: an XRC_SEND QP needs a send CQ", libc::EINVAL);
    }
    // SAFETY: the application's CQ of this context.
    let scq = unsafe { cq_of(send_cq) };
    let mut b: Box<MaybeUninit<ProvQp>> = Box::new(MaybeUninit::zeroed());
    let ptr = b.as_mut_ptr();
    let made = {
        let _g = scq.lock.lock();
        // SAFETY: shared access under the CQ lock.
        let sc = unsafe { &*scq.inner.get() };
        let mut init = mlx5::QpInitAttr::new(mlx5::QpType::XrcSend, sc, sc);
        init.cap = mlx5::QpCap {
            max_send_wr: cap.max_send_wr,
            max_recv_wr: 0,
            max_send_sge: cap.max_send_sge,
            max_recv_sge: 0,
            max_inline_data: cap.max_inline_data,
        };
        init.sq_sig_all = sq_sig_all;
        init.bf_policy = s.bf_policy;
        mlx5::with_user_handle(ptr as u64, || mlx5::XrcSendQp::new(&p.inner, &init))
    };
    let inner = match made {
        Ok(q) => q,
        Err(e) => {
            set_errno(errno_of(s, "create_qp (XRC_SEND)", &e));
            return core::ptr::null_mut();
        }
    };
    let real = inner.qp().cap();
    *cap = ibv_qp_cap {
        max_send_wr: real.max_send_wr,
        max_recv_wr: 0,
        max_send_sge: real.max_send_sge,
        max_recv_sge: 0,
        max_inline_data: real.max_inline_data,
    };
    let qpn = inner.qpn();
    // SAFETY: the box is zeroed (valid for the C parts); the Rust fields are written before
    // anyone sees the QP.
    unsafe {
        crate::qp::fill(
            ptr,
            s,
            p.pd.context,
            qp_context,
            pd,
            (send_cq, core::ptr::null_mut()),
            qpn,
            IBV_QPT_XRC_SEND,
            mlx5::QpType::XrcSend,
            QpInner::XrcSend(inner),
            real.max_inline_data as usize,
        );
    }
    Box::into_raw(b).cast()
}

/// An XRC_RECV (target) QP of a domain, created or opened by number.
fn target(
    c: *mut ibv_context,
    xrcd: *mut ibv_xrcd,
    qp_context: *mut c_void,
    open_qpn: Option<u32>,
) -> *mut ibv_qp {
    // SAFETY: `c` is ours.
    let s = unsafe { st(c) };
    if xrcd.is_null() {
        return refuse(s, "XRC_RECV QP without a domain", libc::EINVAL);
    }
    // SAFETY: the application's domain of this context.
    let d = unsafe { xrcd_of(xrcd) };
    let mut b: Box<MaybeUninit<ProvQp>> = Box::new(MaybeUninit::zeroed());
    let ptr = b.as_mut_ptr();
    let made = mlx5::with_user_handle(ptr as u64, || match open_qpn {
        None => mlx5::XrcTgtQp::new(&d.inner),
        Some(n) => mlx5::XrcTgtQp::open(&d.inner, n),
    });
    let inner = match made {
        Ok(q) => q,
        Err(e) => {
            let what = if open_qpn.is_some() {
                "open_qp"
            } else {
                "create_qp_ex (XRC_RECV)"
            };
            set_errno(errno_of(s, what, &e));
            return core::ptr::null_mut();
        }
    };
    d.users.fetch_add(1, Ordering::AcqRel);
    let qpn = inner.qpn();
    // SAFETY: as in create_send.
    unsafe {
        crate::qp::fill(
            ptr,
            s,
            c,
            qp_context,
            core::ptr::null_mut(),
            (core::ptr::null_mut(), core::ptr::null_mut()),
            qpn,
            IBV_QPT_XRC_RECV,
            mlx5::QpType::XrcSend,
            QpInner::XrcRecv(inner, xrcd.cast()),
            0,
        );
        (*ptr).vqp.xrcd = xrcd.cast();
        (*ptr).vqp.comp_mask |= VERBS_QP_XRCD;
    }
    Box::into_raw(b).cast()
}

/// `ibv_create_qp_ex` of an XRC_RECV QP (`comp_mask` with `XRCD`).
pub fn create_recv(c: *mut ibv_context, a: &ibv_qp_init_attr_ex) -> *mut ibv_qp {
    target(c, a.xrcd.cast(), a.qp_context, None)
}

unsafe extern "C" fn open_qp(c: *mut ibv_context, attr: *mut ibv_qp_open_attr) -> *mut ibv_qp {
    guard("open_qp", || {
        // SAFETY: `c` is ours.
        let s = unsafe { st(c) };
        // SAFETY: the caller's live attribute struct.
        let a = unsafe { &*attr };
        let need = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
        let known = need | IBV_QP_OPEN_ATTR_CONTEXT;
        if a.comp_mask & !known != 0 || a.comp_mask & need != need {
            return refuse(
                s,
                &format!(
                    "open_qp: comp_mask {:#x} (NUM, XRCD and TYPE are needed, CONTEXT may come)",
                    a.comp_mask
                ),
                libc::EINVAL,
            );
        }
        if a.qp_type != IBV_QPT_XRC_RECV {
            return refuse(
                s,
                &format!(
                    "open_qp: QP type {} (only XRC_RECV QPs are opened)",
                    a.qp_type
                ),
                libc::EINVAL,
            );
        }
        let ctx = if a.comp_mask & IBV_QP_OPEN_ATTR_CONTEXT != 0 {
            a.qp_context
        } else {
            core::ptr::null_mut()
        };
        target(c, a.xrcd, ctx, Some(a.qp_num))
    })
}

/// The domain a destroyed SRQ or target QP leaves.
///
/// # Safety
/// `d` is the live domain the object was made in.
pub unsafe fn release(d: *mut ProvXrcd) {
    // SAFETY: per the contract (the domain cannot be closed while it counts the object).
    unsafe { (*d).users.fetch_sub(1, Ordering::AcqRel) };
}

/// One decoded WR into an XRC initiator's ring (no doorbell), for the remote XRC SRQ `srqn`.
pub fn build(
    x: &mut mlx5::XrcSendQp,
    op: Op,
    flags: SendFlags,
    wr_id: u64,
    srqn: u32,
    p: Payload<'_>,
) -> Result<(), PostError> {
    let srqn = XrcSrqNum::new(srqn).map_err(|_| PostError::BadDestination)?;
    let op = match op {
        Op::Send => WrOp::Send,
        Op::SendImm(imm) => WrOp::SendImm { imm },
        Op::SendInv(rkey) => WrOp::SendInv { rkey },
        Op::Write {
            raddr,
            rkey,
            imm: None,
        } => WrOp::Write { raddr, rkey },
        Op::Write {
            raddr,
            rkey,
            imm: Some(imm),
        } => WrOp::WriteImm { raddr, rkey, imm },
        Op::Read { raddr, rkey } => WrOp::Read { raddr, rkey },
        Op::Atomic {
            raddr,
            rkey,
            swap_add,
            compare: Some(compare),
        } => WrOp::CompareSwap {
            raddr,
            rkey,
            compare,
            swap: swap_add,
        },
        Op::Atomic {
            raddr,
            rkey,
            swap_add,
            compare: None,
        } => WrOp::FetchAdd {
            raddr,
            rkey,
            add: swap_add,
        },
    };
    let mut sg = [Sge::default(); MAX_WR_SGE];
    let mut inl: [&[u8]; MAX_WR_SGE] = [&[]; MAX_WR_SGE];
    let (sg_list, inline): (&[Sge], &[&[u8]]) = match p {
        Payload::Ibv(list, inline) => {
            if list.len() > MAX_WR_SGE {
                return Err(PostError::TooManySges {
                    n: list.len(),
                    max: MAX_WR_SGE as u32,
                });
            }
            if inline {
                for (d, s) in inl.iter_mut().zip(list) {
                    // SAFETY: inline data is read from the application's buffers, as the
                    // verbs contract of IBV_SEND_INLINE lets the provider do during the call.
                    *d = unsafe {
                        core::slice::from_raw_parts(s.addr as usize as *const u8, s.length as usize)
                    };
                }
                (&[], &inl[..list.len()])
            } else {
                for (d, s) in sg.iter_mut().zip(list) {
                    *d = Sge {
                        addr: s.addr,
                        length: s.length,
                        lkey: s.lkey,
                    };
                }
                (&sg[..list.len()], &[])
            }
        }
        Payload::Sges(l) => (l, &[]),
        Payload::Bytes([]) => (&[], &[]),
        Payload::Bytes(d) => {
            inl[0] = d;
            (&[], &inl[..1])
        }
    };
    x.post_unrung(&XrcWr {
        srqn,
        wr: SendWr {
            wr_id,
            op,
            sg_list,
            inline,
            flags,
            ud: None,
        },
    })
}

/// `ibv_post_send` on an XRC QP: every WR of the chain into the ring, one doorbell. A target
/// QP has no send queue.
///
/// # Safety
/// `wr` is a live chain of send WRs; `bad` the caller's out pointer.
pub unsafe fn post_send(
    inner: &mut QpInner,
    mut wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    let QpInner::XrcSend(x) = inner else {
        // SAFETY: the caller's out pointer.
        unsafe { *bad = wr };
        return libc::EINVAL;
    };
    let mut rc = 0;
    while !wr.is_null() {
        // SAFETY: the application's chain of live WRs.
        let w = unsafe { &*wr };
        let r = crate::fast::decode(w)
            .and_then(|(op, flags, p)| build(x, op, flags, w.wr_id, w.qp_type, p));
        if let Err(e) = r {
            rc = crate::fast::errno_of_post(e);
            // SAFETY: the caller's out pointer.
            unsafe { *bad = wr };
            break;
        }
        wr = w.next;
    }
    x.sq().ring();
    rc
}

pub fn fill_ops(s: &mut [Fp; VERBS_CONTEXT_OPS_SLOTS]) {
    type Ctx = *mut ibv_context;
    op!(
        s,
        "open_xrcd",
        open_xrcd,
        unsafe extern "C" fn(Ctx, *mut ibv_xrcd_init_attr) -> *mut ibv_xrcd
    );
    op!(
        s,
        "close_xrcd",
        close_xrcd,
        unsafe extern "C" fn(*mut ibv_xrcd) -> c_int
    );
    op!(
        s,
        "create_srq_ex",
        create_srq_ex,
        unsafe extern "C" fn(Ctx, *mut ibv_srq_init_attr_ex) -> *mut ibv_srq
    );
    op!(
        s,
        "get_srq_num",
        get_srq_num,
        unsafe extern "C" fn(*mut ibv_srq, *mut u32) -> c_int
    );
    op!(
        s,
        "open_qp",
        open_qp,
        unsafe extern "C" fn(Ctx, *mut ibv_qp_open_attr) -> *mut ibv_qp
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oflags_map_to_the_crate_choice_and_others_are_refused() {
        assert_eq!(open_how(0), Some(XrcdOpen::Existing));
        assert_eq!(open_how(libc::O_CREAT), Some(XrcdOpen::OrCreate));
        assert_eq!(
            open_how(libc::O_CREAT | libc::O_EXCL),
            Some(XrcdOpen::CreateNew)
        );
        assert_eq!(open_how(libc::O_EXCL), None);
        assert_eq!(open_how(libc::O_RDWR), None);
        assert_eq!(open_how(-1), None);
    }
}
