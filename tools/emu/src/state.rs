//! The emulator's world: HCAs, contexts and every object, behind one lock.

use std::collections::{BTreeMap, VecDeque};

use crate::fds::EventChannel;
use crate::uar::UarRegion;
use crate::{Counters, EmuConfig, HcaInfo};

// The ABI constants the device and the kernel use: the header-checked modules of `mlx5-ffi`
// (under the short names the device code has always used).
pub(crate) use mlx5_ffi::uverbs::{access, event as ev, qp_state as qps, qp_type as qpt};

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
    pub(crate) devx: crate::kernel::devx::Devx,
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
}

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
    pub(crate) events: u64,
    pub(crate) async_events: u32,
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

/// The primary path of a connected QP.
#[derive(Clone, Debug, Default)]
pub(crate) struct Path {
    pub(crate) dlid: u16,
    pub(crate) dgid: [u8; 16],
    pub(crate) is_global: bool,
    pub(crate) sl: u8,
    pub(crate) port: u8,
    /// GRH fields (used on RoCE, where every packet carries them).
    pub(crate) sgid_index: u8,
    pub(crate) flow_label: u32,
    pub(crate) hop_limit: u8,
    pub(crate) tclass: u8,
    /// RoCE: the destination MAC resolved at modify time (kept as the QP context does;
    /// the in-process fabric routes by GID).
    #[allow(dead_code)]
    pub(crate) dmac: [u8; 6],
}

/// A list that keeps up to `N` elements in place and moves to the heap beyond that (a
/// scatter/gather list of a few entries costs no allocation). Dereferences to the slice.
#[derive(Clone, Debug)]
pub(crate) struct InlineVec<T: Copy + Default, const N: usize> {
    len: usize,
    inline: [T; N],
    /// All elements, once there are more than `N`.
    heap: Vec<T>,
}

impl<T: Copy + Default, const N: usize> Default for InlineVec<T, N> {
    fn default() -> Self {
        Self {
            len: 0,
            inline: [T::default(); N],
            heap: Vec::new(),
        }
    }
}

impl<T: Copy + Default, const N: usize> InlineVec<T, N> {
    /// Append `v`.
    pub(crate) fn push(&mut self, v: T) {
        if self.len < N {
            self.inline[self.len] = v;
        } else {
            if self.len == N {
                self.heap.extend_from_slice(&self.inline);
            }
            self.heap.push(v);
        }
        self.len += 1;
    }
}

impl<T: Copy + Default, const N: usize> std::ops::Deref for InlineVec<T, N> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        if self.len <= N {
            &self.inline[..self.len]
        } else {
            &self.heap
        }
    }
}

/// A scatter/gather list translated to process addresses: (address, length) pairs.
pub(crate) type Sgl = InlineVec<(u64, u32), 4>;

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
    pub(crate) rc: crate::device::QpTransport,
    /// SQD entered with `en_sqd_async_notify`: raise SQ_DRAINED when the SQ is idle.
    pub(crate) sqd_notify: bool,
    pub(crate) events_reported: u32,
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
    pub(crate) wire: crate::device::Wire,
    /// Datagrams for other processes (UDP fabric) waiting for their send time: delayed or
    /// held back for reordering by fault injection. In send order.
    pub(crate) outbox: VecDeque<crate::device::Outgoing>,
    /// Stepped mode: virtual nanoseconds.
    pub(crate) vclock: u64,
    pub(crate) started: std::time::Instant,
    pub(crate) rng: u64,
    /// Reused receive buffer of the UDP fabric.
    pub(crate) rx_buf: Vec<u8>,
    /// pcap capture of every packet put on the fabric.
    pub(crate) pcap: Option<std::io::BufWriter<std::fs::File>>,
    /// Recording of fetched send WQEs (tools/wqe-compare), off by default.
    pub(crate) wqe_log: crate::record::Recorder,
    /// The device trace (`trace.rs`), off by default.
    pub(crate) trace: crate::trace::Recorder,
    /// Threaded wake mode: the device's wake-up line, handed to every context's UAR region.
    pub(crate) wake: Option<std::sync::Arc<crate::uar::Wake>>,
    /// The rdma_cm ids, event channels and connections (`kernel/ucma.rs`).
    pub(crate) cm: crate::kernel::ucma::Cm,
    /// Multicast attachments (`kernel/mcast.rs`).
    pub(crate) mcast: crate::kernel::mcast::Groups,
    /// The device's view of its failed checks (`device/dma.rs`).
    pub(crate) checks: crate::device::Checks,
}

impl World {
    /// Current time in nanoseconds (virtual in stepped mode).
    pub(crate) fn now(&self) -> u64 {
        match self.cfg.mode {
            crate::RunMode::Stepped => self.vclock,
            crate::RunMode::Threaded => self.started.elapsed().as_nanos() as u64,
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

    /// Push an async event record `{element, event_type, reserved}` to a context.
    pub(crate) fn async_event(&mut self, ctx: u64, element: u64, kind: u32) {
        let Some(c) = self.contexts.get(&ctx) else {
            return;
        };
        let (hca, ch) = (c.hca, c.async_ch);
        let mut rec = [0u8; 16];
        rec[0..8].copy_from_slice(&element.to_ne_bytes());
        rec[8..12].copy_from_slice(&kind.to_ne_bytes());
        if let Some(Some(chan)) = self.channels.get_mut(ch) {
            chan.push(&rec);
        }
        self.hcas[hca].counters.async_events += 1;
    }
}

/// The valid GID table entry `index` of HCA `hca`'s port, if any. Here, below the kernel
/// (AH and QP attribute checks) and the device (a RoCE packet's source GID), so that
/// neither imports the other for it.
pub(crate) fn gid_at(w: &World, hca: usize, index: u32) -> Option<crate::GidEntry> {
    w.hcas[hca]
        .info
        .gid_table()
        .into_iter()
        .find(|e| e.index == index)
}

#[cfg(test)]
mod tests {
    use super::InlineVec;

    #[test]
    fn inline_vec_keeps_order_in_place_and_beyond() {
        let mut v = InlineVec::<(u64, u32), 4>::default();
        assert!(v.is_empty());
        for i in 0..10u32 {
            v.push((u64::from(i) * 16, i));
            assert_eq!(v.len(), i as usize + 1);
            assert!(
                v.iter()
                    .enumerate()
                    .all(|(k, &(a, l))| a == k as u64 * 16 && l == k as u32)
            );
        }
        let c = v.clone();
        assert_eq!(&c[..], &v[..]);
    }
}
