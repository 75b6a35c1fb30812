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
//! Two run modes ([`RunMode`]): `Threaded` (a device thread that sleeps until a doorbell
//! store faults on its write-protected UAR page, a kernel command, a packet or a timer wakes
//! it; [`WakeMode`], `docs/emulator-wake.md`) and `Stepped` (nothing runs unless a test calls [`Emulator::step`] or
//! [`Emulator::run_until_idle`]; deterministic, virtual time).
//!
//! UARs are static (via `tot_bfregs`) by default; with [`EmuConfig::dyn_uar`] on a modern
//! kernel flavour a context that asks for `MLX5_LIB_CAP_DYN_UAR` allocates UAR pages with
//! the `MLX5_IB_OBJECT_UAR` methods instead, as on current kernels.
//!
//! DEVX (PRM commands of a DEVX context) is answered for what UCX and rdma-core ask: the
//! capability pages, umems, DEVX QP/DCT/RMP objects and event channels
//! (`docs/emulator-kernel.md`). What the emulated kernel/device deliberately does not do
//! (yet): the mlx5 VAR object, memory windows and UMR (LOCAL_INV, BIND_MW: local QP
//! operation error), CQE compression, resize CQ.
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
mod caps;
pub mod cprog;
mod device;
mod eth;
mod fds;
mod inspect;
mod kernel;
mod mem;
mod pcap;
mod record;
mod roce;
mod state;
pub mod trace;
mod transport;
mod uar;
mod xrc_dc;

use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

pub use abi::{Errno, UverbsSurface};
pub use eth::EthMinInline;
pub use eth::tap::{NEIGH_NODES, NS_HOST_IP, TapConfig, in_netns, net_down, net_up, ns_hca_ip};
pub use inspect::{CqView, QpView};
pub use kernel::ucma::{RdmaCmFile, RdmaCmOpen};
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
    /// Attach HCA 0's port (Ethernet) to a TAP interface inside a network namespace
    /// (`docs/raw-ethernet.md`); None: not attached.
    pub tap: Option<TapConfig>,
    /// Ethernet ports: the header bytes a raw send WQE must inline ([`EthMinInline`],
    /// reported in the ucontext's `eth_min_inline`); default none (ConnectX-5).
    pub eth_min_inline: EthMinInline,
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

/// Device counters of one HCA. The second group is named exactly like the mlx5
/// `hw_counters` in sysfs; [`Counters::get`] looks them up by that name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// 8-byte doorbell MMIO writes consumed (send doorbells; BF included). The device
    /// samples each doorbell word: doorbells of different QPs, halves or pages between two
    /// scans all count, and a doorbell written after the device has seen the previous one's
    /// work always counts (`tests/wake.rs`); two writes to *the same* word between two scans
    /// count once (the later one wins, as it carries the newer producer index). A QP whose
    /// doorbell on a shared register was written over is recovered from its doorbell record
    /// without a count. Stepped tests see exact counts.
    pub doorbells: u64,
    /// Doorbells that came with a BlueFlame copy of the WQE (non-zero bytes beyond the
    /// doorbell word in the bfreg half). In threaded mode a scan may take a half while the
    /// CPU is still copying into it (the writer preempted mid-copy); that doorbell then
    /// counts as an 8-byte one and the lingering rest may count with the next 8-byte
    /// doorbell on that half (bounded by 1 in 2000 in `tests/wake.rs`, usually 0). Stepped
    /// mode is exact.
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
    /// Link (PCIe model, `trace.rs`), counted only while [`Emulator::count_link`] or
    /// [`Emulator::trace`] is on: MMIO writes consumed (posted writes, one per 64-byte
    /// write-combining block: doorbells, BlueFlame copies, CQ arms).
    pub mmio_writes: u64,
    /// Link: bytes of those MMIO writes.
    pub mmio_bytes: u64,
    /// Link: DMA read requests the device issued (WQE fetches, doorbell records, payload,
    /// receive WQEs).
    pub dma_read_requests: u64,
    /// Link: completions that answered them.
    pub dma_read_completions: u64,
    /// Link: bytes read by DMA.
    pub dma_read_bytes: u64,
    /// Link: DMA writes (posted writes: data placed, CQEs).
    pub dma_writes: u64,
    /// Link: bytes written by DMA.
    pub dma_write_bytes: u64,
    /// Of the DMA reads: send-WQE fetches from the ring.
    pub wqe_fetches: u64,
    /// Bytes of those WQE fetches.
    pub wqe_fetch_bytes: u64,
    /// Of the DMA reads: payload reads (send gathers, READ response data, atomic operands).
    pub payload_reads: u64,
    /// Bytes of those payload reads.
    pub payload_read_bytes: u64,
    /// Raw Ethernet: frames RAW_PACKET QPs sent.
    pub raw_tx_frames: u64,
    /// Raw Ethernet: frames placed into a RAW_PACKET QP's receive queue.
    pub raw_rx_frames: u64,
    /// Raw Ethernet: frames no steering rule matched (discarded).
    pub rx_steer_missed: u64,
    /// Raw Ethernet: frames a drop rule took.
    pub rx_steer_dropped: u64,
    /// Raw Ethernet: frames the port refused as malformed (runts, oversize).
    pub rx_raw_bad_frames: u64,
}

impl Counters {
    /// The link counters (the PCIe model of `trace.rs`), by field name.
    pub const LINK_COUNTER_NAMES: [&'static str; 11] = [
        "mmio_writes",
        "mmio_bytes",
        "dma_read_requests",
        "dma_read_completions",
        "dma_read_bytes",
        "dma_writes",
        "dma_write_bytes",
        "wqe_fetches",
        "wqe_fetch_bytes",
        "payload_reads",
        "payload_read_bytes",
    ];

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
            "mmio_writes" => self.mmio_writes,
            "mmio_bytes" => self.mmio_bytes,
            "dma_read_requests" => self.dma_read_requests,
            "dma_read_completions" => self.dma_read_completions,
            "dma_read_bytes" => self.dma_read_bytes,
            "dma_writes" => self.dma_writes,
            "dma_write_bytes" => self.dma_write_bytes,
            "wqe_fetches" => self.wqe_fetches,
            "wqe_fetch_bytes" => self.wqe_fetch_bytes,
            "payload_reads" => self.payload_reads,
            "payload_read_bytes" => self.payload_read_bytes,
            "raw_tx_frames" => self.raw_tx_frames,
            "raw_rx_frames" => self.raw_rx_frames,
            "rx_steer_missed" => self.rx_steer_missed,
            "rx_steer_dropped" => self.rx_steer_dropped,
            "rx_raw_bad_frames" => self.rx_raw_bad_frames,
            _ => return None,
        })
    }
}

#[derive(Debug)]
struct Shared {
    world: Mutex<state::World>,
    /// The UDP sockets' descriptors (owned by the HCAs in `world`), for the idle wait.
    udp_fds: Vec<i32>,
    /// Threaded wake mode: the device thread's wake-up line (see [`WakeMode`]).
    wake: Option<Arc<uar::Wake>>,
    /// The waking device thread's scheduling (`SCHED_*` above, or a real-time priority).
    sched: std::sync::atomic::AtomicI32,
    /// The waking device thread's kernel thread id (0 until it has started).
    device_tid: std::sync::atomic::AtomicI32,
}

impl Shared {
    /// The world, for a caller that may create device work (a kernel command): the device
    /// thread is woken when the guard drops.
    fn lock(&self) -> WorldGuard<'_> {
        WorldGuard {
            guard: self.lock_quiet(),
            wake: self.wake.as_deref(),
        }
    }

    /// The world, without waking the device (the device thread itself, read-only queries).
    fn lock_quiet(&self) -> MutexGuard<'_, state::World> {
        self.world
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // The device thread may be blocked with no timeout: let it see that we are gone.
        if let Some(w) = &self.wake {
            w.poke();
        }
    }
}

/// What every user handle (an [`Emulator`] clone, an opened surface) holds besides the
/// world, and the device thread never does: when the last one goes, the device thread is
/// told and joined. (The thread looks at the world through a `Weak`, and may hold it for a
/// moment; the world's last handle can therefore drop on it, which cannot join itself. This
/// one is dropped only by users, after their handle on the world: the thread's next look
/// fails, and it returns.)
#[derive(Debug)]
pub(crate) struct Owner {
    wake: Option<Arc<uar::Wake>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The world, to see that no handle but the device thread's momentary one is left.
    world: Weak<Shared>,
}

impl Drop for Owner {
    fn drop(&mut self) {
        if let Some(w) = &self.wake {
            w.poke();
        }
        let handle = self
            .thread
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        let Some(h) = handle else { return };
        if h.thread().id() == std::thread::current().id() {
            return;
        }
        // Every user handle has let the world go before its `Owner` (field order), so what
        // can still hold it is the device thread, for one step: wait for that (bounded), then
        // join. A holder that is not a user handle (none should exist) would keep the thread
        // running: it is then left to end when that holder goes, rather than waited for.
        for _ in 0..2000 {
            if self.world.strong_count() == 0 {
                let _ = h.join();
                return;
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

/// The world locked by a kernel command; dropping it wakes the device thread, which then
/// sees whatever the command changed (a QP moved to the error state has to be flushed, a
/// new QP may have receives waiting, ...), as the old polling device would have within
/// milliseconds.
struct WorldGuard<'a> {
    guard: MutexGuard<'a, state::World>,
    wake: Option<&'a uar::Wake>,
}

impl std::ops::Deref for WorldGuard<'_> {
    type Target = state::World;
    fn deref(&self) -> &state::World {
        &self.guard
    }
}

impl std::ops::DerefMut for WorldGuard<'_> {
    fn deref_mut(&mut self) -> &mut state::World {
        &mut self.guard
    }
}

impl Drop for WorldGuard<'_> {
    fn drop(&mut self) {
        if let Some(w) = self.wake {
            w.poke();
        }
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

/// The emulator: a set of HCAs on one fabric. Cheap to clone (an `Arc` inside).
#[derive(Clone, Debug)]
pub struct Emulator {
    shared: Arc<Shared>,
    /// Dropped after `shared` (fields drop in order): see [`Owner`].
    owner: Arc<Owner>,
}

impl Emulator {
    /// Create the emulator; in [`RunMode::Threaded`] this starts the device thread, which
    /// is joined when the last handle (emulator or opened surface) is dropped.
    pub fn new(cfg: EmuConfig) -> Emulator {
        Emulator::with_wake(cfg, WakeMode::from_env())
    }

    /// [`Emulator::new`] with the threaded device's wait chosen here instead of by
    /// `MLX5_EMU_WAKE` ([`WakeMode::Fault`] or [`WakeMode::Poll`]; ignored in stepped mode).
    pub fn with_wake(cfg: EmuConfig, wake: WakeMode) -> Emulator {
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
                            set_rcvbuf(&s, ROCE_RCVBUF);
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
                    eth: eth::Port {
                        sock: sock.as_ref().and_then(|_| eth::bind_raw(lid)),
                        ..Default::default()
                    },
                    sock,
                    hpc: Default::default(),
                }
            })
            .collect::<Vec<_>>();
        let mut hcas = hcas;
        if let (Some(t), Some(h)) = (&cfg.tap, hcas.first_mut()) {
            match eth::tap::Tap::open_in(&t.netns, &t.ifname) {
                Ok(tap) => h.eth.tap = Some(tap),
                Err(e) => eprintln!("mlx5-emu: no TAP attachment: {e}"),
            }
        }
        let udp_fds: Vec<i32> = hcas
            .iter()
            .filter_map(|h| h.sock.as_ref().map(std::os::fd::AsRawFd::as_raw_fd))
            .chain(
                hcas.iter()
                    .filter_map(|h| h.eth.sock.as_ref().map(std::os::fd::AsRawFd::as_raw_fd)),
            )
            .chain(
                hcas.iter()
                    .filter_map(|h| h.eth.tap.as_ref().map(eth::tap::Tap::raw_fd)),
            )
            .collect();
        let pcap = cfg.pcap.as_deref().and_then(pcap::open);
        let mode = cfg.mode;
        // The wake path needs the fault handler; without it (or without an eventfd) the
        // device polls as before.
        let wake = (mode == RunMode::Threaded && wake == WakeMode::Fault)
            .then(uar::Wake::new)
            .flatten()
            .filter(|_| mem::install_fault_handler());
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
            trace: Default::default(),
            wake: wake.clone(),
            cm: Default::default(),
            mcast: Default::default(),
        };
        let shared = Arc::new(Shared {
            world: Mutex::new(world),
            udp_fds,
            wake: wake.clone(),
            sched: std::sync::atomic::AtomicI32::new(SCHED_UNKNOWN),
            device_tid: std::sync::atomic::AtomicI32::new(0),
        });
        let owner = Arc::new(Owner {
            wake: wake.clone(),
            thread: Mutex::new(None),
            world: Arc::downgrade(&shared),
        });
        if mode == RunMode::Threaded {
            let weak = Arc::downgrade(&shared);
            let handle = std::thread::Builder::new()
                .name("mlx5-emu".into())
                .spawn(move || match wake {
                    Some(wake) => wake_thread(weak, wake),
                    None => device_thread(weak),
                })
                .ok();
            *owner
                .thread
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = handle;
        }
        Emulator { shared, owner }
    }

    /// Open a new "file" on HCA `hca` (like `open("/dev/infiniband/uverbsN")`). It becomes a
    /// ucontext after GET_CONTEXT; dropping the returned surface closes it and destroys
    /// every object it owns.
    pub fn open(&self, hca: usize) -> Result<Arc<dyn UverbsSurface>, Errno> {
        if hca >= self.shared.lock_quiet().hcas.len() {
            return Err(Errno(libc::ENODEV));
        }
        Ok(Arc::new(kernel::EmuFile::new(
            self.shared.clone(),
            self.owner.clone(),
            hca,
        )))
    }

    /// Number of HCAs.
    pub fn num_hcas(&self) -> usize {
        self.shared.lock_quiet().hcas.len()
    }

    /// Identity of HCA `i` (None if out of range).
    pub fn hca_info(&self, i: usize) -> Option<HcaInfo> {
        self.shared.lock_quiet().hcas.get(i).map(|h| h.info.clone())
    }

    /// Counters of HCA `i` (zeroes if out of range).
    pub fn counters(&self, i: usize) -> Counters {
        self.shared
            .lock_quiet()
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
        let mut w = self.shared.lock_quiet();
        device::step(&mut w)
    }

    /// How the device thread waits for work ([`WakeMode::Stepped`] in stepped mode).
    pub fn wake_mode(&self) -> WakeMode {
        match (&self.shared.wake, self.shared.lock_quiet().cfg.mode) {
            (_, RunMode::Stepped) => WakeMode::Stepped,
            (Some(_), _) => WakeMode::Fault,
            (None, _) => WakeMode::Poll,
        }
    }

    /// How the waking device thread is scheduled ([`DeviceSched`]; `MLX5_EMU_RT`).
    pub fn device_sched(&self) -> DeviceSched {
        match self.shared.sched.load(std::sync::atomic::Ordering::Acquire) {
            SCHED_UNKNOWN => DeviceSched::Unknown,
            SCHED_FAIR => DeviceSched::Fair,
            SCHED_DENIED => DeviceSched::FairDenied,
            p => DeviceSched::RealTime(p),
        }
    }

    /// The kernel thread id of the waking device thread (for `chrt`, `perf`, `/proc`), once
    /// it has started; None in stepped mode and for the polling device.
    pub fn device_thread_id(&self) -> Option<i32> {
        if self.device_sched() == DeviceSched::Unknown {
            return None;
        }
        Some(
            self.shared
                .device_tid
                .load(std::sync::atomic::Ordering::Relaxed),
        )
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

/// Receive buffer of a node's RoCE socket: a burst of 6,400 MTU-sized datagrams (100 UC
/// SENDs of 64 KiB) fits (each takes about 2.3 KiB of buffer).
pub(crate) const ROCE_RCVBUF: i32 = 32 << 20;

/// Ask for a receive buffer of `bytes`, so bursts of MTU-sized packets are not tail-dropped
/// (the fabric a RoCE NIC sits on is lossless; only the fault model drops). With
/// `CAP_NET_ADMIN` (CI runs as root) `SO_RCVBUFFORCE` gets it whole; otherwise the kernel caps
/// `SO_RCVBUF` at `net.core.rmem_max` (4 MiB on a default Debian).
fn set_rcvbuf(s: &std::net::UdpSocket, bytes: i32) {
    use std::os::fd::AsRawFd;
    let set = |opt: libc::c_int| {
        // SAFETY: setsockopt on a socket we own, with a pointer to a live c_int and its size.
        unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&raw const bytes).cast(),
                size_of::<i32>() as libc::socklen_t,
            )
        }
    };
    if set(libc::SO_RCVBUFFORCE) != 0 {
        set(libc::SO_RCVBUF);
    }
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
            let mut w = shared.lock_quiet();
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

/// How long the waking device keeps scanning after its last work item before it protects
/// the UAR pages and blocks (`MLX5_EMU_SPIN_US`, default below): a ping-pong partner in
/// this process usually rings again within microseconds, and a scan is far cheaper for it
/// than a fault plus a wake-up. Cut short as soon as the thread finds itself preempted.
const DEFAULT_SPIN: Duration = Duration::from_micros(50);

/// How long a real-time device thread may work after a wake-up before it continues in the
/// fair class (see [`Sched`]).
const RT_BURST: Duration = Duration::from_millis(2);

/// While contexts exist, the device wakes at least this often to keep the core-clock page
/// moving.
const CLOCK_TICK: Duration = Duration::from_millis(10);

fn spin_window() -> Duration {
    std::env::var("MLX5_EMU_SPIN_US")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(DEFAULT_SPIN, Duration::from_micros)
}

/// The waking device thread ([`WakeMode::Fault`]): step while there is work; keep scanning
/// a little longer (an adaptive window, see [`DEFAULT_SPIN`]); then drain the eventfd,
/// re-protect the UAR pages, scan once more and block on the eventfd, the UDP sockets and
/// the next timer deadline.
fn wake_thread(weak: Weak<Shared>, wake: Arc<uar::Wake>) {
    use std::time::Instant;
    short_slice();
    let mut sched = Sched::start();
    if let Some(s) = weak.upgrade() {
        // SAFETY: gettid has no arguments.
        let tid = unsafe { libc::gettid() };
        s.device_tid
            .store(tid, std::sync::atomic::Ordering::Relaxed);
        s.sched
            .store(sched.report(), std::sync::atomic::Ordering::Release);
    }
    // `MLX5_EMU_AVOID=0`: leave the device thread's CPUs alone (see `Sched::place`).
    let avoid = std::env::var("MLX5_EMU_AVOID").map_or(true, |v| v.trim() != "0");
    let mut wqes_before: u64 = 0;
    // A WQE ran on a device with a UDP fabric since the last wake-up that was not a
    // timeout: the answer from another process is what comes next (see `Sched::place`).
    let mut awaiting = false;
    // The ringing CPU at the previous wait.
    let mut last_fault_cpu = -1;
    let max_spin = spin_window();
    let mut spin = max_spin;
    let mut sleeps: u32 = 0;
    // When the device last ran out of work (None: it has work, or it just woke up).
    let mut idle_since: Option<Instant> = None;
    let mut last_iter = Instant::now();
    // When the thread last returned from its wait.
    let mut woke = last_iter;
    loop {
        let Some(shared) = weak.upgrade() else { return };
        let n = {
            let mut w = shared.lock_quiet();
            device::step(&mut w)
        };
        let now = Instant::now();
        // A gap between two scans: the scheduler took the core away, the CPUs are
        // oversubscribed, and spinning only delays the threads we wait for.
        let preempted = now.duration_since(last_iter) > Duration::from_micros(30);
        last_iter = now;
        if n > 0 {
            if idle_since.take().is_some() {
                // The spin found work: it pays; widen it again.
                spin = (spin * 2 + Duration::from_micros(1)).min(max_spin);
            }
            // Real-time only for the burst a wake-up brings: a device kept busy (a stream
            // of doorbells) shares its CPU fairly, and never starves anyone for long.
            if now.duration_since(woke) > RT_BURST {
                sched.fair();
            }
            continue;
        }
        let since = *idle_since.get_or_insert(now);
        if !preempted && now.duration_since(since) < spin {
            // A real-time thread spins as a fair one, or it keeps an application that
            // shares its core off the CPU for the whole window.
            sched.fair();
            std::hint::spin_loop();
            continue;
        }
        // The spin found nothing (or was preempted): narrow it; probe again now and then.
        spin /= 2;
        sleeps = sleeps.wrapping_add(1);
        if spin < Duration::from_micros(2) {
            spin = if sleeps % 64 == 0 {
                max_spin / 8
            } else {
                Duration::ZERO
            };
        }
        // Going to sleep. Order matters: drain, protect, scan. A store that landed before
        // the protection is seen by the scan; a later one faults and pokes the eventfd
        // after the drain, so the wait below returns at once.
        wake.drain();
        let pending = uar::protect_pages(&wake);
        let (n, deadline, clock) = {
            let mut w = shared.lock_quiet();
            let n = device::step(&mut w);
            let now_ns = w.now();
            let deadline = device::next_deadline(&w).map(|t| t.saturating_sub(now_ns));
            let wqes: u64 = w.hcas.iter().map(|h| h.counters.wqes_executed).sum();
            // A request went out on the UDP fabric since the last wait: its answer, a
            // packet, is what comes next.
            if !shared.udp_fds.is_empty() && wqes != wqes_before {
                awaiting = true;
            }
            wqes_before = wqes;
            (n, deadline, !w.contexts.is_empty())
        };
        if n > 0 {
            idle_since = None;
            last_iter = Instant::now();
            continue;
        }
        // A page just opened by a fault whose store has not landed yet: look again in a
        // moment (first by scanning for a few microseconds, the retry usually follows at
        // once; then by a short sleep, which lets the writer have the core if it shares
        // ours). Its store is seen then, or it is re-armed and faults again.
        let deadline = match pending {
            Some(p) => {
                let t = Instant::now();
                let mut found = false;
                while t.elapsed() < Duration::from_micros(3) {
                    std::hint::spin_loop();
                    let mut w = shared.lock_quiet();
                    if device::step(&mut w) > 0 {
                        found = true;
                        break;
                    }
                }
                if found {
                    idle_since = None;
                    last_iter = Instant::now();
                    continue;
                }
                let p = p.as_nanos() as u64;
                Some(deadline.map_or(p, |d| d.min(p)))
            }
            None => deadline,
        };
        let fds = shared.udp_fds.clone();
        drop(shared);
        let mut timeout = deadline.map(Duration::from_nanos);
        if clock || wake.unwatched.load(std::sync::atomic::Ordering::Relaxed) {
            let tick = if clock {
                CLOCK_TICK
            } else {
                Duration::from_millis(1)
            };
            timeout = Some(timeout.map_or(tick, |t| t.min(tick)));
        }
        // Blocking: real-time again, so that the wake-up preempts a busy-polling
        // application at once instead of waiting for the fair scheduler.
        sched.realtime();
        if avoid {
            // Off a CPU only once it rang twice in a row: threads ringing from both CPUs in
            // turn would make the device chase them (and scan each one's BlueFlame copy
            // from the other CPU while it is being written, see `tests/wake.rs`).
            let c = uar::fault_cpu();
            if awaiting || c == last_fault_cpu {
                sched.place(c, awaiting);
            }
            last_fault_cpu = c;
        }
        if wait(wake.fd(), &fds, timeout) {
            // A packet (the answer, or something else) or a doorbell: either way, what
            // comes next is decided again before the next wait.
            awaiting = false;
        }
        idle_since = None;
        last_iter = Instant::now();
        woke = last_iter;
    }
}

/// The waking device thread's scheduling class: `SCHED_FIFO` at a low priority
/// (`MLX5_EMU_RT`, default 1; `0` or `off` = never) while it blocks and works, the fair class
/// while it spins. A woken real-time thread preempts a fair one at once, so a doorbell's
/// wake-up does not wait for a busy-polling application's time slice; it never spins as a
/// real-time thread. Needs `CAP_SYS_NICE` or an `RLIMIT_RTPRIO`; without them (`EPERM`)
/// the thread stays in the fair class, and [`Emulator::device_sched`] says so. Before each
/// wait the thread also chooses its CPUs relative to the last doorbell fault's
/// (`MLX5_EMU_AVOID=0`: it doesn't), see [`Sched::place`].
struct Sched {
    /// The real-time priority, None: fair class only.
    prio: Option<i32>,
    /// Whether the thread is real-time now.
    rt: bool,
    /// Why there is no real-time priority (for the report).
    denied: bool,
    /// The CPUs the thread may run on (None: unknown).
    allowed: Option<libc::cpu_set_t>,
    /// The last placement: the ringing thread's CPU, and whether the thread was put on it
    /// (true) or kept off it (false).
    placed: (i32, bool),
}

impl Sched {
    fn start() -> Sched {
        let prio = match std::env::var("MLX5_EMU_RT").as_deref().map(str::trim) {
            Ok("0" | "off" | "no") => None,
            Ok(v) => Some(v.parse::<i32>().unwrap_or(1).clamp(1, 99)),
            Err(_) => Some(1),
        };
        // SAFETY: cpu_set_t is a plain bit array, all-zero is a valid (empty) set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: sched_getaffinity(0 = this thread, the size of `set`, a live `set`).
        let got = unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) };
        let allowed = (got == 0).then_some(set);
        let mut s = Sched {
            prio,
            rt: false,
            denied: false,
            allowed,
            placed: (-1, false),
        };
        if prio.is_some() && !s.set(true) {
            s.prio = None;
            s.denied = true;
        }
        s
    }

    /// The scheduling as [`Emulator::device_sched`] reports it.
    fn report(&self) -> i32 {
        match (self.prio, self.denied) {
            (Some(p), _) => p,
            (None, true) => SCHED_DENIED,
            (None, false) => SCHED_FAIR,
        }
    }

    fn fair(&mut self) {
        if self.rt {
            self.set(false);
        }
    }

    fn realtime(&mut self) {
        if !self.rt && self.prio.is_some() {
            self.set(true);
        }
    }

    /// Before a wait: where to be woken, relative to `cpu`, the CPU of the thread that rang
    /// last. Off it (`near` false) when the next event is a doorbell: a device woken on the
    /// ringing thread's CPU preempts that thread inside its fault handler, before its store
    /// is retried, and its spin never sees a doorbell, so every message costs a fault and a
    /// wake-up. On it (`near` true) when the next event is the answer to a request the device
    /// sent to another process: that thread only polls for it, while the other CPU holds the
    /// peer's application, which a wake-up there would stop just as it is about to answer.
    /// One `sched_setaffinity` when the placement changes; nothing if only one CPU is allowed.
    fn place(&mut self, cpu: i32, near: bool) {
        let Some(allowed) = self.allowed else { return };
        if cpu < 0 || (cpu, near) == self.placed || cpu as usize >= libc::CPU_SETSIZE as usize {
            return;
        }
        let c = cpu as usize;
        // SAFETY: `c` is below CPU_SETSIZE (checked above); `allowed` is a live cpu_set_t.
        if !unsafe { libc::CPU_ISSET(c, &allowed) } {
            return;
        }
        let mut set = allowed;
        if near {
            // SAFETY: cpu_set_t is a plain bit array; all-zero is the empty set.
            set = unsafe { std::mem::zeroed() };
            // SAFETY: `c` is below CPU_SETSIZE; `set` is a live cpu_set_t.
            unsafe { libc::CPU_SET(c, &mut set) };
        } else {
            // SAFETY: `c` is below CPU_SETSIZE; `set` is a live cpu_set_t.
            unsafe { libc::CPU_CLR(c, &mut set) };
        }
        // SAFETY: `set` is a live cpu_set_t.
        if unsafe { libc::CPU_COUNT(&set) } == 0 {
            return;
        }
        // SAFETY: sched_setaffinity(0 = this thread, the size of a live cpu_set_t, it).
        if unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &raw const set) } == 0
        {
            self.placed = (cpu, near);
        }
    }

    /// Switch this thread to `SCHED_FIFO` at `prio` or back to `SCHED_OTHER`.
    fn set(&mut self, rt: bool) -> bool {
        let (policy, prio) = match (rt, self.prio) {
            (true, Some(p)) => (libc::SCHED_FIFO, p),
            _ => (libc::SCHED_OTHER, 0),
        };
        let param = libc::sched_param {
            sched_priority: prio,
        };
        // SAFETY: sched_setscheduler(0 = this thread, a policy, a live sched_param).
        let ok = unsafe { libc::sched_setscheduler(0, policy, &raw const param) } == 0;
        if ok {
            self.rt = rt;
        }
        ok
    }
}

/// [`Emulator::device_sched`]: the device thread has not started (or is not a waking one).
const SCHED_UNKNOWN: i32 = -1;
/// The device thread runs in the fair class because `MLX5_EMU_RT` said so.
const SCHED_FAIR: i32 = 0;
/// The device thread runs in the fair class because the kernel refused `SCHED_FIFO`.
const SCHED_DENIED: i32 = -2;

/// How the threaded device is scheduled when it wakes ([`Emulator::device_sched`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceSched {
    /// Not known (yet): stepped mode, the polling device, or the thread has not started.
    Unknown,
    /// `SCHED_FIFO` at this priority while blocked or working, fair while spinning.
    RealTime(i32),
    /// The fair class, as `MLX5_EMU_RT=0` asks.
    Fair,
    /// The fair class: the kernel refused `SCHED_FIFO` (`EPERM`: no `CAP_SYS_NICE`).
    FairDenied,
}

/// Optionally (`MLX5_EMU_SLICE_US`, off by default) ask the fair scheduler for a short time
/// slice (`sched_attr.sched_runtime`, honoured by EEVDF kernels, 6.6 and later): a short
/// slice gives the device an early deadline, so on wake-up it preempts a busy-polling
/// application sooner. Best effort; no privilege needed. Off by default: not shown to help
/// on the loaded test machine, and the in-process p99 was better without it (3.0 against
/// 10,000 us in one run at load 10).
fn short_slice() {
    #[repr(C)]
    struct SchedAttr {
        size: u32,
        policy: u32,
        flags: u64,
        nice: i32,
        priority: u32,
        runtime: u64,
        deadline: u64,
        period: u64,
    }
    let us = std::env::var("MLX5_EMU_SLICE_US")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0);
    if us == 0 {
        return;
    }
    // Optionally (`MLX5_EMU_NICE`, where the process may: CAP_SYS_NICE) at a higher weight.
    // Off by default: at nice -10 the spinning device kept a same-core application off the
    // CPU for its whole spin window (in-process `mlx5 lat send` p50 97 us instead of 1.9 us).
    let want: i32 = std::env::var("MLX5_EMU_NICE")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    // SAFETY: getpriority has no pointer arguments; errno is irrelevant here (a failure
    // just leaves the nice value as it was).
    let base = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
    let nice = want.clamp(-20, 19).min(base);
    let attr = SchedAttr {
        size: size_of::<SchedAttr>() as u32,
        policy: libc::SCHED_OTHER as u32,
        flags: 0,
        nice,
        priority: 0,
        runtime: us * 1000,
        deadline: 0,
        period: 0,
    };
    // SAFETY: sched_setattr(0 = this thread, a live sched_attr of the size it states, 0).
    unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &raw const attr, 0) };
}

/// Block until `efd` or one of `fds` is readable, or `timeout` passes (`None`: forever).
/// Returns whether something became readable (false: the timeout, or an interruption).
fn wait(efd: i32, fds: &[i32], timeout: Option<Duration>) -> bool {
    let mut pfds: Vec<libc::pollfd> = std::iter::once(efd)
        .chain(fds.iter().copied())
        .map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs() as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let tsp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `pfds` is a valid array of pollfd for the call and `tsp` null or a live
    // timespec; the eventfd lives in the `Wake` we hold, the sockets while any handle
    // lives (a closed fd only makes ppoll report POLLNVAL).
    let n = unsafe {
        libc::ppoll(
            pfds.as_mut_ptr(),
            pfds.len() as libc::nfds_t,
            tsp,
            std::ptr::null(),
        )
    };
    n > 0
}
