//! The ledger: what a queue records for each work request it posts and the completion poller
//! reads back when a CQE names it -- the WR id, ordinal and opcode by send WQEBB slot
//! ([`SqShared`]), the wr_id by receive WQE ([`RqShared`], [`SrqShared`]), the tails the poller
//! moves, and the read-back of payloads the device scattered into a CQE.
//!
//! It sits below both sides: the queues (`qp/sq`, `qp/rq.rs`, `srq.rs`) write it, the CQ
//! (`cq.rs`) reads it, and neither imports the other (docs/architecture.md, "Inside the
//! driver"). Each record is written by one side and read by the other through atomics: the
//! poster's stores are ordered before the doorbell record that publishes the WQE, and the
//! poller reads them only after the CQE that names it.

mod recv;
mod send;

pub(crate) use recv::{RqShared, ScatterTarget, SrqShared, publish_recv, write_scatter};
pub(crate) use send::{REQ_WC_BY_SEND_OP, SqScatter, SqShared};
