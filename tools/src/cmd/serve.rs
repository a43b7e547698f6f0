//! `qr serve`: the server side of the workload (`crate::workload`) on one
//! endpoint of a multi-process provider (`soft`, or `verbs` when built in),
//! reachable by host and service port.
//!
//! Start-up order, so that "the bootstrap service answers" means "ready":
//! open the RoCEv2 port and QP, write the self-signed certificate to
//! `--cert-out`, create the quinn endpoint, then start the bootstrap service
//! (TCP, docs/architecture.md §3) that publishes GID, QPN, Q_Key, UDP port and MTU.
//!
//! Each accepted connection gets the workload's server side: read the first
//! stream to its end and answer with byte count + sha256; echo the second
//! stream (the ping-pong) until it ends. One summary per connection
//! (`report::ServeSummary`) goes to stdout (a JSON line with `--json`).

use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use quic_rdma::quinn_adapter::Attempt;

use super::args::{FabricArgs, ListenArgs, LivenessArgs, MetricsArgs, RetryArgs};
use crate::endpoint::{Acceptor, FabricEndpoint};
use crate::endpoint_metrics::EndpointMetrics;
use crate::http::Page;
use crate::provider::{self, EndpointOptions, OpenError};
use crate::report::{hex, ServeSummary, SocketReport, SoftPortReport, UdEndpointReport};
use crate::tls::{self, ServerIdentity};
use crate::workload;

/// Options of `qr serve`.
#[derive(Clone, Debug, clap::Args)]
#[command(arg(crate::config::option()))]
pub(crate) struct ServeArgs {
    /// --ip and --service-port.
    #[command(flatten)]
    pub(crate) listen: ListenArgs,

    /// Where to write the server's self-signed certificate (not its key) for
    /// clients to trust (`qr connect --cert`): PEM if the name ends in .pem or
    /// .crt, DER otherwise. Written before the service starts answering.
    #[arg(long)]
    pub(crate) cert_out: PathBuf,

    #[command(flatten)]
    pub(crate) fabric: FabricArgs,

    /// Bind the bootstrap service here instead of --ip:--service-port.
    #[arg(long)]
    pub(crate) bootstrap_bind: Option<SocketAddr>,

    /// QPN of the served QP (2..=0xFFFFFF; default: the provider's first, 0x11).
    #[arg(long, value_parser = parse_qpn)]
    pub(crate) qpn: Option<u32>,

    /// Fabric IP of a `qr gateway to-fabric` (its --fabric-ip); repeat for
    /// several. Its clients are on UDP paths: their connections start at
    /// 1200-byte datagrams and discover the path MTU, with UDP timers (10 s
    /// keep-alive, 25 s idle timeout) instead of the fabric's.
    #[arg(long = "udp-gateway", value_name = "IP")]
    pub(crate) udp_gateways: Vec<IpAddr>,

    /// Extra names (DNS names or IPs) for the certificate; it always names
    /// "localhost" and --ip.
    #[arg(long = "name")]
    pub(crate) names: Vec<String>,

    /// Exit after the first connection (exit code 0 if its workload completed).
    #[arg(long)]
    pub(crate) once: bool,

    /// With --once: give up (exit 1) unless the whole run — waiting for the
    /// client included — has finished after this many seconds.
    #[arg(long, default_value_t = 600)]
    pub(crate) timeout: u64,

    /// For `qr demo`, which spawns `qr serve` with its stdin a pipe it holds:
    /// exit as soon as stdin reaches end of file — the parent is gone, however it
    /// died (the kernel closes its end even on SIGKILL) — removing the
    /// --cert-out file, and its directory if that leaves it empty.
    #[arg(long, hide = true)]
    pub(crate) exit_with_parent: bool,

    /// `--metrics` (the endpoint's socket, provider and quinn counters) and
    /// the limits of its listener.
    #[command(flatten)]
    pub(crate) metrics: MetricsArgs,

    /// Print each connection's summary as one JSON line instead of text.
    #[arg(long)]
    pub(crate) json: bool,

    /// Liveness timers of the QUIC connection.
    #[command(flatten)]
    pub(crate) liveness: LivenessArgs,

    /// When connection attempts get a Retry (address validation).
    #[command(flatten)]
    pub(crate) retry: RetryArgs,
}

/// A QPN in decimal or 0x-hex, 2..=0xFFFFFF (0 and 1 are special in IBA).
fn parse_qpn(s: &str) -> Result<u32, String> {
    let v = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u32::from_str_radix(h, 16),
        None => s.parse(),
    }
    .map_err(|_| format!("`{s}` is not a QPN"))?;
    if (2..=0xFF_FFFF).contains(&v) {
        Ok(v)
    } else {
        Err("a QPN is 2..=0xFFFFFF (24 bits; 0 and 1 are special)".into())
    }
}

/// Run `qr serve`.
pub(crate) fn main(args: &ServeArgs) -> ExitCode {
    match serve(args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            match e.downcast_ref::<OpenError>() {
                Some(OpenError::NotBuiltIn(_) | OpenError::Unsupported(_)) => {
                    eprintln!("qr serve: {e}");
                    return ExitCode::from(2);
                }
                _ => eprintln!("qr serve: {e:#}"),
            }
            ExitCode::FAILURE
        }
    }
}

/// Held while the certificate is written, and by the parent watcher from the
/// moment it decides to exit: so it never removes the directory while a
/// certificate is half-written into it.
static CERT_FILES: Mutex<()> = Mutex::new(());

/// `--exit-with-parent`: a thread that waits for end of file on stdin, then
/// removes the certificate (and its directory, if then empty) and exits.
///
/// Why stdin and not `PR_SET_PDEATHSIG`: that needs `prctl` (unsafe, or another
/// crate), fires when the parent's *thread* that forked exits rather than the
/// parent, and races with a parent that dies before the child sets it. A pipe
/// needs only std, and its end of file arrives however and whenever the parent
/// went, even before this thread started reading. It also lets this process
/// clean up the parent's temporary directory, which a killed parent cannot.
fn watch_parent(cert: &Path) -> Result<()> {
    let cert = cert.to_path_buf();
    std::thread::Builder::new()
        .name("qr-serve-parent".into())
        .spawn(move || {
            let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
            // Keep the lock to the end: the main thread must not write anew.
            let _guard = CERT_FILES.lock();
            let mut tmp = cert.as_os_str().to_owned();
            tmp.push(".tmp");
            let _ = std::fs::remove_file(&cert);
            let _ = std::fs::remove_file(tmp);
            if let Some(dir) = cert.parent().filter(|d| !d.as_os_str().is_empty()) {
                // Only if empty: never take anything but our own file with us.
                let _ = std::fs::remove_dir(dir);
            }
            // Not eprintln!: stderr is most likely a pipe to the dead parent,
            // and eprintln! panics on EPIPE, which would end this thread and
            // never the process.
            let _ = writeln!(
                std::io::stderr(),
                "qr serve: the parent process is gone (stdin closed); exiting"
            );
            std::process::exit(1);
        })
        .context("starting the parent watcher")?;
    Ok(())
}

/// Serve; `Ok(ok)` of the single connection with `--once`, else runs until killed.
fn serve(args: &ServeArgs) -> Result<bool> {
    let started = Instant::now();
    provider::ensure_built_in(args.fabric.provider)?;
    if args.exit_with_parent {
        watch_parent(&args.cert_out)?;
    }
    let mut opts = EndpointOptions::new(args.listen.ip);
    opts.udp_port = args.fabric.udp_port;
    opts.qpn = args.qpn;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let fabric = {
        let _rt = rt.enter();
        FabricEndpoint::open(args.fabric.provider, &opts, args.liveness.liveness()?)?
            .with_udp_gateways(&args.udp_gateways)
    };
    let mut names = vec![args.listen.ip.to_string()];
    names.extend(args.names.iter().cloned());
    let id = ServerIdentity::generate(&names)?;
    {
        let _files = CERT_FILES.lock().unwrap_or_else(|e| e.into_inner());
        id.write_cert(&args.cert_out)?;
    }
    let tls = tls::server_settings(&id)?;

    let result = rt.block_on(async {
        let endpoint = fabric.listen(&tls)?;
        let acceptor = Arc::new(fabric.acceptor(&tls)?);
        let bind = args
            .bootstrap_bind
            .unwrap_or(SocketAddr::new(args.listen.ip, args.listen.service_port));
        let publish = fabric.record()?;
        let (bound, _bootstrap) = fabric.publish(bind)?;
        tracing::info!(
            target: "qr::serve",
            "{} endpoint GID {} QPN {:#x} Q_Key {:#x} UDP port {} MTU {}; \
             bootstrap on TCP {bound}; certificate in {}",
            fabric.kind(),
            publish.addr.gid,
            publish.addr.qpn,
            publish.addr.qkey,
            publish.udp_port,
            publish.mtu.bytes(),
            args.cert_out.display()
        );
        crate::notify::ready(&format!("bootstrap on TCP {bound}"));
        let gate = args.retry.gate();
        let metrics = Arc::new(
            EndpointMetrics::new(fabric.socket().clone(), fabric.soft().cloned())
                .with_gate(gate.clone()),
        );
        let m = metrics.clone();
        let _metrics_http = args
            .metrics
            .serve(
                "qr serve",
                vec![Page::metrics(move || m.prometheus())],
                vec![],
            )
            .await?;
        if args.once {
            // One deadline for the whole run, from start-up: a client that never
            // comes must not keep the process (its IP:port, its service port).
            // Clamped so that adding it to `started` cannot overflow.
            let budget = Duration::from_secs(args.timeout.min(u64::from(u32::MAX)));
            let deadline = tokio::time::Instant::from_std(started + budget);
            // Attempts answered with a Retry are skipped: the client comes
            // back with a token, within the same deadline.
            let attempt = tokio::time::timeout_at(deadline, gate.accept(&endpoint))
                .await
                .map_err(|_| {
                    anyhow!(
                        "no client connected within {} s (--timeout); giving up",
                        args.timeout
                    )
                })?
                .ok_or_else(|| anyhow!("endpoint closed"))?;
            let s = tokio::time::timeout_at(
                deadline,
                connection(attempt, &acceptor, metrics.clone(), fabric.clone()),
            )
            .await
            .map_err(|_| {
                anyhow!(
                    "the connection did not finish within {} s of start-up (--timeout)",
                    args.timeout
                )
            })?;
            print_summary(&s, args.json);
            endpoint.close(0u32.into(), b"bye");
            let _ = tokio::time::timeout(Duration::from_secs(2), endpoint.wait_idle()).await;
            Ok(s.ok)
        } else {
            let serve = async {
                while let Some(attempt) = gate.accept(&endpoint).await {
                    let (json, metrics, fabric) = (args.json, metrics.clone(), fabric.clone());
                    let acceptor = acceptor.clone();
                    tokio::spawn(async move {
                        let s = connection(attempt, &acceptor, metrics, fabric).await;
                        print_summary(&s, json);
                    });
                }
            };
            tokio::select! {
                () = serve => {}
                sig = crate::shutdown::requested() => {
                    tracing::info!(target: "qr::serve", "{sig}: closing connections and stopping");
                    crate::shutdown::close(&endpoint).await;
                }
            }
            Ok(true)
        }
    });
    rt.shutdown_timeout(Duration::from_secs(1));
    result
}

fn print_summary(s: &ServeSummary, json: bool) {
    if json {
        println!("{}", s.to_json());
    } else {
        println!("{s}");
    }
}

/// Handshake, workload, wait for the client to close; never fails (errors go
/// into the summary).
async fn connection(
    attempt: Attempt,
    acceptor: &Acceptor,
    metrics: Arc<EndpointMetrics>,
    fabric: FabricEndpoint,
) -> ServeSummary {
    let (socket, soft) = (fabric.socket(), fabric.soft());
    let client = socket
        .ud_addr_of(attempt.remote_address())
        .map(|a| UdEndpointReport::new(a, None));
    let mut received = None;
    let mut echoed = 0;
    let mut server_name = None;
    let outcome = async {
        let conn = acceptor.accept(attempt).await.context("server handshake")?;
        metrics.track(&conn);
        server_name = conn
            .handshake_data()
            .and_then(|d| d.downcast::<quinn::crypto::rustls::HandshakeData>().ok())
            .and_then(|hd| hd.server_name);
        received = Some(workload::serve_transfer(conn.clone()).await?);
        echoed = workload::serve_pings(conn.clone()).await?;
        // The client closes once it has read the last pong.
        let _ = tokio::time::timeout(Duration::from_secs(5), conn.closed()).await;
        Ok::<_, anyhow::Error>(())
    }
    .await;
    ServeSummary {
        ok: outcome.is_ok(),
        error: outcome.err().map(|e| format!("{e:#}")),
        provider: fabric.kind().name().into(),
        server: UdEndpointReport::new(socket.ud_addr(), soft.map(|p| p.local_addr().port())),
        client,
        bytes_received: received.map_or(0, |r| r.bytes),
        sha256_received: received.map_or_else(String::new, |r| hex(&r.sha256)),
        ping_bytes_echoed: echoed,
        server_name,
        socket: SocketReport::socket(socket),
        soft: soft.map(|p| SoftPortReport::from(&p.stats())),
    }
}
