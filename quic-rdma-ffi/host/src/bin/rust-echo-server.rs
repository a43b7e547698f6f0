//! A QUIC echo server written in Rust on `quic_rdma::engine`, over `soft`,
//! for C clients in other processes (`examples/latency.c --connect`).
//!
//! ```text
//! rust-echo-server GID CERT_OUT
//! ```
//! Writes its self-signed certificate (DER) to CERT_OUT, prints
//! `ready qpn=N qkey=K`, serves until its standard input closes, then prints
//! `served connections=C bytes=B sha256=HEX` (the SHA-256 of what it received).

use std::io::{BufRead, Write};
use std::net::IpAddr;
use std::process::ExitCode;

use quic_rdma::fabric::soft::{SoftConfig, SoftPort};
use quic_rdma::fabric::DEFAULT_QKEY;
use quic_rdma_ffi_host::{EchoServer, SelfSigned};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [gid, cert_out] = args.as_slice() else {
        eprintln!("usage: rust-echo-server GID CERT_OUT");
        return ExitCode::from(2);
    };
    match serve(gid, cert_out) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rust-echo-server: {e}");
            ExitCode::FAILURE
        }
    }
}

fn serve(gid: &str, cert_out: &str) -> Result<(), Box<dyn std::error::Error>> {
    let ip: IpAddr = gid
        .parse()
        .map_err(|e| format!("GID {gid:?} is not an IP address: {e}"))?;
    let tls = SelfSigned::localhost();
    std::fs::write(cert_out, tls.cert_der()).map_err(|e| format!("{cert_out}: {e}"))?;
    let qp = SoftPort::open(SoftConfig::new(ip))?.create_qp(DEFAULT_QKEY)?;
    let server = EchoServer::spawn(qp, &tls)?;
    let addr = server.addr();
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready qpn={} qkey={}", addr.qpn, addr.qkey)?;
    out.flush()?;
    // Serve until the parent closes our standard input.
    for line in std::io::stdin().lock().lines() {
        line?;
    }
    let r = server.stop();
    let hex: String = r.sha256.iter().map(|b| format!("{b:02x}")).collect();
    writeln!(
        out,
        "served connections={} bytes={} sha256={hex}",
        r.connections, r.bytes
    )?;
    Ok(())
}
