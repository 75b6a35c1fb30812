//! Proves our layouts and constants against the installed rdma-core header
//! `<infiniband/mlx5dv.h>` (package libibverbs-dev): a generated C program prints `sizeof`,
//! `offsetof` and field sizes of every mirrored struct, the value of every mirrored constant,
//! and the bytes produced by mlx5dv.h's own inline encoders/decoders; the test compares each
//! against the value computed from our Rust code (`size_of`, `offset_of!`, our consts and our
//! encoders), so changing any one of them here makes this test fail.
//!
//! Run with `--nocapture` to see the counts. Needs a C compiler (`cc`, or `$CC`).

use mlx5_hw::cqe::{self, Cqe64, ErrCqe};
use mlx5_hw::doorbell;
use mlx5_hw::opcodes::{CqeOpcode, SendOpcode, Syndrome, VendorSyndrome, WcStatus};
use mlx5_hw::wqe::{
    self, AtomicSeg, CtrlSeg, DataSeg, DatagramSeg, InlineHdr, RaddrSeg, SrqNextSeg,
};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::mem::{offset_of, size_of};
use std::path::{Path, PathBuf};
use std::process::Command;
use zerocopy::{FromBytes, IntoBytes};

/// One value to compare: a key, the C expression that computes it, and our value.
struct Check {
    key: String,
    c_expr: String,
    ours: String,
}

#[derive(Default)]
struct Checks {
    list: Vec<Check>,
    structs: usize,
    fields: usize,
    consts: usize,
    vectors: usize,
}

/// Size of a field's type, named through an accessor closure.
fn field_size<T, F>(_: fn(&T) -> &F) -> usize {
    size_of::<F>()
}

impl Checks {
    fn num(&mut self, key: String, c_expr: String, ours: u64) {
        self.list.push(Check {
            key,
            c_expr: format!("NUM({c_expr})"),
            ours: ours.to_string(),
        });
    }
    fn strukt(&mut self, c: &str, size: usize) {
        self.structs += 1;
        self.num(
            format!("sizeof {c}"),
            format!("sizeof(struct {c})"),
            size as u64,
        );
    }
    /// Offset and size of one C field; `c_field` may be a member designator (`key.qkey.qkey`).
    fn field(&mut self, c: &str, c_field: &str, offset: usize, size: usize) {
        self.fields += 1;
        self.num(
            format!("offsetof {c}.{c_field}"),
            format!("offsetof(struct {c}, {c_field})"),
            offset as u64,
        );
        self.num(
            format!("sizeof {c}.{c_field}"),
            format!("sizeof(((struct {c} *)0)->{c_field})"),
            size as u64,
        );
    }
    fn konst(&mut self, c_name: &str, ours: u64) {
        self.consts += 1;
        self.num(format!("const {c_name}"), c_name.to_string(), ours);
    }
    /// Bytes written by a C snippet into `buf` (declared by the snippet) vs our bytes.
    fn bytes(&mut self, key: &str, c_snippet: &str, ours: &[u8]) {
        self.vectors += 1;
        self.list.push(Check {
            key: key.to_string(),
            c_expr: format!("BYTES({c_snippet})"),
            ours: hex(ours),
        });
    }
    /// A numeric result of a C decoder vs ours.
    fn decoded(&mut self, key: String, c_expr: String, ours: u64) {
        self.vectors += 1;
        self.num(key, c_expr, ours);
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().fold(String::new(), |mut s, x| {
        let _ = write!(s, "{x:02x}");
        s
    })
}

/// `layout!(checks, "c_struct", RustType, { "c_field" => rust_field, ... })`
macro_rules! layout {
    ($ch:ident, $c:literal, $t:ty, { $($cf:literal => $rf:ident),* $(,)? }) => {{
        $ch.strukt($c, size_of::<$t>());
        $( $ch.field($c, $cf, offset_of!($t, $rf), field_size(|s: &$t| &s.$rf)); )*
    }};
}

fn build_checks() -> Checks {
    let mut ch = Checks::default();

    // ---- structs: size, and offset + size of every field
    layout!(ch, "mlx5_wqe_ctrl_seg", CtrlSeg, {
        "opmod_idx_opcode" => opmod_idx_opcode, "qpn_ds" => qpn_ds, "signature" => signature,
        "dci_stream_channel_id" => dci_stream_channel_id, "fm_ce_se" => fm_ce_se, "imm" => imm,
    });
    layout!(ch, "mlx5_wqe_raddr_seg", RaddrSeg, { "raddr" => raddr, "rkey" => rkey, "reserved" => reserved });
    layout!(ch, "mlx5_wqe_atomic_seg", AtomicSeg, { "swap_add" => swap_add, "compare" => compare });
    layout!(ch, "mlx5_wqe_data_seg", DataSeg, { "byte_count" => byte_count, "lkey" => lkey, "addr" => addr });
    layout!(ch, "mlx5_wqe_inl_data_seg", InlineHdr, { "byte_count" => byte_count });
    layout!(ch, "mlx5_wqe_srq_next_seg", SrqNextSeg, {
        "rsvd0" => rsvd0, "next_wqe_index" => next_wqe_index, "signature" => signature, "rsvd1" => rsvd1,
    });
    // the AV's key is a union in C (qkey.qkey + qkey.reserved, or dc_key): check the enclosing
    // member and each union view against our single 8-byte field
    layout!(ch, "mlx5_wqe_av", DatagramSeg, {
        "key" => key, "key.dc_key" => key, "dqp_dct" => dqp_dct, "stat_rate_sl" => stat_rate_sl,
        "fl_mlid" => fl_mlid, "rlid" => rlid, "reserved0" => reserved0, "rmac" => rmac, "tclass" => tclass,
        "hop_limit" => hop_limit, "grh_gid_fl" => grh_gid_fl, "rgid" => rgid,
    });
    ch.fields += 1;
    ch.num(
        "offsetof mlx5_wqe_av.key.qkey.qkey".into(),
        "offsetof(struct mlx5_wqe_av, key.qkey.qkey)".into(),
        offset_of!(DatagramSeg, key) as u64,
    );
    ch.num(
        "offsetof mlx5_wqe_av.key.qkey.reserved".into(),
        "offsetof(struct mlx5_wqe_av, key.qkey.reserved)".into(),
        offset_of!(DatagramSeg, key) as u64 + 4,
    );
    ch.strukt("mlx5_wqe_datagram_seg", size_of::<DatagramSeg>());
    // the first 32 bytes of mlx5_cqe64 are an anonymous union; these are the normal-view members
    layout!(ch, "mlx5_cqe64", Cqe64, {
        "rsvd0" => rsvd0, "wqe_id" => wqe_id, "rsvd4" => rsvd4, "ml_path" => ml_path, "rsvd20" => rsvd20,
        "slid" => slid, "flags_rqpn" => flags_rqpn, "hds_ip_ext" => hds_ip_ext,
        "l4_hdr_type_etc" => l4_hdr_type_etc, "vlan_info" => vlan_info, "srqn_uidx" => srqn_uidx,
        "imm_inval_pkey" => imm_inval_pkey, "app" => app, "app_op" => app_op, "app_info" => app_info,
        "byte_cnt" => byte_cnt, "timestamp" => timestamp, "sop_drop_qpn" => sop_drop_qpn,
        "wqe_counter" => wqe_counter, "signature" => signature, "op_own" => op_own,
    });
    // mlx5_err_cqe folds our hw_err_synd / hw_synd_type into the last two bytes of its rsvd1[18]
    layout!(ch, "mlx5_err_cqe", ErrCqe, {
        "rsvd0" => rsvd0, "srqn" => srqn, "vendor_err_synd" => vendor_err_synd, "syndrome" => syndrome,
        "s_wqe_opcode_qpn" => s_wqe_opcode_qpn, "wqe_counter" => wqe_counter, "signature" => signature,
        "op_own" => op_own,
    });
    ch.fields += 1;
    ch.num(
        "offsetof mlx5_err_cqe.rsvd1".into(),
        "offsetof(struct mlx5_err_cqe, rsvd1)".into(),
        offset_of!(ErrCqe, rsvd1) as u64,
    );
    ch.num(
        "end of mlx5_err_cqe.rsvd1 == our vendor_err_synd".into(),
        "offsetof(struct mlx5_err_cqe, rsvd1) + sizeof(((struct mlx5_err_cqe *)0)->rsvd1)".into(),
        offset_of!(ErrCqe, vendor_err_synd) as u64,
    );
    ch.num(
        "our hw_err_synd/hw_synd_type are the last 2 bytes of mlx5_err_cqe.rsvd1".into(),
        "offsetof(struct mlx5_err_cqe, vendor_err_synd) - 2".into(),
        offset_of!(ErrCqe, hw_err_synd) as u64,
    );

    // ---- constants: every named value of the open enums that has a C name, and the singles
    for (v, _, c) in SendOpcode::ALL.iter().filter(|e| !e.2.is_empty()) {
        ch.konst(c, v.0.into());
    }
    for (v, _, c) in CqeOpcode::ALL.iter().filter(|e| !e.2.is_empty()) {
        ch.konst(c, v.0.into());
    }
    for (v, _, c) in Syndrome::ALL.iter().filter(|e| !e.2.is_empty()) {
        ch.konst(c, v.0.into());
    }
    for (v, _, c) in VendorSyndrome::ALL.iter().filter(|e| !e.2.is_empty()) {
        ch.konst(c, v.0.into());
    }
    for (v, _, c) in WcStatus::ALL.iter().filter(|e| !e.2.is_empty()) {
        ch.konst(c, v.0.into());
    }
    let singles: [(&str, u64); 21] = [
        ("MLX5_WQE_CTRL_CQ_UPDATE", wqe::FM_CE_SE_CQ_UPDATE.into()),
        ("MLX5_WQE_CTRL_SOLICITED", wqe::FM_CE_SE_SOLICITED.into()),
        ("MLX5_WQE_CTRL_FENCE", wqe::FM_CE_SE_FENCE.into()),
        (
            "MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE",
            wqe::FM_CE_SE_INITIATOR_SMALL_FENCE.into(),
        ),
        ("MLX5_INLINE_SEG", wqe::INLINE_SEG_FLAG.into()),
        ("MLX5_INVALID_LKEY", wqe::INVALID_LKEY.into()),
        ("MLX5_EXTENDED_UD_AV", wqe::DQP_EXTENDED_AV.into()),
        ("MLX5_SEND_WQE_BB", wqe::WQEBB_SIZE as u64),
        ("MLX5_SEND_WQE_SHIFT", wqe::WQEBB_SHIFT.into()),
        ("MLX5_CQE_OWNER_MASK", cqe::CQE_OWNER_MASK.into()),
        ("MLX5_INLINE_SCATTER_32", cqe::INLINE_SCATTER_32.into()),
        ("MLX5_INLINE_SCATTER_64", cqe::INLINE_SCATTER_64.into()),
        ("MLX5_CQ_DOORBELL", doorbell::UAR_CQ_DOORBELL as u64),
        (
            "MLX5_CQ_DB_REQ_NOT_SOL",
            doorbell::CQ_ARM_CMD_SOLICITED.into(),
        ),
        ("MLX5_CQ_DB_REQ_NOT", doorbell::CQ_ARM_CMD_NEXT.into()),
        ("MLX5_RCV_DBR", doorbell::DBR_RCV_WORD as u64),
        ("MLX5_SND_DBR", doorbell::DBR_SND_WORD as u64),
        ("MLX5_CQE_REQ", CqeOpcode::REQ.0.into()),
        ("MLX5_CQE_RESP_WR_IMM", CqeOpcode::RESP_WR_IMM.0.into()),
        ("MLX5_CQE_INVALID << 4", cqe::CQE_INVALID_OP_OWN.into()),
        ("sizeof(struct mlx5_wqe_data_seg)", wqe::DS_SIZE as u64),
    ];
    for (c, v) in singles {
        ch.konst(c, v);
    }

    // ---- encoders: mlx5dv.h's inline helpers vs ours, same inputs
    let ctrl = CtrlSeg::new(
        SendOpcode::SEND,
        0,
        0x1234,
        0xAB_CDEF,
        2,
        wqe::FM_CE_SE_CQ_UPDATE,
        0,
    );
    ch.bytes(
        "mlx5dv_set_ctrl_seg SEND",
        "struct mlx5_wqe_ctrl_seg buf; memset(&buf, 0, sizeof buf); \
         mlx5dv_set_ctrl_seg(&buf, 0x1234, MLX5_OPCODE_SEND, 0, 0xabcdef, MLX5_WQE_CTRL_CQ_UPDATE, 2, 0, 0);",
        ctrl.as_bytes(),
    );
    let f = wqe::FM_CE_SE_FENCE | wqe::FM_CE_SE_SOLICITED | wqe::FM_CE_SE_CQ_UPDATE;
    let mut ctrl = CtrlSeg::new(
        SendOpcode::ATOMIC_MASKED_FA,
        0x09,
        0xFFFF,
        0x12,
        63,
        f,
        0xDEAD_BEEF,
    );
    ctrl.signature = 0x5A;
    ch.bytes(
        "mlx5dv_set_ctrl_seg MASKED_FA",
        "struct mlx5_wqe_ctrl_seg buf; memset(&buf, 0, sizeof buf); \
         mlx5dv_set_ctrl_seg(&buf, 0xffff, MLX5_OPCODE_ATOMIC_MASKED_FA, 9, 0x12, \
         MLX5_WQE_CTRL_FENCE | MLX5_WQE_CTRL_SOLICITED | MLX5_WQE_CTRL_CQ_UPDATE, 63, 0x5a, htobe32(0xdeadbeef));",
        ctrl.as_bytes(),
    );
    ch.bytes(
        "mlx5dv_set_data_seg",
        "struct mlx5_wqe_data_seg buf; mlx5dv_set_data_seg(&buf, 0x40, 0x1234, (uintptr_t)0xdeadbeef00001000ULL);",
        DataSeg::new(0x40, 0x1234, 0xDEAD_BEEF_0000_1000).as_bytes(),
    );
    let mut av = DatagramSeg::zeroed();
    av.set_qkey(0x1111_1111);
    av.set_dqpn(0x12_3456);
    av.stat_rate_sl = 0x73;
    av.fl_mlid = 0x85;
    av.rlid = 0xC001.into();
    av.rmac = [2, 0x11, 0x22, 0x33, 0x44, 0x55];
    av.tclass = 0x60;
    av.hop_limit = 64;
    av.grh_gid_fl = (wqe::AV_GRH_PRESENT | (3 << 20) | 0xABCDE).into();
    av.rgid = [0xFE, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    ch.bytes(
        "mlx5dv_set_dgram_seg",
        "struct mlx5_wqe_datagram_seg buf; \
         uint8_t rmac[6] = {2, 0x11, 0x22, 0x33, 0x44, 0x55}; \
         uint8_t rgid[16] = {0xfe, 0x80, 0,0,0,0,0,0, 0,0,0,0,0,0,0, 1}; \
         mlx5dv_set_dgram_seg(&buf, 0x1111111100000000ULL, 0x123456, 1, 0x73, 0x85, 0xc001, rmac, 0x60, 64, \
         (1u << 30) | (3u << 20) | 0xabcde, rgid);",
        av.as_bytes(),
    );

    // ---- decoders: mlx5dv.h's CQE getters vs ours for every op_own value
    for op_own in 0..=255u8 {
        let mut b = [0u8; 64];
        b[63] = op_own;
        let c = Cqe64::read_from_bytes(&b[..]).unwrap_or_else(|_| unreachable!());
        let set = format!("struct mlx5_cqe64 q; memset(&q, 0, sizeof q); q.op_own = {op_own};");
        let ours = u64::from(c.opcode().0) << 24
            | u64::from(c.owner()) << 16
            | u64::from(c.solicited()) << 8
            | u64::from(c.format());
        ch.decoded(
            format!("mlx5dv_get_cqe_* op_own={op_own:#04x}"),
            format!(
                "({{ {set} ((unsigned)mlx5dv_get_cqe_opcode(&q) << 24) | ((unsigned)mlx5dv_get_cqe_owner(&q) << 16) \
                 | ((unsigned)mlx5dv_get_cqe_se(&q) << 8) | mlx5dv_get_cqe_format(&q); }})"
            ),
            ours,
        );
    }
    ch
}

fn program(checks: &Checks) -> String {
    let mut p = String::from(
        "#include <stdio.h>\n#include <stdint.h>\n#include <string.h>\n#include <stddef.h>\n#include <endian.h>\n\
         #include <infiniband/mlx5dv.h>\n\
         #define NUM(...) printf(\"%llu\\n\", (unsigned long long)(__VA_ARGS__))\n\
         #define BYTES(...) do { __VA_ARGS__ const unsigned char *p_ = (const unsigned char *)&buf; \
         for (size_t i_ = 0; i_ < sizeof buf; i_++) printf(\"%02x\", p_[i_]); printf(\"\\n\"); } while (0)\n\
         int main(void) {\n",
    );
    for (i, c) in checks.list.iter().enumerate() {
        let _ = writeln!(p, "  printf(\"%d=\", {i}); {{ {}; }}", c.c_expr);
    }
    p.push_str("  return 0;\n}\n");
    p
}

fn scratch_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("mlx5-hw-header-check-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("create scratch dir");
    d
}

fn compile_and_run(src: &str, dir: &Path, name: &str) -> Result<String, String> {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let c_path = dir.join(format!("{name}.c"));
    let exe = dir.join(name);
    std::fs::write(&c_path, src).map_err(|e| format!("write {}: {e}", c_path.display()))?;
    let out = Command::new(&cc)
        .arg("-std=gnu11")
        .arg("-o")
        .arg(&exe)
        .arg(&c_path)
        .output()
        .map_err(|e| {
            format!("cannot run the C compiler `{cc}` ({e}); install a C compiler (gcc)")
        })?;
    if !out.status.success() {
        return Err(format!(
            "`{cc}` failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let run = Command::new(&exe)
        .output()
        .map_err(|e| format!("run {}: {e}", exe.display()))?;
    if !run.status.success() {
        return Err(format!("{} exited with {}", exe.display(), run.status));
    }
    Ok(String::from_utf8_lossy(&run.stdout).into_owned())
}

#[test]
fn layouts_and_constants_match_mlx5dv_h() {
    let dir = scratch_dir();
    // The header must be there: a missing header is a failure, never a silent pass.
    if let Err(e) = compile_and_run(
        "#include <infiniband/mlx5dv.h>\nint main(void) { return 0; }\n",
        &dir,
        "probe",
    ) {
        panic!(
            "cannot compile against <infiniband/mlx5dv.h>: install libibverbs-dev \
             (the rdma-core development headers) to run this check.\n{e}"
        );
    }
    let checks = build_checks();
    let out = match compile_and_run(&program(&checks), &dir, "check") {
        Ok(o) => o,
        Err(e) => panic!(
            "header check program failed (a mirrored name is missing from the header?):\n{e}"
        ),
    };
    let _ = std::fs::remove_dir_all(&dir);
    let got: BTreeMap<usize, &str> = out
        .lines()
        .filter_map(|l| l.split_once('='))
        .filter_map(|(i, v)| Some((i.parse().ok()?, v)))
        .collect();
    let mut bad = Vec::new();
    for (i, c) in checks.list.iter().enumerate() {
        match got.get(&i) {
            Some(v) if *v == c.ours => {}
            Some(v) => bad.push(format!("{}: header says {v}, ours is {}", c.key, c.ours)),
            None => bad.push(format!("{}: no output from the C program", c.key)),
        }
    }
    println!(
        "header_check: {} structs, {} fields (offset and size), {} constants, {} encoder/decoder vectors \
         checked against mlx5dv.h ({} comparisons, {} mismatches)",
        checks.structs,
        checks.fields,
        checks.consts,
        checks.vectors,
        checks.list.len(),
        bad.len()
    );
    assert!(
        bad.is_empty(),
        "mismatches against mlx5dv.h:\n{}",
        bad.join("\n")
    );
    // guard against the check silently shrinking
    assert!(
        checks.structs >= 10 && checks.fields >= 60 && checks.consts >= 90,
        "check set shrank"
    );
}
