//! `mlx5 lat|bw -c XRC|DC` with a peer: the QPs perftest 4.5 makes for these transports, so
//! that either side can be perftest's binary (`docs/xrc-dc.md`).
//!
//! - Latency: every QP of `-q` is doubled, as perftest's `num_of_qps *= 2`: an initiator
//!   (XRC send QP or DCI) and a target (XRC receive QP with an XRC SRQ, or DCT with an SRQ)
//!   on one buffer. The keys go initiators first, then targets; our initiator `i` connects to
//!   the peer's target `i`, our target `i` to the peer's initiator `i`.
//! - Bandwidth: the client holds only initiators, the server only targets; QP `i` to the
//!   peer's QP `i`.
//!
//! Each key's SRQN field carries the side's SRQ number (XRC: every key of a side with an XRC
//! SRQ; DC: the targets' side); a DCT's QPN field is its DCT number, known from RTR on and 0
//! before (perftest's first round of keys carries 0; it connects on it, then sends the keys
//! again). An XRC initiator names the peer's SRQ number in every WR; a DCI the peer's DCT
//! number and perftest's access key [`DC_KEY`], through an AH made from the peer's LID/GID;
//! both take them from the peer's last round of keys, as perftest's `ctx_set_send_wqes`.

use std::sync::Arc;

use mlx5::{
    Access, Ah, AhAttr, BfPolicy, CompChannel, ConnectParams, Context, Cq, CqInit, DcAddr, DcWr,
    Dci, DciStreams, Dct, DmaBuf, HugePolicy, Mr, Mtu, Pd, QpCap, QpInitAttr, QpType, RecvWr,
    RemoteQp, SendFlags, SendWr, Srq, WorkCompletion, WrOp, XrcDomain, XrcSendQp, XrcSrq,
    XrcSrqNum, XrcTgtQp, XrcWr,
};
use mlx5_emu::Emulator;

use crate::app::TestbedConfig;
use crate::backend::{
    MAX_POST_LIST, PEER_CYCLE_BUFFER, arm_cq, err, open_device, read_area, wait_cq_event,
};
use crate::bench::{BenchResult, Op, Side, Wr};
use crate::cli::Conn;
use crate::exchange::PerftestKey;
use crate::report::Endpoint;

/// perftest's DC access key (`DC_KEY`), the same on both sides.
pub const DC_KEY: u64 = 0xffee_ddcc;

/// The sending QP of an end.
enum Initiator {
    Xrc(XrcSendQp),
    Dc(Dci),
}

impl Initiator {
    fn qp(&self) -> &mlx5::Qp {
        match self {
            Self::Xrc(q) => q.qp(),
            Self::Dc(d) => d.qp(),
        }
    }
}

/// The receiving QP of an end and the SRQ its receives come from.
enum Target {
    Xrc { qp: XrcTgtQp, srq: XrcSrq },
    Dc { dct: Dct, srq: Srq },
}

/// Where an initiator's WRs go (from the peer's target key).
enum Dest {
    Xrc(XrcSrqNum),
    Dc { addr: DcAddr, ah: Ah },
}

/// One end: an initiator, a target or both, their CQs and one buffer (`[tx | rx]`, as
/// `backend::End`'s): SEND and WRITE go from the tx area to the peer's window; READ fetches
/// the area before the peer's window into the rx area.
struct HpcEnd {
    ini: Option<Initiator>,
    tgt: Option<Target>,
    dest: Option<Dest>,
    send_cq: Cq,
    recv_cq: Cq,
    channels: Option<[Arc<CompChannel>; 2]>,
    buf: Arc<DmaBuf>,
    mr: Mr,
    shadow: Vec<u8>,
    area: usize,
    remote_addr: u64,
    remote_rkey: u32,
    wr_id: u64,
    recv_outstanding: u32,
    cost: Option<Box<crate::cost::CostLog>>,
    wcs: [WorkCompletion; 16],
    ini_psn: u32,
    tgt_psn: u32,
    /// The DCI stream of the next WR: perftest's round robin over every stream.
    next_stream: u16,
}

fn psn_seed(salt: u32) -> u32 {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    (seed ^ salt.wrapping_mul(0x9E37_79B9)) & 0xFF_FFFF
}

impl HpcEnd {
    fn new(
        ctx: &Context,
        pd: &Pd,
        xrcd: Option<&XrcDomain>,
        cfg: &TestbedConfig,
        initiator: bool,
        target: bool,
    ) -> Result<Self, String> {
        let area = (cfg.max_size as usize)
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
        let ini = if initiator {
            let qp_type = match cfg.conn {
                Conn::Xrc => QpType::XrcSend,
                _ => QpType::Dci,
            };
            let mut init = QpInitAttr::new(qp_type, &send_cq, &send_cq);
            init.cap = QpCap {
                max_send_wr: cfg.sq_depth,
                max_recv_wr: 0,
                max_send_sge: 1,
                max_recv_sge: 0,
                max_inline_data: cfg.max_inline,
            };
            init.bf_policy = if cfg.bf == Some(false) {
                BfPolicy::AlwaysDoorbell
            } else {
                BfPolicy::PreferBf
            };
            Some(match cfg.conn {
                Conn::Xrc => {
                    Initiator::Xrc(XrcSendQp::new(pd, &init).map_err(err("CREATE_QP (XRC send)"))?)
                }
                // perftest's DCS: 2^log_dci_streams concurrent streams, none kept in error.
                _ if cfg.log_dci_streams > 0 => Initiator::Dc(
                    Dci::with_streams(
                        pd,
                        &init,
                        DciStreams {
                            log_concurrent: cfg.log_dci_streams as u8,
                            log_errored: 0,
                        },
                    )
                    .map_err(err("CREATE_QP (DCI with streams)"))?,
                ),
                _ => Initiator::Dc(Dci::new(pd, &init).map_err(err("CREATE_QP (DCI)"))?),
            })
        } else {
            None
        };
        let tgt = if target {
            Some(match (cfg.conn, xrcd) {
                (Conn::Xrc, Some(xrcd)) => {
                    let srq = XrcSrq::new(xrcd, pd, &recv_cq, cfg.rq_depth, 1)
                        .map_err(err("CREATE_XSRQ"))?;
                    let qp = XrcTgtQp::new(xrcd).map_err(err("CREATE_QP (XRC receive)"))?;
                    Target::Xrc { qp, srq }
                }
                (Conn::Xrc, None) => return Err("-c XRC: no XRC domain".into()),
                _ => {
                    let srq = Srq::new(pd, cfg.rq_depth, 1).map_err(err("CREATE_SRQ"))?;
                    let dct =
                        Dct::new(pd, &recv_cq, &srq, DC_KEY).map_err(err("CREATE_QP (DCT)"))?;
                    Target::Dc { dct, srq }
                }
            })
        } else {
            None
        };
        let salt = ini.as_ref().map_or(0, |i| i.qp().qpn()) ^ (buf.len() as u32);
        Ok(Self {
            ini,
            tgt,
            dest: None,
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
            ini_psn: psn_seed(salt),
            tgt_psn: psn_seed(salt ^ 0x5A5A),
            next_stream: 0,
        })
    }

    /// The rx area: what the peer writes to and reads from.
    fn window(&self) -> (u64, u32) {
        (self.mr.addr() + self.area as u64, self.mr.rkey())
    }

    fn srqn(&self) -> u32 {
        match &self.tgt {
            Some(Target::Xrc { srq, .. }) => srq.number().get(),
            Some(Target::Dc { srq, .. }) => srq.srqn(),
            None => 0,
        }
    }

    fn ini_qpn(&self) -> Option<u32> {
        self.ini.as_ref().map(|i| i.qp().qpn())
    }

    /// The target's number: an XRC receive QP's QPN; a DCT's number once at RTR, else 0 (as
    /// perftest's first keys carry it).
    fn tgt_qpn(&self) -> Option<u32> {
        self.tgt.as_ref().map(|t| match t {
            Target::Xrc { qp, .. } => qp.qpn(),
            Target::Dc { dct, .. } => dct.number().unwrap_or(0),
        })
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

/// The path to the peer's port: its GID when it sent one (RoCE always needs one).
fn remote_of(
    peer: &PerftestKey,
    our_gid: Option<[u8; 16]>,
    roce: bool,
) -> Result<RemoteQp, String> {
    let gid = match (peer.gid, our_gid) {
        (Some(g), _) => Some(g),
        (None, Some(_)) if roce => {
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

impl Side for HpcEnd {
    fn post_send(&mut self, wrs: &[Wr]) -> BenchResult<()> {
        let Some(first) = wrs.first() else {
            return Ok(());
        };
        if wrs.len() > MAX_POST_LIST as usize {
            return Err(format!("post list {} exceeds {MAX_POST_LIST}", wrs.len()));
        }
        let len = first.len.min(self.area as u32);
        let (raddr, rkey) = (self.remote_addr, self.remote_rkey);
        let (op, local_off) = match first.op {
            Op::Send => (WrOp::Send, 0),
            Op::Write => (WrOp::Write { raddr, rkey }, 0),
            Op::Read => (
                WrOp::Read {
                    raddr: raddr.wrapping_sub(self.area as u64),
                    rkey,
                },
                self.area as u64,
            ),
            Op::FetchAdd => (
                WrOp::FetchAdd {
                    raddr,
                    rkey,
                    add: 1,
                },
                self.area as u64,
            ),
            Op::CmpSwap => (
                WrOp::CompareSwap {
                    raddr,
                    rkey,
                    compare: 0,
                    swap: 0,
                },
                self.area as u64,
            ),
        };
        let sge = [self.mr.sge(local_off, len)];
        let inline_data: [&[u8]; 1] = [&self.shadow[..len as usize]];
        let template = SendWr::new(0, op, &sge, SendFlags::NONE);
        let mut chain = [template; MAX_POST_LIST as usize];
        for (slot, wr) in chain.iter_mut().zip(wrs) {
            self.wr_id += 1;
            slot.wr_id = self.wr_id;
            if wr.signaled {
                slot.flags |= SendFlags::SIGNALED;
            }
            if wr.inline {
                *slot = slot.with_inline(&inline_data);
            }
        }
        let chain = &chain[..wrs.len()];
        let t0 = std::time::Instant::now();
        let r = match (&mut self.ini, &self.dest) {
            (Some(Initiator::Xrc(q)), Some(Dest::Xrc(srqn))) => {
                let mut x = [XrcWr {
                    srqn: *srqn,
                    wr: template,
                }; MAX_POST_LIST as usize];
                for (slot, wr) in x.iter_mut().zip(chain) {
                    slot.wr = *wr;
                }
                q.post_send(&x[..chain.len()])
            }
            (Some(Initiator::Dc(d)), Some(Dest::Dc { addr, .. })) => {
                let mut x = [DcWr {
                    dest: addr,
                    wr: template,
                    stream: 0,
                }; MAX_POST_LIST as usize];
                // The streams are a power of two: the id wraps with a mask, as perftest's.
                let mask = (d.streams() - 1) as u16;
                for (slot, wr) in x.iter_mut().zip(chain) {
                    slot.wr = *wr;
                    slot.stream = self.next_stream;
                    self.next_stream = self.next_stream.wrapping_add(1) & mask;
                }
                let r = d.post_send(&x[..chain.len()]);
                if let Err((i, _)) = r {
                    // the refused WR and those after it were not posted: their streams again
                    self.next_stream = x[i].stream;
                }
                r
            }
            (None, _) => return Err("this side has only targets: it sends nothing".into()),
            (Some(_), _) => return Err("no destination from the peer yet".into()),
        };
        if let Some(c) = &mut self.cost {
            c.post(crate::cost::ns_since(t0), wrs.len());
        }
        r.map_err(|(i, e)| format!("post_send (WR {i} of {}): {e}", wrs.len()))
    }

    fn post_recv(&mut self, n: u32, _len: u32) -> BenchResult<()> {
        // the whole rx area, as backend::End's receives
        let sge = [self.mr.sge(self.area as u64, self.area as u32)];
        let mut left = n;
        while left > 0 {
            let k = left.min(MAX_POST_LIST);
            let template = RecvWr {
                wr_id: 0,
                sg_list: &sge,
            };
            let chain = [template; MAX_POST_LIST as usize];
            let r = match &mut self.tgt {
                Some(Target::Xrc { srq, .. }) => srq.post_recv(&chain[..k as usize]),
                Some(Target::Dc { srq, .. }) => srq.post_recv(&chain[..k as usize]),
                None => return Err("this side has only initiators: it receives nothing".into()),
            };
            r.map_err(|(i, e)| format!("post_recv to the SRQ (WR {i}): {e}"))?;
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

/// This side of an XRC or DC run against a peer process, as perftest lays it out (module
/// doc). Field order is drop order: the ends before the domain, the PD and the context.
pub struct HpcPeer {
    ends: Vec<HpcEnd>,
    /// Latency: every end holds an initiator and a target.
    doubled: bool,
    conn: Conn,
    _xrcd: Option<XrcDomain>,
    pd: Pd,
    _ctx: Context,
    emu: Option<Emulator>,
    device: String,
    lid: u16,
    gid: Option<[u8; 16]>,
    sgid_index: u8,
    roce: bool,
    mtu: u8,
    port: u8,
    sl: u8,
    timeout: u8,
    max_inline: u32,
    bf: bool,
}

impl std::fmt::Debug for HpcPeer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HpcPeer")
            .field("device", &self.device)
            .field("conn", &self.conn)
            .finish_non_exhaustive()
    }
}

impl HpcPeer {
    /// Opens the device and creates `qps` ends: with `lat` each an initiator and a target;
    /// otherwise initiators on the client (`server` false), targets on the server.
    pub fn open(cfg: &TestbedConfig, qps: u32, lat: bool, server: bool) -> Result<Self, String> {
        if !matches!(cfg.conn, Conn::Xrc | Conn::Dc) {
            return Err(format!("-c {}: not an XRC or DC run", cfg.conn.name()));
        }
        let dev = open_device(cfg)?;
        let pd = Pd::new(&dev.ctx).map_err(err("ALLOC_PD"))?;
        let xrcd = match cfg.conn {
            Conn::Xrc => Some(XrcDomain::private(&dev.ctx).map_err(err("OPEN_XRCD"))?),
            _ => None,
        };
        let (initiator, target) = (lat || !server, lat || server);
        let mut ends = Vec::with_capacity(qps as usize);
        for _ in 0..qps.max(1) {
            ends.push(HpcEnd::new(
                &dev.ctx,
                &pd,
                xrcd.as_ref(),
                cfg,
                initiator,
                target,
            )?);
        }
        let (max_inline, bf) = match ends.first().and_then(|e| e.ini.as_ref()) {
            Some(i) => (
                i.qp().cap().max_inline_data,
                cfg.bf != Some(false) && i.qp().sq_ref().bfreg().bf_size > 0,
            ),
            None => (0, false),
        };
        Ok(Self {
            ends,
            doubled: lat,
            conn: cfg.conn,
            _xrcd: xrcd,
            pd,
            _ctx: dev.ctx,
            emu: dev.emu,
            device: dev.device,
            lid: dev.lid,
            gid: dev.gid,
            sgid_index: dev.sgid_index,
            roce: dev.roce,
            mtu: dev.mtu,
            port: cfg.ib_port,
            sl: cfg.sl,
            timeout: cfg.timeout,
            max_inline,
            bf,
        })
    }

    fn key(&self, e: &HpcEnd, qpn: u32, psn: u32, out_reads: u16) -> PerftestKey {
        let (vaddr, rkey) = e.window();
        PerftestKey {
            lid: self.lid,
            out_reads,
            qpn,
            psn,
            rkey,
            vaddr,
            srqn: e.srqn(),
            gid: self.gid,
        }
    }

    /// Every QP's key, initiators first, then targets (perftest's `my_dest` order).
    pub fn keys(&self, out_reads: u16) -> Vec<PerftestKey> {
        let inis = self
            .ends
            .iter()
            .filter_map(|e| Some(self.key(e, e.ini_qpn()?, e.ini_psn, out_reads)));
        let tgts = self
            .ends
            .iter()
            .filter_map(|e| Some(self.key(e, e.tgt_qpn()?, e.tgt_psn, out_reads)));
        inis.chain(tgts).collect()
    }

    /// The peer's keys split as (its initiators, its targets), checked against ours.
    fn split<'p>(
        &self,
        peers: &'p [PerftestKey],
    ) -> Result<(&'p [PerftestKey], &'p [PerftestKey]), String> {
        let ours = self.keys(0).len();
        if peers.len() != ours {
            return Err(format!(
                "the peer sent {} keys for our {ours} QPs: give both sides the same -q and -c {}",
                peers.len(),
                self.conn.name()
            ));
        }
        let n = self.ends.len();
        Ok(if self.doubled {
            peers.split_at(n)
        } else if self.ends.iter().any(|e| e.ini.is_some()) {
            (&[][..], peers)
        } else {
            (peers, &[][..])
        })
    }

    fn params(&self, mtu: u8) -> ConnectParams {
        ConnectParams::new()
            .mtu(Mtu::from_code(mtu).unwrap_or(Mtu::M1024))
            .sl(self.sl)
            .sgid_index(self.sgid_index)
            .timeout(self.timeout)
            .rnr_retry(7)
    }

    /// Connects every QP to its peer (perftest's `ctx_connect`): initiators to RTS towards
    /// the peer's targets (a DCI to RTS with no destination, and an AH to the peer's port),
    /// XRC targets to RTR towards the peer's initiators (and RTS in latency tests), DCTs to
    /// RTR (their number is known from then on).
    pub fn connect_all(&mut self, peers: &[PerftestKey], mtu: u8) -> Result<(), String> {
        let (p_inis, p_tgts) = self.split(peers)?;
        let p = self.params(mtu);
        let (port, sl, lat) = (self.port, self.sl, self.doubled);
        let (gid, roce, sgid_index) = (self.gid, self.roce, self.sgid_index);
        let pd = self.pd.clone();
        for (j, e) in self.ends.iter_mut().enumerate() {
            if let Some(ini) = &mut e.ini {
                let peer = p_tgts
                    .get(j)
                    .ok_or_else(|| format!("no peer target for our initiator {j}"))?;
                let remote = remote_of(peer, gid, roce)?;
                match ini {
                    Initiator::Xrc(q) => {
                        q.to_init(port, &p).map_err(err("XRC send QP: INIT"))?;
                        q.to_rtr(&remote, &p).map_err(err("XRC send QP: RTR"))?;
                        q.to_rts(e.ini_psn, &p).map_err(err("XRC send QP: RTS"))?;
                    }
                    Initiator::Dc(d) => {
                        d.activate(port, e.ini_psn, &p)
                            .map_err(err("DCI: INIT, RTR, RTS"))?;
                        let ah = Ah::new(
                            &pd,
                            AhAttr {
                                dlid: remote.lid,
                                sl,
                                port_num: port,
                                grh: remote.gid.map(|g| mlx5::GlobalRoute {
                                    dgid: g,
                                    sgid_index,
                                    hop_limit: 64,
                                    ..mlx5::GlobalRoute::default()
                                }),
                                ..AhAttr::default()
                            },
                        )
                        .map_err(err("CREATE_AH"))?;
                        // the DCT number comes with the peer's later keys (refresh)
                        let addr = DcAddr::new(&ah, peer.qpn, DC_KEY)
                            .map_err(err("DC address of the peer's DCT"))?;
                        e.dest = Some(Dest::Dc { addr, ah });
                    }
                }
                (e.remote_addr, e.remote_rkey) = (peer.vaddr, peer.rkey);
            }
            if let Some(tgt) = &mut e.tgt {
                match tgt {
                    Target::Xrc { qp, .. } => {
                        let peer = p_inis
                            .get(j)
                            .ok_or_else(|| format!("no peer initiator for our target {j}"))?;
                        let remote = remote_of(peer, gid, roce)?;
                        qp.to_init(port, Access::ALL, &p)
                            .map_err(err("XRC receive QP: INIT"))?;
                        qp.to_rtr(&remote, &p).map_err(err("XRC receive QP: RTR"))?;
                        // perftest's bandwidth server leaves its targets at RTR
                        if lat {
                            qp.to_rts(e.tgt_psn, &p)
                                .map_err(err("XRC receive QP: RTS"))?;
                        }
                    }
                    Target::Dc { dct, .. } => {
                        dct.activate(port, Access::ALL, &p)
                            .map_err(err("DCT: INIT, RTR"))?;
                    }
                }
            }
        }
        self.refresh(peers)
    }

    /// Takes the peer's targets' numbers from its latest keys (perftest connects on its
    /// first round and addresses the WRs from its last one): the XRC SRQ number of each
    /// WR, the DCT number of each DC address.
    pub fn refresh(&mut self, peers: &[PerftestKey]) -> Result<(), String> {
        let (_, p_tgts) = self.split(peers)?;
        for (j, e) in self.ends.iter_mut().enumerate() {
            let Some(ini) = &e.ini else { continue };
            let peer = p_tgts
                .get(j)
                .ok_or_else(|| format!("no peer target for our initiator {j}"))?;
            match ini {
                Initiator::Xrc(_) => {
                    let n = XrcSrqNum::new(peer.srqn).map_err(err("the peer's SRQ number"))?;
                    e.dest = Some(Dest::Xrc(n));
                }
                Initiator::Dc(_) => {
                    if let Some(Dest::Dc { addr, ah }) = &mut e.dest {
                        *addr = DcAddr::new(ah, peer.qpn, DC_KEY)
                            .map_err(err("DC address of the peer's DCT"))?;
                    }
                }
            }
            (e.remote_addr, e.remote_rkey) = (peer.vaddr, peer.rkey);
        }
        Ok(())
    }

    /// Checks that the peer's targets are addressable once the keys are all in: an XRC
    /// target's SRQ number and a DCT's number are never 0 in a perftest exchange.
    pub fn check_peer(&self, peers: &[PerftestKey]) -> Result<(), String> {
        let (_, p_tgts) = self.split(peers)?;
        for (j, t) in p_tgts.iter().enumerate() {
            match self.conn {
                Conn::Xrc if t.srqn == 0 => {
                    return Err(format!(
                        "the peer's target {j} sent SRQ number 0: is the peer running -c XRC?"
                    ));
                }
                Conn::Dc if t.qpn == 0 => {
                    return Err(format!(
                        "the peer's DCT {j} sent DCT number 0 in its last keys: \
                         is the peer running -c DC?"
                    ));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Number of ends (`-q`).
    pub fn qps(&self) -> usize {
        self.ends.len()
    }

    /// Our MTU as the ibv_mtu enum.
    pub fn mtu(&self) -> u8 {
        self.mtu
    }

    fn endpoint_of(&self, k: &PerftestKey) -> Endpoint {
        Endpoint {
            lid: k.lid,
            qpn: k.qpn,
            psn: k.psn,
            rkey_vaddr: Some((k.rkey, k.vaddr)),
            gid: k.gid,
        }
    }

    /// The first QP's endpoint for the address lines.
    pub fn endpoint(&self) -> Endpoint {
        self.keys(0)
            .first()
            .map(|k| self.endpoint_of(k))
            .unwrap_or_default()
    }

    /// The other QPs' endpoints (a latency test's targets after its initiators).
    pub fn more_endpoints(&self) -> Vec<Endpoint> {
        self.keys(0)
            .iter()
            .skip(1)
            .map(|k| self.endpoint_of(k))
            .collect()
    }

    /// The first end, for the measurement loops.
    pub fn side(&mut self) -> &mut dyn Side {
        &mut self.ends[0]
    }

    /// Every end.
    pub fn sides(&mut self) -> Vec<&mut dyn Side> {
        self.ends.iter_mut().map(|e| e as &mut dyn Side).collect()
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

    /// Inline data the initiators were created with (0 on a side of targets only).
    pub fn max_inline(&self) -> u32 {
        self.max_inline
    }

    /// What backs the buffers.
    pub fn buffers(&self) -> String {
        let Some(e) = self.ends.first() else {
            return String::new();
        };
        let kind = match e.buf.backing() {
            mlx5::Backing::Pages => "4 KiB pages",
            mlx5::Backing::Hugetlb => "2 MiB huge pages (hugetlb)",
            mlx5::Backing::Transparent => "transparent huge pages (madvise)",
        };
        e.buf.note().map_or_else(|| kind.to_owned(), str::to_owned)
    }

    /// The port is Ethernet (RoCE), and the source GID index of the path if global.
    pub fn link(&self) -> (bool, Option<u8>) {
        (self.roce, self.gid.map(|_| self.sgid_index))
    }

    /// Emulator counters, if emulated.
    pub fn counters(&self) -> Option<serde_json::Value> {
        self.emu.as_ref().map(crate::backend::emu_counters_json)
    }

    /// The driver's counters, summed over the initiators.
    pub fn driver_counters(&self) -> serde_json::Value {
        let (mut wqes, mut doorbells, mut bf) = (0, 0, 0);
        for i in self.ends.iter().filter_map(|e| e.ini.as_ref()) {
            let s = i.qp().sq_ref().stats();
            wqes += s.wqes;
            doorbells += s.doorbells;
            bf += s.bf_copies;
        }
        serde_json::json!({ "wqes": wqes, "doorbells": doorbells, "bf_copies": bf, "rings": doorbells + bf })
    }

    /// `--cpu_cost`: the per-call times of the driver calls, if recorded.
    pub fn cost(&self) -> Option<crate::cost::CostLog> {
        let mut all: Option<crate::cost::CostLog> = None;
        for c in self.ends.iter().filter_map(|e| e.cost.as_deref()) {
            all.get_or_insert_with(Default::default).merge(c);
        }
        all
    }
}
