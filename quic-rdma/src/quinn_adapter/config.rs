//! The quinn configs of one fabric endpoint, derived together: the endpoint
//! config and the transport config both follow from the socket's MTU, so no
//! caller passes the MTU twice (docs/architecture.md §5).

use std::io;
use std::sync::Arc;

use crate::fabric::UdQueuePair;
use crate::quic::cid::random_routing_key;
use crate::quic::config::{
    endpoint_config, transport_config_with, udp_path_transport_config, Liveness,
};

use super::RdmaUdpSocket;

/// Builder of a fabric endpoint's quinn configs: the fabric MTU, the routing
/// key its connection IDs carry, and the [`Liveness`] timers of its
/// connections.
///
/// [`FabricConfig::of`] takes the MTU from the socket; [`FabricConfig::new`]
/// from the caller (a UDP baseline tuned like the fabric).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FabricConfig {
    mtu: usize,
    routing_key: u32,
    liveness: Liveness,
}

impl FabricConfig {
    /// The configs for `socket`: its MTU, a random routing key, and the
    /// adapter's timers ([`Liveness::quinn_adapter`]).
    pub fn of<Q: UdQueuePair>(socket: &RdmaUdpSocket<Q>) -> Self {
        Self::new(socket.mtu())
    }

    /// The configs for a path of `mtu` bytes: a random routing key (no two
    /// endpoints share one by construction) and [`Liveness::quinn_adapter`]:
    /// 300 ms keep-alive and a 30 s idle timeout. quinn judges the idle timer
    /// in the connection's task, which can run seconds behind the receive
    /// path when the host is busy, so a short idle timeout there kills live
    /// connections; dead peers are noticed by [`super::watch`] instead.
    pub fn new(mtu: usize) -> Self {
        FabricConfig {
            mtu,
            routing_key: random_routing_key(),
            liveness: Liveness::quinn_adapter(),
        }
    }

    /// Connection IDs carrying `key` (20 bits, see [`crate::quic::RoutingCidGenerator`]): for
    /// an endpoint that routes by key itself, e.g. one key per core.
    pub fn routing_key(self, key: u32) -> Self {
        FabricConfig {
            routing_key: key,
            ..self
        }
    }

    /// Keep-alive, idle timeout and dead-peer silence of every connection.
    pub fn liveness(self, liveness: Liveness) -> Self {
        FabricConfig { liveness, ..self }
    }

    /// The MTU both configs were derived from.
    pub fn mtu(&self) -> usize {
        self.mtu
    }

    /// The timers every connection takes (its watcher's too).
    pub fn timers(&self) -> Liveness {
        self.liveness
    }

    /// The endpoint config: datagrams up to the MTU (quinn otherwise caps
    /// them at 1472), CIDs carrying the routing key.
    pub fn endpoint_config(&self) -> quinn::EndpointConfig {
        endpoint_config(self.mtu, self.routing_key)
    }

    /// The transport config, to change before use (a benchmark's tuning):
    /// every packet MTU-sized from the start, no MTU probing above it, the
    /// fabric's windows, the liveness timers.
    pub fn transport_config(&self) -> quinn::TransportConfig {
        transport_config_with(self.mtu, self.liveness)
    }

    /// [`transport_config`](Self::transport_config) behind an `Arc`, ready
    /// for client and server configs.
    pub fn transport(&self) -> Arc<quinn::TransportConfig> {
        Arc::new(self.transport_config())
    }

    /// The transport config for a peer that reaches this endpoint from UDP
    /// through a gateway: 1 200-byte datagrams at first, path MTU discovery
    /// up to the fabric MTU, [`Liveness::udp_path`] timers
    /// ([`udp_path_transport_config`]). A server picks it per connection
    /// (`quinn::Incoming::accept_with`); the peer needs no watcher.
    pub fn udp_path_transport(&self) -> Arc<quinn::TransportConfig> {
        Arc::new(udp_path_transport_config(self.mtu, Liveness::udp_path()))
    }

    /// A quinn endpoint over `socket` with the endpoint config, a server
    /// when `server` is given. Call inside a tokio runtime.
    pub fn endpoint<Q: UdQueuePair>(
        &self,
        socket: Arc<RdmaUdpSocket<Q>>,
        server: Option<quinn::ServerConfig>,
    ) -> io::Result<quinn::Endpoint> {
        quinn::Endpoint::new_with_abstract_socket(
            self.endpoint_config(),
            server,
            socket,
            Arc::new(quinn::TokioRuntime),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_configs_follow_one_mtu() {
        let c = FabricConfig::new(4096).routing_key(0x5eed);
        assert_eq!(c.mtu(), 4096);
        assert_eq!(c.timers(), Liveness::quinn_adapter());
        let live = Liveness::new(None, Some(std::time::Duration::from_secs(5))).unwrap();
        assert_eq!(c.liveness(live).timers(), live);
        // Random keys differ between endpoints (20 bits: a clash is 1 in 2^20).
        let keys: std::collections::HashSet<u32> = (0..8)
            .map(|_| FabricConfig::new(4096).routing_key)
            .collect();
        assert!(keys.len() > 1, "{keys:?}");
    }
}
