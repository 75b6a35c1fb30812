//! What the emulated HCA supports: the one place every answer about it derives from.
//!
//! The QUERY_DEVICE answers (legacy, extended, mlx5 driver data), the mlx5 driver-data
//! capability bits of GET_CONTEXT, the DEVX `QUERY_HCA_CAP` pages and the refusals at
//! create time (QP types, create flags) all read [`FEATURES`] and the limits below, so that
//! a probing program is told one consistent story: what the device does, and nothing more.
//!
//! This module sits below both the kernel (`kernel/`) and the device (`device/`): it
//! imports neither. A feature is switched on (one line in [`FEATURES`]) in the commit that
//! makes the device execute it and the kernel create its objects; until then it is
//! announced as absent and refused as mlx5_ib refuses it on a device without it.

/// The optional features of the emulated HCA. Each one is `true` only when the device
/// implements it end to end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Features {
    /// XRC domains, XRC SRQs and the XRC_INI / XRC_TGT QP types
    /// (`IB_DEVICE_XRC`, HCA_CAP `xrc`).
    pub(crate) xrc: bool,
    /// Dynamically connected transport: DCI / DCT (`MLX5DV_QP_INIT_ATTR_MASK_DC`, HCA_CAP
    /// `dct`).
    pub(crate) dc: bool,
    /// RAW_PACKET QPs and flow steering on the Ethernet port (`max_raw_ethy_qp`,
    /// `raw_packet_caps`, HCA_CAP `eth_net_offloads`).
    pub(crate) raw_packet: bool,
    /// Extended atomics: masked compare-and-swap and masked fetch-and-add on 4- and 8-byte
    /// operands (HCA_CAP `atomic`, ATOMIC caps `atomic_operations` bits 2 and 3,
    /// `atomic_size_qp` 4 | 8). The device executes them in `device/responder.rs`.
    pub(crate) ext_atomics: bool,
    /// Completion timestamps from the free-running core clock (extended QUERY_DEVICE
    /// `hca_core_clock` / `timestamp_mask`, the core-clock page; CQEs carry it).
    pub(crate) timestamps: bool,
}

/// The emulated HCA's features. `hpc` (XRC, DC) and `raw` (RAW_PACKET) turn theirs on here
/// when their support lands.
pub(crate) const FEATURES: Features = Features {
    xrc: true,
    dc: true,
    raw_packet: true,
    ext_atomics: true,
    timestamps: true,
};

// ---------------------------------------------------------------------------------------
// Limits (the emulated HCA's numbers, not ABI constants), reported by QUERY_DEVICE and DEVX
// QUERY_HCA_CAP and enforced at create time.

/// Work requests per send or receive queue.
pub(crate) const MAX_QP_WR: u32 = 1 << 15;
/// Scatter/gather entries per WQE.
pub(crate) const MAX_SGE: u32 = 30;
/// Entries per CQ.
pub(crate) const MAX_CQE: u32 = (1 << 22) - 1;
/// Work requests per SRQ.
pub(crate) const MAX_SRQ_WR: u32 = (1 << 15) - 1;
/// Scatter entries per SRQ WQE.
pub(crate) const MAX_SRQ_SGE: u32 = 31;
/// Outstanding READ/atomic requests per QP, each direction.
pub(crate) const MAX_RD_ATOM: u32 = 16;
/// Inline data per send WQE.
pub(crate) const MAX_INLINE: u32 = 512;
/// Send WQE descriptor bytes.
pub(crate) const MAX_SQ_DESC: u32 = 512;
/// Receive WQE descriptor bytes.
pub(crate) const MAX_RQ_DESC: u32 = 512;
/// log2 of the number of QPs.
pub(crate) const LOG_MAX_QP: u32 = 18;
/// BlueFlame registers per context.
pub(crate) const MAX_BFREGS: u32 = 512;
/// Offset of the free-running timer in the core-clock page.
pub(crate) const CORE_CLOCK_OFFSET: u64 = 0x10;
/// The core clock, kHz (1 GHz: one tick per nanosecond).
pub(crate) const CLOCK_KHZ: u64 = 1_000_000;
/// log2 of the largest message (1 GiB, as ConnectX; UCX's DEVX path insists on 30).
pub(crate) const LOG_MAX_MSG: u32 = 30;
/// Width of the core clock the CQE timestamps carry, bits.
pub(crate) const TIMESTAMP_BITS: u32 = 48;

/// Whether CREATE_QP of this `IB_UVERBS_QPT_*` type reaches a device that runs it (else
/// mlx5_ib's `check_qp_type` answer, EOPNOTSUPP).
pub(crate) fn qp_type_supported(qp_type: u8) -> bool {
    use mlx5_ffi::uverbs::qp_type as t;
    match qp_type {
        t::RC | t::UC | t::UD => true,
        t::XRC_INI | t::XRC_TGT => FEATURES.xrc,
        t::RAW_PACKET => FEATURES.raw_packet,
        t::DRIVER => FEATURES.dc,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qp_types_follow_the_features() {
        use mlx5_ffi::uverbs::qp_type as t;
        assert!(qp_type_supported(t::RC) && qp_type_supported(t::UC) && qp_type_supported(t::UD));
        assert_eq!(qp_type_supported(t::XRC_INI), FEATURES.xrc);
        assert_eq!(qp_type_supported(t::XRC_TGT), FEATURES.xrc);
        assert_eq!(qp_type_supported(t::RAW_PACKET), FEATURES.raw_packet);
        assert_eq!(qp_type_supported(t::DRIVER), FEATURES.dc);
        assert!(!qp_type_supported(0) && !qp_type_supported(200));
    }
}
