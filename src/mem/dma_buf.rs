//! Page-aligned anonymous buffers for queues and for application data, optionally on huge pages,
//! always excluded from fork (`MADV_DONTFORK`) so a child's copy-on-write cannot move pages the
//! device has pinned.

use core::ptr::NonNull;
use core::sync::atomic::{AtomicU8, Ordering};

use memmap2::{Advice, MmapOptions, MmapRaw};

use crate::error::{Errno, Error, Result};

/// Size of a 2 MiB huge page.
pub const HUGE_PAGE_SIZE: usize = 2 << 20;

/// How to back a buffer with huge pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HugePolicy {
    /// Ordinary pages only.
    None,
    /// `MAP_HUGETLB` (2 MiB pages from the hugetlbfs pool); fail if none are reserved.
    Hugetlb,
    /// Transparent huge pages: `madvise(MADV_HUGEPAGE)` on an ordinary mapping.
    Transparent,
    /// Try `MAP_HUGETLB`, then transparent huge pages, then ordinary pages; the buffer's
    /// [`DmaBuf::note`] says what happened.
    Auto,
}

/// What actually backs a [`DmaBuf`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backing {
    /// Ordinary (4 KiB) pages.
    Pages,
    /// hugetlbfs pages via `MAP_HUGETLB`.
    Hugetlb,
    /// Ordinary mapping advised `MADV_HUGEPAGE` (the kernel may or may not collapse it).
    Transparent,
}

/// A zero-filled, page-aligned private anonymous mapping the device may DMA to or from.
///
/// # Invariants
/// - `[ptr, ptr + len)` is a live private mapping owned by `self`; `len` is a page multiple.
/// - Rust code reaches the bytes only through byte atomics (`read`/`write`/`fill`) or raw
///   pointers (the queue types in `mem/`, which own their buffers exclusively), never through a
///   plain reference, because the device may write them at any time once they are registered
///   and other threads may copy in or out concurrently.
#[derive(Debug)]
pub struct DmaBuf {
    map: MmapRaw,
    /// Offset of the buffer in the mapping: 0, or one guard unit with feature `canary`.
    off: usize,
    /// Length of the buffer (the mapping less the guard units).
    len: usize,
    backing: Backing,
    note: Option<String>,
}

/// Feature `canary` (tests only): every buffer is mapped with one canary-filled guard unit
/// (a page, or a huge page) on each side, registered in a table that
/// [`DmaBuf::check_canaries`] walks, so a test can show after every step that nothing (driver
/// or device) wrote outside any ring or buffer.
#[cfg(feature = "canary")]
mod canary {
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    /// The byte guard units are filled with.
    pub(super) const BYTE: u8 = 0xC5;

    /// Live buffers: mapping start -> (guard unit, buffer length).
    pub(super) static LIVE: Mutex<BTreeMap<usize, (usize, usize)>> = Mutex::new(BTreeMap::new());
}

/// The system page size.
pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p <= 0 { 4096 } else { p as usize }
}

fn errno_of(e: &std::io::Error) -> Errno {
    Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO))
}

impl DmaBuf {
    /// `len` bytes (rounded up to whole pages) of zeroed, page-aligned memory with
    /// `MADV_DONTFORK`.
    ///
    /// # Errors
    /// [`Error::Os`] if `mmap` or `madvise` fails; [`Error::InvalidArgument`] if `len` is 0 or
    /// too large to round up to whole pages.
    pub fn new(len: usize) -> Result<Self> {
        Self::with_policy(len, HugePolicy::None)
    }

    /// Like [`new`](Self::new), backed as `policy` asks. With [`HugePolicy::Auto`] a failure to
    /// get huge pages is not an error: the buffer falls back and [`note`](Self::note) explains.
    ///
    /// # Errors
    /// [`Error::Os`] naming `mmap(MAP_HUGETLB)` when `Hugetlb` was demanded and no huge pages
    /// are available (see `/proc/sys/vm/nr_hugepages`).
    pub fn with_policy(len: usize, policy: HugePolicy) -> Result<Self> {
        if len == 0 {
            return Err(Error::InvalidArgument {
                attr: "length",
                reason: "must not be 0",
            });
        }
        let buf = match policy {
            HugePolicy::None => Self::map(len, Backing::Pages)?,
            HugePolicy::Hugetlb => Self::map(len, Backing::Hugetlb)?,
            HugePolicy::Transparent => Self::map(len, Backing::Transparent)?,
            HugePolicy::Auto => match Self::map(len, Backing::Hugetlb) {
                Ok(b) => b,
                Err(e) => {
                    let first = format!(
                        "MAP_HUGETLB unavailable ({e}; reserve pages in /proc/sys/vm/nr_hugepages)"
                    );
                    match Self::map(len, Backing::Transparent) {
                        Ok(mut b) => {
                            b.note =
                                Some(format!("{first}; using transparent huge pages (madvise)"));
                            b
                        }
                        Err(e2) => {
                            let mut b = Self::map(len, Backing::Pages)?;
                            b.note =
                                Some(format!("{first}; THP failed too ({e2}); using 4 KiB pages"));
                            b
                        }
                    }
                }
            },
        };
        Ok(buf)
    }

    fn map(len: usize, backing: Backing) -> Result<Self> {
        let align = if backing == Backing::Pages {
            page_size()
        } else {
            HUGE_PAGE_SIZE
        };
        // A length within a page of `usize::MAX` cannot be rounded up; no mapping is that big.
        let len = len
            .checked_next_multiple_of(align)
            .ok_or(Error::InvalidArgument {
                attr: "length",
                reason: "too large to round up to whole pages",
            })?;
        let guard = if cfg!(feature = "canary") { align } else { 0 };
        let total = len.checked_add(2 * guard).ok_or(Error::InvalidArgument {
            attr: "length",
            reason: "too large to round up to whole pages",
        })?;
        let mut opts = MmapOptions::new();
        opts.len(total);
        if backing == Backing::Hugetlb {
            opts.huge(Some(21));
        }
        let map = opts.map_anon().map_err(|e| Error::Os {
            op: if backing == Backing::Hugetlb {
                "mmap(MAP_HUGETLB)"
            } else {
                "mmap(anonymous)"
            },
            errno: errno_of(&e),
        })?;
        let map = MmapRaw::from(map);
        if backing == Backing::Transparent {
            map.advise(Advice::HugePage).map_err(|e| Error::Os {
                op: "madvise(MADV_HUGEPAGE)",
                errno: errno_of(&e),
            })?;
        }
        map.advise(Advice::DontFork).map_err(|e| Error::Os {
            op: "madvise(MADV_DONTFORK)",
            errno: errno_of(&e),
        })?;
        let buf = Self {
            map,
            off: guard,
            len,
            backing,
            note: None,
        };
        #[cfg(feature = "canary")]
        {
            let base = buf.map.as_mut_ptr();
            // SAFETY: the first guard unit is inside the fresh mapping (`total = len + 2 *
            // guard`) and never handed out (the buffer starts after it).
            unsafe { core::ptr::write_bytes(base, canary::BYTE, guard) };
            // SAFETY: likewise the last guard unit, `[guard + len, total)`.
            unsafe { core::ptr::write_bytes(base.wrapping_add(guard + len), canary::BYTE, guard) };
            let mut t = canary::LIVE.lock().unwrap_or_else(|p| p.into_inner());
            t.insert(buf.map.as_ptr() as usize, (guard, len));
        }
        Ok(buf)
    }

    /// Feature `canary`: check the guard units of every live buffer; the number checked, or
    /// which buffer's guard was written and where.
    ///
    /// # Errors
    /// A description of the first damaged guard unit.
    #[cfg(feature = "canary")]
    pub fn check_canaries() -> core::result::Result<usize, String> {
        Self::check_canaries_near(usize::MAX)
    }

    /// Feature `canary`: [`check_canaries`](Self::check_canaries) of only the `near` bytes of
    /// each guard unit next to its buffer (where an overrun or underrun lands first).
    ///
    /// # Errors
    /// As [`check_canaries`](Self::check_canaries).
    #[cfg(feature = "canary")]
    pub fn check_canaries_near(near: usize) -> core::result::Result<usize, String> {
        let t = canary::LIVE.lock().unwrap_or_else(|p| p.into_inner());
        let word = u64::from_ne_bytes([canary::BYTE; 8]);
        for (&start, &(guard, len)) in t.iter() {
            let n = near.min(guard) / 8 * 8;
            for (name, unit) in [
                ("before", start + guard - n),
                ("after", start + guard + len),
            ] {
                let p = unit as *const u64;
                let mut bad = 0u64;
                for i in 0..n / 8 {
                    // SAFETY: a guard unit of a live buffer (entries leave the table in `Drop`
                    // before the mapping goes), 8-byte aligned (page aligned), never handed
                    // out: only a stray write (the bug this looks for) ever touches it.
                    bad |= unsafe { p.wrapping_add(i).read() } ^ word;
                }
                if bad != 0 {
                    let at = (0..n / 8)
                        // SAFETY: as above.
                        .find(|&i| unsafe { p.wrapping_add(i).read() } != word)
                        .unwrap_or(0);
                    return Err(format!(
                        "canary {name} the buffer at {:#x} (len {len}) overwritten at byte {}",
                        start + guard,
                        at * 8
                    ));
                }
            }
        }
        Ok(t.len())
    }

    /// Length in bytes (a page multiple).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false (a buffer has at least one page).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// What backs the buffer.
    pub fn backing(&self) -> Backing {
        self.backing
    }

    /// Why the buffer is not backed as asked (only for [`HugePolicy::Auto`] fallbacks).
    pub fn note(&self) -> Option<&str> {
        self.note.as_deref()
    }

    /// Virtual address of the first byte (what the kernel and the device are told).
    pub fn addr(&self) -> u64 {
        self.map.as_ptr().wrapping_add(self.off) as u64
    }

    /// Raw pointer to the first byte.
    pub fn as_ptr(&self) -> NonNull<u8> {
        // PANIC: never; a successful mmap does not return NULL.
        NonNull::new(self.map.as_mut_ptr().wrapping_add(self.off)).expect("mmap returned NULL")
    }

    fn check(&self, offset: usize, len: usize) {
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= self.len()),
            "DmaBuf access {offset}+{len} out of bounds (len {})",
            self.len()
        );
    }

    /// The byte at `offset` as an atomic: the buffer is shared with the device and, through
    /// `&self`, with other threads, so the copy helpers access it with relaxed single-byte
    /// atomics (plain byte moves on x86-64 and aarch64) rather than racy plain copies.
    fn byte(&self, offset: usize) -> &AtomicU8 {
        let p = self.map.as_mut_ptr().wrapping_add(self.off + offset);
        // SAFETY: callers pass `offset < len` (checked by `check`), so `p` is inside the live
        // mapping owned by `self` for the lifetime of the returned reference; `AtomicU8` has
        // alignment 1; Rust code reaches these bytes only through such atomics (type
        // invariant), so no non-atomic access races with it.
        unsafe { AtomicU8::from_ptr(p) }
    }

    /// Copy `src` into the buffer at `offset`.
    ///
    /// # Panics
    /// If `offset + src.len()` exceeds the buffer.
    pub fn write(&self, offset: usize, src: &[u8]) {
        self.check(offset, src.len());
        for (i, b) in src.iter().enumerate() {
            self.byte(offset + i).store(*b, Ordering::Relaxed);
        }
    }

    /// Copy bytes at `offset` out into `dst`.
    ///
    /// # Panics
    /// If `offset + dst.len()` exceeds the buffer.
    pub fn read(&self, offset: usize, dst: &mut [u8]) {
        self.check(offset, dst.len());
        for (i, b) in dst.iter_mut().enumerate() {
            *b = self.byte(offset + i).load(Ordering::Relaxed);
        }
    }

    /// Fill `len` bytes at `offset` with `byte`.
    ///
    /// # Panics
    /// If the range exceeds the buffer.
    pub fn fill(&self, offset: usize, len: usize, byte: u8) {
        self.check(offset, len);
        for i in 0..len {
            self.byte(offset + i).store(byte, Ordering::Relaxed);
        }
    }

    /// Read a native-endian u64 at `offset` (e.g. an atomic's result).
    ///
    /// # Panics
    /// If the range exceeds the buffer.
    pub fn read_u64(&self, offset: usize) -> u64 {
        let mut b = [0u8; 8];
        self.read(offset, &mut b);
        u64::from_ne_bytes(b)
    }
}

#[cfg(feature = "canary")]
impl Drop for DmaBuf {
    fn drop(&mut self) {
        let mut t = canary::LIVE.lock().unwrap_or_else(|p| p.into_inner());
        t.remove(&(self.map.as_ptr() as usize));
    }
}

/// Memory described by address and length that the caller promises stays mapped while a memory
/// region registered over it exists (for buffers this crate did not allocate).
///
/// # Invariants
/// `[addr, addr + len)` stays mapped and is not unmapped or remapped while any `Mr` created from
/// this value exists.
#[derive(Debug, Clone, Copy)]
pub struct UserMemory {
    addr: u64,
    len: usize,
}

impl UserMemory {
    /// # Safety
    /// `[addr, addr + len)` must be mapped memory that stays mapped (and is not handed to the
    /// device through another path that would alias Rust references) for as long as any memory
    /// region registered over it exists. The device will read and write it behind Rust's back.
    pub unsafe fn from_raw_parts(addr: *mut u8, len: usize) -> Self {
        Self {
            addr: addr as u64,
            len,
        }
    }

    /// Start address.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the length is 0.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_page_aligned_and_copyable() {
        let b = DmaBuf::new(100).unwrap();
        assert_eq!(b.len() % 4096, 0);
        assert_eq!(b.addr() % 4096, 0);
        let mut out = [1u8; 16];
        b.read(50, &mut out);
        assert_eq!(out, [0u8; 16]);
        b.write(50, b"hello");
        b.read(50, &mut out[..5]);
        assert_eq!(&out[..5], b"hello");
        assert_eq!(b.backing(), Backing::Pages);
    }

    #[test]
    fn strict_hugetlb_fails_with_a_named_error_or_gets_huge_pages() {
        match DmaBuf::with_policy(4096, HugePolicy::Hugetlb) {
            Ok(b) => {
                assert_eq!(b.backing(), Backing::Hugetlb);
                assert_eq!(b.len(), HUGE_PAGE_SIZE);
                assert_eq!(b.addr() % HUGE_PAGE_SIZE as u64, 0);
            }
            Err(e) => assert!(e.to_string().starts_with("mmap(MAP_HUGETLB) failed"), "{e}"),
        }
        let t = DmaBuf::with_policy(4096, HugePolicy::Transparent).unwrap();
        assert_eq!(
            (t.backing(), t.len()),
            (Backing::Transparent, HUGE_PAGE_SIZE)
        );
        assert!(DmaBuf::new(0).is_err());
    }

    #[test]
    fn auto_hugepages_fall_back_with_a_note_or_succeed() {
        let b = DmaBuf::with_policy(4096, HugePolicy::Auto).unwrap();
        match b.backing() {
            Backing::Hugetlb => assert!(b.note().is_none()),
            _ => assert!(b.note().unwrap().contains("MAP_HUGETLB")),
        }
        if b.backing() != Backing::Pages {
            assert_eq!(b.len() % HUGE_PAGE_SIZE, 0);
        }
    }
}
