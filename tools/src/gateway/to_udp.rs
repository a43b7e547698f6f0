//! Fabric clients → a server on UDP (see the module above).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use tokio::net::UdpSocket;

use quic_rdma::quic::CidKey;

use super::clients::{Clients, HasValidation, Routed};
use super::table::Activity;
use super::validation::Validation;
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
    validation: Arc<Validation>,
    _replies: AbortOnDrop,
}

impl HasValidation for Arc<Client> {
    fn validation(&self) -> &Validation {
        &self.validation
    }
}

/// Run the gateway until the listening fabric socket fails.
pub async fn to_udp(cfg: ToUdp, stats: Arc<GatewayStats>) -> io::Result<()> {
    // The UDP server is anyone's: its CIDs may be all random bits.
    let mut clients: Clients<Arc<Client>> = Clients::new(cfg.limits, stats.clone(), 0);
    let cid_key = clients.cid_key();
    let mut sweep = tokio::time::interval(sweep_interval(&cfg.limits));
    let mut buf = vec![0u8; cfg.listener.mtu()];
    loop {
        let (n, from) = tokio::select! {
            r = fabric_recv(&cfg.listener, &mut buf) => r?,
            _ = sweep.tick() => {
                clients.sweep(Instant::now());
                continue;
            }
        };
        stats.fabric_rx.inc();
        stats.fabric_rx_bytes.add(n as u64);
        let routed = clients.route(from, &buf[..n], Instant::now(), |activity, validation| {
            new_client(
                &cfg,
                from,
                activity,
                validation,
                cid_key.clone(),
                stats.clone(),
            )
        });
        let Some(Routed {
            client,
            validated_now,
        }) = routed
        else {
            continue;
        };
        if validated_now {
            // The listener's peer table cannot see the proof (the CID is the
            // UDP server's): admit the peer, so its replies are not held to 3×.
            cfg.listener.confirm_peer(from);
        }
        super::udp_socket::forward(&client.udp, None, &buf[..n], &stats).await;
    }
}

fn new_client(
    cfg: &ToUdp,
    from: SocketAddr,
    activity: Arc<Activity>,
    validation: Validation,
    cid_key: Arc<CidKey>,
    stats: Arc<GatewayStats>,
) -> io::Result<Arc<Client>> {
    let std_sock = std::net::UdpSocket::bind(SocketAddr::new(cfg.bind_ip, 0))?;
    std_sock.connect(cfg.target)?;
    std_sock.set_nonblocking(true)?;
    // One server's replies to one client: a modest buffer, not the listener's.
    super::udp_socket::size_buffers(&std_sock, 1 << 20, 1 << 20)?;
    super::udp_socket::dont_fragment(&std_sock)?;
    let udp = Arc::new(UdpSocket::from_std(std_sock)?);
    let validation = Arc::new(validation);
    let task = tokio::spawn(replies(
        cfg.listener.clone(),
        from,
        udp.clone(),
        validation.clone(),
        activity,
        cid_key,
        stats,
    ));
    Ok(Arc::new(Client {
        udp,
        validation,
        _replies: AbortOnDrop(task),
    }))
}

/// Forward what the UDP server sends to this client's socket back over the fabric.
async fn replies(
    listener: FabricSocket,
    client: SocketAddr,
    udp: Arc<UdpSocket>,
    validation: Arc<Validation>,
    activity: Arc<Activity>,
    cid_key: Arc<CidKey>,
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
        if !validation.to_client(&buf[..n], &cid_key) {
            stats.drop_amplification.inc();
            continue;
        }
        fabric_send(&listener, client, &buf[..n], &stats).await;
    }
}
