#![no_std]
#![forbid(unsafe_code)]
//! mlx5 device ABI.
