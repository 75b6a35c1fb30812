//! Completion queues: creation, polling into caller-provided work completions, consumer-index
//! publication, arming and blocking waits on a completion channel.
//!
//! # Ownership rule
//! The CQE at consumer index `ci` belongs to software once its opcode is not INVALID and its
//! owner bit equals `(ci >> log2(ncqe)) & 1`; until the consumer index is published in the CQ
//! doorbell record, the device will not overwrite consumed entries.
//!
//! One consumer per ring: a CQ is polled either through [`Cq`] (verbs-shaped) or through
//! [`RawCq`] (low-level), made from it by value; the ring's reader moves between them.
//!
//! # Ordering rule
//! Read `op_own` once; if owned, `from_device()`, then copy the whole descriptor out; after the
//! batch, `loads_before_release()` and publish CI (record word 0). Arming writes record word 1,
//! then `wc_start()`, one 64-bit MMIO store to UAR + 0x20, `wc_flush()`.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use mlx5_ffi::mlx5::{MLX5_IB_CREATE_CQ_FLAGS_UAR_PAGE_INDEX, Mlx5IbCreateCq};
use mlx5_ffi::uverbs::{IbUverbsCreateCq, IbUverbsDestroyCq};
use mlx5_hw::cqe::{
    CQE_FORMAT_SCATTER_32, CQE_FORMAT_SCATTER_64, Cqe64, ErrCqe, INLINE_SCATTER_32,
    INLINE_SCATTER_64,
};
use mlx5_hw::doorbell::{cq_arm_doorbell, cq_arm_word};
use mlx5_hw::opcodes::{CqeOpcode, SendOpcode, Syndrome, WcStatus};
use zerocopy::IntoBytes;

use crate::context::{CompChannel, Context, UarMode};
use crate::error::{Error, Result};
use crate::ledger::{REQ_WC_BY_SEND_OP, RqShared, SqShared, SrqShared};
use crate::mem::scatter::MrCache;
use crate::mem::uar::UarReg;
use crate::mem::{CqBuf, CqeReader, DbRec, TakenCqe};
use crate::mmio::barrier;
use crate::recorder::{self, CqPart, CqRecorder, QpPart, QpRecorder, RecorderConfig};
use crate::uverbs;
use crate::wr::{WcFlags, WcOpcode, WorkCompletion};
use mlx5_ffi::cmd::cmds;

/// CQ creation attributes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CqInit {
    /// Minimum number of CQEs (rounded up to a power of two minus one, as libmlx5).
    pub cqe: u32,
    /// 64 or 128-byte CQEs.
    pub cqe_size: u32,
    /// Completion vector.
    pub comp_vector: u32,
}

impl Default for CqInit {
    fn default() -> Self {
        Self {
            cqe: 256,
            cqe_size: 64,
            comp_vector: 0,
        }
    }
}

/// The [`CqUser::qpn`] of an SRQ route ([`CqShared::route_srq`]): no QP number (they are 24
/// bits), so no detach matches it; its completions name the CQE's QPN.
const ROUTED: u32 = u32::MAX;

/// One QP (or SRQ) whose completions land in a CQ.
#[derive(Clone, Debug)]
pub(crate) struct CqUser {
    pub qpn: u32,
    pub uidx: u32,
    pub sq: Option<Arc<SqShared>>,
    pub rq: Option<Arc<RqShared>>,
    pub srq: Option<Arc<SrqShared>>,
    /// CQEs of this queue written before it was attached or last reset: those at CQ positions
    /// before [`Fence::pos`] belong to an earlier life of the QP (or of its QPN or user index)
    /// and complete nothing ([`CqShared::fence`]).
    pub fence: Option<Fence>,
}

/// Where an earlier life of a CQ user ends in the CQ ring: its CQEs are all before `pos`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fence {
    /// The first CQ position (24 bits, as the consumer index is published) the device had not
    /// written when the fence was set.
    pub pos: u32,
    /// The list generation that set it (a poller takes only fences newer than its last copy).
    pub generation: u64,
}

pub(crate) struct CqShared {
    pub(crate) ctx: Context,
    handle: u32,
    pub(crate) cqn: u32,
    user_handle: u64,
    /// The ring's memory (its reader holds the mapping too).
    _buf: CqBuf,
    dbrec: DbRec,
    arm_reg: UarReg,
    users: Mutex<Vec<CqUser>>,
    generation: AtomicU64,
    events_acked: AtomicU32,
    _channel: Option<Arc<CompChannel>>,
    /// The flight recorder, once enabled (the pollers then decode every CQE out of line).
    rec: OnceLock<Arc<CqRecorder>>,
    /// log2 of the number of entries, and the entry size in bytes (for [`fence`](Self::fence)).
    log_n: u8,
    stride: usize,
}

impl core::fmt::Debug for CqShared {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CqShared")
            .field("cqn", &self.cqn)
            .finish_non_exhaustive()
    }
}

impl CqShared {
    /// The kernel's handle of this CQ.
    pub(crate) fn handle_id(&self) -> u32 {
        self.handle
    }

    /// Attach a queue: any CQE already in the ring under its QPN or user index (of a destroyed
    /// QP that had them) is fenced off.
    pub(crate) fn attach(&self, mut user: CqUser) {
        let mut u = self.users.lock().unwrap_or_else(|p| p.into_inner());
        let g = self.generation.load(Ordering::Relaxed) + 1;
        user.fence = Some(Fence {
            pos: self.written_end(),
            generation: g,
        });
        u.retain(|x| !(x.qpn == user.qpn && x.uidx == user.uidx));
        u.push(user);
        self.generation.store(g, Ordering::Release);
    }

    /// QP `qpn` was reset: every CQE of it the device wrote so far belongs to its old life
    /// (the kernel's modify to RESET returned, so the device writes no more of them), and must
    /// complete nothing of the new one (its WRs reuse the WQEBB counters from 0). As libmlx5's
    /// CQ clean, without rewriting the ring behind its lock-free poller: the poller drops the
    /// QP's CQEs before the fence when it reaches them (receive CQEs of an SRQ stay: the SRQ's
    /// WQEs were consumed and are not reset).
    pub(crate) fn fence(&self, qpn: u32) {
        let mut u = self.users.lock().unwrap_or_else(|p| p.into_inner());
        let g = self.generation.load(Ordering::Relaxed) + 1;
        let pos = self.written_end();
        for x in u.iter_mut().filter(|x| x.qpn == qpn) {
            x.fence = Some(Fence { pos, generation: g });
        }
        self.generation.store(g, Ordering::Release);
    }

    /// The first CQ position from the published consumer index on that the device has not
    /// written (24 bits): the ownership test of each entry, read-only (the poller and the
    /// device may run meanwhile; entries they add come after it).
    fn written_end(&self) -> u32 {
        let ci = self.dbrec.word0().load_be32() & 0xFF_FFFF;
        let n = 1u32 << self.log_n;
        for i in 0..n {
            let pos = ci.wrapping_add(i);
            let slot = (pos & (n - 1)) as usize;
            let mut b = [0u8];
            self._buf
                .read_byte(slot * self.stride + self.stride - 1, &mut b);
            let owned = b[0] >> 4 != 0xF && u32::from(b[0] & 1) == (pos >> self.log_n) & 1;
            if !owned {
                return pos & 0xFF_FFFF;
            }
        }
        ci.wrapping_add(n) & 0xFF_FFFF
    }

    /// This CQ's part of a flight-recorder dump, if it records.
    pub(crate) fn recorder_part(&self) -> Option<CqPart<'_>> {
        Some(CqPart {
            rec: self.rec.get()?,
            cqn: self.cqn,
            dbrec_ci: self.dbrec.word0().load_be32(),
        })
    }

    /// Route the receive CQEs that name `key` as their user index to `srq`: CQEs of QPs this
    /// CQ does not know (an XRC target QP of another process, a DCT), which with CQE version 1
    /// carry the SRQ's user index in `srqn_uidx`. Their wr_id comes from the SRQ, their WQE is
    /// freed in it, and the work completion names the CQE's QPN. A route is an entry of the
    /// table the poller already looks every CQE up in, so it costs the other CQEs nothing.
    /// Replaces an earlier route of `key`.
    ///
    /// # Errors
    /// [`Error::Unsupported`] on a context with CQE version 0, whose CQEs are looked up by QPN
    /// (attach the target QP itself there).
    pub(crate) fn route_srq(&self, key: u32, srq: Arc<SrqShared>) -> Result<()> {
        if self.ctx.cqe_version() != 1 {
            return Err(Error::Unsupported {
                what: "SRQ routes of a CQ need CQE version 1 (CQEs found by user index)",
            });
        }
        let mut u = self.users.lock().unwrap_or_else(|p| p.into_inner());
        u.retain(|x| !(x.qpn == ROUTED && x.uidx == key));
        u.push(CqUser {
            qpn: ROUTED,
            uidx: key,
            sq: None,
            rq: None,
            srq: Some(srq),
            fence: None,
        });
        self.generation.fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// Forget the route of `key` ([`route_srq`](Self::route_srq)).
    pub(crate) fn unroute_srq(&self, key: u32) {
        let mut u = self.users.lock().unwrap_or_else(|p| p.into_inner());
        u.retain(|x| !(x.qpn == ROUTED && x.uidx == key));
        self.generation.fetch_add(1, Ordering::Release);
    }

    pub(crate) fn detach(&self, qpn: u32) {
        let mut u = self.users.lock().unwrap_or_else(|p| p.into_inner());
        u.retain(|x| x.qpn != qpn);
        self.generation.fetch_add(1, Ordering::Release);
    }
}

impl Drop for CqShared {
    fn drop(&mut self) {
        let cmd = IbUverbsDestroyCq {
            response: 0,
            cq_handle: self.handle,
            reserved: 0,
        };
        if !self.ctx.destroy::<cmds::DestroyCq>(&cmd) {
            // The CQ may live on in the kernel and the device may still write CQEs into the
            // ring: never give it back (the record is only read by the device).
            self._buf.leak();
        }
    }
}

#[derive(Debug)]
struct Pending {
    sq: Arc<SqShared>,
    /// The WR to report next, the signaled one that follows them, its completion.
    next: u32,
    end: u32,
    last: WorkCompletion,
    /// The WQEBB counter where WR `next` starts (`None` if its record was not found).
    at: Option<u32>,
}

/// The QPs of a CQ as its poller sees them: a copy of the shared list, found by CQE user index
/// (CQE version 1) or QPN through an open-addressed index, behind a last-hit cache. Reloaded
/// (under the shared list's lock) only when a QP was attached or detached.
#[derive(Debug, Default)]
struct Users {
    list: Vec<CqUser>,
    /// `slots[h]` is 1 + the position in `list` of the user whose key probes to `h` (0: empty).
    slots: Box<[u32]>,
    /// The key of each entry of `list` (user index or QPN).
    keys: Vec<u32>,
    /// Position of the last user found.
    last: usize,
    seen_gen: u64,
    /// Keys are CQE user indices (CQE version 1), else QPNs.
    by_uidx: bool,
    /// Where the key is in a CQE: [`UIDX_AT`] or [`QPN_AT`].
    key_at: u8,
    /// How many times the list was copied (under the shared list's lock).
    reloads: u64,
    /// Fences still ahead of the consumer index: (CQE key, position). While any is, every CQE
    /// is checked against them ([`stale`](Self::stale)).
    fences: Vec<(u32, u32)>,
    /// The ring's entry count (a fence is ahead while within one ring of the consumer index).
    ncqe: u32,
}

impl Users {
    /// The user whose key is `key`: the last one found, else by index.
    #[inline(always)]
    fn find(&mut self, key: u32) -> Option<&CqUser> {
        let i = if self.keys.get(self.last) == Some(&key) {
            self.last
        } else {
            self.probe(key)?
        };
        self.last = i;
        self.list.get(i)
    }

    /// The position of `key` through the index (linear probing in a table at most half full).
    #[inline(never)]
    fn probe(&self, key: u32) -> Option<usize> {
        let mask = self.slots.len().checked_sub(1)?;
        let mut h = key as usize & mask;
        loop {
            let s = *self.slots.get(h)?;
            let i = (s as usize).checked_sub(1)?;
            if self.keys.get(i) == Some(&key) {
                return Some(i);
            }
            h = (h + 1) & mask;
        }
    }

    /// Whether the CQE at consumer index `ci` with key `key` and `op_own` byte is of an
    /// earlier life of its queue ([`CqShared::fence`]); drops the fences the index passed.
    #[cold]
    #[inline(never)]
    fn stale(&mut self, key: u32, ci: u32, op_own: u8) -> bool {
        let ci = ci & 0xFF_FFFF;
        let n = self.ncqe;
        // A fence is ahead while the consumer index is before it (within one ring).
        self.fences
            .retain(|&(_, pos)| (1..=n).contains(&(pos.wrapping_sub(ci) & 0xFF_FFFF)));
        if !self.fences.iter().any(|&(k, _)| k == key) {
            return false;
        }
        // Receive CQEs through an SRQ stay: its WQEs were consumed and are not reset.
        let resp = matches!(op_own >> 4, 1..=4 | 14);
        !(resp && self.find(key).is_some_and(|u| u.srq.is_some()))
    }

    /// Copy the shared list and build the index (the cold path: after an attach or detach).
    fn reload(&mut self, list: &[CqUser], g: u64) {
        // Fences set since the last copy (every one, for the first).
        let seen = self.seen_gen;
        for u in list {
            if let Some(f) = u.fence
                && (seen == u64::MAX || f.generation > seen)
            {
                let key = if self.by_uidx { u.uidx } else { u.qpn };
                self.fences.retain(|&(k, _)| k != key);
                self.fences.push((key, f.pos));
            }
        }
        let by_uidx = self.by_uidx;
        self.key_at = if by_uidx { UIDX_AT } else { QPN_AT };
        self.reloads += 1;
        self.list = list.to_vec();
        self.keys = list
            .iter()
            .map(|u| if by_uidx { u.uidx } else { u.qpn })
            .collect();
        let n = (2 * list.len()).max(2).next_power_of_two();
        let mut slots = vec![0u32; n];
        for (i, &k) in self.keys.iter().enumerate() {
            let mut h = k as usize & (n - 1);
            while slots[h] != 0 {
                h = (h + 1) & (n - 1);
            }
            slots[h] = i as u32 + 1;
        }
        self.slots = slots.into_boxed_slice();
        self.last = 0;
        self.seen_gen = g;
    }
}

/// What both pollers of a CQ keep: the ring's one reader (consumer index), the QP table, the
/// memory-region cache for scatter-to-CQE copies, and the arm sequence number.
#[derive(Debug)]
struct Core {
    ring: CqeReader,
    shared: Arc<CqShared>,
    users: Users,
    mr_cache: MrCache,
    arm_sn: u32,
    cqe_count: u32,
}

impl Core {
    /// Take a fresh copy of the QP list if a QP was attached or detached since the last poll.
    #[inline(always)]
    fn refresh(&mut self) {
        let g = self.shared.generation.load(Ordering::Acquire);
        if g != self.users.seen_gen {
            self.reload_users(g);
        }
    }

    #[cold]
    #[inline(never)]
    fn reload_users(&mut self, g: u64) {
        let u = self.shared.users.lock().unwrap_or_else(|p| p.into_inner());
        self.users.reload(&u, g);
    }

    fn locks_taken(&self) -> u64 {
        self.users.reloads + self.mr_cache.misses
    }

    #[inline]
    fn publish_ci(&mut self) {
        self.ring.publish();
    }

    fn enable_recorder(&mut self, cfg: &RecorderConfig) -> Result<()> {
        let size = if self.ring.wide() { 128 } else { 64 };
        let rec = Arc::new(CqRecorder::new(
            cfg,
            size,
            self.ring.geometry(),
            self.ring.ci(),
        ));
        self.shared
            .rec
            .set(rec)
            .map_err(|_| Error::InvalidArgument {
                attr: "recorder",
                reason: "the CQ already has a flight recorder",
            })?;
        self.ring.mark(REC_FORCE);
        Ok(())
    }

    fn recorder_dump(&self) -> Option<String> {
        let part = self.shared.recorder_part()?;
        Some(recorder::dump_text("on demand", &[], &[part]))
    }

    fn req_notify(&mut self, solicited_only: bool) {
        // The device compares the armed consumer index with the published one.
        self.publish_ci();
        let ci = self.ring.ci();
        let word = cq_arm_word((self.arm_sn & 3) as u8, solicited_only, ci & 0xFF_FFFF);
        self.shared.dbrec.word1().store_be32(word);
        barrier::wc_start();
        self.shared
            .arm_reg
            .mmio()
            .store_raw64(0, cq_arm_doorbell(word, self.shared.cqn));
        barrier::wc_flush();
    }

    fn event_received(&mut self) {
        self.arm_sn = self.arm_sn.wrapping_add(1);
        self.shared.events_acked.fetch_add(1, Ordering::Relaxed);
    }

    fn wait(&mut self, channel: &CompChannel, timeout_ms: i32) -> Result<bool> {
        let own = self.shared._channel.as_ref();
        if !own.is_some_and(|c| core::ptr::eq(&**c, channel)) {
            return Err(Error::InvalidArgument {
                attr: "channel",
                reason: "not the completion channel this CQ was created with",
            });
        }
        match channel.get_event(timeout_ms)? {
            None => Ok(false),
            Some(h) if h == self.shared.user_handle => {
                self.event_received();
                Ok(true)
            }
            Some(_) => Err(Error::BadResponse {
                cmd: "completion event",
                what: "event for another CQ",
            }),
        }
    }
}

/// A completion queue, polled through the verbs-shaped API ([`poll`](Self::poll) into work
/// completions). Polling takes `&mut self`: one poller per CQ; `Send`, not `Sync`. For the
/// low-level poller, convert it by value with [`into_raw`](Self::into_raw): a CQ is polled
/// through one or the other, never both.
#[derive(Debug)]
pub struct Cq {
    core: Core,
    pending: Option<Pending>,
    /// One poller per CQ: `Send`, not `Sync`.
    _not_sync: core::marker::PhantomData<core::cell::Cell<()>>,
}

impl Cq {
    /// Create a CQ, optionally bound to a completion channel.
    ///
    /// # Errors
    /// [`Error::ContextMismatch`] for a channel of another context, [`Error::Limit`] naming
    /// `cqe` or [`Error::InvalidArgument`] naming `cqe_size` before any syscall;
    /// [`Error::Uverbs`] naming CREATE_CQ.
    pub fn new(ctx: &Context, init: CqInit, channel: Option<&Arc<CompChannel>>) -> Result<Self> {
        if let Some(ch) = channel {
            ctx.check_same("comp_channel", ch.context(), "context")?;
        }
        if init.cqe_size != 64 && init.cqe_size != 128 {
            return Err(Error::InvalidArgument {
                attr: "cqe_size",
                reason: "must be 64 or 128",
            });
        }
        let max = ctx.inner.attr.raw.max_cqe.min((1 << 24) - 1);
        Error::check_limit(
            "cqe",
            init.cqe.into(),
            max.into(),
            "of the device (max_cqe)",
        )?;
        if init.comp_vector >= ctx.num_comp_vectors().max(1) {
            return Err(Error::Limit {
                attr: "comp_vector",
                value: init.comp_vector.into(),
                limit: u64::from(ctx.num_comp_vectors().max(1) - 1),
                context: "of the device",
            });
        }
        let ncqe = (init.cqe + 1).next_power_of_two();
        let dbrec = ctx.inner.dbrecs.alloc()?;
        let (buf, ring) = CqBuf::new(ncqe, init.cqe_size as usize, &dbrec)?;
        let mut drv = Mlx5IbCreateCq {
            buf_addr: buf.addr(),
            db_addr: dbrec.addr(),
            cqe_size: init.cqe_size,
            ..Mlx5IbCreateCq::default()
        };
        if ctx.inner.mode == UarMode::Dynamic {
            let id = u16::try_from(ctx.inner.cq_uar.page_id).map_err(|_| Error::Unsupported {
                what: "UAR page ids above 65535 for CQs",
            })?;
            drv.flags |= MLX5_IB_CREATE_CQ_FLAGS_UAR_PAGE_INDEX;
            drv.uar_page_index = id;
        }
        let user_handle = crate::context::next_user_handle();
        let cmd = IbUverbsCreateCq {
            response: 0,
            user_handle,
            cqe: ncqe - 1,
            comp_vector: init.comp_vector,
            comp_channel: channel.map_or(-1, |c| std::os::fd::AsRawFd::as_raw_fd(&c.fd)),
            reserved: 0,
        };
        let (core, m) = uverbs::write::<cmds::CreateCq>(ctx.surface(), &cmd, &drv)?;
        let shared = Arc::new(CqShared {
            ctx: ctx.clone(),
            handle: core.cq_handle,
            cqn: m.cqn,
            user_handle,
            _buf: buf,
            dbrec,
            arm_reg: ctx.inner.cq_uar.cq_doorbell(),
            users: Mutex::new(Vec::new()),
            generation: AtomicU64::new(0),
            events_acked: AtomicU32::new(0),
            _channel: channel.cloned(),
            rec: OnceLock::new(),
            log_n: ncqe.trailing_zeros() as u8,
            stride: init.cqe_size as usize,
        });
        Ok(Self {
            core: Core {
                ring,
                shared,
                users: Users {
                    seen_gen: u64::MAX,
                    by_uidx: ctx.cqe_version() == 1,
                    ncqe,
                    ..Users::default()
                },
                mr_cache: MrCache::default(),
                arm_sn: 0,
                cqe_count: ncqe,
            },
            pending: None,
            _not_sync: core::marker::PhantomData,
        })
    }

    pub(crate) fn shared(&self) -> &Arc<CqShared> {
        &self.core.shared
    }

    /// CQ number.
    pub fn cqn(&self) -> u32 {
        self.core.shared.cqn
    }

    /// Number of CQEs the ring holds (a power of two; `ibv_cq.cqe` is this minus one).
    pub fn capacity(&self) -> u32 {
        self.core.cqe_count
    }

    /// The handle completion events carry for this CQ.
    pub fn user_handle(&self) -> u64 {
        self.core.shared.user_handle
    }

    /// The free-running consumer index.
    pub fn consumer_index(&self) -> u32 {
        self.core.ring.ci()
    }

    /// How many times this poller took a lock: to copy the QP list after a QP was created or
    /// destroyed on the CQ, and to look a memory region up when a scatter-to-CQE copy missed
    /// the poller's last-hit cache. Constant in steady state (no lock on the fast path).
    pub fn locks_taken(&self) -> u64 {
        self.core.locks_taken()
    }

    /// Turn the flight recorder on for this CQ: it keeps the last `cfg.records` CQEs polled,
    /// and an error CQE (flush errors aside) produces a dump (format in
    /// `docs/flight-recorder.md`) with them and the WQEs of its QP if that QP records too
    /// ([`Qp::enable_recorder`](crate::Qp::enable_recorder)), written to `cfg.dir` (or
    /// `MLX5_RECORDER_DIR`) and handed to `cfg.callback`. Off by default; costs one
    /// instruction per CQE while off.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming `recorder` if it is already on.
    pub fn enable_recorder(&mut self, cfg: &RecorderConfig) -> Result<()> {
        self.core.enable_recorder(cfg)
    }

    /// The recorder's dump now (the CQ's records only), or `None` if it is off.
    pub fn recorder_dump(&self) -> Option<String> {
        self.core.recorder_dump()
    }

    /// Convert into the low-level poller. The bookkeeping moves with it (consumer index, arm
    /// sequence); a CQ is polled through one API at a time, so the two cannot disagree.
    ///
    /// # Errors
    /// Gives the CQ back unchanged while unsignaled send WRs are still to be reported
    /// ([`QpInitAttr::report_unsignaled`](crate::QpInitAttr::report_unsignaled)): poll until
    /// a call returns fewer completions than it had room for, then convert.
    #[expect(
        clippy::result_large_err,
        reason = "the CQ itself is handed back; a conversion, not a fast path"
    )]
    pub fn into_raw(self) -> core::result::Result<RawCq, Cq> {
        if self.pending.is_some() {
            return Err(self);
        }
        Ok(RawCq { core: self.core })
    }

    /// Poll up to `wcs.len()` completions into `wcs`; returns how many were written. Publishes
    /// the consumer index once. No allocation and no lock in steady state (see
    /// [`locks_taken`](Self::locks_taken)); payloads the device scattered into CQEs are copied
    /// into the receive WQE's scatter list, every destination checked against the registered
    /// memory regions.
    #[inline]
    pub fn poll(&mut self, wcs: &mut [WorkCompletion]) -> usize {
        self.core.refresh();
        if !self.core.users.fences.is_empty() {
            return self.poll_fenced(wcs);
        }
        self.poll_loop::<false>(wcs)
    }

    /// [`poll`](Self::poll) while a fence is ahead: every CQE checked first.
    #[cold]
    #[inline(never)]
    fn poll_fenced(&mut self, wcs: &mut [WorkCompletion]) -> usize {
        self.poll_loop::<true>(wcs)
    }

    #[inline(always)]
    fn poll_loop<const FENCED: bool>(&mut self, wcs: &mut [WorkCompletion]) -> usize {
        let mut n = 0;
        if self.pending.is_some() {
            n += self.drain_pending(&mut wcs[n..]);
        }
        while let Some(wc) = wcs.get_mut(n) {
            let Core {
                ring,
                users,
                mr_cache,
                shared,
                ..
            } = &mut self.core;
            let ci = ring.ci();
            let Some(t) = ring.take() else { break };
            if FENCED
                && !users.fences.is_empty()
                && users.stale(t.be24_at(users.key_at), ci, t.op_own())
            {
                continue;
            }
            if decode_into(
                users,
                &mut self.pending,
                mr_cache,
                || t.cqe(),
                Some((&t, shared)),
                wc,
            ) {
                n += 1;
            } else if self.pending.is_some() {
                // (Only a CQE that gives no completion starts unsignaled reports.)
                n += self.drain_pending(&mut wcs[n..]);
            }
        }
        self.core.publish_ci();
        n
    }

    /// Report the unsignaled WRs before a signaled one (`report_unsignaled`), then it.
    #[cold]
    fn drain_pending(&mut self, out: &mut [WorkCompletion]) -> usize {
        let Some(p) = self.pending.as_mut() else {
            return 0;
        };
        let mut n = 0;
        while n < out.len() {
            // The poller is the tail's only writer but for a reset of the queue, which moves
            // it to the head (discarding every outstanding WR, the reported ones too: ordinals
            // go on across resets, so the tail never comes back here). Then nothing more of
            // this report is true: drop it (libmlx5 cleans the QP's CQEs out of the CQ).
            if p.sq.tail.load(Ordering::Acquire) != p.next {
                self.pending = None;
                break;
            }
            if p.next != p.end {
                let ord = p.next;
                // A record found for an earlier ordinal is the WR's only while it still holds
                // that ordinal (a reset clears records; a new WR would hold a higher one).
                let at = p.at.filter(|&c| p.sq.ordinal_at(c as u16) == ord);
                let (wr_id, opcode) = match at {
                    Some(c) => (p.sq.wr_id_at(c as u16), p.sq.wr_op_at(c as u16)),
                    None => (0, WcOpcode::SEND),
                };
                out[n] = WorkCompletion {
                    wr_id,
                    opcode,
                    qp_num: p.sq.qpn,
                    wc_flags: WcFlags::UNSIGNALED,
                    ..WorkCompletion::default()
                };
                p.next = ord.wrapping_add(1);
                p.at =
                    p.at.and_then(|c| p.sq.find_start(p.next, c.wrapping_add(1), false));
                p.sq.tail.store(p.next, Ordering::Release);
                n += 1;
            } else {
                out[n] = p.last;
                p.sq.tail.store(p.end.wrapping_add(1), Ordering::Release);
                n += 1;
                self.pending = None;
                break;
            }
        }
        n
    }

    /// Arm the CQ: the next completion (or, with `solicited_only`, the next solicited one)
    /// produces an event on the completion channel. Poll once more after arming to close the
    /// race with completions that arrived before the arm.
    pub fn req_notify(&mut self, solicited_only: bool) {
        self.core.req_notify(solicited_only);
    }

    /// Account for one completion event read for this CQ (libibverbs' `cq_event` hook plus
    /// `ibv_ack_cq_events`): bumps the arm sequence number.
    pub fn event_received(&mut self) {
        self.core.event_received();
    }

    /// Block on `channel` until this CQ's event arrives (poll(2) on the fd, no spinning) or
    /// `timeout_ms` passes; acknowledges it. Returns whether an event arrived.
    ///
    /// Meant for a channel that serves this CQ alone; with a channel shared by several CQs,
    /// read [`CompChannel::get_event`] and dispatch on [`user_handle`](Self::user_handle).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming `channel` if it is not the channel the CQ was created
    /// with (no event of this CQ could ever arrive there); [`Error::Os`] if waiting fails;
    /// [`Error::BadResponse`] if an event for another CQ arrives.
    pub fn wait(&mut self, channel: &CompChannel, timeout_ms: i32) -> Result<bool> {
        self.core.wait(channel, timeout_ms)
    }
}

/// The low-level poller of a CQ, made from a [`Cq`] by value ([`Cq::into_raw`]): typed raw
/// completions ([`RawCqe`]) one at a time, the consumer index published when the caller
/// chooses ([`publish_ci`](Self::publish_ci)), and the queue bookkeeping left to the caller
/// ([`SendQueue::retire`](crate::SendQueue::retire),
/// [`RecvQueue::retire`](crate::RecvQueue::retire)). A payload the device scattered into a
/// CQE is copied into the receive WQE's scatter list before the completion is returned (the
/// copy's failure is the completion's [`status`](RawCqe::status)), so no loop can forget it.
#[derive(Debug)]
pub struct RawCq {
    core: Core,
}

impl RawCq {
    /// Publish the consumer index in the CQ doorbell record: the device may reuse every entry
    /// taken so far. Publish at least once per ring's worth of completions (the device counts
    /// unpublished entries as occupied) and before arming.
    #[inline]
    pub fn publish_ci(&mut self) {
        self.core.publish_ci();
    }

    /// Back to the verbs-shaped poller (bookkeeping moves with it).
    pub fn into_verbs(self) -> Cq {
        Cq {
            core: self.core,
            pending: None,
            _not_sync: core::marker::PhantomData,
        }
    }

    /// CQ number.
    pub fn cqn(&self) -> u32 {
        self.core.shared.cqn
    }

    /// Number of CQEs the ring holds.
    pub fn capacity(&self) -> u32 {
        self.core.cqe_count
    }

    /// The free-running consumer index.
    pub fn consumer_index(&self) -> u32 {
        self.core.ring.ci()
    }

    /// As [`Cq::locks_taken`].
    pub fn locks_taken(&self) -> u64 {
        self.core.locks_taken()
    }

    /// Turn the flight recorder on for this CQ: it keeps the last `cfg.records` CQEs polled,
    /// and an error CQE (flush errors aside) produces a dump (format in
    /// `docs/flight-recorder.md`) with them and the WQEs of its QP if that QP records too
    /// ([`Qp::enable_recorder`](crate::Qp::enable_recorder)), written to `cfg.dir` (or
    /// `MLX5_RECORDER_DIR`) and handed to `cfg.callback`. Off by default; costs one
    /// instruction per CQE while off.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming `recorder` if it is already on.
    pub fn enable_recorder(&mut self, cfg: &RecorderConfig) -> Result<()> {
        self.core.enable_recorder(cfg)
    }

    /// The recorder's dump now (the CQ's records only), or `None` if it is off.
    pub fn recorder_dump(&self) -> Option<String> {
        self.core.recorder_dump()
    }

    /// Arm the CQ (publishes the consumer index first); see [`Cq::req_notify`].
    pub fn req_notify(&mut self, solicited_only: bool) {
        self.core.req_notify(solicited_only);
    }

    /// See [`Cq::event_received`].
    pub fn event_received(&mut self) {
        self.core.event_received();
    }

    /// See [`Cq::wait`].
    ///
    /// # Errors
    /// As [`Cq::wait`].
    pub fn wait(&mut self, channel: &CompChannel, timeout_ms: i32) -> Result<bool> {
        self.core.wait(channel, timeout_ms)
    }
}

/// The low-level poll: each `next` takes one completion, `None` while the device owns the next
/// entry (a later `next` may find one: this iterator is not fused). `for c in &mut raw` drains
/// what has arrived.
impl Iterator for RawCq {
    type Item = RawCqe;

    /// Take the next completion, or `None` while the device owns the next entry. The consumer
    /// index is not published until [`publish_ci`](Self::publish_ci).
    #[inline]
    fn next(&mut self) -> Option<RawCqe> {
        let Core {
            ring,
            users,
            mr_cache,
            shared,
            ..
        } = &mut self.core;
        // A QP attached, detached or reset since the last look (its fence to honour), or a
        // fence still ahead: the checked path.
        if shared.generation.load(Ordering::Relaxed) != users.seen_gen || !users.fences.is_empty() {
            raw_drop_stale(shared, users, ring);
        }
        let mut t = ring.take()?;
        // (With the flight recorder on, `op_own()` has the format bits set: every CQE takes
        // the cold path.)
        let mut copy = WcStatus::SUCCESS;
        if t.op_own() & SCATTER_MASK != 0 {
            // The entry comes back from the cold call (in registers, with the copy's status),
            // so that the common path keeps no value live across it.
            t = raw_scatter(shared, users, mr_cache, t);
            copy = t.status();
        }
        Some(RawCqe { cqe: t.cqe(), copy })
    }
}

/// [`RawCq::next`] after the QP list changed or while a fence is ahead: the list reloaded,
/// then the CQEs of an earlier life of their queue at the consumer index dropped, up to the
/// first other one (left for `next` to take: a fence ahead brings every `next` here, so each
/// CQE before it is checked). Returns nothing, so that the common path keeps its CQE in
/// registers.
#[cold]
#[inline(never)]
fn raw_drop_stale(shared: &CqShared, users: &mut Users, ring: &mut CqeReader) {
    refresh_users(shared, users);
    while !users.fences.is_empty() {
        let ci = ring.ci();
        let Some(t) = ring.take() else { return };
        let (key, op_own) = (t.be24_at(users.key_at), t.op_own());
        if !users.stale(key, ci, op_own) {
            ring.untake();
            return;
        }
    }
}

impl RawCq {
    /// The unchecked single-QP pollers' take (`SendQueue::poll_unchecked`): the next CQE if it
    /// is a successful requester CQE without scattered data, its `wqe_counter`; `None` (and
    /// nothing taken) while the device owns the next entry or it is anything else. No fence or
    /// QP-list check (the caller's contract covers them), so crate-private. The consumer index
    /// is published lazily, every half ring (and by [`publish_ci`](Self::publish_ci),
    /// `req_notify`).
    #[inline(always)]
    pub(crate) fn take_send_lazy(&mut self) -> Option<u16> {
        let lazy = (self.core.cqe_count >> 1).wrapping_sub(1);
        let ring = &mut self.core.ring;
        let counter = ring
            .take_if(REQ_IN_MEMORY, OPCODE_FORMAT)?
            .cqe()
            .wqe_counter();
        if ring.ci() & lazy == 0 {
            ring.publish();
        }
        Some(counter)
    }

    /// [`take_send_lazy`](Self::take_send_lazy) for a successful SEND received in memory: its
    /// `wqe_counter` and byte count.
    #[inline(always)]
    pub(crate) fn take_recv_lazy(&mut self) -> Option<(u16, u32)> {
        let lazy = (self.core.cqe_count >> 1).wrapping_sub(1);
        let ring = &mut self.core.ring;
        let c = ring.take_if(RESP_SEND_IN_MEMORY, OPCODE_FORMAT)?.cqe();
        if ring.ci() & lazy == 0 {
            ring.publish();
        }
        Some((c.wqe_counter(), c.byte_cnt()))
    }
}

/// The raw poller's scatter-to-CQE copy for `cqe` (taken as `t`): find its queue and copy the
/// payload into the WQE's scatter list; the status the copy ends with.
#[cold]
#[inline(never)]
fn raw_scatter<'r>(
    shared: &CqShared,
    users: &mut Users,
    cache: &mut MrCache,
    mut t: TakenCqe<'r>,
) -> TakenCqe<'r> {
    let cqe = t.cqe();
    if let Some(rec) = shared.rec.get() {
        refresh_users(shared, users);
        let key = if users.by_uidx {
            cqe.user_index()
        } else {
            cqe.qpn()
        };
        record_cqe(rec, shared, users.find(key), &t);
        if cqe.op_own & SCATTER_MASK == 0 {
            return t;
        }
    }
    let st = raw_scatter_copy(shared, users, cache, &cqe, &t);
    t.set_status(st);
    t
}

/// Take a fresh copy of the QP list if a QP was attached or detached (the raw poller's cold
/// paths).
fn refresh_users(shared: &CqShared, users: &mut Users) {
    let g = shared.generation.load(Ordering::Acquire);
    if g != users.seen_gen {
        let u = shared.users.lock().unwrap_or_else(|p| p.into_inner());
        users.reload(&u, g);
    }
}

/// The copy of [`raw_scatter`]: the status it ends with.
#[inline(always)]
fn raw_scatter_copy(
    shared: &CqShared,
    users: &mut Users,
    cache: &mut MrCache,
    cqe: &Cqe64,
    t: &TakenCqe<'_>,
) -> WcStatus {
    refresh_users(shared, users);
    let key = if users.by_uidx {
        cqe.user_index()
    } else {
        cqe.qpn()
    };
    let Some(user) = users.find(key) else {
        return WcStatus::GENERAL_ERR;
    };
    let counter = cqe.wqe_counter();
    let r = match cqe.opcode() {
        CqeOpcode::REQ => match &user.sq {
            Some(sq) => {
                let len = match cqe.send_opcode() {
                    SendOpcode::ATOMIC_CS | SendOpcode::ATOMIC_FA => 8,
                    _ => cqe.byte_cnt(),
                };
                scattered_data(cqe, Some(t), len)
                    .and_then(|(d, n)| sq.copy_scattered(counter, &d[..n]))
            }
            None => Err(WcStatus::GENERAL_ERR),
        },
        CqeOpcode::RESP_RDMA_WRITE_IMM
        | CqeOpcode::RESP_SEND
        | CqeOpcode::RESP_SEND_IMM
        | CqeOpcode::RESP_SEND_INV => scattered_data(cqe, Some(t), cqe.byte_cnt())
            .and_then(|(d, n)| copy_recv(user, cache, counter, &d[..n])),
        _ => Ok(()),
    };
    r.err().unwrap_or(WcStatus::SUCCESS)
}

/// Copy a receive payload scattered into a CQE into the scatter list of the (SRQ or RQ) WQE
/// `counter` it consumed.
#[inline]
fn copy_recv(
    user: &CqUser,
    cache: &mut MrCache,
    counter: u16,
    data: &[u8],
) -> core::result::Result<(), WcStatus> {
    match (&user.srq, &user.rq) {
        (Some(srq), _) => srq.copy_scattered(counter, data, cache),
        (None, Some(rq)) => {
            rq.scatter
                .as_ref()
                .ok_or(WcStatus::GENERAL_ERR)?
                .copy(u32::from(counter), data, cache)
        }
        (None, None) => Ok(()),
    }
}

/// What a raw completion is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CqeKind {
    /// A successful requester completion: retire with
    /// [`SendQueue::retire`](crate::SendQueue::retire).
    Send,
    /// A successful receive (SEND, SEND with immediate or invalidate, RDMA WRITE with
    /// immediate): retire with [`RecvQueue::retire`](crate::RecvQueue::retire).
    Recv,
    /// A requester error (the syndrome is in [`RawCqe::status`]).
    SendError,
    /// A responder error.
    RecvError,
    /// Anything else (resize marker, no-packet, signature error, reserved opcodes).
    Other,
}

/// One completion from the low-level poller: the 64-byte CQE as the device wrote it, typed
/// accessors, and the outcome of the scatter-to-CQE copy the poller already made.
#[derive(Clone, Copy, Debug)]
pub struct RawCqe {
    cqe: Cqe64,
    copy: WcStatus,
}

impl RawCqe {
    /// What the completion is.
    #[inline(always)]
    pub fn kind(&self) -> CqeKind {
        match self.cqe.opcode() {
            CqeOpcode::REQ => CqeKind::Send,
            CqeOpcode::RESP_RDMA_WRITE_IMM
            | CqeOpcode::RESP_SEND
            | CqeOpcode::RESP_SEND_IMM
            | CqeOpcode::RESP_SEND_INV => CqeKind::Recv,
            CqeOpcode::REQ_ERR => CqeKind::SendError,
            CqeOpcode::RESP_ERR => CqeKind::RecvError,
            _ => CqeKind::Other,
        }
    }

    /// The CQE opcode.
    #[inline(always)]
    pub fn opcode(&self) -> CqeOpcode {
        self.cqe.opcode()
    }

    /// The WQE counter: the first WQEBB of the send WQE, or the receive WQE's index.
    #[inline(always)]
    pub fn wqe_counter(&self) -> u16 {
        self.cqe.wqe_counter()
    }

    /// Bytes received (or read).
    #[inline(always)]
    pub fn byte_len(&self) -> u32 {
        self.cqe.byte_cnt()
    }

    /// The QP number.
    #[inline(always)]
    pub fn qpn(&self) -> u32 {
        self.cqe.qpn()
    }

    /// The completion status: the error a syndrome maps to for error CQEs, the failure of the
    /// scatter-to-CQE copy (`LOC_PROT_ERR`, `LOC_LEN_ERR`, `GENERAL_ERR`), or success.
    #[inline(always)]
    pub fn status(&self) -> WcStatus {
        match self.cqe.opcode() {
            CqeOpcode::REQ_ERR | CqeOpcode::RESP_ERR => {
                let mut wc = WorkCompletion::default();
                set_error(&mut wc, &self.cqe);
                wc.status
            }
            _ => self.copy,
        }
    }

    /// Syndrome and vendor syndrome of an error CQE.
    pub fn syndrome(&self) -> Option<(Syndrome, mlx5_hw::opcodes::VendorSyndrome)> {
        match self.cqe.opcode() {
            CqeOpcode::REQ_ERR | CqeOpcode::RESP_ERR => {
                let err: ErrCqe = zerocopy::transmute!(self.cqe);
                Some((err.syndrome(), err.vendor_syndrome()))
            }
            _ => None,
        }
    }

    /// Whether the payload came in the CQE (already copied into the receive buffer).
    #[inline(always)]
    pub fn scattered(&self) -> bool {
        self.cqe.op_own & SCATTER_MASK != 0
    }

    /// Immediate data (network order) or invalidated rkey bytes.
    #[inline(always)]
    pub fn imm_data(&self) -> [u8; 4] {
        self.cqe.imm_inval_pkey.to_bytes()
    }

    /// The L3 header type of a received packet (`l4_hdr_type_etc` bits 3:2): 0 none, 1 IPv6,
    /// 2 IPv4 (`MLX5_CQE_L3_HDR_TYPE_*`).
    #[inline(always)]
    pub fn l3_hdr_type(&self) -> u8 {
        (self.cqe.l4_hdr_type_etc >> 2) & 3
    }

    /// The L4 header type of a received packet (`l4_hdr_type_etc` bits 6:4): 0 none, 1 TCP,
    /// 2 UDP, 3 TCP with an empty ACK, 4 TCP with ACK and data.
    #[inline(always)]
    pub fn l4_hdr_type(&self) -> u8 {
        (self.cqe.l4_hdr_type_etc >> 4) & 7
    }

    /// Whether the device found the L3 (IPv4 header) checksum good (`hds_ip_ext` bit 1,
    /// `MLX5_CQE_L3_OK`).
    #[inline(always)]
    pub fn l3_ok(&self) -> bool {
        self.cqe.hds_ip_ext & 2 != 0
    }

    /// Whether the device found the L4 (TCP/UDP) checksum good (`hds_ip_ext` bit 2,
    /// `MLX5_CQE_L4_OK`).
    #[inline(always)]
    pub fn l4_ok(&self) -> bool {
        self.cqe.hds_ip_ext & 4 != 0
    }

    /// The VLAN tag control information the device stripped from the frame, if it stripped
    /// one (`l4_hdr_type_etc` bit 0; the TCI is `vlan_info`).
    #[inline(always)]
    pub fn vlan_tci(&self) -> Option<u16> {
        (self.cqe.l4_hdr_type_etc & 1 != 0).then(|| self.cqe.vlan_info.get())
    }

    /// The raw completion timestamp, in device clock ticks (the free-running counter the
    /// device writes into every CQE; not converted to wall-clock time).
    #[inline(always)]
    pub fn timestamp(&self) -> u64 {
        self.cqe.timestamp()
    }

    /// The whole CQE, for fields without an accessor here (decode with [`mlx5_hw::cqe`]).
    /// With scattered payload of format 1 its first 32 bytes are payload.
    #[inline(always)]
    pub fn cqe(&self) -> &Cqe64 {
        &self.cqe
    }
}

/// [`decode_into`] returning the completion (for the tests).
#[cfg(test)]
fn decode(
    local: &[CqUser],
    by_uidx: bool,
    pending: &mut Option<Pending>,
    cqe: &Cqe64,
) -> Option<WorkCompletion> {
    let mut wc = WorkCompletion::default();
    let mut cache = MrCache::default();
    let mut users = Users {
        by_uidx,
        ..Users::default()
    };
    users.reload(local, 0);
    decode_into(&mut users, pending, &mut cache, || *cqe, None, &mut wc).then_some(wc)
}

/// Decode one CQE into the caller's work completion, doing the queue bookkeeping (retire send
/// WRs, advance the receive tail, free SRQ WQEs): writes the whole of `*out` and returns true
/// for a completion; returns false, `*out` untouched, for CQEs that carry none (resize marker,
/// unknown QP) or when unsignaled WRs are being reported first.
///
/// A successful requester CQE (the bulk of a send CQ) is decoded in line; every other kind
/// out of line, so that the common path keeps its few values in registers.
#[inline(always)]
fn decode_into(
    users: &mut Users,
    pending: &mut Option<Pending>,
    cache: &mut MrCache,
    cqe: impl Fn() -> Cqe64,
    at: Option<(&TakenCqe<'_>, &CqShared)>,
    out: &mut WorkCompletion,
) -> bool {
    // The CQE is read where each field is used (`cqe()` copies out only the words a path
    // needs), so that no path loads, and spills, the fields of another.
    let key = match at {
        Some((t, _)) => t.be24_at(users.key_at),
        None => {
            let c = cqe();
            if users.by_uidx {
                c.user_index()
            } else {
                c.qpn()
            }
        }
    };
    let Some(user) = users.find(key) else {
        return false;
    };
    // Opcode and format bits at once: the two common kinds without scattered data (neither,
    // while the flight recorder forces the format bits).
    let op_own = at.map_or_else(|| cqe().op_own, |(t, _)| t.op_own());
    let kind = op_own & OPCODE_FORMAT;
    if kind == REQ_IN_MEMORY {
        if let Some(sq) = &user.sq {
            let c = cqe();
            let (ord, wc) = requester_wc(user, sq, &c);
            return retire_send(sq, ord, c.wqe_counter(), pending, wc, out);
        }
    } else if kind == RESP_SEND_IN_MEMORY && user.srq.is_none() {
        if let Some(rq) = &user.rq {
            let c = cqe();
            *out = responder_wc(user, rq.complete(c.wqe_counter()), &c);
            return true;
        }
    }
    match at {
        Some((&t, shared)) => decode_other_taken(shared, user, pending, cache, t, out),
        None => decode_other(user, pending, cache, &cqe(), None, out),
    }
}

/// The recorder's side of a CQE of `user` taken as `t`: the WQEs it may complete first, then
/// the CQE; a dump if it is an error.
#[cold]
#[inline(never)]
fn record_cqe(rec: &CqRecorder, shared: &CqShared, user: Option<&CqUser>, t: &TakenCqe<'_>) {
    let qrec: Option<&Arc<QpRecorder>> = user.and_then(|u| {
        u.sq.as_ref()
            .and_then(|s| s.rec.get())
            .or_else(|| u.rq.as_ref().and_then(|q| q.rec.get()))
    });
    if let Some(q) = qrec {
        q.before_cqe();
    }
    let cqe = t.cqe();
    rec.record(t, t.first_half().as_ref(), &cqe);
    if let Some(reason) = recorder::error_reason(shared.cqn, &cqe) {
        let qps: Vec<QpPart<'_>> = match (qrec, user) {
            (Some(q), Some(u)) => vec![QpPart {
                rec: q,
                sq: u.sq.as_deref().map(|s| s as &dyn recorder::SqRetired),
                rq: u.rq.as_deref().map(|r| r as &dyn recorder::RqRetired),
            }],
            _ => Vec::new(),
        };
        let cq = CqPart {
            rec,
            cqn: shared.cqn,
            dbrec_ci: shared.dbrec.word0().load_be32(),
        };
        let text = recorder::dump_text(&reason, &qps, &[cq]);
        recorder::deliver(reason, text, rec, qrec.map(|q| &**q));
    }
}

/// [`decode_other`] of the entry `t`, read again here so that the caller's copy of the CQE
/// can stay in registers (its address is never taken on the common path).
#[inline(never)]
fn decode_other_taken(
    shared: &CqShared,
    user: &CqUser,
    pending: &mut Option<Pending>,
    cache: &mut MrCache,
    t: TakenCqe<'_>,
    out: &mut WorkCompletion,
) -> bool {
    let cqe = t.cqe();
    if let Some(rec) = shared.rec.get() {
        record_cqe(rec, shared, Some(user), &t);
        // The kinds the caller's fast path decodes (the recorder sent every CQE here).
        let kind = cqe.op_own & OPCODE_FORMAT;
        if kind == REQ_IN_MEMORY {
            if let Some(sq) = &user.sq {
                let (ord, wc) = requester_wc(user, sq, &cqe);
                return retire_send(sq, ord, cqe.wqe_counter(), pending, wc, out);
            }
        } else if kind == RESP_SEND_IN_MEMORY && user.srq.is_none() {
            if let Some(rq) = &user.rq {
                *out = responder_wc(user, rq.complete(cqe.wqe_counter()), &cqe);
                return true;
            }
        }
    }
    decode_other(user, pending, cache, &cqe, Some(&t), out)
}

/// The bits the flight recorder ORs into every taken CQE's `op_own` ([`CqeReader::mark`]):
/// format 3 (reserved), so that no CQE matches a fast-path kind and every one reaches it.
const REC_FORCE: u8 = 0x0C;

/// Byte offset of the user index (`srqn_uidx`, low 24 bits) in a CQE.
const UIDX_AT: u8 = core::mem::offset_of!(Cqe64, srqn_uidx) as u8;
/// Byte offset of the QPN (`sop_drop_qpn`, low 24 bits) in a CQE.
const QPN_AT: u8 = core::mem::offset_of!(Cqe64, sop_drop_qpn) as u8;

/// `op_own` opcode (7:4) and format (3:2) bits.
const OPCODE_FORMAT: u8 = 0xFC;
/// `op_own & OPCODE_FORMAT` of a successful requester CQE without scattered data.
const REQ_IN_MEMORY: u8 = CqeOpcode::REQ.0 << 4;
/// `op_own & OPCODE_FORMAT` of a SEND received into memory (no scattered data).
const RESP_SEND_IN_MEMORY: u8 = CqeOpcode::RESP_SEND.0 << 4;

/// The completion of a successful responder CQE for receive `wr_id`, as for a plain SEND
/// whose payload is in memory: the other kinds adjust it ([`decode_other`]).
#[inline(always)]
fn responder_wc(user: &CqUser, wr_id: u64, cqe: &Cqe64) -> WorkCompletion {
    let mut flags = solicited_flag(cqe);
    if cqe.has_grh() {
        flags.0 |= WcFlags::GRH.0;
    }
    WorkCompletion {
        wr_id,
        opcode: WcOpcode::RECV,
        byte_len: cqe.byte_cnt(),
        qp_num: user.qpn,
        src_qp: cqe.src_qp(),
        wc_flags: flags,
        slid: cqe.slid(),
        sl: cqe.sl(),
        dlid_path_bits: cqe.dlid_path_bits(),
        pkey_index: (cqe.imm_inval_pkey.get() & 0xFFFF) as u16,
        timestamp: cqe.timestamp(),
        ..WorkCompletion::default()
    }
}

/// `op_own` format bits: payload scattered into the CQE (32 or 64 bytes).
const SCATTER_MASK: u8 = INLINE_SCATTER_32 | INLINE_SCATTER_64;

/// The completion of a successful requester CQE and the WR ordinal it retires through.
#[inline(always)]
fn requester_wc(user: &CqUser, sq: &SqShared, cqe: &Cqe64) -> (u32, WorkCompletion) {
    let counter = cqe.wqe_counter();
    let ord = sq.ordinal_at(counter);
    let e = REQ_WC_BY_SEND_OP[usize::from(cqe.send_opcode().0)];
    let wc = WorkCompletion {
        wr_id: sq.wr_id_at(counter),
        opcode: WcOpcode(e & 0xFF),
        byte_len: (cqe.byte_cnt() & 0u32.wrapping_sub(e >> 16)) | ((e >> 8) & 0xFF),
        qp_num: user.qpn,
        wc_flags: solicited_flag(cqe),
        timestamp: cqe.timestamp(),
        ..WorkCompletion::default()
    };
    (ord, wc)
}

/// The first `len` bytes of the payload the device scattered into `cqe` (taken as `at`): format 1, from the start of the 64-byte CQE (at most 32
/// bytes; the CQE fields there are payload); format 2, from the first half of a 128-byte
/// entry (at most 64 bytes).
///
/// # Errors
/// [`WcStatus::GENERAL_ERR`] for a length over the format's room, format 2 on a ring of
/// 64-byte entries, or the reserved format 3.
fn scattered_data(
    cqe: &Cqe64,
    at: Option<&TakenCqe<'_>>,
    len: u32,
) -> core::result::Result<([u8; 64], usize), WcStatus> {
    let len = len as usize;
    match cqe.format() {
        CQE_FORMAT_SCATTER_32 if len <= 32 => {
            let mut d = [0u8; 64];
            d[..32].copy_from_slice(&cqe.as_bytes()[..32]);
            Ok((d, len))
        }
        CQE_FORMAT_SCATTER_64 if len <= 64 => at
            .and_then(TakenCqe::first_half)
            .map(|d| (d, len))
            .ok_or(WcStatus::GENERAL_ERR),
        _ => Err(WcStatus::GENERAL_ERR),
    }
}

/// [`WcFlags::SOLICITED`] if the CQE's solicited-event bit is set.
#[inline(always)]
fn solicited_flag(cqe: &Cqe64) -> WcFlags {
    if cqe.solicited() {
        WcFlags::SOLICITED
    } else {
        WcFlags(0)
    }
}

/// The send-queue bookkeeping of a requester completion `wc` for WR ordinal `ord` (whose WQE
/// starts at WQEBB counter `counter`): retire it and every earlier (unsignaled) WR, or, with
/// `report_unsignaled`, queue those first.
#[inline(always)]
fn retire_send(
    sq: &Arc<SqShared>,
    ord: u32,
    counter: u16,
    pending: &mut Option<Pending>,
    wc: WorkCompletion,
    out: &mut WorkCompletion,
) -> bool {
    let tail = sq.tail.load(Ordering::Relaxed);
    let skipped = ord.wrapping_sub(tail);
    if skipped > sq.wr_mask {
        // The CQE names no outstanding WR (a record cleared or older than the tail: a CQE
        // left in the ring across a reset of the queue): retiring to it would move the tail
        // anywhere, so it completes nothing.
        return false;
    }
    if sq.report_unsignaled && skipped != 0 {
        *pending = Some(Pending {
            at: sq.find_start(tail, u32::from(counter), true),
            sq: sq.clone(),
            next: tail,
            end: ord,
            last: wc,
        });
        return false;
    }
    sq.tail.store(ord.wrapping_add(1), Ordering::Release);
    *out = wc;
    true
}

/// [`decode_into`] for every CQE but a successful requester one.
#[inline]
fn decode_other(
    user: &CqUser,
    pending: &mut Option<Pending>,
    cache: &mut MrCache,
    cqe: &Cqe64,
    at: Option<&TakenCqe<'_>>,
    out: &mut WorkCompletion,
) -> bool {
    let op = cqe.opcode();
    let mut wc = WorkCompletion {
        qp_num: user.qpn,
        timestamp: cqe.timestamp(),
        wc_flags: solicited_flag(cqe),
        ..WorkCompletion::default()
    };
    match op {
        CqeOpcode::REQ => {
            // A READ or atomic result scattered into the CQE: copied into the WQE's scatter
            // list before the WR is retired.
            let Some(sq) = user.sq.as_ref() else {
                return false;
            };
            let (ord, mut wc) = requester_wc(user, sq, cqe);
            let copied = scattered_data(cqe, at, wc.byte_len)
                .and_then(|(d, n)| sq.copy_scattered(cqe.wqe_counter(), &d[..n]));
            if let Err(st) = copied {
                wc.status = st;
            }
            retire_send(sq, ord, cqe.wqe_counter(), pending, wc, out)
        }
        CqeOpcode::REQ_ERR => {
            let Some(sq) = user.sq.as_ref() else {
                return false;
            };
            let counter = cqe.wqe_counter();
            let ord = sq.ordinal_at(counter);
            set_error(&mut wc, cqe);
            wc.opcode = sq.wr_op_at(counter);
            wc.wr_id = sq.wr_id_at(counter);
            retire_send(sq, ord, counter, pending, wc, out)
        }
        CqeOpcode::RESP_RDMA_WRITE_IMM
        | CqeOpcode::RESP_SEND
        | CqeOpcode::RESP_SEND_IMM
        | CqeOpcode::RESP_SEND_INV
        | CqeOpcode::RESP_ERR => {
            let counter = cqe.wqe_counter();
            // A payload scattered into the CQE goes to the WQE's scatter list before the WQE
            // is retired (the poster may reuse it from then on).
            let scattered = op != CqeOpcode::RESP_ERR && cqe.op_own & SCATTER_MASK != 0;
            let copied = if scattered {
                scattered_data(cqe, at, cqe.byte_cnt())
                    .and_then(|(d, n)| copy_recv(user, cache, counter, &d[..n]))
            } else {
                Ok(())
            };
            let wr_id = if let Some(srq) = &user.srq {
                srq.complete(counter)
            } else if let Some(rq) = &user.rq {
                rq.complete(counter)
            } else {
                return false;
            };
            if op == CqeOpcode::RESP_ERR {
                wc.wr_id = wr_id;
                set_error(&mut wc, cqe);
                wc.opcode = WcOpcode::RECV;
                if user.qpn == ROUTED {
                    wc.qp_num = cqe.qpn();
                }
                *out = wc;
                return true;
            }
            let mut wc = responder_wc(user, wr_id, cqe);
            if let Err(st) = copied {
                wc.status = st;
            }
            // With 32 bytes scattered into the CQE (format 1) its first 32 bytes are payload,
            // not the source fields (which RC/UC completions do not need).
            if cqe.format() == CQE_FORMAT_SCATTER_32 {
                wc.src_qp = 0;
                wc.sl = 0;
                wc.slid = 0;
                wc.dlid_path_bits = 0;
                wc.wc_flags.0 &= !WcFlags::GRH.0;
            }
            let iip = cqe.imm_inval_pkey.to_bytes();
            match op {
                CqeOpcode::RESP_RDMA_WRITE_IMM => {
                    wc.opcode = WcOpcode::RECV_RDMA_WITH_IMM;
                    wc.imm_data = iip;
                    wc.wc_flags.0 |= WcFlags::WITH_IMM.0;
                    wc.pkey_index = 0;
                }
                CqeOpcode::RESP_SEND_IMM => {
                    wc.imm_data = iip;
                    wc.wc_flags.0 |= WcFlags::WITH_IMM.0;
                    wc.pkey_index = 0;
                }
                CqeOpcode::RESP_SEND_INV => {
                    wc.invalidated_rkey = u32::from_be_bytes(iip);
                    wc.wc_flags.0 |= WcFlags::WITH_INV.0;
                    wc.pkey_index = 0;
                }
                _ => {}
            }
            if user.qpn == ROUTED {
                wc.qp_num = cqe.qpn();
            }
            *out = wc;
            true
        }
        _ => false,
    }
}

/// Fill the error fields from the error-CQE view of `cqe` (syndrome @55, vendor syndrome @54).
/// (A by-value reinterpretation, so the caller's copy of the CQE can stay in registers.)
#[inline(always)]
fn set_error(wc: &mut WorkCompletion, cqe: &Cqe64) {
    let err: ErrCqe = zerocopy::transmute!(*cqe);
    let s: Syndrome = err.syndrome();
    wc.syndrome = s;
    wc.vendor_err = err.vendor_syndrome();
    wc.status = s.wc_status();
    if wc.status == WcStatus::SUCCESS {
        wc.status = WcStatus::GENERAL_ERR;
    }
}

#[cfg(test)]
mod tests {
    //! CQE decoding against hand-built CQEs (field values from docs/datapath.md §4), and
    //! random CQEs that must never panic.
    use super::*;
    use mlx5_hw::cqe::op_own;
    use mlx5_hw::types::{Be16, Be32, Be64};
    use zerocopy::FromBytes;

    const QPN: u32 = 0x12_3456;
    const UIDX: u32 = 7;

    fn users(report_unsignaled: bool) -> (Vec<CqUser>, Arc<SqShared>, Arc<RqShared>) {
        let sq = Arc::new(SqShared::new(16, 64, report_unsignaled, QPN));
        let rq = Arc::new(RqShared::new(16));
        // Three WRs: ordinals 0, 1, 2 at WQEBB counters 0, 1, 3 (the second is 2 WQEBBs).
        sq.record(0, 0, 100, SendOpcode::SEND);
        sq.record(1, 1, 101, SendOpcode::RDMA_WRITE);
        sq.record(2, 3, 102, SendOpcode::RDMA_READ);
        rq.set_wr_id(0, 500);
        rq.set_wr_id(1, 501);
        let u = CqUser {
            qpn: QPN,
            uidx: UIDX,
            sq: Some(sq.clone()),
            rq: Some(rq.clone()),
            srq: None,
            fence: None,
        };
        (vec![u], sq, rq)
    }

    fn cqe(opcode: CqeOpcode, send_op: u8, wqe_counter: u16) -> Cqe64 {
        let mut c = Cqe64::zeroed();
        c.op_own = op_own(opcode, 0, false, 0);
        c.sop_drop_qpn = Be32::new((u32::from(send_op) << 24) | QPN);
        c.srqn_uidx = Be32::new(UIDX);
        c.wqe_counter = Be16::new(wqe_counter);
        c.timestamp = Be64::new(0x1122_3344);
        c
    }

    #[test]
    fn requester_success_retires_through_the_signaled_wr() {
        let (local, sq, _) = users(false);
        let mut pending = None;
        let mut c = cqe(CqeOpcode::REQ, SendOpcode::RDMA_READ.0, 3);
        c.byte_cnt = Be32::new(4000);
        let wc = decode(&local, true, &mut pending, &c).unwrap();
        assert_eq!(
            (wc.wr_id, wc.opcode, wc.byte_len, wc.qp_num),
            (102, WcOpcode::RDMA_READ, 4000, QPN)
        );
        assert_eq!((wc.status, wc.timestamp), (WcStatus::SUCCESS, 0x1122_3344));
        // tail = wqe_head[slot] + 1 retires the two unsignaled WRs before it too.
        assert_eq!(sq.tail.load(Ordering::Relaxed), 3);
        assert!(pending.is_none());
    }

    #[test]
    fn requester_success_with_unsignaled_reporting_queues_the_earlier_wrs() {
        let (local, sq, _) = users(true);
        let mut pending = None;
        let wc = decode(
            &local,
            true,
            &mut pending,
            &cqe(CqeOpcode::REQ, SendOpcode::RDMA_READ.0, 3),
        );
        assert!(wc.is_none(), "the earlier WRs are reported first");
        let p = pending.as_ref().unwrap();
        assert_eq!((p.next, p.end, p.last.wr_id), (0, 2, 102));
        assert_eq!(sq.tail.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn error_cqe_carries_syndrome_vendor_and_the_wr_opcode() {
        let (local, sq, _) = users(false);
        let mut pending = None;
        let mut c = cqe(CqeOpcode::REQ_ERR, SendOpcode::RDMA_WRITE.0, 1);
        let bytes = c.as_mut_bytes();
        bytes[54] = 0x88; // vendor syndrome
        bytes[55] = 0x13; // remote access error
        let wc = decode(&local, true, &mut pending, &c).unwrap();
        assert_eq!(
            (wc.wr_id, wc.status, wc.syndrome),
            (101, WcStatus::REM_ACCESS_ERR, Syndrome(0x13))
        );
        assert_eq!((wc.vendor_err.0, wc.opcode), (0x88, WcOpcode::RDMA_WRITE));
        assert_eq!(sq.tail.load(Ordering::Relaxed), 2);
        // An unknown syndrome is a general error, never success.
        let mut c = cqe(CqeOpcode::REQ_ERR, 0, 3);
        c.as_mut_bytes()[55] = 0x00;
        assert_eq!(
            decode(&local, true, &mut pending, &c).unwrap().status,
            WcStatus::GENERAL_ERR
        );
    }

    #[test]
    fn responder_cqes_decode_imm_inv_grh_and_source() {
        let (local, _, rq) = users(false);
        let mut pending = None;
        let mut c = cqe(CqeOpcode::RESP_SEND_IMM, 0, 0);
        c.byte_cnt = Be32::new(240);
        c.imm_inval_pkey = Be32::from_bytes([1, 2, 3, 4]);
        c.flags_rqpn = Be32::new((1 << 28) | (3 << 24) | 0x00_0abc);
        c.slid = Be16::new(9);
        c.op_own |= 0x02; // solicited
        let wc = decode(&local, true, &mut pending, &c).unwrap();
        assert_eq!(
            (wc.wr_id, wc.opcode, wc.byte_len, wc.imm_data),
            (500, WcOpcode::RECV, 240, [1, 2, 3, 4])
        );
        assert_eq!((wc.src_qp, wc.sl, wc.slid), (0xabc, 3, 9));
        assert!(wc.wc_flags.contains(WcFlags::WITH_IMM));
        assert!(wc.wc_flags.contains(WcFlags::GRH));
        assert!(wc.wc_flags.contains(WcFlags::SOLICITED));
        assert_eq!(rq.tail.load(Ordering::Relaxed), 1);
        let mut c = cqe(CqeOpcode::RESP_SEND_INV, 0, 1);
        c.imm_inval_pkey = Be32::new(0xdead_beef);
        let wc = decode(&local, true, &mut pending, &c).unwrap();
        assert_eq!((wc.wr_id, wc.invalidated_rkey), (501, 0xdead_beef));
        assert!(wc.wc_flags.contains(WcFlags::WITH_INV));
        let c = cqe(CqeOpcode::RESP_RDMA_WRITE_IMM, 0, 2);
        assert_eq!(
            decode(&local, true, &mut pending, &c).unwrap().opcode,
            WcOpcode::RECV_RDMA_WITH_IMM
        );
    }

    #[test]
    fn cqes_of_unknown_qps_and_odd_opcodes_are_skipped() {
        let (local, _, _) = users(false);
        let mut pending = None;
        let mut c = cqe(CqeOpcode::REQ, 0, 0);
        c.srqn_uidx = Be32::new(UIDX + 1);
        assert!(decode(&local, true, &mut pending, &c).is_none());
        // By QPN (CQE version 0) the same CQE is found.
        assert!(decode(&local, false, &mut pending, &c).is_some());
        for op in [
            CqeOpcode::RESIZE_CQ,
            CqeOpcode::NO_PACKET,
            CqeOpcode::SIG_ERR,
            CqeOpcode(9),
        ] {
            assert!(decode(&local, true, &mut pending, &cqe(op, 0, 0)).is_none());
        }
    }

    #[test]
    fn malformed_scattered_cqes_are_errors_not_reads_past_the_cqe() {
        let (local, _, rq) = users(false);
        let mut pending = None;
        let mut c = cqe(CqeOpcode::RESP_SEND, 0, 0);
        c.as_mut_bytes()[..5].copy_from_slice(b"hello");
        c.byte_cnt = Be32::new(5);
        c.op_own |= INLINE_SCATTER_32;
        let (d, n) = scattered_data(&c, None, 5).unwrap();
        assert_eq!(&d[..n], b"hello");
        // More than the format holds, format 2 without a 128-byte entry, the reserved format.
        assert_eq!(scattered_data(&c, None, 33), Err(WcStatus::GENERAL_ERR));
        let mut c2 = c;
        c2.op_own = (c2.op_own & !SCATTER_MASK) | INLINE_SCATTER_64;
        assert_eq!(scattered_data(&c2, None, 5), Err(WcStatus::GENERAL_ERR));
        c2.op_own |= SCATTER_MASK;
        assert_eq!(scattered_data(&c2, None, 5), Err(WcStatus::GENERAL_ERR));
        // A queue without a scatter target: the receive completes with an error (not a
        // success with the data missing), its WQE retired.
        let wc = decode(&local, true, &mut pending, &c).unwrap();
        assert_eq!(
            (wc.wr_id, wc.status, wc.byte_len),
            (500, WcStatus::GENERAL_ERR, 5)
        );
        assert_eq!(rq.tail.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn random_cqes_never_panic() {
        let (local, _, _) = users(true);
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        for _ in 0..100_000 {
            let mut b = [0u8; 64];
            for chunk in b.chunks_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                chunk.copy_from_slice(&x.to_ne_bytes());
            }
            // Aim some at the registered QP so the bookkeeping paths run too.
            if x % 2 == 0 {
                b[32..36].copy_from_slice(&UIDX.to_be_bytes());
            }
            let c = Cqe64::read_from_bytes(&b).unwrap();
            let mut pending = None;
            let _ = decode(&local, x % 3 != 0, &mut pending, &c);
        }
    }
    #[test]
    fn raw_cqe_exposes_the_packet_fields() {
        let mut c = cqe(CqeOpcode::RESP_SEND, 0, 0);
        let plain = RawCqe {
            cqe: c,
            copy: WcStatus::SUCCESS,
        };
        assert_eq!((plain.l3_hdr_type(), plain.l4_hdr_type()), (0, 0));
        assert_eq!(
            (plain.l3_ok(), plain.l4_ok(), plain.vlan_tci()),
            (false, false, None)
        );
        // IPv4 (2) + UDP (2), both checksums good, VLAN 0x0123 stripped.
        c.l4_hdr_type_etc = 2 << 4 | 2 << 2 | 1;
        c.hds_ip_ext = 0b110;
        c.vlan_info = Be16::new(0x0123);
        let r = RawCqe {
            cqe: c,
            copy: WcStatus::SUCCESS,
        };
        assert_eq!((r.l3_hdr_type(), r.l4_hdr_type()), (2, 2));
        assert_eq!(
            (r.l3_ok(), r.l4_ok(), r.vlan_tci()),
            (true, true, Some(0x0123))
        );
        assert_eq!(r.timestamp(), 0x1122_3344);
        // Only the L3 bit: the L4 one stays clear; IPv6 + TCP with ACK and data.
        c.hds_ip_ext = 0b010;
        c.l4_hdr_type_etc = 4 << 4 | 1 << 2;
        let r = RawCqe {
            cqe: c,
            copy: WcStatus::SUCCESS,
        };
        assert_eq!((r.l3_ok(), r.l4_ok(), r.vlan_tci()), (true, false, None));
        assert_eq!((r.l3_hdr_type(), r.l4_hdr_type()), (1, 4));
    }

    /// A receive CQE of a QP the CQ does not know (an XRC target QP, a DCT) goes to the SRQ
    /// routed by the CQE's user index; without a route, or for a requester CQE, nothing.
    #[test]
    fn unknown_qp_receives_are_routed_to_an_srq() {
        use crate::ledger::ScatterTarget;
        use crate::mem::DmaBuf;
        use crate::mem::wq::WqRing;
        const SRQ_UIDX: u32 = 0x42;
        const TGT_QPN: u32 = 0x99;
        let ring = WqRing::new(Arc::new(DmaBuf::new(4096).unwrap()), 0, 1024);
        let target = ScatterTarget::new(ring.reader(), 64, 16, 3, 1, Arc::default());
        let srq = Arc::new(SrqShared::new(16, target));
        srq.set_wr_id(5, 0x5555);
        let (mut local, _, _) = users(false);
        let mut recv = cqe(CqeOpcode::RESP_SEND, 0, 5);
        recv.sop_drop_qpn = Be32::new(TGT_QPN);
        recv.srqn_uidx = Be32::new(SRQ_UIDX);
        recv.byte_cnt = Be32::new(12);
        let mut pending = None;
        assert!(
            decode(&local, true, &mut pending, &recv).is_none(),
            "no route yet"
        );
        local.push(CqUser {
            qpn: ROUTED,
            uidx: SRQ_UIDX,
            sq: None,
            rq: None,
            srq: Some(srq.clone()),
            fence: None,
        });
        let wc = decode(&local, true, &mut pending, &recv).unwrap();
        assert_eq!(
            (wc.wr_id, wc.opcode, wc.byte_len, wc.qp_num, wc.status),
            (0x5555, WcOpcode::RECV, 12, TGT_QPN, WcStatus::SUCCESS)
        );
        assert!(srq.take_freed(5), "the SRQ WQE is freed");
        // An error CQE of the routed SRQ names the CQE's QPN too.
        let mut err = recv;
        err.op_own = op_own(CqeOpcode::RESP_ERR, 0, false, 0);
        let wc = decode(&local, true, &mut pending, &err).unwrap();
        assert_eq!((wc.wr_id, wc.qp_num), (0x5555, TGT_QPN));
        assert_ne!(wc.status, WcStatus::SUCCESS);
        assert!(srq.take_freed(5));
        // Another user index, or a requester CQE for the route: no completion.
        let mut other = recv;
        other.srqn_uidx = Be32::new(SRQ_UIDX + 1);
        let mut req = recv;
        req.op_own = op_own(CqeOpcode::REQ, 0, false, 0);
        for c in [other, req] {
            assert!(decode(&local, true, &mut pending, &c).is_none());
        }
        assert!(!srq.take_freed(5));
    }

    #[test]
    fn srq_routes_reach_the_poller_and_can_be_removed() {
        use crate::ledger::ScatterTarget;
        use crate::mem::DmaBuf;
        use crate::mem::wq::WqRing;
        let ctx = crate::emulator::Hca::first_or_emulated().open().unwrap();
        let mut cq = Cq::new(&ctx, CqInit::default(), None).unwrap();
        let ring = WqRing::new(Arc::new(DmaBuf::new(4096).unwrap()), 0, 1024);
        let target = ScatterTarget::new(ring.reader(), 64, 16, 3, 1, Arc::default());
        let srq = Arc::new(SrqShared::new(16, target));
        assert_eq!(ctx.cqe_version(), 1);
        cq.shared().route_srq(0x42, srq.clone()).unwrap();
        cq.shared().route_srq(0x43, srq.clone()).unwrap();
        cq.shared().route_srq(0x42, srq).unwrap();
        cq.core.refresh();
        let keys: Vec<(u32, u32)> = cq.core.users.list.iter().map(|u| (u.qpn, u.uidx)).collect();
        assert_eq!(
            keys,
            [(ROUTED, 0x43), (ROUTED, 0x42)],
            "a route replaces its key's"
        );
        cq.shared().unroute_srq(0x43);
        // A detach of any QP number leaves the routes alone.
        cq.shared().detach(0x43);
        cq.core.refresh();
        assert!(cq.core.users.find(0x43).is_none());
        assert!(cq.core.users.find(0x42).is_some_and(|u| u.srq.is_some()));
        assert_eq!(cq.poll(&mut [WorkCompletion::default(); 4]), 0);
    }
}
