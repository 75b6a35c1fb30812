//! The error-explanation table: every documented syndrome and every named vendor syndrome has an
//! entry, each entry maps to the right `ibv_wc_status`, and look-ups prefer the exact pair.

use mlx5_hw::cqe::{Explanation, explain};
use mlx5_hw::opcodes::{Syndrome, VendorSyndrome, WcStatus};
use mlx5_hw::syndrome::{EXPLANATIONS, explain_syndrome};

/// The PRM / verbs mapping written out independently of `Syndrome::wc_status`.
const EXPECTED_STATUS: &[(u8, u32)] = &[
    (0x01, 1),  // LOC_LEN_ERR
    (0x02, 2),  // LOC_QP_OP_ERR
    (0x04, 4),  // LOC_PROT_ERR
    (0x05, 5),  // WR_FLUSH_ERR
    (0x06, 6),  // MW_BIND_ERR
    (0x10, 7),  // BAD_RESP_ERR
    (0x11, 8),  // LOC_ACCESS_ERR
    (0x12, 9),  // REM_INV_REQ_ERR
    (0x13, 10), // REM_ACCESS_ERR
    (0x14, 11), // REM_OP_ERR
    (0x15, 12), // RETRY_EXC_ERR
    (0x16, 13), // RNR_RETRY_EXC_ERR
    (0x22, 16), // REM_ABORT_ERR
];

#[test]
fn every_documented_syndrome_has_a_general_entry_with_the_right_status() {
    assert_eq!(Syndrome::ALL.len(), EXPECTED_STATUS.len());
    for &(s, st) in EXPECTED_STATUS {
        let x = explain_syndrome(Syndrome(s)).unwrap_or_else(|| panic!("no entry for {s:#04x}"));
        assert_eq!(x.syndrome, Syndrome(s));
        assert_eq!(x.vendor, None);
        assert_eq!(x.status, WcStatus(st), "syndrome {s:#04x}");
        // explain with an unrelated vendor value falls back to the general entry.
        assert_eq!(explain(Syndrome(s), VendorSyndrome(0)), Some(x));
    }
}

#[test]
fn every_named_vendor_syndrome_has_an_entry_paired_with_its_syndrome() {
    for &(v, name, _) in VendorSyndrome::ALL {
        let x = EXPLANATIONS
            .iter()
            .find(|x| x.vendor == Some(v))
            .unwrap_or_else(|| panic!("no entry for vendor syndrome {name}"));
        let got = explain(x.syndrome, v).unwrap();
        assert_eq!(got.vendor, Some(v), "{name}");
        assert_eq!(got.status, x.syndrome.wc_status());
    }
    // And the pairs the emulator produces resolve to the vendor-specific entry.
    for &(s, _, _) in Syndrome::ALL {
        for v in [
            VendorSyndrome::for_syndrome(s),
            VendorSyndrome::for_responder_syndrome(s),
        ] {
            if v.0 != 0 {
                assert_eq!(explain(s, v).unwrap().vendor, Some(v), "{s:?}/{v:?}");
            }
        }
    }
}

#[test]
fn entries_are_complete_and_unique() {
    for (i, x) in EXPLANATIONS.iter().enumerate() {
        assert!(
            x.syndrome.name().is_some(),
            "entry {i} has an unknown syndrome"
        );
        for (k, t) in x.lines() {
            assert!(t.len() > 20, "entry {i} {k} too short: {t:?}");
            assert!(!t.contains('\n'), "entry {i} {k} spans lines");
        }
        for y in &EXPLANATIONS[i + 1..] {
            assert!(
                !(x.syndrome == y.syndrome && x.vendor == y.vendor),
                "duplicate entry {:?}/{:?}",
                x.syndrome,
                x.vendor
            );
        }
    }
}

#[test]
fn transport_retry_says_what_the_issue_asks() {
    let x: &Explanation = explain(Syndrome(0x15), VendorSyndrome(0x81)).unwrap();
    assert_eq!(x.status, WcStatus::RETRY_EXC_ERR);
    for needle in ["peer", "RTR/RTS", "QPN", "GID", "MTU", "timeout", "lossy"] {
        assert!(
            x.causes.contains(needle),
            "causes lacks {needle}: {}",
            x.causes
        );
    }
    let g = explain_syndrome(Syndrome::TRANSPORT_RETRY_EXC).unwrap();
    assert!(g.check.contains("retry_cnt"));
}

#[test]
fn lookups_prefer_the_exact_pair_and_fall_back() {
    // Responder vs requester local protection are told apart by the vendor syndrome.
    let resp = explain(Syndrome::LOCAL_PROT, VendorSyndrome(0x32)).unwrap();
    let req = explain(Syndrome::LOCAL_PROT, VendorSyndrome(0x51)).unwrap();
    assert!(resp.meaning.contains("protection-domain violation"));
    assert!(req.meaning.contains("gather list") && req.meaning.contains("PCIe"));
    // A known vendor syndrome with a different known syndrome: the syndrome's general entry.
    let x = explain(Syndrome::WR_FLUSH, VendorSyndrome(0x81)).unwrap();
    assert_eq!((x.syndrome, x.vendor), (Syndrome::WR_FLUSH, None));
    // Unknown syndrome, known vendor: the vendor's entry; both unknown: None.
    let x = explain(Syndrome(0x77), VendorSyndrome(0x81)).unwrap();
    assert_eq!(x.vendor, Some(VendorSyndrome(0x81)));
    assert_eq!(explain(Syndrome(0x77), VendorSyndrome(0x42)), None);
    assert_eq!(explain(Syndrome(0), VendorSyndrome(0)), None);
    // Every byte pair is answered without a panic.
    for s in 0..=255u8 {
        for v in [0u8, 0x32, 0x51, 0x81, 0xf9, 0xff] {
            let _ = explain(Syndrome(s), VendorSyndrome(v));
        }
    }
}

#[test]
fn vendor_bytes_decode_with_translation_detail_and_rnr_timer() {
    use mlx5_hw::syndrome::vendor_meaning;
    let m = |v: u8| vendor_meaning(VendorSyndrome(v)).unwrap_or_else(|| panic!("{v:#04x}"));
    // memory translation: base + 3-bit detail
    let x = m(0x51);
    assert_eq!(x.unit, "memory translation");
    assert_eq!(x.detail, Some("PCIe error"));
    assert!(x.meaning.contains("gather"));
    assert_eq!(
        x.to_string(),
        "memory translation: gather list or memory bind access error: PCIe error"
    );
    assert_eq!(m(0x32).detail, Some("protection-domain violation"));
    assert!(m(0x32).meaning.contains("data buffer"));
    assert_eq!(m(0x53).detail, Some("access-rights violation"));
    assert_eq!(m(0x54).detail, Some("length violation"));
    assert_eq!(m(0xC7).detail, Some("internal translation error"));
    // receiver-not-ready NAKs carry the timer
    for (v, t) in [(0xA0u8, 0u8), (0xA5, 5), (0xBF, 31)] {
        assert_eq!(m(v).rnr_timer, Some(t));
        assert!(m(v).to_string().ends_with(&format!("(RNR timer code {t})")));
    }
    // plain codes
    assert!(m(0x81).meaning.contains("retry counter exceeded"));
    assert!(m(0x87).meaning.contains("receiver-not-ready"));
    assert!(m(0x88).meaning.contains("remote-access"));
    assert!(m(0x8A).meaning.contains("invalid-request"));
    assert!(m(0x93).meaning.contains("page fault"));
    assert!(m(0xF9).meaning.contains("flushed"));
    assert!(m(0x68).meaning.contains("invalid WQE format"));
    // every vendor syndrome this crate names decodes
    for &(v, name, _) in VendorSyndrome::ALL {
        assert!(vendor_meaning(v).is_some(), "{name}");
    }
    // gaps in the published table stay unknown; every byte is answered without a panic
    for v in [
        0x01u8,
        0x0F,
        0x46,
        0x4E,
        0x5C,
        0x8F + 0x50,
        0xE1,
        0xE6,
        0xEF,
    ] {
        assert_eq!(vendor_meaning(VendorSyndrome(v)), None, "{v:#04x}");
    }
    let known = (0..=255u8)
        .filter(|&v| vendor_meaning(VendorSyndrome(v)).is_some())
        .count();
    // 11 translation groups of 8, 32 RNR NAK codes, 100 single codes (0x00 included)
    assert_eq!(known, 11 * 8 + 32 + 100);
}

#[test]
fn causes_rank_by_the_evidence_and_keep_the_rest_in_order() {
    use mlx5_hw::syndrome::{MAX_CAUSES, Pointer, rank_causes};
    let x = explain(Syndrome::REMOTE_ACCESS, VendorSyndrome(0x88)).unwrap();
    let plain: Vec<&str> = x.causes.split("; ").collect();
    // No evidence: the table's order, nothing marked.
    let r = rank_causes(x, &[]);
    assert_eq!(r.iter().map(|c| c.0).collect::<Vec<_>>(), plain);
    assert!(r.iter().all(|c| c.1.is_none()));
    // The table names the responder MR's access flags first.
    assert!(plain[0].contains("access flag"), "{plain:?}");
    // An unknown key, then range: those first, in the evidence's order; the rest after, in
    // the table's order; every cause kept once.
    let r = rank_causes(x, &[Pointer::KeyUnknown, Pointer::Range]);
    let got: Vec<_> = r.iter().collect();
    assert_eq!(got.len(), plain.len());
    assert_eq!(got[0].1, Some(Pointer::KeyUnknown), "{got:?}");
    assert!(got[0].0.contains("no MR has"), "{got:?}");
    assert_eq!(got[1].1, Some(Pointer::Range), "{got:?}");
    assert!(got[2..].iter().all(|c| c.1.is_none()), "{got:?}");
    for c in &plain {
        assert_eq!(got.iter().filter(|g| g.0 == *c).count(), 1, "{c}");
    }
    assert!(r.len() <= MAX_CAUSES && !r.is_empty());
    // Every entry ranks without a panic, whatever the evidence.
    let all = [
        Pointer::KeyUnknown,
        Pointer::PdMismatch,
        Pointer::Rights,
        Pointer::Range,
        Pointer::Length,
        Pointer::NoReceive,
        Pointer::NoAck,
    ];
    for e in EXPLANATIONS {
        let r = rank_causes(e, &all);
        assert_eq!(r.len(), e.causes.split("; ").count().min(MAX_CAUSES));
    }
}

#[test]
fn vendor_codes_point_at_their_check() {
    use mlx5_hw::syndrome::Pointer;
    let p = |s: Syndrome, v: u8| Pointer::from_vendor(s, VendorSyndrome(v));
    for (base, s) in [(0x50, Syndrome::LOCAL_PROT), (0x30, Syndrome::LOCAL_PROT)] {
        assert_eq!(p(s, base), Some(Pointer::KeyUnknown));
        assert_eq!(p(s, base | 1), None, "PCIe error: no key check");
        assert_eq!(p(s, base | 2), Some(Pointer::PdMismatch));
        assert_eq!(p(s, base | 3), Some(Pointer::Rights));
        assert_eq!(p(s, base | 4), Some(Pointer::Range));
    }
    // A memory-translation-looking byte with another syndrome is not a key check.
    assert_eq!(p(Syndrome::REMOTE_ACCESS, 0x52), None);
    assert_eq!(p(Syndrome::RNR_RETRY_EXC, 0x87), Some(Pointer::NoReceive));
    assert_eq!(p(Syndrome::TRANSPORT_RETRY_EXC, 0x81), Some(Pointer::NoAck));
    for c in [
        "key",
        "PD",
        "rights",
        "range",
        "length",
        "receive WQE",
        "ACK",
    ] {
        assert!(Pointer::from_check(c).is_some(), "{c}");
    }
    assert_eq!(Pointer::from_check("QP type and state"), None);
    // Every new code has its own entry, which names its cause first.
    for (v, ptr) in [
        (0x50, Pointer::KeyUnknown),
        (0x52, Pointer::PdMismatch),
        (0x53, Pointer::Rights),
        (0x54, Pointer::Range),
        (0x30, Pointer::KeyUnknown),
        (0x32, Pointer::PdMismatch),
        (0x33, Pointer::Rights),
        (0x34, Pointer::Range),
    ] {
        let x = explain(Syndrome::LOCAL_PROT, VendorSyndrome(v)).unwrap();
        assert_eq!(x.vendor, Some(VendorSyndrome(v)));
        let first = x.causes.split("; ").next().unwrap();
        assert!(ptr.supports(first), "{v:#x}: {first}");
    }
}
