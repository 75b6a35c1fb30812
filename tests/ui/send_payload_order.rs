//! A WQE's payload is data segments or inline bytes, never both (an SGE after inline bytes
//! overwrote them), and an RDMA READ takes no inline payload.
use mlx5::{PostError, SendFlags, SendQueue, Sge};

fn post(sq: &mut SendQueue, sge: &Sge) -> Result<(), PostError> {
    sq.send(SendFlags::NONE)?.inline(b"abc")?.sge(sge)?.finish(1);
    sq.send(SendFlags::NONE)?.sge(sge)?.inline(b"abc")?.finish(2);
    sq.read(SendFlags::NONE, 0x1000, 7)?.inline(b"abc")?.finish(3);
    Ok(())
}

fn main() {}
