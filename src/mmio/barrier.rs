//! Memory barriers named by what they order (rdma-core `util/udma_barrier.h`, restated).
//!
//! | intent | x86-64 | aarch64 |
//! |---|---|---|
//! | [`to_device`]: ordinary stores (WQEs, records) visible to the device before later stores | compiler barrier (TSO) | `dmb oshst` |
//! | [`from_device`]: after an owner/valid bit, later loads see the device's DMA | `lfence` | `dmb oshld` |
//! | [`wc_start`]: record store before the first write-combining MMIO store | `sfence` | `dsb st` |
//! | [`wc_flush`]: push the WC buffer out now, never merge with the next doorbell | `sfence` | `dsb st` |
//!
//! Each barrier is an `asm!` block without `nomem`, so it is also a compiler barrier for all
//! memory (a bare `fence` does not order ordinary stores against later volatile MMIO stores).
//! The x86-64 `to_device` needs no instruction: ordinary write-back stores are seen in program
//! order by the device; only the compiler must be kept from reordering.

/// All prior stores to ordinary memory (WQEs, doorbell records) are visible to the device
/// before any later store that lets it start DMA (`udma_to_device_barrier`, `dma_wmb`).
#[inline(always)]
pub fn to_device() {
    #[cfg(target_arch = "x86_64")]
    compiler_barrier();
    #[cfg(target_arch = "aarch64")]
    // SAFETY: `dmb oshst` only orders memory accesses; it reads and writes no registers or memory.
    unsafe {
        core::arch::asm!("dmb oshst", options(nostack, preserves_flags));
    }
}

/// Loads after this see everything the device wrote before the ownership byte just read
/// (`udma_from_device_barrier`, `dma_rmb`).
#[inline(always)]
pub fn from_device() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `lfence` only serialises loads; no memory or register operands.
    unsafe {
        core::arch::asm!("lfence", options(nostack, preserves_flags));
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: `dmb oshld` only orders memory accesses; no operands.
    unsafe {
        core::arch::asm!("dmb oshld", options(nostack, preserves_flags));
    }
}

/// Before the first store to write-combining UAR/BlueFlame space: orders the doorbell-record
/// store (ordinary memory) before the MMIO store (`mmio_wc_start`).
#[inline(always)]
pub fn wc_start() {
    wc_fence();
}

/// After the last store to write-combining space: emit it now, so it cannot merge with or be
/// overtaken by the next doorbell (`mmio_flush_writes`).
#[inline(always)]
pub fn wc_flush() {
    wc_fence();
}

/// An empty `asm!` block without `nomem`: the compiler must assume it reads and writes any
/// memory, so no memory access moves across it (a bare `compiler_fence` only orders atomics).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn compiler_barrier() {
    // SAFETY: an empty instruction sequence; it touches no registers, stack or flags.
    unsafe {
        core::arch::asm!("", options(nostack, preserves_flags));
    }
}

#[inline(always)]
fn wc_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sfence` only orders stores (including WC stores); no operands.
    unsafe {
        core::arch::asm!("sfence", options(nostack, preserves_flags));
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: `dsb st` waits for prior stores to complete; no operands.
    unsafe {
        core::arch::asm!("dsb st", options(nostack, preserves_flags));
    }
}

/// Orders the CPU's loads of a consumed CQE before the consumer-index store that hands the
/// slot back to the device (load -> store ordering; a no-op instruction on x86-64).
#[inline(always)]
pub fn loads_before_release() {
    #[cfg(target_arch = "x86_64")]
    compiler_barrier();
    #[cfg(target_arch = "aarch64")]
    // SAFETY: `dmb oshld` orders prior loads against later loads and stores; no operands.
    unsafe {
        core::arch::asm!("dmb oshld", options(nostack, preserves_flags));
    }
}
