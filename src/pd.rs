//! Protection domains and memory regions.

use std::sync::Arc;

use mlx5_ffi::uverbs::{IbUverbsAllocPd, IbUverbsDeallocPd, IbUverbsDeregMr, IbUverbsRegMr};

use crate::context::Context;
use crate::error::{Error, Result};
use crate::mem::DmaBuf;
use crate::mem::dma_buf::UserMemory;
use crate::types::Sge;
use crate::uverbs;
use mlx5_ffi::cmd::cmds;

#[derive(Debug)]
pub(crate) struct PdInner {
    pub(crate) ctx: Context,
    pub(crate) handle: u32,
}

impl Drop for PdInner {
    fn drop(&mut self) {
        let cmd = IbUverbsDeallocPd {
            pd_handle: self.handle,
        };
        self.ctx.destroy::<cmds::DeallocPd>(&cmd);
    }
}

/// A protection domain. Cloning shares it; it is deallocated after its last user (MRs, QPs,
/// SRQs and AHs hold it).
#[derive(Clone, Debug)]
pub struct Pd {
    pub(crate) inner: Arc<PdInner>,
}

/// Memory-region access flags (`enum ibv_access_flags`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Access(pub u32);

impl Access {
    /// Local read only.
    pub const LOCAL_READ: Self = Self(0);
    /// The device may write locally (receives, READ results, atomic results).
    pub const LOCAL_WRITE: Self = Self(1);
    /// Remote peers may RDMA WRITE.
    pub const REMOTE_WRITE: Self = Self(2);
    /// Remote peers may RDMA READ.
    pub const REMOTE_READ: Self = Self(4);
    /// Remote peers may perform atomics.
    pub const REMOTE_ATOMIC: Self = Self(8);
    /// Everything above.
    pub const ALL: Self = Self(1 | 2 | 4 | 8);
}

crate::types::bit_set!(Access);

impl Pd {
    /// Allocate a protection domain.
    ///
    /// # Errors
    /// [`Error::Uverbs`] naming ALLOC_PD.
    pub fn new(ctx: &Context) -> Result<Self> {
        let cmd = IbUverbsAllocPd { response: 0 };
        let (r, _) = uverbs::write::<cmds::AllocPd>(ctx.surface(), &cmd, &())?;
        Ok(Self {
            inner: Arc::new(PdInner {
                ctx: ctx.clone(),
                handle: r.pd_handle,
            }),
        })
    }

    /// The context.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// Register all of `buf` with `access`. The region keeps the buffer alive.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for remote write/atomic access without local write (the verbs
    /// rule); [`Error::Uverbs`] naming REG_MR.
    pub fn reg_mr(&self, buf: &Arc<DmaBuf>, access: Access) -> Result<Mr> {
        self.register(
            buf.addr(),
            buf.len() as u64,
            access,
            MrMemory::Buf(buf.clone()),
        )
    }

    /// Register caller memory described by `mem` (see [`UserMemory::from_raw_parts`]).
    ///
    /// # Errors
    /// As [`reg_mr`](Self::reg_mr).
    pub fn reg_user_mr(&self, mem: UserMemory, access: Access) -> Result<Mr> {
        self.register(mem.addr(), mem.len() as u64, access, MrMemory::User)
    }

    fn register(&self, addr: u64, len: u64, access: Access, mem: MrMemory) -> Result<Mr> {
        if len == 0 {
            return Err(Error::InvalidArgument {
                attr: "length",
                reason: "a memory region cannot be empty",
            });
        }
        let needs_local_write = Access(Access::REMOTE_WRITE.0 | Access::REMOTE_ATOMIC.0);
        if access.0 & needs_local_write.0 != 0 && !access.contains(Access::LOCAL_WRITE) {
            return Err(Error::InvalidArgument {
                attr: "access",
                reason: "REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE",
            });
        }
        let max = self.inner.ctx.inner.attr.raw.max_mr_size;
        if max != 0 {
            Error::check_limit("length", len, max, "(max_mr_size)")?;
        }
        let cmd = IbUverbsRegMr {
            response: 0,
            start: addr,
            length: len,
            hca_va: addr,
            pd_handle: self.inner.handle,
            access_flags: access.0,
        };
        let (r, ()) = uverbs::write::<cmds::RegMr>(self.inner.ctx.surface(), &cmd, &())?;
        // The memory (a `DmaBuf` the region holds, or `UserMemory` whose creator promised it
        // stays mapped while the region exists) outlives the table entry: `Mr::drop` removes it
        // first.
        self.inner.ctx.inner.mrs.insert(
            r.lkey,
            addr,
            len,
            self.inner.handle,
            access.contains(Access::LOCAL_WRITE),
        );
        Ok(Mr {
            pd: self.clone(),
            handle: r.mr_handle,
            lkey: r.lkey,
            rkey: r.rkey,
            addr,
            len,
            access,
            _mem: mem,
        })
    }
}

#[derive(Debug)]
enum MrMemory {
    Buf(Arc<DmaBuf>),
    User,
}

/// A registered memory region. Deregistered on drop; keeps its PD (and buffer) alive.
#[derive(Debug)]
pub struct Mr {
    pd: Pd,
    handle: u32,
    lkey: u32,
    rkey: u32,
    addr: u64,
    len: u64,
    access: Access,
    _mem: MrMemory,
}

impl Mr {
    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.lkey
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }
    /// Start address.
    pub fn addr(&self) -> u64 {
        self.addr
    }
    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }
    /// Whether the length is 0 (never).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Access flags.
    pub fn access(&self) -> Access {
        self.access
    }
    /// The PD.
    pub fn pd(&self) -> &Pd {
        &self.pd
    }

    /// An SGE for `len` bytes at `offset` into the region.
    ///
    /// # Panics
    /// If the range is outside the region.
    pub fn sge(&self, offset: u64, len: u32) -> Sge {
        assert!(
            offset
                .checked_add(u64::from(len))
                .is_some_and(|end| end <= self.len),
            "SGE outside the memory region"
        );
        Sge {
            addr: self.addr + offset,
            length: len,
            lkey: self.lkey,
        }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        self.pd.inner.ctx.inner.mrs.remove(self.lkey);
        let cmd = IbUverbsDeregMr {
            mr_handle: self.handle,
        };
        if !self.pd.inner.ctx.destroy::<cmds::DeregMr>(&cmd) {
            // The region may stay registered: the device (or a remote peer) may still write
            // it. A buffer of ours is kept for the rest of the process; caller memory is the
            // caller's (`UserMemory`'s contract covers the region's registration).
            if let MrMemory::Buf(b) = &self._mem {
                crate::mem::leak(b);
            }
        }
    }
}
