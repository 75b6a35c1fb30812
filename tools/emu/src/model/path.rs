//! The primary path of a connected QP: what the kernel's modify sets and the device routes by.

/// The primary path of a connected QP.
#[derive(Clone, Debug, Default)]
pub(crate) struct Path {
    pub(crate) dlid: u16,
    pub(crate) dgid: [u8; 16],
    pub(crate) is_global: bool,
    pub(crate) sl: u8,
    pub(crate) port: u8,
    /// GRH fields (used on RoCE, where every packet carries them).
    pub(crate) sgid_index: u8,
    pub(crate) flow_label: u32,
    pub(crate) hop_limit: u8,
    pub(crate) tclass: u8,
    /// RoCE: the destination MAC resolved at modify time (kept as the QP context does;
    /// the in-process fabric routes by GID).
    #[allow(dead_code)]
    pub(crate) dmac: [u8; 6],
}
