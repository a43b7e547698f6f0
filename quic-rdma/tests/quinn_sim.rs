//! quinn client/server over the `sim` fabric: handshake and verified transfers.

mod common;

use std::time::Instant;

use common::{gid, transfer, Pair};
use quic_rdma::fabric::sim::{Faults, SimConfig};
use quic_rdma::socket::SocketConfig;

fn cfg(faults: Faults, seed: u64) -> SimConfig {
    SimConfig {
        faults,
        seed,
        ..SimConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshake_and_mtu_4096() {
    let p = Pair::new(SimConfig::default());
    let (c, s) = p.connect().await;
    transfer(&c, &s, 1 << 20, 1).await;
    // The path MTU quinn uses is the fabric's (no 1472 cap).
    assert_eq!(c.stats().path.current_mtu, 4096);
    assert_eq!(s.stats().path.current_mtu, 4096);
    let st = p.client_sock.stats();
    assert!(st.sent_wrs > 0 && st.recv_packets > 0);
}

async fn big_transfer(faults: Faults, seed: u64) {
    let p = Pair::new(cfg(faults, seed));
    let (c, s) = p.connect().await;
    let t = Instant::now();
    transfer(&c, &s, 256 << 20, seed).await;
    let fs = p.fabric.stats();
    eprintln!(
        "256 MiB in {:?}; fabric {:?}; client {:?}",
        t.elapsed(),
        fs,
        p.client_sock.stats()
    );
    assert_eq!(c.stats().path.current_mtu, 4096);
    // The receiver's packets are mostly ACKs: small, so sent inline.
    let srv = p.server_sock.stats();
    assert!(
        srv.inline_sends > 0 && srv.inline_sends * 2 >= srv.sent_wrs,
        "{srv:?}"
    );
    assert_eq!(p.fabric.stats().ah_destroy_in_use, 0);
    if faults.loss > 0.0 {
        assert!(fs.lost > 0, "loss was injected");
        assert!(
            c.stats().path.lost_packets > 0,
            "quinn saw and recovered losses"
        );
    }
    if faults.duplicate > 0.0 {
        assert!(fs.duplicated > 0 && fs.reordered > 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfer_256mib_no_loss() {
    big_transfer(Faults::default(), 11).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfer_256mib_1pct_loss_dup_reorder() {
    big_transfer(Faults::hostile(0.01), 12).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfer_256mib_5pct_loss_dup_reorder() {
    big_transfer(Faults::hostile(0.05), 13).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv4_gids_over_the_ipv4_grh_layout() {
    let p = Pair::with(
        SimConfig::default(),
        true,
        SocketConfig::default(),
        SocketConfig::default(),
    );
    let (c, s) = p.connect().await;
    transfer(&c, &s, 16 << 20, 21).await;
    let seen = p.server_sock.ud_addr_of(s.remote_address()).unwrap();
    assert_eq!(seen.gid, gid(2, true));
    assert!(seen.gid.is_ipv4());
    assert_eq!(p.server_sock.stats().drop_bad_grh, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_gid_change_mid_transfer_migrates() {
    let p = Pair::new(SimConfig::default());
    let (c, s) = p.connect().await;
    let (c2, s2) = (c.clone(), s.clone());
    let xfer = tokio::spawn(async move { transfer(&c2, &s2, 128 << 20, 31).await });
    // Move the client once the transfer is well under way.
    while p.client_sock.stats().sent_bytes < 16 << 20 {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    let new_gid = gid(42, false);
    p.client_qp.set_gid(new_gid);
    xfer.await.unwrap();
    // The server now talks to the new address...
    let seen = p.server_sock.ud_addr_of(s.remote_address()).unwrap();
    assert_eq!(seen.gid, new_gid);
    let srv = p.server_sock.stats();
    let cli = p.client_sock.stats();
    // ...through the AH of the new GID; the client rebuilt every AH for its new
    // source GID, destroying each old one only after its sends completed.
    assert!(srv.ah_created >= 2, "{srv:?}");
    assert_eq!(cli.gid_changes, 1);
    assert!(cli.ah_rebuilt >= 1, "{cli:?}");
    // Keep the connection busy until the retired AHs' last sends are retired.
    transfer(&c, &s, 4 << 20, 32).await;
    let cli = p.client_sock.stats();
    assert!(cli.ah_destroyed >= 1, "{cli:?}");
    assert_eq!(
        p.fabric.stats().ah_destroy_in_use,
        0,
        "no AH destroyed under an in-flight send"
    );
    assert_eq!(c.stats().path.current_mtu, 4096);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_queue_pair_recovers_mid_transfer() {
    let p = Pair::new(SimConfig::default());
    let (c, s) = p.connect().await;
    let before = p.client_sock.ud_addr();
    let (c2, s2) = (c.clone(), s.clone());
    let xfer = tokio::spawn(async move { transfer(&c2, &s2, 64 << 20, 41).await });
    while p.client_sock.stats().sent_bytes < 16 << 20 {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    // The QP enters the error state as on a fatal hardware error; the socket
    // recovers it with its QPN and quinn retransmits what was lost.
    p.client_qp.fail();
    xfer.await.unwrap();
    let cli = p.client_sock.stats();
    assert_eq!(cli.qp_recoveries, 1, "{cli:?}");
    assert_eq!(p.client_sock.ud_addr(), before, "recovery keeps the QPN");
    // The server still reaches the client at the same UD address.
    assert_eq!(p.server_sock.ud_addr_of(s.remote_address()), Some(before));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receive_queue_starvation_is_counted_and_quic_recovers() {
    let faults = Faults {
        starve: 0.002,
        ..Faults::default()
    };
    let shallow = SocketConfig {
        recv_depth: 48,
        repost_batch: 16,
        ..SocketConfig::default()
    };
    let p = Pair::with(cfg(faults, 41), false, SocketConfig::default(), shallow);
    let (c, s) = p.connect().await;
    transfer(&c, &s, 32 << 20, 41).await;
    let d = p.server_sock.stats().provider;
    assert!(d.no_recv_posted > 0, "{d:?}");
    assert!(c.stats().path.lost_packets > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ecn_marks_from_the_fabric_reach_quic_congestion_control() {
    // No loss at all: every congestion event quinn reports comes from CE marks the
    // fabric set in the GRH traffic class, carried up through RecvMeta.ecn.
    let faults = Faults {
        ecn_ce: 0.01,
        ..Faults::default()
    };
    let p = Pair::new(cfg(faults, 51));
    let (c, s) = p.connect().await;
    transfer(&c, &s, 32 << 20, 51).await;
    assert!(p.fabric.stats().ce_marked > 0);
    assert_eq!(p.fabric.stats().lost, 0);
    assert!(c.stats().path.congestion_events > 0, "{:?}", c.stats().path);
    assert_eq!(c.stats().path.lost_packets, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_retry_validates_the_client_address() {
    // quinn-proto's Retry token keeps only IP and port of the client's address:
    // the adapter's peer addresses must survive that round trip.
    let p = Pair::new(SimConfig::default());
    let connecting = p
        .client
        .connect_with(p.client_cfg.clone(), p.server_addr, "localhost")
        .unwrap();
    let server = p.server.clone();
    let accept = tokio::spawn(async move {
        let first = server.accept().await.unwrap();
        assert!(!first.remote_address_validated());
        first.retry().unwrap();
        let second = server.accept().await.unwrap();
        assert!(
            second.remote_address_validated(),
            "the Retry token validated"
        );
        second.await.unwrap()
    });
    let c = connecting.await.unwrap();
    let s = accept.await.unwrap();
    transfer(&c, &s, 1 << 20, 71).await;
}

/// With the receive spin on (`with_idle_spin`), both sides poll instead of
/// sleeping between packets, and a transfer still arrives whole (sha256) and
/// an idle endpoint still wakes for the next connection's packets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spinning_receivers_transfer_and_wake_after_idling() {
    use std::sync::Arc;
    use std::time::Duration;

    use quic_rdma::fabric::sim::{SimFabric, SimQpOptions};
    use quic_rdma::quinn_adapter::RdmaUdpSocket;
    use quic_rdma::socket::UdSocket;

    let fabric = SimFabric::new(SimConfig::default());
    let sock = |n: u8| {
        let qp = fabric
            .create_qp(gid(n, false), SimQpOptions::default())
            .unwrap();
        Arc::new(
            RdmaUdpSocket::new(UdSocket::new(qp, SocketConfig::default()).unwrap())
                .with_idle_spin(Duration::from_micros(200)),
        )
    };
    let (ss, cs) = (sock(31), sock(32));
    let certs = common::certs(ss.mtu());
    let server = common::endpoint(&ss, Some(certs.server), 0x31);
    let client = common::endpoint(&cs, None, 0x32);
    let addr = cs.peer_addr(ss.ud_addr());
    for round in 0..2u64 {
        let connecting = client
            .connect_with(certs.client.clone(), addr, "localhost")
            .unwrap();
        let srv = server.clone();
        let accept = tokio::spawn(async move { srv.accept().await.unwrap().await.unwrap() });
        let c = connecting.await.unwrap();
        let s = accept.await.unwrap();
        transfer(&c, &s, 16 << 20, 40 + round).await;
        c.close(0u32.into(), b"done");
        // Long past the spin window: both sides are asleep when the next
        // handshake's first packet must wake them.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(ss.stats().recv_packets > 8192 && cs.stats().recv_packets > 0);
}
