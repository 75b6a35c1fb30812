//! Mirrors of `<rdma/rdma_user_cm.h>`: the rdma_cm (ucma) `write()` command ABI of
//! `/dev/infiniband/rdma_cm` (ABI version 4), as librdmacm speaks it, plus the kernel enums
//! the command carries that the header leaves to `<rdma/rdma_cm.h>` / `<rdma/ib_cm.h>`
//! (event types, reject reasons) and `struct ib_uverbs_qp_attr` of `<rdma/ib_user_verbs.h>`
//! (the INIT_QP_ATTR response).
//!
//! A command is an [`RdmaUcmCmdHdr`] (command number, request and response lengths) followed
//! by the command's struct; a response goes to the user pointer in the request's `response`
//! field. Socket addresses travel as raw bytes (`struct sockaddr_in6`, 28 B, or
//! `struct __kernel_sockaddr_storage`, 128 B): [`SockAddr`] encodes and decodes them.
//!
//! Every struct has a `const` size assertion next to it; `tests/header_check_ucma.rs`
//! compares every size, field offset and constant with the installed kernel headers.

// zerocopy's derives emit helper types (without `Debug`) whose spans point into the
// `abi_struct!` macro below, so the lint fires on them; every struct here derives `Debug`.
#![allow(missing_debug_implementations)]

use zerocopy::{FromBytes, Immutable, IntoBytes};

/// The ucma ABI version (`/sys/class/misc/rdma_cm/abi_version`).
pub const RDMA_USER_CM_ABI_VERSION: u32 = 4;
/// Largest private data a command carries.
pub const RDMA_MAX_PRIVATE_DATA: usize = 256;

/// `enum` of ucma write commands.
pub mod cmd {
    /// create an id
    pub const CREATE_ID: u32 = 0;
    /// destroy an id
    pub const DESTROY_ID: u32 = 1;
    /// bind (sockaddr_in6-sized address)
    pub const BIND_IP: u32 = 2;
    /// resolve an address (sockaddr_in6-sized addresses)
    pub const RESOLVE_IP: u32 = 3;
    /// resolve the route
    pub const RESOLVE_ROUTE: u32 = 4;
    /// query addresses and paths (old form)
    pub const QUERY_ROUTE: u32 = 5;
    /// connect
    pub const CONNECT: u32 = 6;
    /// listen
    pub const LISTEN: u32 = 7;
    /// accept
    pub const ACCEPT: u32 = 8;
    /// reject
    pub const REJECT: u32 = 9;
    /// disconnect
    pub const DISCONNECT: u32 = 10;
    /// QP attributes for a transition
    pub const INIT_QP_ATTR: u32 = 11;
    /// read the next event (blocks)
    pub const GET_EVENT: u32 = 12;
    /// get an option (not implemented by Linux)
    pub const GET_OPTION: u32 = 13;
    /// set an option
    pub const SET_OPTION: u32 = 14;
    /// notify of a QP event
    pub const NOTIFY: u32 = 15;
    /// join a multicast group (sockaddr_in6-sized address)
    pub const JOIN_IP_MCAST: u32 = 16;
    /// leave a multicast group
    pub const LEAVE_MCAST: u32 = 17;
    /// move an id to another event channel
    pub const MIGRATE_ID: u32 = 18;
    /// query (address, path or GID)
    pub const QUERY: u32 = 19;
    /// bind (sockaddr_storage)
    pub const BIND: u32 = 20;
    /// resolve an address (sockaddr_storage)
    pub const RESOLVE_ADDR: u32 = 21;
    /// join a multicast group (sockaddr_storage, join flags)
    pub const JOIN_MCAST: u32 = 22;
    /// One past the last command.
    pub const COUNT: u32 = 23;
}

/// `enum rdma_ucm_port_space`.
pub mod ps {
    /// IPoIB
    pub const IPOIB: u16 = 0x0002;
    /// native IB (AF_IB)
    pub const IB: u16 = 0x013F;
    /// connected (RC), TCP-like
    pub const TCP: u16 = 0x0106;
    /// datagram (UD), UDP-like
    pub const UDP: u16 = 0x0111;
}

/// `RDMA_USER_CM_QUERY_*`: the `option` of [`RdmaUcmQuery`].
pub mod query {
    /// addresses, device, port, pkey
    pub const ADDR: u32 = 0;
    /// path records
    pub const PATH: u32 = 1;
    /// GIDs (as `sockaddr_ib`)
    pub const GID: u32 = 2;
}

/// `enum rdma_cm_event_type` (`<rdma/rdma_cm.h>`, librdmacm's `<rdma/rdma_cma.h>`).
pub mod event {
    /// address resolved
    pub const ADDR_RESOLVED: u32 = 0;
    /// address resolution failed
    pub const ADDR_ERROR: u32 = 1;
    /// route resolved
    pub const ROUTE_RESOLVED: u32 = 2;
    /// route resolution failed
    pub const ROUTE_ERROR: u32 = 3;
    /// a REQ reached a listener
    pub const CONNECT_REQUEST: u32 = 4;
    /// a REP reached the active side
    pub const CONNECT_RESPONSE: u32 = 5;
    /// the connection could not be made
    pub const CONNECT_ERROR: u32 = 6;
    /// the peer did not answer
    pub const UNREACHABLE: u32 = 7;
    /// the peer rejected
    pub const REJECTED: u32 = 8;
    /// connected
    pub const ESTABLISHED: u32 = 9;
    /// disconnected
    pub const DISCONNECTED: u32 = 10;
    /// the device went away
    pub const DEVICE_REMOVAL: u32 = 11;
    /// joined a multicast group
    pub const MULTICAST_JOIN: u32 = 12;
    /// multicast error
    pub const MULTICAST_ERROR: u32 = 13;
    /// the address changed
    pub const ADDR_CHANGE: u32 = 14;
    /// time-wait over
    pub const TIMEWAIT_EXIT: u32 = 15;
}

/// `enum ib_cm_rej_reason` values the emulated CM sends (`<rdma/ib_cm.h>`; IBTA table 112).
pub mod rej {
    /// no QP resources
    pub const NO_QP: u8 = 1;
    /// invalid communication id
    pub const INVALID_COMM_ID: u8 = 5;
    /// no listener for the service id
    pub const INVALID_SERVICE_ID: u8 = 8;
    /// stale connection
    pub const STALE_CONN: u8 = 10;
    /// the consumer (application) rejected
    pub const CONSUMER_DEFINED: u8 = 28;
    /// timeout
    pub const TIMEOUT: u8 = 26;
}

/// `RDMA_OPTION_*` levels and names.
pub mod option {
    /// level: the id
    pub const ID: u32 = 0;
    /// level: InfiniBand
    pub const IB: u32 = 1;
    /// ID: type of service
    pub const ID_TOS: u32 = 0;
    /// ID: reuse address
    pub const ID_REUSEADDR: u32 = 1;
    /// ID: address family only
    pub const ID_AFONLY: u32 = 2;
    /// ID: ACK timeout
    pub const ID_ACK_TIMEOUT: u32 = 3;
    /// IB: path records
    pub const IB_PATH: u32 = 1;
}

/// The QKey rdma_cm gives UD ids of the UDP/IPoIB port spaces (`RDMA_UDP_QKEY`).
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// Address family numbers found in the address bytes.
pub mod af {
    /// IPv4
    pub const INET: u16 = 2;
    /// IPv6
    pub const INET6: u16 = 10;
    /// native InfiniBand (`AF_IB`)
    pub const IB: u16 = 27;
}

macro_rules! abi_struct {
    ($(#[$m:meta])* $name:ident, $size:expr, { $($(#[$fm:meta])* $f:ident : $t:ty),* $(,)? }) => {
        $(#[$m])*
        #[repr(C)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, Immutable)]
        pub struct $name { $($(#[$fm])* pub $f: $t),* }
        const _: () = assert!(size_of::<$name>() == $size);
        impl Default for $name {
            fn default() -> Self {
                zerocopy::FromZeros::new_zeroed()
            }
        }
    };
}

abi_struct!(
    /// `struct rdma_ucm_cmd_hdr` (8 B): before every command.
    RdmaUcmCmdHdr, 8, {
    /// command number ([`cmd`])
    cmd: u32,
    /// bytes of the command struct after this header
    r#in: u16,
    /// bytes of the response
    out: u16,
});

abi_struct!(
    /// `struct rdma_ucm_create_id` (24 B).
    RdmaUcmCreateId, 24, {
    /// user context, echoed in events
    uid: u64,
    /// user pointer of the response
    response: u64,
    /// port space ([`ps`])
    ps: u16,
    /// `enum ibv_qp_type`
    qp_type: u8,
    /// zero
    reserved: [u8; 5],
});

abi_struct!(
    /// `struct rdma_ucm_create_id_resp` (4 B).
    RdmaUcmCreateIdResp, 4, { id: u32 });

abi_struct!(
    /// `struct rdma_ucm_destroy_id` (16 B).
    RdmaUcmDestroyId, 16, { response: u64, id: u32, reserved: u32 });

abi_struct!(
    /// `struct rdma_ucm_destroy_id_resp` (4 B).
    RdmaUcmDestroyIdResp, 4, { events_reported: u32 });

abi_struct!(
    /// `struct rdma_ucm_bind_ip` (40 B).
    RdmaUcmBindIp, 40, { response: u64, addr: [u8; 28], id: u32 });

abi_struct!(
    /// `struct rdma_ucm_bind` (136 B).
    RdmaUcmBind, 136, { id: u32, addr_size: u16, reserved: u16, addr: [u8; 128] });

abi_struct!(
    /// `struct rdma_ucm_resolve_ip` (64 B).
    RdmaUcmResolveIp, 64, {
    src_addr: [u8; 28], dst_addr: [u8; 28], id: u32, timeout_ms: u32 });

abi_struct!(
    /// `struct rdma_ucm_resolve_addr` (272 B).
    RdmaUcmResolveAddr, 272, {
    id: u32, timeout_ms: u32, src_size: u16, dst_size: u16, reserved: u32,
    src_addr: [u8; 128], dst_addr: [u8; 128] });

abi_struct!(
    /// `struct rdma_ucm_resolve_route` (8 B).
    RdmaUcmResolveRoute, 8, { id: u32, timeout_ms: u32 });

abi_struct!(
    /// `struct rdma_ucm_query` (16 B): QUERY_ROUTE and QUERY.
    RdmaUcmQuery, 16, { response: u64, id: u32, option: u32 });

abi_struct!(
    /// `struct ib_user_path_rec` (64 B, `<rdma/ib_user_sa.h>`): LIDs and P_Key big-endian.
    IbUserPathRec, 64, {
    dgid: [u8; 16], sgid: [u8; 16], dlid: u16, slid: u16, raw_traffic: u32,
    flow_label: u32, reversible: u32, mtu: u32, pkey: u16, hop_limit: u8,
    traffic_class: u8, numb_path: u8, sl: u8, mtu_selector: u8, rate_selector: u8,
    rate: u8, packet_life_time_selector: u8, packet_life_time: u8, preference: u8 });

abi_struct!(
    /// `struct rdma_ucm_query_route_resp` (208 B).
    RdmaUcmQueryRouteResp, 208, {
    node_guid: u64, ib_route: [IbUserPathRec; 2], src_addr: [u8; 28], dst_addr: [u8; 28],
    num_paths: u32, port_num: u8, reserved: [u8; 3], ibdev_index: u32, reserved1: u32 });

abi_struct!(
    /// `struct rdma_ucm_query_addr_resp` (280 B).
    RdmaUcmQueryAddrResp, 280, {
    node_guid: u64, port_num: u8, reserved: u8, pkey: u16, src_size: u16, dst_size: u16,
    src_addr: [u8; 128], dst_addr: [u8; 128], ibdev_index: u32, reserved1: u32 });

abi_struct!(
    /// `struct ib_path_rec_data` (72 B, `<rdma/ib_user_sa.h>`): `path_rec` is an SA
    /// PathRecord in wire format (big-endian).
    IbPathRecData, 72, { flags: u32, reserved: u32, path_rec: [u32; 16] });

abi_struct!(
    /// `struct rdma_ucm_query_path_resp` (8 B, then `num_paths` [`IbPathRecData`]).
    RdmaUcmQueryPathResp, 8, { num_paths: u32, reserved: u32 });

abi_struct!(
    /// `struct rdma_ucm_conn_param` (272 B).
    RdmaUcmConnParam, 272, {
    qp_num: u32, qkey: u32, private_data: [u8; 256], private_data_len: u8, srq: u8,
    responder_resources: u8, initiator_depth: u8, flow_control: u8, retry_count: u8,
    rnr_retry_count: u8, valid: u8 });

abi_struct!(
    /// `struct rdma_ucm_ud_param` (304 B).
    RdmaUcmUdParam, 304, {
    qp_num: u32, qkey: u32, ah_attr: crate::uverbs::IbUverbsAhAttr, private_data: [u8; 256],
    private_data_len: u8, reserved: [u8; 7] });

abi_struct!(
    /// `struct rdma_ucm_ece` (8 B).
    RdmaUcmEce, 8, { vendor_id: u32, attr_mod: u32 });

abi_struct!(
    /// `struct rdma_ucm_connect` (288 B).
    RdmaUcmConnect, 288, { conn_param: RdmaUcmConnParam, id: u32, reserved: u32, ece: RdmaUcmEce });

abi_struct!(
    /// `struct rdma_ucm_listen` (8 B).
    RdmaUcmListen, 8, { id: u32, backlog: u32 });

abi_struct!(
    /// `struct rdma_ucm_accept` (296 B).
    RdmaUcmAccept, 296, {
    uid: u64, conn_param: RdmaUcmConnParam, id: u32, reserved: u32, ece: RdmaUcmEce });

abi_struct!(
    /// `struct rdma_ucm_reject` (264 B).
    RdmaUcmReject, 264, {
    id: u32, private_data_len: u8, reason: u8, reserved: [u8; 2], private_data: [u8; 256] });

abi_struct!(
    /// `struct rdma_ucm_disconnect` (4 B).
    RdmaUcmDisconnect, 4, { id: u32 });

abi_struct!(
    /// `struct rdma_ucm_init_qp_attr` (16 B).
    RdmaUcmInitQpAttr, 16, { response: u64, id: u32, qp_state: u32 });

abi_struct!(
    /// `struct rdma_ucm_notify` (8 B).
    RdmaUcmNotify, 8, { id: u32, event: u32 });

abi_struct!(
    /// `struct rdma_ucm_join_ip_mcast` (48 B).
    RdmaUcmJoinIpMcast, 48, { response: u64, uid: u64, addr: [u8; 28], id: u32 });

abi_struct!(
    /// `struct rdma_ucm_join_mcast` (152 B).
    RdmaUcmJoinMcast, 152, {
    response: u64, uid: u64, id: u32, addr_size: u16, join_flags: u16, addr: [u8; 128] });

abi_struct!(
    /// `struct rdma_ucm_get_event` (8 B).
    RdmaUcmGetEvent, 8, { response: u64 });

abi_struct!(
    /// `struct rdma_ucm_event_resp` (336 B). `param` is the union of
    /// [`RdmaUcmConnParam`] (connected ids) and [`RdmaUcmUdParam`] (UD ids, multicast).
    RdmaUcmEventResp, 336, {
    uid: u64, id: u32, event: u32, status: u32, param: [u8; 304], reserved: u32,
    ece: RdmaUcmEce });

impl RdmaUcmEventResp {
    /// Put connection parameters into `param`.
    pub fn set_conn(&mut self, p: &RdmaUcmConnParam) {
        self.param = [0; 304];
        self.param[..size_of::<RdmaUcmConnParam>()].copy_from_slice(p.as_bytes());
    }

    /// Put UD parameters into `param`.
    pub fn set_ud(&mut self, p: &RdmaUcmUdParam) {
        self.param.copy_from_slice(p.as_bytes());
    }

    /// `param` read as connection parameters.
    pub fn conn(&self) -> RdmaUcmConnParam {
        RdmaUcmConnParam::read_from_prefix(&self.param)
            .map(|(p, _)| p)
            .unwrap_or_default()
    }

    /// `param` read as UD parameters.
    pub fn ud(&self) -> RdmaUcmUdParam {
        RdmaUcmUdParam::read_from_bytes(&self.param).unwrap_or_default()
    }
}

abi_struct!(
    /// `struct rdma_ucm_set_option` (24 B).
    RdmaUcmSetOption, 24, { optval: u64, id: u32, level: u32, optname: u32, optlen: u32 });

abi_struct!(
    /// `struct rdma_ucm_migrate_id` (16 B).
    RdmaUcmMigrateId, 16, { response: u64, id: u32, fd: u32 });

abi_struct!(
    /// `struct rdma_ucm_migrate_resp` (4 B).
    RdmaUcmMigrateResp, 4, { events_reported: u32 });

abi_struct!(
    /// `struct ib_uverbs_qp_attr` (144 B, `<rdma/ib_user_verbs.h>`): the INIT_QP_ATTR
    /// response, in the layout `ibv_copy_qp_attr_from_kern` reads.
    IbUverbsQpAttr, 144, {
    qp_attr_mask: u32, qp_state: u32, cur_qp_state: u32, path_mtu: u32, path_mig_state: u32,
    qkey: u32, rq_psn: u32, sq_psn: u32, dest_qp_num: u32, qp_access_flags: u32,
    ah_attr: crate::uverbs::IbUverbsAhAttr, alt_ah_attr: crate::uverbs::IbUverbsAhAttr,
    max_send_wr: u32, max_recv_wr: u32, max_send_sge: u32, max_recv_sge: u32,
    max_inline_data: u32, pkey_index: u16, alt_pkey_index: u16, en_sqd_async_notify: u8,
    sq_draining: u8, max_rd_atomic: u8, max_dest_rd_atomic: u8, min_rnr_timer: u8,
    port_num: u8, timeout: u8, retry_cnt: u8, rnr_retry: u8, alt_port_num: u8,
    alt_timeout: u8, reserved: [u8; 5] });

/// A socket address as the ucma carries it: IPv4, IPv6 or `AF_IB` (the latter only as a
/// family and service id: the emulated CM has no native-IB addressing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SockAddr {
    /// `sockaddr_in`: address and port (host order values).
    V4 {
        /// the address
        ip: [u8; 4],
        /// the port
        port: u16,
    },
    /// `sockaddr_in6`.
    V6 {
        /// the address
        ip: [u8; 16],
        /// the port
        port: u16,
        /// the scope id
        scope: u32,
    },
    /// `sockaddr_ib`: its service id (host order).
    Ib {
        /// `sib_sid`
        sid: u64,
    },
}

impl SockAddr {
    /// Decode the address at the start of `b` (the family decides the size); `None` for an
    /// unknown family or too few bytes.
    pub fn decode(b: &[u8]) -> Option<SockAddr> {
        let fam = u16::from_ne_bytes([*b.first()?, *b.get(1)?]);
        let port = u16::from_be_bytes([*b.get(2)?, *b.get(3)?]);
        match fam {
            af::INET => Some(SockAddr::V4 {
                ip: b.get(4..8)?.try_into().ok()?,
                port,
            }),
            af::INET6 => Some(SockAddr::V6 {
                ip: b.get(8..24)?.try_into().ok()?,
                port,
                scope: u32::from_ne_bytes(b.get(24..28)?.try_into().ok()?),
            }),
            af::IB => Some(SockAddr::Ib {
                sid: u64::from_be_bytes(b.get(24..32)?.try_into().ok()?),
            }),
            _ => None,
        }
    }

    /// Size of the C struct (`sockaddr_in` 16, `sockaddr_in6` 28, `sockaddr_ib` 48).
    pub fn len(&self) -> usize {
        match self {
            SockAddr::V4 { .. } => 16,
            SockAddr::V6 { .. } => 28,
            SockAddr::Ib { .. } => 48,
        }
    }

    /// Never empty (for clippy's `len_without_is_empty`).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Encode into the start of `out` (which must hold [`SockAddr::len`] bytes; shorter
    /// buffers get what fits).
    pub fn encode(&self, out: &mut [u8]) {
        let mut b = [0u8; 48];
        match *self {
            SockAddr::V4 { ip, port } => {
                b[0..2].copy_from_slice(&af::INET.to_ne_bytes());
                b[2..4].copy_from_slice(&port.to_be_bytes());
                b[4..8].copy_from_slice(&ip);
            }
            SockAddr::V6 { ip, port, scope } => {
                b[0..2].copy_from_slice(&af::INET6.to_ne_bytes());
                b[2..4].copy_from_slice(&port.to_be_bytes());
                b[8..24].copy_from_slice(&ip);
                b[24..28].copy_from_slice(&scope.to_ne_bytes());
            }
            SockAddr::Ib { sid } => {
                b[0..2].copy_from_slice(&af::IB.to_ne_bytes());
                b[24..32].copy_from_slice(&sid.to_be_bytes());
            }
        }
        let n = self.len().min(out.len());
        out[..n].copy_from_slice(&b[..n]);
    }

    /// The port (0 for `AF_IB`).
    pub fn port(&self) -> u16 {
        match *self {
            SockAddr::V4 { port, .. } | SockAddr::V6 { port, .. } => port,
            SockAddr::Ib { .. } => 0,
        }
    }

    /// The same address with another port.
    pub fn with_port(mut self, p: u16) -> SockAddr {
        match &mut self {
            SockAddr::V4 { port, .. } | SockAddr::V6 { port, .. } => *port = p,
            SockAddr::Ib { .. } => {}
        }
        self
    }

    /// The IPv4 address, also of an IPv4-mapped IPv6 address.
    pub fn ipv4(&self) -> Option<[u8; 4]> {
        match *self {
            SockAddr::V4 { ip, .. } => Some(ip),
            SockAddr::V6 { ip, .. } if ip[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff] => {
                Some([ip[12], ip[13], ip[14], ip[15]])
            }
            _ => None,
        }
    }

    /// The wildcard address (`0.0.0.0`, `::`).
    pub fn is_any(&self) -> bool {
        match *self {
            SockAddr::V4 { ip, .. } => ip == [0; 4],
            SockAddr::V6 { ip, .. } => ip == [0; 16],
            SockAddr::Ib { .. } => false,
        }
    }

    /// As raw IPv6-form bytes (IPv4 mapped), for GIDs and the CM's addresses.
    pub fn ip16(&self) -> [u8; 16] {
        match *self {
            SockAddr::V4 { ip, .. } => {
                let mut g = [0u8; 16];
                g[10] = 0xff;
                g[11] = 0xff;
                g[12..].copy_from_slice(&ip);
                g
            }
            SockAddr::V6 { ip, .. } => ip,
            SockAddr::Ib { .. } => [0; 16],
        }
    }
}

/// Bytes of a command: header then struct.
pub fn encode_cmd<T: IntoBytes + Immutable>(cmd: u32, body: &T, out_len: usize) -> Vec<u8> {
    let hdr = RdmaUcmCmdHdr {
        cmd,
        r#in: size_of::<T>() as u16,
        out: out_len.min(u16::MAX as usize) as u16,
    };
    let mut v = hdr.as_bytes().to_vec();
    v.extend_from_slice(body.as_bytes());
    v
}

// ---------------------------------------------------------------------------------------
// The multicast attach of rdma_cm's UD users (uverbs, not ucma: `ibv_attach_mcast` after a
// MULTICAST_JOIN; librdmacm's `rdma_join_multicast` issues it for an id's QP)

/// `struct ib_uverbs_attach_mcast` (24 B; `ib_uverbs_detach_mcast` has the same layout):
/// the group's GID and LID and the QP to attach.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, Immutable, zerocopy::KnownLayout,
)]
pub struct IbUverbsAttachMcast {
    /// the group's MGID (wire order)
    pub gid: [u8; 16],
    /// the QP's handle
    pub qp_handle: u32,
    /// the group's MLID (0xc000..=0xfffe on InfiniBand)
    pub mlid: u16,
    /// zero
    pub reserved: u16,
}
const _: () = assert!(size_of::<IbUverbsAttachMcast>() == 24);

impl Default for IbUverbsAttachMcast {
    fn default() -> Self {
        zerocopy::FromZeros::new_zeroed()
    }
}

/// Command marker: ATTACH_MCAST (no response).
#[derive(Debug, Clone, Copy)]
pub struct AttachMcast;
impl crate::cmd::Command for AttachMcast {
    const ID: u32 = crate::uverbs::IB_USER_VERBS_CMD_ATTACH_MCAST;
    const NAME: &'static str = "ATTACH_MCAST";
    const EXTENDED: bool = false;
    const RESPONSE_PTR: bool = false;
    type Req = IbUverbsAttachMcast;
    type Resp = ();
    type DrvReq = ();
    type DrvResp = ();
}

/// Command marker: DETACH_MCAST (no response).
#[derive(Debug, Clone, Copy)]
pub struct DetachMcast;
impl crate::cmd::Command for DetachMcast {
    const ID: u32 = crate::uverbs::IB_USER_VERBS_CMD_DETACH_MCAST;
    const NAME: &'static str = "DETACH_MCAST";
    const EXTENDED: bool = false;
    const RESPONSE_PTR: bool = false;
    type Req = IbUverbsAttachMcast;
    type Resp = ();
    type DrvReq = ();
    type DrvResp = ();
}
