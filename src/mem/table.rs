//! Bookkeeping tables indexed by free-running counters (WR ids by WQE slot or WR ordinal).
//!
//! A table has a power-of-two number of entries, so a counter is reduced to an entry by masking
//! and the lookup needs no bounds check. (Not device memory: plain Rust values.)

/// A table of a power-of-two number of entries, indexed modulo its length.
///
/// # Invariants
/// `entries.len()` is a power of two (at least 1) and `mask == entries.len() - 1`.
#[derive(Debug)]
pub struct RingTable<T> {
    entries: Box<[T]>,
    mask: usize,
}

impl<T> RingTable<T> {
    /// A table of `len` rounded up to a power of two (at least 1) entries, each made by `f`.
    pub fn new(len: usize, f: impl FnMut() -> T) -> Self {
        let n = len.max(1).next_power_of_two();
        let entries: Box<[T]> = core::iter::repeat_with(f).take(n).collect();
        // INVARIANT: `n` entries, a power of two; the mask is `n - 1`.
        Self {
            entries,
            mask: n - 1,
        }
    }

    /// Number of entries (a power of two).
    pub fn len(&self) -> usize {
        self.mask + 1
    }

    /// Always false: a table has at least one entry.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The entry of free-running counter `index`, taken modulo the length.
    #[inline(always)]
    pub fn get(&self, index: u32) -> &T {
        let i = index as usize & self.mask;
        // SAFETY: `i <= mask < entries.len()` (type invariant).
        unsafe { self.entries.get_unchecked(i) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indices_wrap_modulo_a_power_of_two() {
        let mut k = 0u32;
        let t = RingTable::new(5, || {
            k += 1;
            k
        });
        assert_eq!(t.len(), 8);
        assert_eq!((*t.get(0), *t.get(7), *t.get(8), *t.get(13)), (1, 8, 1, 6));
        assert_eq!(*t.get(u32::MAX), 8);
        assert_eq!(RingTable::new(0, || 0u8).len(), 1);
    }
}
