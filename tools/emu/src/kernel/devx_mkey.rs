//! DEVX memory keys: `CREATE_MKEY` of an indirect key (KLM or KSM translation) and its
//! destruction.
//!
//! UCX makes such keys on every mlx5 device that reports `fixed_buffer_size` (KSM): its
//! atomic key and, with PCIe relaxed ordering (UCX's default on some AMD CPUs), the
//! strict-order key a fenced put goes through, each a KSM key whose space starts at the
//! region's address plus a per-process offset (`8 * (pid % 256)`) and maps back onto the
//! region's own key. A peer adds that offset to every address it sends under such a key, so a
//! device that took the key for a direct one would write that far past the buffer. The
//! device translates through the entries (`device/dma.rs`, `through_entries`).
//!
//! What this firmware does not make is refused with a failed status (EREMOTEIO): other access
//! modes (PA, MTT, MEMIC), keys on a umem, keys bound to one QP, signature (BSF), keys a UMR
//! may modify or fill (`umr_en`, `free`), 2^64-byte keys, and an unknown PD.

use mlx5_ffi::prm::{self, Field, mkey, status};

use super::devx::{Object, fw_error};
use super::{hca_of, pd_use};
use crate::state::{Indirect, KlmEntry, Mr, World, access};

/// The most entries one key may have (a 2 GiB entry each in UCX's keys: 2^16 entries cover
/// 128 TiB).
const MAX_ENTRIES: u64 = 1 << 16;

fn bad(st: u8) -> Vec<u8> {
    fw_error(st, 0)
}

/// CREATE_MKEY: Ok((output, object)) or the firmware's failure.
pub(super) fn create_mkey(
    w: &mut World,
    ctx: u64,
    cmd: &[u8],
) -> Result<(Vec<u8>, Object), Vec<u8>> {
    if cmd.len() < mkey::ENTRIES_BYTE {
        return Err(bad(status::BAD_INP_LEN));
    }
    let g = |f: Field| prm::get(cmd, f.at(mkey::MKC));
    let mode = (g(mkey::ACCESS_MODE_4_2) << 2) | g(mkey::ACCESS_MODE_1_0);
    let ksm = match mode {
        mkey::MODE_KSM => true,
        mkey::MODE_KLM => false,
        _ => return Err(bad(status::BAD_PARAM)),
    };
    if prm::get(cmd, mkey::UMEM_VALID) != 0
        || g(mkey::QPN) != 0xff_ffff
        || g(mkey::BSF_EN) != 0
        || g(mkey::UMR_EN) != 0
        || g(mkey::FREE) != 0
        || g(mkey::LENGTH64) != 0
    {
        return Err(bad(status::BAD_PARAM));
    }
    let hca = hca_of(w, ctx);
    let pdn = g(mkey::PD) as u32;
    if w.hcas[hca].pds.get(&pdn).is_none_or(|x| x.ctx != ctx) {
        return Err(bad(status::BAD_RES));
    }
    let n = prm::get(cmd, mkey::ACTUAL_SIZE);
    if n == 0 || n > g(mkey::TRANSLATIONS_OCTWORD_SIZE) || n > MAX_ENTRIES {
        return Err(bad(status::BAD_PARAM));
    }
    let n = n as usize;
    if cmd.len() < mkey::ENTRIES_BYTE + n * mkey::ENTRY_BYTES {
        return Err(bad(status::BAD_INP_LEN));
    }
    let (start, len) = (g(mkey::START_ADDR), g(mkey::LEN));
    if len == 0 || start.checked_add(len).is_none() {
        return Err(bad(status::BAD_PARAM));
    }
    let log = g(mkey::LOG_ENTITY_SIZE) as u8;
    let mut entries = Vec::with_capacity(n);
    let mut at = 0u64;
    for i in 0..n {
        let base = ((mkey::ENTRIES_BYTE + i * mkey::ENTRY_BYTES) * 8) as u32;
        let e = |f: Field| prm::get(cmd, f.at(base));
        // A KLM entry's byte count of 0 means 2 GiB (the PRM's encoding).
        let bytes = if ksm {
            1u64 << log
        } else {
            match e(mkey::E_BYTE_COUNT) {
                0 => 1 << 31,
                b => b,
            }
        };
        entries.push(KlmEntry {
            key: e(mkey::E_MKEY) as u32,
            addr: e(mkey::E_ADDRESS),
            len: bytes,
            at,
        });
        at = at.saturating_add(bytes);
    }
    let mut acc = 0;
    for (f, a) in [
        (mkey::LW, access::LOCAL_WRITE),
        (mkey::RR, access::REMOTE_READ),
        (mkey::RW, access::REMOTE_WRITE),
        (mkey::A, access::REMOTE_ATOMIC),
    ] {
        if g(f) != 0 {
            acc |= a;
        }
    }
    let h = &mut w.hcas[hca];
    let idx = h.next_key;
    h.next_key = (h.next_key + 1) & 0xff_ffff;
    let key = (idx << 8) | g(mkey::MKEY_7_0) as u32;
    h.mrs.insert(
        idx,
        Mr {
            ctx,
            pdn,
            start,
            length: len,
            iova: start,
            access: acc,
            key,
            indirect: Some(Box::new(Indirect {
                ksm_log: ksm.then_some(log),
                entries,
            })),
        },
    );
    pd_use(w, hca, pdn, 1);
    let mut out = vec![0u8; mkey::OUT_BYTES];
    prm::set(&mut out, mkey::INDEX, u64::from(idx));
    Ok((out, Object::Mkey { idx }))
}

/// Destroy the indirect key at index `idx` (its DEVX object is gone).
pub(super) fn destroy_mkey(w: &mut World, ctx: u64, idx: u32) {
    let hca = hca_of(w, ctx);
    let h = &mut w.hcas[hca];
    if h.mrs.get(&idx).is_some_and(|m| m.indirect.is_some()) {
        if let Some(m) = h.mrs.remove(&idx) {
            pd_use(w, hca, m.pdn, -1);
        }
    }
}
