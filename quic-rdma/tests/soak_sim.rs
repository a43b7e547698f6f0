//! Soak (issue 9): sha256-verified transfers without pause over a hostile `sim`
//! fabric (loss, duplication, reordering, corruption, receive starvation), for
//! `QR_SOAK_SECS` seconds (default 60, at most 300), through the quinn adapter
//! and, at the same time on its own fabric, the poll-mode engine. Connections
//! are opened, used and closed over and over.
//!
//! Sampled at intervals, nothing grows: sends in flight (what still holds a
//! send slot), address handles, peers, the process's RSS (after warm-up, with
//! a margin). And every packet is accounted for: on a quiescent fabric the
//! sockets' and the fabric's counters reconcile exactly (see [`Ledger`]).

mod engine_common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use engine_common::common::{
    certs, endpoint, gid, rss_kib, seeded_bytes as payload, socket_on, SimSocket,
};
use engine_common::{configs, transfer as engine_transfer, EnginePair};
use quic_rdma::engine::{AcceptPolicy, Engine};
use quic_rdma::fabric::sim::{Faults, SimConfig, SimFabric, SimQp};
use quic_rdma::quic::PeerStats;
use quic_rdma::socket::{SocketConfig, SocketStats, UdSocket};
use sha2::{Digest, Sha256};

/// Samples over the run; the first `WARMUP_SAMPLES` are warm-up.
const SAMPLES: u32 = 12;
const WARMUP_SAMPLES: usize = 2;
/// Allowed RSS growth from the end of warm-up to any later sample. The
/// recycled-buffer pools (each fabric keeps up to 8 192 packet buffers) and
/// allocator caches may still settle after warm-up; a leak of the soak's
/// traffic (hundreds of MiB) would not fit.
const RSS_MARGIN_KIB: u64 = 48 << 10;
/// Address handles kept per socket: small, so connection churn (every
/// client Initial has a random DCID, hence its own flow label and AH)
/// fills the cache during warm-up and the LRU must keep it there.
const AH_CAPACITY: usize = 32;
/// Clients of the quinn server (each its own QP and GID).
const QUINN_CLIENTS: u8 = 3;

fn soak_duration() -> Duration {
    let secs = std::env::var("QR_SOAK_SECS")
        .ok()
        .map(|s| {
            s.parse::<u64>()
                .unwrap_or_else(|_| panic!("QR_SOAK_SECS={s:?}: expected whole seconds"))
        })
        .unwrap_or(60);
    assert!(
        (5..=300).contains(&secs),
        "QR_SOAK_SECS={secs}: choose 5..=300 seconds"
    );
    Duration::from_secs(secs)
}

fn hostile(seed: u64) -> SimConfig {
    SimConfig {
        faults: Faults {
            corrupt: 0.0005,
            starve: 0.001,
            ..Faults::hostile(0.01)
        },
        seed,
        ..SimConfig::default()
    }
}

fn socket_config() -> SocketConfig {
    SocketConfig {
        ah_capacity: AH_CAPACITY,
        ..SocketConfig::default()
    }
}

/// One socket at one instant.
#[derive(Clone, Copy, Debug)]
struct SockSample {
    /// Sends not yet retired, right after retiring every completion.
    in_flight: usize,
    ah_live: usize,
    ah_retired: usize,
    stats: SocketStats,
    peers: PeerStats,
}

impl SockSample {
    fn of<Q: quic_rdma::fabric::UdQueuePair>(s: &UdSocket<Q>, peers: PeerStats) -> Self {
        let (ah_live, ah_retired) = s.ah_counts();
        SockSample {
            in_flight: s.sends_in_flight(),
            ah_live,
            ah_retired,
            stats: s.stats(),
            peers,
        }
    }

    fn of_quinn(s: &SimSocket) -> Self {
        let peers = s.peer_stats();
        s.with_socket(|u| {
            // Sim completions are queued at post time: after this, only the
            // unsignaled sends since the last signaled one are in flight.
            u.reap_sends();
            SockSample::of(u, peers)
        })
    }

    /// The bounds that hold at every instant: in flight only the unsignaled
    /// tail (`signal_every - 1`), live AHs within the cache, retired AHs only
    /// while a send still uses them, and every AH created is live, retired or destroyed.
    fn check(&self, who: &str, signal_every: usize) {
        assert!(
            self.in_flight < signal_every,
            "{who}: {} sends in flight after retiring completions (at most {} unsignaled): {self:?}",
            self.in_flight,
            signal_every - 1
        );
        assert!(self.ah_live <= AH_CAPACITY, "{who}: {self:?}");
        assert!(self.ah_retired <= self.in_flight, "{who}: {self:?}");
        assert_eq!(
            self.stats.ah_created - self.stats.ah_destroyed,
            (self.ah_live + self.ah_retired) as u64,
            "{who}: AHs created - destroyed = live + retired: {self:?}"
        );
    }
}

/// The packet ledger of one `sim` fabric and every socket on it. With nothing
/// travelling and every arrival polled:
///
/// - wire: every WR the sockets posted reached the fabric, except those the
///   "hardware" drops for exceeding the MTU; the fabric lost some and copied
///   some; every copy that remained ended in exactly one place: delivered to a
///   receive queue, or dropped at the receiver by cause (P_Key, Q_Key, no
///   posted receive, unknown QPN, unreachable GID):
///   `Σ(sent_wrs - oversize_sent) - lost + duplicated = delivered + Σ drops + unreachable`;
/// - receive: every delivered packet was polled by its socket and either
///   handed up or dropped and counted:
///   `delivered = Σ(recv_packets + drop_bad_grh + recv_bogus_completions + recv_errors)`.
///
/// Every socket must be on its own GID (`unknown_qpn` is counted per port).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Ledger {
    posted: u64,
    lost: u64,
    duplicated: u64,
    delivered: u64,
    receiver_drops: u64,
    unreachable: u64,
    handled: u64,
    in_flight: usize,
}

impl Ledger {
    fn of(fabric: &SimFabric, socks: &[SocketStats]) -> Ledger {
        let f = fabric.stats();
        let mut l = Ledger {
            posted: 0,
            lost: f.lost,
            duplicated: f.duplicated,
            delivered: f.delivered,
            receiver_drops: 0,
            unreachable: f.unreachable,
            handled: 0,
            in_flight: fabric.in_flight(),
        };
        for s in socks {
            let d = s.provider;
            l.posted += s.sent_wrs - d.oversize_sent;
            l.receiver_drops += d.bad_pkey + d.bad_qkey + d.no_recv_posted + d.unknown_qpn;
            l.handled += s.recv_packets + s.drop_bad_grh + s.recv_bogus_completions + s.recv_errors;
        }
        l
    }

    fn balanced(&self) -> bool {
        self.in_flight == 0
            && self.posted - self.lost + self.duplicated
                == self.delivered + self.receiver_drops + self.unreachable
            && self.delivered == self.handled
    }

    fn assert_balanced(&self, who: &str) {
        assert_eq!(self.in_flight, 0, "{who}: quiescent {self:?}");
        assert_eq!(
            self.posted - self.lost + self.duplicated,
            self.delivered + self.receiver_drops + self.unreachable,
            "{who}: posted - lost + duplicated = delivered + receiver drops + unreachable: {self:?}"
        );
        assert_eq!(
            self.delivered, self.handled,
            "{who}: every delivered packet polled and handed up or counted: {self:?}"
        );
    }
}

/// Stream sizes: mostly short, some up to 1 MiB.
fn stream_len(seed: u64) -> usize {
    match seed % 8 {
        0 => 1 << 20,
        1 | 2 => 64 << 10,
        _ => 1 + (seed.wrapping_mul(7919) % 8000) as usize,
    }
}

// ---------------------------------------------------------------- quinn ----

/// Echo every bidirectional stream of every connection.
async fn echo_server(server: quinn::Endpoint) {
    while let Some(inc) = server.accept().await {
        tokio::spawn(async move {
            let Ok(conn) = inc.await else { return };
            while let Ok((mut tx, mut rx)) = conn.accept_bi().await {
                tokio::spawn(async move {
                    while let Ok(Some(c)) = rx.read_chunk(usize::MAX, true).await {
                        if tx.write_chunk(c.bytes).await.is_err() {
                            return;
                        }
                    }
                    let _ = tx.finish();
                    let _ = tx.stopped().await;
                });
            }
        });
    }
}

/// Send `payload(seed)` on a new stream, read the echo, compare sha256.
async fn echo_stream(conn: &quinn::Connection, seed: u64) {
    let len = stream_len(seed);
    let data = payload(seed, len);
    let (mut tx, mut rx) = conn.open_bi().await.unwrap();
    let sent = Sha256::digest(&data);
    let writer = tokio::spawn(async move {
        tx.write_all(&data).await.unwrap();
        tx.finish().unwrap();
    });
    let back = rx.read_to_end(len + 1).await.unwrap();
    writer.await.unwrap();
    assert_eq!(back.len(), len, "stream {seed}: echoed length");
    assert_eq!(
        Sha256::digest(&back),
        sent,
        "stream {seed}: sha256 of the echo equals what was sent"
    );
}

struct QuinnSoak {
    fabric: SimFabric,
    server: quinn::Endpoint,
    server_sock: SimSocket,
    clients: Vec<(quinn::Endpoint, SimSocket)>,
}

impl QuinnSoak {
    fn new() -> QuinnSoak {
        let fabric = SimFabric::new(hostile(0x50a4));
        let (server_sock, _) = socket_on(&fabric, gid(1, false), socket_config());
        let c = certs(server_sock.mtu());
        let server = endpoint(&server_sock, Some(c.server), 0x5e);
        let clients = (0..QUINN_CLIENTS)
            .map(|i| {
                let (s, _) = socket_on(&fabric, gid(2 + i, false), socket_config());
                let mut ep = endpoint(&s, None, 0xc1 + u32::from(i));
                ep.set_default_client_config(c.client.clone());
                (ep, s)
            })
            .collect();
        QuinnSoak {
            fabric,
            server,
            server_sock,
            clients,
        }
    }

    fn sockets(&self) -> impl Iterator<Item = (String, &SimSocket)> {
        std::iter::once(("quinn server".to_string(), &self.server_sock)).chain(
            self.clients
                .iter()
                .enumerate()
                .map(|(i, (_, s))| (format!("quinn client {i}"), s)),
        )
    }

    fn sample(&self) -> Vec<(String, SockSample)> {
        self.sockets()
            .map(|(n, s)| (n, SockSample::of_quinn(s)))
            .collect()
    }
}

/// One client: connect, run a few verified streams, close; again until `stop`.
async fn quinn_client(
    ep: quinn::Endpoint,
    server: std::net::SocketAddr,
    id: u64,
    stop: Arc<AtomicBool>,
    streams: Arc<AtomicU64>,
) {
    let mut seed = id << 40;
    while !stop.load(Ordering::Relaxed) {
        let conn = ep.connect(server, "localhost").unwrap().await.unwrap();
        for _ in 0..6 {
            echo_stream(&conn, seed).await;
            seed += 1;
            streams.fetch_add(1, Ordering::Relaxed);
        }
        conn.close(0u32.into(), b"cycle done");
        // Let it drain before the next one, so connections do not pile up.
        let _ = conn.closed().await;
    }
}

// --------------------------------------------------------------- engine ----

/// Poll both engines until nothing moves: no packet travelling, none sent or
/// received in a whole step (so the step's reap retired every completion).
fn quiesce(p: &mut EnginePair) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let before = (p.client.socket_stats(), p.server.socket_stats());
        p.step();
        let after = (p.client.socket_stats(), p.server.socket_stats());
        if p.fabric.in_flight() == 0 && before == after {
            return;
        }
        assert!(Instant::now() < deadline, "engines never went quiet");
    }
}

fn engine_sample(e: &Engine<SimQp>) -> SockSample {
    SockSample::of(e.socket(), e.peer_stats())
}

/// The engine's soak, on its own fabric: cycles of connect, verified
/// transfers, close; sampled (quiescent) when `sample_at` says so.
fn engine_soak(
    deadline: Instant,
    sample_at: Vec<Instant>,
    out: mpsc::Sender<(Vec<(String, SockSample)>, Ledger)>,
    transfers: Arc<AtomicU64>,
) {
    let cfg = hostile(0xe4a6);
    let mtu = cfg.mtu.bytes();
    let (mut ccfg, mut scfg) = configs(mtu, AcceptPolicy::AcceptAll);
    ccfg.socket = socket_config();
    scfg.socket = socket_config();
    let mut p = EnginePair::from_configs(SimFabric::new(cfg), ccfg, scfg);
    let mut next = sample_at.into_iter().peekable();
    let mut seed = 0xe000_0000u64;
    while Instant::now() < deadline {
        let (c, s) = p.connect();
        for _ in 0..4 {
            engine_transfer(&mut p, c, s, stream_len(seed) as u64, seed, |_, _| {});
            seed += 1;
            transfers.fetch_add(1, Ordering::Relaxed);
        }
        p.client.close(Instant::now(), c, 0, b"cycle done").unwrap();
        p.run_until(|p| p.client.connection_count() == 0 && p.server.connection_count() == 0);
        // One sample per sampling time passed during the cycle (a long cycle
        // answers for several).
        let mut due = 0;
        while next.peek().is_some_and(|t| Instant::now() >= *t) {
            next.next();
            due += 1;
        }
        if due > 0 {
            quiesce(&mut p);
            let socks = vec![
                ("engine client".to_string(), engine_sample(&p.client)),
                ("engine server".to_string(), engine_sample(&p.server)),
            ];
            let ledger = Ledger::of(&p.fabric, &[socks[0].1.stats, socks[1].1.stats]);
            for _ in 0..due {
                if out.send((socks.clone(), ledger.clone())).is_err() {
                    return;
                }
            }
        }
    }
    let f = p.fabric.stats();
    eprintln!("engine fabric at the end: {f:?}");
    assert!(f.lost > 0 && f.duplicated > 0 && f.reordered > 0 && f.corrupted > 0);
    assert_eq!(f.ah_destroy_in_use, 0, "{f:?}");
}

// ----------------------------------------------------------------- test ----

#[test]
fn soak_quinn_and_engine_over_a_hostile_fabric() {
    let duration = soak_duration();
    let start = Instant::now();
    let deadline = start + duration;
    let every = duration / SAMPLES;
    let sample_at: Vec<Instant> = (1..=SAMPLES).map(|k| start + every * k).collect();
    let signal_every = SocketConfig::default().signal_every as usize;

    // The engine on its own thread and fabric.
    let (eng_tx, eng_rx) = mpsc::channel();
    let eng_transfers = Arc::new(AtomicU64::new(0));
    let engine = {
        let (sample_at, t) = (sample_at.clone(), eng_transfers.clone());
        std::thread::spawn(move || engine_soak(deadline, sample_at, eng_tx, t))
    };

    // quinn over the adapter on a two-thread runtime.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let q = QuinnSoak::new();
    let stop = Arc::new(AtomicBool::new(false));
    let streams = Arc::new(AtomicU64::new(0));
    rt.spawn(echo_server(q.server.clone()));
    let clients: Vec<_> = q
        .clients
        .iter()
        .enumerate()
        .map(|(i, (ep, s))| {
            let server = s.peer_addr(q.server_sock.ud_addr());
            rt.spawn(quinn_client(
                ep.clone(),
                server,
                i as u64,
                stop.clone(),
                streams.clone(),
            ))
        })
        .collect();

    // Sample.
    let mut rss = Vec::new();
    let mut last_streams = 0;
    let mut last_transfers = 0;
    for (k, at) in sample_at.iter().enumerate() {
        std::thread::sleep(at.saturating_duration_since(Instant::now()));
        for c in &clients {
            assert!(!c.is_finished(), "a quinn client task ended early");
        }
        let qs = q.sample();
        let eng = eng_rx
            .recv_timeout(every * 3 + Duration::from_secs(30))
            .expect("the engine soak sampled (it failed or hung otherwise)");
        let r = rss_kib();
        rss.push(r);
        let (n, t) = (
            streams.load(Ordering::Relaxed),
            eng_transfers.load(Ordering::Relaxed),
        );
        eprintln!(
            "[{:>5.1}s] RSS {r} KiB; quinn streams {n} (+{}), engine transfers {t} (+{}); \
             quinn server: in flight {}, AHs {}+{}, peers {:?}; engine ledger {:?}",
            start.elapsed().as_secs_f64(),
            n - last_streams,
            t - last_transfers,
            qs[0].1.in_flight,
            qs[0].1.ah_live,
            qs[0].1.ah_retired,
            qs[0].1.peers,
            eng.1
        );
        // Progress: the soak is moving data, not stuck in recovery.
        assert!(
            n > last_streams,
            "no quinn stream completed in interval {k}"
        );
        assert!(
            t > last_transfers,
            "no engine transfer completed in interval {k}"
        );
        (last_streams, last_transfers) = (n, t);

        for (who, s) in qs.iter().chain(eng.0.iter()) {
            s.check(who, signal_every);
            assert_eq!(s.stats.qp_recoveries, 0, "{who}: {s:?}");
        }
        // Peers: each side knows exactly its peers, admitted once, nothing pending.
        let sp = qs[0].1.peers;
        assert_eq!(sp.peers, u64::from(QUINN_CLIENTS), "quinn server: {sp:?}");
        assert_eq!(
            sp.admitted,
            u64::from(QUINN_CLIENTS),
            "quinn server: {sp:?}"
        );
        assert_eq!(sp.pending, 0, "quinn server: {sp:?}");
        for (who, s) in qs[1..].iter().chain(eng.0.iter()) {
            let p = s.peers;
            assert_eq!((p.peers, p.admitted, p.pending), (1, 1, 0), "{who}: {p:?}");
        }
        // The engine was quiescent when sampled: its ledger balances exactly.
        eng.1.assert_balanced("engine");
        // Memory: no growth past warm-up beyond the margin.
        if k >= WARMUP_SAMPLES {
            let warm = rss[WARMUP_SAMPLES - 1];
            assert!(
                r.saturating_sub(warm) < RSS_MARGIN_KIB,
                "RSS grew {} KiB since warm-up (margin {RSS_MARGIN_KIB} KiB): {rss:?}",
                r.saturating_sub(warm)
            );
        }
    }

    // Stop: every client finishes its cycle (closing its connection), then
    // every endpoint goes idle and the fabric empties.
    stop.store(true, Ordering::Relaxed);
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(60), async {
            for c in clients {
                c.await.unwrap();
            }
            for (ep, _) in &q.clients {
                ep.wait_idle().await;
            }
            while q.server.open_connections() > 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            q.server.wait_idle().await;
        })
        .await
        .expect("quinn endpoints went idle");
    });
    engine.join().expect("engine soak");

    // The quinn fabric's ledger: wait until it is still (endpoint drivers poll
    // what is left), then it must balance exactly.
    let quiet = Instant::now() + Duration::from_secs(10);
    let ledger = loop {
        q.fabric.settle(Duration::from_secs(1));
        let a = Ledger::of(
            &q.fabric,
            &q.sample().iter().map(|s| s.1.stats).collect::<Vec<_>>(),
        );
        std::thread::sleep(Duration::from_millis(100));
        let b = Ledger::of(
            &q.fabric,
            &q.sample().iter().map(|s| s.1.stats).collect::<Vec<_>>(),
        );
        if (a == b && b.balanced()) || Instant::now() > quiet {
            break b;
        }
    };
    let f = q.fabric.stats();
    eprintln!(
        "quinn fabric at the end: {f:?}\nledger {ledger:?}\nRSS samples (KiB): {rss:?}\n\
         {} quinn streams, {} engine transfers in {:?}",
        streams.load(Ordering::Relaxed),
        eng_transfers.load(Ordering::Relaxed),
        start.elapsed()
    );
    ledger.assert_balanced("quinn");
    for (who, s) in q.sample() {
        s.check(&who, signal_every);
    }
    // The faults were really on.
    assert!(
        f.lost > 0 && f.duplicated > 0 && f.reordered > 0 && f.corrupted > 0,
        "{f:?}"
    );
    assert_eq!(f.ah_destroy_in_use, 0, "{f:?}");
    let starved: u64 = q
        .sample()
        .iter()
        .map(|s| s.1.stats.provider.no_recv_posted)
        .sum();
    assert!(starved > 0, "starvation was injected");
}
