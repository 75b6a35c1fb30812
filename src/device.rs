//! Discovery of devices through sysfs (`/sys/class/infiniband_verbs`, or the tree `SYSFS_PATH`
//! names, as libibverbs reads it), with the ABI version checks libibverbs and libmlx5 make, and
//! opening them.
//!
//! `SYSFS_PATH` is how a program reaches the emulated HCA without code changes: `mlx5 emu run
//! -- ./myapp` preloads the emulator's front door, which writes a sysfs tree for the emulated
//! HCAs and points `SYSFS_PATH` at it; [`devices`] then lists them and [`Device::open`] opens
//! them through the interposed `/dev/infiniband/uverbsN`.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use mlx5_ffi::mlx5::MLX5_IB_UVERBS_ABI_VERSION;
use mlx5_ffi::surface::{UverbsFd, UverbsSurface};
use mlx5_ffi::sysfs;

use crate::context::{Context, ContextConfig};
use crate::error::{Errno, Error, Result};

/// Lowest and highest ib_uverbs ABI versions this driver speaks (class `abi_version`).
pub const UVERBS_ABI_MIN: u32 = 6;
/// Highest supported ib_uverbs ABI version.
pub const UVERBS_ABI_MAX: u32 = 6;

/// A uverbs device found in sysfs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Device {
    /// IB device name (`mlx5_0`).
    pub name: String,
    /// uverbs node name (`uverbs0`).
    pub uverbs: String,
    /// Character device path (`/dev/infiniband/uverbs0`).
    pub dev_path: PathBuf,
    /// Provider ABI version (`abi_version` of the uverbs node).
    pub abi_version: u32,
    /// Node GUID as sysfs prints it.
    pub node_guid: String,
    /// PCI vendor id from the modalias (0x15b3 for Mellanox/NVIDIA), if readable.
    pub vendor_id: Option<u32>,
    /// The device's sysfs directory (`<sysfs root>/class/infiniband/mlx5_0`), where its
    /// port attributes and GID tables are read.
    pub sysfs_dir: PathBuf,
}

/// The sysfs root libibverbs uses: `SYSFS_PATH` when it is set (trailing `/` removed) and the
/// process is not set-user-ID (real and effective user the same), else `/sys`; an empty value
/// or one of only slashes also means `/sys`.
pub fn sysfs_root() -> PathBuf {
    sysfs_root_from(std::env::var_os("SYSFS_PATH").as_deref())
}

fn sysfs_root_from(env: Option<&std::ffi::OsStr>) -> PathBuf {
    let same_user = nix::unistd::getuid() == nix::unistd::geteuid();
    match env {
        Some(v) if same_user => {
            let b = v.as_encoded_bytes();
            let end = b.iter().rposition(|&c| c != b'/').map_or(0, |i| i + 1);
            if end == 0 {
                // Empty or only slashes: libibverbs would look under `/class/...`, which no
                // Linux system has; `/sys` is what such a setting can only have meant.
                PathBuf::from("/sys")
            } else {
                PathBuf::from(std::ffi::OsStr::from_bytes(&b[..end]))
            }
        }
        _ => PathBuf::from("/sys"),
    }
}

fn read_trim(p: &Path) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

/// List mlx5 devices under `sysfs_root` (normally `/sys`).
///
/// # Errors
/// [`Error::AbiVersion`] if the uverbs class ABI is outside 6..=6; [`Error::Os`] if the class
/// directory cannot be read (`ENOENT` when there is no RDMA support at all).
pub fn devices_in(sysfs_root: &Path) -> Result<Vec<Device>> {
    let os_err = |op: &'static str, e: &std::io::Error| Error::Os {
        op,
        errno: Errno::from_raw(e.raw_os_error().unwrap_or(libc::ENOENT)),
    };
    if let Err(e) = sysfs::check_abi_version(sysfs_root) {
        let path = sysfs_root.join("class/infiniband_verbs/abi_version");
        return Err(match read_trim(&path).and_then(|s| s.parse::<u32>().ok()) {
            Some(found) => Error::AbiVersion {
                what: "uverbs",
                found,
                min: UVERBS_ABI_MIN,
                max: UVERBS_ABI_MAX,
            },
            None => os_err("read(<sysfs>/class/infiniband_verbs/abi_version)", &e),
        });
    }
    let list = sysfs::list_uverbs_devices(sysfs_root)
        .map_err(|e| os_err("read_dir(<sysfs>/class/infiniband_verbs)", &e))?;
    let mut out = Vec::new();
    for u in list {
        let ibdir = sysfs_root.join("class/infiniband").join(&u.ibdev);
        let modalias = read_trim(&ibdir.join("device/modalias")).unwrap_or_default();
        let vendor_id = modalias
            .strip_prefix("pci:v")
            .and_then(|s| s.get(..8))
            .and_then(|h| u32::from_str_radix(h, 16).ok());
        if !(u.ibdev.starts_with("mlx5") || vendor_id == Some(0x15b3)) {
            continue;
        }
        out.push(Device {
            node_guid: read_trim(&ibdir.join("node_guid")).unwrap_or_default(),
            name: u.ibdev,
            uverbs: u.name,
            dev_path: u.dev_path,
            abi_version: u.abi_version,
            vendor_id,
            sysfs_dir: ibdir,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// List the mlx5 devices of this machine, under the sysfs root [`sysfs_root`] gives
/// (`SYSFS_PATH` or `/sys`), so a program started with `mlx5 emu run` finds the emulated HCAs.
///
/// # Errors
/// As [`devices_in`].
pub fn devices() -> Result<Vec<Device>> {
    devices_in(&sysfs_root())
}

impl Device {
    /// Check the provider ABI version (libmlx5 accepts exactly 1).
    ///
    /// # Errors
    /// [`Error::AbiVersion`] naming the mlx5 provider ABI.
    pub fn check_abi(&self) -> Result<()> {
        if self.abi_version != MLX5_IB_UVERBS_ABI_VERSION {
            return Err(Error::AbiVersion {
                what: "mlx5 provider",
                found: self.abi_version,
                min: MLX5_IB_UVERBS_ABI_VERSION,
                max: MLX5_IB_UVERBS_ABI_VERSION,
            });
        }
        Ok(())
    }

    /// Open the character device and a context on it (configuration from the libmlx5
    /// environment variables, see [`ContextConfig::from_env`]).
    ///
    /// # Errors
    /// [`Error::AbiVersion`]; [`Error::Os`] naming the open; context errors.
    pub fn open(&self) -> Result<Context> {
        self.open_with(ContextConfig::from_env())
    }

    /// Open with an explicit configuration.
    ///
    /// # Errors
    /// As [`open`](Self::open).
    pub fn open_with(&self, config: ContextConfig) -> Result<Context> {
        self.check_abi()?;
        let fd = UverbsFd::open(&self.dev_path).map_err(|e| Error::Os {
            op: "open(/dev/infiniband/uverbsN)",
            errno: Errno::from_raw(e.0),
        })?;
        let surface: Arc<dyn UverbsSurface> = Arc::new(fd);
        let ctx = Context::open_with(surface, config)?;
        ctx.set_sysfs_dir(self.sysfs_dir.clone());
        Ok(ctx)
    }

    /// Find a device by IB name (`mlx5_0`).
    ///
    /// # Errors
    /// As [`devices`]; [`Error::InvalidArgument`] if there is no such device.
    pub fn by_name(name: &str) -> Result<Device> {
        devices()?
            .into_iter()
            .find(|d| d.name == name)
            .ok_or(Error::InvalidArgument {
                attr: "device name",
                reason: "no such mlx5 device in sysfs",
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_reads_a_fake_sysfs_tree_and_checks_abi() {
        let root = std::env::temp_dir().join(format!("mlx5-sysfs-{}", std::process::id()));
        let v = root.join("class/infiniband_verbs/uverbs0");
        std::fs::create_dir_all(&v).unwrap();
        std::fs::write(root.join("class/infiniband_verbs/abi_version"), "6\n").unwrap();
        std::fs::write(v.join("ibdev"), "mlx5_0\n").unwrap();
        std::fs::write(v.join("abi_version"), "1\n").unwrap();
        let d = root.join("class/infiniband/mlx5_0/device");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("modalias"), "pci:v000015B3d00001017sv\n").unwrap();
        let devs = devices_in(&root).unwrap();
        assert_eq!(devs.len(), 1);
        assert_eq!(devs[0].name, "mlx5_0");
        assert_eq!(devs[0].vendor_id, Some(0x15b3));
        assert!(devs[0].check_abi().is_ok());
        std::fs::write(v.join("abi_version"), "2\n").unwrap();
        let devs = devices_in(&root).unwrap();
        let e = devs[0].check_abi().unwrap_err();
        assert!(e.to_string().contains("mlx5 provider ABI version 2"));
        std::fs::write(root.join("class/infiniband_verbs/abi_version"), "5\n").unwrap();
        assert!(matches!(
            devices_in(&root),
            Err(Error::AbiVersion { found: 5, .. })
        ));
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn sysfs_path_is_read_as_libibverbs_reads_it() {
        use std::ffi::OsStr;
        assert_eq!(sysfs_root_from(None), PathBuf::from("/sys"));
        assert_eq!(
            sysfs_root_from(Some(OsStr::new("/tmp/emu-sysfs///"))),
            PathBuf::from("/tmp/emu-sysfs")
        );
        assert_eq!(
            sysfs_root_from(Some(OsStr::new("/tmp/emu-sysfs"))),
            PathBuf::from("/tmp/emu-sysfs")
        );
        assert_eq!(sysfs_root_from(Some(OsStr::new(""))), PathBuf::from("/sys"));
        assert_eq!(
            sysfs_root_from(Some(OsStr::new("//"))),
            PathBuf::from("/sys")
        );
    }

    #[test]
    fn a_device_found_under_a_root_keeps_its_directory_there() {
        let root = std::env::temp_dir().join(format!("mlx5-sysfs-dir-{}", std::process::id()));
        let v = root.join("class/infiniband_verbs/uverbs0");
        std::fs::create_dir_all(&v).unwrap();
        std::fs::write(root.join("class/infiniband_verbs/abi_version"), "6\n").unwrap();
        std::fs::write(v.join("ibdev"), "mlx5_3\n").unwrap();
        std::fs::write(v.join("abi_version"), "1\n").unwrap();
        std::fs::create_dir_all(root.join("class/infiniband/mlx5_3")).unwrap();
        let devs = devices_in(&root).unwrap();
        assert_eq!(devs[0].sysfs_dir, root.join("class/infiniband/mlx5_3"));
        let _ = std::fs::remove_dir_all(&root);
        let e = devices_in(&root).unwrap_err();
        assert!(e.to_string().contains("ENOENT"), "{e}");
    }
}
