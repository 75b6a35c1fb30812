//! Shared receive queues: a linked list of WQEs through their "next" segments, a 16-bit posted
//! counter in the doorbell record, completions identified by WQE index (in any order).
//!
//! # Ownership rule
//! WQEs on the list from `head` up to the sentinel `tail` are device-owned once posted; a WQE
//! returns to the driver when its completion is polled (the poller marks it free; the poster
//! re-links freed WQEs behind the sentinel when it runs out).
//!
//! # Ordering rule
//! WQE stores, `to_device()`, then record word 0 = posted counter.

use std::sync::Arc;

use mlx5_ffi::mlx5::Mlx5IbCreateSrq;
use mlx5_ffi::uverbs::{IbUverbsCreateSrq, IbUverbsCreateXsrq, IbUverbsDestroySrq};
use mlx5_hw::wqe::SrqNextSeg;
use zerocopy::IntoBytes;

use crate::error::{Error, Result};
use crate::ledger::{ScatterTarget, SrqShared, publish_recv, write_scatter};
use crate::mem::wq::WqRing;
use crate::mem::{DbRec, DmaBuf};
use crate::pd::Pd;
use crate::uverbs;
use crate::wr::{PostError, RecvWr};
use mlx5_ffi::cmd::cmds;

#[derive(Debug)]
pub(crate) struct SrqHandle {
    pd: Pd,
    handle: u32,
    pub(crate) srqn: u32,
    /// The CQE v1 user index of an XRC SRQ (its receive CQEs name it), freed with it.
    pub(crate) uidx: Option<u32>,
    /// The ring and record outlive the kernel SRQ (QPs attached to it hold this handle).
    _buf: Arc<DmaBuf>,
    _dbrec: Arc<DbRec>,
}

impl SrqHandle {
    pub(crate) fn handle_id(&self) -> u32 {
        self.handle
    }
}

impl Drop for SrqHandle {
    fn drop(&mut self) {
        let cmd = IbUverbsDestroySrq {
            response: 0,
            srq_handle: self.handle,
            reserved: 0,
        };
        if !self.pd.inner.ctx.destroy::<cmds::DestroySrq>(&cmd) {
            // The SRQ may live on in the kernel: the device may still use its ring and record.
            crate::mem::leak(&self._buf);
            crate::mem::leak(&self._dbrec);
            return;
        }
        if let Some(u) = self.uidx {
            self.pd.inner.ctx.free_uidx(u);
        }
    }
}

/// A shared receive queue. Posting takes `&mut self`.
#[derive(Debug)]
pub struct Srq {
    pub(crate) handle: Arc<SrqHandle>,
    pub(crate) shared: Arc<SrqShared>,
    ring: WqRing,
    stride: u32,
    max_gs: u32,
    n: u32,
    head: u32,
    tail: u32,
    counter: u32,
    dbrec: Arc<DbRec>,
}

impl Srq {
    /// Create an SRQ for at least `max_wr` receives of up to `max_sge` SGEs.
    ///
    /// # Errors
    /// [`Error::Limit`] naming `max_wr` or `max_sge`; [`Error::Uverbs`] naming CREATE_SRQ.
    pub fn new(pd: &Pd, max_wr: u32, max_sge: u32) -> Result<Self> {
        Self::create(pd, max_wr, max_sge, None)
    }

    /// [`new`](Self::new), or with `xrc` an XRC SRQ (CREATE_XSRQ: its domain, CQ and CQE v1
    /// user index; `src/xrc.rs`) with the same ring.
    pub(crate) fn create(
        pd: &Pd,
        max_wr: u32,
        max_sge: u32,
        xrc: Option<XsrqInit>,
    ) -> Result<Self> {
        let ctx = &pd.inner.ctx;
        let a = &ctx.inner.attr.raw;
        Error::check_limit(
            "max_wr",
            max_wr.into(),
            a.max_srq_wr.into(),
            "of the device for SRQs",
        )?;
        Error::check_limit(
            "max_sge",
            max_sge.into(),
            a.max_srq_sge.into(),
            "of the device for SRQs",
        )?;
        Error::check_limit(
            "max_sge",
            max_sge.into(),
            u64::from(ctx.inner.ucx.max_rq_desc_sz.saturating_sub(16) / 16),
            "of the device for SRQs",
        )?;
        let stride = (16 + 16 * max_sge.max(1)).max(32).next_power_of_two();
        // SRQ WQE indices and the posted counter are 16 bits wide.
        Error::check_limit("max_wr", max_wr.into(), (1 << 15) - 1, "of SRQ WQE indices")?;
        let n = (max_wr + 1).next_power_of_two().max(2);
        let buf = Arc::new(DmaBuf::new((n * stride) as usize)?);
        let mut ring = WqRing::new(buf.clone(), 0, (n * stride) as usize);
        for i in 0..n - 1 {
            ring.write(
                (i * stride) as usize,
                SrqNextSeg::new((i + 1) as u16).as_bytes(),
            );
        }
        let dbrec = Arc::new(ctx.inner.dbrecs.alloc()?);
        let drv = Mlx5IbCreateSrq {
            buf_addr: buf.addr(),
            db_addr: dbrec.addr(),
            uidx: xrc.map_or(0, |x| x.uidx),
            ..Mlx5IbCreateSrq::default()
        };
        let (handle, srqn) = match xrc {
            None => {
                let cmd = IbUverbsCreateSrq {
                    response: 0,
                    user_handle: crate::context::next_user_handle(),
                    pd_handle: pd.inner.handle,
                    max_wr: n - 1,
                    max_sge,
                    srq_limit: 0,
                };
                let (core, m) = uverbs::write::<cmds::CreateSrq>(ctx.surface(), &cmd, &drv)?;
                (core.srq_handle, m.srqn)
            }
            Some(x) => {
                let (core, _) = uverbs::write::<cmds::CreateXsrq>(
                    ctx.surface(),
                    &x.cmd(pd.inner.handle, n - 1, max_sge),
                    &drv,
                )?;
                (core.srq_handle, core.srqn)
            }
        };
        let shared = Arc::new(SrqShared::new(
            n,
            ScatterTarget::new(
                ring.reader(),
                stride,
                16,
                (stride - 16) / 16,
                pd.inner.handle,
                ctx.inner.mrs.clone(),
            ),
        ));
        Ok(Self {
            handle: Arc::new(SrqHandle {
                pd: pd.clone(),
                handle,
                srqn,
                uidx: xrc.map(|x| x.uidx),
                _buf: buf.clone(),
                _dbrec: dbrec.clone(),
            }),
            shared,
            ring,
            stride,
            max_gs: (stride - 16) / 16,
            n,
            head: 0,
            tail: n - 1,
            counter: 0,
            dbrec,
        })
    }

    /// SRQ number.
    pub fn srqn(&self) -> u32 {
        self.handle.srqn
    }

    /// The device context the SRQ was created in.
    pub fn context(&self) -> &crate::context::Context {
        self.handle.pd.context()
    }

    /// Usable capacity in WRs (ring size minus the sentinel).
    pub fn capacity(&self) -> u32 {
        self.n - 1
    }

    fn next_of(&self, i: u32) -> u32 {
        let mut b = [0u8; 4];
        self.ring.read((i * self.stride) as usize, &mut b);
        u32::from(u16::from_be_bytes([b[2], b[3]])) % self.n
    }

    fn reclaim(&mut self) {
        for i in 0..self.n {
            if self.shared.take_freed(i) {
                let t = self.tail;
                self.ring.write(
                    (t * self.stride) as usize,
                    SrqNextSeg::new(i as u16).as_bytes(),
                );
                self.tail = i;
            }
        }
    }

    /// Post receives to the SRQ; updates the doorbell record once.
    ///
    /// # Errors
    /// The index of the first bad WR and why; WRs before it are posted.
    pub fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> Result<(), (usize, PostError)> {
        let mut res = Ok(());
        let mut posted = 0;
        for (i, wr) in wrs.iter().enumerate() {
            if wr.sg_list.len() > self.max_gs as usize {
                res = Err((
                    i,
                    PostError::TooManySges {
                        n: wr.sg_list.len(),
                        max: self.max_gs,
                    },
                ));
                break;
            }
            if self.head == self.tail {
                self.reclaim();
                if self.head == self.tail {
                    res = Err((
                        i,
                        PostError::Full {
                            outstanding: self.n - 1,
                            capacity: self.n - 1,
                        },
                    ));
                    break;
                }
            }
            let idx = self.head;
            let base = (idx * self.stride) as usize + 16;
            write_scatter(self.ring.writer(), base, wr.sg_list, self.max_gs);
            self.shared.set_wr_id(idx, wr.wr_id);
            self.head = self.next_of(idx);
            self.counter = self.counter.wrapping_add(1);
            posted += 1;
        }
        if posted > 0 {
            publish_recv(&self.dbrec, self.counter);
        }
        res
    }
}

/// What CREATE_XSRQ adds to an SRQ's creation (`srq.rs` builds the ring).
#[derive(Clone, Copy, Debug)]
pub(crate) struct XsrqInit {
    pub(crate) xrcd: u32,
    pub(crate) cq: u32,
    pub(crate) uidx: u32,
}

impl XsrqInit {
    pub(crate) fn cmd(&self, pd: u32, max_wr: u32, max_sge: u32) -> IbUverbsCreateXsrq {
        IbUverbsCreateXsrq {
            response: 0,
            user_handle: crate::context::next_user_handle(),
            srq_type: mlx5_ffi::ioctl::IB_UVERBS_SRQT_XRC,
            pd_handle: pd,
            max_wr,
            max_sge,
            srq_limit: 0,
            max_num_tags: 0,
            xrcd_handle: self.xrcd,
            cq_handle: self.cq,
        }
    }
}
