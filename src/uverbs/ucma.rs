//! The rdma_cm (ucma) call site: one `write()` of a `rdma_ucm_cmd_hdr` + command on an
//! rdma_cm descriptor (the real `/dev/infiniband/rdma_cm` or the emulator's), its response
//! (if any) through a [`RespBuf`] whose address is put into the command here. The commands
//! offered carry no other user pointer (no SET_OPTION), so the `UverbsSurface::write`
//! contract is proven here once, as for the uverbs commands in `super`.

use mlx5_ffi::surface::UverbsSurface;
use mlx5_ffi::ucma::encode_cmd;
use zerocopy::{Immutable, IntoBytes};

use super::RespBuf;
use crate::error::{Error, Result};

/// Send ucma command `cmd` (named `name` in errors) with body `body`; `set_resp` puts the
/// response address into the body when `resp_len > 0`. Returns the response bytes.
pub(crate) fn command<T: IntoBytes + Immutable>(
    surface: &dyn UverbsSurface,
    cmd: u32,
    name: &'static str,
    mut body: T,
    set_resp: impl FnOnce(&mut T, u64),
    resp_len: usize,
) -> Result<RespBuf> {
    let mut resp = RespBuf::new(resp_len);
    if resp_len > 0 {
        set_resp(&mut body, resp.addr());
    }
    let buf = encode_cmd(cmd, &body, resp_len);
    // SAFETY: the only pointer in `buf` is the response address (when `resp_len > 0`),
    // set just above to `resp`: a live heap buffer of at least `resp_len` bytes (the length
    // the header declares), owned by this function and not referenced during the call. The
    // bodies this crate sends (`src/cm.rs`) carry no other pointer.
    let r = unsafe { surface.write(&buf) };
    match r {
        Ok(n) if n == buf.len() => Ok(resp),
        Ok(_) => Err(Error::BadResponse {
            cmd: name,
            what: "short write",
        }),
        Err(e) => Err(Error::uverbs(name, e.0)),
    }
}

/// `poll(2)` of one descriptor for `ms` milliseconds: whether it became ready.
pub(crate) fn poll_one(p: &mut libc::pollfd, ms: i32) -> bool {
    // SAFETY: `p` is one valid, exclusively borrowed pollfd for the duration of the call.
    unsafe { libc::poll(p, 1, ms) > 0 }
}
