//! Multicast attach of a UD QP (`ibv_attach_mcast`): the QP receives the SENDs to a group
//! (its MGID and, on InfiniBand, its MLID), as [`crate::cm::CmId::join_multicast`] arranges
//! after the connection manager's join. Kernel errnos: a non-multicast GID, a QP that is not
//! UD, or on InfiniBand an MLID outside 0xc000..=0xfffe is `EINVAL`; detaching a group the
//! QP is not attached to is `EINVAL`.

use mlx5_ffi::ucma::{AttachMcast, DetachMcast, IbUverbsAttachMcast};

use super::Qp;
use crate::error::{Error, Result};
use crate::types::QpType;
use crate::uverbs;

impl Qp {
    fn mcast_cmd(&self, gid: [u8; 16], mlid: u16) -> Result<IbUverbsAttachMcast> {
        if self.qp_type != QpType::Ud {
            return Err(Error::InvalidArgument {
                attr: "qp_type",
                reason: "only a UD QP joins a multicast group",
            });
        }
        if gid[0] != 0xff {
            return Err(Error::InvalidArgument {
                attr: "gid",
                reason: "not a multicast GID (the first byte is 0xff)",
            });
        }
        Ok(IbUverbsAttachMcast {
            gid,
            qp_handle: self.handle.handle,
            mlid,
            reserved: 0,
        })
    }

    /// Attach this UD QP to the multicast group `gid` / `mlid`: it receives the SENDs to
    /// the group from then on.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a QP that is not UD or a GID that is not a multicast
    /// one; the kernel's ATTACH_MCAST errno (`EINVAL` for a bad MLID on InfiniBand).
    pub fn attach_mcast(&self, gid: [u8; 16], mlid: u16) -> Result<()> {
        let cmd = self.mcast_cmd(gid, mlid)?;
        uverbs::write::<AttachMcast>(self.handle.ctx.surface(), &cmd, &()).map(drop)
    }

    /// Detach this QP from the group `gid` / `mlid`.
    ///
    /// # Errors
    /// As [`Qp::attach_mcast`]; `EINVAL` if the QP is not attached to the group.
    pub fn detach_mcast(&self, gid: [u8; 16], mlid: u16) -> Result<()> {
        let cmd = self.mcast_cmd(gid, mlid)?;
        uverbs::write::<DetachMcast>(self.handle.ctx.surface(), &cmd, &()).map(drop)
    }
}
