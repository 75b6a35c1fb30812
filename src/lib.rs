//! A user-space kernel-bypass provider driver for NVIDIA ConnectX (mlx5) NICs.
//!
//! The kernel is used only to create objects through ib_uverbs; the data path is ours: WQE
//! segments built straight into the send-queue ring, doorbell records, BlueFlame or 8-byte
//! doorbell MMIO writes with barriers named by intent, and CQEs parsed from the completion ring.
//!
//! ```text
//!  objects   Context  Pd/Mr  Cq  Qp(SendQueue, RecvQueue)  Srq  Ah  CompChannel   (safe)
//!     |         \______ control path: uverbs commands (src/uverbs) ______/
//!  queues    qp::sq (WQE builder, doorbell)  qp::rq  cq (poll, arm)              (safe policy)
//!     |
//!  memory    mem: DmaBuf, WqRing, CqBuf, DbRec, UarPage              (crate-private, unsafe allowed)
//!  MMIO      mmio: barrier::{to_device, from_device, wc_start, ...}, access (crate-private, unsafe)
//!     |
//!  kernel    mlx5_ffi::surface::UverbsSurface: /dev/infiniband/uverbsN or the emulator
//! ```
//!
//! Two API levels: the ibverbs-shaped one ([`SendWr`], [`RecvWr`], [`Sge`],
//! [`WorkCompletion`], chains as slices) and beneath it the zero-overhead one
//! ([`SendQueue::send`] and the other operation starts → segments → [`WqeBuilder::finish`] →
//! [`SendQueue::ring`]; [`Cq::into_raw`] → [`RawCq::next`] / [`RawCq::publish_ci`]). Neither
//! allocates or locks on the fast path; posting takes `&mut self`; [`Qp::split`] hands out the
//! send and receive halves for two threads.
//!
//! # Public surface
//! Everything a program needs is re-exported at the crate root; the object modules ([`ah`],
//! [`context`], [`cq`], [`device`], [`error`], [`pd`], [`qp`], [`srq`], [`wr`]) are public for
//! their less common items (AV helpers, geometry functions, ABI version bounds).
//! - **Objects**: [`Device`], [`Context`], [`Pd`], [`Mr`], [`Cq`], [`Qp`], [`Srq`], [`Ah`],
//!   [`CompChannel`], and the memory they use: [`DmaBuf`], [`UserMemory`] (with its `unsafe`
//!   constructor, the one place where the caller vouches for memory), [`HugePolicy`],
//!   [`Backing`]. Objects handed to one another must come from one [`Context`]
//!   ([`Error::ContextMismatch`] otherwise, before any syscall).
//! - **Connection setup**: [`Qp::modify`] against the verbs state machine ([`QpState`],
//!   [`QpAttr`], [`Error::QpTransition`], [`Error::QpAttribute`]), or the typed
//!   [`ConnectParams`] builder with [`Qp::to_init_with`] / [`Qp::to_rtr_with`] /
//!   [`Qp::to_rts_with`] and a typed [`Mtu`].
//! - **The two API levels** described above, and their errors: [`PostError`] on the fast path,
//!   [`Error`] on the control path; error completions are data ([`WcStatus`], [`Syndrome`]).
//! - **No NIC**: with the cargo feature `emulator`, `mlx5::emulator` opens contexts on the
//!   emulated ConnectX HCA in the process (`Hca::first_or_emulated`, `open_emulated`); any
//!   program reaches it unchanged through `mlx5 emu run`, whose `SYSFS_PATH` [`devices`]
//!   follows.
//! - **ABI re-exports**: [`ffi`] (the uverbs/mlx5 kernel ABI and the
//!   [`UverbsSurface`](ffi::surface::UverbsSurface) trait a program may implement, `unsafe`)
//!   and [`hw`] (device layouts: WQE segments, [`Cqe64`](hw::cqe::Cqe64) with its
//!   [`ErrCqe`](hw::cqe::ErrCqe) view through [`Cqe64::as_err`](hw::cqe::Cqe64::as_err),
//!   opcodes), for the low-level API and for decoding.
//!
//! Not public: the raw rings, doorbell records, UAR registers, barriers and ring arithmetic
//! (`mem`, `mmio`, `ring`) and the command layer (`uverbs`). Their functions rely on invariants
//! (an offset inside a mapping, a register's length, a command's response buffer) that only the
//! driver establishes, so no safe public path leads to them; `tests/ui/ctl_internals_private.rs`
//! checks that they stay unreachable. `docs/safety.md` gives the soundness argument of the
//! public safe API.
//!
//! # Scope and deliberate differences from libmlx5
//! - Transports RC, UC and UD; operations SEND (+IMM, +INV), RDMA WRITE (+IMM), RDMA READ,
//!   8-byte compare-and-swap and fetch-and-add. No UMR-based operations (LOCAL_INV, BIND_MW),
//!   so the RC WQE overhead is 48 bytes, not libmlx5's 192 ([`qp::sq_overhead`]).
//! - Inline payloads are Rust slices ([`SendWr::inline`]); the CPU never reads raw SGE
//!   addresses, so inline posting stays safe code.
//! - Scatter-to-CQE is requested by default, as libmlx5 does ([`QpInitAttr::scatter_to_cqe`]):
//!   [`Cq::poll`] and [`RawCq::next`] copy payloads the device put in a CQE into the WQE's
//!   scatter list (RQ, SRQ, and READ/atomic results on `sq_sig_all` requesters), checking
//!   every destination against the registered memory regions first (through a last-hit cache:
//!   no lock in steady state). CQE compression is never enabled.
//! - A doorbell register shared by several QPs is used with 8-byte doorbells only (BlueFlame
//!   needs a lock there); [`Context::bfreg_users`] shows the sharing.
//! - CQ rings are never rewritten behind the poller ("CQ clean"): drain a QP's CQs before
//!   moving it to RESET. CQE-v1 user indices are handed out round-robin, so CQEs of a
//!   destroyed QP are never attributed to a new one.
//! - Unsignaled send WRs can be reported as completions when a later CQE retires them
//!   ([`QpInitAttr::report_unsignaled`]).
//!
//! One RC QP connected to itself through its port sends "hello" into its own receive queue
//! (`examples/` has complete programs: ping-pong on both API levels, RDMA WRITE with
//! immediate, an error completion explained):
//!
//! ```
//! use std::sync::Arc;
//! use mlx5::{Access, Cq, CqInit, DmaBuf, Pd, Qp, QpInitAttr, QpType, RecvWr, RemoteQp};
//! use mlx5::{SendFlags, SendWr, WorkCompletion};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // The first ConnectX that discovery finds (`mlx5::devices()`), else the emulated HCA in
//! // this process (cargo feature `emulator`). Without the feature:
//! // `mlx5::devices()?.first().ok_or("no mlx5 device")?.open()?`.
//! let ctx = mlx5::emulator::Hca::first_or_emulated().open()?;
//! let pd = Pd::new(&ctx)?;
//! let mut cq = Cq::new(&ctx, CqInit::default(), None)?;
//! let mut qp = Qp::new(&pd, &QpInitAttr::new(QpType::Rc, &cq, &cq))?;
//! let buf = Arc::new(DmaBuf::new(4096)?);
//! let mr = pd.reg_mr(&buf, Access::LOCAL_WRITE)?;
//! let port = ctx.query_port(1)?;
//! let gid = if port.is_roce() { ctx.find_gid(1)? } else { None }; // RoCE needs a GID
//! let me = RemoteQp { qpn: qp.qpn(), psn: 0, lid: port.lid, gid: gid.map(|g| g.1) };
//! qp.to_init(1, Access::LOCAL_WRITE)?;
//! qp.to_rtr(&me, mlx5::Mtu::M1024, gid.map_or(0, |g| g.0 as u8))?; // loopback
//! qp.to_rts(0, 0)?; // rnr_retry 0: a SEND without a receive posted fails at once
//! // The receive first (bytes 1024..), then the SEND of bytes 0..5.
//! qp.post_recv(&[RecvWr { wr_id: 2, sg_list: &[mr.sge(1024, 64)] }]).map_err(|(_, e)| e)?;
//! buf.write(0, b"hello");
//! let sge = [mr.sge(0, 5)];
//! qp.post_send(&[SendWr::send(1, &sge, SendFlags::SIGNALED)]).map_err(|(_, e)| e)?;
//! // Two completions: the SEND's and the receive's (bounded wait).
//! let mut wcs = [WorkCompletion::default(); 2];
//! let (mut n, start) = (0, std::time::Instant::now());
//! while n < 2 && start.elapsed().as_secs() < 10 {
//!     n += cq.poll(&mut wcs[n..]);
//! }
//! assert!(n == 2 && wcs.iter().all(|wc| wc.is_ok()), "{wcs:?}");
//! let mut got = [0u8; 5];
//! buf.read(1024, &mut got);
//! assert_eq!(&got, b"hello");
//! # Ok(())
//! # }
//! ```
#![deny(unsafe_code)]
#![warn(missing_docs)]
#![warn(unnameable_types)]

#[cfg(not(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
)))]
compile_error!("mlx5 supports Linux on x86_64 and aarch64 only (64-bit single-store doorbells)");

pub mod ah;
pub mod cm;
pub mod context;
pub mod cq;
pub mod dc;
pub mod device;
#[cfg(feature = "emulator")]
pub mod emulator;
pub mod error;
pub mod flow;
mod ledger;
// Internals: raw memory, MMIO and ring arithmetic. Crate-private, because their functions rely on
// invariants (offsets inside a mapping, a register's length) that only the driver establishes;
// the user-facing memory types are re-exported below. Items that only tests or other halves of
// the crate use are allowed to be unused here while the data path is reworked.
#[allow(dead_code)]
pub(crate) mod mem;
#[allow(dead_code)]
pub(crate) mod mmio;
pub mod pd;
pub mod qp;
pub mod raw;
pub mod recorder;
#[allow(dead_code)]
pub(crate) mod ring;
pub mod srq;
mod types;
mod uverbs;
mod wc_fmt;
pub mod wr;
pub mod xrc;

pub use ah::{Ah, AhAttr, GlobalRoute};
pub use context::{
    AsyncEvent, AsyncEventKind, CompChannel, Context, ContextConfig, DeviceAttr, GidEntry,
    PortAttr, UarMode, with_user_handle,
};
pub use cq::{Cq, CqInit, CqeKind, RawCq, RawCqe};
pub use dc::{DcAddr, DcWr, Dci, DciStreams, Dct};
pub use device::{Device, devices};
pub use error::{Error, Result};
pub use mem::dma_buf::UserMemory;
pub use mem::{Backing, DmaBuf, HugePolicy};
pub use pd::{Access, Mr, Pd};
pub use qp::{AnyPayload, Gather, Inline, NoPayload, PayloadKind};
pub use qp::{BfPolicy, BfregInfo, RecvQueue, SendQueue, SqStats, UncheckedBatch, WqeBuilder};
pub use qp::{ConnectParams, Mtu, Qp, QpAttr, QpCap, QpInitAttr, QpState, QpType, RemoteQp};
pub use recorder::{RecorderCallback, RecorderConfig, RecorderDump};
pub use srq::Srq;
pub use wr::{
    PostError, RecvWr, SendFlags, SendWr, Sge, Syndrome, UD_GRH_BYTES, UdDest, VendorSyndrome,
    WcFlags, WcOpcode, WcStatus, WorkCompletion, WrOp,
};
pub use xrc::{XrcDomain, XrcSendQp, XrcSrq, XrcSrqNum, XrcTgtQp, XrcWr, XrcdOpen};

/// Re-exports of the ABI crates, for users of the low-level API.
pub use mlx5_ffi as ffi;
pub use mlx5_hw as hw;

#[cfg(test)]
mod thread_safety {
    //! Queues are `Send` (move them to the polling thread) but not `Sync` (one user at a time;
    //! share one behind a mutex if you must).

    fn assert_send<T: Send>() {}

    trait AmbiguousIfSync<A> {
        fn check() {}
    }
    impl<T: ?Sized> AmbiguousIfSync<()> for T {}
    impl<T: ?Sized + Sync> AmbiguousIfSync<u8> for T {}

    #[test]
    fn queues_are_send_not_sync() {
        assert_send::<crate::Qp>();
        assert_send::<crate::Cq>();
        assert_send::<crate::Srq>();
        assert_send::<crate::SendQueue>();
        assert_send::<crate::RecvQueue>();
        assert_send::<crate::Context>();
        // Each line fails to compile (ambiguous impl) if the type were `Sync`.
        <crate::Qp as AmbiguousIfSync<_>>::check();
        <crate::Cq as AmbiguousIfSync<_>>::check();
        <crate::Srq as AmbiguousIfSync<_>>::check();
        <crate::SendQueue as AmbiguousIfSync<_>>::check();
        <crate::RecvQueue as AmbiguousIfSync<_>>::check();
    }
}
