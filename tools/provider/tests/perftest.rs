//! perftest, unmodified, on our provider and across pairings with libmlx5: the default post
//! path (`ibv_create_qp_ex` with `send_ops_flags` and the `ibv_wr_*` functions) in all four
//! pairings, `--use_old_post_send` (`ibv_post_send`) on ours/ours and one cross pair, and the
//! UC/UD variants perftest runs. Short runs (`-n 100`, perftest's default sizes). Each side's
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

const OLD: [(Side, Side); 2] = [(Side::Ours, Side::Ours), (Side::Libmlx5, Side::Ours)];
const OLD_REV: [(Side, Side); 2] = [(Side::Ours, Side::Ours), (Side::Ours, Side::Libmlx5)];

#[test]
fn ib_send_lat() {
    check("ib_send_lat", &["-n", "100"], &PAIRINGS);
    check("ib_send_lat", &["-n", "100", "--use_old_post_send"], &OLD);
    check("ib_send_lat", &["-n", "100", "-c", "UD"], &OLD_REV);
}

#[test]
fn ib_write_lat() {
    check("ib_write_lat", &["-n", "100"], &PAIRINGS);
    check(
        "ib_write_lat",
        &["-n", "100", "--use_old_post_send"],
        &OLD_REV,
    );
    check("ib_write_lat", &["-n", "100", "-c", "UC"], &OLD);
}

#[test]
fn ib_read_lat() {
    check("ib_read_lat", &["-n", "100"], &PAIRINGS);
    check("ib_read_lat", &["-n", "100", "--use_old_post_send"], &OLD);
}

#[test]
fn ib_atomic_lat() {
    check("ib_atomic_lat", &["-n", "100"], &PAIRINGS);
    check(
        "ib_atomic_lat",
        &["-n", "100", "--use_old_post_send"],
        &OLD_REV,
    );
}

#[test]
fn ib_send_bw() {
    check("ib_send_bw", &["-n", "100"], &PAIRINGS);
    // (UC/UD bandwidth is lossy by design: a loaded machine makes it hang, on libmlx5 too.)
    check("ib_send_bw", &["-n", "100", "--use_old_post_send"], &OLD);
}

#[test]
fn ib_write_bw() {
    check("ib_write_bw", &["-n", "100"], &PAIRINGS);
    check(
        "ib_write_bw",
        &["-n", "100", "--use_old_post_send"],
        &OLD_REV,
    );
}

#[test]
fn ib_read_bw() {
    check("ib_read_bw", &["-n", "100"], &PAIRINGS);
    check("ib_read_bw", &["-n", "100", "--use_old_post_send"], &OLD);
}
