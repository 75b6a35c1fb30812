//! `libmlx5rs`: the `mlx5` driver behind libibverbs.
//!
//! A libibverbs provider that unmodified programs (the rdma-core tools, perftest, qperf, UCX's
//! verbs transports, MPI over them) load in place of libmlx5, so the same binary runs on
//! either on the same device. Every WQE, doorbell and CQE is the `mlx5` crate's; the kernel
//! commands are the crate's own uverbs encoder on the command fd libibverbs opened.
//!
//! How it gets in (`docs/provider.md`): the library is preloaded and defines
//! `verbs_register_driver_34` itself. libmlx5 (linked by perftest and UCX, or loaded by
//! libibverbs from its driver directory) registers through that symbol, which binds here
//! first: the provider registers its own `verbs_device_ops` ahead of libmlx5's and forwards
//! libmlx5's registration to libibverbs. A device goes to the first provider whose match
//! accepts it, and ours declines a device when `MLX5RS_PROVIDER` (or the per-device
//! `MLX5RS_PROVIDER_<ibdev>`) says `libmlx5`.
//!
//! No panic crosses into C: every entry point runs under [`guard`], which aborts the process
//! with a message naming the entry point.
//!
//! # Safety of the entry points
//! The `unsafe extern "C" fn`s of the ops tables (`qp.rs`, `cq.rs`, `objects.rs`, `wr.rs`,
//! `fast.rs`, `device.rs`) share one contract, the one libibverbs keeps for every provider:
//! each object pointer they take (`ibv_pd`, `ibv_cq`, `ibv_qp`, `ibv_qp_ex`, `ibv_srq`,
//! `ibv_ah`, `verbs_mr`, `verbs_sysfs_dev`) is one this provider returned and has not yet
//! destroyed, so it is the first member of the provider's own struct that the `SAFETY`
//! comment inside names; each buffer argument (`ibv_wc` arrays, work-request chains, attribute
//! structs) is valid for the length and type `verbs.h` declares for that call. A destroy entry
//! point is called once per object, after which libibverbs never passes it again.

#![cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#![allow(missing_debug_implementations)]
// The unit-test build leaves out the exported entry points that reach the rest.
#![cfg_attr(test, allow(dead_code))]
// A C-ABI crate: one SAFETY comment covers the few raw accesses of one C struct together.
#![allow(clippy::multiple_unsafe_ops_per_block)]

pub mod abi;
mod config;
mod cq;
mod device;
mod fast;
mod objects;
mod private;
mod qp;
pub mod surface;
mod wr;
mod xrc;

pub use config::{Choice, choice_for};

/// Run `f`, aborting the process with a message naming `what` if it panics (no unwinding
/// into C).
#[inline(always)]
pub(crate) fn guard<R>(what: &'static str, f: impl FnOnce() -> R) -> R {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(_) => {
            eprintln!("libmlx5rs: panic in {what}; aborting (a panic must not unwind into C)");
            std::process::abort()
        }
    }
}

/// libmlx5's (or any provider's) registration, which binds here because this library is
/// preloaded: register ours first (once), then forward.
///
/// # Safety
/// Called by a provider's constructor with its `verbs_device_ops`, as libibverbs'
/// `verbs_register_driver_34` is.
#[cfg(not(test))]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn verbs_register_driver_34(ops: *const abi::verbs_device_ops) {
    guard("verbs_register_driver_34", || {
        let Some(p) = private::get() else {
            // Refused (the message is printed once): forward only.
            if let Some(real) = private::real_register() {
                // SAFETY: forwarding the caller's own argument to libibverbs' function.
                unsafe { real(ops) };
            }
            return;
        };
        device::register_once(p);
        if !core::ptr::eq(ops, device::ops_ptr()) {
            // SAFETY: forwarding the caller's own argument to libibverbs' function.
            unsafe { (p.register)(ops) };
        }
    })
}

/// Library constructor: register ours if libibverbs is already in the process (a program
/// that links it); otherwise the first provider registration (above) does it.
#[cfg(not(test))]
#[used]
#[unsafe(link_section = ".init_array")]
static CONSTRUCTOR: extern "C" fn() = {
    extern "C" fn constructor() {
        guard("constructor", || {
            if private::libibverbs_loaded() {
                if let Some(p) = private::get() {
                    device::register_once(p);
                }
            }
        })
    }
    constructor
};
