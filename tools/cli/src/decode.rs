//! `mlx5 decode`: names every field of a send WQE or a CQE given as hex bytes, for hardware
//! bring-up and debugging.
//!
//! Input ([`parse_hex`]): hex bytes with any whitespace, commas, `0x` prefixes, `xxd` and
//! `hexdump -C` offset/ASCII columns, or `MLX5_EMU_WQE_LOG` record lines. The decoders
//! ([`decode_wqe`], [`decode_cqe`]) build one [`Decoded`] (sections of named fields plus
//! warnings) that is printed as text ([`Decoded::to_text`]) or JSON ([`Decoded::to_json`]).
//! They never panic: whatever does not add up (DS count vs. bytes given, segments past the
//! end, inline length beyond DS, ...) becomes a warning.

use mlx5_hw::cqe::{
    CQE_FORMAT_COMPRESSED, CQE_FORMAT_NORMAL, CQE_FORMAT_SCATTER_32, CQE_FORMAT_SCATTER_64,
    CQE_SIZE_64, CQE_SIZE_128, Cqe64, ErrCqe, Explanation, desc_offset, explain,
};
use mlx5_hw::opcodes::{
    CqeOpcode, OPMOD_MASKED_ATOMIC_4B, OPMOD_MASKED_ATOMIC_8B, SendOpcode, Syndrome, VendorSyndrome,
};
use mlx5_hw::wqe::{
    AtomicSeg, CtrlSeg, DS_SIZE, DataSeg, DatagramSeg, INLINE_SEG_FLAG, INVALID_LKEY,
    MaskedCs32Seg, MaskedCs64Seg, MaskedFa32Seg, MaskedFa64Seg, RaddrSeg, WQEBB_SIZE, ds_to_wqebbs,
    inline_ds,
};
use serde_json::{Map, Value, json};
use zerocopy::FromBytes;

/// Exit status: decoded, no warnings.
pub const EXIT_OK: i32 = 0;
/// Exit status: the input could not be read or is too short to decode at all.
pub const EXIT_INPUT_ERROR: i32 = 1;
/// Exit status: decoded, with warnings (printed after the fields).
pub const EXIT_WARNINGS: i32 = 2;

/// One decoded field.
#[derive(Clone, Debug, PartialEq)]
pub struct Field {
    /// Field name (rdma-core / PRM name where there is one).
    pub name: String,
    /// Machine-readable value: a number, a bool, a string, or `{"value": n, "name": ..}`.
    pub value: Value,
    /// Human-readable value.
    pub text: String,
}

/// A group of fields: one segment of a WQE or one view of a CQE.
#[derive(Clone, Debug, PartialEq)]
pub struct Section {
    /// Section name (`ctrl`, `raddr`, `data[0]`, `cqe`, `error`, ...).
    pub name: String,
    /// Byte offset of the section in the input.
    pub offset: usize,
    /// Its fields, in layout order.
    pub fields: Vec<Field>,
}

impl Section {
    fn new(name: impl Into<String>, offset: usize) -> Self {
        Self {
            name: name.into(),
            offset,
            fields: Vec::new(),
        }
    }

    /// The field called `name`, if present.
    pub fn field(&self, name: &str) -> Option<&Field> {
        self.fields.iter().find(|f| f.name == name)
    }

    fn push(&mut self, name: &str, value: Value, text: String) {
        self.fields.push(Field {
            name: name.to_owned(),
            value,
            text,
        });
    }
    /// A number shown in hex with `width` digits.
    fn hex(&mut self, name: &str, v: u64, width: usize) {
        self.push(name, json!(v), format!("{v:#0w$x}", w = width + 2));
    }
    /// A number shown in decimal.
    fn dec(&mut self, name: &str, v: u64) {
        self.push(name, json!(v), v.to_string());
    }
    /// A number with a name (and an optional meaning).
    fn named(&mut self, name: &str, v: u64, width: usize, label: &str) {
        self.push(
            name,
            json!({ "value": v, "name": label }),
            format!("{v:#0w$x} {label}", w = width + 2),
        );
    }
    fn flag(&mut self, name: &str, v: bool) {
        self.push(name, json!(v), if v { "yes" } else { "no" }.to_owned());
    }
    fn text(&mut self, name: &str, s: String) {
        self.push(name, json!(s), s);
    }
}

/// The result of a decode: what was decoded, its sections and its warnings.
#[derive(Clone, Debug, PartialEq)]
pub struct Decoded {
    /// `wqe` or `cqe`.
    pub kind: &'static str,
    /// Number of input bytes.
    pub len: usize,
    /// Sections in input order.
    pub sections: Vec<Section>,
    /// Inconsistencies found while decoding.
    pub warnings: Vec<String>,
    /// For an error CQE: the explanation of its syndrome pair (meaning, causes, what to check),
    /// printed after the sections as lines that begin with `meaning:`, `causes:` and `check:`.
    pub explanation: Option<&'static Explanation>,
}

impl Decoded {
    fn new(kind: &'static str, len: usize) -> Self {
        Self {
            kind,
            len,
            sections: Vec::new(),
            warnings: Vec::new(),
            explanation: None,
        }
    }

    /// The first section called `name`.
    pub fn section(&self, name: &str) -> Option<&Section> {
        self.sections.iter().find(|s| s.name == name)
    }

    /// The value of field `field` in section `section`.
    pub fn value(&self, section: &str, field: &str) -> Option<&Value> {
        self.section(section)?.field(field).map(|f| &f.value)
    }

    /// The text of field `field` in section `section`.
    pub fn text(&self, section: &str, field: &str) -> Option<&str> {
        self.section(section)?.field(field).map(|f| f.text.as_str())
    }

    /// Exit status for this result: [`EXIT_OK`] or [`EXIT_WARNINGS`].
    pub fn exit_code(&self) -> i32 {
        if self.warnings.is_empty() {
            EXIT_OK
        } else {
            EXIT_WARNINGS
        }
    }

    /// Human-readable text: a header line, one block per section, then the warnings.
    pub fn to_text(&self) -> String {
        let mut s = format!("{} ({} bytes)\n", self.kind.to_uppercase(), self.len);
        for sec in &self.sections {
            s.push_str(&format!("{} @ {:#06x}\n", sec.name, sec.offset));
            let w = sec.fields.iter().map(|f| f.name.len()).max().unwrap_or(0);
            for f in &sec.fields {
                let mut lines = f.text.lines();
                s.push_str(&format!(
                    "  {:w$} : {}\n",
                    f.name,
                    lines.next().unwrap_or("")
                ));
                for l in lines {
                    s.push_str(&format!("  {:w$}   {l}\n", ""));
                }
            }
        }
        if let Some(x) = self.explanation {
            for (k, t) in x.lines() {
                s.push_str(&format!("{k}: {t}\n"));
            }
        }
        for w in &self.warnings {
            s.push_str(&format!("warning: {w}\n"));
        }
        s
    }

    /// JSON: `{"kind", "bytes", "sections": [{"name", "offset", "fields": {name: value}}],
    /// "warnings": [..]}`, plus `"explanation": {"meaning", "causes", "check"}` for an error CQE
    /// whose syndrome is known.
    pub fn to_json(&self) -> Value {
        let sections: Vec<Value> = self
            .sections
            .iter()
            .map(|sec| {
                let fields: Map<String, Value> = sec
                    .fields
                    .iter()
                    .map(|f| (f.name.clone(), f.value.clone()))
                    .collect();
                json!({ "name": sec.name, "offset": sec.offset, "fields": fields })
            })
            .collect();
        let mut v = json!({
            "kind": self.kind,
            "bytes": self.len,
            "sections": sections,
            "warnings": self.warnings,
        });
        if let (Some(x), Some(o)) = (self.explanation, v.as_object_mut()) {
            o.insert(
                "explanation".into(),
                json!({ "meaning": x.meaning, "causes": x.causes, "check": x.check }),
            );
        }
        v
    }
}

// ---------------------------------------------------------------------------------------------
// Input parsing

/// Parse hex text into bytes. Accepted per line: tokens of hex digits (even length, optional
/// `0x`), separated by whitespace or commas; an `xxd` line (`OFFSET: hex  ascii`); a
/// `hexdump -C` line (`OFFSET  xx xx ..  |ascii|`); an `MLX5_EMU_WQE_LOG` record line
/// (`hca=.. qpn=.. idx=.. via=.. len=N HEX`; `late ..` lines are skipped); `#` starts a comment.
///
/// # Errors
/// A token that is not hex (with its line number), an odd number of digits, or no bytes.
pub fn parse_hex(text: &str) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let mut hexdump_c = false;
    for (n, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() || line.starts_with("late ") {
            continue;
        }
        if line.starts_with("hca=") {
            let rec = mlx5_emu::WqeRecord::parse_line(line)
                .ok_or_else(|| format!("line {}: malformed WQE log record", n + 1))?;
            out.extend_from_slice(&rec.bytes);
            continue;
        }
        let (toks, is_hexdump) = hex_tokens(line);
        hexdump_c |= is_hexdump;
        // `hexdump -C` ends with a line holding only the total length.
        if hexdump_c && toks.len() == 1 && is_offset(toks[0]) {
            continue;
        }
        for tok in toks {
            let t = tok
                .strip_prefix("0x")
                .or_else(|| tok.strip_prefix("0X"))
                .unwrap_or(tok);
            let shown: String = tok.chars().take(24).collect();
            let more = if tok.chars().count() > 24 { "..." } else { "" };
            if t.is_empty() || !t.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(format!("line {}: not hex: \"{shown}{more}\"", n + 1));
            }
            if t.len() % 2 != 0 {
                return Err(format!(
                    "line {}: odd number of hex digits in \"{shown}{more}\" (bytes need two each)",
                    n + 1
                ));
            }
            for i in (0..t.len()).step_by(2) {
                // Both digits are ASCII hex (checked above), so this cannot fail.
                out.push(u8::from_str_radix(&t[i..i + 2], 16).map_err(|e| e.to_string())?);
            }
        }
    }
    if out.is_empty() {
        return Err("no hex bytes in the input".into());
    }
    Ok(out)
}

/// An offset column: 7 or more hex digits.
fn is_offset(t: &str) -> bool {
    t.len() >= 7 && t.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The hex tokens of one line with offset and ASCII columns removed, and whether the line is
/// a `hexdump -C` line.
fn hex_tokens(line: &str) -> (Vec<&str>, bool) {
    // xxd: "00000010: 0a00 0000 ...  ascii" -- the hex area ends at the first double space.
    if let Some((off, rest)) = line.split_once(": ") {
        if !off.is_empty() && off.bytes().all(|b| b.is_ascii_hexdigit()) {
            let hex = rest.split("  ").next().unwrap_or("");
            return (words(hex), false);
        }
    }
    // hexdump -C: "00000010  0a 00 00 00 ...  |ascii|".
    if let Some((before, _ascii)) = line.split_once('|') {
        let toks = words(before);
        if toks.len() >= 2 && is_offset(toks[0]) && toks[1..].iter().all(|t| t.len() == 2) {
            return (toks[1..].to_vec(), true);
        }
        return (toks, false);
    }
    (words(line), false)
}

fn words(s: &str) -> Vec<&str> {
    s.split(|c: char| c.is_whitespace() || c == ',')
        .filter(|t| !t.is_empty())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// WQE

/// Options of a WQE decode.
#[derive(Clone, Copy, Debug, Default)]
pub struct WqeOptions {
    /// The WQE is on a UD QP: a 48-byte address vector follows the control segment.
    pub ud: bool,
}

/// The QP type a WQE was built for, as far as its layout depends on it: which transport
/// segment follows the control segment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WqeTransport {
    /// RC or UC: the operation's segments follow the control segment.
    #[default]
    Connected,
    /// UD: a 48-byte address vector before a SEND's data.
    Ud,
    /// XRC initiator: a 16-byte XRC segment (the remote XRC SRQ number) first.
    Xrc,
    /// DC initiator: a 48-byte address vector (DCT number, DC access key) first.
    Dci,
}

/// Read a `T` at `off`, if it fits.
fn at<T: FromBytes>(b: &[u8], off: usize) -> Option<T> {
    b.get(off..)
        .and_then(|rest| T::read_from_prefix(rest).ok())
        .map(|(v, _)| v)
}

fn send_opcode_label(op: SendOpcode) -> String {
    op.name()
        .map_or_else(|| "UNKNOWN".to_owned(), str::to_owned)
}

fn fence_name(fm: u8) -> &'static str {
    match fm {
        0 => "none",
        1 => "initiator small fence",
        2 => "fence",
        3 => "strong ordering",
        4 => "small fence and fence",
        _ => "reserved",
    }
}

fn ce_name(ce: u8) -> &'static str {
    match ce {
        0 => "CQE on error only (unsignaled)",
        2 => "CQ_UPDATE: always generate a CQE (signaled)",
        3 => "CQ_UPDATE and event (EQE)",
        _ => "reserved",
    }
}

/// Hexdump lines (16 bytes per line, offset relative to the payload start).
fn hexdump(b: &[u8]) -> String {
    if b.is_empty() {
        return "(empty)".into();
    }
    b.chunks(16)
        .enumerate()
        .map(|(i, c)| {
            let hex: Vec<String> = c.iter().map(|x| format!("{x:02x}")).collect();
            let asc: String = c
                .iter()
                .map(|&x| {
                    if x.is_ascii_graphic() || x == b' ' {
                        x as char
                    } else {
                        '.'
                    }
                })
                .collect();
            format!("{:04x}  {:<47}  |{asc}|", i * 16, hex.join(" "))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn hex_string(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Decode a send WQE: the control segment, then the segments its opcode implies.
///
/// # Errors
/// Fewer than 16 bytes (no control segment).
pub fn decode_wqe(b: &[u8], opt: WqeOptions) -> Result<Decoded, String> {
    let t = if opt.ud {
        WqeTransport::Ud
    } else {
        WqeTransport::Connected
    };
    decode_wqe_on(b, t)
}

/// Decode a send WQE of a QP of transport `t` (XRC and DC WQEs carry a transport segment
/// after the control segment: libmlx5 `mlx5_post_send`, docs/xrc-dc.md).
///
/// # Errors
/// Fewer than 16 bytes (no control segment).
pub fn decode_wqe_on(b: &[u8], t: WqeTransport) -> Result<Decoded, String> {
    let opt = WqeOptions {
        ud: t == WqeTransport::Ud,
    };
    let ctrl: CtrlSeg = at(b, 0).ok_or_else(|| {
        format!(
            "a WQE needs at least {DS_SIZE} bytes (the control segment), got {}",
            b.len()
        )
    })?;
    let mut d = Decoded::new("wqe", b.len());
    let op = ctrl.opcode();
    let ds = ctrl.ds() as usize;
    let wqe_len = ds * DS_SIZE;

    let mut s = Section::new("ctrl", 0);
    s.named("opcode", op.0.into(), 2, &send_opcode_label(op));
    s.hex("opmod", ctrl.opmod().into(), 2);
    s.dec("wqe_index", ctrl.wqe_index().into());
    s.hex("qpn", ctrl.qpn().into(), 6);
    s.dec("ds", ds as u64);
    s.dec("wqe_bytes", wqe_len as u64);
    s.dec("wqebbs", ds_to_wqebbs(ds as u32).into());
    s.hex("signature", ctrl.signature.into(), 2);
    s.hex(
        "dci_stream_channel_id",
        ctrl.dci_stream_channel_id.get().into(),
        4,
    );
    s.hex("fm_ce_se", ctrl.fm_ce_se.into(), 2);
    s.named(
        "fence_mode",
        ctrl.fence_mode().into(),
        1,
        fence_name(ctrl.fence_mode()),
    );
    s.named("ce", ctrl.ce().into(), 1, ce_name(ctrl.ce()));
    s.flag("cq_update", ctrl.ce() >= 2);
    s.flag("solicited", ctrl.solicited());
    let imm_name = match op {
        SendOpcode::SEND_IMM | SendOpcode::RDMA_WRITE_IMM => "immediate",
        SendOpcode::SEND_INVAL => "invalidate_rkey",
        _ => "imm",
    };
    s.hex(imm_name, ctrl.imm().into(), 8);
    d.sections.push(s);

    if ds == 0 {
        d.warnings
            .push("ds is 0: a WQE has at least the control segment (ds >= 1)".into());
    }
    if b.len() < wqe_len {
        d.warnings.push(format!(
            "ds = {ds} means {wqe_len} bytes but only {} were given; decoding those",
            b.len()
        ));
    } else if b.len() > wqe_len {
        let padded = ds_to_wqebbs(ds as u32) as usize * WQEBB_SIZE;
        if b.len() > padded.max(WQEBB_SIZE) {
            d.warnings.push(format!(
                "{} bytes given but ds = {ds} covers {wqe_len} (its WQEBBs {padded}); the rest is ignored",
                b.len()
            ));
        }
    }
    let end = wqe_len.min(b.len());
    let mut off = DS_SIZE;
    // A fixed-size segment at `off`: present and inside the WQE, else a warning.
    let seg = |d: &mut Decoded, off: usize, size: usize, what: &str| -> bool {
        if off + size > end {
            let why = if off + size > b.len() {
                "past the end of the input"
            } else {
                "past the end of the WQE (ds)"
            };
            d.warnings.push(format!(
                "{what} segment at offset {off:#x} ({size} bytes) expected for {} but it is {why}",
                send_opcode_label(op)
            ));
            return false;
        }
        true
    };

    let is_send = matches!(
        op,
        SendOpcode::SEND | SendOpcode::SEND_IMM | SendOpcode::SEND_INVAL
    );
    // XRC and DC: their transport segment comes first, for every operation (libmlx5 leaves
    // it out only for UMR-based ones and NOP).
    let umr = op == SendOpcode::UMR || op == SendOpcode::NOP;
    if t == WqeTransport::Xrc && !umr {
        if seg(&mut d, off, DS_SIZE, "XRC") {
            let srqn = at::<[u8; 4]>(b, off).map_or(0, u32::from_be_bytes);
            let mut s = Section::new("xrc", off);
            s.hex("xrc_srqn", srqn.into(), 6);
            let reserved = &b[off + 4..off + DS_SIZE];
            s.text("reserved", hex_string(reserved));
            if reserved.iter().any(|&x| x != 0) {
                d.warnings
                    .push("the XRC segment's reserved bytes 4..16 are not zero".into());
            }
            d.sections.push(s);
            off += DS_SIZE;
        } else {
            off = end;
        }
    }
    if t == WqeTransport::Dci && !umr {
        let size = size_of::<DatagramSeg>();
        if seg(&mut d, off, size, "DC address vector") {
            if let Some(av) = at::<DatagramSeg>(b, off) {
                let mut s = av_section(&av, off);
                s.name = "dc_av".into();
                s.hex("dctn", av.dqpn().into(), 6);
                s.hex("dc_key", av.key.get(), 16);
                d.sections.push(s);
            }
            off += size;
        } else {
            off = end;
        }
    }
    if opt.ud && is_send {
        let size = size_of::<DatagramSeg>();
        if seg(&mut d, off, size, "address vector") {
            if let Some(av) = at::<DatagramSeg>(b, off) {
                d.sections.push(av_section(&av, off));
            }
            off += size;
        } else {
            off = end;
        }
    }
    let remote = op.has_raddr();
    if remote {
        if seg(&mut d, off, DS_SIZE, "remote address") {
            if let Some(r) = at::<RaddrSeg>(b, off) {
                let mut s = Section::new("raddr", off);
                s.hex("raddr", r.raddr(), 16);
                s.hex("rkey", r.rkey().into(), 8);
                s.hex("reserved", r.reserved.get().into(), 8);
                d.sections.push(s);
            }
            off += DS_SIZE;
        } else {
            off = end;
        }
    }
    let atomic = atomic_segment(&mut d, b, off, end, op, ctrl.opmod());
    if let Some(size) = atomic {
        if seg(&mut d, off, size, "atomic") {
            off += size;
        } else {
            d.sections.retain(|s| s.name != "atomic");
            off = end;
        }
    }

    let known_layout = is_send || remote || op == SendOpcode::NOP;
    if !known_layout && off < end {
        d.warnings.push(format!(
            "opcode {} has segments this decoder does not know; shown raw",
            send_opcode_label(op)
        ));
        let mut s = Section::new("raw", off);
        s.text("bytes", hexdump(&b[off..end]));
        d.sections.push(s);
        return Ok(d);
    }
    data_segments(&mut d, b, off, end);
    if atomic.is_some() && op != SendOpcode::ATOMIC_MASKED_CS && op != SendOpcode::ATOMIC_MASKED_FA
    {
        if let Some(Value::Number(n)) = d.value("data[0]", "byte_count") {
            if n.as_u64() != Some(8) {
                d.warnings.push(format!(
                    "atomic result data segment has byte_count {n}, expected 8"
                ));
            }
        }
    }
    Ok(d)
}

/// The address-vector section of a UD WQE.
fn av_section(av: &DatagramSeg, off: usize) -> Section {
    let mut s = Section::new("av", off);
    s.hex("dqpn", av.dqpn().into(), 6);
    s.flag("extended_av", av.extended());
    s.hex("qkey", av.qkey().into(), 8);
    s.hex("key_low", av.key.get() & 0xFFFF_FFFF, 8);
    s.hex("rlid", av.rlid().into(), 4);
    s.dec("sl", av.sl().into());
    s.dec("stat_rate", av.stat_rate().into());
    s.flag("force_loopback", av.fl_mlid & 0x80 != 0);
    s.hex("src_path_bits", (av.fl_mlid & 0x7F).into(), 2);
    let mac: Vec<String> = av.rmac.iter().map(|x| format!("{x:02x}")).collect();
    s.text("rmac", mac.join(":"));
    s.hex("tclass", av.tclass.into(), 2);
    s.dec("hop_limit", av.hop_limit.into());
    s.flag("grh", av.grh());
    s.dec("sgid_index", av.sgid_index().into());
    s.hex("flow_label", av.flow_label().into(), 5);
    s.text("rgid", std::net::Ipv6Addr::from(av.rgid).to_string());
    s
}

/// Push the atomic section for atomic opcodes; returns its size (None: not an atomic).
fn atomic_segment(
    d: &mut Decoded,
    b: &[u8],
    off: usize,
    end: usize,
    op: SendOpcode,
    opmod: u8,
) -> Option<usize> {
    let mut s = Section::new("atomic", off);
    let fits = |size: usize| off + size <= end;
    let size = match (op, opmod) {
        (SendOpcode::ATOMIC_CS | SendOpcode::ATOMIC_FA, _) => {
            if let (true, Some(a)) = (fits(16), at::<AtomicSeg>(b, off)) {
                if op == SendOpcode::ATOMIC_CS {
                    s.hex("swap", a.swap_add(), 16);
                    s.hex("compare", a.compare(), 16);
                } else {
                    s.hex("add", a.swap_add(), 16);
                    s.hex("compare", a.compare(), 16);
                }
            }
            16
        }
        (SendOpcode::ATOMIC_MASKED_CS, OPMOD_MASKED_ATOMIC_4B) => {
            if let (true, Some(a)) = (fits(16), at::<MaskedCs32Seg>(b, off)) {
                s.hex("swap", a.swap.get().into(), 8);
                s.hex("compare", a.compare.get().into(), 8);
                s.hex("swap_mask", a.swap_mask.get().into(), 8);
                s.hex("compare_mask", a.compare_mask.get().into(), 8);
            }
            16
        }
        (SendOpcode::ATOMIC_MASKED_CS, OPMOD_MASKED_ATOMIC_8B) => {
            if let (true, Some(a)) = (fits(32), at::<MaskedCs64Seg>(b, off)) {
                s.hex("swap", a.swap.get(), 16);
                s.hex("compare", a.compare.get(), 16);
                s.hex("swap_mask", a.swap_mask.get(), 16);
                s.hex("compare_mask", a.compare_mask.get(), 16);
            }
            32
        }
        (SendOpcode::ATOMIC_MASKED_FA, OPMOD_MASKED_ATOMIC_4B) => {
            if let (true, Some(a)) = (fits(16), at::<MaskedFa32Seg>(b, off)) {
                s.hex("add", a.add.get().into(), 8);
                s.hex("field_boundary", a.field_boundary.get().into(), 8);
            }
            16
        }
        (SendOpcode::ATOMIC_MASKED_FA, OPMOD_MASKED_ATOMIC_8B) => {
            if let (true, Some(a)) = (fits(16), at::<MaskedFa64Seg>(b, off)) {
                s.hex("add", a.add.get(), 16);
                s.hex("field_boundary", a.field_boundary.get(), 16);
            }
            16
        }
        (SendOpcode::ATOMIC_MASKED_CS | SendOpcode::ATOMIC_MASKED_FA, m) => {
            d.warnings.push(format!(
                "masked atomic opmod {m:#04x} is not 0x08 (4-byte) or 0x09 (8-byte); operands not decoded"
            ));
            return None;
        }
        _ => return None,
    };
    if !s.fields.is_empty() {
        d.sections.push(s);
    }
    Some(size)
}

/// Data and inline segments from `off` to `end`.
fn data_segments(d: &mut Decoded, b: &[u8], mut off: usize, end: usize) {
    let mut n = 0;
    while off < end {
        let Some(word) = at::<[u8; 4]>(b, off).map(u32::from_be_bytes) else {
            d.warnings
                .push(format!("{} stray bytes at offset {off:#x}", end - off));
            return;
        };
        if word & INLINE_SEG_FLAG != 0 {
            let len = (word & !INLINE_SEG_FLAG) as usize;
            let avail = end.saturating_sub(off + 4);
            let mut s = Section::new("inline", off);
            s.dec("byte_count", len as u64);
            s.dec("ds", inline_ds(len as u32).into());
            if len > avail {
                d.warnings.push(format!(
                    "inline length {len} at offset {off:#x} goes beyond the WQE: only {avail} bytes follow"
                ));
            }
            let shown = &b[off + 4..off + 4 + len.min(avail)];
            s.push("data", json!(hex_string(shown)), hexdump(shown));
            d.sections.push(s);
            off += inline_ds(len as u32) as usize * DS_SIZE;
            continue;
        }
        let Some(ds) = at::<DataSeg>(b, off).filter(|_| off + DS_SIZE <= end) else {
            d.warnings.push(format!(
                "truncated data segment at offset {off:#x}: {} bytes",
                end - off
            ));
            return;
        };
        let mut s = Section::new(format!("data[{n}]"), off);
        let bc = ds.byte_count();
        if bc == 0 && !ds.is_terminator() {
            s.push("byte_count", json!(0), "0 (means 2 GiB)".to_owned());
        } else {
            s.dec("byte_count", bc.into());
        }
        if ds.lkey() == INVALID_LKEY {
            s.named(
                "lkey",
                INVALID_LKEY.into(),
                8,
                "MLX5_INVALID_LKEY (terminator)",
            );
        } else {
            s.hex("lkey", ds.lkey().into(), 8);
        }
        s.hex("addr", ds.addr(), 16);
        d.sections.push(s);
        n += 1;
        off += DS_SIZE;
    }
}

// ---------------------------------------------------------------------------------------------
// CQE

fn cqe_opcode_label(op: CqeOpcode) -> String {
    op.name()
        .map_or_else(|| "UNKNOWN".to_owned(), str::to_owned)
}

fn format_name(f: u8) -> &'static str {
    match f {
        CQE_FORMAT_NORMAL => "normal",
        CQE_FORMAT_SCATTER_32 => "scatter to CQE, 32 bytes",
        CQE_FORMAT_SCATTER_64 => "scatter to CQE, 64 bytes",
        CQE_FORMAT_COMPRESSED => "compressed (mini-CQE block)",
        _ => "reserved",
    }
}

/// Decode one CQE. `cqe_size` is 64 or 128 (`None`: from the input length, 128 if at least
/// 128 bytes are given). For 128-byte CQEs the descriptor is the second half.
///
/// # Errors
/// A `cqe_size` other than 64/128, or fewer bytes than one descriptor needs.
pub fn decode_cqe(b: &[u8], cqe_size: Option<usize>) -> Result<Decoded, String> {
    let size = match cqe_size {
        Some(s @ (CQE_SIZE_64 | CQE_SIZE_128)) => s,
        Some(s) => return Err(format!("CQE size must be 64 or 128, not {s}")),
        None if b.len() >= CQE_SIZE_128 => CQE_SIZE_128,
        None => CQE_SIZE_64,
    };
    let doff = desc_offset(size);
    let cqe: Cqe64 = at(b, doff).ok_or_else(|| {
        format!(
            "a {size}-byte CQE needs {} bytes (descriptor at offset {doff}), got {}",
            doff + CQE_SIZE_64,
            b.len()
        )
    })?;
    let mut d = Decoded::new("cqe", b.len());
    if b.len() != size {
        d.warnings.push(format!(
            "{} bytes given for a {size}-byte CQE; decoding the first {size}",
            b.len()
        ));
    }
    let op = cqe.opcode();
    let mut s = Section::new("cqe", doff);
    s.hex("op_own", cqe.op_own.into(), 2);
    s.named("opcode", op.0.into(), 1, &cqe_opcode_label(op));
    s.named("format", cqe.format().into(), 1, format_name(cqe.format()));
    s.flag("solicited", cqe.solicited());
    s.dec("owner", cqe.owner().into());
    s.dec("cqe_size", size as u64);

    if op.is_error() {
        // The same 64 bytes read through the error view.
        if let Some(e) = at::<ErrCqe>(b, doff) {
            s.hex("qpn", e.qpn().into(), 6);
            if op == CqeOpcode::REQ_ERR {
                let sop = e.send_opcode();
                s.named("send_opcode", sop.0.into(), 2, &send_opcode_label(sop));
            }
            s.dec("wqe_counter", e.wqe_counter().into());
            s.hex("srqn_uidx", e.user_index().into(), 6);
            s.hex("signature", e.signature.into(), 2);
            d.sections.push(s);
            d.sections.push(error_section(&e, doff));
            d.explanation = explain(e.syndrome(), e.vendor_syndrome());
        }
        return Ok(d);
    }

    let resp = op.is_responder();
    s.dec("byte_cnt", cqe.byte_cnt().into());
    s.hex("qpn", cqe.qpn().into(), 6);
    if op == CqeOpcode::REQ {
        let sop = cqe.send_opcode();
        s.named("send_opcode", sop.0.into(), 2, &send_opcode_label(sop));
    }
    s.dec("wqe_counter", cqe.wqe_counter().into());
    s.hex("srqn_uidx", cqe.user_index().into(), 6);
    match op {
        CqeOpcode::RESP_SEND_IMM | CqeOpcode::RESP_RDMA_WRITE_IMM => {
            s.hex("immediate", cqe.imm_inval_pkey().into(), 8)
        }
        CqeOpcode::RESP_SEND_INV => s.hex("invalidated_rkey", cqe.imm_inval_pkey().into(), 8),
        _ => s.hex("imm_inval_pkey", cqe.imm_inval_pkey().into(), 8),
    }
    if resp {
        s.hex("src_qp", cqe.src_qp().into(), 6);
        s.dec("sl", cqe.sl().into());
        let l3 = (cqe.flags_rqpn.get() >> 28) & 3;
        s.named(
            "grh_flags",
            l3.into(),
            1,
            match l3 {
                0 => "no L3 header",
                1 => "GRH/IP header in the receive buffer",
                2 => "GRH/IP header in the CQE",
                _ => "GRH/IP header (both bits)",
            },
        );
        s.flag("grh", cqe.has_grh());
        let l3t = (cqe.l4_hdr_type_etc >> 2) & 3;
        s.named(
            "l3_hdr_type",
            l3t.into(),
            1,
            match l3t {
                0 => "none",
                1 => "IPv6",
                2 => "IPv4",
                _ => "reserved",
            },
        );
        s.hex("slid", cqe.slid().into(), 4);
        s.hex("dlid_path_bits", cqe.dlid_path_bits().into(), 2);
        s.hex("vlan_info", cqe.vlan_info.get().into(), 4);
        s.hex("hds_ip_ext", cqe.hds_ip_ext.into(), 2);
    }
    s.hex("timestamp", cqe.timestamp(), 16);
    s.hex("wqe_id", cqe.wqe_id.get().into(), 4);
    s.hex("signature", cqe.signature.into(), 2);
    d.sections.push(s);

    match cqe.format() {
        CQE_FORMAT_SCATTER_32 => scatter(&mut d, b, doff, 32, cqe.byte_cnt()),
        CQE_FORMAT_SCATTER_64 => {
            if size == CQE_SIZE_128 {
                scatter(&mut d, b, 0, 64, cqe.byte_cnt());
            } else {
                d.warnings.push(
                    "format 2 (64-byte scatter) needs a 128-byte CQE; pass --cqe-size 128 with both halves"
                        .into(),
                );
            }
        }
        CQE_FORMAT_COMPRESSED => d.warnings.push(
            "format 3: a compressed CQE block (mini-CQEs); the fields above are of the title CQE"
                .into(),
        ),
        _ => {}
    }
    match op {
        CqeOpcode::INVALID => d.warnings.push(
            "opcode INVALID: the entry was never written by hardware (software initialisation)"
                .into(),
        ),
        op if op.name().is_none() => d.warnings.push(format!("unknown CQE opcode {:#x}", op.0)),
        _ => {}
    }
    Ok(d)
}

/// The inline payload of a scatter-to-CQE completion: `cap` bytes at `off`.
fn scatter(d: &mut Decoded, b: &[u8], off: usize, cap: usize, byte_cnt: u32) {
    let n = (byte_cnt as usize).min(cap);
    if byte_cnt as usize > cap {
        d.warnings.push(format!(
            "scatter-to-CQE with byte_cnt {byte_cnt} > {cap}: only {cap} bytes fit in the CQE"
        ));
    }
    let data = b.get(off..off + n).unwrap_or(&[]);
    let mut s = Section::new("scatter", off);
    s.dec("length", n as u64);
    s.push("data", json!(hex_string(data)), hexdump(data));
    d.sections.push(s);
}

/// Syndromes and what they mean for an error CQE.
fn error_section(e: &ErrCqe, off: usize) -> Section {
    let syn: Syndrome = e.syndrome();
    let ven: VendorSyndrome = e.vendor_syndrome();
    let st = syn.wc_status();
    let mut s = Section::new("error", off);
    s.named("syndrome", syn.0.into(), 2, syn.name().unwrap_or("UNKNOWN"));
    s.text(
        "meaning",
        syn.meaning().unwrap_or("unknown syndrome").to_owned(),
    );
    let st_name = mlx5_hw::opcodes::WcStatus::ALL
        .iter()
        .find(|(v, _, _)| *v == st)
        .map_or("", |(_, _, c)| *c);
    s.push(
        "wc_status",
        json!({ "value": st.0, "name": st_name }),
        format!("{} {st_name}", st.0),
    );
    s.named(
        "vendor_syndrome",
        ven.0.into(),
        2,
        ven.name().unwrap_or("UNKNOWN"),
    );
    // the device's own decoding of the byte first, then this crate's one-line meaning
    s.text(
        "vendor_meaning",
        mlx5_hw::syndrome::vendor_meaning(ven).map_or_else(
            || {
                ven.meaning()
                    .unwrap_or("unknown vendor syndrome")
                    .to_owned()
            },
            |m| m.to_string(),
        ),
    );
    s.hex("hw_err_synd", e.hw_err_synd.into(), 2);
    s.hex("hw_synd_type", (e.hw_synd_type >> 4).into(), 1);
    s
}

// ---------------------------------------------------------------------------------------------
// Command

/// What `mlx5 decode` decodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum What {
    /// A send WQE.
    Wqe,
    /// A CQE.
    Cqe,
}

/// Decode `input` (hex text) and return what to print and the exit status.
///
/// # Errors
/// Unreadable input or too few bytes (exit status [`EXIT_INPUT_ERROR`]).
pub fn run(
    what: What,
    input: &str,
    ud: bool,
    cqe_size: Option<usize>,
    as_json: bool,
) -> Result<(String, i32), String> {
    let t = if ud {
        WqeTransport::Ud
    } else {
        WqeTransport::Connected
    };
    run_on(what, input, t, cqe_size, as_json)
}

/// [`run`] for a WQE of transport `t` (`--xrc`, `--dc`).
///
/// # Errors
/// As [`run`].
pub fn run_on(
    what: What,
    input: &str,
    t: WqeTransport,
    cqe_size: Option<usize>,
    as_json: bool,
) -> Result<(String, i32), String> {
    if what == What::Wqe && input.lines().any(|l| l.trim_start().starts_with("hca=")) {
        return run_wqe_log(input, t, as_json);
    }
    let bytes = parse_hex(input)?;
    let d = match what {
        What::Wqe => decode_wqe_on(&bytes, t)?,
        What::Cqe => decode_cqe(&bytes, cqe_size)?,
    };
    let out = if as_json {
        let mut s = serde_json::to_string_pretty(&d.to_json()).map_err(|e| e.to_string())?;
        s.push('\n');
        s
    } else {
        d.to_text()
    };
    Ok((out, d.exit_code()))
}

/// Decode every record of an `MLX5_EMU_WQE_LOG` file, each under a `# hca=.. qpn=.. idx=..
/// via=..` line (JSON: an array of `{"record": {..}, ..decode}`); exit status: the worst.
fn run_wqe_log(input: &str, t: WqeTransport, as_json: bool) -> Result<(String, i32), String> {
    let records = mlx5_emu::WqeRecord::parse_log(input)?;
    let mut text = String::new();
    let mut docs = Vec::new();
    let mut code = EXIT_OK;
    for r in &records {
        let head = json!({
            "hca": r.hca, "qpn": r.qpn, "wqe_index": r.wqe_index, "via": r.via.name(),
        });
        match decode_wqe_on(&r.bytes, t) {
            Ok(d) => {
                code = code.max(d.exit_code());
                text.push_str(&format!(
                    "# hca={} qpn={:#08x} idx={} via={}\n{}\n",
                    r.hca,
                    r.qpn,
                    r.wqe_index,
                    r.via.name(),
                    d.to_text()
                ));
                let mut j = d.to_json();
                j["record"] = head;
                docs.push(j);
            }
            Err(e) => {
                code = code.max(EXIT_WARNINGS);
                text.push_str(&format!(
                    "# hca={} qpn={:#08x} idx={}\nwarning: {e}\n\n",
                    r.hca, r.qpn, r.wqe_index
                ));
                docs.push(json!({ "record": head, "error": e }));
            }
        }
    }
    if as_json {
        text = serde_json::to_string_pretty(&Value::Array(docs)).map_err(|e| e.to_string())?;
        text.push('\n');
    }
    Ok((text, code))
}

/// `mlx5 decode`: read the hex (arguments, else stdin), print the decode, return the exit
/// status ([`EXIT_OK`] or [`EXIT_WARNINGS`]).
///
/// # Errors
/// Unreadable input or too few bytes (the caller exits with [`EXIT_INPUT_ERROR`]).
pub fn command(a: &crate::cli::DecodeArgs) -> Result<i32, String> {
    let input = if a.hex.is_empty() {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)
            .map_err(|e| format!("reading stdin: {e}"))?;
        s
    } else {
        a.hex.join(" ")
    };
    let what = match a.what {
        crate::cli::DecodeWhat::Wqe => What::Wqe,
        crate::cli::DecodeWhat::Cqe => What::Cqe,
    };
    let size = a.cqe_size.as_deref().and_then(|s| s.parse().ok());
    let t = if a.xrc {
        WqeTransport::Xrc
    } else if a.dc {
        WqeTransport::Dci
    } else if a.ud {
        WqeTransport::Ud
    } else {
        WqeTransport::Connected
    };
    let (out, code) = run_on(what, &input, t, size, a.json)?;
    let mut stdout = std::io::stdout().lock();
    std::io::Write::write_all(&mut stdout, out.as_bytes())
        .and_then(|()| std::io::Write::flush(&mut stdout))
        .map_err(|e| format!("writing stdout: {e}"))?;
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    // The same 41 bytes as printed by `xxd`, `xxd -g1`, `hexdump -C` and `od -An -tx1`
    // (the ASCII columns hold double spaces and a '|', as real dumps can).
    const XXD: &str = "\
00000000: 0000 070a 001c 2d02 0000 0008 0000 0000  ......-.........
00000010: 4142 4344 2020 6566 6768 7c31 3233 3400  ABCD  efgh|1234.
00000020: 0000 0000 0000 0001 02                   .........
";
    const XXD_G1: &str = "\
00000000: 00 00 07 0a 00 1c 2d 02 00 00 00 08 00 00 00 00  ......-.........
00000010: 41 42 43 44 20 20 65 66 67 68 7c 31 32 33 34 00  ABCD  efgh|1234.
00000020: 00 00 00 00 00 00 00 01 02                       .........
";
    const HEXDUMP_C: &str = "\
00000000  00 00 07 0a 00 1c 2d 02  00 00 00 08 00 00 00 00  |......-.........|
00000010  41 42 43 44 20 20 65 66  67 68 7c 31 32 33 34 00  |ABCD  efgh|1234.|
00000020  00 00 00 00 00 00 00 01  02                       |.........|
00000029
";
    const OD: &str = "\
 00 00 07 0a 00 1c 2d 02 00 00 00 08 00 00 00 00
 41 42 43 44 20 20 65 66 67 68 7c 31 32 33 34 00
 00 00 00 00 00 00 00 01 02
";

    fn expected() -> Vec<u8> {
        let mut v = vec![0, 0, 7, 0x0a, 0, 0x1c, 0x2d, 2, 0, 0, 0, 8, 0, 0, 0, 0];
        v.extend_from_slice(b"ABCD  efgh|1234\0");
        v.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 1, 2]);
        v
    }

    #[test]
    fn parse_dump_formats() {
        for (what, text) in [
            ("xxd", XXD),
            ("xxd -g1", XXD_G1),
            ("hexdump -C", HEXDUMP_C),
            ("od", OD),
        ] {
            assert_eq!(parse_hex(text).as_deref(), Ok(&expected()[..]), "{what}");
        }
    }

    #[test]
    fn parse_separators_prefixes_comments() {
        let want = vec![0x0a, 0x0b, 0x0c, 0x0d, 0xee, 0xff];
        for text in [
            "0a0b0c0d eeff",
            "0x0a0b0c0d,0xeeff",
            "0a, 0b, 0c, 0d,\n\tee ff  # trailing comment",
            "# header\n0X0A0B 0C0D\n\nEEFF\n",
        ] {
            assert_eq!(parse_hex(text), Ok(want.clone()), "{text:?}");
        }
    }

    #[test]
    fn parse_emu_wqe_log_lines() {
        let rec = mlx5_emu::WqeRecord {
            hca: 0,
            qpn: 0x1c2d,
            wqe_index: 5,
            via: mlx5_emu::WqeVia::BlueFlame,
            bytes: expected()[..32].to_vec(),
        };
        let text = format!("{}\nlate hca=0 qpn=0x001c2d idx=5 via=db\n", rec.to_line());
        assert_eq!(parse_hex(&text), Ok(rec.bytes.clone()));
        assert!(parse_hex("hca=0 qpn=zz").unwrap_err().contains("line 1"));
    }

    #[test]
    fn parse_errors_name_the_line_and_token() {
        let e = parse_hex("0a0b\n0c 0g").unwrap_err();
        assert!(
            e.contains("line 2") && e.contains("not hex") && e.contains("0g"),
            "{e}"
        );
        let e = parse_hex("abc").unwrap_err();
        assert!(e.contains("odd number"), "{e}");
        assert!(
            parse_hex(" \n# only a comment\n")
                .unwrap_err()
                .contains("no hex")
        );
        assert!(parse_hex("0x").is_err());
        let long = "z".repeat(500);
        assert!(parse_hex(&long).unwrap_err().len() < 100);
    }

    /// xorshift64*: deterministic pseudo-random bytes for the fuzz loops.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn bytes(&mut self, n: usize) -> Vec<u8> {
            (0..n).map(|_| self.next() as u8).collect()
        }
    }

    /// Every section starts inside the input, and the text and JSON renderings hold every
    /// section and warning.
    fn check(d: &Decoded) {
        for s in &d.sections {
            assert!(s.offset < d.len, "{} at {} of {}", s.name, s.offset, d.len);
        }
        let j = d.to_json();
        assert_eq!(
            j["sections"].as_array().map(Vec::len),
            Some(d.sections.len())
        );
        assert_eq!(
            j["warnings"].as_array().map(Vec::len),
            Some(d.warnings.len())
        );
        assert_eq!(d.to_text().matches("warning: ").count(), d.warnings.len());
    }

    #[test]
    fn fuzz_random_bytes_never_panic() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let opcodes: Vec<u8> = SendOpcode::ALL.iter().map(|(o, _, _)| o.0).collect();
        let mut warned = 0;
        for i in 0..20_000 {
            let len = (rng.next() % 300) as usize;
            let mut b = rng.bytes(len);
            // Half the time a known opcode, so the segment walkers see garbage too.
            if i % 2 == 0 && len > 3 {
                b[3] = opcodes[(rng.next() as usize) % opcodes.len()];
                if len > 7 && i % 4 == 0 {
                    b[7] = (b[7] & 0xC0) | ((rng.next() % 20) as u8);
                }
            }
            for ud in [false, true] {
                match decode_wqe(&b, WqeOptions { ud }) {
                    Ok(d) => {
                        check(&d);
                        warned += usize::from(!d.warnings.is_empty());
                    }
                    Err(e) => assert!(len < DS_SIZE, "{e}"),
                }
            }
            for size in [None, Some(64), Some(128)] {
                match decode_cqe(&b, size) {
                    Ok(d) => check(&d),
                    Err(e) => assert!(len < size.unwrap_or(64), "{e}"),
                }
            }
        }
        // Random WQEs are nearly always inconsistent.
        assert!(warned > 10_000, "{warned}");
    }

    #[test]
    fn fuzz_random_text_never_panics() {
        let mut rng = Rng(12345);
        let alphabet = b"0123456789abcdefABCDEFxX:|#, \t\n=hcaqpnlte\xc3\xa9";
        for _ in 0..20_000 {
            let len = (rng.next() % 120) as usize;
            let raw: Vec<u8> = (0..len)
                .map(|_| alphabet[(rng.next() as usize) % alphabet.len()])
                .collect();
            let text = String::from_utf8_lossy(&raw);
            if let Ok(b) = parse_hex(&text) {
                assert!(!b.is_empty());
                let _ = decode_wqe(&b, WqeOptions::default());
            }
        }
    }
}
