//! Event file descriptors: the async-event fd of a context and completion channels.
//!
//! Each is a real `AF_UNIX` stream socket pair. The user gets one end (read with read(2),
//! pollable, closed by the user); the emulator keeps the other and sends fixed-size
//! records with `MSG_DONTWAIT | MSG_NOSIGNAL`, so a full or closed channel never blocks the
//! device nor raises SIGPIPE.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::abi::Errno;

/// The object an event record is counted for: ib_uverbs counts, per QP, CQ and SRQ, the
/// events of it the user has *read* (`ib_uverbs_event_read` bumps the object's counter as a
/// record leaves the queue), and DESTROY answers that count as `events_reported`, which
/// libibverbs waits to see acknowledged before `ibv_destroy_*` returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum EvObj {
    /// QP `qpn` of HCA `.0`.
    Qp(usize, u32),
    /// CQ `cqn` of HCA `.0` (its completion events, or its async events).
    Cq(usize, u32),
    /// SRQ `srqn` of HCA `.0`.
    Srq(usize, u32),
    /// Counted for no object (port and device events, DEVX records).
    None,
}

/// Unread records past which a push first settles what the user has read (so `pending`
/// stays short while the user reads; one FIONREAD per push only beyond it).
const SETTLE_AFTER: usize = 64;

/// The kernel's end of an event channel.
#[derive(Debug)]
pub(crate) struct EventChannel {
    kernel_end: OwnedFd,
    /// A duplicate of the user's end, so the unread byte count can be asked (FIONREAD)
    /// even after the user closed theirs.
    peer_dup: OwnedFd,
    /// Raw number of the user's end (owned by the user: we never close it).
    pub(crate) user_fd: RawFd,
    /// Records written.
    pub(crate) written: u64,
    /// Whether the user end was given to the user (ASYNC_EVENT alloc hands it out once).
    pub(crate) handed_out: bool,
    record_size: usize,
    /// (device, inode) of the socket: the user's descriptor still names this channel only
    /// while `fstat` of it says so (a closed and reused number names another file).
    ident: (u64, u64),
    /// The object of each record written and not yet known to be read, oldest first (the
    /// socket is a byte stream of whole records, read in order).
    pending: std::collections::VecDeque<EvObj>,
    /// Per object, the records of it the user has read.
    read: std::collections::BTreeMap<EvObj, u32>,
}

/// (device, inode) of an open descriptor, None if it is not open.
fn ident_of(fd: RawFd) -> Option<(u64, u64)> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: fstat writes one `struct stat` into the buffer we pass; any fd number is
    // accepted (EBADF for a closed one).
    let rc = unsafe { libc::fstat(fd, st.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: fstat succeeded and filled the (zero-initialised) struct.
    let st = unsafe { st.assume_init() };
    Some((st.st_dev, st.st_ino))
}

impl EventChannel {
    /// Create a channel carrying records of `record_size` bytes.
    pub(crate) fn new(record_size: usize) -> Result<Self, Errno> {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: `fds` is a valid array of two ints for socketpair to fill.
        let rc = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
                0,
                fds.as_mut_ptr(),
            )
        };
        if rc != 0 {
            return Err(Errno(
                std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EMFILE),
            ));
        }
        // SAFETY: socketpair succeeded, fds[0] is a fresh descriptor owned by nobody else.
        let kernel_end = unsafe { OwnedFd::from_raw_fd(fds[0]) };
        // SAFETY: fds[1] is a valid descriptor we just created.
        let dup = unsafe { libc::fcntl(fds[1], libc::F_DUPFD_CLOEXEC, 3) };
        if dup < 0 {
            // SAFETY: fds[1] is ours and not handed out yet.
            unsafe { libc::close(fds[1]) };
            return Err(Errno(libc::EMFILE));
        }
        // SAFETY: `dup` is a fresh descriptor owned by nobody else.
        let peer_dup = unsafe { OwnedFd::from_raw_fd(dup) };
        let ident = ident_of(dup).unwrap_or((u64::MAX, u64::MAX));
        Ok(Self {
            kernel_end,
            peer_dup,
            user_fd: fds[1],
            handed_out: false,
            written: 0,
            record_size,
            ident,
            pending: Default::default(),
            read: Default::default(),
        })
    }

    /// Queue one record counted for no object; false if it could not be delivered.
    pub(crate) fn push(&mut self, rec: &[u8]) -> bool {
        self.push_for(rec, EvObj::None)
    }

    /// Queue one record of `obj`; returns false if it could not be delivered (full or
    /// closed).
    pub(crate) fn push_for(&mut self, rec: &[u8], obj: EvObj) -> bool {
        if self.pending.len() >= SETTLE_AFTER {
            self.settle();
        }
        if self.send(rec) {
            self.pending.push_back(obj);
            true
        } else {
            false
        }
    }

    /// Credit the records the user has read since the last look to their objects.
    fn settle(&mut self) {
        let unread = usize::try_from(self.queued()).unwrap_or(usize::MAX);
        let read = self.pending.len().saturating_sub(unread);
        for obj in self.pending.drain(..read) {
            if obj != EvObj::None {
                *self.read.entry(obj).or_insert(0) += 1;
            }
        }
    }

    /// `obj` is destroyed: how many of its records the user has read (its
    /// `events_reported`), and its unread ones taken off the channel, as
    /// `ib_uverbs_release_uevent` does (the user must never read an event of a freed
    /// object: libibverbs would acknowledge it on freed memory). The other unread records
    /// keep their order.
    pub(crate) fn release(&mut self, obj: EvObj) -> u32 {
        self.settle();
        if self.pending.contains(&obj) {
            // Take every unread record out through our duplicate of the user's end (whole
            // records: each went in as one send, and a stream read never splits one unless
            // the buffer ends inside it), then write back those of other objects.
            let rs = self.record_size;
            let mut buf = vec![0u8; self.pending.len() * rs];
            let mut got = 0;
            while got + rs <= buf.len() {
                let want = (buf.len() - got) / rs * rs;
                // SAFETY: `buf[got..got + want]` is a valid writable region of `want` bytes;
                // the descriptor is ours.
                let n = unsafe {
                    libc::recv(
                        self.peer_dup.as_raw_fd(),
                        buf[got..].as_mut_ptr().cast(),
                        want,
                        libc::MSG_DONTWAIT,
                    )
                };
                if n <= 0 {
                    break;
                }
                got += n as usize;
            }
            let taken = got / rs;
            // Records before the ones taken were read by the user meanwhile.
            let read_meanwhile = self.pending.len().saturating_sub(taken);
            for o in self.pending.drain(..read_meanwhile) {
                if o != EvObj::None {
                    *self.read.entry(o).or_insert(0) += 1;
                }
            }
            let kept: Vec<(usize, EvObj)> = std::mem::take(&mut self.pending)
                .into_iter()
                .enumerate()
                .filter(|&(_, o)| o != obj)
                .collect();
            for (i, o) in kept {
                if self.send(&buf[i * rs..(i + 1) * rs]) {
                    self.pending.push_back(o);
                }
            }
        }
        self.read.remove(&obj).unwrap_or(0)
    }

    /// Write one record to the socket.
    fn send(&mut self, rec: &[u8]) -> bool {
        debug_assert_eq!(rec.len(), self.record_size);
        // SAFETY: `rec` is a valid slice for the duration of the call; the fd is ours.
        let n = unsafe {
            libc::send(
                self.kernel_end.as_raw_fd(),
                rec.as_ptr().cast(),
                rec.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if n == rec.len() as isize {
            self.written += 1;
            true
        } else {
            false
        }
    }

    /// Whether the user's descriptor no longer names this channel: closed (as
    /// `ibv_destroy_comp_channel` does), or its number reused for another file.
    pub(crate) fn user_closed(&self) -> bool {
        ident_of(self.user_fd) != Some(self.ident)
    }

    /// Records written but not yet read by the user.
    pub(crate) fn queued(&self) -> u64 {
        let mut n: libc::c_int = 0;
        // SAFETY: FIONREAD on a socket we own writes one int into `n`.
        let rc = unsafe { libc::ioctl(self.peer_dup.as_raw_fd(), libc::FIONREAD, &mut n) };
        if rc != 0 || n < 0 {
            return 0;
        }
        n as u64 / self.record_size as u64
    }
}
