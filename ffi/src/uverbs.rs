//! Mirrors of `<rdma/ib_user_verbs.h>`: the legacy `write()` command ABI of ib_uverbs
//! (ABI version 6), plus the kernel enums the driver and the emulator share (QP states,
//! MTUs, port states, QP attribute masks, async event types) that the uapi header leaves
//! to `<rdma/ib_verbs.h>` / `<infiniband/verbs.h>`.
//!
//! All fields are host-endian plain integers unless a comment says "big-endian" (GUIDs and
//! GIDs are raw network-order bytes or `u64`s holding network-order bytes). Flexible arrays
//! (`driver_data[]`) are omitted: a struct's size is the size of its fixed part, and driver
//! data follows it in the command buffer.
//!
//! Every struct has a `const` size assertion next to it; `tests/header_check.rs` compares
//! every size, field offset and constant with the installed kernel headers.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// The only uverbs ABI version this crate speaks (`/sys/class/infiniband_verbs/abi_version`).
pub const IB_USER_VERBS_ABI_VERSION: u32 = 6;
/// First command number of the extended-only commands.
pub const IB_USER_VERBS_CMD_THRESHOLD: u32 = 50;

/// Mask that extracts the command number from `IbUverbsCmdHdr::command`.
pub const IB_USER_VERBS_CMD_COMMAND_MASK: u32 = 0xff;
/// Set in `IbUverbsCmdHdr::command` for extended commands (an `IbUverbsExCmdHdr` follows).
pub const IB_USER_VERBS_CMD_FLAG_EXTENDED: u32 = 0x8000_0000;

// enum ib_uverbs_write_cmds
/// Write command: open the device context (alloc ucontext).
pub const IB_USER_VERBS_CMD_GET_CONTEXT: u32 = 0;
/// Write command: legacy query device.
pub const IB_USER_VERBS_CMD_QUERY_DEVICE: u32 = 1;
/// Write command: query port.
pub const IB_USER_VERBS_CMD_QUERY_PORT: u32 = 2;
/// Write command: allocate a protection domain.
pub const IB_USER_VERBS_CMD_ALLOC_PD: u32 = 3;
/// Write command: free a protection domain.
pub const IB_USER_VERBS_CMD_DEALLOC_PD: u32 = 4;
/// Write command: create an address handle.
pub const IB_USER_VERBS_CMD_CREATE_AH: u32 = 5;
/// Write command: modify an address handle (unused by providers).
pub const IB_USER_VERBS_CMD_MODIFY_AH: u32 = 6;
/// Write command: query an address handle (unused by providers).
pub const IB_USER_VERBS_CMD_QUERY_AH: u32 = 7;
/// Write command: destroy an address handle.
pub const IB_USER_VERBS_CMD_DESTROY_AH: u32 = 8;
/// Write command: register a memory region.
pub const IB_USER_VERBS_CMD_REG_MR: u32 = 9;
/// Write command: obsolete.
pub const IB_USER_VERBS_CMD_REG_SMR: u32 = 10;
/// Write command: re-register a memory region.
pub const IB_USER_VERBS_CMD_REREG_MR: u32 = 11;
/// Write command: obsolete.
pub const IB_USER_VERBS_CMD_QUERY_MR: u32 = 12;
/// Write command: deregister a memory region.
pub const IB_USER_VERBS_CMD_DEREG_MR: u32 = 13;
/// Write command: allocate a memory window.
pub const IB_USER_VERBS_CMD_ALLOC_MW: u32 = 14;
/// Write command: obsolete.
pub const IB_USER_VERBS_CMD_BIND_MW: u32 = 15;
/// Write command: free a memory window.
pub const IB_USER_VERBS_CMD_DEALLOC_MW: u32 = 16;
/// Write command: create a completion channel (returns an fd).
pub const IB_USER_VERBS_CMD_CREATE_COMP_CHANNEL: u32 = 17;
/// Write command: create a completion queue.
pub const IB_USER_VERBS_CMD_CREATE_CQ: u32 = 18;
/// Write command: resize a completion queue.
pub const IB_USER_VERBS_CMD_RESIZE_CQ: u32 = 19;
/// Write command: destroy a completion queue.
pub const IB_USER_VERBS_CMD_DESTROY_CQ: u32 = 20;
/// Write command: kernel-polled CQ (never used by mlx5).
pub const IB_USER_VERBS_CMD_POLL_CQ: u32 = 21;
/// Write command: obsolete.
pub const IB_USER_VERBS_CMD_PEEK_CQ: u32 = 22;
/// Write command: kernel CQ arm (never used by mlx5).
pub const IB_USER_VERBS_CMD_REQ_NOTIFY_CQ: u32 = 23;
/// Write command: create a queue pair.
pub const IB_USER_VERBS_CMD_CREATE_QP: u32 = 24;
/// Write command: query a queue pair.
pub const IB_USER_VERBS_CMD_QUERY_QP: u32 = 25;
/// Write command: modify a queue pair.
pub const IB_USER_VERBS_CMD_MODIFY_QP: u32 = 26;
/// Write command: destroy a queue pair.
pub const IB_USER_VERBS_CMD_DESTROY_QP: u32 = 27;
/// Write command: kernel post send (never used by mlx5).
pub const IB_USER_VERBS_CMD_POST_SEND: u32 = 28;
/// Write command: kernel post receive (never used by mlx5).
pub const IB_USER_VERBS_CMD_POST_RECV: u32 = 29;
/// Write command: attach a QP to a multicast group.
pub const IB_USER_VERBS_CMD_ATTACH_MCAST: u32 = 30;
/// Write command: detach a QP from a multicast group.
pub const IB_USER_VERBS_CMD_DETACH_MCAST: u32 = 31;
/// Write command: create a shared receive queue.
pub const IB_USER_VERBS_CMD_CREATE_SRQ: u32 = 32;
/// Write command: modify a shared receive queue.
pub const IB_USER_VERBS_CMD_MODIFY_SRQ: u32 = 33;
/// Write command: query a shared receive queue.
pub const IB_USER_VERBS_CMD_QUERY_SRQ: u32 = 34;
/// Write command: destroy a shared receive queue.
pub const IB_USER_VERBS_CMD_DESTROY_SRQ: u32 = 35;
/// Write command: kernel SRQ post (never used by mlx5).
pub const IB_USER_VERBS_CMD_POST_SRQ_RECV: u32 = 36;
/// Write command: open an XRC domain.
pub const IB_USER_VERBS_CMD_OPEN_XRCD: u32 = 37;
/// Write command: close an XRC domain.
pub const IB_USER_VERBS_CMD_CLOSE_XRCD: u32 = 38;
/// Write command: create an SRQ with a type (XRC, tag matching).
pub const IB_USER_VERBS_CMD_CREATE_XSRQ: u32 = 39;
/// Write command: open a shareable XRC target QP.
pub const IB_USER_VERBS_CMD_OPEN_QP: u32 = 40;

/// Extended command: query device (returns `IbUverbsExQueryDeviceResp`).
pub const IB_USER_VERBS_EX_CMD_QUERY_DEVICE: u32 = IB_USER_VERBS_CMD_QUERY_DEVICE;
/// Extended command: create CQ with flags.
pub const IB_USER_VERBS_EX_CMD_CREATE_CQ: u32 = IB_USER_VERBS_CMD_CREATE_CQ;
/// Extended command: create QP with create flags / comp mask.
pub const IB_USER_VERBS_EX_CMD_CREATE_QP: u32 = IB_USER_VERBS_CMD_CREATE_QP;
/// Extended command: modify QP with rate limit / driver data.
pub const IB_USER_VERBS_EX_CMD_MODIFY_QP: u32 = IB_USER_VERBS_CMD_MODIFY_QP;
/// Extended command: create flow steering rule.
pub const IB_USER_VERBS_EX_CMD_CREATE_FLOW: u32 = IB_USER_VERBS_CMD_THRESHOLD;
/// Extended command: destroy flow steering rule.
pub const IB_USER_VERBS_EX_CMD_DESTROY_FLOW: u32 = 51;
/// Extended command: create work queue.
pub const IB_USER_VERBS_EX_CMD_CREATE_WQ: u32 = 52;
/// Extended command: modify work queue.
pub const IB_USER_VERBS_EX_CMD_MODIFY_WQ: u32 = 53;
/// Extended command: destroy work queue.
pub const IB_USER_VERBS_EX_CMD_DESTROY_WQ: u32 = 54;
/// Extended command: create RSS indirection table.
pub const IB_USER_VERBS_EX_CMD_CREATE_RWQ_IND_TBL: u32 = 55;
/// Extended command: destroy RSS indirection table.
pub const IB_USER_VERBS_EX_CMD_DESTROY_RWQ_IND_TBL: u32 = 56;
/// Extended command: modify CQ moderation.
pub const IB_USER_VERBS_EX_CMD_MODIFY_CQ: u32 = 57;

// enum ib_uverbs_ex_create_cq_flags
/// Extended create CQ flag: CQEs carry completion timestamps.
pub const IB_UVERBS_CQ_FLAGS_TIMESTAMP_COMPLETION: u32 = 1 << 0;
/// Extended create CQ flag: overrun is not an error.
pub const IB_UVERBS_CQ_FLAGS_IGNORE_OVERRUN: u32 = 1 << 1;

// enum ib_uverbs_create_qp_mask
/// Extended create QP comp mask: `rwq_ind_tbl_handle` is valid.
pub const IB_UVERBS_CREATE_QP_MASK_IND_TABLE: u32 = 1 << 0;
/// All comp-mask bits the kernel accepts on extended create QP.
pub const IB_UVERBS_CREATE_QP_SUP_COMP_MASK: u32 = IB_UVERBS_CREATE_QP_MASK_IND_TABLE;

// enum ib_uverbs_wc_opcode
/// Work completion opcode: send.
pub const IB_UVERBS_WC_SEND: u32 = 0;
/// Work completion opcode: RDMA write.
pub const IB_UVERBS_WC_RDMA_WRITE: u32 = 1;
/// Work completion opcode: RDMA read.
pub const IB_UVERBS_WC_RDMA_READ: u32 = 2;
/// Work completion opcode: compare and swap.
pub const IB_UVERBS_WC_COMP_SWAP: u32 = 3;
/// Work completion opcode: fetch and add.
pub const IB_UVERBS_WC_FETCH_ADD: u32 = 4;
/// Work completion opcode: bind memory window.
pub const IB_UVERBS_WC_BIND_MW: u32 = 5;
/// Work completion opcode: local invalidate.
pub const IB_UVERBS_WC_LOCAL_INV: u32 = 6;
/// Work completion opcode: TCP segmentation offload.
pub const IB_UVERBS_WC_TSO: u32 = 7;

// enum ib_uverbs_wr_opcode
/// Work request opcode: RDMA write.
pub const IB_UVERBS_WR_RDMA_WRITE: u32 = 0;
/// Work request opcode: RDMA write with immediate.
pub const IB_UVERBS_WR_RDMA_WRITE_WITH_IMM: u32 = 1;
/// Work request opcode: send.
pub const IB_UVERBS_WR_SEND: u32 = 2;
/// Work request opcode: send with immediate.
pub const IB_UVERBS_WR_SEND_WITH_IMM: u32 = 3;
/// Work request opcode: RDMA read.
pub const IB_UVERBS_WR_RDMA_READ: u32 = 4;
/// Work request opcode: atomic compare and swap.
pub const IB_UVERBS_WR_ATOMIC_CMP_AND_SWP: u32 = 5;
/// Work request opcode: atomic fetch and add.
pub const IB_UVERBS_WR_ATOMIC_FETCH_AND_ADD: u32 = 6;
/// Work request opcode: local invalidate.
pub const IB_UVERBS_WR_LOCAL_INV: u32 = 7;
/// Work request opcode: bind memory window.
pub const IB_UVERBS_WR_BIND_MW: u32 = 8;
/// Work request opcode: send with invalidate.
pub const IB_UVERBS_WR_SEND_WITH_INV: u32 = 9;
/// Work request opcode: TSO.
pub const IB_UVERBS_WR_TSO: u32 = 10;
/// Work request opcode: RDMA read with invalidate.
pub const IB_UVERBS_WR_RDMA_READ_WITH_INV: u32 = 11;
/// Work request opcode: masked compare and swap.
pub const IB_UVERBS_WR_MASKED_ATOMIC_CMP_AND_SWP: u32 = 12;
/// Work request opcode: masked fetch and add.
pub const IB_UVERBS_WR_MASKED_ATOMIC_FETCH_AND_ADD: u32 = 13;

// enum ib_uverbs_device_cap_flags (u64 values)
/// Device cap: resize max WR.
pub const IB_UVERBS_DEVICE_RESIZE_MAX_WR: u64 = 1 << 0;
/// Device cap: bad P_Key counter.
pub const IB_UVERBS_DEVICE_BAD_PKEY_CNTR: u64 = 1 << 1;
/// Device cap: bad Q_Key counter.
pub const IB_UVERBS_DEVICE_BAD_QKEY_CNTR: u64 = 1 << 2;
/// Device cap: raw multicast.
pub const IB_UVERBS_DEVICE_RAW_MULTI: u64 = 1 << 3;
/// Device cap: automatic path migration.
pub const IB_UVERBS_DEVICE_AUTO_PATH_MIG: u64 = 1 << 4;
/// Device cap: change physical port.
pub const IB_UVERBS_DEVICE_CHANGE_PHY_PORT: u64 = 1 << 5;
/// Device cap: UD AV port enforced.
pub const IB_UVERBS_DEVICE_UD_AV_PORT_ENFORCE: u64 = 1 << 6;
/// Device cap: current QP state may be given to modify QP.
pub const IB_UVERBS_DEVICE_CURR_QP_STATE_MOD: u64 = 1 << 7;
/// Device cap: shut down port.
pub const IB_UVERBS_DEVICE_SHUTDOWN_PORT: u64 = 1 << 8;
/// Device cap: port active event.
pub const IB_UVERBS_DEVICE_PORT_ACTIVE_EVENT: u64 = 1 << 10;
/// Device cap: system image GUID valid.
pub const IB_UVERBS_DEVICE_SYS_IMAGE_GUID: u64 = 1 << 11;
/// Device cap: RC RNR NAK generation.
pub const IB_UVERBS_DEVICE_RC_RNR_NAK_GEN: u64 = 1 << 12;
/// Device cap: SRQ resize.
pub const IB_UVERBS_DEVICE_SRQ_RESIZE: u64 = 1 << 13;
/// Device cap: N-notify CQ.
pub const IB_UVERBS_DEVICE_N_NOTIFY_CQ: u64 = 1 << 14;
/// Device cap: memory windows.
pub const IB_UVERBS_DEVICE_MEM_WINDOW: u64 = 1 << 17;
/// Device cap: UD IP checksum.
pub const IB_UVERBS_DEVICE_UD_IP_CSUM: u64 = 1 << 18;
/// Device cap: XRC.
pub const IB_UVERBS_DEVICE_XRC: u64 = 1 << 20;
/// Device cap: memory management extensions.
pub const IB_UVERBS_DEVICE_MEM_MGT_EXTENSIONS: u64 = 1 << 21;
/// Device cap: memory window type 2A.
pub const IB_UVERBS_DEVICE_MEM_WINDOW_TYPE_2A: u64 = 1 << 23;
/// Device cap: memory window type 2B.
pub const IB_UVERBS_DEVICE_MEM_WINDOW_TYPE_2B: u64 = 1 << 24;
/// Device cap: RC IP checksum.
pub const IB_UVERBS_DEVICE_RC_IP_CSUM: u64 = 1 << 25;
/// Device cap: raw IP checksum (deprecated).
pub const IB_UVERBS_DEVICE_RAW_IP_CSUM: u64 = 1 << 26;
/// Device cap: managed flow steering.
pub const IB_UVERBS_DEVICE_MANAGED_FLOW_STEERING: u64 = 1 << 29;
/// Device cap: raw scatter FCS (deprecated).
pub const IB_UVERBS_DEVICE_RAW_SCATTER_FCS: u64 = 1 << 34;
/// Device cap: PCI write end padding.
pub const IB_UVERBS_DEVICE_PCI_WRITE_END_PADDING: u64 = 1 << 36;

// enum ib_uverbs_raw_packet_caps
/// Raw packet cap: CVLAN stripping.
pub const IB_UVERBS_RAW_PACKET_CAP_CVLAN_STRIPPING: u32 = 1 << 0;
/// Raw packet cap: scatter FCS.
pub const IB_UVERBS_RAW_PACKET_CAP_SCATTER_FCS: u32 = 1 << 1;
/// Raw packet cap: IP checksum.
pub const IB_UVERBS_RAW_PACKET_CAP_IP_CSUM: u32 = 1 << 2;
/// Raw packet cap: delay drop.
pub const IB_UVERBS_RAW_PACKET_CAP_DELAY_DROP: u32 = 1 << 3;

// ---- kernel enums not in the uapi header (ib_verbs.h); values = libibverbs' IBV_* ----

// enum ib_qp_state
/// QP state RESET.
pub const IB_QPS_RESET: u32 = 0;
/// QP state INIT.
pub const IB_QPS_INIT: u32 = 1;
/// QP state RTR (ready to receive).
pub const IB_QPS_RTR: u32 = 2;
/// QP state RTS (ready to send).
pub const IB_QPS_RTS: u32 = 3;
/// QP state SQD (send queue drained).
pub const IB_QPS_SQD: u32 = 4;
/// QP state SQE (send queue error).
pub const IB_QPS_SQE: u32 = 5;
/// QP state ERR.
pub const IB_QPS_ERR: u32 = 6;

// enum ib_mig_state
/// Path migration state MIGRATED.
pub const IB_MIG_MIGRATED: u32 = 0;
/// Path migration state REARM.
pub const IB_MIG_REARM: u32 = 1;
/// Path migration state ARMED.
pub const IB_MIG_ARMED: u32 = 2;

// enum ib_mtu
/// Path MTU 256 bytes.
pub const IB_MTU_256: u32 = 1;
/// Path MTU 512 bytes.
pub const IB_MTU_512: u32 = 2;
/// Path MTU 1024 bytes.
pub const IB_MTU_1024: u32 = 3;
/// Path MTU 2048 bytes.
pub const IB_MTU_2048: u32 = 4;
/// Path MTU 4096 bytes.
pub const IB_MTU_4096: u32 = 5;

// enum ib_port_state
/// Port state NOP.
pub const IB_PORT_NOP: u32 = 0;
/// Port state DOWN.
pub const IB_PORT_DOWN: u32 = 1;
/// Port state INIT.
pub const IB_PORT_INIT: u32 = 2;
/// Port state ARMED.
pub const IB_PORT_ARMED: u32 = 3;
/// Port state ACTIVE.
pub const IB_PORT_ACTIVE: u32 = 4;
/// Port state ACTIVE_DEFER.
pub const IB_PORT_ACTIVE_DEFER: u32 = 5;

// IB_LINK_LAYER_*
/// Link layer unspecified (treated as InfiniBand).
pub const IB_LINK_LAYER_UNSPECIFIED: u8 = 0;
/// Link layer InfiniBand.
pub const IB_LINK_LAYER_INFINIBAND: u8 = 1;
/// Link layer Ethernet (RoCE).
pub const IB_LINK_LAYER_ETHERNET: u8 = 2;

// enum ib_qp_attr_mask
/// Modify/query QP mask: qp_state.
pub const IB_QP_STATE: u32 = 1 << 0;
/// Modify QP mask: cur_qp_state.
pub const IB_QP_CUR_STATE: u32 = 1 << 1;
/// Modify QP mask: en_sqd_async_notify.
pub const IB_QP_EN_SQD_ASYNC_NOTIFY: u32 = 1 << 2;
/// Modify QP mask: qp_access_flags.
pub const IB_QP_ACCESS_FLAGS: u32 = 1 << 3;
/// Modify QP mask: pkey_index.
pub const IB_QP_PKEY_INDEX: u32 = 1 << 4;
/// Modify QP mask: port_num.
pub const IB_QP_PORT: u32 = 1 << 5;
/// Modify QP mask: qkey.
pub const IB_QP_QKEY: u32 = 1 << 6;
/// Modify QP mask: primary address vector (dest).
pub const IB_QP_AV: u32 = 1 << 7;
/// Modify QP mask: path_mtu.
pub const IB_QP_PATH_MTU: u32 = 1 << 8;
/// Modify QP mask: timeout.
pub const IB_QP_TIMEOUT: u32 = 1 << 9;
/// Modify QP mask: retry_cnt.
pub const IB_QP_RETRY_CNT: u32 = 1 << 10;
/// Modify QP mask: rnr_retry.
pub const IB_QP_RNR_RETRY: u32 = 1 << 11;
/// Modify QP mask: rq_psn.
pub const IB_QP_RQ_PSN: u32 = 1 << 12;
/// Modify QP mask: max_rd_atomic.
pub const IB_QP_MAX_QP_RD_ATOMIC: u32 = 1 << 13;
/// Modify QP mask: alternate path.
pub const IB_QP_ALT_PATH: u32 = 1 << 14;
/// Modify QP mask: min_rnr_timer.
pub const IB_QP_MIN_RNR_TIMER: u32 = 1 << 15;
/// Modify QP mask: sq_psn.
pub const IB_QP_SQ_PSN: u32 = 1 << 16;
/// Modify QP mask: max_dest_rd_atomic.
pub const IB_QP_MAX_DEST_RD_ATOMIC: u32 = 1 << 17;
/// Modify QP mask: path_mig_state.
pub const IB_QP_PATH_MIG_STATE: u32 = 1 << 18;
/// Modify/query QP mask: capabilities.
pub const IB_QP_CAP: u32 = 1 << 19;
/// Modify QP mask: dest_qp_num.
pub const IB_QP_DEST_QPN: u32 = 1 << 20;
/// Modify QP mask (extended): rate_limit.
pub const IB_QP_RATE_LIMIT: u32 = 1 << 25;

// enum ib_srq_attr_mask
/// Modify SRQ mask: max_wr (resize).
pub const IB_SRQ_MAX_WR: u32 = 1 << 0;
/// Modify SRQ mask: srq_limit (arm).
pub const IB_SRQ_LIMIT: u32 = 1 << 1;

// enum ib_event_type (IbUverbsAsyncEventDesc::event_type)
/// Async event: CQ error.
pub const IB_EVENT_CQ_ERR: u32 = 0;
/// Async event: QP fatal error.
pub const IB_EVENT_QP_FATAL: u32 = 1;
/// Async event: QP invalid request error.
pub const IB_EVENT_QP_REQ_ERR: u32 = 2;
/// Async event: QP access error.
pub const IB_EVENT_QP_ACCESS_ERR: u32 = 3;
/// Async event: communication established.
pub const IB_EVENT_COMM_EST: u32 = 4;
/// Async event: send queue drained.
pub const IB_EVENT_SQ_DRAINED: u32 = 5;
/// Async event: path migrated.
pub const IB_EVENT_PATH_MIG: u32 = 6;
/// Async event: path migration error.
pub const IB_EVENT_PATH_MIG_ERR: u32 = 7;
/// Async event: device fatal.
pub const IB_EVENT_DEVICE_FATAL: u32 = 8;
/// Async event: port active.
pub const IB_EVENT_PORT_ACTIVE: u32 = 9;
/// Async event: port error.
pub const IB_EVENT_PORT_ERR: u32 = 10;
/// Async event: LID change.
pub const IB_EVENT_LID_CHANGE: u32 = 11;
/// Async event: P_Key change.
pub const IB_EVENT_PKEY_CHANGE: u32 = 12;
/// Async event: SM change.
pub const IB_EVENT_SM_CHANGE: u32 = 13;
/// Async event: SRQ error.
pub const IB_EVENT_SRQ_ERR: u32 = 14;
/// Async event: SRQ limit reached.
pub const IB_EVENT_SRQ_LIMIT_REACHED: u32 = 15;
/// Async event: last WQE reached (QP attached to an SRQ).
pub const IB_EVENT_QP_LAST_WQE_REACHED: u32 = 16;
/// Async event: client reregister.
pub const IB_EVENT_CLIENT_REREGISTER: u32 = 17;
/// Async event: GID change.
pub const IB_EVENT_GID_CHANGE: u32 = 18;
/// Async event: WQ fatal.
pub const IB_EVENT_WQ_FATAL: u32 = 19;

// enum rdma_node_type (sysfs node_type / query_device)
/// Node type: channel adapter.
pub const RDMA_NODE_IB_CA: u32 = 1;

// ------------------------------------------------------------------------------------------
// Event descriptors read(2) from the async fd and from completion-channel fds.

/// `struct ib_uverbs_async_event_desc` (16 B), read from the async event fd.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsAsyncEventDesc {
    /// 0: user handle of the object (CQ/QP/SRQ user_handle) or port number.
    pub element: u64,
    /// 8: `IB_EVENT_*`.
    pub event_type: u32,
    /// 12
    pub reserved: u32,
}
const _: () = assert!(size_of::<IbUverbsAsyncEventDesc>() == 16);

/// `struct ib_uverbs_comp_event_desc` (8 B), read from a completion channel fd.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsCompEventDesc {
    /// 0: the CQ's `user_handle` given at create.
    pub cq_handle: u64,
}
const _: () = assert!(size_of::<IbUverbsCompEventDesc>() == 8);

/// `struct ib_uverbs_cq_moderation_caps` (8 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsCqModerationCaps {
    /// 0
    pub max_cq_moderation_count: u16,
    /// 2
    pub max_cq_moderation_period: u16,
    /// 4
    pub reserved: u32,
}
const _: () = assert!(size_of::<IbUverbsCqModerationCaps>() == 8);

// ------------------------------------------------------------------------------------------
// Command headers.

/// `struct ib_uverbs_cmd_hdr` (8 B): first bytes of every `write()`.
///
/// Legacy commands: `in_words` = whole buffer (header included) in 4-byte words, `out_words`
/// = response length (core + driver) in 4-byte words. Extended commands (`command` has
/// `IB_USER_VERBS_CMD_FLAG_EXTENDED`): `in_words`/`out_words` = core request/response in
/// 8-byte words, headers excluded; an `IbUverbsExCmdHdr` follows.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsCmdHdr {
    /// 0: command number, possibly with `IB_USER_VERBS_CMD_FLAG_EXTENDED`.
    pub command: u32,
    /// 4
    pub in_words: u16,
    /// 6
    pub out_words: u16,
}
const _: () = assert!(size_of::<IbUverbsCmdHdr>() == 8);

/// `struct ib_uverbs_ex_cmd_hdr` (16 B): second header of extended commands.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsExCmdHdr {
    /// 0: user pointer of the response buffer (core response, then driver response).
    pub response: u64,
    /// 8: driver request length in 8-byte words.
    pub provider_in_words: u16,
    /// 10: driver response length in 8-byte words.
    pub provider_out_words: u16,
    /// 12: must be 0.
    pub cmd_hdr_reserved: u32,
}
const _: () = assert!(size_of::<IbUverbsExCmdHdr>() == 16);

// ------------------------------------------------------------------------------------------
// Context and device.

/// `struct ib_uverbs_get_context` (8 B) + driver data (`Mlx5IbAllocUcontextReqV2`).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsGetContext {
    /// 0: user pointer of the response.
    pub response: u64,
}
const _: () = assert!(size_of::<IbUverbsGetContext>() == 8);

/// `struct ib_uverbs_get_context_resp` (8 B) + driver data (`Mlx5IbAllocUcontextResp`).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsGetContextResp {
    /// 0: file descriptor of the async event file.
    pub async_fd: u32,
    /// 4
    pub num_comp_vectors: u32,
}
const _: () = assert!(size_of::<IbUverbsGetContextResp>() == 8);

/// `struct ib_uverbs_query_device` (8 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsQueryDevice {
    /// 0: user pointer of the response.
    pub response: u64,
}
const _: () = assert!(size_of::<IbUverbsQueryDevice>() == 8);

/// `struct ib_uverbs_query_device_resp` (176 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsQueryDeviceResp {
    /// 0: firmware version (major << 32 | minor << 16 | subminor).
    pub fw_ver: u64,
    /// 8: big-endian node GUID (network-order bytes in a `u64`).
    pub node_guid: u64,
    /// 16: big-endian system image GUID.
    pub sys_image_guid: u64,
    /// 24
    pub max_mr_size: u64,
    /// 32
    pub page_size_cap: u64,
    /// 40
    pub vendor_id: u32,
    /// 44
    pub vendor_part_id: u32,
    /// 48
    pub hw_ver: u32,
    /// 52
    pub max_qp: u32,
    /// 56
    pub max_qp_wr: u32,
    /// 60: low 32 bits of the device cap flags.
    pub device_cap_flags: u32,
    /// 64
    pub max_sge: u32,
    /// 68
    pub max_sge_rd: u32,
    /// 72
    pub max_cq: u32,
    /// 76
    pub max_cqe: u32,
    /// 80
    pub max_mr: u32,
    /// 84
    pub max_pd: u32,
    /// 88
    pub max_qp_rd_atom: u32,
    /// 92
    pub max_ee_rd_atom: u32,
    /// 96
    pub max_res_rd_atom: u32,
    /// 100
    pub max_qp_init_rd_atom: u32,
    /// 104
    pub max_ee_init_rd_atom: u32,
    /// 108: 0 none, 1 HCA, 2 global.
    pub atomic_cap: u32,
    /// 112
    pub max_ee: u32,
    /// 116
    pub max_rdd: u32,
    /// 120
    pub max_mw: u32,
    /// 124
    pub max_raw_ipv6_qp: u32,
    /// 128
    pub max_raw_ethy_qp: u32,
    /// 132
    pub max_mcast_grp: u32,
    /// 136
    pub max_mcast_qp_attach: u32,
    /// 140
    pub max_total_mcast_qp_attach: u32,
    /// 144
    pub max_ah: u32,
    /// 148
    pub max_fmr: u32,
    /// 152
    pub max_map_per_fmr: u32,
    /// 156
    pub max_srq: u32,
    /// 160
    pub max_srq_wr: u32,
    /// 164
    pub max_srq_sge: u32,
    /// 168
    pub max_pkeys: u16,
    /// 170
    pub local_ca_ack_delay: u8,
    /// 171
    pub phys_port_cnt: u8,
    /// 172
    pub reserved: [u8; 4],
}
const _: () = assert!(size_of::<IbUverbsQueryDeviceResp>() == 176);

/// `struct ib_uverbs_ex_query_device` (8 B): core request of the extended query device.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsExQueryDevice {
    /// 0: must be 0.
    pub comp_mask: u32,
    /// 4: must be 0.
    pub reserved: u32,
}
const _: () = assert!(size_of::<IbUverbsExQueryDevice>() == 8);

/// The anonymous `per_transport_caps` struct inside `ib_uverbs_odp_caps` (12 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsOdpPerTransportCaps {
    /// 0
    pub rc_odp_caps: u32,
    /// 4
    pub uc_odp_caps: u32,
    /// 8
    pub ud_odp_caps: u32,
}
const _: () = assert!(size_of::<IbUverbsOdpPerTransportCaps>() == 12);

/// `struct ib_uverbs_odp_caps` (24 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsOdpCaps {
    /// 0
    pub general_caps: u64,
    /// 8
    pub per_transport_caps: IbUverbsOdpPerTransportCaps,
    /// 20
    pub reserved: u32,
}
const _: () = assert!(size_of::<IbUverbsOdpCaps>() == 24);

/// `struct ib_uverbs_rss_caps` (16 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsRssCaps {
    /// 0: bit `1 << qp_type` per supported QP type.
    pub supported_qpts: u32,
    /// 4
    pub max_rwq_indirection_tables: u32,
    /// 8
    pub max_rwq_indirection_table_size: u32,
    /// 12
    pub reserved: u32,
}
const _: () = assert!(size_of::<IbUverbsRssCaps>() == 16);

/// `struct ib_uverbs_tm_caps` (24 B): tag-matching caps.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsTmCaps {
    /// 0
    pub max_rndv_hdr_size: u32,
    /// 4
    pub max_num_tags: u32,
    /// 8
    pub flags: u32,
    /// 12
    pub max_ops: u32,
    /// 16
    pub max_sge: u32,
    /// 20
    pub reserved: u32,
}
const _: () = assert!(size_of::<IbUverbsTmCaps>() == 24);

/// `struct ib_uverbs_ex_query_device_resp` (304 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsExQueryDeviceResp {
    /// 0
    pub base: IbUverbsQueryDeviceResp,
    /// 176
    pub comp_mask: u32,
    /// 180: bytes of this struct the kernel filled.
    pub response_length: u32,
    /// 184
    pub odp_caps: IbUverbsOdpCaps,
    /// 208
    pub timestamp_mask: u64,
    /// 216: in kHz.
    pub hca_core_clock: u64,
    /// 224
    pub device_cap_flags_ex: u64,
    /// 232
    pub rss_caps: IbUverbsRssCaps,
    /// 248
    pub max_wq_type_rq: u32,
    /// 252
    pub raw_packet_caps: u32,
    /// 256
    pub tm_caps: IbUverbsTmCaps,
    /// 280
    pub cq_moderation_caps: IbUverbsCqModerationCaps,
    /// 288
    pub max_dm_size: u64,
    /// 296
    pub xrc_odp_caps: u32,
    /// 300
    pub reserved: u32,
}
const _: () = assert!(size_of::<IbUverbsExQueryDeviceResp>() == 304);

/// `struct ib_uverbs_query_port` (16 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsQueryPort {
    /// 0: user pointer of the response.
    pub response: u64,
    /// 8: 1-based port number.
    pub port_num: u8,
    /// 9
    pub reserved: [u8; 7],
}
const _: () = assert!(size_of::<IbUverbsQueryPort>() == 16);

/// `struct ib_uverbs_query_port_resp` (40 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsQueryPortResp {
    /// 0: `IB_UVERBS_PCF_*`.
    pub port_cap_flags: u32,
    /// 4
    pub max_msg_sz: u32,
    /// 8
    pub bad_pkey_cntr: u32,
    /// 12
    pub qkey_viol_cntr: u32,
    /// 16
    pub gid_tbl_len: u32,
    /// 20
    pub pkey_tbl_len: u16,
    /// 22
    pub lid: u16,
    /// 24
    pub sm_lid: u16,
    /// 26: `IB_PORT_*`.
    pub state: u8,
    /// 27: `IB_MTU_*`.
    pub max_mtu: u8,
    /// 28: `IB_MTU_*`.
    pub active_mtu: u8,
    /// 29
    pub lmc: u8,
    /// 30
    pub max_vl_num: u8,
    /// 31
    pub sm_sl: u8,
    /// 32
    pub subnet_timeout: u8,
    /// 33
    pub init_type_reply: u8,
    /// 34
    pub active_width: u8,
    /// 35
    pub active_speed: u8,
    /// 36
    pub phys_state: u8,
    /// 37: `IB_LINK_LAYER_*`.
    pub link_layer: u8,
    /// 38: `IB_UVERBS_QPF_*`.
    pub flags: u8,
    /// 39
    pub reserved: u8,
}
const _: () = assert!(size_of::<IbUverbsQueryPortResp>() == 40);

// ------------------------------------------------------------------------------------------
// PD, MR, completion channel.

/// `struct ib_uverbs_alloc_pd` (8 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsAllocPd {
    /// 0: user pointer of the response.
    pub response: u64,
}
const _: () = assert!(size_of::<IbUverbsAllocPd>() == 8);

/// `struct ib_uverbs_alloc_pd_resp` (4 B) + driver data (`Mlx5IbAllocPdResp`).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsAllocPdResp {
    /// 0
    pub pd_handle: u32,
}
const _: () = assert!(size_of::<IbUverbsAllocPdResp>() == 4);

/// `struct ib_uverbs_dealloc_pd` (4 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsDeallocPd {
    /// 0
    pub pd_handle: u32,
}
const _: () = assert!(size_of::<IbUverbsDeallocPd>() == 4);

/// `struct ib_uverbs_reg_mr` (40 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsRegMr {
    /// 0: user pointer of the response.
    pub response: u64,
    /// 8: start address of the region in the process.
    pub start: u64,
    /// 16
    pub length: u64,
    /// 24: I/O virtual address the HCA will use (normally = start).
    pub hca_va: u64,
    /// 32
    pub pd_handle: u32,
    /// 36: `IB_UVERBS_ACCESS_*`.
    pub access_flags: u32,
}
const _: () = assert!(size_of::<IbUverbsRegMr>() == 40);

/// `struct ib_uverbs_reg_mr_resp` (12 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsRegMrResp {
    /// 0
    pub mr_handle: u32,
    /// 4
    pub lkey: u32,
    /// 8
    pub rkey: u32,
}
const _: () = assert!(size_of::<IbUverbsRegMrResp>() == 12);

/// `struct ib_uverbs_dereg_mr` (4 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsDeregMr {
    /// 0
    pub mr_handle: u32,
}
const _: () = assert!(size_of::<IbUverbsDeregMr>() == 4);

/// `struct ib_uverbs_create_comp_channel` (8 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsCreateCompChannel {
    /// 0: user pointer of the response.
    pub response: u64,
}
const _: () = assert!(size_of::<IbUverbsCreateCompChannel>() == 8);

/// `struct ib_uverbs_create_comp_channel_resp` (4 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsCreateCompChannelResp {
    /// 0: the new channel's file descriptor.
    pub fd: u32,
}
const _: () = assert!(size_of::<IbUverbsCreateCompChannelResp>() == 4);

// ------------------------------------------------------------------------------------------
// CQ.

/// `struct ib_uverbs_create_cq` (32 B) + driver data (`Mlx5IbCreateCq`).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsCreateCq {
    /// 0: user pointer of the response.
    pub response: u64,
    /// 8: returned in completion events.
    pub user_handle: u64,
    /// 16: requested number of CQEs.
    pub cqe: u32,
    /// 20
    pub comp_vector: u32,
    /// 24: completion channel fd, or -1.
    pub comp_channel: i32,
    /// 28
    pub reserved: u32,
}
const _: () = assert!(size_of::<IbUverbsCreateCq>() == 32);

/// `struct ib_uverbs_ex_create_cq` (32 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsExCreateCq {
    /// 0
    pub user_handle: u64,
    /// 8
    pub cqe: u32,
    /// 12
    pub comp_vector: u32,
    /// 16: completion channel fd, or -1.
    pub comp_channel: i32,
    /// 20
    pub comp_mask: u32,
    /// 24: `IB_UVERBS_CQ_FLAGS_*`.
    pub flags: u32,
    /// 28
    pub reserved: u32,
}
const _: () = assert!(size_of::<IbUverbsExCreateCq>() == 32);

/// `struct ib_uverbs_create_cq_resp` (8 B) + driver data (`Mlx5IbCreateCqResp`).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsCreateCqResp {
    /// 0
    pub cq_handle: u32,
    /// 4: actual number of CQEs.
    pub cqe: u32,
}
const _: () = assert!(size_of::<IbUverbsCreateCqResp>() == 8);

/// `struct ib_uverbs_ex_create_cq_resp` (16 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsExCreateCqResp {
    /// 0
    pub base: IbUverbsCreateCqResp,
    /// 8
    pub comp_mask: u32,
    /// 12
    pub response_length: u32,
}
const _: () = assert!(size_of::<IbUverbsExCreateCqResp>() == 16);

/// `struct ib_uverbs_destroy_cq` (16 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsDestroyCq {
    /// 0: user pointer of the response.
    pub response: u64,
    /// 8
    pub cq_handle: u32,
    /// 12
    pub reserved: u32,
}
const _: () = assert!(size_of::<IbUverbsDestroyCq>() == 16);

/// `struct ib_uverbs_destroy_cq_resp` (8 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsDestroyCqResp {
    /// 0: completion events delivered for this CQ (the app's ack count must reach it).
    pub comp_events_reported: u32,
    /// 4
    pub async_events_reported: u32,
}
const _: () = assert!(size_of::<IbUverbsDestroyCqResp>() == 8);

// ------------------------------------------------------------------------------------------
// Address vectors.

/// `struct ib_uverbs_global_route` (24 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsGlobalRoute {
    /// 0: destination GID, network order.
    pub dgid: [u8; 16],
    /// 16
    pub flow_label: u32,
    /// 20
    pub sgid_index: u8,
    /// 21
    pub hop_limit: u8,
    /// 22
    pub traffic_class: u8,
    /// 23
    pub reserved: u8,
}
const _: () = assert!(size_of::<IbUverbsGlobalRoute>() == 24);

/// `struct ib_uverbs_ah_attr` (32 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsAhAttr {
    /// 0
    pub grh: IbUverbsGlobalRoute,
    /// 24
    pub dlid: u16,
    /// 26
    pub sl: u8,
    /// 27
    pub src_path_bits: u8,
    /// 28
    pub static_rate: u8,
    /// 29
    pub is_global: u8,
    /// 30
    pub port_num: u8,
    /// 31
    pub reserved: u8,
}
const _: () = assert!(size_of::<IbUverbsAhAttr>() == 32);

/// `struct ib_uverbs_create_ah` (56 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsCreateAh {
    /// 0: user pointer of the response.
    pub response: u64,
    /// 8
    pub user_handle: u64,
    /// 16
    pub pd_handle: u32,
    /// 20
    pub reserved: u32,
    /// 24
    pub attr: IbUverbsAhAttr,
}
const _: () = assert!(size_of::<IbUverbsCreateAh>() == 56);

/// `struct ib_uverbs_create_ah_resp` (4 B) + driver data (`Mlx5IbCreateAhResp`).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsCreateAhResp {
    /// 0
    pub ah_handle: u32,
}
const _: () = assert!(size_of::<IbUverbsCreateAhResp>() == 4);

/// `struct ib_uverbs_destroy_ah` (4 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsDestroyAh {
    /// 0
    pub ah_handle: u32,
}
const _: () = assert!(size_of::<IbUverbsDestroyAh>() == 4);

// ------------------------------------------------------------------------------------------
// QP.

/// `struct ib_uverbs_create_qp` (56 B) + driver data (`Mlx5IbCreateQp`).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsCreateQp {
    /// 0: user pointer of the response.
    pub response: u64,
    /// 8: returned in async events.
    pub user_handle: u64,
    /// 16
    pub pd_handle: u32,
    /// 20
    pub send_cq_handle: u32,
    /// 24
    pub recv_cq_handle: u32,
    /// 28: valid when `is_srq` != 0.
    pub srq_handle: u32,
    /// 32
    pub max_send_wr: u32,
    /// 36
    pub max_recv_wr: u32,
    /// 40
    pub max_send_sge: u32,
    /// 44
    pub max_recv_sge: u32,
    /// 48
    pub max_inline_data: u32,
    /// 52
    pub sq_sig_all: u8,
    /// 53: `IB_UVERBS_QPT_*`.
    pub qp_type: u8,
    /// 54
    pub is_srq: u8,
    /// 55
    pub reserved: u8,
}
const _: () = assert!(size_of::<IbUverbsCreateQp>() == 56);

/// `struct ib_uverbs_ex_create_qp` (64 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsExCreateQp {
    /// 0
    pub user_handle: u64,
    /// 8
    pub pd_handle: u32,
    /// 12
    pub send_cq_handle: u32,
    /// 16
    pub recv_cq_handle: u32,
    /// 20
    pub srq_handle: u32,
    /// 24
    pub max_send_wr: u32,
    /// 28
    pub max_recv_wr: u32,
    /// 32
    pub max_send_sge: u32,
    /// 36
    pub max_recv_sge: u32,
    /// 40
    pub max_inline_data: u32,
    /// 44
    pub sq_sig_all: u8,
    /// 45
    pub qp_type: u8,
    /// 46
    pub is_srq: u8,
    /// 47
    pub reserved: u8,
    /// 48: `IB_UVERBS_CREATE_QP_MASK_*`.
    pub comp_mask: u32,
    /// 52: `IB_UVERBS_QP_CREATE_*`.
    pub create_flags: u32,
    /// 56
    pub rwq_ind_tbl_handle: u32,
    /// 60
    pub source_qpn: u32,
}
const _: () = assert!(size_of::<IbUverbsExCreateQp>() == 64);

/// `struct ib_uverbs_create_qp_resp` (32 B) + driver data (`Mlx5IbCreateQpResp`).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsCreateQpResp {
    /// 0
    pub qp_handle: u32,
    /// 4
    pub qpn: u32,
    /// 8
    pub max_send_wr: u32,
    /// 12
    pub max_recv_wr: u32,
    /// 16
    pub max_send_sge: u32,
    /// 20
    pub max_recv_sge: u32,
    /// 24
    pub max_inline_data: u32,
    /// 28
    pub reserved: u32,
}
const _: () = assert!(size_of::<IbUverbsCreateQpResp>() == 32);

/// `struct ib_uverbs_ex_create_qp_resp` (40 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsExCreateQpResp {
    /// 0
    pub base: IbUverbsCreateQpResp,
    /// 32
    pub comp_mask: u32,
    /// 36
    pub response_length: u32,
}
const _: () = assert!(size_of::<IbUverbsExCreateQpResp>() == 40);

/// `struct ib_uverbs_qp_dest` (32 B): an address vector inside modify/query QP.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsQpDest {
    /// 0: destination GID, network order.
    pub dgid: [u8; 16],
    /// 16
    pub flow_label: u32,
    /// 20
    pub dlid: u16,
    /// 22
    pub reserved: u16,
    /// 24
    pub sgid_index: u8,
    /// 25
    pub hop_limit: u8,
    /// 26
    pub traffic_class: u8,
    /// 27
    pub sl: u8,
    /// 28
    pub src_path_bits: u8,
    /// 29
    pub static_rate: u8,
    /// 30
    pub is_global: u8,
    /// 31
    pub port_num: u8,
}
const _: () = assert!(size_of::<IbUverbsQpDest>() == 32);

/// `struct ib_uverbs_query_qp` (16 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsQueryQp {
    /// 0: user pointer of the response.
    pub response: u64,
    /// 8
    pub qp_handle: u32,
    /// 12: `IB_QP_*` mask.
    pub attr_mask: u32,
}
const _: () = assert!(size_of::<IbUverbsQueryQp>() == 16);

/// `struct ib_uverbs_query_qp_resp` (128 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsQueryQpResp {
    /// 0
    pub dest: IbUverbsQpDest,
    /// 32
    pub alt_dest: IbUverbsQpDest,
    /// 64
    pub max_send_wr: u32,
    /// 68
    pub max_recv_wr: u32,
    /// 72
    pub max_send_sge: u32,
    /// 76
    pub max_recv_sge: u32,
    /// 80
    pub max_inline_data: u32,
    /// 84
    pub qkey: u32,
    /// 88
    pub rq_psn: u32,
    /// 92
    pub sq_psn: u32,
    /// 96
    pub dest_qp_num: u32,
    /// 100
    pub qp_access_flags: u32,
    /// 104
    pub pkey_index: u16,
    /// 106
    pub alt_pkey_index: u16,
    /// 108
    pub qp_state: u8,
    /// 109
    pub cur_qp_state: u8,
    /// 110
    pub path_mtu: u8,
    /// 111
    pub path_mig_state: u8,
    /// 112
    pub sq_draining: u8,
    /// 113
    pub max_rd_atomic: u8,
    /// 114
    pub max_dest_rd_atomic: u8,
    /// 115
    pub min_rnr_timer: u8,
    /// 116
    pub port_num: u8,
    /// 117
    pub timeout: u8,
    /// 118
    pub retry_cnt: u8,
    /// 119
    pub rnr_retry: u8,
    /// 120
    pub alt_port_num: u8,
    /// 121
    pub alt_timeout: u8,
    /// 122
    pub sq_sig_all: u8,
    /// 123
    pub reserved: [u8; 5],
}
const _: () = assert!(size_of::<IbUverbsQueryQpResp>() == 128);

/// `struct ib_uverbs_modify_qp` (112 B). No response; no `response` pointer.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsModifyQp {
    /// 0
    pub dest: IbUverbsQpDest,
    /// 32
    pub alt_dest: IbUverbsQpDest,
    /// 64
    pub qp_handle: u32,
    /// 68: `IB_QP_*` mask of the valid fields.
    pub attr_mask: u32,
    /// 72
    pub qkey: u32,
    /// 76
    pub rq_psn: u32,
    /// 80
    pub sq_psn: u32,
    /// 84
    pub dest_qp_num: u32,
    /// 88
    pub qp_access_flags: u32,
    /// 92
    pub pkey_index: u16,
    /// 94
    pub alt_pkey_index: u16,
    /// 96: `IB_QPS_*`.
    pub qp_state: u8,
    /// 97
    pub cur_qp_state: u8,
    /// 98: `IB_MTU_*`.
    pub path_mtu: u8,
    /// 99
    pub path_mig_state: u8,
    /// 100
    pub en_sqd_async_notify: u8,
    /// 101
    pub max_rd_atomic: u8,
    /// 102
    pub max_dest_rd_atomic: u8,
    /// 103
    pub min_rnr_timer: u8,
    /// 104
    pub port_num: u8,
    /// 105
    pub timeout: u8,
    /// 106
    pub retry_cnt: u8,
    /// 107
    pub rnr_retry: u8,
    /// 108
    pub alt_port_num: u8,
    /// 109
    pub alt_timeout: u8,
    /// 110
    pub reserved: [u8; 2],
}
const _: () = assert!(size_of::<IbUverbsModifyQp>() == 112);

/// `struct ib_uverbs_ex_modify_qp` (120 B) + driver data (`Mlx5IbModifyQp`).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsExModifyQp {
    /// 0
    pub base: IbUverbsModifyQp,
    /// 112
    pub rate_limit: u32,
    /// 116
    pub reserved: u32,
}
const _: () = assert!(size_of::<IbUverbsExModifyQp>() == 120);

/// `struct ib_uverbs_ex_modify_qp_resp` (8 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsExModifyQpResp {
    /// 0
    pub comp_mask: u32,
    /// 4
    pub response_length: u32,
}
const _: () = assert!(size_of::<IbUverbsExModifyQpResp>() == 8);

/// `struct ib_uverbs_destroy_qp` (16 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsDestroyQp {
    /// 0: user pointer of the response.
    pub response: u64,
    /// 8
    pub qp_handle: u32,
    /// 12
    pub reserved: u32,
}
const _: () = assert!(size_of::<IbUverbsDestroyQp>() == 16);

/// `struct ib_uverbs_destroy_qp_resp` (4 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsDestroyQpResp {
    /// 0: async events delivered for this QP.
    pub events_reported: u32,
}
const _: () = assert!(size_of::<IbUverbsDestroyQpResp>() == 4);

// ------------------------------------------------------------------------------------------
// SRQ.

/// `struct ib_uverbs_create_srq` (32 B) + driver data (`Mlx5IbCreateSrq`).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsCreateSrq {
    /// 0: user pointer of the response.
    pub response: u64,
    /// 8
    pub user_handle: u64,
    /// 16
    pub pd_handle: u32,
    /// 20
    pub max_wr: u32,
    /// 24
    pub max_sge: u32,
    /// 28
    pub srq_limit: u32,
}
const _: () = assert!(size_of::<IbUverbsCreateSrq>() == 32);

/// `struct ib_uverbs_create_xsrq` (48 B) + driver data (`Mlx5IbCreateSrq`).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsCreateXsrq {
    /// 0: user pointer of the response.
    pub response: u64,
    /// 8
    pub user_handle: u64,
    /// 16: `IB_UVERBS_SRQT_*`.
    pub srq_type: u32,
    /// 20
    pub pd_handle: u32,
    /// 24
    pub max_wr: u32,
    /// 28
    pub max_sge: u32,
    /// 32
    pub srq_limit: u32,
    /// 36
    pub max_num_tags: u32,
    /// 40
    pub xrcd_handle: u32,
    /// 44
    pub cq_handle: u32,
}
const _: () = assert!(size_of::<IbUverbsCreateXsrq>() == 48);

/// `struct ib_uverbs_create_srq_resp` (16 B) + driver data (`Mlx5IbCreateSrqResp`).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsCreateSrqResp {
    /// 0
    pub srq_handle: u32,
    /// 4
    pub max_wr: u32,
    /// 8
    pub max_sge: u32,
    /// 12: SRQ number (XRC SRQs).
    pub srqn: u32,
}
const _: () = assert!(size_of::<IbUverbsCreateSrqResp>() == 16);

/// `struct ib_uverbs_modify_srq` (16 B). No response.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsModifySrq {
    /// 0
    pub srq_handle: u32,
    /// 4: `IB_SRQ_MAX_WR | IB_SRQ_LIMIT`.
    pub attr_mask: u32,
    /// 8
    pub max_wr: u32,
    /// 12
    pub srq_limit: u32,
}
const _: () = assert!(size_of::<IbUverbsModifySrq>() == 16);

/// `struct ib_uverbs_query_srq` (16 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsQuerySrq {
    /// 0: user pointer of the response.
    pub response: u64,
    /// 8
    pub srq_handle: u32,
    /// 12
    pub reserved: u32,
}
const _: () = assert!(size_of::<IbUverbsQuerySrq>() == 16);

/// `struct ib_uverbs_query_srq_resp` (16 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsQuerySrqResp {
    /// 0
    pub max_wr: u32,
    /// 4
    pub max_sge: u32,
    /// 8
    pub srq_limit: u32,
    /// 12
    pub reserved: u32,
}
const _: () = assert!(size_of::<IbUverbsQuerySrqResp>() == 16);

/// `struct ib_uverbs_destroy_srq` (16 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsDestroySrq {
    /// 0: user pointer of the response.
    pub response: u64,
    /// 8
    pub srq_handle: u32,
    /// 12
    pub reserved: u32,
}
const _: () = assert!(size_of::<IbUverbsDestroySrq>() == 16);

/// `struct ib_uverbs_destroy_srq_resp` (4 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsDestroySrqResp {
    /// 0
    pub events_reported: u32,
}
const _: () = assert!(size_of::<IbUverbsDestroySrqResp>() == 4);

// ---- the same values in the widths of the wire fields (for `match` on struct fields) -----
//
// Each is defined from the header-named constant above and is itself in the header check.

/// `enum ib_qp_state` as the `u8` of `qp_state` / `cur_qp_state`.
pub mod qp_state {
    use super::*;
    /// RESET
    pub const RESET: u8 = IB_QPS_RESET as u8;
    /// INIT
    pub const INIT: u8 = IB_QPS_INIT as u8;
    /// RTR
    pub const RTR: u8 = IB_QPS_RTR as u8;
    /// RTS
    pub const RTS: u8 = IB_QPS_RTS as u8;
    /// SQD
    pub const SQD: u8 = IB_QPS_SQD as u8;
    /// SQE
    pub const SQE: u8 = IB_QPS_SQE as u8;
    /// ERR
    pub const ERR: u8 = IB_QPS_ERR as u8;
}

/// QP types as the `u8` of `ib_uverbs_create_qp::qp_type`.
pub mod qp_type {
    use crate::ioctl::*;
    /// Reliable connected.
    pub const RC: u8 = IB_UVERBS_QPT_RC as u8;
    /// Unreliable connected.
    pub const UC: u8 = IB_UVERBS_QPT_UC as u8;
    /// Unreliable datagram.
    pub const UD: u8 = IB_UVERBS_QPT_UD as u8;
    /// Raw packet.
    pub const RAW_PACKET: u8 = IB_UVERBS_QPT_RAW_PACKET as u8;
    /// XRC initiator.
    pub const XRC_INI: u8 = IB_UVERBS_QPT_XRC_INI as u8;
    /// XRC target.
    pub const XRC_TGT: u8 = IB_UVERBS_QPT_XRC_TGT as u8;
    /// Driver specific (mlx5 DC).
    pub const DRIVER: u8 = IB_UVERBS_QPT_DRIVER as u8;
}

/// Memory access flags (`IB_UVERBS_ACCESS_*`, `u32` as in REG_MR and MODIFY_QP).
pub mod access {
    use crate::ioctl::*;
    /// Local write.
    pub const LOCAL_WRITE: u32 = IB_UVERBS_ACCESS_LOCAL_WRITE;
    /// Remote write.
    pub const REMOTE_WRITE: u32 = IB_UVERBS_ACCESS_REMOTE_WRITE;
    /// Remote read.
    pub const REMOTE_READ: u32 = IB_UVERBS_ACCESS_REMOTE_READ;
    /// Remote atomic.
    pub const REMOTE_ATOMIC: u32 = IB_UVERBS_ACCESS_REMOTE_ATOMIC;
    /// Memory-window bind.
    pub const MW_BIND: u32 = IB_UVERBS_ACCESS_MW_BIND;
    /// Zero-based virtual addresses.
    pub const ZERO_BASED: u32 = IB_UVERBS_ACCESS_ZERO_BASED;
    /// On-demand paging.
    pub const ON_DEMAND: u32 = IB_UVERBS_ACCESS_ON_DEMAND;
    /// Huge-page hint.
    pub const HUGETLB: u32 = IB_UVERBS_ACCESS_HUGETLB;
    /// Relaxed ordering (optional flag).
    pub const RELAXED_ORDERING: u32 = IB_UVERBS_ACCESS_RELAXED_ORDERING;
}

/// Async event types (`ib_uverbs_async_event_desc::event_type`).
pub mod event {
    use super::*;
    /// CQ error (overrun).
    pub const CQ_ERR: u32 = IB_EVENT_CQ_ERR;
    /// QP fatal (local work queue catastrophic error).
    pub const QP_FATAL: u32 = IB_EVENT_QP_FATAL;
    /// Invalid request local work queue error.
    pub const QP_REQ_ERR: u32 = IB_EVENT_QP_REQ_ERR;
    /// Local access violation work queue error.
    pub const QP_ACCESS_ERR: u32 = IB_EVENT_QP_ACCESS_ERR;
    /// Communication established.
    pub const COMM_EST: u32 = IB_EVENT_COMM_EST;
    /// Send queue drained (SQD reached with notification asked).
    pub const SQ_DRAINED: u32 = IB_EVENT_SQ_DRAINED;
    /// SRQ limit reached.
    pub const SRQ_LIMIT_REACHED: u32 = IB_EVENT_SRQ_LIMIT_REACHED;
    /// Last WQE reached (QP with SRQ in error).
    pub const QP_LAST_WQE_REACHED: u32 = IB_EVENT_QP_LAST_WQE_REACHED;
}

/// `enum ib_qp_attr_mask` bits (MODIFY_QP `attr_mask`).
pub mod qp_attr {
    use super::*;
    /// qp_state
    pub const STATE: u32 = IB_QP_STATE;
    /// cur_qp_state
    pub const CUR_STATE: u32 = IB_QP_CUR_STATE;
    /// en_sqd_async_notify
    pub const EN_SQD_ASYNC_NOTIFY: u32 = IB_QP_EN_SQD_ASYNC_NOTIFY;
    /// qp_access_flags
    pub const ACCESS_FLAGS: u32 = IB_QP_ACCESS_FLAGS;
    /// pkey_index
    pub const PKEY_INDEX: u32 = IB_QP_PKEY_INDEX;
    /// port_num
    pub const PORT: u32 = IB_QP_PORT;
    /// qkey
    pub const QKEY: u32 = IB_QP_QKEY;
    /// dest (address vector)
    pub const AV: u32 = IB_QP_AV;
    /// path_mtu
    pub const PATH_MTU: u32 = IB_QP_PATH_MTU;
    /// timeout
    pub const TIMEOUT: u32 = IB_QP_TIMEOUT;
    /// retry_cnt
    pub const RETRY_CNT: u32 = IB_QP_RETRY_CNT;
    /// rnr_retry
    pub const RNR_RETRY: u32 = IB_QP_RNR_RETRY;
    /// rq_psn
    pub const RQ_PSN: u32 = IB_QP_RQ_PSN;
    /// max_rd_atomic
    pub const MAX_QP_RD_ATOMIC: u32 = IB_QP_MAX_QP_RD_ATOMIC;
    /// alt_dest
    pub const ALT_PATH: u32 = IB_QP_ALT_PATH;
    /// min_rnr_timer
    pub const MIN_RNR_TIMER: u32 = IB_QP_MIN_RNR_TIMER;
    /// sq_psn
    pub const SQ_PSN: u32 = IB_QP_SQ_PSN;
    /// max_dest_rd_atomic
    pub const MAX_DEST_RD_ATOMIC: u32 = IB_QP_MAX_DEST_RD_ATOMIC;
    /// path_mig_state
    pub const PATH_MIG_STATE: u32 = IB_QP_PATH_MIG_STATE;
    /// cap
    pub const CAP: u32 = IB_QP_CAP;
    /// dest_qp_num
    pub const DEST_QPN: u32 = IB_QP_DEST_QPN;
    /// All the bits MODIFY_QP knows (`IB_QP_DEST_QPN` and below).
    pub const KNOWN: u32 = (IB_QP_DEST_QPN << 1) - 1;
}

/// `enum ib_mtu` as the `u8` of `path_mtu` / `max_mtu` / `active_mtu`.
pub mod mtu {
    use super::*;
    /// 256 bytes
    pub const MTU_256: u8 = IB_MTU_256 as u8;
    /// 512 bytes
    pub const MTU_512: u8 = IB_MTU_512 as u8;
    /// 1024 bytes
    pub const MTU_1024: u8 = IB_MTU_1024 as u8;
    /// 2048 bytes
    pub const MTU_2048: u8 = IB_MTU_2048 as u8;
    /// 4096 bytes
    pub const MTU_4096: u8 = IB_MTU_4096 as u8;
}

/// `enum ib_port_state` as the `u8` of `ib_uverbs_query_port_resp::state`.
pub mod port_state {
    use super::*;
    /// DOWN
    pub const DOWN: u8 = IB_PORT_DOWN as u8;
    /// ACTIVE
    pub const ACTIVE: u8 = IB_PORT_ACTIVE as u8;
}

/// `enum ib_mig_state` as the `u8` of `path_mig_state`.
pub mod mig_state {
    use super::*;
    /// MIGRATED
    pub const MIGRATED: u8 = IB_MIG_MIGRATED as u8;
    /// REARM
    pub const REARM: u8 = IB_MIG_REARM as u8;
    /// ARMED
    pub const ARMED: u8 = IB_MIG_ARMED as u8;
}
