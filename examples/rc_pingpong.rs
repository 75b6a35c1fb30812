//! RC ping-pong on the verbs-shaped API: two RC QPs connected to each other, SENDs back and
//! forth, receives posted ahead, every completion polled from a CQ.
//!
//! ```sh
//! cargo run --release --example rc_pingpong [ITERATIONS]
//! ```
//!
//! Runs on the first ConnectX that device discovery finds, else on the emulated HCA in this
//! process (cargo feature `emulator` of `mlx5`; in your own `Cargo.toml`:
//! `mlx5 = { ..., features = ["emulator"] }`). Both QPs are on one device, connected through
//! its port (loopback), so one program shows both ends; between two machines, exchange the
//! [`RemoteQp`] of each side out of band (a TCP socket) instead.

use std::error::Error;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mlx5::emulator::Hca;
use mlx5::{
    Access, Context, Cq, CqInit, DmaBuf, Mr, Pd, Qp, QpInitAttr, QpType, RecvWr, RemoteQp,
    SendFlags, SendWr, WcOpcode, WorkCompletion,
};

/// Message size in bytes.
const SIZE: u32 = 64;
/// Receives kept posted on each QP.
const RX_DEPTH: u64 = 16;
/// A run that takes longer than this is a failure, not a hang.
const DEADLINE: Duration = Duration::from_secs(30);

/// One end: a QP with a CQ for its sends and one for its receives, and a registered buffer.
struct End {
    scq: Cq,
    rcq: Cq,
    qp: Qp,
    buf: Arc<DmaBuf>,
    mr: Mr,
}

impl End {
    fn new(ctx: &Context, pd: &Pd) -> Result<End, Box<dyn Error>> {
        let scq = Cq::new(ctx, CqInit::default(), None)?;
        let rcq = Cq::new(ctx, CqInit::default(), None)?;
        let qp = Qp::new(pd, &QpInitAttr::new(QpType::Rc, &scq, &rcq))?;
        // Receive slots in the first half, the outgoing message in the second.
        let buf = Arc::new(DmaBuf::new(2 * RX_DEPTH as usize * SIZE as usize)?);
        let mr = pd.reg_mr(&buf, Access::LOCAL_WRITE)?;
        Ok(End {
            scq,
            rcq,
            qp,
            buf,
            mr,
        })
    }

    /// How the other side reaches this QP: QPN, first PSN, LID and (RoCE) GID.
    fn address(&self, ctx: &Context, psn: u32) -> Result<(RemoteQp, u8), Box<dyn Error>> {
        let port = ctx.query_port(1)?;
        let gid = if port.is_roce() {
            ctx.find_gid(1)?
        } else {
            None
        };
        let remote = RemoteQp {
            qpn: self.qp.qpn(),
            psn,
            lid: port.lid,
            gid: gid.map(|g| g.1),
        };
        Ok((remote, gid.map_or(0, |g| g.0 as u8)))
    }

    fn post_recv(&mut self, slot: u64) -> Result<(), Box<dyn Error>> {
        let sge = [self.mr.sge(slot * u64::from(SIZE), SIZE)];
        self.qp
            .post_recv(&[RecvWr {
                wr_id: slot,
                sg_list: &sge,
            }])
            .map_err(|(_, e)| e)?;
        Ok(())
    }

    fn send(&mut self, wr_id: u64, msg: &[u8]) -> Result<(), Box<dyn Error>> {
        let off = RX_DEPTH * u64::from(SIZE);
        self.buf.write(off as usize, msg);
        let sge = [self.mr.sge(off, msg.len() as u32)];
        self.qp
            .post_send(&[SendWr::send(wr_id, &sge, SendFlags::SIGNALED)])
            .map_err(|(_, e)| e)?;
        Ok(())
    }
}

/// Poll `cq` until one completion arrives; fail on an error completion or at the deadline.
fn wait(cq: &mut Cq, what: &str, deadline: Instant) -> Result<WorkCompletion, Box<dyn Error>> {
    let mut wc = [WorkCompletion::default(); 1];
    while cq.poll(&mut wc) == 0 {
        if Instant::now() > deadline {
            return Err(format!("no {what} completion within {DEADLINE:?}").into());
        }
        std::hint::spin_loop();
    }
    if !wc[0].is_ok() {
        return Err(format!("{what} failed: {}", wc[0]).into());
    }
    Ok(wc[0])
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rc_pingpong: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn Error>> {
    let iters: u64 = match std::env::args().nth(1) {
        Some(a) => a.parse().map_err(|e| format!("ITERATIONS {a:?}: {e}"))?,
        None => 1000,
    };
    let hca = Hca::first_or_emulated();
    let ctx = hca.open()?;
    println!("device: {hca}");
    let pd = Pd::new(&ctx)?;
    let mut a = End::new(&ctx, &pd)?;
    let mut b = End::new(&ctx, &pd)?;

    // RESET -> INIT -> RTR -> RTS, each QP towards the other.
    let (addr_a, sgid_a) = a.address(&ctx, 0x100)?;
    let (addr_b, sgid_b) = b.address(&ctx, 0x200)?;
    for (end, remote, sgid) in [(&mut a, &addr_b, sgid_a), (&mut b, &addr_a, sgid_b)] {
        end.qp.to_init(1, Access::LOCAL_WRITE)?;
        end.qp.to_rtr(remote, mlx5::Mtu::M1024, sgid)?;
    }
    // rnr_retry 3: a SEND that finds no receive posted is retried 3 times, then fails with an
    // error completion (7 would retry for ever).
    a.qp.to_rts(0x100, 3)?;
    b.qp.to_rts(0x200, 3)?;
    println!(
        "connected: QP {:#x} <-> QP {:#x} (RC, LID {})",
        a.qp.qpn(),
        b.qp.qpn(),
        addr_a.lid
    );

    for slot in 0..RX_DEPTH {
        a.post_recv(slot)?;
        b.post_recv(slot)?;
    }
    let deadline = Instant::now() + DEADLINE;
    let start = Instant::now();
    for i in 0..iters {
        let ping = message(b'P', i);
        a.send(i, &ping)?;
        let rx = wait(&mut b.rcq, "receive", deadline)?;
        check(&b, rx, &ping)?;
        b.post_recv(rx.wr_id)?;
        let pong = message(b'Q', i);
        b.send(i, &pong)?;
        let rx = wait(&mut a.rcq, "receive", deadline)?;
        check(&a, rx, &pong)?;
        a.post_recv(rx.wr_id)?;
        // Each SEND's own completion (signaled) frees its slot in the send queue.
        wait(&mut a.scq, "send", deadline)?;
        wait(&mut b.scq, "send", deadline)?;
    }
    let elapsed = start.elapsed();
    println!(
        "{iters} round trips of {SIZE} bytes in {:.3} ms: {:.2} us per round trip",
        elapsed.as_secs_f64() * 1e3,
        elapsed.as_secs_f64() * 1e6 / iters.max(1) as f64
    );
    println!("rc_pingpong: ok");
    Ok(())
}

/// Message `i` of a side: its tag, the iteration number, then a pattern.
fn message(tag: u8, i: u64) -> [u8; SIZE as usize] {
    let mut m = [0u8; SIZE as usize];
    m[0] = tag;
    m[1..9].copy_from_slice(&i.to_le_bytes());
    for (k, b) in m.iter_mut().enumerate().skip(9) {
        *b = (k as u8) ^ (i as u8);
    }
    m
}

/// The receive `wc` landed `expect` in its slot of `end`'s buffer.
fn check(end: &End, wc: WorkCompletion, expect: &[u8]) -> Result<(), Box<dyn Error>> {
    let mut got = [0u8; SIZE as usize];
    end.buf
        .read((wc.wr_id * u64::from(SIZE)) as usize, &mut got);
    if wc.opcode != WcOpcode::RECV || wc.byte_len != SIZE || got[..] != expect[..] {
        return Err(format!("receive {} has wrong contents", wc.wr_id).into());
    }
    Ok(())
}
