//! Field types shared by all layouts: big-endian integers with alignment 1 and a `hi:lo` bit-range helper.

pub use zerocopy::byteorder::big_endian::{U16 as Be16, U32 as Be32, U64 as Be64};

/// A bit range `hi:lo` inside a 32-bit word, written as in the PRM tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bits {
    hi: u8,
    lo: u8,
}

impl Bits {
    /// The range `hi:lo` (inclusive). `hi` must be >= `lo` and < 32 (checked at compile time
    /// when used in a `const`).
    pub const fn new(hi: u8, lo: u8) -> Self {
        assert!(hi < 32 && hi >= lo);
        Self { hi, lo }
    }

    /// The mask of the range, not shifted (e.g. `0xFF` for `7:0` and `23:16`).
    pub const fn mask(self) -> u32 {
        u32::MAX >> (31 - (self.hi - self.lo))
    }

    /// Extract the range from `word`.
    pub const fn get(self, word: u32) -> u32 {
        (word >> self.lo) & self.mask()
    }

    /// Return `word` with the range replaced by `value` (excess high bits of `value` are dropped).
    pub const fn put(self, word: u32, value: u32) -> u32 {
        (word & !(self.mask() << self.lo)) | ((value & self.mask()) << self.lo)
    }
}
