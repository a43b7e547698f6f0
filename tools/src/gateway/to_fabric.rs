//! UDP clients → a server on the fabric (see the module above).

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use quic_rdma::fabric::UdAddr;
use quic_rdma::quinn_adapter::RdmaUdpSocket;
use quic_rdma::socket::{SocketConfig, UdSocket};

use tokio::net::UdpSocket;

use super::table::{Activity, Admission, ClientTable};
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

/// One UDP client: its own fabric socket, and the task forwarding its replies.
struct Client {
    sock: FabricSocket,
    /// The target as this socket's quinn-style address.
    dest: SocketAddr,
    _replies: AbortOnDrop,
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
    let mut table: ClientTable<SocketAddr, Arc<Client>> = ClientTable::new(limits.max_clients);
    let mut sweep = tokio::time::interval(sweep_interval(limits.idle_timeout));
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let (n, from) = tokio::select! {
            r = udp.recv_from(&mut buf) => r?,
            _ = sweep.tick() => {
                let gone = table.expire(Instant::now(), limits.idle_timeout);
                stats.clients_expired.add(gone.len() as u64);
                stats.clients_active.add(-(gone.len() as i64));
                continue;
            }
        };
        stats.udp_rx.inc();
        stats.udp_rx_bytes.add(n as u64);
        let admitted = table.get_or_admit(&from, Instant::now(), |activity| {
            let sock = UdSocket::new(new_qp().map_err(io::Error::other)?, socket_config.clone())
                .map_err(io::Error::from)?;
            Ok::<_, io::Error>(new_client(
                sock,
                target,
                from,
                udp.clone(),
                activity,
                stats.clone(),
            ))
        });
        let client = match admitted {
            Ok(Admission::Known(c)) => c.clone(),
            Ok(Admission::New(c)) => {
                stats.clients_admitted.inc();
                stats.clients_active.add(1);
                tracing::debug!(client = %from, "gateway: new UDP client");
                c.clone()
            }
            Ok(Admission::Full) => {
                stats.drop_refused.inc();
                continue;
            }
            Err(e) => {
                tracing::warn!(%e, client = %from, "gateway: no queue pair for a new client");
                stats.drop_client_setup.inc();
                continue;
            }
        };
        if n > client.sock.mtu() {
            stats.drop_too_big.inc();
            continue;
        }
        fabric_send(&client.sock, client.dest, &buf[..n], &stats).await;
    }
}

fn new_client(
    sock: UdSocket<Box<dyn quic_rdma::fabric::UdQueuePair>>,
    target: UdAddr,
    from: SocketAddr,
    udp: Arc<UdpSocket>,
    activity: Arc<Activity>,
    stats: Arc<GatewayStats>,
) -> Arc<Client> {
    let sock: FabricSocket = Arc::new(RdmaUdpSocket::new(sock));
    let dest = sock.peer_addr(target);
    let task = tokio::spawn(replies(sock.clone(), dest, udp, from, activity, stats));
    Arc::new(Client {
        sock,
        dest,
        _replies: AbortOnDrop(task),
    })
}

/// Forward what the target sends to this client's queue pair back to the client.
async fn replies(
    sock: FabricSocket,
    target: SocketAddr,
    udp: Arc<UdpSocket>,
    client: SocketAddr,
    activity: Arc<Activity>,
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
        activity.touch(Instant::now());
        match udp.send_to(&buf[..n], client).await {
            Ok(_) => stats.udp_tx.inc(),
            Err(e) => {
                tracing::debug!(%e, %client, "gateway: UDP send failed");
                stats.drop_udp_send.inc();
            }
        }
    }
}
