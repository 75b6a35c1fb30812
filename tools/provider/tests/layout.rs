//! Proves the public mirrors in `src/abi.rs` against the installed `infiniband/verbs.h`: a C
//! probe prints `sizeof`, `offsetof` and member sizes; the Rust side computes the same from
//! the mirrors; every line must agree. Members the mirror groups (runs of ops the provider
//! never touches, held as one array) are checked by offset only, at the C member they start at.
//! The private ABI-34 structs (`verbs_device_ops`, ...) are not in any installed header: they
//! are pinned by reading (`docs/provider.md`) and the library refuses any other ABI at load.

use std::fmt::Write as _;
use std::process::Command;

use mlx5rs::abi::*;

struct Probe {
    c: String,
    want: Vec<String>,
}

fn member_size<T, F>(_: impl Fn(*const T) -> *const F) -> usize {
    size_of::<F>()
}

macro_rules! probe {
    ($p:ident, $ty:ident = $c:literal { $( $f:ident $(=> $cf:literal)? $(@ $only:tt)? ),* $(,)? }) => {{
        writeln!($p.c, "  printf(\"S {} %zu\\n\", sizeof({}));", $c, $c).unwrap();
        $p.want.push(format!("S {} {}", $c, size_of::<$ty>()));
        $(
            #[allow(unused_mut, unused_assignments)]
            let mut cf = stringify!($f);
            $( cf = $cf; )?
            let off = core::mem::offset_of!($ty, $f);
            let size = member_size(|p: *const $ty| {
                // SAFETY: never called: the closure only names the member's type.
                unsafe { &raw const (*p).$f }
            });
            #[allow(unused_mut, unused_assignments)]
            let mut offset_only = false;
            $( let _ = stringify!($only); offset_only = true; )?
            if offset_only {
                writeln!($p.c, "  printf(\"O {} {} %zu\\n\", offsetof({}, {}));", $c, cf, $c, cf).unwrap();
                $p.want.push(format!("O {} {} {}", $c, cf, off));
            } else {
                writeln!($p.c, "  printf(\"F {} {} %zu %zu\\n\", offsetof({}, {}), sizeof((({} *)0)->{}));", $c, cf, $c, cf, $c, cf).unwrap();
                $p.want.push(format!("F {} {} {} {}", $c, cf, off, size));
            }
        )*
    }};
}

#[test]
fn public_mirrors_match_the_installed_verbs_h() {
    let mut p = Probe {
        c: String::new(),
        want: Vec::new(),
    };
    probe!(p, ibv_device = "struct ibv_device" { _ops, node_type, transport_type, name, dev_name, dev_path, ibdev_path });
    probe!(p, ibv_context_ops = "struct ibv_context_ops" { _compat => "_compat_query_device" @o, poll_cq, req_notify_cq, _compat2 => "_compat_cq_event" @o, post_srq_recv, _compat3 => "_compat_create_qp" @o, post_send, post_recv, _compat4 => "_compat_create_ah" @o });
    probe!(p, ibv_context = "struct ibv_context" { device, ops, cmd_fd, async_fd, num_comp_vectors, mutex, abi_compat });
    probe!(p, verbs_context = "struct verbs_context" { ex_ops => "query_port" @o, priv_ => "priv", ex_ops2 => "query_device_ex" @o, _abi_placeholder3 => "_ABI_placeholder3", sz, context });
    probe!(p, ibv_pd = "struct ibv_pd" { context, handle });
    probe!(p, ibv_mr = "struct ibv_mr" { context, pd, addr, length, handle, lkey, rkey });
    probe!(p, ibv_comp_channel = "struct ibv_comp_channel" { context, fd, refcnt });
    probe!(p, ibv_cq = "struct ibv_cq" { context, channel, cq_context, handle, cqe, mutex, cond, comp_events_completed, async_events_completed });
    probe!(p, ibv_cq_ex = "struct ibv_cq_ex" { cq => "context" @o, comp_mask, status, wr_id, start_poll, next_poll, end_poll, read_opcode, read_vendor_err, read_byte_len, read_imm_data, read_qp_num, read_src_qp, read_wc_flags, read_slid, read_sl, read_dlid_path_bits, read_completion_ts, read_cvlan, read_flow_tag, read_tm_info, read_completion_wallclock_ns });
    probe!(p, ibv_srq = "struct ibv_srq" { context, srq_context, pd, handle, mutex, cond, events_completed });
    probe!(p, ibv_xrcd = "struct ibv_xrcd" { context });
    probe!(p, ibv_xrcd_init_attr = "struct ibv_xrcd_init_attr" { comp_mask, fd, oflags });
    probe!(p, ibv_tm_cap = "struct ibv_tm_cap" { max_num_tags, max_ops });
    probe!(p, ibv_srq_init_attr_ex = "struct ibv_srq_init_attr_ex" { srq_context, attr, comp_mask, srq_type, pd, xrcd, cq, tm_cap });
    probe!(p, ibv_qp_open_attr = "struct ibv_qp_open_attr" { comp_mask, qp_num, xrcd, qp_context, qp_type });
    probe!(p, ibv_qp = "struct ibv_qp" { context, qp_context, pd, send_cq, recv_cq, srq, handle, qp_num, state, qp_type, mutex, cond, events_completed });
    probe!(p, ibv_qp_ex = "struct ibv_qp_ex" { qp_base, comp_mask, wr_id, wr_flags, wr_atomic_cmp_swp, wr_atomic_fetch_add, wr_bind_mw, wr_local_inv, wr_rdma_read, wr_rdma_write, wr_rdma_write_imm, wr_send, wr_send_imm, wr_send_inv, wr_send_tso, wr_set_ud_addr, wr_set_xrc_srqn, wr_set_inline_data, wr_set_inline_data_list, wr_set_sge, wr_set_sge_list, wr_start, wr_complete, wr_abort, wr_atomic_write });
    probe!(p, ibv_data_buf = "struct ibv_data_buf" { addr, length });
    probe!(p, ibv_ah = "struct ibv_ah" { context, pd, handle });
    probe!(p, ibv_sge = "struct ibv_sge" { addr, length, lkey });
    probe!(p, ibv_send_wr = "struct ibv_send_wr" { wr_id, next, sg_list, num_sge, opcode, send_flags, imm_data, wr, qp_type, tail => "bind_mw" @o });
    probe!(p, ibv_send_wr_rdma = "typeof(((struct ibv_send_wr *)0)->wr.rdma)" { remote_addr, rkey });
    probe!(p, ibv_send_wr_atomic = "typeof(((struct ibv_send_wr *)0)->wr.atomic)" { remote_addr, compare_add, swap, rkey });
    probe!(p, ibv_send_wr_ud = "typeof(((struct ibv_send_wr *)0)->wr.ud)" { ah, remote_qpn, remote_qkey });
    probe!(p, ibv_recv_wr = "struct ibv_recv_wr" { wr_id, next, sg_list, num_sge });
    probe!(p, ibv_wc = "struct ibv_wc" { wr_id, status, opcode, vendor_err, byte_len, imm_data, qp_num, src_qp, wc_flags, pkey_index, slid, sl, dlid_path_bits });
    probe!(p, ibv_qp_cap = "struct ibv_qp_cap" { max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data });
    probe!(p, ibv_qp_init_attr = "struct ibv_qp_init_attr" { qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all });
    probe!(p, ibv_rx_hash_conf = "struct ibv_rx_hash_conf" { rx_hash_function, rx_hash_key_len, rx_hash_key, rx_hash_fields_mask });
    probe!(p, ibv_qp_init_attr_ex = "struct ibv_qp_init_attr_ex" { qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all, comp_mask, pd, xrcd, create_flags, max_tso_header, rwq_ind_tbl, rx_hash_conf, source_qpn, send_ops_flags });
    probe!(p, ibv_cq_init_attr_ex = "struct ibv_cq_init_attr_ex" { cqe, cq_context, channel, comp_vector, wc_flags, comp_mask, flags, parent_domain });
    probe!(p, ibv_global_route = "struct ibv_global_route" { dgid, flow_label, sgid_index, hop_limit, traffic_class });
    probe!(p, ibv_ah_attr = "struct ibv_ah_attr" { grh, dlid, sl, src_path_bits, static_rate, is_global, port_num });
    probe!(p, ibv_qp_attr = "struct ibv_qp_attr" { qp_state, cur_qp_state, path_mtu, path_mig_state, qkey, rq_psn, sq_psn, dest_qp_num, qp_access_flags, cap, ah_attr, alt_ah_attr, pkey_index, alt_pkey_index, en_sqd_async_notify, sq_draining, max_rd_atomic, max_dest_rd_atomic, min_rnr_timer, port_num, timeout, retry_cnt, rnr_retry, alt_port_num, alt_timeout, rate_limit });
    probe!(p, ibv_srq_attr = "struct ibv_srq_attr" { max_wr, max_sge, srq_limit });
    probe!(p, ibv_srq_init_attr = "struct ibv_srq_init_attr" { srq_context, attr });
    probe!(p, ibv_port_attr = "struct ibv_port_attr" { state, max_mtu, active_mtu, gid_tbl_len, port_cap_flags, max_msg_sz, bad_pkey_cntr, qkey_viol_cntr, pkey_tbl_len, lid, sm_lid, lmc, max_vl_num, sm_sl, subnet_timeout, init_type_reply, active_width, active_speed, phys_state, link_layer, flags, port_cap_flags2 });
    probe!(p, ibv_device_attr = "struct ibv_device_attr" { fw_ver, node_guid, sys_image_guid, max_mr_size, page_size_cap, vendor_id, vendor_part_id, hw_ver, max_qp, max_qp_wr, device_cap_flags, max_sge, max_sge_rd, max_cq, max_cqe, max_mr, max_pd, max_qp_rd_atom, max_ee_rd_atom, max_res_rd_atom, max_qp_init_rd_atom, max_ee_init_rd_atom, atomic_cap, max_ee, max_rdd, max_mw, max_raw_ipv6_qp, max_raw_ethy_qp, max_mcast_grp, max_mcast_qp_attach, max_total_mcast_qp_attach, max_ah, max_fmr, max_map_per_fmr, max_srq, max_srq_wr, max_srq_sge, max_pkeys, local_ca_ack_delay, phys_port_cnt });
    probe!(p, ibv_odp_caps = "struct ibv_odp_caps" { general_caps, rc_odp_caps => "per_transport_caps.rc_odp_caps", uc_odp_caps => "per_transport_caps.uc_odp_caps", ud_odp_caps => "per_transport_caps.ud_odp_caps" });
    probe!(p, ibv_tso_caps = "struct ibv_tso_caps" { max_tso, supported_qpts });
    probe!(p, ibv_rss_caps = "struct ibv_rss_caps" { supported_qpts, max_rwq_indirection_tables, max_rwq_indirection_table_size, rx_hash_fields_mask, rx_hash_function });
    probe!(p, ibv_packet_pacing_caps = "struct ibv_packet_pacing_caps" { qp_rate_limit_min, qp_rate_limit_max, supported_qpts });
    probe!(p, ibv_tm_caps = "struct ibv_tm_caps" { max_rndv_hdr_size, max_num_tags, flags, max_ops, max_sge });
    probe!(p, ibv_cq_moderation_caps = "struct ibv_cq_moderation_caps" { max_cq_count, max_cq_period });
    probe!(p, ibv_pci_atomic_caps = "struct ibv_pci_atomic_caps" { fetch_add, swap, compare_swap });
    probe!(p, ibv_device_attr_ex = "struct ibv_device_attr_ex" { orig_attr, comp_mask, odp_caps, completion_timestamp_mask, hca_core_clock, device_cap_flags_ex, tso_caps, rss_caps, max_wq_type_rq, packet_pacing_caps, raw_packet_caps, tm_caps, cq_mod_caps, max_dm_size, pci_atomic_caps, xrc_odp_caps, phys_port_cnt_ex });
    probe!(p, ibv_async_event = "struct ibv_async_event" { element, event_type });

    let dir = std::env::temp_dir().join(format!("mlx5rs-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("probe.c");
    let exe = dir.join("probe");
    std::fs::write(
        &src,
        format!(
            "#include <stdio.h>\n#include <stddef.h>\n#include <infiniband/verbs.h>\nint main(void) {{\n{}  return 0;\n}}\n",
            p.c
        ),
    )
    .unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run the C compiler `{cc}` ({e}); install the Debian package gcc")
        });
    assert!(
        out.status.success(),
        "the probe does not compile against <infiniband/verbs.h> (install libibverbs-dev):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let got: Vec<String> = String::from_utf8_lossy(&run.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    let bad: Vec<String> = p
        .want
        .iter()
        .zip(&got)
        .filter(|(w, g)| w != g)
        .map(|(w, g)| format!("rust {w}\n   C {g}"))
        .collect();
    assert_eq!(
        got.len(),
        p.want.len(),
        "probe printed {} lines, expected {}",
        got.len(),
        p.want.len()
    );
    assert!(
        bad.is_empty(),
        "{} mismatches:\n{}",
        bad.len(),
        bad.join("\n")
    );
    assert!(p.want.len() > 300, "{} lines checked", p.want.len());
}

#[test]
fn the_ops_table_has_76_slots_sorted_by_name() {
    // ABI 34 as rdma-core 44 has it; "Keep sorted" is driver.h's own rule.
    assert_eq!(VERBS_CONTEXT_OPS_SLOTS, 76);
    let mut sorted = OPS_NAMES;
    sorted.sort_unstable();
    assert_eq!(sorted, OPS_NAMES);
    assert_eq!(slot("advise_mr"), 0);
    assert_eq!(slot("poll_cq"), 53);
    assert_eq!(size_of::<verbs_context_ops>(), 76 * 8);
}
