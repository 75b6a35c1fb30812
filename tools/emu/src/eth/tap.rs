//! The port as a Linux interface: a TAP device opened inside a network namespace, so that
//! ordinary sockets, tcpdump and tshark in that namespace see the frames raw QPs send and
//! send frames the port's steering table delivers to them. Nothing leaves the namespace:
//! the TAP exists only there.
//!
//! Creating the namespace and configuring the interface needs `CAP_NET_ADMIN`; the
//! `mlx5 emu net up|down` command does that part (`tools/cli`), this module only opens
//! the TAP in the namespace and moves frames.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `TUNSETIFF` (`_IOW('T', 202, int)`).
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
/// `IFF_TAP`: an Ethernet-level device.
const IFF_TAP: libc::c_short = 0x0002;
/// `IFF_NO_PI`: no packet-information header before each frame.
const IFF_NO_PI: libc::c_short = 0x1000;

/// Where the port's TAP interface lives ([`crate::EmuConfig::tap`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TapConfig {
    /// The network namespace (`/run/netns/<netns>`, made by `ip netns add`).
    pub netns: String,
    /// The TAP interface's name inside it.
    pub ifname: String,
}

impl TapConfig {
    /// `MLX5_EMU_TAP=<netns>/<ifname>` (what `mlx5 emu run --net` sets); None if unset or
    /// not of that form.
    pub fn from_env() -> Option<TapConfig> {
        let v = std::env::var("MLX5_EMU_TAP").ok()?;
        let (netns, ifname) = v.trim().split_once('/')?;
        (!netns.is_empty() && !ifname.is_empty()).then(|| TapConfig {
            netns: netns.to_owned(),
            ifname: ifname.to_owned(),
        })
    }
}

/// An open TAP device (non-blocking).
#[derive(Debug)]
pub(crate) struct Tap {
    fd: OwnedFd,
    /// Frames the interface refused (its queue full, or it is down).
    pub(crate) tx_errors: u64,
}

/// `struct ifreq` as TUNSETIFF reads it: the name and the flags.
#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    pad: [u8; 22],
}

impl Tap {
    /// Open (creating it if needed) TAP interface `ifname` inside the network namespace
    /// `/run/netns/<netns>` (the calling thread enters it for the open and returns).
    pub(crate) fn open_in(netns: &str, ifname: &str) -> Result<Tap, String> {
        if ifname.is_empty() || ifname.len() >= libc::IFNAMSIZ || ifname.contains('/') {
            return Err(format!("interface name {ifname:?} is not a valid name"));
        }
        if netns.is_empty() || netns.contains('/') || netns.starts_with('.') {
            return Err(format!(
                "network namespace name {netns:?} is not a valid name"
            ));
        }
        let target = std::fs::File::open(format!("/run/netns/{netns}")).map_err(|e| {
            format!("network namespace {netns}: {e} (create it with `mlx5 emu net up`)")
        })?;
        let name = ifname.to_owned();
        // A thread of our own enters the namespace, so no other thread's sockets move.
        std::thread::spawn(move || -> Result<Tap, String> {
            // SAFETY: setns on a namespace file we hold open; it affects only this thread.
            if unsafe { libc::setns(target.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                let e = std::io::Error::last_os_error();
                return Err(format!(
                    "cannot enter network namespace: {e} (needs CAP_NET_ADMIN)"
                ));
            }
            Tap::open(&name)
        })
        .join()
        .map_err(|_| "the namespace thread panicked".to_owned())?
    }

    /// Open TAP `ifname` in the current network namespace.
    fn open(ifname: &str) -> Result<Tap, String> {
        // SAFETY: open(2) of a constant NUL-terminated path.
        let fd = unsafe {
            libc::open(
                c"/dev/net/tun".as_ptr(),
                libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(format!("/dev/net/tun: {}", std::io::Error::last_os_error()));
        }
        // SAFETY: `fd` was just returned by open and is owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut req = IfReq {
            name: [0; libc::IFNAMSIZ],
            flags: IFF_TAP | IFF_NO_PI,
            pad: [0; 22],
        };
        req.name[..ifname.len()].copy_from_slice(ifname.as_bytes());
        // SAFETY: TUNSETIFF reads and writes one `struct ifreq`, which `req` is (layout
        // above), live for the call.
        if unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETIFF, &raw mut req) } != 0 {
            return Err(format!(
                "TUNSETIFF {ifname}: {} (needs CAP_NET_ADMIN)",
                std::io::Error::last_os_error()
            ));
        }
        Ok(Tap { fd, tx_errors: 0 })
    }

    /// Hand a frame to the interface (the namespace's stack receives it).
    pub(crate) fn send(&mut self, frame: &[u8]) {
        // SAFETY: write(2) of `frame`'s bytes on our own descriptor.
        let n = unsafe { libc::write(self.fd.as_raw_fd(), frame.as_ptr().cast(), frame.len()) };
        if n < 0 {
            self.tx_errors += 1;
        }
    }

    /// A frame the namespace's stack sent through the interface, if one is waiting.
    pub(crate) fn recv(&self, buf: &mut [u8]) -> Option<usize> {
        // SAFETY: read(2) into `buf`, at most its length, on our own descriptor.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        (n >= 0).then_some(n as usize)
    }

    /// The descriptor, for the device thread's wait.
    pub(crate) fn raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }
}

/// `CAP_NET_ADMIN` (capability number 12).
const CAP_NET_ADMIN: u32 = 12;

/// The addresses of the namespace set up by [`net_up`]: the namespace's own host is
/// `10.77.255.1/16` on the TAP; the emulated HCA of fabric node N is `10.77.0.N` with its
/// MAC (`HcaInfo::mac`), entered as a permanent neighbour for nodes 1..=[`NEIGH_NODES`],
/// because the emulated port answers no ARP. Multicast (224.0.0.0/4) is routed to the TAP.
pub const NS_HOST_IP: [u8; 4] = [10, 77, 255, 1];

/// The namespace address of the emulated HCA of fabric node `node` (1..=254).
pub fn ns_hca_ip(node: u16) -> [u8; 4] {
    [10, 77, (node >> 8) as u8, node as u8]
}

/// Nodes whose HCA gets a permanent neighbour entry in the namespace.
pub const NEIGH_NODES: u16 = 8;

fn ip(args: &[&str]) -> Result<(), String> {
    let out = std::process::Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run `ip` (package iproute2): {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn check_names(netns: &str, ifname: &str) -> Result<(), String> {
    let ok = |s: &str, max: usize| {
        !s.is_empty()
            && s.len() < max
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    if !ok(netns, 64) {
        return Err(format!(
            "network namespace name {netns:?} is not a valid name"
        ));
    }
    if !ok(ifname, libc::IFNAMSIZ) {
        return Err(format!("interface name {ifname:?} is not a valid name"));
    }
    Ok(())
}

/// Create network namespace `netns` with a persistent TAP `ifname` in it, addressed and
/// routed as [`NS_HOST_IP`] says, for an emulator started with
/// [`crate::EmuConfig::tap`] to attach to. Refused by name without `CAP_NET_ADMIN`.
/// Nothing is connected to any other namespace: the traffic stays inside.
pub fn net_up(netns: &str, ifname: &str) -> Result<(), String> {
    check_names(netns, ifname)?;
    if !crate::abi::has_cap(CAP_NET_ADMIN) {
        return Err(format!(
            "creating network namespace {netns} needs CAP_NET_ADMIN, which this process lacks"
        ));
    }
    if !std::path::Path::new(&format!("/run/netns/{netns}")).exists() {
        ip(&["netns", "add", netns])?;
    }
    let r = (|| {
        ip(&["-n", netns, "link", "set", "lo", "up"])?;
        ip(&["-n", netns, "tuntap", "add", "dev", ifname, "mode", "tap"])?;
        let host = format!(
            "{}.{}.{}.{}/16",
            NS_HOST_IP[0], NS_HOST_IP[1], NS_HOST_IP[2], NS_HOST_IP[3]
        );
        ip(&["-n", netns, "addr", "add", &host, "dev", ifname])?;
        // The TAP's queue towards the emulated port holds `txqueuelen` frames while the
        // device thread is off the CPU (default 1000: a feed of tens of thousands of frames
        // a second on a busy machine overflows it); a NIC's receive buffer is larger too.
        ip(&["-n", netns, "link", "set", ifname, "txqueuelen", "16384"])?;
        ip(&["-n", netns, "link", "set", ifname, "up"])?;
        ip(&["-n", netns, "route", "add", "224.0.0.0/4", "dev", ifname])?;
        for node in 1..=NEIGH_NODES {
            let m = crate::roce::mac_of_guid(crate::roce::BASE_GUID + u64::from(node));
            let mac = m
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(":");
            let a = ns_hca_ip(node);
            let addr = format!("{}.{}.{}.{}", a[0], a[1], a[2], a[3]);
            ip(&[
                "-n",
                netns,
                "neigh",
                "replace",
                &addr,
                "lladdr",
                &mac,
                "dev",
                ifname,
                "nud",
                "permanent",
            ])?;
        }
        Ok(())
    })();
    if r.is_err() {
        let _ = ip(&["netns", "del", netns]);
    }
    r
}

/// Remove network namespace `netns` and everything in it (the TAP included). Refused by
/// name without `CAP_NET_ADMIN`.
pub fn net_down(netns: &str) -> Result<(), String> {
    check_names(netns, "x")?;
    if !crate::abi::has_cap(CAP_NET_ADMIN) {
        return Err(format!(
            "removing network namespace {netns} needs CAP_NET_ADMIN, which this process lacks"
        ));
    }
    ip(&["netns", "del", netns])
}

/// Run `f` on a thread inside network namespace `netns` (for sockets of the namespace's
/// own host: they stay in the namespace they were made in).
pub fn in_netns<T: Send + 'static>(
    netns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    let target = std::fs::File::open(format!("/run/netns/{netns}"))
        .map_err(|e| format!("network namespace {netns}: {e}"))?;
    std::thread::spawn(move || {
        // SAFETY: setns on a namespace file we hold open; it affects only this thread.
        if unsafe { libc::setns(target.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(format!(
                "cannot enter network namespace: {} (needs CAP_NET_ADMIN)",
                std::io::Error::last_os_error()
            ));
        }
        Ok(f())
    })
    .join()
    .map_err(|_| "the namespace thread panicked".to_owned())?
}
