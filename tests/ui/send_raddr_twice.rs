//! Finding: `WqeBuilder::raddr` never bounded the segment count (four per WQE moved the
//! producer 8 WQEBBs on a 4-WQEBB ring). The remote-address segment is now written once, by the
//! operation's start; the builder has no `raddr`.
use mlx5::{PostError, SendFlags, SendQueue};

fn post(sq: &mut SendQueue) -> Result<(), PostError> {
    sq.write(SendFlags::NONE, 0x1000, 7, None)?
        .raddr(0x2000, 7)
        .finish(1);
    Ok(())
}

fn main() {}
