//! The testbed over the `mlx5` driver: a real device when one is present, otherwise the
//! emulated ConnectX (`mlx5-emu`). Two RC QPs in one context, connected to each other.
//!
//! Buffer layout of each end: `[tx area | rx area]`, each `max_size` bytes (64-byte aligned).
//! SEND and WRITE go from the local tx area to the peer's rx area; READ fetches the peer's tx
//! area into the local rx area; atomics operate on the first 8 bytes of the peer's rx area and
//! return the old value into the local rx area.

use std::sync::Arc;
use std::sync::atomic::{Ordering, fence};

use mlx5::{
    Access, Ah, AhAttr, Backing, BfPolicy, CompChannel, ConnectParams, Context, Cq, CqInit, DmaBuf,
    GlobalRoute, HugePolicy, Mr, Mtu, Pd, Qp, QpCap, QpInitAttr, QpState, QpType, RecvWr, RemoteQp,
    SendFlags, SendWr, UdDest, WorkCompletion, WrOp,
};

use crate::cli::Conn;

/// perftest's Q_Key of UD QPs (`DEF_QKEY`).
pub const UD_QKEY: u32 = 0x1111_1111;
/// Bytes a UD receive buffer holds before the payload: the GRH, present or not.
pub const UD_GRH: usize = 40;
use mlx5_emu::{Counters, EmuConfig, Emulator, Fabric, LinkLayer};

use crate::app::{Testbed, TestbedConfig};
use crate::bench::{BenchResult, Op, Side, Wr};
use crate::report::Endpoint;

/// The least size of each buffer area: perftest's cycle buffer (a page), over which its
/// binaries spread the WRs of small messages in the peer's window.
pub const PEER_CYCLE_BUFFER: usize = 4096;

/// Most WRs posted with one doorbell (`-l`).
pub const MAX_POST_LIST: u32 = 64;
/// How long a blocking wait for a completion event may take before the run fails.
const EVENT_TIMEOUT_MS: i32 = 5000;

/// Emulator counters reported in JSON and by `--counters`.
const EMU_COUNTER_NAMES: [&str; 12] = [
    "doorbells",
    "bf_writes",
    "bf_mismatches",
    "doorbell_drops",
    "wqes_executed",
    "inline_wqes",
    "cqes_written",
    "cq_arms",
    "comp_events",
    "async_events",
    "packets_sent",
    "packets_dropped",
];

pub(crate) fn err(what: &str) -> impl FnOnce(mlx5::Error) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// ibv_mtu enum value of an MTU in bytes (256 -> 1 ... 4096 -> 5).
fn mtu_enum(bytes: u32) -> u8 {
    match bytes {
        256 => 1,
        512 => 2,
        1024 => 3,
        2048 => 4,
        _ => 5,
    }
}

/// Where the test runs.
enum Target {
    Real(mlx5::Device),
    Emulated(Emulator),
}

/// Picks a real device (by name, or the first) unless `force_emu` or none exists.
fn pick(cfg: &TestbedConfig) -> Result<Target, String> {
    let dev = cfg.dev.as_deref();
    if !cfg.force_emu {
        if let Ok(list) = mlx5::devices() {
            let found = match dev {
                Some(name) => list.into_iter().find(|d| d.name == name),
                None => list.into_iter().next(),
            };
            if let Some(d) = found {
                if cfg.pcap.is_some() {
                    return Err("--pcap captures the emulator's fabric; add --emu".into());
                }
                return Ok(Target::Real(d));
            }
        }
    }
    let fabric = if cfg.cross_process {
        Fabric::Udp
    } else {
        Fabric::InProcess
    };
    let emu = Emulator::try_new(EmuConfig {
        fabric,
        pcap: cfg.pcap.clone(),
        link_layer: emu_link_layer()?,
        ..EmuConfig::default()
    })
    .map_err(|e| format!("--pcap: {e}"))?;
    if let Some(name) = dev {
        let known = (0..emu.num_hcas()).any(|i| emu.hca_info(i).is_some_and(|h| h.name == name));
        if !known {
            return Err(format!(
                "no device {name:?} (neither a real mlx5 device nor the emulated one)"
            ));
        }
    }
    Ok(Target::Emulated(emu))
}

/// The emulated port's link layer: `MLX5_EMU_LINK_LAYER` as the preload shim reads it
/// (`ib`, the default, or `eth`/`ethernet`/`roce` for a RoCE port), so that our tool and
/// rdma-core programs under the shim see the same kind of port.
fn emu_link_layer() -> Result<LinkLayer, String> {
    match std::env::var("MLX5_EMU_LINK_LAYER") {
        Err(_) => Ok(LinkLayer::InfiniBand),
        Ok(v) => match v.to_ascii_lowercase().as_str() {
            "" | "ib" | "infiniband" => Ok(LinkLayer::InfiniBand),
            "eth" | "ethernet" | "roce" => Ok(LinkLayer::Ethernet),
            other => Err(format!(
                "MLX5_EMU_LINK_LAYER={other:?}: expected ib or eth (ethernet, roce)"
            )),
        },
    }
}

/// One end: a QP with its CQs, completion channels and buffer.
struct End {
    qp: Qp,
    send_cq: Cq,
    recv_cq: Cq,
    channels: Option<[Arc<CompChannel>; 2]>,
    buf: Arc<DmaBuf>,
    mr: Mr,
    /// Copy of the tx area: the source of inline payloads.
    shadow: Vec<u8>,
    area: usize,
    remote_addr: u64,
    remote_rkey: u32,
    wr_id: u64,
    /// Receives posted and not yet completed.
    recv_outstanding: u32,
    /// `--cpu_cost`: per-call times of the driver calls.
    cost: Option<Box<crate::cost::CostLog>>,
    wcs: [WorkCompletion; 16],
    psn: u32,
    /// Port the QP uses (1-based).
    port: u8,
    /// Source GID index of the path (with a GRH).
    sgid_index: u8,
    /// SENDs go out of the rx area (ibv_rc_pingpong's single buffer: each side echoes what it
    /// last received).
    echo: bool,
    /// Transport.
    conn: Conn,
    /// Service level of the path.
    sl: u8,
    /// RC retransmission timeout exponent.
    timeout: u8,
    /// UD: the protection domain (for the address handle) and, once connected, the peer's
    /// address handle and QP number.
    pd: Pd,
    ud_peer: Option<(Ah, u32)>,
}

impl End {
    fn new(ctx: &Context, pd: &Pd, cfg: &TestbedConfig) -> Result<Self, String> {
        // UD receives land after the 40-byte GRH slot
        let grh = if cfg.conn == Conn::Ud { UD_GRH } else { 0 };
        // at least a page: perftest's peer spreads small WRITEs, READs and atomics over a
        // page-sized "cycle buffer" of the window it was given
        let area = (cfg.max_size as usize + grh)
            .max(PEER_CYCLE_BUFFER)
            .next_multiple_of(64);
        let policy = if cfg.hugepages {
            HugePolicy::Auto
        } else {
            HugePolicy::None
        };
        let buf = Arc::new(DmaBuf::with_policy(2 * area, policy).map_err(err("buffer"))?);
        let mr = pd.reg_mr(&buf, Access::ALL).map_err(err("REG_MR"))?;
        let channel = || -> Result<Arc<CompChannel>, String> {
            Ok(Arc::new(
                ctx.create_comp_channel()
                    .map_err(err("completion channel"))?,
            ))
        };
        // one channel per CQ: [send, receive]
        let channels = if cfg.events {
            Some([channel()?, channel()?])
        } else {
            None
        };
        let cq = |depth: u32, which: usize| {
            let init = CqInit {
                cqe: depth.max(16),
                ..CqInit::default()
            };
            Cq::new(ctx, init, channels.as_ref().map(|c| &c[which])).map_err(err("CREATE_CQ"))
        };
        let send_cq = cq(cfg.sq_depth, 0)?;
        let recv_cq = cq(cfg.rq_depth, 1)?;
        let qp_type = match cfg.conn {
            Conn::Uc => QpType::Uc,
            Conn::Ud => QpType::Ud,
            _ => QpType::Rc,
        };
        let mut init = QpInitAttr::new(qp_type, &send_cq, &recv_cq);
        init.cap = QpCap {
            max_send_wr: cfg.sq_depth,
            max_recv_wr: cfg.rq_depth,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: cfg.max_inline,
        };
        init.bf_policy = if cfg.bf == Some(false) {
            BfPolicy::AlwaysDoorbell
        } else {
            BfPolicy::PreferBf
        };
        let qp = Qp::new(pd, &init).map_err(err("CREATE_QP"))?;
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let psn = (seed ^ qp.qpn().wrapping_mul(0x9E37_79B9)) & 0xFF_FFFF;
        Ok(Self {
            qp,
            send_cq,
            recv_cq,
            channels,
            buf,
            mr,
            shadow: vec![0; area],
            area,
            remote_addr: 0,
            remote_rkey: 0,
            wr_id: 0,
            recv_outstanding: 0,
            cost: cfg.cpu_cost.then(Box::default),
            wcs: [WorkCompletion::default(); 16],
            psn,
            port: cfg.ib_port,
            // set from the opened device by the caller
            sgid_index: 0,
            echo: cfg.echo,
            conn: cfg.conn,
            sl: cfg.sl,
            timeout: cfg.timeout,
            pd: pd.clone(),
            ud_peer: None,
        })
    }

    fn endpoint(&self, lid: u16, gid: Option<[u8; 16]>) -> Endpoint {
        Endpoint {
            lid,
            qpn: self.qp.qpn(),
            psn: self.psn,
            rkey_vaddr: Some((self.mr.rkey(), self.mr.addr() + self.area as u64)),
            gid,
        }
    }

    fn poll(&mut self, recv: bool, max: usize) -> BenchResult<usize> {
        let max = max.clamp(1, self.wcs.len());
        let cq = if recv {
            &mut self.recv_cq
        } else {
            &mut self.send_cq
        };
        let t0 = std::time::Instant::now();
        let n = cq.poll(&mut self.wcs[..max]);
        if let Some(c) = &mut self.cost {
            c.poll(crate::cost::ns_since(t0), n);
        }
        if recv {
            self.recv_outstanding = self.recv_outstanding.saturating_sub(n as u32);
        }
        if let Some(bad) = self.wcs[..n].iter().find(|wc| !wc.is_ok()) {
            return Err(format!(
                "error completion on QP {:#x}: status {:?}, syndrome {:?} ({}), vendor syndrome {:?}",
                bad.qp_num,
                bad.status,
                bad.syndrome,
                bad.syndrome.meaning().unwrap_or("unknown syndrome"),
                bad.vendor_err
            ));
        }
        Ok(n)
    }
}

impl Side for End {
    fn post_send(&mut self, wrs: &[Wr]) -> BenchResult<()> {
        let Some(first) = wrs.first() else {
            return Ok(());
        };
        if wrs.len() > MAX_POST_LIST as usize {
            return Err(format!("post list {} exceeds {MAX_POST_LIST}", wrs.len()));
        }
        let len = first.len.min(self.area as u32);
        let (op, local_off) = match first.op {
            Op::Send if self.echo => (WrOp::Send, self.area as u64),
            Op::Send => (WrOp::Send, 0),
            Op::Write => (
                WrOp::Write {
                    raddr: self.remote_addr,
                    rkey: self.remote_rkey,
                },
                0,
            ),
            // READ fetches the peer's tx area (rx area start - area) into our rx area
            Op::Read => (
                WrOp::Read {
                    raddr: self.remote_addr - self.area as u64,
                    rkey: self.remote_rkey,
                },
                self.area as u64,
            ),
            Op::FetchAdd => (
                WrOp::FetchAdd {
                    raddr: self.remote_addr,
                    rkey: self.remote_rkey,
                    add: 1,
                },
                self.area as u64,
            ),
            Op::CmpSwap => (
                WrOp::CompareSwap {
                    raddr: self.remote_addr,
                    rkey: self.remote_rkey,
                    compare: 0,
                    swap: 0,
                },
                self.area as u64,
            ),
        };
        let sge = [self.mr.sge(local_off, len)];
        let inline_data: [&[u8]; 1] = [&self.shadow[..len as usize]];
        let mut template = SendWr::new(0, op, &sge, SendFlags::NONE);
        if let Some((ah, qpn)) = &self.ud_peer {
            template = template.to(UdDest {
                ah,
                remote_qpn: *qpn,
                remote_qkey: UD_QKEY,
            });
        } else if self.conn == Conn::Ud {
            return Err("UD: no peer address yet".into());
        }
        let mut chain = [template; MAX_POST_LIST as usize];
        for (slot, wr) in chain.iter_mut().zip(wrs) {
            self.wr_id += 1;
            slot.wr_id = self.wr_id;
            if wr.signaled {
                slot.flags |= SendFlags::SIGNALED;
            }
            // inline payloads come from the tx area's shadow; echoed SENDs are never inline
            if wr.inline && !self.echo {
                *slot = slot.with_inline(&inline_data);
            }
        }
        let t0 = std::time::Instant::now();
        let r = self.qp.post_send(&chain[..wrs.len()]);
        if let Some(c) = &mut self.cost {
            c.post(crate::cost::ns_since(t0), wrs.len());
        }
        r.map_err(|(i, e)| format!("post_send (WR {i} of {}): {e}", wrs.len()))
    }

    fn post_recv(&mut self, n: u32, _len: u32) -> BenchResult<()> {
        // The whole rx area, whatever this run's size: receives left posted by one size of
        // `-a` must take the next, larger size too.
        let sge = [self.mr.sge(self.area as u64, self.area as u32)];
        let mut left = n;
        while left > 0 {
            let k = left.min(MAX_POST_LIST);
            let template = RecvWr {
                wr_id: 0,
                sg_list: &sge,
            };
            let chain = [template; MAX_POST_LIST as usize];
            self.qp
                .post_recv(&chain[..k as usize])
                .map_err(|(i, e)| format!("post_recv (WR {i}): {e}"))?;
            self.recv_outstanding += k;
            left -= k;
        }
        Ok(())
    }

    fn recv_outstanding(&self) -> u32 {
        self.recv_outstanding
    }

    fn poll_send(&mut self, max: usize) -> BenchResult<usize> {
        self.poll(false, max)
    }

    fn poll_recv(&mut self, max: usize) -> BenchResult<usize> {
        self.poll(true, max)
    }

    fn arm(&mut self, recv: bool) -> BenchResult<()> {
        arm_cq(&mut self.send_cq, &mut self.recv_cq, recv);
        Ok(())
    }

    fn wait_event(&mut self, recv: bool) -> BenchResult<()> {
        wait_cq_event(
            &mut self.send_cq,
            &mut self.recv_cq,
            self.channels.as_ref(),
            recv,
        )
    }

    fn read_byte(&self, off: usize) -> u8 {
        let mut b = [0u8];
        read_area(&self.buf, self.area + off, &mut b);
        b[0]
    }

    fn write_byte(&mut self, off: usize, v: u8) {
        self.shadow[off] = v;
        self.buf.write(off, &[v]);
    }

    fn read_rx(&self, off: usize, out: &mut [u8]) {
        read_area(&self.buf, self.area + off, out);
    }

    fn write_rx(&mut self, off: usize, data: &[u8]) {
        self.buf.write(self.area + off, data);
    }
}

/// An end's `arm`: ask for a completion event on its receive (`recv`) or send CQ.
pub(crate) fn arm_cq(send_cq: &mut Cq, recv_cq: &mut Cq, recv: bool) {
    if recv { recv_cq } else { send_cq }.req_notify(false);
}

/// An end's `wait_event`: the next event of the receive (`recv`) or send CQ on its channel
/// (`channels`: send, receive), at most [`EVENT_TIMEOUT_MS`].
pub(crate) fn wait_cq_event(
    send_cq: &mut Cq,
    recv_cq: &mut Cq,
    channels: Option<&[Arc<CompChannel>; 2]>,
    recv: bool,
) -> BenchResult<()> {
    let Some(ch) = channels else {
        return Err("event mode without completion channels".into());
    };
    let (cq, ch) = if recv {
        (recv_cq, &ch[1])
    } else {
        (send_cq, &ch[0])
    };
    match cq.wait(ch, EVENT_TIMEOUT_MS) {
        Ok(true) => Ok(()),
        Ok(false) => Err(format!("no completion event within {EVENT_TIMEOUT_MS} ms")),
        Err(e) => Err(format!("waiting for a completion event: {e}")),
    }
}

/// Read `out.len()` bytes of `buf` at `at`. The device writes the rx area behind the
/// compiler's back: the fence keeps the read inside the caller's polling loop.
pub(crate) fn read_area(buf: &DmaBuf, at: usize, out: &mut [u8]) {
    fence(Ordering::Acquire);
    buf.read(at, out);
}

/// Two connected RC QPs on one device.
pub struct DriverTestbed {
    // field order = drop order: QPs and CQs before the PD and context
    ends: [End; 2],
    _pd: Pd,
    _ctx: Context,
    emu: Option<Emulator>,
    device: String,
    lid: u16,
    gid: Option<[u8; 16]>,
    roce: bool,
    max_inline: u32,
    bf: bool,
}

impl std::fmt::Debug for DriverTestbed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DriverTestbed")
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}

impl Testbed for DriverTestbed {
    fn device(&self) -> String {
        self.device.clone()
    }
    fn emulated(&self) -> bool {
        self.emu.is_some()
    }
    fn bf(&self) -> bool {
        self.bf
    }
    fn max_inline(&self) -> u32 {
        self.max_inline
    }
    fn buffers(&self) -> String {
        self.ends[0].buffers()
    }
    fn endpoints(&self) -> (Endpoint, Endpoint) {
        (
            self.ends[0].endpoint(self.lid, self.gid),
            self.ends[1].endpoint(self.lid, self.gid),
        )
    }
    fn link(&self) -> (bool, Option<u8>) {
        (self.roce, self.gid.map(|_| self.ends[0].sgid_index))
    }
    fn sides(&mut self) -> (&mut dyn Side, &mut dyn Side) {
        let [a, b] = &mut self.ends;
        (a, b)
    }
    fn counters(&self) -> Option<serde_json::Value> {
        self.emu.as_ref().map(emu_counters_json)
    }
    fn emu_counters(&self) -> Option<Counters> {
        self.emu.as_ref().map(|e| e.counters(0))
    }
    fn driver_counters(&self) -> serde_json::Value {
        driver_counters_json(&[&self.ends[0], &self.ends[1]])
    }
    fn cost(&self) -> Option<crate::cost::CostLog> {
        merged_cost(&[&self.ends[0], &self.ends[1]])
    }
}

/// An opened device: context, PD and port addressing.
pub(crate) struct Opened {
    pub(crate) ctx: Context,
    pub(crate) emu: Option<Emulator>,
    pub(crate) device: String,
    pub(crate) lid: u16,
    pub(crate) gid: Option<[u8; 16]>,
    /// Source GID index of the paths (with `gid`).
    pub(crate) sgid_index: u8,
    pub(crate) roce: bool,
    pub(crate) mtu: u8,
}

pub(crate) fn open_device(cfg: &TestbedConfig) -> Result<Opened, String> {
    let (ctx, emu, device) = match pick(cfg)? {
        Target::Real(d) => {
            let ctx = d.open().map_err(|e| format!("{}: {e}", d.name))?;
            (ctx, None, d.name)
        }
        Target::Emulated(emu) => {
            let surface = emu.open(0).map_err(|e| format!("emulator: {e:?}"))?;
            let ctx = Context::open(surface).map_err(err("emulated context"))?;
            let name = emu
                .hca_info(0)
                .map_or_else(|| "mlx5_0".to_owned(), |h| h.name);
            (ctx, Some(emu), format!("{name} (emulated)"))
        }
    };
    let port_num = cfg.ib_port;
    let port = ctx
        .query_port(port_num)
        .map_err(|e| format!("QUERY_PORT {port_num}: {e}"))?;
    // a GID index given (-g/-x) puts a GRH on the path; RoCE always needs one: without an
    // index, as perftest, the port's RoCE v2 GID (IPv4-mapped preferred)
    let (sgid_index, gid) = match (cfg.gid_index, port.is_roce()) {
        (Some(i), _) => (
            i,
            Some(
                ctx.query_gid(port_num, u32::from(i))
                    .map_err(|e| format!("QUERY_GID {port_num}/{i}: {e}"))?,
            ),
        ),
        (None, true) => {
            let (i, g) = ctx
                .find_gid(port_num)
                .map_err(err("GID table"))?
                .ok_or_else(|| format!("port {port_num} has no RoCE v2 GID: give one with -x"))?;
            (
                u8::try_from(i).map_err(|_| format!("GID index {i} out of range"))?,
                Some(g),
            )
        }
        (None, false) => (0, None),
    };
    let mtu = mtu_enum(cfg.mtu).min(port.active_mtu.max(1));
    Ok(Opened {
        ctx,
        emu,
        device,
        lid: port.lid,
        gid,
        sgid_index,
        roce: port.is_roce(),
        mtu,
    })
}

impl End {
    /// INIT -> RTR -> RTS towards `remote`, whose buffer window is `window` (rx area address,
    /// rkey). UD: the QP needs no path; an address handle for `remote` is made instead.
    fn connect(&mut self, remote: &RemoteQp, window: (u64, u32), mtu: u8) -> Result<(), String> {
        self.init()?;
        let mtu = Mtu::from_code(mtu).unwrap_or(Mtu::M1024);
        let p = ConnectParams::new()
            .mtu(mtu)
            .sl(self.sl)
            .sgid_index(self.sgid_index)
            .timeout(self.timeout)
            .rnr_retry(7);
        self.qp.to_rtr_with(remote, &p).map_err(err("RTR"))?;
        self.qp.to_rts_with(self.psn, &p).map_err(err("RTS"))?;
        if self.conn == Conn::Ud {
            let attr = AhAttr {
                dlid: remote.lid,
                sl: self.sl,
                port_num: self.port,
                grh: remote.gid.map(|g| GlobalRoute {
                    dgid: g,
                    sgid_index: self.sgid_index,
                    hop_limit: 64,
                    ..GlobalRoute::default()
                }),
                ..AhAttr::default()
            };
            let ah = Ah::new(&self.pd, attr).map_err(err("CREATE_AH"))?;
            self.ud_peer = Some((ah, remote.qpn));
        }
        (self.remote_addr, self.remote_rkey) = window;
        Ok(())
    }

    /// RESET -> INIT (receives may be posted from here on); nothing if already done.
    fn init(&mut self) -> Result<(), String> {
        if self.qp.state() == QpState::Reset {
            let access = match self.conn {
                Conn::Rc => Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
                Conn::Uc => Access::REMOTE_WRITE,
                _ => Access::LOCAL_WRITE,
            };
            let qkey = if self.conn == Conn::Ud { UD_QKEY } else { 0 };
            self.qp
                .to_init_with(self.port, access, qkey, &Default::default())
                .map_err(err("INIT"))?;
        }
        Ok(())
    }

    /// Address of the rx area: what the peer WRITEs to and what atomics operate on.
    fn window(&self) -> (u64, u32) {
        (self.mr.addr() + self.area as u64, self.mr.rkey())
    }

    fn buffers(&self) -> String {
        let kind = match self.buf.backing() {
            Backing::Pages => "4 KiB pages",
            Backing::Hugetlb => "2 MiB huge pages (hugetlb)",
            Backing::Transparent => "transparent huge pages (madvise)",
        };
        // the note, when there is one, ends by saying what was used instead
        self.buf
            .note()
            .map_or_else(|| kind.to_owned(), str::to_owned)
    }

    fn driver_counters(&self) -> (u64, u64, u64) {
        let s = self.qp.sq_ref().stats();
        (s.wqes, s.doorbells, s.bf_copies)
    }
}

pub(crate) fn emu_counters_json(emu: &Emulator) -> serde_json::Value {
    let c: Counters = emu.counters(0);
    let mut m = serde_json::Map::new();
    for name in EMU_COUNTER_NAMES
        .iter()
        .chain(Counters::HW_COUNTER_NAMES.iter())
    {
        if let Some(v) = c.get(name) {
            m.insert((*name).to_owned(), v.into());
        }
    }
    serde_json::Value::Object(m)
}

fn merged_cost(ends: &[&End]) -> Option<crate::cost::CostLog> {
    let mut all: Option<crate::cost::CostLog> = None;
    for c in ends.iter().filter_map(|e| e.cost.as_deref()) {
        all.get_or_insert_with(Default::default).merge(c);
    }
    all
}

fn driver_counters_json(ends: &[&End]) -> serde_json::Value {
    let (mut wqes, mut doorbells, mut bf) = (0, 0, 0);
    for e in ends {
        let (w, d, b) = e.driver_counters();
        wqes += w;
        doorbells += d;
        bf += b;
    }
    serde_json::json!({ "wqes": wqes, "doorbells": doorbells, "bf_copies": bf, "rings": doorbells + bf })
}

/// Opens a connected pair of RC QPs as `cfg` asks.
pub fn open(cfg: &TestbedConfig) -> Result<Box<dyn Testbed>, String> {
    let dev = open_device(cfg)?;
    let pd = Pd::new(&dev.ctx).map_err(err("ALLOC_PD"))?;
    let mut a = End::new(&dev.ctx, &pd, cfg)?;
    let mut b = End::new(&dev.ctx, &pd, cfg)?;
    (a.sgid_index, b.sgid_index) = (dev.sgid_index, dev.sgid_index);
    let remote = |e: &End| RemoteQp {
        qpn: e.qp.qpn(),
        psn: e.psn,
        lid: dev.lid,
        gid: dev.gid,
    };
    let (ra, rb) = (remote(&a), remote(&b));
    let (wa, wb) = (a.window(), b.window());
    a.connect(&rb, wb, dev.mtu)?;
    b.connect(&ra, wa, dev.mtu)?;
    let max_inline = a.qp.cap().max_inline_data;
    let bf = cfg.bf != Some(false) && a.qp.sq_ref().bfreg().bf_size > 0;
    Ok(Box::new(DriverTestbed {
        ends: [a, b],
        _pd: pd,
        _ctx: dev.ctx,
        emu: dev.emu,
        device: dev.device,
        lid: dev.lid,
        gid: dev.gid,
        roce: dev.roce,
        max_inline,
        bf,
    }))
}

/// One end of a connection to a peer in another process (TCP mode): one QP, or with `-q N`
/// N QPs (the first is `end`), all on one context and protection domain.
pub struct SingleEnd {
    end: End,
    /// QPs 1..N of `-q N` (empty with one QP).
    more: Vec<End>,
    _pd: Pd,
    _ctx: Context,
    emu: Option<Emulator>,
    device: String,
    lid: u16,
    gid: Option<[u8; 16]>,
    roce: bool,
    mtu: u8,
    max_inline: u32,
    bf: bool,
}

impl std::fmt::Debug for SingleEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SingleEnd")
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}

impl SingleEnd {
    /// Opens the device and creates the QP, CQs and buffer.
    pub fn open(cfg: &TestbedConfig) -> Result<Self, String> {
        Self::open_qps(cfg, 1)
    }

    /// Opens the device and creates `qps` QPs (at least one), each with its own CQs and
    /// buffer, as perftest's `-q`.
    pub fn open_qps(cfg: &TestbedConfig, qps: u32) -> Result<Self, String> {
        let dev = open_device(cfg)?;
        let pd = Pd::new(&dev.ctx).map_err(err("ALLOC_PD"))?;
        let mut end = End::new(&dev.ctx, &pd, cfg)?;
        end.sgid_index = dev.sgid_index;
        let mut more = Vec::with_capacity(qps.saturating_sub(1) as usize);
        for _ in 1..qps {
            let mut e = End::new(&dev.ctx, &pd, cfg)?;
            e.sgid_index = dev.sgid_index;
            more.push(e);
        }
        let max_inline = end.qp.cap().max_inline_data;
        let bf = cfg.bf != Some(false) && end.qp.sq_ref().bfreg().bf_size > 0;
        Ok(Self {
            end,
            more,
            _pd: pd,
            _ctx: dev.ctx,
            emu: dev.emu,
            device: dev.device,
            lid: dev.lid,
            gid: dev.gid,
            roce: dev.roce,
            mtu: dev.mtu,
            max_inline,
            bf,
        })
    }

    /// What perftest sends for this end (OUT_READS = `out_reads`).
    pub fn key(&self, out_reads: u16) -> crate::exchange::PerftestKey {
        self.key_of(&self.end, out_reads)
    }

    fn key_of(&self, e: &End, out_reads: u16) -> crate::exchange::PerftestKey {
        let (vaddr, rkey) = e.window();
        crate::exchange::PerftestKey {
            lid: self.lid,
            out_reads,
            qpn: e.qp.qpn(),
            psn: e.psn,
            rkey,
            vaddr,
            srqn: 0,
            gid: self.gid,
        }
    }

    /// The keys of every QP, in order (perftest sends one per QP).
    pub fn keys(&self, out_reads: u16) -> Vec<crate::exchange::PerftestKey> {
        std::iter::once(&self.end)
            .chain(&self.more)
            .map(|e| self.key_of(e, out_reads))
            .collect()
    }

    /// Number of QPs.
    pub fn qps(&self) -> usize {
        1 + self.more.len()
    }

    /// Connects QP `i` to the peer's QP `i` (perftest's `ctx_connect` over its QPs).
    pub fn connect_all(
        &mut self,
        peers: &[crate::exchange::PerftestKey],
        mtu: u8,
    ) -> Result<(), String> {
        if peers.len() != self.qps() {
            return Err(format!(
                "the peer sent {} keys for our {} QPs: give both sides the same -q",
                peers.len(),
                self.qps()
            ));
        }
        self.connect(&peers[0], mtu)?;
        for (i, peer) in peers.iter().enumerate().skip(1) {
            let remote = self.remote_of(peer)?;
            self.more[i - 1].connect(&remote, (peer.vaddr, peer.rkey), mtu)?;
        }
        Ok(())
    }

    fn remote_of(&self, peer: &crate::exchange::PerftestKey) -> Result<RemoteQp, String> {
        let gid = match (peer.gid, self.gid) {
            (Some(g), _) => Some(g),
            (None, Some(_)) if self.roce => {
                return Err("the peer sent no GID, but this RoCE port needs one: \
                            give the peer a GID index (-x)"
                    .into());
            }
            (None, _) => None,
        };
        Ok(RemoteQp {
            qpn: peer.qpn,
            psn: peer.psn,
            lid: peer.lid,
            gid,
        })
    }

    /// Endpoints of QPs 1..N for the address lines.
    pub fn more_endpoints(&self) -> Vec<Endpoint> {
        self.more
            .iter()
            .map(|e| e.endpoint(self.lid, self.gid))
            .collect()
    }

    /// Every QP, for the multi-QP measurement loops.
    pub fn sides(&mut self) -> Vec<&mut dyn Side> {
        let mut v: Vec<&mut dyn Side> = Vec::with_capacity(self.qps());
        v.push(&mut self.end);
        for e in &mut self.more {
            v.push(e);
        }
        v
    }

    /// Our MTU as the ibv_mtu enum.
    pub fn mtu(&self) -> u8 {
        self.mtu
    }

    /// Connects to the peer described by `peer` with path MTU enum `mtu`: by the peer's GID
    /// when it sent one (perftest does with a GID index, always on RoCE).
    pub fn connect(&mut self, peer: &crate::exchange::PerftestKey, mtu: u8) -> Result<(), String> {
        let remote = self.remote_of(peer)?;
        self.end.connect(&remote, (peer.vaddr, peer.rkey), mtu)
    }

    /// Moves the QP to INIT so that receives can be posted before the connection is made.
    pub fn init(&mut self) -> Result<(), String> {
        self.end.init()
    }

    /// Connects to an ibv_rc_pingpong-style peer (SENDs only: no buffer window). As that tool:
    /// a GID from the peer puts a GRH on the path (source GID index: ours, `-g`); a zero GID
    /// means none (on RoCE, which always needs one, our own GID stands in).
    pub fn connect_pingpong(
        &mut self,
        peer: &crate::exchange::PingpongDest,
        mtu: u8,
    ) -> Result<(), String> {
        let gid = if peer.gid != [0; 16] {
            Some(peer.gid)
        } else if self.roce {
            self.gid
        } else {
            None
        };
        let remote = RemoteQp {
            qpn: peer.qpn,
            psn: peer.psn,
            lid: peer.lid,
            gid,
        };
        self.end.connect(&remote, (0, 0), mtu)
    }

    /// What ibv_rc_pingpong sends for this end.
    pub fn pingpong_dest(&self) -> crate::exchange::PingpongDest {
        crate::exchange::PingpongDest {
            lid: self.lid,
            qpn: self.end.qp.qpn(),
            psn: self.end.psn,
            gid: self.gid.unwrap_or([0; 16]),
        }
    }

    /// Endpoint for the address lines.
    pub fn endpoint(&self) -> Endpoint {
        self.end.endpoint(self.lid, self.gid)
    }

    /// The port is Ethernet (RoCE), and the source GID index of the path if global.
    pub fn link(&self) -> (bool, Option<u8>) {
        (self.roce, self.gid.map(|_| self.end.sgid_index))
    }

    /// The end, for the measurement loops.
    pub fn side(&mut self) -> &mut dyn Side {
        &mut self.end
    }

    /// Device name as printed.
    pub fn device(&self) -> String {
        self.device.clone()
    }

    /// Whether this is the emulator.
    pub fn emulated(&self) -> bool {
        self.emu.is_some()
    }

    /// Whether sends use BlueFlame.
    pub fn bf(&self) -> bool {
        self.bf
    }

    /// Inline data the QP was created with.
    pub fn max_inline(&self) -> u32 {
        self.max_inline
    }

    /// What backs the buffer.
    pub fn buffers(&self) -> String {
        self.end.buffers()
    }

    /// Emulator counters, if emulated.
    pub fn counters(&self) -> Option<serde_json::Value> {
        self.emu.as_ref().map(emu_counters_json)
    }

    /// The driver's counters, summed over this side's QPs.
    pub fn driver_counters(&self) -> serde_json::Value {
        let all: Vec<&End> = std::iter::once(&self.end).chain(&self.more).collect();
        driver_counters_json(&all)
    }

    /// `--cpu_cost`: the per-call times of this side's driver calls, if recorded.
    pub fn cost(&self) -> Option<crate::cost::CostLog> {
        let all: Vec<&End> = std::iter::once(&self.end).chain(&self.more).collect();
        merged_cost(&all)
    }
}

/// The hooks of `-R`/`--rdma_cm` (`crate::exchange_cm`): the connection manager moves this
/// end's QP itself, so it needs the QP, the device's objects and the emulator.
impl SingleEnd {
    /// The QP, for the connection manager's transitions.
    pub fn qp_mut(&mut self) -> &mut Qp {
        &mut self.end.qp
    }

    /// The device context and protection domain (for the connection's own QP).
    pub fn objects(&self) -> (&Context, &Pd) {
        (&self._ctx, &self._pd)
    }

    /// The emulator this end runs on, if it is emulated.
    pub fn emulator(&self) -> Option<&Emulator> {
        self.emu.as_ref()
    }

    /// Where the peer's buffer is (rx area address, rkey), as its key said.
    pub fn set_remote_window(&mut self, vaddr: u64, rkey: u32) {
        (self.end.remote_addr, self.end.remote_rkey) = (vaddr, rkey);
    }
}
