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

const fn sizes<C: Command>() -> Option<CoreSizes> {
    Some(CoreSizes {
        req: size_of::<C::Req>(),
        resp: size_of::<C::Resp>(),
        has_response_ptr: C::RESPONSE_PTR,
    })
}

/// Core sizes of the write commands this project uses (`None` for the others), from the
/// command table ([`cmds`]).
///
/// `extended` selects the `IB_USER_VERBS_EX_CMD_*` variant of the same number.
pub const fn core_sizes(command: u32, extended: bool) -> Option<CoreSizes> {
    use cmds::*;
    if extended {
        return match command {
            IB_USER_VERBS_EX_CMD_QUERY_DEVICE => sizes::<ExQueryDevice>(),
            IB_USER_VERBS_EX_CMD_CREATE_CQ => sizes::<ExCreateCq>(),
            IB_USER_VERBS_EX_CMD_CREATE_QP => sizes::<ExCreateQp>(),
            IB_USER_VERBS_EX_CMD_MODIFY_QP => sizes::<ExModifyQp>(),
            crate::flow::IB_USER_VERBS_EX_CMD_CREATE_FLOW => sizes::<crate::flow::ExCreateFlow>(),
            crate::flow::IB_USER_VERBS_EX_CMD_DESTROY_FLOW => sizes::<crate::flow::ExDestroyFlow>(),
            _ => None,
        };
    }
    match command {
        IB_USER_VERBS_CMD_GET_CONTEXT => sizes::<GetContext>(),
        IB_USER_VERBS_CMD_QUERY_DEVICE => sizes::<QueryDevice>(),
        IB_USER_VERBS_CMD_QUERY_PORT => sizes::<QueryPort>(),
        IB_USER_VERBS_CMD_ALLOC_PD => sizes::<AllocPd>(),
        IB_USER_VERBS_CMD_DEALLOC_PD => sizes::<DeallocPd>(),
        IB_USER_VERBS_CMD_CREATE_AH => sizes::<CreateAh>(),
        IB_USER_VERBS_CMD_DESTROY_AH => sizes::<DestroyAh>(),
        IB_USER_VERBS_CMD_REG_MR => sizes::<RegMr>(),
        IB_USER_VERBS_CMD_DEREG_MR => sizes::<DeregMr>(),
        IB_USER_VERBS_CMD_CREATE_COMP_CHANNEL => sizes::<CreateCompChannel>(),
        IB_USER_VERBS_CMD_CREATE_CQ => sizes::<CreateCq>(),
        IB_USER_VERBS_CMD_DESTROY_CQ => sizes::<DestroyCq>(),
        IB_USER_VERBS_CMD_CREATE_QP => sizes::<CreateQp>(),
        IB_USER_VERBS_CMD_QUERY_QP => sizes::<QueryQp>(),
        IB_USER_VERBS_CMD_MODIFY_QP => sizes::<ModifyQp>(),
        IB_USER_VERBS_CMD_DESTROY_QP => sizes::<DestroyQp>(),
        IB_USER_VERBS_CMD_CREATE_SRQ => sizes::<CreateSrq>(),
        IB_USER_VERBS_CMD_MODIFY_SRQ => sizes::<ModifySrq>(),
        IB_USER_VERBS_CMD_QUERY_SRQ => sizes::<QuerySrq>(),
        IB_USER_VERBS_CMD_DESTROY_SRQ => sizes::<DestroySrq>(),
        IB_USER_VERBS_CMD_CREATE_XSRQ => sizes::<CreateXsrq>(),
        IB_USER_VERBS_CMD_OPEN_XRCD => sizes::<OpenXrcd>(),
        IB_USER_VERBS_CMD_CLOSE_XRCD => sizes::<CloseXrcd>(),
        IB_USER_VERBS_CMD_OPEN_QP => sizes::<OpenQp>(),
        IB_USER_VERBS_CMD_ATTACH_MCAST => sizes::<crate::ucma::AttachMcast>(),
        IB_USER_VERBS_CMD_DETACH_MCAST => sizes::<crate::ucma::DetachMcast>(),
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

// ---- the typed command table (the spirit of rdma-core's DECLARE_CMD / DECLARE_DRV_CMD) -----

/// A plain kernel-ABI value: a header-checked `#[repr(C)]` mirror, or `()` for "none".
pub trait Abi:
    FromBytes + IntoBytes + Immutable + zerocopy::KnownLayout + Copy + Default + core::fmt::Debug
{
}
impl<T> Abi for T where
    T: FromBytes
        + IntoBytes
        + Immutable
        + zerocopy::KnownLayout
        + Copy
        + Default
        + core::fmt::Debug
{
}

/// One uverbs `write()` command: its number, whether it is extended, and the four structs
/// that travel with it (core request/response, mlx5 driver request/response).
///
/// Implemented by the zero-sized marker types below; the driver encodes with
/// [`encode_write`] and the emulated kernel decodes with [`WriteCmd::core`] /
/// [`WriteCmd::driver`], so both read the same structs.
pub trait Command: Copy + core::fmt::Debug + 'static {
    /// `IB_USER_VERBS_CMD_*` / `IB_USER_VERBS_EX_CMD_*` (without the extended flag).
    const ID: u32;
    /// The command's name as the kernel spells it, for errors.
    const NAME: &'static str;
    /// Extended (`IB_USER_VERBS_CMD_FLAG_EXTENDED`) framing.
    const EXTENDED: bool;
    /// Legacy command whose core request starts with the `u64 response` user pointer.
    const RESPONSE_PTR: bool;
    /// Core request (after the header(s)).
    type Req: Abi;
    /// Core response (`()` if none).
    type Resp: Abi;
    /// mlx5 driver request (`()` if none).
    type DrvReq: Abi;
    /// mlx5 driver response (`()` if none).
    type DrvResp: Abi;
}

macro_rules! declare_cmd {
    ($(#[$m:meta])* $name:ident = $id:path, $cname:literal, $ext:literal, $rp:literal,
     $req:ty => $resp:ty, drv $dreq:ty => $dresp:ty) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy)]
        pub struct $name;
        impl Command for $name {
            const ID: u32 = $id;
            const NAME: &'static str = $cname;
            const EXTENDED: bool = $ext;
            const RESPONSE_PTR: bool = $rp;
            type Req = $req;
            type Resp = $resp;
            type DrvReq = $dreq;
            type DrvResp = $dresp;
        }
    };
}

/// The command marker types (`cmd::CreateQp`, ...).
pub mod cmds {
    use super::Command;
    use crate::mlx5::*;
    use crate::uverbs::*;

    declare_cmd!(/// GET_CONTEXT
        GetContext = IB_USER_VERBS_CMD_GET_CONTEXT, "GET_CONTEXT", false, true,
        IbUverbsGetContext => IbUverbsGetContextResp,
        drv Mlx5IbAllocUcontextReqV2 => Mlx5IbAllocUcontextResp);
    declare_cmd!(/// QUERY_DEVICE
        QueryDevice = IB_USER_VERBS_CMD_QUERY_DEVICE, "QUERY_DEVICE", false, true,
        IbUverbsQueryDevice => IbUverbsQueryDeviceResp, drv () => ());
    declare_cmd!(/// QUERY_PORT
        QueryPort = IB_USER_VERBS_CMD_QUERY_PORT, "QUERY_PORT", false, true,
        IbUverbsQueryPort => IbUverbsQueryPortResp, drv () => ());
    declare_cmd!(/// ALLOC_PD
        AllocPd = IB_USER_VERBS_CMD_ALLOC_PD, "ALLOC_PD", false, true,
        IbUverbsAllocPd => IbUverbsAllocPdResp, drv () => Mlx5IbAllocPdResp);
    declare_cmd!(/// DEALLOC_PD
        DeallocPd = IB_USER_VERBS_CMD_DEALLOC_PD, "DEALLOC_PD", false, false,
        IbUverbsDeallocPd => (), drv () => ());
    declare_cmd!(/// CREATE_AH
        CreateAh = IB_USER_VERBS_CMD_CREATE_AH, "CREATE_AH", false, true,
        IbUverbsCreateAh => IbUverbsCreateAhResp, drv () => Mlx5IbCreateAhResp);
    declare_cmd!(/// DESTROY_AH
        DestroyAh = IB_USER_VERBS_CMD_DESTROY_AH, "DESTROY_AH", false, false,
        IbUverbsDestroyAh => (), drv () => ());
    declare_cmd!(/// REG_MR
        RegMr = IB_USER_VERBS_CMD_REG_MR, "REG_MR", false, true,
        IbUverbsRegMr => IbUverbsRegMrResp, drv () => ());
    declare_cmd!(/// DEREG_MR
        DeregMr = IB_USER_VERBS_CMD_DEREG_MR, "DEREG_MR", false, false,
        IbUverbsDeregMr => (), drv () => ());
    declare_cmd!(/// CREATE_COMP_CHANNEL
        CreateCompChannel = IB_USER_VERBS_CMD_CREATE_COMP_CHANNEL, "CREATE_COMP_CHANNEL",
        false, true,
        IbUverbsCreateCompChannel => IbUverbsCreateCompChannelResp, drv () => ());
    declare_cmd!(/// CREATE_CQ
        CreateCq = IB_USER_VERBS_CMD_CREATE_CQ, "CREATE_CQ", false, true,
        IbUverbsCreateCq => IbUverbsCreateCqResp, drv Mlx5IbCreateCq => Mlx5IbCreateCqResp);
    declare_cmd!(/// DESTROY_CQ
        DestroyCq = IB_USER_VERBS_CMD_DESTROY_CQ, "DESTROY_CQ", false, true,
        IbUverbsDestroyCq => IbUverbsDestroyCqResp, drv () => ());
    declare_cmd!(/// CREATE_QP
        CreateQp = IB_USER_VERBS_CMD_CREATE_QP, "CREATE_QP", false, true,
        IbUverbsCreateQp => IbUverbsCreateQpResp, drv Mlx5IbCreateQp => Mlx5IbCreateQpResp);
    declare_cmd!(/// QUERY_QP
        QueryQp = IB_USER_VERBS_CMD_QUERY_QP, "QUERY_QP", false, true,
        IbUverbsQueryQp => IbUverbsQueryQpResp, drv () => ());
    declare_cmd!(/// MODIFY_QP
        ModifyQp = IB_USER_VERBS_CMD_MODIFY_QP, "MODIFY_QP", false, false,
        IbUverbsModifyQp => (), drv () => ());
    declare_cmd!(/// DESTROY_QP
        DestroyQp = IB_USER_VERBS_CMD_DESTROY_QP, "DESTROY_QP", false, true,
        IbUverbsDestroyQp => IbUverbsDestroyQpResp, drv () => ());
    declare_cmd!(/// CREATE_SRQ
        CreateSrq = IB_USER_VERBS_CMD_CREATE_SRQ, "CREATE_SRQ", false, true,
        IbUverbsCreateSrq => IbUverbsCreateSrqResp,
        drv Mlx5IbCreateSrq => Mlx5IbCreateSrqResp);
    declare_cmd!(/// MODIFY_SRQ
        ModifySrq = IB_USER_VERBS_CMD_MODIFY_SRQ, "MODIFY_SRQ", false, false,
        IbUverbsModifySrq => (), drv () => ());
    declare_cmd!(/// QUERY_SRQ
        QuerySrq = IB_USER_VERBS_CMD_QUERY_SRQ, "QUERY_SRQ", false, true,
        IbUverbsQuerySrq => IbUverbsQuerySrqResp, drv () => ());
    declare_cmd!(/// DESTROY_SRQ
        DestroySrq = IB_USER_VERBS_CMD_DESTROY_SRQ, "DESTROY_SRQ", false, true,
        IbUverbsDestroySrq => IbUverbsDestroySrqResp, drv () => ());
    declare_cmd!(/// CREATE_XSRQ
        CreateXsrq = IB_USER_VERBS_CMD_CREATE_XSRQ, "CREATE_XSRQ", false, true,
        IbUverbsCreateXsrq => IbUverbsCreateSrqResp,
        drv Mlx5IbCreateSrq => Mlx5IbCreateSrqResp);
    declare_cmd!(/// OPEN_XRCD
        OpenXrcd = IB_USER_VERBS_CMD_OPEN_XRCD, "OPEN_XRCD", false, true,
        crate::xrc_dc::IbUverbsOpenXrcd => crate::xrc_dc::IbUverbsOpenXrcdResp, drv () => ());
    declare_cmd!(/// CLOSE_XRCD
        CloseXrcd = IB_USER_VERBS_CMD_CLOSE_XRCD, "CLOSE_XRCD", false, false,
        crate::xrc_dc::IbUverbsCloseXrcd => (), drv () => ());
    declare_cmd!(/// OPEN_QP
        OpenQp = IB_USER_VERBS_CMD_OPEN_QP, "OPEN_QP", false, true,
        crate::xrc_dc::IbUverbsOpenQp => IbUverbsCreateQpResp, drv () => ());
    declare_cmd!(/// extended QUERY_DEVICE
        ExQueryDevice = IB_USER_VERBS_EX_CMD_QUERY_DEVICE, "EX_QUERY_DEVICE", true, false,
        IbUverbsExQueryDevice => IbUverbsExQueryDeviceResp, drv () => Mlx5IbQueryDeviceResp);
    declare_cmd!(/// extended CREATE_CQ
        ExCreateCq = IB_USER_VERBS_EX_CMD_CREATE_CQ, "EX_CREATE_CQ", true, false,
        IbUverbsExCreateCq => IbUverbsExCreateCqResp, drv Mlx5IbCreateCq => Mlx5IbCreateCqResp);
    declare_cmd!(/// extended CREATE_QP
        ExCreateQp = IB_USER_VERBS_EX_CMD_CREATE_QP, "EX_CREATE_QP", true, false,
        IbUverbsExCreateQp => IbUverbsExCreateQpResp, drv Mlx5IbCreateQp => Mlx5IbCreateQpResp);
    declare_cmd!(/// extended MODIFY_QP
        ExModifyQp = IB_USER_VERBS_EX_CMD_MODIFY_QP, "EX_MODIFY_QP", true, false,
        IbUverbsExModifyQp => IbUverbsExModifyQpResp, drv Mlx5IbModifyQp => Mlx5IbModifyQpResp);
}

/// Total response length of `C` (core + driver), the bytes its response pointer must cover.
pub const fn resp_len<C: Command>() -> usize {
    size_of::<C::Resp>() + size_of::<C::DrvResp>()
}

/// Encodes command `C`: `req` (its `response` field, if any, replaced by `response`) and
/// `drv`, expecting [`resp_len::<C>()`](resp_len) bytes of response at `response`.
///
/// `EINVAL` if the structs do not fit the framing (never for the declared commands: the
/// codec tests encode each).
pub fn encode_write<C: Command>(
    req: &C::Req,
    drv: &C::DrvReq,
    response: u64,
) -> Result<Vec<u8>, Errno> {
    let mut core = req.as_bytes().to_vec();
    if C::EXTENDED {
        return build_write_ex(
            C::ID,
            response,
            &core,
            size_of::<C::Resp>(),
            drv.as_bytes(),
            size_of::<C::DrvResp>(),
        );
    }
    if C::RESPONSE_PTR {
        let slot = core.get_mut(..8).ok_or(Errno::EINVAL)?;
        slot.copy_from_slice(&response.to_ne_bytes());
    }
    build_write(C::ID, &core, drv.as_bytes(), resp_len::<C>())
}

/// Splits a response buffer of [`resp_len::<C>()`](resp_len) bytes (fewer read as zero)
/// into the core and driver responses.
pub fn decode_resp<C: Command>(bytes: &[u8]) -> (C::Resp, C::DrvResp) {
    let core = size_of::<C::Resp>();
    (
        read_prefix_zero_fill(bytes),
        read_prefix_zero_fill(bytes.get(core..).unwrap_or(&[])),
    )
}

impl WriteCmd<'_> {
    /// The core request as command `C`'s struct, the way the kernel copies it in
    /// (`uverbs_request`): shorter input reads as zero, longer input is ignored here (the
    /// caller checks [`WriteCmd::core_tail_is_zero`] where the kernel does).
    pub fn core<C: Command>(&self) -> C::Req {
        decode_req::<C>(self.core_in)
    }

    /// Whether the bytes past `C::Req` are all zero.
    pub fn core_tail_is_zero<C: Command>(&self) -> bool {
        tail_is_zero(self.core_in, size_of::<C::Req>())
    }

    /// The driver request as command `C`'s struct (`ib_copy_from_udata` of
    /// `min(inlen, size)`, zero-extended). `EINVAL` if bytes past the struct are non-zero,
    /// as `ib_is_udata_cleared` answers.
    pub fn driver<C: Command>(&self) -> Result<C::DrvReq, Errno> {
        decode_drv::<C>(self.driver_in)
    }
}

/// Kernel side: command `C`'s core request from the bytes after the header(s), as
/// `uverbs_request` copies it (shorter input reads as zero, longer is cut).
pub fn decode_req<C: Command>(core: &[u8]) -> C::Req {
    read_prefix_zero_fill(core)
}

/// Kernel side: command `C`'s driver request from the udata bytes (`ib_copy_from_udata` of
/// `min(inlen, size)`, zero-extended); `EINVAL` if bytes past the struct are non-zero
/// (`ib_is_udata_cleared`).
pub fn decode_drv<C: Command>(driver: &[u8]) -> Result<C::DrvReq, Errno> {
    if !tail_is_zero(driver, size_of::<C::DrvReq>()) {
        return Err(Errno::EINVAL);
    }
    Ok(read_prefix_zero_fill(driver))
}
