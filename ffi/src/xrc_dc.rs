//! The XRC and DC parts of the kernel ABI: `OPEN_XRCD` / `CLOSE_XRCD` / `OPEN_QP`
//! (`<rdma/ib_user_verbs.h>`), the XRCD object's ioctl ids (`<rdma/ib_user_ioctl_cmds.h>`),
//! and the DC fields of mlx5's QP driver data (`<rdma/mlx5-abi.h>`: the DC access key shares
//! the 8 bytes of `sq_buf_addr`). XRC SRQs travel in `CREATE_XSRQ` ([`crate::uverbs`]).
//!
//! `tests/header_check_xrc_dc.rs` proves every size, offset and constant here against the
//! installed headers.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// `struct ib_uverbs_open_xrcd` (16 B): open (or create, with `O_CREAT` in `oflags`) the XRC
/// domain of the file `fd` refers to; `fd` = -1 (as `u32`) for a domain of its own.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsOpenXrcd {
    /// 0: user pointer of the response.
    pub response: u64,
    /// 8: a file descriptor of the caller, or `u32::MAX` (no file: not shared).
    pub fd: u32,
    /// 12: `O_CREAT`, `O_EXCL` (the only flags the kernel accepts).
    pub oflags: u32,
}
const _: () = assert!(size_of::<IbUverbsOpenXrcd>() == 16);

/// `struct ib_uverbs_open_xrcd_resp` (4 B).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsOpenXrcdResp {
    /// 0
    pub xrcd_handle: u32,
}
const _: () = assert!(size_of::<IbUverbsOpenXrcdResp>() == 4);

/// `struct ib_uverbs_close_xrcd` (4 B). No response.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsCloseXrcd {
    /// 0
    pub xrcd_handle: u32,
}
const _: () = assert!(size_of::<IbUverbsCloseXrcd>() == 4);

/// `struct ib_uverbs_open_qp` (32 B): open an XRC target QP another context created, by
/// its number, in an XRC domain the caller has open. The response is
/// `struct ib_uverbs_create_qp_resp`.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IbUverbsOpenQp {
    /// 0: user pointer of the response.
    pub response: u64,
    /// 8
    pub user_handle: u64,
    /// 16: the XRC domain's handle (the field is named for the PD).
    pub pd_handle: u32,
    /// 20: the target QP's number.
    pub qpn: u32,
    /// 24: `IB_QPT_XRC_TGT`.
    pub qp_type: u8,
    /// 25
    pub reserved: [u8; 7],
}
const _: () = assert!(size_of::<IbUverbsOpenQp>() == 32);

/// Object method: destroy (close) an XRC domain (`enum uverbs_methods_xrcd`).
pub const UVERBS_METHOD_XRCD_DESTROY: u16 = 0;
/// XRCD destroy attribute: the handle.
pub const UVERBS_ATTR_DESTROY_XRCD_HANDLE: u16 = 0;

/// `IBV_QPT_DRIVER` (`enum ibv_qp_type`; the kernel's `IB_QPT_DRIVER`): the type of mlx5's DC QPs, whose
/// driver data says DCI or DCT.
pub const IBV_QPT_DRIVER: u8 = 0xff;

/// `MLX5DV_DCTYPE_DCT` (`enum mlx5dv_dc_type`, `<infiniband/mlx5dv.h>`).
pub const MLX5DV_DCTYPE_DCT: u32 = 1;
/// `MLX5DV_DCTYPE_DCI`.
pub const MLX5DV_DCTYPE_DCI: u32 = 2;
