//! An HTTP/3 client (the unmodified `h3` + `h3-quinn` crates) on a quinn endpoint
//! over the `soft` provider; fetches one URL path from `h3_server` and prints
//! what it got.
//!
//! Run: `cargo run --release -p quic-rdma --example h3_client -- \
//!       <local-ip> <server-ip> <server-qpn> <server-qkey> <cert.der> <path>`
//!
//! Prints `FETCHED status=<code> bytes=<n> sha256=<hex> secs=<s>`; exits 1 on failure.

mod h3_common;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use h3_common::Error;
use quic_rdma::fabric::soft::{SoftConfig, SoftPort};
use quic_rdma::fabric::{Gid, UdAddr, DEFAULT_QKEY};
use quic_rdma::quinn_adapter::{self, RdmaUdpSocket};
use quic_rdma::socket::{SocketConfig, UdSocket};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [ip, server_ip, qpn, qkey, cert, path] = &args[..] else {
        return Err(
            "usage: h3_client <local-ip> <server-ip> <server-qpn> <server-qkey> <cert.der> <path>"
                .into(),
        );
    };
    let ip: IpAddr = ip.parse()?;
    let server = UdAddr::new(
        Gid::from(server_ip.parse::<IpAddr>()?),
        qpn.parse()?,
        qkey.parse()?,
    );
    let cert = rustls::pki_types::CertificateDer::from(std::fs::read(cert)?);

    let port = SoftPort::open(SoftConfig::new(ip))?;
    let qp = port.create_qp(DEFAULT_QKEY)?;
    let sock = Arc::new(RdmaUdpSocket::new(UdSocket::new(
        qp,
        SocketConfig::default(),
    )?));
    let mtu = sock.mtu();
    let server_addr = sock.peer_addr(server);
    let endpoint = quinn::Endpoint::new_with_abstract_socket(
        quinn_adapter::FabricConfig::new(mtu)
            .routing_key(0xc43)
            .endpoint_config(),
        None,
        sock,
        Arc::new(quinn::TokioRuntime),
    )?;
    let cfg = h3_common::client_config(cert, quinn_adapter::FabricConfig::new(mtu).transport())?;
    let t = Instant::now();
    let got = h3_common::fetch(&endpoint, cfg, server_addr, path).await?;
    println!(
        "FETCHED status={} bytes={} sha256={} secs={:.3}",
        got.status,
        got.bytes,
        h3_common::hex(&got.sha256),
        t.elapsed().as_secs_f64()
    );
    endpoint.wait_idle().await;
    Ok(())
}
