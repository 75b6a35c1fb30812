//! The interposed libc functions.
//!
//! Each hook recognises what belongs to the emulator (a device node path, a descriptor or a
//! mapping in [`REGISTRY`]) and forwards everything else unchanged to the next definition
//! (libc's), found with `dlsym(RTLD_NEXT)`.
//!
//! The variadic C prototypes (`open`, `openat`, `ioctl`) are defined with their optional
//! argument as a fixed one. On the Linux x86-64 and AArch64 calling conventions a variadic
//! caller passes that argument in the same register as a fixed one, so the value arrives
//! intact (and is only forwarded when present in the caller's sense: `mode` matters only
//! with `O_CREAT`/`O_TMPFILE`).
//!
//! # Safety (all hooks)
//! Each hook has the contract of the libc function it replaces: pointers are valid as that
//! function's manual page requires. Nothing the emulator receives is trusted beyond that:
//! command buffers are copied with checked copies (bad pointers give `EFAULT`).

use std::ffi::{c_char, c_int, c_uint, c_ulong, c_void};
use std::ptr::NonNull;

use libc::{off_t, size_t, ssize_t};

use crate::real;
use crate::shim::{self, REGISTRY, fail};

/// `NETLINK_RDMA` (`<linux/netlink.h>`): the RDMA netlink family libibverbs tries first.
const NETLINK_RDMA: c_int = 20;

// Same layout, so one patch routine serves `stat` and `stat64` (64-bit glibc targets).
const _: () = assert!(size_of::<libc::stat>() == size_of::<libc::stat64>());

/// Forward to a real function, or fail with `ENOSYS` if libc lacks it.
macro_rules! forward {
    ($real:expr, |$f:ident| $call:expr) => {
        match $real {
            Some($f) => $call,
            None => fail(libc::ENOSYS) as _,
        }
    };
}

// ---------------------------------------------------------------------------------------
// open

/// `open(2)`; see the module's safety section.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn open(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    // SAFETY: `path` is a C string by open(2)'s contract.
    if let Some(hca) = unsafe { shim::device_of_path(path) } {
        return shim::open_device(hca, flags);
    }
    // SAFETY: the caller's arguments, forwarded unchanged.
    forward!(real::open(), |f| unsafe { f(path, flags, mode) })
}

/// `open64(2)`; see the module's safety section.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn open64(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    // SAFETY: `path` is a C string by open(2)'s contract.
    if let Some(hca) = unsafe { shim::device_of_path(path) } {
        return shim::open_device(hca, flags);
    }
    // SAFETY: the caller's arguments, forwarded unchanged.
    forward!(real::open64(), |f| unsafe { f(path, flags, mode) })
}

/// `__open_2` (fortified `open` without a mode); see the module's safety section.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __open_2(path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: `path` is a C string by open(2)'s contract.
    if let Some(hca) = unsafe { shim::device_of_path(path) } {
        return shim::open_device(hca, flags);
    }
    // SAFETY: the caller's arguments, forwarded unchanged.
    forward!(real::open_2(), |f| unsafe { f(path, flags) })
}

/// `__open64_2`; see the module's safety section.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __open64_2(path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: `path` is a C string by open(2)'s contract.
    if let Some(hca) = unsafe { shim::device_of_path(path) } {
        return shim::open_device(hca, flags);
    }
    // SAFETY: the caller's arguments, forwarded unchanged.
    forward!(real::open64_2(), |f| unsafe { f(path, flags) })
}

/// `openat(2)`; only absolute device paths are ours. See the module's safety section.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openat(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mode: c_uint,
) -> c_int {
    // SAFETY: `path` is a C string by openat(2)'s contract.
    if let Some(hca) = unsafe { shim::device_of_path(path) } {
        return shim::open_device(hca, flags);
    }
    // SAFETY: the caller's arguments, forwarded unchanged.
    forward!(real::openat(), |f| unsafe { f(dirfd, path, flags, mode) })
}

/// `openat64(2)`; see the module's safety section.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openat64(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mode: c_uint,
) -> c_int {
    // SAFETY: `path` is a C string by openat(2)'s contract.
    if let Some(hca) = unsafe { shim::device_of_path(path) } {
        return shim::open_device(hca, flags);
    }
    // SAFETY: the caller's arguments, forwarded unchanged.
    forward!(real::openat64(), |f| unsafe { f(dirfd, path, flags, mode) })
}

/// `__openat_2`; see the module's safety section.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __openat_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: `path` is a C string by openat(2)'s contract.
    if let Some(hca) = unsafe { shim::device_of_path(path) } {
        return shim::open_device(hca, flags);
    }
    // SAFETY: the caller's arguments, forwarded unchanged.
    forward!(real::openat_2(), |f| unsafe { f(dirfd, path, flags) })
}

/// `__openat64_2`; see the module's safety section.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __openat64_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: `path` is a C string by openat(2)'s contract.
    if let Some(hca) = unsafe { shim::device_of_path(path) } {
        return shim::open_device(hca, flags);
    }
    // SAFETY: the caller's arguments, forwarded unchanged.
    forward!(real::openat64_2(), |f| unsafe { f(dirfd, path, flags) })
}

// ---------------------------------------------------------------------------------------
// stat family: our device nodes and descriptors are stat'ed as the backing null device,
// then given the uverbs device number.

/// Shared body of the path-based stat calls.
///
/// # Safety
/// `path` is a C string (or null), `buf` a writable `struct stat`, as for stat(2).
unsafe fn stat_path(
    path: *const c_char,
    buf: *mut libc::stat,
    call: impl FnOnce(*const c_char) -> c_int,
) -> c_int {
    // SAFETY: forwarded contract on `path`.
    let (p, hca) = unsafe { shim::substitute(path) };
    let rc = call(p);
    if let (0, Some(hca)) = (rc, hca) {
        // SAFETY: the stat call succeeded, so `buf` holds a filled struct.
        unsafe { shim::patch_stat(buf, hca) };
    }
    rc
}

/// Shared body of the descriptor-based stat calls.
///
/// # Safety
/// `buf` is a writable `struct stat`, as for fstat(2).
unsafe fn stat_fd(fd: c_int, buf: *mut libc::stat, call: impl FnOnce() -> c_int) -> c_int {
    let rc = call();
    if rc == 0 {
        if let Some(file) = REGISTRY.fd(fd) {
            // SAFETY: the stat call succeeded, so `buf` holds a filled struct.
            unsafe { shim::patch_stat(buf, file.hca) };
        }
    }
    rc
}

/// `AT_EMPTY_PATH` with an empty path on one of our descriptors: its HCA.
///
/// # Safety
/// `path` is null or a C string.
unsafe fn empty_path_hca(dirfd: c_int, path: *const c_char, flags: c_int) -> Option<usize> {
    // SAFETY: forwarded contract on `path`.
    let empty = unsafe { shim::path_bytes(path) } == Some(b"");
    if flags & libc::AT_EMPTY_PATH != 0 && empty {
        REGISTRY.fd(dirfd).map(|f| f.hca)
    } else {
        None
    }
}

/// Shared body of the `fstatat` calls: an absolute device path, or `AT_EMPTY_PATH` on one of
/// our descriptors.
///
/// # Safety
/// As fstatat(2).
unsafe fn stat_at(
    dirfd: c_int,
    path: *const c_char,
    buf: *mut libc::stat,
    flags: c_int,
    call: impl FnOnce(c_int, *const c_char) -> c_int,
) -> c_int {
    // SAFETY: forwarded contract on `path`.
    let (p, hca) = unsafe { shim::substitute(path) };
    // SAFETY: forwarded contract on `path`.
    let hca = hca.or_else(|| unsafe { empty_path_hca(dirfd, path, flags) });
    let rc = if p == path {
        call(dirfd, p)
    } else {
        call(libc::AT_FDCWD, p)
    };
    if let (0, Some(hca)) = (rc, hca) {
        // SAFETY: the stat call succeeded, so `buf` holds a filled struct.
        unsafe { shim::patch_stat(buf, hca) };
    }
    rc
}

/// `stat(2)`; see the module's safety section.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stat(path: *const c_char, buf: *mut libc::stat) -> c_int {
    // SAFETY: the caller's arguments (or the backing node path), forwarded to libc.
    let call = |p| forward!(real::stat(), |f| unsafe { f(p, buf) });
    // SAFETY: stat(2)'s contract on the caller's pointers, forwarded.
    unsafe { stat_path(path, buf, call) }
}

/// `stat64(2)`; see the module's safety section.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stat64(path: *const c_char, buf: *mut libc::stat) -> c_int {
    // SAFETY: the caller's arguments (or the backing node path), forwarded to libc.
    let call = |p| forward!(real::stat64(), |f| unsafe { f(p, buf) });
    // SAFETY: stat(2)'s contract on the caller's pointers, forwarded.
    unsafe { stat_path(path, buf, call) }
}

/// `lstat(2)`; see the module's safety section.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lstat(path: *const c_char, buf: *mut libc::stat) -> c_int {
    // SAFETY: the caller's arguments (or the backing node path), forwarded to libc.
    let call = |p| forward!(real::lstat(), |f| unsafe { f(p, buf) });
    // SAFETY: stat(2)'s contract on the caller's pointers, forwarded.
    unsafe { stat_path(path, buf, call) }
}

/// `lstat64(2)`; see the module's safety section.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lstat64(path: *const c_char, buf: *mut libc::stat) -> c_int {
    // SAFETY: the caller's arguments (or the backing node path), forwarded to libc.
    let call = |p| forward!(real::lstat64(), |f| unsafe { f(p, buf) });
    // SAFETY: stat(2)'s contract on the caller's pointers, forwarded.
    unsafe { stat_path(path, buf, call) }
}

/// `fstat(2)`; see the module's safety section.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fstat(fd: c_int, buf: *mut libc::stat) -> c_int {
    // SAFETY: the caller's arguments (or the backing node path), forwarded to libc.
    let call = || forward!(real::fstat(), |f| unsafe { f(fd, buf) });
    // SAFETY: fstat(2)'s contract on the caller's pointers, forwarded.
    unsafe { stat_fd(fd, buf, call) }
}

/// `fstat64(2)`; see the module's safety section.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fstat64(fd: c_int, buf: *mut libc::stat) -> c_int {
    // SAFETY: the caller's arguments (or the backing node path), forwarded to libc.
    let call = || forward!(real::fstat64(), |f| unsafe { f(fd, buf) });
    // SAFETY: fstat(2)'s contract on the caller's pointers, forwarded.
    unsafe { stat_fd(fd, buf, call) }
}

/// `fstatat(2)`; see the module's safety section.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fstatat(
    dirfd: c_int,
    path: *const c_char,
    buf: *mut libc::stat,
    flags: c_int,
) -> c_int {
    // SAFETY: the caller's arguments (or the backing node path), forwarded to libc.
    let call = |d, p| forward!(real::fstatat(), |f| unsafe { f(d, p, buf, flags) });
    // SAFETY: fstatat(2)'s contract on the caller's pointers, forwarded.
    unsafe { stat_at(dirfd, path, buf, flags, call) }
}

/// `fstatat64(2)`; see the module's safety section.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fstatat64(
    dirfd: c_int,
    path: *const c_char,
    buf: *mut libc::stat,
    flags: c_int,
) -> c_int {
    // SAFETY: the caller's arguments (or the backing node path), forwarded to libc.
    let call = |d, p| forward!(real::fstatat64(), |f| unsafe { f(d, p, buf, flags) });
    // SAFETY: fstatat(2)'s contract on the caller's pointers, forwarded.
    unsafe { stat_at(dirfd, path, buf, flags, call) }
}

/// `__xstat` (glibc before 2.33); see the module's safety section.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __xstat(ver: c_int, path: *const c_char, buf: *mut libc::stat) -> c_int {
    // SAFETY: the caller's arguments (or the backing node path), forwarded to libc.
    let call = |p| forward!(real::xstat(), |f| unsafe { f(ver, p, buf) });
    // SAFETY: stat(2)'s contract on the caller's pointers, forwarded.
    unsafe { stat_path(path, buf, call) }
}

/// `__xstat64`; see the module's safety section.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __xstat64(ver: c_int, path: *const c_char, buf: *mut libc::stat) -> c_int {
    // SAFETY: the caller's arguments (or the backing node path), forwarded to libc.
    let call = |p| forward!(real::xstat64(), |f| unsafe { f(ver, p, buf) });
    // SAFETY: stat(2)'s contract on the caller's pointers, forwarded.
    unsafe { stat_path(path, buf, call) }
}

/// `__lxstat`; see the module's safety section.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __lxstat(ver: c_int, path: *const c_char, buf: *mut libc::stat) -> c_int {
    // SAFETY: the caller's arguments (or the backing node path), forwarded to libc.
    let call = |p| forward!(real::lxstat(), |f| unsafe { f(ver, p, buf) });
    // SAFETY: stat(2)'s contract on the caller's pointers, forwarded.
    unsafe { stat_path(path, buf, call) }
}

/// `__lxstat64`; see the module's safety section.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __lxstat64(
    ver: c_int,
    path: *const c_char,
    buf: *mut libc::stat,
) -> c_int {
    // SAFETY: the caller's arguments (or the backing node path), forwarded to libc.
    let call = |p| forward!(real::lxstat64(), |f| unsafe { f(ver, p, buf) });
    // SAFETY: stat(2)'s contract on the caller's pointers, forwarded.
    unsafe { stat_path(path, buf, call) }
}

/// `__fxstat`; see the module's safety section.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __fxstat(ver: c_int, fd: c_int, buf: *mut libc::stat) -> c_int {
    // SAFETY: the caller's arguments (or the backing node path), forwarded to libc.
    let call = || forward!(real::fxstat(), |f| unsafe { f(ver, fd, buf) });
    // SAFETY: fstat(2)'s contract on the caller's pointers, forwarded.
    unsafe { stat_fd(fd, buf, call) }
}

/// `__fxstat64`; see the module's safety section.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __fxstat64(ver: c_int, fd: c_int, buf: *mut libc::stat) -> c_int {
    // SAFETY: the caller's arguments (or the backing node path), forwarded to libc.
    let call = || forward!(real::fxstat64(), |f| unsafe { f(ver, fd, buf) });
    // SAFETY: fstat(2)'s contract on the caller's pointers, forwarded.
    unsafe { stat_fd(fd, buf, call) }
}

/// `__fxstatat`; see the module's safety section.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __fxstatat(
    ver: c_int,
    dirfd: c_int,
    path: *const c_char,
    buf: *mut libc::stat,
    flags: c_int,
) -> c_int {
    // SAFETY: the caller's arguments (or the backing node path), forwarded to libc.
    let call = |d, p| forward!(real::fxstatat(), |f| unsafe { f(ver, d, p, buf, flags) });
    // SAFETY: fstatat(2)'s contract on the caller's pointers, forwarded.
    unsafe { stat_at(dirfd, path, buf, flags, call) }
}

/// `__fxstatat64`; see the module's safety section.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __fxstatat64(
    ver: c_int,
    dirfd: c_int,
    path: *const c_char,
    buf: *mut libc::stat,
    flags: c_int,
) -> c_int {
    // SAFETY: the caller's arguments (or the backing node path), forwarded to libc.
    let call = |d, p| forward!(real::fxstatat64(), |f| unsafe { f(ver, d, p, buf, flags) });
    // SAFETY: fstatat(2)'s contract on the caller's pointers, forwarded.
    unsafe { stat_at(dirfd, path, buf, flags, call) }
}

/// `statx(2)`; see the module's safety section.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn statx(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mask: c_uint,
    buf: *mut libc::statx,
) -> c_int {
    // SAFETY: `path` is a C string by statx(2)'s contract.
    let (p, hca) = unsafe { shim::substitute(path) };
    // SAFETY: as above.
    let hca = hca.or_else(|| unsafe { empty_path_hca(dirfd, path, flags) });
    let d = if p == path { dirfd } else { libc::AT_FDCWD };
    // SAFETY: the caller's arguments (or the backing node path), forwarded.
    let rc = forward!(real::statx(), |f| unsafe { f(d, p, flags, mask, buf) });
    if let (0, Some(hca)) = (rc, hca) {
        // SAFETY: statx succeeded, so `buf` holds a filled struct.
        unsafe { shim::patch_statx(buf, hca) };
    }
    rc
}

/// `access(2)`; see the module's safety section.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn access(path: *const c_char, mode: c_int) -> c_int {
    // SAFETY: `path` is a C string by access(2)'s contract.
    let (p, _) = unsafe { shim::substitute(path) };
    // SAFETY: the caller's arguments (or the backing node path), forwarded.
    forward!(real::access(), |f| unsafe { f(p, mode) })
}

/// `faccessat(2)`; see the module's safety section.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn faccessat(
    dirfd: c_int,
    path: *const c_char,
    mode: c_int,
    flags: c_int,
) -> c_int {
    // SAFETY: `path` is a C string by faccessat(2)'s contract.
    let (p, _) = unsafe { shim::substitute(path) };
    let d = if p == path { dirfd } else { libc::AT_FDCWD };
    // SAFETY: the caller's arguments (or the backing node path), forwarded.
    forward!(real::faccessat(), |f| unsafe { f(d, p, mode, flags) })
}

// ---------------------------------------------------------------------------------------
// the command descriptor

/// `write(2)`: uverbs commands on our descriptors; see the module's safety section.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, count: size_t) -> ssize_t {
    if let Some(file) = REGISTRY.fd(fd) {
        return shim::device_write(fd, &file, buf, count);
    }
    // SAFETY: the caller's arguments, forwarded unchanged.
    forward!(real::write(), |f| unsafe { f(fd, buf, count) })
}

/// `ioctl(2)`: `RDMA_VERBS_IOCTL` on our descriptors; see the module's safety section.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ioctl(fd: c_int, request: c_ulong, arg: *mut c_void) -> c_int {
    if let Some(file) = REGISTRY.fd(fd) {
        return shim::device_ioctl(fd, &file, request, arg);
    }
    // SAFETY: the caller's arguments, forwarded unchanged.
    forward!(real::ioctl(), |f| unsafe { f(fd, request, arg) })
}

/// `mmap(2)`: device pages of our descriptors; see the module's safety section.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    offset: off_t,
) -> *mut c_void {
    if let Some(file) = REGISTRY.fd(fd) {
        return shim::device_mmap(fd, &file, addr, len, prot, flags, offset);
    }
    match real::mmap() {
        // SAFETY: the caller's arguments, forwarded unchanged.
        Some(f) => unsafe { f(addr, len, prot, flags, fd, offset) },
        None => {
            shim::set_errno(libc::ENOSYS);
            libc::MAP_FAILED
        }
    }
}

/// `mmap64(2)`; see the module's safety section.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    offset: off_t,
) -> *mut c_void {
    if let Some(file) = REGISTRY.fd(fd) {
        return shim::device_mmap(fd, &file, addr, len, prot, flags, offset);
    }
    match real::mmap64() {
        // SAFETY: the caller's arguments, forwarded unchanged.
        Some(f) => unsafe { f(addr, len, prot, flags, fd, offset) },
        None => {
            shim::set_errno(libc::ENOSYS);
            libc::MAP_FAILED
        }
    }
}

/// `munmap(2)`; see the module's safety section.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: size_t) -> c_int {
    if let Some(nn) = NonNull::new(addr) {
        if let Some((file, _)) = REGISTRY.take_map(addr as usize) {
            return shim::device_munmap(&file, nn, len);
        }
    }
    // SAFETY: the caller's arguments, forwarded unchanged.
    forward!(real::munmap(), |f| unsafe { f(addr, len) })
}

// ---------------------------------------------------------------------------------------
// descriptor lifetime

/// `close(2)`: an emulated file is released when its last descriptor and mapping go.
/// See the module's safety section.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    // Dropped after the registry lock is released (dropping may close the emulator's own
    // descriptors, which comes back here).
    let released = REGISTRY.remove_fd(fd);
    // SAFETY: the caller's argument, forwarded unchanged.
    let rc = forward!(real::close(), |f| unsafe { f(fd) });
    if let Some(file) = released {
        shim::closed(fd, file, rc);
    }
    rc
}

/// `close_range(2)`; see the module's safety section.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    // SAFETY: the caller's arguments, forwarded unchanged.
    let rc = forward!(real::close_range(), |f| unsafe { f(first, last, flags) });
    // With CLOSE_RANGE_CLOEXEC nothing is closed now.
    if rc == 0 && flags & (libc::CLOSE_RANGE_CLOEXEC as c_int) == 0 {
        let released = REGISTRY.remove_fd_range(first, last);
        shim::guard((), || drop(released));
    }
    rc
}

/// Record `new` as another descriptor of `old`'s emulated file (after a successful dup).
fn alias(old: c_int, new: c_int) {
    if let Some(file) = REGISTRY.fd(old) {
        let stale = REGISTRY.insert_fd(new, file);
        shim::guard((), || drop(stale));
    }
}

/// `dup(2)`; see the module's safety section.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup(old: c_int) -> c_int {
    // SAFETY: the caller's argument, forwarded unchanged.
    let new = forward!(real::dup(), |f| unsafe { f(old) });
    if new >= 0 {
        alias(old, new);
    }
    new
}

/// `dup2(2)`: a descriptor of ours that is overwritten is closed; see the module's safety section.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    // SAFETY: the caller's arguments, forwarded unchanged.
    let rc = forward!(real::dup2(), |f| unsafe { f(old, new) });
    if rc >= 0 && old != new {
        let replaced = REGISTRY.remove_fd(new);
        shim::guard((), || drop(replaced));
        alias(old, new);
    }
    rc
}

/// `dup3(2)`; see the module's safety section.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    // SAFETY: the caller's arguments, forwarded unchanged.
    let rc = forward!(real::dup3(), |f| unsafe { f(old, new, flags) });
    if rc >= 0 {
        let replaced = REGISTRY.remove_fd(new);
        shim::guard((), || drop(replaced));
        alias(old, new);
    }
    rc
}

/// `opendir(3)`: only watched, so that listing the sysfs tree first creates it.
/// See the module's safety section.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn opendir(path: *const c_char) -> *mut libc::DIR {
    // SAFETY: `path` is a C string by opendir(3)'s contract.
    if let Some(bytes) = unsafe { shim::path_bytes(path) } {
        shim::touch(bytes);
    }
    match real::opendir() {
        // SAFETY: the caller's argument, forwarded unchanged.
        Some(f) => unsafe { f(path) },
        None => {
            shim::set_errno(libc::ENOSYS);
            std::ptr::null_mut()
        }
    }
}

/// `fopen(3)`: only watched (libc opens the file internally, past our `open`).
/// See the module's safety section.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fopen(path: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    // SAFETY: `path` is a C string by fopen(3)'s contract.
    if let Some(bytes) = unsafe { shim::path_bytes(path) } {
        shim::touch(bytes);
    }
    match real::fopen() {
        // SAFETY: the caller's arguments, forwarded unchanged.
        Some(f) => unsafe { f(path, mode) },
        None => {
            shim::set_errno(libc::ENOSYS);
            std::ptr::null_mut()
        }
    }
}

/// `fopen64(3)`; see [`fopen`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fopen64(path: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    // SAFETY: `path` is a C string by fopen(3)'s contract.
    if let Some(bytes) = unsafe { shim::path_bytes(path) } {
        shim::touch(bytes);
    }
    match real::fopen64() {
        // SAFETY: the caller's arguments, forwarded unchanged.
        Some(f) => unsafe { f(path, mode) },
        None => {
            shim::set_errno(libc::ENOSYS);
            std::ptr::null_mut()
        }
    }
}

/// `fcntl(2)`: `F_DUPFD`/`F_DUPFD_CLOEXEC` of one of our descriptors makes another one.
/// The variadic argument is taken as one register-sized value (an int or a pointer) and
/// forwarded bit for bit. See the module's safety section.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: the caller's arguments, forwarded unchanged.
    let rc = forward!(real::fcntl(), |f| unsafe { f(fd, cmd, arg) });
    if rc >= 0 && matches!(cmd, libc::F_DUPFD | libc::F_DUPFD_CLOEXEC) {
        alias(fd, rc);
    }
    rc
}

/// `fcntl64(2)`; see [`fcntl`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: the caller's arguments, forwarded unchanged.
    let rc = forward!(real::fcntl64(), |f| unsafe { f(fd, cmd, arg) });
    if rc >= 0 && matches!(cmd, libc::F_DUPFD | libc::F_DUPFD_CLOEXEC) {
        alias(fd, rc);
    }
    rc
}

/// `socket(2)`: RDMA netlink is refused, so that libibverbs enumerates through sysfs even on
/// a kernel that has RDMA netlink (an empty netlink answer would not fall back).
/// See the module's safety section.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int {
    if domain == libc::AF_NETLINK && protocol == NETLINK_RDMA {
        return fail(libc::EPROTONOSUPPORT);
    }
    // SAFETY: the caller's arguments, forwarded unchanged.
    forward!(real::socket(), |f| unsafe { f(domain, ty, protocol) })
}
