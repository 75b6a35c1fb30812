//! `mlx5 trace send|write|read|atomic`: the life of one operation, stage by stage, on the
//! emulated ConnectX in stepped mode (deterministic order).
//!
//! The host's stages are observed from outside the driver: the work request and the checks
//! the driver makes (QP state, inline size against `max_inline`, SGE count, room in the send
//! queue), the WQE bytes it wrote into the ring (read back with `SendQueue::wqe_bytes` and
//! decoded by `decode.rs`), the doorbell record (read by the device), the barriers, and the
//! MMIO write the device consumed (BlueFlame copy or 8-byte doorbell, with its bytes). The
//! device's stages come from the emulator's trace (`tools/emu/src/trace.rs`): WQE fetch, DMA
//! reads, packets on the wire (headers decoded here from the bytes), the responder's checks,
//! the receive WQE, the data placed, the CQEs and the ACK. Then the poll and the work
//! completion. Each stage carries the time since tracing began (wall clock of the emulated run;
//! the emulated clock is in the JSON) and the function that did it.
//!
//! `--fault bad-lkey|bad-rkey` traces an operation that fails: the bad key in the WQE, the
//! check that refuses it, the error CQE and the work completion with its explanation (printed
//! by `WorkCompletion`'s Display, `src/wc_fmt.rs`, as every trace's completion is). On a real
//! device (unless `--emu`) only the host's stages are traced, with a `device` stage saying the
//! rest is not observable (`docs/trace-and-tune.md`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use mlx5::{
    Access, BfPolicy, ConnectParams, Context, Cq, CqInit, DmaBuf, Mtu, Pd, Qp, QpCap, QpInitAttr,
    QpState, QpType, RecvWr, RemoteQp, SendFlags, SendWr, Sge, WorkCompletion, WrOp,
};
use mlx5_emu::trace::{TraceEvent, TraceWhat};
use mlx5_emu::{EmuConfig, Emulator, RunMode};
use serde_json::{Value, json};

use crate::decode::{WqeOptions, decode_cqe, decode_wqe};

/// The operation traced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TraceOp {
    /// SEND into a posted receive.
    Send,
    /// RDMA WRITE.
    Write,
    /// RDMA READ.
    Read,
    /// Atomic fetch-and-add (8 bytes).
    Atomic,
}

/// A fault injected into the traced operation, to show the life of one that fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Fault {
    /// The local SGE carries a key that is no MR's: the device's gather (SEND/WRITE) or
    /// scatter of the response (READ/atomic) is refused, the CQE is LOCAL_PROT. Forces the
    /// payload to be gathered (an inline payload has no lkey).
    BadLkey,
    /// The remote key of a WRITE/READ/atomic is no MR's: the responder's rkey check fails, it
    /// answers with a NAK and the requester's CQE is REM_ACCESS_ERR.
    BadRkey,
}

impl Fault {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Fault::BadLkey => "bad-lkey",
            Fault::BadRkey => "bad-rkey",
        }
    }
}

/// What to trace.
#[derive(Clone, Copy, Debug)]
pub struct TraceOpts {
    /// Operation.
    pub op: TraceOp,
    /// Message size (8 for atomics).
    pub size: u32,
    /// Inline threshold: SEND/WRITE messages up to this size go inline (the QP's
    /// `max_inline_data` too).
    pub inline: u32,
    /// BlueFlame allowed.
    pub bf: bool,
    /// Operations traced, one after the other.
    pub n: u32,
    /// A fault to inject (`None`: the operation succeeds).
    pub fault: Option<Fault>,
}

/// Largest message `mlx5 trace` takes.
pub const MAX_TRACE_SIZE: u32 = 1 << 20;

/// One stage of the life of an operation.
#[derive(Clone, Debug)]
pub struct Stage {
    /// Which operation (0-based) of the `-n` traced.
    pub op_index: u32,
    /// Stage name, as in the article: "work request", "checks", "WQE", ...
    pub name: &'static str,
    /// Wall-clock ns since tracing began.
    pub t_ns: u64,
    /// Emulated clock (ns) for device stages.
    pub clock_ns: Option<u64>,
    /// The function that did it.
    pub func: String,
    /// Human-readable lines.
    pub lines: Vec<String>,
    /// Machine-readable details.
    pub data: Value,
}

/// Headers of one packet, decoded from the bytes on the wire (BTH onwards).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PacketHeaders {
    /// BTH opcode.
    pub opcode: u8,
    /// BTH solicited event.
    pub se: bool,
    /// BTH partition key.
    pub pkey: u16,
    /// BTH destination QP.
    pub dest_qp: u32,
    /// BTH AckReq.
    pub ack_req: bool,
    /// BTH PSN.
    pub psn: u32,
    /// RETH: (virtual address, rkey, DMA length).
    pub reth: Option<(u64, u32, u32)>,
    /// AETH: (syndrome, MSN).
    pub aeth: Option<(u8, u32)>,
    /// ImmDt.
    pub imm: Option<[u8; 4]>,
    /// IETH: rkey to invalidate.
    pub ieth: Option<u32>,
    /// AtomicETH: (virtual address, rkey, swap/add, compare).
    pub atomic_eth: Option<(u64, u32, u64, u64)>,
    /// AtomicAckETH: the original remote value.
    pub atomic_ack: Option<u64>,
    /// Payload bytes (between the headers and the ICRC).
    pub payload_len: usize,
    /// The ICRC (last 4 bytes, as carried).
    pub icrc: u32,
}

/// The IBA name of an RC/UC/UD opcode.
pub fn opcode_name(op: u8) -> &'static str {
    let base = op & 0x1f;
    let rc = match base {
        0x00 => "SEND_FIRST",
        0x01 => "SEND_MIDDLE",
        0x02 => "SEND_LAST",
        0x03 => "SEND_LAST_WITH_IMMEDIATE",
        0x04 => "SEND_ONLY",
        0x05 => "SEND_ONLY_WITH_IMMEDIATE",
        0x06 => "RDMA_WRITE_FIRST",
        0x07 => "RDMA_WRITE_MIDDLE",
        0x08 => "RDMA_WRITE_LAST",
        0x09 => "RDMA_WRITE_LAST_WITH_IMMEDIATE",
        0x0A => "RDMA_WRITE_ONLY",
        0x0B => "RDMA_WRITE_ONLY_WITH_IMMEDIATE",
        0x0C => "RDMA_READ_REQUEST",
        0x0D => "RDMA_READ_RESPONSE_FIRST",
        0x0E => "RDMA_READ_RESPONSE_MIDDLE",
        0x0F => "RDMA_READ_RESPONSE_LAST",
        0x10 => "RDMA_READ_RESPONSE_ONLY",
        0x11 => "ACKNOWLEDGE",
        0x12 => "ATOMIC_ACKNOWLEDGE",
        0x13 => "COMPARE_SWAP",
        0x14 => "FETCH_ADD",
        0x16 => "SEND_LAST_WITH_INVALIDATE",
        0x17 => "SEND_ONLY_WITH_INVALIDATE",
        _ => "reserved",
    };
    match op >> 5 {
        0 => rc,
        1 | 3 => rc, // UC / UD share the low-bit names
        _ => "manufacturer-specific",
    }
}

/// Decode the headers of a packet (BTH onwards, ICRC at the end) of an RC or UC QP.
///
/// # Errors
/// Too short for the headers its opcode carries.
pub fn decode_packet(b: &[u8]) -> Result<PacketHeaders, String> {
    let need = |n: usize, what: &str| -> Result<(), String> {
        if b.len() < n + 4 {
            Err(format!(
                "packet of {} bytes is too short for its {what} (needs {} with the ICRC)",
                b.len(),
                n + 4
            ))
        } else {
            Ok(())
        }
    };
    need(12, "BTH")?;
    let be32 = |o: usize| u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
    let be64 = |o: usize| (u64::from(be32(o)) << 32) | u64::from(be32(o + 4));
    let mut h = PacketHeaders {
        opcode: b[0],
        se: b[1] & 0x80 != 0,
        pkey: u16::from_be_bytes([b[2], b[3]]),
        dest_qp: be32(4) & 0xff_ffff,
        ack_req: be32(8) & 0x8000_0000 != 0,
        psn: be32(8) & 0xff_ffff,
        ..Default::default()
    };
    let base = h.opcode & 0x1f;
    let mut off = 12;
    if h.opcode >> 5 == 3 {
        need(off + 8, "DETH")?;
        off += 8;
    }
    if matches!(base, 0x06 | 0x0A | 0x0B | 0x0C) && h.opcode >> 5 != 3 {
        need(off + 16, "RETH")?;
        h.reth = Some((be64(off), be32(off + 8), be32(off + 12)));
        off += 16;
    }
    if matches!(base, 0x13 | 0x14) && h.opcode >> 5 == 0 {
        need(off + 28, "AtomicETH")?;
        h.atomic_eth = Some((be64(off), be32(off + 8), be64(off + 12), be64(off + 20)));
        off += 28;
    }
    if matches!(base, 0x0D | 0x0F | 0x10 | 0x11 | 0x12) && h.opcode >> 5 == 0 {
        need(off + 4, "AETH")?;
        let a = be32(off);
        h.aeth = Some(((a >> 24) as u8, a & 0xff_ffff));
        off += 4;
    }
    if base == 0x12 && h.opcode >> 5 == 0 {
        need(off + 8, "AtomicAckETH")?;
        h.atomic_ack = Some(be64(off));
        off += 8;
    }
    if matches!(base, 0x03 | 0x05 | 0x09 | 0x0B) {
        need(off + 4, "ImmDt")?;
        h.imm = Some([b[off], b[off + 1], b[off + 2], b[off + 3]]);
        off += 4;
    }
    if matches!(base, 0x16 | 0x17) && h.opcode >> 5 == 0 {
        need(off + 4, "IETH")?;
        h.ieth = Some(be32(off));
        off += 4;
    }
    need(off, "headers")?;
    let end = b.len() - 4;
    h.payload_len = end - off;
    h.icrc = u32::from_le_bytes([b[end], b[end + 1], b[end + 2], b[end + 3]]);
    Ok(h)
}

impl PacketHeaders {
    /// One line per header.
    pub fn lines(&self) -> Vec<String> {
        let mut v = vec![format!(
            "BTH     opcode {:#04x} {}  se {}  pkey {:#06x}  dest QP {:#08x}  ack_req {}  PSN {:#08x}",
            self.opcode,
            opcode_name(self.opcode),
            u8::from(self.se),
            self.pkey,
            self.dest_qp,
            u8::from(self.ack_req),
            self.psn
        )];
        if let Some((va, rkey, len)) = self.reth {
            v.push(format!(
                "RETH    va {va:#x}  rkey {rkey:#010x}  dma_len {len}"
            ));
        }
        if let Some((va, rkey, swap, cmp)) = self.atomic_eth {
            v.push(format!(
                "AtomicETH va {va:#x}  rkey {rkey:#010x}  swap/add {swap:#x}  compare {cmp:#x}"
            ));
        }
        if let Some((syn, msn)) = self.aeth {
            let kind = match syn >> 5 {
                0 => "ACK".to_owned(),
                1 => format!("RNR NAK (timer {})", syn & 0x1f),
                3 => format!("NAK code {}", syn & 0x1f),
                _ => "reserved".to_owned(),
            };
            v.push(format!("AETH    syndrome {syn:#04x} {kind}  MSN {msn}"));
        }
        if let Some(x) = self.atomic_ack {
            v.push(format!("AtomicAckETH original value {x:#x}"));
        }
        if let Some(i) = self.imm {
            v.push(format!("ImmDt   {:#010x}", u32::from_be_bytes(i)));
        }
        if let Some(k) = self.ieth {
            v.push(format!("IETH    rkey {k:#010x}"));
        }
        v.push(format!(
            "payload {} B, ICRC {:#010x}",
            self.payload_len, self.icrc
        ));
        v
    }

    /// JSON of the headers.
    pub fn to_json(&self) -> Value {
        json!({
            "bth": {
                "opcode": self.opcode, "opcode_name": opcode_name(self.opcode), "se": self.se,
                "pkey": self.pkey, "dest_qp": self.dest_qp, "ack_req": self.ack_req, "psn": self.psn,
            },
            "reth": self.reth.map(|(va, rkey, len)| json!({"va": va, "rkey": rkey, "dma_len": len})),
            "aeth": self.aeth.map(|(s, m)| json!({"syndrome": s, "msn": m})),
            "immdt": self.imm.map(u32::from_be_bytes),
            "ieth": self.ieth,
            "atomic_eth": self.atomic_eth.map(|(va, rkey, s, c)| json!({"va": va, "rkey": rkey, "swap_add": s, "compare": c})),
            "atomic_ack_eth": self.atomic_ack,
            "payload_len": self.payload_len,
            "icrc": self.icrc,
        })
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Hex in 16-byte lines.
fn hex_lines(b: &[u8]) -> Vec<String> {
    b.chunks(16)
        .enumerate()
        .map(|(i, c)| {
            let words: Vec<String> = c.chunks(4).map(hex).collect();
            format!("{:04x}  {}", i * 16, words.join(" "))
        })
        .collect()
}

fn err(what: &str) -> impl FnOnce(mlx5::Error) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// One end: QP, its two CQs, its buffer (`[tx area | rx area]`) and MR.
pub struct End {
    /// The RC QP.
    pub qp: Qp,
    /// Its send CQ.
    pub scq: Cq,
    /// Its receive CQ.
    pub rcq: Cq,
    /// Its buffer.
    pub buf: Arc<DmaBuf>,
    /// The buffer's MR.
    pub mr: mlx5::Mr,
}

/// Two connected RC QPs on one stepped emulated HCA (`a` sends to `b`). Field order is drop
/// order: the QPs before the PD, the context and the emulator.
pub struct Rig {
    /// The requester.
    pub a: End,
    /// The responder.
    pub b: End,
    _pd: Pd,
    _ctx: Context,
    /// The stepped emulator (link counting on).
    pub emu: Emulator,
    /// Bytes of each end's tx and rx areas.
    pub area: usize,
}

impl std::fmt::Debug for End {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("End")
            .field("qpn", &self.qp.qpn())
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Rig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rig")
            .field("a", &self.a)
            .field("b", &self.b)
            .field("area", &self.area)
            .finish_non_exhaustive()
    }
}

/// A [`Rig`] for messages of `size` bytes: QPs of `depth` WRs each way, inline up to
/// `inline`, BlueFlame as `bf`.
///
/// # Errors
/// The emulator or the driver refused a step (named).
pub fn rig(size: u32, inline: u32, bf: bool, depth: u32) -> Result<Rig, String> {
    let emu = Emulator::new(EmuConfig {
        mode: RunMode::Stepped,
        ..EmuConfig::default()
    });
    // The link counters (PCIe model) count on this device.
    emu.count_link(true);
    let ctx = Context::open(emu.open(0).map_err(|e| format!("emulator: {e:?}"))?)
        .map_err(err("emulated context"))?;
    let pd = Pd::new(&ctx).map_err(err("ALLOC_PD"))?;
    let area = (size as usize).max(8).next_multiple_of(64);
    let o = TraceOpts {
        op: TraceOp::Send,
        size,
        inline,
        bf,
        n: 1,
        fault: None,
    };
    let mut a = end(&ctx, &pd, area, &o, depth)?;
    let mut b = end(&ctx, &pd, area, &o, depth)?;
    let lid = ctx.query_port(1).map_err(err("QUERY_PORT"))?.lid;
    let remote = |e: &End, psn| RemoteQp {
        qpn: e.qp.qpn(),
        psn,
        lid,
        gid: None,
    };
    let (ra, rb) = (remote(&a, 0x100), remote(&b, 0x200));
    let acc = Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    for (e, r) in [(&mut a, &rb), (&mut b, &ra)] {
        e.qp.to_init(1, acc).map_err(err("INIT"))?;
        e.qp.to_rtr(r, 3, 0).map_err(err("RTR"))?;
    }
    a.qp.to_rts(0x100, 7).map_err(err("RTS"))?;
    b.qp.to_rts(0x200, 7).map_err(err("RTS"))?;
    emu.run_until_idle();
    Ok(Rig {
        a,
        b,
        _pd: pd,
        _ctx: ctx,
        emu,
        area,
    })
}

/// Two connected RC QPs on a real device (loopback through its port 1). Field order is drop
/// order.
struct HwRig {
    a: End,
    b: End,
    _pd: Pd,
    _ctx: Context,
    area: usize,
}

/// A [`HwRig`] on `dev`: as [`rig`], with the port's RoCE v2 GID on the path when the port is
/// Ethernet.
fn rig_hw(dev: &mlx5::Device, size: u32, inline: u32, bf: bool) -> Result<HwRig, String> {
    let ctx = dev.open().map_err(|e| format!("{}: {e}", dev.name))?;
    let pd = Pd::new(&ctx).map_err(err("ALLOC_PD"))?;
    let area = (size as usize).max(8).next_multiple_of(64);
    let o = TraceOpts {
        op: TraceOp::Send,
        size,
        inline,
        bf,
        n: 1,
        fault: None,
    };
    let mut a = end(&ctx, &pd, area, &o, 64)?;
    let mut b = end(&ctx, &pd, area, &o, 64)?;
    let port = ctx.query_port(1).map_err(err("QUERY_PORT 1"))?;
    let (sgid, gid) = if port.is_roce() {
        let (i, g) = ctx
            .find_gid(1)
            .map_err(err("GID table"))?
            .ok_or("port 1 has no RoCE v2 GID")?;
        let i = u8::try_from(i).map_err(|_| format!("GID index {i} out of range"))?;
        (i, Some(g))
    } else {
        (0, None)
    };
    let p = ConnectParams::new()
        .mtu(Mtu::from_code(port.active_mtu).unwrap_or(Mtu::M1024))
        .sgid_index(sgid);
    let remote = |e: &End, psn| RemoteQp {
        qpn: e.qp.qpn(),
        psn,
        lid: port.lid,
        gid,
    };
    let (ra, rb) = (remote(&a, 0x100), remote(&b, 0x200));
    let acc = Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    for (e, r) in [(&mut a, &rb), (&mut b, &ra)] {
        e.qp.to_init(1, acc).map_err(err("INIT"))?;
        e.qp.to_rtr_with(r, &p).map_err(err("RTR"))?;
    }
    a.qp.to_rts_with(0x100, &p).map_err(err("RTS"))?;
    b.qp.to_rts_with(0x200, &p).map_err(err("RTS"))?;
    Ok(HwRig {
        a,
        b,
        _pd: pd,
        _ctx: ctx,
        area,
    })
}

/// The line a hardware trace prints in place of the device's stages.
pub const HW_DEVICE_NOTE: &str = "the device's stages (WQE fetch, DMA reads, packets, the \
    responder's checks, data placement, CQE writes, ACKs) are not observable on hardware: \
    only the host's stages are shown";

fn end(ctx: &Context, pd: &Pd, area: usize, o: &TraceOpts, depth: u32) -> Result<End, String> {
    let buf = Arc::new(DmaBuf::new(2 * area).map_err(err("buffer"))?);
    let mr = pd.reg_mr(&buf, Access::ALL).map_err(err("REG_MR"))?;
    let cq = || {
        Cq::new(
            ctx,
            CqInit {
                cqe: (2 * depth).max(64),
                ..CqInit::default()
            },
            None,
        )
        .map_err(err("CREATE_CQ"))
    };
    let (scq, rcq) = (cq()?, cq()?);
    let mut init = QpInitAttr::new(QpType::Rc, &scq, &rcq);
    init.cap = QpCap {
        max_send_wr: depth,
        max_recv_wr: depth,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: o.inline,
    };
    init.bf_policy = if o.bf {
        BfPolicy::PreferBf
    } else {
        BfPolicy::AlwaysDoorbell
    };
    let qp = Qp::new(pd, &init).map_err(err("CREATE_QP"))?;
    Ok(End {
        qp,
        scq,
        rcq,
        buf,
        mr,
    })
}

/// The stages of the traced operations.
///
/// # Errors
/// A bad option (named), or a driver/emulator failure.
pub fn trace(o: &TraceOpts) -> Result<Vec<Stage>, String> {
    trace_on(o, None)
}

/// The options checked; the message size traced.
fn check_opts(o: &TraceOpts) -> Result<u32, String> {
    let size = if o.op == TraceOp::Atomic { 8 } else { o.size };
    if size == 0 || size > MAX_TRACE_SIZE {
        return Err(format!(
            "-s {size}: the message size must be 1..={MAX_TRACE_SIZE} bytes"
        ));
    }
    if o.n == 0 || o.n > 32 {
        return Err(format!("-n {}: trace 1..=32 operations", o.n));
    }
    match o.fault {
        Some(f) if o.n != 1 => {
            return Err(format!(
                "--fault {} with -n {}: a fault is traced on one operation (-n 1); the QP is in \
                 the error state after it",
                f.name(),
                o.n
            ));
        }
        Some(Fault::BadRkey) if o.op == TraceOp::Send => {
            return Err(
                "--fault bad-rkey with send: a SEND carries no remote key (use write, read or \
                 atomic)"
                    .to_owned(),
            );
        }
        _ => {}
    }
    Ok(size)
}

/// The stages of the traced operations on `dev` when given (a real device: the host's stages
/// only), else on the stepped emulator as [`trace`].
///
/// # Errors
/// As [`trace`].
pub fn trace_on(o: &TraceOpts, dev: Option<&mlx5::Device>) -> Result<Vec<Stage>, String> {
    let size = check_opts(o)?;
    trace_checked(o, size, dev)
}

fn trace_checked(
    o: &TraceOpts,
    size: u32,
    dev: Option<&mlx5::Device>,
) -> Result<Vec<Stage>, String> {
    // The payload: a recognisable pattern in a's tx area.
    let pattern: Vec<u8> = (0..size).map(|i| b'A' + (i % 26) as u8).collect();
    let start = Instant::now();
    let mut stages = Vec::new();
    if let Some(d) = dev {
        let mut r = rig_hw(d, size, o.inline, o.bf)?;
        r.a.buf.write(0, &pattern);
        for i in 0..o.n {
            let ends = (&mut r.a, &mut r.b);
            trace_one(None, start, ends, o, size, r.area, &pattern, i, &mut stages)?;
        }
        return Ok(stages);
    }
    let mut r = rig(size, o.inline, o.bf, 64)?;
    r.a.buf.write(0, &pattern);
    r.emu.run_until_idle();
    r.emu.trace(true);
    for i in 0..o.n {
        let ends = (&mut r.a, &mut r.b);
        trace_one(
            Some(&r.emu),
            start,
            ends,
            o,
            size,
            r.area,
            &pattern,
            i,
            &mut stages,
        )?;
    }
    r.emu.trace(false);
    Ok(stages)
}

/// Stage builder.
fn stage(
    op_index: u32,
    name: &'static str,
    t_ns: u64,
    func: &str,
    lines: Vec<String>,
    data: Value,
) -> Stage {
    Stage {
        op_index,
        name,
        t_ns,
        clock_ns: None,
        func: func.to_owned(),
        lines,
        data,
    }
}

#[allow(clippy::too_many_arguments)]
fn trace_one(
    emu: Option<&Emulator>,
    start: Instant,
    (a, b): (&mut End, &mut End),
    o: &TraceOpts,
    size: u32,
    area: usize,
    pattern: &[u8],
    i: u32,
    out: &mut Vec<Stage>,
) -> Result<(), String> {
    // An inline payload carries no lkey: a bad-lkey fault gathers.
    let inline = matches!(o.op, TraceOp::Send | TraceOp::Write)
        && size <= o.inline
        && o.fault != Some(Fault::BadLkey);
    let wr_id = 0x1000 + u64::from(i);
    let (a_qpn, b_qpn) = (a.qp.qpn(), b.qp.qpn());
    // The responder's receive for a SEND (set up before the trace of this operation).
    if o.op == TraceOp::Send {
        let sge = [Sge {
            addr: b.mr.addr() + area as u64,
            length: area as u32,
            lkey: b.mr.lkey(),
        }];
        b.qp.post_recv(&[RecvWr {
            wr_id: 0x2000 + u64::from(i),
            sg_list: &sge,
        }])
        .map_err(|(_, e)| format!("post_recv: {e}"))?;
        if let Some(emu) = emu {
            emu.run_until_idle();
            emu.take_trace();
        }
    }
    // The time since tracing began: the emulator's trace clock, or the tool's own.
    let now = || {
        emu.map_or_else(
            || start.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64,
            Emulator::trace_clock,
        )
    };
    // A key no MR has: the index bits (above the 8-bit variant) flipped.
    let bad = |k: u32| k ^ 0x00ff_ff00;
    let (raddr, mut rkey) = (b.mr.addr() + area as u64, b.mr.rkey());
    if o.fault == Some(Fault::BadRkey) {
        rkey = bad(rkey);
    }
    let local = Sge {
        addr: a.mr.addr()
            + if matches!(o.op, TraceOp::Read | TraceOp::Atomic) {
                area as u64
            } else {
                0
            },
        length: size,
        lkey: if o.fault == Some(Fault::BadLkey) {
            bad(a.mr.lkey())
        } else {
            a.mr.lkey()
        },
    };
    let sg = [local];
    let inl: [&[u8]; 1] = [pattern];
    let mut flags = SendFlags::SIGNALED;
    if inline {
        flags |= SendFlags::INLINE;
    }
    let op = match o.op {
        TraceOp::Send => WrOp::Send,
        TraceOp::Write => WrOp::Write { raddr, rkey },
        TraceOp::Read => WrOp::Read { raddr, rkey },
        TraceOp::Atomic => WrOp::FetchAdd {
            raddr,
            rkey,
            add: 1,
        },
    };
    let mut wr = SendWr::new(wr_id, op, &sg, flags);
    if inline {
        wr = wr.with_inline(&inl);
    }
    // 1. The work request.
    let t0 = now();
    let mut lines = vec![format!(
        "ibv_post_send: wr_id {wr_id:#x}, opcode {}, flags SIGNALED{}",
        match o.op {
            TraceOp::Send => "IBV_WR_SEND",
            TraceOp::Write => "IBV_WR_RDMA_WRITE",
            TraceOp::Read => "IBV_WR_RDMA_READ",
            TraceOp::Atomic => "IBV_WR_ATOMIC_FETCH_AND_ADD (add 1)",
        },
        if inline { "|INLINE" } else { "" }
    )];
    if inline {
        lines.push(format!(
            "inline payload: {size} B copied by the CPU into the WQE"
        ));
    } else {
        lines.push(format!(
            "sg_list[0]: addr {:#x} length {} lkey {:#010x}",
            local.addr, local.length, local.lkey
        ));
    }
    if o.op != TraceOp::Send {
        lines.push(format!("remote: addr {raddr:#x} rkey {rkey:#010x}"));
    }
    lines.push(format!("QP {a_qpn:#08x} (RC) -> QP {b_qpn:#08x}"));
    if let Some(f) = o.fault {
        lines.push(format!(
            "fault {}: {}",
            f.name(),
            match f {
                Fault::BadLkey => format!(
                    "lkey {:#010x} is no MR's (the MR's is {:#010x}); the payload is gathered \
                     (an inline one carries no lkey)",
                    local.lkey,
                    a.mr.lkey()
                ),
                Fault::BadRkey => format!(
                    "rkey {rkey:#010x} is no MR's (the remote MR's is {:#010x})",
                    b.mr.rkey()
                ),
            }
        ));
    }
    out.push(stage(
        i,
        "work request",
        t0,
        "mlx5::Qp::post_send",
        lines,
        json!({"wr_id": wr_id, "op": format!("{:?}", o.op).to_lowercase(), "size": size,
               "inline": inline, "sge": {"addr": local.addr, "length": local.length, "lkey": local.lkey},
               "qpn": a_qpn, "dest_qpn": b_qpn}),
    ));
    // 2. The checks.
    let geo = a.qp.sq_ref().geometry();
    let state = a.qp.state();
    let free = a.qp.sq_ref().free();
    let state_ok = matches!(
        state,
        QpState::Rts | QpState::Sqd | QpState::Sqe | QpState::Err
    );
    let inline_ok = !inline || size <= geo.max_inline;
    let sge_ok = inline || 1 <= geo.max_gs;
    let room_ok = free > 0;
    let mark = |ok: bool| if ok { "ok  " } else { "FAIL" };
    let mut lines = vec![format!(
        "{} QP state {state:?} (posting needs RTS, SQD, SQE or ERR)",
        mark(state_ok)
    )];
    if inline {
        lines.push(format!(
            "{} inline size {size} B <= max_inline {} B",
            mark(inline_ok),
            geo.max_inline
        ));
    } else {
        lines.push(format!(
            "{} SGE count 1 <= max_send_sge {}",
            mark(sge_ok),
            geo.max_gs
        ));
    }
    lines.push(format!(
        "{} room: {free} of {} WRs free in the send queue ({} WQEBBs of 64 B)",
        mark(room_ok),
        geo.max_post,
        geo.wqe_cnt
    ));
    let producer = a.qp.sq_ref().producer();
    let fast = o.op == TraceOp::Send
        && (!inline || (1..=64).contains(&size))
        && ((producer & (geo.wqe_cnt - 1)) + geo.wqe_size / 64 <= geo.wqe_cnt);
    let post_fn = if fast {
        "mlx5::qp::sq::SendQueue::fast_send"
    } else {
        "mlx5::qp::sq::SendQueue::post_send_general"
    };
    out.push(stage(
        i,
        "checks",
        t0,
        "mlx5::qp::sq::SendQueue::post_send",
        lines,
        json!({"qp_state": format!("{state:?}"), "state_ok": state_ok, "inline_ok": inline_ok,
               "max_inline": geo.max_inline, "sge_ok": sge_ok, "max_send_sge": geo.max_gs,
               "free": free, "room_ok": room_ok}),
    ));
    let stats0 = a.qp.sq_ref().stats();
    a.qp.post_send(&[wr])
        .map_err(|(_, e)| format!("post_send refused: {e}"))?;
    let t1 = now();
    let stats1 = a.qp.sq_ref().stats();
    // 3. The WQE as written.
    let after = a.qp.sq_ref().producer();
    let bbs = after.wrapping_sub(producer) as usize;
    let mut ring = vec![0u8; bbs * 64];
    a.qp.sq_ref().wqe_bytes(producer, &mut ring);
    let ds = usize::from(ring.get(7).copied().unwrap_or(0) & 0x3f);
    let wqe = &ring[..(ds * 16).min(ring.len())];
    let dec = decode_wqe(wqe, WqeOptions::default())?;
    let mut lines = vec![format!(
        "{} B at WQEBB {producer} (slot {}) of the send ring, {bbs} WQEBB(s)",
        wqe.len(),
        producer & (geo.wqe_cnt - 1)
    )];
    lines.extend(dec.to_text().lines().skip(1).map(str::to_owned));
    lines.extend(hex_lines(wqe));
    out.push(stage(
        i,
        "WQE",
        t1,
        post_fn,
        lines,
        json!({"index": producer, "wqebbs": bbs, "bytes": hex(wqe), "decoded": dec.to_json()}),
    ));
    // 4. The doorbell record (read from host memory, as the device reads it; on hardware, the
    // value the driver writes).
    let ring_fn = if fast {
        "mlx5::qp::sq::SendQueue::fast_send"
    } else {
        "mlx5::qp::sq::SendQueue::ring"
    };
    let dbrec = match emu {
        Some(emu) => {
            let view = emu
                .sq_view(0, a_qpn)
                .ok_or("the emulator does not know the QP")?;
            stage(
                i,
                "doorbell record",
                t1,
                ring_fn,
                vec![
                    format!(
                        "SQ word at {:#x} = {:#06x} (big-endian in memory): the next free WQEBB counter {} & 0xffff",
                        view.dbrec_addr + 4,
                        view.sq_dbrec,
                        after
                    ),
                    format!(
                        "(RQ word at {:#x} = {:#06x})",
                        view.dbrec_addr, view.rq_dbrec
                    ),
                ],
                json!({"addr": view.dbrec_addr + 4, "value": view.sq_dbrec, "producer": after}),
            )
        }
        None => stage(
            i,
            "doorbell record",
            t1,
            ring_fn,
            vec![format!(
                "SQ word written {:#06x} (big-endian in memory): the next free WQEBB counter {after} & 0xffff",
                after & 0xffff
            )],
            json!({"value": after & 0xffff, "producer": after}),
        ),
    };
    out.push(dbrec);
    // 5. The barriers.
    let (b_dev, b_wc) = if cfg!(target_arch = "aarch64") {
        ("dmb oshst", "dsb st")
    } else {
        (
            "compiler barrier only (x86-64 orders write-back stores)",
            "sfence",
        )
    };
    out.push(stage(
        i,
        "barrier",
        t1,
        "mlx5::mmio::barrier",
        vec![
            format!("to_device before the doorbell record: {b_dev}"),
            format!("wc_start before the MMIO store: {b_wc}"),
            format!("wc_flush after it: {b_wc}"),
        ],
        json!({"to_device": b_dev, "wc_start": b_wc, "wc_flush": b_wc}),
    ));
    // The device's part.
    if let Some(emu) = emu {
        emu.run_until_idle();
        let events = emu.take_trace();
        device_stages(i, &events, a_qpn, b_qpn, wqe, ring_fn, out)?;
        if o.fault == Some(Fault::BadLkey) {
            local_key_check(i, &events, &local, o.op, out);
        }
    } else {
        out.push(hw_mmio_stage(i, t1, ring_fn, a, wqe, stats0, stats1));
        out.push(stage(
            i,
            "device",
            t1,
            "(hardware)",
            vec![HW_DEVICE_NOTE.to_owned()],
            json!({"observable": false}),
        ));
    }
    // The poll and the work completion (on hardware, polled until one arrives or 2 s pass).
    let mut wcs = [WorkCompletion::default(); 4];
    let tp = now();
    let n = poll_until(&mut a.scq, &mut wcs, emu.is_none());
    let mut lines = vec![format!("poll_cq on the send CQ returned {n} completion(s)")];
    if o.op == TraceOp::Send {
        let mut rw = [WorkCompletion::default(); 4];
        let rn = poll_until(&mut b.rcq, &mut rw, emu.is_none() && wcs[0].is_ok());
        if rn > 0 {
            let mut got = vec![0u8; size as usize];
            b.buf.read(area, &mut got);
            lines.push(format!(
                "responder's receive CQ: {rn} completion(s), wr_id {:#x}, byte_len {}, data {}",
                rw[0].wr_id,
                rw[0].byte_len,
                if got == pattern {
                    "matches what was sent"
                } else {
                    "DIFFERS from what was sent"
                }
            ));
        }
    }
    out.push(stage(
        i,
        "poll",
        tp,
        "mlx5::Cq::poll",
        lines,
        json!({"polled": n}),
    ));
    let wc = wcs[0];
    // The completion prints through `WorkCompletion`'s Display: an error brings its
    // explanation (`meaning:`, `causes:`, `check:` lines).
    let wc_lines: Vec<String> = if n == 0 {
        vec!["no work completion".to_owned()]
    } else {
        wc.to_string().lines().map(str::to_owned).collect()
    };
    let explanation = (n > 0 && !wc.is_ok())
        .then(|| mlx5_hw::cqe::explain(wc.syndrome, wc.vendor_err))
        .flatten()
        .map(|x| json!({"meaning": x.meaning, "causes": x.causes, "check": x.check}));
    out.push(stage(
        i,
        "work completion",
        now(),
        "mlx5::Cq::poll",
        wc_lines,
        json!({"wr_id": wc.wr_id, "status": wc.status.0, "opcode": wc.opcode.0,
               "byte_len": wc.byte_len, "qp_num": wc.qp_num, "returned": n,
               "syndrome": wc.syndrome.0, "vendor_err": wc.vendor_err.0,
               "explanation": explanation}),
    ));
    Ok(())
}

/// Poll `cq` once, or (`wait`) until a completion arrives or 2 s pass.
fn poll_until(cq: &mut Cq, wcs: &mut [WorkCompletion], wait: bool) -> usize {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let n = cq.poll(wcs);
        if n > 0 || !wait || Instant::now() > deadline {
            return n;
        }
        std::hint::spin_loop();
    }
}

/// On hardware: the MMIO write the driver made (BlueFlame copy or 8-byte doorbell), told by
/// its send queue's counters across the post, with the bytes it wrote (the WQE, from the
/// ring).
fn hw_mmio_stage(
    i: u32,
    t: u64,
    ring_fn: &str,
    a: &End,
    wqe: &[u8],
    s0: mlx5::SqStats,
    s1: mlx5::SqStats,
) -> Stage {
    let reg = a.qp.sq_ref().bfreg();
    let bf = s1.bf_copies > s0.bf_copies;
    let (name, mut lines, bytes) = if bf {
        let mut b = wqe.to_vec();
        b.resize(wqe.len().next_multiple_of(64), 0);
        let l = format!(
            "BlueFlame copy of {} B to UAR page {} (BlueFlame register {}, {} B per half)",
            b.len(),
            reg.uar_page,
            reg.id,
            reg.bf_size
        );
        ("BlueFlame copy", vec![l], b)
    } else {
        let b = wqe[..wqe.len().min(8)].to_vec();
        let l = format!(
            "8-byte doorbell (the WQE's first 8 bytes) to UAR page {} (register {}){}",
            reg.uar_page,
            reg.id,
            if s1.doorbells > s0.doorbells {
                ""
            } else {
                "; the queue's counters show no doorbell for this post"
            }
        );
        ("doorbell", vec![l], b)
    };
    lines.extend(hex_lines(&bytes));
    stage(
        i,
        name,
        t,
        ring_fn,
        lines,
        json!({"uar_page": reg.uar_page, "register": reg.id, "bytes": hex(&bytes),
               "len": bytes.len(), "blueflame": bf}),
    )
}

/// For a bad-lkey fault: the device's local key check, placed after the WQE fetch. The
/// emulator refuses the WQE whose local key is no MR's before any payload DMA or packet (for a
/// READ/atomic too: its scatter list is checked before the request goes out), and no trace
/// event carries the check itself; the stage says what was checked and what the events show
/// (a DMA read with the key or none, the packets, the error CQE).
fn local_key_check(i: u32, events: &[TraceEvent], local: &Sge, op: TraceOp, out: &mut Vec<Stage>) {
    let read = events
        .iter()
        .any(|e| matches!(&e.what, TraceWhat::DmaRead { key, .. } if *key == local.lkey));
    let packets = events
        .iter()
        .filter(|e| matches!(e.what, TraceWhat::Packet(_)))
        .count();
    let what = if matches!(op, TraceOp::Read | TraceOp::Atomic) {
        "scatter list (where the response would land)"
    } else {
        "gather list"
    };
    let lines = vec![
        format!(
            "FAIL lkey {:#010x} is not the key of a registered MR: the WQE's {what}, {} B at \
             {:#x}, is refused",
            local.lkey, local.length, local.addr
        ),
        format!(
            "seen: {} DMA read with this key, {packets} packet(s) on the wire, then the error CQE",
            if read { "a" } else { "no" }
        ),
    ];
    let data = json!({"check": "lkey", "ok": false, "lkey": local.lkey, "dma_read": read,
                      "packets": packets, "what": what});
    let at = out
        .iter()
        .rposition(|s| s.op_index == i && s.name == "WQE fetch")
        .map_or(out.len(), |k| k + 1);
    let (t, clock) = out
        .get(at.saturating_sub(1))
        .map_or((0, None), |s| (s.t_ns, s.clock_ns));
    let mut st = stage(
        i,
        "local key check",
        t,
        "mlx5_emu::device::dma::data_segs",
        lines,
        data,
    );
    st.clock_ns = clock;
    out.insert(at, st);
}

/// Turn the device's trace events into stages (consecutive responder checks are one stage).
fn device_stages(
    i: u32,
    events: &[TraceEvent],
    a_qpn: u32,
    b_qpn: u32,
    wqe: &[u8],
    ring_fn: &str,
    out: &mut Vec<Stage>,
) -> Result<(), String> {
    let mut pending_sq_db: Option<String> = None;
    let mut pending_rq_db: Option<String> = None;
    let mut retire: Option<String> = None;
    for ev in events {
        if let TraceWhat::Check {
            qpn,
            check,
            detail,
            ok,
        } = &ev.what
        {
            let line = format!("{} {check}: {detail}", if *ok { "ok  " } else { "FAIL" });
            let item = json!({"check": check, "detail": detail, "ok": ok, "qpn": qpn});
            match out.last_mut() {
                Some(last) if last.name == "responder checks" && last.op_index == i => {
                    last.lines.push(line);
                    if let Some(a) = last.data["checks"].as_array_mut() {
                        a.push(item);
                    }
                }
                _ => {
                    let mut st = stage(
                        i,
                        "responder checks",
                        ev.wall_ns,
                        ev.func,
                        vec![line],
                        json!({"checks": [item]}),
                    );
                    st.clock_ns = Some(ev.clock_ns);
                    out.push(st);
                }
            }
            continue;
        }
        let mut s = |name: &'static str, func: String, lines: Vec<String>, data: Value| {
            let mut st = stage(i, name, ev.wall_ns, &func, lines, data);
            st.clock_ns = Some(ev.clock_ns);
            out.push(st);
        };
        let f = ev.func.to_owned();
        match &ev.what {
            TraceWhat::Mmio {
                qpn,
                offset,
                bytes,
                blueflame,
            } => {
                let (name, what) = if *blueflame {
                    (
                        "BlueFlame copy",
                        format!("BlueFlame copy of {} B", bytes.len()),
                    )
                } else {
                    ("doorbell", "8-byte doorbell".to_owned())
                };
                let mut lines = vec![format!(
                    "{what} to UAR offset {offset:#x} for QP {qpn:#08x} (the WQE's first 8 bytes{})",
                    if *blueflame {
                        " and the rest of the WQE"
                    } else {
                        ""
                    }
                )];
                lines.extend(hex_lines(bytes));
                if *blueflame {
                    let same = bytes.len() >= wqe.len() && bytes[..wqe.len()] == *wqe;
                    lines.push(format!(
                        "copy {} the WQE in the ring",
                        if same { "equals" } else { "DIFFERS from" }
                    ));
                }
                lines.push(format!("consumed by {f}"));
                s(
                    name,
                    ring_fn.to_owned(),
                    lines,
                    json!({"qpn": qpn, "offset": offset, "bytes": hex(bytes), "len": bytes.len(),
                           "blueflame": blueflame, "seen_by": f}),
                );
            }
            TraceWhat::DbrecRead {
                queue,
                num,
                addr,
                value,
            } => {
                let l = format!(
                    "read the {queue} doorbell record of {num:#08x} at {addr:#x}: {value:#06x}"
                );
                if *queue == "sq" {
                    pending_sq_db = Some(l);
                } else {
                    pending_rq_db = Some(l);
                }
            }
            TraceWhat::WqeFetch {
                qpn,
                wqe_index,
                addr,
                bytes,
            } => {
                let mut lines = Vec::new();
                if let Some(l) = pending_sq_db.take() {
                    lines.push(l);
                }
                lines.push(format!(
                    "DMA read of {} B at {addr:#x} (WQEBB {wqe_index}) from QP {qpn:#08x}'s send ring",
                    bytes.len()
                ));
                let same = bytes.len() >= wqe.len() && bytes[..wqe.len()] == *wqe;
                lines.push(format!(
                    "fetched bytes {} the WQE as written",
                    if same { "equal" } else { "DIFFER from" }
                ));
                s(
                    "WQE fetch",
                    f,
                    lines,
                    json!({"qpn": qpn, "wqe_index": wqe_index, "addr": addr, "len": bytes.len(), "same": same}),
                );
            }
            TraceWhat::DmaRead {
                qpn,
                va,
                len,
                key,
                purpose,
            } => {
                let name = if *qpn == a_qpn {
                    "DMA read"
                } else {
                    "responder DMA read"
                };
                s(
                    name,
                    f,
                    vec![format!(
                        "{purpose}: {len} B at va {va:#x} with key {key:#010x} (QP {qpn:#08x})"
                    )],
                    json!({"qpn": qpn, "va": va, "len": len, "key": key, "purpose": purpose}),
                );
            }
            TraceWhat::Packet(p) => {
                let h = decode_packet(&p.bytes)?;
                let request = h.dest_qp == b_qpn;
                let name = match (request, h.opcode & 0x1f) {
                    (true, _) => "packet",
                    (false, 0x11) if h.aeth.is_some_and(|(syn, _)| syn >> 5 == 3) => "NAK",
                    (false, 0x11) => "ACK",
                    (false, 0x12) => "atomic ACK",
                    (false, _) => "READ response",
                };
                let mut lines = vec![format!(
                    "{} B on the wire from HCA {} to LID {} (RoCEv2 UDP payload: BTH onwards)",
                    p.bytes.len(),
                    p.src_hca,
                    p.dst_lid
                )];
                lines.extend(h.lines());
                s(
                    name,
                    f,
                    lines,
                    json!({"len": p.bytes.len(), "headers": h.to_json(), "bytes": hex(&p.bytes)}),
                );
            }
            TraceWhat::Check { .. } => {}
            TraceWhat::RecvWqe {
                qpn,
                wqe_counter,
                sges,
            } => {
                let mut lines = Vec::new();
                if let Some(l) = pending_rq_db.take() {
                    lines.push(l);
                }
                lines.push(format!("QP {qpn:#08x} receive WQE {wqe_counter}"));
                for (k, (va, len, key)) in sges.iter().enumerate() {
                    lines.push(format!(
                        "scatter[{k}]: addr {va:#x} length {len} lkey {key:#010x}"
                    ));
                }
                s(
                    "receive WQE",
                    f,
                    lines,
                    json!({"qpn": qpn, "wqe_counter": wqe_counter,
                           "sges": sges.iter().map(|(a, l, k)| json!({"addr": a, "length": l, "lkey": k})).collect::<Vec<_>>()}),
                );
            }
            TraceWhat::DmaWrite {
                qpn,
                addr,
                len,
                purpose,
                head,
            } => {
                let name = if *qpn == b_qpn {
                    "data placed"
                } else {
                    "data placed (requester)"
                };
                let shown = String::from_utf8_lossy(&head[..head.len().min(32)]).into_owned();
                s(
                    name,
                    f,
                    vec![
                        format!("{purpose}: DMA write of {len} B at {addr:#x} (QP {qpn:#08x})"),
                        format!("first bytes: {:?}", shown),
                    ],
                    json!({"qpn": qpn, "addr": addr, "len": len, "purpose": purpose}),
                );
            }
            TraceWhat::Cqe {
                cqn,
                index,
                addr,
                bytes,
            } => {
                let dec = decode_cqe(bytes, Some(64))?;
                let qpn = dec
                    .value("cqe", "qpn")
                    .and_then(Value::as_u64)
                    .or_else(|| dec.value("error", "qpn").and_then(Value::as_u64))
                    .unwrap_or(0) as u32;
                let name = if qpn == a_qpn { "requester CQE" } else { "CQE" };
                let mut lines = Vec::new();
                if name == "requester CQE" {
                    if let Some(r) = retire.take() {
                        lines.push(r);
                    }
                }
                lines.push(format!(
                    "64 B CQE written at {addr:#x}: CQ {cqn:#08x} entry {index}"
                ));
                lines.extend(dec.to_text().lines().skip(1).map(str::to_owned));
                s(
                    name,
                    f,
                    lines,
                    json!({"cqn": cqn, "index": index, "addr": addr, "bytes": hex(bytes), "decoded": dec.to_json()}),
                );
            }
            TraceWhat::Retire {
                qpn,
                wqe_counter,
                cqe,
            } => {
                retire = Some(format!(
                    "QP {qpn:#08x} retired WQE {wqe_counter} on the response{}",
                    if *cqe {
                        "; it is signaled: CQE"
                    } else {
                        "; unsignaled: no CQE"
                    }
                ));
            }
        }
    }
    Ok(())
}

/// The stages as text: one header line per stage (`[op] +time  name  (function)`), then its
/// lines indented.
pub fn to_text(stages: &[Stage]) -> String {
    let mut s = String::new();
    for st in stages {
        s.push_str(&format!(
            "[{}] {:>9.3} us  {:<17} {}\n",
            st.op_index,
            st.t_ns as f64 / 1000.0,
            st.name,
            st.func
        ));
        for l in &st.lines {
            s.push_str("      ");
            s.push_str(l);
            s.push('\n');
        }
    }
    s
}

/// The stages as JSON.
pub fn to_json(o: &TraceOpts, stages: &[Stage]) -> Value {
    json!({
        "op": format!("{:?}", o.op).to_lowercase(),
        "size": o.size,
        "inline": o.inline,
        "bf": o.bf,
        "n": o.n,
        "fault": o.fault.map(Fault::name),
        "time_basis": "t_ns: wall-clock ns since tracing began (stepped emulator, one process); clock_ns: the emulated clock",
        "stages": stages.iter().map(|st| json!({
            "op_index": st.op_index,
            "stage": st.name,
            "t_ns": st.t_ns,
            "clock_ns": st.clock_ns,
            "function": st.func,
            "lines": st.lines,
            "data": st.data,
        })).collect::<Vec<_>>(),
    })
}

/// `mlx5 trace`.
///
/// # Errors
/// As [`trace`].
pub fn command(a: &crate::cli::TraceArgs) -> Result<(), String> {
    let o = TraceOpts {
        op: a.op,
        size: a.size,
        inline: a.inline,
        bf: a.bf != crate::cli::OnOff::Off,
        n: a.iters,
        fault: a.fault,
    };
    // A real device unless --emu (discovery failing or finding none: the emulator).
    let dev = if a.emu {
        None
    } else {
        mlx5::devices().ok().and_then(|l| l.into_iter().next())
    };
    let stages = trace_on(&o, dev.as_ref())?;
    let on = dev.as_ref().map_or_else(
        || "on the emulated ConnectX (stepped)".to_owned(),
        |d| format!("on {} (hardware: the host's stages only)", d.name),
    );
    if a.json {
        let mut v = to_json(&o, &stages);
        v["device"] = json!(dev.as_ref().map_or("emulated", |d| d.name.as_str()));
        println!(
            "{}",
            serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?
        );
    } else {
        print!(
            "mlx5 trace {}{}: {} B, inline up to {} B, BlueFlame {}, {on}\n{}",
            format!("{:?}", o.op).to_lowercase(),
            o.fault
                .map_or(String::new(), |f| format!(" --fault {}", f.name())),
            if o.op == TraceOp::Atomic { 8 } else { o.size },
            o.inline,
            if o.bf { "on" } else { "off" },
            to_text(&stages)
        );
    }
    Ok(())
}
