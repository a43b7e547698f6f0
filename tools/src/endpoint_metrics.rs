//! The counters of a running endpoint — its UD socket, its provider and quinn's
//! connections — as Prometheus text (exposition format 0.0.4), for
//! `qr serve --metrics ADDR` and any scraper or `qr stats`.
//!
//! The socket and provider counters are rendered from the same visitors the
//! JSON reports are (`quic_rdma::counters`), so a counter added there appears
//! here with no second list, typed as its visitor says; the lines themselves
//! are written by the helpers every `qr` `/metrics` shares (`crate::metric`).

use std::sync::Mutex;

use quic_rdma::fabric::soft::SoftPort;
use quic_rdma::quinn_adapter::RetryGate;

use crate::metric::{counter, gauge, visited};
use crate::provider::Socket;

/// quinn's per-connection counters, summed.
#[derive(Clone, Copy, Debug, Default)]
struct QuinnTotals {
    udp_tx_datagrams: u64,
    udp_tx_bytes: u64,
    udp_rx_datagrams: u64,
    udp_rx_bytes: u64,
    sent_packets: u64,
    lost_packets: u64,
    lost_bytes: u64,
    congestion_events: u64,
}

impl QuinnTotals {
    fn add(&mut self, s: &quinn::ConnectionStats) {
        self.udp_tx_datagrams += s.udp_tx.datagrams;
        self.udp_tx_bytes += s.udp_tx.bytes;
        self.udp_rx_datagrams += s.udp_rx.datagrams;
        self.udp_rx_bytes += s.udp_rx.bytes;
        self.sent_packets += s.path.sent_packets;
        self.lost_packets += s.path.lost_packets;
        self.lost_bytes += s.path.lost_bytes;
        self.congestion_events += s.path.congestion_events;
    }
}

/// Connections seen: the live ones, and the totals of those that ended.
#[derive(Default)]
struct Connections {
    live: Vec<quinn::Connection>,
    ended: QuinnTotals,
    accepted: u64,
}

/// A running endpoint's counters.
pub(crate) struct EndpointMetrics {
    socket: Socket,
    soft: Option<SoftPort>,
    gate: Option<RetryGate>,
    conns: Mutex<Connections>,
}

impl EndpointMetrics {
    /// Metrics of the endpoint on `socket` (and its `soft` port, if any).
    pub(crate) fn new(socket: Socket, soft: Option<SoftPort>) -> Self {
        EndpointMetrics {
            socket,
            soft,
            gate: None,
            conns: Mutex::default(),
        }
    }

    /// Count the Retries and unvalidated handshakes of the server's accept
    /// loop too (see [`retry_gate`]).
    pub(crate) fn with_gate(mut self, gate: RetryGate) -> Self {
        self.gate = Some(gate);
        self
    }

    fn conns(&self) -> std::sync::MutexGuard<'_, Connections> {
        self.conns.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Count `conn` (an established connection) from now on.
    pub(crate) fn track(&self, conn: &quinn::Connection) {
        let mut c = self.conns();
        c.accepted += 1;
        // Fold the connections that ended into the totals: the list stays as
        // long as the number of live connections.
        let Connections { live, ended, .. } = &mut *c;
        live.retain(|l| {
            if l.close_reason().is_some() {
                ended.add(&l.stats());
                false
            } else {
                true
            }
        });
        live.push(conn.clone());
    }

    /// Prometheus text of every counter now.
    pub(crate) fn prometheus(&self) -> String {
        let mut o = String::new();
        let stats = self.socket.stats();
        visited(&mut o, "qr_socket", &stats);
        visited(&mut o, "qr_socket", &self.socket.routing_stats());
        float_gauge(
            &mut o,
            "qr_socket_wrs_per_post",
            "Mean send work requests per doorbell",
            stats.wrs_per_post(),
        );
        let p = self.socket.peer_stats();
        for (name, help, v) in [
            ("live", "UD peers in the peer table", p.peers),
            (
                "live_limit",
                "Bound on UD peers in the peer table",
                p.max_peers,
            ),
            ("pending", "UD peers not yet confirmed", p.pending),
            (
                "pending_limit",
                "Bound on unconfirmed UD peers",
                p.max_pending,
            ),
            (
                "unvalidated",
                "UD peers whose address is not validated yet",
                p.unvalidated,
            ),
            (
                "unvalidated_limit",
                "Bound on UD peers whose address is not validated",
                p.max_unvalidated,
            ),
        ] {
            gauge(&mut o, &format!("qr_peers_{name}"), help, saturating_i64(v));
        }
        for (name, help, v) in [
            ("admitted", "UD peers admitted", p.admitted),
            (
                "evicted_pending",
                "Unconfirmed peers evicted",
                p.evicted_pending,
            ),
            (
                "evicted_unvalidated",
                "Unvalidated peers evicted to make room",
                p.evicted_unvalidated,
            ),
            (
                "expired_unvalidated",
                "Unvalidated peers dropped when their time ran out",
                p.expired_unvalidated,
            ),
            (
                "amplification_drops",
                "Datagrams to unvalidated peers dropped by the 3x amplification limit",
                p.amplification_drops,
            ),
            ("evicted_idle", "Idle peers evicted", p.evicted_idle),
            (
                "refused_full",
                "Peers refused by a full table",
                p.refused_full,
            ),
            (
                "unknown_destination",
                "Sends to an unknown peer dropped",
                p.unknown_destination,
            ),
        ] {
            counter(&mut o, &format!("qr_peers_{name}_total"), help, v);
        }
        if let Some(port) = &self.soft {
            visited(&mut o, "qr_soft", &port.stats());
        }
        let c = self.conns();
        let mut t = c.ended;
        let mut open = 0i64;
        let mut rtt_max = 0f64;
        let mut cwnd = 0u64;
        for l in &c.live {
            let s = l.stats();
            t.add(&s);
            if l.close_reason().is_none() {
                open += 1;
                rtt_max = rtt_max.max(s.path.rtt.as_secs_f64());
                cwnd += s.path.cwnd;
            }
        }
        gauge(
            &mut o,
            "qr_quinn_connections_open",
            "QUIC connections open",
            open,
        );
        counter(
            &mut o,
            "qr_quinn_connections_total",
            "QUIC connections established",
            c.accepted,
        );
        for (name, help, v) in [
            (
                "udp_tx_datagrams",
                "Datagrams quinn sent",
                t.udp_tx_datagrams,
            ),
            ("udp_tx_bytes", "Bytes quinn sent", t.udp_tx_bytes),
            (
                "udp_rx_datagrams",
                "Datagrams quinn received",
                t.udp_rx_datagrams,
            ),
            ("udp_rx_bytes", "Bytes quinn received", t.udp_rx_bytes),
            ("sent_packets", "QUIC packets sent", t.sent_packets),
            ("lost_packets", "QUIC packets declared lost", t.lost_packets),
            (
                "lost_bytes",
                "Bytes of QUIC packets declared lost",
                t.lost_bytes,
            ),
            (
                "congestion_events",
                "Congestion events",
                t.congestion_events,
            ),
        ] {
            counter(&mut o, &format!("qr_quinn_{name}_total"), help, v);
        }
        float_gauge(
            &mut o,
            "qr_quinn_rtt_max_seconds",
            "Largest smoothed RTT of the open connections",
            rtt_max,
        );
        gauge(
            &mut o,
            "qr_quinn_cwnd_bytes",
            "Congestion windows of the open connections, summed",
            cwnd as i64,
        );
        if let Some(gate) = &self.gate {
            retry_gate(&mut o, gate);
        }
        o
    }
}

/// A server's [`RetryGate`] as Prometheus text: `qr_quinn_retries_total`
/// (attempts answered with a Retry) and `qr_quinn_unvalidated_handshakes`
/// (handshakes from unvalidated addresses in flight, what `--retry auto`
/// compares with its threshold). For every command whose server has a gate.
pub(crate) fn retry_gate(o: &mut String, gate: &RetryGate) {
    counter(
        o,
        "qr_quinn_retries_total",
        "Connection attempts answered with a QUIC Retry",
        gate.retries(),
    );
    gauge(
        o,
        "qr_quinn_unvalidated_handshakes",
        "Handshakes from unvalidated addresses in flight",
        saturating_i64(gate.unvalidated_handshakes() as u64),
    );
}

/// `v` as a gauge's value.
fn saturating_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// A gauge with a fractional value.
fn float_gauge(o: &mut String, name: &str, help: &str, v: f64) {
    use std::fmt::Write as _;
    let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
}
