//! The emulated Ethernet port attached to a TAP interface in a network namespace this test
//! creates and removes (`mlx5_emu::net_up` / `net_down`; needs `CAP_NET_ADMIN`, which CI
//! has as root). A RAW_PACKET QP driven by libmlx5 (`c/raw_udp.c` under the preload):
//!
//! - its frames (checksums left to the device's offload) reach an ordinary UDP socket in
//!   the namespace, and `tshark -r` of a capture of the interface decodes them as
//!   Ethernet/IPv4/UDP with good IP and UDP checksums;
//! - frames an ordinary socket in the namespace sends reach it through its steering rule,
//!   with runts, garbage and a bad-checksum frame written to the interface in between:
//!   the garbage is refused, the bad checksum is delivered flagged (`IBV_WC_IP_CSUM_OK`
//!   clear), every good datagram arrives flagged good, timestamps are monotonic and within
//!   the device clock, and the QP is not wedged.

use std::io::{BufRead, BufReader};
use std::net::UdpSocket;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use mlx5_emu::{EmuConfig, Emulator, LinkLayer, RunMode};

const NODE: u16 = 3;

fn mac_str(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

fn hca_mac(node: u16) -> [u8; 6] {
    let emu = Emulator::new(EmuConfig {
        mode: RunMode::Stepped,
        node: Some(node),
        link_layer: LinkLayer::Ethernet,
        ..EmuConfig::default()
    });
    emu.hca_info(0).expect("HCA 0").mac
}

fn ip_str(a: [u8; 4]) -> String {
    format!("{}.{}.{}.{}", a[0], a[1], a[2], a[3])
}

/// The namespace, removed when the test ends (also when it fails).
struct Ns(String);

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = mlx5_emu::net_down(&self.0);
    }
}

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

fn raw_udp() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mlx5-raw-tap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("raw_udp");
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/c/raw_udp.c");
    mlx5_emu::cprog::compile_verbs_program("cc", &["-O1", "-Wall", "-Werror"], &src, &exe)
        .expect("compile raw_udp.c");
    exe
}

fn under_emu(exe: &PathBuf, ns: &str, args: &[String]) -> Command {
    let mut cmd = Command::new(exe);
    for (k, _) in std::env::vars() {
        if k.starts_with("MLX5_EMU_") {
            cmd.env_remove(k);
        }
    }
    cmd.env(
        "LD_PRELOAD",
        mlx5_emu::cprog::preload_so().expect("the preload library"),
    )
    .env("MLX5_EMU_LINK_LAYER", "eth")
    .env("MLX5_EMU_FABRIC", "inprocess")
    .env("MLX5_EMU_NODE", NODE.to_string())
    .env("MLX5_EMU_TAP", format!("{ns}/m5tap0"))
    .args(args)
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    cmd
}

fn tap_mac(ns: &str) -> [u8; 6] {
    let out = Command::new("ip")
        .args(["-n", ns, "link", "show", "m5tap0"])
        .output()
        .expect("ip link show");
    let text = String::from_utf8_lossy(&out.stdout);
    let m = text
        .split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .unwrap_or_else(|| panic!("no MAC in {text}"));
    let mut mac = [0u8; 6];
    for (i, p) in m.split(':').enumerate() {
        mac[i] = u8::from_str_radix(p, 16).unwrap();
    }
    mac
}

fn wait_ok(mut child: Child, limit: Duration, who: &str) -> String {
    let t = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if t.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{who} hung:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{who} failed:\n{text}");
    text
}

/// Write `frame` to the interface from inside the namespace (an AF_PACKET socket).
fn inject(ns: &str, frames: Vec<Vec<u8>>) {
    mlx5_emu::in_netns(ns, move || {
        // SAFETY: socket(2) with constant arguments.
        let fd = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW,
                i32::from((libc::ETH_P_ALL as u16).to_be()),
            )
        };
        assert!(
            fd >= 0,
            "AF_PACKET socket: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: a NUL-terminated constant name.
        let ifindex = unsafe { libc::if_nametoindex(c"m5tap0".as_ptr()) };
        assert!(ifindex > 0);
        // SAFETY: sockaddr_ll is plain data; all-zero is a valid start.
        let mut sa: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sa.sll_family = libc::AF_PACKET as u16;
        sa.sll_ifindex = ifindex as i32;
        sa.sll_halen = 6;
        for f in &frames {
            // SAFETY: sendto of `f`'s bytes to a live sockaddr_ll of its size.
            let n = unsafe {
                libc::sendto(
                    fd,
                    f.as_ptr().cast(),
                    f.len(),
                    0,
                    (&raw const sa).cast(),
                    size_of::<libc::sockaddr_ll>() as u32,
                )
            };
            assert_eq!(n, f.len() as isize, "{}", std::io::Error::last_os_error());
        }
        // SAFETY: closing the socket made above.
        unsafe { libc::close(fd) };
    })
    .expect("inside the namespace");
}

#[test]
fn a_raw_qp_on_a_tap_in_a_namespace_talks_with_ordinary_sockets() {
    let ns = format!("m5raw{}", std::process::id());
    if !has_net_admin() {
        let e = mlx5_emu::net_up(&ns, "m5tap0").expect_err("refused without CAP_NET_ADMIN");
        assert!(e.contains("CAP_NET_ADMIN"), "{e}");
        return;
    }
    mlx5_emu::net_up(&ns, "m5tap0").expect("net up");
    let ns = Ns(ns);
    let exe = raw_udp();
    let (hca_ip, host_ip) = (
        ip_str(mlx5_emu::ns_hca_ip(NODE)),
        ip_str(mlx5_emu::NS_HOST_IP),
    );
    let hmac = mac_str(hca_mac(NODE));
    let tmac = mac_str(tap_mac(&ns.0));

    // Raw QP -> namespace: a capture and an ordinary socket see the frames.
    let pcap = std::env::temp_dir().join(format!("mlx5-raw-tap-{}.pcap", std::process::id()));
    let mut dump = Command::new("ip")
        .args([
            "netns",
            "exec",
            &ns.0,
            "dumpcap",
            "-q",
            "-i",
            "m5tap0",
            "-f",
            "udp port 5000",
            "-w",
        ])
        .arg(&pcap)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("dumpcap (package wireshark-common, with tshark)");
    let hip = host_ip.clone();
    let sock = mlx5_emu::in_netns(&ns.0, move || UdpSocket::bind((hip.as_str(), 5000)))
        .unwrap()
        .expect("bind in the namespace");
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    sleep(Duration::from_millis(1500));
    let args: Vec<String> = [
        "send", &hmac, &tmac, &hca_ip, &host_ip, "6000", "5000", "20",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let out = wait_ok(
        under_emu(&exe, &ns.0, &args).spawn().unwrap(),
        Duration::from_secs(30),
        "raw_udp send",
    );
    assert!(out.contains("sent 20"), "{out}");
    let mut buf = [0u8; 2048];
    for i in 0..20 {
        let (n, from) = sock.recv_from(&mut buf).expect("datagram from the raw QP");
        assert_eq!(&buf[..n], format!("seq {i}").as_bytes());
        assert_eq!(from.to_string(), format!("{hca_ip}:6000"));
    }
    sleep(Duration::from_millis(300));
    // SAFETY: kill(2) of the tcpdump child this test started, by its pid.
    unsafe { libc::kill(dump.id() as i32, libc::SIGINT) };
    let _ = dump.wait();
    let t = Command::new("tshark")
        .arg("-r")
        .arg(&pcap)
        .args([
            "-o",
            "ip.check_checksum:TRUE",
            "-o",
            "udp.check_checksum:TRUE",
            "-T",
            "fields",
            "-e",
            "eth.src",
            "-e",
            "ip.src",
            "-e",
            "udp.dstport",
            "-e",
            "ip.checksum.status",
            "-e",
            "udp.checksum.status",
        ])
        .output()
        .expect("tshark (package tshark)");
    let _ = std::fs::remove_file(&pcap);
    let text = String::from_utf8_lossy(&t.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines.len(),
        20,
        "tshark: {text}{}",
        String::from_utf8_lossy(&t.stderr)
    );
    for l in lines {
        // Status 1: the checksum was verified good.
        assert_eq!(l, format!("{hmac}\t{hca_ip}\t5000\t1\t1"), "{text}");
    }

    // Namespace -> raw QP: garbage first, then a bad checksum, then 20 good datagrams.
    let args: Vec<String> = ["recv", &hmac, &hca_ip, "7000", "21"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut rx = under_emu(&exe, &ns.0, &args).spawn().unwrap();
    let mut lines = BufReader::new(rx.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    sleep(Duration::from_millis(200));
    let mut bare = hca_mac(NODE).to_vec();
    bare.extend_from_slice(&tap_mac(&ns.0));
    bare.extend_from_slice(&[0x08, 0x00]);
    let mut lying = bare.clone();
    lying.extend_from_slice(&[0x4f, 0, 0xff, 0xff, 0, 0, 0, 0, 64, 17]);
    let mut bad = Vec::new();
    bad.extend_from_slice(&hca_mac(NODE));
    bad.extend_from_slice(&tap_mac(&ns.0));
    bad.extend_from_slice(&[0x08, 0x00, 0x45, 0, 0, 31, 0, 0, 0x40, 0, 64, 17, 0, 0]);
    bad.extend_from_slice(&mlx5_emu::NS_HOST_IP);
    bad.extend_from_slice(&mlx5_emu::ns_hca_ip(NODE));
    bad.extend_from_slice(&[0x1f, 0x40, 0x1b, 0x58, 0, 11, 0xde, 0xad, b'b', b'a', b'd']);
    inject(
        &ns.0,
        // (The kernel lets no frame shorter than an Ethernet header onto the interface;
        // runts are the unit tests' and the in-process fabric's.) A bare header that says
        // IPv4, garbage, an IPv4 header claiming more than the frame holds, a bad checksum.
        vec![bare, (0..60u8).collect(), lying, bad],
    );
    let hip = ip_str(mlx5_emu::NS_HOST_IP);
    let dst = format!("{hca_ip}:7000");
    mlx5_emu::in_netns(&ns.0, move || {
        let s = UdpSocket::bind((hip.as_str(), 0)).unwrap();
        for i in 0..20 {
            s.send_to(format!("good {i}").as_bytes(), dst.as_str())
                .unwrap();
            sleep(Duration::from_millis(2));
        }
    })
    .unwrap();
    let rest: Vec<String> = lines.map(|l| l.unwrap()).collect();
    let _ = rx.stdout.take();
    let status = rx.wait().unwrap();
    let mut err = String::new();
    if let Some(mut e) = rx.stderr.take() {
        std::io::Read::read_to_string(&mut e, &mut err).unwrap();
    }
    assert!(status.success(), "raw_udp recv: {rest:?} {err}");
    let frames: Vec<&String> = rest.iter().filter(|l| l.starts_with("frame ")).collect();
    assert_eq!(frames.len(), 21, "{rest:?}");
    let bad_flagged = frames.iter().filter(|l| l.contains("csum_ok=0")).count();
    assert_eq!(
        bad_flagged, 1,
        "exactly the forged frame fails its check: {rest:?}"
    );
    assert!(frames[0].contains("csum_ok=0"), "{rest:?}");
    assert!(rest.last().unwrap().starts_with("received 21"), "{rest:?}");
    let _ = sock.as_raw_fd();
}
