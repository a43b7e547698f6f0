//! Liveness of quinn connections over the `sim` fabric with the adapter's
//! transport config: a killed peer is noticed by the receive-path watcher
//! (`quinn_adapter::watch`) in seconds, not after the 30 s idle timeout, and
//! keep-alives hold an idle but live connection open past the engine's idle
//! timeout with the watchers quiet. quinn reads the system clock, so these run in
//! real time; the bounds are generous (they check liveness, not speed).

mod common;

use std::time::{Duration, Instant};

use common::{certs, endpoint, gid, socket_on, transfer, Pair};
use quic_rdma::fabric::sim::{SimConfig, SimFabric};
use quic_rdma::quinn_adapter::{self, Liveness, Watched, DEFAULT_DEAD_AFTER};
use quic_rdma::socket::SocketConfig;

/// A dead peer must be reported within this (quinn's default idle timeout is 30 s).
const REPORT_BOUND: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_server_is_reported_timed_out() {
    let fabric = SimFabric::new(SimConfig::default());
    let (server_sock, _) = socket_on(&fabric, gid(1, false), SocketConfig::default());
    let (client_sock, _) = socket_on(&fabric, gid(2, false), SocketConfig::default());
    let certs = certs(server_sock.mtu());
    let server_addr = client_sock.peer_addr(server_sock.ud_addr());

    // The server lives in a runtime of its own, standing for its process: shutting
    // that runtime down ends its endpoint and connection tasks without a
    // CONNECTION_CLOSE, as a kill -9 would.
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let accepted = {
        let _in_server = server_rt.enter();
        let server = endpoint(&server_sock, Some(certs.server), 0x5e);
        let (tx, rx) = tokio::sync::oneshot::channel();
        server_rt.spawn(async move {
            let conn = server.accept().await.unwrap().await.unwrap();
            tx.send(()).unwrap();
            // Hold the connection (and the endpoint) until the runtime dies.
            let _keep = (conn, server);
            std::future::pending::<()>().await;
        });
        rx
    };
    drop(server_sock);

    let client = endpoint(&client_sock, None, 0xc1);
    let conn = client
        .connect_with(certs.client, server_addr, "localhost")
        .unwrap()
        .await
        .unwrap();
    accepted.await.unwrap();
    // One round trip on a stream, so the connection is in use before the kill.
    let (mut tx, mut rx) = conn.open_bi().await.unwrap();
    tx.write_all(b"ping").await.unwrap();
    tx.finish().unwrap();
    drop(rx.stop(0u32.into()));

    // The receive-path watcher notices the silence (quinn's own idle timeout
    // in the adapter is 30 s: a busy host must not kill live connections).
    let watcher = quinn_adapter::spawn_watch(client_sock.clone(), conn.clone(), DEFAULT_DEAD_AFTER);
    server_rt.shutdown_background();
    let killed = Instant::now();
    let watched = tokio::time::timeout(REPORT_BOUND * 2, watcher)
        .await
        .expect("the watcher gave no verdict within twice the bound")
        .unwrap();
    let took = killed.elapsed();
    let reason = conn.closed().await;
    eprintln!("watcher: {watched:?}, client saw {reason:?} after {took:?}");
    match watched {
        Watched::PeerSilent(silent) => assert!(silent >= DEFAULT_DEAD_AFTER, "{silent:?}"),
        other => panic!("the watcher did not call the peer silent: {other:?}"),
    }
    assert_eq!(reason, quinn::ConnectionError::LocallyClosed, "reason");
    assert!(took < REPORT_BOUND, "dead server noticed after {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_holds_an_idle_connection_past_the_idle_timeout() {
    let p = Pair::new(SimConfig::default());
    let (c, s) = p.connect().await;
    let pings_before = c.stats().frame_tx.ping;
    let watchers = [
        quinn_adapter::spawn_watch(p.client_sock.clone(), c.clone(), DEFAULT_DEAD_AFTER),
        quinn_adapter::spawn_watch(p.server_sock.clone(), s.clone(), DEFAULT_DEAD_AFTER),
    ];
    tokio::time::sleep(3 * Liveness::DEFAULT_IDLE_TIMEOUT).await;
    assert_eq!(c.close_reason(), None, "client side closed while idle");
    assert_eq!(s.close_reason(), None, "server side closed while idle");
    assert!(
        watchers.iter().all(|w| !w.is_finished()),
        "a watcher called an idle but live peer dead"
    );
    let pings = c.stats().frame_tx.ping - pings_before;
    assert!(pings >= 3, "keep-alive PINGs sent while idle: {pings}");
    transfer(&c, &s, 1 << 20, 41).await;
}
