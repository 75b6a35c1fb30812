//! The device's own view of its errors: which check of a memory key failed with the values
//! compared, and the failed checks kept for `Emulator::failed_checks`. Written by the device
//! (`device/dma.rs`), held by the world (`state.rs`), read by the face (`inspect.rs`).

use std::collections::VecDeque;

use mlx5_ffi::uverbs::access;

/// Which check of a memory key failed, with the values compared: the device's own view of a
/// protection error (the CQE carries only its code; the trace and
/// `Emulator::failed_checks` carry this).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyFault {
    /// No MR has this key (never registered, deregistered, or its variant byte differs).
    Unknown {
        /// The key used.
        key: u32,
    },
    /// The MR is another protection domain's than the QP's.
    Pd {
        /// The key used.
        key: u32,
        /// The MR's PD.
        mr_pdn: u32,
        /// The QP's (or SRQ's) PD.
        qp_pdn: u32,
    },
    /// The MR lacks an access right the operation needs.
    Rights {
        /// The key used.
        key: u32,
        /// The MR's access flags.
        have: u32,
        /// The flags the operation needs.
        need: u32,
    },
    /// The QP's own remote access flags (qp_access_flags) lack the right.
    QpRights {
        /// The QP's access flags.
        have: u32,
        /// The flag the operation needs.
        need: u32,
    },
    /// `[va, va+len)` is not inside the MR.
    Range {
        /// The key used.
        key: u32,
        /// The address used.
        va: u64,
        /// The length used.
        len: u64,
        /// The MR's first address (its iova, or 0 when zero-based).
        start: u64,
        /// The MR's end (first address after it).
        end: u64,
    },
}

/// Access flags by name, `A|B|C` (`none` for 0).
pub fn access_names(flags: u32) -> String {
    const NAMES: [(u32, &str); 6] = [
        (access::LOCAL_WRITE, "LOCAL_WRITE"),
        (access::REMOTE_WRITE, "REMOTE_WRITE"),
        (access::REMOTE_READ, "REMOTE_READ"),
        (access::REMOTE_ATOMIC, "REMOTE_ATOMIC"),
        (access::MW_BIND, "MW_BIND"),
        (access::ZERO_BASED, "ZERO_BASED"),
    ];
    let v: Vec<&str> = NAMES
        .iter()
        .filter(|(f, _)| flags & f != 0)
        .map(|&(_, n)| n)
        .collect();
    if v.is_empty() {
        "none".to_owned()
    } else {
        v.join("|")
    }
}

impl KeyFault {
    /// The 3-bit detail of the memory-translation vendor syndrome for this fault (the low bits
    /// of 0x30 data buffer / 0x50 gather list): 0 unspecified (key unknown: the public decoder
    /// has no code of its own for it), 2 protection-domain violation, 3 access-rights
    /// violation, 4 length violation.
    pub fn tpt_detail(self) -> u8 {
        match self {
            KeyFault::Unknown { .. } => 0,
            KeyFault::Pd { .. } => 2,
            KeyFault::Rights { .. } | KeyFault::QpRights { .. } => 3,
            KeyFault::Range { .. } => 4,
        }
    }

    /// The check's short name: `key`, `PD`, `rights`, `range`.
    pub fn check(self) -> &'static str {
        match self {
            KeyFault::Unknown { .. } => "key",
            KeyFault::Pd { .. } => "PD",
            KeyFault::Rights { .. } | KeyFault::QpRights { .. } => "rights",
            KeyFault::Range { .. } => "range",
        }
    }

    /// What failed, with the expected and the actual value (printed after `check(): `);
    /// `kind` names the key ("lkey", "rkey") and `side` where it was checked ("at the
    /// requester", "at the responder").
    pub fn describe(self, kind: &str, side: &str) -> String {
        match self {
            KeyFault::Unknown { key } => format!(
                "{kind} {key:#010x} unknown {side}: no MR has this key (index {:#x}, variant {:#04x})",
                key >> 8,
                key & 0xff
            ),
            KeyFault::Pd {
                key,
                mr_pdn,
                qp_pdn,
            } => format!(
                "{kind} {key:#010x} is an MR of PD {mr_pdn:#x}, the QP's PD is {qp_pdn:#x} (PD mismatch {side})"
            ),
            KeyFault::Rights { key, have, need } => format!(
                "the MR of {kind} {key:#010x} lacks {} (access flags: {}) {side}",
                access_names(need & !have),
                access_names(have)
            ),
            KeyFault::QpRights { have, need } => format!(
                "the QP's qp_access_flags lack {} (qp_access_flags: {}) {side}",
                access_names(need & !have),
                access_names(have)
            ),
            KeyFault::Range {
                key,
                va,
                len,
                start,
                end,
            } => {
                let last = va.wrapping_add(len);
                if va < start {
                    format!(
                        "addr {va:#x} below the start {start:#x} of the MR of {kind} {key:#010x} {side}"
                    )
                } else {
                    format!(
                        "addr+len {last:#x} beyond the MR's end {end:#x} ({kind} {key:#010x}, addr {va:#x} len {len}) {side}"
                    )
                }
            }
        }
    }
}

/// A check the device made that failed: its view of an error, kept for
/// `Emulator::failed_checks` (the last [`FAILED_CHECKS_KEPT`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailedCheck {
    /// The HCA.
    pub hca: usize,
    /// The QP that made the check.
    pub qpn: u32,
    /// "requester" or "responder".
    pub side: &'static str,
    /// The check: `key`, `PD`, `rights`, `range`, `receive WQE`, `length`, `ACK`.
    pub check: &'static str,
    /// What was compared (expected and actual values).
    pub detail: String,
}

/// How many failed checks the device keeps.
pub const FAILED_CHECKS_KEPT: usize = 32;

/// The device's record of failed checks (errors only: nothing here is touched on success).
#[derive(Debug, Default)]
pub struct Checks {
    /// The last key fault found by [`check_key`], until an error path takes it.
    pub(crate) last: std::cell::Cell<Option<KeyFault>>,
    /// The failed checks, oldest first.
    pub(crate) failed: VecDeque<FailedCheck>,
}
