//! A DEVX context's objects: umems, the objects the firmware made, event channels
//! (`kernel/devx.rs` answers the commands that change them).

use crate::fds::EventChannel;

/// A registered user memory range.
#[derive(Debug)]
pub(crate) struct Umem {
    pub(crate) handle: u32,
    pub(crate) addr: u64,
    pub(crate) len: u64,
    /// QPs whose WQ or doorbell record lies in it (a busy umem cannot be deregistered).
    pub(crate) users: u32,
}

/// A DEVX object: what the firmware made, and the umems it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Object {
    /// A QP (RC or DC initiator) by QPN, with its WQ and doorbell umem ids.
    Qp { qpn: u32, wq: u32, dbr: u32 },
    /// A DC target by DCT number.
    Dct { dctn: u32 },
    /// A receive memory pool (an SRQ on umems) by SRQ number.
    Rmp { srqn: u32, wq: u32, dbr: u32 },
    /// An indirect memory key by its index (`kernel/devx_mkey.rs`).
    Mkey { idx: u32 },
}

/// A DEVX event channel: the emulator's end and the user's descriptor.
#[derive(Debug)]
pub(crate) struct Channel {
    pub(crate) ch: EventChannel,
    /// The channel was created with `OMIT_DATA`: each event is its 8-byte cookie only.
    pub(crate) omit_data: bool,
    /// (object, event type, cookie).
    pub(crate) subs: Vec<(u32, u16, u64)>,
}

/// A context's DEVX state.
#[derive(Debug, Default)]
pub(crate) struct Devx {
    /// By umem id.
    pub(crate) umems: std::collections::BTreeMap<u32, Umem>,
    pub(crate) next_umem: u32,
    /// By handle.
    pub(crate) objects: std::collections::BTreeMap<u32, Object>,
    pub(crate) channels: Vec<Channel>,
}
