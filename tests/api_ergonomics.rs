//! The API points a newcomer tripped on: bit sets spelled as every `bitflags` type spells them,
//! the Q_Key taken only where it means something, a UD QP brought to RTR without a dummy
//! remote, and the UD receive's GRH area named by a constant whose rule (the payload limit is
//! the path MTU, the GRH is extra) a full-MTU datagram checks.

mod common;

use common::*;
use mlx5::{
    Access, Ah, AhAttr, Error, QpState, QpType, RecvWr, SendFlags, SendWr, UD_GRH_BYTES, UdDest,
    WcFlags, WcStatus,
};

#[test]
fn bit_sets_have_the_bitflags_vocabulary() {
    assert_eq!(SendFlags::empty(), SendFlags::NONE);
    assert!(SendFlags::empty().is_empty());
    assert!(!SendFlags::SIGNALED.is_empty());
    let mut f = SendFlags::empty();
    f |= SendFlags::SIGNALED;
    f |= SendFlags::FENCE;
    assert_eq!(f, SendFlags::SIGNALED.union(SendFlags::FENCE));
    assert_eq!(f.bits(), 3);
    assert!(f.contains(SendFlags::SIGNALED) && f.intersects(SendFlags::FENCE));
    assert!(!f.intersects(SendFlags::SOLICITED));
    assert_eq!(f.difference(SendFlags::FENCE), SendFlags::SIGNALED);
    assert_eq!(f & SendFlags::FENCE, SendFlags::FENCE);
    assert_eq!(Access::empty(), Access::LOCAL_READ);
    assert_eq!(Access::ALL.difference(Access::REMOTE_ATOMIC).bits(), 7);
    assert!(WcFlags::empty().is_empty());
    assert_eq!((WcFlags::GRH | WcFlags::WITH_IMM).bits(), 3);
}

/// `to_init` on a UD QP would have to invent a Q_Key; `to_init_ud` on a connected QP would
/// throw one away. Both are refused by name and leave the QP in RESET; the right call works.
#[test]
fn the_qkey_is_taken_only_by_ud() {
    let rig = EmuRig::stepped();
    let mut ud = side(&rig, 0, &PairOpts::new(QpType::Ud));
    let e = ud.qp.to_init(1, Access::LOCAL_WRITE).unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument { attr: "qkey", .. }),
        "{e}"
    );
    assert!(e.to_string().contains("to_init_ud"), "{e}");
    assert_eq!(ud.qp.state(), QpState::Reset);
    ud.qp.to_init_ud(1, QKEY).unwrap();
    let (_, attr, _) = ud.qp.query_attr().unwrap();
    assert_eq!((attr.qkey, ud.qp.state()), (QKEY, QpState::Init));

    let mut rc = side(&rig, 1, &PairOpts::new(QpType::Rc));
    let e = rc.qp.to_init_ud(1, QKEY).unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument { attr: "qkey", .. }),
        "{e}"
    );
    assert_eq!(rc.qp.state(), QpState::Reset);
    rc.qp.to_init(1, Access::ALL).unwrap();
    let (_, attr, _) = rc.qp.query_attr().unwrap();
    assert_eq!(attr.qp_access_flags, Access::ALL);
    let e = rc.qp.to_rtr_ud().unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidArgument {
                attr: "qp_type",
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(rc.qp.state(), QpState::Init);
}

/// A UD pair brought up with no remote and no MTU, then a datagram of exactly the port's MTU
/// (4096 on the emulated InfiniBand port) into a buffer of `UD_GRH_BYTES` + 4096: it arrives
/// whole, after the GRH area; one byte more than the MTU is refused with a length error.
#[test]
fn ud_up_without_a_remote_and_a_full_mtu_datagram() {
    let rig = EmuRig::stepped();
    let o = PairOpts::new(QpType::Ud);
    let (mut a, mut b) = (side(&rig, 0, &o), side(&rig, 1, &o));
    for s in [&mut a, &mut b] {
        s.qp.to_init_ud(1, QKEY).unwrap();
        s.qp.to_rtr_ud().unwrap();
        s.qp.to_rts(0, 0).unwrap();
        assert_eq!(s.qp.state(), QpState::Rts);
    }
    let port = b.ctx.query_port(1).unwrap();
    let mtu = mlx5::Mtu::from_code(port.active_mtu).map_or(0, mlx5::Mtu::bytes);
    assert_eq!(mtu, 4096, "the emulated IB port runs MTU 4096");
    let ah = Ah::new(
        &a.pd,
        AhAttr {
            dlid: port.lid,
            port_num: 1,
            ..AhAttr::default()
        },
    )
    .unwrap();
    let dest = UdDest {
        ah: &ah,
        remote_qpn: b.qp.qpn(),
        remote_qkey: QKEY,
    };
    let rsge = [b.mr.sge(0, UD_GRH_BYTES + mtu)];
    b.qp.post_recv(&[RecvWr {
        wr_id: 7,
        sg_list: &rsge,
    }])
    .unwrap();
    let data: Vec<u8> = (0..mtu).map(|i| (i * 7 + 3) as u8).collect();
    a.buf.write(8192, &data);
    let sges = [a.mr.sge(8192, mtu)];
    a.qp.post_send(&[SendWr::send(1, &sges, SendFlags::SIGNALED).to(dest)])
        .unwrap();
    let s = poll_n(&rig, &mut a.cq, 1);
    assert_eq!(s[0].status, WcStatus::SUCCESS, "{:?}", s[0]);
    let r = poll_n(&rig, &mut b.cq, 1);
    assert_eq!(r[0].status, WcStatus::SUCCESS, "{:?}", r[0]);
    assert_eq!(
        r[0].byte_len,
        UD_GRH_BYTES + mtu,
        "byte_len counts the GRH area"
    );
    let mut got = vec![0u8; mtu as usize];
    b.buf.read(UD_GRH_BYTES as usize, &mut got);
    assert_eq!(got, data);

    let sges = [a.mr.sge(8192, mtu + 1)];
    a.qp.post_send(&[SendWr::send(2, &sges, SendFlags::SIGNALED).to(dest)])
        .unwrap();
    let s = poll_n(&rig, &mut a.cq, 1);
    assert_eq!(
        (s[0].wr_id, s[0].status),
        (2, WcStatus::LOC_LEN_ERR),
        "{:?}",
        s[0]
    );
}
