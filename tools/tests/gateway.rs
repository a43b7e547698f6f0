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
mod gateway_support;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{json_of, qr, wait_for_file, Guard, TempDir};
use gateway_support::{
    client_trusting, receive_and_answer, send_and_verify, server_cert, settled_scrape,
    udp_transport,
};
use quic_rdma::fabric::sim::{SimConfig, SimFabric, SimQpOptions};
use quic_rdma::fabric::{Gid, Mtu, UdQueuePair};
use quic_rdma::quinn_adapter::{self, RdmaUdpSocket};
use quic_rdma::socket::{SocketConfig, UdSocket};
use quic_rdma_tools::gateway::{
    self, FabricSocket, GatewaySnapshot, GatewayStats, Limits, QpFactory,
};
use quic_rdma_tools::metric::sample;

const BODY: u64 = 64 << 20;

fn ip(last: u8) -> IpAddr {
    IpAddr::from([127, 0, 116, last])
}

fn adapter_endpoint(
    sock: Arc<RdmaUdpSocket<Box<dyn UdQueuePair>>>,
    server: Option<quinn::ServerConfig>,
    key: u32,
) -> quinn::Endpoint {
    quinn::Endpoint::new_with_abstract_socket(
        quinn_adapter::FabricConfig::new(sock.mtu())
            .routing_key(key)
            .endpoint_config(),
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
    let (cert, scfg) = server_cert(quinn_adapter::FabricConfig::new(ssock.mtu()).transport());
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
            socket_config: gateway::client_socket_config(),
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
    assert_eq!(
        (s.clients_admitted, s.clients_validated, s.clients_active),
        (1, 1, 1),
        "{s:?}"
    );
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
            client_trusting(
                cert,
                quinn_adapter::FabricConfig::new(csock.mtu()).transport(),
            ),
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
    assert_eq!((s.clients_admitted, s.clients_validated), (1, 1), "{s:?}");
    assert!(s.udp_tx >= BODY / 4096, "{s:?}");
    assert_eq!(s.drops(), 0, "{s:?}");
    gw.abort();
}

/// A QUIC long header (`first` byte, v1) with the given CIDs, `len` bytes.
fn long_header(first: u8, dcid: &[u8], scid: &[u8], len: usize) -> Vec<u8> {
    let mut d = vec![first, 0, 0, 0, 1, dcid.len() as u8];
    d.extend_from_slice(dcid);
    d.push(scid.len() as u8);
    d.extend_from_slice(scid);
    d.resize(len, 0);
    d
}

/// The next datagram on a fabric socket, or `None` after `wait`.
async fn fabric_recv(sock: &FabricSocket, wait: Duration) -> Option<(Vec<u8>, SocketAddr)> {
    use quinn::AsyncUdpSocket as _;
    let mut buf = vec![0u8; sock.mtu()];
    let got = tokio::time::timeout(
        wait,
        std::future::poll_fn(|cx| {
            let mut bufs = [std::io::IoSliceMut::new(&mut buf)];
            let mut meta = [quinn::udp::RecvMeta::default()];
            sock.poll_recv(cx, &mut bufs, &mut meta)
                .map_ok(|_| (meta[0].len, meta[0].addr))
        }),
    )
    .await
    .ok()?
    .unwrap();
    Some((buf[..got.0].to_vec(), got.1))
}

fn fabric_send(sock: &FabricSocket, to: SocketAddr, data: &[u8]) {
    use quinn::AsyncUdpSocket as _;
    sock.try_send(&quinn::udp::Transmit {
        destination: to,
        ecn: None,
        contents: data,
        segment_size: None,
        src_ip: None,
    })
    .unwrap();
}

/// Poll `stats` until `done` holds (5 s at most).
async fn until(stats: &GatewayStats, done: impl Fn(&GatewaySnapshot) -> bool) -> GatewaySnapshot {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let s = stats.snapshot();
        if done(&s) {
            return s;
        }
        assert!(Instant::now() < deadline, "{s:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The admission rules, step by step, against a raw fabric target: junk gets
/// nothing; an Initial gets an unvalidated entry, answered at most 3×; the
/// oldest unvalidated entry makes room for a new one; naming the server's CID
/// validates; a full validated tier refuses; both tiers expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_clients_get_state_for_initials_and_prove_their_address() {
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
                max_clients: 1,
                max_unvalidated: 2,
                unvalidated_expiry: Duration::from_millis(1500),
                idle_timeout: Duration::from_millis(300),
                ..Limits::default()
            },
            socket_config: gateway::client_socket_config(),
        },
        stats.clone(),
    ));
    let senders: Vec<std::net::UdpSocket> = (0..4)
        .map(|n| {
            let s = std::net::UdpSocket::bind((ip(31 + n), 0)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            s
        })
        .collect();
    let initial = |n: u8| long_header(0xC0, &[n; 8], &[n; 8], 1200);

    // Junk and a short Initial from unknown sources: dropped, nothing made.
    senders[0].send_to(&[0x40; 40], gw_addr).unwrap();
    senders[0].send_to(&initial(0)[..1199], gw_addr).unwrap();
    let s = until(&stats, |s| s.udp_rx == 2).await;
    assert_eq!((s.drop_not_initial, s.clients_admitted), (2, 0), "{s:?}");

    // Three Initials, two unvalidated places: the oldest is evicted.
    for (n, sender) in senders.iter().enumerate().take(3) {
        sender.send_to(&initial(n as u8), gw_addr).unwrap();
        until(&stats, |s| s.fabric_tx == n as u64 + 1).await;
    }
    let s = stats.snapshot();
    assert_eq!(
        (s.clients_admitted, s.clients_evicted, s.clients_unvalidated),
        (3, 1, 2),
        "{s:?}"
    );
    // The target hears three queue pairs; it answers the second client's
    // with 1 400-byte long headers naming its CID: two fit 3 × 1 200 bytes.
    let mut from = Vec::new();
    for _ in 0..3 {
        from.push(fabric_recv(&target, Duration::from_secs(2)).await.unwrap());
    }
    let (_, second) = from.iter().find(|(d, _)| d[6] == 1).unwrap().clone();
    // The target's own peer table holds it to 3× as well; naming the peer
    // admits it there, so what is held back below is the gateway's doing.
    let second = target.peer_addr(target.ud_addr_of(second).unwrap());
    let server_cid = [0xAB; 12];
    let answer = long_header(0xC0, &[1; 8], &server_cid, 1400);
    for _ in 0..3 {
        fabric_send(&target, second, &answer);
    }
    let s = until(&stats, |s| s.udp_tx + s.drop_amplification == 3).await;
    assert_eq!((s.udp_tx, s.drop_amplification), (2, 1), "{s:?}");
    let mut buf = [0u8; 2048];
    for _ in 0..2 {
        assert_eq!(senders[1].recv(&mut buf).unwrap(), 1400);
    }
    // A Handshake packet to another CID proves nothing; to the server's, it does.
    senders[1]
        .send_to(&long_header(0xE0, &[0xCD; 12], &[1; 8], 100), gw_addr)
        .unwrap();
    senders[1]
        .send_to(&long_header(0xE0, &server_cid, &[1; 8], 100), gw_addr)
        .unwrap();
    let s = until(&stats, |s| s.fabric_tx == 5).await;
    assert_eq!(
        (s.clients_validated, s.clients_unvalidated),
        (1, 1),
        "{s:?}"
    );
    for _ in 0..4 {
        fabric_send(&target, second, &answer);
    }
    until(&stats, |s| s.udp_tx == 6).await;
    // One validated place, taken: a new client is refused; a datagram over
    // the fabric MTU is dropped.
    senders[3].send_to(&initial(3), gw_addr).unwrap();
    senders[1].send_to(&vec![0x40; 5000], gw_addr).unwrap();
    let s = until(&stats, |s| s.drop_refused == 1 && s.drop_too_big == 1).await;
    assert_eq!(s.clients_admitted, 3, "{s:?}");
    // The unvalidated client expires at 1.5 s, the silent validated one after
    // 300 ms idle; then the refused client gets in.
    let s = until(&stats, |s| {
        s.clients_expired_unvalidated == 1 && s.clients_expired == 1
    })
    .await;
    assert_eq!(s.clients_active, 0, "{s:?}");
    senders[3].send_to(&initial(3), gw_addr).unwrap();
    let s = until(&stats, |s| s.clients_admitted == 4).await;
    assert_eq!((s.clients_active, s.unaccounted()), (1, 0), "{s:?}");
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
