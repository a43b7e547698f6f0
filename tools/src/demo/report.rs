//! The demo's result: one serialisable [`Report`], printed for humans or as JSON.
//!
//! The JSON key names are stable: scripts (and `.ci/run`) read them.

use std::fmt::{self, Write as _};
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
    /// Negotiated cipher suite (see `tls::SuiteProbe`).
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
    }
}

impl SocketReport {
    /// The counters of an adapter socket: the UD socket's and the routing check's.
    pub(crate) fn of<Q: quic_rdma::fabric::UdQueuePair>(
        sock: &quic_rdma::quinn_adapter::RdmaUdpSocket<Q>,
    ) -> Self {
        Self::new(&sock.stats(), &sock.routing_stats())
    }

    fn new(s: &SocketStats, routing: &quic_rdma::routing::RoutingStats) -> Self {
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

/// `n` bytes in the largest binary unit that keeps it readable.
fn size(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

impl Report {
    /// One JSON object.
    pub(crate) fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a report always serialises")
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = &self.transfer;
        let opt = |o: &Option<String>| o.clone().unwrap_or_else(|| "(not reported)".into());
        writeln!(
            f,
            "qr demo: QUIC over RDMA UD, provider `{}`{}",
            self.provider,
            if self.provider != "sim" {
                format!(
                    " (server {} QPN {:#x}, client {} QPN {:#x}, Q_Key {:#x})",
                    self.endpoints.server.gid,
                    self.endpoints.server.qpn,
                    self.endpoints.client.gid,
                    self.endpoints.client.qpn,
                    self.endpoints.server.qkey
                )
            } else if self.loss_percent > 0.0 {
                format!(
                    " (hostile fabric: {}% loss + dup + reorder, seed {})",
                    self.loss_percent, self.seed
                )
            } else {
                " (ideal fabric)".into()
            }
        )?;
        writeln!(f)?;
        writeln!(
            f,
            "  result        {}",
            if self.ok {
                "OK: the data arrived intact"
            } else {
                "FAILED: the data did not arrive intact"
            }
        )?;
        writeln!(
            f,
            "  handshake     {:.3} ms, {} {}, ALPN {}, certificate verified for \"{}\"",
            self.handshake_ms,
            opt(&self.tls.version),
            opt(&self.tls.cipher_suite),
            opt(&self.tls.alpn),
            opt(&self.tls.server_name),
        )?;
        writeln!(
            f,
            "  path MTU      {} bytes (fabric MTU {})",
            self.mtu, self.fabric_mtu
        )?;
        writeln!(f)?;
        writeln!(
            f,
            "  transfer      {} ({} bytes) client -> server, received {} bytes",
            size(t.bytes),
            t.bytes,
            t.bytes_received
        )?;
        writeln!(f, "    sha256 sent     {}", t.sha256_sent)?;
        writeln!(
            f,
            "    sha256 received {}  {}",
            t.sha256_received,
            if t.sha256_match { "MATCH" } else { "MISMATCH" }
        )?;
        writeln!(
            f,
            "    throughput      {:.1} MB/s = {:.3} Gbit/s ({:.3} s)",
            t.mb_per_s, t.gbit_per_s, t.seconds
        )?;
        let r = &self.ping.rtt_us;
        writeln!(
            f,
            "  ping-pong     {} round trips of {} bytes on one stream",
            self.ping.count, self.ping.size
        )?;
        writeln!(
            f,
            "    RTT (us)        p50 {:.1}  p99 {:.1}  p999 {:.1}  (min {:.1}, mean {:.1}, max {:.1})",
            r.p50, r.p99, r.p999, r.min, r.mean, r.max
        )?;
        let q = &self.quic;
        writeln!(
            f,
            "  quinn         {} datagrams sent, {} received, {} lost packets, {} congestion events, srtt {:.1} us",
            q.datagrams_sent, q.datagrams_received, q.lost_packets, q.congestion_events, q.smoothed_rtt_us
        )?;
        writeln!(f)?;
        writeln!(f, "  socket counters          client          server")?;
        let c = &self.sockets.client;
        let sv = self.sockets.server.as_ref();
        let row = |f: &mut fmt::Formatter<'_>, name: &str, a: u64, b: Option<u64>| match b {
            Some(b) => writeln!(f, "    {name:<20} {a:>12}    {b:>12}"),
            None => writeln!(f, "    {name:<20} {a:>12}    {:>12}", "-"),
        };
        let sf = |g: fn(&SocketReport) -> u64| sv.map(g);
        row(f, "sent WRs", c.sent_wrs, sf(|s| s.sent_wrs))?;
        row(f, "sent bytes", c.sent_bytes, sf(|s| s.sent_bytes))?;
        row(f, "doorbells", c.send_posts, sf(|s| s.send_posts))?;
        match sv {
            Some(s) => writeln!(
                f,
                "    {:<20} {:>12.2}    {:>12.2}",
                "WRs per post", c.wrs_per_post, s.wrs_per_post
            )?,
            None => writeln!(
                f,
                "    {:<20} {:>12.2}    {:>12}",
                "WRs per post", c.wrs_per_post, "-"
            )?,
        }
        row(f, "inline sends", c.inline_sends, sf(|s| s.inline_sends))?;
        row(
            f,
            "signaled sends",
            c.signaled_sends,
            sf(|s| s.signaled_sends),
        )?;
        row(f, "send errors", c.send_errors, sf(|s| s.send_errors))?;
        row(f, "MTU refusals", c.mtu_refusals, sf(|s| s.mtu_refusals))?;
        row(f, "would block", c.would_block, sf(|s| s.would_block))?;
        row(f, "recv WRs", c.recv_wrs, sf(|s| s.recv_wrs))?;
        row(f, "recv bytes", c.recv_bytes, sf(|s| s.recv_bytes))?;
        row(
            f,
            "recv WRs posted",
            c.recv_wrs_posted,
            sf(|s| s.recv_wrs_posted),
        )?;
        row(f, "recv errors", c.recv_errors, sf(|s| s.recv_errors))?;
        row(f, "AHs created", c.ah_created, sf(|s| s.ah_created))?;
        row(f, "AHs rebuilt", c.ah_rebuilt, sf(|s| s.ah_rebuilt))?;
        row(f, "AHs destroyed", c.ah_destroyed, sf(|s| s.ah_destroyed))?;
        row(f, "AH cache hits", c.ah_hits, sf(|s| s.ah_hits))?;
        let cd = &c.drops;
        let sd = |g: fn(&DropsReport) -> u64| sv.map(|s| g(&s.drops));
        row(f, "drops (total)", cd.total(), sd(DropsReport::total))?;
        row(f, "  bad GRH", cd.bad_grh, sd(|d| d.bad_grh))?;
        row(f, "  imm mismatch", cd.imm_mismatch, sd(|d| d.imm_mismatch))?;
        row(f, "  provider P_Key", cd.bad_pkey, sd(|d| d.bad_pkey))?;
        row(f, "  provider Q_Key", cd.bad_qkey, sd(|d| d.bad_qkey))?;
        row(f, "  provider QPN", cd.unknown_qpn, sd(|d| d.unknown_qpn))?;
        row(
            f,
            "  provider no recv",
            cd.no_recv_posted,
            sd(|d| d.no_recv_posted),
        )?;
        row(f, "  provider too long", cd.too_long, sd(|d| d.too_long))?;
        row(f, "  provider malformed", cd.malformed, sd(|d| d.malformed))?;
        row(f, "  provider runt", cd.runt, sd(|d| d.runt))?;
        row(
            f,
            "  kernel rcvbuf full",
            cd.kernel_rx_dropped,
            sd(|d| d.kernel_rx_dropped),
        )?;
        row(f, "  provider bad ICRC", cd.bad_icrc, sd(|d| d.bad_icrc))?;
        row(
            f,
            "  provider oversize",
            cd.oversize_sent,
            sd(|d| d.oversize_sent),
        )?;
        if let Some(soft) = &self.soft {
            writeln!(f)?;
            writeln!(f, "  soft port (RoCEv2/UDP)   client          server")?;
            let c = &soft.client;
            let sv = soft.server.as_ref();
            let sp = |g: fn(&SoftPortReport) -> u64| sv.map(g);
            row(f, "tx packets", c.tx_packets, sp(|s| s.tx_packets))?;
            row(f, "tx bytes", c.tx_bytes, sp(|s| s.tx_bytes))?;
            row(
                f,
                "tx GSO batches",
                c.tx_gso_batches,
                sp(|s| s.tx_gso_batches),
            )?;
            row(
                f,
                "tx would block",
                c.tx_would_block,
                sp(|s| s.tx_would_block),
            )?;
            row(f, "tx errors", c.tx_errors, sp(|s| s.tx_errors))?;
            row(f, "rx datagrams", c.rx_datagrams, sp(|s| s.rx_datagrams))?;
            row(f, "rx delivered", c.rx_delivered, sp(|s| s.rx_delivered))?;
            row(
                f,
                "rx decode errors",
                c.rx_decode_errors,
                sp(|s| s.rx_decode_errors),
            )?;
            row(f, "rx bad ICRC", c.rx_bad_icrc, sp(|s| s.rx_bad_icrc))?;
            row(f, "rx oversize", c.rx_oversize, sp(|s| s.rx_oversize))?;
            row(
                f,
                "rx IPv4 ID solved",
                c.rx_ipv4_id_solved,
                sp(|s| s.rx_ipv4_id_solved),
            )?;
        }
        writeln!(f)?;
        match &self.fabric {
            Some(w) => writeln!(
                f,
                "  fabric        {} delivered, {} lost, {} duplicated, {} reordered, {} corrupted, {} CE-marked, {} unreachable",
                w.delivered, w.lost, w.duplicated, w.reordered, w.corrupted, w.ce_marked, w.unreachable
            ),
            None => writeln!(f, "  fabric        (this provider has no wire counters)"),
        }
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
    fn sizes_and_hex() {
        assert_eq!(size(64 << 20), "64.00 MiB");
        assert_eq!(size(12), "12 B");
        assert_eq!(hex(&[0, 0xab, 0x10]), "00ab10");
    }
}
