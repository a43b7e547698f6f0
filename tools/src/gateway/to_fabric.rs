//! UDP clients → a server on the fabric (see the module above).

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use quic_rdma::fabric::UdAddr;
use quic_rdma::quinn_adapter::RdmaUdpSocket;
use quic_rdma::socket::{SocketConfig, UdSocket};

use tokio::net::UdpSocket;

use quic_rdma::quic::{CidKey, ROUTING_KEY_BITS};

use super::clients::{Clients, HasValidation, Routed};
use super::table::Activity;
use super::validation::Validation;
use super::{
    fabric_recv, fabric_send, sweep_interval, AbortOnDrop, FabricSocket, GatewayStats, Limits,
    QpFactory,
};

/// What a UDP → fabric gateway needs.
pub struct ToFabric {
    /// The UDP socket clients send to.
    pub udp: UdpSocket,
    /// New queue pairs on the gateway's fabric port, one per client.
    pub new_qp: QpFactory,
    /// The fabric server's UD address.
    pub target: UdAddr,
    /// Bounds of the client table.
    pub limits: Limits,
    /// Socket configuration of each client's queue pair.
    pub socket_config: SocketConfig,
}

impl std::fmt::Debug for ToFabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToFabric")
            .field("udp", &self.udp)
            .field("target", &self.target)
            .field("limits", &self.limits)
            .finish()
    }
}

/// The queue pair configuration of each client: small, because every client
/// has one. A new client gets 8 receive and 8 send buffers (about 66 KiB at
/// a 4 096-byte MTU; an unvalidated client may be sent only 3× its Initial);
/// the receive window doubles under load up to 128 buffers, one burst of a
/// bulk transfer, registering buffers only as it grows.
pub fn client_socket_config() -> SocketConfig {
    SocketConfig {
        recv_depth: 128,
        recv_start: 8,
        repost_batch: 4,
        send_slots: 8,
        signal_every: 4,
        ah_capacity: 4,
        tx_bufs: 1,
        ..SocketConfig::default()
    }
}

/// One UDP client: its own fabric socket, and the task forwarding its replies.
struct Client {
    sock: FabricSocket,
    /// The target as this socket's quinn-style address.
    dest: SocketAddr,
    validation: Arc<Validation>,
    _replies: AbortOnDrop,
}

impl HasValidation for Arc<Client> {
    fn validation(&self) -> &Validation {
        &self.validation
    }
}

/// Run the gateway until the UDP socket fails.
///
/// One task reads the UDP socket and posts to the clients' queue pairs in
/// turn: a client whose send queue is full holds the others back for at most
/// `FABRIC_SEND_WAIT` (then its datagram is dropped and counted), as a NIC's
/// shared transmit path would.
pub async fn to_fabric(cfg: ToFabric, stats: Arc<GatewayStats>) -> io::Result<()> {
    let ToFabric {
        udp,
        new_qp,
        target,
        limits,
        socket_config,
    } = cfg;
    let udp = Arc::new(udp);
    // The target is one of ours: its CIDs start with a routing key.
    let mut clients: Clients<Arc<Client>> = Clients::new(limits, stats.clone(), ROUTING_KEY_BITS);
    let cid_key = clients.cid_key();
    let mut sweep = tokio::time::interval(sweep_interval(&limits));
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let (n, from) = tokio::select! {
            r = udp.recv_from(&mut buf) => r?,
            _ = sweep.tick() => {
                clients.sweep(Instant::now());
                continue;
            }
        };
        stats.udp_rx.inc();
        stats.udp_rx_bytes.add(n as u64);
        let routed = clients.route(from, &buf[..n], Instant::now(), |activity, validation| {
            let sock = UdSocket::new(new_qp().map_err(io::Error::other)?, socket_config.clone())
                .map_err(io::Error::from)?;
            Ok(new_client(Reply {
                sock,
                target,
                client: from,
                udp: udp.clone(),
                activity,
                validation,
                cid_key: cid_key.clone(),
                stats: stats.clone(),
            }))
        });
        let Some(Routed { client, .. }) = routed else {
            continue;
        };
        if n > client.sock.mtu() {
            stats.drop_too_big.inc();
            continue;
        }
        fabric_send(&client.sock, client.dest, &buf[..n], &stats).await;
    }
}

/// What a client's reply task needs.
struct Reply {
    sock: UdSocket<Box<dyn quic_rdma::fabric::UdQueuePair>>,
    target: UdAddr,
    client: SocketAddr,
    udp: Arc<UdpSocket>,
    activity: Arc<Activity>,
    validation: Validation,
    cid_key: Arc<CidKey>,
    stats: Arc<GatewayStats>,
}

fn new_client(r: Reply) -> Arc<Client> {
    let sock: FabricSocket = Arc::new(RdmaUdpSocket::new(r.sock));
    let dest = sock.peer_addr(r.target);
    let validation = Arc::new(r.validation);
    let task = tokio::spawn(replies(
        sock.clone(),
        dest,
        validation.clone(),
        r.udp,
        r.client,
        r.activity,
        r.cid_key,
        r.stats,
    ));
    Arc::new(Client {
        sock,
        dest,
        validation,
        _replies: AbortOnDrop(task),
    })
}

/// Forward what the target sends to this client's queue pair back to the
/// client, within its amplification budget until it is validated.
#[allow(clippy::too_many_arguments)]
async fn replies(
    sock: FabricSocket,
    target: SocketAddr,
    validation: Arc<Validation>,
    udp: Arc<UdpSocket>,
    client: SocketAddr,
    activity: Arc<Activity>,
    cid_key: Arc<CidKey>,
    stats: Arc<GatewayStats>,
) {
    let mut buf = vec![0u8; sock.mtu()];
    loop {
        let (n, from) = match fabric_recv(&sock, &mut buf).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(%e, %client, "gateway: fabric receive failed; client's replies stop");
                return;
            }
        };
        stats.fabric_rx.inc();
        stats.fabric_rx_bytes.add(n as u64);
        if from != target {
            stats.drop_foreign.inc();
            continue;
        }
        if !validation.to_client(&buf[..n], &cid_key) {
            stats.drop_amplification.inc();
            continue;
        }
        activity.touch(Instant::now());
        super::udp_socket::forward(&udp, Some(client), &buf[..n], &stats).await;
    }
}
