//! The uverbs "syscall surface": the four operations a provider performs on the command fd
//! (`write`, `ioctl(RDMA_VERBS_IOCTL)`, `mmap`, `munmap`), as a trait so that the driver
//! runs unchanged on a real `/dev/infiniband/uverbsN` ([`UverbsFd`]) or on the emulator.

use std::ffi::CString;
use std::fmt;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use crate::ioctl::RDMA_VERBS_IOCTL;

/// An errno value as returned by the kernel (positive).
///
/// `Debug` and `Display` show the symbolic name: `EINVAL (22)`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Errno(pub i32);

impl Errno {
    /// `EPERM`
    pub const EPERM: Errno = Errno(libc::EPERM);
    /// `ENOENT`
    pub const ENOENT: Errno = Errno(libc::ENOENT);
    /// `EINTR`
    pub const EINTR: Errno = Errno(libc::EINTR);
    /// `EIO`
    pub const EIO: Errno = Errno(libc::EIO);
    /// `ENXIO`
    pub const ENXIO: Errno = Errno(libc::ENXIO);
    /// `EBADF`
    pub const EBADF: Errno = Errno(libc::EBADF);
    /// `EAGAIN`
    pub const EAGAIN: Errno = Errno(libc::EAGAIN);
    /// `ENOMEM`
    pub const ENOMEM: Errno = Errno(libc::ENOMEM);
    /// `EACCES`
    pub const EACCES: Errno = Errno(libc::EACCES);
    /// `EFAULT`
    pub const EFAULT: Errno = Errno(libc::EFAULT);
    /// `EBUSY`
    pub const EBUSY: Errno = Errno(libc::EBUSY);
    /// `EEXIST`
    pub const EEXIST: Errno = Errno(libc::EEXIST);
    /// `ENODEV`
    pub const ENODEV: Errno = Errno(libc::ENODEV);
    /// `EINVAL`
    pub const EINVAL: Errno = Errno(libc::EINVAL);
    /// `EMFILE`
    pub const EMFILE: Errno = Errno(libc::EMFILE);
    /// `ENOTTY`: no ioctl support at all.
    pub const ENOTTY: Errno = Errno(libc::ENOTTY);
    /// `ENOSPC`: e.g. the INVOKE_WRITE probe answer of a real kernel.
    pub const ENOSPC: Errno = Errno(libc::ENOSPC);
    /// `ERANGE`
    pub const ERANGE: Errno = Errno(libc::ERANGE);
    /// `ENOSYS`
    pub const ENOSYS: Errno = Errno(libc::ENOSYS);
    /// `ENODATA`
    pub const ENODATA: Errno = Errno(libc::ENODATA);
    /// `EOVERFLOW`
    pub const EOVERFLOW: Errno = Errno(libc::EOVERFLOW);
    /// `EPROTONOSUPPORT`: this ioctl method is not supported (fall back to write).
    pub const EPROTONOSUPPORT: Errno = Errno(libc::EPROTONOSUPPORT);
    /// `EOPNOTSUPP`
    pub const EOPNOTSUPP: Errno = Errno(libc::EOPNOTSUPP);
    /// `ETIMEDOUT`
    pub const ETIMEDOUT: Errno = Errno(libc::ETIMEDOUT);

    /// The errno of the last failed libc call on this thread.
    pub fn last() -> Errno {
        Errno(
            std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO),
        )
    }

    /// The symbolic name (`"EINVAL"`), if this is a known errno.
    pub fn name(self) -> Option<&'static str> {
        ERRNO_NAMES
            .iter()
            .find(|(v, _)| *v == self.0)
            .map(|(_, n)| *n)
    }
}

/// Names of the errnos a uverbs provider can meet. `EOPNOTSUPP` and `EAGAIN` are aliases
/// of `ENOTSUP`/`EWOULDBLOCK` on Linux and print under the names used by the kernel.
const ERRNO_NAMES: &[(i32, &str)] = &[
    (libc::EPERM, "EPERM"),
    (libc::ENOENT, "ENOENT"),
    (libc::ESRCH, "ESRCH"),
    (libc::EINTR, "EINTR"),
    (libc::EIO, "EIO"),
    (libc::ENXIO, "ENXIO"),
    (libc::E2BIG, "E2BIG"),
    (libc::ENOEXEC, "ENOEXEC"),
    (libc::EBADF, "EBADF"),
    (libc::ECHILD, "ECHILD"),
    (libc::EAGAIN, "EAGAIN"),
    (libc::ENOMEM, "ENOMEM"),
    (libc::EACCES, "EACCES"),
    (libc::EFAULT, "EFAULT"),
    (libc::EBUSY, "EBUSY"),
    (libc::EEXIST, "EEXIST"),
    (libc::EXDEV, "EXDEV"),
    (libc::ENODEV, "ENODEV"),
    (libc::ENOTDIR, "ENOTDIR"),
    (libc::EISDIR, "EISDIR"),
    (libc::EINVAL, "EINVAL"),
    (libc::ENFILE, "ENFILE"),
    (libc::EMFILE, "EMFILE"),
    (libc::ENOTTY, "ENOTTY"),
    (libc::EFBIG, "EFBIG"),
    (libc::ENOSPC, "ENOSPC"),
    (libc::ESPIPE, "ESPIPE"),
    (libc::EROFS, "EROFS"),
    (libc::EPIPE, "EPIPE"),
    (libc::EDOM, "EDOM"),
    (libc::ERANGE, "ERANGE"),
    (libc::EDEADLK, "EDEADLK"),
    (libc::ENOSYS, "ENOSYS"),
    (libc::ENODATA, "ENODATA"),
    (libc::EPROTO, "EPROTO"),
    (libc::EOVERFLOW, "EOVERFLOW"),
    (libc::EMSGSIZE, "EMSGSIZE"),
    (libc::EPROTONOSUPPORT, "EPROTONOSUPPORT"),
    (libc::EOPNOTSUPP, "EOPNOTSUPP"),
    (libc::EAFNOSUPPORT, "EAFNOSUPPORT"),
    (libc::EADDRINUSE, "EADDRINUSE"),
    (libc::ENETDOWN, "ENETDOWN"),
    (libc::ENETUNREACH, "ENETUNREACH"),
    (libc::ECONNRESET, "ECONNRESET"),
    (libc::ENOBUFS, "ENOBUFS"),
    (libc::ETIMEDOUT, "ETIMEDOUT"),
    (libc::ECONNREFUSED, "ECONNREFUSED"),
    (libc::EHOSTUNREACH, "EHOSTUNREACH"),
    (libc::EALREADY, "EALREADY"),
    (libc::EINPROGRESS, "EINPROGRESS"),
    (libc::ECANCELED, "ECANCELED"),
];

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => write!(f, "{name} ({})", self.0),
            None => write!(f, "errno {}", self.0),
        }
    }
}

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for Errno {}

impl From<std::io::Error> for Errno {
    fn from(e: std::io::Error) -> Errno {
        Errno(e.raw_os_error().unwrap_or(libc::EIO))
    }
}

impl From<Errno> for std::io::Error {
    fn from(e: Errno) -> std::io::Error {
        std::io::Error::from_raw_os_error(e.0)
    }
}

/// The operations a provider performs on a uverbs command fd.
///
/// # Safety
///
/// For implementers:
///
/// The driver builds safe abstractions (queue rings, doorbell pages, UAR registers) on what
/// this trait returns, so an implementation must be honest:
///
/// - [`mmap`](UverbsSurface::mmap) returns `Ok(addr)` only if `addr .. addr + len` is a
///   mapping of at least the asked `len` bytes with at least the asked `prot`, page
///   aligned, that nothing else in the process uses, and that stays mapped until it is
///   given back to [`munmap`](UverbsSurface::munmap) or the surface is dropped
///   (whichever comes first). The driver reads and writes it with volatile accesses.
/// - [`write`](UverbsSurface::write) and [`ioctl`](UverbsSurface::ioctl) read and write
///   process memory only where the command buffer names it: the buffer itself (`ioctl`
///   may rewrite its attributes' `flags` and `data`, nothing else of it), and the user
///   pointers embedded in the command (response pointers, `UVERBS_ATTR_*` pointer
///   attributes, queue buffers and doorbell records handed over at create time), each for
///   at most the length the command states for it, as the kernel's
///   `copy_from_user`/`copy_to_user` do. They never retain a reference to the buffer
///   after returning. Memory handed over at create time (queue buffers, doorbell records,
///   registered memory) may be read and written by the device afterwards, as with a real
///   HCA; that is the contract of the object, owned by the driver.
/// - A value returned in `Ok` is what the command produced; errors are positive errnos.
pub unsafe trait UverbsSurface: Send + Sync + std::fmt::Debug {
    /// write(2) of one command buffer (header + payload); responses go through the user pointer
    /// embedded in the command, exactly as with the kernel. Returns bytes accepted.
    ///
    /// # Safety
    /// Every user pointer embedded in `cmd` (the response pointer and, for create commands,
    /// the driver data's queue buffer and doorbell-record addresses) must be valid for the
    /// kernel's reads and writes of the lengths the command declares, and not be aliased by a
    /// live Rust reference while the call runs (the kernel writes through them). The driver
    /// proves this once, in its command layer (`src/uverbs`).
    unsafe fn write(&self, cmd: &[u8]) -> Result<usize, Errno>;
    /// ioctl(fd, RDMA_VERBS_IOCTL, buf): buf = IbUverbsIoctlHdr followed by num_attrs IbUverbsAttr.
    /// The callee may write back attr flags / inline data into buf and through pointers it holds.
    ///
    /// # Safety
    /// As for [`write`](UverbsSurface::write): every pointer attribute (`len > 8` inputs, all
    /// outputs) and every address inside pointed-to driver data must be valid for reads
    /// (inputs) or writes (outputs) of the attribute's `len` bytes and not aliased by a live
    /// Rust reference during the call.
    unsafe fn ioctl(&self, buf: &mut [u8]) -> Result<(), Errno>;
    /// mmap(NULL, len, prot, MAP_SHARED, fd, offset) -> address of the mapping, which the
    /// trait's contract requires to be a real mapping of `len` bytes.
    fn mmap(&self, len: usize, prot: i32, offset: u64) -> Result<NonNull<u8>, Errno>;
    /// Unmaps a mapping made by [`UverbsSurface::mmap`].
    ///
    /// # Safety
    /// `addr`/`len` must be a mapping returned by this surface's mmap, no longer used.
    unsafe fn munmap(&self, addr: NonNull<u8>, len: usize) -> Result<(), Errno>;
    /// A short label for diagnostics: "uverbs0 (/dev/infiniband/uverbs0)" or "mlx5-emu hca0".
    fn describe(&self) -> String;
}

/// The real surface: an open `/dev/infiniband/uverbsN` character device. Closed on drop.
#[derive(Debug)]
pub struct UverbsFd {
    fd: OwnedFd,
    path: PathBuf,
}

impl UverbsFd {
    /// Opens `path` (normally `/dev/infiniband/uverbsN`) with `O_RDWR | O_CLOEXEC`.
    pub fn open(path: &Path) -> Result<UverbsFd, Errno> {
        let c_path =
            CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| Errno::EINVAL)?;
        // SAFETY: `c_path` is a valid NUL-terminated string that outlives the call; open(2)
        // does not retain the pointer.
        let raw = unsafe { libc::open(c_path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if raw < 0 {
            return Err(Errno::last());
        }
        // SAFETY: `raw` is a freshly opened descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        Ok(UverbsFd {
            fd,
            path: path.to_path_buf(),
        })
    }

    /// The device path this fd was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl AsRawFd for UverbsFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

// SAFETY: `mmap` returns the kernel's own MAP_SHARED mapping of `len` bytes, which stays until
// munmap (the kernel keeps it even past close of the fd); `write`/`ioctl` are the kernel's,
// which touches only what the command names, with copy_from_user/copy_to_user.
unsafe impl UverbsSurface for UverbsFd {
    unsafe fn write(&self, cmd: &[u8]) -> Result<usize, Errno> {
        // SAFETY: `cmd` is a live slice of `cmd.len()` readable bytes; the fd is owned by self.
        // The pointers inside the command are valid by this function's contract (and the
        // kernel checks them with copy_to_user anyway).
        let n = unsafe { libc::write(self.fd.as_raw_fd(), cmd.as_ptr().cast(), cmd.len()) };
        if n < 0 {
            return Err(Errno::last());
        }
        Ok(n as usize)
    }

    unsafe fn ioctl(&self, buf: &mut [u8]) -> Result<(), Errno> {
        let hdr_len = size_of::<crate::ioctl::IbUverbsIoctlHdr>();
        if buf.len() < hdr_len {
            return Err(Errno::EINVAL);
        }
        // The kernel reads `hdr.length` bytes from the buffer; never let it read past our slice.
        let declared = usize::from(u16::from_ne_bytes([buf[0], buf[1]]));
        if declared > buf.len() {
            return Err(Errno::EINVAL);
        }
        // SAFETY: `buf` is a live, writable slice at least `hdr.length` bytes long (checked
        // above), which is all the kernel reads or writes through this pointer.
        let rc =
            unsafe { libc::ioctl(self.fd.as_raw_fd(), RDMA_VERBS_IOCTL as _, buf.as_mut_ptr()) };
        if rc < 0 {
            return Err(Errno::last());
        }
        Ok(())
    }

    fn mmap(&self, len: usize, prot: i32, offset: u64) -> Result<NonNull<u8>, Errno> {
        let off = libc::off_t::try_from(offset).map_err(|_| Errno::EINVAL)?;
        // SAFETY: a new MAP_SHARED mapping at a kernel-chosen address cannot alias any
        // existing Rust object; the fd is valid for the duration of the call.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                self.fd.as_raw_fd(),
                off,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(Errno::last());
        }
        NonNull::new(addr.cast::<u8>()).ok_or(Errno::EFAULT)
    }

    // SAFETY: callers uphold the trait's contract: `addr/len` is a mapping returned by
    // `mmap` on this fd and nothing uses it any more (see the block inside).
    unsafe fn munmap(&self, addr: NonNull<u8>, len: usize) -> Result<(), Errno> {
        // SAFETY: the caller guarantees `addr/len` is a mapping from `mmap` above that is no
        // longer referenced.
        let rc = unsafe { libc::munmap(addr.as_ptr().cast(), len) };
        if rc < 0 {
            return Err(Errno::last());
        }
        Ok(())
    }

    fn describe(&self) -> String {
        let name = self
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned());
        format!("{} ({})", name.unwrap_or_default(), self.path.display())
    }
}
