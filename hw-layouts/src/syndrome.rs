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
         for UD, the payload against the path MTU (a UD payload may fill the whole MTU; the 40-byte GRH area comes on top of it in the receive buffer); the QP's max_inline_data",
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
        "an lkey no MR has (never registered, or deregistered); an lkey of an MR of another PD than the QP's; \
         the address range [addr, addr+len) is outside the memory region (addr+len beyond its end); \
         a buffer the device writes (receive, READ/atomic destination) registered without IBV_ACCESS_LOCAL_WRITE",
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
         a message longer than the responder's receive WQE (a SEND larger than the receive buffer); an opcode the responder does not support; \
         max_dest_rd_atomic of 0 on the responder for READ/atomics; misaligned atomic address",
        "the peer QP's qp_access_flags and max_dest_rd_atomic (set at INIT->RTR); the message length against the peer's limits; \
         8-byte alignment of atomic remote addresses",
    ),
    e(
        Syndrome::REMOTE_ACCESS,
        None,
        "remote access error: the responder rejected the rkey, the address range or the access rights",
        "the responder's MR lacks the access flag the operation needs (IBV_ACCESS_REMOTE_WRITE/READ/ATOMIC), or its QP's qp_access_flags do; \
         a wrong or stale rkey (no MR has it: the peer re-registered or deregistered its buffer); \
         remote address or length outside the peer's MR (addr+len beyond its end); an rkey of an MR of another PD than the peer's QP",
        "the access flags the peer registered its MR with and its QP's qp_access_flags; the rkey and remote address exchanged out of band against the peer's current MR; the length",
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
        "local protection error on a data buffer, protection-domain violation (vendor 0x32): the memory key of a receive (or send) buffer belongs to another protection domain",
        "the MR behind the sge's lkey was registered on another PD than the QP's; an lkey of an MR that was deregistered and whose number was reused",
        "that the QP and every MR its WRs use were created on the same PD; the sge lkey against the MR it should come from",
    ),
    e(
        Syndrome::LOCAL_PROT,
        Some(0x51),
        "local protection error in the gather list, PCIe error (vendor 0x51): the device could not read a send buffer over PCIe",
        "a send buffer in GPU or other device memory the NIC cannot reach (peer-memory module not loaded, BAR/MMIO window or IOMMU/ACS settings); \
         host memory unmapped or freed while the WR was in flight",
        "for GPU buffers, the peer-memory support and the platform's PCIe, BIOS MMIO and IOMMU settings; that the buffer stays mapped until its completion; \
         each send sge's lkey, addr and length against its MR",
    ),
    e(
        Syndrome::LOCAL_PROT,
        Some(0x52),
        "local protection error in the gather list, protection-domain violation (vendor 0x52): a send sge's key belongs to another protection domain",
        "the MR of a gather entry was registered on another PD than the QP (or the send queue of a raw-packet/DevX setup); a stale lkey whose number was reused",
        "that the QP and the MRs of its gather lists share a PD; for DevX/raw queues, the PD given when the queue was created",
    ),
    e(
        Syndrome::LOCAL_PROT,
        Some(0x53),
        "local protection error in the gather list, access-rights violation (vendor 0x53): the key does not allow the device to read the buffer",
        "the MR lacks IBV_ACCESS_LOCAL_WRITE where the device writes through the key (the destination of an RDMA READ or atomic); memory windows and device memory that restrict reads; a key of a memory window used as lkey",
        "the access flags of the MR or window behind the lkey (ibv_reg_mr's access argument)",
    ),
    e(
        Syndrome::LOCAL_PROT,
        Some(0x50),
        "local protection error in the gather list, key unknown (vendor 0x50, no violation detail): no memory region has the sge's lkey",
        "an lkey no MR has: never registered, already deregistered (ibv_dereg_mr before the completion), or a key corrupted or taken from another process or device; \
         a memory-window or device-memory key used where an MR's lkey belongs",
        "each sge's lkey against mr->lkey of the ibv_reg_mr that covers the buffer; that the MR is still registered until the WR completes",
    ),
    e(
        Syndrome::LOCAL_PROT,
        Some(0x54),
        "local protection error in the gather list, length violation (vendor 0x54): the sge's range is outside its memory region",
        "the range [addr, addr+len) of an sge runs outside the MR of its lkey (addr+len beyond the MR's end, or addr below its start); \
         a length of 0 (2 GiB) or an offset computed past the buffer",
        "each sge's addr and length against the MR's addr and length (ibv_reg_mr); the lkey names the MR that covers the buffer",
    ),
    e(
        Syndrome::LOCAL_PROT,
        Some(0x30),
        "local protection error on a data buffer, key unknown (vendor 0x30): no memory region has the lkey of a receive (or destination) buffer",
        "an lkey no MR has in the receive WQE's scatter list (never registered, deregistered while posted); a key corrupted in the WQE",
        "each receive sge's lkey against the MR that covers the buffer; that the MR stays registered while the receive is posted",
    ),
    e(
        Syndrome::LOCAL_PROT,
        Some(0x33),
        "local protection error on a data buffer, access-rights violation (vendor 0x33): the receive buffer's MR does not allow the device to write it",
        "the MR of a receive buffer lacks IBV_ACCESS_LOCAL_WRITE (registered read-only)",
        "the access flags the receive buffers were registered with: IBV_ACCESS_LOCAL_WRITE is needed",
    ),
    e(
        Syndrome::LOCAL_PROT,
        Some(0x34),
        "local protection error on a data buffer, length violation (vendor 0x34): a receive sge's range is outside its memory region",
        "the range [addr, addr+len) of a receive sge runs outside its MR (addr+len beyond the MR's end)",
        "each receive sge's addr and length against its MR",
    ),
    e(
        Syndrome::LOCAL_QP_OP,
        Some(0x68),
        "local QP operation error, invalid WQE format (vendor 0x68): the send WQE cannot be executed as written",
        "a control segment whose ds count does not match the segments, segments out of order, an opcode the QP type does not allow (masked atomics, an RC opcode on UD); \
         a WQE whose wqe_index does not match the producer counter; a DevX-created QP with inconsistent queue sizes or indices",
        "the failing WQE at the CQE's wqe_counter (mlx5 diag / mlx5 decode wqe): opmod_idx_opcode, qpn_ds and every segment; the send queue size and the producer counter; the QP's capabilities",
    ),
    e(
        Syndrome::LOCAL_QP_OP,
        Some(0xD6),
        "local QP operation error on the receive side (vendor 0xd6): the receive work queue had no valid entry to consume, or the entry was malformed",
        "a receive WQE with a bad scatter layout (no invalid-lkey terminator when fewer entries than max are used, more entries than the RQ allows); \
         a receive doorbell record moved past WQEs that were never written",
        "the receive WQE at the CQE's wqe_counter (mlx5 diag); the RQ's max_sge and stride; that the receive doorbell record is written only after the WQEs",
    ),
    e(
        Syndrome::WR_FLUSH,
        Some(0xF9),
        "work request flushed (vendor 0xf9, flushed in error): completed without execution because the QP is in the error state",
        "an earlier error on this QP or a deliberate move to ERR (teardown); receive WRs left posted when the QP is destroyed",
        "the first non-flush error completion on the QP or its peer; during teardown these completions are expected",
    ),
    e(
        Syndrome::REMOTE_INVAL_REQ,
        Some(0x8A),
        "remote invalid request (vendor 0x8a, invalid-request NAK): the responder answered the request with an invalid-request NAK",
        "remote access rights missing on the responder QP (qp_access_flags); READ/atomic with max_dest_rd_atomic 0; \
         a message longer than the responder's receive WQE (a SEND larger than the receive buffer); an opcode it does not support",
        "the peer's qp_access_flags and max_dest_rd_atomic; the requested length; that the peer's QP went through INIT->RTR with the intended attributes",
    ),
    e(
        Syndrome::REMOTE_ACCESS,
        Some(0x88),
        "remote access error (vendor 0x88, remote-access NAK): the responder rejected the rkey, range or rights",
        "the responder's MR lacks the access flag the operation needs (IBV_ACCESS_REMOTE_WRITE/READ/ATOMIC), or its QP's qp_access_flags do; \
         a wrong or stale rkey (no MR has it); an address or length outside the peer's MR (addr+len beyond its end); an rkey of an MR of another PD than the peer's QP",
        "the access flags the peer registered with (and its qp_access_flags); the rkey and address the peer sent against its live MR; the length",
    ),
    e(
        Syndrome::REMOTE_OP,
        Some(0x89),
        "remote operation error (vendor 0x89, remote-operation-error NAK): the responder could not complete the request",
        "the responder's receive WQE was bad or its QP failed while handling the request",
        "the peer's own error completions and receive WQEs",
    ),
    e(
        Syndrome::TRANSPORT_RETRY_EXC,
        Some(0x81),
        "transport retry counter exceeded (vendor 0x81, request timeout with the counter exceeded): no ACK from the peer after retry_cnt retransmissions",
        "the peer is gone or its QP is not in RTR/RTS; wrong remote QPN/LID/GID; path MTU or local ACK timeout too small; a lossy fabric",
        "the peer process and its QP state; remote QPN/LID/GID and GID index; path_mtu vs active_mtu; timeout/retry_cnt; port error counters",
    ),
    e(
        Syndrome::RNR_RETRY_EXC,
        Some(0x87),
        "RNR retry counter exceeded (vendor 0x87, receiver-not-ready retry limit exceeded): the responder kept answering RNR NAK",
        "the peer posts no receive WQEs or too few; rnr_retry or min_rnr_timer too small for the peer's refill time",
        "the peer's receive posting (before the first SEND, and kept topped up); rnr_retry (7 = infinite) and min_rnr_timer",
    ),
    e(
        Syndrome::REMOTE_ABORTED,
        Some(0x93),
        "on-demand-paging page fault on an SRQ receive buffer (vendor 0x93, MLX5_CQE_VENDOR_SYNDROME_ODP_PFAULT)",
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

// ---------------------------------------------------------------------------------------------
// Ranking the causes by the evidence

/// What a piece of evidence points at: one of the distinct causes of an error. The CQE's
/// vendor syndrome gives one ([`Pointer::from_vendor`]: the memory-translation detail, the
/// transport codes), the device's view another ([`Pointer::from_check`]: the emulator names
/// the check that failed), the failing WQE a third (the tools: a SEND cannot lack remote
/// access rights, so its remote invalid request points at the length).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pointer {
    /// The key is no MR's.
    KeyUnknown,
    /// The MR is another protection domain's.
    PdMismatch,
    /// The MR (or the QP) lacks an access right.
    Rights,
    /// The address range is outside the MR.
    Range,
    /// The message is longer than the buffer (or a limit).
    Length,
    /// No receive WQE at the responder.
    NoReceive,
    /// No acknowledgement from the peer.
    NoAck,
}

impl Pointer {
    /// Short name: `key unknown`, `PD mismatch`, `access rights`, `range`, `length`,
    /// `no receive WQE`, `no ACK`.
    pub fn name(self) -> &'static str {
        match self {
            Pointer::KeyUnknown => "key unknown",
            Pointer::PdMismatch => "PD mismatch",
            Pointer::Rights => "access rights",
            Pointer::Range => "range",
            Pointer::Length => "length",
            Pointer::NoReceive => "no receive WQE",
            Pointer::NoAck => "no ACK",
        }
    }

    /// Words a cause that this pointer supports contains (lowercase).
    fn keywords(self) -> &'static [&'static str] {
        match self {
            Pointer::KeyUnknown => &["no mr has", "never registered", "stale", "unknown"],
            Pointer::PdMismatch => &["another pd", "other pd", "protection domain"],
            Pointer::Rights => &["lacks", "access flag", "ibv_access", "qp_access_flags"],
            Pointer::Range => &["outside", "beyond"],
            Pointer::Length => &["longer", "larger than", "too long"],
            Pointer::NoReceive => &["receive wqe", "posts no receive", "post receives"],
            Pointer::NoAck => &["peer is gone", "not in rtr", "wrong remote", "lossy"],
        }
    }

    /// Whether `cause` (one item of [`Explanation::causes`]) is the one this points at.
    pub fn supports(self, cause: &str) -> bool {
        self.keywords()
            .iter()
            .any(|k| contains_ignore_case(cause, k))
    }

    /// What the CQE's vendor syndrome points at, if it narrows the cause: a memory-translation
    /// code's detail (0 unspecified: key unknown, 2 PD, 3 rights, 4 length: range), the
    /// RNR and retry codes.
    pub fn from_vendor(syndrome: Syndrome, vendor: VendorSyndrome) -> Option<Pointer> {
        let c = vendor.0;
        if matches!(syndrome, Syndrome::LOCAL_PROT | Syndrome::LOCAL_ACCESS)
            && TPT_BASES.iter().any(|(b, _)| *b == c & !0x07)
        {
            return match c & 0x07 {
                0 => Some(Pointer::KeyUnknown),
                2 => Some(Pointer::PdMismatch),
                3 => Some(Pointer::Rights),
                4 => Some(Pointer::Range),
                _ => None,
            };
        }
        match (syndrome, c) {
            (Syndrome::RNR_RETRY_EXC, _) => Some(Pointer::NoReceive),
            (Syndrome::TRANSPORT_RETRY_EXC, _) => Some(Pointer::NoAck),
            (Syndrome::LOCAL_LENGTH, _) => Some(Pointer::Length),
            _ => None,
        }
    }

    /// What a check the device reports as failed points at (the emulator's names: `key`,
    /// `PD`, `rights`, `range`, `length`, `receive WQE`, `ACK`).
    pub fn from_check(check: &str) -> Option<Pointer> {
        Some(match check {
            "key" => Pointer::KeyUnknown,
            "PD" => Pointer::PdMismatch,
            "rights" => Pointer::Rights,
            "range" => Pointer::Range,
            "length" => Pointer::Length,
            "receive WQE" => Pointer::NoReceive,
            "ACK" => Pointer::NoAck,
            _ => return None,
        })
    }
}

fn contains_ignore_case(hay: &str, needle: &str) -> bool {
    let (h, n) = (hay.as_bytes(), needle.as_bytes());
    n.is_empty() || h.windows(n.len()).any(|w| w.eq_ignore_ascii_case(n))
}

/// The most causes an explanation lists.
pub const MAX_CAUSES: usize = 8;

/// An explanation's causes, most likely first by the evidence: each cause with the pointer
/// that supports it (`None`: no evidence for it, kept in the table's order after the
/// supported ones).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RankedCauses {
    items: [(&'static str, Option<Pointer>); MAX_CAUSES],
    len: usize,
}

impl RankedCauses {
    /// The causes in rank order, each with the evidence pointer that supports it.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, Option<Pointer>)> + '_ {
        self.items[..self.len].iter().copied()
    }

    /// The first (most likely) cause.
    pub fn first(&self) -> Option<&'static str> {
        self.items[..self.len].first().map(|x| x.0)
    }

    /// Number of causes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// No causes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Rank `x`'s causes by `evidence` (most telling first: the device's view, then the CQE's
/// vendor syndrome, then the WQE): a cause supported by an earlier pointer comes before one
/// supported by a later one, unsupported causes keep the table's order after them.
pub fn rank_causes(x: &Explanation, evidence: &[Pointer]) -> RankedCauses {
    let mut items = [("", None); MAX_CAUSES];
    let mut len = 0;
    for c in x.causes.split("; ") {
        if len == MAX_CAUSES {
            break;
        }
        let by = evidence.iter().copied().find(|p| p.supports(c));
        items[len] = (c, by);
        len += 1;
    }
    let rank = |p: Option<Pointer>| {
        p.and_then(|p| evidence.iter().position(|&q| q == p))
            .unwrap_or(usize::MAX)
    };
    // A stable insertion sort (no allocation, no_std).
    for i in 1..len {
        let mut j = i;
        while j > 0 && rank(items[j - 1].1) > rank(items[j].1) {
            items.swap(j - 1, j);
            j -= 1;
        }
    }
    RankedCauses { items, len }
}

/// The general explanation of a syndrome alone (ignoring any vendor syndrome).
pub fn explain_syndrome(syndrome: Syndrome) -> Option<&'static Explanation> {
    EXPLANATIONS
        .iter()
        .find(|x| x.vendor.is_none() && x.syndrome == syndrome)
}

// ---------------------------------------------------------------------------------------------
// The vendor syndrome byte, decoded

/// What a vendor syndrome byte (error CQE byte 54) says: the device unit that reported it, what
/// went wrong and, for memory-translation (TPT) errors, the detail in the low three bits.
///
/// The codes follow the decoder NVIDIA publishes with its dpcp library (the only public
/// table): the memory-translation groups are 8 codes wide (a base plus a 3-bit detail), the
/// receiver-not-ready NAKs 0xa0..=0xbf carry the RNR timer in their low five bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VendorMeaning {
    /// The byte.
    pub code: VendorSyndrome,
    /// The unit that reported it ("memory translation", "requester transport", ...).
    pub unit: &'static str,
    /// What went wrong.
    pub meaning: &'static str,
    /// Memory-translation errors: the 3-bit detail (PCIe error, protection-domain violation,
    /// access-rights violation, length violation, ...).
    pub detail: Option<&'static str>,
    /// Receiver-not-ready NAK: the RNR timer code it carried.
    pub rnr_timer: Option<u8>,
}

impl core::fmt::Display for VendorMeaning {
    /// `memory translation: gather list memory access: PCIe error`.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}: {}", self.unit, self.meaning)?;
        if let Some(d) = self.detail {
            write!(f, ": {d}")?;
        }
        if let Some(t) = self.rnr_timer {
            write!(f, " (RNR timer code {t})")?;
        }
        Ok(())
    }
}

const TPT: &str = "memory translation";
const CQ: &str = "completion queue";
const EXEC: &str = "WQE execution";
const REQ: &str = "requester transport";
const RESP: &str = "responder";
const RDE: &str = "receive data engine";
const QPS: &str = "QP state";

/// Memory-translation bases (8 codes each: base | 3-bit detail).
const TPT_BASES: &[(u8, &str)] = &[
    (0x10, "memory access error fetching a work queue entry"),
    (0x18, "memory access error in an atomic operation"),
    (0x20, "memory access error in an RDMA READ"),
    (0x28, "memory access error in a receive buffer"),
    (0x30, "memory access error on a data buffer"),
    (0x38, "memory access error in an RDMA WRITE"),
    (0x50, "gather list or memory bind access error"),
    (
        0x60,
        "memory access error fetching a WQE or read descriptor",
    ),
    (0x78, "fast-register memory error"),
    (0xC0, "memory access error in an RDMA WRITE with immediate"),
    (0xC8, "memory invalidate error"),
];

/// The 3-bit detail of a memory-translation error.
const TPT_DETAIL: [&str; 8] = [
    "unspecified",
    "PCIe error",
    "protection-domain violation",
    "access-rights violation",
    "length violation",
    "encryption error",
    "master abort or page fault",
    "internal translation error",
];

/// Every other known code.
const VENDOR_CODES: &[(u8, &str, &str)] = &[
    (0x00, "none", "no error"),
    (0x40, CQ, "invalid completion queue"),
    (0x41, CQ, "completion queue overrun"),
    (0x42, CQ, "memory access error writing the completion queue"),
    (0x43, CQ, "completion queue network error"),
    (0x44, CQ, "completion queue in the error state"),
    (0x45, CQ, "completion queue locked"),
    (0x48, CQ, "invalid completion queue; QP moved to error"),
    (0x49, CQ, "completion queue overrun; QP moved to error"),
    (
        0x4A,
        CQ,
        "completion queue translation error; QP moved to error",
    ),
    (
        0x4B,
        CQ,
        "completion queue network error; QP moved to error",
    ),
    (0x4C, CQ, "completion queue in error; QP moved to error"),
    (0x4D, CQ, "completion queue locked; QP moved to error"),
    (0x58, EXEC, "wait operation failed"),
    (0x59, EXEC, "PSV (signature) validation error"),
    (0x5A, EXEC, "signature error"),
    (0x5B, EXEC, "connection resilience error"),
    (0x68, EXEC, "invalid WQE format"),
    (0x69, EXEC, "message larger than the maximum message size"),
    (0x6A, EXEC, "message larger than the path MTU"),
    (
        0x6B,
        EXEC,
        "UD: address vector's protection domain does not match",
    ),
    (0x6C, EXEC, "UD: port mismatch"),
    (0x6D, EXEC, "opcode not valid for the transport service"),
    (0x6E, EXEC, "ds count too short for the opcode"),
    (0x6F, EXEC, "inline segment runs past the WQE"),
    (0x70, EXEC, "inline segment in a scatter list"),
    (0x71, EXEC, "reserved opcode"),
    (0x72, EXEC, "bus error fetching the WQE"),
    (0x73, EXEC, "bus error reading the gather data"),
    (0x74, EXEC, "UD: reserved GID"),
    (0x75, EXEC, "UD: LID and GID do not match"),
    (0x76, EXEC, "UD: reserved Q_Key"),
    (0x77, EXEC, "gather length larger than the WQE"),
    (0x80, REQ, "request timeout, no response"),
    (0x81, REQ, "request timeout, retry counter exceeded"),
    (0x82, REQ, "implicit NAK"),
    (0x83, REQ, "implicit NAK, counter exceeded"),
    (0x84, REQ, "out-of-sequence NAK"),
    (0x85, REQ, "out-of-sequence NAK, counter exceeded"),
    (0x86, REQ, "unexpected opcode sequence in the responses"),
    (0x87, REQ, "receiver-not-ready NAK, retry limit exceeded"),
    (0x88, REQ, "remote-access-error NAK"),
    (0x89, REQ, "remote-operation-error NAK"),
    (0x8A, REQ, "invalid-request NAK"),
    (0x8B, REQ, "bad AETH in a response"),
    (0x8C, RESP, "invalid opcode"),
    (0x8D, RESP, "opcode sequence error"),
    (0x8E, RESP, "packet larger than the path MTU"),
    (0x8F, RESP, "shared receive queue not available"),
    (0x90, RESP, "RDMA READ not permitted on this QP"),
    (0x91, RESP, "atomic operation not permitted on this QP"),
    (0x92, RESP, "RDMA WRITE not permitted on this QP"),
    (0x93, RESP, "on-demand-paging page fault"),
    (0x94, RESP, "PSN sequence error"),
    (0x95, RESP, "QP suspended"),
    (0x96, RESP, "QP suspended with a NAK pending"),
    (0x97, RESP, "retry counter exceeded"),
    (0x98, RESP, "virtio fetcher QP error"),
    (0x99, RESP, "remote abort: incomplete message"),
    (0x9A, RESP, "SRC domain violation"),
    (0x9B, RESP, "SRC SRQ sequence error"),
    (0x9C, RESP, "NVMe emulation error"),
    (0x9D, RESP, "GGA error"),
    (0x9E, RESP, "ACE error"),
    (0x9F, RESP, "GTA error"),
    (0xD0, RDE, "failed to read end-to-end credits"),
    (0xD1, RDE, "atomic operation misaligned"),
    (
        0xD2,
        RDE,
        "too many outstanding RDMA READ/atomic operations",
    ),
    (0xD3, RDE, "RDMA READ/atomic message too long"),
    (
        0xD4,
        RDE,
        "SEND or READ response longer than the receive buffer",
    ),
    (0xD5, RDE, "RDMA WRITE message too long"),
    (0xD6, RDE, "receive work queue empty: no valid WQE"),
    (0xD7, RDE, "receive work queue exhausted"),
    (0xD8, RDE, "bus error reading a receive WQE"),
    (0xD9, RDE, "atomic or RDMA WRITE failed"),
    (0xDA, RDE, "READ response length mismatch"),
    (0xDB, RDE, "RDMA WRITE with immediate too long"),
    (0xDC, RDE, "bus error reading the next WQE address"),
    (0xDD, RDE, "on-demand-paging hardware error"),
    (0xE0, QPS, "DC cleanup"),
    (0xE2, QPS, "packet with a different SL"),
    (0xE3, QPS, "WQE exhausted (offloaded QP)"),
    (0xE4, QPS, "SEND/response length exceeded (offloaded QP)"),
    (0xE5, QPS, "execution response error"),
    (0xF0, QPS, "packet discarded"),
    (0xF1, QPS, "DC reconnect"),
    (0xF2, QPS, "DC CNAK"),
    (0xF3, QPS, "DC reconnect ACK"),
    (0xF4, QPS, "paired QP in error"),
    (0xF5, QPS, "moved to error by a command"),
    (0xF6, QPS, "moved from error to reset by a command"),
    (0xF7, QPS, "connection terminated"),
    (0xF8, QPS, "QP destroyed by a command"),
    (0xF9, QPS, "flushed: the QP is in the error state"),
    (0xFA, QPS, "terminated, moved to error"),
    (0xFB, QPS, "DC CACK"),
    (0xFC, QPS, "DC CNAK retry exceeded"),
    (0xFD, QPS, "receive queue drained"),
    (0xFE, QPS, "inner accelerator error"),
    (0xFF, QPS, "URB error"),
];

/// The vendor syndrome byte decoded; `None` for a code no public table names.
pub fn vendor_meaning(v: VendorSyndrome) -> Option<VendorMeaning> {
    let c = v.0;
    if (0xA0..=0xBF).contains(&c) {
        return Some(VendorMeaning {
            code: v,
            unit: REQ,
            meaning: "receiver-not-ready NAK",
            detail: None,
            rnr_timer: Some(c & 0x1F),
        });
    }
    if let Some(&(_, m)) = TPT_BASES.iter().find(|(b, _)| *b == c & !0x07) {
        return Some(VendorMeaning {
            code: v,
            unit: TPT,
            meaning: m,
            detail: Some(TPT_DETAIL[(c & 0x07) as usize]),
            rnr_timer: None,
        });
    }
    VENDOR_CODES
        .iter()
        .find(|(k, _, _)| *k == c)
        .map(|&(_, unit, meaning)| VendorMeaning {
            code: v,
            unit,
            meaning,
            detail: None,
            rnr_timer: None,
        })
}
