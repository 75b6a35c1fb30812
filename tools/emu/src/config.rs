//! How an emulator is configured: run and wake modes, kernel flavour, fabric, faults, and
//! the identity of each HCA. Plain data, below everything that reads it.

use crate::eth::EthMinInline;
use crate::eth::tap::TapConfig;
use crate::roce::{self, GidEntry, GidType, LinkLayer, ROCE_GID_TBL_LEN};

/// How the device makes progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum RunMode {
    /// Only when the test calls [`Emulator::step`] / [`Emulator::run_until_idle`]; time is
    /// virtual (timeouts elapse when the fabric is otherwise idle), no threads.
    Stepped,
    /// A device thread per emulator that sleeps until there is work and wakes when there is
    /// (a doorbell store, a kernel command, a packet, a timer; [`WakeMode`]), so an idle HCA
    /// costs almost no CPU.
    #[default]
    Threaded,
}

/// Which ABI generation the emulated kernel presents.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Flavour {
    /// No ioctl framework: every `RDMA_VERBS_IOCTL` fails with `ENOTTY`.
    WriteOnly,
    /// The ioctl framework exists but every method answers `EPROTONOSUPPORT`.
    Eproto,
    /// A modern kernel: `INVOKE_WRITE` tunnels every write command, and the object methods
    /// DEVICE (GET_CONTEXT, QUERY_PORT, QUERY_GID_TABLE/ENTRY), ASYNC_EVENT alloc,
    /// CQ/QP/SRQ create+destroy and PD/MR/AH destroy exist, with the mlx5 UAR and DEVX
    /// objects; other methods answer `EPROTONOSUPPORT`, which libibverbs treats as "use
    /// write()".
    #[default]
    Modern,
}

/// Where packets between HCAs travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Fabric {
    /// Only between the HCAs of this `Emulator` (in memory).
    #[default]
    InProcess,
    /// Also across processes: every HCA binds a UDP socket at `127.1.0.<lid>:4791` and
    /// packets to LIDs that are not local go out as RoCEv2 (BTH + extended headers + ICRC).
    /// The LID is [`EmuConfig::node`] + HCA index, or (node `None`) the first free address.
    Udp,
}

/// Packet-level fault injection on the fabric, reproducible from `seed`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultConfig {
    /// Seed of the deterministic generator.
    pub seed: u64,
    /// Probability (parts per million) that a packet is dropped.
    pub drop_ppm: u32,
    /// Probability (ppm) that a packet is delivered twice.
    pub dup_ppm: u32,
    /// Probability (ppm) that a packet is delayed behind the next one. On the UDP fabric
    /// a datagram to another process is held back until the next one this emulator sends
    /// there has gone out, or for at most 20 us (virtual time in stepped mode).
    pub reorder_ppm: u32,
    /// Extra delivery delay of every packet, nanoseconds (virtual in stepped mode). On the
    /// UDP fabric the datagram is sent this much later; in threaded mode to within the
    /// device thread's polling interval.
    pub delay_ns: u64,
}

/// Emulator configuration. `Default`: 1 HCA, threaded, modern kernel, CQE version 1,
/// BlueFlame registers of 512 bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EmuConfig {
    /// Number of HCAs (`mlx5_0`, `mlx5_1`, ...), all on one in-process fabric.
    pub num_hcas: usize,
    /// Threaded or stepped.
    pub mode: RunMode,
    /// Kernel ABI flavour.
    pub flavour: Flavour,
    /// Highest CQE version the device supports (0 or 1); the context gets
    /// `min(requested, this)`.
    pub cqe_version: u8,
    /// BlueFlame register size reported in the ucontext; 0 means "no write combining": no BF.
    pub bf_reg_size: u32,
    /// Fabric faults.
    pub fault: FaultConfig,
    /// Fault injection, continued: probability (ppm) that a bit of a packet is flipped; the
    /// receiver's ICRC check then discards it (over UDP the corrupted bytes really travel and
    /// show in a capture). Uses `fault.seed`. (Kept out of [`FaultConfig`] so that struct
    /// literals of it written before this knob existed stay valid.)
    pub corrupt_ppm: u32,
    /// In-process only, or UDP across processes.
    pub fabric: Fabric,
    /// UDP fabric: the node number (LID) of HCA 0; HCA i gets `node + i`. `None` picks the
    /// first free one (1..=254). The node also fixes the HCA's GUID (`BASE_GUID + lid`) and
    /// its first object number (`lid << 16`), so QPNs differ between processes.
    /// In-process fabric: `node` (default 1) is the LID of HCA 0 as well.
    pub node: Option<u16>,
    /// Capture to this pcap file (Ethernet/IPv4/UDP 4791): every packet our HCAs send and every
    /// one that arrives from another process, wall-clock stamped; emulators (processes) given
    /// the same path write one capture, each packet once (`docs/diagnostics.md`).
    pub pcap: Option<std::path::PathBuf>,
    /// Honour `MLX5_LIB_CAP_DYN_UAR` (Modern flavour only): contexts that ask get
    /// `tot_bfregs = 0`, allocate UARs with the mlx5 UAR object (ioctl `UAR_OBJ_ALLOC`,
    /// mmap at the returned offset), and must name a UAR page in CQ/QP creation. Off by
    /// default: contexts get static UARs, as from a kernel before dynamic UARs.
    pub dyn_uar: bool,
    /// Link layer of every HCA's port. `InfiniBand` (default): LID-routed, one GID.
    /// `Ethernet`: a RoCE port as mlx5_ib presents it -- LID 0, a GID table of RoCE v1/v2
    /// entries (link-local and IPv4-mapped, see [`HcaInfo::gid_table`]), CREATE_AH returns
    /// the destination MAC, connected QPs need a GRH, and the device routes by GID.
    pub link_layer: LinkLayer,
    /// Attach HCA 0's port (Ethernet) to a TAP interface inside a network namespace
    /// (`docs/raw-ethernet.md`); None: not attached.
    pub tap: Option<TapConfig>,
    /// Ethernet ports: the header bytes a raw send WQE must inline ([`EthMinInline`],
    /// reported in the ucontext's `eth_min_inline`); default none (ConnectX-5).
    pub eth_min_inline: EthMinInline,
}

impl Default for EmuConfig {
    fn default() -> Self {
        Self {
            num_hcas: 1,
            mode: RunMode::Threaded,
            flavour: Flavour::Modern,
            cqe_version: 1,
            bf_reg_size: 512,
            fault: FaultConfig::default(),
            corrupt_ppm: 0,
            fabric: Fabric::InProcess,
            node: None,
            pcap: None,
            dyn_uar: false,
            link_layer: LinkLayer::InfiniBand,
            tap: None,
            eth_min_inline: EthMinInline::None,
        }
    }
}

/// Identity of one emulated HCA, for discovery (what sysfs would show).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HcaInfo {
    /// Device name, `mlx5_<i>`.
    pub name: String,
    /// Node GUID (host order value; the kernel ABI carries it big-endian).
    pub node_guid: u64,
    /// System image GUID.
    pub sys_image_guid: u64,
    /// Port 1 GID 0: InfiniBand: link-local prefix + node GUID; RoCE: `fe80::` + the
    /// modified EUI-64 of [`HcaInfo::mac`].
    pub port_gid: [u8; 16],
    /// The fabric node number: on InfiniBand the port's LID (a RoCE port reports LID 0
    /// but the node keeps its number, which fixes its addresses).
    pub lid: u16,
    /// Link layer of port 1.
    pub link_layer: LinkLayer,
    /// MAC address of the port (Ethernet): the node GUID without its bytes 3 and 4.
    pub mac: [u8; 6],
    /// IPv4 address of the node on the fabric (`127.1.x.y`, x.y = node number).
    pub ipv4: [u8; 4],
    /// Firmware version, "major.minor.sub".
    pub fw_ver: String,
    /// Firmware version as QUERY_DEVICE encodes it: major << 32 | minor << 16 | sub.
    pub fw_ver_raw: u64,
    /// IEEE vendor id (0x02c9) and part id (4119, ConnectX-5).
    pub vendor_id: u32,
    /// Vendor part id.
    pub vendor_part_id: u32,
}

impl HcaInfo {
    /// The valid entries of port 1's GID table: one InfiniBand GID, or on a RoCE port
    /// RoCE v1 and v2 entries for the link-local GID (indexes 0, 1) and the IPv4-mapped
    /// `::ffff:a.b.c.d` GID (indexes 2, 3), as the RoCE GID management fills it.
    pub fn gid_table(&self) -> Vec<GidEntry> {
        match self.link_layer {
            LinkLayer::InfiniBand => vec![GidEntry {
                index: 0,
                gid: self.port_gid,
                gid_type: GidType::Ib,
                ndev_ifindex: 0,
            }],
            LinkLayer::Ethernet => roce::gid_table(self.mac, self.ipv4),
        }
    }

    /// Length of port 1's GID table (QUERY_PORT `gid_tbl_len`).
    pub fn gid_tbl_len(&self) -> u32 {
        match self.link_layer {
            LinkLayer::InfiniBand => 1,
            LinkLayer::Ethernet => ROCE_GID_TBL_LEN,
        }
    }

    /// Whether port 1 is Ethernet (RoCE).
    pub fn is_roce(&self) -> bool {
        self.link_layer == LinkLayer::Ethernet
    }
}

/// How a threaded device waits for work (`MLX5_EMU_WAKE`, read when the emulator is
/// created; see `docs/emulator-wake.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WakeMode {
    /// Stepped mode: nothing waits.
    Stepped,
    /// `MLX5_EMU_WAKE=fault` (the default): UAR pages are write-protected between scans;
    /// the first doorbell store faults and wakes the device thread, which otherwise blocks
    /// (on an eventfd, the UDP sockets and the next timer deadline).
    Fault,
    /// `MLX5_EMU_WAKE=poll`: the old device thread, which spins for 300 us after work, then
    /// sleeps 50 us while recently active and backs off to 2 ms (for comparison).
    Poll,
}

impl WakeMode {
    /// The mode the environment asks for, for a threaded emulator. Under valgrind the
    /// device polls: valgrind 3.19 kills the program at the first store to a protected
    /// UAR page instead of running our SIGSEGV handler (seen with the bench's C harness
    /// under callgrind), and a run under valgrind measures instructions, not wake-ups.
    pub fn from_env() -> WakeMode {
        let valgrind = std::env::var_os("VALGRIND_LAUNCHER").is_some()
            || std::env::var("LD_PRELOAD").is_ok_and(|p| p.contains("vgpreload"));
        match std::env::var("MLX5_EMU_WAKE").as_deref() {
            Ok("poll") => WakeMode::Poll,
            _ if valgrind => WakeMode::Poll,
            _ => WakeMode::Fault,
        }
    }
}
