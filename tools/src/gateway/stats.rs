//! The gateway's counters, and their Prometheus text (generated from the
//! snapshot's visitor, `quic_rdma::counters`, like every `/metrics` of `qr`).
//!
//! Every datagram the gateway reads is either forwarded or counted as one kind
//! of drop, so the counters reconcile (see [`GatewaySnapshot::unaccounted`]):
//! `udp_rx + fabric_rx = udp_tx + fabric_tx + drops`; and what clients sent
//! the listening UDP socket is `udp_rx + udp_kernel_drops` (datagrams the
//! kernel dropped before the gateway could read them).

use quic_rdma::counters::{Counters, Metric};

use crate::metric::{Counter, Gauge, Text};

/// Declares, from one list, the live counters ([`GatewayStats`]), their copy
/// at one moment ([`GatewaySnapshot`]), the copy itself
/// ([`GatewayStats::snapshot`]) and the snapshot's visitor: a counter is added
/// in one line, and no copy or output can miss it. A line is `field [=>
/// exported name] [in LiveType]: Kind, Unit, "help";` after its docs; the live
/// type is the kind's (`Counter`, `Gauge`) unless named.
macro_rules! gateway_counters {
    ($($(#[doc = $doc:literal])*
       $field:ident $(=> $name:ident)? $(in $live:ident)?: $kind:ident, $unit:ident, $help:literal;)*) => {
        /// Live counters, shared by the gateway's tasks.
        #[derive(Debug, Default)]
        pub struct GatewayStats {
            $($(#[doc = $doc])* pub $field: gateway_counters!(@live $kind $($live)?),)*
        }

        /// A copy of the counters at one moment.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        #[non_exhaustive]
        pub struct GatewaySnapshot {
            $($(#[doc = $doc])* pub $field: gateway_counters!(@copy $kind),)*
        }

        impl GatewayStats {
            /// The counters now.
            pub fn snapshot(&self) -> GatewaySnapshot {
                GatewaySnapshot { $($field: self.$field.get(),)* }
            }
        }

        /// The names keep what the gateway has always exported
        /// (`udp_rx_datagrams_total`, ...).
        impl Counters for GatewaySnapshot {
            fn visit(&self, f: &mut dyn FnMut(Metric)) {
                quic_rdma::visit_fields!(f, self, None;
                    $($field $(=> $name)?: $kind, $unit, $help;)*);
            }
        }
    };
    (@live $kind:ident) => { $kind };
    (@live $kind:ident $live:ident) => { $live };
    (@copy Counter) => { u64 };
    (@copy Gauge) => { i64 };
}

gateway_counters! {
    /// Datagrams read from UDP sockets (listener or per-client).
    udp_rx => udp_rx_datagrams: Counter, Count, "Datagrams read from UDP";
    /// Datagrams sent on UDP sockets.
    udp_tx => udp_tx_datagrams: Counter, Count, "Datagrams sent on UDP";
    /// Datagrams received from the fabric.
    fabric_rx => fabric_rx_datagrams: Counter, Count, "Datagrams received from the fabric";
    /// Datagrams posted to the fabric.
    fabric_tx => fabric_tx_datagrams: Counter, Count, "Datagrams posted to the fabric";
    /// Bytes read from UDP.
    udp_rx_bytes: Counter, Bytes, "Bytes read from UDP";
    /// Bytes received from the fabric.
    fabric_rx_bytes: Counter, Bytes, "Bytes received from the fabric";
    /// Bytes sent on UDP.
    udp_tx_bytes: Counter, Bytes, "Bytes sent on UDP";
    /// Bytes posted to the fabric.
    fabric_tx_bytes: Counter, Bytes, "Bytes posted to the fabric";
    /// Datagrams the kernel dropped on the listening UDP socket before the
    /// gateway read them (receive buffer full): outside `unaccounted`, as
    /// the gateway never saw them; what clients sent = `udp_rx` + this.
    udp_kernel_drops in KernelDrops: Counter, Count, "Datagrams the kernel dropped on the listening UDP socket (receive buffer full)";
    /// The listening UDP socket's receive buffer, as the kernel granted it.
    udp_recv_buffer_bytes: Gauge, Bytes, "Receive buffer of the listening UDP socket, as the kernel granted it";
    /// UDP datagrams larger than the fabric MTU: dropped (the UD MTU is a hard
    /// limit — a UD message is never fragmented, IBA 9.7.7.2.1). QUIC's path MTU
    /// discovery (RFC 9000 §14.3, RFC 8899) sees a lost probe and settles below.
    drop_too_big: Counter, Count, "UDP datagrams larger than the fabric MTU, dropped";
    /// Datagrams of new clients refused because the table was full.
    drop_refused: Counter, Count, "Datagrams of clients refused by a full table";
    /// Datagrams from someone other than the client's target (a per-client
    /// queue pair or socket answers to its target only).
    drop_foreign: Counter, Count, "Datagrams from other than a client's target";
    /// Datagrams the fabric socket would not take (send error, or no room within
    /// the wait): lost packets to QUIC.
    drop_fabric_send: Counter, Count, "Datagrams the fabric socket did not take";
    /// Datagrams a UDP send failed on.
    drop_udp_send: Counter, Count, "Datagrams a UDP send failed on";
    /// Datagrams larger than the UDP path carries (sent with "don't
    /// fragment", the kernel refused them: `EMSGSIZE`). Path MTU probes
    /// above the path's MTU end here (RFC 8899); handshake datagrams must not.
    drop_udp_too_big: Counter, Count, "Datagrams larger than the UDP path carries (never fragmented), dropped";
    /// New clients whose resources (queue pair, UDP socket) could not be made.
    drop_client_setup: Counter, Count, "Datagrams of clients whose QP or socket could not be made";
    /// Datagrams from unknown sources that are not a client Initial (junk,
    /// short headers, truncated or unknown-version Initials): no state made.
    drop_not_initial: Counter, Count, "Datagrams from unknown sources that are not a client Initial";
    /// Initials from a source IP (or GID) that already has its share of clients.
    drop_source_limit: Counter, Count, "Initials refused by the per-source client limit";
    /// Datagrams to an unvalidated client beyond 3× what it sent (RFC 9000 §8.1).
    drop_amplification: Counter, Count, "Datagrams to unvalidated clients beyond 3x what they sent";
    /// Clients admitted (unvalidated).
    clients_admitted: Counter, Count, "Clients admitted (unvalidated)";
    /// Clients that proved their address.
    clients_validated: Counter, Count, "Clients that proved their address";
    /// Unvalidated clients evicted to make room for newer ones.
    clients_evicted: Counter, Count, "Unvalidated clients evicted to make room";
    /// Unvalidated clients removed when their time ran out.
    clients_expired_unvalidated: Counter, Count, "Unvalidated clients expired";
    /// Validated clients removed after the idle timeout.
    clients_expired: Counter, Count, "Validated clients expired after the idle timeout";
    /// Clients in the table now, both tiers.
    clients_active: Gauge, Count, "Clients in the table";
    /// Unvalidated clients in the table now.
    clients_unvalidated: Gauge, Count, "Unvalidated clients in the table";
}

/// The listening UDP socket's drop count, which the kernel keeps: the
/// gateway only remembers the socket's inode, and each snapshot reads the
/// count ([`super::udp_socket::kernel_drops`]).
#[derive(Debug, Default)]
pub struct KernelDrops(std::sync::OnceLock<u64>);

impl KernelDrops {
    /// Read the drops of the socket with `inode` from now on (the first
    /// call only: the gateway has one listening socket).
    pub fn watch(&self, inode: u64) {
        let _ = self.0.set(inode);
    }

    /// Datagrams dropped so far; 0 before [`KernelDrops::watch`] or when
    /// the kernel's table cannot be read.
    pub fn get(&self) -> u64 {
        self.0
            .get()
            .and_then(|i| super::udp_socket::kernel_drops(*i))
            .unwrap_or(0)
    }
}

impl GatewaySnapshot {
    /// Every drop, of any kind.
    pub fn drops(&self) -> u64 {
        self.drop_too_big
            + self.drop_refused
            + self.drop_foreign
            + self.drop_fabric_send
            + self.drop_udp_send
            + self.drop_udp_too_big
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
    /// Prometheus text, every name prefixed `qr_gateway_`: generated from
    /// [`GatewaySnapshot`]'s visitor.
    pub fn prometheus(&self) -> String {
        Text::default()
            .visited("qr_gateway", &self.snapshot())
            .render()
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
