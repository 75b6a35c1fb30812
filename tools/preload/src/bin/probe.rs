//! Test helper (not a tool): exercises the interposed libc calls on the emulated device node
//! and prints one `name=result` line each. `tests/rdma_core_tools.rs` runs it under
//! `LD_PRELOAD` and checks every line. It does not link the shim: it must be preloaded.

use std::ffi::{CStr, c_int};

use mlx5_ffi::ioctl::RDMA_VERBS_IOCTL;
use mlx5_ffi::surface::Errno;

const DEV: &CStr = c"/dev/infiniband/uverbs0";

/// "ok" for a non-negative result, else the errno name.
fn res(rc: i64) -> String {
    if rc >= 0 {
        "ok".to_string()
    } else {
        Errno::last().name().unwrap_or("?").to_string()
    }
}

/// "chr 231:192" / "other 1:3" / the errno name of a failed stat.
fn kind(rc: c_int, st: &libc::stat) -> String {
    if rc != 0 {
        return res(rc.into());
    }
    let t = if st.st_mode & libc::S_IFMT == libc::S_IFCHR {
        "chr"
    } else {
        "other"
    };
    format!(
        "{t} {}:{}",
        libc::major(st.st_rdev),
        libc::minor(st.st_rdev)
    )
}

fn fstat(fd: c_int) -> String {
    // SAFETY: all-zero is a valid `struct stat`.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a writable struct stat.
    let rc = unsafe { libc::fstat(fd, &mut st) };
    kind(rc, &st)
}

fn main() {
    // SAFETY: all-zero is a valid `struct stat`.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: DEV is a C string, `st` writable.
    let rc = unsafe { libc::stat(DEV.as_ptr(), &mut st) };
    println!("stat={}", kind(rc, &st));
    // SAFETY: as above.
    let rc = unsafe { libc::fstatat(libc::AT_FDCWD, DEV.as_ptr(), &mut st, 0) };
    println!("fstatat={}", kind(rc, &st));
    // SAFETY: all-zero is a valid `struct statx`.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: DEV is a C string, `stx` writable.
    let rc = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            DEV.as_ptr(),
            0,
            libc::STATX_BASIC_STATS,
            &mut stx,
        )
    };
    println!(
        "statx={} {}:{}",
        res(rc.into()),
        stx.stx_rdev_major,
        stx.stx_rdev_minor
    );
    // SAFETY: DEV is a C string.
    let rc = unsafe { libc::access(DEV.as_ptr(), libc::R_OK | libc::W_OK) };
    println!("access={}", res(rc.into()));
    // SAFETY: a C string; the path does not exist with one HCA.
    let rc = unsafe { libc::stat(c"/dev/infiniband/uverbs1".as_ptr(), &mut st) };
    println!("uverbs1={}", kind(rc, &st));

    // SAFETY: DEV is a C string.
    let fd = unsafe { libc::open(DEV.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    println!("open={}", res(fd.into()));
    println!("fstat={}", fstat(fd));
    // SAFETY: empty path with AT_EMPTY_PATH stats `fd` itself.
    let rc = unsafe { libc::fstatat(fd, c"".as_ptr(), &mut st, libc::AT_EMPTY_PATH) };
    println!("fstatat_empty={}", kind(rc, &st));

    let short = [0u8; 4];
    // SAFETY: `short` is 4 readable bytes.
    let rc = unsafe { libc::write(fd, short.as_ptr().cast(), short.len()) };
    println!("short_write={}", res(rc as i64));
    // SAFETY: deliberately bad pointer: the shim must answer EFAULT, not fault.
    let rc = unsafe { libc::write(fd, 8 as *const libc::c_void, 24) };
    println!("bad_pointer_write={}", res(rc as i64));
    let mut n: c_int = 0;
    // SAFETY: FIONREAD writes one int.
    let rc = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) };
    println!("other_ioctl={}", res(rc.into()));
    // SAFETY: deliberately bad pointer: the shim must answer EFAULT, not fault.
    let rc = unsafe { libc::ioctl(fd, RDMA_VERBS_IOCTL.into(), 8usize) };
    println!("bad_pointer_ioctl={}", res(rc.into()));
    // SAFETY: a private mapping of the device is refused; nothing is mapped.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_WRITE,
            libc::MAP_PRIVATE,
            fd,
            0,
        )
    };
    println!(
        "private_mmap={}",
        if p == libc::MAP_FAILED {
            res(-1)
        } else {
            "mapped".into()
        }
    );

    // Copies of the descriptor are the device too; closing them one by one.
    // SAFETY: plain descriptor calls on our own descriptors.
    let d1 = unsafe { libc::dup(fd) };
    // SAFETY: as above.
    let d2 = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 100) };
    // SAFETY: as above.
    let d3 = unsafe { libc::dup2(fd, 200) };
    // SAFETY: as above.
    let d4 = unsafe { libc::dup3(fd, 201, libc::O_CLOEXEC) };
    println!(
        "dup={} fcntl_dupfd={} dup2={} dup3={}",
        fstat(d1),
        fstat(d2),
        fstat(d3),
        fstat(d4)
    );
    // SAFETY: closes only our descriptors 200 and 201.
    let rc = unsafe { libc::close_range(200, 201, 0) };
    println!("close_range={} after={}", res(rc.into()), fstat(200));
    // SAFETY: our descriptors.
    unsafe { libc::close(d1) };
    // SAFETY: our descriptor.
    unsafe { libc::close(d2) };
    // SAFETY: our descriptor.
    unsafe { libc::close(fd) };
    // The number is free again: a plain file that gets it is not the device. (Device
    // descriptors live high, in the range whose mmap system calls are trapped, so the plain
    // file is moved to that number.)
    // SAFETY: a C string.
    let plain = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) };
    // SAFETY: F_DUPFD of our own descriptor; no pointers.
    let other = unsafe { libc::fcntl(plain, libc::F_DUPFD, fd) };
    println!("reused_same_number={} reused={}", other == fd, fstat(other));

    // SAFETY: socket creation with constant arguments.
    let s = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW, 20) };
    println!("netlink_rdma={}", res(s.into()));
    // SAFETY: as above.
    let s = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW, libc::NETLINK_ROUTE) };
    println!("netlink_route={}", res(s.into()));
}
