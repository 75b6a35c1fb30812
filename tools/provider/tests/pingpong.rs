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

#[test]
fn ibv_rc_pingpong_with_completion_timestamps_in_all_pairings() {
    // -t: ibv_create_cq_ex with IBV_WC_EX_WITH_COMPLETION_TIMESTAMP, polled with
    // ibv_start_poll/ibv_next_poll/ibv_end_poll and the read_* functions. (-t with -e fails
    // with libmlx5 on both sides too: "poll CQ failed 2".)
    all_pairings(
        "ibv_rc_pingpong",
        &["-n", "20", "-s", "1024", "-t"],
        "40960 bytes in",
    );
}

#[test]
fn ibv_xsrq_pingpong_in_all_pairings() {
    // XRC: each side opens a domain on a file, an XRC SRQ completing into its receive CQ, an
    // XRC_RECV target QP (create_qp_ex with the domain) and an XRC_SEND initiator (through
    // create_qp: comp_mask PD alone); each SEND names the peer's SRQ number
    // (`qp_type.xrc.remote_srqn`), which the peer read with ibv_get_srq_num. The program
    // prints "success" only when every receive arrived through the SRQ on the target QP
    // it looked up by the completion's qp_num.
    all_pairings("ibv_xsrq_pingpong", &["-n", "50", "-s", "1024"], "success");
}

#[test]
fn ibv_xsrq_pingpong_with_events_in_all_pairings() {
    // -e: the SRQ's CQ armed and woken through the completion channel.
    all_pairings(
        "ibv_xsrq_pingpong",
        &["-n", "20", "-s", "64", "-e"],
        "success",
    );
}
