//! `rping` with this driver: the same exchange as librdmacm's `rping`, connected through
//! rdma_cm ([`mlx5::cm`]), so it interoperates with unmodified `rping` in either role.
//!
//! ```sh
//! cargo run --release --example rping -- -s [-a ADDR] [-p PORT] [-C COUNT] [-S SIZE] [-v] [-V]
//! cargo run --release --example rping -- -c -a ADDR [-p PORT] [-C COUNT] [-S SIZE] [-v] [-V]
//! ```
//!
//! Per ping: the client fills its start buffer (`rdma-ping-N: ` and a rotating alphabet) and
//! SENDs its address, rkey and size; the server RDMA READs it, answers with a SEND; the
//! client SENDs the address of its RDMA buffer; the server RDMA WRITEs the data back and
//! answers; the client checks (`-V`) and prints (`-v`) it. The client then disconnects.
//!
//! Runs on the first ConnectX found, else on an emulated HCA in this process on the UDP
//! fabric, so it reaches an `rping` running under `mlx5 emu run` (or another instance of
//! this example) on the same host.

use std::error::Error;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mlx5::cm::{ConnParam, EventChannel, PortSpace};
use mlx5::emulator::{EmuConfig, Emulator, Fabric, Hca};
use mlx5::{
    Access, Cq, CqInit, DmaBuf, Mr, Pd, Qp, QpInitAttr, QpType, RecvWr, SendFlags, SendWr,
    WorkCompletion, WrOp,
};

const DEADLINE: Duration = Duration::from_secs(30);
/// Offsets in the one registered buffer.
const RECV: usize = 0;
const SEND: usize = 64;
const RDMA: usize = 4096;
const START: usize = 8192;
const MAX_SIZE: usize = 4096;

struct Opts {
    server: bool,
    addr: IpAddr,
    port: u16,
    count: u32,
    size: usize,
    verbose: bool,
    validate: bool,
}

fn opts() -> Result<Opts, Box<dyn Error>> {
    let mut o = Opts {
        server: false,
        addr: "0.0.0.0".parse()?,
        port: 7174,
        count: 0,
        size: 64,
        verbose: false,
        validate: false,
    };
    let mut role = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match a.as_str() {
            "-s" => role = Some(true),
            "-c" => role = Some(false),
            "-a" => o.addr = val("-a")?.parse()?,
            "-p" => o.port = val("-p")?.parse()?,
            "-C" => o.count = val("-C")?.parse()?,
            "-S" => o.size = val("-S")?.parse()?,
            "-v" => o.verbose = true,
            "-V" => o.validate = true,
            _ => return Err(format!("unknown option {a:?}").into()),
        }
    }
    o.server = role.ok_or("-s (server) or -c (client) is required")?;
    if !(16..=MAX_SIZE).contains(&o.size) {
        return Err(format!("-S {} is not in 16..={MAX_SIZE}", o.size).into());
    }
    if o.count == 0 {
        o.count = 10;
    }
    Ok(o)
}

/// The QP, its CQs and the registered buffer.
struct End {
    buf: Arc<DmaBuf>,
    mr: Mr,
    qp: Qp,
    scq: Cq,
    rcq: Cq,
}

impl End {
    fn post_recv(&mut self) -> Result<(), Box<dyn Error>> {
        let sge = [self.mr.sge(RECV as u64, 16)];
        self.qp
            .post_recv(&[RecvWr {
                wr_id: 1,
                sg_list: &sge,
            }])
            .map_err(|(_, e)| e)?;
        Ok(())
    }

    /// SEND the 16-byte `struct rping_rdma_info` {addr BE64, rkey BE32, size BE32}.
    fn send_info(&mut self, at: usize, size: usize) -> Result<(), Box<dyn Error>> {
        let mut m = [0u8; 16];
        m[..8].copy_from_slice(&(self.mr.addr() + at as u64).to_be_bytes());
        m[8..12].copy_from_slice(&self.mr.rkey().to_be_bytes());
        m[12..].copy_from_slice(&(size as u32).to_be_bytes());
        self.buf.write(SEND, &m);
        let sge = [self.mr.sge(SEND as u64, 16)];
        self.qp
            .post_send(&[SendWr::send(2, &sge, SendFlags::SIGNALED)])
            .map_err(|(_, e)| e)?;
        wait(&mut self.scq, "SEND")?;
        Ok(())
    }

    /// Wait for the peer's 16-byte message; repost the receive; return its content.
    fn recv_info(&mut self) -> Result<(u64, u32, u32), Box<dyn Error>> {
        let wc = wait(&mut self.rcq, "RECV")?;
        if wc.byte_len != 16 {
            return Err(format!("received bogus data, size {}", wc.byte_len).into());
        }
        let mut m = [0u8; 16];
        self.buf.read(RECV, &mut m);
        self.post_recv()?;
        let addr = u64::from_be_bytes(m[..8].try_into()?);
        let rkey = u32::from_be_bytes(m[8..12].try_into()?);
        let len = u32::from_be_bytes(m[12..].try_into()?);
        Ok((addr, rkey, len))
    }

    fn rdma(&mut self, op: WrOp, len: u32) -> Result<(), Box<dyn Error>> {
        let sge = [self.mr.sge(RDMA as u64, len)];
        self.qp
            .post_send(&[SendWr::new(3, op, &sge, SendFlags::SIGNALED)])
            .map_err(|(_, e)| e)?;
        wait(&mut self.scq, "RDMA")?;
        Ok(())
    }

    /// The NUL-terminated string at `at`.
    fn string(&self, at: usize, max: usize) -> String {
        let mut b = vec![0u8; max];
        self.buf.read(at, &mut b);
        let n = b.iter().position(|&c| c == 0).unwrap_or(max);
        String::from_utf8_lossy(&b[..n]).into_owned()
    }
}

fn wait(cq: &mut Cq, what: &str) -> Result<WorkCompletion, Box<dyn Error>> {
    let deadline = Instant::now() + DEADLINE;
    let mut wc = [WorkCompletion::default(); 1];
    while cq.poll(&mut wc) == 0 {
        if Instant::now() > deadline {
            return Err(format!("no {what} completion within {DEADLINE:?}").into());
        }
        std::thread::yield_now();
    }
    if !wc[0].is_ok() {
        return Err(format!("{what} failed: {}", wc[0]).into());
    }
    Ok(wc[0])
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rping: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn Error>> {
    let o = opts()?;
    // A real device, else an emulated HCA that other processes can reach (UDP fabric).
    let hca = match Hca::first_or_emulated() {
        Hca::Emulated(_) => Hca::Emulated(Emulator::new(EmuConfig {
            fabric: Fabric::Udp,
            ..EmuConfig::default()
        })),
        d => d,
    };
    let ctx = hca.open()?;
    let pd = Pd::new(&ctx)?;
    let buf = Arc::new(DmaBuf::new(START + MAX_SIZE)?);
    let mr = pd.reg_mr(&buf, Access::ALL)?;
    let scq = Cq::new(&ctx, CqInit::default(), None)?;
    let rcq = Cq::new(&ctx, CqInit::default(), None)?;
    let qp = Qp::new(&pd, &QpInitAttr::new(QpType::Rc, &scq, &rcq))?;
    let mut end = End {
        buf,
        mr,
        qp,
        scq,
        rcq,
    };
    let chan = EventChannel::open(&hca)?;
    let id = chan.create_id(PortSpace::Tcp)?;
    let sa = SocketAddr::new(o.addr, o.port);
    if o.server {
        id.bind(sa)?;
        id.listen(1)?;
        let req = id.get_request(Duration::from_secs(600))?;
        req.init_qp(&mut end.qp)?;
        end.post_recv()?;
        req.accept(&mut end.qp, &ConnParam::default())?;
        for _ in 0..o.count {
            let (addr, rkey, len) = end.recv_info()?;
            let len = len.min(o.size as u32);
            end.rdma(WrOp::Read { raddr: addr, rkey }, len)?;
            if o.verbose {
                println!("server ping data: {}", end.string(RDMA, len as usize));
            }
            end.send_info(RDMA, 0)?;
            let (addr, rkey, rlen) = end.recv_info()?;
            let s = end.string(RDMA, len as usize);
            let n = (s.len() as u32 + 1).min(rlen).min(len);
            end.rdma(WrOp::Write { raddr: addr, rkey }, n)?;
            end.send_info(RDMA, 0)?;
        }
        // The client disconnects after its last ping.
        req.id.wait_disconnected()?;
        let _ = req.id.disconnect();
        println!("server DISCONNECT EVENT...");
    } else {
        id.resolve(sa)?;
        id.init_qp(&mut end.qp)?;
        end.post_recv()?;
        id.connect_resolved(&mut end.qp, &ConnParam::default())?;
        let mut start = 65u8;
        for ping in 0..o.count {
            let head = format!("rdma-ping-{ping}: ");
            let mut msg = head.into_bytes();
            let mut c = start;
            while msg.len() < o.size - 1 {
                msg.push(c);
                c = if c >= 122 { 65 } else { c + 1 };
            }
            msg.push(0);
            start = if start >= 122 { 65 } else { start + 1 };
            end.buf.write(START, &msg);
            end.buf.write(RDMA, &vec![0u8; o.size]);
            end.send_info(START, o.size)?;
            end.recv_info()?;
            end.send_info(RDMA, o.size)?;
            end.recv_info()?;
            let got = end.string(RDMA, o.size);
            if o.validate && got.as_bytes() != &msg[..msg.len() - 1] {
                return Err(format!("data mismatch in ping {ping}: {got:?}").into());
            }
            if o.verbose {
                println!("ping data: {got}");
            }
        }
        id.disconnect()?;
        id.wait_disconnected()?;
        println!("client DISCONNECT EVENT...");
    }
    Ok(())
}
