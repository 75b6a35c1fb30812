//! The state both the emulated kernel and the emulated device read and write, below both:
//! the device's per-QP and fabric state (`device.rs`), a QP's path, the short lists of
//! scatter/gather entries, DEVX objects, the rdma_cm's ids and connections with their
//! messages and port claims, and the multicast groups. Nothing here imports `device/`,
//! `kernel/` or the world (`state.rs`, which holds all of it): the layering is in
//! `docs/architecture.md` and checked by `tests/layering.rs`.

pub(crate) mod checks;
pub(crate) mod cm;
pub(crate) mod cm_mad;
pub(crate) mod cm_ports;
pub(crate) mod device;
pub(crate) mod devx;
pub(crate) mod inline_vec;
pub(crate) mod mcast;
pub(crate) mod path;
