//! Kernel ABI of ib_uverbs and the mlx5 provider, mirrored by hand, plus the uverbs
//! "syscall surface" trait that the driver talks through.
//!
//! - [`uverbs`]: `<rdma/ib_user_verbs.h>` (write() commands, event descriptors, shared enums)
//! - [`ioctl`]: `<rdma/rdma_user_ioctl_cmds.h>`, `<rdma/ib_user_ioctl_cmds.h>`,
//!   `<rdma/ib_user_ioctl_verbs.h>` (RDMA_VERBS_IOCTL, ids, attribute walking)
//! - [`mlx5`]: `<rdma/mlx5-abi.h>`, `<rdma/mlx5_user_ioctl_cmds.h>` (driver data, mmap offsets)
//! - [`cmd`]: the typed command table ([`cmd::cmds`]: each write command's id and its
//!   request/response/driver structs, [`cmd::encode_write`], [`cmd::decode_req`], ...) and the
//!   builders and parsers of write() command buffers
//! - [`surface`]: [`surface::UverbsSurface`] (an `unsafe trait`: the contract the driver's
//!   safety rests on), [`surface::Errno`], [`surface::UverbsFd`]
//! - [`sysfs`]: discovery of real uverbs devices
//! - [`ucma`]: `<rdma/rdma_user_cm.h>` (the rdma_cm write() commands and events)
//! - [`prm`]: the PRM command mailboxes DEVX carries (opcodes, statuses, bit fields)
//! - [`xrc_dc`]: XRC domains, `OPEN_QP`, the XRCD ioctl ids and mlx5's DC constants
//!
//! `tests/header_check.rs` proves every struct size, field offset and constant against the
//! installed kernel headers.

pub mod cmd;
pub mod flow;
pub mod ioctl;
pub mod mlx5;
pub mod prm;
pub mod surface;
pub mod sysfs;
pub mod ucma;
pub mod uverbs;
pub mod xrc_dc;
