//! A short list kept in place: the scatter/gather lists of WQEs and receive messages.

/// A list that keeps up to `N` elements in place and moves to the heap beyond that (a
/// scatter/gather list of a few entries costs no allocation). Dereferences to the slice.
#[derive(Clone, Debug)]
pub(crate) struct InlineVec<T: Copy + Default, const N: usize> {
    len: usize,
    inline: [T; N],
    /// All elements, once there are more than `N`.
    heap: Vec<T>,
}

impl<T: Copy + Default, const N: usize> Default for InlineVec<T, N> {
    fn default() -> Self {
        Self {
            len: 0,
            inline: [T::default(); N],
            heap: Vec::new(),
        }
    }
}

impl<T: Copy + Default, const N: usize> InlineVec<T, N> {
    /// Append `v`.
    pub(crate) fn push(&mut self, v: T) {
        if self.len < N {
            self.inline[self.len] = v;
        } else {
            if self.len == N {
                self.heap.extend_from_slice(&self.inline);
            }
            self.heap.push(v);
        }
        self.len += 1;
    }
}

impl<T: Copy + Default, const N: usize> std::ops::Deref for InlineVec<T, N> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        if self.len <= N {
            &self.inline[..self.len]
        } else {
            &self.heap
        }
    }
}

/// A scatter/gather list translated to process addresses: (address, length) pairs.
pub(crate) type Sgl = InlineVec<(u64, u32), 4>;

#[cfg(test)]
mod tests {
    use super::InlineVec;

    #[test]
    fn inline_vec_keeps_order_in_place_and_beyond() {
        let mut v = InlineVec::<(u64, u32), 4>::default();
        assert!(v.is_empty());
        for i in 0..10u32 {
            v.push((u64::from(i) * 16, i));
            assert_eq!(v.len(), i as usize + 1);
            assert!(
                v.iter()
                    .enumerate()
                    .all(|(k, &(a, l))| a == k as u64 * 16 && l == k as u32)
            );
        }
        let c = v.clone();
        assert_eq!(&c[..], &v[..]);
    }
}
