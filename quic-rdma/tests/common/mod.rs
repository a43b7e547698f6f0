//! The simulated pair harness (like quinn's `Pair`): a quinn client and server
//! over the `sim` fabric, with helpers to move data and verify it end to end.
#![allow(dead_code, unreachable_pub)]

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use quic_rdma::fabric::sim::{SimConfig, SimFabric, SimQp, SimQpHandle, SimQpOptions};
use quic_rdma::fabric::Gid;
use quic_rdma::quinn_adapter::{self, RdmaUdpSocket};
use quic_rdma::socket::{SocketConfig, UdSocket};
use sha2::{Digest, Sha256};

pub type SimSocket = Arc<RdmaUdpSocket<SimQp>>;

/// Self-signed certificate for "localhost" and a client config trusting it.
pub struct Certs {
    pub server: quinn::ServerConfig,
    pub client: quinn::ClientConfig,
}

pub fn certs(mtu: usize) -> Certs {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let cert = ck.cert.der().clone();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(ck.key_pair.serialize_der().into());
    let mut server = quinn::ServerConfig::with_single_cert(vec![cert.clone()], key).unwrap();
    server.transport_config(quinn_adapter::transport(mtu));
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert).unwrap();
    let mut client = quinn::ClientConfig::with_root_certificates(Arc::new(roots)).unwrap();
    client.transport_config(quinn_adapter::transport(mtu));
    Certs { server, client }
}

pub fn gid(n: u8, ipv4: bool) -> Gid {
    if ipv4 {
        Ipv4Addr::new(10, 0, 0, n).into()
    } else {
        Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, u16::from(n)).into()
    }
}

pub fn socket_on(fabric: &SimFabric, g: Gid, cfg: SocketConfig) -> (SimSocket, SimQpHandle) {
    let qp = fabric.create_qp(g, SimQpOptions::default()).unwrap();
    let h = qp.handle();
    (
        Arc::new(RdmaUdpSocket::new(UdSocket::new(qp, cfg).unwrap())),
        h,
    )
}

pub fn endpoint<Q: quic_rdma::fabric::UdQueuePair>(
    sock: &Arc<RdmaUdpSocket<Q>>,
    server: Option<quinn::ServerConfig>,
    key: u32,
) -> quinn::Endpoint {
    quinn::Endpoint::new_with_abstract_socket(
        quinn_adapter::endpoint_config(sock.mtu(), key),
        server,
        sock.clone(),
        Arc::new(quinn::TokioRuntime),
    )
    .unwrap()
}

/// A connected quinn client and server over one `sim` fabric.
pub struct Pair {
    pub fabric: SimFabric,
    pub server: quinn::Endpoint,
    pub client: quinn::Endpoint,
    pub server_sock: SimSocket,
    pub client_sock: SimSocket,
    pub client_qp: SimQpHandle,
    pub server_addr: SocketAddr,
    pub client_cfg: quinn::ClientConfig,
}

impl Pair {
    pub fn new(cfg: SimConfig) -> Pair {
        Self::with(cfg, false, SocketConfig::default(), SocketConfig::default())
    }

    pub fn with(
        cfg: SimConfig,
        ipv4: bool,
        client_sc: SocketConfig,
        server_sc: SocketConfig,
    ) -> Pair {
        let fabric = SimFabric::new(cfg);
        let (server_sock, _) = socket_on(&fabric, gid(1, ipv4), server_sc);
        let (client_sock, client_qp) = socket_on(&fabric, gid(2, ipv4), client_sc);
        let certs = certs(server_sock.mtu());
        let server = endpoint(&server_sock, Some(certs.server), 0x5e);
        let client = endpoint(&client_sock, None, 0xc1);
        let server_addr = server_sock.ud_addr().to_socket_addr();
        Pair {
            fabric,
            server,
            client,
            server_sock,
            client_sock,
            client_qp,
            server_addr,
            client_cfg: certs.client,
        }
    }

    /// Handshake: the client's and the server's view of the new connection.
    pub async fn connect(&self) -> (quinn::Connection, quinn::Connection) {
        let connecting = self
            .client
            .connect_with(self.client_cfg.clone(), self.server_addr, "localhost")
            .unwrap();
        let server = self.server.clone();
        let accept = tokio::spawn(async move { server.accept().await.unwrap().await.unwrap() });
        let c = connecting.await.unwrap();
        let s = accept.await.unwrap();
        (c, s)
    }
}

/// Deterministic test data: chunk `i` of a stream seeded by `seed`.
pub fn fill_chunk(buf: &mut [u8], seed: u64, i: u64) {
    let mut x = seed ^ (i.wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1;
    for b in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let bytes = x.to_le_bytes();
        b.copy_from_slice(&bytes[..b.len()]);
    }
}

/// Write `len` bytes of seeded data to `send`, finish, and return their sha256.
pub async fn write_data(send: &mut quinn::SendStream, len: u64, seed: u64) -> [u8; 32] {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut left = len;
    let mut i = 0;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        fill_chunk(&mut buf[..n], seed, i);
        h.update(&buf[..n]);
        send.write_all(&buf[..n]).await.unwrap();
        left -= n as u64;
        i += 1;
    }
    send.finish().unwrap();
    h.finalize().into()
}

/// Read a stream to its end: (bytes, sha256).
pub async fn read_data(recv: &mut quinn::RecvStream) -> (u64, [u8; 32]) {
    let mut h = Sha256::new();
    let mut n = 0u64;
    while let Some(chunk) = recv.read_chunk(usize::MAX, true).await.unwrap() {
        n += chunk.bytes.len() as u64;
        h.update(&chunk.bytes);
    }
    (n, h.finalize().into())
}

/// Send `len` bytes client → server on a fresh stream; the server echoes back the
/// byte count and sha256 it computed; assert both equal what was sent.
pub async fn transfer(client: &quinn::Connection, server: &quinn::Connection, len: u64, seed: u64) {
    let srv = server.clone();
    let sink = tokio::spawn(async move {
        let (mut tx, mut rx) = srv.accept_bi().await.unwrap();
        let (n, digest) = read_data(&mut rx).await;
        tx.write_all(&n.to_be_bytes()).await.unwrap();
        tx.write_all(&digest).await.unwrap();
        tx.finish().unwrap();
        let _ = tx.stopped().await;
    });
    let (mut tx, mut rx) = client.open_bi().await.unwrap();
    let sent = write_data(&mut tx, len, seed).await;
    let reply = rx.read_to_end(40).await.unwrap();
    sink.await.unwrap();
    assert_eq!(
        u64::from_be_bytes(reply[..8].try_into().unwrap()),
        len,
        "byte count"
    );
    assert_eq!(
        &reply[8..],
        &sent[..],
        "sha256 of what arrived equals what was sent"
    );
}
