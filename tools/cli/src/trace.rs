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
    /// scatter of the response (READ/atomic) is refused, the CQE is LOCAL_PROT (vendor 0x50).
    /// Forces the payload to be gathered (an inline payload has no lkey).
    BadLkey,
    /// The remote key of a WRITE/READ/atomic is no MR's: the responder's rkey check fails, it
    /// answers with a NAK and the requester's CQE is REM_ACCESS_ERR.
    BadRkey,
    /// The local SGE's key is an MR of another protection domain than the QP's: LOCAL_PROT,
    /// vendor 0x52 (PD violation).
    PdMismatch,
    /// WRITE/READ/atomic into a responder MR registered without the right the operation needs
    /// (e.g. a WRITE into an MR of LOCAL_WRITE|REMOTE_READ): NAK, REM_ACCESS_ERR.
    Rights,
    /// WRITE/READ/atomic whose remote range runs past the end of the responder's MR: NAK,
    /// REM_ACCESS_ERR.
    Range,
    /// SEND with no receive posted at the responder and an RNR retry count of 1: RNR NAKs,
    /// then RNR_RETRY_EXC_ERR.
    Rnr,
    /// The responder's QP is in the error state (it drops every request): no ACK, the
    /// requester retransmits retry_cnt times, then RETRY_EXC_ERR.
    Retry,
    /// SEND one byte longer than the receive posted at the responder: its receive completes
    /// with LOC_LEN_ERR, the requester's with REM_INV_REQ_ERR.
    Length,
}

impl Fault {
    /// Every fault kind.
    pub const ALL: [Fault; 8] = [
        Fault::BadLkey,
        Fault::BadRkey,
        Fault::PdMismatch,
        Fault::Rights,
        Fault::Range,
        Fault::Rnr,
        Fault::Retry,
        Fault::Length,
    ];

    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Fault::BadLkey => "bad-lkey",
            Fault::BadRkey => "bad-rkey",
            Fault::PdMismatch => "pd-mismatch",
            Fault::Rights => "rights",
            Fault::Range => "range",
            Fault::Rnr => "rnr",
            Fault::Retry => "retry",
            Fault::Length => "length",
        }
    }

    /// What the fault points at: the cause a correct diagnosis names first.
    pub fn pointer(self) -> mlx5_hw::syndrome::Pointer {
        use mlx5_hw::syndrome::Pointer;
        match self {
            Fault::BadLkey | Fault::BadRkey => Pointer::KeyUnknown,
            Fault::PdMismatch => Pointer::PdMismatch,
            Fault::Rights => Pointer::Rights,
            Fault::Range => Pointer::Range,
            Fault::Rnr => Pointer::NoReceive,
            Fault::Retry => Pointer::NoAck,
            Fault::Length => Pointer::Length,
        }
    }

    /// Whether it needs a remote key (WRITE, READ, atomic).
    fn remote(self) -> bool {
        matches!(self, Fault::BadRkey | Fault::Rights | Fault::Range)
    }

    /// Whether it is about a SEND's receive.
    fn send_only(self) -> bool {
        matches!(self, Fault::Rnr | Fault::Length)
    }

    /// Whether it is about the local key (the payload is then gathered, not inline).
    fn local(self) -> bool {
        matches!(self, Fault::BadLkey | Fault::PdMismatch)
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
    /// Stage name: "work request", "checks", "WQE", ... (`docs/trace-and-tune.md`)
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
    /// XRCETH (XRC class 0xA0): the XRC SRQ the request is for.
    pub xrceth: Option<u32>,
    /// DCETH (this fabric's DC class 0xE0): DC access key, connect flag, the DCI's QPN.
    pub dceth: Option<(u64, bool, u32)>,
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
        // XRC (IBTA) and this fabric's DC requests: RC's low bits
        5 | 7 if base <= 0x17 => rc,
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
    // XRC and DC requests carry their extended header after the BTH, then RC's
    let hpc = matches!(h.opcode >> 5, 5 | 7) && base <= 0x17;
    let rc = h.opcode >> 5 == 0 || hpc;
    if hpc && h.opcode >> 5 == 5 {
        need(off + 4, "XRCETH")?;
        h.xrceth = Some(be32(off) & 0xff_ffff);
        off += 4;
    } else if hpc {
        need(off + 16, "DCETH")?;
        let w = be32(off + 8);
        h.dceth = Some((be64(off), w & 0x8000_0000 != 0, w & 0xff_ffff));
        off += 16;
    }
    if h.opcode >> 5 == 3 {
        need(off + 8, "DETH")?;
        off += 8;
    }
    if matches!(base, 0x06 | 0x0A | 0x0B | 0x0C) && h.opcode >> 5 != 3 {
        need(off + 16, "RETH")?;
        h.reth = Some((be64(off), be32(off + 8), be32(off + 12)));
        off += 16;
    }
    if matches!(base, 0x13 | 0x14) && rc {
        need(off + 28, "AtomicETH")?;
        h.atomic_eth = Some((be64(off), be32(off + 8), be64(off + 12), be64(off + 20)));
        off += 28;
    }
    if matches!(base, 0x0D | 0x0F | 0x10 | 0x11 | 0x12) && rc {
        need(off + 4, "AETH")?;
        let a = be32(off);
        h.aeth = Some(((a >> 24) as u8, a & 0xff_ffff));
        off += 4;
    }
    if base == 0x12 && rc {
        need(off + 8, "AtomicAckETH")?;
        h.atomic_ack = Some(be64(off));
        off += 8;
    }
    if matches!(base, 0x03 | 0x05 | 0x09 | 0x0B) {
        need(off + 4, "ImmDt")?;
        h.imm = Some([b[off], b[off + 1], b[off + 2], b[off + 3]]);
        off += 4;
    }
    if matches!(base, 0x16 | 0x17) && rc {
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

/// The name of an AETH NAK code (IBA 9.7.5.2.8, table 45).
pub fn nak_name(code: u8) -> &'static str {
    match code {
        0 => "PSN sequence error",
        1 => "invalid request",
        2 => "remote access error",
        3 => "remote operational error",
        4 => "invalid RD request",
        _ => "reserved",
    }
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
        if let Some(srqn) = self.xrceth {
            v.push(format!("XRCETH  XRC SRQ {srqn:#08x}"));
        }
        if let Some((key, connect, dci)) = self.dceth {
            v.push(format!(
                "DCETH   DC key {key:#x}  connect {}  DCI {dci:#08x}{}",
                u8::from(connect),
                if connect {
                    "  (the DCI connects to this DCT: the responder makes its context)"
                } else {
                    ""
                }
            ));
        }
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
                1 => format!("RNR NAK (timer code {})", syn & 0x1f),
                3 => format!("NAK {} (code {})", nak_name(syn & 0x1f), syn & 0x1f),
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
            "xrceth": self.xrceth,
            "dceth": self.dceth.map(|(k, c, d)| json!({"key": k, "connect": c, "dci": d})),
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
    rig_rnr(size, inline, bf, depth, 7)
}

/// [`rig`] with the requester's RNR retry count `rnr_retry` (7: for ever).
fn rig_rnr(size: u32, inline: u32, bf: bool, depth: u32, rnr_retry: u8) -> Result<Rig, String> {
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
    a.qp.to_rts(0x100, rnr_retry).map_err(err("RTS"))?;
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
fn rig_hw(
    dev: &mlx5::Device,
    size: u32,
    inline: u32,
    bf: bool,
    rnr_retry: u8,
) -> Result<HwRig, String> {
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
    a.qp.to_rts_with(0x100, &p.rnr_retry(rnr_retry))
        .map_err(err("RTS"))?;
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
        Some(f) if f.remote() && o.op == TraceOp::Send => {
            return Err(format!(
                "--fault {} with send: a SEND carries no remote key (use write, read or atomic)",
                f.name()
            ));
        }
        Some(f) if f.send_only() && o.op != TraceOp::Send => {
            return Err(format!(
                "--fault {} with {:?}: the fault is about the receive a SEND consumes (use send)",
                f.name(),
                o.op
            )
            .to_lowercase());
        }
        Some(Fault::Length) if size < 2 => {
            return Err(
                "--fault length with -s 1: the receive must be one byte shorter than the message \
                 (and a length of 0 means 2 GiB): use -s 2 or more"
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
    let rnr = if o.fault == Some(Fault::Rnr) { 1 } else { 7 };
    if let Some(d) = dev {
        let mut r = rig_hw(d, size, o.inline, o.bf, rnr)?;
        r.a.buf.write(0, &pattern);
        let fs = fault_setup((&r._ctx, &r._pd), &mut r.a, &mut r.b, o, size, r.area)?;
        for i in 0..o.n {
            let ends = (&mut r.a, &mut r.b);
            trace_one(
                None,
                start,
                ends,
                o,
                &fs,
                size,
                r.area,
                &pattern,
                i,
                &mut stages,
            )?;
        }
        return Ok(stages);
    }
    let mut r = rig_rnr(size, o.inline, o.bf, 64, rnr)?;
    r.a.buf.write(0, &pattern);
    let fs = fault_setup((&r._ctx, &r._pd), &mut r.a, &mut r.b, o, size, r.area)?;
    r.emu.run_until_idle();
    r.emu.trace(true);
    for i in 0..o.n {
        let ends = (&mut r.a, &mut r.b);
        trace_one(
            Some(&r.emu),
            start,
            ends,
            o,
            &fs,
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

/// What a fault changes in the traced operation, and the objects it needs alive (an MR of
/// another PD, an MR without a right).
struct FaultSetup {
    /// The local key to use instead of the MR's.
    lkey: Option<u32>,
    /// The remote key and address to use instead of the responder MR's.
    remote: Option<(u64, u32)>,
    /// The length of the responder's receive instead of its whole area.
    recv_len: Option<u32>,
    /// Post no receive at the responder.
    no_recv: bool,
    /// What the fault did, for the work request stage.
    note: Option<String>,
    _mr: Option<mlx5::Mr>,
    _pd: Option<Pd>,
}

/// Prepare fault `o.fault` on the pair (`a` sends to `b`).
fn fault_setup(
    (ctx, pd): (&Context, &Pd),
    a: &mut End,
    b: &mut End,
    o: &TraceOpts,
    size: u32,
    area: usize,
) -> Result<FaultSetup, String> {
    let mut f = FaultSetup {
        lkey: None,
        remote: None,
        recv_len: None,
        no_recv: false,
        note: None,
        _mr: None,
        _pd: None,
    };
    // A key no MR has: the index bits (above the 8-bit variant) flipped.
    let bad = |k: u32| k ^ 0x00ff_ff00;
    let end = b.mr.addr() + b.mr.len();
    let Some(fault) = o.fault else {
        return Ok(f);
    };
    let note = match fault {
        Fault::BadLkey => {
            let k = bad(a.mr.lkey());
            f.lkey = Some(k);
            format!(
                "lkey {k:#010x} is no MR's (the MR's is {:#010x}); the payload is gathered (an \
                 inline one carries no lkey)",
                a.mr.lkey()
            )
        }
        Fault::BadRkey => {
            let k = bad(b.mr.rkey());
            f.remote = Some((b.mr.addr() + area as u64, k));
            format!(
                "rkey {k:#010x} is no MR's (the remote MR's is {:#010x})",
                b.mr.rkey()
            )
        }
        Fault::PdMismatch => {
            let pd2 = Pd::new(ctx).map_err(err("ALLOC_PD (a second PD)"))?;
            let mr = pd2
                .reg_mr(&a.buf, Access::ALL)
                .map_err(err("REG_MR on the second PD"))?;
            f.lkey = Some(mr.lkey());
            let n = format!(
                "lkey {:#010x} is an MR of another PD (same buffer) than the QP's; the payload is \
                 gathered",
                mr.lkey()
            );
            f._mr = Some(mr);
            f._pd = Some(pd2);
            n
        }
        Fault::Rights => {
            let (acc, lacks) = match o.op {
                TraceOp::Read => (Access::LOCAL_WRITE | Access::REMOTE_WRITE, "REMOTE_READ"),
                TraceOp::Atomic => (
                    Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
                    "REMOTE_ATOMIC",
                ),
                _ => (Access::LOCAL_WRITE | Access::REMOTE_READ, "REMOTE_WRITE"),
            };
            let mr = pd
                .reg_mr(&b.buf, acc)
                .map_err(err("REG_MR without the right"))?;
            f.remote = Some((mr.addr() + area as u64, mr.rkey()));
            let n = format!(
                "rkey {:#010x} is a responder MR registered without {lacks}",
                mr.rkey()
            );
            f._mr = Some(mr);
            n
        }
        Fault::Range => {
            let va = end - u64::from((size / 2) & !7);
            f.remote = Some((va, b.mr.rkey()));
            format!(
                "remote addr {va:#x} + len {size} runs past the end {end:#x} of the responder's MR"
            )
        }
        Fault::Rnr => {
            f.no_recv = true;
            "no receive posted at the responder; the requester's rnr_retry is 1".to_owned()
        }
        Fault::Retry => {
            b.qp.to_error().map_err(err("responder QP to ERR"))?;
            "the responder's QP is in the error state: it drops every request, no ACK comes back"
                .to_owned()
        }
        Fault::Length => {
            f.recv_len = Some(size - 1);
            format!(
                "the responder's receive is {} B, one byte shorter than the {size} B SEND",
                size - 1
            )
        }
    };
    f.note = Some(note);
    Ok(f)
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
    fs: &FaultSetup,
    size: u32,
    area: usize,
    pattern: &[u8],
    i: u32,
    out: &mut Vec<Stage>,
) -> Result<(), String> {
    // An inline payload carries no lkey: a bad-lkey fault gathers.
    let inline = matches!(o.op, TraceOp::Send | TraceOp::Write)
        && size <= o.inline
        && !o.fault.is_some_and(Fault::local);
    let wr_id = 0x1000 + u64::from(i);
    let (a_qpn, b_qpn) = (a.qp.qpn(), b.qp.qpn());
    // The responder's receive for a SEND (set up before the trace of this operation).
    if o.op == TraceOp::Send && !fs.no_recv {
        let sge = [Sge {
            addr: b.mr.addr() + area as u64,
            length: fs.recv_len.unwrap_or(area as u32),
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
    let (raddr, rkey) = fs
        .remote
        .unwrap_or((b.mr.addr() + area as u64, b.mr.rkey()));
    let failed_before = emu.map_or(0, |e| e.failed_checks().len());
    let local = Sge {
        addr: a.mr.addr()
            + if matches!(o.op, TraceOp::Read | TraceOp::Atomic) {
                area as u64
            } else {
                0
            },
        length: size,
        lkey: fs.lkey.unwrap_or(a.mr.lkey()),
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
    if let (Some(f), Some(n)) = (o.fault, &fs.note) {
        lines.push(format!("fault {}: {n}", f.name()));
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
        let failed = emu.failed_checks();
        let mine: Vec<_> = failed
            .get(failed_before.min(failed.len())..)
            .unwrap_or_default()
            .iter()
            .filter(|c| c.side == "requester" && c.qpn == a_qpn)
            .filter(|c| matches!(c.check, "key" | "PD" | "rights" | "range"))
            .collect();
        if let Some(c) = mine.first() {
            local_key_check(i, &events, &local, o.op, c, out);
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
    // An error: the completion's first line, then its explanation ranked by the evidence
    // (the CQE, the WQE as written, the device's failed checks of this operation).
    let device = emu.map(|e| {
        let all = e.failed_checks();
        all.get(failed_before.min(all.len())..)
            .unwrap_or_default()
            .iter()
            .filter(|c| c.qpn == a_qpn || c.qpn == b_qpn)
            .map(crate::diag::DeviceCheck::from)
            .collect::<Vec<_>>()
    });
    let evidence = (n > 0 && !wc.is_ok()).then(|| {
        let (opcode, line) = crate::diag::wqe_line(wqe, false);
        crate::diag::Evidence {
            syndrome: wc.syndrome,
            vendor: wc.vendor_err.0,
            opcode,
            wqe: Some(format!("as written to the send ring: {line}")),
            device: device.clone(),
        }
    });
    let wc_lines: Vec<String> = match (&evidence, n) {
        (_, 0) => vec!["no work completion".to_owned()],
        (Some(ev), _) => {
            let text = wc.to_string();
            let mut v: Vec<String> = text.lines().take(1).map(str::to_owned).collect();
            v.extend(crate::diag::ranked_text(ev).lines().map(str::to_owned));
            v
        }
        (None, _) => wc.to_string().lines().map(str::to_owned).collect(),
    };
    let first_cause = evidence.as_ref().and_then(crate::diag::first_cause);
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
               "explanation": explanation, "first_cause": first_cause,
               "device_checks": device.unwrap_or_default().iter().map(|c| json!({
                   "side": c.side, "qpn": c.qpn, "check": c.check, "detail": c.detail})).collect::<Vec<_>>()}),
    ));
    Ok(())
}

/// `mlx5 trace send -c DC`: one SEND from a DCI to a DCT on the stepped emulated HCA. The
/// DCT on its SRQ (its number from RTR), the DCI (RTS with no destination), the work request
/// with its DC address (AH, DCT number, perftest's key), the WQE with the datagram segment,
/// then the device's stages: the first packet carries the DCETH with the connect flag (the
/// DCT makes the DCI's responder context), the receive from the SRQ, the CQEs and the ACK.
///
/// # Errors
/// A step the driver or the emulator refused (named), or a size over the buffer.
pub fn trace_dc(o: &TraceOpts) -> Result<Vec<Stage>, String> {
    use mlx5::{Ah, AhAttr, DcAddr, DcWr, Dci, Dct, Srq};
    if o.op != TraceOp::Send || o.fault.is_some() {
        return Err("trace -c DC: `trace send` without --fault only, for now".into());
    }
    let emu = Emulator::new(EmuConfig {
        mode: RunMode::Stepped,
        ..EmuConfig::default()
    });
    emu.count_link(true);
    emu.trace(true);
    let ctx = Context::open(emu.open(0).map_err(|e| format!("emulator: {e:?}"))?)
        .map_err(err("emulated context"))?;
    let pd = Pd::new(&ctx).map_err(err("ALLOC_PD"))?;
    let size = o.size;
    let area = (size as usize).max(8).next_multiple_of(64);
    let buf = Arc::new(DmaBuf::new(2 * area).map_err(err("buffer"))?);
    let mr = pd.reg_mr(&buf, Access::ALL).map_err(err("REG_MR"))?;
    let cq = |n| {
        Cq::new(
            &ctx,
            CqInit {
                cqe: n,
                ..CqInit::default()
            },
            None,
        )
        .map_err(err("CREATE_CQ"))
    };
    let mut scq = cq(16)?;
    let mut rcq = cq(16)?;
    let lid = ctx.query_port(1).map_err(err("QUERY_PORT"))?.lid;
    let p = ConnectParams::new().mtu(Mtu::M1024).timeout(8);
    let mut out = Vec::new();
    let key = crate::xrc_dc::DC_KEY;
    // The target: an SRQ with one receive, the DCT on it, to RTR.
    let mut srq = Srq::new(&pd, 4, 1).map_err(err("CREATE_SRQ"))?;
    let rsge = [mr.sge(area as u64, area as u32)];
    srq.post_recv(&[RecvWr {
        wr_id: 0x2000,
        sg_list: &rsge,
    }])
    .map_err(|(_, e)| format!("post_recv to the SRQ: {e}"))?;
    let mut dct = Dct::new(&pd, &rcq, &srq, key).map_err(err("CREATE_QP (DCT)"))?;
    let dctn = dct
        .activate(1, Access::ALL, &p)
        .map_err(err("DCT: INIT, RTR"))?;
    out.push(stage(
        0,
        "DC target",
        emu.trace_clock(),
        "mlx5::Dct::activate",
        vec![
            format!("DCT on SRQ {:#x} (one receive of {area} B posted), key {key:#x}", srq.srqn()),
            "RESET -> INIT (port 1, remote access) -> RTR (AV, path MTU, RNR timer): a DCT goes no further".into(),
            format!("DCT number {dctn:#08x}, from the RTR answer (0 before; the QPN field of perftest's later keys)"),
        ],
        json!({"dctn": dctn, "srqn": srq.srqn(), "key": key}),
    ));
    // The initiator: RTS with no destination.
    let mut init = QpInitAttr::new(QpType::Dci, &scq, &scq);
    init.cap = QpCap {
        max_send_wr: 4,
        max_recv_wr: 0,
        max_send_sge: 1,
        max_recv_sge: 0,
        max_inline_data: o.inline,
    };
    init.bf_policy = if o.bf {
        BfPolicy::PreferBf
    } else {
        BfPolicy::AlwaysDoorbell
    };
    let mut dci = Dci::new(&pd, &init).map_err(err("CREATE_QP (DCI)"))?;
    dci.activate(1, 0x100, &p)
        .map_err(err("DCI: INIT, RTR, RTS"))?;
    let ah = Ah::new(
        &pd,
        AhAttr {
            dlid: lid,
            port_num: 1,
            ..AhAttr::default()
        },
    )
    .map_err(err("CREATE_AH"))?;
    let to = DcAddr::new(&ah, dctn, key).map_err(err("DC address"))?;
    let dci_qpn = dci.qp().qpn();
    out.push(stage(
        0,
        "DC initiator",
        emu.trace_clock(),
        "mlx5::Dci::activate",
        vec![
            format!("DCI {dci_qpn:#08x}: RESET -> INIT -> RTR (path MTU, no destination) -> RTS, send PSN 0x100"),
            format!("address of the target: AH to LID {lid:#x}, DCT {dctn:#08x}, key {key:#x} (copied into each WQE)"),
        ],
        json!({"dci": dci_qpn, "dlid": lid, "dctn": dctn}),
    ));
    emu.run_until_idle();
    emu.take_trace();
    let pattern: Vec<u8> = (0..size)
        .map(|j| (j as u8).wrapping_mul(37) ^ 0x5a)
        .collect();
    buf.write(0, &pattern);
    let inline = size <= o.inline;
    let sge = [mr.sge(0, size)];
    let inl: [&[u8]; 1] = [&pattern];
    let mut wr = SendWr::new(0x1000, WrOp::Send, &sge, SendFlags::SIGNALED);
    if inline {
        wr = wr.with_inline(&inl);
    }
    out.push(stage(
        0,
        "work request",
        emu.trace_clock(),
        "mlx5::Dci::post_send",
        vec![
            format!(
                "SEND wr_id 0x1000, {size} B{}, SIGNALED",
                if inline { " inline" } else { "" }
            ),
            format!("DcWr: to DCT {dctn:#08x} through the AH, key {key:#x}"),
        ],
        json!({"wr_id": 0x1000, "size": size, "inline": inline, "dctn": dctn}),
    ));
    let producer = dci.sq().producer();
    dci.post_send(&[DcWr {
        dest: &to,
        wr,
        stream: 0,
    }])
    .map_err(|(_, e)| format!("post_send refused: {e}"))?;
    let after = dci.sq().producer();
    let bbs = after.wrapping_sub(producer) as usize;
    let mut ring = vec![0u8; bbs * 64];
    dci.sq().wqe_bytes(producer, &mut ring);
    let ds = usize::from(ring.get(7).copied().unwrap_or(0) & 0x3f);
    let wqe = ring[..(ds * 16).min(ring.len())].to_vec();
    let dec = crate::decode::decode_wqe_on(&wqe, crate::decode::WqeTransport::Dci)?;
    let mut lines = vec![format!(
        "{} B at WQEBB {producer} of the DCI's send ring, {bbs} WQEBB(s): control, datagram (DC address), payload",
        wqe.len()
    )];
    lines.extend(dec.to_text().lines().skip(1).map(str::to_owned));
    lines.extend(hex_lines(&wqe));
    out.push(stage(
        0,
        "WQE",
        emu.trace_clock(),
        "mlx5::xrc::post_one",
        lines,
        json!({"index": producer, "wqebbs": bbs, "bytes": hex(&wqe), "decoded": dec.to_json()}),
    ));
    emu.run_until_idle();
    let events = emu.take_trace();
    device_stages(
        0,
        &events,
        dci_qpn,
        dctn,
        &wqe,
        "mlx5::qp::sq::SendQueue::ring",
        &mut out,
    )?;
    let mut wcs = [WorkCompletion::default(); 4];
    let n = poll_until(&mut scq, &mut wcs, false);
    let mut rw = [WorkCompletion::default(); 4];
    let rn = poll_until(&mut rcq, &mut rw, false);
    let mut got = vec![0u8; size as usize];
    buf.read(area, &mut got);
    let mut lines = vec![format!(
        "poll_cq on the DCI's send CQ returned {n} completion(s)"
    )];
    lines.extend(
        wcs[..n]
            .iter()
            .map(|w| w.to_string().lines().next().unwrap_or("").to_owned()),
    );
    lines.push(format!(
        "the DCT's receive CQ: {rn} completion(s){}, data {}",
        if rn > 0 {
            format!(" (QP {:#08x}, byte_len {})", rw[0].qp_num, rw[0].byte_len)
        } else {
            String::new()
        },
        if got == pattern {
            "matches what was sent"
        } else {
            "DIFFERS from what was sent"
        }
    ));
    let ok = n == 1 && wcs[0].is_ok() && rn == 1 && rw[0].is_ok() && got == pattern;
    out.push(stage(
        0,
        "poll",
        emu.trace_clock(),
        "mlx5::Cq::poll",
        lines,
        json!({"polled": n, "received": rn, "ok": ok}),
    ));
    if !ok {
        return Err(format!(
            "trace -c DC: the SEND did not complete as it should\n{}",
            to_text(&out)
        ));
    }
    Ok(out)
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

/// For a local key fault: the device's key check, placed after the WQE fetch. The emulator
/// refuses the WQE whose local key fails before any payload DMA or packet (for a READ/atomic
/// too: its scatter list is checked before the request goes out); `c` is the device's record
/// of the check (which one, the expected and the actual value), the stage adds what the
/// events show (a DMA read with the key or none, the packets, the error CQE).
fn local_key_check(
    i: u32,
    events: &[TraceEvent],
    local: &Sge,
    op: TraceOp,
    c: &mlx5_emu::FailedCheck,
    out: &mut Vec<Stage>,
) {
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
        format!("FAIL {}: {}", c.check, c.detail),
        format!(
            "the WQE's {what}, {} B at {:#x} with lkey {:#010x}, is refused",
            local.length, local.addr, local.lkey
        ),
        format!(
            "seen: {} DMA read with this key, {packets} packet(s) on the wire, then the error CQE",
            if read { "a" } else { "no" }
        ),
    ];
    let data = json!({"check": c.check, "detail": c.detail, "ok": false, "lkey": local.lkey,
                      "dma_read": read, "packets": packets, "what": what});
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
        "mlx5_emu::device::dma::check_key",
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
                // The decoder's explanation of an error CQE is the table's alone: the work
                // completion below prints it ranked by all the evidence instead.
                let text = dec.to_text();
                let mut explained = false;
                for l in text.lines().skip(1) {
                    if ["meaning: ", "causes: ", "check: "]
                        .iter()
                        .any(|k| l.starts_with(k))
                    {
                        explained = true;
                    } else {
                        lines.push(l.to_owned());
                    }
                }
                if explained {
                    lines.push(
                        "(explained with the work completion below, ranked by the evidence)"
                            .to_owned(),
                    );
                }
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
    match a.connection {
        crate::cli::Conn::Rc => {}
        crate::cli::Conn::Dc => {
            check_opts(&o)?;
            let stages = trace_dc(&o)?;
            if a.json {
                let mut v = to_json(&o, &stages);
                v["device"] = json!("emulated");
                v["connection"] = json!("DC");
                println!(
                    "{}",
                    serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?
                );
            } else {
                print!(
                    "mlx5 trace send -c DC: {} B, inline up to {} B, BlueFlame {}, on the emulated ConnectX (stepped)\n{}",
                    o.size,
                    o.inline,
                    if o.bf { "on" } else { "off" },
                    to_text(&stages)
                );
            }
            return Ok(());
        }
        c => return Err(format!("trace -c {}: RC or DC", c.name())),
    }
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
