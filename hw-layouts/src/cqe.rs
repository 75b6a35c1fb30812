//! Completion queue entries (PRM "Completion Queue Entry"; rdma-core `struct mlx5_cqe64`,
//! `struct mlx5_err_cqe`).
//!
//! A CQ is a ring of 64- or 128-byte entries. The 64-byte descriptor [`Cqe64`] is the whole
//! entry for 64-byte CQEs and the **second** half (offset 64) of a 128-byte entry; the first
//! half then holds up to 64 bytes of scattered payload. Ownership: software owns entry `ci`
//! iff its opcode is not INVALID and its owner bit equals bit `log_ncqe` of the free-running
//! consumer index ([`sw_owns`]). Error completions (opcode REQ_ERR / RESP_ERR) are read
//! through the [`ErrCqe`] view of the same 64 bytes.

use crate::opcodes::{CqeOpcode, SendOpcode, Syndrome, VendorSyndrome};
pub use crate::syndrome::{Explanation, explain};
use crate::types::{Be16, Be32, Be64};
use crate::wqe::QPN24;
use core::fmt;
use core::mem::offset_of;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Entry size of a 64-byte-CQE ring.
pub const CQE_SIZE_64: usize = 64;
/// Entry size of a 128-byte-CQE ring.
pub const CQE_SIZE_128: usize = 128;
/// `op_own` software writes into every entry of a fresh CQ: opcode INVALID, owner 0.
pub const CQE_INVALID_OP_OWN: u8 = 0xF0;
/// `op_own` bit 0: owner (`MLX5_CQE_OWNER_MASK`).
pub const CQE_OWNER_MASK: u8 = 0x01;
/// `op_own` bit 1: solicited event.
pub const CQE_SE_MASK: u8 = 0x02;
/// `op_own` format 1: 32 bytes of payload scattered into the CQE (`MLX5_INLINE_SCATTER_32`, as a mask).
pub const INLINE_SCATTER_32: u8 = 0x04;
/// `op_own` format 2: 64 bytes scattered (128-byte CQEs only) (`MLX5_INLINE_SCATTER_64`, as a mask).
pub const INLINE_SCATTER_64: u8 = 0x08;
/// `op_own` format value 0: normal CQE.
pub const CQE_FORMAT_NORMAL: u8 = 0;
/// `op_own` format value 1: 32 B inline scatter.
pub const CQE_FORMAT_SCATTER_32: u8 = 1;
/// `op_own` format value 2: 64 B inline scatter.
pub const CQE_FORMAT_SCATTER_64: u8 = 2;
/// `op_own` format value 3: compressed block (mini-CQEs).
pub const CQE_FORMAT_COMPRESSED: u8 = 3;
/// `flags_rqpn` bits 29:28: L3 header (GRH) present in the receive buffer / in the CQE.
pub const CQE_FLAGS_GRH_MASK: u32 = 0x3 << 28;

/// Byte offset of the 64-byte descriptor inside one ring entry of `cqe_size` bytes
/// (0 for 64-byte CQEs, 64 for 128-byte CQEs).
pub const fn desc_offset(cqe_size: usize) -> usize {
    if cqe_size == CQE_SIZE_128 {
        CQE_SIZE_128 - CQE_SIZE_64
    } else {
        0
    }
}

/// Build an `op_own` byte: opcode 7:4 | format 3:2 | se 1 | owner 0.
pub const fn op_own(opcode: CqeOpcode, format: u8, se: bool, owner: u8) -> u8 {
    (opcode.0 << 4) | ((format & 3) << 2) | ((se as u8) << 1) | (owner & 1)
}

/// True if software owns the entry whose `op_own` byte is `op_own` when the free-running
/// consumer index is `ci` on a ring of `1 << log_ncqe` entries: the opcode is not INVALID and
/// the owner bit equals `(ci >> log_ncqe) & 1`.
pub const fn sw_owns(op_own: u8, ci: u32, log_ncqe: u8) -> bool {
    let pass = if log_ncqe >= 32 {
        0
    } else {
        (ci >> log_ncqe) & 1
    };
    (op_own >> 4) != CqeOpcode::INVALID.0 && (op_own & CQE_OWNER_MASK) as u32 == pass
}

/// The owner bit hardware writes in pass `pi >> log_ncqe` (producer index `pi`).
pub const fn hw_owner_bit(pi: u32, log_ncqe: u8) -> u8 {
    if log_ncqe >= 32 {
        0
    } else {
        ((pi >> log_ncqe) & 1) as u8
    }
}

/// The 64-byte CQE descriptor. rdma-core `struct mlx5_cqe64` (the first 32 bytes are a union
/// in C with the tag-matching views; this is the normal view).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct Cqe64 {
    /* 0x00 */ pub rsvd0: [u8; 2],
    /* 0x02 */ pub wqe_id: Be16, // striding RQ WQE index
    /* 0x04 */ pub rsvd4: [u8; 13],
    /* 0x11 */ pub ml_path: u8, // 6:0 DLID path bits
    /* 0x12 */ pub rsvd20: [u8; 4],
    /* 0x16 */ pub slid: Be16,
    /* 0x18 */ pub flags_rqpn: Be32, // 29:28 L3 hdr | 27:24 SL | 23:0 remote QPN
    /* 0x1c */ pub hds_ip_ext: u8, // 2 L4 ok | 1 L3 ok | 0 L2 ok
    /* 0x1d */ pub l4_hdr_type_etc: u8, // 3:2 L3 header type
    /* 0x1e */ pub vlan_info: Be16,
    /* 0x20 */ pub srqn_uidx: Be32, // 23:0 SRQN (v0) / user index (v1)
    /* 0x24 */
    pub imm_inval_pkey: Be32, // immediate / invalidated rkey / 15:0 pkey index
    /* 0x28 */ pub app: u8,
    /* 0x29 */ pub app_op: u8,
    /* 0x2a */ pub app_info: Be16,
    /* 0x2c */ pub byte_cnt: Be32,
    /* 0x30 */ pub timestamp: Be64,
    /* 0x38 */ pub sop_drop_qpn: Be32, // 31:24 send opcode (requester) | 23:0 local QPN
    /* 0x3c */ pub wqe_counter: Be16,
    /* 0x3e */ pub signature: u8,
    /* 0x3f */ pub op_own: u8, // 7:4 opcode | 3:2 format | 1 SE | 0 owner
}
const _: () = {
    assert!(size_of::<Cqe64>() == 64);
    assert!(offset_of!(Cqe64, wqe_id) == 0x02);
    assert!(offset_of!(Cqe64, rsvd4) == 0x04);
    assert!(offset_of!(Cqe64, ml_path) == 0x11);
    assert!(offset_of!(Cqe64, rsvd20) == 0x12);
    assert!(offset_of!(Cqe64, slid) == 0x16);
    assert!(offset_of!(Cqe64, flags_rqpn) == 0x18);
    assert!(offset_of!(Cqe64, hds_ip_ext) == 0x1c);
    assert!(offset_of!(Cqe64, l4_hdr_type_etc) == 0x1d);
    assert!(offset_of!(Cqe64, vlan_info) == 0x1e);
    assert!(offset_of!(Cqe64, srqn_uidx) == 0x20);
    assert!(offset_of!(Cqe64, imm_inval_pkey) == 0x24);
    assert!(offset_of!(Cqe64, app) == 0x28);
    assert!(offset_of!(Cqe64, app_op) == 0x29);
    assert!(offset_of!(Cqe64, app_info) == 0x2a);
    assert!(offset_of!(Cqe64, byte_cnt) == 0x2c);
    assert!(offset_of!(Cqe64, timestamp) == 0x30);
    assert!(offset_of!(Cqe64, sop_drop_qpn) == 0x38);
    assert!(offset_of!(Cqe64, wqe_counter) == 0x3c);
    assert!(offset_of!(Cqe64, signature) == 0x3e);
    assert!(offset_of!(Cqe64, op_own) == 0x3f);
};

impl Cqe64 {
    /// An all-zero descriptor.
    pub const fn zeroed() -> Self {
        Self {
            rsvd0: [0; 2],
            wqe_id: Be16::ZERO,
            rsvd4: [0; 13],
            ml_path: 0,
            rsvd20: [0; 4],
            slid: Be16::ZERO,
            flags_rqpn: Be32::ZERO,
            hds_ip_ext: 0,
            l4_hdr_type_etc: 0,
            vlan_info: Be16::ZERO,
            srqn_uidx: Be32::ZERO,
            imm_inval_pkey: Be32::ZERO,
            app: 0,
            app_op: 0,
            app_info: Be16::ZERO,
            byte_cnt: Be32::ZERO,
            timestamp: Be64::ZERO,
            sop_drop_qpn: Be32::ZERO,
            wqe_counter: Be16::ZERO,
            signature: 0,
            op_own: 0,
        }
    }
    /// CQE opcode (`op_own` 7:4).
    pub fn opcode(&self) -> CqeOpcode {
        CqeOpcode(self.op_own >> 4)
    }
    /// The [`ErrCqe`] view of these 64 bytes, for an error completion (opcode REQ_ERR or
    /// RESP_ERR); `None` for any other opcode, whose bytes mean something else.
    pub fn as_err(&self) -> Option<&ErrCqe> {
        if self.opcode().is_error() {
            Some(zerocopy::transmute_ref!(self))
        } else {
            None
        }
    }
    /// Owner bit (`op_own` 0).
    pub fn owner(&self) -> u8 {
        self.op_own & CQE_OWNER_MASK
    }
    /// Format (`op_own` 3:2): 0 normal, 1 scatter 32, 2 scatter 64, 3 compressed.
    pub fn format(&self) -> u8 {
        (self.op_own >> 2) & 3
    }
    /// Solicited-event bit (`op_own` 1).
    pub fn solicited(&self) -> bool {
        self.op_own & CQE_SE_MASK != 0
    }
    /// Local QP number (`sop_drop_qpn` 23:0).
    pub fn qpn(&self) -> u32 {
        QPN24.get(self.sop_drop_qpn.get())
    }
    /// Send opcode of the completed WQE (requester CQEs; `sop_drop_qpn` 31:24).
    pub fn send_opcode(&self) -> SendOpcode {
        SendOpcode((self.sop_drop_qpn.get() >> 24) as u8)
    }
    /// WQE counter: requester = WQE index; responder = RQ counter; SRQ = SRQ WQE index.
    pub fn wqe_counter(&self) -> u16 {
        self.wqe_counter.get()
    }
    /// Byte count.
    pub fn byte_cnt(&self) -> u32 {
        self.byte_cnt.get()
    }
    /// Remote / source QPN (`flags_rqpn` 23:0).
    pub fn src_qp(&self) -> u32 {
        QPN24.get(self.flags_rqpn.get())
    }
    /// Service level (IB; `flags_rqpn` 27:24).
    pub fn sl(&self) -> u8 {
        ((self.flags_rqpn.get() >> 24) & 0xF) as u8
    }
    /// True if a GRH / L3 header is present (`flags_rqpn` 29:28 non-zero).
    pub fn has_grh(&self) -> bool {
        self.flags_rqpn.get() & CQE_FLAGS_GRH_MASK != 0
    }
    /// User index (CQE v1) or SRQ number (v0): `srqn_uidx` 23:0.
    pub fn user_index(&self) -> u32 {
        QPN24.get(self.srqn_uidx.get())
    }
    /// Source LID.
    pub fn slid(&self) -> u16 {
        self.slid.get()
    }
    /// DLID path bits (`ml_path` 6:0).
    pub fn dlid_path_bits(&self) -> u8 {
        self.ml_path & 0x7F
    }
    /// Immediate / invalidated rkey / pkey index word, numeric value of the BE field.
    pub fn imm_inval_pkey(&self) -> u32 {
        self.imm_inval_pkey.get()
    }
    /// Timestamp.
    pub fn timestamp(&self) -> u64 {
        self.timestamp.get()
    }
}

/// Error-CQE view of the same 64 bytes (opcode REQ_ERR / RESP_ERR). rdma-core
/// `struct mlx5_err_cqe` (which folds bytes 52..53 into its `rsvd1[18]`).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct ErrCqe {
    /* 0x00 */ pub rsvd0: [u8; 32],
    /* 0x20 */ pub srqn: Be32, // 23:0 SRQN / user index
    /* 0x24 */ pub rsvd1: [u8; 16],
    /* 0x34 */ pub hw_err_synd: u8,
    /* 0x35 */ pub hw_synd_type: u8, // 7:4 type
    /* 0x36 */ pub vendor_err_synd: u8,
    /* 0x37 */ pub syndrome: u8,
    /* 0x38 */ pub s_wqe_opcode_qpn: Be32, // 31:24 failed WQE opcode | 23:0 QPN
    /* 0x3c */ pub wqe_counter: Be16,
    /* 0x3e */ pub signature: u8,
    /* 0x3f */ pub op_own: u8,
}
const _: () = {
    assert!(size_of::<ErrCqe>() == 64);
    assert!(offset_of!(ErrCqe, srqn) == 0x20);
    assert!(offset_of!(ErrCqe, rsvd1) == 0x24);
    assert!(offset_of!(ErrCqe, hw_err_synd) == 0x34);
    assert!(offset_of!(ErrCqe, hw_synd_type) == 0x35);
    assert!(offset_of!(ErrCqe, vendor_err_synd) == 0x36);
    assert!(offset_of!(ErrCqe, syndrome) == 0x37);
    assert!(offset_of!(ErrCqe, s_wqe_opcode_qpn) == 0x38);
    assert!(offset_of!(ErrCqe, wqe_counter) == 0x3c);
    assert!(offset_of!(ErrCqe, signature) == 0x3e);
    assert!(offset_of!(ErrCqe, op_own) == 0x3f);
};

impl ErrCqe {
    /// An all-zero error CQE.
    pub const fn zeroed() -> Self {
        Self {
            rsvd0: [0; 32],
            srqn: Be32::ZERO,
            rsvd1: [0; 16],
            hw_err_synd: 0,
            hw_synd_type: 0,
            vendor_err_synd: 0,
            syndrome: 0,
            s_wqe_opcode_qpn: Be32::ZERO,
            wqe_counter: Be16::ZERO,
            signature: 0,
            op_own: 0,
        }
    }
    /// CQE opcode (`op_own` 7:4): REQ_ERR or RESP_ERR.
    pub fn opcode(&self) -> CqeOpcode {
        CqeOpcode(self.op_own >> 4)
    }
    /// Owner bit.
    pub fn owner(&self) -> u8 {
        self.op_own & CQE_OWNER_MASK
    }
    /// Error syndrome (→ `wc.status`).
    pub fn syndrome(&self) -> Syndrome {
        Syndrome(self.syndrome)
    }
    /// Vendor syndrome (→ `wc.vendor_err`).
    pub fn vendor_syndrome(&self) -> VendorSyndrome {
        VendorSyndrome(self.vendor_err_synd)
    }
    /// Opcode of the failed send WQE (`s_wqe_opcode_qpn` 31:24; requester errors).
    pub fn send_opcode(&self) -> SendOpcode {
        SendOpcode((self.s_wqe_opcode_qpn.get() >> 24) as u8)
    }
    /// QP number (`s_wqe_opcode_qpn` 23:0).
    pub fn qpn(&self) -> u32 {
        QPN24.get(self.s_wqe_opcode_qpn.get())
    }
    /// WQE counter of the failed WQE.
    pub fn wqe_counter(&self) -> u16 {
        self.wqe_counter.get()
    }
    /// SRQ number / user index (`srqn` 23:0).
    pub fn user_index(&self) -> u32 {
        QPN24.get(self.srqn.get())
    }
}

impl fmt::Display for Cqe64 {
    /// Every field by its rdma-core name; an error opcode is printed through the [`ErrCqe`] view.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.opcode().is_error() {
            if let Ok(err) = ErrCqe::read_from_bytes(self.as_bytes()) {
                return err.fmt(f);
            }
        }
        writeln!(
            f,
            "CQE opcode={:?} format={} se={} owner={} op_own={:#04x}",
            self.opcode(),
            self.format(),
            u8::from(self.solicited()),
            self.owner(),
            self.op_own
        )?;
        writeln!(
            f,
            "  wqe_id={:#06x} ml_path={:#04x} slid={:#06x} flags_rqpn={:#010x} (sl={} grh={} src_qp={:#08x}) \
             hds_ip_ext={:#04x} l4_hdr_type_etc={:#04x} vlan_info={:#06x}",
            self.wqe_id.get(),
            self.ml_path,
            self.slid(),
            self.flags_rqpn.get(),
            self.sl(),
            u8::from(self.has_grh()),
            self.src_qp(),
            self.hds_ip_ext,
            self.l4_hdr_type_etc,
            self.vlan_info.get()
        )?;
        writeln!(
            f,
            "  srqn_uidx={:#010x} (user_index={:#08x}) imm_inval_pkey={:#010x} app={:#04x} app_op={:#04x} \
             app_info={:#06x} byte_cnt={:#x} timestamp={:#018x}",
            self.srqn_uidx.get(),
            self.user_index(),
            self.imm_inval_pkey(),
            self.app,
            self.app_op,
            self.app_info.get(),
            self.byte_cnt(),
            self.timestamp()
        )?;
        write!(
            f,
            "  sop_drop_qpn={:#010x} (send_opcode={:?} qpn={:#08x}) wqe_counter={:#06x} signature={:#04x}",
            self.sop_drop_qpn.get(),
            self.send_opcode(),
            self.qpn(),
            self.wqe_counter(),
            self.signature
        )
    }
}

impl fmt::Display for ErrCqe {
    /// Every field by name, with the syndrome's name, meaning and `ibv_wc_status`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let syn = self.syndrome();
        let ven = self.vendor_syndrome();
        writeln!(
            f,
            "ERR CQE opcode={:?} owner={} op_own={:#04x}",
            self.opcode(),
            self.owner(),
            self.op_own
        )?;
        writeln!(
            f,
            "  syndrome={:?} ({}) -> wc_status={:?}",
            syn,
            syn.meaning().unwrap_or("unknown syndrome"),
            syn.wc_status()
        )?;
        writeln!(
            f,
            "  vendor_err_synd={:#04x} ({}) hw_err_synd={:#04x} hw_synd_type={:#04x}",
            ven.0,
            ven.meaning().unwrap_or("unknown vendor syndrome"),
            self.hw_err_synd,
            self.hw_synd_type
        )?;
        write!(
            f,
            "  s_wqe_opcode_qpn={:#010x} (send_opcode={:?} qpn={:#08x}) wqe_counter={:#06x} srqn={:#010x} (user_index={:#08x}) signature={:#04x}",
            self.s_wqe_opcode_qpn.get(),
            self.send_opcode(),
            self.qpn(),
            self.wqe_counter(),
            self.srqn.get(),
            self.user_index(),
            self.signature
        )
    }
}
