//! The key checks name their cause: each failing check (key unknown, PD mismatch, access
//! rights, range) gives its own vendor syndrome -- gather list 0x50 + detail at the
//! requester, data buffer 0x30 + detail for a receive -- and the device's view
//! (`Emulator::failed_checks`) says which check failed with the values it compared; a remote
//! key refused by the responder is NAKed (the requester's code is 0x88 whatever the check)
//! and the responder records which check it was.

mod common;

use common::*;
use mlx5_hw::opcodes::{SendOpcode, Syndrome};
use mlx5_hw::wqe::{DataSeg, FM_CE_SE_CQ_UPDATE, RaddrSeg};
use zerocopy::IntoBytes;

const SIG: u8 = FM_CE_SE_CQ_UPDATE;
const LOCAL_WRITE: u32 = 1;
const REMOTE_WRITE: u32 = 2;
const REMOTE_READ: u32 = 4;

fn dseg(len: u32, lkey: u32, addr: u64) -> Vec<u8> {
    DataSeg::new(len, lkey, addr).as_bytes().to_vec()
}

/// The last failed check of QP `qpn` on `side`.
fn last_check(p: &Pair, side: &str, qpn: u32) -> mlx5_emu::FailedCheck {
    p.emu
        .failed_checks()
        .into_iter()
        .rev()
        .find(|c| c.side == side && c.qpn == qpn)
        .unwrap_or_else(|| panic!("no {side} check of {qpn:#x}: {:?}", p.emu.failed_checks()))
}

#[test]
fn requester_gather_faults_have_their_own_vendor_syndromes() {
    // key unknown: 0x50
    let mut p = pair(RC, Knobs::default());
    let bad = p.ma.1 ^ 0x0001_0000;
    p.send(SendOpcode::SEND, SIG, [0; 4], &dseg(8, bad, p.ma.0.addr()));
    let ca = drain(&mut p.cqa);
    assert_eq!(
        (ca[0].syndrome, ca[0].vendor),
        (Syndrome::LOCAL_PROT.0, 0x50)
    );
    let c = last_check(&p, "requester", p.qa.qpn);
    assert_eq!(c.check, "key");
    assert!(
        c.detail
            .starts_with(&format!("lkey {bad:#010x} unknown at the requester")),
        "{c:?}"
    );

    // PD mismatch: an MR of another PD on the same buffer: 0x52
    let mut p = pair(RC, Knobs::default());
    let pd2 = p.a.alloc_pd();
    let (_, l2, _) = p.a.reg_mr(pd2, p.ma.0.addr(), 4096, LOCAL_WRITE).unwrap();
    p.send(SendOpcode::SEND, SIG, [0; 4], &dseg(8, l2, p.ma.0.addr()));
    let ca = drain(&mut p.cqa);
    assert_eq!(
        (ca[0].syndrome, ca[0].vendor),
        (Syndrome::LOCAL_PROT.0, 0x52)
    );
    let c = last_check(&p, "requester", p.qa.qpn);
    assert_eq!(c.check, "PD");
    // The device's PD numbers (not the handles): two of them, and they differ.
    let pd_of = |after: &str| {
        c.detail
            .split(after)
            .nth(1)
            .and_then(|t| {
                t.split(|ch: char| !ch.is_ascii_hexdigit() && ch != 'x')
                    .next()
            })
            .map(str::to_owned)
    };
    let (mr_pd, qp_pd) = (pd_of("is an MR of PD "), pd_of("the QP's PD is "));
    assert!(
        mr_pd.is_some() && qp_pd.is_some() && mr_pd != qp_pd,
        "{c:?}"
    );
    let _ = pd2;

    // range: 8 bytes running past the MR's end: 0x54
    let mut p = pair(RC, Knobs::default());
    let end = p.ma.0.addr() + p.ma.0.len as u64;
    p.send(SendOpcode::SEND, SIG, [0; 4], &dseg(8, p.ma.1, end - 4));
    let ca = drain(&mut p.cqa);
    assert_eq!(
        (ca[0].syndrome, ca[0].vendor),
        (Syndrome::LOCAL_PROT.0, 0x54)
    );
    let c = last_check(&p, "requester", p.qa.qpn);
    assert_eq!(c.check, "range");
    assert!(
        c.detail.contains(&format!(
            "addr+len {:#x} beyond the MR's end {end:#x}",
            end + 4
        )),
        "{c:?}"
    );

    // rights: a READ whose destination MR lacks LOCAL_WRITE: 0x53
    let mut p = pair(RC, Knobs::default());
    let (_, ro, _) = p.a.reg_mr(p.pda, p.ma.0.addr(), 4096, 0).unwrap();
    let segs = [
        RaddrSeg::new(p.mb.0.addr(), p.mb.2).as_bytes(),
        &dseg(8, ro, p.ma.0.addr()),
    ]
    .concat();
    p.send(SendOpcode::RDMA_READ, SIG, [0; 4], &segs);
    let ca = drain(&mut p.cqa);
    assert_eq!(
        (ca[0].syndrome, ca[0].vendor),
        (Syndrome::LOCAL_PROT.0, 0x53)
    );
    let c = last_check(&p, "requester", p.qa.qpn);
    assert_eq!(c.check, "rights");
    assert!(
        c.detail.contains("lacks LOCAL_WRITE (access flags: none)"),
        "{c:?}"
    );
}

#[test]
fn receive_faults_have_their_own_vendor_syndromes() {
    let send8 = |p: &mut Pair| {
        let (a, l) = (p.ma.0.addr(), p.ma.1);
        p.send(SendOpcode::SEND, SIG, [0; 4], &dseg(8, l, a));
    };
    // key unknown: 0x30
    let mut p = pair(RC, Knobs::default());
    p.qb.post_recv(&[(p.mb.0.addr(), 64, p.mb.1 ^ 0x0001_0000)]);
    send8(&mut p);
    let cb = drain(&mut p.cqb);
    assert_eq!(
        (cb[0].syndrome, cb[0].vendor),
        (Syndrome::LOCAL_PROT.0, 0x30)
    );
    assert_eq!(last_check(&p, "responder", p.qb.qpn).check, "key");
    // PD: 0x32
    let mut p = pair(RC, Knobs::default());
    let pd2 = p.b.alloc_pd();
    let (_, l2, _) = p.b.reg_mr(pd2, p.mb.0.addr(), 4096, LOCAL_WRITE).unwrap();
    p.qb.post_recv(&[(p.mb.0.addr(), 64, l2)]);
    send8(&mut p);
    let cb = drain(&mut p.cqb);
    assert_eq!(
        (cb[0].syndrome, cb[0].vendor),
        (Syndrome::LOCAL_PROT.0, 0x32)
    );
    assert_eq!(last_check(&p, "responder", p.qb.qpn).check, "PD");
    // rights (no LOCAL_WRITE): 0x33
    let mut p = pair(RC, Knobs::default());
    let (_, ro, _) = p.b.reg_mr(p.pdb, p.mb.0.addr(), 4096, 0).unwrap();
    p.qb.post_recv(&[(p.mb.0.addr(), 64, ro)]);
    send8(&mut p);
    let cb = drain(&mut p.cqb);
    assert_eq!(
        (cb[0].syndrome, cb[0].vendor),
        (Syndrome::LOCAL_PROT.0, 0x33)
    );
    assert_eq!(last_check(&p, "responder", p.qb.qpn).check, "rights");
    // range: 0x34
    let mut p = pair(RC, Knobs::default());
    let end = p.mb.0.addr() + p.mb.0.len as u64;
    p.qb.post_recv(&[(end - 32, 64, p.mb.1)]);
    send8(&mut p);
    let cb = drain(&mut p.cqb);
    assert_eq!(
        (cb[0].syndrome, cb[0].vendor),
        (Syndrome::LOCAL_PROT.0, 0x34)
    );
    assert_eq!(last_check(&p, "responder", p.qb.qpn).check, "range");
}

#[test]
fn the_responder_records_which_remote_check_failed() {
    // (rkey, addr, MR access) -> the check the responder names, and a word of its detail.
    let cases: [(&str, &str); 4] = [
        ("key", "unknown at the responder"),
        ("PD", "PD mismatch at the responder"),
        (
            "rights",
            "lacks REMOTE_WRITE (access flags: LOCAL_WRITE|REMOTE_READ)",
        ),
        ("range", "beyond the MR's end"),
    ];
    for (check, needle) in cases {
        let mut p = pair(RC, Knobs::default());
        let (rkey, addr) = match check {
            "key" => (p.mb.2 ^ 0x0001_0000, p.mb.0.addr()),
            "PD" => {
                let pd2 = p.b.alloc_pd();
                let (_, _, r) =
                    p.b.reg_mr(pd2, p.mb.0.addr(), 4096, LOCAL_WRITE | REMOTE_WRITE)
                        .unwrap();
                (r, p.mb.0.addr())
            }
            "rights" => {
                let (_, _, r) =
                    p.b.reg_mr(p.pdb, p.mb.0.addr(), 4096, LOCAL_WRITE | REMOTE_READ)
                        .unwrap();
                (r, p.mb.0.addr())
            }
            _ => (p.mb.2, p.mb.0.addr() + p.mb.0.len as u64 - 4),
        };
        let segs = [
            RaddrSeg::new(addr, rkey).as_bytes(),
            &dseg(8, p.ma.1, p.ma.0.addr()),
        ]
        .concat();
        p.send(SendOpcode::RDMA_WRITE, SIG, [0; 4], &segs);
        let ca = drain(&mut p.cqa);
        assert_eq!(
            (ca[0].syndrome, ca[0].vendor),
            (Syndrome::REMOTE_ACCESS.0, 0x88),
            "{check}"
        );
        let c = last_check(&p, "responder", p.qb.qpn);
        assert_eq!(c.check, check, "{c:?}");
        assert!(c.detail.starts_with("WRITE "), "{c:?}");
        assert!(c.detail.contains(needle), "{check}: {c:?}");
        assert!(c.detail.contains(&format!("{rkey:#010x}")), "{c:?}");
    }
}
