//! The device's own state of each QP and of the fabric, by stage (each stage's file under
//! `device/` keeps its part here, so that the world, which holds it, stands below the device).
//!
//! | part | stage |
//! |---|---|
//! | [`ReqState`], [`Outstanding`] | requester (`device/requester.rs`) |
//! | [`TimerState`] | timers (`device/timers.rs`) |
//! | [`RespState`], [`RxMsg`] | responder (`device/responder.rs`) |
//! | [`Wire`], [`Outgoing`] | wire (`device/wire.rs`) |

use std::collections::VecDeque;

use mlx5_hw::opcodes::Syndrome;

use super::inline_vec::Sgl;
use crate::transport::{Packet, Packets};

/// Transport state of one QP, each part owned by its stage. The retry counters are the
/// kernel's to reset (modify to RTS); the rest is the device's.
#[derive(Clone, Debug, Default)]
pub(crate) struct QpTransport {
    /// Transport retries left before RETRY_EXC.
    pub(crate) retries_left: u8,
    /// RNR retries left before RNR_RETRY_EXC.
    pub(crate) rnr_left: u8,
    pub(crate) req: ReqState,
    pub(crate) timer: TimerState,
    pub(crate) resp: RespState,
}

/// The requester's state of one RC QP.
#[derive(Clone, Debug, Default)]
pub(crate) struct ReqState {
    /// Sent, not yet completed requests, in PSN (= WQE) order.
    pub(crate) outstanding: VecDeque<Outstanding>,
    /// The highest PSN acknowledged so far.
    pub(crate) acked: Option<u32>,
    /// The next PSN to transmit (None: everything posted is on the wire).
    pub(crate) tx_next: Option<u32>,
    /// The highest PSN transmitted (for a READ: the last response PSN it asked for): the
    /// upper edge of the window of PSNs a response may name.
    pub(crate) sent_high: Option<u32>,
    /// The resume point of the last go-back-N an implied NAK caused.
    pub(crate) restarted_at: Option<u32>,
    /// A WQE failed behind outstanding requests: execute nothing more.
    pub(crate) halted: bool,
}

/// One outstanding RC request (sent, not yet acknowledged/answered).
#[derive(Clone, Debug)]
pub(crate) struct Outstanding {
    /// First and last PSN of the request (a READ spans its response packets).
    pub(crate) psn: u32,
    pub(crate) last_psn: u32,
    pub(crate) wqe_idx: u16,
    pub(crate) opcode: u8,
    pub(crate) signaled: bool,
    /// The request packets, for retransmission.
    pub(crate) packets: Packets,
    /// Local scatter list for READ/atomic responses: (addr, len) already translated.
    pub(crate) local: Sgl,
    pub(crate) len: u32,
    pub(crate) done: bool,
    /// Completes with this error (WR_FLUSH: flushed) when it reaches the front.
    pub(crate) error: Option<Syndrome>,
    pub(crate) is_read_like: bool,
    /// READ/atomic: the data returned so far, and the next response PSN expected.
    pub(crate) read_buf: Vec<u8>,
    pub(crate) read_next: u32,
    /// READ: the path MTU its responses come in (0 for other requests) and the remote
    /// address of its first byte, to resume after a lost response.
    pub(crate) read_mtu: u32,
    pub(crate) read_va: u64,
}

/// The timers of one RC QP.
#[derive(Clone, Debug, Default)]
pub(crate) struct TimerState {
    /// When the ACK timeout expires.
    pub(crate) deadline: Option<u64>,
    /// Time before which no retransmission happens (RNR back-off).
    pub(crate) rnr_wait_until: Option<u64>,
    /// PSN from which to retransmit when `rnr_wait_until` expires.
    pub(crate) rnr_from: u32,
    /// When the requester last made progress (or started waiting): threaded mode fails a
    /// request with RETRY_EXC only when its retries are used up AND this is longer ago
    /// than the longest timeout the IB specification allows for them (see
    /// [`retry_budget_ns`]).
    pub(crate) silent_since: u64,
}

/// The responder's state of one RC/UC QP.
#[derive(Clone, Debug, Default)]
pub(crate) struct RespState {
    /// Cached atomic results by PSN (at-most-once).
    pub(crate) atomic_cache: VecDeque<(u32, u64)>,
    /// Whether a NAK-sequence-error was already sent for the current gap.
    pub(crate) nak_sent: bool,
    /// The message in progress.
    pub(crate) rx: Option<RxMsg>,
}

/// A multi-packet message being received (responder).
#[derive(Clone, Debug, Default)]
pub(crate) struct RxMsg {
    pub(crate) write: bool,
    /// SEND: the receive WQE's translated scatter list, counter, SRQ number.
    pub(crate) sgl: Sgl,
    pub(crate) ctr: u16,
    pub(crate) srqn: u32,
    pub(crate) has_wqe: bool,
    /// Bytes placed so far (SEND: including a UD GRH area).
    pub(crate) offset: u64,
    /// WRITE: translated start address and RETH length.
    pub(crate) addr: u64,
    /// WRITE under an indirect key whose entries scatter it: `sgl` holds the pieces and
    /// `addr` is unused.
    pub(crate) scattered: bool,
    pub(crate) total: u64,
}

/// The in-process fabric, plus buffers the device reuses from one work item to the next
/// so that the steady-state data path does not allocate. A user of a buffer takes it
/// (`std::mem::take`) and puts it back; a nested user just finds an empty one.
#[derive(Debug, Default)]
pub(crate) struct Wire {
    /// Packets in flight: (deliver_at, packet).
    pub(crate) queue: VecDeque<(u64, Packet)>,
    /// The send WQE being executed.
    pub(crate) wqe: Vec<u8>,
    /// The send-queue WQEBBs fetched after a doorbell.
    pub(crate) prefetch: Vec<u8>,
    /// The receive WQE being consumed.
    pub(crate) recv: Vec<u8>,
    /// Packets a requester is about to transmit.
    pub(crate) tx: Vec<Packet>,
    /// Lending: the fault-table slots whose notes this step took, acknowledged at its end
    /// (`device/fetch.rs`, `take_notes`).
    pub(crate) acks: Vec<usize>,
}

/// One encoded RoCEv2 datagram bound for another process, not yet sent.
#[derive(Debug)]
pub(crate) struct Outgoing {
    /// When to send it (virtual time in stepped mode, real time in threaded mode).
    pub(crate) due: u64,
    /// Held back by reorder fault injection: goes out after the next datagram queued
    /// behind it, or at `due` if none comes.
    pub(crate) held: bool,
    /// A plain RC ACK held back for coalescing (`wire.rs`, `ACK_DELAY`): goes out with the
    /// next datagram queued to the same destination, or at `due`.
    pub(crate) ack: bool,
    /// The sending HCA.
    pub(crate) src: usize,
    /// Destination `127.1.0.<lid>:4791`.
    pub(crate) to: std::net::SocketAddrV4,
    /// The datagram (BTH onwards, ICRC included).
    pub(crate) bytes: Vec<u8>,
}
