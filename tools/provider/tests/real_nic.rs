//! The matrix's twin on a real ConnectX: the same programs and pairings as `pingpong.rs`
//! and `perftest.rs`, on the device named by `MLX5_TEST_DEVICE` (no emulator; only
//! `libmlx5rs.so` preloaded). `#[ignore]`d: there is no NIC in CI. Run with
//! `MLX5_TEST_DEVICE=mlx5_0 cargo test -p mlx5-provider --release --test real_nic -- --ignored`.

mod common;
use common::{PAIRINGS, pair, real_device};

fn on_nic(program: &str, args: &[&str], expect: &str) {
    if real_device().is_none() {
        eprintln!("MLX5_TEST_DEVICE is not set: {program} not run");
        return;
    }
    for (s, c) in PAIRINGS {
        let [_, cr] = pair(program, args, "-p", s, c, &[]);
        assert!(
            cr.stdout.contains(expect),
            "{program} {args:?} {s:?}/{c:?}:\n{}",
            cr.stdout
        );
    }
}

#[test]
#[ignore = "needs a ConnectX: set MLX5_TEST_DEVICE"]
fn pingpongs_on_a_real_nic() {
    on_nic("ibv_rc_pingpong", &["-n", "100"], "bytes in");
    on_nic("ibv_rc_pingpong", &["-n", "100", "-e"], "bytes in");
    on_nic("ibv_uc_pingpong", &["-n", "100"], "bytes in");
    on_nic("ibv_ud_pingpong", &["-n", "100"], "bytes in");
    on_nic("ibv_srq_pingpong", &["-n", "100"], "bytes in");
    on_nic("ibv_srq_pingpong", &["-n", "100", "-e"], "bytes in");
    on_nic("ibv_rc_pingpong", &["-n", "100", "-t"], "bytes in");
}

#[test]
#[ignore = "needs a ConnectX: set MLX5_TEST_DEVICE"]
fn perftest_on_a_real_nic() {
    for p in [
        "ib_send_lat",
        "ib_write_lat",
        "ib_read_lat",
        "ib_atomic_lat",
        "ib_send_bw",
        "ib_write_bw",
        "ib_read_bw",
    ] {
        on_nic(p, &["-n", "1000"], "#bytes");
        on_nic(p, &["-n", "1000", "--use_old_post_send"], "#bytes");
    }
    for (p, c) in [
        ("ib_send_lat", "UC"),
        ("ib_send_lat", "UD"),
        ("ib_write_lat", "UC"),
        ("ib_send_bw", "UC"),
        ("ib_send_bw", "UD"),
        ("ib_write_bw", "UC"),
    ] {
        on_nic(p, &["-n", "1000", "-c", c], "#bytes");
    }
}
