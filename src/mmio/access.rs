//! Width-exact accessors for device-shared words: doorbell records (host memory the device
//! reads) and UAR registers (MMIO). (CQE rings are read by `mem::CqeReader`.)
//!
//! None of these types ever hands out a Rust reference to the memory it names. Their
//! constructors are `unsafe`: the caller promises the pointer stays valid for as long as the
//! accessor exists, which the owning types in `mem/` guarantee by holding the mapping next to
//! the accessor (their `# Invariants` say so).

use core::ptr::NonNull;
use core::sync::atomic::{AtomicU32, Ordering};

/// A 32-bit big-endian word in a doorbell record (host memory that the device reads by DMA).
///
/// # Invariants
/// `ptr` is 4-byte aligned and points into a mapping that outlives `self`; Rust code touches the
/// word only through this type (atomic stores and loads), the device only reads it.
#[derive(Debug)]
pub struct DbWord {
    ptr: NonNull<u32>,
}

// SAFETY: the word is only accessed atomically through `&self` methods; the mapping outlives
// `self` (type invariant), so using it from another thread is sound.
unsafe impl Send for DbWord {}
// SAFETY: as above: all access is single atomic operations.
unsafe impl Sync for DbWord {}

impl DbWord {
    /// # Safety
    /// `ptr` must be 4-byte aligned, valid for reads and writes, and stay valid for the whole
    /// life of the returned value; nothing else may access it non-atomically.
    pub unsafe fn from_raw(ptr: NonNull<u32>) -> Self {
        Self { ptr }
    }

    /// Store `v` as one big-endian 32-bit store (untorn).
    #[inline(always)]
    pub fn store_be32(&self, v: u32) {
        // SAFETY: aligned, live and only accessed atomically (type invariant).
        let a = unsafe { AtomicU32::from_ptr(self.ptr.as_ptr()) };
        a.store(v.to_be(), Ordering::Relaxed);
    }

    /// Load the word and convert from big-endian.
    #[inline(always)]
    pub fn load_be32(&self) -> u32 {
        // SAFETY: aligned, live and only accessed atomically (type invariant).
        let a = unsafe { AtomicU32::from_ptr(self.ptr.as_ptr()) };
        u32::from_be(a.load(Ordering::Relaxed))
    }
}

/// One 64-bit doorbell register in a mapped UAR page (MMIO). Used for the 8-byte send doorbell,
/// the CQ arm doorbell and, for BlueFlame, as the destination of the WQE copy.
///
/// # Invariants
/// `ptr` is 8-byte aligned, inside a UAR mapping that outlives `self`, and `ptr .. ptr + len`
/// bytes are writable MMIO space (`len` is a multiple of 64 for BlueFlame registers).
#[derive(Debug)]
pub struct MmioReg {
    ptr: NonNull<u64>,
    len: usize,
}

// SAFETY: an MMIO register has no Rust-visible contents; stores are single volatile stores and
// the mapping outlives `self`. Whether two holders may store concurrently is decided by the
// owner (a dedicated BlueFlame register is used by one QP only).
unsafe impl Send for MmioReg {}
// SAFETY: concurrent 8-byte doorbell stores are each one untorn 64-bit store; shared BlueFlame
// registers are never used for multi-word copies (see `mem::uar`).
unsafe impl Sync for MmioReg {}

impl MmioReg {
    /// # Safety
    /// `ptr` must be 8-byte aligned and valid for `len` bytes of writes for the life of the
    /// returned value.
    pub unsafe fn from_raw(ptr: NonNull<u8>, len: usize) -> Self {
        debug_assert!(ptr.as_ptr() as usize % 8 == 0);
        Self {
            ptr: ptr.cast(),
            len,
        }
    }

    /// Size of the register window in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the window is empty (never for a real register).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// One 64-bit store of `bytes` exactly as they sit in memory (no byte swap), at byte
    /// `offset` of the window.
    #[inline(always)]
    pub fn store_raw64(&self, offset: usize, bytes: [u8; 8]) {
        debug_assert!(offset % 8 == 0 && offset + 8 <= self.len);
        // SAFETY: offset is inside the window and 8-byte aligned (checked by callers in
        // `mem::uar`; debug-asserted); one volatile u64 store to MMIO.
        unsafe {
            self.ptr
                .as_ptr()
                .wrapping_add(offset / 8)
                .write_volatile(u64::from_ne_bytes(bytes))
        };
    }

    /// Store one 64-byte chunk (a WQE basic block) at byte `offset` of the window as eight
    /// ascending native-width 8-byte stores; never `memcpy` (BlueFlame copy).
    #[inline(always)]
    pub fn store_chunk64(&self, offset: usize, chunk: &[u64; 8]) {
        debug_assert!(offset % 64 == 0 && offset + 64 <= self.len);
        for (i, w) in chunk.iter().enumerate() {
            // SAFETY: `offset + 64 <= len` (the caller limits the copy to the BlueFlame half;
            // debug-asserted) and 8-byte aligned; one volatile u64 store to MMIO.
            unsafe {
                self.ptr
                    .as_ptr()
                    .wrapping_add(offset / 8 + i)
                    .write_volatile(*w)
            };
        }
    }
}
