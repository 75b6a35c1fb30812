//! CQE timestamps in time (through the device's core clock) and the QP state after an error
//! completion (the device's view against the state last set), on the threaded emulator.

use std::sync::Arc;
use std::time::{Duration, Instant};

use mlx5::emulator::{EmuConfig, Emulator, open_emulated};
use mlx5::{
    Access, Context, Cq, CqInit, DmaBuf, Mr, Pd, Qp, QpInitAttr, QpState, QpType, RecvWr, RemoteQp,
    SendFlags, SendWr, WcStatus, WorkCompletion, WrOp,
};

struct Loop {
    ctx: Context,
    _pd: Pd,
    cq: Cq,
    qp: Qp,
    peer_cq: Cq,
    peer: Qp,
    mr: Mr,
    _buf: Arc<DmaBuf>,
}

/// Two RC QPs connected to each other (`qp` sends, `peer` receives), memory registered with
/// `access`.
fn looped(access: Access) -> Loop {
    let emu = Emulator::new(EmuConfig::default());
    let ctx = open_emulated(&emu, 0).unwrap();
    let pd = Pd::new(&ctx).unwrap();
    let cq = Cq::new(&ctx, CqInit::default(), None).unwrap();
    let mut qp = Qp::new(&pd, &QpInitAttr::new(QpType::Rc, &cq, &cq)).unwrap();
    let peer_cq = Cq::new(&ctx, CqInit::default(), None).unwrap();
    let mut peer = Qp::new(&pd, &QpInitAttr::new(QpType::Rc, &peer_cq, &peer_cq)).unwrap();
    let buf = Arc::new(DmaBuf::new(4096).unwrap());
    let mr = pd.reg_mr(&buf, access).unwrap();
    let lid = ctx.query_port(1).unwrap().lid;
    let addr = |qp: &Qp| RemoteQp {
        qpn: qp.qpn(),
        psn: 0,
        lid,
        gid: None,
    };
    let (a, b) = (addr(&qp), addr(&peer));
    for (q, remote) in [(&mut qp, &b), (&mut peer, &a)] {
        q.to_init(1, Access::ALL).unwrap();
        q.to_rtr(remote, mlx5::Mtu::M1024, 0).unwrap();
        q.to_rts(0, 0).unwrap();
    }
    Loop {
        ctx,
        _pd: pd,
        cq,
        qp,
        peer_cq,
        peer,
        mr,
        _buf: buf,
    }
}

fn poll_one(cq: &mut Cq) -> WorkCompletion {
    let mut wc = [WorkCompletion::default(); 1];
    let deadline = Instant::now() + Duration::from_secs(30);
    while cq.poll(&mut wc) == 0 {
        assert!(Instant::now() < deadline, "no completion");
        std::thread::yield_now();
    }
    wc[0]
}

/// A signaled SEND to the peer; the timestamp of its send completion.
fn send_stamp(l: &mut Loop, id: u64) -> u64 {
    let r = [l.mr.sge(1024, 64)];
    l.peer
        .post_recv(&[RecvWr {
            wr_id: id,
            sg_list: &r,
        }])
        .unwrap();
    let s = [l.mr.sge(0, 8)];
    l.qp.post_send(&[SendWr::send(id, &s, SendFlags::SIGNALED)])
        .unwrap();
    let (send, recv) = (poll_one(&mut l.cq), poll_one(&mut l.peer_cq));
    assert!(send.is_ok() && recv.is_ok(), "{send:?} {recv:?}");
    send.timestamp
}

#[test]
fn cqe_timestamps_convert_to_nanoseconds_of_the_device_clock() {
    let mut l = looped(Access::LOCAL_WRITE);
    // The emulated HCA's core clock runs at 1 GHz (it counts nanoseconds).
    assert_eq!(l.ctx.hca_core_clock_khz().unwrap(), 1_000_000);
    let t0 = send_stamp(&mut l, 1);
    let pause = Duration::from_millis(60);
    let wall = Instant::now();
    std::thread::sleep(pause);
    let t1 = send_stamp(&mut l, 2);
    let wall = wall.elapsed();
    let (n0, n1) = (
        l.ctx.cqe_time_ns(t0).unwrap(),
        l.ctx.cqe_time_ns(t1).unwrap(),
    );
    assert!(t0 != 0 && n1 > n0, "{t0} {t1}");
    let d = Duration::from_nanos(n1 - n0);
    // The two completions are at least the pause apart and at most the wall time measured
    // around it plus the time to post and poll (generous: a loaded machine).
    assert!(
        d >= pause && d <= wall + Duration::from_secs(5),
        "device clock says {d:?} between completions, wall clock {wall:?}"
    );
}

#[test]
fn after_an_error_completion_the_kernel_says_err_and_state_stays_the_last_set() {
    // Memory without REMOTE_WRITE: an RDMA WRITE into it is a remote access error.
    let mut l = looped(Access::LOCAL_WRITE);
    assert_eq!(l.qp.query_state().unwrap(), QpState::Rts);
    let s = [l.mr.sge(0, 8)];
    let op = WrOp::Write {
        raddr: l.mr.addr() + 2048,
        rkey: l.mr.rkey(),
    };
    l.qp.post_send(&[SendWr::new(7, op, &s, SendFlags::SIGNALED)])
        .unwrap();
    let wc = poll_one(&mut l.cq);
    assert_eq!((wc.wr_id, wc.status), (7, WcStatus::REM_ACCESS_ERR));
    // `state()` is documented as the last state set through the driver; the kernel knows
    // better.
    assert_eq!(l.qp.state(), QpState::Rts);
    assert_eq!(l.qp.query_state().unwrap(), QpState::Err);
    // The responder went to error too.
    assert_eq!(l.peer.state(), QpState::Rts);
    assert_eq!(l.peer.query_state().unwrap(), QpState::Err);
    let mut wc = [WorkCompletion::default(); 1];
    assert_eq!(l.peer_cq.poll(&mut wc), 0, "no receive was posted: {wc:?}");
    // Reset and bring it back: both agree again.
    l.qp.modify(
        &mlx5::QpAttr {
            qp_state: Some(QpState::Reset),
            ..Default::default()
        },
        mlx5::ffi::uverbs::IB_QP_STATE,
    )
    .unwrap();
    assert_eq!(l.qp.state(), QpState::Reset);
    assert_eq!(l.qp.query_state().unwrap(), QpState::Reset);
}
