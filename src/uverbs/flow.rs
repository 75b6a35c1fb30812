//! The call sites of the flow commands (`ibv_create_flow` / `ibv_destroy_flow`): extended
//! writes whose CREATE_FLOW request carries its specs after the core struct, so it does
//! not fit the fixed-size [`super::write`].

use mlx5_ffi::cmd::{Command, build_write_ex};
use mlx5_ffi::flow::{ExCreateFlow, ExDestroyFlow, IbUverbsCreateFlowResp, IbUverbsDestroyFlow};
use mlx5_ffi::surface::UverbsSurface;
use zerocopy::IntoBytes;

use super::RespBuf;
use crate::error::{Error, Result};

/// Send CREATE_FLOW with the request core `core` (`ib_uverbs_create_flow` and its specs,
/// as `FlowRule::encode` builds it); returns the flow's handle.
pub(crate) fn create_flow(surface: &dyn UverbsSurface, core: &[u8]) -> Result<u32> {
    let mut resp = RespBuf::new(size_of::<IbUverbsCreateFlowResp>());
    let buf =
        build_write_ex(ExCreateFlow::ID, resp.addr(), core, resp.len(), &[], 0).map_err(|_| {
            Error::InvalidArgument {
                attr: "flow rule",
                reason: "not a whole number of 8-byte words",
            }
        })?;
    // SAFETY: the only pointer in `buf` is the response pointer, set to `resp`: a live heap
    // buffer of exactly the response length the header declares, owned by this function
    // and not referenced during the call. The specs carry no pointers.
    match unsafe { surface.write(&buf) } {
        Ok(n) if n == buf.len() => Ok(resp.get::<IbUverbsCreateFlowResp>(0).flow_handle),
        Ok(_) => Err(Error::BadResponse {
            cmd: ExCreateFlow::NAME,
            what: "short write",
        }),
        Err(e) => Err(Error::uverbs(ExCreateFlow::NAME, e.0)),
    }
}

/// Send DESTROY_FLOW for `handle`.
pub(crate) fn destroy_flow(surface: &dyn UverbsSurface, handle: u32) -> Result<()> {
    let req = IbUverbsDestroyFlow {
        comp_mask: 0,
        flow_handle: handle,
    };
    let buf = build_write_ex(ExDestroyFlow::ID, 0, req.as_bytes(), 0, &[], 0).map_err(|_| {
        Error::InvalidArgument {
            attr: "destroy flow",
            reason: "framing",
        }
    })?;
    // SAFETY: `buf` carries no pointer (no response: its response field is 0).
    match unsafe { surface.write(&buf) } {
        Ok(_) => Ok(()),
        Err(e) => Err(Error::uverbs(ExDestroyFlow::NAME, e.0)),
    }
}
