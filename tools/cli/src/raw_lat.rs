//! `mlx5 lat raw`: raw Ethernet latency, as perftest's `raw_ethernet_lat`, through the
//! driver's RAW_PACKET QP (`mlx5::raw::RawQp`) and a steering rule, with the CLI's report
//! (the `lat send` table, JSON, `-H`/`-U`, the SVG picture).
//!
//! Roles as perftest's raw tools (no TCP exchange: both MACs on the command line):
//! `-Z` server, `-P` client, `-B` own MAC, `-E` the peer's; `-J`/`-j` the server's and the
//! client's IPv4 address and `-K`/`-k` their UDP ports (the same four on both sides) put
//! IPv4 and UDP headers into the frames and the rules. The frames are perftest's: Ethernet
//! (EtherType IPv4, or without IP the 802.3 length `size - 18`), IPv4 and UDP from the
//! sender to the receiver (the server answers with addresses and ports swapped), `-s`
//! bytes in all. The rule of each side matches its own MAC as destination; with IP the
//! server's also the client's source and its own destination address, with ports both
//! sides' the peer's source and their own destination port (what `raw_ethernet_lat`
//! installs, so each side takes the other's frames). The client sends, waits for the
//! answer, and reports half of each round trip; the server answers `-n` frames.
//! Without `-Z`/`-P` both ends run in this process on two emulated HCAs (loopback).

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use mlx5::flow::FlowRule;
use mlx5::raw::{FramePayload, RawQp, RawQpInit, TxOffload};
use mlx5::{Access, Context, ContextConfig, Cq, CqInit, DmaBuf, Mr, Pd, RawCq, SendFlags};
use mlx5_emu::{EmuConfig, Emulator, Fabric, LinkLayer, RunMode};

use crate::app::{Reporter, plan};
use crate::bench::Op;
use crate::cli::{LatOp, TestArgs};
use crate::report::Endpoint;

/// perftest's raw-Ethernet options (`raw_ethernet_lat`), parsed with every `lat`/`bw`
/// test and refused by name by all but `lat raw`.
#[derive(Debug, Args, Default, Clone)]
pub struct RawArgs {
    /// `lat raw`: this side's MAC (perftest's -B).
    #[arg(short = 'B', long = "source_mac", value_name = "MAC")]
    pub source_mac: Option<String>,
    /// `lat raw`: the peer's MAC (perftest's -E).
    #[arg(short = 'E', long = "dest_mac", value_name = "MAC")]
    pub dest_mac: Option<String>,
    /// `lat raw`: the server's IPv4 address (perftest's -J; both sides give the same).
    #[arg(short = 'J', long = "server_ip", value_name = "IP")]
    pub server_ip: Option<Ipv4Addr>,
    /// `lat raw`: the client's IPv4 address (perftest's -j).
    #[arg(short = 'j', long = "client_ip", value_name = "IP")]
    pub client_ip: Option<Ipv4Addr>,
    /// `lat raw`: the server's UDP port (perftest's -K).
    #[arg(short = 'K', long = "server_port", value_name = "PORT")]
    pub server_port: Option<u16>,
    /// `lat raw`: the client's UDP port (perftest's -k).
    #[arg(short = 'k', long = "client_port", value_name = "PORT")]
    pub client_port: Option<u16>,
    /// `lat raw`: the server role (perftest's -Z).
    #[arg(short = 'Z', long = "raw_server", conflicts_with = "raw_client")]
    pub raw_server: bool,
    /// `lat raw`: the client role (perftest's -P).
    #[arg(short = 'P', long = "raw_client")]
    pub raw_client: bool,
}

impl RawArgs {
    /// For every test but `lat raw`: refuse the raw options by name.
    ///
    /// # Errors
    /// The first raw option given.
    pub fn refuse(&self) -> Result<(), String> {
        let given = [
            (self.source_mac.is_some(), "-B/--source_mac"),
            (self.dest_mac.is_some(), "-E/--dest_mac"),
            (self.server_ip.is_some(), "-J/--server_ip"),
            (self.client_ip.is_some(), "-j/--client_ip"),
            (self.server_port.is_some(), "-K/--server_port"),
            (self.client_port.is_some(), "-k/--client_port"),
            (self.raw_server, "-Z"),
            (self.raw_client, "-P"),
        ];
        match given.iter().find(|g| g.0) {
            Some((_, name)) => Err(format!("{name}: raw Ethernet option, `lat raw` only")),
            None => Ok(()),
        }
    }
}

/// Parse `aa:bb:cc:dd:ee:ff`.
///
/// # Errors
/// What is wrong with `s`.
pub fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let parts: Vec<&str> = s.split(':').collect();
    if parts.len() != 6 {
        return Err(format!("MAC {s:?}: six hex bytes separated by ':'"));
    }
    let mut m = [0u8; 6];
    for (b, p) in m.iter_mut().zip(&parts) {
        *b =
            u8::from_str_radix(p, 16).map_err(|_| format!("MAC {s:?}: {p:?} is not a hex byte"))?;
    }
    Ok(m)
}

/// Which end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Answers frames (`-Z`).
    Server,
    /// Sends and measures (`-P`).
    Client,
}

/// The addresses of one direction's frames and rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Addressing {
    /// This side's MAC (frames' source, the rule's destination).
    pub me: [u8; 6],
    /// The peer's MAC.
    pub peer: [u8; 6],
    /// (server, client) IPv4 addresses, if the frames carry IP.
    pub ip: Option<(Ipv4Addr, Ipv4Addr)>,
    /// (server, client) UDP ports, if the frames carry UDP (needs `ip`).
    pub ports: Option<(u16, u16)>,
}

impl Addressing {
    /// Header bytes of the frames.
    pub fn header_len(&self) -> usize {
        14 + if self.ip.is_some() { 20 } else { 0 } + if self.ports.is_some() { 8 } else { 0 }
    }

    /// The frame `role` sends: `size` bytes, checksums left for the device.
    pub fn frame(&self, role: Role, size: usize) -> Vec<u8> {
        let mut f = vec![0u8; size];
        f[..6].copy_from_slice(&self.peer);
        f[6..12].copy_from_slice(&self.me);
        let ether = match self.ip {
            Some(_) => 0x0800,
            // perftest: the 802.3 length, its RAWETH_ADDITION (18) less than the size
            None => size.saturating_sub(18) as u16,
        };
        f[12..14].copy_from_slice(&ether.to_be_bytes());
        if let Some((server, client)) = self.ip {
            let (src, dst) = match role {
                Role::Client => (client, server),
                Role::Server => (server, client),
            };
            let ip = &mut f[14..34];
            ip[0] = 0x45;
            ip[2..4].copy_from_slice(&((size - 14) as u16).to_be_bytes());
            ip[6] = 0x40; // don't fragment
            ip[8] = 64;
            ip[9] = if self.ports.is_some() { 17 } else { 0xfd };
            ip[12..16].copy_from_slice(&src.octets());
            ip[16..20].copy_from_slice(&dst.octets());
            if let Some((sp, cp)) = self.ports {
                let (s, d) = match role {
                    Role::Client => (cp, sp),
                    Role::Server => (sp, cp),
                };
                let u = &mut f[34..42];
                u[0..2].copy_from_slice(&s.to_be_bytes());
                u[2..4].copy_from_slice(&d.to_be_bytes());
                u[4..6].copy_from_slice(&((size - 34) as u16).to_be_bytes());
            }
        }
        for (i, b) in f.iter_mut().enumerate().skip(self.header_len()) {
            *b = i as u8;
        }
        f
    }

    /// The rule taking the peer's frames on `role`'s side.
    pub fn rule(&self, role: Role) -> Result<FlowRule, String> {
        let mut r = FlowRule::new().dst_mac(self.me);
        if let (Role::Server, Some((server, client))) = (role, self.ip) {
            r = r.ipv4_src(client).ipv4_dst(server);
        }
        if let Some((sp, cp)) = self.ports {
            let (own, peer) = match role {
                Role::Server => (sp, cp),
                Role::Client => (cp, sp),
            };
            r = r.udp_dst_port(own).udp_src_port(peer);
        }
        Ok(r)
    }
}

/// The addressing the options give; `local` are the MACs of a loopback run.
fn addressing(raw: &RawArgs, local: Option<([u8; 6], [u8; 6])>) -> Result<Addressing, String> {
    let (me, peer) = match local {
        Some(m) => m,
        None => {
            let me = raw
                .source_mac
                .as_deref()
                .ok_or("-B: this side's MAC is needed (perftest's raw tools take both)")?;
            let peer = raw
                .dest_mac
                .as_deref()
                .ok_or("-E: the peer's MAC is needed (perftest's raw tools take both)")?;
            (parse_mac(me)?, parse_mac(peer)?)
        }
    };
    let ip = match (raw.server_ip, raw.client_ip) {
        (None, None) => None,
        (Some(s), Some(c)) => Some((s, c)),
        _ => return Err("-J and -j: give both IPv4 addresses (server and client)".into()),
    };
    let ports = match (raw.server_port, raw.client_port) {
        (None, None) => None,
        (Some(s), Some(c)) if ip.is_some() => Some((s, c)),
        (Some(_), Some(_)) => return Err("-K/-k: UDP ports need the IP headers (-J/-j)".into()),
        _ => return Err("-K and -k: give both UDP ports (server and client)".into()),
    };
    Ok(Addressing {
        me,
        peer,
        ip,
        ports,
    })
}

/// One side: its context, QP, CQs and the frame it sends.
struct Side {
    qp: RawQp,
    scq: RawCq,
    rcq: RawCq,
    frame: Vec<u8>,
    /// Frames posted and send completions retired.
    sent: u64,
    done: u64,
    buf: Arc<DmaBuf>,
    mr: Mr,
    _flow: mlx5::flow::Flow,
    _pd: Pd,
    ctx: Context,
}

impl Side {
    fn new(
        ctx: Context,
        role: Role,
        addr: &Addressing,
        size: usize,
        rx: u32,
    ) -> Result<Side, String> {
        let e = |what: &'static str| move |x: mlx5::Error| format!("{what}: {x}");
        let pd = Pd::new(&ctx).map_err(e("ALLOC_PD"))?;
        let cq = |n| {
            Cq::new(
                &ctx,
                CqInit {
                    cqe: n,
                    ..CqInit::default()
                },
                None,
            )
            .map_err(e("CREATE_CQ"))
        };
        let (scq, rcq) = (cq(64)?, cq(rx.max(64))?);
        let mut init = RawQpInit::new(&scq, &rcq);
        init.max_send_wr = 16;
        init.rx_frames = rx;
        init.rx_frame_bytes = (size as u32).next_power_of_two().max(2048);
        init.sq_sig_all = true;
        let mut qp = RawQp::new(&pd, &init).map_err(e("RAW_PACKET QP"))?;
        qp.activate(1).map_err(e("raw QP to RTS"))?;
        let flow = qp
            .attach_flow(&addr.rule(role)?)
            .map_err(e("CREATE_FLOW"))?;
        let frame = addr.frame(role, size);
        let buf = Arc::new(DmaBuf::new(size).map_err(e("frame buffer"))?);
        buf.write(0, &frame);
        let mr = pd.reg_mr(&buf, Access::LOCAL_WRITE).map_err(e("REG_MR"))?;
        let scq = scq
            .into_raw()
            .map_err(|_| "the send CQ has no raw poller".to_string())?;
        let rcq = rcq
            .into_raw()
            .map_err(|_| "the receive CQ has no raw poller".to_string())?;
        Ok(Side {
            qp,
            scq,
            rcq,
            frame,
            sent: 0,
            done: 0,
            buf,
            mr,
            _flow: flow,
            _pd: pd,
            ctx,
        })
    }

    /// Send the frame (headers inline as the device needs, the rest inline when it fits,
    /// else gathered), retire finished sends.
    fn send(&mut self, inline_max: usize, n: u64) -> Result<(), String> {
        // Taken out while the queue is reaped (no copy: the vector moves).
        let frame = std::mem::take(&mut self.frame);
        let r = self.send_frame(&frame, inline_max, n);
        self.frame = frame;
        r
    }

    fn send_frame(&mut self, frame: &[u8], inline_max: usize, n: u64) -> Result<(), String> {
        let hl = self.qp.min_inline();
        let (h, rest) = frame.split_at(hl);
        let sge = [self.mr.sge(hl as u64, rest.len() as u32)];
        let payload = if rest.len() <= inline_max {
            FramePayload::Inline(rest)
        } else {
            FramePayload::Gather(&sge)
        };
        let off = TxOffload {
            ip_csum: frame[12..14] == [0x08, 0x00],
            l4_csum: frame[12..14] == [0x08, 0x00] && frame.get(23) == Some(&17),
            vlan: None,
        };
        let mut tries = 0;
        loop {
            match self.qp.send(h, payload, off, SendFlags::SIGNALED, n) {
                Ok(()) => break,
                Err(mlx5::raw::RawSendError::Post(mlx5::PostError::Full { .. }))
                    if tries < 1_000_000 =>
                {
                    tries += 1;
                    self.reap()?;
                }
                Err(x) => return Err(format!("send frame {n}: {x}")),
            }
        }
        self.qp.ring();
        self.sent += 1;
        self.reap()
    }

    fn reap(&mut self) -> Result<(), String> {
        for c in self.scq.by_ref() {
            if c.status() != mlx5::WcStatus::SUCCESS {
                return Err(format!("send completion: {:?}", c.status()));
            }
            self.qp
                .send_done(&c)
                .map_err(|x| format!("send completion: {x}"))?;
            self.done += 1;
        }
        self.scq.publish_ci();
        Ok(())
    }

    /// Wait for one frame (busy poll) at most `patience`.
    fn recv(&mut self, patience: Option<Duration>, what: &str) -> Result<(), String> {
        let t = Instant::now();
        loop {
            let mut bad = None;
            let got = self
                .qp
                .recv_batch(&mut self.rcq, 1, |f, _| {
                    if f.status != mlx5::WcStatus::SUCCESS {
                        bad = Some(f.status);
                    }
                })
                .map_err(|x| format!("receive: {x}"))?;
            if let Some(s) = bad {
                return Err(format!("receive completion: {s:?}"));
            }
            if got > 0 {
                return Ok(());
            }
            if let Some(p) = patience {
                if t.elapsed() > p {
                    return Err(format!(
                        "{what}: nothing from the peer in {p:?} (--peer_timeout)"
                    ));
                }
            }
            std::hint::spin_loop();
        }
    }
}

/// The emulated device for a raw run: Ethernet, threaded; across processes on the UDP
/// fabric at node `MLX5_EMU_NODE` (as the preload), so that its MAC follows the rule of
/// docs/raw-ethernet.md.
fn emulator(hcas: usize, cross: bool) -> Result<Emulator, String> {
    let node = match std::env::var("MLX5_EMU_NODE") {
        Ok(v) => Some(
            v.trim()
                .parse::<u16>()
                .ok()
                .filter(|n| (1..=254).contains(n))
                .ok_or_else(|| format!("MLX5_EMU_NODE={v:?}: a node number in 1..=254"))?,
        ),
        Err(_) => None,
    };
    Ok(Emulator::new(EmuConfig {
        num_hcas: hcas,
        mode: RunMode::Threaded,
        fabric: if cross {
            Fabric::Udp
        } else {
            Fabric::InProcess
        },
        node,
        link_layer: LinkLayer::Ethernet,
        ..EmuConfig::default()
    }))
}

fn open_emulated(emu: &Emulator, i: usize) -> Result<Context, String> {
    let s = emu.open(i).map_err(|e| format!("emulated HCA {i}: {e}"))?;
    Context::open_with(s, ContextConfig::default()).map_err(|e| format!("emulated context: {e}"))
}

fn mac_text(m: &[u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02X}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// `mlx5 lat raw`.
///
/// # Errors
/// Bad options, device or QP set-up failures, a peer that stays silent.
pub fn run(a: &TestArgs<LatOp>) -> Result<(), String> {
    if a.host.is_some() {
        return Err(
            "lat raw: no HOST (raw tools have no TCP exchange): -Z or -P with -B/-E".into(),
        );
    }
    if a.all {
        return Err("-a: lat raw runs one frame size (-s, default 64)".into());
    }
    if a.atomic_type.is_some() {
        return Err("-A/--atomic_type: `lat atomic` only".into());
    }
    for (given, name) in [
        (a.rdma_cm, "-R/--rdma_cm"),
        (a.connect_only, "--connect_only"),
        (a.bind.is_some(), "--bind"),
        (a.port.is_some(), "-p"),
    ] {
        if given {
            return Err(format!("{name}: raw tools have no connection to make"));
        }
    }
    let role = match (a.raw.raw_server || a.server, a.raw.raw_client) {
        (true, true) => return Err("-Z and -P: one role".into()),
        (true, false) => Some(Role::Server),
        (false, true) => Some(Role::Client),
        (false, false) => None,
    };
    let mut plan = plan(Op::Send, true, a)?;
    let size = a.size.unwrap_or(64);
    plan.sizes = vec![size];
    let iters = plan.params.iters;
    let emu_forced = a.emu || std::env::var_os("MLX5_EMU_NODE").is_some();
    let real = if emu_forced {
        None
    } else {
        mlx5::devices().ok().and_then(|l| {
            l.into_iter()
                .find(|d| a.dev.as_deref().is_none_or(|n| d.name == n))
        })
    };
    // The sides, and who measures.
    let (mut sides, addr, device, emulated, _emu) = match role {
        None => {
            if real.is_some() {
                return Err("lat raw without -Z/-P runs both ends on two emulated HCAs; on a real NIC run -Z and -P (or add --emu)".into());
            }
            let emu = emulator(2, false)?;
            let mac = |i| emu.hca_info(i).map(|h| h.mac).ok_or("no emulated HCA");
            let (m0, m1) = (mac(0)?, mac(1)?);
            let addr = addressing(&a.raw, Some((m0, m1)))?;
            let back = Addressing {
                me: m1,
                peer: m0,
                ..addr
            };
            let hl = addr.header_len() as u64;
            if size < hl.max(14) || size > 9000 {
                return Err(format!(
                    "-s {size}: a frame of {} to 9000 bytes",
                    hl.max(14)
                ));
            }
            let c = Side::new(
                open_emulated(&emu, 0)?,
                Role::Client,
                &addr,
                size as usize,
                64,
            )?;
            let s = Side::new(
                open_emulated(&emu, 1)?,
                Role::Server,
                &back,
                size as usize,
                64,
            )?;
            (
                vec![c, s],
                addr,
                "mlx5_0 -> mlx5_1 (emulated)".to_string(),
                true,
                Some(emu),
            )
        }
        Some(r) => {
            let addr = addressing(&a.raw, None)?;
            let hl = addr.header_len() as u64;
            if size < hl.max(14) || size > 9000 {
                return Err(format!(
                    "-s {size}: a frame of {} to 9000 bytes",
                    hl.max(14)
                ));
            }
            let (ctx, device, emu) = match real {
                Some(d) => (
                    d.open().map_err(|e| format!("{}: {e}", d.name))?,
                    d.name,
                    None,
                ),
                None => {
                    let emu = emulator(1, true)?;
                    let name = emu.hca_info(0).map(|h| h.name).unwrap_or_default();
                    (
                        open_emulated(&emu, 0)?,
                        format!("{name} (emulated)"),
                        Some(emu),
                    )
                }
            };
            let rx = a.rx_depth.unwrap_or(64).clamp(1, 4096);
            let side = Side::new(ctx, r, &addr, size as usize, rx)?;
            let emulated = emu.is_some();
            (vec![side], addr, device, emulated, emu)
        }
    };
    let inline_max = plan.params.inline_max as usize;
    let patience = plan.params.patience;
    let mut rep = Reporter::new(&plan, a);
    let ep = |s: &Side| Endpoint {
        qpn: s.qp.qpn(),
        ..Endpoint::default()
    };
    let local = ep(&sides[0]);
    let remote = sides.get(1).map(ep).unwrap_or_default();
    let bf = false;
    let mut header = rep.header(
        &plan,
        device,
        bf,
        inline_max as u32,
        format!("{size}-byte frames: {}", frame_kind(&addr)),
        &format!(
            "none (raw Ethernet: MACs given) {} -> {}",
            mac_text(&addr.me),
            mac_text(&addr.peer)
        ),
        local,
        remote,
    );
    header.title = "Raw Ethernet Latency Test".to_owned();
    header.connection = "RawEth";
    header.ethernet = true;
    header.mtu = 1500;
    let label = "lat raw";
    match role {
        Some(Role::Server) => {
            // Answer every frame; nothing to measure here (the client reports).
            rep.begin(emulated, &header)?;
            let s = &mut sides[0];
            for n in 0..iters {
                s.recv(patience, label)?;
                s.send(inline_max, n)?;
            }
            // Let the last answer leave before the QP goes.
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(2) && s.done < s.sent {
                s.reap()?;
            }
            rep.note(&format!("server: answered {iters} frames"))?;
            rep.finish(&header, emulated, None, serde_json::json!({}), None)
        }
        _ => {
            rep.begin(emulated, &header)?;
            let mut samples = Vec::with_capacity(iters as usize);
            for n in 0..iters {
                let t = Instant::now();
                sides[0].send(inline_max, n)?;
                if let Some(s) = sides.get_mut(1) {
                    s.recv(patience, label)?;
                    s.send(inline_max, n)?;
                }
                sides[0].recv(patience, label)?;
                samples.push(t.elapsed().as_secs_f64() * 1e6 / 2.0);
            }
            rep.lat_result(size, &samples)?;
            let _ = (&sides[0].ctx, &sides[0].buf);
            rep.finish(&header, emulated, None, serde_json::json!({}), None)
        }
    }
}

fn frame_kind(a: &Addressing) -> &'static str {
    match (a.ip, a.ports) {
        (None, _) => "Ethernet (802.3 length)",
        (Some(_), None) => "Ethernet/IPv4",
        (Some(_), Some(_)) => "Ethernet/IPv4/UDP",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr() -> Addressing {
        Addressing {
            me: [0, 2, 0xc9, 0xab, 0xcd, 1],
            peer: [0, 2, 0xc9, 0xab, 0xcd, 2],
            ip: Some((Ipv4Addr::new(10, 11, 0, 1), Ipv4Addr::new(10, 11, 0, 2))),
            ports: Some((5000, 6000)),
        }
    }

    #[test]
    fn frames_are_perftests_with_the_server_answering_swapped() {
        let a = addr();
        let c = a.frame(Role::Client, 64);
        assert_eq!(c.len(), 64);
        assert_eq!(&c[..6], &a.peer);
        assert_eq!(&c[6..12], &a.me);
        assert_eq!(&c[12..14], &[0x08, 0x00]);
        assert_eq!(&c[26..30], &[10, 11, 0, 2], "client source IP");
        assert_eq!(&c[30..34], &[10, 11, 0, 1]);
        assert_eq!(u16::from_be_bytes([c[34], c[35]]), 6000);
        assert_eq!(u16::from_be_bytes([c[36], c[37]]), 5000);
        let s = a.frame(Role::Server, 64);
        assert_eq!(&s[26..30], &[10, 11, 0, 1], "server source IP");
        assert_eq!(u16::from_be_bytes([s[34], s[35]]), 5000);
        // Without IP: the 802.3 length perftest puts there.
        let plain = Addressing {
            ip: None,
            ports: None,
            ..a
        };
        assert_eq!(&plain.frame(Role::Client, 64)[12..14], &46u16.to_be_bytes());
        assert_eq!(plain.header_len(), 14);
    }

    #[test]
    fn options_are_checked_by_name() {
        assert_eq!(
            parse_mac("00:02:c9:AB:cd:f0"),
            Ok([0, 2, 0xc9, 0xab, 0xcd, 0xf0])
        );
        assert!(parse_mac("00:02:c9:ab:cd").unwrap_err().contains("six"));
        assert!(parse_mac("00:02:c9:ab:cd:zz").unwrap_err().contains("zz"));
        let mut r = RawArgs {
            source_mac: Some("00:02:c9:ab:cd:01".into()),
            dest_mac: Some("00:02:c9:ab:cd:02".into()),
            server_ip: Some(Ipv4Addr::new(10, 0, 0, 1)),
            ..RawArgs::default()
        };
        assert!(addressing(&r, None).unwrap_err().contains("-J and -j"));
        r.client_ip = Some(Ipv4Addr::new(10, 0, 0, 2));
        r.server_port = Some(1);
        assert!(addressing(&r, None).unwrap_err().contains("-K and -k"));
        r.client_port = Some(2);
        assert!(addressing(&r, None).is_ok());
        assert!(r.refuse().unwrap_err().contains("-B"));
        assert!(RawArgs::default().refuse().is_ok());
        let no_mac = RawArgs::default();
        assert!(addressing(&no_mac, None).unwrap_err().contains("-B"));
    }
}
