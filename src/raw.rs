//! Raw Ethernet: a RAW_PACKET QP whose send takes a frame and whose receive yields frames
//! with the device's packet flags and timestamp (docs/raw-ethernet.md).
//!
//! A [`RawQp`] owns a [`Qp`] of type [`QpType::RawPacket`] and its receive buffers (one
//! registered buffer of `rx_frames` slots). [`RawQp::send`] writes one send WQE: the control
//! segment, the PRM's Ethernet segment (checksum offload flags, the first header bytes
//! inline: at least the device's minimum inline size, at most
//! [`MAX_INLINE_HEADERS`]; VLAN insertion), then the rest of the frame inline or gathered
//! from registered memory. [`RawQp::recv_batch`] polls a receive CQ for up to `max` frames,
//! hands each to the caller with its [`RxFrame`] (length, L3/L4 types, checksum-ok bits,
//! timestamp in nanoseconds) and its bytes, re-posts the slots, and updates the receive
//! doorbell record and the CQ's consumer index once per batch.
//!
//! Steering: frames reach a raw QP only through rules ([`Qp::attach_flow`] with a
//! [`FlowRule`](crate::flow::FlowRule); [`RawQp::attach_flow`]).

use std::sync::Arc;

use mlx5_ffi::mlx5::{
    MLX5_USER_INLINE_MODE_L2, MLX5_USER_INLINE_MODE_NA, MLX5_USER_INLINE_MODE_NONE,
};
use mlx5_ffi::uverbs::{IB_QP_PORT, IB_QP_STATE, IB_UVERBS_DEVICE_RAW_IP_CSUM};
use mlx5_hw::opcodes::SendOpcode;

use crate::context::ticks_to_ns;
use crate::cq::{Cq, CqeKind, RawCq, RawCqe};
use crate::error::{Error, Result};
use crate::flow::{Flow, FlowRule};
use crate::mem::DmaBuf;
use crate::pd::{Access, Mr, Pd};
use crate::qp::{Qp, QpAttr, QpCap, QpInitAttr, QpState, QpType};
use crate::wr::{PostError, SendFlags, Sge, WcStatus};

/// The most header bytes the Ethernet segment carries inline: an Ethernet header with one
/// VLAN tag (libmlx5's `MLX5_ETH_L2_INLINE_HEADER_SIZE`), what the send queue reserves for
/// the segment (`sq_overhead`). Header bytes beyond these go in the payload.
pub const MAX_INLINE_HEADERS: usize = 18;

/// Ethernet segment `cs_flags`: compute the IPv4 header checksum (`MLX5_ETH_WQE_L3_CSUM`).
const CS_L3: u8 = 1 << 6;
/// Ethernet segment `cs_flags`: compute the TCP/UDP checksum (`MLX5_ETH_WQE_L4_CSUM`).
const CS_L4: u8 = 1 << 7;
/// The Ethernet segment's word at byte 12 with this bit set asks the device to insert a
/// VLAN tag (TCI in the low 16 bits) instead of carrying `inline_hdr_sz`.
const VLAN_INSERT: u32 = 1 << 31;

/// What the device does to a frame on its way out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TxOffload {
    /// Compute the IPv4 header checksum.
    pub ip_csum: bool,
    /// Compute the TCP or UDP checksum (pseudo-header included).
    pub l4_csum: bool,
    /// Insert an 802.1Q tag with this TCI after the two MACs. With header bytes inline the
    /// driver writes the tag into them (the device inserts only into frames it reads whole).
    pub vlan: Option<u16>,
}

/// The part of a frame after its inline headers.
#[derive(Clone, Copy, Debug)]
pub enum FramePayload<'a> {
    /// Copied into the WQE (at most the QP's `max_inline_data` bytes).
    Inline(&'a [u8]),
    /// Read by the device from registered memory (at most `max_send_sge` entries).
    Gather(&'a [Sge]),
}

/// Why a frame could not be posted. Nothing was written to the ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RawSendError {
    /// Fewer header bytes than the device's minimum inline size (`eth_min_inline`).
    HeadersTooShort {
        /// Header bytes given (with the tag of a VLAN the driver inserts into them).
        len: usize,
        /// The device's minimum.
        min: usize,
    },
    /// More header bytes than the Ethernet segment carries ([`MAX_INLINE_HEADERS`], the tag
    /// of a software-inserted VLAN included).
    HeadersTooLong {
        /// Header bytes (with the tag).
        len: usize,
        /// The most the segment holds.
        max: usize,
    },
    /// VLAN insertion into inline headers shorter than the two MACs.
    VlanWithoutMacs {
        /// Header bytes given.
        len: usize,
    },
    /// The device does not offer checksum offload for raw QPs (`IB_DEVICE_RAW_IP_CSUM`).
    NoChecksumOffload,
    /// The send queue refused the WQE (state, room, SGEs, inline size).
    Post(PostError),
}

impl From<PostError> for RawSendError {
    fn from(e: PostError) -> Self {
        RawSendError::Post(e)
    }
}

impl core::fmt::Display for RawSendError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            RawSendError::HeadersTooShort { len, min } => write!(
                f,
                "{len} inline header bytes, fewer than the device's minimum inline size {min}"
            ),
            RawSendError::HeadersTooLong { len, max } => write!(
                f,
                "{len} inline header bytes exceed the Ethernet segment's {max}"
            ),
            RawSendError::VlanWithoutMacs { len } => write!(
                f,
                "VLAN insertion into {len} inline header bytes: the tag goes after the 12 bytes of the two MACs"
            ),
            RawSendError::NoChecksumOffload => {
                f.write_str("checksum offload asked, but the device has no raw IP checksum offload")
            }
            RawSendError::Post(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for RawSendError {}

/// The L3 header type the device found (`l4_hdr_type_etc` bits 3:2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum L3Type {
    /// No IP header.
    None,
    /// IPv6.
    Ipv6,
    /// IPv4.
    Ipv4,
    /// The reserved value 3.
    Reserved,
}

/// The L4 header type the device found (`l4_hdr_type_etc` bits 6:4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum L4Type {
    /// None (or not TCP/UDP).
    None,
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
    /// TCP, an ACK without data.
    TcpAckNoData,
    /// TCP, an ACK with data.
    TcpAckData,
    /// A reserved value (5..=7).
    Reserved(u8),
}

/// One received frame: what the CQE says about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RxFrame {
    /// The receive slot it was placed in.
    pub slot: u32,
    /// Frame length in bytes (0 for an error completion).
    pub len: u32,
    /// L3 type.
    pub l3: L3Type,
    /// L4 type.
    pub l4: L4Type,
    /// The IPv4 header checksum is right (false without IPv4).
    pub l3_ok: bool,
    /// The TCP/UDP checksum is right (false without TCP/UDP).
    pub l4_ok: bool,
    /// The TCI of a VLAN tag the device stripped (none: this driver does not ask for
    /// stripping, a tag stays in the frame).
    pub vlan_tci: Option<u16>,
    /// The device's receive timestamp in nanoseconds of its free-running clock (0 if the
    /// device reports no clock frequency).
    pub timestamp_ns: u64,
    /// Success, or the error of a receive that failed (the frame's bytes are then not valid).
    pub status: WcStatus,
}

impl RxFrame {
    /// Decode a receive CQE; `clock_khz` converts its timestamp.
    pub fn from_cqe(cqe: &RawCqe, slot: u32, clock_khz: u64) -> Self {
        let ok = cqe.kind() == CqeKind::Recv;
        RxFrame {
            slot,
            len: if ok { cqe.byte_len() } else { 0 },
            l3: match cqe.l3_hdr_type() {
                0 => L3Type::None,
                1 => L3Type::Ipv6,
                2 => L3Type::Ipv4,
                _ => L3Type::Reserved,
            },
            l4: match cqe.l4_hdr_type() {
                0 => L4Type::None,
                1 => L4Type::Tcp,
                2 => L4Type::Udp,
                3 => L4Type::TcpAckNoData,
                4 => L4Type::TcpAckData,
                v => L4Type::Reserved(v),
            },
            l3_ok: cqe.l3_ok(),
            l4_ok: cqe.l4_ok(),
            vlan_tci: cqe.vlan_tci(),
            timestamp_ns: ticks_to_ns(cqe.timestamp(), clock_khz),
            status: cqe.status(),
        }
    }
}

/// The bytes of a received frame, in its receive slot (valid until the callback returns:
/// the slot is posted again right after).
#[derive(Debug)]
pub struct RxData<'a> {
    buf: &'a DmaBuf,
    off: usize,
    len: usize,
}

impl RxData<'_> {
    /// Frame length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the frame is empty (an error completion).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copy frame bytes from `offset` into `dst`; returns how many were copied (fewer than
    /// `dst.len()` at the frame's end, 0 past it).
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> usize {
        let n = self.len.saturating_sub(offset).min(dst.len());
        if n > 0 {
            self.buf.read(self.off + offset, &mut dst[..n]);
        }
        n
    }
}

/// Why a receive batch stopped early.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RawRecvError {
    /// A CQE on the receive CQ that is not a receive of this QP (a send completion, another
    /// QP's entry): the receive CQ of a [`RawQp`] must be its own. The CQE is consumed.
    ForeignCqe {
        /// The QP number it names.
        qpn: u32,
        /// What it is.
        kind: CqeKind,
    },
    /// The CQE's counter names no outstanding receive.
    Post(PostError),
}

impl core::fmt::Display for RawRecvError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            RawRecvError::ForeignCqe { qpn, kind } => write!(
                f,
                "a {kind:?} CQE of QP {qpn:#x} on a raw QP's receive CQ (it must be the QP's own)"
            ),
            RawRecvError::Post(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for RawRecvError {}

/// Creation attributes of a [`RawQp`].
#[derive(Clone, Copy, Debug)]
pub struct RawQpInit<'a> {
    /// Send CQ.
    pub send_cq: &'a Cq,
    /// Receive CQ (the QP's own: [`RawQp::recv_batch`] takes every CQE on it as this QP's).
    pub recv_cq: &'a Cq,
    /// Send WRs that may be outstanding.
    pub max_send_wr: u32,
    /// Gather entries per frame.
    pub max_send_sge: u32,
    /// Inline payload bytes per frame (after the inline headers).
    pub max_inline_data: u32,
    /// Receive slots (receive WQEs); 0 for a send-only QP.
    pub rx_frames: u32,
    /// Bytes per receive slot (frames longer are an error completion).
    pub rx_frame_bytes: u32,
    /// Every send completes with a CQE.
    pub sq_sig_all: bool,
}

impl<'a> RawQpInit<'a> {
    /// 256 sends with 256 bytes inline, 1 SGE; 512 receive slots of 2048 bytes.
    pub fn new(send_cq: &'a Cq, recv_cq: &'a Cq) -> Self {
        RawQpInit {
            send_cq,
            recv_cq,
            max_send_wr: 256,
            max_send_sge: 1,
            max_inline_data: 256,
            rx_frames: 512,
            rx_frame_bytes: 2048,
            sq_sig_all: false,
        }
    }
}

/// A RAW_PACKET QP with its receive slots. Posting and receiving take `&mut self`.
#[derive(Debug)]
pub struct RawQp {
    qp: Qp,
    rx: Option<(Arc<DmaBuf>, Mr)>,
    rx_frames: u32,
    slot_bytes: u32,
    min_inline: usize,
    ip_csum: bool,
    clock_khz: u64,
}

impl RawQp {
    /// Create a raw QP in `pd` (the QP stays in RESET until [`activate`](Self::activate)).
    ///
    /// # Errors
    /// [`Error::Os`] with `EPERM` naming `CAP_NET_RAW` if the process lacks it;
    /// [`Error::Unsupported`] for a device whose minimum inline mode needs more than
    /// [`MAX_INLINE_HEADERS`] (IP or TCP/UDP headers); [`Error::InvalidArgument`] for
    /// receive slots of 0 bytes or more than 64 KiB; otherwise as [`Qp::new`] (on an
    /// InfiniBand port: `EOPNOTSUPP` from CREATE_QP).
    pub fn new(pd: &Pd, init: &RawQpInit<'_>) -> Result<Self> {
        let ctx = pd.context();
        let min_inline = match ctx.inner.ucx.eth_min_inline {
            MLX5_USER_INLINE_MODE_NONE => 0,
            MLX5_USER_INLINE_MODE_NA | MLX5_USER_INLINE_MODE_L2 => MAX_INLINE_HEADERS,
            _ => {
                return Err(Error::Unsupported {
                    what: "a device that needs IP or TCP/UDP headers inline (eth_min_inline)",
                });
            }
        };
        if init.rx_frames > 0 && !(1..=65_536).contains(&init.rx_frame_bytes) {
            return Err(Error::InvalidArgument {
                attr: "rx_frame_bytes",
                reason: "a receive slot holds 1 to 65536 bytes",
            });
        }
        let mut attr = QpInitAttr::new(QpType::RawPacket, init.send_cq, init.recv_cq);
        attr.cap = QpCap {
            max_send_wr: init.max_send_wr,
            max_recv_wr: init.rx_frames,
            max_send_sge: init.max_send_sge,
            max_recv_sge: 1,
            max_inline_data: init.max_inline_data,
        };
        attr.sq_sig_all = init.sq_sig_all;
        attr.scatter_to_cqe = false;
        let qp = Qp::new(pd, &attr)?;
        let rx_frames = qp.cap().max_recv_wr;
        let rx = if rx_frames > 0 {
            let bytes = rx_frames as usize * init.rx_frame_bytes as usize;
            let buf = Arc::new(DmaBuf::new(bytes)?);
            let mr = pd.reg_mr(&buf, Access::LOCAL_WRITE)?;
            Some((buf, mr))
        } else {
            None
        };
        let ip_csum =
            u64::from(ctx.inner.attr.raw.device_cap_flags) & IB_UVERBS_DEVICE_RAW_IP_CSUM != 0;
        // A device without a core clock gives timestamps of 0 (`ticks_to_ns` with 0 kHz).
        let clock_khz = ctx.hca_core_clock_khz().unwrap_or(0);
        Ok(RawQp {
            qp,
            rx,
            rx_frames,
            slot_bytes: init.rx_frame_bytes,
            min_inline,
            ip_csum,
            clock_khz,
        })
    }

    /// RESET -> INIT on `port`, every receive slot posted, INIT -> RTR -> RTS.
    ///
    /// # Errors
    /// As [`Qp::modify`]; receives as [`crate::RecvQueue::push`] (as
    /// [`Error::InvalidArgument`] naming `rx_frames`).
    pub fn activate(&mut self, port: u8) -> Result<()> {
        let to = |s| QpAttr {
            qp_state: Some(s),
            port_num: port,
            ..QpAttr::default()
        };
        self.qp
            .modify(&to(QpState::Init), IB_QP_STATE | IB_QP_PORT)?;
        if let (Some((_, mr)), Some(rq)) = (&self.rx, self.qp.rq()) {
            for slot in 0..self.rx_frames {
                let sge = mr.sge(
                    u64::from(slot) * u64::from(self.slot_bytes),
                    self.slot_bytes,
                );
                rq.push(u64::from(slot), &[sge])
                    .map_err(|_| Error::InvalidArgument {
                        attr: "rx_frames",
                        reason: "the receive queue refused a slot",
                    })?;
            }
            rq.publish();
        }
        self.qp.modify(&to(QpState::Rtr), IB_QP_STATE)?;
        self.qp.modify(&to(QpState::Rts), IB_QP_STATE)
    }

    /// The QP (state, number, low-level queues).
    pub fn qp(&mut self) -> &mut Qp {
        &mut self.qp
    }

    /// QP number.
    pub fn qpn(&self) -> u32 {
        self.qp.qpn()
    }

    /// The device's minimum inline header size in bytes (0 or [`MAX_INLINE_HEADERS`]).
    pub fn min_inline(&self) -> usize {
        self.min_inline
    }

    /// The device clock's frequency in kHz (0 if it reports none).
    pub fn clock_khz(&self) -> u64 {
        self.clock_khz
    }

    /// Steer the frames `rule` matches to this QP.
    ///
    /// # Errors
    /// As [`Qp::attach_flow`].
    pub fn attach_flow(&self, rule: &FlowRule) -> Result<Flow> {
        self.qp.attach_flow(rule)
    }

    /// Post one frame: `headers` inline in the Ethernet segment, then `payload`; the device
    /// sees it at the next [`ring`](Self::ring). `flags`: SIGNALED, FENCE (INLINE is implied
    /// by the payload's kind).
    ///
    /// # Errors
    /// [`RawSendError`] naming the problem; nothing is written.
    #[inline]
    pub fn send(
        &mut self,
        headers: &[u8],
        payload: FramePayload<'_>,
        off: TxOffload,
        flags: SendFlags,
        wr_id: u64,
    ) -> core::result::Result<(), RawSendError> {
        let mut seg = [0u8; 32];
        let units = self.eth_segment(headers, off, &mut seg)?;
        let b = self.qp.sq().begin_with_segments(
            SendOpcode::SEND,
            flags,
            [0; 4],
            &seg[..units * 16],
        )?;
        match payload {
            FramePayload::Inline([]) => b.finish(wr_id),
            FramePayload::Inline(d) => b.inline(d)?.finish(wr_id),
            FramePayload::Gather(sges) => match sges.split_first() {
                None => b.finish(wr_id),
                Some((first, rest)) => {
                    let mut g = b.sge(first)?;
                    for s in rest {
                        g = g.sge(s)?;
                    }
                    g.finish(wr_id)
                }
            },
        }
        Ok(())
    }

    /// Build the Ethernet segment for `headers` and `off` into `seg`; its length in 16-byte
    /// units.
    #[inline]
    fn eth_segment(
        &self,
        headers: &[u8],
        off: TxOffload,
        seg: &mut [u8; 32],
    ) -> core::result::Result<usize, RawSendError> {
        // A tag the driver writes into inline headers counts towards the device's minimum.
        let tag = if off.vlan.is_some() && !headers.is_empty() {
            4
        } else {
            0
        };
        if headers.len() + tag < self.min_inline {
            return Err(RawSendError::HeadersTooShort {
                len: headers.len() + tag,
                min: self.min_inline,
            });
        }
        if (off.ip_csum || off.l4_csum) && !self.ip_csum {
            return Err(RawSendError::NoChecksumOffload);
        }
        seg[4] = if off.ip_csum { CS_L3 } else { 0 } | if off.l4_csum { CS_L4 } else { 0 };
        let n = match (off.vlan, headers.len()) {
            (Some(tci), 0) => {
                seg[12..16].copy_from_slice(&(VLAN_INSERT | u32::from(tci)).to_be_bytes());
                return Ok(1);
            }
            (Some(_), len) if len < 12 => return Err(RawSendError::VlanWithoutMacs { len }),
            (Some(tci), len) => {
                let n = len + 4;
                if n > MAX_INLINE_HEADERS {
                    return Err(RawSendError::HeadersTooLong {
                        len: n,
                        max: MAX_INLINE_HEADERS,
                    });
                }
                seg[14..26].copy_from_slice(&headers[..12]);
                seg[26..28].copy_from_slice(&0x8100u16.to_be_bytes());
                seg[28..30].copy_from_slice(&tci.to_be_bytes());
                seg[30..14 + n].copy_from_slice(&headers[12..]);
                n
            }
            (None, len) => {
                if len > MAX_INLINE_HEADERS {
                    return Err(RawSendError::HeadersTooLong {
                        len,
                        max: MAX_INLINE_HEADERS,
                    });
                }
                seg[14..14 + len].copy_from_slice(headers);
                len
            }
        };
        // `n <= 18`: fits the 16-bit field.
        seg[12..14].copy_from_slice(&(n as u16).to_be_bytes());
        Ok((14 + n).div_ceil(16))
    }

    /// Ring the doorbell for the frames posted since the last ring.
    #[inline]
    pub fn ring(&mut self) {
        self.qp.sq().ring();
    }

    /// A send completion of this QP taken from its send CQ: retire it; its `wr_id` and the
    /// device's send timestamp in nanoseconds.
    ///
    /// # Errors
    /// [`PostError::NotOutstanding`] if the counter names no outstanding send.
    #[inline]
    pub fn send_done(&mut self, cqe: &RawCqe) -> core::result::Result<(u64, u64), PostError> {
        let id = self.qp.sq().retire(cqe.wqe_counter())?;
        Ok((id, ticks_to_ns(cqe.timestamp(), self.clock_khz)))
    }

    /// Take up to `max` completions from `cq` (this QP's receive CQ), handing each frame to
    /// `f` with its bytes, then post the slots again: one doorbell-record update and one
    /// consumer-index update for the whole batch. Returns the frames handed over.
    ///
    /// # Errors
    /// [`RawRecvError`] for a CQE that is not this QP's receive (the frames before it were
    /// handed over and their slots posted again).
    #[inline]
    pub fn recv_batch(
        &mut self,
        cq: &mut RawCq,
        max: usize,
        mut f: impl FnMut(&RxFrame, &RxData<'_>),
    ) -> core::result::Result<usize, RawRecvError> {
        let qpn = self.qp.qpn();
        let (slot_bytes, khz) = (self.slot_bytes, self.clock_khz);
        let (Some((buf, mr)), Some(rq)) = (&self.rx, self.qp.rq()) else {
            return Ok(0);
        };
        let mut n = 0;
        let mut taken = false;
        let mut res = Ok(());
        while n < max {
            let Some(cqe) = cq.next() else { break };
            taken = true;
            let kind = cqe.kind();
            if cqe.qpn() != qpn || !matches!(kind, CqeKind::Recv | CqeKind::RecvError) {
                res = Err(RawRecvError::ForeignCqe {
                    qpn: cqe.qpn(),
                    kind,
                });
                break;
            }
            let slot = match rq.retire(cqe.wqe_counter()) {
                Ok(id) => id as u32,
                Err(e) => {
                    res = Err(RawRecvError::Post(e));
                    break;
                }
            };
            let frame = RxFrame::from_cqe(&cqe, slot, khz);
            let off = slot as usize * slot_bytes as usize;
            let len = (frame.len as usize).min(slot_bytes as usize);
            f(&frame, &RxData { buf, off, len });
            // The slot was just retired, so the queue has room for it again.
            let sge = mr.sge(off as u64, slot_bytes);
            if let Err(e) = rq.push(u64::from(slot), &[sge]) {
                res = Err(RawRecvError::Post(e));
                break;
            }
            n += 1;
        }
        if n > 0 {
            rq.publish();
        }
        if taken {
            cq.publish_ci();
        }
        res.map(|()| n)
    }
}
