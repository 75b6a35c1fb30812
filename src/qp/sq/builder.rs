//! The WQE builder: the control and data segment encoders shared by every path, the operation
//! starts of the low-level API (each writes the segments its operation needs right after the
//! control segment), and the typed [`WqeBuilder`] that appends the payload and finishes the WQE.

use core::marker::PhantomData;

use mlx5_hw::opcodes::SendOpcode;
use mlx5_hw::wqe::{AtomicSeg, INLINE_SEG_FLAG, RaddrSeg};

use crate::ledger::SqShared;
use crate::mem::wq::WqWriter;
use crate::types::QpType;
use crate::wr::{PostError, SendFlags, Sge, UdDest};

use super::geometry::segments_reserved;
use super::*;

/// The first 8 bytes of a control segment as one native word: `opmod_idx_opcode` (opmod 0)
/// then `qpn_ds`, both big-endian, exactly as [`CtrlSeg`](mlx5_hw::wqe::CtrlSeg) lays them out.
#[inline(always)]
pub(super) fn ctrl_word0(opcode: SendOpcode, wqe_index: u32, qpn_word: u32, ds: u32) -> u64 {
    // opmod 0 | wqe_index (16 bits) | opcode, big-endian.
    let w = ((wqe_index & 0xFFFF) << 8 | u32::from(opcode.0)).to_be();
    let q = qpn_word | u32::from_ne_bytes([0, 0, 0, ds as u8]);
    u64::from(w) | u64::from(q) << 32
}

/// Bytes 8..16 of a control segment as one native word: signature and stream id 0, `fm_ce_se`,
/// then the immediate bytes as given (network order).
#[inline(always)]
pub(super) fn ctrl_word1(fm_ce_se: u8, imm: [u8; 4]) -> u64 {
    u64::from_ne_bytes([0, 0, 0, fm_ce_se, imm[0], imm[1], imm[2], imm[3]])
}

/// A data segment as two native words (byte count and lkey, then the address; big-endian).
#[inline(always)]
pub(super) fn data_seg_words(length: u32, lkey: u32, addr: u64) -> (u64, u64) {
    // In memory: the byte count then the lkey, both big-endian: exactly the big-endian bytes
    // of `length << 32 | lkey`, on either endianness.
    let lo = ((u64::from(length) << 32) | u64::from(lkey)).to_be();
    (lo, addr.to_be())
}

/// The UD address vector of `dest` with its destination QPN and Q_Key.
#[inline(always)]
pub(super) fn av_bytes(dest: &UdDest<'_>) -> [u8; 48] {
    let mut av = *dest.ah.av();
    av.set_dqpn(dest.remote_qpn);
    av.set_qkey(dest.remote_qkey);
    zerocopy::transmute!(av)
}

/// Write the control segment of the WQE of `ds` units starting at WQEBB counter `start` and
/// record `wr_id`; returns the control segment's first 8 bytes (the 8-byte doorbell). Shared by
/// both APIs and the fused paths.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn commit(
    ring: WqWriter<'_>,
    shared: &SqShared,
    qpn_word: u32,
    start: u32,
    ordinal: u32,
    ds: u32,
    opcode: SendOpcode,
    fm_ce_se: u8,
    imm: [u8; 4],
    wr_id: u64,
) -> u64 {
    let w0 = ctrl_word0(opcode, start, qpn_word, ds);
    ring.store16(start as usize * 64, w0, ctrl_word1(fm_ce_se, imm));
    shared.record(ordinal, start, wr_id, opcode);
    w0
}

/// The inline segment header for `len` bytes (big-endian `INLINE_SEG_FLAG | len`).
#[inline(always)]
pub(super) fn inline_hdr(len: u32) -> [u8; 4] {
    (INLINE_SEG_FLAG | len).to_be_bytes()
}

mod sealed {
    /// Seals [`PayloadKind`](super::PayloadKind): only this module's typestates implement it.
    #[expect(
        unnameable_types,
        reason = "a sealed trait is deliberately unnameable outside its module"
    )]
    pub trait Sealed {}
}

/// What a [`WqeBuilder`] may append next (a sealed typestate: [`AnyPayload`], [`Gather`],
/// [`Inline`], [`NoPayload`]).
pub trait PayloadKind: sealed::Sealed {
    /// Whether the payload is inline (for the BlueFlame policy).
    const INLINE: bool;
}

/// A fresh WQE of SEND or WRITE: takes data segments or inline bytes (not both).
#[derive(Debug)]
pub enum AnyPayload {}
/// A WQE whose payload is data segments (after [`WqeBuilder::sge`], or an RDMA READ).
#[derive(Debug)]
pub enum Gather {}
/// A WQE whose payload is inline bytes (after [`WqeBuilder::inline`]).
#[derive(Debug)]
pub enum Inline {}
/// A WQE with all its segments written (atomics): only [`WqeBuilder::finish`] remains.
#[derive(Debug)]
pub enum NoPayload {}

impl sealed::Sealed for AnyPayload {}
impl sealed::Sealed for Gather {}
impl sealed::Sealed for Inline {}
impl sealed::Sealed for NoPayload {}
impl PayloadKind for AnyPayload {
    const INLINE: bool = false;
}
impl PayloadKind for Gather {
    const INLINE: bool = false;
}
impl PayloadKind for Inline {
    const INLINE: bool = true;
}
impl PayloadKind for NoPayload {
    const INLINE: bool = false;
}

/// A WQE being built in the SQ ring (low-level API), opened by one of the queue's operation
/// starts ([`SendQueue::send`], [`write`](SendQueue::write), [`read`](SendQueue::read),
/// [`atomic`](SendQueue::atomic), [`send_ud`](SendQueue::send_ud), ...), which write the
/// control-adjacent segments the operation needs; the payload follows, and
/// [`finish`](Self::finish) writes the control segment and records the WR id.
///
/// The type says what may come next (`P`): an operation gets only the segments it may have,
/// in the order the device reads them, and each append is checked against the queue's
/// `max_send_sge` / `max_inline_data`, which are exactly what the queue reserved per WR: the
/// WQE never outgrows its reservation, and `ds` and the WQEBBs written always agree. Dropping
/// an unfinished builder abandons the WQE (nothing becomes visible).
#[derive(Debug)]
#[must_use = "a WQE is posted only by `finish` (and rung by `SendQueue::ring`)"]
pub struct WqeBuilder<'q, P> {
    /// The ring's writer, by value (kept in registers across the appends).
    pub(super) w: WqWriter<'q>,
    pub(super) q: &'q mut SqCore,
    /// WQEBB counter of the WQE.
    pub(super) start: u32,
    /// 16-byte units written before the payload (ctrl and operation segments), plus the data
    /// segments appended so far.
    pub(super) ds: u32,
    /// Data segments (`Gather`) or inline bytes (`Inline`) appended so far.
    pub(super) payload: u32,
    pub(super) opcode: SendOpcode,
    pub(super) fm_ce_se: u8,
    pub(super) imm: [u8; 4],
    pub(super) _kind: PhantomData<P>,
}

impl<'q, P> WqeBuilder<'q, P> {
    /// The same WQE as the next typestate.
    #[inline(always)]
    pub(super) fn into_kind<Q>(self) -> WqeBuilder<'q, Q> {
        WqeBuilder {
            w: self.w,
            q: self.q,
            start: self.start,
            ds: self.ds,
            payload: self.payload,
            opcode: self.opcode,
            fm_ce_se: self.fm_ce_se,
            imm: self.imm,
            _kind: PhantomData,
        }
    }

    /// Append a data segment; zero-length SGEs are skipped (0 would mean 2 GiB).
    #[inline(always)]
    pub(super) fn push_sge(&mut self, sge: &Sge) -> Result<(), PostError> {
        if sge.length == 0 {
            return Ok(());
        }
        let max = self.q.cfg.geo.max_gs;
        if self.payload >= max {
            return Err(PostError::TooManySges {
                n: self.payload as usize + 1,
                max,
            });
        }
        self.payload += 1;
        let (lo, hi) = data_seg_words(sge.length, sge.lkey, sge.addr);
        let pos = self.start as usize * 64 + self.ds as usize * 16;
        self.w.store16(pos, lo, hi);
        self.ds += 1;
        Ok(())
    }

    /// Append inline payload bytes after those appended so far.
    #[inline(always)]
    pub(super) fn push_inline(&mut self, data: &[u8]) -> Result<(), PostError> {
        let max = self.q.cfg.geo.max_inline;
        let total = self.payload as usize + data.len();
        if total > max as usize {
            return Err(PostError::InlineTooLarge { len: total, max });
        }
        let pos = self.start as usize * 64 + self.ds as usize * 16 + 4 + self.payload as usize;
        self.w.write(pos, data);
        self.payload = total as u32;
        Ok(())
    }
}

impl<'q> WqeBuilder<'q, AnyPayload> {
    /// Append a data (gather) segment; the WQE's payload is then data segments only.
    /// Zero-length SGEs are skipped (0 would mean 2 GiB).
    ///
    /// # Errors
    /// [`PostError::TooManySges`] past the queue's `max_send_sge` (the WQE is abandoned).
    #[inline(always)]
    pub fn sge(self, sge: &Sge) -> Result<WqeBuilder<'q, Gather>, PostError> {
        let mut b = self.into_kind::<Gather>();
        b.push_sge(sge)?;
        Ok(b)
    }

    /// Append inline payload bytes; the WQE's payload is then inline bytes only.
    ///
    /// # Errors
    /// [`PostError::InlineTooLarge`] when the WQE's inline total would exceed
    /// `max_inline_data` (the WQE is abandoned).
    #[inline(always)]
    pub fn inline(self, data: &[u8]) -> Result<WqeBuilder<'q, Inline>, PostError> {
        let mut b = self.into_kind::<Inline>();
        b.push_inline(data)?;
        Ok(b)
    }
}

impl WqeBuilder<'_, Gather> {
    /// Append another data segment (see [`WqeBuilder::<AnyPayload>::sge`]).
    ///
    /// # Errors
    /// [`PostError::TooManySges`] past the queue's `max_send_sge` (the WQE is abandoned).
    #[inline(always)]
    pub fn sge(mut self, sge: &Sge) -> Result<Self, PostError> {
        self.push_sge(sge)?;
        Ok(self)
    }
}

impl WqeBuilder<'_, Inline> {
    /// Append more inline bytes (concatenated with the earlier ones of this WQE).
    ///
    /// # Errors
    /// [`PostError::InlineTooLarge`] when the WQE's inline total would exceed
    /// `max_inline_data` (the WQE is abandoned).
    #[inline(always)]
    pub fn inline(mut self, data: &[u8]) -> Result<Self, PostError> {
        self.push_inline(data)?;
        Ok(self)
    }
}

impl<P: PayloadKind> WqeBuilder<'_, P> {
    /// Finish the WQE: write the inline header (if any inline byte was appended) and the
    /// control segment, record `wr_id`, advance the producer. The WQE is rung by the next
    /// [`SendQueue::ring`].
    #[inline(always)]
    pub fn finish(self, wr_id: u64) {
        let mut ds = self.ds;
        let q = self.q;
        // An inline WR counts as inline for the BlueFlame policy even with 0 bytes (libmlx5
        // sets its `inl` flag from IBV_SEND_INLINE), but a zero total length produces no
        // segment at all (docs/datapath.md §1.8).
        if P::INLINE && self.payload > 0 {
            let pos = self.start as usize * 64 + ds as usize * 16;
            self.w.write4(pos, inline_hdr(self.payload));
            // `payload <= max_inline` (< 1024): no overflow.
            ds += (self.payload + 4 + 15) >> 4;
        }
        commit(
            self.w,
            &q.shared,
            q.qpn_word,
            self.start,
            q.head,
            ds,
            self.opcode,
            self.fm_ce_se,
            self.imm,
            wr_id,
        );
        q.head = q.head.wrapping_add(1);
        q.cur_post = self.start.wrapping_add((ds + 3) >> 2);
        q.pend.last = self.start;
        q.pend.inline = P::INLINE;
        q.stats.wqes += 1;
    }
}

impl<P: PayloadKind> WqeBuilder<'_, P> {
    /// [`finish`](Self::finish), with `stream` in the control segment's DCI stream channel id
    /// (bytes 9-10, big-endian; `mlx5dv_wr_set_dc_addr_stream`). The WQE is not visible to the
    /// device before the next [`SendQueue::ring`], so the second store cannot be seen half done.
    #[inline(always)]
    pub(crate) fn finish_on_stream(self, wr_id: u64, stream: u16) {
        let (w, start, fm_ce_se) = (self.w, self.start, self.fm_ce_se);
        self.finish(wr_id);
        if stream != 0 {
            let [hi, lo] = stream.to_be_bytes();
            w.write4(start as usize * 64 + 8, [0, hi, lo, fm_ce_se]);
        }
    }
}

impl SendQueue {
    /// Take one credit and open a WQE of `ds` units so far (ctrl plus the segments the caller
    /// writes next) at the producer.
    #[inline(always)]
    pub(super) fn begin<P>(
        &mut self,
        opcode: SendOpcode,
        flags: SendFlags,
        imm: [u8; 4],
        ds: u32,
    ) -> Result<WqeBuilder<'_, P>, PostError> {
        let q = &mut self.q;
        if q.credits == 0 && !q.refill() {
            return Err(q.no_credit());
        }
        q.credits -= 1;
        Ok(WqeBuilder {
            w: self.ring.ring_mut().writer(),
            start: q.cur_post,
            ds,
            payload: 0,
            opcode,
            fm_ce_se: q.cfg.fm_ce_se(flags),
            imm,
            q,
            _kind: PhantomData,
        })
    }

    /// Ring byte position of the segment `unit` 16-byte units into the WQE at the producer.
    #[inline(always)]
    pub(super) fn seg_pos(&self, unit: u32) -> usize {
        self.q.cur_post as usize * 64 + unit as usize * 16
    }

    /// Refuse a plain connected operation (`connected`) on anything but RC or UC, and a UD
    /// operation (`!connected`) on anything but UD: the other types need their transport
    /// segment ([`begin_with_segments`](Self::begin_with_segments)).
    #[inline(always)]
    pub(super) fn need_connected(&self, connected: bool, err: PostError) -> Result<(), PostError> {
        let t = self.q.cfg.qp_type;
        let ok = if connected {
            t.is_plain_connected()
        } else {
            t == QpType::Ud
        };
        if ok { Ok(()) } else { Err(err) }
    }

    /// Open a WQE of `opcode` whose segments between the control segment and the payload the
    /// caller supplies: `segs`, whole 16-byte units in the order the device reads them (an XRC
    /// SRQ-number segment, a DC address vector, an Ethernet segment with its inline headers,
    /// then any remote-address or atomic segment), is written right after the control segment
    /// (wrapping at the ring end like every segment); the payload follows through the builder.
    /// The one WQE writer for the transports whose segments the operation starts above do not
    /// write. `flags` and `imm` as in [`send_imm`](Self::send_imm).
    ///
    /// The bound keeps every WQE inside its reservation: `segs` is at most what
    /// [`sq_overhead`](super::sq_overhead) reserved past the control segment for this QP type,
    /// and the payload is bounded by `max_send_sge` / `max_inline_data`, computed from the
    /// same overhead. Which opcode suits which QP type is the caller's (crate-internal) concern:
    /// a wrong one is the device's error completion, never a stray store.
    ///
    /// # Errors
    /// [`PostError::BadSegments`] if `segs.len()` is not a multiple of 16 or exceeds the
    /// reservation (nothing written); otherwise as [`send`](Self::send) for state and room.
    #[inline(always)]
    pub(crate) fn begin_with_segments(
        &mut self,
        opcode: SendOpcode,
        flags: SendFlags,
        imm: [u8; 4],
        segs: &[u8],
    ) -> Result<WqeBuilder<'_, AnyPayload>, PostError> {
        let reserved = segments_reserved(self.q.cfg.qp_type);
        if segs.len() % 16 != 0 || segs.len() > reserved as usize {
            return Err(PostError::BadSegments {
                len: segs.len(),
                reserved,
            });
        }
        let pos = self.seg_pos(1);
        // `segs.len() <= reserved < 2^10`: no overflow.
        let b = self.begin(opcode, flags, imm, 1 + (segs.len() / 16) as u32)?;
        for (i, unit) in segs.chunks_exact(16).enumerate() {
            let (lo, hi) = unit.split_at(8);
            let word = |h: &[u8]| u64::from_ne_bytes(h.try_into().unwrap_or([0; 8]));
            b.w.store16(pos + i * 16, word(lo), word(hi));
        }
        Ok(b)
    }

    /// Start a SEND (low-level API) on an RC or UC QP. Segments follow
    /// ([`WqeBuilder::sge`] or [`WqeBuilder::inline`]); nothing is visible to the device until
    /// [`WqeBuilder::finish`] and then [`ring`](Self::ring).
    ///
    /// `fm_ce_se` flags come from `flags` (SIGNALED, SOLICITED, FENCE; INLINE is ignored here).
    ///
    /// # Errors
    /// [`PostError::BadDestination`] on a UD QP (use [`send_ud`](Self::send_ud));
    /// [`PostError::BadState`] naming the state outside RTS/SQD/SQE/ERR;
    /// [`PostError::Full`] when `max_post` WRs are outstanding.
    #[inline(always)]
    pub fn send(&mut self, flags: SendFlags) -> Result<WqeBuilder<'_, AnyPayload>, PostError> {
        self.need_connected(true, PostError::BadDestination)?;
        self.begin(SendOpcode::SEND, flags, [0; 4], 1)
    }

    /// Start a SEND with immediate data (`imm` in network byte order) on an RC or UC QP.
    ///
    /// # Errors
    /// As [`send`](Self::send).
    #[inline(always)]
    pub fn send_imm(
        &mut self,
        flags: SendFlags,
        imm: [u8; 4],
    ) -> Result<WqeBuilder<'_, AnyPayload>, PostError> {
        self.need_connected(true, PostError::BadDestination)?;
        self.begin(SendOpcode::SEND_IMM, flags, imm, 1)
    }

    /// Start a SEND with invalidate of `rkey` on an RC or UC QP.
    ///
    /// # Errors
    /// [`PostError::BadOpcode`] on UD; otherwise as [`send`](Self::send).
    #[inline(always)]
    pub fn send_inv(
        &mut self,
        flags: SendFlags,
        rkey: u32,
    ) -> Result<WqeBuilder<'_, AnyPayload>, PostError> {
        self.need_connected(true, PostError::BadOpcode)?;
        self.begin(SendOpcode::SEND_INVAL, flags, rkey.to_be_bytes(), 1)
    }

    /// Start a UD SEND to `dest` (its address vector, QPN and Q_Key are written right after the
    /// control segment), with immediate data if `imm` is `Some`.
    ///
    /// # Errors
    /// [`PostError::BadDestination`] on a connected QP; [`PostError::ForeignAh`] if `dest.ah`
    /// belongs to another device context; otherwise as [`send`](Self::send).
    #[inline(always)]
    pub fn send_ud(
        &mut self,
        flags: SendFlags,
        dest: &UdDest<'_>,
        imm: Option<[u8; 4]>,
    ) -> Result<WqeBuilder<'_, AnyPayload>, PostError> {
        self.need_connected(false, PostError::BadDestination)?;
        if dest.ah.context_id() != self.q.cfg.ctx_id {
            return Err(PostError::ForeignAh);
        }
        let (op, imm) = match imm {
            Some(imm) => (SendOpcode::SEND_IMM, imm),
            None => (SendOpcode::SEND, [0; 4]),
        };
        let pos = self.seg_pos(1);
        let b = self.begin(op, flags, imm, 4)?;
        b.w.write_segs(pos, &av_bytes(dest));
        Ok(b)
    }

    /// Start an RDMA WRITE to `raddr`/`rkey` (RC, UC), with immediate data if `imm` is `Some`;
    /// the remote-address segment is written here.
    ///
    /// # Errors
    /// [`PostError::BadOpcode`] on UD; otherwise as [`send`](Self::send).
    #[inline(always)]
    pub fn write(
        &mut self,
        flags: SendFlags,
        raddr: u64,
        rkey: u32,
        imm: Option<[u8; 4]>,
    ) -> Result<WqeBuilder<'_, AnyPayload>, PostError> {
        self.need_connected(true, PostError::BadOpcode)?;
        let (op, imm) = match imm {
            Some(imm) => (SendOpcode::RDMA_WRITE_IMM, imm),
            None => (SendOpcode::RDMA_WRITE, [0; 4]),
        };
        let pos = self.seg_pos(1);
        let b = self.begin(op, flags, imm, 2)?;
        b.w.write_segs::<16>(pos, &zerocopy::transmute!(RaddrSeg::new(raddr, rkey)));
        Ok(b)
    }

    /// Start an RDMA READ from `raddr`/`rkey` into the data segments that follow (RC only; no
    /// inline payload).
    ///
    /// # Errors
    /// [`PostError::BadOpcode`] on UC or UD; otherwise as [`send`](Self::send).
    #[inline(always)]
    pub fn read(
        &mut self,
        flags: SendFlags,
        raddr: u64,
        rkey: u32,
    ) -> Result<WqeBuilder<'_, Gather>, PostError> {
        if self.q.cfg.qp_type != QpType::Rc {
            return Err(PostError::BadOpcode);
        }
        let pos = self.seg_pos(1);
        let b = self.begin(SendOpcode::RDMA_READ, flags, [0; 4], 2)?;
        b.w.write_segs::<16>(pos, &zerocopy::transmute!(RaddrSeg::new(raddr, rkey)));
        Ok(b)
    }

    /// Start an 8-byte atomic on `raddr`/`rkey` (RC only): compare-and-swap when `compare` is
    /// `Some`, else fetch-and-add of `swap_add`. The original value lands in the first 8 bytes
    /// of `result`. All segments are written here; only [`WqeBuilder::finish`] remains.
    ///
    /// # Errors
    /// [`PostError::BadOpcode`] on UC or UD; [`PostError::BadAtomicSge`] if `result` is shorter
    /// than 8 bytes; otherwise as [`send`](Self::send).
    #[inline(always)]
    pub fn atomic(
        &mut self,
        flags: SendFlags,
        raddr: u64,
        rkey: u32,
        swap_add: u64,
        compare: Option<u64>,
        result: &Sge,
    ) -> Result<WqeBuilder<'_, NoPayload>, PostError> {
        if self.q.cfg.qp_type != QpType::Rc {
            return Err(PostError::BadOpcode);
        }
        if result.length < 8 {
            return Err(PostError::BadAtomicSge);
        }
        let (op, compare) = match compare {
            Some(c) => (SendOpcode::ATOMIC_CS, c),
            None => (SendOpcode::ATOMIC_FA, 0),
        };
        let pos = self.seg_pos(1);
        let b = self.begin(op, flags, [0; 4], 4)?;
        let w = b.w;
        w.write_segs::<16>(pos, &zerocopy::transmute!(RaddrSeg::new(raddr, rkey)));
        w.write_segs::<16>(
            pos + 16,
            &zerocopy::transmute!(AtomicSeg::new(swap_add, compare)),
        );
        let (lo, hi) = data_seg_words(8, result.lkey, result.addr);
        w.store16(pos + 32, lo, hi);
        Ok(b)
    }
}
