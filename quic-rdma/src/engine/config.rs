//! Configuration of an [`Engine`](super::Engine): accept policy, TLS, socket tuning.

use std::sync::Arc;

use quinn_proto::{ClientConfig, ServerConfig, TransportConfig};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::EngineError;
use crate::quic::config::transport;
use crate::quic::peers::PeerLimits;
use crate::quic::retry::RetryPolicy;
use crate::quic::routing::RoutingCheck;
use crate::quic::tls::TlsSettings;
use crate::socket::SocketConfig;

/// [`EngineConfig::datagram_recv_buffer`]'s default: 4 MiB, the size of
/// quinn-proto's own buffer (`TransportConfig::datagram_receive_buffer_size`).
pub const DEFAULT_DATAGRAM_RECV_BUFFER: usize = 4 << 20;

/// What the engine does with a new incoming connection attempt.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum AcceptPolicy {
    /// Accept every attempt (reported as [`Event::Accepted`](super::Event::Accepted)).
    #[default]
    AcceptAll,
    /// Refuse every attempt (CONNECTION_REFUSED): a server going away.
    RefuseAll,
    /// Answer unvalidated attempts with a Retry (address validation, RFC 9000 §8.1),
    /// accept the validated ones: costs a round trip, defeats spoofed floods.
    RetryThenAccept,
    /// Report each attempt as [`Event::IncomingConnection`](super::Event::IncomingConnection)
    /// and let the application decide.
    Manual,
}

/// Everything an [`Engine`](super::Engine) needs besides its queue pair.
#[derive(Clone)]
pub struct EngineConfig {
    /// Server side: TLS identity and transport. `None` refuses every incoming attempt
    /// silently (a pure client).
    pub server: Option<Arc<ServerConfig>>,
    /// Client side: roots and transport for [`connect`](super::Engine::connect).
    pub client: Option<ClientConfig>,
    /// What to do with incoming attempts (when `server` is set).
    pub accept: AcceptPolicy,
    /// When attempts from unvalidated addresses get a Retry before `accept`
    /// sees them (under [`AcceptPolicy::AcceptAll`] and [`AcceptPolicy::Manual`];
    /// [`AcceptPolicy::RetryThenAccept`] always asks).
    pub retry: RetryPolicy,
    /// The 20-bit routing key every CID this endpoint issues carries; random
    /// per endpoint by default.
    pub routing_key: u32,
    /// The UD socket's tuning.
    pub socket: SocketConfig,
    /// Datagrams taken from the receive queue per [`poll`](super::Engine::poll);
    /// bounds the time one poll spends receiving so transmits are not starved.
    pub recv_batch: usize,
    /// Bytes of received datagrams each connection holds until the
    /// application reads them (payload plus 32 bytes per datagram, as
    /// quinn-proto counts); when a new one does not fit, the oldest are
    /// dropped, counted ([`Engine::datagram_stats`](super::Engine::datagram_stats))
    /// and reported ([`Event::DatagramsDropped`](super::Event::DatagramsDropped)).
    /// At least the MTU. Default 4 MiB (quinn-proto's own default).
    pub datagram_recv_buffer: usize,
    /// Seed of quinn-proto's endpoint RNG (tests want determinism); `None` seeds from the OS.
    pub rng_seed: Option<[u8; 32]>,
    /// Bounds of the peer table ([`crate::quic::PeerLimits`]).
    pub peers: PeerLimits,
    /// What the receive path does with immediate data ([`crate::quic::RoutingCheck`]).
    pub routing: RoutingCheck,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            server: None,
            client: None,
            accept: AcceptPolicy::AcceptAll,
            retry: RetryPolicy::Auto,
            routing_key: crate::quic::cid::random_routing_key(),
            // The engine polls its queue pair every turn of its loop, so a
            // posted window of 512 (2 MiB at MTU 4096) keeps up and keeps the
            // receive buffers in cache: receives complete in the order they
            // were posted, and with all 2048 posted each packet lands in
            // memory last touched 8 MiB earlier (1 GiB transfers measured up
            // to ~15 % faster with 512, benches/RESULTS.md, "Bulk
            // throughput"). The window grows toward recv_depth if the engine
            // falls behind.
            socket: SocketConfig {
                recv_start: 512,
                ..SocketConfig::default()
            },
            recv_batch: 256,
            datagram_recv_buffer: DEFAULT_DATAGRAM_RECV_BUFFER,
            rng_seed: None,
            peers: PeerLimits::default(),
            routing: RoutingCheck::default(),
        }
    }
}

impl EngineConfig {
    /// Give both sides (those already set: `server`, `client`) the transport
    /// config `transport`, e.g. other liveness timers than the defaults
    /// ([`Liveness`](crate::quic::Liveness): 300 ms keep-alive, 1.5 s
    /// idle timeout) of [`server_config`] and [`client_config`]:
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use quic_rdma::engine::EngineConfig;
    /// use quic_rdma::quic::{transport_with, Liveness};
    ///
    /// let mut cfg = EngineConfig::default(); // with `server` / `client` set
    /// let slow = Liveness::new(Some(Duration::from_secs(1)), Some(Duration::from_secs(10)))?;
    /// cfg.set_transport(transport_with(4096, slow));
    /// # Ok(()) }
    /// ```
    pub fn set_transport(&mut self, transport: Arc<TransportConfig>) {
        if let Some(s) = &mut self.server {
            Arc::make_mut(s).transport_config(transport.clone());
        }
        if let Some(c) = &mut self.client {
            c.transport_config(transport);
        }
    }
}

impl std::fmt::Debug for EngineConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineConfig")
            .field("server", &self.server.is_some())
            .field("client", &self.client.is_some())
            .field("accept", &self.accept)
            .field("retry", &self.retry)
            .field("routing_key", &self.routing_key)
            .field("socket", &self.socket)
            .field("recv_batch", &self.recv_batch)
            .field("datagram_recv_buffer", &self.datagram_recv_buffer)
            .field("peers", &self.peers)
            .finish()
    }
}

/// A server config with one certificate chain and key, TLS 1.3 with the
/// default [`CipherPreference`](crate::quic::CipherPreference)
/// (AES-128-GCM first), 0-RTT accepted, and the fabric-tuned
/// transport ([`transport_config`](crate::quic::transport_config)) for `mtu`,
/// with the default [`Liveness`](crate::quic::Liveness): a dead client is
/// reported as [`CloseReason::TimedOut`](super::CloseReason::TimedOut) within 1.5–1.8 s
/// (change it with [`EngineConfig::set_transport`]). For client certificates,
/// ALPN or other suites, build a [`TlsSettings`] yourself.
pub fn server_config(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    mtu: usize,
) -> Result<Arc<ServerConfig>, EngineError> {
    TlsSettings {
        identity: Some((chain, key)),
        // As quinn-proto's own `with_single_cert`.
        accept_0rtt: true,
        ..TlsSettings::default()
    }
    .server_config(transport(mtu))
    .map_err(|e| EngineError::Tls(e.to_string()))
}

/// A client config trusting `roots` (certificate verification is always on),
/// TLS 1.3 with the default cipher-suite preference (as [`server_config`]),
/// with the fabric-tuned transport for `mtu` and the default
/// [`Liveness`](crate::quic::Liveness), as [`server_config`].
pub fn client_config(
    roots: impl IntoIterator<Item = CertificateDer<'static>>,
    mtu: usize,
) -> Result<ClientConfig, EngineError> {
    TlsSettings {
        roots: roots.into_iter().collect(),
        ..TlsSettings::default()
    }
    .client_config(transport(mtu))
    .map_err(|e| EngineError::Tls(e.to_string()))
}
