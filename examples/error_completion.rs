//! An error completion, provoked and explained: A does an RDMA WRITE into memory B registered
//! without `REMOTE_WRITE`. B's device refuses it; A gets a completion with status
//! `REM_ACCESS_ERR`, the CQE's syndrome and vendor syndrome; both QPs are now in the error
//! state (the device moved them: `Qp::state()` still says the last state set, RTS, and
//! `Qp::query_state()` asks the kernel); B's context gets an async event; and every WR posted
//! on A afterwards completes flushed (`WR_FLUSH_ERR`).
//!
//! ```sh
//! cargo run --release --example error_completion
//! ```
//!
//! Runs on the first ConnectX that device discovery finds, else on the emulated HCA in this
//! process (cargo feature `emulator` of `mlx5`).

use std::error::Error;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mlx5::emulator::Hca;
use mlx5::{
    Access, Context, Cq, CqInit, DmaBuf, Pd, Qp, QpInitAttr, QpType, RemoteQp, SendFlags, SendWr,
    WcStatus, WorkCompletion, WrOp,
};

/// A run that takes longer than this is a failure, not a hang.
const DEADLINE: Duration = Duration::from_secs(30);

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error_completion: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn Error>> {
    let hca = Hca::first_or_emulated();
    let ctx = hca.open()?;
    println!("device: {hca}");
    let pd = Pd::new(&ctx)?;
    let (mut a_cq, b_cq) = (cq(&ctx)?, cq(&ctx)?);
    let mut a = Qp::new(&pd, &QpInitAttr::new(QpType::Rc, &a_cq, &a_cq))?;
    let mut b = Qp::new(&pd, &QpInitAttr::new(QpType::Rc, &b_cq, &b_cq))?;
    connect(&ctx, &mut a, &mut b)?;

    let src = Arc::new(DmaBuf::new(4096)?);
    let src_mr = pd.reg_mr(&src, Access::LOCAL_WRITE)?;
    // B's memory: local access only. Its rkey is valid, but it grants no remote write.
    let dst = Arc::new(DmaBuf::new(4096)?);
    let dst_mr = pd.reg_mr(&dst, Access::LOCAL_WRITE)?;
    println!(
        "A writes 64 bytes to B's memory {:#x} (rkey {:#x}, registered without REMOTE_WRITE)",
        dst_mr.addr(),
        dst_mr.rkey()
    );
    let sge = [src_mr.sge(0, 64)];
    let op = WrOp::Write {
        raddr: dst_mr.addr(),
        rkey: dst_mr.rkey(),
    };
    a.post_send(&[SendWr::new(1, op, &sge, SendFlags::SIGNALED)])
        .map_err(|(_, e)| e)?;

    let deadline = Instant::now() + DEADLINE;
    let wc = wait(&mut a_cq, deadline)?;
    if wc.status != WcStatus::REM_ACCESS_ERR {
        return Err(format!("expected REM_ACCESS_ERR, got {wc:?}").into());
    }
    println!("A's completion of WR {}:", wc.wr_id);
    println!("  status          {} ({})", wc.status, wc.status.0);
    println!("  syndrome        {} ({:#04x})", wc.syndrome, wc.syndrome.0);
    println!(
        "  vendor syndrome {} ({:#04x})",
        wc.vendor_err, wc.vendor_err.0
    );
    println!("  opcode          {}, QP {:#x}", wc.opcode, wc.qp_num);
    // `Display` of a completion: on an error, the syndromes decoded and what they mean, what
    // causes them and what to check.
    println!("as printed with {{}}:\n{wc}");

    // The device moved both QPs to the error state; the driver's own record is the last
    // state it set.
    for (name, qp) in [("A", &a), ("B", &b)] {
        println!(
            "QP {name}: state() = {:?} (last state set), query_state() = {:?} (the kernel's)",
            qp.state(),
            qp.query_state()?
        );
    }
    // The responder's side reports the violation as an async event on its context.
    match ctx.get_async_event(1000)? {
        Some(ev) => println!("async event: {ev}"),
        None => println!("async event: none within 1 s"),
    }

    // Anything posted now on A is flushed, not executed.
    a.post_send(&[SendWr::new(2, op, &sge, SendFlags::SIGNALED)])
        .map_err(|(_, e)| e)?;
    let flushed = wait(&mut a_cq, deadline)?;
    println!(
        "WR {} posted after the error: {}",
        flushed.wr_id, flushed.status
    );
    if flushed.status != WcStatus::WR_FLUSH_ERR {
        return Err(format!("expected WR_FLUSH_ERR, got {flushed:?}").into());
    }
    println!("error_completion: ok");
    Ok(())
}

fn cq(ctx: &Context) -> Result<Cq, Box<dyn Error>> {
    Ok(Cq::new(ctx, CqInit::default(), None)?)
}

/// Poll `cq` for one completion, error or not; fail at the deadline.
fn wait(cq: &mut Cq, deadline: Instant) -> Result<WorkCompletion, Box<dyn Error>> {
    let mut wc = [WorkCompletion::default(); 1];
    while cq.poll(&mut wc) == 0 {
        if Instant::now() > deadline {
            return Err(format!("no completion within {DEADLINE:?}").into());
        }
        std::hint::spin_loop();
    }
    Ok(wc[0])
}

/// Connect `a` and `b` to each other through port 1 (remote writes allowed on the QPs: the
/// memory region is what refuses).
fn connect(ctx: &Context, a: &mut Qp, b: &mut Qp) -> Result<(), Box<dyn Error>> {
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
        qp.to_init(1, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
        qp.to_rtr(remote, mlx5::Mtu::M1024, sgid)?;
    }
    a.to_rts(0x100, 3)?;
    b.to_rts(0x200, 3)?;
    Ok(())
}
