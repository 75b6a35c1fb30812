//! The ioctl object methods of a modern kernel (`Flavour::Modern`): DEVICE (GET_CONTEXT,
//! QUERY_PORT, QUERY_GID_TABLE/ENTRY), ASYNC_EVENT alloc, CQ/QP/SRQ create and destroy,
//! PD/MR/AH destroy, the mlx5 UAR object. Each is mapped onto the same handler as its
//! write() command (building that command's header-checked request struct), so the
//! validation is shared; attribute plumbing (inline vs pointer inputs, IDR/FD outputs in
//! `data`, `UVERBS_ATTR_F_VALID_OUTPUT`) is done here.

use mlx5_ffi::cmd::{Command, cmds, read_prefix_zero_fill};
use mlx5_ffi::ioctl::*;
use mlx5_ffi::mlx5::{
    MLX5_IB_ATTR_UAR_OBJ_ALLOC_HANDLE, MLX5_IB_ATTR_UAR_OBJ_ALLOC_MMAP_LENGTH,
    MLX5_IB_ATTR_UAR_OBJ_ALLOC_MMAP_OFFSET, MLX5_IB_ATTR_UAR_OBJ_ALLOC_PAGE_ID,
    MLX5_IB_ATTR_UAR_OBJ_ALLOC_TYPE, MLX5_IB_ATTR_UAR_OBJ_DESTROY_HANDLE,
    MLX5_IB_METHOD_DEVX_ASYNC_EVENT_FD_ALLOC, MLX5_IB_METHOD_DEVX_OBJ_CREATE,
    MLX5_IB_METHOD_DEVX_OBJ_DESTROY, MLX5_IB_METHOD_DEVX_OBJ_MODIFY, MLX5_IB_METHOD_DEVX_OBJ_QUERY,
    MLX5_IB_METHOD_DEVX_OTHER, MLX5_IB_METHOD_DEVX_QUERY_UAR, MLX5_IB_METHOD_DEVX_SUBSCRIBE_EVENT,
    MLX5_IB_METHOD_DEVX_UMEM_DEREG, MLX5_IB_METHOD_DEVX_UMEM_REG, MLX5_IB_METHOD_UAR_OBJ_ALLOC,
    MLX5_IB_METHOD_UAR_OBJ_DESTROY, MLX5_IB_OBJECT_DEVX, MLX5_IB_OBJECT_DEVX_ASYNC_EVENT_FD,
    MLX5_IB_OBJECT_DEVX_OBJ, MLX5_IB_OBJECT_DEVX_UMEM, MLX5_IB_OBJECT_UAR,
    MLX5_IB_UAPI_UAR_ALLOC_TYPE_BF, MLX5_IB_UAPI_UAR_ALLOC_TYPE_NC,
};
use mlx5_ffi::uverbs::{
    IB_USER_VERBS_CMD_FLAG_EXTENDED, IbUverbsCreateQp, IbUverbsCreateSrq, IbUverbsDeallocPd,
    IbUverbsDeregMr, IbUverbsDestroyAh, IbUverbsDestroyCq, IbUverbsDestroyQp, IbUverbsDestroySrq,
    IbUverbsExCreateCq, IbUverbsGetContext, IbUverbsQueryPort,
};
use zerocopy::IntoBytes;

use super::{
    DYN_PAGE_ID_BASE, DYN_PGOFF_BASE, EINVAL, EPROTONOSUPPORT, EmuFile, MAX_DYN_UARS, Req,
};
use crate::abi::Errno;
use crate::mem;
use crate::state::Obj;
use crate::uar::PAGE;

/// The attributes of one call, with helpers to read inputs and write outputs.
pub(super) struct Attrs<'a> {
    buf: &'a mut [u8],
    /// (index in the buffer's attribute array, attribute as sent).
    list: &'a [(usize, IbUverbsAttr)],
}

/// The driver-data pair: (input bytes, output pointer, output length).
type Uhw = (Vec<u8>, u64, usize);

impl<'a> Attrs<'a> {
    pub(super) fn new(buf: &'a mut [u8], list: &'a [(usize, IbUverbsAttr)]) -> Self {
        Attrs { buf, list }
    }

    pub(super) fn find(&self, id: u16) -> Option<(usize, IbUverbsAttr)> {
        self.list.iter().copied().find(|a| a.1.attr_id == id)
    }

    /// Reject mandatory attributes the method does not know.
    pub(super) fn only(&self, known: &[u16]) -> Result<(), Errno> {
        let unknown = self.list.iter().any(|(_, a)| {
            a.flags & UVERBS_ATTR_F_MANDATORY != 0
                && !known.contains(&a.attr_id)
                && a.attr_id != UVERBS_ATTR_UHW_IN
                && a.attr_id != UVERBS_ATTR_UHW_OUT
        });
        if unknown {
            Err(EPROTONOSUPPORT)
        } else {
            Ok(())
        }
    }

    /// Input bytes: inline in `data` up to 8 bytes, else through the pointer.
    pub(super) fn bytes(&self, id: u16) -> Result<Option<Vec<u8>>, Errno> {
        let Some((_, a)) = self.find(id) else {
            return Ok(None);
        };
        match a.inline_bytes() {
            Some(b) => Ok(Some(b.to_vec())),
            None => mem::read_vec(a.data, usize::from(a.len)).map(Some),
        }
    }

    pub(super) fn u32(&self, id: u16) -> Result<Option<u32>, Errno> {
        Ok(self.bytes(id)?.map(|b| read_prefix_zero_fill::<u32>(&b)))
    }

    pub(super) fn u64(&self, id: u16) -> Result<Option<u64>, Errno> {
        Ok(self.bytes(id)?.map(|b| read_prefix_zero_fill::<u64>(&b)))
    }

    /// Object handle / fd inputs are inline in `data`.
    pub(super) fn data(&self, id: u16) -> Option<u64> {
        self.find(id).map(|a| a.1.data)
    }

    pub(super) fn need<T>(v: Option<T>) -> Result<T, Errno> {
        v.ok_or(EINVAL)
    }

    /// Store `attr` back with `UVERBS_ATTR_F_VALID_OUTPUT` (and the given `data`).
    fn mark(&mut self, (index, mut attr): (usize, IbUverbsAttr), data: Option<u64>) {
        attr.flags |= UVERBS_ATTR_F_VALID_OUTPUT;
        if let Some(d) = data {
            attr.data = d;
        }
        // The index comes from parsing this very buffer: always in range.
        let _ = write_attr(self.buf, index, &attr);
    }

    /// Copy an output through the attribute's pointer (`min(len, size)` bytes).
    pub(super) fn out(&mut self, id: u16, bytes: &[u8]) -> Result<(), Errno> {
        let Some(found) = self.find(id) else {
            return Ok(());
        };
        let n = usize::from(found.1.len).min(bytes.len());
        mem::write(found.1.data, &bytes[..n])?;
        self.mark(found, None);
        Ok(())
    }

    /// IDR/FD outputs: the new handle or fd is written into the attribute's `data`.
    pub(super) fn out_data(&mut self, id: u16, v: u64) {
        if let Some(found) = self.find(id) {
            self.mark(found, Some(v));
        }
    }

    fn uhw(&self) -> Result<Uhw, Errno> {
        let inp = self.bytes(UVERBS_ATTR_UHW_IN)?.unwrap_or_default();
        let (ptr, len) = self
            .find(UVERBS_ATTR_UHW_OUT)
            .map_or((0, 0), |a| (a.1.data, usize::from(a.1.len)));
        Ok((inp, ptr, len))
    }

    fn uhw_done(&mut self) {
        if let Some(found) = self.find(UVERBS_ATTR_UHW_OUT) {
            self.mark(found, None);
        }
    }
}

/// Whether (object, method) is implemented.
pub(super) fn known(object: u16, method: u16) -> bool {
    matches!(
        (object, method),
        (
            UVERBS_OBJECT_DEVICE,
            UVERBS_METHOD_INVOKE_WRITE
                | UVERBS_METHOD_QUERY_PORT
                | UVERBS_METHOD_GET_CONTEXT
                | UVERBS_METHOD_QUERY_GID_TABLE
                | UVERBS_METHOD_QUERY_GID_ENTRY
        ) | (UVERBS_OBJECT_PD, UVERBS_METHOD_PD_DESTROY)
            | (
                UVERBS_OBJECT_CQ,
                UVERBS_METHOD_CQ_CREATE | UVERBS_METHOD_CQ_DESTROY
            )
            | (
                UVERBS_OBJECT_QP,
                UVERBS_METHOD_QP_CREATE | UVERBS_METHOD_QP_DESTROY
            )
            | (
                UVERBS_OBJECT_SRQ,
                UVERBS_METHOD_SRQ_CREATE | UVERBS_METHOD_SRQ_DESTROY
            )
            | (UVERBS_OBJECT_AH, UVERBS_METHOD_AH_DESTROY)
            | (
                UVERBS_OBJECT_XRCD,
                mlx5_ffi::xrc_dc::UVERBS_METHOD_XRCD_DESTROY
            )
            | (UVERBS_OBJECT_MR, UVERBS_METHOD_MR_DESTROY)
            | (UVERBS_OBJECT_ASYNC_EVENT, UVERBS_METHOD_ASYNC_EVENT_ALLOC)
            | (UVERBS_OBJECT_DM, UVERBS_METHOD_DM_ALLOC)
            | (
                MLX5_IB_OBJECT_DEVX,
                MLX5_IB_METHOD_DEVX_OTHER
                    | MLX5_IB_METHOD_DEVX_QUERY_UAR
                    | MLX5_IB_METHOD_DEVX_SUBSCRIBE_EVENT
            )
            | (
                MLX5_IB_OBJECT_DEVX_OBJ,
                MLX5_IB_METHOD_DEVX_OBJ_CREATE
                    | MLX5_IB_METHOD_DEVX_OBJ_DESTROY
                    | MLX5_IB_METHOD_DEVX_OBJ_MODIFY
                    | MLX5_IB_METHOD_DEVX_OBJ_QUERY
            )
            | (
                MLX5_IB_OBJECT_DEVX_UMEM,
                MLX5_IB_METHOD_DEVX_UMEM_REG | MLX5_IB_METHOD_DEVX_UMEM_DEREG
            )
            | (
                MLX5_IB_OBJECT_DEVX_ASYNC_EVENT_FD,
                MLX5_IB_METHOD_DEVX_ASYNC_EVENT_FD_ALLOC
            )
            | (
                MLX5_IB_OBJECT_UAR,
                MLX5_IB_METHOD_UAR_OBJ_ALLOC | MLX5_IB_METHOD_UAR_OBJ_DESTROY
            )
    )
}

impl EmuFile {
    /// Run command `C`'s write handler for an ioctl method: `req` is its core request (the
    /// response pointer, if it has one, is set here to a kernel scratch buffer).
    fn run<C: Command>(&self, req: &C::Req, uhw: Uhw) -> Result<C::Resp, Errno> {
        let mut scratch = vec![0u8; size_of::<C::Resp>().max(8)];
        let out = scratch.as_mut_ptr() as u64;
        let mut core = req.as_bytes().to_vec();
        if C::RESPONSE_PTR {
            core[..8].copy_from_slice(&out.to_ne_bytes());
        }
        let flag = if C::EXTENDED {
            IB_USER_VERBS_CMD_FLAG_EXTENDED
        } else {
            0
        };
        let r = Req {
            command: C::ID | flag,
            ex: C::EXTENDED,
            core,
            drv_in: uhw.0,
            out,
            out_len: size_of::<C::Resp>(),
            drv_out: uhw.1,
            drv_out_len: uhw.2,
        };
        self.dispatch(&r)?;
        Ok(read_prefix_zero_fill(&scratch))
    }

    pub(super) fn method(&self, object: u16, method: u16, mut a: Attrs<'_>) -> Result<(), Errno> {
        match (object, method) {
            (UVERBS_OBJECT_DEVICE, UVERBS_METHOD_GET_CONTEXT) => {
                a.only(&[
                    UVERBS_ATTR_GET_CONTEXT_NUM_COMP_VECTORS,
                    UVERBS_ATTR_GET_CONTEXT_CORE_SUPPORT,
                ])?;
                let uhw = a.uhw()?;
                let r = self.run::<cmds::GetContext>(&IbUverbsGetContext::default(), uhw)?;
                // Over ioctl the async fd comes later, from ASYNC_EVENT alloc.
                self.set_async_handed_out(false);
                a.out(
                    UVERBS_ATTR_GET_CONTEXT_NUM_COMP_VECTORS,
                    r.num_comp_vectors.as_bytes(),
                )?;
                a.out(
                    UVERBS_ATTR_GET_CONTEXT_CORE_SUPPORT,
                    IB_UVERBS_CORE_SUPPORT_OPTIONAL_MR_ACCESS.as_bytes(),
                )?;
                a.uhw_done();
                Ok(())
            }
            (UVERBS_OBJECT_DEVICE, UVERBS_METHOD_QUERY_PORT) => {
                a.only(&[UVERBS_ATTR_QUERY_PORT_PORT_NUM, UVERBS_ATTR_QUERY_PORT_RESP])?;
                let port = Attrs::need(a.u32(UVERBS_ATTR_QUERY_PORT_PORT_NUM)?)? as u8;
                let req = IbUverbsQueryPort {
                    port_num: port,
                    ..Default::default()
                };
                let r = self.run::<cmds::QueryPort>(&req, (Vec::new(), 0, 0))?;
                let ex = IbUverbsQueryPortRespEx {
                    legacy_resp: r,
                    ..Default::default()
                };
                a.out(UVERBS_ATTR_QUERY_PORT_RESP, ex.as_bytes())
            }
            (UVERBS_OBJECT_DEVICE, UVERBS_METHOD_QUERY_GID_TABLE) => {
                a.only(&[
                    UVERBS_ATTR_QUERY_GID_TABLE_ENTRY_SIZE,
                    UVERBS_ATTR_QUERY_GID_TABLE_FLAGS,
                    UVERBS_ATTR_QUERY_GID_TABLE_RESP_ENTRIES,
                    UVERBS_ATTR_QUERY_GID_TABLE_RESP_NUM_ENTRIES,
                ])?;
                let esz = Attrs::need(a.u64(UVERBS_ATTR_QUERY_GID_TABLE_ENTRY_SIZE)?)?;
                let esz = usize::try_from(esz).map_err(|_| EINVAL)?;
                if esz < size_of::<IbUverbsGidEntry>()
                    || a.u32(UVERBS_ATTR_QUERY_GID_TABLE_FLAGS)?.unwrap_or(0) != 0
                {
                    return Err(EINVAL);
                }
                // uverbs_attr_ptr_get_array_size: a whole number of entries, at least one.
                let len = a
                    .find(UVERBS_ATTR_QUERY_GID_TABLE_RESP_ENTRIES)
                    .map_or(0, |x| usize::from(x.1.len));
                if len % esz != 0 || len < esz {
                    return Err(EINVAL);
                }
                let cap = len / esz;
                let entries = self.gid_entries(1)?;
                // rdma_query_gid_table: a buffer too small for every valid entry is EINVAL,
                // not a partial answer.
                if cap < entries.len() {
                    return Err(EINVAL);
                }
                let n = entries.len();
                if n > 0 {
                    let mut out = Vec::with_capacity(n * esz);
                    for e in entries {
                        let start = out.len();
                        out.extend_from_slice(e.as_bytes());
                        out.resize(start + esz, 0);
                    }
                    a.out(UVERBS_ATTR_QUERY_GID_TABLE_RESP_ENTRIES, &out)?;
                }
                a.out(
                    UVERBS_ATTR_QUERY_GID_TABLE_RESP_NUM_ENTRIES,
                    (n as u64).as_bytes(),
                )
            }
            (UVERBS_OBJECT_DEVICE, UVERBS_METHOD_QUERY_GID_ENTRY) => {
                a.only(&[
                    UVERBS_ATTR_QUERY_GID_ENTRY_PORT,
                    UVERBS_ATTR_QUERY_GID_ENTRY_GID_INDEX,
                    UVERBS_ATTR_QUERY_GID_ENTRY_FLAGS,
                    UVERBS_ATTR_QUERY_GID_ENTRY_RESP_ENTRY,
                ])?;
                let port = Attrs::need(a.u32(UVERBS_ATTR_QUERY_GID_ENTRY_PORT)?)?;
                let index = Attrs::need(a.u32(UVERBS_ATTR_QUERY_GID_ENTRY_GID_INDEX)?)?;
                if a.u32(UVERBS_ATTR_QUERY_GID_ENTRY_FLAGS)?.unwrap_or(0) != 0 {
                    return Err(EINVAL);
                }
                let e = self.gid_entry(port, index)?;
                a.out(UVERBS_ATTR_QUERY_GID_ENTRY_RESP_ENTRY, e.as_bytes())
            }
            (UVERBS_OBJECT_ASYNC_EVENT, UVERBS_METHOD_ASYNC_EVENT_ALLOC) => {
                a.only(&[UVERBS_ATTR_ASYNC_EVENT_ALLOC_FD_HANDLE])?;
                let fd = self.take_async_fd()?;
                a.out_data(UVERBS_ATTR_ASYNC_EVENT_ALLOC_FD_HANDLE, fd as u64);
                Ok(())
            }
            (UVERBS_OBJECT_PD, UVERBS_METHOD_PD_DESTROY) => {
                let h = self.handle_in(&a, UVERBS_ATTR_DESTROY_PD_HANDLE)?;
                self.run::<cmds::DeallocPd>(&IbUverbsDeallocPd { pd_handle: h }, no_uhw())
            }
            (UVERBS_OBJECT_MR, UVERBS_METHOD_MR_DESTROY) => {
                let h = self.handle_in(&a, UVERBS_ATTR_DESTROY_MR_HANDLE)?;
                self.run::<cmds::DeregMr>(&IbUverbsDeregMr { mr_handle: h }, no_uhw())
            }
            (UVERBS_OBJECT_AH, UVERBS_METHOD_AH_DESTROY) => {
                let h = self.handle_in(&a, UVERBS_ATTR_DESTROY_AH_HANDLE)?;
                self.run::<cmds::DestroyAh>(&IbUverbsDestroyAh { ah_handle: h }, no_uhw())
            }
            (UVERBS_OBJECT_CQ, UVERBS_METHOD_CQ_CREATE) => {
                a.only(&[
                    UVERBS_ATTR_CREATE_CQ_HANDLE,
                    UVERBS_ATTR_CREATE_CQ_CQE,
                    UVERBS_ATTR_CREATE_CQ_USER_HANDLE,
                    UVERBS_ATTR_CREATE_CQ_COMP_CHANNEL,
                    UVERBS_ATTR_CREATE_CQ_COMP_VECTOR,
                    UVERBS_ATTR_CREATE_CQ_FLAGS,
                    UVERBS_ATTR_CREATE_CQ_RESP_CQE,
                    UVERBS_ATTR_CREATE_CQ_EVENT_FD,
                ])?;
                let req = IbUverbsExCreateCq {
                    user_handle: a.u64(UVERBS_ATTR_CREATE_CQ_USER_HANDLE)?.unwrap_or(0),
                    cqe: Attrs::need(a.u32(UVERBS_ATTR_CREATE_CQ_CQE)?)?,
                    comp_vector: a.u32(UVERBS_ATTR_CREATE_CQ_COMP_VECTOR)?.unwrap_or(0),
                    comp_channel: a
                        .data(UVERBS_ATTR_CREATE_CQ_COMP_CHANNEL)
                        .map_or(-1, |d| d as i32),
                    flags: a.u32(UVERBS_ATTR_CREATE_CQ_FLAGS)?.unwrap_or(0),
                    ..Default::default()
                };
                let uhw = a.uhw()?;
                let r = self.run::<cmds::ExCreateCq>(&req, uhw)?;
                a.out_data(UVERBS_ATTR_CREATE_CQ_HANDLE, u64::from(r.base.cq_handle));
                a.out(UVERBS_ATTR_CREATE_CQ_RESP_CQE, r.base.cqe.as_bytes())?;
                a.uhw_done();
                Ok(())
            }
            (UVERBS_OBJECT_CQ, UVERBS_METHOD_CQ_DESTROY) => {
                a.only(&[UVERBS_ATTR_DESTROY_CQ_HANDLE, UVERBS_ATTR_DESTROY_CQ_RESP])?;
                let h = Attrs::need(a.data(UVERBS_ATTR_DESTROY_CQ_HANDLE))? as u32;
                let req = IbUverbsDestroyCq {
                    cq_handle: h,
                    ..Default::default()
                };
                let r = self.run::<cmds::DestroyCq>(&req, no_uhw())?;
                a.out(UVERBS_ATTR_DESTROY_CQ_RESP, r.as_bytes())
            }
            (UVERBS_OBJECT_QP, UVERBS_METHOD_QP_CREATE) => {
                a.only(&[
                    UVERBS_ATTR_CREATE_QP_HANDLE,
                    UVERBS_ATTR_CREATE_QP_PD_HANDLE,
                    UVERBS_ATTR_CREATE_QP_SRQ_HANDLE,
                    UVERBS_ATTR_CREATE_QP_SEND_CQ_HANDLE,
                    UVERBS_ATTR_CREATE_QP_RECV_CQ_HANDLE,
                    UVERBS_ATTR_CREATE_QP_USER_HANDLE,
                    UVERBS_ATTR_CREATE_QP_CAP,
                    UVERBS_ATTR_CREATE_QP_TYPE,
                    UVERBS_ATTR_CREATE_QP_FLAGS,
                    UVERBS_ATTR_CREATE_QP_EVENT_FD,
                    UVERBS_ATTR_CREATE_QP_RESP_CAP,
                    UVERBS_ATTR_CREATE_QP_RESP_QP_NUM,
                    UVERBS_ATTR_CREATE_QP_XRCD_HANDLE,
                ])?;
                let cap = a.bytes(UVERBS_ATTR_CREATE_QP_CAP)?.ok_or(EINVAL)?;
                if cap.len() != size_of::<IbUverbsQpCap>() {
                    return Err(EINVAL);
                }
                let cap: IbUverbsQpCap = read_prefix_zero_fill(&cap);
                // uverbs_get_flags32: unknown bits are EINVAL; known ones this HCA does
                // not implement are mlx5_ib's EOPNOTSUPP (process_create_flags).
                let flags = a.u32(UVERBS_ATTR_CREATE_QP_FLAGS)?.unwrap_or(0);
                if flags & !IB_UVERBS_QP_CREATE_FLAGS_KNOWN != 0 {
                    return Err(EINVAL);
                }
                if flags & !IB_UVERBS_QP_CREATE_SQ_SIG_ALL != 0 {
                    return Err(Errno(libc::EOPNOTSUPP));
                }
                let srq = a.data(UVERBS_ATTR_CREATE_QP_SRQ_HANDLE);
                // An XRC target names its domain instead of a PD, and has no CQs
                // (kernel/xrc.rs reads the domain handle from `pd_handle`).
                let xrcd = a.data(UVERBS_ATTR_CREATE_QP_XRCD_HANDLE);
                let send_cq = match xrcd {
                    Some(_) => a.data(UVERBS_ATTR_CREATE_QP_SEND_CQ_HANDLE).unwrap_or(0),
                    None => Attrs::need(a.data(UVERBS_ATTR_CREATE_QP_SEND_CQ_HANDLE))?,
                };
                let pd = match xrcd {
                    Some(x) => x,
                    None => Attrs::need(a.data(UVERBS_ATTR_CREATE_QP_PD_HANDLE))?,
                };
                let req = IbUverbsCreateQp {
                    user_handle: a.u64(UVERBS_ATTR_CREATE_QP_USER_HANDLE)?.unwrap_or(0),
                    pd_handle: pd as u32,
                    send_cq_handle: send_cq as u32,
                    recv_cq_handle: a
                        .data(UVERBS_ATTR_CREATE_QP_RECV_CQ_HANDLE)
                        .unwrap_or(send_cq) as u32,
                    srq_handle: srq.unwrap_or(0) as u32,
                    max_send_wr: cap.max_send_wr,
                    max_recv_wr: cap.max_recv_wr,
                    max_send_sge: cap.max_send_sge,
                    max_recv_sge: cap.max_recv_sge,
                    max_inline_data: cap.max_inline_data,
                    sq_sig_all: u8::from(flags & IB_UVERBS_QP_CREATE_SQ_SIG_ALL != 0),
                    qp_type: Attrs::need(a.data(UVERBS_ATTR_CREATE_QP_TYPE))? as u8,
                    is_srq: u8::from(srq.is_some()),
                    ..Default::default()
                };
                let uhw = a.uhw()?;
                let r = self.run::<cmds::CreateQp>(&req, uhw)?;
                a.out_data(UVERBS_ATTR_CREATE_QP_HANDLE, u64::from(r.qp_handle));
                let cap = IbUverbsQpCap {
                    max_send_wr: r.max_send_wr,
                    max_recv_wr: r.max_recv_wr,
                    max_send_sge: r.max_send_sge,
                    max_recv_sge: r.max_recv_sge,
                    max_inline_data: r.max_inline_data,
                };
                a.out(UVERBS_ATTR_CREATE_QP_RESP_CAP, cap.as_bytes())?;
                a.out(UVERBS_ATTR_CREATE_QP_RESP_QP_NUM, r.qpn.as_bytes())?;
                a.uhw_done();
                Ok(())
            }
            (UVERBS_OBJECT_QP, UVERBS_METHOD_QP_DESTROY) => {
                a.only(&[UVERBS_ATTR_DESTROY_QP_HANDLE, UVERBS_ATTR_DESTROY_QP_RESP])?;
                let h = Attrs::need(a.data(UVERBS_ATTR_DESTROY_QP_HANDLE))? as u32;
                let req = IbUverbsDestroyQp {
                    qp_handle: h,
                    ..Default::default()
                };
                let r = self.run::<cmds::DestroyQp>(&req, no_uhw())?;
                a.out(UVERBS_ATTR_DESTROY_QP_RESP, r.as_bytes())
            }
            (UVERBS_OBJECT_SRQ, UVERBS_METHOD_SRQ_CREATE) => {
                a.only(&[
                    UVERBS_ATTR_CREATE_SRQ_HANDLE,
                    UVERBS_ATTR_CREATE_SRQ_PD_HANDLE,
                    UVERBS_ATTR_CREATE_SRQ_USER_HANDLE,
                    UVERBS_ATTR_CREATE_SRQ_MAX_WR,
                    UVERBS_ATTR_CREATE_SRQ_MAX_SGE,
                    UVERBS_ATTR_CREATE_SRQ_LIMIT,
                    UVERBS_ATTR_CREATE_SRQ_TYPE,
                    UVERBS_ATTR_CREATE_SRQ_EVENT_FD,
                    UVERBS_ATTR_CREATE_SRQ_RESP_MAX_WR,
                    UVERBS_ATTR_CREATE_SRQ_RESP_MAX_SGE,
                    UVERBS_ATTR_CREATE_SRQ_RESP_SRQ_NUM,
                    UVERBS_ATTR_CREATE_SRQ_XRCD_HANDLE,
                    UVERBS_ATTR_CREATE_SRQ_CQ_HANDLE,
                    UVERBS_ATTR_CREATE_SRQ_MAX_NUM_TAGS,
                ])?;
                let srq_type = a.data(UVERBS_ATTR_CREATE_SRQ_TYPE).unwrap_or(0);
                if srq_type != u64::from(IB_UVERBS_SRQT_BASIC) {
                    // XRC (and tag-matching) SRQs: CREATE_XSRQ's handler (kernel/xrc.rs).
                    let req = mlx5_ffi::uverbs::IbUverbsCreateXsrq {
                        user_handle: a.u64(UVERBS_ATTR_CREATE_SRQ_USER_HANDLE)?.unwrap_or(0),
                        srq_type: srq_type as u32,
                        pd_handle: Attrs::need(a.data(UVERBS_ATTR_CREATE_SRQ_PD_HANDLE))? as u32,
                        max_wr: Attrs::need(a.u32(UVERBS_ATTR_CREATE_SRQ_MAX_WR)?)?,
                        max_sge: Attrs::need(a.u32(UVERBS_ATTR_CREATE_SRQ_MAX_SGE)?)?,
                        srq_limit: a.u32(UVERBS_ATTR_CREATE_SRQ_LIMIT)?.unwrap_or(0),
                        max_num_tags: a.u32(UVERBS_ATTR_CREATE_SRQ_MAX_NUM_TAGS)?.unwrap_or(0),
                        xrcd_handle: Attrs::need(a.data(UVERBS_ATTR_CREATE_SRQ_XRCD_HANDLE))?
                            as u32,
                        cq_handle: Attrs::need(a.data(UVERBS_ATTR_CREATE_SRQ_CQ_HANDLE))? as u32,
                        ..Default::default()
                    };
                    let uhw = a.uhw()?;
                    let r = self.run::<cmds::CreateXsrq>(&req, uhw)?;
                    a.out_data(UVERBS_ATTR_CREATE_SRQ_HANDLE, u64::from(r.srq_handle));
                    a.out(UVERBS_ATTR_CREATE_SRQ_RESP_MAX_WR, r.max_wr.as_bytes())?;
                    a.out(UVERBS_ATTR_CREATE_SRQ_RESP_MAX_SGE, r.max_sge.as_bytes())?;
                    a.out(UVERBS_ATTR_CREATE_SRQ_RESP_SRQ_NUM, r.srqn.as_bytes())?;
                    a.uhw_done();
                    return Ok(());
                }
                let req = IbUverbsCreateSrq {
                    user_handle: a.u64(UVERBS_ATTR_CREATE_SRQ_USER_HANDLE)?.unwrap_or(0),
                    pd_handle: Attrs::need(a.data(UVERBS_ATTR_CREATE_SRQ_PD_HANDLE))? as u32,
                    max_wr: Attrs::need(a.u32(UVERBS_ATTR_CREATE_SRQ_MAX_WR)?)?,
                    max_sge: Attrs::need(a.u32(UVERBS_ATTR_CREATE_SRQ_MAX_SGE)?)?,
                    srq_limit: a.u32(UVERBS_ATTR_CREATE_SRQ_LIMIT)?.unwrap_or(0),
                    ..Default::default()
                };
                let uhw = a.uhw()?;
                let r = self.run::<cmds::CreateSrq>(&req, uhw)?;
                a.out_data(UVERBS_ATTR_CREATE_SRQ_HANDLE, u64::from(r.srq_handle));
                a.out(UVERBS_ATTR_CREATE_SRQ_RESP_MAX_WR, r.max_wr.as_bytes())?;
                a.out(UVERBS_ATTR_CREATE_SRQ_RESP_MAX_SGE, r.max_sge.as_bytes())?;
                a.out(UVERBS_ATTR_CREATE_SRQ_RESP_SRQ_NUM, r.srqn.as_bytes())?;
                a.uhw_done();
                Ok(())
            }
            (UVERBS_OBJECT_SRQ, UVERBS_METHOD_SRQ_DESTROY) => {
                a.only(&[UVERBS_ATTR_DESTROY_SRQ_HANDLE, UVERBS_ATTR_DESTROY_SRQ_RESP])?;
                let h = Attrs::need(a.data(UVERBS_ATTR_DESTROY_SRQ_HANDLE))? as u32;
                let req = IbUverbsDestroySrq {
                    srq_handle: h,
                    ..Default::default()
                };
                let r = self.run::<cmds::DestroySrq>(&req, no_uhw())?;
                a.out(UVERBS_ATTR_DESTROY_SRQ_RESP, r.as_bytes())
            }
            (UVERBS_OBJECT_XRCD, mlx5_ffi::xrc_dc::UVERBS_METHOD_XRCD_DESTROY) => {
                let h = self.handle_in(&a, mlx5_ffi::xrc_dc::UVERBS_ATTR_DESTROY_XRCD_HANDLE)?;
                let req = mlx5_ffi::xrc_dc::IbUverbsCloseXrcd { xrcd_handle: h };
                self.run::<cmds::CloseXrcd>(&req, no_uhw())
            }
            // Device memory: mlx5_ib_alloc_dm answers EOPNOTSUPP without MEMIC (and
            // QUERY_DEVICE reports max_dm_size 0).
            (UVERBS_OBJECT_DM, UVERBS_METHOD_DM_ALLOC) => Err(Errno(libc::EOPNOTSUPP)),
            // DEVX (kernel/devx.rs).
            (
                MLX5_IB_OBJECT_DEVX
                | MLX5_IB_OBJECT_DEVX_OBJ
                | MLX5_IB_OBJECT_DEVX_UMEM
                | MLX5_IB_OBJECT_DEVX_ASYNC_EVENT_FD,
                _,
            ) => self.devx_method(object, method, a),
            (MLX5_IB_OBJECT_UAR, MLX5_IB_METHOD_UAR_OBJ_ALLOC) => {
                a.only(&[
                    MLX5_IB_ATTR_UAR_OBJ_ALLOC_HANDLE,
                    MLX5_IB_ATTR_UAR_OBJ_ALLOC_TYPE,
                    MLX5_IB_ATTR_UAR_OBJ_ALLOC_MMAP_OFFSET,
                    MLX5_IB_ATTR_UAR_OBJ_ALLOC_MMAP_LENGTH,
                    MLX5_IB_ATTR_UAR_OBJ_ALLOC_PAGE_ID,
                ])?;
                let ty = Attrs::need(a.u32(MLX5_IB_ATTR_UAR_OBJ_ALLOC_TYPE)?)?;
                let (handle, page_id, pgoff) = self.alloc_uar(ty)?;
                a.out_data(MLX5_IB_ATTR_UAR_OBJ_ALLOC_HANDLE, u64::from(handle));
                a.out(
                    MLX5_IB_ATTR_UAR_OBJ_ALLOC_MMAP_OFFSET,
                    (pgoff * PAGE as u64).as_bytes(),
                )?;
                a.out(
                    MLX5_IB_ATTR_UAR_OBJ_ALLOC_MMAP_LENGTH,
                    (PAGE as u32).as_bytes(),
                )?;
                a.out(MLX5_IB_ATTR_UAR_OBJ_ALLOC_PAGE_ID, page_id.as_bytes())
            }
            (MLX5_IB_OBJECT_UAR, MLX5_IB_METHOD_UAR_OBJ_DESTROY) => {
                a.only(&[MLX5_IB_ATTR_UAR_OBJ_DESTROY_HANDLE])?;
                let h = Attrs::need(a.data(MLX5_IB_ATTR_UAR_OBJ_DESTROY_HANDLE))? as u32;
                self.destroy_uar(h)
            }
            _ => Err(EPROTONOSUPPORT),
        }
    }

    /// The single HANDLE attribute (id `id`) of a simple destroy method.
    fn handle_in(&self, a: &Attrs<'_>, id: u16) -> Result<u32, Errno> {
        a.only(&[id])?;
        Ok(Attrs::need(a.data(id))? as u32)
    }

    /// The valid GID entries of `port`, in index order.
    fn gid_entries(&self, port: u32) -> Result<Vec<IbUverbsGidEntry>, Errno> {
        let ctx = self.ctx().ok_or(EINVAL)?;
        let w = self.shared.lock();
        let c = w.contexts.get(&ctx).ok_or(EINVAL)?;
        if port != 1 {
            return Err(EINVAL);
        }
        Ok(w.hcas[c.hca]
            .info
            .gid_table()
            .iter()
            .map(|g| IbUverbsGidEntry {
                gid: read_prefix_zero_fill(&g.gid),
                gid_index: g.index,
                port_num: port,
                gid_type: g.gid_type as u32,
                netdev_ifindex: g.ndev_ifindex,
            })
            .collect())
    }

    /// The entry for (port, index); ENODATA for an index without a valid GID.
    fn gid_entry(&self, port: u32, index: u32) -> Result<IbUverbsGidEntry, Errno> {
        self.gid_entries(port)?
            .into_iter()
            .find(|e| e.gid_index == index)
            .ok_or(Errno(libc::ENODATA))
    }

    fn set_async_handed_out(&self, v: bool) {
        let Some(ctx) = self.ctx() else { return };
        let mut w = self.shared.lock();
        let Some(ch) = w.contexts.get(&ctx).map(|c| c.async_ch) else {
            return;
        };
        if let Some(Some(chan)) = w.channels.get_mut(ch) {
            chan.handed_out = v;
        }
    }

    /// Allocate a dynamic UAR page: (handle, page id, mmap page offset).
    fn alloc_uar(&self, ty: u32) -> Result<(u32, u32, u64), Errno> {
        let ctx = self.ctx().ok_or(EINVAL)?;
        let mut w = self.shared.lock();
        // mlx5_ib UAR_OBJ_ALLOC: a type other than BF/NC is EOPNOTSUPP, as is BF without
        // write-combining.
        if ty != MLX5_IB_UAPI_UAR_ALLOC_TYPE_BF && ty != MLX5_IB_UAPI_UAR_ALLOC_TYPE_NC {
            return Err(Errno(libc::EOPNOTSUPP));
        }
        if ty == MLX5_IB_UAPI_UAR_ALLOC_TYPE_BF && w.cfg.bf_reg_size == 0 {
            return Err(Errno(libc::EOPNOTSUPP));
        }
        let c = w.contexts.get_mut(&ctx).ok_or(EINVAL)?;
        let k = c.next_dyn as usize;
        if k >= MAX_DYN_UARS {
            return Err(Errno(libc::ENOMEM));
        }
        c.next_dyn += 1;
        let page = c.uar_pages + 2 + k;
        let page_id = DYN_PAGE_ID_BASE + k as u32;
        let pgoff = DYN_PGOFF_BASE + k as u64;
        c.dyn_pages.insert(page_id, (page, pgoff));
        c.uar_active.push(page);
        let h = c.next_handle;
        c.next_handle += 1;
        c.handles.insert(h, Obj::Uar(page_id));
        Ok((h, page_id, pgoff))
    }

    /// Destroy a dynamic UAR object. Its page stays watched (a mapping may outlive the
    /// object, as with the kernel's mmap entries) but can no longer be mapped or named.
    fn destroy_uar(&self, handle: u32) -> Result<(), Errno> {
        let ctx = self.ctx().ok_or(EINVAL)?;
        let mut w = self.shared.lock();
        let c = w.contexts.get_mut(&ctx).ok_or(EINVAL)?;
        let Some(Obj::Uar(id)) = c.handles.get(&handle).copied() else {
            return Err(EINVAL);
        };
        c.handles.remove(&handle);
        c.dyn_pages.remove(&id);
        Ok(())
    }

    /// The context's async-event fd, handed out once (ASYNC_EVENT alloc).
    fn take_async_fd(&self) -> Result<i32, Errno> {
        let ctx = self.ctx().ok_or(EINVAL)?;
        let mut w = self.shared.lock();
        let ch = w.contexts.get(&ctx).ok_or(EINVAL)?.async_ch;
        let chan = w
            .channels
            .get_mut(ch)
            .and_then(Option::as_mut)
            .ok_or(EINVAL)?;
        if chan.handed_out {
            return Err(Errno(libc::EEXIST));
        }
        chan.handed_out = true;
        Ok(chan.user_fd)
    }
}

/// No driver data.
fn no_uhw() -> Uhw {
    (Vec::new(), 0, 0)
}
