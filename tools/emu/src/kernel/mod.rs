//! The emulated `ib_uverbs` + `mlx5_ib` kernel: the command dispatch, the open file
//! ([`EmuFile`]) and the object tables' bookkeeping. One room per object:
//!
//! - `context`: GET_CONTEXT, QUERY_DEVICE, QUERY_PORT (and GID lookups)
//! - `pd_mr`: ALLOC/DEALLOC_PD, REG/DEREG_MR
//! - `ah`: CREATE/DESTROY_AH
//! - `cq`: CREATE/DESTROY_CQ
//! - `qp`: CREATE/MODIFY/QUERY/DESTROY_QP and the transition table
//! - `srq`: CREATE/MODIFY/QUERY/DESTROY_SRQ
//! - `events`: CREATE_COMP_CHANNEL and event channels
//! - `xrc`: OPEN/CLOSE_XRCD, CREATE_XSRQ, OPEN_QP, XRC initiator and target QPs
//! - `dc`: DC initiators and targets (CREATE_QP of `IB_QPT_DRIVER`, a DCT's modify)
//! - `methods`: the ioctl object methods, mapped onto the same handlers
//! - `ucma`: the rdma_cm file (`/dev/infiniband/rdma_cm`) and the CM (its state, messages
//!   and the host's port space are in `model/`: `cm.rs`, `cm_mad.rs`, `cm_ports.rs`)
//!
//! Every request and response is one of the header-checked structs of `mlx5-ffi`, decoded
//! and encoded through its command table ([`mlx5_ffi::cmd::cmds`]); nothing here reads a
//! command by byte offset. All integers are host order.

use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use mlx5_ffi::cmd::{Command, cmds, decode_drv, decode_req, parse_write, tail_is_zero};
use mlx5_ffi::ioctl::{
    IbUverbsAttr, IbUverbsIoctlHdr, UVERBS_ATTR_CORE_IN, UVERBS_ATTR_CORE_OUT,
    UVERBS_ATTR_F_MANDATORY, UVERBS_ATTR_F_VALID_OUTPUT, UVERBS_ATTR_UHW_IN, UVERBS_ATTR_UHW_OUT,
    UVERBS_ATTR_WRITE_CMD, UVERBS_METHOD_INVOKE_WRITE, UVERBS_OBJECT_DEVICE, parse_ioctl,
    write_attr,
};
use mlx5_ffi::mlx5::{
    MLX5_IB_MMAP_ALLOC_WC, MLX5_IB_MMAP_CLOCK_INFO, MLX5_IB_MMAP_CORE_CLOCK,
    MLX5_IB_MMAP_GET_CONTIGUOUS_PAGES, MLX5_IB_MMAP_NC_PAGE, MLX5_IB_MMAP_REGULAR_PAGE,
    MLX5_IB_MMAP_WC_PAGE,
};
use mlx5_ffi::uverbs::{
    IB_USER_VERBS_CMD_COMMAND_MASK, IB_USER_VERBS_CMD_FLAG_EXTENDED, IbUverbsCmdHdr,
    IbUverbsExCreateCqResp, IbUverbsExCreateQpResp, IbUverbsExQueryDeviceResp,
};
use zerocopy::{FromBytes, Immutable, IntoBytes};

use crate::abi::{Errno, UverbsSurface};
use crate::config::Flavour;
use crate::mem;
use crate::shared::{Owner, Shared};
use crate::state::{Obj, World};
use crate::uar::PAGE;

mod ah;
mod context;
mod cq;
mod dc;
pub(crate) mod devx;
mod devx_methods;
mod devx_mkey;
mod devx_qp;
mod events;
mod flow;
pub(crate) mod mcast;
mod methods;
mod pd_mr;
mod qp;
mod srq;
pub(crate) mod ucma;
mod xrc;

use crate::state::gid_at;

const EINVAL: Errno = Errno(libc::EINVAL);
const ENOSPC: Errno = Errno(libc::ENOSPC);
const EBUSY: Errno = Errno(libc::EBUSY);
const EOPNOTSUPP: Errno = Errno(libc::EOPNOTSUPP);
const EPROTONOSUPPORT: Errno = Errno(libc::EPROTONOSUPPORT);
const EFAULT: Errno = Errno(libc::EFAULT);
const EPERM: Errno = Errno(libc::EPERM);
const ENOMEM: Errno = Errno(libc::ENOMEM);

/// Dynamic UAR pages one context may allocate.
pub(crate) const MAX_DYN_UARS: usize = 256;
/// First mmap page offset handed out for dynamic UARs (the mlx5 "mmap entry" range).
const DYN_PGOFF_BASE: u64 = 9 << 16;
/// Page ids of dynamic UARs start here (they go into 16-bit CQ/QP fields).
const DYN_PAGE_ID_BASE: u32 = 0x100;

/// `IB_USER_VERBS_CMD_FLAG_EXTENDED`.
const FLAG_EXTENDED: u32 = IB_USER_VERBS_CMD_FLAG_EXTENDED;
/// Extended requests longer than this must be zero past it (newer user space), else
/// EOPNOTSUPP, as `uverbs_request_finish` answers.
const EX_CORE_MAX: usize = 128;

/// The emulated HCA's limits and features (`crate::caps`, below kernel and device).
pub(crate) use crate::caps;

// ---------------------------------------------------------------------------------------
// The write commands the emulated kernel implements (the dispatch table)

/// A write handler: the world, the calling context, the decoded request.
type Handler = fn(&mut World, u64, &Req) -> Result<(), Errno>;

/// One write method: minimum core request / response sizes (the kernel's
/// `UAPI_DEF_WRITE_*` minimums), whether driver data (udata) follows the core structs, and
/// the handler.
#[derive(Clone, Copy)]
struct Method {
    command: u32,
    req: usize,
    resp: usize,
    udata: bool,
    has_resp: bool,
    handler: Handler,
}

/// A legacy command of the table: its sizes are its structs' sizes.
const fn legacy<C: Command>(udata: bool, handler: Handler) -> Method {
    Method {
        command: C::ID,
        req: size_of::<C::Req>(),
        resp: size_of::<C::Resp>(),
        udata,
        has_resp: C::RESPONSE_PTR,
        handler,
    }
}

/// An extended command: `resp` is the kernel's minimum response (up to `response_length`).
const fn extended<C: Command>(resp: usize, handler: Handler) -> Method {
    Method {
        command: C::ID | FLAG_EXTENDED,
        req: size_of::<C::Req>(),
        resp,
        udata: true,
        has_resp: resp > 0,
        handler,
    }
}

/// End of `response_length` in an extended response struct: the kernel's minimum size.
macro_rules! min_resp {
    ($t:ty) => {
        std::mem::offset_of!($t, response_length) + 4
    };
}

/// Every write command this kernel implements; anything else is EOPNOTSUPP.
const WRITE_COMMANDS: &[Method] = &[
    legacy::<cmds::GetContext>(true, context::get_context_cmd),
    legacy::<cmds::QueryDevice>(false, context::query_device),
    legacy::<cmds::QueryPort>(false, context::query_port),
    legacy::<cmds::AllocPd>(true, pd_mr::alloc_pd),
    legacy::<cmds::DeallocPd>(false, pd_mr::dealloc_pd),
    legacy::<cmds::CreateAh>(true, ah::create_ah),
    legacy::<cmds::DestroyAh>(false, ah::destroy_ah),
    legacy::<cmds::RegMr>(true, pd_mr::reg_mr),
    legacy::<cmds::DeregMr>(false, pd_mr::dereg_mr),
    legacy::<cmds::CreateCompChannel>(false, events::create_comp_channel),
    legacy::<cmds::CreateCq>(true, cq::create_cq),
    legacy::<cmds::DestroyCq>(false, cq::destroy_cq),
    legacy::<cmds::CreateQp>(true, qp::create_qp),
    legacy::<cmds::QueryQp>(true, qp::query_qp),
    legacy::<cmds::ModifyQp>(true, qp::modify_qp),
    legacy::<cmds::DestroyQp>(false, qp::destroy_qp),
    legacy::<cmds::CreateSrq>(true, srq::create_srq),
    legacy::<cmds::ModifySrq>(true, srq::modify_srq),
    legacy::<cmds::QuerySrq>(false, srq::query_srq),
    legacy::<cmds::DestroySrq>(false, srq::destroy_srq),
    legacy::<cmds::OpenXrcd>(true, xrc::open_xrcd),
    legacy::<cmds::CloseXrcd>(false, xrc::close_xrcd),
    legacy::<cmds::CreateXsrq>(true, xrc::create_xsrq),
    legacy::<cmds::OpenQp>(true, xrc::open_qp),
    legacy::<mlx5_ffi::ucma::AttachMcast>(false, mcast::attach),
    legacy::<mlx5_ffi::ucma::DetachMcast>(false, mcast::detach),
    extended::<cmds::ExQueryDevice>(min_resp!(IbUverbsExQueryDeviceResp), context::query_device),
    extended::<cmds::ExCreateCq>(min_resp!(IbUverbsExCreateCqResp), cq::create_cq),
    extended::<cmds::ExCreateQp>(min_resp!(IbUverbsExCreateQpResp), qp::create_qp),
    extended::<cmds::ExModifyQp>(0, qp::modify_qp),
    extended::<mlx5_ffi::flow::ExCreateFlow>(8, flow::create_flow),
    extended::<mlx5_ffi::flow::ExDestroyFlow>(0, flow::destroy_flow),
];

fn method(command: u32) -> Option<Method> {
    WRITE_COMMANDS
        .iter()
        .copied()
        .find(|m| m.command == command)
}

/// A decoded command, independent of the transport (write, INVOKE_WRITE or an object
/// method): core and driver request bytes and where the responses go.
#[derive(Debug)]
pub(crate) struct Req {
    command: u32,
    ex: bool,
    /// Core request bytes (at least the method's minimum).
    core: Vec<u8>,
    drv_in: Vec<u8>,
    out: u64,
    out_len: usize,
    drv_out: u64,
    drv_out_len: usize,
}

/// `ptr + off` as the kernel's `u64_to_user_ptr(ptr) + off`: a sum past the top of the
/// address space becomes an address no copy accepts (`mem` answers EFAULT for it, as the
/// kernel's `access_ok` does), so nothing wraps and nothing panics.
pub(crate) fn user_add(ptr: u64, off: usize) -> u64 {
    ptr.saturating_add(off as u64)
}

impl Req {
    /// The core request as command `C`'s struct (zero-filled past what was sent).
    fn core<C: Command>(&self) -> C::Req {
        decode_req::<C>(&self.core)
    }

    /// The driver request as command `C`'s struct; EINVAL if bytes past it are not zero.
    fn drv<C: Command>(&self) -> Result<C::DrvReq, Errno> {
        decode_drv::<C>(&self.drv_in)
    }

    /// Write the core response: `min(out_len, size)` bytes; extended commands zero-fill the
    /// rest of a larger user buffer, as `uverbs_response` does.
    fn respond<T: IntoBytes + Immutable>(&self, r: &T) -> Result<(), Errno> {
        let b = r.as_bytes();
        let n = self.out_len.min(b.len());
        mem::write(self.out, &b[..n])?;
        if self.ex && self.out_len > n {
            mem::write(user_add(self.out, n), &vec![0u8; self.out_len - n])?;
        }
        Ok(())
    }

    /// Write driver response data (`ib_copy_to_udata` of `min(outlen, size)`).
    fn respond_drv<T: IntoBytes + Immutable>(&self, r: &T) -> Result<(), Errno> {
        let b = r.as_bytes();
        let n = self.drv_out_len.min(b.len());
        mem::write(self.drv_out, &b[..n])
    }

    /// `response_length` of an extended or driver response: what fits the user's buffer.
    fn len_for(len: usize, size: usize) -> u32 {
        len.min(size) as u32
    }
}

/// One open file on an emulated uverbs device.
#[derive(Debug)]
pub(crate) struct EmuFile {
    shared: Arc<Shared>,
    hca: usize,
    ctx: Mutex<Option<u64>>,
    /// The context was opened as a DEVX context (it has a DEVX uid).
    devx: std::sync::atomic::AtomicBool,
    maps: Mutex<Vec<(usize, usize)>>,
    /// Dropped after `shared` (the last one joins the device thread: `shared.rs`, `Owner`).
    _owner: Arc<Owner>,
}

impl EmuFile {
    pub(crate) fn new(shared: Arc<Shared>, owner: Arc<Owner>, hca: usize) -> Self {
        Self {
            shared,
            hca,
            ctx: Mutex::new(None),
            devx: std::sync::atomic::AtomicBool::new(false),
            maps: Mutex::new(Vec::new()),
            _owner: owner,
        }
    }

    fn ctx(&self) -> Option<u64> {
        *self
            .ctx
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn dispatch(&self, r: &Req) -> Result<(), Errno> {
        let mut w = self.shared.lock();
        let ctx = self.ctx();
        if r.command == cmds::GetContext::ID {
            if ctx.is_some() {
                return Err(EINVAL);
            }
            let (id, devx) = context::get_context(&mut w, self.hca, r)?;
            self.devx.store(devx, std::sync::atomic::Ordering::Relaxed);
            *self
                .ctx
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(id);
            return Ok(());
        }
        let ctx = ctx.ok_or(EINVAL)?;
        let m = method(r.command).ok_or(EOPNOTSUPP)?;
        (m.handler)(&mut w, ctx, r)
    }

    /// UVERBS_METHOD_INVOKE_WRITE: a write command carried by ioctl attributes.
    fn invoke_write(&self, buf: &mut [u8], attrs: &[(usize, IbUverbsAttr)]) -> Result<(), Errno> {
        let mut command = None;
        let mut core_in: Option<Vec<u8>> = None;
        let mut core_out: Option<(u64, usize, usize)> = None;
        let mut uhw_in: Vec<u8> = Vec::new();
        let mut uhw_out: Option<(u64, usize, usize)> = None;
        let read_in = |a: &IbUverbsAttr| -> Result<Vec<u8>, Errno> {
            match a.inline_bytes() {
                Some(b) => Ok(b.to_vec()),
                None => mem::read_vec(a.data, usize::from(a.len)),
            }
        };
        for (idx, a) in attrs {
            match a.attr_id {
                UVERBS_ATTR_CORE_IN => core_in = Some(read_in(a)?),
                UVERBS_ATTR_CORE_OUT => core_out = Some((a.data, usize::from(a.len), *idx)),
                UVERBS_ATTR_WRITE_CMD => command = Some(a.data as u32),
                UVERBS_ATTR_UHW_IN => uhw_in = read_in(a)?,
                UVERBS_ATTR_UHW_OUT => uhw_out = Some((a.data, usize::from(a.len), *idx)),
                _ if a.flags & UVERBS_ATTR_F_MANDATORY != 0 => return Err(EPROTONOSUPPORT),
                _ => {}
            }
        }
        let command = command.ok_or(EINVAL)?;
        let m = method(command).ok_or(EOPNOTSUPP)?;
        let ex = command & FLAG_EXTENDED != 0;
        let mut core = core_in.unwrap_or_default();
        if core.len() < m.req {
            return Err(ENOSPC);
        }
        let (out, out_len, out_idx) = core_out.unwrap_or((0, 0, usize::MAX));
        if out_len < m.resp {
            return Err(ENOSPC);
        }
        if ex && !tail_is_zero(&core, EX_CORE_MAX) && !flow::is_flow_command(command) {
            return Err(EOPNOTSUPP);
        }
        core.resize(core.len().max(m.req), 0);
        let (drv_out, drv_out_len, drv_idx) = uhw_out.unwrap_or((0, 0, usize::MAX));
        let req = Req {
            command,
            ex,
            core,
            drv_in: if m.udata { uhw_in } else { Vec::new() },
            out,
            out_len: if ex { out_len } else { m.resp.min(out_len) },
            drv_out,
            drv_out_len: if m.udata { drv_out_len } else { 0 },
        };
        self.dispatch(&req)?;
        // Mark the outputs valid (UVERBS_ATTR_F_VALID_OUTPUT) in the caller's attr array.
        if out_len > 0 {
            for (i, a) in attrs.iter().filter(|(i, _)| *i == out_idx || *i == drv_idx) {
                let mut a = *a;
                a.flags |= UVERBS_ATTR_F_VALID_OUTPUT;
                write_attr(buf, *i, &a)?;
            }
        }
        Ok(())
    }
}

// SAFETY: `mmap` returns a fresh MAP_SHARED mapping of exactly `len` bytes of the context's UAR
// memfd (`UarRegion::map_user` refuses any other length), recorded in `maps` and unmapped
// only by `munmap` (for that exact range) or by `Drop`; `write`/`ioctl` reach user memory
// only through `crate::mem`, whose copies are fault-catching (EFAULT, never a crash) and
// only at the pointers and lengths the command names; they rewrite only the `flags`/`data`
// of the ioctl buffer's attributes.
unsafe impl UverbsSurface for EmuFile {
    unsafe fn write(&self, buf: &[u8]) -> Result<usize, Errno> {
        let (hdr, _) = IbUverbsCmdHdr::read_from_prefix(buf).map_err(|_| EINVAL)?;
        let command = hdr.command;
        if command & !(IB_USER_VERBS_CMD_FLAG_EXTENDED | IB_USER_VERBS_CMD_COMMAND_MASK) != 0 {
            return Err(EINVAL);
        }
        let m = method(command).ok_or(EOPNOTSUPP)?;
        let cmd = parse_write(buf)?;
        let req = if cmd.extended {
            if cmd.core_in.len() < m.req {
                return Err(ENOSPC);
            }
            if cmd.response != 0 && cmd.core_out_len < m.resp {
                return Err(ENOSPC);
            }
            if !tail_is_zero(cmd.core_in, EX_CORE_MAX) && !flow::is_flow_command(command) {
                return Err(EOPNOTSUPP);
            }
            Req {
                command,
                ex: true,
                core: cmd.core_in.to_vec(),
                drv_in: cmd.driver_in.to_vec(),
                out: cmd.response,
                out_len: cmd.core_out_len,
                drv_out: user_add(cmd.response, cmd.core_out_len),
                drv_out_len: cmd.driver_out_len,
            }
        } else {
            if cmd.core_in.len() < m.req || cmd.core_out_len < m.resp {
                return Err(ENOSPC);
            }
            let out = if m.has_resp { cmd.response } else { 0 };
            let (core, drv_in) = cmd.core_in.split_at(m.req);
            Req {
                command,
                ex: false,
                core: core.to_vec(),
                drv_in: if m.udata { drv_in.to_vec() } else { Vec::new() },
                out,
                out_len: m.resp,
                drv_out: user_add(out, m.resp),
                drv_out_len: if m.udata {
                    cmd.core_out_len - m.resp
                } else {
                    0
                },
            }
        };
        self.dispatch(&req)?;
        Ok(buf.len())
    }

    unsafe fn ioctl(&self, buf: &mut [u8]) -> Result<(), Errno> {
        let flavour = self.shared.lock().cfg.flavour;
        match flavour {
            Flavour::WriteOnly => return Err(Errno(libc::ENOTTY)),
            Flavour::Eproto => return Err(EPROTONOSUPPORT),
            Flavour::Modern => {}
        }
        let (hdr, _) = IbUverbsIoctlHdr::read_from_prefix(buf).map_err(|_| EINVAL)?;
        let length = usize::from(hdr.length);
        let expect =
            size_of::<IbUverbsIoctlHdr>() + usize::from(hdr.num_attrs) * size_of::<IbUverbsAttr>();
        if length > PAGE || length != expect || length > buf.len() {
            return Err(EINVAL);
        }
        if hdr.reserved1 != 0 || hdr.reserved2 != 0 {
            return Err(EPROTONOSUPPORT);
        }
        let (object, method_id) = (hdr.object_id, hdr.method_id);
        // Unknown methods make libibverbs fall back to write().
        if !methods::known(object, method_id) {
            return Err(EPROTONOSUPPORT);
        }
        let view = parse_ioctl(buf)?;
        let mut attrs = Vec::with_capacity(usize::from(hdr.num_attrs));
        for (i, a) in view.attrs().enumerate() {
            if a.flags & !(UVERBS_ATTR_F_MANDATORY | UVERBS_ATTR_F_VALID_OUTPUT) != 0
                || a.elem_id != 0
            {
                return Err(EINVAL);
            }
            attrs.push((i, a));
        }
        match (object, method_id) {
            (UVERBS_OBJECT_DEVICE, UVERBS_METHOD_INVOKE_WRITE) => self.invoke_write(buf, &attrs),
            _ => self.method(object, method_id, methods::Attrs::new(buf, &attrs)),
        }
    }

    fn mmap(&self, len: usize, prot: i32, offset: u64) -> Result<NonNull<u8>, Errno> {
        let ctx = self.ctx().ok_or(EINVAL)?;
        if offset % PAGE as u64 != 0 || len == 0 {
            return Err(EINVAL);
        }
        // mlx5's mmap offset: command in bits 8..16 of the page offset, index in bits 0..8
        // and (for large indices) 16 and up.
        let pgoff = offset / PAGE as u64;
        let command = ((pgoff >> 8) & 0xff) as u32;
        let index = ((pgoff & 0xff) | ((pgoff >> 16) << 8)) as usize;
        if command == MLX5_IB_MMAP_ALLOC_WC {
            // libmlx5's dynamic UARs on a static-bfreg context (kernel/devx.rs).
            devx::alloc_legacy_uar(&mut self.shared.lock(), ctx, pgoff, index)?;
        }
        let w = self.shared.lock();
        let c = w.contexts.get(&ctx).ok_or(EINVAL)?;
        let dynamic = c.dyn_pages.values().find(|d| d.1 == pgoff).map(|d| d.0);
        let page = match command {
            _ if dynamic.is_some() => dynamic.unwrap_or(0),
            // A dynamic-UAR context refuses the legacy UAR mmaps.
            MLX5_IB_MMAP_REGULAR_PAGE | MLX5_IB_MMAP_WC_PAGE | MLX5_IB_MMAP_NC_PAGE
                if c.dyn_uar =>
            {
                return Err(EINVAL);
            }
            MLX5_IB_MMAP_REGULAR_PAGE | MLX5_IB_MMAP_WC_PAGE | MLX5_IB_MMAP_NC_PAGE => {
                if command == MLX5_IB_MMAP_WC_PAGE && w.cfg.bf_reg_size == 0 {
                    return Err(EPERM);
                }
                if index >= c.uar_pages {
                    return Err(EINVAL);
                }
                index
            }
            // CORE_CLOCK and CLOCK_INFO (v1): read-only.
            MLX5_IB_MMAP_CORE_CLOCK | MLX5_IB_MMAP_CLOCK_INFO => {
                if prot & (libc::PROT_WRITE | libc::PROT_EXEC) != 0 {
                    return Err(EPERM);
                }
                if command == MLX5_IB_MMAP_CLOCK_INFO && index != 0 {
                    return Err(EINVAL);
                }
                c.uar_pages + usize::from(command == MLX5_IB_MMAP_CLOCK_INFO)
            }
            MLX5_IB_MMAP_GET_CONTIGUOUS_PAGES => return Err(Errno(libc::ENOSYS)),
            _ => return Err(EINVAL),
        };
        let p = c.uar.map_user(page, len, prot)?;
        self.maps
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((p.as_ptr() as usize, len));
        Ok(p)
    }

    // SAFETY: callers uphold the trait's contract (a mapping from this surface, no longer
    // used); unknown ranges are refused with EINVAL before anything is unmapped.
    unsafe fn munmap(&self, addr: NonNull<u8>, len: usize) -> Result<(), Errno> {
        let mut maps = self
            .maps
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let pos = maps
            .iter()
            .position(|&(a, l)| a == addr.as_ptr() as usize && l == len)
            .ok_or(EINVAL)?;
        maps.swap_remove(pos);
        // SAFETY: (addr, len) is a mapping this surface created (checked just above) and the
        // caller promises it is no longer used; the device uses its own mapping.
        if unsafe { crate::uar::unmap_user(addr.as_ptr().cast(), len) } != 0 {
            return Err(EINVAL);
        }
        Ok(())
    }

    fn describe(&self) -> String {
        format!("mlx5-emu hca{}", self.hca)
    }
}

impl Drop for EmuFile {
    fn drop(&mut self) {
        let maps = std::mem::take(
            self.maps
                .get_mut()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for (a, l) in maps {
            // SAFETY: these mappings were created by this file's mmap and the file (which
            // owns them, as closing the real fd would tear them down) is going away.
            unsafe { crate::uar::unmap_user(a as *mut libc::c_void, l) };
        }
        if let Some(ctx) = self.ctx() {
            let mut w = self.shared.lock();
            close_context(&mut w, ctx);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Object tables

/// Tear down a context and everything it owns.
fn close_context(w: &mut World, ctx: u64) {
    xrc::close_context(w, ctx);
    let Some(c) = w.contexts.remove(&ctx) else {
        return;
    };
    flow::close(w, c.hca, ctx);
    let h = &mut w.hcas[c.hca];
    h.qps.retain(|_, q| q.ctx != ctx);
    h.srqs.retain(|_, s| s.ctx != ctx);
    h.cqs.retain(|_, q| q.ctx != ctx);
    h.mrs.retain(|_, m| m.ctx != ctx);
    h.ahs.retain(|_, a| a.ctx != ctx);
    h.pds.retain(|_, p| p.ctx != ctx);
    w.channels[c.async_ch] = None;
    for (_, ch) in c.comp_by_fd {
        w.channels[ch] = None;
    }
}

fn new_handle(w: &mut World, ctx: u64, obj: Obj) -> u32 {
    let c = w
        .contexts
        .get_mut(&ctx)
        .expect("context exists while its commands run");
    let h = c.next_handle;
    c.next_handle += 1;
    c.handles.insert(h, obj);
    h
}

/// The handle the next `new_handle` of `ctx` returns.
fn next_handle(w: &World, ctx: u64) -> u32 {
    w.contexts.get(&ctx).map_or(0, |c| c.next_handle)
}

fn lookup(w: &World, ctx: u64, handle: u32) -> Result<Obj, Errno> {
    w.contexts
        .get(&ctx)
        .and_then(|c| c.handles.get(&handle).copied())
        .ok_or(EINVAL)
}

fn hca_of(w: &World, ctx: u64) -> usize {
    w.contexts.get(&ctx).map_or(0, |c| c.hca)
}

/// The object number behind `handle` if it is of the kind `kind` (`Obj::Pd`, ...).
fn handle_of(w: &World, ctx: u64, handle: u32, kind: fn(u32) -> Obj) -> Result<u32, Errno> {
    let obj = lookup(w, ctx, handle)?;
    if kind(obj.id()) == obj {
        Ok(obj.id())
    } else {
        Err(EINVAL)
    }
}
fn pd_of(w: &World, ctx: u64, handle: u32) -> Result<u32, Errno> {
    handle_of(w, ctx, handle, Obj::Pd)
}
fn cq_of(w: &World, ctx: u64, handle: u32) -> Result<u32, Errno> {
    handle_of(w, ctx, handle, Obj::Cq)
}
fn qp_of(w: &World, ctx: u64, handle: u32) -> Result<u32, Errno> {
    handle_of(w, ctx, handle, Obj::Qp)
}
fn srq_of(w: &World, ctx: u64, handle: u32) -> Result<u32, Errno> {
    handle_of(w, ctx, handle, Obj::Srq)
}

fn remove_handle(w: &mut World, ctx: u64, handle: u32) {
    if let Some(c) = w.contexts.get_mut(&ctx) {
        c.handles.remove(&handle);
    }
}

fn next_id(w: &mut World, hca: usize) -> u32 {
    let h = &mut w.hcas[hca];
    let id = h.next_id;
    h.next_id = (h.next_id + 1) & 0xff_ffff;
    if h.next_id == 0 {
        h.next_id = 1;
    }
    id
}

/// "Pin" a queue buffer and its doorbell record as the kernel does at create time: the
/// buffer 64-byte aligned, the record `db_align`-aligned (CQ 8, QP/SRQ 4), both readable
/// (EFAULT otherwise).
fn pin_queue(buf: u64, bytes: u64, db: u64, db_bytes: u64, db_align: u64) -> Result<(), Errno> {
    if buf % 64 != 0 || db % db_align != 0 {
        return Err(EINVAL);
    }
    mem::probe(buf, bytes)?;
    mem::probe(db, db_bytes)
}

/// Adjust a reference count (PD, CQ, SRQ users) if the object still exists.
fn bump(users: Option<&mut u32>, delta: i32) {
    if let Some(u) = users {
        *u = u.saturating_add_signed(delta);
    }
}

fn pd_use(w: &mut World, hca: usize, pdn: u32, delta: i32) {
    bump(w.hcas[hca].pds.get_mut(&pdn).map(|p| &mut p.users), delta);
}

fn cq_use(w: &mut World, hca: usize, cqn: u32, delta: i32) {
    bump(w.hcas[hca].cqs.get_mut(&cqn).map(|c| &mut c.users), delta);
}
