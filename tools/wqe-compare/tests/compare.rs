//! The WQE comparison: the same corpus posted by unmodified libmlx5 (C harness under the
//! preload) and by the `mlx5` crate, both on the emulated ConnectX with WQE recording on.
//! Fails on any difference that is not one of the allowances of `mlx5_wqe_compare::compare`,
//! on any structural mismatch (WQE counts, indices, lengths, doorbell kind), and when the
//! harness cannot be built (naming the package to install).
//!
//! One test per doorbell/UAR configuration ([`Knobs`]), each set identically on both sides.

use std::path::PathBuf;
use std::time::Duration;

use mlx5_wqe_compare::compare::{Allowance, Report, Side, compare};
use mlx5_wqe_compare::corpus::{Corpus, QpSel, RoceRoute, op};
use mlx5_wqe_compare::driver::SideRun;
use mlx5_wqe_compare::{Knobs, driver, harness};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mlx5-wqe-compare-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

fn sides<'a>(theirs: &'a SideRun, ours: &'a SideRun) -> (Side<'a>, Side<'a>) {
    (
        Side {
            name: "libmlx5",
            info: &theirs.info,
            records: &theirs.records,
        },
        Side {
            name: "mlx5 crate",
            info: &ours.info,
            records: &ours.records,
        },
    )
}

/// Run both sides with `knobs` on the standard corpus, compare, check what the corpus must
/// have exercised, and return everything for further checks.
fn run(knobs: Knobs, sq_sig_all: bool) -> (Corpus, SideRun, SideRun, Report) {
    run_with(knobs, sq_sig_all, None)
}

/// [`run`] with a RoCE route in the corpus (`knobs.roce` must say the same).
fn run_with(
    knobs: Knobs,
    sq_sig_all: bool,
    roce: Option<RoceRoute>,
) -> (Corpus, SideRun, SideRun, Report) {
    let dir = scratch(knobs.name);
    let mut corpus = Corpus::standard();
    corpus.sq_sig_all = sq_sig_all;
    corpus.roce = roce;
    if knobs.wr_api {
        // libmlx5's ibv_wr_* path copies an atomic's SGE length into the data segment
        // (ibv_post_send and the mlx5 crate force 8); the device then completes a 16-byte
        // result SGE with a local length error. The verbs rule is one 8-byte SGE: keep to it.
        for wr in corpus.posts.iter_mut().flatten() {
            if matches!(wr.opcode, op::ATOMIC_CMP_AND_SWP | op::ATOMIC_FETCH_AND_ADD) {
                for sge in &mut wr.sges {
                    sge.1 = 8;
                }
            }
        }
    }
    let corpus_file = dir.join("corpus.txt");
    std::fs::write(&corpus_file, corpus.to_text()).expect("write corpus");

    let exe = harness::build(&dir).unwrap_or_else(|e| panic!("{e}"));
    let log = dir.join("theirs.log");
    let run_theirs = || {
        harness::run(&exe, &corpus_file, &log, &knobs, Duration::from_secs(300))
            .unwrap_or_else(|e| panic!("{}: {e}", knobs.name))
    };
    let mut theirs = run_theirs();
    let ours = driver::run(&corpus, &knobs).unwrap_or_else(|e| panic!("{}: {e}", knobs.name));

    // Both drivers must report the geometry of docs/datapath.md §2.2 for the requested caps
    // (so the rings, and every WQE index, line up), and must have posted every WR.
    for sel in QpSel::ALL {
        let (_, wqebbs, max_inline) = sel.geometry();
        for (name, i) in [("libmlx5", &theirs.info), ("mlx5 crate", &ours.info)] {
            let q = i.qp(sel);
            assert_eq!(
                (q.max_inline, q.sq_wqe_cnt, q.posted),
                (max_inline, wqebbs, corpus.wrs(sel).len() as u64),
                "{name} {}: (max_inline_data, SQ WQEBBs, WRs posted)",
                sel.name()
            );
        }
        assert_eq!(
            theirs.info.qp(sel).max_send_wr,
            ours.info.qp(sel).max_send_wr,
            "{}: reported max_send_wr",
            sel.name()
        );
    }

    let mut report = {
        let (t, o) = sides(&theirs, &ours);
        compare(&corpus, t, o)
    };
    // On a loaded machine the emulator sometimes records one of libmlx5's BlueFlame copies as
    // an 8-byte doorbell (the half it sampled held nothing after the doorbell word; the cause
    // is not found yet). Only that exact signature, and nothing else, runs libmlx5's side
    // again, at most twice; any other difference fails at once.
    for _ in 0..2 {
        let misread = "announced by 8-byte doorbell (libmlx5) vs BlueFlame (mlx5 crate)";
        if report.failures.is_empty() || !report.failures.iter().all(|f| f.contains(misread)) {
            break;
        }
        println!(
            "[{}] libmlx5's side run again after {} doorbell/BlueFlame misread(s)",
            knobs.name,
            report.failures.len()
        );
        theirs = run_theirs();
        report = {
            let (t, o) = sides(&theirs, &ours);
            compare(&corpus, t, o)
        };
    }
    println!("[{}]\n{}", knobs.name, report.summary());
    assert!(
        report.failures.is_empty(),
        "[{}]\n{}(corpus, harness and libmlx5's WQE log kept in {})",
        knobs.name,
        report.summary(),
        dir.display()
    );
    if !knobs.wr_api {
        // ibv_post_send clears ctrl.imm of every WQE, like the crate.
        assert!(
            !report.allowed_wqes.contains_key(&Allowance::UnusedImm),
            "{}",
            report.summary()
        );
    }
    // The corpus really exercised what it is meant to: every WR, every opcode, the ring end
    // on both QPs, doorbells and chains (and BlueFlame where possible).
    assert_eq!(
        report.wqes,
        corpus.posts.iter().map(Vec::len).sum::<usize>(),
        "every WR compared"
    );
    assert_eq!(report.opcodes.len(), 8, "{:?}", report.opcodes);
    for qp in ["rc", "ud", "uc"] {
        assert!(
            report.wrapped.get(qp).copied().unwrap_or(0) >= 2,
            "{qp}: WQEs across the ring end: {:?}",
            report.wrapped
        );
    }
    let via = |k: &str| report.via.get(k).copied().unwrap_or(0);
    assert!(via("db") > 0 && via("batch") > 0, "{:?}", report.via);
    if knobs.blueflame_possible() {
        assert!(via("bf") > 0, "no BlueFlame: {:?}", report.via);
    } else {
        assert_eq!(
            via("bf"),
            0,
            "BlueFlame although disabled: {:?}",
            report.via
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    (corpus, theirs, ours, report)
}

#[test]
fn identical_wqes_with_libmlx5_defaults() {
    let (corpus, theirs, ours, _) = run(Knobs::DEFAULT, false);
    // The comparison can fail: one changed bit outside the allowances is reported, exactly
    // once, naming its field.
    let n = ours.records.len();
    assert!(n > 100);
    let send_imm = ours
        .records
        .iter()
        .rposition(|r| r.bytes[3] == 0x0B)
        .expect("a SEND_IMM WQE");
    for (victim, byte, bit, field) in [
        (n / 2, 11, 0x02, "ctrl.signature/stream/fm_ce_se"), // solicited bit
        (n / 3, 3, 0x01, "ctrl.opmod_idx_opcode"),           // opcode
        (send_imm, 12, 0x80, "ctrl.imm"),                    // immediate data
    ] {
        let mut changed = ours.records.clone();
        changed[victim].bytes[byte] ^= bit;
        let mutated = SideRun {
            info: ours.info,
            records: changed,
        };
        let (t, o) = sides(&theirs, &mutated);
        let bad = compare(&corpus, t, o);
        assert_eq!(bad.failures.len(), 1, "{}", bad.summary());
        assert!(bad.failures[0].contains(field), "{}", bad.failures[0]);
    }
}

#[test]
fn identical_wqes_with_dynamic_uars() {
    run(
        Knobs {
            name: "dyn-uar",
            dyn_uar: true,
            ..Knobs::DEFAULT
        },
        false,
    );
}

#[test]
fn identical_wqes_with_prefer_bf_off() {
    run(
        Knobs {
            name: "prefer-bf-off",
            prefer_bf: false,
            ..Knobs::DEFAULT
        },
        false,
    );
}

#[test]
fn identical_wqes_with_shut_up_bf() {
    run(
        Knobs {
            name: "shut-up-bf",
            shut_up_bf: true,
            ..Knobs::DEFAULT
        },
        false,
    );
}

#[test]
fn identical_wqes_without_blueflame_registers() {
    run(
        Knobs {
            name: "no-bf-registers",
            bf_reg_size: 0,
            ..Knobs::DEFAULT
        },
        false,
    );
}

#[test]
fn identical_wqes_with_sq_sig_all() {
    let (_, _, ours, _) = run(
        Knobs {
            name: "sq-sig-all",
            ..Knobs::DEFAULT
        },
        true,
    );
    // Every WQE asks for a CQE (ctrl byte 11, CE = 0x08).
    assert!(ours.records.iter().all(|r| r.bytes[11] & 0x08 != 0));
}

#[test]
fn identical_wqes_with_the_ibv_wr_api() {
    run(
        Knobs {
            name: "ibv-wr-api",
            wr_api: true,
            ..Knobs::DEFAULT
        },
        false,
    );
}

#[test]
fn identical_wqes_with_small_blueflame_registers() {
    // 256-byte registers: 128-byte halves, so WQEs of more than 8 units go by doorbell.
    let (_, theirs, _, _) = run(
        Knobs {
            name: "bf-reg-256",
            bf_reg_size: 256,
            ..Knobs::DEFAULT
        },
        false,
    );
    let big = |v: mlx5_emu::WqeVia| {
        theirs
            .records
            .iter()
            .filter(|r| r.bytes.len() > 128 && r.via == v)
            .count()
    };
    assert_eq!(big(mlx5_emu::WqeVia::BlueFlame), 0);
    assert!(big(mlx5_emu::WqeVia::Doorbell) > 0);
}

#[test]
fn identical_wqes_and_doorbells_when_every_qp_has_its_own_register() {
    // 8 low-latency registers: all 6 QPs get one, so libmlx5 and the crate must choose
    // BlueFlame or doorbell identically for every WQE (no shared-register allowance).
    let (_, _, _, report) = run(
        Knobs {
            name: "low-lat-8",
            low_latency_bfregs: 8,
            ..Knobs::DEFAULT
        },
        false,
    );
    assert!(
        !report
            .allowed_wqes
            .contains_key(&Allowance::SharedBfregNoBlueFlame),
        "{}",
        report.summary()
    );
}

/// RoCE: the corpus's UD WQEs carry libmlx5's RoCE address vector (the kernel's MAC, the UDP
/// source port derived from the corpus's non-zero flow label for a RoCE v2 source GID, 0 for
/// v1, SL in bits 3:1, no GRH bit) and RC/UC run connected by GID. No extra allowance.
fn roce_run(name: &'static str, route: RoceRoute, v2: bool) {
    let (_, theirs, _, _) = run_with(
        Knobs {
            name,
            roce: true,
            ..Knobs::DEFAULT
        },
        false,
        Some(route),
    );
    // What libmlx5 put there (the crate's WQEs are equal to it, checked above): a UD WQE is
    // ctrl (16 bytes) + the 48-byte AV.
    let ud_qpn = theirs.info.qp(QpSel::Ud).qpn;
    let w = &theirs
        .records
        .iter()
        .find(|r| r.qpn == ud_qpn)
        .expect("a UD WQE")
        .bytes;
    let sport = u16::from_be_bytes([w[30], w[31]]);
    let fl = route.flow_label;
    let derived = 0xC000 | ((fl & 0x3FFF) ^ (fl >> 14)) as u16;
    assert_eq!(sport, if v2 { derived } else { 0 }, "rlid: UDP source port");
    assert_eq!(w[28], route.sl << 1, "stat_rate_sl: priority in bits 3:1");
    assert_ne!(w[36..42], [0u8; 6], "rmac from CREATE_AH");
    let grh_gid_fl = u32::from_be_bytes([w[44], w[45], w[46], w[47]]);
    assert_eq!(
        grh_gid_fl,
        (u32::from(route.sgid_index) << 20) | fl,
        "sgid index and flow label, no GRH bit"
    );
    assert_eq!((w[42], w[43]), (route.traffic_class, route.hop_limit));
}

#[test]
fn identical_wqes_on_a_roce_port_with_a_roce_v2_gid() {
    roce_run("roce-v2", RoceRoute::V2, true);
}

#[test]
fn identical_wqes_on_a_roce_port_with_a_roce_v1_gid() {
    roce_run("roce-v1", RoceRoute::V1, false);
}
