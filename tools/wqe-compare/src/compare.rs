//! WQE-by-WQE, byte-by-byte comparison of two logs, with the explicit allowances.
//!
//! Per sending QP the two sequences must have the same number of WQEs (one per posted WR),
//! and each pair the same WQE index, the same announcement ([`WqeVia`]: BlueFlame, doorbell,
//! batch), the same length, and the same bytes. Each WQE is split into its fields by walking
//! its segments (docs/datapath.md §1.10); a field whose bytes differ is accepted only if it
//! is one of these [`Allowance`]s, and each use is counted:
//!
//! * [`Allowance::Qpn`] -- ctrl `qpn` (bytes 4..7, top 24 bits) and the UD AV's destination
//!   QPN: objects may get different numbers in the two emulators. Accepted only if each side
//!   holds exactly *its own* number for that QP (mapping, not masking).
//! * [`Allowance::Key`] -- data-segment lkey and raddr rkey: accepted only if each side holds
//!   its own key of the one memory region.
//! * [`Allowance::FetchAddCompare`] -- bytes 8..16 of the atomic segment of a FETCH_AND_ADD:
//!   the PRM leaves them unused and libmlx5 does not write them (stale ring bytes), the `mlx5`
//!   crate writes zero (docs/datapath.md §1.6).
//! * [`Allowance::InlinePadding`] -- the bytes after inline data up to the end of its last
//!   16-byte unit: don't-care (docs/datapath.md §1.8); both drivers leave whatever the ring
//!   held.
//! * [`Allowance::SharedBfregNoBlueFlame`] -- announcement, not bytes: libmlx5 BlueFlames a
//!   WQE where the `mlx5` crate rings the 8-byte doorbell, accepted only when the crate's QP
//!   shares its doorbell register with other QPs. libmlx5 takes the register's spinlock and
//!   copies (docs/datapath.md §3.4); the crate never BlueFlames a shared register, to stay
//!   lock-free. With libmlx5's defaults (4 low-latency bfregs) a context's 5th and later QPs
//!   share.
//! * [`Allowance::UnusedImm`] -- ctrl bytes 12..16 of a WQE whose opcode carries neither
//!   immediate data nor an rkey to invalidate (everything but SEND_IMM, RDMA_WRITE_IMM,
//!   SEND_INVAL): unused (docs/datapath.md §1.2). libmlx5's `ibv_wr_*` path does not clear
//!   them (stale ring bytes); its `ibv_post_send` path and the `mlx5` crate write zero. The
//!   tests assert this allowance is never used for `ibv_post_send` runs.
//!
//! Everything else must be equal; the first differences are reported with both WQEs decoded.

use std::collections::BTreeMap;
use std::fmt::Write;

use mlx5_emu::{WqeRecord, WqeVia};
use mlx5_hw::wqe::{WqeKind, WqeView};

use crate::SideInfo;
use crate::corpus::{Corpus, QpSel, Wr, op};

/// A justified, narrow exception to byte equality (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Allowance {
    /// QP numbers, mapped per role.
    Qpn,
    /// Memory keys, mapped.
    Key,
    /// FETCH_AND_ADD's unused compare operand.
    FetchAddCompare,
    /// Padding after inline data.
    InlinePadding,
    /// ctrl `imm` of an opcode without immediate/invalidate.
    UnusedImm,
    /// BlueFlame (libmlx5) vs doorbell (crate) on a shared doorbell register.
    SharedBfregNoBlueFlame,
}

/// What a field of a WQE is, for the comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Must be equal.
    Exact,
    /// Allowed to differ if both sides hold their own QPN of this role.
    Qpn(Role),
    /// Allowed to differ if both sides hold their own lkey.
    Lkey,
    /// Allowed to differ if both sides hold their own rkey.
    Rkey,
    /// Don't-care: FETCH_AND_ADD compare.
    FaCompare,
    /// Don't-care: inline padding.
    InlinePad,
    /// Don't-care: ctrl imm of an opcode that has none.
    UnusedImm,
}

/// Which QP a QPN field names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// The sending QP itself (ctrl).
    Requester(QpSel),
    /// The UD destination (address vector).
    UdResponder,
}

impl Role {
    fn qpn(self, i: &SideInfo) -> u32 {
        match self {
            Role::Requester(sel) => i.qp(sel).qpn,
            Role::UdResponder => i.qp(QpSel::Ud).peer_qpn,
        }
    }
}

/// A field: byte range within the WQE, how to compare it, and its name for reports.
#[derive(Clone, Debug)]
struct Field {
    start: usize,
    end: usize,
    kind: Kind,
    name: &'static str,
}

/// Split a WQE of `qp` into fields by walking its segments. The layout comes from the bytes
/// themselves (opcode, inline flag); both sides are split the same way as long as the
/// lengths agree (checked before).
fn fields(bytes: &[u8], qp: QpSel) -> Vec<Field> {
    let mut v = Vec::new();
    let mut f = |start: usize, end: usize, kind: Kind, name: &'static str| {
        if start < end && end <= bytes.len() {
            v.push(Field {
                start,
                end,
                kind,
                name,
            });
        }
    };
    let requester = Role::Requester(qp);
    let opcode = bytes.get(3).copied().unwrap_or(0);
    f(0, 4, Kind::Exact, "ctrl.opmod_idx_opcode");
    f(4, 7, Kind::Qpn(requester), "ctrl.qpn");
    f(7, 8, Kind::Exact, "ctrl.ds");
    f(8, 12, Kind::Exact, "ctrl.signature/stream/fm_ce_se");
    // SendOpcode SEND_INVAL 0x01, RDMA_WRITE_IMM 0x09, SEND_IMM 0x0B carry ctrl.imm.
    let imm = if matches!(opcode, 0x01 | 0x09 | 0x0B) {
        Kind::Exact
    } else {
        Kind::UnusedImm
    };
    f(12, 16, imm, "ctrl.imm");
    let mut p = 16;
    if qp == QpSel::Ud {
        f(16, 24, Kind::Exact, "av.key(qkey)");
        f(24, 25, Kind::Exact, "av.dqp_dct.flags");
        f(25, 28, Kind::Qpn(Role::UdResponder), "av.dqp_dct.qpn");
        f(28, 64, Kind::Exact, "av.rest");
        p = 64;
    }
    // SendOpcode values (ctrl byte 3): RDMA_WRITE 0x08, WRITE_IMM 0x09, READ 0x10,
    // ATOMIC_CS 0x11, ATOMIC_FA 0x12.
    if matches!(opcode, 0x08 | 0x09 | 0x10 | 0x11 | 0x12) {
        f(p, p + 8, Kind::Exact, "raddr.raddr");
        f(p + 8, p + 12, Kind::Rkey, "raddr.rkey");
        f(p + 12, p + 16, Kind::Exact, "raddr.reserved");
        p += 16;
    }
    if matches!(opcode, 0x11 | 0x12) {
        f(p, p + 8, Kind::Exact, "atomic.swap_add");
        let k = if opcode == 0x12 {
            Kind::FaCompare
        } else {
            Kind::Exact
        };
        f(p + 8, p + 16, k, "atomic.compare");
        p += 16;
    }
    let inline = bytes
        .get(p..p + 4)
        .is_some_and(|b| b[0] & 0x80 != 0 && !matches!(opcode, 0x10..=0x12));
    if inline {
        let len =
            u32::from_be_bytes([bytes[p], bytes[p + 1], bytes[p + 2], bytes[p + 3]]) & 0x7FFF_FFFF;
        let data_end = p + 4 + len as usize;
        f(p, p + 4, Kind::Exact, "inline.byte_count");
        f(p + 4, data_end.min(bytes.len()), Kind::Exact, "inline.data");
        let pad_end = (p + 4 + len as usize).next_multiple_of(16);
        f(
            data_end,
            pad_end.min(bytes.len()),
            Kind::InlinePad,
            "inline.padding",
        );
        p = pad_end;
    }
    while p + 16 <= bytes.len() {
        f(p, p + 4, Kind::Exact, "data.byte_count");
        f(p + 4, p + 8, Kind::Lkey, "data.lkey");
        f(p + 8, p + 16, Kind::Exact, "data.addr");
        p += 16;
    }
    f(p, bytes.len(), Kind::Exact, "trailing");
    v
}

fn be(b: &[u8]) -> u32 {
    b.iter().fold(0u32, |a, &x| a << 8 | u32::from(x))
}

/// Result of a comparison.
#[derive(Debug, Default)]
pub struct Report {
    /// WQE pairs compared.
    pub wqes: usize,
    /// Bytes compared (per side).
    pub bytes: usize,
    /// Bytes that were not identical but accepted, by allowance.
    pub allowed_bytes: BTreeMap<Allowance, usize>,
    /// WQEs in which each allowance was used.
    pub allowed_wqes: BTreeMap<Allowance, usize>,
    /// WQEs that crossed the end of their SQ ring (first WQEBB in the last slots).
    pub wrapped: BTreeMap<&'static str, usize>,
    /// WQEs per announcement kind (theirs).
    pub via: BTreeMap<&'static str, usize>,
    /// Opcodes seen, with counts.
    pub opcodes: BTreeMap<&'static str, usize>,
    /// Failures: unlisted differences and structural mismatches.
    pub failures: Vec<String>,
}

impl Report {
    /// Human-readable summary.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "WQEs compared: {}, bytes compared: {} per side",
            self.wqes, self.bytes
        );
        let _ = writeln!(s, "opcodes: {:?}", self.opcodes);
        let _ = writeln!(s, "announced by (libmlx5 side): {:?}", self.via);
        let _ = writeln!(s, "WQEs wrapping the ring end: {:?}", self.wrapped);
        if self.allowed_wqes.is_empty() {
            let _ = writeln!(s, "allowances used: none");
        }
        for (a, n) in &self.allowed_wqes {
            let _ = writeln!(
                s,
                "allowance {a:?}: used in {n} WQEs, {} bytes",
                self.allowed_bytes.get(a).copied().unwrap_or(0)
            );
        }
        let _ = writeln!(s, "failures: {}", self.failures.len());
        for f in self.failures.iter().take(12) {
            let _ = writeln!(s, "--- {f}");
        }
        s
    }
}

/// Everything one side produced, for the comparison.
#[derive(Debug, Clone, Copy)]
pub struct Side<'a> {
    /// Label for reports ("libmlx5", "mlx5 crate").
    pub name: &'a str,
    /// Its object numbers and keys.
    pub info: &'a SideInfo,
    /// Its WQE log (all HCAs' records of the one HCA used).
    pub records: &'a [WqeRecord],
}

fn dump(bytes: &[u8], qp: QpSel) -> String {
    let hex: Vec<String> = bytes
        .chunks(16)
        .map(|c| c.iter().map(|b| format!("{b:02x}")).collect::<String>())
        .collect();
    let view = match qp {
        QpSel::Rc => WqeView::new(bytes),
        QpSel::Ud => WqeView::with_kind(bytes, WqeKind::Ud),
        QpSel::Uc => WqeView::with_kind(bytes, WqeKind::Uc),
    };
    format!("{}\n{view}", hex.join(" "))
}

/// Compare `theirs` against `ours` for `corpus`.
pub fn compare(corpus: &Corpus, theirs: Side<'_>, ours: Side<'_>) -> Report {
    let mut r = Report::default();
    for qp in QpSel::ALL {
        let wrs = corpus.wrs(qp);
        let wqe_cnt = theirs.info.qp(qp).sq_wqe_cnt;
        let (t_qpn, o_qpn) = (theirs.info.qp(qp).qpn, ours.info.qp(qp).qpn);
        let t: Vec<&WqeRecord> = theirs.records.iter().filter(|x| x.qpn == t_qpn).collect();
        let o: Vec<&WqeRecord> = ours.records.iter().filter(|x| x.qpn == o_qpn).collect();
        for (side, list) in [(&theirs, &t), (&ours, &o)] {
            if list.len() != wrs.len() {
                r.failures.push(format!(
                    "{} {}: {} WQEs fetched for {} WRs posted",
                    side.name,
                    qp.name(),
                    list.len(),
                    wrs.len()
                ));
            }
        }
        let pairs = t.len().min(o.len()).min(wrs.len());
        for (i, ((a, b), wr)) in t.iter().zip(&o).zip(&wrs).enumerate() {
            if !compare_one(&mut r, qp, i, wr, (a, theirs), (b, ours), wqe_cnt) {
                // The rings are out of step from here on: every later WQE would differ.
                r.failures.push(format!(
                    "{}: WQE indices diverged at WQE #{i}; the remaining {} WQEs of this QP \
                     were not compared",
                    qp.name(),
                    pairs - i - 1
                ));
                break;
            }
        }
    }
    r
}

fn compare_one(
    r: &mut Report,
    qp: QpSel,
    i: usize,
    wr: &Wr,
    (a, theirs): (&WqeRecord, Side<'_>),
    (b, ours): (&WqeRecord, Side<'_>),
    wqe_cnt: u32,
) -> bool {
    r.wqes += 1;
    r.bytes += a.bytes.len();
    *r.opcodes.entry(op::name(wr.opcode)).or_default() += 1;
    *r.via.entry(a.via.name()).or_default() += 1;
    let bbs = a.bytes.len().div_ceil(64) as u32;
    if wqe_cnt > 0 && u32::from(a.wqe_index) % wqe_cnt + bbs > wqe_cnt {
        *r.wrapped.entry(qp.name()).or_default() += 1;
    }
    let what = format!(
        "{} WQE #{i} (idx {}, {})",
        qp.name(),
        a.wqe_index,
        wr.describe()
    );
    let both = || {
        format!(
            "\n  {}:\n{}\n  {}:\n{}",
            theirs.name,
            dump(&a.bytes, qp),
            ours.name,
            dump(&b.bytes, qp)
        )
    };
    if a.wqe_index != b.wqe_index {
        r.failures.push(format!(
            "{what}: WQE index {} ({}) vs {} ({})",
            a.wqe_index, theirs.name, b.wqe_index, ours.name
        ));
        return false;
    }
    let shared_bfreg_ok =
        a.via == WqeVia::BlueFlame && b.via == WqeVia::Doorbell && ours.info.qp(qp).bfreg_shared;
    if shared_bfreg_ok {
        *r.allowed_wqes
            .entry(Allowance::SharedBfregNoBlueFlame)
            .or_default() += 1;
    } else if a.via != b.via {
        r.failures.push(format!(
            "{what}: announced by {} ({}) vs {} ({}){}",
            via_text(a.via),
            theirs.name,
            via_text(b.via),
            ours.name,
            both()
        ));
    }
    if a.bytes.len() != b.bytes.len() {
        r.failures.push(format!(
            "{what}: length {} ({}) vs {} ({}){}",
            a.bytes.len(),
            theirs.name,
            b.bytes.len(),
            ours.name,
            both()
        ));
        return true;
    }
    let mut used = Vec::new();
    let mut covered = 0;
    for fd in fields(&a.bytes, qp) {
        covered = covered.max(fd.end);
        let (x, y) = (&a.bytes[fd.start..fd.end], &b.bytes[fd.start..fd.end]);
        if x == y {
            continue;
        }
        let diff = x.iter().zip(y).filter(|(p, q)| p != q).count();
        let ok = match fd.kind {
            Kind::Exact => None,
            Kind::Qpn(role) => (be(x) == role.qpn(theirs.info) && be(y) == role.qpn(ours.info))
                .then_some(Allowance::Qpn),
            Kind::Lkey => {
                (be(x) == theirs.info.lkey && be(y) == ours.info.lkey).then_some(Allowance::Key)
            }
            Kind::Rkey => {
                (be(x) == theirs.info.rkey && be(y) == ours.info.rkey).then_some(Allowance::Key)
            }
            Kind::FaCompare => Some(Allowance::FetchAddCompare),
            Kind::InlinePad => Some(Allowance::InlinePadding),
            Kind::UnusedImm => Some(Allowance::UnusedImm),
        };
        match ok {
            Some(al) => {
                *r.allowed_bytes.entry(al).or_default() += diff;
                if !used.contains(&al) {
                    used.push(al);
                }
            }
            None => r.failures.push(format!(
                "{what}: field {} (bytes {}..{}) differs: {} {:02x?} vs {} {:02x?}{}",
                fd.name,
                fd.start,
                fd.end,
                theirs.name,
                x,
                ours.name,
                y,
                both()
            )),
        }
    }
    if covered != a.bytes.len() {
        r.failures.push(format!(
            "{what}: segments cover {covered} of {} bytes{}",
            a.bytes.len(),
            both()
        ));
    }
    for al in used {
        *r.allowed_wqes.entry(al).or_default() += 1;
    }
    true
}

fn via_text(v: WqeVia) -> &'static str {
    match v {
        WqeVia::BlueFlame => "BlueFlame",
        WqeVia::Doorbell => "8-byte doorbell",
        WqeVia::Batch => "a later WQE's doorbell",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::corpus::{RC_CAPS, flag};

    fn rec(qpn: u32, idx: u16, bytes: Vec<u8>) -> WqeRecord {
        WqeRecord {
            hca: 0,
            qpn,
            wqe_index: idx,
            via: WqeVia::BlueFlame,
            bytes,
        }
    }

    /// ctrl + raddr + atomic + data of an ATOMIC_FA, and the same with inline SEND.
    fn fa(qpn: u32, rkey: u32, lkey: u32, stale: u8) -> Vec<u8> {
        let mut b = vec![0u8; 64];
        b[0..4].copy_from_slice(&0x0000_0012u32.to_be_bytes());
        b[4..8].copy_from_slice(&(qpn << 8 | 4).to_be_bytes());
        b[11] = 0x08;
        b[16..24].copy_from_slice(&0x3a5a_0004_0000u64.to_be_bytes());
        b[24..28].copy_from_slice(&rkey.to_be_bytes());
        b[32..40].copy_from_slice(&5u64.to_be_bytes());
        b[40..48].fill(stale);
        b[48..52].copy_from_slice(&8u32.to_be_bytes());
        b[52..56].copy_from_slice(&lkey.to_be_bytes());
        b[56..64].copy_from_slice(&0x3a5a_0008_0000u64.to_be_bytes());
        b
    }

    fn corpus_of_one() -> Corpus {
        Corpus {
            posts: vec![vec![Wr {
                qp: QpSel::Rc,
                opcode: op::ATOMIC_FETCH_AND_ADD,
                flags: flag::SIGNALED,
                imm: 0,
                remote_off: 0,
                compare: 0,
                swap_add: 5,
                sges: vec![(0, 8)],
            }]],
            sq_sig_all: false,
            roce: None,
        }
    }

    fn info(qpn: u32, key: u32) -> SideInfo {
        let mut i = SideInfo {
            lkey: key,
            rkey: key,
            ..SideInfo::default()
        };
        i.qps[QpSel::Rc as usize].qpn = qpn;
        i.qps[QpSel::Rc as usize].sq_wqe_cnt = RC_CAPS.geometry(48).1;
        i
    }

    #[test]
    fn allowances_map_rather_than_mask() {
        let c = corpus_of_one();
        let (ti, oi) = (info(0x10, 0x100), info(0x20, 0x200));
        let t = [rec(0x10, 0, fa(0x10, 0x100, 0x100, 0xAA))];
        let o = [rec(0x20, 0, fa(0x20, 0x200, 0x200, 0))];
        let side = |name, info, records| Side {
            name,
            info,
            records,
        };
        let r = compare(&c, side("a", &ti, &t), side("b", &oi, &o));
        assert!(r.failures.is_empty(), "{}", r.summary());
        assert_eq!(r.wqes, 1);
        assert_eq!(r.allowed_wqes[&Allowance::Qpn], 1);
        assert_eq!(r.allowed_wqes[&Allowance::Key], 1);
        assert_eq!(r.allowed_bytes[&Allowance::FetchAddCompare], 8);
        // A key that is not the side's own key is a failure, as is any other byte.
        let o = [rec(0x20, 0, fa(0x20, 0x201, 0x200, 0))];
        let r = compare(&c, side("a", &ti, &t), side("b", &oi, &o));
        assert_eq!(r.failures.len(), 1, "{}", r.summary());
        assert!(r.failures[0].contains("raddr.rkey"));
        let mut bytes = fa(0x20, 0x200, 0x200, 0);
        bytes[35] ^= 1;
        let o = [rec(0x20, 0, bytes)];
        let r = compare(&c, side("a", &ti, &t), side("b", &oi, &o));
        assert_eq!(r.failures.len(), 1);
        assert!(
            r.failures[0].contains("atomic.swap_add"),
            "{}",
            r.failures[0]
        );
        // A missing WQE is reported.
        let r = compare(&c, side("a", &ti, &t), side("b", &oi, &[]));
        assert!(r.failures.iter().any(|f| f.contains("0 WQEs fetched")));
    }

    #[test]
    fn inline_padding_is_the_only_inline_allowance() {
        // SEND inline 5 bytes: ctrl + header + 5 data + 7 pad = 32 bytes.
        let mk = |pad: u8, data: u8| {
            let mut b = vec![0u8; 32];
            b[0..4].copy_from_slice(&0x0000_000Au32.to_be_bytes());
            b[4..8].copy_from_slice(&(0x10u32 << 8 | 2).to_be_bytes());
            b[16..20].copy_from_slice(&(0x8000_0005u32).to_be_bytes());
            b[20..25].fill(data);
            b[25..32].fill(pad);
            b
        };
        let f = fields(&mk(0, 0), QpSel::Rc);
        let pad = f.iter().find(|x| x.kind == Kind::InlinePad).unwrap();
        assert_eq!((pad.start, pad.end), (25, 32));
        let c = Corpus {
            posts: vec![vec![Wr {
                qp: QpSel::Rc,
                opcode: op::SEND,
                flags: flag::INLINE,
                imm: 0,
                remote_off: 0,
                compare: 0,
                swap_add: 0,
                sges: vec![(0, 5)],
            }]],
            sq_sig_all: false,
            roce: None,
        };
        let i = info(0x10, 1);
        let s = |r: &[WqeRecord]| r.to_vec();
        let (t, o) = (s(&[rec(0x10, 0, mk(1, 7))]), s(&[rec(0x10, 0, mk(2, 7))]));
        let side = |records| Side {
            name: "x",
            info: &i,
            records,
        };
        let r = compare(&c, side(&t), side(&o));
        assert!(r.failures.is_empty());
        assert_eq!(r.allowed_bytes[&Allowance::InlinePadding], 7);
        let o = s(&[rec(0x10, 0, mk(1, 8))]);
        let r = compare(&c, side(&t), side(&o));
        assert!(r.failures[0].contains("inline.data"));
    }
}
