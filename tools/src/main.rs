//! `qr`: the quic-rdma command line.
//!
//! `qr demo` runs a QUIC server and client over a UD fabric (the in-process `sim`
//! fabric by default: no hardware, no setup), moves data with TLS 1.3, verifies it
//! by sha256 and reports throughput, latency and every counter of the stack.

mod demo;
mod provider;
mod tls;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// QUIC over RDMA Unreliable Datagram.
#[derive(Debug, Parser)]
#[command(name = "qr", version, about, long_about = None)]
struct Cli {
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    match cli.command {
        Command::Demo(args) => run_demo(&args),
    }
}

fn run_demo(args: &demo::DemoArgs) -> ExitCode {
    match demo::run(args) {
        Ok(report) => {
            if args.json {
                println!("{}", report.to_json());
            } else {
                print!("{report}");
            }
            if report.ok {
                ExitCode::SUCCESS
            } else {
                eprintln!("qr demo: sha256 mismatch: the data did not arrive intact");
                ExitCode::FAILURE
            }
        }
        Err(demo::DemoError::Provider(e @ provider::OpenError::NotBuiltIn(_))) => {
            eprintln!("qr demo: {e}");
            ExitCode::from(2)
        }
        Err(demo::DemoError::Provider(e)) => {
            eprintln!("qr demo: provider failed: {e}");
            ExitCode::FAILURE
        }
        Err(demo::DemoError::Run(e)) => {
            eprintln!("qr demo: {e:#}");
            ExitCode::FAILURE
        }
    }
}
