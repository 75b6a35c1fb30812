//! Finding: `WqeBuilder::atomic` and `av` could be appended any number of times, to any
//! opcode (70 wrapped the 6-bit ds). Atomics now write all their segments in
//! `SendQueue::atomic`; nothing may follow.
use mlx5::{PostError, SendFlags, SendQueue, Sge};

fn post(sq: &mut SendQueue, result: &Sge) -> Result<(), PostError> {
    sq.atomic(SendFlags::NONE, 0x1000, 7, 1, None, result)?
        .sge(result)?
        .finish(1);
    sq.send(SendFlags::NONE)?.atomic(1, 2).finish(2);
    Ok(())
}

fn main() {}
