#![no_std]
#![forbid(unsafe_code)]
//! mlx5 device ABI: the byte layouts the ConnectX hardware reads and writes in host memory
//! and in the UAR page, as plain `#[repr(C)]` data with the byte order in the type.
//!
//! | PRM chapter / mlx5dv.h part        | module        |
//! |------------------------------------|---------------|
//! | big-endian field types, bit ranges | [`types`]     |
//! | send opcodes, CQE opcodes, syndromes, `ibv_wc_status` | [`opcodes`] |
//! | send and receive WQE segments      | [`wqe`]       |
//! | completion queue entries           | [`cqe`]       |
//! | doorbell records and UAR registers | [`doorbell`]  |
//! | error explanations (meaning, causes, what to check) | [`syndrome`] |
//!
//! Rules of this crate: every layout is `#[repr(C)]` with zerocopy derives, field names are the
//! rdma-core (`mlx5dv.h`) / PRM names, big-endian fields are [`types::Be32`] and friends, reserved
//! bytes are explicit, and a `const` block under every type asserts its size and field offsets.
//! Encoders and decoders are pure and total: values decoded from the device are open enums
//! (newtypes with associated consts) that keep unknown values. Nothing here panics on bad input.
//! `tests/header_check.rs` proves sizes, offsets and constants against the installed `mlx5dv.h`.

pub mod cqe;
pub mod doorbell;
pub mod opcodes;
pub mod syndrome;
pub mod types;
pub mod wqe;
