//! Discovery of real uverbs devices through sysfs.
//!
//! Layout (root is normally `/sys`):
//! `class/infiniband_verbs/abi_version` (must be 6),
//! `class/infiniband_verbs/uverbsN/{ibdev,abi_version,dev}` and the device node
//! `/dev/infiniband/uverbsN`.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::uverbs::IB_USER_VERBS_ABI_VERSION;

/// Directory of the device nodes.
pub const DEV_DIR: &str = "/dev/infiniband";

/// One `uverbsN` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UverbsDevice {
    /// `uverbsN`.
    pub name: String,
    /// The RDMA device name (`mlx5_0`), from `ibdev`.
    pub ibdev: String,
    /// Provider ABI version, from `abi_version` (mlx5: 1).
    pub abi_version: u32,
    /// `(major, minor)` from `dev`, if present and well formed.
    pub devnum: Option<(u32, u32)>,
    /// `/dev/infiniband/uverbsN`.
    pub dev_path: PathBuf,
    /// The sysfs directory of the entry.
    pub sysfs_path: PathBuf,
}

fn read_trimmed(path: &Path) -> io::Result<String> {
    Ok(fs::read_to_string(path)?.trim().to_owned())
}

fn parse_u32(path: &Path) -> io::Result<u32> {
    let s = read_trimmed(path)?;
    s.parse().map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: not a number: {s:?}", path.display()),
        )
    })
}

fn parse_devnum(s: &str) -> Option<(u32, u32)> {
    let (maj, min) = s.split_once(':')?;
    Some((maj.parse().ok()?, min.parse().ok()?))
}

/// Reads `class/infiniband_verbs/abi_version` under `root` and checks it is the uverbs ABI
/// version this crate speaks (6). Returns the version read.
pub fn check_abi_version(root: &Path) -> io::Result<u32> {
    let v = parse_u32(&root.join("class/infiniband_verbs/abi_version"))?;
    if v != IB_USER_VERBS_ABI_VERSION {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("uverbs ABI version {v}, need {IB_USER_VERBS_ABI_VERSION}"),
        ));
    }
    Ok(v)
}

/// Lists the `uverbsN` entries under `root/class/infiniband_verbs`, sorted by N.
/// Entries missing `ibdev` or `abi_version` are skipped (as libibverbs does).
pub fn list_uverbs_devices(root: &Path) -> io::Result<Vec<UverbsDevice>> {
    let class = root.join("class/infiniband_verbs");
    let mut out = Vec::new();
    for entry in fs::read_dir(&class)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(num) = name.strip_prefix("uverbs") else {
            continue;
        };
        if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let dir = entry.path();
        let (Ok(ibdev), Ok(abi_version)) = (
            read_trimmed(&dir.join("ibdev")),
            parse_u32(&dir.join("abi_version")),
        ) else {
            continue;
        };
        let devnum = read_trimmed(&dir.join("dev"))
            .ok()
            .and_then(|s| parse_devnum(&s));
        out.push(UverbsDevice {
            dev_path: Path::new(DEV_DIR).join(&name),
            name,
            ibdev,
            abi_version,
            devnum,
            sysfs_path: dir,
        });
    }
    out.sort_by_key(|d| d.name[6..].parse::<u32>().unwrap_or(u32::MAX));
    Ok(out)
}
