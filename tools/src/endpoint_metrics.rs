//! The counters of a running endpoint — its UD socket, its peer table, its
//! provider and quinn's connections — as Prometheus text, for
//! `qr serve --metrics ADDR` and any scraper or `qr stats`.
//!
//! Every value is listed by a visitor (`quic_rdma::counters`): the socket's
//! and provider's are the ones the JSON reports use, the peer table's and
//! quinn's are below, so a counter added there appears here with no second
//! list, typed as its visitor says; the text is written by `crate::metric`.

use std::sync::Mutex;

use quic_rdma::counters::{Counters, Metric};
use quic_rdma::fabric::soft::SoftPort;
use quic_rdma::quinn_adapter::RetryGate;

use crate::metric::Text;
use crate::provider::Socket;

/// quinn's connections: how many are open and were accepted, their
/// counters summed, and their congestion windows (the first two and the last
/// are set at the scrape; the totals of ended connections keep them 0).
#[derive(Clone, Copy, Debug, Default)]
struct QuinnTotals {
    connections_open: u64,
    connections: u64,
    udp_tx_datagrams: u64,
    udp_tx_bytes: u64,
    udp_rx_datagrams: u64,
    udp_rx_bytes: u64,
    sent_packets: u64,
    lost_packets: u64,
    lost_bytes: u64,
    congestion_events: u64,
    cwnd_bytes: u64,
}

/// The names `qr serve` has always exported (`qr_quinn_*`).
impl Counters for QuinnTotals {
    fn visit(&self, f: &mut dyn FnMut(Metric)) {
        quic_rdma::visit_fields!(f, self, None;
            connections_open: Gauge, Count, "QUIC connections open";
            connections: Counter, Count, "QUIC connections established";
            udp_tx_datagrams: Counter, Count, "Datagrams quinn sent";
            udp_tx_bytes: Counter, Bytes, "Bytes quinn sent";
            udp_rx_datagrams: Counter, Count, "Datagrams quinn received";
            udp_rx_bytes: Counter, Bytes, "Bytes quinn received";
            sent_packets: Counter, Count, "QUIC packets sent";
            lost_packets: Counter, Count, "QUIC packets declared lost";
            lost_bytes: Counter, Bytes, "Bytes of QUIC packets declared lost";
            congestion_events: Counter, Count, "Congestion events";
            cwnd_bytes: Gauge, Bytes, "Congestion windows of the open connections, summed";
        );
    }
}

/// A server's [`RetryGate`] now.
struct GateNow {
    retries: u64,
    unvalidated_handshakes: u64,
}

impl Counters for GateNow {
    fn visit(&self, f: &mut dyn FnMut(Metric)) {
        quic_rdma::visit_fields!(f, self, None;
            retries: Counter, Count, "Connection attempts answered with a QUIC Retry";
            unvalidated_handshakes: Gauge, Count, "Handshakes from unvalidated addresses in flight";
        );
    }
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

/// Connections seen: the live ones, and the totals of those that ended
/// (with the count of every connection accepted).
#[derive(Default)]
struct Connections {
    live: Vec<quinn::Connection>,
    ended: QuinnTotals,
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
        c.ended.connections += 1;
        // Fold the connections that ended into the totals: the list stays as
        // long as the number of live connections.
        let Connections { live, ended } = &mut *c;
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
        let stats = self.socket.stats();
        let mut text = Text::default()
            .visited("qr_socket", &stats)
            .visited("qr_socket", &self.socket.routing_stats())
            .float_gauges(
                "qr_socket_wrs_per_post",
                "Mean send work requests per doorbell",
                "",
                [("", stats.wrs_per_post())],
            )
            .visited("qr_peers", &self.socket.peer_stats());
        if let Some(port) = &self.soft {
            text = text.visited("qr_soft", &port.stats());
        }
        let c = self.conns();
        let mut now = c.ended;
        let mut rtt_max = 0f64;
        for l in &c.live {
            let s = l.stats();
            now.add(&s);
            if l.close_reason().is_none() {
                now.connections_open += 1;
                rtt_max = rtt_max.max(s.path.rtt.as_secs_f64());
                now.cwnd_bytes += s.path.cwnd;
            }
        }
        let mut o = text
            .visited("qr_quinn", &now)
            .float_gauges(
                "qr_quinn_rtt_max_seconds",
                "Largest smoothed RTT of the open connections",
                "",
                [("", rtt_max)],
            )
            .render();
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
    let now = GateNow {
        retries: gate.retries(),
        unvalidated_handshakes: gate.unvalidated_handshakes() as u64,
    };
    o.push_str(&Text::default().visited("qr_quinn", &now).render());
}
