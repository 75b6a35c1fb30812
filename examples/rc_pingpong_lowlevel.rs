//! RC ping-pong on the low-level API, as a latency-sensitive program would write it:
//!
//! - inline SENDs built segment by segment (`SendQueue::send` → `WqeBuilder::inline` →
//!   `finish`), one doorbell per batch (`SendQueue::ring`);
//! - selective signaling: only every `SIGNAL_EVERY`-th SEND asks for a completion, and that one
//!   completion retires the unsignaled SENDs before it (`SendQueue::retire`);
//! - receives posted ahead and re-posted in batches (`RecvQueue::push`, one `publish`);
//! - batched polling of raw completions (`RawCq` as an iterator, one `publish_ci` per batch);
//! - the send half and the receive half of one QP on two threads (`Qp::split`), a credit
//!   counter between them so the sender never outruns the receives the peer has posted.
//!
//! QP A pings from two threads; QP B (main thread, verbs API) echoes each message back.
//!
//! ```sh
//! cargo run --release --example rc_pingpong_lowlevel [MESSAGES]
//! ```
//!
//! Runs on the first ConnectX that device discovery finds, else on the emulated HCA in this
//! process (cargo feature `emulator` of `mlx5`).

use std::error::Error;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mlx5::emulator::Hca;
use mlx5::{
    Access, Context, Cq, CqInit, CqeKind, DmaBuf, Pd, Qp, QpCap, QpInitAttr, QpType, RawCq,
    RecvQueue, RecvWr, RemoteQp, SendFlags, SendQueue, SendWr, WorkCompletion,
};

/// Message size (inline: the payload is copied into the WQE, no memory registration needed).
const SIZE: usize = 32;
/// Receives posted ahead on each QP (and so the credit the sender may use).
const RX_DEPTH: u32 = 32;
/// One SEND in this many is signaled.
const SIGNAL_EVERY: u64 = 8;
/// Raw completions taken per poll batch.
const BATCH: usize = 16;
/// A run that takes longer than this is a failure, not a hang.
const DEADLINE: Duration = Duration::from_secs(30);

type Res<T> = Result<T, Box<dyn Error + Send + Sync>>;

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rc_pingpong_lowlevel: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn Error + Send + Sync>> {
    let total: u64 = match std::env::args().nth(1) {
        Some(a) => a.parse().map_err(|e| format!("MESSAGES {a:?}: {e}"))?,
        None => 10_000,
    };
    let hca = Hca::first_or_emulated();
    let ctx = hca.open()?;
    println!("device: {hca}");
    let pd = Pd::new(&ctx)?;
    let cap = QpCap {
        max_send_wr: 64,
        max_recv_wr: RX_DEPTH,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: SIZE as u32,
    };
    // A: one CQ per half, so each thread polls its own.
    let (a_scq, a_rcq) = (cq(&ctx)?, cq(&ctx)?);
    let mut a = Qp::new(
        &pd,
        &QpInitAttr {
            cap,
            ..QpInitAttr::new(QpType::Rc, &a_scq, &a_rcq)
        },
    )?;
    // B: the echo, on the verbs API.
    let (mut b_scq, mut b_rcq) = (cq(&ctx)?, cq(&ctx)?);
    let mut b = Qp::new(
        &pd,
        &QpInitAttr {
            cap,
            ..QpInitAttr::new(QpType::Rc, &b_scq, &b_rcq)
        },
    )?;
    connect(&ctx, &mut a, &mut b)?;
    println!(
        "connected: QP {:#x} (two threads) <-> QP {:#x} (echo)",
        a.qpn(),
        b.qpn()
    );

    // Receive buffers: RX_DEPTH slots of SIZE bytes for each QP.
    let a_buf = Arc::new(DmaBuf::new(RX_DEPTH as usize * SIZE)?);
    let a_mr = pd.reg_mr(&a_buf, Access::LOCAL_WRITE)?;
    let b_buf = Arc::new(DmaBuf::new(RX_DEPTH as usize * SIZE)?);
    let b_mr = pd.reg_mr(&b_buf, Access::LOCAL_WRITE)?;
    for slot in 0..u64::from(RX_DEPTH) {
        let sge = [b_mr.sge(slot * SIZE as u64, SIZE as u32)];
        b.post_recv(&[RecvWr {
            wr_id: slot,
            sg_list: &sge,
        }])
        .map_err(|(_, e)| e)?;
    }

    let a_scq = a_scq.into_raw().map_err(|_| "send CQ busy")?;
    let a_rcq = a_rcq.into_raw().map_err(|_| "receive CQ busy")?;
    // Pongs A has received: each one means B re-posted the receive the ping used.
    let received = AtomicU64::new(0);
    let abort = AtomicBool::new(false);
    let deadline = Instant::now() + DEADLINE;
    let start = Instant::now();
    let (sq, rq) = a.split();
    let rq = rq.ok_or("A has no receive queue")?;
    // A's receives are posted before any thread starts: the first pong must find one.
    for slot in 0..u64::from(RX_DEPTH) {
        rq.push(slot, &[a_mr.sge(slot * SIZE as u64, SIZE as u32)])?;
    }
    rq.publish();

    let (tx, rx, echoed) = std::thread::scope(|s| {
        let tx = s.spawn(|| {
            guard(&abort, || {
                sender(sq, a_scq, total, &received, deadline, &abort)
            })
        });
        let rx = s.spawn(|| {
            guard(&abort, || {
                receiver(rq, a_rcq, &a_buf, &a_mr, total, &received, deadline, &abort)
            })
        });
        let echoed = guard(&abort, || {
            echo(
                &mut b, &mut b_scq, &mut b_rcq, &b_buf, &b_mr, total, deadline, &abort,
            )
        });
        (join(tx), join(rx), echoed)
    });
    // Report the failure that stopped the others, not a thread's "stopped" answer to it.
    let first = [tx.as_ref().err(), rx.as_ref().err(), echoed.as_ref().err()]
        .into_iter()
        .flatten()
        .map(ToString::to_string)
        .min_by_key(|e| e.starts_with(STOPPED));
    if let Some(e) = first {
        return Err(e.into());
    }
    let (signaled, batches) = (tx?, rx?);
    let elapsed = start.elapsed();
    println!(
        "{total} messages of {SIZE} bytes pinged and echoed in {:.3} ms ({:.2} us per message)",
        elapsed.as_secs_f64() * 1e3,
        elapsed.as_secs_f64() * 1e6 / total.max(1) as f64
    );
    println!(
        "sender: {signaled} signaled completions for {total} SENDs (1 in {SIGNAL_EVERY}); \
         receiver: {batches} poll batches"
    );
    println!("rc_pingpong_lowlevel: ok");
    Ok(())
}

/// A's send half: inline SENDs while credits last, every `SIGNAL_EVERY`-th signaled; the send
/// CQ is drained in batches, each signaled completion retiring the SENDs before it.
fn sender(
    sq: &mut SendQueue,
    mut scq: RawCq,
    total: u64,
    received: &AtomicU64,
    deadline: Instant,
    abort: &AtomicBool,
) -> Res<u64> {
    let (mut sent, mut retired, mut signaled) = (0u64, 0u64, 0u64);
    while retired < total {
        // Post as many as the credits and the queue allow, then ring once.
        let credit = received.load(Ordering::Acquire) + u64::from(RX_DEPTH);
        let mut posted = 0;
        while sent < total && sent < credit && sq.free() > 0 {
            let last = sent + 1 == total;
            let flags = if sent % SIGNAL_EVERY == SIGNAL_EVERY - 1 || last {
                SendFlags::SIGNALED
            } else {
                SendFlags::default()
            };
            sq.send(flags)?.inline(&message(sent))?.finish(sent);
            sent += 1;
            posted += 1;
        }
        if posted > 0 {
            sq.ring();
        }
        let mut n = 0;
        for cqe in scq.by_ref().take(BATCH) {
            n += 1;
            match cqe.kind() {
                CqeKind::Send => {
                    // The wr_id of the signaled SEND; everything up to it is retired.
                    let id = sq.retire(cqe.wqe_counter())?;
                    retired = id + 1;
                    signaled += 1;
                }
                kind => {
                    return Err(
                        format!("send CQ: {kind:?} completion, status {}", cqe.status()).into(),
                    );
                }
            }
        }
        if n > 0 {
            scq.publish_ci();
        } else {
            idle(deadline, abort, "send completions")?;
        }
    }
    Ok(signaled)
}

/// A's receive half (its receives already posted): batches of raw receive completions, each
/// message checked, the used receives pushed again and published once per batch.
#[allow(clippy::too_many_arguments)]
fn receiver(
    rq: &mut RecvQueue,
    mut rcq: RawCq,
    buf: &DmaBuf,
    mr: &mlx5::Mr,
    total: u64,
    received: &AtomicU64,
    deadline: Instant,
    abort: &AtomicBool,
) -> Res<u64> {
    let (mut got, mut batches) = (0u64, 0u64);
    while got < total {
        let mut n = 0;
        for cqe in rcq.by_ref().take(BATCH) {
            n += 1;
            if cqe.kind() != CqeKind::Recv {
                return Err(format!(
                    "receive CQ: {:?} completion, status {}",
                    cqe.kind(),
                    cqe.status()
                )
                .into());
            }
            let slot = rq.retire(cqe.wqe_counter())?;
            let mut msg = [0u8; SIZE];
            buf.read(slot as usize * SIZE, &mut msg);
            if cqe.byte_len() as usize != SIZE || msg != message(got) {
                return Err(format!("pong {got} has wrong contents").into());
            }
            got += 1;
            rq.push(slot, &[mr.sge(slot * SIZE as u64, SIZE as u32)])?;
        }
        if n > 0 {
            rcq.publish_ci();
            rq.publish();
            batches += 1;
            received.store(got, Ordering::Release);
        } else {
            idle(deadline, abort, "pongs")?;
        }
    }
    Ok(batches)
}

/// B: every message received is sent back inline (verbs API), its receive re-posted.
#[allow(clippy::too_many_arguments)]
fn echo(
    b: &mut Qp,
    scq: &mut Cq,
    rcq: &mut Cq,
    buf: &DmaBuf,
    mr: &mlx5::Mr,
    total: u64,
    deadline: Instant,
    abort: &AtomicBool,
) -> Res<()> {
    let mut wcs = [WorkCompletion::default(); BATCH];
    let mut echoed = 0u64;
    while echoed < total {
        let n = rcq.poll(&mut wcs);
        for wc in &wcs[..n] {
            if !wc.is_ok() {
                return Err(format!("echo receive failed: {wc}").into());
            }
            let mut msg = [0u8; SIZE];
            buf.read(wc.wr_id as usize * SIZE, &mut msg);
            let data: [&[u8]; 1] = [&msg[..wc.byte_len as usize]];
            let last = echoed + 1 == total;
            let flags = if echoed % SIGNAL_EVERY == SIGNAL_EVERY - 1 || last {
                SendFlags::SIGNALED
            } else {
                SendFlags::default()
            };
            // The receive goes back before the echo: A sends its next ping as soon as the
            // pong arrives, and the credit it then uses is this receive.
            let sge = [mr.sge(wc.wr_id * SIZE as u64, SIZE as u32)];
            b.post_recv(&[RecvWr {
                wr_id: wc.wr_id,
                sg_list: &sge,
            }])
            .map_err(|(_, e)| e)?;
            b.post_send(&[SendWr::send_inline(echoed, &data, flags)])
                .map_err(|(_, e)| e)?;
            echoed += 1;
        }
        // Signaled echo completions free the send queue (the verbs poller retires them).
        let m = scq.poll(&mut wcs);
        if let Some(bad) = wcs[..m].iter().find(|wc| !wc.is_ok()) {
            return Err(format!("echo send failed: {bad}").into());
        }
        if n == 0 && m == 0 {
            idle(deadline, abort, "pings")?;
        }
    }
    // The last echo's completion, so B's send queue is empty when it is destroyed.
    while b.sq_ref().outstanding() > 0 {
        let m = scq.poll(&mut wcs);
        if m == 0 {
            idle(deadline, abort, "the last echo's completion")?;
        }
    }
    Ok(())
}

/// Message `i`: its number, then a pattern.
fn message(i: u64) -> [u8; SIZE] {
    let mut m = [0u8; SIZE];
    m[..8].copy_from_slice(&i.to_le_bytes());
    for (k, b) in m.iter_mut().enumerate().skip(8) {
        *b = (k as u8).wrapping_mul(31) ^ (i as u8);
    }
    m
}

/// What a thread answers when another thread failed first.
const STOPPED: &str = "stopped: another thread failed";

/// Nothing to do: give the CPU away, and stop at the deadline or when another thread failed.
fn idle(deadline: Instant, abort: &AtomicBool, waiting_for: &str) -> Res<()> {
    if abort.load(Ordering::Relaxed) {
        return Err(STOPPED.into());
    }
    if Instant::now() > deadline {
        return Err(format!("no {waiting_for} within {DEADLINE:?}").into());
    }
    std::thread::yield_now();
    Ok(())
}

/// Run `f`; on failure tell the other threads to stop.
fn guard<T>(abort: &AtomicBool, f: impl FnOnce() -> Res<T>) -> Res<T> {
    let r = f();
    if r.is_err() {
        abort.store(true, Ordering::Relaxed);
    }
    r
}

fn join<T>(h: std::thread::ScopedJoinHandle<'_, Res<T>>) -> Res<T> {
    h.join().map_err(|_| "a thread panicked")?
}

fn cq(ctx: &Context) -> Res<Cq> {
    Ok(Cq::new(ctx, CqInit::default(), None)?)
}

/// Connect `a` and `b` to each other through port 1 of their device.
fn connect(ctx: &Context, a: &mut Qp, b: &mut Qp) -> Res<()> {
    let port = ctx.query_port(1)?;
    let gid = if port.is_roce() {
        ctx.find_gid(1)?
    } else {
        None
    };
    let sgid = gid.map_or(0, |g| g.0 as u8);
    let addr = |qp: &Qp, psn| RemoteQp {
        qpn: qp.qpn(),
        psn,
        lid: port.lid,
        gid: gid.map(|g| g.1),
    };
    let (ra, rb) = (addr(a, 0x100), addr(b, 0x200));
    for (qp, remote) in [(&mut *a, &rb), (&mut *b, &ra)] {
        qp.to_init(1, Access::LOCAL_WRITE)?;
        qp.to_rtr(remote, mlx5::Mtu::M1024, sgid)?;
    }
    // rnr_retry 3: never retry for ever (the credits keep a receive posted for every SEND).
    a.to_rts(0x100, 3)?;
    b.to_rts(0x200, 3)?;
    Ok(())
}
