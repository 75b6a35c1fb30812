//! pcap capture of fabric traffic as Ethernet/IPv4/UDP(4791)/RoCEv2, readable by
//! Wireshark/tshark (which dissect UDP port 4791 as RoCEv2: BTH and the extended headers),
//! as ibdump captures a port: both directions of every QP.
//!
//! What a process records: every packet its HCAs put on the fabric, and every packet that
//! arrives from another process. Timestamps are wall-clock time (`CLOCK_REALTIME`, as
//! ibdump's), also in stepped mode, whose virtual clock means nothing to a reader.
//!
//! One file for a whole fabric: processes given the same path write one capture. Records
//! are appended (`O_APPEND`, one `write` per record, so records of two processes never
//! interleave), and open file description locks on bytes far past the end of the file say
//! who writes it:
//! - byte [`HEADER_LOCK`]: a write lock while the first opener truncates the file and writes
//!   the global header, a read lock held by every writer after that. An opener that gets the
//!   write lock is alone (a file left by an earlier run is truncated); one that does not joins
//!   the capture and appends.
//! - byte [`NODE_LOCK`]` + lid`: a read lock per HCA of each writer. A packet arriving from
//!   node `lid` is recorded on arrival only if that byte is not locked by another writer of
//!   the same file: otherwise the sender recorded it already, and the capture holds each
//!   packet once.
//!
//! The locks go with the file description (they are released when the process exits), and
//! the file's length never changes for them.

use std::io::Write;
use std::os::fd::AsRawFd;

use crate::transport::ip_udp_headers;

/// Lock byte of the writers' header protocol (far beyond any capture's length).
const HEADER_LOCK: i64 = 1 << 50;
/// Lock byte of node (LID) 0; node `n` is `NODE_LOCK + n`.
const NODE_LOCK: i64 = HEADER_LOCK + 1;
/// How long an answer "does node n write this capture too" is reused.
const PEER_RECHECK_NS: u64 = 1_000_000_000;

/// An open capture.
#[derive(Debug)]
pub(crate) struct Capture {
    file: std::fs::File,
    /// Per source node (LID): (when asked, whether another writer of this file owns it).
    peers: Box<[(u64, bool); 256]>,
    /// One record (header and frame), reused.
    rec: Vec<u8>,
}

/// One `F_OFD_*` lock request on byte `at` of `f`.
fn ofd_lock(f: &std::fs::File, cmd: libc::c_int, kind: libc::c_int, at: i64) -> Result<i16, i32> {
    // SAFETY: an all-zero `struct flock` is a valid value (every field is an integer).
    let mut l: libc::flock = unsafe { std::mem::zeroed() };
    l.l_type = kind as i16;
    l.l_whence = libc::SEEK_SET as i16;
    l.l_start = at;
    l.l_len = 1;
    // SAFETY: fcntl with an F_OFD_* command reads (and for F_OFD_GETLK writes) the `flock`
    // we pass, which lives for the call; the descriptor is open (owned by `f`).
    let rc = unsafe { libc::fcntl(f.as_raw_fd(), cmd, &mut l) };
    if rc == 0 {
        Ok(l.l_type)
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }
}

/// Wall-clock time in nanoseconds since the epoch.
fn realtime_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The pcap global header: microsecond timestamps, version 2.4, link type 1 (Ethernet).
fn global_header() -> [u8; 24] {
    let mut h = [0u8; 24];
    h[0..4].copy_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    h[4..6].copy_from_slice(&2u16.to_le_bytes());
    h[6..8].copy_from_slice(&4u16.to_le_bytes());
    h[16..20].copy_from_slice(&65535u32.to_le_bytes());
    h[20..24].copy_from_slice(&1u32.to_le_bytes());
    h
}

/// Open (or join) the capture at `path` for HCAs of LIDs `lids`. The error names the path
/// and the reason (an unwritable path must fail loudly, not capture nothing).
pub(crate) fn open(path: &std::path::Path, lids: &[u16]) -> Result<Capture, String> {
    let what = |e: std::io::Error| format!("pcap capture {}: {e}", path.display());
    let file = std::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .open(path)
        .map_err(what)?;
    let meta = file.metadata().map_err(what)?;
    if !meta.is_file() {
        return Err(format!(
            "pcap capture {}: not a regular file",
            path.display()
        ));
    }
    let os = |e: i32| what(std::io::Error::from_raw_os_error(e));
    match ofd_lock(&file, libc::F_OFD_SETLK, libc::F_WRLCK, HEADER_LOCK) {
        Ok(_) => {
            // Alone: a fresh capture.
            file.set_len(0).map_err(what)?;
            (&file).write_all(&global_header()).map_err(what)?;
            ofd_lock(&file, libc::F_OFD_SETLK, libc::F_RDLCK, HEADER_LOCK).map_err(os)?;
        }
        Err(e) if e == libc::EAGAIN || e == libc::EACCES => {
            // Another writer: wait until its header is written, then append.
            ofd_lock(&file, libc::F_OFD_SETLKW, libc::F_RDLCK, HEADER_LOCK).map_err(os)?;
            if file.metadata().map_err(what)?.len() == 0 {
                // Its writer died before the header: write it (if still alone in that).
                if ofd_lock(&file, libc::F_OFD_SETLK, libc::F_WRLCK, HEADER_LOCK).is_ok() {
                    if file.metadata().map_err(what)?.len() == 0 {
                        (&file).write_all(&global_header()).map_err(what)?;
                    }
                    ofd_lock(&file, libc::F_OFD_SETLK, libc::F_RDLCK, HEADER_LOCK).map_err(os)?;
                }
            }
        }
        Err(e) => return Err(os(e)),
    }
    for &lid in lids {
        ofd_lock(
            &file,
            libc::F_OFD_SETLK,
            libc::F_RDLCK,
            NODE_LOCK + i64::from(lid),
        )
        .map_err(os)?;
    }
    Ok(Capture {
        file,
        peers: Box::new([(0, false); 256]),
        rec: Vec::new(),
    })
}

impl Capture {
    /// Append one Ethernet frame stamped now.
    fn record(&mut self, frame: &[u8]) -> std::io::Result<()> {
        let now = realtime_ns();
        self.rec.clear();
        self.rec
            .extend_from_slice(&((now / 1_000_000_000) as u32).to_le_bytes());
        self.rec
            .extend_from_slice(&(((now / 1000) % 1_000_000) as u32).to_le_bytes());
        self.rec
            .extend_from_slice(&(frame.len() as u32).to_le_bytes());
        self.rec
            .extend_from_slice(&(frame.len() as u32).to_le_bytes());
        self.rec.extend_from_slice(frame);
        // One write: O_APPEND puts it at the end whole, whoever else appends.
        let n = (&self.file).write(&self.rec)?;
        if n != self.rec.len() {
            return Err(std::io::Error::other("short write"));
        }
        Ok(())
    }

    /// Whether another writer of this capture owns node `lid` (and so records what it
    /// sends).
    fn peer_writes(&mut self, lid: u16) -> bool {
        let now = realtime_ns();
        let slot = &mut self.peers[usize::from(lid & 0xff)];
        if slot.0 != 0 && now.saturating_sub(slot.0) < PEER_RECHECK_NS {
            return slot.1;
        }
        let locked = ofd_lock(
            &self.file,
            libc::F_OFD_GETLK,
            libc::F_WRLCK,
            NODE_LOCK + i64::from(lid),
        )
        .is_ok_and(|t| t != libc::F_UNLCK as i16);
        *slot = (now, locked);
        locked
    }
}

/// The Ethernet frame of a RoCEv2 datagram (`udp_payload` = BTH..ICRC) from `src` to `dst`:
/// on a RoCE port (`link` Ethernet) the nodes' MACs; otherwise locally administered MACs
/// derived from the node addresses.
fn frame_of(
    link: crate::roce::LinkLayer,
    src: [u8; 4],
    dst: [u8; 4],
    udp_payload: &[u8],
) -> Vec<u8> {
    let mac = |ip: [u8; 4]| {
        if link == crate::roce::LinkLayer::Ethernet {
            let node = u16::from_be_bytes([ip[2], ip[3]]);
            crate::roce::mac_of_guid(crate::roce::BASE_GUID + u64::from(node))
        } else {
            [0x02, 0, ip[0], ip[1], ip[2], ip[3]]
        }
    };
    let mut frame = Vec::with_capacity(14 + 28 + udp_payload.len());
    frame.extend_from_slice(&mac(dst));
    frame.extend_from_slice(&mac(src));
    frame.extend_from_slice(&0x0800u16.to_be_bytes());
    frame.extend_from_slice(&ip_udp_headers(src, dst, udp_payload.len(), false));
    frame.extend_from_slice(udp_payload);
    frame
}

/// Record one packet (`udp_payload` = BTH..ICRC) one of our HCAs sends from `src` to `dst`.
/// `pcap` is the world's capture, `link` its ports' link layer.
pub(crate) fn capture(
    pcap: &mut Option<Capture>,
    link: crate::roce::LinkLayer,
    src: [u8; 4],
    dst: [u8; 4],
    udp_payload: &[u8],
) {
    if pcap.is_none() {
        return;
    }
    let frame = frame_of(link, src, dst, udp_payload);
    write_frame(pcap, &frame);
}

/// Record one packet that arrived from another process (`src` is the sender's node
/// address), unless the sender writes this capture too and recorded it already.
pub(crate) fn capture_arrival(
    pcap: &mut Option<Capture>,
    link: crate::roce::LinkLayer,
    src: [u8; 4],
    dst: [u8; 4],
    udp_payload: &[u8],
) {
    let lid = u16::from_be_bytes([src[2], src[3]]);
    if pcap.as_mut().is_none_or(|c| c.peer_writes(lid)) {
        return;
    }
    let frame = frame_of(link, src, dst, udp_payload);
    write_frame(pcap, &frame);
}

/// Append a whole Ethernet frame to the capture, if there is one. A failed write ends the
/// capture with one line on stderr (the file system filled up or went away).
pub(crate) fn write_frame(pcap: &mut Option<Capture>, frame: &[u8]) {
    let Some(c) = pcap.as_mut() else { return };
    if let Err(e) = c.record(frame) {
        eprintln!("mlx5-emu: pcap capture stopped: {e}");
        *pcap = None;
    }
}
