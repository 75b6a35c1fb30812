//! UAR pages: ordinary shared memory that the device watches.
//!
//! A context's UAR pages (plus its core-clock and clock-info pages) live in one `memfd`.
//! The device keeps its own mapping of the whole file for its lifetime; every user `mmap`
//! is a second, independent mapping of one page of the same file. So the user's
//! doorbell stores and the device's atomic swaps hit the same physical memory, and a user
//! `munmap` can never pull memory from under the device.
//!
//! **Waking the device** (threaded mode, `docs/emulator-wake.md`): a region given a [`Wake`]
//! maps every writable user page read-only and enters it in a process-wide table. The first
//! store to such a page faults; the fault handler (`watch::on_write_fault`, called from the
//! SIGSEGV handler in `mem/direct.rs`) gives the page its requested protection back, marks
//! it unprotected and pokes the emulator's eventfd; the store is then retried by the CPU and
//! lands. Before the device thread blocks it drains the eventfd, re-protects every page it
//! unprotected (`watch::protect_pages`), and only then scans once more: a store that landed before
//! the protection is seen by that scan, and one after it faults again and pokes the eventfd,
//! which the drain can no longer swallow.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::abi::Errno;

pub(crate) use crate::watch::{PAGE, Wake, unmap_user};
use crate::watch::{PROTECTED, register};

/// The bfreg value of a QP that rings a DEVX UAR page (`uar_page` of its QPC): a flag bit
/// and the page id. The device treats such a register as shared (`device/fetch.rs`,
/// `rung_shared_register`), as a DEVX UAR is (UCX rings every QP of a worker through one).
pub(crate) const DEVX_UAR_BFREG: u32 = 1 << 30;

/// The memfd-backed page set of one context.
#[derive(Debug)]
pub(crate) struct UarRegion {
    fd: OwnedFd,
    /// The device's mapping of the whole file, as 64-bit words.
    base: *mut u64,
    /// Total pages in the file (UAR pages + 2 clock pages).
    pages: usize,
    /// Threaded wake mode: the eventfd a store to one of our user pages pokes.
    wake: Option<Arc<Wake>>,
}

// SAFETY: `base` points at a MAP_SHARED mapping owned by this struct; all device accesses
// through it are atomic or volatile, so sharing the pointer across threads is sound.
unsafe impl Send for UarRegion {}

impl UarRegion {
    /// Create `pages` zeroed pages.
    pub(crate) fn new(pages: usize) -> Result<Self, Errno> {
        let name = c"mlx5-emu-uar";
        // SAFETY: `name` is a valid NUL-terminated string.
        let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(Errno(libc::ENOMEM));
        }
        // SAFETY: memfd_create returned a fresh descriptor owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let len = pages * PAGE;
        // SAFETY: ftruncate on our own memfd.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(Errno(libc::ENOMEM));
        }
        // SAFETY: mapping `len` bytes of our memfd, shared, at a kernel-chosen address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Errno(libc::ENOMEM));
        }
        Ok(Self {
            fd,
            base: p.cast::<u64>(),
            pages,
            wake: None,
        })
    }

    /// From now on, map writable user pages read-only and wake `wake` on their first store
    /// (`None`: plain shared pages that the device polls, as in stepped mode).
    pub(crate) fn set_wake(&mut self, wake: Option<Arc<Wake>>) {
        self.wake = wake;
    }

    /// Map page `page` for the user with protection `prot`.
    pub(crate) fn map_user(
        &self,
        page: usize,
        len: usize,
        prot: i32,
    ) -> Result<std::ptr::NonNull<u8>, Errno> {
        if page >= self.pages || len != PAGE {
            return Err(Errno(libc::EINVAL));
        }
        // A writable page of a waking region starts out protected: its first store faults.
        let watched = self
            .wake
            .as_ref()
            .filter(|_| prot & libc::PROT_WRITE != 0 && crate::mem::fault_handler_installed());
        let map_prot = if watched.is_some() { PROTECTED } else { prot };
        // SAFETY: a fresh shared mapping of one page of our memfd at a kernel-chosen address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                map_prot,
                libc::MAP_SHARED,
                self.fd.as_raw_fd(),
                (page * PAGE) as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Errno(
                std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::ENOMEM),
            ));
        }
        let Some(p) = std::ptr::NonNull::new(p.cast::<u8>()) else {
            return Err(Errno(libc::ENOMEM));
        };
        if let Some(wake) = watched {
            if !register(p.as_ptr() as usize, prot, wake, self.dev_addr(page)) {
                // The table is full: give the page its protection and let the device poll.
                // SAFETY: our fresh mapping of one page.
                unsafe { libc::mprotect(p.as_ptr().cast(), PAGE, prot) };
                wake.unwatched.store(true, Ordering::Relaxed);
            }
        }
        Ok(p)
    }

    fn word(&self, page: usize, off: usize) -> Option<&AtomicU64> {
        if page >= self.pages || off % 8 != 0 || off + 8 > PAGE {
            return None;
        }
        let p = self.base.wrapping_add((page * PAGE + off) / 8);
        // SAFETY: page/off are bounds-checked above, the mapping lives as long as `self`, the
        // address is 8-byte aligned (page aligned base + multiple of 8), and the memory is
        // only ever accessed atomically/volatilely by the device.
        Some(unsafe { AtomicU64::from_ptr(p) })
    }

    /// The device's own address of page `page` (the key of its user mappings' notes,
    /// `watch::take_rung`).
    pub(crate) fn dev_addr(&self, page: usize) -> usize {
        self.base.wrapping_add(page * PAGE / 8) as usize
    }

    /// The 512 words of page `page` (None past the end), for scanning a page without a
    /// bounds check per word: take a doorbell word at byte offset `off` with
    /// [`take_word`]`(&words[off / 8])`.
    pub(crate) fn page_words(&self, page: usize) -> Option<&[AtomicU64]> {
        if page >= self.pages {
            return None;
        }
        let p = self.base.wrapping_add(page * PAGE / 8);
        // SAFETY: the page is within the mapping (checked above), which lives as long as
        // `self`; `p` is page aligned, so every word is 8-byte aligned; `AtomicU64` has the
        // size and layout of `u64`, and the memory is only ever accessed atomically or
        // volatilely by the device.
        Some(unsafe { std::slice::from_raw_parts(p.cast_const().cast::<AtomicU64>(), PAGE / 8) })
    }

    /// Read `len` bytes at `off` of `page` (word by word), then clear them (each word as
    /// [`take_word`] does: a zero word needs no atomic swap).
    pub(crate) fn take_bytes(&self, page: usize, off: usize, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len);
        let mut o = off;
        while o < off + len {
            let v = self.word(page, o).map_or(0, take_word);
            out.extend_from_slice(&v.to_ne_bytes());
            o += 8;
        }
        out
    }

    /// Store 8 bytes (used for the clock pages).
    pub(crate) fn store(&self, page: usize, off: usize, bytes: [u8; 8]) {
        if let Some(w) = self.word(page, off) {
            w.store(u64::from_ne_bytes(bytes), Ordering::Release);
        }
    }
}

/// Take (and clear) a doorbell word: 0 if it is 0 (one plain load, the common case), else
/// its value, swapped out atomically.
pub(crate) fn take_word(w: &AtomicU64) -> u64 {
    if w.load(Ordering::Relaxed) == 0 {
        0
    } else {
        w.swap(0, Ordering::AcqRel)
    }
}

impl Drop for UarRegion {
    fn drop(&mut self) {
        // User mappings that outlive us stop being emulated into our mapping first.
        crate::watch::detach(self.base as usize, self.pages * PAGE);
        // SAFETY: `base`/len is exactly the mapping created in `new`, unused after this.
        unsafe { libc::munmap(self.base.cast(), self.pages * PAGE) };
    }
}

#[cfg(all(test, target_arch = "x86_64", target_os = "linux"))]
mod tests {
    use super::*;

    /// A small xorshift for the test's choices.
    fn next(s: &mut u64) -> u64 {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        *s
    }

    /// Whatever instructions glibc's `memcpy` picks on this CPU, and plain 8-byte stores:
    /// every byte copied into a protected, watched page arrives in the device's mapping
    /// exactly, whether the handler emulated the stores or (an instruction it declines)
    /// opened the page and let the CPU retry; and the handler did emulate.
    #[test]
    fn stores_into_a_watched_page_land_exactly_emulated_or_not() {
        assert!(crate::mem::install_fault_handler());
        let wake = Wake::new().expect("eventfd");
        wake.half.store(256, Ordering::Relaxed);
        let mut region = UarRegion::new(1).expect("region");
        region.set_wake(Some(wake.clone()));
        let user = region
            .map_user(0, PAGE, libc::PROT_READ | libc::PROT_WRITE)
            .expect("map");
        let words = region.page_words(0).expect("page");
        let (before, _) = crate::watch::emulation_counts();
        let (mut copies, mut copies_emulated) = (0u32, 0u32);
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let src: Vec<u8> = (0..PAGE).map(|i| (i * 7 + 3) as u8).collect();
        for round in 0..300 {
            // As the device does before it sleeps: re-arm (past the grace period) and clear.
            std::thread::sleep(crate::watch::GRACE + std::time::Duration::from_micros(5));
            crate::watch::protect_pages(&wake);
            for w in words {
                w.store(0, Ordering::Relaxed);
            }
            // Mostly emulated, sometimes the old path (the page opened, the store retried).
            wake.ring_here.store(round % 10 != 9, Ordering::SeqCst);
            let r = next(&mut seed);
            let len = 8 * (1 + (r % 64) as usize);
            let off = 8 * ((r >> 8) as usize % ((PAGE - len) / 8 + 1));
            let from = (r >> 20) as usize % (PAGE - len);
            let dst = user.as_ptr().wrapping_add(off);
            if round % 3 == 0 {
                // 8-byte stores, one at a time.
                for i in 0..len / 8 {
                    let v =
                        u64::from_ne_bytes(src[from + 8 * i..from + 8 * i + 8].try_into().unwrap());
                    // The mapping is page-aligned, so its u64 view is aligned.
                    #[allow(clippy::cast_ptr_alignment)]
                    let p = user.as_ptr().cast::<u64>().wrapping_add(off / 8 + i);
                    // SAFETY: `p` is 8-aligned (a page plus a multiple of 8) within our
                    // one-page user mapping.
                    unsafe { p.write_volatile(v) };
                }
            } else {
                let from = &src[from..from + len];
                let (e0, _) = crate::watch::emulation_counts();
                // SAFETY: `len` bytes within our one-page user mapping, from a live slice.
                unsafe { std::ptr::copy_nonoverlapping(from.as_ptr(), dst, len) };
                let (e1, _) = crate::watch::emulation_counts();
                copies += 1;
                copies_emulated += u32::from(e1 > e0);
            }
            let mut got = vec![0u8; PAGE];
            for (i, w) in words.iter().enumerate() {
                got[8 * i..8 * i + 8].copy_from_slice(&w.load(Ordering::Relaxed).to_ne_bytes());
            }
            assert_eq!(
                &got[off..off + len],
                &src[from..from + len],
                "round {round}: {len} bytes at {off:#x}"
            );
            assert!(
                got[..off].iter().chain(&got[off + len..]).all(|&b| b == 0),
                "round {round}: outside"
            );
        }
        let (after, _) = crate::watch::emulation_counts();
        assert!(
            after - before >= 100,
            "emulated {} of 300 rounds",
            after - before
        );
        // memcpy's own stores (the vector forms of this CPU's glibc) were emulated too, in
        // most of the rounds that took the new path (1 in 10 take the old one).
        assert!(
            copies_emulated * 2 > copies,
            "memcpy emulated in {copies_emulated} of {copies} rounds"
        );
        // SAFETY: our mapping from `map_user`, unused from here.
        unsafe { unmap_user(user.as_ptr().cast(), PAGE) };
    }
}
