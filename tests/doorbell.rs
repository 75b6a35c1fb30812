//! One doorbell per chain; BlueFlame only where the policy allows; dedicated vs shared
//! doorbell registers.

mod common;

use common::{PairOpts, Rig, pair, poll_n, side};
use mlx5::{BfPolicy, QpCap, QpType, SendFlags, SendWr, WcStatus, WrOp};

fn write_wr<'a>(
    id: u64,
    sges: &'a [mlx5::Sge],
    raddr: u64,
    rkey: u32,
    flags: SendFlags,
) -> SendWr<'a> {
    SendWr::new(id, WrOp::Write { raddr, rkey }, sges, flags)
}

/// A chain of 32 WRs rings exactly one (8-byte) doorbell; each WR completes once, in order.
fn chain_of_32_rings_once(rig: &dyn Rig) {
    let mut o = PairOpts::new(QpType::Rc);
    o.cap.max_send_wr = 64;
    let (mut a, b) = pair(rig, o);
    let sges: Vec<_> = (0..32).map(|i| [a.mr.sge(i * 64, 64)]).collect();
    let wrs: Vec<_> = (0..32u64)
        .map(|i| {
            write_wr(
                i,
                &sges[i as usize],
                b.mr.addr() + i * 64,
                b.mr.rkey(),
                SendFlags::SIGNALED,
            )
        })
        .collect();
    let before = rig.counters(0);
    let st0 = a.qp.sq_ref().stats();
    a.qp.post_send(&wrs).unwrap();
    let st1 = a.qp.sq_ref().stats();
    assert_eq!(
        (
            st1.doorbells - st0.doorbells,
            st1.bf_copies - st0.bf_copies,
            st1.wqes - st0.wqes
        ),
        (1, 0, 32)
    );
    let wcs = poll_n(rig, &mut a.cq, 32);
    for (i, wc) in wcs.iter().enumerate() {
        assert_eq!((wc.wr_id, wc.status), (i as u64, WcStatus::SUCCESS));
    }
    if let (Some(b0), Some(b1)) = (before, rig.counters(0)) {
        assert_eq!(
            b1.doorbells - b0.doorbells,
            1,
            "device saw {} doorbells",
            b1.doorbells - b0.doorbells
        );
        assert_eq!(
            b1.bf_writes - b0.bf_writes,
            0,
            "a chain must not use BlueFlame"
        );
        assert_eq!(b1.wqes_executed - b0.wqes_executed, 32);
    }
}

/// Post one WQE and report (doorbell delta, BlueFlame delta) as the device counted them (or as
/// the driver counted them on hardware).
fn one_post(rig: &dyn Rig, a: &mut common::Side, wr: SendWr<'_>) -> (u64, u64) {
    let c0 = rig.counters(0);
    let s0 = a.qp.sq_ref().stats();
    a.qp.post_send(&[wr]).unwrap();
    let wc = poll_n(rig, &mut a.cq, 1);
    assert_eq!(wc[0].status, WcStatus::SUCCESS, "{:?}", wc[0]);
    let s1 = a.qp.sq_ref().stats();
    let drv = (s1.doorbells - s0.doorbells, s1.bf_copies - s0.bf_copies);
    if let (Some(c0), Some(c1)) = (c0, rig.counters(0)) {
        // The emulator counts every send MMIO in `doorbells` and the BlueFlame ones also in
        // `bf_writes`.
        let bf = c1.bf_writes - c0.bf_writes;
        let dev = (c1.doorbells - c0.doorbells - bf, bf);
        assert_eq!(dev, drv, "device and driver disagree on the doorbell kind");
        assert_eq!(
            c1.bf_mismatches, 0,
            "BlueFlame copy differs from the WQE in the ring"
        );
    }
    drv
}

/// PreferBf (default): single small WQEs go by BlueFlame; a WQE over 256 B goes by doorbell.
/// InlineOnly: BlueFlame only for inline WQEs. AlwaysDoorbell: never BlueFlame.
fn bf_policy_is_obeyed(rig: &dyn Rig) {
    let mut o = PairOpts::new(QpType::Rc);
    o.cap.max_send_sge = 16;
    o.cap.max_inline_data = 256;
    let (mut a, b) = pair(rig, o);
    assert!(
        a.qp.sq_ref().bfreg().dedicated,
        "the first QP gets a dedicated register"
    );
    assert!(
        a.qp.sq_ref().bfreg().bf_size > 0,
        "the emulator has BlueFlame"
    );
    let rkey = b.mr.rkey();
    let raddr = b.mr.addr();
    let one = [a.mr.sge(0, 64)];
    let many: Vec<_> = (0..16).map(|i| a.mr.sge(i * 8, 8)).collect();
    let payload = [0x5Au8; 100];
    let inl: [&[u8]; 1] = [&payload];

    // PreferBf
    assert_eq!(
        one_post(
            rig,
            &mut a,
            write_wr(1, &one, raddr, rkey, SendFlags::SIGNALED)
        ),
        (0, 1)
    );
    // 2 + 16 data segments = 18 DS = 288 B > 256 B half: doorbell.
    assert_eq!(
        one_post(
            rig,
            &mut a,
            write_wr(2, &many, raddr, rkey, SendFlags::SIGNALED)
        ),
        (1, 0)
    );
    // InlineOnly
    a.qp.sq().set_bf_policy(BfPolicy::InlineOnly);
    assert_eq!(
        one_post(
            rig,
            &mut a,
            write_wr(3, &one, raddr, rkey, SendFlags::SIGNALED)
        ),
        (1, 0)
    );
    let wr = write_wr(4, &[], raddr, rkey, SendFlags::SIGNALED).with_inline(&inl);
    assert_eq!(one_post(rig, &mut a, wr), (0, 1));
    // AlwaysDoorbell
    a.qp.sq().set_bf_policy(BfPolicy::AlwaysDoorbell);
    let wr = write_wr(5, &[], raddr, rkey, SendFlags::SIGNALED).with_inline(&inl);
    assert_eq!(one_post(rig, &mut a, wr), (1, 0));
    let mut got = [0u8; 100];
    b.buf.read(0, &mut got);
    assert_eq!(got, payload);
}

/// More QPs than dedicated registers: the rest share one, use 8-byte doorbells only, and
/// `Context::bfreg_users` shows the sharing.
fn shared_bfregs_are_visible(rig: &dyn Rig) {
    let o = PairOpts::new(QpType::Rc);
    let s = side(rig, 0, &o);
    let mut qps = Vec::new();
    for _ in 0..20 {
        let mut init = mlx5::QpInitAttr::new(QpType::Rc, &s.cq, &s.cq);
        init.cap = QpCap {
            max_send_wr: 8,
            max_recv_wr: 8,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        qps.push(mlx5::Qp::new(&s.pd, &init).unwrap());
    }
    let infos: Vec<_> = qps.iter().map(|q| q.sq_ref().bfreg()).collect();
    let dedicated = infos.iter().filter(|i| i.dedicated).count();
    assert!(dedicated >= 1, "{infos:?}");
    for i in infos.iter().filter(|i| !i.dedicated) {
        assert_eq!(i.bf_size, 0, "a shared register is doorbell-only: {i:?}");
    }
    let users = s.ctx.bfreg_users();
    let shared: Vec<_> = users.iter().filter(|(_, n)| *n > 1).collect();
    assert!(
        !shared.is_empty(),
        "21 QPs on 16 registers must share: {users:?}"
    );
    for q in infos.iter().filter(|i| i.dedicated) {
        assert_eq!(
            users.iter().find(|(id, _)| *id == q.id).map(|x| x.1),
            Some(1),
            "{users:?}"
        );
    }
    drop(qps);
    assert!(s.ctx.bfreg_users().iter().all(|(_, n)| *n <= 1));
}

scenarios!(
    chain_of_32_rings_once,
    bf_policy_is_obeyed,
    shared_bfregs_are_visible
);
