//! `-R`/`--rdma_cm`: the QPs connected through rdma_cm ([`mlx5::cm`]) instead of the TCP
//! exchange, with perftest 4.5's meaning and wire exchange, so that `mlx5 lat -R` and
//! `mlx5 bw -R` pair with perftest's `ib_*_lat -R` / `ib_*_bw -R` in either role.
//!
//! perftest's `-R` makes two rdma_cm connections to the server's port (`-p`, 18515):
//!
//! 1. **the communication connection**: an RC QP of its own, one receive of 56 bytes
//!    (`sizeof(struct pingpong_dest)`) posted before the REQ (client) or the accept
//!    (server), then reposted after each message. Everything perftest's TCP socket carries
//!    travels on it, one SEND per field of the TCP exchange, in the same order and sizes:
//!    the version (16 bytes), cycle buffer and cache line (4 each), MTU (2), the bandwidth
//!    reports (8 per field). The keys are not the TCP text but the binary
//!    `struct pingpong_dest` (56 bytes: LID, OUT_READS, QPN, PSN, RKEY as big-endian 32-bit
//!    words, 4 bytes of padding, VADDR big-endian 64-bit, the GID's 16 bytes, SRQN and GID
//!    index). The client closes with no `"done"`.
//! 2. **the data connection**: after one key exchange (a barrier), the server listens again
//!    on the same port (perftest destroyed its first listener) and the client connects the
//!    test's QP, retrying while nobody listens yet; the kernel's INIT_QP_ATTR gives the QP
//!    its attributes (path, PSNs, MTU, timeouts). Another key exchange follows, then the
//!    exchanges of the TCP mode (`crate::remote::handshakes`), whose first key carries the
//!    buffer address and rkey that WRITE and READ use.
//!
//! Our server keeps its one listener for both connections (there is nothing to gain from
//! closing it in between). `mlx5 pingpong -R` has no peer tool to follow
//! (ibv_rc_pingpong has no rdma_cm mode): the test's QP itself is connected through rdma_cm
//! and nothing else is exchanged.

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mlx5::cm::{CmId, ConnParam, EventChannel, PortSpace};
use mlx5::{
    Access, Cq, CqInit, DmaBuf, Mr, Qp, QpInitAttr, QpType, RecvWr, SendFlags, SendWr,
    WorkCompletion,
};

use crate::app::{Plan, Reporter};
use crate::backend::SingleEnd;
use crate::bench::Op;
use crate::cli::{Conn, PingpongArgs, TestArgs};
use crate::exchange::{self, PerftestKey, Role};

/// `sizeof(struct pingpong_dest)`: perftest's receive on the communication QP, and its key.
pub const DEST_LEN: usize = 56;

/// How long the client keeps connecting while the server is not listening yet, and the
/// longest wait for one connection step.
const PATIENCE: Duration = Duration::from_secs(20);

/// Offsets in the communication QP's buffer.
const RECV_AT: usize = 0;
const SEND_AT: usize = 64;

/// perftest's key as `struct pingpong_dest` on the communication QP.
pub fn encode_dest(k: &PerftestKey) -> [u8; DEST_LEN] {
    let mut b = [0u8; DEST_LEN];
    b[0..4].copy_from_slice(&u32::from(k.lid).to_be_bytes());
    b[4..8].copy_from_slice(&u32::from(k.out_reads).to_be_bytes());
    b[8..12].copy_from_slice(&k.qpn.to_be_bytes());
    b[12..16].copy_from_slice(&k.psn.to_be_bytes());
    b[16..20].copy_from_slice(&k.rkey.to_be_bytes());
    b[24..32].copy_from_slice(&k.vaddr.to_be_bytes());
    b[32..48].copy_from_slice(&k.gid.unwrap_or([0; 16]));
    b[48..52].copy_from_slice(&k.srqn.to_be_bytes());
    // the GID index: -1 without one, as perftest's
    let gid_index: i32 = if k.gid.is_some() { 0 } else { -1 };
    b[52..56].copy_from_slice(&gid_index.to_be_bytes());
    b
}

/// The peer's `struct pingpong_dest` (the fields perftest reads: it ignores SRQN and the
/// GID index). A message of another size is an error naming it.
pub fn decode_dest(b: &[u8]) -> Result<PerftestKey, String> {
    if b.len() != DEST_LEN {
        return Err(format!(
            "rdma_cm key message of {} bytes (struct pingpong_dest has {DEST_LEN})",
            b.len()
        ));
    }
    let w = |at: usize| u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    let mut vaddr = [0u8; 8];
    vaddr.copy_from_slice(&b[24..32]);
    let mut gid = [0u8; 16];
    gid.copy_from_slice(&b[32..48]);
    Ok(PerftestKey {
        lid: w(0) as u16,
        out_reads: w(4) as u16,
        qpn: w(8) & 0xff_ffff,
        psn: w(12) & 0xff_ffff,
        rkey: w(16),
        vaddr: u64::from_be_bytes(vaddr),
        srqn: w(48),
        gid: (gid != [0; 16]).then_some(gid),
    })
}

fn cm_err(what: &'static str) -> impl Fn(mlx5::Error) -> String {
    move |e| format!("rdma_cm {what}: {e}")
}

/// The rdma_cm file of the device `end` runs on: the emulator's, or the kernel's.
fn channel(end: &SingleEnd) -> Result<EventChannel, String> {
    match end.emulator() {
        Some(emu) => {
            let o = emu
                .open_rdma_cm()
                .map_err(|e| format!("open the emulated rdma_cm: {e:?}"))?;
            Ok(EventChannel::with_surface(o.file, Some(o.fd)))
        }
        None => EventChannel::open_device().map_err(cm_err("open")),
    }
}

/// The communication connection's QP: messages of at most [`DEST_LEN`] bytes, one SEND
/// each. `Write` collects a message and `flush` sends it; `Read` hands out the bytes of the
/// messages received, one message at a time, and reposts the receive. So the TCP mode's
/// exchanges ([`exchange::swap`]: write, flush, read) run on it unchanged.
pub struct CommQp {
    qp: Qp,
    scq: Cq,
    rcq: Cq,
    buf: Arc<DmaBuf>,
    mr: Mr,
    out: Vec<u8>,
    inbox: Vec<u8>,
    patience: Option<Duration>,
}

impl std::fmt::Debug for CommQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommQp")
            .field("qpn", &self.qp.qpn())
            .finish_non_exhaustive()
    }
}

impl CommQp {
    fn new(end: &SingleEnd, patience: Option<Duration>) -> Result<Self, String> {
        let (ctx, pd) = end.objects();
        let e = |what: &'static str| move |e: mlx5::Error| format!("rdma_cm comm QP {what}: {e}");
        let buf = Arc::new(DmaBuf::new(4096).map_err(e("buffer"))?);
        let mr = pd.reg_mr(&buf, Access::LOCAL_WRITE).map_err(e("REG_MR"))?;
        let scq = Cq::new(ctx, CqInit::default(), None).map_err(e("CREATE_CQ"))?;
        let rcq = Cq::new(ctx, CqInit::default(), None).map_err(e("CREATE_CQ"))?;
        let qp = Qp::new(pd, &QpInitAttr::new(QpType::Rc, &scq, &rcq)).map_err(e("CREATE_QP"))?;
        Ok(Self {
            qp,
            scq,
            rcq,
            buf,
            mr,
            out: Vec::new(),
            inbox: Vec::new(),
            patience,
        })
    }

    fn post_recv(&mut self) -> io::Result<()> {
        let sge = [self.mr.sge(RECV_AT as u64, DEST_LEN as u32)];
        self.qp
            .post_recv(&[RecvWr {
                wr_id: 1,
                sg_list: &sge,
            }])
            .map_err(|(_, e)| io::Error::other(format!("rdma_cm comm QP post_recv: {e}")))
    }

    fn wait(&mut self, recv: bool) -> io::Result<WorkCompletion> {
        let deadline = self.patience.map(|p| Instant::now() + p);
        let mut wc = [WorkCompletion::default(); 1];
        let cq = if recv { &mut self.rcq } else { &mut self.scq };
        while cq.poll(&mut wc) == 0 {
            if deadline.is_some_and(|d| Instant::now() > d) {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "nothing from the peer on the rdma_cm communication QP for {:?}",
                        self.patience.unwrap_or_default()
                    ),
                ));
            }
            std::thread::yield_now();
        }
        if !wc[0].is_ok() {
            let what = if recv { "receive" } else { "SEND" };
            return Err(io::Error::other(format!(
                "rdma_cm communication QP {what} failed: {}",
                wc[0]
            )));
        }
        Ok(wc[0])
    }
}

impl Write for CommQp {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.out.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.out.is_empty() {
            return Ok(());
        }
        if self.out.len() > DEST_LEN {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "a message of {} bytes does not fit perftest's {DEST_LEN}-byte receive",
                    self.out.len()
                ),
            ));
        }
        let n = self.out.len();
        self.buf.write(SEND_AT, &self.out);
        self.out.clear();
        let sge = [self.mr.sge(SEND_AT as u64, n as u32)];
        self.qp
            .post_send(&[SendWr::send(2, &sge, SendFlags::SIGNALED)])
            .map_err(|(_, e)| io::Error::other(format!("rdma_cm comm QP post_send: {e}")))?;
        self.wait(false).map(drop)
    }
}

impl Read for CommQp {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        if b.is_empty() {
            return Ok(0);
        }
        if self.inbox.is_empty() {
            let wc = self.wait(true)?;
            let n = (wc.byte_len as usize).min(DEST_LEN);
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "an empty message on the rdma_cm communication QP",
                ));
            }
            let mut m = vec![0u8; n];
            self.buf.read(RECV_AT, &mut m);
            self.inbox = m;
            self.post_recv()?;
        }
        let n = b.len().min(self.inbox.len());
        b[..n].copy_from_slice(&self.inbox[..n]);
        self.inbox.drain(..n);
        Ok(n)
    }
}

/// One key exchange on the communication QP (`ctx_hand_shake` with `-R`).
fn keys(comm: &mut CommQp, role: Role, ours: &PerftestKey) -> Result<PerftestKey, String> {
    let theirs = exchange::swap(comm, role, &encode_dest(ours)).map_err(|e| format!("{e}"))?;
    decode_dest(&theirs)
}

/// The server's address: HOST (a name or an address; IPv4 first, as perftest asks for
/// `AF_INET`) and PORT.
fn resolve(host: &str, port: u16) -> Result<SocketAddr, String> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    let all: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("resolve {host}: {e}"))?
        .collect();
    all.iter()
        .find(|a| a.is_ipv4())
        .or(all.first())
        .copied()
        .ok_or_else(|| format!("{host} has no address"))
}

fn bind_addr(bind: Option<&str>, port: u16) -> Result<SocketAddr, String> {
    let ip: IpAddr = bind
        .unwrap_or("0.0.0.0")
        .parse()
        .map_err(|e| format!("--bind: {e}"))?;
    Ok(SocketAddr::new(ip, port))
}

/// Connect `qp` (in RESET or INIT) to `dst`, again while the peer is not listening
/// (REJECTED: no listener yet) for up to [`PATIENCE`]. Returns the connection's id and the
/// REP's event.
fn connect<'c>(
    chan: &'c EventChannel,
    dst: SocketAddr,
    qp: &mut Qp,
    param: &ConnParam<'_>,
) -> Result<(CmId<'c>, mlx5::cm::CmEvent), String> {
    let until = Instant::now() + PATIENCE;
    loop {
        let id = chan
            .create_id(PortSpace::Tcp)
            .map_err(cm_err("CREATE_ID"))?;
        id.resolve(dst).map_err(cm_err("resolve"))?;
        id.init_qp(qp).map_err(cm_err("QP to INIT"))?;
        match id.connect_resolved(qp, param) {
            Ok(rep) => return Ok((id, rep)),
            Err(mlx5::Error::Uverbs { errno, .. })
                if errno == mlx5::error::Errno::ECONNREFUSED && Instant::now() < until =>
            {
                // perftest's server listens again only after the first key exchange
                drop(id);
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(format!("rdma_cm connect to {dst}: {e}")),
        }
    }
}

fn check_conn(conn: Conn) -> Result<(), String> {
    match conn {
        Conn::Rc => Ok(()),
        Conn::Uc => Err("-R: UC is not supported in librdmacm (as perftest says)".into()),
        other => Err(format!(
            "-R with -c {}: only RC connects through rdma_cm in this tool",
            other.name()
        )),
    }
}

/// `mlx5 lat|bw ... -R` against a peer process: perftest's `-R` exchange (module docs).
pub fn run<O>(plan: &Plan, a: &TestArgs<O>) -> Result<(), String>
where
    O: clap::ValueEnum + Clone + Send + Sync + 'static,
{
    check_conn(plan.testbed.conn)?;
    if plan.params.duration.is_some() {
        return Err("-D is not supported with a peer yet: use -n (the same on both sides)".into());
    }
    let role = if a.server { Role::Server } else { Role::Client };
    let (op, lat) = (plan.op, plan.lat);
    let port = a.port.unwrap_or(crate::cli::DEFAULT_PORT);
    let mut end = SingleEnd::open(&plan.testbed)?;
    let chan = channel(&end)?;
    let mut comm = CommQp::new(&end, plan.params.patience)?;
    let out_reads = plan.testbed.max_rd_atomic;
    let rd = matches!(op, Op::Read | Op::FetchAdd | Op::CmpSwap);
    let param = ConnParam {
        responder_resources: if rd { out_reads } else { 0 },
        initiator_depth: if rd { out_reads } else { 0 },
        ..ConnParam::default()
    };
    let comm_param = ConnParam {
        responder_resources: 0,
        initiator_depth: 0,
        ..ConnParam::default()
    };
    let wait = plan.params.patience.unwrap_or(Duration::from_secs(3600));

    // 1. the communication connection (ours: one listener for both connections)
    let listener = match role {
        Role::Server => {
            let l = chan
                .create_id(PortSpace::Tcp)
                .map_err(cm_err("CREATE_ID"))?;
            l.bind(bind_addr(a.bind.as_deref(), port)?)
                .map_err(cm_err("bind"))?;
            l.listen(4).map_err(cm_err("listen"))?;
            eprintln!("************************************");
            eprintln!("* Waiting for client to connect... *");
            eprintln!("************************************");
            Some(l)
        }
        Role::Client => None,
    };
    let (comm_id, dst) = match &listener {
        Some(l) => {
            let req = l.get_request(wait).map_err(cm_err("connection request"))?;
            req.init_qp(&mut comm.qp)
                .map_err(cm_err("comm QP to INIT"))?;
            comm.post_recv().map_err(|e| e.to_string())?;
            req.accept(&mut comm.qp, &comm_param)
                .map_err(cm_err("accept"))?;
            (req.id, None)
        }
        None => {
            let dst = resolve(a.host.as_deref().unwrap_or("127.0.0.1"), port)?;
            let (id, _) = connect(&chan, dst, &mut comm.qp, &comm_param)?;
            (id, Some(dst))
        }
    };
    // the client's receive: posted here, after INIT and before the peer can answer (its
    // first message is the answer to ours)
    if role == Role::Client {
        comm.post_recv().map_err(|e| e.to_string())?;
    }

    // 2. the preamble, as over TCP
    let peer_mtu = exchange::perftest_preamble(&mut comm, role, 4096, 64, end.mtu())
        .map_err(|e| format!("rdma_cm exchange: {e}"))?;
    let _ = peer_mtu;

    // 3. a barrier, the data connection, another barrier
    let key0 = end.key(u16::from(out_reads));
    keys(&mut comm, role, &key0)?;
    let data_id = match (&listener, dst) {
        (Some(l), _) => {
            let req = l.get_request(wait).map_err(cm_err("connection request"))?;
            req.init_qp(end.qp_mut())
                .map_err(cm_err("data QP to INIT"))?;
            req.accept(end.qp_mut(), &param).map_err(cm_err("accept"))?;
            req.id
        }
        (None, Some(dst)) => connect(&chan, dst, end.qp_mut(), &param)?.0,
        (None, None) => unreachable!("a client has a destination"),
    };
    drop(listener);
    keys(&mut comm, role, &key0)?;

    // 4. the exchanges of the TCP mode, the keys binary
    let key = end.key(u16::from(out_reads));
    let peer = keys(&mut comm, role, &key)?;
    end.set_remote_window(peer.vaddr, peer.rkey);
    let barrier = |comm: &mut CommQp, n: u32| -> Result<(), String> {
        for _ in 0..n {
            keys(comm, role, &key)?;
        }
        Ok(())
    };
    let (before, per_size, per_size_after, after) =
        crate::remote::handshakes(op, lat, plan.sizes.len() > 1);
    barrier(&mut comm, before - 1)?;
    let rdma = matches!(op, Op::Write | Op::Read | Op::FetchAdd | Op::CmpSwap);
    let remote = crate::report::Endpoint {
        lid: peer.lid,
        qpn: peer.qpn,
        psn: peer.psn,
        rkey_vaddr: rdma.then_some((peer.rkey, peer.vaddr)),
        gid: peer.gid,
    };
    let mut local = end.endpoint();
    if !rdma {
        local.rkey_vaddr = None;
    }
    let mut rep = Reporter::new(plan, a);
    let mut header = rep.header(
        plan,
        end.device(),
        end.bf(),
        end.max_inline(),
        end.buffers(),
        "rdma_cm",
        local,
        remote,
    );
    (header.ethernet, header.gid_index) = end.link();
    rep.begin(end.emulated(), &header)?;
    let mut ours = exchange::BwReport::default();
    for &size in &plan.sizes {
        if op == Op::Send && (lat || role == Role::Server) {
            let n = if lat {
                1
            } else {
                plan.params.rx_depth.max(plan.params.tx_depth).max(1)
            };
            end.side().ensure_recv(n, size as u32)?;
        }
        barrier(&mut comm, per_size)?;
        if !a.connect_only {
            if let Some(report) = crate::remote::run_size(&mut end, &mut rep, role, plan, size)? {
                ours = report;
            }
        }
        barrier(&mut comm, per_size_after)?;
    }
    let server_measures = lat && matches!(op, Op::Send | Op::Write);
    let bw_report = !lat && op != Op::Send;
    if a.connect_only {
        rep.note("--connect_only: connected through rdma_cm; nothing measured")?;
    } else if role == Role::Server && !server_measures && !bw_report && op != Op::Send {
        rep.note("server side: the client issues the requests and reports the results")?;
    }
    for i in 0..after {
        barrier(&mut comm, 1)?;
        if bw_report && i == 0 {
            let theirs = exchange::bw_reports(&mut comm, role, &ours)
                .map_err(|e| format!("rdma_cm report exchange: {e}"))?;
            if role == Role::Server && !a.connect_only {
                rep.bw_stats(&crate::stats::BwStats {
                    bytes: theirs.size,
                    iterations: theirs.iters,
                    bw_peak_mib: theirs.bw_peak,
                    bw_average_mib: theirs.bw_avg,
                    msg_rate_mpps: theirs.msg_rate,
                    peak_window: 0,
                })?;
            }
        }
    }
    // 5. teardown: the data connection's DREQ (perftest's client sends one too and waits
    // for its DISCONNECTED; its server just destroys its ids); a peer that is already gone
    // is not an error any more
    if data_id.disconnect().is_ok() {
        let _ = data_id.wait_disconnected();
    }
    drop(data_id);
    drop(comm_id);
    rep.finish(
        &header,
        end.emulated(),
        end.counters(),
        end.driver_counters(),
        end.cost(),
    )
}

/// `mlx5 pingpong -R`: the test's QP (in INIT, its receives posted) connected through
/// rdma_cm instead of ibv_rc_pingpong's address exchange; then the same measurement.
pub fn pingpong(
    end: &mut SingleEnd,
    a: &PingpongArgs,
    role: Role,
    p: &crate::bench::RunParams,
) -> Result<(), String> {
    if a.gid_idx.is_some() {
        return Err("-R with -g: the path comes from rdma_cm (drop -g)".into());
    }
    let chan = channel(end)?;
    let port = a.port.unwrap_or(crate::cli::DEFAULT_PORT);
    let param = ConnParam {
        responder_resources: 0,
        initiator_depth: 0,
        ..ConnParam::default()
    };
    let (id, peer_qpn) = match role {
        Role::Server => {
            let l = chan
                .create_id(PortSpace::Tcp)
                .map_err(cm_err("CREATE_ID"))?;
            l.bind(bind_addr(a.bind.as_deref(), port)?)
                .map_err(cm_err("bind"))?;
            l.listen(1).map_err(cm_err("listen"))?;
            let wait = p.patience.unwrap_or(Duration::from_secs(3600));
            let req = l.get_request(wait).map_err(cm_err("connection request"))?;
            req.init_qp(end.qp_mut()).map_err(cm_err("QP to INIT"))?;
            req.accept(end.qp_mut(), &param).map_err(cm_err("accept"))?;
            (req.id, req.event.qp_num)
        }
        Role::Client => {
            let dst = resolve(a.host.as_deref().unwrap_or("127.0.0.1"), port)?;
            let (id, rep) = connect(&chan, dst, end.qp_mut(), &param)?;
            (id, rep.qp_num)
        }
    };
    println!("  remote address: QPN {peer_qpn:#08x}, connected through rdma_cm");
    let res = crate::remote::pingpong_measure(end, a, p, role);
    if id.disconnect().is_ok() {
        let _ = id.wait_disconnected();
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dest_is_perftests_struct_big_endian() {
        let k = PerftestKey {
            lid: 3,
            out_reads: 16,
            qpn: 0x12_3456,
            psn: 0xab_cdef,
            rkey: 0x1042,
            vaddr: 0x55fc_9584_0000,
            srqn: 0,
            gid: None,
        };
        let b = encode_dest(&k);
        assert_eq!(&b[0..4], &[0, 0, 0, 3]);
        assert_eq!(&b[4..8], &[0, 0, 0, 16]);
        assert_eq!(&b[8..12], &[0, 0x12, 0x34, 0x56]);
        assert_eq!(&b[16..20], &[0, 0, 0x10, 0x42]);
        assert_eq!(&b[20..24], &[0; 4], "padding before the 64-bit VADDR");
        assert_eq!(&b[24..32], &0x55fc_9584_0000u64.to_be_bytes());
        assert_eq!(&b[52..56], &(-1i32).to_be_bytes());
        assert_eq!(decode_dest(&b).unwrap(), k);
        let mut g = k;
        g.gid = Some([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 1, 0, 2]);
        assert_eq!(decode_dest(&encode_dest(&g)).unwrap(), g);
        // a message of another size is refused by name
        let e = decode_dest(&b[..16]).unwrap_err();
        assert!(e.contains("16 bytes"), "{e}");
    }

    #[test]
    fn bind_and_resolve_name_their_errors() {
        assert!(
            bind_addr(Some("not-an-address"), 1)
                .unwrap_err()
                .contains("--bind")
        );
        assert_eq!(
            resolve("127.0.0.1", 18515).unwrap(),
            "127.0.0.1:18515".parse().unwrap()
        );
        assert_eq!(resolve("localhost", 7).unwrap().port(), 7);
    }
}
