//! CPU cost of the driver's fast path on the stepped emulator (the device does not run while
//! the driver is timed, so the numbers are the driver's alone): post one inline WQE
//! (BlueFlame), post chains of 32 (one doorbell), poll one CQE. Prints ns/op; asserts that
//! everything posted completes. Run with `cargo test --release --test perf -- --nocapture`.

mod common;

use std::hint::black_box;
use std::time::Instant;

use common::{EmuRig, PairOpts, pair};
use mlx5::{QpType, SendFlags, SendWr, WcStatus, WorkCompletion, WrOp};

#[test]
fn fast_path_cost() {
    let rig = EmuRig::stepped();
    let mut o = PairOpts::new(QpType::Rc);
    o = o.caps(4096, 1, 1, 1, 12);
    o.cqe = 8192;
    let (mut a, b) = pair(&rig, o);
    let op = WrOp::Write {
        raddr: b.mr.addr(),
        rkey: b.mr.rkey(),
    };
    let payload = 42u64.to_le_bytes();
    let parts: [&[u8]; 1] = [&payload];
    let n = a.qp.cap().max_send_wr as usize;
    assert!(n >= 4096);

    // Warm-up: fault in the SQ ring, CQ ring and tables (a real kernel pins them at create).
    let mut wcs = [WorkCompletion::default(); 16];
    for round in 0..2u64 {
        for i in 0..n as u64 {
            let wr = SendWr::new(i, op, &[], SendFlags::SIGNALED).with_inline(&parts);
            a.qp.post_send(&[wr]).unwrap();
        }
        rig.emu.run_until_idle();
        let mut left = n;
        while left > 0 {
            let k = a.cq.poll(&mut wcs);
            assert!(k > 0, "warm-up round {round}");
            left -= k;
        }
    }
    let bf0 = a.qp.sq_ref().stats().bf_copies;

    // 1. Single inline WQE per post (BlueFlame copy of 64 bytes).
    let t = Instant::now();
    for i in 0..n as u64 {
        let wr = SendWr::new(i, op, &[], SendFlags::SIGNALED).with_inline(&parts);
        black_box(a.qp.post_send(black_box(&[wr]))).unwrap();
    }
    let single = t.elapsed().as_nanos() as f64 / n as f64;
    assert_eq!(a.qp.sq_ref().stats().bf_copies - bf0, n as u64);
    rig.emu.run_until_idle();

    // 2. Polling: n CQEs are waiting.
    let t = Instant::now();
    let mut got = 0;
    while got < n {
        let k = a.cq.poll(&mut wcs);
        for wc in &wcs[..k] {
            assert_eq!((wc.wr_id, wc.status), (got as u64, WcStatus::SUCCESS));
            got += 1;
        }
        assert!(k > 0, "all {n} CQEs were written before polling");
    }
    let poll = t.elapsed().as_nanos() as f64 / n as f64;

    // 3. Chains of 32 inline WQEs, one doorbell each.
    let wrs: Vec<_> = (0..32u64)
        .map(|i| SendWr::new(i, op, &[], SendFlags::SIGNALED).with_inline(&parts))
        .collect();
    let t = Instant::now();
    for _ in 0..n / 32 {
        a.qp.post_send(black_box(&wrs)).unwrap();
    }
    let chain = t.elapsed().as_nanos() as f64 / n as f64;
    rig.emu.run_until_idle();
    let mut left = n;
    while left > 0 {
        let k = a.cq.poll(&mut wcs);
        assert!(k > 0);
        left -= k;
    }
    eprintln!(
        "driver fast path ({} build): post 1 inline WQE + BlueFlame {single:.0} ns; \
         post in chains of 32 {chain:.0} ns/WR; poll {poll:.0} ns/CQE",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );
}
