//! What creating and moving a RAW_PACKET QP needs beyond the other transports (the hooks
//! `Qp::new` and the state machine call; the user-facing raw QP is `crate::raw`):
//! `CAP_NET_RAW`, the send queue in a buffer of its own, and the RAW_PACKET rows of the
//! kernel's transition table (docs/raw-ethernet.md).

use std::sync::Arc;

use mlx5_ffi::uverbs::{IB_QP_PORT, IB_QP_RATE_LIMIT};

use crate::error::{Error, Result};
use crate::mem::DmaBuf;
use crate::mem::wq::WqRing;
use crate::types::{QpState, QpType};

/// `CAP_NET_RAW` (capability number 13 of `linux/capability.h`).
const CAP_NET_RAW: u32 = 13;

/// Whether this process holds capability `cap` in its effective set (`CapEff` of
/// `/proc/thread-self/status`: capabilities are per thread, and this is the set `capable()` asks about in the kernel).
pub(crate) fn has_capability(cap: u32) -> bool {
    let Ok(s) = std::fs::read_to_string("/proc/thread-self/status") else {
        return false;
    };
    s.lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|bits| cap < 64 && bits & (1 << cap) != 0)
}

/// Whether this process may create RAW_PACKET QPs and flow rules (`CAP_NET_RAW`).
pub fn has_cap_net_raw() -> bool {
    has_capability(CAP_NET_RAW)
}

/// The check before CREATE_QP for a QP of type `t`: `ib_uverbs` creates RAW_PACKET QPs only
/// for a caller with `CAP_NET_RAW` (`EPERM` otherwise), so the driver names the missing
/// capability before the syscall. Nothing to check for the other types.
///
/// # Errors
/// [`Error::Os`] with `EPERM` naming `CAP_NET_RAW`.
pub(super) fn check_create(t: QpType) -> Result<()> {
    if t != QpType::RawPacket || has_cap_net_raw() {
        return Ok(());
    }
    Err(Error::Os {
        op: "creating a RAW_PACKET QP (needs CAP_NET_RAW in the effective set)",
        errno: nix::errno::Errno::EPERM,
    })
}

/// The queue buffers of a QP of type `t`: the main buffer (the RQ, and the SQ after it), and
/// for RAW_PACKET a second buffer holding the SQ alone (`mlx5_ib_create_qp::sq_buf_addr`:
/// mlx5_ib builds a raw QP's SQ and RQ as separate objects, each pinned on its own).
///
/// # Errors
/// As [`DmaBuf::new`].
pub(super) fn buffers(
    t: QpType,
    rq_bytes: usize,
    sq_bytes: usize,
) -> Result<(Arc<DmaBuf>, Option<Arc<DmaBuf>>)> {
    if t != QpType::RawPacket {
        return Ok((Arc::new(DmaBuf::new(rq_bytes + sq_bytes)?), None));
    }
    // A QP without an RQ still hands the kernel a buffer address: one page, unused.
    let rq = Arc::new(DmaBuf::new(rq_bytes.max(4096))?);
    Ok((rq, Some(Arc::new(DmaBuf::new(sq_bytes)?))))
}

/// The send queue's ring: in the SQ's own buffer if there is one, else after the RQ.
pub(super) fn sq_ring(
    buf: &Arc<DmaBuf>,
    sq_buf: &Option<Arc<DmaBuf>>,
    rq_bytes: usize,
    sq_bytes: usize,
) -> WqRing {
    match sq_buf {
        Some(b) => WqRing::new(b.clone(), 0, sq_bytes),
        None => WqRing::new(buf.clone(), rq_bytes, sq_bytes),
    }
}

/// The RAW_PACKET rows of the verbs state machine (`ib_modify_qp_is_ok`): (required,
/// optional) attributes of `from -> to`. RESET->INIT needs the port; INIT->RTR needs nothing;
/// RTR->RTS and RTS->RTS may set the rate limit (packet pacing).
pub(super) fn transition(from: QpState, to: QpState) -> Option<(u32, u32)> {
    use QpState::*;
    Some(match (from, to) {
        (_, Reset) | (_, Err) => (0, 0),
        (Reset, Init) => (IB_QP_PORT, 0),
        (Init, Init) => (0, IB_QP_PORT),
        (Init, Rtr) => (0, 0),
        (Rtr, Rts) | (Rts, Rts) => (0, IB_QP_RATE_LIMIT),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_rows_are_the_kernels() {
        use QpState::*;
        assert_eq!(transition(Reset, Init), Some((IB_QP_PORT, 0)));
        assert_eq!(transition(Init, Rtr), Some((0, 0)));
        assert_eq!(transition(Rtr, Rts), Some((0, IB_QP_RATE_LIMIT)));
        assert_eq!(transition(Reset, Rtr), None);
        assert_eq!(transition(Init, Rts), None);
        assert_eq!(transition(Rts, Reset), Some((0, 0)));
    }

    #[test]
    fn capability_bits_out_of_range_are_not_held() {
        assert!(!has_capability(64));
        assert!(!has_capability(u32::MAX));
    }
}
