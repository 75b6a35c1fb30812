//! A live run on the in-process emulator for the diagnostics commands: two RC QPs of one
//! emulated HCA connected to each other ([`Pair`]), SENDs between them, and a forced error.
//!
//! `mlx5 counters --emu --load send` uses [`Pair::sends`] between its samples; `mlx5 diag --emu`
//! ([`diag_demo`]) posts a few SENDs, then one whose gather entry names a key that does not
//! exist, and prints the driver's view of the QP next to the emulator's view of it.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mlx5::{
    Access, Context, Cq, CqInit, DmaBuf, Mr, Pd, Qp, QpCap, QpInitAttr, QpState, QpType,
    RecorderConfig, RecorderDump, RecvWr, RemoteQp, SendFlags, SendWr, Sge, WorkCompletion, WrOp,
};
use mlx5_emu::{EmuConfig, Emulator, Fabric};
use mlx5_hw::opcodes::CqeOpcode;
use zerocopy::FromBytes;

use crate::decode::{WqeOptions, decode_wqe};

/// Bytes of each end's buffer: `[tx | rx]`.
const AREA: usize = 4096;
/// Queue depths.
const DEPTH: u32 = 64;
/// How long one completion may take before the run fails.
const TIMEOUT: Duration = Duration::from_secs(10);

fn err(what: &'static str) -> impl Fn(mlx5::Error) -> String {
    move |e| format!("{what}: {e}")
}

/// One end: its QP and CQs.
struct End {
    qp: Qp,
    send_cq: Cq,
    recv_cq: Cq,
}

/// Two connected RC QPs on the in-process emulator. (Field order is drop order: the QPs and
/// CQs go before the MR, PD, context and the emulator.)
pub struct Pair {
    ends: [End; 2],
    mr: Mr,
    _buf: Arc<DmaBuf>,
    _pd: Pd,
    _ctx: Context,
    emu: Emulator,
    wr_id: u64,
    /// Dumps of the driver's flight recorder (when on).
    dumps: Arc<Mutex<Vec<RecorderDump>>>,
}

impl std::fmt::Debug for Pair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pair")
            .field("qpn", &[self.ends[0].qp.qpn(), self.ends[1].qp.qpn()])
            .finish_non_exhaustive()
    }
}

impl Pair {
    /// A fresh in-process emulator with a connected QP pair on its HCA 0.
    ///
    /// # Errors
    /// Any verbs call failing (with its name).
    pub fn new() -> Result<Self, String> {
        Self::build(None)
    }

    /// As [`Pair::new`], with the driver's flight recorder on for the requester QP and its
    /// send CQ (`records` per queue); the dumps it takes on error CQEs are collected (see
    /// [`Pair::recorder_dumps`]).
    ///
    /// # Errors
    /// As [`Pair::new`].
    pub fn recording(records: usize) -> Result<Self, String> {
        Self::build(Some(records))
    }

    /// The dumps the driver's flight recorder took on error CQEs so far.
    pub fn recorder_dumps(&self) -> Vec<RecorderDump> {
        self.dumps
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn build(records: Option<usize>) -> Result<Self, String> {
        let emu = Emulator::new(EmuConfig {
            fabric: Fabric::InProcess,
            ..EmuConfig::default()
        });
        let surface = emu.open(0).map_err(|e| format!("emulator: {e:?}"))?;
        let ctx = Context::open(surface).map_err(err("emulated context"))?;
        let port = ctx.query_port(1).map_err(err("QUERY_PORT"))?;
        let pd = Pd::new(&ctx).map_err(err("ALLOC_PD"))?;
        let buf = Arc::new(DmaBuf::new(4 * AREA).map_err(err("buffer"))?);
        let mr = pd.reg_mr(&buf, Access::ALL).map_err(err("REG_MR"))?;
        let mk = || -> Result<End, String> {
            let cq = || {
                Cq::new(
                    &ctx,
                    CqInit {
                        cqe: 2 * DEPTH,
                        ..CqInit::default()
                    },
                    None,
                )
                .map_err(err("CREATE_CQ"))
            };
            let (send_cq, recv_cq) = (cq()?, cq()?);
            let mut init = QpInitAttr::new(QpType::Rc, &send_cq, &recv_cq);
            init.cap = QpCap {
                max_send_wr: DEPTH,
                max_recv_wr: DEPTH,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            };
            let qp = Qp::new(&pd, &init).map_err(err("CREATE_QP"))?;
            Ok(End {
                qp,
                send_cq,
                recv_cq,
            })
        };
        let (mut a, mut b) = (mk()?, mk()?);
        let remote = |e: &End| RemoteQp {
            qpn: e.qp.qpn(),
            psn: 0,
            lid: port.lid,
            gid: None,
        };
        let (ra, rb) = (remote(&a), remote(&b));
        let mtu = port.active_mtu.clamp(1, 3);
        for (e, r) in [(&mut a, &rb), (&mut b, &ra)] {
            let access = Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
            e.qp.to_init(1, access).map_err(err("INIT"))?;
            e.qp.to_rtr(r, mtu, 0).map_err(err("RTR"))?;
            e.qp.to_rts(0, 7).map_err(err("RTS"))?;
        }
        let dumps: Arc<Mutex<Vec<RecorderDump>>> = Arc::default();
        if let Some(n) = records {
            let sink = dumps.clone();
            let cfg = RecorderConfig {
                records: n,
                dir: None,
                callback: Some(Arc::new(move |d: &RecorderDump| {
                    sink.lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push(d.clone());
                })),
            };
            a.qp.enable_recorder(&cfg)
                .map_err(err("flight recorder (QP)"))?;
            a.send_cq
                .enable_recorder(&cfg)
                .map_err(err("flight recorder (CQ)"))?;
        }
        Ok(Self {
            dumps,
            ends: [a, b],
            mr,
            _buf: buf,
            _pd: pd,
            _ctx: ctx,
            emu,
            wr_id: 0,
        })
    }

    /// The emulator (HCA 0 is the one the QPs are on).
    pub fn emulator(&self) -> &Emulator {
        &self.emu
    }

    /// The QP numbers of the requester and the responder.
    pub fn qpns(&self) -> [u32; 2] {
        [self.ends[0].qp.qpn(), self.ends[1].qp.qpn()]
    }

    /// `n` signaled SENDs of `len` bytes (at most [`AREA`]) from QP 0 to QP 1, each matched by
    /// a receive; returns once all of them completed on both sides.
    ///
    /// # Errors
    /// A post refused, an error completion, or a completion not arriving in time.
    pub fn sends(&mut self, n: u32, len: u32) -> Result<(), String> {
        let len = len.min(AREA as u32);
        let rx = self.mr.sge(AREA as u64, AREA as u32);
        let tx = [self.mr.sge(0, len)];
        let mut left = n;
        while left > 0 {
            let k = left.min(DEPTH / 2);
            for _ in 0..k {
                self.wr_id += 1;
                let wr = RecvWr {
                    wr_id: self.wr_id,
                    sg_list: &[rx],
                };
                self.ends[1]
                    .qp
                    .post_recv(&[wr])
                    .map_err(|(_, e)| format!("post_recv: {e}"))?;
            }
            for _ in 0..k {
                self.wr_id += 1;
                let wr = SendWr::new(self.wr_id, WrOp::Send, &tx, SendFlags::SIGNALED);
                self.ends[0]
                    .qp
                    .post_send(&[wr])
                    .map_err(|(_, e)| format!("post_send: {e}"))?;
            }
            self.wait(0, false, k as usize)?;
            self.wait(1, true, k as usize)?;
            left -= k;
        }
        Ok(())
    }

    /// Polls CQ (`end`, receive or send) until `n` completions came; the last ones are returned.
    fn wait(&mut self, end: usize, recv: bool, n: usize) -> Result<Vec<WorkCompletion>, String> {
        let e = &mut self.ends[end];
        let cq = if recv { &mut e.recv_cq } else { &mut e.send_cq };
        let mut got = Vec::with_capacity(n);
        let mut wcs = [WorkCompletion::default(); 16];
        let t0 = Instant::now();
        while got.len() < n {
            let k = cq.poll(&mut wcs[..(n - got.len()).min(16)]);
            got.extend_from_slice(&wcs[..k]);
            if k == 0 {
                if t0.elapsed() > TIMEOUT {
                    return Err(format!(
                        "{} of {n} completions after {TIMEOUT:?} on the {} CQ of QP {:#x}",
                        got.len(),
                        if recv { "receive" } else { "send" },
                        e.qp.qpn()
                    ));
                }
                std::thread::yield_now();
            }
        }
        if let Some(bad) = got.iter().find(|w| !w.is_ok()) {
            return Err(format!("error completion: {bad}"));
        }
        Ok(got)
    }

    /// Like `wait` on the requester's send CQ, but error completions are returned, not failed.
    fn wait_any(&mut self, n: usize) -> Result<Vec<WorkCompletion>, String> {
        let e = &mut self.ends[0];
        let mut got = Vec::with_capacity(n);
        let mut wcs = [WorkCompletion::default(); 16];
        let t0 = Instant::now();
        while got.len() < n {
            let k = e.send_cq.poll(&mut wcs[..(n - got.len()).min(16)]);
            got.extend_from_slice(&wcs[..k]);
            if k == 0 {
                if t0.elapsed() > TIMEOUT {
                    return Err(format!(
                        "{} of {n} completions after {TIMEOUT:?} on the send CQ",
                        got.len()
                    ));
                }
                std::thread::yield_now();
            }
        }
        Ok(got)
    }
}

fn state_name(s: u8) -> &'static str {
    match s {
        0 => "RESET",
        1 => "INIT",
        2 => "RTR",
        3 => "RTS",
        4 => "SQD",
        5 => "SQE",
        6 => "ERR",
        _ => "UNKNOWN",
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn opt(v: Option<u32>) -> String {
    v.map_or_else(|| "unreadable".to_owned(), |v| v.to_string())
}

/// What [`diag_demo`] measured, for tests: the failing completion and both views' indices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DemoFacts {
    /// The requester QP.
    pub qpn: u32,
    /// The error completion of the bad SEND.
    pub error: WorkCompletion,
    /// The key the bad SEND's gather entry named.
    pub bad_lkey: u32,
    /// Completions of the WRs posted after it (flushed).
    pub flushed: Vec<WorkCompletion>,
    /// Driver: SQ producer counter (WQEBBs) after the run.
    pub driver_sq_pi: u32,
    /// Emulator: the device's SQ consumer counter after the run.
    pub device_sq_head: u32,
    /// Emulator: the send doorbell record as the device reads it.
    pub device_sq_dbrec: Option<u32>,
    /// Emulator: the QP state number.
    pub device_state: u8,
    /// Emulator: the send CQ's producer counter; driver: its consumer counter.
    pub cq_pi_ci: (u32, u32),
    /// The state as a flight-recorder dump (v1), reconstructed from the rings.
    pub dump: String,
    /// The dump the driver's flight recorder took on the error CQE.
    pub recorder_dump: Option<String>,
}

/// `mlx5 diag --emu`: three good SENDs, one with a bad lkey, one more (flushed); then the
/// driver's and the emulator's view of the requester QP and its send CQ, and the failing WQE
/// decoded. Returns the report text and the facts it is made of.
///
/// # Errors
/// The setup or a completion failing other than as forced.
pub fn diag_run() -> Result<(String, DemoFacts), String> {
    let mut p = Pair::recording(16)?;
    let [qpn, peer] = p.qpns();
    let mut s = String::new();
    let _ = writeln!(
        s,
        "live run on the in-process emulator: RC QP {qpn:#x} -> QP {peer:#x} (mlx5_0)"
    );
    p.sends(3, 64)?;
    let _ = writeln!(s, "3 SENDs of 64 bytes: completed");
    // The forced error: a gather entry with a key no MR has.
    let pi_before = p.ends[0].qp.sq_ref().producer();
    let bad = [Sge {
        addr: p.mr.addr(),
        length: 64,
        lkey: p.mr.lkey() ^ 0x00ab_cd00,
    }];
    let good = [p.mr.sge(0, 64)];
    p.wr_id += 1;
    let bad_id = p.wr_id;
    let wrs = [
        SendWr::new(bad_id, WrOp::Send, &bad, SendFlags::SIGNALED),
        SendWr::new(bad_id + 1, WrOp::Send, &good, SendFlags::SIGNALED),
    ];
    p.wr_id += 1;
    p.ends[0]
        .qp
        .post_send(&wrs)
        .map_err(|(i, e)| format!("post_send WR {i}: {e}"))?;
    let _ = writeln!(
        s,
        "posted SEND wr_id {bad_id} with lkey {:#x} (no such MR) at WQE counter {pi_before}, and SEND wr_id {} after it",
        bad[0].lkey,
        bad_id + 1
    );
    let wcs = p.wait_any(2)?;
    let error = wcs
        .iter()
        .find(|w| !w.is_ok() && w.wr_id == bad_id)
        .copied()
        .ok_or_else(|| format!("the bad SEND did not fail: {wcs:?}"))?;
    let flushed: Vec<WorkCompletion> = wcs.iter().filter(|w| w.wr_id != bad_id).copied().collect();
    let _ = writeln!(s, "\nwork completions:");
    for w in &wcs {
        let _ = writeln!(s, "{w}");
    }

    // Driver's view.
    let e = &p.ends[0];
    let sq = e.qp.sq_ref();
    let g = sq.geometry();
    let st = sq.stats();
    let driver_sq_pi = sq.producer();
    let _ = writeln!(s, "\ndriver's view of QP {qpn:#x}:");
    let _ = writeln!(
        s,
        "  state {:?}  SQ producer (WQEBBs) {driver_sq_pi}  outstanding WRs {}  free {}  WQEs {}  doorbells {}  BlueFlame copies {}",
        e.qp.state(),
        sq.outstanding(),
        sq.free(),
        st.wqes,
        st.doorbells,
        st.bf_copies
    );
    let _ = writeln!(s, "  SQ geometry {g:?}");
    let _ = writeln!(
        s,
        "  send CQ {:#x}: consumer index {} (capacity {})",
        e.send_cq.cqn(),
        e.send_cq.consumer_index(),
        e.send_cq.capacity()
    );
    if e.qp.state() != QpState::Err {
        let _ = writeln!(
            s,
            "  note: the driver still believes the QP is {:?}; the device moved it to ERR",
            e.qp.state()
        );
    }

    // Emulator's view.
    let v = p
        .emu
        .inspect_qp(0, qpn)
        .ok_or("the emulator does not know the QP")?;
    let c = p
        .emu
        .inspect_cq(0, e.send_cq.cqn())
        .ok_or("the emulator does not know the send CQ")?;
    let _ = writeln!(s, "\nemulator's view of QP {qpn:#x} (the device):");
    let _ = writeln!(
        s,
        "  state {}  SQ consumer (next WQEBB to execute) {}  last doorbell pi {}  doorbell record: send {} receive {}",
        state_name(v.state),
        v.sq_head,
        v.sq_rung,
        opt(v.dbrec_sq),
        opt(v.dbrec_rq)
    );
    let _ = writeln!(
        s,
        "  RQ consumed {}  RQ pi seen {}  dest QPN {:#x}  sq_psn {}  rq_psn {}",
        v.rq_head, v.rq_pi_seen, v.dest_qpn, v.sq_psn, v.rq_psn
    );
    let _ = writeln!(
        s,
        "  send CQ {:#x}: CQEs written {}  consumer index read from the doorbell record {} (record now: {})",
        c.cqn,
        c.pi,
        c.ci_seen,
        opt(c.dbrec_ci)
    );
    let agree = v.dbrec_sq == Some(driver_sq_pi & 0xFFFF);
    let _ = writeln!(
        s,
        "  the doorbell record the device reads {} the driver's producer counter mod 2^16 ({})",
        if agree { "matches" } else { "DIFFERS FROM" },
        driver_sq_pi & 0xFFFF
    );

    // The send ring around the indices: every WQE from the oldest still in the ring (at most
    // 8 back) up to the producer, one line each.
    let _ = writeln!(
        s,
        "\nSQ ring around the indices (device consumer {}, driver producer {driver_sq_pi}):",
        v.sq_head
    );
    for k in driver_sq_pi.saturating_sub(8)..driver_sq_pi {
        let mut b = [0u8; 64];
        sq.wqe_bytes(k, &mut b);
        let line = match decode_wqe(&b, WqeOptions { ud: false }) {
            Ok(d) => format!(
                "opcode {} wqe_index {} ds {} lkey {} byte_count {}",
                d.text("ctrl", "opcode").unwrap_or("?"),
                d.text("ctrl", "wqe_index").unwrap_or("?"),
                d.text("ctrl", "ds").unwrap_or("?"),
                d.text("data[0]", "lkey").unwrap_or("-"),
                d.text("data[0]", "byte_count").unwrap_or("-"),
            ),
            Err(e) => format!("(not decodable: {e})"),
        };
        let mark = if k == pi_before { ">>" } else { "  " };
        let _ = writeln!(s, "{mark} counter {k:<4} {line}");
    }
    // The failing WQE, from the ring, at the CQE's counter.
    let _ = writeln!(
        s,
        "\nfailing WQE (SQ ring at counter {pi_before}), decoded:"
    );
    let mut wqe = [0u8; 64];
    sq.wqe_bytes(pi_before, &mut wqe);
    match decode_wqe(&wqe, WqeOptions { ud: false }) {
        Ok(d) => s.push_str(&d.to_text()),
        Err(e) => {
            let _ = writeln!(s, "(not decodable: {e})");
        }
    }
    let _ = writeln!(
        s,
        "\nerror CQE: {} on QP {qpn:#x}: status {} syndrome {:?} vendor_err {:#04x}",
        CqeOpcode::REQ_ERR,
        error.status,
        error.syndrome,
        error.vendor_err.0
    );
    let _ = writeln!(
        s,
        "  the WQE at counter {pi_before} is the failing one: its gather entry's lkey is the bad key (explained with the work completion above)"
    );
    // The send CQ ring around its indices, as the device wrote it.
    let _ = writeln!(
        s,
        "\nsend CQ ring around the indices (device producer {}, driver consumer {}):",
        c.pi,
        e.send_cq.consumer_index()
    );
    let mut cqes = Vec::new();
    for k in c.pi.saturating_sub(8)..c.pi {
        let Some(b) = p.emu.read_cqe(0, c.cqn, k) else {
            let _ = writeln!(s, "   counter {k:<4} (not readable)");
            continue;
        };
        let line = match crate::decode::decode_cqe(&b, Some(b.len())) {
            Ok(d) => {
                let mut l = format!(
                    "opcode {} wqe_counter {}",
                    d.text("cqe", "opcode").unwrap_or("?"),
                    d.text("cqe", "wqe_counter").unwrap_or("?"),
                );
                if let Some(syn) = d.text("error", "syndrome") {
                    let _ = write!(
                        l,
                        " syndrome {syn} vendor {}",
                        d.text("error", "vendor_syndrome").unwrap_or("?")
                    );
                }
                l
            }
            Err(e) => format!("(not decodable: {e})"),
        };
        let failing = b
            .get(b.len().saturating_sub(64)..)
            .and_then(|x| mlx5_hw::cqe::ErrCqe::read_from_bytes(x).ok())
            .is_some_and(|x| {
                x.opcode().is_error() && u32::from(x.wqe_counter()) == pi_before & 0xFFFF
            });
        let mark = if failing { ">>" } else { "  " };
        let _ = writeln!(s, "{mark} counter {k:<4} {line}");
        cqes.push((k, b));
    }

    // The same state as a flight-recorder dump (v1), reconstructed from the rings: every WQE
    // before its CQE in the sequence.
    let cnt = g.wqe_cnt.max(1);
    let mut dump = String::new();
    let _ = writeln!(dump, "mlx5-flight-recorder v1");
    let _ = writeln!(
        dump,
        "reason error CQE on cq {:#x}: {} (mlx5 diag --emu, reconstructed from the rings)",
        c.cqn, error.status
    );
    let _ = writeln!(
        dump,
        "qp {qpn:#x} type RC state {} sq_wqe_cnt {cnt} sq_pi {driver_sq_pi} sq_ci {} sq_dbrec {} rq_wqe_cnt {} rq_pi {} rq_ci {} rq_dbrec {} outstanding {}",
        state_name(v.state),
        v.sq_head,
        v.dbrec_sq.unwrap_or(0),
        v.rq_wqe_cnt,
        v.dbrec_rq.unwrap_or(0),
        v.rq_head,
        v.dbrec_rq.unwrap_or(0),
        sq.outstanding()
    );
    let _ = writeln!(
        dump,
        "cq {:#x} cqe_size {} cqe_cnt {} ci {} dbrec_ci {}",
        c.cqn,
        c.cqe_size,
        c.ncqe,
        e.send_cq.consumer_index(),
        c.dbrec_ci.unwrap_or(0)
    );
    let mut seq = 0u64;
    let mut next_cqe = cqes.iter().peekable();
    for k in driver_sq_pi.saturating_sub(cnt)..driver_sq_pi {
        let mut b = [0u8; 64];
        sq.wqe_bytes(k, &mut b);
        seq += 1;
        let _ = writeln!(dump, "wqe {qpn:#x} {} {seq} {}", k % cnt, hex(&b));
        // the CQEs of this WQE (their wqe_counter is its index)
        while let Some((ck, cb)) = next_cqe.next_if(|(_, cb)| {
            cb.get(cb.len().saturating_sub(4)..cb.len().saturating_sub(2))
                .is_some_and(|w| u16::from_be_bytes([w[0], w[1]]) == k as u16)
        }) {
            seq += 1;
            let _ = writeln!(dump, "cqe {:#x} {ck} {seq} {}", c.cqn, hex(cb));
        }
    }
    for (ck, cb) in next_cqe {
        seq += 1;
        let _ = writeln!(dump, "cqe {:#x} {ck} {seq} {}", c.cqn, hex(cb));
    }

    // The driver's flight recorder: the dump it took when the error CQE was polled.
    let recorder_dump = p.recorder_dumps().into_iter().next().map(|d| d.text);
    match &recorder_dump {
        Some(t) => match crate::diag::parse_dump(t) {
            Ok(d) => {
                let _ = writeln!(
                    s,
                    "\nthe driver's flight recorder dumped on the error CQE ({} records); mlx5 diag reads it as:",
                    d.entries.len()
                );
                s.push_str(&crate::diag::findings(&d));
            }
            Err(e) => {
                let _ = writeln!(s, "\nthe driver's flight recorder dump does not parse: {e}");
            }
        },
        None => {
            let _ = writeln!(s, "\nthe driver's flight recorder took no dump");
        }
    }
    let facts = DemoFacts {
        qpn,
        error,
        bad_lkey: bad[0].lkey,
        flushed,
        driver_sq_pi,
        device_sq_head: v.sq_head,
        device_sq_dbrec: v.dbrec_sq,
        device_state: v.state,
        cq_pi_ci: (c.pi, e.send_cq.consumer_index()),
        dump,
        recorder_dump,
    };
    Ok((s, facts))
}

/// The text of [`diag_run`]; with `save`, the driver's flight-recorder dump (or, without one,
/// the dump reconstructed from the rings) is written there too.
///
/// # Errors
/// As [`diag_run`], or the file not writable.
pub fn diag_demo(save: Option<&std::path::Path>) -> Result<String, String> {
    let (mut s, f) = diag_run()?;
    if let Some(p) = save {
        let (text, what) = match &f.recorder_dump {
            Some(t) => (t, "the driver's flight-recorder dump"),
            None => (
                &f.dump,
                "a flight-recorder dump (v1) reconstructed from the rings",
            ),
        };
        std::fs::write(p, text).map_err(|e| format!("{}: {e}", p.display()))?;
        let _ = writeln!(
            s,
            "\n{what} written to {} (read it with mlx5 diag --dump)",
            p.display()
        );
    }
    Ok(s)
}
