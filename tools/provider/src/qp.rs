//! Queue pairs: create (plain and extended), modify, query, destroy.

use core::cell::UnsafeCell;
use core::ffi::c_int;
use core::mem::MaybeUninit;

use crate::abi::*;
use crate::cq::cq_of;
use crate::device::{errno_of, op, set_errno};
use crate::fast::Lock;
use crate::guard;
use crate::objects::{ProvSrq, SrqInner, ah_attr, init_mutex_cond, pd_of, st, to_ibv_ah_attr};

pub const IBV_QPT_RC: u32 = 2;
pub const IBV_QPT_UC: u32 = 3;
pub const IBV_QPT_UD: u32 = 4;

/// Our QP: libibverbs' `verbs_qp` (ibv_qp_ex, whose head is the ibv_qp) first.
#[repr(C)]
pub struct ProvQp {
    pub vqp: verbs_qp,
    pub sq_lock: Lock,
    pub rq_lock: Lock,
    pub qp_type: mlx5::QpType,
    pub srq: *mut ProvSrq,
    pub inner: UnsafeCell<QpInner>,
    /// The `ibv_wr_*` WR being built (under the send lock).
    pub pending: UnsafeCell<crate::wr::Pending>,
}

/// The crate's QP behind a `ProvQp`: RC, UC or UD (`qp_type` says which), or an XRC
/// initiator, or an XRC target (with the domain it counts in).
pub enum QpInner {
    Plain(mlx5::Qp),
    XrcSend(mlx5::XrcSendQp),
    XrcRecv(mlx5::XrcTgtQp, *mut crate::xrc::ProvXrcd),
}

impl QpInner {
    /// The send queue (none on an XRC target).
    #[inline(always)]
    pub fn sq(&mut self) -> Option<&mut mlx5::SendQueue> {
        match self {
            QpInner::Plain(q) => Some(q.sq()),
            QpInner::XrcSend(q) => Some(q.sq()),
            QpInner::XrcRecv(..) => None,
        }
    }

    fn modify(&mut self, attr: &mlx5::QpAttr, mask: u32) -> mlx5::Result<()> {
        match self {
            QpInner::Plain(q) => q.modify(attr, mask),
            QpInner::XrcSend(q) => q.modify(attr, mask),
            QpInner::XrcRecv(q, _) => q.modify(attr, mask),
        }
    }

    /// State, attributes, capabilities. An XRC target reports the state last set through
    /// this handle and no queues (the crate keeps no more of a kernel-only QP).
    fn query_attr(&self) -> mlx5::Result<(mlx5::QpState, mlx5::QpAttr, mlx5::QpCap)> {
        match self {
            QpInner::Plain(q) => q.query_attr(),
            QpInner::XrcSend(q) => q.qp().query_attr(),
            QpInner::XrcRecv(q, _) => {
                Ok((q.state(), mlx5::QpAttr::default(), mlx5::QpCap::default()))
            }
        }
    }
}

/// # Safety
/// `qp` is a QP of ours.
pub unsafe fn qp_of<'a>(qp: *mut ibv_qp) -> &'a ProvQp {
    // SAFETY: our QPs are `ProvQp` with the ibv_qp at offset 0.
    unsafe { &*qp.cast::<ProvQp>() }
}

fn qp_type(t: u32) -> Option<mlx5::QpType> {
    match t {
        IBV_QPT_RC => Some(mlx5::QpType::Rc),
        IBV_QPT_UC => Some(mlx5::QpType::Uc),
        IBV_QPT_UD => Some(mlx5::QpType::Ud),
        _ => None,
    }
}

pub fn state_from(v: u32) -> Option<mlx5::QpState> {
    use mlx5::QpState as S;
    Some(match v {
        0 => S::Reset,
        1 => S::Init,
        2 => S::Rtr,
        3 => S::Rts,
        4 => S::Sqd,
        5 => S::Sqe,
        6 => S::Err,
        _ => return None,
    })
}

pub fn state_to(s: mlx5::QpState) -> u32 {
    use mlx5::QpState as S;
    match s {
        S::Reset => 0,
        S::Init => 1,
        S::Rtr => 2,
        S::Rts => 3,
        S::Sqd => 4,
        S::Sqe => 5,
        S::Err => 6,
    }
}

#[allow(clippy::too_many_arguments)]
fn create(
    pd: *mut ibv_pd,
    qp_context: *mut core::ffi::c_void,
    send_cq: *mut ibv_cq,
    recv_cq: *mut ibv_cq,
    srq: *mut ibv_srq,
    cap: &mut ibv_qp_cap,
    ty: u32,
    sq_sig_all: bool,
) -> *mut ibv_qp {
    // SAFETY: `pd` is ours.
    let p = unsafe { pd_of(pd) };
    // SAFETY: its context is ours.
    let s = unsafe { st(p.pd.context) };
    if ty == crate::xrc::IBV_QPT_XRC_SEND {
        return crate::xrc::create_send(pd, qp_context, send_cq, cap, sq_sig_all);
    }
    let Some(t) = qp_type(ty) else {
        if s.log {
            eprintln!(
                "libmlx5rs: {}: create_qp: QP type {ty} is not served (RC, UC, UD, XRC_SEND, XRC_RECV are)",
                s.name
            );
        }
        set_errno(libc::EOPNOTSUPP);
        return core::ptr::null_mut();
    };
    if send_cq.is_null() || recv_cq.is_null() {
        set_errno(libc::EINVAL);
        return core::ptr::null_mut();
    }
    // SAFETY: the CQs are ours (libibverbs hands the application's CQs of this context).
    let (scq, rcq) = unsafe { (cq_of(send_cq), cq_of(recv_cq)) };
    let psrq = srq.cast::<ProvSrq>();
    let mut b: Box<MaybeUninit<ProvQp>> = Box::new(MaybeUninit::zeroed());
    let ptr = b.as_mut_ptr();
    let made = {
        // Creating reads the CQs: hold their locks against a concurrent poll.
        let _g1 = scq.lock.lock();
        let _g2 = (!core::ptr::eq(scq, rcq)).then(|| rcq.lock.lock());
        // SAFETY: shared access under the CQ locks.
        let (sc, rc) = unsafe { (&*scq.inner.get(), &*rcq.inner.get()) };
        // SAFETY: an SRQ of ours, if any.
        let srq_ref = match (!psrq.is_null()).then(|| unsafe { &*(*psrq).inner.get() }) {
            None => None,
            Some(SrqInner::Basic(srq)) => Some(srq),
            Some(SrqInner::Xrc(..)) => {
                if s.log {
                    eprintln!(
                        "libmlx5rs: {}: create_qp: an XRC SRQ receives for XRC_RECV QPs only",
                        s.name
                    );
                }
                set_errno(libc::EINVAL);
                return core::ptr::null_mut();
            }
        };
        let mut init = mlx5::QpInitAttr::new(t, sc, rc);
        init.srq = srq_ref;
        init.cap = mlx5::QpCap {
            max_send_wr: cap.max_send_wr,
            max_recv_wr: cap.max_recv_wr,
            max_send_sge: cap.max_send_sge,
            max_recv_sge: cap.max_recv_sge,
            max_inline_data: cap.max_inline_data,
        };
        init.sq_sig_all = sq_sig_all;
        init.bf_policy = s.bf_policy;
        mlx5::with_user_handle(ptr as u64, || mlx5::Qp::new(&p.inner, &init))
    };
    let inner = match made {
        Ok(q) => q,
        Err(e) => {
            set_errno(errno_of(s, "create_qp", &e));
            return core::ptr::null_mut();
        }
    };
    let real = inner.cap();
    *cap = ibv_qp_cap {
        max_send_wr: real.max_send_wr,
        max_recv_wr: real.max_recv_wr,
        max_send_sge: real.max_send_sge,
        max_recv_sge: real.max_recv_sge,
        max_inline_data: real.max_inline_data,
    };
    let qpn = inner.qpn();
    // SAFETY: the box is zeroed (valid for the C parts); `fill` writes the C fields and the
    // Rust ones before anyone sees the QP.
    unsafe {
        fill(
            ptr,
            s,
            p.pd.context,
            qp_context,
            pd,
            (send_cq, recv_cq),
            qpn,
            ty,
            t,
            QpInner::Plain(inner),
            real.max_inline_data as usize,
        );
        (*ptr).vqp.qp_ex.qp_base.srq = srq;
        (&raw mut (*ptr).srq).write(psrq);
    }
    Box::into_raw(b).cast()
}

/// Fill a new QP's libibverbs fields and our own (its SRQ pointer null).
///
/// # Safety
/// `ptr` is a zeroed `ProvQp` that nothing else sees yet.
#[allow(clippy::too_many_arguments)]
pub unsafe fn fill(
    ptr: *mut ProvQp,
    s: &crate::device::CtxState,
    context: *mut ibv_context,
    qp_context: *mut core::ffi::c_void,
    pd: *mut ibv_pd,
    (send_cq, recv_cq): (*mut ibv_cq, *mut ibv_cq),
    qpn: u32,
    ty: u32,
    t: mlx5::QpType,
    inner: QpInner,
    max_inline: usize,
) {
    // SAFETY: per the contract.
    unsafe {
        let q = &mut (*ptr).vqp.qp_ex.qp_base;
        q.context = context;
        q.qp_context = qp_context;
        q.pd = pd;
        q.send_cq = send_cq;
        q.recv_cq = recv_cq;
        q.qp_num = qpn;
        q.state = 0;
        q.qp_type = ty;
        init_mutex_cond(&raw mut q.mutex, &raw mut q.cond);
        (&raw mut (*ptr).sq_lock).write(Lock::new(s.single_threaded));
        (&raw mut (*ptr).rq_lock).write(Lock::new(s.single_threaded));
        (&raw mut (*ptr).qp_type).write(t);
        (&raw mut (*ptr).srq).write(core::ptr::null_mut());
        (&raw mut (*ptr).inner).write(UnsafeCell::new(inner));
        (&raw mut (*ptr).pending).write(UnsafeCell::new(crate::wr::Pending::new(max_inline)));
    }
}

unsafe extern "C" fn create_qp(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp {
    guard("create_qp", || {
        // SAFETY: the caller's live attribute struct.
        let a = unsafe { &mut *attr };
        create(
            pd,
            a.qp_context,
            a.send_cq,
            a.recv_cq,
            a.srq,
            &mut a.cap,
            a.qp_type,
            a.sq_sig_all != 0,
        )
    })
}

const IBV_QP_INIT_ATTR_PD: u32 = 1;

unsafe extern "C" fn create_qp_ex(
    c: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    guard("create_qp_ex", || {
        // SAFETY: the caller's live attribute struct.
        let a = unsafe { &mut *attr };
        // SAFETY: `c` is ours.
        let s = unsafe { st(c) };
        if a.qp_type == crate::xrc::IBV_QPT_XRC_RECV {
            if a.comp_mask != crate::xrc::IBV_QP_INIT_ATTR_XRCD {
                if s.log {
                    eprintln!(
                        "libmlx5rs: {}: create_qp_ex: an XRC_RECV QP takes comp_mask XRCD alone, not {:#x}",
                        s.name, a.comp_mask
                    );
                }
                set_errno(libc::EINVAL);
                return core::ptr::null_mut();
            }
            return crate::xrc::create_recv(c, a);
        }
        let known = IBV_QP_INIT_ATTR_PD | crate::fast::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 || a.comp_mask & !known != 0 || a.pd.is_null() {
            if s.log {
                eprintln!(
                    "libmlx5rs: {}: create_qp_ex: comp_mask {:#x} not served (PD and SEND_OPS_FLAGS are)",
                    s.name, a.comp_mask
                );
            }
            set_errno(libc::EOPNOTSUPP);
            return core::ptr::null_mut();
        }
        let ops = if a.comp_mask & crate::fast::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0 {
            a.send_ops_flags
        } else {
            0
        };
        if ops & !crate::fast::SERVED_SEND_OPS != 0 {
            if s.log {
                eprintln!(
                    "libmlx5rs: {}: create_qp_ex: send_ops_flags {ops:#x} not served",
                    s.name
                );
            }
            set_errno(libc::EOPNOTSUPP);
            return core::ptr::null_mut();
        }
        let q = create(
            a.pd,
            a.qp_context,
            a.send_cq,
            a.recv_cq,
            a.srq,
            &mut a.cap,
            a.qp_type,
            a.sq_sig_all != 0,
        );
        if !q.is_null() && ops != 0 {
            // SAFETY: `q` is the QP just made.
            unsafe { crate::fast::install_wr_ops(q.cast::<ProvQp>()) };
        }
        q
    })
}

unsafe extern "C" fn destroy_qp(qp: *mut ibv_qp) -> c_int {
    guard("destroy_qp", || {
        // SAFETY: `qp` is ours, from create_qp, handed back once.
        let mut b = unsafe { Box::from_raw(qp.cast::<ProvQp>()) };
        if let QpInner::XrcRecv(_, d) = b.inner.get_mut() {
            // A target QP has no queues of ours and no CQ.
            let d = *d;
            drop(b);
            // SAFETY: the domain the QP counted in, alive while it counts it.
            unsafe { crate::xrc::release(d) };
            return 0;
        }
        // Dropping the QP touches its CQs' tables: hold their locks (an XRC initiator's
        // receive side is its send CQ).
        let (s, r) = (b.vqp.qp_ex.qp_base.send_cq, b.vqp.qp_ex.qp_base.recv_cq);
        let r = if r.is_null() { s } else { r };
        // SAFETY: the CQs outlive their QPs (libibverbs refuses to destroy a CQ in use... and
        // the kernel does too).
        let (scq, rcq) = unsafe { (cq_of(s), cq_of(r)) };
        let _g1 = scq.lock.lock();
        let _g2 = (!core::ptr::eq(scq, rcq)).then(|| rcq.lock.lock());
        drop(b);
        0
    })
}

const IBV_QP_CUR_STATE: u32 = 1 << 1;
const IBV_QP_EN_SQD_ASYNC_NOTIFY: u32 = 1 << 2;
const IBV_QP_PATH_MTU: u32 = 1 << 8;

unsafe extern "C" fn modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int {
    guard("modify_qp", || {
        // SAFETY: `qp` is ours; `attr` the caller's.
        let (p, a) = unsafe { (qp_of(qp), &*attr) };
        // SAFETY: the QP's context is ours.
        let s = unsafe { st(p.vqp.qp_ex.qp_base.context) };
        let mask = (mask as u32) & !(IBV_QP_CUR_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY);
        let state = if mask & 1 != 0 {
            match state_from(a.qp_state) {
                Some(st) => Some(st),
                None => return libc::EINVAL,
            }
        } else {
            None
        };
        let path_mtu = if mask & IBV_QP_PATH_MTU != 0 {
            match mlx5::Mtu::try_from(a.path_mtu as u8) {
                Ok(m) => Some(m),
                Err(_) => return libc::EINVAL,
            }
        } else {
            None
        };
        let qa = mlx5::QpAttr {
            qp_state: state,
            path_mtu,
            qkey: a.qkey,
            rq_psn: a.rq_psn,
            sq_psn: a.sq_psn,
            dest_qp_num: a.dest_qp_num,
            qp_access_flags: mlx5::Access(a.qp_access_flags),
            pkey_index: a.pkey_index,
            port_num: a.port_num,
            max_rd_atomic: a.max_rd_atomic,
            max_dest_rd_atomic: a.max_dest_rd_atomic,
            min_rnr_timer: a.min_rnr_timer,
            timeout: a.timeout,
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
            ah_attr: ah_attr(&a.ah_attr),
        };
        let _g1 = p.sq_lock.lock();
        let _g2 = p.rq_lock.lock();
        // SAFETY: exclusive under both queue locks.
        let r = unsafe { (*p.inner.get()).modify(&qa, mask) };
        match r {
            Ok(()) => 0,
            Err(e) => errno_of(s, "modify_qp", &e),
        }
    })
}

unsafe extern "C" fn query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    guard("query_qp", || {
        // SAFETY: `qp` is ours.
        let p = unsafe { qp_of(qp) };
        // SAFETY: the QP's context is ours.
        let s = unsafe { st(p.vqp.qp_ex.qp_base.context) };
        let _g1 = p.sq_lock.lock();
        // SAFETY: shared access under the send lock (query reads, the kernel answers).
        let r = unsafe { (*p.inner.get()).query_attr() };
        let (state, qa, cap) = match r {
            Ok(x) => x,
            Err(e) => return errno_of(s, "query_qp", &e),
        };
        let cap = ibv_qp_cap {
            max_send_wr: cap.max_send_wr,
            max_recv_wr: cap.max_recv_wr,
            max_send_sge: cap.max_send_sge,
            max_recv_sge: cap.max_recv_sge,
            max_inline_data: cap.max_inline_data,
        };
        let a = ibv_qp_attr {
            qp_state: state_to(state),
            cur_qp_state: state_to(state),
            path_mtu: qa.path_mtu.map_or(0, |m| u32::from(m.code())),
            qkey: qa.qkey,
            rq_psn: qa.rq_psn,
            sq_psn: qa.sq_psn,
            dest_qp_num: qa.dest_qp_num,
            qp_access_flags: qa.qp_access_flags.0,
            cap,
            ah_attr: to_ibv_ah_attr(&qa.ah_attr),
            pkey_index: qa.pkey_index,
            max_rd_atomic: qa.max_rd_atomic,
            max_dest_rd_atomic: qa.max_dest_rd_atomic,
            min_rnr_timer: qa.min_rnr_timer,
            port_num: qa.port_num,
            timeout: qa.timeout,
            retry_cnt: qa.retry_cnt,
            rnr_retry: qa.rnr_retry,
            ..ibv_qp_attr::default()
        };
        let q = &p.vqp.qp_ex.qp_base;
        // SAFETY: the caller's output structs.
        unsafe {
            attr.write(a);
            if !init.is_null() {
                init.write(ibv_qp_init_attr {
                    qp_context: q.qp_context,
                    send_cq: q.send_cq,
                    recv_cq: q.recv_cq,
                    srq: q.srq,
                    cap,
                    qp_type: q.qp_type,
                    sq_sig_all: 0,
                });
            }
        }
        0
    })
}

pub fn fill_ops(s: &mut [Fp; VERBS_CONTEXT_OPS_SLOTS]) {
    op!(
        s,
        "create_qp",
        create_qp,
        unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp
    );
    op!(
        s,
        "create_qp_ex",
        create_qp_ex,
        unsafe extern "C" fn(*mut ibv_context, *mut ibv_qp_init_attr_ex) -> *mut ibv_qp
    );
    op!(
        s,
        "destroy_qp",
        destroy_qp,
        unsafe extern "C" fn(*mut ibv_qp) -> c_int
    );
    op!(
        s,
        "modify_qp",
        modify_qp,
        unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int
    );
    op!(
        s,
        "query_qp",
        query_qp,
        unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int, *mut ibv_qp_init_attr) -> c_int
    );
}
