//! WQE bytes and doorbells against the worked examples of docs/datapath.md §1.10, without a
//! device: the UAR page is ordinary memory we can read back.
use super::builder::*;
use super::doorbell::*;
use super::post::*;
use super::*;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use mlx5_hw::opcodes::SendOpcode;
use mlx5_hw::wqe::INLINE_SEG_FLAG;

use crate::mem::DbRec;
use crate::mem::wq::WqRing;
use crate::types::{QpState, QpType};
use crate::wr::{PostError, SendFlags, SendWr, Sge, WrOp};

use crate::mem::uar::UarPage;
use crate::mem::{DbRecPool, DmaBuf, fake};
use crate::wr::WcOpcode;
use mlx5_hw::types::Be32;
use mlx5_hw::wqe::{CtrlSeg, DataSeg};
use zerocopy::FromBytes;

pub(super) struct Rig {
    pub(super) sq: SendQueue,
    fake: Arc<fake::FakeSurface>,
    dbrec: Arc<DbRec>,
    _page: Arc<UarPage>,
}

pub(super) fn rig(
    qp_type: QpType,
    max_send_wr: u32,
    sge: u32,
    inline: u32,
    policy: BfPolicy,
) -> Rig {
    let geo = sq_geometry(qp_type, max_send_wr, sge, inline, 1008, 1 << 15).unwrap();
    let (fake, surface) = fake::surface();
    let page = UarPage::map(&surface, 0, 4096, 0, true).unwrap();
    let bf = Bfreg::new(page.bf_reg(0, 512), 256, true, 1);
    let buf = Arc::new(DmaBuf::new(geo.wqe_cnt as usize * 64).unwrap());
    let ring = WqRing::new(buf, 0, geo.wqe_cnt as usize * 64);
    let dbrec = Arc::new(DbRecPool::new(64).alloc().unwrap());
    let mut sq = SendQueue::new(
        ring,
        0x123,
        qp_type,
        geo,
        false,
        false,
        dbrec.clone(),
        bf,
        policy,
        None,
        7,
    );
    sq.set_state(QpState::Rts);
    Rig {
        sq,
        fake,
        dbrec,
        _page: page,
    }
}

pub(super) fn ctrl_at(sq: &SendQueue, counter: u32) -> (CtrlSeg, [u8; 256]) {
    let mut w = [0u8; 256];
    sq.wqe_bytes(counter, &mut w);
    (CtrlSeg::read_from_bytes(&w[..16]).unwrap(), w)
}

pub(super) fn sge(n: u64) -> Sge {
    Sge {
        addr: 0x1000 * n,
        length: 100,
        lkey: 7,
    }
}

#[test]
fn ds_of_the_worked_examples() {
    let mut r = rig(QpType::Rc, 16, 4, 128, BfPolicy::AlwaysDoorbell);
    // RC SEND, 1 SGE: ds 2, 1 WQEBB.
    r.sq.post_send(&[SendWr::send(1, &[sge(1)], SendFlags::SIGNALED)])
        .unwrap();
    let (c, w) = ctrl_at(&r.sq, 0);
    assert_eq!(
        (c.opcode(), c.ds(), c.wqe_index(), c.qpn(), c.fm_ce_se),
        (SendOpcode::SEND, 2, 0, 0x123, 0x08)
    );
    let d = DataSeg::read_from_bytes(&w[16..32]).unwrap();
    assert_eq!((d.byte_count(), d.lkey(), d.addr()), (100, 7, 0x1000));
    assert_eq!(r.sq.producer(), 1);
    // RC WRITE, 3 SGEs: ds 5, 2 WQEBBs.
    let sges = [sge(1), sge(2), sge(3)];
    let op = WrOp::Write {
        raddr: 0xdead_0000,
        rkey: 9,
    };
    r.sq.post_send(&[SendWr::new(2, op, &sges, SendFlags::NONE)])
        .unwrap();
    let (c, _) = ctrl_at(&r.sq, 1);
    assert_eq!(
        (c.opcode(), c.ds(), c.wqe_index(), c.fm_ce_se),
        (SendOpcode::RDMA_WRITE, 5, 1, 0)
    );
    assert_eq!(r.sq.producer(), 3);
    // RC SEND inline 100 B: 1 + ceil(104 / 16) = 8 DS, 2 WQEBBs; header 0x80000064.
    let data = [0xABu8; 100];
    let parts: [&[u8]; 2] = [&data[..30], &data[30..]];
    r.sq.post_send(&[SendWr::send_inline(3, &parts, SendFlags::NONE)])
        .unwrap();
    let (c, w) = ctrl_at(&r.sq, 3);
    assert_eq!(c.ds(), 8);
    assert_eq!(
        Be32::read_from_bytes(&w[16..20]).unwrap().get(),
        INLINE_SEG_FLAG | 100
    );
    assert_eq!(&w[20..120], &data[..]);
    assert_eq!(r.sq.producer(), 5);
    // The doorbell record holds the next free WQEBB; the doorbell is ctrl bytes 0..8.
    assert_eq!(r.dbrec.word1().load_be32(), 5);
    let mut db = [0u8; 8];
    r.fake.uar.read(0x800, &mut db);
    assert_eq!(&db, &w[..8]);
    assert_eq!(r.sq.stats().doorbells, 3);
}

#[test]
fn zero_length_inline_adds_no_segment() {
    let mut r = rig(QpType::Rc, 16, 1, 64, BfPolicy::PreferBf);
    let parts: [&[u8]; 2] = [&[], &[]];
    r.sq.post_send(&[SendWr::send_inline(1, &parts, SendFlags::SIGNALED)])
        .unwrap();
    let (c, _) = ctrl_at(&r.sq, 0);
    assert_eq!(c.ds(), 1, "ctrl only, as libmlx5");
    assert_eq!(r.sq.producer(), 1);
    // ds = 1 is never BlueFlamed (docs/datapath.md §3.4).
    assert_eq!((r.sq.stats().doorbells, r.sq.stats().bf_copies), (1, 0));
    // With BlueFlame for inline WRs only, a 0-byte inline WRITE (ds 2) still counts as inline.
    r.sq.set_bf_policy(BfPolicy::InlineOnly);
    let op = WrOp::Write {
        raddr: 0x100,
        rkey: 1,
    };
    let empty: [&[u8]; 1] = [&[]];
    let wr = SendWr::new(2, op, &[], SendFlags::NONE).with_inline(&empty);
    r.sq.post_send(&[wr]).unwrap();
    let (c, _) = ctrl_at(&r.sq, 1);
    assert_eq!(c.ds(), 2);
    assert_eq!(r.sq.stats().bf_copies, 1);
}

#[test]
fn blueflame_copies_the_wrapped_wqe_and_alternates_halves() {
    let mut r = rig(QpType::Rc, 4, 1, 200, BfPolicy::PreferBf);
    assert_eq!(
        (r.sq.geometry().wqe_size, r.sq.geometry().wqe_cnt),
        (256, 16)
    );
    // Move the producer to WQEBB 14 with 1-WQEBB posts, then post a 4-WQEBB inline WQE
    // that wraps (slots 14, 15, 0, 1).
    for i in 0..14u64 {
        r.sq.post_send(&[SendWr::send(i, &[sge(1)], SendFlags::NONE)])
            .unwrap();
        r.sq.q.shared.tail.store(r.sq.q.head, Ordering::Relaxed); // pretend completed
    }
    let data: Vec<u8> = (0..180u8).collect();
    let parts: [&[u8]; 1] = [&data];
    r.sq.post_send(&[SendWr::send_inline(99, &parts, SendFlags::SIGNALED)])
        .unwrap();
    let (c, w) = ctrl_at(&r.sq, 14);
    assert_eq!(
        (c.ds(), c.wqe_index()),
        (1 + (4 + 180u32).div_ceil(16) as u8, 14)
    );
    assert_eq!(&w[20..200], &data[..]);
    assert_eq!(r.sq.producer(), 18);
    // 14 single posts alternated halves 14 times (even: back at half 0); this one went to
    // half 0 and is the whole WQE, source wrapped.
    let mut bf = [0u8; 256];
    r.fake.uar.read(0x800, &mut bf);
    assert_eq!(&bf[..], &w[..256]);
    assert_eq!(r.sq.stats().bf_copies, 15);
    // The next post goes to the other half (0x900).
    r.sq.q.shared.tail.store(r.sq.q.head, Ordering::Relaxed);
    r.sq.post_send(&[SendWr::send(100, &[sge(2)], SendFlags::NONE)])
        .unwrap();
    let (_, w) = ctrl_at(&r.sq, 18);
    let mut bf = [0u8; 64];
    r.fake.uar.read(0x900, &mut bf);
    assert_eq!(&bf[..32], &w[..32]);
}

#[test]
fn full_queue_and_bad_requests_are_refused() {
    let mut r = rig(QpType::Uc, 4, 1, 0, BfPolicy::PreferBf);
    let cap = r.sq.geometry().max_post;
    for i in 0..cap {
        r.sq.post_send(&[SendWr::send(i.into(), &[sge(1)], SendFlags::NONE)])
            .unwrap();
    }
    let p = r.sq.producer();
    assert_eq!(
        r.sq.post_send(&[SendWr::send(9, &[sge(1)], SendFlags::NONE)]),
        Err((
            0,
            PostError::Full {
                outstanding: cap,
                capacity: cap
            }
        ))
    );
    assert_eq!(r.sq.producer(), p);
    let op = WrOp::Read { raddr: 0, rkey: 0 };
    let mut rc = rig(QpType::Rc, 4, 1, 16, BfPolicy::PreferBf);
    let data: [&[u8]; 1] = [b"x"];
    assert_eq!(
        rc.sq
            .post_send(&[SendWr::new(1, op, &[], SendFlags::NONE).with_inline(&data)]),
        Err((0, PostError::BadOpcode)),
        "an inline READ makes no sense"
    );
    assert_eq!(
        r.sq.post_send(&[SendWr::new(1, op, &[], SendFlags::NONE)]),
        Err((0, PostError::BadOpcode))
    );
    // max_send_sge 1 on UC gives a 64-byte WQE, which holds 2 data segments (reported back).
    assert_eq!(r.sq.geometry().max_gs, 2);
    let three = [sge(1), sge(2), sge(3)];
    r.sq.q.shared.tail.store(r.sq.q.head, Ordering::Relaxed);
    assert!(matches!(
        r.sq.post_send(&[SendWr::send(1, &three, SendFlags::NONE)]),
        Err((0, PostError::TooManySges { n: 3, max: 2 }))
    ));
    let big = [0u8; 64];
    let parts: [&[u8]; 1] = [&big];
    assert!(matches!(
        r.sq.post_send(&[SendWr::send_inline(1, &parts, SendFlags::NONE)]),
        Err((0, PostError::InlineTooLarge { len: 64, .. }))
    ));
}

#[test]
fn a_chain_stops_at_the_first_bad_wr_and_rings_the_ones_before() {
    let mut r = rig(QpType::Rc, 16, 1, 64, BfPolicy::AlwaysDoorbell);
    let max = r.sq.geometry().max_inline;
    assert_eq!(max, 76);
    // Two parts that fit alone but not together: refused with the total, part by part
    // checks writing nothing past the WQE.
    let a = [1u8; 40];
    let parts: [&[u8]; 2] = [&a, &a];
    let (s1, s2) = ([sge(1)], [sge(2)]);
    let chain = [
        SendWr::send(1, &s1, SendFlags::SIGNALED),
        SendWr::send_inline(2, &parts, SendFlags::SIGNALED),
        SendWr::send(3, &s2, SendFlags::SIGNALED),
    ];
    assert_eq!(
        r.sq.post_send(&chain),
        Err((1, PostError::InlineTooLarge { len: 80, max: 76 }))
    );
    // WR 0 is posted and rung, nothing of WR 1 or 2 is.
    assert_eq!((r.sq.producer(), r.sq.outstanding()), (1, 1));
    assert_eq!((r.sq.stats().wqes, r.sq.stats().doorbells), (1, 1));
    assert_eq!(r.dbrec.word1().load_be32(), 1);
    // The next post reuses the refused WR's slot.
    r.sq.post_send(&chain[2..]).unwrap();
    let (c, w) = ctrl_at(&r.sq, 1);
    assert_eq!((c.ds(), c.wqe_index()), (2, 1));
    assert_eq!(DataSeg::read_from_bytes(&w[16..32]).unwrap().addr(), 0x2000);
    assert_eq!(r.sq.q.shared.wr_id(1), 3);
}

#[test]
fn geometry_follows_the_reference() {
    // UD, 1 SGE: align64(64 + 16) = 128 B, max_inline 60 (docs/datapath.md §2.2).
    let g = sq_geometry(QpType::Ud, 64, 1, 0, 1008, 1 << 15).unwrap();
    assert_eq!((g.wqe_size, g.max_inline, g.max_gs), (128, 60, 4));
    assert_eq!(g.wqe_cnt, 128);
    // RC, 1 SGE, no inline: one WQEBB (no UMR ops in this driver: overhead 48).
    let g = sq_geometry(QpType::Rc, 100, 1, 0, 1008, 1 << 15).unwrap();
    assert_eq!(
        (g.wqe_size, g.wqe_cnt, g.max_post, g.max_inline),
        (64, 128, 128, 12)
    );
    let e = sq_geometry(QpType::Rc, 16, 1, 1100, 1008, 1 << 15).unwrap_err();
    assert_eq!(
        e.to_string(),
        "max_inline_data 1100 exceeds the device limit 908 for RC"
    );
    let e = sq_geometry(QpType::Rc, 1 << 16, 1, 0, 1008, 1 << 15).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("max_send_wr 65536 exceeds the device limit 32768"),
        "{e}"
    );
}

/// A tiny deterministic generator (xorshift64*), so the random tests need no dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The two control-segment words are the bytes of `CtrlSeg` (hw-layouts' encoder).
#[test]
fn ctrl_words_are_the_ctrl_segment() {
    let mut g = Rng(0x1234_5678_9abc_def1);
    for _ in 0..10_000 {
        let op = SendOpcode(g.next() as u8);
        let idx = g.next() as u32;
        let qpn = g.next() as u32 & 0xFF_FFFF;
        let ds = g.below(64) as u32;
        let fm = g.next() as u8;
        let imm = (g.next() as u32).to_ne_bytes();
        let want = CtrlSeg::new(op, 0, idx as u16, qpn, ds as u8, fm, 0).with_imm_bytes(imm);
        let want: [u8; 16] = zerocopy::transmute!(want);
        let qpn_word = u32::from_ne_bytes((qpn << 8).to_be_bytes());
        let w0 = ctrl_word0(op, idx, qpn_word, ds).to_ne_bytes();
        let w1 = ctrl_word1(fm, imm).to_ne_bytes();
        assert_eq!(&want[..8], &w0, "{op:?} {idx} {qpn} {ds}");
        assert_eq!(&want[8..], &w1);
    }
}

/// Finding: `PostError::BadState` always named RESET (`room()` hard-coded it); posting in
/// INIT or RTR must name the real state, on both APIs.
#[test]
fn refusals_name_the_real_state() {
    let mut r = rig(QpType::Rc, 16, 1, 64, BfPolicy::PreferBf);
    for state in [QpState::Reset, QpState::Init, QpState::Rtr] {
        r.sq.set_state(state);
        assert_eq!(
            r.sq.send(SendFlags::NONE).map(|_| ()),
            Err(PostError::BadState { state })
        );
        assert_eq!(
            r.sq.post_send(&[SendWr::send(1, &[sge(1)], SendFlags::NONE)]),
            Err((0, PostError::BadState { state }))
        );
        let msg = PostError::BadState { state }.to_string();
        assert!(msg.contains(&format!("{state:?}")), "{msg}");
    }
    assert_eq!(r.sq.producer(), 0);
    r.sq.set_state(QpState::Sqd);
    r.sq.send(SendFlags::NONE).unwrap().finish(1);
    assert_eq!(r.sq.producer(), 1);
    // Credits taken in RTS do not survive a move out of it.
    r.sq.set_state(QpState::Rts);
    r.sq.send(SendFlags::NONE).unwrap().finish(2);
    r.sq.set_state(QpState::Rtr);
    assert_eq!(
        r.sq.send(SendFlags::NONE).map(|_| ()),
        Err(PostError::BadState {
            state: QpState::Rtr
        })
    );
}

/// An operation gets only the segments it may have (per QP type), and the atomic result
/// SGE is checked.
#[test]
fn operations_are_refused_on_the_wrong_qp_type() {
    let mut uc = rig(QpType::Uc, 16, 2, 32, BfPolicy::PreferBf);
    let s = sge(1);
    assert_eq!(
        uc.sq.read(SendFlags::NONE, 1, 2).map(|_| ()),
        Err(PostError::BadOpcode)
    );
    assert_eq!(
        uc.sq.atomic(SendFlags::NONE, 1, 2, 3, None, &s).map(|_| ()),
        Err(PostError::BadOpcode)
    );
    let mut ud = rig(QpType::Ud, 16, 2, 32, BfPolicy::PreferBf);
    assert_eq!(
        ud.sq.send(SendFlags::NONE).map(|_| ()),
        Err(PostError::BadDestination)
    );
    assert_eq!(
        ud.sq.write(SendFlags::NONE, 1, 2, None).map(|_| ()),
        Err(PostError::BadOpcode)
    );
    let mut rc = rig(QpType::Rc, 16, 2, 32, BfPolicy::PreferBf);
    let short = Sge { length: 7, ..s };
    assert_eq!(
        rc.sq
            .atomic(SendFlags::NONE, 1, 2, 3, Some(4), &short)
            .map(|_| ()),
        Err(PostError::BadAtomicSge)
    );
    rc.sq
        .atomic(SendFlags::NONE, 0x1000, 5, 3, Some(4), &s)
        .unwrap()
        .finish(9);
    let (c, w) = ctrl_at(&rc.sq, 0);
    assert_eq!((c.opcode(), c.ds()), (SendOpcode::ATOMIC_CS, 4));
    let d = DataSeg::read_from_bytes(&w[48..64]).unwrap();
    assert_eq!((d.byte_count(), d.lkey(), d.addr()), (8, 7, 0x1000));
    assert_eq!(rc.sq.producer(), 1);
    // Nothing was refused silently: every refusal left the producer where it was.
    assert_eq!((uc.sq.producer(), ud.sq.producer()), (0, 0));
}

/// Finding: `raddr`, `atomic` and `av` never bounded the segment count (four `raddr()` on a
/// 64-byte-WQE queue moved the producer 8 WQEBBs on a 4-WQEBB ring; 70 wrapped the 6-bit ds
/// while the producer moved 18 WQEBBs). Now the operation start writes those segments once,
/// and random builder sequences on random geometries never write outside the WQE's
/// reservation: `ds` in the control segment is what was written, the producer moves
/// `ceil(ds / 4)` WQEBBs, at most `wqe_size / 64`, and every byte of the ring outside the
/// reservation is untouched.
#[test]
fn random_builders_stay_inside_their_reservation() {
    let mut g = Rng(0xfeed_f00d_dead_beef);
    let data = [0x5Au8; 1024];
    let (mut posted, mut refused) = (0, 0);
    for round in 0..300 {
        let qp_type = [QpType::Rc, QpType::Uc, QpType::Ud][g.below(3) as usize];
        let wrs = 1 + g.below(8) as u32;
        let sges = 1 + g.below(6) as u32;
        let inline = g.below(200) as u32;
        let Ok(geo) = sq_geometry(qp_type, wrs, sges, inline, 1008, 1 << 15) else {
            continue;
        };
        let mut r = rig(qp_type, wrs, sges, inline, BfPolicy::PreferBf);
        let ring_len = geo.wqe_cnt as usize * 64;
        for _ in 0..40 {
            // Retire everything, so only the capacity rule limits the next WQE.
            r.sq.q.shared.tail.store(r.sq.q.head, Ordering::Relaxed);
            let mut before = vec![0u8; ring_len];
            // Paint the ring so stray stores show.
            r.sq.ring.ring_mut().write(0, &vec![0xEE; ring_len]);
            r.sq.ring.ring().read(0, &mut before);
            let start = r.sq.producer();
            let s = Sge {
                addr: g.next(),
                length: 1 + g.below(1000) as u32,
                lkey: 1,
            };
            let n_pay = g.below(12) as usize;
            let op = g.below(6);
            let inl = g.below(2) == 0;
            let chunk = g.below(80) as usize;
            let flags = SendFlags::NONE;
            let finished = match (qp_type, op) {
                (QpType::Ud, _) => {
                    // UD needs an Ah; its segments are covered by the verbs tests.
                    false
                }
                (_, 0 | 1) => {
                    let b = if op == 0 {
                        r.sq.write(flags, 1, 2, None)
                    } else {
                        r.sq.send(flags)
                    }
                    .unwrap();
                    if inl {
                        let mut b = b.inline(&data[..chunk.min(data.len())]);
                        for _ in 0..n_pay {
                            b = b.and_then(|b| b.inline(&data[..chunk]));
                        }
                        b.map(|b| b.finish(1)).is_ok()
                    } else {
                        let mut b = b.sge(&s);
                        for _ in 0..n_pay {
                            b = b.and_then(|b| b.sge(&s));
                        }
                        b.map(|b| b.finish(1)).is_ok()
                    }
                }
                (QpType::Rc, 2) => {
                    let mut b = r.sq.read(flags, 1, 2).unwrap().sge(&s);
                    for _ in 0..n_pay {
                        b = b.and_then(|b| b.sge(&s));
                    }
                    b.map(|b| b.finish(1)).is_ok()
                }
                (QpType::Rc, 3) => {
                    let res = Sge {
                        length: s.length.max(8),
                        ..s
                    };
                    r.sq.atomic(flags, 1, 2, 3, None, &res).unwrap().finish(1);
                    true
                }
                _ => {
                    r.sq.send_imm(flags, [1, 2, 3, 4]).unwrap().finish(1);
                    true
                }
            };
            r.sq.ring();
            let moved = r.sq.producer().wrapping_sub(start);
            let res = geo.wqe_size as usize;
            let mut after = vec![0u8; ring_len];
            r.sq.ring.ring().read(0, &mut after);
            let base = (start as usize % geo.wqe_cnt as usize) * 64;
            for i in 0..ring_len {
                let k = (i + ring_len - base) % ring_len;
                if k >= res {
                    assert_eq!(after[i], before[i], "round {round}: byte {i} outside");
                }
            }
            if finished {
                let (c, _) = ctrl_at(&r.sq, start);
                assert_eq!(u32::from(c.ds()).div_ceil(4), moved, "round {round}");
                assert!(moved as usize * 64 <= res && moved >= 1, "round {round}");
                assert_eq!(c.wqe_index(), start as u16);
                posted += 1;
            } else {
                assert_eq!(moved, 0, "round {round}: refused WQE moved the producer");
                refused += 1;
            }
        }
    }
    assert!(
        posted > 2000 && refused > 1000,
        "{posted} posted, {refused} refused"
    );
}

/// 8-byte doorbells and BlueFlame copies go to alternating halves, inside the register.
#[test]
fn doorbells_alternate_halves() {
    let mut r = rig(QpType::Rc, 16, 1, 64, BfPolicy::InlineOnly);
    for i in 0..6u64 {
        let before = r.sq.q.bf.db.offset();
        r.sq.send(SendFlags::NONE)
            .unwrap()
            .sge(&sge(1))
            .unwrap()
            .finish(i);
        r.sq.ring();
        let mut db = [0u8; 8];
        r.fake.uar.read(0x800 + before, &mut db);
        let (_, w) = ctrl_at(&r.sq, i as u32);
        assert_eq!(&db, &w[..8]);
        assert_eq!(r.sq.q.bf.db.offset(), before ^ 256);
    }
    assert_eq!((r.sq.stats().doorbells, r.sq.stats().bf_copies), (6, 0));
}

/// Ring bytes, SQ record, both BlueFlame halves, counters, producer, BlueFlame offset
/// and the WR records of a rig.
type Observed = (
    Vec<u8>,
    u32,
    Vec<u8>,
    SqStats,
    u32,
    u32,
    Vec<(u64, WcOpcode)>,
);

/// Everything observable of a rig: ring bytes, SQ record, both BlueFlame halves (the
/// 8-byte doorbell lands at their start), counters and the WR records.
fn observe(r: &Rig) -> Observed {
    let mut ring = vec![0u8; r.sq.ring.ring().len()];
    r.sq.ring.ring().read(0, &mut ring);
    let mut uar = vec![0u8; 512];
    r.fake.uar.read(0x800, &mut uar);
    let recs = (0..r.sq.q.head)
        .map(|o| (r.sq.q.shared.wr_id(o), r.sq.q.shared.wr_op(o)))
        .collect();
    (
        ring,
        r.dbrec.word1().load_be32(),
        uar,
        r.sq.stats(),
        r.sq.producer(),
        r.sq.q.bf.db.offset() as u32,
        recs,
    )
}

/// The fused paths (`send_inline_now`, and `post_send` of one WR) post exactly what the
/// builder posts, with the same doorbell (BlueFlame or 8 bytes, same half) and the same
/// refusals: random geometries, payload sizes around every limit, WQEs left unrung before
/// them, wrap-around at the ring end, full queues, states that do not allow posting.
#[test]
fn fused_sends_match_the_builder() {
    let mut g = Rng(0x0bad_cafe_f00d_1234);
    let data: Vec<u8> = (0..1024u32).map(|i| (i * 7 + 3) as u8).collect();
    let mut fused_taken = 0;
    for round in 0..200 {
        let qp_type = [QpType::Rc, QpType::Uc, QpType::Ud][g.below(3) as usize];
        let wrs = 1 + g.below(6) as u32;
        let sges = 1 + g.below(3) as u32;
        let inline = g.below(120) as u32;
        let policy = [
            BfPolicy::PreferBf,
            BfPolicy::InlineOnly,
            BfPolicy::AlwaysDoorbell,
        ][g.below(3) as usize];
        if sq_geometry(qp_type, wrs, sges, inline, 1008, 1 << 15).is_err() {
            continue;
        }
        let mut a = rig(qp_type, wrs, sges, inline, policy);
        let mut b = rig(qp_type, wrs, sges, inline, policy);
        let max_inline = a.sq.geometry().max_inline as usize;
        for step in 0..60u64 {
            if g.below(4) == 0 {
                let t = a.sq.q.head.wrapping_sub(g.below(3) as u32);
                a.sq.q.shared.tail.store(t, Ordering::Relaxed);
                b.sq.q.shared.tail.store(t, Ordering::Relaxed);
            }
            if g.below(25) == 0 {
                let st = [QpState::Rts, QpState::Init, QpState::Err][g.below(3) as usize];
                a.sq.set_state(st);
                b.sq.set_state(st);
            }
            let flags = SendFlags(g.below(16) as u32);
            let id = (round << 8) | step;
            let len = match g.below(4) {
                0 => g.below(8) as usize,
                1 => max_inline.saturating_sub(2) + g.below(5) as usize,
                _ => g.below(70) as usize,
            }
            .min(data.len());
            let payload = &data[step as usize % 64..][..len.min(data.len() - 64)];
            let sg = [Sge {
                addr: g.next(),
                length: g.below(3) as u32 * 0x1000,
                lkey: 5,
            }];
            let parts = [payload];
            match g.below(6) {
                // A chain of plain SENDs (the verbs chain path), rung once even on error.
                5 => {
                    let sgs: Vec<[Sge; 1]> = (0..1 + g.below(4))
                        .map(|k| {
                            [Sge {
                                addr: g.next(),
                                length: (g.below(3) as u32) << k,
                                lkey: k as u32,
                            }]
                        })
                        .collect();
                    let wrs: Vec<SendWr<'_>> = sgs
                        .iter()
                        .enumerate()
                        .map(|(k, sg)| SendWr::send(id + k as u64, sg, flags))
                        .collect();
                    let ra = a.sq.post_send(&wrs);
                    let mut rb = Ok(());
                    for (k, wr) in wrs.iter().enumerate() {
                        let r =
                            b.sq.send(wr.flags)
                                .and_then(|w| w.sge(&wr.sg_list[0]))
                                .map(|w| w.finish(wr.wr_id));
                        if let Err(e) = r {
                            rb = Err((k, e));
                            break;
                        }
                    }
                    if wrs.len() > 1 || rb.is_ok() {
                        b.sq.ring();
                    }
                    assert_eq!(ra, rb, "round {round} step {step}");
                }
                // A WQE left for a later doorbell (then no BlueFlame for the next one).
                0 => {
                    let ra =
                        a.sq.send(flags)
                            .and_then(|w| w.sge(&sg[0]))
                            .map(|w| w.finish(id));
                    let rb =
                        b.sq.send(flags)
                            .and_then(|w| w.sge(&sg[0]))
                            .map(|w| w.finish(id));
                    assert_eq!(ra, rb);
                }
                1 | 2 => {
                    let ra = if g.below(2) == 0 {
                        a.sq.send_inline_now(flags, payload, id)
                    } else if a.sq.fast_send(
                        SendOpcode::SEND,
                        [0; 4],
                        flags,
                        Fast::Inline(payload),
                        id,
                    ) {
                        fused_taken += 1;
                        Ok(())
                    } else {
                        // Not taken: nothing posted; the builder posts (or refuses) it.
                        assert_eq!(a.sq.producer(), b.sq.producer());
                        a.sq.send_inline_general(flags, payload, id)
                    };
                    let rb =
                        b.sq.send(flags)
                            .and_then(|w| w.inline(payload))
                            .map(|w| w.finish(id));
                    if rb.is_ok() {
                        b.sq.ring();
                    }
                    assert_eq!(ra, rb, "round {round} step {step} len {len}");
                }
                3 => {
                    let wr = [SendWr::send_inline(id, &parts, flags)];
                    let ra = a.sq.post_send(&wr);
                    let rb =
                        b.sq.send(flags)
                            .and_then(|w| w.inline(payload))
                            .map(|w| w.finish(id))
                            .map_err(|e| (0, e));
                    if rb.is_ok() {
                        b.sq.ring();
                    }
                    assert_eq!(ra, rb, "round {round} step {step} len {len}");
                }
                _ => {
                    let wr = [SendWr::send(id, &sg, flags)];
                    let ra = a.sq.post_send(&wr);
                    let rb =
                        b.sq.send(flags)
                            .and_then(|w| w.sge(&sg[0]))
                            .map(|w| w.finish(id))
                            .map_err(|e| (0, e));
                    if rb.is_ok() {
                        b.sq.ring();
                    }
                    assert_eq!(ra, rb, "round {round} step {step}");
                }
            }
            let (oa, ob) = (observe(&a), observe(&b));
            assert!(oa.0 == ob.0, "ring bytes, round {round} step {step}");
            assert_eq!(oa.1, ob.1, "SQ record, round {round} step {step}");
            assert!(oa.2 == ob.2, "UAR bytes, round {round} step {step}");
            assert_eq!(
                (oa.3, oa.4, oa.5),
                (ob.3, ob.4, ob.5),
                "round {round} step {step}"
            );
            assert_eq!(oa.6, ob.6, "WR records, round {round} step {step}");
        }
    }
    assert!(fused_taken > 150, "fused path taken {fused_taken} times");
}
