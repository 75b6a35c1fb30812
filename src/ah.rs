//! Address handles for UD sends: the 48-byte address vector is built here once and copied into
//! every UD WQE (with the destination QPN and Q_Key set per WR).

use mlx5_ffi::ioctl::IB_UVERBS_GID_TYPE_ROCE_V2;
use mlx5_ffi::mlx5::MLX5_USER_CMDS_SUPP_UHW_CREATE_AH;
use mlx5_ffi::uverbs::{IbUverbsAhAttr, IbUverbsCreateAh, IbUverbsDestroyAh, IbUverbsGlobalRoute};
use mlx5_hw::types::{Be16, Be32};
use mlx5_hw::wqe::{AV_GRH_PRESENT, DQP_EXTENDED_AV, DatagramSeg};

use crate::error::{Error, Result};
use crate::pd::Pd;
use crate::uverbs;
use mlx5_ffi::cmd::cmds;

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
    /// [`Context::id`](crate::Context) of `pd`, by value: a send queue compares it with its own
    /// in one instruction when the AH is used in a UD work request.
    #[allow(
        dead_code,
        reason = "read by the UD send path once the send queue keeps its id"
    )]
    ctx_id: u64,
    handle: Option<u32>,
    av: DatagramSeg,
    attr: AhAttr,
}

impl Ah {
    /// Create an address handle. On IB the AV is built in user space. On RoCE ports (as
    /// libmlx5) the address must be global, the source GID's type decides whether the AV
    /// carries a UDP source port (RoCE v2 only), and the kernel is asked for the destination
    /// MAC with CREATE_AH.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a RoCE address without GRH; [`Error::Unsupported`] on a
    /// RoCE port when the kernel's CREATE_AH returns no MAC; [`Error::Uverbs`] naming
    /// CREATE_AH, QUERY_PORT or the GID query of the source GID index.
    pub fn new(pd: &Pd, attr: AhAttr) -> Result<Self> {
        let ctx = pd.context();
        let port = ctx.query_port(attr.port_num)?;
        let roce = port.is_roce();
        let Some(grh) = attr.grh.filter(|_| roce) else {
            if roce {
                return Err(Error::InvalidArgument {
                    attr: "grh",
                    reason: "RoCE addresses must be global (is_global)",
                });
            }
            let av = build_av(&attr, AvLink::Ib);
            return Ok(Self {
                pd: pd.clone(),
                ctx_id: ctx.id(),
                handle: None,
                av,
                attr,
            });
        };
        // As libmlx5: the UDP source port only for a RoCE v2 source GID (v1 has no UDP header).
        let sgid = ctx.query_gid_entry(attr.port_num, u32::from(grh.sgid_index))?;
        let udp_sport = (sgid.gid_type == IB_UVERBS_GID_TYPE_ROCE_V2)
            .then(|| roce_udp_sport(grh.flow_label, random_u16));
        // The destination MAC comes from the kernel's CREATE_AH (its neighbour resolution);
        // without it libmlx5 asks netlink, which this driver does not do.
        if ctx.ucontext().cmds_supp_uhw & MLX5_USER_CMDS_SUPP_UHW_CREATE_AH == 0 {
            return Err(Error::Unsupported {
                what: "RoCE address handles need a kernel whose CREATE_AH returns the destination MAC",
            });
        }
        let cmd = IbUverbsCreateAh {
            response: 0,
            user_handle: 0,
            pd_handle: pd.inner.handle,
            reserved: 0,
            attr: attr.to_uverbs(),
        };
        let (r, m) = uverbs::write::<cmds::CreateAh>(ctx.surface(), &cmd, &())?;
        let av = build_av(
            &attr,
            AvLink::Roce {
                dmac: m.dmac,
                udp_sport,
            },
        );
        Ok(Self {
            pd: pd.clone(),
            ctx_id: ctx.id(),
            handle: Some(r.ah_handle),
            av,
            attr,
        })
    }

    /// The device context the AH was created in.
    pub fn context(&self) -> &crate::context::Context {
        self.pd.context()
    }

    /// The identity of the AH's context (see [`Context::same_as`](crate::Context::same_as)),
    /// for the one-compare check in the UD send path.
    #[inline]
    pub(crate) fn context_id(&self) -> u64 {
        self.ctx_id
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
/// (docs/datapath.md §1.9); 0 = no limit for MAX and rates without a code.
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

/// The link-layer part of an address vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AvLink {
    /// InfiniBand: LID-routed; the GRH is optional (bit 30 of `grh_gid_fl`).
    Ib,
    /// RoCE: always global; the destination MAC and, for a RoCE v2 source GID only, the UDP
    /// source port (`None` for RoCE v1: `rlid` stays 0).
    Roce {
        /// Destination MAC (CREATE_AH's answer).
        dmac: [u8; 6],
        /// UDP source port of RoCE v2 packets.
        udp_sport: Option<u16>,
    },
}

/// Lowest UDP source port of RoCE v2 packets (`IB_ROCE_UDP_ENCAP_VALID_PORT_MIN`).
pub const ROCE_UDP_SPORT_MIN: u16 = 0xC000;

/// The RoCE v2 UDP source port of an address with `flow_label` (verbs.h
/// `ibv_flow_label_to_udp_sport`): the low 14 bits of the flow label XOR its high 6 bits, in
/// 0xC000..=0xFFFF. Flow label 0 has no port of its own: libmlx5 picks a random one per address
/// handle (spreading flows over ECMP paths), and so does this driver, with `random`.
pub fn roce_udp_sport(flow_label: u32, random: impl FnOnce() -> u16) -> u16 {
    let fl = flow_label & 0xF_FFFF;
    if fl == 0 {
        return ROCE_UDP_SPORT_MIN | (random() & 0x3FFF);
    }
    ROCE_UDP_SPORT_MIN | ((fl & 0x3FFF) ^ (fl >> 14)) as u16
}

/// A random 16-bit number (the per-process random keys of std's hasher, fed with a counter
/// and the time): good enough to spread UDP source ports, no extra dependency.
fn random_u16() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(N.fetch_add(1, Ordering::Relaxed));
    if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(t.as_nanos());
    }
    h.finish() as u16
}

/// Build the 48-byte address vector for `attr` as libmlx5's `mlx5_create_ah` does
/// (docs/datapath.md §1.9). IB: DLID, SL (bits 3:0) and path bits, GRH bit 30 when global.
/// RoCE: SL as Ethernet priority in bits 3:1, the destination MAC, `rlid` = the UDP source
/// port for RoCE v2 source GIDs (0 for v1), never the GRH bit (RoCE packets always carry
/// one). `dqp_dct` has the extended-AV flag; the QPN and Q_Key are set per WR.
pub fn build_av(attr: &AhAttr, link: AvLink) -> DatagramSeg {
    let mut av = DatagramSeg::zeroed();
    av.dqp_dct = Be32::new(DQP_EXTENDED_AV);
    let rate = static_rate_code(attr.static_rate) << 4;
    let roce = match link {
        AvLink::Roce { dmac, udp_sport } => {
            av.rmac = dmac;
            av.stat_rate_sl = rate | ((attr.sl & 7) << 1);
            av.rlid = Be16::new(udp_sport.unwrap_or(0));
            true
        }
        AvLink::Ib => {
            av.stat_rate_sl = rate | (attr.sl & 0xF);
            av.fl_mlid = attr.src_path_bits & 0x7F;
            av.rlid = Be16::new(attr.dlid);
            false
        }
    };
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
            self.pd.inner.ctx.destroy::<cmds::DestroyAh>(&cmd);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::IntoBytes;

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
        let av = build_av(&attr, AvLink::Ib);
        let b = av.as_bytes();
        assert_eq!(&b[8..16], &[0x80, 0, 0, 0, 0x85, 0x03, 0x12, 0x34]);
        assert_eq!(&b[28..32], &[0, 0, 0, 0], "no GRH");
        let g = route([0xfe; 16], 0xABCDE, 2, 64, 7);
        let av = build_av(
            &AhAttr {
                grh: Some(g),
                ..attr
            },
            AvLink::Ib,
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
        let dmac = [2, 3, 4, 5, 6, 7];
        let sport = roce_udp_sport(g.flow_label, || unreachable!("flow label given"));
        let av = build_av(
            &attr,
            AvLink::Roce {
                dmac,
                udp_sport: Some(sport),
            },
        );
        let b = av.as_bytes();
        assert_eq!(b[12], 0xF0 | (6 << 1), "rate code 15 (100G), priority 6");
        assert_eq!(b[13], 0, "no path bits on RoCE");
        // 0x12345: low 14 bits 0x2345 ^ high 6 bits 0x04 = 0x2341.
        assert_eq!(&b[14..16], &0xE341u16.to_be_bytes(), "UDP source port");
        assert_eq!(&b[20..26], &dmac);
        assert_eq!(
            &b[28..32],
            &((1u32 << 20) | 0x12345).to_be_bytes(),
            "no GRH bit on RoCE"
        );
        // RoCE v1 source GID: no UDP header, rlid stays 0 (the DLID is ignored).
        let v1 = build_av(
            &attr,
            AvLink::Roce {
                dmac,
                udp_sport: None,
            },
        );
        let b1 = v1.as_bytes();
        assert_eq!(&b1[14..16], &[0, 0]);
        assert_eq!((&b1[..14], &b1[16..]), (&b[..14], &b[16..]));
        assert_eq!(static_rate_code(0), 0);
        assert_eq!(static_rate_code(2), 7);
        assert_eq!(static_rate_code(200), 0);
    }

    #[test]
    fn udp_source_port_from_the_flow_label_or_random() {
        // Every flow label maps into 0xC000..=0xFFFF, the high 6 bits folded into the low 14.
        for fl in [1u32, 0x3FFF, 0x4000, 0xF_FFFF, 0xFFF0_0001] {
            let p = roce_udp_sport(fl, || unreachable!());
            let f = fl & 0xF_FFFF;
            assert_eq!(u32::from(p), 0xC000 | ((f & 0x3FFF) ^ (f >> 14)), "{fl:#x}");
        }
        // Flow label 0: the random source decides, inside the valid range.
        assert_eq!(roce_udp_sport(0, || 0x1234), 0xD234);
        assert_eq!(roce_udp_sport(0, || 0xFFFF), 0xFFFF);
        let ports: std::collections::HashSet<u16> =
            (0..64).map(|_| roce_udp_sport(0, random_u16)).collect();
        assert!(ports.iter().all(|&p| p >= ROCE_UDP_SPORT_MIN));
        assert!(ports.len() > 32, "random ports: {ports:?}");
    }
}
