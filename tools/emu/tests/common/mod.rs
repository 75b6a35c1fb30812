//! Test rig: drive the emulator the way a provider would, from raw kernel commands built with
//! `mlx5-ffi` and WQEs built with `mlx5-hw` (never with the driver's code).
#![allow(dead_code)]

use std::ptr::NonNull;
use std::sync::Arc;

use mlx5_emu::{EmuConfig, Emulator, Errno, RunMode, UverbsSurface};
use mlx5_ffi::ioctl::{
    IbUverbsGidEntry, IbUverbsQueryPortRespEx, IoctlBuilder, UVERBS_ATTR_QUERY_GID_ENTRY_FLAGS,
    UVERBS_ATTR_QUERY_GID_ENTRY_GID_INDEX, UVERBS_ATTR_QUERY_GID_ENTRY_PORT,
    UVERBS_ATTR_QUERY_GID_ENTRY_RESP_ENTRY, UVERBS_ATTR_QUERY_PORT_PORT_NUM,
    UVERBS_ATTR_QUERY_PORT_RESP, UVERBS_METHOD_QUERY_GID_ENTRY, UVERBS_METHOD_QUERY_PORT,
    UVERBS_OBJECT_DEVICE,
};
use mlx5_ffi::mlx5::*;
use mlx5_ffi::uverbs::*;
use mlx5_hw::doorbell::{cq_arm_doorbell, cq_arm_word};
use mlx5_hw::opcodes::SendOpcode;
use mlx5_hw::wqe::{CtrlSeg, DataSeg};
use zerocopy::{FromBytes, IntoBytes};

pub const RC: u8 = 2;
pub const UC: u8 = 3;
pub const UD: u8 = 4;

pub const LOCAL_WRITE: u32 = 1;
pub const REMOTE_WRITE: u32 = 2;
pub const REMOTE_READ: u32 = 4;
pub const REMOTE_ATOMIC: u32 = 8;
pub const ALL_ACCESS: u32 = 15;

/// Page-aligned anonymous memory, like a provider's queue buffers.
#[derive(Debug)]
pub struct Buf {
    ptr: NonNull<u8>,
    pub len: usize,
}

// SAFETY: the mapping is owned by Buf and only accessed through it.
unsafe impl Send for Buf {}

impl Buf {
    pub fn new(len: usize) -> Buf {
        let len = len.max(1).div_ceil(4096) * 4096;
        // SAFETY: anonymous private mapping at a kernel-chosen address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        Buf {
            ptr: NonNull::new(p.cast()).expect("mmap returned non-null"),
            len,
        }
    }
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }
    pub fn read(&self, off: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.read_into(off, &mut v);
        v
    }
    /// Copy `out.len()` bytes at `off` into `out` (after an acquire fence: the device may
    /// have written them from another thread).
    pub fn read_into(&self, off: usize, out: &mut [u8]) {
        assert!(off.checked_add(out.len()).is_some_and(|e| e <= self.len));
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        let src = self.ptr.as_ptr().wrapping_add(off);
        // SAFETY: in bounds (asserted above); `out` is a distinct Rust buffer.
        unsafe { std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), out.len()) };
    }
    pub fn load(&self, off: usize) -> u8 {
        assert!(off < self.len);
        // SAFETY: in bounds of our mapping; volatile because the device writes it.
        unsafe { self.ptr.as_ptr().wrapping_add(off).read_volatile() }
    }
    /// Copy `data` to `off`. Publication to the device is the caller's doorbell (record
    /// store after a release fence), as with real queue memory.
    pub fn write(&self, off: usize, data: &[u8]) {
        assert!(off.checked_add(data.len()).is_some_and(|e| e <= self.len));
        let dst = self.ptr.as_ptr().wrapping_add(off);
        // SAFETY: in bounds (asserted above); `data` is a distinct Rust buffer.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) };
    }
    pub fn be32_store(&self, off: usize, v: u32) {
        self.write(off, &v.to_be_bytes());
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: our own mapping, no longer referenced.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// One volatile 64-bit store to process address `addr` (an MMIO-style doorbell write).
pub fn store64(addr: usize, v: u64) {
    assert_eq!(addr % 8, 0);
    let p = std::ptr::with_exposed_provenance_mut::<u64>(addr);
    // SAFETY: callers pass addresses inside mappings they own (UAR pages), 8-byte aligned.
    unsafe { p.write_volatile(v) };
}

/// One volatile 32-bit store (doorbell records).
pub fn store32(addr: u64, v: u32) {
    assert_eq!(addr % 4, 0);
    let p = std::ptr::with_exposed_provenance_mut::<u32>(addr as usize);
    // SAFETY: callers pass record slots in a doorbell page they own, 4-byte aligned.
    unsafe { p.write_volatile(v) };
}

/// The raw command calls of a surface, for tests that build commands by hand.
///
/// Sound here because every surface these tests open is the emulator's, whose kernel reaches
/// user memory only through fault-catching copies at the pointers a command names, and the
/// tests' pointers name buffers the tests own (a `Vec` or a [`Buf`] kept alive across the call
/// and not otherwise borrowed meanwhile) or addresses chosen to be invalid.
pub trait RawCmd {
    /// `write(2)` of a uverbs command.
    fn cmd_write(&self, buf: &[u8]) -> Result<usize, Errno>;
    /// `ioctl(RDMA_VERBS_IOCTL)`.
    fn cmd_ioctl(&self, buf: &mut [u8]) -> Result<(), Errno>;
}

impl RawCmd for Arc<dyn UverbsSurface> {
    fn cmd_write(&self, buf: &[u8]) -> Result<usize, Errno> {
        // SAFETY: see the trait: an emulator surface and test-owned (or deliberately
        // invalid) pointers.
        unsafe { self.write(buf) }
    }
    fn cmd_ioctl(&self, buf: &mut [u8]) -> Result<(), Errno> {
        // SAFETY: as for `cmd_write`.
        unsafe { self.ioctl(buf) }
    }
}

/// Build and send a legacy write command whose core request starts with the response
/// pointer (`core[0..8]` is overwritten). Returns (core response, driver response).
pub fn write_cmd(
    dev: &Arc<dyn UverbsSurface>,
    command: u32,
    core: &[u8],
    driver: &[u8],
    resp_len: usize,
    drv_out_len: usize,
) -> Result<(Vec<u8>, Vec<u8>), Errno> {
    let mut out = vec![0u8; resp_len + drv_out_len + 8];
    let mut core = core.to_vec();
    if resp_len > 0 {
        core[..8].copy_from_slice(&(out.as_mut_ptr() as u64).to_ne_bytes());
    }
    let buf = mlx5_ffi::cmd::build_write(command, &core, driver, resp_len + drv_out_len)?;
    dev.cmd_write(&buf)?;
    let drv = out[resp_len..resp_len + drv_out_len].to_vec();
    out.truncate(resp_len);
    Ok((out, drv))
}

/// `write_cmd` when only the outcome matters.
/// `out` = (core response bytes, driver response bytes).
pub fn run_cmd(
    dev: &Arc<dyn UverbsSurface>,
    command: u32,
    core: &[u8],
    driver: &[u8],
    out: (usize, usize),
) -> Result<(), Errno> {
    write_cmd(dev, command, core, driver, out.0, out.1).map(|_| ())
}

/// Legacy command without a response pointer (DEALLOC_PD, MODIFY_QP, ...).
pub fn write_noresp(
    dev: &Arc<dyn UverbsSurface>,
    command: u32,
    core: &[u8],
    driver: &[u8],
) -> Result<(), Errno> {
    let buf = mlx5_ffi::cmd::build_write(command, core, driver, 0)?;
    dev.cmd_write(&buf).map(|_| ())
}

/// An opened context: device surface, mapped UAR pages, a doorbell-record page.
pub struct Ctx {
    pub emu: Emulator,
    pub dev: Arc<dyn UverbsSurface>,
    pub hca: usize,
    pub async_fd: i32,
    pub resp: Mlx5IbAllocUcontextResp,
    pub uars: Vec<NonNull<u8>>,
    pub dbpage: Buf,
    next_db: usize,
}

impl Ctx {
    pub fn open(emu: &Emulator, hca: usize) -> Ctx {
        let dev = emu.open(hca).expect("open");
        let req = Mlx5IbAllocUcontextReqV2 {
            total_num_bfregs: 16,
            num_low_latency_bfregs: 4,
            max_cqe_version: 1,
            lib_caps: 0,
            ..Default::default()
        };
        let (core, drv) = write_cmd(
            &dev,
            IB_USER_VERBS_CMD_GET_CONTEXT,
            &[0u8; 8],
            req.as_bytes(),
            8,
            size_of::<Mlx5IbAllocUcontextResp>(),
        )
        .expect("GET_CONTEXT");
        let resp = Mlx5IbAllocUcontextResp::read_from_bytes(&drv).expect("resp");
        let async_fd = IbUverbsGetContextResp::read_from_bytes(&core)
            .expect("core")
            .async_fd as i32;
        let pages = resp.tot_bfregs / 2;
        let uars = (0..pages)
            .map(|i| {
                dev.mmap(4096, libc::PROT_WRITE, mmap_offset(0, i) * 4096)
                    .expect("mmap uar")
            })
            .collect();
        Ctx {
            emu: emu.clone(),
            dev,
            hca,
            async_fd,
            resp,
            uars,
            dbpage: Buf::new(4096),
            next_db: 0,
        }
    }

    /// A context opened some other way (e.g. over ioctl).
    pub fn from_parts(
        emu: Emulator,
        dev: Arc<dyn UverbsSurface>,
        async_fd: i32,
        resp: Mlx5IbAllocUcontextResp,
        uars: Vec<NonNull<u8>>,
    ) -> Ctx {
        Ctx {
            emu,
            dev,
            hca: 0,
            async_fd,
            resp,
            uars,
            dbpage: Buf::new(4096),
            next_db: 0,
        }
    }

    /// A fresh zeroed 64-byte doorbell-record slot.
    pub fn db(&mut self) -> u64 {
        let a = self.dbpage.addr() + self.next_db as u64;
        self.next_db += 64;
        a
    }

    pub fn alloc_pd(&self) -> u32 {
        let (o, _) = write_cmd(&self.dev, IB_USER_VERBS_CMD_ALLOC_PD, &[0u8; 8], &[], 4, 4)
            .expect("ALLOC_PD");
        u32::from_ne_bytes([o[0], o[1], o[2], o[3]])
    }

    pub fn reg_mr(
        &self,
        pd: u32,
        addr: u64,
        len: u64,
        access: u32,
    ) -> Result<(u32, u32, u32), Errno> {
        let c = IbUverbsRegMr {
            response: 0,
            start: addr,
            length: len,
            hca_va: addr,
            pd_handle: pd,
            access_flags: access,
        };
        let (o, _) = write_cmd(
            &self.dev,
            IB_USER_VERBS_CMD_REG_MR,
            c.as_bytes(),
            &[],
            12,
            0,
        )?;
        let r = IbUverbsRegMrResp::read_from_bytes(&o).expect("resp");
        Ok((r.mr_handle, r.lkey, r.rkey))
    }

    pub fn comp_channel(&self) -> i32 {
        let (o, _) = write_cmd(
            &self.dev,
            IB_USER_VERBS_CMD_CREATE_COMP_CHANNEL,
            &[0u8; 8],
            &[],
            4,
            0,
        )
        .expect("channel");
        i32::from_ne_bytes([o[0], o[1], o[2], o[3]])
    }

    pub fn create_cq(&mut self, entries: u32, cqe_size: u32, channel: i32) -> Cq {
        let ncqe = entries.next_power_of_two();
        let buf = Buf::new((ncqe * cqe_size) as usize);
        for i in 0..ncqe as usize {
            buf.write(i * cqe_size as usize + cqe_size as usize - 1, &[0xF0]);
        }
        let db = self.db();
        let c = IbUverbsCreateCq {
            response: 0,
            user_handle: 0xC0FFEE,
            cqe: ncqe - 1,
            comp_vector: 0,
            comp_channel: channel,
            reserved: 0,
        };
        let d = Mlx5IbCreateCq {
            buf_addr: buf.addr(),
            db_addr: db,
            cqe_size,
            ..Default::default()
        };
        let (o, dr) = write_cmd(
            &self.dev,
            IB_USER_VERBS_CMD_CREATE_CQ,
            c.as_bytes(),
            d.as_bytes(),
            8,
            8,
        )
        .expect("CREATE_CQ");
        let handle = u32::from_ne_bytes([o[0], o[1], o[2], o[3]]);
        let cqn = u32::from_ne_bytes([dr[0], dr[1], dr[2], dr[3]]);
        Cq {
            handle,
            cqn,
            buf,
            db,
            ncqe,
            cqe_size,
            ci: 0,
            arm_sn: 0,
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub fn create_qp(
        &mut self,
        pd: u32,
        scq: &Cq,
        rcq: &Cq,
        qp_type: u8,
        sq_cnt: u32,
        rq_cnt: u32,
        srq: Option<u32>,
    ) -> Qp {
        let spec = QpSpec {
            qp_type,
            sq_cnt,
            rq_cnt,
            srq,
            flags: 0,
            sig_all: false,
        };
        self.create_qp_spec(pd, scq, rcq, spec)
    }

    /// `create_qp` with every knob, including mlx5 QP `flags` (e.g. SCATTER_CQE = 2).
    pub fn create_qp_spec(&mut self, pd: u32, scq: &Cq, rcq: &Cq, spec: QpSpec) -> Qp {
        let QpSpec {
            qp_type,
            sq_cnt,
            rq_cnt,
            srq,
            flags,
            sig_all,
        } = spec;
        let rq_shift = 5; // 2 data segments per receive WQE
        let bytes = ((rq_cnt as usize) << rq_shift) + sq_cnt as usize * 64;
        let buf = Buf::new(bytes);
        let db = self.db();
        let c = IbUverbsCreateQp {
            response: 0,
            user_handle: 0x5150,
            pd_handle: pd,
            send_cq_handle: scq.handle,
            recv_cq_handle: rcq.handle,
            srq_handle: srq.unwrap_or(0),
            max_send_wr: sq_cnt / 2,
            max_recv_wr: rq_cnt,
            max_send_sge: 2,
            max_recv_sge: if srq.is_some() { 0 } else { 2 },
            max_inline_data: 64,
            sq_sig_all: u8::from(sig_all),
            qp_type,
            is_srq: u8::from(srq.is_some()),
            reserved: 0,
        };
        let d = Mlx5IbCreateQp {
            buf_addr: buf.addr(),
            db_addr: db,
            sq_wqe_count: sq_cnt,
            rq_wqe_count: rq_cnt,
            rq_wqe_shift: rq_shift,
            flags,
            uidx: 0x100 + self.next_db as u32,
            ..Default::default()
        };
        let (o, dr) = write_cmd(
            &self.dev,
            IB_USER_VERBS_CMD_CREATE_QP,
            c.as_bytes(),
            d.as_bytes(),
            32,
            40,
        )
        .expect("CREATE_QP");
        let r = IbUverbsCreateQpResp::read_from_bytes(&o).expect("resp");
        let bfreg = u32::from_ne_bytes([dr[0], dr[1], dr[2], dr[3]]);
        Qp {
            handle: r.qp_handle,
            qpn: r.qpn,
            uidx: d.uidx,
            qp_type,
            buf,
            db,
            sq_cnt,
            rq_cnt,
            rq_shift,
            sq_pi: 0,
            rq_pi: 0,
            bfreg,
            bf_half: 0,
        }
    }

    pub fn modify(&self, m: &IbUverbsModifyQp) -> Result<(), Errno> {
        write_noresp(&self.dev, IB_USER_VERBS_CMD_MODIFY_QP, m.as_bytes(), &[])
    }

    /// The address of this QP's bfreg (static scheme: libmlx5 index = page*4 + k).
    pub fn bfreg_addr(&self, qp: &Qp) -> usize {
        let page = (qp.bfreg / 4) as usize;
        let k = (qp.bfreg % 4) as usize;
        let bf = self.resp.bf_reg_size.max(256) as usize;
        self.uars[page].as_ptr() as usize + 0x800 + k * bf
    }

    /// Ring the CQ-arm doorbell (UAR page 0 + 0x20) after writing the arm record.
    pub fn arm_cq(&self, cq: &mut Cq, solicited: bool) {
        let word = cq_arm_word(cq.arm_sn, solicited, cq.ci);
        store32(cq.db + 4, word.to_be());
        let bytes = cq_arm_doorbell(word, cq.cqn);
        store64(
            self.uars[0].as_ptr() as usize + 0x20,
            u64::from_ne_bytes(bytes),
        );
    }
}

/// What `Ctx::create_qp_spec` creates.
#[derive(Clone, Copy, Debug)]
pub struct QpSpec {
    pub qp_type: u8,
    pub sq_cnt: u32,
    pub rq_cnt: u32,
    pub srq: Option<u32>,
    /// mlx5 QP flags (SCATTER_CQE = 2, ...).
    pub flags: u32,
    pub sig_all: bool,
}

/// A CQ with its software consumer state.
pub struct Cq {
    pub handle: u32,
    pub cqn: u32,
    pub buf: Buf,
    pub db: u64,
    pub ncqe: u32,
    pub cqe_size: u32,
    pub ci: u32,
    pub arm_sn: u8,
}

impl Cq {
    /// Poll one CQE: returns the 64-byte descriptor and, for a 128-byte entry, its first
    /// half (zeros for 64-byte CQEs).
    pub fn poll(&mut self) -> Option<([u8; 64], [u8; 64])> {
        let entry = (self.ci & (self.ncqe - 1)) as usize * self.cqe_size as usize;
        let desc = entry + if self.cqe_size == 128 { 64 } else { 0 };
        let op_own = self.buf.load(desc + 63);
        let owner = ((self.ci / self.ncqe) & 1) as u8;
        if op_own >> 4 == 0xF || op_own & 1 != owner {
            return None;
        }
        let mut d = [0u8; 64];
        self.buf.read_into(desc, &mut d);
        let mut first = [0u8; 64];
        if self.cqe_size == 128 {
            self.buf.read_into(entry, &mut first);
        }
        self.ci += 1;
        store32(self.db, (self.ci & 0xff_ffff).to_be());
        Some((d, first))
    }
}

/// A QP with its software producer state.
pub struct Qp {
    pub handle: u32,
    pub qpn: u32,
    pub uidx: u32,
    pub qp_type: u8,
    pub buf: Buf,
    pub db: u64,
    pub sq_cnt: u32,
    pub rq_cnt: u32,
    pub rq_shift: u32,
    pub sq_pi: u32,
    pub rq_pi: u32,
    pub bfreg: u32,
    pub bf_half: usize,
}

/// How to tell the device about a send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ring {
    /// Only the doorbell record (the device must NOT see this).
    RecordOnly,
    /// Record + 8-byte doorbell.
    Doorbell,
    /// Record + BlueFlame copy.
    BlueFlame,
}

impl Qp {
    fn sq_off(&self) -> usize {
        (self.rq_cnt as usize) << self.rq_shift
    }

    /// Write one send WQE (ctrl built here) with `segs` following the ctrl segment; wraps
    /// at the ring end. Returns the WQE index.
    pub fn build_send(
        &mut self,
        opcode: SendOpcode,
        opmod: u8,
        fm_ce_se: u8,
        imm: [u8; 4],
        segs: &[u8],
    ) -> u16 {
        let ds = (1 + segs.len().div_ceil(16)) as u8;
        let idx = self.sq_pi as u16;
        let ctrl = CtrlSeg::new(opcode, opmod, idx, self.qpn, ds, fm_ce_se, 0).with_imm_bytes(imm);
        // The WQE, zero-padded to whole 16-byte units (at most 63 of them), written one
        // 64-byte basic block at a time so that it wraps at the ring end.
        let mut wqe = [0u8; 1024];
        let len = ds as usize * 16;
        assert!(len <= wqe.len(), "WQE of {ds} units");
        wqe[..16].copy_from_slice(ctrl.as_bytes());
        wqe[16..16 + segs.len()].copy_from_slice(segs);
        for (i, chunk) in wqe[..len].chunks(64).enumerate() {
            let slot = (self.sq_pi as usize + i) & (self.sq_cnt as usize - 1);
            self.buf.write(self.sq_off() + slot * 64, chunk);
        }
        self.sq_pi += (ds as u32).div_ceil(4);
        idx
    }

    /// Publish the SQ record and ring (per `ring`) for the WQE at `idx`.
    pub fn ring(&mut self, ctx: &Ctx, idx: u16, ring: Ring) {
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        store32(self.db + 4, (self.sq_pi & 0xffff).to_be());
        if ring == Ring::RecordOnly {
            return;
        }
        let slot = idx as usize & (self.sq_cnt as usize - 1);
        let mut ctrl = [0u8; 16];
        self.buf.read_into(self.sq_off() + slot * 64, &mut ctrl);
        let ds = (ctrl[7] & 0x3f) as usize;
        let reg = ctx.bfreg_addr(self);
        let dst = reg + self.bf_half;
        if ring == Ring::BlueFlame {
            let mut bb = [0u8; 64];
            for i in 0..(ds * 16).div_ceil(64) {
                let s = (slot + i) & (self.sq_cnt as usize - 1);
                self.buf.read_into(self.sq_off() + s * 64, &mut bb);
                for (j, w) in bb.chunks(8).enumerate() {
                    let v = u64::from_ne_bytes(w.try_into().expect("8 bytes"));
                    store64(dst + i * 64 + j * 8, v);
                }
            }
        } else {
            let v = u64::from_ne_bytes(ctrl[..8].try_into().expect("8 bytes"));
            store64(dst, v);
        }
        if ctx.resp.bf_reg_size > 0 {
            self.bf_half ^= ctx.resp.bf_reg_size as usize / 2;
        }
    }

    /// Post one receive WQE with the given (addr, len, lkey) segments.
    pub fn post_recv(&mut self, sges: &[(u64, u32, u32)]) {
        let stride = 1usize << self.rq_shift;
        let slot = self.rq_pi as usize & (self.rq_cnt as usize - 1);
        let mut off = slot * stride;
        for &(a, l, k) in sges {
            self.buf.write(off, DataSeg::new(l, k, a).as_bytes());
            off += 16;
        }
        if off < (slot + 1) * stride {
            self.buf.write(off, DataSeg::terminator().as_bytes());
        }
        self.rq_pi += 1;
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        store32(self.db, (self.rq_pi & 0xffff).to_be());
    }
}

/// A UD datagram segment (address vector) towards `dqpn` at `dlid` with `qkey`, no GRH.
pub fn ud_av(dqpn: u32, dlid: u16, qkey: u32) -> Vec<u8> {
    let mut av = mlx5_hw::wqe::DatagramSeg::zeroed();
    av.set_qkey(qkey);
    av.set_dqpn(dqpn);
    av.rlid = mlx5_hw::types::Be16::new(dlid);
    av.as_bytes().to_vec()
}

/// QUERY_QP's core response for `qp`.
pub fn query_qp(ctx: &Ctx, qp: &Qp) -> IbUverbsQueryQpResp {
    let q = IbUverbsQueryQp {
        response: 0,
        qp_handle: qp.handle,
        attr_mask: 0,
    };
    let (o, _) = write_cmd(
        &ctx.dev,
        IB_USER_VERBS_CMD_QUERY_QP,
        q.as_bytes(),
        &[],
        128,
        0,
    )
    .expect("QUERY_QP");
    IbUverbsQueryQpResp::read_from_bytes(&o).expect("128-byte response")
}

/// The QP's state as QUERY_QP reports it (0 RESET .. 5 SQE, 6 ERR).
pub fn qp_state(ctx: &Ctx, qp: &Qp) -> u32 {
    query_qp(ctx, qp).qp_state.into()
}

/// QUERY_PORT (legacy write) of `port`: the 40-byte core response.
pub fn query_port(ctx: &Ctx, port: u8) -> Result<IbUverbsQueryPortResp, Errno> {
    let q = IbUverbsQueryPort {
        response: 0,
        port_num: port,
        ..Default::default()
    };
    let (o, _) = write_cmd(
        &ctx.dev,
        IB_USER_VERBS_CMD_QUERY_PORT,
        q.as_bytes(),
        &[],
        40,
        0,
    )?;
    Ok(IbUverbsQueryPortResp::read_from_bytes(&o).expect("40 bytes"))
}

/// QUERY_PORT of port 1 over ioctl (the extended 48-byte response).
pub fn query_port_ex(ctx: &Ctx) -> IbUverbsQueryPortRespEx {
    let mut px = IbUverbsQueryPortRespEx::default();
    let mut b = IoctlBuilder::new(UVERBS_OBJECT_DEVICE, UVERBS_METHOD_QUERY_PORT)
        .in_u32(UVERBS_ATTR_QUERY_PORT_PORT_NUM, 1)
        .out_ptr(
            UVERBS_ATTR_QUERY_PORT_RESP,
            px.as_mut_bytes().as_mut_ptr() as u64,
            48,
        )
        .build()
        .expect("build");
    ctx.dev.cmd_ioctl(&mut b).expect("QUERY_PORT over ioctl");
    px
}

/// QUERY_GID_ENTRY over ioctl: entry `index` of port 1's GID table.
pub fn gid_entry(ctx: &Ctx, index: u32) -> Result<IbUverbsGidEntry, Errno> {
    let mut e = IbUverbsGidEntry::default();
    let mut b = IoctlBuilder::new(UVERBS_OBJECT_DEVICE, UVERBS_METHOD_QUERY_GID_ENTRY)
        .in_u32(UVERBS_ATTR_QUERY_GID_ENTRY_PORT, 1)
        .in_u32(UVERBS_ATTR_QUERY_GID_ENTRY_GID_INDEX, index)
        .in_u32(UVERBS_ATTR_QUERY_GID_ENTRY_FLAGS, 0)
        .out_ptr(
            UVERBS_ATTR_QUERY_GID_ENTRY_RESP_ENTRY,
            e.as_mut_bytes().as_mut_ptr() as u64,
            32,
        )
        .build()
        .expect("build");
    ctx.dev.cmd_ioctl(&mut b).map(|()| e)
}

pub fn modify_base(qp: &Qp) -> IbUverbsModifyQp {
    IbUverbsModifyQp {
        qp_handle: qp.handle,
        ..Default::default()
    }
}

pub const M_STATE: u32 = 1;
pub const M_ACCESS: u32 = 1 << 3;
pub const M_PKEY: u32 = 1 << 4;
pub const M_PORT: u32 = 1 << 5;
pub const M_QKEY: u32 = 1 << 6;
pub const M_AV: u32 = 1 << 7;
pub const M_MTU: u32 = 1 << 8;
pub const M_TIMEOUT: u32 = 1 << 9;
pub const M_RETRY: u32 = 1 << 10;
pub const M_RNR_RETRY: u32 = 1 << 11;
pub const M_RQ_PSN: u32 = 1 << 12;
pub const M_MAX_RD: u32 = 1 << 13;
pub const M_MIN_RNR: u32 = 1 << 15;
pub const M_SQ_PSN: u32 = 1 << 16;
pub const M_MAX_DEST_RD: u32 = 1 << 17;
pub const M_DEST_QPN: u32 = 1 << 20;

/// Transport knobs for bringing a connected QP up.
#[derive(Clone, Copy, Debug)]
pub struct Knobs {
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    pub access: u32,
}

impl Default for Knobs {
    fn default() -> Self {
        Knobs {
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            access: ALL_ACCESS,
        }
    }
}

/// RESET -> INIT: a UD QP gets the test Q_Key, a connected one the `access` flags.
pub fn to_init(ctx: &Ctx, qp: &Qp, access: u32) {
    let mut m = modify_base(qp);
    m.qp_state = 1;
    m.port_num = 1;
    if qp.qp_type == UD {
        m.attr_mask = M_STATE | M_PKEY | M_PORT | M_QKEY;
        m.qkey = 0x1111_1111;
    } else {
        m.attr_mask = M_STATE | M_PKEY | M_PORT | M_ACCESS;
        m.qp_access_flags = access;
    }
    ctx.modify(&m).expect("INIT");
}

/// The INIT -> RTR modify towards (`dlid`, `dest_qpn`); only the state for UD.
pub fn rtr_modify(qp: &Qp, dlid: u16, dest_qpn: u32, k: Knobs) -> IbUverbsModifyQp {
    let mut m = modify_base(qp);
    m.qp_state = 2;
    if qp.qp_type == UD {
        m.attr_mask = M_STATE;
    } else {
        m.attr_mask = M_STATE | M_AV | M_MTU | M_DEST_QPN | M_RQ_PSN;
        m.dest.dlid = dlid;
        m.dest.port_num = 1;
        m.path_mtu = 3;
        m.dest_qp_num = dest_qpn;
        m.rq_psn = 0x100;
        if qp.qp_type == RC {
            m.attr_mask |= M_MAX_DEST_RD | M_MIN_RNR;
            m.max_dest_rd_atomic = 4;
            m.min_rnr_timer = k.min_rnr_timer;
        }
    }
    m
}

/// RTR -> RTS with the transport knobs of `k` (RC only).
pub fn to_rts(ctx: &Ctx, qp: &Qp, k: Knobs) {
    let mut m = modify_base(qp);
    m.qp_state = 3;
    m.attr_mask = M_STATE | M_SQ_PSN;
    m.sq_psn = 0x100;
    if qp.qp_type == RC {
        m.attr_mask |= M_TIMEOUT | M_RETRY | M_RNR_RETRY | M_MAX_RD;
        m.timeout = k.timeout;
        m.retry_cnt = k.retry_cnt;
        m.rnr_retry = k.rnr_retry;
        m.max_rd_atomic = 4;
    }
    ctx.modify(&m).expect("RTS");
}

/// RESET -> INIT -> RTR -> RTS towards (`dlid`, `dest_qpn`).
pub fn bring_up(ctx: &Ctx, qp: &Qp, dlid: u16, dest_qpn: u32, k: Knobs) {
    to_init(ctx, qp, k.access);
    ctx.modify(&rtr_modify(qp, dlid, dest_qpn, k)).expect("RTR");
    to_rts(ctx, qp, k);
}

/// Back to RESET with the software producer state, the ring and the doorbell record
/// cleared, so that the QP can be brought up again.
pub fn reset_qp(ctx: &Ctx, qp: &mut Qp) {
    let mut m = modify_base(qp);
    m.attr_mask = M_STATE;
    m.qp_state = 0;
    ctx.modify(&m).unwrap();
    qp.sq_pi = 0;
    qp.rq_pi = 0;
    qp.buf.write(0, &vec![0u8; qp.buf.len]);
    store32(qp.db, 0);
    store32(qp.db + 4, 0);
}

/// Two connected QPs (on HCA 0 and HCA 1 of one stepped emulator) with CQs, PDs and
/// registered buffers: `a` sends to `b`.
pub struct Pair {
    pub emu: Emulator,
    pub a: Ctx,
    pub b: Ctx,
    pub qa: Qp,
    pub qb: Qp,
    pub cqa: Cq,
    pub cqb: Cq,
    pub pda: u32,
    pub pdb: u32,
    /// Registered buffers (4 pages each) with their keys: (buf, lkey, rkey).
    pub ma: (Buf, u32, u32),
    pub mb: (Buf, u32, u32),
}

pub fn stepped(num_hcas: usize) -> Emulator {
    Emulator::new(EmuConfig {
        num_hcas,
        mode: RunMode::Stepped,
        ..EmuConfig::default()
    })
}

pub fn pair(qp_type: u8, k: Knobs) -> Pair {
    pair_cfg(qp_type, k, 64)
}

pub fn pair_cfg(qp_type: u8, k: Knobs, cqe_size: u32) -> Pair {
    pair_in(stepped(2), qp_type, k, cqe_size, 64, 16)
}

/// A connected pair on HCAs 0 and 1 of `emu`: CQs of `cq_entries` entries of `cqe_size`
/// bytes, 64-WQEBB send queues and `rq` receive WQEs.
pub fn pair_in(
    emu: Emulator,
    qp_type: u8,
    k: Knobs,
    cqe_size: u32,
    cq_entries: u32,
    rq: u32,
) -> Pair {
    let p = pair_objects(emu, qp_type, k.access, cqe_size, cq_entries, rq);
    bring_up(
        &p.a,
        &p.qa,
        p.emu.hca_info(1).expect("hca 1").lid,
        p.qb.qpn,
        k,
    );
    bring_up(
        &p.b,
        &p.qb,
        p.emu.hca_info(0).expect("hca 0").lid,
        p.qa.qpn,
        k,
    );
    p
}

/// The objects of [`pair_in`] with the QPs still in RESET (the caller connects them):
/// buffers registered with `access` (plus local write).
pub fn pair_objects(
    emu: Emulator,
    qp_type: u8,
    access: u32,
    cqe_size: u32,
    cq_entries: u32,
    rq: u32,
) -> Pair {
    let a = Ctx::open(&emu, 0);
    let b = Ctx::open(&emu, 1);
    let pda = a.alloc_pd();
    let pdb = b.alloc_pd();
    pair_of(
        emu,
        (a, pda),
        (b, pdb),
        qp_type,
        access,
        (cqe_size, cq_entries, rq),
    )
}

/// [`pair_objects`] on contexts the caller opened (`a` on HCA 0, `b` on HCA 1) with their
/// PD handles: CQs of `cq.1` entries of `cq.0` bytes, `cq.2` receive WQEs.
pub fn pair_of(
    emu: Emulator,
    (mut a, pda): (Ctx, u32),
    (mut b, pdb): (Ctx, u32),
    qp_type: u8,
    access: u32,
    (cqe_size, cq_entries, rq): (u32, u32, u32),
) -> Pair {
    let cqa = a.create_cq(cq_entries, cqe_size, -1);
    let cqb = b.create_cq(cq_entries, cqe_size, -1);
    let qa = a.create_qp(pda, &cqa, &cqa, qp_type, 64, rq, None);
    let qb = b.create_qp(pdb, &cqb, &cqb, qp_type, 64, rq, None);
    let bufa = Buf::new(4 * 4096);
    let bufb = Buf::new(4 * 4096);
    let (_, la, ra) = a
        .reg_mr(pda, bufa.addr(), bufa.len as u64, access | LOCAL_WRITE)
        .expect("mr a");
    let (_, lb, rb) = b
        .reg_mr(pdb, bufb.addr(), bufb.len as u64, access | LOCAL_WRITE)
        .expect("mr b");
    Pair {
        emu,
        a,
        b,
        qa,
        qb,
        cqa,
        cqb,
        pda,
        pdb,
        ma: (bufa, la, ra),
        mb: (bufb, lb, rb),
    }
}

impl Pair {
    /// Post one WQE on `qa` (ctrl built from the arguments, `segs` after it), ring the
    /// 8-byte doorbell and run the emulator until idle. Returns the WQE index.
    pub fn send(&mut self, opcode: SendOpcode, fm_ce_se: u8, imm: [u8; 4], segs: &[u8]) -> u16 {
        let i = self.qa.build_send(opcode, 0, fm_ce_se, imm, segs);
        self.qa.ring(&self.a, i, Ring::Doorbell);
        self.emu.run_until_idle();
        i
    }
}

/// Step two emulators (two nodes of a UDP fabric) until both have been idle for a while.
pub fn settle(a: &Emulator, b: &Emulator) {
    let mut idle = 0;
    for _ in 0..100_000 {
        let n = a.step() + b.step();
        idle = if n == 0 { idle + 1 } else { 0 };
        if idle > 20 {
            return;
        }
    }
}

/// A deterministic xorshift generator for the fuzzers.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// An index below `n`.
    pub fn pick(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// User + system CPU seconds of this process (getrusage).
pub fn cpu_seconds() -> f64 {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct we pass.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr()) };
    assert_eq!(rc, 0);
    // SAFETY: initialised by the successful call above (and zeroed before).
    let ru = unsafe { ru.assume_init() };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

/// Decoded fields of a CQE descriptor that the tests check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cqe {
    pub opcode: u8,
    pub syndrome: u8,
    pub vendor: u8,
    pub byte_cnt: u32,
    pub imm: [u8; 4],
    pub qpn: u32,
    pub send_op: u8,
    pub wqe_counter: u16,
    pub uidx: u32,
    pub src_qp: u32,
    pub grh: bool,
    pub format: u8,
}

pub fn decode(d: &[u8; 64]) -> Cqe {
    let c = mlx5_hw::cqe::Cqe64::read_from_bytes(d).expect("64 bytes");
    let e = mlx5_hw::cqe::ErrCqe::read_from_bytes(d).expect("64 bytes");
    let opcode = c.opcode().0;
    let err = opcode == 13 || opcode == 14;
    Cqe {
        opcode,
        syndrome: if err { e.syndrome } else { 0 },
        vendor: if err { e.vendor_err_synd } else { 0 },
        byte_cnt: c.byte_cnt(),
        imm: c.imm_inval_pkey.to_bytes(),
        qpn: c.qpn(),
        send_op: c.send_opcode().0,
        wqe_counter: c.wqe_counter(),
        uidx: c.user_index(),
        src_qp: c.src_qp(),
        grh: c.has_grh(),
        format: c.format(),
    }
}

/// Poll every CQE currently in `cq`.
pub fn drain(cq: &mut Cq) -> Vec<Cqe> {
    let mut v = Vec::new();
    while let Some((d, _)) = cq.poll() {
        v.push(decode(&d));
    }
    v
}

/// The loopback address of fabric node (LID) `lid` on the UDP fabric: 127.1.hi.lo:4791.
pub fn node_addr(lid: u16) -> std::net::SocketAddrV4 {
    let [hi, lo] = lid.to_be_bytes();
    std::net::SocketAddrV4::new([127, 1, hi, lo].into(), 4791)
}

/// Bind a plain UDP socket as a fake fabric node at the first free address in `range`, counting
/// down (emulators without an explicit node count up from 1).
pub fn bind_node(range: std::ops::RangeInclusive<u16>) -> (std::net::UdpSocket, u16) {
    range
        .rev()
        .find_map(|lid| {
            std::net::UdpSocket::bind(node_addr(lid))
                .ok()
                .map(|s| (s, lid))
        })
        .expect("a free 127.1.x.y:4791 fabric address")
}
