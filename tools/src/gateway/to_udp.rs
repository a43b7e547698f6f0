//! Fabric clients → a server on UDP (see the module above).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use tokio::net::UdpSocket;

use super::table::{Activity, Admission, ClientTable};
use super::{
    fabric_recv, fabric_send, sweep_interval, AbortOnDrop, FabricSocket, GatewayStats, Limits,
};

/// What a fabric → UDP gateway needs.
#[derive(Debug)]
pub struct ToUdp {
    /// The fabric socket clients send to.
    pub listener: FabricSocket,
    /// Local IP of the per-client UDP sockets (port chosen by the kernel).
    pub bind_ip: IpAddr,
    /// The UDP server.
    pub target: SocketAddr,
    /// Bounds of the client table.
    pub limits: Limits,
}

/// One fabric client: its own UDP socket, and the task forwarding its replies.
struct Client {
    udp: Arc<UdpSocket>,
    _replies: AbortOnDrop,
}

/// Run the gateway until the listening fabric socket fails.
pub async fn to_udp(cfg: ToUdp, stats: Arc<GatewayStats>) -> io::Result<()> {
    let mut table: ClientTable<SocketAddr, Arc<Client>> = ClientTable::new(cfg.limits.max_clients);
    let mut sweep = tokio::time::interval(sweep_interval(cfg.limits.idle_timeout));
    let mut buf = vec![0u8; cfg.listener.mtu()];
    loop {
        let (n, from) = tokio::select! {
            r = fabric_recv(&cfg.listener, &mut buf) => r?,
            _ = sweep.tick() => {
                let gone = table.expire(Instant::now(), cfg.limits.idle_timeout);
                stats.clients_expired.add(gone.len() as u64);
                stats.clients_active.add(-(gone.len() as i64));
                continue;
            }
        };
        stats.fabric_rx.inc();
        stats.fabric_rx_bytes.add(n as u64);
        let admitted = table.get_or_admit(&from, Instant::now(), |activity| {
            new_client(&cfg, from, activity, stats.clone())
        });
        let client = match admitted {
            Ok(Admission::Known(c)) => c.clone(),
            Ok(Admission::New(c)) => {
                stats.clients_admitted.inc();
                stats.clients_active.add(1);
                tracing::debug!(client = %from, "gateway: new fabric client");
                c.clone()
            }
            Ok(Admission::Full) => {
                stats.drop_refused.inc();
                continue;
            }
            Err(e) => {
                tracing::warn!(%e, client = %from, "gateway: no UDP socket for a new client");
                stats.drop_client_setup.inc();
                continue;
            }
        };
        match client.udp.send(&buf[..n]).await {
            Ok(_) => stats.udp_tx.inc(),
            Err(e) => {
                tracing::debug!(%e, "gateway: UDP send failed");
                stats.drop_udp_send.inc();
            }
        }
    }
}

fn new_client(
    cfg: &ToUdp,
    from: SocketAddr,
    activity: Arc<Activity>,
    stats: Arc<GatewayStats>,
) -> io::Result<Arc<Client>> {
    let std_sock = std::net::UdpSocket::bind(SocketAddr::new(cfg.bind_ip, 0))?;
    std_sock.connect(cfg.target)?;
    std_sock.set_nonblocking(true)?;
    let udp = Arc::new(UdpSocket::from_std(std_sock)?);
    let task = tokio::spawn(replies(
        cfg.listener.clone(),
        from,
        udp.clone(),
        activity,
        stats,
    ));
    Ok(Arc::new(Client {
        udp,
        _replies: AbortOnDrop(task),
    }))
}

/// Forward what the UDP server sends to this client's socket back over the fabric.
async fn replies(
    listener: FabricSocket,
    client: SocketAddr,
    udp: Arc<UdpSocket>,
    activity: Arc<Activity>,
    stats: Arc<GatewayStats>,
) {
    let mtu = listener.mtu();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        // A connected socket receives from its target only: nothing foreign to drop.
        let n = match udp.recv(&mut buf).await {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                // An ICMP port unreachable from the target (not up yet, or gone):
                // QUIC retransmits; keep the socket.
                continue;
            }
            Err(e) => {
                tracing::warn!(%e, %client, "gateway: UDP receive failed; client's replies stop");
                return;
            }
        };
        stats.udp_rx.inc();
        stats.udp_rx_bytes.add(n as u64);
        activity.touch(Instant::now());
        if n > mtu {
            stats.drop_too_big.inc();
            continue;
        }
        fabric_send(&listener, client, &buf[..n], &stats).await;
    }
}
