//! A second unmodified quinn-based crate over the fabric, to show the drop-in is
//! not h3-specific: `web-transport-quinn` (WebTransport, its own HTTP/3 CONNECT
//! handshake and stream framing) on quinn endpoints over `sim`. A 64 MiB stream
//! client → server, the server answers its byte count and sha256, both checked.

mod common;

#[path = "../examples/h3_common/mod.rs"]
mod h3_common;

use std::time::Duration;

use common::{endpoint, gid, socket_on};
use quic_rdma::fabric::sim::{SimConfig, SimFabric};
use quic_rdma::quinn_adapter;
use quic_rdma::socket::SocketConfig;
use sha2::{Digest, Sha256};

const BODY: u64 = 64 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webtransport_64mib_over_sim() {
    assert_eq!(
        web_transport_quinn::ALPN,
        h3_common::ALPN_H3,
        "the configs announce it"
    );
    let fabric = SimFabric::new(SimConfig::default());
    let (ssock, _) = socket_on(&fabric, gid(1, true), SocketConfig::default());
    let (csock, _) = socket_on(&fabric, gid(2, true), SocketConfig::default());
    let mtu = ssock.mtu();
    let (cert, server_cfg) =
        h3_common::server_config(quinn_adapter::FabricConfig::new(mtu).transport()).unwrap();
    let server = endpoint(&ssock, Some(server_cfg), 0x3e1);
    let client = endpoint(&csock, None, 0xc17);

    let srv = server.clone();
    let served = tokio::spawn(async move {
        let conn = srv.accept().await.unwrap().await.unwrap();
        let request = web_transport_quinn::accept(conn).await.unwrap();
        assert_eq!(request.url().path(), "/upload");
        let session = request.ok().await.unwrap();
        let (mut tx, mut rx) = session.accept_bi().await.unwrap();
        let mut h = Sha256::new();
        let mut n = 0u64;
        while let Some(c) = rx.read_chunk(usize::MAX, true).await.unwrap() {
            n += c.bytes.len() as u64;
            h.update(&c.bytes);
        }
        let digest: [u8; 32] = h.finalize().into();
        tx.write_all(&n.to_be_bytes()).await.unwrap();
        tx.write_all(&digest).await.unwrap();
        tx.finish().unwrap();
        let _ = tokio::time::timeout(Duration::from_secs(5), session.closed()).await;
        (n, digest)
    });

    let cfg =
        h3_common::client_config(cert, quinn_adapter::FabricConfig::new(mtu).transport()).unwrap();
    let conn = client
        .connect_with(cfg, csock.peer_addr(ssock.ud_addr()), "localhost")
        .unwrap()
        .await
        .unwrap();
    let url = url::Url::parse("https://localhost/upload").unwrap();
    let session = web_transport_quinn::connect_with(conn, &url).await.unwrap();
    let (mut tx, mut rx) = session.open_bi().await.unwrap();
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let (mut left, mut i) = (BODY, 0);
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        h3_common::body_chunk(&mut buf[..n], i);
        h.update(&buf[..n]);
        tx.write_all(&buf[..n]).await.unwrap();
        left -= n as u64;
        i += 1;
    }
    tx.finish().unwrap();
    let sent: [u8; 32] = h.finalize().into();
    let verdict = rx.read_to_end(40).await.unwrap();
    session.close(0, b"done");
    assert_eq!(u64::from_be_bytes(verdict[..8].try_into().unwrap()), BODY);
    assert_eq!(
        &verdict[8..],
        &sent,
        "the server's sha256 equals the one sent"
    );
    let (n, digest) = served.await.unwrap();
    assert_eq!((n, digest), (BODY, sent));
    assert!(csock.stats().sent_wrs >= BODY / mtu as u64);
}
