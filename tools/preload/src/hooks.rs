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

/// Forward to a real function, or fail with `ENOSYS` if libc lacks it (returning -1, or
/// the given failure value: `MAP_FAILED`, a null pointer).
macro_rules! forward {
    ($real:expr, |$f:ident| $call:expr) => {
        forward!($real, |$f| $call, -1 as _)
    };
    ($real:expr, |$f:ident| $call:expr, $failed:expr) => {
        match $real {
            Some($f) => $call,
            None => {
                shim::set_errno(libc::ENOSYS);
                $failed
            }
        }
    };
}

/// The `open` family: our device node paths open the emulated device, everything else is
/// forwarded. Only absolute paths are ours (`openat`'s `dirfd` is then irrelevant).
macro_rules! open_hooks {
    ($(
        $(#[$doc:meta])*
        fn $name:ident($([$dirfd:ident])? $path:ident, $flags:ident $(, $mode:ident)?)
            => $real:ident;
    )*) => {$(
        $(#[$doc])*
        /// See the module's safety section.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            $($dirfd: c_int,)? $path: *const c_char, $flags: c_int $(, $mode: c_uint)?
        ) -> c_int {
            // SAFETY: `path` is a C string by open(2)'s contract.
            if let Some(hca) = unsafe { shim::device_of_path($path) } {
                return shim::open_device(hca, $flags);
            }
            // SAFETY: as above.
            if let Some(fd) = unsafe { crate::ucma::open($path, $flags) } { return fd; }
            // SAFETY: the caller's arguments, forwarded unchanged.
            forward!(real::$real(), |f| unsafe { f($($dirfd,)? $path, $flags $(, $mode)?) })
        }
    )*};
}

/// The path-based `stat` family (`ver` is the `__xstat` ABI version argument).
macro_rules! stat_path_hooks {
    ($(
        $(#[$doc:meta])*
        fn $name:ident($([$ver:ident])? $path:ident, $buf:ident) => $real:ident;
    )*) => {$(
        $(#[$doc])*
        /// See the module's safety section.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            $($ver: c_int,)? $path: *const c_char, $buf: *mut libc::stat
        ) -> c_int {
            // SAFETY: the caller's arguments (or the backing node path), forwarded to libc.
            let call = |p| forward!(real::$real(), |f| unsafe { f($($ver,)? p, $buf) });
            // SAFETY: stat(2)'s contract on the caller's pointers, forwarded.
            unsafe { stat_path($path, $buf, call) }
        }
    )*};
}

/// The descriptor-based `stat` family.
macro_rules! stat_fd_hooks {
    ($(
        $(#[$doc:meta])*
        fn $name:ident($([$ver:ident])? $fd:ident, $buf:ident) => $real:ident;
    )*) => {$(
        $(#[$doc])*
        /// See the module's safety section.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($ver: c_int,)? $fd: c_int, $buf: *mut libc::stat) -> c_int {
            // SAFETY: the caller's arguments, forwarded to libc.
            let call = || forward!(real::$real(), |f| unsafe { f($($ver,)? $fd, $buf) });
            // SAFETY: fstat(2)'s contract on the caller's pointers, forwarded.
            unsafe { stat_fd($fd, $buf, call) }
        }
    )*};
}

/// The `fstatat` family.
macro_rules! stat_at_hooks {
    ($(
        $(#[$doc:meta])*
        fn $name:ident($([$ver:ident])? $dirfd:ident, $path:ident, $buf:ident, $flags:ident)
            => $real:ident;
    )*) => {$(
        $(#[$doc])*
        /// See the module's safety section.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            $($ver: c_int,)? $dirfd: c_int, $path: *const c_char, $buf: *mut libc::stat,
            $flags: c_int,
        ) -> c_int {
            // SAFETY: the caller's arguments (or the backing node path), forwarded to libc.
            let call = |d, p| forward!(real::$real(), |f| unsafe { f($($ver,)? d, p, $buf, $flags) });
            // SAFETY: fstatat(2)'s contract on the caller's pointers, forwarded.
            unsafe { stat_at($dirfd, $path, $buf, $flags, call) }
        }
    )*};
}

/// Library calls that are only watched: a path inside the sysfs tree creates it first.
macro_rules! watch_hooks {
    ($(
        $(#[$doc:meta])*
        fn $name:ident($path:ident $(, $arg:ident: $ty:ty)*) -> $ret:ty => $real:ident;
    )*) => {$(
        $(#[$doc])*
        /// See the module's safety section.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($path: *const c_char $(, $arg: $ty)*) -> $ret {
            // SAFETY: `path` is a C string by the function's contract.
            if let Some(bytes) = unsafe { shim::path_bytes($path) } {
                shim::touch(bytes);
            }
            // SAFETY: the caller's arguments, forwarded unchanged.
            forward!(real::$real(), |f| unsafe { f($path $(, $arg)*) }, std::ptr::null_mut())
        }
    )*};
}

// ---------------------------------------------------------------------------------------
// open

open_hooks! {
    /// `open(2)`.
    fn open(path, flags, mode) => open;
    /// `open64(2)`.
    fn open64(path, flags, mode) => open64;
    /// `__open_2` (fortified `open` without a mode).
    fn __open_2(path, flags) => open_2;
    /// `__open64_2`.
    fn __open64_2(path, flags) => open64_2;
    /// `openat(2)`.
    fn openat([dirfd] path, flags, mode) => openat;
    /// `openat64(2)`.
    fn openat64([dirfd] path, flags, mode) => openat64;
    /// `__openat_2`.
    fn __openat_2([dirfd] path, flags) => openat_2;
    /// `__openat64_2`.
    fn __openat64_2([dirfd] path, flags) => openat64_2;
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
        // SAFETY: the stat call succeeded, so `buf` holds a filled struct.
        unsafe { crate::ucma::patch_fstat(fd, buf) };
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

stat_path_hooks! {
    /// `stat(2)`.
    fn stat(path, buf) => stat;
    /// `stat64(2)`.
    fn stat64(path, buf) => stat64;
    /// `lstat(2)`.
    fn lstat(path, buf) => lstat;
    /// `lstat64(2)`.
    fn lstat64(path, buf) => lstat64;
    /// `__xstat` (glibc before 2.33).
    fn __xstat([ver] path, buf) => xstat;
    /// `__xstat64`.
    fn __xstat64([ver] path, buf) => xstat64;
    /// `__lxstat`.
    fn __lxstat([ver] path, buf) => lxstat;
    /// `__lxstat64`.
    fn __lxstat64([ver] path, buf) => lxstat64;
}

stat_fd_hooks! {
    /// `fstat(2)`.
    fn fstat(fd, buf) => fstat;
    /// `fstat64(2)`.
    fn fstat64(fd, buf) => fstat64;
    /// `__fxstat`.
    fn __fxstat([ver] fd, buf) => fxstat;
    /// `__fxstat64`.
    fn __fxstat64([ver] fd, buf) => fxstat64;
}

stat_at_hooks! {
    /// `fstatat(2)`.
    fn fstatat(dirfd, path, buf, flags) => fstatat;
    /// `fstatat64(2)`.
    fn fstatat64(dirfd, path, buf, flags) => fstatat64;
    /// `__fxstatat`.
    fn __fxstatat([ver] dirfd, path, buf, flags) => fxstatat;
    /// `__fxstatat64`.
    fn __fxstatat64([ver] dirfd, path, buf, flags) => fxstatat64;
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
    if let Some(n) = crate::ucma::write(fd, buf, count) {
        return n;
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

/// The `mmap` pair: device pages of our descriptors come from the emulator.
macro_rules! mmap_hooks {
    ($($(#[$doc:meta])* fn $name:ident => $real:ident;)*) => {$(
        $(#[$doc])*
        /// See the module's safety section.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
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
            // SAFETY: the caller's arguments, forwarded unchanged.
            let call = |f: RealMmap| unsafe { f(addr, len, prot, flags, fd, offset) };
            forward!(real::$real(), |f| call(f), libc::MAP_FAILED)
        }
    )*};
}

/// Prototype of the real `mmap`.
type RealMmap =
    unsafe extern "C" fn(*mut c_void, size_t, c_int, c_int, c_int, off_t) -> *mut c_void;

mmap_hooks! {
    /// `mmap(2)`.
    fn mmap => mmap;
    /// `mmap64(2)`.
    fn mmap64 => mmap64;
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
    let rdma_cm = crate::ucma::take(fd);
    // SAFETY: the caller's argument, forwarded unchanged.
    let rc = forward!(real::close(), |f| unsafe { f(fd) });
    shim::guard((), || drop(rdma_cm));
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

/// After a successful `dup2`/`dup3` onto `new`: whatever `new` was is closed, and it is
/// now a copy of `old`.
fn duplicated_onto(old: c_int, new: c_int) {
    if old != new {
        let replaced = REGISTRY.remove_fd(new);
        shim::guard((), || drop(replaced));
        alias(old, new);
    }
}

/// `dup2(2)`: a descriptor of ours that is overwritten is closed; see the module's safety section.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    // SAFETY: the caller's arguments, forwarded unchanged.
    let rc = forward!(real::dup2(), |f| unsafe { f(old, new) });
    if rc >= 0 {
        duplicated_onto(old, new);
    }
    rc
}

/// `dup3(2)`; see the module's safety section.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    // SAFETY: the caller's arguments, forwarded unchanged.
    let rc = forward!(real::dup3(), |f| unsafe { f(old, new, flags) });
    if rc >= 0 {
        duplicated_onto(old, new);
    }
    rc
}

watch_hooks! {
    /// `opendir(3)`: listing the sysfs tree first creates it.
    fn opendir(path) -> *mut libc::DIR => opendir;
    /// `fopen(3)` (libc opens the file internally, past our `open`).
    fn fopen(path, mode: *const c_char) -> *mut libc::FILE => fopen;
    /// `fopen64(3)`.
    fn fopen64(path, mode: *const c_char) -> *mut libc::FILE => fopen64;
}

/// The `fcntl` pair: `F_DUPFD`/`F_DUPFD_CLOEXEC` of one of our descriptors makes another
/// one. The variadic argument is taken as one register-sized value (an int or a pointer)
/// and forwarded bit for bit.
macro_rules! fcntl_hooks {
    ($($(#[$doc:meta])* fn $name:ident => $real:ident;)*) => {$(
        $(#[$doc])*
        /// See the module's safety section.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
            // SAFETY: the caller's arguments, forwarded unchanged.
            let rc = forward!(real::$real(), |f| unsafe { f(fd, cmd, arg) });
            if rc >= 0 && matches!(cmd, libc::F_DUPFD | libc::F_DUPFD_CLOEXEC) {
                alias(fd, rc);
            }
            rc
        }
    )*};
}

fcntl_hooks! {
    /// `fcntl(2)`.
    fn fcntl => fcntl;
    /// `fcntl64(2)`.
    fn fcntl64 => fcntl64;
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

/// `getifaddrs(3)`: the host's interfaces, then the emulated HCAs' addresses (`ifaddrs.rs`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getifaddrs(ifap: *mut *mut libc::ifaddrs) -> c_int {
    // SAFETY: getifaddrs(3)'s contract, forwarded; `f` is libc's getifaddrs.
    forward!(real::getifaddrs(), |f| unsafe {
        crate::ifaddrs::get(ifap, f)
    })
}

/// `freeifaddrs(3)`: our entries are static; a list from libc goes back to libc.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn freeifaddrs(ifa: *mut libc::ifaddrs) {
    if crate::ifaddrs::is_ours(ifa) {
        return;
    }
    // SAFETY: a list from libc's getifaddrs (freeifaddrs(3)'s contract), forwarded.
    forward!(real::freeifaddrs(), |f| unsafe { f(ifa) }, ())
}
