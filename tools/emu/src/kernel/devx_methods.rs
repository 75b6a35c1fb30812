//! The DEVX ioctl methods (objects `MLX5_IB_OBJECT_DEVX`, `_DEVX_OBJ`, `_DEVX_UMEM`,
//! `_DEVX_ASYNC_EVENT_FD`): attribute plumbing onto `kernel/devx.rs` and
//! `kernel/devx_qp.rs`.

use std::sync::atomic::Ordering;

use mlx5_ffi::mlx5::*;
use mlx5_ffi::prm::{self, hdr, op, status};

use super::devx::{self, Object, fw_error, fw_out};
use super::devx_qp;
use super::methods::Attrs;
use super::{EINVAL, EPROTONOSUPPORT, EmuFile};
use crate::abi::Errno;

/// The length of a PTR_OUT attribute (0 if absent).
fn out_len(a: &Attrs<'_>, id: u16) -> usize {
    a.find(id).map_or(0, |x| usize::from(x.1.len))
}

/// Without a DEVX uid (a context opened without `MLX5_IB_ALLOC_UCTX_DEVX`), mlx5_ib's
/// `devx_get_uid` answers: the whitelisted queries would use the device's uid, which this
/// HCA has none of (EOPNOTSUPP); anything else EINVAL.
fn not_devx(cmd: &[u8]) -> Errno {
    match mlx5_ffi::mlx5::prm_opcode(cmd) {
        Some(op) if MLX5_DEVX_WHITELIST_OPCODES.contains(&op) => Errno(libc::EOPNOTSUPP),
        _ => EINVAL,
    }
}

impl EmuFile {
    pub(super) fn devx_method(
        &self,
        object: u16,
        method: u16,
        mut a: Attrs<'_>,
    ) -> Result<(), Errno> {
        let is_devx = self.devx.load(Ordering::Relaxed);
        let ctx = self.ctx().ok_or(EINVAL)?;
        match (object, method) {
            (MLX5_IB_OBJECT_DEVX, MLX5_IB_METHOD_DEVX_OTHER) => {
                a.only(&[
                    MLX5_IB_ATTR_DEVX_OTHER_CMD_IN,
                    MLX5_IB_ATTR_DEVX_OTHER_CMD_OUT,
                ])?;
                let cmd = a.bytes(MLX5_IB_ATTR_DEVX_OTHER_CMD_IN)?.ok_or(EINVAL)?;
                if !is_devx {
                    return Err(not_devx(&cmd));
                }
                let n = out_len(&a, MLX5_IB_ATTR_DEVX_OTHER_CMD_OUT);
                let r = devx::general(&self.shared.lock(), ctx, &cmd, n)?;
                let (mb, res) = fw_out(r, n);
                a.out(MLX5_IB_ATTR_DEVX_OTHER_CMD_OUT, &mb)?;
                res
            }
            (MLX5_IB_OBJECT_DEVX, MLX5_IB_METHOD_DEVX_QUERY_UAR) => {
                a.only(&[
                    MLX5_IB_ATTR_DEVX_QUERY_UAR_USER_IDX,
                    MLX5_IB_ATTR_DEVX_QUERY_UAR_DEV_IDX,
                ])?;
                if !is_devx {
                    return Err(EINVAL);
                }
                let idx = Attrs::need(a.u32(MLX5_IB_ATTR_DEVX_QUERY_UAR_USER_IDX)?)?;
                let id = devx::query_uar(&self.shared.lock(), ctx, idx)?;
                a.out(MLX5_IB_ATTR_DEVX_QUERY_UAR_DEV_IDX, &id.to_ne_bytes())
            }
            (MLX5_IB_OBJECT_DEVX, MLX5_IB_METHOD_DEVX_SUBSCRIBE_EVENT) => {
                a.only(&[
                    MLX5_IB_ATTR_DEVX_SUBSCRIBE_EVENT_FD_HANDLE,
                    MLX5_IB_ATTR_DEVX_SUBSCRIBE_EVENT_OBJ_HANDLE,
                    MLX5_IB_ATTR_DEVX_SUBSCRIBE_EVENT_TYPE_NUM_LIST,
                    MLX5_IB_ATTR_DEVX_SUBSCRIBE_EVENT_FD_NUM,
                    MLX5_IB_ATTR_DEVX_SUBSCRIBE_EVENT_COOKIE,
                ])?;
                if !is_devx {
                    return Err(EINVAL);
                }
                let fd = Attrs::need(a.data(MLX5_IB_ATTR_DEVX_SUBSCRIBE_EVENT_FD_HANDLE))? as i32;
                let obj = a
                    .data(MLX5_IB_ATTR_DEVX_SUBSCRIBE_EVENT_OBJ_HANDLE)
                    .map(|h| h as u32);
                let list = a
                    .bytes(MLX5_IB_ATTR_DEVX_SUBSCRIBE_EVENT_TYPE_NUM_LIST)?
                    .ok_or(EINVAL)?;
                if list.len() % 2 != 0 {
                    return Err(EINVAL);
                }
                let types: Vec<u16> = list
                    .chunks_exact(2)
                    .map(|c| u16::from_ne_bytes([c[0], c[1]]))
                    .collect();
                // Signalling an eventfd instead of queueing the cookie is not implemented.
                if a.find(MLX5_IB_ATTR_DEVX_SUBSCRIBE_EVENT_FD_NUM).is_some() {
                    return Err(Errno(libc::EOPNOTSUPP));
                }
                let cookie = a
                    .u64(MLX5_IB_ATTR_DEVX_SUBSCRIBE_EVENT_COOKIE)?
                    .unwrap_or(0);
                devx::subscribe(&mut self.shared.lock(), ctx, fd, obj, &types, cookie)
            }
            (MLX5_IB_OBJECT_DEVX_OBJ, MLX5_IB_METHOD_DEVX_OBJ_CREATE) => {
                a.only(&[
                    MLX5_IB_ATTR_DEVX_OBJ_CREATE_HANDLE,
                    MLX5_IB_ATTR_DEVX_OBJ_CREATE_CMD_IN,
                    MLX5_IB_ATTR_DEVX_OBJ_CREATE_CMD_OUT,
                ])?;
                let cmd = a
                    .bytes(MLX5_IB_ATTR_DEVX_OBJ_CREATE_CMD_IN)?
                    .ok_or(EINVAL)?;
                if !is_devx {
                    return Err(not_devx(&cmd));
                }
                let n = out_len(&a, MLX5_IB_ATTR_DEVX_OBJ_CREATE_CMD_OUT);
                let opcode = prm::get(&cmd, hdr::OPCODE) as u16;
                if cmd.len() < devx::HDR_BYTES || n < devx::HDR_BYTES || !devx::is_create(opcode) {
                    return Err(EINVAL);
                }
                let mut w = self.shared.lock();
                let r = match opcode {
                    op::CREATE_QP => devx_qp::create_qp(&mut w, ctx, &cmd),
                    op::CREATE_DCT => devx_qp::create_dct(&mut w, ctx, &cmd),
                    op::CREATE_RMP => devx_qp::create_rmp(&mut w, ctx, &cmd),
                    op::CREATE_MKEY => super::devx_mkey::create_mkey(&mut w, ctx, &cmd),
                    // CQ, SRQ, XRQ and general objects: not made by this firmware (no tag
                    // matching; CQs and SRQs come through verbs).
                    _ => Err(fw_error(status::BAD_OP, 0)),
                };
                match r {
                    Ok((out, obj)) => {
                        let c = w.contexts.get_mut(&ctx).ok_or(EINVAL)?;
                        let h = c.next_handle;
                        c.next_handle += 1;
                        c.devx.objects.insert(h, obj);
                        drop(w);
                        let (mb, _) = fw_out(Ok(out), n);
                        if let Err(e) = a.out(MLX5_IB_ATTR_DEVX_OBJ_CREATE_CMD_OUT, &mb) {
                            // The answer could not reach the caller: undo, as the
                            // kernel destroys the object when the method fails.
                            self.devx_destroy(ctx, h);
                            return Err(e);
                        }
                        a.out_data(MLX5_IB_ATTR_DEVX_OBJ_CREATE_HANDLE, u64::from(h));
                        Ok(())
                    }
                    Err(mb) => {
                        drop(w);
                        let (mb, res) = fw_out(Err(mb), n);
                        a.out(MLX5_IB_ATTR_DEVX_OBJ_CREATE_CMD_OUT, &mb)?;
                        res
                    }
                }
            }
            (MLX5_IB_OBJECT_DEVX_OBJ, MLX5_IB_METHOD_DEVX_OBJ_DESTROY) => {
                a.only(&[MLX5_IB_ATTR_DEVX_OBJ_DESTROY_HANDLE])?;
                let h = Attrs::need(a.data(MLX5_IB_ATTR_DEVX_OBJ_DESTROY_HANDLE))? as u32;
                if self.devx_destroy(ctx, h) {
                    Ok(())
                } else {
                    Err(EINVAL)
                }
            }
            (
                MLX5_IB_OBJECT_DEVX_OBJ,
                MLX5_IB_METHOD_DEVX_OBJ_MODIFY | MLX5_IB_METHOD_DEVX_OBJ_QUERY,
            ) => {
                // The three attributes have the same ids for modify and query.
                let (hid, cin, cout) = (
                    MLX5_IB_ATTR_DEVX_OBJ_MODIFY_HANDLE,
                    MLX5_IB_ATTR_DEVX_OBJ_MODIFY_CMD_IN,
                    MLX5_IB_ATTR_DEVX_OBJ_MODIFY_CMD_OUT,
                );
                a.only(&[hid, cin, cout])?;
                let h = Attrs::need(a.data(hid))? as u32;
                let cmd = a.bytes(cin)?.ok_or(EINVAL)?;
                let n = out_len(&a, cout);
                if cmd.len() < devx::HDR_BYTES || n < devx::HDR_BYTES {
                    return Err(EINVAL);
                }
                let modify = method == MLX5_IB_METHOD_DEVX_OBJ_MODIFY;
                let opcode = prm::get(&cmd, hdr::OPCODE) as u16;
                let mut w = self.shared.lock();
                let c = w.contexts.get(&ctx).ok_or(EINVAL)?;
                // A DEVX object, or a verbs QP (mlx5dv_devx_qp_modify / _query).
                let obj = match c.devx.objects.get(&h) {
                    Some(o) => *o,
                    None => match c.handles.get(&h) {
                        Some(crate::state::Obj::Qp(qpn)) if is_devx => Object::Qp {
                            qpn: *qpn,
                            wq: 0,
                            dbr: 0,
                        },
                        _ => return Err(EINVAL),
                    },
                };
                let r = match (obj, modify) {
                    (Object::Qp { qpn, .. }, true)
                        if devx_qp::is_qp_modify(opcode) && devx_qp::names(&cmd, qpn) =>
                    {
                        devx_qp::modify_qp(&mut w, ctx, qpn, &cmd)
                    }
                    (Object::Qp { qpn, .. }, false)
                        if opcode == op::QUERY_QP && devx_qp::names(&cmd, qpn) =>
                    {
                        devx_qp::query_qp(&w, ctx, qpn, &cmd)
                    }
                    (Object::Dct { dctn }, false)
                        if opcode == op::QUERY_DCT && devx_qp::names(&cmd, dctn) =>
                    {
                        devx_qp::query_dct(&w, ctx, dctn, &cmd)
                    }
                    // devx_is_valid_obj_id / devx_is_obj_modify_cmd: EINVAL.
                    _ => return Err(devx_qp::no_object()),
                };
                drop(w);
                let (mb, res) = fw_out(r, n);
                a.out(cout, &mb)?;
                res
            }
            (MLX5_IB_OBJECT_DEVX_UMEM, MLX5_IB_METHOD_DEVX_UMEM_REG) => {
                a.only(&[
                    MLX5_IB_ATTR_DEVX_UMEM_REG_HANDLE,
                    MLX5_IB_ATTR_DEVX_UMEM_REG_ADDR,
                    MLX5_IB_ATTR_DEVX_UMEM_REG_LEN,
                    MLX5_IB_ATTR_DEVX_UMEM_REG_ACCESS,
                    MLX5_IB_ATTR_DEVX_UMEM_REG_OUT_ID,
                    MLX5_IB_ATTR_DEVX_UMEM_REG_PGSZ_BITMAP,
                    MLX5_IB_ATTR_DEVX_UMEM_REG_DMABUF_FD,
                ])?;
                if !is_devx {
                    return Err(EINVAL);
                }
                // dma-buf memory: no dma-buf exporter exists here.
                if a.find(MLX5_IB_ATTR_DEVX_UMEM_REG_DMABUF_FD).is_some() {
                    return Err(Errno(libc::EOPNOTSUPP));
                }
                let addr = Attrs::need(a.u64(MLX5_IB_ATTR_DEVX_UMEM_REG_ADDR)?)?;
                let len = Attrs::need(a.u64(MLX5_IB_ATTR_DEVX_UMEM_REG_LEN)?)?;
                let acc = Attrs::need(a.u32(MLX5_IB_ATTR_DEVX_UMEM_REG_ACCESS)?)?;
                let (h, id) = devx::umem_reg(&mut self.shared.lock(), ctx, addr, len, acc)?;
                a.out(MLX5_IB_ATTR_DEVX_UMEM_REG_OUT_ID, &id.to_ne_bytes())?;
                a.out_data(MLX5_IB_ATTR_DEVX_UMEM_REG_HANDLE, u64::from(h));
                Ok(())
            }
            (MLX5_IB_OBJECT_DEVX_UMEM, MLX5_IB_METHOD_DEVX_UMEM_DEREG) => {
                a.only(&[MLX5_IB_ATTR_DEVX_UMEM_DEREG_HANDLE])?;
                let h = Attrs::need(a.data(MLX5_IB_ATTR_DEVX_UMEM_DEREG_HANDLE))? as u32;
                devx::umem_dereg(&mut self.shared.lock(), ctx, h)
            }
            (MLX5_IB_OBJECT_DEVX_ASYNC_EVENT_FD, MLX5_IB_METHOD_DEVX_ASYNC_EVENT_FD_ALLOC) => {
                a.only(&[
                    MLX5_IB_ATTR_DEVX_ASYNC_EVENT_FD_ALLOC_HANDLE,
                    MLX5_IB_ATTR_DEVX_ASYNC_EVENT_FD_ALLOC_FLAGS,
                ])?;
                if !is_devx {
                    return Err(EINVAL);
                }
                let flags = a
                    .u32(MLX5_IB_ATTR_DEVX_ASYNC_EVENT_FD_ALLOC_FLAGS)?
                    .unwrap_or(0);
                let fd = devx::event_channel(&mut self.shared.lock(), ctx, flags)?;
                a.out_data(MLX5_IB_ATTR_DEVX_ASYNC_EVENT_FD_ALLOC_HANDLE, fd as u64);
                Ok(())
            }
            _ => Err(EPROTONOSUPPORT),
        }
    }

    /// Destroy DEVX object `h` of `ctx`; false if there is none.
    fn devx_destroy(&self, ctx: u64, h: u32) -> bool {
        let mut w = self.shared.lock();
        let Some(obj) = w
            .contexts
            .get_mut(&ctx)
            .and_then(|c| c.devx.objects.remove(&h))
        else {
            return false;
        };
        devx_qp::destroy(&mut w, ctx, obj);
        true
    }
}
