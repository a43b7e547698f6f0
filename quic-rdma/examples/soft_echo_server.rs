//! A quinn echo server over the `soft` provider (real RoCEv2 packets on UDP),
//! run as its own process by the load test (`tests/load_soft.rs`).
//!
//! Run: `cargo run --release -p quic-rdma --example soft_echo_server -- <ip> <cert.der> [max_peers]`
//!
//! - binds a `soft` port on `<ip>` (UDP 4791; the IP is the port's GID), writes
//!   its self-signed certificate for "localhost" (DER) to `<cert.der>`;
//! - echoes every bidirectional stream of every connection back to its sender;
//! - prints `READY ip=<ip> qpn=<qpn> qkey=<qkey>` once listening (a client builds
//!   the server's `UdAddr` from it);
//! - on a `stats` line on stdin prints one `STATS key=value ...` line: VmRSS,
//!   connection and stream counters, the peer table's and the socket's counters;
//! - exits on stdin EOF (the test dying takes the server with it).

use std::collections::BTreeMap;
use std::io::BufRead;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use quic_rdma::fabric::soft::{SoftConfig, SoftPort, SoftQp};
use quic_rdma::fabric::{UdQueuePair, DEFAULT_QKEY};
use quic_rdma::quic::PeerLimits;
use quic_rdma::quinn_adapter::{self, RdmaUdpSocket};
use quic_rdma::socket::{SocketConfig, UdSocket};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Receive queue depth: a thousand clients' Initials may arrive in one burst.
const RECV_DEPTH: u32 = 4096;

/// What the server counts, read by the `stats` command.
#[derive(Default)]
struct Counters {
    /// Connections whose handshake completed.
    accepted: AtomicU64,
    /// Incoming connections whose handshake failed.
    handshake_failed: AtomicU64,
    /// Connections open now.
    live: AtomicU64,
    /// Connections the peer closed with application error code 0.
    closed_clean: AtomicU64,
    /// Connections that ended any other way (timeout, reset, error code ≠ 0).
    closed_other: AtomicU64,
    /// Streams echoed to their end.
    streams: AtomicU64,
    /// Streams that failed part way (read, write or finish error).
    stream_errors: AtomicU64,
    /// Bytes echoed.
    bytes: AtomicU64,
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// Echo one stream: every chunk read is written back, then finish.
async fn echo(
    mut tx: quinn::SendStream,
    mut rx: quinn::RecvStream,
    c: &Counters,
) -> Result<(), Error> {
    while let Some(chunk) = rx.read_chunk(usize::MAX, true).await? {
        c.bytes
            .fetch_add(chunk.bytes.len() as u64, Ordering::Relaxed);
        tx.write_chunk(chunk.bytes).await?;
    }
    tx.finish()?;
    // Wait for the peer to have everything (or to go away), so closing the
    // connection right after cannot cut the echo short.
    let _ = tx.stopped().await;
    Ok(())
}

async fn serve(incoming: quinn::Incoming, c: Arc<Counters>) {
    let conn = match incoming.await {
        Ok(conn) => conn,
        Err(e) => {
            eprintln!("soft_echo_server: handshake failed: {e}");
            c.handshake_failed.fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    c.accepted.fetch_add(1, Ordering::Relaxed);
    c.live.fetch_add(1, Ordering::Relaxed);
    let reason = loop {
        match conn.accept_bi().await {
            Ok((tx, rx)) => {
                let c = c.clone();
                tokio::spawn(async move {
                    match echo(tx, rx, &c).await {
                        Ok(()) => c.streams.fetch_add(1, Ordering::Relaxed),
                        Err(e) => {
                            eprintln!("soft_echo_server: stream failed: {e}");
                            c.stream_errors.fetch_add(1, Ordering::Relaxed)
                        }
                    };
                });
            }
            Err(e) => break e,
        }
    };
    c.live.fetch_sub(1, Ordering::Relaxed);
    match reason {
        quinn::ConnectionError::ApplicationClosed(a) if a.error_code == 0u32.into() => {
            c.closed_clean.fetch_add(1, Ordering::Relaxed);
        }
        other => {
            eprintln!("soft_echo_server: connection ended: {other}");
            c.closed_other.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// One `STATS key=value ...` line.
fn stats_line(c: &Counters, sock: &RdmaUdpSocket<SoftQp>, port: &SoftPort) -> String {
    let mut m = BTreeMap::new();
    m.insert("rss_kib", rss_kib());
    for (k, v) in [
        ("accepted", &c.accepted),
        ("handshake_failed", &c.handshake_failed),
        ("live", &c.live),
        ("closed_clean", &c.closed_clean),
        ("closed_other", &c.closed_other),
        ("streams", &c.streams),
        ("stream_errors", &c.stream_errors),
        ("bytes", &c.bytes),
    ] {
        m.insert(k, v.load(Ordering::Relaxed));
    }
    let p = sock.peer_stats();
    m.insert("peers", p.peers);
    m.insert("pending", p.pending);
    m.insert("max_peers", p.max_peers);
    m.insert("max_pending", p.max_pending);
    m.insert("admitted", p.admitted);
    m.insert("evicted_pending", p.evicted_pending);
    m.insert("evicted_idle", p.evicted_idle);
    m.insert("refused_full", p.refused_full);
    m.insert("unknown_destination", p.unknown_destination);
    let s = sock.stats();
    m.insert("sent_wrs", s.sent_wrs);
    m.insert("recv_packets", s.recv_packets);
    m.insert("would_block", s.would_block);
    m.insert("send_errors", s.send_errors);
    m.insert("recv_errors", s.recv_errors);
    m.insert("drop_bad_grh", s.drop_bad_grh);
    m.insert("drop_imm_mismatch", sock.routing_stats().imm_mismatch);
    m.insert("qp_recoveries", s.qp_recoveries);
    m.insert("no_recv_posted", s.provider.no_recv_posted);
    m.insert("malformed", s.provider.malformed);
    m.insert("bad_icrc", s.provider.bad_icrc);
    let (in_flight, (ah_live, ah_retired)) =
        sock.with_socket(|s| (s.sends_in_flight() as u64, s.ah_counts()));
    m.insert("sends_in_flight", in_flight);
    m.insert("ah_live", ah_live as u64);
    m.insert("ah_retired", ah_retired as u64);
    let ps = port.stats();
    m.insert("rx_datagrams", ps.rx_datagrams);
    m.insert("tx_packets", ps.tx_packets);
    m.insert("tx_would_block", ps.tx_would_block);
    let mut line = String::from("STATS");
    for (k, v) in m {
        line.push_str(&format!(" {k}={v}"));
    }
    line
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: soft_echo_server <ip> <cert.der> [max_peers]";
    let ip: IpAddr = args.next().ok_or(usage)?.parse()?;
    let cert_path = args.next().ok_or(usage)?;
    let max_peers = match args.next() {
        Some(n) => n.parse()?,
        None => PeerLimits::default().max_peers,
    };

    let port = SoftPort::open(SoftConfig {
        max_recv_wr: RECV_DEPTH,
        ..SoftConfig::new(ip)
    })?;
    let qp = port.create_qp(DEFAULT_QKEY)?;
    let (qpn, qkey) = (qp.attr().qpn, qp.attr().qkey);
    let sock = UdSocket::new(
        qp,
        SocketConfig {
            recv_depth: RECV_DEPTH as usize,
            ..SocketConfig::default()
        },
    )?;
    let limits = PeerLimits {
        max_peers,
        ..PeerLimits::default()
    };
    let sock = Arc::new(RdmaUdpSocket::with_options(
        sock,
        limits,
        Default::default(),
    ));
    let mtu = sock.mtu();

    let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()])?;
    std::fs::write(&cert_path, ck.cert.der())?;
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(ck.key_pair.serialize_der().into());
    let mut server_cfg = quinn::ServerConfig::with_single_cert(vec![ck.cert.der().clone()], key)?;
    server_cfg.transport_config(quinn_adapter::FabricConfig::new(mtu).transport());
    let endpoint = quinn::Endpoint::new_with_abstract_socket(
        quinn_adapter::FabricConfig::new(mtu)
            .routing_key(0x930)
            .endpoint_config(),
        Some(server_cfg),
        sock.clone(),
        Arc::new(quinn::TokioRuntime),
    )?;

    let counters = Arc::new(Counters::default());
    {
        let (endpoint, c) = (endpoint.clone(), counters.clone());
        tokio::spawn(async move {
            while let Some(incoming) = endpoint.accept().await {
                tokio::spawn(serve(incoming, c.clone()));
            }
        });
    }

    // stdin on a plain thread: commands in, EOF ends the server.
    let (cmd_tx, mut cmd_rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if cmd_tx.send(line).is_err() {
                break;
            }
        }
    });

    println!("READY ip={ip} qpn={qpn} qkey={qkey}");
    while let Some(cmd) = cmd_rx.recv().await {
        match cmd.trim() {
            "stats" => println!("{}", stats_line(&counters, &sock, &port)),
            "" => {}
            other => eprintln!("soft_echo_server: unknown command {other:?} (try \"stats\")"),
        }
    }
    endpoint.close(0u32.into(), b"server exiting");
    let _ = tokio::time::timeout(Duration::from_secs(2), endpoint.wait_idle()).await;
    Ok(())
}
