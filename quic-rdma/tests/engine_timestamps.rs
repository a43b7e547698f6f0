//! Completion time stamps through the engine on `sim`, in virtual time:
//! a datagram carries its packet's arrival stamp even when the receiver polls
//! seconds later; stamps are off by default.

mod engine_common;

use std::time::{Duration, Instant};

use engine_common::{configs, EnginePair};
use quic_rdma::engine::AcceptPolicy;
use quic_rdma::engine::{EngineError, Event};
use quic_rdma::fabric::sim::{Faults, SimConfig, SimFabric};
use quic_rdma::fabric::{StampClock, Timestamp};

const WIRE_DELAY: Duration = Duration::from_millis(2);

fn delayed() -> SimConfig {
    SimConfig {
        faults: Faults {
            delay: WIRE_DELAY,
            ..Faults::default()
        },
        ..SimConfig::default()
    }
}

#[test]
fn off_by_default() {
    let mut p = EnginePair::new(delayed());
    let (c, s) = p.connect();
    p.client.send_datagram(c, b"x").unwrap();
    p.run_until(|p| p.sev.contains(&Event::Datagram { conn: s }));
    assert_eq!(p.server.datagram_timestamp(s).unwrap(), None);
    assert_eq!(p.server.rx_timestamp(s).unwrap(), None);
    assert_eq!(p.client.send_timestamp(), None);
}

#[test]
fn starved_receiver_sees_each_datagrams_arrival_time() {
    // Every client send signaled, so its latest send's stamp is reaped.
    let mtu = quic_rdma::socket::segment::datagram_mtu(delayed().mtu.bytes());
    let (mut ccfg, scfg) = configs(mtu, AcceptPolicy::AcceptAll);
    ccfg.socket.signal_every = 1;
    let fabric = SimFabric::manual(delayed(), Instant::now());
    let mut p = EnginePair::from_configs(fabric, ccfg, scfg);
    let (c, s) = p.connect();
    assert_eq!(p.client.enable_timestamps().unwrap(), StampClock::SimFabric);
    assert_eq!(p.server.enable_timestamps().unwrap(), StampClock::SimFabric);
    assert!(matches!(
        p.server.datagram_timestamp(s),
        Err(EngineError::WouldBlock)
    ));

    // The client sends one datagram at t and another at t + 1 s; the server
    // does not poll until t + 3 s (starved), then polls once.
    let t = p.now();
    let mut ev = Vec::new();
    p.client.send_datagram(c, b"first").unwrap();
    p.client.poll(t, &mut ev);
    p.fabric.advance(t + WIRE_DELAY);
    let t1 = t + Duration::from_secs(1);
    p.fabric.advance(t1);
    p.client.poll(t1, &mut ev);
    p.client.send_datagram(c, b"second").unwrap();
    p.client.poll(t1, &mut ev);
    p.client.poll(t1, &mut ev); // reaps the datagram's send completion
    p.fabric.advance(t1 + WIRE_DELAY);
    let late = t + Duration::from_secs(3);
    p.fabric.advance(late);
    ev.clear();
    p.server.poll(late, &mut ev);
    assert!(ev.contains(&Event::Datagram { conn: s }), "{ev:?}");

    let stamp = |at| {
        Some(Timestamp {
            at,
            clock: StampClock::SimFabric,
        })
    };
    let mut buf = [0u8; 16];
    assert_eq!(
        p.server.datagram_timestamp(s).unwrap(),
        stamp(t + WIRE_DELAY)
    );
    let n = p.server.recv_datagram(s, &mut buf).unwrap();
    assert_eq!(&buf[..n], b"first");
    assert_eq!(
        p.server.datagram_timestamp(s).unwrap(),
        stamp(t1 + WIRE_DELAY)
    );
    let n = p.server.recv_datagram(s, &mut buf).unwrap();
    assert_eq!(&buf[..n], b"second");
    // The connection's latest packet is the second datagram's.
    assert_eq!(p.server.rx_timestamp(s).unwrap(), stamp(t1 + WIRE_DELAY));
    // The client's latest send left at t1 (on the fabric's clock).
    assert_eq!(p.client.send_timestamp(), stamp(t1));
}
