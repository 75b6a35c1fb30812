//! The ibverbs-shaped work requests and work completions: what rdma-core users know as
//! `ibv_sge`, `ibv_send_wr`, `ibv_recv_wr` and `ibv_wc`. Chains are slices, not linked lists.

pub use mlx5_hw::opcodes::{Syndrome, VendorSyndrome, WcStatus};

use crate::ah::Ah;
use crate::types::QpState;

pub use crate::types::Sge;
pub(crate) use crate::types::bit_set;

/// Send work-request flags (`enum ibv_send_flags`), as a bit set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendFlags(pub u32);

impl SendFlags {
    /// No flags.
    pub const NONE: Self = Self(0);
    /// Wait for prior RDMA READs and atomics to complete (`IBV_SEND_FENCE`).
    pub const FENCE: Self = Self(1);
    /// Generate a completion (`IBV_SEND_SIGNALED`).
    pub const SIGNALED: Self = Self(2);
    /// Set the solicited-event bit (`IBV_SEND_SOLICITED`).
    pub const SOLICITED: Self = Self(4);
    /// `IBV_SEND_INLINE`; informational here: a WR is inline when [`SendWr::inline`] is
    /// not empty.
    pub const INLINE: Self = Self(8);
}

bit_set!(SendFlags);

/// What a send work request does, with the operands each operation needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WrOp {
    /// SEND.
    Send,
    /// SEND with 4 bytes of immediate data, given in network order as verbs does.
    SendImm {
        /// Immediate data (network byte order, copied verbatim).
        imm: [u8; 4],
    },
    /// SEND with invalidate of a remote key.
    SendInv {
        /// rkey to invalidate at the responder.
        rkey: u32,
    },
    /// RDMA WRITE.
    Write {
        /// Remote address.
        raddr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// RDMA WRITE with immediate (consumes a receive at the responder).
    WriteImm {
        /// Remote address.
        raddr: u64,
        /// Remote key.
        rkey: u32,
        /// Immediate data (network byte order).
        imm: [u8; 4],
    },
    /// RDMA READ into the local SGEs.
    Read {
        /// Remote address.
        raddr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// 8-byte compare-and-swap; the original remote value lands in the first SGE (8 bytes).
    CompareSwap {
        /// Remote address (8-byte aligned).
        raddr: u64,
        /// Remote key.
        rkey: u32,
        /// Compare operand.
        compare: u64,
        /// Swap operand.
        swap: u64,
    },
    /// 8-byte fetch-and-add; the original remote value lands in the first SGE (8 bytes).
    FetchAdd {
        /// Remote address (8-byte aligned).
        raddr: u64,
        /// Remote key.
        rkey: u32,
        /// Value to add.
        add: u64,
    },
}

/// UD destination of a send (`wr.ud` in `ibv_send_wr`).
#[derive(Clone, Copy, Debug)]
pub struct UdDest<'a> {
    /// Address handle.
    pub ah: &'a Ah,
    /// Remote QP number.
    pub remote_qpn: u32,
    /// Remote Q_Key.
    pub remote_qkey: u32,
}

/// A send work request (`struct ibv_send_wr` without the `next` pointer).
#[derive(Clone, Copy, Debug)]
pub struct SendWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub op: WrOp,
    /// Gather list (ignored when `inline` is not empty).
    pub sg_list: &'a [Sge],
    /// Inline payload, concatenated into the WQE (up to `max_inline_data` in total). This is
    /// how `IBV_SEND_INLINE` is expressed safely: the CPU copies from Rust slices, not from raw
    /// SGE addresses.
    pub inline: &'a [&'a [u8]],
    /// Flags.
    pub flags: SendFlags,
    /// Destination, UD QPs only.
    pub ud: Option<UdDest<'a>>,
}

impl<'a> SendWr<'a> {
    /// A SEND of `sg_list`.
    pub fn send(wr_id: u64, sg_list: &'a [Sge], flags: SendFlags) -> Self {
        Self {
            wr_id,
            op: WrOp::Send,
            sg_list,
            inline: &[],
            flags,
            ud: None,
        }
    }

    /// An inline SEND of the concatenation of `data`.
    pub fn send_inline(wr_id: u64, data: &'a [&'a [u8]], flags: SendFlags) -> Self {
        Self {
            wr_id,
            op: WrOp::Send,
            sg_list: &[],
            inline: data,
            flags: flags | SendFlags::INLINE,
            ud: None,
        }
    }

    /// A request of any operation.
    pub fn new(wr_id: u64, op: WrOp, sg_list: &'a [Sge], flags: SendFlags) -> Self {
        Self {
            wr_id,
            op,
            sg_list,
            inline: &[],
            flags,
            ud: None,
        }
    }

    /// The same request with an inline payload instead of the gather list.
    pub fn with_inline(mut self, data: &'a [&'a [u8]]) -> Self {
        self.inline = data;
        self.flags |= SendFlags::INLINE;
        self
    }

    /// The same request addressed to a UD destination.
    pub fn to(mut self, ud: UdDest<'a>) -> Self {
        self.ud = Some(ud);
        self
    }
}

/// Bytes a UD receive buffer reserves in front of the payload: the device writes the 40-byte
/// Global Route Header there (InfiniBand with a GRH, or RoCE, where bytes 20..40 carry the
/// IPv4 header of a RoCE v2 packet) and leaves it alone otherwise
/// ([`WcFlags::GRH`] tells which). A UD receive of up to `n` payload bytes needs a scatter
/// list of `UD_GRH_BYTES + n` bytes; the completion's `byte_len` counts both. The payload
/// limit itself is the port's path MTU (a 4096-byte datagram fits MTU 4096): the GRH is not
/// part of it.
pub const UD_GRH_BYTES: u32 = 40;

/// A receive work request (`struct ibv_recv_wr` without `next`). On a UD QP the first
/// [`UD_GRH_BYTES`] of the scatter list receive the GRH, not payload.
#[derive(Clone, Copy, Debug)]
pub struct RecvWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Scatter list.
    pub sg_list: &'a [Sge],
}

/// Work-completion opcode (`enum ibv_wc_opcode`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct WcOpcode(pub u32);

impl WcOpcode {
    /// SEND (any flavour).
    pub const SEND: Self = Self(0);
    /// RDMA WRITE (with or without immediate) on the requester.
    pub const RDMA_WRITE: Self = Self(1);
    /// RDMA READ.
    pub const RDMA_READ: Self = Self(2);
    /// Compare-and-swap.
    pub const COMP_SWAP: Self = Self(3);
    /// Fetch-and-add.
    pub const FETCH_ADD: Self = Self(4);
    /// A receive (SEND at the responder).
    pub const RECV: Self = Self(128);
    /// A receive consumed by an RDMA WRITE with immediate.
    pub const RECV_RDMA_WITH_IMM: Self = Self(129);
}

/// Work-completion flags (`enum ibv_wc_flags`) plus driver extras.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WcFlags(pub u32);

impl WcFlags {
    /// A GRH precedes the payload in the receive buffer (UD): the first [`UD_GRH_BYTES`] hold
    /// it. Without the flag those bytes are reserved all the same and left unwritten.
    pub const GRH: Self = Self(1);
    /// `imm_data` is valid.
    pub const WITH_IMM: Self = Self(2);
    /// `invalidated_rkey` is valid.
    pub const WITH_INV: Self = Self(8);
    /// Driver extra: this completion reports an unsignaled send WR that a later signaled (or
    /// error) CQE retired; only with [`QpInitAttr::report_unsignaled`](crate::QpInitAttr).
    pub const UNSIGNALED: Self = Self(1 << 16);
    /// Driver extra: the CQE's solicited-event bit was set.
    pub const SOLICITED: Self = Self(1 << 17);
}

bit_set!(WcFlags);

/// A work completion (`struct ibv_wc`) with the whole CQE decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The work request's id.
    pub wr_id: u64,
    /// Status (`WcStatus::SUCCESS` or the error the syndrome maps to).
    pub status: WcStatus,
    /// The CQE syndrome of an error completion (0 on success).
    pub syndrome: Syndrome,
    /// The vendor syndrome of an error completion (`wc.vendor_err`).
    pub vendor_err: VendorSyndrome,
    /// Opcode; for errors, the opcode of the failed send WR as the driver recorded it.
    pub opcode: WcOpcode,
    /// Bytes received (responder) or read (RDMA READ); 8 for atomics.
    pub byte_len: u32,
    /// Immediate data in network order, valid with [`WcFlags::WITH_IMM`].
    pub imm_data: [u8; 4],
    /// Invalidated rkey, valid with [`WcFlags::WITH_INV`].
    pub invalidated_rkey: u32,
    /// Local QP number.
    pub qp_num: u32,
    /// Source QP (UD and responder completions).
    pub src_qp: u32,
    /// Flags.
    pub wc_flags: WcFlags,
    /// Source LID.
    pub slid: u16,
    /// Service level.
    pub sl: u8,
    /// Destination LID path bits.
    pub dlid_path_bits: u8,
    /// P_Key index (UD/GSI).
    pub pkey_index: u16,
    /// Raw completion timestamp (HCA clock).
    pub timestamp: u64,
}

impl Default for WorkCompletion {
    fn default() -> Self {
        Self {
            wr_id: 0,
            status: WcStatus::SUCCESS,
            syndrome: Syndrome(0),
            vendor_err: VendorSyndrome(0),
            opcode: WcOpcode::SEND,
            byte_len: 0,
            imm_data: [0; 4],
            invalidated_rkey: 0,
            qp_num: 0,
            src_qp: 0,
            wc_flags: WcFlags(0),
            slid: 0,
            sl: 0,
            dlid_path_bits: 0,
            pkey_index: 0,
            timestamp: 0,
        }
    }
}

impl WorkCompletion {
    /// Whether the status is success.
    pub fn is_ok(&self) -> bool {
        self.status == WcStatus::SUCCESS
    }
}

/// Why a post was refused (fast path: small and `Copy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PostError {
    /// The queue has no room: `outstanding` WRs are posted and not yet retired, of `capacity`.
    Full {
        /// WRs posted and not yet retired by a completion.
        outstanding: u32,
        /// Queue capacity in WRs.
        capacity: u32,
    },
    /// More SGEs than the queue was created for.
    TooManySges {
        /// SGEs in the request.
        n: usize,
        /// The queue's limit.
        max: u32,
    },
    /// Inline payload larger than `max_inline_data`.
    InlineTooLarge {
        /// Total inline bytes.
        len: usize,
        /// The queue's limit.
        max: u32,
    },
    /// The QP is not in a state that allows posting (send: RTS/SQD/SQE/ERR; receive: INIT+).
    BadState {
        /// The current state.
        state: QpState,
    },
    /// The operation is not valid on this QP type (e.g. RDMA READ on UC, anything but SEND on UD).
    BadOpcode,
    /// A UD send without a destination, or a destination on a connected QP.
    BadDestination,
    /// An atomic needs one SGE of at least 8 bytes.
    BadAtomicSge,
    /// A UD destination whose address handle belongs to another device context.
    ForeignAh,
    /// A low-level retire named a WQE counter that is no posted, unretired WQE of the queue
    /// (a lying counter, a CQE of another queue, or one already retired): nothing retired.
    NotOutstanding {
        /// The counter given.
        wqe_counter: u16,
    },
    /// Transport segments (XRC, DC address, Ethernet) that are not whole 16-byte units or
    /// exceed what the QP type reserves between the control segment and the payload.
    BadSegments {
        /// Bytes of segments given.
        len: usize,
        /// Bytes the QP type reserves past the control segment.
        reserved: u32,
    },
    /// A DC WR's stream id beyond the DCI's streams (0 is the only one of a DCI created
    /// without streams).
    BadStream {
        /// The stream id given.
        stream: u16,
        /// The DCI's number of concurrent streams.
        streams: u32,
    },
}

impl core::fmt::Display for PostError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            PostError::Full {
                outstanding,
                capacity,
            } => {
                write!(f, "queue full: {outstanding} of {capacity} WRs outstanding")
            }
            PostError::TooManySges { n, max } => write!(f, "num_sge {n} exceeds max_sge {max}"),
            PostError::InlineTooLarge { len, max } => {
                write!(f, "inline data {len} exceeds max_inline_data {max}")
            }
            PostError::BadState { state } => write!(f, "QP state {state:?} does not allow posting"),
            PostError::BadOpcode => write!(f, "operation not supported on this QP type"),
            PostError::BadDestination => {
                write!(f, "UD sends need a destination; connected QPs take none")
            }
            PostError::BadAtomicSge => write!(f, "atomics need one SGE of at least 8 bytes"),
            PostError::ForeignAh => write!(f, "address handle of another device context"),
            PostError::NotOutstanding { wqe_counter } => write!(
                f,
                "WQE counter {wqe_counter} names no posted, unretired WQE of this queue"
            ),
            PostError::BadSegments { len, reserved } => write!(
                f,
                "{len} bytes of segments: not whole 16-byte units within the {reserved} bytes \
                 this QP type reserves after the control segment"
            ),
            PostError::BadStream { stream, streams } => write!(
                f,
                "DCI stream id {stream} is not one of the DCI's {streams} streams"
            ),
        }
    }
}

impl std::error::Error for PostError {}
