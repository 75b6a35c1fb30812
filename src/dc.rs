//! DC (dynamically connected transport): one initiator reaches any target by a per-WR address.
//!
//! - [`Dci`]: a DC initiator (`mlx5dv_create_qp` with `MLX5DV_DCTYPE_DCI`: CREATE_QP of the
//!   driver type, `MLX5_QP_FLAG_TYPE_DCI` in mlx5's driver data). RC's reliability per
//!   connection; no destination at RTR: every WR carries one ([`DcWr`]), and the device
//!   connects to the target the WR names, reconnecting when the next WR names another.
//! - [`DcAddr`]: a target's address as the WQE carries it: the address vector of an
//!   [`Ah`] with the DCT number and the DC access key, the 48-byte datagram segment after the
//!   control segment. Built once, copied into each WQE.
//! - [`Dct`]: a DC target (`MLX5DV_DCTYPE_DCT`), a kernel-only object receiving into an
//!   [`Srq`] and checking each connect's access key. Its number is given at RTR (the driver
//!   response of MODIFY_QP), not at creation. A wrong key or an absent target ends the
//!   initiator's WR in a transport-retry error, as on hardware.
//!
//! `docs/xrc-dc.md` describes the connect and the emulated device.

use std::sync::Arc;

use mlx5_ffi::cmd::cmds;
use mlx5_ffi::mlx5::{
    MLX5_QP_FLAG_TYPE_DCI, MLX5_QP_FLAG_TYPE_DCT, Mlx5IbCreateQp, Mlx5IbCreateQpDciStreams,
};
use mlx5_ffi::uverbs::{
    IB_QP_ACCESS_FLAGS, IB_QP_AV, IB_QP_MIN_RNR_TIMER, IB_QP_PATH_MTU, IB_QP_PKEY_INDEX,
    IB_QP_PORT, IB_QP_STATE, IbUverbsCreateQp,
};
use mlx5_ffi::xrc_dc::IBV_QPT_DRIVER;
use mlx5_hw::types::Be64;

use crate::ah::Ah;
use crate::cq::{Cq, CqShared};
use crate::error::{Error, Result};
use crate::pd::{Access, Pd};
use crate::qp::{ConnectParams, Qp, QpAttr, QpInitAttr, QpState, QpType, SendQueue};
use crate::srq::{Srq, SrqHandle};
use crate::uverbs;
use crate::wr::{PostError, SendWr};
use crate::xrc::{KernelQp, post_one};

/// The address of a DC target: where a [`Dci`]'s WR goes.
#[derive(Clone, Copy, Debug)]
pub struct DcAddr {
    seg: [u8; 48],
    ctx_id: u64,
}

impl DcAddr {
    /// Target `dctn` (its number from [`Dct::number`] or the peer's exchange), reached
    /// through the path of `ah`, with access key `key` (the target's).
    ///
    /// # Errors
    /// [`Error::Limit`] naming `dctn` above 24 bits.
    pub fn new(ah: &Ah, dctn: u32, key: u64) -> Result<Self> {
        Error::check_limit("dctn", dctn.into(), 0xFF_FFFF, "of its 24-bit encoding")?;
        let mut av = *ah.av();
        av.set_dqpn(dctn);
        av.key = Be64::new(key);
        Ok(Self {
            seg: zerocopy::transmute!(av),
            ctx_id: ah.context_id(),
        })
    }

    /// The datagram segment as the WQE carries it (48 bytes).
    pub fn segment(&self) -> &[u8; 48] {
        &self.seg
    }
}

/// A send WR of a DC initiator: the verbs WR and the target it goes to.
#[derive(Clone, Copy, Debug)]
pub struct DcWr<'a> {
    /// The target.
    pub dest: &'a DcAddr,
    /// The request (SEND, SEND with immediate, RDMA WRITE (+IMM), READ, atomics; no UD
    /// destination).
    pub wr: SendWr<'a>,
    /// The DCI stream the WR goes on (`mlx5dv_wr_set_dc_addr_stream`): below the DCI's
    /// [`DciStreams::log_concurrent`] power of two; 0 on a DCI created without streams.
    pub stream: u16,
}

/// The streams of a DC initiator (`mlx5dv_dci_streams`, a "DCS"): WRs on different streams
/// may be executed concurrently by the device, and an error on one stream puts only that
/// stream in error (the QP stays in RTS) for up to `2^log_errored` streams at once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DciStreams {
    /// log2 of the concurrent streams (perftest's `--log_dci_streams`).
    pub log_concurrent: u8,
    /// log2 of the streams that may be in error at once (0: the first error is the QP's).
    pub log_errored: u8,
}

/// A DC initiator. Posting takes `&mut self`.
#[derive(Debug)]
pub struct Dci {
    qp: Qp,
    ctx_id: u64,
    /// Concurrent streams (1 without streams).
    streams: u32,
}

impl Dci {
    /// Create a DCI with the send side of `init` (its `qp_type` must be [`QpType::Dci`];
    /// `recv_cq`, `srq` and the receive capabilities are not used).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming `qp_type` or `srq`; as [`Qp::new`] otherwise
    /// (`EOPNOTSUPP` from CREATE_QP on a device without DC).
    pub fn new(pd: &Pd, init: &QpInitAttr<'_>) -> Result<Self> {
        Self::create(pd, init, None)
    }

    /// A DCI with `streams` (`mlx5dv_create_qp` with `MLX5DV_QP_INIT_ATTR_MASK_DCI_STREAMS`:
    /// `MLX5_QP_FLAG_DCI_STREAM` and the two logs in mlx5's driver data). Each WR names its
    /// stream ([`DcWr::stream`]).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming `log_concurrent` or `log_errored` beyond the device's
    /// `dci_streams_caps` (a device without streams reports 0 for both), or `log_errored`
    /// above `log_concurrent`; [`Error::Uverbs`] naming EX_QUERY_DEVICE; as [`new`](Self::new)
    /// otherwise.
    pub fn with_streams(pd: &Pd, init: &QpInitAttr<'_>, streams: DciStreams) -> Result<Self> {
        let (_, drv) = pd.context().query_device_ex()?;
        let caps = drv.dci_streams_caps;
        if streams.log_concurrent == 0 || streams.log_concurrent > caps.max_log_num_concurent {
            return Err(Error::InvalidArgument {
                attr: "log_concurrent",
                reason: "1 ..= the device's max_log_num_concurent (dci_streams_caps)",
            });
        }
        if streams.log_errored > caps.max_log_num_errored
            || streams.log_errored > streams.log_concurrent
        {
            return Err(Error::InvalidArgument {
                attr: "log_errored",
                reason: "at most the device's max_log_num_errored and log_concurrent",
            });
        }
        Self::create(pd, init, Some(streams))
    }

    fn create(pd: &Pd, init: &QpInitAttr<'_>, streams: Option<DciStreams>) -> Result<Self> {
        if init.qp_type != QpType::Dci {
            return Err(Error::InvalidArgument {
                attr: "qp_type",
                reason: "a Dci is created with QpType::Dci",
            });
        }
        if init.srq.is_some() {
            return Err(Error::InvalidArgument {
                attr: "srq",
                reason: "a DC initiator receives nothing",
            });
        }
        let mut init = *init;
        init.recv_cq = init.send_cq;
        init.cap.max_recv_wr = 0;
        init.cap.max_recv_sge = 0;
        let drv = streams.map(|s| Mlx5IbCreateQpDciStreams {
            log_num_concurent: s.log_concurrent,
            log_num_errored: s.log_errored,
        });
        Ok(Self {
            qp: Qp::create(pd, &init, MLX5_QP_FLAG_TYPE_DCI, drv)?,
            ctx_id: pd.context().id(),
            streams: streams.map_or(1, |s| 1 << s.log_concurrent),
        })
    }

    /// The QP (number, state, query, send-queue statistics).
    pub fn qp(&self) -> &Qp {
        &self.qp
    }

    /// The number of concurrent streams: `2^log_concurrent`, or 1 for a DCI created without.
    pub fn streams(&self) -> u32 {
        self.streams
    }

    /// RESET -> INIT -> RTR -> RTS on `port`: path MTU, timeout, retry counts, send PSN `psn`
    /// and `max_rd_atomic` of `p`. A DCI has no destination: each WR names one.
    ///
    /// # Errors
    /// As [`Qp::modify`].
    pub fn activate(&mut self, port: u8, psn: u32, p: &ConnectParams) -> Result<()> {
        let init = QpAttr {
            qp_state: Some(QpState::Init),
            port_num: port,
            pkey_index: p.pkey_index,
            ..QpAttr::default()
        };
        self.qp
            .modify(&init, IB_QP_STATE | IB_QP_PKEY_INDEX | IB_QP_PORT)?;
        let rtr = QpAttr {
            qp_state: Some(QpState::Rtr),
            path_mtu: Some(p.mtu),
            ..QpAttr::default()
        };
        self.qp.modify(&rtr, IB_QP_STATE | IB_QP_PATH_MTU)?;
        self.qp.to_rts_with(psn, p)
    }

    /// Any transition of the DCI's state machine.
    ///
    /// # Errors
    /// As [`Qp::modify`].
    pub fn modify(&mut self, attr: &QpAttr, mask: u32) -> Result<()> {
        self.qp.modify(attr, mask)
    }

    /// Post a chain of WRs, each to its own target, and ring the doorbell once. One WQE
    /// each: control segment, datagram segment (the target's AV, DCT number and key), the
    /// operation's remote-address/atomic segments, payload.
    ///
    /// # Errors
    /// The index of the first WR refused and why ([`PostError::ForeignAh`] for an address
    /// built on another context's AH, [`PostError::BadStream`] for a stream id beyond the
    /// DCI's streams); the WRs before it are posted and rung.
    pub fn post_send(&mut self, wrs: &[DcWr<'_>]) -> Result<(), (usize, PostError)> {
        let (ctx_id, streams) = (self.ctx_id, self.streams);
        let sq = self.qp.sq();
        let mut res = Ok(());
        for (i, w) in wrs.iter().enumerate() {
            let r = if w.dest.ctx_id != ctx_id {
                Err(PostError::ForeignAh)
            } else if u32::from(w.stream) >= streams {
                Err(PostError::BadStream {
                    stream: w.stream,
                    streams,
                })
            } else {
                post_one(sq, &w.dest.seg, &w.wr, w.stream)
            };
            if let Err(e) = r {
                res = Err((i, e));
                break;
            }
        }
        sq.ring();
        res
    }

    /// The send queue (low-level API: [`SendQueue::ring`], statistics, `retire`).
    pub fn sq(&mut self) -> &mut SendQueue {
        self.qp.sq()
    }
}

/// A DC target: receives into its SRQ from any DCI that presents its key. Kernel-only: its
/// completions arrive on the CQ given at creation, naming the DCT's number.
#[derive(Debug)]
pub struct Dct {
    k: KernelQp,
    key: u64,
    cq: Arc<CqShared>,
    number: Option<u32>,
    _srq: Arc<SrqHandle>,
    _pd: Pd,
}

impl Dct {
    /// Create a DCT in `pd` receiving into `srq`, completing into `cq`, accepting initiators
    /// that present `key`.
    ///
    /// # Errors
    /// [`Error::ContextMismatch`] if `cq` or `srq` are of another context than `pd`;
    /// [`Error::Unsupported`] on a context with CQE version 0 (receive completions are found
    /// by the DCT's user index); [`Error::Uverbs`] naming CREATE_QP.
    pub fn new(pd: &Pd, cq: &Cq, srq: &Srq, key: u64) -> Result<Self> {
        let ctx = pd.context().clone();
        ctx.check_same("cq", &cq.shared().ctx, "pd")?;
        ctx.check_same("srq", srq.context(), "pd")?;
        if ctx.cqe_version() != 1 {
            return Err(Error::Unsupported {
                what: "DC targets on a context with CQE version 0",
            });
        }
        let uidx = ctx.alloc_uidx()?;
        let cmd = IbUverbsCreateQp {
            response: 0,
            user_handle: crate::context::next_user_handle(),
            pd_handle: pd.inner.handle,
            send_cq_handle: cq.shared().handle_id(),
            recv_cq_handle: cq.shared().handle_id(),
            srq_handle: srq.handle.handle_id(),
            max_send_wr: 0,
            max_recv_wr: 0,
            max_send_sge: 0,
            max_recv_sge: 0,
            max_inline_data: 0,
            sq_sig_all: 0,
            qp_type: IBV_QPT_DRIVER,
            is_srq: 1,
            reserved: 0,
        };
        // libmlx5's DCT: its type and user index, the access key where a QP's SQ buffer
        // address would be; no buffers, no doorbell record.
        let drv = Mlx5IbCreateQp {
            flags: MLX5_QP_FLAG_TYPE_DCT,
            uidx,
            sq_buf_addr: key,
            ..Mlx5IbCreateQp::default()
        };
        let (core, _) = match uverbs::write::<cmds::CreateQp>(ctx.surface(), &cmd, &drv) {
            Ok(r) => r,
            Err(e) => {
                ctx.free_uidx(uidx);
                return Err(e);
            }
        };
        let k = KernelQp {
            ctx,
            handle: core.qp_handle,
            qpn: core.qpn,
            state: QpState::Reset,
            port: 1,
            uidx: Some(uidx),
        };
        cq.shared().route_srq(uidx, srq.shared.clone())?;
        Ok(Self {
            k,
            key,
            cq: cq.shared().clone(),
            number: None,
            _srq: srq.handle.clone(),
            _pd: pd.clone(),
        })
    }

    /// RESET -> INIT on `port` with the remote `access` initiators get (WRITE, READ,
    /// atomics), then INIT -> RTR with `p`'s path MTU and RNR timer: the DCT is then ready
    /// and its number known. A DCT goes no further than RTR.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming `qp_state` if it is not in RESET;
    /// [`Error::Uverbs`] naming EX_MODIFY_QP; [`Error::BadResponse`] if RTR answers no
    /// number.
    pub fn activate(&mut self, port: u8, access: Access, p: &ConnectParams) -> Result<u32> {
        if self.k.state != QpState::Reset {
            return Err(Error::InvalidArgument {
                attr: "qp_state",
                reason: "a DCT is activated from RESET",
            });
        }
        let init = QpAttr {
            qp_state: Some(QpState::Init),
            port_num: port,
            pkey_index: p.pkey_index,
            qp_access_flags: access,
            ..QpAttr::default()
        };
        self.k.modify_ex(
            &init,
            IB_QP_STATE | IB_QP_PKEY_INDEX | IB_QP_PORT | IB_QP_ACCESS_FLAGS,
        )?;
        let mut rtr = QpAttr {
            qp_state: Some(QpState::Rtr),
            path_mtu: Some(p.mtu),
            min_rnr_timer: p.min_rnr_timer,
            ..QpAttr::default()
        };
        rtr.ah_attr.port_num = port;
        rtr.ah_attr.sl = p.sl;
        let n = self.k.modify_ex(
            &rtr,
            IB_QP_STATE | IB_QP_AV | IB_QP_PATH_MTU | IB_QP_MIN_RNR_TIMER,
        )?;
        if n == 0 {
            return Err(Error::BadResponse {
                cmd: "EX_MODIFY_QP",
                what: "no DCT number at RTR",
            });
        }
        self.number = Some(n);
        Ok(n)
    }

    /// The DCT number initiators address (known from RTR on).
    pub fn number(&self) -> Option<u32> {
        self.number
    }

    /// The access key initiators must present.
    pub fn key(&self) -> u64 {
        self.key
    }

    /// The state as last set.
    pub fn state(&self) -> QpState {
        self.k.state
    }
}

impl Drop for Dct {
    fn drop(&mut self) {
        if let Some(u) = self.k.uidx {
            self.cq.unroute_srq(u);
        }
    }
}
