//! `qr gateway`: plain QUIC-over-UDP clients reach servers on the fabric, and
//! fabric clients reach QUIC servers on UDP, through a datagram forwarder that
//! never terminates QUIC — the TLS 1.3 session is end to end, the gateway sees
//! only encrypted packets.
//!
//! The fabric side is any multi-process provider (`soft`, `verbs`): the
//! command makes the queue pairs (`provider::qp_maker`).
//!
//! Two directions, one per gateway instance:
//! - [`to_fabric`]: a UDP socket listens; each UDP client (its source address:
//!   with one listening socket that is the 4-tuple) gets a queue pair of its own
//!   on the gateway's fabric port, so the fabric server sees one UD peer per
//!   UDP client (its connection IDs and its peer table need nothing else). The
//!   target's UD address comes from its bootstrap service (`qr serve`).
//! - [`to_udp`]: a queue pair listens (published by a bootstrap service, so
//!   `qr connect` finds it like any `qr serve`); each fabric peer gets a UDP
//!   socket of its own, connected to the target, so the UDP server sees one
//!   4-tuple per fabric client.
//!
//! A client whose address changes (NAT rebinding) becomes a new entry with a new
//! fabric address, which the server sees as a connection migration to be
//! validated (RFC 9000 §9) — not exercised by the tests; the old entry expires.
//!
//! Datagrams are forwarded as they are: one UDP payload is one UD SEND (with the
//! routing-key immediate of docs/architecture.md §3, so the fabric side's
//! routing check holds). The QUIC connection IDs are not needed to demultiplex:
//! every client has its own address on the far side.
//!
//! **MTU.** A UD message is never fragmented (IBA 9.7.7.2.1), so a UDP datagram
//! larger than what the fabric side carries (its MTU; below 2048, the
//! segmented datagram size of docs/architecture.md §6) cannot cross: it is
//! dropped and counted (`drop_too_big`). Nor does the gateway fragment IP
//! (RFC 9000 §14): its UDP sockets send with DF ([`udp_socket::dont_fragment`]),
//! and a datagram above the UDP path is dropped and counted
//! (`drop_udp_too_big`). Both are what QUIC's path MTU discovery expects: a
//! UDP client's datagrams above 1200 bytes are only ever probes (RFC 9000
//! §14.3, DPLPMTUD RFC 8899 §5), a lost probe caps the search. The fabric
//! server must do the same for these clients — a client need not send
//! `max_udp_payload_size` (aioquic does not), and a fabric endpoint assumes
//! its fabric MTU from the first packet — so `qr serve --udp-gateway
//! FABRIC_IP` gives connections from the gateway's fabric address the UDP
//! path's settings (`FabricConfig::udp_path_transport`: 1200 bytes first,
//! probing up to the fabric MTU, Internet timers). A handshake datagram too
//! big for the UDP path means the server was not told; the gateway says so
//! once, naming the flag.
//!
//! **Who gets state.** Anyone can send a UDP datagram, or a RoCEv2 packet,
//! from any source; every client costs a queue pair or a socket. So a source
//! gets nothing until it sends a well-formed client Initial
//! ([`quic_rdma::quic::is_client_initial`]: long header, QUIC v1 or v2,
//! at least 1 200 bytes); anything else from an unknown source is dropped and
//! counted (`drop_not_initial`). A new client is *unvalidated* until it names
//! a connection ID the server chose ([`validation`], RFC 9000 §8.1): until
//! then the gateway forwards to it at most 3× what it sent (bytes on the
//! wire, `drop_amplification`), and the [`table`] keeps it in a small tier
//! that evicts its oldest entry when full, expires every entry within
//! [`Limits::unvalidated_expiry`] and caps each source IP or GID. Validated
//! clients are bounded too, never evicted to make room, and removed after
//! [`Limits::idle_timeout`] without traffic. Each client's queue pair is
//! small ([`client_socket_config`]): its buffers are touched only as traffic
//! needs them. Counters: [`GatewayStats`].

mod clients;
pub mod stats;
pub mod table;
mod to_fabric;
mod to_udp;
pub mod udp_socket;
mod validation;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use quic_rdma::fabric::{FabricError, UdQueuePair};
use quic_rdma::quinn_adapter::RdmaUdpSocket;
use quinn::udp::{RecvMeta, Transmit};
use quinn::AsyncUdpSocket;

pub use stats::{GatewaySnapshot, GatewayStats, KernelDrops};
pub use to_fabric::{client_socket_config, to_fabric, ToFabric};
pub use to_udp::{to_udp, ToUdp};

/// A quinn-style datagram socket on the fabric (any provider).
pub type FabricSocket = Arc<RdmaUdpSocket<Box<dyn UdQueuePair>>>;

/// Makes a new queue pair on the gateway's fabric port (one per UDP client).
pub type QpFactory = Arc<dyn Fn() -> Result<Box<dyn UdQueuePair>, FabricError> + Send + Sync>;

/// How much state the gateway keeps (see the [module docs](self)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Validated clients at most; new clients are refused while it is reached.
    pub max_clients: usize,
    /// Unvalidated clients at most; the oldest is evicted to make room.
    pub max_unvalidated: usize,
    /// Unvalidated clients from one source IP (or GID) at most.
    pub max_unvalidated_per_source: usize,
    /// Clients of both tiers from one source IP (or GID) at most.
    pub max_per_source: usize,
    /// An unvalidated client is removed this long after it was admitted: a
    /// real client validates within a round trip of the server's first
    /// flight, a forged source never does.
    pub unvalidated_expiry: Duration,
    /// A validated client silent this long (both directions) is removed, with
    /// its queue pair or socket. Choose it above the QUIC idle timeout of the
    /// endpoints.
    pub idle_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_clients: 1024,
            max_unvalidated: 256,
            max_unvalidated_per_source: 16,
            max_per_source: 256,
            unvalidated_expiry: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(30),
        }
    }
}

/// How long a datagram waits for room in a fabric send queue before it is
/// dropped (`drop_fabric_send`): QUIC treats it as lost, which is what a full
/// NIC queue does too.
const FABRIC_SEND_WAIT: Duration = Duration::from_millis(50);

/// Receive one datagram from the fabric: (length, the sender's quinn-style address).
async fn fabric_recv(sock: &FabricSocket, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
    std::future::poll_fn(|cx| {
        let mut bufs = [io::IoSliceMut::new(buf)];
        let mut meta = [RecvMeta::default()];
        sock.poll_recv(cx, &mut bufs, &mut meta)
            .map_ok(|_| (meta[0].len, meta[0].addr))
    })
    .await
}

/// Post `data` to `dest` on the fabric, waiting up to [`FABRIC_SEND_WAIT`] for
/// send-queue room; counts the outcome in `stats`.
async fn fabric_send(sock: &FabricSocket, dest: SocketAddr, data: &[u8], stats: &GatewayStats) {
    let t = Transmit {
        destination: dest,
        ecn: None,
        contents: data,
        segment_size: None,
        src_ip: None,
    };
    let mut poller = None;
    let deadline = tokio::time::Instant::now() + FABRIC_SEND_WAIT;
    loop {
        match sock.try_send(&t) {
            Ok(()) => {
                stats.fabric_tx.inc();
                stats.fabric_tx_bytes.add(data.len() as u64);
                return;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let p = poller.get_or_insert_with(|| sock.clone().create_io_poller());
                let writable = std::future::poll_fn(|cx| p.as_mut().poll_writable(cx));
                if tokio::time::timeout_at(deadline, writable).await.is_err() {
                    stats.drop_fabric_send.inc();
                    return;
                }
            }
            Err(e) => {
                tracing::debug!(%e, %dest, "fabric send failed");
                stats.drop_fabric_send.inc();
                return;
            }
        }
    }
}

/// A forwarding task that ends when its client entry is dropped.
#[derive(Debug)]
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How often expiry runs: a quarter of the shorter timeout, within 10 ms..250 ms.
fn sweep_interval(l: &Limits) -> Duration {
    (l.idle_timeout.min(l.unvalidated_expiry) / 4)
        .clamp(Duration::from_millis(10), Duration::from_millis(250))
}
