//! Send and receive WQE segments (PRM "Send WQE" / "Receive WQE"; rdma-core `mlx5dv.h`).
//!
//! A send WQE is a control segment followed by more 16-byte segments, `ds` of them in all
//! (control included). It occupies `ceil(ds / 4)` 64-byte basic blocks (WQEBBs); its first
//! WQEBB never wraps, later 16-byte segments continue at the ring start when they meet its end.
//! Segment order per QP type: RC/UC SEND: ctrl, data...; RDMA WRITE/READ: ctrl, raddr, data...;
//! atomics: ctrl, raddr, atomic, data (8 B); UD SEND: ctrl, datagram (AV, 3 DS), data....
//! Receive WQEs (RQ) are data segments only, terminated by one with [`INVALID_LKEY`] if fewer
//! than the stride allows; SRQ WQEs start with an [`SrqNextSeg`].

mod view;

pub use view::{WqeKind, WqeView};

use crate::opcodes::SendOpcode;
use crate::types::{Be16, Be32, Be64, Bits};
use core::mem::offset_of;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Size of one send-queue basic block (`MLX5_SEND_WQE_BB`).
pub const WQEBB_SIZE: usize = 64;
/// log2 of [`WQEBB_SIZE`] (`MLX5_SEND_WQE_SHIFT`).
pub const WQEBB_SHIFT: u32 = 6;
/// Size of one data-segment unit: every segment is a multiple of it.
pub const DS_SIZE: usize = 16;
/// Largest `ds` the 6-bit field can hold (63 x 16 = 1008 bytes).
pub const MAX_DS: u32 = 63;
/// Inline-segment flag, bit 31 of the first word (`MLX5_INLINE_SEG`).
pub const INLINE_SEG_FLAG: u32 = 0x8000_0000;
/// Receive terminator lkey (`MLX5_INVALID_LKEY`).
pub const INVALID_LKEY: u32 = 0x100;
/// Extended-address-vector flag in `dqp_dct` bit 31 (`MLX5_EXTENDED_UD_AV`).
pub const DQP_EXTENDED_AV: u32 = 0x8000_0000;

/// `fm_ce_se` CE = 2: always generate a CQE (signaled) (`MLX5_WQE_CTRL_CQ_UPDATE`).
pub const FM_CE_SE_CQ_UPDATE: u8 = 0x08;
/// `fm_ce_se` CE = 3: CQE and event (kernel "CQ update and EQE").
pub const FM_CE_SE_CQ_UPDATE_EQE: u8 = 0x0C;
/// `fm_ce_se` CE mask (bits 3:2).
pub const FM_CE_SE_CE_MASK: u8 = 0x0C;
/// `fm_ce_se` SE: solicited event (`MLX5_WQE_CTRL_SOLICITED`).
pub const FM_CE_SE_SOLICITED: u8 = 0x02;
/// Fence mode 4, small fence and fence (`MLX5_WQE_CTRL_FENCE`, used for `IBV_SEND_FENCE`).
pub const FM_CE_SE_FENCE: u8 = 0x80;
/// Fence mode 1, initiator small fence (`MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE`).
pub const FM_CE_SE_INITIATOR_SMALL_FENCE: u8 = 0x20;
/// Fence mode 2, fence.
pub const FM_CE_SE_FENCE_ONLY: u8 = 0x40;
/// Fence mode 3, strong ordering.
pub const FM_CE_SE_STRONG_ORDERING: u8 = 0x60;
/// Fence-mode field mask (bits 7:5).
pub const FM_CE_SE_FENCE_MODE_MASK: u8 = 0xE0;

/// `opmod_idx_opcode` bits 31:24: opcode modifier.
pub const OPMOD: Bits = Bits::new(31, 24);
/// `opmod_idx_opcode` bits 23:8: WQE index (low 16 bits of the WQEBB producer counter).
pub const WQE_INDEX: Bits = Bits::new(23, 8);
/// `opmod_idx_opcode` bits 7:0: opcode.
pub const OPCODE: Bits = Bits::new(7, 0);
/// `qpn_ds` bits 31:8: QP number.
pub const QPN: Bits = Bits::new(31, 8);
/// `qpn_ds` bits 5:0: WQE size in 16-byte units.
pub const DS: Bits = Bits::new(5, 0);
/// A 24-bit QP number / SRQ number / user index field (bits 23:0).
pub const QPN24: Bits = Bits::new(23, 0);

/// WQEBBs one WQE of `ds` 16-byte units occupies: `ceil(ds / 4)`.
pub const fn ds_to_wqebbs(ds: u32) -> u32 {
    ds.div_ceil(4)
}

/// DS units of an inline segment carrying `len` payload bytes: `ceil((4 + len) / 16)`.
/// (A sender emits no inline segment at all for a zero total length.)
pub const fn inline_ds(len: u32) -> u32 {
    ((len as u64 + 4).div_ceil(DS_SIZE as u64)) as u32
}

/// Control segment: the first 16 bytes of every send WQE.
/// PRM "Send WQE - Control Segment"; rdma-core `struct mlx5_wqe_ctrl_seg`.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct CtrlSeg {
    /* 0x00 */ pub opmod_idx_opcode: Be32, // 31:24 opmod | 23:8 wqe_index | 7:0 opcode
    /* 0x04 */ pub qpn_ds: Be32, // 31:8 qpn | 5:0 ds
    /* 0x08 */ pub signature: u8,
    /* 0x09 */ pub dci_stream_channel_id: Be16,
    /* 0x0b */ pub fm_ce_se: u8, // 7:5 fence mode | 3:2 CE | 1 SE
    /* 0x0c */ pub imm: Be32,
}
const _: () = {
    assert!(size_of::<CtrlSeg>() == 16);
    assert!(offset_of!(CtrlSeg, qpn_ds) == 0x04);
    assert!(offset_of!(CtrlSeg, signature) == 0x08);
    assert!(offset_of!(CtrlSeg, dci_stream_channel_id) == 0x09);
    assert!(offset_of!(CtrlSeg, fm_ce_se) == 0x0b);
    assert!(offset_of!(CtrlSeg, imm) == 0x0c);
};

impl CtrlSeg {
    /// Build a control segment. `qpn` is truncated to 24 bits and `ds` to 6 bits.
    /// `imm` is the numeric value of the big-endian field (bytes 12..16 = `imm.to_be_bytes()`);
    /// use [`CtrlSeg::with_imm_bytes`] to store bytes that are already in network order
    /// (verbs `imm_data`).
    pub const fn new(
        opcode: SendOpcode,
        opmod: u8,
        wqe_index: u16,
        qpn: u32,
        ds: u8,
        fm_ce_se: u8,
        imm: u32,
    ) -> Self {
        let w0 = OPMOD.put(
            WQE_INDEX.put(OPCODE.put(0, opcode.0 as u32), wqe_index as u32),
            opmod as u32,
        );
        let w1 = QPN.put(DS.put(0, ds as u32), qpn);
        Self {
            opmod_idx_opcode: Be32::new(w0),
            qpn_ds: Be32::new(w1),
            signature: 0,
            dci_stream_channel_id: Be16::ZERO,
            fm_ce_se,
            imm: Be32::new(imm),
        }
    }

    /// The same segment with bytes 12..16 set to `imm` verbatim (already network order).
    pub const fn with_imm_bytes(mut self, imm: [u8; 4]) -> Self {
        self.imm = Be32::from_bytes(imm);
        self
    }

    /// Opcode (bits 7:0 of word 0).
    pub fn opcode(&self) -> SendOpcode {
        SendOpcode(OPCODE.get(self.opmod_idx_opcode.get()) as u8)
    }
    /// Opcode modifier (bits 31:24 of word 0).
    pub fn opmod(&self) -> u8 {
        OPMOD.get(self.opmod_idx_opcode.get()) as u8
    }
    /// WQE index (bits 23:8 of word 0).
    pub fn wqe_index(&self) -> u16 {
        WQE_INDEX.get(self.opmod_idx_opcode.get()) as u16
    }
    /// QP number (bits 31:8 of word 1).
    pub fn qpn(&self) -> u32 {
        QPN.get(self.qpn_ds.get())
    }
    /// WQE size in 16-byte units (bits 5:0 of word 1).
    pub fn ds(&self) -> u8 {
        DS.get(self.qpn_ds.get()) as u8
    }
    /// Fence mode, 0..=7 (bits 7:5 of `fm_ce_se`).
    pub fn fence_mode(&self) -> u8 {
        self.fm_ce_se >> 5
    }
    /// CE completion mode, 0..=3 (bits 3:2 of `fm_ce_se`); 2 = signaled.
    pub fn ce(&self) -> u8 {
        (self.fm_ce_se >> 2) & 3
    }
    /// Solicited-event bit.
    pub fn solicited(&self) -> bool {
        self.fm_ce_se & FM_CE_SE_SOLICITED != 0
    }
    /// The numeric value of the big-endian `imm` field.
    pub fn imm(&self) -> u32 {
        self.imm.get()
    }
}

/// Remote address segment (RDMA WRITE/READ, atomics). rdma-core `struct mlx5_wqe_raddr_seg`.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct RaddrSeg {
    /* 0x00 */ pub raddr: Be64,
    /* 0x08 */ pub rkey: Be32,
    /* 0x0c */ pub reserved: Be32,
}
const _: () = {
    assert!(size_of::<RaddrSeg>() == 16);
    assert!(offset_of!(RaddrSeg, rkey) == 0x08);
    assert!(offset_of!(RaddrSeg, reserved) == 0x0c);
};

impl RaddrSeg {
    /// Remote virtual address and rkey; the reserved word is 0.
    pub const fn new(raddr: u64, rkey: u32) -> Self {
        Self {
            raddr: Be64::new(raddr),
            rkey: Be32::new(rkey),
            reserved: Be32::ZERO,
        }
    }
    /// Remote virtual address.
    pub fn raddr(&self) -> u64 {
        self.raddr.get()
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.rkey.get()
    }
}

/// Standard 8-byte atomic segment (CMP_AND_SWP, FETCH_AND_ADD). rdma-core `struct mlx5_wqe_atomic_seg`.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct AtomicSeg {
    /* 0x00 */ pub swap_add: Be64, // CS: swap value; FA: add value
    /* 0x08 */ pub compare: Be64, // CS: compare value; FA: unused
}
const _: () = {
    assert!(size_of::<AtomicSeg>() == 16);
    assert!(offset_of!(AtomicSeg, compare) == 0x08);
};

impl AtomicSeg {
    /// `swap_add` = swap (CS) or add (FA) operand, `compare` = compare operand (CS; 0 for FA).
    pub const fn new(swap_add: u64, compare: u64) -> Self {
        Self {
            swap_add: Be64::new(swap_add),
            compare: Be64::new(compare),
        }
    }
    /// Swap (CS) or add (FA) operand.
    pub fn swap_add(&self) -> u64 {
        self.swap_add.get()
    }
    /// Compare operand (CS).
    pub fn compare(&self) -> u64 {
        self.compare.get()
    }
}

/// Masked compare-and-swap on 4-byte operands: one 16-byte segment (opmod 0x08).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct MaskedCs32Seg {
    /* 0x00 */ pub swap: Be32,
    /* 0x04 */ pub compare: Be32,
    /* 0x08 */ pub swap_mask: Be32,
    /* 0x0c */ pub compare_mask: Be32,
}
const _: () = {
    assert!(size_of::<MaskedCs32Seg>() == 16);
    assert!(offset_of!(MaskedCs32Seg, compare) == 0x04);
    assert!(offset_of!(MaskedCs32Seg, swap_mask) == 0x08);
    assert!(offset_of!(MaskedCs32Seg, compare_mask) == 0x0c);
};

impl MaskedCs32Seg {
    /// All four operands.
    pub const fn new(swap: u32, compare: u32, swap_mask: u32, compare_mask: u32) -> Self {
        Self {
            swap: Be32::new(swap),
            compare: Be32::new(compare),
            swap_mask: Be32::new(swap_mask),
            compare_mask: Be32::new(compare_mask),
        }
    }
}

/// Masked compare-and-swap on 8-byte operands: 32 bytes = two 16-byte halves (swap, compare)
/// then (swap_mask, compare_mask); the second half may wrap to the ring start (opmod 0x09).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct MaskedCs64Seg {
    /* 0x00 */ pub swap: Be64,
    /* 0x08 */ pub compare: Be64,
    /* 0x10 */ pub swap_mask: Be64,
    /* 0x18 */ pub compare_mask: Be64,
}
const _: () = {
    assert!(size_of::<MaskedCs64Seg>() == 32);
    assert!(offset_of!(MaskedCs64Seg, compare) == 0x08);
    assert!(offset_of!(MaskedCs64Seg, swap_mask) == 0x10);
    assert!(offset_of!(MaskedCs64Seg, compare_mask) == 0x18);
};

impl MaskedCs64Seg {
    /// All four operands.
    pub const fn new(swap: u64, compare: u64, swap_mask: u64, compare_mask: u64) -> Self {
        Self {
            swap: Be64::new(swap),
            compare: Be64::new(compare),
            swap_mask: Be64::new(swap_mask),
            compare_mask: Be64::new(compare_mask),
        }
    }
    /// The two 16-byte halves as they are written (the second may wrap to the ring start).
    pub fn halves(&self) -> [[u8; 16]; 2] {
        let b = self.as_bytes();
        let mut out = [[0u8; 16]; 2];
        out[0].copy_from_slice(&b[..16]);
        out[1].copy_from_slice(&b[16..]);
        out
    }
}

/// Masked fetch-and-add on 4-byte operands: add, field boundary, 8 reserved bytes (opmod 0x08).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct MaskedFa32Seg {
    /* 0x00 */ pub add: Be32,
    /* 0x04 */
    pub field_boundary: Be32, // bit set = carry does not propagate past this bit
    /* 0x08 */ pub rsvd0: [u8; 8],
}
const _: () = {
    assert!(size_of::<MaskedFa32Seg>() == 16);
    assert!(offset_of!(MaskedFa32Seg, field_boundary) == 0x04);
    assert!(offset_of!(MaskedFa32Seg, rsvd0) == 0x08);
};

impl MaskedFa32Seg {
    /// Add operand and field-boundary mask.
    pub const fn new(add: u32, field_boundary: u32) -> Self {
        Self {
            add: Be32::new(add),
            field_boundary: Be32::new(field_boundary),
            rsvd0: [0; 8],
        }
    }
}

/// Masked fetch-and-add on 8-byte operands: add, field boundary (opmod 0x09).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct MaskedFa64Seg {
    /* 0x00 */ pub add: Be64,
    /* 0x08 */ pub field_boundary: Be64,
}
const _: () = {
    assert!(size_of::<MaskedFa64Seg>() == 16);
    assert!(offset_of!(MaskedFa64Seg, field_boundary) == 0x08);
};

impl MaskedFa64Seg {
    /// Add operand and field-boundary mask.
    pub const fn new(add: u64, field_boundary: u64) -> Self {
        Self {
            add: Be64::new(add),
            field_boundary: Be64::new(field_boundary),
        }
    }
}

/// Data (scatter/gather pointer) segment. rdma-core `struct mlx5_wqe_data_seg`.
/// `byte_count` 0 means 2 GiB; bit 31 must be 0 (set = inline segment).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct DataSeg {
    /* 0x00 */ pub byte_count: Be32,
    /* 0x04 */ pub lkey: Be32,
    /* 0x08 */ pub addr: Be64,
}
const _: () = {
    assert!(size_of::<DataSeg>() == 16);
    assert!(offset_of!(DataSeg, lkey) == 0x04);
    assert!(offset_of!(DataSeg, addr) == 0x08);
};

impl DataSeg {
    /// A data segment; `byte_count` is stored as given (callers skip zero-length SGEs).
    pub const fn new(byte_count: u32, lkey: u32, addr: u64) -> Self {
        Self {
            byte_count: Be32::new(byte_count),
            lkey: Be32::new(lkey),
            addr: Be64::new(addr),
        }
    }
    /// The receive-queue terminator: `{0, INVALID_LKEY, 0}`.
    pub const fn terminator() -> Self {
        Self::new(0, INVALID_LKEY, 0)
    }
    /// Byte count as stored (0 = 2 GiB).
    pub fn byte_count(&self) -> u32 {
        self.byte_count.get()
    }
    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.lkey.get()
    }
    /// Local address.
    pub fn addr(&self) -> u64 {
        self.addr.get()
    }
    /// True for the receive terminator (lkey = [`INVALID_LKEY`]).
    pub fn is_terminator(&self) -> bool {
        self.lkey.get() == INVALID_LKEY
    }
}

/// Inline data segment header: BE32 `0x8000_0000 | length`, payload follows packed.
/// rdma-core `struct mlx5_wqe_inl_data_seg`.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct InlineHdr {
    /* 0x00 */ pub byte_count: Be32, // 31 inline flag | 30:0 length
}
const _: () = assert!(size_of::<InlineHdr>() == 4);

impl InlineHdr {
    /// Header for `len` payload bytes (`len` truncated to 31 bits).
    pub const fn new(len: u32) -> Self {
        Self {
            byte_count: Be32::new(INLINE_SEG_FLAG | (len & !INLINE_SEG_FLAG)),
        }
    }
    /// Payload length (bits 30:0).
    pub fn len(&self) -> u32 {
        self.byte_count.get() & !INLINE_SEG_FLAG
    }
    /// True if the length is 0.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// True if the inline flag (bit 31) is set.
    pub fn is_inline(&self) -> bool {
        self.byte_count.get() & INLINE_SEG_FLAG != 0
    }
}

/// UD/DC address vector, 48 bytes (3 DS) after the control segment.
/// rdma-core `struct mlx5_wqe_av` (`struct mlx5_wqe_datagram_seg` wraps it).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct DatagramSeg {
    /* 0x00 */ pub key: Be64, // UD: 63:32 Q_Key, 31:0 reserved; DC: access key
    /* 0x08 */ pub dqp_dct: Be32, // 31 extended AV | 23:0 destination QPN / DCT
    /* 0x0c */ pub stat_rate_sl: u8, // 7:4 static rate | 3:0 SL (RoCE: 3:1 prio)
    /* 0x0d */ pub fl_mlid: u8, // 7 force loopback | 6:0 source path bits
    /* 0x0e */ pub rlid: Be16, // IB: DLID; RoCE v2: UDP source port
    /* 0x10 */ pub reserved0: [u8; 4],
    /* 0x14 */ pub rmac: [u8; 6],
    /* 0x1a */ pub tclass: u8,
    /* 0x1b */ pub hop_limit: u8,
    /* 0x1c */ pub grh_gid_fl: Be32, // 30 GRH | 27:20 sgid index | 19:0 flow label
    /* 0x20 */ pub rgid: [u8; 16],
}
const _: () = {
    assert!(size_of::<DatagramSeg>() == 48);
    assert!(offset_of!(DatagramSeg, dqp_dct) == 0x08);
    assert!(offset_of!(DatagramSeg, stat_rate_sl) == 0x0c);
    assert!(offset_of!(DatagramSeg, fl_mlid) == 0x0d);
    assert!(offset_of!(DatagramSeg, rlid) == 0x0e);
    assert!(offset_of!(DatagramSeg, reserved0) == 0x10);
    assert!(offset_of!(DatagramSeg, rmac) == 0x14);
    assert!(offset_of!(DatagramSeg, tclass) == 0x1a);
    assert!(offset_of!(DatagramSeg, hop_limit) == 0x1b);
    assert!(offset_of!(DatagramSeg, grh_gid_fl) == 0x1c);
    assert!(offset_of!(DatagramSeg, rgid) == 0x20);
};

/// `grh_gid_fl` bit 30: GRH present (IB global routing; must be 0 for RoCE).
pub const AV_GRH_PRESENT: u32 = 1 << 30;
/// `fl_mlid` bit 7: force loopback.
pub const AV_FORCE_LOOPBACK: u8 = 0x80;

impl DatagramSeg {
    /// An all-zero address vector.
    pub const fn zeroed() -> Self {
        Self {
            key: Be64::ZERO,
            dqp_dct: Be32::ZERO,
            stat_rate_sl: 0,
            fl_mlid: 0,
            rlid: Be16::ZERO,
            reserved0: [0; 4],
            rmac: [0; 6],
            tclass: 0,
            hop_limit: 0,
            grh_gid_fl: Be32::ZERO,
            rgid: [0; 16],
        }
    }
    /// Q_Key (UD: bytes 0..4).
    pub fn qkey(&self) -> u32 {
        (self.key.get() >> 32) as u32
    }
    /// Set the Q_Key (bytes 0..4), leaving bytes 4..8 alone.
    pub fn set_qkey(&mut self, qkey: u32) {
        self.key = Be64::new(((qkey as u64) << 32) | (self.key.get() & 0xFFFF_FFFF));
    }
    /// Destination QPN / DCT number (bits 23:0 of `dqp_dct`).
    pub fn dqpn(&self) -> u32 {
        QPN24.get(self.dqp_dct.get())
    }
    /// Set `dqp_dct` = extended-AV flag | `dqpn` (24 bits), as libmlx5 does at post time.
    pub fn set_dqpn(&mut self, dqpn: u32) {
        self.dqp_dct = Be32::new(DQP_EXTENDED_AV | QPN24.put(0, dqpn));
    }
    /// Extended-AV flag (bit 31 of `dqp_dct`).
    pub fn extended(&self) -> bool {
        self.dqp_dct.get() & DQP_EXTENDED_AV != 0
    }
    /// Service level (IB; bits 3:0 of `stat_rate_sl`).
    pub fn sl(&self) -> u8 {
        self.stat_rate_sl & 0x0F
    }
    /// Static-rate code (bits 7:4 of `stat_rate_sl`).
    pub fn stat_rate(&self) -> u8 {
        self.stat_rate_sl >> 4
    }
    /// Destination LID (IB) or UDP source port (RoCE v2).
    pub fn rlid(&self) -> u16 {
        self.rlid.get()
    }
    /// GRH-present flag (bit 30 of `grh_gid_fl`).
    pub fn grh(&self) -> bool {
        self.grh_gid_fl.get() & AV_GRH_PRESENT != 0
    }
    /// Source GID index (bits 27:20 of `grh_gid_fl`).
    pub fn sgid_index(&self) -> u8 {
        (self.grh_gid_fl.get() >> 20) as u8
    }
    /// Flow label (bits 19:0 of `grh_gid_fl`).
    pub fn flow_label(&self) -> u32 {
        self.grh_gid_fl.get() & 0xF_FFFF
    }
}

/// SRQ "next" segment: first 16 bytes of every SRQ WQE. rdma-core `struct mlx5_wqe_srq_next_seg`.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct SrqNextSeg {
    /* 0x00 */ pub rsvd0: [u8; 2],
    /* 0x02 */ pub next_wqe_index: Be16,
    /* 0x04 */ pub signature: u8,
    /* 0x05 */ pub rsvd1: [u8; 11],
}
const _: () = {
    assert!(size_of::<SrqNextSeg>() == 16);
    assert!(offset_of!(SrqNextSeg, next_wqe_index) == 0x02);
    assert!(offset_of!(SrqNextSeg, signature) == 0x04);
    assert!(offset_of!(SrqNextSeg, rsvd1) == 0x05);
};

impl SrqNextSeg {
    /// A next segment linking to `next_wqe_index`; everything else 0.
    pub const fn new(next_wqe_index: u16) -> Self {
        Self {
            rsvd0: [0; 2],
            next_wqe_index: Be16::new(next_wqe_index),
            signature: 0,
            rsvd1: [0; 11],
        }
    }
    /// Index of the next free WQE in the SRQ list.
    pub fn next_wqe_index(&self) -> u16 {
        self.next_wqe_index.get()
    }
}
