//! Human-readable decoder of one WQE (diagnostics): walks the control segment and the segments
//! that follow it for the given queue kind and prints every field.

use super::{
    AtomicSeg, CtrlSeg, DS_SIZE, DataSeg, DatagramSeg, INLINE_SEG_FLAG, InlineHdr, MaskedCs32Seg,
    MaskedCs64Seg, MaskedFa32Seg, MaskedFa64Seg, RaddrSeg, SrqNextSeg, inline_ds,
};
use crate::opcodes::{OPMOD_MASKED_ATOMIC_8B, SendOpcode};
use core::fmt;
use zerocopy::FromBytes;

/// Which queue a WQE belongs to; decides which segments follow the control segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WqeKind {
    /// RC send queue.
    Rc,
    /// UC send queue.
    Uc,
    /// UD send queue (address vector after ctrl).
    Ud,
    /// SRQ receive WQE (next segment, then data segments).
    SrqRecv,
    /// Plain RQ receive WQE (data segments only).
    RqRecv,
}

/// A WQE as raw bytes plus its kind; `Display` walks and prints every segment and field.
/// Bytes must be linear (copy a WQE that wraps the ring end into one buffer first). A send
/// WQE is decoded up to `ds * 16` bytes; a receive WQE up to the first terminator or the end
/// of `bytes`. Short or inconsistent input is reported in the output, never a panic.
#[derive(Clone, Copy, Debug)]
pub struct WqeView<'a> {
    bytes: &'a [u8],
    kind: WqeKind,
}

impl<'a> WqeView<'a> {
    /// View `bytes` as an RC send WQE.
    pub fn new(bytes: &'a [u8]) -> Self {
        Self {
            bytes,
            kind: WqeKind::Rc,
        }
    }
    /// View `bytes` as a WQE of `kind`.
    pub fn with_kind(bytes: &'a [u8], kind: WqeKind) -> Self {
        Self { bytes, kind }
    }
}

/// Read a `T` at `off` from `b`, if it fits.
fn at<T: FromBytes>(b: &[u8], off: usize) -> Option<T> {
    b.get(off..)
        .and_then(|rest| T::read_from_prefix(rest).ok())
        .map(|(v, _)| v)
}

fn hex(f: &mut fmt::Formatter<'_>, bytes: &[u8]) -> fmt::Result {
    for b in bytes {
        write!(f, "{b:02x}")?;
    }
    Ok(())
}

impl fmt::Display for CtrlSeg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ctrl: opcode={:?} opmod={:#04x} wqe_index={:#06x} qpn={:#08x} ds={} signature={:#04x} \
             dci_stream_channel_id={:#06x} fm_ce_se={:#04x} (fence_mode={} ce={} se={}) imm={:#010x}",
            self.opcode(),
            self.opmod(),
            self.wqe_index(),
            self.qpn(),
            self.ds(),
            self.signature,
            self.dci_stream_channel_id.get(),
            self.fm_ce_se,
            self.fence_mode(),
            self.ce(),
            u8::from(self.solicited()),
            self.imm(),
        )
    }
}

impl fmt::Display for RaddrSeg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "raddr: raddr={:#018x} rkey={:#010x} reserved={:#010x}",
            self.raddr(),
            self.rkey(),
            self.reserved.get()
        )
    }
}

impl fmt::Display for AtomicSeg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "atomic: swap_add={:#018x} compare={:#018x}",
            self.swap_add(),
            self.compare()
        )
    }
}

impl fmt::Display for MaskedCs32Seg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "masked_cs32: swap={:#010x} compare={:#010x} swap_mask={:#010x} compare_mask={:#010x}",
            self.swap.get(),
            self.compare.get(),
            self.swap_mask.get(),
            self.compare_mask.get()
        )
    }
}

impl fmt::Display for MaskedCs64Seg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "masked_cs64: swap={:#018x} compare={:#018x} swap_mask={:#018x} compare_mask={:#018x}",
            self.swap.get(),
            self.compare.get(),
            self.swap_mask.get(),
            self.compare_mask.get()
        )
    }
}

impl fmt::Display for MaskedFa32Seg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "masked_fa32: add={:#010x} field_boundary={:#010x}",
            self.add.get(),
            self.field_boundary.get()
        )
    }
}

impl fmt::Display for MaskedFa64Seg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "masked_fa64: add={:#018x} field_boundary={:#018x}",
            self.add.get(),
            self.field_boundary.get()
        )
    }
}

impl fmt::Display for DataSeg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "data: byte_count={:#x} lkey={:#010x} addr={:#018x}",
            self.byte_count(),
            self.lkey(),
            self.addr()
        )?;
        if self.is_terminator() {
            f.write_str(" (terminator)")?;
        }
        Ok(())
    }
}

impl fmt::Display for DatagramSeg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "av: key={:#018x} (qkey={:#010x}) dqp_dct={:#010x} (extended={} dqpn={:#08x}) stat_rate_sl={:#04x} \
             fl_mlid={:#04x} rlid={:#06x} rmac=",
            self.key.get(),
            self.qkey(),
            self.dqp_dct.get(),
            u8::from(self.extended()),
            self.dqpn(),
            self.stat_rate_sl,
            self.fl_mlid,
            self.rlid(),
        )?;
        for (i, b) in self.rmac.iter().enumerate() {
            write!(f, "{}{b:02x}", if i == 0 { "" } else { ":" })?;
        }
        write!(
            f,
            " tclass={:#04x} hop_limit={} grh_gid_fl={:#010x} (grh={} sgid_index={} flow_label={:#x}) rgid=",
            self.tclass,
            self.hop_limit,
            self.grh_gid_fl.get(),
            u8::from(self.grh()),
            self.sgid_index(),
            self.flow_label(),
        )?;
        hex(f, &self.rgid)
    }
}

impl fmt::Display for SrqNextSeg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "srq_next: next_wqe_index={:#06x} signature={:#04x}",
            self.next_wqe_index(),
            self.signature
        )
    }
}

/// Write one decoded segment line, or report truncation; returns false if it did not fit.
fn seg<T: FromBytes + fmt::Display>(
    f: &mut fmt::Formatter<'_>,
    b: &[u8],
    off: usize,
) -> Result<bool, fmt::Error> {
    match at::<T>(b, off) {
        Some(s) => {
            writeln!(f, "  +{off:#05x} {s}")?;
            Ok(true)
        }
        None => {
            writeln!(
                f,
                "  +{off:#05x} <truncated: {} bytes left>",
                b.len().saturating_sub(off)
            )?;
            Ok(false)
        }
    }
}

/// Print data / inline segments from `off` to `end`; `recv` stops after a terminator.
fn data_segs(
    f: &mut fmt::Formatter<'_>,
    b: &[u8],
    mut off: usize,
    end: usize,
    recv: bool,
) -> fmt::Result {
    while off < end {
        let Some(word) = at::<crate::types::Be32>(b, off) else {
            return writeln!(f, "  +{off:#05x} <truncated>");
        };
        if !recv && word.get() & INLINE_SEG_FLAG != 0 {
            let hdr = InlineHdr { byte_count: word };
            let len = hdr.len() as usize;
            let avail = b.len().min(end).saturating_sub(off + 4);
            write!(
                f,
                "  +{off:#05x} inline: byte_count={:#010x} (len={len}) payload=",
                word.get()
            )?;
            hex(f, &b[off + 4..off + 4 + len.min(avail)])?;
            if len > avail {
                write!(f, " <truncated: {} of {len} bytes>", avail)?;
            }
            writeln!(f)?;
            off += inline_ds(hdr.len()) as usize * DS_SIZE;
        } else {
            let Some(d) = at::<DataSeg>(b, off) else {
                return writeln!(
                    f,
                    "  +{off:#05x} <truncated: {} bytes left>",
                    b.len().saturating_sub(off)
                );
            };
            writeln!(f, "  +{off:#05x} {d}")?;
            off += DS_SIZE;
            if recv && d.is_terminator() {
                break;
            }
        }
    }
    Ok(())
}

impl fmt::Display for WqeView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.bytes;
        writeln!(f, "{:?} WQE ({} bytes)", self.kind, b.len())?;
        match self.kind {
            WqeKind::RqRecv => return data_segs(f, b, 0, b.len(), true),
            WqeKind::SrqRecv => {
                if !seg::<SrqNextSeg>(f, b, 0)? {
                    return Ok(());
                }
                return data_segs(f, b, DS_SIZE, b.len(), true);
            }
            WqeKind::Rc | WqeKind::Uc | WqeKind::Ud => {}
        }
        let Some(ctrl) = at::<CtrlSeg>(b, 0) else {
            return writeln!(f, "  <truncated: no control segment>");
        };
        writeln!(f, "  +0x000 {ctrl}")?;
        let end = usize::from(ctrl.ds()) * DS_SIZE;
        if end > b.len() {
            writeln!(
                f,
                "  <ds={} says {end} bytes, only {} present>",
                ctrl.ds(),
                b.len()
            )?;
        }
        let mut off = DS_SIZE;
        if self.kind == WqeKind::Ud {
            if !seg::<DatagramSeg>(f, b, off)? {
                return Ok(());
            }
            off += size_of::<DatagramSeg>();
        }
        let op = ctrl.opcode();
        let wide = ctrl.opmod() == OPMOD_MASKED_ATOMIC_8B;
        let remote = op.has_raddr();
        if remote {
            if !seg::<RaddrSeg>(f, b, off)? {
                return Ok(());
            }
            off += size_of::<RaddrSeg>();
        }
        let fitted = match op {
            SendOpcode::ATOMIC_CS | SendOpcode::ATOMIC_FA => {
                Some((seg::<AtomicSeg>(f, b, off)?, 16))
            }
            SendOpcode::ATOMIC_MASKED_CS if wide => Some((seg::<MaskedCs64Seg>(f, b, off)?, 32)),
            SendOpcode::ATOMIC_MASKED_CS => Some((seg::<MaskedCs32Seg>(f, b, off)?, 16)),
            SendOpcode::ATOMIC_MASKED_FA if wide => Some((seg::<MaskedFa64Seg>(f, b, off)?, 16)),
            SendOpcode::ATOMIC_MASKED_FA => Some((seg::<MaskedFa32Seg>(f, b, off)?, 16)),
            _ => None,
        };
        match fitted {
            Some((false, _)) => return Ok(()),
            Some((true, len)) => off += len,
            None => {}
        }
        data_segs(f, b, off, end, false)
    }
}
