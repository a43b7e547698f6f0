//! quinn client/server over the `soft` provider (real RoCEv2 packets on UDP
//! loopback, 127.0.0.x addresses each their own GID), in one process; the
//! two-process run is `qr`'s test (tools/tests).

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use common::{certs, endpoint, transfer};
use quic_rdma::fabric::soft::{SoftConfig, SoftPort, SoftQp};
use quic_rdma::fabric::DEFAULT_QKEY;
use quic_rdma::quinn_adapter::RdmaUdpSocket;
use quic_rdma::socket::{SocketConfig, UdSocket};

fn soft_socket(ip: IpAddr) -> (Arc<RdmaUdpSocket<SoftQp>>, SoftPort) {
    let port = SoftPort::open(SoftConfig::new(ip)).unwrap();
    let qp = port.create_qp(DEFAULT_QKEY).unwrap();
    let sock = UdSocket::new(qp, SocketConfig::default()).unwrap();
    (Arc::new(RdmaUdpSocket::new(sock)), port)
}

async fn soft_transfer(server_ip: IpAddr, client_ip: IpAddr, bytes: u64) {
    let (ssock, sport) = soft_socket(server_ip);
    let (csock, cport) = soft_socket(client_ip);
    let c = certs(ssock.mtu());
    let server = endpoint(&ssock, Some(c.server), 0x50f);
    let client = endpoint(&csock, None, 0xc11);
    let addr = csock.peer_addr(ssock.ud_addr());
    let srv = server.clone();
    let accept = tokio::spawn(async move { srv.accept().await.unwrap().await.unwrap() });
    let conn = client
        .connect_with(c.client, addr, "localhost")
        .unwrap()
        .await
        .unwrap();
    let sconn = accept.await.unwrap();
    transfer(&conn, &sconn, bytes, 61).await;
    assert_eq!(conn.stats().path.current_mtu, 4096);
    let seen = ssock.ud_addr_of(sconn.remote_address()).unwrap();
    assert_eq!(seen.gid, cport.gid());
    let (ss, cs) = (sport.stats(), cport.stats());
    eprintln!("server {ss:?}\nclient {cs:?}\nsocket {:?}", csock.stats());
    assert!(cs.tx_packets >= bytes / 4096);
    assert_eq!(ss.rx_bad_icrc + ss.rx_decode_errors, 0);
    assert_eq!(ssock.routing_stats().imm_mismatch, 0);
    assert_eq!(
        ssock.routing_stats().without_imm,
        0,
        "our own sender always sets it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quinn_over_soft_ipv4_loopback() {
    soft_transfer(
        Ipv4Addr::new(127, 0, 0, 11).into(),
        Ipv4Addr::new(127, 0, 0, 12).into(),
        64 << 20,
    )
    .await;
}
