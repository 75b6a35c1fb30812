//! Process-wide state of the shim and the device operations behind the interposers.
//!
//! * The configuration is read from the environment once ([`config`]).
//! * The library constructor ([`init`]) only chooses a private temporary directory for the
//!   fake sysfs tree and points `SYSFS_PATH` at it, before `main` (libibverbs reads it on
//!   the first `ibv_get_device_list`).
//! * The first time the program touches a path inside that directory ([`touch`], called by
//!   every path-taking hook), the emulator starts (threaded, so the device makes progress
//!   by itself; with the UDP fabric it now owns its address, hence its LID and GUID) and the
//!   tree is written from its identity. A program that never looks (a shell, `timeout`)
//!   starts nothing. The destructor ([`fini`]) removes the tree.

use std::cell::Cell;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, Ordering};

use mlx5_emu::{Emulator, Errno};
use mlx5_ffi::ioctl::{
    IbUverbsAttr, IbUverbsIoctlHdr, RDMA_VERBS_IOCTL, UVERBS_ATTR_WRITE_CMD, UVERBS_OBJECT_DEVICE,
};
use zerocopy::FromBytes;

use crate::config::Config;
use crate::real;
use crate::registry::{DevFile, Registry};
use crate::sysfs;
use crate::user;
use crate::verbs;

/// The descriptors and mappings that belong to the emulator.
pub(crate) static REGISTRY: Registry = Registry::new();

static CONFIG: OnceLock<Config> = OnceLock::new();
static EMULATOR: OnceLock<Emulator> = OnceLock::new();
/// Name of a sysfs tree directory in the temporary directory, before the owner's pid.
const TREE_PREFIX: &str = "mlx5-emu-sysfs.";
/// File in the root of a tree kept with `MLX5_EMU_KEEP_SYSFS` (not cleaned up as stale).
const KEEP_MARKER: &str = "KEEP";

/// The private sysfs tree.
static SYSFS_TREE: OnceLock<Tree> = OnceLock::new();
/// [`TREE_NEW`], [`TREE_WRITING`] or [`TREE_READY`].
static TREE_STATE: AtomicU8 = AtomicU8::new(TREE_NEW);
const TREE_NEW: u8 = 0;
const TREE_WRITING: u8 = 1;
const TREE_READY: u8 = 2;

thread_local! {
    /// Set while this thread writes the tree.
    static WRITING_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// Where the sysfs tree lives.
#[derive(Debug)]
struct Tree {
    root: PathBuf,
    /// `root` as bytes, to recognise paths inside it.
    prefix: Vec<u8>,
    /// The process that owns it (a forked child must not delete it).
    pid: u32,
}

/// What an intercepted device open is backed by: a real descriptor of the null device, so
/// that `close`, `dup`, `O_CLOEXEC` and `fcntl` behave natively. `stat`/`fstat` report it with
/// the uverbs device number.
pub(crate) const BACKING_NODE: &CStr = c"/dev/null";

/// Largest command accepted through `write` (the kernel's commands are far smaller).
const MAX_WRITE: usize = 1 << 20;

/// The configuration (parsed on first use; rejected values are reported once).
pub(crate) fn config() -> &'static Config {
    CONFIG.get_or_init(|| {
        let (cfg, warnings) = Config::parse(|k| std::env::var(k).ok());
        for w in warnings {
            log(&w);
        }
        cfg
    })
}

/// The emulator (started together with the sysfs tree, whose identity it fixes).
pub(crate) fn emulator() -> &'static Emulator {
    ensure_started();
    EMULATOR.get_or_init(new_emulator)
}

/// Build the process's emulator from the configuration.
fn new_emulator() -> Emulator {
    let cfg = config();
    let emu = match Emulator::try_new(cfg.emu.clone()) {
        Ok(emu) => emu,
        Err(e) => {
            // MLX5_EMU_PCAP names a file that cannot be written: a capture asked for and not
            // made must not pass for a run that captured nothing.
            log(&format!("MLX5_EMU_PCAP: {e}; exiting"));
            // SAFETY: _exit ends the process at once; it has no preconditions.
            unsafe { libc::_exit(1) }
        }
    };
    if let Some(path) = &cfg.wqe_log {
        if let Err(e) = emu.log_wqes_to(path) {
            log(&format!(
                "MLX5_EMU_WQE_LOG: cannot log WQEs to {}: {e}",
                path.display()
            ));
        }
    }
    emu
}

/// One line on stderr through the real `write` (never through std's stderr lock, which a
/// hooked `write` may be holding).
pub(crate) fn log(msg: &str) {
    let line = format!("mlx5-emu-preload: {msg}\n");
    if let Some(w) = real::write() {
        // SAFETY: `line` is a valid buffer of `line.len()` bytes for the call's duration.
        let _ = unsafe { w(2, line.as_ptr().cast(), line.len()) };
    }
}

fn trace(msg: impl FnOnce() -> String) {
    if config().trace {
        log(&msg());
    }
}

/// Set the thread's `errno`.
pub(crate) fn set_errno(e: i32) {
    // SAFETY: __errno_location has no preconditions and returns this thread's errno slot.
    let slot = unsafe { libc::__errno_location() };
    // SAFETY: the slot is valid and writable for the life of the thread.
    unsafe { *slot = e };
}

/// Fail with `e`: set errno, return -1.
pub(crate) fn fail(e: i32) -> c_int {
    set_errno(e);
    -1
}

/// Run `f`; if it panics (an emulator bug), fail with `EIO` instead of unwinding into C.
pub(crate) fn guard<T>(failed: T, f: impl FnOnce() -> T) -> T {
    std::panic::catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        set_errno(libc::EIO);
        failed
    })
}

/// The bytes of a C path, or `None` for a null pointer.
///
/// # Safety
/// `path` is null or points to a NUL-terminated string that stays valid for `'a`.
pub(crate) unsafe fn path_bytes<'a>(path: *const c_char) -> Option<&'a [u8]> {
    if path.is_null() {
        return None;
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    Some(unsafe { CStr::from_ptr(path) }.to_bytes())
}

/// If `path` names one of our device nodes, its HCA index.
///
/// # Safety
/// As [`path_bytes`].
pub(crate) unsafe fn device_of_path(path: *const c_char) -> Option<usize> {
    // SAFETY: forwarded contract.
    let bytes = unsafe { path_bytes(path) }?;
    touch(bytes);
    sysfs::device_index(bytes, config().emu.num_hcas)
}

/// For the `stat` family: the path to really stat (the backing node for our device nodes)
/// and the HCA whose device number must be patched in afterwards.
///
/// # Safety
/// As [`path_bytes`].
pub(crate) unsafe fn substitute(path: *const c_char) -> (*const c_char, Option<usize>) {
    // SAFETY: forwarded contract.
    match unsafe { device_of_path(path) } {
        Some(hca) => (BACKING_NODE.as_ptr(), Some(hca)),
        None => (path, None),
    }
}

/// Give a `struct stat` the identity of `uverbs<hca>`: a character device with the number
/// written in sysfs `uverbs<hca>/dev` (libibverbs compares the two).
///
/// # Safety
/// `buf` points to a `struct stat` just filled by a successful stat call.
pub(crate) unsafe fn patch_stat(buf: *mut libc::stat, hca: usize) {
    let (major, minor) = sysfs::uverbs_dev(hca);
    // SAFETY: valid, writable, initialised struct by the caller's contract.
    let st = unsafe { &mut *buf };
    st.st_rdev = libc::makedev(major, minor);
    st.st_mode = (st.st_mode & !libc::S_IFMT) | libc::S_IFCHR;
}

/// `statx` flavour of [`patch_stat`].
///
/// # Safety
/// `buf` points to a `struct statx` just filled by a successful statx call.
pub(crate) unsafe fn patch_statx(buf: *mut libc::statx, hca: usize) {
    let (major, minor) = sysfs::uverbs_dev(hca);
    // SAFETY: valid, writable, initialised struct by the caller's contract.
    let st = unsafe { &mut *buf };
    st.stx_rdev_major = major;
    st.stx_rdev_minor = minor;
}

/// `open` of `/dev/infiniband/uverbs<hca>`: a new emulator file behind a real descriptor.
pub(crate) fn open_device(hca: usize, flags: c_int) -> c_int {
    guard(-1, || {
        let surface = match emulator().open(hca) {
            Ok(s) => s,
            Err(e) => {
                trace(|| format!("open uverbs{hca} -> {e}"));
                return fail(e.0);
            }
        };
        let Some(openat) = real::openat() else {
            return fail(libc::ENOSYS);
        };
        let backing_flags = libc::O_RDWR | (flags & libc::O_CLOEXEC);
        // SAFETY: BACKING_NODE is a NUL-terminated path; no O_CREAT, so the mode is unused.
        let fd = unsafe { openat(libc::AT_FDCWD, BACKING_NODE.as_ptr(), backing_flags, 0) };
        if fd < 0 {
            return -1;
        }
        // Into the range whose mmap system calls are trapped (crate::trap).
        let fd = crate::trap::place(fd, flags & libc::O_CLOEXEC != 0);
        drop(REGISTRY.insert_fd(fd, DevFile { hca, surface }));
        trace(|| format!("open uverbs{hca} -> fd {fd}"));
        fd
    })
}

/// `write` of a uverbs command on one of our descriptors.
pub(crate) fn device_write(fd: c_int, file: &DevFile, buf: *const c_void, count: usize) -> isize {
    guard(-1, || {
        if count > MAX_WRITE {
            return fail(libc::EINVAL) as isize;
        }
        let cmd = match user::read(buf as usize, count) {
            Ok(c) => c,
            Err(e) => return fail(e.0) as isize,
        };
        // SAFETY: the preload forwards the C program's write(2) as the kernel would receive it;
        // the embedded pointers are the program's own, and the emulated kernel behind this
        // surface reaches them only through its fault-catching user-memory copies (EFAULT,
        // never a crash), exactly what the kernel's copy_to_user gives that program.
        let res = unsafe { file.surface.write(&cmd) };
        trace(|| {
            let op = cmd
                .get(..4)
                .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
            format!(
                "write fd {fd} (uverbs{}) {} {count} B -> {}",
                file.hca,
                verbs::write_cmd(op),
                result(&res)
            )
        });
        match res {
            Ok(n) => n as isize,
            Err(e) => fail(e.0) as isize,
        }
    })
}

/// `ioctl` on one of our descriptors: `RDMA_VERBS_IOCTL` goes to the emulator, anything
/// else is not a uverbs request (`ENOTTY`, as from the kernel).
pub(crate) fn device_ioctl(
    fd: c_int,
    file: &DevFile,
    request: std::ffi::c_ulong,
    arg: *mut c_void,
) -> c_int {
    guard(-1, || {
        // The kernel compares the request as a 32-bit `unsigned int`.
        if request as u32 != RDMA_VERBS_IOCTL {
            trace(|| format!("ioctl fd {fd} request {request:#x} -> ENOTTY"));
            return fail(libc::ENOTTY);
        }
        let hdr_len = size_of::<IbUverbsIoctlHdr>();
        let hdr = match user::read(arg as usize, hdr_len) {
            Ok(h) => h,
            Err(e) => return fail(e.0),
        };
        let Ok(h) = IbUverbsIoctlHdr::read_from_bytes(&hdr) else {
            return fail(libc::EINVAL);
        };
        let len = usize::from(h.length);
        if len < hdr_len {
            return fail(libc::EINVAL);
        }
        let mut buf = match user::read(arg as usize, len) {
            Ok(b) => b,
            Err(e) => return fail(e.0),
        };
        // SAFETY: as for `device_write`: the C program's own ioctl, its pointers reached only
        // through the emulated kernel's fault-catching user-memory copies.
        let res = unsafe { file.surface.ioctl(&mut buf) };
        // Attribute flags and inline outputs are written back whatever the outcome, as the
        // kernel updates them in user memory while it processes the call.
        let back = user::write(arg as usize, &buf);
        trace(|| {
            format!(
                "ioctl fd {fd} (uverbs{}) {} attrs {} -> {}",
                file.hca,
                describe_method(&h, &buf),
                h.num_attrs,
                result(&res)
            )
        });
        match (res, back) {
            (Ok(()), Ok(())) => 0,
            (Err(e), _) | (Ok(()), Err(e)) => fail(e.0),
        }
    })
}

/// `close` of one of our descriptors: drop our reference to the emulated file (the file
/// itself goes when its last descriptor and mapping are gone).
pub(crate) fn closed(fd: c_int, file: DevFile, rc: c_int) {
    trace(|| format!("close fd {fd} (uverbs{}) -> {rc}", file.hca));
    guard((), || drop(file));
}

/// `mmap` of one of our descriptors (UAR and clock pages).
pub(crate) fn device_mmap(
    fd: c_int,
    file: &DevFile,
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    offset: i64,
) -> *mut c_void {
    guard(libc::MAP_FAILED, || {
        // The uverbs driver maps device pages shared only, wherever the kernel chooses.
        let shared = flags & libc::MAP_SHARED != 0;
        let fixed = flags & (libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE) != 0;
        if !shared || fixed || len == 0 || offset < 0 {
            trace(|| format!("mmap fd {fd} addr {addr:?} flags {flags:#x} -> EINVAL"));
            set_errno(libc::EINVAL);
            return libc::MAP_FAILED;
        }
        let res = file.surface.mmap(len, prot, offset as u64);
        trace(|| {
            format!(
                "mmap fd {fd} (uverbs{}) len {len} offset {offset:#x} -> {}",
                file.hca,
                result(&res)
            )
        });
        match res {
            Ok(p) => {
                REGISTRY.insert_map(p.as_ptr() as usize, len, file.clone());
                p.as_ptr().cast()
            }
            Err(e) => {
                set_errno(e.0);
                libc::MAP_FAILED
            }
        }
    })
}

/// `munmap` of a mapping the emulator made.
pub(crate) fn device_munmap(file: &DevFile, addr: NonNull<c_void>, len: usize) -> c_int {
    guard(-1, || {
        // SAFETY: `addr` starts a mapping returned by this surface's mmap (it was in the
        // registry), and the program gives it up by calling munmap.
        let res = unsafe { file.surface.munmap(addr.cast(), len) };
        trace(|| {
            format!(
                "munmap {addr:?} len {len} (uverbs{}) -> {}",
                file.hca,
                result(&res)
            )
        });
        match res {
            Ok(()) => 0,
            Err(e) => fail(e.0),
        }
    })
}

/// Trace helper: the verb of an ioctl call (see [`verbs::ioctl_method`]).
fn describe_method(h: &IbUverbsIoctlHdr, buf: &[u8]) -> String {
    let attrs = buf.get(size_of::<IbUverbsIoctlHdr>()..).unwrap_or_default();
    let write_cmd = attrs
        .chunks_exact(size_of::<IbUverbsAttr>())
        .filter_map(|a| IbUverbsAttr::read_from_bytes(a).ok())
        .find(|a| a.attr_id == UVERBS_ATTR_WRITE_CMD)
        .map(|a| a.data);
    let write_cmd = write_cmd.filter(|_| h.object_id == UVERBS_OBJECT_DEVICE);
    verbs::ioctl_method(h.object_id, h.method_id, write_cmd)
}

/// Trace helper: "ok" or the errno name.
fn result<T: std::fmt::Debug>(r: &Result<T, Errno>) -> String {
    match r {
        Ok(v) => format!("ok {v:?}"),
        Err(e) => e.to_string(),
    }
}

/// Library constructor body: choose the private sysfs root and point `SYSFS_PATH` at it.
/// Nothing is written and no emulator exists yet: a program that never looks at the tree
/// (a shell, `timeout`, ...) costs nothing.
pub(crate) fn init() {
    guard((), || {
        let pid = std::process::id();
        let root = std::env::temp_dir().join(format!("{TREE_PREFIX}{pid}"));
        let prefix = root.as_os_str().as_encoded_bytes().to_vec();
        // SAFETY: the constructor runs before main, while the process is single-threaded,
        // so no other thread reads the environment concurrently.
        unsafe { std::env::set_var("SYSFS_PATH", &root) };
        let _ = SYSFS_TREE.set(Tree { root, prefix, pid });
        crate::trap::inherited();
    });
}

/// Remove trees left by processes that died without running their destructor (killed),
/// except those kept on purpose (`MLX5_EMU_KEEP_SYSFS`), and a leftover of an earlier
/// process with our pid.
fn remove_stale_trees(tree: &Tree) {
    let _ = std::fs::remove_dir_all(&tree.root);
    let Some(dir) = tree.root.parent() else {
        return;
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let pid = name
            .to_str()
            .and_then(|n| n.strip_prefix(TREE_PREFIX))
            .and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid {
            let kept = entry.path().join(KEEP_MARKER).exists();
            if !kept && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
}

/// Library destructor body: remove the sysfs tree (only in the process that wrote it).
pub(crate) fn fini() {
    guard((), || {
        if let Some(tree) = SYSFS_TREE.get() {
            let written = TREE_STATE.load(Ordering::Acquire) != TREE_NEW;
            if written && tree.pid == std::process::id() && !config().keep_sysfs {
                let _ = std::fs::remove_dir_all(&tree.root);
            } else if written && tree.pid == std::process::id() {
                // Kept: the counters as they are at exit.
                if let Some(emu) = EMULATOR.get() {
                    let _ = crate::counters::write_final(&tree.root, emu);
                }
            }
        }
    });
}

/// A path the program is about to use: if it lies in the sysfs tree, the tree (and the
/// emulator whose identity it shows) must exist first.
pub(crate) fn touch(path: &[u8]) {
    if TREE_STATE.load(Ordering::Acquire) == TREE_READY {
        return;
    }
    if SYSFS_TREE
        .get()
        .is_some_and(|t| path.starts_with(&t.prefix))
    {
        ensure_started();
    }
}

/// Start the emulator and write the sysfs tree from its identity, exactly once. Other
/// threads wait; the writing thread's own file calls (which come back through the hooks)
/// pass straight through.
fn ensure_started() {
    if WRITING_THREAD.try_with(Cell::get).unwrap_or(true) {
        return;
    }
    match TREE_STATE.compare_exchange(TREE_NEW, TREE_WRITING, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {
            let _ = WRITING_THREAD.try_with(|w| w.set(true));
            guard((), write_tree);
            let _ = WRITING_THREAD.try_with(|w| w.set(false));
            TREE_STATE.store(TREE_READY, Ordering::Release);
        }
        Err(_) => {
            while TREE_STATE.load(Ordering::Acquire) != TREE_READY {
                std::thread::yield_now();
            }
        }
    }
}

fn write_tree() {
    let emu = EMULATOR.get_or_init(new_emulator);
    let hcas: Vec<_> = (0..emu.num_hcas())
        .filter_map(|i| emu.hca_info(i))
        .collect();
    let Some(tree) = SYSFS_TREE.get() else { return };
    remove_stale_trees(tree);
    let res = std::fs::create_dir(&tree.root)
        .and_then(|()| sysfs::write_tree(&tree.root, &hcas))
        .and_then(|()| crate::ucma::write_sysfs(&tree.root))
        .and_then(|()| crate::counters::write_all(&tree.root, emu))
        .and_then(|()| match config().keep_sysfs {
            true => std::fs::write(tree.root.join(KEEP_MARKER), "MLX5_EMU_KEEP_SYSFS\n"),
            false => Ok(()),
        });
    if let Err(e) = res {
        log(&format!(
            "cannot write the sysfs tree in {}: {e}",
            tree.root.display()
        ));
        let _ = std::fs::remove_dir_all(&tree.root);
        return;
    }
    crate::counters::start_refresher(tree.root.clone(), emu);
    trace(|| {
        let lids: Vec<u16> = hcas.iter().map(|h| h.lid).collect();
        format!(
            "sysfs tree {} ({} HCA(s), LIDs {lids:?}, {:?}, {:?} fabric)",
            tree.root.display(),
            hcas.len(),
            config().emu.flavour,
            config().emu.fabric
        )
    });
}
