//! Load (issue 9): one quinn server endpoint over `soft`, in its own process
//! (`examples/soft_echo_server.rs`), serves 1 000 concurrent connections from
//! 1 000 distinct UD peers (each client its own `soft` port on its own 127.93.x.y
//! address, so each is a separate (GID, QPN) in the server's peer table) and
//! 10 000 short streams, plus one 16 MiB transfer and its own connection;
//! every echo is checked with sha256. Twice: the first round warms the server
//! up, the second must leave its RSS where the first did (with a margin), and
//! the peak per open connection stays within a budget. Every peer is admitted
//! once, within the table's bounds, and every connection closes cleanly.
//!
//! The server binary is an example: `cargo test` builds examples, and this test
//! finds it next to its own executable (target/<profile>/examples).

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::seeded_bytes as payload;
use quic_rdma::fabric::soft::{SoftConfig, SoftPort, SoftQp};
use quic_rdma::fabric::{Gid, UdAddr, DEFAULT_QKEY};
use quic_rdma::quinn_adapter::{self, RdmaUdpSocket};
use quic_rdma::socket::{SocketConfig, UdSocket};
use sha2::{Digest, Sha256};

const SERVER_IP: Ipv4Addr = Ipv4Addr::new(127, 93, 0, 1);
/// The client of the large transfer.
const BIG_IP: Ipv4Addr = Ipv4Addr::new(127, 93, 0, 2);
/// Concurrent connections, each from its own client (UD peer).
const CLIENTS: usize = 1_000;
/// Short streams per connection: 10 000 in all.
const STREAMS_PER_CONN: usize = 10;
/// Bytes of the large transfer.
const BIG_LEN: usize = 16 << 20;
/// The server's peer table bound: just above the peers this test brings.
const MAX_PEERS: u64 = 1_024;
/// Allowed growth of the server's RSS from after round 1 to after round 2
/// (every connection closed both times): a quarter of what keeping each
/// connection's state (about 64 KiB while open) would leave.
const RSS_ROUND_MARGIN_KIB: u64 = 16 << 10;
/// Allowed RSS per open connection at the peak (1 001 connections open).
const RSS_PER_CONN_KIB: u64 = 128;
/// Handshakes in progress at once. More at once overflow the server's UDP
/// receive buffer with Initial retransmissions (quinn's PTO starts from the
/// 2 ms initial RTT) and, with 100, some server handshakes never completed
/// (see the report of this test's commit); all 1 000 at once measured seconds
/// of RTT, so every close then drained for seconds.
const HANDSHAKES_AT_ONCE: usize = 20;
/// Every phase finishes well within this (a hang guard, not a speed target).
const PHASE_TIMEOUT: Duration = Duration::from_secs(90);

fn client_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(127, 93, 1 + (i / 250) as u8, 1 + (i % 250) as u8)
}

/// The echo server process; killed (by its own pid) if the test fails early.
struct Server {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Server {
    fn binary() -> PathBuf {
        // target/<profile>/deps/load_soft-<hash> → target/<profile>/examples/soft_echo_server
        let exe = std::env::current_exe().expect("current_exe");
        let dir = exe
            .parent()
            .and_then(|deps| deps.parent())
            .expect("test executable in target/<profile>/deps");
        let bin = dir.join("examples").join("soft_echo_server");
        assert!(
            bin.is_file(),
            "server binary {} not found: build the examples first \
             (`cargo test` builds them; or `cargo build --release -p quic-rdma --example soft_echo_server`)",
            bin.display()
        );
        bin
    }

    fn spawn(ip: Ipv4Addr, cert: &std::path::Path) -> Server {
        let mut child = Command::new(Self::binary())
            .arg(ip.to_string())
            .arg(cert)
            .arg(MAX_PEERS.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn soft_echo_server");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Server {
            stdin: child.stdin.take(),
            child,
            lines,
        }
    }

    fn line(&mut self, prefix: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.starts_with(prefix) => return l,
                Ok(other) => eprintln!("server: {other}"),
                Err(e) => panic!("no {prefix:?} line from the server: {e:?}"),
            }
        }
    }

    /// The server's UD address from its `READY` line.
    fn ready(&mut self) -> UdAddr {
        let kv = parse(&self.line("READY "));
        let ip: IpAddr = kv["ip"].parse().unwrap();
        UdAddr::new(
            Gid::from(ip),
            kv["qpn"].parse().unwrap(),
            kv["qkey"].parse().unwrap(),
        )
    }

    fn stats(&mut self) -> HashMap<String, u64> {
        let stdin = self.stdin.as_mut().expect("server stdin open");
        stdin.write_all(b"stats\n").unwrap();
        stdin.flush().unwrap();
        parse(&self.line("STATS "))
            .into_iter()
            .map(|(k, v)| (k, v.parse().unwrap()))
            .collect()
    }

    /// Close stdin (the server's signal to exit) and wait for it.
    fn finish(mut self) -> std::process::ExitStatus {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            assert!(
                Instant::now() < deadline,
                "server did not exit on stdin EOF"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn parse(line: &str) -> HashMap<String, String> {
    line.split_whitespace()
        .skip(1)
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A client: its own `soft` port and QP, a small socket, one quinn endpoint.
struct Client {
    endpoint: quinn::Endpoint,
    sock: Arc<RdmaUdpSocket<SoftQp>>,
    _port: SoftPort,
}

impl Client {
    fn new(ip: Ipv4Addr, key: u32, small: bool) -> Client {
        let mut pcfg = SoftConfig::new(IpAddr::V4(ip));
        let mut scfg = SocketConfig::default();
        if small {
            // A client of the crowd sends a few small streams: small queues.
            pcfg.max_send_wr = 128;
            pcfg.max_recv_wr = 256;
            scfg.send_slots = 64;
            scfg.recv_depth = 256;
            scfg.region_bytes = 1 << 20;
            scfg.ah_capacity = 16;
        }
        let port =
            SoftPort::open(pcfg).unwrap_or_else(|e| panic!("open a soft port on {ip}:4791: {e}"));
        let qp = port.create_qp(DEFAULT_QKEY).unwrap();
        let sock = Arc::new(RdmaUdpSocket::new(UdSocket::new(qp, scfg).unwrap()));
        let endpoint = quinn::Endpoint::new_with_abstract_socket(
            quinn_adapter::FabricConfig::new(sock.mtu())
                .routing_key(key)
                .endpoint_config(),
            None,
            sock.clone(),
            Arc::new(quinn::TokioRuntime),
        )
        .unwrap();
        Client {
            endpoint,
            sock,
            _port: port,
        }
    }

    async fn connect(&self, server: UdAddr, cfg: &quinn::ClientConfig) -> quinn::Connection {
        let addr = self.sock.peer_addr(server);
        self.endpoint
            .connect_with(cfg.clone(), addr, "localhost")
            .unwrap()
            .await
            .unwrap()
    }
}

fn client_config(cert_der: Vec<u8>, mtu: usize) -> quinn::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from(cert_der))
        .unwrap();
    let mut c = quinn::ClientConfig::with_root_certificates(Arc::new(roots)).unwrap();
    c.transport_config(quinn_adapter::FabricConfig::new(mtu).transport());
    c
}

/// One short stream: send `payload(seed)`, read the echo, compare sha256.
async fn short_stream(conn: &quinn::Connection, seed: u64) {
    // 1..=3000 bytes: one or two packets each way.
    let len = 1 + (seed.wrapping_mul(7919) % 3000) as usize;
    let data = payload(seed, len);
    let (mut tx, mut rx) = conn.open_bi().await.unwrap();
    tx.write_all(&data).await.unwrap();
    tx.finish().unwrap();
    let back = rx.read_to_end(len + 1).await.unwrap();
    assert_eq!(back.len(), len, "stream {seed}: echoed length");
    assert_eq!(
        Sha256::digest(&back),
        Sha256::digest(&data),
        "stream {seed}: sha256 of the echo equals what was sent"
    );
}

/// The large transfer: written and read back concurrently (the echo streams).
async fn big_transfer(conn: &quinn::Connection, len: usize, seed: u64) {
    let (mut tx, mut rx) = conn.open_bi().await.unwrap();
    let writer = tokio::spawn(async move {
        let mut h = Sha256::new();
        let mut left = len;
        let mut i = 0;
        while left > 0 {
            let chunk = payload(seed ^ i, left.min(64 << 10));
            h.update(&chunk);
            tx.write_all(&chunk).await.unwrap();
            left -= chunk.len();
            i += 1;
        }
        tx.finish().unwrap();
        h.finalize()
    });
    let mut h = Sha256::new();
    let mut got = 0;
    while let Some(c) = rx.read_chunk(usize::MAX, true).await.unwrap() {
        got += c.bytes.len();
        h.update(&c.bytes);
    }
    let sent = writer.await.unwrap();
    assert_eq!(got, len, "large transfer: echoed length");
    assert_eq!(
        h.finalize(),
        sent,
        "large transfer: sha256 of the echo equals what was sent"
    );
}

async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    let t = Instant::now();
    let r = tokio::time::timeout(PHASE_TIMEOUT, f)
        .await
        .unwrap_or_else(|_| panic!("{what}: not done within {PHASE_TIMEOUT:?}"));
    eprintln!("{what}: {:?}", t.elapsed());
    r
}

/// One round of the load: 1 000 connections (handshakes at most
/// `HANDSHAKES_AT_ONCE` at a time, all open together), 10 streams on each and
/// the large transfer at the same time, then every connection closed. Returns
/// the server's stats while they were all open.
async fn round(
    server: &mut Server,
    server_ud: UdAddr,
    clients: &[Arc<Client>],
    big: &Client,
    ccfg: &quinn::ClientConfig,
    n: u64,
) -> HashMap<String, u64> {
    let limit = Arc::new(tokio::sync::Semaphore::new(HANDSHAKES_AT_ONCE));
    let conns: Vec<quinn::Connection> = within(&format!("round {n}: 1 000 handshakes"), async {
        let tasks: Vec<_> = clients
            .iter()
            .map(|c| {
                let (c, ccfg, limit) = (c.clone(), ccfg.clone(), limit.clone());
                tokio::spawn(async move {
                    let _permit = limit.acquire().await.unwrap();
                    c.connect(server_ud, &ccfg).await
                })
            })
            .collect();
        let mut conns = Vec::with_capacity(CLIENTS);
        for t in tasks {
            conns.push(t.await.unwrap());
        }
        conns
    })
    .await;
    let big_conn = big.connect(server_ud, ccfg).await;
    let open = wait_for(server, "every connection accepted", |s| {
        s["live"] == CLIENTS as u64 + 1
    });
    eprintln!(
        "round {n}: server with {} connections open: {open:?}",
        CLIENTS + 1
    );

    within(
        &format!("round {n}: 10 000 short streams + 16 MiB"),
        async {
            let big_task = {
                let c = big_conn.clone();
                tokio::spawn(async move { big_transfer(&c, BIG_LEN, 99 + n).await })
            };
            let tasks: Vec<_> = conns
                .iter()
                .enumerate()
                .map(|(i, conn)| {
                    let conn = conn.clone();
                    tokio::spawn(async move {
                        for j in 0..STREAMS_PER_CONN {
                            let seed = (n << 32) + (i * STREAMS_PER_CONN + j) as u64;
                            short_stream(&conn, seed).await;
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await.unwrap();
            }
            big_task.await.unwrap();
        },
    )
    .await;
    let peak = wait_for(server, "stats", |_| true);

    // Close everything; the server sees every connection closed by its peer.
    within(&format!("round {n}: close 1 001 connections"), async {
        for c in conns.iter().chain([&big_conn]) {
            c.close(0u32.into(), b"done");
        }
        let idle: Vec<_> = clients
            .iter()
            .map(|c| {
                let c = c.clone();
                tokio::spawn(async move { c.endpoint.wait_idle().await })
            })
            .collect();
        for t in idle {
            t.await.unwrap();
        }
        big.endpoint.wait_idle().await;
    })
    .await;
    peak
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_connections_and_ten_thousand_streams_on_one_server() {
    let started = Instant::now();
    let cert = std::env::temp_dir().join(format!("qr-load-soft-{}.der", std::process::id()));
    let mut server = Server::spawn(SERVER_IP, &cert);
    let server_ud = server.ready();
    let cert_der = std::fs::read(&cert).expect("the server wrote its certificate");
    let _ = std::fs::remove_file(&cert);
    let big = Client::new(BIG_IP, 0x9302, false);
    let ccfg = client_config(cert_der, big.sock.mtu());
    let start = wait_for(&mut server, "stats", |_| true);

    // 1 000 clients, each its own port and QP: 1 000 UD peers at the server.
    let clients: Vec<Arc<Client>> = (0..CLIENTS)
        .map(|i| Arc::new(Client::new(client_ip(i), 0x9400 + i as u32, true)))
        .collect();

    // Round 1 warms the server up: whatever its allocator keeps after 1 001
    // connections is in its RSS from then on. Round 2 must not add to it.
    let peak1 = round(&mut server, server_ud, &clients, &big, &ccfg, 1).await;
    let after1 = wait_for(&mut server, "round 1: every connection closed", |s| {
        s["live"] == 0
    });
    eprintln!("round 1: server after close: {after1:?}");
    let peak2 = round(&mut server, server_ud, &clients, &big, &ccfg, 2).await;
    let after = wait_for(&mut server, "round 2: every connection closed", |s| {
        s["live"] == 0
    });
    eprintln!("round 2: server after close: {after:?}");

    // Every connection and stream served, every close clean.
    let conns_total = 2 * (CLIENTS as u64 + 1);
    assert_eq!(after["accepted"], conns_total, "{after:?}");
    assert_eq!(after["handshake_failed"], 0, "{after:?}");
    assert_eq!(after["closed_clean"], conns_total, "{after:?}");
    assert_eq!(after["closed_other"], 0, "{after:?}");
    assert_eq!(
        after["streams"],
        2 * ((CLIENTS * STREAMS_PER_CONN) as u64 + 1),
        "{after:?}"
    );
    assert_eq!(after["stream_errors"], 0, "{after:?}");

    // The peer table: each client admitted once (its second round's
    // connection reuses its entry), all within the bound, nobody evicted or
    // refused, every send had a known destination.
    let peers = CLIENTS as u64 + 1;
    assert_eq!(after["max_peers"], MAX_PEERS);
    for s in [&peak1, &peak2, &after] {
        assert_eq!(s["peers"], peers, "{s:?}");
        assert_eq!(s["admitted"], peers, "{s:?}");
        assert!(s["peers"] <= s["max_peers"], "{s:?}");
        assert!(s["pending"] <= s["max_pending"], "{s:?}");
    }
    for k in [
        "refused_full",
        "evicted_idle",
        "evicted_pending",
        "unknown_destination",
    ] {
        assert_eq!(after[k], 0, "peer table {k}: {after:?}");
    }
    // Nothing malformed or misrouted on the way.
    for k in ["drop_bad_grh", "drop_imm_mismatch", "bad_icrc", "malformed"] {
        assert_eq!(after[k], 0, "socket {k}: {after:?}");
    }
    // Clients' sockets: every send went out whole.
    for c in &clients {
        let s = c.sock.stats();
        assert_eq!(s.send_errors + s.unposted_segments, 0, "{s:?}");
    }

    // Memory: bounded per open connection at the peak, and round 2 leaves the
    // server where round 1 did.
    let conns_open = CLIENTS as u64 + 1;
    let (rss0, rss_peak, rss_warm, rss_after) = (
        start["rss_kib"],
        peak2["rss_kib"],
        after1["rss_kib"],
        after["rss_kib"],
    );
    eprintln!(
        "server RSS: idle {rss0} KiB; round 1: {} KiB open, {rss_warm} KiB closed; \
         round 2: {rss_peak} KiB open ({} KiB/connection over idle), {rss_after} KiB closed \
         (+{} KiB over round 1); total {:?}",
        peak1["rss_kib"],
        rss_peak.saturating_sub(rss0) / conns_open,
        rss_after as i64 - rss_warm as i64,
        started.elapsed()
    );
    assert!(
        rss_peak.saturating_sub(rss0) < RSS_PER_CONN_KIB * conns_open,
        "server RSS grew {} KiB with {conns_open} connections open (budget {RSS_PER_CONN_KIB} KiB each)",
        rss_peak.saturating_sub(rss0)
    );
    assert!(
        rss_after.saturating_sub(rss_warm) < RSS_ROUND_MARGIN_KIB,
        "server RSS grew {} KiB from round 1 to round 2 (margin {RSS_ROUND_MARGIN_KIB} KiB)",
        rss_after.saturating_sub(rss_warm)
    );

    let status = server.finish();
    assert!(status.success(), "server exited with {status}");
}

/// Ask the server for stats until `done` holds (it counts closes as its
/// connection tasks notice them).
fn wait_for(
    server: &mut Server,
    what: &str,
    done: impl Fn(&HashMap<String, u64>) -> bool,
) -> HashMap<String, u64> {
    // Blocking on the server's pipe: let the runtime move other tasks off this thread.
    tokio::task::block_in_place(|| {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let s = server.stats();
            if done(&s) {
                return s;
            }
            assert!(Instant::now() < deadline, "{what}: server stats {s:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    })
}
