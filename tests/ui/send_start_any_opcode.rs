//! Finding: `SendQueue::start` took any opcode (NOP, UMR, ...) and "the AV must come first" was
//! a doc comment. Each operation now has its own start that writes its segments in order.
use mlx5::hw::opcodes::SendOpcode;
use mlx5::{PostError, SendFlags, SendQueue};

fn post(sq: &mut SendQueue) -> Result<(), PostError> {
    let w = sq.start(SendOpcode::NOP, SendFlags::NONE, [0; 4])?;
    w.finish(1);
    Ok(())
}

fn main() {}
