//! PD, MR, SRQ and AH: libibverbs' struct first, the `mlx5` object after it.

use core::cell::UnsafeCell;
use core::ffi::{c_int, c_void};
use core::mem::MaybeUninit;

use crate::abi::*;
use crate::device::{CtxState, errno_of, op, set_errno, state};
use crate::fast::Lock;
use crate::guard;

#[repr(C)]
pub struct ProvPd {
    pub pd: ibv_pd,
    pub inner: mlx5::Pd,
}

#[repr(C)]
pub struct ProvMr {
    pub vmr: verbs_mr,
    pub inner: mlx5::Mr,
}

/// Our SRQ: libibverbs' `verbs_srq` (whose head is the `ibv_srq`) first.
#[repr(C)]
pub struct ProvSrq {
    pub srq: verbs_srq,
    pub lock: Lock,
    pub inner: UnsafeCell<SrqInner>,
}

/// A basic SRQ, or an XRC SRQ with the domain it counts in.
pub enum SrqInner {
    Basic(mlx5::Srq),
    Xrc(mlx5::XrcSrq, *mut crate::xrc::ProvXrcd),
}

impl SrqInner {
    #[inline(always)]
    pub fn post_recv(&mut self, wrs: &[mlx5::RecvWr<'_>]) -> Result<(), (usize, mlx5::PostError)> {
        match self {
            SrqInner::Basic(s) => s.post_recv(wrs),
            SrqInner::Xrc(s, _) => s.post_recv(wrs),
        }
    }

    pub fn capacity(&self) -> u32 {
        match self {
            SrqInner::Basic(s) => s.capacity(),
            SrqInner::Xrc(s, _) => s.capacity(),
        }
    }
}

#[repr(C)]
pub struct ProvAh {
    pub ah: ibv_ah,
    pub inner: mlx5::Ah,
}

/// # Safety
/// `pd` is a PD of ours.
pub unsafe fn pd_of<'a>(pd: *mut ibv_pd) -> &'a ProvPd {
    // SAFETY: our PDs are `ProvPd` with the ibv_pd at offset 0.
    unsafe { &*pd.cast::<ProvPd>() }
}

/// The context state of an object's `context` pointer.
///
/// # Safety
/// `c` is a context of ours.
pub unsafe fn st<'a>(c: *mut ibv_context) -> &'a CtxState {
    // SAFETY: per the contract.
    unsafe { state(c) }
}

fn zeroed<T>() -> T {
    // SAFETY: used only for libibverbs' plain-C structs (integers, pointers, pthread
    // objects that are initialized before use), for which all-zero is a valid value.
    unsafe { MaybeUninit::zeroed().assume_init() }
}

pub fn init_mutex_cond(m: *mut libc::pthread_mutex_t, c: *mut libc::pthread_cond_t) {
    // SAFETY: both point into a freshly made object that nothing else sees yet.
    unsafe {
        libc::pthread_mutex_init(m, core::ptr::null());
        libc::pthread_cond_init(c, core::ptr::null());
    }
}

unsafe extern "C" fn alloc_pd(c: *mut ibv_context) -> *mut ibv_pd {
    guard("alloc_pd", || {
        // SAFETY: `c` is ours.
        let s = unsafe { st(c) };
        match mlx5::Pd::new(&s.ctx) {
            Ok(inner) => {
                let b = Box::new(ProvPd {
                    pd: ibv_pd {
                        context: c,
                        handle: 0,
                    },
                    inner,
                });
                Box::into_raw(b).cast()
            }
            Err(e) => {
                set_errno(errno_of(s, "alloc_pd", &e));
                core::ptr::null_mut()
            }
        }
    })
}

unsafe extern "C" fn dealloc_pd(pd: *mut ibv_pd) -> c_int {
    guard("dealloc_pd", || {
        // SAFETY: `pd` is ours, made by alloc_pd; libibverbs hands it back once.
        drop(unsafe { Box::from_raw(pd.cast::<ProvPd>()) });
        0
    })
}

unsafe extern "C" fn reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    hca_va: u64,
    access: c_int,
) -> *mut ibv_mr {
    guard("reg_mr", || {
        // SAFETY: `pd` is ours.
        let p = unsafe { pd_of(pd) };
        // SAFETY: the PD's context is ours.
        let s = unsafe { st(p.pd.context) };
        if hca_va != addr as u64 {
            if s.log {
                eprintln!(
                    "libmlx5rs: {}: reg_mr: an iova other than the address is not served",
                    s.name
                );
            }
            set_errno(libc::EOPNOTSUPP);
            return core::ptr::null_mut();
        }
        // SAFETY: the application registers memory it owns for the device to use, the
        // verbs contract of ibv_reg_mr; the kernel pins and checks the range.
        let mem = unsafe { mlx5::UserMemory::from_raw_parts(addr.cast(), length) };
        match p.inner.reg_user_mr(mem, mlx5::Access(access as u32)) {
            Ok(inner) => {
                let b = Box::new(ProvMr {
                    vmr: verbs_mr {
                        ibv_mr: ibv_mr {
                            context: p.pd.context,
                            pd,
                            addr,
                            length,
                            handle: 0,
                            lkey: inner.lkey(),
                            rkey: inner.rkey(),
                        },
                        mr_type: 0,
                        access,
                    },
                    inner,
                });
                Box::into_raw(b).cast()
            }
            Err(e) => {
                set_errno(errno_of(s, "reg_mr", &e));
                core::ptr::null_mut()
            }
        }
    })
}

unsafe extern "C" fn dereg_mr(vmr: *mut verbs_mr) -> c_int {
    guard("dereg_mr", || {
        // SAFETY: `vmr` is ours, from reg_mr.
        drop(unsafe { Box::from_raw(vmr.cast::<ProvMr>()) });
        0
    })
}

unsafe extern "C" fn create_srq(pd: *mut ibv_pd, attr: *mut ibv_srq_init_attr) -> *mut ibv_srq {
    // SAFETY: the caller's live attribute struct.
    guard("create_srq", || create_srq_basic(pd, unsafe { &mut *attr }))
}

/// A basic SRQ (`ibv_create_srq`, or `ibv_create_srq_ex` of type BASIC).
pub fn create_srq_basic(pd: *mut ibv_pd, a: &mut ibv_srq_init_attr) -> *mut ibv_srq {
    // SAFETY: `pd` is ours.
    let p = unsafe { pd_of(pd) };
    // SAFETY: the PD's context is ours.
    let s = unsafe { st(p.pd.context) };
    let mut b: Box<MaybeUninit<ProvSrq>> = Box::new(MaybeUninit::uninit());
    let ptr = b.as_mut_ptr();
    let made = mlx5::with_user_handle(ptr as u64, || {
        mlx5::Srq::new(&p.inner, a.attr.max_wr, a.attr.max_sge)
    });
    match made {
        Ok(inner) => {
            a.attr.max_wr = inner.capacity();
            let mut srq: verbs_srq = zeroed();
            srq.srq.context = p.pd.context;
            srq.srq.pd = pd;
            srq.srq.srq_context = a.srq_context;
            srq.srq_num = inner.srqn();
            b.write(ProvSrq {
                srq,
                lock: Lock::new(s.single_threaded),
                inner: UnsafeCell::new(SrqInner::Basic(inner)),
            });
            let ptr = Box::into_raw(b).cast::<ProvSrq>();
            // SAFETY: the SRQ just made; its mutex and condition variable are initialized
            // in place (where they stay).
            unsafe { init_mutex_cond(&raw mut (*ptr).srq.srq.mutex, &raw mut (*ptr).srq.srq.cond) };
            ptr.cast()
        }
        Err(e) => {
            set_errno(errno_of(s, "create_srq", &e));
            core::ptr::null_mut()
        }
    }
}

unsafe extern "C" fn destroy_srq(srq: *mut ibv_srq) -> c_int {
    guard("destroy_srq", || {
        // SAFETY: `srq` is ours, from create_srq or create_srq_ex, handed back once.
        let mut b = unsafe { Box::from_raw(srq.cast::<ProvSrq>()) };
        let xrc = match b.inner.get_mut() {
            SrqInner::Basic(_) => None,
            SrqInner::Xrc(_, d) => Some(*d),
        };
        match xrc {
            None => drop(b),
            Some(d) => {
                // Dropping an XRC SRQ unroutes it from its CQ: hold the CQ's lock.
                // SAFETY: the CQ outlives the SRQ (the kernel refuses to destroy it before).
                let cq = unsafe { crate::cq::cq_of(b.srq.cq) };
                let g = cq.lock.lock();
                drop(b);
                drop(g);
                // SAFETY: the domain the SRQ counted in, alive while it counts it.
                unsafe { crate::xrc::release(d) };
            }
        }
        0
    })
}

unsafe extern "C" fn query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    guard("query_srq", || {
        // SAFETY: `srq` is ours; `attr` the caller's.
        let s = unsafe { &*srq.cast::<ProvSrq>() };
        let _g = s.lock.lock();
        // SAFETY: under the SRQ lock (or single-threaded by the application's promise).
        let inner = unsafe { &*s.inner.get() };
        // SAFETY: the caller's attribute struct.
        unsafe {
            attr.write(ibv_srq_attr {
                max_wr: inner.capacity(),
                max_sge: (*attr).max_sge,
                srq_limit: 0,
            })
        };
        0
    })
}

unsafe extern "C" fn create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    guard("create_ah", || {
        // SAFETY: `pd` is ours; `attr` the caller's.
        let (p, a) = unsafe { (pd_of(pd), &*attr) };
        // SAFETY: the PD's context is ours.
        let s = unsafe { st(p.pd.context) };
        match mlx5::Ah::new(&p.inner, ah_attr(a)) {
            Ok(inner) => Box::into_raw(Box::new(ProvAh {
                ah: ibv_ah {
                    context: p.pd.context,
                    pd,
                    handle: 0,
                },
                inner,
            }))
            .cast(),
            Err(e) => {
                set_errno(errno_of(s, "create_ah", &e));
                core::ptr::null_mut()
            }
        }
    })
}

unsafe extern "C" fn destroy_ah(ah: *mut ibv_ah) -> c_int {
    guard("destroy_ah", || {
        // SAFETY: `ah` is ours, from create_ah.
        drop(unsafe { Box::from_raw(ah.cast::<ProvAh>()) });
        0
    })
}

/// `ibv_ah_attr` as the crate's `AhAttr`.
pub fn ah_attr(a: &ibv_ah_attr) -> mlx5::AhAttr {
    mlx5::AhAttr {
        dlid: a.dlid,
        sl: a.sl,
        src_path_bits: a.src_path_bits,
        static_rate: a.static_rate,
        port_num: a.port_num,
        grh: (a.is_global != 0).then_some(mlx5::GlobalRoute {
            dgid: a.grh.dgid,
            flow_label: a.grh.flow_label,
            sgid_index: a.grh.sgid_index,
            hop_limit: a.grh.hop_limit,
            traffic_class: a.grh.traffic_class,
        }),
    }
}

/// The crate's `AhAttr` as `ibv_ah_attr`.
pub fn to_ibv_ah_attr(a: &mlx5::AhAttr) -> ibv_ah_attr {
    let g = a.grh.unwrap_or_default();
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: g.dgid,
            flow_label: g.flow_label,
            sgid_index: g.sgid_index,
            hop_limit: g.hop_limit,
            traffic_class: g.traffic_class,
        },
        dlid: a.dlid,
        sl: a.sl,
        src_path_bits: a.src_path_bits,
        static_rate: a.static_rate,
        is_global: u8::from(a.grh.is_some()),
        port_num: a.port_num,
    }
}

pub fn fill_ops(s: &mut [Fp; VERBS_CONTEXT_OPS_SLOTS]) {
    type Pd = *mut ibv_pd;
    op!(
        s,
        "alloc_pd",
        alloc_pd,
        unsafe extern "C" fn(*mut ibv_context) -> Pd
    );
    op!(
        s,
        "dealloc_pd",
        dealloc_pd,
        unsafe extern "C" fn(Pd) -> c_int
    );
    op!(
        s,
        "reg_mr",
        reg_mr,
        unsafe extern "C" fn(Pd, *mut c_void, usize, u64, c_int) -> *mut ibv_mr
    );
    op!(
        s,
        "dereg_mr",
        dereg_mr,
        unsafe extern "C" fn(*mut verbs_mr) -> c_int
    );
    op!(
        s,
        "create_srq",
        create_srq,
        unsafe extern "C" fn(Pd, *mut ibv_srq_init_attr) -> *mut ibv_srq
    );
    op!(
        s,
        "destroy_srq",
        destroy_srq,
        unsafe extern "C" fn(*mut ibv_srq) -> c_int
    );
    op!(
        s,
        "query_srq",
        query_srq,
        unsafe extern "C" fn(*mut ibv_srq, *mut ibv_srq_attr) -> c_int
    );
    op!(
        s,
        "create_ah",
        create_ah,
        unsafe extern "C" fn(Pd, *mut ibv_ah_attr) -> *mut ibv_ah
    );
    op!(
        s,
        "destroy_ah",
        destroy_ah,
        unsafe extern "C" fn(*mut ibv_ah) -> c_int
    );
}
