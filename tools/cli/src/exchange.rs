//! Out-of-band address exchange over TCP in the formats of perftest and ibv_rc_pingpong, so our
//! tool can talk to theirs.
//!
//! perftest (client writes first, then reads; server reads, then writes):
//! 1. version string, 16 bytes NUL-padded;
//! 2. system data: cycle buffer, then cache line size, each a big-endian `i32` in an exchange
//!    of its own;
//! 3. MTU: 2 bytes, the ASCII digit of the `ibv_mtu` enum and a NUL;
//! 4. keys: `"%04x:%04x:%06x:%06x:%08x:%016x:%08x"` = LID:OUT_READS:QPN:PSN:RKEY:VADDR:SRQN,
//!    59 bytes with the NUL; with a GID index (`-x`, always on RoCE) the 16 GID bytes as
//!    `"%02x:"` each go between VADDR and SRQN and SRQN gets a trailing colon, 108 bytes;
//!    repeated as a barrier; the client closes with `"done\0"`.
//!
//! ibv_rc_pingpong: `"%04x:%06x:%06x:%s"` = LID:QPN:PSN:GID (32 hex digits), 52 bytes with NUL.

use std::io::{self, Read, Write};

/// perftest's version string we announce.
pub const PERFTEST_VERSION: &str = "6.06";
/// Size of perftest's version field.
pub const VERSION_LEN: usize = 16;
/// Size of one perftest key message (58 characters and a NUL).
pub const PERFTEST_KEY_LEN: usize = 59;
/// Size of one perftest key message with a GID (107 characters and a NUL).
pub const PERFTEST_KEY_GID_LEN: usize = 108;
/// Size of one ibv_rc_pingpong message (51 characters and a NUL).
pub const PINGPONG_MSG_LEN: usize = 52;
/// The closing message of both tools.
pub const DONE: &[u8; 5] = b"done\0";

/// One side's connection data as perftest sends it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PerftestKey {
    /// Port LID.
    pub lid: u16,
    /// Outstanding RDMA reads/atomics the side accepts.
    pub out_reads: u16,
    /// QP number (24 bits).
    pub qpn: u32,
    /// Initial PSN (24 bits).
    pub psn: u32,
    /// Remote key of the buffer.
    pub rkey: u32,
    /// Buffer address.
    pub vaddr: u64,
    /// SRQ number (0 without SRQ).
    pub srqn: u32,
    /// Port GID (wire order), sent when the side uses a GID index.
    pub gid: Option<[u8; 16]>,
}

/// A message that does not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError(pub String);

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn hex_field<T: TryFrom<u64>>(
    s: Option<&str>,
    what: &str,
    max_digits: usize,
) -> Result<T, ParseError> {
    let s = s.ok_or_else(|| ParseError(format!("missing {what}")))?;
    if s.is_empty() || s.len() > max_digits || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ParseError(format!("bad {what} {s:?}")));
    }
    let v = u64::from_str_radix(s, 16).map_err(|e| ParseError(format!("bad {what}: {e}")))?;
    T::try_from(v).map_err(|_| ParseError(format!("{what} {s} out of range")))
}

/// The text before the first NUL, as UTF-8.
fn until_nul(buf: &[u8]) -> Result<&str, ParseError> {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    std::str::from_utf8(&buf[..end]).map_err(|_| ParseError("message is not ASCII".into()))
}

impl PerftestKey {
    /// Size of this key's message: [`PERFTEST_KEY_LEN`], or [`PERFTEST_KEY_GID_LEN`] with a GID.
    pub fn message_len(&self) -> usize {
        if self.gid.is_some() {
            PERFTEST_KEY_GID_LEN
        } else {
            PERFTEST_KEY_LEN
        }
    }

    /// Encodes as perftest's key message (59 bytes, or 108 with a GID).
    pub fn encode(&self) -> Vec<u8> {
        let mut s = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid,
            self.out_reads,
            self.qpn & 0xff_ffff,
            self.psn & 0xff_ffff,
            self.rkey,
            self.vaddr,
        );
        match self.gid {
            Some(g) => {
                for b in g {
                    s.push_str(&format!("{b:02x}:"));
                }
                s.push_str(&format!("{:08x}:", self.srqn));
            }
            None => s.push_str(&format!("{:08x}", self.srqn)),
        }
        let mut out = vec![0u8; self.message_len()];
        out[..s.len()].copy_from_slice(s.as_bytes());
        out
    }

    /// Parses perftest's key message (as sscanf would: hex fields separated by colons), with
    /// or without the GID.
    pub fn decode(buf: &[u8]) -> Result<Self, ParseError> {
        let text = until_nul(buf)?;
        let fields: Vec<&str> = text.split(':').collect();
        // without GID: 7 fields; with: 6 + 16 + SRQN + the empty one after the last colon
        let with_gid = fields.len() > 8;
        let mut it = fields.iter().copied();
        let mut key = Self {
            lid: hex_field(it.next(), "LID", 4)?,
            out_reads: hex_field(it.next(), "OUT_READS", 4)?,
            qpn: hex_field(it.next(), "QPN", 6)?,
            psn: hex_field(it.next(), "PSN", 6)?,
            rkey: hex_field(it.next(), "RKEY", 8)?,
            vaddr: hex_field(it.next(), "VADDR", 16)?,
            ..Self::default()
        };
        if with_gid {
            let mut g = [0u8; 16];
            for b in &mut g {
                *b = hex_field(it.next(), "GID byte", 2)?;
            }
            key.gid = Some(g);
        }
        key.srqn = hex_field(it.next(), "SRQN", 8)?;
        match it.next() {
            None | Some("") if it.next().is_none() => Ok(key),
            _ => Err(ParseError(format!("trailing data in {text:?}"))),
        }
    }
}

/// One side's connection data as ibv_rc_pingpong sends it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PingpongDest {
    /// Port LID.
    pub lid: u16,
    /// QP number.
    pub qpn: u32,
    /// Initial PSN.
    pub psn: u32,
    /// Port GID, 16 bytes in wire order (zeros without a GID index).
    pub gid: [u8; 16],
}

impl PingpongDest {
    /// Encodes as the 52-byte message.
    pub fn encode(&self) -> [u8; PINGPONG_MSG_LEN] {
        let mut s = format!(
            "{:04x}:{:06x}:{:06x}:",
            self.lid,
            self.qpn & 0xff_ffff,
            self.psn & 0xff_ffff
        );
        for b in self.gid {
            s.push_str(&format!("{b:02x}"));
        }
        let mut out = [0u8; PINGPONG_MSG_LEN];
        out[..s.len()].copy_from_slice(s.as_bytes());
        out
    }

    /// Parses the 52-byte message.
    pub fn decode(buf: &[u8]) -> Result<Self, ParseError> {
        let text = until_nul(buf)?;
        let mut it = text.splitn(4, ':');
        let lid = hex_field(it.next(), "LID", 4)?;
        let qpn = hex_field(it.next(), "QPN", 6)?;
        let psn = hex_field(it.next(), "PSN", 6)?;
        let g = it.next().ok_or_else(|| ParseError("missing GID".into()))?;
        if g.len() != 32 || !g.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(ParseError(format!("bad GID {g:?}")));
        }
        let mut gid = [0u8; 16];
        for (i, byte) in gid.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&g[2 * i..2 * i + 2], 16)
                .map_err(|e| ParseError(format!("bad GID: {e}")))?;
        }
        Ok(Self { lid, qpn, psn, gid })
    }
}

/// Which end of perftest's exchange we are: the client writes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Connects, writes, then reads.
    Client,
    /// Accepts, reads, then writes.
    Server,
}

/// Sends `ours` and returns the peer's message of the same size, in the order of `role`.
pub fn swap<S: Read + Write>(s: &mut S, role: Role, ours: &[u8]) -> io::Result<Vec<u8>> {
    let mut theirs = vec![0u8; ours.len()];
    match role {
        Role::Client => {
            s.write_all(ours)?;
            s.flush()?;
            s.read_exact(&mut theirs)?;
        }
        Role::Server => {
            s.read_exact(&mut theirs)?;
            s.write_all(ours)?;
            s.flush()?;
        }
    }
    Ok(theirs)
}

/// The preamble of perftest's exchange: version, system data, MTU. Returns the peer's MTU
/// enum value (1 = 256 ... 5 = 4096).
pub fn perftest_preamble<S: Read + Write>(
    s: &mut S,
    role: Role,
    cycle_buffer: i32,
    cache_line: i32,
    mtu_enum: u8,
) -> io::Result<u8> {
    let bad = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
    let mut version = [0u8; VERSION_LEN];
    version[..PERFTEST_VERSION.len()].copy_from_slice(PERFTEST_VERSION.as_bytes());
    let _peer_version = swap(s, role, &version)?;
    // two separate 4-byte exchanges: a peer that writes the first and waits for the answer
    // would deadlock against an 8-byte read
    let _peer_cycle_buffer = swap(s, role, &cycle_buffer.to_be_bytes())?;
    let _peer_cache_line = swap(s, role, &cache_line.to_be_bytes())?;
    if !(1..=5).contains(&mtu_enum) {
        return Err(bad(format!("MTU enum {mtu_enum} out of 1..=5")));
    }
    let mtu = [b'0' + mtu_enum, 0];
    let peer = swap(s, role, &mtu)?;
    match peer[0] {
        c @ b'1'..=b'5' if peer[1] == 0 => Ok(c - b'0'),
        _ => Err(bad(format!("bad MTU message {peer:?}"))),
    }
}

/// One perftest key exchange.
pub fn perftest_keys<S: Read + Write>(
    s: &mut S,
    role: Role,
    ours: &PerftestKey,
) -> io::Result<PerftestKey> {
    // Both sides use the same format (perftest: a GID index on both or on neither).
    let peer = swap(s, role, &ours.encode())?;
    PerftestKey::decode(&peer).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.0))
}

/// perftest's bandwidth report, exchanged after WRITE and READ bandwidth runs so that the
/// server can print the client's figures: five big-endian 64-bit fields, each in an exchange of
/// its own (size, iterations, peak MiB/s, average MiB/s, message rate Mpps; the doubles as
/// their IEEE bit patterns).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BwReport {
    /// Message size.
    pub size: u64,
    /// Messages.
    pub iters: u64,
    /// Peak bandwidth, MiB/s.
    pub bw_peak: f64,
    /// Average bandwidth, MiB/s.
    pub bw_avg: f64,
    /// Message rate, Mpps.
    pub msg_rate: f64,
}

/// Exchanges bandwidth reports in perftest's format; returns the peer's.
pub fn bw_reports<S: Read + Write>(s: &mut S, role: Role, ours: &BwReport) -> io::Result<BwReport> {
    let mut field = |v: u64| -> io::Result<u64> {
        let back = swap(s, role, &v.to_be_bytes())?;
        let mut b = [0u8; 8];
        b.copy_from_slice(&back);
        Ok(u64::from_be_bytes(b))
    };
    Ok(BwReport {
        size: field(ours.size)?,
        iters: field(ours.iters)?,
        bw_peak: f64::from_bits(field(ours.bw_peak.to_bits())?),
        bw_avg: f64::from_bits(field(ours.bw_avg.to_bits())?),
        msg_rate: f64::from_bits(field(ours.msg_rate.to_bits())?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perftest_key_matches_observed_bytes() {
        // bytes observed from ib_send_lat (perftest 4.5) on the emulator
        let observed = b"0001:0001:387e01:27c848:00001042:000055fc95840000:00000000\0";
        assert_eq!(observed.len(), PERFTEST_KEY_LEN);
        let k = PerftestKey::decode(observed).unwrap();
        assert_eq!(
            k,
            PerftestKey {
                lid: 1,
                out_reads: 1,
                qpn: 0x387e01,
                psn: 0x27c848,
                rkey: 0x1042,
                vaddr: 0x55fc_9584_0000,
                srqn: 0,
                gid: None,
            }
        );
        assert_eq!(&k.encode()[..], observed);
    }

    #[test]
    fn perftest_key_with_gid_as_perftest_formats_it() {
        // KEY_PRINT_FMT_GID: "%04x:%04x:%06x:%06x:%08x:%016llx:" + 16 x "%02x:" + "%08x:"
        let mut gid = [0u8; 16];
        gid[10] = 0xff;
        gid[11] = 0xff;
        gid[12..].copy_from_slice(&[127, 1, 0, 2]);
        let k = PerftestKey {
            lid: 0,
            out_reads: 1,
            qpn: 0x1234,
            psn: 0xabcdef,
            rkey: 0x42,
            vaddr: 0x7f00_0000_1000,
            srqn: 0,
            gid: Some(gid),
        };
        let m = k.encode();
        assert_eq!(m.len(), PERFTEST_KEY_GID_LEN);
        let text = "0000:0001:001234:abcdef:00000042:00007f0000001000:\
                    00:00:00:00:00:00:00:00:00:00:ff:ff:7f:01:00:02:00000000:";
        assert_eq!(&m[..text.len()], text.as_bytes());
        assert_eq!(text.len() + 1, PERFTEST_KEY_GID_LEN);
        assert_eq!(m[text.len()], 0);
        assert_eq!(PerftestKey::decode(&m).unwrap(), k);
        // a GID byte too many, or a missing SRQN, does not parse
        assert!(
            PerftestKey::decode(text.replace(":00000000:", ":00:00000000:").as_bytes()).is_err()
        );
        assert!(PerftestKey::decode(text.replace(":00000000:", ":").as_bytes()).is_err());
    }

    #[test]
    fn pingpong_dest_matches_observed_bytes() {
        let observed = b"0001:388a01:1c36ee:00000000000000000000000000000000\0";
        assert_eq!(observed.len(), PINGPONG_MSG_LEN);
        let d = PingpongDest::decode(observed).unwrap();
        assert_eq!(
            (d.lid, d.qpn, d.psn, d.gid),
            (1, 0x388a01, 0x1c36ee, [0; 16])
        );
        assert_eq!(&d.encode(), observed);
        let mut g = d;
        g.gid = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 0xff];
        assert_eq!(PingpongDest::decode(&g.encode()).unwrap(), g);
    }

    #[test]
    fn malformed_messages_are_errors_not_panics() {
        for bad in [
            &b"zzzz:0001:387e01:27c848:00001042:000055fc95840000:00000000\0"[..],
            b"0001:0001:387e01\0",
            b"",
            b"0001:0001:1387e01:27c848:00001042:000055fc95840000:00000000\0",
            b"0001:0001:387e01:27c848:00001042:000055fc95840000:00000000:77\0",
            &[0xff; 59],
        ] {
            assert!(PerftestKey::decode(bad).is_err(), "{bad:?}");
        }
        assert!(PingpongDest::decode(b"0001:388a01:1c36ee:0000\0").is_err());
        assert!(PingpongDest::decode(b"0001:388a01\0").is_err());
    }

    /// A peer that writes one field and waits for its answer before writing the next, as
    /// perftest does: our server side must answer each 4-byte field on its own.
    #[test]
    fn server_preamble_answers_field_by_field() {
        use std::io::{Read, Write};
        use std::os::unix::net::UnixStream;
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let server =
            std::thread::spawn(move || perftest_preamble(&mut b, Role::Server, 4096, 64, 5));
        let mut field = |out: &[u8], n: usize| {
            a.write_all(out).unwrap();
            let mut back = vec![0u8; n];
            a.read_exact(&mut back).unwrap();
            back
        };
        let mut v = [0u8; VERSION_LEN];
        v[..4].copy_from_slice(b"6.06");
        assert!(field(&v, VERSION_LEN).starts_with(PERFTEST_VERSION.as_bytes()));
        assert_eq!(field(&4096i32.to_be_bytes(), 4), 4096i32.to_be_bytes());
        assert_eq!(field(&64i32.to_be_bytes(), 4), 64i32.to_be_bytes());
        assert_eq!(field(b"4\0", 2), b"5\0");
        assert_eq!(server.join().unwrap().unwrap(), 4);
    }

    #[test]
    fn bw_reports_are_big_endian_fields() {
        use std::io::{Read, Write};
        use std::os::unix::net::UnixStream;
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let ours = BwReport {
            size: 65536,
            iters: 5000,
            bw_peak: 1234.5,
            bw_avg: 1000.25,
            msg_rate: 0.016,
        };
        let client = std::thread::spawn(move || bw_reports(&mut a, Role::Client, &ours).unwrap());
        // play perftest's server: read each field, answer zeros
        let mut got = Vec::new();
        for _ in 0..5 {
            let mut f = [0u8; 8];
            b.read_exact(&mut f).unwrap();
            got.push(u64::from_be_bytes(f));
            b.write_all(&[0; 8]).unwrap();
        }
        assert_eq!(
            got,
            vec![
                65536,
                5000,
                1234.5f64.to_bits(),
                1000.25f64.to_bits(),
                0.016f64.to_bits()
            ]
        );
        assert_eq!(client.join().unwrap(), BwReport::default());
    }

    #[test]
    fn preamble_and_keys_over_a_socket_pair() {
        use std::os::unix::net::UnixStream;
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let server = std::thread::spawn(move || {
            let mtu = perftest_preamble(&mut b, Role::Server, 4096, 64, 3).unwrap();
            let k = PerftestKey {
                lid: 2,
                qpn: 0x20,
                ..Default::default()
            };
            (mtu, perftest_keys(&mut b, Role::Server, &k).unwrap())
        });
        let mtu = perftest_preamble(&mut a, Role::Client, 4096, 64, 5).unwrap();
        let k = PerftestKey {
            lid: 1,
            qpn: 0x10,
            psn: 0xabcdef,
            ..Default::default()
        };
        let peer = perftest_keys(&mut a, Role::Client, &k).unwrap();
        let (server_saw_mtu, server_saw_key) = server.join().unwrap();
        assert_eq!((mtu, server_saw_mtu), (3, 5));
        assert_eq!(peer.qpn, 0x20);
        assert_eq!(server_saw_key, k);
    }
}
