//! The kernel boundary: building ib_uverbs `write()` commands and `RDMA_VERBS_IOCTL` method
//! calls, sending them through a [`UverbsSurface`], and reading the answers back.
//!
//! Responses travel as with the real kernel: the command carries the user address of a response
//! buffer ([`RespBuf`]) and the kernel writes through it. Every command has exactly one call
//! site here ([`write`] for the typed write commands of `mlx5_ffi::cmd::cmds`,
//! [`Ioctl::execute`] for method calls), which turns the errno into an [`Error`] naming the
//! command. This is where the `unsafe` contract of `UverbsSurface::write`/`ioctl` (every
//! embedded pointer valid and unaliased for the declared length) is proven, once; see the
//! SAFETY comments and docs/safety.md, "The kernel boundary".
#![allow(unsafe_code)]

use std::marker::PhantomData;

use mlx5_ffi::cmd::{Command, decode_resp, encode_write, resp_len};
use mlx5_ffi::ioctl::{IbUverbsAttr, IoctlBuilder, parse_ioctl};
use mlx5_ffi::surface::UverbsSurface;
use zerocopy::{FromBytes, IntoBytes};

use crate::error::{Error, Result};

pub(crate) mod ucma;

/// A response buffer the kernel writes into through the address embedded in a command.
/// 8-byte aligned; zero-filled before each use. Its address goes into a command only
/// inside this module ([`write`], [`Ioctl::ptr_out`]).
#[derive(Debug)]
pub(crate) struct RespBuf {
    words: Vec<u64>,
    len: usize,
}

impl RespBuf {
    /// A zeroed buffer of `len` bytes.
    pub(crate) fn new(len: usize) -> Self {
        Self {
            words: vec![0u64; len.div_ceil(8).max(1)],
            len,
        }
    }

    /// The user address to put in the command's `response` field.
    fn addr(&mut self) -> u64 {
        self.words.as_mut_ptr() as u64
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        &self.words.as_bytes()[..self.len]
    }

    /// Read a `T` at byte `offset` (zero-filled past what the kernel wrote).
    pub(crate) fn get<T: FromBytes>(&self, offset: usize) -> T {
        let b = self.bytes();
        let n = size_of::<T>();
        let mut tmp = vec![0u8; n];
        if offset < b.len() {
            let end = (offset + n).min(b.len());
            tmp[..end - offset].copy_from_slice(&b[offset..end]);
        }
        // PANIC: never; `tmp` has exactly `size_of::<T>()` bytes.
        T::read_from_bytes(&tmp).unwrap_or_else(|_| unreachable!())
    }
}

/// Send one `write()` command `C` (a marker type of [`mlx5_ffi::cmd::cmds`]) and return its
/// core and driver responses. The response buffer is allocated here and its address put
/// into the request here: callers never handle response pointers.
///
/// Driver data that names memory (queue buffers, doorbell records of CREATE_CQ/QP/SRQ)
/// must name `src/mem` memory (`DmaBuf`, doorbell pages): raw-pointer-only regions that no
/// Rust reference covers, owned by the object being created and kept alive until its
/// destroy command. Every caller in this crate does so (`cq.rs`, `qp/mod.rs`, `srq.rs`).
pub(crate) fn write<C: Command>(
    surface: &dyn UverbsSurface,
    req: &C::Req,
    drv: &C::DrvReq,
) -> Result<(C::Resp, C::DrvResp)> {
    let mut resp = RespBuf::new(resp_len::<C>());
    let buf = encode_write::<C>(req, drv, resp.addr()).map_err(|_| Error::InvalidArgument {
        attr: "command size",
        reason: "not a multiple of the command's word size",
    })?;
    // SAFETY: the only pointers in `buf` are (1) the response pointer, which `encode_write`
    // set to `resp`: a live heap buffer of `resp_len::<C>()` bytes, the exact response
    // length the header declares, exclusively owned by this function and not referenced
    // during the call; and (2) queue addresses in driver data, which name `src/mem` memory
    // never covered by a Rust reference (this function's documented precondition, kept by
    // every caller in the crate).
    let r = unsafe { surface.write(&buf) };
    match r {
        Ok(n) if n == buf.len() => Ok(decode_resp::<C>(resp.bytes())),
        Ok(_) => Err(Error::BadResponse {
            cmd: C::NAME,
            what: "short write",
        }),
        Err(e) => Err(Error::uverbs(C::NAME, e.0)),
    }
}

/// One `RDMA_VERBS_IOCTL` method call being built, encoded by `mlx5-ffi`'s
/// [`IoctlBuilder`]. Output buffers added with [`Ioctl::ptr_out`] stay mutably borrowed (`'a`)
/// until the call is dropped, so the kernel's writes through their addresses never meet a
/// live reference.
#[derive(Debug)]
pub(crate) struct Ioctl<'a> {
    b: IoctlBuilder,
    /// Attributes added so far (the index `idr_new` returns).
    n: usize,
    outs: PhantomData<&'a mut RespBuf>,
}

impl<'a> Ioctl<'a> {
    pub(crate) fn new(object: u16, method: u16) -> Self {
        Self {
            b: IoctlBuilder::new(object, method),
            n: 0,
            outs: PhantomData,
        }
    }

    /// An input attribute of up to 8 bytes, inlined in `data` (longer values are cut to 8).
    pub(crate) fn inline_in(&mut self, id: u16, value: &[u8]) -> &mut Self {
        let n = value.len().min(8);
        // `n <= 8`: `in_inline` cannot fail.
        let _ = self.b.in_inline(id, &value[..n]);
        self.n += 1;
        self
    }

    /// An object handle the kernel creates (IDR "new"): returned in the attribute's data.
    pub(crate) fn idr_new(&mut self, id: u16) -> usize {
        self.b.out_obj(id);
        self.n += 1;
        self.n - 1
    }

    /// An existing object handle (IDR in).
    pub(crate) fn idr_in(&mut self, id: u16, handle: u32) -> &mut Self {
        self.b.in_obj(id, handle);
        self.n += 1;
        self
    }

    /// An output attribute written through a pointer into `resp`.
    pub(crate) fn ptr_out(&mut self, id: u16, resp: &'a mut RespBuf) -> &mut Self {
        // A longer buffer is declared as its first 64 KiB: the kernel writes no more.
        let len = u16::try_from(resp.len()).unwrap_or(u16::MAX);
        self.b.out_ptr(id, resp.addr(), len);
        self.n += 1;
        self
    }

    /// Execute; on success returns the attributes as the kernel left them (IDR "new" handles in
    /// `data`).
    pub(crate) fn execute(
        &self,
        surface: &dyn UverbsSurface,
        name: &'static str,
    ) -> Result<Vec<IbUverbsAttr>> {
        let mut buf = self.b.build().map_err(|_| Error::InvalidArgument {
            attr: "ioctl attributes",
            reason: "more than fit one RDMA_VERBS_IOCTL header",
        })?;
        // SAFETY: the only pointer attributes are those of `ptr_out`, each the address of a
        // `RespBuf` of at least `len` bytes that `self` keeps mutably borrowed (`'a`), so it is
        // alive and unreferenced during the call; all other attributes are inline values or
        // handles, which the kernel does not dereference.
        unsafe { surface.ioctl(&mut buf) }.map_err(|e| Error::uverbs(name, e.0))?;
        let attrs = parse_ioctl(&buf)
            .map(|v| v.attrs().collect())
            .map_err(|_| Error::BadResponse {
                cmd: name,
                what: "ioctl buffer changed shape",
            })?;
        Ok(attrs)
    }
}

/// Take ownership of a file descriptor the kernel just returned in a command response
/// (async event fd, completion channel fd).
///
/// # Errors
/// [`Error::BadResponse`] if the value is not a valid descriptor number.
pub(crate) fn own_fd(cmd: &'static str, raw: u32) -> Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let fd = i32::try_from(raw).map_err(|_| Error::BadResponse {
        cmd,
        what: "fd out of range",
    })?;
    // SAFETY: fcntl(F_GETFD) only queries the descriptor table; any int is acceptable input.
    let ok = unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0;
    if !ok {
        return Err(Error::BadResponse {
            cmd,
            what: "returned fd is not open",
        });
    }
    // SAFETY: the kernel (or emulator) created this descriptor for this command and hands its
    // ownership to the caller; nothing else in the process owns or closes it.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}
