//! The device, stage by stage, as the hardware pipeline runs a work request.
//!
//! Everything here runs under the world lock, called from [`step`], which is the table of
//! contents: each stage is one file and keeps its own state.
//!
//! | stage | file |
//! |---|---|
//! | doorbell intake, CQ arm, send-queue scheduling and WQE fetch | [`fetch`] |
//! | WQE decode and validation, request packet building | [`execute`] |
//! | requester: PSNs, outstanding requests, responses, in-order retirement | [`requester`] |
//! | responder: PSN checks, duplicates, receive WQEs, execution, READ/atomic replies | [`responder`] |
//! | retransmission and timers (ACK timeout, RNR back-off) | [`timers`] |
//! | completion writer: CQEs, completion and async events, errors, flush | [`completion`] |
//! | DMA and memory translation (MR, PD, key and access checks) | [`dma`] |
//! | wire: fault injection, in-process fabric, UDP fabric, packet dispatch | [`wire`] |
//! | XRC and DC: transport segments, XRC targets, DC connections and DCT contexts | [`xrc`], [`dc`] |
//!
//! User memory (rings, doorbell records, data buffers) is accessed through [`crate::mem`], so
//! a buffer the user unmapped behind the device's back produces an error completion, not a
//! crash.

mod completion;
pub(crate) mod counters;
mod dc;
mod dma;
mod execute;
mod fetch;
mod raw;
mod requester;
mod responder;
mod timers;
mod wire;
mod xrc;

use std::collections::VecDeque;

use mlx5_hw::cqe::{Cqe64, ErrCqe, op_own};
use mlx5_hw::doorbell::{CQ_CI_MASK, WQ_PI_MASK};
use mlx5_hw::opcodes::{CqeOpcode, SendOpcode, Syndrome, VendorSyndrome};
use mlx5_hw::types::{Be16, Be32, Be64};
use mlx5_hw::wqe::{
    AtomicSeg, CtrlSeg, DataSeg, DatagramSeg, INLINE_SEG_FLAG, INVALID_LKEY, RaddrSeg,
};
use zerocopy::{FromBytes, FromZeros, IntoBytes};

use crate::config::RunMode;
use crate::fds::EvObj;
use crate::mem;
use crate::state::{Sgl, World, access, ev, qps, qpt};
use crate::transport::{
    self, AtomicEth, Grh, Packet, Packets, Payload, ROCE_PORT, Reth, UNKNOWN_QPN, aeth, decode,
    encode, node_ip, op, psn_before,
};
use crate::uar::take_word;

use completion::*;
use dma::*;
use execute::*;
use fetch::*;
use raw::*;
use requester::*;
use responder::*;
use timers::*;
use wire::*;
use xrc::*;

use crate::model::checks::{FAILED_CHECKS_KEPT, FailedCheck, KeyFault};
use crate::model::device::{Outgoing, Outstanding, RxMsg};
pub(crate) use timers::next_deadline;
pub(crate) use wire::read_ack_delay;

/// The BlueFlame half size of a UAR page for `bf_reg_size` (`fetch.rs`).
pub(crate) fn bf_half_of(bf_reg_size: u32) -> usize {
    if bf_reg_size == 0 {
        0
    } else {
        fetch::bf_half(bf_reg_size)
    }
}
/// The CM's MADs leave through the same wire (`kernel/ucma.rs`).
pub(crate) use wire::send_packet as send_gsi;

/// How far to look for work in one step before yielding the lock.
pub(super) const MAX_WQES_PER_QP_STEP: usize = 256;

/// One round of device work. Returns the number of work items done.
pub(crate) fn step(w: &mut World) -> usize {
    let mut work = 0;
    tick_clock(w);
    // wire: datagrams from other processes join the in-process delivery queue first, so an
    // answer that arrived while this thread was not running is seen before any timer.
    work += receive_udp(w);
    // raw Ethernet frames from other processes and from a TAP interface (raw.rs).
    work += receive_external(w);
    // fetch: doorbells and CQ arms written to the UAR pages since the last step.
    work += scan_doorbells(w);
    // fetch -> execute -> requester (-> wire): every rung send queue, WQE by WQE (a QP in
    // error flushes instead: completion).
    work += run_send_queues(w);
    // wire -> responder (requests) or requester (responses) -> completion, DMA.
    work += deliver_wire(w);
    // timers: ACK timeouts and RNR back-off -> retransmission (requester).
    work += run_timers(w);
    // the CM (kernel/ucma.rs): its retransmissions and timeouts.
    work += (w.kernel.cm_tick)(w);
    // wire: datagrams due for other processes.
    work += flush_udp(w);
    // lending: the threads whose doorbell notes this step took may retry their stores.
    for i in w.wire.acks.drain(..) {
        crate::watch::ack(i);
    }
    if work == 0 && w.cfg.mode == RunMode::Stepped {
        if let Some(t) = next_deadline(w) {
            if t > w.vclock {
                w.vclock = t;
                work = 1;
            }
        }
    }
    work
}

/// Keep the core-clock page (internal_timer_h/l, big-endian) moving.
fn tick_clock(w: &World) {
    let now = w.now();
    for c in w.contexts.values() {
        let mut b = [0u8; 8];
        b[..4].copy_from_slice(&((now >> 32) as u32).to_be_bytes());
        b[4..].copy_from_slice(&(now as u32).to_be_bytes());
        c.uar
            .store(c.uar_pages, crate::caps::CORE_CLOCK_OFFSET as usize, b);
    }
}

/// The first QP of HCA `hca` after `after` (the first one for None), in QPN order. The
/// device walks the QPs this way instead of collecting their numbers first.
pub(super) fn next_qpn(w: &World, hca: usize, after: Option<u32>) -> Option<u32> {
    use std::ops::Bound::{Excluded, Unbounded};
    let qps = &w.hcas[hca].qps;
    match after {
        None => qps.keys().next().copied(),
        Some(a) => qps.range((Excluded(a), Unbounded)).next().map(|(&q, _)| q),
    }
}

/// Every (HCA, QPN), in a stable order, walked without allocating: HCA by HCA, QPN by QPN.
/// QPs cannot come or go while the device runs (that takes the world lock).
pub(super) fn for_each_qp(w: &mut World, mut f: impl FnMut(&mut World, usize, u32)) {
    for hca in 0..w.hcas.len() {
        let mut at = None;
        while let Some(qpn) = next_qpn(w, hca, at) {
            f(w, hca, qpn);
            at = Some(qpn);
        }
    }
}
