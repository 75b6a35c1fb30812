//! Error explanations: for every CQE error syndrome and every known vendor syndrome, what it
//! means, what typically causes it and what to check.
//!
//! The syndromes are the thirteen of the error CQE's byte 55 ([`Syndrome`], PRM "CQE error
//! syndromes", mirrored in `mlx5dv.h`); the vendor syndromes are the values of byte 54
//! ([`VendorSyndrome`], mostly undocumented, see its doc for where each was seen). The table is a
//! `static` array: no allocation, usable from `no_std` code, the trace tool and the driver.
//!
//! Look-up: [`explain`] takes the pair from an error CQE. It returns the entry for that exact
//! pair when the table has one (a vendor syndrome that narrows the cause, e.g. 0x04/0x32 is the
//! responder's receive buffer, 0x04/0x51 the requester's gather list), otherwise the entry for
//! the syndrome alone, and for an unknown syndrome whose vendor syndrome is known the vendor
//! entry. Unknown pairs give `None`.
//!
//! Printing: [`Explanation::lines`] gives the three lines the tools print, which begin with
//! `meaning:`, `causes:` and `check:`.

use crate::opcodes::{Syndrome, VendorSyndrome, WcStatus};

/// One explanation: what a syndrome (optionally narrowed by a vendor syndrome) means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Explanation {
    /// The CQE error syndrome (byte 55) this entry explains.
    pub syndrome: Syndrome,
    /// The vendor syndrome (byte 54) this entry is specific to; `None` for the general entry of
    /// the syndrome.
    pub vendor: Option<VendorSyndrome>,
    /// The work-completion status libmlx5 reports for it (`ibv_wc_status`).
    pub status: WcStatus,
    /// What the device is saying, in one sentence.
    pub meaning: &'static str,
    /// Typical causes, most likely first, separated by "; ".
    pub causes: &'static str,
    /// What to check, in order, separated by "; ".
    pub check: &'static str,
}

impl Explanation {
    /// The three printable lines: `meaning: ...`, `causes: ...`, `check: ...` (no newline).
    pub fn lines(&self) -> [(&'static str, &'static str); 3] {
        [
            ("meaning", self.meaning),
            ("causes", self.causes),
            ("check", self.check),
        ]
    }
}

const fn e(
    syndrome: Syndrome,
    vendor: Option<u8>,
    meaning: &'static str,
    causes: &'static str,
    check: &'static str,
) -> Explanation {
    Explanation {
        syndrome,
        vendor: match vendor {
            Some(v) => Some(VendorSyndrome(v)),
            None => None,
        },
        status: syndrome.wc_status(),
        meaning,
        causes,
        check,
    }
}

/// Every explanation: first one general entry per documented syndrome (in syndrome order), then
/// the vendor-specific entries.
pub static EXPLANATIONS: &[Explanation] = &[
    // ---- general entries, one per syndrome ----
    e(
        Syndrome::LOCAL_LENGTH,
        None,
        "local length error: the message length does not fit what the local side allows",
        "receive: the incoming message is longer than the sum of the receive WQE's scatter entries; \
         send: the gather list is longer than the port's max message size, or a UD/UC message is larger than the path MTU; \
         an inline payload larger than the QP's max_inline_data",
        "the receive buffer sizes posted against the peer's send sizes; sge lengths (0 means 2 GiB on some ops); \
         for UD, the payload against the path MTU minus the 40-byte GRH; the QP's max_inline_data",
    ),
    e(
        Syndrome::LOCAL_QP_OP,
        None,
        "local QP operation error: the device found the WQE or the QP inconsistent while executing it",
        "a malformed WQE (wrong ds count in the control segment, segments out of order, wqe_index not matching the producer counter); \
         an opcode the QP type or its capabilities do not allow (atomics on UD, masked atomics without support); \
         a receive WQE with more scatter entries than the RQ was created for",
        "decode the failing WQE (mlx5 decode wqe / mlx5 diag) at the CQE's wqe_counter: opmod_idx_opcode, qpn_ds and every segment; \
         the opcode against the QP type; the vendor syndrome (0x68 requester, 0xd6 responder)",
    ),
    e(
        Syndrome::LOCAL_PROT,
        None,
        "local protection error: a local memory key in the WQE does not allow the access",
        "an lkey that was never registered, was deregistered, or belongs to another PD; \
         the address range [addr, addr+len) is outside the memory region; \
         a receive buffer registered without IBV_ACCESS_LOCAL_WRITE",
        "every sge's lkey, addr and length against the MR it came from (ibv_reg_mr result); the MR's access flags; \
         that the MR and the QP share a PD; that the buffer was not freed or deregistered while the WR was in flight",
    ),
    e(
        Syndrome::WR_FLUSH,
        None,
        "work request flushed: the QP is in the error state, so this WQE was completed without being executed",
        "an earlier WQE on this QP (or its peer) failed and moved the QP to ERR, every outstanding and later WR is flushed; \
         the application moved the QP to ERR itself (teardown); the peer's QP was destroyed",
        "the first error completion before the flushes on this QP: it carries the real cause; \
         flushes after a deliberate modify to ERR are normal and can be ignored",
    ),
    e(
        Syndrome::MW_BIND,
        None,
        "memory window bind error: the device refused to bind a memory window",
        "the MR does not allow binding (no IBV_ACCESS_MW_BIND); the window range falls outside the MR; \
         a type 2 window bound with the wrong rkey tag or from a QP of another PD",
        "the MR's access flags; the bind's addr/length against the MR; the window type and PD",
    ),
    e(
        Syndrome::BAD_RESP,
        None,
        "bad response: the requester received a response it did not expect",
        "the responder sent an unexpected transport opcode or a response of the wrong length (e.g. a READ response of a different size); \
         two QPs of different transports connected to each other; a peer that is not an RC QP of the expected number",
        "both QPs are RC and connected to each other (remote QPN on each side); the peer's software or device; a packet capture of the responses",
    ),
    e(
        Syndrome::LOCAL_ACCESS,
        None,
        "local access error: a protection error on a local buffer while placing an incoming RDMA READ or atomic response",
        "the READ/atomic destination sge's lkey lacks IBV_ACCESS_LOCAL_WRITE; the destination range is outside its MR",
        "the access flags of the MR used as the destination of RDMA READ or atomic results; the sge addr/length",
    ),
    e(
        Syndrome::REMOTE_INVAL_REQ,
        None,
        "remote invalid request: the responder found the request invalid",
        "the remote QP does not allow this operation (RDMA WRITE/READ/atomic without IBV_ACCESS_REMOTE_* in its qp_access_flags); \
         a message longer than the responder accepts; an opcode the responder does not support; \
         max_dest_rd_atomic of 0 on the responder for READ/atomics; misaligned atomic address",
        "the peer QP's qp_access_flags and max_dest_rd_atomic (set at INIT->RTR); the message length against the peer's limits; \
         8-byte alignment of atomic remote addresses",
    ),
    e(
        Syndrome::REMOTE_ACCESS,
        None,
        "remote access error: the responder rejected the rkey, the address range or the access rights",
        "a wrong or stale rkey (the peer re-registered or deregistered its buffer); \
         remote address or length outside the peer's MR; the peer's MR lacks IBV_ACCESS_REMOTE_WRITE/READ/ATOMIC",
        "the rkey and remote address exchanged out of band against the peer's current MR; the length; the access flags the peer registered with",
    ),
    e(
        Syndrome::REMOTE_OP,
        None,
        "remote operation error: the responder could not complete the operation",
        "the responder's receive WQE was malformed or its scatter list pointed at a buffer it could not write; \
         the responder's QP went to the error state while processing the request",
        "the peer's receive WQEs and their lkeys; the peer's own error completions (it usually has one that names the cause)",
    ),
    e(
        Syndrome::TRANSPORT_RETRY_EXC,
        None,
        "transport retry counter exceeded: the requester got no ACK after retry_cnt retransmissions",
        "the peer is gone (process exited, host down) or its QP is not in RTR/RTS; \
         wrong remote QPN, LID or GID (the packets go to nobody); path MTU larger than the path supports; \
         a local ACK timeout too small for the round-trip time; a lossy fabric (no PFC/ECN on RoCE, a bad cable or port)",
        "the peer process and the state of its QP; the remote QPN/LID/GID and the GID index used on both sides; \
         path_mtu against the port's active_mtu; timeout and retry_cnt in the RTS attributes; \
         port counters (mlx5 counters: symbol errors, link downed, out-of-sequence, timeouts)",
    ),
    e(
        Syndrome::RNR_RETRY_EXC,
        None,
        "RNR retry counter exceeded: the responder had no receive WQE posted, rnr_retry times in a row",
        "the peer does not post receives fast enough (or at all) for the SENDs arriving; \
         rnr_retry too small or min_rnr_timer too short for the peer's refill time; the peer's RQ/SRQ is empty",
        "that the peer posts receive WRs before the first SEND and keeps enough of them outstanding; \
         rnr_retry (7 = infinite) and min_rnr_timer; flow control between the applications",
    ),
    e(
        Syndrome::REMOTE_ABORTED,
        None,
        "remote aborted: the operation was aborted by the responder",
        "the responder's QP was destroyed or reset in the middle of a multi-packet message; \
         on an SRQ with on-demand paging, a page fault on the receive buffer (vendor syndrome 0x93)",
        "the peer's lifetime around the failing message; the vendor syndrome (0x93 is an ODP page fault, which libmlx5 handles by re-posting)",
    ),
    // ---- vendor-specific entries ----
    e(
        Syndrome::LOCAL_PROT,
        Some(0x32),
        "local protection error on the responder: the receive WQE's scatter entry names a buffer the device may not write",
        "the receive sge's lkey is invalid, from another PD, or its MR lacks IBV_ACCESS_LOCAL_WRITE; the receive range is outside the MR",
        "the receive WR's sge lkey/addr/length against its MR; the MR's access flags include LOCAL_WRITE",
    ),
    e(
        Syndrome::LOCAL_PROT,
        Some(0x51),
        "local protection error on the requester: a gather entry of the send WQE names an invalid lkey or range",
        "an lkey that was deregistered or never registered; the gather range [addr, addr+len) outside its MR; \
         device memory or GPU memory that the NIC cannot reach (peer-memory not loaded, PCIe/IOMMU/BAR setup)",
        "each send sge against its MR; for GPU buffers, peer-memory support and the platform's PCIe/MMIO settings",
    ),
    e(
        Syndrome::LOCAL_PROT,
        Some(0x52),
        "local protection error reported with vendor syndrome 0x52 (seen on raw-packet/Ethernet send queues; no public definition)",
        "a gather lkey or range the device rejected on a raw-packet send queue; a queue set up without the right PD or UAR",
        "the send sge lkeys and ranges; the queue's PD; compare with a working verbs-mode setup of the same queue",
    ),
    e(
        Syndrome::LOCAL_QP_OP,
        Some(0x68),
        "local QP operation error on the requester: the send WQE cannot be executed on this QP",
        "an opcode the QP does not support (masked atomics, an RC opcode on UD); a WQE whose wqe_index does not match the send queue's producer index; \
         a QP created through DevX with inconsistent queue sizes or indices",
        "the failing WQE's opcode and wqe_index (mlx5 diag); the send queue size and the producer counter; the QP's capabilities",
    ),
    e(
        Syndrome::LOCAL_QP_OP,
        Some(0xD6),
        "local QP operation error on the responder: the receive WQE is malformed",
        "a receive WQE with a bad scatter entry layout (no terminating invalid-lkey entry when fewer entries than max are used); \
         more scatter entries than the RQ allows",
        "the receive WQE at the CQE's wqe_counter (mlx5 decode / mlx5 diag); the RQ's max_sge and stride",
    ),
    e(
        Syndrome::WR_FLUSH,
        Some(0xF9),
        "work request flushed (vendor syndrome 0xf9): completed without execution because the QP is in the error state",
        "an earlier error on this QP or a deliberate move to ERR (teardown); receive WRs left posted when the QP is destroyed",
        "the first non-flush error completion on the QP or its peer; during teardown these completions are expected",
    ),
    e(
        Syndrome::REMOTE_INVAL_REQ,
        Some(0x8A),
        "remote invalid request (vendor syndrome 0x8a): the responder rejected the request as invalid",
        "remote access rights missing on the responder QP (qp_access_flags); READ/atomic with max_dest_rd_atomic 0; a message too long for the responder",
        "the peer's qp_access_flags and max_dest_rd_atomic; the requested length; that the peer's QP went through INIT->RTR with the intended attributes",
    ),
    e(
        Syndrome::REMOTE_ACCESS,
        Some(0x88),
        "remote access error (vendor syndrome 0x88): the responder rejected the rkey, range or rights",
        "a stale or wrong rkey; an address or length outside the peer's MR; missing remote access flags on the peer's MR",
        "the rkey and address the peer sent against its live MR; the access flags it registered with",
    ),
    e(
        Syndrome::REMOTE_OP,
        Some(0x89),
        "remote operation error (vendor syndrome 0x89): the responder could not complete the request",
        "the responder's receive WQE was bad or its QP failed while handling the request",
        "the peer's own error completions and receive WQEs",
    ),
    e(
        Syndrome::TRANSPORT_RETRY_EXC,
        Some(0x81),
        "transport retry counter exceeded (vendor syndrome 0x81): no ACK from the peer after retry_cnt retransmissions",
        "the peer is gone or its QP is not in RTR/RTS; wrong remote QPN/LID/GID; path MTU or local ACK timeout too small; a lossy fabric",
        "the peer process and its QP state; remote QPN/LID/GID and GID index; path_mtu vs active_mtu; timeout/retry_cnt; port error counters",
    ),
    e(
        Syndrome::REMOTE_ABORTED,
        Some(0x93),
        "on-demand-paging page fault on an SRQ receive buffer (MLX5_CQE_VENDOR_SYNDROME_ODP_PFAULT)",
        "the receive buffer of an ODP memory region was not resident when the message arrived",
        "nothing, usually: libmlx5 re-posts the receive WQE; if it repeats, pre-fault the buffers (ibv_advise_mr) or register without ODP",
    ),
];

/// The explanation for an error CQE's `(syndrome, vendor syndrome)`: the vendor-specific entry if
/// the table has one, else the syndrome's general entry, else (unknown syndrome) an entry of the
/// vendor syndrome; `None` when neither is known.
pub fn explain(syndrome: Syndrome, vendor: VendorSyndrome) -> Option<&'static Explanation> {
    let mut general = None;
    let mut by_vendor = None;
    for x in EXPLANATIONS {
        match x.vendor {
            Some(v) if v == vendor => {
                if x.syndrome == syndrome {
                    return Some(x);
                }
                if by_vendor.is_none() {
                    by_vendor = Some(x);
                }
            }
            None if x.syndrome == syndrome => general = Some(x),
            _ => {}
        }
    }
    general.or(if syndrome.name().is_none() {
        by_vendor
    } else {
        None
    })
}

/// The general explanation of a syndrome alone (ignoring any vendor syndrome).
pub fn explain_syndrome(syndrome: Syndrome) -> Option<&'static Explanation> {
    EXPLANATIONS
        .iter()
        .find(|x| x.vendor.is_none() && x.syndrome == syndrome)
}
