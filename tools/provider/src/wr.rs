//! The `ibv_wr_*` post path (`ibv_qp_ex`, perftest's default): `ibv_wr_start`, one builder
//! call per WR (`ibv_wr_send`, `ibv_wr_rdma_write`, ...) with its setters
//! (`ibv_wr_set_sge`, `ibv_wr_set_ud_addr`, `ibv_wr_set_inline_data`, ...), then
//! `ibv_wr_complete`, which rings the doorbell once.
//!
//! A WR is written into the ring when the next builder call or `ibv_wr_complete` comes, so
//! the setters may come in any order (a UD WR needs its address before the data segments).
//! The setters copy what they are given (SGEs into a fixed array, inline bytes into a buffer
//! sized at create time): nothing allocates. Errors are sticky and returned by
//! `ibv_wr_complete`, as libmlx5 does. `ibv_wr_abort` drops the WR being built; WRs already
//! written since `ibv_wr_start` stay in the ring and go out with the next doorbell (the
//! crate's builder commits a WQE when it is finished) -- see docs/provider.md.

use core::ffi::{c_int, c_void};

use mlx5::{SendFlags, Sge};

use crate::abi::*;
use crate::fast::{Op, Payload, build};
use crate::qp::{ProvQp, QpInner};

/// Most SGEs one `ibv_wr_set_sge_list` may carry.
pub const MAX_WR_SGE: usize = 32;

/// The WR being built between `ibv_wr_start` and `ibv_wr_complete`.
pub struct Pending {
    pub op: Option<Op>,
    pub wr_id: u64,
    pub flags: u32,
    pub ud: Option<(*mut ibv_ah, u32, u32)>,
    /// The remote XRC SRQ (`ibv_wr_set_xrc_srqn`), XRC_SEND QPs only.
    pub xrc_srqn: Option<u32>,
    pub sges: [Sge; MAX_WR_SGE],
    pub nsge: usize,
    pub inline: Vec<u8>,
    pub is_inline: bool,
    pub err: c_int,
}

impl Pending {
    pub fn new(max_inline: usize) -> Pending {
        Pending {
            op: None,
            wr_id: 0,
            flags: 0,
            ud: None,
            xrc_srqn: None,
            sges: [Sge::default(); MAX_WR_SGE],
            nsge: 0,
            inline: Vec::with_capacity(max_inline),
            is_inline: false,
            err: 0,
        }
    }
}

/// # Safety
/// `x` is the `ibv_qp_ex` of a QP of ours, between `ibv_wr_start` and `ibv_wr_complete`
/// (the send lock is held).
#[inline(always)]
unsafe fn parts<'a>(x: *mut ibv_qp_ex) -> (&'a ProvQp, &'a mut Pending) {
    // SAFETY: our QP starts with the ibv_qp_ex; the pending state is ours under the lock.
    unsafe {
        let q = &*x.cast::<ProvQp>();
        (q, &mut *q.pending.get())
    }
}

/// Write the pending WR (if any) into the ring.
#[inline(always)]
fn flush(q: &ProvQp, p: &mut Pending) {
    let Some(op) = p.op.take() else { return };
    if p.err != 0 {
        return;
    }
    let payload = if p.is_inline {
        Payload::Bytes(&p.inline)
    } else {
        Payload::Sges(&p.sges[..p.nsge])
    };
    let flags = SendFlags(p.flags & 0x7);
    // SAFETY: the send lock is held (ibv_wr_start).
    let r = match unsafe { &mut *q.inner.get() } {
        QpInner::Plain(qp) => build(q, qp.sq(), op, flags, p.wr_id, p.ud, payload),
        QpInner::XrcSend(x) => match p.xrc_srqn {
            Some(n) => crate::xrc::build(x, op, flags, p.wr_id, n, payload),
            // An XRC WR names its SRQ: without ibv_wr_set_xrc_srqn it has no destination.
            None => Err(mlx5::PostError::BadDestination),
        },
        QpInner::XrcRecv(..) => Err(mlx5::PostError::BadOpcode),
    };
    if let Err(e) = r {
        p.err = match e {
            mlx5::PostError::Full { .. } => libc::ENOMEM,
            _ => libc::EINVAL,
        };
    }
}

#[inline(always)]
fn begin(x: *mut ibv_qp_ex, op: Op) {
    // SAFETY: the application calls builders between wr_start and wr_complete.
    let (q, p) = unsafe { parts(x) };
    flush(q, p);
    // SAFETY: `x` is live.
    let (wr_id, flags) = unsafe { ((*x).wr_id, (*x).wr_flags) };
    p.op = Some(op);
    p.wr_id = wr_id;
    p.flags = flags;
    p.ud = None;
    p.xrc_srqn = None;
    p.nsge = 0;
    p.is_inline = false;
    p.inline.clear();
}

pub unsafe extern "C" fn wr_start(x: *mut ibv_qp_ex) {
    // SAFETY: our QP.
    let q = unsafe { &*x.cast::<ProvQp>() };
    q.sq_lock.lock_raw();
    // SAFETY: under the lock just taken.
    let p = unsafe { &mut *q.pending.get() };
    p.op = None;
    p.err = 0;
}

pub unsafe extern "C" fn wr_complete(x: *mut ibv_qp_ex) -> c_int {
    // SAFETY: between wr_start and here.
    let (q, p) = unsafe { parts(x) };
    flush(q, p);
    // SAFETY: under the lock.
    if let Some(sq) = unsafe { (*q.inner.get()).sq() } {
        sq.ring();
    }
    let err = p.err;
    q.sq_lock.unlock();
    err
}

pub unsafe extern "C" fn wr_abort(x: *mut ibv_qp_ex) {
    // SAFETY: between wr_start and here.
    let (q, p) = unsafe { parts(x) };
    p.op = None;
    q.sq_lock.unlock();
}

pub unsafe extern "C" fn wr_send(x: *mut ibv_qp_ex) {
    begin(x, Op::Send);
}

pub unsafe extern "C" fn wr_send_imm(x: *mut ibv_qp_ex, imm: u32) {
    begin(x, Op::SendImm(imm.to_ne_bytes()));
}

pub unsafe extern "C" fn wr_send_inv(x: *mut ibv_qp_ex, rkey: u32) {
    begin(x, Op::SendInv(rkey));
}

pub unsafe extern "C" fn wr_rdma_write(x: *mut ibv_qp_ex, rkey: u32, raddr: u64) {
    begin(
        x,
        Op::Write {
            raddr,
            rkey,
            imm: None,
        },
    );
}

pub unsafe extern "C" fn wr_rdma_write_imm(x: *mut ibv_qp_ex, rkey: u32, raddr: u64, imm: u32) {
    begin(
        x,
        Op::Write {
            raddr,
            rkey,
            imm: Some(imm.to_ne_bytes()),
        },
    );
}

pub unsafe extern "C" fn wr_rdma_read(x: *mut ibv_qp_ex, rkey: u32, raddr: u64) {
    begin(x, Op::Read { raddr, rkey });
}

pub unsafe extern "C" fn wr_atomic_cmp_swp(
    x: *mut ibv_qp_ex,
    rkey: u32,
    raddr: u64,
    compare: u64,
    swap: u64,
) {
    begin(
        x,
        Op::Atomic {
            raddr,
            rkey,
            swap_add: swap,
            compare: Some(compare),
        },
    );
}

pub unsafe extern "C" fn wr_atomic_fetch_add(x: *mut ibv_qp_ex, rkey: u32, raddr: u64, add: u64) {
    begin(
        x,
        Op::Atomic {
            raddr,
            rkey,
            swap_add: add,
            compare: None,
        },
    );
}

pub unsafe extern "C" fn wr_set_ud_addr(x: *mut ibv_qp_ex, ah: *mut ibv_ah, qpn: u32, qkey: u32) {
    // SAFETY: between wr_start and wr_complete.
    let (_, p) = unsafe { parts(x) };
    p.ud = Some((ah, qpn, qkey));
}

pub unsafe extern "C" fn wr_set_xrc_srqn(x: *mut ibv_qp_ex, srqn: u32) {
    // SAFETY: between wr_start and wr_complete.
    let (_, p) = unsafe { parts(x) };
    p.xrc_srqn = Some(srqn);
}

pub unsafe extern "C" fn wr_set_sge(x: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    // SAFETY: between wr_start and wr_complete.
    let (_, p) = unsafe { parts(x) };
    p.sges[0] = Sge { addr, length, lkey };
    p.nsge = 1;
    p.is_inline = false;
}

pub unsafe extern "C" fn wr_set_sge_list(x: *mut ibv_qp_ex, n: usize, list: *const ibv_sge) {
    // SAFETY: between wr_start and wr_complete.
    let (_, p) = unsafe { parts(x) };
    if n > MAX_WR_SGE || (n > 0 && list.is_null()) {
        p.err = libc::EINVAL;
        return;
    }
    for i in 0..n {
        // SAFETY: the application's list of `n` SGEs.
        let s = unsafe { &*list.add(i) };
        p.sges[i] = Sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        };
    }
    p.nsge = n;
    p.is_inline = false;
}

fn push_inline(p: &mut Pending, addr: *const c_void, len: usize) {
    if p.inline.len() + len > p.inline.capacity() {
        p.err = libc::EINVAL; // beyond max_inline_data: libmlx5 answers EINVAL too
        return;
    }
    if len > 0 {
        // SAFETY: the application's buffer of `len` bytes, read during the call.
        let d = unsafe { core::slice::from_raw_parts(addr.cast::<u8>(), len) };
        p.inline.extend_from_slice(d);
    }
}

pub unsafe extern "C" fn wr_set_inline_data(x: *mut ibv_qp_ex, addr: *mut c_void, len: usize) {
    // SAFETY: between wr_start and wr_complete.
    let (_, p) = unsafe { parts(x) };
    p.inline.clear();
    p.is_inline = true;
    push_inline(p, addr, len);
}

pub unsafe extern "C" fn wr_set_inline_data_list(
    x: *mut ibv_qp_ex,
    n: usize,
    list: *const ibv_data_buf,
) {
    // SAFETY: between wr_start and wr_complete.
    let (_, p) = unsafe { parts(x) };
    p.inline.clear();
    p.is_inline = true;
    for i in 0..n {
        // SAFETY: the application's list of `n` buffers.
        let b = unsafe { &*list.add(i) };
        push_inline(p, b.addr, b.length);
    }
}
