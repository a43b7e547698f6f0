//! Liveness of engine connections over `sim`, in virtual time: a dead peer is
//! reported as timed out within the default idle timeout (not quinn's 30 s),
//! keep-alives hold an idle but live connection open, and other timers can be
//! configured. The pair runs on the harness's virtual clock (`EnginePair`:
//! a manual-clock fabric, time jumping to the next timer when nothing
//! moves), and a lone surviving engine is polled at each of its deadlines in
//! turn, so seconds of protocol time pass in milliseconds, nothing sleeps,
//! and the instants measured are the timers' own.

mod engine_common;

use std::time::{Duration, Instant};

use engine_common::{EnginePair, Sink, Source};
use quic_rdma::engine::{CloseReason, ConnHandle, Engine, Event};
use quic_rdma::fabric::sim::{SimConfig, SimQp};
use quic_rdma::quic::{transport_with, Liveness};

/// How long a test waits (virtual) for a close before giving up: past quinn's 30 s default.
const GIVE_UP: Duration = Duration::from_secs(45);

/// Handshake in virtual time: the client's and the server's handle, and the
/// virtual time it ended at.
fn connect(p: &mut EnginePair) -> (ConnHandle, ConnHandle, Instant) {
    assert!(p.is_virtual(), "EnginePair::new runs in virtual time");
    let (c, s) = p.connect();
    (c, s, p.now())
}

/// Poll only `e` (its peer is gone) at each of its deadlines from `*now` on
/// until `conn` is lost; the virtual time it took and the reason. Also checks
/// the drained close follows.
fn wait_lost(
    e: &mut Engine<SimQp>,
    conn: ConnHandle,
    now: &mut Instant,
) -> (Duration, CloseReason) {
    let start = *now;
    let mut ev = Vec::new();
    let mut lost = None;
    while *now - start < GIVE_UP {
        ev.clear();
        e.poll(*now, &mut ev);
        for x in &ev {
            match *x {
                Event::ConnectionLost { conn: h, reason } if h == conn => {
                    // The event carries the whole reason: a timed-out connection
                    // drains at once (RFC 9000 §10.1: silently discarded), so its
                    // ConnectionClosed comes in the same poll.
                    assert!(lost.is_none(), "lost reported twice");
                    lost = Some((*now - start, reason));
                }
                Event::ConnectionClosed { conn: h } if h == conn => {
                    // The full reason is still there for the caller to read
                    // after the poll that freed the connection.
                    let full = e.close_reason(conn).expect("readable until the next poll");
                    assert!(
                        matches!(full, Some(quinn_proto::ConnectionError::TimedOut)),
                        "{full:?}"
                    );
                    return lost.expect("ConnectionClosed comes after ConnectionLost");
                }
                _ => {}
            }
        }
        // Nothing answers: the next thing to happen is the engine's own timer.
        match e.next_deadline() {
            Some(t) => *now = (*now).max(t),
            None => panic!("no timer left and {conn:?} not lost"),
        }
    }
    match lost {
        Some((t, r)) => panic!("lost after {t:?} ({r}) but never drained"),
        None => panic!("no close event within {GIVE_UP:?} of virtual time"),
    }
}

/// A dead peer must be reported within this (the issue: it took quinn's 30 s).
const REPORT_BOUND: Duration = Duration::from_secs(3);

#[test]
fn killed_server_is_reported_timed_out_within_3s() {
    let mut p = EnginePair::new(SimConfig::default());
    let (c, _, _) = connect(&mut p);
    // Let 50 ms of the connection's life pass (acks, the server's
    // HANDSHAKE_DONE), so it is in its steady state.
    let until = p.now() + Duration::from_millis(50);
    while p.now() < until {
        p.step();
    }
    let mut now = p.now();
    // The server process dies: its engine and queue pair vanish without a
    // CONNECTION_CLOSE; the fabric drops what the client sends it.
    let EnginePair {
        mut client, server, ..
    } = p;
    drop(server);
    let (took, reason) = wait_lost(&mut client, c, &mut now);
    eprintln!("client saw {reason} after {took:?} (virtual)");
    assert_eq!(reason, CloseReason::TimedOut);
    assert!(took < REPORT_BOUND, "dead server noticed after {took:?}");
    // It is the idle timer that fired: not before the idle timeout.
    assert!(took >= Liveness::DEFAULT_IDLE_TIMEOUT, "{took:?}");
    assert!(
        client.socket_stats().sent_wrs > 0,
        "the client kept probing while it waited"
    );
}

#[test]
fn killed_client_is_reported_timed_out_within_3s() {
    let mut p = EnginePair::new(SimConfig::default());
    let (_, s, mut now) = connect(&mut p);
    let EnginePair {
        client, mut server, ..
    } = p;
    drop(client);
    let (took, reason) = wait_lost(&mut server, s, &mut now);
    assert_eq!(reason, CloseReason::TimedOut);
    assert!(took < REPORT_BOUND, "dead client noticed after {took:?}");
}

#[test]
fn keep_alive_holds_an_idle_connection_past_the_idle_timeout() {
    let mut p = EnginePair::new(SimConfig::default());
    let (c, s, now) = connect(&mut p);
    let pings_before = p.client.conn_stats(c).unwrap().frame_tx.ping;
    // Idle (no application data) for three idle timeouts.
    let idle_until = now + 3 * Liveness::DEFAULT_IDLE_TIMEOUT;
    while p.now() < idle_until {
        p.step();
        for e in p.cev.iter().chain(&p.sev) {
            assert!(
                !matches!(e, Event::ConnectionLost { .. }),
                "idle connection lost: {e:?}"
            );
        }
    }
    let pings = p.client.conn_stats(c).unwrap().frame_tx.ping - pings_before;
    assert!(pings >= 3, "keep-alive PINGs sent while idle: {pings}");
    // Still usable: 256 KiB client -> server, verified by sha256.
    let stream = p.client.open_bi(c).unwrap();
    let mut src = Source::new(stream, 256 << 10, 7);
    let mut sink: Option<Sink> = None;
    for _ in 0..10_000 {
        src.pump(&mut p.client, c);
        p.step();
        for e in &p.sev {
            if let Event::StreamOpened { stream, .. } = *e {
                sink = Some(Sink::new(stream, false));
            }
        }
        if let Some(k) = &mut sink {
            k.pump(&mut p.server, s);
            if k.fin {
                assert_eq!(k.received, 256 << 10);
                assert_eq!(k.digest(), src.digest(), "sha256 end to end");
                return;
            }
        }
    }
    panic!("transfer after the idle period did not finish");
}

#[test]
fn liveness_is_configurable_through_engine_config() {
    // Slower timers on both sides: the dead peer is noticed at the configured
    // idle timeout, not the default one.
    let idle = Duration::from_secs(6);
    let live = Liveness::new(Some(Duration::from_secs(1)), Some(idle)).unwrap();
    let cfg = SimConfig::default();
    let mtu = cfg.mtu.bytes();
    let (mut ccfg, mut scfg) = engine_common::configs(mtu, Default::default());
    ccfg.set_transport(transport_with(mtu, live));
    scfg.set_transport(transport_with(mtu, live));
    let fabric = quic_rdma::fabric::sim::SimFabric::manual(cfg, Instant::now());
    let mut p = EnginePair::from_configs(fabric, ccfg, scfg);
    let (c, _, mut now) = connect(&mut p);
    let EnginePair {
        mut client, server, ..
    } = p;
    drop(server);
    let (took, reason) = wait_lost(&mut client, c, &mut now);
    assert_eq!(reason, CloseReason::TimedOut);
    assert!(
        took >= idle && took < idle + Duration::from_secs(2),
        "configured 6 s idle timeout fired after {took:?}"
    );
}

#[test]
fn close_reasons_read_clearly() {
    let t = CloseReason::TimedOut.to_string();
    assert!(t.contains("timed out") && t.contains("idle timeout"), "{t}");
    assert_ne!(t, CloseReason::ApplicationClosed { code: 0 }.to_string());
}
