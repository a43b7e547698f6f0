//! The fabric side of `qr kv-relay`: a listening endpoint with its bootstrap
//! service (upstream) and a dialled connection (downstream), both with mutual
//! TLS from `crate::pki`.
//!
//! Interim: built from the same pieces as `qr serve` / `qr connect`
//! (`provider`, `endpoint`, the soft bootstrap service) until the shared
//! `channel_endpoint` module lands; then this file becomes two calls into it.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use quic_rdma::fabric::soft::bootstrap::BootstrapServer;
use quic_rdma::quinn_adapter::{self, Liveness};

use super::connect::query_bootstrap;
use crate::endpoint::endpoint;
use crate::pki::Mtls;
use crate::provider::{self, EndpointOptions, ProviderKind};

/// A listening endpoint; dropping it stops the bootstrap service.
pub(crate) struct Listening {
    pub(crate) endpoint: quinn::Endpoint,
    _bootstrap: Box<dyn std::any::Any + Send>,
}

/// Open an endpoint on `ip` and publish it on TCP `service`.
pub(crate) fn listen(
    kind: ProviderKind,
    ip: IpAddr,
    udp_port: u16,
    service: SocketAddr,
    mtls: &Mtls,
    alpn: &[u8],
    liveness: Liveness,
) -> Result<Listening> {
    let mut opts = EndpointOptions::new(ip);
    opts.udp_port = udp_port;
    let ep = provider::open_endpoint(kind, &opts).map_err(|e| anyhow!("{e}"))?;
    let cfg = mtls.server_config(
        alpn,
        quinn_adapter::transport_with(ep.socket.mtu(), liveness),
    )?;
    let endpoint = endpoint(&ep.socket, Some(cfg))?;
    let publish = ep
        .publish
        .ok_or_else(|| anyhow!("provider `{kind}` has no bootstrap record"))?;
    let bootstrap = BootstrapServer::bind(service, publish)
        .with_context(|| format!("bootstrap service on TCP {service}"))?;
    let handle = bootstrap.spawn()?;
    Ok(Listening {
        endpoint,
        _bootstrap: Box::new((handle, ep)),
    })
}

/// Find `service` (HOST:PORT), open an endpoint on `ip` and connect with mTLS
/// checking the server's certificate for `server_name`.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn dial(
    kind: ProviderKind,
    ip: IpAddr,
    udp_port: u16,
    service: &str,
    mtls: &Mtls,
    alpn: &[u8],
    liveness: Liveness,
    server_name: &str,
) -> Result<Dialed> {
    let svc = service.to_string();
    let peer = tokio::task::spawn_blocking(move || query_bootstrap(&svc, Duration::from_secs(5)))
        .await
        .context("bootstrap query task")??;
    let mut opts = EndpointOptions::new(ip);
    opts.udp_port = udp_port;
    opts.peer = Some(peer);
    let ep = provider::open_endpoint(kind, &opts).map_err(|e| anyhow!("{e}"))?;
    let cfg = mtls.client_config(
        alpn,
        quinn_adapter::transport_with(ep.socket.mtu(), liveness),
    )?;
    let endpoint = endpoint(&ep.socket, None)?;
    let conn = endpoint
        .connect_with(cfg, ep.socket.peer_addr(peer.addr), server_name)
        .context("starting the handshake")?
        .await
        .with_context(|| format!("handshake with {service} as \"{server_name}\""))?;
    Ok(Dialed {
        endpoint,
        conn,
        _socket: Box::new(ep),
    })
}

/// A dialled connection and the endpoint (and socket) it lives on.
pub(crate) struct Dialed {
    pub(crate) endpoint: quinn::Endpoint,
    pub(crate) conn: quinn::Connection,
    _socket: Box<dyn std::any::Any + Send + Sync>,
}
