//! The emulated `ib_uverbs` + `mlx5_ib` kernel: command decoding, validation and objects.
//!
//! Layouts are the kernel UAPI (`<rdma/ib_user_verbs.h>`, `<rdma/mlx5-abi.h>`); offsets are
//! given in comments next to each access. All integers are host order.

use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use mlx5_ffi::cmd::{parse_write, tail_is_zero};
use mlx5_ffi::uverbs::{
    IB_USER_VERBS_CMD_COMMAND_MASK, IB_USER_VERBS_CMD_FLAG_EXTENDED, IbUverbsCmdHdr,
};
use zerocopy::FromBytes;

use crate::abi::{Errno, UverbsSurface};
use crate::fds::EventChannel;
use crate::state::{Ah, Context, Cq, Mr, Obj, Path, Pd, Qp, Srq, World, access, qps, qpt};
use crate::uar::{PAGE, UarRegion};
use crate::{Flavour, Shared, mem};

mod methods;

const EINVAL: Errno = Errno(libc::EINVAL);
const ENOSPC: Errno = Errno(libc::ENOSPC);
const EBUSY: Errno = Errno(libc::EBUSY);
const EOPNOTSUPP: Errno = Errno(libc::EOPNOTSUPP);
const EPROTONOSUPPORT: Errno = Errno(libc::EPROTONOSUPPORT);
const EFAULT: Errno = Errno(libc::EFAULT);

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

/// Device limits reported by QUERY_DEVICE and enforced at create time.
pub(crate) mod caps {
    pub(crate) const MAX_QP_WR: u32 = 1 << 15;
    pub(crate) const MAX_SGE: u32 = 30;
    pub(crate) const MAX_CQE: u32 = (1 << 22) - 1;
    pub(crate) const MAX_SRQ_WR: u32 = (1 << 15) - 1;
    pub(crate) const MAX_SRQ_SGE: u32 = 31;
    pub(crate) const MAX_RD_ATOM: u32 = 16;
    pub(crate) const MAX_INLINE: u32 = 512;
    pub(crate) const MAX_SQ_DESC: u32 = 512;
    pub(crate) const MAX_RQ_DESC: u32 = 512;
    pub(crate) const LOG_MAX_QP: u32 = 18;
    pub(crate) const MAX_BFREGS: u32 = 512;
    pub(crate) const CORE_CLOCK_OFFSET: u64 = 0x10;
    pub(crate) const CLOCK_KHZ: u64 = 1_000_000;
    /// `port_cap_flags`: IB_PORT_CM_SUP.
    pub(crate) const PORT_CM_SUP: u32 = 1 << 16;
    /// `port_cap_flags`: IB_UVERBS_PCF_IP_BASED_GIDS (RoCE ports).
    pub(crate) const PORT_IP_BASED_GIDS: u32 = 1 << 26;
}

/// Write-command numbers (`enum ib_uverbs_write_cmds`) we implement.
mod cmd {
    pub(crate) const GET_CONTEXT: u32 = 0;
    pub(crate) const QUERY_DEVICE: u32 = 1;
    pub(crate) const QUERY_PORT: u32 = 2;
    pub(crate) const ALLOC_PD: u32 = 3;
    pub(crate) const DEALLOC_PD: u32 = 4;
    pub(crate) const CREATE_AH: u32 = 5;
    pub(crate) const DESTROY_AH: u32 = 8;
    pub(crate) const REG_MR: u32 = 9;
    pub(crate) const DEREG_MR: u32 = 13;
    pub(crate) const CREATE_COMP_CHANNEL: u32 = 17;
    pub(crate) const CREATE_CQ: u32 = 18;
    pub(crate) const DESTROY_CQ: u32 = 20;
    pub(crate) const CREATE_QP: u32 = 24;
    pub(crate) const QUERY_QP: u32 = 25;
    pub(crate) const MODIFY_QP: u32 = 26;
    pub(crate) const DESTROY_QP: u32 = 27;
    pub(crate) const CREATE_SRQ: u32 = 32;
    pub(crate) const MODIFY_SRQ: u32 = 33;
    pub(crate) const QUERY_SRQ: u32 = 34;
    pub(crate) const DESTROY_SRQ: u32 = 35;
}

/// One write method: minimum core request / response sizes and whether driver data
/// (udata) follows the core structs.
#[derive(Clone, Copy, Debug)]
struct Method {
    req: usize,
    resp: usize,
    udata: bool,
    has_resp: bool,
}

fn method(command: u32) -> Option<Method> {
    let m = |req, resp, udata| Method {
        req,
        resp,
        udata,
        has_resp: resp > 0,
    };
    Some(if command & FLAG_EXTENDED != 0 {
        match command & 0xff {
            cmd::QUERY_DEVICE => m(8, 184, true),
            cmd::CREATE_CQ => m(32, 16, true),
            cmd::CREATE_QP => m(64, 40, true),
            cmd::MODIFY_QP => m(112, 0, true),
            _ => return None,
        }
    } else {
        match command {
            cmd::GET_CONTEXT => m(8, 8, true),
            cmd::QUERY_DEVICE => m(8, 176, false),
            cmd::QUERY_PORT => m(16, 40, false),
            cmd::ALLOC_PD => m(8, 4, true),
            cmd::DEALLOC_PD => m(4, 0, false),
            cmd::CREATE_AH => m(56, 4, true),
            cmd::DESTROY_AH => m(4, 0, false),
            cmd::REG_MR => m(40, 12, true),
            cmd::DEREG_MR => m(4, 0, false),
            cmd::CREATE_COMP_CHANNEL => m(8, 4, false),
            cmd::CREATE_CQ => m(32, 8, true),
            cmd::DESTROY_CQ => m(16, 8, false),
            cmd::CREATE_QP => m(56, 32, true),
            cmd::QUERY_QP => m(16, 128, true),
            cmd::MODIFY_QP => m(112, 0, true),
            cmd::DESTROY_QP => m(16, 4, false),
            cmd::CREATE_SRQ => m(32, 16, true),
            cmd::MODIFY_SRQ => m(16, 0, true),
            cmd::QUERY_SRQ => m(16, 16, false),
            cmd::DESTROY_SRQ => m(16, 4, false),
            _ => return None,
        }
    })
}

/// A decoded command, independent of the transport (write or INVOKE_WRITE).
#[derive(Debug)]
struct Req {
    command: u32,
    ex: bool,
    /// Core request, zero-extended to at least the method's minimum size.
    core: Vec<u8>,
    drv_in: Vec<u8>,
    out: u64,
    out_len: usize,
    drv_out: u64,
    drv_out_len: usize,
}

pub(crate) fn le16(b: &[u8], off: usize) -> u16 {
    b.get(off..off + 2)
        .map_or(0, |s| u16::from_ne_bytes([s[0], s[1]]))
}
pub(crate) fn le32(b: &[u8], off: usize) -> u32 {
    b.get(off..off + 4)
        .map_or(0, |s| u32::from_ne_bytes([s[0], s[1], s[2], s[3]]))
}
pub(crate) fn le64(b: &[u8], off: usize) -> u64 {
    b.get(off..off + 8).map_or(0, |s| {
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        u64::from_ne_bytes(a)
    })
}
fn u8at(b: &[u8], off: usize) -> u8 {
    b.get(off).copied().unwrap_or(0)
}

/// A response under construction (host-order fields at offsets).
struct Out(Vec<u8>);
impl Out {
    fn new(n: usize) -> Self {
        Out(vec![0; n])
    }
    fn u8(&mut self, off: usize, v: u8) -> &mut Self {
        self.0[off] = v;
        self
    }
    fn u16(&mut self, off: usize, v: u16) -> &mut Self {
        self.0[off..off + 2].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn u32(&mut self, off: usize, v: u32) -> &mut Self {
        self.0[off..off + 4].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn u64(&mut self, off: usize, v: u64) -> &mut Self {
        self.0[off..off + 8].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn bytes(&mut self, off: usize, v: &[u8]) -> &mut Self {
        self.0[off..off + v.len()].copy_from_slice(v);
        self
    }
}

impl Req {
    /// Write the core response: `min(out_len, len)` bytes; extended commands zero-fill the
    /// rest of a larger user buffer, as `uverbs_response` does.
    fn respond(&self, r: &Out) -> Result<(), Errno> {
        let n = self.out_len.min(r.0.len());
        mem::write(self.out, &r.0[..n])?;
        if self.ex && self.out_len > n {
            mem::write(user_add(self.out, n), &vec![0u8; self.out_len - n])?;
        }
        Ok(())
    }
    /// Write driver response data (`ib_copy_to_udata` of `min(outlen, size)`).
    fn respond_drv(&self, r: &Out) -> Result<(), Errno> {
        let n = self.drv_out_len.min(r.0.len());
        mem::write(self.drv_out, &r.0[..n])
    }
    /// Driver request: `min(inlen, size)` bytes, zero-extended; bytes beyond `size` must be 0.
    fn drv(&self, size: usize) -> Result<Vec<u8>, Errno> {
        if self.drv_in.len() > size && self.drv_in[size..].iter().any(|&b| b != 0) {
            return Err(EINVAL);
        }
        let mut v = self.drv_in.clone();
        v.resize(size, 0);
        Ok(v)
    }
}

/// One open file on an emulated uverbs device.
#[derive(Debug)]
pub(crate) struct EmuFile {
    shared: Arc<Shared>,
    hca: usize,
    ctx: Mutex<Option<u64>>,
    maps: Mutex<Vec<(usize, usize)>>,
}

impl EmuFile {
    pub(crate) fn new(shared: Arc<Shared>, hca: usize) -> Self {
        Self {
            shared,
            hca,
            ctx: Mutex::new(None),
            maps: Mutex::new(Vec::new()),
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
        if r.command == cmd::GET_CONTEXT {
            if ctx.is_some() {
                return Err(EINVAL);
            }
            let id = get_context(&mut w, self.hca, r)?;
            *self
                .ctx
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(id);
            return Ok(());
        }
        let ctx = ctx.ok_or(EINVAL)?;
        let c = r.command & !FLAG_EXTENDED;
        match c {
            cmd::QUERY_DEVICE => query_device(&w, ctx, r),
            cmd::QUERY_PORT => query_port(&w, ctx, r),
            cmd::ALLOC_PD => alloc_pd(&mut w, ctx, r),
            cmd::DEALLOC_PD => dealloc_pd(&mut w, ctx, r),
            cmd::CREATE_AH => create_ah(&mut w, ctx, r),
            cmd::DESTROY_AH => destroy_ah(&mut w, ctx, r),
            cmd::REG_MR => reg_mr(&mut w, ctx, r),
            cmd::DEREG_MR => dereg_mr(&mut w, ctx, r),
            cmd::CREATE_COMP_CHANNEL => create_comp_channel(&mut w, ctx, r),
            cmd::CREATE_CQ => create_cq(&mut w, ctx, r),
            cmd::DESTROY_CQ => destroy_cq(&mut w, ctx, r),
            cmd::CREATE_QP => create_qp(&mut w, ctx, r),
            cmd::QUERY_QP => query_qp(&w, ctx, r),
            cmd::MODIFY_QP => modify_qp(&mut w, ctx, r),
            cmd::DESTROY_QP => destroy_qp(&mut w, ctx, r),
            cmd::CREATE_SRQ => create_srq(&mut w, ctx, r),
            cmd::MODIFY_SRQ => modify_srq(&mut w, ctx, r),
            cmd::QUERY_SRQ => query_srq(&w, ctx, r),
            cmd::DESTROY_SRQ => destroy_srq(&mut w, ctx, r),
            _ => Err(EOPNOTSUPP),
        }
    }

    fn invoke_write(
        &self,
        buf: &mut [u8],
        attrs: &[(usize, u16, u16, u16, u64)],
    ) -> Result<(), Errno> {
        // attrs: (index in buf, id, len, flags, data)
        let mut command = None;
        let mut core_in: Option<Vec<u8>> = None;
        let mut core_out: Option<(u64, usize, usize)> = None;
        let mut uhw_in: Vec<u8> = Vec::new();
        let mut uhw_out: Option<(u64, usize, usize)> = None;
        let read_in = |len: u16, data: u64| -> Result<Vec<u8>, Errno> {
            if len as usize <= 8 {
                Ok(data.to_ne_bytes()[..len as usize].to_vec())
            } else {
                mem::read_vec(data, len as usize)
            }
        };
        for &(idx, id, len, flags, data) in attrs {
            match id {
                0 => core_in = Some(read_in(len, data)?),
                1 => core_out = Some((data, len as usize, idx)),
                2 => command = Some(data as u32),
                0x1000 => uhw_in = read_in(len, data)?,
                0x1001 => uhw_out = Some((data, len as usize, idx)),
                _ if flags & 1 != 0 => return Err(EPROTONOSUPPORT),
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
        if ex && !tail_is_zero(&core, EX_CORE_MAX) {
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
        for idx in [out_idx, drv_idx] {
            if idx != usize::MAX && out_len > 0 {
                let f = le16(buf, idx + 4) | 2;
                buf[idx + 4..idx + 6].copy_from_slice(&f.to_ne_bytes());
            }
        }
        Ok(())
    }
}

/// `ptr + off` as the kernel's `u64_to_user_ptr(ptr) + off`: a sum past the top of the
/// address space becomes an address no copy accepts (`mem` answers EFAULT for it, as the
/// kernel's `access_ok` does), so nothing wraps and nothing panics.
pub(crate) fn user_add(ptr: u64, off: usize) -> u64 {
    ptr.saturating_add(off as u64)
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
            if !tail_is_zero(cmd.core_in, EX_CORE_MAX) {
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
        // ib_uverbs_ioctl_hdr: 0 length, 2 object_id, 4 method_id, 6 num_attrs,
        // 8 reserved1 (u64), 16 driver_id, 20 reserved2; attrs of 16 bytes follow.
        if buf.len() < 24 {
            return Err(EINVAL);
        }
        let length = le16(buf, 0) as usize;
        let num_attrs = le16(buf, 6) as usize;
        if length > PAGE || length != 24 + 16 * num_attrs || length > buf.len() {
            return Err(EINVAL);
        }
        if le64(buf, 8) != 0 || le32(buf, 20) != 0 {
            return Err(EPROTONOSUPPORT);
        }
        let (object, method_id) = (le16(buf, 2), le16(buf, 4));
        // Unknown methods make libibverbs fall back to write().
        if !Self::known(object, method_id) {
            return Err(EPROTONOSUPPORT);
        }
        let mut attrs = Vec::with_capacity(num_attrs);
        for i in 0..num_attrs {
            // ib_uverbs_attr: 0 attr_id, 2 len, 4 flags, 6 attr_data, 8 data.
            let o = 24 + 16 * i;
            let (id, len, flags, rsv, data) = (
                le16(buf, o),
                le16(buf, o + 2),
                le16(buf, o + 4),
                le16(buf, o + 6),
                le64(buf, o + 8),
            );
            if flags & !3 != 0 || rsv != 0 {
                return Err(EINVAL);
            }
            if attrs
                .iter()
                .any(|a: &(usize, u16, u16, u16, u64)| a.1 == id)
            {
                return Err(EINVAL);
            }
            attrs.push((o, id, len, flags, data));
        }
        match (object, method_id) {
            (0, 0) => self.invoke_write(buf, &attrs),
            _ => self.method(object, method_id, methods::Attrs::new(buf, &attrs)),
        }
    }

    fn mmap(&self, len: usize, prot: i32, offset: u64) -> Result<NonNull<u8>, Errno> {
        let ctx = self.ctx().ok_or(EINVAL)?;
        if offset % PAGE as u64 != 0 || len == 0 {
            return Err(EINVAL);
        }
        let pgoff = offset / PAGE as u64;
        let command = (pgoff >> 8) & 0xff;
        let index = ((pgoff & 0xff) | ((pgoff >> 16) << 8)) as usize;
        let w = self.shared.lock();
        let c = w.contexts.get(&ctx).ok_or(EINVAL)?;
        let dynamic = c.dyn_pages.values().find(|d| d.1 == pgoff).map(|d| d.0);
        let page = match command {
            _ if dynamic.is_some() => dynamic.unwrap_or(0),
            // A dynamic-UAR context refuses the legacy UAR mmaps.
            0 | 2 | 3 if c.dyn_uar => return Err(EINVAL),
            // REGULAR_PAGE, WC_PAGE, NC_PAGE: static UAR pages.
            0 | 2 | 3 => {
                if command == 2 && w.cfg.bf_reg_size == 0 {
                    return Err(Errno(libc::EPERM));
                }
                if index >= c.uar_pages {
                    return Err(EINVAL);
                }
                index
            }
            // CORE_CLOCK and CLOCK_INFO (v1): read-only.
            5 | 7 => {
                if prot & (libc::PROT_WRITE | libc::PROT_EXEC) != 0 {
                    return Err(Errno(libc::EPERM));
                }
                if command == 7 && index != 0 {
                    return Err(EINVAL);
                }
                c.uar_pages + if command == 5 { 0 } else { 1 }
            }
            1 => return Err(Errno(libc::ENOSYS)),
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
        if unsafe { libc::munmap(addr.as_ptr().cast(), len) } != 0 {
            return Err(Errno(libc::EINVAL));
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
            unsafe { libc::munmap(a as *mut libc::c_void, l) };
        }
        if let Some(ctx) = self.ctx() {
            let mut w = self.shared.lock();
            close_context(&mut w, ctx);
        }
    }
}

/// Tear down a context and everything it owns.
fn close_context(w: &mut World, ctx: u64) {
    let Some(c) = w.contexts.remove(&ctx) else {
        return;
    };
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

fn new_channel(w: &mut World, record: usize) -> Result<(usize, i32), Errno> {
    let ch = EventChannel::new(record)?;
    let fd = ch.user_fd;
    // Reuse the slot of a closed context's channel, if any.
    if let Some(i) = w.channels.iter().position(Option::is_none) {
        w.channels[i] = Some(ch);
        return Ok((i, fd));
    }
    w.channels.push(Some(ch));
    Ok((w.channels.len() - 1, fd))
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

// ---------------------------------------------------------------------------------------
// Context and queries

fn get_context(w: &mut World, hca: usize, r: &Req) -> Result<u64, Errno> {
    // mlx5_ib_alloc_ucontext_req (8 B) or _req_v2 (32 B): 0 total_num_bfregs,
    // 4 num_low_latency_bfregs, 8 flags, 12 comp_mask, 16 max_cqe_version,
    // 17..24 reserved, 24 lib_caps.
    let inlen = r.drv_in.len();
    let v2 = if inlen == 8 {
        false
    } else if inlen >= 16 {
        true
    } else {
        return Err(EINVAL);
    };
    let d = r.drv(32)?;
    let total = le32(&d, 0);
    let low_lat = le32(&d, 4);
    if v2 {
        if le32(&d, 8) & !1 != 0 {
            return Err(EINVAL);
        }
        if le32(&d, 12) != 0 || d[17..24].iter().any(|&b| b != 0) {
            return Err(EOPNOTSUPP);
        }
    }
    let max_cqe_version = if v2 { d[16] } else { 0 };
    let total = (total + 1) & !1;
    if total == 0 || total > caps::MAX_BFREGS {
        return Err(if total == 0 {
            EINVAL
        } else {
            Errno(libc::ENOMEM)
        });
    }
    if low_lat > total - 1 {
        return Err(EINVAL);
    }
    // Dynamic UARs (MLX5_LIB_CAP_DYN_UAR) when configured and the ioctl framework exists:
    // no static pages; UARs come from the UAR object (tot_bfregs = 0 in the response).
    let lib_caps = if v2 { le64(&d, 24) } else { 0 };
    let dyn_uar = w.cfg.dyn_uar && w.cfg.flavour == Flavour::Modern && lib_caps & 2 != 0;
    let total = if dyn_uar { 0 } else { total };
    let uar_pages = (total / 2) as usize;
    let uar = UarRegion::new(uar_pages + 2 + MAX_DYN_UARS)?;
    // Clock-info page (v1): 0 sign, 4 resv, 8 nsec, 16 cycles, 24 frac, 32 mult, 36 shift,
    // 40 mask, 48 overflow_period. 1 cycle = 1 ns: mult = 1 << shift.
    let mut ci = [0u8; 56];
    ci[32..36].copy_from_slice(&(1u32 << 10).to_ne_bytes());
    ci[36..40].copy_from_slice(&10u32.to_ne_bytes());
    ci[40..48].copy_from_slice(&((1u64 << 48) - 1).to_ne_bytes());
    ci[48..56].copy_from_slice(&(1u64 << 40).to_ne_bytes());
    for (i, ch) in ci.chunks(8).enumerate() {
        let mut b = [0u8; 8];
        b.copy_from_slice(ch);
        uar.store(uar_pages + 1, i * 8, b);
    }
    let (async_ch, async_fd) = new_channel(w, 16)?;
    let cqe_version = max_cqe_version.min(w.cfg.cqe_version).min(1);
    let roce = w.hcas[hca].info.is_roce();
    // ib_uverbs_get_context_resp: 0 async_fd, 4 num_comp_vectors.
    let mut core = Out::new(8);
    core.u32(0, async_fd as u32).u32(4, 1);
    // mlx5_ib_alloc_ucontext_resp (72 B).
    let mut d = Out::new(72);
    d.u32(0, 1 << caps::LOG_MAX_QP)
        .u32(4, w.cfg.bf_reg_size)
        .u32(8, total)
        .u32(12, 64)
        .u16(16, caps::MAX_SQ_DESC as u16)
        .u16(18, caps::MAX_RQ_DESC as u16)
        .u32(20, caps::MAX_QP_WR)
        .u32(24, caps::MAX_QP_WR)
        .u32(28, caps::MAX_SRQ_WR)
        .u16(32, 1)
        .u16(34, 0)
        .u32(36, 0x1 | 0x2)
        .u32(40, r.drv_out_len.min(72) as u32)
        .u8(44, cqe_version)
        // cmds_supp_uhw: QUERY_DEVICE and CREATE_AH take driver data (mlx5_ib sets both
        // on every port type; CREATE_AH answers with the destination MAC on Ethernet only,
        // and libmlx5 asks for it only there). eth_min_inline: on Ethernet the minimum
        // inline mode + 1 (ConnectX-5: none -> 1), 0 otherwise.
        .u8(45, 1 | 2)
        .u8(46, u8::from(roce))
        .u8(47, 1)
        .u64(48, caps::CORE_CLOCK_OFFSET)
        .u32(56, 12)
        .u32(60, 1)
        .u32(64, 0)
        .u32(68, 0x7fff_ffff);
    let respond = r.respond(&core).and_then(|()| r.respond_drv(&d));
    if let Err(e) = respond {
        w.channels[async_ch] = None;
        return Err(e);
    }
    if let Some(Some(ch)) = w.channels.get_mut(async_ch) {
        ch.handed_out = true;
    }
    let id = w.next_ctx;
    w.next_ctx += 1;
    w.contexts.insert(
        id,
        Context {
            hca,
            cqe_version,
            tot_bfregs: total,
            num_low_lat: low_lat,
            bfreg_users: vec![0; total as usize],
            uar_pages,
            uar_active: (0..uar_pages).collect(),
            dyn_uar,
            dyn_pages: Default::default(),
            next_dyn: 0,
            uar,
            async_ch,
            comp_by_fd: Default::default(),
            handles: Default::default(),
            next_handle: 0,
        },
    );
    Ok(id)
}

fn query_device(w: &World, ctx: u64, r: &Req) -> Result<(), Errno> {
    let h = &w.hcas[hca_of(w, ctx)];
    if r.ex {
        // ib_uverbs_ex_query_device: 0 comp_mask, 4 reserved.
        if le32(&r.core, 0) != 0 || le32(&r.core, 4) != 0 {
            return Err(EINVAL);
        }
    }
    let mut o = Out::new(if r.ex { 304 } else { 176 });
    // ib_uverbs_query_device_resp
    o.u64(0, h.info.fw_ver_raw)
        .bytes(8, &h.info.node_guid.to_be_bytes())
        .bytes(16, &h.info.sys_image_guid.to_be_bytes())
        .u64(24, u64::MAX)
        .u64(32, 0xffff_f000)
        .u32(40, h.info.vendor_id)
        .u32(44, h.info.vendor_part_id)
        .u32(48, 0)
        .u32(52, 1 << caps::LOG_MAX_QP)
        .u32(56, caps::MAX_QP_WR)
        // device_cap_flags: RESIZE_MAX_WR|BAD_PKEY_CNTR|BAD_QKEY_CNTR|CHANGE_PHY_PORT|
        // PORT_ACTIVE_EVENT|SYS_IMAGE_GUID|RC_RNR_NAK_GEN|MEM_MGT_EXTENSIONS
        .u32(
            60,
            0x1 | 0x2 | 0x4 | 0x20 | 0x400 | 0x800 | 0x1000 | 0x20_0000,
        )
        .u32(64, caps::MAX_SGE)
        .u32(68, caps::MAX_SGE)
        .u32(72, 1 << 24)
        .u32(76, caps::MAX_CQE)
        .u32(80, 1 << 24)
        .u32(84, 1 << 24)
        .u32(88, caps::MAX_RD_ATOM)
        .u32(92, 0)
        .u32(96, caps::MAX_RD_ATOM << caps::LOG_MAX_QP)
        .u32(100, caps::MAX_RD_ATOM)
        .u32(104, 0)
        .u32(108, 1) // IBV_ATOMIC_HCA
        .u32(120, 1 << 24)
        .u32(132, 1 << 21)
        .u32(136, 1 << 16)
        .u32(140, 1 << 21)
        .u32(144, 0x7fff_ffff)
        .u32(156, 1 << 23)
        .u32(160, caps::MAX_SRQ_WR)
        .u32(164, caps::MAX_SRQ_SGE)
        .u16(168, 128)
        .u8(170, 16)
        .u8(171, 1);
    if r.ex {
        // ib_uverbs_ex_query_device_resp tail: 176 comp_mask, 180 response_length,
        // 184 odp_caps, 208 timestamp_mask, 216 hca_core_clock (kHz), 224 device_cap_flags_ex.
        let len = r.out_len.min(304) as u32;
        o.u32(176, 0)
            .u32(180, len)
            .u64(208, (1 << 48) - 1)
            .u64(216, caps::CLOCK_KHZ);
        // mlx5_ib_query_device_resp (104 B): 0 comp_mask, 4 response_length, rest zero caps.
        let mut d = Out::new(104);
        d.u32(4, r.drv_out_len.min(104) as u32);
        r.respond(&o)?;
        return r.respond_drv(&d);
    }
    r.respond(&o)
}

fn query_port(w: &World, ctx: u64, r: &Req) -> Result<(), Errno> {
    // ib_uverbs_query_port: 0 response, 8 port_num, 9..16 reserved.
    if u8at(&r.core, 8) != 1 {
        return Err(EINVAL);
    }
    let h = &w.hcas[hca_of(w, ctx)];
    let mut o = Out::new(40);
    // ib_uverbs_query_port_resp: 0 port_cap_flags, 4 max_msg_sz, 8 bad_pkey_cntr,
    // 12 qkey_viol_cntr, 16 gid_tbl_len, 20 pkey_tbl_len, 22 lid, 24 sm_lid, 26 state,
    // 27 max_mtu, 28 active_mtu, 29 lmc, 30 max_vl_num, 31 sm_sl, 32 subnet_timeout,
    // 33 init_type_reply, 34 active_width, 35 active_speed, 36 phys_state, 37 link_layer,
    // 38 flags.
    o.u32(4, 1 << 30)
        .u32(16, h.info.gid_tbl_len())
        .u16(20, 1) // pkey_tbl_len
        .u8(26, 4) // state ACTIVE
        .u8(27, 5) // max_mtu 4096
        .u8(34, 2) // active_width 4X
        .u8(35, 32) // active_speed EDR (25 Gb/s per lane: 100GbE on a RoCE port)
        .u8(36, 5); // phys_state LinkUp
    if h.info.is_roce() {
        // mlx5_ib on Ethernet: CM supported, IP-based GIDs (the uverbs flag the core adds
        // for ip_gids); no LID, SM or VLs; the active MTU is the largest IB MTU that fits
        // the netdev MTU (1500) minus the RoCE headers: 1024.
        o.u32(0, caps::PORT_CM_SUP | caps::PORT_IP_BASED_GIDS)
            .u8(28, 3) // active_mtu 1024
            .u8(37, 2); // link_layer Ethernet
    } else {
        o.u32(0, 0x0001_0000 | 0x0200_0000) // CM_SUP | ... IS_SM-less
            .u16(22, h.info.lid)
            .u16(24, 1) // sm_lid
            .u8(28, 5) // active_mtu
            .u8(30, 4) // max_vl_num
            .u8(32, 18) // subnet_timeout
            .u8(37, 1); // link_layer IB
    }
    r.respond(&o)
}

/// The valid GID table entry `index` of the context's port, if any.
pub(crate) fn gid_at(w: &World, hca: usize, index: u32) -> Option<crate::GidEntry> {
    w.hcas[hca]
        .info
        .gid_table()
        .into_iter()
        .find(|e| e.index == index)
}

// ---------------------------------------------------------------------------------------
// PD, MR, AH, comp channel

fn alloc_pd(w: &mut World, ctx: u64, r: &Req) -> Result<(), Errno> {
    let hca = hca_of(w, ctx);
    let pdn = next_id(w, hca);
    let mut o = Out::new(4);
    let handle = w.contexts[&ctx].next_handle;
    o.u32(0, handle);
    let mut d = Out::new(4);
    d.u32(0, pdn);
    r.respond(&o)?;
    r.respond_drv(&d)?;
    new_handle(w, ctx, Obj::Pd(pdn));
    w.hcas[hca].pds.insert(pdn, Pd { ctx, users: 0 });
    Ok(())
}

fn dealloc_pd(w: &mut World, ctx: u64, r: &Req) -> Result<(), Errno> {
    let handle = le32(&r.core, 0);
    let pdn = pd_of(w, ctx, handle)?;
    let hca = hca_of(w, ctx);
    if w.hcas[hca].pds.get(&pdn).is_some_and(|p| p.users > 0) {
        return Err(EBUSY);
    }
    w.hcas[hca].pds.remove(&pdn);
    remove_handle(w, ctx, handle);
    Ok(())
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

fn reg_mr(w: &mut World, ctx: u64, r: &Req) -> Result<(), Errno> {
    // ib_uverbs_reg_mr: 0 response, 8 start, 16 length, 24 hca_va, 32 pd_handle, 36 access.
    let (start, length, iova) = (le64(&r.core, 8), le64(&r.core, 16), le64(&r.core, 24));
    let acc = le32(&r.core, 36);
    let pdn = pd_of(w, ctx, le32(&r.core, 32))?;
    let known = access::LOCAL_WRITE
        | access::REMOTE_WRITE
        | access::REMOTE_READ
        | access::REMOTE_ATOMIC
        | access::MW_BIND
        | access::ZERO_BASED
        | access::RELAXED_ORDERING;
    if acc & !known != 0 {
        return Err(EINVAL);
    }
    if acc & (access::REMOTE_WRITE | access::REMOTE_ATOMIC) != 0 && acc & access::LOCAL_WRITE == 0 {
        return Err(EINVAL);
    }
    if (start ^ iova) & (PAGE as u64 - 1) != 0 || length == 0 || start.checked_add(length).is_none()
    {
        return Err(EINVAL);
    }
    mem::probe(start, length)?;
    let hca = hca_of(w, ctx);
    let h = &mut w.hcas[hca];
    let idx = h.next_key;
    h.next_key = (h.next_key + 1) & 0xff_ffff;
    let key = (idx << 8) | ((idx.wrapping_mul(0x5b) + 0x11) & 0xff);
    let handle = w.contexts[&ctx].next_handle;
    let mut o = Out::new(12);
    o.u32(0, handle).u32(4, key).u32(8, key);
    r.respond(&o)?;
    new_handle(w, ctx, Obj::Mr(idx));
    w.hcas[hca].mrs.insert(
        idx,
        Mr {
            ctx,
            pdn,
            start,
            length,
            iova,
            access: acc,
            key,
        },
    );
    pd_use(w, hca, pdn, 1);
    Ok(())
}

fn dereg_mr(w: &mut World, ctx: u64, r: &Req) -> Result<(), Errno> {
    destroy_pd_child(w, ctx, le32(&r.core, 0), Obj::Mr, |h, id| {
        h.mrs.remove(&id).map(|m| m.pdn)
    })
}

/// Destroy an object that only holds a reference on its PD (MR, AH): `remove` takes it out
/// of the HCA and returns its PD number.
fn destroy_pd_child(
    w: &mut World,
    ctx: u64,
    handle: u32,
    kind: fn(u32) -> Obj,
    remove: impl FnOnce(&mut crate::state::Hca, u32) -> Option<u32>,
) -> Result<(), Errno> {
    let id = handle_of(w, ctx, handle, kind)?;
    let hca = hca_of(w, ctx);
    if let Some(pdn) = remove(&mut w.hcas[hca], id) {
        pd_use(w, hca, pdn, -1);
    }
    remove_handle(w, ctx, handle);
    Ok(())
}

fn create_ah(w: &mut World, ctx: u64, r: &Req) -> Result<(), Errno> {
    // ib_uverbs_create_ah: 0 response, 8 user_handle, 16 pd_handle, 20 reserved,
    // 24 ah_attr { 24 dgid[16], 40 flow_label, 44 sgid_index, 45 hop_limit, 46 tclass,
    // 48 dlid, 50 sl, 51 src_path_bits, 52 static_rate, 53 is_global, 54 port_num }.
    let pdn = pd_of(w, ctx, le32(&r.core, 16))?;
    let hca = hca_of(w, ctx);
    let roce = w.hcas[hca].info.is_roce();
    let (sgid_index, is_global) = (u8at(&r.core, 44), u8at(&r.core, 53) != 0);
    if u8at(&r.core, 54) != 1 {
        return Err(EINVAL);
    }
    let mut dgid = [0u8; 16];
    dgid.copy_from_slice(&r.core[24..40]);
    let mut dmac = [0u8; 6];
    if roce {
        // RoCE: the AH must be global, with a valid source GID; the kernel resolves the
        // destination MAC and (with udata) returns it in mlx5_ib_create_ah_resp
        // (0 response_length, 4 dmac[6], 10 reserved[6]); response_length = 10.
        if !is_global || gid_at(w, hca, u32::from(sgid_index)).is_none() {
            return Err(EINVAL);
        }
        dmac = crate::roce::resolve_dmac(&dgid).ok_or(Errno(libc::EHOSTUNREACH))?;
        if r.drv_out_len > 0 && r.drv_out_len < 10 {
            return Err(EINVAL);
        }
    } else if sgid_index != 0 && is_global {
        return Err(EINVAL);
    }
    let id = next_id(w, hca);
    let handle = w.contexts[&ctx].next_handle;
    let mut o = Out::new(4);
    o.u32(0, handle);
    r.respond(&o)?;
    if roce && r.drv_out_len >= 10 {
        let mut d = Out::new(16);
        d.u32(0, 10).bytes(4, &dmac);
        r.respond_drv(&d)?;
    }
    new_handle(w, ctx, Obj::Ah(id));
    w.hcas[hca].ahs.insert(
        id,
        Ah {
            ctx,
            pdn,
            dlid: le16(&r.core, 48),
            dgid,
            is_global,
            sgid_index,
            dmac,
        },
    );
    pd_use(w, hca, pdn, 1);
    Ok(())
}

fn destroy_ah(w: &mut World, ctx: u64, r: &Req) -> Result<(), Errno> {
    destroy_pd_child(w, ctx, le32(&r.core, 0), Obj::Ah, |h, id| {
        h.ahs.remove(&id).map(|a| a.pdn)
    })
}

fn create_comp_channel(w: &mut World, ctx: u64, r: &Req) -> Result<(), Errno> {
    let (ch, fd) = new_channel(w, 8)?;
    let mut o = Out::new(4);
    o.u32(0, fd as u32);
    if let Err(e) = r.respond(&o) {
        w.channels[ch] = None;
        return Err(e);
    }
    if let Some(c) = w.contexts.get_mut(&ctx) {
        c.comp_by_fd.insert(fd, ch);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// CQ

fn create_cq(w: &mut World, ctx: u64, r: &Req) -> Result<(), Errno> {
    // legacy ib_uverbs_create_cq: 0 response, 8 user_handle, 16 cqe, 20 comp_vector,
    // 24 comp_channel, 28 reserved. ex: 0 user_handle, 8 cqe, 12 comp_vector,
    // 16 comp_channel, 20 comp_mask, 24 flags, 28 reserved.
    let b = if r.ex { 0 } else { 8 };
    let user_handle = le64(&r.core, b);
    let cqe = le32(&r.core, b + 8);
    let comp_vector = le32(&r.core, b + 12);
    let comp_channel = le32(&r.core, b + 16) as i32;
    let mut flags = 0;
    if r.ex {
        if le32(&r.core, 20) != 0 {
            return Err(EINVAL);
        }
        flags = le32(&r.core, 24);
        if flags & !3 != 0 {
            return Err(EOPNOTSUPP);
        }
    }
    if cqe == 0 || cqe > caps::MAX_CQE || comp_vector >= 1 {
        return Err(EINVAL);
    }
    let channel = if comp_channel >= 0 {
        Some(
            *w.contexts[&ctx]
                .comp_by_fd
                .get(&comp_channel)
                .ok_or(EINVAL)?,
        )
    } else {
        None
    };
    // mlx5_ib_create_cq: 0 buf_addr, 8 db_addr, 16 cqe_size, 20 cqe_comp_en,
    // 21 cqe_comp_res_format, 22 flags (u16), 24 uar_page_index, 26 reserved0, 28 reserved1.
    if r.drv_in.len() < 24 {
        return Err(EFAULT);
    }
    let d = r.drv(32)?;
    let (buf, db, cqe_size) = (le64(&d, 0), le64(&d, 8), le32(&d, 16));
    let dflags = le16(&d, 22);
    if dflags & !(0x1 | 0x2 | 0x4) != 0 || le16(&d, 26) != 0 || le32(&d, 28) != 0 {
        return Err(EINVAL);
    }
    let cx = &w.contexts[&ctx];
    if dflags & 0x2 != 0 {
        // UAR_PAGE_INDEX must name a UAR object of this context.
        if !cx.dyn_pages.contains_key(&u32::from(le16(&d, 24))) {
            return Err(EINVAL);
        }
    } else if cx.dyn_uar {
        // A dynamic-UAR context has no default UAR for CQs.
        return Err(EINVAL);
    }
    if cqe_size != 64 && cqe_size != 128 {
        return Err(EINVAL);
    }
    if d[20] != 0 {
        return Err(EOPNOTSUPP);
    }
    let ncqe = (cqe + 1).next_power_of_two();
    pin_queue(buf, u64::from(ncqe) * u64::from(cqe_size), db, 8, 8)?;
    let hca = hca_of(w, ctx);
    let cqn = next_id(w, hca);
    let handle = w.contexts[&ctx].next_handle;
    let mut o = Out::new(16);
    o.u32(0, handle)
        .u32(4, ncqe - 1)
        .u32(8, 0)
        .u32(12, r.out_len.min(16) as u32);
    let mut dr = Out::new(8);
    dr.u32(0, cqn);
    r.respond(&o)?;
    r.respond_drv(&dr)?;
    new_handle(w, ctx, Obj::Cq(cqn));
    w.hcas[hca].cqs.insert(
        cqn,
        Cq {
            ctx,
            user_handle,
            buf,
            db,
            ncqe,
            cqe_size,
            pi: 0,
            ci_seen: 0,
            channel,
            armed: None,
            armed_sn: 0,
            last_fired_sn: None,
            events: 0,
            async_events: 0,
            ignore_overrun: flags & 2 != 0,
            in_error: false,
            users: 0,
        },
    );
    Ok(())
}

fn destroy_cq(w: &mut World, ctx: u64, r: &Req) -> Result<(), Errno> {
    // ib_uverbs_destroy_cq: 0 response, 8 cq_handle, 12 reserved.
    let handle = le32(&r.core, 8);
    let cqn = cq_of(w, ctx, handle)?;
    let hca = hca_of(w, ctx);
    let cq = &w.hcas[hca].cqs[&cqn];
    if cq.users > 0 {
        return Err(EBUSY);
    }
    let queued = cq
        .channel
        .and_then(|c| w.channels[c].as_ref())
        .map_or(0, |c| c.queued());
    let reported = cq.events.saturating_sub(queued) as u32;
    let mut o = Out::new(8);
    o.u32(0, reported).u32(4, cq.async_events);
    r.respond(&o)?;
    w.hcas[hca].cqs.remove(&cqn);
    remove_handle(w, ctx, handle);
    Ok(())
}

/// Take (`delta` 1) or drop (-1) a QP's references on its PD, CQs and SRQ.
fn qp_refs(
    w: &mut World,
    hca: usize,
    (pdn, scq, rcq, srq): (u32, u32, u32, Option<u32>),
    delta: i32,
) {
    pd_use(w, hca, pdn, delta);
    cq_use(w, hca, scq, delta);
    cq_use(w, hca, rcq, delta);
    if let Some(s) = srq {
        bump(w.hcas[hca].srqs.get_mut(&s).map(|s| &mut s.users), delta);
    }
}

fn cq_use(w: &mut World, hca: usize, cqn: u32, delta: i32) {
    bump(w.hcas[hca].cqs.get_mut(&cqn).map(|c| &mut c.users), delta);
}

// ---------------------------------------------------------------------------------------
// QP

fn create_qp(w: &mut World, ctx: u64, r: &Req) -> Result<(), Errno> {
    // legacy ib_uverbs_create_qp: 0 response, 8 user_handle, 16 pd, 20 send_cq, 24 recv_cq,
    // 28 srq, 32 max_send_wr, 36 max_recv_wr, 40 max_send_sge, 44 max_recv_sge,
    // 48 max_inline_data, 52 sq_sig_all, 53 qp_type, 54 is_srq, 55 reserved.
    // ex: the same without `response` (shift -8), then 48 comp_mask, 52 create_flags,
    // 56 rwq_ind_tbl_handle, 60 source_qpn.
    let b = if r.ex { 0 } else { 8 };
    let c = &r.core;
    if r.ex && (le32(c, 48) != 0 || le32(c, 52) != 0) {
        return Err(EINVAL);
    }
    let user_handle = le64(c, b);
    let qp_type = u8at(c, b + 45);
    if ![qpt::RC, qpt::UC, qpt::UD].contains(&qp_type) {
        return Err(EOPNOTSUPP);
    }
    let pdn = pd_of(w, ctx, le32(c, b + 8))?;
    let send_cq = cq_of(w, ctx, le32(c, b + 12))?;
    let recv_cq = cq_of(w, ctx, le32(c, b + 16))?;
    let is_srq = u8at(c, b + 46) != 0;
    let srq = if is_srq {
        Some(srq_of(w, ctx, le32(c, b + 20))?)
    } else {
        None
    };
    let cap = [
        le32(c, b + 24),
        le32(c, b + 28),
        le32(c, b + 32),
        le32(c, b + 36),
        le32(c, b + 40),
    ];
    if cap[0] > caps::MAX_QP_WR
        || cap[1] > caps::MAX_QP_WR
        || cap[2] > caps::MAX_SGE
        || cap[3] > caps::MAX_SGE
        || cap[4] > caps::MAX_INLINE
    {
        return Err(EINVAL);
    }
    let cqe_version = w.contexts[&ctx].cqe_version;
    // mlx5_ib_create_qp: 0 buf_addr, 8 db_addr, 16 sq_wqe_count, 20 rq_wqe_count,
    // 24 rq_wqe_shift, 28 flags, 32 uidx, 36 bfreg_index, 40 sq_buf_addr, 48 ece_options.
    if r.drv_in.len() < 32 || (cqe_version != 0 && r.drv_in.len() < 36) {
        return Err(EINVAL);
    }
    let d = r.drv(56)?;
    let (buf, db) = (le64(&d, 0), le64(&d, 8));
    let (sq_cnt, rq_cnt, rq_shift, flags) =
        (le32(&d, 16), le32(&d, 20), le32(&d, 24), le32(&d, 28));
    let uidx = if cqe_version != 0 {
        le32(&d, 32)
    } else {
        0xff_ffff
    };
    // SIGNATURE | SCATTER_CQE | ALLOW_SCATTER_CQE | UAR_PAGE_INDEX are understood.
    if flags & !(0x1 | 0x2 | 0x100 | 0x400) != 0 {
        return Err(EINVAL);
    }
    let uar_page = flags & 0x400 != 0;
    let cx = &w.contexts[&ctx];
    if uar_page && !cx.dyn_pages.contains_key(&le32(&d, 36)) || !uar_page && cx.dyn_uar {
        return Err(EINVAL);
    }
    if uidx > 0xff_ffff || (cqe_version != 0 && uidx == 0xff_ffff) {
        return Err(EINVAL);
    }
    if (sq_cnt != 0 && !sq_cnt.is_power_of_two())
        || sq_cnt > caps::MAX_QP_WR
        || (sq_cnt == 0 && cap[0] > 0)
    {
        return Err(EINVAL);
    }
    if is_srq && rq_cnt != 0 {
        return Err(EINVAL);
    }
    if rq_cnt != 0
        && (!rq_cnt.is_power_of_two() || rq_cnt > caps::MAX_QP_WR || !(4..=11).contains(&rq_shift))
    {
        return Err(EINVAL);
    }
    if !is_srq && rq_cnt < cap[1] {
        return Err(EINVAL);
    }
    if rq_cnt != 0 && (1u32 << rq_shift) / 16 < cap[3].max(1) {
        return Err(EINVAL);
    }
    let bytes = ((rq_cnt as u64) << rq_shift) + sq_cnt as u64 * 64;
    pin_queue(buf, bytes, db, 8, 4)?;
    let hca = hca_of(w, ctx);
    // bfreg choice, static scheme: dedicated low-latency bfregs from the top first, then the
    // least used medium one, else bfreg 0 (doorbell only).
    let bfreg = if uar_page {
        u32::MAX // the QP rings the dynamic UAR it named
    } else {
        let cx = w.contexts.get_mut(&ctx).expect("context exists");
        let t = cx.tot_bfregs as usize;
        let first_hi = t - cx.num_low_lat as usize;
        let pick = (first_hi..t)
            .find(|&i| cx.bfreg_users[i] == 0)
            .or_else(|| (1..first_hi).min_by_key(|&i| cx.bfreg_users[i]))
            .unwrap_or(0);
        cx.bfreg_users[pick] += 1;
        pick as u32
    };
    let qpn = next_id(w, hca);
    let handle = w.contexts[&ctx].next_handle;
    let mut o = Out::new(40);
    o.u32(0, handle)
        .u32(4, qpn)
        .u32(8, cap[0])
        .u32(12, cap[1])
        .u32(16, cap[2])
        .u32(20, cap[3])
        .u32(24, cap[4])
        .u32(32, 0)
        .u32(36, r.out_len.min(40) as u32);
    // mlx5_ib_create_qp_resp: 0 bfreg_index (libmlx5 table index), 4 ece_options, 8 comp_mask.
    let mut dr = Out::new(40);
    // MLX5_IB_INVALID_BFREG (bit 31) when the QP uses a dynamic UAR.
    dr.u32(
        0,
        if uar_page {
            0x8000_0000
        } else {
            bfreg / 2 * 4 + bfreg % 2
        },
    );
    let res = r.respond(&o).and_then(|()| r.respond_drv(&dr));
    if let Err(e) = res {
        if let Some(u) = w
            .contexts
            .get_mut(&ctx)
            .and_then(|cx| cx.bfreg_users.get_mut(bfreg as usize))
        {
            *u -= 1;
        }
        return Err(e);
    }
    new_handle(w, ctx, Obj::Qp(qpn));
    qp_refs(w, hca, (pdn, send_cq, recv_cq, srq), 1);
    w.hcas[hca].qps.insert(
        qpn,
        Qp {
            ctx,
            qpn,
            qp_type,
            state: qps::RESET,
            pdn,
            send_cq,
            recv_cq,
            srq,
            user_handle,
            sq_sig_all: u8at(c, b + 44) != 0,
            buf,
            db,
            sq_wqe_cnt: sq_cnt,
            rq_wqe_cnt: rq_cnt,
            rq_wqe_shift: rq_shift,
            uidx,
            bfreg,
            scatter_cqe: flags & 0x2 != 0,
            req_scatter: flags & 0x2 != 0 && (u8at(c, b + 44) != 0 || flags & 0x100 != 0),
            cap,
            port: 1,
            pkey_index: 0,
            qkey: 0,
            access: 0,
            path_mtu: 5,
            dest_qpn: 0,
            rq_psn: 0,
            sq_psn: 0,
            timeout: 0,
            retry_cnt: 0,
            rnr_retry: 0,
            min_rnr_timer: 0,
            max_rd_atomic: 0,
            max_dest_rd_atomic: 0,
            path: Path::default(),
            sq_head: 0,
            sq_rung: 0,
            rq_head: 0,
            rq_pi_seen: 0,
            rq_prefetch: (0, Vec::new()),
            rc: Default::default(),
            sqd_notify: false,
            events_reported: 0,
        },
    );
    Ok(())
}

/// `enum ib_qp_attr_mask` bits.
pub(crate) mod mask {
    pub(crate) const STATE: u32 = 1 << 0;
    pub(crate) const CUR_STATE: u32 = 1 << 1;
    pub(crate) const EN_SQD_ASYNC_NOTIFY: u32 = 1 << 2;
    pub(crate) const ACCESS_FLAGS: u32 = 1 << 3;
    pub(crate) const PKEY_INDEX: u32 = 1 << 4;
    pub(crate) const PORT: u32 = 1 << 5;
    pub(crate) const QKEY: u32 = 1 << 6;
    pub(crate) const AV: u32 = 1 << 7;
    pub(crate) const PATH_MTU: u32 = 1 << 8;
    pub(crate) const TIMEOUT: u32 = 1 << 9;
    pub(crate) const RETRY_CNT: u32 = 1 << 10;
    pub(crate) const RNR_RETRY: u32 = 1 << 11;
    pub(crate) const RQ_PSN: u32 = 1 << 12;
    pub(crate) const MAX_QP_RD_ATOMIC: u32 = 1 << 13;
    pub(crate) const ALT_PATH: u32 = 1 << 14;
    pub(crate) const MIN_RNR_TIMER: u32 = 1 << 15;
    pub(crate) const SQ_PSN: u32 = 1 << 16;
    pub(crate) const MAX_DEST_RD_ATOMIC: u32 = 1 << 17;
    pub(crate) const PATH_MIG_STATE: u32 = 1 << 18;
    pub(crate) const DEST_QPN: u32 = 1 << 20;
}

/// The kernel's transition table (`ib_modify_qp_is_ok`): (required, optional) attribute
/// masks for `cur -> next` on a QP of type `t`, or None if the transition is invalid.
pub(crate) fn transition(cur: u8, next: u8, t: u8) -> Option<(u32, u32)> {
    use mask::*;
    let by = |ud: u32, uc: u32, rc: u32| match t {
        qpt::UD => ud,
        qpt::UC => uc,
        _ => rc,
    };
    Some(match (cur, next) {
        (_, qps::RESET) | (_, qps::ERR) => (0, 0),
        (qps::RESET, qps::INIT) => (
            by(
                PKEY_INDEX | PORT | QKEY,
                PKEY_INDEX | PORT | ACCESS_FLAGS,
                PKEY_INDEX | PORT | ACCESS_FLAGS,
            ),
            0,
        ),
        (qps::INIT, qps::INIT) => (
            0,
            by(
                PKEY_INDEX | PORT | QKEY,
                PKEY_INDEX | PORT | ACCESS_FLAGS,
                PKEY_INDEX | PORT | ACCESS_FLAGS,
            ),
        ),
        (qps::INIT, qps::RTR) => (
            by(
                0,
                AV | PATH_MTU | DEST_QPN | RQ_PSN,
                AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER,
            ),
            by(
                PKEY_INDEX | QKEY,
                ALT_PATH | ACCESS_FLAGS | PKEY_INDEX,
                ALT_PATH | ACCESS_FLAGS | PKEY_INDEX,
            ),
        ),
        (qps::RTR, qps::RTS) => (
            by(
                SQ_PSN,
                SQ_PSN,
                SQ_PSN | TIMEOUT | RETRY_CNT | RNR_RETRY | MAX_QP_RD_ATOMIC,
            ),
            by(
                CUR_STATE | QKEY,
                CUR_STATE | ALT_PATH | ACCESS_FLAGS | PATH_MIG_STATE,
                CUR_STATE | ALT_PATH | ACCESS_FLAGS | MIN_RNR_TIMER | PATH_MIG_STATE,
            ),
        ),
        (qps::RTS, qps::RTS) | (qps::SQD, qps::RTS) => (
            0,
            by(
                CUR_STATE | QKEY,
                CUR_STATE | ACCESS_FLAGS | ALT_PATH | PATH_MIG_STATE,
                CUR_STATE | ACCESS_FLAGS | ALT_PATH | PATH_MIG_STATE | MIN_RNR_TIMER,
            ),
        ),
        (qps::RTS, qps::SQD) => (0, EN_SQD_ASYNC_NOTIFY),
        (qps::SQD, qps::SQD) => (
            0,
            by(
                PKEY_INDEX | QKEY,
                AV | ALT_PATH | ACCESS_FLAGS | PKEY_INDEX | PATH_MIG_STATE,
                PORT | AV
                    | TIMEOUT
                    | RETRY_CNT
                    | RNR_RETRY
                    | MAX_QP_RD_ATOMIC
                    | MAX_DEST_RD_ATOMIC
                    | ALT_PATH
                    | ACCESS_FLAGS
                    | PKEY_INDEX
                    | MIN_RNR_TIMER
                    | PATH_MIG_STATE,
            ),
        ),
        (qps::SQE, qps::RTS) if t != qpt::RC => {
            (0, by(CUR_STATE | QKEY, CUR_STATE | ACCESS_FLAGS, 0))
        }
        _ => return None,
    })
}

fn modify_qp(w: &mut World, ctx: u64, r: &Req) -> Result<(), Errno> {
    // ib_uverbs_modify_qp (112 B): 0 dest (qp_dest, 32 B: 0 dgid, 16 flow_label, 20 dlid,
    // 24 sgid_index, 25 hop_limit, 26 tclass, 27 sl, 28 src_path_bits, 29 static_rate,
    // 30 is_global, 31 port_num), 32 alt_dest, 64 qp_handle, 68 attr_mask, 72 qkey,
    // 76 rq_psn, 80 sq_psn, 84 dest_qp_num, 88 qp_access_flags, 92 pkey_index,
    // 94 alt_pkey_index, 96 qp_state, 97 cur_qp_state, 98 path_mtu, 99 path_mig_state,
    // 100 en_sqd_async_notify, 101 max_rd_atomic, 102 max_dest_rd_atomic,
    // 103 min_rnr_timer, 104 port_num, 105 timeout, 106 retry_cnt, 107 rnr_retry,
    // 108 alt_port_num, 109 alt_timeout, 110 reserved[2]. ex adds 112 rate_limit, 116 rsv.
    let c = &r.core;
    if r.ex && (le32(c, 112) != 0 || le32(c, 116) != 0) {
        return Err(EOPNOTSUPP);
    }
    let qpn = qp_of(w, ctx, le32(c, 64))?;
    let m = le32(c, 68);
    let hca = hca_of(w, ctx);
    let qp = w.hcas[hca].qps.get(&qpn).ok_or(EINVAL)?;
    if m & !((1 << 21) - 1) != 0 {
        return Err(EINVAL);
    }
    let cur = if m & mask::CUR_STATE != 0 {
        u8at(c, 97)
    } else {
        qp.state
    };
    if cur > qps::ERR {
        return Err(EINVAL);
    }
    if m & mask::CUR_STATE != 0 && cur != qp.state && !(cur == qps::SQE && qp.state == qps::RTS) {
        return Err(EINVAL);
    }
    let next = if m & mask::STATE != 0 {
        u8at(c, 96)
    } else {
        cur
    };
    if next > qps::ERR {
        return Err(EINVAL);
    }
    let (req, opt) = transition(cur, next, qp.qp_type).ok_or(EINVAL)?;
    if m & req != req || m & !(req | opt | mask::STATE) != 0 {
        return Err(EINVAL);
    }
    // Value checks.
    if m & mask::PORT != 0 && u8at(c, 104) != 1 {
        return Err(EINVAL);
    }
    if m & mask::PKEY_INDEX != 0 && le16(c, 92) >= 1 {
        return Err(EINVAL);
    }
    if m & mask::PATH_MTU != 0 && !(1..=5).contains(&u8at(c, 98)) {
        return Err(EINVAL);
    }
    if m & mask::MAX_QP_RD_ATOMIC != 0 && u32::from(u8at(c, 101)) > caps::MAX_RD_ATOM {
        return Err(EINVAL);
    }
    if m & mask::MAX_DEST_RD_ATOMIC != 0 && u32::from(u8at(c, 102)) > caps::MAX_RD_ATOM {
        return Err(EINVAL);
    }
    if m & mask::TIMEOUT != 0 && u8at(c, 105) > 31
        || m & mask::RETRY_CNT != 0 && u8at(c, 106) > 7
        || m & mask::RNR_RETRY != 0 && u8at(c, 107) > 7
        || m & mask::MIN_RNR_TIMER != 0 && u8at(c, 103) > 31
    {
        return Err(EINVAL);
    }
    if m & mask::DEST_QPN != 0 && le32(c, 84) > 0xff_ffff {
        return Err(EINVAL);
    }
    if m & mask::ACCESS_FLAGS != 0
        && le32(c, 88)
            & !(access::LOCAL_WRITE
                | access::REMOTE_WRITE
                | access::REMOTE_READ
                | access::REMOTE_ATOMIC
                | access::RELAXED_ORDERING)
            != 0
    {
        return Err(EINVAL);
    }
    if m & mask::AV != 0 && (u8at(c, 31) != 1 && u8at(c, 31) != 0) {
        return Err(EINVAL);
    }
    if m & mask::PATH_MIG_STATE != 0 && u8at(c, 99) > 2 {
        return Err(EINVAL);
    }
    // RoCE (mlx5_set_path): an address vector must carry a GRH (is_global) whose source
    // GID index names a valid GID table entry; the destination MAC is resolved from the
    // GID and the DLID is not used.
    let roce = w.hcas[hca].info.is_roce();
    let mut dmac = [0u8; 6];
    if roce && m & mask::AV != 0 {
        if u8at(c, 30) == 0 || gid_at(w, hca, u32::from(u8at(c, 24))).is_none() {
            return Err(EINVAL);
        }
        let mut dgid = [0u8; 16];
        dgid.copy_from_slice(&c[0..16]);
        dmac = crate::roce::resolve_dmac(&dgid).ok_or(Errno(libc::EHOSTUNREACH))?;
    }
    if r.ex {
        // mlx5_ib_modify_qp: 0 comp_mask, 4 burst info, 12 ece_options; nothing supported.
        let d = r.drv(16)?;
        if le32(&d, 0) != 0 {
            return Err(EOPNOTSUPP);
        }
    }
    let qp = w.hcas[hca].qps.get_mut(&qpn).ok_or(EINVAL)?;
    // Byte-wide attributes: (mask bit, offset in ib_uverbs_modify_qp, field).
    for (bit, off, field) in [
        (mask::PORT, 104, &mut qp.port),
        (mask::PATH_MTU, 98, &mut qp.path_mtu),
        (mask::TIMEOUT, 105, &mut qp.timeout),
        (mask::RETRY_CNT, 106, &mut qp.retry_cnt),
        (mask::RNR_RETRY, 107, &mut qp.rnr_retry),
        (mask::MAX_QP_RD_ATOMIC, 101, &mut qp.max_rd_atomic),
        (mask::MAX_DEST_RD_ATOMIC, 102, &mut qp.max_dest_rd_atomic),
        (mask::MIN_RNR_TIMER, 103, &mut qp.min_rnr_timer),
    ] {
        if m & bit != 0 {
            *field = u8at(c, off);
        }
    }
    // 32-bit attributes: (mask bit, offset, value mask, field); PSNs are 24 bits.
    for (bit, off, keep, field) in [
        (mask::ACCESS_FLAGS, 88, u32::MAX, &mut qp.access),
        (mask::QKEY, 72, u32::MAX, &mut qp.qkey),
        (mask::RQ_PSN, 76, 0xff_ffff, &mut qp.rq_psn),
        (mask::SQ_PSN, 80, 0xff_ffff, &mut qp.sq_psn),
        (mask::DEST_QPN, 84, u32::MAX, &mut qp.dest_qpn),
    ] {
        if m & bit != 0 {
            *field = le32(c, off) & keep;
        }
    }
    if m & mask::PKEY_INDEX != 0 {
        qp.pkey_index = le16(c, 92);
    }
    if m & mask::AV != 0 {
        let mut dgid = [0u8; 16];
        dgid.copy_from_slice(&c[0..16]);
        qp.path = Path {
            // RoCE: no LIDs; the address is the GID (QUERY_QP reports DLID 0).
            dlid: if roce { 0 } else { le16(c, 20) },
            dgid,
            is_global: u8at(c, 30) != 0,
            sl: u8at(c, 27),
            port: u8at(c, 31),
            sgid_index: u8at(c, 24),
            flow_label: le32(c, 16) & 0xf_ffff,
            hop_limit: u8at(c, 25),
            tclass: u8at(c, 26),
            dmac,
        };
    }
    if next == qps::RESET {
        qp.sq_head = 0;
        qp.sq_rung = 0;
        qp.rq_head = 0;
        qp.rq_pi_seen = 0;
        qp.rq_prefetch = (0, Vec::new());
        qp.rc = Default::default();
    }
    if next == qps::RTS && cur == qps::RTR {
        qp.rc.retries_left = qp.retry_cnt;
        qp.rc.rnr_left = qp.rnr_retry;
    }
    if next == qps::SQD && cur == qps::RTS {
        // SQ drain: no new WQEs start; IBV_EVENT_SQ_DRAINED once the outstanding ones are done.
        qp.sqd_notify = m & mask::EN_SQD_ASYNC_NOTIFY != 0 && u8at(c, 100) != 0;
    }
    qp.state = next;
    if r.ex && r.drv_out_len > 0 {
        // mlx5_ib_modify_qp_resp: 0 response_length, 4 dctn, 8 ece_options, 12 reserved.
        let mut d = Out::new(16);
        d.u32(0, r.drv_out_len.min(16) as u32);
        r.respond_drv(&d)?;
    }
    if r.ex && r.out_len > 0 {
        let mut o = Out::new(8);
        o.u32(4, r.out_len.min(8) as u32);
        r.respond(&o)?;
    }
    Ok(())
}

fn query_qp(w: &World, ctx: u64, r: &Req) -> Result<(), Errno> {
    // ib_uverbs_query_qp: 0 response, 8 qp_handle, 12 attr_mask.
    let qpn = qp_of(w, ctx, le32(&r.core, 8))?;
    let q = &w.hcas[hca_of(w, ctx)].qps[&qpn];
    let mut o = Out::new(128);
    // ib_uverbs_query_qp_resp: 0 dest, 32 alt_dest, 64 max_send_wr .. 80 max_inline_data,
    // 84 qkey, 88 rq_psn, 92 sq_psn, 96 dest_qp_num, 100 qp_access_flags, 104 pkey_index,
    // 106 alt_pkey_index, 108 qp_state, 109 cur_qp_state, 110 path_mtu, 111 path_mig_state,
    // 112 sq_draining, 113 max_rd_atomic, 114 max_dest_rd_atomic, 115 min_rnr_timer,
    // 116 port_num, 117 timeout, 118 retry_cnt, 119 rnr_retry, 120 alt_port_num,
    // 121 alt_timeout, 122 sq_sig_all.
    o.bytes(0, &q.path.dgid)
        .u32(16, q.path.flow_label)
        .u16(20, q.path.dlid)
        .u8(24, q.path.sgid_index)
        .u8(25, q.path.hop_limit)
        .u8(26, q.path.tclass)
        .u8(27, q.path.sl)
        .u8(30, u8::from(q.path.is_global))
        .u8(31, q.path.port)
        .u32(64, q.cap[0])
        .u32(68, q.cap[1])
        .u32(72, q.cap[2])
        .u32(76, q.cap[3])
        .u32(80, q.cap[4])
        .u32(84, q.qkey)
        .u32(88, q.rq_psn)
        .u32(92, q.sq_psn)
        .u32(96, q.dest_qpn)
        .u32(100, q.access)
        .u16(104, q.pkey_index)
        .u8(108, q.state)
        .u8(109, q.state)
        .u8(110, q.path_mtu)
        .u8(111, 2) // MIGRATED
        .u8(113, q.max_rd_atomic)
        .u8(114, q.max_dest_rd_atomic)
        .u8(115, q.min_rnr_timer)
        .u8(116, q.port)
        .u8(117, q.timeout)
        .u8(118, q.retry_cnt)
        .u8(119, q.rnr_retry)
        .u8(122, u8::from(q.sq_sig_all));
    r.respond(&o)
}

fn destroy_qp(w: &mut World, ctx: u64, r: &Req) -> Result<(), Errno> {
    // ib_uverbs_destroy_qp: 0 response, 8 qp_handle, 12 reserved.
    let handle = le32(&r.core, 8);
    let qpn = qp_of(w, ctx, handle)?;
    let hca = hca_of(w, ctx);
    let q = &w.hcas[hca].qps[&qpn];
    let mut o = Out::new(4);
    o.u32(0, q.events_reported);
    r.respond(&o)?;
    let q = w.hcas[hca].qps.remove(&qpn).ok_or(EINVAL)?;
    qp_refs(w, hca, (q.pdn, q.send_cq, q.recv_cq, q.srq), -1);
    if let Some(cx) = w.contexts.get_mut(&ctx) {
        if let Some(u) = cx.bfreg_users.get_mut(q.bfreg as usize) {
            *u = u.saturating_sub(1);
        }
    }
    remove_handle(w, ctx, handle);
    Ok(())
}

// ---------------------------------------------------------------------------------------
// SRQ

fn create_srq(w: &mut World, ctx: u64, r: &Req) -> Result<(), Errno> {
    // ib_uverbs_create_srq: 0 response, 8 user_handle, 16 pd_handle, 20 max_wr, 24 max_sge,
    // 28 srq_limit.
    let c = &r.core;
    let pdn = pd_of(w, ctx, le32(c, 16))?;
    let (max_wr, max_sge, limit) = (le32(c, 20), le32(c, 24), le32(c, 28));
    if max_wr == 0 || max_wr > caps::MAX_SRQ_WR || max_sge > caps::MAX_SRQ_SGE || limit > max_wr {
        return Err(EINVAL);
    }
    // mlx5_ib_create_srq: 0 buf_addr, 8 db_addr, 16 flags, 20 reserved0, 24 uidx, 28 reserved1.
    if r.drv_in.len() < 24 {
        return Err(EINVAL);
    }
    let d = r.drv(32)?;
    let (buf, db, flags) = (le64(&d, 0), le64(&d, 8), le32(&d, 16));
    if flags & !1 != 0 || le32(&d, 20) != 0 || le32(&d, 28) != 0 {
        return Err(EINVAL);
    }
    let wqe_cnt = (max_wr + 1).next_power_of_two();
    let stride = (16 + 16 * max_sge.max(1)).next_power_of_two().max(32);
    if stride > caps::MAX_RQ_DESC {
        return Err(EINVAL);
    }
    let eff_sge = (stride - 16) / 16;
    pin_queue(buf, u64::from(wqe_cnt) * u64::from(stride), db, 4, 4)?;
    let hca = hca_of(w, ctx);
    let srqn = next_id(w, hca);
    let handle = w.contexts[&ctx].next_handle;
    let mut o = Out::new(16);
    o.u32(0, handle)
        .u32(4, wqe_cnt - 1)
        .u32(8, eff_sge)
        .u32(12, srqn);
    let mut dr = Out::new(8);
    dr.u32(0, srqn);
    r.respond(&o)?;
    r.respond_drv(&dr)?;
    new_handle(w, ctx, Obj::Srq(srqn));
    pd_use(w, hca, pdn, 1);
    w.hcas[hca].srqs.insert(
        srqn,
        Srq {
            ctx,
            pdn,
            user_handle: le64(c, 8),
            buf,
            db,
            wqe_cnt,
            stride,
            max_wr: wqe_cnt - 1,
            max_sge: eff_sge,
            limit,
            consumed: 0,
            head: 0,
            users: 0,
        },
    );
    Ok(())
}

fn modify_srq(w: &mut World, ctx: u64, r: &Req) -> Result<(), Errno> {
    // ib_uverbs_modify_srq: 0 srq_handle, 4 attr_mask, 8 max_wr, 12 srq_limit.
    let srqn = srq_of(w, ctx, le32(&r.core, 0))?;
    let m = le32(&r.core, 4);
    let hca = hca_of(w, ctx);
    let s = w.hcas[hca].srqs.get_mut(&srqn).ok_or(EINVAL)?;
    if m & !3 != 0 || m & 1 != 0 {
        // IB_SRQ_MAX_WR (resize) is not supported by mlx5.
        return Err(EINVAL);
    }
    if m & 2 != 0 {
        let limit = le32(&r.core, 12);
        if limit > s.max_wr {
            return Err(EINVAL);
        }
        s.limit = limit;
    }
    Ok(())
}

fn query_srq(w: &World, ctx: u64, r: &Req) -> Result<(), Errno> {
    // ib_uverbs_query_srq: 0 response, 8 srq_handle; resp 0 max_wr, 4 max_sge, 8 srq_limit.
    let srqn = srq_of(w, ctx, le32(&r.core, 8))?;
    let s = &w.hcas[hca_of(w, ctx)].srqs[&srqn];
    let mut o = Out::new(16);
    o.u32(0, s.max_wr).u32(4, s.max_sge).u32(8, s.limit);
    r.respond(&o)
}

fn destroy_srq(w: &mut World, ctx: u64, r: &Req) -> Result<(), Errno> {
    // ib_uverbs_destroy_srq: 0 response, 8 srq_handle; resp 0 events_reported.
    let handle = le32(&r.core, 8);
    let srqn = srq_of(w, ctx, handle)?;
    let hca = hca_of(w, ctx);
    if w.hcas[hca].srqs[&srqn].users > 0 {
        return Err(EBUSY);
    }
    let o = Out::new(4);
    r.respond(&o)?;
    if let Some(s) = w.hcas[hca].srqs.remove(&srqn) {
        pd_use(w, hca, s.pdn, -1);
    }
    remove_handle(w, ctx, handle);
    Ok(())
}
