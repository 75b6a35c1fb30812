//! The state of the HPC transports, XRC and DC, that the kernel side (`kernel/xrc.rs`,
//! `kernel/dc.rs`) creates and the device side (`device/xrc.rs`, `device/dc.rs`) uses.
//!
//! The device runs XRC initiators, XRC targets, DC initiators (DCIs) and DC targets (DCTs)
//! on its RC engine: their [`crate::state::Qp::qp_type`] is RC, so PSNs, ACKs,
//! retransmission, RNR and the fault campaign's guarantees are RC's, and what differs is
//! written down here, per QP, in [`QpExt`]:
//!
//! - an XRC initiator puts the XRC SRQ number of its WQE's XRC segment into every request
//!   packet (XRCETH); it has no receive queue;
//! - an XRC target owns no receive queue, no CQ and no PD: each request names an XRC SRQ,
//!   which must be in the target's XRC domain, and that SRQ's WQE, CQ, PD and user index
//!   take the message;
//! - a DCI takes its destination (DCT number, DC access key, address) from each WQE's
//!   datagram segment, and connects to one DCT at a time (it reconnects when a WQE names
//!   another, once everything outstanding is acknowledged);
//! - a DCT answers any DCI that presents its access key, with one RC responder context per
//!   connected DCI ([`DcStream`]).

use std::collections::BTreeMap;

/// What kind of HPC transport a QP is (`Plain` for RC, UC, UD).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) enum QpKind {
    #[default]
    Plain,
    /// `IB_QPT_XRC_INI`.
    XrcIni,
    /// `IB_QPT_XRC_TGT` in XRC domain `xrcdn`.
    XrcTgt { xrcdn: u32 },
    /// mlx5 DC initiator (`IB_QPT_DRIVER` with `MLX5_QP_FLAG_TYPE_DCI`).
    Dci,
    /// mlx5 DC target with its access key; `dctn` is reported at the move to RTR.
    Dct { key: u64 },
}

/// The HPC part of a QP.
#[derive(Clone, Debug, Default)]
pub(crate) struct QpExt {
    pub(crate) kind: QpKind,
    /// XRC target: other contexts that opened it (OPEN_QP), with their handle count.
    pub(crate) openers: BTreeMap<u64, u32>,
    /// DCI: the DCT it is connected to, as (node LID, DCT number), and the PSN its
    /// connection started at (the first packet of a connection is a DC connect).
    pub(crate) dc_peer: Option<(u16, u32)>,
    pub(crate) dc_connect_psn: u32,
    /// DCI: the access key the current connection presents.
    pub(crate) dc_key: u64,
    /// DCT: a responder context per connected DCI, by (DCI node LID, DCI QPN).
    pub(crate) streams: BTreeMap<(u16, u32), DcStream>,
}

impl QpExt {
    /// The uverbs QP type the kernel's transition table knows this QP by (`fallback` for
    /// a plain QP).
    pub(crate) fn verbs_type(&self, fallback: u8) -> u8 {
        use mlx5_ffi::uverbs::qp_type as qpt;
        match self.kind {
            QpKind::Plain => fallback,
            QpKind::XrcIni => qpt::XRC_INI,
            QpKind::XrcTgt { .. } => qpt::XRC_TGT,
            QpKind::Dci | QpKind::Dct { .. } => mlx5_ffi::xrc_dc::IBV_QPT_DRIVER,
        }
    }
}

/// A DCT's responder context for one DCI: what an RC responder keeps per connection.
#[derive(Clone, Debug, Default)]
pub(crate) struct DcStream {
    /// The PSN the connection started at (its connect packet).
    pub(crate) start_psn: u32,
    /// Next expected PSN.
    pub(crate) epsn: u32,
    pub(crate) resp: crate::model::device::RespState,
    /// The DCI's path, as the responder addresses its ACKs.
    pub(crate) path: crate::model::path::Path,
}

/// An XRC domain.
#[derive(Clone, Debug, Default)]
pub(crate) struct Xrcd {
    /// The (device, inode) of the file it was opened through; None: not shareable.
    pub(crate) inode: Option<(u64, u64)>,
    /// Open handles, every context counted.
    pub(crate) opens: u32,
}

/// The XRC part of an SRQ of type XRC.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct XrcSrq {
    pub(crate) xrcdn: u32,
    pub(crate) cqn: u32,
    /// CQE version 1 user index (what its receive CQEs carry).
    pub(crate) uidx: u32,
    pub(crate) ctx: u64,
}

/// The HPC state of one HCA.
#[derive(Clone, Debug, Default)]
pub(crate) struct HcaExt {
    pub(crate) xrcds: BTreeMap<u32, Xrcd>,
    pub(crate) next_xrcdn: u32,
    /// XRC SRQs by SRQ number (the SRQ itself is in `Hca::srqs`).
    pub(crate) xrc_srqs: BTreeMap<u32, XrcSrq>,
    /// DC counters: DCT key violations, packets for no DCT context (dropped).
    pub(crate) dc_key_violations: u64,
    pub(crate) dc_no_stream: u64,
    pub(crate) dc_connects: u64,
}
