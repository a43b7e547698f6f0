//! An HTTP/3 server (the unmodified `h3` + `h3-quinn` crates) on a quinn endpoint
//! over the `soft` provider: real RoCEv2 packets on UDP, one process.
//!
//! Run: `cargo run --release -p quic-rdma --example h3_server -- <ip> <cert.der>`
//!
//! - binds a `soft` port on `<ip>` (UDP 4791; the IP is the port's GID) and writes
//!   its self-signed certificate for "localhost" (DER) to `<cert.der>`;
//! - serves `GET /bytes/<n>` (n bytes of deterministic data, see `h3_common`);
//! - prints `READY ip=<ip> qpn=<qpn> qkey=<qkey>` once listening;
//! - exits on stdin EOF (a test dying takes the server with it).
//!
//! Compared with the same server on UDP, two lines differ: the endpoint is made
//! with `new_with_abstract_socket` over an `RdmaUdpSocket`, and the transport
//! config is `quinn_adapter::FabricConfig::new(mtu).transport()` (see the README).

mod h3_common;

use std::io::BufRead;
use std::net::IpAddr;
use std::sync::Arc;

use h3_common::Error;
use quic_rdma::fabric::UdAddr;
use quic_rdma::{
    fabric::{soft::*, DEFAULT_QKEY},
    quinn_adapter::{self as qa, RdmaUdpSocket},
    socket::*,
};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: h3_server <ip> <cert.der>";
    let ip: IpAddr = args.next().ok_or(usage)?.parse()?;
    let cert_path = args.next().ok_or(usage)?;

    // What a UDP server has: a server config (TLS, ALPN h3) with default transport.
    let (cert, mut server_config) = h3_common::server_config(Default::default())?;
    std::fs::write(&cert_path, &cert)?;
    // The fabric: these four lines replace
    // `let endpoint = quinn::Endpoint::server(server_config, addr)?;` (README, "Moving a quinn or h3 application").
    let sock = Arc::new(RdmaUdpSocket::new(UdSocket::new(
        SoftPort::open(SoftConfig::new(ip))?.create_qp(DEFAULT_QKEY)?,
        SocketConfig::default(),
    )?));
    let fabric = qa::FabricConfig::of(&sock);
    server_config.transport_config(fabric.transport());
    let endpoint = fabric.endpoint(sock.clone(), Some(server_config))?;
    let UdAddr { qpn, qkey, .. } = sock.ud_addr();
    tokio::spawn(h3_common::serve(endpoint.clone()));
    println!("READY ip={ip} qpn={qpn} qkey={qkey}");

    // stdin EOF ends the server.
    tokio::task::spawn_blocking(
        || for _ in std::io::stdin().lock().lines().map_while(Result::ok) {},
    )
    .await?;
    endpoint.close(h3_common::H3_NO_ERROR.into(), b"server exiting");
    Ok(())
}
