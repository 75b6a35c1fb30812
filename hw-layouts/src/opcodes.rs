//! Codes: send opcodes (ctrl byte 3), CQE opcodes (`op_own` bits 7:4), CQE error syndromes,
//! vendor syndromes and the verbs `enum ibv_wc_status` they map to.
//!
//! All of them are *open* enums: a newtype over the wire integer with associated consts for
//! the known values, so an unknown value coming from the device is kept, never a panic.
//! `name()` gives the short name of a known value; `ALL` lists every named value together with
//! its C name in `mlx5dv.h` / `verbs.h` (empty when the header has none), which
//! `tests/header_check.rs` compares against the installed headers.

use core::fmt;

/// Declares an open enum: `pub struct $name(pub $repr)` with associated consts, `ALL`,
/// `name()`, `Debug` (`NAME(0x..)`) and `Display` (`NAME` or `UNKNOWN(0x..)`).
macro_rules! open_enum {
    (
        $(#[$meta:meta])*
        pub struct $name:ident(pub $repr:ty);
        $( $(#[$cmeta:meta])* $konst:ident = $val:expr, $c:expr; )*
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
        #[repr(transparent)]
        pub struct $name(pub $repr);

        impl $name {
            $( $(#[$cmeta])* pub const $konst: Self = Self($val); )*

            /// Every named value: `(value, short name, C header name or "" if the header has none)`.
            pub const ALL: &'static [(Self, &'static str, &'static str)] =
                &[ $( (Self::$konst, stringify!($konst), $c), )* ];

            /// The short name of a known value, `None` for a value this crate does not know.
            pub const fn name(self) -> Option<&'static str> {
                match self.0 {
                    $( v if v == $val => Some(stringify!($konst)), )*
                    _ => None,
                }
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self.name() {
                    Some(n) => write!(f, "{}({:#04x})", n, self.0),
                    None => write!(f, "{}({:#04x})", stringify!($name), self.0),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self.name() {
                    Some(n) => f.write_str(n),
                    None => write!(f, "UNKNOWN({:#04x})", self.0),
                }
            }
        }

        impl From<$repr> for $name {
            fn from(v: $repr) -> Self {
                Self(v)
            }
        }

        impl From<$name> for $repr {
            fn from(v: $name) -> Self {
                v.0
            }
        }
    };
}

open_enum! {
    /// Send WQE opcode, control segment byte 3 (`opmod_idx_opcode` bits 7:0). Also found in
    /// requester CQEs (`sop_drop_qpn` bits 31:24) and error CQEs (`s_wqe_opcode_qpn` 31:24).
    pub struct SendOpcode(pub u8);
    /// No operation (DV users post it to get a completion without data movement).
    NOP = 0x00, "MLX5_OPCODE_NOP";
    /// SEND with invalidate (`IBV_WR_SEND_WITH_INV`); ctrl `imm` = BE32(rkey to invalidate).
    SEND_INVAL = 0x01, "MLX5_OPCODE_SEND_INVAL";
    /// RDMA WRITE: ctrl, raddr, data/inline.
    RDMA_WRITE = 0x08, "MLX5_OPCODE_RDMA_WRITE";
    /// RDMA WRITE with immediate.
    RDMA_WRITE_IMM = 0x09, "MLX5_OPCODE_RDMA_WRITE_IMM";
    /// SEND: ctrl, (UD: AV), data/inline.
    SEND = 0x0A, "MLX5_OPCODE_SEND";
    /// SEND with immediate.
    SEND_IMM = 0x0B, "MLX5_OPCODE_SEND_IMM";
    /// Large send offload (raw packet / underlay UD).
    TSO = 0x0E, "MLX5_OPCODE_TSO";
    /// RDMA READ: ctrl, raddr, data (local destination).
    RDMA_READ = 0x10, "MLX5_OPCODE_RDMA_READ";
    /// 8-byte compare-and-swap: ctrl, raddr, atomic, data (8 B result).
    ATOMIC_CS = 0x11, "MLX5_OPCODE_ATOMIC_CS";
    /// 8-byte fetch-and-add: ctrl, raddr, atomic, data (8 B result).
    ATOMIC_FA = 0x12, "MLX5_OPCODE_ATOMIC_FA";
    /// Masked (extended) compare-and-swap; opmod = 0x08 | (log2(size) - 2).
    ATOMIC_MASKED_CS = 0x14, "MLX5_OPCODE_ATOMIC_MASKED_CS";
    /// Masked (extended) fetch-and-add; opmod = 0x08 | (log2(size) - 2).
    ATOMIC_MASKED_FA = 0x15, "MLX5_OPCODE_ATOMIC_MASKED_FA";
    /// Legacy fast memory registration.
    FMR = 0x19, "MLX5_OPCODE_FMR";
    /// Local invalidate (kernel only).
    LOCAL_INVAL = 0x1B, "MLX5_OPCODE_LOCAL_INVAL";
    /// Configuration command.
    CONFIG_CMD = 0x1F, "MLX5_OPCODE_CONFIG_CMD";
    /// Set PSV (signature offload).
    SET_PSV = 0x20, "MLX5_OPCODE_SET_PSV";
    /// User memory registration (LOCAL_INV, BIND_MW, mkey configure).
    UMR = 0x25, "MLX5_OPCODE_UMR";
    /// Tag-matching list operation.
    TAG_MATCHING = 0x28, "MLX5_OPCODE_TAG_MATCHING";
    /// Flow table access (steering).
    FLOW_TBL_ACCESS = 0x2C, "MLX5_OPCODE_FLOW_TBL_ACCESS";
    /// Memory-to-memory offload (DMA memcpy).
    MMO = 0x2F, "MLX5_OPCODE_MMO";
}

impl SendOpcode {
    /// An atomic (compare-and-swap or fetch-and-add, plain or masked): an atomic segment
    /// follows the remote address segment.
    pub const fn is_atomic(self) -> bool {
        matches!(
            self,
            Self::ATOMIC_CS | Self::ATOMIC_FA | Self::ATOMIC_MASKED_CS | Self::ATOMIC_MASKED_FA
        )
    }

    /// An RDMA operation (WRITE, WRITE with immediate, READ, atomics): a remote address
    /// segment follows the control segment (and a UD address vector, where there is one).
    pub const fn has_raddr(self) -> bool {
        matches!(
            self,
            Self::RDMA_WRITE | Self::RDMA_WRITE_IMM | Self::RDMA_READ
        ) || self.is_atomic()
    }
}

/// Control-segment opcode modifier of a masked atomic on 4-byte operands (`0x08 | (2 - 2)`).
pub const OPMOD_MASKED_ATOMIC_4B: u8 = 0x08;
/// Control-segment opcode modifier of a masked atomic on 8-byte operands (`0x08 | (3 - 2)`).
pub const OPMOD_MASKED_ATOMIC_8B: u8 = 0x09;

open_enum! {
    /// CQE opcode, `op_own` bits 7:4.
    pub struct CqeOpcode(pub u8);
    /// Requester completion (success).
    REQ = 0, "MLX5_CQE_REQ";
    /// Responder: RDMA WRITE with immediate (consumed a receive WQE).
    RESP_RDMA_WRITE_IMM = 1, "MLX5_CQE_RESP_WR_IMM";
    /// Responder: SEND.
    RESP_SEND = 2, "MLX5_CQE_RESP_SEND";
    /// Responder: SEND with immediate.
    RESP_SEND_IMM = 3, "MLX5_CQE_RESP_SEND_IMM";
    /// Responder: SEND with invalidate.
    RESP_SEND_INV = 4, "MLX5_CQE_RESP_SEND_INV";
    /// Marker: switch to the resized CQ buffer.
    RESIZE_CQ = 5, "MLX5_CQE_RESIZE_CQ";
    /// Tag-matching list-operation completion (no packet).
    NO_PACKET = 6, "MLX5_CQE_NO_PACKET";
    /// Signature (T10-DIF/CRC) error report, not a work completion.
    SIG_ERR = 12, "MLX5_CQE_SIG_ERR";
    /// Requester error (error-CQE view).
    REQ_ERR = 13, "MLX5_CQE_REQ_ERR";
    /// Responder error (error-CQE view).
    RESP_ERR = 14, "MLX5_CQE_RESP_ERR";
    /// Never written by hardware; software marks empty entries with it.
    INVALID = 15, "MLX5_CQE_INVALID";
}

impl CqeOpcode {
    /// rdma-core's name for [`CqeOpcode::RESP_RDMA_WRITE_IMM`] (`MLX5_CQE_RESP_WR_IMM`).
    pub const RESP_WR_IMM: Self = Self::RESP_RDMA_WRITE_IMM;

    /// True for the two error-CQE opcodes (REQ_ERR, RESP_ERR).
    pub const fn is_error(self) -> bool {
        self.0 == Self::REQ_ERR.0 || self.0 == Self::RESP_ERR.0
    }

    /// True for the responder (receive-side) success opcodes 1..=4.
    pub const fn is_responder(self) -> bool {
        self.0 >= Self::RESP_RDMA_WRITE_IMM.0 && self.0 <= Self::RESP_SEND_INV.0
    }
}

open_enum! {
    /// Verbs work-completion status, mirror of `enum ibv_wc_status` (verbs.h).
    pub struct WcStatus(pub u32);
    /// Success.
    SUCCESS = 0, "IBV_WC_SUCCESS";
    /// Local length error.
    LOC_LEN_ERR = 1, "IBV_WC_LOC_LEN_ERR";
    /// Local QP operation error.
    LOC_QP_OP_ERR = 2, "IBV_WC_LOC_QP_OP_ERR";
    /// Local EE context operation error.
    LOC_EEC_OP_ERR = 3, "IBV_WC_LOC_EEC_OP_ERR";
    /// Local protection error.
    LOC_PROT_ERR = 4, "IBV_WC_LOC_PROT_ERR";
    /// Work request flushed.
    WR_FLUSH_ERR = 5, "IBV_WC_WR_FLUSH_ERR";
    /// Memory window bind error.
    MW_BIND_ERR = 6, "IBV_WC_MW_BIND_ERR";
    /// Bad response.
    BAD_RESP_ERR = 7, "IBV_WC_BAD_RESP_ERR";
    /// Local access error.
    LOC_ACCESS_ERR = 8, "IBV_WC_LOC_ACCESS_ERR";
    /// Remote invalid request.
    REM_INV_REQ_ERR = 9, "IBV_WC_REM_INV_REQ_ERR";
    /// Remote access error.
    REM_ACCESS_ERR = 10, "IBV_WC_REM_ACCESS_ERR";
    /// Remote operation error.
    REM_OP_ERR = 11, "IBV_WC_REM_OP_ERR";
    /// Transport retry counter exceeded.
    RETRY_EXC_ERR = 12, "IBV_WC_RETRY_EXC_ERR";
    /// RNR retry counter exceeded.
    RNR_RETRY_EXC_ERR = 13, "IBV_WC_RNR_RETRY_EXC_ERR";
    /// Local RDD violation.
    LOC_RDD_VIOL_ERR = 14, "IBV_WC_LOC_RDD_VIOL_ERR";
    /// Remote invalid RD request.
    REM_INV_RD_REQ_ERR = 15, "IBV_WC_REM_INV_RD_REQ_ERR";
    /// Remote aborted.
    REM_ABORT_ERR = 16, "IBV_WC_REM_ABORT_ERR";
    /// Invalid EE context number.
    INV_EECN_ERR = 17, "IBV_WC_INV_EECN_ERR";
    /// Invalid EE context state.
    INV_EEC_STATE_ERR = 18, "IBV_WC_INV_EEC_STATE_ERR";
    /// Fatal error.
    FATAL_ERR = 19, "IBV_WC_FATAL_ERR";
    /// Response timeout.
    RESP_TIMEOUT_ERR = 20, "IBV_WC_RESP_TIMEOUT_ERR";
    /// General error (any syndrome without a specific mapping).
    GENERAL_ERR = 21, "IBV_WC_GENERAL_ERR";
    /// Tag-matching error.
    TM_ERR = 22, "IBV_WC_TM_ERR";
    /// Tag-matching rendezvous incomplete.
    TM_RNDV_INCOMPLETE = 23, "IBV_WC_TM_RNDV_INCOMPLETE";
}

open_enum! {
    /// CQE error syndrome, error-CQE byte 55 (`syndrome`); maps to `wc.status`.
    pub struct Syndrome(pub u8);
    /// Local length error.
    LOCAL_LENGTH = 0x01, "MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR";
    /// Local QP operation error.
    LOCAL_QP_OP = 0x02, "MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR";
    /// Local protection error.
    LOCAL_PROT = 0x04, "MLX5_CQE_SYNDROME_LOCAL_PROT_ERR";
    /// Work request flushed.
    WR_FLUSH = 0x05, "MLX5_CQE_SYNDROME_WR_FLUSH_ERR";
    /// Memory window bind error.
    MW_BIND = 0x06, "MLX5_CQE_SYNDROME_MW_BIND_ERR";
    /// Bad response.
    BAD_RESP = 0x10, "MLX5_CQE_SYNDROME_BAD_RESP_ERR";
    /// Local access error.
    LOCAL_ACCESS = 0x11, "MLX5_CQE_SYNDROME_LOCAL_ACCESS_ERR";
    /// Remote invalid request.
    REMOTE_INVAL_REQ = 0x12, "MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR";
    /// Remote access error.
    REMOTE_ACCESS = 0x13, "MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR";
    /// Remote operation error.
    REMOTE_OP = 0x14, "MLX5_CQE_SYNDROME_REMOTE_OP_ERR";
    /// Transport retry counter exceeded.
    TRANSPORT_RETRY_EXC = 0x15, "MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR";
    /// RNR retry counter exceeded.
    RNR_RETRY_EXC = 0x16, "MLX5_CQE_SYNDROME_RNR_RETRY_EXC_ERR";
    /// Remote aborted.
    REMOTE_ABORTED = 0x22, "MLX5_CQE_SYNDROME_REMOTE_ABORTED_ERR";
}

impl Syndrome {
    /// One-line meaning of a known syndrome (`None` for unknown values).
    pub const fn meaning(self) -> Option<&'static str> {
        Some(match self {
            Self::LOCAL_LENGTH => {
                "local length error: the message does not fit the posted buffers or exceeds the port MTU/max message size"
            }
            Self::LOCAL_QP_OP => {
                "local QP operation error: an internal consistency error was detected while executing this WQE (e.g. malformed WQE)"
            }
            Self::LOCAL_PROT => {
                "local protection error: an lkey in the WQE is invalid or does not cover the addressed range"
            }
            Self::WR_FLUSH => {
                "work request flushed: the QP is in the error state, the WQE was not executed"
            }
            Self::MW_BIND => "memory window bind error: the bind operation was not permitted",
            Self::BAD_RESP => "bad response: the responder returned an unexpected transport opcode",
            Self::LOCAL_ACCESS => {
                "local access error: a protection error on a local buffer while processing an incoming RDMA READ/atomic response"
            }
            Self::REMOTE_INVAL_REQ => {
                "remote invalid request: the responder found the request invalid (unsupported op, length too long, no receive WQE on UC/RC SRQ limit)"
            }
            Self::REMOTE_ACCESS => {
                "remote access error: the rkey, address range or access rights were rejected by the responder"
            }
            Self::REMOTE_OP => {
                "remote operation error: the responder could not complete the operation (e.g. its receive WQE was malformed or too small)"
            }
            Self::TRANSPORT_RETRY_EXC => {
                "transport retry counter exceeded: no ACK from the remote side after retry_cnt retransmissions"
            }
            Self::RNR_RETRY_EXC => {
                "RNR retry counter exceeded: the remote side had no receive WQE posted after rnr_retry attempts"
            }
            Self::REMOTE_ABORTED => {
                "remote aborted: the responder aborted the operation (also used for ODP page faults on SRQ)"
            }
            _ => return None,
        })
    }

    /// The `ibv_wc_status` libmlx5 reports for this syndrome; unknown syndromes map to
    /// [`WcStatus::GENERAL_ERR`].
    pub const fn wc_status(self) -> WcStatus {
        match self {
            Self::LOCAL_LENGTH => WcStatus::LOC_LEN_ERR,
            Self::LOCAL_QP_OP => WcStatus::LOC_QP_OP_ERR,
            Self::LOCAL_PROT => WcStatus::LOC_PROT_ERR,
            Self::WR_FLUSH => WcStatus::WR_FLUSH_ERR,
            Self::MW_BIND => WcStatus::MW_BIND_ERR,
            Self::BAD_RESP => WcStatus::BAD_RESP_ERR,
            Self::LOCAL_ACCESS => WcStatus::LOC_ACCESS_ERR,
            Self::REMOTE_INVAL_REQ => WcStatus::REM_INV_REQ_ERR,
            Self::REMOTE_ACCESS => WcStatus::REM_ACCESS_ERR,
            Self::REMOTE_OP => WcStatus::REM_OP_ERR,
            Self::TRANSPORT_RETRY_EXC => WcStatus::RETRY_EXC_ERR,
            Self::RNR_RETRY_EXC => WcStatus::RNR_RETRY_EXC_ERR,
            Self::REMOTE_ABORTED => WcStatus::REM_ABORT_ERR,
            _ => WcStatus::GENERAL_ERR,
        }
    }
}

open_enum! {
    /// Vendor error syndrome, error-CQE byte 54 (`vendor_err_synd`), reported as `wc.vendor_err`.
    ///
    /// The PRM does not publish this table; `mlx5dv.h` names only ODP_PFAULT. The other values
    /// are the ones real ConnectX (mlx5) devices report, as recorded in public logs (UCX
    /// `ib_mlx5_log` lines "synd 0x.. vend 0x..", kernel `mlx5_poll_one` / `dump_cqe` output,
    /// NCCL "vendor err N" messages, perftest reports); each const says where it was seen.
    /// No public record was found for LOCAL_LENGTH, MW_BIND, BAD_RESP, LOCAL_ACCESS and
    /// REMOTE_ABORTED (other than ODP): for those the emulator reports 0.
    /// [`VendorSyndrome::for_syndrome`] gives the value the emulator pairs with a syndrome when
    /// it knows no more; for a key check that failed it reports the memory-translation code of
    /// that check instead (gather list 0x50 + detail, data buffer 0x30 + detail: the decoder's
    /// layout, `syndrome::vendor_meaning`), and 0x87 for RNR retries exceeded
    /// (`docs/diagnostics.md`, "Vendor syndromes per cause").
    pub struct VendorSyndrome(pub u8);
    /// Responder: a receive WQE's scatter entry names an lkey/range it may not write (UCX SRQ
    /// log "Local protection error (synd 0x4 vend 0x32)").
    LOCAL_PROT_RESP = 0x32, "";
    /// Responder: a receive WQE's scatter entry names a key no MR has (data buffer, detail 0).
    LOCAL_PROT_RESP_KEY = 0x30, "";
    /// Responder: a receive buffer's MR lacks LOCAL_WRITE (data buffer, access rights).
    LOCAL_PROT_RESP_RIGHTS = 0x33, "";
    /// Responder: a receive sge's range is outside its MR (data buffer, length violation).
    LOCAL_PROT_RESP_RANGE = 0x34, "";
    /// Requester: a gather entry names a key no MR has (gather list, detail 0: the decoder
    /// has no code for an unknown key; the emulator's choice, `docs/diagnostics.md`).
    LOCAL_PROT_KEY = 0x50, "";
    /// Requester: the device could not read a gather buffer (gather list, PCIe error; NCCL
    /// "error 4 ... vendor err 81", perftest "status 4 ... syndrom 0x51").
    LOCAL_PROT = 0x51, "";
    /// Requester: a gather entry's MR is another PD's (gather list, PD violation).
    LOCAL_PROT_PD = 0x52, "";
    /// Requester: the key's MR lacks the access the device needs (gather list, access rights).
    LOCAL_PROT_RIGHTS = 0x53, "";
    /// Requester: a gather entry's range is outside its MR (gather list, length violation).
    LOCAL_PROT_RANGE = 0x54, "";
    /// RNR retry counter exceeded (the decoder's "receiver-not-ready NAK, retry limit
    /// exceeded"; no public log pairs it with the syndrome).
    RNR_RETRY_EXC = 0x87, "";
    /// Requester local QP operation error, e.g. an opcode the QP cannot execute (UCX
    /// "Local QP operation (synd 0x2 vend 0x68) opcode MASKED_COMPARE_SWAP").
    LOCAL_QP_OP = 0x68, "";
    /// Transport retry counter exceeded: no ACK from the peer (UCX "synd 0x15 vend 0x81",
    /// NCCL "status=12 ... vendor err 129").
    TRANSPORT_RETRY_EXC = 0x81, "";
    /// Remote access error: rkey/range/rights rejected by the responder (kernel `dump_cqe`
    /// word `00008813`: vendor 0x88, syndrome 0x13).
    REMOTE_ACCESS = 0x88, "";
    /// Remote operation error (UCX "synd 0x14 vend 0x89").
    REMOTE_OP = 0x89, "";
    /// Remote invalid request (libmlx5 error-CQE dump: syndrome 0x12, vendor_err_synd 0x8a).
    REMOTE_INVAL_REQ = 0x8A, "";
    /// ODP page fault on an SRQ receive (with syndrome REMOTE_ABORTED); libmlx5 re-posts the WQE.
    ODP_PFAULT = 0x93, "MLX5_CQE_VENDOR_SYNDROME_ODP_PFAULT";
    /// Responder local QP operation error: malformed receive WQE ("RDE_MAL_WQE", syndrome
    /// 0x02 / vendor 0xd6, named by an NVIDIA maintainer in UCX review).
    LOCAL_QP_OP_RESP = 0xD6, "";
    /// Work request flushed (kernel "syndrome 0x5, vendor syndrome 0xf9", NCCL "status=5 ...
    /// vendor err 249").
    WR_FLUSH = 0xF9, "";
}

impl VendorSyndrome {
    /// One-line meaning of a known vendor syndrome (`None` for unknown values).
    pub const fn meaning(self) -> Option<&'static str> {
        Some(match self {
            Self::LOCAL_PROT_RESP => {
                "responder local protection: receive buffer lkey/range not writable"
            }
            Self::LOCAL_PROT_RESP_KEY => "responder local protection: receive lkey unknown",
            Self::LOCAL_PROT_RESP_RIGHTS => {
                "responder local protection: receive buffer's MR lacks LOCAL_WRITE"
            }
            Self::LOCAL_PROT_RESP_RANGE => "responder local protection: receive sge outside its MR",
            Self::LOCAL_PROT_KEY => "requester local protection: gather lkey unknown",
            Self::LOCAL_PROT => "requester local protection: gather buffer unreachable (PCIe)",
            Self::LOCAL_PROT_PD => "requester local protection: gather MR of another PD",
            Self::LOCAL_PROT_RIGHTS => "requester local protection: MR lacks the access needed",
            Self::LOCAL_PROT_RANGE => "requester local protection: gather sge outside its MR",
            Self::RNR_RETRY_EXC => "RNR retry exceeded: the responder had no receive WQE",
            Self::LOCAL_QP_OP => "requester local QP operation: WQE cannot be executed on this QP",
            Self::TRANSPORT_RETRY_EXC => "transport retry exceeded: peer did not acknowledge",
            Self::REMOTE_ACCESS => "remote access: responder rejected rkey, range or rights",
            Self::REMOTE_OP => "remote operation: responder could not complete the request",
            Self::REMOTE_INVAL_REQ => "remote invalid request: responder found the request invalid",
            Self::ODP_PFAULT => "on-demand-paging page fault on an SRQ receive buffer",
            Self::LOCAL_QP_OP_RESP => "responder local QP operation: malformed receive WQE",
            Self::WR_FLUSH => "flushed: the QP was in the error state",
            _ => return None,
        })
    }

    /// The vendor syndrome the emulator reports together with `syndrome` in a requester error
    /// CQE (`VendorSyndrome(0)` where no code is known: LOCAL_LENGTH, MW_BIND, BAD_RESP,
    /// LOCAL_ACCESS, RNR_RETRY_EXC, REMOTE_ABORTED and unknown syndromes).
    pub const fn for_syndrome(syndrome: Syndrome) -> Self {
        match syndrome {
            Syndrome::LOCAL_QP_OP => Self::LOCAL_QP_OP,
            Syndrome::LOCAL_PROT => Self::LOCAL_PROT,
            Syndrome::WR_FLUSH => Self::WR_FLUSH,
            Syndrome::REMOTE_INVAL_REQ => Self::REMOTE_INVAL_REQ,
            Syndrome::REMOTE_ACCESS => Self::REMOTE_ACCESS,
            Syndrome::REMOTE_OP => Self::REMOTE_OP,
            Syndrome::TRANSPORT_RETRY_EXC => Self::TRANSPORT_RETRY_EXC,
            _ => Self(0),
        }
    }

    /// The vendor syndrome the emulator reports with `syndrome` in a responder (receive-side)
    /// error CQE; differs from [`VendorSyndrome::for_syndrome`] where the device uses a
    /// receive-side code (LOCAL_PROT, LOCAL_QP_OP).
    pub const fn for_responder_syndrome(syndrome: Syndrome) -> Self {
        match syndrome {
            Syndrome::LOCAL_PROT => Self::LOCAL_PROT_RESP,
            Syndrome::LOCAL_QP_OP => Self::LOCAL_QP_OP_RESP,
            _ => Self::for_syndrome(syndrome),
        }
    }
}
