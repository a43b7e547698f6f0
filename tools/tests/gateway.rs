//! `qr gateway`: QUIC between a plain UDP endpoint and a fabric endpoint through
//! the gateway, TLS end to end (each client trusts exactly the far server's
//! certificate: the gateway holds no key). 64 MiB each way, sha256 equal, and
//! the gateway's counters reconcile (datagrams in = out + counted drops).
//!
//! - in process over `sim` (the library, `quic_rdma_tools::gateway`), both
//!   directions;
//! - over `soft` between processes: a stock quinn client on a UDP socket →
//!   `qr gateway to-fabric` (fabric MTU 2048, so path-MTU probes above it are
//!   dropped and counted, and the client settles below) → `qr serve`; and
//!   `qr connect` → `qr gateway to-udp` → a stock quinn server on UDP.
//!
//! Addresses 127.0.116.x, TCP/UDP ports 19800-19899.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{json_of, qr, wait_for_file, Guard, TempDir};
use quic_rdma::fabric::sim::{SimConfig, SimFabric, SimQpOptions};
use quic_rdma::fabric::{Gid, Mtu, UdQueuePair};
use quic_rdma::quinn_adapter::{self, RdmaUdpSocket};
use quic_rdma::socket::{SocketConfig, UdSocket};
use quic_rdma_tools::gateway::{self, GatewaySnapshot, GatewayStats, Limits, QpFactory};
use quic_rdma_tools::image::metrics::sample;
use sha2::{Digest, Sha256};

const BODY: u64 = 64 << 20;

fn ip(last: u8) -> IpAddr {
    IpAddr::from([127, 0, 116, last])
}

// ---- the workload: the same protocol as `qr serve` (crate::workload) ----

/// Deterministic data, chunk `i`.
fn fill(buf: &mut [u8], i: u64) {
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for b in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        b.copy_from_slice(&x.to_le_bytes()[..b.len()]);
    }
}

/// Client: send `len` bytes on a new stream, read the server's verdict
/// (8-byte count, sha256); assert both equal what was sent.
async fn send_and_verify(conn: &quinn::Connection, len: u64) {
    let (mut tx, mut rx) = conn.open_bi().await.unwrap();
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let (mut left, mut i) = (len, 0);
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        fill(&mut buf[..n], i);
        h.update(&buf[..n]);
        tx.write_all(&buf[..n]).await.unwrap();
        left -= n as u64;
        i += 1;
    }
    tx.finish().unwrap();
    let sent: [u8; 32] = h.finalize().into();
    let verdict = rx.read_to_end(40).await.unwrap();
    assert_eq!(u64::from_be_bytes(verdict[..8].try_into().unwrap()), len);
    assert_eq!(
        &verdict[8..],
        &sent,
        "sha256 at the server equals the one sent"
    );
}

/// Server: read the first stream to its end, answer count + sha256 (returned),
/// then echo a second stream (`qr connect`'s ping-pong) if one comes.
async fn receive_and_answer(conn: quinn::Connection) -> (u64, [u8; 32]) {
    let (mut tx, mut rx) = conn.accept_bi().await.unwrap();
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
    let c = conn.clone();
    tokio::spawn(async move {
        if let Ok((mut tx, mut rx)) = c.accept_bi().await {
            while let Ok(Some(chunk)) = rx.read_chunk(usize::MAX, true).await {
                if tx.write_chunk(chunk.bytes).await.is_err() {
                    return;
                }
            }
            let _ = tx.finish();
        }
    });
    (n, digest)
}

/// The application protocol of `qr serve` / `qr connect`'s workload (ALPN).
const ALPN: &[u8] = b"qr-demo/1";

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A self-signed certificate for "localhost": (DER, server config with `transport`).
fn server_cert(
    transport: Arc<quinn::TransportConfig>,
) -> (
    rustls::pki_types::CertificateDer<'static>,
    quinn::ServerConfig,
) {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let cert = ck.cert.der().clone();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(ck.key_pair.serialize_der().into());
    let mut tls = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.clone()], key)
        .unwrap();
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls).unwrap();
    let mut cfg = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    cfg.transport_config(transport);
    (cert, cfg)
}

fn client_trusting(
    cert: rustls::pki_types::CertificateDer<'static>,
    transport: Arc<quinn::TransportConfig>,
) -> quinn::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert).unwrap();
    let mut tls = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap();
    let mut c = quinn::ClientConfig::new(Arc::new(crypto));
    c.transport_config(transport);
    c
}

/// A stock UDP-side transport whose path-MTU search may go up to 4096 bytes
/// (quinn's default stops at 1452, below any fabric MTU).
fn udp_transport() -> Arc<quinn::TransportConfig> {
    let mut mtud = quinn::MtuDiscoveryConfig::default();
    mtud.upper_bound(4096).interval(Duration::from_millis(200));
    let mut t = quinn::TransportConfig::default();
    t.mtu_discovery_config(Some(mtud));
    Arc::new(t)
}

fn adapter_endpoint(
    sock: Arc<RdmaUdpSocket<Box<dyn UdQueuePair>>>,
    server: Option<quinn::ServerConfig>,
    key: u32,
) -> quinn::Endpoint {
    quinn::Endpoint::new_with_abstract_socket(
        quinn_adapter::endpoint_config(sock.mtu(), key),
        server,
        sock,
        Arc::new(quinn::TokioRuntime),
    )
    .unwrap()
}

fn sim_socket(fabric: &SimFabric, gid: Gid) -> Arc<RdmaUdpSocket<Box<dyn UdQueuePair>>> {
    let qp: Box<dyn UdQueuePair> =
        Box::new(fabric.create_qp(gid, SimQpOptions::default()).unwrap());
    Arc::new(RdmaUdpSocket::new(
        UdSocket::new(qp, SocketConfig::default()).unwrap(),
    ))
}

/// Wait until the counters stop moving (the connections closed), then assert
/// they reconcile.
async fn settled(stats: &GatewayStats) -> GatewaySnapshot {
    let mut last = stats.snapshot();
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = stats.snapshot();
        if now == last {
            assert_eq!(
                now.unaccounted(),
                0,
                "every datagram forwarded or counted: {now:?}"
            );
            return now;
        }
        last = now;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_udp_client_to_fabric_server_and_fabric_client_to_udp_server() {
    let fabric = SimFabric::new(SimConfig::default());
    let v6 = |n: u16| Gid::from(std::net::Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, n));

    // UDP client -> gateway -> fabric server.
    let ssock = sim_socket(&fabric, v6(1));
    let (cert, scfg) = server_cert(quinn_adapter::transport(ssock.mtu()));
    let server = adapter_endpoint(ssock.clone(), Some(scfg), 0x5e1);
    let udp = tokio::net::UdpSocket::bind((ip(1), 0)).await.unwrap();
    let gw_addr = udp.local_addr().unwrap();
    let new_qp: QpFactory = {
        let fabric = fabric.clone();
        Arc::new(move || {
            fabric
                .create_qp(v6(3), SimQpOptions::default())
                .map(|q| Box::new(q) as Box<dyn UdQueuePair>)
        })
    };
    let stats = Arc::new(GatewayStats::default());
    let gw = tokio::spawn(gateway::to_fabric(
        gateway::ToFabric {
            udp,
            new_qp,
            target: ssock.ud_addr(),
            limits: Limits::default(),
            socket_config: SocketConfig::default(),
        },
        stats.clone(),
    ));
    let srv = server.clone();
    let accepted = tokio::spawn(async move {
        let conn = srv.accept().await.unwrap().await.unwrap();
        let got = receive_and_answer(conn.clone()).await;
        let _ = conn.closed().await;
        got
    });
    let client = quinn::Endpoint::client(SocketAddr::new(ip(2), 0)).unwrap();
    let conn = client
        .connect_with(client_trusting(cert, udp_transport()), gw_addr, "localhost")
        .unwrap()
        .await
        .unwrap();
    send_and_verify(&conn, BODY).await;
    conn.close(0u32.into(), b"done");
    let (n, _) = accepted.await.unwrap();
    assert_eq!(n, BODY);
    let s = settled(&stats).await;
    eprintln!("to-fabric over sim: {s:?}");
    assert_eq!((s.clients_admitted, s.clients_active), (1, 1));
    // The client's path-MTU search went up to the fabric's 4096.
    assert!(s.fabric_tx >= BODY / 4096, "{s:?}");
    assert!(
        s.udp_rx_bytes / s.udp_rx > 2048,
        "mostly full-size datagrams: {s:?}"
    );
    assert_eq!(
        s.drop_refused + s.drop_foreign + s.drop_client_setup,
        0,
        "{s:?}"
    );
    gw.abort();

    // Fabric client -> gateway -> UDP server.
    let (cert, scfg) = server_cert(udp_transport());
    let udp_server = quinn::Endpoint::server(scfg, SocketAddr::new(ip(4), 0)).unwrap();
    let target = udp_server.local_addr().unwrap();
    let listener = sim_socket(&fabric, v6(5));
    let stats = Arc::new(GatewayStats::default());
    let gw = tokio::spawn(gateway::to_udp(
        gateway::ToUdp {
            listener: listener.clone(),
            bind_ip: ip(4),
            target,
            limits: Limits::default(),
        },
        stats.clone(),
    ));
    let srv = udp_server.clone();
    let accepted = tokio::spawn(async move {
        let conn = srv.accept().await.unwrap().await.unwrap();
        let got = receive_and_answer(conn.clone()).await;
        let _ = conn.closed().await;
        got
    });
    let csock = sim_socket(&fabric, v6(6));
    let client = adapter_endpoint(csock.clone(), None, 0xc16);
    let conn = client
        .connect_with(
            client_trusting(cert, quinn_adapter::transport(csock.mtu())),
            csock.peer_addr(listener.ud_addr()),
            "localhost",
        )
        .unwrap()
        .await
        .unwrap();
    send_and_verify(&conn, BODY).await;
    conn.close(0u32.into(), b"done");
    let (n, _) = accepted.await.unwrap();
    assert_eq!(n, BODY);
    let s = settled(&stats).await;
    eprintln!("to-udp over sim: {s:?}");
    assert_eq!(s.clients_admitted, 1);
    assert!(s.udp_tx >= BODY / 4096, "{s:?}");
    assert_eq!(s.drops(), 0, "{s:?}");
    gw.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_bounded_table_refuses_and_expires() {
    let fabric = SimFabric::new(SimConfig::default());
    let v6 = |n: u16| Gid::from(std::net::Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 1, n));
    let target = sim_socket(&fabric, v6(1));
    let udp = tokio::net::UdpSocket::bind((ip(30), 0)).await.unwrap();
    let gw_addr = udp.local_addr().unwrap();
    let new_qp: QpFactory = {
        let fabric = fabric.clone();
        Arc::new(move || {
            fabric
                .create_qp(v6(2), SimQpOptions::default())
                .map(|q| Box::new(q) as Box<dyn UdQueuePair>)
        })
    };
    let stats = Arc::new(GatewayStats::default());
    let gw = tokio::spawn(gateway::to_fabric(
        gateway::ToFabric {
            udp,
            new_qp,
            target: target.ud_addr(),
            limits: Limits {
                max_clients: 2,
                idle_timeout: Duration::from_millis(300),
            },
            socket_config: SocketConfig::default(),
        },
        stats.clone(),
    ));
    let mut senders = Vec::new();
    for n in 0..3 {
        senders.push(std::net::UdpSocket::bind((ip(31 + n), 0)).unwrap());
    }
    // Three clients, two at a time: the third is refused, and a too-big one dropped.
    for s in &senders {
        s.send_to(&[0x40; 1300], gw_addr).unwrap();
    }
    senders[0].send_to(&vec![0x40; 5000], gw_addr).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while stats.snapshot().udp_rx < 4 {
        assert!(Instant::now() < deadline, "{:?}", stats.snapshot());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let s = stats.snapshot();
    assert_eq!(
        (s.clients_admitted, s.drop_refused, s.drop_too_big),
        (2, 1, 1),
        "{s:?}"
    );
    assert_eq!(s.fabric_tx, 2);
    assert_eq!(s.unaccounted(), 0);
    // After the idle timeout both expire and the third client gets in.
    let deadline = Instant::now() + Duration::from_secs(5);
    while stats.snapshot().clients_expired < 2 {
        assert!(Instant::now() < deadline, "{:?}", stats.snapshot());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    senders[2].send_to(&[0x40; 1300], gw_addr).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while stats.snapshot().clients_admitted < 3 {
        assert!(Instant::now() < deadline, "{:?}", stats.snapshot());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let s = stats.snapshot();
    assert_eq!((s.clients_active, s.fabric_tx), (1, 3), "{s:?}");
    // Mtu of the sim fabric: what "too big" was measured against.
    assert_eq!(target.mtu(), Mtu::M4096.bytes());
    gw.abort();
}

// ---- over soft, between processes ----

/// GET http://addr/metrics.
fn scrape(addr: &str) -> Option<String> {
    common::http::get_ok(addr, "/metrics")
}

fn scrape_until_up(addr: &str) -> String {
    common::http::when_up(addr, || scrape(addr))
}

/// The counters once they stop moving, checked to reconcile.
fn settled_scrape(addr: &str) -> String {
    let mut last = scrape_until_up(addr);
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let now = scrape_until_up(addr);
        // The gateway's own counters: the scrapes themselves move the
        // listener's (`qr_tcp_*`).
        let gateway = |t: &str| -> Vec<String> {
            t.lines()
                .filter(|l| l.starts_with("qr_gateway_"))
                .map(str::to_string)
                .collect()
        };
        if gateway(&now) == gateway(&last) {
            let g = |n: &str| sample(&now, &format!("qr_gateway_{n}")).unwrap() as u64;
            let inn = g("udp_rx_datagrams_total") + g("fabric_rx_datagrams_total");
            let out = g("udp_tx_datagrams_total") + g("fabric_tx_datagrams_total");
            let drops: u64 = [
                "too_big",
                "refused",
                "foreign",
                "fabric_send",
                "udp_send",
                "client_setup",
            ]
            .iter()
            .map(|d| g(&format!("drop_{d}_total")))
            .sum();
            assert_eq!(inn, out + drops, "gateway counters reconcile:\n{now}");
            return now;
        }
        last = now;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soft_udp_client_through_gateway_to_qr_serve() {
    let dir = TempDir::new("gw-to-fabric");
    let cert = dir.path("serve.der");
    let _serve = Guard::spawn(qr().args([
        "serve",
        "--ip",
        "127.0.116.10",
        "--service-port",
        "19801",
        "--cert-out",
        cert.to_str().unwrap(),
        "--name",
        "localhost",
    ]));
    wait_for_file(&cert, Duration::from_secs(20));
    let metrics = "127.0.116.11:19803";
    let _gw = Guard::spawn(qr().args([
        "gateway",
        "to-fabric",
        "--listen",
        "127.0.116.11:19802",
        "--fabric-ip",
        "127.0.116.11",
        "--fabric-mtu",
        "2048",
        "--target",
        "127.0.116.10:19801",
        "--metrics",
        metrics,
    ]));
    scrape_until_up(metrics);

    let der = rustls::pki_types::CertificateDer::from(std::fs::read(&cert).unwrap());
    let client = quinn::Endpoint::client(SocketAddr::new(ip(12), 0)).unwrap();
    let conn = client
        .connect_with(
            client_trusting(der, udp_transport()),
            "127.0.116.11:19802".parse().unwrap(),
            "localhost",
        )
        .unwrap()
        .await
        .unwrap();
    // Scrape during the transfer: the counters move.
    let during = {
        let c = conn.clone();
        let t = tokio::spawn(async move { send_and_verify(&c, BODY).await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let a = tokio::task::spawn_blocking(move || scrape_until_up(metrics))
            .await
            .unwrap();
        t.await.unwrap();
        a
    };
    let mtu = conn.stats().path.current_mtu;
    conn.close(0u32.into(), b"done");
    client.wait_idle().await;
    let text = tokio::task::spawn_blocking(move || settled_scrape(metrics))
        .await
        .unwrap();
    eprintln!("gateway to-fabric, client path MTU {mtu}:\n{text}");
    let g = |t: &str, n: &str| sample(t, &format!("qr_gateway_{n}")).unwrap();
    assert!(g(&during, "fabric_tx_datagrams_total") > 0.0);
    assert!(g(&text, "fabric_tx_datagrams_total") > g(&during, "fabric_tx_datagrams_total"));
    // Probes above the fabric MTU were dropped and counted; the client's path
    // MTU search settled at or below it, and above QUIC's floor.
    assert!(g(&text, "drop_too_big_total") >= 1.0, "{text}");
    assert!((1200..=2048).contains(&mtu), "client path MTU {mtu}");
    assert!(g(&text, "fabric_tx_datagrams_total") >= (BODY / 2048) as f64);
    assert_eq!(g(&text, "clients_admitted_total"), 1.0);
}

#[test]
fn soft_qr_connect_through_gateway_to_udp_server() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = TempDir::new("gw-to-udp");
    let cert_path = dir.path("udp-server.der");
    let (cert, scfg) = server_cert(udp_transport());
    std::fs::write(&cert_path, &cert).unwrap();
    let target: SocketAddr = "127.0.116.20:19804".parse().unwrap();
    let udp_server = {
        let _rt = rt.enter();
        quinn::Endpoint::server(scfg, target).unwrap()
    };
    let srv = udp_server.clone();
    let accepted = rt.spawn(async move {
        let conn = srv.accept().await.unwrap().await.unwrap();
        let got = receive_and_answer(conn.clone()).await;
        let _ = tokio::time::timeout(Duration::from_secs(10), conn.closed()).await;
        got
    });
    let metrics = "127.0.116.21:19806";
    let _gw = Guard::spawn(qr().args([
        "gateway",
        "to-udp",
        "--fabric-ip",
        "127.0.116.21",
        "--service-port",
        "19805",
        "--target",
        "127.0.116.20:19804",
        "--udp-bind",
        "127.0.116.21",
        "--metrics",
        metrics,
    ]));
    scrape_until_up(metrics);
    let out = Guard::spawn(qr().args([
        "connect",
        "127.0.116.21:19805",
        "--cert",
        cert_path.to_str().unwrap(),
        "--server-name",
        "localhost",
        "--ip",
        "127.0.116.22",
        "--bytes",
        "64M",
        "--pings",
        "200",
        "--json",
    ]))
    .wait(Duration::from_secs(120));
    let r = json_of("qr connect through the gateway", &out);
    assert_eq!(r["ok"], true, "{r:#}");
    assert_eq!(r["transfer"]["sha256_match"], true, "{r:#}");
    assert_eq!(r["transfer"]["bytes_received"], BODY);
    let (n, digest) = rt.block_on(accepted).unwrap();
    assert_eq!(n, BODY);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        r["transfer"]["sha256_sent"], hex,
        "the UDP server got what qr connect sent"
    );
    let text = settled_scrape(metrics);
    eprintln!("gateway to-udp:\n{text}");
    let g = |n: &str| sample(&text, &format!("qr_gateway_{n}")).unwrap();
    assert_eq!(g("clients_admitted_total"), 1.0);
    assert!(g("udp_tx_datagrams_total") >= (BODY / 4096) as f64);
    assert_eq!(
        g("drop_too_big_total"),
        0.0,
        "the UDP server stays below the fabric MTU"
    );
}
