//! Error paths through unmodified libibverbs/libmlx5 on the emulated HCA (`c/qp_errors.c`,
//! one scenario per run, each under a time limit so that a hang fails instead of blocking).
//!
//! Teardown after an error: libibverbs' `ibv_destroy_qp`/`ibv_destroy_cq` wait until the
//! program has acknowledged as many events as the kernel's DESTROY answer says it was given
//! (`events_reported`). ib_uverbs counts an event when the program *reads* it and takes the
//! unread events of a destroyed object off the queue; the emulated kernel used to count every
//! event raised (and raised QP_FATAL for a requester error its CQE already reports), so a
//! program that never reads async events hung in `ibv_destroy_qp` after a fetch-and-add with
//! a bad lkey.
//!
//! The send queue error state (IBA 10.3.1): after a UD or UC send error, sends posted in SQE
//! complete with `IBV_WC_WR_FLUSH_ERR`, and SQE -> RTS sends again.

mod common;

use std::path::PathBuf;
use std::time::Duration;

/// Compile `c/qp_errors.c` once per test binary.
fn program() -> PathBuf {
    static EXE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    EXE.get_or_init(|| {
        let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/c/qp_errors.c");
        let exe = std::env::temp_dir().join(format!("mlx5-qp-errors-{}", std::process::id()));
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        mlx5_emu::cprog::compile_verbs_program(&cc, &["-O1", "-Wall", "-Werror"], &src, &exe)
            .unwrap_or_else(|e| panic!("{e}"));
        exe
    })
    .clone()
}

/// Run one scenario (killed after 20 s): its stdout, asserting that it exited with 0.
fn scenario(name: &str, env: &[(&str, &str)]) -> String {
    let exe = program();
    let mut all = vec![("MLX5_EMU_FABRIC", "inprocess")];
    all.extend_from_slice(env);
    let cmd = {
        let mut c = common::tool(exe.to_str().expect("path"), &all);
        c.arg(name);
        c
    };
    // Output files of their own: scenarios run in parallel threads of one process.
    static RUN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tag = format!("qp-errors-{name}-{n}");
    let (status, out, err) = common::run(cmd, &tag, Duration::from_secs(20));
    let status = status.unwrap_or_else(|| {
        panic!("{name}: did not finish in 20 s (a teardown waiting for events?)\n{out}\n{err}")
    });
    assert!(status.success(), "{name}: {status}\n{out}\n{err}");
    out
}

fn lines(out: &str) -> Vec<&str> {
    out.lines().collect()
}

#[test]
fn teardown_returns_after_a_fetch_and_add_with_an_invalid_lkey() {
    let out = scenario("faa-lkey", &[]);
    assert_eq!(
        lines(&out),
        [
            "status local protection error",
            "destroy_qp returned",
            "destroy_cq returned",
            "done"
        ],
        "{out}"
    );
}

#[test]
fn a_responder_access_error_is_an_async_event_and_teardown_returns_once_it_is_acked() {
    let out = scenario("event-read", &[]);
    assert_eq!(
        lines(&out),
        [
            "status remote access error",
            // The requester's error is its CQE; the responder's QP, which has no WQE to
            // report on, gets the affiliated event.
            "event local access violation work queue error",
            "event_qp responder",
            "destroy_qp returned",
            "destroy_cq returned",
            "stale_event none",
            "done"
        ],
        "{out}"
    );
}

#[test]
fn an_unread_event_of_a_destroyed_qp_neither_blocks_teardown_nor_is_delivered_later() {
    let out = scenario("event-unread", &[]);
    assert_eq!(
        lines(&out),
        [
            "status remote access error",
            "destroy_qp returned",
            "destroy_cq returned",
            "stale_event none",
            "done"
        ],
        "{out}"
    );
}

#[test]
fn two_cqs_on_one_channel_count_their_own_completion_events() {
    let out = scenario("comp-shared", &[]);
    let l = lines(&out);
    assert_eq!(l.len(), 4, "{out}");
    assert!(matches!(l[0], "cq_event a" | "cq_event b"), "{out}");
    // The CQ whose event was read is destroyed while the other's event is still unread: a
    // count of the channel's unread records (the emulated kernel's old rule) made the first
    // destroy answer 0 events for an event the program had acknowledged, and it hung.
    assert_eq!(
        &l[1..],
        ["other_event pending", "destroy_cq returned", "done"],
        "{out}"
    );
}

/// The SQE scenario's expected output (the received payload after RTS included).
fn assert_sqe(out: &str) {
    assert_eq!(
        lines(out),
        [
            "status local protection error",
            "state SQE",
            "sqe_send 10 Work Request Flushed Error",
            "sqe_send 11 Work Request Flushed Error",
            "state_after RTS",
            "after_send success",
            "received success after-sqe",
            "destroy_qp returned",
            "destroy_cq returned",
            "done"
        ],
        "{out}"
    );
}

#[test]
fn ud_sends_posted_in_sqe_are_flushed_and_rts_sends_again() {
    assert_sqe(&scenario("sqe-ud", &[]));
}

#[test]
fn uc_sends_posted_in_sqe_are_flushed_and_rts_sends_again() {
    assert_sqe(&scenario("sqe-uc", &[]));
}

#[test]
fn ud_sqe_on_a_roce_port_too() {
    assert_sqe(&scenario("sqe-ud", &[("MLX5_EMU_LINK_LAYER", "eth")]));
}
