//! Mirrors of `<rdma/mlx5-abi.h>`, `<rdma/mlx5_user_ioctl_cmds.h>` and
//! `<rdma/mlx5_user_ioctl_verbs.h>`: the mlx5 driver data ("UHW") carried after the core
//! uverbs structs, the mlx5 ioctl objects, and the mmap offset encoding of the uverbs fd.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::ioctl::UVERBS_UDATA_DRIVER_DATA_FLAG;

/// Provider ABI version (`/sys/class/infiniband_verbs/uverbsN/abi_version`).
pub const MLX5_IB_UVERBS_ABI_VERSION: u32 = 1;

// ---- flags ------------------------------------------------------------------------------

/// `Mlx5IbCreateQp::flags`: WQE signature.
pub const MLX5_QP_FLAG_SIGNATURE: u32 = 1 << 0;
/// `Mlx5IbCreateQp::flags`: scatter receive payload into the CQE.
pub const MLX5_QP_FLAG_SCATTER_CQE: u32 = 1 << 1;
/// `Mlx5IbCreateQp::flags`: tunnel offloads (RSS QPs).
pub const MLX5_QP_FLAG_TUNNEL_OFFLOADS: u32 = 1 << 2;
/// `Mlx5IbCreateQp::flags`: `bfreg_index` is a legacy bfreg index chosen by user space.
pub const MLX5_QP_FLAG_BFREG_INDEX: u32 = 1 << 3;
/// `Mlx5IbCreateQp::flags`: DC target.
pub const MLX5_QP_FLAG_TYPE_DCT: u32 = 1 << 4;
/// `Mlx5IbCreateQp::flags`: DC initiator.
pub const MLX5_QP_FLAG_TYPE_DCI: u32 = 1 << 5;
/// `Mlx5IbCreateQp::flags`: TIR self loopback unicast.
pub const MLX5_QP_FLAG_TIR_ALLOW_SELF_LB_UC: u32 = 1 << 6;
/// `Mlx5IbCreateQp::flags`: TIR self loopback multicast.
pub const MLX5_QP_FLAG_TIR_ALLOW_SELF_LB_MC: u32 = 1 << 7;
/// `Mlx5IbCreateQp::flags`: allow scatter-to-CQE on the requester.
pub const MLX5_QP_FLAG_ALLOW_SCATTER_CQE: u32 = 1 << 8;
/// `Mlx5IbCreateQp::flags`: packet based credit mode.
pub const MLX5_QP_FLAG_PACKET_BASED_CREDIT_MODE: u32 = 1 << 9;
/// `Mlx5IbCreateQp::flags`: `bfreg_index` is a UAR page id (dynamic UARs).
pub const MLX5_QP_FLAG_UAR_PAGE_INDEX: u32 = 1 << 10;
/// `Mlx5IbCreateQp::flags`: DCI streams.
pub const MLX5_QP_FLAG_DCI_STREAM: u32 = 1 << 11;

/// `Mlx5IbCreateSrq::flags`: WQE signature.
pub const MLX5_SRQ_FLAG_SIGNATURE: u32 = 1 << 0;
/// Work queue flag: WQE signature.
pub const MLX5_WQ_FLAG_SIGNATURE: u32 = 1 << 0;

/// `Mlx5IbAllocUcontextReqV2::lib_caps`: the library understands 4 KiB UARs.
pub const MLX5_LIB_CAP_4K_UAR: u64 = 1 << 0;
/// `Mlx5IbAllocUcontextReqV2::lib_caps`: the library allocates UARs dynamically.
pub const MLX5_LIB_CAP_DYN_UAR: u64 = 1 << 1;

/// `Mlx5IbAllocUcontextReqV2::flags`: open a DEVX-capable context.
pub const MLX5_IB_ALLOC_UCTX_DEVX: u32 = 1 << 0;

/// `Mlx5IbAllocUcontextResp::comp_mask`: `hca_core_clock_offset` is valid.
pub const MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_CORE_CLOCK_OFFSET: u32 = 1 << 0;
/// `Mlx5IbAllocUcontextResp::comp_mask`: `dump_fill_mkey` is valid.
pub const MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_DUMP_FILL_MKEY: u32 = 1 << 1;
/// `Mlx5IbAllocUcontextResp::comp_mask`: ECE supported.
pub const MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_ECE: u32 = 1 << 2;
/// `Mlx5IbAllocUcontextResp::comp_mask`: SQD to RTS supported.
pub const MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_SQD2RTS: u32 = 1 << 3;
/// `Mlx5IbAllocUcontextResp::comp_mask`: real-time timestamps.
pub const MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_REAL_TIME_TS: u32 = 1 << 4;
/// `Mlx5IbAllocUcontextResp::comp_mask`: mkey update tag.
pub const MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_MKEY_UPDATE_TAG: u32 = 1 << 5;

/// `Mlx5IbAllocUcontextResp::cmds_supp_uhw`: query device takes driver data.
pub const MLX5_USER_CMDS_SUPP_UHW_QUERY_DEVICE: u8 = 1 << 0;
/// `Mlx5IbAllocUcontextResp::cmds_supp_uhw`: create AH returns driver data.
pub const MLX5_USER_CMDS_SUPP_UHW_CREATE_AH: u8 = 1 << 1;

/// `eth_min_inline - 1`: not applicable.
pub const MLX5_USER_INLINE_MODE_NA: u8 = 0;
/// `eth_min_inline - 1`: no inline needed.
pub const MLX5_USER_INLINE_MODE_NONE: u8 = 1;
/// `eth_min_inline - 1`: L2 headers inline.
pub const MLX5_USER_INLINE_MODE_L2: u8 = 2;
/// `eth_min_inline - 1`: IP headers inline.
pub const MLX5_USER_INLINE_MODE_IP: u8 = 3;
/// `eth_min_inline - 1`: TCP/UDP headers inline.
pub const MLX5_USER_INLINE_MODE_TCP_UDP: u8 = 4;

/// `flow_action_flags`: ESP AES-GCM.
pub const MLX5_USER_ALLOC_UCONTEXT_FLOW_ACTION_FLAGS_ESP_AES_GCM: u16 = 1 << 0;
/// `flow_action_flags`: ESP AES-GCM requires metadata.
pub const MLX5_USER_ALLOC_UCONTEXT_FLOW_ACTION_FLAGS_ESP_AES_GCM_REQ_METADATA: u16 = 1 << 1;
/// `flow_action_flags`: ESP AES-GCM SPI steering.
pub const MLX5_USER_ALLOC_UCONTEXT_FLOW_ACTION_FLAGS_ESP_AES_GCM_SPI_STEERING: u16 = 1 << 2;
/// `flow_action_flags`: ESP AES-GCM full offload.
pub const MLX5_USER_ALLOC_UCONTEXT_FLOW_ACTION_FLAGS_ESP_AES_GCM_FULL_OFFLOAD: u16 = 1 << 3;
/// `flow_action_flags`: ESP AES-GCM TX IV is ESN.
pub const MLX5_USER_ALLOC_UCONTEXT_FLOW_ACTION_FLAGS_ESP_AES_GCM_TX_IV_IS_ESN: u16 = 1 << 4;

/// `Mlx5IbCreateCq::cqe_comp_res_format`: hash.
pub const MLX5_IB_CQE_RES_FORMAT_HASH: u8 = 1 << 0;
/// `Mlx5IbCreateCq::cqe_comp_res_format`: checksum.
pub const MLX5_IB_CQE_RES_FORMAT_CSUM: u8 = 1 << 1;
/// `Mlx5IbCreateCq::cqe_comp_res_format`: checksum + stride index.
pub const MLX5_IB_CQE_RES_FORMAT_CSUM_STRIDX: u8 = 1 << 2;

/// `Mlx5IbQueryDeviceResp::flags`: 128 B CQE compression.
pub const MLX5_IB_QUERY_DEV_RESP_FLAGS_CQE_128B_COMP: u32 = 1 << 0;
/// `Mlx5IbQueryDeviceResp::flags`: 128 B CQE padding.
pub const MLX5_IB_QUERY_DEV_RESP_FLAGS_CQE_128B_PAD: u32 = 1 << 1;
/// `Mlx5IbQueryDeviceResp::flags`: packet based credit mode.
pub const MLX5_IB_QUERY_DEV_RESP_PACKET_BASED_CREDIT_MODE: u32 = 1 << 2;
/// `Mlx5IbQueryDeviceResp::flags`: scatter-to-CQE on DCT.
pub const MLX5_IB_QUERY_DEV_RESP_FLAGS_SCAT2CQE_DCT: u32 = 1 << 3;

/// `Mlx5IbQueryDeviceResp::mlx5_ib_support_multi_pkt_send_wqes`: MPW allowed.
pub const MLX5_IB_ALLOW_MPW: u32 = 1 << 1;
/// `Mlx5IbQueryDeviceResp::mlx5_ib_support_multi_pkt_send_wqes`: enhanced MPW.
pub const MLX5_IB_SUPPORT_EMPW: u32 = 1 << 2;

/// `Mlx5IbCreateCq::flags`: pad 64 B CQEs to 128 B.
pub const MLX5_IB_CREATE_CQ_FLAGS_CQE_128B_PAD: u16 = 1 << 0;
/// `Mlx5IbCreateCq::flags`: `uar_page_index` is valid.
pub const MLX5_IB_CREATE_CQ_FLAGS_UAR_PAGE_INDEX: u16 = 1 << 1;
/// `Mlx5IbCreateCq::flags`: real-time timestamps.
pub const MLX5_IB_CREATE_CQ_FLAGS_REAL_TIME_TS: u16 = 1 << 2;

/// `Mlx5IbCreateQpResp::comp_mask`: `tirn` valid.
pub const MLX5_IB_CREATE_QP_RESP_MASK_TIRN: u32 = 1 << 0;
/// `Mlx5IbCreateQpResp::comp_mask`: `tisn` valid.
pub const MLX5_IB_CREATE_QP_RESP_MASK_TISN: u32 = 1 << 1;
/// `Mlx5IbCreateQpResp::comp_mask`: `rqn` valid.
pub const MLX5_IB_CREATE_QP_RESP_MASK_RQN: u32 = 1 << 2;
/// `Mlx5IbCreateQpResp::comp_mask`: `sqn` valid.
pub const MLX5_IB_CREATE_QP_RESP_MASK_SQN: u32 = 1 << 3;
/// `Mlx5IbCreateQpResp::comp_mask`: `tir_icm_addr` valid.
pub const MLX5_IB_CREATE_QP_RESP_MASK_TIR_ICM_ADDR: u32 = 1 << 4;

// ---- mmap -------------------------------------------------------------------------------

/// mmap command: static UAR page `index` (write-combining if possible).
pub const MLX5_IB_MMAP_REGULAR_PAGE: u32 = 0;
/// mmap command: obsolete.
pub const MLX5_IB_MMAP_GET_CONTIGUOUS_PAGES: u32 = 1;
/// mmap command: static UAR page, write-combining only.
pub const MLX5_IB_MMAP_WC_PAGE: u32 = 2;
/// mmap command: static UAR page, uncached.
pub const MLX5_IB_MMAP_NC_PAGE: u32 = 3;
/// mmap command: the page holding the HCA free-running clock (read-only).
pub const MLX5_IB_MMAP_CORE_CLOCK: u32 = 5;
/// mmap command: legacy dynamic UAR `index` (may exceed 255).
pub const MLX5_IB_MMAP_ALLOC_WC: u32 = 6;
/// mmap command: `Mlx5IbClockInfo` page (index 0 = version 1).
pub const MLX5_IB_MMAP_CLOCK_INFO: u32 = 7;
/// mmap command: device memory.
pub const MLX5_IB_MMAP_DEVICE_MEM: u32 = 8;

/// `Mlx5IbClockInfo::sign` bit: the kernel is updating the page.
pub const MLX5_IB_CLOCK_INFO_KERNEL_UPDATING: u32 = 1;
/// Clock-info mmap index of version 1.
pub const MLX5_IB_CLOCK_INFO_V1: u32 = 0;

/// mmap page offset (in pages, i.e. `offset / page_size`) of command `cmd` and index `index`.
///
/// Bits 7..0 carry `index & 0xff`, bits 15..8 the command, bits 16.. `index >> 8`
/// (only `MLX5_IB_MMAP_ALLOC_WC` uses indices above 255).
pub const fn mmap_offset(cmd: u32, index: u32) -> u64 {
    ((cmd as u64 & 0xff) << 8) | (index as u64 & 0xff) | (((index >> 8) as u64) << 16)
}

/// Decodes a page offset built by [`mmap_offset`] into `(cmd, index)`.
///
/// Returns `None` when the index does not fit in 32 bits (the offset cannot have been
/// produced by `mmap_offset`).
pub const fn decode_mmap_offset(pgoff: u64) -> Option<(u32, u32)> {
    let cmd = ((pgoff >> 8) & 0xff) as u32;
    let high = pgoff >> 16;
    if high > (u32::MAX >> 8) as u64 {
        return None;
    }
    let index = (pgoff & 0xff) as u32 | ((high as u32) << 8);
    Some((cmd, index))
}

// ---- ioctl objects, methods, attributes --------------------------------------------------

/// Driver object: DEVX (firmware command channel).
pub const MLX5_IB_OBJECT_DEVX: u16 = UVERBS_UDATA_DRIVER_DATA_FLAG as u16;
/// Driver object: DEVX object.
pub const MLX5_IB_OBJECT_DEVX_OBJ: u16 = MLX5_IB_OBJECT_DEVX + 1;
/// Driver object: DEVX umem.
pub const MLX5_IB_OBJECT_DEVX_UMEM: u16 = MLX5_IB_OBJECT_DEVX + 2;
/// Driver object: flow matcher.
pub const MLX5_IB_OBJECT_FLOW_MATCHER: u16 = MLX5_IB_OBJECT_DEVX + 3;
/// Driver object: DEVX async command fd.
pub const MLX5_IB_OBJECT_DEVX_ASYNC_CMD_FD: u16 = MLX5_IB_OBJECT_DEVX + 4;
/// Driver object: DEVX async event fd.
pub const MLX5_IB_OBJECT_DEVX_ASYNC_EVENT_FD: u16 = MLX5_IB_OBJECT_DEVX + 5;
/// Driver object: virtio access region.
pub const MLX5_IB_OBJECT_VAR: u16 = MLX5_IB_OBJECT_DEVX + 6;
/// Driver object: packet pacing.
pub const MLX5_IB_OBJECT_PP: u16 = MLX5_IB_OBJECT_DEVX + 7;
/// Driver object: dynamically allocated UAR (0x1008).
pub const MLX5_IB_OBJECT_UAR: u16 = MLX5_IB_OBJECT_DEVX + 8;
/// Driver object: steering anchor.
pub const MLX5_IB_OBJECT_STEERING_ANCHOR: u16 = MLX5_IB_OBJECT_DEVX + 9;

/// DEVX method: run a firmware command not tied to an object.
pub const MLX5_IB_METHOD_DEVX_OTHER: u16 = UVERBS_UDATA_DRIVER_DATA_FLAG as u16;
/// DEVX method: query a UAR's device index.
pub const MLX5_IB_METHOD_DEVX_QUERY_UAR: u16 = MLX5_IB_METHOD_DEVX_OTHER + 1;
/// DEVX method: query an EQ number.
pub const MLX5_IB_METHOD_DEVX_QUERY_EQN: u16 = MLX5_IB_METHOD_DEVX_OTHER + 2;
/// DEVX method: subscribe to events.
pub const MLX5_IB_METHOD_DEVX_SUBSCRIBE_EVENT: u16 = MLX5_IB_METHOD_DEVX_OTHER + 3;
/// DEVX_OTHER attribute: firmware command in.
pub const MLX5_IB_ATTR_DEVX_OTHER_CMD_IN: u16 = UVERBS_UDATA_DRIVER_DATA_FLAG as u16;
/// DEVX_OTHER attribute: firmware command out.
pub const MLX5_IB_ATTR_DEVX_OTHER_CMD_OUT: u16 = MLX5_IB_ATTR_DEVX_OTHER_CMD_IN + 1;

/// DEVX_OBJ method: create a firmware object.
pub const MLX5_IB_METHOD_DEVX_OBJ_CREATE: u16 = UVERBS_UDATA_DRIVER_DATA_FLAG as u16;
/// DEVX_OBJ create attribute: new handle (IDR out).
pub const MLX5_IB_ATTR_DEVX_OBJ_CREATE_HANDLE: u16 = UVERBS_UDATA_DRIVER_DATA_FLAG as u16;
/// DEVX_OBJ create attribute: the PRM command (in).
pub const MLX5_IB_ATTR_DEVX_OBJ_CREATE_CMD_IN: u16 = MLX5_IB_ATTR_DEVX_OBJ_CREATE_HANDLE + 1;
/// DEVX_OBJ create attribute: the PRM answer (out).
pub const MLX5_IB_ATTR_DEVX_OBJ_CREATE_CMD_OUT: u16 = MLX5_IB_ATTR_DEVX_OBJ_CREATE_HANDLE + 2;

/// DEVX_OBJ method: destroy a firmware object.
pub const MLX5_IB_METHOD_DEVX_OBJ_DESTROY: u16 = MLX5_IB_METHOD_DEVX_OBJ_CREATE + 1;
/// DEVX_OBJ method: modify a firmware object.
pub const MLX5_IB_METHOD_DEVX_OBJ_MODIFY: u16 = MLX5_IB_METHOD_DEVX_OBJ_CREATE + 2;
/// DEVX_OBJ method: query a firmware object.
pub const MLX5_IB_METHOD_DEVX_OBJ_QUERY: u16 = MLX5_IB_METHOD_DEVX_OBJ_CREATE + 3;
/// DEVX_OBJ destroy attribute: the handle.
pub const MLX5_IB_ATTR_DEVX_OBJ_DESTROY_HANDLE: u16 = UVERBS_UDATA_DRIVER_DATA_FLAG as u16;
/// DEVX_OBJ modify attribute: the handle (a DEVX object or a verbs QP/CQ/SRQ).
pub const MLX5_IB_ATTR_DEVX_OBJ_MODIFY_HANDLE: u16 = UVERBS_UDATA_DRIVER_DATA_FLAG as u16;
/// DEVX_OBJ modify attribute: the PRM command (in).
pub const MLX5_IB_ATTR_DEVX_OBJ_MODIFY_CMD_IN: u16 = MLX5_IB_ATTR_DEVX_OBJ_MODIFY_HANDLE + 1;
/// DEVX_OBJ modify attribute: the PRM answer (out).
pub const MLX5_IB_ATTR_DEVX_OBJ_MODIFY_CMD_OUT: u16 = MLX5_IB_ATTR_DEVX_OBJ_MODIFY_HANDLE + 2;
/// DEVX_OBJ query attribute: the handle.
pub const MLX5_IB_ATTR_DEVX_OBJ_QUERY_HANDLE: u16 = UVERBS_UDATA_DRIVER_DATA_FLAG as u16;
/// DEVX_OBJ query attribute: the PRM command (in).
pub const MLX5_IB_ATTR_DEVX_OBJ_QUERY_CMD_IN: u16 = MLX5_IB_ATTR_DEVX_OBJ_QUERY_HANDLE + 1;
/// DEVX_OBJ query attribute: the PRM answer (out).
pub const MLX5_IB_ATTR_DEVX_OBJ_QUERY_CMD_OUT: u16 = MLX5_IB_ATTR_DEVX_OBJ_QUERY_HANDLE + 2;
/// DEVX_QUERY_UAR attribute: the user's bfreg index (in).
pub const MLX5_IB_ATTR_DEVX_QUERY_UAR_USER_IDX: u16 = UVERBS_UDATA_DRIVER_DATA_FLAG as u16;
/// DEVX_QUERY_UAR attribute: the device's UAR index (out).
pub const MLX5_IB_ATTR_DEVX_QUERY_UAR_DEV_IDX: u16 = MLX5_IB_ATTR_DEVX_QUERY_UAR_USER_IDX + 1;
/// DEVX_SUBSCRIBE_EVENT attribute: the event channel's fd.
pub const MLX5_IB_ATTR_DEVX_SUBSCRIBE_EVENT_FD_HANDLE: u16 = UVERBS_UDATA_DRIVER_DATA_FLAG as u16;
/// DEVX_SUBSCRIBE_EVENT attribute: the object (handle; absent: unaffiliated events).
pub const MLX5_IB_ATTR_DEVX_SUBSCRIBE_EVENT_OBJ_HANDLE: u16 =
    MLX5_IB_ATTR_DEVX_SUBSCRIBE_EVENT_FD_HANDLE + 1;
/// DEVX_SUBSCRIBE_EVENT attribute: the event numbers (u16 array).
pub const MLX5_IB_ATTR_DEVX_SUBSCRIBE_EVENT_TYPE_NUM_LIST: u16 =
    MLX5_IB_ATTR_DEVX_SUBSCRIBE_EVENT_FD_HANDLE + 2;
/// DEVX_SUBSCRIBE_EVENT attribute: an eventfd to signal (optional).
pub const MLX5_IB_ATTR_DEVX_SUBSCRIBE_EVENT_FD_NUM: u16 =
    MLX5_IB_ATTR_DEVX_SUBSCRIBE_EVENT_FD_HANDLE + 3;
/// DEVX_SUBSCRIBE_EVENT attribute: the cookie reported with each event (u64).
pub const MLX5_IB_ATTR_DEVX_SUBSCRIBE_EVENT_COOKIE: u16 =
    MLX5_IB_ATTR_DEVX_SUBSCRIBE_EVENT_FD_HANDLE + 4;
/// DEVX_UMEM method: register user memory.
pub const MLX5_IB_METHOD_DEVX_UMEM_REG: u16 = UVERBS_UDATA_DRIVER_DATA_FLAG as u16;
/// DEVX_UMEM method: deregister.
pub const MLX5_IB_METHOD_DEVX_UMEM_DEREG: u16 = MLX5_IB_METHOD_DEVX_UMEM_REG + 1;
/// UMEM_REG attribute: new handle (IDR out).
pub const MLX5_IB_ATTR_DEVX_UMEM_REG_HANDLE: u16 = UVERBS_UDATA_DRIVER_DATA_FLAG as u16;
/// UMEM_REG attribute: start address (u64 in).
pub const MLX5_IB_ATTR_DEVX_UMEM_REG_ADDR: u16 = MLX5_IB_ATTR_DEVX_UMEM_REG_HANDLE + 1;
/// UMEM_REG attribute: length (u64 in).
pub const MLX5_IB_ATTR_DEVX_UMEM_REG_LEN: u16 = MLX5_IB_ATTR_DEVX_UMEM_REG_HANDLE + 2;
/// UMEM_REG attribute: access flags (u32 in).
pub const MLX5_IB_ATTR_DEVX_UMEM_REG_ACCESS: u16 = MLX5_IB_ATTR_DEVX_UMEM_REG_HANDLE + 3;
/// UMEM_REG attribute: the umem id (u32 out).
pub const MLX5_IB_ATTR_DEVX_UMEM_REG_OUT_ID: u16 = MLX5_IB_ATTR_DEVX_UMEM_REG_HANDLE + 4;
/// UMEM_REG attribute: page sizes the caller accepts (u64 in, optional).
pub const MLX5_IB_ATTR_DEVX_UMEM_REG_PGSZ_BITMAP: u16 = MLX5_IB_ATTR_DEVX_UMEM_REG_HANDLE + 5;
/// UMEM_REG attribute: a dma-buf fd instead of an address (optional).
pub const MLX5_IB_ATTR_DEVX_UMEM_REG_DMABUF_FD: u16 = MLX5_IB_ATTR_DEVX_UMEM_REG_HANDLE + 6;
/// UMEM_DEREG attribute: the handle.
pub const MLX5_IB_ATTR_DEVX_UMEM_DEREG_HANDLE: u16 = UVERBS_UDATA_DRIVER_DATA_FLAG as u16;
/// DEVX_ASYNC_EVENT_FD method: allocate an event channel.
pub const MLX5_IB_METHOD_DEVX_ASYNC_EVENT_FD_ALLOC: u16 = UVERBS_UDATA_DRIVER_DATA_FLAG as u16;
/// ASYNC_EVENT_FD_ALLOC attribute: the new fd (FD out).
pub const MLX5_IB_ATTR_DEVX_ASYNC_EVENT_FD_ALLOC_HANDLE: u16 = UVERBS_UDATA_DRIVER_DATA_FLAG as u16;
/// ASYNC_EVENT_FD_ALLOC attribute: flags (`MLX5_IB_UAPI_DEVX_CR_EV_CH_FLAGS_*`).
pub const MLX5_IB_ATTR_DEVX_ASYNC_EVENT_FD_ALLOC_FLAGS: u16 =
    MLX5_IB_ATTR_DEVX_ASYNC_EVENT_FD_ALLOC_HANDLE + 1;
/// Event channel flag: events carry the cookie only, no EQE data.
pub const MLX5_IB_UAPI_DEVX_CR_EV_CH_FLAGS_OMIT_DATA: u32 = 1 << 0;

/// PRM command opcodes that mlx5_ib's DEVX lets a context without a DEVX uid run through
/// the device's own uid (`devx_is_whitelist_cmd` in the kernel's devx.c): QUERY_HCA_CAP,
/// QUERY_HCA_VPORT_CONTEXT, QUERY_ESW_VPORT_CONTEXT, QUERY_ESW_FUNCTIONS. PRM numbers (no
/// installed header carries them); `ffi/tests/codec.rs` pins them.
pub const MLX5_DEVX_WHITELIST_OPCODES: [u16; 4] = [0x100, 0x762, 0x752, 0x740];

/// The opcode of a PRM command mailbox: the big-endian 16 bits at its start
/// (`general_obj_in_cmd_hdr.opcode`); `None` if the mailbox is shorter.
pub fn prm_opcode(cmd_in: &[u8]) -> Option<u16> {
    cmd_in.get(..2).map(|b| u16::from_be_bytes([b[0], b[1]]))
}

/// UAR method: allocate.
pub const MLX5_IB_METHOD_UAR_OBJ_ALLOC: u16 = UVERBS_UDATA_DRIVER_DATA_FLAG as u16;
/// UAR method: destroy.
pub const MLX5_IB_METHOD_UAR_OBJ_DESTROY: u16 = MLX5_IB_METHOD_UAR_OBJ_ALLOC + 1;
/// UAR alloc attribute: new handle (IDR out).
pub const MLX5_IB_ATTR_UAR_OBJ_ALLOC_HANDLE: u16 = UVERBS_UDATA_DRIVER_DATA_FLAG as u16;
/// UAR alloc attribute: type (const in, `MLX5_IB_UAPI_UAR_ALLOC_TYPE_*`).
pub const MLX5_IB_ATTR_UAR_OBJ_ALLOC_TYPE: u16 = MLX5_IB_ATTR_UAR_OBJ_ALLOC_HANDLE + 1;
/// UAR alloc attribute: mmap offset (u64 out, bytes).
pub const MLX5_IB_ATTR_UAR_OBJ_ALLOC_MMAP_OFFSET: u16 = MLX5_IB_ATTR_UAR_OBJ_ALLOC_HANDLE + 2;
/// UAR alloc attribute: mmap length (u32 out).
pub const MLX5_IB_ATTR_UAR_OBJ_ALLOC_MMAP_LENGTH: u16 = MLX5_IB_ATTR_UAR_OBJ_ALLOC_HANDLE + 3;
/// UAR alloc attribute: hardware UAR page id (u32 out).
pub const MLX5_IB_ATTR_UAR_OBJ_ALLOC_PAGE_ID: u16 = MLX5_IB_ATTR_UAR_OBJ_ALLOC_HANDLE + 4;
/// UAR destroy attribute: handle (IDR in).
pub const MLX5_IB_ATTR_UAR_OBJ_DESTROY_HANDLE: u16 = UVERBS_UDATA_DRIVER_DATA_FLAG as u16;

/// UAR alloc type: BlueFlame (write-combining).
pub const MLX5_IB_UAPI_UAR_ALLOC_TYPE_BF: u32 = 0;
/// UAR alloc type: uncached (doorbells only).
pub const MLX5_IB_UAPI_UAR_ALLOC_TYPE_NC: u32 = 1;

/// PD driver method: query the PD number.
pub const MLX5_IB_METHOD_PD_QUERY: u16 = UVERBS_UDATA_DRIVER_DATA_FLAG as u16;
/// PD query attribute: PD handle.
pub const MLX5_IB_ATTR_QUERY_PD_HANDLE: u16 = UVERBS_UDATA_DRIVER_DATA_FLAG as u16;
/// PD query attribute: PD number (u32 out).
pub const MLX5_IB_ATTR_QUERY_PD_RESP_PDN: u16 = MLX5_IB_ATTR_QUERY_PD_HANDLE + 1;

/// DEVICE driver method: mlx5 query port.
pub const MLX5_IB_METHOD_QUERY_PORT: u16 = UVERBS_UDATA_DRIVER_DATA_FLAG as u16;
/// mlx5 query port attribute: port number.
pub const MLX5_IB_ATTR_QUERY_PORT_PORT_NUM: u16 = UVERBS_UDATA_DRIVER_DATA_FLAG as u16;
/// mlx5 query port attribute: response.
pub const MLX5_IB_ATTR_QUERY_PORT: u16 = MLX5_IB_ATTR_QUERY_PORT_PORT_NUM + 1;

/// QUERY_CONTEXT driver attribute: the alloc-ucontext response again.
pub const MLX5_IB_ATTR_QUERY_CONTEXT_RESP_UCTX: u16 = UVERBS_UDATA_DRIVER_DATA_FLAG as u16;

// ---- structs ----------------------------------------------------------------------------

/// `struct mlx5_ib_alloc_ucontext_req_v2` (32 B): driver data of GET_CONTEXT.
///
/// libmlx5 also sends it cut to 40 - 8 = 32, 24 (no `lib_caps`) and 16 bytes (no
/// `max_cqe_version`) for old kernels.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct Mlx5IbAllocUcontextReqV2 {
    /// 0: static bfregs wanted (legacy scheme).
    pub total_num_bfregs: u32,
    /// 4: of which dedicated low-latency.
    pub num_low_latency_bfregs: u32,
    /// 8: `MLX5_IB_ALLOC_UCTX_*`.
    pub flags: u32,
    /// 12: must be 0.
    pub comp_mask: u32,
    /// 16: highest CQE version the library understands.
    pub max_cqe_version: u8,
    /// 17: must be 0.
    pub reserved0: u8,
    /// 18: must be 0.
    pub reserved1: u16,
    /// 20: must be 0.
    pub reserved2: u32,
    /// 24: `MLX5_LIB_CAP_*`.
    pub lib_caps: u64,
}
const _: () = assert!(size_of::<Mlx5IbAllocUcontextReqV2>() == 32);

/// `struct mlx5_ib_alloc_ucontext_resp` (72 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct Mlx5IbAllocUcontextResp {
    /// 0
    pub qp_tab_size: u32,
    /// 4: BlueFlame register size (0 = no BlueFlame).
    pub bf_reg_size: u32,
    /// 8: static bfregs (0 in dynamic-UAR mode).
    pub tot_bfregs: u32,
    /// 12
    pub cache_line_size: u32,
    /// 16
    pub max_sq_desc_sz: u16,
    /// 18
    pub max_rq_desc_sz: u16,
    /// 20
    pub max_send_wqebb: u32,
    /// 24
    pub max_recv_wr: u32,
    /// 28
    pub max_srq_recv_wr: u32,
    /// 32
    pub num_ports: u16,
    /// 34: `MLX5_USER_ALLOC_UCONTEXT_FLOW_ACTION_FLAGS_*`.
    pub flow_action_flags: u16,
    /// 36: `MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_*`.
    pub comp_mask: u32,
    /// 40
    pub response_length: u32,
    /// 44: 0 or 1.
    pub cqe_version: u8,
    /// 45: `MLX5_USER_CMDS_SUPP_UHW_*`.
    pub cmds_supp_uhw: u8,
    /// 46: `MLX5_USER_INLINE_MODE_*` + 1 (0 = unknown).
    pub eth_min_inline: u8,
    /// 47: bit 0 = clock info v1 mappable.
    pub clock_info_versions: u8,
    /// 48: offset of the timer inside the core-clock page (< page size).
    pub hca_core_clock_offset: u64,
    /// 56
    pub log_uar_size: u32,
    /// 60
    pub num_uars_per_page: u32,
    /// 64
    pub num_dyn_bfregs: u32,
    /// 68
    pub dump_fill_mkey: u32,
}
const _: () = assert!(size_of::<Mlx5IbAllocUcontextResp>() == 72);

/// `struct mlx5_ib_alloc_pd_resp` (4 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct Mlx5IbAllocPdResp {
    /// 0: hardware PD number.
    pub pdn: u32,
}
const _: () = assert!(size_of::<Mlx5IbAllocPdResp>() == 4);

/// `struct mlx5_ib_tso_caps` (8 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct Mlx5IbTsoCaps {
    /// 0
    pub max_tso: u32,
    /// 4
    pub supported_qpts: u32,
}
const _: () = assert!(size_of::<Mlx5IbTsoCaps>() == 8);

/// `struct mlx5_ib_rss_caps` (16 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct Mlx5IbRssCaps {
    /// 0
    pub rx_hash_fields_mask: u64,
    /// 8
    pub rx_hash_function: u8,
    /// 9
    pub reserved: [u8; 7],
}
const _: () = assert!(size_of::<Mlx5IbRssCaps>() == 16);

/// `struct mlx5_ib_cqe_comp_caps` (8 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct Mlx5IbCqeCompCaps {
    /// 0
    pub max_num: u32,
    /// 4: `MLX5_IB_CQE_RES_FORMAT_*`.
    pub supported_format: u32,
}
const _: () = assert!(size_of::<Mlx5IbCqeCompCaps>() == 8);

/// `struct mlx5_packet_pacing_caps` (16 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct Mlx5PacketPacingCaps {
    /// 0
    pub qp_rate_limit_min: u32,
    /// 4: kbps.
    pub qp_rate_limit_max: u32,
    /// 8
    pub supported_qpts: u32,
    /// 12
    pub cap_flags: u8,
    /// 13
    pub reserved: [u8; 3],
}
const _: () = assert!(size_of::<Mlx5PacketPacingCaps>() == 16);

/// `struct mlx5_ib_sw_parsing_caps` (8 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct Mlx5IbSwParsingCaps {
    /// 0
    pub sw_parsing_offloads: u32,
    /// 4
    pub supported_qpts: u32,
}
const _: () = assert!(size_of::<Mlx5IbSwParsingCaps>() == 8);

/// `struct mlx5_ib_striding_rq_caps` (24 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct Mlx5IbStridingRqCaps {
    /// 0
    pub min_single_stride_log_num_of_bytes: u32,
    /// 4
    pub max_single_stride_log_num_of_bytes: u32,
    /// 8
    pub min_single_wqe_log_num_of_strides: u32,
    /// 12
    pub max_single_wqe_log_num_of_strides: u32,
    /// 16
    pub supported_qpts: u32,
    /// 20
    pub reserved: u32,
}
const _: () = assert!(size_of::<Mlx5IbStridingRqCaps>() == 24);

/// `struct mlx5_ib_dci_streams_caps` (2 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct Mlx5IbDciStreamsCaps {
    /// 0 (the kernel spells it "concurent")
    pub max_log_num_concurent: u8,
    /// 1
    pub max_log_num_errored: u8,
}
const _: () = assert!(size_of::<Mlx5IbDciStreamsCaps>() == 2);

/// `struct mlx5_ib_query_device_resp` (104 B): driver part of extended QUERY_DEVICE.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct Mlx5IbQueryDeviceResp {
    /// 0
    pub comp_mask: u32,
    /// 4
    pub response_length: u32,
    /// 8
    pub tso_caps: Mlx5IbTsoCaps,
    /// 16
    pub rss_caps: Mlx5IbRssCaps,
    /// 32
    pub cqe_comp_caps: Mlx5IbCqeCompCaps,
    /// 40
    pub packet_pacing_caps: Mlx5PacketPacingCaps,
    /// 56: `MLX5_IB_ALLOW_MPW | MLX5_IB_SUPPORT_EMPW`.
    pub mlx5_ib_support_multi_pkt_send_wqes: u32,
    /// 60: `MLX5_IB_QUERY_DEV_RESP_*`.
    pub flags: u32,
    /// 64
    pub sw_parsing_caps: Mlx5IbSwParsingCaps,
    /// 72
    pub striding_rq_caps: Mlx5IbStridingRqCaps,
    /// 96
    pub tunnel_offloads_caps: u32,
    /// 100
    pub dci_streams_caps: Mlx5IbDciStreamsCaps,
    /// 102
    pub reserved: u16,
}
const _: () = assert!(size_of::<Mlx5IbQueryDeviceResp>() == 104);

/// `struct mlx5_ib_create_cq` (32 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct Mlx5IbCreateCq {
    /// 0: CQ buffer address.
    pub buf_addr: u64,
    /// 8: doorbell record address (2 BE32 words: CI, arm).
    pub db_addr: u64,
    /// 16: 64 or 128.
    pub cqe_size: u32,
    /// 20
    pub cqe_comp_en: u8,
    /// 21
    pub cqe_comp_res_format: u8,
    /// 22: `MLX5_IB_CREATE_CQ_FLAGS_*`.
    pub flags: u16,
    /// 24: UAR page id (with `MLX5_IB_CREATE_CQ_FLAGS_UAR_PAGE_INDEX`).
    pub uar_page_index: u16,
    /// 26: must be 0.
    pub reserved0: u16,
    /// 28: must be 0.
    pub reserved1: u32,
}
const _: () = assert!(size_of::<Mlx5IbCreateCq>() == 32);

/// `struct mlx5_ib_create_cq_resp` (8 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct Mlx5IbCreateCqResp {
    /// 0: hardware CQ number.
    pub cqn: u32,
    /// 4
    pub reserved: u32,
}
const _: () = assert!(size_of::<Mlx5IbCreateCqResp>() == 8);

/// `struct mlx5_ib_create_srq` (32 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct Mlx5IbCreateSrq {
    /// 0
    pub buf_addr: u64,
    /// 8: doorbell record (one BE32 word).
    pub db_addr: u64,
    /// 16: `MLX5_SRQ_FLAG_*`.
    pub flags: u32,
    /// 20
    pub reserved0: u32,
    /// 24: user index (XRC SRQs; 0 for basic SRQs).
    pub uidx: u32,
    /// 28
    pub reserved1: u32,
}
const _: () = assert!(size_of::<Mlx5IbCreateSrq>() == 32);

/// `struct mlx5_ib_create_srq_resp` (8 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct Mlx5IbCreateSrqResp {
    /// 0: hardware SRQ number.
    pub srqn: u32,
    /// 4
    pub reserved: u32,
}
const _: () = assert!(size_of::<Mlx5IbCreateSrqResp>() == 8);

/// `struct mlx5_ib_create_qp_dci_streams` (2 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct Mlx5IbCreateQpDciStreams {
    /// 0
    pub log_num_concurent: u8,
    /// 1
    pub log_num_errored: u8,
}
const _: () = assert!(size_of::<Mlx5IbCreateQpDciStreams>() == 2);

/// `struct mlx5_ib_create_qp` (56 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct Mlx5IbCreateQp {
    /// 0: RQ then SQ buffer.
    pub buf_addr: u64,
    /// 8: doorbell record (BE32 RQ counter, BE32 SQ counter).
    pub db_addr: u64,
    /// 16: SQ size in WQEBBs (power of two).
    pub sq_wqe_count: u32,
    /// 20
    pub rq_wqe_count: u32,
    /// 24: log2 of the RQ stride.
    pub rq_wqe_shift: u32,
    /// 28: `MLX5_QP_FLAG_*`.
    pub flags: u32,
    /// 32: CQE v1 user index.
    pub uidx: u32,
    /// 36: UAR page id or legacy bfreg index.
    pub bfreg_index: u32,
    /// 40: separate SQ buffer (RAW/underlay); union with `access_key` (DC).
    pub sq_buf_addr: u64,
    /// 48
    pub ece_options: u32,
    /// 52
    pub dci_streams: Mlx5IbCreateQpDciStreams,
    /// 54
    pub reserved: u16,
}
const _: () = assert!(size_of::<Mlx5IbCreateQp>() == 56);

/// `struct mlx5_ib_create_qp_resp` (40 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct Mlx5IbCreateQpResp {
    /// 0: bfreg chosen by the kernel (legacy scheme).
    pub bfreg_index: u32,
    /// 4
    pub ece_options: u32,
    /// 8: `MLX5_IB_CREATE_QP_RESP_MASK_*`.
    pub comp_mask: u32,
    /// 12
    pub tirn: u32,
    /// 16
    pub tisn: u32,
    /// 20
    pub rqn: u32,
    /// 24
    pub sqn: u32,
    /// 28
    pub reserved1: u32,
    /// 32
    pub tir_icm_addr: u64,
}
const _: () = assert!(size_of::<Mlx5IbCreateQpResp>() == 40);

/// `struct mlx5_ib_create_ah_resp` (16 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct Mlx5IbCreateAhResp {
    /// 0
    pub response_length: u32,
    /// 4: resolved destination MAC (RoCE).
    pub dmac: [u8; 6],
    /// 10
    pub reserved: [u8; 6],
}
const _: () = assert!(size_of::<Mlx5IbCreateAhResp>() == 16);

/// `struct mlx5_ib_burst_info` (8 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct Mlx5IbBurstInfo {
    /// 0
    pub max_burst_sz: u32,
    /// 4
    pub typical_pkt_sz: u16,
    /// 6
    pub reserved: u16,
}
const _: () = assert!(size_of::<Mlx5IbBurstInfo>() == 8);

/// `struct mlx5_ib_modify_qp` (16 B): driver data of extended MODIFY_QP.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct Mlx5IbModifyQp {
    /// 0
    pub comp_mask: u32,
    /// 4
    pub burst_info: Mlx5IbBurstInfo,
    /// 12
    pub ece_options: u32,
}
const _: () = assert!(size_of::<Mlx5IbModifyQp>() == 16);

/// `struct mlx5_ib_modify_qp_resp` (16 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct Mlx5IbModifyQpResp {
    /// 0
    pub response_length: u32,
    /// 4: DCT number (DCT to RTR only).
    pub dctn: u32,
    /// 8
    pub ece_options: u32,
    /// 12
    pub reserved: u32,
}
const _: () = assert!(size_of::<Mlx5IbModifyQpResp>() == 16);

/// `struct mlx5_ib_clock_info` (56 B): the CLOCK_INFO mmap page.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct Mlx5IbClockInfo {
    /// 0: seqlock word; `MLX5_IB_CLOCK_INFO_KERNEL_UPDATING` while updating.
    pub sign: u32,
    /// 4
    pub resv: u32,
    /// 8
    pub nsec: u64,
    /// 16
    pub cycles: u64,
    /// 24
    pub frac: u64,
    /// 32
    pub mult: u32,
    /// 36
    pub shift: u32,
    /// 40
    pub mask: u64,
    /// 48
    pub overflow_period: u64,
}
const _: () = assert!(size_of::<Mlx5IbClockInfo>() == 56);
