//! Proves the hand-written mirrors against the kernel headers installed on this machine
//! (`rdma/*.h` from Debian's linux-libc-dev, `infiniband/verbs.h` from libibverbs-dev).
//!
//! One macro-driven table below lists every mirrored struct (with every field) and every
//! mirrored constant exactly once. From it the test generates both a C program (printing
//! `sizeof`, `offsetof` and field sizes, and constant values from the headers) and the
//! expected output computed from the Rust code (`size_of`, `offset_of!`, the consts), then
//! compiles the program with `cc`, runs it and compares line by line. It also checks that
//! the listed fields of each struct tile it without gaps, so no field can be left out.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;

use mlx5_ffi::{ioctl, mlx5, uverbs};
use zerocopy::FromZeros;

/// Headers the check includes, with the Debian package that ships each.
const HEADERS: &[(&str, &str)] = &[
    ("rdma/ib_user_verbs.h", "linux-libc-dev"),
    ("rdma/ib_user_ioctl_verbs.h", "linux-libc-dev"),
    ("rdma/ib_user_ioctl_cmds.h", "linux-libc-dev"),
    ("rdma/rdma_user_ioctl_cmds.h", "linux-libc-dev"),
    ("rdma/mlx5-abi.h", "linux-libc-dev"),
    ("rdma/mlx5_user_ioctl_cmds.h", "linux-libc-dev"),
    ("rdma/mlx5_user_ioctl_verbs.h", "linux-libc-dev"),
    ("infiniband/verbs.h", "libibverbs-dev"),
];

/// The C statements and the expected output lines generated from the table.
#[derive(Default)]
struct Table {
    c_body: String,
    expected: Vec<String>,
    structs: usize,
    fields: usize,
    consts: usize,
    /// (struct, field, offset, size) of the struct being listed, for the tiling check.
    current: Vec<(&'static str, String, usize, usize)>,
    errors: Vec<String>,
}

impl Table {
    fn structure(&mut self, cname: &'static str, size: usize) {
        self.structs += 1;
        writeln!(
            self.c_body,
            "  printf(\"S %s %zu\\n\", \"{cname}\", sizeof({cname}));"
        )
        .unwrap();
        self.expected.push(format!("S {cname} {size}"));
        self.current.clear();
    }

    fn field(
        &mut self,
        cname: &'static str,
        rust_path: &str,
        c_field: Option<&str>,
        offset: usize,
        size: usize,
    ) {
        self.fields += 1;
        let c_field = c_field.unwrap_or(rust_path).to_owned();
        writeln!(
            self.c_body,
            "  printf(\"F %s %s %zu %zu\\n\", \"{cname}\", \"{c_field}\", offsetof({cname}, {c_field}), \
             sizeof((({cname} *)0)->{c_field}));"
        )
        .unwrap();
        self.expected
            .push(format!("F {cname} {c_field} {offset} {size}"));
        self.current
            .push((cname, rust_path.to_owned(), offset, size));
    }

    /// Every byte of the struct must belong to exactly one listed field.
    fn end_struct(&mut self, cname: &'static str, size: usize) {
        let mut fields = std::mem::take(&mut self.current);
        fields.sort_by_key(|f| f.2);
        let mut next = 0;
        for (_, name, offset, fsize) in &fields {
            if *offset != next {
                self.errors.push(format!(
                    "{cname}: field {name} at {offset}, expected {next} (gap or overlap)"
                ));
            }
            next = offset + fsize;
        }
        if next != size {
            self.errors
                .push(format!("{cname}: fields end at {next}, struct size {size}"));
        }
    }

    fn constant(&mut self, rust_path: &str, c_name: Option<&str>, value: u64) {
        self.consts += 1;
        let rust_name = rust_path.rsplit("::").next().unwrap_or(rust_path).trim();
        let c_name = c_name.unwrap_or(rust_name);
        writeln!(
            self.c_body,
            "  printf(\"C %s %llu\\n\", \"{c_name}\", (unsigned long long)({c_name}));"
        )
        .unwrap();
        self.expected.push(format!("C {c_name} {value}"));
    }
}

macro_rules! abi_table {
    (
        structs { $( $ty:ty = $cname:literal {
            $( $f0:ident $(. $fr:ident)* $(=> $cf:literal)? ),* $(,)?
        } ),* $(,)? }
        consts { $( $cpath:path $(=> $cc:literal)? ),* $(,)? }
    ) => {
        fn table() -> Table {
            let mut t = Table::default();
            $(
                t.structure($cname, size_of::<$ty>());
                let zero = <$ty as FromZeros>::new_zeroed();
                $(
                    let c_field: Option<&str> = None $( .or(Some($cf)) )?;
                    t.field(
                        $cname,
                        concat!(stringify!($f0) $(, ".", stringify!($fr))*),
                        c_field,
                        std::mem::offset_of!($ty, $f0 $(. $fr)*),
                        size_of_val(&zero.$f0 $(. $fr)*),
                    );
                )*
                t.end_struct($cname, size_of::<$ty>());
            )*
            $(
                let c_name: Option<&str> = None $( .or(Some($cc)) )?;
                t.constant(stringify!($cpath), c_name, $cpath as u64);
            )*
            t
        }
    };
}

abi_table! {
    structs {
        uverbs::IbUverbsAsyncEventDesc = "struct ib_uverbs_async_event_desc" {
            element, event_type, reserved
        },
        uverbs::IbUverbsCompEventDesc = "struct ib_uverbs_comp_event_desc" {
            cq_handle
        },
        uverbs::IbUverbsCqModerationCaps = "struct ib_uverbs_cq_moderation_caps" {
            max_cq_moderation_count, max_cq_moderation_period, reserved
        },
        uverbs::IbUverbsCmdHdr = "struct ib_uverbs_cmd_hdr" {
            command, in_words, out_words
        },
        uverbs::IbUverbsExCmdHdr = "struct ib_uverbs_ex_cmd_hdr" {
            response, provider_in_words, provider_out_words, cmd_hdr_reserved
        },
        uverbs::IbUverbsGetContext = "struct ib_uverbs_get_context" {
            response
        },
        uverbs::IbUverbsGetContextResp = "struct ib_uverbs_get_context_resp" {
            async_fd, num_comp_vectors
        },
        uverbs::IbUverbsQueryDevice = "struct ib_uverbs_query_device" {
            response
        },
        uverbs::IbUverbsQueryDeviceResp = "struct ib_uverbs_query_device_resp" {
            fw_ver, node_guid, sys_image_guid, max_mr_size, page_size_cap, vendor_id, vendor_part_id, hw_ver, max_qp, max_qp_wr, device_cap_flags, max_sge, max_sge_rd, max_cq, max_cqe, max_mr, max_pd, max_qp_rd_atom, max_ee_rd_atom, max_res_rd_atom, max_qp_init_rd_atom, max_ee_init_rd_atom, atomic_cap, max_ee, max_rdd, max_mw, max_raw_ipv6_qp, max_raw_ethy_qp, max_mcast_grp, max_mcast_qp_attach, max_total_mcast_qp_attach, max_ah, max_fmr, max_map_per_fmr, max_srq, max_srq_wr, max_srq_sge, max_pkeys, local_ca_ack_delay, phys_port_cnt, reserved
        },
        uverbs::IbUverbsExQueryDevice = "struct ib_uverbs_ex_query_device" {
            comp_mask, reserved
        },
        uverbs::IbUverbsOdpCaps = "struct ib_uverbs_odp_caps" {
            general_caps, per_transport_caps.rc_odp_caps, per_transport_caps.uc_odp_caps, per_transport_caps.ud_odp_caps, reserved
        },
        uverbs::IbUverbsRssCaps = "struct ib_uverbs_rss_caps" {
            supported_qpts, max_rwq_indirection_tables, max_rwq_indirection_table_size, reserved
        },
        uverbs::IbUverbsTmCaps = "struct ib_uverbs_tm_caps" {
            max_rndv_hdr_size, max_num_tags, flags, max_ops, max_sge, reserved
        },
        uverbs::IbUverbsExQueryDeviceResp = "struct ib_uverbs_ex_query_device_resp" {
            base, comp_mask, response_length, odp_caps, timestamp_mask, hca_core_clock, device_cap_flags_ex, rss_caps, max_wq_type_rq, raw_packet_caps, tm_caps, cq_moderation_caps, max_dm_size, xrc_odp_caps, reserved
        },
        uverbs::IbUverbsQueryPort = "struct ib_uverbs_query_port" {
            response, port_num, reserved
        },
        uverbs::IbUverbsQueryPortResp = "struct ib_uverbs_query_port_resp" {
            port_cap_flags, max_msg_sz, bad_pkey_cntr, qkey_viol_cntr, gid_tbl_len, pkey_tbl_len, lid, sm_lid, state, max_mtu, active_mtu, lmc, max_vl_num, sm_sl, subnet_timeout, init_type_reply, active_width, active_speed, phys_state, link_layer, flags, reserved
        },
        uverbs::IbUverbsAllocPd = "struct ib_uverbs_alloc_pd" {
            response
        },
        uverbs::IbUverbsAllocPdResp = "struct ib_uverbs_alloc_pd_resp" {
            pd_handle
        },
        uverbs::IbUverbsDeallocPd = "struct ib_uverbs_dealloc_pd" {
            pd_handle
        },
        uverbs::IbUverbsRegMr = "struct ib_uverbs_reg_mr" {
            response, start, length, hca_va, pd_handle, access_flags
        },
        uverbs::IbUverbsRegMrResp = "struct ib_uverbs_reg_mr_resp" {
            mr_handle, lkey, rkey
        },
        uverbs::IbUverbsDeregMr = "struct ib_uverbs_dereg_mr" {
            mr_handle
        },
        uverbs::IbUverbsCreateCompChannel = "struct ib_uverbs_create_comp_channel" {
            response
        },
        uverbs::IbUverbsCreateCompChannelResp = "struct ib_uverbs_create_comp_channel_resp" {
            fd
        },
        uverbs::IbUverbsCreateCq = "struct ib_uverbs_create_cq" {
            response, user_handle, cqe, comp_vector, comp_channel, reserved
        },
        uverbs::IbUverbsExCreateCq = "struct ib_uverbs_ex_create_cq" {
            user_handle, cqe, comp_vector, comp_channel, comp_mask, flags, reserved
        },
        uverbs::IbUverbsCreateCqResp = "struct ib_uverbs_create_cq_resp" {
            cq_handle, cqe
        },
        uverbs::IbUverbsExCreateCqResp = "struct ib_uverbs_ex_create_cq_resp" {
            base, comp_mask, response_length
        },
        uverbs::IbUverbsDestroyCq = "struct ib_uverbs_destroy_cq" {
            response, cq_handle, reserved
        },
        uverbs::IbUverbsDestroyCqResp = "struct ib_uverbs_destroy_cq_resp" {
            comp_events_reported, async_events_reported
        },
        uverbs::IbUverbsGlobalRoute = "struct ib_uverbs_global_route" {
            dgid, flow_label, sgid_index, hop_limit, traffic_class, reserved
        },
        uverbs::IbUverbsAhAttr = "struct ib_uverbs_ah_attr" {
            grh, dlid, sl, src_path_bits, static_rate, is_global, port_num, reserved
        },
        uverbs::IbUverbsCreateAh = "struct ib_uverbs_create_ah" {
            response, user_handle, pd_handle, reserved, attr
        },
        uverbs::IbUverbsCreateAhResp = "struct ib_uverbs_create_ah_resp" {
            ah_handle
        },
        uverbs::IbUverbsDestroyAh = "struct ib_uverbs_destroy_ah" {
            ah_handle
        },
        uverbs::IbUverbsCreateQp = "struct ib_uverbs_create_qp" {
            response, user_handle, pd_handle, send_cq_handle, recv_cq_handle, srq_handle, max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data, sq_sig_all, qp_type, is_srq, reserved
        },
        uverbs::IbUverbsExCreateQp = "struct ib_uverbs_ex_create_qp" {
            user_handle, pd_handle, send_cq_handle, recv_cq_handle, srq_handle, max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data, sq_sig_all, qp_type, is_srq, reserved, comp_mask, create_flags, rwq_ind_tbl_handle, source_qpn
        },
        uverbs::IbUverbsCreateQpResp = "struct ib_uverbs_create_qp_resp" {
            qp_handle, qpn, max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data, reserved
        },
        uverbs::IbUverbsExCreateQpResp = "struct ib_uverbs_ex_create_qp_resp" {
            base, comp_mask, response_length
        },
        uverbs::IbUverbsQpDest = "struct ib_uverbs_qp_dest" {
            dgid, flow_label, dlid, reserved, sgid_index, hop_limit, traffic_class, sl, src_path_bits, static_rate, is_global, port_num
        },
        uverbs::IbUverbsQueryQp = "struct ib_uverbs_query_qp" {
            response, qp_handle, attr_mask
        },
        uverbs::IbUverbsQueryQpResp = "struct ib_uverbs_query_qp_resp" {
            dest, alt_dest, max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data, qkey, rq_psn, sq_psn, dest_qp_num, qp_access_flags, pkey_index, alt_pkey_index, qp_state, cur_qp_state, path_mtu, path_mig_state, sq_draining, max_rd_atomic, max_dest_rd_atomic, min_rnr_timer, port_num, timeout, retry_cnt, rnr_retry, alt_port_num, alt_timeout, sq_sig_all, reserved
        },
        uverbs::IbUverbsModifyQp = "struct ib_uverbs_modify_qp" {
            dest, alt_dest, qp_handle, attr_mask, qkey, rq_psn, sq_psn, dest_qp_num, qp_access_flags, pkey_index, alt_pkey_index, qp_state, cur_qp_state, path_mtu, path_mig_state, en_sqd_async_notify, max_rd_atomic, max_dest_rd_atomic, min_rnr_timer, port_num, timeout, retry_cnt, rnr_retry, alt_port_num, alt_timeout, reserved
        },
        uverbs::IbUverbsExModifyQp = "struct ib_uverbs_ex_modify_qp" {
            base, rate_limit, reserved
        },
        uverbs::IbUverbsExModifyQpResp = "struct ib_uverbs_ex_modify_qp_resp" {
            comp_mask, response_length
        },
        uverbs::IbUverbsDestroyQp = "struct ib_uverbs_destroy_qp" {
            response, qp_handle, reserved
        },
        uverbs::IbUverbsDestroyQpResp = "struct ib_uverbs_destroy_qp_resp" {
            events_reported
        },
        uverbs::IbUverbsCreateSrq = "struct ib_uverbs_create_srq" {
            response, user_handle, pd_handle, max_wr, max_sge, srq_limit
        },
        uverbs::IbUverbsCreateXsrq = "struct ib_uverbs_create_xsrq" {
            response, user_handle, srq_type, pd_handle, max_wr, max_sge, srq_limit, max_num_tags, xrcd_handle, cq_handle
        },
        uverbs::IbUverbsCreateSrqResp = "struct ib_uverbs_create_srq_resp" {
            srq_handle, max_wr, max_sge, srqn
        },
        uverbs::IbUverbsModifySrq = "struct ib_uverbs_modify_srq" {
            srq_handle, attr_mask, max_wr, srq_limit
        },
        uverbs::IbUverbsQuerySrq = "struct ib_uverbs_query_srq" {
            response, srq_handle, reserved
        },
        uverbs::IbUverbsQuerySrqResp = "struct ib_uverbs_query_srq_resp" {
            max_wr, max_sge, srq_limit, reserved
        },
        uverbs::IbUverbsDestroySrq = "struct ib_uverbs_destroy_srq" {
            response, srq_handle, reserved
        },
        uverbs::IbUverbsDestroySrqResp = "struct ib_uverbs_destroy_srq_resp" {
            events_reported
        },
        ioctl::IbUverbsAttr = "struct ib_uverbs_attr" {
            attr_id, len, flags, elem_id => "attr_data.enum_data.elem_id", elem_reserved => "attr_data.enum_data.reserved", data
        },
        ioctl::IbUverbsIoctlHdr = "struct ib_uverbs_ioctl_hdr" {
            length, object_id, method_id, num_attrs, reserved1, driver_id, reserved2
        },
        ioctl::IbUverbsQueryPortRespEx = "struct ib_uverbs_query_port_resp_ex" {
            legacy_resp, port_cap_flags2, reserved
        },
        ioctl::IbUverbsQpCap = "struct ib_uverbs_qp_cap" {
            max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data
        },
        ioctl::IbUverbsGidEntry = "struct ib_uverbs_gid_entry" {
            gid, gid_index, port_num, gid_type, netdev_ifindex
        },
        mlx5::Mlx5IbAllocUcontextReqV2 = "struct mlx5_ib_alloc_ucontext_req_v2" {
            total_num_bfregs, num_low_latency_bfregs, flags, comp_mask, max_cqe_version, reserved0, reserved1, reserved2, lib_caps
        },
        mlx5::Mlx5IbAllocUcontextResp = "struct mlx5_ib_alloc_ucontext_resp" {
            qp_tab_size, bf_reg_size, tot_bfregs, cache_line_size, max_sq_desc_sz, max_rq_desc_sz, max_send_wqebb, max_recv_wr, max_srq_recv_wr, num_ports, flow_action_flags, comp_mask, response_length, cqe_version, cmds_supp_uhw, eth_min_inline, clock_info_versions, hca_core_clock_offset, log_uar_size, num_uars_per_page, num_dyn_bfregs, dump_fill_mkey
        },
        mlx5::Mlx5IbAllocPdResp = "struct mlx5_ib_alloc_pd_resp" {
            pdn
        },
        mlx5::Mlx5IbTsoCaps = "struct mlx5_ib_tso_caps" {
            max_tso, supported_qpts
        },
        mlx5::Mlx5IbRssCaps = "struct mlx5_ib_rss_caps" {
            rx_hash_fields_mask, rx_hash_function, reserved
        },
        mlx5::Mlx5IbCqeCompCaps = "struct mlx5_ib_cqe_comp_caps" {
            max_num, supported_format
        },
        mlx5::Mlx5PacketPacingCaps = "struct mlx5_packet_pacing_caps" {
            qp_rate_limit_min, qp_rate_limit_max, supported_qpts, cap_flags, reserved
        },
        mlx5::Mlx5IbSwParsingCaps = "struct mlx5_ib_sw_parsing_caps" {
            sw_parsing_offloads, supported_qpts
        },
        mlx5::Mlx5IbStridingRqCaps = "struct mlx5_ib_striding_rq_caps" {
            min_single_stride_log_num_of_bytes, max_single_stride_log_num_of_bytes, min_single_wqe_log_num_of_strides, max_single_wqe_log_num_of_strides, supported_qpts, reserved
        },
        mlx5::Mlx5IbDciStreamsCaps = "struct mlx5_ib_dci_streams_caps" {
            max_log_num_concurent, max_log_num_errored
        },
        mlx5::Mlx5IbQueryDeviceResp = "struct mlx5_ib_query_device_resp" {
            comp_mask, response_length, tso_caps, rss_caps, cqe_comp_caps, packet_pacing_caps, mlx5_ib_support_multi_pkt_send_wqes, flags, sw_parsing_caps, striding_rq_caps, tunnel_offloads_caps, dci_streams_caps, reserved
        },
        mlx5::Mlx5IbCreateCq = "struct mlx5_ib_create_cq" {
            buf_addr, db_addr, cqe_size, cqe_comp_en, cqe_comp_res_format, flags, uar_page_index, reserved0, reserved1
        },
        mlx5::Mlx5IbCreateCqResp = "struct mlx5_ib_create_cq_resp" {
            cqn, reserved
        },
        mlx5::Mlx5IbCreateSrq = "struct mlx5_ib_create_srq" {
            buf_addr, db_addr, flags, reserved0, uidx, reserved1
        },
        mlx5::Mlx5IbCreateSrqResp = "struct mlx5_ib_create_srq_resp" {
            srqn, reserved
        },
        mlx5::Mlx5IbCreateQpDciStreams = "struct mlx5_ib_create_qp_dci_streams" {
            log_num_concurent, log_num_errored
        },
        mlx5::Mlx5IbCreateQp = "struct mlx5_ib_create_qp" {
            buf_addr, db_addr, sq_wqe_count, rq_wqe_count, rq_wqe_shift, flags, uidx, bfreg_index, sq_buf_addr, ece_options, dci_streams, reserved
        },
        mlx5::Mlx5IbCreateQpResp = "struct mlx5_ib_create_qp_resp" {
            bfreg_index, ece_options, comp_mask, tirn, tisn, rqn, sqn, reserved1, tir_icm_addr
        },
        mlx5::Mlx5IbCreateAhResp = "struct mlx5_ib_create_ah_resp" {
            response_length, dmac, reserved
        },
        mlx5::Mlx5IbBurstInfo = "struct mlx5_ib_burst_info" {
            max_burst_sz, typical_pkt_sz, reserved
        },
        mlx5::Mlx5IbModifyQp = "struct mlx5_ib_modify_qp" {
            comp_mask, burst_info, ece_options
        },
        mlx5::Mlx5IbModifyQpResp = "struct mlx5_ib_modify_qp_resp" {
            response_length, dctn, ece_options, reserved
        },
        mlx5::Mlx5IbClockInfo = "struct mlx5_ib_clock_info" {
            sign, resv, nsec, cycles, frac, mult, shift, mask, overflow_period
        },
    }
    consts {
        ioctl::IB_UVERBS_PCF_CLIENT_REG_SUP => "IBV_PORT_CLIENT_REG_SUP",
        ioctl::IB_ATOMIC_HCA => "IBV_ATOMIC_HCA",
        ioctl::UVERBS_METHOD_DM_ALLOC,
        ioctl::UVERBS_METHOD_DM_FREE,
        ioctl::UVERBS_ATTR_ALLOC_DM_HANDLE,
        ioctl::UVERBS_ATTR_ALLOC_DM_LENGTH,
        ioctl::UVERBS_ATTR_ALLOC_DM_ALIGNMENT,
        ioctl::IB_UVERBS_QP_CREATE_FLAGS_KNOWN => "(IB_UVERBS_QP_CREATE_BLOCK_MULTICAST_LOOPBACK | IB_UVERBS_QP_CREATE_SCATTER_FCS | IB_UVERBS_QP_CREATE_CVLAN_STRIPPING | IB_UVERBS_QP_CREATE_PCI_WRITE_END_PADDING | IB_UVERBS_QP_CREATE_SQ_SIG_ALL)",
        ioctl::IB_QP_CREATE_SOURCE_QPN => "IBV_QP_CREATE_SOURCE_QPN",
        mlx5::MLX5_IB_METHOD_DEVX_OBJ_CREATE,
        mlx5::MLX5_IB_ATTR_DEVX_OBJ_CREATE_HANDLE,
        mlx5::MLX5_IB_ATTR_DEVX_OBJ_CREATE_CMD_IN,
        mlx5::MLX5_IB_ATTR_DEVX_OBJ_CREATE_CMD_OUT,
        uverbs::qp_state::RESET => "IBV_QPS_RESET",
        uverbs::qp_state::INIT => "IBV_QPS_INIT",
        uverbs::qp_state::RTR => "IBV_QPS_RTR",
        uverbs::qp_state::RTS => "IBV_QPS_RTS",
        uverbs::qp_state::SQD => "IBV_QPS_SQD",
        uverbs::qp_state::SQE => "IBV_QPS_SQE",
        uverbs::qp_state::ERR => "IBV_QPS_ERR",
        uverbs::qp_type::RC => "IB_UVERBS_QPT_RC",
        uverbs::qp_type::UC => "IB_UVERBS_QPT_UC",
        uverbs::qp_type::UD => "IB_UVERBS_QPT_UD",
        uverbs::qp_type::RAW_PACKET => "IB_UVERBS_QPT_RAW_PACKET",
        uverbs::qp_type::XRC_INI => "IB_UVERBS_QPT_XRC_INI",
        uverbs::qp_type::XRC_TGT => "IB_UVERBS_QPT_XRC_TGT",
        uverbs::qp_type::DRIVER => "IB_UVERBS_QPT_DRIVER",
        uverbs::access::LOCAL_WRITE => "IBV_ACCESS_LOCAL_WRITE",
        uverbs::access::REMOTE_WRITE => "IBV_ACCESS_REMOTE_WRITE",
        uverbs::access::REMOTE_READ => "IBV_ACCESS_REMOTE_READ",
        uverbs::access::REMOTE_ATOMIC => "IBV_ACCESS_REMOTE_ATOMIC",
        uverbs::access::MW_BIND => "IBV_ACCESS_MW_BIND",
        uverbs::access::ZERO_BASED => "IBV_ACCESS_ZERO_BASED",
        uverbs::access::ON_DEMAND => "IBV_ACCESS_ON_DEMAND",
        uverbs::access::HUGETLB => "IBV_ACCESS_HUGETLB",
        uverbs::access::RELAXED_ORDERING => "IBV_ACCESS_RELAXED_ORDERING",
        uverbs::event::CQ_ERR => "IBV_EVENT_CQ_ERR",
        uverbs::event::QP_FATAL => "IBV_EVENT_QP_FATAL",
        uverbs::event::QP_REQ_ERR => "IBV_EVENT_QP_REQ_ERR",
        uverbs::event::QP_ACCESS_ERR => "IBV_EVENT_QP_ACCESS_ERR",
        uverbs::event::COMM_EST => "IBV_EVENT_COMM_EST",
        uverbs::event::SQ_DRAINED => "IBV_EVENT_SQ_DRAINED",
        uverbs::event::SRQ_LIMIT_REACHED => "IBV_EVENT_SRQ_LIMIT_REACHED",
        uverbs::event::QP_LAST_WQE_REACHED => "IBV_EVENT_QP_LAST_WQE_REACHED",
        uverbs::qp_attr::STATE => "IBV_QP_STATE",
        uverbs::qp_attr::CUR_STATE => "IBV_QP_CUR_STATE",
        uverbs::qp_attr::EN_SQD_ASYNC_NOTIFY => "IBV_QP_EN_SQD_ASYNC_NOTIFY",
        uverbs::qp_attr::ACCESS_FLAGS => "IBV_QP_ACCESS_FLAGS",
        uverbs::qp_attr::PKEY_INDEX => "IBV_QP_PKEY_INDEX",
        uverbs::qp_attr::PORT => "IBV_QP_PORT",
        uverbs::qp_attr::QKEY => "IBV_QP_QKEY",
        uverbs::qp_attr::AV => "IBV_QP_AV",
        uverbs::qp_attr::PATH_MTU => "IBV_QP_PATH_MTU",
        uverbs::qp_attr::TIMEOUT => "IBV_QP_TIMEOUT",
        uverbs::qp_attr::RETRY_CNT => "IBV_QP_RETRY_CNT",
        uverbs::qp_attr::RNR_RETRY => "IBV_QP_RNR_RETRY",
        uverbs::qp_attr::RQ_PSN => "IBV_QP_RQ_PSN",
        uverbs::qp_attr::MAX_QP_RD_ATOMIC => "IBV_QP_MAX_QP_RD_ATOMIC",
        uverbs::qp_attr::ALT_PATH => "IBV_QP_ALT_PATH",
        uverbs::qp_attr::MIN_RNR_TIMER => "IBV_QP_MIN_RNR_TIMER",
        uverbs::qp_attr::SQ_PSN => "IBV_QP_SQ_PSN",
        uverbs::qp_attr::MAX_DEST_RD_ATOMIC => "IBV_QP_MAX_DEST_RD_ATOMIC",
        uverbs::qp_attr::PATH_MIG_STATE => "IBV_QP_PATH_MIG_STATE",
        uverbs::qp_attr::CAP => "IBV_QP_CAP",
        uverbs::qp_attr::DEST_QPN => "IBV_QP_DEST_QPN",
        uverbs::qp_attr::KNOWN => "((IBV_QP_DEST_QPN << 1) - 1)",
        uverbs::mtu::MTU_256 => "IBV_MTU_256",
        uverbs::mtu::MTU_512 => "IBV_MTU_512",
        uverbs::mtu::MTU_1024 => "IBV_MTU_1024",
        uverbs::mtu::MTU_2048 => "IBV_MTU_2048",
        uverbs::mtu::MTU_4096 => "IBV_MTU_4096",
        uverbs::port_state::DOWN => "IBV_PORT_DOWN",
        uverbs::port_state::ACTIVE => "IBV_PORT_ACTIVE",
        uverbs::mig_state::MIGRATED => "IBV_MIG_MIGRATED",
        uverbs::mig_state::REARM => "IBV_MIG_REARM",
        uverbs::mig_state::ARMED => "IBV_MIG_ARMED",
        uverbs::IB_USER_VERBS_ABI_VERSION,
        uverbs::IB_USER_VERBS_CMD_THRESHOLD,
        uverbs::IB_USER_VERBS_CMD_COMMAND_MASK,
        uverbs::IB_USER_VERBS_CMD_FLAG_EXTENDED,
        uverbs::IB_USER_VERBS_CMD_GET_CONTEXT,
        uverbs::IB_USER_VERBS_CMD_QUERY_DEVICE,
        uverbs::IB_USER_VERBS_CMD_QUERY_PORT,
        uverbs::IB_USER_VERBS_CMD_ALLOC_PD,
        uverbs::IB_USER_VERBS_CMD_DEALLOC_PD,
        uverbs::IB_USER_VERBS_CMD_CREATE_AH,
        uverbs::IB_USER_VERBS_CMD_MODIFY_AH,
        uverbs::IB_USER_VERBS_CMD_QUERY_AH,
        uverbs::IB_USER_VERBS_CMD_DESTROY_AH,
        uverbs::IB_USER_VERBS_CMD_REG_MR,
        uverbs::IB_USER_VERBS_CMD_REG_SMR,
        uverbs::IB_USER_VERBS_CMD_REREG_MR,
        uverbs::IB_USER_VERBS_CMD_QUERY_MR,
        uverbs::IB_USER_VERBS_CMD_DEREG_MR,
        uverbs::IB_USER_VERBS_CMD_ALLOC_MW,
        uverbs::IB_USER_VERBS_CMD_BIND_MW,
        uverbs::IB_USER_VERBS_CMD_DEALLOC_MW,
        uverbs::IB_USER_VERBS_CMD_CREATE_COMP_CHANNEL,
        uverbs::IB_USER_VERBS_CMD_CREATE_CQ,
        uverbs::IB_USER_VERBS_CMD_RESIZE_CQ,
        uverbs::IB_USER_VERBS_CMD_DESTROY_CQ,
        uverbs::IB_USER_VERBS_CMD_POLL_CQ,
        uverbs::IB_USER_VERBS_CMD_PEEK_CQ,
        uverbs::IB_USER_VERBS_CMD_REQ_NOTIFY_CQ,
        uverbs::IB_USER_VERBS_CMD_CREATE_QP,
        uverbs::IB_USER_VERBS_CMD_QUERY_QP,
        uverbs::IB_USER_VERBS_CMD_MODIFY_QP,
        uverbs::IB_USER_VERBS_CMD_DESTROY_QP,
        uverbs::IB_USER_VERBS_CMD_POST_SEND,
        uverbs::IB_USER_VERBS_CMD_POST_RECV,
        uverbs::IB_USER_VERBS_CMD_ATTACH_MCAST,
        uverbs::IB_USER_VERBS_CMD_DETACH_MCAST,
        uverbs::IB_USER_VERBS_CMD_CREATE_SRQ,
        uverbs::IB_USER_VERBS_CMD_MODIFY_SRQ,
        uverbs::IB_USER_VERBS_CMD_QUERY_SRQ,
        uverbs::IB_USER_VERBS_CMD_DESTROY_SRQ,
        uverbs::IB_USER_VERBS_CMD_POST_SRQ_RECV,
        uverbs::IB_USER_VERBS_CMD_OPEN_XRCD,
        uverbs::IB_USER_VERBS_CMD_CLOSE_XRCD,
        uverbs::IB_USER_VERBS_CMD_CREATE_XSRQ,
        uverbs::IB_USER_VERBS_CMD_OPEN_QP,
        uverbs::IB_USER_VERBS_EX_CMD_QUERY_DEVICE,
        uverbs::IB_USER_VERBS_EX_CMD_CREATE_CQ,
        uverbs::IB_USER_VERBS_EX_CMD_CREATE_QP,
        uverbs::IB_USER_VERBS_EX_CMD_MODIFY_QP,
        uverbs::IB_USER_VERBS_EX_CMD_CREATE_FLOW,
        uverbs::IB_USER_VERBS_EX_CMD_DESTROY_FLOW,
        uverbs::IB_USER_VERBS_EX_CMD_CREATE_WQ,
        uverbs::IB_USER_VERBS_EX_CMD_MODIFY_WQ,
        uverbs::IB_USER_VERBS_EX_CMD_DESTROY_WQ,
        uverbs::IB_USER_VERBS_EX_CMD_CREATE_RWQ_IND_TBL,
        uverbs::IB_USER_VERBS_EX_CMD_DESTROY_RWQ_IND_TBL,
        uverbs::IB_USER_VERBS_EX_CMD_MODIFY_CQ,
        uverbs::IB_UVERBS_CQ_FLAGS_TIMESTAMP_COMPLETION,
        uverbs::IB_UVERBS_CQ_FLAGS_IGNORE_OVERRUN,
        uverbs::IB_UVERBS_CREATE_QP_MASK_IND_TABLE,
        uverbs::IB_UVERBS_CREATE_QP_SUP_COMP_MASK,
        uverbs::IB_UVERBS_WC_SEND,
        uverbs::IB_UVERBS_WC_RDMA_WRITE,
        uverbs::IB_UVERBS_WC_RDMA_READ,
        uverbs::IB_UVERBS_WC_COMP_SWAP,
        uverbs::IB_UVERBS_WC_FETCH_ADD,
        uverbs::IB_UVERBS_WC_BIND_MW,
        uverbs::IB_UVERBS_WC_LOCAL_INV,
        uverbs::IB_UVERBS_WC_TSO,
        uverbs::IB_UVERBS_WR_RDMA_WRITE,
        uverbs::IB_UVERBS_WR_RDMA_WRITE_WITH_IMM,
        uverbs::IB_UVERBS_WR_SEND,
        uverbs::IB_UVERBS_WR_SEND_WITH_IMM,
        uverbs::IB_UVERBS_WR_RDMA_READ,
        uverbs::IB_UVERBS_WR_ATOMIC_CMP_AND_SWP,
        uverbs::IB_UVERBS_WR_ATOMIC_FETCH_AND_ADD,
        uverbs::IB_UVERBS_WR_LOCAL_INV,
        uverbs::IB_UVERBS_WR_BIND_MW,
        uverbs::IB_UVERBS_WR_SEND_WITH_INV,
        uverbs::IB_UVERBS_WR_TSO,
        uverbs::IB_UVERBS_WR_RDMA_READ_WITH_INV,
        uverbs::IB_UVERBS_WR_MASKED_ATOMIC_CMP_AND_SWP,
        uverbs::IB_UVERBS_WR_MASKED_ATOMIC_FETCH_AND_ADD,
        uverbs::IB_UVERBS_DEVICE_RESIZE_MAX_WR,
        uverbs::IB_UVERBS_DEVICE_BAD_PKEY_CNTR,
        uverbs::IB_UVERBS_DEVICE_BAD_QKEY_CNTR,
        uverbs::IB_UVERBS_DEVICE_RAW_MULTI,
        uverbs::IB_UVERBS_DEVICE_AUTO_PATH_MIG,
        uverbs::IB_UVERBS_DEVICE_CHANGE_PHY_PORT,
        uverbs::IB_UVERBS_DEVICE_UD_AV_PORT_ENFORCE,
        uverbs::IB_UVERBS_DEVICE_CURR_QP_STATE_MOD,
        uverbs::IB_UVERBS_DEVICE_SHUTDOWN_PORT,
        uverbs::IB_UVERBS_DEVICE_PORT_ACTIVE_EVENT,
        uverbs::IB_UVERBS_DEVICE_SYS_IMAGE_GUID,
        uverbs::IB_UVERBS_DEVICE_RC_RNR_NAK_GEN,
        uverbs::IB_UVERBS_DEVICE_SRQ_RESIZE,
        uverbs::IB_UVERBS_DEVICE_N_NOTIFY_CQ,
        uverbs::IB_UVERBS_DEVICE_MEM_WINDOW,
        uverbs::IB_UVERBS_DEVICE_UD_IP_CSUM,
        uverbs::IB_UVERBS_DEVICE_XRC,
        uverbs::IB_UVERBS_DEVICE_MEM_MGT_EXTENSIONS,
        uverbs::IB_UVERBS_DEVICE_MEM_WINDOW_TYPE_2A,
        uverbs::IB_UVERBS_DEVICE_MEM_WINDOW_TYPE_2B,
        uverbs::IB_UVERBS_DEVICE_RC_IP_CSUM,
        uverbs::IB_UVERBS_DEVICE_RAW_IP_CSUM,
        uverbs::IB_UVERBS_DEVICE_MANAGED_FLOW_STEERING,
        uverbs::IB_UVERBS_DEVICE_RAW_SCATTER_FCS,
        uverbs::IB_UVERBS_DEVICE_PCI_WRITE_END_PADDING,
        uverbs::IB_UVERBS_RAW_PACKET_CAP_CVLAN_STRIPPING,
        uverbs::IB_UVERBS_RAW_PACKET_CAP_SCATTER_FCS,
        uverbs::IB_UVERBS_RAW_PACKET_CAP_IP_CSUM,
        uverbs::IB_UVERBS_RAW_PACKET_CAP_DELAY_DROP,
        uverbs::IB_QPS_RESET => "IBV_QPS_RESET",
        uverbs::IB_QPS_INIT => "IBV_QPS_INIT",
        uverbs::IB_QPS_RTR => "IBV_QPS_RTR",
        uverbs::IB_QPS_RTS => "IBV_QPS_RTS",
        uverbs::IB_QPS_SQD => "IBV_QPS_SQD",
        uverbs::IB_QPS_SQE => "IBV_QPS_SQE",
        uverbs::IB_QPS_ERR => "IBV_QPS_ERR",
        uverbs::IB_MIG_MIGRATED => "IBV_MIG_MIGRATED",
        uverbs::IB_MIG_REARM => "IBV_MIG_REARM",
        uverbs::IB_MIG_ARMED => "IBV_MIG_ARMED",
        uverbs::IB_MTU_256 => "IBV_MTU_256",
        uverbs::IB_MTU_512 => "IBV_MTU_512",
        uverbs::IB_MTU_1024 => "IBV_MTU_1024",
        uverbs::IB_MTU_2048 => "IBV_MTU_2048",
        uverbs::IB_MTU_4096 => "IBV_MTU_4096",
        uverbs::IB_PORT_NOP => "IBV_PORT_NOP",
        uverbs::IB_PORT_DOWN => "IBV_PORT_DOWN",
        uverbs::IB_PORT_INIT => "IBV_PORT_INIT",
        uverbs::IB_PORT_ARMED => "IBV_PORT_ARMED",
        uverbs::IB_PORT_ACTIVE => "IBV_PORT_ACTIVE",
        uverbs::IB_PORT_ACTIVE_DEFER => "IBV_PORT_ACTIVE_DEFER",
        uverbs::IB_LINK_LAYER_UNSPECIFIED => "IBV_LINK_LAYER_UNSPECIFIED",
        uverbs::IB_LINK_LAYER_INFINIBAND => "IBV_LINK_LAYER_INFINIBAND",
        uverbs::IB_LINK_LAYER_ETHERNET => "IBV_LINK_LAYER_ETHERNET",
        uverbs::IB_QP_STATE => "IBV_QP_STATE",
        uverbs::IB_QP_CUR_STATE => "IBV_QP_CUR_STATE",
        uverbs::IB_QP_EN_SQD_ASYNC_NOTIFY => "IBV_QP_EN_SQD_ASYNC_NOTIFY",
        uverbs::IB_QP_ACCESS_FLAGS => "IBV_QP_ACCESS_FLAGS",
        uverbs::IB_QP_PKEY_INDEX => "IBV_QP_PKEY_INDEX",
        uverbs::IB_QP_PORT => "IBV_QP_PORT",
        uverbs::IB_QP_QKEY => "IBV_QP_QKEY",
        uverbs::IB_QP_AV => "IBV_QP_AV",
        uverbs::IB_QP_PATH_MTU => "IBV_QP_PATH_MTU",
        uverbs::IB_QP_TIMEOUT => "IBV_QP_TIMEOUT",
        uverbs::IB_QP_RETRY_CNT => "IBV_QP_RETRY_CNT",
        uverbs::IB_QP_RNR_RETRY => "IBV_QP_RNR_RETRY",
        uverbs::IB_QP_RQ_PSN => "IBV_QP_RQ_PSN",
        uverbs::IB_QP_MAX_QP_RD_ATOMIC => "IBV_QP_MAX_QP_RD_ATOMIC",
        uverbs::IB_QP_ALT_PATH => "IBV_QP_ALT_PATH",
        uverbs::IB_QP_MIN_RNR_TIMER => "IBV_QP_MIN_RNR_TIMER",
        uverbs::IB_QP_SQ_PSN => "IBV_QP_SQ_PSN",
        uverbs::IB_QP_MAX_DEST_RD_ATOMIC => "IBV_QP_MAX_DEST_RD_ATOMIC",
        uverbs::IB_QP_PATH_MIG_STATE => "IBV_QP_PATH_MIG_STATE",
        uverbs::IB_QP_CAP => "IBV_QP_CAP",
        uverbs::IB_QP_DEST_QPN => "IBV_QP_DEST_QPN",
        uverbs::IB_QP_RATE_LIMIT => "IBV_QP_RATE_LIMIT",
        uverbs::IB_SRQ_MAX_WR => "IBV_SRQ_MAX_WR",
        uverbs::IB_SRQ_LIMIT => "IBV_SRQ_LIMIT",
        uverbs::IB_EVENT_CQ_ERR => "IBV_EVENT_CQ_ERR",
        uverbs::IB_EVENT_QP_FATAL => "IBV_EVENT_QP_FATAL",
        uverbs::IB_EVENT_QP_REQ_ERR => "IBV_EVENT_QP_REQ_ERR",
        uverbs::IB_EVENT_QP_ACCESS_ERR => "IBV_EVENT_QP_ACCESS_ERR",
        uverbs::IB_EVENT_COMM_EST => "IBV_EVENT_COMM_EST",
        uverbs::IB_EVENT_SQ_DRAINED => "IBV_EVENT_SQ_DRAINED",
        uverbs::IB_EVENT_PATH_MIG => "IBV_EVENT_PATH_MIG",
        uverbs::IB_EVENT_PATH_MIG_ERR => "IBV_EVENT_PATH_MIG_ERR",
        uverbs::IB_EVENT_DEVICE_FATAL => "IBV_EVENT_DEVICE_FATAL",
        uverbs::IB_EVENT_PORT_ACTIVE => "IBV_EVENT_PORT_ACTIVE",
        uverbs::IB_EVENT_PORT_ERR => "IBV_EVENT_PORT_ERR",
        uverbs::IB_EVENT_LID_CHANGE => "IBV_EVENT_LID_CHANGE",
        uverbs::IB_EVENT_PKEY_CHANGE => "IBV_EVENT_PKEY_CHANGE",
        uverbs::IB_EVENT_SM_CHANGE => "IBV_EVENT_SM_CHANGE",
        uverbs::IB_EVENT_SRQ_ERR => "IBV_EVENT_SRQ_ERR",
        uverbs::IB_EVENT_SRQ_LIMIT_REACHED => "IBV_EVENT_SRQ_LIMIT_REACHED",
        uverbs::IB_EVENT_QP_LAST_WQE_REACHED => "IBV_EVENT_QP_LAST_WQE_REACHED",
        uverbs::IB_EVENT_CLIENT_REREGISTER => "IBV_EVENT_CLIENT_REREGISTER",
        uverbs::IB_EVENT_GID_CHANGE => "IBV_EVENT_GID_CHANGE",
        uverbs::IB_EVENT_WQ_FATAL => "IBV_EVENT_WQ_FATAL",
        uverbs::RDMA_NODE_IB_CA => "IBV_NODE_CA",
        ioctl::RDMA_IOCTL_MAGIC,
        ioctl::RDMA_VERBS_IOCTL,
        ioctl::UVERBS_ATTR_F_MANDATORY,
        ioctl::UVERBS_ATTR_F_VALID_OUTPUT,
        ioctl::UVERBS_ID_NS_MASK,
        ioctl::UVERBS_ID_NS_SHIFT,
        ioctl::UVERBS_UDATA_DRIVER_DATA_NS,
        ioctl::UVERBS_UDATA_DRIVER_DATA_FLAG,
        ioctl::UVERBS_ATTR_UHW_IN,
        ioctl::UVERBS_ATTR_UHW_OUT,
        ioctl::UVERBS_OBJECT_DEVICE,
        ioctl::UVERBS_OBJECT_PD,
        ioctl::UVERBS_OBJECT_COMP_CHANNEL,
        ioctl::UVERBS_OBJECT_CQ,
        ioctl::UVERBS_OBJECT_QP,
        ioctl::UVERBS_OBJECT_SRQ,
        ioctl::UVERBS_OBJECT_AH,
        ioctl::UVERBS_OBJECT_MR,
        ioctl::UVERBS_OBJECT_MW,
        ioctl::UVERBS_OBJECT_FLOW,
        ioctl::UVERBS_OBJECT_XRCD,
        ioctl::UVERBS_OBJECT_RWQ_IND_TBL,
        ioctl::UVERBS_OBJECT_WQ,
        ioctl::UVERBS_OBJECT_FLOW_ACTION,
        ioctl::UVERBS_OBJECT_DM,
        ioctl::UVERBS_OBJECT_COUNTERS,
        ioctl::UVERBS_OBJECT_ASYNC_EVENT,
        ioctl::UVERBS_METHOD_INVOKE_WRITE,
        ioctl::UVERBS_METHOD_INFO_HANDLES,
        ioctl::UVERBS_METHOD_QUERY_PORT,
        ioctl::UVERBS_METHOD_GET_CONTEXT,
        ioctl::UVERBS_METHOD_QUERY_CONTEXT,
        ioctl::UVERBS_METHOD_QUERY_GID_TABLE,
        ioctl::UVERBS_METHOD_QUERY_GID_ENTRY,
        ioctl::UVERBS_ATTR_CORE_IN,
        ioctl::UVERBS_ATTR_CORE_OUT,
        ioctl::UVERBS_ATTR_WRITE_CMD,
        ioctl::UVERBS_ATTR_QUERY_PORT_PORT_NUM,
        ioctl::UVERBS_ATTR_QUERY_PORT_RESP,
        ioctl::UVERBS_ATTR_GET_CONTEXT_NUM_COMP_VECTORS,
        ioctl::UVERBS_ATTR_GET_CONTEXT_CORE_SUPPORT,
        ioctl::UVERBS_ATTR_QUERY_CONTEXT_NUM_COMP_VECTORS,
        ioctl::UVERBS_ATTR_QUERY_CONTEXT_CORE_SUPPORT,
        ioctl::UVERBS_ATTR_QUERY_GID_TABLE_ENTRY_SIZE,
        ioctl::UVERBS_ATTR_QUERY_GID_TABLE_FLAGS,
        ioctl::UVERBS_ATTR_QUERY_GID_TABLE_RESP_ENTRIES,
        ioctl::UVERBS_ATTR_QUERY_GID_TABLE_RESP_NUM_ENTRIES,
        ioctl::UVERBS_ATTR_QUERY_GID_ENTRY_PORT,
        ioctl::UVERBS_ATTR_QUERY_GID_ENTRY_GID_INDEX,
        ioctl::UVERBS_ATTR_QUERY_GID_ENTRY_FLAGS,
        ioctl::UVERBS_ATTR_QUERY_GID_ENTRY_RESP_ENTRY,
        ioctl::UVERBS_METHOD_PD_DESTROY,
        ioctl::UVERBS_ATTR_DESTROY_PD_HANDLE,
        ioctl::UVERBS_METHOD_DM_MR_REG,
        ioctl::UVERBS_METHOD_MR_DESTROY,
        ioctl::UVERBS_METHOD_ADVISE_MR,
        ioctl::UVERBS_METHOD_QUERY_MR,
        ioctl::UVERBS_METHOD_REG_DMABUF_MR,
        ioctl::UVERBS_ATTR_DESTROY_MR_HANDLE,
        ioctl::UVERBS_METHOD_AH_DESTROY,
        ioctl::UVERBS_ATTR_DESTROY_AH_HANDLE,
        ioctl::UVERBS_METHOD_CQ_CREATE,
        ioctl::UVERBS_METHOD_CQ_DESTROY,
        ioctl::UVERBS_ATTR_CREATE_CQ_HANDLE,
        ioctl::UVERBS_ATTR_CREATE_CQ_CQE,
        ioctl::UVERBS_ATTR_CREATE_CQ_USER_HANDLE,
        ioctl::UVERBS_ATTR_CREATE_CQ_COMP_CHANNEL,
        ioctl::UVERBS_ATTR_CREATE_CQ_COMP_VECTOR,
        ioctl::UVERBS_ATTR_CREATE_CQ_FLAGS,
        ioctl::UVERBS_ATTR_CREATE_CQ_RESP_CQE,
        ioctl::UVERBS_ATTR_CREATE_CQ_EVENT_FD,
        ioctl::UVERBS_ATTR_DESTROY_CQ_HANDLE,
        ioctl::UVERBS_ATTR_DESTROY_CQ_RESP,
        ioctl::UVERBS_METHOD_QP_CREATE,
        ioctl::UVERBS_METHOD_QP_DESTROY,
        ioctl::UVERBS_ATTR_CREATE_QP_HANDLE,
        ioctl::UVERBS_ATTR_CREATE_QP_XRCD_HANDLE,
        ioctl::UVERBS_ATTR_CREATE_QP_PD_HANDLE,
        ioctl::UVERBS_ATTR_CREATE_QP_SRQ_HANDLE,
        ioctl::UVERBS_ATTR_CREATE_QP_SEND_CQ_HANDLE,
        ioctl::UVERBS_ATTR_CREATE_QP_RECV_CQ_HANDLE,
        ioctl::UVERBS_ATTR_CREATE_QP_IND_TABLE_HANDLE,
        ioctl::UVERBS_ATTR_CREATE_QP_USER_HANDLE,
        ioctl::UVERBS_ATTR_CREATE_QP_CAP,
        ioctl::UVERBS_ATTR_CREATE_QP_TYPE,
        ioctl::UVERBS_ATTR_CREATE_QP_FLAGS,
        ioctl::UVERBS_ATTR_CREATE_QP_SOURCE_QPN,
        ioctl::UVERBS_ATTR_CREATE_QP_EVENT_FD,
        ioctl::UVERBS_ATTR_CREATE_QP_RESP_CAP,
        ioctl::UVERBS_ATTR_CREATE_QP_RESP_QP_NUM,
        ioctl::UVERBS_ATTR_DESTROY_QP_HANDLE,
        ioctl::UVERBS_ATTR_DESTROY_QP_RESP,
        ioctl::UVERBS_METHOD_SRQ_CREATE,
        ioctl::UVERBS_METHOD_SRQ_DESTROY,
        ioctl::UVERBS_ATTR_CREATE_SRQ_HANDLE,
        ioctl::UVERBS_ATTR_CREATE_SRQ_PD_HANDLE,
        ioctl::UVERBS_ATTR_CREATE_SRQ_XRCD_HANDLE,
        ioctl::UVERBS_ATTR_CREATE_SRQ_CQ_HANDLE,
        ioctl::UVERBS_ATTR_CREATE_SRQ_USER_HANDLE,
        ioctl::UVERBS_ATTR_CREATE_SRQ_MAX_WR,
        ioctl::UVERBS_ATTR_CREATE_SRQ_MAX_SGE,
        ioctl::UVERBS_ATTR_CREATE_SRQ_LIMIT,
        ioctl::UVERBS_ATTR_CREATE_SRQ_MAX_NUM_TAGS,
        ioctl::UVERBS_ATTR_CREATE_SRQ_TYPE,
        ioctl::UVERBS_ATTR_CREATE_SRQ_EVENT_FD,
        ioctl::UVERBS_ATTR_CREATE_SRQ_RESP_MAX_WR,
        ioctl::UVERBS_ATTR_CREATE_SRQ_RESP_MAX_SGE,
        ioctl::UVERBS_ATTR_CREATE_SRQ_RESP_SRQ_NUM,
        ioctl::UVERBS_ATTR_DESTROY_SRQ_HANDLE,
        ioctl::UVERBS_ATTR_DESTROY_SRQ_RESP,
        ioctl::UVERBS_METHOD_ASYNC_EVENT_ALLOC,
        ioctl::UVERBS_ATTR_ASYNC_EVENT_ALLOC_FD_HANDLE,
        ioctl::IB_UVERBS_ACCESS_OPTIONAL_FIRST,
        ioctl::IB_UVERBS_ACCESS_OPTIONAL_LAST,
        ioctl::IB_UVERBS_CORE_SUPPORT_OPTIONAL_MR_ACCESS,
        ioctl::IB_UVERBS_ACCESS_LOCAL_WRITE,
        ioctl::IB_UVERBS_ACCESS_REMOTE_WRITE,
        ioctl::IB_UVERBS_ACCESS_REMOTE_READ,
        ioctl::IB_UVERBS_ACCESS_REMOTE_ATOMIC,
        ioctl::IB_UVERBS_ACCESS_MW_BIND,
        ioctl::IB_UVERBS_ACCESS_ZERO_BASED,
        ioctl::IB_UVERBS_ACCESS_ON_DEMAND,
        ioctl::IB_UVERBS_ACCESS_HUGETLB,
        ioctl::IB_UVERBS_ACCESS_RELAXED_ORDERING,
        ioctl::IB_UVERBS_ACCESS_OPTIONAL_RANGE,
        ioctl::IB_UVERBS_SRQT_BASIC,
        ioctl::IB_UVERBS_SRQT_XRC,
        ioctl::IB_UVERBS_SRQT_TM,
        ioctl::IB_UVERBS_WQT_RQ,
        ioctl::IB_UVERBS_QPT_RC,
        ioctl::IB_UVERBS_QPT_UC,
        ioctl::IB_UVERBS_QPT_UD,
        ioctl::IB_UVERBS_QPT_RAW_PACKET,
        ioctl::IB_UVERBS_QPT_XRC_INI,
        ioctl::IB_UVERBS_QPT_XRC_TGT,
        ioctl::IB_UVERBS_QPT_DRIVER,
        ioctl::IB_UVERBS_QP_CREATE_BLOCK_MULTICAST_LOOPBACK,
        ioctl::IB_UVERBS_QP_CREATE_SCATTER_FCS,
        ioctl::IB_UVERBS_QP_CREATE_CVLAN_STRIPPING,
        ioctl::IB_UVERBS_QP_CREATE_PCI_WRITE_END_PADDING,
        ioctl::IB_UVERBS_QP_CREATE_SQ_SIG_ALL,
        ioctl::IB_UVERBS_PCF_SM,
        ioctl::IB_UVERBS_PCF_NOTICE_SUP,
        ioctl::IB_UVERBS_PCF_TRAP_SUP,
        ioctl::IB_UVERBS_PCF_AUTO_MIGR_SUP,
        ioctl::IB_UVERBS_PCF_SL_MAP_SUP,
        ioctl::IB_UVERBS_PCF_SYS_IMAGE_GUID_SUP,
        ioctl::IB_UVERBS_PCF_EXTENDED_SPEEDS_SUP,
        ioctl::IB_UVERBS_PCF_CM_SUP,
        ioctl::IB_UVERBS_PCF_DEVICE_MGMT_SUP,
        ioctl::IB_UVERBS_PCF_VENDOR_CLASS_SUP,
        ioctl::IB_UVERBS_PCF_IP_BASED_GIDS,
        ioctl::IB_UVERBS_QPF_GRH_REQUIRED,
        ioctl::RDMA_DRIVER_MLX5,
        ioctl::IB_UVERBS_GID_TYPE_IB,
        ioctl::IB_UVERBS_GID_TYPE_ROCE_V1,
        ioctl::IB_UVERBS_GID_TYPE_ROCE_V2,
        mlx5::MLX5_IB_UVERBS_ABI_VERSION,
        mlx5::MLX5_QP_FLAG_SIGNATURE,
        mlx5::MLX5_QP_FLAG_SCATTER_CQE,
        mlx5::MLX5_QP_FLAG_TUNNEL_OFFLOADS,
        mlx5::MLX5_QP_FLAG_BFREG_INDEX,
        mlx5::MLX5_QP_FLAG_TYPE_DCT,
        mlx5::MLX5_QP_FLAG_TYPE_DCI,
        mlx5::MLX5_QP_FLAG_TIR_ALLOW_SELF_LB_UC,
        mlx5::MLX5_QP_FLAG_TIR_ALLOW_SELF_LB_MC,
        mlx5::MLX5_QP_FLAG_ALLOW_SCATTER_CQE,
        mlx5::MLX5_QP_FLAG_PACKET_BASED_CREDIT_MODE,
        mlx5::MLX5_QP_FLAG_UAR_PAGE_INDEX,
        mlx5::MLX5_QP_FLAG_DCI_STREAM,
        mlx5::MLX5_SRQ_FLAG_SIGNATURE,
        mlx5::MLX5_WQ_FLAG_SIGNATURE,
        mlx5::MLX5_LIB_CAP_4K_UAR,
        mlx5::MLX5_LIB_CAP_DYN_UAR,
        mlx5::MLX5_IB_ALLOC_UCTX_DEVX,
        mlx5::MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_CORE_CLOCK_OFFSET,
        mlx5::MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_DUMP_FILL_MKEY,
        mlx5::MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_ECE,
        mlx5::MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_SQD2RTS,
        mlx5::MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_REAL_TIME_TS,
        mlx5::MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_MKEY_UPDATE_TAG,
        mlx5::MLX5_USER_CMDS_SUPP_UHW_QUERY_DEVICE,
        mlx5::MLX5_USER_CMDS_SUPP_UHW_CREATE_AH,
        mlx5::MLX5_USER_INLINE_MODE_NA,
        mlx5::MLX5_USER_INLINE_MODE_NONE,
        mlx5::MLX5_USER_INLINE_MODE_L2,
        mlx5::MLX5_USER_INLINE_MODE_IP,
        mlx5::MLX5_USER_INLINE_MODE_TCP_UDP,
        mlx5::MLX5_USER_ALLOC_UCONTEXT_FLOW_ACTION_FLAGS_ESP_AES_GCM,
        mlx5::MLX5_USER_ALLOC_UCONTEXT_FLOW_ACTION_FLAGS_ESP_AES_GCM_REQ_METADATA,
        mlx5::MLX5_USER_ALLOC_UCONTEXT_FLOW_ACTION_FLAGS_ESP_AES_GCM_SPI_STEERING,
        mlx5::MLX5_USER_ALLOC_UCONTEXT_FLOW_ACTION_FLAGS_ESP_AES_GCM_FULL_OFFLOAD,
        mlx5::MLX5_USER_ALLOC_UCONTEXT_FLOW_ACTION_FLAGS_ESP_AES_GCM_TX_IV_IS_ESN,
        mlx5::MLX5_IB_CQE_RES_FORMAT_HASH,
        mlx5::MLX5_IB_CQE_RES_FORMAT_CSUM,
        mlx5::MLX5_IB_CQE_RES_FORMAT_CSUM_STRIDX,
        mlx5::MLX5_IB_QUERY_DEV_RESP_FLAGS_CQE_128B_COMP,
        mlx5::MLX5_IB_QUERY_DEV_RESP_FLAGS_CQE_128B_PAD,
        mlx5::MLX5_IB_QUERY_DEV_RESP_PACKET_BASED_CREDIT_MODE,
        mlx5::MLX5_IB_QUERY_DEV_RESP_FLAGS_SCAT2CQE_DCT,
        mlx5::MLX5_IB_ALLOW_MPW,
        mlx5::MLX5_IB_SUPPORT_EMPW,
        mlx5::MLX5_IB_CREATE_CQ_FLAGS_CQE_128B_PAD,
        mlx5::MLX5_IB_CREATE_CQ_FLAGS_UAR_PAGE_INDEX,
        mlx5::MLX5_IB_CREATE_CQ_FLAGS_REAL_TIME_TS,
        mlx5::MLX5_IB_CREATE_QP_RESP_MASK_TIRN,
        mlx5::MLX5_IB_CREATE_QP_RESP_MASK_TISN,
        mlx5::MLX5_IB_CREATE_QP_RESP_MASK_RQN,
        mlx5::MLX5_IB_CREATE_QP_RESP_MASK_SQN,
        mlx5::MLX5_IB_CREATE_QP_RESP_MASK_TIR_ICM_ADDR,
        mlx5::MLX5_IB_MMAP_REGULAR_PAGE,
        mlx5::MLX5_IB_MMAP_GET_CONTIGUOUS_PAGES,
        mlx5::MLX5_IB_MMAP_WC_PAGE,
        mlx5::MLX5_IB_MMAP_NC_PAGE,
        mlx5::MLX5_IB_MMAP_CORE_CLOCK,
        mlx5::MLX5_IB_MMAP_ALLOC_WC,
        mlx5::MLX5_IB_MMAP_CLOCK_INFO,
        mlx5::MLX5_IB_MMAP_DEVICE_MEM,
        mlx5::MLX5_IB_CLOCK_INFO_KERNEL_UPDATING,
        mlx5::MLX5_IB_CLOCK_INFO_V1,
        mlx5::MLX5_IB_OBJECT_DEVX,
        mlx5::MLX5_IB_OBJECT_DEVX_OBJ,
        mlx5::MLX5_IB_OBJECT_DEVX_UMEM,
        mlx5::MLX5_IB_OBJECT_FLOW_MATCHER,
        mlx5::MLX5_IB_OBJECT_DEVX_ASYNC_CMD_FD,
        mlx5::MLX5_IB_OBJECT_DEVX_ASYNC_EVENT_FD,
        mlx5::MLX5_IB_OBJECT_VAR,
        mlx5::MLX5_IB_OBJECT_PP,
        mlx5::MLX5_IB_OBJECT_UAR,
        mlx5::MLX5_IB_OBJECT_STEERING_ANCHOR,
        mlx5::MLX5_IB_METHOD_DEVX_OTHER,
        mlx5::MLX5_IB_METHOD_DEVX_QUERY_UAR,
        mlx5::MLX5_IB_METHOD_DEVX_QUERY_EQN,
        mlx5::MLX5_IB_METHOD_DEVX_SUBSCRIBE_EVENT,
        mlx5::MLX5_IB_ATTR_DEVX_OTHER_CMD_IN,
        mlx5::MLX5_IB_ATTR_DEVX_OTHER_CMD_OUT,
        mlx5::MLX5_IB_METHOD_DEVX_OBJ_DESTROY,
        mlx5::MLX5_IB_METHOD_DEVX_OBJ_MODIFY,
        mlx5::MLX5_IB_METHOD_DEVX_OBJ_QUERY,
        mlx5::MLX5_IB_ATTR_DEVX_OBJ_DESTROY_HANDLE,
        mlx5::MLX5_IB_ATTR_DEVX_OBJ_MODIFY_HANDLE,
        mlx5::MLX5_IB_ATTR_DEVX_OBJ_MODIFY_CMD_IN,
        mlx5::MLX5_IB_ATTR_DEVX_OBJ_MODIFY_CMD_OUT,
        mlx5::MLX5_IB_ATTR_DEVX_OBJ_QUERY_HANDLE,
        mlx5::MLX5_IB_ATTR_DEVX_OBJ_QUERY_CMD_IN,
        mlx5::MLX5_IB_ATTR_DEVX_OBJ_QUERY_CMD_OUT,
        mlx5::MLX5_IB_ATTR_DEVX_QUERY_UAR_USER_IDX,
        mlx5::MLX5_IB_ATTR_DEVX_QUERY_UAR_DEV_IDX,
        mlx5::MLX5_IB_ATTR_DEVX_SUBSCRIBE_EVENT_FD_HANDLE,
        mlx5::MLX5_IB_ATTR_DEVX_SUBSCRIBE_EVENT_OBJ_HANDLE,
        mlx5::MLX5_IB_ATTR_DEVX_SUBSCRIBE_EVENT_TYPE_NUM_LIST,
        mlx5::MLX5_IB_ATTR_DEVX_SUBSCRIBE_EVENT_FD_NUM,
        mlx5::MLX5_IB_ATTR_DEVX_SUBSCRIBE_EVENT_COOKIE,
        mlx5::MLX5_IB_METHOD_DEVX_UMEM_REG,
        mlx5::MLX5_IB_METHOD_DEVX_UMEM_DEREG,
        mlx5::MLX5_IB_ATTR_DEVX_UMEM_REG_HANDLE,
        mlx5::MLX5_IB_ATTR_DEVX_UMEM_REG_ADDR,
        mlx5::MLX5_IB_ATTR_DEVX_UMEM_REG_LEN,
        mlx5::MLX5_IB_ATTR_DEVX_UMEM_REG_ACCESS,
        mlx5::MLX5_IB_ATTR_DEVX_UMEM_REG_OUT_ID,
        mlx5::MLX5_IB_ATTR_DEVX_UMEM_REG_PGSZ_BITMAP,
        mlx5::MLX5_IB_ATTR_DEVX_UMEM_REG_DMABUF_FD,
        mlx5::MLX5_IB_ATTR_DEVX_UMEM_DEREG_HANDLE,
        mlx5::MLX5_IB_METHOD_DEVX_ASYNC_EVENT_FD_ALLOC,
        mlx5::MLX5_IB_ATTR_DEVX_ASYNC_EVENT_FD_ALLOC_HANDLE,
        mlx5::MLX5_IB_ATTR_DEVX_ASYNC_EVENT_FD_ALLOC_FLAGS,
        mlx5::MLX5_IB_UAPI_DEVX_CR_EV_CH_FLAGS_OMIT_DATA,
        mlx5::MLX5_IB_METHOD_UAR_OBJ_ALLOC,
        mlx5::MLX5_IB_METHOD_UAR_OBJ_DESTROY,
        mlx5::MLX5_IB_ATTR_UAR_OBJ_ALLOC_HANDLE,
        mlx5::MLX5_IB_ATTR_UAR_OBJ_ALLOC_TYPE,
        mlx5::MLX5_IB_ATTR_UAR_OBJ_ALLOC_MMAP_OFFSET,
        mlx5::MLX5_IB_ATTR_UAR_OBJ_ALLOC_MMAP_LENGTH,
        mlx5::MLX5_IB_ATTR_UAR_OBJ_ALLOC_PAGE_ID,
        mlx5::MLX5_IB_ATTR_UAR_OBJ_DESTROY_HANDLE,
        mlx5::MLX5_IB_UAPI_UAR_ALLOC_TYPE_BF,
        mlx5::MLX5_IB_UAPI_UAR_ALLOC_TYPE_NC,
        mlx5::MLX5_IB_METHOD_PD_QUERY,
        mlx5::MLX5_IB_ATTR_QUERY_PD_HANDLE,
        mlx5::MLX5_IB_ATTR_QUERY_PD_RESP_PDN,
        mlx5::MLX5_IB_METHOD_QUERY_PORT,
        mlx5::MLX5_IB_ATTR_QUERY_PORT_PORT_NUM,
        mlx5::MLX5_IB_ATTR_QUERY_PORT,
        mlx5::MLX5_IB_ATTR_QUERY_CONTEXT_RESP_UCTX,
    }
}

/// A scratch directory removed on drop (also when an assertion fails).
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        let dir =
            std::env::temp_dir().join(format!("mlx5-ffi-header-check-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn cc() -> Command {
    Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".to_owned()))
}

/// Fails with the Debian package name if a header cannot be included.
fn require_headers(dir: &std::path::Path) {
    for (header, package) in HEADERS {
        let src = dir.join("probe.c");
        std::fs::write(&src, format!("#include <{header}>\n")).unwrap();
        let out = cc()
            .args(["-fsyntax-only", "-x", "c"])
            .arg(&src)
            .output()
            .unwrap_or_else(|e| {
                panic!("cannot run the C compiler `cc` ({e}); install the Debian package gcc")
            });
        assert!(
            out.status.success(),
            "header <{header}> is missing or broken; install the Debian package {package}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn layouts_and_constants_match_installed_headers() {
    let t = table();
    assert!(
        t.errors.is_empty(),
        "field tiling errors:\n{}",
        t.errors.join("\n")
    );

    let tmp = TempDir::new();
    let dir = &tmp.0;
    require_headers(dir);

    let mut program = String::from("#include <stdio.h>\n#include <stddef.h>\n");
    for (header, _) in HEADERS {
        writeln!(program, "#include <{header}>").unwrap();
    }
    write!(program, "int main(void) {{\n{}  return 0;\n}}\n", t.c_body).unwrap();
    let src = dir.join("abi_check.c");
    let exe = dir.join("abi_check");
    std::fs::write(&src, &program).unwrap();
    let out = cc().arg("-o").arg(&exe).arg(&src).output().expect("run cc");
    assert!(
        out.status.success(),
        "compiling the check program failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).output().expect("run the check program");
    assert!(
        run.status.success(),
        "check program failed: {:?}",
        run.status
    );

    let stdout = String::from_utf8(run.stdout).unwrap();
    let got: Vec<&str> = stdout.lines().collect();
    assert_eq!(got.len(), t.expected.len(), "line count differs");
    let mismatches: Vec<String> = got
        .iter()
        .zip(&t.expected)
        .filter(|(c, rust)| *c != *rust)
        .map(|(c, rust)| format!("  C header: {c}\n  Rust:     {rust}"))
        .collect();
    println!(
        "header_check: {} structs, {} fields, {} constants checked against the installed headers",
        t.structs, t.fields, t.consts
    );
    assert!(
        mismatches.is_empty(),
        "{} mismatches:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
}
