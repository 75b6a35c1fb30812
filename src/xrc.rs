//! XRC (extended reliable connected transport): one receive queue shared by many senders.
//!
//! - [`XrcDomain`]: `OPEN_XRCD`. A domain opened on a file is shared with every context
//!   (of any process) that opens the same file; [`XrcDomain::private`] makes one of its own.
//!   It is closed when its last user (SRQ, target QP, this handle) is gone.
//! - [`XrcSrq`]: an SRQ of a domain (`CREATE_XSRQ`), completing into one CQ. Its number
//!   ([`XrcSrqNum`]) is what initiators name in every WQE.
//! - [`XrcSendQp`]: the initiator (`IBV_QPT_XRC_SEND`), an RC-like send-only QP connected to
//!   one target QP; each WR names the remote XRC SRQ ([`XrcWr`]), carried in the 16-byte
//!   XRC segment right after the control segment.
//! - [`XrcTgtQp`]: the target (`IBV_QPT_XRC_RECV`), a kernel-only QP of a domain with no
//!   queues of its own: the device receives through the XRC SRQ the packet's XRCETH names,
//!   if that SRQ is in the target's domain (else the initiator gets `REM_INV_REQ_ERR`).
//!   Other contexts open it by number ([`XrcTgtQp::open`]).
//!
//! The initiator and the target are distinct types: a target has nothing to post, an
//! initiator nothing to receive, and an SRQ number is an [`XrcSrqNum`], not a QPN.
//! `docs/xrc-dc.md` describes the wire and the emulated device.

use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::Arc;

use mlx5_ffi::cmd::cmds;
use mlx5_ffi::mlx5::{Mlx5IbCreateQp, Mlx5IbModifyQp};
use mlx5_ffi::uverbs::{
    IB_QP_ACCESS_FLAGS, IB_QP_ALT_PATH, IB_QP_AV, IB_QP_DEST_QPN, IB_QP_MAX_DEST_RD_ATOMIC,
    IB_QP_MIN_RNR_TIMER, IB_QP_PATH_MTU, IB_QP_PKEY_INDEX, IB_QP_PORT, IB_QP_RQ_PSN, IB_QP_SQ_PSN,
    IB_QP_STATE, IB_QP_TIMEOUT, IbUverbsCreateQp, IbUverbsDestroyQp, IbUverbsExModifyQp,
    IbUverbsModifyQp, IbUverbsQpDest, qp_type,
};
use mlx5_ffi::xrc_dc::{IbUverbsCloseXrcd, IbUverbsOpenQp, IbUverbsOpenXrcd};
use mlx5_hw::opcodes::SendOpcode;
use mlx5_hw::wqe::{AtomicSeg, RaddrSeg};

use crate::ah::{AhAttr, GlobalRoute};
use crate::context::Context;
use crate::cq::{Cq, CqShared};
use crate::error::{Error, Result};
use crate::pd::{Access, Pd};
use crate::qp::{ConnectParams, Qp, QpAttr, QpInitAttr, QpState, QpType, RemoteQp, SendQueue};
use crate::srq::Srq;
use crate::uverbs;
use crate::wr::{PostError, RecvWr, SendWr, Sge, WrOp};

/// How [`XrcDomain::open`] treats the file's domain (`oflags` of `ibv_open_xrcd`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XrcdOpen {
    /// The file's existing domain (`EAGAIN` from the kernel if there is none).
    Existing,
    /// The file's domain, created if there is none (`O_CREAT`).
    OrCreate,
    /// A new domain for the file (`O_CREAT | O_EXCL`: `EINVAL` if it has one).
    CreateNew,
}

#[derive(Debug)]
pub(crate) struct XrcdHandle {
    ctx: Context,
    handle: u32,
}

impl Drop for XrcdHandle {
    fn drop(&mut self) {
        let cmd = IbUverbsCloseXrcd {
            xrcd_handle: self.handle,
        };
        // Nothing of ours lives in a domain's memory: a failed close only leaks the handle.
        let _ = self.ctx.destroy::<cmds::CloseXrcd>(&cmd);
    }
}

/// An XRC domain (`struct ibv_xrcd`). Cloning shares the handle; the SRQs and target QPs of
/// the domain hold it, so it closes after them.
#[derive(Clone, Debug)]
pub struct XrcDomain {
    inner: Arc<XrcdHandle>,
}

impl XrcDomain {
    /// A domain of its own, shared with nobody (`fd` -1).
    ///
    /// # Errors
    /// [`Error::Uverbs`] naming OPEN_XRCD (`EOPNOTSUPP` on a device without XRC).
    pub fn private(ctx: &Context) -> Result<Self> {
        Self::open_raw(ctx, u32::MAX, 0)
    }

    /// The domain of the file `fd` refers to (by inode: every context that opens the same
    /// file, in any process, shares it), as `how` says.
    ///
    /// # Errors
    /// [`Error::Uverbs`] naming OPEN_XRCD: `EAGAIN` for [`XrcdOpen::Existing`] when the file
    /// has no domain, `EINVAL` for [`XrcdOpen::CreateNew`] when it has one.
    pub fn open(ctx: &Context, fd: BorrowedFd<'_>, how: XrcdOpen) -> Result<Self> {
        let oflags = match how {
            XrcdOpen::Existing => 0,
            XrcdOpen::OrCreate => libc::O_CREAT,
            XrcdOpen::CreateNew => libc::O_CREAT | libc::O_EXCL,
        };
        // A borrowed descriptor is never negative.
        Self::open_raw(ctx, fd.as_raw_fd() as u32, oflags as u32)
    }

    fn open_raw(ctx: &Context, fd: u32, oflags: u32) -> Result<Self> {
        let cmd = IbUverbsOpenXrcd {
            response: 0,
            fd,
            oflags,
        };
        let (r, ()) = uverbs::write::<cmds::OpenXrcd>(ctx.surface(), &cmd, &())?;
        Ok(Self {
            inner: Arc::new(XrcdHandle {
                ctx: ctx.clone(),
                handle: r.xrcd_handle,
            }),
        })
    }

    /// The context the domain was opened in.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }
}

/// The number of an XRC SRQ, as an initiator names it in each WR (from [`XrcSrq::number`],
/// or from the peer's connection exchange with [`XrcSrqNum::new`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct XrcSrqNum(u32);

impl XrcSrqNum {
    /// The SRQ number `n` (24 bits; the device refuses a number that is no XRC SRQ of the
    /// target's domain with a NAK, never a stray receive).
    ///
    /// # Errors
    /// [`Error::Limit`] above 24 bits.
    pub fn new(n: u32) -> Result<Self> {
        Error::check_limit("srqn", n.into(), 0xFF_FFFF, "of its 24-bit encoding")?;
        Ok(Self(n))
    }

    /// The number.
    pub fn get(self) -> u32 {
        self.0
    }
}

/// An XRC SRQ: the receive queue of every target QP of its domain whose packets name it.
/// Its receive completions go to the CQ given at creation and name the target QP that
/// received. Posting takes `&mut self`.
#[derive(Debug)]
pub struct XrcSrq {
    srq: Srq,
    cq: Arc<CqShared>,
    uidx: u32,
    _xrcd: XrcDomain,
}

impl XrcSrq {
    /// An XRC SRQ of `xrcd` for at least `max_wr` receives of up to `max_sge` SGEs, whose
    /// buffers are registered in `pd`, completing into `cq`.
    ///
    /// # Errors
    /// [`Error::ContextMismatch`] if `pd`, `cq` and `xrcd` are not of one context;
    /// [`Error::Unsupported`] on a context with CQE version 0 (the driver finds XRC receive
    /// completions by the SRQ's user index); as [`Srq::new`] otherwise, naming CREATE_XSRQ.
    pub fn new(xrcd: &XrcDomain, pd: &Pd, cq: &Cq, max_wr: u32, max_sge: u32) -> Result<Self> {
        let ctx = pd.context();
        ctx.check_same("xrcd", xrcd.context(), "pd")?;
        ctx.check_same("cq", &cq.shared().ctx, "pd")?;
        if ctx.cqe_version() != 1 {
            return Err(Error::Unsupported {
                what: "XRC SRQs on a context with CQE version 0",
            });
        }
        let uidx = ctx.alloc_uidx()?;
        let init = crate::srq::XsrqInit {
            xrcd: xrcd.inner.handle,
            cq: cq.shared().handle_id(),
            uidx,
        };
        let srq = match Srq::create(pd, max_wr, max_sge, Some(init)) {
            Ok(s) => s,
            Err(e) => {
                ctx.free_uidx(uidx);
                return Err(e);
            }
        };
        // From here on `srq` frees the user index with the kernel SRQ.
        cq.shared().route_srq(uidx, srq.shared.clone())?;
        Ok(Self {
            srq,
            cq: cq.shared().clone(),
            uidx,
            _xrcd: xrcd.clone(),
        })
    }

    /// The number initiators name.
    pub fn number(&self) -> XrcSrqNum {
        XrcSrqNum(self.srq.srqn())
    }

    /// Usable capacity in WRs.
    pub fn capacity(&self) -> u32 {
        self.srq.capacity()
    }

    /// Post receives (as [`Srq::post_recv`]).
    ///
    /// # Errors
    /// The index of the first bad WR and why; WRs before it are posted.
    pub fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> Result<(), (usize, PostError)> {
        self.srq.post_recv(wrs)
    }
}

impl Drop for XrcSrq {
    fn drop(&mut self) {
        // The CQ forgets the route first; the SRQ (and then the domain) go with the fields.
        self.cq.unroute_srq(self.uidx);
    }
}

/// A send WR of an XRC initiator: the verbs WR and the XRC SRQ it is for.
#[derive(Clone, Copy, Debug)]
pub struct XrcWr<'a> {
    /// The remote XRC SRQ.
    pub srqn: XrcSrqNum,
    /// The request (SEND, SEND with immediate, RDMA WRITE (+IMM), READ, atomics; no UD
    /// destination).
    pub wr: SendWr<'a>,
}

/// An XRC initiator QP (`IBV_QPT_XRC_SEND`): connected like RC to one [`XrcTgtQp`], each
/// WR naming the XRC SRQ behind that target that receives it. Send-only: its init
/// attributes' receive side is ignored. Posting takes `&mut self`.
#[derive(Debug)]
pub struct XrcSendQp {
    qp: Qp,
}

impl XrcSendQp {
    /// Create an initiator with the send side of `init` (its `qp_type` must be
    /// [`QpType::XrcSend`]; `recv_cq`, `srq` and the receive capabilities are not used).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming `qp_type` or `srq`; as [`Qp::new`] otherwise.
    pub fn new(pd: &Pd, init: &QpInitAttr<'_>) -> Result<Self> {
        if init.qp_type != QpType::XrcSend {
            return Err(Error::InvalidArgument {
                attr: "qp_type",
                reason: "an XrcSendQp is created with QpType::XrcSend",
            });
        }
        if init.srq.is_some() {
            return Err(Error::InvalidArgument {
                attr: "srq",
                reason: "an XRC initiator receives nothing (the target's XRC SRQ does)",
            });
        }
        let mut init = *init;
        init.recv_cq = init.send_cq;
        init.cap.max_recv_wr = 0;
        init.cap.max_recv_sge = 0;
        Ok(Self {
            qp: Qp::create(pd, &init, 0, None)?,
        })
    }

    /// The QP (number, state, query, send-queue statistics).
    pub fn qp(&self) -> &Qp {
        &self.qp
    }

    /// QP number (what the target connects to).
    pub fn qpn(&self) -> u32 {
        self.qp.qpn()
    }

    /// RESET -> INIT on `port` (P_Key index of `p`).
    ///
    /// # Errors
    /// As [`Qp::modify`].
    pub fn to_init(&mut self, port: u8, p: &ConnectParams) -> Result<()> {
        self.qp.to_init_with(port, Access::default(), 0, p)
    }

    /// INIT -> RTR towards the target QP `remote` (its number and PSN, LID or GID).
    ///
    /// # Errors
    /// As [`Qp::to_rtr_with`].
    pub fn to_rtr(&mut self, remote: &RemoteQp, p: &ConnectParams) -> Result<()> {
        self.qp.to_rtr_with(remote, p)
    }

    /// RTR -> RTS with send PSN `psn` and the timeout, retry counts and `max_rd_atomic` of
    /// `p`.
    ///
    /// # Errors
    /// As [`Qp::modify`].
    pub fn to_rts(&mut self, psn: u32, p: &ConnectParams) -> Result<()> {
        self.qp.to_rts_with(psn, p)
    }

    /// Any transition of the XRC_SEND state machine (`ib_modify_qp_is_ok`'s table).
    ///
    /// # Errors
    /// As [`Qp::modify`].
    pub fn modify(&mut self, attr: &QpAttr, mask: u32) -> Result<()> {
        self.qp.modify(attr, mask)
    }

    /// Post a chain of WRs and ring the doorbell once. One WQE each: control segment, XRC
    /// segment (the SRQ number), the operation's remote-address/atomic segments, payload.
    ///
    /// # Errors
    /// The index of the first WR refused and why ([`PostError`]); the WRs before it are
    /// posted and rung.
    pub fn post_send(&mut self, wrs: &[XrcWr<'_>]) -> Result<(), (usize, PostError)> {
        let sq = self.qp.sq();
        let mut res = Ok(());
        for (i, w) in wrs.iter().enumerate() {
            if let Err(e) = post_one(sq, &xrc_segment(w.srqn), &w.wr, 0) {
                res = Err((i, e));
                break;
            }
        }
        sq.ring();
        res
    }

    /// Write the WQE of one WR without ringing the doorbell: a caller posting a chain (a
    /// libibverbs provider's `ibv_post_send`, the `ibv_wr_*` builders) writes each WR and
    /// rings once with [`SendQueue::ring`] on [`sq`](Self::sq).
    ///
    /// # Errors
    /// Why the WR is refused ([`PostError`]); it is not posted.
    pub fn post_unrung(&mut self, w: &XrcWr<'_>) -> Result<(), PostError> {
        post_one(self.qp.sq(), &xrc_segment(w.srqn), &w.wr, 0)
    }

    /// The send queue (low-level API: [`SendQueue::ring`], statistics, `retire`).
    pub fn sq(&mut self) -> &mut SendQueue {
        self.qp.sq()
    }
}

/// The XRC segment naming `srqn` (16 bytes: big-endian SRQ number, then reserved).
pub(crate) fn xrc_segment(srqn: XrcSrqNum) -> [u8; 16] {
    let mut s = [0u8; 16];
    s[..4].copy_from_slice(&srqn.0.to_be_bytes());
    s
}

/// Build one WQE of `wr` with the transport segment `prefix` (XRC: 16 bytes, DC: 48) after
/// the control segment, through dp's seam [`SendQueue::begin_with_segments`]: the remote
/// address and atomic segments follow `prefix`, then the payload. RC's operations only.
/// `stream`: a DC WR's DCI stream id (0 for XRC and for a DCI without streams).
pub(crate) fn post_one(
    sq: &mut SendQueue,
    prefix: &[u8],
    wr: &SendWr<'_>,
    stream: u16,
) -> core::result::Result<(), PostError> {
    if wr.ud.is_some() {
        return Err(PostError::BadDestination);
    }
    let (opcode, imm, raddr, atomic) = match wr.op {
        WrOp::Send => (SendOpcode::SEND, [0; 4], None, None),
        WrOp::SendImm { imm } => (SendOpcode::SEND_IMM, imm, None, None),
        WrOp::Write { raddr, rkey } => (SendOpcode::RDMA_WRITE, [0; 4], Some((raddr, rkey)), None),
        WrOp::WriteImm { raddr, rkey, imm } => {
            (SendOpcode::RDMA_WRITE_IMM, imm, Some((raddr, rkey)), None)
        }
        WrOp::Read { raddr, rkey } => (SendOpcode::RDMA_READ, [0; 4], Some((raddr, rkey)), None),
        WrOp::CompareSwap {
            raddr,
            rkey,
            compare,
            swap,
        } => (
            SendOpcode::ATOMIC_CS,
            [0; 4],
            Some((raddr, rkey)),
            Some(AtomicSeg::new(swap, compare)),
        ),
        WrOp::FetchAdd { raddr, rkey, add } => (
            SendOpcode::ATOMIC_FA,
            [0; 4],
            Some((raddr, rkey)),
            Some(AtomicSeg::new(add, 0)),
        ),
        _ => return Err(PostError::BadOpcode),
    };
    let inline = !wr.inline.is_empty() && atomic.is_none();
    if inline && opcode == SendOpcode::RDMA_READ {
        return Err(PostError::BadOpcode);
    }
    let atomic_sge = match (atomic, wr.sg_list.first()) {
        (None, _) => None,
        (Some(_), Some(s)) if s.length >= 8 => Some(Sge { length: 8, ..*s }),
        (Some(_), _) => return Err(PostError::BadAtomicSge),
    };
    // ctrl follows; at most 48 (DC AV) + 16 (raddr) + 16 (atomic) bytes of segments.
    let mut segs = [0u8; 80];
    let mut n = prefix.len().min(48);
    segs[..n].copy_from_slice(&prefix[..n]);
    if let Some((raddr, rkey)) = raddr {
        let r: [u8; 16] = zerocopy::transmute!(RaddrSeg::new(raddr, rkey));
        segs[n..n + 16].copy_from_slice(&r);
        n += 16;
    }
    if let Some(a) = atomic {
        let a: [u8; 16] = zerocopy::transmute!(a);
        segs[n..n + 16].copy_from_slice(&a);
        n += 16;
    }
    let max_gs = sq.geometry().max_gs;
    if !inline && atomic.is_none() && wr.sg_list.len() > max_gs as usize {
        return Err(PostError::TooManySges {
            n: wr.sg_list.len(),
            max: max_gs,
        });
    }
    let b = sq.begin_with_segments(opcode, wr.flags, imm, &segs[..n])?;
    if let Some(sge) = atomic_sge {
        b.sge(&sge)?.finish_on_stream(wr.wr_id, stream);
    } else if inline {
        let mut parts = wr.inline.iter();
        let first = parts.next().map_or(&[][..], |p| &p[..]);
        let mut b = b.inline(first)?;
        for p in parts {
            b = b.inline(p)?;
        }
        b.finish_on_stream(wr.wr_id, stream);
    } else {
        match wr.sg_list.split_first() {
            None => b.finish_on_stream(wr.wr_id, stream),
            Some((first, rest)) => {
                let mut b = b.sge(first)?;
                for s in rest {
                    b = b.sge(s)?;
                }
                b.finish_on_stream(wr.wr_id, stream);
            }
        }
    }
    Ok(())
}

/// The XRC target's rows (`ib_modify_qp_is_ok`'s XRC_TGT column).
fn target_transition(from: QpState, to: QpState) -> Option<(u32, u32)> {
    use QpState::*;
    Some(match (from, to) {
        (_, Reset) | (_, Err) => (0, 0),
        (Reset, Init) => (IB_QP_PKEY_INDEX | IB_QP_PORT | IB_QP_ACCESS_FLAGS, 0),
        (Init, Init) => (0, IB_QP_PKEY_INDEX | IB_QP_PORT | IB_QP_ACCESS_FLAGS),
        (Init, Rtr) => (
            IB_QP_AV
                | IB_QP_PATH_MTU
                | IB_QP_DEST_QPN
                | IB_QP_RQ_PSN
                | IB_QP_MAX_DEST_RD_ATOMIC
                | IB_QP_MIN_RNR_TIMER,
            IB_QP_ALT_PATH | IB_QP_ACCESS_FLAGS | IB_QP_PKEY_INDEX,
        ),
        (Rtr, Rts) => (
            IB_QP_TIMEOUT | IB_QP_SQ_PSN,
            IB_QP_ACCESS_FLAGS | IB_QP_MIN_RNR_TIMER,
        ),
        (Rts, Rts) => (0, IB_QP_ACCESS_FLAGS | IB_QP_MIN_RNR_TIMER),
        _ => return None,
    })
}

/// A QP that lives in the kernel only (no rings of ours): an XRC target or a DC target.
/// Destroyed (or, if opened, closed) on drop.
#[derive(Debug)]
pub(crate) struct KernelQp {
    pub(crate) ctx: Context,
    pub(crate) handle: u32,
    pub(crate) qpn: u32,
    pub(crate) state: QpState,
    pub(crate) port: u8,
    pub(crate) uidx: Option<u32>,
}

impl Drop for KernelQp {
    fn drop(&mut self) {
        let cmd = IbUverbsDestroyQp {
            response: 0,
            qp_handle: self.handle,
            reserved: 0,
        };
        // No memory of ours is the device's: on failure only the user index stays taken
        // (a CQE naming it must not reach a new owner).
        if self.ctx.destroy::<cmds::DestroyQp>(&cmd) {
            if let Some(u) = self.uidx {
                self.ctx.free_uidx(u);
            }
        }
    }
}

impl KernelQp {
    /// The MODIFY_QP command of `attr` under `mask` (values checked; the transition is the
    /// caller's).
    pub(crate) fn modify_cmd(&self, attr: &QpAttr, mask: u32) -> Result<IbUverbsModifyQp> {
        crate::qp::check_values(attr, mask)?;
        let next = if mask & IB_QP_STATE != 0 {
            Some(attr.qp_state.ok_or(Error::InvalidArgument {
                attr: "qp_state",
                reason: "IB_QP_STATE is set but qp_state is None",
            })?)
        } else {
            None
        };
        Ok(IbUverbsModifyQp {
            dest: if mask & IB_QP_AV != 0 {
                crate::qp::qp_dest(&attr.ah_attr)
            } else {
                IbUverbsQpDest::default()
            },
            alt_dest: IbUverbsQpDest::default(),
            qp_handle: self.handle,
            attr_mask: mask,
            qkey: attr.qkey,
            rq_psn: attr.rq_psn,
            sq_psn: attr.sq_psn,
            dest_qp_num: attr.dest_qp_num,
            qp_access_flags: attr.qp_access_flags.0,
            pkey_index: attr.pkey_index,
            alt_pkey_index: 0,
            qp_state: next.map_or(0, QpState::to_u8),
            cur_qp_state: 0,
            path_mtu: attr.path_mtu.map_or(0, crate::qp::Mtu::code),
            path_mig_state: 0,
            en_sqd_async_notify: 0,
            max_rd_atomic: attr.max_rd_atomic,
            max_dest_rd_atomic: attr.max_dest_rd_atomic,
            min_rnr_timer: attr.min_rnr_timer,
            port_num: attr.port_num,
            timeout: attr.timeout,
            retry_cnt: attr.retry_cnt,
            rnr_retry: attr.rnr_retry,
            alt_port_num: 0,
            alt_timeout: 0,
            reserved: [0; 2],
        })
    }

    /// Legacy MODIFY_QP.
    pub(crate) fn modify_legacy(&mut self, attr: &QpAttr, mask: u32) -> Result<()> {
        let cmd = self.modify_cmd(attr, mask)?;
        uverbs::write::<cmds::ModifyQp>(self.ctx.surface(), &cmd, &())?;
        self.applied(attr, mask);
        Ok(())
    }

    /// Extended MODIFY_QP with mlx5's driver response: the DCT number at RTR.
    pub(crate) fn modify_ex(&mut self, attr: &QpAttr, mask: u32) -> Result<u32> {
        let cmd = IbUverbsExModifyQp {
            base: self.modify_cmd(attr, mask)?,
            rate_limit: 0,
            reserved: 0,
        };
        let (_, m) = uverbs::write::<cmds::ExModifyQp>(
            self.ctx.surface(),
            &cmd,
            &Mlx5IbModifyQp::default(),
        )?;
        self.applied(attr, mask);
        Ok(m.dctn)
    }

    fn applied(&mut self, attr: &QpAttr, mask: u32) {
        if mask & IB_QP_PORT != 0 {
            self.port = attr.port_num;
        }
        if mask & IB_QP_STATE != 0 {
            if let Some(s) = attr.qp_state {
                self.state = s;
            }
        }
    }

    /// The address vector towards `remote` with the path knobs of `p`.
    pub(crate) fn path(&self, remote_lid: u16, gid: Option<[u8; 16]>, p: &ConnectParams) -> AhAttr {
        AhAttr {
            dlid: remote_lid,
            sl: p.sl,
            port_num: self.port,
            grh: gid.map(|g| GlobalRoute {
                dgid: g,
                sgid_index: p.sgid_index,
                hop_limit: p.hop_limit,
                traffic_class: p.traffic_class,
                flow_label: p.flow_label,
            }),
            ..AhAttr::default()
        }
    }
}

/// An XRC target QP (`IBV_QPT_XRC_RECV`) of a domain: connected to one initiator, it
/// receives into the XRC SRQ each packet names. No queues, nothing to post or poll here:
/// completions arrive on the XRC SRQ's CQ, naming this QP's number.
#[derive(Debug)]
pub struct XrcTgtQp {
    k: KernelQp,
    _xrcd: XrcDomain,
}

impl XrcTgtQp {
    /// Create a target QP in `xrcd`.
    ///
    /// # Errors
    /// [`Error::Uverbs`] naming CREATE_QP.
    pub fn new(xrcd: &XrcDomain) -> Result<Self> {
        let ctx = xrcd.context().clone();
        let uidx = if ctx.cqe_version() == 1 {
            Some(ctx.alloc_uidx()?)
        } else {
            None
        };
        let cmd = IbUverbsCreateQp {
            response: 0,
            user_handle: crate::context::next_user_handle(),
            // The domain travels in the PD's field (`ib_uverbs_create_qp`).
            pd_handle: xrcd.inner.handle,
            send_cq_handle: 0,
            recv_cq_handle: 0,
            srq_handle: 0,
            max_send_wr: 0,
            max_recv_wr: 0,
            max_send_sge: 0,
            max_recv_sge: 0,
            max_inline_data: 0,
            sq_sig_all: 0,
            qp_type: qp_type::XRC_TGT,
            is_srq: 0,
            reserved: 0,
        };
        let drv = Mlx5IbCreateQp {
            uidx: uidx.unwrap_or(0xFF_FFFF),
            ..Mlx5IbCreateQp::default()
        };
        let (core, _) = match uverbs::write::<cmds::CreateQp>(ctx.surface(), &cmd, &drv) {
            Ok(r) => r,
            Err(e) => {
                if let Some(u) = uidx {
                    ctx.free_uidx(u);
                }
                return Err(e);
            }
        };
        Ok(Self {
            k: KernelQp {
                ctx,
                handle: core.qp_handle,
                qpn: core.qpn,
                state: QpState::Reset,
                port: 1,
                uidx,
            },
            _xrcd: xrcd.clone(),
        })
    }

    /// Open the target QP number `qpn` that another context created in the same domain
    /// (shared through its file): this handle modifies and queries it like its creator's; the
    /// QP lives until its last handle goes.
    ///
    /// # Errors
    /// [`Error::Uverbs`] naming OPEN_QP (`EINVAL`: no target QP of that number in the domain).
    pub fn open(xrcd: &XrcDomain, qpn: u32) -> Result<Self> {
        let ctx = xrcd.context().clone();
        let cmd = IbUverbsOpenQp {
            response: 0,
            user_handle: crate::context::next_user_handle(),
            pd_handle: xrcd.inner.handle,
            qpn,
            qp_type: qp_type::XRC_TGT,
            reserved: [0; 7],
        };
        let (core, ()) = uverbs::write::<cmds::OpenQp>(ctx.surface(), &cmd, &())?;
        Ok(Self {
            k: KernelQp {
                ctx,
                handle: core.qp_handle,
                qpn: core.qpn,
                // Its creator moves it; this handle does not know where it is.
                state: QpState::Reset,
                port: 1,
                uidx: None,
            },
            _xrcd: xrcd.clone(),
        })
    }

    /// QP number (what the initiator connects to).
    pub fn qpn(&self) -> u32 {
        self.k.qpn
    }

    /// The state as last set through this handle.
    pub fn state(&self) -> QpState {
        self.k.state
    }

    /// Any transition of the XRC target's state machine (`ib_modify_qp_is_ok`'s XRC_TGT
    /// column), checked before the syscall.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming `qp_state` for a transition that does not exist, or
    /// `attr_mask` for a missing or extra attribute; [`Error::Uverbs`] naming MODIFY_QP.
    pub fn modify(&mut self, attr: &QpAttr, mask: u32) -> Result<()> {
        let to = if mask & IB_QP_STATE != 0 {
            attr.qp_state.unwrap_or(self.k.state)
        } else {
            self.k.state
        };
        let (req, opt) = target_transition(self.k.state, to).ok_or(Error::InvalidArgument {
            attr: "qp_state",
            reason: "no such transition for an XRC target QP",
        })?;
        if mask & req != req {
            return Err(Error::InvalidArgument {
                attr: "attr_mask",
                reason: "an attribute the XRC target's transition requires is missing",
            });
        }
        if mask & !(req | opt | IB_QP_STATE) != 0 {
            return Err(Error::InvalidArgument {
                attr: "attr_mask",
                reason: "an attribute the XRC target's transition does not take",
            });
        }
        self.k.modify_legacy(attr, mask)
    }

    /// RESET -> INIT on `port` with remote `access` (what initiators may do: WRITE, READ,
    /// atomics into this side's memory).
    ///
    /// # Errors
    /// As [`modify`](Self::modify).
    pub fn to_init(&mut self, port: u8, access: Access, p: &ConnectParams) -> Result<()> {
        let attr = QpAttr {
            qp_state: Some(QpState::Init),
            port_num: port,
            pkey_index: p.pkey_index,
            qp_access_flags: access,
            ..QpAttr::default()
        };
        self.modify(
            &attr,
            IB_QP_STATE | IB_QP_PKEY_INDEX | IB_QP_PORT | IB_QP_ACCESS_FLAGS,
        )
    }

    /// INIT -> RTR towards the initiator `remote`.
    ///
    /// # Errors
    /// As [`modify`](Self::modify).
    pub fn to_rtr(&mut self, remote: &RemoteQp, p: &ConnectParams) -> Result<()> {
        let dev = self.k.ctx.inner.attr.raw.max_qp_rd_atom;
        let attr = QpAttr {
            qp_state: Some(QpState::Rtr),
            path_mtu: Some(p.mtu),
            dest_qp_num: remote.qpn,
            rq_psn: remote.psn,
            ah_attr: self.k.path(remote.lid, remote.gid, p),
            max_dest_rd_atomic: p.max_dest_rd_atomic.unwrap_or(1u8.max(dev.min(16) as u8)),
            min_rnr_timer: p.min_rnr_timer,
            ..QpAttr::default()
        };
        self.modify(
            &attr,
            IB_QP_STATE
                | IB_QP_AV
                | IB_QP_PATH_MTU
                | IB_QP_DEST_QPN
                | IB_QP_RQ_PSN
                | IB_QP_MAX_DEST_RD_ATOMIC
                | IB_QP_MIN_RNR_TIMER,
        )
    }

    /// RTR -> RTS (a target sends only ACKs and READ responses: PSN `psn`, `p`'s timeout).
    ///
    /// # Errors
    /// As [`modify`](Self::modify).
    pub fn to_rts(&mut self, psn: u32, p: &ConnectParams) -> Result<()> {
        let attr = QpAttr {
            qp_state: Some(QpState::Rts),
            sq_psn: psn,
            timeout: p.timeout,
            ..QpAttr::default()
        };
        self.modify(&attr, IB_QP_STATE | IB_QP_SQ_PSN | IB_QP_TIMEOUT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn srq_numbers_are_24_bits() {
        assert!(XrcSrqNum::new(0xFF_FFFF).is_ok());
        assert!(matches!(
            XrcSrqNum::new(0x100_0000),
            Err(Error::Limit { attr: "srqn", .. })
        ));
        assert_eq!(
            xrc_segment(XrcSrqNum(0x12_3456)),
            [0, 0x12, 0x34, 0x56, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        );
    }

    #[test]
    fn the_tables_refuse_what_the_kernel_refuses() {
        use QpState::*;
        // An initiator has no receive attributes at RTR; a target needs them.
        let (req, opt) = crate::qp::initiator_transition(QpType::XrcSend, Init, Rtr).unwrap();
        assert_eq!(req & (IB_QP_MAX_DEST_RD_ATOMIC | IB_QP_MIN_RNR_TIMER), 0);
        assert_eq!(opt & IB_QP_MIN_RNR_TIMER, 0);
        let (req, _) = target_transition(Init, Rtr).unwrap();
        assert_ne!(req & IB_QP_MIN_RNR_TIMER, 0);
        assert!(target_transition(Reset, Rts).is_none());
        assert!(crate::qp::initiator_transition(QpType::Dci, Init, Rts).is_none());
        let (req, _) = crate::qp::initiator_transition(QpType::Dci, Reset, Init).unwrap();
        assert_eq!(
            req & IB_QP_ACCESS_FLAGS,
            0,
            "a DCI's INIT takes no access flags"
        );
    }
}
