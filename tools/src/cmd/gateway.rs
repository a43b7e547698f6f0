//! `qr gateway`: forward QUIC datagrams between UDP and the fabric without
//! terminating QUIC (the library side is `crate::gateway`, which documents the
//! mapping, the MTU rule and the counters).
//!
//! - `qr gateway to-fabric --listen UDP_ADDR --fabric-ip IP --target HOST:PORT`:
//!   plain QUIC clients send to UDP_ADDR; the target is a `qr serve` (or any
//!   endpoint with a bootstrap service) found at HOST:PORT.
//! - `qr gateway to-udp --fabric-ip IP --target UDP_ADDR`: fabric clients find
//!   the gateway at IP:--service-port (a bootstrap service, like `qr serve`)
//!   and reach the QUIC server at UDP_ADDR.
//!
//! Both print one `qr gateway: ...` line on stderr once forwarding, serve the
//! counters as Prometheus text on `--metrics ADDR` (`/metrics`), and run until
//! killed.

use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use quic_rdma::fabric::Mtu;
use quic_rdma::socket::{segment, QUIC_MIN_DATAGRAM};

use super::args::{parse_bytes, FabricArgs, MetricsArgs, DEFAULT_SERVICE_PORT};
use crate::channel_endpoint::query_bootstrap;
use crate::endpoint::FabricEndpoint;
use crate::gateway::{self, udp_socket, GatewayStats, Limits, ToFabric, ToUdp};
use crate::http::Page;
use crate::provider::{self, EndpointOptions};
use quic_rdma::fabric::Provider;
use quic_rdma::quinn_adapter::Liveness;

/// Options of `qr gateway`.
#[derive(Clone, Debug, clap::Args)]
pub(crate) struct GatewayArgs {
    #[command(subcommand)]
    direction: Direction,
}

/// Which way the gateway forwards.
#[derive(Clone, Debug, clap::Subcommand)]
enum Direction {
    /// UDP clients -> a server on the fabric.
    ToFabric(ToFabricArgs),
    /// Fabric clients -> a server on UDP.
    ToUdp(ToUdpArgs),
}

/// What both directions take.
#[derive(Clone, Debug, clap::Args)]
struct Common {
    /// Local IP of the gateway's fabric port (its GID).
    #[arg(long)]
    fabric_ip: IpAddr,

    #[command(flatten)]
    fabric: FabricArgs,

    /// Active MTU of the gateway's `soft` fabric port: 256, 512, 1024, 2048
    /// or 4096; run it at the target's. Default: the RoCE MTU of
    /// --fabric-ip's netdev, as kernel rxe takes it (1024 on 1500-byte
    /// Ethernet, where QUIC datagrams are segmented, docs/architecture.md
    /// §6). `verbs` runs at the device's. UDP datagrams above what it carries
    /// are dropped and counted.
    #[arg(long, value_parser = parse_mtu)]
    fabric_mtu: Option<usize>,

    /// Receive buffer of the UDP socket clients send to (to-fabric) in bytes
    /// (e.g. 8M): bursts from many clients beyond it are dropped by the
    /// kernel (counted in qr_gateway_udp_kernel_drops_total). Above
    /// net.core.rmem_max it needs CAP_NET_ADMIN.
    #[arg(long, default_value = "8M", value_parser = parse_bytes)]
    udp_recv_buffer: u64,

    /// Validated clients at most (each a queue pair or UDP socket); new
    /// clients are refused while it is reached.
    #[arg(long, default_value_t = Limits::default().max_clients, value_parser = parse_count)]
    max_clients: usize,

    /// Clients that have not yet proved their address at most (a source gets
    /// one only for a well-formed QUIC Initial); the oldest is evicted to
    /// make room.
    #[arg(long, default_value_t = Limits::default().max_unvalidated, value_parser = parse_count)]
    max_unvalidated: usize,

    /// Unvalidated clients from one source IP (or GID) at most.
    #[arg(long, default_value_t = Limits::default().max_unvalidated_per_source, value_parser = parse_count)]
    max_unvalidated_per_source: usize,

    /// Clients of both kinds from one source IP (or GID) at most.
    #[arg(long, default_value_t = Limits::default().max_per_source, value_parser = parse_count)]
    max_per_source: usize,

    /// Remove a client that has not proved its address this long after its
    /// first datagram (a real client does within a round trip).
    #[arg(long, default_value = "2s", value_parser = parse_nonzero_duration)]
    unvalidated_expiry: Duration,

    /// Remove a validated client after this long without traffic (e.g. 30s);
    /// keep it above the QUIC idle timeout of the endpoints.
    #[arg(long, default_value = "30s", value_parser = parse_nonzero_duration)]
    idle_timeout: Duration,

    /// `--metrics` (the gateway's counters) and the limits of its listener.
    #[command(flatten)]
    metrics: MetricsArgs,
}

#[derive(Clone, Debug, clap::Args)]
#[command(arg(crate::config::option()))]
struct ToFabricArgs {
    /// UDP address clients send to.
    #[arg(long)]
    listen: SocketAddr,

    /// The fabric server's bootstrap service, HOST:PORT (`qr serve --service-port`).
    #[arg(long)]
    target: String,

    /// Keep asking the bootstrap service this many seconds while it refuses.
    #[arg(long, default_value_t = 10)]
    wait: u64,

    #[command(flatten)]
    common: Common,
}

#[derive(Clone, Debug, clap::Args)]
#[command(arg(crate::config::option()))]
struct ToUdpArgs {
    /// The QUIC server on UDP: HOST:PORT (a name is resolved once, at start).
    #[arg(long)]
    target: String,

    /// Local IP of the per-client UDP sockets (default: unspecified, the kernel
    /// picks the source towards the target).
    #[arg(long)]
    udp_bind: Option<IpAddr>,

    /// TCP port of the gateway's bootstrap service (on --fabric-ip), which
    /// fabric clients (`qr connect`) ask for the gateway's queue pair.
    #[arg(long, default_value_t = DEFAULT_SERVICE_PORT)]
    service_port: u16,

    #[command(flatten)]
    common: Common,
}

/// A client count of at least 1 (0 would refuse everyone).
fn parse_count(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("0 would refuse every client: give at least 1".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("`{s}` is not a number of clients")),
    }
}

/// A duration above zero (a zero timer would drop every client at once).
fn parse_nonzero_duration(s: &str) -> Result<Duration, String> {
    match humantime::parse_duration(s) {
        Ok(d) if d.is_zero() => Err("0 would drop every client at once: give e.g. 2s".into()),
        Ok(d) => Ok(d),
        Err(e) => Err(format!("`{s}` is not a duration (e.g. 2s, 30s): {e}")),
    }
}

fn parse_mtu(s: &str) -> Result<usize, String> {
    let n: usize = s.parse().map_err(|_| format!("`{s}` is not a number"))?;
    match Mtu::from_bytes(n) {
        Some(m) if segment::datagram_mtu(m.bytes()) >= QUIC_MIN_DATAGRAM => Ok(n),
        _ => Err(format!(
            "{n} is not a RoCE MTU: use 256, 512, 1024, 2048 or 4096 (below 2048 QUIC \
             datagrams are segmented)"
        )),
    }
}

/// Run `qr gateway` until killed; 1 if it cannot start, 2 for a provider it cannot use.
pub(crate) fn main(args: &GatewayArgs) -> ExitCode {
    let common = match &args.direction {
        Direction::ToFabric(a) => &a.common,
        Direction::ToUdp(a) => &a.common,
    };
    if common.fabric.provider == Provider::Sim {
        eprintln!(
            "qr gateway: provider `sim` is an in-process fabric other processes cannot reach: \
             use `--provider soft` or `verbs`"
        );
        return ExitCode::from(2);
    }
    if let Err(e) = provider::ensure_built_in(common.fabric.provider) {
        eprintln!("qr gateway: {e}");
        return ExitCode::from(2);
    }
    super::run_on_runtime("gateway", async {
        match &args.direction {
            Direction::ToFabric(a) => to_fabric(a).await,
            Direction::ToUdp(a) => to_udp(a).await,
        }
    })
}

/// Where the gateway's fabric side lives: `--fabric-ip`, its UDP port, and
/// `--fabric-mtu` or the RoCE MTU of the IP's netdev.
fn fabric_options(c: &Common) -> EndpointOptions {
    let mut opts = EndpointOptions::new(c.fabric_ip);
    opts.udp_port = c.fabric.udp_port;
    if let Some(m) = c.fabric_mtu {
        opts.mtu = Mtu::from_bytes(m).expect("checked by parse_mtu");
    }
    opts
}

fn limits(c: &Common) -> Limits {
    // Each bound is at least 1 and each timer above 0: clap checked them.
    Limits {
        max_clients: c.max_clients,
        max_unvalidated: c.max_unvalidated,
        max_unvalidated_per_source: c.max_unvalidated_per_source,
        max_per_source: c.max_per_source,
        unvalidated_expiry: c.unvalidated_expiry,
        idle_timeout: c.idle_timeout,
    }
}

/// Serve the counters on `--metrics`, if asked.
async fn metrics(
    c: &Common,
    stats: &Arc<GatewayStats>,
) -> Result<Option<tokio::task::JoinHandle<()>>> {
    let stats = stats.clone();
    c.metrics
        .serve(
            "qr gateway",
            vec![Page::metrics(move || stats.prometheus())],
            vec![],
        )
        .await
}

async fn to_fabric(a: &ToFabricArgs) -> Result<()> {
    let limits = limits(&a.common);
    let target = a.target.clone();
    let wait = Duration::from_secs(a.wait);
    let peer = tokio::task::spawn_blocking(move || query_bootstrap(&target, wait)).await??;
    let mut opts = fabric_options(&a.common);
    opts.peer = Some(peer);
    let (new_qp, mtu) = provider::qp_maker(a.common.fabric.provider, &opts)?;
    peer.check_segmentation(mtu)?;
    if mtu != peer.mtu {
        // Neither end cuts its datagrams for a peer on a smaller MTU
        // (docs/architecture.md §6): what the larger end sends is dropped.
        tracing::warn!(
            target: "qr::gateway",
            "the fabric MTU {} differs from the target's MTU {}: datagrams the larger end \
             sends above the smaller MTU are lost; run both at one MTU",
            mtu.bytes(),
            peer.mtu.bytes()
        );
    }
    let udp = tokio::net::UdpSocket::bind(a.listen)
        .await
        .with_context(|| format!("UDP socket on {}", a.listen))?;
    let stats = Arc::new(GatewayStats::default());
    let asked = usize::try_from(a.common.udp_recv_buffer).unwrap_or(usize::MAX);
    let granted = udp_socket::size_buffers(&udp, asked, udp_socket::SEND_BUFFER)
        .context("sizing the UDP socket's buffers")?;
    udp_socket::dont_fragment(&udp).context("setting \"don't fragment\" on the UDP socket")?;
    stats
        .udp_recv_buffer_bytes
        .set(i64::try_from(granted).unwrap_or(i64::MAX));
    if let Some(inode) = udp_socket::inode(&udp) {
        stats.udp_kernel_drops.watch(inode);
    }
    let _metrics = metrics(&a.common, &stats).await?;
    tracing::info!(
        target: "qr::gateway",
        "UDP {} -> fabric GID {} QPN {:#x} (UDP port {}), from {} {} MTU {}; \
         max {} clients (+{} unvalidated), idle timeout {:?}",
        udp.local_addr()?,
        peer.addr.gid,
        peer.addr.qpn,
        peer.udp_port,
        a.common.fabric.provider,
        a.common.fabric_ip,
        mtu.bytes(),
        limits.max_clients,
        limits.max_unvalidated,
        limits.idle_timeout
    );
    crate::notify::ready("forwarding UDP to the fabric");
    gateway::to_fabric(
        ToFabric {
            udp,
            new_qp,
            target: peer.addr,
            limits,
            socket_config: gateway::client_socket_config(),
        },
        stats,
    )
    .await
    .context("forwarding")
}

async fn to_udp(a: &ToUdpArgs) -> Result<()> {
    let limits = limits(&a.common);
    let target = tokio::net::lookup_host(&a.target)
        .await
        .with_context(|| format!("--target {}: give HOST:PORT of the QUIC server", a.target))?
        .next()
        .with_context(|| format!("--target {}: the name has no address", a.target))?;
    let bind_ip = a.udp_bind.unwrap_or(match target {
        SocketAddr::V4(_) => IpAddr::from([0, 0, 0, 0]),
        SocketAddr::V6(_) => IpAddr::from([0u16; 8]),
    });
    // Every client gets a socket on bind_ip: one that cannot be made now
    // would fail for each datagram later.
    std::net::UdpSocket::bind(SocketAddr::new(bind_ip, 0))
        .and_then(|s| s.connect(target))
        .with_context(|| {
            format!("--udp-bind {bind_ip}: cannot send from it to {target} (is it an address of this host?)")
        })?;
    let opts = fabric_options(&a.common);
    // The gateway terminates no QUIC: the liveness timers go unused.
    let ep = FabricEndpoint::open(a.common.fabric.provider, &opts, Liveness::quinn_adapter())?;
    let publish = ep.record()?;
    let bind = SocketAddr::new(a.common.fabric_ip, a.service_port);
    let (bound, _bootstrap) = ep.publish(bind)?;
    let stats = Arc::new(GatewayStats::default());
    let _metrics = metrics(&a.common, &stats).await?;
    tracing::info!(
        target: "qr::gateway",
        "fabric GID {} QPN {:#x} MTU {} (bootstrap on TCP {bound}) -> UDP {}; \
         max {} clients (+{} unvalidated), idle timeout {:?}",
        publish.addr.gid,
        publish.addr.qpn,
        publish.mtu.bytes(),
        target,
        limits.max_clients,
        limits.max_unvalidated,
        limits.idle_timeout
    );
    crate::notify::ready("forwarding the fabric to UDP");
    gateway::to_udp(
        ToUdp {
            listener: ep.socket().clone(),
            bind_ip,
            target,
            limits,
        },
        stats,
    )
    .await
    .context("forwarding")
}
