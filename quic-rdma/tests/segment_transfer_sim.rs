//! QUIC over a `sim` fabric whose active MTU is below QUIC's 1200-byte
//! minimum (RFC 9000 §14): 1024, RoCE's MTU on 1500-byte Ethernet, where the
//! socket sends each QUIC datagram above the MTU as parts
//! (docs/architecture.md §6, "Segmented datagrams"); and 2048, where nothing
//! is cut. Both drivers, 64 MiB with 1 % loss, sha256 checked end to end by
//! the transfer harnesses. The engine runs in virtual time (one seed, one
//! run); the quinn adapter in real time, as every adapter test.

mod engine_common;

use engine_common::{common, EnginePair};
use quic_rdma::fabric::sim::{Faults, SimConfig};
use quic_rdma::fabric::Mtu;
use quic_rdma::socket::SocketStats;

const LEN: u64 = 64 << 20;

fn cfg(mtu: Mtu, seed: u64) -> SimConfig {
    SimConfig {
        mtu,
        faults: Faults::lossy(0.01),
        seed,
        ..SimConfig::default()
    }
}

/// What segmentation did on one side, given the datagram MTU QUIC ran at.
fn check_segmentation(mtu: Mtu, sender: &SocketStats, receiver: &SocketStats) {
    if mtu.bytes() >= 2048 {
        // Segmentation is only for datagrams above the active MTU, which
        // QUIC never sends here: an unsegmenting peer sees no difference.
        assert_eq!(sender.seg_datagrams_sent, 0);
        assert_eq!(receiver.seg_parts_received, 0);
        return;
    }
    assert!(sender.seg_datagrams_sent > 0, "{sender:?}");
    assert_eq!(
        sender.seg_parts_sent,
        2 * sender.seg_datagrams_sent,
        "2 parts each at 1024"
    );
    assert!(receiver.seg_reassembled > 0);
    // 1 % of parts lost: a datagram that lost one of its two parts is
    // dropped whole and counted, once the timeout passes or a newer one
    // takes its buffer.
    assert!(
        receiver.seg_expired + receiver.seg_evicted > 0,
        "{receiver:?}"
    );
    assert_eq!(receiver.seg_malformed, 0);
}

fn engine_transfer(mtu: Mtu, seed: u64) {
    let mut p = EnginePair::new(cfg(mtu, seed));
    let (c, s) = p.connect();
    engine_common::transfer(&mut p, c, s, LEN, seed, |_, _| {});
    let want = quic_rdma::socket::segment::datagram_mtu(mtu.bytes()) as u16;
    let cs = p.client.conn_stats(c).unwrap();
    assert_eq!(cs.path.current_mtu, want);
    assert!(p.fabric.stats().lost > 0 && cs.path.lost_packets > 0);
    let (tx, rx) = (p.client.socket_stats(), p.server.socket_stats());
    eprintln!("engine at {mtu:?}: client {tx:?}\nserver {rx:?}");
    check_segmentation(mtu, &tx, &rx);
}

#[test]
fn engine_64mib_at_mtu_1024_with_1pct_loss() {
    engine_transfer(Mtu::M1024, 61);
}

#[test]
fn engine_64mib_at_mtu_2048_with_1pct_loss() {
    engine_transfer(Mtu::M2048, 62);
}

async fn adapter_transfer(mtu: Mtu, seed: u64) {
    let p = common::Pair::new(cfg(mtu, seed));
    let (c, s) = p.connect().await;
    common::transfer(&c, &s, LEN, seed).await;
    let want = quic_rdma::socket::segment::datagram_mtu(mtu.bytes()) as u16;
    assert_eq!(c.stats().path.current_mtu, want);
    assert!(p.fabric.stats().lost > 0 && c.stats().path.lost_packets > 0);
    let (tx, rx) = (p.client_sock.stats(), p.server_sock.stats());
    eprintln!("adapter at {mtu:?}: client {tx:?}\nserver {rx:?}");
    check_segmentation(mtu, &tx, &rx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adapter_64mib_at_mtu_1024_with_1pct_loss() {
    adapter_transfer(Mtu::M1024, 63).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adapter_64mib_at_mtu_2048_with_1pct_loss() {
    adapter_transfer(Mtu::M2048, 64).await;
}
