//! The emulated HCAs' IPv4 addresses where programs look for interface addresses:
//! `getifaddrs(3)` lists, after the host's own entries, one `AF_INET` entry per emulated
//! HCA, labelled `lo:<ibdev>` (an address of the loopback interface, the RoCE GIDs' netdev,
//! `mlx5_emu::NDEV_NAME`): the HCA's address `127.1.x.y` (docs/rdma-cm.md, "The address
//! rule"), netmask 255.255.0.0, flags UP, RUNNING, LOOPBACK. So a program that picks an
//! rdma_cm address from the interface list (libfabric's verbs provider, UCX) finds the
//! address each HCA owns, as it would find an IPoIB or RoCE netdev's address on a real
//! host.
//!
//! The added entries are built once and never freed; glibc's list is one allocation that
//! `freeifaddrs` frees as a whole, so linking ours after its last entry leaves it intact.
//! When the host's list is empty, ours is the head: [`is_ours`] tells the `freeifaddrs`
//! hook to free nothing.

use std::ffi::{CString, c_int};
use std::sync::OnceLock;

use libc::{ifaddrs, sockaddr, sockaddr_in};

use crate::shim;

/// Our entries, linked in order; the raw pointers point into leaked boxes.
struct Entries {
    head: *mut ifaddrs,
}

// SAFETY: the entries are written once (before being published through the OnceLock) and
// only read afterwards; the pointers are to leaked, never-freed boxes.
unsafe impl Send for Entries {}
// SAFETY: as above: immutable after construction.
unsafe impl Sync for Entries {}

static ENTRIES: OnceLock<Entries> = OnceLock::new();

fn sin(ip: [u8; 4]) -> *mut sockaddr {
    // SAFETY: an all-zero sockaddr_in is a valid value.
    let mut a: sockaddr_in = unsafe { std::mem::zeroed() };
    a.sin_family = libc::AF_INET as libc::sa_family_t;
    a.sin_addr.s_addr = u32::from_ne_bytes(ip);
    Box::into_raw(Box::new(a)).cast()
}

fn build() -> Entries {
    let emu = shim::emulator();
    let mut head: *mut ifaddrs = std::ptr::null_mut();
    // built back to front, so that the list runs in HCA order
    for i in (0..emu.num_hcas()).rev() {
        let Some(h) = emu.hca_info(i) else { continue };
        let label = format!("{}:{}", mlx5_emu::NDEV_NAME, h.name);
        let Ok(name) = CString::new(label) else {
            continue;
        };
        // SAFETY: an all-zero ifaddrs (null pointers, no flags) is a valid value.
        let mut e: ifaddrs = unsafe { std::mem::zeroed() };
        e.ifa_next = head;
        e.ifa_name = name.into_raw();
        e.ifa_flags = (libc::IFF_UP | libc::IFF_RUNNING | libc::IFF_LOOPBACK) as u32;
        e.ifa_addr = sin(h.ipv4);
        e.ifa_netmask = sin([255, 255, 0, 0]);
        head = Box::into_raw(Box::new(e));
    }
    Entries { head }
}

/// `getifaddrs` hook: the host's list (from libc's `getifaddrs`), then ours.
///
/// # Safety
/// `ifap` is a valid pointer to write the list's head to (getifaddrs(3)'s contract);
/// `real` is libc's `getifaddrs`.
pub(crate) unsafe fn get(
    ifap: *mut *mut ifaddrs,
    real: unsafe extern "C" fn(*mut *mut ifaddrs) -> c_int,
) -> c_int {
    // SAFETY: the caller's pointer, forwarded.
    let rc = unsafe { real(ifap) };
    if rc != 0 || ifap.is_null() {
        return rc;
    }
    let ours = shim::guard(std::ptr::null_mut(), || ENTRIES.get_or_init(build).head);
    if ours.is_null() {
        return rc;
    }
    // SAFETY: libc filled `*ifap` with the head of a well-formed, null-terminated list it
    // owns (or null for none); `ifap` is valid by the caller's contract.
    let mut p = unsafe { *ifap };
    if p.is_null() {
        // SAFETY: as above.
        unsafe { *ifap = ours };
        return rc;
    }
    // SAFETY: `p` is an entry of that list; we only walk it.
    while let Some(next) = std::ptr::NonNull::new(unsafe { (*p).ifa_next }) {
        p = next.as_ptr();
    }
    // SAFETY: `p` is the list's last entry (its `ifa_next` is null): linking our static
    // entries after it is the only change to libc's list.
    unsafe { (*p).ifa_next = ours };
    rc
}

/// `freeifaddrs` hook: whether `ifa` is our own list (nothing to free: the host's list was
/// empty); otherwise the caller forwards it to libc.
pub(crate) fn is_ours(ifa: *mut ifaddrs) -> bool {
    !ifa.is_null() && ENTRIES.get().is_some_and(|e| e.head == ifa)
}
