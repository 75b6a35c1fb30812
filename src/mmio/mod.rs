//! How the driver touches words the device shares: barriers named by intent, doorbell-record
//! stores, CQE loads, and UAR/BlueFlame MMIO stores.
//!
//! This is one of the three modules where `unsafe` is allowed. Every access here is width-exact
//! (one aligned native-width load or store per word), never through a Rust reference into device
//! memory or MMIO space.
#![allow(unsafe_code)]

pub mod access;
pub mod barrier;
