//! The data path through the C ABI: `ibv_post_send`, `ibv_post_recv`, `ibv_post_srq_recv` and
//! `ibv_poll_cq` (inline functions of `verbs.h` that call these through `context->ops`).
//!
//! Each C work request is translated as it is read, straight into the crate's WQE builder
//! (one doorbell per chain); each completion is decoded by the crate's CQE parser into one
//! `WorkCompletion` on the stack and written to the caller's `ibv_wc`. Nothing allocates,
//! nothing searches. The locks are libmlx5's: a spinlock per send queue, receive queue, SRQ
//! and CQ, not taken at all under `MLX5_SINGLE_THREADED=1`.

use core::ffi::c_int;
use core::sync::atomic::{AtomicBool, Ordering};

use mlx5::{PostError, SendFlags, Sge, WorkCompletion};

use crate::abi::*;
use crate::cq::cq_of;
use crate::device::op;
use crate::objects::{ProvAh, ProvSrq};
use crate::qp::{ProvQp, qp_of};

pub const IBV_QP_INIT_ATTR_SEND_OPS_FLAGS: u32 = 1 << 6;
/// The `send_ops_flags` served by the `ibv_wr_*` functions (none yet: see docs/provider.md).
pub const SERVED_SEND_OPS: u64 = 0;

/// A spinlock, or nothing under `MLX5_SINGLE_THREADED=1`.
#[derive(Debug)]
pub struct Lock {
    taken: AtomicBool,
    off: bool,
}

/// Holds a [`Lock`] until dropped.
pub struct Guard<'a>(&'a Lock);

impl Lock {
    pub fn new(single_threaded: bool) -> Lock {
        Lock {
            taken: AtomicBool::new(false),
            off: single_threaded,
        }
    }

    #[inline(always)]
    pub fn lock(&self) -> Guard<'_> {
        if !self.off {
            while self
                .taken
                .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                core::hint::spin_loop();
            }
        }
        Guard(self)
    }
}

impl Drop for Guard<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        if !self.0.off {
            self.0.taken.store(false, Ordering::Release);
        }
    }
}

pub const IBV_WR_RDMA_WRITE: u32 = 0;
pub const IBV_WR_RDMA_WRITE_WITH_IMM: u32 = 1;
pub const IBV_WR_SEND: u32 = 2;
pub const IBV_WR_SEND_WITH_IMM: u32 = 3;
pub const IBV_WR_RDMA_READ: u32 = 4;
pub const IBV_WR_ATOMIC_CMP_AND_SWP: u32 = 5;
pub const IBV_WR_ATOMIC_FETCH_AND_ADD: u32 = 6;
pub const IBV_WR_SEND_WITH_INV: u32 = 9;
const IBV_SEND_INLINE: u32 = 8;

fn errno_of_post(e: PostError) -> c_int {
    match e {
        PostError::Full { .. } => libc::ENOMEM,
        _ => libc::EINVAL,
    }
}

#[inline(always)]
fn sge(s: &ibv_sge) -> Sge {
    Sge {
        addr: s.addr,
        length: s.length,
        lkey: s.lkey,
    }
}

/// The SGEs of a C work request.
///
/// # Safety
/// `list` points to `n` live `ibv_sge`s (the verbs contract), or `n <= 0`.
#[inline(always)]
unsafe fn sges<'a>(list: *const ibv_sge, n: c_int) -> &'a [ibv_sge] {
    if n <= 0 || list.is_null() {
        &[]
    } else {
        // SAFETY: per the contract.
        unsafe { core::slice::from_raw_parts(list, n as usize) }
    }
}

/// Finish a WQE whose payload may be gathered or inline.
#[inline(always)]
fn payload(
    b: mlx5::WqeBuilder<'_, mlx5::AnyPayload>,
    wr_id: u64,
    list: &[ibv_sge],
    inline: bool,
) -> Result<(), PostError> {
    let Some((first, rest)) = list.split_first() else {
        b.finish(wr_id);
        return Ok(());
    };
    if inline {
        // SAFETY: inline data is read from the application's buffers, as the verbs contract
        // of IBV_SEND_INLINE lets the provider do during the call.
        let bytes = |s: &ibv_sge| unsafe {
            core::slice::from_raw_parts(s.addr as usize as *const u8, s.length as usize)
        };
        let mut b = b.inline(bytes(first))?;
        for s in rest {
            b = b.inline(bytes(s))?;
        }
        b.finish(wr_id);
    } else {
        let mut b = b.sge(&sge(first))?;
        for s in rest {
            b = b.sge(&sge(s))?;
        }
        b.finish(wr_id);
    }
    Ok(())
}

/// One C send WR into the send queue.
#[inline(always)]
fn post_one(q: &ProvQp, sq: &mut mlx5::SendQueue, wr: &ibv_send_wr) -> Result<(), PostError> {
    let flags = SendFlags(wr.send_flags & 0x7);
    let inline = wr.send_flags & IBV_SEND_INLINE != 0;
    // SAFETY: the verbs contract: `sg_list` has `num_sge` entries.
    let list = unsafe { sges(wr.sg_list, wr.num_sge) };
    let imm = wr.imm_data.to_ne_bytes();
    if q.qp_type == mlx5::QpType::Ud {
        // SAFETY: the `ud` member is the live one for UD QPs.
        let ud = unsafe { wr.wr.ud };
        if ud.ah.is_null() {
            return Err(PostError::BadDestination);
        }
        // SAFETY: an AH of ours (the application's, of this context).
        let ah = unsafe { &(*ud.ah.cast::<ProvAh>()).inner };
        let dest = mlx5::UdDest {
            ah,
            remote_qpn: ud.remote_qpn,
            remote_qkey: ud.remote_qkey,
        };
        let imm = match wr.opcode {
            IBV_WR_SEND => None,
            IBV_WR_SEND_WITH_IMM => Some(imm),
            _ => return Err(PostError::BadOpcode),
        };
        let b = sq.send_ud(flags, &dest, imm)?;
        return payload(b, wr.wr_id, list, inline);
    }
    match wr.opcode {
        IBV_WR_SEND => payload(sq.send(flags)?, wr.wr_id, list, inline),
        IBV_WR_SEND_WITH_IMM => payload(sq.send_imm(flags, imm)?, wr.wr_id, list, inline),
        IBV_WR_SEND_WITH_INV => payload(sq.send_inv(flags, wr.imm_data)?, wr.wr_id, list, inline),
        IBV_WR_RDMA_WRITE | IBV_WR_RDMA_WRITE_WITH_IMM => {
            // SAFETY: the `rdma` member is the live one for these opcodes.
            let r = unsafe { wr.wr.rdma };
            let imm = (wr.opcode == IBV_WR_RDMA_WRITE_WITH_IMM).then_some(imm);
            payload(
                sq.write(flags, r.remote_addr, r.rkey, imm)?,
                wr.wr_id,
                list,
                inline,
            )
        }
        IBV_WR_RDMA_READ => {
            // SAFETY: the `rdma` member is the live one for READ.
            let r = unsafe { wr.wr.rdma };
            let b = sq.read(flags, r.remote_addr, r.rkey)?;
            let Some((first, rest)) = list.split_first() else {
                return Err(PostError::TooManySges { n: 0, max: 0 });
            };
            let mut b = b.sge(&sge(first))?;
            for s in rest {
                b = b.sge(&sge(s))?;
            }
            b.finish(wr.wr_id);
            Ok(())
        }
        IBV_WR_ATOMIC_CMP_AND_SWP | IBV_WR_ATOMIC_FETCH_AND_ADD => {
            // SAFETY: the `atomic` member is the live one for atomics.
            let a = unsafe { wr.wr.atomic };
            let Some(result) = list.first() else {
                return Err(PostError::BadAtomicSge);
            };
            let (swap_add, compare) = if wr.opcode == IBV_WR_ATOMIC_CMP_AND_SWP {
                (a.swap, Some(a.compare_add))
            } else {
                (a.compare_add, None)
            };
            let b = sq.atomic(
                flags,
                a.remote_addr,
                a.rkey,
                swap_add,
                compare,
                &sge(result),
            )?;
            b.finish(wr.wr_id);
            Ok(())
        }
        _ => Err(PostError::BadOpcode),
    }
}

unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    mut wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: `qp` is ours.
    let q = unsafe { qp_of(qp) };
    let _g = q.sq_lock.lock();
    // SAFETY: exclusive under the send lock (or by the single-threaded promise).
    let sq = unsafe { (*q.inner.get()).sq() };
    let mut rc = 0;
    while !wr.is_null() {
        // SAFETY: the application's chain of live WRs.
        let w = unsafe { &*wr };
        if let Err(e) = post_one(q, sq, w) {
            rc = errno_of_post(e);
            // SAFETY: `bad` is the caller's out pointer.
            unsafe { *bad = wr };
            break;
        }
        wr = w.next;
    }
    sq.ring();
    rc
}

/// # Safety
/// `wr` is a live chain of receive WRs.
#[inline(always)]
unsafe fn recv_chain(
    mut wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
    mut push: impl FnMut(u64, &[Sge]) -> Result<(), PostError>,
) -> c_int {
    const MAX: usize = 32;
    while !wr.is_null() {
        // SAFETY: per the contract.
        let w = unsafe { &*wr };
        // SAFETY: the verbs contract: `sg_list` has `num_sge` entries.
        let list = unsafe { sges(w.sg_list, w.num_sge) };
        let r = if list.len() == 1 {
            push(w.wr_id, &[sge(&list[0])])
        } else if list.len() <= MAX {
            let mut buf = [Sge::default(); MAX];
            for (d, s) in buf.iter_mut().zip(list) {
                *d = sge(s);
            }
            push(w.wr_id, &buf[..list.len()])
        } else {
            Err(PostError::TooManySges {
                n: list.len(),
                max: MAX as u32,
            })
        };
        if let Err(e) = r {
            // SAFETY: the caller's out pointer.
            unsafe { *bad = wr };
            return errno_of_post(e);
        }
        wr = w.next;
    }
    0
}

unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: `qp` is ours.
    let q = unsafe { qp_of(qp) };
    let _g = q.rq_lock.lock();
    // SAFETY: exclusive under the receive lock.
    let Some(rq) = (unsafe { (*q.inner.get()).rq() }) else {
        // SAFETY: the caller's out pointer.
        unsafe { *bad = wr };
        return libc::EINVAL;
    };
    // SAFETY: the application's chain.
    let rc = unsafe { recv_chain(wr, bad, |id, s| rq.push(id, s)) };
    rq.publish();
    rc
}

unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: `srq` is ours.
    let s = unsafe { &*srq.cast::<ProvSrq>() };
    let _g = s.lock.lock();
    // SAFETY: exclusive under the SRQ lock.
    let inner = unsafe { &mut *s.inner.get() };
    // SAFETY: the application's chain.
    unsafe {
        recv_chain(wr, bad, |id, sg| {
            inner
                .post_recv(&[mlx5::RecvWr {
                    wr_id: id,
                    sg_list: sg,
                }])
                .map_err(|(_, e)| e)
        })
    }
}

/// `WorkCompletion` as `ibv_wc`.
#[inline(always)]
pub fn to_ibv_wc(w: &WorkCompletion) -> ibv_wc {
    let flags = w.wc_flags.0 & 0x7f;
    ibv_wc {
        wr_id: w.wr_id,
        status: w.status.0,
        opcode: w.opcode.0,
        vendor_err: u32::from(w.vendor_err.0),
        byte_len: w.byte_len,
        imm_data: if w.wc_flags.contains(mlx5::WcFlags::WITH_INV) {
            w.invalidated_rkey
        } else {
            u32::from_ne_bytes(w.imm_data)
        },
        qp_num: w.qp_num,
        src_qp: w.src_qp,
        wc_flags: flags,
        pkey_index: w.pkey_index,
        slid: w.slid,
        sl: w.sl,
        dlid_path_bits: w.dlid_path_bits,
    }
}

unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: `cq` is ours.
    let p = unsafe { cq_of(cq) };
    let _g = p.lock.lock();
    // SAFETY: exclusive under the CQ lock.
    let inner = unsafe { &mut *p.inner.get() };
    let mut got = 0;
    while got < n {
        let mut one = [WorkCompletion::default()];
        if inner.poll(&mut one) == 0 {
            break;
        }
        // SAFETY: the caller's array has `n` entries.
        unsafe { wc.add(got as usize).write(to_ibv_wc(&one[0])) };
        got += 1;
    }
    got
}

/// Install the `ibv_wr_*` functions on an extended QP.
///
/// # Safety
/// `q` is a QP of ours, not yet handed out.
pub unsafe fn install_wr_ops(q: *mut ProvQp) {
    // SAFETY: per the contract.
    unsafe { (*q).vqp.comp_mask |= VERBS_QP_EX };
}

pub fn fill_ops(s: &mut [Fp; VERBS_CONTEXT_OPS_SLOTS]) {
    op!(
        s,
        "post_send",
        post_send,
        unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int
    );
    op!(
        s,
        "post_recv",
        post_recv,
        unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int
    );
    op!(
        s,
        "post_srq_recv",
        post_srq_recv,
        unsafe extern "C" fn(*mut ibv_srq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int
    );
    op!(
        s,
        "poll_cq",
        poll_cq,
        unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int
    );
}
