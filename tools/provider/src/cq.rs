//! Completion queues: `ibv_create_cq` (with a completion channel), arming, events, destroy.

use core::cell::UnsafeCell;
use core::ffi::{c_int, c_void};
use core::mem::MaybeUninit;
use std::os::fd::FromRawFd;
use std::sync::Arc;

use crate::abi::*;
use crate::device::{errno_of, op, set_errno, state};
use crate::fast::Lock;
use crate::guard;

/// Our CQ: the `ibv_cq_ex` (whose head is the `ibv_cq`) first.
#[repr(C)]
pub struct ProvCq {
    pub cq: ibv_cq_ex,
    pub lock: Lock,
    pub inner: UnsafeCell<mlx5::Cq>,
}

/// # Safety
/// `cq` is a CQ of ours.
pub unsafe fn cq_of<'a>(cq: *mut ibv_cq) -> &'a ProvCq {
    // SAFETY: our CQs are `ProvCq` with the ibv_cq at offset 0.
    unsafe { &*cq.cast::<ProvCq>() }
}

unsafe extern "C" fn create_cq(
    c: *mut ibv_context,
    cqe: c_int,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    guard("create_cq", || {
        // SAFETY: `c` is ours.
        let s = unsafe { state(c) };
        if cqe <= 0 || comp_vector < 0 {
            if s.log {
                eprintln!(
                    "libmlx5rs: {}: create_cq: cqe {cqe} and comp_vector {comp_vector} must be positive",
                    s.name
                );
            }
            set_errno(libc::EINVAL);
            return core::ptr::null_mut();
        }
        let ch = if channel.is_null() {
            None
        } else {
            // SAFETY: libibverbs' live channel; its fd stays open while a CQ uses it
            // (ibv_destroy_comp_channel refuses a channel with CQs). The crate's channel
            // would close the fd on drop, so one clone is leaked: it is libibverbs' fd.
            let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd((*channel).fd) };
            let ch = Arc::new(mlx5::CompChannel::from_fd(&s.ctx, fd));
            core::mem::forget(ch.clone());
            Some(ch)
        };
        let mut b: Box<MaybeUninit<ProvCq>> = Box::new(MaybeUninit::zeroed());
        let ptr = b.as_mut_ptr();
        let init = mlx5::CqInit {
            cqe: cqe as u32,
            cqe_size: 64,
            comp_vector: comp_vector as u32,
        };
        let made = mlx5::with_user_handle(ptr as u64, || mlx5::Cq::new(&s.ctx, init, ch.as_ref()));
        match made {
            Ok(inner) => {
                let cap = inner.capacity();
                // SAFETY: the box is zeroed (a valid ibv_cq_ex: null pointers, zero counts,
                // pthread objects that verbs_init_cq initializes); we write the Rust fields.
                unsafe {
                    (*ptr).cq.cq.cqe = cap as c_int;
                    (&raw mut (*ptr).lock).write(Lock::new(s.single_threaded));
                    (&raw mut (*ptr).inner).write(UnsafeCell::new(inner));
                }
                Box::into_raw(b).cast()
            }
            Err(e) => {
                set_errno(errno_of(s, "create_cq", &e));
                core::ptr::null_mut()
            }
        }
    })
}

unsafe extern "C" fn destroy_cq(cq: *mut ibv_cq) -> c_int {
    guard("destroy_cq", || {
        // SAFETY: `cq` is ours, from create_cq, handed back once.
        drop(unsafe { Box::from_raw(cq.cast::<ProvCq>()) });
        0
    })
}

unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    // SAFETY: `cq` is ours.
    let p = unsafe { cq_of(cq) };
    let _g = p.lock.lock();
    // SAFETY: exclusive under the CQ lock (or by the single-threaded promise).
    unsafe { (*p.inner.get()).req_notify(solicited_only != 0) };
    0
}

unsafe extern "C" fn cq_event(cq: *mut ibv_cq) {
    // SAFETY: `cq` is ours.
    let p = unsafe { cq_of(cq) };
    let _g = p.lock.lock();
    // SAFETY: exclusive under the CQ lock.
    unsafe { (*p.inner.get()).event_received() };
}

pub fn fill_ops(s: &mut [Fp; VERBS_CONTEXT_OPS_SLOTS]) {
    op!(
        s,
        "create_cq",
        create_cq,
        unsafe extern "C" fn(*mut ibv_context, c_int, *mut ibv_comp_channel, c_int) -> *mut ibv_cq
    );
    op!(
        s,
        "destroy_cq",
        destroy_cq,
        unsafe extern "C" fn(*mut ibv_cq) -> c_int
    );
    op!(
        s,
        "req_notify_cq",
        req_notify_cq,
        unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int
    );
    op!(s, "cq_event", cq_event, unsafe extern "C" fn(*mut ibv_cq));
    let _ = core::ptr::null::<c_void>();
}
