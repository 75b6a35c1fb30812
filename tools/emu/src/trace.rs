//! What the device did, stage by stage (a trace), and the host-device link traffic it caused
//! as PCIe would carry it (the link counters in [`crate::Counters`]).
//!
//! **Trace.** Off by default; [`Emulator::trace`] turns it on. Each hook in the device
//! (`device/*.rs`) is one branch on a flag while it is off, and builds its [`TraceEvent`] only
//! when it is on. Events are kept in memory in the order the device made them and taken with
//! [`Emulator::take_trace`]. In stepped mode the order is deterministic.
//!
//! **Link counters.** Always counted (a few additions per DMA): every MMIO write the device
//! consumes, every DMA read and write it makes, split into transaction layer packets the way a
//! PCIe link would split them:
//!
//! - an MMIO write is one posted write per 64-byte write-combining block (an 8-byte doorbell
//!   is one write of 8 bytes; a BlueFlame copy of a 64-byte WQE one write of 64 bytes);
//! - a DMA read of `len` bytes is one read request per [`MAX_READ_REQUEST`] bytes (never
//!   crossing a 4 KiB boundary), answered by one completion per [`MAX_PAYLOAD`]-aligned piece;
//! - a DMA write is one posted write per [`MAX_PAYLOAD`]-aligned piece.
//!
//! What counts as a DMA is what the emulated device reads or writes in host memory: WQE
//! fetches from the send ring, doorbell records, payload gathers, receive WQEs, data placed,
//! CQEs. The emulated device fetches a WQE from the ring even after a BlueFlame copy of it
//! (it checks the copy against the ring); a real ConnectX may skip that fetch.

use crate::{Counters, Emulator};

/// Largest read request (bytes) the model issues: the common PCIe Max_Read_Request_Size.
pub const MAX_READ_REQUEST: u64 = 512;
/// Largest TLP payload (bytes) of a completion or a posted write: the common
/// Max_Payload_Size.
pub const MAX_PAYLOAD: u64 = 256;
/// The size of one write-combining flush of an MMIO store sequence.
pub const WC_BLOCK: u64 = 64;

/// Number of pieces of `[addr, addr + len)` when it is cut at every multiple of `unit` (a
/// power of two).
#[inline(always)]
fn pieces(addr: u64, len: u64, unit: u64) -> u64 {
    if len == 0 {
        return 0;
    }
    let sh = unit.trailing_zeros();
    let last = addr.saturating_add(len - 1);
    (last >> sh) - (addr >> sh) + 1
}

/// Read requests for `[addr, addr + len)`: cut at 4 KiB boundaries, then into
/// [`MAX_READ_REQUEST`] chunks.
#[cold]
fn read_requests_crossing(addr: u64, len: u64) -> u64 {
    let mut req = 0;
    let (mut a, end) = (addr, addr.saturating_add(len));
    while a < end {
        let page_end = ((a >> 12) + 1) << 12;
        req += (end.min(page_end) - a).div_ceil(MAX_READ_REQUEST);
        a = end.min(page_end);
    }
    req
}

/// Count one DMA read of `len` bytes at `addr`.
#[inline(always)]
pub(crate) fn dma_read(c: &mut Counters, addr: u64, len: u64) {
    if len == 0 {
        return;
    }
    // Within one 4 KiB page (the usual case): one request per MAX_READ_REQUEST bytes.
    let req = if pieces(addr, len, 4096) == 1 {
        (len + MAX_READ_REQUEST - 1) >> MAX_READ_REQUEST.trailing_zeros()
    } else {
        read_requests_crossing(addr, len)
    };
    c.dma_read_requests += req;
    c.dma_read_completions += pieces(addr, len, MAX_PAYLOAD);
    c.dma_read_bytes += len;
}

/// Count one DMA write of `len` bytes at `addr`.
#[inline(always)]
pub(crate) fn dma_write(c: &mut Counters, addr: u64, len: u64) {
    c.dma_writes += pieces(addr, len, MAX_PAYLOAD);
    c.dma_write_bytes += len;
}

/// Count one MMIO store sequence of `len` bytes (a doorbell, a BlueFlame copy, a CQ arm).
#[inline(always)]
pub(crate) fn mmio(c: &mut Counters, len: u64) {
    c.mmio_writes += len.div_ceil(WC_BLOCK);
    c.mmio_bytes += len;
}

/// A decoded-enough view of one packet the device put on the wire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WirePacket {
    /// Sending HCA.
    pub src_hca: usize,
    /// Destination LID (node).
    pub dst_lid: u16,
    /// The packet from the BTH on, as carried in a RoCEv2 UDP datagram (ICRC at the end).
    pub bytes: Vec<u8>,
}

/// What happened at one stage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TraceWhat {
    /// The device consumed an MMIO write at a UAR doorbell: the 8-byte doorbell word and, for
    /// a BlueFlame copy, the rest of the copy (`bytes` then holds all of it).
    Mmio {
        /// QP the doorbell names.
        qpn: u32,
        /// Offset of the doorbell in the UAR page.
        offset: u32,
        /// The bytes written (8 for a doorbell, the whole copy for BlueFlame).
        bytes: Vec<u8>,
        /// A BlueFlame copy came with it.
        blueflame: bool,
    },
    /// The device read a doorbell record (producer or consumer index) from host memory.
    DbrecRead {
        /// Which queue: "sq", "rq", "srq" or "cq".
        queue: &'static str,
        /// QP, SRQ or CQ number.
        num: u32,
        /// Process address of the record word.
        addr: u64,
        /// The value read (host order, as the big-endian record holds it).
        value: u32,
    },
    /// The device fetched send WQE bytes from the ring (one DMA read).
    WqeFetch {
        /// QP number.
        qpn: u32,
        /// WQEBB counter of the first fetched WQEBB.
        wqe_index: u32,
        /// Process address read.
        addr: u64,
        /// The bytes read.
        bytes: Vec<u8>,
    },
    /// A payload DMA read (gather of a send data segment, READ response source, atomic
    /// operand).
    DmaRead {
        /// QP on whose behalf.
        qpn: u32,
        /// Address as the work request or packet gave it (virtual address of the MR).
        va: u64,
        /// Bytes read.
        len: u32,
        /// The key it was translated with.
        key: u32,
        /// Why: "gather", "read response", "atomic".
        purpose: &'static str,
    },
    /// A DMA write of data (placement of a SEND or WRITE, READ response data, atomic result).
    DmaWrite {
        /// QP on whose behalf.
        qpn: u32,
        /// Process address written.
        addr: u64,
        /// Bytes written.
        len: u32,
        /// Why: "send data", "write data", "read response", "atomic result", "atomic".
        purpose: &'static str,
        /// The first bytes written (up to 64).
        head: Vec<u8>,
    },
    /// A packet put on the wire.
    Packet(WirePacket),
    /// A check the responder made on a request packet.
    Check {
        /// Responder QP.
        qpn: u32,
        /// What was checked.
        check: &'static str,
        /// The values compared.
        detail: String,
        /// Passed.
        ok: bool,
    },
    /// The responder took a receive WQE.
    RecvWqe {
        /// QP number.
        qpn: u32,
        /// Its WQE counter.
        wqe_counter: u16,
        /// Its scatter entries as (virtual address, length, lkey).
        sges: Vec<(u64, u32, u32)>,
    },
    /// A CQE written into a CQ (the 64 bytes of its descriptor).
    Cqe {
        /// CQ number.
        cqn: u32,
        /// Producer counter of the entry.
        index: u32,
        /// Process address of the descriptor.
        addr: u64,
        /// The 64 bytes.
        bytes: Vec<u8>,
    },
    /// The requester retired a WQE on a response (ACK, READ data, atomic result).
    Retire {
        /// QP number.
        qpn: u32,
        /// WQE counter retired.
        wqe_counter: u16,
        /// A CQE is written for it (signaled or in error).
        cqe: bool,
    },
}

/// One stage of the device's work.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceEvent {
    /// Order of the event (0, 1, 2, ... from when tracing was turned on).
    pub seq: u64,
    /// HCA index within the emulator.
    pub hca: usize,
    /// Emulated clock (ns): virtual in stepped mode, since start in threaded mode.
    pub clock_ns: u64,
    /// Wall-clock time since tracing was turned on (ns).
    pub wall_ns: u64,
    /// The emulator function that did it, e.g. `mlx5_emu::device::fetch::run_sq`.
    pub func: &'static str,
    /// What happened.
    pub what: TraceWhat,
}

/// The device's trace recorder (in the world).
#[derive(Debug, Default)]
pub(crate) struct Recorder {
    on: bool,
    /// Link counting asked for ([`Emulator::count_link`]).
    link: bool,
    /// `on || link`: the one flag every hook tests first.
    active: bool,
    started: Option<std::time::Instant>,
    seq: u64,
    events: Vec<TraceEvent>,
}

/// Most events kept: a runaway trace stops growing here (the rest are dropped).
pub const MAX_EVENTS: usize = 1 << 20;

impl Recorder {
    /// Tracing is on.
    #[inline(always)]
    pub(crate) fn on(&self) -> bool {
        self.on
    }

    /// Tracing or link counting is on: the hooks count (and trace) only then.
    #[inline(always)]
    pub(crate) fn active(&self) -> bool {
        self.active
    }

    /// Record one event (call only when [`Recorder::on`]).
    #[cold]
    pub(crate) fn push(&mut self, hca: usize, clock_ns: u64, func: &'static str, what: TraceWhat) {
        if !self.on || self.events.len() >= MAX_EVENTS {
            return;
        }
        let wall_ns = self.started.map_or(0, |s| {
            s.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64
        });
        self.events.push(TraceEvent {
            seq: self.seq,
            hca,
            clock_ns,
            wall_ns,
            func,
            what,
        });
        self.seq += 1;
    }
}

/// What the device knows of one QP's send queue, for a tool that shows the host's side from
/// outside the driver (`mlx5 trace`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SqView {
    /// Process address of the send ring.
    pub sq_addr: u64,
    /// WQEBBs in the send ring.
    pub sq_wqebbs: u32,
    /// Process address of the doorbell record (receive word; the send word is at +4).
    pub dbrec_addr: u64,
    /// The doorbell record's receive word (big-endian in memory, host order here).
    pub rq_dbrec: u32,
    /// The doorbell record's send word.
    pub sq_dbrec: u32,
    /// The device's send-queue head (next WQEBB it will execute).
    pub sq_head: u32,
    /// The QP state (ib_qp_state value: 0 RESET ... 6 ERR).
    pub state: u32,
}

impl Emulator {
    /// Turn the device trace on (clearing what was recorded) or off. While it is on, the
    /// link counters count too.
    pub fn trace(&self, on: bool) {
        let mut w = self.shared.lock_quiet();
        let link = w.trace.link;
        w.trace = crate::trace::Recorder {
            on,
            link,
            active: on || link,
            started: on.then(std::time::Instant::now),
            seq: 0,
            events: Vec::new(),
        };
    }

    /// Count the link traffic (the link counters of [`Counters`]: MMIO writes, DMA reads and
    /// writes, WQE fetches, payload reads) from now on, or stop. Off by default, so that a
    /// device nobody measures pays one branch per hook.
    pub fn count_link(&self, on: bool) {
        let mut w = self.shared.lock_quiet();
        w.trace.link = on;
        w.trace.active = on || w.trace.on;
    }

    /// Take the events recorded so far (tracing stays as it is).
    pub fn take_trace(&self) -> Vec<TraceEvent> {
        std::mem::take(&mut self.shared.lock_quiet().trace.events)
    }

    /// Nanoseconds since tracing was turned on (0 when it is off): the time base of
    /// [`TraceEvent::wall_ns`], for stamping what a tool observes on the host's side.
    pub fn trace_clock(&self) -> u64 {
        self.shared.lock_quiet().trace.started.map_or(0, |s| {
            s.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64
        })
    }

    /// The device's view of its errors: the checks that failed (which key check, with the
    /// expected and the actual value; no receive WQE; no ACK; length), oldest first, the last
    /// [`crate::device::FAILED_CHECKS_KEPT`]. Recorded with tracing on or off (error paths only).
    pub fn failed_checks(&self) -> Vec<crate::device::FailedCheck> {
        self.shared
            .lock_quiet()
            .checks
            .failed
            .iter()
            .cloned()
            .collect()
    }

    /// The emulated clock (ns): virtual in stepped mode.
    pub fn clock(&self) -> u64 {
        self.shared.lock_quiet().now()
    }

    /// The send queue of QP `qpn` on HCA `hca` as the device sees it (None if there is no
    /// such QP). Reads the doorbell record from host memory.
    pub fn sq_view(&self, hca: usize, qpn: u32) -> Option<SqView> {
        let w = self.shared.lock_quiet();
        let q = w.hcas.get(hca)?.qps.get(&qpn)?;
        let rd = |a: u64| crate::mem::read_be32(a).unwrap_or(0);
        Some(SqView {
            sq_addr: q.sq_base,
            sq_wqebbs: q.sq_wqe_cnt,
            dbrec_addr: q.db,
            rq_dbrec: rd(q.db),
            sq_dbrec: rd(q.db + 4),
            sq_head: q.sq_head,
            state: u32::from(q.state),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_writes_split_like_pcie() {
        let mut c = Counters::default();
        // 64 bytes, aligned: one request, one completion.
        dma_read(&mut c, 0x1000, 64);
        assert_eq!((c.dma_read_requests, c.dma_read_completions), (1, 1));
        // 64 bytes straddling a 256-byte boundary: one request, two completions.
        dma_read(&mut c, 0x10e0, 64);
        assert_eq!((c.dma_read_requests, c.dma_read_completions), (2, 3));
        // 1024 bytes aligned: two requests (512 each), four completions (256 each).
        dma_read(&mut c, 0x2000, 1024);
        assert_eq!((c.dma_read_requests, c.dma_read_completions), (4, 7));
        // 100 bytes across a 4 KiB boundary: two requests.
        dma_read(&mut c, 0x2fd0, 100);
        assert_eq!(c.dma_read_requests, 6);
        assert_eq!(c.dma_read_bytes, 64 + 64 + 1024 + 100);
        dma_write(&mut c, 0x3000, 64);
        dma_write(&mut c, 0x3000, 512);
        assert_eq!((c.dma_writes, c.dma_write_bytes), (3, 576));
        dma_write(&mut c, 0x3000, 0);
        dma_read(&mut c, 0x3000, 0);
        assert_eq!((c.dma_writes, c.dma_read_requests), (3, 6));
        mmio(&mut c, 8);
        mmio(&mut c, 128);
        assert_eq!((c.mmio_writes, c.mmio_bytes), (3, 136));
    }

    #[test]
    fn the_recorder_keeps_nothing_while_off() {
        let mut r = Recorder::default();
        assert!(!r.on());
        r.push(
            0,
            0,
            "f",
            TraceWhat::Retire {
                qpn: 1,
                wqe_counter: 0,
                cqe: true,
            },
        );
        assert!(r.events.is_empty());
    }
}
