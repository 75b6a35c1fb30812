//! The device context: the ucontext opened through a [`UverbsSurface`] with the mlx5 driver data,
//! device/port/GID queries, UAR mapping and doorbell-register (bfreg) assignment, doorbell-record
//! and user-index allocation, completion channels and async events.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

use mlx5_ffi::ioctl::{
    IB_UVERBS_GID_TYPE_IB, IB_UVERBS_GID_TYPE_ROCE_V1, IB_UVERBS_GID_TYPE_ROCE_V2,
    IbUverbsGidEntry, UVERBS_ATTR_QUERY_GID_ENTRY_FLAGS, UVERBS_ATTR_QUERY_GID_ENTRY_GID_INDEX,
    UVERBS_ATTR_QUERY_GID_ENTRY_PORT, UVERBS_ATTR_QUERY_GID_ENTRY_RESP_ENTRY,
    UVERBS_METHOD_QUERY_GID_ENTRY, UVERBS_OBJECT_DEVICE,
};
use mlx5_ffi::mlx5::{
    MLX5_IB_ATTR_UAR_OBJ_ALLOC_HANDLE, MLX5_IB_ATTR_UAR_OBJ_ALLOC_MMAP_LENGTH,
    MLX5_IB_ATTR_UAR_OBJ_ALLOC_MMAP_OFFSET, MLX5_IB_ATTR_UAR_OBJ_ALLOC_PAGE_ID,
    MLX5_IB_ATTR_UAR_OBJ_ALLOC_TYPE, MLX5_IB_ATTR_UAR_OBJ_DESTROY_HANDLE,
    MLX5_IB_METHOD_UAR_OBJ_ALLOC, MLX5_IB_METHOD_UAR_OBJ_DESTROY, MLX5_IB_MMAP_REGULAR_PAGE,
    MLX5_IB_OBJECT_UAR, MLX5_IB_UAPI_UAR_ALLOC_TYPE_BF, MLX5_IB_UAPI_UAR_ALLOC_TYPE_NC,
    MLX5_LIB_CAP_4K_UAR, MLX5_LIB_CAP_DYN_UAR, Mlx5IbAllocUcontextReqV2, Mlx5IbAllocUcontextResp,
    mmap_offset,
};
use mlx5_ffi::surface::UverbsSurface;
use mlx5_ffi::uverbs::{
    IbUverbsAsyncEventDesc, IbUverbsCompEventDesc, IbUverbsCreateCompChannel,
    IbUverbsExQueryDevice, IbUverbsGetContext, IbUverbsQueryDevice, IbUverbsQueryDeviceResp,
    IbUverbsQueryPort, IbUverbsQueryPortResp,
};
use mlx5_hw::doorbell::UAR_SIZE;
use zerocopy::{FromBytes, IntoBytes};

use crate::error::{Errno, Error, Result};
use crate::mem::DbRecPool;
use crate::mem::uar::{UarPage, UarReg};
use crate::uverbs::{self, Ioctl, RespBuf, own_fd};
use mlx5_ffi::cmd::{Command, cmds};

/// How to open a context (the knobs libmlx5 takes from its environment variables).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContextConfig {
    /// Static bfregs to ask for (`MLX5_TOTAL_UUARS`, default 16).
    pub total_bfregs: u32,
    /// Of those, dedicated low-latency ones (`MLX5_NUM_LOW_LAT_UUARS`, default 4). In dynamic-UAR
    /// mode: how many QPs get a dedicated BlueFlame register before the rest share one.
    pub low_latency_bfregs: u32,
    /// Ask for dynamic UARs (`MLX5_LIB_CAP_DYN_UAR`); used if the kernel agrees.
    pub dynamic_uar: bool,
    /// Highest CQE version to ask for (1 = user index in CQEs).
    pub max_cqe_version: u8,
    /// Never use BlueFlame (`MLX5_SHUT_UP_BF`).
    pub no_bf: bool,
}

impl ContextConfig {
    /// The defaults, adjusted by libmlx5's environment variables where they apply:
    /// `MLX5_SHUT_UP_BF` (non-"0": no BlueFlame), `MLX5_TOTAL_UUARS`, `MLX5_NUM_LOW_LAT_UUARS`.
    /// Unparsable values are ignored.
    pub fn from_env() -> Self {
        let mut c = Self::default();
        let var = |k: &str| std::env::var(k).ok();
        if let Some(v) = var("MLX5_SHUT_UP_BF") {
            c.no_bf = v.trim() != "0";
        }
        if let Some(n) = var("MLX5_TOTAL_UUARS").and_then(|v| v.trim().parse().ok()) {
            c.total_bfregs = n;
        }
        if let Some(n) = var("MLX5_NUM_LOW_LAT_UUARS").and_then(|v| v.trim().parse().ok()) {
            c.low_latency_bfregs = n;
        }
        c
    }
}

impl Default for ContextConfig {
    fn default() -> Self {
        Self {
            total_bfregs: 16,
            low_latency_bfregs: 4,
            dynamic_uar: true,
            max_cqe_version: 1,
            no_bf: false,
        }
    }
}

/// Device attributes (`ibv_device_attr`), from QUERY_DEVICE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Firmware version, raw (major << 32 | minor << 16 | subminor).
    pub fw_ver: u64,
    /// Node GUID (network byte order bytes).
    pub node_guid: [u8; 8],
    /// The whole kernel answer, for everything else.
    pub raw: IbUverbsQueryDeviceResp,
}

impl DeviceAttr {
    /// Firmware version as `major.minor.subminor`.
    pub fn fw_version(&self) -> String {
        format!(
            "{}.{}.{}",
            self.fw_ver >> 32,
            (self.fw_ver >> 16) & 0xFFFF,
            self.fw_ver & 0xFFFF
        )
    }
}

/// Port attributes (`ibv_port_attr`), from QUERY_PORT.
///
/// `Debug` names the state, MTU and link layer (`state: ACTIVE (4)`) and leaves out `raw`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PortAttr {
    /// `IB_PORT_*` state (4 = ACTIVE).
    pub state: u8,
    /// Active MTU (`IB_MTU_*`).
    pub active_mtu: u8,
    /// Base LID (IB).
    pub lid: u16,
    /// GID table length.
    pub gid_tbl_len: u32,
    /// 1 = InfiniBand, 2 = Ethernet (RoCE).
    pub link_layer: u8,
    /// The whole kernel answer.
    pub raw: IbUverbsQueryPortResp,
}

impl PortAttr {
    /// RoCE port (Ethernet link layer): addressing needs a GRH.
    pub fn is_roce(&self) -> bool {
        self.link_layer == mlx5_ffi::uverbs::IB_LINK_LAYER_ETHERNET
    }

    /// The port state's name (`ibv_port_state_str`): `"ACTIVE"`, `"DOWN"`, ...
    pub fn state_name(&self) -> &'static str {
        use mlx5_ffi::uverbs as u;
        match u32::from(self.state) {
            u::IB_PORT_NOP => "NOP",
            u::IB_PORT_DOWN => "DOWN",
            u::IB_PORT_INIT => "INIT",
            u::IB_PORT_ARMED => "ARMED",
            u::IB_PORT_ACTIVE => "ACTIVE",
            u::IB_PORT_ACTIVE_DEFER => "ACTIVE_DEFER",
            _ => "unknown",
        }
    }

    /// The link layer's name: `"InfiniBand"`, `"Ethernet"` or `"unspecified"`.
    pub fn link_layer_name(&self) -> &'static str {
        match self.link_layer {
            mlx5_ffi::uverbs::IB_LINK_LAYER_INFINIBAND => "InfiniBand",
            mlx5_ffi::uverbs::IB_LINK_LAYER_ETHERNET => "Ethernet",
            _ => "unspecified",
        }
    }
}

impl core::fmt::Debug for PortAttr {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let mtu = crate::types::Mtu::from_code(self.active_mtu).map(crate::types::Mtu::bytes);
        f.debug_struct("PortAttr")
            .field(
                "state",
                &format_args!("{} ({})", self.state_name(), self.state),
            )
            .field(
                "active_mtu",
                &format_args!("{} ({})", mtu.unwrap_or(0), self.active_mtu),
            )
            .field("lid", &self.lid)
            .field("gid_tbl_len", &self.gid_tbl_len)
            .field(
                "link_layer",
                &format_args!("{} ({})", self.link_layer_name(), self.link_layer),
            )
            .finish_non_exhaustive()
    }
}

/// One GID table entry. `Debug` prints the GID as sysfs does and names the type.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct GidEntry {
    /// The GID (16 bytes, network order).
    pub gid: [u8; 16],
    /// `IB_UVERBS_GID_TYPE_*`: 0 IB, 1 RoCE v1, 2 RoCE v2.
    pub gid_type: u32,
}

impl GidEntry {
    /// The type's name: `"IB"`, `"RoCE v1"`, `"RoCE v2"` or `"unknown"`.
    pub fn type_name(&self) -> &'static str {
        match self.gid_type {
            IB_UVERBS_GID_TYPE_IB => "IB",
            IB_UVERBS_GID_TYPE_ROCE_V1 => "RoCE v1",
            IB_UVERBS_GID_TYPE_ROCE_V2 => "RoCE v2",
            _ => "unknown",
        }
    }
}

impl core::fmt::Debug for GidEntry {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let mut gid = String::with_capacity(39);
        for (i, pair) in self.gid.chunks(2).enumerate() {
            if i > 0 {
                gid.push(':');
            }
            gid.push_str(&format!("{:02x}{:02x}", pair[0], pair[1]));
        }
        f.debug_struct("GidEntry")
            .field("gid", &format_args!("{gid}"))
            .field(
                "gid_type",
                &format_args!("{} ({})", self.type_name(), self.gid_type),
            )
            .finish()
    }
}

/// How UARs are provided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UarMode {
    /// Static UARs mapped at open; the kernel assigns a bfreg per QP.
    Static,
    /// UARs allocated on demand through the mlx5 UAR ioctl object.
    Dynamic,
}

/// A doorbell register handed to a QP.
#[derive(Debug)]
pub(crate) struct BfregGrant {
    pub reg: UarReg,
    pub half: usize,
    pub dedicated: bool,
    pub id: u32,
    /// Value for `mlx5_ib_create_qp.bfreg_index` and whether it is a UAR page id.
    pub create_index: Option<u32>,
}

#[derive(Debug)]
struct DynUar {
    page: Arc<UarPage>,
    handle: u32,
}

#[cfg(test)]
mod tests {
    #[test]
    fn sysfs_gid_parses() {
        let g = super::parse_gid("fe80:0000:0000:0000:0002:c903:00ab:cdef").unwrap();
        assert_eq!(g[0..2], [0xfe, 0x80]);
        assert_eq!(g[8..16], [0x00, 0x02, 0xc9, 0x03, 0x00, 0xab, 0xcd, 0xef]);
        assert!(super::parse_gid("fe80::1").is_none());
    }
}

#[derive(Debug, Default)]
struct UidxState {
    next: u32,
    used: std::collections::BTreeSet<u32>,
}

#[derive(Debug, Default)]
struct UarState {
    /// Static pages by index, mapped lazily.
    static_pages: Vec<Option<Arc<UarPage>>>,
    /// Dynamic BF UARs and how many of their 2 registers are handed out.
    dyn_bf: Vec<(DynUar, u32)>,
    dyn_dedicated_given: u32,
    /// Users of each register id.
    users: std::collections::BTreeMap<u32, u32>,
}

pub(crate) struct ContextInner {
    /// Unique among the contexts of this process (never reused), for the same-context checks.
    pub(crate) id: u64,
    pub(crate) surface: Arc<dyn UverbsSurface>,
    pub(crate) ucx: Mlx5IbAllocUcontextResp,
    pub(crate) config: ContextConfig,
    pub(crate) async_fd: OwnedFd,
    pub(crate) num_comp_vectors: u32,
    pub(crate) attr: DeviceAttr,
    pub(crate) mode: UarMode,
    pub(crate) dbrecs: Arc<DbRecPool>,
    /// The page CQs are armed through (static page 0, or the dynamic NC UAR).
    pub(crate) cq_uar: Arc<UarPage>,
    nc_uar: Option<DynUar>,
    uars: Mutex<UarState>,
    uidx: Mutex<UidxState>,
    /// `/sys/class/infiniband/<dev>` for real devices (GID fallback), if known.
    sysfs_dev: Mutex<Option<std::path::PathBuf>>,
    /// Live memory regions, for scatter-to-CQE copies.
    pub(crate) mrs: Arc<crate::mem::scatter::MrTable>,
    /// `hca_core_clock` (kHz) from EX_QUERY_DEVICE, asked the first time it is needed.
    core_clock_khz: std::sync::OnceLock<u64>,
}

impl core::fmt::Debug for ContextInner {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Context")
            .field("device", &self.surface.describe())
            .field("mode", &self.mode)
            .field("cqe_version", &self.ucx.cqe_version)
            .field("bf_reg_size", &self.ucx.bf_reg_size)
            .finish_non_exhaustive()
    }
}

/// An open device context. Cheap to clone (an `Arc`); every object created from it keeps it
/// alive, so it is closed after its last object.
#[derive(Clone, Debug)]
pub struct Context {
    pub(crate) inner: Arc<ContextInner>,
}

use crate::mem::dma_buf::page_size;

impl Context {
    /// Open a context on `surface` with the default configuration.
    ///
    /// # Errors
    /// The first failing step: GET_CONTEXT, QUERY_DEVICE, UAR allocation or mapping.
    pub fn open(surface: Arc<dyn UverbsSurface>) -> Result<Self> {
        Self::open_with(surface, ContextConfig::default())
    }

    /// Open a context with explicit configuration.
    ///
    /// # Errors
    /// As [`open`](Self::open); [`Error::Limit`] if the bfreg numbers are out of range.
    pub fn open_with(surface: Arc<dyn UverbsSurface>, config: ContextConfig) -> Result<Self> {
        Error::check_limit(
            "total_bfregs",
            config.total_bfregs.into(),
            512,
            "of the static UAR scheme",
        )?;
        Error::check_limit(
            "low_latency_bfregs",
            config.low_latency_bfregs.into(),
            u64::from(config.total_bfregs.saturating_sub(1)),
            "(total_bfregs - 1)",
        )?;
        let total = config.total_bfregs.max(2).next_multiple_of(2);
        let req = Mlx5IbAllocUcontextReqV2 {
            total_num_bfregs: total,
            num_low_latency_bfregs: config.low_latency_bfregs,
            flags: 0,
            comp_mask: 0,
            max_cqe_version: config.max_cqe_version,
            reserved0: 0,
            reserved1: 0,
            reserved2: 0,
            lib_caps: MLX5_LIB_CAP_4K_UAR
                | if config.dynamic_uar {
                    MLX5_LIB_CAP_DYN_UAR
                } else {
                    0
                },
        };
        let (core, ucx) =
            uverbs::write::<cmds::GetContext>(&*surface, &IbUverbsGetContext::default(), &req)?;
        let async_fd = own_fd("GET_CONTEXT", core.async_fd)?;
        if ucx.cqe_version > config.max_cqe_version {
            return Err(Error::BadResponse {
                cmd: "GET_CONTEXT",
                what: "cqe_version above the one asked for",
            });
        }
        if ucx.max_sq_desc_sz < 64 || ucx.max_send_wqebb == 0 {
            return Err(Error::BadResponse {
                cmd: "GET_CONTEXT",
                what: "max_sq_desc_sz/max_send_wqebb missing",
            });
        }
        // Two BlueFlame registers per UAR page from 0x800: each at most 0x400 bytes.
        let bf = ucx.bf_reg_size;
        if bf != 0 && (!bf.is_power_of_two() || !(64..=0x400).contains(&bf)) {
            return Err(Error::BadResponse {
                cmd: "GET_CONTEXT",
                what: "bf_reg_size is not 0 or a power of two in 64..=1024",
            });
        }
        let attr = query_device(&*surface)?;
        let mode = if ucx.tot_bfregs == 0 {
            UarMode::Dynamic
        } else {
            UarMode::Static
        };
        let (cq_uar, nc_uar, static_pages) = match mode {
            UarMode::Static => {
                if ucx.tot_bfregs > 4096 {
                    return Err(Error::BadResponse {
                        cmd: "GET_CONTEXT",
                        what: "tot_bfregs out of range",
                    });
                }
                // 2 usable bfregs per 4 KiB UAR; `num_uars_per_page` UARs per system page
                // (more than 1 on 64 KiB-page systems with 4K UARs).
                let per_page = ucx.num_uars_per_page.clamp(1, 16) as usize;
                let npages = (ucx.tot_bfregs as usize).div_ceil(2).div_ceil(per_page);
                let p0 = map_static(&surface, 0)?;
                let mut pages = vec![None; npages];
                pages[0] = Some(p0.clone());
                (p0, None, pages)
            }
            UarMode::Dynamic => {
                let nc = alloc_dyn_uar(&surface, MLX5_IB_UAPI_UAR_ALLOC_TYPE_NC)?;
                (nc.page.clone(), Some(nc), Vec::new())
            }
        };
        let cache_line = if ucx.cache_line_size == 0 {
            64
        } else {
            ucx.cache_line_size as usize
        };
        let inner = ContextInner {
            id: next_context_id(),
            surface,
            ucx,
            config,
            async_fd,
            num_comp_vectors: core.num_comp_vectors,
            attr,
            mode,
            dbrecs: DbRecPool::new(cache_line),
            cq_uar,
            nc_uar,
            uars: Mutex::new(UarState {
                static_pages,
                ..UarState::default()
            }),
            uidx: Mutex::new(UidxState::default()),
            sysfs_dev: Mutex::new(None),
            mrs: Arc::default(),
            core_clock_khz: std::sync::OnceLock::new(),
        };
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// Whether `self` and `other` are the same device context (clones of one [`Context`]).
    /// Objects handed to each other must share one: see [`Error::ContextMismatch`].
    pub fn same_as(&self, other: &Context) -> bool {
        self.inner.id == other.inner.id
    }

    /// This context's identity, unique in the process and never reused; a copy kept in an
    /// object (an address handle, a send queue) makes the same-context check one compare.
    pub(crate) fn id(&self) -> u64 {
        self.inner.id
    }

    /// `Ok` if `other` (the context of the object called `object`) is this context (the one of
    /// `with`), else [`Error::ContextMismatch`] naming both.
    pub(crate) fn check_same(
        &self,
        object: &'static str,
        other: &Context,
        with: &'static str,
    ) -> Result<()> {
        if self.same_as(other) {
            Ok(())
        } else {
            Err(Error::ContextMismatch { object, with })
        }
    }

    /// The uverbs surface commands go through.
    pub(crate) fn surface(&self) -> &dyn UverbsSurface {
        &*self.inner.surface
    }

    /// Destroy a kernel object from a `Drop`; `true` if the kernel destroyed it.
    ///
    /// On `false` the kernel object may still exist, and with it the device's right to read
    /// and write the memory it was given (queue rings, doorbell records, registered memory):
    /// the caller must then never give that memory back (it leaks it). `EBUSY` would be a
    /// driver bug (children hold their parents, so the kernel never sees a busy object) and
    /// is debug-asserted, except while unwinding; other errnos (a device that went away, a
    /// surface that refuses) are not.
    pub(crate) fn destroy<C: Command<DrvReq = ()>>(&self, req: &C::Req) -> bool {
        let r = uverbs::write::<C>(self.surface(), req, &());
        debug_assert!(
            !matches!(
                r,
                Err(Error::Uverbs {
                    errno: Errno::EBUSY,
                    ..
                })
            ) || std::thread::panicking(),
            "{} failed: {r:?}",
            C::NAME
        );
        r.is_ok()
    }

    /// The device attributes queried at open.
    pub fn device_attr(&self) -> &DeviceAttr {
        &self.inner.attr
    }

    /// The frequency of the HCA's free-running core clock, in kHz (`hca_core_clock` of the
    /// extended device query, `ibv_device_attr_ex`), which CQE timestamps count. Asked once
    /// (EX_QUERY_DEVICE), then remembered.
    ///
    /// # Errors
    /// [`Error::Uverbs`] naming EX_QUERY_DEVICE if the kernel refuses the query;
    /// [`Error::Unsupported`] if the device reports no clock (0 kHz).
    pub fn hca_core_clock_khz(&self) -> Result<u64> {
        if let Some(&khz) = self.inner.core_clock_khz.get() {
            return Ok(khz);
        }
        let (resp, _) = uverbs::write::<cmds::ExQueryDevice>(
            self.surface(),
            &IbUverbsExQueryDevice::default(),
            &(),
        )?;
        if resp.hca_core_clock == 0 {
            return Err(Error::Unsupported {
                what: "CQE timestamps in time: the device reports hca_core_clock 0 kHz",
            });
        }
        Ok(*self
            .inner
            .core_clock_khz
            .get_or_init(|| resp.hca_core_clock))
    }

    /// A CQE timestamp ([`WorkCompletion::timestamp`](crate::WorkCompletion::timestamp), raw
    /// core-clock ticks) in nanoseconds: `raw * 10^6 / hca_core_clock_khz`. Differences of two
    /// converted timestamps are durations on the device's clock; the origin is the device's
    /// (not the Unix epoch).
    ///
    /// # Errors
    /// As [`hca_core_clock_khz`](Self::hca_core_clock_khz) (only on the first call of a
    /// context that fails it; afterwards this is arithmetic).
    pub fn cqe_time_ns(&self, raw: u64) -> Result<u64> {
        Ok(ticks_to_ns(raw, self.hca_core_clock_khz()?))
    }

    /// The extended device query (EX_QUERY_DEVICE) with the mlx5 driver answer, as
    /// `ibv_query_device_ex` needs it (a libibverbs provider fills `ibv_device_attr_ex` from
    /// it). Asked every call.
    ///
    /// # Errors
    /// [`Error::Uverbs`] naming EX_QUERY_DEVICE if the kernel refuses the query.
    pub fn query_device_ex(
        &self,
    ) -> Result<(
        mlx5_ffi::uverbs::IbUverbsExQueryDeviceResp,
        mlx5_ffi::mlx5::Mlx5IbQueryDeviceResp,
    )> {
        uverbs::write::<cmds::ExQueryDevice>(self.surface(), &IbUverbsExQueryDevice::default(), &())
    }

    /// The context's async-event descriptor (from GET_CONTEXT), owned by the context: read
    /// by [`get_async_event`](Self::get_async_event); a provider hands libibverbs a duplicate.
    pub fn async_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.inner.async_fd.as_fd()
    }

    /// The mlx5 ucontext answer (bf_reg_size, tot_bfregs, cqe_version, limits...).
    pub fn ucontext(&self) -> &Mlx5IbAllocUcontextResp {
        &self.inner.ucx
    }

    /// Static or dynamic UARs.
    pub fn uar_mode(&self) -> UarMode {
        self.inner.mode
    }

    /// CQE version in use (0 or 1).
    pub fn cqe_version(&self) -> u8 {
        self.inner.ucx.cqe_version
    }

    /// Number of completion vectors.
    pub fn num_comp_vectors(&self) -> u32 {
        self.inner.num_comp_vectors
    }

    /// A label of the underlying device.
    pub fn describe(&self) -> String {
        self.inner.surface.describe()
    }

    /// QUERY_PORT for `port` (1-based).
    ///
    /// # Errors
    /// [`Error::Uverbs`] naming QUERY_PORT.
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        let cmd = IbUverbsQueryPort {
            response: 0,
            port_num: port,
            reserved: [0; 7],
        };
        let (raw, ()) = uverbs::write::<cmds::QueryPort>(self.surface(), &cmd, &())?;
        Ok(PortAttr {
            state: raw.state,
            active_mtu: raw.active_mtu,
            lid: raw.lid,
            gid_tbl_len: raw.gid_tbl_len,
            link_layer: raw.link_layer,
            raw,
        })
    }

    /// Remember the sysfs directory of the device (`/sys/class/infiniband/<dev>`), used by
    /// [`query_gid`](Self::query_gid) on kernels without the GID ioctl. [`Device::open`]
    /// sets it.
    ///
    /// [`Device::open`]: crate::Device::open
    pub fn set_sysfs_dir(&self, dir: std::path::PathBuf) {
        *self
            .inner
            .sysfs_dev
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(dir);
    }

    /// The GID at `index` of `port`: the QUERY_GID_ENTRY ioctl, or, where the kernel lacks it
    /// and the device's sysfs directory is known, `ports/<port>/gids/<index>`.
    ///
    /// # Errors
    /// As [`query_gid_entry`](Self::query_gid_entry).
    pub fn query_gid(&self, port: u8, index: u32) -> Result<[u8; 16]> {
        self.query_gid_entry(port, index).map(|e| e.gid)
    }

    /// The GID at `index` of `port` with its type (IB, RoCE v1, RoCE v2): the QUERY_GID_ENTRY
    /// ioctl, or the sysfs files `ports/<port>/gids/<index>` and `gid_attrs/types/<index>`.
    ///
    /// # Errors
    /// [`Error::Uverbs`] naming QUERY_GID_ENTRY (`EPROTONOSUPPORT`/`ENOTTY`/`EOPNOTSUPP` on
    /// kernels without the ioctl and no sysfs directory); [`Error::Os`] or
    /// [`Error::BadResponse`] for unreadable or unparsable sysfs files.
    pub fn query_gid_entry(&self, port: u8, index: u32) -> Result<GidEntry> {
        let sysfs = self
            .inner
            .sysfs_dev
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        match (self.query_gid_ioctl(port, index), sysfs) {
            (
                Err(Error::Uverbs {
                    errno: Errno::EPROTONOSUPPORT | Errno::ENOTTY | Errno::EOPNOTSUPP,
                    ..
                }),
                Some(dir),
            ) => {
                let read = |rel: String| {
                    std::fs::read_to_string(dir.join(rel)).map_err(|e| Error::Os {
                        op: "read(sysfs gid)",
                        errno: Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
                    })
                };
                let gid = parse_gid(read(format!("ports/{port}/gids/{index}"))?.trim()).ok_or(
                    Error::BadResponse {
                        cmd: "sysfs gid",
                        what: "not 8 groups of 4 hex digits",
                    },
                )?;
                let ty = read(format!("ports/{port}/gid_attrs/types/{index}")).unwrap_or_default();
                let gid_type = match ty.trim() {
                    "RoCE v2" => IB_UVERBS_GID_TYPE_ROCE_V2,
                    "IB/RoCE v1" if self.query_port(port)?.is_roce() => IB_UVERBS_GID_TYPE_ROCE_V1,
                    _ => IB_UVERBS_GID_TYPE_IB,
                };
                Ok(GidEntry { gid, gid_type })
            }
            (r, _) => r,
        }
    }

    /// A usable RoCE v2 GID of `port` (the first non-zero one, preferring IPv4-mapped
    /// addresses as rdma-core's tools do), or for IB ports the first non-zero GID: `(index, gid)`.
    ///
    /// # Errors
    /// As [`query_port`](Self::query_port) and [`query_gid_entry`](Self::query_gid_entry).
    pub fn find_gid(&self, port: u8) -> Result<Option<(u32, [u8; 16])>> {
        let p = self.query_port(port)?;
        let mut best: Option<(u32, [u8; 16], bool)> = None;
        for i in 0..p.gid_tbl_len.min(256) {
            let Ok(e) = self.query_gid_entry(port, i) else {
                continue;
            };
            if e.gid == [0u8; 16] {
                continue;
            }
            if p.is_roce() && e.gid_type != IB_UVERBS_GID_TYPE_ROCE_V2 {
                continue;
            }
            let v4 = e.gid[..10] == [0u8; 10] && e.gid[10..12] == [0xff, 0xff];
            if best.is_none_or(|(_, _, b)| v4 && !b) {
                best = Some((i, e.gid, v4));
            }
            if !p.is_roce() {
                break;
            }
        }
        Ok(best.map(|(i, g, _)| (i, g)))
    }

    fn query_gid_ioctl(&self, port: u8, index: u32) -> Result<GidEntry> {
        let mut out = RespBuf::new(size_of::<IbUverbsGidEntry>());
        let mut c = Ioctl::new(UVERBS_OBJECT_DEVICE, UVERBS_METHOD_QUERY_GID_ENTRY);
        c.inline_in(
            UVERBS_ATTR_QUERY_GID_ENTRY_PORT,
            &u32::from(port).to_ne_bytes(),
        );
        c.inline_in(UVERBS_ATTR_QUERY_GID_ENTRY_GID_INDEX, &index.to_ne_bytes());
        c.inline_in(UVERBS_ATTR_QUERY_GID_ENTRY_FLAGS, &0u32.to_ne_bytes());
        c.ptr_out(UVERBS_ATTR_QUERY_GID_ENTRY_RESP_ENTRY, &mut out);
        c.execute(&*self.inner.surface, "QUERY_GID_ENTRY")?;
        let e: IbUverbsGidEntry = out.get(0);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(e.gid.as_bytes());
        Ok(GidEntry {
            gid,
            gid_type: e.gid_type,
        })
    }

    /// Create a completion channel (an fd that becomes readable when an armed CQ fires).
    ///
    /// # Errors
    /// [`Error::Uverbs`] naming CREATE_COMP_CHANNEL.
    pub fn create_comp_channel(&self) -> Result<CompChannel> {
        let (r, ()) = uverbs::write::<cmds::CreateCompChannel>(
            self.surface(),
            &IbUverbsCreateCompChannel::default(),
            &(),
        )?;
        Ok(CompChannel {
            fd: own_fd("CREATE_COMP_CHANNEL", r.fd)?,
            ctx: self.clone(),
        })
    }

    /// Read one async event, waiting up to `timeout_ms` (-1: forever). `None` on timeout.
    ///
    /// # Errors
    /// [`Error::Os`] if poll or read fails.
    pub fn get_async_event(&self, timeout_ms: i32) -> Result<Option<AsyncEvent>> {
        let mut buf = [0u8; 16];
        if !read_event(&self.inner.async_fd, &mut buf, timeout_ms)? {
            return Ok(None);
        }
        let d = IbUverbsAsyncEventDesc::read_from_bytes(&buf).map_err(|_| Error::BadResponse {
            cmd: "async event",
            what: "short record",
        })?;
        Ok(Some(AsyncEvent {
            element: d.element,
            event_type: d.event_type,
        }))
    }

    /// Allocate a CQE-v1 user index (24 bits, never 0xFFFFFF). Indices are handed out
    /// round-robin, so a destroyed QP's index is not reused until 2^24 - 1 others were: stale
    /// CQEs of a destroyed QP still in a shared CQ can never be taken for a new QP's.
    pub(crate) fn alloc_uidx(&self) -> Result<u32> {
        const SPACE: u32 = 0xFF_FFFF; // valid indices 0..SPACE
        let mut t = self.inner.uidx.lock().unwrap_or_else(|p| p.into_inner());
        if t.used.len() >= SPACE as usize {
            return Err(Error::Limit {
                attr: "QPs",
                value: u64::from(SPACE) + 1,
                limit: u64::from(SPACE),
                context: "(24-bit CQE user index)",
            });
        }
        loop {
            let i = t.next;
            t.next = (t.next + 1) % SPACE;
            if t.used.insert(i) {
                return Ok(i);
            }
        }
    }

    pub(crate) fn free_uidx(&self, i: u32) {
        let mut t = self.inner.uidx.lock().unwrap_or_else(|p| p.into_inner());
        t.used.remove(&i);
    }

    fn bf_half(&self) -> usize {
        if self.inner.config.no_bf {
            0
        } else {
            self.inner.ucx.bf_reg_size as usize / 2
        }
    }

    /// Choose a doorbell register for a new QP (dynamic mode), before CREATE_QP.
    pub(crate) fn grant_bfreg_dynamic(&self) -> Result<BfregGrant> {
        let inner = &self.inner;
        let mut st = inner.uars.lock().unwrap_or_else(|p| p.into_inner());
        let bf_size = inner.ucx.bf_reg_size as usize;
        if self.bf_half() != 0 && st.dyn_dedicated_given < inner.config.low_latency_bfregs {
            // A dedicated BlueFlame register: two per BF UAR.
            let need_new = st.dyn_bf.last().is_none_or(|(_, used)| *used >= 2);
            if need_new {
                match alloc_dyn_uar(&inner.surface, MLX5_IB_UAPI_UAR_ALLOC_TYPE_BF) {
                    Ok(u) => st.dyn_bf.push((u, 0)),
                    // No write combining: BF UARs are refused; fall back to the shared NC one.
                    Err(Error::Uverbs {
                        errno: Errno::EOPNOTSUPP,
                        ..
                    }) => {
                        return Ok(self.shared_nc_grant(&mut st));
                    }
                    Err(e) => return Err(e),
                }
            }
            let Some((u, used)) = st.dyn_bf.last_mut() else {
                unreachable!("pushed above")
            };
            let reg = u.page.bf_reg(*used as usize, bf_size);
            let id = (u.page.page_id << 1) | *used;
            let page_id = u.page.page_id;
            *used += 1;
            st.dyn_dedicated_given += 1;
            *st.users.entry(id).or_insert(0) += 1;
            return Ok(BfregGrant {
                reg,
                half: bf_size / 2,
                dedicated: true,
                id,
                create_index: Some(page_id),
            });
        }
        Ok(self.shared_nc_grant(&mut st))
    }

    fn shared_nc_grant(&self, st: &mut UarState) -> BfregGrant {
        let page = self.inner.cq_uar.clone();
        let id = page.page_id << 1;
        *st.users.entry(id).or_insert(0) += 1;
        BfregGrant {
            reg: page.bf_reg(0, 0),
            half: 0,
            dedicated: false,
            id,
            create_index: Some(page.page_id),
        }
    }

    /// Map the register the kernel chose in static mode (`bfreg_index` from CREATE_QP).
    pub(crate) fn grant_bfreg_static(&self, table_index: u32) -> Result<BfregGrant> {
        let inner = &self.inner;
        // The kernel reports bfregn / 2 * 4 + bfregn % 2 (4 table entries per UAR, 2 usable).
        let uar = (table_index / 4) as usize;
        let within = table_index % 4;
        if within >= 2 {
            return Err(Error::BadResponse {
                cmd: "CREATE_QP",
                what: "bfreg_index names a fast-path register",
            });
        }
        let bfregn = uar as u32 * 2 + within;
        let per_page = inner.ucx.num_uars_per_page.clamp(1, 16) as usize;
        let (sys_page, uar_in_page) = (uar / per_page, uar % per_page);
        let mut st = inner.uars.lock().unwrap_or_else(|p| p.into_inner());
        if sys_page >= st.static_pages.len() {
            return Err(Error::BadResponse {
                cmd: "CREATE_QP",
                what: "bfreg_index beyond tot_bfregs",
            });
        }
        let page = match &st.static_pages[sys_page] {
            Some(p) => p.clone(),
            None => {
                let p = map_static(&inner.surface, sys_page as u32)?;
                st.static_pages[sys_page] = Some(p.clone());
                p
            }
        };
        let tot = inner.ucx.tot_bfregs;
        let low_lat = inner.config.low_latency_bfregs.min(tot);
        // The last `low_lat` bfregs are the kernel's high class, handed to one QP each.
        // bfreg 0 is doorbell-only (no BlueFlame, no lock); the rest are shared.
        let dedicated = bfregn != 0 && bfregn >= tot - low_lat;
        let half = if dedicated { self.bf_half() } else { 0 };
        let reg = page.bf_reg_in(
            uar_in_page,
            within as usize,
            inner.ucx.bf_reg_size.max(0x100) as usize,
        )?;
        *st.users.entry(bfregn).or_insert(0) += 1;
        Ok(BfregGrant {
            reg,
            half,
            dedicated,
            id: bfregn,
            create_index: None,
        })
    }

    pub(crate) fn release_bfreg(&self, id: u32) {
        let mut st = self.inner.uars.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = st.users.get_mut(&id) {
            *n = n.saturating_sub(1);
        }
    }

    /// How many live QPs use each doorbell register (register id -> QPs). A count above 1 means
    /// those QPs share the register (8-byte doorbells only, no BlueFlame).
    pub fn bfreg_users(&self) -> Vec<(u32, u32)> {
        let st = self.inner.uars.lock().unwrap_or_else(|p| p.into_inner());
        st.users
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(k, v)| (*k, *v))
            .collect()
    }
}

impl Drop for ContextInner {
    fn drop(&mut self) {
        let st = self.uars.get_mut().unwrap_or_else(|p| p.into_inner());
        for (u, _) in st.dyn_bf.drain(..) {
            destroy_dyn_uar(&self.surface, u);
        }
        if let Some(nc) = self.nc_uar.take() {
            destroy_dyn_uar(&self.surface, nc);
        }
    }
}

fn destroy_dyn_uar(surface: &Arc<dyn UverbsSurface>, u: DynUar) {
    let DynUar { page, handle } = u;
    drop(page);
    let mut c = Ioctl::new(MLX5_IB_OBJECT_UAR, MLX5_IB_METHOD_UAR_OBJ_DESTROY);
    c.idr_in(MLX5_IB_ATTR_UAR_OBJ_DESTROY_HANDLE, handle);
    let _ = c.execute(&**surface, "UAR_OBJ_DESTROY");
}

fn query_device(surface: &dyn UverbsSurface) -> Result<DeviceAttr> {
    let (raw, ()) =
        uverbs::write::<cmds::QueryDevice>(surface, &IbUverbsQueryDevice::default(), &())?;
    Ok(DeviceAttr {
        fw_ver: raw.fw_ver,
        node_guid: raw.node_guid.to_ne_bytes(),
        raw,
    })
}

fn map_static(surface: &Arc<dyn UverbsSurface>, index: u32) -> Result<Arc<UarPage>> {
    let ps = page_size();
    let offset = mmap_offset(MLX5_IB_MMAP_REGULAR_PAGE, index) * ps as u64;
    UarPage::map(surface, offset, ps.max(UAR_SIZE), index, true)
}

fn alloc_dyn_uar(surface: &Arc<dyn UverbsSurface>, ty: u32) -> Result<DynUar> {
    let mut off = RespBuf::new(8);
    let mut len = RespBuf::new(4);
    let mut id = RespBuf::new(4);
    let mut c = Ioctl::new(MLX5_IB_OBJECT_UAR, MLX5_IB_METHOD_UAR_OBJ_ALLOC);
    let h = c.idr_new(MLX5_IB_ATTR_UAR_OBJ_ALLOC_HANDLE);
    c.inline_in(MLX5_IB_ATTR_UAR_OBJ_ALLOC_TYPE, &ty.to_ne_bytes());
    c.ptr_out(MLX5_IB_ATTR_UAR_OBJ_ALLOC_MMAP_OFFSET, &mut off);
    c.ptr_out(MLX5_IB_ATTR_UAR_OBJ_ALLOC_MMAP_LENGTH, &mut len);
    c.ptr_out(MLX5_IB_ATTR_UAR_OBJ_ALLOC_PAGE_ID, &mut id);
    let attrs = c.execute(&**surface, "UAR_OBJ_ALLOC")?;
    let handle = attrs.get(h).map(|a| a.data as u32).unwrap_or(0);
    let offset: u64 = off.get(0);
    let length: u32 = len.get(0);
    let page_id: u32 = id.get(0);
    let length = (length as usize).max(UAR_SIZE);
    match UarPage::map(
        surface,
        offset,
        length,
        page_id,
        ty == MLX5_IB_UAPI_UAR_ALLOC_TYPE_BF,
    ) {
        Ok(page) => Ok(DynUar { page, handle }),
        Err(e) => {
            let mut d = Ioctl::new(MLX5_IB_OBJECT_UAR, MLX5_IB_METHOD_UAR_OBJ_DESTROY);
            d.idr_in(MLX5_IB_ATTR_UAR_OBJ_DESTROY_HANDLE, handle);
            let _ = d.execute(&**surface, "UAR_OBJ_DESTROY");
            Err(e)
        }
    }
}

/// Parse a GID as sysfs prints it: `fe80:0000:0000:0000:0002:c903:00ab:cdef`.
fn parse_gid(s: &str) -> Option<[u8; 16]> {
    let mut gid = [0u8; 16];
    let mut n = 0;
    for (i, g) in s.split(':').enumerate() {
        if i >= 8 || g.len() != 4 {
            return None;
        }
        let v = u16::from_str_radix(g, 16).ok()?;
        gid[i * 2..i * 2 + 2].copy_from_slice(&v.to_be_bytes());
        n += 1;
    }
    (n == 8).then_some(gid)
}

/// Wait until `fd` is readable (or `timeout_ms` passes; -1 = forever) and read one record.
/// Returns false on timeout.
pub(crate) fn read_event(fd: &OwnedFd, buf: &mut [u8], timeout_ms: i32) -> Result<bool> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    loop {
        let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
        let t = if timeout_ms < 0 {
            PollTimeout::NONE
        } else {
            PollTimeout::try_from(timeout_ms).unwrap_or(PollTimeout::MAX)
        };
        match poll(&mut fds, t) {
            Ok(0) => return Ok(false),
            Ok(_) => {}
            Err(Errno::EINTR) => continue,
            Err(errno) => {
                return Err(Error::Os {
                    op: "poll(event fd)",
                    errno,
                });
            }
        }
        match nix::unistd::read(fd.as_raw_fd(), buf) {
            Ok(n) if n == buf.len() => return Ok(true),
            Ok(_) => {
                return Err(Error::BadResponse {
                    cmd: "read(event fd)",
                    what: "short event record",
                });
            }
            Err(Errno::EAGAIN | Errno::EINTR) => continue,
            Err(errno) => {
                return Err(Error::Os {
                    op: "read(event fd)",
                    errno,
                });
            }
        }
    }
}

static NEXT_USER_HANDLE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// A process-unique `user_handle` for a new CQ/QP/SRQ (what events report back).
fn next_context_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

pub(crate) fn next_user_handle() -> u64 {
    if let Some(h) = CHOSEN_USER_HANDLE.with(std::cell::Cell::take) {
        return h;
    }
    NEXT_USER_HANDLE.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

std::thread_local! {
    /// The `user_handle` the next CQ/QP/SRQ created on this thread gets ([`with_user_handle`]).
    static CHOSEN_USER_HANDLE: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

/// Run `create` (which creates one CQ, QP or SRQ) with the kernel object's `user_handle`
/// chosen by the caller: the value completion and async events report back
/// ([`CompChannel::get_event`], [`AsyncEvent::element`]). A libibverbs provider passes the
/// address of its `struct ibv_cq`/`ibv_qp`/`ibv_srq`, which is what libibverbs'
/// `ibv_get_cq_event` and `ibv_get_async_event` take the handle for. The choice applies to
/// the first object `create` makes on this thread and is forgotten when `create` returns.
/// Control path only: the data path never reads the handle.
pub fn with_user_handle<R>(handle: u64, create: impl FnOnce() -> R) -> R {
    CHOSEN_USER_HANDLE.with(|c| c.set(Some(handle)));
    let r = create();
    CHOSEN_USER_HANDLE.with(|c| c.set(None));
    r
}

/// `ticks` of a clock running at `khz` kHz, in nanoseconds (saturating at `u64::MAX`; 0 for a
/// 0 kHz clock).
pub fn ticks_to_ns(ticks: u64, khz: u64) -> u64 {
    if khz == 0 {
        return 0;
    }
    let ns = u128::from(ticks) * 1_000_000 / u128::from(khz);
    u64::try_from(ns).unwrap_or(u64::MAX)
}

/// An async event (`struct ibv_async_event`): the element's user handle and `IB_EVENT_*` type.
///
/// `Debug` and `Display` name the event type (`QP_ACCESS_ERR`); [`kind`](Self::kind) gives it
/// typed, [`event_type`](Self::event_type) stays the raw number.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct AsyncEvent {
    /// User handle of the CQ/QP/SRQ (`Cq::user_handle`, `Qp::user_handle`), or the port number.
    pub element: u64,
    /// `IB_EVENT_*` (see `mlx5_ffi::uverbs`), raw; [`kind`](Self::kind) names it.
    pub event_type: u32,
}

impl AsyncEvent {
    /// The event type, typed.
    pub fn kind(&self) -> AsyncEventKind {
        AsyncEventKind::from_raw(self.event_type)
    }
}

impl core::fmt::Debug for AsyncEvent {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("AsyncEvent")
            .field("element", &self.element)
            .field(
                "event_type",
                &format_args!("{} ({})", self.kind(), self.event_type),
            )
            .finish()
    }
}

impl core::fmt::Display for AsyncEvent {
    /// `QP_ACCESS_ERR on QP (user handle 7)`, `PORT_ACTIVE on port 1`.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let k = self.kind();
        match k.element() {
            "port" => write!(f, "{k} on port {}", self.element),
            "device" => write!(f, "{k} on the device"),
            what => write!(f, "{k} on {what} (user handle {})", self.element),
        }
    }
}

/// The type of an [`AsyncEvent`] (`enum ibv_event_type`, the kernel's `IB_EVENT_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AsyncEventKind {
    /// `IB_EVENT_CQ_ERR`: the CQ overran or hit an error; it is unusable.
    CqErr,
    /// `IB_EVENT_QP_FATAL`: the QP went to the error state for a reason not tied to a WQE.
    QpFatal,
    /// `IB_EVENT_QP_REQ_ERR`: invalid request on the responder side (the QP went to error).
    QpReqErr,
    /// `IB_EVENT_QP_ACCESS_ERR`: remote access violation on the responder side (the QP went
    /// to error).
    QpAccessErr,
    /// `IB_EVENT_COMM_EST`: first packet received on a QP in RTR.
    CommEst,
    /// `IB_EVENT_SQ_DRAINED`: the send queue of a QP in SQD has no outstanding messages.
    SqDrained,
    /// `IB_EVENT_PATH_MIG`: the QP migrated to its alternate path.
    PathMig,
    /// `IB_EVENT_PATH_MIG_ERR`: path migration failed.
    PathMigErr,
    /// `IB_EVENT_DEVICE_FATAL`: the device is unusable.
    DeviceFatal,
    /// `IB_EVENT_PORT_ACTIVE`: the port became active.
    PortActive,
    /// `IB_EVENT_PORT_ERR`: the port left the active state.
    PortErr,
    /// `IB_EVENT_LID_CHANGE`: the port's LID changed.
    LidChange,
    /// `IB_EVENT_PKEY_CHANGE`: the port's P_Key table changed.
    PkeyChange,
    /// `IB_EVENT_SM_CHANGE`: the subnet manager changed.
    SmChange,
    /// `IB_EVENT_SRQ_ERR`: the SRQ hit an error.
    SrqErr,
    /// `IB_EVENT_SRQ_LIMIT_REACHED`: the SRQ fell below its armed limit.
    SrqLimitReached,
    /// `IB_EVENT_QP_LAST_WQE_REACHED`: a QP on an SRQ in error has no more WQEs to consume.
    QpLastWqeReached,
    /// `IB_EVENT_CLIENT_REREGISTER`: the SM asks clients to register again.
    ClientReregister,
    /// `IB_EVENT_GID_CHANGE`: the port's GID table changed.
    GidChange,
    /// `IB_EVENT_WQ_FATAL`: a work queue went to error.
    WqFatal,
    /// A number this driver does not know.
    Unknown(u32),
}

/// Every known kind with its raw number, name and the element its handle names.
const EVENT_KINDS: [(AsyncEventKind, u32, &str, &str); 20] = {
    use AsyncEventKind as K;
    use mlx5_ffi::uverbs as u;
    [
        (K::CqErr, u::IB_EVENT_CQ_ERR, "CQ_ERR", "CQ"),
        (K::QpFatal, u::IB_EVENT_QP_FATAL, "QP_FATAL", "QP"),
        (K::QpReqErr, u::IB_EVENT_QP_REQ_ERR, "QP_REQ_ERR", "QP"),
        (
            K::QpAccessErr,
            u::IB_EVENT_QP_ACCESS_ERR,
            "QP_ACCESS_ERR",
            "QP",
        ),
        (K::CommEst, u::IB_EVENT_COMM_EST, "COMM_EST", "QP"),
        (K::SqDrained, u::IB_EVENT_SQ_DRAINED, "SQ_DRAINED", "QP"),
        (K::PathMig, u::IB_EVENT_PATH_MIG, "PATH_MIG", "QP"),
        (
            K::PathMigErr,
            u::IB_EVENT_PATH_MIG_ERR,
            "PATH_MIG_ERR",
            "QP",
        ),
        (
            K::DeviceFatal,
            u::IB_EVENT_DEVICE_FATAL,
            "DEVICE_FATAL",
            "device",
        ),
        (
            K::PortActive,
            u::IB_EVENT_PORT_ACTIVE,
            "PORT_ACTIVE",
            "port",
        ),
        (K::PortErr, u::IB_EVENT_PORT_ERR, "PORT_ERR", "port"),
        (K::LidChange, u::IB_EVENT_LID_CHANGE, "LID_CHANGE", "port"),
        (
            K::PkeyChange,
            u::IB_EVENT_PKEY_CHANGE,
            "PKEY_CHANGE",
            "port",
        ),
        (K::SmChange, u::IB_EVENT_SM_CHANGE, "SM_CHANGE", "port"),
        (K::SrqErr, u::IB_EVENT_SRQ_ERR, "SRQ_ERR", "SRQ"),
        (
            K::SrqLimitReached,
            u::IB_EVENT_SRQ_LIMIT_REACHED,
            "SRQ_LIMIT_REACHED",
            "SRQ",
        ),
        (
            K::QpLastWqeReached,
            u::IB_EVENT_QP_LAST_WQE_REACHED,
            "QP_LAST_WQE_REACHED",
            "QP",
        ),
        (
            K::ClientReregister,
            u::IB_EVENT_CLIENT_REREGISTER,
            "CLIENT_REREGISTER",
            "port",
        ),
        (K::GidChange, u::IB_EVENT_GID_CHANGE, "GID_CHANGE", "port"),
        (K::WqFatal, u::IB_EVENT_WQ_FATAL, "WQ_FATAL", "WQ"),
    ]
};

impl AsyncEventKind {
    /// The kind of raw `IB_EVENT_*` number `raw` ([`Unknown`](Self::Unknown) if none).
    pub fn from_raw(raw: u32) -> Self {
        EVENT_KINDS
            .iter()
            .find(|e| e.1 == raw)
            .map_or(AsyncEventKind::Unknown(raw), |e| e.0)
    }

    /// The raw `IB_EVENT_*` number.
    pub fn raw(self) -> u32 {
        match self {
            AsyncEventKind::Unknown(n) => n,
            k => EVENT_KINDS
                .iter()
                .find(|e| e.0 == k)
                .map_or(u32::MAX, |e| e.1),
        }
    }

    /// The name without the `IB_EVENT_` prefix (`"QP_FATAL"`), `None` for an unknown number.
    pub fn name(self) -> Option<&'static str> {
        EVENT_KINDS.iter().find(|e| e.0 == self).map(|e| e.2)
    }

    /// What the event's `element` names: `"CQ"`, `"QP"`, `"SRQ"`, `"WQ"` (a user handle),
    /// `"port"` (a port number) or `"device"`; `"element"` for an unknown number.
    pub fn element(self) -> &'static str {
        EVENT_KINDS
            .iter()
            .find(|e| e.0 == self)
            .map_or("element", |e| e.3)
    }
}

impl core::fmt::Display for AsyncEventKind {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "unknown event type {}", self.raw()),
        }
    }
}

/// A completion channel: CQs created on it signal their armed events through its fd.
#[derive(Debug)]
pub struct CompChannel {
    pub(crate) fd: OwnedFd,
    ctx: Context,
}

impl CompChannel {
    /// A channel over a completion-channel descriptor created on this context's command fd
    /// by someone else (libibverbs' `ibv_create_comp_channel` in a provider). CQs created on
    /// it name `fd` in CREATE_CQ. The channel owns `fd` and closes it on drop: a caller that
    /// does not own the descriptor keeps a clone of the channel alive for as long as the
    /// descriptor's owner does (a provider leaks one; see `tools/provider`).
    pub fn from_fd(ctx: &Context, fd: OwnedFd) -> CompChannel {
        CompChannel {
            fd,
            ctx: ctx.clone(),
        }
    }

    /// The context the channel belongs to.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// The file descriptor (for epoll integration).
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Block (poll(2), no spinning) until an event arrives or `timeout_ms` passes (-1: forever);
    /// returns the CQ handle of the event. Acknowledge by calling [`Cq::event_received`]
    /// (which also bumps the arm sequence number).
    ///
    /// [`Cq::event_received`]: crate::Cq::event_received
    ///
    /// # Errors
    /// [`Error::Os`] if poll or read fails.
    pub fn get_event(&self, timeout_ms: i32) -> Result<Option<u64>> {
        let mut buf = [0u8; 8];
        if !read_event(&self.fd, &mut buf, timeout_ms)? {
            return Ok(None);
        }
        let d = IbUverbsCompEventDesc::read_from_bytes(&buf).map_err(|_| Error::BadResponse {
            cmd: "completion event",
            what: "short record",
        })?;
        Ok(Some(d.cq_handle))
    }
}

#[cfg(test)]
mod names_and_clock {
    use super::*;

    #[test]
    fn every_async_event_type_prints_by_name_and_keeps_its_number() {
        for raw in 0..=19 {
            let k = AsyncEventKind::from_raw(raw);
            assert_ne!(k, AsyncEventKind::Unknown(raw), "{raw}");
            assert_eq!(k.raw(), raw);
            assert!(k.name().is_some_and(|n| n == k.to_string()), "{k:?}");
        }
        let ev = AsyncEvent {
            element: 7,
            event_type: mlx5_ffi::uverbs::IB_EVENT_QP_ACCESS_ERR,
        };
        assert_eq!(ev.kind(), AsyncEventKind::QpAccessErr);
        assert_eq!(ev.to_string(), "QP_ACCESS_ERR on QP (user handle 7)");
        assert_eq!(
            format!("{ev:?}"),
            "AsyncEvent { element: 7, event_type: QP_ACCESS_ERR (3) }"
        );
        let port = AsyncEvent {
            element: 1,
            event_type: mlx5_ffi::uverbs::IB_EVENT_PORT_ACTIVE,
        };
        assert_eq!(port.to_string(), "PORT_ACTIVE on port 1");
        let odd = AsyncEvent {
            element: 3,
            event_type: 99,
        };
        assert_eq!(odd.kind(), AsyncEventKind::Unknown(99));
        assert_eq!(odd.kind().raw(), 99);
        assert_eq!(
            odd.to_string(),
            "unknown event type 99 on element (user handle 3)"
        );
    }

    #[test]
    fn port_and_gid_print_names() {
        let p = PortAttr {
            state: 4,
            active_mtu: 5,
            lid: 3,
            gid_tbl_len: 1,
            link_layer: 1,
            raw: IbUverbsQueryPortResp::default(),
        };
        assert_eq!(
            format!("{p:?}"),
            "PortAttr { state: ACTIVE (4), active_mtu: 4096 (5), lid: 3, gid_tbl_len: 1, \
             link_layer: InfiniBand (1), .. }"
        );
        let odd = PortAttr {
            state: 9,
            active_mtu: 0,
            link_layer: 7,
            ..p
        };
        assert_eq!(
            format!("{odd:?}"),
            "PortAttr { state: unknown (9), active_mtu: 0 (0), lid: 3, gid_tbl_len: 1, \
             link_layer: unspecified (7), .. }"
        );
        let mut gid = [0u8; 16];
        gid[0] = 0xfe;
        gid[1] = 0x80;
        gid[15] = 1;
        let g = GidEntry {
            gid,
            gid_type: IB_UVERBS_GID_TYPE_ROCE_V2,
        };
        assert_eq!(
            format!("{g:?}"),
            "GidEntry { gid: fe80:0000:0000:0000:0000:0000:0000:0001, gid_type: RoCE v2 (2) }"
        );
    }

    #[test]
    fn ticks_convert_through_the_clock_frequency() {
        // 1 GHz: a tick is a nanosecond.
        assert_eq!(ticks_to_ns(123_456, 1_000_000), 123_456);
        // 156.25 MHz (ConnectX-4 Lx): 6.4 ns a tick.
        assert_eq!(ticks_to_ns(1000, 156_250), 6400);
        // Large tick counts do not overflow in the multiplication.
        assert_eq!(ticks_to_ns(u64::MAX / 2, 2_000_000), u64::MAX / 4);
        assert_eq!(ticks_to_ns(u64::MAX, 1), u64::MAX);
        assert_eq!(ticks_to_ns(5, 0), 0);
    }
}
