//! A busy host must not kill live quinn connections (issue 22): the root cause,
//! reproduced without the rxe guest, and the adapter's answer to it.
//!
//! quinn's endpoint task reads every packet off the socket and queues it for
//! its connection's task without bound; the connection task handles at most
//! one cooperative budget (128 events) per poll and then judges its timers
//! against the clock. A connection task scheduled late on every wake-up (a
//! busy host; here a runtime that delays each poll of it by [`LAG`]) falls
//! behind the endpoint while the peer keeps sending, and its idle timer —
//! reset only by the packets it has *processed* — expires while fresher
//! packets wait in its queue. The peer was never silent.
//!
//! - `short_idle_timeout_kills_a_live_but_lagging_connection` shows the
//!   mechanism: with the 1.5 s idle timeout the adapter used to default to,
//!   the lagging server times out a live connection (as in the guest).
//! - `adapter_defaults_keep_a_lagging_connection`: the adapter's defaults
//!   (30 s idle timeout) carry the same transfer to its end, sha256 equal
//!   (before issue 22 the adapter's default was 1.5 s, and this failed);
//! - `watchers_stay_quiet_while_a_connection_lags`: the receive-path
//!   watchers on both ends (`quinn_adapter::watch`, 1.5 s) never call the
//!   live peer dead.
//!
//! quinn reads the system clock, so these run in real time on `sim`; the lag
//! is imposed, not left to the machine's load, so the outcome does not
//! depend on how busy the machine is.

mod common;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use common::{certs_with, gid, read_data, socket_on, write_data, SimSocket};
use quic_rdma::fabric::sim::{SimConfig, SimFabric};
use quic_rdma::quinn_adapter::{self, Liveness, Watched, DEFAULT_DEAD_AFTER};
use quic_rdma::socket::SocketConfig;

/// How late every poll of the server's connection task runs.
const LAG: Duration = Duration::from_millis(100);
/// Enough data that the client's windows fill and the server falls well
/// over 1.5 s behind (at most 128 packets per 100 ms are handled).
const LEN: u64 = 24 << 20;

/// tokio, except that every task spawned after the first (quinn spawns the
/// endpoint driver first, then one driver per connection) is polled [`LAG`]
/// after each wake-up: a connection task on a host too busy to run it on time.
#[derive(Debug)]
struct LaggingConnections {
    spawned: AtomicUsize,
}

impl quinn::Runtime for LaggingConnections {
    fn new_timer(&self, t: Instant) -> Pin<Box<dyn quinn::AsyncTimer>> {
        quinn::TokioRuntime.new_timer(t)
    }

    fn spawn(&self, future: Pin<Box<dyn Future<Output = ()> + Send>>) {
        if self.spawned.fetch_add(1, Ordering::Relaxed) == 0 {
            tokio::spawn(future);
        } else {
            tokio::spawn(Late {
                inner: future,
                wait: None,
            });
        }
    }

    fn wrap_udp_socket(
        &self,
        _: std::net::UdpSocket,
    ) -> std::io::Result<Arc<dyn quinn::AsyncUdpSocket>> {
        unreachable!("the endpoint is built over an abstract socket")
    }
}

struct Late {
    inner: Pin<Box<dyn Future<Output = ()> + Send>>,
    wait: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Future for Late {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let wait = self
            .wait
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(LAG)));
        if wait.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        self.wait = None;
        self.inner.as_mut().poll(cx)
    }
}

struct Outcome {
    transfer: Result<(u64, [u8; 32], [u8; 32]), String>,
    server_watch: Option<Watched>,
    client_watch: Option<Watched>,
}

/// A client sending [`LEN`] bytes to a server whose connection task lags,
/// both ends with the adapter's transport config (`quinn_adapter::transport`)
/// or, if given, `liveness`'s timers on it; receive-path watchers on both
/// ends if `watch`.
async fn lagging_transfer(liveness: Option<Liveness>, watch: bool) -> Outcome {
    let fabric = SimFabric::new(SimConfig::default());
    let (server_sock, _) = socket_on(&fabric, gid(1, false), SocketConfig::default());
    let (client_sock, _) = socket_on(&fabric, gid(2, false), SocketConfig::default());
    let mtu = server_sock.mtu();
    let certs = certs_with(mtu, |t| {
        if let Some(l) = liveness {
            l.apply(t)
        }
    });
    let server = endpoint_on(
        &server_sock,
        Some(certs.server),
        0x5e,
        Arc::new(LaggingConnections {
            spawned: AtomicUsize::new(0),
        }),
    );
    let client = endpoint_on(&client_sock, None, 0xc1, Arc::new(quinn::TokioRuntime));
    let srv = server.clone();
    let accept = tokio::spawn(async move { srv.accept().await.unwrap().await });
    let c = client
        .connect_with(
            certs.client,
            client_sock.peer_addr(server_sock.ud_addr()),
            "localhost",
        )
        .unwrap()
        .await
        .expect("handshake");
    let s = accept.await.unwrap().expect("server handshake");
    let watchers = watch.then(|| {
        (
            quinn_adapter::spawn_watch(server_sock.clone(), s.clone(), DEFAULT_DEAD_AFTER),
            quinn_adapter::spawn_watch(client_sock.clone(), c.clone(), DEFAULT_DEAD_AFTER),
        )
    });

    let srv_conn = s.clone();
    let sink = tokio::spawn(async move {
        let (mut tx, mut rx) = srv_conn.accept_bi().await.map_err(|e| e.to_string())?;
        let (n, digest) = read_data(&mut rx).await;
        tx.write_all(&digest).await.map_err(|e| e.to_string())?;
        tx.finish().map_err(|e| e.to_string())?;
        let _ = tx.stopped().await;
        Ok::<_, String>((n, digest))
    });
    let cli_conn = c.clone();
    let send = tokio::spawn(async move {
        let (mut tx, mut rx) = cli_conn.open_bi().await.map_err(|e| e.to_string())?;
        let sent = write_data(&mut tx, LEN, 0x1a9).await;
        let echoed = rx.read_to_end(32).await.map_err(|e| e.to_string())?;
        Ok::<_, String>((sent, echoed))
    });
    // write_data/read_data unwrap their stream errors: on a killed connection
    // the task panics, and the join error says so.
    let sent = send.await;
    let got = sink.await;
    let transfer = match (sent, got) {
        (Ok(Ok((sent, echoed))), Ok(Ok((n, digest)))) => {
            assert_eq!(echoed[..], digest[..], "the server echoed its own digest");
            Ok((n, sent, digest))
        }
        (a, b) => Err(format!(
            "client: {:?}; server: {:?}; client conn: {:?}; server conn: {:?}",
            a.map(|r| r.map(|_| ())),
            b.map(|r| r.map(|_| ())),
            c.close_reason(),
            s.close_reason()
        )),
    };
    c.close(0u32.into(), b"done");
    let (server_watch, client_watch) = match watchers {
        Some((sw, cw)) => (Some(sw.await.unwrap()), Some(cw.await.unwrap())),
        None => (None, None),
    };
    client.wait_idle().await;
    Outcome {
        transfer,
        server_watch,
        client_watch,
    }
}

fn endpoint_on(
    sock: &SimSocket,
    server: Option<quinn::ServerConfig>,
    key: u32,
    runtime: Arc<dyn quinn::Runtime>,
) -> quinn::Endpoint {
    quinn::Endpoint::new_with_abstract_socket(
        quinn_adapter::FabricConfig::new(sock.mtu())
            .routing_key(key)
            .endpoint_config(),
        server,
        sock.clone(),
        runtime,
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_idle_timeout_kills_a_live_but_lagging_connection() {
    let t0 = Instant::now();
    let out = lagging_transfer(Some(Liveness::default()), false).await;
    eprintln!(
        "after {:?}: {:?}",
        t0.elapsed(),
        out.transfer.as_ref().map(|r| r.0)
    );
    let err = out
        .transfer
        .expect_err("a connection task 1.5 s behind its live peer is timed out");
    assert!(
        err.contains("TimedOut"),
        "the server's idle timer fired: {err}"
    );
}

/// The adapter's default transport config: before issue 22 it carried the
/// 1.5 s idle timeout, and this failed as the test above does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adapter_defaults_keep_a_lagging_connection() {
    let t0 = Instant::now();
    let out = lagging_transfer(None, false).await;
    let dt = t0.elapsed();
    let (n, sent, got) = out.transfer.expect("the transfer completes");
    eprintln!(
        "{} MiB through a lagging connection task in {dt:?} ({:.1} Mbit/s)",
        n >> 20,
        n as f64 * 8.0 / dt.as_secs_f64() / 1e6
    );
    assert_eq!(n, LEN, "byte count");
    assert_eq!(sent, got, "sha256 of what arrived equals what was sent");
    assert!(
        dt > 2 * Liveness::DEFAULT_IDLE_TIMEOUT,
        "the imposed lag made the transfer outlast the old idle timeout ({dt:?})"
    );
}

/// The receive-path watchers on both ends never call the live peer of a
/// lagging connection dead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchers_stay_quiet_while_a_connection_lags() {
    let out = lagging_transfer(None, true).await;
    let (n, sent, got) = out.transfer.expect("the transfer completes");
    assert_eq!(n, LEN, "byte count");
    assert_eq!(sent, got, "sha256 of what arrived equals what was sent");
    assert_eq!(out.server_watch, Some(Watched::Closed), "server's watcher");
    assert_eq!(out.client_watch, Some(Watched::Closed), "client's watcher");
}
