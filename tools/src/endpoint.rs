//! The endpoint builder every `qr` command and channel runs on: it opens the
//! provider's socket ([`crate::provider`]) and builds quinn over it, deriving
//! the endpoint config and the transport config ([`Liveness`] timers
//! included) together from the socket's MTU ([`FabricConfig`]), with a
//! routing key of its own for the connection IDs it issues
//! (docs/architecture.md §3 "Routing key", §7). TLS comes in without a
//! transport: a server's [`TlsSettings`], a client's `quinn::ClientConfig`;
//! the builder adds the one transport config.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use quic_rdma::discovery::{self, BootstrapHandle, PeerInfo};
use quic_rdma::fabric::sim::{FabricStats, SimFabric};
use quic_rdma::fabric::soft::SoftPort;
use quic_rdma::fabric::Provider;
use quic_rdma::quic::{TlsError, TlsSettings};
use quic_rdma::quinn_adapter::{self, Attempt, FabricConfig, Liveness};

use crate::provider::{self, EndpointOptions, FabricOptions, OpenError, Socket};

/// Why an endpoint could not be opened, listen or publish.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EndpointError {
    /// The provider could not open a socket (not built in, unsupported, failed).
    #[error(transparent)]
    Open(#[from] OpenError),
    /// The provider has no record for other processes to find it by.
    #[error(
        "provider `{0}` publishes no bootstrap record: serve other processes with \
         `--provider soft` (or `verbs`)"
    )]
    NoRecord(Provider),
    /// The TLS settings could not be made into a server config.
    #[error("TLS server config")]
    Tls(#[source] TlsError),
    /// quinn refused to create the endpoint.
    #[error("creating a quinn endpoint (call it inside a tokio runtime)")]
    Quinn(#[source] std::io::Error),
    /// The bootstrap service could not bind or start.
    #[error("bootstrap service on TCP {bind}: is the port taken? choose another --service-port")]
    Publish {
        /// The address it was to listen on.
        bind: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

type Result<T, E = EndpointError> = std::result::Result<T, E>;

/// One fabric socket, the provider that opened it and the quinn configs of
/// its connections.
#[derive(Clone)]
pub(crate) struct FabricEndpoint {
    socket: Socket,
    config: FabricConfig,
    kind: Provider,
    soft: Option<SoftPort>,
    record: Option<PeerInfo>,
    sim: Option<SimFabric>,
    udp_gateways: Arc<[IpAddr]>,
}

impl FabricEndpoint {
    /// Open one endpoint of a multi-process provider (`soft`, `verbs`) as
    /// `opts` says; its connections kept alive and judged dead by `liveness`.
    pub(crate) fn open(
        kind: Provider,
        opts: &EndpointOptions,
        liveness: Liveness,
    ) -> Result<Self, OpenError> {
        let ep = provider::open_endpoint(kind, opts)?;
        Ok(FabricEndpoint {
            config: FabricConfig::of(&ep.socket).liveness(liveness),
            socket: ep.socket,
            kind: ep.kind,
            soft: ep.soft,
            record: ep.publish,
            sim: None,
            udp_gateways: Arc::from([]),
        })
    }

    /// Open a server and a client endpoint of a one-process provider (`sim`)
    /// that can reach each other (`qr demo`).
    pub(crate) fn pair(
        kind: Provider,
        opts: &FabricOptions,
        liveness: Liveness,
    ) -> Result<(Self, Self), OpenError> {
        let p = provider::open_pair(kind, opts)?;
        let one = |socket: Socket| FabricEndpoint {
            config: FabricConfig::of(&socket).liveness(liveness),
            socket,
            kind: p.kind,
            soft: None,
            record: None,
            sim: p.sim.clone(),
            udp_gateways: Arc::from([]),
        };
        Ok((one(p.server.clone()), one(p.client.clone())))
    }

    /// What the fabric itself did to packets, if the provider can tell (`sim`).
    pub(crate) fn wire_stats(&self) -> Option<FabricStats> {
        self.sim.as_ref().map(SimFabric::stats)
    }

    /// The socket underneath.
    pub(crate) fn socket(&self) -> &Socket {
        &self.socket
    }

    /// The provider that opened it.
    pub(crate) fn kind(&self) -> Provider {
        self.kind
    }

    /// The `soft` port under it (its counters, its UDP port).
    pub(crate) fn soft(&self) -> Option<&SoftPort> {
        self.soft.as_ref()
    }

    /// What a bootstrap service publishes for it: GID, QPN, Q_Key, UDP port, MTU.
    pub(crate) fn record(&self) -> Result<PeerInfo> {
        self.record.ok_or(EndpointError::NoRecord(self.kind))
    }

    /// A server endpoint accepting with `tls` and the fabric's transport
    /// config. Call inside a tokio runtime.
    pub(crate) fn listen(&self, tls: &TlsSettings) -> Result<quinn::Endpoint> {
        self.endpoint(Some(self.server_config(tls)?))
    }

    /// The server config [`listen`](Self::listen) uses: `tls` with the
    /// fabric's transport config.
    pub(crate) fn server_config(&self, tls: &TlsSettings) -> Result<quinn::ServerConfig> {
        let server = tls
            .server_config(self.config.transport())
            .map_err(EndpointError::Tls)?;
        Ok(Arc::unwrap_or_clone(server))
    }

    /// Peers from these fabric IPs are UDP clients forwarded by a gateway
    /// (`qr gateway to-fabric --fabric-ip`): [`accept`](Self::accept) gives
    /// them the UDP path's transport settings.
    pub(crate) fn with_udp_gateways(mut self, ips: &[IpAddr]) -> Self {
        self.udp_gateways = ips.into();
        self
    }

    /// Whether the peer quinn knows as `remote` comes through a gateway.
    pub(crate) fn via_gateway(&self, remote: SocketAddr) -> bool {
        !self.udp_gateways.is_empty()
            && self
                .socket
                .ud_addr_of(remote)
                .is_some_and(|a| self.udp_gateways.contains(&a.gid.to_ip()))
    }

    /// A server's acceptor for `tls`: the fabric's transport for fabric
    /// peers, the UDP path's for peers through a gateway.
    pub(crate) fn acceptor(&self, tls: &TlsSettings) -> Result<Acceptor> {
        let udp_path = tls
            .server_config(self.config.udp_path_transport())
            .map_err(EndpointError::Tls)?;
        Ok(Acceptor {
            fabric: self.clone(),
            udp_path,
        })
    }

    /// A server endpoint accepting with `server` (from
    /// [`server_config`](Self::server_config)). Call inside a tokio runtime.
    pub(crate) fn listen_with(&self, server: quinn::ServerConfig) -> Result<quinn::Endpoint> {
        self.endpoint(Some(server))
    }

    /// A client endpoint. Call inside a tokio runtime.
    pub(crate) fn client(&self) -> Result<quinn::Endpoint> {
        self.endpoint(None)
    }

    fn endpoint(&self, server: Option<quinn::ServerConfig>) -> Result<quinn::Endpoint> {
        self.config
            .endpoint(self.socket.clone(), server)
            .map_err(EndpointError::Quinn)
    }

    /// `config` (TLS, built without a transport) with the fabric's
    /// transport config, for a connection from this endpoint.
    pub(crate) fn client_config(&self, mut config: quinn::ClientConfig) -> quinn::ClientConfig {
        config.transport_config(self.config.transport());
        config
    }

    /// Publish [`record`](Self::record) on a discovery service at `bind`
    /// (TCP): the bound address, and the handle that keeps the service
    /// running until dropped.
    pub(crate) fn publish(&self, bind: SocketAddr) -> Result<(SocketAddr, BootstrapHandle)> {
        let record = self.record()?;
        let failed = |source| EndpointError::Publish { bind, source };
        let service = discovery::BootstrapServer::bind(bind, record).map_err(failed)?;
        let bound = service.local_addr().map_err(failed)?;
        Ok((bound, service.spawn().map_err(failed)?))
    }

    /// Watch `conn` for a silent peer by the receive path's clock
    /// (docs/architecture.md §5): quinn's idle timer runs in a task a busy
    /// host delays.
    pub(crate) fn watch(&self, conn: &quinn::Connection) {
        quinn_adapter::spawn_watch_for(&self.socket, conn, &self.config.timers());
    }
}

/// Completes a server's handshakes, each with the transport settings its
/// peer's path needs (docs/architecture.md §8, gateway): a peer forwarded
/// from UDP starts at 1 200-byte datagrams and discovers the path MTU, with
/// Internet timers; a fabric peer gets the fabric's settings and a watcher.
pub(crate) struct Acceptor {
    fabric: FabricEndpoint,
    udp_path: Arc<quinn::ServerConfig>,
}

impl Acceptor {
    /// Accept `attempt` and complete its handshake.
    pub(crate) async fn accept(
        &self,
        attempt: Attempt,
    ) -> Result<quinn::Connection, quinn::ConnectionError> {
        if self.fabric.via_gateway(attempt.remote_address()) {
            return attempt.accept_with(self.udp_path.clone()).await;
        }
        let conn = attempt.await?;
        // A dead fabric peer is noticed by the receive path (docs/architecture.md §5).
        self.fabric.watch(&conn);
        Ok(conn)
    }
}
