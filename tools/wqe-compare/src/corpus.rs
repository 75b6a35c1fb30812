//! The corpus of send work requests both drivers post, and its text form for the C harness.
//!
//! Work requests are described in ibverbs terms (`enum ibv_wr_opcode` numbers, `enum
//! ibv_send_flags` bits, SGEs as offsets into one buffer mapped at the same virtual address
//! [`BUF_VA`] in both processes), so the C harness posts them with `ibv_post_send` verbatim
//! and [`crate::driver`] translates them to the `mlx5` crate's [`SendWr`](mlx5::SendWr).
//!
//! Text form ([`Corpus::to_text`]), one item per line, numbers in C notation (`strtoul` base 0):
//! ```text
//! buf <va> <len>
//! src <offset> <length>          -- fill with corpus::src_byte(i) (i = offset within buffer)
//! caps <rc|ud|uc> <max_send_wr> <max_send_sge> <max_inline_data> <max_recv_wr>
//! recv <rc|ud|uc> <count> <offset> <length>
//! qkey <qkey>
//! sigall <0|1>                   -- create the requester QPs with sq_sig_all
//! roce <sgid_index> <flow_label> <sl> <traffic_class> <hop_limit>
//!                                -- optional: RoCE port; address the own GID with a GRH
//! post <n>                       -- one ibv_post_send call of the n `wr` lines that follow
//! wr <rc|ud|uc> <opcode> <flags> <imm> <remote_off> <compare> <swap_add> <nsge> [<off>:<len>]...
//! end
//! ```

use std::fmt::Write;

/// Virtual address of the data buffer in both processes (mapped with `MAP_FIXED_NOREPLACE`),
/// so SGE and remote addresses in the WQEs are equal on both sides.
pub const BUF_VA: u64 = 0x3a5a_0000_0000;
/// Length of the data buffer (one memory region with every access right).
pub const BUF_LEN: u64 = 1 << 20;
/// Source region: inline payloads and gather lists; never written after setup.
pub const SRC_OFF: u64 = 0;
/// Remote region: RDMA WRITE targets, READ sources, atomic targets.
pub const REMOTE_OFF: u64 = 0x4_0000;
/// Local destination of READ and atomic results.
pub const RESULT_OFF: u64 = 0x8_0000;
/// Receive buffers of the RC responder (all receives share it).
pub const RC_RECV_OFF: u64 = 0xC_0000;
/// Receive buffers of the UC responder.
pub const UC_RECV_OFF: u64 = 0xD_0000;
/// Receive buffers of the UD responder (GRH + payload).
pub const UD_RECV_OFF: u64 = 0xE_0000;
/// Length of one receive SGE.
pub const RECV_LEN: u32 = 0x1_0000;
/// Q_Key of the UD pair.
pub const QKEY: u32 = 0x1111_2222;

/// `enum ibv_wr_opcode` values used by the corpus.
pub mod op {
    /// `IBV_WR_RDMA_WRITE`.
    pub const RDMA_WRITE: u32 = 0;
    /// `IBV_WR_RDMA_WRITE_WITH_IMM`.
    pub const RDMA_WRITE_WITH_IMM: u32 = 1;
    /// `IBV_WR_SEND`.
    pub const SEND: u32 = 2;
    /// `IBV_WR_SEND_WITH_IMM`.
    pub const SEND_WITH_IMM: u32 = 3;
    /// `IBV_WR_RDMA_READ`.
    pub const RDMA_READ: u32 = 4;
    /// `IBV_WR_ATOMIC_CMP_AND_SWP`.
    pub const ATOMIC_CMP_AND_SWP: u32 = 5;
    /// `IBV_WR_ATOMIC_FETCH_AND_ADD`.
    pub const ATOMIC_FETCH_AND_ADD: u32 = 6;
    /// `IBV_WR_SEND_WITH_INV`.
    pub const SEND_WITH_INV: u32 = 9;

    /// Name for reports.
    pub fn name(op: u32) -> &'static str {
        match op {
            RDMA_WRITE => "RDMA_WRITE",
            RDMA_WRITE_WITH_IMM => "RDMA_WRITE_IMM",
            SEND => "SEND",
            SEND_WITH_IMM => "SEND_IMM",
            RDMA_READ => "RDMA_READ",
            ATOMIC_CMP_AND_SWP => "ATOMIC_CS",
            ATOMIC_FETCH_AND_ADD => "ATOMIC_FA",
            SEND_WITH_INV => "SEND_INV",
            _ => "?",
        }
    }
}

/// `enum ibv_send_flags` bits.
pub mod flag {
    /// `IBV_SEND_FENCE`.
    pub const FENCE: u32 = 1;
    /// `IBV_SEND_SIGNALED`.
    pub const SIGNALED: u32 = 2;
    /// `IBV_SEND_SOLICITED`.
    pub const SOLICITED: u32 = 4;
    /// `IBV_SEND_INLINE`.
    pub const INLINE: u32 = 8;
}

/// Which sending QP a work request goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QpSel {
    /// The RC requester (connected in loopback to the RC responder).
    Rc,
    /// The UD requester (addressing the UD responder through an AH to the own port).
    Ud,
    /// The UC requester (connected in loopback to the UC responder).
    Uc,
}

impl QpSel {
    /// Every sending QP, in creation order.
    pub const ALL: [QpSel; 3] = [QpSel::Rc, QpSel::Ud, QpSel::Uc];

    /// `rc` / `ud` / `uc`.
    pub fn name(self) -> &'static str {
        match self {
            QpSel::Rc => "rc",
            QpSel::Ud => "ud",
            QpSel::Uc => "uc",
        }
    }

    /// The requested caps of this QP (and of its responder).
    pub fn caps(self) -> Caps {
        match self {
            QpSel::Rc => RC_CAPS,
            QpSel::Ud => UD_CAPS,
            QpSel::Uc => UC_CAPS,
        }
    }

    /// (WQE size, SQ WQEBBs, reported `max_inline_data`) both drivers must arrive at.
    pub fn geometry(self) -> (u32, u32, u32) {
        self.caps().geometry(overhead(self))
    }

    /// Where the responder's receives land.
    pub fn recv_off(self) -> u64 {
        match self {
            QpSel::Rc => RC_RECV_OFF,
            QpSel::Ud => UD_RECV_OFF,
            QpSel::Uc => UC_RECV_OFF,
        }
    }
}

/// Requested QP capabilities (identical on both sides, so the SQ geometry matches).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    /// `max_send_wr`.
    pub max_send_wr: u32,
    /// `max_send_sge`.
    pub max_send_sge: u32,
    /// `max_inline_data` requested.
    pub max_inline_data: u32,
    /// `max_recv_wr` (the responder's receive queue; `max_recv_sge` is 1).
    pub max_recv_wr: u32,
}

impl Caps {
    /// The send-queue geometry libmlx5 computes for these caps (docs/datapath.md §2.2) when
    /// the QP's operations need `overhead` bytes of header: (WQE size, WQEBBs in the ring,
    /// reported `max_inline_data`).
    pub fn geometry(&self, overhead: u32) -> (u32, u32, u32) {
        let size = overhead + 16 * self.max_send_sge;
        let inl = if self.max_inline_data > 0 {
            overhead + (4 + self.max_inline_data).next_multiple_of(16)
        } else {
            0
        };
        let wqe_size = size.max(inl).next_multiple_of(64);
        let ring = (self.max_send_wr * wqe_size).next_power_of_two();
        (wqe_size, ring / 64, wqe_size - overhead - 4)
    }
}

/// Header bytes of the operations each QP may post (ctrl + raddr + atomic for RC, ctrl + AV
/// for UD, ctrl + raddr for UC). The harness creates its QPs with exactly the
/// `send_ops_flags` the corpus uses, so libmlx5 uses the same overhead as the `mlx5` crate
/// (not its default 192 B for the UMR operations LOCAL_INV/BIND_MW on RC and UC).
pub fn overhead(qp: QpSel) -> u32 {
    match qp {
        QpSel::Rc => 48,
        QpSel::Ud => 64,
        QpSel::Uc => 32,
    }
}

/// RC requester caps: 16 WRs of up to 4 SGEs or 140 inline bytes -> 192 B WQEs, 64 WQEBBs.
pub const RC_CAPS: Caps = Caps {
    max_send_wr: 16,
    max_send_sge: 4,
    max_inline_data: 120,
    max_recv_wr: 512,
};

/// UC requester caps: 12 WRs of up to 3 SGEs or 92 inline bytes -> 128 B WQEs, 32 WQEBBs.
pub const UC_CAPS: Caps = Caps {
    max_send_wr: 12,
    max_send_sge: 3,
    max_inline_data: 40,
    max_recv_wr: 512,
};

/// UD requester caps: 16 WRs of up to 2 SGEs or 60 inline bytes -> 128 B WQEs, 32 WQEBBs.
pub const UD_CAPS: Caps = Caps {
    max_send_wr: 16,
    max_send_sge: 2,
    max_inline_data: 60,
    max_recv_wr: 512,
};

/// One send work request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wr {
    /// The sending QP.
    pub qp: QpSel,
    /// `enum ibv_wr_opcode`.
    pub opcode: u32,
    /// `enum ibv_send_flags`.
    pub flags: u32,
    /// Immediate data as a number (stored big-endian: `imm_data = htobe32(imm)`), or the rkey
    /// to invalidate for SEND_WITH_INV (`invalidate_rkey = imm`).
    pub imm: u32,
    /// Remote address as an offset into the buffer (WRITE/READ/atomics).
    pub remote_off: u64,
    /// Compare operand (CMP_AND_SWP).
    pub compare: u64,
    /// Swap (CMP_AND_SWP) or add (FETCH_AND_ADD) operand.
    pub swap_add: u64,
    /// Gather list: (offset into the buffer, length).
    pub sges: Vec<(u64, u32)>,
}

impl Wr {
    /// The WQE size in 16-byte units libmlx5 builds for this WR (docs/datapath.md §1.10):
    /// ctrl, UD address vector, raddr, atomic, then one inline segment (none for 0 bytes) or
    /// one data segment per non-empty SGE.
    pub fn ds(&self) -> u32 {
        let mut ds = 1;
        if self.qp == QpSel::Ud {
            ds += 3;
        }
        let atomic = matches!(
            self.opcode,
            op::ATOMIC_CMP_AND_SWP | op::ATOMIC_FETCH_AND_ADD
        );
        if atomic
            || matches!(
                self.opcode,
                op::RDMA_WRITE | op::RDMA_WRITE_WITH_IMM | op::RDMA_READ
            )
        {
            ds += 1;
        }
        if atomic {
            ds += 1;
        }
        let total: u32 = self.sges.iter().map(|s| s.1).sum();
        if self.has(flag::INLINE) && !atomic && self.opcode != op::RDMA_READ {
            if total > 0 {
                ds += (4 + total).div_ceil(16);
            }
        } else {
            ds += self.sges.iter().filter(|s| s.1 > 0).count() as u32;
        }
        ds
    }

    /// Whether the WR carries `flag`.
    pub fn has(&self, flag: u32) -> bool {
        self.flags & flag != 0
    }

    /// Whether the WR consumes a receive WQE at the responder.
    pub fn consumes_recv(&self) -> bool {
        matches!(
            self.opcode,
            op::SEND | op::SEND_WITH_IMM | op::SEND_WITH_INV | op::RDMA_WRITE_WITH_IMM
        )
    }

    /// One-line description for reports.
    pub fn describe(&self) -> String {
        let mut f = String::new();
        for (bit, name) in [
            (flag::SIGNALED, "sig"),
            (flag::FENCE, "fence"),
            (flag::SOLICITED, "se"),
            (flag::INLINE, "inline"),
        ] {
            if self.has(bit) {
                f.push_str(if f.is_empty() { "" } else { "|" });
                f.push_str(name);
            }
        }
        let lens: Vec<String> = self.sges.iter().map(|s| s.1.to_string()).collect();
        format!(
            "{} {} [{}] sges=[{}]",
            self.qp.name(),
            op::name(self.opcode),
            f,
            lens.join(",")
        )
    }
}

/// The whole corpus: posts (each one `ibv_post_send` call) in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Corpus {
    /// Each inner vector is one chain posted with one call.
    pub posts: Vec<Vec<Wr>>,
    /// Create the requester QPs with `sq_sig_all` (every WR gets a CQE; the CE bits of
    /// every WQE are set by the driver, whatever the WR's flags say).
    pub sq_sig_all: bool,
    /// On a RoCE port: the global route of the UD address handle and of the RC/UC paths
    /// (to the port's own GID at `sgid_index`); `None` on InfiniBand (LID routing).
    pub roce: Option<RoceRoute>,
}

/// The GRH fields both sides use on a RoCE port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoceRoute {
    /// Source GID index; the destination GID is the GID at this index (loopback).
    pub sgid_index: u8,
    /// Flow label. Non-zero, so that both drivers derive the same RoCE v2 UDP source port
    /// from it (with 0 libmlx5 draws a random port per AH).
    pub flow_label: u32,
    /// Service level (the Ethernet priority, AV `stat_rate_sl` bits 3:1).
    pub sl: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
}

impl RoceRoute {
    /// The emulated RoCE port's IPv4-mapped RoCE v2 GID (index 3).
    pub const V2: RoceRoute = RoceRoute {
        sgid_index: 3,
        flow_label: 0x5_A5A5,
        sl: 5,
        traffic_class: 0x20,
        hop_limit: 64,
    };
    /// The same address as RoCE v1 (index 2): no UDP header, `rlid` 0.
    pub const V1: RoceRoute = RoceRoute {
        sgid_index: 2,
        ..RoceRoute::V2
    };
}

/// Deterministic generator (xorshift64*).
#[derive(Debug)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[self.below(v.len() as u64) as usize]
    }
}

/// Inline sizes to cover for a QP whose maximum is `max`: 0, 1, every size where the inline
/// segment gains a 16-byte unit (12, 28, 44, ...) and one past it, and the maximum.
pub fn inline_sizes(max: u32) -> Vec<u32> {
    let mut v = vec![0, 1];
    let mut s = 12;
    while s <= max {
        v.push(s);
        if s < max {
            v.push(s + 1);
        }
        s += 16;
    }
    v.push(max);
    v.sort_unstable();
    v.dedup();
    v
}

/// Builder that keeps the signaled-WR rule: at most [`MAX_UNSIGNALED_RUN`] unsignaled WRs in
/// a row per QP, so the harness (which waits for every signaled WR) never fills the SQ.
#[derive(Debug)]
struct Builder {
    posts: Vec<Vec<Wr>>,
    unsignaled: [u32; 3],
    /// Free-running WQEBB producer counter per QP, as the drivers will advance it.
    cur_post: [u32; 3],
    rng: Rng,
}

/// Longest run of unsignaled WRs per QP.
pub const MAX_UNSIGNALED_RUN: u32 = 4;

impl Builder {
    fn post(&mut self, mut chain: Vec<Wr>) {
        for wr in &mut chain {
            let run = &mut self.unsignaled[wr.qp as usize];
            if wr.has(flag::SIGNALED) {
                *run = 0;
            } else if *run >= MAX_UNSIGNALED_RUN {
                wr.flags |= flag::SIGNALED;
                *run = 0;
            } else {
                *run += 1;
            }
            self.cur_post[wr.qp as usize] += wr.ds().div_ceil(4);
        }
        self.posts.push(chain);
    }

    /// Post 1-WQEBB SENDs on `qp` (RC: one SGE; UD: no SGE, ctrl + AV) until its next WQE
    /// starts `before_end` WQEBBs before the end of its ring of `ring` WQEBBs, then `wr`
    /// (which should be longer, so it wraps).
    fn wrap_with(&mut self, ring: u32, before_end: u32, wr: Wr) {
        let qp = wr.qp;
        for _ in 0..ring {
            if ring - self.cur_post[qp as usize] % ring == before_end {
                break;
            }
            let s = match qp {
                QpSel::Rc | QpSel::Uc => self.sges(1, &[8]),
                QpSel::Ud => Vec::new(),
            };
            let filler = self.wr(qp, op::SEND, 0, s);
            debug_assert_eq!(filler.ds().div_ceil(4), 1);
            self.post(vec![filler]);
        }
        self.post(vec![wr]);
    }

    /// A gather list of `n` SGEs with lengths from `lens`, at distinct source offsets.
    fn sges(&mut self, n: usize, lens: &[u32]) -> Vec<(u64, u32)> {
        (0..n)
            .map(|_| {
                let len = self.rng.pick(lens);
                let off = SRC_OFF + self.rng.below(0x3_0000);
                (off, len)
            })
            .collect()
    }

    fn wr(&mut self, qp: QpSel, opcode: u32, flags: u32, sges: Vec<(u64, u32)>) -> Wr {
        let imm = match opcode {
            op::SEND_WITH_IMM | op::RDMA_WRITE_WITH_IMM | op::SEND_WITH_INV => {
                self.rng.next() as u32
            }
            _ => 0,
        };
        let atomic = matches!(opcode, op::ATOMIC_CMP_AND_SWP | op::ATOMIC_FETCH_AND_ADD);
        let remote_off = if atomic {
            REMOTE_OFF + 8 * self.rng.below(0x1000)
        } else {
            REMOTE_OFF + self.rng.below(0x3_0000)
        };
        let (compare, swap_add) = if atomic {
            (self.rng.next(), self.rng.next())
        } else {
            (0, 0)
        };
        Wr {
            qp,
            opcode,
            flags,
            imm,
            remote_off,
            compare,
            swap_add,
            sges,
        }
    }

    /// An atomic's local result SGE.
    fn result_sge(&mut self, len: u32) -> Vec<(u64, u32)> {
        vec![(RESULT_OFF + 8 * self.rng.below(0x1000), len)]
    }

    /// READ destinations: like [`sges`](Self::sges) but in the result region.
    fn read_sges(&mut self, n: usize, lens: &[u32]) -> Vec<(u64, u32)> {
        self.sges(n, lens)
            .into_iter()
            .map(|(off, len)| (off - SRC_OFF + RESULT_OFF, len))
            .collect()
    }

    /// A random WR of `qp`.
    fn random(&mut self, qp: QpSel, max_inline: u32, max_sge: u32) -> Wr {
        let ops: &[u32] = match qp {
            QpSel::Rc => &[
                op::SEND,
                op::SEND_WITH_IMM,
                op::SEND_WITH_INV,
                op::RDMA_WRITE,
                op::RDMA_WRITE_WITH_IMM,
                op::RDMA_READ,
                op::ATOMIC_CMP_AND_SWP,
                op::ATOMIC_FETCH_AND_ADD,
            ],
            QpSel::Ud => &[op::SEND, op::SEND_WITH_IMM],
            // No SEND_WITH_INV: IB defines no invalidate opcodes for UC (both drivers build
            // the WQE; the device completes it with a local QP operation error).
            QpSel::Uc => &[
                op::SEND,
                op::SEND_WITH_IMM,
                op::RDMA_WRITE,
                op::RDMA_WRITE_WITH_IMM,
            ],
        };
        let opcode = self.rng.pick(ops);
        let mut flags = 0;
        for bit in [flag::SIGNALED, flag::FENCE, flag::SOLICITED] {
            if self.rng.below(3) == 0 {
                flags |= bit;
            }
        }
        match opcode {
            op::ATOMIC_CMP_AND_SWP | op::ATOMIC_FETCH_AND_ADD => {
                let s = self.result_sge(8);
                self.wr(qp, opcode, flags, s)
            }
            op::RDMA_READ => {
                let n = 1 + self.rng.below(u64::from(max_sge)) as usize;
                let s = self.read_sges(n, &[1, 8, 100, 512]);
                self.wr(qp, opcode, flags, s)
            }
            _ if self.rng.below(2) == 0 => {
                // Inline: 1..=min(3, max_sge) pieces (libmlx5 refuses more SGEs than
                // max_send_sge even for inline WRs) adding up to at most max_inline.
                let total = self.rng.below(u64::from(max_inline) + 1) as u32;
                let pieces = 1 + self.rng.below(u64::from(max_sge.min(3))) as u32;
                let mut s = Vec::new();
                let mut left = total;
                for i in 0..pieces {
                    let len = if i + 1 == pieces {
                        left
                    } else {
                        self.rng.below(u64::from(left) + 1) as u32
                    };
                    left -= len;
                    s.push((SRC_OFF + self.rng.below(0x3_0000), len));
                }
                self.wr(qp, opcode, flags | flag::INLINE, s)
            }
            _ => {
                let n = 1 + self.rng.below(u64::from(max_sge)) as usize;
                let s = self.sges(n, &[1, 3, 16, 64, 200, 512]);
                self.wr(qp, opcode, flags, s)
            }
        }
    }
}

impl Corpus {
    /// The standard corpus, for QPs with the inline limits of [`QpSel::geometry`] (both
    /// drivers must report them).
    pub fn standard() -> Corpus {
        let (_, rc_ring, rc_max_inline) = QpSel::Rc.geometry();
        let (_, ud_ring, ud_max_inline) = QpSel::Ud.geometry();
        let (_, uc_ring, uc_max_inline) = QpSel::Uc.geometry();
        let mut b = Builder {
            posts: Vec::new(),
            unsignaled: [0; 3],
            cur_post: [0; 3],
            rng: Rng(0x005E_ED0F_C0DE_2026),
        };
        let sig = flag::SIGNALED;
        let rc_sge = RC_CAPS.max_send_sge as usize;
        // 1. Every RC opcode with 1..=max SGEs, signaled, one WR per post.
        for opcode in [
            op::SEND,
            op::SEND_WITH_IMM,
            op::SEND_WITH_INV,
            op::RDMA_WRITE,
            op::RDMA_WRITE_WITH_IMM,
            op::RDMA_READ,
        ] {
            for n in 1..=rc_sge {
                let s = if opcode == op::RDMA_READ {
                    b.read_sges(n, &[1, 8, 100, 512])
                } else {
                    b.sges(n, &[1, 7, 64, 300])
                };
                let wr = b.wr(QpSel::Rc, opcode, sig, s);
                b.post(vec![wr]);
            }
        }
        // Atomics: exact 8-byte SGE, and a longer SGE (both drivers send byte_count 8).
        for opcode in [op::ATOMIC_CMP_AND_SWP, op::ATOMIC_FETCH_AND_ADD] {
            for len in [8, 16] {
                let s = b.result_sge(len);
                let wr = b.wr(QpSel::Rc, opcode, sig, s);
                b.post(vec![wr]);
            }
        }
        // A zero-length SGE in the middle of a gather list (skipped: 0 would mean 2 GiB).
        let s = vec![
            (SRC_OFF + 0x100, 32),
            (SRC_OFF + 0x200, 0),
            (SRC_OFF + 0x300, 5),
        ];
        let wr = b.wr(QpSel::Rc, op::SEND, sig, s);
        b.post(vec![wr]);
        // 2. Inline sizes 0..=max for every opcode that may carry inline data, split over one
        //    or several SGEs.
        for opcode in [
            op::SEND,
            op::SEND_WITH_IMM,
            op::SEND_WITH_INV,
            op::RDMA_WRITE,
            op::RDMA_WRITE_WITH_IMM,
        ] {
            for (i, size) in inline_sizes(rc_max_inline).into_iter().enumerate() {
                let s = if i % 3 == 2 && size >= 2 {
                    vec![
                        (SRC_OFF + 0x1000, size / 2),
                        (SRC_OFF + 0x2003, size - size / 2),
                    ]
                } else {
                    vec![(SRC_OFF + 0x10 * i as u64, size)]
                };
                let flags = flag::INLINE | if i % 2 == 0 { sig } else { 0 };
                let wr = b.wr(QpSel::Rc, opcode, flags, s);
                b.post(vec![wr]);
            }
        }
        // 3. Flag combinations on a few opcodes.
        for opcode in [op::SEND_WITH_IMM, op::RDMA_WRITE, op::RDMA_READ] {
            for flags in 0..8u32 {
                let f = ((flags & 1) * flag::FENCE)
                    | (((flags >> 1) & 1) * flag::SIGNALED)
                    | (((flags >> 2) & 1) * flag::SOLICITED);
                let s = if opcode == op::RDMA_READ {
                    b.read_sges(1, &[64])
                } else {
                    b.sges(1, &[24])
                };
                let wr = b.wr(QpSel::Rc, opcode, f, s);
                b.post(vec![wr]);
            }
        }
        // 4. Chains of 2..=4 WRs (one doorbell for the chain), then random single posts and
        //    chains until the ring has wrapped several times.
        for n in 2..=4 {
            let chain = (0..n)
                .map(|_| b.random(QpSel::Rc, rc_max_inline, RC_CAPS.max_send_sge))
                .collect();
            b.post(chain);
        }
        for i in 0..120 {
            let n = if i % 5 == 4 { 1 + (i % 3) } else { 1 };
            let chain = (0..n)
                .map(|_| b.random(QpSel::Rc, rc_max_inline, RC_CAPS.max_send_sge))
                .collect();
            b.post(chain);
        }
        // WQEs across the ring end, at every WQEBB boundary a long WQE can split on: inline
        // data split at the end (1, 2 WQEBBs before it), data segments split (the gather
        // list of a 2-WQEBB WQE starting in the last slot).
        for before_end in [1, 2] {
            let s = vec![(SRC_OFF + 0x777, rc_max_inline)];
            let wr = b.wr(QpSel::Rc, op::RDMA_WRITE, sig | flag::INLINE, s);
            b.wrap_with(rc_ring, before_end, wr);
        }
        let s = b.sges(rc_sge, &[5, 6, 7]);
        let wr = b.wr(QpSel::Rc, op::SEND_WITH_IMM, sig, s);
        b.wrap_with(rc_ring, 1, wr);
        // UD: both opcodes, 1..=max SGEs, every inline size, flags, chains, random.
        let ud_sge = UD_CAPS.max_send_sge as usize;
        for opcode in [op::SEND, op::SEND_WITH_IMM] {
            for n in 1..=ud_sge {
                let s = b.sges(n, &[1, 40, 256]);
                let wr = b.wr(QpSel::Ud, opcode, sig, s);
                b.post(vec![wr]);
            }
            for (i, size) in inline_sizes(ud_max_inline).into_iter().enumerate() {
                let s = vec![(SRC_OFF + 0x20 * i as u64, size)];
                let flags = flag::INLINE | if i % 2 == 0 { sig | flag::SOLICITED } else { 0 };
                let wr = b.wr(QpSel::Ud, opcode, flags, s);
                b.post(vec![wr]);
            }
        }
        for i in 0..60 {
            let n = if i % 4 == 3 { 2 + (i % 2) } else { 1 };
            let chain = (0..n)
                .map(|_| b.random(QpSel::Ud, ud_max_inline, UD_CAPS.max_send_sge))
                .collect();
            b.post(chain);
        }
        // UD WQEs across the ring end: the AV fills the first WQEBB, the payload (inline or
        // gather list) starts at the ring start.
        let s = vec![(SRC_OFF + 0x999, ud_max_inline)];
        let wr = b.wr(QpSel::Ud, op::SEND_WITH_IMM, sig | flag::INLINE, s);
        b.wrap_with(ud_ring, 1, wr);
        let s = b.sges(ud_sge, &[9, 10]);
        let wr = b.wr(QpSel::Ud, op::SEND, sig, s);
        b.wrap_with(ud_ring, 1, wr);
        // UC: every UC opcode with 1..=max SGEs and every inline size, random WRs and
        // chains, WQEs across the ring end.
        let uc_sge = UC_CAPS.max_send_sge as usize;
        for opcode in [
            op::SEND,
            op::SEND_WITH_IMM,
            op::RDMA_WRITE,
            op::RDMA_WRITE_WITH_IMM,
        ] {
            for n in 1..=uc_sge {
                let s = b.sges(n, &[1, 7, 64, 300]);
                let wr = b.wr(QpSel::Uc, opcode, sig, s);
                b.post(vec![wr]);
            }
            for (i, size) in inline_sizes(uc_max_inline).into_iter().enumerate() {
                let s = vec![(SRC_OFF + 0x30 * i as u64, size)];
                let flags = flag::INLINE | if i % 2 == 1 { sig } else { 0 };
                let wr = b.wr(QpSel::Uc, opcode, flags, s);
                b.post(vec![wr]);
            }
        }
        for i in 0..60 {
            let n = if i % 4 == 2 { 2 + (i % 3) } else { 1 };
            let chain = (0..n)
                .map(|_| b.random(QpSel::Uc, uc_max_inline, UC_CAPS.max_send_sge))
                .collect();
            b.post(chain);
        }
        let s = vec![(SRC_OFF + 0xabc, uc_max_inline)];
        let wr = b.wr(QpSel::Uc, op::RDMA_WRITE_WITH_IMM, sig | flag::INLINE, s);
        b.wrap_with(uc_ring, 1, wr);
        let s = b.sges(uc_sge, &[11, 12]);
        let wr = b.wr(QpSel::Uc, op::RDMA_WRITE, sig, s);
        b.wrap_with(uc_ring, 1, wr);
        // Finish each QP with a signaled WR, so every WQE is known executed at the end.
        for qp in QpSel::ALL {
            let s = b.sges(1, &[4]);
            let wr = b.wr(qp, op::SEND, sig, s);
            b.post(vec![wr]);
        }
        Corpus {
            posts: b.posts,
            sq_sig_all: false,
            roce: None,
        }
    }

    /// All WRs of `qp`, in posting order.
    pub fn wrs(&self, qp: QpSel) -> Vec<&Wr> {
        self.posts.iter().flatten().filter(|w| w.qp == qp).collect()
    }

    /// How many completions the requester reports for `post` (all its WRs with
    /// `sq_sig_all`, else the signaled ones).
    pub fn completions(&self, post: &[Wr]) -> usize {
        if self.sq_sig_all {
            post.len()
        } else {
            post.iter().filter(|w| w.has(flag::SIGNALED)).count()
        }
    }

    /// How many receives the responder of `qp` needs.
    pub fn recvs_needed(&self, qp: QpSel) -> u32 {
        self.wrs(qp).iter().filter(|w| w.consumes_recv()).count() as u32
    }

    /// The text form the C harness reads (see the module docs).
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "buf {BUF_VA:#x} {BUF_LEN:#x}");
        let _ = writeln!(s, "src {SRC_OFF:#x} {:#x}", REMOTE_OFF - SRC_OFF);
        for qp in QpSel::ALL {
            let c = qp.caps();
            let _ = writeln!(
                s,
                "caps {} {} {} {} {}",
                qp.name(),
                c.max_send_wr,
                c.max_send_sge,
                c.max_inline_data,
                c.max_recv_wr
            );
        }
        for qp in QpSel::ALL {
            let _ = writeln!(
                s,
                "recv {} {} {:#x} {RECV_LEN:#x}",
                qp.name(),
                self.recvs_needed(qp),
                qp.recv_off()
            );
        }
        let _ = writeln!(s, "qkey {QKEY:#x}");
        let _ = writeln!(s, "sigall {}", u8::from(self.sq_sig_all));
        if let Some(r) = self.roce {
            let _ = writeln!(
                s,
                "roce {} {:#x} {} {:#x} {}",
                r.sgid_index, r.flow_label, r.sl, r.traffic_class, r.hop_limit
            );
        }
        for p in &self.posts {
            let _ = writeln!(s, "post {}", p.len());
            for w in p {
                let _ = write!(
                    s,
                    "wr {} {} {:#x} {:#x} {:#x} {:#x} {:#x} {}",
                    w.qp.name(),
                    w.opcode,
                    w.flags,
                    w.imm,
                    w.remote_off,
                    w.compare,
                    w.swap_add,
                    w.sges.len()
                );
                for (off, len) in &w.sges {
                    let _ = write!(s, " {off:#x}:{len}");
                }
                s.push('\n');
            }
        }
        s.push_str("end\n");
        s
    }
}

/// The byte at offset `i` of the source region (both sides fill it the same way; the C
/// harness has the same formula in `src_byte()`).
pub fn src_byte(i: u64) -> u8 {
    (i.wrapping_mul(131) ^ (i >> 8)) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_matches_the_reference_examples() {
        // docs/datapath.md §2.2: UD, 1 SGE, no inline: align64(64 + 16) = 128 B, inline 60.
        let ud = Caps {
            max_send_wr: 1,
            max_send_sge: 1,
            max_inline_data: 0,
            max_recv_wr: 1,
        };
        assert_eq!(ud.geometry(64), (128, 2, 60));
        // Default RC (192 B overhead), 1 SGE: 256 B, inline 60.
        assert_eq!(ud.geometry(192), (256, 4, 60));
        assert_eq!(RC_CAPS.geometry(overhead(QpSel::Rc)), (192, 64, 140));
        assert_eq!(UD_CAPS.geometry(overhead(QpSel::Ud)), (128, 32, 60));
        assert_eq!(QpSel::Uc.geometry(), (128, 32, 92));
    }

    #[test]
    fn ds_follows_the_reference_examples() {
        // docs/datapath.md §1.10 worked examples.
        let wr = |qp, opcode, flags, sges: Vec<(u64, u32)>| Wr {
            qp,
            opcode,
            flags,
            imm: 0,
            remote_off: 0,
            compare: 0,
            swap_add: 0,
            sges,
        };
        assert_eq!(wr(QpSel::Rc, op::SEND, 0, vec![(0, 1)]).ds(), 2);
        assert_eq!(wr(QpSel::Rc, op::RDMA_WRITE, 0, vec![(0, 1); 3]).ds(), 5);
        assert_eq!(
            wr(QpSel::Rc, op::SEND, flag::INLINE, vec![(0, 100)]).ds(),
            8
        );
        assert_eq!(wr(QpSel::Ud, op::SEND, flag::INLINE, vec![(0, 20)]).ds(), 6);
        assert_eq!(
            wr(QpSel::Rc, op::ATOMIC_FETCH_AND_ADD, 0, vec![(0, 16)]).ds(),
            4
        );
        // Zero-length inline: no segment; zero-length SGE: skipped.
        assert_eq!(wr(QpSel::Rc, op::SEND, flag::INLINE, vec![(0, 0)]).ds(), 1);
        assert_eq!(wr(QpSel::Rc, op::SEND, 0, vec![(0, 4), (0, 0)]).ds(), 2);
    }

    #[test]
    fn inline_sizes_cover_boundaries() {
        assert_eq!(inline_sizes(60), [0, 1, 12, 13, 28, 29, 44, 45, 60]);
        let v = inline_sizes(140);
        assert_eq!((v[0], *v.last().unwrap()), (0, 140));
        assert!(v.contains(&124) && v.contains(&125));
    }

    #[test]
    fn corpus_keeps_the_rules() {
        let c = Corpus::standard();
        for qp in QpSel::ALL {
            let wrs = c.wrs(qp);
            assert!(wrs.len() > 50, "{qp:?}: {}", wrs.len());
            let mut run = 0;
            for w in &wrs {
                run = if w.has(flag::SIGNALED) { 0 } else { run + 1 };
                assert!(run <= MAX_UNSIGNALED_RUN);
                let total: u32 = w.sges.iter().map(|s| s.1).sum();
                if w.has(flag::INLINE) {
                    assert!(total <= qp.geometry().2);
                }
                for (off, len) in &w.sges {
                    assert!(off + u64::from(*len) <= BUF_LEN);
                }
                assert!(
                    w.sges.len() <= qp.caps().max_send_sge as usize,
                    "{}",
                    w.describe()
                );
            }
            assert!(wrs.last().unwrap().has(flag::SIGNALED));
            assert!(c.recvs_needed(qp) <= qp.caps().max_recv_wr);
        }
        // Every opcode appears; the text form has one line per WR.
        let rc = c.wrs(QpSel::Rc);
        for o in [0, 1, 2, 3, 4, 5, 6, 9] {
            assert!(rc.iter().any(|w| w.opcode == o), "opcode {o}");
        }
        // The ring-end WQEs are where they were meant to be.
        for qp in QpSel::ALL {
            let ring = qp.geometry().1;
            let mut cur = 0u32;
            let mut wrapped = 0;
            for w in c.wrs(qp) {
                let bbs = w.ds().div_ceil(4);
                if cur % ring + bbs > ring {
                    wrapped += 1;
                }
                cur += bbs;
            }
            assert!(wrapped >= 2, "{qp:?}: {wrapped} WQEs wrap");
        }
        let text = c.to_text();
        let n = c.posts.iter().map(Vec::len).sum::<usize>();
        assert_eq!(text.lines().filter(|l| l.starts_with("wr ")).count(), n);
        assert!(text.ends_with("end\n"));
    }
}
