//! Completion queues: `ibv_create_cq` (with a completion channel), arming, events, destroy.

use core::cell::UnsafeCell;
use core::ffi::c_int;
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
    /// The completion `start_poll`/`next_poll` stand on (under the lock until `end_poll`).
    pub cur: UnsafeCell<mlx5::WorkCompletion>,
    /// `ibv_poll_cq` of more than one entry polls into this first (under the lock).
    pub batch: UnsafeCell<[mlx5::WorkCompletion; POLL_BATCH]>,
}

/// Completions one `Cq::poll` call of `ibv_poll_cq` takes at most.
pub const POLL_BATCH: usize = 16;

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
    guard("create_cq", || make(c, cqe, channel, comp_vector).cast())
}

/// The `ibv_wc_flags` fields `create_cq_ex` serves (`read_*` functions).
const SERVED_WC_FLAGS: u64 = 0xff; // BYTE_LEN IMM QP_NUM SRC_QP SLID SL DLID_PATH_BITS COMPLETION_TIMESTAMP

unsafe extern "C" fn create_cq_ex(
    c: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    guard("create_cq_ex", || {
        // SAFETY: the caller's live attribute struct; `c` is ours.
        let (a, s) = unsafe { (&*attr, state(c)) };
        if a.wc_flags & !SERVED_WC_FLAGS != 0 || a.comp_mask != 0 {
            if s.log {
                eprintln!(
                    "libmlx5rs: {}: create_cq_ex: wc_flags {:#x} / comp_mask {:#x} not served \
                     (wc_flags {SERVED_WC_FLAGS:#x}, no comp_mask)",
                    s.name, a.wc_flags, a.comp_mask
                );
            }
            set_errno(libc::EOPNOTSUPP);
            return core::ptr::null_mut();
        }
        let cq = make(c, a.cqe as c_int, a.channel, a.comp_vector as c_int);
        if cq.is_null() {
            return cq.cast();
        }
        // SAFETY: the CQ just made; nothing else sees it yet.
        let x = unsafe { &mut (*cq).cq };
        x.start_poll = Some(start_poll);
        x.next_poll = Some(next_poll);
        x.end_poll = Some(end_poll);
        x.read_opcode = Some(read_opcode);
        x.read_vendor_err = Some(read_vendor_err);
        x.read_byte_len = Some(read_byte_len);
        x.read_imm_data = Some(read_imm_data);
        x.read_qp_num = Some(read_qp_num);
        x.read_src_qp = Some(read_src_qp);
        x.read_wc_flags = Some(read_wc_flags);
        x.read_slid = Some(read_slid);
        x.read_sl = Some(read_sl);
        x.read_dlid_path_bits = Some(read_dlid_path_bits);
        x.read_completion_ts = Some(read_completion_ts);
        x
    })
}

/// The current completion of an extended poll.
///
/// # Safety
/// `x` is a CQ of ours between `start_poll` (returning 0) and `end_poll`.
#[inline(always)]
unsafe fn cur<'a>(x: *mut ibv_cq_ex) -> &'a mlx5::WorkCompletion {
    // SAFETY: per the contract (the lock is held by start_poll).
    unsafe { &*(*x.cast::<ProvCq>()).cur.get() }
}

/// Poll one completion into `cur`; ENOENT if none.
#[inline(always)]
unsafe fn step(x: *mut ibv_cq_ex) -> c_int {
    // SAFETY: our CQ, under its lock.
    let p = unsafe { &*x.cast::<ProvCq>() };
    // SAFETY: under the lock.
    let (inner, cur) = unsafe { (&mut *p.inner.get(), &mut *p.cur.get()) };
    if inner.poll(core::slice::from_mut(cur)) == 0 {
        return libc::ENOENT;
    }
    // SAFETY: `x` is live; libibverbs' inline readers take these two from the struct.
    unsafe {
        (*x).status = cur.status.0;
        (*x).wr_id = cur.wr_id;
    }
    0
}

unsafe extern "C" fn start_poll(x: *mut ibv_cq_ex, _attr: *mut ibv_poll_cq_attr) -> c_int {
    // SAFETY: our CQ.
    let p = unsafe { &*x.cast::<ProvCq>() };
    p.lock.lock_raw();
    // SAFETY: under the lock just taken.
    let r = unsafe { step(x) };
    if r != 0 {
        // No completion: the application does not call end_poll.
        p.lock.unlock();
    }
    r
}

unsafe extern "C" fn next_poll(x: *mut ibv_cq_ex) -> c_int {
    // SAFETY: between start_poll and end_poll.
    unsafe { step(x) }
}

unsafe extern "C" fn end_poll(x: *mut ibv_cq_ex) {
    // SAFETY: our CQ, whose lock start_poll took.
    unsafe { (*x.cast::<ProvCq>()).lock.unlock() };
}

unsafe extern "C" fn read_opcode(x: *mut ibv_cq_ex) -> u32 {
    // SAFETY: between start_poll and end_poll.
    unsafe { cur(x) }.opcode.0
}
unsafe extern "C" fn read_vendor_err(x: *mut ibv_cq_ex) -> u32 {
    // SAFETY: between start_poll and end_poll.
    u32::from(unsafe { cur(x) }.vendor_err.0)
}
unsafe extern "C" fn read_byte_len(x: *mut ibv_cq_ex) -> u32 {
    // SAFETY: between start_poll and end_poll.
    unsafe { cur(x) }.byte_len
}
unsafe extern "C" fn read_imm_data(x: *mut ibv_cq_ex) -> u32 {
    // SAFETY: between start_poll and end_poll.
    crate::fast::to_ibv_wc(unsafe { cur(x) }).imm_data
}
unsafe extern "C" fn read_qp_num(x: *mut ibv_cq_ex) -> u32 {
    // SAFETY: between start_poll and end_poll.
    unsafe { cur(x) }.qp_num
}
unsafe extern "C" fn read_src_qp(x: *mut ibv_cq_ex) -> u32 {
    // SAFETY: between start_poll and end_poll.
    unsafe { cur(x) }.src_qp
}
unsafe extern "C" fn read_wc_flags(x: *mut ibv_cq_ex) -> u32 {
    // SAFETY: between start_poll and end_poll.
    unsafe { cur(x) }.wc_flags.0 & 0x7f
}
unsafe extern "C" fn read_slid(x: *mut ibv_cq_ex) -> u32 {
    // SAFETY: between start_poll and end_poll.
    u32::from(unsafe { cur(x) }.slid)
}
unsafe extern "C" fn read_sl(x: *mut ibv_cq_ex) -> u8 {
    // SAFETY: between start_poll and end_poll.
    unsafe { cur(x) }.sl
}
unsafe extern "C" fn read_dlid_path_bits(x: *mut ibv_cq_ex) -> u8 {
    // SAFETY: between start_poll and end_poll.
    unsafe { cur(x) }.dlid_path_bits
}
unsafe extern "C" fn read_completion_ts(x: *mut ibv_cq_ex) -> u64 {
    // SAFETY: between start_poll and end_poll. Raw HCA clock ticks, as libmlx5 reports.
    unsafe { cur(x) }.timestamp
}

fn make(
    c: *mut ibv_context,
    cqe: c_int,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ProvCq {
    {
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
                    (&raw mut (*ptr).cur).write(UnsafeCell::new(mlx5::WorkCompletion::default()));
                    (&raw mut (*ptr).batch).write(UnsafeCell::new(
                        [mlx5::WorkCompletion::default(); POLL_BATCH],
                    ));
                }
                Box::into_raw(b).cast()
            }
            Err(e) => {
                set_errno(errno_of(s, "create_cq", &e));
                core::ptr::null_mut()
            }
        }
    }
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
    op!(
        s,
        "create_cq_ex",
        create_cq_ex,
        unsafe extern "C" fn(*mut ibv_context, *mut ibv_cq_init_attr_ex) -> *mut ibv_cq_ex
    );
}
