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
