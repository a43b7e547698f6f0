//! The quinn endpoint every `qr` command runs on: quinn over a provider's socket
//! ([`crate::provider::Socket`]), with the fabric MTU and the routing key that
//! the connection IDs it issues carry (docs/architecture.md §3, "Routing key").

use std::sync::Arc;

use anyhow::{Context, Result};
use quic_rdma::quinn_adapter;

use crate::provider::Socket;

/// Routing key of the server's connection IDs.
pub(crate) const SERVER_KEY: u32 = 0x5e;
/// Routing key of the client's connection IDs.
pub(crate) const CLIENT_KEY: u32 = 0xc1;

/// A quinn endpoint over `sock` issuing connection IDs with routing key `key`;
/// a server when `server` is given.
pub(crate) fn endpoint(
    sock: &Socket,
    server: Option<quinn::ServerConfig>,
    key: u32,
) -> Result<quinn::Endpoint> {
    quinn::Endpoint::new_with_abstract_socket(
        quinn_adapter::endpoint_config(sock.mtu(), key),
        server,
        sock.clone(),
        Arc::new(quinn::TokioRuntime),
    )
    .context("creating a quinn endpoint")
}
