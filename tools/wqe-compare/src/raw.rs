//! The RAW_PACKET corpus: the send WQEs of a raw Ethernet QP, built by libmlx5
//! (`harness_raw.c`: `ibv_post_send`, or `ibv_wr_send` with `ibv_wr_set_sge_list` /
//! `ibv_wr_set_inline_data_list`) and by the `mlx5` crate ([`mlx5::raw::RawQp::send`]),
//! compared byte for byte, on an emulated Ethernet port whose device needs no header bytes
//! inline (ConnectX-5: `eth_min_inline` NONE) or the L2 header (18 bytes,
//! [`EthMinInline::L2`]).
//!
//! The frames: Ethernet/IPv4/UDP, Ethernet/802.1Q/IPv4/UDP, Ethernet/IPv6/UDP and a
//! non-IP EtherType, gathered from 1 to 3 SGEs (the headers in one SGE, split across SGEs,
//! an SGE ending exactly at the inline headers) or inline (1 byte past the headers up to the
//! QP's inline size, in one and several pieces), with and without `IBV_SEND_IP_CSUM`
//! (libmlx5 sets both checksum bits; the crate's [`TxOffload`] `ip_csum` and `l4_csum`),
//! signaled, unsignaled, fenced and solicited, chains of 3 and 5, and enough frames to wrap
//! the 16-WR ring several times.
//!
//! How each frame is given to the crate: libmlx5 copies the device's minimum inline bytes
//! out of the SGEs into the Ethernet segment and sends the rest from where the copy ended;
//! the crate gets those bytes as `headers` and the rest as the payload (the same remaining
//! SGEs, or the rest of the bytes inline). VLAN: libmlx5's verbs have no VLAN insertion, so
//! its frame carries the tag; on the L2 device the crate is given the untagged header and
//! [`TxOffload::vlan`] with the tag's TCI and must write the same 18 inline bytes.
//!
//! Field by field, the WQEs must be equal except where each side holds its own number of
//! the same object (the QPN in the control segment, the lkey of each data segment), the
//! inline padding (what the ring held before) and, through `ibv_wr_*` only, the control
//! segment's unused immediate (libmlx5 leaves the ring's old bytes there).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use mlx5::raw::{FramePayload, RawQp, RawQpInit, TxOffload};
use mlx5::{Access, Context, ContextConfig, Cq, CqInit, Pd, SendFlags, UserMemory, WcStatus};
use mlx5_emu::{EmuConfig, Emulator, EthMinInline, Fabric, LinkLayer, RunMode, WqeRecord};

use crate::FixedBuf;
use crate::corpus::{BUF_VA, src_byte};
use crate::driver::NODE;

/// Buffer length (source bytes, the frame templates written over them).
pub const BUF_LEN: u64 = 1 << 14;
/// Send WRs of the QP (the ring wraps).
pub const CAP_WR: u32 = 16;
/// SGEs per WR.
pub const CAP_SGE: u32 = 3;
/// Inline bytes per WR (after the inline headers).
pub const CAP_INLINE: u32 = 128;
/// The inline header bytes of the L2 device (libmlx5's `MLX5_ETH_L2_INLINE_HEADER_SIZE`).
pub const L2_INLINE: usize = 18;

/// Where the frame templates are written into the buffer.
pub mod at {
    /// Ethernet / IPv4 / UDP (42 header bytes).
    pub const UDP4: u64 = 0x100;
    /// Ethernet / 802.1Q / IPv4 / UDP (46).
    pub const VLAN: u64 = 0x900;
    /// Ethernet / IPv6 / UDP (62).
    pub const UDP6: u64 = 0x1100;
    /// Ethernet with a local experimental EtherType (14).
    pub const OTHER: u64 = 0x1900;
}

/// The VLAN tag's TCI in [`at::VLAN`]'s frame (priority 5, VLAN 0x123).
pub const TCI: u16 = 0xA123;

/// Flag bits of the corpus.
pub mod flag {
    /// IBV_SEND_SIGNALED.
    pub const SIGNALED: u8 = 1;
    /// IBV_SEND_FENCE.
    pub const FENCE: u8 = 2;
    /// IBV_SEND_SOLICITED.
    pub const SOLICITED: u8 = 4;
    /// IBV_SEND_IP_CSUM (both checksums).
    pub const CSUM: u8 = 8;
    /// The frame carries an 802.1Q tag at bytes 12..16: the crate sends it untagged with
    /// [`TxOffload::vlan`](mlx5::raw::TxOffload) (L2 device only).
    pub const VLAN: u8 = 16;
}

/// One frame: its bytes are the SGEs' bytes, in order.
#[derive(Clone, Debug)]
pub struct Wr {
    /// [`flag`] bits.
    pub flags: u8,
    /// Sent inline (`IBV_SEND_INLINE`; the crate: [`FramePayload::Inline`]).
    pub inline: bool,
    /// (offset, length) into the buffer.
    pub sges: Vec<(u64, u32)>,
}

/// Posts (chains) of frames, the last of each signaled, and the templates.
#[derive(Clone, Debug)]
pub struct Corpus {
    /// The device's minimum inline headers the corpus is for.
    pub min_inline: EthMinInline,
    /// (offset, bytes) written over the source bytes.
    pub templates: Vec<(u64, Vec<u8>)>,
    /// The chains.
    pub posts: Vec<Vec<Wr>>,
}

fn ipv4_udp(payload: u16) -> Vec<u8> {
    let mut h = vec![0x45, 0x00];
    h.extend_from_slice(&(28 + payload).to_be_bytes());
    h.extend_from_slice(&[0x12, 0x34, 0x40, 0x00, 64, 17, 0, 0]);
    h.extend_from_slice(&[10, 11, 0, 1, 10, 11, 0, 2]);
    h.extend_from_slice(&5000u16.to_be_bytes());
    h.extend_from_slice(&6000u16.to_be_bytes());
    h.extend_from_slice(&(8 + payload).to_be_bytes());
    h.extend_from_slice(&[0, 0]);
    h
}

fn macs() -> Vec<u8> {
    vec![
        0x00, 0x02, 0xc9, 0xab, 0xcd, 0x02, 0x00, 0x02, 0xc9, 0xab, 0xcd, 0x01,
    ]
}

/// The frame templates (headers; the payload is the source bytes after them).
fn templates() -> Vec<(u64, Vec<u8>)> {
    let mut udp4 = macs();
    udp4.extend_from_slice(&[0x08, 0x00]);
    udp4.extend(ipv4_udp(1000));
    let mut vlan = macs();
    vlan.extend_from_slice(&[0x81, 0x00]);
    vlan.extend_from_slice(&TCI.to_be_bytes());
    vlan.extend_from_slice(&[0x08, 0x00]);
    vlan.extend(ipv4_udp(1000));
    let mut udp6 = macs();
    udp6.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0]);
    udp6.extend_from_slice(&1008u16.to_be_bytes());
    udp6.extend_from_slice(&[17, 64]);
    udp6.extend((0..32u8).map(|i| if i % 16 == 0 { 0xfd } else { i }));
    udp6.extend_from_slice(&[0x13, 0x88, 0x17, 0x70, 0x03, 0xf0, 0, 0]);
    let mut other = macs();
    other.extend_from_slice(&[0x88, 0xb5]);
    vec![
        (at::UDP4, udp4),
        (at::VLAN, vlan),
        (at::UDP6, udp6),
        (at::OTHER, other),
    ]
}

impl Corpus {
    /// The standard corpus for a device with `min_inline` (see the module docs).
    pub fn standard(min_inline: EthMinInline) -> Self {
        let l2 = min_inline == EthMinInline::L2;
        let hdr = if l2 { L2_INLINE as u32 } else { 0 };
        let s = flag::SIGNALED;
        let c = flag::CSUM;
        let g = |flags, sges: &[(u64, u32)]| Wr {
            flags,
            inline: false,
            sges: sges.to_vec(),
        };
        let i = |flags, sges: &[(u64, u32)]| Wr {
            flags,
            inline: true,
            sges: sges.to_vec(),
        };
        let mut posts = Vec::new();
        for round in 0..3u64 {
            let f0 = at::UDP4;
            // Gathered, one SGE, frame lengths from the minimum Ethernet frame up.
            for len in [60, 64, 100, 1000, 1042] {
                posts.push(vec![g(s, &[(f0, len)])]);
                posts.push(vec![g(s | c, &[(f0, len)])]);
            }
            // Gathered: headers alone in the first SGE, then split across SGEs, an SGE
            // ending exactly where the inline headers do, a short first SGE.
            posts.push(vec![g(s | c, &[(f0, 42), (f0 + 42, 200)])]);
            posts.push(vec![g(s, &[(f0, 14), (f0 + 14, 28), (f0 + 42, 64)])]);
            posts.push(vec![g(s, &[(f0, 18), (f0 + 18, 100)])]);
            posts.push(vec![g(s, &[(f0, 6), (f0 + 6, 6), (f0 + 12, 90)])]);
            posts.push(vec![g(s, &[(f0, 14), (f0 + 14, 4), (f0 + 18, 40)])]);
            posts.push(vec![g(s | c, &[(at::UDP6, 62), (at::UDP6 + 62, 500)])]);
            posts.push(vec![g(s, &[(at::OTHER, 60)])]);
            // Inline: from 1 byte past the inline headers to the QP's inline size, in
            // one piece and in several.
            for extra in [1u32, 12, 13, 28, 29, 44, 45, 60, 61, 100, CAP_INLINE] {
                let len = hdr + extra;
                if len < 14 {
                    continue;
                }
                posts.push(vec![i(s, &[(f0, len)])]);
            }
            posts.push(vec![i(s | c, &[(f0, 42), (f0 + 42, 22)])]);
            posts.push(vec![i(s, &[(f0, 14), (f0 + 14, 10), (f0 + 24, 40)])]);
            posts.push(vec![i(s, &[(f0, 18)])]);
            posts.push(vec![i(s | c, &[(at::UDP6, 62), (at::UDP6 + 62, 30)])]);
            // VLAN: the tag in libmlx5's frame, inserted by the crate into its inline
            // headers (the L2 device only: with no headers inline libmlx5 has nothing
            // to compare the device's insertion with).
            if l2 {
                posts.push(vec![g(s | c | flag::VLAN, &[(at::VLAN, 100)])]);
                posts.push(vec![g(
                    s | flag::VLAN,
                    &[(at::VLAN, 46), (at::VLAN + 46, 64)],
                )]);
                posts.push(vec![i(s | c | flag::VLAN, &[(at::VLAN, 64)])]);
                posts.push(vec![i(s | flag::VLAN, &[(at::VLAN, 18)])]);
            }
            // Flags: fence, solicited, unsignaled in chains.
            posts.push(vec![g(s | flag::FENCE, &[(f0, 64)])]);
            posts.push(vec![i(s | flag::SOLICITED, &[(f0, hdr + 30)])]);
            posts.push(vec![
                g(0, &[(f0, 60)]),
                i(c, &[(f0, hdr + 40)]),
                g(s | c, &[(f0, 14), (f0 + 14, 200)]),
            ]);
            let off = 64 * round;
            posts.push(vec![
                g(c, &[(f0, 60 + off as u32)]),
                g(0, &[(f0, 128)]),
                i(0, &[(f0, hdr + 20)]),
                g(c, &[(at::UDP6, 100)]),
                i(s, &[(f0, hdr.max(14) + 2)]),
            ]);
        }
        Corpus {
            min_inline,
            templates: templates(),
            posts,
        }
    }

    /// The corpus file the harness reads.
    pub fn text(&self) -> String {
        let mut s = format!("buf {BUF_VA:#x} {BUF_LEN:#x}\ncaps {CAP_WR} {CAP_SGE} {CAP_INLINE}\n");
        for (off, b) in &self.templates {
            let _ = write!(s, "bytes {off:#x} ");
            for x in b {
                let _ = write!(s, "{x:02x}");
            }
            s.push('\n');
        }
        for p in &self.posts {
            s.push_str("post\n");
            for w in p {
                let _ = write!(s, "wr {} {} {}", w.flags, u8::from(w.inline), w.sges.len());
                for (o, l) in &w.sges {
                    let _ = write!(s, " {o:#x}:{l:#x}");
                }
                s.push('\n');
            }
        }
        s
    }

    /// The buffer's contents: the source bytes with the templates written over them.
    pub fn buffer(&self) -> Vec<u8> {
        let mut b: Vec<u8> = (0..BUF_LEN).map(src_byte).collect();
        for (off, t) in &self.templates {
            b[*off as usize..*off as usize + t.len()].copy_from_slice(t);
        }
        b
    }

    /// The inline header bytes of the corpus's device.
    pub fn header_bytes(&self) -> usize {
        match self.min_inline {
            EthMinInline::None => 0,
            EthMinInline::L2 => L2_INLINE,
        }
    }
}

/// How the crate is asked to send `w` on a device that inlines `hdr` header bytes: the
/// headers, the rest as SGEs (offset, length; zero-length pieces left out, as libmlx5
/// leaves them out), and the VLAN TCI for [`flag::VLAN`] frames (their headers given
/// untagged).
pub fn split(w: &Wr, buf: &[u8], hdr: usize) -> (Vec<u8>, Vec<(u64, u32)>, Option<u16>) {
    let mut frame = Vec::new();
    for &(o, l) in &w.sges {
        frame.extend_from_slice(&buf[o as usize..(o + u64::from(l)) as usize]);
    }
    let take = hdr.min(frame.len());
    let mut headers = frame[..take].to_vec();
    let mut vlan = None;
    if w.flags & flag::VLAN != 0 && take >= 16 {
        vlan = Some(u16::from_be_bytes([frame[14], frame[15]]));
        headers.drain(12..16);
    }
    let mut skip = take as u64;
    let mut rest = Vec::new();
    for &(o, l) in &w.sges {
        let l = u64::from(l);
        let used = skip.min(l);
        skip -= used;
        if l > used {
            rest.push((o + used, (l - used) as u32));
        }
    }
    (headers, rest, vlan)
}

/// What one side reports: its QP's number, the lkey, the caps its driver reported and the
/// QP's WQEs.
#[derive(Clone, Debug, Default)]
pub struct Run {
    /// The raw QP's number.
    pub qpn: u32,
    /// lkey of the buffer.
    pub lkey: u32,
    /// Reported `max_send_wr`.
    pub max_send_wr: u32,
    /// Reported `max_inline_data`.
    pub max_inline: u32,
    /// The QP's WQEs.
    pub wqes: Vec<WqeRecord>,
}

fn parse_info(text: &str) -> Result<BTreeMap<String, u32>, String> {
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("info "))
        .ok_or_else(|| format!("no info line in {text:?}"))?;
    let mut kv = BTreeMap::new();
    for f in line.split_whitespace() {
        if let Some((k, v)) = f.split_once('=') {
            let v = u32::from_str_radix(v.trim_start_matches("0x"), 16)
                .map_err(|e| format!("{k}={v}: {e}"))?;
            kv.insert(k.to_string(), v);
        }
    }
    Ok(kv)
}

fn err(what: &str, e: impl std::fmt::Display) -> String {
    format!("{what}: {e}")
}

/// The harness source.
pub fn source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("harness_raw.c")
}

/// Compile the harness into `out_dir` (`$CC` or `cc`).
///
/// # Errors
/// As [`crate::harness::build`].
pub fn build(out_dir: &Path) -> Result<PathBuf, String> {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let exe = out_dir.join("wqe-harness-raw");
    let flags = ["-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror"];
    mlx5_emu::cprog::compile_verbs_program(&cc, &flags, &source(), &exe)?;
    Ok(exe)
}

/// Run libmlx5's side: the harness on `corpus_file` under the preload (one emulated HCA at
/// node [`NODE`] with an Ethernet port, `MLX5_EMU_ETH_MIN_INLINE` from the corpus, its WQE
/// log in `log`), `wr_api` for the `ibv_wr_*` path.
///
/// # Errors
/// Start failure, timeout, non-zero exit (with its output), or a malformed log.
pub fn run_theirs(
    exe: &Path,
    corpus: &Corpus,
    corpus_file: &Path,
    log: &Path,
    wr_api: bool,
) -> Result<Run, String> {
    let so = crate::harness::preload_so()?;
    let _ = std::fs::remove_file(log);
    let mut cmd = Command::new(exe);
    cmd.arg(corpus_file).arg(if wr_api { "wr" } else { "post" });
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("MLX5_") {
            cmd.env_remove(&k);
        }
    }
    let min = match corpus.min_inline {
        EthMinInline::None => "none",
        EthMinInline::L2 => "l2",
    };
    cmd.env_remove("SYSFS_PATH")
        .env("LD_PRELOAD", &so)
        .env("MLX5_EMU_FABRIC", "inprocess")
        .env("MLX5_EMU_NODE", NODE.to_string())
        .env("MLX5_EMU_HCAS", "1")
        .env("MLX5_EMU_LINK_LAYER", "eth")
        .env("MLX5_EMU_ETH_MIN_INLINE", min)
        .env("MLX5_EMU_WQE_LOG", log)
        .env("MLX5_SCATTER_TO_CQE", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
    let out = crate::xrc_dc::wait_limited(child, Duration::from_secs(60))?;
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let ctx = format!(
        "\n--- stdout:\n{}\n--- stderr:\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    if !out.status.success() {
        return Err(format!("harness failed ({}){ctx}", out.status));
    }
    let kv = parse_info(&text(&out.stdout)).map_err(|e| format!("{e}{ctx}"))?;
    let g = |k: &str| {
        kv.get(k)
            .copied()
            .ok_or_else(|| format!("info without {k}{ctx}"))
    };
    let log = std::fs::read_to_string(log).map_err(|e| format!("no WQE log ({e}){ctx}"))?;
    let qpn = g("qpn")?;
    Ok(Run {
        qpn,
        lkey: g("lkey")?,
        max_send_wr: g("max_send_wr")?,
        max_inline: g("max_inline")?,
        wqes: WqeRecord::parse_log(&log)?
            .into_iter()
            .filter(|r| r.qpn == qpn)
            .collect(),
    })
}

/// The buffer lives at one fixed address: one run at a time per process.
static FIXED_VA: std::sync::Mutex<()> = std::sync::Mutex::new(());

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
        link_layer: LinkLayer::Ethernet,
        eth_min_inline: corpus.min_inline,
        ..EmuConfig::default()
    });
    emu.record_wqes(true);
    let buf = FixedBuf::map(BUF_VA, BUF_LEN as usize).map_err(|e| err("fixed mapping", e))?;
    let bytes = corpus.buffer();
    buf.write(0, &bytes);
    let surface = emu.open(0).map_err(|e| err("open", e))?;
    let ctx = Context::open_with(surface, ContextConfig::default())
        .map_err(|e| err("Context::open", e))?;
    let pd = Pd::new(&ctx).map_err(|e| err("Pd::new", e))?;
    // SAFETY: `buf` is a private anonymous mapping owned by this function; it stays mapped
    // until `buf` drops, after every object registered over it (dropped explicitly first).
    let mem = unsafe { UserMemory::from_raw_parts(buf.ptr(), buf.len()) };
    let mr = pd
        .reg_user_mr(mem, Access::LOCAL_WRITE)
        .map_err(|e| err("reg_user_mr", e))?;
    let cq = || {
        Cq::new(
            &ctx,
            CqInit {
                cqe: 256,
                ..CqInit::default()
            },
            None,
        )
        .map_err(|e| err("Cq::new", e))
    };
    let scq = cq()?;
    let rcq = cq()?;
    let mut init = RawQpInit::new(&scq, &rcq);
    init.max_send_wr = CAP_WR;
    init.max_send_sge = CAP_SGE;
    init.max_inline_data = CAP_INLINE;
    init.rx_frames = 0;
    let mut qp = RawQp::new(&pd, &init).map_err(|e| err("RawQp::new", e))?;
    qp.activate(1).map_err(|e| err("activate", e))?;
    let hdr = corpus.header_bytes();
    if qp.min_inline() != hdr {
        return Err(format!(
            "the crate's RawQp inlines {} header bytes, the corpus is for {hdr}",
            qp.min_inline()
        ));
    }
    let cap = qp.qp().cap();
    let mut raw = scq
        .into_raw()
        .map_err(|_| "the send CQ has no raw poller".to_string())?;
    for (n, post) in corpus.posts.iter().enumerate() {
        for (i, w) in post.iter().enumerate() {
            let (headers, rest, vlan) = split(w, &bytes, hdr);
            let inl: Vec<u8> = rest
                .iter()
                .flat_map(|&(o, l)| bytes[o as usize..(o + u64::from(l)) as usize].to_vec())
                .collect();
            let sges: Vec<_> = rest.iter().map(|&(o, l)| mr.sge(o, l)).collect();
            let payload = if w.inline {
                FramePayload::Inline(&inl)
            } else {
                FramePayload::Gather(&sges)
            };
            let csum = w.flags & flag::CSUM != 0;
            let off = TxOffload {
                ip_csum: csum,
                l4_csum: csum,
                vlan,
            };
            qp.send(&headers, payload, off, send_flags(w.flags), i as u64)
                .map_err(|e| err(&format!("post {n} frame {i}"), e))?;
        }
        qp.ring();
        let mut want = post
            .iter()
            .filter(|w| w.flags & flag::SIGNALED != 0)
            .count();
        let mut spins = 0;
        while want > 0 {
            emu.run_until_idle();
            for c in raw.by_ref() {
                if c.status() != WcStatus::SUCCESS {
                    return Err(err(&format!("post {n}"), format!("{:?}", c.status())));
                }
                qp.send_done(&c)
                    .map_err(|e| err(&format!("post {n} completion"), e))?;
                want = want.saturating_sub(1);
            }
            raw.publish_ci();
            spins += 1;
            if spins > 10_000 {
                return Err(err(&format!("post {n}"), "no send completion"));
            }
        }
    }
    let run = Run {
        qpn: qp.qpn(),
        lkey: mr.lkey(),
        max_send_wr: cap.max_send_wr,
        max_inline: cap.max_inline_data,
        wqes: Vec::new(),
    };
    let qpn = run.qpn;
    let wqes = emu
        .wqe_log(0)
        .into_iter()
        .filter(|r| r.qpn == qpn)
        .collect();
    drop((qp, raw, rcq, mr, pd, ctx));
    drop(buf);
    Ok(Run { wqes, ..run })
}

/// The outcome: differences (empty when equal) and the uses of each allowance.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// WQEs compared.
    pub wqes: usize,
    /// Human-readable differences.
    pub diffs: Vec<String>,
    /// Don't-care bytes that differed (inline padding).
    pub dont_care: BTreeMap<&'static str, usize>,
}

/// Byte ranges of one WQE and what they are, for a device inlining `hdr` header bytes.
/// The control segment's immediate (bytes 12..16) of a SEND without one is "unused imm":
/// libmlx5's `ibv_wr_*` path does not write it (the ring's old bytes stay), its
/// `ibv_post_send` and the crate write 0.
fn layout(w: &Wr, hdr: usize, len: usize) -> Vec<(usize, usize, &'static str)> {
    let mut v = vec![(4, 7, "qpn"), (12, 16, "unused imm")];
    let total: usize = w.sges.iter().map(|&(_, l)| l as usize).sum();
    let take = hdr.min(total);
    let mut pos = 16 + (14 + take).div_ceil(16).max(1) * 16;
    let rest = total - take;
    if w.inline {
        if rest > 0 {
            let end = pos + 4 + rest;
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

/// Compare the two runs' WQEs against `corpus`; `wr_api`: libmlx5 posted through
/// `ibv_wr_*` (the only case where the unused immediate may differ).
pub fn compare(corpus: &Corpus, theirs: &Run, ours: &Run, wr_api: bool, r: &mut Report) {
    let wrs: Vec<&Wr> = corpus.posts.iter().flatten().collect();
    if (theirs.max_send_wr, theirs.max_inline) != (ours.max_send_wr, ours.max_inline) {
        r.diffs.push(format!(
            "caps: libmlx5 max_send_wr {} max_inline {}, mlx5 crate {} {}",
            theirs.max_send_wr, theirs.max_inline, ours.max_send_wr, ours.max_inline
        ));
    }
    let (t, o) = (&theirs.wqes, &ours.wqes);
    if t.len() != wrs.len() || o.len() != wrs.len() {
        r.diffs.push(format!(
            "{} frames, libmlx5 {} WQEs, mlx5 crate {}",
            wrs.len(),
            t.len(),
            o.len()
        ));
        return;
    }
    let hdr = corpus.header_bytes();
    let be =
        |b: &[u8], s: usize, e: usize| b[s..e].iter().fold(0u64, |a, &x| (a << 8) | u64::from(x));
    for (i, ((a, b), w)) in t.iter().zip(o).zip(&wrs).enumerate() {
        r.wqes += 1;
        let head = format!("WQE {i} ({w:?})");
        if a.wqe_index != b.wqe_index || a.bytes.len() != b.bytes.len() {
            r.diffs.push(format!(
                "{head}: index {}/{} length {}/{}\n  libmlx5 {}\n  ours    {}",
                a.wqe_index,
                b.wqe_index,
                a.bytes.len(),
                b.bytes.len(),
                hex(&a.bytes),
                hex(&b.bytes)
            ));
            continue;
        }
        if a.via != b.via {
            r.diffs
                .push(format!("{head}: via {:?} / {:?}", a.via, b.via));
        }
        let mut covered = vec![false; a.bytes.len()];
        for (s, e, what) in layout(w, hdr, a.bytes.len()) {
            if e > a.bytes.len() || s >= e {
                continue;
            }
            covered[s..e].iter_mut().for_each(|c| *c = true);
            let (x, y) = (be(&a.bytes, s, e), be(&b.bytes, s, e));
            let own = |run: &Run| match what {
                "qpn" => Some(u64::from(run.qpn)),
                "lkey" => Some(u64::from(run.lkey)),
                _ => None,
            };
            match (own(theirs), own(ours)) {
                (Some(tx), Some(oy)) => {
                    if (x, y) != (tx, oy) {
                        r.diffs.push(format!(
                            "{head}: {what} {x:#x}/{y:#x}, expected each side's own {tx:#x}/{oy:#x}"
                        ));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_takes_the_inline_headers_as_libmlx5_copies_them() {
        let buf: Vec<u8> = (0..256u32).map(|i| i as u8).collect();
        let w = Wr {
            flags: 0,
            inline: false,
            sges: vec![(0, 6), (6, 6), (12, 90)],
        };
        let (h, rest, v) = split(&w, &buf, 18);
        assert_eq!(h, (0..18).collect::<Vec<u8>>());
        assert_eq!(rest, vec![(18, 84)]);
        assert_eq!(v, None);
        // An SGE ending where the headers do leaves no zero-length piece behind.
        let w = Wr {
            sges: vec![(0, 14), (14, 4), (18, 40)],
            ..w
        };
        assert_eq!(split(&w, &buf, 18).1, vec![(18, 40)]);
        // No inline headers: the frame's SGEs unchanged.
        assert_eq!(split(&w, &buf, 0).1, w.sges);
        // VLAN: the tag leaves the headers, its TCI is returned.
        let w = Wr {
            flags: flag::VLAN,
            inline: true,
            sges: vec![(0, 30)],
        };
        let (h, rest, v) = split(&w, &buf, 18);
        assert_eq!(v, Some(0x0e0f));
        assert_eq!(h, [&buf[..12], &buf[16..18]].concat());
        assert_eq!(rest, vec![(18, 12)]);
    }

    #[test]
    fn the_corpus_text_carries_every_frame_and_template() {
        let c = Corpus::standard(EthMinInline::L2);
        let t = c.text();
        let n: usize = c.posts.iter().map(Vec::len).sum();
        assert_eq!(t.lines().filter(|l| l.starts_with("wr ")).count(), n);
        assert_eq!(t.lines().filter(|l| l.starts_with("bytes ")).count(), 4);
        let b = c.buffer();
        assert_eq!(
            &b[at::VLAN as usize + 12..at::VLAN as usize + 16],
            &[0x81, 0x00, 0xa1, 0x23]
        );
        // Every inline frame fits the QP's inline size after the headers.
        for w in c.posts.iter().flatten().filter(|w| w.inline) {
            let total: u32 = w.sges.iter().map(|s| s.1).sum();
            assert!(total - L2_INLINE as u32 <= CAP_INLINE, "{w:?}");
        }
    }
}
