//! Address handles for UD sends: the 48-byte address vector is built here once and copied into
//! every UD WQE (with the destination QPN and Q_Key set per WR).

use mlx5_ffi::mlx5::Mlx5IbCreateAhResp;
use mlx5_ffi::uverbs::{
    IB_USER_VERBS_CMD_CREATE_AH, IB_USER_VERBS_CMD_DESTROY_AH, IbUverbsAhAttr, IbUverbsCreateAh,
    IbUverbsCreateAhResp, IbUverbsDestroyAh, IbUverbsGlobalRoute,
};
use mlx5_hw::types::{Be16, Be32};
use mlx5_hw::wqe::{AV_GRH_PRESENT, DQP_EXTENDED_AV, DatagramSeg};
use zerocopy::IntoBytes;

use crate::error::{Error, Result};
use crate::pd::Pd;
use crate::uverbs::{RespBuf, write_cmd};

/// Global routing (GRH) part of an address: mandatory on RoCE.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GlobalRoute {
    /// Destination GID.
    pub dgid: [u8; 16],
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Source GID index.
    pub sgid_index: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
}

/// Address attributes (`struct ibv_ah_attr`), used for AHs and for connecting RC/UC QPs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AhAttr {
    /// Destination LID (IB).
    pub dlid: u16,
    /// Service level.
    pub sl: u8,
    /// Source path bits.
    pub src_path_bits: u8,
    /// Static rate (`enum ibv_rate`, 0 = max).
    pub static_rate: u8,
    /// Local port (1-based).
    pub port_num: u8,
    /// GRH, if global.
    pub grh: Option<GlobalRoute>,
}

impl AhAttr {
    pub(crate) fn to_uverbs(self) -> IbUverbsAhAttr {
        let g = self.grh.unwrap_or_default();
        IbUverbsAhAttr {
            grh: IbUverbsGlobalRoute {
                dgid: g.dgid,
                flow_label: g.flow_label,
                sgid_index: g.sgid_index,
                hop_limit: g.hop_limit,
                traffic_class: g.traffic_class,
                reserved: 0,
            },
            dlid: self.dlid,
            sl: self.sl,
            src_path_bits: self.src_path_bits,
            static_rate: self.static_rate,
            is_global: u8::from(self.grh.is_some()),
            port_num: self.port_num,
            reserved: 0,
        }
    }
}

/// An address handle.
#[derive(Debug)]
pub struct Ah {
    pd: Pd,
    handle: Option<u32>,
    av: DatagramSeg,
    attr: AhAttr,
}

impl Ah {
    /// Create an address handle. On RoCE ports (or whenever the kernel accepts it) the kernel
    /// is asked for the destination MAC with CREATE_AH; on IB the AV is built in user space.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a RoCE address without GRH; [`Error::Uverbs`] naming
    /// CREATE_AH or QUERY_PORT.
    pub fn new(pd: &Pd, attr: AhAttr) -> Result<Self> {
        let ctx = pd.context();
        let port = ctx.query_port(attr.port_num)?;
        let roce = port.is_roce();
        if roce && attr.grh.is_none() {
            return Err(Error::InvalidArgument {
                attr: "grh",
                reason: "RoCE addresses must be global (is_global)",
            });
        }
        let mut av = DatagramSeg::zeroed();
        av.dqp_dct = Be32::new(DQP_EXTENDED_AV);
        let mut handle = None;
        if roce {
            let core_len = size_of::<IbUverbsCreateAhResp>();
            let mut resp = RespBuf::new(core_len + size_of::<Mlx5IbCreateAhResp>());
            let cmd = IbUverbsCreateAh {
                response: resp.addr(),
                user_handle: 0,
                pd_handle: pd.inner.handle,
                reserved: 0,
                attr: attr.to_uverbs(),
            };
            write_cmd(
                &*ctx.inner.surface,
                "CREATE_AH",
                IB_USER_VERBS_CMD_CREATE_AH,
                cmd.as_bytes(),
                &[],
                Some(&mut resp),
            )?;
            let r: IbUverbsCreateAhResp = resp.get(0);
            let m: Mlx5IbCreateAhResp = resp.get(core_len);
            handle = Some(r.ah_handle);
            av.rmac = m.dmac;
            av.stat_rate_sl = (attr.sl & 7) << 1;
            let fl = attr.grh.map_or(0, |g| g.flow_label);
            // RoCE v2 UDP source port from the flow label (0xC000..0xFFFF).
            let sport = 0xC000 | ((fl ^ (fl >> 14)) & 0x3FFF) as u16;
            av.rlid = Be16::new(sport);
        } else {
            av.stat_rate_sl = attr.sl & 0xF;
            av.fl_mlid = attr.src_path_bits & 0x7F;
            av.rlid = Be16::new(attr.dlid);
        }
        if let Some(g) = attr.grh {
            let mut w = (u32::from(g.sgid_index) << 20) | (g.flow_label & 0xF_FFFF);
            if !roce {
                w |= AV_GRH_PRESENT;
            }
            av.grh_gid_fl = Be32::new(w);
            av.hop_limit = g.hop_limit;
            av.tclass = g.traffic_class;
            av.rgid = g.dgid;
        }
        Ok(Self {
            pd: pd.clone(),
            handle,
            av,
            attr,
        })
    }

    /// The prebuilt address vector.
    pub fn av(&self) -> &DatagramSeg {
        &self.av
    }

    /// The attributes it was created with.
    pub fn attr(&self) -> &AhAttr {
        &self.attr
    }
}

impl Drop for Ah {
    fn drop(&mut self) {
        if let Some(h) = self.handle {
            let cmd = IbUverbsDestroyAh { ah_handle: h };
            let r = write_cmd(
                &*self.pd.inner.ctx.inner.surface,
                "DESTROY_AH",
                IB_USER_VERBS_CMD_DESTROY_AH,
                cmd.as_bytes(),
                &[],
                None,
            );
            debug_assert!(r.is_ok(), "DESTROY_AH failed: {r:?}");
        }
    }
}
