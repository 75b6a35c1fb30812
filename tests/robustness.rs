//! The driver does not panic on kernel answers it did not expect: every command's response
//! (from the emulator) is randomly mutated before the driver reads it (except the first 4
//! bytes, which hold the object handle or file descriptor the test must not corrupt), and the
//! driver has to either fail with an `Error` or carry on.

mod common;

use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use mlx5::ffi::surface::{Errno, UverbsSurface};
use mlx5::ffi::uverbs::IbUverbsCmdHdr;
use mlx5::{
    Context, Cq, CqInit, Pd, Qp, QpInitAttr, QpType, RemoteQp, SendFlags, SendWr, WorkCompletion,
};
use mlx5_emu::{EmuConfig, Emulator, RunMode};
use zerocopy::FromBytes;

#[derive(Debug)]
struct Mutating {
    inner: Arc<dyn UverbsSurface>,
    rng: Mutex<u64>,
}

impl Mutating {
    fn next(&self) -> u64 {
        let mut s = self.rng.lock().unwrap();
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        *s
    }
}

// SAFETY: a proxy: mmap/munmap are the inner surface's; `write` only additionally changes
// bytes inside the response buffer the command names (its declared length), after the inner
// surface wrote it.
unsafe impl UverbsSurface for Mutating {
    unsafe fn write(&self, cmd: &[u8]) -> Result<usize, Errno> {
        // SAFETY: forwarded unchanged; the caller's guarantee for `cmd` is the same.
        let n = unsafe { self.inner.write(cmd) }?;
        let hdr = IbUverbsCmdHdr::read_from_prefix(cmd).map(|(h, _)| h).ok();
        let out = hdr.map_or(0, |h| usize::from(h.out_words) * 4);
        if out > 4 && cmd.len() >= 16 && self.next() % 2 == 0 {
            let resp = u64::from_ne_bytes(cmd[8..16].try_into().unwrap()) as usize as *mut u8;
            for _ in 0..1 + self.next() % 4 {
                let off = 4 + (self.next() as usize) % (out - 4);
                let val = self.next() as u8;
                // `off < out`: inside the response buffer the driver passed in this command.
                let p = resp.wrapping_add(off);
                // SAFETY: `p` is inside the response buffer (`resp .. resp + out`) that the driver
                // passed in this command and the emulator just wrote; nothing else uses it now.
                unsafe { p.write(val) };
            }
        }
        Ok(n)
    }
    unsafe fn ioctl(&self, buf: &mut [u8]) -> Result<(), Errno> {
        // SAFETY: forwarded unchanged; the caller's guarantee for `buf` is the same.
        unsafe { self.inner.ioctl(buf) }
    }
    fn mmap(&self, len: usize, prot: i32, offset: u64) -> Result<NonNull<u8>, Errno> {
        self.inner.mmap(len, prot, offset)
    }
    unsafe fn munmap(&self, addr: NonNull<u8>, len: usize) -> Result<(), Errno> {
        // SAFETY: forwarded unchanged; the caller's guarantee is the same.
        unsafe { self.inner.munmap(addr, len) }
    }
    fn describe(&self) -> String {
        "mutating proxy".into()
    }
}

fn attempt(emu: &Emulator, seed: u64) -> Result<usize, mlx5::Error> {
    let s: Arc<dyn UverbsSurface> = Arc::new(Mutating {
        inner: emu.open(0).unwrap(),
        rng: Mutex::new(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1),
    });
    let ctx = Context::open(s)?;
    let pd = Pd::new(&ctx)?;
    let mut cq = Cq::new(&ctx, CqInit::default(), None)?;
    let mut qp = Qp::new(&pd, &QpInitAttr::new(QpType::Rc, &cq, &cq))?;
    let buf = Arc::new(mlx5::DmaBuf::new(4096)?);
    let mr = pd.reg_mr(&buf, mlx5::Access::ALL)?;
    let lid = ctx.query_port(1)?.lid;
    qp.to_init(1, mlx5::Access::ALL)?;
    qp.to_rtr(
        &RemoteQp {
            qpn: qp.qpn(),
            psn: 0,
            lid,
            gid: None,
        },
        3,
        0,
    )?;
    qp.to_rts(0, 7)?;
    let sge = [mr.sge(0, 8)];
    let op = mlx5::WrOp::Write {
        raddr: mr.addr() + 64,
        rkey: mr.rkey(),
    };
    let _ = qp.post_send(&[SendWr::new(1, op, &sge, SendFlags::SIGNALED)]);
    let mut wcs = [WorkCompletion::default(); 4];
    let mut got = 0;
    for _ in 0..200 {
        emu.step();
        got += cq.poll(&mut wcs);
    }
    let _ = qp.query_attr();
    let _ = ctx.query_gid(1, 0);
    Ok(got)
}

#[test]
fn mutated_kernel_answers_never_panic_the_driver() {
    let emu = Emulator::new(EmuConfig {
        num_hcas: 1,
        mode: RunMode::Stepped,
        ..EmuConfig::default()
    });
    let (mut ok, mut completed, mut errors) =
        (0, 0, std::collections::BTreeMap::<String, u32>::new());
    for seed in 0..300 {
        match attempt(&emu, seed) {
            Ok(n) => {
                ok += 1;
                completed += usize::from(n > 0);
            }
            Err(e) => {
                let key = e.to_string().split(':').next().unwrap_or("").to_string();
                *errors.entry(key).or_default() += 1;
            }
        }
    }
    eprintln!("300 runs: {ok} set up fully ({completed} saw a completion); errors: {errors:?}");
    assert!(
        ok > 0 && !errors.is_empty(),
        "the mutations must both pass and fail sometimes"
    );
}
