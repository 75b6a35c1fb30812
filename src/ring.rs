//! Ring index arithmetic: power-of-two sizes, free-running counters, slots and owner parity.

/// A power-of-two ring size, stored as its log2.
///
/// # Invariants
/// `log2 <= 24` (CQs may have up to 2^24 entries; SQs and RQs are at most 2^15).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingSize {
    log2: u8,
}

impl RingSize {
    /// A ring of `1 << log2` entries; `None` if `log2 > 24`.
    pub const fn new(log2: u8) -> Option<Self> {
        if log2 > 24 { None } else { Some(Self { log2 }) }
    }

    /// The smallest ring with at least `n` entries (`n` rounded up to a power of two).
    pub fn at_least(n: u32) -> Option<Self> {
        let p = n.max(1).checked_next_power_of_two()?;
        Self::new(p.trailing_zeros() as u8)
    }

    /// log2 of the entry count.
    pub const fn log2(self) -> u8 {
        self.log2
    }

    /// Number of entries.
    pub const fn len(self) -> u32 {
        1 << self.log2
    }

    /// Always false: a ring has at least one entry.
    pub const fn is_empty(self) -> bool {
        false
    }

    /// The slot of free-running counter `c`.
    #[inline(always)]
    pub const fn slot(self, c: u32) -> u32 {
        c & (self.len() - 1)
    }

    /// The owner parity of counter `c`: flips on every pass over the ring.
    #[inline(always)]
    pub const fn parity(self, c: u32) -> u8 {
        ((c >> self.log2) & 1) as u8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_and_parity_wrap() {
        let r = RingSize::at_least(5).unwrap();
        assert_eq!(r.len(), 8);
        assert_eq!(r.slot(9), 1);
        assert_eq!(r.parity(7), 0);
        assert_eq!(r.parity(8), 1);
        assert_eq!(r.parity(16), 0);
        assert_eq!(RingSize::at_least(0).unwrap().len(), 1);
        assert!(RingSize::new(25).is_none());
    }
}
