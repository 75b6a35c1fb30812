//! Queue pairs (RC, UC, UD): creation with checked capabilities, the state machine, query,
//! destroy, and the send/receive queues they own.

// The queues' internals (ring layout, WQE encoding) are crate-private; their user-facing
// types are re-exported here and at the crate root.
mod mcast;
mod raw;
pub(crate) mod rq;
pub(crate) mod sq;
mod transport;
mod unchecked;
pub(crate) use transport::initiator_transition;

pub use raw::has_cap_net_raw;
pub use rq::{RecvQueue, RqGeometry, rq_geometry};
pub use sq::{
    AnyPayload, BfPolicy, BfregInfo, Gather, Inline, NoPayload, PayloadKind, SendQueue, SqGeometry,
    SqStats, UncheckedBatch, WqeBuilder, sq_geometry, sq_overhead,
};

pub use crate::types::{Mtu, QpState, QpType};

use std::sync::Arc;

use mlx5_ffi::mlx5::{MLX5_QP_FLAG_SCATTER_CQE, MLX5_QP_FLAG_UAR_PAGE_INDEX, Mlx5IbCreateQp};
use mlx5_ffi::uverbs::{
    IB_QP_ACCESS_FLAGS, IB_QP_ALT_PATH, IB_QP_AV, IB_QP_CAP, IB_QP_CUR_STATE, IB_QP_DEST_QPN,
    IB_QP_EN_SQD_ASYNC_NOTIFY, IB_QP_MAX_DEST_RD_ATOMIC, IB_QP_MAX_QP_RD_ATOMIC,
    IB_QP_MIN_RNR_TIMER, IB_QP_PATH_MIG_STATE, IB_QP_PATH_MTU, IB_QP_PKEY_INDEX, IB_QP_PORT,
    IB_QP_QKEY, IB_QP_RATE_LIMIT, IB_QP_RETRY_CNT, IB_QP_RNR_RETRY, IB_QP_RQ_PSN, IB_QP_SQ_PSN,
    IB_QP_STATE, IB_QP_TIMEOUT, IbUverbsCreateQp, IbUverbsDestroyQp, IbUverbsModifyQp,
    IbUverbsQpDest, IbUverbsQueryQp, IbUverbsQueryQpResp,
};

use crate::ah::{AhAttr, GlobalRoute};
use crate::context::{Context, UarMode};
use crate::cq::{Cq, CqShared, CqUser};
use crate::error::{Error, Result};
use crate::mem::wq::WqRing;
use crate::mem::{DmaBuf, leak};
use crate::pd::{Access, Pd};
use crate::srq::{Srq, SrqHandle};
use crate::uverbs;
use crate::wr::{PostError, RecvWr, SendWr};
use mlx5_ffi::cmd::cmds;
use sq::Bfreg;

/// QP capabilities (`struct ibv_qp_cap`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpCap {
    /// Send WRs that may be outstanding.
    pub max_send_wr: u32,
    /// Receive WRs that may be outstanding.
    pub max_recv_wr: u32,
    /// SGEs per send WR.
    pub max_send_sge: u32,
    /// SGEs per receive WR.
    pub max_recv_sge: u32,
    /// Inline bytes per send WR.
    pub max_inline_data: u32,
}

/// QP creation attributes (`struct ibv_qp_init_attr`).
#[derive(Clone, Copy, Debug)]
pub struct QpInitAttr<'a> {
    /// Transport.
    pub qp_type: QpType,
    /// Send CQ.
    pub send_cq: &'a Cq,
    /// Receive CQ.
    pub recv_cq: &'a Cq,
    /// SRQ, if receives come from one.
    pub srq: Option<&'a Srq>,
    /// Requested capabilities (the created QP reports the real ones).
    pub cap: QpCap,
    /// Every send WR generates a completion.
    pub sq_sig_all: bool,
    /// Report unsignaled send WRs as completions (flag [`WcFlags::UNSIGNALED`]) when a later
    /// CQE retires them, so every WR id is seen exactly once. Off by default: the reports walk
    /// the send queue's per-WQEBB records back over the WRs being reported (a cost in
    /// proportion to the WQEBBs retired, paid only on CQEs that retire unsignaled WRs).
    ///
    /// [`WcFlags::UNSIGNALED`]: crate::WcFlags::UNSIGNALED
    pub report_unsignaled: bool,
    /// BlueFlame policy for this QP.
    pub bf_policy: BfPolicy,
    /// Scatter-to-CQE (default on, as libmlx5 without `MLX5_SCATTER_TO_CQE=0`): CREATE_QP
    /// carries `MLX5_QP_FLAG_SCATTER_CQE`, and the kernel lets the device write small payloads
    /// into the CQE instead of memory: on RC (and UC) receives of up to 32 bytes into 64-byte
    /// CQEs, up to 64 bytes into 128-byte CQEs (first half of the entry); on the requester
    /// side READ and atomic results of signaled WRs likewise, but only for QPs created with
    /// [`sq_sig_all`](Self::sq_sig_all) (the kernel's rule without the "allow" flag). The
    /// device saves a DMA write per message; [`Cq::poll`] copies the bytes into the WQE's
    /// scatter list, checking every destination against the registered memory regions (a bad
    /// one completes with `LOC_PROT_ERR`). Low-level pollers see it in the CQE's format bits:
    /// [`RawCq::next`](crate::RawCq::next) copies them too. `false` leaves the flag out (everything by DMA).
    pub scatter_to_cqe: bool,
}

impl<'a> QpInitAttr<'a> {
    /// Defaults: RC-style caps of 64 WRs, 1 SGE, no inline, no SRQ.
    pub fn new(qp_type: QpType, send_cq: &'a Cq, recv_cq: &'a Cq) -> Self {
        Self {
            qp_type,
            send_cq,
            recv_cq,
            srq: None,
            cap: QpCap {
                max_send_wr: 64,
                max_recv_wr: 64,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
            report_unsignaled: false,
            bf_policy: BfPolicy::default(),
            scatter_to_cqe: true,
        }
    }
}

/// Attributes for [`Qp::modify`] (`struct ibv_qp_attr`); only fields named in the mask are sent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpAttr {
    /// Target state.
    pub qp_state: Option<QpState>,
    /// Path MTU; required with `IB_QP_PATH_MTU` (`None` there is an error). QUERY_QP of a QP
    /// that has none yet reports `None`.
    pub path_mtu: Option<Mtu>,
    /// Q_Key (UD).
    pub qkey: u32,
    /// Receive PSN.
    pub rq_psn: u32,
    /// Send PSN.
    pub sq_psn: u32,
    /// Destination QPN.
    pub dest_qp_num: u32,
    /// Remote access allowed (`Access` bits).
    pub qp_access_flags: Access,
    /// P_Key index.
    pub pkey_index: u16,
    /// Port (1-based).
    pub port_num: u8,
    /// Outstanding RDMA READ/atomics as initiator.
    pub max_rd_atomic: u8,
    /// Outstanding RDMA READ/atomics as responder.
    pub max_dest_rd_atomic: u8,
    /// Minimum RNR NAK timer code (0..=31; 0 = 655.36 ms, 1 = 0.01 ms ... 31 = 491.52 ms).
    pub min_rnr_timer: u8,
    /// Local ACK timeout code (0..=31): 4.096 µs × 2^timeout; 0 = wait forever.
    pub timeout: u8,
    /// Transport retry count (0..=7).
    pub retry_cnt: u8,
    /// RNR retry count (0..=7; 7 = infinite).
    pub rnr_retry: u8,
    /// Path to the remote QP (RC/UC INIT->RTR).
    pub ah_attr: AhAttr,
}

/// What the remote side of an RC/UC connection tells us.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteQp {
    /// Remote QP number.
    pub qpn: u32,
    /// The PSN the remote QP starts sending with (it becomes this QP's `rq_psn`).
    pub psn: u32,
    /// Remote LID (IB).
    pub lid: u16,
    /// Remote GID; required on RoCE.
    pub gid: Option<[u8; 16]>,
}

/// The connection knobs of [`Qp::to_init_with`], [`Qp::to_rtr_with`] and [`Qp::to_rts_with`]:
/// a builder, each setter taking a typed value. Values outside their IB encoding are refused by
/// name when used, before any syscall.
///
/// | knob | default | used in | range |
/// |---|---|---|---|
/// | [`pkey_index`](Self::pkey_index) | 0 | RESET→INIT | P_Key table index |
/// | [`mtu`](Self::mtu) | [`Mtu::M1024`] | INIT→RTR (RC, UC) | [`Mtu`] |
/// | [`sl`](Self::sl) | 0 | INIT→RTR (RC, UC) | 0..=15 |
/// | [`sgid_index`](Self::sgid_index) | 0 | INIT→RTR, with a remote GID | GID table index |
/// | [`hop_limit`](Self::hop_limit) | 64 | INIT→RTR, with a remote GID | 0..=255 |
/// | [`traffic_class`](Self::traffic_class) | 0 | INIT→RTR, with a remote GID | 0..=255 |
/// | [`flow_label`](Self::flow_label) | 0 | INIT→RTR, with a remote GID | 20 bits |
/// | [`max_dest_rd_atomic`](Self::max_dest_rd_atomic) | device limit, 1..=16 | INIT→RTR (RC) | ≤ device `max_qp_rd_atom` |
/// | [`min_rnr_timer`](Self::min_rnr_timer) | 12 (0.64 ms) | INIT→RTR (RC) | 0..=31 |
/// | [`timeout`](Self::timeout) | 14 (4.096 µs × 2^14 ≈ 67 ms) | RTR→RTS (RC) | 0..=31 |
/// | [`retry_cnt`](Self::retry_cnt) | 7 | RTR→RTS (RC) | 0..=7 |
/// | [`rnr_retry`](Self::rnr_retry) | 7 (infinite) | RTR→RTS (RC) | 0..=7 |
/// | [`max_rd_atomic`](Self::max_rd_atomic) | device limit, 1..=16 | RTR→RTS (RC) | ≤ device `max_qp_init_rd_atom` |
///
/// The defaults are the ones `to_init`/`to_rtr`/`to_rts` always used (and ibv_rc_pingpong's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectParams {
    pub(crate) pkey_index: u16,
    pub(crate) mtu: Mtu,
    pub(crate) sl: u8,
    pub(crate) sgid_index: u8,
    pub(crate) hop_limit: u8,
    pub(crate) traffic_class: u8,
    pub(crate) flow_label: u32,
    pub(crate) max_dest_rd_atomic: Option<u8>,
    pub(crate) min_rnr_timer: u8,
    pub(crate) timeout: u8,
    pub(crate) retry_cnt: u8,
    pub(crate) rnr_retry: u8,
    pub(crate) max_rd_atomic: Option<u8>,
}

impl Default for ConnectParams {
    fn default() -> Self {
        Self {
            pkey_index: 0,
            mtu: Mtu::M1024,
            sl: 0,
            sgid_index: 0,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
            max_dest_rd_atomic: None,
            min_rnr_timer: 12,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: None,
        }
    }
}

impl ConnectParams {
    /// The defaults (see the table above).
    pub fn new() -> Self {
        Self::default()
    }
    /// P_Key table index (RESET→INIT).
    pub const fn pkey_index(mut self, v: u16) -> Self {
        self.pkey_index = v;
        self
    }
    /// Path MTU (INIT→RTR of RC and UC).
    pub const fn mtu(mut self, v: Mtu) -> Self {
        self.mtu = v;
        self
    }
    /// Service level, 0..=15.
    pub const fn sl(mut self, v: u8) -> Self {
        self.sl = v;
        self
    }
    /// Source GID index of the GRH (used when the remote has a GID: RoCE, global IB).
    pub const fn sgid_index(mut self, v: u8) -> Self {
        self.sgid_index = v;
        self
    }
    /// GRH hop limit.
    pub const fn hop_limit(mut self, v: u8) -> Self {
        self.hop_limit = v;
        self
    }
    /// GRH traffic class.
    pub const fn traffic_class(mut self, v: u8) -> Self {
        self.traffic_class = v;
        self
    }
    /// GRH flow label (20 bits).
    pub const fn flow_label(mut self, v: u32) -> Self {
        self.flow_label = v;
        self
    }
    /// RDMA READ/atomic requests this QP accepts at once as responder (RC).
    pub const fn max_dest_rd_atomic(mut self, v: u8) -> Self {
        self.max_dest_rd_atomic = Some(v);
        self
    }
    /// Minimum RNR NAK timer code, 0..=31 (RC).
    pub const fn min_rnr_timer(mut self, v: u8) -> Self {
        self.min_rnr_timer = v;
        self
    }
    /// Local ACK timeout code, 0..=31: 4.096 µs × 2^v, 0 = infinite (RC).
    pub const fn timeout(mut self, v: u8) -> Self {
        self.timeout = v;
        self
    }
    /// Transport retries, 0..=7 (RC).
    pub const fn retry_cnt(mut self, v: u8) -> Self {
        self.retry_cnt = v;
        self
    }
    /// RNR retries, 0..=7, 7 = infinite (RC).
    pub const fn rnr_retry(mut self, v: u8) -> Self {
        self.rnr_retry = v;
        self
    }
    /// RDMA READ/atomic requests this QP has outstanding at once as requester (RC).
    pub const fn max_rd_atomic(mut self, v: u8) -> Self {
        self.max_rd_atomic = Some(v);
        self
    }
}

#[derive(Debug)]
struct QpHandle {
    ctx: Context,
    handle: u32,
    user_handle: u64,
    qpn: u32,
    uidx: Option<u32>,
    bfreg_id: Option<u32>,
    send_cq: Arc<CqShared>,
    recv_cq: Arc<CqShared>,
    _srq: Option<Arc<SrqHandle>>,
    _pd: Pd,
    /// The queue buffer and doorbell record outlive the kernel object (destroyed in `drop`).
    _buf: Arc<DmaBuf>,
    _sq_buf: Option<Arc<DmaBuf>>,
    _dbrec: Arc<crate::mem::DbRec>,
}

impl Drop for QpHandle {
    fn drop(&mut self) {
        let cmd = IbUverbsDestroyQp {
            response: 0,
            qp_handle: self.handle,
            reserved: 0,
        };
        let destroyed = self.ctx.destroy::<cmds::DestroyQp>(&cmd);
        self.send_cq.detach(self.qpn);
        self.recv_cq.detach(self.qpn);
        if !destroyed {
            // The QP may live on in the kernel, and the device may still read the ring and
            // record, write the ring, and complete into the CQs: never give the memory back,
            // nor the user index and doorbell register (a new QP must not inherit its CQEs).
            leak(&self._buf);
            self._sq_buf.iter().for_each(leak);
            leak(&self._dbrec);
            return;
        }
        if let Some(u) = self.uidx {
            self.ctx.free_uidx(u);
        }
        if let Some(id) = self.bfreg_id {
            self.ctx.release_bfreg(id);
        }
    }
}

/// A queue pair. Posting and modifying take `&mut self`; `Send`, not `Sync`.
/// Destroyed on drop, before the CQs, SRQ and PD it holds.
#[derive(Debug)]
pub struct Qp {
    sq: SendQueue,
    rq: Option<RecvQueue>,
    qp_type: QpType,
    state: QpState,
    cap: QpCap,
    port: u8,
    handle: QpHandle,
}

impl Qp {
    /// Create a QP. Capabilities are checked against the device and the WQE geometry before the
    /// syscall; the created QP's [`cap`](Self::cap) reports what was really granted (usually
    /// more inline data than asked, as libmlx5).
    ///
    /// # Errors
    /// [`Error::Unsupported`] for XRC_SEND and DCI (their own types create them);
    /// [`Error::Os`] with `EPERM` naming `CAP_NET_RAW` for RAW_PACKET without it (the raw QP
    /// itself is `mlx5::raw::RawQp`); [`Error::ContextMismatch`] if a CQ or the SRQ belongs to another context than `pd`;
    /// [`Error::Limit`] naming the attribute, value and limit; [`Error::Uverbs`] naming
    /// CREATE_QP.
    pub fn new(pd: &Pd, init: &QpInitAttr<'_>) -> Result<Self> {
        let what = match init.qp_type {
            QpType::Rc | QpType::Uc | QpType::Ud => None,
            QpType::XrcSend => Some("an XRC_SEND QP through Qp::new: use mlx5::xrc::XrcSendQp"),
            QpType::Dci => Some("a DCI through Qp::new: use mlx5::dc::Dci"),
            QpType::RawPacket => None,
        };
        if let Some(what) = what {
            return Err(Error::Unsupported { what });
        }
        Self::create(pd, init, 0, None)
    }

    /// [`new`](Self::new) for every type, with `type_flags` added to the driver data's flags
    /// (`MLX5_QP_FLAG_TYPE_DCI`) and a DCI's `dci_streams` (which adds
    /// `MLX5_QP_FLAG_DCI_STREAM`): the typed XRC and DC objects (`xrc.rs`, `dc.rs`) create
    /// their send QPs here.
    pub(crate) fn create(
        pd: &Pd,
        init: &QpInitAttr<'_>,
        type_flags: u32,
        dci_streams: Option<mlx5_ffi::mlx5::Mlx5IbCreateQpDciStreams>,
    ) -> Result<Self> {
        raw::check_create(init.qp_type)?;
        let ctx = pd.context().clone();
        ctx.check_same("send_cq", &init.send_cq.shared().ctx, "pd")?;
        ctx.check_same("recv_cq", &init.recv_cq.shared().ctx, "pd")?;
        if let Some(srq) = init.srq {
            ctx.check_same("srq", srq.context(), "pd")?;
        }
        let ucx = ctx.inner.ucx;
        let dev = ctx.inner.attr.raw;
        let tctx = init.qp_type.limit_context();
        let cap = init.cap;
        Error::check_limit(
            "max_send_wr",
            cap.max_send_wr.into(),
            dev.max_qp_wr.into(),
            tctx,
        )?;
        Error::check_limit(
            "max_send_sge",
            cap.max_send_sge.into(),
            dev.max_sge.into(),
            tctx,
        )?;
        Error::check_limit(
            "max_recv_sge",
            cap.max_recv_sge.into(),
            dev.max_sge.into(),
            tctx,
        )?;
        let sgeo = sq_geometry(
            init.qp_type,
            cap.max_send_wr,
            cap.max_send_sge,
            cap.max_inline_data,
            ucx.max_sq_desc_sz.into(),
            ucx.max_send_wqebb,
        )?;
        let has_rq = init.srq.is_none() && cap.max_recv_wr > 0;
        let rlimit = if ucx.max_recv_wr != 0 {
            ucx.max_recv_wr.min(dev.max_qp_wr)
        } else {
            dev.max_qp_wr
        };
        let rgeo = if has_rq {
            Some(rq_geometry(
                cap.max_recv_wr,
                cap.max_recv_sge,
                ucx.max_rq_desc_sz.into(),
                rlimit,
                tctx,
            )?)
        } else {
            None
        };
        let rq_bytes = rgeo.map_or(0, |g| g.stride * g.wqe_cnt) as usize;
        let sq_bytes = sgeo.wqe_cnt as usize * 64;
        let (buf, sq_buf) = raw::buffers(init.qp_type, rq_bytes, sq_bytes)?;
        let dbrec = Arc::new(ctx.inner.dbrecs.alloc()?);
        let grant = match ctx.inner.mode {
            UarMode::Dynamic => Some(ctx.grant_bfreg_dynamic()?),
            UarMode::Static => None,
        };
        let uidx = if ctx.cqe_version() == 1 {
            match ctx.alloc_uidx() {
                Ok(u) => Some(u),
                Err(e) => {
                    if let Some(g) = &grant {
                        ctx.release_bfreg(g.id);
                    }
                    return Err(e);
                }
            }
        } else {
            None
        };
        let mut drv = Mlx5IbCreateQp {
            buf_addr: buf.addr(),
            sq_buf_addr: sq_buf.as_ref().map_or(0, |b| b.addr()),
            db_addr: dbrec.addr(),
            sq_wqe_count: sgeo.wqe_cnt,
            rq_wqe_count: rgeo.map_or(0, |g| g.wqe_cnt),
            rq_wqe_shift: rgeo.map_or(0, |g| g.stride.trailing_zeros()),
            flags: 0,
            uidx: uidx.unwrap_or(0xFF_FFFF),
            ..Mlx5IbCreateQp::default()
        };
        if init.scatter_to_cqe {
            drv.flags |= MLX5_QP_FLAG_SCATTER_CQE;
        }
        drv.flags |= type_flags;
        if let Some(s) = dci_streams {
            drv.flags |= mlx5_ffi::mlx5::MLX5_QP_FLAG_DCI_STREAM;
            drv.dci_streams = s;
        }
        if let Some(g) = &grant {
            if let Some(idx) = g.create_index {
                drv.flags |= MLX5_QP_FLAG_UAR_PAGE_INDEX;
                drv.bfreg_index = idx;
            }
        }
        let user_handle = crate::context::next_user_handle();
        let cmd = IbUverbsCreateQp {
            response: 0,
            user_handle,
            pd_handle: pd.inner.handle,
            send_cq_handle: init.send_cq.shared().handle_id(),
            recv_cq_handle: init.recv_cq.shared().handle_id(),
            srq_handle: init.srq.map_or(0, |s| s.handle.handle_id()),
            max_send_wr: sgeo.max_post,
            max_recv_wr: rgeo.map_or(0, |g| g.wqe_cnt),
            max_send_sge: sgeo.max_gs,
            max_recv_sge: rgeo.map_or(0, |g| g.max_gs),
            max_inline_data: sgeo.max_inline,
            sq_sig_all: u8::from(init.sq_sig_all),
            qp_type: init.qp_type.ib_value(),
            is_srq: u8::from(init.srq.is_some()),
            reserved: 0,
        };
        let (core, m) = match uverbs::write::<cmds::CreateQp>(ctx.surface(), &cmd, &drv) {
            Ok(r) => r,
            Err(e) => {
                if let Some(u) = uidx {
                    ctx.free_uidx(u);
                }
                if let Some(g) = &grant {
                    ctx.release_bfreg(g.id);
                }
                return Err(e);
            }
        };
        // From here on the kernel QP exists: `handle` destroys it if anything below fails.
        let mut handle = QpHandle {
            ctx: ctx.clone(),
            handle: core.qp_handle,
            user_handle,
            qpn: core.qpn,
            uidx,
            bfreg_id: grant.as_ref().map(|g| g.id),
            send_cq: init.send_cq.shared().clone(),
            recv_cq: init.recv_cq.shared().clone(),
            _srq: init.srq.map(|s| s.handle.clone()),
            _pd: pd.clone(),
            _buf: buf.clone(),
            _sq_buf: sq_buf.clone(),
            _dbrec: dbrec.clone(),
        };
        let grant = match grant {
            Some(g) => g,
            None => {
                let g = ctx.grant_bfreg_static(m.bfreg_index)?;
                handle.bfreg_id = Some(g.id);
                g
            }
        };
        let sq_ring = raw::sq_ring(&buf, &sq_buf, rq_bytes, sq_bytes);
        let bf = Bfreg::new(grant.reg, grant.half, grant.dedicated, grant.id);
        let sq = SendQueue::new(
            sq_ring,
            core.qpn,
            init.qp_type,
            sgeo,
            init.sq_sig_all,
            init.report_unsignaled,
            dbrec.clone(),
            bf,
            if ctx.inner.config.no_bf {
                BfPolicy::AlwaysDoorbell
            } else {
                init.bf_policy
            },
            Some((pd.inner.handle, ctx.inner.mrs.clone())),
            ctx.id(),
        );
        let rq = rgeo.map(|g| {
            RecvQueue::new(
                WqRing::new(buf.clone(), 0, rq_bytes),
                g,
                dbrec.clone(),
                pd.inner.handle,
                ctx.inner.mrs.clone(),
            )
        });
        let uidx_v = uidx.unwrap_or(0xFF_FFFF);
        init.send_cq.shared().attach(CqUser {
            qpn: core.qpn,
            uidx: uidx_v,
            sq: Some(sq.shared().clone()),
            rq: if std::ptr::eq(
                init.send_cq.shared().as_ref(),
                init.recv_cq.shared().as_ref(),
            ) {
                rq.as_ref().map(|r| r.shared().clone())
            } else {
                None
            },
            fence: None,
            srq: if std::ptr::eq(
                init.send_cq.shared().as_ref(),
                init.recv_cq.shared().as_ref(),
            ) {
                init.srq.map(|s| s.shared.clone())
            } else {
                None
            },
        });
        if !std::ptr::eq(
            init.send_cq.shared().as_ref(),
            init.recv_cq.shared().as_ref(),
        ) {
            init.recv_cq.shared().attach(CqUser {
                qpn: core.qpn,
                uidx: uidx_v,
                sq: None,
                rq: rq.as_ref().map(|r| r.shared().clone()),
                srq: init.srq.map(|s| s.shared.clone()),
                fence: None,
            });
        }
        let granted = QpCap {
            max_send_wr: sgeo.max_post,
            max_recv_wr: rgeo.map_or(0, |g| g.wqe_cnt),
            max_send_sge: sgeo.max_gs,
            max_recv_sge: rgeo.map_or(0, |g| g.max_gs),
            max_inline_data: sgeo.max_inline,
        };
        Ok(Self {
            sq,
            rq,
            qp_type: init.qp_type,
            state: QpState::Reset,
            cap: granted,
            port: 1,
            handle,
        })
    }

    /// The context and uverbs handle of the QP, for the flow rules steering to it (`flow.rs`).
    pub(crate) fn flow_target(&self) -> (&Context, u32) {
        (&self.handle.ctx, self.handle.handle)
    }

    /// QP number.
    pub fn qpn(&self) -> u32 {
        self.handle.qpn
    }

    /// The handle async events carry for this QP.
    pub fn user_handle(&self) -> u64 {
        self.handle.user_handle
    }

    /// Transport.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }

    /// The capabilities granted.
    pub fn cap(&self) -> QpCap {
        self.cap
    }

    /// The state as last set through this driver ([`modify`](Self::modify) and the `to_*`
    /// helpers): no system call, and **not** the device's view. The device moves a QP to ERR
    /// (or SQE) on its own after an error completion or a fatal async event, and this value
    /// does not follow; ask [`query_state`](Self::query_state) for the kernel's answer.
    pub fn state(&self) -> QpState {
        self.state
    }

    /// The state the kernel reports now (QUERY_QP): ERR or SQE after the device moved the QP
    /// there on an error, where [`state`](Self::state) still says the last state set.
    ///
    /// # Errors
    /// As [`query`](Self::query).
    pub fn query_state(&self) -> Result<QpState> {
        self.query().map(|(st, _)| st)
    }

    /// The send queue (low-level API: `start` / `finish` / `ring`).
    pub fn sq(&mut self) -> &mut SendQueue {
        &mut self.sq
    }

    /// The send queue, read-only (geometry, stats, bfreg).
    pub fn sq_ref(&self) -> &SendQueue {
        &self.sq
    }

    /// The receive queue (absent with an SRQ or `max_recv_wr == 0`).
    pub fn rq(&mut self) -> Option<&mut RecvQueue> {
        self.rq.as_mut()
    }

    /// The send half and the receive half at once, for two threads (both are `Send`; e.g.
    /// `std::thread::scope`, each half with its own CQ). The QP stays borrowed, so its state
    /// cannot change while they are in use.
    pub fn split(&mut self) -> (&mut SendQueue, Option<&mut RecvQueue>) {
        (&mut self.sq, self.rq.as_mut())
    }

    /// Turn the flight recorder on for this QP: it keeps the last `cfg.records` WQEs posted
    /// on each of its queues (SRQ receives are not recorded), dumped with the CQEs of a
    /// recording CQ ([`Cq::enable_recorder`](crate::Cq::enable_recorder)) when an error CQE
    /// arrives there, or on demand ([`recorder_dump`](Self::recorder_dump)). Off by default and
    /// free while off; while on, every post takes the queue's slow path once.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming `recorder` if it is already on.
    pub fn enable_recorder(&mut self, cfg: &crate::recorder::RecorderConfig) -> Result<()> {
        let rec = Arc::new(crate::recorder::QpRecorder::new(
            cfg,
            self.handle.qpn,
            self.qp_type,
            self.state,
        ));
        self.sq.attach_recorder(&rec, cfg.records)?;
        if let Some(rq) = self.rq.as_mut() {
            rq.attach_recorder(&rec, cfg.records);
        }
        Ok(())
    }

    /// The flight recorder's dump now (format in `docs/flight-recorder.md`): this QP's
    /// records and those of its CQs that record; `None` if the QP's recorder is off.
    pub fn recorder_dump(&self) -> Option<String> {
        let rec = self.sq.shared().rec.get()?;
        self.sq.record_posted();
        if let Some(rq) = &self.rq {
            rq.record_posted();
        }
        let qp = crate::recorder::QpPart {
            rec,
            sq: Some(&**self.sq.shared()),
            rq: self
                .rq
                .as_ref()
                .map(|r| &**r.shared() as &dyn crate::recorder::RqRetired),
        };
        let (s, r) = (&self.handle.send_cq, &self.handle.recv_cq);
        let mut cqs: Vec<_> = s.recorder_part().into_iter().collect();
        if !Arc::ptr_eq(s, r) {
            cqs.extend(r.recorder_part());
        }
        Some(crate::recorder::dump_text("on demand", &[qp], &cqs))
    }

    /// Post a chain of send WRs; one doorbell for the chain.
    ///
    /// # Errors
    /// The index of the first refused WR and why; the WRs before it are posted and rung.
    #[inline]
    pub fn post_send(&mut self, wrs: &[SendWr<'_>]) -> Result<(), (usize, PostError)> {
        self.sq.post_send(wrs)
    }

    /// Post receive WRs (QP in INIT or later). On a UD QP each scatter list starts with the
    /// [`UD_GRH_BYTES`](crate::UD_GRH_BYTES) the device reserves for the GRH.
    ///
    /// # Errors
    /// The index of the first refused WR and why.
    #[inline]
    pub fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> Result<(), (usize, PostError)> {
        match self.rq.as_mut() {
            Some(rq) => rq.post_recv(wrs),
            None => Err((0, PostError::BadState { state: self.state })),
        }
    }

    /// Modify the QP with the attributes named in `mask` (`IB_QP_*` bits); without
    /// `IB_QP_STATE` the attributes of the current state are modified.
    ///
    /// Checked before the syscall, against the verbs state machine (the kernel's
    /// `ib_modify_qp_is_ok` table): the transition from the state last set here must exist for
    /// this QP type, `mask` must hold every attribute the transition requires and no attribute
    /// it does not take, and each value must fit its IB encoding. The state the driver knows can
    /// lag behind the device (a QP the device moved to ERR or SQE); that only makes the check
    /// more permissive (every state may go to RESET and ERR), the kernel still has the last word.
    ///
    /// Moving to RESET zeroes the queue indices and doorbell records and discards every
    /// outstanding WR. What the CQs still hold of the QP's old life completes nothing of the
    /// new one: as libmlx5's "CQ clean", but without rewriting a ring behind its lock-free
    /// poller, the CQs fence the QP's CQEs written so far and their pollers drop them
    /// (`CqShared::fence`); a `Cq` drops pending unsignaled reports of it.
    ///
    /// # Errors
    /// [`Error::QpTransition`] for a transition the state machine lacks (RESET→RTR);
    /// [`Error::QpAttribute`] naming an attribute missing from or not allowed in the
    /// transition; [`Error::Unsupported`] for alternate-path attributes and `IB_QP_CUR_STATE`,
    /// which [`QpAttr`] cannot express; [`Error::Limit`] or [`Error::InvalidArgument`] for a
    /// value out of range; [`Error::Uverbs`] naming MODIFY_QP.
    pub fn modify(&mut self, attr: &QpAttr, mask: u32) -> Result<()> {
        let dev = self.handle.ctx.inner.attr.raw;
        if mask & IB_QP_MAX_QP_RD_ATOMIC != 0 {
            Error::check_limit(
                "max_rd_atomic",
                attr.max_rd_atomic.into(),
                dev.max_qp_init_rd_atom.into(),
                "of the device",
            )?;
        }
        if mask & IB_QP_MAX_DEST_RD_ATOMIC != 0 {
            Error::check_limit(
                "max_dest_rd_atomic",
                attr.max_dest_rd_atomic.into(),
                dev.max_qp_rd_atom.into(),
                "of the device",
            )?;
        }
        if mask & IB_QP_PORT != 0 {
            if attr.port_num == 0 {
                return Err(Error::InvalidArgument {
                    attr: "port_num",
                    reason: "ports are numbered from 1",
                });
            }
            Error::check_limit(
                "port_num",
                attr.port_num.into(),
                dev.phys_port_cnt.max(1).into(),
                "of the device",
            )?;
        }
        let next = if mask & IB_QP_STATE != 0 {
            Some(attr.qp_state.ok_or(Error::InvalidArgument {
                attr: "qp_state",
                reason: "IB_QP_STATE is set but qp_state is None",
            })?)
        } else {
            None
        };
        check_transition(self.qp_type, self.state, next.unwrap_or(self.state), mask)?;
        check_values(attr, mask)?;
        if mask & IB_QP_AV != 0 && attr.ah_attr.grh.is_none() {
            self.check_path_needs_no_grh(attr)?;
        }
        let dest = qp_dest(&attr.ah_attr);
        let cmd = IbUverbsModifyQp {
            dest,
            alt_dest: IbUverbsQpDest::default(),
            qp_handle: self.handle.handle,
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
            path_mtu: attr.path_mtu.map_or(0, Mtu::code),
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
        };
        uverbs::write::<cmds::ModifyQp>(self.handle.ctx.surface(), &cmd, &())?;
        if mask & IB_QP_PORT != 0 {
            self.port = attr.port_num;
        }
        if let Some(next) = next {
            self.apply_state(next);
        }
        Ok(())
    }

    /// A path without GRH is only valid on InfiniBand: a RoCE port routes by GID, so the
    /// kernel (mlx5_ib) refuses it with a bare EINVAL; say why before asking.
    fn check_path_needs_no_grh(&self, attr: &QpAttr) -> Result<()> {
        let port = match attr.ah_attr.port_num {
            0 => self.port,
            p => p,
        };
        if port != 0 && self.handle.ctx.query_port(port)?.is_roce() {
            return Err(Error::InvalidArgument {
                attr: "ah_attr.grh",
                reason: "a RoCE port routes by GID: the path needs a GRH (remote GID and source GID index)",
            });
        }
        Ok(())
    }

    fn apply_state(&mut self, next: QpState) {
        self.state = next;
        self.sq.set_state(next);
        match next {
            QpState::Reset => {
                self.sq.reset();
                if let Some(rq) = self.rq.as_mut() {
                    rq.enabled = false;
                    rq.reset();
                }
                // The records are shared by SQ and RQ; zero them once both are reset.
                self.sq_dbrec_clear();
                // The CQEs of the old life still in the CQs complete nothing of the new one.
                self.handle.send_cq.fence(self.handle.qpn);
                if !Arc::ptr_eq(&self.handle.send_cq, &self.handle.recv_cq) {
                    self.handle.recv_cq.fence(self.handle.qpn);
                }
            }
            QpState::Init | QpState::Rtr => {
                if let Some(rq) = self.rq.as_mut() {
                    rq.enabled = true;
                }
            }
            QpState::Rts | QpState::Sqd | QpState::Sqe | QpState::Err => {
                if let Some(rq) = self.rq.as_mut() {
                    rq.enabled = true;
                }
            }
        }
    }

    fn sq_dbrec_clear(&mut self) {
        self.sq.clear_dbrec();
    }

    /// RESET -> INIT of a connected QP (RC, UC, XRC, DC initiator, raw) on `port` with the
    /// remote `access` its peers get, at P_Key index 0. A UD QP takes a Q_Key instead:
    /// [`to_init_ud`](Self::to_init_ud).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming `qkey` on a UD QP; otherwise as
    /// [`modify`](Self::modify).
    pub fn to_init(&mut self, port: u8, access: Access) -> Result<()> {
        if self.qp_type == QpType::Ud {
            return Err(Error::InvalidArgument {
                attr: "qkey",
                reason: "a UD QP's INIT needs its Q_Key: use to_init_ud(port, qkey)",
            });
        }
        self.to_init_with(port, access, 0, &ConnectParams::default())
    }

    /// RESET -> INIT of a UD QP on `port` with Q_Key `qkey` (the key a datagram's DETH must
    /// carry to be accepted; `ibv_ud_pingpong` uses `0x11111111`), at P_Key index 0.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming `qkey` on any other QP type (they take remote access
    /// rights: [`to_init`](Self::to_init)); otherwise as [`modify`](Self::modify).
    pub fn to_init_ud(&mut self, port: u8, qkey: u32) -> Result<()> {
        if self.qp_type != QpType::Ud {
            return Err(Error::InvalidArgument {
                attr: "qkey",
                reason: "only a UD QP takes a Q_Key at INIT: use to_init(port, access)",
            });
        }
        self.to_init_with(port, Access::empty(), qkey, &ConnectParams::default())
    }

    /// RESET -> INIT with the given port, remote access (RC, UC) or Q_Key (UD), and the P_Key
    /// index of `p`.
    ///
    /// # Errors
    /// As [`modify`](Self::modify).
    pub fn to_init_with(
        &mut self,
        port: u8,
        access: Access,
        qkey: u32,
        p: &ConnectParams,
    ) -> Result<()> {
        let mut attr = QpAttr {
            qp_state: Some(QpState::Init),
            port_num: port,
            pkey_index: p.pkey_index,
            ..QpAttr::default()
        };
        let mut mask = IB_QP_STATE | IB_QP_PKEY_INDEX | IB_QP_PORT;
        if self.qp_type == QpType::Ud {
            attr.qkey = qkey;
            mask |= IB_QP_QKEY;
        } else {
            attr.qp_access_flags = access;
            mask |= IB_QP_ACCESS_FLAGS;
        }
        self.modify(&attr, mask)
    }

    /// INIT -> RTR of a UD QP: a datagram QP has no remote and no path MTU (each send names
    /// its destination through an address handle), so there is nothing to give.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming `qp_type` on a connected QP (it needs its remote:
    /// [`to_rtr`](Self::to_rtr)); otherwise as [`modify`](Self::modify).
    pub fn to_rtr_ud(&mut self) -> Result<()> {
        if self.qp_type != QpType::Ud {
            return Err(Error::InvalidArgument {
                attr: "qp_type",
                reason: "a connected QP's RTR needs its remote: use to_rtr(remote, mtu, sgid_index)",
            });
        }
        self.modify(
            &QpAttr {
                qp_state: Some(QpState::Rtr),
                ..QpAttr::default()
            },
            IB_QP_STATE,
        )
    }

    /// INIT -> RTR towards `remote` (RC/UC); UD needs no address (see
    /// [`to_rtr_ud`](Self::to_rtr_ud): the arguments are not used). `mtu` is an [`Mtu`] or its
    /// `IB_MTU_*` code (1 = 256 ... 5 = 4096 bytes). With `remote.gid` set (RoCE, or global IB)
    /// the path carries a GRH with source GID index `sgid_index`. Every other knob has the
    /// [`ConnectParams`] default.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming `path_mtu` for a code that is no MTU (a byte count cast
    /// to `u8` is one); otherwise as [`modify`](Self::modify).
    pub fn to_rtr(
        &mut self,
        remote: &RemoteQp,
        mtu: impl TryInto<Mtu>,
        sgid_index: u8,
    ) -> Result<()> {
        self.to_rtr_with_sl(remote, mtu, sgid_index, 0)
    }

    /// As [`to_rtr`](Self::to_rtr), with service level `sl` (0..=15) in the path's address
    /// vector (`ibv_rc_pingpong -l`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming `sl` above 15; otherwise as [`to_rtr`](Self::to_rtr).
    pub fn to_rtr_with_sl(
        &mut self,
        remote: &RemoteQp,
        mtu: impl TryInto<Mtu>,
        sgid_index: u8,
        sl: u8,
    ) -> Result<()> {
        let p = ConnectParams::default().sgid_index(sgid_index).sl(sl);
        let p = match (self.qp_type, mtu.try_into()) {
            (_, Ok(m)) => p.mtu(m),
            // UD has no path MTU: the argument is not used.
            (QpType::Ud, Err(_)) => p,
            (_, Err(_)) => {
                return Err(Error::InvalidArgument {
                    attr: "path_mtu",
                    reason: "not an IB_MTU_* code (1 = 256 ... 5 = 4096 bytes); use mlx5::Mtu",
                });
            }
        };
        self.to_rtr_with(remote, &p)
    }

    /// INIT -> RTR towards `remote` with the path knobs of `p` (RC/UC: MTU, SL, GRH fields when
    /// `remote.gid` is set; RC also `max_dest_rd_atomic` and `min_rnr_timer`). UD needs no
    /// address and takes none of them.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming `sl` above 15 or `flow_label` over 20 bits;
    /// otherwise as [`modify`](Self::modify).
    pub fn to_rtr_with(&mut self, remote: &RemoteQp, p: &ConnectParams) -> Result<()> {
        if p.sl > 15 {
            return Err(Error::InvalidArgument {
                attr: "sl",
                reason: "service levels are 0..=15",
            });
        }
        if p.flow_label > 0xF_FFFF {
            return Err(Error::InvalidArgument {
                attr: "flow_label",
                reason: "flow labels are 20 bits",
            });
        }
        let mut attr = QpAttr {
            qp_state: Some(QpState::Rtr),
            ..QpAttr::default()
        };
        let mut mask = IB_QP_STATE;
        if self.qp_type != QpType::Ud {
            attr.path_mtu = Some(p.mtu);
            attr.dest_qp_num = remote.qpn;
            attr.rq_psn = remote.psn;
            attr.ah_attr = AhAttr {
                dlid: remote.lid,
                sl: p.sl,
                port_num: self.port,
                grh: remote.gid.map(|g| GlobalRoute {
                    dgid: g,
                    sgid_index: p.sgid_index,
                    hop_limit: p.hop_limit,
                    traffic_class: p.traffic_class,
                    flow_label: p.flow_label,
                }),
                ..AhAttr::default()
            };
            mask |= IB_QP_AV | IB_QP_PATH_MTU | IB_QP_DEST_QPN | IB_QP_RQ_PSN;
            if self.qp_type == QpType::Rc {
                let dev = self.handle.ctx.inner.attr.raw.max_qp_rd_atom;
                attr.max_dest_rd_atomic =
                    p.max_dest_rd_atomic.unwrap_or(1u8.max(dev.min(16) as u8));
                attr.min_rnr_timer = p.min_rnr_timer;
                mask |= IB_QP_MAX_DEST_RD_ATOMIC | IB_QP_MIN_RNR_TIMER;
            }
        }
        self.modify(&attr, mask)
    }

    /// RTR -> RTS with send PSN `psn` (RC: timeout 14, retry 7, RNR retry `rnr_retry`).
    ///
    /// # Errors
    /// As [`modify`](Self::modify).
    pub fn to_rts(&mut self, psn: u32, rnr_retry: u8) -> Result<()> {
        self.to_rts_with(psn, &ConnectParams::default().rnr_retry(rnr_retry))
    }

    /// RTR -> RTS with send PSN `psn` and (RC) the timeout, retry counts and `max_rd_atomic`
    /// of `p`.
    ///
    /// # Errors
    /// As [`modify`](Self::modify).
    pub fn to_rts_with(&mut self, psn: u32, p: &ConnectParams) -> Result<()> {
        let mut attr = QpAttr {
            qp_state: Some(QpState::Rts),
            sq_psn: psn,
            ..QpAttr::default()
        };
        let mut mask = IB_QP_STATE | IB_QP_SQ_PSN;
        if matches!(self.qp_type, QpType::Rc | QpType::XrcSend | QpType::Dci) {
            attr.timeout = p.timeout;
            attr.retry_cnt = p.retry_cnt;
            attr.rnr_retry = p.rnr_retry;
            let dev = self.handle.ctx.inner.attr.raw.max_qp_init_rd_atom;
            attr.max_rd_atomic = p.max_rd_atomic.unwrap_or(1u8.max(dev.min(16) as u8));
            mask |= IB_QP_TIMEOUT | IB_QP_RETRY_CNT | IB_QP_RNR_RETRY | IB_QP_MAX_QP_RD_ATOMIC;
        }
        self.modify(&attr, mask)
    }

    /// Move to ERR: everything outstanding completes with a flush error.
    ///
    /// # Errors
    /// As [`modify`](Self::modify).
    pub fn to_error(&mut self) -> Result<()> {
        self.modify(
            &QpAttr {
                qp_state: Some(QpState::Err),
                ..QpAttr::default()
            },
            IB_QP_STATE,
        )
    }

    /// QUERY_QP: the kernel's view of the state and attributes.
    ///
    /// # Errors
    /// [`Error::Uverbs`] naming QUERY_QP; [`Error::BadResponse`] for an unknown state.
    pub fn query(&self) -> Result<(QpState, IbUverbsQueryQpResp)> {
        let cmd = IbUverbsQueryQp {
            response: 0,
            qp_handle: self.handle.handle,
            attr_mask: 0xFF_FFFF,
        };
        let (r, ()) = uverbs::write::<cmds::QueryQp>(self.handle.ctx.surface(), &cmd, &())?;
        let st = QpState::from_u8(r.qp_state).ok_or(Error::BadResponse {
            cmd: "QUERY_QP",
            what: "unknown qp_state",
        })?;
        Ok((st, r))
    }

    /// QUERY_QP decoded: the state, the attributes (as [`modify`](Self::modify) takes them)
    /// and the capabilities: the receive side as the kernel reports it (the RQ's WQE count and
    /// data segments per WQE, 0 with an SRQ), the send side as this driver sized it (a kernel
    /// reports none for a user-space QP).
    ///
    /// # Errors
    /// As [`query`](Self::query).
    pub fn query_attr(&self) -> Result<(QpState, QpAttr, QpCap)> {
        let (st, r) = self.query()?;
        let d = r.dest;
        let attr = QpAttr {
            qp_state: Some(st),
            path_mtu: Mtu::from_code(r.path_mtu),
            qkey: r.qkey,
            rq_psn: r.rq_psn,
            sq_psn: r.sq_psn,
            dest_qp_num: r.dest_qp_num,
            qp_access_flags: Access(r.qp_access_flags),
            pkey_index: r.pkey_index,
            port_num: r.port_num,
            max_rd_atomic: r.max_rd_atomic,
            max_dest_rd_atomic: r.max_dest_rd_atomic,
            min_rnr_timer: r.min_rnr_timer,
            timeout: r.timeout,
            retry_cnt: r.retry_cnt,
            rnr_retry: r.rnr_retry,
            ah_attr: AhAttr {
                dlid: d.dlid,
                sl: d.sl,
                src_path_bits: d.src_path_bits,
                static_rate: d.static_rate,
                port_num: d.port_num,
                grh: (d.is_global != 0).then_some(GlobalRoute {
                    dgid: d.dgid,
                    flow_label: d.flow_label,
                    sgid_index: d.sgid_index,
                    hop_limit: d.hop_limit,
                    traffic_class: d.traffic_class,
                }),
            },
        };
        // The kernel reports the receive queue as created and no send capabilities for a
        // user-space QP (its SQ is ours): the send side is the driver's own, as libmlx5's
        // query fills it in.
        let cap = QpCap {
            max_send_wr: self.cap.max_send_wr,
            max_recv_wr: r.max_recv_wr,
            max_send_sge: self.cap.max_send_sge,
            max_recv_sge: r.max_recv_sge,
            max_inline_data: self.cap.max_inline_data,
        };
        Ok((st, attr, cap))
    }
}

pub(crate) fn qp_dest(a: &AhAttr) -> IbUverbsQpDest {
    let g = a.grh.unwrap_or_default();
    IbUverbsQpDest {
        dgid: g.dgid,
        flow_label: g.flow_label,
        dlid: a.dlid,
        reserved: 0,
        sgid_index: g.sgid_index,
        hop_limit: g.hop_limit,
        traffic_class: g.traffic_class,
        sl: a.sl,
        src_path_bits: a.src_path_bits,
        static_rate: a.static_rate,
        is_global: u8::from(a.grh.is_some()),
        port_num: a.port_num,
    }
}

/// The verbs QP state machine: the (required, optional) attribute masks of `from -> to` for
/// a QP of type `t` (`IB_QP_STATE` aside), or `None` if the transition does not exist. Written
/// from the InfiniBand state diagram as the kernel enforces it (drivers/infiniband/core/verbs.c,
/// `ib_modify_qp_is_ok`), for the three transports this driver has.
fn transition(t: QpType, from: QpState, to: QpState) -> Option<(u32, u32)> {
    use QpState::*;
    match t {
        QpType::Rc | QpType::Uc | QpType::Ud => {}
        QpType::XrcSend | QpType::Dci => return initiator_transition(t, from, to),
        QpType::RawPacket => return raw::transition(from, to),
    }
    // Per transport: (UD, UC, RC).
    let by = |ud: u32, uc: u32, rc: u32| match t {
        QpType::Ud => ud,
        QpType::Uc => uc,
        _ => rc,
    };
    let init_attrs = by(
        IB_QP_PKEY_INDEX | IB_QP_PORT | IB_QP_QKEY,
        IB_QP_PKEY_INDEX | IB_QP_PORT | IB_QP_ACCESS_FLAGS,
        IB_QP_PKEY_INDEX | IB_QP_PORT | IB_QP_ACCESS_FLAGS,
    );
    // RTS -> RTS and SQD -> RTS may retune these (RC also the RNR timer).
    let rts_retune = by(
        IB_QP_CUR_STATE | IB_QP_QKEY,
        IB_QP_CUR_STATE | IB_QP_ACCESS_FLAGS | IB_QP_ALT_PATH | IB_QP_PATH_MIG_STATE,
        IB_QP_CUR_STATE
            | IB_QP_ACCESS_FLAGS
            | IB_QP_ALT_PATH
            | IB_QP_PATH_MIG_STATE
            | IB_QP_MIN_RNR_TIMER,
    );
    Some(match (from, to) {
        // Every state may be reset or moved to ERR, with no attribute.
        (_, Reset) | (_, Err) => (0, 0),
        (Reset, Init) => (init_attrs, 0),
        (Init, Init) => (0, init_attrs),
        (Init, Rtr) => (
            by(
                0,
                IB_QP_AV | IB_QP_PATH_MTU | IB_QP_DEST_QPN | IB_QP_RQ_PSN,
                IB_QP_AV
                    | IB_QP_PATH_MTU
                    | IB_QP_DEST_QPN
                    | IB_QP_RQ_PSN
                    | IB_QP_MAX_DEST_RD_ATOMIC
                    | IB_QP_MIN_RNR_TIMER,
            ),
            by(
                IB_QP_PKEY_INDEX | IB_QP_QKEY,
                IB_QP_ALT_PATH | IB_QP_ACCESS_FLAGS | IB_QP_PKEY_INDEX,
                IB_QP_ALT_PATH | IB_QP_ACCESS_FLAGS | IB_QP_PKEY_INDEX,
            ),
        ),
        (Rtr, Rts) => (
            by(
                IB_QP_SQ_PSN,
                IB_QP_SQ_PSN,
                IB_QP_SQ_PSN
                    | IB_QP_TIMEOUT
                    | IB_QP_RETRY_CNT
                    | IB_QP_RNR_RETRY
                    | IB_QP_MAX_QP_RD_ATOMIC,
            ),
            rts_retune,
        ),
        (Rts, Rts) | (Sqd, Rts) => (0, rts_retune),
        (Rts, Sqd) => (0, IB_QP_EN_SQD_ASYNC_NOTIFY),
        (Sqd, Sqd) => (
            0,
            by(
                IB_QP_PKEY_INDEX | IB_QP_QKEY,
                IB_QP_AV
                    | IB_QP_ALT_PATH
                    | IB_QP_ACCESS_FLAGS
                    | IB_QP_PKEY_INDEX
                    | IB_QP_PATH_MIG_STATE,
                IB_QP_PORT
                    | IB_QP_AV
                    | IB_QP_TIMEOUT
                    | IB_QP_RETRY_CNT
                    | IB_QP_RNR_RETRY
                    | IB_QP_MAX_QP_RD_ATOMIC
                    | IB_QP_MAX_DEST_RD_ATOMIC
                    | IB_QP_ALT_PATH
                    | IB_QP_ACCESS_FLAGS
                    | IB_QP_PKEY_INDEX
                    | IB_QP_MIN_RNR_TIMER
                    | IB_QP_PATH_MIG_STATE,
            ),
        ),
        // Only unreliable QPs have the send-queue error state; RC errors go to ERR.
        (Sqe, Rts) if t != QpType::Rc => (
            0,
            by(
                IB_QP_CUR_STATE | IB_QP_QKEY,
                IB_QP_CUR_STATE | IB_QP_ACCESS_FLAGS,
                0,
            ),
        ),
        _ => return None,
    })
}

/// `IB_QP_*` bits by the name of the [`QpAttr`] field they carry, in bit order.
const ATTR_NAMES: &[(u32, &str)] = &[
    (IB_QP_CUR_STATE, "cur_qp_state"),
    (IB_QP_EN_SQD_ASYNC_NOTIFY, "en_sqd_async_notify"),
    (IB_QP_ACCESS_FLAGS, "qp_access_flags"),
    (IB_QP_PKEY_INDEX, "pkey_index"),
    (IB_QP_PORT, "port_num"),
    (IB_QP_QKEY, "qkey"),
    (IB_QP_AV, "ah_attr"),
    (IB_QP_PATH_MTU, "path_mtu"),
    (IB_QP_TIMEOUT, "timeout"),
    (IB_QP_RETRY_CNT, "retry_cnt"),
    (IB_QP_RNR_RETRY, "rnr_retry"),
    (IB_QP_RQ_PSN, "rq_psn"),
    (IB_QP_MAX_QP_RD_ATOMIC, "max_rd_atomic"),
    (IB_QP_ALT_PATH, "alt_ah_attr"),
    (IB_QP_MIN_RNR_TIMER, "min_rnr_timer"),
    (IB_QP_SQ_PSN, "sq_psn"),
    (IB_QP_MAX_DEST_RD_ATOMIC, "max_dest_rd_atomic"),
    (IB_QP_PATH_MIG_STATE, "path_mig_state"),
    (IB_QP_CAP, "cap"),
    (IB_QP_DEST_QPN, "dest_qp_num"),
    (IB_QP_RATE_LIMIT, "rate_limit"),
];

/// The name of the lowest attribute bit in `bits` (`"attr_mask"` for a bit that names none).
fn attr_name(bits: u32) -> &'static str {
    ATTR_NAMES
        .iter()
        .find(|(b, _)| bits & b != 0)
        .map_or("attr_mask", |(_, n)| n)
}

/// `from -> to` with attribute mask `mask` against the state machine.
pub(crate) fn check_transition(t: QpType, from: QpState, to: QpState, mask: u32) -> Result<()> {
    let (req, opt) = transition(t, from, to).ok_or(Error::QpTransition {
        qp_type: t,
        from,
        to,
    })?;
    let named = |attr, required| Error::QpAttribute {
        qp_type: t,
        from,
        to,
        attr,
        required,
    };
    if mask & req != req {
        return Err(named(attr_name(req & !mask), true));
    }
    let extra = mask & !(req | opt | IB_QP_STATE);
    if extra != 0 {
        return Err(named(attr_name(extra), false));
    }
    // Allowed by the state machine but not expressible in `QpAttr` (the command would carry
    // zeros): alternate paths, migration state, and a caller-asserted current state.
    let inexpressible = mask & (IB_QP_ALT_PATH | IB_QP_PATH_MIG_STATE | IB_QP_CUR_STATE);
    if inexpressible != 0 {
        return Err(Error::Unsupported {
            what: match attr_name(inexpressible) {
                "cur_qp_state" => "IB_QP_CUR_STATE: the driver sends the state it tracks",
                _ => "alternate paths (IB_QP_ALT_PATH, IB_QP_PATH_MIG_STATE)",
            },
        });
    }
    Ok(())
}

/// The values named in `mask` fit their IB encodings.
pub(crate) fn check_values(a: &QpAttr, mask: u32) -> Result<()> {
    if mask & IB_QP_PATH_MTU != 0 && a.path_mtu.is_none() {
        return Err(Error::InvalidArgument {
            attr: "path_mtu",
            reason: "IB_QP_PATH_MTU is set but path_mtu is None",
        });
    }
    let fields: [(u32, &'static str, u64, u64); 7] = [
        (IB_QP_TIMEOUT, "timeout", a.timeout.into(), 31),
        (IB_QP_RETRY_CNT, "retry_cnt", a.retry_cnt.into(), 7),
        (IB_QP_RNR_RETRY, "rnr_retry", a.rnr_retry.into(), 7),
        (
            IB_QP_MIN_RNR_TIMER,
            "min_rnr_timer",
            a.min_rnr_timer.into(),
            31,
        ),
        (
            IB_QP_DEST_QPN,
            "dest_qp_num",
            a.dest_qp_num.into(),
            0xFF_FFFF,
        ),
        (IB_QP_RQ_PSN, "rq_psn", a.rq_psn.into(), 0xFF_FFFF),
        (IB_QP_SQ_PSN, "sq_psn", a.sq_psn.into(), 0xFF_FFFF),
    ];
    for (bit, attr, value, max) in fields {
        if mask & bit != 0 {
            Error::check_limit(attr, value, max, "of its IB encoding")?;
        }
    }
    if mask & IB_QP_AV != 0 && a.ah_attr.sl > 15 {
        return Err(Error::InvalidArgument {
            attr: "ah_attr.sl",
            reason: "service levels are 0..=15",
        });
    }
    Ok(())
}
