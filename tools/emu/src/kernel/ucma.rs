//! The emulated rdma_cm: the kernel's ucma (`/dev/infiniband/rdma_cm`, ABI 4) and the IB CM
//! under it, as librdmacm speaks to them.
//!
//! * **The file** ([`RdmaCmFile`], from [`Emulator::open_rdma_cm`]): `write` of a
//!   `rdma_ucm_cmd_hdr` + command ([`mlx5_ffi::ucma`]); responses go to the user pointers in
//!   the commands. `GET_EVENT` blocks until an event is queued (or fails with `EAGAIN` when
//!   the descriptor is non-blocking). The descriptor is an eventfd that is readable exactly
//!   while events are queued, so `poll`/`select`/`epoll` on it work natively.
//! * **Ids** follow the kernel's states (idle, bound, address and route resolved, listening,
//!   connecting, connected, disconnected), with the kernel's errnos for a command in the
//!   wrong state: `EINVAL`, an unknown id `ENOENT`, another file's id `EINVAL`, a short
//!   response buffer `ENOSPC`, a bad user pointer `EFAULT`, an unknown command `EINVAL`,
//!   `GET_OPTION` `ENOSYS`.
//! * **Addresses** (docs/rdma-cm.md): an HCA's IPv4 address is its fabric address
//!   `127.1.x.y`; any other loopback address (`127.0.0.1`, `::1`) is this process's first
//!   HCA, as the kernel binds loopback to the first active device; a connect to a loopback
//!   address reaches the listener of that port wherever it runs on the host, through the
//!   host-wide port space of `model/cm_ports.rs`.
//! * **The CM protocol** (`model/cm_mad.rs`): REQ/REP/RTU, REJ, DREQ/DREP, SIDR REQ/REP travel as
//!   MADs from QP1 to QP1 on the emulated fabric (the device hands every QP1 packet to
//!   [`gsi_receive`]); REQ, REP, DREQ and SIDR REQ are retransmitted until answered, then
//!   the kernel's timeout events follow (`UNREACHABLE`/`DISCONNECTED` with `-ETIMEDOUT`);
//!   duplicates are answered again; anything that is not a valid CM message for a known
//!   connection is counted (`rx_bad_packets`, `rx_foreign`) and dropped.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::{Arc, Condvar};

use mlx5_ffi::ucma::{
    IbPathRecData, IbUserPathRec, IbUverbsQpAttr, RDMA_UDP_QKEY, RdmaUcmAccept, RdmaUcmBind,
    RdmaUcmBindIp, RdmaUcmCmdHdr, RdmaUcmConnParam, RdmaUcmConnect, RdmaUcmCreateId,
    RdmaUcmCreateIdResp, RdmaUcmDestroyId, RdmaUcmDestroyIdResp, RdmaUcmDisconnect,
    RdmaUcmEventResp, RdmaUcmGetEvent, RdmaUcmInitQpAttr, RdmaUcmJoinIpMcast, RdmaUcmJoinMcast,
    RdmaUcmListen, RdmaUcmMigrateId, RdmaUcmMigrateResp, RdmaUcmNotify, RdmaUcmQuery,
    RdmaUcmQueryAddrResp, RdmaUcmQueryPathResp, RdmaUcmQueryRouteResp, RdmaUcmReject,
    RdmaUcmResolveAddr, RdmaUcmResolveIp, RdmaUcmResolveRoute, RdmaUcmSetOption, RdmaUcmUdParam,
    SockAddr, cmd, event, option, ps, query, rej,
};
use mlx5_ffi::uverbs::{IbUverbsAhAttr, IbUverbsGlobalRoute, access, qp_attr as qa, qp_state};
use zerocopy::{FromBytes, Immutable, IntoBytes};

use crate::abi::{Errno, UverbsSurface};
use crate::mem;
use crate::model::cm::{Chan, CmId, Conn, Cs, Ev, Mc, St, TRIES};
use crate::model::cm_mad::{self as mad, CmMsg, GSI_QKEY, cma_hdr_decode, cma_hdr_encode};
use crate::model::cm_ports::{self as ucma_ports};
use crate::roce::BASE_GUID;
use crate::shared::{Emulator, Owner, Shared};
use crate::state::World;
use crate::transport::{Packet, Payload, node_ip, op};

const EINVAL: Errno = Errno(libc::EINVAL);
const ENOENT: Errno = Errno(libc::ENOENT);
const ENOSPC: Errno = Errno(libc::ENOSPC);

/// First port of the ephemeral range (Linux `ip_local_port_range`).
const EPHEMERAL_LO: u16 = 32768;
const EPHEMERAL_HI: u16 = 60999;
/// Packet life time of the emulated paths, and the local ACK timeout the CM gives QPs.
const PACKET_LIFE_TIME: u8 = 13;
const ACK_TIMEOUT: u8 = 14;

fn ps_of_sid(sid: u64) -> Option<(u16, u16)> {
    (sid >> 32 == 0 && (sid >> 24) & 0xff == 0x01 || sid >> 16 == u64::from(ps::IPOIB))
        .then_some((((sid >> 16) & 0xffff) as u16, (sid & 0xffff) as u16))
}

fn sid_of(ps: u16, port: u16) -> u64 {
    (u64::from(ps) << 16) | u64::from(port)
}

// ---------------------------------------------------------------------------------------
// The file

/// An open `/dev/infiniband/rdma_cm` of the emulator: its command surface (`write` only;
/// `ioctl` is `ENOTTY`, `mmap` `ENODEV`, as on the real misc device). Dropping it closes the
/// file: its ids are destroyed as the kernel destroys them at close (connections get a DREQ
/// or REJ).
#[derive(Debug)]
pub struct RdmaCmFile {
    shared: Arc<Shared>,
    chan: u32,
    user_fd: RawFd,
    /// Dropped after `shared`: the last user handle joins the device thread (`shared.rs`, `Owner`).
    _owner: Arc<Owner>,
}

/// [`Emulator::open_rdma_cm`]'s answer: the file and the user's descriptor (pollable:
/// readable while events are queued).
#[derive(Debug)]
pub struct RdmaCmOpen {
    /// The command surface.
    pub file: Arc<RdmaCmFile>,
    /// The event channel's descriptor, owned by the caller.
    pub fd: OwnedFd,
}

impl Emulator {
    /// Open the emulated `/dev/infiniband/rdma_cm` (an rdma_cm event channel).
    pub fn open_rdma_cm(&self) -> Result<RdmaCmOpen, Errno> {
        // SAFETY: eventfd has no memory arguments.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if efd < 0 {
            return Err(Errno::last());
        }
        // SAFETY: a fresh descriptor owned by nobody else.
        let efd = unsafe { OwnedFd::from_raw_fd(efd) };
        // SAFETY: F_DUPFD_CLOEXEC on a descriptor we own.
        let user = unsafe { libc::fcntl(efd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
        if user < 0 {
            return Err(Errno::last());
        }
        // SAFETY: a fresh descriptor owned by nobody else.
        let user = unsafe { OwnedFd::from_raw_fd(user) };
        let mut w = self.shared.lock_quiet();
        w.cm.next_chan = w.cm.next_chan.wrapping_add(1).max(1);
        let chan = w.cm.next_chan;
        w.cm.chans.insert(
            chan,
            Chan {
                queue: VecDeque::new(),
                efd,
                user_fd: user.as_raw_fd(),
                signaled: false,
                cv: Arc::new(Condvar::new()),
            },
        );
        drop(w);
        Ok(RdmaCmOpen {
            file: Arc::new(RdmaCmFile {
                shared: self.shared.clone(),
                _owner: self.owner.clone(),
                chan,
                user_fd: user.as_raw_fd(),
            }),
            fd: user,
        })
    }
}

impl RdmaCmFile {
    /// The number of the user's descriptor this file was opened with.
    pub fn user_fd(&self) -> RawFd {
        self.user_fd
    }

    /// Run one command (`rdma_ucm_cmd_hdr` + struct), as `write(2)` on the file. Returns
    /// the length written.
    pub fn command(&self, buf: &[u8]) -> Result<usize, Errno> {
        let (hdr, body) = RdmaUcmCmdHdr::read_from_prefix(buf).map_err(|_| EINVAL)?;
        if hdr.cmd >= cmd::COUNT {
            return Err(EINVAL);
        }
        let body = body.get(..usize::from(hdr.r#in)).ok_or(EINVAL)?;
        let out = usize::from(hdr.out);
        if hdr.cmd == cmd::GET_EVENT {
            return get_event(&self.shared, self.chan, body, out).map(|()| buf.len());
        }
        let mut w = self.shared.lock();
        command(&mut w, self.chan, hdr.cmd, body, out).map(|()| buf.len())
    }
}

impl Drop for RdmaCmFile {
    fn drop(&mut self) {
        let mut w = self.shared.lock();
        let ids: Vec<u32> =
            w.cm.ids
                .iter()
                .filter(|(_, i)| i.chan == self.chan)
                .map(|(&n, _)| n)
                .collect();
        for id in ids {
            destroy(&mut w, id);
        }
        w.cm.chans.remove(&self.chan);
    }
}

// SAFETY: the file writes responses only through the fault-catching user-memory copies
// (`crate::mem`), it maps nothing (mmap fails), and its descriptors are its own.
unsafe impl UverbsSurface for RdmaCmFile {
    unsafe fn write(&self, cmd: &[u8]) -> Result<usize, Errno> {
        self.command(cmd)
    }

    unsafe fn ioctl(&self, _buf: &mut [u8]) -> Result<(), Errno> {
        Err(Errno(libc::ENOTTY))
    }

    fn mmap(&self, _len: usize, _prot: i32, _offset: u64) -> Result<NonNull<u8>, Errno> {
        Err(Errno(libc::ENODEV))
    }

    unsafe fn munmap(&self, _addr: NonNull<u8>, _len: usize) -> Result<(), Errno> {
        Err(EINVAL)
    }

    fn describe(&self) -> String {
        format!("emulated rdma_cm (channel {})", self.chan)
    }
}

// ---------------------------------------------------------------------------------------
// Events

fn eventfd_add(fd: RawFd) {
    let one: u64 = 1;
    // SAFETY: an 8-byte write from a live u64 to an eventfd we own (raw syscall: the
    // preload's `write` interposer must not see it).
    unsafe { libc::syscall(libc::SYS_write, fd, (&raw const one).cast::<u8>(), 8usize) };
}

fn eventfd_clear(fd: RawFd) {
    let mut v: u64 = 0;
    // SAFETY: an 8-byte read into a live u64 from an eventfd we own whose counter is
    // non-zero (so the read does not block).
    unsafe { libc::syscall(libc::SYS_read, fd, (&raw mut v).cast::<u8>(), 8usize) };
}

/// Queue an event on the channel of `owner` (or `chan`).
fn push(w: &mut World, owner: u32, mc: Option<u32>, child: Option<u32>, resp: RdmaUcmEventResp) {
    let Some(chan) = w.cm.ids.get(&owner).map(|i| i.chan) else {
        return;
    };
    let Some(c) = w.cm.chans.get_mut(&chan) else {
        return;
    };
    c.queue.push_back(Ev {
        owner,
        mc,
        child,
        resp,
    });
    if !c.signaled {
        eventfd_add(c.efd.as_raw_fd());
        c.signaled = true;
    }
    c.cv.notify_all();
}

/// An event of `id` with status and connection parameters.
fn ev(w: &mut World, id: u32, kind: u32, status: i32, conn: Option<&RdmaUcmConnParam>) {
    let Some(uid) = w.cm.ids.get(&id).map(|i| i.uid) else {
        return;
    };
    let mut r = RdmaUcmEventResp {
        uid,
        id,
        event: kind,
        status: status as u32,
        ..Default::default()
    };
    if let Some(p) = conn {
        r.set_conn(p);
    }
    push(w, id, None, None, r);
}

fn ev_ud(w: &mut World, id: u32, kind: u32, status: i32, ud: &RdmaUcmUdParam) {
    let Some(uid) = w.cm.ids.get(&id).map(|i| i.uid) else {
        return;
    };
    let mut r = RdmaUcmEventResp {
        uid,
        id,
        event: kind,
        status: status as u32,
        ..Default::default()
    };
    r.set_ud(ud);
    push(w, id, None, None, r);
}

fn get_event(shared: &Shared, chan: u32, body: &[u8], out: usize) -> Result<(), Errno> {
    let c = RdmaUcmGetEvent::read_from_prefix(body)
        .map_err(|_| EINVAL)?
        .0;
    if out < std::mem::offset_of!(RdmaUcmEventResp, reserved) {
        return Err(ENOSPC);
    }
    let mut w = shared.lock_quiet();
    loop {
        let Some(ch) = w.cm.chans.get_mut(&chan) else {
            return Err(Errno(libc::EBADF));
        };
        if let Some(e) = ch.queue.front() {
            let n = out.min(size_of::<RdmaUcmEventResp>());
            mem::write(c.response, &e.resp.as_bytes()[..n])?;
            let Some(e) = ch.queue.pop_front() else {
                return Err(EINVAL);
            };
            if ch.queue.is_empty() && ch.signaled {
                eventfd_clear(ch.efd.as_raw_fd());
                ch.signaled = false;
            }
            if let Some(i) = w.cm.ids.get_mut(&e.owner) {
                i.events_reported += 1;
            }
            if let Some(m) = e.mc.and_then(|m| w.cm.mcs.get_mut(&m)) {
                m.events_reported += 1;
            }
            if let Some(i) = e.child.and_then(|c| w.cm.ids.get_mut(&c)) {
                i.pending = false;
            }
            return Ok(());
        }
        // SAFETY: F_GETFL on the kernel end, which shares the user's file status flags.
        let fl = unsafe { libc::fcntl(ch.efd.as_raw_fd(), libc::F_GETFL) };
        if fl >= 0 && fl & libc::O_NONBLOCK != 0 {
            return Err(Errno(libc::EAGAIN));
        }
        let cv = ch.cv.clone();
        w = cv
            .wait_timeout(w, std::time::Duration::from_millis(200))
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

// ---------------------------------------------------------------------------------------
// Commands

fn read<T: FromBytes>(body: &[u8]) -> Result<T, Errno> {
    T::read_from_prefix(body)
        .map(|(t, _)| t)
        .map_err(|_| EINVAL)
}

fn respond<T: IntoBytes + Immutable>(addr: u64, out: usize, v: &T) -> Result<(), Errno> {
    if out < size_of::<T>() {
        return Err(ENOSPC);
    }
    mem::write(addr, v.as_bytes())
}

/// The id `n` of channel `chan`.
fn id_of(w: &World, chan: u32, n: u32) -> Result<(), Errno> {
    match w.cm.ids.get(&n) {
        None => Err(ENOENT),
        Some(i) if i.chan != chan => Err(EINVAL),
        Some(_) => Ok(()),
    }
}

fn id_mut(w: &mut World, n: u32) -> Result<&mut CmId, Errno> {
    w.cm.ids.get_mut(&n).ok_or(ENOENT)
}

fn command(w: &mut World, chan: u32, c: u32, body: &[u8], out: usize) -> Result<(), Errno> {
    match c {
        cmd::CREATE_ID => {
            let r: RdmaUcmCreateId = read(body)?;
            let qp_type = match r.ps {
                ps::TCP => mlx5_ffi::uverbs::qp_type::RC,
                ps::UDP | ps::IPOIB => mlx5_ffi::uverbs::qp_type::UD,
                ps::IB => r.qp_type,
                _ => return Err(EINVAL),
            };
            if out < size_of::<RdmaUcmCreateIdResp>() {
                return Err(ENOSPC);
            }
            let n = w.cm.next_id();
            mem::write(r.response, RdmaUcmCreateIdResp { id: n }.as_bytes())?;
            w.cm.ids.insert(
                n,
                CmId {
                    chan,
                    uid: r.uid,
                    ps: r.ps,
                    qp_type,
                    st: St::Idle,
                    hca: None,
                    src: None,
                    dst: None,
                    peer: None,
                    claim: None,
                    events_reported: 0,
                    tos: 0,
                    conn: None,
                    pending: false,
                },
            );
            Ok(())
        }
        cmd::DESTROY_ID => {
            let r: RdmaUcmDestroyId = read(body)?;
            id_of(w, chan, r.id)?;
            if out < size_of::<RdmaUcmDestroyIdResp>() {
                return Err(ENOSPC);
            }
            let events = destroy(w, r.id);
            mem::write(
                r.response,
                RdmaUcmDestroyIdResp {
                    events_reported: events,
                }
                .as_bytes(),
            )
        }
        cmd::BIND_IP => {
            let r: RdmaUcmBindIp = read(body)?;
            id_of(w, chan, r.id)?;
            let a = SockAddr::decode(&r.addr).ok_or(Errno(libc::EAFNOSUPPORT))?;
            bind(w, r.id, a, true)
        }
        cmd::BIND => {
            let r: RdmaUcmBind = read(body)?;
            id_of(w, chan, r.id)?;
            let a = SockAddr::decode(&r.addr).ok_or(Errno(libc::EAFNOSUPPORT))?;
            if usize::from(r.addr_size) != a.len() {
                return Err(EINVAL);
            }
            bind(w, r.id, a, true)
        }
        cmd::RESOLVE_IP => {
            let r: RdmaUcmResolveIp = read(body)?;
            id_of(w, chan, r.id)?;
            let src = SockAddr::decode(&r.src_addr);
            let dst = SockAddr::decode(&r.dst_addr).ok_or(EINVAL)?;
            resolve_addr(w, r.id, src, dst)
        }
        cmd::RESOLVE_ADDR => {
            let r: RdmaUcmResolveAddr = read(body)?;
            id_of(w, chan, r.id)?;
            let src = (r.src_size > 0)
                .then(|| SockAddr::decode(&r.src_addr))
                .flatten();
            let dst = SockAddr::decode(&r.dst_addr).ok_or(EINVAL)?;
            if usize::from(r.dst_size) != dst.len() {
                return Err(EINVAL);
            }
            resolve_addr(w, r.id, src, dst)
        }
        cmd::RESOLVE_ROUTE => {
            let r: RdmaUcmResolveRoute = read(body)?;
            id_of(w, chan, r.id)?;
            let i = id_mut(w, r.id)?;
            if i.st != St::AddrResolved {
                return Err(EINVAL);
            }
            i.st = St::RouteResolved;
            ev(w, r.id, event::ROUTE_RESOLVED, 0, None);
            Ok(())
        }
        cmd::QUERY_ROUTE => {
            let r: RdmaUcmQuery = read(body)?;
            id_of(w, chan, r.id)?;
            query_route(w, r.id, r.response, out)
        }
        cmd::QUERY => {
            let r: RdmaUcmQuery = read(body)?;
            id_of(w, chan, r.id)?;
            match r.option {
                query::ADDR => query_addr(w, r.id, r.response, out),
                query::PATH => query_path(w, r.id, r.response, out),
                query::GID => query_gid(w, r.id, r.response, out),
                _ => Err(Errno(libc::ENOSYS)),
            }
        }
        cmd::CONNECT => {
            let r: RdmaUcmConnect = read(body)?;
            id_of(w, chan, r.id)?;
            connect(w, r.id, &r.conn_param)
        }
        cmd::LISTEN => {
            let r: RdmaUcmListen = read(body)?;
            id_of(w, chan, r.id)?;
            let st = w.cm.ids[&r.id].st;
            match st {
                St::Listen => return Ok(()),
                St::Idle => {
                    let any = SockAddr::V4 {
                        ip: [0; 4],
                        port: 0,
                    };
                    bind(w, r.id, any, true)?;
                }
                St::Bound => {}
                _ => return Err(EINVAL),
            }
            id_mut(w, r.id)?.st = St::Listen;
            Ok(())
        }
        cmd::ACCEPT => {
            let r: RdmaUcmAccept = read(body)?;
            id_of(w, chan, r.id)?;
            accept(w, r.id, r.uid, &r.conn_param)
        }
        cmd::REJECT => {
            let r: RdmaUcmReject = read(body)?;
            id_of(w, chan, r.id)?;
            let reason = match r.reason {
                0 => rej::CONSUMER_DEFINED,
                rej::CONSUMER_DEFINED | 35 => r.reason,
                _ => return Err(EINVAL),
            };
            let len = usize::from(r.private_data_len);
            reject(w, r.id, reason, &r.private_data[..len.min(256)])
        }
        cmd::DISCONNECT => {
            let r: RdmaUcmDisconnect = read(body)?;
            id_of(w, chan, r.id)?;
            disconnect(w, r.id)
        }
        cmd::INIT_QP_ATTR => {
            let r: RdmaUcmInitQpAttr = read(body)?;
            id_of(w, chan, r.id)?;
            if out < size_of::<IbUverbsQpAttr>() {
                return Err(ENOSPC);
            }
            let a = init_qp_attr(w, r.id, r.qp_state)?;
            mem::write(r.response, a.as_bytes())
        }
        cmd::GET_OPTION => Err(Errno(libc::ENOSYS)),
        cmd::SET_OPTION => {
            let r: RdmaUcmSetOption = read(body)?;
            id_of(w, chan, r.id)?;
            if r.optlen > 4096 {
                return Err(EINVAL);
            }
            let val = mem::read_vec(r.optval, r.optlen as usize)?;
            match (r.level, r.optname) {
                (option::ID, option::ID_TOS) if val.len() == 1 => {
                    id_mut(w, r.id)?.tos = val[0];
                    Ok(())
                }
                (option::ID, option::ID_REUSEADDR | option::ID_AFONLY) if val.len() == 4 => Ok(()),
                (option::ID, option::ID_ACK_TIMEOUT) if val.len() == 1 => Ok(()),
                (option::IB, option::IB_PATH)
                    if !val.is_empty() && val.len() % size_of::<IbPathRecData>() == 0 =>
                {
                    Ok(())
                }
                (option::ID | option::IB, option::ID_TOS..=option::ID_ACK_TIMEOUT) => Err(EINVAL),
                _ => Err(Errno(libc::ENOSYS)),
            }
        }
        cmd::NOTIFY => {
            let r: RdmaUcmNotify = read(body)?;
            id_of(w, chan, r.id)?;
            let i = id_mut(w, r.id)?;
            let Some(c) = i.conn.as_mut() else {
                return Err(EINVAL);
            };
            // IB_EVENT_COMM_EST on a REP-sent connection: data came before the RTU.
            if r.event == mlx5_ffi::uverbs::event::COMM_EST && c.cs == Cs::RepSent {
                c.cs = Cs::Established;
                c.retx = None;
                i.st = St::Connected;
                ev(w, r.id, event::ESTABLISHED, 0, None);
            }
            Ok(())
        }
        cmd::JOIN_IP_MCAST => {
            let r: RdmaUcmJoinIpMcast = read(body)?;
            id_of(w, chan, r.id)?;
            let a = SockAddr::decode(&r.addr).ok_or(EINVAL)?;
            join(w, r.id, r.uid, r.response, out, a)
        }
        cmd::JOIN_MCAST => {
            let r: RdmaUcmJoinMcast = read(body)?;
            id_of(w, chan, r.id)?;
            if r.join_flags > 1 {
                return Err(EINVAL);
            }
            let a = SockAddr::decode(&r.addr).ok_or(EINVAL)?;
            join(w, r.id, r.uid, r.response, out, a)
        }
        cmd::LEAVE_MCAST => {
            let r: RdmaUcmDestroyId = read(body)?;
            let Some(m) = w.cm.mcs.get(&r.id) else {
                return Err(ENOENT);
            };
            id_of(w, chan, m.id)?;
            if out < size_of::<RdmaUcmDestroyIdResp>() {
                return Err(ENOSPC);
            }
            let events = m.events_reported;
            w.cm.mcs.remove(&r.id);
            if let Some(c) = w.cm.chans.get_mut(&chan) {
                c.queue.retain(|e| e.mc != Some(r.id));
            }
            mem::write(
                r.response,
                RdmaUcmDestroyIdResp {
                    events_reported: events,
                }
                .as_bytes(),
            )
        }
        cmd::MIGRATE_ID => {
            let r: RdmaUcmMigrateId = read(body)?;
            let Some((&old, _)) = w.cm.chans.iter().find(|(_, c)| c.user_fd == r.fd as RawFd)
            else {
                return Err(EINVAL);
            };
            id_of(w, old, r.id)?;
            if out < size_of::<RdmaUcmMigrateResp>() {
                return Err(ENOSPC);
            }
            // The id's queued events move with it.
            let moved: Vec<Ev> = match w.cm.chans.get_mut(&old) {
                Some(c) => {
                    let (m, keep): (Vec<Ev>, Vec<Ev>) = std::mem::take(&mut c.queue)
                        .into_iter()
                        .partition(|e| e.owner == r.id);
                    let keep: VecDeque<Ev> = keep.into();
                    c.queue = keep;
                    if c.queue.is_empty() && c.signaled {
                        eventfd_clear(c.efd.as_raw_fd());
                        c.signaled = false;
                    }
                    m
                }
                None => Vec::new(),
            };
            let i = id_mut(w, r.id)?;
            i.chan = chan;
            let events = i.events_reported;
            for e in moved {
                push(w, e.owner, e.mc, e.child, e.resp);
            }
            mem::write(
                r.response,
                RdmaUcmMigrateResp {
                    events_reported: events,
                }
                .as_bytes(),
            )
        }
        _ => Err(EINVAL),
    }
}

// ---------------------------------------------------------------------------------------
// Addresses

/// Whether the IPv4 address is loopback (127/8).
fn loopback4(ip: [u8; 4]) -> bool {
    ip[0] == 127
}

/// The fabric node of a `127.1.x.y` address (1..=254), if it is one.
fn node_of_ip(ip: [u8; 4]) -> Option<u16> {
    let n = u16::from_be_bytes([ip[2], ip[3]]);
    (ip[..2] == node_ip(0)[..2] && (1..=254).contains(&n)).then_some(n)
}

/// Which HCA of ours an address names: `Ok(Some(hca))` for one of our fabric addresses or
/// a loopback address (HCA 0), `Ok(None)` for the wildcard; `EADDRNOTAVAIL` otherwise.
fn local_hca(w: &World, a: &SockAddr) -> Result<Option<usize>, Errno> {
    if a.is_any() {
        return Ok(None);
    }
    if let SockAddr::V6 { ip, .. } = a {
        if *ip == std::net::Ipv6Addr::LOCALHOST.octets() {
            return Ok(Some(0));
        }
    }
    let ip = a.ipv4().ok_or(Errno(libc::EADDRNOTAVAIL))?;
    if let Some(h) = w.hcas.iter().position(|h| h.info.ipv4 == ip) {
        return Ok(Some(h));
    }
    if loopback4(ip) && node_of_ip(ip).is_none() {
        return Ok(Some(0));
    }
    Err(Errno(libc::EADDRNOTAVAIL))
}

fn ephemeral(w: &mut World) -> u16 {
    EPHEMERAL_LO + (w.cm.rand() % u32::from(EPHEMERAL_HI - EPHEMERAL_LO)) as u16
}

fn bind(w: &mut World, id: u32, a: SockAddr, explicit: bool) -> Result<(), Errno> {
    if w.cm.ids[&id].st != St::Idle {
        return Err(EINVAL);
    }
    if let SockAddr::Ib { .. } = a {
        // Native IB addressing: bound, no device (the probe librdmacm makes).
        let i = id_mut(w, id)?;
        i.src = Some(a);
        i.st = St::Bound;
        return Ok(());
    }
    let hca = local_hca(w, &a)?;
    let a = if a.port() == 0 {
        a.with_port(ephemeral(w))
    } else {
        a
    };
    let claim = if explicit {
        let lid = w.hcas[hca.unwrap_or(0)].info.lid;
        Some(ucma_ports::claim(w.cm.ids[&id].ps, a.port(), lid)?)
    } else {
        None
    };
    let i = id_mut(w, id)?;
    i.src = Some(a);
    i.hca = hca;
    i.claim = claim;
    i.st = St::Bound;
    Ok(())
}

/// Whether some process owns fabric node `n` (its address is bound).
fn node_exists(n: u16) -> bool {
    let addr = std::net::SocketAddrV4::new(node_ip(n).into(), crate::transport::ROCE_PORT);
    std::net::UdpSocket::bind(addr).is_err()
}

fn resolve_addr(w: &mut World, id: u32, src: Option<SockAddr>, dst: SockAddr) -> Result<(), Errno> {
    if matches!(dst, SockAddr::Ib { .. }) {
        return Err(Errno(libc::EAFNOSUPPORT));
    }
    let st = w.cm.ids[&id].st;
    if st == St::Idle {
        if let Some(s) = src.filter(|s| !s.is_any() || s.port() != 0) {
            bind(w, id, s, false)?;
        }
    } else if st != St::Bound {
        return Err(EINVAL);
    }
    // Where the destination is: one of our HCAs (loopback), another node, or nowhere.
    let dip = if dst.is_any() {
        Some([127, 0, 0, 1])
    } else if let SockAddr::V6 { ip, .. } = dst {
        if ip == std::net::Ipv6Addr::LOCALHOST.octets() {
            Some([127, 0, 0, 1])
        } else {
            dst.ipv4()
        }
    } else {
        dst.ipv4()
    };
    let Some(dip) = dip else {
        return Err(Errno(libc::ENETUNREACH));
    };
    let bound = w.cm.ids[&id].hca;
    let (hca, peer) = if let Some(h) = w.hcas.iter().position(|h| h.info.ipv4 == dip) {
        (bound.unwrap_or(h), w.hcas[h].info.lid)
    } else if let Some(n) = node_of_ip(dip) {
        let h = bound.unwrap_or(0);
        if w.cfg.fabric == crate::config::Fabric::InProcess || !node_exists(n) {
            // Nobody has that address: neighbour resolution fails.
            let i = id_mut(w, id)?;
            i.dst = Some(dst);
            ev(w, id, event::ADDR_ERROR, -libc::EHOSTUNREACH, None);
            return Ok(());
        }
        (h, n)
    } else if loopback4(dip) {
        let h = bound.unwrap_or(0);
        (h, w.hcas[h].info.lid)
    } else {
        return Err(Errno(libc::ENETUNREACH));
    };
    if w.cm.ids[&id].src.is_none() {
        // Implicit bind: a loopback destination is also the source; otherwise the HCA's
        // own address.
        let port = ephemeral(w);
        let src = if loopback4(dip) && node_of_ip(dip).is_none() {
            dst.with_port(port)
        } else if let SockAddr::V6 { .. } = dst {
            SockAddr::V6 {
                ip: SockAddr::V4 {
                    ip: w.hcas[hca].info.ipv4,
                    port,
                }
                .ip16(),
                port,
                scope: 0,
            }
        } else {
            SockAddr::V4 {
                ip: w.hcas[hca].info.ipv4,
                port,
            }
        };
        id_mut(w, id)?.src = Some(src);
    }
    let i = id_mut(w, id)?;
    i.hca = Some(hca);
    i.dst = Some(dst);
    i.peer = Some(peer);
    i.st = St::AddrResolved;
    ev(w, id, event::ADDR_RESOLVED, 0, None);
    Ok(())
}

/// Port 1 GID 0 of fabric node `lid` as this fabric's link layer shows it.
fn gid_of(w: &World, hca: usize, lid: u16) -> [u8; 16] {
    if w.hcas[hca].info.is_roce() {
        crate::roce::ipv4_mapped_gid(node_ip(lid))
    } else {
        let mut g = [0u8; 16];
        g[0] = 0xfe;
        g[1] = 0x80;
        g[8..].copy_from_slice(&(BASE_GUID + u64::from(lid)).to_be_bytes());
        g
    }
}

/// The GID index the CM uses on a port: 0 on InfiniBand, the RoCE v2 IPv4 entry on RoCE.
fn sgid_index(w: &World, hca: usize) -> u8 {
    if w.hcas[hca].info.is_roce() { 3 } else { 0 }
}

fn port_mtu(w: &World, hca: usize) -> u8 {
    if w.hcas[hca].info.is_roce() { 3 } else { 5 }
}

/// (local lid, local gid, peer lid, peer gid) of a resolved id.
fn path_of(w: &World, id: u32) -> Option<(u16, [u8; 16], u16, [u8; 16])> {
    let i = w.cm.ids.get(&id)?;
    let hca = i.hca?;
    let lid = w.hcas[hca].info.lid;
    let (plid, pgid) = match &i.conn {
        Some(c) => (c.peer_lid, c.peer_gid),
        None => {
            let p = i.peer?;
            (p, gid_of(w, hca, p))
        }
    };
    Some((lid, gid_of(w, hca, lid), plid, pgid))
}

fn node_guid_be(w: &World, hca: usize) -> u64 {
    u64::from_ne_bytes(w.hcas[hca].info.node_guid.to_be_bytes())
}

fn user_path(w: &World, id: u32) -> Option<IbUserPathRec> {
    let (slid, sgid, dlid, dgid) = path_of(w, id)?;
    let hca = w.cm.ids[&id].hca?;
    let roce = w.hcas[hca].info.is_roce();
    Some(IbUserPathRec {
        dgid,
        sgid,
        dlid: if roce { 0 } else { dlid.to_be() },
        slid: if roce { 0 } else { slid.to_be() },
        raw_traffic: 0,
        flow_label: 0,
        reversible: 1,
        mtu: u32::from(port_mtu(w, hca)),
        pkey: 0xffffu16.to_be(),
        hop_limit: if roce { 64 } else { 0 },
        traffic_class: w.cm.ids[&id].tos,
        numb_path: 1,
        sl: 0,
        mtu_selector: 2,
        rate_selector: 2,
        rate: 3,
        packet_life_time_selector: 2,
        packet_life_time: PACKET_LIFE_TIME,
        preference: 0,
    })
}

fn addr_bytes<const N: usize>(a: Option<SockAddr>) -> [u8; N] {
    let mut b = [0u8; N];
    if let Some(a) = a {
        a.encode(&mut b);
    }
    b
}

fn query_route(w: &World, id: u32, resp: u64, out: usize) -> Result<(), Errno> {
    let i = &w.cm.ids[&id];
    let mut r = RdmaUcmQueryRouteResp {
        src_addr: addr_bytes(i.src),
        dst_addr: addr_bytes(i.dst),
        ..Default::default()
    };
    if let Some(h) = i.hca {
        r.node_guid = node_guid_be(w, h);
        r.port_num = 1;
        r.ibdev_index = h as u32;
        if matches!(i.st, St::RouteResolved | St::Connect | St::Connected) || i.conn.is_some() {
            if let Some(p) = user_path(w, id) {
                r.ib_route[0] = p;
                r.num_paths = 1;
            }
        } else if let Some(p) = user_path(w, id) {
            // Address resolved: the GIDs are known, the path not yet.
            r.ib_route[0].sgid = p.sgid;
            r.ib_route[0].dgid = p.dgid;
            r.ib_route[0].pkey = p.pkey;
        } else {
            r.ib_route[0].sgid = gid_of(w, h, w.hcas[h].info.lid);
            r.ib_route[0].pkey = 0xffffu16.to_be();
        }
    }
    respond(resp, out, &r)
}

fn query_addr(w: &World, id: u32, resp: u64, out: usize) -> Result<(), Errno> {
    let i = &w.cm.ids[&id];
    let mut r = RdmaUcmQueryAddrResp {
        src_size: i.src.map_or(0, |a| a.len() as u16),
        dst_size: i.dst.map_or(0, |a| a.len() as u16),
        src_addr: addr_bytes(i.src),
        dst_addr: addr_bytes(i.dst),
        ..Default::default()
    };
    if let Some(h) = i.hca {
        r.node_guid = node_guid_be(w, h);
        r.port_num = 1;
        r.pkey = 0xffff;
        r.ibdev_index = h as u32;
    }
    respond(resp, out, &r)
}

/// `sockaddr_ib` holding a GID.
fn sib(gid: [u8; 16]) -> [u8; 128] {
    let mut b = [0u8; 128];
    b[0..2].copy_from_slice(&mlx5_ffi::ucma::af::IB.to_ne_bytes());
    b[2..4].copy_from_slice(&0xffffu16.to_be_bytes());
    b[8..24].copy_from_slice(&gid);
    b
}

fn query_gid(w: &World, id: u32, resp: u64, out: usize) -> Result<(), Errno> {
    let mut r = RdmaUcmQueryAddrResp::default();
    let i = &w.cm.ids[&id];
    if let Some(h) = i.hca {
        r.node_guid = node_guid_be(w, h);
        r.port_num = 1;
        r.pkey = 0xffff;
        r.ibdev_index = h as u32;
        let (sgid, dgid) = match path_of(w, id) {
            Some((_, s, _, d)) => (s, d),
            None => (gid_of(w, h, w.hcas[h].info.lid), [0; 16]),
        };
        r.src_addr = sib(sgid);
        r.dst_addr = sib(dgid);
        r.src_size = 48;
        r.dst_size = 48;
    }
    respond(resp, out, &r)
}

fn query_path(w: &World, id: u32, resp: u64, out: usize) -> Result<(), Errno> {
    if out < size_of::<RdmaUcmQueryPathResp>() {
        return Err(ENOSPC);
    }
    let i = &w.cm.ids[&id];
    let routed =
        matches!(i.st, St::RouteResolved | St::Connect | St::Connected) || i.conn.is_some();
    let path = if routed { user_path(w, id) } else { None };
    let mut bytes = RdmaUcmQueryPathResp::default().as_bytes().to_vec();
    if let Some(p) = path.filter(|_| out >= 8 + size_of::<IbPathRecData>()) {
        bytes[0..4].copy_from_slice(&1u32.to_ne_bytes());
        // An SA PathRecord in wire format.
        let mut rec = [0u8; 64];
        rec[8..24].copy_from_slice(&p.dgid);
        rec[24..40].copy_from_slice(&p.sgid);
        rec[40..42].copy_from_slice(&p.dlid.to_ne_bytes());
        rec[42..44].copy_from_slice(&p.slid.to_ne_bytes());
        rec[44..48].copy_from_slice(&u32::from(p.hop_limit).to_be_bytes());
        rec[48] = p.traffic_class;
        rec[49] = 0x80 | 1;
        rec[50..52].copy_from_slice(&p.pkey.to_ne_bytes());
        rec[54] = (2 << 6) | p.mtu as u8;
        rec[55] = (2 << 6) | p.rate;
        rec[56] = (2 << 6) | p.packet_life_time;
        // IB_PATH_GMP | IB_PATH_PRIMARY | IB_PATH_BIDIRECTIONAL
        bytes.extend_from_slice(&(0x1u32 | 0x2 | 0x18).to_ne_bytes());
        bytes.extend_from_slice(&[0; 4]);
        bytes.extend_from_slice(&rec);
    }
    mem::write(resp, &bytes)
}

// ---------------------------------------------------------------------------------------
// The connection

fn send(w: &mut World, hca: usize, dst_lid: u16, msg: &CmMsg) {
    w.cm.tid = w.cm.tid.wrapping_add(1);
    let tid = w.cm.tid;
    let pkt = Packet {
        src_hca: hca,
        dst_lid,
        slid: w.hcas[hca].info.lid,
        opcode: op::UD_SEND_ONLY,
        dst_qpn: 1,
        src_qpn: 1,
        qkey: GSI_QKEY,
        payload: Payload::from_vec(msg.encode(tid)),
        ..Default::default()
    };
    crate::device::send_gsi(w, pkt);
}

/// Send `msg` and keep retransmitting it until answered.
fn send_retried(w: &mut World, id: u32, msg: CmMsg) {
    let Some((hca, peer)) =
        w.cm.ids
            .get(&id)
            .and_then(|i| Some((i.hca?, i.conn.as_ref()?.peer_lid)))
    else {
        return;
    };
    send(w, hca, peer, &msg);
    let due = w.now() + w.cm.retry_ns();
    if let Some(c) = w.cm.ids.get_mut(&id).and_then(|i| i.conn.as_mut()) {
        c.retx = Some((msg, due, TRIES - 1));
    }
}

/// Send an answer (kept for duplicates of what it answers).
fn send_answer(w: &mut World, id: u32, msg: CmMsg) {
    let Some((hca, peer)) =
        w.cm.ids
            .get(&id)
            .and_then(|i| Some((i.hca?, i.conn.as_ref()?.peer_lid)))
    else {
        return;
    };
    send(w, hca, peer, &msg);
    if let Some(c) = w.cm.ids.get_mut(&id).and_then(|i| i.conn.as_mut()) {
        c.retx = None;
        c.last = Some(msg);
    }
}

fn private_max(qp_type: u8) -> usize {
    if qp_type == mlx5_ffi::uverbs::qp_type::UD {
        mad::pd::SIDR_REQ - mad::CMA_HDR
    } else {
        mad::pd::REQ - mad::CMA_HDR
    }
}

fn connect(w: &mut World, id: u32, p: &RdmaUcmConnParam) -> Result<(), Errno> {
    let i = &w.cm.ids[&id];
    if i.st != St::RouteResolved || p.valid == 0 {
        return Err(EINVAL);
    }
    let len = usize::from(p.private_data_len);
    if len > private_max(i.qp_type) {
        return Err(EINVAL);
    }
    let (Some(hca), Some(src), Some(dst), Some(mut peer)) = (i.hca, i.src, i.dst, i.peer) else {
        return Err(EINVAL);
    };
    let (ps, qp_type) = (i.ps, i.qp_type);
    // A loopback destination: the listener of that port in this process, or wherever it
    // listens on the host.
    if peer == w.hcas[hca].info.lid && !has_listener(w, hca, ps, dst.port()) {
        if let Some(n) = ucma_ports::lookup(ps, dst.port()) {
            peer = n;
        }
    }
    let mut private =
        cma_hdr_encode(src.port(), src.ip16(), dst.ip16(), dst.ipv4().is_some()).to_vec();
    private.extend_from_slice(&p.private_data[..len]);
    let local_comm = w.cm.rand();
    let psn = w.cm.rand() & 0xff_ffff;
    let lid = w.hcas[hca].info.lid;
    let conn = Conn {
        cs: Cs::ReqSent,
        local_comm,
        remote_comm: 0,
        peer_lid: peer,
        peer_gid: gid_of(w, hca, peer),
        local_qpn: p.qp_num & 0xff_ffff,
        remote_qpn: 0,
        local_psn: psn,
        remote_psn: 0,
        responder_resources: p.responder_resources,
        initiator_depth: p.initiator_depth,
        retry_count: p.retry_count.min(7),
        rnr_retry: p.rnr_retry_count.min(7),
        mtu: port_mtu(w, hca),
        qkey: p.qkey,
        retx: None,
        last: None,
        ended: false,
    };
    let sid = sid_of(ps, dst.port());
    let msg = if qp_type == mlx5_ffi::uverbs::qp_type::UD {
        CmMsg::SidrReq {
            request_id: local_comm,
            service_id: sid,
            private,
        }
    } else {
        CmMsg::Req(mad::Req {
            local_comm,
            service_id: sid,
            ca_guid: w.hcas[hca].info.node_guid,
            qpn: conn.local_qpn,
            responder_resources: conn.responder_resources,
            initiator_depth: conn.initiator_depth,
            transport: u8::from(qp_type == mlx5_ffi::uverbs::qp_type::UC),
            flow_control: p.flow_control != 0,
            psn,
            retry_count: conn.retry_count,
            pkey: 0xffff,
            mtu: conn.mtu,
            rnr_retry: conn.rnr_retry,
            srq: p.srq != 0,
            local_lid: lid,
            remote_lid: peer,
            local_gid: gid_of(w, hca, lid),
            remote_gid: conn.peer_gid,
            traffic_class: w.cm.ids[&id].tos,
            hop_limit: if w.hcas[hca].info.is_roce() { 64 } else { 0 },
            sl: 0,
            ack_timeout: ACK_TIMEOUT,
            private,
        })
    };
    let i = id_mut(w, id)?;
    i.conn = Some(Conn {
        cs: if qp_type == mlx5_ffi::uverbs::qp_type::UD {
            Cs::SidrReqSent
        } else {
            Cs::ReqSent
        },
        ..conn
    });
    i.st = St::Connect;
    send_retried(w, id, msg);
    Ok(())
}

fn has_listener(w: &World, hca: usize, ps: u16, port: u16) -> bool {
    find_listener(w, hca, ps, port).is_some()
}

/// Whether an id of this process is bound to (`ps`, `port`) without listening (yet).
fn bound_here(w: &World, ps: u16, port: u16) -> bool {
    w.cm.ids.values().any(|i| {
        i.st == St::Bound
            && i.ps == ps
            && i.claim.is_some()
            && i.src.is_some_and(|s| s.port() == port)
    })
}

fn find_listener(w: &World, hca: usize, ps: u16, port: u16) -> Option<u32> {
    w.cm.ids
        .iter()
        .find(|(_, i)| {
            i.st == St::Listen
                && i.ps == ps
                && i.src.is_some_and(|s| s.port() == port)
                && i.hca.is_none_or(|h| h == hca)
        })
        .map(|(&n, _)| n)
}

fn accept(w: &mut World, id: u32, uid: u64, p: &RdmaUcmConnParam) -> Result<(), Errno> {
    let i = id_mut(w, id)?;
    let Some(cs) = i.conn.as_ref().map(|c| c.cs) else {
        return Err(EINVAL);
    };
    if p.valid == 0 {
        // The active side after CONNECT_RESPONSE: the RTU.
        if cs != Cs::RepRcvd {
            return Err(EINVAL);
        }
        let c = i.conn.as_mut().ok_or(EINVAL)?;
        c.cs = Cs::Established;
        let msg = CmMsg::Rtu {
            local_comm: c.local_comm,
            remote_comm: c.remote_comm,
        };
        i.st = St::Connected;
        send_answer(w, id, msg);
        return Ok(());
    }
    if uid != 0 {
        i.uid = uid;
    }
    match cs {
        Cs::ReqRcvd => {
            if usize::from(p.private_data_len) > mad::pd::REP {
                return Err(EINVAL);
            }
            let i = id_mut(w, id)?;
            let hca = i.hca.ok_or(EINVAL)?;
            let c = i.conn.as_mut().ok_or(EINVAL)?;
            // The PSN was chosen at the REQ: librdmacm moves the QP to RTS before ACCEPT.
            let psn = c.local_psn;
            c.local_qpn = p.qp_num & 0xff_ffff;
            c.responder_resources = p.responder_resources;
            c.initiator_depth = p.initiator_depth;
            c.rnr_retry = p.rnr_retry_count.min(7);
            c.cs = Cs::RepSent;
            let msg = CmMsg::Rep(mad::Rep {
                local_comm: c.local_comm,
                remote_comm: c.remote_comm,
                qpn: c.local_qpn,
                psn,
                responder_resources: c.responder_resources,
                initiator_depth: c.initiator_depth,
                flow_control: p.flow_control != 0,
                rnr_retry: c.rnr_retry,
                srq: p.srq != 0,
                ca_guid: 0,
                private: p.private_data[..usize::from(p.private_data_len)].to_vec(),
            });
            let msg = match msg {
                CmMsg::Rep(mut r) => {
                    r.ca_guid = w.hcas[hca].info.node_guid;
                    CmMsg::Rep(r)
                }
                m => m,
            };
            send_retried(w, id, msg);
            Ok(())
        }
        Cs::SidrReqRcvd => {
            if usize::from(p.private_data_len) > mad::pd::SIDR_REP {
                return Err(EINVAL);
            }
            let i = id_mut(w, id)?;
            let ps = i.ps;
            let port = i.src.map_or(0, |s| s.port());
            let c = i.conn.as_mut().ok_or(EINVAL)?;
            c.local_qpn = p.qp_num & 0xff_ffff;
            c.cs = Cs::Idle;
            let msg = CmMsg::SidrRep {
                request_id: c.remote_comm,
                status: 0,
                qpn: c.local_qpn,
                qkey: if p.qkey != 0 { p.qkey } else { RDMA_UDP_QKEY },
                service_id: sid_of(ps, port),
                private: p.private_data[..usize::from(p.private_data_len)].to_vec(),
            };
            i.st = St::Connected;
            send_answer(w, id, msg);
            Ok(())
        }
        _ => Err(EINVAL),
    }
}

fn reject(w: &mut World, id: u32, reason: u8, private: &[u8]) -> Result<(), Errno> {
    let i = id_mut(w, id)?;
    let ps = i.ps;
    let port = i.src.map_or(0, |s| s.port());
    let Some(c) = i.conn.as_mut() else {
        return Err(EINVAL);
    };
    let msg = match c.cs {
        Cs::ReqRcvd | Cs::RepRcvd => {
            if private.len() > mad::pd::REJ {
                return Err(EINVAL);
            }
            CmMsg::Rej {
                local_comm: c.local_comm,
                remote_comm: c.remote_comm,
                reason: u16::from(reason),
                private: private.to_vec(),
            }
        }
        Cs::SidrReqRcvd => {
            if private.len() > mad::pd::SIDR_REP {
                return Err(EINVAL);
            }
            CmMsg::SidrRep {
                request_id: c.remote_comm,
                status: 2, // IB_SIDR_REJECT
                qpn: 0,
                qkey: 0,
                service_id: sid_of(ps, port),
                private: private.to_vec(),
            }
        }
        _ => return Err(EINVAL),
    };
    c.cs = Cs::Idle;
    c.ended = true;
    i.st = St::Disconnected;
    send_answer(w, id, msg);
    Ok(())
}

fn disconnect(w: &mut World, id: u32) -> Result<(), Errno> {
    let i = id_mut(w, id)?;
    let Some(c) = i.conn.as_mut() else {
        return Err(EINVAL);
    };
    match c.cs {
        Cs::Established | Cs::RepSent | Cs::RepRcvd => {
            c.cs = Cs::DreqSent;
            let msg = CmMsg::Dreq {
                local_comm: c.local_comm,
                remote_comm: c.remote_comm,
                remote_qpn: c.remote_qpn,
            };
            send_retried(w, id, msg);
        }
        Cs::DreqRcvd => {
            c.cs = Cs::Idle;
            let msg = CmMsg::Drep {
                local_comm: c.local_comm,
                remote_comm: c.remote_comm,
            };
            i.st = St::Disconnected;
            send_answer(w, id, msg);
        }
        _ => {}
    }
    Ok(())
}

/// Destroy an id as the kernel does: end its connection on the wire, drop its queued
/// events, give back its port, destroy the connection requests it has not handed out yet.
/// Returns its `events_reported`.
fn destroy(w: &mut World, id: u32) -> u32 {
    let Some(i) = w.cm.ids.get(&id) else {
        return 0;
    };
    let chan = i.chan;
    let msg = i.conn.as_ref().and_then(|c| match c.cs {
        Cs::Established | Cs::RepSent | Cs::RepRcvd => Some(CmMsg::Dreq {
            local_comm: c.local_comm,
            remote_comm: c.remote_comm,
            remote_qpn: c.remote_qpn,
        }),
        Cs::DreqRcvd => Some(CmMsg::Drep {
            local_comm: c.local_comm,
            remote_comm: c.remote_comm,
        }),
        Cs::ReqRcvd | Cs::ReqSent => Some(CmMsg::Rej {
            local_comm: c.local_comm,
            remote_comm: c.remote_comm,
            reason: u16::from(if c.cs == Cs::ReqSent {
                rej::TIMEOUT
            } else {
                rej::CONSUMER_DEFINED
            }),
            private: Vec::new(),
        }),
        Cs::SidrReqRcvd => Some(CmMsg::SidrRep {
            request_id: c.remote_comm,
            status: 2,
            qpn: 0,
            qkey: 0,
            service_id: 0,
            private: Vec::new(),
        }),
        _ => None,
    });
    if let Some(m) = msg {
        send_answer(w, id, m);
    }
    // Connection requests still queued for a listener go with it.
    let children: Vec<u32> =
        w.cm.chans
            .get(&chan)
            .map(|c| {
                c.queue
                    .iter()
                    .filter(|e| e.owner == id)
                    .filter_map(|e| e.child)
                    .collect()
            })
            .unwrap_or_default();
    let events = w.cm.ids.remove(&id).map_or(0, |i| i.events_reported);
    w.cm.mcs.retain(|_, m| m.id != id);
    if let Some(c) = w.cm.chans.get_mut(&chan) {
        c.queue.retain(|e| e.owner != id);
        if c.queue.is_empty() && c.signaled {
            eventfd_clear(c.efd.as_raw_fd());
            c.signaled = false;
        }
    }
    for ch in children {
        destroy(w, ch);
    }
    events
}

fn init_qp_attr(w: &World, id: u32, state: u32) -> Result<IbUverbsQpAttr, Errno> {
    let i = &w.cm.ids[&id];
    let hca = i.hca.ok_or(EINVAL)?;
    let ud = i.qp_type == mlx5_ffi::uverbs::qp_type::UD;
    let mut a = IbUverbsQpAttr {
        qp_state: state,
        port_num: 1,
        ..Default::default()
    };
    match u8::try_from(state).map_err(|_| EINVAL)? {
        qp_state::INIT => {
            a.qp_attr_mask = qa::STATE | qa::PKEY_INDEX | qa::PORT;
            if ud {
                a.qkey = RDMA_UDP_QKEY;
                a.qp_attr_mask |= qa::QKEY;
            } else {
                a.qp_attr_mask |= qa::ACCESS_FLAGS;
                // With a connection the IB CM's attributes, before it none (cma.c).
                if let Some(c) = &i.conn {
                    a.qp_access_flags = access::REMOTE_WRITE;
                    if c.responder_resources > 0 {
                        a.qp_access_flags |= access::REMOTE_READ | access::REMOTE_ATOMIC;
                    }
                }
            }
        }
        qp_state::RTR => {
            a.qp_attr_mask = qa::STATE;
            if !ud {
                let c = i
                    .conn
                    .as_ref()
                    .filter(|c| c.remote_qpn != 0)
                    .ok_or(EINVAL)?;
                a.qp_attr_mask |= qa::AV
                    | qa::PATH_MTU
                    | qa::DEST_QPN
                    | qa::RQ_PSN
                    | qa::MAX_DEST_RD_ATOMIC
                    | qa::MIN_RNR_TIMER;
                a.ah_attr = ah_to(w, hca, c.peer_lid, c.peer_gid, i.tos);
                a.path_mtu = u32::from(c.mtu);
                a.dest_qp_num = c.remote_qpn;
                a.rq_psn = c.remote_psn;
                a.max_dest_rd_atomic = c.responder_resources;
                a.min_rnr_timer = 0;
            }
        }
        qp_state::RTS => {
            a.qp_attr_mask = qa::STATE | qa::SQ_PSN;
            if !ud {
                let c = i
                    .conn
                    .as_ref()
                    .filter(|c| c.remote_qpn != 0)
                    .ok_or(EINVAL)?;
                a.qp_attr_mask |=
                    qa::TIMEOUT | qa::RETRY_CNT | qa::RNR_RETRY | qa::MAX_QP_RD_ATOMIC;
                a.sq_psn = c.local_psn;
                a.timeout = ACK_TIMEOUT;
                a.retry_cnt = c.retry_count;
                a.rnr_retry = c.rnr_retry;
                a.max_rd_atomic = c.initiator_depth;
            }
        }
        _ => return Err(EINVAL),
    }
    Ok(a)
}

/// The address vector to fabric node `lid` from HCA `hca`.
fn ah_to(w: &World, hca: usize, lid: u16, gid: [u8; 16], tos: u8) -> IbUverbsAhAttr {
    let mut ah = IbUverbsAhAttr {
        port_num: 1,
        ..Default::default()
    };
    if w.hcas[hca].info.is_roce() {
        ah.is_global = 1;
        ah.grh = IbUverbsGlobalRoute {
            dgid: gid,
            sgid_index: sgid_index(w, hca),
            hop_limit: 64,
            traffic_class: tos,
            ..Default::default()
        };
    } else {
        ah.dlid = lid;
    }
    ah
}

fn join(w: &mut World, id: u32, uid: u64, resp: u64, out: usize, a: SockAddr) -> Result<(), Errno> {
    let i = &w.cm.ids[&id];
    let Some(hca) = i.hca else {
        return Err(Errno(libc::ENODEV));
    };
    if i.qp_type != mlx5_ffi::uverbs::qp_type::UD {
        return Err(Errno(libc::ENOTSUP));
    }
    if out < size_of::<RdmaUcmCreateIdResp>() {
        return Err(ENOSPC);
    }
    let n = w.cm.next_id();
    mem::write(resp, RdmaUcmCreateIdResp { id: n }.as_bytes())?;
    w.cm.mcs.insert(
        n,
        Mc {
            id,
            events_reported: 0,
        },
    );
    // The MGID the kernel derives from an IPv4 group (cma_set_mgid), or the IPv6 group.
    let mut mgid = a.ip16();
    if let Some(ip) = a.ipv4() {
        mgid = [
            0xff,
            0x12,
            0x40,
            0x1b,
            0xff,
            0xff,
            0,
            0,
            0,
            0,
            0,
            0,
            ip[0] & 0x0f,
            ip[1],
            ip[2],
            ip[3],
        ];
    }
    let mut ud = RdmaUcmUdParam {
        qp_num: 0xff_ffff,
        qkey: RDMA_UDP_QKEY,
        ..Default::default()
    };
    ud.ah_attr = ah_to(w, hca, 0xc000 | u16::from(mgid[15]), mgid, 0);
    ud.ah_attr.is_global = 1;
    ud.ah_attr.grh.dgid = mgid;
    let mut r = RdmaUcmEventResp {
        uid,
        id: n,
        event: event::MULTICAST_JOIN,
        ..Default::default()
    };
    r.set_ud(&ud);
    push(w, id, Some(n), None, r);
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The CM on the wire

/// A QP1 (GSI) packet reached HCA `pkt.dst_hca`: a CM message, or garbage to count.
pub(crate) fn gsi_receive(w: &mut World, pkt: &Packet) {
    let hca = pkt.dst_hca;
    if pkt.qkey != GSI_QKEY {
        w.hcas[hca].counters.rx_foreign += 1;
        w.hcas[hca].counters.packets_dropped += 1;
        return;
    }
    let Some((_, msg)) = CmMsg::decode(&pkt.payload) else {
        w.hcas[hca].counters.rx_bad_packets += 1;
        w.hcas[hca].counters.packets_dropped += 1;
        return;
    };
    if !handle(w, hca, pkt.slid, msg) {
        w.hcas[hca].counters.rx_foreign += 1;
        w.hcas[hca].counters.packets_dropped += 1;
    }
}

/// The connection of ours on `hca` with `local_comm`, talking to node `from`.
fn conn_by_local(w: &World, hca: usize, from: u16, local_comm: u32) -> Option<u32> {
    w.cm.ids
        .iter()
        .find(|(_, i)| {
            i.hca == Some(hca)
                && i.conn
                    .as_ref()
                    .is_some_and(|c| c.local_comm == local_comm && c.peer_lid == from)
        })
        .map(|(&n, _)| n)
}

/// The passive connection on `hca` made by node `from`'s `remote_comm`.
fn conn_by_remote(w: &World, hca: usize, from: u16, remote_comm: u32) -> Option<u32> {
    w.cm.ids
        .iter()
        .find(|(_, i)| {
            i.hca == Some(hca)
                && i.conn
                    .as_ref()
                    .is_some_and(|c| c.remote_comm == remote_comm && c.peer_lid == from)
        })
        .map(|(&n, _)| n)
}

fn resend_last(w: &mut World, id: u32) {
    let Some((hca, peer, Some(m))) = w.cm.ids.get(&id).and_then(|i| {
        Some((
            i.hca?,
            i.conn.as_ref()?.peer_lid,
            i.conn.as_ref()?.last.clone(),
        ))
    }) else {
        return;
    };
    send(w, hca, peer, &m);
}

/// Handle one CM message; false if it belongs to nothing of ours.
fn handle(w: &mut World, hca: usize, from: u16, msg: CmMsg) -> bool {
    match msg {
        CmMsg::Req(r) => {
            if let Some(id) = conn_by_remote(w, hca, from, r.local_comm) {
                // A duplicate: answer it again (nothing yet if the user has not answered).
                resend_last(w, id);
                if let Some((m, _, _)) = w.cm.ids[&id].conn.as_ref().and_then(|c| c.retx.clone()) {
                    let peer = w.cm.ids[&id].conn.as_ref().map_or(from, |c| c.peer_lid);
                    send(w, hca, peer, &m);
                }
                return true;
            }
            let rej = |w: &mut World, reason: u8| {
                let m = CmMsg::Rej {
                    local_comm: 0,
                    remote_comm: r.local_comm,
                    reason: u16::from(reason),
                    private: Vec::new(),
                };
                send(w, hca, from, &m);
            };
            let Some((ps, port)) = ps_of_sid(r.service_id) else {
                rej(w, rej::INVALID_SERVICE_ID);
                return true;
            };
            let Some(listener) = find_listener(w, hca, ps, port)
                .filter(|l| w.cm.ids[l].qp_type != mlx5_ffi::uverbs::qp_type::UD)
            else {
                if bound_here(w, ps, port) {
                    // Bound but not listening yet: on a real host LISTEN follows BIND long
                    // before a REQ can arrive; here the REQ is dropped and comes again.
                    return true;
                }
                rej(w, rej::INVALID_SERVICE_ID);
                return true;
            };
            let Some((sport, sip, dip, v4)) = cma_hdr_decode(&r.private) else {
                rej(w, rej::CONSUMER_DEFINED);
                return true;
            };
            let addr = |ip: [u8; 16], port: u16| {
                if v4 {
                    SockAddr::V4 {
                        ip: [ip[12], ip[13], ip[14], ip[15]],
                        port,
                    }
                } else {
                    SockAddr::V6 { ip, port, scope: 0 }
                }
            };
            let l = &w.cm.ids[&listener];
            let (chan, uid, lps, qp_type, tos) = (l.chan, l.uid, l.ps, l.qp_type, l.tos);
            let n = w.cm.next_id();
            let local_comm = w.cm.rand();
            let local_psn = w.cm.rand() & 0xff_ffff;
            let mtu = r.mtu.min(port_mtu(w, hca));
            w.cm.ids.insert(
                n,
                CmId {
                    chan,
                    uid,
                    ps: lps,
                    qp_type,
                    st: St::Connect,
                    hca: Some(hca),
                    src: Some(addr(dip, port)),
                    dst: Some(addr(sip, sport)),
                    peer: Some(from),
                    claim: None,
                    events_reported: 0,
                    tos,
                    conn: Some(Conn {
                        cs: Cs::ReqRcvd,
                        local_comm,
                        remote_comm: r.local_comm,
                        peer_lid: from,
                        peer_gid: r.local_gid,
                        local_qpn: 0,
                        remote_qpn: r.qpn,
                        local_psn,
                        remote_psn: r.psn,
                        responder_resources: r.initiator_depth,
                        initiator_depth: r.responder_resources,
                        retry_count: r.retry_count,
                        rnr_retry: r.rnr_retry,
                        mtu,
                        qkey: 0,
                        retx: None,
                        last: None,
                        ended: false,
                    }),
                    pending: true,
                },
            );
            let mut p = RdmaUcmConnParam {
                qp_num: r.qpn,
                private_data_len: (mad::pd::REQ - mad::CMA_HDR) as u8,
                srq: u8::from(r.srq),
                responder_resources: r.initiator_depth,
                initiator_depth: r.responder_resources,
                flow_control: u8::from(r.flow_control),
                retry_count: r.retry_count,
                rnr_retry_count: r.rnr_retry,
                ..Default::default()
            };
            p.private_data[..mad::pd::REQ - mad::CMA_HDR]
                .copy_from_slice(&r.private[mad::CMA_HDR..]);
            let mut e = RdmaUcmEventResp {
                uid,
                id: n,
                event: event::CONNECT_REQUEST,
                ..Default::default()
            };
            e.set_conn(&p);
            push(w, listener, None, Some(n), e);
            true
        }
        CmMsg::SidrReq {
            request_id,
            service_id,
            private,
        } => {
            if let Some(id) = conn_by_remote(w, hca, from, request_id) {
                resend_last(w, id);
                return true;
            }
            let unsupported = |w: &mut World| {
                let m = CmMsg::SidrRep {
                    request_id,
                    status: 1, // IB_SIDR_UNSUPPORTED
                    qpn: 0,
                    qkey: 0,
                    service_id,
                    private: Vec::new(),
                };
                send(w, hca, from, &m);
            };
            let listener = ps_of_sid(service_id)
                .and_then(|(ps, port)| find_listener(w, hca, ps, port))
                .filter(|l| w.cm.ids[l].qp_type == mlx5_ffi::uverbs::qp_type::UD);
            let (Some(listener), Some((sport, sip, dip, v4))) =
                (listener, cma_hdr_decode(&private))
            else {
                unsupported(w);
                return true;
            };
            let port = (service_id & 0xffff) as u16;
            let addr = |ip: [u8; 16], port: u16| {
                if v4 {
                    SockAddr::V4 {
                        ip: [ip[12], ip[13], ip[14], ip[15]],
                        port,
                    }
                } else {
                    SockAddr::V6 { ip, port, scope: 0 }
                }
            };
            let l = &w.cm.ids[&listener];
            let (chan, uid, lps, qp_type, tos) = (l.chan, l.uid, l.ps, l.qp_type, l.tos);
            let n = w.cm.next_id();
            w.cm.ids.insert(
                n,
                CmId {
                    chan,
                    uid,
                    ps: lps,
                    qp_type,
                    st: St::Connect,
                    hca: Some(hca),
                    src: Some(addr(dip, port)),
                    dst: Some(addr(sip, sport)),
                    peer: Some(from),
                    claim: None,
                    events_reported: 0,
                    tos,
                    conn: Some(Conn {
                        cs: Cs::SidrReqRcvd,
                        local_comm: 0,
                        remote_comm: request_id,
                        peer_lid: from,
                        peer_gid: gid_of(w, hca, from),
                        local_qpn: 0,
                        remote_qpn: 0,
                        local_psn: 0,
                        remote_psn: 0,
                        responder_resources: 0,
                        initiator_depth: 0,
                        retry_count: 0,
                        rnr_retry: 0,
                        mtu: port_mtu(w, hca),
                        qkey: 0,
                        retx: None,
                        last: None,
                        ended: false,
                    }),
                    pending: true,
                },
            );
            let len = mad::pd::SIDR_REQ - mad::CMA_HDR;
            let mut ud = RdmaUcmUdParam {
                private_data_len: len as u8,
                ..Default::default()
            };
            ud.private_data[..len].copy_from_slice(&private[mad::CMA_HDR..]);
            let mut e = RdmaUcmEventResp {
                uid,
                id: n,
                event: event::CONNECT_REQUEST,
                ..Default::default()
            };
            e.set_ud(&ud);
            push(w, listener, None, Some(n), e);
            true
        }
        CmMsg::Rep(r) => {
            let Some(id) = conn_by_local(w, hca, from, r.remote_comm) else {
                return false;
            };
            let Some(c) = w.cm.ids.get_mut(&id).and_then(|i| i.conn.as_mut()) else {
                return false;
            };
            match c.cs {
                Cs::ReqSent => {}
                Cs::Established | Cs::RepRcvd => {
                    // A duplicate REP: the RTU again.
                    resend_last(w, id);
                    return true;
                }
                _ => return true,
            }
            c.cs = Cs::RepRcvd;
            c.retx = None;
            c.remote_comm = r.local_comm;
            c.remote_qpn = r.qpn;
            c.remote_psn = r.psn;
            c.responder_resources = r.initiator_depth;
            c.initiator_depth = r.responder_resources;
            c.rnr_retry = c.rnr_retry.min(7);
            let mut p = RdmaUcmConnParam {
                qp_num: r.qpn,
                private_data_len: mad::pd::REP as u8,
                srq: u8::from(r.srq),
                responder_resources: r.initiator_depth,
                initiator_depth: r.responder_resources,
                flow_control: u8::from(r.flow_control),
                rnr_retry_count: r.rnr_retry,
                ..Default::default()
            };
            p.private_data[..mad::pd::REP].copy_from_slice(&r.private);
            ev(w, id, event::CONNECT_RESPONSE, 0, Some(&p));
            true
        }
        CmMsg::Rtu { remote_comm, .. } => {
            let Some(id) = conn_by_local(w, hca, from, remote_comm) else {
                return false;
            };
            let i = id_mut(w, id).ok();
            let Some(i) = i else { return false };
            let Some(c) = i.conn.as_mut() else {
                return false;
            };
            if c.cs == Cs::RepSent {
                c.cs = Cs::Established;
                c.retx = None;
                i.st = St::Connected;
                ev(w, id, event::ESTABLISHED, 0, None);
            }
            true
        }
        CmMsg::Rej {
            remote_comm,
            reason,
            private,
            ..
        } => {
            let Some(id) = conn_by_local(w, hca, from, remote_comm) else {
                return false;
            };
            let Some(i) = w.cm.ids.get_mut(&id) else {
                return false;
            };
            let Some(c) = i.conn.as_mut() else {
                return false;
            };
            if c.ended || !matches!(c.cs, Cs::ReqSent | Cs::RepSent | Cs::RepRcvd) {
                return true;
            }
            c.cs = Cs::Idle;
            c.retx = None;
            c.ended = true;
            i.st = St::Disconnected;
            let mut p = RdmaUcmConnParam {
                private_data_len: mad::pd::REJ as u8,
                ..Default::default()
            };
            p.private_data[..mad::pd::REJ].copy_from_slice(&private);
            ev(w, id, event::REJECTED, i32::from(reason), Some(&p));
            true
        }
        CmMsg::Dreq {
            local_comm,
            remote_comm,
            ..
        } => {
            let Some(id) = conn_by_local(w, hca, from, remote_comm) else {
                // Unknown connection: a DREP anyway, so the peer can finish.
                send(
                    w,
                    hca,
                    from,
                    &CmMsg::Drep {
                        local_comm: remote_comm,
                        remote_comm: local_comm,
                    },
                );
                return false;
            };
            let Some(i) = w.cm.ids.get_mut(&id) else {
                return false;
            };
            let Some(c) = i.conn.as_mut() else {
                return false;
            };
            let drep = CmMsg::Drep {
                local_comm: c.local_comm,
                remote_comm: c.remote_comm,
            };
            match c.cs {
                Cs::Established | Cs::RepSent | Cs::RepRcvd => {
                    c.cs = Cs::DreqRcvd;
                    c.retx = None;
                    c.ended = true;
                    i.st = St::Disconnected;
                    ev(w, id, event::DISCONNECTED, 0, None);
                }
                Cs::DreqSent => {
                    // Both sides disconnect: answer, and this side is done too.
                    c.cs = Cs::Idle;
                    c.retx = None;
                    let first = !c.ended;
                    c.ended = true;
                    i.st = St::Disconnected;
                    send_answer(w, id, drep);
                    if first {
                        ev(w, id, event::DISCONNECTED, 0, None);
                    }
                }
                Cs::Idle => send_answer(w, id, drep),
                _ => {}
            }
            true
        }
        CmMsg::Drep { remote_comm, .. } => {
            let Some(id) = conn_by_local(w, hca, from, remote_comm) else {
                return false;
            };
            let Some(i) = w.cm.ids.get_mut(&id) else {
                return false;
            };
            let Some(c) = i.conn.as_mut() else {
                return false;
            };
            if c.cs == Cs::DreqSent {
                c.cs = Cs::Idle;
                c.retx = None;
                let first = !c.ended;
                c.ended = true;
                i.st = St::Disconnected;
                if first {
                    ev(w, id, event::DISCONNECTED, 0, None);
                }
            }
            true
        }
        CmMsg::SidrRep {
            request_id,
            status,
            qpn,
            qkey,
            private,
            ..
        } => {
            let Some(id) = conn_by_local(w, hca, from, request_id) else {
                return false;
            };
            let Some(i) = w.cm.ids.get_mut(&id) else {
                return false;
            };
            let tos = i.tos;
            let Some(c) = i.conn.as_mut() else {
                return false;
            };
            if c.cs != Cs::SidrReqSent {
                return true;
            }
            c.cs = Cs::Idle;
            c.retx = None;
            c.remote_qpn = qpn;
            c.qkey = qkey;
            let (plid, pgid) = (c.peer_lid, c.peer_gid);
            if status != 0 {
                c.ended = true;
                i.st = St::Disconnected;
                let ud = RdmaUcmUdParam::default();
                ev_ud(w, id, event::UNREACHABLE, i32::from(status), &ud);
                return true;
            }
            i.st = St::Connected;
            let mut ud = RdmaUcmUdParam {
                qp_num: qpn,
                qkey,
                private_data_len: mad::pd::SIDR_REP as u8,
                ..Default::default()
            };
            ud.private_data[..mad::pd::SIDR_REP].copy_from_slice(&private);
            ud.ah_attr = ah_to(w, hca, plid, pgid, tos);
            ev_ud(w, id, event::ESTABLISHED, 0, &ud);
            true
        }
    }
}

/// Retransmit what is due; after the last try, the timeout event. Returns work done.
pub(crate) fn tick(w: &mut World) -> usize {
    if w.cm.ids.is_empty() {
        return 0;
    }
    let now = w.now();
    let due: Vec<u32> =
        w.cm.ids
            .iter()
            .filter(|(_, i)| {
                i.conn
                    .as_ref()
                    .and_then(|c| c.retx.as_ref())
                    .is_some_and(|r| r.1 <= now)
            })
            .map(|(&n, _)| n)
            .collect();
    let retry = w.cm.retry_ns();
    for &id in &due {
        let Some(i) = w.cm.ids.get_mut(&id) else {
            continue;
        };
        let (Some(hca), Some(c)) = (i.hca, i.conn.as_mut()) else {
            continue;
        };
        let Some((msg, _, left)) = c.retx.take() else {
            continue;
        };
        if left > 0 {
            c.retx = Some((msg.clone(), now + retry, left - 1));
            let peer = c.peer_lid;
            send(w, hca, peer, &msg);
            continue;
        }
        // Out of tries: the timeout of what was waiting.
        let cs = c.cs;
        c.cs = Cs::Idle;
        let first = !c.ended;
        c.ended = true;
        i.st = St::Disconnected;
        let kind = match cs {
            Cs::DreqSent => event::DISCONNECTED,
            _ => event::UNREACHABLE,
        };
        let rej = CmMsg::Rej {
            local_comm: c.local_comm,
            remote_comm: c.remote_comm,
            reason: u16::from(rej::TIMEOUT),
            private: Vec::new(),
        };
        let (peer, ud) = (c.peer_lid, i.qp_type == mlx5_ffi::uverbs::qp_type::UD);
        if cs == Cs::ReqSent || cs == Cs::RepSent {
            // Tell the peer, as the CM does when it gives up.
            send(w, hca, peer, &rej);
        }
        if first {
            if ud {
                ev_ud(w, id, kind, -libc::ETIMEDOUT, &RdmaUcmUdParam::default());
            } else {
                ev(w, id, kind, -libc::ETIMEDOUT, None);
            }
        }
    }
    due.len()
}

/// The next retransmission due, if any.
pub(crate) fn next_deadline(w: &World) -> Option<u64> {
    w.cm.ids
        .values()
        .filter_map(|i| i.conn.as_ref()?.retx.as_ref().map(|r| r.1))
        .min()
}
