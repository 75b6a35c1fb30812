//! rdma-core's pingpong programs, unmodified, in all four pairings {ours, libmlx5}^2 across
//! two processes: the cross pairs prove wire interop with libmlx5; each side's `MLX5RS_LOG`
//! line (or its absence) proves who served it.

mod common;
use common::{PAIRINGS, pair};

fn all_pairings(program: &str, args: &[&str], expect: &str) {
    for (s, c) in PAIRINGS {
        let [sr, cr] = pair(program, args, "-p", s, c, &[]);
        for r in [&sr, &cr] {
            assert!(
                r.stdout.contains(expect),
                "{program} {args:?} {s:?}/{c:?}: no {expect:?} in\n{}",
                r.stdout
            );
        }
    }
}

#[test]
fn ibv_rc_pingpong_in_all_pairings() {
    all_pairings(
        "ibv_rc_pingpong",
        &["-n", "50", "-s", "4096"],
        "409600 bytes in",
    );
}

#[test]
fn ibv_rc_pingpong_with_events_and_inline_in_all_pairings() {
    // -e: completion channel, arming, ibv_get_cq_event (the user handle is our ibv_cq);
    // -c: payload check; 32 B sends are inline.
    all_pairings(
        "ibv_rc_pingpong",
        &["-n", "50", "-s", "32", "-e", "-c"],
        "3200 bytes in",
    );
}

#[test]
fn ibv_uc_pingpong_in_all_pairings() {
    all_pairings(
        "ibv_uc_pingpong",
        &["-n", "20", "-s", "1024"],
        "40960 bytes in",
    );
}

#[test]
fn ibv_ud_pingpong_in_all_pairings() {
    all_pairings(
        "ibv_ud_pingpong",
        &["-n", "20", "-s", "1024"],
        "40960 bytes in",
    );
}

#[test]
fn ibv_srq_pingpong_in_all_pairings() {
    all_pairings(
        "ibv_srq_pingpong",
        &["-n", "50", "-s", "1024"],
        "102400 bytes in",
    );
}

#[test]
fn ibv_srq_pingpong_with_events_in_all_pairings() {
    all_pairings(
        "ibv_srq_pingpong",
        &["-n", "20", "-s", "512", "-e"],
        "20480 bytes in",
    );
}
