//! Objects of one context: every object handed to another (PD, CQs, SRQ, completion channel)
//! must come from the same device context, checked before any syscall.
//!
//! The finding (issue 10): `Qp::new` with the PD of context A and the CQs of context B returned
//! `Ok`; the kernel resolved B's CQ handle number in A's table while the driver's bookkeeping used
//! B's CQ, so completions went to the wrong ring. An SRQ of another context was accepted the same
//! way.

use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use mlx5::ffi::surface::{Errno, UverbsSurface};
use mlx5::{
    Ah, AhAttr, Context, Cq, CqInit, Error, Mtu, Pd, PostError, Qp, QpInitAttr, QpType, RemoteQp,
    SendFlags, SendWr, Srq, UdDest,
};
use mlx5_emu::{EmuConfig, Emulator, RunMode};

/// A surface that forwards to the emulator and counts the commands (write and ioctl) it saw,
/// to show that a refusal happened before any syscall.
#[derive(Debug)]
struct Counting {
    inner: Arc<dyn UverbsSurface>,
    commands: AtomicUsize,
}

// SAFETY: every operation forwards to `inner`, an honest surface (the emulator), unchanged.
unsafe impl UverbsSurface for Counting {
    unsafe fn write(&self, cmd: &[u8]) -> Result<usize, Errno> {
        self.commands.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract for `cmd` is passed on unchanged.
        unsafe { self.inner.write(cmd) }
    }
    unsafe fn ioctl(&self, buf: &mut [u8]) -> Result<(), Errno> {
        self.commands.fetch_add(1, Ordering::Relaxed);
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

fn emu(num_hcas: usize) -> Emulator {
    Emulator::new(EmuConfig {
        num_hcas,
        mode: RunMode::Stepped,
        ..EmuConfig::default()
    })
}

fn open(emu: &Emulator, hca: usize) -> Context {
    Context::open(emu.open(hca).expect("emulator open")).expect("Context::open")
}

/// The error must name both objects.
fn assert_mismatch<T: std::fmt::Debug>(r: Result<T, Error>, object: &str, with: &str) {
    match r {
        Err(Error::ContextMismatch { object: o, with: w }) => {
            assert_eq!((o, w), (object, with), "names of the mismatched objects");
            let msg = Error::ContextMismatch { object: o, with: w }.to_string();
            assert!(msg.contains(object) && msg.contains(with), "{msg}");
        }
        other => panic!("expected ContextMismatch {{ {object}, {with} }}, got {other:?}"),
    }
}

fn cq(ctx: &Context) -> Cq {
    Cq::new(ctx, CqInit::default(), None).expect("Cq::new")
}

// The emulated kernel numbers the objects of each context from 0 (as the kernel's per-file
// IDR does), so objects created in the same order in two contexts get the same handle numbers:
// a foreign handle then names a live object of the right type in the wrong table, which is how
// the finding showed up. The tests below create their objects in mirrored order for that reason.

#[test]
fn qp_with_cqs_of_another_context_is_refused() {
    let e = emu(1);
    let (a, b) = (open(&e, 0), open(&e, 0));
    let (pd_a, _pd_b) = (Pd::new(&a).unwrap(), Pd::new(&b).unwrap());
    let (cq_a, cq_b) = (cq(&a), cq(&b));
    for t in [QpType::Rc, QpType::Uc, QpType::Ud] {
        assert_mismatch(
            Qp::new(&pd_a, &QpInitAttr::new(t, &cq_b, &cq_b)),
            "send_cq",
            "pd",
        );
        assert_mismatch(
            Qp::new(&pd_a, &QpInitAttr::new(t, &cq_a, &cq_b)),
            "recv_cq",
            "pd",
        );
        assert_mismatch(
            Qp::new(&pd_a, &QpInitAttr::new(t, &cq_b, &cq_a)),
            "send_cq",
            "pd",
        );
        // The same context still works, and the refusals left nothing behind.
        Qp::new(&pd_a, &QpInitAttr::new(t, &cq_a, &cq_a)).expect("same-context QP");
    }
}

#[test]
fn qp_with_objects_of_another_device_is_refused() {
    let e = emu(2);
    let (a, b) = (open(&e, 0), open(&e, 1));
    let (pd_a, _pd_b) = (Pd::new(&a).unwrap(), Pd::new(&b).unwrap());
    let (_cq_a, cq_b) = (cq(&a), cq(&b));
    assert_mismatch(
        Qp::new(&pd_a, &QpInitAttr::new(QpType::Rc, &cq_b, &cq_b)),
        "send_cq",
        "pd",
    );
}

#[test]
fn qp_with_srq_of_another_context_is_refused() {
    let e = emu(1);
    let (a, b) = (open(&e, 0), open(&e, 0));
    let (pd_a, pd_b) = (Pd::new(&a).unwrap(), Pd::new(&b).unwrap());
    let (cq_a, _cq_b) = (cq(&a), cq(&b));
    let srq_a = Srq::new(&pd_a, 16, 1).unwrap();
    let srq_b = Srq::new(&pd_b, 16, 1).unwrap();
    for t in [QpType::Rc, QpType::Uc, QpType::Ud] {
        let mut init = QpInitAttr::new(t, &cq_a, &cq_a);
        init.srq = Some(&srq_b);
        assert_mismatch(Qp::new(&pd_a, &init), "srq", "pd");
        init.srq = Some(&srq_a);
        Qp::new(&pd_a, &init).expect("same-context SRQ");
    }
    // An SRQ of another PD of the same context is allowed (verbs allows it).
    let pd_a2 = Pd::new(&a).unwrap();
    let mut init = QpInitAttr::new(QpType::Rc, &cq_a, &cq_a);
    init.srq = Some(&srq_a);
    Qp::new(&pd_a2, &init).expect("SRQ of another PD, same context");
}

#[test]
fn cq_with_channel_of_another_context_is_refused() {
    let e = emu(1);
    let (a, b) = (open(&e, 0), open(&e, 0));
    let ch_a = Arc::new(a.create_comp_channel().unwrap());
    let ch_b = Arc::new(b.create_comp_channel().unwrap());
    assert_mismatch(
        Cq::new(&a, CqInit::default(), Some(&ch_b)),
        "comp_channel",
        "context",
    );
    Cq::new(&a, CqInit::default(), Some(&ch_a)).expect("same-context channel");
}

/// The refusals are made before any command reaches the kernel.
#[test]
fn mismatch_is_refused_before_any_syscall() {
    let e = emu(1);
    let counting = Arc::new(Counting {
        inner: e.open(0).unwrap(),
        commands: AtomicUsize::new(0),
    });
    let a = Context::open(counting.clone()).unwrap();
    let b = open(&e, 0);
    let (pd_a, pd_b) = (Pd::new(&a).unwrap(), Pd::new(&b).unwrap());
    let (cq_a, cq_b) = (cq(&a), cq(&b));
    let srq_b = Srq::new(&pd_b, 16, 1).unwrap();
    let ch_b = Arc::new(b.create_comp_channel().unwrap());
    let before = counting.commands.load(Ordering::Relaxed);
    assert_mismatch(
        Qp::new(&pd_a, &QpInitAttr::new(QpType::Rc, &cq_a, &cq_b)),
        "recv_cq",
        "pd",
    );
    let mut init = QpInitAttr::new(QpType::Rc, &cq_a, &cq_a);
    init.srq = Some(&srq_b);
    assert_mismatch(Qp::new(&pd_a, &init), "srq", "pd");
    assert_mismatch(
        Cq::new(&a, CqInit::default(), Some(&ch_b)),
        "comp_channel",
        "context",
    );
    assert_eq!(counting.commands.load(Ordering::Relaxed), before);
    // A good call is counted, so the counter does see commands.
    let _qp = Qp::new(&pd_a, &QpInitAttr::new(QpType::Rc, &cq_a, &cq_a)).unwrap();
    assert!(counting.commands.load(Ordering::Relaxed) > before);
}

#[test]
fn context_identity() {
    let e = emu(1);
    let (a, b) = (open(&e, 0), open(&e, 0));
    assert!(a.same_as(&a.clone()));
    assert!(!a.same_as(&b));
    let pd = Pd::new(&a).unwrap();
    assert!(pd.context().same_as(&a));
}

/// A UD send whose address handle belongs to another context is refused before the WQE is
/// written (the AH's address vector names the other context's port and GID table). On the old
/// code it was posted.
#[test]
fn ud_send_with_ah_of_another_context_is_refused() {
    let e = emu(1);
    let (a, b) = (open(&e, 0), open(&e, 0));
    let (pd_a, pd_b) = (Pd::new(&a).unwrap(), Pd::new(&b).unwrap());
    let cq_a = cq(&a);
    let mut qp = Qp::new(&pd_a, &QpInitAttr::new(QpType::Ud, &cq_a, &cq_a)).unwrap();
    qp.to_init_ud(1, 0x1111).unwrap();
    let me = RemoteQp {
        qpn: qp.qpn(),
        psn: 0,
        lid: a.query_port(1).unwrap().lid,
        gid: None,
    };
    qp.to_rtr(&me, Mtu::M1024, 0).unwrap();
    qp.to_rts(0, 7).unwrap();
    let attr = AhAttr {
        dlid: me.lid,
        port_num: 1,
        ..AhAttr::default()
    };
    let (ah_a, ah_b) = (Ah::new(&pd_a, attr).unwrap(), Ah::new(&pd_b, attr).unwrap());
    assert!(ah_b.context().same_as(&b) && ah_a.context().same_as(&a));
    let qp_num = qp.qpn();
    let to = |ah| UdDest {
        ah,
        remote_qpn: qp_num,
        remote_qkey: 0x1111,
    };
    let payload: &[u8] = &[7u8; 8];
    let data = [payload];
    let wr = |ah| SendWr::send_inline(1, &data, SendFlags::SIGNALED).to(to(ah));
    let before = qp.sq_ref().producer();
    assert_eq!(
        qp.post_send(&[wr(&ah_b)]).unwrap_err(),
        (0, PostError::ForeignAh)
    );
    assert_eq!(qp.sq_ref().producer(), before, "nothing was written");
    // The low-level UD start checks the same.
    assert_eq!(
        qp.sq().send_ud(SendFlags::SIGNALED, &to(&ah_b), None).err(),
        Some(PostError::ForeignAh)
    );
    assert_eq!(qp.sq_ref().producer(), before, "nothing was written");
    // The same WR with the AH of its own context is posted.
    qp.post_send(&[wr(&ah_a)]).unwrap();
    assert_ne!(qp.sq_ref().producer(), before);
}
