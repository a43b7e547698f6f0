//! QUIC over the `verbs` provider: quinn client and server, each on its own UD QP
//! of the same device (kernel rxe on `lo` in the qemu guest of
//! `interop/rxe/run-tests.sh`): handshake, then a 64 MiB transfer whose sha256 the
//! server echoes back. Wake-ups come from the completion channel through
//! `VerbsNotifier::spawn` (no polling loop).
//!
//! Without an RDMA device this skips, unless `QR_REQUIRE_RDMA=1` (set in the guest).
//! `QR_TRANSFER_MIB` changes the transfer size (default 64).
#![cfg(feature = "verbs")]

mod common;

use std::sync::Arc;
use std::time::Instant;

use common::endpoint;
use quic_rdma::fabric::verbs::{VerbsOptions, VerbsQp};
use quic_rdma::fabric::FabricError;
use quic_rdma::quinn_adapter::RdmaUdpSocket;
use quic_rdma::socket::{SocketConfig, UdSocket};

fn open() -> Option<VerbsQp> {
    match VerbsQp::open(&VerbsOptions::default()) {
        Ok(qp) => Some(qp),
        Err(e @ FabricError::NoDevice { .. }) if std::env::var("QR_REQUIRE_RDMA").is_err() => {
            eprintln!("skipped: {e}");
            None
        }
        Err(e) => panic!("opening the verbs QP failed: {e}"),
    }
}

fn socket(qp: VerbsQp) -> Arc<RdmaUdpSocket<VerbsQp>> {
    // No notifier task: the adapter watches the QP's readiness descriptor
    // (its completion channel) like any provider's.
    Arc::new(RdmaUdpSocket::new(
        UdSocket::new(qp, SocketConfig::default()).unwrap(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quic_handshake_and_64mib_transfer_verbs_to_verbs() {
    let Some(qs) = open() else { return };
    let qc = open().unwrap();
    let server_sock = socket(qs);
    let client_sock = socket(qc);
    let mtu = server_sock.mtu();
    eprintln!(
        "server {:?} client {:?} mtu {mtu}",
        server_sock.ud_addr(),
        client_sock.ud_addr()
    );
    assert_eq!(mtu, 4096, "rxe on lo: active MTU 4096");
    let certs = common::certs(mtu);
    let server = endpoint(&server_sock, Some(certs.server), 0x5e);
    let client = endpoint(&client_sock, None, 0xc1);
    let t0 = Instant::now();
    let connecting = client
        .connect_with(
            certs.client,
            client_sock.peer_addr(server_sock.ud_addr()),
            "localhost",
        )
        .unwrap();
    let srv = server.clone();
    let accept = tokio::spawn(async move { srv.accept().await.unwrap().await.unwrap() });
    let c = connecting.await.unwrap();
    let s = accept.await.unwrap();
    eprintln!("handshake in {:?}", t0.elapsed());

    let mib: u64 = std::env::var("QR_TRANSFER_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    let t1 = Instant::now();
    common::transfer(&c, &s, mib << 20, 0x7e57).await;
    let dt = t1.elapsed();
    eprintln!(
        "{mib} MiB in {dt:?} = {:.1} Mbit/s; sha256 equal",
        (mib << 20) as f64 * 8.0 / dt.as_secs_f64() / 1e6
    );
    eprintln!("client stats: {:?}", client_sock.stats());
    eprintln!("server stats: {:?}", server_sock.stats());
    c.close(0u32.into(), b"done");
    client.wait_idle().await;
}
