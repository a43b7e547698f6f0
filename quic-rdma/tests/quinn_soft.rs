//! quinn client/server over the `soft` provider (real RoCEv2 packets on UDP
//! loopback, 127.0.0.x addresses each their own GID), in one process; the
//! two-process run is `qr`'s test (tools/tests).

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use common::{certs, endpoint, transfer};
use quic_rdma::fabric::soft::{SoftConfig, SoftPort, SoftQp};
use quic_rdma::fabric::{Mtu, DEFAULT_QKEY};
use quic_rdma::quinn_adapter::RdmaUdpSocket;
use quic_rdma::socket::{SocketConfig, UdSocket};

/// A socket on a `soft` port at `ip`; `mtu` overrides the netdev's (`lo`:
/// 4096) to stand for another link.
fn soft_socket(ip: IpAddr, mtu: Option<Mtu>) -> (Arc<RdmaUdpSocket<SoftQp>>, SoftPort) {
    let mut cfg = SoftConfig::new(ip);
    cfg.mtu = mtu.unwrap_or(cfg.mtu);
    let port = SoftPort::open(cfg).unwrap();
    let qp = port.create_qp(DEFAULT_QKEY).unwrap();
    let sock = UdSocket::new(qp, SocketConfig::default()).unwrap();
    (Arc::new(RdmaUdpSocket::new(sock)), port)
}

async fn soft_transfer(server_ip: IpAddr, client_ip: IpAddr, bytes: u64, mtu: Option<Mtu>) {
    let (ssock, sport) = soft_socket(server_ip, mtu);
    let (csock, cport) = soft_socket(client_ip, mtu);
    let fabric_mtu = sport.active_mtu().bytes();
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
    // QUIC's datagrams: the fabric's MTU, or 2040 in two parts at 1024.
    let quic_mtu = quic_rdma::socket::segment::datagram_mtu(fabric_mtu);
    assert_eq!(usize::from(conn.stats().path.current_mtu), quic_mtu);
    let seen = ssock.ud_addr_of(sconn.remote_address()).unwrap();
    assert_eq!(seen.gid, cport.gid());
    let (ss, cs) = (sport.stats(), cport.stats());
    eprintln!("server {ss:?}\nclient {cs:?}\nsocket {:?}", csock.stats());
    assert!(cs.tx_packets >= bytes / fabric_mtu as u64);
    let (tx, rx) = (csock.stats(), ssock.stats());
    if quic_mtu > fabric_mtu {
        // Every RoCEv2 packet fit the (pretended) link; QUIC's went as parts.
        assert!(tx.seg_datagrams_sent > 0 && rx.seg_reassembled > 0);
        assert_eq!(rx.seg_malformed, 0);
    } else {
        assert_eq!((tx.seg_datagrams_sent, rx.seg_parts_received), (0, 0));
    }
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
        None,
    )
    .await;
}

/// RoCE MTU 1024, what kernel rxe runs at on a 1500-byte Ethernet (set
/// explicitly: `lo` allows 4096): QUIC runs at 2040 bytes, each datagram
/// in two RoCEv2 packets. No loss is injected (real sockets).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quinn_over_soft_at_roce_mtu_1024() {
    soft_transfer(
        Ipv4Addr::new(127, 0, 0, 13).into(),
        Ipv4Addr::new(127, 0, 0, 14).into(),
        64 << 20,
        Some(Mtu::M1024),
    )
    .await;
}

/// RoCE MTU 2048 (a netdev of 2100..4151 bytes): datagrams fit whole, none cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quinn_over_soft_at_roce_mtu_2048() {
    soft_transfer(
        Ipv4Addr::new(127, 0, 0, 15).into(),
        Ipv4Addr::new(127, 0, 0, 16).into(),
        64 << 20,
        Some(Mtu::M2048),
    )
    .await;
}
