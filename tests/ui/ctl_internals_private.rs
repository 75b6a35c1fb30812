// The driver's internals (raw rings, MMIO registers, ring arithmetic) rely on invariants only the
// driver establishes, so safe user code must not reach them. Before issue 10 all three were
// `pub mod`, and `mlx5::mem::uar::UarPage::map(..).reg(0x800, 8).mmio().store_raw64(off, ..)`
// wrote anywhere. The modules are named, not their items, so this case does not change when the
// data-path internals are renamed.
use mlx5::mem;
use mlx5::mmio;
use mlx5::ring;

fn main() {}
