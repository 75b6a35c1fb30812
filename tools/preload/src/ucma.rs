//! The rdma_cm descriptor: `/dev/infiniband/rdma_cm` and `class/misc/rdma_cm` for
//! librdmacm.
//!
//! `open` of the node returns the user end of an emulated rdma_cm file
//! ([`mlx5_emu::Emulator::open_rdma_cm`]): a real eventfd, readable while events are
//! queued, so `poll`/`select`/`epoll` and `fcntl(O_NONBLOCK)` on it need no interception.
//! `write` on it runs the ucma command (`GET_EVENT` blocks as in the kernel), `fstat` reports
//! a character device (librdmacm checks `S_ISCHR`), and `close` destroys the file's ids as
//! the kernel does when the last descriptor goes. The hooks in `hooks.rs` are one line each
//! and call the functions here.

use std::ffi::{c_char, c_int, c_void};
use std::os::fd::IntoRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use mlx5_emu::RdmaCmFile;

use crate::shim::{self, fail, guard};
use crate::user;

/// The device node librdmacm opens (`RDMA_CM_DEV`; the path is hard-coded there too).
pub(crate) const NODE: &[u8] = b"/dev/infiniband/rdma_cm";
/// The misc device number written in sysfs and reported by `fstat`.
const DEV: (u32, u32) = (10, 58);
/// Largest command accepted (the ucma's commands are a few hundred bytes).
const MAX_WRITE: usize = 4096;

/// Open rdma_cm files by descriptor.
static FILES: Mutex<Vec<(c_int, Arc<RdmaCmFile>)>> = Mutex::new(Vec::new());
/// Entries in [`FILES`], so that the `write` of a process without rdma_cm takes no lock.
static COUNT: AtomicUsize = AtomicUsize::new(0);

fn files() -> std::sync::MutexGuard<'static, Vec<(c_int, Arc<RdmaCmFile>)>> {
    FILES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn file(fd: c_int) -> Option<Arc<RdmaCmFile>> {
    if COUNT.load(Ordering::Acquire) == 0 {
        return None;
    }
    files()
        .iter()
        .find(|(f, _)| *f == fd)
        .map(|(_, a)| a.clone())
}

/// `open` hook: the rdma_cm node opens an emulated rdma_cm file.
///
/// # Safety
/// `path` is null or a C string (open(2)'s contract).
pub(crate) unsafe fn open(path: *const c_char, _flags: c_int) -> Option<c_int> {
    // SAFETY: forwarded contract.
    if unsafe { shim::path_bytes(path) } != Some(NODE) {
        return None;
    }
    Some(guard(-1, || match shim::emulator().open_rdma_cm() {
        Ok(o) => {
            let fd = o.fd.into_raw_fd();
            let stale = {
                let mut t = files();
                let stale = t
                    .iter()
                    .position(|(f, _)| *f == fd)
                    .map(|i| t.swap_remove(i));
                t.push((fd, o.file));
                COUNT.store(t.len(), Ordering::Release);
                stale
            };
            drop(stale);
            fd
        }
        Err(e) => fail(e.0),
    }))
}

/// `write` hook: a ucma command on an rdma_cm descriptor.
pub(crate) fn write(fd: c_int, buf: *const c_void, count: usize) -> Option<isize> {
    let f = file(fd)?;
    Some(guard(-1, || {
        if count > MAX_WRITE {
            return fail(libc::EINVAL) as isize;
        }
        let cmd = match user::read(buf as usize, count) {
            Ok(c) => c,
            Err(e) => return fail(e.0) as isize,
        };
        match f.command(&cmd) {
            Ok(n) => n as isize,
            Err(e) => fail(e.0) as isize,
        }
    }))
}

/// `close` hook, before the real close: forget the descriptor. The returned file is
/// dropped by the caller after the real close (dropping destroys the ids).
pub(crate) fn take(fd: c_int) -> Option<Arc<RdmaCmFile>> {
    if COUNT.load(Ordering::Acquire) == 0 {
        return None;
    }
    let mut t = files();
    let i = t.iter().position(|(f, _)| *f == fd)?;
    let (_, f) = t.swap_remove(i);
    COUNT.store(t.len(), Ordering::Release);
    Some(f)
}

/// `fstat` hook, after a successful fstat: an rdma_cm descriptor is a character device.
///
/// # Safety
/// `buf` points to a `struct stat` just filled by a successful fstat.
pub(crate) unsafe fn patch_fstat(fd: c_int, buf: *mut libc::stat) {
    if file(fd).is_some() {
        // SAFETY: valid, writable, initialised by the caller's contract.
        let st = unsafe { &mut *buf };
        st.st_rdev = libc::makedev(DEV.0, DEV.1);
        st.st_mode = (st.st_mode & !libc::S_IFMT) | libc::S_IFCHR;
    }
}

/// The rdma_cm entries of the sysfs tree: `class/misc/rdma_cm/{abi_version,dev}`.
pub(crate) fn write_sysfs(root: &std::path::Path) -> std::io::Result<()> {
    let d = root.join("class/misc/rdma_cm");
    std::fs::create_dir_all(&d)?;
    std::fs::write(
        d.join("abi_version"),
        format!("{}\n", mlx5_ffi::ucma::RDMA_USER_CM_ABI_VERSION),
    )?;
    std::fs::write(d.join("dev"), format!("{}:{}\n", DEV.0, DEV.1))
}
