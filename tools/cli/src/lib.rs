//! The `mlx5` command-line tool, as a library so its parts can be tested: perftest-compatible
//! statistics and reports, an SVG histogram, and the test runners over the driver.
#![forbid(unsafe_code)]

pub mod app;
pub mod backend;
pub mod bench;
pub mod cli;
pub mod cost;
pub mod counters;
pub mod decode;
pub mod devinfo;
pub mod diag;
pub mod exchange;
pub mod exchange_cm;
pub mod live;
pub mod net;
pub mod progress;
pub mod raw_lat;
pub mod remote;
pub mod report;
pub mod stats;
pub mod svg;
pub mod trace;
pub mod tune;
pub mod xrc_dc;
