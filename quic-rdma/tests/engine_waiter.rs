//! The spin-then-sleep driver (`engine::Waiter`) on real providers: an idle
//! connected engine sleeps instead of spinning, and a request that arrives
//! while its peer sleeps wakes it (nothing is lost between the last poll and
//! the sleep) — over `sim` (woken through the waker) and `soft` (through the
//! UDP socket's descriptor). Real time and threads: each side polls on its own
//! thread, as a caller of the engine would. Transfers are sha256-verified.
//!
//! Addresses: `soft` endpoints on 127.141.0.1 to 127.141.0.4.

mod engine_common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use engine_common::{configs, fill_chunk};
use quic_rdma::engine::{
    AcceptPolicy, ConnHandle, Engine, EngineError, Event, IdleConfig, Wait, WaitStats, Waiter,
};
use quic_rdma::fabric::sim::{SimConfig, SimFabric, SimQpOptions};
use quic_rdma::fabric::soft::{SoftConfig, SoftPort};
use quic_rdma::fabric::{UdQueuePair, DEFAULT_QKEY};
use sha2::{Digest, Sha256};

/// Past this, a side gives up (a hang guard, not a timing check).
const GUARD: Duration = Duration::from_secs(60);
/// How long the connected client stays idle before it sends.
const IDLE: Duration = Duration::from_millis(400);
const LEN: u64 = 8 << 20;

struct Outcome {
    client: WaitStats,
    server: WaitStats,
    /// What the client's waiter did during the idle period.
    idle: WaitStats,
}

fn sub(a: WaitStats, b: WaitStats) -> WaitStats {
    WaitStats {
        spins: a.spins - b.spins,
        sleeps: a.sleeps - b.sleeps,
        woken: a.woken - b.woken,
        timeouts: a.timeouts - b.timeouts,
        armed_busy: a.armed_busy - b.armed_busy,
        slept: a.slept - b.slept,
    }
}

/// Connect, idle, send `LEN` bytes; the server answers with the sha256 it
/// computed, which the client checks against its own.
fn run<Q: UdQueuePair + Send>(client: Engine<Q>, server: Engine<Q>) -> Outcome {
    let done = AtomicBool::new(false);
    let server_addr = server.local_addr();
    std::thread::scope(|s| {
        let srv = s.spawn(|| serve(server, &done));
        let cli = client_side(client, server_addr);
        done.store(true, Ordering::Release);
        let server = srv.join().unwrap();
        let (client, idle) = cli;
        Outcome {
            client,
            server,
            idle,
        }
    })
}

fn client_side<Q: UdQueuePair>(
    mut e: Engine<Q>,
    server: quic_rdma::fabric::UdAddr,
) -> (WaitStats, WaitStats) {
    let guard = Instant::now() + GUARD;
    let mut w = Waiter::new(IdleConfig::default()).unwrap();
    let mut ev = Vec::new();
    let c = e.connect(Instant::now(), server, "localhost").unwrap();
    while !ev.contains(&Event::Connected { conn: c }) {
        ev.clear();
        w.poll(&mut e, &mut ev, Some(guard));
        assert!(Instant::now() < guard, "no handshake");
    }
    // Idle, connected: the waiter should sleep through most of it.
    let before = w.stats();
    let until = Instant::now() + IDLE;
    while Instant::now() < until {
        ev.clear();
        w.poll(&mut e, &mut ev, Some(until));
        assert!(!ev.iter().any(|x| matches!(x, Event::ConnectionLost { .. })));
    }
    let idle = sub(w.stats(), before);
    // Send, sleeping whenever flow control or the fabric holds us back.
    let s = e.open_bi(c).unwrap();
    let mut chunk = vec![0u8; 64 << 10];
    let mut hash = Sha256::new();
    let (mut sent, mut i, mut off, mut filled) = (0u64, 0u64, 0usize, 0usize);
    let mut reply = Vec::new();
    let mut buf = [0u8; 64];
    let mut fin = false;
    while !fin {
        while sent < LEN {
            if off == filled {
                filled = (LEN - sent).min(chunk.len() as u64) as usize;
                fill_chunk(&mut chunk[..filled], 7, i);
                hash.update(&chunk[..filled]);
                i += 1;
                off = 0;
            }
            match e.write(c, s, &chunk[off..filled]) {
                Ok(n) => {
                    off += n;
                    sent += n as u64;
                }
                Err(EngineError::WouldBlock) => break,
                Err(err) => panic!("write: {err}"),
            }
            if sent == LEN {
                e.finish(c, s).unwrap();
            }
        }
        loop {
            match e.read(c, s, &mut buf) {
                Ok(r) => {
                    reply.extend_from_slice(&buf[..r.len]);
                    if r.fin {
                        fin = true;
                        break;
                    }
                }
                Err(EngineError::WouldBlock) => break,
                Err(err) => panic!("read: {err}"),
            }
        }
        ev.clear();
        w.poll(&mut e, &mut ev, Some(guard));
        assert!(Instant::now() < guard, "transfer did not finish");
    }
    let want: [u8; 32] = hash.finalize().into();
    assert_eq!(reply, want, "the server's sha256 of what arrived");
    e.close(Instant::now(), c, 0, b"done").unwrap();
    let until = Instant::now() + Duration::from_secs(2);
    while e.connection_count() > 0 && Instant::now() < until {
        ev.clear();
        w.poll(&mut e, &mut ev, Some(until));
    }
    (w.stats(), idle)
}

fn serve<Q: UdQueuePair>(mut e: Engine<Q>, done: &AtomicBool) -> WaitStats {
    let guard = Instant::now() + GUARD;
    let mut w = Waiter::new(IdleConfig::default()).unwrap();
    let mut ev = Vec::new();
    let mut conn: Option<ConnHandle> = None;
    let mut stream = None;
    let mut hash = Sha256::new();
    let mut got = 0u64;
    let mut buf = vec![0u8; 64 << 10];
    let mut answered = false;
    while !done.load(Ordering::Acquire) && Instant::now() < guard {
        ev.clear();
        // Bounded sleeps, so the end of the test is noticed.
        w.poll(
            &mut e,
            &mut ev,
            Some(Instant::now() + Duration::from_millis(50)),
        );
        for x in &ev {
            match *x {
                Event::Connected { conn: c } => conn = Some(c),
                Event::StreamOpened { stream: s, .. } => stream = Some(s),
                _ => {}
            }
        }
        let (Some(c), Some(s)) = (conn, stream) else {
            continue;
        };
        while !answered {
            match e.read(c, s, &mut buf) {
                Ok(r) => {
                    hash.update(&buf[..r.len]);
                    got += r.len as u64;
                    if r.fin {
                        assert_eq!(got, LEN);
                        let d: [u8; 32] = hash.clone().finalize().into();
                        assert_eq!(e.write(c, s, &d).unwrap(), 32);
                        e.finish(c, s).unwrap();
                        answered = true;
                    }
                }
                Err(EngineError::WouldBlock) => break,
                Err(err) => panic!("server read: {err}"),
            }
        }
    }
    assert!(answered, "the server never saw the whole stream");
    w.stats()
}

/// What every provider must show: the idle client slept (most of the idle
/// time, not spinning through it), and both sides slept and were woken
/// during the exchange — a wake-up lost between arm and sleep would have
/// stalled the transfer until the guard.
fn check(o: &Outcome) {
    assert!(o.idle.sleeps >= 1, "idle client never slept: {:?}", o.idle);
    assert!(
        o.idle.slept >= IDLE / 2,
        "idle client slept only {:?} of {IDLE:?}: {:?}",
        o.idle.slept,
        o.idle
    );
    assert!(
        o.server.sleeps >= 1 && o.server.woken >= 1,
        "{:?}",
        o.server
    );
    assert!(o.client.woken >= 1, "{:?}", o.client);
}

#[test]
fn sim_idle_engine_sleeps_and_wakes_for_a_transfer() {
    let fabric = SimFabric::new(SimConfig::default());
    let (ccfg, scfg) = configs(4096, AcceptPolicy::AcceptAll);
    let gid = |k| std::net::Ipv6Addr::new(0xfd00, 0, 0, 0x41, 0, 0, 0, k).into();
    let sqp = fabric.create_qp(gid(1), SimQpOptions::default()).unwrap();
    let cqp = fabric.create_qp(gid(2), SimQpOptions::default()).unwrap();
    let o = run(
        Engine::new(cqp, ccfg).unwrap(),
        Engine::new(sqp, scfg).unwrap(),
    );
    check(&o);
}

#[test]
fn soft_idle_engine_sleeps_and_wakes_for_a_transfer() {
    let port = |ip: &str| SoftPort::open(SoftConfig::new(ip.parse().unwrap())).unwrap();
    let (ps, pc) = (port("127.141.0.1"), port("127.141.0.2"));
    let mtu = ps.active_mtu().bytes();
    let (ccfg, scfg) = configs(mtu, AcceptPolicy::AcceptAll);
    let sqp = ps.create_qp(DEFAULT_QKEY).unwrap();
    let cqp = pc.create_qp(DEFAULT_QKEY).unwrap();
    let server = Engine::new(sqp, scfg).unwrap();
    assert!(
        server.readiness_fd().is_some(),
        "soft sleeps on its descriptor"
    );
    let o = run(Engine::new(cqp, ccfg).unwrap(), server);
    check(&o);
}

/// The engine over `soft` ports at active MTU `mtu` (set explicitly: `lo`
/// allows 4096), on `ips`: 8 MiB sha256-equal, QUIC at the socket's
/// datagram MTU; at most `per_packet` stream bytes crossed per RoCEv2 packet.
fn soft_engine_at(mtu: quic_rdma::fabric::Mtu, ips: [&str; 2], want_mtu: usize, per_packet: u64) {
    let port = |ip: &str| {
        let mut cfg = SoftConfig::new(ip.parse().unwrap());
        cfg.mtu = mtu;
        SoftPort::open(cfg).unwrap()
    };
    let (ps, pc) = (port(ips[0]), port(ips[1]));
    let dmtu = quic_rdma::socket::segment::datagram_mtu(ps.active_mtu().bytes());
    assert_eq!(dmtu, want_mtu);
    let (ccfg, scfg) = configs(dmtu, AcceptPolicy::AcceptAll);
    let server = Engine::new(ps.create_qp(DEFAULT_QKEY).unwrap(), scfg).unwrap();
    let client = Engine::new(pc.create_qp(DEFAULT_QKEY).unwrap(), ccfg).unwrap();
    assert_eq!((server.mtu(), client.mtu()), (want_mtu, want_mtu));
    let o = run(client, server);
    check(&o);
    let tx = pc.stats().tx_packets;
    assert!(tx >= LEN / per_packet, "{tx} packets for {LEN} bytes");
}

/// RoCE MTU 1024 (kernel rxe's on a 1500-byte Ethernet): QUIC's 2040-byte
/// datagrams go as two RoCEv2 packets of at most 1020 datagram bytes each.
#[test]
fn soft_engine_at_roce_mtu_1024_transfers_segmented() {
    soft_engine_at(
        quic_rdma::fabric::Mtu::M1024,
        ["127.141.0.3", "127.141.0.4"],
        2040,
        1020,
    );
}

/// RoCE MTU 2048: datagrams of 2048 bytes, sent whole.
#[test]
fn soft_engine_at_roce_mtu_2048_transfers_whole() {
    soft_engine_at(
        quic_rdma::fabric::Mtu::M2048,
        ["127.141.0.5", "127.141.0.6"],
        2048,
        2048,
    );
}

/// A waiter with the pure busy-poll configuration never sleeps.
#[test]
fn busy_poll_configuration_never_sleeps() {
    let fabric = SimFabric::new(SimConfig::default());
    let (ccfg, _) = configs(4096, AcceptPolicy::AcceptAll);
    let gid = std::net::Ipv6Addr::new(0xfd00, 0, 0, 0x41, 0, 0, 0, 9).into();
    let mut e = Engine::new(
        fabric.create_qp(gid, SimQpOptions::default()).unwrap(),
        ccfg,
    )
    .unwrap();
    let mut w = Waiter::new(IdleConfig::BUSY_POLL).unwrap();
    let mut ev = Vec::new();
    let until = Instant::now() + Duration::from_millis(20);
    while Instant::now() < until {
        w.poll(&mut e, &mut ev, None);
    }
    assert_eq!(w.stats().sleeps, 0);
    assert!(w.stats().spins > 0);
    // And the sleeping one sleeps at once, until its limit (no connections:
    // no engine deadline).
    let mut w = Waiter::new(IdleConfig::SLEEP).unwrap();
    let t0 = Instant::now();
    let r = w.wait(&mut e, t0, false, Some(t0 + Duration::from_millis(30)));
    assert_eq!(r, Wait::TimedOut);
    assert!(
        t0.elapsed() >= Duration::from_millis(25),
        "{:?}",
        t0.elapsed()
    );
}
