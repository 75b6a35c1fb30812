//! The context and the device queries: GET_CONTEXT, QUERY_DEVICE (legacy and extended),
//! QUERY_PORT, and the GID table the port reports.

use mlx5_ffi::cmd::cmds;
use mlx5_ffi::ioctl::{
    IB_ATOMIC_HCA, IB_UVERBS_PCF_CLIENT_REG_SUP, IB_UVERBS_PCF_CM_SUP, IB_UVERBS_PCF_IP_BASED_GIDS,
};
use mlx5_ffi::mlx5::{
    MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_CORE_CLOCK_OFFSET,
    MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_DUMP_FILL_MKEY, MLX5_IB_ALLOC_UCTX_DEVX, MLX5_LIB_CAP_DYN_UAR,
    MLX5_USER_CMDS_SUPP_UHW_CREATE_AH, MLX5_USER_CMDS_SUPP_UHW_QUERY_DEVICE,
    Mlx5IbAllocUcontextResp, Mlx5IbClockInfo, Mlx5IbQueryDeviceResp,
};
use mlx5_ffi::uverbs::{
    IB_LINK_LAYER_ETHERNET, IB_LINK_LAYER_INFINIBAND, IB_UVERBS_DEVICE_BAD_PKEY_CNTR,
    IB_UVERBS_DEVICE_BAD_QKEY_CNTR, IB_UVERBS_DEVICE_CHANGE_PHY_PORT,
    IB_UVERBS_DEVICE_MEM_MGT_EXTENSIONS, IB_UVERBS_DEVICE_PORT_ACTIVE_EVENT,
    IB_UVERBS_DEVICE_RC_RNR_NAK_GEN, IB_UVERBS_DEVICE_RESIZE_MAX_WR,
    IB_UVERBS_DEVICE_SYS_IMAGE_GUID, IB_UVERBS_DEVICE_XRC, IbUverbsAsyncEventDesc,
    IbUverbsExQueryDeviceResp, IbUverbsGetContextResp, IbUverbsQueryDeviceResp,
    IbUverbsQueryPortResp, mtu, port_state,
};
use zerocopy::IntoBytes;

use super::{EINVAL, ENOMEM, EOPNOTSUPP, Req, caps, events::new_channel, hca_of};
use crate::Flavour;
use crate::abi::Errno;
use crate::state::{Context, World};
use crate::uar::UarRegion;

/// `IB_PORT_PHYS_STATE_LINK_UP` (the emulated link; not a uverbs constant).
const PHYS_STATE_LINK_UP: u8 = 5;
/// `IB_WIDTH_4X`.
const WIDTH_4X: u8 = 2;
/// `IB_SPEED_EDR` (25 Gb/s per lane).
const SPEED_EDR: u8 = 32;

/// GET_CONTEXT through the write table (the dispatcher handles it before the table, since it
/// creates the context; this entry only names it in the list of implemented commands).
pub(super) fn get_context_cmd(_: &mut World, _: u64, _: &Req) -> Result<(), Errno> {
    Err(EINVAL)
}

/// GET_CONTEXT: the new context's id and whether it is a DEVX context
/// (`MLX5_IB_ALLOC_UCTX_DEVX`: libmlx5 asks for one on every open, and falls back to shorter
/// requests if refused, losing the v2 fields; mlx5_ib on a DEVX-capable device grants it).
pub(super) fn get_context(w: &mut World, hca: usize, r: &Req) -> Result<(u64, bool), Errno> {
    // mlx5_ib_alloc_ucontext_req (8 B) or _req_v2 (16..32 B).
    let inlen = r.drv_in.len();
    let v2 = if inlen == 8 {
        false
    } else if inlen >= 16 {
        true
    } else {
        return Err(EINVAL);
    };
    let d = r.drv::<cmds::GetContext>()?;
    if v2 {
        if d.flags & !MLX5_IB_ALLOC_UCTX_DEVX != 0 {
            return Err(EINVAL);
        }
        if d.comp_mask != 0 || d.reserved0 != 0 || d.reserved1 != 0 || d.reserved2 != 0 {
            return Err(EOPNOTSUPP);
        }
    }
    let max_cqe_version = if v2 { d.max_cqe_version } else { 0 };
    let total = (d.total_num_bfregs.saturating_add(1)) & !1;
    if total == 0 {
        return Err(EINVAL);
    }
    if total > caps::MAX_BFREGS {
        return Err(ENOMEM);
    }
    let low_lat = d.num_low_latency_bfregs;
    if low_lat > total - 1 {
        return Err(EINVAL);
    }
    // Dynamic UARs (MLX5_LIB_CAP_DYN_UAR) when configured and the ioctl framework exists:
    // no static pages; UARs come from the UAR object (tot_bfregs = 0 in the response).
    let lib_caps = if v2 { d.lib_caps } else { 0 };
    let dyn_uar =
        w.cfg.dyn_uar && w.cfg.flavour == Flavour::Modern && lib_caps & MLX5_LIB_CAP_DYN_UAR != 0;
    let total = if dyn_uar { 0 } else { total };
    let uar_pages = (total / 2) as usize;
    let mut uar = UarRegion::new(uar_pages + 2 + super::MAX_DYN_UARS)?;
    uar.set_wake(w.wake.clone());
    // Clock-info page (v1): 1 cycle = 1 ns, mult = 1 << shift.
    let ci = Mlx5IbClockInfo {
        mult: 1 << 10,
        shift: 10,
        mask: (1 << 48) - 1,
        overflow_period: 1 << 40,
        ..Default::default()
    };
    for (i, ch) in ci.as_bytes().chunks(8).enumerate() {
        let mut b = [0u8; 8];
        b.copy_from_slice(ch);
        uar.store(uar_pages + 1, i * 8, b);
    }
    let (async_ch, async_fd) = new_channel(w, size_of::<IbUverbsAsyncEventDesc>())?;
    let cqe_version = max_cqe_version.min(w.cfg.cqe_version).min(1);
    let roce = w.hcas[hca].info.is_roce();
    let core = IbUverbsGetContextResp {
        async_fd: async_fd as u32,
        num_comp_vectors: 1,
    };
    let dr = Mlx5IbAllocUcontextResp {
        qp_tab_size: 1 << caps::LOG_MAX_QP,
        bf_reg_size: w.cfg.bf_reg_size,
        tot_bfregs: total,
        cache_line_size: 64,
        max_sq_desc_sz: caps::MAX_SQ_DESC as u16,
        max_rq_desc_sz: caps::MAX_RQ_DESC as u16,
        max_send_wqebb: caps::MAX_QP_WR,
        max_recv_wr: caps::MAX_QP_WR,
        max_srq_recv_wr: caps::MAX_SRQ_WR,
        num_ports: 1,
        flow_action_flags: 0,
        comp_mask: MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_CORE_CLOCK_OFFSET
            | MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_DUMP_FILL_MKEY,
        response_length: Req::len_for(r.drv_out_len, size_of::<Mlx5IbAllocUcontextResp>()),
        cqe_version,
        // QUERY_DEVICE and CREATE_AH take driver data (mlx5_ib sets both on every port
        // type; CREATE_AH answers with the destination MAC on Ethernet only, and libmlx5
        // asks for it only there).
        cmds_supp_uhw: MLX5_USER_CMDS_SUPP_UHW_QUERY_DEVICE | MLX5_USER_CMDS_SUPP_UHW_CREATE_AH,
        // On Ethernet the minimum inline mode + 1 (ConnectX-5: none -> 1), 0 otherwise.
        eth_min_inline: if roce {
            w.cfg.eth_min_inline.ucontext_value()
        } else {
            0
        },
        clock_info_versions: 1,
        hca_core_clock_offset: caps::CORE_CLOCK_OFFSET,
        log_uar_size: 12,
        num_uars_per_page: 1,
        // mlx5_ib's MLX5_MIN_DYN_BFREGS: two bfregs on each of the dynamic pages a context
        // may map (libmlx5's legacy dynamic UARs, `kernel/devx.rs`).
        num_dyn_bfregs: 2 * super::MAX_DYN_UARS as u32,
        dump_fill_mkey: 0x7fff_ffff,
    };
    let respond = r.respond(&core).and_then(|()| r.respond_drv(&dr));
    if let Err(e) = respond {
        w.channels[async_ch] = None;
        return Err(e);
    }
    if let Some(Some(ch)) = w.channels.get_mut(async_ch) {
        ch.handed_out = true;
    }
    let id = w.next_ctx;
    w.next_ctx += 1;
    w.contexts.insert(
        id,
        Context {
            hca,
            cqe_version,
            tot_bfregs: total,
            num_low_lat: low_lat,
            bfreg_users: vec![0; total as usize],
            uar_pages,
            uar_active: (0..uar_pages).collect(),
            dyn_uar,
            dyn_pages: Default::default(),
            next_dyn: 0,
            uar,
            async_ch,
            comp_by_fd: Default::default(),
            handles: Default::default(),
            next_handle: 0,
            devx: Default::default(),
        },
    );
    Ok((id, v2 && d.flags & MLX5_IB_ALLOC_UCTX_DEVX != 0))
}

/// The legacy QUERY_DEVICE answer of the emulated HCA.
pub(super) fn device_attr(w: &World, ctx: u64) -> IbUverbsQueryDeviceResp {
    let h = &w.hcas[hca_of(w, ctx)];
    IbUverbsQueryDeviceResp {
        fw_ver: h.info.fw_ver_raw,
        node_guid: u64::from_ne_bytes(h.info.node_guid.to_be_bytes()),
        sys_image_guid: u64::from_ne_bytes(h.info.sys_image_guid.to_be_bytes()),
        max_mr_size: u64::MAX,
        page_size_cap: 0xffff_f000,
        vendor_id: h.info.vendor_id,
        vendor_part_id: h.info.vendor_part_id,
        hw_ver: 0,
        max_qp: 1 << caps::LOG_MAX_QP,
        max_qp_wr: caps::MAX_QP_WR,
        // What the emulator implements (`crate::caps`): no memory windows (MEM_WINDOW*), no
        // checksum offloads, no automatic path migration; XRC as the features say.
        device_cap_flags: (if caps::FEATURES.xrc {
            IB_UVERBS_DEVICE_XRC
        } else {
            0
        } | IB_UVERBS_DEVICE_RESIZE_MAX_WR
            | IB_UVERBS_DEVICE_BAD_PKEY_CNTR
            | IB_UVERBS_DEVICE_BAD_QKEY_CNTR
            | IB_UVERBS_DEVICE_CHANGE_PHY_PORT
            | IB_UVERBS_DEVICE_PORT_ACTIVE_EVENT
            | IB_UVERBS_DEVICE_SYS_IMAGE_GUID
            | IB_UVERBS_DEVICE_RC_RNR_NAK_GEN
            | IB_UVERBS_DEVICE_MEM_MGT_EXTENSIONS
            | super::flow::raw_device_caps(h.info.is_roce())) as u32,
        max_sge: caps::MAX_SGE,
        max_sge_rd: caps::MAX_SGE,
        max_cq: 1 << 24,
        max_cqe: caps::MAX_CQE,
        max_mr: 1 << 24,
        max_pd: 1 << 24,
        max_qp_rd_atom: caps::MAX_RD_ATOM,
        max_ee_rd_atom: 0,
        max_res_rd_atom: caps::MAX_RD_ATOM << caps::LOG_MAX_QP,
        max_qp_init_rd_atom: caps::MAX_RD_ATOM,
        max_ee_init_rd_atom: 0,
        atomic_cap: IB_ATOMIC_HCA,
        max_ee: 0,
        max_rdd: 0,
        // Memory windows are not implemented: 0, as the capability flags say.
        max_mw: 0,
        max_raw_ipv6_qp: 0,
        max_raw_ethy_qp: if caps::FEATURES.raw_packet {
            1 << caps::LOG_MAX_QP
        } else {
            0
        },
        max_mcast_grp: 1 << 21,
        max_mcast_qp_attach: 1 << 16,
        max_total_mcast_qp_attach: 1 << 21,
        max_ah: 0x7fff_ffff,
        max_fmr: 0,
        max_map_per_fmr: 0,
        max_srq: 1 << 23,
        max_srq_wr: caps::MAX_SRQ_WR,
        max_srq_sge: caps::MAX_SRQ_SGE,
        max_pkeys: 128,
        local_ca_ack_delay: 16,
        phys_port_cnt: 1,
        reserved: [0; 4],
    }
}

pub(super) fn query_device(w: &mut World, ctx: u64, r: &Req) -> Result<(), Errno> {
    let base = device_attr(w, ctx);
    if !r.ex {
        return r.respond(&base);
    }
    let c = r.core::<cmds::ExQueryDevice>();
    if c.comp_mask != 0 || c.reserved != 0 {
        return Err(EINVAL);
    }
    // Extended answer: no ODP, RSS, tag matching, WQs, device memory (all zero =
    // "not supported", so probing programs skip them).
    let o = IbUverbsExQueryDeviceResp {
        base,
        comp_mask: 0,
        response_length: Req::len_for(r.out_len, size_of::<IbUverbsExQueryDeviceResp>()),
        timestamp_mask: if caps::FEATURES.timestamps {
            (1 << caps::TIMESTAMP_BITS) - 1
        } else {
            0
        },
        hca_core_clock: if caps::FEATURES.timestamps {
            caps::CLOCK_KHZ
        } else {
            0
        },
        raw_packet_caps: super::flow::raw_packet_caps(w.hcas[hca_of(w, ctx)].info.is_roce()),
        ..Default::default()
    };
    // mlx5_ib_query_device_resp: every optional capability (TSO, RSS, CQE compression,
    // packet pacing, multi-packet WQEs, SW parsing, striding RQ, tunnel offloads) zero: not
    // supported; DCI streams as kernel/dc.rs offers them.
    let d = Mlx5IbQueryDeviceResp {
        response_length: Req::len_for(r.drv_out_len, size_of::<Mlx5IbQueryDeviceResp>()),
        packet_pacing_caps: super::flow::packet_pacing_caps(w.hcas[hca_of(w, ctx)].info.is_roce()),
        dci_streams_caps: if caps::FEATURES.dc {
            super::dc::DCI_STREAMS_CAPS
        } else {
            Default::default()
        },
        ..Default::default()
    };
    r.respond(&o)?;
    r.respond_drv(&d)
}

pub(super) fn query_port(w: &mut World, ctx: u64, r: &Req) -> Result<(), Errno> {
    if r.core::<cmds::QueryPort>().port_num != 1 {
        return Err(EINVAL);
    }
    let h = &w.hcas[hca_of(w, ctx)];
    let mut o = IbUverbsQueryPortResp {
        max_msg_sz: 1 << caps::LOG_MAX_MSG,
        gid_tbl_len: h.info.gid_tbl_len(),
        pkey_tbl_len: 1,
        state: port_state::ACTIVE,
        max_mtu: mtu::MTU_4096,
        active_width: WIDTH_4X,
        // 25 Gb/s per lane: 100GbE on a RoCE port.
        active_speed: SPEED_EDR,
        phys_state: PHYS_STATE_LINK_UP,
        ..Default::default()
    };
    if h.info.is_roce() {
        // mlx5_ib on Ethernet: CM supported, IP-based GIDs (the uverbs flag the core adds
        // for ip_gids); no LID, SM or VLs; the active MTU is the largest IB MTU that fits
        // the netdev MTU (1500) minus the RoCE headers: 1024.
        o.port_cap_flags = IB_UVERBS_PCF_CM_SUP | IB_UVERBS_PCF_IP_BASED_GIDS;
        o.active_mtu = mtu::MTU_1024;
        o.link_layer = IB_LINK_LAYER_ETHERNET;
    } else {
        o.port_cap_flags = IB_UVERBS_PCF_CM_SUP | IB_UVERBS_PCF_CLIENT_REG_SUP;
        o.lid = h.info.lid;
        o.sm_lid = 1;
        o.active_mtu = mtu::MTU_4096;
        o.max_vl_num = 4;
        o.subnet_timeout = 18;
        o.link_layer = IB_LINK_LAYER_INFINIBAND;
    }
    r.respond(&o)
}
