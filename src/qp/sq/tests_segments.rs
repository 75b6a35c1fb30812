//! The transport seam: [`SendQueue::begin_with_segments`] writes the caller's segments right
//! after the control segment (wrapping at the ring end), bounds them by what the QP type
//! reserved, and the plain operation starts refuse the QP types that need such segments.

use std::sync::atomic::Ordering;

use mlx5_hw::opcodes::SendOpcode;
use mlx5_hw::wqe::DataSeg;
use zerocopy::FromBytes;

use super::tests::{ctrl_at, rig, sge};
use super::{BfPolicy, sq_overhead};
use crate::types::QpType;
use crate::wr::{PostError, SendFlags, SendWr};

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| seed.wrapping_add(i as u8)).collect()
}

#[test]
fn segments_follow_the_control_segment_up_to_the_reservation() {
    for (t, reserved) in [
        (QpType::XrcSend, 48),
        (QpType::Dci, 80),
        (QpType::RawPacket, 32),
        (QpType::Rc, 32),
        (QpType::Ud, 48),
    ] {
        assert_eq!(sq_overhead(t) - 16, reserved, "{t}");
        let mut r = rig(t, 4, 2, 0, BfPolicy::AlwaysDoorbell);
        let max_gs = r.sq.geometry().max_gs;
        let wqe_size = r.sq.geometry().wqe_size as usize;
        let segs = pattern(reserved as usize, 0x40);
        // The whole reservation plus every data segment the queue allows: inside the WQE size.
        let mut b =
            r.sq.begin_with_segments(SendOpcode::SEND, SendFlags::SIGNALED, [0; 4], &segs)
                .unwrap()
                .sge(&sge(1))
                .unwrap();
        for k in 1..max_gs {
            b = b.sge(&sge(u64::from(k) + 1)).unwrap();
        }
        assert!(
            matches!(b.sge(&sge(9)), Err(PostError::TooManySges { .. })),
            "{t}: one data segment past max_gs"
        );
        let mut b =
            r.sq.begin_with_segments(SendOpcode::SEND, SendFlags::SIGNALED, [0; 4], &segs)
                .unwrap()
                .sge(&sge(1))
                .unwrap();
        for k in 1..max_gs {
            b = b.sge(&sge(u64::from(k) + 1)).unwrap();
        }
        b.finish(77);
        r.sq.ring();
        let (c, w) = ctrl_at(&r.sq, 0);
        let ds = 1 + reserved / 16 + max_gs;
        assert_eq!(
            (c.opcode(), c.ds(), c.fm_ce_se),
            (SendOpcode::SEND, ds as u8, 0x08)
        );
        assert!(
            ds as usize * 16 <= wqe_size,
            "{t}: ds {ds} past {wqe_size} B"
        );
        assert_eq!(&w[16..16 + reserved as usize], &segs[..], "{t}");
        let d = DataSeg::read_from_bytes(&w[16 + reserved as usize..32 + reserved as usize]);
        assert_eq!(
            d.unwrap().addr(),
            0x1000,
            "{t}: the payload follows the segments"
        );
        assert_eq!(r.sq.producer(), ds.div_ceil(4), "{t}");
        assert_eq!(r.sq.outstanding(), 1);
    }
}

#[test]
fn bad_segments_are_refused_by_name_and_post_nothing() {
    let mut r = rig(QpType::XrcSend, 4, 1, 0, BfPolicy::PreferBf);
    for len in [8, 24, 64, 4096] {
        let segs = vec![0u8; len];
        let e =
            r.sq.begin_with_segments(SendOpcode::SEND, SendFlags::NONE, [0; 4], &segs)
                .err();
        assert_eq!(e, Some(PostError::BadSegments { len, reserved: 48 }));
    }
    assert_eq!((r.sq.producer(), r.sq.outstanding()), (0, 0));
    // An abandoned builder posts nothing either.
    drop(
        r.sq.begin_with_segments(SendOpcode::SEND, SendFlags::NONE, [0; 4], &[1; 16])
            .unwrap(),
    );
    assert_eq!((r.sq.producer(), r.sq.outstanding()), (0, 0));
}

#[test]
fn segments_wrap_at_the_ring_end() {
    let mut r = rig(QpType::Dci, 4, 1, 0, BfPolicy::PreferBf);
    let cnt = r.sq.geometry().wqe_cnt;
    // WQEs of the control segment alone (one WQEBB each) up to the last WQEBB of the ring.
    for i in 0..cnt - 1 {
        r.sq.q.shared.tail.store(r.sq.q.head, Ordering::Relaxed);
        r.sq.set_state(crate::types::QpState::Rts);
        r.sq.begin_with_segments(SendOpcode::NOP, SendFlags::NONE, [0; 4], &[])
            .unwrap()
            .finish(u64::from(i));
    }
    r.sq.ring();
    assert_eq!(r.sq.producer(), cnt - 1);
    r.sq.q.shared.tail.store(r.sq.q.head, Ordering::Relaxed);
    r.sq.set_state(crate::types::QpState::Rts);
    let segs = pattern(80, 1);
    r.sq.begin_with_segments(SendOpcode::SEND, SendFlags::SIGNALED, [0; 4], &segs)
        .unwrap()
        .sge(&sge(3))
        .unwrap()
        .finish(99);
    r.sq.ring();
    // ctrl 16 + 80 + data 16 = 112 bytes from the last WQEBB: 48 bytes of segments before the
    // end, the other 32 and the data segment at the ring start.
    let (c, w) = ctrl_at(&r.sq, cnt - 1);
    assert_eq!(c.ds(), 7);
    assert_eq!(&w[16..96], &segs[..]);
    let mut start = [0u8; 48];
    r.sq.wqe_bytes(0, &mut start);
    assert_eq!(&start[..32], &segs[48..]);
    assert_eq!(
        DataSeg::read_from_bytes(&start[32..]).unwrap().addr(),
        0x3000
    );
    assert_eq!(r.sq.producer(), cnt + 1);
}

#[test]
fn plain_starts_refuse_the_types_that_need_segments() {
    for t in [QpType::XrcSend, QpType::Dci, QpType::RawPacket] {
        let mut r = rig(t, 4, 1, 16, BfPolicy::PreferBf);
        assert!(matches!(
            r.sq.send(SendFlags::NONE),
            Err(PostError::BadDestination)
        ));
        assert!(matches!(
            r.sq.write(SendFlags::NONE, 0, 0, None),
            Err(PostError::BadOpcode)
        ));
        assert!(matches!(
            r.sq.read(SendFlags::NONE, 0, 0),
            Err(PostError::BadOpcode)
        ));
        assert_eq!(
            r.sq.post_send(&[SendWr::send(1, &[sge(1)], SendFlags::NONE)]),
            Err((0, PostError::BadOpcode)),
            "{t}: a verbs WR has no field for the transport segment yet"
        );
        let data: [&[u8]; 1] = [b"abc"];
        assert_eq!(
            r.sq.post_send(&[SendWr::send_inline(1, &data, SendFlags::NONE)]),
            Err((0, PostError::BadOpcode))
        );
        assert_eq!((r.sq.producer(), r.sq.outstanding()), (0, 0), "{t}");
    }
}
