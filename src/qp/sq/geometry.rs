//! The send queue's geometry: worst-case WQE size per QP type, ring size, and the limits
//! reported back (docs/datapath.md §2.1, §2.2).

use mlx5_hw::wqe::MAX_DS;

use crate::types::QpType;

/// Geometry of a send queue (docs/datapath.md §2.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SqGeometry {
    /// Worst-case WQE size in bytes (a multiple of 64).
    pub wqe_size: u32,
    /// WQEBBs in the ring (power of two).
    pub wqe_cnt: u32,
    /// WRs that may be outstanding (reported back as `max_send_wr`).
    pub max_post: u32,
    /// SGEs per WR.
    pub max_gs: u32,
    /// Inline bytes per WR (reported back as `max_inline_data`).
    pub max_inline: u32,
}

/// Worst-case bytes of the segments before the payload for `qp_type` (ctrl + transport + op
/// segments), over the operations this driver posts (no UMR/LOCAL_INV/BIND_MW, so RC is 48,
/// not libmlx5's 192; see docs/datapath.md §2.1). The transport segment comes first after the
/// control segment: XRC's 16-byte SRQ-number segment, DC's 48-byte address vector, RAW_PACKET's
/// 32-byte Ethernet segment with the minimum 18 inline header bytes (libmlx5 adds the same
/// 16 / 48 / 32 to its overhead).
pub const fn sq_overhead(qp_type: QpType) -> u32 {
    match qp_type {
        QpType::Rc => 16 + 16 + 16,           // ctrl + raddr + atomic
        QpType::Uc => 16 + 16,                // ctrl + raddr
        QpType::Ud => 16 + 48,                // ctrl + AV
        QpType::XrcSend => 16 + 16 + 16 + 16, // ctrl + XRC + raddr + atomic
        QpType::Dci => 16 + 48 + 16 + 16,     // ctrl + AV + raddr + atomic
        QpType::RawPacket => 16 + 32,         // ctrl + Ethernet (18 B inline headers)
    }
}

/// Bytes a WQE of `qp_type` may carry between its control segment and its payload (transport
/// and operation segments): what [`sq_overhead`] reserved past the control segment, the bound
/// of [`SendQueue::begin_with_segments`](super::SendQueue::begin_with_segments).
pub(crate) const fn segments_reserved(qp_type: QpType) -> u32 {
    sq_overhead(qp_type) - 16
}

/// Compute the SQ geometry for the requested caps, or the first limit violated.
///
/// `max_sq_desc_sz` and `max_send_wqebb` are the device limits from the ucontext.
///
/// # Errors
/// [`Error::Limit`](crate::Error::Limit) naming `max_send_sge`, `max_inline_data` or
/// `max_send_wr` with the value and the limit for this QP type.
pub fn sq_geometry(
    qp_type: QpType,
    max_send_wr: u32,
    max_send_sge: u32,
    max_inline_data: u32,
    max_sq_desc_sz: u32,
    max_send_wqebb: u32,
) -> crate::error::Result<SqGeometry> {
    use crate::error::Error;
    // The WQE index in the control segment and the SQ doorbell record are 16 bits wide.
    let max_send_wqebb = max_send_wqebb.min(1 << 16);
    let ctx = qp_type.limit_context();
    let ov = sq_overhead(qp_type);
    let desc = max_sq_desc_sz.min(MAX_DS * 16) & !63;
    let max_sge = desc.saturating_sub(ov) / 16;
    Error::check_limit("max_send_sge", max_send_sge.into(), max_sge.into(), ctx)?;
    let max_inl = desc.saturating_sub(ov + 4);
    Error::check_limit(
        "max_inline_data",
        max_inline_data.into(),
        max_inl.into(),
        ctx,
    )?;
    let size = ov + 16 * max_send_sge.max(1);
    let inl = if max_inline_data > 0 {
        ov + (4 + max_inline_data).next_multiple_of(16)
    } else {
        0
    };
    let wqe_size = size.max(inl).next_multiple_of(64);
    // Largest number of WRs whose worst-case WQEs fit the largest ring.
    let max_wr = (u64::from(max_send_wqebb) * 64 / u64::from(wqe_size)) as u32;
    Error::check_limit("max_send_wr", max_send_wr.into(), max_wr.into(), ctx)?;
    let bytes = (u64::from(max_send_wr.max(1)) * u64::from(wqe_size)).next_power_of_two();
    let wqe_cnt = (bytes / 64) as u32;
    Error::check_limit("max_send_wr", max_send_wr.into(), max_wr.into(), ctx)?;
    if wqe_cnt > max_send_wqebb {
        return Err(Error::Limit {
            attr: "max_send_wr",
            value: max_send_wr.into(),
            limit: (u64::from(max_send_wqebb) * 64 / u64::from(wqe_size)) / 2,
            context: ctx,
        });
    }
    Ok(SqGeometry {
        wqe_size,
        wqe_cnt,
        max_post: (bytes / u64::from(wqe_size)) as u32,
        max_gs: (wqe_size - ov) / 16,
        max_inline: wqe_size - ov - 4,
    })
}
