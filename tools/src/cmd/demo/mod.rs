//! `qr demo`: a QUIC server and client over a UD fabric, a verified bulk transfer
//! and a ping-pong, with a report of what every layer counted.
//!
//! This file has the options and the in-process run (`sim`: both endpoints in
//! this process, on one runtime); `soft.rs` the two-process run of
//! `--provider soft`.

mod soft;

use std::net::IpAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use quic_rdma::quinn_adapter::RetryGate;

use super::args::{WorkloadArgs, DEFAULT_SERVICE_PORT};
use super::{print_report, RunError};
use crate::endpoint::FabricEndpoint;
use crate::provider::FabricOptions;
use crate::report::{
    EndpointsReport, FabricReport, PingReport, QuicReport, Report, RttReport, SocketReport,
    SocketsReport, TransferReport, UdEndpointReport,
};
use crate::tls::{self, TlsInfo};
use crate::workload;
use quic_rdma::fabric::Provider;

/// Options of `qr demo`.
#[derive(Clone, Debug, clap::Args)]
pub(crate) struct DemoArgs {
    /// Fabric provider. `sim` is the in-process fabric built into qr (MTU 4096,
    /// no hardware, no setup). `soft` is userspace RoCEv2 over UDP: qr starts
    /// `qr serve --once` as a separate server process on --server-ip and runs the
    /// client itself on --client-ip (real RoCEv2 packets on UDP port 4791).
    /// `verbs` (libibverbs, with the `verbs` feature) runs one endpoint per process:
    /// use `qr serve` / `qr connect` for it.
    #[arg(long, value_parser = super::args::provider_parser(), default_value_t = Provider::Sim)]
    pub(crate) provider: Provider,

    /// `soft`: the server process's IP (its GID). Any 127.0.0.0/8 address works
    /// on Linux loopback without setup.
    #[arg(long, default_value = "127.0.0.2")]
    pub(crate) server_ip: IpAddr,

    /// `soft`: the client's IP (its GID); must differ from --server-ip (each
    /// endpoint binds UDP port 4791 on its own IP).
    #[arg(long, default_value = "127.0.0.3")]
    pub(crate) client_ip: IpAddr,

    /// `soft`: TCP port of the server's bootstrap service (on --server-ip).
    #[arg(long, default_value_t = DEFAULT_SERVICE_PORT)]
    pub(crate) service_port: u16,

    #[command(flatten)]
    pub(crate) workload: WorkloadArgs,

    /// Injected packet loss in percent (sim only), e.g. 1 or 0.5. Any value above 0
    /// turns on the sim's "hostile fabric" (Faults::hostile): that much loss plus
    /// 1% duplication and 2% reordering (packets held back 300 us). 0 = ideal NIC.
    #[arg(long, default_value_t = 0.0, value_parser = parse_percent)]
    pub(crate) loss: f64,

    /// Seed of the fabric's fault decisions and of the transferred data.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
}

fn parse_percent(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .trim_end_matches('%')
        .parse()
        .map_err(|_| format!("`{s}` is not a percentage"))?;
    if (0.0..100.0).contains(&v) {
        Ok(v)
    } else {
        Err("loss must be at least 0 and below 100 (percent)".into())
    }
}

/// Run `qr demo`: print the report; the exit code says whether the data arrived intact.
pub(crate) fn main(args: &DemoArgs) -> ExitCode {
    print_report("demo", run(args), args.workload.json)
}

/// Run the demo on a fresh tokio multi-thread runtime.
pub(crate) fn run(args: &DemoArgs) -> Result<Report, RunError> {
    if args.provider == Provider::Soft {
        return soft::run(args);
    }
    let opts = FabricOptions {
        loss_percent: args.loss,
        seed: args.seed,
    };
    let liveness = args.workload.liveness.liveness().map_err(RunError::Run)?;
    let pair = FabricEndpoint::pair(args.provider, &opts, liveness).map_err(RunError::Provider)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")
        .map_err(RunError::Run)?;
    let timeout = Duration::from_secs(args.workload.timeout);
    let report = rt.block_on(async {
        match tokio::time::timeout(timeout, demo(args, &pair)).await {
            Ok(r) => r,
            Err(_) => Err(anyhow!(
                "the demo did not finish within {} s (--timeout)",
                args.workload.timeout
            )),
        }
    });
    // Endpoints and their driver tasks go with the runtime.
    rt.shutdown_timeout(Duration::from_secs(1));
    report.map_err(RunError::Run)
}

async fn demo(args: &DemoArgs, pair: &(FabricEndpoint, FabricEndpoint)) -> Result<Report> {
    let (server_fabric, client_fabric) = pair.clone();
    let (server_socket, client_socket) = (pair.0.socket(), pair.1.socket());
    let fabric_mtu = server_socket.mtu();
    let tls = tls::configs()?;
    let server = server_fabric.listen(&tls.server)?;
    let client = client_fabric.client()?;
    let client_cfg = client_fabric.client_config(tls.client);
    let server_addr = client_socket.peer_addr(server_socket.ud_addr());
    let ping_size = args.workload.ping_size as usize;
    let pings = args.workload.pings;

    let accept = {
        let server = server.clone();
        tokio::spawn(async move {
            // The serving commands' accept path, with `--retry`'s default.
            let attempt = RetryGate::default()
                .accept(&server)
                .await
                .context("server endpoint closed")?;
            let conn = attempt.await.context("server handshake")?;
            // Dead peers noticed by the receive path (docs/architecture.md §5).
            server_fabric.watch(&conn);
            workload::serve_transfer(conn.clone()).await?;
            if pings > 0 {
                workload::serve_pings(conn.clone()).await?;
            }
            Ok::<_, anyhow::Error>(conn)
        })
    };

    let start = Instant::now();
    let conn = client
        .connect_with(client_cfg, server_addr, tls::SERVER_NAME)
        .context("starting the handshake")?
        .await
        .context("client handshake (certificate verification included)")?;
    let handshake = start.elapsed();
    client_fabric.watch(&conn);

    let transfer = workload::run_transfer(&conn, args.workload.bytes, args.seed).await?;
    let rtts = if args.workload.pings > 0 {
        workload::run_pings(&conn, args.workload.pings, ping_size).await?
    } else {
        Vec::new()
    };
    let server_conn = accept.await.context("server task")??;
    let tls_info = TlsInfo::of(&conn, &server_conn);

    let stats = conn.stats();
    conn.close(0u32.into(), b"done");
    server_conn.close(0u32.into(), b"done");
    client.wait_idle().await;

    let transfer = TransferReport::from(&transfer);
    Ok(Report {
        ok: transfer.sha256_match,
        provider: client_fabric.kind().name().into(),
        loss_percent: args.loss,
        seed: args.seed,
        mtu: stats.path.current_mtu,
        fabric_mtu,
        handshake_ms: handshake.as_secs_f64() * 1e3,
        tls: tls_info.into(),
        transfer,
        ping: PingReport {
            count: rtts.len() as u32,
            size: ping_size,
            rtt_us: RttReport::of(&rtts),
        },
        quic: QuicReport::from(&stats),
        sockets: SocketsReport {
            client: SocketReport::socket(client_socket),
            server: Some(SocketReport::socket(server_socket)),
        },
        fabric: client_fabric.wire_stats().as_ref().map(FabricReport::from),
        endpoints: EndpointsReport {
            server: UdEndpointReport::new(server_socket.ud_addr(), None),
            client: UdEndpointReport::new(client_socket.ud_addr(), None),
        },
        soft: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentages() {
        assert_eq!(parse_percent("1"), Ok(1.0));
        assert_eq!(parse_percent("0.5%"), Ok(0.5));
        assert!(parse_percent("100").is_err());
        assert!(parse_percent("-1").is_err());
    }
}
