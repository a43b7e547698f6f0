//! `qr cert`: issue development certificates for the channels' mutual TLS.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::pki::{self, LeafSpec};

/// Options of `qr cert`.
#[derive(Clone, Debug, clap::Args)]
pub(crate) struct CertArgs {
    /// Directory of the CA and the certificates (created if missing). A CA
    /// already there (ca.pem, ca-key.pem) is reused, so leaves can be added later.
    #[arg(long)]
    dir: PathBuf,

    /// A certificate to issue: NAME=SAN1,SAN2 (IP addresses or host names the
    /// agent is dialled by; NAME alone is valid for NAME). Repeatable.
    #[arg(long = "leaf", value_parser = clap::value_parser!(LeafSpec))]
    leaves: Vec<LeafSpec>,
}

/// Run `qr cert`: 0 when everything was written, 1 otherwise.
pub(crate) fn main(args: &CertArgs) -> ExitCode {
    match pki::generate_dev_pki(&args.dir, &args.leaves) {
        Ok(()) => {
            let dir = args.dir.display();
            println!("qr cert: CA {dir}/ca.pem (key {dir}/ca-key.pem)");
            for l in &args.leaves {
                println!(
                    "qr cert: {} for {} -> {dir}/{}.pem, {dir}/{}-key.pem",
                    l.name,
                    l.sans.join(", "),
                    l.name,
                    l.name
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            // anyhow prints the source chain, as before the error was typed.
            let e = anyhow::Error::from(e);
            eprintln!("qr cert: {e:#}");
            ExitCode::FAILURE
        }
    }
}
