//! The XRC and DC corpus: the send WQEs of an XRC initiator and of a DC initiator, built by
//! libmlx5 (`harness_xrc_dc.c`: `ibv_post_send` with `qp_type.xrc.remote_srqn`, or
//! `ibv_wr_*` with `ibv_wr_set_xrc_srqn`; `ibv_wr_*` with `mlx5dv_wr_set_dc_addr` for the
//! DCI) and by the `mlx5` crate ([`mlx5::XrcSendQp::post_send`], [`mlx5::Dci::post_send`]),
//! compared byte for byte.
//!
//! Every operation of both (SEND, SEND with immediate, RDMA WRITE with and without
//! immediate, READ, compare-and-swap, fetch-and-add), gathers of 1 to 3 SGEs, inline
//! payloads of 1 to 60 bytes in one and two pieces, signaled, unsignaled, fenced and solicited
//! WRs, chains of three, and enough WRs to wrap each 16-WR ring twice.
//!
//! Field by field, the WQEs must be equal except where each side holds its own number of
//! the same object ([`Mapped`]: the QPN in the control segment, the XRC SRQ number, the DCT
//! number in the datagram segment, the lkey and rkey), and the don't-care bytes that
//! [`crate::compare`] allows for the same reasons: inline padding, FETCH_AND_ADD's unused
//! compare operand, and (the `ibv_wr_*` API only) the control segment's immediate of an
//! opcode without one.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mlx5::{
    Access, Ah, AhAttr, ConnectParams, Context, ContextConfig, Cq, CqInit, DcAddr, DcWr, Dci,
    DciStreams, Dct, Pd, QpInitAttr, QpType, RecvWr, RemoteQp, SendFlags, SendWr, Sge, Srq,
    UserMemory, WorkCompletion, WrOp, XrcDomain, XrcSendQp, XrcSrq, XrcTgtQp, XrcWr,
};
use mlx5_emu::{EmuConfig, Emulator, Fabric, RunMode, WqeRecord};

use crate::FixedBuf;
use crate::corpus::{BUF_VA, src_byte};
use crate::driver::NODE;

/// Buffer length; the source bytes fill it up to [`RECV_OFF`].
pub const BUF_LEN: u64 = 1 << 16;
/// Remote region (WRITE targets, READ and atomic sources).
pub const REMOTE_OFF: u64 = 0x4000;
/// Local destination of READ and atomic results.
pub const RESULT_OFF: u64 = 0x8000;
/// Where every receive lands (1024 bytes).
pub const RECV_OFF: u64 = 0xC000;
/// Send WRs per QP (the rings wrap).
pub const CAP_WR: u32 = 16;
/// SGEs per WR.
pub const CAP_SGE: u32 = 3;
/// Inline bytes per WR.
pub const CAP_INLINE: u32 = 64;
/// Receives posted to each SRQ.
pub const RECVS: u32 = 255;
/// The DCT's access key.
pub const DC_KEY: u64 = 0x00c0_ffee_d00d_f00d;

/// The sending QP of a WR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Q {
    /// The XRC initiator.
    Xrc,
    /// The DC initiator.
    Dc,
}

/// Operations (the harness's numbering).
pub mod op {
    /// SEND.
    pub const SEND: u8 = 0;
    /// SEND with immediate.
    pub const SEND_IMM: u8 = 1;
    /// RDMA WRITE.
    pub const WRITE: u8 = 2;
    /// RDMA WRITE with immediate.
    pub const WRITE_IMM: u8 = 3;
    /// RDMA READ.
    pub const READ: u8 = 4;
    /// Compare-and-swap.
    pub const CAS: u8 = 5;
    /// Fetch-and-add.
    pub const FAA: u8 = 6;
}

/// Flag bits of the corpus.
pub mod flag {
    /// IBV_SEND_SIGNALED.
    pub const SIGNALED: u8 = 1;
    /// IBV_SEND_FENCE.
    pub const FENCE: u8 = 2;
    /// IBV_SEND_SOLICITED.
    pub const SOLICITED: u8 = 4;
}

/// One work request.
#[derive(Clone, Debug)]
pub struct Wr {
    /// Its QP.
    pub q: Q,
    /// [`op`].
    pub op: u8,
    /// [`flag`] bits.
    pub flags: u8,
    /// Immediate (host order; big-endian on the wire).
    pub imm: u32,
    /// Remote offset into the buffer.
    pub roff: u64,
    /// CAS compare.
    pub compare: u64,
    /// CAS swap / FAA add.
    pub swap_add: u64,
    /// The SGEs' bytes go inline.
    pub inline: bool,
    /// (offset, length) into the buffer.
    pub sges: Vec<(u64, u32)>,
}

/// Posts (chains) of WRs, each chain on one QP, its last WR signaled.
#[derive(Clone, Debug, Default)]
pub struct Corpus {
    /// The chains.
    pub posts: Vec<Vec<Wr>>,
}

impl Corpus {
    /// The standard corpus (see the module docs).
    pub fn standard() -> Self {
        let mut posts = Vec::new();
        for round in 0..2u64 {
            for q in [Q::Xrc, Q::Dc] {
                let w = |op, flags, sges: &[(u64, u32)]| Wr {
                    q,
                    op,
                    flags,
                    imm: 0x1234_5678 ^ round as u32,
                    roff: REMOTE_OFF + 64 * round,
                    compare: 0x1111,
                    swap_add: 0x2222 + round,
                    inline: false,
                    sges: sges.to_vec(),
                };
                let inl = |len: u32, two: bool| {
                    let sges: Vec<(u64, u32)> = if two {
                        vec![(3, len / 2), (100, len - len / 2)]
                    } else {
                        vec![(7, len)]
                    };
                    let mut x = w(op::SEND, flag::SIGNALED, &sges);
                    x.inline = true;
                    x
                };
                let s = flag::SIGNALED;
                posts.push(vec![w(op::SEND, s, &[(0, 1)])]);
                posts.push(vec![w(op::SEND, s, &[(16, 1000)])]);
                posts.push(vec![w(op::SEND, s, &[(0, 64), (512, 128), (2048, 7)])]);
                posts.push(vec![w(op::SEND_IMM, s | flag::SOLICITED, &[(8, 32)])]);
                for len in [1, 12, 13, 28, 29, 44, 45, 60] {
                    posts.push(vec![inl(len, false)]);
                }
                posts.push(vec![inl(40, true)]);
                posts.push(vec![w(op::WRITE, s, &[(0, 256)])]);
                let mut wi = w(op::WRITE, s, &[(20, 24)]);
                wi.inline = true;
                posts.push(vec![wi]);
                posts.push(vec![w(op::WRITE_IMM, s, &[(0, 48)])]);
                posts.push(vec![w(op::READ, s, &[(RESULT_OFF, 128)])]);
                posts.push(vec![w(op::CAS, s, &[(RESULT_OFF + 512, 8)])]);
                posts.push(vec![w(op::FAA, s | flag::FENCE, &[(RESULT_OFF + 520, 8)])]);
                posts.push(vec![
                    w(op::SEND, 0, &[(0, 10)]),
                    w(op::WRITE, 0, &[(64, 100)]),
                    w(op::SEND_IMM, s, &[(128, 20)]),
                ]);
                posts.push(vec![w(op::SEND, 0, &[(0, 0)]), w(op::SEND, s, &[])]);
            }
        }
        Corpus { posts }
    }

    /// The corpus file the harness reads.
    pub fn text(&self) -> String {
        let mut s = format!(
            "buf {BUF_VA:#x} {BUF_LEN:#x} {RECV_OFF:#x}\ncaps {CAP_WR} {CAP_SGE} {CAP_INLINE} {RECVS}\nkey {DC_KEY:#x}\n"
        );
        for p in &self.posts {
            s.push_str("post\n");
            for w in p {
                let _ = write!(
                    s,
                    "wr {} {} {} {:#x} {:#x} {:#x} {:#x} {} {}",
                    if w.q == Q::Xrc { 'x' } else { 'd' },
                    w.op,
                    w.flags,
                    w.imm,
                    w.roff,
                    w.compare,
                    w.swap_add,
                    u8::from(w.inline),
                    w.sges.len()
                );
                for (o, l) in &w.sges {
                    let _ = write!(s, " {o:#x}:{l:#x}");
                }
                s.push('\n');
            }
        }
        s
    }
}

/// What one side reports: its object numbers and keys, and the WQEs of its two initiators.
#[derive(Clone, Debug, Default)]
pub struct Run {
    /// (XRC initiator QPN, DCI QPN, XRC SRQ number, DCT number, lkey, rkey).
    pub ids: Ids,
    /// The XRC initiator's WQEs.
    pub xrc: Vec<WqeRecord>,
    /// The DCI's WQEs.
    pub dc: Vec<WqeRecord>,
}

/// Numbers of one side's objects.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ids {
    /// XRC initiator QPN.
    pub ini: u32,
    /// DCI QPN.
    pub dci: u32,
    /// XRC SRQ number.
    pub srqn: u32,
    /// DCT number.
    pub dctn: u32,
    /// lkey of the buffer.
    pub lkey: u32,
    /// rkey of the buffer.
    pub rkey: u32,
}

impl Ids {
    fn parse(text: &str) -> Result<Ids, String> {
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix("info "))
            .ok_or_else(|| format!("no info line in {text:?}"))?;
        let mut kv = BTreeMap::new();
        for f in line.split_whitespace() {
            if let Some((k, v)) = f.split_once('=') {
                let v = u32::from_str_radix(v.trim_start_matches("0x"), 16)
                    .map_err(|e| format!("{k}={v}: {e}"))?;
                kv.insert(k, v);
            }
        }
        let g = |k: &str| {
            kv.get(k)
                .copied()
                .ok_or_else(|| format!("info without {k}"))
        };
        Ok(Ids {
            ini: g("ini")?,
            dci: g("dci")?,
            srqn: g("srqn")?,
            dctn: g("dctn")?,
            lkey: g("lkey")?,
            rkey: g("rkey")?,
        })
    }
}

fn split(ids: Ids, records: Vec<WqeRecord>) -> Run {
    let (mut xrc, mut dc) = (Vec::new(), Vec::new());
    for r in records {
        if r.qpn == ids.ini {
            xrc.push(r);
        } else if r.qpn == ids.dci {
            dc.push(r);
        }
    }
    Run { ids, xrc, dc }
}

fn err(what: &str, e: impl std::fmt::Display) -> String {
    format!("{what}: {e}")
}

/// The harness source.
pub fn source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("harness_xrc_dc.c")
}

/// Compile the harness into `out_dir` (`$CC` or `cc`).
///
/// # Errors
/// As [`crate::harness::build`].
pub fn build(out_dir: &Path) -> Result<PathBuf, String> {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let exe = out_dir.join("wqe-harness-xrc-dc");
    let flags = ["-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror"];
    mlx5_emu::cprog::compile_verbs_program(&cc, &flags, &source(), &exe)?;
    Ok(exe)
}

/// Run libmlx5's side: the harness on `corpus_file` under the preload (one emulated HCA at
/// node [`NODE`], its WQE log in `log`), `wr_api` for the XRC initiator's `ibv_wr_*` path.
///
/// # Errors
/// Start failure, timeout, non-zero exit (with its output), or a malformed log.
pub fn run_theirs(exe: &Path, corpus_file: &Path, log: &Path, wr_api: bool) -> Result<Run, String> {
    let so = crate::harness::preload_so()?;
    let _ = std::fs::remove_file(log);
    let mut cmd = Command::new(exe);
    cmd.arg(corpus_file).arg(if wr_api { "wr" } else { "post" });
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("MLX5_") {
            cmd.env_remove(&k);
        }
    }
    cmd.env_remove("SYSFS_PATH")
        .env("LD_PRELOAD", &so)
        .env("MLX5_EMU_FABRIC", "inprocess")
        .env("MLX5_EMU_NODE", NODE.to_string())
        .env("MLX5_EMU_HCAS", "1")
        .env("MLX5_EMU_WQE_LOG", log)
        .env("MLX5_SCATTER_TO_CQE", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
    let start = Instant::now();
    let out = wait_limited(child, Duration::from_secs(60))?;
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let ctx = format!(
        "\n--- stdout:\n{}\n--- stderr:\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    if !out.status.success() {
        return Err(format!(
            "harness failed ({}) after {:?}{ctx}",
            out.status,
            start.elapsed()
        ));
    }
    let ids = Ids::parse(&text(&out.stdout)).map_err(|e| format!("{e}{ctx}"))?;
    let log = std::fs::read_to_string(log).map_err(|e| format!("no WQE log ({e}){ctx}"))?;
    Ok(split(ids, WqeRecord::parse_log(&log)?))
}

/// Wait for `child` (its output collected) at most `limit`; killed after it.
pub(crate) fn wait_limited(
    mut child: std::process::Child,
    limit: Duration,
) -> Result<std::process::Output, String> {
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let o = std::thread::spawn(move || stdout.map(std::io::read_to_string));
    let e = std::thread::spawn(move || stderr.map(std::io::read_to_string));
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().map_err(|e| e.to_string())? {
            break s;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("harness did not finish in {limit:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let get = |h: std::thread::JoinHandle<Option<std::io::Result<String>>>| {
        h.join()
            .ok()
            .flatten()
            .and_then(Result::ok)
            .unwrap_or_default()
            .into_bytes()
    };
    Ok(std::process::Output {
        status,
        stdout: get(o),
        stderr: get(e),
    })
}

fn wr_op(w: &Wr, rkey: u32) -> WrOp {
    let raddr = BUF_VA + w.roff;
    match w.op {
        op::SEND_IMM => WrOp::SendImm {
            imm: w.imm.to_be_bytes(),
        },
        op::WRITE => WrOp::Write { raddr, rkey },
        op::WRITE_IMM => WrOp::WriteImm {
            raddr,
            rkey,
            imm: w.imm.to_be_bytes(),
        },
        op::READ => WrOp::Read { raddr, rkey },
        op::CAS => WrOp::CompareSwap {
            raddr,
            rkey,
            compare: w.compare,
            swap: w.swap_add,
        },
        op::FAA => WrOp::FetchAdd {
            raddr,
            rkey,
            add: w.swap_add,
        },
        _ => WrOp::Send,
    }
}

fn send_flags(f: u8) -> SendFlags {
    let mut s = SendFlags::NONE;
    if f & flag::SIGNALED != 0 {
        s |= SendFlags::SIGNALED;
    }
    if f & flag::FENCE != 0 {
        s |= SendFlags::FENCE;
    }
    if f & flag::SOLICITED != 0 {
        s |= SendFlags::SOLICITED;
    }
    s
}

/// The buffer lives at one fixed address: one run at a time per process.
static FIXED_VA: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Run the `mlx5` crate's side on the in-process emulator (stepped), creating the objects in
/// the harness's order.
///
/// # Errors
/// A description of the first failure.
pub fn run_ours(corpus: &Corpus) -> Result<Run, String> {
    let _one = FIXED_VA
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let emu = Emulator::new(EmuConfig {
        num_hcas: 1,
        mode: RunMode::Stepped,
        fabric: Fabric::InProcess,
        node: Some(NODE),
        ..EmuConfig::default()
    });
    emu.record_wqes(true);
    let buf = FixedBuf::map(BUF_VA, BUF_LEN as usize).map_err(|e| err("fixed mapping", e))?;
    let src: Vec<u8> = (0..RECV_OFF).map(src_byte).collect();
    buf.write(0, &src);
    let surface = emu.open(0).map_err(|e| err("open", e))?;
    let ctx = Context::open_with(surface, ContextConfig::default())
        .map_err(|e| err("Context::open", e))?;
    let lid = ctx.query_port(1).map_err(|e| err("query_port", e))?.lid;
    let pd = Pd::new(&ctx).map_err(|e| err("Pd::new", e))?;
    // SAFETY: `buf` is a private anonymous mapping owned by this function; it stays mapped
    // until `buf` drops, after every object registered over it (dropped explicitly first).
    let mem = unsafe { UserMemory::from_raw_parts(buf.ptr(), buf.len()) };
    let mr = pd
        .reg_user_mr(mem, Access::ALL)
        .map_err(|e| err("reg_user_mr", e))?;
    let cq = |n| {
        Cq::new(
            &ctx,
            CqInit {
                cqe: n,
                ..CqInit::default()
            },
            None,
        )
        .map_err(|e| err("Cq::new", e))
    };
    let mut scq = cq(256)?;
    let mut rcq = cq(1024)?;
    let xrcd = XrcDomain::private(&ctx).map_err(|e| err("XrcDomain", e))?;
    let mut xsrq = XrcSrq::new(&xrcd, &pd, &rcq, RECVS, 1).map_err(|e| err("XrcSrq", e))?;
    let init = |t| {
        let mut a = QpInitAttr::new(t, &scq, &scq);
        a.cap.max_send_wr = CAP_WR;
        a.cap.max_send_sge = CAP_SGE;
        a.cap.max_inline_data = CAP_INLINE;
        a.scatter_to_cqe = false;
        a
    };
    let mut ini = XrcSendQp::new(&pd, &init(QpType::XrcSend)).map_err(|e| err("XrcSendQp", e))?;
    let mut tgt = XrcTgtQp::new(&xrcd).map_err(|e| err("XrcTgtQp", e))?;
    let mut srq = Srq::new(&pd, RECVS, 1).map_err(|e| err("Srq", e))?;
    let mut dct = Dct::new(&pd, &rcq, &srq, DC_KEY).map_err(|e| err("Dct", e))?;
    // 4 streams, the DC WRs of the run round-robin over them, as the C harness's.
    let streams = DciStreams {
        log_concurrent: 2,
        log_errored: 0,
    };
    let mut dci = Dci::with_streams(&pd, &init(QpType::Dci), streams).map_err(|e| err("Dci", e))?;
    let mut dc_stream = 0u16;
    let ah = Ah::new(
        &pd,
        AhAttr {
            dlid: lid,
            port_num: 1,
            ..AhAttr::default()
        },
    )
    .map_err(|e| err("Ah::new", e))?;
    let p = ConnectParams::new()
        .mtu(mlx5::Mtu::M1024)
        .max_rd_atomic(1)
        .max_dest_rd_atomic(1);
    let r = |qpn| RemoteQp {
        qpn,
        psn: 0,
        lid,
        gid: None,
    };
    ini.to_init(1, &p).map_err(|e| err("INI INIT", e))?;
    tgt.to_init(1, Access::ALL, &p)
        .map_err(|e| err("TGT INIT", e))?;
    ini.to_rtr(&r(tgt.qpn()), &p)
        .map_err(|e| err("INI RTR", e))?;
    tgt.to_rtr(&r(ini.qpn()), &p)
        .map_err(|e| err("TGT RTR", e))?;
    tgt.to_rts(0, &p).map_err(|e| err("TGT RTS", e))?;
    ini.to_rts(0, &p).map_err(|e| err("INI RTS", e))?;
    let dctn = dct
        .activate(1, Access::ALL, &p)
        .map_err(|e| err("DCT", e))?;
    dci.activate(1, 0, &p).map_err(|e| err("DCI", e))?;
    let to = DcAddr::new(&ah, dctn, DC_KEY).map_err(|e| err("DcAddr", e))?;
    let rsge = [mr.sge(RECV_OFF, 1024)];
    for i in 0..RECVS {
        let w = [RecvWr {
            wr_id: u64::from(i),
            sg_list: &rsge,
        }];
        xsrq.post_recv(&w)
            .map_err(|(_, e)| err("XRC SRQ recv", e))?;
        srq.post_recv(&w).map_err(|(_, e)| err("SRQ recv", e))?;
    }
    let srqn = xsrq.number();
    let mut wcs = [WorkCompletion::default(); 32];
    for (n, post) in corpus.posts.iter().enumerate() {
        let sges: Vec<Vec<Sge>> = post
            .iter()
            .map(|w| w.sges.iter().map(|&(o, l)| mr.sge(o, l)).collect())
            .collect();
        let inl: Vec<Vec<&[u8]>> = post
            .iter()
            .map(|w| {
                if w.inline {
                    w.sges
                        .iter()
                        .map(|&(o, l)| &src[o as usize..(o + u64::from(l)) as usize])
                        .collect()
                } else {
                    Vec::new()
                }
            })
            .collect();
        let wrs: Vec<SendWr<'_>> = post
            .iter()
            .enumerate()
            .map(|(i, w)| {
                let wr = SendWr::new(i as u64, wr_op(w, mr.rkey()), &sges[i], send_flags(w.flags));
                if w.inline {
                    wr.with_inline(&inl[i])
                } else {
                    wr
                }
            })
            .collect();
        let posted = if post[0].q == Q::Xrc {
            let x: Vec<XrcWr<'_>> = wrs.iter().map(|&wr| XrcWr { srqn, wr }).collect();
            ini.post_send(&x)
        } else {
            let x: Vec<DcWr<'_>> = wrs
                .iter()
                .map(|&wr| {
                    let stream = dc_stream;
                    dc_stream = (dc_stream + 1) & 3;
                    DcWr {
                        dest: &to,
                        wr,
                        stream,
                    }
                })
                .collect();
            dci.post_send(&x)
        };
        posted.map_err(|(i, e)| err(&format!("post {n} WR {i}"), e))?;
        let mut want = post
            .iter()
            .filter(|w| w.flags & flag::SIGNALED != 0)
            .count();
        let mut spins = 0;
        while want > 0 {
            emu.run_until_idle();
            let got = scq.poll(&mut wcs);
            if let Some(bad) = wcs[..got].iter().find(|w| !w.is_ok()) {
                return Err(err(&format!("post {n}"), format!("{bad:?}")));
            }
            want = want.saturating_sub(got);
            while rcq.poll(&mut wcs) > 0 {}
            spins += 1;
            if spins > 10_000 {
                return Err(err(&format!("post {n}"), "no send completion"));
            }
        }
    }
    let ids = Ids {
        ini: ini.qpn(),
        dci: dci.qp().qpn(),
        srqn: srqn.get(),
        dctn,
        lkey: mr.lkey(),
        rkey: mr.rkey(),
    };
    let records = emu.wqe_log(0);
    drop((
        to, ah, dci, dct, srq, tgt, ini, xsrq, xrcd, scq, rcq, mr, pd, ctx,
    ));
    drop(buf);
    Ok(split(ids, records))
}

/// A field where each side must hold its own number of one object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mapped {
    /// ctrl QPN.
    Qpn,
    /// XRC SRQ number.
    Srqn,
    /// DCT number.
    Dctn,
    /// lkey.
    Lkey,
    /// rkey.
    Rkey,
}

/// The outcome: differences (empty when equal) and the uses of each allowance.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// WQEs compared.
    pub wqes: usize,
    /// Human-readable differences.
    pub diffs: Vec<String>,
    /// Don't-care bytes that differed: inline padding, FAA compare, unused imm.
    pub dont_care: BTreeMap<&'static str, usize>,
}

/// Byte ranges of one WQE and what they are.
fn layout(w: &Wr, q: Q, len: usize) -> Vec<(usize, usize, &'static str)> {
    let mut v = vec![(4, 7, "qpn")];
    if !matches!(w.op, op::SEND_IMM | op::WRITE_IMM) {
        v.push((12, 16, "unused imm"));
    }
    let mut pos = 16;
    match q {
        Q::Xrc => {
            v.push((16, 20, "srqn"));
            pos += 16;
        }
        Q::Dc => {
            v.push((24, 28, "dctn"));
            pos += 48;
        }
    }
    if w.op >= op::WRITE {
        v.push((pos + 8, pos + 12, "rkey"));
        pos += 16;
    }
    if w.op == op::FAA {
        v.push((pos + 8, pos + 16, "faa compare"));
    }
    if w.op >= op::CAS {
        pos += 16;
    }
    if w.inline && w.op <= op::WRITE_IMM {
        let total: usize = w.sges.iter().map(|&(_, l)| l as usize).sum();
        if total > 0 {
            let end = pos + 4 + total;
            v.push((end, end.next_multiple_of(16).min(len), "inline padding"));
        }
    } else {
        while pos + 16 <= len {
            v.push((pos + 4, pos + 8, "lkey"));
            pos += 16;
        }
    }
    v
}

/// Compare the two runs' WQEs of `q` against `corpus`; `wr_api` allows the unused imm of
/// libmlx5's `ibv_wr_*` path (the DCI always posts through it).
pub fn compare(corpus: &Corpus, q: Q, theirs: &Run, ours: &Run, wr_api: bool, r: &mut Report) {
    let wrs: Vec<&Wr> = corpus.posts.iter().flatten().filter(|w| w.q == q).collect();
    let (t, o) = match q {
        Q::Xrc => (&theirs.xrc, &ours.xrc),
        Q::Dc => (&theirs.dc, &ours.dc),
    };
    let name = format!("{q:?}");
    if t.len() != wrs.len() || o.len() != wrs.len() {
        r.diffs.push(format!(
            "{name}: {} WRs, libmlx5 {} WQEs, mlx5 crate {}",
            wrs.len(),
            t.len(),
            o.len()
        ));
        return;
    }
    let be =
        |b: &[u8], s: usize, e: usize| b[s..e].iter().fold(0u64, |a, &x| (a << 8) | u64::from(x));
    for (i, ((a, b), w)) in t.iter().zip(o).zip(&wrs).enumerate() {
        r.wqes += 1;
        let head = format!("{name} WQE {i} ({w:?})");
        if a.wqe_index != b.wqe_index || a.bytes.len() != b.bytes.len() {
            r.diffs.push(format!(
                "{head}: index {}/{} length {}/{}",
                a.wqe_index,
                b.wqe_index,
                a.bytes.len(),
                b.bytes.len()
            ));
            continue;
        }
        if a.via != b.via {
            r.diffs
                .push(format!("{head}: via {:?} / {:?}", a.via, b.via));
        }
        let mut covered = vec![false; a.bytes.len()];
        for (s, e, what) in layout(w, q, a.bytes.len()) {
            if e > a.bytes.len() || s >= e {
                continue;
            }
            covered[s..e].iter_mut().for_each(|c| *c = true);
            let (x, y) = (be(&a.bytes, s, e), be(&b.bytes, s, e));
            let own = |ids: &Ids| match what {
                "qpn" => Some(u64::from(if q == Q::Xrc { ids.ini } else { ids.dci })),
                "srqn" => Some(u64::from(ids.srqn)),
                "dctn" => Some(u64::from(ids.dctn & 0xFF_FFFF)),
                "lkey" => Some(u64::from(ids.lkey)),
                "rkey" => Some(u64::from(ids.rkey)),
                _ => None,
            };
            match (own(&theirs.ids), own(&ours.ids)) {
                (Some(tx), Some(oy)) => {
                    let (x, y) = if what == "dctn" {
                        (x & 0xFF_FFFF, y & 0xFF_FFFF)
                    } else {
                        (x, y)
                    };
                    if (x, y) != (tx, oy) {
                        r.diffs.push(format!(
                            "{head}: {what} {x:#x}/{y:#x}, expected each side's own {tx:#x}/{oy:#x}"
                        ));
                    }
                    if what == "dctn" && a.bytes[24] != b.bytes[24] {
                        r.diffs.push(format!("{head}: dqp_dct flags byte differs"));
                    }
                }
                _ => {
                    if x != y {
                        if what == "unused imm" && !wr_api {
                            r.diffs
                                .push(format!("{head}: unused imm differs on ibv_post_send"));
                        }
                        *r.dont_care.entry(what).or_default() += 1;
                    }
                }
            }
        }
        for (k, c) in covered.iter().enumerate() {
            if !c && a.bytes[k] != b.bytes[k] {
                r.diffs.push(format!(
                    "{head}: byte {k}: {:#04x}/{:#04x}\n  libmlx5 {}\n  ours    {}",
                    a.bytes[k],
                    b.bytes[k],
                    hex(&a.bytes),
                    hex(&b.bytes)
                ));
                break;
            }
        }
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
