//! `#[repr(C)]` mirrors of the libibverbs structures the provider touches.
//!
//! Two kinds, kept apart because they are known in two different ways:
//!
//! * **Public** (`infiniband/verbs.h`, installed by libibverbs-dev): `ibv_device`,
//!   `ibv_context`, `verbs_context`, `ibv_pd`, `ibv_mr`, `ibv_cq`/`ibv_cq_ex`, `ibv_qp`/
//!   `ibv_qp_ex`, `ibv_srq`, `ibv_ah`, the work requests and `ibv_wc`, the attribute structs.
//!   `tests/layout.rs` proves every size and field offset listed here against the installed
//!   header with a C probe.
//! * **Private ABI 34** (rdma-core's `libibverbs/driver.h`, not installed by Debian):
//!   `verbs_match_ent`, `verbs_sysfs_dev`, `verbs_device_ops`, `verbs_device`, `verbs_mr`,
//!   `verbs_qp` and `verbs_context_ops`. Pinned from reading `driver.h` of rdma-core v44 (the
//!   ABI is numbered `IBVERBS_PRIVATE_34` there); `lib.rs` refuses to register unless the
//!   loaded libibverbs exports exactly that version node. Their public members are proven by
//!   the same probe (they embed public structs at fixed places).

#![allow(
    non_camel_case_types,
    dead_code,
    missing_docs,
    missing_debug_implementations
)]

use core::ffi::{c_char, c_int, c_uint, c_void};
use libc::{pthread_cond_t, pthread_mutex_t};

pub const IBV_SYSFS_NAME_MAX: usize = 64;
pub const IBV_SYSFS_PATH_MAX: usize = 256;

/// The private ABI this provider is written against, by the name of libibverbs' version node.
pub const PRIVATE_ABI: &str = "IBVERBS_PRIVATE_34";

// ---------------------------------------------------------------------------------------
// Public (verbs.h)

pub type Fp = Option<unsafe extern "C" fn()>;

#[repr(C)]
pub struct ibv_device {
    pub _ops: [Fp; 2],
    pub node_type: c_int,
    pub transport_type: c_int,
    pub name: [c_char; IBV_SYSFS_NAME_MAX],
    pub dev_name: [c_char; IBV_SYSFS_NAME_MAX],
    pub dev_path: [c_char; IBV_SYSFS_PATH_MAX],
    pub ibdev_path: [c_char; IBV_SYSFS_PATH_MAX],
}

/// `struct ibv_context_ops`: 32 pointers; libibverbs' `verbs_set_ops` fills the live ones
/// (`poll_cq`, `req_notify_cq`, `post_send`, `post_recv`, `post_srq_recv`, the MW ones).
#[repr(C)]
pub struct ibv_context_ops {
    /// Seven compat slots, the three memory-window ops, `_compat_create_cq`.
    pub _compat: [Fp; 11],
    pub poll_cq: Fp,
    pub req_notify_cq: Fp,
    pub _compat2: [Fp; 7],
    pub post_srq_recv: Fp,
    pub _compat3: [Fp; 4],
    pub post_send: Fp,
    pub post_recv: Fp,
    pub _compat4: [Fp; 5],
}

#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: ibv_context_ops,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    pub mutex: pthread_mutex_t,
    pub abi_compat: *mut c_void,
}

/// `struct verbs_context`: the extended ops, then `sz`, then the `ibv_context` (last).
#[repr(C)]
pub struct verbs_context {
    /// `query_port` .. `create_cq_ex` (26 slots, filled by libibverbs).
    pub ex_ops: [Fp; 26],
    pub priv_: *mut c_void,
    pub ex_ops2: [Fp; 11],
    pub _abi_placeholder3: u64,
    pub sz: usize,
    pub context: ibv_context,
}

#[repr(C)]
pub struct ibv_pd {
    pub context: *mut ibv_context,
    pub handle: u32,
}

#[repr(C)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

#[repr(C)]
pub struct ibv_comp_channel {
    pub context: *mut ibv_context,
    pub fd: c_int,
    pub refcnt: c_int,
}

#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
}

pub type CqExFn<R> = Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> R>;

#[repr(C)]
pub struct ibv_cq_ex {
    pub cq: ibv_cq,
    pub comp_mask: u32,
    pub status: c_uint,
    pub wr_id: u64,
    pub start_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex, *mut ibv_poll_cq_attr) -> c_int>,
    pub next_poll: CqExFn<c_int>,
    pub end_poll: CqExFn<()>,
    pub read_opcode: CqExFn<c_uint>,
    pub read_vendor_err: CqExFn<u32>,
    pub read_byte_len: CqExFn<u32>,
    pub read_imm_data: CqExFn<u32>,
    pub read_qp_num: CqExFn<u32>,
    pub read_src_qp: CqExFn<u32>,
    pub read_wc_flags: CqExFn<c_uint>,
    pub read_slid: CqExFn<u32>,
    pub read_sl: CqExFn<u8>,
    pub read_dlid_path_bits: CqExFn<u8>,
    pub read_completion_ts: CqExFn<u64>,
    pub read_cvlan: CqExFn<u16>,
    pub read_flow_tag: CqExFn<u32>,
    pub read_tm_info: Fp,
    pub read_completion_wallclock_ns: CqExFn<u64>,
}

#[repr(C)]
pub struct ibv_poll_cq_attr {
    pub comp_mask: u32,
}

#[repr(C)]
pub struct ibv_srq {
    pub context: *mut ibv_context,
    pub srq_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub handle: u32,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub events_completed: u32,
}

/// `struct ibv_xrcd`.
#[repr(C)]
pub struct ibv_xrcd {
    pub context: *mut ibv_context,
}

/// `struct verbs_xrcd` (driver.h of rdma-core v44): the `ibv_xrcd`, then the kernel handle.
#[repr(C)]
pub struct verbs_xrcd {
    pub xrcd: ibv_xrcd,
    pub comp_mask: u32,
    pub handle: u32,
}

#[repr(C)]
pub struct ibv_xrcd_init_attr {
    pub comp_mask: u32,
    pub fd: c_int,
    pub oflags: c_int,
}

/// `struct verbs_srq` (driver.h of rdma-core v44): the `ibv_srq`, its type, domain, CQ and
/// number.
#[repr(C)]
pub struct verbs_srq {
    pub srq: ibv_srq,
    pub srq_type: c_uint,
    pub xrcd: *mut verbs_xrcd,
    pub cq: *mut ibv_cq,
    pub srq_num: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_tm_cap {
    pub max_num_tags: u32,
    pub max_ops: u32,
}

#[repr(C)]
pub struct ibv_srq_init_attr_ex {
    pub srq_context: *mut c_void,
    pub attr: ibv_srq_attr,
    pub comp_mask: u32,
    pub srq_type: c_uint,
    pub pd: *mut ibv_pd,
    pub xrcd: *mut ibv_xrcd,
    pub cq: *mut ibv_cq,
    pub tm_cap: ibv_tm_cap,
}

#[repr(C)]
pub struct ibv_qp_open_attr {
    pub comp_mask: u32,
    pub qp_num: u32,
    pub xrcd: *mut ibv_xrcd,
    pub qp_context: *mut c_void,
    pub qp_type: c_uint,
}

#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub handle: u32,
    pub qp_num: u32,
    pub state: c_uint,
    pub qp_type: c_uint,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub events_completed: u32,
}

pub type QpExFn<A> = Option<A>;

#[repr(C)]
pub struct ibv_qp_ex {
    pub qp_base: ibv_qp,
    pub comp_mask: u64,
    pub wr_id: u64,
    pub wr_flags: c_uint,
    pub wr_atomic_cmp_swp: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64, u64)>,
    pub wr_atomic_fetch_add: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64)>,
    pub wr_bind_mw: Fp,
    pub wr_local_inv: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    pub wr_rdma_read: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64)>,
    pub wr_rdma_write: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64)>,
    pub wr_rdma_write_imm: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u32)>,
    pub wr_send: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
    pub wr_send_imm: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    pub wr_send_inv: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    pub wr_send_tso: Fp,
    pub wr_set_ud_addr: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut ibv_ah, u32, u32)>,
    pub wr_set_xrc_srqn: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    pub wr_set_inline_data: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut c_void, usize)>,
    pub wr_set_inline_data_list:
        Option<unsafe extern "C" fn(*mut ibv_qp_ex, usize, *const ibv_data_buf)>,
    pub wr_set_sge: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u32)>,
    pub wr_set_sge_list: Option<unsafe extern "C" fn(*mut ibv_qp_ex, usize, *const ibv_sge)>,
    pub wr_start: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
    pub wr_complete: Option<unsafe extern "C" fn(*mut ibv_qp_ex) -> c_int>,
    pub wr_abort: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
    pub wr_atomic_write: Fp,
}

#[repr(C)]
pub struct ibv_data_buf {
    pub addr: *mut c_void,
    pub length: usize,
}

#[repr(C)]
pub struct ibv_ah {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub handle: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_rdma {
    pub remote_addr: u64,
    pub rkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_atomic {
    pub remote_addr: u64,
    pub compare_add: u64,
    pub swap: u64,
    pub rkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_ud {
    pub ah: *mut ibv_ah,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_wr {
    pub rdma: ibv_send_wr_rdma,
    pub atomic: ibv_send_wr_atomic,
    pub ud: ibv_send_wr_ud,
}

#[repr(C)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: c_uint,
    pub send_flags: c_uint,
    /// `imm_data` (big-endian) or `invalidate_rkey`.
    pub imm_data: u32,
    pub wr: ibv_send_wr_wr,
    /// `qp_type.xrc.remote_srqn`: the remote XRC SRQ of an XRC_SEND QP's WR.
    pub qp_type: u32,
    /// `bind_mw` / `tso`: unused here.
    pub tail: [u64; 6],
}

#[repr(C)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: c_uint,
    pub opcode: c_uint,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// `imm_data` (big-endian) or `invalidated_rkey`.
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

#[repr(C)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: c_uint,
    pub sq_sig_all: c_int,
}

#[repr(C)]
pub struct ibv_rx_hash_conf {
    pub rx_hash_function: u8,
    pub rx_hash_key_len: u8,
    pub rx_hash_key: *mut u8,
    pub rx_hash_fields_mask: u64,
}

#[repr(C)]
pub struct ibv_qp_init_attr_ex {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: c_uint,
    pub sq_sig_all: c_int,
    pub comp_mask: u32,
    pub pd: *mut ibv_pd,
    pub xrcd: *mut c_void,
    pub create_flags: u32,
    pub max_tso_header: u16,
    pub rwq_ind_tbl: *mut c_void,
    pub rx_hash_conf: ibv_rx_hash_conf,
    pub source_qpn: u32,
    pub send_ops_flags: u64,
}

#[repr(C)]
pub struct ibv_cq_init_attr_ex {
    pub cqe: u32,
    pub cq_context: *mut c_void,
    pub channel: *mut ibv_comp_channel,
    pub comp_vector: u32,
    pub wc_flags: u64,
    pub comp_mask: u32,
    pub flags: u32,
    pub parent_domain: *mut ibv_pd,
}

/// `union ibv_gid` holds a `__be64` pair: the route (and `ibv_ah_attr`, `ibv_qp_attr`)
/// is 8-byte aligned.
#[repr(C, align(8))]
#[derive(Clone, Copy, Default)]
pub struct ibv_global_route {
    pub dgid: [u8; 16],
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_attr {
    pub qp_state: c_uint,
    pub cur_qp_state: c_uint,
    pub path_mtu: c_uint,
    pub path_mig_state: c_uint,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: ibv_qp_cap,
    pub ah_attr: ibv_ah_attr,
    pub alt_ah_attr: ibv_ah_attr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_srq_attr {
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
}

#[repr(C)]
pub struct ibv_srq_init_attr {
    pub srq_context: *mut c_void,
    pub attr: ibv_srq_attr,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_port_attr {
    pub state: c_uint,
    pub max_mtu: c_uint,
    pub active_mtu: c_uint,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr {
    pub fw_ver: [c_char; 64],
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: c_uint,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub max_ee_init_rd_atom: c_int,
    pub atomic_cap: c_uint,
    pub max_ee: c_int,
    pub max_rdd: c_int,
    pub max_mw: c_int,
    pub max_raw_ipv6_qp: c_int,
    pub max_raw_ethy_qp: c_int,
    pub max_mcast_grp: c_int,
    pub max_mcast_qp_attach: c_int,
    pub max_total_mcast_qp_attach: c_int,
    pub max_ah: c_int,
    pub max_fmr: c_int,
    pub max_map_per_fmr: c_int,
    pub max_srq: c_int,
    pub max_srq_wr: c_int,
    pub max_srq_sge: c_int,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_odp_caps {
    pub general_caps: u64,
    pub rc_odp_caps: u32,
    pub uc_odp_caps: u32,
    pub ud_odp_caps: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_tso_caps {
    pub max_tso: u32,
    pub supported_qpts: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_rss_caps {
    pub supported_qpts: u32,
    pub max_rwq_indirection_tables: u32,
    pub max_rwq_indirection_table_size: u32,
    pub rx_hash_fields_mask: u64,
    pub rx_hash_function: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_packet_pacing_caps {
    pub qp_rate_limit_min: u32,
    pub qp_rate_limit_max: u32,
    pub supported_qpts: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_tm_caps {
    pub max_rndv_hdr_size: u32,
    pub max_num_tags: u32,
    pub flags: u32,
    pub max_ops: u32,
    pub max_sge: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_cq_moderation_caps {
    pub max_cq_count: u16,
    pub max_cq_period: u16,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_pci_atomic_caps {
    pub fetch_add: u16,
    pub swap: u16,
    pub compare_swap: u16,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr_ex {
    pub orig_attr: ibv_device_attr,
    pub comp_mask: u32,
    pub odp_caps: ibv_odp_caps,
    pub completion_timestamp_mask: u64,
    pub hca_core_clock: u64,
    pub device_cap_flags_ex: u64,
    pub tso_caps: ibv_tso_caps,
    pub rss_caps: ibv_rss_caps,
    pub max_wq_type_rq: u32,
    pub packet_pacing_caps: ibv_packet_pacing_caps,
    pub raw_packet_caps: u32,
    pub tm_caps: ibv_tm_caps,
    pub cq_mod_caps: ibv_cq_moderation_caps,
    pub max_dm_size: u64,
    pub pci_atomic_caps: ibv_pci_atomic_caps,
    pub xrc_odp_caps: u32,
    pub phys_port_cnt_ex: u32,
}

#[repr(C)]
pub struct ibv_async_event {
    pub element: *mut c_void,
    pub event_type: c_uint,
}

// ---------------------------------------------------------------------------------------
// Private ABI 34 (rdma-core v44 `libibverbs/driver.h`), pinned by reading.

pub const VERBS_MATCH_SENTINEL: u8 = 0;
pub const VERBS_MATCH_PCI: u8 = 1;
pub const VERBS_MATCH_MODALIAS: u8 = 2;
pub const VERBS_MATCH_DRIVER_ID: u8 = 3;

#[repr(C)]
pub struct verbs_match_ent {
    pub driver_data: *mut c_void,
    /// `modalias` (a `const char *`) or `driver_id` (`u64`): a union of two 8-byte members,
    /// held here as the pointer (a driver id is the pointer's address).
    pub u: *const c_char,
    pub vendor: u16,
    pub device: u16,
    pub kind: u8,
}

#[repr(C)]
pub struct list_node {
    pub next: *mut list_node,
    pub prev: *mut list_node,
}

#[repr(C)]
pub struct verbs_sysfs_dev {
    pub entry: list_node,
    pub provider_data: *mut c_void,
    pub match_: *const verbs_match_ent,
    pub flags: c_uint,
    pub sysfs_name: [c_char; IBV_SYSFS_NAME_MAX],
    pub sysfs_cdev: libc::dev_t,
    pub ibdev_name: [c_char; IBV_SYSFS_NAME_MAX],
    pub ibdev_path: [c_char; IBV_SYSFS_PATH_MAX],
    pub modalias: [c_char; 512],
    pub node_guid: u64,
    pub driver_id: u32,
    pub node_type: c_uint,
    pub ibdev_idx: c_int,
    pub num_ports: u32,
    pub abi_ver: u32,
    pub time_created: libc::timespec,
}

#[repr(C)]
pub struct verbs_device_ops {
    pub name: *const c_char,
    pub match_min_abi_version: u32,
    pub match_max_abi_version: u32,
    pub match_table: *const verbs_match_ent,
    pub static_providers: *const *const verbs_device_ops,
    pub match_device: Option<unsafe extern "C" fn(*mut verbs_sysfs_dev) -> bool>,
    pub alloc_context:
        Option<unsafe extern "C" fn(*mut ibv_device, c_int, *mut c_void) -> *mut verbs_context>,
    pub import_context: Option<unsafe extern "C" fn(*mut ibv_device, c_int) -> *mut verbs_context>,
    pub alloc_device: Option<unsafe extern "C" fn(*mut verbs_sysfs_dev) -> *mut verbs_device>,
    pub uninit_device: Option<unsafe extern "C" fn(*mut verbs_device)>,
}

#[repr(C)]
pub struct verbs_device {
    pub device: ibv_device,
    pub ops: *const verbs_device_ops,
    pub refcount: c_int,
    pub entry: list_node,
    pub sysfs: *mut verbs_sysfs_dev,
    pub core_support: u64,
}

#[repr(C)]
pub struct verbs_mr {
    pub ibv_mr: ibv_mr,
    pub mr_type: c_uint,
    pub access: c_int,
}

/// `struct verbs_qp`: the `ibv_qp_ex` (whose first member is the `ibv_qp`), then
/// `comp_mask` (bit 1 `VERBS_QP_EX`: `ibv_qp_to_qp_ex` hands out `qp_ex`), then the XRC domain.
#[repr(C)]
pub struct verbs_qp {
    pub qp_ex: ibv_qp_ex,
    pub comp_mask: u32,
    pub xrcd: *mut c_void,
}

pub const VERBS_QP_EX: u32 = 1 << 1;

/// `struct verbs_context_ops` of ABI 34 as rdma-core v44 has it: 76 pointers, sorted by name.
/// Only the slots the provider serves are named; the rest stay null, which `verbs_set_ops`
/// leaves at libibverbs' own "not supported" answers.
#[repr(C)]
pub struct verbs_context_ops {
    pub slots: [Fp; VERBS_CONTEXT_OPS_SLOTS],
}

pub const VERBS_CONTEXT_OPS_SLOTS: usize = OPS_NAMES.len();

/// The slot names of `struct verbs_context_ops` (ABI 34), in order.
pub const OPS_NAMES: [&str; 76] = [
    "advise_mr",
    "alloc_dm",
    "alloc_mw",
    "alloc_null_mr",
    "alloc_parent_domain",
    "alloc_pd",
    "alloc_td",
    "async_event",
    "attach_counters_point_flow",
    "attach_mcast",
    "bind_mw",
    "close_xrcd",
    "cq_event",
    "create_ah",
    "create_counters",
    "create_cq",
    "create_cq_ex",
    "create_flow",
    "create_flow_action_esp",
    "create_qp",
    "create_qp_ex",
    "create_rwq_ind_table",
    "create_srq",
    "create_srq_ex",
    "create_wq",
    "dealloc_mw",
    "dealloc_pd",
    "dealloc_td",
    "dereg_mr",
    "destroy_ah",
    "destroy_counters",
    "destroy_cq",
    "destroy_flow",
    "destroy_flow_action",
    "destroy_qp",
    "destroy_rwq_ind_table",
    "destroy_srq",
    "destroy_wq",
    "detach_mcast",
    "free_context",
    "free_dm",
    "get_srq_num",
    "import_dm",
    "import_mr",
    "import_pd",
    "modify_cq",
    "modify_flow_action_esp",
    "modify_qp",
    "modify_qp_rate_limit",
    "modify_srq",
    "modify_wq",
    "open_qp",
    "open_xrcd",
    "poll_cq",
    "post_recv",
    "post_send",
    "post_srq_ops",
    "post_srq_recv",
    "query_device_ex",
    "query_ece",
    "query_port",
    "query_qp",
    "query_qp_data_in_order",
    "query_rt_values",
    "query_srq",
    "read_counters",
    "reg_dm_mr",
    "reg_dmabuf_mr",
    "reg_mr",
    "req_notify_cq",
    "rereg_mr",
    "resize_cq",
    "set_ece",
    "unimport_dm",
    "unimport_mr",
    "unimport_pd",
];

/// The slot index of `name` in `verbs_context_ops` (a compile-time lookup).
pub const fn slot(name: &str) -> usize {
    let mut i = 0;
    while i < OPS_NAMES.len() {
        if str_eq(OPS_NAMES[i], name) {
            return i;
        }
        i += 1;
    }
    panic!("no such verbs_context_ops slot")
}

const fn str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

// Layout facts that a wrong mirror would break at once (the probe checks all of them).
const _: () = assert!(
    core::mem::offset_of!(verbs_context, context) + core::mem::size_of::<ibv_context>()
        == core::mem::size_of::<verbs_context>()
);
