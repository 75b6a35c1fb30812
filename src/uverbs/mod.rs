//! The kernel boundary: building ib_uverbs `write()` commands and `RDMA_VERBS_IOCTL` method
//! calls, sending them through a [`UverbsSurface`], and reading the answers back.
//!
//! Responses travel as with the real kernel: the command carries the user address of a response
//! buffer ([`RespBuf`]) and the kernel writes through it. Every command has exactly one call
//! site here ([`write_cmd`], [`Ioctl::execute`]), which turns the errno into an [`Error`] naming
//! the command.
#![allow(unsafe_code)]

use mlx5_ffi::ioctl::{IbUverbsAttr, IbUverbsIoctlHdr, UVERBS_ATTR_F_MANDATORY};
use mlx5_ffi::surface::UverbsSurface;
use mlx5_ffi::uverbs::IbUverbsCmdHdr;
use zerocopy::{FromBytes, IntoBytes};

use crate::error::{Error, Result};

/// A response buffer the kernel writes into through the address embedded in a command.
/// 8-byte aligned; zero-filled before each use.
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
    pub(crate) fn addr(&mut self) -> u64 {
        self.words.as_mut_ptr() as u64
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn bytes(&self) -> &[u8] {
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

/// Send one legacy `write()` command: header, `core` (whose `response` field the caller has set
/// to `resp.addr()` if the command has a response), then `driver` data. The response length is
/// `resp.len()` (core response followed by driver response).
pub(crate) fn write_cmd(
    surface: &dyn UverbsSurface,
    name: &'static str,
    command: u32,
    core: &[u8],
    driver: &[u8],
    resp: Option<&mut RespBuf>,
) -> Result<()> {
    let total = size_of::<IbUverbsCmdHdr>() + core.len() + driver.len();
    let out_len = resp.as_ref().map_or(0, |r| r.len());
    if total % 4 != 0 || total / 4 > usize::from(u16::MAX) || out_len % 4 != 0 {
        return Err(Error::InvalidArgument {
            attr: "command size",
            reason: "not a multiple of 4 bytes",
        });
    }
    let hdr = IbUverbsCmdHdr {
        command,
        in_words: (total / 4) as u16,
        out_words: (out_len / 4) as u16,
    };
    let mut buf = Vec::with_capacity(total);
    buf.extend_from_slice(hdr.as_bytes());
    buf.extend_from_slice(core);
    buf.extend_from_slice(driver);
    // The kernel writes the response through the address in `core`; `resp` stays borrowed
    // mutably across the call so nothing else reads it meanwhile.
    let r = surface.write(&buf);
    let _ = resp;
    match r {
        Ok(n) if n == total => Ok(()),
        Ok(_) => Err(Error::BadResponse {
            cmd: name,
            what: "short write",
        }),
        Err(e) => Err(Error::uverbs(name, e.0)),
    }
}

/// One `RDMA_VERBS_IOCTL` method call being built.
#[derive(Debug)]
pub(crate) struct Ioctl {
    object: u16,
    method: u16,
    attrs: Vec<IbUverbsAttr>,
}

impl Ioctl {
    pub(crate) fn new(object: u16, method: u16) -> Self {
        Self {
            object,
            method,
            attrs: Vec::new(),
        }
    }

    /// Append one mandatory attribute.
    fn push(&mut self, attr_id: u16, len: u16, data: u64) -> usize {
        self.attrs.push(IbUverbsAttr {
            attr_id,
            len,
            flags: UVERBS_ATTR_F_MANDATORY,
            elem_id: 0,
            elem_reserved: 0,
            data,
        });
        self.attrs.len() - 1
    }

    /// An input attribute of up to 8 bytes, inlined in `data`.
    pub(crate) fn inline_in(&mut self, id: u16, value: &[u8]) -> &mut Self {
        let mut d = [0u8; 8];
        let n = value.len().min(8);
        d[..n].copy_from_slice(&value[..n]);
        self.push(id, n as u16, u64::from_ne_bytes(d));
        self
    }

    /// An object handle the kernel creates (IDR "new"): returned in the attribute's data.
    pub(crate) fn idr_new(&mut self, id: u16) -> usize {
        self.push(id, 0, 0)
    }

    /// An existing object handle (IDR in).
    pub(crate) fn idr_in(&mut self, id: u16, handle: u32) -> &mut Self {
        self.push(id, 0, u64::from(handle));
        self
    }

    /// An output attribute written through a pointer into `resp`.
    pub(crate) fn ptr_out(&mut self, id: u16, resp: &mut RespBuf) -> &mut Self {
        let len = resp.len() as u16;
        self.push(id, len, resp.addr());
        self
    }

    /// Execute; on success returns the attributes as the kernel left them (IDR "new" handles in
    /// `data`).
    pub(crate) fn execute(
        &self,
        surface: &dyn UverbsSurface,
        name: &'static str,
    ) -> Result<Vec<IbUverbsAttr>> {
        let hdr_len = size_of::<IbUverbsIoctlHdr>();
        let len = hdr_len + self.attrs.len() * size_of::<IbUverbsAttr>();
        let hdr = IbUverbsIoctlHdr {
            length: len as u16,
            object_id: self.object,
            method_id: self.method,
            num_attrs: self.attrs.len() as u16,
            reserved1: 0,
            driver_id: 1, // RDMA_DRIVER_MLX5
            reserved2: 0,
        };
        let mut buf = Vec::with_capacity(len);
        buf.extend_from_slice(hdr.as_bytes());
        for a in &self.attrs {
            buf.extend_from_slice(a.as_bytes());
        }
        surface
            .ioctl(&mut buf)
            .map_err(|e| Error::uverbs(name, e.0))?;
        let attrs = buf[hdr_len..]
            .chunks_exact(size_of::<IbUverbsAttr>())
            .filter_map(|c| IbUverbsAttr::read_from_bytes(c).ok())
            .collect();
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
