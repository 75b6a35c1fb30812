//! The device counters of one HCA (the mlx5 `hw_counters` and the emulator's own).

/// Device counters of one HCA. The second group is named exactly like the mlx5
/// `hw_counters` in sysfs; [`Counters::get`] looks them up by that name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// 8-byte doorbell MMIO writes consumed (send doorbells; BF included). The device
    /// samples each doorbell word: doorbells of different QPs, halves or pages between two
    /// scans all count, and a doorbell written after the device has seen the previous one's
    /// work always counts (`tests/wake.rs`); two writes to *the same* word between two scans
    /// count once (the later one wins, as it carries the newer producer index). A QP whose
    /// doorbell on a shared register was written over is recovered from its doorbell record
    /// without a count. Stepped tests see exact counts.
    pub doorbells: u64,
    /// Doorbells that came with a BlueFlame copy of the WQE (non-zero bytes beyond the
    /// doorbell word in the bfreg half). In threaded mode a scan may take a half while the
    /// CPU is still copying into it (the writer preempted mid-copy); that doorbell then
    /// counts as an 8-byte one and the lingering rest may count with the next 8-byte
    /// doorbell on that half (bounded by 1 in 2000 in `tests/wake.rs`, usually 0). Stepped
    /// mode is exact.
    pub bf_writes: u64,
    /// BlueFlame copies whose bytes differed from the WQE in the ring (stepped mode).
    pub bf_mismatches: u64,
    /// Doorbells naming a QP that does not exist in the writing context.
    pub doorbell_drops: u64,
    /// Send WQEs executed (including those completed in error, not flushed ones).
    pub wqes_executed: u64,
    /// Of those, WQEs carrying inline data.
    pub inline_wqes: u64,
    /// CQEs written (all CQs).
    pub cqes_written: u64,
    /// CQ arm doorbells received.
    pub cq_arms: u64,
    /// Completion events written to completion channels.
    pub comp_events: u64,
    /// Async events written.
    pub async_events: u64,
    /// Packets put on the fabric by this HCA.
    pub packets_sent: u64,
    /// Packets dropped (fault injection, no such destination, or any of the three kinds
    /// of hostile packet below).
    pub packets_dropped: u64,
    /// Received packets that could not be parsed: short, truncated, malformed headers, bad
    /// ICRC; and READ responses whose length does not fit the READ. Dropped.
    pub rx_bad_packets: u64,
    /// Received packets not from the connected peer: for no QP here, or for an RC/UC QP
    /// from another node or QP than the one it is connected to. Dropped.
    pub rx_foreign: u64,
    /// Responses (ACK, NAK, READ data, atomic results) naming a PSN beyond the last one
    /// the requester transmitted: forged or corrupt. Dropped.
    pub rx_out_of_window: u64,
    /// Port counter: packets put on the fabric (`port_xmit_packets`; `device/counters.rs`).
    pub port_xmit_packets: u64,
    /// Port counter: their octets as IB counts them, LRH to ICRC (`port_xmit_data` is this / 4).
    pub port_xmit_octets: u64,
    /// Port counter: packets delivered to this HCA (`port_rcv_packets`).
    pub port_rcv_packets: u64,
    /// Port counter: their octets (`port_rcv_data` is this / 4).
    pub port_rcv_octets: u64,
    /// hw_counter: packets received with a PSN beyond the expected one.
    pub out_of_sequence: u64,
    /// hw_counter: NAK-sequence-error packets received by the requester.
    pub packet_seq_err: u64,
    /// hw_counter: duplicate requests received.
    pub duplicate_request: u64,
    /// hw_counter: RNR NAKs received by the requester.
    pub rnr_nak_retry_err: u64,
    /// hw_counter: local ACK timeouts.
    pub local_ack_timeout_err: u64,
    /// hw_counter: receives dropped for lack of a receive WQE.
    pub out_of_buffer: u64,
    /// hw_counter: RDMA WRITE requests received.
    pub rx_write_requests: u64,
    /// hw_counter: RDMA READ requests received.
    pub rx_read_requests: u64,
    /// hw_counter: atomic requests received.
    pub rx_atomic_requests: u64,
    /// hw_counter: requester error CQEs (not flush).
    pub req_cqe_error: u64,
    /// hw_counter: responder error CQEs (not flush).
    pub resp_cqe_error: u64,
    /// hw_counter: requester flush CQEs.
    pub req_cqe_flush_error: u64,
    /// hw_counter: responder flush CQEs.
    pub resp_cqe_flush_error: u64,
    /// hw_counter: transport retries exceeded.
    pub req_transport_retries_exceeded: u64,
    /// hw_counter: RNR retries exceeded.
    pub req_rnr_retries_exceeded: u64,
    /// Link (PCIe model, `trace.rs`), counted only while [`Emulator::count_link`](crate::Emulator::count_link) or
    /// [`Emulator::trace`](crate::Emulator::trace) is on: MMIO writes consumed (posted writes, one per 64-byte
    /// write-combining block: doorbells, BlueFlame copies, CQ arms).
    pub mmio_writes: u64,
    /// Link: bytes of those MMIO writes.
    pub mmio_bytes: u64,
    /// Link: DMA read requests the device issued (WQE fetches, doorbell records, payload,
    /// receive WQEs).
    pub dma_read_requests: u64,
    /// Link: completions that answered them.
    pub dma_read_completions: u64,
    /// Link: bytes read by DMA.
    pub dma_read_bytes: u64,
    /// Link: DMA writes (posted writes: data placed, CQEs).
    pub dma_writes: u64,
    /// Link: bytes written by DMA.
    pub dma_write_bytes: u64,
    /// Of the DMA reads: send-WQE fetches from the ring.
    pub wqe_fetches: u64,
    /// Bytes of those WQE fetches.
    pub wqe_fetch_bytes: u64,
    /// Of the DMA reads: payload reads (send gathers, READ response data, atomic operands).
    pub payload_reads: u64,
    /// Bytes of those payload reads.
    pub payload_read_bytes: u64,
    /// Raw Ethernet: frames RAW_PACKET QPs sent.
    pub raw_tx_frames: u64,
    /// Raw Ethernet: frames placed into a RAW_PACKET QP's receive queue.
    pub raw_rx_frames: u64,
    /// Raw Ethernet: frames no steering rule matched (discarded).
    pub rx_steer_missed: u64,
    /// Raw Ethernet: frames a drop rule took.
    pub rx_steer_dropped: u64,
    /// Raw Ethernet: frames the port refused as malformed (runts, oversize).
    pub rx_raw_bad_frames: u64,
}

impl Counters {
    /// The link counters (the PCIe model of `trace.rs`), by field name.
    pub const LINK_COUNTER_NAMES: [&'static str; 11] = [
        "mmio_writes",
        "mmio_bytes",
        "dma_read_requests",
        "dma_read_completions",
        "dma_read_bytes",
        "dma_writes",
        "dma_write_bytes",
        "wqe_fetches",
        "wqe_fetch_bytes",
        "payload_reads",
        "payload_read_bytes",
    ];

    /// The mlx5 `hw_counters` names this emulator maintains.
    pub const HW_COUNTER_NAMES: [&'static str; 15] = [
        "out_of_sequence",
        "packet_seq_err",
        "duplicate_request",
        "rnr_nak_retry_err",
        "local_ack_timeout_err",
        "out_of_buffer",
        "rx_write_requests",
        "rx_read_requests",
        "rx_atomic_requests",
        "req_cqe_error",
        "resp_cqe_error",
        "req_cqe_flush_error",
        "resp_cqe_flush_error",
        "req_transport_retries_exceeded",
        "req_rnr_retries_exceeded",
    ];

    /// The mlx5 `hw_counters` as (sysfs name, value), in [`Counters::HW_COUNTER_NAMES`]
    /// order, e.g. for writing a fake `ports/1/hw_counters/` directory.
    pub fn hw_counters(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        Self::HW_COUNTER_NAMES
            .iter()
            .map(|&n| (n, self.get(n).unwrap_or(0)))
    }

    /// Look a counter up by its sysfs `hw_counters` name (or the field name).
    pub fn get(&self, name: &str) -> Option<u64> {
        Some(match name {
            "doorbells" => self.doorbells,
            "bf_writes" => self.bf_writes,
            "bf_mismatches" => self.bf_mismatches,
            "doorbell_drops" => self.doorbell_drops,
            "wqes_executed" => self.wqes_executed,
            "inline_wqes" => self.inline_wqes,
            "cqes_written" => self.cqes_written,
            "cq_arms" => self.cq_arms,
            "comp_events" => self.comp_events,
            "async_events" => self.async_events,
            "packets_sent" => self.packets_sent,
            "packets_dropped" => self.packets_dropped,
            "rx_bad_packets" => self.rx_bad_packets,
            "rx_foreign" => self.rx_foreign,
            "rx_out_of_window" => self.rx_out_of_window,
            "port_xmit_packets" => self.port_xmit_packets,
            "port_xmit_octets" => self.port_xmit_octets,
            "port_rcv_packets" => self.port_rcv_packets,
            "port_rcv_octets" => self.port_rcv_octets,
            "out_of_sequence" => self.out_of_sequence,
            "packet_seq_err" => self.packet_seq_err,
            "duplicate_request" => self.duplicate_request,
            "rnr_nak_retry_err" => self.rnr_nak_retry_err,
            "local_ack_timeout_err" => self.local_ack_timeout_err,
            "out_of_buffer" => self.out_of_buffer,
            "rx_write_requests" => self.rx_write_requests,
            "rx_read_requests" => self.rx_read_requests,
            "rx_atomic_requests" => self.rx_atomic_requests,
            "req_cqe_error" => self.req_cqe_error,
            "resp_cqe_error" => self.resp_cqe_error,
            "req_cqe_flush_error" => self.req_cqe_flush_error,
            "resp_cqe_flush_error" => self.resp_cqe_flush_error,
            "req_transport_retries_exceeded" => self.req_transport_retries_exceeded,
            "req_rnr_retries_exceeded" => self.req_rnr_retries_exceeded,
            "mmio_writes" => self.mmio_writes,
            "mmio_bytes" => self.mmio_bytes,
            "dma_read_requests" => self.dma_read_requests,
            "dma_read_completions" => self.dma_read_completions,
            "dma_read_bytes" => self.dma_read_bytes,
            "dma_writes" => self.dma_writes,
            "dma_write_bytes" => self.dma_write_bytes,
            "wqe_fetches" => self.wqe_fetches,
            "wqe_fetch_bytes" => self.wqe_fetch_bytes,
            "payload_reads" => self.payload_reads,
            "payload_read_bytes" => self.payload_read_bytes,
            "raw_tx_frames" => self.raw_tx_frames,
            "raw_rx_frames" => self.raw_rx_frames,
            "rx_steer_missed" => self.rx_steer_missed,
            "rx_steer_dropped" => self.rx_steer_dropped,
            "rx_raw_bad_frames" => self.rx_raw_bad_frames,
            _ => return None,
        })
    }
}
