//! The flight recorder: the last N WQEs posted and CQEs seen per queue, dumped as text when an
//! error CQE arrives or on demand. Off by default; the format is in `docs/flight-recorder.md`.
//!
//! # Cost when off
//! Nothing new is tested on the posting path. A recording send queue keeps its posting credits
//! at zero, so every post takes the out-of-line credit re-count that exists anyway, and that
//! records the WQEs finished since the last post. Receive posting does nothing at all (see
//! below). A recording CQ sets format bits in a mask the poller ORs into the CQE's `op_own`
//! before its kind test (one instruction), which sends every CQE to the out-of-line decoder,
//! and that records it.
//!
//! # When WQEs are recorded
//! A WQE is copied out of the ring once it is complete: send WQEs at the next post of their
//! queue; send and receive WQEs before the recording poller records a CQE of their QP (up to
//! what the doorbell record publishes), and when a dump is taken. A slot is reused only after
//! its WQE completed, so a WQE is recorded before anything can overwrite it, as long as its
//! completion goes through a recording CQ (otherwise a receive queue keeps the last `wqe_cnt`
//! in its ring). A `wqe` line therefore precedes the `cqe` line of its completion, and its bytes
//! are the bytes the device was given.
//!
//! # Locking
//! Each recorder has its own mutex, taken only by recording queues (never on the default path)
//! and never two at once.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use mlx5_hw::cqe::Cqe64;
use mlx5_hw::opcodes::{CqeOpcode, Syndrome};
use zerocopy::IntoBytes;

use crate::mem::wq::WqReader;
use crate::mem::{DbRec, TakenCqe};
use crate::types::{QpState, QpType};

/// What a dump handed to a [`RecorderConfig::callback`] carries.
#[derive(Clone, Debug)]
pub struct RecorderDump {
    /// Why it was taken (the `reason` line).
    pub reason: String,
    /// The whole dump, in the flight-recorder format v1.
    pub text: String,
    /// The file it was written to, if any.
    pub path: Option<PathBuf>,
}

/// A function called with every dump taken on an error CQE.
pub type RecorderCallback = Arc<dyn Fn(&RecorderDump) + Send + Sync>;

/// How a queue's flight recorder is set up ([`Qp::enable_recorder`](crate::Qp::enable_recorder),
/// [`Cq::enable_recorder`](crate::Cq::enable_recorder)).
#[derive(Clone)]
pub struct RecorderConfig {
    /// Records kept per queue (the oldest dropped first); at least 1.
    pub records: usize,
    /// Where dumps taken on error CQEs are written (one file each); `None`: the directory in
    /// the environment variable `MLX5_RECORDER_DIR`, if set.
    pub dir: Option<PathBuf>,
    /// Called with every dump taken on an error CQE.
    pub callback: Option<RecorderCallback>,
}

impl RecorderConfig {
    /// `records` records per queue, dumps to `MLX5_RECORDER_DIR` if set, no callback.
    pub fn new(records: usize) -> Self {
        Self {
            records,
            dir: None,
            callback: None,
        }
    }
}

impl core::fmt::Debug for RecorderConfig {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RecorderConfig")
            .field("records", &self.records)
            .field("dir", &self.dir)
            .field("callback", &self.callback.is_some())
            .finish()
    }
}

/// The recorder-wide order of records (all queues of the process).
static SEQ: AtomicU64 = AtomicU64::new(0);

fn next_seq() -> u64 {
    SEQ.fetch_add(1, Ordering::Relaxed)
}

/// One recorded WQE or CQE: its index (WQEBB counter, RQ index or consumer index), its
/// sequence number and its bytes.
#[derive(Clone, Debug)]
struct Record {
    index: u32,
    seq: u64,
    bytes: Vec<u8>,
}

/// At most `cap` records, oldest first. Once full, a new record reuses the oldest one's
/// buffer: recording allocates nothing in steady state.
#[derive(Debug)]
struct Records {
    cap: usize,
    items: VecDeque<Record>,
}

impl Records {
    fn new(cap: usize) -> Self {
        Self {
            cap: cap.max(1),
            items: VecDeque::new(),
        }
    }

    /// Add a record of `len` bytes, which `fill` writes.
    fn push_with(&mut self, index: u32, len: usize, fill: impl FnOnce(&mut [u8])) {
        let mut r = if self.items.len() == self.cap {
            self.items.pop_front().unwrap_or_else(|| Record {
                index: 0,
                seq: 0,
                bytes: Vec::new(),
            })
        } else {
            Record {
                index: 0,
                seq: 0,
                bytes: Vec::with_capacity(len),
            }
        };
        r.bytes.clear();
        r.bytes.resize(len, 0);
        fill(&mut r.bytes);
        r.index = index;
        r.seq = next_seq();
        self.items.push_back(r);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Where dumps go.
#[derive(Clone)]
struct Sink {
    dir: Option<PathBuf>,
    callback: Option<RecorderCallback>,
}

impl core::fmt::Debug for Sink {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Sink").field("dir", &self.dir).finish()
    }
}

impl Sink {
    fn new(cfg: &RecorderConfig) -> Self {
        Self {
            dir: cfg
                .dir
                .clone()
                .or_else(|| std::env::var_os("MLX5_RECORDER_DIR").map(PathBuf::from)),
            callback: cfg.callback.clone(),
        }
    }
}

/// The send side of a QP's recorder.
#[derive(Debug)]
struct SqSide {
    ring: WqReader,
    /// WQEBBs in the ring.
    wqe_cnt: u32,
    /// WQEBB counter of the first WQE not recorded yet.
    next: u32,
    /// WRs recorded (free-running), i.e. the ordinal of `next`.
    ords: u32,
    dbrec: Arc<DbRec>,
    records: Records,
}

/// The receive side of a QP's recorder.
#[derive(Debug)]
struct RqSide {
    ring: WqReader,
    stride: u32,
    wqe_cnt: u32,
    /// Index (free-running) of the first receive WQE not recorded yet.
    next: u32,
    dbrec: Arc<DbRec>,
    records: Records,
}

#[derive(Debug)]
struct QpRec {
    qpn: u32,
    qp_type: QpType,
    state: QpState,
    sq: Option<SqSide>,
    rq: Option<RqSide>,
}

/// A QP's recorder, shared by its send queue, its receive queue and the pollers of its CQs.
#[derive(Debug)]
pub(crate) struct QpRecorder {
    m: Mutex<QpRec>,
    sink: Sink,
}

impl QpRec {
    /// Record the send WQEs from `next` up to WQEBB counter `to` (complete WQEs only).
    fn capture_sq(&mut self, to: u32) {
        let Some(sq) = self.sq.as_mut() else { return };
        let mut budget = sq.wqe_cnt;
        while sq.next != to && budget > 0 {
            let pos = (sq.next & (sq.wqe_cnt - 1)) as usize * 64;
            let ds = u32::from(sq.ring.seg16(pos)[7] & 0x3F);
            let nbb = ds.div_ceil(4).max(1);
            if nbb > to.wrapping_sub(sq.next) || nbb > budget {
                // Not a WQE boundary (cannot happen with complete WQEs): skip to the end.
                sq.next = to;
                break;
            }
            let ring = &sq.ring;
            sq.records
                .push_with(sq.next & 0xFFFF, nbb as usize * 64, |b| ring.read(pos, b));
            sq.next = sq.next.wrapping_add(nbb);
            sq.ords = sq.ords.wrapping_add(1);
            budget -= nbb;
        }
    }

    /// Record the receive WQEs from `next` up to index `to`.
    fn capture_rq(&mut self, to: u32) {
        let Some(rq) = self.rq.as_mut() else { return };
        // Slots hold the last `wqe_cnt` WQEs written: older ones are gone (no recording CQ
        // recorded them before they were reused).
        if to.wrapping_sub(rq.next) > rq.wqe_cnt {
            rq.next = to.wrapping_sub(rq.wqe_cnt);
        }
        let mut budget = rq.wqe_cnt;
        while rq.next != to && budget > 0 {
            let pos = (rq.next & (rq.wqe_cnt - 1)) as usize * rq.stride as usize;
            let ring = &rq.ring;
            rq.records
                .push_with(rq.next & 0xFFFF, rq.stride as usize, |b| ring.read(pos, b));
            rq.next = rq.next.wrapping_add(1);
            budget -= 1;
        }
        rq.next = to;
    }

    /// Record every WQE the doorbell records publish (what the device may have consumed).
    ///
    /// The records hold 16-bit counters. One behind the recorded position (the send queue
    /// records finished WQEs before it rings them; a dump records everything written) means
    /// there is nothing new.
    fn capture_published(&mut self) {
        if let Some(sq) = &self.sq {
            let rung = sq.dbrec.word1().load_be32() & 0xFFFF;
            if let Some(to) = ahead16(sq.next, rung) {
                self.capture_sq(to);
            }
        }
        if let Some(rq) = &self.rq {
            let posted = rq.dbrec.word0().load_be32() & 0xFFFF;
            if let Some(to) = ahead16(rq.next, posted) {
                self.capture_rq(to);
            }
        }
    }
}

impl QpRecorder {
    pub(crate) fn new(cfg: &RecorderConfig, qpn: u32, qp_type: QpType, state: QpState) -> Self {
        Self {
            m: Mutex::new(QpRec {
                qpn,
                qp_type,
                state,
                sq: None,
                rq: None,
            }),
            sink: Sink::new(cfg),
        }
    }

    /// Attach the send ring (`wqe_cnt` WQEBBs, producer at `cur_post` with `head` WRs built:
    /// recording starts there).
    pub(crate) fn attach_sq(
        &self,
        ring: WqReader,
        wqe_cnt: u32,
        cur_post: u32,
        head: u32,
        dbrec: Arc<DbRec>,
        records: usize,
    ) {
        lock(&self.m).sq = Some(SqSide {
            ring,
            wqe_cnt,
            next: cur_post,
            ords: head,
            dbrec,
            records: Records::new(records),
        });
    }

    /// Attach the receive ring (recording starts at index `head`).
    pub(crate) fn attach_rq(
        &self,
        ring: WqReader,
        stride: u32,
        wqe_cnt: u32,
        head: u32,
        dbrec: Arc<DbRec>,
        records: usize,
    ) {
        lock(&self.m).rq = Some(RqSide {
            ring,
            stride,
            wqe_cnt,
            next: head,
            dbrec,
            records: Records::new(records),
        });
    }

    /// The send queue went back to its start (QP reset).
    pub(crate) fn sq_reset(&self, ords: u32) {
        if let Some(s) = lock(&self.m).sq.as_mut() {
            s.next = 0;
            s.ords = ords;
        }
    }

    /// The receive queue went back to its start (QP reset).
    pub(crate) fn rq_reset(&self) {
        if let Some(q) = lock(&self.m).rq.as_mut() {
            q.next = 0;
        }
    }

    /// The send queue finished every WQE before WQEBB counter `cur_post`.
    pub(crate) fn sq_posted(&self, cur_post: u32) {
        lock(&self.m).capture_sq(cur_post);
    }

    /// The receive queue wrote every WQE before index `head`.
    pub(crate) fn rq_posted(&self, head: u32) {
        lock(&self.m).capture_rq(head);
    }

    /// The QP moved to `state`.
    pub(crate) fn set_state(&self, state: QpState) {
        lock(&self.m).state = state;
    }

    /// Before a CQE of this QP is recorded: record the WQEs it may complete.
    pub(crate) fn before_cqe(&self) {
        lock(&self.m).capture_published();
    }

    /// The `qp` line and the WQE records (as `(seq, line)`), after recording what the doorbell
    /// records publish. `sq`/`rq` give the pollers' side (retired counts).
    fn report(
        &self,
        sq: Option<&dyn SqRetired>,
        rq: Option<&dyn RqRetired>,
        out: &mut String,
        lines: &mut Vec<(u64, String)>,
    ) {
        let mut r = lock(&self.m);
        r.capture_published();
        let ty = match r.qp_type {
            QpType::Rc => "RC",
            QpType::Uc => "UC",
            QpType::Ud => "UD",
            QpType::XrcSend => "XRC_SEND",
            QpType::Dci => "DCI",
            QpType::RawPacket => "RAW_PACKET",
        };
        let st = match r.state {
            QpState::Reset => "RESET",
            QpState::Init => "INIT",
            QpState::Rtr => "RTR",
            QpState::Rts => "RTS",
            QpState::Sqd => "SQD",
            QpState::Sqe => "SQE",
            QpState::Err => "ERR",
        };
        let qpn = r.qpn;
        let (mut sq_cnt, mut sq_pi, mut sq_ci, mut sq_db, mut outstanding) = (0, 0, 0, 0, 0);
        if let Some(s) = &r.sq {
            sq_cnt = s.wqe_cnt;
            sq_pi = s.next;
            sq_db = s.dbrec.word1().load_be32();
            let tail = sq.map_or(s.ords, |q| q.retired());
            outstanding = s.ords.wrapping_sub(tail);
            // The WQEBB counter of the oldest outstanding WR, or the producer if none.
            sq_ci = match sq {
                Some(q) if outstanding != 0 => q.start_before(tail, s.next).unwrap_or(s.next),
                _ => s.next,
            };
            for rec in &s.records.items {
                lines.push((
                    rec.seq,
                    format!(
                        "wqe 0x{qpn:x} {} {} {}",
                        rec.index,
                        rec.seq,
                        hex(&rec.bytes)
                    ),
                ));
            }
        }
        let (mut rq_cnt, mut rq_pi, mut rq_ci, mut rq_db) = (0, 0, 0, 0);
        if let Some(q) = &r.rq {
            rq_cnt = q.wqe_cnt;
            rq_pi = q.next;
            rq_db = q.dbrec.word0().load_be32();
            rq_ci = rq.map_or(q.next, |x| x.retired());
            for rec in &q.records.items {
                lines.push((
                    rec.seq,
                    format!(
                        "rwqe 0x{qpn:x} {} {} {}",
                        rec.index,
                        rec.seq,
                        hex(&rec.bytes)
                    ),
                ));
            }
        }
        let _ = writeln!(
            out,
            "qp 0x{qpn:x} type {ty} state {st} sq_wqe_cnt {sq_cnt} sq_pi {sq_pi} sq_ci {sq_ci} \
             sq_dbrec {sq_db} rq_wqe_cnt {rq_cnt} rq_pi {rq_pi} rq_ci {rq_ci} rq_dbrec {rq_db} \
             outstanding {outstanding}"
        );
    }
}

#[derive(Debug)]
struct CqRec {
    cqe_size: u32,
    cqe_cnt: u32,
    /// The ring's geometry, to find an entry's slot ([`TakenCqe::slot`]).
    geometry: (usize, u8, u32),
    /// The consumer index after the last CQE recorded.
    ci: u32,
    records: Records,
}

/// A CQ's recorder, shared by its poller and the QPs using it.
#[derive(Debug)]
pub(crate) struct CqRecorder {
    m: Mutex<CqRec>,
    sink: Sink,
}

impl CqRecorder {
    pub(crate) fn new(
        cfg: &RecorderConfig,
        cqe_size: u32,
        geometry: (usize, u8, u32),
        ci: u32,
    ) -> Self {
        Self {
            m: Mutex::new(CqRec {
                cqe_size,
                cqe_cnt: geometry.2 + 1,
                geometry,
                ci,
                records: Records::new(cfg.records),
            }),
            sink: Sink::new(cfg),
        }
    }

    /// Record the CQE taken as `t`: its 64-byte descriptor, after the first half of a 128-byte
    /// entry. Its consumer index is the first at or after the last one recorded that has its
    /// slot (entries the poller skipped, such as CQEs of a destroyed QP, are not recorded).
    pub(crate) fn record(&self, t: &TakenCqe<'_>, first_half: Option<&[u8; 64]>, cqe: &Cqe64) {
        let mut r = lock(&self.m);
        let mask = r.geometry.2;
        let ci =
            r.ci.wrapping_add(t.slot(r.geometry).wrapping_sub(r.ci) & mask);
        let len = if first_half.is_some() { 128 } else { 64 };
        r.records.push_with(ci, len, |b| {
            let (h, d) = b.split_at_mut(len - 64);
            if let Some(f) = first_half {
                h.copy_from_slice(f);
            }
            d.copy_from_slice(cqe.as_bytes());
        });
        r.ci = ci.wrapping_add(1);
    }

    fn report(&self, cqn: u32, dbrec_ci: u32, out: &mut String, lines: &mut Vec<(u64, String)>) {
        let r = lock(&self.m);
        let _ = writeln!(
            out,
            "cq 0x{cqn:x} cqe_size {} cqe_cnt {} ci {} dbrec_ci {dbrec_ci}",
            r.cqe_size, r.cqe_cnt, r.ci
        );
        for rec in &r.records.items {
            lines.push((
                rec.seq,
                format!(
                    "cqe 0x{cqn:x} {} {} {}",
                    rec.index,
                    rec.seq,
                    hex(&rec.bytes)
                ),
            ));
        }
    }
}

/// One QP's part of a dump.
pub(crate) struct QpPart<'a> {
    pub rec: &'a QpRecorder,
    pub sq: Option<&'a dyn SqRetired>,
    pub rq: Option<&'a dyn RqRetired>,
}

/// What a dump reads of a send queue's completion side. The ledger implements it: the recorder
/// sits below the ledger (which holds each queue's recorder), so it names no ledger type.
pub(crate) trait SqRetired {
    /// WRs retired by completions so far (free-running).
    fn retired(&self) -> u32;
    /// The WQEBB counter where WR `ordinal` starts, searched backwards from counter `from`.
    fn start_before(&self, ordinal: u32, from: u32) -> Option<u32>;
}

/// What a dump reads of a receive queue's completion side (see [`SqRetired`]).
pub(crate) trait RqRetired {
    /// Receives retired by completions so far (free-running).
    fn retired(&self) -> u32;
}

/// One CQ's part of a dump.
pub(crate) struct CqPart<'a> {
    pub rec: &'a CqRecorder,
    pub cqn: u32,
    pub dbrec_ci: u32,
}

/// The dump text (format v1): header, reason, the `qp` and `cq` lines, then every record in
/// sequence order.
pub(crate) fn dump_text(reason: &str, qps: &[QpPart<'_>], cqs: &[CqPart<'_>]) -> String {
    let mut out = String::from("mlx5-flight-recorder v1\n");
    let _ = writeln!(out, "reason {}", reason.replace('\n', " "));
    let mut lines = Vec::new();
    for q in qps {
        q.rec.report(q.sq, q.rq, &mut out, &mut lines);
    }
    for c in cqs {
        c.rec.report(c.cqn, c.dbrec_ci, &mut out, &mut lines);
    }
    lines.sort_by_key(|l| l.0);
    for (_, l) in lines {
        out.push_str(&l);
        out.push('\n');
    }
    out
}

/// The free-running counter that `low16` (a 16-bit counter) names at or after `next`, or
/// `None` if it names one before `next` (differences of 2^15 and more count as before).
fn ahead16(next: u32, low16: u32) -> Option<u32> {
    let d = low16.wrapping_sub(next) & 0xFFFF;
    (d < 0x8000).then(|| next.wrapping_add(d))
}

fn hex(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len() * 2);
    for x in b {
        let _ = write!(s, "{x:02x}");
    }
    s
}

/// Whether `cqe` is an error CQE worth a dump (flush errors are the consequence of an earlier
/// one) and the reason line for it.
pub(crate) fn error_reason(cqn: u32, cqe: &Cqe64) -> Option<String> {
    match cqe.opcode() {
        CqeOpcode::REQ_ERR | CqeOpcode::RESP_ERR => {
            let err: mlx5_hw::cqe::ErrCqe = zerocopy::transmute!(*cqe);
            let syn = err.syndrome();
            if syn == Syndrome::WR_FLUSH {
                return None;
            }
            let side = if cqe.opcode() == CqeOpcode::REQ_ERR {
                "requester"
            } else {
                "responder"
            };
            Some(format!(
                "error CQE on cq 0x{cqn:x}: {} ({side}, syndrome 0x{:02x}, vendor syndrome 0x{:02x}, qpn 0x{:x}, wqe_counter {})",
                syn.wc_status(),
                syn.0,
                err.vendor_syndrome().0,
                cqe.qpn(),
                cqe.wqe_counter()
            ))
        }
        _ => None,
    }
}

/// Hand a dump taken on an error CQE to its sinks: a file in the directory (named after the
/// process and a fresh sequence number) and the callback. The CQ's directory and callback are
/// used if it has them, else the QP's.
pub(crate) fn deliver(reason: String, text: String, cq: &CqRecorder, qp: Option<&QpRecorder>) {
    let dir = cq
        .sink
        .dir
        .as_deref()
        .or_else(|| qp.and_then(|q| q.sink.dir.as_deref()));
    let path = dir.and_then(|d| write_file(d, &text));
    let dump = RecorderDump { reason, text, path };
    let cb = cq
        .sink
        .callback
        .as_ref()
        .or_else(|| qp.and_then(|q| q.sink.callback.as_ref()));
    if let Some(cb) = cb {
        cb(&dump);
    }
}

fn write_file(dir: &Path, text: &str) -> Option<PathBuf> {
    let p = dir.join(format!(
        "mlx5-recorder-{}-{}.txt",
        std::process::id(),
        next_seq()
    ));
    std::fs::write(&p, text.as_bytes()).ok().map(|()| p)
}
