//! The rdma_cm state of the emulator (in the world): event channels, ids, multicast joins and
//! the IB CM's connections. `kernel/ucma.rs` answers the commands and runs the CM on it.

use std::collections::{BTreeMap, VecDeque};
use std::os::fd::{OwnedFd, RawFd};
use std::sync::{Arc, Condvar};

use mlx5_ffi::ucma::{RdmaUcmEventResp, SockAddr};

use crate::model::cm_mad::CmMsg;
use crate::model::cm_ports::PortClaim;

/// Default time a REQ/REP/DREQ/SIDR REQ is retried before the timeout event.
pub(crate) const DEFAULT_TIMEOUT_MS: u64 = 4000;
/// Transmissions of a retried message (the first included).
pub(crate) const TRIES: u32 = 8;

/// The rdma_cm state of the emulator (in the world).
#[derive(Debug, Default)]
pub(crate) struct Cm {
    pub(crate) chans: BTreeMap<u32, Chan>,
    pub(crate) ids: BTreeMap<u32, CmId>,
    pub(crate) mcs: BTreeMap<u32, Mc>,
    pub(crate) next_id: u32,
    pub(crate) next_chan: u32,
    pub(crate) seq: u32,
    pub(crate) tid: u64,
    /// Retry interval (ns), from `MLX5_EMU_CM_TIMEOUT_MS` / [`TRIES`].
    pub(crate) retry_ns: u64,
}

/// An event channel (one open file).
#[derive(Debug)]
pub(crate) struct Chan {
    pub(crate) queue: VecDeque<Ev>,
    /// The kernel's end of the eventfd (the user's end is a duplicate of it).
    pub(crate) efd: OwnedFd,
    /// The number of the user's descriptor (for MIGRATE_ID; owned by the user).
    pub(crate) user_fd: RawFd,
    /// The eventfd counter is non-zero (exactly while `queue` is not empty).
    pub(crate) signaled: bool,
    pub(crate) cv: Arc<Condvar>,
}

#[derive(Debug)]
pub(crate) struct Ev {
    /// The id whose `events_reported` counts this event.
    pub(crate) owner: u32,
    /// The multicast join it reports (counted there too).
    pub(crate) mc: Option<u32>,
    /// A connection request: the new id, ready once the event is read.
    pub(crate) child: Option<u32>,
    pub(crate) resp: RdmaUcmEventResp,
}

#[derive(Debug)]
pub(crate) struct Mc {
    pub(crate) id: u32,
    pub(crate) events_reported: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum St {
    Idle,
    Bound,
    AddrResolved,
    RouteResolved,
    Listen,
    Connect,
    Connected,
    Disconnected,
}

/// The IB CM's state of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cs {
    ReqSent,
    ReqRcvd,
    RepSent,
    RepRcvd,
    Established,
    DreqSent,
    DreqRcvd,
    SidrReqSent,
    SidrReqRcvd,
    Idle,
}

#[derive(Debug)]
pub(crate) struct CmId {
    pub(crate) chan: u32,
    pub(crate) uid: u64,
    pub(crate) ps: u16,
    pub(crate) qp_type: u8,
    pub(crate) st: St,
    pub(crate) hca: Option<usize>,
    pub(crate) src: Option<SockAddr>,
    pub(crate) dst: Option<SockAddr>,
    /// The node (LID) of the resolved destination.
    pub(crate) peer: Option<u16>,
    pub(crate) claim: Option<PortClaim>,
    pub(crate) events_reported: u32,
    pub(crate) tos: u8,
    pub(crate) conn: Option<Conn>,
    /// A passive id whose CONNECT_REQUEST has not been read yet (destroyed with its
    /// listener).
    pub(crate) pending: bool,
}

#[derive(Debug)]
pub(crate) struct Conn {
    pub(crate) cs: Cs,
    pub(crate) local_comm: u32,
    pub(crate) remote_comm: u32,
    pub(crate) peer_lid: u16,
    pub(crate) peer_gid: [u8; 16],
    pub(crate) local_qpn: u32,
    pub(crate) remote_qpn: u32,
    pub(crate) local_psn: u32,
    pub(crate) remote_psn: u32,
    pub(crate) responder_resources: u8,
    pub(crate) initiator_depth: u8,
    pub(crate) retry_count: u8,
    pub(crate) rnr_retry: u8,
    pub(crate) mtu: u8,
    pub(crate) qkey: u32,
    /// A message to send again until answered: (message, due, transmissions left).
    pub(crate) retx: Option<(CmMsg, u64, u32)>,
    /// The last answer sent, for duplicates of what it answered.
    pub(crate) last: Option<CmMsg>,
    /// DISCONNECTED (or REJECTED/UNREACHABLE) has been reported.
    pub(crate) ended: bool,
}

impl Cm {
    pub(crate) fn next_id(&mut self) -> u32 {
        self.next_id = self.next_id.wrapping_add(1).max(1);
        self.next_id
    }

    /// A fresh number (communication ids, PSNs, ephemeral ports).
    pub(crate) fn rand(&mut self) -> u32 {
        if self.seq == 0 {
            // Different in every process, as a real CM's communication ids are.
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            self.seq = (std::process::id().rotate_left(16) ^ t) | 1;
        }
        let mut x = self.seq ^ 0x9E37_79B9;
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        self.seq = x.wrapping_add(0x6D2B_79F5);
        x
    }

    pub(crate) fn retry_ns(&mut self) -> u64 {
        if self.retry_ns == 0 {
            let ms = std::env::var("MLX5_EMU_CM_TIMEOUT_MS")
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .filter(|&v| v > 0)
                .unwrap_or(DEFAULT_TIMEOUT_MS);
            self.retry_ns = ms * 1_000_000 / u64::from(TRIES);
        }
        self.retry_ns
    }
}
