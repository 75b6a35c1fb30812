//! An emulated ConnectX (mlx5) HCA and the `ib_uverbs` kernel interface in front of it.
//!
//! The emulator is what the driver (and, through an `LD_PRELOAD` shim, unmodified
//! rdma-core) talks to on a machine without the hardware. It has two halves:
//!
//! * **Kernel side** ([`Emulator::open`] returns an [`UverbsSurface`]): the legacy
//!   `write()` commands (plain and extended), the ioctl framework (`INVOKE_WRITE` and the
//!   object methods of a modern kernel, per [`Flavour`]), `mmap` of UAR and clock pages. Commands are validated the way the kernel validates them
//!   and fail with the kernel's errno; every user pointer is accessed through a
//!   copy that catches its own faults (x86_64 Linux; see [`DmaPath`]) or through
//!   `process_vm_readv`/`process_vm_writev`, so a bad pointer yields `EFAULT`, never a crash.
//! * **Device side**: woken *only* by MMIO writes into the mapped UAR pages (the 8-byte
//!   doorbell or a BlueFlame copy at a bfreg half, the CQ arm doorbell at UAR + 0x20). It
//!   fetches WQEs from the SQ ring up to the doorbell record, executes them with RC/UC/UD
//!   transport semantics (path-MTU packets with PSNs, ACK/NAK, retransmission, RNR,
//!   duplicates, at-most-once atomics), writes CQEs exactly as hardware does, raises
//!   completion and async events, and keeps the mlx5 `hw_counters`.
//! * **Fabric** ([`Fabric`]): in process between the HCAs of one emulator, or RoCEv2 over
//!   UDP on the loopback interface between processes; seeded fault injection
//!   ([`FaultConfig`]) and pcap capture.
//!
//! Two run modes ([`RunMode`]): `Threaded` (a device thread that spins briefly, then backs
//! off) and `Stepped` (nothing runs unless a test calls [`Emulator::step`] or
//! [`Emulator::run_until_idle`]; deterministic, virtual time).
//!
//! UARs are static (via `tot_bfregs`) by default; with [`EmuConfig::dyn_uar`] on a modern
//! kernel flavour a context that asks for `MLX5_LIB_CAP_DYN_UAR` allocates UAR pages with
//! the `MLX5_IB_OBJECT_UAR` methods instead, as on current kernels.
//!
//! What the emulated kernel/device deliberately does not do (yet): DEVX and the mlx5 VAR
//! object, memory windows and UMR (LOCAL_INV,
//! BIND_MW: local QP operation error), CQE compression, resize CQ, XRC/DC/RAW_PACKET QPs.
//! The port is InfiniBand by default (LID-routed, one GID: link-local prefix + node GUID,
//! one P_Key); [`EmuConfig::link_layer`] = [`LinkLayer::Ethernet`] makes it a RoCE port
//! (GID-routed, RoCE v1/v2 GID table, destination MACs; the fabric between processes is
//! RoCEv2 either way, RoCE v1 entries are accepted but travel as RoCEv2 there).
//! SEND with invalidate reports the rkey in the CQE without invalidating anything.
//!
//! ```no_run
//! use mlx5_emu::{EmuConfig, Emulator, RunMode};
//! let emu = Emulator::new(EmuConfig { mode: RunMode::Stepped, ..EmuConfig::default() });
//! let dev = emu.open(0).unwrap();          // like open("/dev/infiniband/uverbs0")
//! // ... issue GET_CONTEXT etc. through dev.write()/dev.ioctl(), ring doorbells ...
//! emu.run_until_idle();
//! println!("{:?}", emu.counters(0));
//! ```

mod abi;
pub mod cprog;
mod device;
mod fds;
mod kernel;
mod mem;
mod pcap;
mod record;
mod roce;
mod state;
mod transport;
mod uar;

use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

pub use abi::{Errno, UverbsSurface};
pub use mem::{DmaPath, dma_path, set_dma_path};
pub use record::{WqeRecord, WqeVia};
pub use roce::{GidEntry, GidType, LinkLayer, NDEV_IFINDEX, NDEV_NAME, ROCE_GID_TBL_LEN};

/// The RoCEv2 ICRC (sent little-endian after the payload) of the UDP payload `bth_on` (BTH
/// onwards, without the ICRC) from fabric node `src_lid` to `dst_lid`, for tools and tests
/// that hand-craft packets for [`Fabric::Udp`]. `None` if `bth_on` is shorter than a BTH.
pub fn roce_icrc(bth_on: &[u8], src_lid: u16, dst_lid: u16) -> Option<u32> {
    (bth_on.len() >= 12).then(|| {
        transport::icrc(
            bth_on,
            transport::node_ip(src_lid),
            transport::node_ip(dst_lid),
        )
    })
}

/// Copy `len` bytes at `addr` of this process the way the emulated kernel reads a user
/// pointer: `EFAULT` for an unmapped or unreadable range, never a crash (see [`DmaPath`]).
pub fn copy_from_user(addr: u64, len: usize) -> Result<Vec<u8>, Errno> {
    mem::read_vec(addr, len)
}

/// Copy `data` to `addr` of this process the way the emulated kernel writes through a user
/// pointer: `EFAULT` for an unmapped or read-only range, never a crash.
pub fn copy_to_user(addr: u64, data: &[u8]) -> Result<(), Errno> {
    mem::write(addr, data)
}

/// How the device makes progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum RunMode {
    /// Only when the test calls [`Emulator::step`] / [`Emulator::run_until_idle`]; time is
    /// virtual (timeouts elapse when the fabric is otherwise idle), no threads.
    Stepped,
    /// A device thread per emulator: spins briefly after activity, then sleeps with growing
    /// back-off, so an idle HCA costs almost no CPU.
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
    /// CQ/QP/SRQ create+destroy and PD/MR/AH destroy exist; other methods (DEVX, UAR objects,
    /// ...) answer `EPROTONOSUPPORT`, which libibverbs treats as "use write()".
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
    /// Write every packet put on the fabric to this pcap file (Ethernet/IPv4/UDP 4791).
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
}

/// GUID of node 0; node (LID) n has GUID `BASE_GUID + n`.
pub const BASE_GUID: u64 = 0x0002_c903_00ab_cd00;

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

/// Device counters of one HCA. The second group is named exactly like the mlx5
/// `hw_counters` in sysfs; [`Counters::get`] looks them up by that name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// 8-byte doorbell MMIO writes consumed (send doorbells; BF included). The device
    /// samples each doorbell word, so in threaded mode two writes to the same bfreg half
    /// landing between two scans count once (the later one wins, as it carries the newer
    /// producer index); stepped tests see exact counts.
    pub doorbells: u64,
    /// Doorbells that came with a BlueFlame copy of the WQE (non-zero bytes beyond the
    /// doorbell word in the bfreg half). In threaded mode the device may take a half while
    /// the CPU is still copying into it; the rest of that copy then lingers and the next
    /// 8-byte doorbell on the same half is also counted here (seen ~1 in 2000 posts).
    /// Stepped mode is exact.
    pub bf_writes: u64,
    /// BlueFlame copies whose bytes differed from the WQE in the ring (stepped mode).
    pub bf_mismatches: u64,
    /// Doorbells naming a QP that does not exist in the writing context.
    pub doorbell_drops: u64,
    /// Send WQEs executed (including those completed in error, not flushed ones).
    pub wqes_executed: u64,
    /// Of those, WQEs carrying inline data.
    pub inline_wqes: u64,
    /// CQEs written (all CQs).
    pub cqes_written: u64,
    /// CQ arm doorbells received.
    pub cq_arms: u64,
    /// Completion events written to completion channels.
    pub comp_events: u64,
    /// Async events written.
    pub async_events: u64,
    /// Packets put on the fabric by this HCA.
    pub packets_sent: u64,
    /// Packets dropped (fault injection, no such destination, or any of the three kinds
    /// of hostile packet below).
    pub packets_dropped: u64,
    /// Received packets that could not be parsed: short, truncated, malformed headers, bad
    /// ICRC; and READ responses whose length does not fit the READ. Dropped.
    pub rx_bad_packets: u64,
    /// Received packets not from the connected peer: for no QP here, or for an RC/UC QP
    /// from another node or QP than the one it is connected to. Dropped.
    pub rx_foreign: u64,
    /// Responses (ACK, NAK, READ data, atomic results) naming a PSN beyond the last one
    /// the requester transmitted: forged or corrupt. Dropped.
    pub rx_out_of_window: u64,
    /// hw_counter: packets received with a PSN beyond the expected one.
    pub out_of_sequence: u64,
    /// hw_counter: NAK-sequence-error packets received by the requester.
    pub packet_seq_err: u64,
    /// hw_counter: duplicate requests received.
    pub duplicate_request: u64,
    /// hw_counter: RNR NAKs received by the requester.
    pub rnr_nak_retry_err: u64,
    /// hw_counter: local ACK timeouts.
    pub local_ack_timeout_err: u64,
    /// hw_counter: receives dropped for lack of a receive WQE.
    pub out_of_buffer: u64,
    /// hw_counter: RDMA WRITE requests received.
    pub rx_write_requests: u64,
    /// hw_counter: RDMA READ requests received.
    pub rx_read_requests: u64,
    /// hw_counter: atomic requests received.
    pub rx_atomic_requests: u64,
    /// hw_counter: requester error CQEs (not flush).
    pub req_cqe_error: u64,
    /// hw_counter: responder error CQEs (not flush).
    pub resp_cqe_error: u64,
    /// hw_counter: requester flush CQEs.
    pub req_cqe_flush_error: u64,
    /// hw_counter: responder flush CQEs.
    pub resp_cqe_flush_error: u64,
    /// hw_counter: transport retries exceeded.
    pub req_transport_retries_exceeded: u64,
    /// hw_counter: RNR retries exceeded.
    pub req_rnr_retries_exceeded: u64,
}

impl Counters {
    /// The mlx5 `hw_counters` names this emulator maintains.
    pub const HW_COUNTER_NAMES: [&'static str; 15] = [
        "out_of_sequence",
        "packet_seq_err",
        "duplicate_request",
        "rnr_nak_retry_err",
        "local_ack_timeout_err",
        "out_of_buffer",
        "rx_write_requests",
        "rx_read_requests",
        "rx_atomic_requests",
        "req_cqe_error",
        "resp_cqe_error",
        "req_cqe_flush_error",
        "resp_cqe_flush_error",
        "req_transport_retries_exceeded",
        "req_rnr_retries_exceeded",
    ];

    /// The mlx5 `hw_counters` as (sysfs name, value), in [`Counters::HW_COUNTER_NAMES`]
    /// order, e.g. for writing a fake `ports/1/hw_counters/` directory.
    pub fn hw_counters(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        Self::HW_COUNTER_NAMES
            .iter()
            .map(|&n| (n, self.get(n).unwrap_or(0)))
    }

    /// Look a counter up by its sysfs `hw_counters` name (or the field name).
    pub fn get(&self, name: &str) -> Option<u64> {
        Some(match name {
            "doorbells" => self.doorbells,
            "bf_writes" => self.bf_writes,
            "bf_mismatches" => self.bf_mismatches,
            "doorbell_drops" => self.doorbell_drops,
            "wqes_executed" => self.wqes_executed,
            "inline_wqes" => self.inline_wqes,
            "cqes_written" => self.cqes_written,
            "cq_arms" => self.cq_arms,
            "comp_events" => self.comp_events,
            "async_events" => self.async_events,
            "packets_sent" => self.packets_sent,
            "packets_dropped" => self.packets_dropped,
            "rx_bad_packets" => self.rx_bad_packets,
            "rx_foreign" => self.rx_foreign,
            "rx_out_of_window" => self.rx_out_of_window,
            "out_of_sequence" => self.out_of_sequence,
            "packet_seq_err" => self.packet_seq_err,
            "duplicate_request" => self.duplicate_request,
            "rnr_nak_retry_err" => self.rnr_nak_retry_err,
            "local_ack_timeout_err" => self.local_ack_timeout_err,
            "out_of_buffer" => self.out_of_buffer,
            "rx_write_requests" => self.rx_write_requests,
            "rx_read_requests" => self.rx_read_requests,
            "rx_atomic_requests" => self.rx_atomic_requests,
            "req_cqe_error" => self.req_cqe_error,
            "resp_cqe_error" => self.resp_cqe_error,
            "req_cqe_flush_error" => self.req_cqe_flush_error,
            "resp_cqe_flush_error" => self.resp_cqe_flush_error,
            "req_transport_retries_exceeded" => self.req_transport_retries_exceeded,
            "req_rnr_retries_exceeded" => self.req_rnr_retries_exceeded,
            _ => return None,
        })
    }
}

#[derive(Debug)]
struct Shared {
    world: Mutex<state::World>,
    /// The UDP sockets' descriptors (owned by the HCAs in `world`), for the idle wait.
    udp_fds: Vec<i32>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, state::World> {
        self.world
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The emulator: a set of HCAs on one fabric. Cheap to clone (an `Arc` inside).
#[derive(Clone, Debug)]
pub struct Emulator {
    shared: Arc<Shared>,
}

impl Emulator {
    /// Create the emulator; in [`RunMode::Threaded`] this starts the device thread, which
    /// ends when the last handle (emulator or opened surface) is dropped.
    pub fn new(cfg: EmuConfig) -> Emulator {
        let n = cfg.num_hcas.max(1);
        let mut socks: Vec<Option<std::net::UdpSocket>> = Vec::new();
        let lids: Vec<u16> = match cfg.fabric {
            Fabric::InProcess => {
                let base = cfg.node.unwrap_or(1).max(1);
                (0..n).map(|i| base + i as u16).collect()
            }
            Fabric::Udp => {
                let mut lids = Vec::new();
                let mut next = cfg.node.unwrap_or(1).max(1);
                for _ in 0..n {
                    // Explicit node: take it (or the next free one if it is busy).
                    while next < 255 {
                        let ip = transport::node_ip(next);
                        let addr = std::net::SocketAddrV4::new(ip.into(), transport::ROCE_PORT);
                        if let Ok(s) = std::net::UdpSocket::bind(addr) {
                            let _ = s.set_nonblocking(true);
                            set_rcvbuf(&s, 4 << 20);
                            socks.push(Some(s));
                            break;
                        }
                        next += 1;
                    }
                    lids.push(next);
                    next += 1;
                }
                lids
            }
        };
        socks.resize_with(n, || None);
        let hcas = lids
            .iter()
            .zip(socks)
            .enumerate()
            .map(|(i, (&lid, sock))| {
                let guid = BASE_GUID + u64::from(lid);
                let mac = roce::mac_of_guid(guid);
                let mut gid = [0u8; 16];
                gid[0] = 0xfe;
                gid[1] = 0x80;
                gid[8..].copy_from_slice(&guid.to_be_bytes());
                if cfg.link_layer == LinkLayer::Ethernet {
                    gid = roce::link_local_gid(mac);
                }
                state::Hca {
                    info: HcaInfo {
                        name: format!("mlx5_{i}"),
                        node_guid: guid,
                        sys_image_guid: guid,
                        port_gid: gid,
                        lid,
                        link_layer: cfg.link_layer,
                        mac,
                        ipv4: transport::node_ip(lid),
                        fw_ver: "16.35.1012".to_string(),
                        fw_ver_raw: (16 << 32) | (35 << 16) | 1012,
                        vendor_id: 0x02c9,
                        vendor_part_id: 4119,
                    },
                    counters: Counters::default(),
                    pds: Default::default(),
                    mrs: Default::default(),
                    cqs: Default::default(),
                    qps: Default::default(),
                    srqs: Default::default(),
                    ahs: Default::default(),
                    next_id: (u32::from(lid) << 16 | 1) & 0xff_ffff,
                    next_key: (u32::from(lid) << 12 | 1) & 0xff_ffff,
                    sock,
                }
            })
            .collect::<Vec<_>>();
        let udp_fds: Vec<i32> = hcas
            .iter()
            .filter_map(|h| h.sock.as_ref().map(std::os::fd::AsRawFd::as_raw_fd))
            .collect();
        let pcap = cfg.pcap.as_deref().and_then(pcap::open);
        let mode = cfg.mode;
        let seed = cfg.fault.seed;
        let world = state::World {
            cfg,
            hcas,
            contexts: Default::default(),
            channels: Vec::new(),
            next_ctx: 1,
            wire: Default::default(),
            outbox: Default::default(),
            vclock: 0,
            started: std::time::Instant::now(),
            rng: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
            rx_buf: Vec::new(),
            pcap,
            wqe_log: Default::default(),
        };
        let shared = Arc::new(Shared {
            world: Mutex::new(world),
            udp_fds,
        });
        if mode == RunMode::Threaded {
            let weak = Arc::downgrade(&shared);
            std::thread::Builder::new()
                .name("mlx5-emu".into())
                .spawn(move || device_thread(weak))
                .ok();
        }
        Emulator { shared }
    }

    /// Open a new "file" on HCA `hca` (like `open("/dev/infiniband/uverbsN")`). It becomes a
    /// ucontext after GET_CONTEXT; dropping the returned surface closes it and destroys
    /// every object it owns.
    pub fn open(&self, hca: usize) -> Result<Arc<dyn UverbsSurface>, Errno> {
        if hca >= self.shared.lock().hcas.len() {
            return Err(Errno(libc::ENODEV));
        }
        Ok(Arc::new(kernel::EmuFile::new(self.shared.clone(), hca)))
    }

    /// Number of HCAs.
    pub fn num_hcas(&self) -> usize {
        self.shared.lock().hcas.len()
    }

    /// Identity of HCA `i` (None if out of range).
    pub fn hca_info(&self, i: usize) -> Option<HcaInfo> {
        self.shared.lock().hcas.get(i).map(|h| h.info.clone())
    }

    /// Counters of HCA `i` (zeroes if out of range).
    pub fn counters(&self, i: usize) -> Counters {
        self.shared
            .lock()
            .hcas
            .get(i)
            .map(|h| h.counters)
            .unwrap_or_default()
    }

    /// Do one round of device work: consume doorbells, execute WQEs, deliver the packets in
    /// flight, fire due timers. Returns the number of work items done (0 = nothing to do
    /// now). In stepped mode, when nothing else is pending, virtual time jumps to the next
    /// timer so retransmission timeouts elapse.
    pub fn step(&self) -> usize {
        let mut w = self.shared.lock();
        device::step(&mut w)
    }

    /// Call [`Emulator::step`] until it reports no work (bounded, so a QP retrying forever
    /// cannot hang a test). Returns the total work done.
    pub fn run_until_idle(&self) -> usize {
        let mut total = 0;
        for _ in 0..1_000_000 {
            let n = self.step();
            if n == 0 {
                break;
            }
            total += n;
        }
        total
    }
}

/// Ask for a large receive buffer (the kernel caps it at `net.core.rmem_max`), so bursts of
/// MTU-sized packets are not tail-dropped.
fn set_rcvbuf(s: &std::net::UdpSocket, bytes: i32) {
    use std::os::fd::AsRawFd;
    // SAFETY: setsockopt on a socket we own, with a pointer to a live c_int and its size.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&raw const bytes).cast(),
            size_of::<i32>() as libc::socklen_t,
        )
    };
}

fn device_thread(weak: Weak<Shared>) {
    // Spin (yielding) for SPIN_WINDOW after the last work item, so ping-pong gaps do not
    // land in a sleep; then sleep 50 us while recently active, and back off to 2 ms once
    // idle for more than ACTIVE_WINDOW.
    const SPIN_WINDOW: Duration = Duration::from_micros(300);
    const ACTIVE_WINDOW: Duration = Duration::from_secs(1);
    // A fresh HCA starts out idle.
    let mut last_work = std::time::Instant::now()
        .checked_sub(ACTIVE_WINDOW)
        .unwrap_or_else(std::time::Instant::now);
    let mut idle_sleeps: u32 = 0;
    loop {
        let Some(shared) = weak.upgrade() else { return };
        let n = {
            let mut w = shared.lock();
            device::step(&mut w)
        };
        drop(shared);
        if n > 0 {
            last_work = std::time::Instant::now();
            idle_sleeps = 0;
            continue;
        }
        let fds: Vec<i32> = weak
            .upgrade()
            .map(|s| s.udp_fds.clone())
            .unwrap_or_default();
        let since = last_work.elapsed();
        if since < SPIN_WINDOW {
            std::hint::spin_loop();
            std::thread::yield_now();
        } else {
            // Recently active (within a second): short sleeps, so a doorbell rung by a
            // ping-pong peer is seen within ~50 us. Idle for longer: back off to 2 ms.
            let us = if since < ACTIVE_WINDOW {
                50
            } else {
                idle_sleeps = idle_sleeps.saturating_add(1);
                (50u64 << (idle_sleeps / 16).min(6)).min(2000)
            };
            if fds.is_empty() {
                std::thread::sleep(Duration::from_micros(us));
            } else {
                // Sleep, but wake at once when a packet arrives.
                let mut pfds: Vec<libc::pollfd> = fds
                    .iter()
                    .map(|&fd| libc::pollfd {
                        fd,
                        events: libc::POLLIN,
                        revents: 0,
                    })
                    .collect();
                let ts = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: (us * 1000) as libc::c_long,
                };
                // SAFETY: `pfds` is a valid array of pollfd for the call; the sockets stay
                // open while any handle (and thus `world`) lives, and a closed fd only makes
                // ppoll report POLLNVAL.
                unsafe {
                    libc::ppoll(
                        pfds.as_mut_ptr(),
                        pfds.len() as libc::nfds_t,
                        &ts,
                        std::ptr::null(),
                    )
                };
                if pfds.iter().any(|p| p.revents != 0) {
                    last_work = std::time::Instant::now();
                }
            }
        }
    }
}
