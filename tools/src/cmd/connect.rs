//! `qr connect`: the client side of the workload (`crate::workload`) against a
//! `qr serve` in another process or on another host, found by host and service
//! port. Its client run ([`ClientRun`], [`run`]) is also the client half of
//! `qr demo --provider soft`.
//!
//! 1. Ask the server's bootstrap service (`host:service_port`, docs/architecture.md §3) for
//!    its GID, QPN, Q_Key, UDP port and MTU.
//! 2. Open a local endpoint (by default on the IP the kernel would use to reach
//!    the server's GID), TLS 1.3 trusting exactly the certificate given by
//!    `--cert` (what `qr serve --cert-out` wrote), and connect.
//! 3. Run the workload (sha256-verified bulk transfer, ping-pong) and report
//!    (`report::Report`, without the server's counters).

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use quic_rdma::discovery::PeerInfo;

use super::args::{FabricArgs, WorkloadArgs};
use super::{print_report, RunError};
use crate::channel_endpoint::{handshake, query_bootstrap, route_source};
use crate::endpoint::FabricEndpoint;
use crate::provider::{self, EndpointOptions};
use crate::report::{
    EndpointsReport, PingReport, QuicReport, Report, RttReport, SocketReport, SocketsReport,
    SoftPortReport, SoftPortsReport, TransferReport, UdEndpointReport,
};
use crate::tls::{self, TlsInfo};
use crate::workload;
use quic_rdma::quinn_adapter::Liveness;

/// Options of `qr connect`.
#[derive(Clone, Debug, clap::Args)]
pub(crate) struct ConnectArgs {
    /// The server's bootstrap service: HOST:PORT (PORT is `qr serve
    /// --service-port`, 18515 by default), e.g. 127.0.0.2:18515, [fd00::1]:18515.
    pub(crate) server: String,

    /// The server's certificate (DER or PEM), as written by `qr serve --cert-out`.
    /// The client trusts exactly this certificate; verification is always on.
    #[arg(long)]
    pub(crate) cert: PathBuf,

    /// Name to verify the certificate for (SNI). Default: HOST of the server
    /// argument (an IP address is checked against the certificate's IP names).
    #[arg(long)]
    pub(crate) server_name: Option<String>,

    #[command(flatten)]
    pub(crate) fabric: FabricArgs,

    /// Local IP (our GID). Default: the source address the kernel routes from
    /// towards the server's GID.
    #[arg(long)]
    pub(crate) ip: Option<IpAddr>,

    #[command(flatten)]
    pub(crate) workload: WorkloadArgs,

    /// Seed of the transferred data.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,

    /// Keep asking the bootstrap service this many seconds while it refuses
    /// connections (a server that is still starting).
    #[arg(long, default_value_t = 10)]
    pub(crate) wait: u64,
}

/// Run `qr connect`: print the report; the exit code says whether the data
/// arrived intact (2 for arguments it cannot run with).
pub(crate) fn main(args: &ConnectArgs) -> ExitCode {
    match ClientRun::from_args(args) {
        Ok(run) => print_report("connect", self::run(&run), args.workload.json),
        Err(e) => {
            eprintln!("qr connect: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// HOST of HOST:PORT, without IPv6 brackets.
fn host_of(server: &str) -> Result<&str> {
    let (host, port) = server
        .rsplit_once(':')
        .ok_or_else(|| anyhow!("`{server}` is not HOST:PORT"))?;
    port.parse::<u16>()
        .with_context(|| format!("`{server}`: `{port}` is not a port number"))?;
    Ok(host.trim_start_matches('[').trim_end_matches(']'))
}

/// The client-side run, shared by `qr connect` and `qr demo --provider soft`:
/// the arguments, checked.
#[derive(Clone, Debug)]
pub(crate) struct ClientRun {
    pub(crate) args: ConnectArgs,
    server_name: String,
    liveness: Liveness,
}

impl ClientRun {
    /// From `qr connect`'s arguments: the name to verify, the timers.
    pub(crate) fn from_args(args: &ConnectArgs) -> Result<ClientRun> {
        let server_name = match &args.server_name {
            Some(n) => n.clone(),
            None => host_of(&args.server)?.to_string(),
        };
        let liveness = args.workload.liveness.liveness()?;
        let args = args.clone();
        Ok(ClientRun {
            args,
            server_name,
            liveness,
        })
    }
}

/// Find the server, connect, run the workload, report (server counters unknown).
pub(crate) fn run(c: &ClientRun) -> Result<Report, RunError> {
    // Before the bootstrap query, which may wait --wait seconds for a server.
    provider::ensure_built_in(c.args.fabric.provider).map_err(RunError::Provider)?;
    let run = |e: anyhow::Error| RunError::Run(e);
    let peer = query_bootstrap(&c.args.server, Duration::from_secs(c.args.wait))
        .map_err(|e| run(e.into()))?;
    let peer_ip = peer.addr.gid.to_ip();
    let ip = match c.args.ip {
        Some(ip) => ip,
        None => route_source(peer_ip).map_err(|e| run(e.into()))?,
    };
    let mut opts = EndpointOptions::new(ip);
    opts.udp_port = c.args.fabric.udp_port;
    opts.peer = Some(peer);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")
        .map_err(run)?;
    let fabric = {
        let _rt = rt.enter();
        FabricEndpoint::open(c.args.fabric.provider, &opts, c.liveness)
            .map_err(RunError::Provider)?
    };
    let trusted = tls::load_certs(&c.args.cert).map_err(run)?;
    let report = rt.block_on(async {
        let limit = Duration::from_secs(c.args.workload.timeout);
        match tokio::time::timeout(limit, client(c, &fabric, &peer, trusted)).await {
            Ok(r) => r,
            Err(_) => Err(anyhow!(
                "the run did not finish within {} s (--timeout)",
                c.args.workload.timeout
            )),
        }
    });
    rt.shutdown_timeout(Duration::from_secs(1));
    report.map_err(run)
}

async fn client(
    c: &ClientRun,
    fabric: &FabricEndpoint,
    peer: &PeerInfo,
    trusted: Vec<rustls::pki_types::CertificateDer<'static>>,
) -> Result<Report> {
    let endpoint = fabric.client()?;
    let (socket, soft) = (fabric.socket(), fabric.soft());
    let start = Instant::now();
    let config = tls::client_config(trusted)?;
    let conn = handshake(fabric, &endpoint, config, peer, &c.server_name)
        .await
        .map_err(|e| e.trusting(&c.args.cert))?;
    let handshake_time = start.elapsed();
    // A dead server is noticed by the receive path (docs/architecture.md §5).
    fabric.watch(&conn);
    let transfer = workload::run_transfer(&conn, c.args.workload.bytes, c.args.seed).await?;
    let rtts = if c.args.workload.pings > 0 {
        workload::run_pings(
            &conn,
            c.args.workload.pings,
            c.args.workload.ping_size as usize,
        )
        .await?
    } else {
        Vec::new()
    };
    let tls_info = TlsInfo::client_side(&conn, &c.server_name);
    let stats = conn.stats();
    conn.close(0u32.into(), b"done");
    if tokio::time::timeout(Duration::from_secs(3), endpoint.wait_idle())
        .await
        .is_err()
    {
        tracing::debug!("endpoint not idle after 3 s; leaving");
    }
    let transfer = TransferReport::from(&transfer);
    if transfer.bytes_received == 0 && c.args.workload.bytes > 0 {
        bail!("the server received nothing");
    }
    Ok(Report {
        ok: transfer.sha256_match,
        provider: fabric.kind().name().into(),
        loss_percent: 0.0,
        seed: c.args.seed,
        mtu: stats.path.current_mtu,
        fabric_mtu: socket.mtu(),
        handshake_ms: handshake_time.as_secs_f64() * 1e3,
        tls: tls_info.into(),
        transfer,
        ping: PingReport {
            count: rtts.len() as u32,
            size: c.args.workload.ping_size as usize,
            rtt_us: RttReport::of(&rtts),
        },
        quic: QuicReport::from(&stats),
        sockets: SocketsReport {
            client: SocketReport::socket(socket),
            server: None,
        },
        fabric: None,
        endpoints: EndpointsReport {
            server: UdEndpointReport::new(peer.addr, Some(peer.udp_port)),
            client: UdEndpointReport::new(socket.ud_addr(), soft.map(|p| p.local_addr().port())),
        },
        soft: soft.map(|p| SoftPortsReport {
            client: SoftPortReport::from(&p.stats()),
            server: None,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts() {
        assert_eq!(host_of("127.0.0.2:18515").unwrap(), "127.0.0.2");
        assert_eq!(host_of("[fd00::1]:18515").unwrap(), "fd00::1");
        assert_eq!(host_of("example.com:1").unwrap(), "example.com");
        assert!(host_of("example.com").is_err());
        assert!(host_of("example.com:x").is_err());
    }

    #[test]
    fn bad_port_keeps_its_source() {
        let err = host_of("example.com:x").unwrap_err();
        assert!(
            err.root_cause()
                .downcast_ref::<std::num::ParseIntError>()
                .is_some(),
            "{err:?}"
        );
    }
}
