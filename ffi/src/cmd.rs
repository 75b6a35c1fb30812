//! Building and parsing `write()` command buffers of the uverbs ABI (pure functions on
//! byte slices, used by the driver to send and by the emulator to receive).
//!
//! Legacy command: `IbUverbsCmdHdr { command, in_words, out_words }` + core request + driver
//! data. `in_words` counts the whole buffer (header included) in 4-byte words, `out_words`
//! the whole response (core + driver) in 4-byte words. The response pointer is the first
//! `u64` of the core request (commands without a response, e.g. MODIFY_QP, have none).
//!
//! Extended command: `command | IB_USER_VERBS_CMD_FLAG_EXTENDED`, then `IbUverbsExCmdHdr
//! { response, provider_in_words, provider_out_words, 0 }`, then core request, then driver
//! data; `in_words`/`out_words` count only the core request/response in 8-byte words and
//! `provider_*_words` the driver parts in 8-byte words.

use zerocopy::{FromBytes, Immutable, IntoBytes};

use crate::surface::Errno;
use crate::uverbs::*;

const HDR: usize = size_of::<IbUverbsCmdHdr>();
const EX_HDR: usize = size_of::<IbUverbsExCmdHdr>();

/// Length in `unit`-byte words as a `u16`, or `EINVAL` if not a multiple or too large.
fn words(len: usize, unit: usize) -> Result<u16, Errno> {
    if len % unit != 0 {
        return Err(Errno::EINVAL);
    }
    u16::try_from(len / unit).map_err(|_| Errno::EINVAL)
}

/// Builds a legacy write command: header + `core` + `driver`, expecting `out_len` bytes of
/// response (core + driver) at the pointer the caller stored at the start of `core`.
///
/// Fails with `EINVAL` if a length is not a multiple of 4 or does not fit the header.
pub fn build_write(
    command: u32,
    core: &[u8],
    driver: &[u8],
    out_len: usize,
) -> Result<Vec<u8>, Errno> {
    let total = HDR + core.len() + driver.len();
    let hdr = IbUverbsCmdHdr {
        command,
        in_words: words(total, 4)?,
        out_words: words(out_len, 4)?,
    };
    let mut buf = Vec::with_capacity(total);
    buf.extend_from_slice(hdr.as_bytes());
    buf.extend_from_slice(core);
    buf.extend_from_slice(driver);
    Ok(buf)
}

/// Builds an extended write command. `response` points to `core_out_len + driver_out_len`
/// bytes (core response first). All four lengths must be multiples of 8.
pub fn build_write_ex(
    command: u32,
    response: u64,
    core: &[u8],
    core_out_len: usize,
    driver: &[u8],
    driver_out_len: usize,
) -> Result<Vec<u8>, Errno> {
    let hdr = IbUverbsCmdHdr {
        command: command | IB_USER_VERBS_CMD_FLAG_EXTENDED,
        in_words: words(core.len(), 8)?,
        out_words: words(core_out_len, 8)?,
    };
    let ex = IbUverbsExCmdHdr {
        response,
        provider_in_words: words(driver.len(), 8)?,
        provider_out_words: words(driver_out_len, 8)?,
        cmd_hdr_reserved: 0,
    };
    let mut buf = Vec::with_capacity(HDR + EX_HDR + core.len() + driver.len());
    buf.extend_from_slice(hdr.as_bytes());
    buf.extend_from_slice(ex.as_bytes());
    buf.extend_from_slice(core);
    buf.extend_from_slice(driver);
    Ok(buf)
}

/// A parsed write command (borrowing the command buffer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteCmd<'a> {
    /// Command number, `IB_USER_VERBS_CMD_*` (extended flag removed).
    pub command: u32,
    /// Whether the extended header was present.
    pub extended: bool,
    /// Response pointer: `IbUverbsExCmdHdr::response`, or for legacy commands the first
    /// `u64` of the payload (0 if the payload is shorter than 8 bytes).
    pub response: u64,
    /// Core request. Legacy commands: the whole payload until [`WriteCmd::split_legacy`].
    pub core_in: &'a [u8],
    /// Driver request (empty for legacy commands until split).
    pub driver_in: &'a [u8],
    /// Core response length. Legacy: the whole response until split.
    pub core_out_len: usize,
    /// Driver response length.
    pub driver_out_len: usize,
}

/// Parses and validates a write command buffer as the kernel does.
///
/// `EINVAL` for a short buffer, a word count that disagrees with the buffer length, a
/// non-zero `cmd_hdr_reserved`, or an extended response pointer inconsistent with the
/// response lengths.
pub fn parse_write(buf: &[u8]) -> Result<WriteCmd<'_>, Errno> {
    let (hdr, rest) = IbUverbsCmdHdr::read_from_prefix(buf).map_err(|_| Errno::EINVAL)?;
    let command = hdr.command & IB_USER_VERBS_CMD_COMMAND_MASK;
    if hdr.command & !(IB_USER_VERBS_CMD_COMMAND_MASK | IB_USER_VERBS_CMD_FLAG_EXTENDED) != 0 {
        return Err(Errno::EINVAL);
    }
    if hdr.command & IB_USER_VERBS_CMD_FLAG_EXTENDED == 0 {
        if usize::from(hdr.in_words) * 4 != buf.len() {
            return Err(Errno::EINVAL);
        }
        let response = u64::read_from_prefix(rest).map(|(r, _)| r).unwrap_or(0);
        return Ok(WriteCmd {
            command,
            extended: false,
            response,
            core_in: rest,
            driver_in: &[],
            core_out_len: usize::from(hdr.out_words) * 4,
            driver_out_len: 0,
        });
    }
    let (ex, rest) = IbUverbsExCmdHdr::read_from_prefix(rest).map_err(|_| Errno::EINVAL)?;
    let core_len = usize::from(hdr.in_words) * 8;
    let driver_len = usize::from(ex.provider_in_words) * 8;
    if core_len + driver_len != rest.len() || ex.cmd_hdr_reserved != 0 {
        return Err(Errno::EINVAL);
    }
    let core_out_len = usize::from(hdr.out_words) * 8;
    let driver_out_len = usize::from(ex.provider_out_words) * 8;
    let has_out = core_out_len + driver_out_len != 0;
    if (ex.response != 0) != has_out {
        return Err(Errno::EINVAL);
    }
    let (core_in, driver_in) = rest.split_at(core_len);
    Ok(WriteCmd {
        command,
        extended: true,
        response: ex.response,
        core_in,
        driver_in,
        core_out_len,
        driver_out_len,
    })
}

impl<'a> WriteCmd<'a> {
    /// Splits a legacy command's payload and response into core and driver parts, given the
    /// core request and response sizes of this command. `ENOSPC` if the payload or response
    /// is shorter than the core part (what the kernel answers). Extended commands are
    /// returned unchanged.
    pub fn split_legacy(
        self,
        core_in_len: usize,
        core_out_len: usize,
    ) -> Result<WriteCmd<'a>, Errno> {
        if self.extended {
            return Ok(self);
        }
        if self.core_in.len() < core_in_len || self.core_out_len < core_out_len {
            return Err(Errno::ENOSPC);
        }
        let (core_in, driver_in) = self.core_in.split_at(core_in_len);
        Ok(WriteCmd {
            core_in,
            driver_in,
            core_out_len,
            driver_out_len: self.core_out_len - core_out_len,
            ..self
        })
    }
}

/// Reads a `T` from the start of `bytes` the way the kernel copies a request of possibly
/// different length: missing trailing bytes read as zero, extra bytes are ignored.
pub fn read_prefix_zero_fill<T: FromBytes + IntoBytes + Immutable>(bytes: &[u8]) -> T {
    let mut value = T::new_zeroed();
    let dst = value.as_mut_bytes();
    let n = dst.len().min(bytes.len());
    dst[..n].copy_from_slice(&bytes[..n]);
    value
}

/// True if every byte of `bytes` past `len` is zero (the kernel's check for newer user space
/// sending a longer request than it knows).
pub fn tail_is_zero(bytes: &[u8], len: usize) -> bool {
    bytes
        .get(len..)
        .is_none_or(|tail| tail.iter().all(|&b| b == 0))
}

/// Core request/response sizes of one write command (the struct sizes of the kernel ABI).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoreSizes {
    /// Size of the core request struct (after the header(s)).
    pub req: usize,
    /// Size of the core response struct (0 if the command has no response).
    pub resp: usize,
    /// Whether a legacy request starts with a `response` user pointer.
    pub has_response_ptr: bool,
}

const fn sizes(req: usize, resp: usize, has_response_ptr: bool) -> Option<CoreSizes> {
    Some(CoreSizes {
        req,
        resp,
        has_response_ptr,
    })
}

/// Core sizes of the write commands this project uses (`None` for the others).
///
/// `extended` selects the `IB_USER_VERBS_EX_CMD_*` variant of the same number.
pub const fn core_sizes(command: u32, extended: bool) -> Option<CoreSizes> {
    if extended {
        return match command {
            IB_USER_VERBS_EX_CMD_QUERY_DEVICE => sizes(
                size_of::<IbUverbsExQueryDevice>(),
                size_of::<IbUverbsExQueryDeviceResp>(),
                false,
            ),
            IB_USER_VERBS_EX_CMD_CREATE_CQ => sizes(
                size_of::<IbUverbsExCreateCq>(),
                size_of::<IbUverbsExCreateCqResp>(),
                false,
            ),
            IB_USER_VERBS_EX_CMD_CREATE_QP => sizes(
                size_of::<IbUverbsExCreateQp>(),
                size_of::<IbUverbsExCreateQpResp>(),
                false,
            ),
            IB_USER_VERBS_EX_CMD_MODIFY_QP => sizes(
                size_of::<IbUverbsExModifyQp>(),
                size_of::<IbUverbsExModifyQpResp>(),
                false,
            ),
            _ => None,
        };
    }
    match command {
        IB_USER_VERBS_CMD_GET_CONTEXT => sizes(
            size_of::<IbUverbsGetContext>(),
            size_of::<IbUverbsGetContextResp>(),
            true,
        ),
        IB_USER_VERBS_CMD_QUERY_DEVICE => sizes(
            size_of::<IbUverbsQueryDevice>(),
            size_of::<IbUverbsQueryDeviceResp>(),
            true,
        ),
        IB_USER_VERBS_CMD_QUERY_PORT => sizes(
            size_of::<IbUverbsQueryPort>(),
            size_of::<IbUverbsQueryPortResp>(),
            true,
        ),
        IB_USER_VERBS_CMD_ALLOC_PD => sizes(
            size_of::<IbUverbsAllocPd>(),
            size_of::<IbUverbsAllocPdResp>(),
            true,
        ),
        IB_USER_VERBS_CMD_DEALLOC_PD => sizes(size_of::<IbUverbsDeallocPd>(), 0, false),
        IB_USER_VERBS_CMD_CREATE_AH => sizes(
            size_of::<IbUverbsCreateAh>(),
            size_of::<IbUverbsCreateAhResp>(),
            true,
        ),
        IB_USER_VERBS_CMD_DESTROY_AH => sizes(size_of::<IbUverbsDestroyAh>(), 0, false),
        IB_USER_VERBS_CMD_REG_MR => sizes(
            size_of::<IbUverbsRegMr>(),
            size_of::<IbUverbsRegMrResp>(),
            true,
        ),
        IB_USER_VERBS_CMD_DEREG_MR => sizes(size_of::<IbUverbsDeregMr>(), 0, false),
        IB_USER_VERBS_CMD_CREATE_COMP_CHANNEL => sizes(
            size_of::<IbUverbsCreateCompChannel>(),
            size_of::<IbUverbsCreateCompChannelResp>(),
            true,
        ),
        IB_USER_VERBS_CMD_CREATE_CQ => sizes(
            size_of::<IbUverbsCreateCq>(),
            size_of::<IbUverbsCreateCqResp>(),
            true,
        ),
        IB_USER_VERBS_CMD_DESTROY_CQ => sizes(
            size_of::<IbUverbsDestroyCq>(),
            size_of::<IbUverbsDestroyCqResp>(),
            true,
        ),
        IB_USER_VERBS_CMD_CREATE_QP => sizes(
            size_of::<IbUverbsCreateQp>(),
            size_of::<IbUverbsCreateQpResp>(),
            true,
        ),
        IB_USER_VERBS_CMD_QUERY_QP => sizes(
            size_of::<IbUverbsQueryQp>(),
            size_of::<IbUverbsQueryQpResp>(),
            true,
        ),
        IB_USER_VERBS_CMD_MODIFY_QP => sizes(size_of::<IbUverbsModifyQp>(), 0, false),
        IB_USER_VERBS_CMD_DESTROY_QP => sizes(
            size_of::<IbUverbsDestroyQp>(),
            size_of::<IbUverbsDestroyQpResp>(),
            true,
        ),
        IB_USER_VERBS_CMD_CREATE_SRQ => sizes(
            size_of::<IbUverbsCreateSrq>(),
            size_of::<IbUverbsCreateSrqResp>(),
            true,
        ),
        IB_USER_VERBS_CMD_MODIFY_SRQ => sizes(size_of::<IbUverbsModifySrq>(), 0, false),
        IB_USER_VERBS_CMD_QUERY_SRQ => sizes(
            size_of::<IbUverbsQuerySrq>(),
            size_of::<IbUverbsQuerySrqResp>(),
            true,
        ),
        IB_USER_VERBS_CMD_DESTROY_SRQ => sizes(
            size_of::<IbUverbsDestroySrq>(),
            size_of::<IbUverbsDestroySrqResp>(),
            true,
        ),
        IB_USER_VERBS_CMD_CREATE_XSRQ => sizes(
            size_of::<IbUverbsCreateXsrq>(),
            size_of::<IbUverbsCreateSrqResp>(),
            true,
        ),
        _ => None,
    }
}

impl<'a> WriteCmd<'a> {
    /// Splits core and driver parts using [`core_sizes`] (legacy commands) and clears
    /// `response` for legacy commands that carry no response pointer. `EOPNOTSUPP` for a
    /// command not in the table; errors of [`WriteCmd::split_legacy`] otherwise. Extended
    /// commands are returned unchanged.
    pub fn split(self) -> Result<WriteCmd<'a>, Errno> {
        if self.extended {
            return Ok(self);
        }
        let sizes = core_sizes(self.command, false).ok_or(Errno::EOPNOTSUPP)?;
        let mut cmd = self.split_legacy(sizes.req, sizes.resp)?;
        if !sizes.has_response_ptr {
            cmd.response = 0;
        }
        Ok(cmd)
    }
}
