//! Event channels: the context's async-event fd and CREATE_COMP_CHANNEL.

use mlx5_ffi::uverbs::IbUverbsCreateCompChannelResp;

use super::Req;
use crate::abi::Errno;
use crate::fds::{EvObj, EventChannel};
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

/// Release the completion channels of `ctx` whose user descriptor was closed and that no
/// CQ uses any more: the kernel frees a completion-event file on its last reference (the
/// descriptor and the CQs created on it), so the emulator's two descriptors of it (its end
/// and the duplicate of the user's) must go then, not when the context closes. Run where a
/// channel can be named or stop being used (CREATE_COMP_CHANNEL, CREATE_CQ, DESTROY_CQ):
/// the number of channels a context holds stays that of the open ones.
pub(super) fn release_closed_channels(w: &mut World, ctx: u64) {
    let Some(c) = w.contexts.get(&ctx) else {
        return;
    };
    let hca = c.hca;
    let closed: Vec<(i32, usize)> = c
        .comp_by_fd
        .iter()
        .map(|(&fd, &ch)| (fd, ch))
        .filter(|&(_, ch)| {
            w.channels
                .get(ch)
                .and_then(Option::as_ref)
                .is_none_or(|e| e.user_closed())
        })
        .filter(|&(_, ch)| !w.hcas[hca].cqs.values().any(|q| q.channel == Some(ch)))
        .collect();
    for (fd, ch) in closed {
        if let Some(c) = w.contexts.get_mut(&ctx) {
            c.comp_by_fd.remove(&fd);
        }
        if let Some(slot) = w.channels.get_mut(ch) {
            *slot = None;
        }
    }
}

/// The channel slot behind the user's completion-channel descriptor `fd`, if `fd` still
/// names one of this context's channels; EBADF otherwise (`lookup_get_fd_uobject`: not
/// open, or not a completion channel of this file).
pub(super) fn comp_channel_of(w: &World, ctx: u64, fd: i32) -> Result<usize, Errno> {
    let ch = *w
        .contexts
        .get(&ctx)
        .and_then(|c| c.comp_by_fd.get(&fd))
        .ok_or(Errno(libc::EBADF))?;
    match w.channels.get(ch).and_then(Option::as_ref) {
        Some(e) if !e.user_closed() => Ok(ch),
        _ => Err(Errno(libc::EBADF)),
    }
}

pub(super) fn create_comp_channel(w: &mut World, ctx: u64, r: &Req) -> Result<(), Errno> {
    release_closed_channels(w, ctx);
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

/// `obj` is being destroyed: the events of it the user has read from channel `ch` (the
/// `events_reported` of its DESTROY answer; libibverbs waits until it has acknowledged
/// that many), its unread ones taken off the channel (`ib_uverbs_release_uevent`).
pub(super) fn release_events(w: &mut World, ch: Option<usize>, obj: EvObj) -> u32 {
    match ch.and_then(|c| w.channels.get_mut(c)) {
        Some(Some(chan)) => chan.release(obj),
        _ => 0,
    }
}

/// [`release_events`] on the async event channel of context `ctx`.
pub(super) fn release_async_events(w: &mut World, ctx: u64, obj: EvObj) -> u32 {
    let ch = w.contexts.get(&ctx).map(|c| c.async_ch);
    release_events(w, ch, obj)
}
