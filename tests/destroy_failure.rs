//! A failed destroy never gives memory back to the allocator while the device may still use it.
//!
//! When DESTROY_CQ, DESTROY_QP, DESTROY_SRQ or DEREG_MR fails (a device that went away, a kernel that
//! refuses), the kernel object may live on and the device may still read and write the queue
//! ring, the doorbell record or the registered buffer. Freeing that memory would let the device
//! write into whatever the allocator puts there next. The driver then keeps it for the rest of
//! the process. On the old code the memory was unmapped on drop whatever the kernel answered.
//!
//! One test in this file, so no other test of the process maps memory while it checks which
//! addresses are still mapped.

use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use mlx5::ffi::surface::{Errno, UverbsSurface};
use mlx5::ffi::uverbs::{
    IB_USER_VERBS_CMD_CREATE_CQ, IB_USER_VERBS_CMD_CREATE_QP, IB_USER_VERBS_CMD_CREATE_SRQ,
    IB_USER_VERBS_CMD_DEREG_MR, IB_USER_VERBS_CMD_DESTROY_CQ, IB_USER_VERBS_CMD_DESTROY_QP,
    IB_USER_VERBS_CMD_DESTROY_SRQ, IbUverbsCmdHdr, IbUverbsCreateCq, IbUverbsCreateQp,
    IbUverbsCreateSrq,
};
use mlx5::{Access, Context, Cq, CqInit, DmaBuf, Pd, Qp, QpInitAttr, QpType, Srq};
use mlx5_emu::{EmuConfig, Emulator, RunMode};

/// Forwards to the emulator; while `fail` is set, answers DESTROY_CQ, DESTROY_QP, DESTROY_SRQ
/// and DEREG_MR with EIO without forwarding (the kernel object stays). Records the queue buffer
/// address of every CREATE_CQ / CREATE_QP / CREATE_SRQ (the first word of the mlx5 driver
/// data).
#[derive(Debug)]
struct Failing {
    inner: Arc<dyn UverbsSurface>,
    fail: AtomicBool,
    bufs: Mutex<Vec<u64>>,
}

fn command(cmd: &[u8]) -> u32 {
    u32::from_ne_bytes(cmd[..4].try_into().unwrap())
}

fn word(cmd: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(cmd[at..at + 8].try_into().unwrap())
}

// SAFETY: every operation is forwarded to `inner` (the emulator) unchanged, except the three
// destroy commands, which it refuses without touching memory.
unsafe impl UverbsSurface for Failing {
    unsafe fn write(&self, cmd: &[u8]) -> Result<usize, Errno> {
        let hdr = size_of::<IbUverbsCmdHdr>();
        match command(cmd) {
            IB_USER_VERBS_CMD_CREATE_QP => {
                let drv = hdr + size_of::<IbUverbsCreateQp>();
                self.bufs.lock().unwrap().push(word(cmd, drv));
            }
            IB_USER_VERBS_CMD_CREATE_SRQ => {
                let drv = hdr + size_of::<IbUverbsCreateSrq>();
                self.bufs.lock().unwrap().push(word(cmd, drv));
            }
            IB_USER_VERBS_CMD_CREATE_CQ => {
                let drv = hdr + size_of::<IbUverbsCreateCq>();
                self.bufs.lock().unwrap().push(word(cmd, drv));
            }
            IB_USER_VERBS_CMD_DESTROY_CQ
            | IB_USER_VERBS_CMD_DESTROY_QP
            | IB_USER_VERBS_CMD_DESTROY_SRQ
            | IB_USER_VERBS_CMD_DEREG_MR
                if self.fail.load(Ordering::Relaxed) =>
            {
                return Err(Errno::EIO);
            }
            _ => {}
        }
        // SAFETY: the caller's contract for `cmd` is passed on unchanged.
        unsafe { self.inner.write(cmd) }
    }
    unsafe fn ioctl(&self, buf: &mut [u8]) -> Result<(), Errno> {
        // SAFETY: the caller's contract for `buf` is passed on unchanged.
        unsafe { self.inner.ioctl(buf) }
    }
    fn mmap(&self, len: usize, prot: i32, offset: u64) -> Result<NonNull<u8>, Errno> {
        self.inner.mmap(len, prot, offset)
    }
    unsafe fn munmap(&self, addr: NonNull<u8>, len: usize) -> Result<(), Errno> {
        // SAFETY: the caller's contract (a mapping of this surface, i.e. of `inner`).
        unsafe { self.inner.munmap(addr, len) }
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

/// Whether the page holding `addr` is mapped in this process.
fn mapped(addr: u64) -> bool {
    let page = (addr & !4095) as *mut libc::c_void;
    // SAFETY: msync only inspects the mapping of the range (ENOMEM if unmapped); MS_ASYNC on
    // anonymous memory does nothing else.
    unsafe { libc::msync(page, 4096, libc::MS_ASYNC) == 0 }
}

#[test]
fn memory_of_a_failed_destroy_stays_mapped() {
    let emu = Emulator::new(EmuConfig {
        num_hcas: 1,
        mode: RunMode::Stepped,
        ..EmuConfig::default()
    });
    let surface = Arc::new(Failing {
        inner: emu.open(0).unwrap(),
        fail: AtomicBool::new(false),
        bufs: Mutex::new(Vec::new()),
    });
    let ctx = Context::open(surface.clone()).unwrap();
    let pd = Pd::new(&ctx).unwrap();
    let cq = Cq::new(&ctx, CqInit::default(), None).unwrap();
    let last_buf = || *surface.bufs.lock().unwrap().last().unwrap();
    let qp = || Qp::new(&pd, &QpInitAttr::new(QpType::Rc, &cq, &cq)).unwrap();

    // Control: a successful destroy gives the ring back (so `mapped` can tell).
    let q = qp();
    let ring = last_buf();
    assert!(mapped(ring));
    drop(q);
    assert!(!mapped(ring), "a destroyed QP's ring is unmapped");
    let s = Srq::new(&pd, 16, 1).unwrap();
    let srq_ring = last_buf();
    assert!(mapped(srq_ring));
    drop(s);
    assert!(!mapped(srq_ring), "a destroyed SRQ's ring is unmapped");
    let buf = Arc::new(DmaBuf::new(1 << 16).unwrap());
    let addr = buf.addr();
    let mr = pd.reg_mr(&buf, Access::LOCAL_WRITE).unwrap();
    drop(buf);
    assert!(mapped(addr), "the region keeps its buffer");
    drop(mr);
    assert!(!mapped(addr), "a deregistered region's buffer is unmapped");
    let c = Cq::new(&ctx, CqInit::default(), None).unwrap();
    let cq_ring = last_buf();
    assert!(mapped(cq_ring));
    drop(c);
    assert!(!mapped(cq_ring), "a destroyed CQ's ring is unmapped");

    // The kernel refuses: the memory stays.
    surface.fail.store(true, Ordering::Relaxed);
    let q = qp();
    let ring = last_buf();
    drop(q);
    assert!(
        mapped(ring),
        "DESTROY_QP failed: the device may still use the ring"
    );
    let s = Srq::new(&pd, 16, 1).unwrap();
    let srq_ring = last_buf();
    drop(s);
    assert!(
        mapped(srq_ring),
        "DESTROY_SRQ failed: the device may still use the ring"
    );
    let buf = Arc::new(DmaBuf::new(1 << 16).unwrap());
    let addr = buf.addr();
    let mr = pd.reg_mr(&buf, Access::LOCAL_WRITE).unwrap();
    drop(buf);
    drop(mr);
    assert!(
        mapped(addr),
        "DEREG_MR failed: the region may still be written"
    );
    let c = Cq::new(&ctx, CqInit::default(), None).unwrap();
    let cq_ring = last_buf();
    drop(c);
    assert!(
        mapped(cq_ring),
        "DESTROY_CQ failed: the device may still write CQEs"
    );

    // The zombie QP and SRQ keep the CQ and PD busy in the kernel: do not destroy them (a
    // busy destroy is a driver bug the debug build asserts on).
    std::mem::forget((cq, pd, ctx));
}
