//! `qr demo`: a QUIC server and client over a UD fabric, a verified bulk transfer
//! and a ping-pong, with a report of what every layer counted.

mod soft;

use std::net::IpAddr;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use quic_rdma::quinn_adapter;

use crate::endpoint::{endpoint, CLIENT_KEY, SERVER_KEY};
use crate::provider::{self, FabricOptions, OpenError, ProviderKind};
use crate::report::{
    EndpointsReport, FabricReport, PingReport, QuicReport, Report, RttReport, SocketReport,
    SocketsReport, TransferReport, UdEndpointReport,
};
use crate::tls::{self, TlsInfo};
use crate::workload;

/// TCP service port of `soft` bootstrap servers when none is given: rdma-core's
/// `ibv_*_pingpong` examples exchange their QP details on the same port.
pub(crate) const DEFAULT_SERVICE_PORT: u16 = 18515;

/// Options of `qr demo`.
#[derive(Clone, Debug, clap::Args)]
pub(crate) struct DemoArgs {
    /// Fabric provider. `sim` is the in-process fabric built into qr (MTU 4096,
    /// no hardware, no setup). `soft` is userspace RoCEv2 over UDP: qr starts
    /// `qr serve --once` as a separate server process on --server-ip and runs the
    /// client itself on --client-ip (real RoCEv2 packets on UDP port 4791).
    /// `verbs` (libibverbs, with the `verbs` feature) runs one endpoint per process:
    /// use `qr serve` / `qr connect` for it.
    #[arg(long, value_enum, default_value_t = ProviderKind::Sim)]
    pub(crate) provider: ProviderKind,

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

    /// Bytes to transfer client -> server. Suffixes K, M, G, T are binary
    /// (KiB, MiB, GiB, TiB): 256M, 1G, 1.5G, 4096.
    #[arg(long, default_value = "64M", value_parser = parse_bytes)]
    pub(crate) bytes: u64,

    /// Round trips of the ping-pong (0 skips it).
    #[arg(long, default_value_t = 10_000)]
    pub(crate) pings: u32,

    /// Size of each ping and pong in bytes.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub(crate) ping_size: u32,

    /// Injected packet loss in percent (sim only), e.g. 1 or 0.5. Any value above 0
    /// turns on the sim's "hostile fabric" (Faults::hostile): that much loss plus
    /// 1% duplication and 2% reordering (packets held back 300 us). 0 = ideal NIC.
    #[arg(long, default_value_t = 0.0, value_parser = parse_percent)]
    pub(crate) loss: f64,

    /// Seed of the fabric's fault decisions and of the transferred data.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,

    /// Give up (exit 1) if the demo has not finished after this many seconds.
    #[arg(long, default_value_t = 600)]
    pub(crate) timeout: u64,

    /// Print the report as one JSON object instead of the human summary.
    #[arg(long)]
    pub(crate) json: bool,
}

/// Parse a byte count with an optional binary suffix (K, M, G, T; "KiB", "MB"... accepted).
///
/// A fraction is taken only when it comes to a whole number of bytes (1.5K is
/// 1536; 1.5 and 1.1K are errors): a size is never silently rounded.
pub(crate) fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let num: String = num.chars().filter(|&c| c != '_').collect();
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        other => return Err(format!("unknown size suffix `{other}` (use K, M, G or T)")),
    };
    let not_a_count = || format!("`{s}` is not a byte count (e.g. 64M, 1G, 4096)");
    // Exact decimal arithmetic: `int.frac` is digits / 10^frac.len().
    let (int, frac) = num.split_once('.').unwrap_or((&num, ""));
    let all_digits = |d: &str| d.bytes().all(|b| b.is_ascii_digit());
    if (int.is_empty() && frac.is_empty()) || !all_digits(int) || !all_digits(frac) {
        return Err(not_a_count());
    }
    let too_big = || format!("`{s}` is more bytes than fit in 64 bits");
    let digits: u128 = format!("{int}{frac}").parse().map_err(|_| too_big())?;
    let scale = u32::try_from(frac.len())
        .ok()
        .and_then(|n| 10u128.checked_pow(n))
        .ok_or_else(too_big)?;
    let scaled = digits.checked_mul(1u128 << shift).ok_or_else(too_big)?;
    if scaled % scale != 0 {
        return Err(format!(
            "`{s}` is not a whole number of bytes: give an integer count, or a \
             fraction of a unit that comes out whole (e.g. 1.5K = 1536)"
        ));
    }
    let bytes = u64::try_from(scaled / scale).map_err(|_| too_big())?;
    if bytes == 0 {
        return Err(format!("`{s}` is not a byte count of at least 1"));
    }
    Ok(bytes)
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

/// How a demo run ended badly.
#[derive(Debug)]
pub(crate) enum DemoError {
    /// The provider could not be opened (not built in, or failed).
    Provider(OpenError),
    /// Anything else (handshake, transfer, timeout).
    Run(anyhow::Error),
}

/// Run the demo on a fresh tokio multi-thread runtime.
pub(crate) fn run(args: &DemoArgs) -> Result<Report, DemoError> {
    if args.provider == ProviderKind::Soft {
        return soft::run(args);
    }
    let opts = FabricOptions {
        loss_percent: args.loss,
        seed: args.seed,
    };
    let pair = provider::open_pair(args.provider, &opts).map_err(DemoError::Provider)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")
        .map_err(DemoError::Run)?;
    let timeout = Duration::from_secs(args.timeout);
    let report = rt.block_on(async {
        match tokio::time::timeout(timeout, demo(args, &pair)).await {
            Ok(r) => r,
            Err(_) => Err(anyhow!(
                "the demo did not finish within {} s (--timeout)",
                args.timeout
            )),
        }
    });
    // Endpoints and their driver tasks go with the runtime.
    rt.shutdown_timeout(Duration::from_secs(1));
    report.map_err(DemoError::Run)
}

async fn demo(args: &DemoArgs, pair: &provider::SocketPair) -> Result<Report> {
    let fabric_mtu = pair.server.mtu();
    let tls = tls::configs(quinn_adapter::transport(fabric_mtu))?;
    let server = endpoint(&pair.server, Some(tls.server), SERVER_KEY)?;
    let client = endpoint(&pair.client, None, CLIENT_KEY)?;
    let server_addr = pair.client.peer_addr(pair.server.ud_addr());
    let ping_size = args.ping_size as usize;
    let pings = args.pings;

    let accept = {
        let server = server.clone();
        tokio::spawn(async move {
            let incoming = server.accept().await.context("server endpoint closed")?;
            let conn = incoming.await.context("server handshake")?;
            workload::serve_transfer(conn.clone()).await?;
            if pings > 0 {
                workload::serve_pings(conn.clone()).await?;
            }
            Ok::<_, anyhow::Error>(conn)
        })
    };

    let start = Instant::now();
    let conn = client
        .connect_with(tls.client, server_addr, tls::SERVER_NAME)
        .context("starting the handshake")?
        .await
        .context("client handshake (certificate verification included)")?;
    let handshake = start.elapsed();

    let transfer = workload::run_transfer(&conn, args.bytes, args.seed).await?;
    let rtts = if args.pings > 0 {
        workload::run_pings(&conn, args.pings, ping_size).await?
    } else {
        Vec::new()
    };
    let server_conn = accept.await.context("server task")??;
    let tls_info = TlsInfo::of(&conn, &server_conn, &tls.suite);

    let stats = conn.stats();
    conn.close(0u32.into(), b"done");
    server_conn.close(0u32.into(), b"done");
    client.wait_idle().await;

    let transfer = TransferReport::from(&transfer);
    Ok(Report {
        ok: transfer.sha256_match,
        provider: pair.kind.name().into(),
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
            client: SocketReport::of(&pair.client),
            server: Some(SocketReport::of(&pair.server)),
        },
        fabric: pair.wire_stats().as_ref().map(FabricReport::from),
        endpoints: EndpointsReport {
            server: UdEndpointReport::new(pair.server.ud_addr(), None),
            client: UdEndpointReport::new(pair.client.ud_addr(), None),
        },
        soft: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_suffixes() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("64M"), Ok(64 << 20));
        assert_eq!(parse_bytes("256m"), Ok(256 << 20));
        assert_eq!(parse_bytes("1G"), Ok(1 << 30));
        assert_eq!(parse_bytes("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_bytes("8 MB"), Ok(8 << 20));
        assert_eq!(parse_bytes("1_000"), Ok(1000));
        assert!(parse_bytes("0").is_err());
        assert!(parse_bytes("12X").is_err());
        assert!(parse_bytes("M").is_err());
        // Never rounded (issue 9 #10): fractions only where they are exact.
        assert_eq!(parse_bytes("1.5K"), Ok(1536));
        assert_eq!(parse_bytes(".5k"), Ok(512));
        assert_eq!(parse_bytes("2."), Ok(2));
        for bad in [
            "1.5",
            "1.1K",
            "0.3",
            "1.2.3",
            ".",
            "1e3",
            "-1",
            "17179869184G",
        ] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
        assert!(parse_bytes("1.5").unwrap_err().contains("whole number"));
        assert_eq!(parse_bytes("16777215T"), Ok(u64::MAX - ((1 << 40) - 1)));
    }

    #[test]
    fn percentages() {
        assert_eq!(parse_percent("1"), Ok(1.0));
        assert_eq!(parse_percent("0.5%"), Ok(0.5));
        assert!(parse_percent("100").is_err());
        assert!(parse_percent("-1").is_err());
    }
}
