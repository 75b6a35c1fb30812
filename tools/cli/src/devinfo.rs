//! `mlx5 devices` and `mlx5 info`: what is there, and what this driver can do with it.

use std::fmt::Write as _;

use mlx5::qp::sq_geometry;
use mlx5::{Context, QpType};
use mlx5_emu::{EmuConfig, Emulator};

/// The rows of `mlx5 devices`: (name, node GUID, where).
pub fn device_rows(emu_only: bool) -> (Vec<(String, String, String)>, Option<String>) {
    let mut rows = Vec::new();
    let mut note = None;
    if !emu_only {
        match mlx5::devices() {
            Ok(list) => {
                for d in list {
                    let guid = d.node_guid.replace(':', "");
                    rows.push((d.name, guid, d.dev_path.display().to_string()));
                }
            }
            Err(e) => note = Some(format!("no real RDMA devices: {e}")),
        }
    }
    let emu = Emulator::new(EmuConfig::default());
    for i in 0..emu.num_hcas() {
        if let Some(h) = emu.hca_info(i) {
            rows.push((
                format!("{} (emulated)", h.name),
                format!("{:016x}", h.node_guid),
                "in-process mlx5-emu".to_owned(),
            ));
        }
    }
    (rows, note)
}

/// `mlx5 devices`, laid out as `ibv_devices` plus a column saying where the device is.
pub fn list_devices(emu_only: bool) -> Result<(), String> {
    let (rows, note) = device_rows(emu_only);
    let mut s = String::new();
    let _ = writeln!(s, "    {:<24}\t   node GUID    \tpath", "device");
    let _ = writeln!(s, "    {:<24}\t----------------\t----", "------");
    for (name, guid, path) in rows {
        let _ = writeln!(s, "    {name:<24}\t{guid}\t{path}");
    }
    print!("{s}");
    if let Some(n) = note {
        eprintln!("note: {n}");
    }
    Ok(())
}

/// Largest value of a capability the driver accepts for `qp_type`, read back from the limit
/// error the driver's own geometry check gives for an impossible request.
fn driver_limit(qp_type: QpType, attr: &str, desc: u32, wqebb: u32) -> Option<u64> {
    let (sge, inline, wr) = match attr {
        "max_send_sge" => (u32::MAX, 0, 1),
        "max_inline_data" => (1, u32::MAX, 1),
        _ => (1, 0, u32::MAX),
    };
    match sq_geometry(qp_type, wr, sge, inline, desc, wqebb) {
        Err(mlx5::Error::Limit { attr: a, limit, .. }) if a == attr => Some(limit),
        _ => None,
    }
}

fn port_state(s: u8) -> &'static str {
    match s {
        1 => "PORT_DOWN (1)",
        2 => "PORT_INIT (2)",
        3 => "PORT_ARMED (3)",
        4 => "PORT_ACTIVE (4)",
        5 => "PORT_ACTIVE_DEFER (5)",
        _ => "unknown",
    }
}

fn mtu_bytes(e: u8) -> u32 {
    if (1..=5).contains(&e) { 128 << e } else { 0 }
}

/// The text of `mlx5 info` for an open context.
pub fn info_text(name: &str, ctx: &Context, verbose: bool) -> Result<String, String> {
    let attr = ctx.device_attr();
    let raw = &attr.raw;
    let ucx = ctx.ucontext();
    let mut s = String::new();
    let _ = writeln!(s, "hca_id:\t{name}");
    let _ = writeln!(s, "\ttransport:\t\t\tInfiniBand (0)");
    let _ = writeln!(s, "\tfw_ver:\t\t\t\t{}", attr.fw_version());
    let g = attr.node_guid;
    let _ = writeln!(
        s,
        "\tnode_guid:\t\t\t{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}",
        g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]
    );
    let _ = writeln!(s, "\tvendor_id:\t\t\t{:#06x}", raw.vendor_id);
    let _ = writeln!(s, "\tvendor_part_id:\t\t\t{}", raw.vendor_part_id);
    let _ = writeln!(s, "\thw_ver:\t\t\t\t{:#x}", raw.hw_ver);
    let _ = writeln!(s, "\tphys_port_cnt:\t\t\t{}", raw.phys_port_cnt);
    let port = ctx.query_port(1).map_err(|e| format!("QUERY_PORT: {e}"))?;
    let _ = writeln!(s, "\t\tport:\t1");
    let _ = writeln!(s, "\t\t\tstate:\t\t\t{}", port_state(port.state));
    let _ = writeln!(
        s,
        "\t\t\tactive_mtu:\t\t{} ({})",
        mtu_bytes(port.active_mtu),
        port.active_mtu
    );
    let _ = writeln!(s, "\t\t\tport_lid:\t\t{}", port.lid);
    let _ = writeln!(
        s,
        "\t\t\tlink_layer:\t\t{}",
        if port.is_roce() {
            "Ethernet"
        } else {
            "InfiniBand"
        }
    );
    if verbose {
        for (k, v) in [
            ("max_mr_size", format!("{:#x}", raw.max_mr_size)),
            ("page_size_cap", format!("{:#x}", raw.page_size_cap)),
            ("max_qp", raw.max_qp.to_string()),
            ("max_qp_wr", raw.max_qp_wr.to_string()),
            (
                "device_cap_flags",
                format!("{:#010x}", raw.device_cap_flags),
            ),
            ("max_sge", raw.max_sge.to_string()),
            ("max_sge_rd", raw.max_sge_rd.to_string()),
            ("max_cq", raw.max_cq.to_string()),
            ("max_cqe", raw.max_cqe.to_string()),
            ("max_mr", raw.max_mr.to_string()),
            ("max_pd", raw.max_pd.to_string()),
            ("max_qp_rd_atom", raw.max_qp_rd_atom.to_string()),
            ("max_res_rd_atom", raw.max_res_rd_atom.to_string()),
            ("max_qp_init_rd_atom", raw.max_qp_init_rd_atom.to_string()),
            ("atomic_cap", raw.atomic_cap.to_string()),
            ("max_srq", raw.max_srq.to_string()),
            ("max_srq_wr", raw.max_srq_wr.to_string()),
            ("max_srq_sge", raw.max_srq_sge.to_string()),
            ("max_pkeys", raw.max_pkeys.to_string()),
            ("num_comp_vectors", ctx.num_comp_vectors().to_string()),
        ] {
            let _ = writeln!(s, "\t{:<32}{v}", format!("{k}:"));
        }
        let _ = writeln!(s, "\tmlx5 ucontext:");
        for (k, v) in [
            ("bf_reg_size", ucx.bf_reg_size.to_string()),
            ("tot_bfregs", ucx.tot_bfregs.to_string()),
            ("cache_line_size", ucx.cache_line_size.to_string()),
            ("max_sq_desc_sz", ucx.max_sq_desc_sz.to_string()),
            ("max_rq_desc_sz", ucx.max_rq_desc_sz.to_string()),
            ("max_send_wqebb", ucx.max_send_wqebb.to_string()),
            ("max_recv_wr", ucx.max_recv_wr.to_string()),
            ("cqe_version", ctx.cqe_version().to_string()),
            ("uar mode", format!("{:?}", ctx.uar_mode())),
        ] {
            let _ = writeln!(s, "\t\t{k}: {v}");
        }
    }
    let desc = u32::from(ucx.max_sq_desc_sz);
    let wqebb = ucx.max_send_wqebb;
    let _ = writeln!(
        s,
        "\tlimits derived by this driver (max_sq_desc_sz {desc}, max_send_wqebb {wqebb}):"
    );
    let _ = writeln!(
        s,
        "\t\tQP  max_inline_data  max_send_sge  max_send_wr (1 SGE)"
    );
    for (t, label) in [(QpType::Rc, "RC"), (QpType::Uc, "UC"), (QpType::Ud, "UD")] {
        let cell = |attr| {
            driver_limit(t, attr, desc, wqebb).map_or_else(|| "?".to_owned(), |v| v.to_string())
        };
        let _ = writeln!(
            s,
            "\t\t{label}  {:<15}  {:<12}  {}",
            cell("max_inline_data"),
            cell("max_send_sge"),
            cell("max_send_wr")
        );
    }
    let _ = writeln!(s, "\t\tWQE size per configuration (RC, 128 WRs):");
    let _ = writeln!(s, "\t\t  sge  inline  wqe_size  WQEBBs  ring WQEBBs");
    for (sge, inline) in [
        (1, 0),
        (1, 28),
        (1, 60),
        (1, 220),
        (1, 236),
        (2, 0),
        (4, 0),
        (8, 0),
    ] {
        match sq_geometry(QpType::Rc, 128, sge, inline, desc, wqebb) {
            Ok(g) => {
                let _ = writeln!(
                    s,
                    "\t\t  {sge:<3}  {inline:<6}  {:<8}  {:<6}  {}",
                    g.wqe_size,
                    g.wqe_size / 64,
                    g.wqe_cnt
                );
            }
            Err(e) => {
                let _ = writeln!(s, "\t\t  {sge:<3}  {inline:<6}  refused: {e}");
            }
        }
    }
    Ok(s)
}

/// `mlx5 info [-d DEV] [-v]`.
pub fn info(dev: Option<&str>, verbose: bool, force_emu: bool) -> Result<(), String> {
    if !force_emu {
        if let Ok(list) = mlx5::devices() {
            let found = match dev {
                Some(n) => list.into_iter().find(|d| d.name == n),
                None => list.into_iter().next(),
            };
            if let Some(d) = found {
                let ctx = d.open().map_err(|e| format!("{}: {e}", d.name))?;
                print!("{}", info_text(&d.name, &ctx, verbose)?);
                return Ok(());
            }
        }
    }
    let emu = Emulator::new(EmuConfig::default());
    let idx = match dev {
        None => 0,
        Some(n) => (0..emu.num_hcas())
            .find(|&i| emu.hca_info(i).is_some_and(|h| h.name == n))
            .ok_or_else(|| format!("no device {n:?}"))?,
    };
    let name = emu
        .hca_info(idx)
        .map_or_else(|| "mlx5_0".to_owned(), |h| h.name);
    let surface = emu.open(idx).map_err(|e| format!("emulator: {e:?}"))?;
    let ctx = Context::open(surface).map_err(|e| format!("emulated context: {e}"))?;
    print!(
        "{}",
        info_text(&format!("{name} (emulated)"), &ctx, verbose)?
    );
    Ok(())
}
