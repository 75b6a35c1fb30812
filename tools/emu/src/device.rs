//! The device: doorbell intake, WQE execution, transport engine, CQEs and events.
//!
//! Everything here runs under the world lock, called from [`step`]. User memory (rings,
//! doorbell records, data buffers) is accessed through [`crate::mem`], so a buffer the user
//! unmapped behind the device's back produces an error completion, not a crash.

use std::collections::VecDeque;

use mlx5_hw::cqe::{Cqe64, ErrCqe, op_own};
use mlx5_hw::opcodes::{CqeOpcode, SendOpcode, Syndrome, VendorSyndrome};
use mlx5_hw::types::{Be16, Be32, Be64};
use mlx5_hw::wqe::{
    AtomicSeg, CtrlSeg, DataSeg, DatagramSeg, INLINE_SEG_FLAG, INVALID_LKEY, RaddrSeg,
};
use zerocopy::{FromBytes, FromZeros, IntoBytes};

use crate::state::{Outgoing, Outstanding, RxMsg, Sgl, World, access, ev, qps, qpt};
use crate::transport::{
    self, AtomicEth, Grh, Packet, Packets, Payload, ROCE_PORT, Reth, UNKNOWN_QPN, aeth, decode,
    encode, node_ip, op, psn_before,
};
use crate::uar::take_word;
use crate::{RunMode, mem};

/// How far to look for work in one step before yielding the lock.
const MAX_WQES_PER_QP_STEP: usize = 256;

/// One round of device work. Returns the number of work items done.
pub(crate) fn step(w: &mut World) -> usize {
    let mut work = 0;
    tick_clock(w);
    work += receive_udp(w);
    work += scan_doorbells(w);
    work += run_send_queues(w);
    work += deliver_wire(w);
    work += run_timers(w);
    work += flush_udp(w);
    if work == 0 && w.cfg.mode == RunMode::Stepped {
        if let Some(t) = next_deadline(w) {
            if t > w.vclock {
                w.vclock = t;
                work = 1;
            }
        }
    }
    work
}

/// Keep the core-clock page (internal_timer_h/l, big-endian) moving.
fn tick_clock(w: &World) {
    let now = w.now();
    for c in w.contexts.values() {
        let mut b = [0u8; 8];
        b[..4].copy_from_slice(&((now >> 32) as u32).to_be_bytes());
        b[4..].copy_from_slice(&(now as u32).to_be_bytes());
        c.uar.store(
            c.uar_pages,
            crate::kernel::caps::CORE_CLOCK_OFFSET as usize,
            b,
        );
    }
}

// ---------------------------------------------------------------------------------------
// Doorbells

enum Doorbell {
    Arm {
        hca: usize,
        ctx: u64,
        word: u64,
    },
    Send {
        hca: usize,
        ctx: u64,
        word: u64,
        rest: Vec<u8>,
    },
}

/// The size of one BlueFlame buffer (half a register): the doorbell words of a UAR page
/// are at 0x800, 0x800 + half, ... while 8 bytes fit in the page.
fn bf_half(bf_reg_size: u32) -> usize {
    if bf_reg_size >= 128 {
        (bf_reg_size / 2) as usize & !7
    } else {
        0x100
    }
}

fn scan_doorbells(w: &mut World) -> usize {
    let half = bf_half(w.cfg.bf_reg_size);
    let bf = w.cfg.bf_reg_size != 0;
    let mut found = Vec::new();
    for (&ctx, c) in &w.contexts {
        for &page in &c.uar_active {
            // A page past the end of the region has no doorbells.
            let Some(words) = c.uar.page_words(page) else {
                continue;
            };
            let arm = words
                .get(mlx5_hw::doorbell::UAR_CQ_DOORBELL / 8)
                .map_or(0, take_word);
            if arm != 0 {
                found.push(Doorbell::Arm {
                    hca: c.hca,
                    ctx,
                    word: arm,
                });
            }
            let mut pos = 0x800;
            while pos + 8 <= 0x1000 {
                let word = words.get(pos / 8).map_or(0, take_word);
                if word != 0 {
                    let rest = if bf {
                        c.uar.take_bytes(page, pos + 8, half - 8)
                    } else {
                        Vec::new()
                    };
                    found.push(Doorbell::Send {
                        hca: c.hca,
                        ctx,
                        word,
                        rest,
                    });
                }
                pos += half;
            }
        }
    }
    let n = found.len();
    for d in found {
        match d {
            Doorbell::Arm { hca, ctx, word } => cq_arm(w, hca, ctx, word),
            Doorbell::Send {
                hca,
                ctx,
                word,
                rest,
            } => send_doorbell(w, hca, ctx, word, &rest),
        }
    }
    n
}

fn send_doorbell(w: &mut World, hca: usize, ctx: u64, word: u64, rest: &[u8]) {
    // The 8 bytes are ctrl bytes 0..8 verbatim: BE32 opmod|idx|opcode, BE32 qpn|ds.
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&word.to_ne_bytes());
    let ctrl = CtrlSeg::read_from_bytes(&b).ok();
    let stepped = w.cfg.mode == RunMode::Stepped;
    if let Some(c) = &ctrl {
        w.wqe_log.doorbell(hca, c.qpn(), c.wqe_index(), rest);
    }
    let h = &mut w.hcas[hca];
    h.counters.doorbells += 1;
    let Some(ctrl) = ctrl else { return };
    let qpn = ctrl.qpn();
    let Some(qp) = h.qps.get_mut(&qpn).filter(|q| q.ctx == ctx) else {
        h.counters.doorbell_drops += 1;
        return;
    };
    let Ok(pi) = mem::read_be32(qp.db + 4) else {
        return;
    };
    qp.sq_rung = pi as u16;
    if rest.iter().any(|&x| x != 0) {
        h.counters.bf_writes += 1;
        if stepped && qp.sq_wqe_cnt > 0 {
            let len = (ctrl.ds() as usize * 16).min(rest.len() + 8);
            let ring = read_wqe(
                qp.buf + ((qp.rq_wqe_cnt as u64) << qp.rq_wqe_shift),
                qp.sq_wqe_cnt,
                ctrl.wqe_index() as u32,
                len,
            );
            let same = ring.is_ok_and(|r| len <= 8 || r[8..len] == rest[..len - 8]);
            if !same {
                h.counters.bf_mismatches += 1;
            }
        }
    }
}

fn cq_arm(w: &mut World, hca: usize, ctx: u64, word: u64) {
    let b = word.to_ne_bytes();
    let arm = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    let cqn = u32::from_be_bytes([b[4], b[5], b[6], b[7]]) & 0xff_ffff;
    w.hcas[hca].counters.cq_arms += 1;
    let Some(cq) = w.hcas[hca].cqs.get_mut(&cqn).filter(|c| c.ctx == ctx) else {
        return;
    };
    let sn = ((arm >> 28) & 3) as u8;
    let solicited = (arm >> 24) & 3 == 1;
    let ci = arm & 0xff_ffff;
    if cq.last_fired_sn == Some(sn) {
        return; // a repeat of the arm that already fired
    }
    cq.armed = Some(solicited);
    cq.armed_sn = sn;
    if !solicited && (cq.pi & 0xff_ffff) != ci {
        fire_event(w, hca, cqn);
    }
}

fn fire_event(w: &mut World, hca: usize, cqn: u32) {
    let Some(cq) = w.hcas[hca].cqs.get_mut(&cqn) else {
        return;
    };
    cq.armed = None;
    cq.last_fired_sn = Some(cq.armed_sn);
    let Some(ch) = cq.channel else { return };
    let handle = cq.user_handle;
    if let Some(Some(chan)) = w.channels.get_mut(ch) {
        if chan.push(&handle.to_ne_bytes()) {
            if let Some(cq) = w.hcas[hca].cqs.get_mut(&cqn) {
                cq.events += 1;
            }
            w.hcas[hca].counters.comp_events += 1;
        }
    }
}

// ---------------------------------------------------------------------------------------
// CQEs

/// Everything a CQE says.
#[derive(Clone, Debug, Default)]
struct CqeSpec {
    opcode: u8,
    qpn: u32,
    srqn_uidx: u32,
    byte_cnt: u32,
    imm: [u8; 4],
    wqe_counter: u16,
    send_op: u8,
    src_qp: u32,
    grh: bool,
    /// Responder CQE of a RoCE packet: its network header type (0 GRH, 1 IPv6, 2 IPv4).
    roce: Option<u8>,
    slid: u16,
    sl: u8,
    se: bool,
    /// (syndrome, vendor syndrome) for error CQEs.
    err: Option<(u8, u8)>,
    /// Data scattered into the CQE (format 1 or 2).
    scatter: Option<Vec<u8>>,
}

/// Write one CQE into CQ `cqn` of `hca` as hardware does; raises the completion event if
/// armed, the CQ error async event on overrun. Returns false if the CQE was not written.
fn post_cqe(w: &mut World, hca: usize, cqn: u32, s: &CqeSpec) -> bool {
    let now = w.now();
    let Some(cq) = w.hcas[hca].cqs.get_mut(&cqn) else {
        return false;
    };
    if cq.in_error {
        return false;
    }
    // The consumer index only matters when the ring looks full: re-read it then.
    if cq.pi.wrapping_sub(cq.ci_seen) & 0xff_ffff >= cq.ncqe {
        cq.ci_seen = mem::read_be32(cq.db)
            .map(|v| v & 0xff_ffff)
            .unwrap_or(cq.ci_seen);
    }
    let ci = cq.ci_seen;
    if !cq.ignore_overrun && (cq.pi.wrapping_sub(ci) & 0xff_ffff) >= cq.ncqe {
        cq.in_error = true;
        cq.async_events += 1;
        let (ctx, uh) = (cq.ctx, cq.user_handle);
        w.async_event(ctx, uh, ev::CQ_ERR);
        return false;
    }
    let log = cq.ncqe.trailing_zeros();
    let owner = ((cq.pi >> log) & 1) as u8;
    let entry = cq.buf + (cq.pi & (cq.ncqe - 1)) as u64 * cq.cqe_size as u64;
    let desc = entry + if cq.cqe_size == 128 { 64 } else { 0 };
    let mut format = 0;
    let mut bytes = [0u8; 64];
    if let Some(data) = &s.scatter {
        if cq.cqe_size == 128 && data.len() > 32 {
            format = 2;
            let mut first = [0u8; 64];
            first[..data.len().min(64)].copy_from_slice(&data[..data.len().min(64)]);
            if mem::write(entry, &first).is_err() {
                return false;
            }
        } else {
            format = 1;
            bytes[..data.len().min(32)].copy_from_slice(&data[..data.len().min(32)]);
        }
    }
    let opcode = CqeOpcode(s.opcode);
    if let Some((synd, vend)) = s.err {
        let mut e = ErrCqe::zeroed();
        e.srqn = Be32::new(s.srqn_uidx & 0xff_ffff);
        e.vendor_err_synd = vend;
        e.syndrome = synd;
        e.s_wqe_opcode_qpn = Be32::new((u32::from(s.send_op) << 24) | (s.qpn & 0xff_ffff));
        e.wqe_counter = Be16::new(s.wqe_counter);
        bytes.copy_from_slice(e.as_bytes());
    } else {
        let mut c = Cqe64::new_zeroed();
        c.slid = Be16::new(s.slid);
        // flags_rqpn: 29:28 GRH scattered to the buffer (1), 27:24 SL on InfiniBand; on
        // RoCE 25:24 carry the packet's network header type instead (and the SL, which
        // travels in the VLAN PCP, is absent without a VLAN).
        let l3 = match s.roce {
            Some(t) => u32::from(t & 3) << 24,
            None => u32::from(s.sl & 0xf) << 24,
        };
        c.flags_rqpn = Be32::new((s.src_qp & 0xff_ffff) | l3 | if s.grh { 1 << 28 } else { 0 });
        if let Some(t) = s.roce {
            // l4_hdr_type_etc: 6:4 L4 header type (2 = UDP for RoCE v2), 3:2 L3 header
            // type (1 IPv6, 2 IPv4; 0 for RoCE v1), 0 VLAN present (no VLAN here).
            let l4 = if t == 0 { 0 } else { 2 };
            c.l4_hdr_type_etc = (l4 << 4) | ((t & 3) << 2);
        }
        c.srqn_uidx = Be32::new(s.srqn_uidx & 0xff_ffff);
        c.imm_inval_pkey = Be32::from_bytes(s.imm);
        c.byte_cnt = Be32::new(s.byte_cnt);
        c.timestamp = Be64::new(now);
        c.sop_drop_qpn = Be32::new((u32::from(s.send_op) << 24) | (s.qpn & 0xff_ffff));
        c.wqe_counter = Be16::new(s.wqe_counter);
        // Format 1 (32 bytes scattered into the CQE): the payload owns bytes 0..32, so the
        // fields there (slid, flags_rqpn, ...) are not written, as on hardware; the
        // provider copies `byte_cnt` bytes from the start of the descriptor.
        if format == 1 {
            bytes[32..].copy_from_slice(&c.as_bytes()[32..]);
        } else {
            bytes.copy_from_slice(c.as_bytes());
        }
    }
    // Body first, then the ownership byte, so the poller never sees a half-written CQE.
    bytes[63] = op_own(opcode, format, s.se, owner);
    if mem::write_last_byte_last(desc, &bytes).is_err() {
        return false;
    }
    cq.pi = cq.pi.wrapping_add(1);
    let fire = match cq.armed {
        Some(sol) => !sol || s.se || s.err.is_some(),
        None => false,
    };
    let counters = &mut w.hcas[hca].counters;
    counters.cqes_written += 1;
    if let Some((synd, _)) = s.err {
        let flush = synd == Syndrome::WR_FLUSH.0;
        match (s.opcode == CqeOpcode::REQ_ERR.0, flush) {
            (true, true) => counters.req_cqe_flush_error += 1,
            (true, false) => counters.req_cqe_error += 1,
            (false, true) => counters.resp_cqe_flush_error += 1,
            (false, false) => counters.resp_cqe_error += 1,
        }
    }
    if fire {
        fire_event(w, hca, cqn);
    }
    true
}

// ---------------------------------------------------------------------------------------
// Memory translation

/// Translate `[va, va+len)` under key `key` for a QP in PD `pdn`; `need` are the access
/// bits the MR must grant. Returns the process address.
fn translate(
    w: &World,
    hca: usize,
    key: u32,
    pdn: u32,
    va: u64,
    len: u64,
    need: u32,
) -> Option<u64> {
    let mr = w.hcas[hca].mrs.get(&(key >> 8))?;
    if mr.key != key || mr.pdn != pdn || mr.access & need != need {
        return None;
    }
    let zero_based = mr.access & access::ZERO_BASED != 0;
    let base = if zero_based { 0 } else { mr.iova };
    let off = va.checked_sub(base)?;
    if off.checked_add(len)? > mr.length {
        return None;
    }
    Some(mr.start + off)
}

/// A remote access by a peer: the MR checks of [`translate`] plus the QP's own remote
/// access flags (`need` is one of REMOTE_READ, REMOTE_WRITE, REMOTE_ATOMIC).
#[allow(clippy::too_many_arguments)]
fn remote(
    w: &World,
    hca: usize,
    pdn: u32,
    qacc: u32,
    rkey: u32,
    va: u64,
    len: u64,
    need: u32,
) -> Option<u64> {
    translate(w, hca, rkey, pdn, va, len, need).filter(|_| qacc & need != 0)
}

/// [`remote`] for a RETH: a zero-length access needs no valid rkey (address 0).
fn remote_reth(w: &World, hca: usize, pdn: u32, qacc: u32, r: Reth, need: u32) -> Option<u64> {
    if r.len == 0 {
        Some(0)
    } else {
        remote(w, hca, pdn, qacc, r.rkey, r.va, u64::from(r.len), need)
    }
}

/// Parse data segments (`segs`, a multiple of 16 bytes) into a translated list.
fn data_segs(
    w: &World,
    hca: usize,
    pdn: u32,
    segs: &[u8],
    need: u32,
    stop_at_invalid: bool,
) -> Result<Sgl, Syndrome> {
    let mut out = Sgl::default();
    for chunk in segs.chunks_exact(16) {
        let Ok(d) = DataSeg::read_from_bytes(chunk) else {
            break;
        };
        if stop_at_invalid && d.lkey() == INVALID_LKEY {
            break;
        }
        let len = d.byte_count();
        if len & INLINE_SEG_FLAG != 0 && !stop_at_invalid {
            return Err(Syndrome::LOCAL_QP_OP);
        }
        let len = if len == 0 { 0x8000_0000 } else { len };
        let addr = translate(w, hca, d.lkey(), pdn, d.addr(), len as u64, need)
            .ok_or(Syndrome::LOCAL_PROT)?;
        out.push((addr, len));
    }
    Ok(out)
}

/// Read the bytes `sgl` describes, in order, into one payload.
fn gather(sgl: &[(u64, u32)]) -> Result<Payload, Syndrome> {
    let total: u64 = sgl.iter().map(|s| s.1 as u64).sum();
    if total > 0x8000_0000 {
        return Err(Syndrome::LOCAL_LENGTH);
    }
    Payload::build(total as usize, |buf| {
        let mut off = 0;
        for &(a, l) in sgl {
            let part = &mut buf[off..off + l as usize];
            mem::read(a, part).map_err(|_| Syndrome::LOCAL_PROT)?;
            off += l as usize;
        }
        Ok(())
    })
}

/// Scatter `data` into `sgl`. Err(LOCAL_LENGTH) if it does not fit.
fn scatter(sgl: &[(u64, u32)], data: &[u8]) -> Result<(), Syndrome> {
    let cap: u64 = sgl.iter().map(|s| s.1 as u64).sum();
    if (data.len() as u64) > cap {
        return Err(Syndrome::LOCAL_LENGTH);
    }
    let mut off = 0;
    for &(a, l) in sgl {
        if off >= data.len() {
            break;
        }
        let n = (l as usize).min(data.len() - off);
        mem::write(a, &data[off..off + n]).map_err(|_| Syndrome::LOCAL_PROT)?;
        off += n;
    }
    Ok(())
}

/// Read `len` bytes of the WQE starting at WQEBB counter `idx` of an SQ at `sq` with
/// `cnt` WQEBBs, following the wrap at the ring end.
fn read_wqe(sq: u64, cnt: u32, idx: u32, len: usize) -> Result<Vec<u8>, crate::Errno> {
    let mut out = Vec::with_capacity(len);
    read_wqe_into(sq, cnt, idx, len, &mut out)?;
    Ok(out)
}

/// [`read_wqe`], appending to `out`.
fn read_wqe_into(
    sq: u64,
    cnt: u32,
    idx: u32,
    len: usize,
    out: &mut Vec<u8>,
) -> Result<(), crate::Errno> {
    let mut i = idx;
    let mut done = 0;
    while done < len {
        let slot = (i & (cnt - 1)) as u64;
        let n = (len - done).min(64);
        let at = out.len();
        out.resize(at + n, 0);
        mem::read(sq + slot * 64, &mut out[at..])?;
        done += n;
        i = i.wrapping_add(1);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Send queues

/// The first QP of HCA `hca` after `after` (the first one for None), in QPN order. The
/// device walks the QPs this way instead of collecting their numbers first.
fn next_qpn(w: &World, hca: usize, after: Option<u32>) -> Option<u32> {
    use std::ops::Bound::{Excluded, Unbounded};
    let qps = &w.hcas[hca].qps;
    match after {
        None => qps.keys().next().copied(),
        Some(a) => qps.range((Excluded(a), Unbounded)).next().map(|(&q, _)| q),
    }
}

/// Every (HCA, QPN), in a stable order, walked without allocating: HCA by HCA, QPN by QPN.
/// QPs cannot come or go while the device runs (that takes the world lock).
fn for_each_qp(w: &mut World, mut f: impl FnMut(&mut World, usize, u32)) {
    for hca in 0..w.hcas.len() {
        let mut at = None;
        while let Some(qpn) = next_qpn(w, hca, at) {
            f(w, hca, qpn);
            at = Some(qpn);
        }
    }
}

fn run_send_queues(w: &mut World) -> usize {
    let mut work = 0;
    for_each_qp(w, |w, hca, qpn| {
        let Some(q) = w.hcas[hca].qps.get(&qpn) else {
            return;
        };
        if q.state == qps::ERR {
            work += flush_qp(w, hca, qpn);
        } else if q.state == qps::RTS && (q.sq_head as u16) != q.sq_rung {
            work += run_sq(w, hca, qpn);
        } else if q.state == qps::SQD && q.sqd_notify && q.rc.outstanding.is_empty() {
            let (ctx, uh) = (q.ctx, q.user_handle);
            if let Some(q) = w.hcas[hca].qps.get_mut(&qpn) {
                q.sqd_notify = false;
                q.events_reported += 1;
            }
            w.async_event(ctx, uh, ev::SQ_DRAINED);
            work += 1;
        }
    });
    work
}

/// Outcome of looking at one send WQE.
enum Exec {
    /// Executed; advance by this many WQEBBs.
    Done(u32),
    /// Must wait (fence, outstanding-read limit).
    Blocked,
}

/// The rung part of a send queue, fetched with one or two DMA reads up front (as hardware
/// prefetches WQEs after a doorbell) instead of one read per WQEBB.
struct Prefetch {
    /// WQEBB counter of the first fetched WQEBB.
    start: u32,
    /// The fetched WQEBBs, 64 bytes each.
    data: Vec<u8>,
}

impl Prefetch {
    /// Fetch the WQEBBs from `sq_head` up to the producer index of the last doorbell
    /// (at most one ring and `MAX_WQES_PER_QP_STEP` of them) into `data` (a reused
    /// buffer, returned in `Err` when nothing is fetched). Err if nothing is rung or a read
    /// fails; the WQEs are then read one by one, with per-WQE error handling.
    fn fetch(q: &crate::state::Qp, mut data: Vec<u8>) -> Result<Prefetch, Vec<u8>> {
        let cnt = q.sq_wqe_cnt;
        let rung = u32::from(q.sq_rung.wrapping_sub(q.sq_head as u16));
        let n = rung.min(cnt).min(MAX_WQES_PER_QP_STEP as u32);
        if cnt == 0 || n == 0 {
            return Err(data);
        }
        let sq = q.buf + ((q.rq_wqe_cnt as u64) << q.rq_wqe_shift);
        let first = q.sq_head & (cnt - 1);
        let till_end = (cnt - first).min(n);
        data.clear();
        data.resize(n as usize * 64, 0);
        let (a, b) = data.split_at_mut(till_end as usize * 64);
        if mem::read(sq + u64::from(first) * 64, a).is_err() || mem::read(sq, b).is_err() {
            return Err(data);
        }
        Ok(Prefetch {
            start: q.sq_head,
            data,
        })
    }

    /// `len` bytes from WQEBB counter `idx`, if all of them were fetched.
    fn get(&self, idx: u32, len: usize) -> Option<&[u8]> {
        let off = idx.wrapping_sub(self.start) as usize * 64;
        self.data.get(off..off.checked_add(len)?)
    }
}

fn run_sq(w: &mut World, hca: usize, qpn: u32) -> usize {
    let buf = std::mem::take(&mut w.wire.prefetch);
    let pf = match w.hcas[hca].qps.get(&qpn) {
        Some(q) => Prefetch::fetch(q, buf),
        None => Err(buf),
    };
    let mut wqe_buf = std::mem::take(&mut w.wire.wqe);
    let more = |q: &crate::state::Qp| q.state == qps::RTS && (q.sq_head as u16) != q.sq_rung;
    let mut n = 0;
    let mut go = w.hcas[hca].qps.get(&qpn).is_some_and(more);
    while go && n < MAX_WQES_PER_QP_STEP {
        match exec_wqe(w, hca, qpn, pf.as_ref().ok(), &mut wqe_buf) {
            Exec::Done(bbs) => {
                go = match w.hcas[hca].qps.get_mut(&qpn) {
                    Some(q) => {
                        q.sq_head = q.sq_head.wrapping_add(bbs.max(1));
                        more(q)
                    }
                    None => false,
                };
                n += 1;
            }
            Exec::Blocked => break,
        }
    }
    w.wire.wqe = wqe_buf;
    w.wire.prefetch = pf.map_or_else(|b| b, |p| p.data);
    n
}

/// The parsed, validated form of one send WQE.
struct Wqe<'a> {
    idx: u16,
    opcode: SendOpcode,
    signaled: bool,
    se: bool,
    fence: bool,
    imm: [u8; 4],
    /// Its `ds * 16` bytes, joined across the ring end.
    bytes: &'a [u8],
    wqebbs: u32,
}

/// Fill in the QP's number and user index and write `spec` to the QP's send CQ.
fn post_send_cqe(w: &mut World, hca: usize, qpn: u32, spec: CqeSpec) {
    let Some(q) = w.hcas[hca].qps.get(&qpn) else {
        return;
    };
    let spec = CqeSpec {
        qpn,
        srqn_uidx: q.uidx,
        ..spec
    };
    let cq = q.send_cq;
    post_cqe(w, hca, cq, &spec);
}

/// Write a requester error CQE (REQ_ERR) for the send WQE at `idx`.
fn req_err_cqe(w: &mut World, hca: usize, qpn: u32, idx: u16, send_op: u8, synd: Syndrome) {
    let err = Some((synd.0, VendorSyndrome::for_syndrome(synd).0));
    let spec = CqeSpec {
        opcode: CqeOpcode::REQ_ERR.0,
        wqe_counter: idx,
        send_op,
        err,
        ..Default::default()
    };
    post_send_cqe(w, hca, qpn, spec);
}

/// A send WQE failed: its error CQE, the counters, and the QP to the error state (a UD QP
/// to the send queue error state).
fn requester_error(w: &mut World, hca: usize, qpn: u32, idx: u16, send_op: u8, synd: Syndrome) {
    req_err_cqe(w, hca, qpn, idx, send_op, synd);
    match synd {
        Syndrome::TRANSPORT_RETRY_EXC => w.hcas[hca].counters.req_transport_retries_exceeded += 1,
        Syndrome::RNR_RETRY_EXC => w.hcas[hca].counters.req_rnr_retries_exceeded += 1,
        _ => {}
    }
    let rc = w.hcas[hca]
        .qps
        .get(&qpn)
        .is_none_or(|q| q.qp_type == qpt::RC);
    if rc {
        qp_to_err(w, hca, qpn, ev::QP_FATAL);
        return;
    }
    // A UD or UC QP's send error is not fatal (IBA 10.3.1, the SQEr state): the QP goes to
    // the send queue error state, where its receive queue goes on and its send queue waits
    // (no async event, no flush) until a modify back to RTS.
    if let Some(q) = w.hcas[hca].qps.get_mut(&qpn) {
        if matches!(q.state, qps::RTS | qps::SQD) {
            q.state = qps::SQE;
        }
    }
}

fn qp_to_err(w: &mut World, hca: usize, qpn: u32, event: u32) {
    let Some(q) = w.hcas[hca].qps.get_mut(&qpn) else {
        return;
    };
    if q.state == qps::ERR {
        return;
    }
    q.state = qps::ERR;
    q.events_reported += 1;
    let (ctx, uh) = (q.ctx, q.user_handle);
    w.async_event(ctx, uh, event);
}

fn requester_ok(
    w: &mut World,
    hca: usize,
    qpn: u32,
    idx: u16,
    send_op: u8,
    byte_cnt: u32,
    scatter: Option<Vec<u8>>,
) {
    let spec = CqeSpec {
        opcode: CqeOpcode::REQ.0,
        byte_cnt,
        wqe_counter: idx,
        send_op,
        scatter,
        ..Default::default()
    };
    post_send_cqe(w, hca, qpn, spec);
}

/// Execute the send WQE at the QP's `sq_head`: from the prefetch `pf` when it covers the
/// WQE, else read from the ring into `buf` (a reused buffer).
fn exec_wqe(w: &mut World, hca: usize, qpn: u32, pf: Option<&Prefetch>, buf: &mut Vec<u8>) -> Exec {
    let q = &w.hcas[hca].qps[&qpn];
    let sq = q.buf + ((q.rq_wqe_cnt as u64) << q.rq_wqe_shift);
    let (cnt, head) = (q.sq_wqe_cnt, q.sq_head);
    let idx = head as u16;
    if cnt == 0 {
        return Exec::Done(1);
    }
    // The first WQEBB in one read; the rest (if any) after the ctrl segment is checked.
    buf.clear();
    let first_pf = pf.and_then(|p| p.get(head, 64));
    if first_pf.is_none() && read_wqe_into(sq, cnt, head, 64, buf).is_err() {
        requester_error(w, hca, qpn, idx, 0, Syndrome::LOCAL_PROT);
        return Exec::Done(1);
    }
    let first = first_pf.unwrap_or(&buf[..]);
    let ctrl = CtrlSeg::read_from_bytes(&first[..16]).unwrap_or_else(|_| CtrlSeg::new_zeroed());
    let ds = ctrl.ds() as u32;
    let wqebbs = ds.div_ceil(4).max(1);
    let opcode = ctrl.opcode();
    if ds == 0 || ctrl.qpn() != qpn || ctrl.wqe_index() != idx {
        requester_error(w, hca, qpn, idx, opcode.0, Syndrome::LOCAL_QP_OP);
        return Exec::Done(wqebbs);
    }
    let len = ds as usize * 16;
    let bytes: &[u8] = match pf.and_then(|p| p.get(head, len)) {
        Some(all) => all,
        None => {
            if let Some(f) = first_pf {
                buf.clear();
                buf.extend_from_slice(f);
            }
            if len <= 64 {
                buf.truncate(len);
            } else {
                let rest = head.wrapping_add(1);
                let got = match pf.and_then(|p| p.get(rest, len - 64)) {
                    Some(r) => {
                        buf.extend_from_slice(r);
                        Ok(())
                    }
                    None => read_wqe_into(sq, cnt, rest, len - 64, buf),
                };
                if got.is_err() {
                    requester_error(w, hca, qpn, idx, opcode.0, Syndrome::LOCAL_PROT);
                    return Exec::Done(wqebbs);
                }
            }
            buf
        }
    };
    let wqe = Wqe {
        idx,
        opcode,
        signaled: ctrl.fm_ce_se & 0x0C != 0,
        se: ctrl.solicited(),
        fence: ctrl.fm_ce_se & 0xE0 != 0,
        imm: ctrl.imm.to_bytes(),
        bytes,
        wqebbs,
    };
    let qt = q.qp_type;
    // Ordering constraints for RC: fence waits for outstanding READ/atomics; the number of
    // outstanding READ/atomics is bounded by max_rd_atomic.
    if qt == qpt::RC {
        let reads = || {
            q.rc.outstanding
                .iter()
                .filter(|o| o.is_read_like && !o.done)
                .count()
        };
        let is_read = matches!(
            opcode,
            SendOpcode::RDMA_READ
                | SendOpcode::ATOMIC_CS
                | SendOpcode::ATOMIC_FA
                | SendOpcode::ATOMIC_MASKED_CS
                | SendOpcode::ATOMIC_MASKED_FA
        );
        if (wqe.fence && reads() > 0) || (is_read && reads() >= usize::from(q.max_rd_atomic.max(1)))
        {
            return Exec::Blocked;
        }
    }
    w.wqe_log.fetched(hca, qpn, idx, wqe.bytes);
    let c = &mut w.hcas[hca].counters;
    c.wqes_executed += 1;
    match build_request(w, hca, qpn, &wqe) {
        Ok((pkt, local, len)) => {
            post_request(w, hca, qpn, &wqe, pkt, local, len);
        }
        Err(s) => {
            requester_error(w, hca, qpn, idx, opcode.0, s);
        }
    }
    Exec::Done(wqe.wqebbs)
}

/// Decode the payload part of a WQE at byte offset `off`: inline data or data segments.
fn payload(
    w: &mut World,
    hca: usize,
    pdn: u32,
    bytes: &[u8],
    off: usize,
) -> Result<Payload, Syndrome> {
    let rest = bytes.get(off..).unwrap_or(&[]);
    if rest.len() >= 4 {
        let hdr = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]);
        if hdr & INLINE_SEG_FLAG != 0 {
            let len = (hdr & !INLINE_SEG_FLAG) as usize;
            w.hcas[hca].counters.inline_wqes += 1;
            return rest
                .get(4..4 + len)
                .map(Payload::from_slice)
                .ok_or(Syndrome::LOCAL_LENGTH);
        }
    }
    let sgl = data_segs(w, hca, pdn, rest, 0, false)?;
    gather(&sgl)
}

/// Validate a WQE and turn it into the request packet. Returns (packet, local scatter list
/// for responses, message length).
fn build_request(
    w: &mut World,
    hca: usize,
    qpn: u32,
    wqe: &Wqe<'_>,
) -> Result<(Packet, Sgl, u32), Syndrome> {
    let q = &w.hcas[hca].qps[&qpn];
    let (qt, pdn, mtu) = (q.qp_type, q.pdn, transport::mtu_bytes(q.path_mtu));
    let me = &w.hcas[hca].info;
    let mut p = Packet {
        src_hca: hca,
        slid: me.lid,
        src_qpn: qpn,
        se: wqe.se,
        ack_req: true,
        sl: q.path.sl,
        ..Default::default()
    };
    let b = wqe.bytes;
    let tbits = match qt {
        qpt::UC => op::UC,
        _ => 0,
    };
    let mut local = Sgl::default();
    let mut len = 0u32;
    if qt == qpt::UD {
        let av = DatagramSeg::read_from_bytes(b.get(16..64).ok_or(Syndrome::LOCAL_QP_OP)?)
            .map_err(|_| Syndrome::LOCAL_QP_OP)?;
        p.opcode = match wqe.opcode {
            SendOpcode::SEND => op::UD_SEND_ONLY,
            SendOpcode::SEND_IMM => op::UD_SEND_ONLY_IMM,
            _ => return Err(Syndrome::LOCAL_QP_OP),
        };
        let qkey = av.qkey();
        p.qkey = if qkey & 0x8000_0000 != 0 {
            q.qkey
        } else {
            qkey
        };
        p.dst_qpn = av.dqpn();
        if w.hcas[hca].info.is_roce() {
            // RoCE address vector (as libmlx5 builds it): the GRH bit is reserved (every
            // packet has a network header), rgid is the destination, bits 27:20 of
            // grh_gid_fl the source GID index, rmac the destination MAC, rlid the UDP
            // source port (RoCE v2). The frame goes to rmac: a MAC that is not the
            // destination node's loses the packet on the way.
            let (sgid, l3) = roce_source(w, hca, av.sgid_index()).ok_or(Syndrome::LOCAL_QP_OP)?;
            let node = crate::roce::node_of_gid(&av.rgid);
            let mac_ok = node.is_some_and(|n| {
                av.rmac == crate::roce::mac_of_guid(crate::BASE_GUID + u64::from(n))
            });
            p.dst_lid = if mac_ok { node.unwrap_or(0) } else { 0 };
            p.roce = Some(l3);
            p.sl = (av.stat_rate_sl >> 1) & 7;
            p.grh = Some(av_grh(&av, sgid));
        } else {
            p.dst_lid = route(w, av.rlid(), if av.grh() { Some(av.rgid) } else { None })
                .ok_or(Syndrome::LOCAL_QP_OP)?;
            if av.grh() {
                p.grh = Some(av_grh(&av, w.hcas[hca].info.port_gid));
            }
        }
        if wqe.opcode == SendOpcode::SEND_IMM {
            p.imm = Some(wqe.imm);
        }
        p.payload = payload(w, hca, pdn, b, 64)?;
        if p.payload.len() as u32 > mtu {
            return Err(Syndrome::LOCAL_LENGTH);
        }
        return Ok((p, local, 0));
    }
    // Connected: destination from the QP context.
    p.dst_qpn = q.dest_qpn;
    if me.is_roce() {
        // RoCE: routed by the destination GID (the DLID is not used); the packet type
        // follows the source GID's type.
        let (sgid_index, dgid) = (q.path.sgid_index, q.path.dgid);
        p.dst_lid = crate::roce::node_of_gid(&dgid).unwrap_or(0);
        p.roce = roce_source(w, hca, sgid_index).map(|(_, l3)| l3);
    } else {
        p.dst_lid = route(
            w,
            q.path.dlid,
            if q.path.is_global {
                Some(q.path.dgid)
            } else {
                None
            },
        )
        .unwrap_or(0);
    }
    let raddr = || -> Result<RaddrSeg, Syndrome> {
        RaddrSeg::read_from_bytes(b.get(16..32).ok_or(Syndrome::LOCAL_QP_OP)?)
            .map_err(|_| Syndrome::LOCAL_QP_OP)
    };
    match wqe.opcode {
        SendOpcode::NOP => {
            p.opcode = 0xFF;
        }
        SendOpcode::SEND | SendOpcode::SEND_IMM | SendOpcode::SEND_INVAL => {
            p.opcode = tbits
                | match wqe.opcode {
                    SendOpcode::SEND => op::RC_SEND_ONLY,
                    SendOpcode::SEND_IMM => op::RC_SEND_ONLY_IMM,
                    _ if qt == qpt::RC => op::RC_SEND_ONLY_INV,
                    _ => return Err(Syndrome::LOCAL_QP_OP),
                };
            if wqe.opcode == SendOpcode::SEND_IMM {
                p.imm = Some(wqe.imm);
            }
            if wqe.opcode == SendOpcode::SEND_INVAL {
                p.inv_rkey = Some(u32::from_be_bytes(wqe.imm));
            }
            p.payload = payload(w, hca, pdn, b, 16)?;
            len = p.payload.len() as u32;
        }
        SendOpcode::RDMA_WRITE | SendOpcode::RDMA_WRITE_IMM => {
            let r = raddr()?;
            p.opcode = tbits
                | if wqe.opcode == SendOpcode::RDMA_WRITE {
                    op::RC_WRITE_ONLY
                } else {
                    op::RC_WRITE_ONLY_IMM
                };
            if wqe.opcode == SendOpcode::RDMA_WRITE_IMM {
                p.imm = Some(wqe.imm);
            }
            p.payload = payload(w, hca, pdn, b, 32)?;
            len = p.payload.len() as u32;
            p.reth = Some(Reth {
                va: r.raddr(),
                rkey: r.rkey(),
                len,
            });
        }
        SendOpcode::RDMA_READ if qt == qpt::RC => {
            let r = raddr()?;
            local = data_segs(w, hca, pdn, &b[32..], access::LOCAL_WRITE, false)?;
            let total: u64 = local.iter().map(|s| s.1 as u64).sum();
            if total > 0x8000_0000 {
                return Err(Syndrome::LOCAL_LENGTH);
            }
            len = total as u32;
            p.opcode = op::RC_READ_REQUEST;
            p.reth = Some(Reth {
                va: r.raddr(),
                rkey: r.rkey(),
                len,
            });
        }
        SendOpcode::ATOMIC_CS | SendOpcode::ATOMIC_FA if qt == qpt::RC => {
            let r = raddr()?;
            let a = AtomicSeg::read_from_bytes(b.get(32..48).ok_or(Syndrome::LOCAL_QP_OP)?)
                .map_err(|_| Syndrome::LOCAL_QP_OP)?;
            local = data_segs(
                w,
                hca,
                pdn,
                b.get(48..).unwrap_or(&[]),
                access::LOCAL_WRITE,
                false,
            )?;
            let total: u64 = local.iter().map(|s| s.1 as u64).sum();
            if total != 8 {
                return Err(Syndrome::LOCAL_LENGTH);
            }
            len = 8;
            p.opcode = if wqe.opcode == SendOpcode::ATOMIC_CS {
                op::RC_CMP_SWAP
            } else {
                op::RC_FETCH_ADD
            };
            p.atomic = Some(Box::new(AtomicEth {
                va: r.raddr(),
                rkey: r.rkey(),
                swap_add: a.swap_add(),
                compare: a.compare(),
                masked: None,
            }));
        }
        SendOpcode::ATOMIC_MASKED_CS | SendOpcode::ATOMIC_MASKED_FA if qt == qpt::RC => {
            let r = raddr()?;
            let opmod = (u32::from_be_bytes([b[0], b[1], b[2], b[3]]) >> 24) as u8;
            let size: u8 = match opmod {
                0x08 => 4,
                0x09 => 8,
                _ => return Err(Syndrome::LOCAL_QP_OP),
            };
            let is_cs = wqe.opcode == SendOpcode::ATOMIC_MASKED_CS;
            let be = |o: usize, n: u8| -> u64 {
                let s = b.get(o..o + n as usize).unwrap_or(&[]);
                s.iter().fold(0u64, |acc, &x| (acc << 8) | u64::from(x))
            };
            let (swap_add, compare, m1, m2, seg_len) = match (is_cs, size) {
                (true, 4) => (be(32, 4), be(36, 4), be(40, 4), be(44, 4), 16),
                (true, _) => (be(32, 8), be(40, 8), be(48, 8), be(56, 8), 32),
                (false, 4) => (be(32, 4), 0, be(36, 4), 0, 16),
                (false, _) => (be(32, 8), 0, be(40, 8), 0, 16),
            };
            local = data_segs(
                w,
                hca,
                pdn,
                b.get(32 + seg_len..).unwrap_or(&[]),
                access::LOCAL_WRITE,
                false,
            )?;
            let total: u64 = local.iter().map(|s| s.1 as u64).sum();
            if total != u64::from(size) {
                return Err(Syndrome::LOCAL_LENGTH);
            }
            len = u32::from(size);
            p.opcode = op::RC_MASKED_ATOMIC;
            p.atomic = Some(Box::new(AtomicEth {
                va: r.raddr(),
                rkey: r.rkey(),
                swap_add,
                compare,
                masked: Some((m1, m2, is_cs, size)),
            }));
        }
        _ => return Err(Syndrome::LOCAL_QP_OP),
    }
    if len > (1 << 30) {
        return Err(Syndrome::LOCAL_LENGTH);
    }
    Ok((p, local, len))
}

/// A RoCE port's source GID `index` and the network header type packets sent from it
/// carry: RoCE v1 -> 0 (GRH), RoCE v2 -> 2 (IPv4) for an IPv4-mapped GID, else 1 (IPv6).
fn roce_source(w: &World, hca: usize, index: u8) -> Option<([u8; 16], u8)> {
    let e = crate::kernel::gid_at(w, hca, u32::from(index))?;
    let l3 = match e.gid_type {
        crate::GidType::RoceV2 if crate::roce::gid_ipv4(&e.gid).is_some() => 2,
        crate::GidType::RoceV2 => 1,
        _ => 0,
    };
    Some((e.gid, l3))
}

/// The destination LID of an address: the LID itself, or for a GID (link-local prefix +
/// node GUID) the node number the GUID encodes.
fn route(w: &World, lid: u16, gid: Option<[u8; 16]>) -> Option<u16> {
    if let Some(g) = gid {
        if let Some(h) = w.hcas.iter().find(|h| h.info.port_gid == g) {
            return Some(h.info.lid);
        }
        let mut b = [0u8; 8];
        b.copy_from_slice(&g[8..]);
        let n = u64::from_be_bytes(b).wrapping_sub(crate::BASE_GUID);
        if (1..0xffff).contains(&n) {
            return Some(n as u16);
        }
    }
    (lid != 0).then_some(lid)
}

fn post_request(
    w: &mut World,
    hca: usize,
    qpn: u32,
    wqe: &Wqe<'_>,
    pkt: Packet,
    local: Sgl,
    len: u32,
) {
    let now = w.now();
    let q = w.hcas[hca]
        .qps
        .get_mut(&qpn)
        .expect("caller checked the QP");
    let qt = q.qp_type;
    if pkt.opcode == 0xFF {
        // NOP: no packet; completes in order behind outstanding requests.
        if qt == qpt::RC && !q.rc.outstanding.is_empty() {
            let psn = q.sq_psn.wrapping_sub(1) & 0xff_ffff;
            q.rc.outstanding.push_back(Outstanding {
                psn,
                last_psn: psn,
                wqe_idx: wqe.idx,
                opcode: wqe.opcode.0,
                signaled: wqe.signaled,
                packets: Packets::default(),
                local,
                len: 0,
                done: true,
                is_read_like: false,
                read_buf: Vec::new(),
                read_next: psn,
                read_mtu: 0,
                read_va: 0,
            });
            return;
        }
        if wqe.signaled {
            requester_ok(w, hca, qpn, wqe.idx, wqe.opcode.0, 0, None);
        }
        return;
    }
    let mtu = transport::mtu_bytes(q.path_mtu) as usize;
    let first = q.sq_psn;
    let is_read = pkt.opcode == op::RC_READ_REQUEST;
    let packets = if qt == qpt::UD {
        Packets::One(Packet { psn: first, ..pkt })
    } else if is_read {
        split_read(pkt, mtu, first)
    } else {
        segment(pkt, mtu, first)
    };
    let span = if is_read {
        (len as usize).div_ceil(mtu).max(1) as u32
    } else {
        packets.len() as u32
    };
    q.sq_psn = (first + span) & 0xff_ffff;
    if qt == qpt::RC {
        let is_read_like = is_read || packets[0].atomic.is_some();
        let read_va = packets[0].reth.map_or(0, |r| r.va);
        if q.rc.outstanding.is_empty() {
            q.rc.retries_left = q.retry_cnt;
            q.rc.rnr_left = q.rnr_retry;
        }
        q.rc.outstanding.push_back(Outstanding {
            psn: first,
            last_psn: (first + span - 1) & 0xff_ffff,
            wqe_idx: wqe.idx,
            opcode: wqe.opcode.0,
            signaled: wqe.signaled,
            packets,
            local,
            len,
            done: false,
            is_read_like,
            read_buf: Vec::new(),
            read_next: first,
            read_mtu: mtu as u32,
            read_va,
        });
        if q.rc.deadline.is_none() {
            q.rc.deadline = transport::ack_timeout_ns(q.timeout).map(|t| now + t);
        }
        if q.rc.tx_next.is_none() {
            q.rc.tx_next = Some(first);
        }
        pump(w, hca, qpn);
    } else {
        let n: usize = packets.iter().map(|p| p.payload.len()).sum();
        for p in packets {
            send_packet(w, p);
        }
        if wqe.signaled {
            requester_ok(w, hca, qpn, wqe.idx, wqe.opcode.0, n as u32, None);
        }
    }
}

/// Split a READ into requests of at most [`TX_WINDOW`] response packets each, with the
/// PSNs and remote addresses of their parts of the span: the requester asks for the next
/// part only when the previous one has arrived, so no response burst outgrows the window.
fn split_read(pkt: Packet, mtu: usize, first_psn: u32) -> Packets {
    let r = pkt.reth.unwrap_or_default();
    let part = (TX_WINDOW as usize * mtu) as u64;
    let total = u64::from(r.len);
    let mut out = Vec::new();
    let mut off = 0u64;
    loop {
        let len = (total - off).min(part);
        let psn = (first_psn + (off / mtu as u64) as u32) & 0xff_ffff;
        let reth = Reth {
            va: r.va.wrapping_add(off),
            rkey: r.rkey,
            len: len as u32,
        };
        out.push(Packet {
            psn,
            reth: Some(reth),
            ..pkt.clone()
        });
        off += len;
        if off >= total {
            return Packets::Many(out);
        }
    }
}

/// Split a SEND/WRITE message (built as one `_ONLY` packet) into path-MTU packets
/// (FIRST/MIDDLE/LAST) with consecutive PSNs. RETH rides on the first packet, ImmDt/IETH
/// and the solicited bit on the last; every other request is one packet.
fn segment(pkt: Packet, mtu: usize, first_psn: u32) -> Packets {
    let base = pkt.opcode & 0x1f;
    let tbits = pkt.opcode & 0xe0;
    let is_send = matches!(base, 0x04 | 0x05 | 0x17);
    let is_write = matches!(base, 0x0A | 0x0B);
    if !(is_send || is_write) || pkt.payload.len() <= mtu || pkt.opcode == op::RC_MASKED_ATOMIC {
        return Packets::One(Packet {
            psn: first_psn,
            ..pkt
        });
    }
    // The header fields are copied into every packet; the payload only chunk by chunk
    // (parts of one shared buffer).
    let mut pkt = pkt;
    let payload = std::mem::take(&mut pkt.payload);
    let n = payload.len().div_ceil(mtu);
    let last_op = match base {
        0x04 => op::RC_SEND_LAST,
        0x05 => op::RC_SEND_LAST_IMM,
        0x17 => op::RC_SEND_LAST_INV,
        0x0A => op::RC_WRITE_LAST,
        _ => op::RC_WRITE_LAST_IMM,
    };
    let packets = (0..n)
        .map(|i| {
            let (first, last) = (i == 0, i + 1 == n);
            let opcode = tbits
                | match (is_send, first, last) {
                    (true, true, _) => op::RC_SEND_FIRST,
                    (true, false, false) => op::RC_SEND_MIDDLE,
                    (false, true, _) => op::RC_WRITE_FIRST,
                    (false, false, false) => op::RC_WRITE_MIDDLE,
                    (_, false, true) => last_op,
                };
            Packet {
                opcode,
                psn: (first_psn + i as u32) & 0xff_ffff,
                se: pkt.se && last,
                ack_req: last || i % 16 == 15,
                reth: if first { pkt.reth } else { None },
                imm: if last { pkt.imm } else { None },
                inv_rkey: if last { pkt.inv_rkey } else { None },
                payload: payload.part(i * mtu..((i + 1) * mtu).min(payload.len())),
                ..pkt.clone()
            }
        })
        .collect();
    Packets::Many(packets)
}

/// Put a packet on the fabric (in process, or UDP when the destination LID is not one of
/// ours), applying fault injection and pcap capture.
fn send_packet(w: &mut World, mut pkt: Packet) {
    let now = w.now();
    let f = w.cfg.fault;
    let src = pkt.src_hca;
    w.hcas[src].counters.packets_sent += 1;
    let local = w
        .hcas
        .iter()
        .position(|h| h.info.lid == pkt.dst_lid && pkt.dst_lid != 0);
    let remote = local.is_none() && pkt.dst_lid != 0 && w.hcas[src].sock.is_some();
    if local.is_none() && !remote {
        w.hcas[src].counters.packets_dropped += 1;
        return;
    }
    let roll = |w: &mut World, ppm: u32| ppm > 0 && (w.rand() % 1_000_000) < u64::from(ppm);
    if roll(w, f.drop_ppm) {
        w.hcas[src].counters.packets_dropped += 1;
        return;
    }
    let dup = roll(w, f.dup_ppm);
    let reorder = roll(w, f.reorder_ppm);
    let corrupt = roll(w, w.cfg.corrupt_ppm);
    let flip = w.rand();
    let (sip, dip) = (node_ip(w.hcas[src].info.lid), node_ip(pkt.dst_lid));
    if w.pcap.is_some() || remote {
        let mut bytes = encode(&pkt, sip, dip);
        if corrupt {
            // One flipped bit anywhere: the receiver's ICRC check discards the packet.
            let bit = (flip % (bytes.len() as u64 * 8)) as usize;
            bytes[bit / 8] ^= 1 << (bit % 8);
        }
        crate::pcap::capture(w, sip, dip, &bytes, now);
        if remote {
            // The same faults as in process: delay every datagram by `delay_ns`; a
            // reordered one is held back until the next one has gone out (or, if none
            // comes, for REORDER_HOLD_NS).
            let to = std::net::SocketAddrV4::new(dip.into(), ROCE_PORT);
            let at = now + f.delay_ns;
            let out = |held: bool, bytes: Vec<u8>| Outgoing {
                due: if held { at + REORDER_HOLD_NS } else { at },
                held,
                src,
                to,
                bytes,
            };
            if dup {
                queue_udp(w, out(false, bytes.clone()));
            }
            queue_udp(w, out(reorder, bytes));
            if f.delay_ns == 0 && !reorder {
                flush_udp(w);
            }
            return;
        }
    }
    pkt.dst_hca = local.unwrap_or(0);
    if corrupt {
        // In process there is no ICRC to compute: a corrupted packet is one the receiver
        // discards, exactly as it would on the wire.
        w.hcas[pkt.dst_hca].counters.packets_dropped += 1;
        return;
    }
    let at = now + f.delay_ns;
    if dup {
        w.wire.queue.push_back((at, pkt.clone()));
    }
    if reorder && !w.wire.queue.is_empty() {
        let pos = w.wire.queue.len() - 1;
        w.wire.queue.insert(pos, (at, pkt));
    } else {
        w.wire.queue.push_back((at, pkt));
    }
}

/// How long a datagram held back for reordering waits for a successor before it goes out
/// anyway (virtual time in stepped mode). Far below the shortest useful ACK timeout.
const REORDER_HOLD_NS: u64 = 20_000;

/// Queue a datagram for another process. A datagram that is not itself held back releases
/// the held ones before it: they now go out right after it.
fn queue_udp(w: &mut World, out: Outgoing) {
    if out.held || !w.outbox.iter().any(|o| o.held) {
        w.outbox.push_back(out);
        return;
    }
    let due = out.due;
    let (held, mut rest): (VecDeque<Outgoing>, VecDeque<Outgoing>) =
        w.outbox.drain(..).partition(|o| o.held);
    rest.push_back(out);
    rest.extend(held.into_iter().map(|o| Outgoing {
        due: due.max(o.due.saturating_sub(REORDER_HOLD_NS)),
        held: false,
        ..o
    }));
    w.outbox = rest;
}

/// Send every queued datagram that is due, in queue order. Returns how many went out.
fn flush_udp(w: &mut World) -> usize {
    if w.outbox.is_empty() {
        return 0;
    }
    let now = w.now();
    let mut n = 0;
    let mut keep = VecDeque::with_capacity(w.outbox.len());
    for o in std::mem::take(&mut w.outbox) {
        if o.due > now {
            keep.push_back(o);
            continue;
        }
        let sent = w.hcas[o.src]
            .sock
            .as_ref()
            .is_some_and(|s| s.send_to(&o.bytes, o.to).is_ok());
        if !sent {
            w.hcas[o.src].counters.packets_dropped += 1;
        }
        n += 1;
    }
    w.outbox = keep;
    n
}

/// Receive RoCEv2 packets from the UDP sockets into the delivery queue.
fn receive_udp(w: &mut World) -> usize {
    if w.hcas.iter().all(|h| h.sock.is_none()) {
        return 0;
    }
    let now = w.now();
    let mut n = 0;
    let mut buf = std::mem::take(&mut w.rx_buf);
    buf.resize(65536, 0);
    for hca in 0..w.hcas.len() {
        for _ in 0..256 {
            let Some(sock) = &w.hcas[hca].sock else { break };
            let Ok((len, from)) = sock.recv_from(&mut buf) else {
                break;
            };
            let std::net::SocketAddr::V4(from) = from else {
                continue;
            };
            let sip = from.ip().octets();
            let lid = w.hcas[hca].info.lid;
            match decode(&buf[..len], sip, node_ip(lid)) {
                Some(mut p) => {
                    p.dst_hca = hca;
                    p.slid = u16::from_be_bytes([sip[2], sip[3]]);
                    p.dst_lid = lid;
                    if w.hcas[hca].info.is_roce() {
                        // RoCEv2 over IPv4: the IP header is the "GRH" of a UD receive.
                        // (TOS and TTL as this fabric sends them: 0 and 64.)
                        p.roce = Some(2);
                        if p.transport() == 0x60 {
                            p.grh = Some(Box::new(Grh {
                                tclass: 0,
                                flow_label: 0,
                                hop_limit: 64,
                                sgid: crate::roce::ipv4_mapped_gid(sip),
                                dgid: crate::roce::ipv4_mapped_gid(node_ip(lid)),
                            }));
                        }
                    }
                    w.wire.queue.push_back((now, p));
                    n += 1;
                }
                None => w.hcas[hca].counters.packets_dropped += 1,
            }
        }
    }
    w.rx_buf = buf;
    n
}

// ---------------------------------------------------------------------------------------
// Receive side

fn deliver_wire(w: &mut World) -> usize {
    let now = w.now();
    let mut n = 0;
    // Deliver everything due now, in order, including packets generated while delivering
    // (bounded).
    while n < 4096 {
        let Some(pos) = w.wire.queue.iter().position(|(t, _)| *t <= now) else {
            break;
        };
        // Usually the oldest packet is due: take it off the front.
        let taken = if pos == 0 {
            w.wire.queue.pop_front()
        } else {
            w.wire.queue.remove(pos)
        };
        let Some((_, mut pkt)) = taken else {
            break;
        };
        if pkt.is_request() {
            responder(w, &mut pkt);
        } else {
            requester_response(w, &pkt);
        }
        n += 1;
    }
    n
}

fn reply(w: &mut World, req: &Packet, opcode: u8, syndrome: u8) -> Packet {
    let lid = w.hcas[req.dst_hca].info.lid;
    Packet {
        src_hca: req.dst_hca,
        dst_lid: req.slid,
        slid: lid,
        opcode,
        dst_qpn: req.src_qpn,
        src_qpn: req.dst_qpn,
        psn: req.psn,
        aeth: Some((syndrome, 0)),
        ..Default::default()
    }
}

fn nak(w: &mut World, req: &Packet, syndrome: u8) {
    let p = reply(w, req, op::RC_ACK, syndrome);
    send_packet(w, p);
}

/// Take the next receive WQE of a QP (its own RQ or its SRQ). Returns (scatter segments
/// bytes, wqe_counter, srqn) or None when none is posted. The bytes are in the device's
/// reusable receive buffer: give it back with [`recv_done`].
fn take_recv_wqe(w: &mut World, hca: usize, qpn: u32) -> Option<(Vec<u8>, u16, u32)> {
    let mut buf = std::mem::take(&mut w.wire.recv);
    buf.clear();
    match fetch_recv_wqe(w, hca, qpn, &mut buf) {
        Some((ctr, srqn)) => Some((buf, ctr, srqn)),
        None => {
            w.wire.recv = buf;
            None
        }
    }
}

/// Hand the buffer of [`take_recv_wqe`] back for reuse.
fn recv_done(w: &mut World, buf: Vec<u8>) {
    w.wire.recv = buf;
}

/// [`take_recv_wqe`] into `out` (empty): returns (wqe_counter, srqn).
fn fetch_recv_wqe(w: &mut World, hca: usize, qpn: u32, out: &mut Vec<u8>) -> Option<(u16, u32)> {
    let q = w.hcas[hca].qps.get_mut(&qpn)?;
    if let Some(srqn) = q.srq {
        let s = w.hcas[hca].srqs.get_mut(&srqn)?;
        let posted = mem::read_be32(s.db).ok()? & 0xffff;
        if (posted as u16).wrapping_sub(s.consumed as u16) == 0 {
            return None;
        }
        let idx = s.head & (s.wqe_cnt - 1) as u16;
        out.resize(s.stride as usize, 0);
        mem::read(s.buf + u64::from(idx) * u64::from(s.stride), out).ok()?;
        let wqe = &out[..];
        s.head = u16::from_be_bytes([wqe[2], wqe[3]]);
        s.consumed = s.consumed.wrapping_add(1);
        let avail = (posted as u16).wrapping_sub(s.consumed as u16) as u32;
        if s.limit > 0 && avail < s.limit {
            s.limit = 0;
            let (ctx, uh) = (s.ctx, s.user_handle);
            w.async_event(ctx, uh, 14); // IBV_EVENT_SRQ_LIMIT_REACHED
        }
        out.drain(..16.min(out.len()));
        return Some((idx, srqn));
    }
    if q.rq_wqe_cnt == 0 {
        return None;
    }
    let stride = 1u64 << q.rq_wqe_shift;
    if !rq_cached_avail(q) {
        q.rq_pi_seen = mem::read_be32(q.db).ok()? as u16;
        if q.rq_pi_seen == q.rq_head as u16 {
            return None;
        }
        let mut data = std::mem::take(&mut q.rq_prefetch.1);
        if prefetch_rq(q, stride, &mut data).is_none() {
            data.clear();
        }
        q.rq_prefetch = (q.rq_head, data);
    }
    let off = q.rq_head.wrapping_sub(q.rq_prefetch.0) as usize * stride as usize;
    match q.rq_prefetch.1.get(off..off + stride as usize) {
        Some(b) => out.extend_from_slice(b),
        None => {
            let slot = u64::from(q.rq_head & (q.rq_wqe_cnt - 1));
            out.resize(stride as usize, 0);
            mem::read(q.buf + slot * stride, out).ok()?;
        }
    }
    let ctr = q.rq_head as u16;
    q.rq_head = q.rq_head.wrapping_add(1);
    Some((ctr, 0))
}

fn responder_error_cqe(
    w: &mut World,
    hca: usize,
    qpn: u32,
    ctr: u16,
    srqn: u32,
    synd: Syndrome,
    vend: u8,
) {
    let Some(q) = w.hcas[hca].qps.get(&qpn) else {
        return;
    };
    let cqe_v1 = w.contexts.get(&q.ctx).is_some_and(|c| c.cqe_version == 1);
    let spec = CqeSpec {
        opcode: CqeOpcode::RESP_ERR.0,
        qpn,
        srqn_uidx: if cqe_v1 { q.uidx } else { srqn },
        wqe_counter: ctr,
        err: Some((synd.0, vend)),
        ..Default::default()
    };
    let cq = q.recv_cq;
    post_cqe(w, hca, cq, &spec);
}

fn responder(w: &mut World, pkt: &mut Packet) {
    let hca = pkt.dst_hca;
    let Some(q) = w.hcas.get(hca).and_then(|h| h.qps.get(&pkt.dst_qpn)) else {
        if let Some(h) = w.hcas.get_mut(hca) {
            h.counters.packets_dropped += 1;
        }
        return;
    };
    let qpn = q.qpn;
    let qt = q.qp_type;
    let ok_type = match pkt.transport() {
        0x00 => qt == qpt::RC,
        0x20 => qt == qpt::UC,
        _ => qt == qpt::UD,
    };
    if !ok_type || !matches!(q.state, qps::RTR | qps::RTS | qps::SQD | qps::SQE) {
        w.hcas[hca].counters.packets_dropped += 1;
        return;
    }
    if qt == qpt::UD {
        if pkt.qkey != q.qkey {
            w.hcas[hca].counters.packets_dropped += 1;
            return;
        }
    } else if pkt.src_qpn != q.dest_qpn && pkt.src_qpn != UNKNOWN_QPN {
        w.hcas[hca].counters.packets_dropped += 1;
        return;
    }
    if qt != qpt::UD {
        // RC/UC packets do not carry the source QP; the QP context knows its peer.
        pkt.src_qpn = q.dest_qpn;
    }
    let epsn = q.rq_psn;
    if qt == qpt::RC && pkt.psn != epsn {
        if psn_before(pkt.psn, epsn) {
            w.hcas[hca].counters.duplicate_request += 1;
            duplicate(w, pkt, epsn);
        } else {
            w.hcas[hca].counters.out_of_sequence += 1;
            let q = w.hcas[hca].qps.get_mut(&qpn).expect("looked up above");
            if !q.rc.nak_sent {
                q.rc.nak_sent = true;
                let mut n = reply(w, pkt, op::RC_ACK, aeth::NAK_PSN_SEQ);
                n.psn = epsn;
                send_packet(w, n);
            }
        }
        return;
    }
    if qt == qpt::UC && pkt.psn != epsn {
        // UC: a gap kills the message in progress; resynchronise on a first packet.
        let q = w.hcas[hca].qps.get_mut(&qpn).expect("looked up above");
        q.rc.rx = None;
        if !first_of_message(pkt.opcode) {
            q.rq_psn = (pkt.psn + 1) & 0xff_ffff;
            w.hcas[hca].counters.packets_dropped += 1;
            return;
        }
    }
    // Execute.
    let result = execute_request(w, hca, qpn, pkt);
    let q = w.hcas[hca].qps.get_mut(&qpn).expect("responder QP exists");
    match result {
        Ok((replies, span)) => {
            if qt != qpt::UD {
                q.rq_psn = (pkt.psn + span) & 0xff_ffff;
                q.rc.nak_sent = false;
            }
            if qt == qpt::RC {
                match replies {
                    Reply::None => {}
                    Reply::Ack => {
                        let ack = reply(w, pkt, op::RC_ACK, aeth::ACK);
                        send_packet(w, ack);
                    }
                    Reply::AtomicAck(orig) => {
                        let mut resp = reply(w, pkt, op::RC_ATOMIC_ACK, aeth::ACK);
                        resp.atomic_ack = Some(orig);
                        send_packet(w, resp);
                    }
                    Reply::Packets(ps) => {
                        for r in ps {
                            send_packet(w, r);
                        }
                    }
                }
            }
        }
        Err(RespErr::Rnr) => {
            w.hcas[hca].counters.out_of_buffer += 1;
            if qt == qpt::RC {
                let t = w.hcas[hca].qps[&qpn].min_rnr_timer;
                nak(w, pkt, aeth::RNR_NAK | (t & 0x1f));
            } else if let Some(q) = w.hcas[hca].qps.get_mut(&qpn).filter(|_| qt == qpt::UC) {
                q.rc.rx = None;
                q.rq_psn = (pkt.psn + 1) & 0xff_ffff;
            }
        }
        Err(RespErr::Nak(code, event)) => {
            if let Some(q) = w.hcas[hca].qps.get_mut(&qpn) {
                q.rc.rx = None;
            }
            if qt == qpt::RC {
                nak(w, pkt, code);
                qp_to_err(w, hca, qpn, event);
            }
        }
        Err(RespErr::Silent) => {
            if let Some(q) = w.hcas[hca].qps.get_mut(&qpn) {
                q.rc.rx = None;
                if qt == qpt::UC {
                    q.rq_psn = (pkt.psn + 1) & 0xff_ffff;
                }
            }
        }
    }
}

fn first_of_message(opcode: u8) -> bool {
    matches!(
        opcode & 0x1f,
        0x00 | 0x04 | 0x05 | 0x06 | 0x0A | 0x0B | 0x0C | 0x13 | 0x14 | 0x17
    ) || opcode == op::RC_MASKED_ATOMIC
}

fn last_of_message(opcode: u8) -> bool {
    matches!(opcode & 0x1f, 0x02..=0x05 | 0x08..=0x0B | 0x16 | 0x17)
}

/// What an executed request is answered with (RC), built when it is sent.
enum Reply {
    None,
    /// An ACK of the request's PSN.
    Ack,
    /// An atomic acknowledgement carrying the original value.
    AtomicAck(u64),
    /// READ responses.
    Packets(Packets),
}

enum RespErr {
    /// No receive WQE.
    Rnr,
    /// NAK with this AETH code; the responder QP goes to error with this async event.
    Nak(u8, u32),
    /// Drop without answer (UC/UD errors after the CQE was written).
    Silent,
}

/// Read `len` bytes at `va`/`rkey` for a READ request and build the response packets
/// (path-MTU sized, FIRST/MIDDLE/LAST or ONLY, PSNs from the request's).
fn read_response(w: &mut World, hca: usize, qpn: u32, req: &Packet) -> Result<Packets, RespErr> {
    let q = &w.hcas[hca].qps[&qpn];
    let (pdn, qacc, mtu) = (q.pdn, q.access, transport::mtu_bytes(q.path_mtu) as usize);
    let r = req.reth.unwrap_or_default();
    let addr = remote_reth(w, hca, pdn, qacc, r, access::REMOTE_READ)
        .ok_or(RespErr::Nak(aeth::NAK_REM_ACCESS, ev::QP_ACCESS_ERR))?;
    let data = Payload::build(r.len as usize, |buf| mem::read(addr, buf))
        .map_err(|_| RespErr::Nak(aeth::NAK_REM_OP, ev::QP_FATAL))?;
    // MTU-sized parts of the data (one empty response for a zero-length READ).
    let n = data.len().div_ceil(mtu).max(1);
    let responses = (0..n)
        .map(|i| {
            let opcode = match (i == 0, i + 1 == n) {
                (true, true) => op::RC_READ_RESPONSE_ONLY,
                (true, false) => op::RC_READ_RESPONSE_FIRST,
                (false, false) => op::RC_READ_RESPONSE_MIDDLE,
                (false, true) => op::RC_READ_RESPONSE_LAST,
            };
            let mut p = reply(w, req, opcode, aeth::ACK);
            p.psn = (req.psn + i as u32) & 0xff_ffff;
            if opcode == op::RC_READ_RESPONSE_MIDDLE {
                p.aeth = None;
            }
            p.payload = data.part(i * mtu..((i + 1) * mtu).min(data.len()));
            p
        })
        .collect();
    Ok(Packets::Many(responses))
}

/// Execute one in-sequence request packet at the responder. Returns the reply (RC) and
/// how many PSNs the request consumed.
fn execute_request(
    w: &mut World,
    hca: usize,
    qpn: u32,
    pkt: &Packet,
) -> Result<(Reply, u32), RespErr> {
    let q = &w.hcas[hca].qps[&qpn];
    let (pdn, qacc, qt, uidx) = (q.pdn, q.access, q.qp_type, q.uidx);
    let cqe_v1 = w.contexts.get(&q.ctx).is_some_and(|c| c.cqe_version == 1);
    let (recv_cq, scatter_ok, srq) = (q.recv_cq, q.scatter_cqe, q.srq);
    let rx = q.rc.rx.clone();
    let had_rx = rx.is_some();
    let base = pkt.opcode & 0x1F;
    let ud = qt == qpt::UD;
    if pkt.opcode == op::RC_READ_REQUEST {
        w.hcas[hca].counters.rx_read_requests += 1;
        let resp = read_response(w, hca, qpn, pkt)?;
        let span = resp.len() as u32;
        return Ok((Reply::Packets(resp), span));
    }
    if let Some(a) = pkt.atomic.as_deref() {
        w.hcas[hca].counters.rx_atomic_requests += 1;
        let size = a.masked.map_or(8, |m| m.3);
        if a.va % u64::from(size) != 0 {
            return Err(RespErr::Nak(aeth::NAK_INV_REQ, ev::QP_REQ_ERR));
        }
        let addr = remote(
            w,
            hca,
            pdn,
            qacc,
            a.rkey,
            a.va,
            u64::from(size),
            access::REMOTE_ATOMIC,
        )
        .ok_or(RespErr::Nak(aeth::NAK_REM_ACCESS, ev::QP_ACCESS_ERR))?;
        let orig = do_atomic(addr, pkt.opcode, a)
            .map_err(|_| RespErr::Nak(aeth::NAK_REM_OP, ev::QP_FATAL))?;
        let q = w.hcas[hca].qps.get_mut(&qpn).expect("responder QP exists");
        q.rc.atomic_cache.push_back((pkt.psn, orig));
        if q.rc.atomic_cache.len() > 16 {
            q.rc.atomic_cache.pop_front();
        }
        return Ok((Reply::AtomicAck(orig), 1));
    }
    let is_send = matches!(base, 0x00..=0x05 | 0x16 | 0x17);
    let is_write = matches!(base, 0x06..=0x0B) && !ud;
    if !is_send && !is_write {
        return Err(if qt == qpt::RC {
            RespErr::Nak(aeth::NAK_INV_REQ, ev::QP_REQ_ERR)
        } else {
            RespErr::Silent
        });
    }
    let (first, last) = (first_of_message(pkt.opcode), last_of_message(pkt.opcode));
    let inv = |qt| {
        if qt == qpt::RC {
            RespErr::Nak(aeth::NAK_INV_REQ, ev::QP_REQ_ERR)
        } else {
            RespErr::Silent
        }
    };
    // The message this packet belongs to.
    let mut msg = match (first, rx) {
        (true, Some(_)) if qt == qpt::RC => return Err(inv(qt)),
        (false, None) => return Err(inv(qt)),
        (false, Some(m)) if m.write != is_write => return Err(inv(qt)),
        (false, Some(m)) => m,
        (true, _) if is_write => {
            w.hcas[hca].counters.rx_write_requests += 1;
            let r = pkt.reth.unwrap_or_default();
            let Some(addr) = remote_reth(w, hca, pdn, qacc, r, access::REMOTE_WRITE) else {
                // A WRITE with immediate consumes a receive WQE even when its rkey check
                // fails: that WQE completes with a local access error.
                if pkt.imm.is_some() {
                    if let Some((segs, ctr, srqn)) = take_recv_wqe(w, hca, qpn) {
                        recv_done(w, segs);
                        let s = Syndrome::LOCAL_ACCESS;
                        let vend = VendorSyndrome::for_responder_syndrome(s).0;
                        responder_error_cqe(w, hca, qpn, ctr, srqn, s, vend);
                    }
                }
                return Err(if qt == qpt::RC {
                    RespErr::Nak(aeth::NAK_REM_ACCESS, ev::QP_ACCESS_ERR)
                } else {
                    RespErr::Silent
                });
            };
            RxMsg {
                write: true,
                addr,
                total: u64::from(r.len),
                ..Default::default()
            }
        }
        (true, _) => {
            let Some((segs, ctr, srqn)) = take_recv_wqe(w, hca, qpn) else {
                return Err(RespErr::Rnr);
            };
            let srq_pdn = srq
                .and_then(|s| w.hcas[hca].srqs.get(&s))
                .map_or(pdn, |s| s.pdn);
            let sgl = data_segs(w, hca, srq_pdn, &segs, access::LOCAL_WRITE, true);
            recv_done(w, segs);
            let sgl = match sgl {
                Ok(s) => s,
                Err(s) => {
                    responder_error_cqe(
                        w,
                        hca,
                        qpn,
                        ctr,
                        srqn,
                        s,
                        VendorSyndrome::for_responder_syndrome(s).0,
                    );
                    qp_to_err(w, hca, qpn, ev::QP_ACCESS_ERR);
                    return Err(if qt == qpt::RC {
                        RespErr::Nak(aeth::NAK_REM_OP, ev::QP_ACCESS_ERR)
                    } else {
                        RespErr::Silent
                    });
                }
            };
            let mut m = RxMsg {
                sgl,
                ctr,
                srqn,
                has_wqe: true,
                ..Default::default()
            };
            if ud {
                // The 40-byte GRH area heads the buffer; written only if a GRH came along.
                if pkt.grh.is_some() {
                    let _ = scatter_at(&m.sgl, 0, &grh_bytes(pkt));
                }
                m.offset = 40;
            }
            m
        }
    };
    // WRITE with immediate needs a receive WQE at the last packet: RNR before any effect.
    let needs_wqe_now = is_write && last && pkt.imm.is_some();
    if needs_wqe_now && !has_recv_wqe(w, hca, qpn) {
        return Err(RespErr::Rnr);
    }
    // The most a receive CQE takes in (scatter-to-CQE): 32 bytes, 64 in a 128-byte CQE.
    let limit = || {
        let cqe_size = w.hcas[hca].cqs.get(&recv_cq).map_or(64, |c| c.cqe_size);
        if cqe_size == 128 { 64 } else { 32 }
    };
    let mut cqe_scatter = None;
    if is_write {
        if msg.offset + pkt.payload.len() as u64 > msg.total {
            return Err(inv(qt));
        }
        if !pkt.payload.is_empty() && mem::write(msg.addr + msg.offset, &pkt.payload).is_err() {
            return Err(RespErr::Nak(aeth::NAK_REM_OP, ev::QP_FATAL));
        }
        msg.offset += pkt.payload.len() as u64;
    } else if first && last && scatter_ok && !ud && pkt.payload.len() <= limit() {
        let cap: u64 = msg.sgl.iter().map(|s| u64::from(s.1)).sum();
        if pkt.payload.len() as u64 > cap {
            responder_error_cqe(
                w,
                hca,
                qpn,
                msg.ctr,
                msg.srqn,
                Syndrome::LOCAL_LENGTH,
                VendorSyndrome::for_responder_syndrome(Syndrome::LOCAL_LENGTH).0,
            );
            qp_to_err(w, hca, qpn, ev::QP_REQ_ERR);
            return Err(if qt == qpt::RC {
                RespErr::Nak(aeth::NAK_INV_REQ, ev::QP_REQ_ERR)
            } else {
                RespErr::Silent
            });
        }
        cqe_scatter = Some(pkt.payload.to_vec());
        msg.offset += pkt.payload.len() as u64;
    } else {
        if let Err(s) = scatter_at(&msg.sgl, msg.offset, &pkt.payload) {
            responder_error_cqe(
                w,
                hca,
                qpn,
                msg.ctr,
                msg.srqn,
                s,
                VendorSyndrome::for_responder_syndrome(s).0,
            );
            let code = if s == Syndrome::LOCAL_LENGTH {
                aeth::NAK_INV_REQ
            } else {
                aeth::NAK_REM_OP
            };
            qp_to_err(w, hca, qpn, ev::QP_REQ_ERR);
            return Err(if qt == qpt::RC {
                RespErr::Nak(code, ev::QP_REQ_ERR)
            } else {
                RespErr::Silent
            });
        }
        msg.offset += pkt.payload.len() as u64;
    }
    if !last {
        w.hcas[hca]
            .qps
            .get_mut(&qpn)
            .expect("responder QP exists")
            .rc
            .rx = Some(msg);
        // Mid-message AckReq: acknowledge the progress (coalesced ACK of this PSN).
        let acks = if qt == qpt::RC && pkt.ack_req {
            Reply::Ack
        } else {
            Reply::None
        };
        return Ok((acks, 1));
    }
    if had_rx {
        // (Nothing since the start has set it: only a message in progress is to end.)
        w.hcas[hca]
            .qps
            .get_mut(&qpn)
            .expect("responder QP exists")
            .rc
            .rx = None;
    }
    if is_write && pkt.imm.is_some() {
        let Some((segs, ctr, srqn)) = take_recv_wqe(w, hca, qpn) else {
            return Err(RespErr::Rnr);
        };
        recv_done(w, segs);
        msg.ctr = ctr;
        msg.srqn = srqn;
        msg.has_wqe = true;
    }
    if msg.has_wqe {
        let spec = CqeSpec {
            opcode: if is_write {
                CqeOpcode::RESP_RDMA_WRITE_IMM.0
            } else if pkt.imm.is_some() {
                CqeOpcode::RESP_SEND_IMM.0
            } else if pkt.inv_rkey.is_some() {
                CqeOpcode::RESP_SEND_INV.0
            } else {
                CqeOpcode::RESP_SEND.0
            },
            qpn,
            srqn_uidx: if cqe_v1 { uidx } else { msg.srqn },
            byte_cnt: if is_write {
                msg.total as u32
            } else {
                msg.offset as u32
            },
            imm: pkt
                .imm
                .or(pkt.inv_rkey.map(u32::to_be_bytes))
                .unwrap_or_default(),
            wqe_counter: msg.ctr,
            src_qp: pkt.src_qpn,
            grh: ud && pkt.grh.is_some(),
            roce: pkt.roce,
            slid: if pkt.roce.is_some() { 0 } else { pkt.slid },
            sl: pkt.sl,
            se: pkt.se,
            scatter: cqe_scatter,
            ..Default::default()
        };
        post_cqe(w, hca, recv_cq, &spec);
    }
    if qt == qpt::RC {
        Ok((Reply::Ack, 1))
    } else {
        Ok((Reply::None, 1))
    }
}

/// Scatter `data` at byte `offset` of the scatter list. Err(LOCAL_LENGTH) if it does not fit.
fn scatter_at(sgl: &[(u64, u32)], offset: u64, data: &[u8]) -> Result<(), Syndrome> {
    let cap: u64 = sgl.iter().map(|s| u64::from(s.1)).sum();
    if offset + data.len() as u64 > cap {
        return Err(Syndrome::LOCAL_LENGTH);
    }
    let mut pos = 0u64; // start of the current segment in message space
    let mut done = 0usize;
    for &(a, l) in sgl {
        let l = u64::from(l);
        let want_start = offset + done as u64;
        if done < data.len() && want_start < pos + l {
            let inner = want_start - pos;
            let n = ((l - inner) as usize).min(data.len() - done);
            mem::write(a + inner, &data[done..done + n]).map_err(|_| Syndrome::LOCAL_PROT)?;
            done += n;
        }
        pos += l;
        if done >= data.len() {
            break;
        }
    }
    Ok(())
}

/// Read the posted receive WQEs `rq_head..rq_pi_seen` (at most one ring) into `data` in
/// one or two DMA reads. None if a read fails: the WQEs are then read one by one.
fn prefetch_rq(q: &crate::state::Qp, stride: u64, data: &mut Vec<u8>) -> Option<()> {
    let n = u32::from(q.rq_pi_seen.wrapping_sub(q.rq_head as u16)).min(q.rq_wqe_cnt);
    let first = q.rq_head & (q.rq_wqe_cnt - 1);
    let till_end = (q.rq_wqe_cnt - first).min(n);
    data.clear();
    data.resize(n as usize * stride as usize, 0);
    let (a, b) = data.split_at_mut(till_end as usize * stride as usize);
    mem::read(q.buf + u64::from(first) * stride, a).ok()?;
    mem::read(q.buf, b).ok()?;
    Some(())
}

/// Whether the receive producer index cached from the doorbell record shows a posted WQE
/// (anything outside `1..=rq_wqe_cnt` ahead of `rq_head` is stale: re-read the record).
fn rq_cached_avail(q: &crate::state::Qp) -> bool {
    let ahead = q.rq_pi_seen.wrapping_sub(q.rq_head as u16);
    ahead != 0 && u32::from(ahead) <= q.rq_wqe_cnt
}

fn has_recv_wqe(w: &World, hca: usize, qpn: u32) -> bool {
    let q = &w.hcas[hca].qps[&qpn];
    if let Some(s) = q.srq.and_then(|s| w.hcas[hca].srqs.get(&s)) {
        return mem::read_be32(s.db).is_ok_and(|p| (p as u16).wrapping_sub(s.consumed as u16) != 0);
    }
    q.rq_wqe_cnt > 0
        && (rq_cached_avail(q)
            || mem::read_be32(q.db).is_ok_and(|p| (p as u16) != (q.rq_head as u16)))
}

/// The 40-byte GRH placed at the head of a UD receive buffer (IPv6-style header).
fn grh_bytes(pkt: &Packet) -> [u8; 40] {
    let mut g = [0u8; 40];
    // RoCE v2: the UDP datagram is UDP (8) + BTH (12) + DETH (8) + ImmDt + payload + ICRC.
    let udp_len = 8 + 12 + 8 + if pkt.imm.is_some() { 4 } else { 0 } + pkt.payload.len() + 4;
    match (pkt.roce, pkt.grh.as_deref()) {
        (Some(2), Some(h)) => {
            // RoCE v2 over IPv4: the first 20 bytes are undefined (left zero), the IPv4
            // header fills the last 20.
            let ip = |gid: &[u8; 16]| crate::roce::gid_ipv4(gid).unwrap_or_default();
            g[20..].copy_from_slice(&crate::roce::ipv4_header(
                ip(&h.sgid),
                ip(&h.dgid),
                h.tclass,
                h.hop_limit,
                udp_len,
            ));
            return g;
        }
        (Some(1), Some(h)) => {
            // RoCE v2 over IPv6: the IPv6 header, next header UDP.
            let w0 = (6u32 << 28) | (u32::from(h.tclass) << 20) | (h.flow_label & 0xf_ffff);
            g[0..4].copy_from_slice(&w0.to_be_bytes());
            g[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
            g[6] = 17;
            g[7] = h.hop_limit;
            g[8..24].copy_from_slice(&h.sgid);
            g[24..40].copy_from_slice(&h.dgid);
            return g;
        }
        _ => {}
    }
    if let Some(h) = pkt.grh.as_deref() {
        let w0 = (6u32 << 28) | (u32::from(h.tclass) << 20) | (h.flow_label & 0xf_ffff);
        g[0..4].copy_from_slice(&w0.to_be_bytes());
        g[4..6].copy_from_slice(&((pkt.payload.len() + 12) as u16).to_be_bytes());
        g[6] = 0x1B;
        g[7] = h.hop_limit;
        g[8..24].copy_from_slice(&h.sgid);
        g[24..40].copy_from_slice(&h.dgid);
    }
    g
}

/// Perform an atomic on process memory at `addr` (validated); returns the original value
/// (host order, as `atomic_req_8B_endianness_mode` = host gives).
fn do_atomic(addr: u64, opcode: u8, a: &AtomicEth) -> Result<u64, crate::Errno> {
    let size = a.masked.map_or(8, |m| m.3);
    let mut buf = [0u8; 8];
    mem::read(addr, &mut buf[..size as usize])?;
    let orig = if size == 4 {
        u64::from(u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]))
    } else {
        u64::from_ne_bytes(buf)
    };
    let mask_all = if size == 4 { 0xffff_ffffu64 } else { u64::MAX };
    let new = match (opcode, a.masked) {
        (op::RC_CMP_SWAP, _) => {
            if orig == a.compare {
                a.swap_add
            } else {
                orig
            }
        }
        (op::RC_FETCH_ADD, _) => orig.wrapping_add(a.swap_add),
        (_, Some((m1, m2, true, _))) => {
            // masked CS: compare under compare_mask, swap the bits under swap_mask.
            if (orig ^ a.compare) & m2 == 0 {
                (orig & !m1) | (a.swap_add & m1)
            } else {
                orig
            }
        }
        (_, Some((boundary, _, false, _))) => {
            // masked FA: field_boundary bits mark the MSB of each field; carries stop there.
            let mut result = 0u64;
            let mut carry = 0u64;
            for bit in 0..u64::from(size) * 8 {
                let m = 1u64 << bit;
                let s = ((orig & m) >> bit) + ((a.swap_add & m) >> bit) + carry;
                result |= (s & 1) << bit;
                carry = if boundary & m != 0 { 0 } else { s >> 1 };
            }
            result
        }
        _ => orig,
    } & mask_all;
    if size == 4 {
        mem::write(addr, &(new as u32).to_ne_bytes())?;
    } else {
        mem::write(addr, &new.to_ne_bytes())?;
    }
    Ok(orig)
}

fn duplicate(w: &mut World, pkt: &Packet, epsn: u32) {
    let hca = pkt.dst_hca;
    if pkt.opcode == op::RC_READ_REQUEST {
        // Re-execute the read (idempotent) with the original PSNs.
        if let Ok(resp) = read_response(w, hca, pkt.dst_qpn, pkt) {
            for p in resp {
                send_packet(w, p);
            }
        }
        return;
    }
    if pkt.atomic.is_some() {
        let cached = w.hcas[hca].qps[&pkt.dst_qpn]
            .rc
            .atomic_cache
            .iter()
            .find(|(p, _)| *p == pkt.psn)
            .map(|c| c.1);
        if let Some(v) = cached {
            let mut resp = reply(w, pkt, op::RC_ATOMIC_ACK, aeth::ACK);
            resp.atomic_ack = Some(v);
            send_packet(w, resp);
        }
        return;
    }
    // SEND/WRITE: acknowledge everything received so far.
    let mut ack = reply(w, pkt, op::RC_ACK, aeth::ACK);
    ack.psn = epsn.wrapping_sub(1) & 0xff_ffff;
    send_packet(w, ack);
}

// ---------------------------------------------------------------------------------------
// Requester: responses, completion, retransmission

fn requester_response(w: &mut World, pkt: &Packet) {
    let hca = pkt.dst_hca;
    let qpn = pkt.dst_qpn;
    let now = w.now();
    let Some(q) = w.hcas.get_mut(hca).and_then(|h| h.qps.get_mut(&qpn)) else {
        return;
    };
    if q.qp_type != qpt::RC
        || q.state != qps::RTS && q.state != qps::SQD
        || (pkt.src_qpn != q.dest_qpn && pkt.src_qpn != UNKNOWN_QPN)
    {
        return;
    }
    let (syn, _) = pkt.aeth.unwrap_or((aeth::ACK, 0));
    let timeout = transport::ack_timeout_ns(q.timeout);
    let (retry_cnt, rnr_retry) = (q.retry_cnt, q.rnr_retry);
    // Anything before pkt.psn that is not a READ/atomic is implicitly acknowledged. (The
    // outstanding list is in PSN order: the scans stop at the first request ending later.)
    let mut progressed = false;
    for o in q.rc.outstanding.iter_mut() {
        if !psn_before(o.last_psn, pkt.psn) {
            break;
        }
        if !o.is_read_like && !o.done {
            o.done = true;
            progressed = true;
        }
    }
    let mut err: Option<(u16, u8, Syndrome)> = None;
    let mut retransmit_from: Option<u32> = None;
    // A response of the wrong kind at the PSN of a pending request (READ data or an atomic
    // result for a SEND/WRITE, READ data for an atomic, an atomic result for a READ) is an
    // unexpected opcode, which an IB requester takes as a bad response.
    let unexpected = (pkt.opcode != op::RC_ACK)
        .then(|| {
            q.rc.outstanding
                .iter()
                .find(|o| !o.done && contains(o, pkt.psn) && !answers(o, pkt.opcode))
        })
        .flatten()
        .map(|o| (o.wqe_idx, o.opcode, Syndrome::BAD_RESP));
    match (pkt.opcode, syn & 0xE0) {
        _ if unexpected.is_some() => err = unexpected,
        (op::RC_ATOMIC_ACK, _) => {
            if let Some(o) =
                q.rc.outstanding
                    .iter_mut()
                    .find(|o| o.psn == pkt.psn && o.is_read_like && !o.done)
            {
                let v = pkt.atomic_ack.unwrap_or(0);
                o.read_buf = if o.len == 4 {
                    (v as u32).to_ne_bytes().to_vec()
                } else {
                    v.to_ne_bytes().to_vec()
                };
                o.done = true;
                progressed = true;
            }
        }
        (op::RC_READ_RESPONSE_FIRST..=op::RC_READ_RESPONSE_ONLY, _) => {
            let in_span =
                |o: &Outstanding| !psn_before(pkt.psn, o.psn) && !psn_before(o.last_psn, pkt.psn);
            if let Some(o) =
                q.rc.outstanding
                    .iter_mut()
                    .find(|o| o.is_read_like && !o.done && in_span(o))
            {
                // In-order response packets only; a gap is recovered by re-reading.
                if pkt.psn == o.read_next {
                    o.read_buf.extend_from_slice(&pkt.payload);
                    o.read_next = (o.read_next + 1) & 0xff_ffff;
                    progressed = true;
                    // The last response of the last part completes the READ.
                    if matches!(
                        pkt.opcode,
                        op::RC_READ_RESPONSE_LAST | op::RC_READ_RESPONSE_ONLY
                    ) && pkt.psn == o.last_psn
                    {
                        o.done = true;
                    }
                }
            }
        }
        (_, 0x00) => {
            for o in q.rc.outstanding.iter_mut() {
                if psn_before(pkt.psn, o.last_psn) {
                    break;
                }
                if !o.is_read_like && !o.done {
                    o.done = true;
                    progressed = true;
                }
            }
            // A coalesced ACK inside a multi-packet message is progress too.
            if q.rc.acked.is_none_or(|a| psn_before(a, pkt.psn)) {
                q.rc.acked = Some(pkt.psn);
                progressed = true;
            }
        }
        (_, 0x20) => {
            // RNR NAK
            if rnr_retry != 7 && q.rc.rnr_left == 0 {
                if let Some(o) = q.rc.outstanding.iter().find(|o| contains(o, pkt.psn)) {
                    err = Some((o.wqe_idx, o.opcode, Syndrome::RNR_RETRY_EXC));
                }
            } else {
                if rnr_retry != 7 {
                    q.rc.rnr_left -= 1;
                }
                q.rc.rnr_wait_until = Some(now + transport::rnr_timer_ns(syn & 0x1f));
                q.rc.rnr_from = pkt.psn;
                q.rc.deadline = None;
            }
        }
        (_, 0x60) => {
            let code = syn;
            if code == aeth::NAK_PSN_SEQ {
                retransmit_from = Some(pkt.psn);
            } else if let Some(o) = q.rc.outstanding.iter().find(|o| contains(o, pkt.psn)) {
                let s = match code {
                    aeth::NAK_INV_REQ => Syndrome::REMOTE_INVAL_REQ,
                    aeth::NAK_REM_ACCESS => Syndrome::REMOTE_ACCESS,
                    _ => Syndrome::REMOTE_OP,
                };
                err = Some((o.wqe_idx, o.opcode, s));
            }
        }
        _ => {
            err =
                q.rc.outstanding
                    .front()
                    .map(|o| (o.wqe_idx, o.opcode, Syndrome::BAD_RESP));
        }
    }
    if progressed {
        q.rc.retries_left = retry_cnt;
        q.rc.rnr_left = if syn & 0xE0 == 0x20 {
            q.rc.rnr_left
        } else {
            rnr_retry
        };
        q.rc.deadline = timeout.map(|t| now + t);
    }
    // Whether anything waits for the window (retiring below does not change that).
    let tx_pending = q.rc.tx_next.is_some();
    if pkt.opcode == op::RC_ACK && syn & 0xE0 == 0x60 && syn == aeth::NAK_PSN_SEQ {
        w.hcas[hca].counters.packet_seq_err += 1;
    }
    if syn & 0xE0 == 0x20 && pkt.opcode == op::RC_ACK {
        w.hcas[hca].counters.rnr_nak_retry_err += 1;
    }
    retire(w, hca, qpn);
    if tx_pending {
        pump(w, hca, qpn);
    }
    if let Some((idx, opc, s)) = err {
        // Complete everything before the failed one, then fail it.
        drop_outstanding_until(w, hca, qpn, idx);
        requester_error(w, hca, qpn, idx, opc, s);
    }
    if let Some(from) = retransmit_from {
        retransmit(w, hca, qpn, from);
    }
}

/// Remove the failed WQE (and anything before it) from the outstanding list.
fn drop_outstanding_until(w: &mut World, hca: usize, qpn: u32, idx: u16) {
    if let Some(q) = w.hcas[hca].qps.get_mut(&qpn) {
        while let Some(o) = q.rc.outstanding.pop_front() {
            if o.wqe_idx == idx {
                break;
            }
        }
        q.rc.deadline = None;
        q.rc.rnr_wait_until = None;
    }
}

/// Complete finished requests in order.
fn retire(w: &mut World, hca: usize, qpn: u32) {
    loop {
        let Some(q) = w.hcas[hca].qps.get_mut(&qpn) else {
            return;
        };
        if !q.rc.outstanding.front().is_some_and(|o| o.done) {
            if q.rc.outstanding.is_empty() {
                q.rc.deadline = None;
            }
            return;
        }
        let o = q.rc.outstanding.pop_front().expect("front exists");
        let req_scatter = q.req_scatter;
        let send_cq = q.send_cq;
        let mut scatter_data = None;
        if o.is_read_like {
            let data = &o.read_buf;
            let cqe_size = w.hcas[hca].cqs.get(&send_cq).map_or(64, |c| c.cqe_size);
            let limit = if cqe_size == 128 { 64 } else { 32 };
            if req_scatter && o.signaled && data.len() <= limit {
                scatter_data = Some(data.clone());
            } else if let Err(s) = scatter(&o.local, data) {
                requester_error(w, hca, qpn, o.wqe_idx, o.opcode, s);
                return;
            }
        }
        if o.signaled {
            requester_ok(w, hca, qpn, o.wqe_idx, o.opcode, o.len, scatter_data);
        }
    }
}

/// The global route header a UD address vector asks for, from source GID `sgid`.
fn av_grh(av: &DatagramSeg, sgid: [u8; 16]) -> Box<Grh> {
    Box::new(Grh {
        tclass: av.tclass,
        flow_label: av.flow_label(),
        hop_limit: av.hop_limit,
        sgid,
        dgid: av.rgid,
    })
}

/// Whether response opcode `opcode` (not a plain ACK) is the kind that answers request `o`:
/// READ response packets answer a READ, an atomic acknowledge answers an atomic.
fn answers(o: &Outstanding, opcode: u8) -> bool {
    let read = o.opcode == SendOpcode::RDMA_READ.0;
    match opcode {
        op::RC_READ_RESPONSE_FIRST..=op::RC_READ_RESPONSE_ONLY => read,
        op::RC_ATOMIC_ACK => o.is_read_like && !read,
        _ => false,
    }
}

fn contains(o: &Outstanding, psn: u32) -> bool {
    !psn_before(psn, o.psn) && !psn_before(o.last_psn, psn)
}

/// Packets an RC requester may have in flight beyond the oldest unacknowledged PSN. Like
/// a real HCA's limit on outstanding packets, it keeps a go-back-N recovery of a multi-MiB
/// message from flooding the receiver (on UDP: its socket buffer).
const TX_WINDOW: u32 = 256;

/// Transmit the requester's pending packets, in PSN order, as far as the window allows.
fn pump(w: &mut World, hca: usize, qpn: u32) {
    let Some(q) = w.hcas[hca].qps.get_mut(&qpn) else {
        return;
    };
    let Some(mut next) = q.rc.tx_next else { return };
    let Some(base) = q.rc.outstanding.iter().find(|o| !o.done).map(|o| o.psn) else {
        q.rc.tx_next = None;
        return;
    };
    // The window starts after the highest acknowledged PSN when that is newer.
    let start = match q.rc.acked.map(|a| (a + 1) & 0xff_ffff) {
        Some(a) if psn_before(base, a) => a,
        _ => base,
    };
    let in_window = |psn: u32| psn.wrapping_sub(start) & 0xff_ffff < TX_WINDOW;
    let mut out = std::mem::take(&mut w.wire.tx);
    out.clear();
    let mut blocked = false;
    // The list is in PSN order: the entries that end before `next` (all but the newest,
    // usually) have nothing left to send; start after the last of them.
    let skip =
        q.rc.outstanding
            .iter()
            .rposition(|o| psn_before(o.last_psn, next))
            .map_or(0, |i| i + 1);
    'entries: for o in
        q.rc.outstanding
            .range(skip..)
            .filter(|o| !o.done && !o.packets.is_empty())
    {
        if o.is_read_like {
            // READ parts (or one atomic request) in order; the response PSNs are the span.
            // A later part goes out only once the previous part has fully arrived.
            for (k, p) in o.packets.iter().enumerate() {
                if psn_before(p.psn, next) {
                    continue;
                }
                if (k == 0 && !in_window(p.psn)) || (k > 0 && p.psn != o.read_next) {
                    blocked = true;
                    break 'entries;
                }
                out.push(p.clone());
                next = o
                    .packets
                    .get(k + 1)
                    .map_or((o.last_psn + 1) & 0xff_ffff, |n| n.psn);
            }
            continue;
        }
        for p in o.packets.iter() {
            if psn_before(p.psn, next) {
                continue;
            }
            if !in_window(p.psn) {
                blocked = true;
                break 'entries;
            }
            out.push(p.clone());
            next = (p.psn + 1) & 0xff_ffff;
        }
    }
    q.rc.tx_next = if blocked { Some(next) } else { None };
    for p in out.drain(..) {
        send_packet(w, p);
    }
    w.wire.tx = out;
}

/// Go back to `from`: everything unacknowledged from that PSN on is sent again (through
/// the window). A READ whose span reaches `from` is re-requested whole.
fn retransmit(w: &mut World, hca: usize, qpn: u32, from: u32) {
    let Some(q) = w.hcas[hca].qps.get_mut(&qpn) else {
        return;
    };
    let mut start = from;
    for o in q.rc.outstanding.iter_mut() {
        if o.done || psn_before(o.last_psn, from) || !o.is_read_like {
            continue;
        }
        let part = if o.packets.first().is_some_and(|p| p.atomic.is_some()) || o.read_mtu == 0 {
            // An atomic is asked again whole.
            o.read_buf.clear();
            o.read_next = o.psn;
            o.psn
        } else {
            // A READ resumes at its first missing response, as IB requesters do: a new
            // request with that PSN for the rest of the current part (the responder serves
            // it like a duplicate, from the adjusted address).
            let got = o.read_buf.len() as u64;
            let part_bytes = u64::from(TX_WINDOW) * u64::from(o.read_mtu);
            let k = (got / part_bytes) as usize;
            let end = ((k as u64 + 1) * part_bytes).min(u64::from(o.len));
            let read_next = o.read_next;
            if let Some(p) = o.packets.get_mut(k) {
                p.psn = read_next;
                if let Some(r) = p.reth.as_mut() {
                    r.va = o.read_va.wrapping_add(got);
                    r.len = (end - got) as u32;
                }
            }
            read_next
        };
        if psn_before(part, start) {
            start = part;
        }
    }
    q.rc.tx_next = Some(start);
    pump(w, hca, qpn);
}

fn run_timers(w: &mut World) -> usize {
    let now = w.now();
    let mut work = 0;
    for_each_qp(w, |w, hca, qpn| {
        let Some(q) = w.hcas[hca].qps.get_mut(&qpn) else {
            return;
        };
        if q.qp_type != qpt::RC || q.state != qps::RTS {
            return;
        }
        if let Some(t) = q.rc.rnr_wait_until.filter(|&t| t <= now) {
            let _ = t;
            q.rc.rnr_wait_until = None;
            q.rc.deadline = transport::ack_timeout_ns(q.timeout).map(|t| now + t);
            let from = q.rc.rnr_from;
            retransmit(w, hca, qpn, from);
            work += 1;
            return;
        }
        if q.rc.deadline.is_some_and(|d| d <= now) {
            work += 1;
            if q.rc.outstanding.iter().all(|o| o.done) {
                q.rc.deadline = None;
                return;
            }
            w.hcas[hca].counters.local_ack_timeout_err += 1;
            let q = w.hcas[hca].qps.get_mut(&qpn).expect("exists");
            if q.rc.retries_left == 0 {
                let front =
                    q.rc.outstanding
                        .iter()
                        .find(|o| !o.done)
                        .map(|o| (o.wqe_idx, o.opcode));
                if let Some((idx, opc)) = front {
                    retire(w, hca, qpn);
                    drop_outstanding_until(w, hca, qpn, idx);
                    requester_error(w, hca, qpn, idx, opc, Syndrome::TRANSPORT_RETRY_EXC);
                }
                return;
            }
            q.rc.retries_left -= 1;
            q.rc.deadline = transport::ack_timeout_ns(q.timeout).map(|t| now + t);
            let first =
                q.rc.outstanding
                    .iter()
                    .find(|o| !o.done)
                    .map_or(0, |o| o.psn);
            // Resume after the highest acknowledged PSN when that lies inside the message.
            let from = match q.rc.acked.map(|a| (a + 1) & 0xff_ffff) {
                Some(next) if psn_before(first, next) => next,
                _ => first,
            };
            retransmit(w, hca, qpn, from);
        }
    });
    work
}

pub(crate) fn next_deadline(w: &World) -> Option<u64> {
    let wire = w
        .wire
        .queue
        .iter()
        .map(|(t, _)| *t)
        .chain(w.outbox.iter().map(|o| o.due))
        .min();
    let timers = w
        .hcas
        .iter()
        .flat_map(|h| h.qps.values())
        .filter(|q| q.state == qps::RTS)
        .flat_map(|q| [q.rc.deadline, q.rc.rnr_wait_until])
        .flatten()
        .min();
    match (wire, timers) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

// ---------------------------------------------------------------------------------------
// Error state: flush

fn flush_qp(w: &mut World, hca: usize, qpn: u32) -> usize {
    let mut n = 0;
    // Outstanding requests first (they are older than anything still in the SQ).
    loop {
        let Some(q) = w.hcas[hca].qps.get_mut(&qpn) else {
            return n;
        };
        let Some(o) = q.rc.outstanding.pop_front() else {
            break;
        };
        flush_send(w, hca, qpn, o.wqe_idx, o.opcode);
        n += 1;
    }
    // Then every WQE rung on the SQ.
    for _ in 0..MAX_WQES_PER_QP_STEP {
        let Some(q) = w.hcas[hca].qps.get(&qpn) else {
            return n;
        };
        if (q.sq_head as u16) == q.sq_rung || q.sq_wqe_cnt == 0 {
            break;
        }
        let sq = q.buf + ((q.rq_wqe_cnt as u64) << q.rq_wqe_shift);
        let head = q.sq_head;
        let (bbs, opc) = match read_wqe(sq, q.sq_wqe_cnt, head, 16)
            .ok()
            .and_then(|b| CtrlSeg::read_from_bytes(&b).ok())
        {
            Some(c) => ((c.ds() as u32).div_ceil(4).max(1), c.opcode().0),
            None => (1, 0),
        };
        flush_send(w, hca, qpn, head as u16, opc);
        if let Some(q) = w.hcas[hca].qps.get_mut(&qpn) {
            q.sq_head = q.sq_head.wrapping_add(bbs);
        }
        n += 1;
    }
    // And every posted receive WQE (not SRQ WQEs: the SRQ is shared).
    for _ in 0..MAX_WQES_PER_QP_STEP {
        let Some(q) = w.hcas[hca].qps.get(&qpn) else {
            return n;
        };
        if q.srq.is_some() || q.rq_wqe_cnt == 0 {
            break;
        }
        let Ok(pi) = mem::read_be32(q.db) else { break };
        if (pi as u16) == (q.rq_head as u16) {
            break;
        }
        let ctr = q.rq_head as u16;
        if let Some(q) = w.hcas[hca].qps.get_mut(&qpn) {
            q.rq_head = q.rq_head.wrapping_add(1);
        }
        responder_error_cqe(
            w,
            hca,
            qpn,
            ctr,
            0,
            Syndrome::WR_FLUSH,
            VendorSyndrome::WR_FLUSH.0,
        );
        n += 1;
    }
    n
}

fn flush_send(w: &mut World, hca: usize, qpn: u32, idx: u16, opcode: u8) {
    req_err_cqe(w, hca, qpn, idx, opcode, Syndrome::WR_FLUSH);
}
