//! The ioctl object methods of a modern kernel (`Flavour::Modern`): DEVICE (GET_CONTEXT,
//! QUERY_PORT, QUERY_GID_TABLE/ENTRY), ASYNC_EVENT alloc, CQ/QP/SRQ create and destroy,
//! PD/MR/AH destroy. Each is mapped onto the same handler as its write() command, so the
//! validation is shared; attribute plumbing (inline vs pointer inputs, IDR/FD outputs in
//! `data`, `UVERBS_ATTR_F_VALID_OUTPUT`) is done here.

use super::{
    DYN_PAGE_ID_BASE, DYN_PGOFF_BASE, EINVAL, EPROTONOSUPPORT, EmuFile, MAX_DYN_UARS, Out, Req,
    cmd, le32,
};
use crate::abi::Errno;
use crate::mem;
use crate::state::Obj;
use crate::uar::PAGE;

/// `UVERBS_ATTR_F_MANDATORY`, `UVERBS_ATTR_F_VALID_OUTPUT`.
const F_MANDATORY: u16 = 1;
const F_VALID_OUTPUT: u16 = 2;
const UHW_IN: u16 = 0x1000;
/// `MLX5_IB_OBJECT_UAR` (DEVX + 8).
const MLX5_OBJECT_UAR: u16 = 0x1008;
const UHW_OUT: u16 = 0x1001;

/// One decoded attribute: (offset in the buffer, id, len, flags, data).
pub(super) type Attr = (usize, u16, u16, u16, u64);

/// The attributes of one call, with helpers to read inputs and write outputs.
pub(super) struct Attrs<'a> {
    buf: &'a mut [u8],
    list: &'a [Attr],
}

impl<'a> Attrs<'a> {
    pub(super) fn new(buf: &'a mut [u8], list: &'a [Attr]) -> Self {
        Attrs { buf, list }
    }

    fn find(&self, id: u16) -> Option<Attr> {
        self.list.iter().copied().find(|a| a.1 == id)
    }

    /// Reject mandatory attributes the method does not know.
    fn only(&self, known: &[u16]) -> Result<(), Errno> {
        let unknown = self.list.iter().any(|a| {
            a.3 & F_MANDATORY != 0 && !known.contains(&a.1) && a.1 != UHW_IN && a.1 != UHW_OUT
        });
        if unknown {
            Err(EPROTONOSUPPORT)
        } else {
            Ok(())
        }
    }

    /// Input bytes: inline in `data` up to 8 bytes, else through the pointer.
    fn bytes(&self, id: u16) -> Result<Option<Vec<u8>>, Errno> {
        let Some((_, _, len, _, data)) = self.find(id) else {
            return Ok(None);
        };
        if len as usize <= 8 {
            Ok(Some(data.to_ne_bytes()[..len as usize].to_vec()))
        } else {
            mem::read_vec(data, len as usize).map(Some)
        }
    }

    fn u32(&self, id: u16) -> Result<Option<u32>, Errno> {
        Ok(self.bytes(id)?.map(|b| {
            let mut a = [0u8; 4];
            let n = b.len().min(4);
            a[..n].copy_from_slice(&b[..n]);
            u32::from_ne_bytes(a)
        }))
    }

    fn u64(&self, id: u16) -> Result<Option<u64>, Errno> {
        Ok(self.bytes(id)?.map(|b| {
            let mut a = [0u8; 8];
            let n = b.len().min(8);
            a[..n].copy_from_slice(&b[..n]);
            u64::from_ne_bytes(a)
        }))
    }

    /// Object handle / fd inputs are inline in `data`.
    fn data(&self, id: u16) -> Option<u64> {
        self.find(id).map(|a| a.4)
    }

    fn need<T>(v: Option<T>) -> Result<T, Errno> {
        v.ok_or(EINVAL)
    }

    fn set_flag(&mut self, off: usize) {
        let f = u16::from_ne_bytes([self.buf[off + 4], self.buf[off + 5]]) | F_VALID_OUTPUT;
        self.buf[off + 4..off + 6].copy_from_slice(&f.to_ne_bytes());
    }

    /// Copy an output through the attribute's pointer (`min(len, size)` bytes).
    fn out(&mut self, id: u16, bytes: &[u8]) -> Result<(), Errno> {
        let Some((off, _, len, _, ptr)) = self.find(id) else {
            return Ok(());
        };
        let n = (len as usize).min(bytes.len());
        mem::write(ptr, &bytes[..n])?;
        self.set_flag(off);
        Ok(())
    }

    /// IDR/FD outputs: the new handle or fd is written into the attribute's `data`.
    fn out_data(&mut self, id: u16, v: u64) {
        if let Some((off, ..)) = self.find(id) {
            self.buf[off + 8..off + 16].copy_from_slice(&v.to_ne_bytes());
            self.set_flag(off);
        }
    }

    /// The driver-data pair as (input bytes, output pointer, output length).
    fn uhw(&self) -> Result<(Vec<u8>, u64, usize), Errno> {
        let inp = self.bytes(UHW_IN)?.unwrap_or_default();
        let (ptr, len) = self.find(UHW_OUT).map_or((0, 0), |a| (a.4, a.2 as usize));
        Ok((inp, ptr, len))
    }

    fn uhw_done(&mut self) {
        if let Some((off, ..)) = self.find(UHW_OUT) {
            self.set_flag(off);
        }
    }
}

/// A kernel-side scratch buffer for the core response of the shared handler.
struct Scratch(Vec<u8>);
impl Scratch {
    fn new(n: usize) -> Self {
        Scratch(vec![0u8; n])
    }
    fn addr(&mut self) -> u64 {
        self.0.as_mut_ptr() as u64
    }
}

impl EmuFile {
    /// Run a write handler for an ioctl method: `core` is the write-ABI core request (its
    /// response pointer is replaced by a kernel scratch buffer of `resp` bytes).
    fn run(
        &self,
        command: u32,
        ex: bool,
        mut core: Vec<u8>,
        resp: usize,
        uhw: (Vec<u8>, u64, usize),
    ) -> Result<Vec<u8>, Errno> {
        let mut scratch = Scratch::new(resp.max(8));
        let out = scratch.addr();
        if !ex && resp > 0 {
            core[..8].copy_from_slice(&out.to_ne_bytes());
        }
        let req = Req {
            command,
            ex,
            core,
            drv_in: uhw.0,
            out,
            out_len: resp,
            drv_out: uhw.1,
            drv_out_len: uhw.2,
        };
        self.dispatch(&req)?;
        Ok(scratch.0)
    }

    pub(super) fn method(&self, object: u16, method: u16, mut a: Attrs<'_>) -> Result<(), Errno> {
        match (object, method) {
            // DEVICE / GET_CONTEXT: 0 NUM_COMP_VECTORS (out u32), 1 CORE_SUPPORT (out u64).
            (0, 3) => {
                a.only(&[0, 1])?;
                let uhw = a.uhw()?;
                self.run(cmd::GET_CONTEXT, false, vec![0u8; 8], 8, uhw)?;
                // Over ioctl the async fd comes later, from ASYNC_EVENT alloc.
                self.set_async_handed_out(false);
                a.out(0, &1u32.to_ne_bytes())?;
                a.out(1, &1u64.to_ne_bytes())?; // IB_UVERBS_CORE_SUPPORT_OPTIONAL_MR_ACCESS
                a.uhw_done();
                Ok(())
            }
            // DEVICE / QUERY_PORT: 0 PORT_NUM (u8), 1 RESP (ib_uverbs_query_port_resp_ex, 48 B).
            (0, 2) => {
                a.only(&[0, 1])?;
                let port = Attrs::need(a.u32(0)?)? as u8;
                let mut core = vec![0u8; 16];
                core[8] = port;
                let mut r = self.run(cmd::QUERY_PORT, false, core, 40, (Vec::new(), 0, 0))?;
                r.resize(48, 0);
                a.out(1, &r)
            }
            // DEVICE / QUERY_GID_TABLE: 0 ENTRY_SIZE (u64), 1 FLAGS, 2 RESP_ENTRIES, 3 RESP_NUM_ENTRIES.
            (0, 5) => {
                a.only(&[0, 1, 2, 3])?;
                let esz = Attrs::need(a.u64(0)?)? as usize;
                if esz < 32 || a.u32(1)?.unwrap_or(0) != 0 {
                    return Err(EINVAL);
                }
                let cap = a.find(2).map_or(0, |x| x.2 as usize / esz);
                let entries = self.gid_entries(1)?;
                let n = cap.min(entries.len());
                if n > 0 {
                    let mut out = Vec::with_capacity(n * esz);
                    for mut e in entries.into_iter().take(n) {
                        e.resize(esz, 0);
                        out.extend_from_slice(&e);
                    }
                    a.out(2, &out)?;
                }
                a.out(3, &(n as u64).to_ne_bytes())
            }
            // DEVICE / QUERY_GID_ENTRY: 0 PORT, 1 GID_INDEX, 2 FLAGS, 3 RESP_ENTRY.
            (0, 6) => {
                a.only(&[0, 1, 2, 3])?;
                let port = Attrs::need(a.u32(0)?)?;
                let index = Attrs::need(a.u32(1)?)?;
                if a.u32(2)?.unwrap_or(0) != 0 {
                    return Err(EINVAL);
                }
                let e = self.gid_entry(port, index)?;
                a.out(3, &e)
            }
            // ASYNC_EVENT / ALLOC: 0 FD_HANDLE (FD out).
            (16, 0) => {
                a.only(&[0])?;
                let fd = self.take_async_fd()?;
                a.out_data(0, fd as u64);
                Ok(())
            }
            // PD, MR, AH destroy: 0 HANDLE.
            (1, 0) => self.destroy_simple(cmd::DEALLOC_PD, &a),
            (7, 1) => self.destroy_simple(cmd::DEREG_MR, &a),
            (6, 0) => self.destroy_simple(cmd::DESTROY_AH, &a),
            // CQ / CREATE.
            (3, 0) => {
                a.only(&[0, 1, 2, 3, 4, 5, 6, 7])?;
                let mut core = Out::new(32);
                core.u64(0, a.u64(2)?.unwrap_or(0))
                    .u32(8, Attrs::need(a.u32(1)?)?)
                    .u32(12, a.u32(4)?.unwrap_or(0))
                    .u32(16, a.data(3).map_or(u32::MAX, |d| d as u32))
                    .u32(24, a.u32(5)?.unwrap_or(0));
                let uhw = a.uhw()?;
                let r = self.run(cmd::CREATE_CQ | super::FLAG_EXTENDED, true, core.0, 16, uhw)?;
                a.out_data(0, u64::from(le32(&r, 0)));
                a.out(6, &r[4..8])?;
                a.uhw_done();
                Ok(())
            }
            // CQ / DESTROY: 0 HANDLE, 1 RESP (comp_events_reported, async_events_reported).
            (3, 1) => self.destroy_with_resp(cmd::DESTROY_CQ, 8, &mut a),
            // QP / CREATE.
            (4, 0) => {
                a.only(&[0, 2, 3, 4, 5, 7, 8, 9, 10, 12, 13, 14])?;
                let cap = a.bytes(8)?.ok_or(EINVAL)?;
                if cap.len() != 20 {
                    return Err(EINVAL);
                }
                let flags = a.u32(10)?.unwrap_or(0);
                if flags & !(1 << 12) != 0 {
                    return Err(Errno(libc::EOPNOTSUPP));
                }
                let srq = a.data(3);
                let mut core = Out::new(56);
                core.u64(8, a.u64(7)?.unwrap_or(0))
                    .u32(16, Attrs::need(a.data(2))? as u32)
                    .u32(20, Attrs::need(a.data(4))? as u32)
                    .u32(24, Attrs::need(a.data(5).or(a.data(4)))? as u32)
                    .u32(28, srq.unwrap_or(0) as u32)
                    .bytes(32, &cap)
                    .u8(52, u8::from(flags & (1 << 12) != 0))
                    .u8(53, Attrs::need(a.data(9))? as u8)
                    .u8(54, u8::from(srq.is_some()));
                let uhw = a.uhw()?;
                let r = self.run(cmd::CREATE_QP, false, core.0, 32, uhw)?;
                a.out_data(0, u64::from(le32(&r, 0)));
                a.out(13, &r[8..28])?;
                a.out(14, &r[4..8])?;
                a.uhw_done();
                Ok(())
            }
            (4, 1) => self.destroy_with_resp(cmd::DESTROY_QP, 4, &mut a),
            // SRQ / CREATE: 0 HANDLE, 1 PD, 4 USER_HANDLE, 5 MAX_WR, 6 MAX_SGE, 7 LIMIT,
            // 9 TYPE, 10 EVENT_FD, 11 RESP_MAX_WR, 12 RESP_MAX_SGE, 13 RESP_SRQ_NUM.
            (5, 0) => {
                a.only(&[0, 1, 4, 5, 6, 7, 9, 10, 11, 12, 13])?;
                if a.data(9).unwrap_or(0) != 0 {
                    return Err(Errno(libc::EOPNOTSUPP));
                }
                let mut core = Out::new(32);
                core.u64(8, a.u64(4)?.unwrap_or(0))
                    .u32(16, Attrs::need(a.data(1))? as u32)
                    .u32(20, Attrs::need(a.u32(5)?)?)
                    .u32(24, Attrs::need(a.u32(6)?)?)
                    .u32(28, a.u32(7)?.unwrap_or(0));
                let uhw = a.uhw()?;
                let r = self.run(cmd::CREATE_SRQ, false, core.0, 16, uhw)?;
                a.out_data(0, u64::from(le32(&r, 0)));
                a.out(11, &r[4..8])?;
                a.out(12, &r[8..12])?;
                a.out(13, &r[12..16])?;
                a.uhw_done();
                Ok(())
            }
            (5, 1) => self.destroy_with_resp(cmd::DESTROY_SRQ, 4, &mut a),
            // mlx5 UAR / ALLOC: 0x1000 HANDLE (IDR out), 0x1001 TYPE (0 BF, 1 NC),
            // 0x1002 MMAP_OFFSET (out u64), 0x1003 MMAP_LENGTH (out u32), 0x1004 PAGE_ID (out u32).
            (MLX5_OBJECT_UAR, 0x1000) => {
                a.only(&[0x1000, 0x1001, 0x1002, 0x1003, 0x1004])?;
                let ty = Attrs::need(a.u32(0x1001)?)?;
                let (handle, page_id, pgoff) = self.alloc_uar(ty)?;
                a.out_data(0x1000, u64::from(handle));
                a.out(0x1002, &(pgoff * PAGE as u64).to_ne_bytes())?;
                a.out(0x1003, &(PAGE as u32).to_ne_bytes())?;
                a.out(0x1004, &page_id.to_ne_bytes())
            }
            // mlx5 UAR / DESTROY: 0x1000 HANDLE.
            (MLX5_OBJECT_UAR, 0x1001) => {
                a.only(&[0x1000])?;
                let h = Attrs::need(a.data(0x1000))? as u32;
                self.destroy_uar(h)
            }
            _ => Err(EPROTONOSUPPORT),
        }
    }

    fn destroy_simple(&self, command: u32, a: &Attrs<'_>) -> Result<(), Errno> {
        a.only(&[0])?;
        let h = Attrs::need(a.data(0))? as u32;
        self.run(
            command,
            false,
            h.to_ne_bytes().to_vec(),
            0,
            (Vec::new(), 0, 0),
        )
        .map(|_| ())
    }

    fn destroy_with_resp(&self, command: u32, resp: usize, a: &mut Attrs<'_>) -> Result<(), Errno> {
        a.only(&[0, 1])?;
        let h = Attrs::need(a.data(0))? as u32;
        let mut core = vec![0u8; 16];
        core[8..12].copy_from_slice(&h.to_ne_bytes());
        let r = self.run(command, false, core, resp, (Vec::new(), 0, 0))?;
        a.out(1, &r[..resp])
    }

    /// The valid `ib_uverbs_gid_entry` records of `port` (0 gid[16], 16 gid_index,
    /// 20 port_num, 24 gid_type, 28 netdev_ifindex), in index order.
    fn gid_entries(&self, port: u32) -> Result<Vec<Vec<u8>>, Errno> {
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
            .map(|g| {
                let mut e = Out::new(32);
                e.bytes(0, &g.gid)
                    .u32(16, g.index)
                    .u32(20, port)
                    .u32(24, g.gid_type as u32)
                    .u32(28, g.ndev_ifindex);
                e.0
            })
            .collect())
    }

    /// `ib_uverbs_gid_entry` for (port, index); ENODATA for an index without a valid GID.
    fn gid_entry(&self, port: u32, index: u32) -> Result<Vec<u8>, Errno> {
        self.gid_entries(port)?
            .into_iter()
            .find(|e| le32(e, 16) == index)
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

    /// Whether (object, method) is implemented.
    pub(super) fn known(object: u16, method: u16) -> bool {
        matches!(
            (object, method),
            (0, 0 | 2 | 3 | 5 | 6)
                | (1, 0)
                | (3, 0 | 1)
                | (4, 0 | 1)
                | (5, 0 | 1)
                | (6, 0)
                | (7, 1)
                | (16, 0)
                | (MLX5_OBJECT_UAR, 0x1000 | 0x1001)
        )
    }

    /// Allocate a dynamic UAR page: (handle, page id, mmap page offset).
    fn alloc_uar(&self, ty: u32) -> Result<(u32, u32, u64), Errno> {
        let ctx = self.ctx().ok_or(EINVAL)?;
        let mut w = self.shared.lock();
        if ty > 1 {
            return Err(EINVAL);
        }
        if ty == 0 && w.cfg.bf_reg_size == 0 {
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
