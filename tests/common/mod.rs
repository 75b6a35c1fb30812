//! Test rig: the same scenario bodies run on the in-process emulator (default) or on a real
//! ConnectX named by `MLX5_TEST_DEVICE` (tests marked `#[ignore]`).
#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use mlx5::{
    Access, Context, Cq, CqInit, DmaBuf, Mr, Pd, Qp, QpCap, QpInitAttr, QpType, RemoteQp,
    WorkCompletion,
};
use mlx5_emu::{Counters, EmuConfig, Emulator, RunMode};

/// Where the scenario runs.
pub trait Rig {
    /// Open a context on side `side` (0 or 1).
    fn open(&self, side: usize) -> Context;
    /// Let the device make progress (stepped emulator: one step; otherwise a pause).
    fn progress(&self);
    /// Device counters of side `side`, if the rig has them (emulator).
    fn counters(&self, side: usize) -> Option<Counters>;
    /// Whether progress is deterministic (stepped emulator).
    fn stepped(&self) -> bool;
}

/// The emulator, two HCAs connected by its fabric.
pub struct EmuRig {
    pub emu: Emulator,
    mode: RunMode,
}

impl EmuRig {
    pub fn stepped() -> Self {
        Self::with(EmuConfig {
            num_hcas: 2,
            mode: RunMode::Stepped,
            ..EmuConfig::default()
        })
    }

    pub fn threaded() -> Self {
        Self::with(EmuConfig {
            num_hcas: 2,
            mode: RunMode::Threaded,
            ..EmuConfig::default()
        })
    }

    /// Two HCAs with RoCE (Ethernet) ports, stepped.
    pub fn roce() -> Self {
        Self::with(EmuConfig {
            num_hcas: 2,
            mode: RunMode::Stepped,
            link_layer: mlx5_emu::LinkLayer::Ethernet,
            ..EmuConfig::default()
        })
    }

    pub fn with(cfg: EmuConfig) -> Self {
        let mode = cfg.mode;
        Self {
            emu: Emulator::new(cfg),
            mode,
        }
    }
}

impl Rig for EmuRig {
    fn open(&self, side: usize) -> Context {
        let s = self.emu.open(side).expect("emulator open");
        Context::open(s).expect("Context::open on the emulator")
    }
    fn progress(&self) {
        match self.mode {
            RunMode::Stepped => {
                self.emu.step();
            }
            RunMode::Threaded => std::thread::yield_now(),
        }
    }
    fn counters(&self, side: usize) -> Option<Counters> {
        Some(self.emu.counters(side))
    }
    fn stepped(&self) -> bool {
        self.mode == RunMode::Stepped
    }
}

/// A real NIC (both sides on the same device, looped back through its port).
pub struct HwRig {
    dev: mlx5::Device,
}

impl HwRig {
    /// `None` (and a note) when `MLX5_TEST_DEVICE` is not set: the test then does nothing.
    pub fn from_env() -> Option<Self> {
        let name = std::env::var("MLX5_TEST_DEVICE").ok()?;
        let dev = mlx5::Device::by_name(&name).expect("MLX5_TEST_DEVICE names no mlx5 device");
        eprintln!("hardware rig: {} ({})", dev.name, dev.dev_path.display());
        Some(Self { dev })
    }
}

impl Rig for HwRig {
    fn open(&self, _side: usize) -> Context {
        self.dev.open().expect("open the device")
    }
    fn progress(&self) {
        std::hint::spin_loop();
    }
    fn counters(&self, _side: usize) -> Option<Counters> {
        None
    }
    fn stepped(&self) -> bool {
        false
    }
}

/// Generate one emulator test and one `#[ignore]`d hardware test per scenario.
#[macro_export]
macro_rules! scenarios {
    ($($name:ident),* $(,)?) => {
        mod on_emulator {
            $(
                #[test]
                fn $name() {
                    super::$name(&$crate::common::EmuRig::stepped());
                }
            )*
        }
        mod on_hardware {
            $(
                #[test]
                #[ignore = "needs a ConnectX: set MLX5_TEST_DEVICE=mlx5_0"]
                fn $name() {
                    match $crate::common::HwRig::from_env() {
                        Some(rig) => super::$name(&rig),
                        None => eprintln!("MLX5_TEST_DEVICE not set; nothing to run"),
                    }
                }
            )*
        }
    };
}

/// One endpoint: context, PD, CQ, QP and a registered 64 KiB buffer.
pub struct Side {
    pub ctx: Context,
    pub pd: Pd,
    pub cq: Cq,
    pub qp: Qp,
    pub buf: Arc<DmaBuf>,
    pub mr: Mr,
}

pub const BUF_LEN: usize = 64 * 1024;

/// Options for building a pair.
#[derive(Clone, Copy)]
pub struct PairOpts {
    pub qp_type: QpType,
    pub cap: QpCap,
    pub access: Access,
    pub report_unsignaled: bool,
    pub rnr_retry: u8,
    pub cqe: u32,
    /// CQE size in bytes (64 or 128).
    pub cqe_size: u32,
    pub bf_policy: mlx5::BfPolicy,
    /// `QpInitAttr::scatter_to_cqe` (on by default, as in libmlx5).
    pub scatter_to_cqe: bool,
    /// `QpInitAttr::sq_sig_all`.
    pub sq_sig_all: bool,
}

impl PairOpts {
    /// The same options with these capabilities.
    pub fn caps(
        mut self,
        send_wr: u32,
        recv_wr: u32,
        send_sge: u32,
        recv_sge: u32,
        inline: u32,
    ) -> Self {
        self.cap = QpCap {
            max_send_wr: send_wr,
            max_recv_wr: recv_wr,
            max_send_sge: send_sge,
            max_recv_sge: recv_sge,
            max_inline_data: inline,
        };
        self
    }

    pub fn new(qp_type: QpType) -> Self {
        Self {
            qp_type,
            cap: QpCap {
                max_send_wr: 64,
                max_recv_wr: 64,
                max_send_sge: 4,
                max_recv_sge: 4,
                max_inline_data: 128,
            },
            access: Access::ALL,
            report_unsignaled: false,
            rnr_retry: 7,
            cqe: 1024,
            cqe_size: 64,
            bf_policy: mlx5::BfPolicy::PreferBf,
            scatter_to_cqe: true,
            sq_sig_all: false,
        }
    }
}

pub fn side(rig: &dyn Rig, n: usize, o: &PairOpts) -> Side {
    let ctx = rig.open(n);
    let pd = Pd::new(&ctx).expect("alloc PD");
    let cq = Cq::new(
        &ctx,
        CqInit {
            cqe: o.cqe,
            cqe_size: o.cqe_size,
            ..CqInit::default()
        },
        None,
    )
    .expect("create CQ");
    let mut init = QpInitAttr::new(o.qp_type, &cq, &cq);
    init.cap = o.cap;
    init.report_unsignaled = o.report_unsignaled;
    init.bf_policy = o.bf_policy;
    init.scatter_to_cqe = o.scatter_to_cqe;
    init.sq_sig_all = o.sq_sig_all;
    let qp = Qp::new(&pd, &init).expect("create QP");
    let buf = Arc::new(DmaBuf::new(BUF_LEN).expect("buffer"));
    let mr = pd.reg_mr(&buf, o.access).expect("reg MR");
    Side {
        ctx,
        pd,
        cq,
        qp,
        buf,
        mr,
    }
}

pub const QKEY: u32 = 0x1111_1111;

/// Two connected endpoints (RC/UC: connected to each other; UD: both in RTS).
pub fn pair(rig: &dyn Rig, o: PairOpts) -> (Side, Side) {
    let mut a = side(rig, 0, &o);
    let mut b = side(rig, 1, &o);
    connect(
        (&mut a.qp, &a.ctx),
        (&mut b.qp, &b.ctx),
        o.access,
        o.rnr_retry,
    );
    (a, b)
}

/// How `qp` on `ctx` is reached: QPN, its send PSN, LID and (RoCE) GID with its index.
pub fn address(qp: &Qp, ctx: &Context, psn: u32) -> (RemoteQp, u8) {
    let p = ctx.query_port(1).expect("query port");
    // RoCE needs a GRH: use the port's RoCE v2 GID (its index is the source GID index).
    let g = if p.is_roce() {
        ctx.find_gid(1).expect("gid table")
    } else {
        None
    };
    let remote = RemoteQp {
        qpn: qp.qpn(),
        psn,
        lid: p.lid,
        gid: g.map(|g| g.1),
    };
    (remote, g.map_or(0, |g| g.0 as u8))
}

/// Bring two QPs (each with its context) from RESET to RTS, connected to each other (RC/UC;
/// UD just reaches RTS). `a` sends with PSN 0x100, `b` with 0x200.
pub fn connect(a: (&mut Qp, &Context), b: (&mut Qp, &Context), access: Access, rnr_retry: u8) {
    let (ra, sgid_a) = address(a.0, a.1, 0x100);
    let (rb, sgid_b) = address(b.0, b.1, 0x200);
    for (qp, r, sgid) in [(&mut *a.0, &rb, sgid_a), (&mut *b.0, &ra, sgid_b)] {
        qp.to_init_with(1, access, QKEY, &Default::default())
            .expect("to INIT");
        qp.to_rtr(r, 3, sgid).expect("to RTR");
    }
    a.0.to_rts(0x100, rnr_retry).expect("to RTS");
    b.0.to_rts(0x200, rnr_retry).expect("to RTS");
}

/// Poll `cq` until `n` completions arrived (driving the rig); panics after a bound.
pub fn poll_n(rig: &dyn Rig, cq: &mut Cq, n: usize) -> Vec<WorkCompletion> {
    let mut out = Vec::with_capacity(n);
    let mut wcs = [WorkCompletion::default(); 32];
    let deadline = Instant::now() + Duration::from_secs(20);
    while out.len() < n {
        let k = cq.poll(&mut wcs[..(n - out.len()).min(32)]);
        out.extend_from_slice(&wcs[..k]);
        if k == 0 {
            assert!(
                Instant::now() < deadline,
                "timed out: {} of {n} completions: {out:?}",
                out.len()
            );
            rig.progress();
        }
    }
    out
}

/// Drive the rig for a while and return whatever completions arrive (used to show that
/// nothing more comes).
pub fn drain(rig: &dyn Rig, cq: &mut Cq, rounds: usize) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    let mut wcs = [WorkCompletion::default(); 32];
    for _ in 0..rounds {
        rig.progress();
        let k = cq.poll(&mut wcs);
        out.extend_from_slice(&wcs[..k]);
    }
    out
}

/// Run `f` with `cq` converted into the low-level poller (a placeholder CQ on `ctx` stands in
/// meanwhile), then convert it back: a CQ is polled through one API at a time.
pub fn with_raw<R>(cq: &mut Cq, ctx: &Context, f: impl FnOnce(&mut mlx5::RawCq) -> R) -> R {
    let stand_in = Cq::new(
        ctx,
        CqInit {
            cqe: 1,
            ..CqInit::default()
        },
        None,
    )
    .expect("CQ");
    let verbs = std::mem::replace(cq, stand_in);
    let mut raw = verbs
        .into_raw()
        .unwrap_or_else(|_| panic!("unsignaled reports pending"));
    let r = f(&mut raw);
    *cq = raw.into_verbs();
    r
}
