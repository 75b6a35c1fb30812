//! Doorbell records (host memory the device reads by DMA) and UAR registers (MMIO).
//!
//! Doorbell records are two big-endian 32-bit words. QP: word 0 = RQ producer counter
//! (`& 0xFFFF`), word 1 = SQ WQEBB producer counter (`& 0xFFFF`). CQ: word 0 = consumer
//! index (`& 0xFFFFFF`), word 1 = arm word ([`cq_arm_word`]). SRQ: word 0 = posted counter.
//! In the 4 KiB UAR page, the CQ arm doorbell is the 64-bit register at [`UAR_CQ_DOORBELL`]
//! and BlueFlame register `i` starts at `UAR_BF_REG0 + i * bf_reg_size`; each has two halves
//! of `bf_reg_size / 2` bytes, and the 8-byte send doorbell goes to offset 0 of the current half.

use crate::wqe::CtrlSeg;
use zerocopy::IntoBytes;

/// QP record word holding the RQ producer counter (`MLX5_RCV_DBR`; byte offset 0).
pub const DBR_RCV_WORD: usize = 0;
/// QP record word holding the SQ producer counter (`MLX5_SND_DBR`; byte offset 4).
pub const DBR_SND_WORD: usize = 1;
/// CQ record word holding the consumer index (byte offset 0).
pub const DBR_CQ_CI_WORD: usize = 0;
/// CQ record word holding the arm word (byte offset 4).
pub const DBR_CQ_ARM_WORD: usize = 1;
/// SRQ record word holding the posted-WQE counter (byte offset 0).
pub const DBR_SRQ_WORD: usize = 0;
/// Mask of the CQ consumer index in the record and arm words (24 bits).
pub const CQ_CI_MASK: u32 = 0x00FF_FFFF;
/// Mask of the RQ/SQ/SRQ producer counters in the record (16 bits).
pub const WQ_PI_MASK: u32 = 0xFFFF;

/// UAR offset of the 64-bit CQ arm doorbell (`MLX5_CQ_DOORBELL`).
pub const UAR_CQ_DOORBELL: usize = 0x20;
/// UAR offset of BlueFlame register 0.
pub const UAR_BF_REG0: usize = 0x800;
/// Size of one UAR.
pub const UAR_SIZE: usize = 4096;
/// Stride of the doorbell-only registers of a non-cached (NC) dynamic UAR.
pub const UAR_NC_REG_STRIDE: usize = 0x100;
/// Default `bf_reg_size` (`1 << log_bf_reg_size` from alloc_ucontext, normally 512).
pub const DEFAULT_BF_REG_SIZE: usize = 512;

/// CQ arm command: next completion (`MLX5_CQ_DB_REQ_NOT`).
pub const CQ_ARM_CMD_NEXT: u32 = 0;
/// CQ arm command: next solicited completion (`MLX5_CQ_DB_REQ_NOT_SOL`).
pub const CQ_ARM_CMD_SOLICITED: u32 = 1 << 24;

/// UAR offset of BlueFlame register `index` for a UAR with `bf_reg_size`-byte registers.
pub const fn bf_reg_offset(index: usize, bf_reg_size: usize) -> usize {
    UAR_BF_REG0 + index * bf_reg_size
}

/// Size of one of the two halves a BlueFlame register alternates between (`bf_reg_size / 2`,
/// 256 for the usual 512): the doorbell and BlueFlame copy of every other post go to
/// `reg + bf_half_size`.
pub const fn bf_half_size(bf_reg_size: usize) -> usize {
    bf_reg_size / 2
}

/// The CQ arm word: `(sn & 3) << 28 | cmd | (ci & 0xFFFFFF)`, stored BE into record word 1
/// and as bytes 0..4 of the arm doorbell.
pub const fn cq_arm_word(sn: u8, solicited: bool, ci: u32) -> u32 {
    let cmd = if solicited {
        CQ_ARM_CMD_SOLICITED
    } else {
        CQ_ARM_CMD_NEXT
    };
    (((sn & 3) as u32) << 28) | cmd | (ci & CQ_CI_MASK)
}

/// Arm-word fields back: `(sn, solicited, ci)`.
pub const fn cq_arm_word_fields(word: u32) -> (u8, bool, u32) {
    (
        ((word >> 28) & 3) as u8,
        word & CQ_ARM_CMD_SOLICITED != 0,
        word & CQ_CI_MASK,
    )
}

/// The 8 bytes stored to `UAR + UAR_CQ_DOORBELL`: BE32(arm word) then BE32(cqn).
pub const fn cq_arm_doorbell(arm_word: u32, cqn: u32) -> [u8; 8] {
    let a = arm_word.to_be_bytes();
    let c = cqn.to_be_bytes();
    [a[0], a[1], a[2], a[3], c[0], c[1], c[2], c[3]]
}

/// The 8 bytes stored to the bfreg for a send doorbell: control-segment bytes 0..8 verbatim
/// (BE `opmod_idx_opcode` then BE `qpn_ds`). On the CPU: load as native u64, store as native u64.
pub fn send_doorbell(ctrl: &CtrlSeg) -> [u8; 8] {
    let mut out = [0u8; 8];
    out.copy_from_slice(&ctrl.as_bytes()[..8]);
    out
}
