//! `mlx5 diag`: the state of a QP and its CQs -- producer and consumer indices, doorbell
//! records, outstanding WRs and the ring contents, decoded -- with the error CQE and the WQE it
//! points to picked out and explained.
//!
//! Two sources:
//! * a flight-recorder dump file ([`parse_dump`], format v1 in `docs/diagnostics.md`): the
//!   QP and CQ state lines plus the last WQEs, receive WQEs and CQEs of each queue;
//! * the in-process emulator (`--emu`, [`live`]): a QP pair is created, a few SENDs go through,
//!   then a SEND with a bad lkey forces an error; the driver's view of the QP (its counters) is
//!   printed next to the emulator's view of the same QP (the doorbell records as the device
//!   reads them from host memory, the device's own indices).
//!
//! The parser never panics: a record of a known kind that does not parse is a [`DumpError`]
//! that names the line and the problem (bad number, truncated hex, missing field); records of an
//! unknown kind are skipped (the format's forward-compatibility rule) and counted.

use std::fmt::Write as _;

use mlx5_hw::cqe::{CQE_SIZE_64, CQE_SIZE_128, ErrCqe, desc_offset, explain};
use mlx5_hw::opcodes::{CqeOpcode, Syndrome};
use mlx5_hw::wqe::{DS_SIZE, WQEBB_SIZE};
use serde_json::{Value, json};
use zerocopy::FromBytes;

use crate::decode::{WqeOptions, decode_cqe, decode_wqe};

/// The first line of a v1 dump.
pub const MAGIC: &str = "mlx5-flight-recorder";

/// A dump that cannot be read: the 1-based line number (0 = the file as a whole) and what is
/// wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DumpError {
    /// 1-based line number, 0 when the problem is not one line's.
    pub line: usize,
    /// What is wrong, naming the record kind and field.
    pub msg: String,
}

impl std::fmt::Display for DumpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.line == 0 {
            f.write_str(&self.msg)
        } else {
            write!(f, "line {}: {}", self.line, self.msg)
        }
    }
}

impl std::error::Error for DumpError {}

/// A `qp` record: the state of one QP when the dump was taken.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QpState {
    /// QP number.
    pub qpn: u32,
    /// `RC`, `UC` or `UD`.
    pub qp_type: String,
    /// `RESET` .. `ERR`.
    pub state: String,
    /// Send queue size in WQEBBs.
    pub sq_wqe_cnt: u64,
    /// Send producer counter (free-running).
    pub sq_pi: u64,
    /// Send consumer counter (free-running).
    pub sq_ci: u64,
    /// Value last written to the send doorbell record.
    pub sq_dbrec: u64,
    /// Receive queue size in WQEs.
    pub rq_wqe_cnt: u64,
    /// Receive producer counter.
    pub rq_pi: u64,
    /// Receive consumer counter.
    pub rq_ci: u64,
    /// Value last written to the receive doorbell record.
    pub rq_dbrec: u64,
    /// Send WRs posted and not yet retired.
    pub outstanding: u64,
}

/// A `cq` record.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CqState {
    /// CQ number.
    pub cqn: u32,
    /// 64 or 128.
    pub cqe_size: usize,
    /// Number of CQEs in the ring.
    pub cqe_cnt: u64,
    /// Consumer counter (free-running).
    pub ci: u64,
    /// Value last written to the CQ doorbell record's consumer word.
    pub dbrec_ci: u64,
}

/// Kind of a ring record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A send WQE as posted.
    Wqe,
    /// A receive WQE as posted.
    Rwqe,
    /// A CQE as the poller saw it.
    Cqe,
}

impl Kind {
    fn word(self) -> &'static str {
        match self {
            Self::Wqe => "wqe",
            Self::Rwqe => "rwqe",
            Self::Cqe => "cqe",
        }
    }
}

/// A `wqe`, `rwqe` or `cqe` record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// What it is.
    pub kind: Kind,
    /// QPN (wqe, rwqe) or CQN (cqe).
    pub queue: u32,
    /// WQE index (wqe, rwqe) or consumer index (cqe).
    pub index: u64,
    /// Recorder-wide sequence number.
    pub seq: u64,
    /// The bytes.
    pub bytes: Vec<u8>,
    /// Line in the dump.
    pub line: usize,
}

/// A parsed dump.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Dump {
    /// Why it was taken.
    pub reason: Option<String>,
    /// QP records.
    pub qps: Vec<QpState>,
    /// CQ records.
    pub cqs: Vec<CqState>,
    /// Ring records, in file order.
    pub entries: Vec<Entry>,
    /// Lines of records of unknown kinds, skipped.
    pub skipped: Vec<usize>,
}

fn bad(line: usize, msg: impl Into<String>) -> DumpError {
    DumpError {
        line,
        msg: msg.into(),
    }
}

/// A queue number: `0x` + hex (as the format writes it) or decimal; at most 24 bits.
fn parse_qn(line: usize, what: &str, t: &str) -> Result<u32, DumpError> {
    let v = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(h) => u32::from_str_radix(h, 16),
        None => t.parse::<u32>(),
    }
    .map_err(|_| {
        bad(
            line,
            format!("{what}: {t:?} is not a queue number (0x + hex)"),
        )
    })?;
    if v > 0xFF_FFFF {
        return Err(bad(line, format!("{what}: {t} does not fit 24 bits")));
    }
    Ok(v)
}

fn parse_num(line: usize, what: &str, t: &str) -> Result<u64, DumpError> {
    t.parse::<u64>()
        .map_err(|_| bad(line, format!("{what}: {t:?} is not a decimal number")))
}

/// Lowercase (or uppercase) hex without spaces into bytes.
fn parse_hex(line: usize, what: &str, t: &str) -> Result<Vec<u8>, DumpError> {
    if let Some((i, c)) = t.char_indices().find(|(_, c)| !c.is_ascii_hexdigit()) {
        return Err(bad(
            line,
            format!("{what}: bad hex digit {c:?} at position {i}"),
        ));
    }
    if t.len() % 2 != 0 {
        return Err(bad(
            line,
            format!("{what}: truncated hex ({} digits, an odd number)", t.len()),
        ));
    }
    Ok((0..t.len())
        .step_by(2)
        .filter_map(|i| t.get(i..i + 2))
        .filter_map(|p| u8::from_str_radix(p, 16).ok())
        .collect())
}

/// The `key value` pairs after a record's head; a key without a value is an error.
fn pairs<'a>(
    line: usize,
    kind: &str,
    toks: &[&'a str],
) -> Result<Vec<(&'a str, &'a str)>, DumpError> {
    if toks.len() % 2 != 0 {
        return Err(bad(
            line,
            format!(
                "{kind}: field {:?} has no value",
                toks.last().copied().unwrap_or("")
            ),
        ));
    }
    Ok(toks.chunks(2).map(|c| (c[0], c[1])).collect())
}

fn field<'a>(
    line: usize,
    kind: &str,
    kv: &[(&str, &'a str)],
    key: &str,
) -> Result<&'a str, DumpError> {
    kv.iter()
        .find(|(k, _)| *k == key)
        .map(|(_, v)| *v)
        .ok_or_else(|| bad(line, format!("{kind}: missing field {key}")))
}

fn num_field(line: usize, kind: &str, kv: &[(&str, &str)], key: &str) -> Result<u64, DumpError> {
    parse_num(line, &format!("{kind} {key}"), field(line, kind, kv, key)?)
}

fn parse_qp(n: usize, toks: &[&str]) -> Result<QpState, DumpError> {
    let qpn = parse_qn(n, "qp", toks.get(1).copied().unwrap_or(""))?;
    let kv = pairs(n, "qp", toks.get(2..).unwrap_or(&[]))?;
    let qp_type = field(n, "qp", &kv, "type")?;
    if !matches!(qp_type, "RC" | "UC" | "UD") {
        return Err(bad(n, format!("qp type: {qp_type:?} is not RC, UC or UD")));
    }
    let state = field(n, "qp", &kv, "state")?;
    if !matches!(
        state,
        "RESET" | "INIT" | "RTR" | "RTS" | "SQD" | "SQE" | "ERR"
    ) {
        return Err(bad(n, format!("qp state: {state:?} is not a QP state")));
    }
    let q = QpState {
        qpn,
        qp_type: qp_type.to_owned(),
        state: state.to_owned(),
        sq_wqe_cnt: num_field(n, "qp", &kv, "sq_wqe_cnt")?,
        sq_pi: num_field(n, "qp", &kv, "sq_pi")?,
        sq_ci: num_field(n, "qp", &kv, "sq_ci")?,
        sq_dbrec: num_field(n, "qp", &kv, "sq_dbrec")?,
        rq_wqe_cnt: num_field(n, "qp", &kv, "rq_wqe_cnt")?,
        rq_pi: num_field(n, "qp", &kv, "rq_pi")?,
        rq_ci: num_field(n, "qp", &kv, "rq_ci")?,
        rq_dbrec: num_field(n, "qp", &kv, "rq_dbrec")?,
        outstanding: num_field(n, "qp", &kv, "outstanding")?,
    };
    Ok(q)
}

fn parse_cq(n: usize, toks: &[&str]) -> Result<CqState, DumpError> {
    let cqn = parse_qn(n, "cq", toks.get(1).copied().unwrap_or(""))?;
    let kv = pairs(n, "cq", toks.get(2..).unwrap_or(&[]))?;
    let cqe_size = num_field(n, "cq", &kv, "cqe_size")?;
    if cqe_size != CQE_SIZE_64 as u64 && cqe_size != CQE_SIZE_128 as u64 {
        return Err(bad(n, format!("cq cqe_size: {cqe_size} is not 64 or 128")));
    }
    Ok(CqState {
        cqn,
        cqe_size: cqe_size as usize,
        cqe_cnt: num_field(n, "cq", &kv, "cqe_cnt")?,
        ci: num_field(n, "cq", &kv, "ci")?,
        dbrec_ci: num_field(n, "cq", &kv, "dbrec_ci")?,
    })
}

fn parse_entry(n: usize, kind: Kind, toks: &[&str]) -> Result<Entry, DumpError> {
    let w = kind.word();
    if toks.len() < 5 {
        return Err(bad(
            n,
            format!(
                "{w}: expected `{w} <{}> <index> <seq> <hex>`, got {} fields",
                if kind == Kind::Cqe { "cqn" } else { "qpn" },
                toks.len()
            ),
        ));
    }
    let queue = parse_qn(n, w, toks[1])?;
    let index = parse_num(n, &format!("{w} index"), toks[2])?;
    let seq = parse_num(n, &format!("{w} seq"), toks[3])?;
    let bytes = parse_hex(n, &format!("{w} hex"), toks[4])?;
    let len = bytes.len();
    match kind {
        Kind::Wqe if len == 0 || len % WQEBB_SIZE != 0 => {
            return Err(bad(
                n,
                format!(
                    "wqe: truncated: {len} bytes is not a whole number of {WQEBB_SIZE}-byte WQEBBs"
                ),
            ));
        }
        Kind::Rwqe if len == 0 || len % DS_SIZE != 0 => {
            return Err(bad(
                n,
                format!(
                    "rwqe: truncated: {len} bytes is not a whole number of {DS_SIZE}-byte data segments"
                ),
            ));
        }
        Kind::Cqe if len != CQE_SIZE_64 && len != CQE_SIZE_128 => {
            return Err(bad(
                n,
                format!("cqe: truncated: {len} bytes (a CQE has 64 or 128)"),
            ));
        }
        _ => {}
    }
    Ok(Entry {
        kind,
        queue,
        index,
        seq,
        bytes,
        line: n,
    })
}

/// Parses a v1 dump.
///
/// # Errors
/// No `mlx5-flight-recorder v1` header line, another version, or a record of a known kind that
/// does not parse (the error names the line, the field and what is wrong).
pub fn parse_dump(text: &str) -> Result<Dump, DumpError> {
    let mut d = Dump::default();
    let mut header = false;
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        let line = raw.trim_end_matches('\r');
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let toks: Vec<&str> = line.split_whitespace().collect();
        if !header {
            match toks.as_slice() {
                [m, v] if *m == MAGIC && *v == "v1" => {
                    header = true;
                    continue;
                }
                [m, v, ..] if *m == MAGIC => {
                    return Err(bad(
                        n,
                        format!("unsupported dump version {v:?} (this reader knows v1)"),
                    ));
                }
                _ => {
                    return Err(bad(
                        n,
                        format!(
                            "not a flight-recorder dump: the first record must be `{MAGIC} v1`"
                        ),
                    ));
                }
            }
        }
        match toks[0] {
            "reason" => {
                let rest = line.trim_start()["reason".len()..].trim();
                d.reason = Some(rest.to_owned());
            }
            "qp" => d.qps.push(parse_qp(n, &toks)?),
            "cq" => d.cqs.push(parse_cq(n, &toks)?),
            "wqe" => d.entries.push(parse_entry(n, Kind::Wqe, &toks)?),
            "rwqe" => d.entries.push(parse_entry(n, Kind::Rwqe, &toks)?),
            "cqe" => d.entries.push(parse_entry(n, Kind::Cqe, &toks)?),
            _ => d.skipped.push(n),
        }
    }
    if !header {
        return Err(bad(0, format!("empty dump: no `{MAGIC} v1` line")));
    }
    Ok(d)
}

// ---------------------------------------------------------------------------------------------
// Analysis

/// An error CQE found in the dump, with the WQE it points to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// Index of the CQE in [`Dump::entries`].
    pub cqe: usize,
    /// REQ_ERR or RESP_ERR.
    pub opcode: CqeOpcode,
    /// QP the CQE names.
    pub qpn: u32,
    /// Its wqe_counter.
    pub wqe_counter: u16,
    /// Syndrome.
    pub syndrome: Syndrome,
    /// Vendor syndrome.
    pub vendor: u8,
    /// Index in [`Dump::entries`] of the WQE (REQ_ERR) or receive WQE (RESP_ERR) it points to,
    /// when the recorder still had it.
    pub wqe: Option<usize>,
}

impl Finding {
    /// Whether this is a flush (a consequence of an earlier error, not a cause).
    pub fn is_flush(&self) -> bool {
        self.syndrome == Syndrome::WR_FLUSH
    }
}

/// The wqe_index a send WQE's control segment carries (`opmod_idx_opcode` 23:8).
pub fn ctrl_wqe_index(b: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(1)?, *b.get(2)?]))
}

/// The 64-byte CQE proper (the last 64 bytes of a 128-byte CQE).
fn cqe64(b: &[u8]) -> Option<&[u8]> {
    b.get(desc_offset(b.len())..)
}

/// Every error CQE in the dump, in sequence order, each with the WQE it points to.
pub fn analyze(d: &Dump) -> Vec<Finding> {
    let mut out = Vec::new();
    for (i, e) in d.entries.iter().enumerate() {
        if e.kind != Kind::Cqe {
            continue;
        }
        let Some(err) = cqe64(&e.bytes).and_then(|b| ErrCqe::read_from_bytes(b).ok()) else {
            continue;
        };
        let opcode = err.opcode();
        if !opcode.is_error() {
            continue;
        }
        let (qpn, wc) = (err.qpn(), err.wqe_counter());
        let wqe = if opcode == CqeOpcode::REQ_ERR {
            find_send_wqe(d, qpn, wc, e.seq)
        } else {
            find_recv_wqe(d, qpn, wc, e.seq)
        };
        out.push(Finding {
            cqe: i,
            opcode,
            qpn,
            wqe_counter: wc,
            syndrome: err.syndrome(),
            vendor: err.vendor_err_synd,
            wqe,
        });
    }
    out.sort_by_key(|f| d.entries[f.cqe].seq);
    out
}

/// The latest send WQE of `qpn` posted before `seq` whose control segment carries wqe_index
/// `wc` (the CQE's wqe_counter is that 16-bit counter).
fn find_send_wqe(d: &Dump, qpn: u32, wc: u16, seq: u64) -> Option<usize> {
    d.entries
        .iter()
        .enumerate()
        .filter(|(_, e)| e.kind == Kind::Wqe && e.queue == qpn && e.seq < seq)
        .filter(|(_, e)| ctrl_wqe_index(&e.bytes) == Some(wc))
        .max_by_key(|(_, e)| e.seq)
        .map(|(i, _)| i)
}

/// The latest receive WQE of `qpn` posted before `seq` at ring slot `wc mod rq_wqe_cnt`.
fn find_recv_wqe(d: &Dump, qpn: u32, wc: u16, seq: u64) -> Option<usize> {
    let cnt = d
        .qps
        .iter()
        .find(|q| q.qpn == qpn)
        .map_or(0, |q| q.rq_wqe_cnt);
    let slot = |x: u64| {
        if cnt.is_power_of_two() {
            x & (cnt - 1)
        } else {
            x
        }
    };
    d.entries
        .iter()
        .enumerate()
        .filter(|(_, e)| e.kind == Kind::Rwqe && e.queue == qpn && e.seq < seq)
        .filter(|(_, e)| slot(e.index) == slot(u64::from(wc)))
        .max_by_key(|(_, e)| e.seq)
        .map(|(i, _)| i)
}

// ---------------------------------------------------------------------------------------------
// The explanation, ranked by the evidence

/// One check the device reports as failed: the emulator's view of an error
/// (`Emulator::failed_checks`); hardware shows none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceCheck {
    /// "requester" or "responder".
    pub side: String,
    /// The QP that made the check.
    pub qpn: u32,
    /// The check (`key`, `PD`, `rights`, `range`, `length`, `receive WQE`, `ACK`).
    pub check: String,
    /// What was compared.
    pub detail: String,
}

impl From<&mlx5_emu::FailedCheck> for DeviceCheck {
    fn from(c: &mlx5_emu::FailedCheck) -> Self {
        Self {
            side: c.side.to_owned(),
            qpn: c.qpn,
            check: c.check.to_owned(),
            detail: c.detail.clone(),
        }
    }
}

/// The evidence about one error: the CQE, the failing WQE (from the flight recorder or the
/// ring), the device's view.
#[derive(Clone, Debug, Default)]
pub struct Evidence {
    /// The CQE's syndrome.
    pub syndrome: Syndrome,
    /// The CQE's vendor syndrome.
    pub vendor: u8,
    /// The failing WQE's opcode (send side), when known.
    pub opcode: Option<mlx5_hw::opcodes::SendOpcode>,
    /// Where the WQE came from and what it says (one line), when known.
    pub wqe: Option<String>,
    /// The checks the device reports as failed (`None`: the device's view is not available,
    /// e.g. on hardware or from a dump).
    pub device: Option<Vec<DeviceCheck>>,
}

/// What the evidence points at, most telling first: the device's failed checks, the CQE's
/// vendor syndrome, the failing WQE's opcode (a SEND has no remote key: its remote invalid
/// request points at the length; a remote access error most often is the MR's access flags).
pub fn pointers(e: &Evidence) -> Vec<mlx5_hw::syndrome::Pointer> {
    use mlx5_hw::syndrome::Pointer;
    let mut v = Vec::new();
    let mut add = |p: Pointer| {
        if !v.contains(&p) {
            v.push(p);
        }
    };
    for c in e.device.iter().flatten() {
        if let Some(p) = Pointer::from_check(&c.check) {
            add(p);
        }
    }
    if let Some(p) = Pointer::from_vendor(e.syndrome, e.vendor.into()) {
        add(p);
    }
    let send = e.opcode.is_some_and(|o| {
        matches!(
            o,
            mlx5_hw::opcodes::SendOpcode::SEND
                | mlx5_hw::opcodes::SendOpcode::SEND_IMM
                | mlx5_hw::opcodes::SendOpcode::SEND_INVAL
        )
    });
    if e.syndrome == Syndrome::REMOTE_INVAL_REQ && send {
        add(Pointer::Length);
    }
    if e.syndrome == Syndrome::REMOTE_ACCESS {
        add(Pointer::Rights);
    }
    v
}

/// The explanation of an error ranked by `e`: the evidence used, `meaning:`, the causes most
/// likely first (`causes, most likely first:` then `  1. ...`), `check:`.
pub fn ranked_text(e: &Evidence) -> String {
    let mut s = String::new();
    let vm = mlx5_hw::syndrome::vendor_meaning(e.vendor.into());
    let ptr = pointers(e);
    let _ = writeln!(s, "evidence used:");
    let _ = writeln!(
        s,
        "  CQE: syndrome {:?} vendor_err {:#04x}{}{}",
        e.syndrome,
        e.vendor,
        vm.map_or(String::new(), |m| format!(" ({m})")),
        mlx5_hw::syndrome::Pointer::from_vendor(e.syndrome, e.vendor.into())
            .map_or(String::new(), |p| format!(" -> {}", p.name()))
    );
    match &e.wqe {
        Some(w) => {
            let _ = writeln!(s, "  WQE: {w}");
        }
        None => {
            let _ = writeln!(s, "  WQE: not available");
        }
    }
    match &e.device {
        Some(v) if v.is_empty() => {
            let _ = writeln!(s, "  device: no failed check reported");
        }
        Some(v) => {
            for c in v {
                let _ = writeln!(
                    s,
                    "  device: {} QP {:#x} check `{}` failed: {}",
                    c.side, c.qpn, c.check, c.detail
                );
            }
        }
        None => {
            let _ = writeln!(
                s,
                "  device: not observable (a dump or real hardware: only the CQE and the WQE)"
            );
        }
    }
    let Some(x) = explain(e.syndrome, e.vendor.into()) else {
        let _ = writeln!(s, "no explanation for this syndrome pair");
        return s;
    };
    let _ = writeln!(s, "meaning: {}", x.meaning);
    let _ = writeln!(s, "causes, most likely first:");
    for (k, (c, by)) in mlx5_hw::syndrome::rank_causes(x, &ptr).iter().enumerate() {
        let _ = writeln!(
            s,
            "  {}. {c}{}",
            k + 1,
            by.map_or(String::new(), |p| format!("  [evidence: {}]", p.name()))
        );
    }
    let _ = writeln!(s, "check: {}", x.check);
    s
}

/// The first cause [`ranked_text`] prints (tests and JSON).
pub fn first_cause(e: &Evidence) -> Option<&'static str> {
    let x = explain(e.syndrome, e.vendor.into())?;
    mlx5_hw::syndrome::rank_causes(x, &pointers(e)).first()
}

/// One line on a send WQE: its opcode and the first data segment's key and range.
pub fn wqe_line(bytes: &[u8], ud: bool) -> (Option<mlx5_hw::opcodes::SendOpcode>, String) {
    let op = bytes.get(3).map(|&b| mlx5_hw::opcodes::SendOpcode(b));
    let line = match decode_wqe(bytes, WqeOptions { ud }) {
        Ok(d) => {
            let mut l = format!("opcode {}", d.text("ctrl", "opcode").unwrap_or("?"));
            if let Some(k) = d.text("data[0]", "lkey") {
                let _ = write!(
                    l,
                    ", data[0] lkey {k} addr {} byte_count {}",
                    d.text("data[0]", "addr").unwrap_or("?"),
                    d.text("data[0]", "byte_count").unwrap_or("?")
                );
            }
            if let Some(k) = d.text("raddr", "rkey") {
                let _ = write!(
                    l,
                    ", remote rkey {k} addr {}",
                    d.text("raddr", "raddr").unwrap_or("?")
                );
            }
            l
        }
        Err(e) => format!("not decodable: {e}"),
    };
    (op, line)
}

// ---------------------------------------------------------------------------------------------
// Printing

fn indent(s: &str, pad: &str) -> String {
    s.lines().map(|l| format!("{pad}{l}\n")).collect()
}

/// Decoded receive WQE: its data segments.
fn decode_rwqe(b: &[u8]) -> String {
    let mut s = String::new();
    for (i, seg) in b.chunks_exact(DS_SIZE).enumerate() {
        let len = u32::from_be_bytes([seg[0], seg[1], seg[2], seg[3]]);
        let lkey = u32::from_be_bytes([seg[4], seg[5], seg[6], seg[7]]);
        let mut a = [0u8; 8];
        a.copy_from_slice(&seg[8..16]);
        let addr = u64::from_be_bytes(a);
        let _ = write!(
            s,
            "data[{i}] byte_count {len} lkey {lkey:#010x} addr {addr:#018x}"
        );
        if lkey == mlx5_hw::wqe::INVALID_LKEY {
            s.push_str("  (end of list)");
        }
        s.push('\n');
    }
    s
}

/// The state lines of the QPs and CQs, with what the indices say.
fn state_text(d: &Dump) -> String {
    let mut s = String::new();
    for q in &d.qps {
        let _ = writeln!(s, "QP {:#x} {} state {}", q.qpn, q.qp_type, q.state);
        let _ = writeln!(
            s,
            "  SQ  wqe_cnt {:<5} pi {:<6} ci {:<6} dbrec {:<6} in flight {} WQEBBs, {} WRs outstanding",
            q.sq_wqe_cnt,
            q.sq_pi,
            q.sq_ci,
            q.sq_dbrec,
            q.sq_pi.wrapping_sub(q.sq_ci),
            q.outstanding
        );
        let _ = writeln!(
            s,
            "  RQ  wqe_cnt {:<5} pi {:<6} ci {:<6} dbrec {:<6} {} receives posted",
            q.rq_wqe_cnt,
            q.rq_pi,
            q.rq_ci,
            q.rq_dbrec,
            q.rq_pi.wrapping_sub(q.rq_ci)
        );
        if q.sq_dbrec != q.sq_pi & 0xFFFF {
            let _ = writeln!(
                s,
                "  note: SQ doorbell record {} is not pi mod 2^16 ({}): WQEs written but the doorbell record not yet updated",
                q.sq_dbrec,
                q.sq_pi & 0xFFFF
            );
        }
        if q.rq_dbrec != q.rq_pi & 0xFFFF {
            let _ = writeln!(
                s,
                "  note: RQ doorbell record {} is not pi mod 2^16 ({}): receives written but not yet published",
                q.rq_dbrec,
                q.rq_pi & 0xFFFF
            );
        }
        if q.sq_wqe_cnt > 0 && q.sq_pi.wrapping_sub(q.sq_ci) > q.sq_wqe_cnt {
            let _ = writeln!(
                s,
                "  note: SQ pi - ci = {} exceeds the ring size {}: the counters are inconsistent",
                q.sq_pi.wrapping_sub(q.sq_ci),
                q.sq_wqe_cnt
            );
        }
    }
    for c in &d.cqs {
        let _ = writeln!(
            s,
            "CQ {:#x} cqe_size {} cqe_cnt {} ci {} dbrec_ci {}",
            c.cqn, c.cqe_size, c.cqe_cnt, c.ci, c.dbrec_ci
        );
        if c.dbrec_ci != c.ci & 0xFF_FFFF {
            let _ = writeln!(
                s,
                "  note: doorbell record {} lags ci {} by {}: CQEs polled but not yet acknowledged to the device",
                c.dbrec_ci,
                c.ci & 0xFF_FFFF,
                (c.ci & 0xFF_FFFF).wrapping_sub(c.dbrec_ci) & 0xFF_FFFF
            );
        }
    }
    s
}

fn qp_type_of(d: &Dump, qpn: u32) -> Option<&str> {
    d.qps
        .iter()
        .find(|q| q.qpn == qpn)
        .map(|q| q.qp_type.as_str())
}

/// One record, decoded, indented; `mark` is printed before the header line.
fn entry_text(d: &Dump, e: &Entry, mark: &str) -> String {
    let what = match e.kind {
        Kind::Wqe => format!("wqe  qp {:#x} index {}", e.queue, e.index),
        Kind::Rwqe => format!("rwqe qp {:#x} index {}", e.queue, e.index),
        Kind::Cqe => format!("cqe  cq {:#x} ci {}", e.queue, e.index),
    };
    let body = match e.kind {
        Kind::Wqe => {
            let ud = qp_type_of(d, e.queue) == Some("UD");
            match decode_wqe(&e.bytes, WqeOptions { ud }) {
                Ok(x) => x.to_text(),
                Err(err) => format!("(not decodable: {err})\n"),
            }
        }
        Kind::Rwqe => decode_rwqe(&e.bytes),
        Kind::Cqe => match decode_cqe(&e.bytes, Some(e.bytes.len())) {
            Ok(x) => x.to_text(),
            Err(err) => format!("(not decodable: {err})\n"),
        },
    };
    format!(
        "{mark}seq {} {what} (line {})\n{}",
        e.seq,
        e.line,
        indent(&body, "      ")
    )
}

/// The findings block: each error CQE, the WQE it points to, and the explanation of the first
/// non-flush error (the cause; the flushes after it are its consequence).
fn findings_text(d: &Dump, f: &[Finding], device: Option<&[DeviceCheck]>) -> String {
    let mut s = String::new();
    if f.is_empty() {
        s.push_str("no error CQE in the dump\n");
        return s;
    }
    let cause = f.iter().position(|x| !x.is_flush()).unwrap_or(0);
    for (k, x) in f.iter().enumerate() {
        let e = &d.entries[x.cqe];
        let _ = writeln!(
            s,
            "{} CQE: cq {:#x} ci {} seq {}: {} on qp {:#x} wqe_counter {}: syndrome {:?} vendor_err {:#04x} -> {}",
            if k == cause { "ERROR" } else { "error" },
            e.queue,
            e.index,
            e.seq,
            x.opcode,
            x.qpn,
            x.wqe_counter,
            x.syndrome,
            x.vendor,
            x.syndrome.wc_status()
        );
        if let Some(m) = mlx5_hw::syndrome::vendor_meaning(x.vendor.into()) {
            let _ = writeln!(s, "  vendor_err {:#04x}: {m}", x.vendor);
        }
        match x.wqe {
            Some(w) => {
                let we = &d.entries[w];
                let _ = writeln!(
                    s,
                    "  points to {} seq {} qp {:#x} index {} (line {})",
                    we.kind.word(),
                    we.seq,
                    we.queue,
                    we.index,
                    we.line
                );
            }
            None => {
                let _ = writeln!(
                    s,
                    "  the {} it points to (counter {}) is not in the dump (older than the recorder's window)",
                    if x.opcode == CqeOpcode::REQ_ERR {
                        "WQE"
                    } else {
                        "receive WQE"
                    },
                    x.wqe_counter
                );
            }
        }
    }
    let first = &f[cause];
    if f.len() > 1 {
        let flushes = f.iter().filter(|x| x.is_flush()).count();
        let _ = writeln!(
            s,
            "{} error CQEs, {flushes} of them flushes: the first non-flush error (seq {}) is the cause",
            f.len(),
            d.entries[first.cqe].seq
        );
    }
    s.push_str(&ranked_text(&evidence_of(d, first, device)));
    s
}

/// The evidence of finding `f` of dump `d`: the CQE, the WQE the recorder kept, and `device`
/// (the device's view, when there is one).
pub fn evidence_of(d: &Dump, f: &Finding, device: Option<&[DeviceCheck]>) -> Evidence {
    let (opcode, wqe) = match f.wqe.map(|w| &d.entries[w]) {
        Some(we) if we.kind == Kind::Wqe => {
            let ud = qp_type_of(d, we.queue) == Some("UD");
            let (op, line) = wqe_line(&we.bytes, ud);
            (op, Some(format!("flight recorder, seq {}: {line}", we.seq)))
        }
        Some(we) => (
            None,
            Some(format!(
                "flight recorder, receive WQE seq {}: {}",
                we.seq,
                decode_rwqe(&we.bytes).lines().next().unwrap_or("")
            )),
        ),
        None => (None, None),
    };
    Evidence {
        syndrome: f.syndrome,
        vendor: f.vendor,
        opcode,
        wqe,
        device: device.map(<[DeviceCheck]>::to_vec),
    }
}

/// The findings of a dump alone: each error CQE, the record it points to, and the explanation
/// of the cause ranked by the evidence.
pub fn findings(d: &Dump) -> String {
    findings_text(d, &analyze(d), None)
}

/// [`findings`] with the device's view of the run that made the dump (the emulator's failed
/// checks).
pub fn findings_with_device(d: &Dump, device: &[DeviceCheck]) -> String {
    findings_text(d, &analyze(d), Some(device))
}

/// The whole report for a dump: reason, state, the ring records in sequence order (the error
/// CQE and its WQE marked `>>`), and the findings with the explanation.
pub fn report(d: &Dump) -> String {
    report_around(d, None)
}

/// As [`report`], but with `around = Some(n)` only the records within `n` places (in sequence
/// order) of the marked pair are decoded -- of the last `n` records when nothing is marked --
/// and the others are counted.
pub fn report_around(d: &Dump, around: Option<usize>) -> String {
    let mut s = String::new();
    s.push_str("flight recorder dump v1\n");
    if let Some(r) = &d.reason {
        let _ = writeln!(s, "reason: {r}");
    }
    s.push('\n');
    s.push_str(&state_text(d));
    let f = analyze(d);
    let marked: Vec<usize> = f
        .iter()
        .filter(|x| !x.is_flush())
        .take(1)
        .flat_map(|x| std::iter::once(x.cqe).chain(x.wqe))
        .collect();
    let mut order: Vec<usize> = (0..d.entries.len()).collect();
    order.sort_by_key(|&i| d.entries[i].seq);
    let _ = writeln!(
        s,
        "\nrecords, oldest first ({} WQEs, {} receive WQEs, {} CQEs):",
        d.entries.iter().filter(|e| e.kind == Kind::Wqe).count(),
        d.entries.iter().filter(|e| e.kind == Kind::Rwqe).count(),
        d.entries.iter().filter(|e| e.kind == Kind::Cqe).count()
    );
    let pos: Vec<usize> = order
        .iter()
        .enumerate()
        .filter(|(_, i)| marked.contains(i))
        .map(|(p, _)| p)
        .collect();
    let len = order.len();
    let shown = |p: usize| match around {
        None => true,
        Some(n) if pos.is_empty() => p + n >= len,
        Some(n) => pos.iter().any(|&m| p.abs_diff(m) <= n),
    };
    let mut hidden = 0;
    for (p, &i) in order.iter().enumerate() {
        if !shown(p) {
            hidden += 1;
            continue;
        }
        let mark = if marked.contains(&i) { ">>  " } else { "    " };
        s.push_str(&entry_text(d, &d.entries[i], mark));
    }
    if hidden > 0 {
        let _ = writeln!(
            s,
            "({hidden} records further from the error not shown; without --around all are)"
        );
    }
    if !d.skipped.is_empty() {
        let _ = writeln!(
            s,
            "skipped {} record(s) of unknown kinds (lines {:?})",
            d.skipped.len(),
            d.skipped
        );
    }
    s.push('\n');
    s.push_str(&findings_text(d, &f, None));
    s
}

/// The report as JSON: `reason`, `qps`, `cqs` (their fields by the dump's names), `records`
/// (each with `kind`, `queue`, `index`, `seq`, `line`, `marked` and `decoded`: the
/// `mlx5 decode` JSON of a WQE or CQE, the data segments of a receive WQE), `findings` (each
/// error CQE with `syndrome`, `vendor_err`, `status`, `wqe_seq` of the WQE it points to or
/// null, `cause`), `explanation` of the cause (`meaning`, `causes`, `check`) or null, and
/// `skipped_lines`.
pub fn report_json(d: &Dump) -> Value {
    let f = analyze(d);
    let cause = f.iter().position(|x| !x.is_flush());
    let marked: Vec<usize> = cause
        .map(|c| std::iter::once(f[c].cqe).chain(f[c].wqe).collect())
        .unwrap_or_default();
    let qps: Vec<Value> = d
        .qps
        .iter()
        .map(|q| {
            json!({
                "qpn": q.qpn, "type": q.qp_type, "state": q.state,
                "sq_wqe_cnt": q.sq_wqe_cnt, "sq_pi": q.sq_pi, "sq_ci": q.sq_ci,
                "sq_dbrec": q.sq_dbrec, "rq_wqe_cnt": q.rq_wqe_cnt, "rq_pi": q.rq_pi,
                "rq_ci": q.rq_ci, "rq_dbrec": q.rq_dbrec, "outstanding": q.outstanding,
            })
        })
        .collect();
    let cqs: Vec<Value> = d
        .cqs
        .iter()
        .map(|c| {
            json!({
                "cqn": c.cqn, "cqe_size": c.cqe_size, "cqe_cnt": c.cqe_cnt,
                "ci": c.ci, "dbrec_ci": c.dbrec_ci,
            })
        })
        .collect();
    let mut order: Vec<usize> = (0..d.entries.len()).collect();
    order.sort_by_key(|&i| d.entries[i].seq);
    let records: Vec<Value> = order
        .iter()
        .map(|&i| {
            let e = &d.entries[i];
            let decoded = match e.kind {
                Kind::Wqe => {
                    let ud = qp_type_of(d, e.queue) == Some("UD");
                    decode_wqe(&e.bytes, WqeOptions { ud })
                        .map_or_else(|err| json!({ "error": err }), |x| x.to_json())
                }
                Kind::Cqe => decode_cqe(&e.bytes, Some(e.bytes.len()))
                    .map_or_else(|err| json!({ "error": err }), |x| x.to_json()),
                Kind::Rwqe => {
                    let segs: Vec<Value> = e
                        .bytes
                        .chunks_exact(DS_SIZE)
                        .map(|c| {
                            let mut a = [0u8; 8];
                            a.copy_from_slice(&c[8..16]);
                            json!({
                                "byte_count": u32::from_be_bytes([c[0], c[1], c[2], c[3]]),
                                "lkey": u32::from_be_bytes([c[4], c[5], c[6], c[7]]),
                                "addr": u64::from_be_bytes(a),
                            })
                        })
                        .collect();
                    json!({ "segments": segs })
                }
            };
            json!({
                "kind": e.kind.word(), "queue": e.queue, "index": e.index, "seq": e.seq,
                "line": e.line, "marked": marked.contains(&i), "decoded": decoded,
            })
        })
        .collect();
    let findings: Vec<Value> = f
        .iter()
        .enumerate()
        .map(|(k, x)| {
            let e = &d.entries[x.cqe];
            json!({
                "cq": e.queue, "ci": e.index, "cqe_seq": e.seq,
                "opcode": x.opcode.name().unwrap_or("UNKNOWN"),
                "qpn": x.qpn, "wqe_counter": x.wqe_counter,
                "syndrome": { "value": x.syndrome.0, "name": x.syndrome.name() },
                "vendor_err": {
                    "value": x.vendor,
                    "meaning": mlx5_hw::syndrome::vendor_meaning(x.vendor.into()).map(|m| m.to_string()),
                },
                "status": x.syndrome.wc_status().name(),
                "wqe_seq": x.wqe.map(|w| d.entries[w].seq),
                "cause": Some(k) == cause,
            })
        })
        .collect();
    let explanation = cause
        .and_then(|c| {
            let ev = evidence_of(d, &f[c], None);
            explain(f[c].syndrome, f[c].vendor.into()).map(|x| (x, ev))
        })
        .map_or(Value::Null, |(x, ev)| {
            let ranked: Vec<Value> = mlx5_hw::syndrome::rank_causes(x, &pointers(&ev))
                .iter()
                .map(|(c, p)| json!({ "cause": c, "evidence": p.map(|p| p.name()) }))
                .collect();
            json!({ "meaning": x.meaning, "causes": x.causes, "check": x.check,
                    "ranked_causes": ranked, "evidence_wqe": ev.wqe,
                    "evidence_vendor": mlx5_hw::syndrome::Pointer::from_vendor(ev.syndrome, ev.vendor.into()).map(|p| p.name()) })
        });
    json!({
        "reason": d.reason, "qps": qps, "cqs": cqs, "records": records,
        "findings": findings, "explanation": explanation, "skipped_lines": d.skipped,
    })
}

/// `mlx5 diag`.
///
/// # Errors
/// No source given, an unreadable file, a dump that does not parse, or a failure of the live
/// run.
pub fn command(a: &crate::cli::DiagArgs) -> Result<(), String> {
    match (&a.dump, a.emu) {
        (Some(p), _) => {
            let text = if p.as_os_str() == "-" {
                std::io::read_to_string(std::io::stdin()).map_err(|e| format!("stdin: {e}"))?
            } else {
                std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?
            };
            let d = parse_dump(&text).map_err(|e| format!("{}: {e}", p.display()))?;
            if a.json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&report_json(&d)).map_err(|e| e.to_string())?
                );
            } else {
                print!("{}", report_around(&d, a.around));
            }
            Ok(())
        }
        (None, true) => {
            print!("{}", crate::live::diag_demo(a.save.as_deref())?);
            Ok(())
        }
        (None, false) => Err("give a recorder dump (--dump FILE) or --emu for a live run".into()),
    }
}
