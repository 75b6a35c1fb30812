//! `UverbsFd` against ordinary character devices (no RDMA device exists here), and sysfs
//! discovery against a fake sysfs tree.

use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use mlx5_ffi::surface::{Errno, UverbsFd, UverbsSurface};
use mlx5_ffi::sysfs::{UverbsDevice, check_abi_version, list_uverbs_devices};

#[test]
fn uverbs_fd_syscalls_reach_the_kernel() {
    let fd = UverbsFd::open(Path::new("/dev/null")).unwrap();
    // SAFETY: the buffer embeds no pointer the kernel follows (/dev/null reads nothing).
    assert_eq!(unsafe { fd.write(&[0u8; 24]) }.unwrap(), 24);
    let mut buf = mlx5_ffi::ioctl::IoctlBuilder::new(0, 0)
        .in_u32(2, 1)
        .build()
        .unwrap();
    // /dev/null has no ioctls: the real kernel answers ENOTTY like a uverbs fd without ioctl.
    // SAFETY: one inline attribute, no pointer.
    assert_eq!(unsafe { fd.ioctl(&mut buf) }, Err(Errno::ENOTTY));
    assert_eq!(fd.mmap(4096, libc::PROT_READ, 0), Err(Errno::ENODEV));
    assert_eq!(fd.describe(), "null (/dev/null)");
    // A header that claims more bytes than the buffer holds never reaches the kernel.
    let mut short = buf[..24].to_vec();
    // SAFETY: refused before any syscall; no pointer is followed.
    assert_eq!(unsafe { fd.ioctl(&mut short) }, Err(Errno::EINVAL));
    // SAFETY: as above.
    assert_eq!(unsafe { fd.ioctl(&mut [0u8; 4]) }, Err(Errno::EINVAL));
}

#[test]
fn uverbs_fd_mmap_and_munmap_roundtrip() {
    // /dev/zero supports MAP_SHARED mappings: exercises the mmap/munmap paths for real.
    let fd = UverbsFd::open(Path::new("/dev/zero")).unwrap();
    let p = fd
        .mmap(4096, libc::PROT_READ | libc::PROT_WRITE, 0)
        .unwrap();
    // SAFETY: p is a fresh 4096-byte read/write mapping owned by this test.
    unsafe { p.as_ptr().write_volatile(0x5a) };
    // SAFETY: as above; the byte was just written.
    let back = unsafe { p.as_ptr().read_volatile() };
    assert_eq!(back, 0x5a);
    // SAFETY: p/4096 is the mapping returned above and is not used afterwards.
    unsafe { fd.munmap(p, 4096) }.unwrap();
}

#[test]
fn uverbs_fd_open_missing_device() {
    let err = UverbsFd::open(Path::new("/dev/infiniband/uverbs-does-not-exist")).unwrap_err();
    assert_eq!(err, Errno::ENOENT);
}

struct TempTree(PathBuf);

impl TempTree {
    fn new(tag: &str) -> TempTree {
        let p = std::env::temp_dir().join(format!("mlx5-ffi-sysfs-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(p.join("class/infiniband_verbs")).unwrap();
        TempTree(p)
    }
    fn put(&self, rel: &str, contents: &str) {
        let path = self.0.join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, contents).unwrap();
    }
}

impl Drop for TempTree {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

#[test]
fn sysfs_lists_uverbs_devices() {
    let t = TempTree::new("list");
    t.put("class/infiniband_verbs/abi_version", "6\n");
    for (n, ibdev, dev) in [
        ("0", "mlx5_0", "231:192"),
        ("10", "mlx5_10", "231:202"),
        ("2", "mlx5_1", "bogus"),
    ] {
        t.put(
            &format!("class/infiniband_verbs/uverbs{n}/ibdev"),
            &format!("{ibdev}\n"),
        );
        t.put(
            &format!("class/infiniband_verbs/uverbs{n}/abi_version"),
            "1\n",
        );
        t.put(
            &format!("class/infiniband_verbs/uverbs{n}/dev"),
            &format!("{dev}\n"),
        );
    }
    t.put("class/infiniband_verbs/uverbs3/abi_version", "1\n"); // no ibdev: skipped
    t.put("class/infiniband_verbs/.hidden/ibdev", "x\n");
    t.put("class/infiniband_verbs/uverbsX/ibdev", "x\n");

    assert_eq!(check_abi_version(&t.0).unwrap(), 6);
    let devs = list_uverbs_devices(&t.0).unwrap();
    let names: Vec<&str> = devs.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["uverbs0", "uverbs2", "uverbs10"]);
    assert_eq!(
        devs[0],
        UverbsDevice {
            name: "uverbs0".into(),
            ibdev: "mlx5_0".into(),
            abi_version: 1,
            devnum: Some((231, 192)),
            dev_path: PathBuf::from("/dev/infiniband/uverbs0"),
            sysfs_path: t.0.join("class/infiniband_verbs/uverbs0"),
        }
    );
    assert_eq!(devs[1].devnum, None, "malformed dev file");
    assert_eq!(devs[2].ibdev, "mlx5_10");
}

#[test]
fn sysfs_abi_version_must_be_6() {
    let t = TempTree::new("abi");
    assert_eq!(
        check_abi_version(&t.0).unwrap_err().kind(),
        ErrorKind::NotFound
    );
    t.put("class/infiniband_verbs/abi_version", "5\n");
    assert_eq!(
        check_abi_version(&t.0).unwrap_err().kind(),
        ErrorKind::Unsupported
    );
    t.put("class/infiniband_verbs/abi_version", "six\n");
    assert_eq!(
        check_abi_version(&t.0).unwrap_err().kind(),
        ErrorKind::InvalidData
    );
    assert!(list_uverbs_devices(&t.0.join("nowhere")).is_err());
}
