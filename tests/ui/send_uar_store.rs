//! Finding: `MmioReg::store_raw64` checked its offset only with `debug_assert!`:
//! `UarPage::map(..).reg(0x800, 8).mmio().store_raw64(off, ..)` overwrote a heap u64 in a
//! release build. Raw register access is now crate-private (and its stores check for real).
use std::sync::Arc;

use mlx5::ffi::surface::UverbsSurface;
use mlx5::mem::uar::UarPage;

fn poke(surface: &Arc<dyn UverbsSurface>) {
    let page = UarPage::map(surface, 0, 4096, 0, true).unwrap();
    page.reg(0x800, 8).mmio().store_raw64(0x1000, [0xff; 8]);
    page.bf_reg(0, 0).mmio().store_raw64(0x1000, [0xff; 8]);
}

fn main() {}
