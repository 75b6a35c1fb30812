//! Recording of the send WQEs the device fetches, for WQE-level comparisons of two drivers
//! (tools/wqe-compare: libmlx5 through the preload vs. the `mlx5` crate).
//!
//! When recording is on, every send WQE the device executes is recorded once, at the moment
//! it is fetched for execution: HCA, QPN, its WQE index (ctrl bytes 1..3), how the device
//! learned about it ([`WqeVia`]) and its full `ds * 16` bytes, joined across the SQ ring end.
//! Records go to memory ([`Emulator::record_wqes`], read with [`Emulator::wqe_log`]) or, one
//! text line per WQE ([`WqeRecord::to_line`]), to a file ([`Emulator::log_wqes_to`]; the
//! preload maps `MLX5_EMU_WQE_LOG=path` to it). Off by default: then the hooks cost one
//! branch.
//!
//! A device may fetch a WQE through the doorbell record before it has looked at the MMIO
//! write that announces it (the producer index in the record already covers it when an
//! earlier doorbell is processed). Such a WQE is first recorded as [`WqeVia::Batch`]; when
//! its own doorbell shows up later, the record is corrected (in memory), or a
//! `late hca=.. qpn=.. idx=.. via=..` line is appended (file; [`WqeRecord::parse_log`] applies it).

use std::collections::{BTreeMap, VecDeque};
use std::io::Write;

/// How the device learned about a WQE.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WqeVia {
    /// A doorbell naming this WQE came with a BlueFlame copy of it.
    BlueFlame,
    /// An 8-byte doorbell named this WQE.
    Doorbell,
    /// No MMIO named it: it was fetched from the ring because a doorbell named a later WQE
    /// (an earlier WR of a posted chain).
    Batch,
}

impl WqeVia {
    /// Short name used in log lines: `bf`, `db`, `batch`.
    pub fn name(self) -> &'static str {
        match self {
            WqeVia::BlueFlame => "bf",
            WqeVia::Doorbell => "db",
            WqeVia::Batch => "batch",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "bf" => WqeVia::BlueFlame,
            "db" => WqeVia::Doorbell,
            "batch" => WqeVia::Batch,
            _ => return None,
        })
    }
}

/// One fetched send WQE.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WqeRecord {
    /// HCA index within the emulator.
    pub hca: usize,
    /// QP number (the SQ's QP).
    pub qpn: u32,
    /// The WQE index of its first WQEBB (free-running counter, low 16 bits).
    pub wqe_index: u16,
    /// Doorbell, BlueFlame or part of a batch.
    pub via: WqeVia,
    /// The `ds * 16` bytes as the device read them, ring wrap joined.
    pub bytes: Vec<u8>,
}

impl WqeRecord {
    /// The log line (no newline): `hca=0 qpn=0x070001 idx=5 via=bf len=48 <hex bytes>`.
    pub fn to_line(&self) -> String {
        let mut s = format!(
            "hca={} qpn={:#08x} idx={} via={} len={} ",
            self.hca,
            self.qpn,
            self.wqe_index,
            self.via.name(),
            self.bytes.len()
        );
        for b in &self.bytes {
            s.push_str(&format!("{b:02x}"));
        }
        s
    }

    /// Parse a whole log file: record lines ([`to_line`](Self::to_line)) and `late` lines
    /// (a doorbell that named an already fetched WQE: corrects the `via` of the latest
    /// record of that QP and index).
    ///
    /// # Errors
    /// The first malformed line (1-based number and text).
    pub fn parse_log(text: &str) -> Result<Vec<WqeRecord>, String> {
        let mut out: Vec<WqeRecord> = Vec::new();
        for (n, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let bad = || format!("WQE log line {}: malformed: {line}", n + 1);
            if let Some(rest) = line.strip_prefix("late ") {
                let (hca, qpn, idx, via) = parse_late(rest).ok_or_else(bad)?;
                if let Some(r) = out
                    .iter_mut()
                    .rev()
                    .find(|r| r.hca == hca && r.qpn == qpn && r.wqe_index == idx)
                {
                    r.via = via;
                }
            } else {
                out.push(Self::parse_line(line).ok_or_else(bad)?);
            }
        }
        Ok(out)
    }

    /// Parse a line written by [`to_line`](Self::to_line); `None` if it is malformed.
    pub fn parse_line(line: &str) -> Option<Self> {
        let mut it = line.split_ascii_whitespace();
        let mut field = |name: &str| it.next()?.strip_prefix(name).map(str::to_owned);
        let hca = field("hca=")?.parse().ok()?;
        let qpn = u32::from_str_radix(field("qpn=")?.strip_prefix("0x")?, 16).ok()?;
        let wqe_index = field("idx=")?.parse().ok()?;
        let via = WqeVia::parse(&field("via=")?)?;
        let len: usize = field("len=")?.parse().ok()?;
        let hex = it.next().unwrap_or("");
        if hex.len() != 2 * len || it.next().is_some() {
            return None;
        }
        let bytes = (0..len)
            .map(|i| u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok())
            .collect::<Option<Vec<u8>>>()?;
        Some(Self {
            hca,
            qpn,
            wqe_index,
            via,
            bytes,
        })
    }
}

/// `hca=.. qpn=0x.. idx=.. via=..` of a `late` line.
fn parse_late(rest: &str) -> Option<(usize, u32, u16, WqeVia)> {
    let mut it = rest.split_ascii_whitespace();
    let mut field = |name: &str| it.next()?.strip_prefix(name).map(str::to_owned);
    let hca = field("hca=")?.parse().ok()?;
    let qpn = u32::from_str_radix(field("qpn=")?.strip_prefix("0x")?, 16).ok()?;
    let idx = field("idx=")?.parse().ok()?;
    let via = WqeVia::parse(&field("via=")?)?;
    Some((hca, qpn, idx, via))
}

/// Doorbells remembered per QP until the WQE they name is fetched, and WQEs fetched as
/// batch members remembered for a late doorbell (both bounded).
const MAX_PENDING: usize = 64;

/// A doorbell not yet matched with its WQE: the WQE index it names and the BlueFlame bytes
/// that followed the doorbell word.
type Rung = (u16, Vec<u8>);

/// The recorder, part of the world (behind the emulator lock).
#[derive(Debug, Default)]
pub(crate) struct Recorder {
    pub(crate) memory: bool,
    pub(crate) records: Vec<WqeRecord>,
    pub(crate) file: Option<std::fs::File>,
    /// Per (hca, qpn): WQE indices named by doorbells not yet fetched, with the bytes that
    /// followed the doorbell word in the BlueFlame half (all zero for an 8-byte doorbell).
    pub(crate) rung: BTreeMap<(usize, u32), VecDeque<Rung>>,
    /// Recently fetched WQEs recorded as [`WqeVia::Batch`]: (hca, qpn, index, bytes).
    pub(crate) batch: VecDeque<(usize, u32, u16, Vec<u8>)>,
}

/// Whether the bytes found after a doorbell word (`rest`, the BlueFlame half from byte 8)
/// are a BlueFlame copy of `wqe`. The device samples the half while the CPU may still be
/// writing it, so it can see a copy only partly (its other bytes still zero) or leftovers of
/// an earlier, partly sampled copy (bytes of another WQE). So: BlueFlame if some byte is
/// non-zero and every non-zero byte within the WQE's length equals the WQE's byte there.
fn classify(rest: &[u8], wqe: &[u8]) -> WqeVia {
    let body = wqe.get(8..).unwrap_or(&[]);
    let n = rest.len().min(body.len());
    let any = rest[..n].iter().any(|&x| x != 0);
    let consistent = rest[..n]
        .iter()
        .zip(&body[..n])
        .all(|(&r, &w)| r == 0 || r == w);
    if any && consistent {
        WqeVia::BlueFlame
    } else {
        WqeVia::Doorbell
    }
}

impl Recorder {
    fn on(&self) -> bool {
        self.memory || self.file.is_some()
    }

    /// Hook: a send doorbell naming WQE `idx` of `qpn` was consumed; `rest` is what followed
    /// the doorbell word in its BlueFlame half (empty without BlueFlame).
    pub(crate) fn doorbell(&mut self, hca: usize, qpn: u32, idx: u16, rest: &[u8]) {
        if !self.on() {
            return;
        }
        let hit = self
            .batch
            .iter()
            .position(|(h, q, i, _)| (*h, *q, *i) == (hca, qpn, idx));
        if let Some(pos) = hit {
            // Already fetched through the doorbell record: correct its record.
            let (.., bytes) = self.batch.remove(pos).unwrap_or_default();
            let via = classify(rest, &bytes);
            if let Some(r) = self
                .records
                .iter_mut()
                .rev()
                .find(|r| r.hca == hca && r.qpn == qpn && r.wqe_index == idx)
            {
                r.via = via;
            }
            let line = format!(
                "late hca={hca} qpn={qpn:#08x} idx={idx} via={}\n",
                via.name()
            );
            self.write(&line);
            return;
        }
        let q = self.rung.entry((hca, qpn)).or_default();
        if q.len() >= MAX_PENDING {
            q.pop_front();
        }
        q.push_back((idx, rest.to_vec()));
    }

    /// Hook: WQE `idx` of `qpn` was fetched for execution with these `ds * 16` bytes.
    pub(crate) fn fetched(&mut self, hca: usize, qpn: u32, idx: u16, bytes: &[u8]) {
        if !self.on() {
            return;
        }
        let mut via = WqeVia::Batch;
        if let Some(q) = self.rung.get_mut(&(hca, qpn)) {
            if let Some(pos) = q.iter().position(|(i, _)| *i == idx) {
                via = classify(&q[pos].1, bytes);
                // This doorbell and any older ones are consumed.
                q.drain(..=pos);
            }
        }
        let rec = WqeRecord {
            hca,
            qpn,
            wqe_index: idx,
            via,
            bytes: bytes.to_vec(),
        };
        if via == WqeVia::Batch {
            if self.batch.len() >= MAX_PENDING {
                self.batch.pop_front();
            }
            self.batch.push_back((hca, qpn, idx, bytes.to_vec()));
        }
        let mut line = rec.to_line();
        line.push('\n');
        self.write(&line);
        if self.memory {
            self.records.push(rec);
        }
    }

    /// Append `line` to the log file, if any. One write per line, so a process that never
    /// drops the emulator (the preload) still leaves complete lines. A failing log file
    /// stops logging, not the device.
    fn write(&mut self, line: &str) {
        if let Some(f) = self.file.as_mut() {
            if f.write_all(line.as_bytes()).is_err() {
                self.file = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_round_trips_and_rejects_garbage() {
        let r = WqeRecord {
            hca: 1,
            qpn: 0x07_0003,
            wqe_index: 65535,
            via: WqeVia::Batch,
            bytes: (0..48u8).collect(),
        };
        let line = r.to_line();
        assert!(line.starts_with("hca=1 qpn=0x070003 idx=65535 via=batch len=48 000102"));
        assert_eq!(WqeRecord::parse_line(&line), Some(r));
        assert_eq!(
            WqeRecord::parse_line("hca=1 qpn=0x1 idx=0 via=bf len=2 00"),
            None
        );
        assert_eq!(
            WqeRecord::parse_line("hca=1 qpn=0x1 idx=0 via=xx len=0"),
            None
        );
        let log = format!("{line}\nlate hca=1 qpn=0x070003 idx=65535 via=bf\n");
        let recs = WqeRecord::parse_log(&log).unwrap();
        assert_eq!(recs.len(), 1);
        assert_eq!(recs[0].via, WqeVia::BlueFlame);
        assert!(WqeRecord::parse_log("late hca=1 qpn=0x1").is_err());
    }

    #[test]
    fn via_follows_the_doorbells() {
        let mut r = Recorder {
            memory: true,
            ..Recorder::default()
        };
        r.doorbell(0, 9, 4, &[0; 248]);
        r.fetched(0, 9, 0, &[1; 16]); // earlier WR of the chain rung at 4
        r.fetched(0, 9, 4, &[2; 16]);
        r.doorbell(0, 9, 5, &[3; 24]);
        r.fetched(0, 9, 5, &[3; 32]);
        let via: Vec<WqeVia> = r.records.iter().map(|x| x.via).collect();
        assert_eq!(via, [WqeVia::Batch, WqeVia::Doorbell, WqeVia::BlueFlame]);
        assert!(r.rung[&(0, 9)].is_empty());
        // Fetched through the doorbell record before its own BlueFlame write was seen:
        // corrected when that write shows up.
        r.fetched(0, 9, 7, &[4; 32]);
        assert_eq!(r.records[3].via, WqeVia::Batch);
        r.doorbell(0, 9, 7, &[4; 24]);
        assert_eq!(r.records[3].via, WqeVia::BlueFlame);
        assert!(r.rung[&(0, 9)].is_empty());
        // A BlueFlame copy seen only partly is still BlueFlame; leftovers of another WQE
        // in the half make an 8-byte doorbell, not BlueFlame.
        let mut partial = [0u8; 56];
        partial[0..8].copy_from_slice(&[5; 8]);
        r.doorbell(0, 9, 8, &partial);
        r.fetched(0, 9, 8, &[5; 64]);
        let mut stale = [0u8; 56];
        stale[40..48].copy_from_slice(&[9; 8]);
        r.doorbell(0, 9, 9, &stale);
        r.fetched(0, 9, 9, &[6; 64]);
        assert_eq!(r.records[4].via, WqeVia::BlueFlame);
        assert_eq!(r.records[5].via, WqeVia::Doorbell);
        // Off: nothing is kept.
        let mut off = Recorder::default();
        off.doorbell(0, 9, 1, &[1; 8]);
        off.fetched(0, 9, 1, &[0; 16]);
        assert!(off.records.is_empty() && off.rung.is_empty());
    }
}
