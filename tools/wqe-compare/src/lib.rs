//! Byte-for-byte comparison of the send WQEs built by libmlx5 (rdma-core, unmodified, through
//! the `LD_PRELOAD` front door `mlx5-emu-preload`) and by the `mlx5` crate, for one corpus of
//! work requests posted on the emulated ConnectX.
//!
//! ```text
//!  corpus (corpus.rs) ──text──> harness.c ── ibv_post_send ─> libmlx5 ─> mlx5-emu (preload,
//!        │                                                     MLX5_EMU_WQE_LOG=theirs.log)
//!        └──────────> driver.rs ── Qp::post_send ─> mlx5 crate ─> mlx5-emu (in process,
//!                                                                 Emulator::wqe_log)
//!  compare.rs: per QP, WQE by WQE: index, doorbell kind, length, every byte
//! ```
//!
//! Three sending QPs, each with a responder on the same HCA: RC (loopback; every opcode incl.
//! READ and atomics), UD (through an AH to the own port), UC (loopback; SEND/WRITE with and
//! without immediate). The corpus covers 1..max SGEs, every inline size boundary up to the
//! QP's `max_inline_data`, flag combinations (signaled, fence, solicited), chains and WQEs
//! straddling the end of each SQ ring ([`corpus::Corpus::standard`]).
//!
//! Both sides use the same emulator identity (node [`driver::NODE`]), create their objects in
//! the same order, map their data buffer at the same virtual address ([`corpus::BUF_VA`]) and
//! request identical QP caps, so the WQEs should be identical to the byte. What may differ is
//! listed in [`compare`] as narrow allowances; everything else is a failure.
//!
//! The recording hook lives in the emulator (`mlx5_emu::WqeRecord`): every WQE is taken as the
//! device fetched it for execution (`ds * 16` bytes, joined across the ring end) together with
//! how it was announced (BlueFlame copy, 8-byte doorbell, or earlier WR of a chain).
//!
//! Configurations ([`Knobs`], one test each in `tests/compare.rs`): libmlx5's defaults; dynamic
//! UARs; `MLX5_POST_SEND_PREFER_BF=0` (BlueFlame for inline WQEs only); `MLX5_SHUT_UP_BF=1`;
//! an HCA without BlueFlame registers; 256-byte BlueFlame registers; 8 low-latency registers
//! (every QP its own); requester QPs with `sq_sig_all`; the harness posting through the
//! `ibv_wr_*` API (perftest's) instead of `ibv_post_send`; a RoCE port (UD through an AH made
//! by GID, RC/UC connected by GID; RoCE v2 and v1 source GIDs). Both sides always run
//! without scatter-to-CQE (`MLX5_SCATTER_TO_CQE=0` for libmlx5, `scatter_to_cqe = false` for ours):
//! it changes CQEs, not WQEs, and keeps READ/atomic results in memory on both sides.

pub mod compare;
pub mod corpus;
pub mod driver;
pub mod harness;
pub mod raw;
pub mod xrc_dc;

use std::collections::BTreeMap;

/// The doorbell/UAR configuration both sides run with, set the same way on each: libmlx5
/// through its environment variables, the `mlx5` crate through its configuration, the
/// emulator through `EmuConfig` (in process) or `MLX5_EMU_*` (preload).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Knobs {
    /// Name for reports and scratch directories.
    pub name: &'static str,
    /// Emulator: BlueFlame register size (0: no BlueFlame registers at all).
    pub bf_reg_size: u32,
    /// Emulator: grant dynamic UARs to contexts asking for them (both drivers ask).
    pub dyn_uar: bool,
    /// libmlx5 `MLX5_POST_SEND_PREFER_BF` (default on) / `BfPolicy::PreferBf`; off:
    /// BlueFlame only for inline WQEs (`BfPolicy::InlineOnly`).
    pub prefer_bf: bool,
    /// libmlx5 `MLX5_SHUT_UP_BF=1` / `ContextConfig::no_bf`: never BlueFlame.
    pub shut_up_bf: bool,
    /// libmlx5 `MLX5_NUM_LOW_LAT_UUARS` / `ContextConfig::low_latency_bfregs`: how many QPs
    /// of a context get a doorbell register of their own (libmlx5's default: 4).
    pub low_latency_bfregs: u32,
    /// The harness posts with the extended API (`ibv_wr_start` .. `ibv_wr_complete`, what
    /// perftest uses) instead of `ibv_post_send`. The `mlx5` crate side is the same.
    pub wr_api: bool,
    /// The emulated port is Ethernet (RoCE): `MLX5_EMU_LINK_LAYER=eth` for the preload,
    /// `EmuConfig::link_layer` in process. The corpus then carries the GRH both sides use
    /// ([`corpus::RoceRoute`]).
    pub roce: bool,
}

impl Knobs {
    /// libmlx5's defaults on an emulated HCA with 512-byte BlueFlame registers, static UARs.
    pub const DEFAULT: Knobs = Knobs {
        name: "default",
        bf_reg_size: 512,
        dyn_uar: false,
        prefer_bf: true,
        shut_up_bf: false,
        low_latency_bfregs: 4,
        wr_api: false,
        roce: false,
    };

    /// Whether any WQE may go by BlueFlame with these knobs.
    pub fn blueflame_possible(&self) -> bool {
        self.bf_reg_size != 0 && !self.shut_up_bf
    }
}

/// What one side reports about one of its sending QPs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpInfo {
    /// QPN of the requester.
    pub qpn: u32,
    /// QPN of its responder.
    pub peer_qpn: u32,
    /// Reported `max_send_wr`.
    pub max_send_wr: u32,
    /// Reported `max_inline_data`.
    pub max_inline: u32,
    /// WQEBBs in the SQ ring.
    pub sq_wqe_cnt: u32,
    /// WRs posted.
    pub posted: u64,
    /// The QP rings a doorbell register shared with other QPs. Known for the `mlx5` crate
    /// side only (the harness cannot see it through mlx5dv and reports `false`).
    pub bfreg_shared: bool,
}

/// What one side reports besides its WQEs: object numbers, keys and the caps its driver
/// reported for the QPs it created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SideInfo {
    /// Per sending QP, indexed by [`QpSel`](corpus::QpSel) (`as usize`).
    pub qps: [QpInfo; 3],
    /// lkey of the one memory region.
    pub lkey: u32,
    /// rkey of the one memory region.
    pub rkey: u32,
}

impl SideInfo {
    /// The QP `sel`.
    pub fn qp(&self, sel: corpus::QpSel) -> &QpInfo {
        &self.qps[sel as usize]
    }

    /// The `key=value` pairs the harness prints (`rc_qpn=..`, `ud_max_inline=..`, `lkey=..`).
    pub fn pairs(&self) -> Vec<(String, u64)> {
        let mut v = Vec::new();
        for sel in corpus::QpSel::ALL {
            let q = self.qp(sel);
            let n = sel.name();
            v.push((format!("{n}_qpn"), q.qpn.into()));
            v.push((format!("{n}_peer_qpn"), q.peer_qpn.into()));
            v.push((format!("{n}_max_send_wr"), q.max_send_wr.into()));
            v.push((format!("{n}_max_inline"), q.max_inline.into()));
            v.push((format!("{n}_sq_wqe_cnt"), q.sq_wqe_cnt.into()));
            v.push((format!("{n}_posted"), q.posted));
        }
        v.push(("lkey".to_string(), self.lkey.into()));
        v.push(("rkey".to_string(), self.rkey.into()));
        v
    }

    /// Parse the harness's `info <key>=<value>` lines (values in C notation). Every key of
    /// [`pairs`](Self::pairs) must be present.
    ///
    /// # Errors
    /// The first missing or malformed key.
    pub fn parse(text: &str) -> Result<SideInfo, String> {
        let mut kv = BTreeMap::new();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("info ") else {
                continue;
            };
            for item in rest.split_ascii_whitespace() {
                if let Some((k, v)) = item.split_once('=') {
                    let n = match v.strip_prefix("0x") {
                        Some(h) => u64::from_str_radix(h, 16),
                        None => v.parse(),
                    }
                    .map_err(|e| format!("info {k}={v}: {e}"))?;
                    kv.insert(k.to_string(), n);
                }
            }
        }
        let get = |k: &str| {
            kv.get(k)
                .copied()
                .ok_or(format!("harness did not report {k}"))
        };
        let get32 = |k: &str| {
            get(k).and_then(|v| u32::try_from(v).map_err(|_| format!("{k}={v} out of range")))
        };
        let mut info = SideInfo {
            lkey: get32("lkey")?,
            rkey: get32("rkey")?,
            ..SideInfo::default()
        };
        for sel in corpus::QpSel::ALL {
            let n = sel.name();
            info.qps[sel as usize] = QpInfo {
                qpn: get32(&format!("{n}_qpn"))?,
                peer_qpn: get32(&format!("{n}_peer_qpn"))?,
                max_send_wr: get32(&format!("{n}_max_send_wr"))?,
                max_inline: get32(&format!("{n}_max_inline"))?,
                sq_wqe_cnt: get32(&format!("{n}_sq_wqe_cnt"))?,
                posted: get(&format!("{n}_posted"))?,
                bfreg_shared: false,
            };
        }
        Ok(info)
    }
}

/// An anonymous private mapping at a fixed virtual address (`MAP_FIXED_NOREPLACE`: never
/// replaces an existing mapping), unmapped on drop.
#[derive(Debug)]
pub struct FixedBuf {
    ptr: *mut u8,
    len: usize,
}

impl FixedBuf {
    /// Map `len` zeroed bytes at `va`.
    ///
    /// # Errors
    /// The mmap error, or `EEXIST`-style failure if something already lives there.
    pub fn map(va: u64, len: usize) -> std::io::Result<FixedBuf> {
        // SAFETY: an anonymous private mapping; MAP_FIXED_NOREPLACE fails rather than
        // replacing anything already mapped at `va`, so no existing memory is affected.
        let p = unsafe {
            libc::mmap(
                va as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let buf = FixedBuf { ptr: p.cast(), len };
        if p as u64 != va {
            // Old kernels ignore the NOREPLACE flag and treat `va` as a hint.
            return Err(std::io::Error::other(format!(
                "mapping landed at {p:p}, not {va:#x}"
            )));
        }
        Ok(buf)
    }

    /// Start of the mapping.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty (never: `map` of 0 bytes fails).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copy `data` to `offset`.
    ///
    /// # Panics
    /// If the range is outside the mapping (a bug of the caller, not outside input).
    pub fn write(&self, offset: usize, data: &[u8]) {
        assert!(offset + data.len() <= self.len, "write past the mapping");
        // SAFETY: `offset` is within the mapping (checked above), so the pointer stays inside
        // the same allocation.
        let dst = unsafe { self.ptr.add(offset) };
        // SAFETY: `dst..dst + data.len()` is inside the live mapping (checked above); it
        // cannot overlap `data` because `FixedBuf` never hands out references into the
        // mapping, so no safe slice can point there.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) };
    }
}

impl Drop for FixedBuf {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping created in `map`, no longer used.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn side_info_round_trips_through_the_harness_format() {
        let mut i = SideInfo {
            rkey: 0x9001,
            ..SideInfo::default()
        };
        i.qps[corpus::QpSel::Uc as usize].qpn = 0x9_0005;
        i.qps[corpus::QpSel::Rc as usize].posted = 300;
        let line: Vec<String> = i
            .pairs()
            .iter()
            .map(|(k, v)| format!("{k}={v:#x}"))
            .collect();
        let text = format!("hello\ninfo {}\n", line.join(" "));
        assert_eq!(SideInfo::parse(&text), Ok(i));
        assert!(SideInfo::parse("info rc_qpn=1 lkey=1 rkey=2").is_err());
    }

    #[test]
    fn fixed_buf_lands_where_asked() {
        let va = 0x3a5b_0000_0000u64;
        let b = FixedBuf::map(va, 8192).unwrap();
        assert_eq!(b.ptr() as u64, va);
        b.write(4096, b"xy");
        // A second mapping over the same range is refused, not replaced.
        assert!(FixedBuf::map(va, 4096).is_err());
    }
}
