//! The real libc functions behind the interposers, found with `dlsym(RTLD_NEXT, ..)` on first
//! use and cached. `None` only if libc lacks the symbol (the hook then fails with `ENOSYS`).

use std::sync::atomic::{AtomicUsize, Ordering};

use libc::{c_char, c_int, c_uint, c_ulong, c_void, off_t, size_t, ssize_t};

macro_rules! real_fns {
    ($( $(#[$doc:meta])* $name:ident = $sym:literal : fn($($arg:ty),*) -> $ret:ty; )*) => {
        $(
            $(#[$doc])*
            pub(crate) fn $name() -> Option<unsafe extern "C" fn($($arg),*) -> $ret> {
                static SLOT: AtomicUsize = AtomicUsize::new(0);
                let mut addr = SLOT.load(Ordering::Acquire);
                if addr == 0 {
                    // SAFETY: dlsym is called with the RTLD_NEXT pseudo-handle and a
                    // NUL-terminated symbol name; it only reads them.
                    addr = unsafe { libc::dlsym(libc::RTLD_NEXT, $sym.as_ptr()) } as usize;
                    if addr == 0 {
                        return None;
                    }
                    SLOT.store(addr, Ordering::Release);
                }
                // SAFETY: `addr` is the non-null address of the libc function `$sym`, whose C
                // prototype is exactly this signature (same ABI, same argument registers).
                Some(unsafe { std::mem::transmute::<usize, unsafe extern "C" fn($($arg),*) -> $ret>(addr) })
            }
        )*
    };
}

real_fns! {
    /// `getifaddrs(ifap)`
    getifaddrs = c"getifaddrs": fn(*mut *mut libc::ifaddrs) -> c_int;
    /// `freeifaddrs(ifa)`
    freeifaddrs = c"freeifaddrs": fn(*mut libc::ifaddrs) -> ();
    /// `open(path, flags, mode)`
    open = c"open": fn(*const c_char, c_int, c_uint) -> c_int;
    /// `open64(path, flags, mode)`
    open64 = c"open64": fn(*const c_char, c_int, c_uint) -> c_int;
    /// `__open_2(path, flags)` (fortified)
    open_2 = c"__open_2": fn(*const c_char, c_int) -> c_int;
    /// `__open64_2(path, flags)` (fortified)
    open64_2 = c"__open64_2": fn(*const c_char, c_int) -> c_int;
    /// `openat(dirfd, path, flags, mode)`
    openat = c"openat": fn(c_int, *const c_char, c_int, c_uint) -> c_int;
    /// `openat64(dirfd, path, flags, mode)`
    openat64 = c"openat64": fn(c_int, *const c_char, c_int, c_uint) -> c_int;
    /// `__openat_2(dirfd, path, flags)` (fortified)
    openat_2 = c"__openat_2": fn(c_int, *const c_char, c_int) -> c_int;
    /// `__openat64_2(dirfd, path, flags)` (fortified)
    openat64_2 = c"__openat64_2": fn(c_int, *const c_char, c_int) -> c_int;
    /// `stat(path, buf)`
    stat = c"stat": fn(*const c_char, *mut libc::stat) -> c_int;
    /// `stat64(path, buf)`
    stat64 = c"stat64": fn(*const c_char, *mut libc::stat) -> c_int;
    /// `lstat(path, buf)`
    lstat = c"lstat": fn(*const c_char, *mut libc::stat) -> c_int;
    /// `lstat64(path, buf)`
    lstat64 = c"lstat64": fn(*const c_char, *mut libc::stat) -> c_int;
    /// `fstat(fd, buf)`
    fstat = c"fstat": fn(c_int, *mut libc::stat) -> c_int;
    /// `fstat64(fd, buf)`
    fstat64 = c"fstat64": fn(c_int, *mut libc::stat) -> c_int;
    /// `fstatat(dirfd, path, buf, flags)`
    fstatat = c"fstatat": fn(c_int, *const c_char, *mut libc::stat, c_int) -> c_int;
    /// `fstatat64(dirfd, path, buf, flags)`
    fstatat64 = c"fstatat64": fn(c_int, *const c_char, *mut libc::stat, c_int) -> c_int;
    /// `__xstat(ver, path, buf)` (pre-2.33 glibc ABI)
    xstat = c"__xstat": fn(c_int, *const c_char, *mut libc::stat) -> c_int;
    /// `__xstat64(ver, path, buf)`
    xstat64 = c"__xstat64": fn(c_int, *const c_char, *mut libc::stat) -> c_int;
    /// `__lxstat(ver, path, buf)`
    lxstat = c"__lxstat": fn(c_int, *const c_char, *mut libc::stat) -> c_int;
    /// `__lxstat64(ver, path, buf)`
    lxstat64 = c"__lxstat64": fn(c_int, *const c_char, *mut libc::stat) -> c_int;
    /// `__fxstat(ver, fd, buf)`
    fxstat = c"__fxstat": fn(c_int, c_int, *mut libc::stat) -> c_int;
    /// `__fxstat64(ver, fd, buf)`
    fxstat64 = c"__fxstat64": fn(c_int, c_int, *mut libc::stat) -> c_int;
    /// `__fxstatat(ver, dirfd, path, buf, flags)`
    fxstatat = c"__fxstatat": fn(c_int, c_int, *const c_char, *mut libc::stat, c_int) -> c_int;
    /// `__fxstatat64(ver, dirfd, path, buf, flags)`
    fxstatat64 = c"__fxstatat64": fn(c_int, c_int, *const c_char, *mut libc::stat, c_int) -> c_int;
    /// `statx(dirfd, path, flags, mask, buf)`
    statx = c"statx": fn(c_int, *const c_char, c_int, c_uint, *mut libc::statx) -> c_int;
    /// `access(path, mode)`
    access = c"access": fn(*const c_char, c_int) -> c_int;
    /// `faccessat(dirfd, path, mode, flags)`
    faccessat = c"faccessat": fn(c_int, *const c_char, c_int, c_int) -> c_int;
    /// `write(fd, buf, count)`
    write = c"write": fn(c_int, *const c_void, size_t) -> ssize_t;
    /// `ioctl(fd, request, arg)`
    ioctl = c"ioctl": fn(c_int, c_ulong, *mut c_void) -> c_int;
    /// `mmap(addr, len, prot, flags, fd, offset)`
    mmap = c"mmap": fn(*mut c_void, size_t, c_int, c_int, c_int, off_t) -> *mut c_void;
    /// `mmap64(addr, len, prot, flags, fd, offset)`
    mmap64 = c"mmap64": fn(*mut c_void, size_t, c_int, c_int, c_int, off_t) -> *mut c_void;
    /// `munmap(addr, len)`
    munmap = c"munmap": fn(*mut c_void, size_t) -> c_int;
    /// `close(fd)`
    close = c"close": fn(c_int) -> c_int;
    /// `close_range(first, last, flags)`
    close_range = c"close_range": fn(c_uint, c_uint, c_int) -> c_int;
    /// `dup(fd)`
    dup = c"dup": fn(c_int) -> c_int;
    /// `dup2(old, new)`
    dup2 = c"dup2": fn(c_int, c_int) -> c_int;
    /// `dup3(old, new, flags)`
    dup3 = c"dup3": fn(c_int, c_int, c_int) -> c_int;
    /// `opendir(path)`
    opendir = c"opendir": fn(*const c_char) -> *mut libc::DIR;
    /// `fopen(path, mode)`
    fopen = c"fopen": fn(*const c_char, *const c_char) -> *mut libc::FILE;
    /// `fopen64(path, mode)`
    fopen64 = c"fopen64": fn(*const c_char, *const c_char) -> *mut libc::FILE;
    /// `fcntl(fd, cmd, arg)`
    fcntl = c"fcntl": fn(c_int, c_int, c_ulong) -> c_int;
    /// `fcntl64(fd, cmd, arg)`
    fcntl64 = c"fcntl64": fn(c_int, c_int, c_ulong) -> c_int;
    /// `socket(domain, type, protocol)`
    socket = c"socket": fn(c_int, c_int, c_int) -> c_int;
}
