//! `mlx5-bench`: the CPU cost of each data-path operation, for the `mlx5` crate and for
//! rdma-core's libmlx5, on the same emulated ConnectX, in one run, with the ratios.
//!
//! ```text
//! cargo run --release -p mlx5-bench               # full run: table on stdout
//! cargo run --release -p mlx5-bench -- --json     # the same as JSON
//! cargo run --release -p mlx5-bench -- --quick    # few iterations (smoke test)
//! cargo run --release -p mlx5-bench -- --no-valgrind   # timer figures only
//! ```
//! (Run it with `nice -n 10` on a shared machine; build in release mode, debug numbers mean
//! nothing.) Options: `--calls N` (timed calls per operation, default 10000), `--cg-calls N`
//! (calls per operation under callgrind, default 1000).
//!
//! # What is measured
//! One RC QP connected to itself on one emulated HCA, 64-byte payloads (32 for
//! `send_inline32`), every WR signaled:
//!
//! | operation | ours, `verbs` API | ours, `lowlevel` API | libmlx5, `verbs` | libmlx5, `lowlevel` |
//! |---|---|---|---|---|
//! | `send_inline32`: one inline 32-byte SEND (one WQEBB), BlueFlame | `Qp::post_send` | `SendQueue::send`, `inline`, `finish`, `ring` | `ibv_post_send` | `ibv_wr_start`, `ibv_wr_send`, `ibv_wr_set_inline_data`, `ibv_wr_complete` |
//! | `send_inline64`: one inline SEND (two WQEBBs), BlueFlame | `Qp::post_send` | `SendQueue::send`, `inline`, `finish`, `ring` | `ibv_post_send` | `ibv_wr_start`, `ibv_wr_send`, `ibv_wr_set_inline_data`, `ibv_wr_complete` |
//! | `send_sge64`: one SEND with one SGE, 8-byte doorbell | `Qp::post_send` | `send`, `sge`, `finish`, `ring` | `ibv_post_send` | `ibv_wr_*` with `ibv_wr_set_sge` |
//! | `chain32`: 32 SGE SENDs, one doorbell (cost per WR) | `Qp::post_send` of 32 | 32 × (`send`..`finish`), `ring` | `ibv_post_send` of a 32-WR chain | `ibv_wr_start`, 32 × (`ibv_wr_send`, `ibv_wr_set_sge`), `ibv_wr_complete` |
//! | `poll_cqe`: one CQE from a CQ holding 64 | `Cq::poll` (1 entry) | `RawCq::next`, `SendQueue::retire`, `RawCq::publish_ci` | `ibv_poll_cq` (1 entry) | `ibv_start_poll`, read `wr_id`/`status`, `ibv_end_poll` |
//! | `recv1`: one receive, one SGE | `Qp::post_recv` | `RecvQueue::push`, `publish` | `ibv_post_recv` | `ibv_post_recv` (libmlx5 has no other receive API) |
//! | `recv_chain32`: 32 receives, one doorbell-record update (cost per WR) | `Qp::post_recv` of 32 | 32 × `push`, `publish` | `ibv_post_recv` of a 32-WR chain | the same |
//! | `poll_recv`: one receive CQE (a 64-byte SEND) from a CQ holding 64 | `Cq::poll` (1 entry) | `RawCq::next`, `RecvQueue::retire`, `RawCq::publish_ci` | `ibv_poll_cq` (1 entry) | `ibv_start_poll`, read `wr_id`/`status`/`byte_len`, `ibv_end_poll` |
//!
//! Before every timed receive-post region, SENDs to self (unmeasured) consume as many
//! receives as it posts; receive CQEs are produced the same way. Scatter-to-CQE is off on
//! both sides (`MLX5_SCATTER_TO_CQE=0`, `QpInitAttr::scatter_to_cqe = false`); a 64-byte
//! payload would not be scattered into a 64-byte CQE anyway.
//!
//! Both sides use the BlueFlame policy of libmlx5 with `MLX5_POST_SEND_PREFER_BF=0`:
//! BlueFlame for a single inline WQE, 8-byte doorbells otherwise ([`mlx5::BfPolicy::InlineOnly`]).
//!
//! **Instructions** (repeatable on a noisy machine): each operation is one
//! `#[inline(never)]` wrapper function (`bench_rs_<op>_<api>` here, `bench_c_<op>_<api>` in the
//! C harness `harness.c`, which calls libibverbs/libmlx5). Each side runs once under
//! `valgrind --tool=callgrind --collect-atstart=no --toggle-collect=<wrapper>...`, so only
//! the wrappers and what they call are counted; the wrapper's inclusive cost is read from the
//! callgrind output file and divided by the number of operations ([`callgrind`]). Each side
//! first runs every operation through the same wrappers as a warm-up and then calls
//! `bench_zero_stats`, on which callgrind zeroes its counters (`--zero-before`), so one-time
//! costs (lazy symbol binding, first use) are left out. The number of calls callgrind saw per
//! wrapper is checked against the run's own count, so a wrapper that the compiler inlined or
//! merged with another shows up as an error, not as a wrong figure. The device
//! never counts: our side uses the emulator in stepped mode and runs it between measured
//! calls; the C side runs under the `LD_PRELOAD` front door (`mlx5-emu-preload`, in-process
//! fabric), whose device thread is outside the toggled functions (callgrind toggles per
//! thread).
//!
//! **Time** (noisy): the clock is too coarse for one ~30 ns call, so single posts are timed
//! in batches of 32 back-to-back calls and polls in batches of 64 (the device runs between
//! batches), chains one call each; monotonic clock, and the TSC on x86_64. The median batch,
//! minus the median empty timed region, divided by the WRs in a batch, is reported. These
//! columns move with machine load; the instruction columns do not.
//!
//! The ratio column is ours / libmlx5: below 1 means the `mlx5` crate executes fewer
//! instructions (or takes less time) for that operation. libmlx5 is measured twice under
//! callgrind: as configured by default, and with `MLX5_SINGLE_THREADED=1` (no QP/CQ locks, its
//! best configuration: the `libmlx5 ST` and `ratio ST` columns). The TSC-cycle columns are the
//! timed figures in TSC ticks (x86_64 only).
//!
//! # Requirements
//! `valgrind` (or `$MLX5_BENCH_VALGRIND`; without it only the timer figures are printed, with
//! a note saying so), a C compiler (`cc` or `$CC`) and
//! the libibverbs development files (`libibverbs-dev`) for the C harness, and the preload's
//! shared object, which cargo builds next to this binary (or `$MLX5_EMU_PRELOAD_SO`).

/// Calls per operation (timed, and under callgrind) in `--quick` mode.
pub const QUICK_CALLS: usize = 64;

pub mod callgrind;
pub mod harness;
pub mod ops;
pub mod ours;
pub mod provider;
pub mod report;
pub mod timing;
