//! RDMA WRITE with immediate: A writes straight into B's registered memory (no receive buffer
//! on B's side holds the data) and the 4-byte immediate wakes B through a receive completion
//! (`RECV_RDMA_WITH_IMM`), which says the data is there. B needs a receive posted for each
//! one (its scatter list is not used) and memory registered with `REMOTE_WRITE`; A needs B's
//! address and rkey, sent out of band in a real program.
//!
//! ```sh
//! cargo run --release --example write_imm
//! ```
//!
//! Runs on the first ConnectX that device discovery finds, else on the emulated HCA in this
//! process (cargo feature `emulator` of `mlx5`).

use std::error::Error;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mlx5::emulator::Hca;
use mlx5::{
    Access, Context, Cq, CqInit, DmaBuf, Pd, Qp, QpInitAttr, QpType, RecvWr, RemoteQp, SendFlags,
    SendWr, WcFlags, WcOpcode, WorkCompletion, WrOp,
};

/// Sizes written, one WRITE with immediate each.
const SIZES: [u32; 5] = [1, 64, 1000, 4096, 65536];
/// A run that takes longer than this is a failure, not a hang.
const DEADLINE: Duration = Duration::from_secs(30);

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("write_imm: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn Error>> {
    let hca = Hca::first_or_emulated();
    let ctx = hca.open()?;
    println!("device: {hca}");
    let pd = Pd::new(&ctx)?;
    let (mut a_cq, mut b_cq) = (cq(&ctx)?, cq(&ctx)?);
    let mut a = Qp::new(&pd, &QpInitAttr::new(QpType::Rc, &a_cq, &a_cq))?;
    let mut b = Qp::new(&pd, &QpInitAttr::new(QpType::Rc, &b_cq, &b_cq))?;
    connect(&ctx, &mut a, &mut b)?;

    let len = 1 << 17;
    let src = Arc::new(DmaBuf::new(len)?);
    let src_mr = pd.reg_mr(&src, Access::LOCAL_WRITE)?;
    let dst = Arc::new(DmaBuf::new(len)?);
    // The target of remote writes: REMOTE_WRITE (and LOCAL_WRITE, which it requires).
    let dst_mr = pd.reg_mr(&dst, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
    println!(
        "B's memory: addr {:#x}, {} bytes, rkey {:#x}",
        dst_mr.addr(),
        dst_mr.len(),
        dst_mr.rkey()
    );

    let deadline = Instant::now() + DEADLINE;
    for (i, &size) in SIZES.iter().enumerate() {
        // B: one receive per WRITE with immediate; it carries no data, so no SGE.
        b.post_recv(&[RecvWr {
            wr_id: i as u64,
            sg_list: &[],
        }])
        .map_err(|(_, e)| e)?;
        // A: fill the source, then WRITE it at offset `off` of B's memory, immediate = i.
        let pattern: Vec<u8> = (0..size).map(|k| (k as u8) ^ (i as u8 * 37)).collect();
        src.write(0, &pattern);
        let off = 64 * i as u64;
        let imm = (0xC0DE_0000 + i as u32).to_be_bytes();
        let sge = [src_mr.sge(0, size)];
        let op = WrOp::WriteImm {
            raddr: dst_mr.addr() + off,
            rkey: dst_mr.rkey(),
            imm,
        };
        a.post_send(&[SendWr::new(i as u64, op, &sge, SendFlags::SIGNALED)])
            .map_err(|(_, e)| e)?;

        let sent = wait(&mut a_cq, deadline)?;
        if sent.opcode != WcOpcode::RDMA_WRITE {
            return Err(format!("A: expected an RDMA_WRITE completion, got {sent:?}").into());
        }
        let got = wait(&mut b_cq, deadline)?;
        if got.opcode != WcOpcode::RECV_RDMA_WITH_IMM || !got.wc_flags.contains(WcFlags::WITH_IMM) {
            return Err(format!("B: expected RECV_RDMA_WITH_IMM, got {got:?}").into());
        }
        if got.imm_data != imm || got.byte_len != size {
            return Err(format!(
                "B: immediate {:02x?} / {} bytes, expected {imm:02x?} / {size}",
                got.imm_data, got.byte_len
            )
            .into());
        }
        let mut landed = vec![0u8; size as usize];
        dst.read(off as usize, &mut landed);
        if landed != pattern {
            return Err(format!("B: the {size} bytes written at offset {off} differ").into());
        }
        println!(
            "WRITE_IMM {size:>6} bytes -> B+{off:<4} immediate {:#010x}: B's receive completion \
             says {} bytes, memory matches",
            u32::from_be_bytes(got.imm_data),
            got.byte_len
        );
    }
    println!("write_imm: ok");
    Ok(())
}

fn cq(ctx: &Context) -> Result<Cq, Box<dyn Error>> {
    Ok(Cq::new(ctx, CqInit::default(), None)?)
}

/// Poll `cq` for one completion; fail on an error completion or at the deadline.
fn wait(cq: &mut Cq, deadline: Instant) -> Result<WorkCompletion, Box<dyn Error>> {
    let mut wc = [WorkCompletion::default(); 1];
    while cq.poll(&mut wc) == 0 {
        if Instant::now() > deadline {
            return Err(format!("no completion within {DEADLINE:?}").into());
        }
        std::hint::spin_loop();
    }
    if !wc[0].is_ok() {
        return Err(format!("error completion: {}", wc[0]).into());
    }
    Ok(wc[0])
}

/// Connect `a` and `b` to each other through port 1; both accept remote writes.
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
