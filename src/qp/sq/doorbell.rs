//! The doorbell: the register a send queue rings, the BlueFlame policy, and [`SendQueue::ring`],
//! the one routine that makes finished WQEs visible (WQE stores, `to_device`, SQ record word 1,
//! `wc_start`, one MMIO -- an 8-byte doorbell or a BlueFlame copy -- `wc_flush`, flip the half).

use crate::mem::uar::{SqDoorbell, UarReg};
use crate::mmio::barrier;

use super::*;

/// When the doorbell is a BlueFlame copy of the WQE instead of an 8-byte store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BfPolicy {
    /// As libmlx5 by default (`MLX5_POST_SEND_PREFER_BF` on): BlueFlame for every single-WQE
    /// ring whose WQE fits half the register, when the QP has a BlueFlame register.
    #[default]
    PreferBf,
    /// BlueFlame only for single-WQE rings of inline WQEs (`MLX5_POST_SEND_PREFER_BF=0`).
    InlineOnly,
    /// Always the 8-byte doorbell (`MLX5_SHUT_UP_BF`).
    AlwaysDoorbell,
}

/// The doorbell register a QP rings, and how it may be used.
#[derive(Debug)]
pub struct Bfreg {
    /// The register, its BlueFlame halves (none when shared) and the half to use next.
    pub(super) db: SqDoorbell,
    /// Whether this QP is the register's only user.
    pub(super) dedicated: bool,
    /// A stable id of the register within its context (to see which QPs share one).
    pub(super) id: u32,
}

impl Bfreg {
    /// A register `reg` with BlueFlame halves of `half` bytes (0 for none).
    pub(crate) fn new(reg: UarReg, half: usize, dedicated: bool, id: u32) -> Self {
        // A shared register is never used for BlueFlame: its halves would need a lock.
        let half = if dedicated { half } else { 0 };
        Self {
            db: SqDoorbell::new(reg, half),
            dedicated,
            id,
        }
    }
}

/// Which register a QP rings; QPs with the same `id` share one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BfregInfo {
    /// Register id within the context.
    pub id: u32,
    /// UAR page index.
    pub uar_page: u32,
    /// Whether the QP is the only user (lock-free BlueFlame possible).
    pub dedicated: bool,
    /// BlueFlame half size in bytes (0: 8-byte doorbell only).
    pub bf_size: usize,
}

impl SendQueue {
    /// Which register this queue rings.
    pub fn bfreg(&self) -> BfregInfo {
        BfregInfo {
            id: self.q.bf.id,
            uar_page: self.q.bf.db.page().page_id,
            dedicated: self.q.bf.dedicated,
            bf_size: self.q.bf.db.half(),
        }
    }

    /// Change the BlueFlame policy.
    pub fn set_bf_policy(&mut self, policy: BfPolicy) {
        self.q.bf.db.set_bf_max(match policy {
            BfPolicy::AlwaysDoorbell => 0,
            BfPolicy::PreferBf | BfPolicy::InlineOnly => self.q.bf.db.half(),
        });
        self.q.bf_any = policy == BfPolicy::PreferBf;
    }

    /// Ring the doorbell for every WQE finished since the last ring (one doorbell per batch).
    /// Does nothing if there is none.
    #[inline(always)]
    pub fn ring(&mut self) {
        let p = &self.q.pend;
        if self.q.cur_post == p.rung {
            return;
        }
        // The last WQE's first 8 bytes (the 8-byte doorbell) and its `ds` (their byte 7).
        let head = self.ring.word0(p.last as usize * 64);
        let ds = u32::from(head.to_ne_bytes()[7] & 0x3F);
        let pos = p.last as usize * 64;
        // BlueFlame only for a single WQE of more than the control segment, inline unless
        // `PreferBf`; whether it fits the policy's limit (and the half) is the doorbell's check.
        let try_bf = p.last == p.rung && ds > 1 && (self.q.bf_any | p.inline);
        self.q.pend.rung = self.q.cur_post;

        // 1. WQE bytes before the doorbell record.
        barrier::to_device();
        // 2. SQ record (word 1) = next free WQEBB counter, low 16 bits.
        self.q.dbrec.word1().store_be32(self.q.cur_post & 0xFFFF);
        // 3. Record before the write-combining MMIO store.
        barrier::wc_start();
        // 4a. BlueFlame: the WQE in ascending 64-byte blocks, the source wrapping at the end.
        if try_bf && self.q.bf.db.blueflame(&self.ring, pos, ds) {
            self.q.stats.bf_copies += 1;
        } else {
            // 4b. The first 8 bytes of the last ctrl segment, verbatim.
            self.q.bf.db.ring8(head);
            self.q.stats.doorbells += 1;
        }
        // 5. Flush the write-combining buffer before anyone rings again.
        barrier::wc_flush();
        // 6. Alternate BlueFlame halves (no-op for doorbell-only registers).
        self.q.bf.db.flip();
    }
}
