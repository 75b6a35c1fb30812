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
//! an HCA without BlueFlame registers; requester QPs with `sq_sig_all`. Both sides always run
//! without scatter-to-CQE (`MLX5_SCATTER_TO_CQE=0` for libmlx5; the crate never asks for it):
//! it changes CQEs, not WQEs, and keeps READ/atomic results in memory on both sides.

pub mod compare;
pub mod corpus;
pub mod driver;
pub mod harness;

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
    /// The harness posts with the extended API (`ibv_wr_start` .. `ibv_wr_complete`, what
    /// perftest uses) instead of `ibv_post_send`. The `mlx5` crate side is the same.
    pub wr_api: bool,
}

impl Knobs {
    /// libmlx5's defaults on an emulated HCA with 512-byte BlueFlame registers, static UARs.
    pub const DEFAULT: Knobs = Knobs {
        name: "default",
        bf_reg_size: 512,
        dyn_uar: false,
        prefer_bf: true,
        shut_up_bf: false,
        wr_api: false,
    };

    /// Whether any WQE may go by BlueFlame with these knobs.
    pub fn blueflame_possible(&self) -> bool {
        self.bf_reg_size != 0 && !self.shut_up_bf
    }
}

/// What one side reports besides its WQEs: object numbers, keys and the caps its driver
/// reported for the QPs it created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SideInfo {
    /// QPN of the RC requester.
    pub rc_qpn: u32,
    /// QPN of the RC responder.
    pub rc_peer_qpn: u32,
    /// QPN of the UD requester.
    pub ud_qpn: u32,
    /// QPN of the UD responder.
    pub ud_peer_qpn: u32,
    /// lkey of the one memory region.
    pub lkey: u32,
    /// rkey of the one memory region.
    pub rkey: u32,
    /// RC requester: reported `max_send_wr`.
    pub rc_max_send_wr: u32,
    /// RC requester: reported `max_inline_data`.
    pub rc_max_inline: u32,
    /// RC requester: WQEBBs in the SQ ring.
    pub rc_sq_wqe_cnt: u32,
    /// UD requester: reported `max_send_wr`.
    pub ud_max_send_wr: u32,
    /// UD requester: reported `max_inline_data`.
    pub ud_max_inline: u32,
    /// UD requester: WQEBBs in the SQ ring.
    pub ud_sq_wqe_cnt: u32,
    /// WRs posted on the RC requester.
    pub rc_posted: u64,
    /// WRs posted on the UD requester.
    pub ud_posted: u64,
}

impl SideInfo {
    /// The `key=value` pairs, in the order the harness prints them.
    pub fn pairs(&self) -> [(&'static str, u64); 14] {
        [
            ("rc_qpn", self.rc_qpn.into()),
            ("rc_peer_qpn", self.rc_peer_qpn.into()),
            ("ud_qpn", self.ud_qpn.into()),
            ("ud_peer_qpn", self.ud_peer_qpn.into()),
            ("lkey", self.lkey.into()),
            ("rkey", self.rkey.into()),
            ("rc_max_send_wr", self.rc_max_send_wr.into()),
            ("rc_max_inline", self.rc_max_inline.into()),
            ("rc_sq_wqe_cnt", self.rc_sq_wqe_cnt.into()),
            ("ud_max_send_wr", self.ud_max_send_wr.into()),
            ("ud_max_inline", self.ud_max_inline.into()),
            ("ud_sq_wqe_cnt", self.ud_sq_wqe_cnt.into()),
            ("rc_posted", self.rc_posted),
            ("ud_posted", self.ud_posted),
        ]
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
        Ok(SideInfo {
            rc_qpn: get32("rc_qpn")?,
            rc_peer_qpn: get32("rc_peer_qpn")?,
            ud_qpn: get32("ud_qpn")?,
            ud_peer_qpn: get32("ud_peer_qpn")?,
            lkey: get32("lkey")?,
            rkey: get32("rkey")?,
            rc_max_send_wr: get32("rc_max_send_wr")?,
            rc_max_inline: get32("rc_max_inline")?,
            rc_sq_wqe_cnt: get32("rc_sq_wqe_cnt")?,
            ud_max_send_wr: get32("ud_max_send_wr")?,
            ud_max_inline: get32("ud_max_inline")?,
            ud_sq_wqe_cnt: get32("ud_sq_wqe_cnt")?,
            rc_posted: get("rc_posted")?,
            ud_posted: get("ud_posted")?,
        })
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
        let i = SideInfo {
            rc_qpn: 0x9_0005,
            rkey: 0x9001,
            rc_posted: 300,
            ..SideInfo::default()
        };
        let line: Vec<String> = i
            .pairs()
            .iter()
            .map(|(k, v)| format!("{k}={v:#x}"))
            .collect();
        let text = format!("hello\ninfo {}\n", line.join(" "));
        assert_eq!(SideInfo::parse(&text), Ok(i));
        assert!(SideInfo::parse("info rc_qpn=1").is_err());
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
