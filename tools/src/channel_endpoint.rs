//! The fabric endpoint of a channel (image layers, KV sync): a quinn endpoint
//! on a `soft` or `verbs` UD socket, found through the TCP bootstrap service
//! (docs/architecture.md §4) — the server side publishes its GID, QPN, Q_Key
//! and UDP port there, the client side asks for them before the handshake.
//!
//! Both sides run on the endpoint builder ([`FabricEndpoint`]), which adds
//! the fabric's transport config (MTU-sized datagrams, wide windows,
//! [`Liveness`] timers): a channel brings only TLS and ALPN, as
//! [`TlsSettings`] (server) or a `quinn::ClientConfig` built without a
//! transport (client). A dead peer is noticed by the receive path's clock: every connection
//! a client makes, and every one a server hands to [`Watcher::watch`], is
//! watched (`quinn_adapter::watch`) for [`Liveness::dead_after`]. `qr serve`
//! and `qr connect` use the same bootstrap helpers.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use quic_rdma::discovery::{self, BootstrapError, BootstrapHandle, PeerInfo};
use quic_rdma::fabric::{Gid, Provider};
use quic_rdma::quic::TlsSettings;
use quic_rdma::quinn_adapter::Liveness;
use quic_rdma::socket::SocketStats;

pub use crate::endpoint::EndpointError;
use crate::endpoint::FabricEndpoint;
use crate::provider::EndpointOptions;
pub use crate::provider::OpenError;

/// Why a channel client could not reach a server. Each message is whole on
/// its own (the cause is in it, not also a `source()`), so error reporters
/// that print a chain say nothing twice.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DialError {
    /// The server's bootstrap service did not give its record (refused,
    /// unreachable within the wait, or answered nonsense).
    #[error("bootstrap query to {service}: {error}")]
    Bootstrap {
        /// The bootstrap service asked (HOST:PORT).
        service: String,
        /// Why it gave no record.
        error: BootstrapError,
    },
    /// The bootstrap query's blocking task did not finish (it panicked or
    /// the runtime is shutting down).
    #[error("bootstrap query to {service}: the query task failed: {error}")]
    QueryTask {
        /// The bootstrap service asked (HOST:PORT).
        service: String,
        /// Why the task ended without an answer.
        error: tokio::task::JoinError,
    },
    /// No local address routes towards the server's GID.
    #[error("no route to {peer}: {error}")]
    Route {
        /// The server's GID as an IP address.
        peer: IpAddr,
        /// The kernel's answer.
        error: std::io::Error,
    },
    /// The local client endpoint could not be opened.
    #[error("{}", crate::logging::chain(.0))]
    Endpoint(EndpointError),
    /// quinn refused to start the handshake (e.g. an invalid server name or
    /// an endpoint that is closing).
    #[error("starting the handshake: {0}")]
    HandshakeStart(quinn::ConnectError),
    /// The handshake failed: the server or its certificate refused, or no
    /// answer came.
    #[error(
        "handshake with {gid} QPN {qpn:#x} (certificate checked for \"{server_name}\"{}): \
         {reason}",
        trusted.as_ref().map(|t| format!(" against {}", t.display())).unwrap_or_default()
    )]
    Handshake {
        /// The server's GID.
        gid: Gid,
        /// The server's QPN.
        qpn: u32,
        /// The name its certificate was checked for.
        server_name: String,
        /// The certificate file trusted for the server, when the caller
        /// named one (`qr connect --cert`).
        trusted: Option<PathBuf>,
        /// Why, in words a user can act on (a certificate our side refused
        /// says what is wrong with it and how to fix it).
        reason: String,
        /// quinn's error (boxed: it is large, and this is the cold path).
        error: Box<quinn::ConnectionError>,
    },
}

impl DialError {
    /// A failed handshake names `cert` as the certificate trusted for the
    /// server; other errors are unchanged.
    pub fn trusting(mut self, cert: impl Into<PathBuf>) -> Self {
        if let DialError::Handshake { trusted, .. } = &mut self {
            *trusted = Some(cert.into());
        }
        self
    }
}

impl From<EndpointError> for DialError {
    fn from(e: EndpointError) -> Self {
        DialError::Endpoint(e)
    }
}

impl From<OpenError> for DialError {
    fn from(e: OpenError) -> Self {
        DialError::Endpoint(EndpointError::Open(e))
    }
}

/// Run a handshake with `peer` on `endpoint` (a client endpoint of
/// `fabric`), `config` being TLS built without a transport (the fabric's is
/// added) and verifying the certificate for `server_name`. A failure says
/// which server, which name, and why (a certificate our side refused, in
/// words that say how to fix it).
pub(crate) async fn handshake(
    fabric: &FabricEndpoint,
    endpoint: &quinn::Endpoint,
    config: quinn::ClientConfig,
    peer: &PeerInfo,
    server_name: &str,
) -> Result<quinn::Connection, DialError> {
    endpoint
        .connect_with(
            fabric.client_config(config),
            fabric.socket().peer_addr(peer.addr),
            server_name,
        )
        .map_err(DialError::HandshakeStart)?
        .await
        .map_err(|error| DialError::Handshake {
            gid: peer.addr.gid,
            qpn: peer.addr.qpn,
            server_name: server_name.to_string(),
            trusted: None,
            reason: crate::refusal::local_certificate_refusal(&error)
                .unwrap_or_else(|| error.to_string()),
            error: Box::new(error),
        })
}

/// TCP port of the bootstrap service when none is given (rdma-core's
/// `ibv_*_pingpong` examples exchange QP details on the same port).
pub const DEFAULT_SERVICE_PORT: u16 = 18515;

/// Where a channel server listens.
#[derive(Clone, Debug)]
pub struct ListenOptions {
    /// Fabric provider (`soft` or, when built with the `verbs` feature, `verbs`).
    pub provider: Provider,
    /// Local IP: the endpoint's GID, and the bootstrap service's address.
    pub ip: IpAddr,
    /// UDP port of the RoCEv2 socket (`soft`; `verbs` devices use 4791 only).
    pub udp_port: u16,
    /// TCP port of the bootstrap service (0: any free port, see
    /// [`ChannelServer::bootstrap`]).
    pub service_port: u16,
    /// QPN of the endpoint (`soft`); the provider's choice if `None`.
    pub qpn: Option<u32>,
    /// Keep-alive, idle timeout and dead-peer silence of every connection.
    pub liveness: Liveness,
}

impl ListenOptions {
    /// `soft` on `ip`, UDP 4791, bootstrap on TCP 18515, fabric liveness defaults.
    pub fn new(ip: IpAddr) -> Self {
        ListenOptions {
            provider: Provider::Soft,
            ip,
            udp_port: quic_rdma::fabric::ROCEV2_UDP_PORT,
            service_port: DEFAULT_SERVICE_PORT,
            qpn: None,
            liveness: Liveness::quinn_adapter(),
        }
    }
}

/// A listening channel server: accept connections from [`endpoint`](Self::endpoint).
/// Dropping it stops the bootstrap service; the quinn endpoint lives on while
/// clones of it do.
pub struct ChannelServer {
    /// The quinn endpoint (a server with the config given to [`listen`]).
    pub endpoint: quinn::Endpoint,
    /// The bootstrap service's bound TCP address: what clients dial.
    pub bootstrap: SocketAddr,
    /// The published record (GID, QPN, Q_Key, UDP port, MTU).
    pub record: PeerInfo,
    fabric: FabricEndpoint,
    /// What [`ChannelServer::set_tls`] changes the crypto of.
    server_config: quinn::ServerConfig,
    _bootstrap: BootstrapHandle,
}

/// Closes a connection whose peer has been silent for [`Liveness::dead_after`]
/// as the endpoint's receive path sees it (`quinn_adapter::watch`): quinn's
/// own idle timer runs in a task that a busy host delays, so it is kept long
/// and this notices dead peers (docs/architecture.md §5).
#[derive(Clone)]
pub struct Watcher {
    fabric: FabricEndpoint,
}

impl Watcher {
    /// Watch `conn` on a task of its own, if the liveness has a dead-after.
    pub fn watch(&self, conn: &quinn::Connection) {
        self.fabric.watch(conn);
    }
}

impl ChannelServer {
    /// What watches this server's connections for a dead peer: hand it every
    /// accepted connection.
    pub fn watcher(&self) -> Watcher {
        Watcher {
            fabric: self.fabric.clone(),
        }
    }

    /// Accept new connections with `tls` from now on (a rotated
    /// certificate, a new CA bundle): only the crypto changes, so the
    /// transport and the address-validation token key stay; connections
    /// already up keep the keys they agreed.
    pub fn set_tls(&self, tls: &TlsSettings) -> Result<(), EndpointError> {
        let crypto = tls.server_crypto().map_err(EndpointError::Tls)?;
        let mut config = self.server_config.clone();
        config.crypto = Arc::new(crypto);
        self.endpoint.set_server_config(Some(config));
        Ok(())
    }

    /// One line for the operator: provider, GID, QPN, Q_Key, UDP port, MTU and
    /// the bootstrap address.
    pub fn describe(&self) -> String {
        let (r, bootstrap) = (&self.record, self.bootstrap);
        format!(
            "GID {} QPN {:#x} Q_Key {:#x} UDP port {} MTU {}; bootstrap on TCP {bootstrap}",
            r.addr.gid,
            r.addr.qpn,
            r.addr.qkey,
            r.udp_port,
            r.mtu.bytes()
        )
    }

    /// Close every connection, wait for them to drain, and return once the
    /// fabric socket is released, so a new server can listen on the same
    /// address at once. quinn's endpoint driver, the socket's last holder, ends
    /// on the runtime after the last endpoint handle is gone; this waits for it
    /// (at most `limit`). Other clones of [`ChannelServer::endpoint`] must be
    /// dropped first, or the wait runs to `limit`.
    pub async fn shutdown(self, limit: Duration) {
        self.endpoint.close(0u32.into(), b"shutdown");
        self.endpoint.wait_idle().await;
        let socket = Arc::downgrade(self.fabric.socket());
        drop(self);
        let deadline = tokio::time::Instant::now() + limit;
        while socket.strong_count() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

/// Open a server endpoint accepting with `tls` and its bootstrap service.
/// Call inside a tokio runtime.
pub fn listen(opts: &ListenOptions, tls: &TlsSettings) -> Result<ChannelServer, EndpointError> {
    let mut eo = EndpointOptions::new(opts.ip);
    eo.udp_port = opts.udp_port;
    eo.qpn = opts.qpn;
    let fabric = FabricEndpoint::open(opts.provider, &eo, opts.liveness)?;
    let server_config = fabric.server_config(tls)?;
    let endpoint = fabric.listen_with(server_config.clone())?;
    let (bound, handle) = fabric.publish(SocketAddr::new(opts.ip, opts.service_port))?;
    Ok(ChannelServer {
        endpoint,
        bootstrap: bound,
        record: fabric.record()?,
        fabric,
        server_config,
        _bootstrap: handle,
    })
}

/// How a channel client reaches servers.
#[derive(Clone, Debug)]
pub struct DialOptions {
    /// Fabric provider (`soft` or, when built with the `verbs` feature, `verbs`).
    pub provider: Provider,
    /// Local IP (our GID). `None`: the address the kernel routes from towards
    /// the server (decided by [`dial`] at its first server).
    pub ip: Option<IpAddr>,
    /// Local UDP port of the RoCEv2 socket. Keep 4791: a `soft` server answers
    /// the port its peers publish, and clients publish nothing.
    pub udp_port: u16,
    /// Keep asking a bootstrap service this long while it refuses connections
    /// (a server still starting, or restarting).
    pub wait: Duration,
    /// Keep-alive, idle timeout and dead-peer silence of every connection.
    pub liveness: Liveness,
}

impl DialOptions {
    /// `soft`, routed source IP, UDP 4791, 10 s of bootstrap retries, fabric
    /// liveness defaults.
    pub fn new() -> Self {
        DialOptions {
            provider: Provider::Soft,
            ip: None,
            udp_port: quic_rdma::fabric::ROCEV2_UDP_PORT,
            wait: Duration::from_secs(10),
            liveness: Liveness::quinn_adapter(),
        }
    }
}

impl Default for DialOptions {
    fn default() -> Self {
        Self::new()
    }
}

/// A client endpoint that can connect (and reconnect) to channel servers.
pub struct ChannelClient {
    endpoint: quinn::Endpoint,
    fabric: FabricEndpoint,
    opts: DialOptions,
}

impl ChannelClient {
    /// Open a client endpoint on `ip` towards `peer`. Call inside a tokio runtime.
    fn open(opts: &DialOptions, ip: IpAddr, peer: PeerInfo) -> Result<ChannelClient, DialError> {
        let mut eo = EndpointOptions::new(ip);
        eo.udp_port = opts.udp_port;
        eo.peer = Some(peer);
        let fabric = FabricEndpoint::open(opts.provider, &eo, opts.liveness)?;
        Ok(ChannelClient {
            endpoint: fabric.client()?,
            fabric,
            opts: opts.clone(),
        })
    }

    /// Ask the bootstrap service `service` (HOST:PORT) for the server's record
    /// and run the handshake with `config` (TLS, built without a transport:
    /// the fabric's is added), verifying the certificate for `server_name`. Can be
    /// called again after a connection is lost (a restarted server).
    pub async fn connect(
        &self,
        service: &str,
        config: quinn::ClientConfig,
        server_name: &str,
    ) -> Result<quinn::Connection, DialError> {
        self.connect_within(service, config, server_name, self.opts.wait)
            .await
    }

    /// [`connect`](Self::connect), asking the bootstrap service for at most
    /// `wait` (one client endpoint can reach servers that deserve different
    /// patience: a node agent waits for its registry agent, not for a peer).
    pub async fn connect_within(
        &self,
        service: &str,
        config: quinn::ClientConfig,
        server_name: &str,
        wait: Duration,
    ) -> Result<quinn::Connection, DialError> {
        let peer = query_async(service, wait).await?;
        self.connect_to(peer, config, server_name).await
    }

    async fn connect_to(
        &self,
        peer: PeerInfo,
        config: quinn::ClientConfig,
        server_name: &str,
    ) -> Result<quinn::Connection, DialError> {
        if let Some(port) = self.fabric.soft() {
            // The peer's UDP port, before its address handle is made.
            peer.apply(port);
        }
        let conn = handshake(&self.fabric, &self.endpoint, config, &peer, server_name).await?;
        self.watcher().watch(&conn);
        Ok(conn)
    }

    /// What watches this client's connections for a dead server (every
    /// connection made by [`connect`](Self::connect) already is).
    pub fn watcher(&self) -> Watcher {
        Watcher {
            fabric: self.fabric.clone(),
        }
    }

    /// The quinn endpoint.
    pub fn endpoint(&self) -> &quinn::Endpoint {
        &self.endpoint
    }

    /// The UD socket's counters.
    pub fn socket_stats(&self) -> SocketStats {
        self.fabric.socket().stats()
    }
}

/// Find the server behind `service` (HOST:PORT), open a client endpoint (on
/// `opts.ip`, or the source address routed towards the server) and connect.
/// Call inside a tokio runtime. Keep the [`ChannelClient`] to reconnect later.
pub async fn dial(
    service: &str,
    opts: &DialOptions,
    config: quinn::ClientConfig,
    server_name: &str,
) -> Result<(ChannelClient, quinn::Connection), DialError> {
    let peer = query_async(service, opts.wait).await?;
    let ip = match opts.ip {
        Some(ip) => ip,
        None => route_source(peer.addr.gid.to_ip())?,
    };
    let client = ChannelClient::open(opts, ip, peer)?;
    let conn = client.connect_to(peer, config, server_name).await?;
    Ok((client, conn))
}

async fn query_async(service: &str, wait: Duration) -> Result<PeerInfo, DialError> {
    let owned = service.to_string();
    tokio::task::spawn_blocking(move || query_bootstrap(&owned, wait))
        .await
        .map_err(|error| DialError::QueryTask {
            service: service.to_string(),
            error,
        })?
}

/// Ask `server` (host:port) for its peer record, retrying while it refuses
/// connections or is busy until `wait` has passed
/// ([`discovery::query_within`]).
pub(crate) fn query_bootstrap(server: &str, wait: Duration) -> Result<PeerInfo, DialError> {
    discovery::query_within(server, wait).map_err(|error| DialError::Bootstrap {
        service: server.to_string(),
        error,
    })
}

/// The source address the kernel would use towards `peer` (no packet is sent).
pub(crate) fn route_source(peer: IpAddr) -> Result<IpAddr, DialError> {
    let any = match peer {
        IpAddr::V4(_) => SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
        IpAddr::V6(_) => SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0)),
    };
    let route = || -> std::io::Result<IpAddr> {
        let s = UdpSocket::bind(any)?;
        s.connect(SocketAddr::new(peer, quic_rdma::fabric::ROCEV2_UDP_PORT))?;
        Ok(s.local_addr()?.ip())
    };
    route().map_err(|error| DialError::Route { peer, error })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::{generate_dev_pki, Mtls};

    /// Each failure says which server and why once, also through anyhow's
    /// chain; a failed handshake names the trusted certificate when given.
    #[test]
    fn dial_errors_are_whole_and_said_once() {
        let gid = Gid::from(Ipv4Addr::new(127, 0, 113, 9));
        let e = DialError::Handshake {
            gid,
            qpn: 0x11,
            server_name: "srv".into(),
            trusted: None,
            reason: "timed out".into(),
            error: Box::new(quinn::ConnectionError::TimedOut),
        };
        let text = e.to_string();
        assert!(text.contains("handshake with"), "{text}");
        assert!(text.contains("QPN 0x11"), "{text}");
        assert!(text.contains("certificate checked for \"srv\""), "{text}");
        assert!(!text.contains("against"), "{text}");
        let text = format!("{:#}", anyhow::Error::from(e.trusting("/x/cert.der")));
        assert!(
            text.contains("\"srv\" against /x/cert.der): timed out"),
            "{text}"
        );
        assert_eq!(text.matches("timed out").count(), 1, "{text}");

        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let e = DialError::Bootstrap {
            service: "127.0.113.9:1".into(),
            error: BootstrapError::Io(refused),
        };
        let text = format!("{:#}", anyhow::Error::from(e));
        assert!(
            text.starts_with("bootstrap query to 127.0.113.9:1: "),
            "{text}"
        );
        assert_eq!(text.matches("refused").count(), 1, "{text}");
    }

    /// A server and two clients over `soft` on loopback, mutual TLS: data goes
    /// both ways (sha256 equal), and a client reconnects on its endpoint after
    /// the server endpoint was replaced by a new one on the same address.
    #[test]
    fn listen_dial_reconnect_over_soft() {
        use sha2::{Digest, Sha256};
        let dir = tempfile::tempdir().unwrap();
        let leaf = |s: &str| s.parse().unwrap();
        generate_dev_pki(
            dir.path(),
            &[leaf("srv=127.0.113.1"), leaf("c1=c1"), leaf("c2=c2")],
        )
        .unwrap();
        let load = |n: &str| {
            let p = |f: String| dir.path().join(f);
            Mtls::from_pem_files(
                &p(format!("{n}.pem")),
                &p(format!("{n}-key.pem")),
                &p("ca.pem".into()),
            )
            .unwrap()
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let mut lo = ListenOptions::new("127.0.113.1".parse().unwrap());
        lo.service_port = 0;
        let payload: Vec<u8> = (0..3_000_000u32)
            .map(|i| (i * 7 + i / 4096) as u8)
            .collect();
        let want = Sha256::digest(&payload);
        let serve = |lo: &ListenOptions| {
            let _g = rt.enter();
            let server = listen(lo, &load("srv").server_settings(b"t/1")).unwrap();
            let ep = server.endpoint.clone();
            rt.spawn(async move {
                while let Some(inc) = ep.accept().await {
                    tokio::spawn(async move {
                        let c = inc.await.unwrap();
                        while let Ok((mut tx, mut rx)) = c.accept_bi().await {
                            let data = rx.read_to_end(usize::MAX).await.unwrap();
                            tx.write_all(&Sha256::digest(&data)).await.unwrap();
                            tx.finish().unwrap();
                        }
                    });
                }
            });
            server
        };
        let server = serve(&lo);
        assert!(server.describe().contains("QPN"));
        let service = server.bootstrap.to_string();
        let ask = |conn: quinn::Connection, payload: Vec<u8>| async move {
            let (mut tx, mut rx) = conn.open_bi().await.unwrap();
            tx.write_all(&payload).await.unwrap();
            tx.finish().unwrap();
            rx.read_to_end(64).await.unwrap()
        };
        let (c1, c2) = rt.block_on(async {
            let mut d1 = DialOptions::new();
            d1.ip = Some("127.0.113.2".parse().unwrap());
            let cfg1 = load("c1").client_config(b"t/1").unwrap();
            let (c1, conn1) = dial(&service, &d1, cfg1, "127.0.113.1").await.unwrap();
            let mut d2 = d1.clone();
            d2.ip = Some("127.0.113.3".parse().unwrap());
            let cfg2 = load("c2").client_config(b"t/1").unwrap();
            let (c2, conn2) = dial(&service, &d2, cfg2, "127.0.113.1").await.unwrap();
            let (a, b) = tokio::join!(ask(conn1, payload.clone()), ask(conn2, payload.clone()));
            assert_eq!(a, want.as_slice());
            assert_eq!(b, want.as_slice());
            (c1, c2)
        });
        drop(c2);
        // Replace the server: the same address, a fresh endpoint.
        rt.block_on(server.shutdown(Duration::from_secs(10)));
        let server = serve(&lo);
        let service = server.bootstrap.to_string();
        rt.block_on(async {
            let cfg = load("c1").client_config(b"t/1").unwrap();
            let conn = c1.connect(&service, cfg, "127.0.113.1").await.unwrap();
            assert_eq!(ask(conn, payload.clone()).await, want.as_slice());
            // The wrong name is refused by the client's verification.
            let cfg = load("c1").client_config(b"t/1").unwrap();
            let err = c1.connect(&service, cfg, "elsewhere").await.unwrap_err();
            assert!(format!("{err:#}").contains("certificate"), "{err:#}");
        });
        assert!(c1.socket_stats().recv_packets > 0);
    }
}
