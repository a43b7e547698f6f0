//! An echo server and client on quinn, over RDMA UD instead of UDP.
//!
//! Compared with a quinn-over-UDP echo, only `rdma_endpoint` is new: the
//! socket comes from a UD queue pair, the endpoint config gets the fabric MTU.
//! Everything after it — `connect`, `accept`, streams — is quinn's own API.
//!
//! Run: `cargo run --release -p quic-rdma --example echo -- [message]`
//! (server and client share the in-process `sim` fabric, so they run in one process).

use std::net::Ipv6Addr;
use std::sync::Arc;

use quic_rdma::fabric::sim::{SimConfig, SimFabric, SimQpOptions};
use quic_rdma::fabric::UdQueuePair;
use quic_rdma::quinn_adapter::{self, RdmaUdpSocket};
use quic_rdma::socket::{SocketConfig, UdSocket};

/// The drop-in: a quinn endpoint over a UD queue pair.
fn rdma_endpoint(
    qp: Box<dyn UdQueuePair>,
    server: Option<quinn::ServerConfig>,
) -> Result<(quinn::Endpoint, Arc<RdmaUdpSocket>), Box<dyn std::error::Error>> {
    let socket = Arc::new(RdmaUdpSocket::new(UdSocket::new(
        qp,
        SocketConfig::default(),
    )?));
    let mtu = socket.mtu();
    let endpoint = quinn::Endpoint::new_with_abstract_socket(
        quinn_adapter::FabricConfig::new(mtu)
            .routing_key(rand_key())
            .endpoint_config(),
        server,
        socket.clone(),
        Arc::new(quinn::TokioRuntime),
    )?;
    Ok((endpoint, socket))
}

fn rand_key() -> u32 {
    std::process::id() & 0xF_FFFF
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let message = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "hello over RDMA UD".into());
    let fabric = SimFabric::new(SimConfig::default());
    let server_qp = fabric.create_qp(
        Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1).into(),
        SimQpOptions::default(),
    )?;
    let client_qp = fabric.create_qp(
        Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2).into(),
        SimQpOptions::default(),
    )?;
    let server_ud = quic_rdma::fabric::UdAddr::new(
        server_qp.attr().gid,
        server_qp.attr().qpn,
        server_qp.attr().qkey,
    );

    // TLS 1.3 with a self-signed certificate the client is told to trust.
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()])?;
    let cert = ck.cert.der().clone();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(ck.key_pair.serialize_der().into());
    let mut server_cfg = quinn::ServerConfig::with_single_cert(vec![cert.clone()], key)?;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert)?;
    let mut client_cfg = quinn::ClientConfig::with_root_certificates(Arc::new(roots))?;

    let (server, server_sock) = rdma_endpoint(Box::new(server_qp), None)?;
    let mtu = server_sock.mtu();
    server_cfg.transport_config(quinn_adapter::FabricConfig::new(mtu).transport());
    client_cfg.transport_config(quinn_adapter::FabricConfig::new(mtu).transport());
    server.set_server_config(Some(server_cfg));
    let (client, client_sock) = rdma_endpoint(Box::new(client_qp), None)?;
    // The address quinn knows the server by.
    let server_addr = client_sock.peer_addr(server_ud);

    // Echo server: every bidirectional stream gets its bytes back.
    let srv = tokio::spawn(async move {
        let conn = server.accept().await.expect("incoming").await?;
        let (mut tx, mut rx) = conn.accept_bi().await?;
        let data = rx.read_to_end(1 << 20).await?;
        tx.write_all(&data).await?;
        tx.finish()?;
        conn.closed().await;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
    });

    // Client.
    let conn = client
        .connect_with(client_cfg, server_addr, "localhost")?
        .await?;
    let (mut tx, mut rx) = conn.open_bi().await?;
    tx.write_all(message.as_bytes()).await?;
    tx.finish()?;
    let echoed = rx.read_to_end(1 << 20).await?;
    println!(
        "echoed {:?} over {} (MTU {})",
        String::from_utf8_lossy(&echoed),
        conn.remote_address(),
        conn.stats().path.current_mtu
    );
    assert_eq!(echoed, message.as_bytes());
    conn.close(0u32.into(), b"done");
    srv.await?.map_err(|e| e.to_string())?;
    client.wait_idle().await;
    Ok(())
}
