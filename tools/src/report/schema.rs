//! The JSON schema of `qr`'s reports: the serde structs of the client's
//! [`Report`] (`qr demo`, `qr connect`) and of the server's per-connection
//! [`ServeSummary`] (`qr serve`), and how each is filled from the counters of
//! quinn, the socket, the fabric and the `soft` port.
//!
//! The JSON key names are stable: scripts (and `.ci/run`, and `tools/tests/`)
//! read them; `qr demo --provider soft` reads the server's summary back.

use std::fmt::Write as _;
use std::time::Duration;

use quic_rdma::counters::Counters;
use quic_rdma::fabric::sim::FabricStats;
use quic_rdma::fabric::soft::SoftStats;
use quic_rdma::fabric::UdAddr;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

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

/// One `soft` port's counters: generated from `SoftStats`' visitor.
pub(crate) type SoftPortReport = CounterReport;

impl From<&SoftStats> for CounterReport {
    fn from(s: &SoftStats) -> Self {
        CounterReport::of(&[s])
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

/// One socket's counters: generated from the visitors of `SocketStats` and
/// the routing check (`quic_rdma::counters`), plus the derived
/// `wrs_per_post`.
pub(crate) type SocketReport = CounterReport;

/// The visited values of one or more stats structs as a JSON object:
/// `{name: value, group: {name: value}}`. Kept as JSON rather than as a struct
/// so that a counter added to a visitor needs no field here: the JSON report,
/// the human table and the server summary `qr demo` reads back all follow.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub(crate) struct CounterReport(Map<String, Value>);

impl CounterReport {
    /// The values `sources` visit, in visiting order within each group.
    pub(crate) fn of(sources: &[&dyn Counters]) -> Self {
        let mut m = Map::new();
        for c in sources {
            c.visit(&mut |x| {
                let into = match x.group {
                    None => &mut m,
                    Some(g) => match m.entry(g).or_insert_with(|| Value::Object(Map::new())) {
                        Value::Object(o) => o,
                        _ => unreachable!("a group key holds an object"),
                    },
                };
                into.insert(x.name.to_string(), Value::from(x.value));
            });
        }
        CounterReport(m)
    }

    /// The counters of an adapter socket: the UD socket's and the routing check's.
    pub(crate) fn socket<Q: quic_rdma::fabric::UdQueuePair>(
        sock: &quic_rdma::quinn_adapter::RdmaUdpSocket<Q>,
    ) -> Self {
        let s = sock.stats();
        let mut r = CounterReport::of(&[&s, &sock.routing_stats()]);
        r.0.insert("wrs_per_post".into(), Value::from(s.wrs_per_post()));
        r
    }

    /// The value of `name` in `group` (0 when absent: a report from an older
    /// `qr` that did not have the counter yet).
    pub(crate) fn get(&self, group: Option<&str>, name: &str) -> f64 {
        let m = match group {
            None => Some(&self.0),
            Some(g) => self.0.get(g).and_then(Value::as_object),
        };
        m.and_then(|m| m.get(name))
            .and_then(Value::as_f64)
            .unwrap_or(0.0)
    }

    /// Sum of group `group`'s values (`drops`: every drop by any cause).
    pub(crate) fn group_total(&self, group: &str) -> u64 {
        self.0
            .get(group)
            .and_then(Value::as_object)
            .map_or(0, |m| m.values().filter_map(Value::as_u64).sum())
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
