//! The quinn endpoint every `qr` command runs on: quinn over a provider's socket
//! ([`crate::provider::Socket`]), with the fabric MTU and the routing key that
//! the connection IDs it issues carry (docs/architecture.md §3, "Routing key").
//! [`FabricEndpoint`] derives the endpoint config and the transport config
//! ([`Liveness`] timers included) from the one socket's MTU: no caller passes it.

use std::sync::Arc;

use anyhow::{Context, Result};
use quic_rdma::quic::cid::random_routing_key;
use quic_rdma::quinn_adapter::{self, Liveness};

use crate::provider::Socket;

/// One fabric socket and the liveness of its connections: the quinn endpoint
/// over it and the transport config its connections take.
#[derive(Clone)]
pub(crate) struct FabricEndpoint {
    socket: Socket,
    liveness: Liveness,
}

impl FabricEndpoint {
    /// The endpoint over `socket`, its connections kept alive and judged dead
    /// by `liveness`.
    pub(crate) fn new(socket: Socket, liveness: Liveness) -> Self {
        FabricEndpoint { socket, liveness }
    }

    /// The socket underneath.
    pub(crate) fn socket(&self) -> &Socket {
        &self.socket
    }

    /// The transport config of every connection: datagrams of the socket's
    /// MTU from the first packet, the fabric's windows, the liveness timers.
    pub(crate) fn transport(&self) -> Arc<quinn::TransportConfig> {
        quinn_adapter::transport_with(self.socket.mtu(), self.liveness)
    }

    /// A server endpoint accepting with `config`, whose transport config is
    /// replaced by [`transport`](Self::transport). Call inside a tokio runtime.
    pub(crate) fn listen(&self, mut config: quinn::ServerConfig) -> Result<quinn::Endpoint> {
        config.transport_config(self.transport());
        endpoint(&self.socket, Some(config))
    }

    /// A client endpoint. Call inside a tokio runtime.
    pub(crate) fn client(&self) -> Result<quinn::Endpoint> {
        endpoint(&self.socket, None)
    }

    /// `config` with its transport config replaced by
    /// [`transport`](Self::transport), for a connection from this endpoint.
    pub(crate) fn client_config(&self, mut config: quinn::ClientConfig) -> quinn::ClientConfig {
        config.transport_config(self.transport());
        config
    }

    /// Watch `conn` for a silent peer by the receive path's clock
    /// (docs/architecture.md §5): quinn's idle timer runs in a task a busy
    /// host delays.
    pub(crate) fn watch(&self, conn: &quinn::Connection) {
        quinn_adapter::spawn_watch_for(&self.socket, conn, &self.liveness);
    }
}

/// A quinn endpoint over `sock` issuing connection IDs with a routing key of
/// its own (random: no two endpoints share one by construction); a server when
/// `server` is given (tests with configs of their own; commands use
/// [`FabricEndpoint`], which sets the transport config too).
pub(crate) fn endpoint(
    sock: &Socket,
    server: Option<quinn::ServerConfig>,
) -> Result<quinn::Endpoint> {
    quinn::Endpoint::new_with_abstract_socket(
        quinn_adapter::endpoint_config(sock.mtu(), random_routing_key()),
        server,
        sock.clone(),
        Arc::new(quinn::TokioRuntime),
    )
    .context("creating a quinn endpoint")
}
