//! `qr`: the quic-rdma command line, and the channels built on the transport
//! as a library (usable from Rust without the CLI).
//!
//! `qr demo` runs a QUIC server and client over a UD fabric (the in-process `sim`
//! fabric by default: no hardware, no setup; `--provider soft` for two processes
//! speaking RoCEv2 over UDP), moves data with TLS 1.3, verifies it by sha256 and
//! reports throughput, latency and every counter of the stack. `qr serve` and
//! `qr connect` are the two halves of it, for two processes or two hosts.
//!
//! Layout: `cmd/` has one module per subcommand (its options, its run, its
//! exit codes). What they share has its own module and never imports `cmd/`:
//! `workload/` (transfer and ping-pong on a QUIC connection), `report/` (the
//! JSON schema and the human text), `endpoint.rs` (the quinn endpoint),
//! `provider.rs` (`--provider`: sockets on a fabric), `tls.rs` (certificates
//! and TLS 1.3 configs), `config.rs` (the TOML file of `--config FILE`: its
//! tables and keys, derived from the clap definitions below).

pub mod access;
pub mod channel_endpoint;
mod cmd;
mod config;
mod endpoint;
mod endpoint_metrics;
pub mod file_sha256;
pub mod frame;
pub mod gateway;
pub mod http;
pub mod identity;
pub mod image;
pub mod kv;
pub mod listener;
pub mod logging;
pub mod metric;
mod notify;
pub mod pki;
pub mod prom_text;
mod provider;
mod refusal;
mod report;
mod secret;
mod shutdown;
mod tls;
mod workload;

use std::process::ExitCode;

use clap::{CommandFactory as _, Parser, Subcommand};

use cmd::{
    cert, connect, demo, devices, kv_relay, node_agent, pull, registry_agent, serve, ud_pingpong,
};

/// `qr --version`: the package version and the git revision it was built from.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("QR_GIT_REVISION"),
    ")"
);

/// QUIC over RDMA Unreliable Datagram.
#[derive(Debug, Parser)]
#[command(name = "qr", version = VERSION, about, long_about = None)]
struct Cli {
    /// Log lines on stderr as text or as JSON lines (timestamp, level,
    /// target, fields); RUST_LOG filters them.
    #[arg(long, global = true, value_enum, default_value_t = logging::LogFormat::Text)]
    log_format: logging::LogFormat,

    #[command(subcommand)]
    command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
enum Command {
    /// Server + client over a fabric: TLS 1.3 handshake, a sha256-verified bulk
    /// transfer, a small-message ping-pong, and a report of every counter.
    ///
    /// Exit codes: 0 the data arrived intact; 1 it did not, or the run failed;
    /// 2 bad usage or a provider not built into this version.
    Demo(demo::DemoArgs),

    /// Serve the demo's workload on a `soft` endpoint (userspace RoCEv2 over UDP):
    /// publishes GID/QPN/Q_Key/UDP port on a TCP bootstrap service and writes its
    /// self-signed certificate to --cert-out for clients to trust.
    ///
    /// Exit codes (with --once): 0 the connection's workload completed; 1 it did
    /// not, or serving failed; 2 bad usage or a provider not built in.
    Serve(serve::ServeArgs),

    /// Connect to a `qr serve` by HOST:SERVICE_PORT, run the demo's workload as
    /// the client and report (the server's counters are not included).
    ///
    /// Exit codes: 0 the data arrived intact; 1 it did not, or the run failed;
    /// 2 bad usage or a provider not built in.
    Connect(connect::ConnectArgs),

    /// Raw UD ping-pong (no QUIC), compatible with rdma-core's `ibv_ud_pingpong`:
    /// its TCP address exchange (port 18515), Q_Key and message loop. Server
    /// without HOST, client with it.
    ///
    /// Exit codes: 0 all iterations done; 1 failure; 2 bad usage or a provider
    /// not built in.
    UdPingpong(ud_pingpong::UdPingpongArgs),

    /// Issue development certificates for the channels' mutual TLS: a CA
    /// (made once per directory) and leaf certificates signed by it.
    ///
    /// Exit codes: 0 written; 1 failed; 2 bad usage.
    Cert(cert::CertArgs),

    /// List every provider and device: RDMA devices (ports, state, link layer,
    /// MTUs, GID table with types, limits) and the interfaces `soft` can use,
    /// naming the fix for each misconfiguration.
    ///
    /// Exit codes: 0 listed (even when there is no RDMA device); 2 bad usage.
    Devices(devices::DevicesArgs),

    /// Image layers: serve manifests and blobs over the fabric (QUIC streams,
    /// ALPN qr-image/1, mutual TLS) from an upstream registry (pull-through,
    /// single-flight) or an OCI image-layout directory, to `qr node-agent`s.
    ///
    /// Exit codes: runs until killed; 1 it could not start; 2 bad usage.
    RegistryAgent(registry_agent::RegistryAgentArgs),

    /// Image layers: the OCI distribution pull API on local HTTP (for
    /// containerd, skopeo, any OCI client), fetching from a `qr registry-agent`
    /// over the fabric in parallel verified chunks into a bounded cache.
    ///
    /// Exit codes: runs until killed; 1 it could not start; 2 bad usage.
    NodeAgent(node_agent::NodeAgentArgs),

    /// Image layers: pull an image from a `qr registry-agent` over the fabric
    /// into a local cache (and optionally an OCI layout), with a progress bar
    /// per blob and a summary (`--json`).
    ///
    /// Exit codes: 0 every blob arrived verified; 1 it did not; 2 bad usage.
    Pull(pull::PullArgs),

    /// Redis replication across the fabric: `upstream` is a replica of a real
    /// Redis master and serves downstream relays; `downstream` dials it and
    /// is a master to real Redis replicas. Mutual TLS between the relays.
    ///
    /// Exit codes: runs until killed; 1 it could not start; 2 bad usage or a
    /// provider not built in.
    KvRelay(kv_relay::KvRelayArgs),

    /// Forward QUIC datagrams between UDP and the fabric without terminating
    /// QUIC (TLS stays end to end): `to-fabric` lets plain UDP clients reach a
    /// `qr serve`, `to-udp` lets fabric clients reach a QUIC server on UDP.
    ///
    /// Exit codes: runs until killed; 1 it could not start; 2 bad usage or a
    /// provider it cannot use.
    Gateway(cmd::gateway::GatewayArgs),

    /// A live view of a metrics endpoint (`qr serve --metrics`, `qr gateway
    /// --metrics`, the channels' agents): each counter's rate and each gauge
    /// per interval, after checking the scrape is valid Prometheus text.
    ///
    /// Exit codes: 0 after --count intervals; 1 the endpoint failed or answered
    /// something else; 2 bad usage.
    Stats(cmd::stats::StatsArgs),

    /// Config files of the long-running commands (`--config FILE`): `qr
    /// config check FILE` validates one without starting anything.
    ///
    /// Exit codes: 0 valid; 1 invalid; 2 bad usage or an unreadable file.
    Config(cmd::config::ConfigArgs),

    /// Print a shell completion script (bash, zsh, fish, elvish, powershell),
    /// e.g. `qr completions bash > /etc/bash_completion.d/qr`.
    ///
    /// Exit codes: 0 printed; 2 bad usage.
    Completions(cmd::completions::CompletionsArgs),

    /// Print the manual page (qr.1), or with --dir write one per subcommand.
    ///
    /// Exit codes: 0 written; 1 the directory could not be written; 2 bad usage.
    Man(cmd::completions::ManArgs),
}

/// Parse the command line, run the subcommand and return its exit code: the
/// whole of `qr`'s `main`.
pub fn run() -> ExitCode {
    // A `--config FILE`'s options become command-line words the command
    // line itself does not set (crate::config).
    let argv = match config::apply(Cli::command(), std::env::args_os().collect()) {
        Ok(argv) => argv,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let cli = Cli::parse_from(argv);
    logging::init(cli.log_format);
    match cli.command {
        Command::Demo(args) => demo::main(&args),
        Command::Serve(args) => serve::main(&args),
        Command::Connect(args) => connect::main(&args),
        Command::UdPingpong(args) => ud_pingpong::main(&args),
        Command::Cert(args) => cert::main(&args),
        Command::Devices(args) => devices::main(&args),
        Command::RegistryAgent(args) => registry_agent::main(&args),
        Command::NodeAgent(args) => node_agent::main(&args),
        Command::Pull(args) => pull::main(&args),
        Command::KvRelay(args) => kv_relay::main(&args),
        Command::Gateway(args) => cmd::gateway::main(&args),
        Command::Stats(args) => cmd::stats::main(&args),
        Command::Config(args) => cmd::config::main(&args),
        Command::Completions(args) => cmd::completions::completions(&args),
        Command::Man(args) => cmd::completions::man(&args),
    }
}
