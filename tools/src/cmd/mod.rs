//! The subcommands of `qr`, one module each: `demo`, `serve`, `connect`,
//! `ud_pingpong`. Each has its options (`clap::Args`) and a `main` that runs it
//! and chooses the exit code.
//!
//! They build on the shared parts of the crate — `workload`, `report`,
//! `endpoint`, `provider`, `tls` — and those never look back here. Between
//! subcommands there is one edge: `qr demo --provider soft` is `qr serve` in a
//! child process plus the client run of `qr connect` in this one, so
//! `demo/soft.rs` calls into `connect.rs`.

mod args;
pub(crate) mod cert;
pub(crate) mod completions;
pub(crate) mod config;
pub(crate) mod connect;
pub(crate) mod demo;
pub(crate) mod devices;
pub(crate) mod gateway;
pub(crate) mod kv_relay;
pub(crate) mod node_agent;
pub(crate) mod pull;
pub(crate) mod registry_agent;
pub(crate) mod serve;
pub(crate) mod stats;
pub(crate) mod ud_pingpong;

use std::process::ExitCode;

use crate::provider::OpenError;
use crate::report::Report;

/// Run a long-lived subcommand's body on a two-worker tokio runtime; errors
/// (the runtime's own included) are printed as `qr NAME: ...` and become
/// exit code 1.
pub(crate) fn run_on_runtime(
    name: &str,
    body: impl std::future::Future<Output = anyhow::Result<()>>,
) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("qr {name}: starting the tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(body) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("qr {name}: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// How a client-side run (`qr demo`, `qr connect`) ended badly.
#[derive(Debug)]
#[non_exhaustive]
pub(crate) enum RunError {
    /// The provider could not be opened (not built in, or failed).
    Provider(OpenError),
    /// Anything else (handshake, transfer, timeout).
    Run(anyhow::Error),
}

/// Print a client-side report; the exit code says whether the data arrived intact.
fn print_report(cmd: &str, result: Result<Report, RunError>, json: bool) -> ExitCode {
    match result {
        Ok(report) => {
            if json {
                println!("{}", report.to_json());
            } else {
                print!("{report}");
            }
            if report.ok {
                ExitCode::SUCCESS
            } else {
                eprintln!("qr {cmd}: sha256 mismatch: the data did not arrive intact");
                ExitCode::FAILURE
            }
        }
        Err(RunError::Provider(e @ (OpenError::NotBuiltIn(_) | OpenError::Unsupported(_)))) => {
            eprintln!("qr {cmd}: {e}");
            ExitCode::from(2)
        }
        Err(RunError::Provider(e)) => {
            // With its causes: the OS error under a fabric step.
            eprintln!("qr {cmd}: provider failed: {:#}", anyhow::Error::from(e));
            ExitCode::FAILURE
        }
        Err(RunError::Run(e)) => {
            eprintln!("qr {cmd}: {e:#}");
            ExitCode::FAILURE
        }
    }
}
