//! The emulator's world: HCAs, contexts and every object, behind one lock.

use std::collections::{BTreeMap, VecDeque};

use crate::config::{EmuConfig, HcaInfo, RunMode};
use crate::counters::Counters;
use crate::fds::EventChannel;
use crate::roce::GidEntry;
use crate::transport::Packet;
use crate::uar::UarRegion;

// The ABI constants the device and the kernel use: the header-checked modules of `mlx5-ffi`
// (under the short names the device code has always used).
pub(crate) use mlx5_ffi::uverbs::{access, event as ev, qp_state as qps, qp_type as qpt};

pub(crate) use crate::model::inline_vec::Sgl;
pub(crate) use crate::model::path::Path;

/// What a context handle names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Obj {
    Pd(u32),
    Mr(u32),
    Cq(u32),
    Qp(u32),
    Srq(u32),
    Ah(u32),
    /// A dynamic UAR, by page id.
    Uar(u32),
    /// A flow steering rule, by flow number (`eth::Rule::id`).
    Flow(u32),
    /// An XRC domain, by number (`xrc_dc.rs`).
    Xrcd(u32),
}

impl Obj {
    /// The object number (PDN, MR index, CQN, QPN, SRQN, AH id, UAR page id).
    pub(crate) fn id(self) -> u32 {
        match self {
            Obj::Pd(n)
            | Obj::Mr(n)
            | Obj::Cq(n)
            | Obj::Qp(n)
            | Obj::Srq(n)
            | Obj::Ah(n)
            | Obj::Uar(n)
            | Obj::Flow(n)
            | Obj::Xrcd(n) => n,
        }
    }
}

/// One open "file" after GET_CONTEXT.
#[derive(Debug)]
pub(crate) struct Context {
    pub(crate) hca: usize,
    pub(crate) cqe_version: u8,
    pub(crate) tot_bfregs: u32,
    pub(crate) num_low_lat: u32,
    pub(crate) bfreg_users: Vec<u32>,
    /// Static UAR pages (memfd pages 0..uar_pages); the clock pages follow.
    pub(crate) uar_pages: usize,
    /// Pages the device watches for doorbells (static ones, then allocated dynamic ones).
    pub(crate) uar_active: Vec<usize>,
    /// Dynamic-UAR mode (tot_bfregs = 0).
    pub(crate) dyn_uar: bool,
    /// Dynamic UARs by page id: (memfd page, mmap page offset).
    pub(crate) dyn_pages: BTreeMap<u32, (usize, u64)>,
    pub(crate) next_dyn: u32,
    pub(crate) uar: UarRegion,
    pub(crate) async_ch: usize,
    pub(crate) comp_by_fd: BTreeMap<i32, usize>,
    pub(crate) handles: BTreeMap<u32, Obj>,
    pub(crate) next_handle: u32,
    /// DEVX umems, objects and event channels (`kernel/devx.rs`).
    pub(crate) devx: crate::model::devx::Devx,
}

/// A protection domain.
#[derive(Debug)]
pub(crate) struct Pd {
    pub(crate) ctx: u64,
    pub(crate) users: u32,
}

/// A registered memory region.
#[derive(Clone, Debug)]
pub(crate) struct Mr {
    pub(crate) ctx: u64,
    pub(crate) pdn: u32,
    pub(crate) start: u64,
    pub(crate) length: u64,
    pub(crate) iova: u64,
    pub(crate) access: u32,
    pub(crate) key: u32,
    /// An indirect key's translation (DEVX CREATE_MKEY in KLM or KSM mode); None for a
    /// registered region, whose `start` is the process address of `iova`.
    pub(crate) indirect: Option<Box<Indirect>>,
}

/// The translation of an indirect memory key: the key's address space, from its start
/// address on, is the concatenation of its entries, each a range of another (direct) key.
#[derive(Clone, Debug)]
pub(crate) struct Indirect {
    /// KSM: every entry is `1 << log` bytes (the entry of an offset is `offset >> log`).
    /// None for KLM, whose entries carry their own lengths.
    pub(crate) ksm_log: Option<u8>,
    /// (key, address under that key, bytes, offset of the entry in the indirect space).
    pub(crate) entries: Vec<KlmEntry>,
}

/// One entry of an [`Indirect`] key.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KlmEntry {
    /// The direct key the entry's bytes are accessed through.
    pub(crate) key: u32,
    /// The address (under `key`) of the entry's first byte.
    pub(crate) addr: u64,
    /// The entry's length in bytes.
    pub(crate) len: u64,
    /// The offset of the entry's first byte from the indirect key's start.
    pub(crate) at: u64,
}

/// What the emulated kernel writes into a new CQ's arm doorbell record (the second word of
/// its doorbell record): no arm word has its two top bits set (the sequence number is 2 bits
/// at 28), so the first arm, whose word may be 0, is told from "never armed".
pub(crate) const ARM_DBR_UNSET: u32 = 0xffff_ffff;

/// A completion queue.
#[derive(Debug)]
pub(crate) struct Cq {
    pub(crate) ctx: u64,
    pub(crate) user_handle: u64,
    pub(crate) buf: u64,
    pub(crate) db: u64,
    pub(crate) ncqe: u32,
    pub(crate) cqe_size: u32,
    /// Free-running producer count.
    pub(crate) pi: u32,
    /// The consumer index last read from the doorbell record (re-read when full).
    pub(crate) ci_seen: u32,
    pub(crate) channel: Option<usize>,
    /// Armed: Some(solicited_only).
    pub(crate) armed: Option<bool>,
    pub(crate) armed_sn: u8,
    pub(crate) last_fired_sn: Option<u8>,
    /// The arm doorbell record's value last taken as an arm (`device/fetch.rs`,
    /// `arms_from_records`); [`ARM_DBR_UNSET`] until the first.
    pub(crate) arm_dbr_seen: u32,
    /// `arm_dbr_seen` came from the record and its doorbell has not been seen yet (it was
    /// counted then; the doorbell, if it comes, is not counted again).
    pub(crate) arm_dbr_unrung: bool,
    pub(crate) ignore_overrun: bool,
    pub(crate) in_error: bool,
    pub(crate) users: u32,
}

/// Receive-side bookkeeping of an SRQ.
#[derive(Debug)]
pub(crate) struct Srq {
    pub(crate) ctx: u64,
    pub(crate) pdn: u32,
    pub(crate) user_handle: u64,
    pub(crate) buf: u64,
    pub(crate) db: u64,
    pub(crate) wqe_cnt: u32,
    pub(crate) stride: u32,
    pub(crate) max_wr: u32,
    pub(crate) max_sge: u32,
    pub(crate) limit: u32,
    /// Free-running count of WQEs consumed.
    pub(crate) consumed: u32,
    /// Index of the next WQE the device will use (follows next_wqe_index links).
    pub(crate) head: u16,
    pub(crate) users: u32,
}

/// An address handle. (UD WQEs carry the address vector themselves; the kernel object only
/// pins the PD and remembers the attributes it was created with.)
#[derive(Clone, Debug)]
#[allow(dead_code)]
pub(crate) struct Ah {
    pub(crate) ctx: u64,
    pub(crate) pdn: u32,
    pub(crate) dlid: u16,
    pub(crate) dgid: [u8; 16],
    pub(crate) is_global: bool,
    pub(crate) sgid_index: u8,
    /// RoCE: the destination MAC the kernel resolved.
    pub(crate) dmac: [u8; 6],
}

/// A queue pair.
#[derive(Debug, Default)]
pub(crate) struct Qp {
    pub(crate) ctx: u64,
    pub(crate) qpn: u32,
    pub(crate) qp_type: u8,
    pub(crate) state: u8,
    pub(crate) pdn: u32,
    pub(crate) send_cq: u32,
    pub(crate) recv_cq: u32,
    pub(crate) srq: Option<u32>,
    pub(crate) user_handle: u64,
    pub(crate) sq_sig_all: bool,
    pub(crate) buf: u64,
    pub(crate) db: u64,
    /// Address of the SQ ring: after the RQ in `buf`, or (RAW_PACKET) its own buffer.
    pub(crate) sq_base: u64,
    pub(crate) sq_wqe_cnt: u32,
    pub(crate) rq_wqe_cnt: u32,
    pub(crate) rq_wqe_shift: u32,
    /// mlx5_ib's `rq.max_gs`: data segments per receive WQE, less one for a WQE signature
    /// (0 without an RQ). QUERY_QP reports it as `max_recv_sge`.
    pub(crate) rq_max_gs: u32,
    pub(crate) uidx: u32,
    pub(crate) bfreg: u32,
    pub(crate) scatter_cqe: bool,
    /// Requester scatter-to-CQE (READ/atomic results) is on: scatter flag and all-signaled.
    pub(crate) req_scatter: bool,
    pub(crate) cap: [u32; 5],
    // attributes
    pub(crate) port: u8,
    pub(crate) pkey_index: u16,
    pub(crate) qkey: u32,
    pub(crate) access: u32,
    pub(crate) path_mtu: u8,
    pub(crate) dest_qpn: u32,
    pub(crate) rq_psn: u32,
    pub(crate) sq_psn: u32,
    pub(crate) timeout: u8,
    pub(crate) retry_cnt: u8,
    pub(crate) rnr_retry: u8,
    pub(crate) min_rnr_timer: u8,
    pub(crate) max_rd_atomic: u8,
    pub(crate) max_dest_rd_atomic: u8,
    pub(crate) path: Path,
    // device state
    /// Free-running WQEBB counter of the next send WQE to execute.
    pub(crate) sq_head: u32,
    /// Producer index (16 bits) seen at the last doorbell MMIO.
    pub(crate) sq_rung: u16,
    /// Receive WQEs consumed (free-running).
    pub(crate) rq_head: u32,
    /// Receive producer index (16 bits) last read from the doorbell record; while it is
    /// ahead of `rq_head` the record need not be read again (the driver only moves it on).
    pub(crate) rq_pi_seen: u16,
    /// Receive WQEs fetched together with that read (as hardware prefetches): the ones
    /// from counter `.0` on, `1 << rq_wqe_shift` bytes each. Cleared on reset.
    pub(crate) rq_prefetch: (u32, Vec<u8>),
    pub(crate) rc: crate::model::device::QpTransport,
    /// SQD entered with `en_sqd_async_notify`: raise SQ_DRAINED when the SQ is idle.
    pub(crate) sqd_notify: bool,
    /// XRC and DC (`xrc_dc.rs`): what kind of HPC transport this RC-engine QP is.
    pub(crate) hpc: crate::xrc_dc::QpExt,
}

/// One emulated HCA.
#[derive(Debug)]
pub(crate) struct Hca {
    pub(crate) info: HcaInfo,
    pub(crate) counters: Counters,
    pub(crate) pds: BTreeMap<u32, Pd>,
    pub(crate) mrs: BTreeMap<u32, Mr>,
    pub(crate) cqs: BTreeMap<u32, Cq>,
    pub(crate) qps: BTreeMap<u32, Qp>,
    pub(crate) srqs: BTreeMap<u32, Srq>,
    pub(crate) ahs: BTreeMap<u32, Ah>,
    pub(crate) next_id: u32,
    pub(crate) next_key: u32,
    /// UDP fabric: the bound RoCEv2 socket of this HCA (127.1.0.<lid>:4791), non-blocking.
    pub(crate) sock: Option<std::net::UdpSocket>,
    /// The Ethernet port: steering table, raw-frame socket, TAP attachment (`eth`).
    pub(crate) eth: crate::eth::Port,
    /// XRC domains, XRC SRQs, DC counters (`xrc_dc.rs`).
    pub(crate) hpc: crate::xrc_dc::HcaExt,
}

/// Everything, behind the emulator's one lock.
#[derive(Debug)]
pub(crate) struct World {
    pub(crate) cfg: EmuConfig,
    pub(crate) hcas: Vec<Hca>,
    pub(crate) contexts: BTreeMap<u64, Context>,
    pub(crate) channels: Vec<Option<EventChannel>>,
    pub(crate) next_ctx: u64,
    /// Packets in flight on the in-process fabric, and the device's reusable buffers.
    pub(crate) wire: crate::model::device::Wire,
    /// Datagrams for other processes (UDP fabric) waiting for their send time: delayed or
    /// held back for reordering by fault injection. In send order.
    pub(crate) outbox: VecDeque<crate::model::device::Outgoing>,
    /// Stepped mode: virtual nanoseconds.
    pub(crate) vclock: u64,
    pub(crate) started: std::time::Instant,
    pub(crate) rng: u64,
    /// Reused receive buffer of the UDP fabric.
    pub(crate) rx_buf: Vec<u8>,
    /// pcap capture of every packet put on the fabric.
    pub(crate) pcap: Option<crate::pcap::Capture>,
    /// Recording of fetched send WQEs (tools/wqe-compare), off by default.
    pub(crate) wqe_log: crate::record::Recorder,
    /// The device trace (`trace.rs`), off by default.
    pub(crate) trace: crate::trace::Recorder,
    /// Threaded wake mode: the device's wake-up line, handed to every context's UAR region.
    pub(crate) wake: Option<std::sync::Arc<crate::uar::Wake>>,
    /// The rdma_cm ids, event channels and connections (`kernel/ucma.rs`).
    pub(crate) cm: crate::model::cm::Cm,
    /// Multicast attachments (`model/mcast.rs`, written by `kernel/mcast.rs`).
    pub(crate) mcast: crate::model::mcast::Groups,
    /// The kernel's parts that run on the device's clock and wire.
    pub(crate) kernel: KernelHooks,
    /// The device's view of its failed checks (`model/checks.rs`, written by `device/dma.rs`).
    pub(crate) checks: crate::model::checks::Checks,
}

/// The kernel's parts that run on the device's clock and wire (the CM, `kernel/ucma.rs`),
/// handed to the world when the emulator is made (`lib.rs`), so that the device calls them
/// without importing the kernel, as hardware raises an interrupt the kernel has hooked.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KernelHooks {
    /// The CM's retransmissions and timeouts; returns the work done.
    pub(crate) cm_tick: fn(&mut World) -> usize,
    /// When the CM next has to retransmit or time out (None: nothing pending).
    pub(crate) cm_deadline: fn(&World) -> Option<u64>,
    /// A packet the device delivered to QP1 (a CM MAD).
    pub(crate) gsi_receive: fn(&mut World, &Packet),
}

impl World {
    /// Current time in nanoseconds (virtual in stepped mode).
    pub(crate) fn now(&self) -> u64 {
        match self.cfg.mode {
            RunMode::Stepped => self.vclock,
            RunMode::Threaded => self.started.elapsed().as_nanos() as u64,
        }
    }

    /// Deterministic pseudo-random number (xorshift64*).
    pub(crate) fn rand(&mut self) -> u64 {
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Push an async event record `{element, event_type, reserved}` of `obj` to a context
    /// (counted for `obj` once the user reads it: `EventChannel::release`).
    pub(crate) fn async_event(
        &mut self,
        ctx: u64,
        element: u64,
        kind: u32,
        obj: crate::fds::EvObj,
    ) {
        let Some(c) = self.contexts.get(&ctx) else {
            return;
        };
        let (hca, ch) = (c.hca, c.async_ch);
        let mut rec = [0u8; 16];
        rec[0..8].copy_from_slice(&element.to_ne_bytes());
        rec[8..12].copy_from_slice(&kind.to_ne_bytes());
        if let Some(Some(chan)) = self.channels.get_mut(ch) {
            chan.push_for(&rec, obj);
        }
        self.hcas[hca].counters.async_events += 1;
    }
}

/// The valid GID table entry `index` of HCA `hca`'s port, if any. Here, below the kernel
/// (AH and QP attribute checks) and the device (a RoCE packet's source GID), so that
/// neither imports the other for it.
pub(crate) fn gid_at(w: &World, hca: usize, index: u32) -> Option<GidEntry> {
    w.hcas[hca]
        .info
        .gid_table()
        .into_iter()
        .find(|e| e.index == index)
}
