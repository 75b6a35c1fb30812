//! Multicast attachments: written by the kernel (`kernel/mcast.rs`, ATTACH/DETACH_MCAST),
//! read by the device when it fans a UD SEND out to a group (`device/wire.rs`).

use std::collections::BTreeMap;

/// The attachments: (HCA, MGID) -> the QP numbers attached, in attach order.
pub(crate) type Groups = BTreeMap<(usize, [u8; 16]), Vec<u32>>;

/// The QP number of a UD multicast destination.
pub(crate) const MCAST_QPN: u32 = 0xff_ffff;
