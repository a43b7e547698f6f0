//! The quinn endpoint every `qr` command runs on: quinn over a provider's socket
//! ([`crate::provider::Socket`]), with the fabric MTU and the routing key that
//! the connection IDs it issues carry (docs/architecture.md §3, "Routing key").

use std::sync::Arc;

use anyhow::{Context, Result};
use quic_rdma::quic::cid::random_routing_key;
use quic_rdma::quinn_adapter;

use crate::provider::Socket;

/// A quinn endpoint over `sock` issuing connection IDs with a routing key of
/// its own (random: no two endpoints share one by construction); a server when
/// `server` is given.
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
