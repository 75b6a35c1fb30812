//! Completion channels: a blocking wait wakes on a solicited event (and not on an unsolicited
//! one) and burns no CPU while it waits. Runs on the threaded emulator (real time).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{EmuRig, PairOpts, Rig, connect, side};
use mlx5::{
    Cq, CqInit, Pd, Qp, QpInitAttr, QpType, RecvWr, SendFlags, SendWr, WcFlags, WorkCompletion,
};

fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_THREAD_CPUTIME_ID needs nothing else.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0);
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn blocking_wait_wakes_on_solicited_without_cpu(rig: &dyn Rig) {
    let o = PairOpts::new(QpType::Rc);
    let mut a = side(rig, 0, &o);
    // The receiver: its CQ is bound to a completion channel.
    let ctx = rig.open(1);
    let pd = Pd::new(&ctx).unwrap();
    let chan = Arc::new(ctx.create_comp_channel().unwrap());
    let mut cq = Cq::new(&ctx, CqInit::default(), Some(&chan)).unwrap();
    let mut qp = Qp::new(&pd, &QpInitAttr::new(QpType::Rc, &cq, &cq)).unwrap();
    let buf = Arc::new(mlx5::DmaBuf::new(8192).unwrap());
    let mr = pd.reg_mr(&buf, mlx5::Access::ALL).unwrap();
    connect((&mut a.qp, &a.ctx), (&mut qp, &ctx), mlx5::Access::ALL, 7);
    let rsge = [mr.sge(0, 256)];
    qp.post_recv(&[
        RecvWr {
            wr_id: 1,
            sg_list: &rsge,
        },
        RecvWr {
            wr_id: 2,
            sg_list: &rsge,
        },
    ])
    .unwrap();

    let chan2 = chan.clone();
    let (armed_tx, armed_rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let mut wcs = [WorkCompletion::default(); 4];
        cq.req_notify(true);
        assert_eq!(cq.poll(&mut wcs), 0, "nothing yet");
        armed_tx.send(()).unwrap();
        let t0 = Instant::now();
        let c0 = thread_cpu_time();
        let woke = cq.wait(&chan2, 20_000).unwrap();
        let cpu = thread_cpu_time() - c0;
        let woke_at = Instant::now();
        let wall = woke_at - t0;
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while got.len() < 2 && Instant::now() < deadline {
            let n = cq.poll(&mut wcs);
            got.extend_from_slice(&wcs[..n]);
        }
        (woke, cpu, wall, woke_at, got)
    });

    let sge = [a.mr.sge(0, 64)];
    armed_rx.recv().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    a.qp.post_send(&[SendWr::send(10, &sge, SendFlags::SIGNALED)])
        .unwrap();
    common::poll_n(rig, &mut a.cq, 1);
    // The unsolicited SEND has completed at the receiver; the waiter must still be asleep.
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !waiter.is_finished(),
        "woke on an unsolicited completion with a solicited-only arm"
    );
    let sent = Instant::now();
    a.qp.post_send(&[SendWr::send(
        11,
        &sge,
        SendFlags::SIGNALED | SendFlags::SOLICITED,
    )])
    .unwrap();
    let (woke, cpu, wall, woke_at, got) = waiter.join().unwrap();
    let latency = sent.elapsed();
    assert!(woke, "the wait timed out");
    assert!(woke_at >= sent, "woke before the solicited SEND was posted");
    assert_eq!(got.iter().map(|w| w.wr_id).collect::<Vec<_>>(), vec![1, 2]);
    assert!(got[1].wc_flags.contains(WcFlags::SOLICITED));
    assert!(
        cpu < Duration::from_millis(20),
        "the waiting thread used {cpu:?} of CPU in {wall:?} (it must sleep in poll(2))"
    );
    eprintln!("waited {wall:?} using {cpu:?} CPU; woke {latency:?} after the solicited post");
}

#[test]
fn on_emulator_threaded_blocking_wait_wakes_on_solicited_without_cpu() {
    blocking_wait_wakes_on_solicited_without_cpu(&EmuRig::threaded());
}

#[test]
#[ignore = "needs a ConnectX: set MLX5_TEST_DEVICE=mlx5_0"]
fn on_hardware_blocking_wait_wakes_on_solicited_without_cpu() {
    match common::HwRig::from_env() {
        Some(rig) => blocking_wait_wakes_on_solicited_without_cpu(&rig),
        None => eprintln!("MLX5_TEST_DEVICE not set; nothing to run"),
    }
}
