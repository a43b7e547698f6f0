//! The JSON schema of `qr`'s reports: the serde structs of the client's
//! [`Report`] (`qr demo`, `qr connect`) and of the server's per-connection
//! [`ServeSummary`] (`qr serve`), and how each is filled from the counters of
//! quinn, the socket, the fabric and the `soft` port.
//!
//! The JSON key names are stable: scripts (and `.ci/run`, and `tools/tests/`)
//! read them; `qr demo --provider soft` reads the server's summary back.

use std::fmt::Write as _;
use std::time::Duration;

use quic_rdma::fabric::sim::FabricStats;
use quic_rdma::fabric::soft::SoftStats;
use quic_rdma::fabric::UdAddr;
use quic_rdma::socket::SocketStats;
use serde::{Deserialize, Serialize};

use crate::tls::TlsInfo;
use crate::workload::TransferOutcome;

/// Everything `qr demo` measured.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Report {
    /// `true` when the data arrived intact (the demo's exit code follows it).
    pub(crate) ok: bool,
    /// Provider name (`sim`, ...).
    pub(crate) provider: String,
    /// Injected loss in percent (sim).
    pub(crate) loss_percent: f64,
    /// Seed of the fabric's faults and of the data.
    pub(crate) seed: u64,
    /// The path MTU quinn used (`path.current_mtu` of the client connection).
    pub(crate) mtu: u16,
    /// The socket's (fabric's) MTU.
    pub(crate) fabric_mtu: usize,
    /// Handshake time in milliseconds (client: connect to established).
    pub(crate) handshake_ms: f64,
    /// What TLS negotiated.
    pub(crate) tls: TlsReport,
    /// The bulk transfer.
    pub(crate) transfer: TransferReport,
    /// The ping-pong.
    pub(crate) ping: PingReport,
    /// quinn's view of the client connection.
    pub(crate) quic: QuicReport,
    /// Socket counters of both sides.
    pub(crate) sockets: SocketsReport,
    /// What the fabric did to packets; `null` when the provider cannot tell.
    pub(crate) fabric: Option<FabricReport>,
    /// The UD addresses of both endpoints.
    pub(crate) endpoints: EndpointsReport,
    /// `soft` port counters (the RoCEv2 socket under each endpoint); `null` for
    /// other providers.
    pub(crate) soft: Option<SoftPortsReport>,
}

/// The UD addresses of both endpoints.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct EndpointsReport {
    /// The server's QP.
    pub(crate) server: UdEndpointReport,
    /// The client's QP.
    pub(crate) client: UdEndpointReport,
}

/// One QP's address.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct UdEndpointReport {
    /// GID (IPv6 text; IPv4-mapped for RoCEv2 over IPv4).
    pub(crate) gid: String,
    /// Queue pair number.
    pub(crate) qpn: u32,
    /// Q_Key.
    pub(crate) qkey: u32,
    /// UDP port of the RoCEv2 socket (`soft`); `null` otherwise.
    pub(crate) udp_port: Option<u16>,
}

impl UdEndpointReport {
    /// From a UD address and, for `soft`, the socket's UDP port.
    pub(crate) fn new(a: UdAddr, udp_port: Option<u16>) -> Self {
        UdEndpointReport {
            gid: a.gid.to_string(),
            qpn: a.qpn,
            qkey: a.qkey,
            udp_port,
        }
    }
}

/// `soft` port counters of both endpoints.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct SoftPortsReport {
    /// The client's port.
    pub(crate) client: SoftPortReport,
    /// The server's port (`null` when the server did not report it).
    pub(crate) server: Option<SoftPortReport>,
}

/// One `soft` port's counters (names follow `quic_rdma::fabric::soft::SoftStats`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct SoftPortReport {
    /// RoCE packets handed to the UDP socket.
    pub(crate) tx_packets: u64,
    /// UDP payload bytes handed to the socket.
    pub(crate) tx_bytes: u64,
    /// `sendmsg` calls carrying a UDP GSO batch of several packets.
    #[serde(default)]
    pub(crate) tx_gso_batches: u64,
    /// Sends lost because the socket buffer stayed full.
    pub(crate) tx_would_block: u64,
    /// Sends the kernel refused.
    pub(crate) tx_errors: u64,
    /// UDP datagrams read.
    pub(crate) rx_datagrams: u64,
    /// Packets that did not decode as RoCEv2 UD.
    pub(crate) rx_decode_errors: u64,
    /// Packets whose ICRC did not verify.
    pub(crate) rx_bad_icrc: u64,
    /// Packets above the active MTU.
    pub(crate) rx_oversize: u64,
    /// Packets whose ICRC matched only with a non-zero IPv4 ID (kernel rxe
    /// peers; packets of a soft peer's GSO batch after its first).
    pub(crate) rx_ipv4_id_solved: u64,
    /// Packets placed in a receive buffer.
    pub(crate) rx_delivered: u64,
}

impl From<&SoftStats> for SoftPortReport {
    fn from(s: &SoftStats) -> Self {
        SoftPortReport {
            tx_packets: s.tx_packets,
            tx_bytes: s.tx_bytes,
            tx_gso_batches: s.tx_gso_batches,
            tx_would_block: s.tx_would_block,
            tx_errors: s.tx_errors,
            rx_datagrams: s.rx_datagrams,
            rx_decode_errors: s.rx_decode_errors,
            rx_bad_icrc: s.rx_bad_icrc,
            rx_oversize: s.rx_oversize,
            rx_ipv4_id_solved: s.rx_ipv4_id_solved,
            rx_delivered: s.rx_delivered,
        }
    }
}

/// TLS details.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct TlsReport {
    /// "TLSv1.3".
    pub(crate) version: Option<String>,
    /// Negotiated cipher suite (see `tls::TlsInfo`).
    pub(crate) cipher_suite: Option<String>,
    /// Negotiated ALPN protocol.
    pub(crate) alpn: Option<String>,
    /// SNI the client sent and the certificate was verified for.
    pub(crate) server_name: Option<String>,
    /// The client verified the server's certificate (always true: there is no other mode).
    pub(crate) certificate_verified: bool,
}

impl From<TlsInfo> for TlsReport {
    fn from(t: TlsInfo) -> Self {
        TlsReport {
            version: t.version,
            cipher_suite: t.cipher_suite,
            alpn: t.alpn,
            server_name: t.server_name,
            certificate_verified: true,
        }
    }
}

/// The bulk transfer, client to server.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct TransferReport {
    /// Bytes the client sent.
    pub(crate) bytes: u64,
    /// Bytes the server received.
    pub(crate) bytes_received: u64,
    /// Hex sha256 of what was sent.
    pub(crate) sha256_sent: String,
    /// Hex sha256 of what arrived.
    pub(crate) sha256_received: String,
    /// Both digests and byte counts equal.
    pub(crate) sha256_match: bool,
    /// Seconds from the first write to the server's verdict.
    pub(crate) seconds: f64,
    /// Throughput in MB/s (10^6 bytes per second).
    pub(crate) mb_per_s: f64,
    /// Throughput in Gbit/s (10^9 bits per second).
    pub(crate) gbit_per_s: f64,
}

impl From<&TransferOutcome> for TransferReport {
    fn from(t: &TransferOutcome) -> Self {
        let secs = t.elapsed.as_secs_f64().max(1e-9);
        TransferReport {
            bytes: t.bytes_sent,
            bytes_received: t.bytes_received,
            sha256_sent: hex(&t.sha256_sent),
            sha256_received: hex(&t.sha256_received),
            sha256_match: t.sha256_sent == t.sha256_received && t.bytes_sent == t.bytes_received,
            seconds: secs,
            mb_per_s: t.bytes_sent as f64 / secs / 1e6,
            gbit_per_s: t.bytes_sent as f64 * 8.0 / secs / 1e9,
        }
    }
}

/// The ping-pong.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct PingReport {
    /// Round trips made.
    pub(crate) count: u32,
    /// Message size in bytes (each way).
    pub(crate) size: usize,
    /// Round-trip times in microseconds.
    pub(crate) rtt_us: RttReport,
}

/// Round-trip time distribution in microseconds (nearest-rank percentiles).
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct RttReport {
    /// Fastest.
    pub(crate) min: f64,
    /// Mean.
    pub(crate) mean: f64,
    /// Median.
    pub(crate) p50: f64,
    /// 99th percentile.
    pub(crate) p99: f64,
    /// 99.9th percentile.
    pub(crate) p999: f64,
    /// Slowest.
    pub(crate) max: f64,
}

impl RttReport {
    /// Summarise `rtts` (empty gives all zeros).
    pub(crate) fn of(rtts: &[Duration]) -> RttReport {
        if rtts.is_empty() {
            return RttReport::default();
        }
        let mut us: Vec<f64> = rtts.iter().map(|d| d.as_nanos() as f64 / 1e3).collect();
        us.sort_by(f64::total_cmp);
        // Nearest rank, in integers (per mille) so 99.9 % of 1000 is exactly 999.
        let rank = |per_mille: usize| {
            let i = (per_mille * us.len()).div_ceil(1000);
            us[i.clamp(1, us.len()) - 1]
        };
        RttReport {
            min: us[0],
            mean: us.iter().sum::<f64>() / us.len() as f64,
            p50: rank(500),
            p99: rank(990),
            p999: rank(999),
            max: us[us.len() - 1],
        }
    }
}

/// quinn's connection statistics (client side).
#[derive(Clone, Debug, Serialize)]
pub(crate) struct QuicReport {
    /// UDP-datagram-equivalents (UD messages) sent.
    pub(crate) datagrams_sent: u64,
    /// UD messages received.
    pub(crate) datagrams_received: u64,
    /// Packets quinn declared lost.
    pub(crate) lost_packets: u64,
    /// Congestion events.
    pub(crate) congestion_events: u64,
    /// Smoothed RTT at the end, microseconds.
    pub(crate) smoothed_rtt_us: f64,
}

impl From<&quinn::ConnectionStats> for QuicReport {
    fn from(s: &quinn::ConnectionStats) -> Self {
        QuicReport {
            datagrams_sent: s.udp_tx.datagrams,
            datagrams_received: s.udp_rx.datagrams,
            lost_packets: s.path.lost_packets,
            congestion_events: s.path.congestion_events,
            smoothed_rtt_us: s.path.rtt.as_secs_f64() * 1e6,
        }
    }
}

/// Socket counters of both endpoints.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct SocketsReport {
    /// The client's socket.
    pub(crate) client: SocketReport,
    /// The server's socket (`null` when the server is another process that did
    /// not report it, as with `qr connect`).
    pub(crate) server: Option<SocketReport>,
}

/// One socket's counters (names follow `quic_rdma::socket::SocketStats`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct SocketReport {
    /// Send WRs posted.
    pub(crate) sent_wrs: u64,
    /// Payload bytes posted for sending.
    pub(crate) sent_bytes: u64,
    /// `post_send` calls (doorbells).
    pub(crate) send_posts: u64,
    /// Mean send WRs per doorbell.
    pub(crate) wrs_per_post: f64,
    /// Sends posted inline.
    pub(crate) inline_sends: u64,
    /// Sends posted signaled.
    pub(crate) signaled_sends: u64,
    /// Send completions with an error.
    pub(crate) send_errors: u64,
    /// Sends refused for exceeding the MTU.
    pub(crate) mtu_refusals: u64,
    /// Sends refused for lack of room (retried).
    pub(crate) would_block: u64,
    /// Packets received and handed to quinn.
    pub(crate) recv_wrs: u64,
    /// Payload bytes received.
    pub(crate) recv_bytes: u64,
    /// Receive WRs posted.
    pub(crate) recv_wrs_posted: u64,
    /// Receive completions with an error.
    pub(crate) recv_errors: u64,
    /// Address handles created.
    pub(crate) ah_created: u64,
    /// Address handles rebuilt (peer or own GID moved).
    pub(crate) ah_rebuilt: u64,
    /// Address handles destroyed.
    pub(crate) ah_destroyed: u64,
    /// Sends that found their AH cached.
    pub(crate) ah_hits: u64,
    /// Datagrams above the active MTU sent as parts (docs/architecture.md §6).
    #[serde(default)]
    pub(crate) seg_datagrams_sent: u64,
    /// Parts sent (each one send WR).
    #[serde(default)]
    pub(crate) seg_parts_sent: u64,
    /// Datagrams reassembled from parts (counted in `recv_wrs` too).
    #[serde(default)]
    pub(crate) seg_reassembled: u64,
    /// Drops by cause.
    pub(crate) drops: DropsReport,
}

/// Drops by cause: the socket's own and the provider's.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct DropsReport {
    /// GRH area did not parse.
    pub(crate) bad_grh: u64,
    /// Immediate data did not match the CID's routing key.
    pub(crate) imm_mismatch: u64,
    /// Provider: wrong P_Key.
    pub(crate) bad_pkey: u64,
    /// Provider: wrong Q_Key.
    pub(crate) bad_qkey: u64,
    /// Provider: unknown destination QPN.
    pub(crate) unknown_qpn: u64,
    /// Provider: no receive posted (starvation).
    pub(crate) no_recv_posted: u64,
    /// Provider: larger than the receive buffer.
    pub(crate) too_long: u64,
    /// Provider: malformed on the wire.
    pub(crate) malformed: u64,
    /// Provider: datagrams shorter than a BTH, zero-length included (`soft`).
    #[serde(default)]
    pub(crate) runt: u64,
    /// Provider: dropped by the kernel, receive buffer full (`soft`).
    #[serde(default)]
    pub(crate) kernel_rx_dropped: u64,
    /// Provider: ICRC did not verify (`soft`).
    pub(crate) bad_icrc: u64,
    /// Provider: sent above the path MTU (silently dropped by "hardware").
    pub(crate) oversize_sent: u64,
    /// Segmented datagrams dropped with a part missing (timed out, or evicted
    /// for a newer one).
    #[serde(default)]
    pub(crate) seg_incomplete: u64,
    /// Parts dropped as malformed.
    #[serde(default)]
    pub(crate) seg_malformed: u64,
    /// Parts dropped as duplicates.
    #[serde(default)]
    pub(crate) seg_duplicates: u64,
}

impl DropsReport {
    /// Sum of every cause.
    pub(crate) fn total(&self) -> u64 {
        self.bad_grh
            + self.imm_mismatch
            + self.bad_pkey
            + self.bad_qkey
            + self.unknown_qpn
            + self.no_recv_posted
            + self.too_long
            + self.malformed
            + self.runt
            + self.kernel_rx_dropped
            + self.bad_icrc
            + self.oversize_sent
            + self.seg_incomplete
            + self.seg_malformed
            + self.seg_duplicates
    }
}

impl SocketReport {
    /// The counters of an adapter socket: the UD socket's and the routing check's.
    pub(crate) fn of<Q: quic_rdma::fabric::UdQueuePair>(
        sock: &quic_rdma::quinn_adapter::RdmaUdpSocket<Q>,
    ) -> Self {
        Self::new(&sock.stats(), &sock.routing_stats())
    }

    fn new(s: &SocketStats, routing: &quic_rdma::quic::routing::RoutingStats) -> Self {
        SocketReport {
            sent_wrs: s.sent_wrs,
            sent_bytes: s.sent_bytes,
            send_posts: s.send_posts,
            wrs_per_post: s.wrs_per_post(),
            inline_sends: s.inline_sends,
            signaled_sends: s.signaled_sends,
            send_errors: s.send_errors,
            mtu_refusals: s.mtu_refusals,
            would_block: s.would_block,
            recv_wrs: s.recv_packets,
            recv_bytes: s.recv_bytes,
            recv_wrs_posted: s.recv_wrs_posted,
            recv_errors: s.recv_errors,
            ah_created: s.ah_created,
            ah_rebuilt: s.ah_rebuilt,
            ah_destroyed: s.ah_destroyed,
            ah_hits: s.ah_hits,
            seg_datagrams_sent: s.seg_datagrams_sent,
            seg_parts_sent: s.seg_parts_sent,
            seg_reassembled: s.seg_reassembled,
            drops: DropsReport {
                bad_grh: s.drop_bad_grh,
                imm_mismatch: routing.imm_mismatch,
                bad_pkey: s.provider.bad_pkey,
                bad_qkey: s.provider.bad_qkey,
                unknown_qpn: s.provider.unknown_qpn,
                no_recv_posted: s.provider.no_recv_posted,
                too_long: s.provider.too_long,
                malformed: s.provider.malformed,
                runt: s.provider.runt,
                kernel_rx_dropped: s.provider.kernel_rx_dropped,
                bad_icrc: s.provider.bad_icrc,
                oversize_sent: s.provider.oversize_sent,
                seg_incomplete: s.seg_expired + s.seg_evicted,
                seg_malformed: s.seg_malformed,
                seg_duplicates: s.seg_duplicates,
            },
        }
    }
}

/// The fabric's wire counters.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct FabricReport {
    /// Packets delivered to a receive queue.
    pub(crate) delivered: u64,
    /// Packets lost by fault injection.
    pub(crate) lost: u64,
    /// Extra copies made.
    pub(crate) duplicated: u64,
    /// Packets held back so later ones overtook them.
    pub(crate) reordered: u64,
    /// Packets with a byte flipped.
    pub(crate) corrupted: u64,
    /// Packets marked ECN CE.
    pub(crate) ce_marked: u64,
    /// Packets to a GID nobody has.
    pub(crate) unreachable: u64,
}

impl From<&FabricStats> for FabricReport {
    fn from(f: &FabricStats) -> Self {
        FabricReport {
            delivered: f.delivered,
            lost: f.lost,
            duplicated: f.duplicated,
            reordered: f.reordered,
            corrupted: f.corrupted,
            ce_marked: f.ce_marked,
            unreachable: f.unreachable,
        }
    }
}

/// Lower-case hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

impl Report {
    /// One JSON object.
    pub(crate) fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a report always serialises")
    }
}

/// What the server saw of one connection (a JSON line with `qr serve --json`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct ServeSummary {
    /// The workload completed without error.
    pub(crate) ok: bool,
    /// Why not, if it did not.
    pub(crate) error: Option<String>,
    /// Provider name.
    pub(crate) provider: String,
    /// Our QP.
    pub(crate) server: UdEndpointReport,
    /// The client's QP as we saw it.
    pub(crate) client: Option<UdEndpointReport>,
    /// Bytes read on the transfer stream.
    pub(crate) bytes_received: u64,
    /// Hex sha256 of them.
    pub(crate) sha256_received: String,
    /// Bytes echoed on the ping stream.
    pub(crate) ping_bytes_echoed: u64,
    /// Server name the client asked for (SNI).
    pub(crate) server_name: Option<String>,
    /// The endpoint's socket counters (cumulative over its connections).
    pub(crate) socket: SocketReport,
    /// The `soft` port's counters (cumulative).
    pub(crate) soft: Option<SoftPortReport>,
}

impl ServeSummary {
    /// One JSON line.
    pub(crate) fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a summary always serialises")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_nearest_rank() {
        let rtts: Vec<Duration> = (1..=1000).map(Duration::from_micros).collect();
        let r = RttReport::of(&rtts);
        assert_eq!(r.min, 1.0);
        assert_eq!(r.p50, 500.0);
        assert_eq!(r.p99, 990.0);
        assert_eq!(r.p999, 999.0);
        assert_eq!(r.max, 1000.0);
        assert_eq!(RttReport::of(&[]).p50, 0.0);
    }

    #[test]
    fn lower_case_hex() {
        assert_eq!(hex(&[0, 0xab, 0x10]), "00ab10");
    }
}
