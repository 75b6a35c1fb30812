//! `LD_PRELOAD` front door of the emulated ConnectX: run an unmodified rdma-core program
//! (`ibv_devinfo`, `ibv_rc_pingpong`, perftest's `ib_send_lat`, ...) on `mlx5-emu`.
//!
//! ```text
//! LD_PRELOAD=libmlx5_emu_preload.so ibv_devinfo -v
//! ```
//!
//! What the program sees, and how:
//! * **Discovery**: a sysfs tree (`class/infiniband_verbs`, `class/infiniband/mlx5_N`,
//!   a PCI function whose `modalias` makes libibverbs pick its mlx5 provider), written at
//!   load time into a private temporary directory; `SYSFS_PATH` points there. RDMA netlink
//!   sockets are refused so libibverbs takes the sysfs path on any kernel.
//! * **The device node**: `open("/dev/infiniband/uverbsN")` returns a real descriptor (of
//!   the null device) registered as ours; `stat`/`fstat` report a character device with the
//!   number written in sysfs.
//! * **The kernel**: `write` (uverbs commands), `ioctl(RDMA_VERBS_IOCTL)`, `mmap`/`munmap`
//!   (UAR and clock pages) and `close` on that descriptor go to the emulator's
//!   `UverbsSurface`. Event descriptors (async events, completion channels) are real
//!   descriptors made by the emulator: `read`/`poll` on them need no interception.
//!
//! The emulator starts, threaded, on the first device open. Configuration comes from
//! `MLX5_EMU_*` environment variables (see the `config` module). Every interposer forwards
//! what is not ours to libc unchanged (`dlsym(RTLD_NEXT)`), and a panic inside the emulator
//! becomes an `EIO` failure of the call, never an unwind into C.
//!
//! The crate builds only a `cdylib`. Its unit tests cover the pure parts (configuration,
//! sysfs tree, descriptor tables, checked copies); the interposers are compiled out of the
//! unit-test binary so that it does not hook itself, and are tested by running the real
//! rdma-core tools under `LD_PRELOAD` (`tests/`).

#![cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]

mod config;
mod registry;
mod sysfs;
mod user;
mod verbs;

#[cfg(not(test))]
mod hooks;
#[cfg(not(test))]
mod real;
#[cfg(not(test))]
mod shim;

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
