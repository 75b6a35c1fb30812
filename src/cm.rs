//! The connection manager: rdma_cm, spoken to the kernel's ucma ABI
//! (`/dev/infiniband/rdma_cm`, typed in [`mlx5_ffi::ucma`]) as librdmacm speaks it, so this
//! driver connects to (and accepts from) any rdma_cm program: `rping`, `ucmatose`, perftest's
//! `-R`, libfabric, NVMe-oF.
//!
//! * [`EventChannel`]: one open rdma_cm file (on a real kernel, or the emulator's with the
//!   `emulator` feature: [`EventChannel::open`]); its events are read in order, and the
//!   descriptor ([`EventChannel::fd`]) is pollable.
//! * [`CmId`]: one id. The typed steps: [`CmId::connect`] (resolve the address and route,
//!   REQ, and, on the REP, the QP moved INIT -> RTR -> RTS with the attributes the kernel
//!   gives, RTU), [`CmId::listen`] then [`CmId::get_request`] -> [`ConnRequest`] ->
//!   [`ConnRequest::accept`] (the QP moved to RTS, REP, ESTABLISHED), UD addressing through
//!   SIDR ([`CmId::connect_ud`] -> [`UdPeer`]), [`CmId::disconnect`] and
//!   [`CmId::wait_disconnected`], and the private data of REQ and REP.
//!
//! Every failure names the step: a refused command is [`Error::Uverbs`] with the command's
//! name and the kernel's errno; a REJECT, a timeout or an unexpected event is
//! [`Error::Uverbs`] naming the event (`ECONNREFUSED` with the reject reason, `ETIMEDOUT`,
//! `EPROTO`). Nothing here is on the fast path.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mlx5_ffi::surface::{UverbsFd, UverbsSurface};
use mlx5_ffi::ucma::{
    IbUverbsQpAttr, RdmaUcmAccept, RdmaUcmBind, RdmaUcmConnParam, RdmaUcmConnect, RdmaUcmCreateId,
    RdmaUcmCreateIdResp, RdmaUcmDestroyId, RdmaUcmDisconnect, RdmaUcmEventResp, RdmaUcmGetEvent,
    RdmaUcmInitQpAttr, RdmaUcmJoinMcast, RdmaUcmListen, RdmaUcmReject, RdmaUcmResolveAddr,
    RdmaUcmResolveRoute, SockAddr, cmd, event, ps,
};

use crate::ah::{AhAttr, GlobalRoute};
use crate::error::{Error, Result};
use crate::pd::Access;
use crate::qp::{Mtu, Qp, QpAttr, QpState};
use crate::uverbs::ucma::command;

/// The rdma_cm device node.
pub const RDMA_CM_NODE: &str = "/dev/infiniband/rdma_cm";

/// How long each step of a connection may take.
const STEP: Duration = Duration::from_secs(20);

/// One open rdma_cm file.
#[derive(Debug)]
pub struct EventChannel {
    surface: Arc<dyn UverbsSurface>,
    /// The pollable descriptor (the emulator's event fd; for a real file, its own).
    poll_fd: Option<OwnedFd>,
    /// Events read while waiting for another id's.
    pending: RefCell<VecDeque<CmEvent>>,
}

/// An rdma_cm event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CmEvent {
    /// `RDMA_CM_EVENT_*` ([`mlx5_ffi::ucma::event`]).
    pub kind: u32,
    /// The status (0, a reject reason, or a negative errno).
    pub status: i32,
    /// The kernel id it concerns (the new id for a connection request).
    pub id: u32,
    /// The peer's QP number (connection request, response; UD: the resolved QP).
    pub qp_num: u32,
    /// The peer's Q_Key (UD).
    pub qkey: u32,
    /// The private data the message carried (all of it: the kernel pads it to the
    /// message's size).
    pub private_data: Vec<u8>,
    /// The peer's responder resources / initiator depth as this side must use them.
    pub responder_resources: u8,
    /// See `responder_resources`.
    pub initiator_depth: u8,
    /// UD: the address vector to the peer.
    pub ah: Option<AhAttr>,
}

/// The port space of an id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortSpace {
    /// Connected (RC), like TCP.
    Tcp,
    /// Datagram (UD), like UDP.
    Udp,
}

impl EventChannel {
    /// The kernel's rdma_cm ([`RDMA_CM_NODE`]).
    ///
    /// # Errors
    /// [`Error::Os`] if the node cannot be opened.
    pub fn open_device() -> Result<EventChannel> {
        let f = UverbsFd::open(std::path::Path::new(RDMA_CM_NODE)).map_err(|e| Error::Os {
            op: "open(/dev/infiniband/rdma_cm)",
            errno: crate::error::Errno::from_raw(e.0),
        })?;
        Ok(EventChannel {
            surface: Arc::new(f),
            poll_fd: None,
            pending: RefCell::new(VecDeque::new()),
        })
    }

    /// The rdma_cm of `hca`'s kernel: the real one for a device, the emulator's for an
    /// emulated HCA.
    ///
    /// # Errors
    /// As [`EventChannel::open_device`]; [`Error::Os`] if the emulator refuses.
    #[cfg(feature = "emulator")]
    pub fn open(hca: &crate::emulator::Hca) -> Result<EventChannel> {
        match hca {
            crate::emulator::Hca::Device(_) => Self::open_device(),
            crate::emulator::Hca::Emulated(emu) => {
                let o = emu.open_rdma_cm().map_err(|e| Error::Os {
                    op: "open(emulated rdma_cm)",
                    errno: crate::error::Errno::from_raw(e.0),
                })?;
                Ok(EventChannel {
                    surface: o.file,
                    poll_fd: Some(o.fd),
                    pending: RefCell::new(VecDeque::new()),
                })
            }
        }
    }

    /// An rdma_cm file behind any command surface (e.g. the emulator's, opened by a program
    /// that links the emulator itself), with the descriptor that is readable while events
    /// are queued, if it has one apart from the surface.
    pub fn with_surface(surface: Arc<dyn UverbsSurface>, poll_fd: Option<OwnedFd>) -> Self {
        EventChannel {
            surface,
            poll_fd,
            pending: RefCell::new(VecDeque::new()),
        }
    }

    /// The descriptor to poll for events, if this file has one of its own (the emulator's;
    /// a real rdma_cm file is polled through its own descriptor, which the surface keeps).
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.poll_fd.as_ref().map(|f| f.as_fd_borrowed())
    }

    fn cmd<T: zerocopy::IntoBytes + zerocopy::Immutable>(
        &self,
        c: u32,
        name: &'static str,
        body: T,
        set: impl FnOnce(&mut T, u64),
        out: usize,
    ) -> Result<crate::uverbs::RespBuf> {
        command(&*self.surface, c, name, body, set, out)
    }

    /// Create an id in port space `ps`.
    ///
    /// # Errors
    /// As the kernel's CREATE_ID.
    pub fn create_id(&self, space: PortSpace) -> Result<CmId<'_>> {
        let body = RdmaUcmCreateId {
            // The uid comes back in every event of the id (and of a listener's connection
            // requests): it tells UD events, whose parameters are UD ones, from RC events.
            uid: match space {
                PortSpace::Tcp => UID_RC,
                PortSpace::Udp => UID_UD,
            },
            ps: match space {
                PortSpace::Tcp => ps::TCP,
                PortSpace::Udp => ps::UDP,
            },
            ..Default::default()
        };
        let r = self.cmd(
            cmd::CREATE_ID,
            "rdma_cm CREATE_ID",
            body,
            |b, a| b.response = a,
            size_of::<RdmaUcmCreateIdResp>(),
        )?;
        Ok(CmId {
            chan: self,
            id: r.get::<RdmaUcmCreateIdResp>(0).id,
            space,
        })
    }

    /// The next event within `timeout` (`None` if none came).
    ///
    /// # Errors
    /// As the kernel's GET_EVENT.
    pub fn event(&self, timeout: Duration) -> Result<Option<CmEvent>> {
        if let Some(e) = self.pending.borrow_mut().pop_front() {
            return Ok(Some(e));
        }
        if let Some(fd) = &self.poll_fd {
            let mut p = libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
            if !crate::uverbs::ucma::poll_one(&mut p, ms) {
                return Ok(None);
            }
        }
        let r = self.cmd(
            cmd::GET_EVENT,
            "rdma_cm GET_EVENT",
            RdmaUcmGetEvent::default(),
            |b, a| b.response = a,
            size_of::<RdmaUcmEventResp>(),
        )?;
        let e: RdmaUcmEventResp = r.get(0);
        Ok(Some(decode_event(&e)))
    }

    /// Wait for the next event of kernel id `id` (others are kept for later); it must be
    /// `kind`.
    fn wait(&self, id: u32, kind: u32, what: &'static str) -> Result<CmEvent> {
        let deadline = Instant::now() + STEP;
        let mut kept = Vec::new();
        let res = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break Err(Error::uverbs(what, libc::ETIMEDOUT));
            }
            // Only fresh events: the kept ones are not for `id`.
            let e = {
                let queued = self.pending.borrow_mut().pop_front();
                match queued {
                    Some(e) => Some(e),
                    None => {
                        let saved = std::mem::take(&mut *self.pending.borrow_mut());
                        let e = self.event(left.min(Duration::from_millis(100)));
                        *self.pending.borrow_mut() = saved;
                        e?
                    }
                }
            };
            let Some(e) = e else { continue };
            if e.id != id {
                kept.push(e);
                continue;
            }
            if e.kind == kind && (e.status == 0 || kind == event::DISCONNECTED) {
                break Ok(e);
            }
            let errno = match e.kind {
                event::REJECTED => libc::ECONNREFUSED,
                event::UNREACHABLE | event::ADDR_ERROR | event::ROUTE_ERROR => {
                    if e.status < 0 {
                        -e.status
                    } else {
                        libc::EHOSTUNREACH
                    }
                }
                _ => libc::EPROTO,
            };
            break Err(Error::uverbs(event_name(e.kind), errno));
        };
        self.pending.borrow_mut().extend(kept);
        res
    }
}

trait AsFdBorrowed {
    fn as_fd_borrowed(&self) -> BorrowedFd<'_>;
}

impl AsFdBorrowed for OwnedFd {
    fn as_fd_borrowed(&self) -> BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(self)
    }
}

/// The name of an event kind (as librdmacm's `rdma_event_str`).
pub fn event_name(kind: u32) -> &'static str {
    match kind {
        event::ADDR_RESOLVED => "RDMA_CM_EVENT_ADDR_RESOLVED",
        event::ADDR_ERROR => "RDMA_CM_EVENT_ADDR_ERROR",
        event::ROUTE_RESOLVED => "RDMA_CM_EVENT_ROUTE_RESOLVED",
        event::ROUTE_ERROR => "RDMA_CM_EVENT_ROUTE_ERROR",
        event::CONNECT_REQUEST => "RDMA_CM_EVENT_CONNECT_REQUEST",
        event::CONNECT_RESPONSE => "RDMA_CM_EVENT_CONNECT_RESPONSE",
        event::CONNECT_ERROR => "RDMA_CM_EVENT_CONNECT_ERROR",
        event::UNREACHABLE => "RDMA_CM_EVENT_UNREACHABLE",
        event::REJECTED => "RDMA_CM_EVENT_REJECTED",
        event::ESTABLISHED => "RDMA_CM_EVENT_ESTABLISHED",
        event::DISCONNECTED => "RDMA_CM_EVENT_DISCONNECTED",
        event::DEVICE_REMOVAL => "RDMA_CM_EVENT_DEVICE_REMOVAL",
        event::MULTICAST_JOIN => "RDMA_CM_EVENT_MULTICAST_JOIN",
        event::MULTICAST_ERROR => "RDMA_CM_EVENT_MULTICAST_ERROR",
        event::ADDR_CHANGE => "RDMA_CM_EVENT_ADDR_CHANGE",
        event::TIMEWAIT_EXIT => "RDMA_CM_EVENT_TIMEWAIT_EXIT",
        _ => "unknown rdma_cm event",
    }
}

/// The uids this module gives ids (see [`EventChannel::create_id`]).
const UID_RC: u64 = 1;
const UID_UD: u64 = 2;

fn decode_event(e: &RdmaUcmEventResp) -> CmEvent {
    if e.uid == UID_UD {
        let u = e.ud();
        let a = u.ah_attr;
        return CmEvent {
            kind: e.event,
            status: e.status as i32,
            id: e.id,
            qp_num: u.qp_num,
            qkey: u.qkey,
            private_data: u.private_data[..usize::from(u.private_data_len).min(256)].to_vec(),
            responder_resources: 0,
            initiator_depth: 0,
            ah: Some(ah_of(&a)),
        };
    }
    let c = e.conn();
    CmEvent {
        kind: e.event,
        status: e.status as i32,
        id: e.id,
        qp_num: c.qp_num,
        qkey: c.qkey,
        private_data: c.private_data[..usize::from(c.private_data_len).min(256)].to_vec(),
        responder_resources: c.responder_resources,
        initiator_depth: c.initiator_depth,
        ah: None,
    }
}

fn ah_of(a: &mlx5_ffi::uverbs::IbUverbsAhAttr) -> AhAttr {
    AhAttr {
        dlid: a.dlid,
        sl: a.sl,
        src_path_bits: a.src_path_bits,
        static_rate: a.static_rate,
        port_num: a.port_num,
        grh: (a.is_global != 0).then_some(GlobalRoute {
            dgid: a.grh.dgid,
            flow_label: a.grh.flow_label,
            sgid_index: a.grh.sgid_index,
            hop_limit: a.grh.hop_limit,
            traffic_class: a.grh.traffic_class,
        }),
    }
}

fn sock(a: SocketAddr) -> SockAddr {
    match a {
        SocketAddr::V4(v) => SockAddr::V4 {
            ip: v.ip().octets(),
            port: v.port(),
        },
        SocketAddr::V6(v) => SockAddr::V6 {
            ip: v.ip().octets(),
            port: v.port(),
            scope: v.scope_id(),
        },
    }
}

fn sa128(a: SockAddr) -> [u8; 128] {
    let mut b = [0u8; 128];
    a.encode(&mut b);
    b
}

/// Connection parameters of a REQ or REP.
#[derive(Clone, Copy, Debug)]
pub struct ConnParam<'a> {
    /// Private data (at most 56 bytes in a REQ, 196 in a REP).
    pub private_data: &'a [u8],
    /// READs/atomics this side answers at once.
    pub responder_resources: u8,
    /// READs/atomics this side has outstanding at once.
    pub initiator_depth: u8,
    /// Transport retries (0..=7).
    pub retry_count: u8,
    /// RNR retries (7 = forever).
    pub rnr_retry_count: u8,
}

impl Default for ConnParam<'_> {
    fn default() -> Self {
        ConnParam {
            private_data: &[],
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
        }
    }
}

impl ConnParam<'_> {
    fn to_kern(self, qp_num: u32) -> Result<RdmaUcmConnParam> {
        if self.private_data.len() > 196 {
            return Err(Error::InvalidArgument {
                attr: "private_data",
                reason: "longer than a REP carries (196 bytes)",
            });
        }
        let mut p = RdmaUcmConnParam {
            qp_num,
            private_data_len: self.private_data.len() as u8,
            responder_resources: self.responder_resources,
            initiator_depth: self.initiator_depth,
            retry_count: self.retry_count,
            rnr_retry_count: self.rnr_retry_count,
            valid: 1,
            ..Default::default()
        };
        p.private_data[..self.private_data.len()].copy_from_slice(self.private_data);
        Ok(p)
    }
}

/// One rdma_cm id; destroyed on drop.
#[derive(Debug)]
pub struct CmId<'c> {
    chan: &'c EventChannel,
    id: u32,
    space: PortSpace,
}

/// A connection request a listener received: accept it with a QP, or reject it.
#[derive(Debug)]
pub struct ConnRequest<'c> {
    /// The new id (the connection's).
    pub id: CmId<'c>,
    /// The request's event (private data, the peer's QP).
    pub event: CmEvent,
}

/// A UD peer resolved through SIDR.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UdPeer {
    /// Its QP number.
    pub qpn: u32,
    /// Its Q_Key.
    pub qkey: u32,
    /// The address vector to reach it.
    pub ah: AhAttr,
    /// The private data of its SIDR REP.
    pub private_data: Vec<u8>,
}

impl<'c> CmId<'c> {
    /// The kernel's number of this id.
    pub fn raw(&self) -> u32 {
        self.id
    }

    fn simple<T: zerocopy::IntoBytes + zerocopy::Immutable>(
        &self,
        c: u32,
        name: &'static str,
        body: T,
    ) -> Result<()> {
        self.chan.cmd(c, name, body, |_, _| {}, 0).map(drop)
    }

    /// Bind to a local address (port 0: an ephemeral one).
    ///
    /// # Errors
    /// As the kernel's BIND (`EADDRINUSE`, `EADDRNOTAVAIL`, `EINVAL`).
    pub fn bind(&self, addr: SocketAddr) -> Result<()> {
        let a = sock(addr);
        let body = RdmaUcmBind {
            id: self.id,
            addr_size: a.len() as u16,
            reserved: 0,
            addr: sa128(a),
        };
        self.simple(cmd::BIND, "rdma_cm BIND", body)
    }

    /// Listen (after [`CmId::bind`]).
    ///
    /// # Errors
    /// As the kernel's LISTEN.
    pub fn listen(&self, backlog: u32) -> Result<()> {
        self.simple(
            cmd::LISTEN,
            "rdma_cm LISTEN",
            RdmaUcmListen {
                id: self.id,
                backlog,
            },
        )
    }

    /// Resolve `dst`'s address and route (ADDR_RESOLVED, ROUTE_RESOLVED).
    ///
    /// # Errors
    /// The command's errno, or the error event (ADDR_ERROR, ROUTE_ERROR).
    pub fn resolve(&self, dst: SocketAddr) -> Result<()> {
        let d = sock(dst);
        let body = RdmaUcmResolveAddr {
            id: self.id,
            timeout_ms: 2000,
            dst_size: d.len() as u16,
            dst_addr: sa128(d),
            ..Default::default()
        };
        self.simple(cmd::RESOLVE_ADDR, "rdma_cm RESOLVE_ADDR", body)?;
        self.chan
            .wait(self.id, event::ADDR_RESOLVED, "rdma_cm address resolution")?;
        let body = RdmaUcmResolveRoute {
            id: self.id,
            timeout_ms: 2000,
        };
        self.simple(cmd::RESOLVE_ROUTE, "rdma_cm RESOLVE_ROUTE", body)?;
        self.chan
            .wait(self.id, event::ROUTE_RESOLVED, "rdma_cm route resolution")
            .map(drop)
    }

    /// The attributes the kernel gives `qp` for moving to `state` (INIT_QP_ATTR), applied.
    fn move_qp(&self, qp: &mut Qp, state: QpState, code: u32) -> Result<()> {
        let r = self.chan.cmd(
            cmd::INIT_QP_ATTR,
            "rdma_cm INIT_QP_ATTR",
            RdmaUcmInitQpAttr {
                response: 0,
                id: self.id,
                qp_state: code,
            },
            |b, a| b.response = a,
            size_of::<IbUverbsQpAttr>(),
        )?;
        let k: IbUverbsQpAttr = r.get(0);
        let attr = QpAttr {
            qp_state: Some(state),
            path_mtu: Mtu::try_from(k.path_mtu as u8).ok(),
            qkey: k.qkey,
            rq_psn: k.rq_psn,
            sq_psn: k.sq_psn,
            dest_qp_num: k.dest_qp_num,
            qp_access_flags: Access(k.qp_access_flags),
            pkey_index: k.pkey_index,
            port_num: k.port_num,
            max_rd_atomic: k.max_rd_atomic,
            max_dest_rd_atomic: k.max_dest_rd_atomic,
            min_rnr_timer: k.min_rnr_timer,
            timeout: k.timeout,
            retry_cnt: k.retry_cnt,
            rnr_retry: k.rnr_retry,
            ah_attr: ah_of(&k.ah_attr),
        };
        qp.modify(&attr, k.qp_attr_mask)
    }

    /// Bring `qp` to RTS with the kernel's attributes (INIT, RTR, RTS; UD: RTR and RTS take
    /// only the state and the send PSN).
    fn qp_to_rts(&self, qp: &mut Qp) -> Result<()> {
        self.move_qp(qp, QpState::Init, 1)?;
        self.move_qp(qp, QpState::Rtr, 2)?;
        self.move_qp(qp, QpState::Rts, 3)
    }

    /// Connect `qp` (RC, in RESET) to `dst`: resolve, REQ with `param`'s private data, and
    /// on the REP the QP to RTS, then the RTU. Returns the REP's event (its private data).
    ///
    /// # Errors
    /// A refused command, or the event that ended the attempt (REJECTED: `ECONNREFUSED`,
    /// UNREACHABLE: `ETIMEDOUT`).
    pub fn connect(&self, dst: SocketAddr, qp: &mut Qp, param: &ConnParam<'_>) -> Result<CmEvent> {
        self.resolve(dst)?;
        self.init_qp(qp)?;
        self.connect_resolved(qp, param)
    }

    /// Move `qp` (in RESET) to INIT with the kernel's attributes for this id, so that
    /// receives can be posted before the connection (as `rdma_create_qp` does).
    ///
    /// # Errors
    /// A refused INIT_QP_ATTR (`EINVAL` before the address is resolved) or transition.
    pub fn init_qp(&self, qp: &mut Qp) -> Result<()> {
        self.move_qp(qp, QpState::Init, 1)
    }

    /// [`CmId::connect`] after [`CmId::resolve`] (and [`CmId::init_qp`]).
    ///
    /// # Errors
    /// As [`CmId::connect`].
    pub fn connect_resolved(&self, qp: &mut Qp, param: &ConnParam<'_>) -> Result<CmEvent> {
        if param.private_data.len() > 56 {
            return Err(Error::InvalidArgument {
                attr: "private_data",
                reason: "longer than a REQ carries after the rdma_cm header (56 bytes)",
            });
        }
        let body = RdmaUcmConnect {
            conn_param: param.to_kern(qp.qpn())?,
            id: self.id,
            ..Default::default()
        };
        self.simple(cmd::CONNECT, "rdma_cm CONNECT", body)?;
        let rep = self
            .chan
            .wait(self.id, event::CONNECT_RESPONSE, "rdma_cm connect")?;
        if let Err(e) = self.qp_to_rts(qp) {
            let _ = self.reject(&[]);
            return Err(e);
        }
        // ACCEPT without parameters on the active side: the RTU.
        self.simple(
            cmd::ACCEPT,
            "rdma_cm ACCEPT (RTU)",
            RdmaUcmAccept {
                id: self.id,
                ..Default::default()
            },
        )?;
        Ok(rep)
    }

    /// Resolve a UD peer at `dst` through SIDR (the REQ carries `private_data`).
    ///
    /// # Errors
    /// As [`CmId::connect`].
    pub fn connect_ud(&self, dst: SocketAddr, qp: &mut Qp, private_data: &[u8]) -> Result<UdPeer> {
        if self.space != PortSpace::Udp {
            return Err(Error::InvalidArgument {
                attr: "port space",
                reason: "SIDR needs a UDP-space id",
            });
        }
        self.resolve(dst)?;
        self.qp_to_rts(qp)?;
        let p = ConnParam {
            private_data,
            ..ConnParam::default()
        };
        let body = RdmaUcmConnect {
            conn_param: p.to_kern(qp.qpn())?,
            id: self.id,
            ..Default::default()
        };
        self.simple(cmd::CONNECT, "rdma_cm CONNECT (SIDR)", body)?;
        let e = self
            .chan
            .wait(self.id, event::ESTABLISHED, "rdma_cm SIDR")?;
        Ok(UdPeer {
            qpn: e.qp_num,
            qkey: e.qkey,
            ah: e.ah.unwrap_or_default(),
            private_data: e.private_data,
        })
    }

    /// Wait for a connection request on this listening id.
    ///
    /// # Errors
    /// `ETIMEDOUT` if none comes within `timeout`; a refused GET_EVENT.
    pub fn get_request(&self, timeout: Duration) -> Result<ConnRequest<'c>> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::uverbs("rdma_cm connection request", libc::ETIMEDOUT));
            }
            // A request read earlier while waiting for another id's event, else a fresh
            // event (the kept ones aside, so that one of them is not read again and again).
            let kept = {
                let mut p = self.chan.pending.borrow_mut();
                let at = p.iter().position(|e| e.kind == event::CONNECT_REQUEST);
                at.and_then(|i| p.remove(i))
            };
            let e = match kept {
                Some(e) => e,
                None => {
                    let saved = std::mem::take(&mut *self.chan.pending.borrow_mut());
                    let e = self.chan.event(left.min(Duration::from_millis(100)));
                    let mut p = self.chan.pending.borrow_mut();
                    let fresh = std::mem::replace(&mut *p, saved);
                    p.extend(fresh);
                    match e? {
                        Some(e) => e,
                        None => continue,
                    }
                }
            };
            if e.kind == event::CONNECT_REQUEST {
                return Ok(ConnRequest {
                    id: CmId {
                        chan: self.chan,
                        id: e.id,
                        space: self.space,
                    },
                    event: e,
                });
            }
            self.chan.pending.borrow_mut().push_back(e);
        }
    }

    /// Send a REJ (consumer defined) with `private_data` (at most 148 bytes).
    ///
    /// # Errors
    /// As the kernel's REJECT.
    pub fn reject(&self, private_data: &[u8]) -> Result<()> {
        if private_data.len() > 148 {
            return Err(Error::InvalidArgument {
                attr: "private_data",
                reason: "longer than a REJ carries (148 bytes)",
            });
        }
        let mut body = RdmaUcmReject {
            id: self.id,
            private_data_len: private_data.len() as u8,
            ..Default::default()
        };
        body.private_data[..private_data.len()].copy_from_slice(private_data);
        self.simple(cmd::REJECT, "rdma_cm REJECT", body)
    }

    /// DREQ (or DREP if the peer disconnected first).
    ///
    /// # Errors
    /// As the kernel's DISCONNECT (`EINVAL` without a connection).
    pub fn disconnect(&self) -> Result<()> {
        self.simple(
            cmd::DISCONNECT,
            "rdma_cm DISCONNECT",
            RdmaUcmDisconnect { id: self.id },
        )
    }

    /// Wait for this connection's DISCONNECTED.
    ///
    /// # Errors
    /// `ETIMEDOUT`, or another event of this id.
    pub fn wait_disconnected(&self) -> Result<()> {
        self.chan
            .wait(self.id, event::DISCONNECTED, "rdma_cm disconnect")
            .map(drop)
    }
}

/// A multicast group this id joined ([`CmId::join_multicast`]): where to send to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct McastGroup {
    /// The kernel's number of the membership (LEAVE_MCAST names it).
    pub id: u32,
    /// The group's GID (for an IPv4 group, the one the kernel derives from the address).
    pub mgid: [u8; 16],
    /// The group's LID (InfiniBand).
    pub mlid: u16,
    /// The Q_Key of the group's traffic.
    pub qkey: u32,
    /// The address vector of a SEND to the group (its QPN is 0xFFFFFF).
    pub ah: AhAttr,
}

/// The destination QP number of a SEND to a multicast group.
pub const MCAST_QPN: u32 = 0xff_ffff;

impl CmId<'_> {
    /// Join the multicast group `group` (an IPv4 or IPv6 multicast address; port 0) with
    /// this UDP-space id, bound to a local address first ([`CmId::bind`]), and attach `qp`
    /// (UD) to it: JOIN_MCAST, the MULTICAST_JOIN event (the group's GID, LID and Q_Key),
    /// then ATTACH_MCAST. A `qp` in RESET is first brought to RTS with the id's attributes
    /// (its Q_Key is the group's, `RDMA_UDP_QKEY`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a TCP-space id; the kernel's JOIN_MCAST errno
    /// (`ENODEV` for an unbound id), the MULTICAST_ERROR event (`EPROTO`), ATTACH_MCAST's.
    pub fn join_multicast(&self, group: SocketAddr, qp: &mut Qp) -> Result<McastGroup> {
        if self.space != PortSpace::Udp {
            return Err(Error::InvalidArgument {
                attr: "port space",
                reason: "a multicast join needs a UDP-space id",
            });
        }
        if !group.ip().is_multicast() {
            return Err(Error::InvalidArgument {
                attr: "group",
                reason: "not a multicast address",
            });
        }
        if qp.state() == QpState::Reset {
            self.qp_to_rts(qp)?;
        }
        let a = sock(group);
        let body = RdmaUcmJoinMcast {
            uid: UID_UD,
            id: self.id,
            addr_size: a.len() as u16,
            join_flags: 1, // full member
            addr: sa128(a),
            ..Default::default()
        };
        let r = self.chan.cmd(
            cmd::JOIN_MCAST,
            "rdma_cm JOIN_MCAST",
            body,
            |b, a| b.response = a,
            size_of::<RdmaUcmCreateIdResp>(),
        )?;
        let mc = r.get::<RdmaUcmCreateIdResp>(0).id;
        let e = self
            .chan
            .wait(mc, event::MULTICAST_JOIN, "rdma_cm multicast join")?;
        let ah = e.ah.unwrap_or_default();
        let g = McastGroup {
            id: mc,
            mgid: ah.grh.map(|g| g.dgid).unwrap_or([0; 16]),
            mlid: ah.dlid,
            qkey: e.qkey,
            ah,
        };
        qp.attach_mcast(g.mgid, g.mlid)?;
        Ok(g)
    }

    /// Leave `group`: detach `qp`, then LEAVE_MCAST.
    ///
    /// # Errors
    /// DETACH_MCAST's errno (`EINVAL`: not attached), LEAVE_MCAST's (`ENOENT`: not joined).
    pub fn leave_multicast(&self, group: &McastGroup, qp: &Qp) -> Result<()> {
        qp.detach_mcast(group.mgid, group.mlid)?;
        self.chan
            .cmd(
                cmd::LEAVE_MCAST,
                "rdma_cm LEAVE_MCAST",
                RdmaUcmDestroyId {
                    response: 0,
                    id: group.id,
                    reserved: 0,
                },
                |b, a| b.response = a,
                4,
            )
            .map(drop)
    }
}

impl ConnRequest<'_> {
    /// Move `qp` to INIT for this connection, so receives can be posted before accepting.
    ///
    /// # Errors
    /// As [`CmId::init_qp`].
    pub fn init_qp(&self, qp: &mut Qp) -> Result<()> {
        self.id.init_qp(qp)
    }

    /// Accept with `qp` (RC, in RESET or INIT: [`ConnRequest::init_qp`]): the QP to RTS,
    /// the REP with `param`, ESTABLISHED.
    ///
    /// # Errors
    /// A refused command or QP transition; the event that ended the handshake.
    pub fn accept(&self, qp: &mut Qp, param: &ConnParam<'_>) -> Result<()> {
        self.id.qp_to_rts(qp)?;
        let body = RdmaUcmAccept {
            uid: match self.id.space {
                PortSpace::Tcp => UID_RC,
                PortSpace::Udp => UID_UD,
            },
            conn_param: param.to_kern(qp.qpn())?,
            id: self.id.id,
            ..Default::default()
        };
        self.id.simple(cmd::ACCEPT, "rdma_cm ACCEPT", body)?;
        if self.id.space == PortSpace::Udp {
            return Ok(());
        }
        self.id
            .chan
            .wait(self.id.id, event::ESTABLISHED, "rdma_cm accept")
            .map(drop)
    }
}

impl Drop for CmId<'_> {
    fn drop(&mut self) {
        let _ = self.chan.cmd(
            cmd::DESTROY_ID,
            "rdma_cm DESTROY_ID",
            RdmaUcmDestroyId {
                response: 0,
                id: self.id,
                reserved: 0,
            },
            |b, a| b.response = a,
            4,
        );
    }
}
