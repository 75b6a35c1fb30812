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
/// The `send_ops_flags` served by the `ibv_wr_*` functions: RDMA_WRITE(_WITH_IMM), SEND,
/// SEND_WITH_IMM, RDMA_READ, ATOMIC_CMP_AND_SWP, ATOMIC_FETCH_AND_ADD, SEND_WITH_INV.
pub const SERVED_SEND_OPS: u64 = 0x7f | (1 << 9);

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

impl Lock {
    /// Take the lock until [`unlock`](Self::unlock) (`ibv_wr_start` .. `ibv_wr_complete`).
    #[inline(always)]
    pub fn lock_raw(&self) {
        core::mem::forget(self.lock());
    }

    /// Release a lock taken by [`lock_raw`](Self::lock_raw).
    #[inline(always)]
    pub fn unlock(&self) {
        drop(Guard(self));
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

pub fn errno_of_post(e: PostError) -> c_int {
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

/// What a WR carries: the C SGEs (gathered, or inline when `inline`), the SGEs copied by
/// `ibv_wr_set_sge*`, or inline bytes copied by `ibv_wr_set_inline_data*`.
#[derive(Clone, Copy)]
pub enum Payload<'a> {
    Ibv(&'a [ibv_sge], bool),
    Sges(&'a [Sge]),
    Bytes(&'a [u8]),
}

/// One WR's operation, decoded.
#[derive(Clone, Copy, Debug)]
pub enum Op {
    Send,
    SendImm([u8; 4]),
    SendInv(u32),
    Write {
        raddr: u64,
        rkey: u32,
        imm: Option<[u8; 4]>,
    },
    Read {
        raddr: u64,
        rkey: u32,
    },
    Atomic {
        raddr: u64,
        rkey: u32,
        swap_add: u64,
        compare: Option<u64>,
    },
}

/// Finish a WQE whose payload may be gathered or inline.
#[inline(always)]
fn payload(
    b: mlx5::WqeBuilder<'_, mlx5::AnyPayload>,
    wr_id: u64,
    p: Payload<'_>,
) -> Result<(), PostError> {
    match p {
        Payload::Ibv(list, inline) => {
            let Some((first, rest)) = list.split_first() else {
                b.finish(wr_id);
                return Ok(());
            };
            if inline {
                // SAFETY: inline data is read from the application's buffers, as the verbs
                // contract of IBV_SEND_INLINE lets the provider do during the call.
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
        }
        Payload::Sges(list) => {
            let Some((first, rest)) = list.split_first() else {
                b.finish(wr_id);
                return Ok(());
            };
            let mut b = b.sge(first)?;
            for s in rest {
                b = b.sge(s)?;
            }
            b.finish(wr_id);
        }
        Payload::Bytes(d) => {
            if d.is_empty() {
                b.finish(wr_id);
            } else {
                b.inline(d)?.finish(wr_id);
            }
        }
    }
    Ok(())
}

/// The first gathered SGE of a payload (READ's destination, an atomic's result).
#[inline(always)]
fn gather(p: Payload<'_>) -> Result<&[Sge], Result<Sge, PostError>> {
    match p {
        Payload::Sges(l) => Ok(l),
        Payload::Ibv(l, false) => Err(l.first().map(sge).ok_or(PostError::BadAtomicSge)),
        _ => Err(Err(PostError::BadOpcode)),
    }
}

/// One decoded WR into the send queue (no doorbell).
#[inline(always)]
pub fn build(
    q: &ProvQp,
    sq: &mut mlx5::SendQueue,
    op: Op,
    flags: SendFlags,
    wr_id: u64,
    ud: Option<(*mut ibv_ah, u32, u32)>,
    p: Payload<'_>,
) -> Result<(), PostError> {
    if q.qp_type == mlx5::QpType::Ud {
        let Some((ah, remote_qpn, remote_qkey)) = ud.filter(|u| !u.0.is_null()) else {
            return Err(PostError::BadDestination);
        };
        // SAFETY: an AH of ours (the application's, of this context).
        let ah = unsafe { &(*ah.cast::<ProvAh>()).inner };
        let dest = mlx5::UdDest {
            ah,
            remote_qpn,
            remote_qkey,
        };
        let imm = match op {
            Op::Send => None,
            Op::SendImm(i) => Some(i),
            _ => return Err(PostError::BadOpcode),
        };
        return payload(sq.send_ud(flags, &dest, imm)?, wr_id, p);
    }
    match op {
        Op::Send => payload(sq.send(flags)?, wr_id, p),
        Op::SendImm(imm) => payload(sq.send_imm(flags, imm)?, wr_id, p),
        Op::SendInv(rkey) => payload(sq.send_inv(flags, rkey)?, wr_id, p),
        Op::Write { raddr, rkey, imm } => payload(sq.write(flags, raddr, rkey, imm)?, wr_id, p),
        Op::Read { raddr, rkey } => {
            let b = sq.read(flags, raddr, rkey)?;
            match gather(p) {
                Ok(list) => {
                    let Some((first, rest)) = list.split_first() else {
                        return Err(PostError::TooManySges { n: 0, max: 0 });
                    };
                    let mut b = b.sge(first)?;
                    for s in rest {
                        b = b.sge(s)?;
                    }
                    b.finish(wr_id);
                }
                Err(Ok(_)) => {
                    let Payload::Ibv(list, _) = p else {
                        return Err(PostError::BadOpcode);
                    };
                    let (first, rest) = list.split_first().ok_or(PostError::BadAtomicSge)?;
                    let mut b = b.sge(&sge(first))?;
                    for s in rest {
                        b = b.sge(&sge(s))?;
                    }
                    b.finish(wr_id);
                }
                Err(Err(e)) => return Err(e),
            }
            Ok(())
        }
        Op::Atomic {
            raddr,
            rkey,
            swap_add,
            compare,
        } => {
            let result = match gather(p) {
                Ok(l) => *l.first().ok_or(PostError::BadAtomicSge)?,
                Err(r) => r?,
            };
            sq.atomic(flags, raddr, rkey, swap_add, compare, &result)?
                .finish(wr_id);
            Ok(())
        }
    }
}

/// One C send WR into the send queue.
#[inline(always)]
fn post_one(
    q: &ProvQp,
    sq: &mut mlx5::SendQueue,
    wr: &ibv_send_wr,
    connected: bool,
) -> Result<(), PostError> {
    let flags = SendFlags(wr.send_flags & 0x7);
    let inline = wr.send_flags & IBV_SEND_INLINE != 0;
    // The common shapes first, straight into the builder: a SEND or RDMA WRITE on an RC/UC
    // QP with exactly one SGE, gathered or inline (the general decoding below costs a
    // second dispatch on the opcode and on the payload kind).
    if connected && wr.num_sge == 1 && !wr.sg_list.is_null() {
        // SAFETY: the verbs contract: `sg_list` has `num_sge` (1) entries.
        let s = unsafe { &*wr.sg_list };
        let b = match wr.opcode {
            IBV_WR_SEND => sq.send(flags)?,
            IBV_WR_RDMA_WRITE => {
                // SAFETY: the `rdma` member is the live one for WRITE.
                let r = unsafe { wr.wr.rdma };
                sq.write(flags, r.remote_addr, r.rkey, None)?
            }
            _ => return post_general(q, sq, wr, flags, inline),
        };
        if inline {
            // SAFETY: inline data is read from the application's buffer, as the verbs
            // contract of IBV_SEND_INLINE lets the provider do during the call.
            let bytes = unsafe {
                core::slice::from_raw_parts(s.addr as usize as *const u8, s.length as usize)
            };
            b.inline(bytes)?.finish(wr.wr_id);
        } else {
            b.sge(&sge(s))?.finish(wr.wr_id);
        }
        return Ok(());
    }
    post_general(q, sq, wr, flags, inline)
}

/// A chain of one SEND with one buffer on an RC/UC QP: the crate's fused post-and-ring
/// (`SendQueue::send_inline_now`, `SendQueue::post_send` of one WR), the same WQE and
/// doorbell as the builder and `ring` in one pass. `None` for any other WR (nothing done).
#[inline(always)]
fn post_single(
    q: &ProvQp,
    sq: &mut mlx5::SendQueue,
    w: &ibv_send_wr,
) -> Option<Result<(), PostError>> {
    if w.opcode != IBV_WR_SEND
        || w.num_sge != 1
        || w.sg_list.is_null()
        || q.qp_type == mlx5::QpType::Ud
    {
        return None;
    }
    // SAFETY: the verbs contract: `sg_list` has `num_sge` (1) entries.
    let s = unsafe { &*w.sg_list };
    let flags = SendFlags(w.send_flags & 0x7);
    Some(if w.send_flags & IBV_SEND_INLINE != 0 {
        // SAFETY: inline data is read from the application's buffer, as the verbs contract
        // of IBV_SEND_INLINE lets the provider do during the call.
        let bytes =
            unsafe { core::slice::from_raw_parts(s.addr as usize as *const u8, s.length as usize) };
        sq.send_inline_now(flags, bytes, w.wr_id)
    } else {
        let g = sge(s);
        sq.post_send(&[mlx5::SendWr::send(
            w.wr_id,
            core::slice::from_ref(&g),
            flags,
        )])
        .map_err(|(_, e)| e)
    })
}

/// Any other C send WR (every opcode, any number of SGEs, UD).
#[inline(never)]
fn post_general(
    q: &ProvQp,
    sq: &mut mlx5::SendQueue,
    wr: &ibv_send_wr,
    flags: SendFlags,
    inline: bool,
) -> Result<(), PostError> {
    // SAFETY: the verbs contract: `sg_list` has `num_sge` entries.
    let list = unsafe { sges(wr.sg_list, wr.num_sge) };
    let op = op_of(wr)?;
    let ud = (q.qp_type == mlx5::QpType::Ud).then(|| {
        // SAFETY: the `ud` member is the live one for UD QPs.
        let u = unsafe { wr.wr.ud };
        (u.ah, u.remote_qpn, u.remote_qkey)
    });
    build(q, sq, op, flags, wr.wr_id, ud, Payload::Ibv(list, inline))
}

/// A C send WR's operation, flags and payload (the XRC path's decoding).
pub fn decode(wr: &ibv_send_wr) -> Result<(Op, SendFlags, Payload<'_>), PostError> {
    let flags = SendFlags(wr.send_flags & 0x7);
    let inline = wr.send_flags & IBV_SEND_INLINE != 0;
    // SAFETY: the verbs contract: `sg_list` has `num_sge` entries.
    let list = unsafe { sges(wr.sg_list, wr.num_sge) };
    Ok((op_of(wr)?, flags, Payload::Ibv(list, inline)))
}

/// The operation of a C send WR.
#[inline(always)]
fn op_of(wr: &ibv_send_wr) -> Result<Op, PostError> {
    let imm = wr.imm_data.to_ne_bytes();
    Ok(match wr.opcode {
        IBV_WR_SEND => Op::Send,
        IBV_WR_SEND_WITH_IMM => Op::SendImm(imm),
        IBV_WR_SEND_WITH_INV => Op::SendInv(wr.imm_data),
        IBV_WR_RDMA_WRITE | IBV_WR_RDMA_WRITE_WITH_IMM => {
            // SAFETY: the `rdma` member is the live one for these opcodes.
            let r = unsafe { wr.wr.rdma };
            Op::Write {
                raddr: r.remote_addr,
                rkey: r.rkey,
                imm: (wr.opcode == IBV_WR_RDMA_WRITE_WITH_IMM).then_some(imm),
            }
        }
        IBV_WR_RDMA_READ => {
            // SAFETY: the `rdma` member is the live one for READ.
            let r = unsafe { wr.wr.rdma };
            Op::Read {
                raddr: r.remote_addr,
                rkey: r.rkey,
            }
        }
        IBV_WR_ATOMIC_CMP_AND_SWP | IBV_WR_ATOMIC_FETCH_AND_ADD => {
            // SAFETY: the `atomic` member is the live one for atomics.
            let a = unsafe { wr.wr.atomic };
            let cas = wr.opcode == IBV_WR_ATOMIC_CMP_AND_SWP;
            Op::Atomic {
                raddr: a.remote_addr,
                rkey: a.rkey,
                swap_add: if cas { a.swap } else { a.compare_add },
                compare: cas.then_some(a.compare_add),
            }
        }
        _ => return Err(PostError::BadOpcode),
    })
}

/// `ibv_post_send`. `LOCKS` is false only in the table of a single-threaded process
/// (`MLX5_SINGLE_THREADED=1`, whose locks are all off anyway): there the lock is not even
/// looked at.
unsafe extern "C" fn post_send<const LOCKS: bool>(
    qp: *mut ibv_qp,
    mut wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: `qp` is ours.
    let q = unsafe { qp_of(qp) };
    let _g = LOCKS.then(|| q.sq_lock.lock());
    // SAFETY: exclusive under the send lock (or by the single-threaded promise).
    let inner = unsafe { &mut *q.inner.get() };
    let sq = match inner {
        crate::qp::QpInner::Plain(p) => p.sq(),
        // SAFETY: the application's chain; `bad` its out pointer.
        _ => return unsafe { crate::xrc::post_send(inner, wr, bad) },
    };
    if !wr.is_null() {
        // SAFETY: the application's live WR.
        let w = unsafe { &*wr };
        if w.next.is_null() {
            if let Some(r) = post_single(q, sq, w) {
                return r.map_or_else(
                    |e| {
                        // SAFETY: `bad` is the caller's out pointer.
                        unsafe { *bad = wr };
                        errno_of_post(e)
                    },
                    |()| 0,
                );
            }
        }
    }
    // RC or UC (read once, not per WR).
    let connected = q.qp_type != mlx5::QpType::Ud;
    let mut rc = 0;
    while !wr.is_null() {
        // SAFETY: the application's chain of live WRs.
        let w = unsafe { &*wr };
        if let Err(e) = post_one(q, sq, w, connected) {
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

/// `ibv_post_recv` (`LOCKS` as [`post_send`]).
unsafe extern "C" fn post_recv<const LOCKS: bool>(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: `qp` is ours.
    let q = unsafe { qp_of(qp) };
    let _g = LOCKS.then(|| q.rq_lock.lock());
    // SAFETY: exclusive under the receive lock.
    let Some(rq) = (match unsafe { &mut *q.inner.get() } {
        crate::qp::QpInner::Plain(p) => p.rq(),
        _ => None,
    }) else {
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

/// `ibv_poll_cq` (`LOCKS` as [`post_send`]).
unsafe extern "C" fn poll_cq<const LOCKS: bool>(
    cq: *mut ibv_cq,
    n: c_int,
    wc: *mut ibv_wc,
) -> c_int {
    // SAFETY: `cq` is ours.
    let p = unsafe { cq_of(cq) };
    let _g = LOCKS.then(|| p.lock.lock());
    // SAFETY: exclusive under the CQ lock (or by the single-threaded promise).
    let inner = unsafe { &mut *p.inner.get() };
    if n == 1 {
        // One entry (the common busy-poll): through the CQ's own scratch completion, which
        // the extended API uses only between `start_poll` and `end_poll` (under this lock).
        // SAFETY: as `inner`.
        let one = unsafe { &mut *p.cur.get() };
        if inner.poll(core::slice::from_mut(one)) == 0 {
            return 0;
        }
        // SAFETY: the caller's array has `n` (1) entries.
        unsafe { wc.write(to_ibv_wc(one)) };
        return 1;
    }
    let want = usize::try_from(n).unwrap_or(0);
    // SAFETY: as `inner`.
    let batch = unsafe { &mut *p.batch.get() };
    let mut got = 0;
    while got < want {
        let k = (want - got).min(crate::cq::POLL_BATCH);
        let m = inner.poll(&mut batch[..k]);
        for (i, w) in batch[..m].iter().enumerate() {
            // SAFETY: the caller's array has `n` entries and `got + i < n`.
            unsafe { wc.add(got + i).write(to_ibv_wc(w)) };
        }
        got += m;
        if m < k {
            break;
        }
    }
    // `got <= n`, an int.
    got as c_int
}

/// Install the `ibv_wr_*` functions on an extended QP.
///
/// # Safety
/// `q` is a QP of ours, not yet handed out.
pub unsafe fn install_wr_ops(q: *mut ProvQp) {
    use crate::wr::*;
    // SAFETY: per the contract, nothing else sees the QP yet.
    let x = unsafe { &mut (*q).vqp.qp_ex };
    x.wr_send = Some(wr_send);
    x.wr_send_imm = Some(wr_send_imm);
    x.wr_send_inv = Some(wr_send_inv);
    x.wr_rdma_write = Some(wr_rdma_write);
    x.wr_rdma_write_imm = Some(wr_rdma_write_imm);
    x.wr_rdma_read = Some(wr_rdma_read);
    x.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
    x.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
    x.wr_set_ud_addr = Some(wr_set_ud_addr);
    if matches!(
        // SAFETY: as above (the QP's inner is written before its ops are installed).
        unsafe { &*(*q).inner.get() },
        crate::qp::QpInner::XrcSend(_)
    ) {
        x.wr_set_xrc_srqn = Some(wr_set_xrc_srqn);
    }
    x.wr_set_sge = Some(wr_set_sge);
    x.wr_set_sge_list = Some(wr_set_sge_list);
    x.wr_set_inline_data = Some(wr_set_inline_data);
    x.wr_set_inline_data_list = Some(wr_set_inline_data_list);
    x.wr_start = Some(wr_start);
    x.wr_complete = Some(wr_complete);
    x.wr_abort = Some(wr_abort);
    // SAFETY: as above.
    unsafe { (*q).vqp.comp_mask |= VERBS_QP_EX };
}

/// The data-path slots; `locks` false for a single-threaded process (no lock code at all).
pub fn fill_ops(s: &mut [Fp; VERBS_CONTEXT_OPS_SLOTS], locks: bool) {
    if locks {
        fill_ops_locked::<true>(s);
    } else {
        fill_ops_locked::<false>(s);
    }
}

fn fill_ops_locked<const LOCKS: bool>(s: &mut [Fp; VERBS_CONTEXT_OPS_SLOTS]) {
    op!(
        s,
        "post_send",
        post_send::<LOCKS>,
        unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int
    );
    op!(
        s,
        "post_recv",
        post_recv::<LOCKS>,
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
        poll_cq::<LOCKS>,
        unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int
    );
}
