//! `mlx5 decode`: golden decodes of WQEs and CQEs built with the `mlx5-hw` encoders, input
//! forms, exit statuses, and garbage input through the binary.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use mlx5_hw::cqe::{Cqe64, ErrCqe, op_own};
use mlx5_hw::opcodes::{
    CqeOpcode, OPMOD_MASKED_ATOMIC_4B, OPMOD_MASKED_ATOMIC_8B, SendOpcode, Syndrome,
    VendorSyndrome, WcStatus,
};
use mlx5_hw::types::{Be16, Be32, Be64};
use mlx5_hw::wqe::{
    AtomicSeg, CtrlSeg, DataSeg, DatagramSeg, FM_CE_SE_CQ_UPDATE, FM_CE_SE_FENCE,
    FM_CE_SE_SOLICITED, InlineHdr, MaskedCs64Seg, MaskedFa32Seg, RaddrSeg,
};
use mlx5_tools::decode::{
    Decoded, EXIT_INPUT_ERROR, EXIT_OK, EXIT_WARNINGS, WqeOptions, decode_cqe, decode_wqe,
};
use serde_json::{Value, json};
use zerocopy::IntoBytes;

const QPN: u32 = 0x00_1c2d;

fn wqe(segs: &[&[u8]]) -> Vec<u8> {
    segs.concat()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn rc(b: &[u8]) -> Decoded {
    decode_wqe(b, WqeOptions::default()).expect("decodes")
}

/// The `name` of an enum-valued field.
fn name<'a>(d: &'a Decoded, sec: &str, field: &str) -> &'a str {
    d.value(sec, field)
        .and_then(|v| v.get("name"))
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("{sec}.{field} missing in\n{}", d.to_text()))
}

fn num(d: &Decoded, sec: &str, field: &str) -> u64 {
    let v = d
        .value(sec, field)
        .unwrap_or_else(|| panic!("{sec}.{field} missing in\n{}", d.to_text()));
    v.as_u64()
        .or_else(|| v.get("value").and_then(Value::as_u64))
        .unwrap_or_else(|| panic!("{sec}.{field} = {v} is not a number"))
}

fn names(d: &Decoded) -> Vec<&str> {
    d.sections.iter().map(|s| s.name.as_str()).collect()
}

#[test]
fn send_one_sge_golden() {
    let ctrl = CtrlSeg::new(SendOpcode::SEND, 0, 7, QPN, 2, FM_CE_SE_CQ_UPDATE, 0);
    let data = DataSeg::new(4096, 0x1234, 0x7f00_0000_1000);
    let b = wqe(&[ctrl.as_bytes(), data.as_bytes()]);
    let d = rc(&b);
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    assert_eq!(d.exit_code(), EXIT_OK);
    let golden = "\
WQE (32 bytes)
ctrl @ 0x0000
  opcode                : 0x0a SEND
  opmod                 : 0x00
  wqe_index             : 7
  qpn                   : 0x001c2d
  ds                    : 2
  wqe_bytes             : 32
  wqebbs                : 1
  signature             : 0x00
  dci_stream_channel_id : 0x0000
  fm_ce_se              : 0x08
  fence_mode            : 0x0 none
  ce                    : 0x2 CQ_UPDATE: always generate a CQE (signaled)
  cq_update             : yes
  solicited             : no
  imm                   : 0x00000000
data[0] @ 0x0010
  byte_count : 4096
  lkey       : 0x00001234
  addr       : 0x00007f0000001000
";
    assert_eq!(d.to_text(), golden);
}

#[test]
fn send_imm_inline() {
    let payload = b"hello, inline world!"; // 20 bytes: 4 + 20 = 24 -> 2 DS
    let ctrl = CtrlSeg::new(
        SendOpcode::SEND_IMM,
        0,
        1,
        QPN,
        3,
        FM_CE_SE_CQ_UPDATE | FM_CE_SE_SOLICITED,
        0xdead_beef,
    );
    let mut inl = InlineHdr::new(payload.len() as u32).as_bytes().to_vec();
    inl.extend_from_slice(payload);
    inl.resize(32, 0);
    let b = wqe(&[ctrl.as_bytes(), &inl]);
    let d = rc(&b);
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    assert_eq!(name(&d, "ctrl", "opcode"), "SEND_IMM");
    assert_eq!(num(&d, "ctrl", "immediate"), 0xdead_beef);
    assert_eq!(d.value("ctrl", "solicited"), Some(&json!(true)));
    assert_eq!(names(&d), ["ctrl", "inline"]);
    assert_eq!(num(&d, "inline", "byte_count"), 20);
    assert_eq!(num(&d, "inline", "ds"), 2);
    assert_eq!(d.value("inline", "data"), Some(&json!(hex(payload))));
    assert!(
        d.text("inline", "data")
            .unwrap()
            .contains("|hello, inline wo|")
    );
}

#[test]
fn rdma_write_and_read() {
    for (op, name_) in [
        (SendOpcode::RDMA_WRITE, "RDMA_WRITE"),
        (SendOpcode::RDMA_READ, "RDMA_READ"),
    ] {
        let ctrl = CtrlSeg::new(op, 0, 0xfffe, QPN, 3, FM_CE_SE_FENCE, 0);
        let r = RaddrSeg::new(0x5555_0000_2000, 0xabcd);
        let data = DataSeg::new(64, 0x42, 0x1000);
        let b = wqe(&[ctrl.as_bytes(), r.as_bytes(), data.as_bytes()]);
        let d = rc(&b);
        assert!(d.warnings.is_empty(), "{:?}", d.warnings);
        assert_eq!(name(&d, "ctrl", "opcode"), name_);
        assert_eq!(num(&d, "ctrl", "wqe_index"), 0xfffe);
        assert_eq!(num(&d, "ctrl", "fence_mode"), 4);
        assert_eq!(name(&d, "ctrl", "fence_mode"), "small fence and fence");
        assert_eq!(d.value("ctrl", "cq_update"), Some(&json!(false)));
        assert_eq!(names(&d), ["ctrl", "raddr", "data[0]"]);
        assert_eq!(num(&d, "raddr", "raddr"), 0x5555_0000_2000);
        assert_eq!(num(&d, "raddr", "rkey"), 0xabcd);
        assert_eq!(num(&d, "data[0]", "byte_count"), 64);
        assert_eq!(num(&d, "data[0]", "addr"), 0x1000);
    }
}

#[test]
fn atomics_cs_and_fa() {
    let r = RaddrSeg::new(0x8000, 7);
    let res = DataSeg::new(8, 0x99, 0x2000);
    let cs = wqe(&[
        CtrlSeg::new(SendOpcode::ATOMIC_CS, 0, 3, QPN, 4, FM_CE_SE_CQ_UPDATE, 0).as_bytes(),
        r.as_bytes(),
        AtomicSeg::new(0x1111, 0x2222).as_bytes(),
        res.as_bytes(),
    ]);
    let d = rc(&cs);
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    assert_eq!(names(&d), ["ctrl", "raddr", "atomic", "data[0]"]);
    assert_eq!(name(&d, "ctrl", "opcode"), "ATOMIC_CS");
    assert_eq!(num(&d, "atomic", "swap"), 0x1111);
    assert_eq!(num(&d, "atomic", "compare"), 0x2222);

    let fa = wqe(&[
        CtrlSeg::new(SendOpcode::ATOMIC_FA, 0, 3, QPN, 4, FM_CE_SE_CQ_UPDATE, 0).as_bytes(),
        r.as_bytes(),
        AtomicSeg::new(5, 0).as_bytes(),
        DataSeg::new(16, 0x99, 0x2000).as_bytes(),
    ]);
    let d = rc(&fa);
    assert_eq!(name(&d, "ctrl", "opcode"), "ATOMIC_FA");
    assert_eq!(num(&d, "atomic", "add"), 5);
    // A result segment that is not 8 bytes is flagged.
    assert_eq!(d.warnings.len(), 1, "{:?}", d.warnings);
    assert!(d.warnings[0].contains("expected 8"));
}

#[test]
fn ud_send_with_address_vector() {
    let mut av = DatagramSeg::zeroed();
    av.set_qkey(0x1111_2222);
    av.set_dqpn(0xab_cdef);
    av.stat_rate_sl = 0x05;
    av.rlid = Be16::new(0x0017);
    av.rmac = [0x02, 0x11, 0x22, 0x33, 0x44, 0x55];
    av.grh_gid_fl = Be32::new((1 << 30) | (3 << 20) | 0x12345);
    av.hop_limit = 64;
    av.rgid = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    let ctrl = CtrlSeg::new(SendOpcode::SEND, 0, 9, QPN, 5, FM_CE_SE_CQ_UPDATE, 0);
    let data = DataSeg::new(100, 0x77, 0x3000);
    let b = wqe(&[ctrl.as_bytes(), av.as_bytes(), data.as_bytes()]);

    let d = decode_wqe(&b, WqeOptions { ud: true }).unwrap();
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    assert_eq!(names(&d), ["ctrl", "av", "data[0]"]);
    assert_eq!(num(&d, "av", "dqpn"), 0xab_cdef);
    assert_eq!(num(&d, "av", "qkey"), 0x1111_2222);
    assert_eq!(num(&d, "av", "rlid"), 0x17);
    assert_eq!(num(&d, "av", "sl"), 5);
    assert_eq!(d.value("av", "grh"), Some(&json!(true)));
    assert_eq!(d.value("av", "extended_av"), Some(&json!(true)));
    assert_eq!(num(&d, "av", "sgid_index"), 3);
    assert_eq!(num(&d, "av", "flow_label"), 0x12345);
    assert_eq!(d.text("av", "rmac"), Some("02:11:22:33:44:55"));
    assert_eq!(d.text("av", "rgid"), Some("fe80::1"));
    assert_eq!(num(&d, "data[0]", "byte_count"), 100);

    // Without --ud the same bytes read as data segments: the AV's words are not an SGE list,
    // which shows as four "data" sections instead of one.
    let d = rc(&b);
    assert!(d.section("av").is_none());
}

#[test]
fn wqe_inconsistencies_are_warnings() {
    // DS says 3 (48 bytes) but only 32 given: the raddr is there, the data segment is not.
    let ctrl = CtrlSeg::new(SendOpcode::RDMA_WRITE, 0, 0, QPN, 3, 0, 0);
    let b = wqe(&[ctrl.as_bytes(), RaddrSeg::new(1, 2).as_bytes()]);
    let d = rc(&b);
    assert_eq!(d.exit_code(), EXIT_WARNINGS);
    assert!(
        d.warnings
            .iter()
            .any(|w| w.contains("ds = 3 means 48 bytes"))
    );

    // RDMA READ with ds = 1: the raddr segment lies past the WQE.
    let b = CtrlSeg::new(SendOpcode::RDMA_READ, 0, 0, QPN, 1, 0, 0)
        .as_bytes()
        .to_vec();
    let d = rc(&b);
    assert!(
        d.warnings
            .iter()
            .any(|w| w.contains("remote address segment"))
    );

    // Inline length 100 in a 2-DS WQE.
    let mut b = CtrlSeg::new(SendOpcode::SEND, 0, 0, QPN, 2, 0, 0)
        .as_bytes()
        .to_vec();
    b.extend_from_slice(InlineHdr::new(100).as_bytes());
    b.resize(32, 0xaa);
    let d = rc(&b);
    assert!(
        d.warnings.iter().any(|w| w.contains("inline length 100")),
        "{:?}",
        d.warnings
    );
    assert_eq!(d.value("inline", "data"), Some(&json!("aa".repeat(12))));

    // ds = 0, and fewer than 16 bytes is an error.
    let b = CtrlSeg::new(SendOpcode::SEND, 0, 0, QPN, 0, 0, 0);
    assert!(
        rc(b.as_bytes())
            .warnings
            .iter()
            .any(|w| w.contains("ds is 0"))
    );
    assert!(decode_wqe(&[0; 15], WqeOptions::default()).is_err());
}

fn cqe_bytes(c: &Cqe64) -> Vec<u8> {
    c.as_bytes().to_vec()
}

#[test]
fn cqe_req() {
    let mut c = Cqe64::zeroed();
    c.op_own = op_own(CqeOpcode::REQ, 0, false, 1);
    c.sop_drop_qpn = Be32::new((u32::from(SendOpcode::RDMA_WRITE.0) << 24) | QPN);
    c.wqe_counter = Be16::new(42);
    c.byte_cnt = Be32::new(4096);
    c.timestamp = Be64::new(0x0123_4567_89ab);
    let d = decode_cqe(&cqe_bytes(&c), None).unwrap();
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    assert_eq!(name(&d, "cqe", "opcode"), "REQ");
    assert_eq!(name(&d, "cqe", "send_opcode"), "RDMA_WRITE");
    assert_eq!(num(&d, "cqe", "owner"), 1);
    assert_eq!(num(&d, "cqe", "qpn"), u64::from(QPN));
    assert_eq!(num(&d, "cqe", "wqe_counter"), 42);
    assert_eq!(num(&d, "cqe", "byte_cnt"), 4096);
    assert_eq!(num(&d, "cqe", "timestamp"), 0x0123_4567_89ab);
    assert_eq!(name(&d, "cqe", "format"), "normal");
    // Requester CQEs carry no source QP.
    assert!(d.value("cqe", "src_qp").is_none());
}

#[test]
fn cqe_resp_send_imm_128() {
    let mut c = Cqe64::zeroed();
    c.op_own = op_own(CqeOpcode::RESP_SEND_IMM, 0, true, 0);
    c.sop_drop_qpn = Be32::new(QPN);
    c.flags_rqpn = Be32::new((1 << 28) | (0x3 << 24) | 0x00_0777);
    c.l4_hdr_type_etc = 2 << 2;
    c.imm_inval_pkey = Be32::new(0xcafe_f00d);
    c.byte_cnt = Be32::new(1000);
    c.srqn_uidx = Be32::new(0x55);
    let mut b = vec![0u8; 64];
    b.extend_from_slice(c.as_bytes());
    let d = decode_cqe(&b, None).unwrap();
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    assert_eq!(num(&d, "cqe", "cqe_size"), 128);
    assert_eq!(d.section("cqe").unwrap().offset, 64);
    assert_eq!(name(&d, "cqe", "opcode"), "RESP_SEND_IMM");
    assert_eq!(num(&d, "cqe", "immediate"), 0xcafe_f00d);
    assert_eq!(num(&d, "cqe", "src_qp"), 0x777);
    assert_eq!(num(&d, "cqe", "sl"), 3);
    assert_eq!(d.value("cqe", "grh"), Some(&json!(true)));
    assert_eq!(name(&d, "cqe", "l3_hdr_type"), "IPv4");
    assert_eq!(d.value("cqe", "solicited"), Some(&json!(true)));
    assert_eq!(num(&d, "cqe", "srqn_uidx"), 0x55);
    // The same 128 bytes read as a 64-byte CQE: the all-zero first half is a REQ with a warning.
    let d = decode_cqe(&b, Some(64)).unwrap();
    assert!(
        d.warnings
            .iter()
            .any(|w| w.contains("128 bytes given for a 64-byte CQE"))
    );
    assert!(decode_cqe(&b[..100], Some(128)).is_err());
}

#[test]
fn cqe_scatter_formats() {
    let mut c = Cqe64::zeroed();
    c.op_own = op_own(CqeOpcode::RESP_SEND, 1, false, 0);
    c.byte_cnt = Be32::new(5);
    let mut b = cqe_bytes(&c);
    b[..5].copy_from_slice(b"abcde");
    let d = decode_cqe(&b, None).unwrap();
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    assert_eq!(name(&d, "cqe", "format"), "scatter to CQE, 32 bytes");
    assert_eq!(num(&d, "scatter", "length"), 5);
    assert_eq!(d.value("scatter", "data"), Some(&json!(hex(b"abcde"))));

    // Format 2 in a 128-byte CQE: the payload is the first half.
    c.op_own = op_own(CqeOpcode::RESP_SEND, 2, false, 0);
    c.byte_cnt = Be32::new(40);
    let mut b: Vec<u8> = (0..64u8).collect();
    b.extend_from_slice(c.as_bytes());
    let d = decode_cqe(&b, None).unwrap();
    assert_eq!(num(&d, "scatter", "length"), 40);
    assert_eq!(d.value("scatter", "data"), Some(&json!(hex(&b[..40]))));
    // Format 2 in a 64-byte CQE cannot be.
    let d = decode_cqe(c.as_bytes(), None).unwrap();
    assert!(
        d.warnings
            .iter()
            .any(|w| w.contains("needs a 128-byte CQE"))
    );
}

#[test]
fn error_cqes_name_syndrome_vendor_and_status() {
    let cases = [
        (
            Syndrome::LOCAL_PROT,
            "LOCAL_PROT",
            WcStatus::LOC_PROT_ERR,
            "IBV_WC_LOC_PROT_ERR",
        ),
        (
            Syndrome::WR_FLUSH,
            "WR_FLUSH",
            WcStatus::WR_FLUSH_ERR,
            "IBV_WC_WR_FLUSH_ERR",
        ),
        (
            Syndrome::REMOTE_ACCESS,
            "REMOTE_ACCESS",
            WcStatus::REM_ACCESS_ERR,
            "IBV_WC_REM_ACCESS_ERR",
        ),
        (
            Syndrome::TRANSPORT_RETRY_EXC,
            "TRANSPORT_RETRY_EXC",
            WcStatus::RETRY_EXC_ERR,
            "IBV_WC_RETRY_EXC_ERR",
        ),
        (
            Syndrome::RNR_RETRY_EXC,
            "RNR_RETRY_EXC",
            WcStatus::RNR_RETRY_EXC_ERR,
            "IBV_WC_RNR_RETRY_EXC_ERR",
        ),
        (
            Syndrome(0x77),
            "UNKNOWN",
            WcStatus::GENERAL_ERR,
            "IBV_WC_GENERAL_ERR",
        ),
    ];
    for (syn, syn_name, st, st_name) in cases {
        let ven = VendorSyndrome::for_syndrome(syn);
        let mut e = ErrCqe::zeroed();
        e.op_own = op_own(CqeOpcode::REQ_ERR, 0, false, 1);
        e.syndrome = syn.0;
        e.vendor_err_synd = ven.0;
        e.s_wqe_opcode_qpn = Be32::new((u32::from(SendOpcode::RDMA_READ.0) << 24) | QPN);
        e.wqe_counter = Be16::new(0x10);
        let d = decode_cqe(e.as_bytes(), None).unwrap();
        assert_eq!(name(&d, "cqe", "opcode"), "REQ_ERR");
        assert_eq!(name(&d, "cqe", "send_opcode"), "RDMA_READ");
        assert_eq!(num(&d, "cqe", "qpn"), u64::from(QPN));
        assert_eq!(num(&d, "cqe", "wqe_counter"), 0x10);
        assert_eq!(num(&d, "error", "syndrome"), u64::from(syn.0));
        assert_eq!(name(&d, "error", "syndrome"), syn_name);
        assert_eq!(
            d.text("error", "meaning"),
            Some(syn.meaning().unwrap_or("unknown syndrome"))
        );
        assert_eq!(num(&d, "error", "wc_status"), u64::from(st.0));
        assert_eq!(name(&d, "error", "wc_status"), st_name);
        assert_eq!(num(&d, "error", "vendor_syndrome"), u64::from(ven.0));
        assert_eq!(
            name(&d, "error", "vendor_syndrome"),
            ven.name().unwrap_or("UNKNOWN")
        );
    }
    // A responder error names the responder's vendor code.
    let mut e = ErrCqe::zeroed();
    e.op_own = op_own(CqeOpcode::RESP_ERR, 0, false, 0);
    e.syndrome = Syndrome::LOCAL_PROT.0;
    e.vendor_err_synd = VendorSyndrome::LOCAL_PROT_RESP.0;
    let d = decode_cqe(e.as_bytes(), None).unwrap();
    assert_eq!(name(&d, "cqe", "opcode"), "RESP_ERR");
    assert!(d.value("cqe", "send_opcode").is_none());
    assert_eq!(name(&d, "error", "vendor_syndrome"), "LOCAL_PROT_RESP");
}

// ---- through the binary ---------------------------------------------------------------------

fn mlx5(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mlx5"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the mlx5 binary");
    let mut w = child.stdin.take().unwrap();
    w.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
    drop(w);
    child.wait_with_output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn binary_args_stdin_and_json() {
    let ctrl = CtrlSeg::new(SendOpcode::RDMA_WRITE, 0, 1, QPN, 3, FM_CE_SE_CQ_UPDATE, 0);
    let b = wqe(&[
        ctrl.as_bytes(),
        RaddrSeg::new(0x9000, 5).as_bytes(),
        DataSeg::new(8, 6, 0xa000).as_bytes(),
    ]);
    // Arguments, with 0x prefixes and commas.
    let args: Vec<String> = b.chunks(4).map(|c| format!("0x{},", hex(c))).collect();
    let mut argv = vec!["decode", "wqe"];
    argv.extend(args.iter().map(String::as_str));
    let o = mlx5(&argv, None);
    assert_eq!(o.status.code(), Some(EXIT_OK), "{}", stdout(&o));
    assert!(stdout(&o).contains("opcode                : 0x08 RDMA_WRITE"));
    assert!(
        stdout(&o).contains("rkey     : 0x00000005"),
        "{}",
        stdout(&o)
    );

    // stdin, JSON.
    let o = mlx5(&["decode", "wqe", "--json"], Some(&hex(&b)));
    assert_eq!(o.status.code(), Some(EXIT_OK));
    let v: Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(v["kind"], "wqe");
    assert_eq!(v["sections"][0]["fields"]["opcode"]["name"], "RDMA_WRITE");
    assert_eq!(v["sections"][1]["name"], "raddr");
    assert_eq!(v["sections"][2]["fields"]["addr"], 0xa000);
    assert_eq!(v["warnings"], json!([]));

    // A CQE with warnings exits 2 and still prints.
    let o = mlx5(&["decode", "cqe"], Some(&"f0".repeat(64)));
    assert_eq!(o.status.code(), Some(EXIT_WARNINGS), "{}", stdout(&o));
    assert!(stdout(&o).contains("INVALID"));
    assert!(stdout(&o).contains("warning: opcode INVALID"));
}

#[test]
fn binary_error_cqe_and_bad_input() {
    let mut e = ErrCqe::zeroed();
    e.op_own = op_own(CqeOpcode::REQ_ERR, 0, false, 0);
    e.syndrome = Syndrome::REMOTE_ACCESS.0;
    e.vendor_err_synd = VendorSyndrome::REMOTE_ACCESS.0;
    let o = mlx5(&["decode", "cqe", &hex(e.as_bytes())], None);
    assert_eq!(o.status.code(), Some(EXIT_OK));
    let s = stdout(&o);
    assert!(s.contains("syndrome        : 0x13 REMOTE_ACCESS"), "{s}");
    assert!(
        s.contains("wc_status       : 10 IBV_WC_REM_ACCESS_ERR"),
        "{s}"
    );

    for bad in [
        &["decode", "wqe", "zz"][..],
        &["decode", "wqe", "abc"],
        &["decode", "cqe", "00"],
    ] {
        let o = mlx5(bad, None);
        assert_eq!(o.status.code(), Some(EXIT_INPUT_ERROR), "{bad:?}");
        assert!(String::from_utf8_lossy(&o.stderr).starts_with("mlx5: "));
        assert!(o.stdout.is_empty());
    }
    let o = mlx5(&["decode", "cqe"], Some(""));
    assert_eq!(o.status.code(), Some(EXIT_INPUT_ERROR));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no hex bytes"));
}

#[test]
fn binary_decodes_each_record_of_an_emu_wqe_log() {
    let send = wqe(&[
        CtrlSeg::new(SendOpcode::SEND, 0, 4, QPN, 2, FM_CE_SE_CQ_UPDATE, 0).as_bytes(),
        DataSeg::new(32, 1, 0x100).as_bytes(),
    ]);
    let read = wqe(&[
        CtrlSeg::new(SendOpcode::RDMA_READ, 0, 5, QPN, 3, FM_CE_SE_CQ_UPDATE, 0).as_bytes(),
        RaddrSeg::new(0x4000, 9).as_bytes(),
        DataSeg::new(32, 1, 0x200).as_bytes(),
    ]);
    let rec = |idx: u16, bytes: &[u8]| mlx5_emu::WqeRecord {
        hca: 0,
        qpn: QPN,
        wqe_index: idx,
        via: mlx5_emu::WqeVia::Batch,
        bytes: bytes.to_vec(),
    };
    let log = format!(
        "{}\n{}\nlate hca=0 qpn={QPN:#08x} idx=5 via=db\n",
        rec(4, &send).to_line(),
        rec(5, &read).to_line()
    );
    let o = mlx5(&["decode", "wqe"], Some(&log));
    assert_eq!(o.status.code(), Some(EXIT_OK), "{}", stdout(&o));
    let s = stdout(&o);
    assert_eq!(s.matches("WQE (").count(), 2, "{s}");
    assert!(s.contains("# hca=0 qpn=0x001c2d idx=4 via=batch"), "{s}");
    // The `late` line corrected the second record's doorbell kind.
    assert!(s.contains("# hca=0 qpn=0x001c2d idx=5 via=db"), "{s}");
    let o = mlx5(&["decode", "wqe", "--json"], Some(&log));
    let v: Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(v[0]["sections"][0]["fields"]["opcode"]["name"], "SEND");
    assert_eq!(v[1]["sections"][0]["fields"]["opcode"]["name"], "RDMA_READ");
    assert_eq!(v[1]["record"]["wqe_index"], 5);
}

#[test]
fn masked_atomics_by_opmod() {
    let r = RaddrSeg::new(0x8000, 7);
    let cs = MaskedCs64Seg::new(1, 2, 0xff, 0xf0);
    let b = wqe(&[
        CtrlSeg::new(
            SendOpcode::ATOMIC_MASKED_CS,
            OPMOD_MASKED_ATOMIC_8B,
            0,
            QPN,
            5,
            0,
            0,
        )
        .as_bytes(),
        r.as_bytes(),
        cs.as_bytes(),
        DataSeg::new(8, 1, 0x10).as_bytes(),
    ]);
    let d = rc(&b);
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    assert_eq!(names(&d), ["ctrl", "raddr", "atomic", "data[0]"]);
    assert_eq!(num(&d, "atomic", "swap_mask"), 0xff);
    assert_eq!(num(&d, "atomic", "compare_mask"), 0xf0);
    assert_eq!(d.section("data[0]").unwrap().offset, 64);

    let fa = MaskedFa32Seg::new(3, 0x8000_0000);
    let b = wqe(&[
        CtrlSeg::new(
            SendOpcode::ATOMIC_MASKED_FA,
            OPMOD_MASKED_ATOMIC_4B,
            0,
            QPN,
            4,
            0,
            0,
        )
        .as_bytes(),
        r.as_bytes(),
        fa.as_bytes(),
        DataSeg::new(4, 1, 0x10).as_bytes(),
    ]);
    let d = rc(&b);
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    assert_eq!(num(&d, "atomic", "add"), 3);
    assert_eq!(num(&d, "atomic", "field_boundary"), 0x8000_0000);

    // An opmod that is neither 4- nor 8-byte is flagged.
    let mut bad = b.clone();
    bad[0] = 0x05;
    assert!(rc(&bad).warnings.iter().any(|w| w.contains("opmod 0x05")));
}

#[test]
fn unknown_opcode_is_shown_raw() {
    let mut b = CtrlSeg::new(SendOpcode(0x3e), 0, 0, QPN, 2, 0, 0)
        .as_bytes()
        .to_vec();
    b.extend_from_slice(&[0x5a; 16]);
    let d = rc(&b);
    assert_eq!(name(&d, "ctrl", "opcode"), "UNKNOWN");
    assert_eq!(names(&d), ["ctrl", "raw"]);
    assert_eq!(d.exit_code(), EXIT_WARNINGS);
}
