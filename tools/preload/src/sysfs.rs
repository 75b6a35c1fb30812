//! The fake sysfs tree libibverbs enumerates when `SYSFS_PATH` points at it.
//!
//! What rdma-core 44 reads (measured, see the reference on rdma-core over the emulator):
//! `class/infiniband_verbs/abi_version` (6), `class/infiniband_verbs/uverbsN/{ibdev,dev,
//! abi_version}` (`dev` must equal the `st_rdev` of the opened character device, mlx5 wants
//! provider ABI 1), `class/infiniband/<ibdev>` (must exist), its `node_type` ("1: CA"),
//! `node_guid`, `board_id`, `device/modalias` (how the mlx5 provider is matched: PCI vendor
//! 0x15b3 and a ConnectX device id), and, where the ioctl GID query is unavailable,
//! `ports/1/{gids,gid_attrs/types}/I` for every I below the GID table length, and
//! `ports/1/pkeys/I`. The rest (`fw_ver`, port `state`, `lid`, ...) is written for tools and
//! people that look, with the values the emulated kernel reports. On a RoCE port
//! (`MLX5_EMU_LINK_LAYER=eth`) `link_layer` is "Ethernet", `lid`/`sm_lid` are 0, the GID
//! table holds the RoCE v1/v2 entries ("IB/RoCE v1" / "RoCE v2" in `gid_attrs/types/I`)
//! for all 255 indexes the port reports, and `gid_attrs/ndevs/I` names the netdev of each
//! valid entry.
//!
//! The layout is the kernel's: every object lives under its PCI function
//! (`devices/pci0000:00/<bdf>/{infiniband/<ibdev>, infiniband_verbs/uverbsN, net/<ifname>}`)
//! and the class directories hold relative symlinks into it (`docs/emulator-preload.md`).

use std::fmt::Write as _;
use std::fs;
use std::io;
use std::path::Path;

use mlx5_emu::HcaInfo;

/// Major number of the uverbs character devices (as on Linux).
pub(crate) const UVERBS_MAJOR: u32 = 231;
/// Minor number of `uverbs0`; `uverbsN` is this plus N.
pub(crate) const UVERBS_BASE_MINOR: u32 = 192;
/// `class/infiniband_verbs/abi_version`: the uverbs command ABI.
const UVERBS_ABI_VERSION: u32 = 6;
/// `uverbsN/abi_version`: the mlx5 provider ABI.
const MLX5_ABI_VERSION: u32 = 1;
/// PCI vendor id of Mellanox/NVIDIA networking.
pub(crate) const PCI_VENDOR_MELLANOX: u32 = 0x15b3;
/// GID and P_Key entries written per port. libibverbs walks `0..gid_tbl_len` in the sysfs
/// fallback and fails on a missing entry, so write at least the table length the emulated
/// kernel reports; unused entries hold the zero GID, as on a real port.
const TABLE_ENTRIES: usize = 128;

/// Device number of `uverbs<index>`.
pub(crate) fn uverbs_dev(index: usize) -> (u32, u32) {
    (UVERBS_MAJOR, UVERBS_BASE_MINOR + index as u32)
}

/// Directory of the uverbs device nodes (hard-coded in libibverbs, not under `SYSFS_PATH`).
pub(crate) const DEV_PREFIX: &[u8] = b"/dev/infiniband/uverbs";

/// If `path` is `/dev/infiniband/uverbs<N>` with `N < num_hcas` (canonical decimal), `N`.
pub(crate) fn device_index(path: &[u8], num_hcas: usize) -> Option<usize> {
    let digits = path.strip_prefix(DEV_PREFIX)?;
    if digits.is_empty() || digits.len() > 3 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    if digits.len() > 1 && digits[0] == b'0' {
        return None;
    }
    let n = digits
        .iter()
        .fold(0usize, |n, d| n * 10 + usize::from(d - b'0'));
    (n < num_hcas).then_some(n)
}

/// `0002:c903:00ab:cd00`: a GUID as sysfs prints it.
pub(crate) fn guid_string(guid: u64) -> String {
    let b = guid.to_be_bytes();
    format_groups(&b)
}

/// `fe80:0000:...`: a GID as sysfs prints it (8 groups of 4 hex digits).
pub(crate) fn gid_string(gid: &[u8; 16]) -> String {
    format_groups(gid)
}

fn format_groups(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 5 / 2);
    for (i, pair) in bytes.chunks(2).enumerate() {
        if i > 0 {
            s.push(':');
        }
        for b in pair {
            let _ = write!(s, "{b:02x}");
        }
    }
    s
}

/// The PCI function the HCA pretends to be: `0000:08:00.<index>`.
pub(crate) fn pci_name(index: usize) -> String {
    format!("0000:08:00.{index}")
}

/// Where the PCI functions live, relative to the sysfs root.
pub(crate) const PCI_BUS_DIR: &str = "devices/pci0000:00";

fn put(path: &Path, content: &str) -> io::Result<()> {
    fs::write(path, format!("{content}\n"))
}

/// A relative symlink `link` -> `target` (as sysfs makes them).
fn link(target: &str, link: &Path) -> io::Result<()> {
    std::os::unix::fs::symlink(target, link)
}

/// Writers of further parts of the tree, run after the HCAs' own, each with the root and
/// the HCAs (one line per addition: a device node's class entry, ...).
type Extra = fn(&Path, &[HcaInfo]) -> io::Result<()>;
const EXTRAS: &[Extra] = &[];

/// Write the whole tree for `hcas` (HCA i is `uverbs<i>` / `hcas[i].name`) under `root`,
/// which must exist and be empty. Laid out as the kernel lays it: every object lives under
/// its PCI function (`devices/pci0000:00/<bdf>/{infiniband/<ibdev>, infiniband_verbs/
/// uverbs<i>, net/<ifname>}`), and the class directories hold symlinks to them, so that
/// `realpath(class/infiniband/<ibdev>)` two levels up is the PCI function (where UCX reads
/// the vendor and device ids).
pub(crate) fn write_tree(root: &Path, hcas: &[HcaInfo]) -> io::Result<()> {
    let verbs = root.join("class/infiniband_verbs");
    let ib_class = root.join("class/infiniband");
    fs::create_dir_all(&verbs)?;
    fs::create_dir_all(&ib_class)?;
    put(&verbs.join("abi_version"), &UVERBS_ABI_VERSION.to_string())?;
    let cpus = possible_cpus();
    for (i, hca) in hcas.iter().enumerate() {
        let bdf = pci_name(i);
        let pci = root.join(PCI_BUS_DIR).join(&bdf);
        write_pci_function(&pci, &bdf, hca, cpus)?;

        let ib = pci.join("infiniband").join(&hca.name);
        fs::create_dir_all(&ib)?;
        link(&format!("../../../{bdf}"), &ib.join("device"))?;
        put(&ib.join("node_type"), "1: CA")?;
        put(&ib.join("node_guid"), &guid_string(hca.node_guid))?;
        put(&ib.join("sys_image_guid"), &guid_string(hca.sys_image_guid))?;
        put(&ib.join("fw_ver"), &hca.fw_ver)?;
        put(&ib.join("hw_rev"), "0x0")?;
        put(&ib.join("hca_type"), &format!("MT{}", hca.vendor_part_id))?;
        put(&ib.join("board_id"), "MT_0000000008")?;
        put(&ib.join("node_desc"), &format!("mlx5-emu {}", hca.name))?;
        write_port(&ib.join("ports/1"), hca)?;
        link(
            &format!("../../{PCI_BUS_DIR}/{bdf}/infiniband/{}", hca.name),
            &ib_class.join(&hca.name),
        )?;

        let uverbs = pci.join("infiniband_verbs").join(format!("uverbs{i}"));
        fs::create_dir_all(&uverbs)?;
        link(&format!("../../../{bdf}"), &uverbs.join("device"))?;
        put(&uverbs.join("ibdev"), &hca.name)?;
        put(&uverbs.join("abi_version"), &MLX5_ABI_VERSION.to_string())?;
        let (major, minor) = uverbs_dev(i);
        put(&uverbs.join("dev"), &format!("{major}:{minor}"))?;
        link(
            &format!("../../{PCI_BUS_DIR}/{bdf}/infiniband_verbs/uverbs{i}"),
            &verbs.join(format!("uverbs{i}")),
        )?;

        if hca.is_roce() {
            write_netdev(root, &pci, &bdf, hca)?;
        }
    }
    for extra in EXTRAS {
        extra(root, hcas)?;
    }
    Ok(())
}

/// The port's network interface (Ethernet link layer): `net/<ifname>` under the PCI
/// function and its `class/net` link.
fn write_netdev(root: &Path, pci: &Path, bdf: &str, hca: &HcaInfo) -> io::Result<()> {
    let name = mlx5_emu::NDEV_NAME;
    let ifindex = hca
        .gid_table()
        .iter()
        .map(|e| e.ndev_ifindex)
        .find(|&i| i != 0)
        .unwrap_or(0);
    let dir = pci.join("net").join(name);
    fs::create_dir_all(&dir)?;
    link(&format!("../../../{bdf}"), &dir.join("device"))?;
    put(&dir.join("ifindex"), &ifindex.to_string())?;
    put(&dir.join("type"), "1")?;
    put(&dir.join("operstate"), "up")?;
    put(&dir.join("mtu"), "1500")?;
    put(&dir.join("dev_port"), "0")?;
    let class = root.join("class/net");
    fs::create_dir_all(&class)?;
    // Every HCA's port has the same netdev (the loopback interface): one class entry, the
    // first HCA's (a second link would fail with EEXIST and lose the whole tree).
    if class.join(name).symlink_metadata().is_ok() {
        return Ok(());
    }
    link(
        &format!("../../{PCI_BUS_DIR}/{bdf}/net/{name}"),
        &class.join(name),
    )
}

/// Number of possible CPUs of this machine (`devices/system/cpu/possible`, "0-N"), for
/// `local_cpus`; 1 if unknown.
fn possible_cpus() -> usize {
    fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| {
            let last = s.trim().rsplit([',', '-']).next()?.parse::<usize>().ok()?;
            Some(last + 1)
        })
        .unwrap_or(1)
}

/// `local_cpus` of a device close to every one of `n` CPUs: 32-bit hex words, most
/// significant first, separated by commas (the kernel's cpumask format).
pub(crate) fn cpumask(n: usize) -> String {
    let words = n.div_ceil(32).max(1);
    (0..words)
        .rev()
        .map(|w| {
            let bits = n.saturating_sub(w * 32).min(32);
            let v: u32 = if bits == 32 {
                u32::MAX
            } else {
                (1u32 << bits) - 1
            };
            format!("{v:08x}")
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The PCI function directory: ids, `modalias` (the provider match), `uevent` and NUMA
/// placement (no NUMA node: -1; close to every CPU).
fn write_pci_function(dir: &Path, bdf: &str, hca: &HcaInfo, cpus: usize) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    // The ConnectX PCI device id equals the verbs vendor_part_id (4119 = 0x1017, ConnectX-5).
    let device = hca.vendor_part_id;
    let v = PCI_VENDOR_MELLANOX;
    put(&dir.join("vendor"), &format!("{v:#06x}"))?;
    put(&dir.join("device"), &format!("{device:#06x}"))?;
    put(&dir.join("subsystem_vendor"), &format!("{v:#06x}"))?;
    put(&dir.join("subsystem_device"), "0x0008")?;
    put(&dir.join("class"), "0x020000")?;
    let modalias = format!("pci:v{v:08X}d{device:08X}sv{v:08X}sd00000008bc02sc00i00");
    put(&dir.join("modalias"), &modalias)?;
    put(
        &dir.join("uevent"),
        &format!(
            "DRIVER=mlx5_core\nPCI_CLASS=20000\nPCI_ID={v:04X}:{device:04X}\n\
             PCI_SUBSYS_ID={v:04X}:0008\nPCI_SLOT_NAME={bdf}\nMODALIAS={modalias}"
        ),
    )?;
    put(&dir.join("numa_node"), "-1")?;
    put(&dir.join("local_cpus"), &cpumask(cpus))?;
    put(
        &dir.join("local_cpulist"),
        &if cpus > 1 {
            format!("0-{}", cpus - 1)
        } else {
            "0".to_string()
        },
    )?;
    Ok(())
}

/// `ports/1`: state, LID, GID table (with the GID types and, on a RoCE port, the netdev of
/// every valid entry), P_Key table, as the emulated QUERY_PORT reports them.
fn write_port(dir: &Path, hca: &HcaInfo) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    let roce = hca.is_roce();
    put(&dir.join("state"), "4: ACTIVE")?;
    put(&dir.join("phys_state"), "5: LinkUp")?;
    // A RoCE port has no LID and no SM; its capability mask is CM_SUP | IP_BASED_GIDS.
    let (lid, sm_lid, cap_mask) = if roce {
        (0, 0, "0x04010000")
    } else {
        (hca.lid, 1, "0x02010000")
    };
    put(&dir.join("lid"), &format!("{lid:#x}"))?;
    put(&dir.join("lid_mask_count"), "0")?;
    put(&dir.join("sm_lid"), &format!("{sm_lid:#x}"))?;
    put(&dir.join("sm_sl"), "0")?;
    put(&dir.join("cap_mask"), cap_mask)?;
    put(&dir.join("rate"), "100 Gb/sec (4X EDR)")?;
    put(
        &dir.join("link_layer"),
        if roce { "Ethernet" } else { "InfiniBand" },
    )?;
    let gids = dir.join("gids");
    let types = dir.join("gid_attrs/types");
    let ndevs = dir.join("gid_attrs/ndevs");
    let pkeys = dir.join("pkeys");
    fs::create_dir_all(&gids)?;
    fs::create_dir_all(&types)?;
    fs::create_dir_all(&ndevs)?;
    fs::create_dir_all(&pkeys)?;
    let table = hca.gid_table();
    let entries = TABLE_ENTRIES.max(hca.gid_tbl_len() as usize);
    for i in 0..entries {
        let entry = table.iter().find(|e| e.index as usize == i);
        let gid = entry.map_or([0; 16], |e| e.gid);
        put(&gids.join(i.to_string()), &gid_string(&gid))?;
        put(
            &types.join(i.to_string()),
            entry.map_or("IB/RoCE v1", |e| e.gid_type.sysfs_name()),
        )?;
        if entry.is_some_and(|e| e.ndev_ifindex != 0) {
            put(&ndevs.join(i.to_string()), mlx5_emu::NDEV_NAME)?;
        }
        if i < TABLE_ENTRIES {
            put(
                &pkeys.join(i.to_string()),
                if i == 0 { "0xffff" } else { "0x0000" },
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx5_emu::{EmuConfig, Emulator, RunMode};

    fn scratch(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "mlx5-emu-preload-test.{}.{tag}",
            std::process::id()
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn read(p: &Path) -> String {
        fs::read_to_string(p).unwrap().trim_end().to_string()
    }

    #[test]
    fn recognises_only_our_device_nodes() {
        assert_eq!(device_index(b"/dev/infiniband/uverbs0", 1), Some(0));
        assert_eq!(device_index(b"/dev/infiniband/uverbs12", 16), Some(12));
        assert_eq!(device_index(b"/dev/infiniband/uverbs1", 1), None);
        assert_eq!(device_index(b"/dev/infiniband/uverbs", 1), None);
        assert_eq!(device_index(b"/dev/infiniband/uverbs01", 4), None);
        assert_eq!(device_index(b"/dev/infiniband/uverbs0x", 4), None);
        assert_eq!(device_index(b"/dev/infiniband/rdma_cm", 4), None);
        assert_eq!(device_index(b"dev/infiniband/uverbs0", 4), None);
    }

    #[test]
    fn formats_guid_and_gid_like_sysfs() {
        assert_eq!(guid_string(0x0002_c903_00ab_cdef), "0002:c903:00ab:cdef");
        let mut gid = [0u8; 16];
        gid[0] = 0xfe;
        gid[1] = 0x80;
        gid[15] = 0x01;
        assert_eq!(gid_string(&gid), "fe80:0000:0000:0000:0000:0000:0000:0001");
    }

    #[test]
    fn tree_is_what_libibverbs_enumerates() {
        let emu = Emulator::new(EmuConfig {
            num_hcas: 2,
            mode: RunMode::Stepped,
            ..EmuConfig::default()
        });
        let hcas: Vec<HcaInfo> = (0..2).map(|i| emu.hca_info(i).unwrap()).collect();
        let root = scratch("tree");
        write_tree(&root, &hcas).unwrap();

        // The driver's own discovery code (mlx5-ffi) parses it like the real one.
        assert_eq!(mlx5_ffi::sysfs::check_abi_version(&root).unwrap(), 6);
        let mut devs = mlx5_ffi::sysfs::list_uverbs_devices(&root).unwrap();
        devs.sort_by(|a, b| a.name.cmp(&b.name));
        assert_eq!(devs.len(), 2);
        for (i, d) in devs.iter().enumerate() {
            assert_eq!(d.name, format!("uverbs{i}"));
            assert_eq!(d.ibdev, hcas[i].name);
            assert_eq!(d.abi_version, 1);
            assert_eq!(d.devnum, Some(uverbs_dev(i)));
        }

        let ib = root.join("class/infiniband").join(&hcas[1].name);
        assert_eq!(read(&ib.join("node_type")), "1: CA");
        assert_eq!(read(&ib.join("node_guid")), guid_string(hcas[1].node_guid));
        let modalias = read(&ib.join("device/modalias"));
        assert!(
            modalias.starts_with("pci:v000015B3d00001017sv"),
            "{modalias}"
        );
        assert_eq!(
            read(&root.join("class/infiniband_verbs/uverbs1/device/vendor")),
            "0x15b3"
        );
        let port = ib.join("ports/1");
        assert_eq!(read(&port.join("gids/0")), gid_string(&hcas[1].port_gid));
        assert_eq!(
            read(&port.join("gids/127")),
            "0000:0000:0000:0000:0000:0000:0000:0000"
        );
        assert_eq!(read(&port.join("gid_attrs/types/127")), "IB/RoCE v1");
        assert_eq!(read(&port.join("pkeys/0")), "0xffff");
        assert_eq!(read(&port.join("lid")), format!("{:#x}", hcas[1].lid));
        assert_eq!(read(&port.join("link_layer")), "InfiniBand");
        fs::remove_dir_all(&root).unwrap();
    }

    /// `realpath`, as rdma-core and UCX take it.
    fn real(p: &Path) -> std::path::PathBuf {
        fs::canonicalize(p).unwrap()
    }

    #[test]
    fn tree_is_laid_out_as_the_kernel_lays_it() {
        let emu = Emulator::new(EmuConfig {
            num_hcas: 2,
            mode: RunMode::Stepped,
            ..EmuConfig::default()
        });
        let hcas: Vec<HcaInfo> = (0..2).map(|i| emu.hca_info(i).unwrap()).collect();
        let root = scratch("layout");
        write_tree(&root, &hcas).unwrap();
        let root = real(&root);
        for (i, hca) in hcas.iter().enumerate() {
            let pci = root.join(PCI_BUS_DIR).join(pci_name(i));
            // The class entries are symlinks into the PCI function.
            let class_ib = root.join("class/infiniband").join(&hca.name);
            let class_uv = root.join(format!("class/infiniband_verbs/uverbs{i}"));
            for (entry, inside) in [
                (&class_ib, pci.join("infiniband").join(&hca.name)),
                (&class_uv, pci.join(format!("infiniband_verbs/uverbs{i}"))),
            ] {
                assert!(
                    fs::symlink_metadata(entry)
                        .unwrap()
                        .file_type()
                        .is_symlink()
                );
                assert_eq!(real(entry), inside);
                assert_eq!(real(&entry.join("device")), pci);
            }
            // UCX: realpath of the ibdev path holds "/infiniband/", and two levels up are
            // the PCI function's ids, which it matches against its device table
            // (ConnectX-5: vendor 0x15b3, device 4119).
            let ib_real = real(&class_ib);
            assert!(ib_real.to_string_lossy().contains("/infiniband/"));
            let ids = ib_real.parent().unwrap().parent().unwrap();
            assert_eq!(ids, pci);
            let num = |f: &str| {
                let t = read(&ids.join(f));
                u32::from_str_radix(t.trim_start_matches("0x"), 16).unwrap()
            };
            assert_eq!(num("vendor"), 0x15b3);
            assert_eq!(num("device"), hca.vendor_part_id);
            assert_eq!(num("subsystem_vendor"), 0x15b3);
            assert_eq!(num("subsystem_device"), 8);
            assert_eq!(read(&ids.join("numa_node")), "-1");
            let cpus = read(&ids.join("local_cpus"));
            assert!(
                cpus.split(',')
                    .all(|w| w.len() == 8 && u32::from_str_radix(w, 16).is_ok()),
                "{cpus}"
            );
            assert!(read(&ids.join("uevent")).contains(&format!("PCI_SLOT_NAME={}", pci_name(i))));
            // UCX's hard-coded class paths resolve through the same links.
            assert_eq!(read(&class_ib.join("device/numa_node")), "-1");
            // libibverbs: the uverbs entry names its ibdev and the provider match.
            assert_eq!(read(&class_uv.join("ibdev")), hca.name);
            assert!(read(&class_uv.join("device/modalias")).starts_with("pci:v000015B3d0000"));
            // No Ethernet port, no netdev.
            assert!(!pci.join("net").exists());
        }
        assert!(!root.join("class/net").exists());
        // The driver's own discovery (mlx5::devices) reads it.
        let devs = mlx5::device::devices_in(&root).unwrap();
        assert_eq!(devs.len(), 2);
        for (i, (d, hca)) in devs.iter().zip(&hcas).enumerate() {
            assert_eq!(
                (d.name.as_str(), d.uverbs.as_str()),
                (hca.name.as_str(), format!("uverbs{i}").as_str())
            );
            assert_eq!(d.vendor_id, Some(0x15b3));
            assert_eq!(d.node_guid, guid_string(hca.node_guid));
            let inside = root.join(PCI_BUS_DIR).join(pci_name(i)).join("infiniband");
            assert_eq!(real(&d.sysfs_dir), inside.join(&hca.name));
        }
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn cpumasks_are_printed_as_the_kernel_prints_them() {
        assert_eq!(cpumask(1), "00000001");
        assert_eq!(cpumask(2), "00000003");
        assert_eq!(cpumask(32), "ffffffff");
        assert_eq!(cpumask(33), "00000001,ffffffff");
        assert_eq!(cpumask(72), "000000ff,ffffffff,ffffffff");
        assert_eq!(cpumask(0), "00000000");
    }

    #[test]
    fn roce_port_tree_shows_ethernet_and_gid_types() {
        let emu = Emulator::new(EmuConfig {
            mode: RunMode::Stepped,
            link_layer: mlx5_emu::LinkLayer::Ethernet,
            ..EmuConfig::default()
        });
        let hca = emu.hca_info(0).unwrap();
        let root = scratch("roce");
        write_tree(&root, std::slice::from_ref(&hca)).unwrap();
        let port = root
            .join("class/infiniband")
            .join(&hca.name)
            .join("ports/1");
        assert_eq!(read(&port.join("link_layer")), "Ethernet");
        assert_eq!(read(&port.join("lid")), "0x0");
        assert_eq!(read(&port.join("sm_lid")), "0x0");
        let table = hca.gid_table();
        assert_eq!(table.len(), 4);
        for e in &table {
            let i = e.index.to_string();
            assert_eq!(read(&port.join("gids").join(&i)), gid_string(&e.gid));
            assert_eq!(
                read(&port.join("gid_attrs/types").join(&i)),
                if e.index % 2 == 0 {
                    "IB/RoCE v1"
                } else {
                    "RoCE v2"
                }
            );
            assert_eq!(read(&port.join("gid_attrs/ndevs").join(&i)), "lo");
        }
        assert_eq!(
            read(&port.join("gids/3")),
            format!("0000:0000:0000:0000:0000:ffff:7f01:{:04x}", hca.lid)
        );
        // The port's netdev lives under the PCI function, with its class link.
        let net = root
            .join(PCI_BUS_DIR)
            .join(pci_name(0))
            .join("net")
            .join(mlx5_emu::NDEV_NAME);
        assert_eq!(
            real(&root.join("class/net").join(mlx5_emu::NDEV_NAME)),
            real(&net)
        );
        let ifindex: u32 = read(&net.join("ifindex")).parse().unwrap();
        assert!(
            table
                .iter()
                .any(|e| e.ndev_ifindex == ifindex && ifindex != 0)
        );
        // The whole reported table length exists for the sysfs fallback.
        assert!(port.join("gids/254").exists());
        assert!(
            !port.join("gid_attrs/ndevs/4").exists(),
            "no netdev: no entry"
        );
        fs::remove_dir_all(&root).unwrap();
    }
}
