//! `qr demo --provider soft`: the server is a separate process (`qr serve
//! --once`, this same executable) on one IP, the client runs here on another,
//! each its own GID; real RoCEv2 packets go over UDP between them.
//!
//! The server must not outlive this process, however it ends: it is started
//! with `--exit-with-parent` and its stdin a pipe only we hold, so when we
//! exit — even by SIGKILL — the kernel closes our end, the child reads end of
//! file, removes the certificate and our temporary directory, and exits (see
//! `watch_parent` in `cmd/serve.rs` for why a pipe rather than `PR_SET_PDEATHSIG`). It
//! runs in its own process group, so a Ctrl-C at the terminal stops only us
//! and the child still goes through that clean-up rather than dying on the
//! signal with the directory left behind. When we end normally, dropping
//! `ServerChild` kills and reaps it, then `TempDir` removes the directory.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use super::DemoArgs;
use crate::cmd::args::FabricArgs;
use crate::cmd::connect::{self, ClientRun, ConnectArgs};
use crate::cmd::RunError;
use crate::provider::OpenError;
use crate::report::{Report, ServeSummary};
use quic_rdma::fabric::Provider;

/// How long the server process may take to start answering.
const READY_WITHIN: Duration = Duration::from_secs(20);

/// The server child: killed and reaped if still running when dropped.
struct ServerChild {
    child: Child,
    /// The write end of its stdin: it reads end of file once this is closed,
    /// by our exit or by dropping it.
    _stdin: Option<ChildStdin>,
    stdout: Option<JoinHandle<String>>,
    stderr: Option<JoinHandle<String>>,
}

impl ServerChild {
    /// Its stderr so far (only once it has exited).
    fn stderr(&mut self) -> String {
        self.stderr
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default()
    }

    /// Wait up to `limit` for it to exit; then its stdout.
    fn finish(&mut self, limit: Duration) -> Result<(std::process::ExitStatus, String)> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait()? {
                let out = self
                    .stdout
                    .take()
                    .and_then(|h| h.join().ok())
                    .unwrap_or_default();
                return Ok((status, out));
            }
            if Instant::now() >= deadline {
                bail!("the server process did not exit within {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for ServerChild {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

fn drain(mut r: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = r.read_to_string(&mut s);
        s
    })
}

/// A private directory for the server's certificate, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Result<TempDir> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = std::env::temp_dir().join(format!("qr-demo-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(TempDir(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Run the two-process demo.
pub(crate) fn run(args: &DemoArgs) -> Result<Report, RunError> {
    if args.loss > 0.0 {
        return Err(RunError::Provider(OpenError::Unsupported(
            "--loss is fault injection of the sim fabric; `soft` runs on a real network".into(),
        )));
    }
    if args.server_ip == args.client_ip {
        return Err(RunError::Run(anyhow!(
            "--server-ip and --client-ip must differ (each endpoint is its own GID)"
        )));
    }
    let dir = TempDir::new().map_err(RunError::Run)?;
    let cert = dir.0.join("server-cert.der");
    let service = std::net::SocketAddr::new(args.server_ip, args.service_port).to_string();

    let exe = std::env::current_exe()
        .context("finding the qr executable")
        .map_err(RunError::Run)?;
    let mut cmd = Command::new(exe);
    cmd.args([
        "serve",
        "--once",
        "--json",
        "--provider",
        "soft",
        "--exit-with-parent",
    ])
    .arg("--ip")
    .arg(args.server_ip.to_string())
    .arg("--service-port")
    .arg(args.service_port.to_string())
    .arg("--cert-out")
    .arg(&cert)
    .arg("--timeout")
    .arg(args.workload.timeout.to_string())
    .args(args.workload.liveness.to_cli())
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .process_group(0);
    let mut child = cmd
        .spawn()
        .context("starting the server process (qr serve)")
        .map_err(RunError::Run)?;
    let stdin = child.stdin.take();
    let stdout = child.stdout.take().map(drain);
    let stderr = child.stderr.take().map(drain);
    let mut server = ServerChild {
        child,
        _stdin: stdin,
        stdout,
        stderr,
    };

    wait_ready(&mut server, &service).map_err(RunError::Run)?;

    let client = ClientRun::from_args(&ConnectArgs {
        server: service,
        cert: cert.clone(),
        server_name: Some(args.server_ip.to_string()),
        fabric: FabricArgs {
            provider: Provider::Soft,
            udp_port: quic_rdma::fabric::ROCEV2_UDP_PORT,
        },
        ip: Some(args.client_ip),
        workload: args.workload,
        seed: args.seed,
        wait: 5,
    })
    .map_err(RunError::Run)?;
    let mut report = match connect::run(&client) {
        Ok(r) => r,
        Err(e) => {
            // Its side of the story, if it has one.
            let _ = server.finish(Duration::from_secs(2));
            let err = server.stderr();
            if !err.trim().is_empty() {
                eprintln!("qr demo: server process said:\n{}", err.trim_end());
            }
            return Err(e);
        }
    };
    let (status, out) = server
        .finish(Duration::from_secs(15))
        .map_err(RunError::Run)?;
    let summary: ServeSummary = out
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .ok_or_else(|| anyhow!("the server process printed no summary ({status})"))
        .and_then(|l| serde_json::from_str(l).context("parsing the server's summary"))
        .map_err(|e| {
            RunError::Run(e.context(format!("server stderr: {}", server.stderr().trim_end())))
        })?;
    report.sockets.server = Some(summary.socket.clone());
    if let Some(soft) = report.soft.as_mut() {
        soft.server = summary.soft.clone();
    }
    report.tls.server_name = summary.server_name.clone().or(report.tls.server_name);
    // Both sides agree: the client's digest equals what the server hashed.
    report.ok = report.ok
        && summary.ok
        && status.success()
        && summary.sha256_received == report.transfer.sha256_received;
    if !report.ok {
        eprintln!(
            "qr demo: server process: exit {status}, summary ok={}, error {:?}",
            summary.ok, summary.error
        );
    }
    Ok(report)
}

/// Until the server's bootstrap service answers (or the server died).
fn wait_ready(server: &mut ServerChild, service: &str) -> Result<()> {
    let deadline = Instant::now() + READY_WITHIN;
    loop {
        if let Some(status) = server.child.try_wait()? {
            bail!(
                "the server process exited before it was ready ({status}):\n{}",
                server.stderr().trim_end()
            );
        }
        match crate::channel_endpoint::query_bootstrap(service, Duration::ZERO) {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() >= deadline => {
                return Err(anyhow::Error::from(e).context(format!(
                    "the server process did not answer on {service} within {READY_WITHIN:?}"
                )))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}
