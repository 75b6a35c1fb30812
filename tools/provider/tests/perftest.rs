//! perftest, unmodified, on our provider and across pairings with libmlx5: the default post
//! path (`ibv_create_qp_ex` with `send_ops_flags` and the `ibv_wr_*` functions) and
//! `--use_old_post_send` (`ibv_post_send`), each in all four pairings, and the UC/UD variants
//! perftest runs (`-c UC`: send/write latency and bandwidth; `-c UD`: send latency and
//! bandwidth), in all four pairings. Short runs (`-n 100`, perftest's default sizes). Each side's
//! `MLX5RS_LOG` line (or its absence) proves who served it.

mod common;
use common::{PAIRINGS, Side, pair};

fn check(program: &str, args: &[&str], pairings: &[(Side, Side)]) {
    for &(s, c) in pairings {
        // The client always prints the result table (READ/atomic servers are passive).
        let [_, cr] = pair(program, args, "-p", s, c, &[]);
        assert!(
            cr.stdout.contains("#bytes"),
            "{program} {args:?} {s:?}/{c:?}: no result table on the client:\n{}",
            cr.stdout
        );
    }
}

/// The default post path and `--use_old_post_send`, each in all four pairings.
fn both_paths(program: &str, args: &[&str]) {
    check(program, args, &PAIRINGS);
    let old: Vec<&str> = args
        .iter()
        .copied()
        .chain(["--use_old_post_send"])
        .collect();
    check(program, &old, &PAIRINGS);
}

// UC and UD bandwidth send one burst of `-n` messages (100 x 64 KiB: 6,400 datagrams) that
// the receiving device thread must take from its socket before it overflows: RC retransmits
// what is dropped, UC and UD cannot (perftest's server then waits forever). The emulator's
// RoCE sockets have a 32 MiB receive buffer for this (tools/emu/src/lib.rs); a smaller one
// hung `ib_send_bw -c UC` under load.

#[test]
fn ib_send_lat() {
    both_paths("ib_send_lat", &["-n", "100"]);
    check("ib_send_lat", &["-n", "100", "-c", "UC"], &PAIRINGS);
    check("ib_send_lat", &["-n", "100", "-c", "UD"], &PAIRINGS);
}

// ib_write_lat polls memory on both sides, so on a loaded 2-core machine the two spinning
// programs can keep both emulated HCAs' device threads off the CPUs for seconds
// (docs/emulator-wake.md): twice the first WRITE of a run went unacknowledged past the
// emulator's silence budget for perftest's default ACK timeout (`-u 14`: 67 ms, a 2.1 s
// budget) and failed RETRY_EXC on both sides, once with libmlx5 on both. `-u 16` (268 ms, a
// budget of 8.6 s) keeps the transport's timeout above the emulator's scheduling gaps; a
// lost packet is still retransmitted, after 268 ms.
#[test]
fn ib_write_lat() {
    both_paths("ib_write_lat", &["-n", "100", "-u", "16"]);
    check(
        "ib_write_lat",
        &["-n", "100", "-u", "16", "-c", "UC"],
        &PAIRINGS,
    );
}

#[test]
fn ib_read_lat() {
    both_paths("ib_read_lat", &["-n", "100"]);
}

#[test]
fn ib_atomic_lat() {
    both_paths("ib_atomic_lat", &["-n", "100"]);
}

#[test]
fn ib_send_bw() {
    both_paths("ib_send_bw", &["-n", "100"]);
    check("ib_send_bw", &["-n", "100", "-c", "UC"], &PAIRINGS);
    check("ib_send_bw", &["-n", "100", "-c", "UD"], &PAIRINGS);
}

#[test]
fn ib_write_bw() {
    both_paths("ib_write_bw", &["-n", "100"]);
    check("ib_write_bw", &["-n", "100", "-c", "UC"], &PAIRINGS);
}

#[test]
fn ib_read_bw() {
    both_paths("ib_read_bw", &["-n", "100"]);
}
