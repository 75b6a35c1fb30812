//! perftest-compatible text report (header block, latency and bandwidth tables) and JSON.
//!
//! The header strings are perftest's, verbatim, so scripts that scrape `ib_send_lat` output keep
//! working. What perftest hides is added below its table: the full percentiles, that nothing
//! was dropped, and whether the figures are round-trip times or halves of them.

use std::fmt::Write as _;

use crate::stats::{BwStats, LatencyStats};

/// perftest's separator line (87 dashes).
pub const SEPARATOR: &str =
    "---------------------------------------------------------------------------------------";

/// perftest's latency table header, verbatim.
pub const LAT_HEADER: &str = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]";

/// perftest's bandwidth table header, verbatim (`RESULT_FMT`). Its "MB" is 2^20 bytes
/// (`format_factor` 0x100000 in perftest's `print_report_bw`): the figures are MiB/s.
pub const BW_HEADER: &str =
    " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]";

/// The unit of the bandwidth columns, as the text and the JSON name it.
pub const BW_UNIT: &str = "MB/sec";

/// What [`BW_UNIT`] means, printed under the bandwidth table.
pub const BW_UNIT_NOTE: &str = "MB/sec = 2^20 bytes per second, as perftest counts";

/// perftest's bandwidth table header with `--report_gbits`.
pub const BW_HEADER_GBITS: &str =
    " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]";

/// `x` rounded to `digits` decimals: every float of the JSON carries the digits the text
/// report prints for it (2 for perftest's latency and bandwidth columns, 6 for the message
/// rate, 3 for our percentile table), so that the two never disagree and no float prints as
/// `119.78949999999999`. Non-finite values pass through.
pub fn round_to(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    let r = (x * f).round() / f;
    if r.is_finite() { r } else { x }
}

/// Gbit/s (10^9 bits) per MiB/s.
pub const GBITS_PER_MIB: f64 = 1024.0 * 1024.0 * 8.0 / 1e9;

/// Header of our extra percentile table printed after perftest's.
pub const EXTRA_HEADER: &str =
    " #bytes #samples   p50[usec]   p99[usec]  p99.9[usec]  p99.99[usec]    max[usec]";

/// Whether reported latencies are full round trips or halves of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LatencyBasis {
    /// One-way latency estimated as RTT/2 (perftest's send and write tests).
    HalfRtt,
    /// The full round trip (perftest's read and atomic tests).
    Rtt,
}

impl LatencyBasis {
    /// The sentence printed with the table.
    pub fn sentence(self) -> &'static str {
        match self {
            Self::HalfRtt => "one-way latency = RTT/2, as perftest reports",
            Self::Rtt => "latency = full RTT (one request and its response), as perftest reports",
        }
    }

    /// The JSON value of `rtt_or_half`.
    pub fn json_tag(self) -> &'static str {
        match self {
            Self::HalfRtt => "RTT/2",
            Self::Rtt => "RTT",
        }
    }

    /// The divisor applied to each measured round trip.
    pub fn divisor(self) -> f64 {
        match self {
            Self::HalfRtt => 2.0,
            Self::Rtt => 1.0,
        }
    }
}

/// One end of the connection as printed in perftest's address lines.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Endpoint {
    /// Port LID.
    pub lid: u16,
    /// Queue pair number (24 bits).
    pub qpn: u32,
    /// Initial packet sequence number (24 bits).
    pub psn: u32,
    /// Remote key and buffer address, printed for RDMA tests.
    pub rkey_vaddr: Option<(u32, u64)>,
    /// Port GID (wire order) when the path is global (RoCE, or a GID index given).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gid: Option<[u8; 16]>,
}

impl Endpoint {
    fn line(&self, which: &str) -> String {
        let mut s = format!(
            " {which} address: LID {:#04x} QPN {:#06x} PSN {:#06x}",
            self.lid, self.qpn, self.psn
        );
        if let Some((rkey, vaddr)) = self.rkey_vaddr {
            let _ = write!(s, " RKey {rkey:#08x} VAddr {vaddr:#016x}");
        }
        if let Some(g) = self.gid {
            // perftest prints the GID bytes in decimal ("%02d:")
            let bytes: Vec<String> = g.iter().map(|b| format!("{b:02}")).collect();
            let _ = write!(s, "\n GID: {}", bytes.join(":"));
        }
        s
    }
}

/// Everything the header block shows.
#[derive(Debug, Clone, PartialEq)]
pub struct Header {
    /// perftest's title, e.g. "Send Latency Test".
    pub title: String,
    /// Device name, with " (emulated)" for the emulator.
    pub device: String,
    /// Connection type: "RC".
    pub connection: &'static str,
    /// The receives come from an SRQ (`-c XRC`, `-c DC`: perftest's "Using SRQ").
    pub srq: bool,
    /// Send queue depth as perftest prints it (`TX depth`), `None` where perftest prints no
    /// such line (a server that is not duplex).
    pub tx_depth: Option<u32>,
    /// Receive queue depth as perftest prints it (`RX depth`: SEND tests, on the server and
    /// in duplex runs), `None` otherwise.
    pub rx_depth: Option<u32>,
    /// QPs per side (`-q`).
    pub qps: u32,
    /// CQ moderation (bandwidth tests only).
    pub cq_mod: Option<u32>,
    /// Path MTU in bytes.
    pub mtu: u32,
    /// The port is Ethernet (RoCE): perftest's "Link type".
    pub ethernet: bool,
    /// Source GID index of the path, if global.
    pub gid_index: Option<u8>,
    /// Inline data size actually used.
    pub max_inline: u32,
    /// Outstanding reads/atomics (read tests only).
    pub outstand_reads: Option<u32>,
    /// How the peers exchanged their addresses.
    pub data_ex: String,
    /// Ours: BlueFlame or 8-byte doorbell.
    pub doorbell: String,
    /// Ours: work requests per doorbell.
    pub post_list: u32,
    /// Ours: completion wait mode.
    pub poll: String,
    /// Ours: what backs the data buffers.
    pub buffers: String,
    /// Local and remote endpoints.
    pub local: Endpoint,
    /// See `local`.
    pub remote: Endpoint,
    /// With `-q N`: the other N-1 QPs' (local, remote) endpoints, in order.
    pub more: Vec<(Endpoint, Endpoint)>,
}

fn on_off(b: bool) -> &'static str {
    if b { "ON" } else { "OFF" }
}

impl Header {
    /// Renders the block exactly in perftest's layout, followed by our own three lines.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "{SEPARATOR}");
        let _ = writeln!(s, "                    {}", self.title);
        let _ = writeln!(
            s,
            " Dual-port       : {}\t\tDevice         : {}",
            on_off(false),
            self.device
        );
        let _ = writeln!(s, " Number of qps   : {}\t\tTransport type : IB", self.qps);
        let _ = writeln!(
            s,
            " Connection type : {}\t\tUsing SRQ      : {}",
            self.connection,
            on_off(self.srq)
        );
        let _ = writeln!(s, " PCIe relax order: {}", on_off(false));
        // Our posting path writes WQEs directly; it is not libibverbs' ibv_wr_* API.
        let _ = writeln!(s, " ibv_wr* API     : {}", on_off(false));
        if let Some(t) = self.tx_depth {
            let _ = writeln!(s, " TX depth        : {t}");
        }
        if let Some(r) = self.rx_depth {
            let _ = writeln!(s, " RX depth        : {r}");
        }
        if let Some(q) = self.cq_mod {
            let _ = writeln!(s, " CQ Moderation   : {q}");
        }
        let _ = writeln!(s, " Mtu             : {}[B]", self.mtu);
        let link = if self.ethernet { "Ethernet" } else { "IB" };
        let _ = writeln!(s, " Link type       : {link}");
        if let Some(i) = self.gid_index {
            let _ = writeln!(s, " GID index       : {i}");
        }
        match self.outstand_reads {
            Some(r) => {
                let _ = writeln!(s, " Outstand reads  : {r}");
            }
            None => {
                let _ = writeln!(s, " Max inline data : {}[B]", self.max_inline);
            }
        }
        let _ = writeln!(s, " rdma_cm QPs\t : {}", on_off(self.data_ex == "rdma_cm"));
        let _ = writeln!(s, " Data ex. method : {}", self.data_ex);
        let _ = writeln!(s, " Doorbell        : {}", self.doorbell);
        let _ = writeln!(s, " Post list       : {}", self.post_list);
        let _ = writeln!(s, " Completion wait : {}", self.poll);
        let _ = writeln!(s, " Buffers         : {}", self.buffers);
        let _ = writeln!(s, "{SEPARATOR}");
        // perftest: every local QP's line, then every remote one's
        let _ = writeln!(s, "{}", self.local.line("local"));
        for (l, _) in &self.more {
            let _ = writeln!(s, "{}", l.line("local"));
        }
        let _ = writeln!(s, "{}", self.remote.line("remote"));
        for (_, r) in &self.more {
            let _ = writeln!(s, "{}", r.line("remote"));
        }
        let _ = writeln!(s, "{SEPARATOR}");
        s
    }
}

/// Places `cells` under the columns of `header`: cell i starts where the i-th label starts.
fn row_under(header: &str, labels: &[&str], cells: &[String]) -> String {
    let mut out = String::new();
    let mut from = 0;
    for (label, cell) in labels.iter().zip(cells) {
        let col = header[from..]
            .find(label)
            .map_or(out.len() + 1, |p| p + from);
        from = col + label.len();
        // one space at least between cells
        let pad = col
            .saturating_sub(out.len())
            .max(usize::from(!out.is_empty()));
        out.extend(std::iter::repeat_n(' ', pad));
        out.push_str(cell);
    }
    out
}

/// One row of perftest's latency table.
pub fn lat_row(bytes: u64, iterations: u64, st: &LatencyStats) -> String {
    let labels = [
        "#bytes",
        "#iterations",
        "t_min",
        "t_max",
        "t_typical",
        "t_avg",
        "t_stdev",
        "99%",
        "99.9%",
    ];
    let cells = [
        bytes.to_string(),
        iterations.to_string(),
        format!("{:.2}", st.min),
        format!("{:.2}", st.max),
        format!("{:.2}", st.median),
        format!("{:.2}", st.avg),
        format!("{:.2}", st.stdev),
        format!("{:.2}", st.p99),
        format!("{:.2}", st.p99_9),
    ];
    row_under(LAT_HEADER, &labels, &cells)
}

/// One row of our extra percentile table.
pub fn extra_row(bytes: u64, st: &LatencyStats) -> String {
    let labels = ["#bytes", "#samples", "p50", "p99", "p99.9", "p99.99", "max"];
    let cells = [
        bytes.to_string(),
        st.samples.to_string(),
        format!("{:.3}", st.p50),
        format!("{:.3}", st.p99),
        format!("{:.3}", st.p99_9),
        format!("{:.3}", st.p99_99),
        format!("{:.3}", st.max),
    ];
    row_under(EXTRA_HEADER, &labels, &cells)
}

/// One row of perftest's bandwidth table.
pub fn bw_row(st: &BwStats) -> String {
    bw_row_in(st, false)
}

/// One bandwidth row, in Gbit/s with `gbits` (perftest's `--report_gbits`), else MiB/s.
pub fn bw_row_in(st: &BwStats, gbits: bool) -> String {
    let labels = ["#bytes", "#iterations", "BW peak", "BW average", "MsgRate"];
    let f = if gbits { GBITS_PER_MIB } else { 1.0 };
    let cells = [
        st.bytes.to_string(),
        st.iterations.to_string(),
        format!("{:.2}", st.bw_peak_mib * f),
        format!("{:.2}", st.bw_average_mib * f),
        format!("{:.6}", st.msg_rate_mpps),
    ];
    row_under(
        if gbits { BW_HEADER_GBITS } else { BW_HEADER },
        &labels,
        &cells,
    )
}

/// The text printed after a latency table: what the figures mean.
pub fn lat_footer(basis: LatencyBasis, rows: &[(u64, LatencyStats)]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{SEPARATOR}");
    let _ = writeln!(s, " {}", basis.sentence());
    let _ = writeln!(
        s,
        " all samples kept (perftest drops the 2 largest); t_max is the true maximum; t_stdev is a true standard deviation (f64)"
    );
    let _ = writeln!(s, "{EXTRA_HEADER}");
    for (bytes, st) in rows {
        let _ = writeln!(s, "{}", extra_row(*bytes, st));
    }
    let _ = writeln!(s, "{SEPARATOR}");
    s
}

/// JSON object of one latency result: perftest's keys first, then ours; floats rounded as
/// the text prints them ([`round_to`]).
pub fn lat_json(bytes: u64, iterations: u64, st: &LatencyStats) -> serde_json::Value {
    let (p, x) = (|v: f64| round_to(v, 2), |v: f64| round_to(v, 3));
    serde_json::json!({
        "bytes": bytes,
        "iterations": iterations,
        "t_min": p(st.min),
        "t_max": p(st.max),
        "t_typical": p(st.median),
        "t_avg": p(st.avg),
        "t_stdev": p(st.stdev),
        "percentile_99": p(st.p99),
        "percentile_99.9": p(st.p99_9),
        "p50": x(st.p50),
        "p99": x(st.p99),
        "p99_9": x(st.p99_9),
        "p99_99": x(st.p99_99),
        "max": x(st.max),
        "samples": st.samples,
    })
}

/// JSON object of one bandwidth result: perftest's keys first, then ours; floats rounded as
/// the text prints them ([`round_to`]).
pub fn bw_json(st: &BwStats) -> serde_json::Value {
    serde_json::json!({
        "bytes": st.bytes,
        "iterations": st.iterations,
        "BW_peak": round_to(st.bw_peak_mib, 2),
        "BW_average": round_to(st.bw_average_mib, 2),
        "MsgRate": round_to(st.msg_rate_mpps, 6),
        "bw_unit": BW_UNIT,
        "peak_window": st.peak_window,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats() -> LatencyStats {
        LatencyStats::from_samples(&[1.0, 2.0, 3.0, 4.0, 100.0]).unwrap()
    }

    #[test]
    fn lat_row_values_sit_under_their_headers() {
        let row = lat_row(2, 1000, &stats());
        for (label, value) in [
            ("#bytes", "2"),
            ("#iterations", "1000"),
            ("t_min", "1.00"),
            ("t_max", "100.00"),
            ("t_typical", "3.00"),
            ("t_avg", "22.00"),
        ] {
            let col = LAT_HEADER.find(label).unwrap();
            assert_eq!(&row[col..col + value.len()], value, "{label} in {row:?}");
        }
        assert_eq!(row.split_whitespace().count(), 9);
    }

    #[test]
    fn bw_row_has_five_columns() {
        let done: Vec<u64> = (1..=100).map(|i| i * 1000).collect();
        let posted = vec![0; done.len()];
        let b = BwStats::from_completions(65536, &posted, &done, true).unwrap();
        // --report_gbits: the same figures in Gbit/s under perftest's header
        let g = bw_row_in(&b, true);
        let col = BW_HEADER_GBITS.find("BW average").unwrap();
        assert!(g[col..].starts_with(&format!("{:.2}", b.bw_average_mib * GBITS_PER_MIB)));
        let row = bw_row(&b);
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cols.len(), 5, "{row}");
        assert_eq!(cols[0], "65536");
        assert_eq!(cols[1], "100");
        let col = BW_HEADER.find("BW average").unwrap();
        assert!(row[col..].starts_with(&format!("{:.2}", b.bw_average_mib)));
    }

    #[test]
    fn header_block_has_perftest_lines() {
        let h = Header {
            title: "Send Latency Test".into(),
            device: "mlx5_0 (emulated)".into(),
            connection: "RC",
            srq: false,
            tx_depth: Some(1),
            rx_depth: None,
            qps: 1,
            cq_mod: None,
            mtu: 4096,
            ethernet: false,
            gid_index: None,
            max_inline: 236,
            outstand_reads: None,
            data_ex: "Ethernet".into(),
            doorbell: "BlueFlame".into(),
            post_list: 1,
            poll: "busy".into(),
            buffers: "4 KiB pages".into(),
            local: Endpoint {
                lid: 1,
                qpn: 0x128,
                psn: 0x6f0c1c,
                rkey_vaddr: None,
                gid: None,
            },
            remote: Endpoint {
                lid: 1,
                qpn: 0x127,
                psn: 0x9a4e7f,
                rkey_vaddr: Some((0x1fd4bc, 0x7f0e0c8aa000)),
                gid: None,
            },
            more: Vec::new(),
        };
        let text = h.render();
        for needle in [
            "                    Send Latency Test\n",
            " Dual-port       : OFF\t\tDevice         : mlx5_0 (emulated)\n",
            " ibv_wr* API     : OFF\n",
            " TX depth        : 1\n",
            " Max inline data : 236[B]\n",
            " Data ex. method : Ethernet\n",
            " local address: LID 0x01 QPN 0x0128 PSN 0x6f0c1c\n",
            " remote address: LID 0x01 QPN 0x0127 PSN 0x9a4e7f RKey 0x1fd4bc VAddr 0x007f0e0c8aa000\n",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }
        assert!(!text.contains("CQ Moderation"));
        assert!(text.contains(" Link type       : IB\n") && !text.contains("GID"));
        // RoCE: perftest's link type, GID index and the GID lines (bytes in decimal)
        let mut g = [0u8; 16];
        g[10..].copy_from_slice(&[255, 255, 127, 1, 0, 2]);
        let roce = Header {
            ethernet: true,
            gid_index: Some(3),
            local: Endpoint {
                gid: Some(g),
                ..h.local.clone()
            },
            ..h
        };
        let text = roce.render();
        for needle in [
            " Link type       : Ethernet\n GID index       : 3\n",
            " local address: LID 0x01 QPN 0x0128 PSN 0x6f0c1c\n \
             GID: 00:00:00:00:00:00:00:00:00:00:255:255:127:01:00:02\n",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }
    }

    #[test]
    fn server_header_and_several_qps_as_perftest() {
        let ep = |qpn| Endpoint {
            lid: 1,
            qpn,
            psn: 0x10,
            rkey_vaddr: None,
            gid: None,
        };
        let h = Header {
            title: "Send BW Test".into(),
            device: "mlx5_0".into(),
            connection: "RC",
            srq: false,
            tx_depth: None,
            rx_depth: Some(512),
            qps: 3,
            cq_mod: Some(100),
            mtu: 4096,
            ethernet: false,
            gid_index: None,
            max_inline: 0,
            outstand_reads: None,
            data_ex: "Ethernet".into(),
            doorbell: "BlueFlame".into(),
            post_list: 1,
            poll: "busy".into(),
            buffers: "4 KiB pages".into(),
            local: ep(0x100),
            remote: ep(0x200),
            more: vec![(ep(0x101), ep(0x201)), (ep(0x102), ep(0x202))],
        };
        let text = h.render();
        assert!(text.contains(" Number of qps   : 3\t\t"), "{text}");
        assert!(text.contains(" RX depth        : 512\n"), "{text}");
        assert!(!text.contains("TX depth"), "{text}");
        // all local lines, then all remote lines, each in QP order
        let qpns: Vec<&str> = text
            .lines()
            .filter(|l| l.contains(" address: "))
            .map(|l| l.split_whitespace().nth(5).unwrap())
            .collect();
        assert_eq!(
            qpns,
            ["0x0100", "0x0101", "0x0102", "0x0200", "0x0201", "0x0202"],
            "{text}"
        );
        let locals = text.lines().filter(|l| l.starts_with(" local")).count();
        assert_eq!(locals, 3);
    }

    #[test]
    fn json_floats_are_rounded_as_printed() {
        assert_eq!(round_to(119.789_499_999_999_99, 2), 119.79);
        assert_eq!(round_to(-2.004_9, 2), -2.0);
        assert!(round_to(f64::NAN, 2).is_nan());
        let st =
            LatencyStats::from_samples(&[1.0 / 3.0, 2.0 / 3.0, 119.789_499_999_999_99]).unwrap();
        let v = lat_json(2, 3, &st);
        let text = serde_json::to_string(&v).unwrap();
        // every float has at most 3 decimals (2 in perftest's keys)
        for num in text
            .split(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter(|t| t.contains('.'))
        {
            let decimals = num.split('.').nth(1).unwrap().len();
            assert!(decimals <= 3, "{num} in {text}");
        }
        assert_eq!(v["t_max"].as_f64(), Some(119.79));
        assert_eq!(v["t_typical"].as_f64(), Some(0.67));
        assert_eq!(v["p50"].as_f64(), Some(0.667));
        let done: Vec<u64> = (1..=7).map(|i| i * 3001).collect();
        let b = BwStats::from_completions(4099, &[0; 7], &done, true).unwrap();
        let j = bw_json(&b);
        for k in ["BW_peak", "BW_average"] {
            let x = j[k].as_f64().unwrap();
            assert_eq!(x, round_to(x, 2), "{k}");
            assert!((x - b.bw_average_mib).abs() < 0.01 || k == "BW_peak");
        }
        assert_eq!(j["MsgRate"].as_f64(), Some(round_to(b.msg_rate_mpps, 6)));
        assert_eq!(j["bw_unit"], BW_UNIT);
    }

    #[test]
    fn json_carries_perftest_and_extra_keys() {
        let v = lat_json(2, 5, &stats());
        for k in [
            "t_min",
            "t_max",
            "t_typical",
            "t_avg",
            "t_stdev",
            "percentile_99",
            "percentile_99.9",
            "p50",
            "p99",
            "p99_9",
            "p99_99",
            "max",
            "samples",
        ] {
            assert!(v.get(k).is_some(), "missing {k}");
        }
        assert_eq!(v["t_max"].as_f64(), Some(100.0));
        assert_eq!(v["samples"].as_u64(), Some(5));
    }
}
