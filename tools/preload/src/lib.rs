//! `LD_PRELOAD` front door of the emulated ConnectX: run an unmodified rdma-core program
//! (`ibv_devinfo`, `ibv_rc_pingpong`, perftest's `ib_send_lat`, ...) on `mlx5-emu`.
//!
//! ```text
//! LD_PRELOAD=libmlx5_emu_preload.so ibv_devinfo -v
//! ```
//!
//! Two processes (`ibv_rc_pingpong` server and client, perftest) each get their own
//! emulator; they reach each other over the emulator's UDP fabric (RoCEv2 on loopback), each
//! with its own LID, GUID and QP numbers.
//!
//! What the program sees, and how:
//! * **Discovery**: a sysfs tree laid out as the kernel lays it (the PCI function
//!   `devices/pci0000:00/<bdf>` with its ids, `modalias` (how libibverbs picks its mlx5
//!   provider), `infiniband/mlx5_N`, `infiniband_verbs/uverbsN` and, on an Ethernet port,
//!   `net/<ifname>`; the `class/...` entries are symlinks into it, so UCX finds the PCI ids
//!   through `realpath`) in a private temporary directory that `SYSFS_PATH` points at (set by
//!   the library constructor). The tree is written, and the emulator started (threaded), when
//!   the program first touches a path inside it; a program that never looks (a shell,
//!   `timeout`) starts nothing. RDMA netlink sockets are refused so libibverbs takes the sysfs
//!   path on any kernel.
//! * **The device node**: `open("/dev/infiniband/uverbsN")` returns a real descriptor (of
//!   the null device) registered as ours; `stat`/`fstat`/`statx` report a character device
//!   with the number written in sysfs; `dup`/`dup2`/`dup3`/`fcntl(F_DUPFD*)` and
//!   `close_range` are followed.
//! * **The kernel**: `write` (uverbs commands), `ioctl(RDMA_VERBS_IOCTL)`, `mmap`/`munmap`
//!   (UAR and clock pages) and `close` on that descriptor go to the emulator's
//!   `UverbsSurface`. Event descriptors (async events, completion channels) are real
//!   descriptors made by the emulator: `read`/`poll` on them need no interception.
//! * **Below libc**: a program whose `mmap`/`munmap` never reach our hooks (UCX's memory
//!   hooks patch ours into direct system calls; `syscall(SYS_mmap, ..)`) is served through a
//!   seccomp trap installed at the first device open (the `trap` module,
//!   `docs/emulator-preload.md`).
//!
//! Configuration comes from `MLX5_EMU_*` environment variables (flavour, HCA count, link
//! layer (InfiniBand or RoCE), fabric, node, faults, pcap, trace; see the `config` module).
//! Every interposer forwards what is not ours to libc unchanged (`dlsym(RTLD_NEXT)`), and
//! a panic inside the emulator becomes an `EIO` failure of the call, never an unwind into C.
//!
//! Not covered: `MAP_FIXED` or private mappings of the device descriptor (refused with
//! `EINVAL`), `mremap` of a device page, and using the device in a `fork`ed child (the emulator's thread does not
//! exist there; rdma-core does not support that either).
//!
//! The product is the `cdylib`; the `rlib` exists only so that `cargo test` builds it before
//! the integration tests, and must not be linked into anything (it would hook that
//! program's libc calls). The unit tests cover the pure parts (configuration, sysfs tree,
//! descriptor tables, checked copies, verb names); the interposers are compiled out of the
//! unit-test binary, and are tested by running the real rdma-core and perftest tools under
//! `LD_PRELOAD` (`tests/rdma_core_tools.rs`).

#![cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]

mod config;
mod counters;
mod registry;
mod sysfs;
mod trap;
mod user;
mod verbs;

#[cfg(not(test))]
mod hooks;
#[cfg(not(test))]
mod ifaddrs;
#[cfg(not(test))]
mod real;
#[cfg(not(test))]
mod shim;
#[cfg(not(test))]
mod ucma;

/// Library constructor: runs when the dynamic loader maps the shim, before `main`.
#[cfg(not(test))]
#[used]
#[unsafe(link_section = ".init_array")]
static CONSTRUCTOR: extern "C" fn() = {
    extern "C" fn constructor() {
        shim::init();
    }
    constructor
};

/// Library destructor: runs at exit.
#[cfg(not(test))]
#[used]
#[unsafe(link_section = ".fini_array")]
static DESTRUCTOR: extern "C" fn() = {
    extern "C" fn destructor() {
        shim::fini();
    }
    destructor
};
