//! An emulated ConnectX (mlx5) HCA and the `ib_uverbs` kernel interface in front of it.
//!
//! The emulator is what the driver (and, through an `LD_PRELOAD` shim, unmodified
//! rdma-core) talks to on a machine without the hardware. It has two halves:
//!
//! * **Kernel side** ([`Emulator::open`] returns an [`UverbsSurface`]): the legacy
//!   `write()` commands (plain and extended), the ioctl framework (`INVOKE_WRITE` and the
//!   object methods of a modern kernel, per [`Flavour`]), `mmap` of UAR and clock pages. Commands are validated the way the kernel validates them
//!   and fail with the kernel's errno; every user pointer is accessed through a
//!   copy that catches its own faults (x86_64 Linux; see [`DmaPath`]) or through
//!   `process_vm_readv`/`process_vm_writev`, so a bad pointer yields `EFAULT`, never a crash.
//! * **Device side**: woken *only* by MMIO writes into the mapped UAR pages (the 8-byte
//!   doorbell or a BlueFlame copy at a bfreg half, the CQ arm doorbell at UAR + 0x20). It
//!   fetches WQEs from the SQ ring up to the doorbell record, executes them with RC/UC/UD
//!   transport semantics (path-MTU packets with PSNs, ACK/NAK, retransmission, RNR,
//!   duplicates, at-most-once atomics), writes CQEs exactly as hardware does, raises
//!   completion and async events, and keeps the mlx5 `hw_counters`.
//! * **Fabric** ([`Fabric`]): in process between the HCAs of one emulator, or RoCEv2 over
//!   UDP on the loopback interface between processes; seeded fault injection
//!   ([`FaultConfig`]) and pcap capture.
//!
//! Two run modes ([`RunMode`]): `Threaded` (a device thread that sleeps until a doorbell
//! store faults on its write-protected UAR page, a kernel command, a packet or a timer wakes
//! it; [`WakeMode`], `docs/emulator-wake.md`) and `Stepped` (nothing runs unless a test calls [`Emulator::step`] or
//! [`Emulator::run_until_idle`]; deterministic, virtual time).
//!
//! UARs are static (via `tot_bfregs`) by default; with [`EmuConfig::dyn_uar`] on a modern
//! kernel flavour a context that asks for `MLX5_LIB_CAP_DYN_UAR` allocates UAR pages with
//! the `MLX5_IB_OBJECT_UAR` methods instead, as on current kernels.
//!
//! DEVX (PRM commands of a DEVX context) is answered for what UCX and rdma-core ask: the
//! capability pages, umems, DEVX QP/DCT/RMP objects and event channels
//! (`docs/emulator-kernel.md`). What the emulated kernel/device deliberately does not do
//! (yet): the mlx5 VAR object, memory windows and UMR (LOCAL_INV, BIND_MW: local QP
//! operation error), CQE compression, resize CQ.
//! The port is InfiniBand by default (LID-routed, one GID: link-local prefix + node GUID,
//! one P_Key); [`EmuConfig::link_layer`] = [`LinkLayer::Ethernet`] makes it a RoCE port
//! (GID-routed, RoCE v1/v2 GID table, destination MACs; the fabric between processes is
//! RoCEv2 either way, RoCE v1 entries are accepted but travel as RoCEv2 there).
//! SEND with invalidate reports the rkey in the CQE without invalidating anything.
//!
//! ```no_run
//! use mlx5_emu::{EmuConfig, Emulator, RunMode};
//! let emu = Emulator::new(EmuConfig { mode: RunMode::Stepped, ..EmuConfig::default() });
//! let dev = emu.open(0).unwrap();          // like open("/dev/infiniband/uverbs0")
//! // ... issue GET_CONTEXT etc. through dev.write()/dev.ioctl(), ring doorbells ...
//! emu.run_until_idle();
//! println!("{:?}", emu.counters(0));
//! ```

mod abi;
mod caps;
mod config;
mod counters;
pub mod cprog;
mod device;
mod eth;
mod fds;
mod inspect;
mod kernel;
mod mem;
mod model;
mod pcap;
mod record;
mod roce;
mod shared;
mod state;
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod store;
pub mod trace;
mod transport;
mod uar;
mod watch;
mod xrc_dc;

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

pub use abi::{Errno, UverbsSurface};
pub use config::{EmuConfig, Fabric, FaultConfig, Flavour, HcaInfo, RunMode, WakeMode};
pub use counters::Counters;
pub use eth::EthMinInline;
pub use eth::tap::{NEIGH_NODES, NS_HOST_IP, TapConfig, in_netns, net_down, net_up, ns_hca_ip};
pub use inspect::{CqView, QpView};
pub use kernel::ucma::{RdmaCmFile, RdmaCmOpen};
pub use mem::{DmaPath, dma_path, set_dma_path};
pub use model::checks::{FAILED_CHECKS_KEPT, FailedCheck, KeyFault, access_names};
pub use record::{WqeRecord, WqeVia};
pub use roce::{
    BASE_GUID, GidEntry, GidType, LinkLayer, NDEV_IFINDEX, NDEV_NAME, ROCE_GID_TBL_LEN,
};
pub use shared::Emulator;
use shared::{Owner, Shared};
use transport::{ROCE_RCVBUF, set_rcvbuf};

/// The RoCEv2 ICRC (sent little-endian after the payload) of the UDP payload `bth_on` (BTH
/// onwards, without the ICRC) from fabric node `src_lid` to `dst_lid`, for tools and tests
/// that hand-craft packets for [`Fabric::Udp`]. `None` if `bth_on` is shorter than a BTH.
pub fn roce_icrc(bth_on: &[u8], src_lid: u16, dst_lid: u16) -> Option<u32> {
    (bth_on.len() >= 12).then(|| {
        transport::icrc(
            bth_on,
            transport::node_ip(src_lid),
            transport::node_ip(dst_lid),
        )
    })
}

/// Copy `len` bytes at `addr` of this process the way the emulated kernel reads a user
/// pointer: `EFAULT` for an unmapped or unreadable range, never a crash (see [`DmaPath`]).
pub fn copy_from_user(addr: u64, len: usize) -> Result<Vec<u8>, Errno> {
    mem::read_vec(addr, len)
}

/// Copy `data` to `addr` of this process the way the emulated kernel writes through a user
/// pointer: `EFAULT` for an unmapped or read-only range, never a crash.
pub fn copy_to_user(addr: u64, data: &[u8]) -> Result<(), Errno> {
    mem::write(addr, data)
}

impl Emulator {
    /// Create the emulator; in [`RunMode::Threaded`] this starts the device thread, which
    /// is joined when the last handle (emulator or opened surface) is dropped.
    pub fn new(cfg: EmuConfig) -> Emulator {
        Emulator::with_wake(cfg, WakeMode::from_env())
    }

    /// [`Emulator::new`] with the threaded device's wait chosen here instead of by
    /// `MLX5_EMU_WAKE` ([`WakeMode::Fault`] or [`WakeMode::Poll`]; ignored in stepped mode).
    ///
    /// A capture that cannot be written (`pcap` names a path that cannot be created or is
    /// not a regular file) is reported on stderr, loudly, and the emulator runs without it;
    /// [`Emulator::try_new`] refuses instead.
    pub fn with_wake(cfg: EmuConfig, wake: WakeMode) -> Emulator {
        let (emu, err) = Emulator::build(cfg, wake);
        if let Some(e) = err {
            eprintln!("mlx5-emu: ERROR: {e}: running WITHOUT a packet capture");
        }
        emu
    }

    /// [`Emulator::new`], refusing a configuration whose pcap capture cannot be written.
    ///
    /// # Errors
    /// The capture's path and why it cannot be written.
    pub fn try_new(cfg: EmuConfig) -> Result<Emulator, String> {
        match Emulator::build(cfg, WakeMode::from_env()) {
            (emu, None) => Ok(emu),
            (_, Some(e)) => Err(e),
        }
    }

    /// The emulator, and the error that left it without the capture it was asked for.
    fn build(cfg: EmuConfig, wake: WakeMode) -> (Emulator, Option<String>) {
        let n = cfg.num_hcas.max(1);
        let mut socks: Vec<Option<std::net::UdpSocket>> = Vec::new();
        let lids: Vec<u16> = match cfg.fabric {
            Fabric::InProcess => {
                let base = cfg.node.unwrap_or(1).max(1);
                (0..n).map(|i| base + i as u16).collect()
            }
            Fabric::Udp => {
                let mut lids = Vec::new();
                let mut next = cfg.node.unwrap_or(1).max(1);
                for _ in 0..n {
                    // Explicit node: take it (or the next free one if it is busy).
                    while next < 255 {
                        let ip = transport::node_ip(next);
                        let addr = std::net::SocketAddrV4::new(ip.into(), transport::ROCE_PORT);
                        if let Ok(s) = std::net::UdpSocket::bind(addr) {
                            let _ = s.set_nonblocking(true);
                            set_rcvbuf(&s, ROCE_RCVBUF);
                            socks.push(Some(s));
                            break;
                        }
                        next += 1;
                    }
                    lids.push(next);
                    next += 1;
                }
                lids
            }
        };
        socks.resize_with(n, || None);
        let hcas = lids
            .iter()
            .zip(socks)
            .enumerate()
            .map(|(i, (&lid, sock))| {
                let guid = BASE_GUID + u64::from(lid);
                let mac = roce::mac_of_guid(guid);
                let mut gid = [0u8; 16];
                gid[0] = 0xfe;
                gid[1] = 0x80;
                gid[8..].copy_from_slice(&guid.to_be_bytes());
                if cfg.link_layer == LinkLayer::Ethernet {
                    gid = roce::link_local_gid(mac);
                }
                state::Hca {
                    info: HcaInfo {
                        name: format!("mlx5_{i}"),
                        node_guid: guid,
                        sys_image_guid: guid,
                        port_gid: gid,
                        lid,
                        link_layer: cfg.link_layer,
                        mac,
                        ipv4: transport::node_ip(lid),
                        fw_ver: "16.35.1012".to_string(),
                        fw_ver_raw: (16 << 32) | (35 << 16) | 1012,
                        vendor_id: 0x02c9,
                        vendor_part_id: 4119,
                    },
                    counters: Counters::default(),
                    pds: Default::default(),
                    mrs: Default::default(),
                    cqs: Default::default(),
                    qps: Default::default(),
                    srqs: Default::default(),
                    ahs: Default::default(),
                    next_id: (u32::from(lid) << 16 | 1) & 0xff_ffff,
                    next_key: (u32::from(lid) << 12 | 1) & 0xff_ffff,
                    eth: eth::Port {
                        sock: sock.as_ref().and_then(|_| eth::bind_raw(lid)),
                        ..Default::default()
                    },
                    sock,
                    hpc: Default::default(),
                }
            })
            .collect::<Vec<_>>();
        let mut hcas = hcas;
        if let (Some(t), Some(h)) = (&cfg.tap, hcas.first_mut()) {
            match eth::tap::Tap::open_in(&t.netns, &t.ifname) {
                Ok(tap) => h.eth.tap = Some(tap),
                Err(e) => eprintln!("mlx5-emu: no TAP attachment: {e}"),
            }
        }
        let udp_fds: Vec<i32> = hcas
            .iter()
            .filter_map(|h| h.sock.as_ref().map(std::os::fd::AsRawFd::as_raw_fd))
            .chain(
                hcas.iter()
                    .filter_map(|h| h.eth.sock.as_ref().map(std::os::fd::AsRawFd::as_raw_fd)),
            )
            .chain(
                hcas.iter()
                    .filter_map(|h| h.eth.tap.as_ref().map(eth::tap::Tap::raw_fd)),
            )
            .collect();
        let (pcap, pcap_err) = match cfg.pcap.as_deref().map(|p| pcap::open(p, &lids)) {
            Some(Ok(c)) => (Some(c), None),
            Some(Err(e)) => (None, Some(e)),
            None => (None, None),
        };
        let mode = cfg.mode;
        device::read_ack_delay();
        // The wake path needs the fault handler; without it (or without an eventfd) the
        // device polls as before.
        let wake = (mode == RunMode::Threaded && wake == WakeMode::Fault)
            .then(watch::Wake::new)
            .flatten()
            .filter(|_| mem::install_fault_handler());
        let seed = cfg.fault.seed;
        let world = state::World {
            cfg,
            hcas,
            contexts: Default::default(),
            channels: Vec::new(),
            next_ctx: 1,
            wire: Default::default(),
            outbox: Default::default(),
            vclock: 0,
            started: std::time::Instant::now(),
            rng: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
            rx_buf: Vec::new(),
            pcap,
            wqe_log: Default::default(),
            trace: Default::default(),
            wake: wake.clone(),
            cm: Default::default(),
            mcast: Default::default(),
            kernel: state::KernelHooks {
                cm_tick: kernel::ucma::tick,
                cm_deadline: kernel::ucma::next_deadline,
                gsi_receive: kernel::ucma::gsi_receive,
            },
            checks: Default::default(),
        };
        let shared = Arc::new(Shared {
            world: Mutex::new(world),
            udp_fds,
            wake: wake.clone(),
            sched: std::sync::atomic::AtomicI32::new(SCHED_UNKNOWN),
            device_tid: std::sync::atomic::AtomicI32::new(0),
        });
        let owner = Arc::new(Owner {
            wake: wake.clone(),
            thread: Mutex::new(None),
            world: Arc::downgrade(&shared),
        });
        if let Some(wk) = &shared.wake {
            // The ringing thread runs the device itself when its doorbell store is emulated
            // (`watch.rs`; `MLX5_EMU_RING=device`: it never does, the device thread is woken).
            if let Ok(v) = std::env::var("MLX5_EMU_RING") {
                watch::set_emulate(v.trim() != "device");
            }
            // Only between processes (a UDP fabric): in one process the device thread's
            // spin takes a ping-pong's doorbells without a fault, which is cheaper.
            wk.ring_here.store(
                watch::emulating() && !shared.udp_fds.is_empty(),
                std::sync::atomic::Ordering::Relaxed,
            );
            let bf = shared.lock_quiet().cfg.bf_reg_size;
            wk.half
                .store(device::bf_half_of(bf), std::sync::atomic::Ordering::Relaxed);
            let weak = Arc::downgrade(&shared);
            let _ = wk
                .runner
                .set(Box::new(move || run_in_ringing_thread(&weak)));
        }
        if mode == RunMode::Threaded {
            let weak = Arc::downgrade(&shared);
            let handle = std::thread::Builder::new()
                .name("mlx5-emu".into())
                .spawn(move || match wake {
                    Some(wake) => wake_thread(weak, wake),
                    None => device_thread(weak),
                })
                .ok();
            *owner
                .thread
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = handle;
        }
        (Emulator { shared, owner }, pcap_err)
    }

    /// Open a new "file" on HCA `hca` (like `open("/dev/infiniband/uverbsN")`). It becomes a
    /// ucontext after GET_CONTEXT; dropping the returned surface closes it and destroys
    /// every object it owns.
    pub fn open(&self, hca: usize) -> Result<Arc<dyn UverbsSurface>, Errno> {
        if hca >= self.shared.lock_quiet().hcas.len() {
            return Err(Errno(libc::ENODEV));
        }
        Ok(Arc::new(kernel::EmuFile::new(
            self.shared.clone(),
            self.owner.clone(),
            hca,
        )))
    }

    /// Whether doorbell stores that fault are emulated and run by the ringing thread
    /// (`true`, the default) or open the page and wake the device thread (`false`, as
    /// `MLX5_EMU_RING=device`), process-wide, for the emulators created from now on and the
    /// pages they map. `docs/emulator-wake.md`, *Doorbell stores emulated in the ringing
    /// thread*.
    pub fn set_ring_in_thread(on: bool) {
        watch::set_emulate(on);
    }

    /// In this process so far: doorbell stores that the fault handler emulated, and how
    /// many of them the ringing thread ran the device for itself (the others woke the device
    /// thread). See `docs/emulator-wake.md`, *Doorbell stores emulated in the ringing thread*.
    pub fn ringing_thread_counts() -> (u64, u64) {
        watch::emulation_counts()
    }

    /// Number of HCAs.
    pub fn num_hcas(&self) -> usize {
        self.shared.lock_quiet().hcas.len()
    }

    /// Identity of HCA `i` (None if out of range).
    pub fn hca_info(&self, i: usize) -> Option<HcaInfo> {
        self.shared.lock_quiet().hcas.get(i).map(|h| h.info.clone())
    }

    /// Counters of HCA `i` (zeroes if out of range).
    pub fn counters(&self, i: usize) -> Counters {
        self.shared
            .lock_quiet()
            .hcas
            .get(i)
            .map(|h| h.counters)
            .unwrap_or_default()
    }

    /// Do one round of device work: consume doorbells, execute WQEs, deliver the packets in
    /// flight, fire due timers. Returns the number of work items done (0 = nothing to do
    /// now). In stepped mode, when nothing else is pending, virtual time jumps to the next
    /// timer so retransmission timeouts elapse.
    pub fn step(&self) -> usize {
        let mut w = self.shared.lock_quiet();
        device::step(&mut w)
    }

    /// How the device thread waits for work ([`WakeMode::Stepped`] in stepped mode).
    pub fn wake_mode(&self) -> WakeMode {
        match (&self.shared.wake, self.shared.lock_quiet().cfg.mode) {
            (_, RunMode::Stepped) => WakeMode::Stepped,
            (Some(_), _) => WakeMode::Fault,
            (None, _) => WakeMode::Poll,
        }
    }

    /// How the waking device thread is scheduled ([`DeviceSched`]; `MLX5_EMU_RT`).
    pub fn device_sched(&self) -> DeviceSched {
        match self.shared.sched.load(std::sync::atomic::Ordering::Acquire) {
            SCHED_UNKNOWN => DeviceSched::Unknown,
            SCHED_FAIR => DeviceSched::Fair,
            SCHED_DENIED => DeviceSched::FairDenied,
            p => DeviceSched::RealTime(p),
        }
    }

    /// The kernel thread id of the waking device thread (for `chrt`, `perf`, `/proc`), once
    /// it has started; None in stepped mode and for the polling device.
    pub fn device_thread_id(&self) -> Option<i32> {
        if self.device_sched() == DeviceSched::Unknown {
            return None;
        }
        Some(
            self.shared
                .device_tid
                .load(std::sync::atomic::Ordering::Relaxed),
        )
    }

    /// Call [`Emulator::step`] until it reports no work (bounded, so a QP retrying forever
    /// cannot hang a test). Returns the total work done.
    pub fn run_until_idle(&self) -> usize {
        let mut total = 0;
        for _ in 0..1_000_000 {
            let n = self.step();
            if n == 0 {
                break;
            }
            total += n;
        }
        total
    }
}

fn device_thread(weak: Weak<Shared>) {
    // Spin (yielding) for SPIN_WINDOW after the last work item, so ping-pong gaps do not
    // land in a sleep; then sleep 50 us while recently active, and back off to 2 ms once
    // idle for more than ACTIVE_WINDOW.
    const SPIN_WINDOW: Duration = Duration::from_micros(300);
    const ACTIVE_WINDOW: Duration = Duration::from_secs(1);
    // A fresh HCA starts out idle.
    let mut last_work = std::time::Instant::now()
        .checked_sub(ACTIVE_WINDOW)
        .unwrap_or_else(std::time::Instant::now);
    let mut idle_sleeps: u32 = 0;
    loop {
        let Some(shared) = weak.upgrade() else { return };
        let n = {
            let mut w = shared.lock_quiet();
            device::step(&mut w)
        };
        drop(shared);
        if n > 0 {
            last_work = std::time::Instant::now();
            idle_sleeps = 0;
            continue;
        }
        let fds: Vec<i32> = weak
            .upgrade()
            .map(|s| s.udp_fds.clone())
            .unwrap_or_default();
        let since = last_work.elapsed();
        if since < SPIN_WINDOW {
            std::hint::spin_loop();
            std::thread::yield_now();
        } else {
            // Recently active (within a second): short sleeps, so a doorbell rung by a
            // ping-pong peer is seen within ~50 us. Idle for longer: back off to 2 ms.
            let us = if since < ACTIVE_WINDOW {
                50
            } else {
                idle_sleeps = idle_sleeps.saturating_add(1);
                (50u64 << (idle_sleeps / 16).min(6)).min(2000)
            };
            if fds.is_empty() {
                std::thread::sleep(Duration::from_micros(us));
            } else {
                // Sleep, but wake at once when a packet arrives.
                let mut pfds: Vec<libc::pollfd> = fds
                    .iter()
                    .map(|&fd| libc::pollfd {
                        fd,
                        events: libc::POLLIN,
                        revents: 0,
                    })
                    .collect();
                let ts = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: (us * 1000) as libc::c_long,
                };
                // SAFETY: `pfds` is a valid array of pollfd for the call; the sockets stay
                // open while any handle (and thus `world`) lives, and a closed fd only makes
                // ppoll report POLLNVAL.
                unsafe {
                    libc::ppoll(
                        pfds.as_mut_ptr(),
                        pfds.len() as libc::nfds_t,
                        &ts,
                        std::ptr::null(),
                    )
                };
                if pfds.iter().any(|p| p.revents != 0) {
                    last_work = std::time::Instant::now();
                }
            }
        }
    }
}

/// How long the waking device keeps scanning after its last work item before it protects
/// the UAR pages and blocks (`MLX5_EMU_SPIN_US`, default below): a ping-pong partner in
/// this process usually rings again within microseconds, and a scan is far cheaper for it
/// than a fault plus a wake-up. Cut short as soon as the thread finds itself preempted.
const DEFAULT_SPIN: Duration = Duration::from_micros(50);

/// How long a real-time device thread may work after a wake-up before it continues in the
/// fair class (see [`Sched`]).
const RT_BURST: Duration = Duration::from_millis(2);

/// While contexts exist, the device wakes at least this often to keep the core-clock page
/// moving.
const CLOCK_TICK: Duration = Duration::from_millis(10);

fn spin_window() -> Duration {
    std::env::var("MLX5_EMU_SPIN_US")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(DEFAULT_SPIN, Duration::from_micros)
}

/// Steps one ringing thread may run of the device before it returns to its program.
const RING_STEPS: usize = 8;

/// The device's work for a doorbell store that the fault handler emulated
/// (`watch::Runner`): the steps it brings, in the ringing thread, if the world is free; then
/// the deadline timer re-armed for what they scheduled, and a poke if work is left.
/// Runs in a SIGSEGV handler: `try_lock`, never a blocking lock.
fn run_in_ringing_thread(weak: &Weak<Shared>) -> bool {
    let Some(shared) = weak.upgrade() else {
        return false;
    };
    let Ok(mut w) = shared.world.try_lock() else {
        return false;
    };
    let mut more = true;
    for _ in 0..RING_STEPS {
        if device::step(&mut w) == 0 {
            more = false;
            break;
        }
    }
    if let Some(wk) = shared.wake.as_deref() {
        let now = w.now();
        wk.arm(device::next_deadline(&w).map(|d| d.saturating_sub(now)));
        if more {
            // Work left after our steps (a long chain of WQEs): the device thread goes on.
            wk.poke();
        }
    }
    true
}

/// The waking device thread ([`WakeMode::Fault`]): step while there is work; keep scanning
/// a little longer (an adaptive window, see [`DEFAULT_SPIN`]); then drain the eventfd,
/// re-protect the UAR pages, scan once more and block on the eventfd, the UDP sockets and
/// the next timer deadline.
fn wake_thread(weak: Weak<Shared>, wake: Arc<watch::Wake>) {
    use std::time::Instant;
    short_slice();
    let mut sched = Sched::start();
    if let Some(s) = weak.upgrade() {
        // SAFETY: gettid has no arguments.
        let tid = unsafe { libc::gettid() };
        s.device_tid
            .store(tid, std::sync::atomic::Ordering::Relaxed);
        s.sched
            .store(sched.report(), std::sync::atomic::Ordering::Release);
    }
    // `MLX5_EMU_AVOID=0`: leave the device thread's CPUs alone (see `Sched::place`).
    let avoid = std::env::var("MLX5_EMU_AVOID").map_or(true, |v| v.trim() != "0");
    // Where the thread waits (`Sched::place`): by default, when doorbells are run by the
    // ringing threads (`watch.rs`), on the ringing CPU: the device then only ever waits for
    // packets and timers, which its own application, polling for them, can give its CPU up
    // for; otherwise (`MLX5_EMU_RING=device`, lending) by the rule of `Place::Rule`.
    // `MLX5_EMU_PLACE=on|off|rule` chooses one for comparison.
    // Lending (`watch.rs`; `MLX5_EMU_LEND=1`, a real-time device only; off by default, see
    // `docs/emulator-wake.md`, *Lending*): a thread whose doorbell store faults waits for
    // this thread, which takes the doorbell from the record and runs on the CPU the waiting
    // thread leaves. So a doorbell, like an awaited answer, is waited for on the ringing
    // thread's CPU.
    let lend =
        sched.prio.is_some() && std::env::var("MLX5_EMU_LEND").is_ok_and(|v| v.trim() == "1");
    if lend {
        watch::set_lend(true);
    }
    let place = match std::env::var("MLX5_EMU_PLACE").as_deref().map(str::trim) {
        Ok("off") => Place::Off,
        Ok("on") => Place::On,
        Ok("rule") => Place::Rule,
        _ if wake.ring_here.load(std::sync::atomic::Ordering::Relaxed) && !lend => Place::On,
        _ => Place::Rule,
    };
    let mut wqes_before: u64 = 0;
    // A WQE ran on a device with a UDP fabric since the last wake-up that was not a
    // timeout: the answer from another process is what comes next (see `Sched::place`).
    let mut awaiting = false;
    // The ringing CPU at the previous wait.
    let mut last_fault_cpu = -1;
    // A device whose doorbells the ringing threads run waits on their CPU for packets: its
    // spin would only keep its own application, polling for what the device brings, off
    // the CPU (`MLX5_EMU_SPIN_US` still chooses).
    let ring_here = wake.ring_here.load(std::sync::atomic::Ordering::Relaxed);
    let max_spin = match std::env::var("MLX5_EMU_SPIN_US") {
        Err(_) if ring_here && !lend => Duration::ZERO,
        _ => spin_window(),
    };
    let mut spin = max_spin;
    let mut sleeps: u32 = 0;
    // When the device last ran out of work (None: it has work, or it just woke up).
    let mut idle_since: Option<Instant> = None;
    let mut last_iter = Instant::now();
    // When the thread last returned from its wait.
    let mut woke = last_iter;
    loop {
        let Some(shared) = weak.upgrade() else { return };
        let n = {
            let mut w = shared.lock_quiet();
            device::step(&mut w)
        };
        let now = Instant::now();
        // A gap between two scans: the scheduler took the core away, the CPUs are
        // oversubscribed, and spinning only delays the threads we wait for.
        let preempted = now.duration_since(last_iter) > Duration::from_micros(30);
        last_iter = now;
        if n > 0 {
            if idle_since.take().is_some() {
                // The spin found work: it pays; widen it again.
                spin = (spin * 2 + Duration::from_micros(1)).min(max_spin);
            }
            // Real-time only for the burst a wake-up brings: a device kept busy (a stream
            // of doorbells) shares its CPU fairly, and never starves anyone for long.
            if now.duration_since(woke) > RT_BURST {
                sched.fair();
            }
            continue;
        }
        let since = *idle_since.get_or_insert(now);
        if !preempted && now.duration_since(since) < spin {
            // A real-time thread spins as a fair one, or it keeps an application that
            // shares its core off the CPU for the whole window.
            sched.fair();
            std::hint::spin_loop();
            continue;
        }
        // The spin found nothing (or was preempted): narrow it; probe again now and then.
        spin /= 2;
        sleeps = sleeps.wrapping_add(1);
        if spin < Duration::from_micros(2) {
            spin = if sleeps % 64 == 0 {
                max_spin / 8
            } else {
                Duration::ZERO
            };
        }
        // Going to sleep. Order matters: drain, protect, scan. A store that landed before
        // the protection is seen by the scan; a later one faults and pokes the eventfd
        // after the drain, so the wait below returns at once.
        wake.drain();
        let (pending, opened) = watch::protect_pages(&wake);
        // With no page open since the last scan every store faulted (and was run or poked),
        // so the scan after the protection is needed only if one was (or pages are polled).
        let rescan = opened || wake.unwatched.load(std::sync::atomic::Ordering::Relaxed);
        let (n, deadline, clock) = {
            let mut w = shared.lock_quiet();
            let n = if rescan { device::step(&mut w) } else { 0 };
            let now_ns = w.now();
            let deadline = device::next_deadline(&w).map(|t| t.saturating_sub(now_ns));
            // Under the world lock, so the last to run the device arms the timer: a ringing
            // thread that runs it after us moves the deadline itself.
            wake.arm(deadline);
            let deadline = deadline.filter(|_| wake.timer_fd().is_none());
            let wqes: u64 = w.hcas.iter().map(|h| h.counters.wqes_executed).sum();
            // A request went out on the UDP fabric since the last wait: its answer, a
            // packet, is what comes next.
            if !shared.udp_fds.is_empty() && wqes != wqes_before {
                awaiting = true;
            }
            wqes_before = wqes;
            (n, deadline, !w.contexts.is_empty())
        };
        if n > 0 {
            idle_since = None;
            last_iter = Instant::now();
            continue;
        }
        // A page just opened by a fault whose store has not landed yet: look again in a
        // moment (first by scanning for a few microseconds, the retry usually follows at
        // once; then by a short sleep, which lets the writer have the core if it shares
        // ours). Its store is seen then, or it is re-armed and faults again.
        let deadline = match pending {
            Some(p) => {
                let t = Instant::now();
                let mut found = false;
                while t.elapsed() < Duration::from_micros(3) {
                    std::hint::spin_loop();
                    let mut w = shared.lock_quiet();
                    if device::step(&mut w) > 0 {
                        found = true;
                        break;
                    }
                }
                if found {
                    idle_since = None;
                    last_iter = Instant::now();
                    continue;
                }
                let p = p.as_nanos() as u64;
                Some(deadline.map_or(p, |d| d.min(p)))
            }
            None => deadline,
        };
        let fds = shared.udp_fds.clone();
        drop(shared);
        let mut timeout = deadline.map(Duration::from_nanos);
        if clock || wake.unwatched.load(std::sync::atomic::Ordering::Relaxed) {
            let tick = if clock {
                CLOCK_TICK
            } else {
                Duration::from_millis(1)
            };
            timeout = Some(timeout.map_or(tick, |t| t.min(tick)));
        }
        // Blocking: real-time again, so that the wake-up preempts a busy-polling
        // application at once instead of waiting for the fair scheduler.
        sched.realtime();
        if avoid {
            // Off a CPU only once it rang twice in a row: threads ringing from both CPUs in
            // turn would make the device chase them (and scan each one's BlueFlame copy
            // from the other CPU while it is being written, see `tests/wake.rs`).
            let c = watch::fault_cpu();
            match place {
                Place::Off => sched.place(c, false),
                Place::On => sched.place(c, true),
                Place::Rule => {
                    if awaiting || c == last_fault_cpu {
                        sched.place(c, awaiting || lend);
                    }
                }
            }
            last_fault_cpu = c;
        }
        let woken = wait(wake.fd(), wake.timer_fd(), &fds, timeout);
        wake.drain_timer();
        if woken {
            // A packet (the answer, or something else) or a doorbell: either way, what
            // comes next is decided again before the next wait.
            awaiting = false;
        }
        idle_since = None;
        last_iter = Instant::now();
        woke = last_iter;
    }
}

/// Where the waking device thread waits relative to the CPU of the last doorbell fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    /// On that CPU (the default while doorbells run in the ringing thread).
    On,
    /// Off it.
    Off,
    /// On it while the answer to a request is awaited (or the ringing thread lends its CPU),
    /// else off it once it rang twice in a row (`docs/emulator-wake.md`, *Scheduling*).
    Rule,
}

/// The waking device thread's scheduling class: `SCHED_FIFO` at a low priority
/// (`MLX5_EMU_RT`, default 1; `0` or `off` = never) while it blocks and works, the fair class
/// while it spins. A woken real-time thread preempts a fair one at once, so a doorbell's
/// wake-up does not wait for a busy-polling application's time slice; it never spins as a
/// real-time thread. Needs `CAP_SYS_NICE` or an `RLIMIT_RTPRIO`; without them (`EPERM`)
/// the thread stays in the fair class, and [`Emulator::device_sched`] says so. Before each
/// wait the thread also chooses its CPUs relative to the last doorbell fault's
/// (`MLX5_EMU_AVOID=0`: it doesn't), see [`Sched::place`].
struct Sched {
    /// The real-time priority, None: fair class only.
    prio: Option<i32>,
    /// Whether the thread is real-time now.
    rt: bool,
    /// Why there is no real-time priority (for the report).
    denied: bool,
    /// The CPUs the thread may run on (None: unknown).
    allowed: Option<libc::cpu_set_t>,
    /// The last placement: the ringing thread's CPU, and whether the thread was put on it
    /// (true) or kept off it (false).
    placed: (i32, bool),
}

impl Sched {
    fn start() -> Sched {
        let prio = match std::env::var("MLX5_EMU_RT").as_deref().map(str::trim) {
            Ok("0" | "off" | "no") => None,
            Ok(v) => Some(v.parse::<i32>().unwrap_or(1).clamp(1, 99)),
            Err(_) => Some(1),
        };
        // SAFETY: cpu_set_t is a plain bit array, all-zero is a valid (empty) set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: sched_getaffinity(0 = this thread, the size of `set`, a live `set`).
        let got = unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) };
        let allowed = (got == 0).then_some(set);
        let mut s = Sched {
            prio,
            rt: false,
            denied: false,
            allowed,
            placed: (-1, false),
        };
        if prio.is_some() && !s.set(true) {
            s.prio = None;
            s.denied = true;
        }
        s
    }

    /// The scheduling as [`Emulator::device_sched`] reports it.
    fn report(&self) -> i32 {
        match (self.prio, self.denied) {
            (Some(p), _) => p,
            (None, true) => SCHED_DENIED,
            (None, false) => SCHED_FAIR,
        }
    }

    fn fair(&mut self) {
        if self.rt {
            self.set(false);
        }
    }

    fn realtime(&mut self) {
        if !self.rt && self.prio.is_some() {
            self.set(true);
        }
    }

    /// Before a wait: where to be woken, relative to `cpu`, the CPU of the thread that rang
    /// last. Off it (`near` false) when the next event is a doorbell: a device woken on the
    /// ringing thread's CPU preempts that thread inside its fault handler, before its store
    /// is retried, and its spin never sees a doorbell, so every message costs a fault and a
    /// wake-up. On it (`near` true) when the next event is the answer to a request the device
    /// sent to another process: that thread only polls for it, while the other CPU holds the
    /// peer's application, which a wake-up there would stop just as it is about to answer.
    /// One `sched_setaffinity` when the placement changes; nothing if only one CPU is allowed.
    fn place(&mut self, cpu: i32, near: bool) {
        let Some(allowed) = self.allowed else { return };
        if cpu < 0 || (cpu, near) == self.placed || cpu as usize >= libc::CPU_SETSIZE as usize {
            return;
        }
        let c = cpu as usize;
        // SAFETY: `c` is below CPU_SETSIZE (checked above); `allowed` is a live cpu_set_t.
        if !unsafe { libc::CPU_ISSET(c, &allowed) } {
            return;
        }
        let mut set = allowed;
        if near {
            // SAFETY: cpu_set_t is a plain bit array; all-zero is the empty set.
            set = unsafe { std::mem::zeroed() };
            // SAFETY: `c` is below CPU_SETSIZE; `set` is a live cpu_set_t.
            unsafe { libc::CPU_SET(c, &mut set) };
        } else {
            // SAFETY: `c` is below CPU_SETSIZE; `set` is a live cpu_set_t.
            unsafe { libc::CPU_CLR(c, &mut set) };
        }
        // SAFETY: `set` is a live cpu_set_t.
        if unsafe { libc::CPU_COUNT(&set) } == 0 {
            return;
        }
        // SAFETY: sched_setaffinity(0 = this thread, the size of a live cpu_set_t, it).
        if unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &raw const set) } == 0
        {
            self.placed = (cpu, near);
        }
    }

    /// Switch this thread to `SCHED_FIFO` at `prio` or back to `SCHED_OTHER`.
    fn set(&mut self, rt: bool) -> bool {
        let (policy, prio) = match (rt, self.prio) {
            (true, Some(p)) => (libc::SCHED_FIFO, p),
            _ => (libc::SCHED_OTHER, 0),
        };
        let param = libc::sched_param {
            sched_priority: prio,
        };
        // SAFETY: sched_setscheduler(0 = this thread, a policy, a live sched_param).
        let ok = unsafe { libc::sched_setscheduler(0, policy, &raw const param) } == 0;
        if ok {
            self.rt = rt;
        }
        ok
    }
}

/// [`Emulator::device_sched`]: the device thread has not started (or is not a waking one).
const SCHED_UNKNOWN: i32 = -1;
/// The device thread runs in the fair class because `MLX5_EMU_RT` said so.
const SCHED_FAIR: i32 = 0;
/// The device thread runs in the fair class because the kernel refused `SCHED_FIFO`.
const SCHED_DENIED: i32 = -2;

/// How the threaded device is scheduled when it wakes ([`Emulator::device_sched`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceSched {
    /// Not known (yet): stepped mode, the polling device, or the thread has not started.
    Unknown,
    /// `SCHED_FIFO` at this priority while blocked or working, fair while spinning.
    RealTime(i32),
    /// The fair class, as `MLX5_EMU_RT=0` asks.
    Fair,
    /// The fair class: the kernel refused `SCHED_FIFO` (`EPERM`: no `CAP_SYS_NICE`).
    FairDenied,
}

/// Optionally (`MLX5_EMU_SLICE_US`, off by default) ask the fair scheduler for a short time
/// slice (`sched_attr.sched_runtime`, honoured by EEVDF kernels, 6.6 and later): a short
/// slice gives the device an early deadline, so on wake-up it preempts a busy-polling
/// application sooner. Best effort; no privilege needed. Off by default: not shown to help
/// on the loaded test machine, and the in-process p99 was better without it (3.0 against
/// 10,000 us in one run at load 10).
fn short_slice() {
    #[repr(C)]
    struct SchedAttr {
        size: u32,
        policy: u32,
        flags: u64,
        nice: i32,
        priority: u32,
        runtime: u64,
        deadline: u64,
        period: u64,
    }
    let us = std::env::var("MLX5_EMU_SLICE_US")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0);
    if us == 0 {
        return;
    }
    // Optionally (`MLX5_EMU_NICE`, where the process may: CAP_SYS_NICE) at a higher weight.
    // Off by default: at nice -10 the spinning device kept a same-core application off the
    // CPU for its whole spin window (in-process `mlx5 lat send` p50 97 us instead of 1.9 us).
    let want: i32 = std::env::var("MLX5_EMU_NICE")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    // SAFETY: getpriority has no pointer arguments; errno is irrelevant here (a failure
    // just leaves the nice value as it was).
    let base = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
    let nice = want.clamp(-20, 19).min(base);
    let attr = SchedAttr {
        size: size_of::<SchedAttr>() as u32,
        policy: libc::SCHED_OTHER as u32,
        flags: 0,
        nice,
        priority: 0,
        runtime: us * 1000,
        deadline: 0,
        period: 0,
    };
    // SAFETY: sched_setattr(0 = this thread, a live sched_attr of the size it states, 0).
    unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &raw const attr, 0) };
}

/// Block until `efd` or one of `fds` is readable, or `timeout` passes (`None`: forever),
/// or the deadline `timer` (a timerfd) expires. Returns whether `efd` or a socket became
/// readable (false: the timeout, the timer, or an interruption).
fn wait(efd: i32, timer: Option<i32>, fds: &[i32], timeout: Option<Duration>) -> bool {
    let mut pfds: Vec<libc::pollfd> = std::iter::once(efd)
        .chain(fds.iter().copied())
        .chain(timer)
        .map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs() as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let tsp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `pfds` is a valid array of pollfd for the call and `tsp` null or a live
    // timespec; the eventfd lives in the `Wake` we hold, the sockets while any handle
    // lives (a closed fd only makes ppoll report POLLNVAL).
    let n = unsafe {
        libc::ppoll(
            pfds.as_mut_ptr(),
            pfds.len() as libc::nfds_t,
            tsp,
            std::ptr::null(),
        )
    };
    // The deadline timer is a timeout, not an event: true only for the eventfd or a socket.
    n > 0 && pfds.iter().take(1 + fds.len()).any(|p| p.revents != 0)
}
