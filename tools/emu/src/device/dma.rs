//! DMA and translation: keys, PDs and access rights of registered memory; gather and
//! scatter.

// The stages share the device's imports and one another's `pub(super)` items (device/mod.rs).
use super::*;

/// Note a failed check (cold: error paths only).
#[cold]
pub(super) fn note_failed(
    w: &mut World,
    hca: usize,
    qpn: u32,
    side: &'static str,
    check: &'static str,
    detail: String,
) {
    if w.checks.failed.len() >= FAILED_CHECKS_KEPT {
        w.checks.failed.pop_front();
    }
    w.checks.failed.push_back(FailedCheck {
        hca,
        qpn,
        side,
        check,
        detail,
    });
}

/// Translate `[va, va+len)` under key `key` for a QP in PD `pdn`; `need` are the access
/// bits the MR must grant. Returns the process address, or which check failed.
pub(super) fn check_key(
    w: &World,
    hca: usize,
    key: u32,
    pdn: u32,
    va: u64,
    len: u64,
    need: u32,
) -> Result<u64, KeyFault> {
    let fault = match w.hcas[hca].mrs.get(&(key >> 8)) {
        None => KeyFault::Unknown { key },
        Some(mr) if mr.key != key => KeyFault::Unknown { key },
        Some(mr) if mr.pdn != pdn => KeyFault::Pd {
            key,
            mr_pdn: mr.pdn,
            qp_pdn: pdn,
        },
        Some(mr) if mr.access & need != need => KeyFault::Rights {
            key,
            have: mr.access,
            need,
        },
        Some(mr) => {
            let zero_based = mr.access & access::ZERO_BASED != 0;
            let base = if zero_based { 0 } else { mr.iova };
            let end = base.saturating_add(mr.length);
            match va.checked_sub(base) {
                Some(off) if off.checked_add(len).is_some_and(|e| e <= mr.length) => {
                    return match &mr.indirect {
                        None => Ok(mr.start + off),
                        Some(ind) => through_entries(w, hca, ind, pdn, off, len),
                    };
                }
                _ => KeyFault::Range {
                    key,
                    va,
                    len,
                    start: base,
                    end,
                },
            }
        }
    };
    w.checks.last.set(Some(fault));
    Err(fault)
}

/// Translate `[off, off+len)` of an indirect key's space (DEVX CREATE_MKEY, KLM or KSM)
/// through its entries into one process address. Each piece must lie inside its entry's
/// key, a direct key of the same PD (an entry naming an indirect key is refused: this device
/// nests no translations). When the pieces are not adjacent in process memory the access is
/// refused here as a range error, and the WRITE and READ responders, which can place and
/// gather a scatter list, take it again through [`indirect_pieces`].
#[cold]
fn through_entries(
    w: &World,
    hca: usize,
    ind: &crate::state::Indirect,
    pdn: u32,
    off: u64,
    len: u64,
) -> Result<u64, KeyFault> {
    let mut first: Option<u64> = None;
    let mut next = 0u64;
    entry_pieces(
        w,
        hca,
        ind,
        pdn,
        off,
        len,
        |key, va, a, piece| match first {
            Some(_) if a != next => Err(KeyFault::Range {
                key,
                va,
                len: piece,
                start: va,
                end: va.saturating_add(piece),
            }),
            _ => {
                first.get_or_insert(a);
                next = a.wrapping_add(piece);
                Ok(())
            }
        },
    )
    .inspect_err(|f| w.checks.last.set(Some(*f)))?;
    Ok(first.unwrap_or(0))
}

/// Walk `[off, off+len)` of an indirect key's space entry by entry, calling `each` with
/// (entry key, address under it, process address, bytes) for every piece. KSM finds the
/// first entry by a shift, KLM by a binary search over the entries' offsets.
fn entry_pieces(
    w: &World,
    hca: usize,
    ind: &crate::state::Indirect,
    pdn: u32,
    off: u64,
    len: u64,
    mut each: impl FnMut(u32, u64, u64, u64) -> Result<(), KeyFault>,
) -> Result<(), KeyFault> {
    let mut i = match ind.ksm_log {
        Some(log) => usize::try_from(off >> log).unwrap_or(usize::MAX),
        None => ind
            .entries
            .partition_point(|e| e.at <= off)
            .saturating_sub(1),
    };
    let (mut at, end) = (off, off.saturating_add(len));
    while at < end {
        let Some(e) = ind
            .entries
            .get(i)
            .filter(|e| at >= e.at && at - e.at < e.len)
        else {
            return Err(KeyFault::Range {
                key: 0,
                va: off,
                len,
                start: 0,
                end: ind.entries.last().map_or(0, |e| e.at.saturating_add(e.len)),
            });
        };
        let piece = (end - at).min(e.len - (at - e.at));
        let direct = w.hcas[hca]
            .mrs
            .get(&(e.key >> 8))
            .is_some_and(|m| m.key == e.key && m.indirect.is_none());
        if !direct {
            return Err(KeyFault::Unknown { key: e.key });
        }
        // The indirect key's own rights were checked; the entry's key only translates.
        let va = e.addr.wrapping_add(at - e.at);
        let a = check_key(w, hca, e.key, pdn, va, piece, 0)?;
        each(e.key, va, a, piece)?;
        at += piece;
        i += 1;
    }
    Ok(())
}

/// A remote access of `r` under an indirect key whose entries scatter it (the case
/// [`check_key`] refuses as a range error): the pieces in process memory, in order, after
/// every check [`remote_reth`] makes. None if the key is not indirect or any check fails
/// (the fault [`remote_reth`] found then stands).
#[cold]
pub(super) fn indirect_pieces(
    w: &World,
    hca: usize,
    pdn: u32,
    qacc: u32,
    r: Reth,
    need: u32,
) -> Option<Sgl> {
    let mr = w.hcas[hca].mrs.get(&(r.rkey >> 8))?;
    let ind = mr.indirect.as_ref()?;
    let len = u64::from(r.len);
    let base = if mr.access & access::ZERO_BASED != 0 {
        0
    } else {
        mr.iova
    };
    let off = r.va.checked_sub(base)?;
    let inside = off.checked_add(len).is_some_and(|e| e <= mr.length);
    if mr.key != r.rkey || mr.pdn != pdn || mr.access & need != need || qacc & need == 0 || !inside
    {
        return None;
    }
    let mut out = Sgl::default();
    let walked = entry_pieces(w, hca, ind, pdn, off, len, |_, _, a, piece| {
        // a piece lies inside one direct key: below 2^31 bytes, as `r.len` is
        out.push((a, piece as u32));
        Ok(())
    });
    walked.ok()?;
    w.checks.last.take();
    Some(out)
}

/// [`check_key`] without the reason.
pub(super) fn translate(
    w: &World,
    hca: usize,
    key: u32,
    pdn: u32,
    va: u64,
    len: u64,
    need: u32,
) -> Option<u64> {
    check_key(w, hca, key, pdn, va, len, need).ok()
}

/// A remote access by a peer: the MR checks of [`check_key`] plus the QP's own remote
/// access flags (`need` is one of REMOTE_READ, REMOTE_WRITE, REMOTE_ATOMIC).
#[allow(clippy::too_many_arguments)]
pub(super) fn remote(
    w: &World,
    hca: usize,
    pdn: u32,
    qacc: u32,
    rkey: u32,
    va: u64,
    len: u64,
    need: u32,
) -> Result<u64, KeyFault> {
    let a = check_key(w, hca, rkey, pdn, va, len, need)?;
    if qacc & need == 0 {
        let f = KeyFault::QpRights { have: qacc, need };
        w.checks.last.set(Some(f));
        return Err(f);
    }
    Ok(a)
}

/// [`remote`] for a RETH: a zero-length access needs no valid rkey (address 0).
pub(super) fn remote_reth(
    w: &World,
    hca: usize,
    pdn: u32,
    qacc: u32,
    r: Reth,
    need: u32,
) -> Result<u64, KeyFault> {
    if r.len == 0 {
        Ok(0)
    } else {
        remote(w, hca, pdn, qacc, r.rkey, r.va, u64::from(r.len), need)
    }
}

/// The vendor syndrome of a local protection error: `base` (0x50 gather list, 0x30 data
/// buffer) with the 3-bit detail of the key fault just found, taken (cleared); 0x51 (gather
/// list: PCIe error) / `base | 1` when no key check failed (the buffer was unreachable:
/// unmapped behind the device's back).
pub(super) fn take_tpt_vendor(w: &World, base: u8) -> u8 {
    match w.checks.last.take() {
        Some(f) => base | f.tpt_detail(),
        None => base | 1,
    }
}

/// Parse data segments (`segs`, a multiple of 16 bytes) into a translated list.
pub(super) fn data_segs(
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
pub(super) fn gather(sgl: &[(u64, u32)]) -> Result<Payload, Syndrome> {
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
pub(super) fn scatter(sgl: &[(u64, u32)], data: &[u8]) -> Result<(), Syndrome> {
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

/// Count (link counters) and trace the DMA writes of `len` bytes placed at byte `offset` of
/// `sgl` (one write per piece that lands in one segment); `head` are the first bytes placed.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn note_scatter(
    w: &mut World,
    hca: usize,
    qpn: u32,
    sgl: &[(u64, u32)],
    offset: u64,
    len: usize,
    head: &[u8],
    purpose: &'static str,
) {
    if w.trace.active() {
        note_scatter_on(w, hca, qpn, sgl, offset, len, head, purpose);
    }
}

#[cold]
#[allow(clippy::too_many_arguments)]
fn note_scatter_on(
    w: &mut World,
    hca: usize,
    qpn: u32,
    sgl: &[(u64, u32)],
    offset: u64,
    len: usize,
    head: &[u8],
    purpose: &'static str,
) {
    let mut pos = 0u64;
    let mut done = 0usize;
    for &(a, l) in sgl {
        let l = u64::from(l);
        let want = offset + done as u64;
        if done < len && want < pos + l {
            let inner = want - pos;
            let n = ((l - inner) as usize).min(len - done);
            note_write_on(
                w,
                hca,
                qpn,
                a + inner,
                n,
                head.get(done..).unwrap_or(&[]),
                purpose,
            );
            done += n;
        }
        pos += l;
        if done >= len {
            break;
        }
    }
}

/// Count and trace one DMA write of `len` bytes at process address `addr`.
#[inline(always)]
pub(super) fn note_write(
    w: &mut World,
    hca: usize,
    qpn: u32,
    addr: u64,
    len: usize,
    head: &[u8],
    purpose: &'static str,
) {
    if w.trace.active() {
        note_write_on(w, hca, qpn, addr, len, head, purpose);
    }
}

#[cold]
#[allow(clippy::too_many_arguments)]
fn note_write_on(
    w: &mut World,
    hca: usize,
    qpn: u32,
    addr: u64,
    len: usize,
    head: &[u8],
    purpose: &'static str,
) {
    crate::trace::dma_write(&mut w.hcas[hca].counters, addr, len as u64);
    if w.trace.on() {
        let now = w.now();
        w.trace.push(
            hca,
            now,
            "mlx5_emu::device::dma::scatter",
            crate::trace::TraceWhat::DmaWrite {
                qpn,
                addr,
                len: len as u32,
                purpose,
                head: head[..head.len().min(len).min(64)].to_vec(),
            },
        );
    }
}

/// Count and trace one payload DMA read of `len` bytes at process address `addr` (virtual
/// address `va` under `key`).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn note_read(
    w: &mut World,
    hca: usize,
    qpn: u32,
    addr: u64,
    va: u64,
    key: u32,
    len: u32,
    purpose: &'static str,
) {
    if w.trace.active() {
        note_read_on(w, hca, qpn, addr, va, key, len, purpose);
    }
}

#[cold]
#[allow(clippy::too_many_arguments)]
fn note_read_on(
    w: &mut World,
    hca: usize,
    qpn: u32,
    addr: u64,
    va: u64,
    key: u32,
    len: u32,
    purpose: &'static str,
) {
    let c = &mut w.hcas[hca].counters;
    crate::trace::dma_read(c, addr, u64::from(len));
    c.payload_reads += 1;
    c.payload_read_bytes += u64::from(len);
    if w.trace.on() {
        let now = w.now();
        w.trace.push(
            hca,
            now,
            "mlx5_emu::device::dma::gather",
            crate::trace::TraceWhat::DmaRead {
                qpn,
                va,
                len,
                key,
                purpose,
            },
        );
    }
}
