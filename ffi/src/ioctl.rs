//! Mirrors of `<rdma/rdma_user_ioctl_cmds.h>`, `<rdma/ib_user_ioctl_cmds.h>` and
//! `<rdma/ib_user_ioctl_verbs.h>`: the `RDMA_VERBS_IOCTL` method-call ABI (header, attributes,
//! object/method/attribute ids) and the enums shared with it.
//!
//! An ioctl buffer is one `IbUverbsIoctlHdr` followed by `num_attrs` `IbUverbsAttr`s;
//! `hdr.length` is the whole buffer's size. Inputs of at most 8 bytes are inline in
//! `IbUverbsAttr::data`, larger ones and all outputs are user pointers; object handles and
//! fds are inline. The kernel sets `UVERBS_ATTR_F_VALID_OUTPUT` on outputs it wrote.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::uverbs::IbUverbsQueryPortResp;

/// `_IOC` direction bits (asm-generic; the same on x86_64 and aarch64).
const IOC_WRITE: u32 = 1;
const IOC_READ: u32 = 2;

/// `_IOWR(ty, nr, size)` as computed by `<asm-generic/ioctl.h>`.
pub const fn iowr(ty: u32, nr: u32, size: usize) -> u32 {
    ((IOC_READ | IOC_WRITE) << 30) | ((size as u32) << 16) | (ty << 8) | nr
}

/// ioctl type ("magic") of the RDMA subsystem.
pub const RDMA_IOCTL_MAGIC: u32 = 0x1b;
/// `_IOWR(RDMA_IOCTL_MAGIC, 1, struct ib_uverbs_ioctl_hdr)` = 0xC018_1B01.
pub const RDMA_VERBS_IOCTL: u32 = iowr(RDMA_IOCTL_MAGIC, 1, size_of::<IbUverbsIoctlHdr>());

/// Attribute flag (user input): the kernel must understand this attribute.
pub const UVERBS_ATTR_F_MANDATORY: u16 = 1 << 0;
/// Attribute flag (kernel output): the kernel wrote this output attribute.
pub const UVERBS_ATTR_F_VALID_OUTPUT: u16 = 1 << 1;

/// `struct ib_uverbs_attr` (16 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsAttr {
    /// 0: attribute id (method specific; driver namespace ids have bit 12 set).
    pub attr_id: u16,
    /// 2: length of the pointed-to (or inline) data.
    pub len: u16,
    /// 4: `UVERBS_ATTR_F_*`.
    pub flags: u16,
    /// 6: `attr_data.enum_data.elem_id` (enum attributes), else 0.
    pub elem_id: u8,
    /// 7: `attr_data.enum_data.reserved`, must be 0.
    pub elem_reserved: u8,
    /// 8: inline value (≤ 8 bytes, handles, fds) or user pointer.
    pub data: u64,
}
const _: () = assert!(size_of::<IbUverbsAttr>() == 16);

/// `struct ib_uverbs_ioctl_hdr` (24 B), followed by `num_attrs` `IbUverbsAttr`.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsIoctlHdr {
    /// 0: total length of header + attributes.
    pub length: u16,
    /// 2: `UVERBS_OBJECT_*` or a driver object id.
    pub object_id: u16,
    /// 4: method id within the object.
    pub method_id: u16,
    /// 6
    pub num_attrs: u16,
    /// 8: must be 0.
    pub reserved1: u64,
    /// 16: `RDMA_DRIVER_*` of the provider (mlx5 = 1).
    pub driver_id: u32,
    /// 20: must be 0.
    pub reserved2: u32,
}
const _: () = assert!(size_of::<IbUverbsIoctlHdr>() == 24);

/// `struct ib_uverbs_query_port_resp_ex` (48 B): output of `UVERBS_METHOD_QUERY_PORT`.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsQueryPortRespEx {
    /// 0
    pub legacy_resp: IbUverbsQueryPortResp,
    /// 40
    pub port_cap_flags2: u16,
    /// 42
    pub reserved: [u8; 6],
}
const _: () = assert!(size_of::<IbUverbsQueryPortRespEx>() == 48);

/// `struct ib_uverbs_qp_cap` (20 B): `UVERBS_ATTR_CREATE_QP_CAP` / `_RESP_CAP`.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsQpCap {
    /// 0
    pub max_send_wr: u32,
    /// 4
    pub max_recv_wr: u32,
    /// 8
    pub max_send_sge: u32,
    /// 12
    pub max_recv_sge: u32,
    /// 16
    pub max_inline_data: u32,
}
const _: () = assert!(size_of::<IbUverbsQpCap>() == 20);

/// `struct ib_uverbs_gid_entry` (32 B): output of `UVERBS_METHOD_QUERY_GID_ENTRY`.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsGidEntry {
    /// 0: the GID's 16 raw bytes.
    pub gid: [u64; 2],
    /// 16
    pub gid_index: u32,
    /// 20
    pub port_num: u32,
    /// 24: `IB_UVERBS_GID_TYPE_*`.
    pub gid_type: u32,
    /// 28: 0 when no netdev is associated.
    pub netdev_ifindex: u32,
}
const _: () = assert!(size_of::<IbUverbsGidEntry>() == 32);

// ---- ids: namespaces -------------------------------------------------------------------

/// Mask of the namespace bits of object/method/attribute ids.
pub const UVERBS_ID_NS_MASK: u32 = 0xF000;
/// Shift of the namespace bits.
pub const UVERBS_ID_NS_SHIFT: u32 = 12;
/// Namespace number of driver-specific ids.
pub const UVERBS_UDATA_DRIVER_DATA_NS: u32 = 1;
/// Driver namespace flag (0x1000): first id of every driver-specific id enum.
pub const UVERBS_UDATA_DRIVER_DATA_FLAG: u32 = 1 << UVERBS_ID_NS_SHIFT;

/// Attribute carrying the driver request (the write ABI's "driver data" in).
pub const UVERBS_ATTR_UHW_IN: u16 = UVERBS_UDATA_DRIVER_DATA_FLAG as u16;
/// Attribute carrying the driver response.
pub const UVERBS_ATTR_UHW_OUT: u16 = UVERBS_ATTR_UHW_IN + 1;

// ---- enum uverbs_default_objects --------------------------------------------------------

/// Object: the device itself (no instances).
pub const UVERBS_OBJECT_DEVICE: u16 = 0;
/// Object: protection domain.
pub const UVERBS_OBJECT_PD: u16 = 1;
/// Object: completion channel.
pub const UVERBS_OBJECT_COMP_CHANNEL: u16 = 2;
/// Object: completion queue.
pub const UVERBS_OBJECT_CQ: u16 = 3;
/// Object: queue pair.
pub const UVERBS_OBJECT_QP: u16 = 4;
/// Object: shared receive queue.
pub const UVERBS_OBJECT_SRQ: u16 = 5;
/// Object: address handle.
pub const UVERBS_OBJECT_AH: u16 = 6;
/// Object: memory region.
pub const UVERBS_OBJECT_MR: u16 = 7;
/// Object: memory window.
pub const UVERBS_OBJECT_MW: u16 = 8;
/// Object: flow steering rule.
pub const UVERBS_OBJECT_FLOW: u16 = 9;
/// Object: XRC domain.
pub const UVERBS_OBJECT_XRCD: u16 = 10;
/// Object: RSS indirection table.
pub const UVERBS_OBJECT_RWQ_IND_TBL: u16 = 11;
/// Object: work queue.
pub const UVERBS_OBJECT_WQ: u16 = 12;
/// Object: flow action.
pub const UVERBS_OBJECT_FLOW_ACTION: u16 = 13;
/// Object: device memory.
pub const UVERBS_OBJECT_DM: u16 = 14;
/// Object: counters.
pub const UVERBS_OBJECT_COUNTERS: u16 = 15;
/// Object: async event file.
pub const UVERBS_OBJECT_ASYNC_EVENT: u16 = 16;

// ---- DEVICE methods and their attributes -----------------------------------------------

/// DEVICE method: run a legacy write command through ioctl.
pub const UVERBS_METHOD_INVOKE_WRITE: u16 = 0;
/// DEVICE method: list handles of an object type.
pub const UVERBS_METHOD_INFO_HANDLES: u16 = 1;
/// DEVICE method: query port (`IbUverbsQueryPortRespEx`).
pub const UVERBS_METHOD_QUERY_PORT: u16 = 2;
/// DEVICE method: open the context.
pub const UVERBS_METHOD_GET_CONTEXT: u16 = 3;
/// DEVICE method: query the context.
pub const UVERBS_METHOD_QUERY_CONTEXT: u16 = 4;
/// DEVICE method: query the GID table.
pub const UVERBS_METHOD_QUERY_GID_TABLE: u16 = 5;
/// DEVICE method: query one GID entry.
pub const UVERBS_METHOD_QUERY_GID_ENTRY: u16 = 6;

/// INVOKE_WRITE attribute: core request (the write command body without header).
pub const UVERBS_ATTR_CORE_IN: u16 = 0;
/// INVOKE_WRITE attribute: core response buffer.
pub const UVERBS_ATTR_CORE_OUT: u16 = 1;
/// INVOKE_WRITE attribute: the write command number (inline, `IB_USER_VERBS_CMD_*`).
pub const UVERBS_ATTR_WRITE_CMD: u16 = 2;

/// QUERY_PORT attribute: port number (u8 in).
pub const UVERBS_ATTR_QUERY_PORT_PORT_NUM: u16 = 0;
/// QUERY_PORT attribute: response (`IbUverbsQueryPortRespEx` out).
pub const UVERBS_ATTR_QUERY_PORT_RESP: u16 = 1;

/// GET_CONTEXT attribute: number of completion vectors (u32 out).
pub const UVERBS_ATTR_GET_CONTEXT_NUM_COMP_VECTORS: u16 = 0;
/// GET_CONTEXT attribute: core support flags (u64 out, `IB_UVERBS_CORE_SUPPORT_*`).
pub const UVERBS_ATTR_GET_CONTEXT_CORE_SUPPORT: u16 = 1;

/// QUERY_CONTEXT attribute: number of completion vectors.
pub const UVERBS_ATTR_QUERY_CONTEXT_NUM_COMP_VECTORS: u16 = 0;
/// QUERY_CONTEXT attribute: core support flags.
pub const UVERBS_ATTR_QUERY_CONTEXT_CORE_SUPPORT: u16 = 1;

/// QUERY_GID_TABLE attribute: entry size.
pub const UVERBS_ATTR_QUERY_GID_TABLE_ENTRY_SIZE: u16 = 0;
/// QUERY_GID_TABLE attribute: flags.
pub const UVERBS_ATTR_QUERY_GID_TABLE_FLAGS: u16 = 1;
/// QUERY_GID_TABLE attribute: entries out.
pub const UVERBS_ATTR_QUERY_GID_TABLE_RESP_ENTRIES: u16 = 2;
/// QUERY_GID_TABLE attribute: number of entries out.
pub const UVERBS_ATTR_QUERY_GID_TABLE_RESP_NUM_ENTRIES: u16 = 3;

/// QUERY_GID_ENTRY attribute: port (u32 in).
pub const UVERBS_ATTR_QUERY_GID_ENTRY_PORT: u16 = 0;
/// QUERY_GID_ENTRY attribute: GID index (u32 in).
pub const UVERBS_ATTR_QUERY_GID_ENTRY_GID_INDEX: u16 = 1;
/// QUERY_GID_ENTRY attribute: flags (u32 in).
pub const UVERBS_ATTR_QUERY_GID_ENTRY_FLAGS: u16 = 2;
/// QUERY_GID_ENTRY attribute: `IbUverbsGidEntry` out.
pub const UVERBS_ATTR_QUERY_GID_ENTRY_RESP_ENTRY: u16 = 3;

// ---- PD, MR, AH -------------------------------------------------------------------------

/// PD method: destroy.
pub const UVERBS_METHOD_PD_DESTROY: u16 = 0;
/// PD destroy attribute: handle (IDR in).
pub const UVERBS_ATTR_DESTROY_PD_HANDLE: u16 = 0;

/// MR method: register device memory MR.
pub const UVERBS_METHOD_DM_MR_REG: u16 = 0;
/// MR method: destroy (deregister).
pub const UVERBS_METHOD_MR_DESTROY: u16 = 1;
/// MR method: advise (prefetch).
pub const UVERBS_METHOD_ADVISE_MR: u16 = 2;
/// MR method: query.
pub const UVERBS_METHOD_QUERY_MR: u16 = 3;
/// MR method: register a dma-buf MR.
pub const UVERBS_METHOD_REG_DMABUF_MR: u16 = 4;
/// MR destroy attribute: handle (IDR in).
pub const UVERBS_ATTR_DESTROY_MR_HANDLE: u16 = 0;

/// AH method: destroy.
pub const UVERBS_METHOD_AH_DESTROY: u16 = 0;
/// AH destroy attribute: handle.
pub const UVERBS_ATTR_DESTROY_AH_HANDLE: u16 = 0;

// ---- DM (device memory) ---------------------------------------------------------------

/// DM method: allocate device memory.
pub const UVERBS_METHOD_DM_ALLOC: u16 = 0;
/// DM method: free device memory.
pub const UVERBS_METHOD_DM_FREE: u16 = 1;
/// DM alloc attribute: new handle (IDR out).
pub const UVERBS_ATTR_ALLOC_DM_HANDLE: u16 = 0;
/// DM alloc attribute: length (u64 in).
pub const UVERBS_ATTR_ALLOC_DM_LENGTH: u16 = 1;
/// DM alloc attribute: alignment (u32 in).
pub const UVERBS_ATTR_ALLOC_DM_ALIGNMENT: u16 = 2;

// ---- CQ ---------------------------------------------------------------------------------

/// CQ method: create.
pub const UVERBS_METHOD_CQ_CREATE: u16 = 0;
/// CQ method: destroy.
pub const UVERBS_METHOD_CQ_DESTROY: u16 = 1;

/// CQ create attribute: new handle (IDR out).
pub const UVERBS_ATTR_CREATE_CQ_HANDLE: u16 = 0;
/// CQ create attribute: requested CQEs (u32 in).
pub const UVERBS_ATTR_CREATE_CQ_CQE: u16 = 1;
/// CQ create attribute: user handle (u64 in).
pub const UVERBS_ATTR_CREATE_CQ_USER_HANDLE: u16 = 2;
/// CQ create attribute: completion channel (FD in).
pub const UVERBS_ATTR_CREATE_CQ_COMP_CHANNEL: u16 = 3;
/// CQ create attribute: completion vector (u32 in).
pub const UVERBS_ATTR_CREATE_CQ_COMP_VECTOR: u16 = 4;
/// CQ create attribute: flags (u32 in, `IB_UVERBS_CQ_FLAGS_*`).
pub const UVERBS_ATTR_CREATE_CQ_FLAGS: u16 = 5;
/// CQ create attribute: actual CQEs (u32 out).
pub const UVERBS_ATTR_CREATE_CQ_RESP_CQE: u16 = 6;
/// CQ create attribute: async event fd (FD in).
pub const UVERBS_ATTR_CREATE_CQ_EVENT_FD: u16 = 7;

/// CQ destroy attribute: handle (IDR in).
pub const UVERBS_ATTR_DESTROY_CQ_HANDLE: u16 = 0;
/// CQ destroy attribute: `IbUverbsDestroyCqResp` out.
pub const UVERBS_ATTR_DESTROY_CQ_RESP: u16 = 1;

// ---- QP ---------------------------------------------------------------------------------

/// QP method: create.
pub const UVERBS_METHOD_QP_CREATE: u16 = 0;
/// QP method: destroy.
pub const UVERBS_METHOD_QP_DESTROY: u16 = 1;

/// QP create attribute: new handle (IDR out).
pub const UVERBS_ATTR_CREATE_QP_HANDLE: u16 = 0;
/// QP create attribute: XRC domain handle.
pub const UVERBS_ATTR_CREATE_QP_XRCD_HANDLE: u16 = 1;
/// QP create attribute: PD handle.
pub const UVERBS_ATTR_CREATE_QP_PD_HANDLE: u16 = 2;
/// QP create attribute: SRQ handle.
pub const UVERBS_ATTR_CREATE_QP_SRQ_HANDLE: u16 = 3;
/// QP create attribute: send CQ handle.
pub const UVERBS_ATTR_CREATE_QP_SEND_CQ_HANDLE: u16 = 4;
/// QP create attribute: receive CQ handle.
pub const UVERBS_ATTR_CREATE_QP_RECV_CQ_HANDLE: u16 = 5;
/// QP create attribute: RSS indirection table handle.
pub const UVERBS_ATTR_CREATE_QP_IND_TABLE_HANDLE: u16 = 6;
/// QP create attribute: user handle (u64 in).
pub const UVERBS_ATTR_CREATE_QP_USER_HANDLE: u16 = 7;
/// QP create attribute: requested caps (`IbUverbsQpCap` in).
pub const UVERBS_ATTR_CREATE_QP_CAP: u16 = 8;
/// QP create attribute: QP type (u32 in, `IB_UVERBS_QPT_*`).
pub const UVERBS_ATTR_CREATE_QP_TYPE: u16 = 9;
/// QP create attribute: create flags (u32 in).
pub const UVERBS_ATTR_CREATE_QP_FLAGS: u16 = 10;
/// QP create attribute: source QPN.
pub const UVERBS_ATTR_CREATE_QP_SOURCE_QPN: u16 = 11;
/// QP create attribute: async event fd (FD in).
pub const UVERBS_ATTR_CREATE_QP_EVENT_FD: u16 = 12;
/// QP create attribute: actual caps (`IbUverbsQpCap` out).
pub const UVERBS_ATTR_CREATE_QP_RESP_CAP: u16 = 13;
/// QP create attribute: QP number (u32 out).
pub const UVERBS_ATTR_CREATE_QP_RESP_QP_NUM: u16 = 14;

/// QP destroy attribute: handle (IDR in).
pub const UVERBS_ATTR_DESTROY_QP_HANDLE: u16 = 0;
/// QP destroy attribute: `IbUverbsDestroyQpResp` out.
pub const UVERBS_ATTR_DESTROY_QP_RESP: u16 = 1;

// ---- SRQ --------------------------------------------------------------------------------

/// SRQ method: create.
pub const UVERBS_METHOD_SRQ_CREATE: u16 = 0;
/// SRQ method: destroy.
pub const UVERBS_METHOD_SRQ_DESTROY: u16 = 1;

/// SRQ create attribute: new handle (IDR out).
pub const UVERBS_ATTR_CREATE_SRQ_HANDLE: u16 = 0;
/// SRQ create attribute: PD handle.
pub const UVERBS_ATTR_CREATE_SRQ_PD_HANDLE: u16 = 1;
/// SRQ create attribute: XRC domain handle.
pub const UVERBS_ATTR_CREATE_SRQ_XRCD_HANDLE: u16 = 2;
/// SRQ create attribute: CQ handle (XRC).
pub const UVERBS_ATTR_CREATE_SRQ_CQ_HANDLE: u16 = 3;
/// SRQ create attribute: user handle.
pub const UVERBS_ATTR_CREATE_SRQ_USER_HANDLE: u16 = 4;
/// SRQ create attribute: max WR (u32 in).
pub const UVERBS_ATTR_CREATE_SRQ_MAX_WR: u16 = 5;
/// SRQ create attribute: max SGE (u32 in).
pub const UVERBS_ATTR_CREATE_SRQ_MAX_SGE: u16 = 6;
/// SRQ create attribute: limit (u32 in).
pub const UVERBS_ATTR_CREATE_SRQ_LIMIT: u16 = 7;
/// SRQ create attribute: max tags (tag matching).
pub const UVERBS_ATTR_CREATE_SRQ_MAX_NUM_TAGS: u16 = 8;
/// SRQ create attribute: SRQ type (`IB_UVERBS_SRQT_*`).
pub const UVERBS_ATTR_CREATE_SRQ_TYPE: u16 = 9;
/// SRQ create attribute: async event fd.
pub const UVERBS_ATTR_CREATE_SRQ_EVENT_FD: u16 = 10;
/// SRQ create attribute: actual max WR (out).
pub const UVERBS_ATTR_CREATE_SRQ_RESP_MAX_WR: u16 = 11;
/// SRQ create attribute: actual max SGE (out).
pub const UVERBS_ATTR_CREATE_SRQ_RESP_MAX_SGE: u16 = 12;
/// SRQ create attribute: SRQ number (out).
pub const UVERBS_ATTR_CREATE_SRQ_RESP_SRQ_NUM: u16 = 13;

/// SRQ destroy attribute: handle.
pub const UVERBS_ATTR_DESTROY_SRQ_HANDLE: u16 = 0;
/// SRQ destroy attribute: `IbUverbsDestroySrqResp` out.
pub const UVERBS_ATTR_DESTROY_SRQ_RESP: u16 = 1;

// ---- ASYNC_EVENT ------------------------------------------------------------------------

/// ASYNC_EVENT method: allocate the async event fd.
pub const UVERBS_METHOD_ASYNC_EVENT_ALLOC: u16 = 0;
/// ASYNC_EVENT alloc attribute: the new fd (FD out).
pub const UVERBS_ATTR_ASYNC_EVENT_ALLOC_FD_HANDLE: u16 = 0;

// ---- enums of ib_user_ioctl_verbs.h -----------------------------------------------------

/// First optional access flag (the kernel ignores unknown optional flags).
pub const IB_UVERBS_ACCESS_OPTIONAL_FIRST: u32 = 1 << 20;
/// Last optional access flag.
pub const IB_UVERBS_ACCESS_OPTIONAL_LAST: u32 = 1 << 29;

/// Core support: optional MR access flags are understood.
pub const IB_UVERBS_CORE_SUPPORT_OPTIONAL_MR_ACCESS: u64 = 1 << 0;

/// Access flag: local write.
pub const IB_UVERBS_ACCESS_LOCAL_WRITE: u32 = 1 << 0;
/// Access flag: remote write.
pub const IB_UVERBS_ACCESS_REMOTE_WRITE: u32 = 1 << 1;
/// Access flag: remote read.
pub const IB_UVERBS_ACCESS_REMOTE_READ: u32 = 1 << 2;
/// Access flag: remote atomic.
pub const IB_UVERBS_ACCESS_REMOTE_ATOMIC: u32 = 1 << 3;
/// Access flag: memory window bind.
pub const IB_UVERBS_ACCESS_MW_BIND: u32 = 1 << 4;
/// Access flag: zero-based addressing.
pub const IB_UVERBS_ACCESS_ZERO_BASED: u32 = 1 << 5;
/// Access flag: on-demand paging.
pub const IB_UVERBS_ACCESS_ON_DEMAND: u32 = 1 << 6;
/// Access flag: huge pages hint.
pub const IB_UVERBS_ACCESS_HUGETLB: u32 = 1 << 7;
/// Access flag: relaxed ordering (optional).
pub const IB_UVERBS_ACCESS_RELAXED_ORDERING: u32 = IB_UVERBS_ACCESS_OPTIONAL_FIRST;
/// Mask of all optional access flags.
pub const IB_UVERBS_ACCESS_OPTIONAL_RANGE: u32 =
    ((IB_UVERBS_ACCESS_OPTIONAL_LAST << 1) - 1) & !(IB_UVERBS_ACCESS_OPTIONAL_FIRST - 1);

/// SRQ type: basic.
pub const IB_UVERBS_SRQT_BASIC: u32 = 0;
/// SRQ type: XRC.
pub const IB_UVERBS_SRQT_XRC: u32 = 1;
/// SRQ type: tag matching.
pub const IB_UVERBS_SRQT_TM: u32 = 2;

/// WQ type: receive queue.
pub const IB_UVERBS_WQT_RQ: u32 = 0;

/// QP type: reliable connected.
pub const IB_UVERBS_QPT_RC: u32 = 2;
/// QP type: unreliable connected.
pub const IB_UVERBS_QPT_UC: u32 = 3;
/// QP type: unreliable datagram.
pub const IB_UVERBS_QPT_UD: u32 = 4;
/// QP type: raw packet.
pub const IB_UVERBS_QPT_RAW_PACKET: u32 = 8;
/// QP type: XRC initiator.
pub const IB_UVERBS_QPT_XRC_INI: u32 = 9;
/// QP type: XRC target.
pub const IB_UVERBS_QPT_XRC_TGT: u32 = 10;
/// QP type: driver specific (mlx5 DC).
pub const IB_UVERBS_QPT_DRIVER: u32 = 0xFF;

/// QP create flag: block multicast loopback.
pub const IB_UVERBS_QP_CREATE_BLOCK_MULTICAST_LOOPBACK: u32 = 1 << 1;
/// QP create flag: scatter FCS.
pub const IB_UVERBS_QP_CREATE_SCATTER_FCS: u32 = 1 << 8;
/// QP create flag: CVLAN stripping.
pub const IB_UVERBS_QP_CREATE_CVLAN_STRIPPING: u32 = 1 << 9;
/// QP create flag: PCI write end padding.
pub const IB_UVERBS_QP_CREATE_PCI_WRITE_END_PADDING: u32 = 1 << 11;
/// QP create flag: signal all send WRs.
pub const IB_UVERBS_QP_CREATE_SQ_SIG_ALL: u32 = 1 << 12;
/// The create flags `UVERBS_METHOD_QP_CREATE` accepts at all (others: EINVAL).
pub const IB_UVERBS_QP_CREATE_FLAGS_KNOWN: u32 = IB_UVERBS_QP_CREATE_BLOCK_MULTICAST_LOOPBACK
    | IB_UVERBS_QP_CREATE_SCATTER_FCS
    | IB_UVERBS_QP_CREATE_CVLAN_STRIPPING
    | IB_UVERBS_QP_CREATE_PCI_WRITE_END_PADDING
    | IB_UVERBS_QP_CREATE_SQ_SIG_ALL;
/// `IBV_QP_CREATE_SOURCE_QPN` (`verbs.h`): create flag of the extended write CREATE_QP.
pub const IB_QP_CREATE_SOURCE_QPN: u32 = 1 << 10;

/// Port cap flag: subnet manager.
pub const IB_UVERBS_PCF_SM: u32 = 1 << 1;
/// Port cap flag: notice supported.
pub const IB_UVERBS_PCF_NOTICE_SUP: u32 = 1 << 2;
/// Port cap flag: trap supported.
pub const IB_UVERBS_PCF_TRAP_SUP: u32 = 1 << 3;
/// Port cap flag: automatic migration supported.
pub const IB_UVERBS_PCF_AUTO_MIGR_SUP: u32 = 1 << 5;
/// Port cap flag: SL map supported.
pub const IB_UVERBS_PCF_SL_MAP_SUP: u32 = 1 << 6;
/// Port cap flag: system image GUID supported.
pub const IB_UVERBS_PCF_SYS_IMAGE_GUID_SUP: u32 = 1 << 11;
/// Port cap flag: extended speeds.
pub const IB_UVERBS_PCF_EXTENDED_SPEEDS_SUP: u32 = 1 << 14;
/// Port cap flag: CM supported.
pub const IB_UVERBS_PCF_CM_SUP: u32 = 1 << 16;
/// Port cap flag: device management supported.
pub const IB_UVERBS_PCF_DEVICE_MGMT_SUP: u32 = 1 << 19;
/// Port cap flag: vendor class supported.
pub const IB_UVERBS_PCF_VENDOR_CLASS_SUP: u32 = 1 << 20;
/// Port cap flag: client re-registration supported (`IBV_PORT_CLIENT_REG_SUP`).
pub const IB_UVERBS_PCF_CLIENT_REG_SUP: u32 = 1 << 25;
/// `ib_uverbs_query_device_resp::atomic_cap`: atomic with respect to this HCA
/// (`IBV_ATOMIC_HCA`).
pub const IB_ATOMIC_HCA: u32 = 1;
/// Port cap flag: GIDs are IP based (RoCE).
pub const IB_UVERBS_PCF_IP_BASED_GIDS: u32 = 1 << 26;

/// Query port flag: the port requires a GRH (RoCE).
pub const IB_UVERBS_QPF_GRH_REQUIRED: u8 = 1 << 0;

/// `IbUverbsIoctlHdr::driver_id` of mlx5.
pub const RDMA_DRIVER_MLX5: u32 = 1;

/// GID type InfiniBand.
pub const IB_UVERBS_GID_TYPE_IB: u32 = 0;
/// GID type RoCE v1.
pub const IB_UVERBS_GID_TYPE_ROCE_V1: u32 = 1;
/// GID type RoCE v2.
pub const IB_UVERBS_GID_TYPE_ROCE_V2: u32 = 2;

// ---- building and walking ioctl buffers --------------------------------------------------

use crate::surface::Errno;

const HDR_LEN: usize = size_of::<IbUverbsIoctlHdr>();
const ATTR_LEN: usize = size_of::<IbUverbsAttr>();

impl IbUverbsAttr {
    /// The inline value bytes of an input attribute of at most 8 bytes (`data` in host
    /// order, truncated to `len`), or `None` if `len > 8` (then `data` is a pointer).
    pub fn inline_bytes(&self) -> Option<&[u8]> {
        let len = usize::from(self.len);
        self.data.as_bytes().get(..len).filter(|_| len <= 8)
    }
}

/// Builder of one `RDMA_VERBS_IOCTL` buffer: header + attributes.
///
/// Attributes are mandatory unless added with [`IoctlBuilder::optional`]. Pointers are user
/// addresses given as `u64`; the builder never dereferences them.
#[derive(Debug, Clone)]
pub struct IoctlBuilder {
    object_id: u16,
    method_id: u16,
    driver_id: u32,
    attrs: Vec<IbUverbsAttr>,
}

impl IoctlBuilder {
    /// A call of `method_id` on `object_id`, driver id `RDMA_DRIVER_MLX5`.
    pub fn new(object_id: u16, method_id: u16) -> IoctlBuilder {
        IoctlBuilder {
            object_id,
            method_id,
            driver_id: RDMA_DRIVER_MLX5,
            attrs: Vec::new(),
        }
    }

    /// Appends a raw attribute.
    pub fn attr(&mut self, attr: IbUverbsAttr) -> &mut IoctlBuilder {
        self.attrs.push(attr);
        self
    }

    fn push(&mut self, attr_id: u16, len: u16, data: u64) -> &mut IoctlBuilder {
        self.attr(IbUverbsAttr {
            attr_id,
            len,
            flags: UVERBS_ATTR_F_MANDATORY,
            data,
            ..Default::default()
        })
    }

    /// Clears `UVERBS_ATTR_F_MANDATORY` on the last attribute added.
    pub fn optional(&mut self) -> &mut IoctlBuilder {
        if let Some(a) = self.attrs.last_mut() {
            a.flags &= !UVERBS_ATTR_F_MANDATORY;
        }
        self
    }

    /// Input of at most 8 bytes, stored inline in `data`. `EINVAL` if `value` is longer.
    pub fn in_inline(&mut self, attr_id: u16, value: &[u8]) -> Result<&mut IoctlBuilder, Errno> {
        if value.len() > 8 {
            return Err(Errno::EINVAL);
        }
        let mut data = [0u8; 8];
        data[..value.len()].copy_from_slice(value);
        Ok(self.push(attr_id, value.len() as u16, u64::from_ne_bytes(data)))
    }

    /// Inline `u32` input.
    pub fn in_u32(&mut self, attr_id: u16, value: u32) -> &mut IoctlBuilder {
        self.push(attr_id, 4, u64::from(value))
    }

    /// Inline `u64` input.
    pub fn in_u64(&mut self, attr_id: u16, value: u64) -> &mut IoctlBuilder {
        self.push(attr_id, 8, value)
    }

    /// Input buffer of `len` bytes at user address `addr` (use [`Self::in_inline`] for ≤ 8).
    pub fn in_ptr(&mut self, attr_id: u16, addr: u64, len: u16) -> &mut IoctlBuilder {
        self.push(attr_id, len, addr)
    }

    /// Output buffer of `len` bytes at user address `addr`.
    pub fn out_ptr(&mut self, attr_id: u16, addr: u64, len: u16) -> &mut IoctlBuilder {
        self.push(attr_id, len, addr)
    }

    /// Existing object handle input (IDR in).
    pub fn in_obj(&mut self, attr_id: u16, handle: u32) -> &mut IoctlBuilder {
        self.push(attr_id, 0, u64::from(handle))
    }

    /// New object handle output (IDR out; the kernel writes the handle into `data`).
    pub fn out_obj(&mut self, attr_id: u16) -> &mut IoctlBuilder {
        self.push(attr_id, 0, 0)
    }

    /// File descriptor input (FD in).
    pub fn in_fd(&mut self, attr_id: u16, fd: i32) -> &mut IoctlBuilder {
        self.push(attr_id, 0, fd as i64 as u64)
    }

    /// New file descriptor output (FD out; the kernel writes the fd into `data`).
    pub fn out_fd(&mut self, attr_id: u16) -> &mut IoctlBuilder {
        self.push(attr_id, 0, 0)
    }

    /// Constant/enum input: `elem_id` selects the enum element, `value` inline.
    pub fn in_enum(&mut self, attr_id: u16, elem_id: u8, value: u64) -> &mut IoctlBuilder {
        self.push(attr_id, 8, value);
        if let Some(a) = self.attrs.last_mut() {
            a.elem_id = elem_id;
        }
        self
    }

    /// The finished buffer. `EINVAL` if more attributes than fit the 16-bit length.
    pub fn build(&self) -> Result<Vec<u8>, Errno> {
        let total = HDR_LEN + self.attrs.len() * ATTR_LEN;
        let hdr = IbUverbsIoctlHdr {
            length: u16::try_from(total).map_err(|_| Errno::EINVAL)?,
            object_id: self.object_id,
            method_id: self.method_id,
            num_attrs: self.attrs.len() as u16,
            reserved1: 0,
            driver_id: self.driver_id,
            reserved2: 0,
        };
        let mut buf = Vec::with_capacity(total);
        buf.extend_from_slice(hdr.as_bytes());
        for a in &self.attrs {
            buf.extend_from_slice(a.as_bytes());
        }
        Ok(buf)
    }
}

/// A validated view of an ioctl buffer.
#[derive(Debug, Clone, Copy)]
pub struct IoctlView<'a> {
    /// The header.
    pub hdr: IbUverbsIoctlHdr,
    attrs: &'a [u8],
}

/// Parses an ioctl buffer as the kernel does: `EINVAL` if the buffer is shorter than
/// `hdr.length` or `hdr.length != 24 + 16 * num_attrs`, `EPROTONOSUPPORT` if a reserved
/// header field is non-zero, `EINVAL` if an attribute's reserved byte is set or an attribute
/// id appears twice.
pub fn parse_ioctl(buf: &[u8]) -> Result<IoctlView<'_>, Errno> {
    let (hdr, _) = IbUverbsIoctlHdr::read_from_prefix(buf).map_err(|_| Errno::EINVAL)?;
    let length = usize::from(hdr.length);
    if length > buf.len() || length != HDR_LEN + usize::from(hdr.num_attrs) * ATTR_LEN {
        return Err(Errno::EINVAL);
    }
    if hdr.reserved1 != 0 || hdr.reserved2 != 0 {
        return Err(Errno::EPROTONOSUPPORT);
    }
    let view = IoctlView {
        hdr,
        attrs: &buf[HDR_LEN..length],
    };
    for (i, a) in view.attrs().enumerate() {
        if a.elem_reserved != 0 || view.attrs().take(i).any(|b| b.attr_id == a.attr_id) {
            return Err(Errno::EINVAL);
        }
    }
    Ok(view)
}

impl<'a> IoctlView<'a> {
    /// The attributes in buffer order.
    pub fn attrs(&self) -> impl Iterator<Item = IbUverbsAttr> + 'a {
        self.attrs
            .chunks_exact(ATTR_LEN)
            .filter_map(|c| IbUverbsAttr::read_from_bytes(c).ok())
    }

    /// Index and value of the attribute with `attr_id`.
    pub fn find(&self, attr_id: u16) -> Option<(usize, IbUverbsAttr)> {
        self.attrs().enumerate().find(|(_, a)| a.attr_id == attr_id)
    }
}

/// Overwrites attribute `index` of the ioctl buffer `buf` (kernel write-back of `data`
/// and `flags`). `EINVAL` if the index is outside the buffer.
pub fn write_attr(buf: &mut [u8], index: usize, attr: &IbUverbsAttr) -> Result<(), Errno> {
    let start = HDR_LEN + index * ATTR_LEN;
    let slot = buf.get_mut(start..start + ATTR_LEN).ok_or(Errno::EINVAL)?;
    slot.copy_from_slice(attr.as_bytes());
    Ok(())
}

/// Kernel-side output of an inline value (new handle or fd): stores `data` into attribute
/// `attr_id` and sets `UVERBS_ATTR_F_VALID_OUTPUT`. `EINVAL` if the attribute is absent.
pub fn set_attr_output(buf: &mut [u8], attr_id: u16, data: u64) -> Result<(), Errno> {
    let (index, mut attr) = parse_ioctl(buf)?.find(attr_id).ok_or(Errno::EINVAL)?;
    attr.data = data;
    attr.flags |= UVERBS_ATTR_F_VALID_OUTPUT;
    write_attr(buf, index, &attr)
}
