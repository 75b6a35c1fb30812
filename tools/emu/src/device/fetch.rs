//! Doorbell intake (send doorbells, BlueFlame copies, CQ arm), send-queue scheduling and
//! WQE fetch from the ring.

// The stages share the device's imports and one another's `pub(super)` items (device/mod.rs).
use super::*;

pub(super) enum Doorbell {
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
        pos: usize,
    },
}

/// The size of one BlueFlame buffer (half a register): the doorbell words of a UAR page
/// are at 0x800, 0x800 + half, ... while 8 bytes fit in the page.
pub(super) fn bf_half(bf_reg_size: u32) -> usize {
    if bf_reg_size >= 128 {
        (bf_reg_size / 2) as usize & !7
    } else {
        0x100
    }
}

pub(super) fn scan_doorbells(w: &mut World) -> usize {
    if crate::watch::noted() {
        take_notes(w);
    }
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
                        pos,
                    });
                }
                pos += half;
            }
        }
    }
    let n = found.len();
    let mut armed_ctx: Option<(usize, u64)> = None;
    for d in found {
        match d {
            Doorbell::Arm { hca, ctx, word } => {
                cq_arm(w, hca, ctx, word);
                if armed_ctx != Some((hca, ctx)) {
                    arms_from_records(w, hca, ctx);
                    armed_ctx = Some((hca, ctx));
                }
            }
            Doorbell::Send {
                hca,
                ctx,
                word,
                rest,
                pos,
            } => send_doorbell(w, hca, ctx, word, &rest, pos),
        }
    }
    n
}

pub(super) fn send_doorbell(
    w: &mut World,
    hca: usize,
    ctx: u64,
    word: u64,
    rest: &[u8],
    pos: usize,
) {
    // The 8 bytes are ctrl bytes 0..8 verbatim: BE32 opmod|idx|opcode, BE32 qpn|ds.
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&word.to_ne_bytes());
    let ctrl = CtrlSeg::read_from_bytes(&b).ok();
    let stepped = w.cfg.mode == RunMode::Stepped;
    if let Some(c) = &ctrl {
        w.wqe_log.doorbell(hca, c.qpn(), c.wqe_index(), rest);
    }
    // The MMIO write as it crossed the link: 8 bytes, or the BlueFlame copy (whole 64-byte
    // blocks of the WQE the doorbell word heads).
    let is_bf = rest.iter().any(|&x| x != 0);
    let mmio_len = match &ctrl {
        Some(c) if is_bf => (c.ds() as usize * 16)
            .next_multiple_of(64)
            .max(64)
            .min(rest.len() + 8),
        _ => 8,
    };
    if w.trace.active() {
        crate::trace::mmio(&mut w.hcas[hca].counters, mmio_len as u64);
    }
    if w.trace.on() {
        let mut bytes = word.to_ne_bytes().to_vec();
        bytes.extend_from_slice(&rest[..mmio_len - 8]);
        let now = w.now();
        w.trace.push(
            hca,
            now,
            "mlx5_emu::device::fetch::send_doorbell",
            crate::trace::TraceWhat::Mmio {
                qpn: ctrl.as_ref().map_or(0, |c| c.qpn()),
                offset: pos as u32,
                bytes,
                blueflame: is_bf,
            },
        );
    }
    let clock = tclock(w);
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
    qp.sq_rung = (pi & WQ_PI_MASK) as u16;
    let db = qp.db + 4;
    if w.trace.active() {
        crate::trace::dma_read(&mut h.counters, db, 4);
    }
    if w.trace.on() {
        w.trace.push(
            hca,
            clock,
            "mlx5_emu::device::fetch::send_doorbell",
            crate::trace::TraceWhat::DbrecRead {
                queue: "sq",
                num: qpn,
                addr: db,
                value: pi,
            },
        );
    }
    let bfreg = qp.bfreg;
    rung_shared_register(w, hca, ctx, qpn, bfreg);
    let h = &mut w.hcas[hca];
    let Some(qp) = h.qps.get_mut(&qpn) else {
        return;
    };
    if is_bf {
        h.counters.bf_writes += 1;
        if stepped && qp.sq_wqe_cnt > 0 {
            let len = (ctrl.ds() as usize * 16).min(rest.len() + 8);
            let ring = read_wqe(qp.sq_base, qp.sq_wqe_cnt, ctrl.wqe_index() as u32, len);
            let same = ring.is_ok_and(|r| len <= 8 || r[8..len] == rest[..len - 8]);
            if !same {
                h.counters.bf_mismatches += 1;
            }
        }
    }
}

pub(super) fn cq_arm(w: &mut World, hca: usize, ctx: u64, word: u64) {
    let b = word.to_ne_bytes();
    let arm = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    let cqn = u32::from_be_bytes([b[4], b[5], b[6], b[7]]) & CQ_CI_MASK;
    if w.trace.active() {
        crate::trace::mmio(&mut w.hcas[hca].counters, 8);
    }
    // The doorbell of an arm already taken from its record (`arms_from_records`) was counted
    // then.
    let mut taken = false;
    if let Some(c) = w.hcas[hca].cqs.get_mut(&cqn).filter(|c| c.ctx == ctx) {
        taken = c.arm_dbr_unrung && c.arm_dbr_seen == arm;
        c.arm_dbr_unrung = false;
    }
    if !taken {
        w.hcas[hca].counters.cq_arms += 1;
    }
    apply_arm(w, hca, ctx, cqn, arm);
}

/// The arms of CQs of context `ctx` whose doorbell a later arm overwrote: every CQ's arm
/// doorbell record is written just before its UAR doorbell (libmlx5's `mlx5_arm_cq`, our
/// driver's `req_notify`), and all of a context's CQs may ring the one CQ doorbell register of
/// a UAR page, so two arms between two scans leave only the second word there (on hardware
/// each 8-byte MMIO write is its own transaction). Run once per scan that found an arm word of
/// `ctx`: a CQ not armed whose record holds a value not yet taken is armed from it. A record
/// written before its doorbell is seen early, and the doorbell then repeats it (ignored as
/// already taken or already fired).
#[cold]
fn arms_from_records(w: &mut World, hca: usize, ctx: u64) {
    let pending: Vec<(u32, u32)> = w.hcas[hca]
        .cqs
        .iter()
        .filter(|(_, c)| c.ctx == ctx && c.armed.is_none() && !c.in_error)
        .filter_map(|(&cqn, c)| {
            let mut b = [0u8; 4];
            mem::read(c.db.wrapping_add(4), &mut b).ok()?;
            let v = u32::from_be_bytes(b);
            (v != c.arm_dbr_seen && v >> 30 == 0).then_some((cqn, v))
        })
        .collect();
    for (cqn, v) in pending {
        // an arm the application made, whose doorbell word was overwritten (or is yet to
        // land): counted here, once
        w.hcas[hca].counters.cq_arms += 1;
        apply_arm(w, hca, ctx, cqn, v);
        if let Some(c) = w.hcas[hca].cqs.get_mut(&cqn) {
            c.arm_dbr_unrung = true;
        }
    }
}

/// Arm CQ `cqn` of context `ctx` with the arm word `arm` (sequence number, solicited-only
/// flag, consumer index), from its doorbell or its doorbell record.
fn apply_arm(w: &mut World, hca: usize, ctx: u64, cqn: u32, arm: u32) {
    let Some(cq) = w.hcas[hca].cqs.get_mut(&cqn).filter(|c| c.ctx == ctx) else {
        return;
    };
    cq.arm_dbr_seen = arm;
    let (sn, solicited, ci) = mlx5_hw::doorbell::cq_arm_word_fields(arm);
    if cq.last_fired_sn == Some(sn) {
        return; // a repeat of the arm that already fired
    }
    cq.armed = Some(solicited);
    cq.armed_sn = sn;
    if !solicited && (cq.pi & CQ_CI_MASK) != ci {
        fire_event(w, hca, cqn);
    }
}

/// Read `len` bytes of the WQE starting at WQEBB counter `idx` of an SQ at `sq` with
/// `cnt` WQEBBs, following the wrap at the ring end.
pub(super) fn read_wqe(
    sq: u64,
    cnt: u32,
    idx: u32,
    len: usize,
) -> Result<Vec<u8>, crate::abi::Errno> {
    let mut out = Vec::with_capacity(len);
    read_wqe_into(sq, cnt, idx, len, &mut out)?;
    Ok(out)
}

/// [`read_wqe`], appending to `out`.
pub(super) fn read_wqe_into(
    sq: u64,
    cnt: u32,
    idx: u32,
    len: usize,
    out: &mut Vec<u8>,
) -> Result<(), crate::abi::Errno> {
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

pub(super) fn run_send_queues(w: &mut World) -> usize {
    let mut work = 0;
    for_each_qp(w, |w, hca, qpn| {
        let Some(q) = w.hcas[hca].qps.get(&qpn) else {
            return;
        };
        if q.state == qps::ERR {
            work += flush_qp(w, hca, qpn);
        } else if q.state == qps::SQE {
            work += flush_sq(w, hca, qpn);
        } else if q.state == qps::RTS && (q.sq_head as u16) != q.sq_rung {
            work += run_sq(w, hca, qpn);
        } else if q.state == qps::SQD && q.sqd_notify && q.rc.req.outstanding.is_empty() {
            let (ctx, uh) = (q.ctx, q.user_handle);
            if let Some(q) = w.hcas[hca].qps.get_mut(&qpn) {
                q.sqd_notify = false;
            }
            w.async_event(ctx, uh, ev::SQ_DRAINED, EvObj::Qp(hca, qpn));
            work += 1;
        }
    });
    work
}

/// Outcome of looking at one send WQE.
pub(super) enum Exec {
    /// Executed; advance by this many WQEBBs.
    Done(u32),
    /// Must wait (fence, outstanding-read limit).
    Blocked,
}

/// The rung part of a send queue, fetched with one or two DMA reads up front (as hardware
/// prefetches WQEs after a doorbell) instead of one read per WQEBB.
pub(super) struct Prefetch {
    /// WQEBB counter of the first fetched WQEBB.
    pub(super) start: u32,
    /// The send ring it was fetched from: (process address, WQEBBs).
    pub(super) ring: (u64, u32),
    /// The fetched WQEBBs, 64 bytes each.
    pub(super) data: Vec<u8>,
}

impl Prefetch {
    /// Fetch the WQEBBs from `sq_head` up to the producer index of the last doorbell
    /// (at most one ring and `MAX_WQES_PER_QP_STEP` of them) into `data` (a reused
    /// buffer, returned in `Err` when nothing is fetched). Err if nothing is rung or a read
    /// fails; the WQEs are then read one by one, with per-WQE error handling.
    pub(super) fn fetch(q: &crate::state::Qp, mut data: Vec<u8>) -> Result<Prefetch, Vec<u8>> {
        let cnt = q.sq_wqe_cnt;
        let rung = u32::from(q.sq_rung.wrapping_sub(q.sq_head as u16));
        let n = rung.min(cnt).min(MAX_WQES_PER_QP_STEP as u32);
        if cnt == 0 || n == 0 {
            return Err(data);
        }
        let sq = q.sq_base;
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
            ring: (sq, cnt),
            data,
        })
    }

    /// `len` bytes from WQEBB counter `idx`, if all of them were fetched.
    pub(super) fn get(&self, idx: u32, len: usize) -> Option<&[u8]> {
        let off = idx.wrapping_sub(self.start) as usize * 64;
        self.data.get(off..off.checked_add(len)?)
    }
}

/// Count (link counters) and trace the DMA read of `len` send-ring bytes from WQEBB
/// counter `start` of QP `qpn`'s ring at `sq` (`cnt` WQEBBs): one read per contiguous piece
/// (two when it wraps at the ring end). `bytes` are what was read (at most `len`; for the
/// trace).
#[inline(always)]
pub(super) fn note_fetch(
    w: &mut World,
    hca: usize,
    qpn: u32,
    ring: (u64, u32),
    start: u32,
    len: usize,
    bytes: &[u8],
) {
    if w.trace.active() {
        note_fetch_on(w, hca, qpn, ring, start, len, bytes);
    }
}

#[cold]
fn note_fetch_on(
    w: &mut World,
    hca: usize,
    qpn: u32,
    (sq, cnt): (u64, u32),
    start: u32,
    len: usize,
    bytes: &[u8],
) {
    if cnt == 0 {
        return;
    }
    let mut done = 0usize;
    let mut at = start;
    while done < len {
        let slot = at & (cnt - 1);
        let n = (len - done).min((cnt - slot) as usize * 64);
        let addr = sq + u64::from(slot) * 64;
        let c = &mut w.hcas[hca].counters;
        crate::trace::dma_read(c, addr, n as u64);
        c.wqe_fetches += 1;
        c.wqe_fetch_bytes += n as u64;
        if w.trace.on() {
            let now = w.now();
            w.trace.push(
                hca,
                now,
                "mlx5_emu::device::fetch::run_sq",
                crate::trace::TraceWhat::WqeFetch {
                    qpn,
                    wqe_index: at,
                    addr,
                    bytes: bytes
                        .get(done..(done + n).min(bytes.len()))
                        .unwrap_or(&[])
                        .to_vec(),
                },
            );
        }
        done += n;
        at = at.wrapping_add(n.div_ceil(64) as u32);
    }
}

pub(super) fn run_sq(w: &mut World, hca: usize, qpn: u32) -> usize {
    let buf = std::mem::take(&mut w.wire.prefetch);
    let pf = match w.hcas[hca].qps.get(&qpn) {
        Some(q) => Prefetch::fetch(q, buf),
        None => Err(buf),
    };
    if let Ok(p) = &pf {
        note_fetch(w, hca, qpn, p.ring, p.start, p.data.len(), &p.data);
    }
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

/// A doorbell seen on a *shared* register (a medium-latency bfreg, or bfreg 0, used by
/// several QPs of the context): the doorbell of another QP on that register may have been
/// overwritten by this one between two scans (UAR memory keeps only the last value, where a
/// real MMIO write is never lost). So every other QP bound to the register whose doorbell
/// record has moved past what it was rung to is taken as rung too. A deviation from the
/// hardware, limited to QPs that share a register with one whose doorbell was just written:
/// such a QP may run a WQE it published only in its doorbell record. Not counted in
/// `doorbells` (that counts the doorbell words seen).
pub(super) fn rung_shared_register(w: &mut World, hca: usize, ctx: u64, qpn: u32, bfreg: u32) {
    let shared = w
        .contexts
        .get(&ctx)
        .and_then(|c| c.bfreg_users.get(bfreg as usize))
        .is_some_and(|&n| n > 1)
        || bfreg & crate::uar::DEVX_UAR_BFREG != 0 && bfreg != u32::MAX;
    if !shared {
        return;
    }
    for (&n, q) in w.hcas[hca].qps.iter_mut() {
        if n == qpn || q.ctx != ctx || q.bfreg != bfreg {
            continue;
        }
        if let Ok(pi) = crate::mem::read_be32(q.db + 4) {
            q.sq_rung = (pi & mlx5_hw::doorbell::WQ_PI_MASK) as u16;
        }
    }
}

/// Lending (`watch.rs`): a thread whose doorbell store faulted waits in the fault handler,
/// its store not landed yet, for the device, which runs on the CPU it leaves. The note says
/// which 64-byte block of which page the store was for; a store to a send register is the
/// doorbell being written, and the driver writes the doorbell record before it, so every QP
/// bound to that register is taken as rung up to its doorbell record (as for a shared
/// register, `rung_shared_register`). The doorbell word itself is counted when it lands.
/// The notes' slots are acknowledged at the end of the step (`device::step`), once the WQEs
/// have run and their packets left.
fn take_notes(w: &mut World) {
    let reg = 2 * bf_half(w.cfg.bf_reg_size);
    let mut acks = std::mem::take(&mut w.wire.acks);
    // (hca, ctx, page, register) of each noted send register.
    let mut rung: Vec<(usize, u64, usize, usize)> = Vec::new();
    for (&ctx, c) in &w.contexts {
        for &page in &c.uar_active {
            let bits = crate::watch::take_rung(c.uar.dev_addr(page), &mut acks);
            for i in (0..64).filter(|i| bits & 1 << i != 0) {
                let off = i * 64;
                if off >= 0x800 {
                    rung.push((c.hca, ctx, page, (off - 0x800) / reg));
                }
            }
        }
    }
    w.wire.acks = acks;
    for (hca, ctx, page, k) in rung {
        let Some(c) = w.contexts.get(&ctx) else {
            continue;
        };
        // The bfreg values that ring this register: a static bfreg (two per page), or a
        // DEVX UAR by its page id.
        let fixed = (page < c.uar_pages).then_some((page * 2 + k) as u32);
        let devx = c
            .dyn_pages
            .iter()
            .find(|(_, d)| d.0 == page)
            .map(|(&id, _)| crate::uar::DEVX_UAR_BFREG | id);
        for q in w.hcas[hca].qps.values_mut() {
            if q.ctx != ctx || !(Some(q.bfreg) == fixed || Some(q.bfreg) == devx) {
                continue;
            }
            if let Ok(pi) = mem::read_be32(q.db + 4) {
                q.sq_rung = (pi & WQ_PI_MASK) as u16;
            }
        }
    }
}
