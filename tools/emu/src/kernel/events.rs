//! Event channels: the context's async-event fd and CREATE_COMP_CHANNEL.

use mlx5_ffi::uverbs::IbUverbsCreateCompChannelResp;

use super::Req;
use crate::abi::Errno;
use crate::fds::EventChannel;
use crate::state::World;

/// A new event channel carrying `record`-byte records: (slot in `w.channels`, user fd).
pub(super) fn new_channel(w: &mut World, record: usize) -> Result<(usize, i32), Errno> {
    let ch = EventChannel::new(record)?;
    let fd = ch.user_fd;
    // Reuse the slot of a closed context's channel, if any.
    if let Some(i) = w.channels.iter().position(Option::is_none) {
        w.channels[i] = Some(ch);
        return Ok((i, fd));
    }
    w.channels.push(Some(ch));
    Ok((w.channels.len() - 1, fd))
}

pub(super) fn create_comp_channel(w: &mut World, ctx: u64, r: &Req) -> Result<(), Errno> {
    let (ch, fd) = new_channel(w, size_of::<mlx5_ffi::uverbs::IbUverbsCompEventDesc>())?;
    if let Err(e) = r.respond(&IbUverbsCreateCompChannelResp { fd: fd as u32 }) {
        w.channels[ch] = None;
        return Err(e);
    }
    if let Some(c) = w.contexts.get_mut(&ctx) {
        c.comp_by_fd.insert(fd, ch);
    }
    Ok(())
}
