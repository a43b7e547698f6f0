//! The gateway's counters, and their Prometheus text (rendered with the same
//! helpers as every `/metrics` of `qr`, `crate::metric`).
//!
//! Every datagram the gateway reads is either forwarded or counted as one kind
//! of drop, so the counters reconcile (see [`GatewaySnapshot::unaccounted`]):
//! `udp_rx + fabric_rx = udp_tx + fabric_tx + drops`; and what clients sent
//! the listening UDP socket is `udp_rx + udp_kernel_drops` (datagrams the
//! kernel dropped before the gateway could read them).

use crate::metric::{counter, gauge, Counter, Gauge};

/// Live counters, shared by the gateway's tasks.
#[derive(Debug, Default)]
pub struct GatewayStats {
    /// Datagrams read from UDP sockets (listener or per-client).
    pub udp_rx: Counter,
    /// Datagrams sent on UDP sockets.
    pub udp_tx: Counter,
    /// Datagrams received from the fabric.
    pub fabric_rx: Counter,
    /// Datagrams posted to the fabric.
    pub fabric_tx: Counter,
    /// Bytes read from UDP.
    pub udp_rx_bytes: Counter,
    /// Bytes received from the fabric.
    pub fabric_rx_bytes: Counter,
    /// Bytes sent on UDP.
    pub udp_tx_bytes: Counter,
    /// Bytes posted to the fabric.
    pub fabric_tx_bytes: Counter,
    /// The listening UDP socket's inode, whose kernel drop counter is read
    /// at each snapshot ([`super::udp_socket::kernel_drops`]).
    pub udp_listener_inode: std::sync::OnceLock<u64>,
    /// The listening UDP socket's receive buffer, as the kernel granted it.
    pub udp_recv_buffer_bytes: Gauge,
    /// UDP datagrams larger than the fabric MTU: dropped (the UD MTU is a hard
    /// limit — a UD message is never fragmented, IBA 9.7.7.2.1). QUIC's path MTU
    /// discovery (RFC 9000 §14.3, RFC 8899) sees a lost probe and settles below.
    pub drop_too_big: Counter,
    /// Datagrams of new clients refused because the table was full.
    pub drop_refused: Counter,
    /// Datagrams from someone other than the client's target (a per-client
    /// queue pair or socket answers to its target only).
    pub drop_foreign: Counter,
    /// Datagrams the fabric socket would not take (send error, or no room within
    /// the wait): lost packets to QUIC.
    pub drop_fabric_send: Counter,
    /// Datagrams a UDP send failed on.
    pub drop_udp_send: Counter,
    /// New clients whose resources (queue pair, UDP socket) could not be made.
    pub drop_client_setup: Counter,
    /// Datagrams from unknown sources that are not a client Initial (junk,
    /// short headers, truncated or unknown-version Initials): no state made.
    pub drop_not_initial: Counter,
    /// Initials from a source IP (or GID) that already has its share of clients.
    pub drop_source_limit: Counter,
    /// Datagrams to an unvalidated client beyond 3× what it sent (RFC 9000 §8.1).
    pub drop_amplification: Counter,
    /// Clients admitted (unvalidated).
    pub clients_admitted: Counter,
    /// Clients that proved their address.
    pub clients_validated: Counter,
    /// Unvalidated clients evicted to make room for newer ones.
    pub clients_evicted: Counter,
    /// Unvalidated clients removed when their time ran out.
    pub clients_expired_unvalidated: Counter,
    /// Validated clients removed after the idle timeout.
    pub clients_expired: Counter,
    /// Clients in the table now, both tiers.
    pub clients_active: Gauge,
    /// Unvalidated clients in the table now.
    pub clients_unvalidated: Gauge,
}

/// A copy of the counters at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct GatewaySnapshot {
    /// See [`GatewayStats::udp_rx`].
    pub udp_rx: u64,
    /// See [`GatewayStats::udp_tx`].
    pub udp_tx: u64,
    /// See [`GatewayStats::fabric_rx`].
    pub fabric_rx: u64,
    /// See [`GatewayStats::fabric_tx`].
    pub fabric_tx: u64,
    /// See [`GatewayStats::udp_rx_bytes`].
    pub udp_rx_bytes: u64,
    /// See [`GatewayStats::fabric_rx_bytes`].
    pub fabric_rx_bytes: u64,
    /// See [`GatewayStats::udp_tx_bytes`].
    pub udp_tx_bytes: u64,
    /// See [`GatewayStats::fabric_tx_bytes`].
    pub fabric_tx_bytes: u64,
    /// Datagrams the kernel dropped on the listening UDP socket before the
    /// gateway read them (receive buffer full): outside `unaccounted`, as
    /// the gateway never saw them; what clients sent = `udp_rx` + this.
    pub udp_kernel_drops: u64,
    /// See [`GatewayStats::udp_recv_buffer_bytes`].
    pub udp_recv_buffer_bytes: i64,
    /// See [`GatewayStats::drop_too_big`].
    pub drop_too_big: u64,
    /// See [`GatewayStats::drop_refused`].
    pub drop_refused: u64,
    /// See [`GatewayStats::drop_foreign`].
    pub drop_foreign: u64,
    /// See [`GatewayStats::drop_fabric_send`].
    pub drop_fabric_send: u64,
    /// See [`GatewayStats::drop_udp_send`].
    pub drop_udp_send: u64,
    /// See [`GatewayStats::drop_client_setup`].
    pub drop_client_setup: u64,
    /// See [`GatewayStats::drop_not_initial`].
    pub drop_not_initial: u64,
    /// See [`GatewayStats::drop_source_limit`].
    pub drop_source_limit: u64,
    /// See [`GatewayStats::drop_amplification`].
    pub drop_amplification: u64,
    /// See [`GatewayStats::clients_admitted`].
    pub clients_admitted: u64,
    /// See [`GatewayStats::clients_validated`].
    pub clients_validated: u64,
    /// See [`GatewayStats::clients_evicted`].
    pub clients_evicted: u64,
    /// See [`GatewayStats::clients_expired_unvalidated`].
    pub clients_expired_unvalidated: u64,
    /// See [`GatewayStats::clients_expired`].
    pub clients_expired: u64,
    /// See [`GatewayStats::clients_active`].
    pub clients_active: i64,
    /// See [`GatewayStats::clients_unvalidated`].
    pub clients_unvalidated: i64,
}

impl GatewaySnapshot {
    /// Every drop, of any kind.
    pub fn drops(&self) -> u64 {
        self.drop_too_big
            + self.drop_refused
            + self.drop_foreign
            + self.drop_fabric_send
            + self.drop_udp_send
            + self.drop_client_setup
            + self.drop_not_initial
            + self.drop_source_limit
            + self.drop_amplification
    }

    /// Datagrams read but neither forwarded nor counted as dropped: 0 once
    /// traffic has stopped (a datagram being forwarded at the moment of the
    /// snapshot is the only legitimate difference).
    pub fn unaccounted(&self) -> i128 {
        i128::from(self.udp_rx) + i128::from(self.fabric_rx)
            - i128::from(self.udp_tx)
            - i128::from(self.fabric_tx)
            - i128::from(self.drops())
    }
}

impl GatewayStats {
    /// The counters now.
    pub fn snapshot(&self) -> GatewaySnapshot {
        GatewaySnapshot {
            udp_rx: self.udp_rx.get(),
            udp_tx: self.udp_tx.get(),
            fabric_rx: self.fabric_rx.get(),
            fabric_tx: self.fabric_tx.get(),
            udp_rx_bytes: self.udp_rx_bytes.get(),
            fabric_rx_bytes: self.fabric_rx_bytes.get(),
            udp_tx_bytes: self.udp_tx_bytes.get(),
            fabric_tx_bytes: self.fabric_tx_bytes.get(),
            udp_kernel_drops: self
                .udp_listener_inode
                .get()
                .and_then(|i| super::udp_socket::kernel_drops(*i))
                .unwrap_or(0),
            udp_recv_buffer_bytes: self.udp_recv_buffer_bytes.get(),
            drop_too_big: self.drop_too_big.get(),
            drop_refused: self.drop_refused.get(),
            drop_foreign: self.drop_foreign.get(),
            drop_fabric_send: self.drop_fabric_send.get(),
            drop_udp_send: self.drop_udp_send.get(),
            drop_client_setup: self.drop_client_setup.get(),
            drop_not_initial: self.drop_not_initial.get(),
            drop_source_limit: self.drop_source_limit.get(),
            drop_amplification: self.drop_amplification.get(),
            clients_admitted: self.clients_admitted.get(),
            clients_validated: self.clients_validated.get(),
            clients_evicted: self.clients_evicted.get(),
            clients_expired_unvalidated: self.clients_expired_unvalidated.get(),
            clients_expired: self.clients_expired.get(),
            clients_active: self.clients_active.get(),
            clients_unvalidated: self.clients_unvalidated.get(),
        }
    }

    /// Prometheus text exposition (format 0.0.4), every name prefixed `qr_gateway_`.
    pub fn prometheus(&self) -> String {
        let s = self.snapshot();
        let mut o = String::new();
        for (name, help, v) in [
            (
                "udp_rx_datagrams_total",
                "Datagrams read from UDP",
                s.udp_rx,
            ),
            ("udp_tx_datagrams_total", "Datagrams sent on UDP", s.udp_tx),
            (
                "fabric_rx_datagrams_total",
                "Datagrams received from the fabric",
                s.fabric_rx,
            ),
            (
                "fabric_tx_datagrams_total",
                "Datagrams posted to the fabric",
                s.fabric_tx,
            ),
            ("udp_rx_bytes_total", "Bytes read from UDP", s.udp_rx_bytes),
            (
                "fabric_rx_bytes_total",
                "Bytes received from the fabric",
                s.fabric_rx_bytes,
            ),
            ("udp_tx_bytes_total", "Bytes sent on UDP", s.udp_tx_bytes),
            (
                "fabric_tx_bytes_total",
                "Bytes posted to the fabric",
                s.fabric_tx_bytes,
            ),
            (
                "udp_kernel_drops_total",
                "Datagrams the kernel dropped on the listening UDP socket (receive buffer full)",
                s.udp_kernel_drops,
            ),
            (
                "drop_too_big_total",
                "UDP datagrams larger than the fabric MTU, dropped",
                s.drop_too_big,
            ),
            (
                "drop_refused_total",
                "Datagrams of clients refused by a full table",
                s.drop_refused,
            ),
            (
                "drop_foreign_total",
                "Datagrams from other than a client's target",
                s.drop_foreign,
            ),
            (
                "drop_fabric_send_total",
                "Datagrams the fabric socket did not take",
                s.drop_fabric_send,
            ),
            (
                "drop_udp_send_total",
                "Datagrams a UDP send failed on",
                s.drop_udp_send,
            ),
            (
                "drop_client_setup_total",
                "Datagrams of clients whose QP or socket could not be made",
                s.drop_client_setup,
            ),
            (
                "drop_not_initial_total",
                "Datagrams from unknown sources that are not a client Initial",
                s.drop_not_initial,
            ),
            (
                "drop_source_limit_total",
                "Initials refused by the per-source client limit",
                s.drop_source_limit,
            ),
            (
                "drop_amplification_total",
                "Datagrams to unvalidated clients beyond 3x what they sent",
                s.drop_amplification,
            ),
            (
                "clients_admitted_total",
                "Clients admitted (unvalidated)",
                s.clients_admitted,
            ),
            (
                "clients_validated_total",
                "Clients that proved their address",
                s.clients_validated,
            ),
            (
                "clients_evicted_total",
                "Unvalidated clients evicted to make room",
                s.clients_evicted,
            ),
            (
                "clients_expired_unvalidated_total",
                "Unvalidated clients expired",
                s.clients_expired_unvalidated,
            ),
            (
                "clients_expired_total",
                "Validated clients expired after the idle timeout",
                s.clients_expired,
            ),
        ] {
            counter(&mut o, &format!("qr_gateway_{name}"), help, v);
        }
        gauge(
            &mut o,
            "qr_gateway_clients_active",
            "Clients in the table",
            s.clients_active,
        );
        gauge(
            &mut o,
            "qr_gateway_udp_recv_buffer_bytes",
            "Receive buffer of the listening UDP socket, as the kernel granted it",
            s.udp_recv_buffer_bytes,
        );
        gauge(
            &mut o,
            "qr_gateway_clients_unvalidated",
            "Unvalidated clients in the table",
            s.clients_unvalidated,
        );
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metric::sample;

    #[test]
    fn prometheus_text_carries_every_counter_and_reconciles() {
        let st = GatewayStats::default();
        st.udp_rx.add(10);
        st.fabric_tx.add(7);
        st.drop_too_big.add(2);
        st.drop_refused.inc();
        st.drop_not_initial.add(4);
        st.udp_rx.add(4);
        st.clients_active.add(3);
        let snap = st.snapshot();
        assert_eq!(snap.unaccounted(), 0);
        let t = st.prometheus();
        assert_eq!(sample(&t, "qr_gateway_udp_rx_datagrams_total"), Some(14.0));
        assert_eq!(sample(&t, "qr_gateway_drop_too_big_total"), Some(2.0));
        assert_eq!(sample(&t, "qr_gateway_clients_active"), Some(3.0));
        assert_eq!(sample(&t, "qr_gateway_drop_not_initial_total"), Some(4.0));
        assert_eq!(sample(&t, "qr_gateway_clients_unvalidated"), Some(0.0));
        assert!(t.contains("# TYPE qr_gateway_clients_active gauge"));
        st.udp_rx.inc();
        assert_eq!(
            st.snapshot().unaccounted(),
            1,
            "a datagram neither sent nor dropped"
        );
    }
}
