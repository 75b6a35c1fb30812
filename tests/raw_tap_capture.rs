//! Frames the driver's raw QP (`mlx5::raw::RawQp`) sends, seen from outside: the emulated
//! HCA's Ethernet port is a TAP in a network namespace this test creates and removes
//! (`mlx5_emu::net_up`; needs `CAP_NET_ADMIN`, which CI has as root), a capture of that
//! interface is decoded by `tshark -r` as Ethernet/IPv4/UDP with both checksums verified good
//! (the device computed them: the driver asked for IP and UDP checksum offload and left both
//! fields zero), and an ordinary UDP socket in the namespace receives every datagram.
//! Without `CAP_NET_ADMIN` the refusal is checked instead.

use std::net::UdpSocket;
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use mlx5::emulator::{EmuConfig, Emulator, LinkLayer, RunMode};
use mlx5::raw::{FramePayload, RawQp, RawQpInit, TxOffload};
use mlx5::{Context, Cq, CqInit, Pd, SendFlags};
use mlx5_emu::{NS_HOST_IP, TapConfig};

const IFNAME: &str = "m5cap0";
const FRAMES: u16 = 20;
const SPORT: u16 = 6000;
const DPORT: u16 = 5000;

fn has_net_admin() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|c| c & (1 << 12) != 0)
}

/// The namespace, removed when the test ends (passing or not).
struct Ns(String);

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = mlx5_emu::net_down(&self.0);
    }
}

/// A child process, killed when the test ends early.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn mac_str(m: &[u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

fn ip_str(a: [u8; 4]) -> String {
    format!("{}.{}.{}.{}", a[0], a[1], a[2], a[3])
}

/// The TAP's own MAC, as `ip link` reports it in the namespace.
fn tap_mac(ns: &str) -> [u8; 6] {
    let out = Command::new("ip")
        .args(["-n", ns, "link", "show", IFNAME])
        .output()
        .expect("ip link show (package iproute2)");
    let text = String::from_utf8_lossy(&out.stdout);
    let m = text
        .split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .unwrap_or_else(|| panic!("no MAC in {text}"));
    let mut mac = [0u8; 6];
    for (i, p) in m.split(':').enumerate() {
        mac[i] = u8::from_str_radix(p, 16).expect("hex MAC");
    }
    mac
}

/// Ethernet + IPv4 + UDP headers (42 bytes) for `payload`, both checksum fields zero: the
/// device fills them (offload).
fn headers(dst: [u8; 6], src: [u8; 6], sip: [u8; 4], dip: [u8; 4], payload: usize) -> Vec<u8> {
    let mut h = Vec::with_capacity(42);
    h.extend_from_slice(&dst);
    h.extend_from_slice(&src);
    h.extend_from_slice(&0x0800u16.to_be_bytes());
    let total = (20 + 8 + payload) as u16;
    h.extend_from_slice(&[0x45, 0]);
    h.extend_from_slice(&total.to_be_bytes());
    h.extend_from_slice(&[0, 1, 0x40, 0, 64, 17, 0, 0]);
    h.extend_from_slice(&sip);
    h.extend_from_slice(&dip);
    h.extend_from_slice(&SPORT.to_be_bytes());
    h.extend_from_slice(&DPORT.to_be_bytes());
    h.extend_from_slice(&((8 + payload) as u16).to_be_bytes());
    h.extend_from_slice(&[0, 0]);
    h
}

#[test]
fn frames_of_the_drivers_raw_qp_decode_in_a_capture_with_good_checksums() {
    let ns = format!("m5cap{}", std::process::id());
    if !has_net_admin() {
        let e = mlx5_emu::net_up(&ns, IFNAME).expect_err("refused without CAP_NET_ADMIN");
        assert!(e.contains("CAP_NET_ADMIN"), "{e}");
        return;
    }
    mlx5_emu::net_up(&ns, IFNAME).expect("net up");
    let ns = Ns(ns);

    let emu = Emulator::new(EmuConfig {
        num_hcas: 1,
        mode: RunMode::Threaded,
        link_layer: LinkLayer::Ethernet,
        tap: Some(TapConfig {
            netns: ns.0.clone(),
            ifname: IFNAME.to_owned(),
        }),
        ..EmuConfig::default()
    });
    let info = emu.hca_info(0).expect("HCA 0");
    let (hmac, tmac) = (info.mac, tap_mac(&ns.0));
    let (hip, host) = (mlx5_emu::ns_hca_ip(info.lid), NS_HOST_IP);

    let pcap = std::env::temp_dir().join(format!("mlx5-raw-capture-{}.pcap", std::process::id()));
    let dump = Command::new("ip")
        .args(["netns", "exec", &ns.0, "dumpcap", "-q", "-i", IFNAME])
        .args(["-f", &format!("udp port {DPORT}"), "-w"])
        .arg(&pcap)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("dumpcap (package wireshark-common, with tshark)");
    let mut dump = Child(dump);
    let bind = ip_str(host);
    let sock = mlx5_emu::in_netns(&ns.0, move || UdpSocket::bind((bind.as_str(), DPORT)))
        .expect("inside the namespace")
        .expect("bind in the namespace");
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    // dumpcap has no readiness signal: wait until its capture file exists, then a moment.
    let start = Instant::now();
    while !pcap.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "dumpcap never started"
        );
        if let Some(st) = dump.0.try_wait().expect("wait") {
            panic!("dumpcap exited ({st})");
        }
        sleep(Duration::from_millis(20));
    }
    sleep(Duration::from_millis(500));

    let ctx = Context::open(emu.open(0).expect("open HCA 0")).expect("context");
    let pd = Pd::new(&ctx).expect("pd");
    let scq = Cq::new(&ctx, CqInit::default(), None).expect("send CQ");
    let rcq = Cq::new(&ctx, CqInit::default(), None).expect("receive CQ");
    let mut qp = RawQp::new(&pd, &RawQpInit::new(&scq, &rcq)).expect("raw QP");
    qp.activate(1).expect("activate");
    let mut scq = scq.into_raw().map_err(|_| "send CQ busy").unwrap();
    let offload = TxOffload {
        ip_csum: true,
        l4_csum: true,
        vlan: None,
    };
    let hl = qp.min_inline().max(18);
    for i in 0..FRAMES {
        let payload = format!("seq {i}");
        let mut frame = headers(tmac, hmac, hip, host, payload.len());
        frame.extend_from_slice(payload.as_bytes());
        qp.send(
            &frame[..hl],
            FramePayload::Inline(&frame[hl..]),
            offload,
            SendFlags::SIGNALED,
            u64::from(i),
        )
        .expect("send");
        qp.ring();
        let t = Instant::now();
        loop {
            if let Some(c) = scq.next() {
                scq.publish_ci();
                let (wr_id, _ts) = qp.send_done(&c).expect("send completion");
                assert_eq!(wr_id, u64::from(i));
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "no send completion for {i}"
            );
            std::thread::yield_now();
        }
    }

    let mut buf = [0u8; 2048];
    for i in 0..FRAMES {
        let (n, from) = sock.recv_from(&mut buf).expect("datagram from the raw QP");
        assert_eq!(&buf[..n], format!("seq {i}").as_bytes());
        assert_eq!(from.to_string(), format!("{}:{SPORT}", ip_str(hip)));
    }
    sleep(Duration::from_millis(300));
    // SAFETY: kill(2) of the dumpcap child this test started, by its pid.
    unsafe { libc::kill(dump.0.id() as i32, libc::SIGINT) };
    let _ = dump.0.wait();
    let t = Command::new("tshark")
        .arg("-r")
        .arg(&pcap)
        .args([
            "-o",
            "ip.check_checksum:TRUE",
            "-o",
            "udp.check_checksum:TRUE",
        ])
        .args([
            "-T",
            "fields",
            "-e",
            "eth.src",
            "-e",
            "ip.src",
            "-e",
            "udp.dstport",
        ])
        .args(["-e", "ip.checksum.status", "-e", "udp.checksum.status"])
        .output()
        .expect("tshark (package tshark)");
    let _ = std::fs::remove_file(&pcap);
    let text = String::from_utf8_lossy(&t.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines.len(),
        usize::from(FRAMES),
        "tshark: {text}{}",
        String::from_utf8_lossy(&t.stderr)
    );
    for l in lines {
        // Status 1: the checksum was verified good.
        let want = format!("{}\t{}\t{DPORT}\t1\t1", mac_str(&hmac), ip_str(hip));
        assert_eq!(l, want, "{text}");
    }
}
