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
        let mut handle = None;
        let mut dmac = [0u8; 6];
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
                ctx.surface(),
                "CREATE_AH",
                IB_USER_VERBS_CMD_CREATE_AH,
                cmd.as_bytes(),
                &[],
                Some(&mut resp),
            )?;
            let r: IbUverbsCreateAhResp = resp.get(0);
            let m: Mlx5IbCreateAhResp = resp.get(core_len);
            handle = Some(r.ah_handle);
            dmac = m.dmac;
        }
        let av = build_av(&attr, roce, dmac);
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

/// The mlx5 static-rate code (AV `stat_rate_sl` bits 7:4) of an `enum ibv_rate` value
/// (mlx5-datapath.md §1.9); 0 = no limit for MAX and rates without a code.
pub fn static_rate_code(ibv_rate: u8) -> u8 {
    match ibv_rate {
        2 => 7,       // 2.5 Gb/s
        3 => 8,       // 10
        4 => 9,       // 30
        5 => 10,      // 5
        6 => 11,      // 20
        7 => 12,      // 40
        8 => 13,      // 60
        9 => 14,      // 80
        10 => 15,     // 120
        11 => 11,     // 14
        12 => 13,     // 56
        13 => 15,     // 112
        15 | 19 => 9, // 25, 28
        16 => 15,     // 100
        20 => 13,     // 50
        _ => 0,       // MAX, 168, 200, 300, 400, 600, unknown
    }
}

/// Build the 48-byte address vector for `attr` (mlx5-datapath.md §1.9). IB: DLID, SL and path
/// bits, GRH bit 30 when global. RoCE: `rlid` = RoCE v2 UDP source port derived from the flow
/// label (0xC000..=0xFFFF), SL as Ethernet priority in bits 3:1, the destination MAC, no GRH
/// bit. `dqp_dct` has the extended-AV flag; the QPN and Q_Key are set per WR.
pub fn build_av(attr: &AhAttr, roce: bool, dmac: [u8; 6]) -> DatagramSeg {
    let mut av = DatagramSeg::zeroed();
    av.dqp_dct = Be32::new(DQP_EXTENDED_AV);
    let rate = static_rate_code(attr.static_rate) << 4;
    if roce {
        av.rmac = dmac;
        av.stat_rate_sl = rate | ((attr.sl & 7) << 1);
        let fl = attr.grh.map_or(0, |g| g.flow_label);
        let sport = 0xC000 | ((fl ^ (fl >> 14)) & 0x3FFF) as u16;
        av.rlid = Be16::new(sport);
    } else {
        av.stat_rate_sl = rate | (attr.sl & 0xF);
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
    av
}

impl Drop for Ah {
    fn drop(&mut self) {
        if let Some(h) = self.handle {
            let cmd = IbUverbsDestroyAh { ah_handle: h };
            self.pd.inner.ctx.destroy(
                "DESTROY_AH",
                IB_USER_VERBS_CMD_DESTROY_AH,
                cmd.as_bytes(),
                None,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(
        dgid: [u8; 16],
        flow_label: u32,
        sgid_index: u8,
        hop_limit: u8,
        tc: u8,
    ) -> GlobalRoute {
        GlobalRoute {
            dgid,
            flow_label,
            sgid_index,
            hop_limit,
            traffic_class: tc,
        }
    }

    #[test]
    fn ib_av_golden() {
        let attr = AhAttr {
            dlid: 0x1234,
            sl: 5,
            src_path_bits: 3,
            static_rate: 3,
            port_num: 1,
            grh: None,
        };
        let av = build_av(&attr, false, [0; 6]);
        let b = av.as_bytes();
        assert_eq!(&b[8..16], &[0x80, 0, 0, 0, 0x85, 0x03, 0x12, 0x34]);
        assert_eq!(&b[28..32], &[0, 0, 0, 0], "no GRH");
        let g = route([0xfe; 16], 0xABCDE, 2, 64, 7);
        let av = build_av(
            &AhAttr {
                grh: Some(g),
                ..attr
            },
            false,
            [0; 6],
        );
        let b = av.as_bytes();
        assert_eq!((b[26], b[27]), (7, 64));
        assert_eq!(
            &b[28..32],
            &(0x4000_0000u32 | (2 << 20) | 0xABCDE).to_be_bytes()
        );
        assert_eq!(&b[32..48], &[0xfe; 16]);
    }

    #[test]
    fn roce_av_golden() {
        let g = route([1; 16], 0x12345, 1, 255, 0);
        let attr = AhAttr {
            dlid: 0x99,
            sl: 6,
            src_path_bits: 0,
            static_rate: 16,
            port_num: 1,
            grh: Some(g),
        };
        let av = build_av(&attr, true, [2, 3, 4, 5, 6, 7]);
        let b = av.as_bytes();
        assert_eq!(b[12], 0xF0 | (6 << 1), "rate code 15 (100G), priority 6");
        assert_eq!(b[13], 0);
        let sport = u16::from_be_bytes([b[14], b[15]]);
        assert!(sport >= 0xC000, "UDP source port {sport:#x}");
        assert_eq!(&b[20..26], &[2, 3, 4, 5, 6, 7]);
        assert_eq!(
            &b[28..32],
            &((1u32 << 20) | 0x12345).to_be_bytes(),
            "no GRH bit on RoCE"
        );
        assert_eq!(static_rate_code(0), 0);
        assert_eq!(static_rate_code(2), 7);
        assert_eq!(static_rate_code(200), 0);
    }
}
