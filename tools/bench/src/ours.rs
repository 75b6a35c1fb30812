//! Our side: the `mlx5` crate on the emulator in stepped mode (the device runs only between
//! measured calls, never inside them).
//!
//! Each measured operation is one `#[inline(never)]` wrapper `bench_rs_<op>_<api>`; under
//! callgrind these are the toggle functions. [`run`] returns the same `result` lines as the
//! C harness prints, with the same batching: single posts and polls are timed in batches of
//! back-to-back calls, chains one call at a time.

use std::hint::black_box;
use std::sync::Arc;

use mlx5::hw::opcodes::CqeOpcode;
use mlx5::{
    Access, BfPolicy, Context, Cq, CqInit, DmaBuf, Mr, Pd, PostError, Qp, QpCap, QpInitAttr,
    QpType, RawCq, RecvQueue, RecvWr, RemoteQp, SendFlags, SendQueue, SendWr, Sge, WcOpcode,
    WcStatus, WorkCompletion,
};
use mlx5_emu::{EmuConfig, Emulator, RunMode};

use crate::ops::{CHAIN, PAYLOAD, PAYLOAD_SMALL};
use crate::timing::Samples;

const SQ_WRS: u32 = 128;
const RQ_WRS: u32 = 256;
const CQ_SIZE: u32 = 512;
/// Single posts per timed batch (between two drains of the send CQ).
const ROUND: usize = 32;
/// Completions in the CQ when a polling batch starts.
const FILL: usize = 2 * CHAIN;
/// Calls per operation in the warm-up pass (the C harness uses the same number).
pub const WARMUP: usize = 64;

// ---- the measured wrappers (callgrind toggles on them) ----
//
// The three verbs-shaped post wrappers would compile to identical code, and the compiler
// merges identical functions (one address, one name for callgrind). Each therefore passes a
// distinct constant through `black_box` (two instructions).

/// Called once between the warm-up pass and the measured pass (callgrind zeroes its costs
/// on entry: `--zero-before`).
#[inline(never)]
pub fn bench_zero_stats() {
    black_box(0x5a5a_0001_u32);
}

/// One inline 32-byte SEND (one WQEBB) through the verbs-shaped API.
#[inline(never)]
pub fn bench_rs_send_inline32_verbs(
    qp: &mut Qp,
    wr: &[SendWr<'_>],
) -> Result<(), (usize, PostError)> {
    black_box(4u8);
    qp.post_send(wr)
}

/// One inline 32-byte SEND (one WQEBB) through the low-level API.
#[inline(never)]
pub fn bench_rs_send_inline32_lowlevel(
    sq: &mut SendQueue,
    wr_id: u64,
    data: &[u8],
) -> Result<(), PostError> {
    black_box(5u8);
    sq.send_inline_now(SendFlags::SIGNALED, data, wr_id)
}

/// One inline 64-byte SEND through the verbs-shaped API.
#[inline(never)]
pub fn bench_rs_send_inline64_verbs(
    qp: &mut Qp,
    wr: &[SendWr<'_>],
) -> Result<(), (usize, PostError)> {
    black_box(1u8);
    qp.post_send(wr)
}

/// One inline SEND through the low-level API.
#[inline(never)]
pub fn bench_rs_send_inline64_lowlevel(
    sq: &mut SendQueue,
    wr_id: u64,
    data: &[u8],
) -> Result<(), PostError> {
    sq.send_inline_now(SendFlags::SIGNALED, data, wr_id)
}

/// One SEND with one SGE through the verbs-shaped API.
#[inline(never)]
pub fn bench_rs_send_sge64_verbs(qp: &mut Qp, wr: &[SendWr<'_>]) -> Result<(), (usize, PostError)> {
    black_box(2u8);
    qp.post_send(wr)
}

/// One SEND with one SGE through the low-level API.
#[inline(never)]
pub fn bench_rs_send_sge64_lowlevel(
    sq: &mut SendQueue,
    wr_id: u64,
    sge: &Sge,
) -> Result<(), PostError> {
    sq.send(SendFlags::SIGNALED)?.sge(sge)?.finish(wr_id);
    sq.ring();
    Ok(())
}

/// A chain of 32 SENDs, one doorbell, through the verbs-shaped API.
#[inline(never)]
pub fn bench_rs_chain32_verbs(qp: &mut Qp, wrs: &[SendWr<'_>]) -> Result<(), (usize, PostError)> {
    black_box(3u8);
    qp.post_send(wrs)
}

/// A chain of 32 SENDs, one doorbell, through the low-level API.
#[inline(never)]
pub fn bench_rs_chain32_lowlevel(
    sq: &mut SendQueue,
    wr_id: u64,
    sge: &Sge,
) -> Result<(), PostError> {
    for i in 0..CHAIN as u64 {
        sq.send(SendFlags::SIGNALED)?.sge(sge)?.finish(wr_id + i);
    }
    sq.ring();
    Ok(())
}

/// Poll one CQE through the verbs-shaped API.
#[inline(never)]
pub fn bench_rs_poll_cqe_verbs(cq: &mut Cq, wc: &mut [WorkCompletion; 1]) -> usize {
    cq.poll(wc)
}

/// Poll one CQE through the low-level API: take it, retire its WR, publish the consumer
/// index. Returns the WR id and the CQE opcode.
#[inline(never)]
pub fn bench_rs_poll_cqe_lowlevel(cq: &mut RawCq, sq: &mut SendQueue) -> Option<(u64, CqeOpcode)> {
    let cqe = cq.next()?;
    let wr_id = sq.retire(cqe.wqe_counter()).ok()?;
    cq.publish_ci();
    Some((wr_id, cqe.opcode()))
}

/// One receive of one SGE through the verbs-shaped API.
#[inline(never)]
pub fn bench_rs_recv1_verbs(qp: &mut Qp, wr: &[RecvWr<'_>]) -> Result<(), (usize, PostError)> {
    black_box(4u8);
    qp.post_recv(wr)
}

/// One receive of one SGE through the low-level API.
#[inline(never)]
pub fn bench_rs_recv1_lowlevel(rq: &mut RecvQueue, wr_id: u64, sge: &Sge) -> Result<(), PostError> {
    rq.push(wr_id, core::slice::from_ref(sge))?;
    rq.publish();
    Ok(())
}

/// A chain of 32 receives, one doorbell-record update, through the verbs-shaped API.
#[inline(never)]
pub fn bench_rs_recv_chain32_verbs(
    qp: &mut Qp,
    wrs: &[RecvWr<'_>],
) -> Result<(), (usize, PostError)> {
    black_box(5u8);
    qp.post_recv(wrs)
}

/// A chain of 32 receives, one doorbell-record update, through the low-level API.
#[inline(never)]
pub fn bench_rs_recv_chain32_lowlevel(
    rq: &mut RecvQueue,
    wr_id: u64,
    sge: &Sge,
) -> Result<(), PostError> {
    for i in 0..CHAIN as u64 {
        rq.push(wr_id + i, core::slice::from_ref(sge))?;
    }
    rq.publish();
    Ok(())
}

/// Poll one receive CQE through the verbs-shaped API.
#[inline(never)]
pub fn bench_rs_poll_recv_verbs(cq: &mut Cq, wc: &mut [WorkCompletion; 1]) -> usize {
    black_box(6u8);
    cq.poll(wc)
}

/// Poll one receive CQE through the low-level API: take it, retire its receive WR, publish
/// the consumer index. Returns the WR id, the CQE opcode and the byte count.
#[inline(never)]
pub fn bench_rs_poll_recv_lowlevel(
    cq: &mut RawCq,
    rq: &mut RecvQueue,
) -> Option<(u64, CqeOpcode, u32)> {
    let cqe = cq.next()?;
    let wr_id = rq.retire(cqe.wqe_counter()).ok()?;
    cq.publish_ci();
    Some((wr_id, cqe.opcode(), cqe.byte_len()))
}

/// Run `f` with `cq` converted into the low-level poller (a small stand-in CQ meanwhile), then
/// convert it back.
fn with_raw<R>(cq: &mut Cq, pd: &Pd, f: impl FnOnce(&mut RawCq) -> R) -> Result<R, BoxErr> {
    let stand_in = Cq::new(
        pd.context(),
        mlx5::CqInit {
            cqe: 1,
            ..mlx5::CqInit::default()
        },
        None,
    )?;
    let mut raw = std::mem::replace(cq, stand_in)
        .into_raw()
        .map_err(|_| "unsignaled reports pending")?;
    let r = f(&mut raw);
    *cq = raw.into_verbs();
    Ok(r)
}

// ---- the unchecked tier (each caller states how it meets the contract) ----

/// One inline 32-byte SEND through the unchecked tier.
///
/// # Safety
/// As [`SendQueue::send_inline_unchecked`].
#[inline(never)]
pub unsafe fn bench_rs_send_inline32_unchecked(sq: &mut SendQueue, wr_id: u64, data: &[u8]) {
    black_box(7u8);
    // SAFETY: the caller's contract is this function's.
    unsafe { sq.send_inline_unchecked(data, wr_id, SendFlags::SIGNALED) }
}

/// One inline 64-byte SEND through the unchecked tier.
///
/// # Safety
/// As [`SendQueue::send_inline_unchecked`].
#[inline(never)]
pub unsafe fn bench_rs_send_inline64_unchecked(sq: &mut SendQueue, wr_id: u64, data: &[u8]) {
    black_box(8u8);
    // SAFETY: the caller's contract is this function's.
    unsafe { sq.send_inline_unchecked(data, wr_id, SendFlags::SIGNALED) }
}

/// One inline 8-byte RDMA WRITE through the unchecked tier (UCX's `put_short` shape).
///
/// # Safety
/// As [`SendQueue::write_inline_unchecked`].
#[inline(never)]
pub unsafe fn bench_rs_write_inline8_unchecked(
    sq: &mut SendQueue,
    wr_id: u64,
    data: &[u8],
    raddr: u64,
    rkey: u32,
) {
    // SAFETY: the caller's contract is this function's.
    unsafe { sq.write_inline_unchecked(data, raddr, rkey, wr_id, SendFlags::SIGNALED) }
}

/// A chain of 32 SENDs through the unchecked batch: one credit check, 32 WQEs with the
/// counters in registers, one doorbell. Returns whether there was room.
#[inline(never)]
pub fn bench_rs_chain32_unchecked(sq: &mut SendQueue, wr_id: u64, sge: &Sge) -> bool {
    if sq.credits() < CHAIN as u32 {
        return false;
    }
    sq.unchecked(|b| {
        for i in 0..CHAIN as u64 {
            // SAFETY: 32 WRs against the 32 or more credits counted above; the bench QP is RC;
            // the SGE is 64 bytes and the queue has max_send_sge 1.
            unsafe { b.send_sge(sge, wr_id + i, SendFlags::SIGNALED) };
        }
    });
    true
}

/// Poll the [`FILL`] send CQEs in the CQ through the unchecked single-QP poller, one batch;
/// returns how many, and the sum of their ids (so that nothing is optimised away).
///
/// # Safety
/// As [`SendQueue::poll_batch_unchecked`].
#[inline(never)]
pub unsafe fn bench_rs_poll_cqe_unchecked(cq: &mut RawCq, sq: &mut SendQueue) -> (usize, u64) {
    let mut sum = 0u64;
    // SAFETY: the caller's contract is this function's.
    let n = unsafe { sq.poll_batch_unchecked(cq, FILL, |id| sum = sum.wrapping_add(id)) };
    (n, sum)
}

/// One receive through the unchecked tier, published at once.
///
/// # Safety
/// As [`RecvQueue::push_unchecked`].
#[inline(never)]
pub unsafe fn bench_rs_recv1_unchecked(rq: &mut RecvQueue, wr_id: u64, sge: &Sge) {
    // SAFETY: the caller's contract is this function's.
    unsafe { rq.push_unchecked(wr_id, sge) };
    rq.publish();
}

/// A chain of 32 receives through the unchecked tier, one publication.
///
/// # Safety
/// As [`RecvQueue::push_unchecked`], for 32 receives.
#[inline(never)]
pub unsafe fn bench_rs_recv_chain32_unchecked(rq: &mut RecvQueue, wr_id: u64, sge: &Sge) {
    for i in 0..CHAIN as u64 {
        // SAFETY: the caller's contract is this function's.
        unsafe { rq.push_unchecked(wr_id + i, sge) };
    }
    rq.publish();
}

/// Poll one receive CQE through the unchecked single-QP poller.
///
/// # Safety
/// As [`RecvQueue::poll_unchecked`].
#[inline(never)]
pub unsafe fn bench_rs_poll_recv_unchecked(
    cq: &mut RawCq,
    rq: &mut RecvQueue,
) -> Option<(u64, u32)> {
    // SAFETY: the caller's contract is this function's.
    unsafe { rq.poll_unchecked(cq) }
}

// ---- the rig ----

/// Our side's objects: one RC QP connected to itself on a stepped emulator.
#[derive(Debug)]
struct Rig {
    emu: Emulator,
    qp: Qp,
    scq: Cq,
    rcq: Cq,
    mr: Mr,
    recv_posted: u32,
    pending_cqes: u32,
    next_wr_id: u64,
    // Kept alive for the QP (dropped after it).
    _pd: Pd,
    _buf: Arc<DmaBuf>,
    _ctx: Context,
}

type BoxErr = Box<dyn std::error::Error>;

impl Rig {
    fn new() -> Result<Self, BoxErr> {
        let emu = Emulator::new(EmuConfig {
            num_hcas: 1,
            mode: RunMode::Stepped,
            ..EmuConfig::default()
        });
        let ctx = Context::open(emu.open(0).map_err(|e| format!("emulator open: {e}"))?)?;
        let pd = Pd::new(&ctx)?;
        let init = CqInit {
            cqe: CQ_SIZE,
            ..CqInit::default()
        };
        let scq = Cq::new(&ctx, init, None)?;
        let rcq = Cq::new(&ctx, init, None)?;
        let mut qa = QpInitAttr::new(QpType::Rc, &scq, &rcq);
        qa.cap = QpCap {
            max_send_wr: SQ_WRS,
            max_recv_wr: RQ_WRS,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: PAYLOAD as u32,
        };
        qa.bf_policy = BfPolicy::InlineOnly;
        // As libmlx5 with `MLX5_SCATTER_TO_CQE=0` on the other side.
        qa.scatter_to_cqe = false;
        let mut qp = Qp::new(&pd, &qa)?;
        let buf = Arc::new(DmaBuf::new(4096)?);
        buf.write(0, &[0x5a; PAYLOAD]);
        // Remote write for the unchecked RDMA WRITE row (to itself).
        let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        let mr = pd.reg_mr(&buf, access)?;
        let lid = ctx.query_port(1)?.lid;
        qp.to_init(1, access)?;
        let me = RemoteQp {
            qpn: qp.qpn(),
            psn: 0,
            lid,
            gid: None,
        };
        qp.to_rtr(&me, 3, 0)?;
        qp.to_rts(0, 7)?;
        let mut rig = Self {
            emu,
            qp,
            scq,
            rcq,
            mr,
            recv_posted: 0,
            pending_cqes: 0,
            next_wr_id: 0,
            _pd: pd,
            _buf: buf,
            _ctx: ctx,
        };
        // The flight recorder's cost when on: `MLX5_BENCH_RECORDER=N` (records per queue).
        if let Some(n) = std::env::var("MLX5_BENCH_RECORDER")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
        {
            let cfg = mlx5::RecorderConfig::new(n);
            rig.qp.enable_recorder(&cfg)?;
            rig.scq.enable_recorder(&cfg)?;
            rig.rcq.enable_recorder(&cfg)?;
        }
        rig.refill_recv()?;
        Ok(rig)
    }

    fn sge(&self) -> Sge {
        self.mr.sge(0, PAYLOAD as u32)
    }

    fn refill_recv(&mut self) -> Result<(), BoxErr> {
        let mut wcs = [WorkCompletion::default(); 32];
        loop {
            let n = self.rcq.poll(&mut wcs);
            for wc in &wcs[..n] {
                if wc.status != WcStatus::SUCCESS {
                    return Err(format!("receive completion {wc:?}").into());
                }
            }
            self.recv_posted -= n as u32;
            if n == 0 {
                break;
            }
        }
        let sge = [self.mr.sge(2048, 1024)];
        while self.recv_posted < RQ_WRS {
            let wr = RecvWr {
                wr_id: 0,
                sg_list: &sge,
            };
            self.qp.post_recv(&[wr]).map_err(|(_, e)| e)?;
            self.recv_posted += 1;
        }
        Ok(())
    }

    /// Let the device execute everything posted, poll every send completion (unmeasured) and
    /// top up the receive queue.
    fn drain_send(&mut self) -> Result<(), BoxErr> {
        self.emu.run_until_idle();
        let mut wcs = [WorkCompletion::default(); 32];
        while self.pending_cqes > 0 {
            let n = self.scq.poll(&mut wcs);
            if n == 0 {
                return Err(format!("{} send completions missing", self.pending_cqes).into());
            }
            for wc in &wcs[..n] {
                if wc.status != WcStatus::SUCCESS {
                    return Err(format!("send completion {wc:?}").into());
                }
            }
            self.pending_cqes -= n as u32;
        }
        self.refill_recv()
    }

    /// The receive queue (the QP is created with one).
    fn rq(qp: &mut Qp) -> Result<&mut RecvQueue, BoxErr> {
        qp.rq().ok_or_else(|| "the QP has no receive queue".into())
    }

    /// Send `n` (a multiple of [`CHAIN`]) SENDs to self (unmeasured) and run the device, so
    /// that `n` receives are consumed and `n` receive CQEs wait in the receive CQ; drain the
    /// send completions.
    fn send_to_self(&mut self, n: usize) -> Result<(), BoxErr> {
        let sge = [self.sge()];
        let mut wrs = [SendWr::send(0, &sge, SendFlags::SIGNALED); CHAIN];
        for _ in 0..n / CHAIN {
            for wr in wrs.iter_mut() {
                wr.wr_id = self.next_wr_id;
                self.next_wr_id += 1;
            }
            self.qp.post_send(&wrs).map_err(|(_, e)| e)?;
            self.pending_cqes += CHAIN as u32;
            self.emu.run_until_idle();
        }
        let mut wcs = [WorkCompletion::default(); 32];
        while self.pending_cqes > 0 {
            let got = self.scq.poll(&mut wcs);
            if got == 0 {
                return Err(format!("{} send completions missing", self.pending_cqes).into());
            }
            if let Some(wc) = wcs[..got].iter().find(|wc| wc.status != WcStatus::SUCCESS) {
                return Err(format!("send completion {wc:?}").into());
            }
            self.pending_cqes -= got as u32;
        }
        Ok(())
    }

    /// Make room for `n` receives (unmeasured): SENDs to self consume them and their receive
    /// completions are polled.
    fn make_recv_room(&mut self, n: usize) -> Result<(), BoxErr> {
        self.send_to_self(n)?;
        let mut wcs = [WorkCompletion::default(); 32];
        let mut got = 0;
        while got < n {
            let k = self.rcq.poll(&mut wcs[..(n - got).min(32)]);
            if k == 0 {
                return Err(format!("{} receive completions missing", n - got).into());
            }
            if let Some(wc) = wcs[..k].iter().find(|wc| wc.status != WcStatus::SUCCESS) {
                return Err(format!("receive completion {wc:?}").into());
            }
            got += k;
        }
        self.recv_posted -= n as u32;
        Ok(())
    }

    /// Receive posts: single receives timed in batches of [`ROUND`] calls, chains one call
    /// each. Before every timed region, SENDs to self consume as many receives as it posts.
    fn recv_posts(
        &mut self,
        calls: usize,
        s: &mut Samples,
        out: &mut Vec<String>,
    ) -> Result<(), BoxErr> {
        let sge = [self.mr.sge(2048, 1024)];
        for api in ["verbs", "lowlevel", "unchecked"] {
            for _ in 0..calls.div_ceil(ROUND) {
                self.make_recv_room(ROUND)?;
                let first = self.next_wr_id;
                self.next_wr_id += ROUND as u64;
                let qp = &mut self.qp;
                s.time(|| -> Result<(), BoxErr> {
                    for id in first..first + ROUND as u64 {
                        if api == "unchecked" {
                            // SAFETY: the QP is in RTS; `make_recv_room` freed ROUND slots of
                            // the RQ for these ROUND receives; the SGE is 1024 bytes.
                            unsafe {
                                bench_rs_recv1_unchecked(Self::rq(qp)?, id, black_box(&sge[0]))
                            };
                        } else if api == "verbs" {
                            let wr = [RecvWr {
                                wr_id: id,
                                sg_list: &sge,
                            }];
                            bench_rs_recv1_verbs(qp, black_box(&wr)).map_err(|e| e.1)?;
                        } else {
                            bench_rs_recv1_lowlevel(Self::rq(qp)?, id, black_box(&sge[0]))?;
                        }
                    }
                    Ok(())
                })?;
                self.recv_posted += ROUND as u32;
            }
            out.push(s.report("recv1", api, ROUND, 1));
        }
        let mut wrs = [RecvWr {
            wr_id: 0,
            sg_list: &sge,
        }; CHAIN];
        for api in ["verbs", "lowlevel", "unchecked"] {
            for _ in 0..calls {
                self.make_recv_room(CHAIN)?;
                let id = self.next_wr_id;
                self.next_wr_id += CHAIN as u64;
                if api == "verbs" {
                    for (k, wr) in wrs.iter_mut().enumerate() {
                        wr.wr_id = id + k as u64;
                    }
                    s.time(|| bench_rs_recv_chain32_verbs(&mut self.qp, black_box(&wrs)))
                        .map_err(|(_, e)| e)?;
                } else if api == "unchecked" {
                    let rq = Self::rq(&mut self.qp)?;
                    // SAFETY: the QP is in RTS; `make_recv_room` freed CHAIN slots for these
                    // CHAIN receives; the SGE is 1024 bytes.
                    s.time(|| unsafe {
                        bench_rs_recv_chain32_unchecked(rq, id, black_box(&sge[0]));
                    });
                } else {
                    let rq = Self::rq(&mut self.qp)?;
                    s.time(|| bench_rs_recv_chain32_lowlevel(rq, id, black_box(&sge[0])))?;
                }
                self.recv_posted += CHAIN as u32;
            }
            out.push(s.report("recv_chain32", api, 1, CHAIN as u32));
        }
        Ok(())
    }

    /// Receive polling: [`FILL`] SENDs to self (unmeasured) put as many receive CQEs in the
    /// receive CQ, which are then polled one per call, the `FILL` calls timed as one region.
    fn recv_polls(
        &mut self,
        calls: usize,
        s: &mut Samples,
        out: &mut Vec<String>,
    ) -> Result<(), BoxErr> {
        for api in ["verbs", "lowlevel", "unchecked"] {
            for _ in 0..calls.div_ceil(FILL) {
                self.send_to_self(FILL)?;
                let rq = Self::rq(&mut self.qp)?;
                let good = if api == "verbs" {
                    let cq = &mut self.rcq;
                    s.time(|| {
                        let mut good = 0;
                        for _ in 0..FILL {
                            let mut one = [WorkCompletion::default(); 1];
                            if bench_rs_poll_recv_verbs(cq, &mut one) == 1
                                && one[0].status == WcStatus::SUCCESS
                                && one[0].opcode == WcOpcode::RECV
                                && one[0].byte_len == PAYLOAD as u32
                            {
                                good += 1;
                            }
                        }
                        good
                    })
                } else if api == "unchecked" {
                    with_raw(&mut self.rcq, &self._pd, |cq| {
                        s.time(|| {
                            let mut good = 0;
                            for _ in 0..FILL {
                                // SAFETY: the receive CQ is this QP's only (no SRQ); no reset
                                // since it was created; FILL (64) of 512 entries pend.
                                let got = unsafe { bench_rs_poll_recv_unchecked(cq, rq) };
                                if matches!(got, Some((_, len)) if len == PAYLOAD as u32) {
                                    good += 1;
                                }
                            }
                            cq.publish_ci();
                            good
                        })
                    })?
                } else {
                    with_raw(&mut self.rcq, &self._pd, |cq| {
                        s.time(|| {
                            let mut good = 0;
                            for _ in 0..FILL {
                                if matches!(
                                    bench_rs_poll_recv_lowlevel(cq, rq),
                                    Some((_, op, len)) if op == CqeOpcode::RESP_SEND && len == PAYLOAD as u32
                                ) {
                                    good += 1;
                                }
                            }
                            good
                        })
                    })?
                };
                if good != FILL {
                    return Err(format!(
                        "poll_recv {api}: {good} of {FILL} receive CQEs were 64-byte successes"
                    )
                    .into());
                }
                self.recv_posted -= FILL as u32;
                self.refill_recv()?;
            }
            out.push(s.report("poll_recv", api, FILL, 1));
        }
        Ok(())
    }

    /// Single-WR posts, timed in batches of [`ROUND`] back-to-back calls (the clock is too
    /// coarse for one call); the device runs and the completions are drained between batches.
    fn single_posts(
        &mut self,
        op: &str,
        inline: bool,
        calls: usize,
        s: &mut Samples,
        out: &mut Vec<String>,
    ) -> Result<(), BoxErr> {
        let small = op == "send_inline32";
        let full = [0x5au8; PAYLOAD];
        let payload = if small {
            &full[..PAYLOAD_SMALL]
        } else {
            &full[..]
        };
        let parts: [&[u8]; 1] = [payload];
        let sge = [self.sge()];
        let apis: &[&str] = if inline {
            &["verbs", "lowlevel", "unchecked"]
        } else {
            &["verbs", "lowlevel"]
        };
        for &api in apis {
            for _ in 0..calls.div_ceil(ROUND) {
                let first = self.next_wr_id;
                self.next_wr_id += ROUND as u64;
                let qp = &mut self.qp;
                if api == "unchecked" && qp.sq().credits() < ROUND as u32 {
                    return Err("no room for a round of unchecked posts".into());
                }
                s.time(|| -> Result<(), PostError> {
                    for id in first..first + ROUND as u64 {
                        match (api, inline) {
                            ("unchecked", _) => {
                                let (sq, data) = (qp.sq(), black_box(payload));
                                if small {
                                    // SAFETY: ROUND posts against the ROUND or more credits
                                    // counted before the region; RC; 32 bytes <= max_inline 64.
                                    unsafe { bench_rs_send_inline32_unchecked(sq, id, data) };
                                } else {
                                    // SAFETY: as above, 64 bytes <= max_inline 64.
                                    unsafe { bench_rs_send_inline64_unchecked(sq, id, data) };
                                }
                                Ok(())
                            }
                            ("verbs", true) => {
                                let wr = [SendWr::send_inline(id, &parts, SendFlags::SIGNALED)];
                                if small {
                                    bench_rs_send_inline32_verbs(qp, black_box(&wr))
                                } else {
                                    bench_rs_send_inline64_verbs(qp, black_box(&wr))
                                }
                                .map_err(|e| e.1)
                            }
                            ("verbs", false) => {
                                let wr = [SendWr::send(id, &sge, SendFlags::SIGNALED)];
                                bench_rs_send_sge64_verbs(qp, black_box(&wr)).map_err(|e| e.1)
                            }
                            (_, true) if small => {
                                bench_rs_send_inline32_lowlevel(qp.sq(), id, black_box(payload))
                            }
                            (_, true) => {
                                bench_rs_send_inline64_lowlevel(qp.sq(), id, black_box(payload))
                            }
                            (_, false) => {
                                bench_rs_send_sge64_lowlevel(qp.sq(), id, black_box(&sge[0]))
                            }
                        }?;
                    }
                    Ok(())
                })?;
                self.pending_cqes += ROUND as u32;
                self.drain_send()?;
            }
            out.push(s.report(op, api, ROUND, 1));
        }
        Ok(())
    }

    /// The unchecked 8-byte inline RDMA WRITE (to this QP's own buffer), timed as the single
    /// posts are.
    fn write8(
        &mut self,
        calls: usize,
        s: &mut Samples,
        out: &mut Vec<String>,
    ) -> Result<(), BoxErr> {
        let data = [0xa5u8; 8];
        let (raddr, rkey) = (self.mr.addr() + 1024, self.mr.rkey());
        for _ in 0..calls.div_ceil(ROUND) {
            let first = self.next_wr_id;
            self.next_wr_id += ROUND as u64;
            let sq = self.qp.sq();
            if sq.credits() < ROUND as u32 {
                return Err("no room for a round of unchecked WRITEs".into());
            }
            s.time(|| {
                for id in first..first + ROUND as u64 {
                    // SAFETY: ROUND posts against the ROUND or more credits counted above; RC;
                    // 8 bytes <= max_inline 64.
                    unsafe {
                        bench_rs_write_inline8_unchecked(sq, id, black_box(&data), raddr, rkey)
                    };
                }
            });
            self.pending_cqes += ROUND as u32;
            self.drain_send()?;
        }
        out.push(s.report("write_inline8", "unchecked", ROUND, 1));
        Ok(())
    }

    /// Chains, every call timed on its own; the device runs between calls.
    fn chains(
        &mut self,
        calls: usize,
        s: &mut Samples,
        out: &mut Vec<String>,
    ) -> Result<(), BoxErr> {
        let sge = [self.sge()];
        let mut wrs = [SendWr::send(0, &sge, SendFlags::SIGNALED); CHAIN];
        for api in ["verbs", "lowlevel", "unchecked"] {
            for _ in 0..calls {
                let id = self.next_wr_id;
                self.next_wr_id += CHAIN as u64;
                if api == "unchecked" {
                    if !s.time(|| bench_rs_chain32_unchecked(self.qp.sq(), id, black_box(&sge[0])))
                    {
                        return Err("no room for an unchecked chain".into());
                    }
                } else if api == "verbs" {
                    for (k, wr) in wrs.iter_mut().enumerate() {
                        wr.wr_id = id + k as u64;
                    }
                    s.time(|| bench_rs_chain32_verbs(&mut self.qp, black_box(&wrs)))
                        .map_err(|(_, e)| e)?;
                } else {
                    s.time(|| bench_rs_chain32_lowlevel(self.qp.sq(), id, black_box(&sge[0])))?;
                }
                self.pending_cqes += CHAIN as u32;
                self.drain_send()?;
            }
            out.push(s.report("chain32", api, 1, CHAIN as u32));
        }
        Ok(())
    }

    /// Polling: the CQ is filled with [`FILL`] completions (posted unmeasured, the device
    /// run), then they are polled one per call, the `FILL` calls timed as one region.
    fn polls(
        &mut self,
        calls: usize,
        s: &mut Samples,
        out: &mut Vec<String>,
    ) -> Result<(), BoxErr> {
        let sge = [self.sge()];
        let mut wrs = [SendWr::send(0, &sge, SendFlags::SIGNALED); CHAIN];
        for api in ["verbs", "lowlevel", "unchecked"] {
            for _ in 0..calls.div_ceil(FILL) {
                for _ in 0..FILL / CHAIN {
                    for wr in wrs.iter_mut() {
                        wr.wr_id = self.next_wr_id;
                        self.next_wr_id += 1;
                    }
                    self.qp.post_send(&wrs).map_err(|(_, e)| e)?;
                }
                self.emu.run_until_idle();
                let qp = &mut self.qp;
                let good = if api == "verbs" {
                    let cq = &mut self.scq;
                    s.time(|| {
                        let mut good = 0;
                        for _ in 0..FILL {
                            let mut one = [WorkCompletion::default(); 1];
                            if bench_rs_poll_cqe_verbs(cq, &mut one) == 1
                                && one[0].status == WcStatus::SUCCESS
                            {
                                good += 1;
                            }
                        }
                        good
                    })
                } else if api == "unchecked" {
                    with_raw(&mut self.scq, &self._pd, |cq| {
                        s.time(|| {
                            // SAFETY: the send CQ is this QP's only; no reset since it was
                            // created; FILL (64) of 512 entries pend.
                            let (good, _) = unsafe { bench_rs_poll_cqe_unchecked(cq, qp.sq()) };
                            cq.publish_ci();
                            good
                        })
                    })?
                } else {
                    with_raw(&mut self.scq, &self._pd, |cq| {
                        s.time(|| {
                            let mut good = 0;
                            for _ in 0..FILL {
                                if matches!(
                                    bench_rs_poll_cqe_lowlevel(cq, qp.sq()),
                                    Some((_, op)) if op == CqeOpcode::REQ
                                ) {
                                    good += 1;
                                }
                            }
                            good
                        })
                    })?
                };
                if good != FILL {
                    return Err(format!("poll {api}: {good} of {FILL} CQEs were successes").into());
                }
                self.refill_recv()?;
            }
            // The unchecked row polls the FILL CQEs in one call (a batch).
            let (batch, per_call) = if api == "unchecked" {
                (1, FILL as u32)
            } else {
                (FILL, 1)
            };
            out.push(s.report("poll_cqe", api, batch, per_call));
        }
        Ok(())
    }
}

/// Run every operation `calls` times (after a short warm-up) and return the `result` lines,
/// plus an `info` line with the send queue's doorbell statistics.
///
/// # Errors
/// Any failure of the driver or a completion that is not a success.
pub fn run(calls: usize) -> Result<Vec<String>, BoxErr> {
    let mut rig = Rig::new()?;
    let mut s = Samples::with_capacity(calls);
    let mut out = Vec::new();
    for _ in 0..calls {
        s.time(|| black_box(0));
    }
    out.push(s.report("timer_overhead", "none", 1, 1));
    // Warm-up: every operation through the same wrappers (not reported, and not counted by
    // callgrind: `bench_zero_stats`), then the measured pass.
    let mut warm = Vec::new();
    for pass in 0..2 {
        let (n, sink) = if pass == 0 {
            (WARMUP, &mut warm)
        } else {
            bench_zero_stats();
            (calls, &mut out)
        };
        rig.single_posts("send_inline32", true, n, &mut s, sink)?;
        rig.single_posts("send_inline64", true, n, &mut s, sink)?;
        rig.single_posts("send_sge64", false, n, &mut s, sink)?;
        rig.write8(n, &mut s, sink)?;
        rig.chains(n, &mut s, sink)?;
        rig.polls(n, &mut s, sink)?;
        rig.recv_posts(n, &mut s, sink)?;
        rig.recv_polls(n, &mut s, sink)?;
    }
    let st = rig.qp.sq_ref().stats();
    let bf = rig.qp.sq_ref().bfreg();
    out.push(format!(
        "info wqes={} doorbells={} bf_copies={} bf_size={} dedicated={}",
        st.wqes, st.doorbells, st.bf_copies, bf.bf_size, bf.dedicated
    ));
    Ok(out)
}
