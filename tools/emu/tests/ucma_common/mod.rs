//! A small rdma_cm client for the emulator's tests: the ucma commands built from
//! `mlx5_ffi::ucma`'s typed structs, as librdmacm builds them, sent to an in-process
//! [`RdmaCmFile`]; responses land in this process's memory.

#![allow(dead_code)]

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use mlx5_emu::{EmuConfig, Emulator, Errno, Fabric, RdmaCmFile, RunMode};
use mlx5_ffi::ucma::*;
use zerocopy::{Immutable, IntoBytes};

/// A threaded emulator with one HCA on the UDP fabric (its own node).
pub fn emulator() -> Emulator {
    Emulator::new(EmuConfig {
        mode: RunMode::Threaded,
        fabric: Fabric::Udp,
        ..EmuConfig::default()
    })
}

/// The fabric address of HCA 0 (its IPv4 address) with `port`.
pub fn addr_of(emu: &Emulator, port: u16) -> SockAddr {
    SockAddr::V4 {
        ip: emu.hca_info(0).unwrap().ipv4,
        port,
    }
}

/// A port unlikely to be used by anything else on the host at the same time.
pub fn port(offset: u16) -> u16 {
    20000 + (std::process::id() % 20000) as u16 + offset
}

/// One event channel.
pub struct Chan {
    pub file: Arc<RdmaCmFile>,
    pub fd: OwnedFd,
}

pub fn sa128(a: SockAddr) -> [u8; 128] {
    let mut b = [0u8; 128];
    a.encode(&mut b);
    b
}

impl Chan {
    pub fn open(emu: &Emulator) -> Chan {
        let o = emu.open_rdma_cm().expect("open rdma_cm");
        Chan {
            file: o.file,
            fd: o.fd,
        }
    }

    /// One command; `Ok(())` when the whole buffer was taken.
    pub fn cmd<T: IntoBytes + Immutable>(&self, c: u32, body: &T, out: usize) -> Result<(), Errno> {
        let b = encode_cmd(c, body, out);
        self.file.command(&b).map(|n| assert_eq!(n, b.len()))
    }

    pub fn create_id(&self, ps: u16, uid: u64) -> Result<u32, Errno> {
        let mut resp = RdmaUcmCreateIdResp::default();
        let c = RdmaUcmCreateId {
            uid,
            response: resp.as_mut_bytes().as_mut_ptr() as u64,
            ps,
            ..Default::default()
        };
        self.cmd(cmd::CREATE_ID, &c, 4)?;
        Ok(resp.id)
    }

    pub fn destroy(&self, id: u32) -> Result<u32, Errno> {
        let mut resp = RdmaUcmDestroyIdResp::default();
        let c = RdmaUcmDestroyId {
            response: resp.as_mut_bytes().as_mut_ptr() as u64,
            id,
            reserved: 0,
        };
        self.cmd(cmd::DESTROY_ID, &c, 4)?;
        Ok(resp.events_reported)
    }

    pub fn bind(&self, id: u32, a: SockAddr) -> Result<(), Errno> {
        let c = RdmaUcmBind {
            id,
            addr_size: a.len() as u16,
            reserved: 0,
            addr: sa128(a),
        };
        self.cmd(cmd::BIND, &c, 0)
    }

    pub fn listen(&self, id: u32) -> Result<(), Errno> {
        self.cmd(cmd::LISTEN, &RdmaUcmListen { id, backlog: 16 }, 0)
    }

    pub fn resolve(&self, id: u32, dst: SockAddr) -> Result<(), Errno> {
        let c = RdmaUcmResolveAddr {
            id,
            timeout_ms: 2000,
            dst_size: dst.len() as u16,
            dst_addr: sa128(dst),
            ..Default::default()
        };
        self.cmd(cmd::RESOLVE_ADDR, &c, 0)
    }

    pub fn resolve_route(&self, id: u32) -> Result<(), Errno> {
        self.cmd(
            cmd::RESOLVE_ROUTE,
            &RdmaUcmResolveRoute {
                id,
                timeout_ms: 2000,
            },
            0,
        )
    }

    pub fn conn_param(qp_num: u32, private: &[u8]) -> RdmaUcmConnParam {
        let mut p = RdmaUcmConnParam {
            qp_num,
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            valid: 1,
            private_data_len: private.len() as u8,
            ..Default::default()
        };
        p.private_data[..private.len()].copy_from_slice(private);
        p
    }

    pub fn connect(&self, id: u32, qp_num: u32, private: &[u8]) -> Result<(), Errno> {
        let c = RdmaUcmConnect {
            conn_param: Self::conn_param(qp_num, private),
            id,
            ..Default::default()
        };
        self.cmd(cmd::CONNECT, &c, 0)
    }

    /// ACCEPT with parameters (passive), or without (`None`: the active side's RTU).
    pub fn accept(&self, id: u32, p: Option<RdmaUcmConnParam>) -> Result<(), Errno> {
        let c = RdmaUcmAccept {
            uid: 0,
            conn_param: p.unwrap_or_default(),
            id,
            ..Default::default()
        };
        self.cmd(cmd::ACCEPT, &c, 0)
    }

    pub fn reject(&self, id: u32) -> Result<(), Errno> {
        let c = RdmaUcmReject {
            id,
            ..Default::default()
        };
        self.cmd(cmd::REJECT, &c, 0)
    }

    pub fn disconnect(&self, id: u32) -> Result<(), Errno> {
        self.cmd(cmd::DISCONNECT, &RdmaUcmDisconnect { id }, 0)
    }

    pub fn init_qp_attr(&self, id: u32, state: u32) -> Result<IbUverbsQpAttr, Errno> {
        let mut a = IbUverbsQpAttr::default();
        let c = RdmaUcmInitQpAttr {
            response: a.as_mut_bytes().as_mut_ptr() as u64,
            id,
            qp_state: state,
        };
        self.cmd(cmd::INIT_QP_ATTR, &c, size_of::<IbUverbsQpAttr>())?;
        Ok(a)
    }

    /// The next event within `limit` (polling the descriptor, then GET_EVENT).
    pub fn event(&self, limit: Duration) -> Option<RdmaUcmEventResp> {
        let mut p = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut p, 1, limit.as_millis() as i32) };
        if n <= 0 {
            return None;
        }
        let mut r = RdmaUcmEventResp::default();
        let c = RdmaUcmGetEvent {
            response: r.as_mut_bytes().as_mut_ptr() as u64,
        };
        self.cmd(cmd::GET_EVENT, &c, size_of::<RdmaUcmEventResp>())
            .expect("GET_EVENT");
        Some(r)
    }

    /// The next event, which must be `kind` (status 0 unless given).
    pub fn expect(&self, kind: u32) -> RdmaUcmEventResp {
        let e = self
            .event(Duration::from_secs(10))
            .unwrap_or_else(|| panic!("no event (waiting for {kind})"));
        assert_eq!(
            e.event, kind,
            "event {} status {} (wanted {kind})",
            e.event, e.status as i32
        );
        e
    }
}

/// An active id on `a` connected to a listener on `l` (listening id `lid`): returns
/// (active id, passive id), both ESTABLISHED.
pub fn connect_pair(a: &Chan, l: &Chan, dst: SockAddr, qpn: (u32, u32)) -> (u32, u32) {
    let id = a.create_id(ps::TCP, 1).unwrap();
    a.resolve(id, dst).unwrap();
    a.expect(event::ADDR_RESOLVED);
    a.resolve_route(id).unwrap();
    a.expect(event::ROUTE_RESOLVED);
    a.connect(id, qpn.0, b"hello").unwrap();
    let req = l.expect(event::CONNECT_REQUEST);
    assert_eq!(&req.conn().private_data[..5], b"hello");
    l.accept(req.id, Some(Chan::conn_param(qpn.1, b"welcome")))
        .unwrap();
    let rep = a.expect(event::CONNECT_RESPONSE);
    assert_eq!(&rep.conn().private_data[..7], b"welcome");
    a.accept(id, None).unwrap();
    l.expect(event::ESTABLISHED);
    (id, req.id)
}
