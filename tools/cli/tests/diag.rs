//! `mlx5 diag`: hand-written flight-recorder dumps (v1) are parsed, decoded and the error CQE is
//! tied to the WQE it names; garbage and truncated records are named errors, never a panic; the
//! live emulator run shows the forced error from both sides; `decode` and the dump report print
//! the explanation lines.

use std::process::Command;

use mlx5_hw::cqe::{Cqe64, ErrCqe, op_own};
use mlx5_hw::opcodes::{CqeOpcode, SendOpcode, Syndrome, VendorSyndrome, WcStatus};
use mlx5_hw::types::{Be16, Be32};
use mlx5_hw::wqe::{CtrlSeg, DataSeg, FM_CE_SE_CQ_UPDATE, RaddrSeg};
use mlx5_tools::decode::decode_cqe;
use mlx5_tools::diag::{
    Kind, analyze, ctrl_wqe_index, parse_dump, report, report_around, report_json,
};
use zerocopy::IntoBytes;

const QPN: u32 = 0x1c2d;
const CQN: u32 = 0x21;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A one-WQEBB send WQE: SEND, or RDMA_WRITE with a raddr segment.
fn wqe(op: SendOpcode, idx: u16, lkey: u32) -> String {
    let mut b = Vec::new();
    if op == SendOpcode::RDMA_WRITE {
        b.extend_from_slice(CtrlSeg::new(op, 0, idx, QPN, 3, FM_CE_SE_CQ_UPDATE, 0).as_bytes());
        b.extend_from_slice(RaddrSeg::new(0x7000_0000, 0xbeef).as_bytes());
    } else {
        b.extend_from_slice(CtrlSeg::new(op, 0, idx, QPN, 2, FM_CE_SE_CQ_UPDATE, 0).as_bytes());
    }
    b.extend_from_slice(DataSeg::new(64, lkey, 0x10_0000).as_bytes());
    b.resize(64, 0);
    hex(&b)
}

fn ok_cqe(counter: u16) -> String {
    let mut c = Cqe64::zeroed();
    c.op_own = op_own(CqeOpcode::REQ, 0, false, 0);
    c.sop_drop_qpn = Be32::new((u32::from(SendOpcode::SEND.0) << 24) | QPN);
    c.wqe_counter = Be16::new(counter);
    hex(c.as_bytes())
}

fn err_cqe(op: CqeOpcode, counter: u16, syn: Syndrome, ven: u8) -> Vec<u8> {
    let mut e = ErrCqe::zeroed();
    e.op_own = op_own(op, 0, false, 0);
    e.syndrome = syn.0;
    e.vendor_err_synd = ven;
    e.s_wqe_opcode_qpn = Be32::new((u32::from(SendOpcode::RDMA_WRITE.0) << 24) | QPN);
    e.wqe_counter = Be16::new(counter);
    e.as_bytes().to_vec()
}

const QP_LINE: &str = "qp 0x1c2d type RC state ERR sq_wqe_cnt 64 sq_pi 5 sq_ci 5 sq_dbrec 5 rq_wqe_cnt 16 rq_pi 2 rq_ci 0 rq_dbrec 2 outstanding 0";
const CQ_LINE: &str = "cq 0x21 cqe_size 64 cqe_cnt 128 ci 5 dbrec_ci 3";

/// A dump after a REMOTE_ACCESS error on the RDMA WRITE at index 3, with a flush after it.
fn sample_dump() -> String {
    let e = hex(&err_cqe(
        CqeOpcode::REQ_ERR,
        3,
        Syndrome::REMOTE_ACCESS,
        0x88,
    ));
    let f = hex(&err_cqe(CqeOpcode::REQ_ERR, 4, Syndrome::WR_FLUSH, 0xf9));
    format!(
        "# written by a test\n\
         mlx5-flight-recorder v1\n\
         reason error CQE on cq 0x21: REM_ACCESS_ERR\n\
         {QP_LINE}\n\
         {CQ_LINE}\n\
         wqe 0x1c2d 2 1 {}\n\
         wqe 0x1c2d 3 2 {}\n\
         wqe 0x1c2d 4 3 {}\n\
         cqe 0x21 2 4 {}\n\
         cqe 0x21 3 5 {e}\n\
         cqe 0x21 4 6 {f}\n\
         \n\
         futurekind 1 2 3 whatever\n",
        wqe(SendOpcode::SEND, 2, 0x1234),
        wqe(SendOpcode::RDMA_WRITE, 3, 0x1234),
        wqe(SendOpcode::SEND, 4, 0x1234),
        ok_cqe(2),
    )
}

#[test]
fn dump_parses_every_record() {
    let d = parse_dump(&sample_dump()).unwrap();
    assert_eq!(
        d.reason.as_deref(),
        Some("error CQE on cq 0x21: REM_ACCESS_ERR")
    );
    assert_eq!(d.qps.len(), 1);
    let q = &d.qps[0];
    assert_eq!(
        (q.qpn, q.qp_type.as_str(), q.state.as_str()),
        (QPN, "RC", "ERR")
    );
    assert_eq!(
        (q.sq_wqe_cnt, q.sq_pi, q.sq_ci, q.sq_dbrec, q.outstanding),
        (64, 5, 5, 5, 0)
    );
    assert_eq!((q.rq_wqe_cnt, q.rq_pi, q.rq_ci, q.rq_dbrec), (16, 2, 0, 2));
    let c = &d.cqs[0];
    assert_eq!(
        (c.cqn, c.cqe_size, c.cqe_cnt, c.ci, c.dbrec_ci),
        (CQN, 64, 128, 5, 3)
    );
    let kinds: Vec<Kind> = d.entries.iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        [
            Kind::Wqe,
            Kind::Wqe,
            Kind::Wqe,
            Kind::Cqe,
            Kind::Cqe,
            Kind::Cqe
        ]
    );
    assert!(d.entries.iter().all(|e| e.bytes.len() == 64));
    assert_eq!(d.entries[1].seq, 2);
    assert_eq!(ctrl_wqe_index(&d.entries[1].bytes), Some(3));
    // the unknown kind is skipped, by line number (comment, header .. line 13)
    assert_eq!(d.skipped, [13]);
}

#[test]
fn error_cqe_points_to_its_wqe_and_flush_is_not_the_cause() {
    let d = parse_dump(&sample_dump()).unwrap();
    let f = analyze(&d);
    assert_eq!(f.len(), 2, "{f:?}");
    assert_eq!(f[0].syndrome, Syndrome::REMOTE_ACCESS);
    assert_eq!((f[0].qpn, f[0].wqe_counter, f[0].vendor), (QPN, 3, 0x88));
    let w = &d.entries[f[0].wqe.unwrap()];
    assert_eq!((w.kind, w.index, w.seq), (Kind::Wqe, 3, 2));
    assert_eq!(w.bytes[3], SendOpcode::RDMA_WRITE.0);
    assert!(f[1].is_flush());
    assert_eq!(d.entries[f[1].wqe.unwrap()].index, 4);
}

#[test]
fn report_marks_and_explains_the_failing_pair() {
    let d = parse_dump(&sample_dump()).unwrap();
    let r = report(&d);
    let lines: Vec<&str> = r.lines().collect();
    let has = |p: &str| lines.iter().any(|l| l.starts_with(p));
    assert!(has("reason: error CQE on cq 0x21: REM_ACCESS_ERR"), "{r}");
    assert!(has("QP 0x1c2d RC state ERR"), "{r}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("SQ  wqe_cnt 64") && l.contains("pi 5") && l.contains("dbrec 5")),
        "{r}"
    );
    assert!(
        has("  note: doorbell record 3 lags ci 5 by 2"),
        "CQ doorbell lag not noted:\n{r}"
    );
    // the failing WQE and the error CQE are the two marked records, and only they
    let marked: Vec<&&str> = lines.iter().filter(|l| l.starts_with(">>")).collect();
    assert_eq!(marked.len(), 2, "{r}");
    assert!(
        marked[0].starts_with(">>  seq 2 wqe  qp 0x1c2d index 3"),
        "{r}"
    );
    assert!(marked[1].starts_with(">>  seq 5 cqe  cq 0x21 ci 3"), "{r}");
    // the WQE is decoded field by field, the raddr segment included
    assert!(r.contains("RDMA_WRITE"), "{r}");
    assert!(r.contains("rkey") && r.contains("0x0000beef"), "{r}");
    // the CQE too
    assert!(r.contains("REMOTE_ACCESS"), "{r}");
    assert!(
        has(
            "ERROR CQE: cq 0x21 ci 3 seq 5: REQ_ERR on qp 0x1c2d wqe_counter 3: syndrome REMOTE_ACCESS(0x13) vendor_err 0x88 -> REM_ACCESS_ERR"
        ),
        "{r}"
    );
    assert!(has("  points to wqe seq 2 qp 0x1c2d index 3"), "{r}");
    assert!(
        has("  vendor_err 0x88: requester transport: remote-access-error NAK"),
        "{r}"
    );
    assert!(has("error CQE: cq 0x21 ci 4 seq 6: REQ_ERR"), "{r}");
    assert!(has("2 error CQEs, 1 of them flushes"), "{r}");
    // Ranked by the evidence (a dump: the CQE and the WQE, no device view): a remote access
    // error names the responder MR's access flags first, the rkey after.
    assert!(has("causes, most likely first:"), "{r}");
    let first = lines.iter().find(|l| l.starts_with("  1. ")).expect(&r);
    assert!(first.contains("lacks the access flag"), "{first}");
    let second = lines.iter().find(|l| l.starts_with("  2. ")).expect(&r);
    assert!(second.contains("rkey"), "{second}");
    assert!(has("evidence used:"), "{r}");
    assert!(has("  WQE: flight recorder, seq 2: opcode"), "{r}");
    assert!(has("  device: not observable"), "{r}");
    assert!(has("check: "), "{r}");
    assert!(has("meaning: remote access error"), "{r}");
    assert!(
        has("skipped 1 record(s) of unknown kinds (lines [13])"),
        "{r}"
    );
}

#[test]
fn wqe_lookup_takes_the_latest_lap_before_the_cqe() {
    // Index 3 appears twice (two laps of the ring); a third, posted after the CQE, must not be
    // taken either.
    let e = hex(&err_cqe(CqeOpcode::REQ_ERR, 3, Syndrome::LOCAL_PROT, 0x51));
    let text = format!(
        "mlx5-flight-recorder v1\n{QP_LINE}\n{CQ_LINE}\n\
         wqe 0x1c2d 3 10 {}\n\
         wqe 0x1c2d 3 20 {}\n\
         cqe 0x21 9 30 {e}\n\
         wqe 0x1c2d 3 40 {}\n",
        wqe(SendOpcode::SEND, 3, 0x1),
        wqe(SendOpcode::SEND, 3, 0x2),
        wqe(SendOpcode::SEND, 3, 0x3),
    );
    let d = parse_dump(&text).unwrap();
    let f = analyze(&d);
    let w = &d.entries[f[0].wqe.unwrap()];
    assert_eq!(w.seq, 20);
    let r = report(&d);
    assert!(
        r.contains("meaning: local protection error in the gather list, PCIe error (vendor 0x51)"),
        "{r}"
    );
    // A CQE whose WQE has left the recorder's window says so.
    let text = format!("mlx5-flight-recorder v1\n{QP_LINE}\ncqe 0x21 9 30 {e}\n");
    let d = parse_dump(&text).unwrap();
    assert_eq!(analyze(&d)[0].wqe, None);
    assert!(report(&d).contains("is not in the dump"));
}

#[test]
fn responder_error_points_to_the_receive_wqe_in_a_128_byte_cqe() {
    let mut c = vec![0u8; 64];
    c.extend_from_slice(&err_cqe(
        CqeOpcode::RESP_ERR,
        18, // counter 18 on a 16-entry RQ: slot 2
        Syndrome::LOCAL_LENGTH,
        0,
    ));
    let mut rw = DataSeg::new(32, 0x77, 0x2000).as_bytes().to_vec();
    rw.extend_from_slice(DataSeg::new(0, 0x100, 0).as_bytes()); // invalid-lkey terminator
    let text = format!(
        "mlx5-flight-recorder v1\n{QP_LINE}\ncq 0x21 cqe_size 128 cqe_cnt 64 ci 1 dbrec_ci 1\n\
         rwqe 0x1c2d 1 1 {rw1}\n\
         rwqe 0x1c2d 2 2 {rw2}\n\
         cqe 0x21 0 3 {}\n",
        hex(&c),
        rw1 = hex(&rw),
        rw2 = hex(&rw),
    );
    let d = parse_dump(&text).unwrap();
    let f = analyze(&d);
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].opcode, CqeOpcode::RESP_ERR);
    let w = &d.entries[f[0].wqe.unwrap()];
    assert_eq!((w.kind, w.index), (Kind::Rwqe, 2));
    let r = report(&d);
    assert!(
        r.contains("data[0] byte_count 32 lkey 0x00000077 addr 0x0000000000002000"),
        "{r}"
    );
    assert!(r.contains(">>  seq 2 rwqe qp 0x1c2d index 2"), "{r}");
    assert!(r.contains("meaning: local length error"), "{r}");
}

/// Each bad dump gives an error that names its line and what is wrong.
#[test]
fn garbage_and_truncation_are_named_errors() {
    let good_wqe = wqe(SendOpcode::SEND, 0, 1);
    let h = "mlx5-flight-recorder v1";
    let cases: Vec<(String, usize, &str)> = vec![
        (String::new(), 0, "empty dump"),
        ("# only a comment\n".into(), 0, "empty dump"),
        (format!("{QP_LINE}\n"), 1, "not a flight-recorder dump"),
        (
            "mlx5-flight-recorder v2\n".into(),
            1,
            "unsupported dump version \"v2\"",
        ),
        (
            format!("{h}\nwqe 0x1c2d 0 1 {}\n", &good_wqe[..good_wqe.len() - 1]),
            2,
            "wqe hex: truncated hex (127 digits, an odd number)",
        ),
        (
            format!("{h}\nwqe 0x1c2d 0 1 {}\n", &good_wqe[..64]),
            2,
            "wqe: truncated: 32 bytes is not a whole number of 64-byte WQEBBs",
        ),
        (
            format!("{h}\nwqe 0x1c2d 0 1 zz{}\n", &good_wqe[2..]),
            2,
            "wqe hex: bad hex digit 'z' at position 0",
        ),
        (
            format!("{h}\ncqe 0x21 0 1 {}\n", &ok_cqe(0)[..120]),
            2,
            "cqe: truncated: 60 bytes (a CQE has 64 or 128)",
        ),
        (
            format!("{h}\nrwqe 0x1c2d 0 1 {}\n", "00".repeat(20)),
            2,
            "rwqe: truncated: 20 bytes",
        ),
        (
            format!("{h}\nwqe 0x1c2d 0 1\n"),
            2,
            "wqe: expected `wqe <qpn> <index> <seq> <hex>`, got 4 fields",
        ),
        (
            format!("{h}\nwqe 0x1c2d -1 1 {good_wqe}\n"),
            2,
            "wqe index: \"-1\" is not a decimal number",
        ),
        (
            format!("{h}\nwqe 0xzz 0 1 {good_wqe}\n"),
            2,
            "wqe: \"0xzz\" is not a queue number",
        ),
        (
            format!("{h}\nwqe 0x1000000 0 1 {good_wqe}\n"),
            2,
            "does not fit 24 bits",
        ),
        (
            format!("{h}\n{}\n", QP_LINE.replace("sq_pi 5", "sq_pi abc")),
            2,
            "qp sq_pi: \"abc\" is not a decimal number",
        ),
        (
            format!("{h}\n{}\n", QP_LINE.replace(" rq_dbrec 2", "")),
            2,
            "qp: missing field rq_dbrec",
        ),
        (
            format!("{h}\n{} extra\n", QP_LINE),
            2,
            "qp: field \"extra\" has no value",
        ),
        (
            format!("{h}\n{}\n", QP_LINE.replace("state ERR", "state BROKEN")),
            2,
            "qp state: \"BROKEN\" is not a QP state",
        ),
        (
            format!("{h}\n{}\n", QP_LINE.replace("type RC", "type XRC")),
            2,
            "qp type: \"XRC\" is not RC, UC or UD",
        ),
        (
            format!("{h}\n{}\n", CQ_LINE.replace("cqe_size 64", "cqe_size 96")),
            2,
            "cq cqe_size: 96 is not 64 or 128",
        ),
        (
            format!(
                "{h}\n{}\n",
                CQ_LINE.replace("ci 5", "ci 99999999999999999999999")
            ),
            2,
            "cq ci: \"99999999999999999999999\" is not a decimal number",
        ),
        (format!("{h}\nqp\n"), 2, "qp: \"\" is not a queue number"),
    ];
    for (text, line, msg) in cases {
        let e = parse_dump(&text).expect_err(&text);
        assert_eq!(e.line, line, "{text:?}: {e}");
        assert!(e.msg.contains(msg), "{text:?}: got {e:?}, want {msg:?}");
        if line > 0 {
            assert!(e.to_string().starts_with(&format!("line {line}: ")));
        }
    }
}

/// Every prefix of a good dump and a few thousand mutated copies parse or fail with an error;
/// whatever parses also reports. (A panic fails the test.)
#[test]
fn no_panic_on_prefixes_and_mutations() {
    let good = sample_dump();
    let mut ok = 0;
    for cut in 0..=good.len() {
        if let Some(p) = good.get(..cut) {
            if let Ok(d) = parse_dump(p) {
                let _ = report(&d);
                ok += 1;
            }
        }
    }
    assert!(ok > 10);
    let bytes = good.as_bytes();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let alphabet = b"0123456789abcdefxyz \n-#qpcwrex";
    for _ in 0..3000 {
        let mut b = bytes.to_vec();
        for _ in 0..4 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let pos = (x % b.len() as u64) as usize;
            b[pos] = alphabet[((x >> 32) % alphabet.len() as u64) as usize];
        }
        let t = String::from_utf8_lossy(&b);
        if let Ok(d) = parse_dump(&t) {
            let _ = analyze(&d);
            let _ = report(&d);
        }
    }
}

fn mlx5() -> Command {
    Command::new(env!("CARGO_BIN_EXE_mlx5"))
}

/// A file `name` in a directory of its own (tests run in parallel: each removes only its own
/// directory; a shared one removed by one test broke the others).
fn scratch(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("mlx5-diag-test.{}.{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

fn remove_scratch(p: &std::path::Path) {
    let _ = std::fs::remove_dir_all(p.parent().unwrap());
}

#[test]
fn binary_reads_a_dump_file_and_names_bad_lines() {
    let good = scratch("good.dump");
    let p = good.clone();
    std::fs::write(&p, sample_dump()).unwrap();
    let out = mlx5().arg("diag").arg("--dump").arg(&p).output().unwrap();
    let so = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{so}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(so.contains(">>  seq 2 wqe  qp 0x1c2d index 3"), "{so}");
    assert!(
        so.lines()
            .any(|l| l.starts_with("causes, most likely first:")),
        "{so}"
    );

    let p = scratch("bad.dump");
    std::fs::write(&p, "mlx5-flight-recorder v1\ncqe 0x21 0 1 abc\n").unwrap();
    let out = mlx5().arg("diag").arg("--dump").arg(&p).output().unwrap();
    let se = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{se}");
    assert!(
        se.contains("line 2: cqe hex: truncated hex (3 digits"),
        "{se}"
    );
    assert!(!se.contains("panicked"), "{se}");

    let out = mlx5().arg("diag").output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--dump FILE"));
    remove_scratch(&good);
    remove_scratch(&p);
}

#[test]
fn live_emulator_run_shows_the_forced_error_from_both_sides() {
    let (text, f) = mlx5_tools::live::diag_run().unwrap();
    // the bad lkey: requester local protection, vendor 0x50 (gather list, key unknown); the
    // WR after it is flushed
    assert_eq!(f.error.status, WcStatus::LOC_PROT_ERR);
    assert_eq!(f.error.syndrome, Syndrome::LOCAL_PROT);
    assert_eq!(f.error.vendor_err, VendorSyndrome::LOCAL_PROT_KEY);
    // Finding 1: the explanation names the invalid lkey first, never PCIe/IOMMU; it says which
    // evidence it used, the device's failed key check included.
    let first = text
        .lines()
        .find(|l| l.starts_with("  1. "))
        .unwrap_or_else(|| panic!("no ranked causes:\n{text}"));
    assert!(first.contains("an lkey no MR has"), "{first}");
    assert!(
        !text.contains("IOMMU") && !text.contains("PCIe error"),
        "{text}"
    );
    assert!(text.contains("evidence used:"), "{text}");
    assert!(
        text.contains(&format!(
            "  device: requester QP {:#x} check `key` failed: lkey {:#010x} unknown at the requester",
            f.qpn, f.bad_lkey
        )),
        "{text}"
    );
    assert_eq!(f.flushed.len(), 1);
    assert_eq!(f.flushed[0].status, WcStatus::WR_FLUSH_ERR);
    // the device's view: QP in ERR, doorbell record = driver's producer mod 2^16, every WQEBB
    // consumed, every CQE written was consumed by the driver
    assert_eq!(f.device_state, 6);
    assert_eq!(f.device_sq_dbrec, Some(f.driver_sq_pi & 0xFFFF));
    assert_eq!(f.device_sq_head, f.driver_sq_pi);
    assert_eq!(f.driver_sq_pi, 5, "3 good SENDs + 2 one-WQEBB WQEs");
    assert_eq!(f.cq_pi_ci, (5, 5));
    for needle in [
        "driver's view of QP",
        "emulator's view of QP",
        "state ERR",
        "the doorbell record the device reads matches",
        "failing WQE (SQ ring at counter 3), decoded:",
        "wqe_index             : 3",
        "SQ ring around the indices (device consumer 5, driver producer 5):",
        "   counter 2    opcode 0x0a SEND wqe_index 2 ds 2",
    ] {
        assert!(text.contains(needle), "{needle:?} missing:\n{text}");
    }
    assert!(text.lines().any(|l| l.starts_with("causes: ")), "{text}");
    assert!(text.lines().any(|l| l.starts_with("check: ")), "{text}");
    // the marked ring lines: the failing WQE with the bad key, then its CQE as the device
    // wrote it
    let marked: Vec<&str> = text.lines().filter(|l| l.starts_with(">>")).collect();
    assert_eq!(marked.len(), 2, "{text}");
    assert!(
        marked[0].starts_with(">> counter 3    opcode 0x0a SEND wqe_index 3"),
        "{text}"
    );
    assert!(
        marked[0].contains(&format!("lkey {:#010x}", f.bad_lkey)),
        "{text}"
    );
    assert!(
        marked[1].starts_with(
            ">> counter 3    opcode 0xd REQ_ERR wqe_counter 3 syndrome 0x04 LOCAL_PROT vendor 0x50 LOCAL_PROT_KEY"
        ),
        "{text}"
    );
    assert!(
        text.contains("   counter 4    opcode 0xd REQ_ERR wqe_counter 4 syndrome 0x05 WR_FLUSH"),
        "{text}"
    );

    // The reconstructed dump reads back: the error CQE points to the WQE with the bad key.
    let d = parse_dump(&f.dump).unwrap_or_else(|e| panic!("{e}\n{}", f.dump));
    assert_eq!(d.qps[0].qpn, f.qpn);
    assert_eq!(d.qps[0].state, "ERR");
    assert_eq!(d.qps[0].sq_pi, 5);
    assert_eq!(d.qps[0].sq_dbrec, 5);
    let fi = analyze(&d);
    assert_eq!(fi.len(), 2, "{}", f.dump);
    assert_eq!(fi[0].syndrome, Syndrome::LOCAL_PROT);
    let w = &d.entries[fi[0].wqe.unwrap()];
    assert_eq!(w.index, 3);
    assert_eq!(
        u32::from_be_bytes([w.bytes[20], w.bytes[21], w.bytes[22], w.bytes[23]]),
        f.bad_lkey,
        "the data segment's lkey"
    );
    assert!(fi[1].is_flush());
    assert_eq!(d.entries[fi[1].wqe.unwrap()].index, 4);

    // The driver's own flight recorder dumped on the error CQE; diag reads that dump and ties
    // the error CQE to the WQE with the bad key.
    let rd = f
        .recorder_dump
        .as_deref()
        .expect("the driver's recorder took a dump");
    let d = parse_dump(rd).unwrap_or_else(|e| panic!("{e}\n{rd}"));
    assert!(
        d.reason.as_deref().unwrap_or("").contains("LOC_PROT_ERR"),
        "{rd}"
    );
    let fi = analyze(&d);
    let cause = fi.iter().find(|x| !x.is_flush()).expect(rd);
    assert_eq!(cause.syndrome, Syndrome::LOCAL_PROT);
    assert_eq!((cause.qpn, cause.wqe_counter), (f.qpn, 3));
    let w = &d.entries[cause
        .wqe
        .expect("the failing WQE is in the recorder's dump")];
    assert_eq!(ctrl_wqe_index(&w.bytes), Some(3));
    assert_eq!(
        u32::from_be_bytes([w.bytes[20], w.bytes[21], w.bytes[22], w.bytes[23]]),
        f.bad_lkey
    );
    assert!(
        text.contains("the driver's flight recorder dumped on the error CQE"),
        "{text}"
    );
    assert!(
        text.contains("REQ_ERR on qp") && text.contains("points to wqe seq"),
        "{text}"
    );
}

#[test]
fn live_run_saves_a_dump_that_diag_reads_back() {
    let p = scratch("live.dump");
    let out = mlx5()
        .args(["diag", "--emu", "--save"])
        .arg(&p)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains("the driver's flight-recorder dump written to")
    );
    let out = mlx5().arg("diag").arg("--dump").arg(&p).output().unwrap();
    let so = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{so}");
    let marked: Vec<&str> = so.lines().filter(|l| l.starts_with(">>")).collect();
    assert_eq!(marked.len(), 2, "{so}");
    assert!(
        marked[0].contains(" wqe  qp ") && marked[0].contains(" index 3 "),
        "{so}"
    );
    assert!(
        marked[1].contains(" cqe  cq ") && marked[1].contains(" ci 3 "),
        "{so}"
    );
    assert!(so.lines().any(|l| l.starts_with("ERROR CQE: ") && l.contains("LOCAL_PROT(0x04) vendor_err 0x50")), "{so}");
    remove_scratch(&p);
}

#[test]
fn decode_prints_the_explanation_of_an_error_cqe() {
    let b = err_cqe(CqeOpcode::REQ_ERR, 7, Syndrome::TRANSPORT_RETRY_EXC, 0x81);
    let d = decode_cqe(&b, None).unwrap();
    let t = d.to_text();
    let causes = t.lines().find(|l| l.starts_with("causes: ")).expect(&t);
    assert!(causes.contains("RTR/RTS") && causes.contains("GID"), "{t}");
    assert!(
        t.lines()
            .any(|l| l.starts_with("check: ") && l.contains("retry_cnt")),
        "{t}"
    );
    assert!(
        t.contains(
            "vendor_meaning  : requester transport: request timeout, retry counter exceeded"
        ),
        "{t}"
    );
    let j = d.to_json();
    assert!(
        j["explanation"]["causes"]
            .as_str()
            .unwrap()
            .contains("lossy fabric")
    );
    // through the binary, too
    let out = mlx5().args(["decode", "cqe", &hex(&b)]).output().unwrap();
    let so = String::from_utf8_lossy(&out.stdout);
    assert!(so.lines().any(|l| l.starts_with("causes: ")), "{so}");
    // a success CQE has no explanation
    let d = decode_cqe(Cqe64::zeroed().as_bytes(), None).unwrap();
    assert!(d.explanation.is_none());
    assert!(!d.to_text().contains("causes: "));
}

#[test]
fn json_report_carries_the_same_findings() {
    let d = parse_dump(&sample_dump()).unwrap();
    let j = report_json(&d);
    assert_eq!(j["reason"], "error CQE on cq 0x21: REM_ACCESS_ERR");
    assert_eq!(j["qps"][0]["qpn"], QPN);
    assert_eq!(j["qps"][0]["state"], "ERR");
    assert_eq!(j["cqs"][0]["dbrec_ci"], 3);
    let recs = j["records"].as_array().unwrap();
    assert_eq!(recs.len(), 6);
    let marked: Vec<u64> = recs
        .iter()
        .filter(|r| r["marked"] == true)
        .map(|r| r["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(marked, [2, 5]);
    // the decoded WQE carries its fields as mlx5 decode --json does
    let w = &recs[1]["decoded"]["sections"][0]["fields"];
    assert_eq!(w["wqe_index"], 3);
    let f = j["findings"].as_array().unwrap();
    assert_eq!(f.len(), 2);
    assert_eq!(f[0]["syndrome"]["name"], "REMOTE_ACCESS");
    assert_eq!(f[0]["vendor_err"]["value"], 0x88);
    assert_eq!(
        f[0]["vendor_err"]["meaning"],
        "requester transport: remote-access-error NAK"
    );
    assert_eq!(f[0]["status"], "REM_ACCESS_ERR");
    assert_eq!(f[0]["wqe_seq"], 2);
    assert_eq!(f[0]["cause"], true);
    assert_eq!(f[1]["cause"], false);
    assert!(
        j["explanation"]["causes"]
            .as_str()
            .unwrap()
            .contains("rkey")
    );
    assert_eq!(j["skipped_lines"], serde_json::json!([13]));
    // and through the binary
    let p = scratch("json.dump");
    std::fs::write(&p, sample_dump()).unwrap();
    let out = mlx5()
        .args(["diag", "--json", "--dump"])
        .arg(&p)
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v, j);
    remove_scratch(&p);
}

#[test]
fn around_limits_the_records_decoded_to_the_neighbourhood_of_the_error() {
    let d = parse_dump(&sample_dump()).unwrap();
    // seq order: 1 wqe, 2 wqe (marked), 3 wqe, 4 cqe, 5 cqe (marked), 6 cqe
    let heads = |r: &str| -> Vec<u64> {
        r.lines()
            .filter_map(|l| l.get(4..))
            .filter_map(|l| l.strip_prefix("seq "))
            .filter_map(|l| l.split(' ').next()?.parse().ok())
            .collect()
    };
    assert_eq!(heads(&report(&d)), [1, 2, 3, 4, 5, 6]);
    let r = report_around(&d, Some(0));
    assert_eq!(heads(&r), [2, 5]);
    assert!(
        r.contains("(4 records further from the error not shown"),
        "{r}"
    );
    assert_eq!(heads(&report_around(&d, Some(1))), [1, 2, 3, 4, 5, 6]);
    // without an error: the last N
    let text = format!(
        "mlx5-flight-recorder v1\nwqe 0x1c2d 0 1 {}\nwqe 0x1c2d 1 2 {}\ncqe 0x21 0 3 {}\n",
        wqe(SendOpcode::SEND, 0, 0x1234),
        wqe(SendOpcode::SEND, 1, 0x1234),
        ok_cqe(0)
    );
    let d = parse_dump(&text).unwrap();
    assert_eq!(heads(&report_around(&d, Some(2))), [2, 3]);
    // the findings are there whatever is hidden
    let d = parse_dump(&sample_dump()).unwrap();
    assert!(report_around(&d, Some(0)).contains("ERROR CQE: cq 0x21 ci 3 seq 5"));
}

/// A dump alone (no device view): the CQE's vendor syndrome and the WQE rank the causes. Each
/// key fault's code puts its own cause first; a SEND's remote invalid request is its length.
#[test]
fn dump_findings_rank_the_causes_by_the_cqe_and_the_wqe() {
    use mlx5_hw::syndrome::Pointer;
    let first_of = |op: SendOpcode, syn: Syndrome, ven: u8| -> String {
        let e = hex(&err_cqe(CqeOpcode::REQ_ERR, 3, syn, ven));
        let text = format!(
            "mlx5-flight-recorder v1\n{QP_LINE}\n{CQ_LINE}\nwqe 0x1c2d 3 1 {}\ncqe 0x21 3 2 {e}\n",
            wqe(op, 3, 0x1234)
        );
        let r = report(&parse_dump(&text).unwrap());
        r.lines()
            .find_map(|l| l.strip_prefix("  1. "))
            .unwrap_or_else(|| panic!("no ranked cause:\n{r}"))
            .split("  [evidence: ")
            .next()
            .unwrap()
            .to_owned()
    };
    for (ven, p) in [
        (0x50, Pointer::KeyUnknown),
        (0x52, Pointer::PdMismatch),
        (0x53, Pointer::Rights),
        (0x54, Pointer::Range),
        (0x30, Pointer::KeyUnknown),
        (0x32, Pointer::PdMismatch),
        (0x33, Pointer::Rights),
        (0x34, Pointer::Range),
    ] {
        let c = first_of(SendOpcode::SEND, Syndrome::LOCAL_PROT, ven);
        assert!(p.supports(&c), "vendor {ven:#x}: {c}");
        for q in [
            Pointer::KeyUnknown,
            Pointer::PdMismatch,
            Pointer::Rights,
            Pointer::Range,
        ] {
            assert!(q == p || !q.supports(&c), "vendor {ven:#x}: {c} also {q:?}");
        }
    }
    // Remote invalid request: a SEND's is its length; an RDMA WRITE's the QP's access flags.
    let c = first_of(SendOpcode::SEND, Syndrome::REMOTE_INVAL_REQ, 0x8a);
    assert!(Pointer::Length.supports(&c), "{c}");
    let c = first_of(SendOpcode::RDMA_WRITE, Syndrome::REMOTE_INVAL_REQ, 0x8a);
    assert!(c.contains("qp_access_flags"), "{c}");
    // RNR and retry exceeded name the receive and the peer.
    let c = first_of(SendOpcode::SEND, Syndrome::RNR_RETRY_EXC, 0x87);
    assert!(Pointer::NoReceive.supports(&c), "{c}");
    let c = first_of(SendOpcode::SEND, Syndrome::TRANSPORT_RETRY_EXC, 0x81);
    assert!(Pointer::NoAck.supports(&c), "{c}");
    // Vendor 0 (nothing narrows it): the general entry, in the table's order.
    let c = first_of(SendOpcode::SEND, Syndrome::LOCAL_PROT, 0);
    assert!(c.contains("lkey no MR has"), "{c}");
}
