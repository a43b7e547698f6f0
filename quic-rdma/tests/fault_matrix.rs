//! The fault matrix: sha256-verified transfers over the `sim` fabric
//! for both drivers — quinn over `RdmaUdpSocket` and the poll-mode `engine` —
//! under every fault the fabric injects (loss, duplication, reordering, payload
//! corruption, delay with jitter, receive-queue starvation), forged RoCE header
//! faults, migration, queue-pair failure, peer crash and restart, and idle
//! timeout.
//!
//! Every cell runs on its own thread under a time bound, verifies the data end
//! to end and checks counters that show the fault happened and was handled (a
//! cell whose fault was never injected fails). The table of all cells is
//! printed and written to `<target>/fault-matrix.md`; the test fails at the
//! end if any cell did.

mod engine_common;

use std::fmt::Write as _;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use engine_common::common::{
    self, fill_chunk, gid, socket_on, transfer as quinn_transfer, Forged, HeaderForger, Pair,
    SimSocket,
};
use engine_common::{configs_with, moved_gid, transfer as engine_transfer, EnginePair, Source};
use quic_rdma::engine::{AcceptPolicy, CloseReason, Engine, EngineConfig, Event};
use quic_rdma::fabric::sim::{FabricStats, Faults, SimConfig, SimFabric, SimQpOptions};
use quic_rdma::quinn_adapter;
use quic_rdma::socket::{SocketConfig, SocketStats, UdSocket};
use quinn::{ConnectionError, TransportConfig};
use sha2::{Digest, Sha256};

/// Bytes per verified transfer: enough packets (2048 at MTU 4096) for every
/// fault to hit, little enough for the whole matrix to stay short in release.
const LEN: u64 = 8 << 20;
/// Time bound of one cell: a cell that hangs fails.
const CELL_TIMEOUT: Duration = Duration::from_secs(60);
/// The idle timeout every cell sets explicitly (so no cell depends on the default)...
const IDLE: Duration = Duration::from_secs(10);
/// ...except the idle-timeout and engine crash cells, which wait for it.
const SHORT_IDLE: Duration = Duration::from_millis(600);
/// The idle cell's bound on when the close must be reported: well under any
/// default idle timeout, so it shows the explicit setting took effect.
const SHORT_IDLE_BOUND: Duration = Duration::from_millis(1900);
/// One-way delay of the delay cell: above quinn's 2 ms initial RTT, so the
/// measured RTT shows the delay rather than the initial estimate.
const DELAY: Duration = Duration::from_millis(3);
/// Jitter of the delay cell: a share of packets held back this much longer.
const JITTER: Duration = Duration::from_millis(1);
/// Receive queue depth of the starvation cell (the default is 2048).
const STARVED_DEPTH: usize = 16;
/// Forged packets of each header fault in the header cell.
const FORGED_PER_KIND: u64 = 25;
/// The server's routing key (`common::Pair` and `engine_common::configs` use 0x5e).
const SERVER_KEY: u32 = 0x5e;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    Loss(f64),
    Duplicate,
    Reorder,
    CorruptPayload,
    CorruptHeader,
    DelayJitter,
    Starvation,
    Migration,
    MigrationQpn,
    QpError,
    CrashRestart,
    IdleTimeout,
}

/// The matrix. [`Fault::MigrationQpn`] is not in it: only the quinn adapter can
/// change its queue pair, so that cell is a test of its own,
/// [`quinn_rebind_to_new_qpn`].
const FAULTS: [Fault; 14] = [
    Fault::Loss(0.001),
    Fault::Loss(0.01),
    Fault::Loss(0.05),
    Fault::Loss(0.10),
    Fault::Duplicate,
    Fault::Reorder,
    Fault::CorruptPayload,
    Fault::CorruptHeader,
    Fault::DelayJitter,
    Fault::Starvation,
    Fault::Migration,
    Fault::QpError,
    Fault::CrashRestart,
    Fault::IdleTimeout,
];

impl Fault {
    fn name(self) -> String {
        match self {
            Fault::Loss(p) => format!("loss {}%", p * 100.0),
            Fault::Duplicate => "duplication 5%".into(),
            Fault::Reorder => "reordering 5% by 200us".into(),
            Fault::CorruptPayload => "payload corruption 2%".into(),
            Fault::CorruptHeader => format!("header faults (forged, {FORGED_PER_KIND}/kind)"),
            Fault::DelayJitter => format!("delay {DELAY:?} + jitter {JITTER:?} on 10%"),
            Fault::Starvation => format!("rx starvation (recv_depth {STARVED_DEPTH})"),
            Fault::Migration => "migration (client GID)".into(),
            Fault::MigrationQpn => "migration (client QPN: rebind)".into(),
            Fault::QpError => "QP error (server, then client)".into(),
            Fault::CrashRestart => "server crash + restart".into(),
            Fault::IdleTimeout => format!("idle timeout {SHORT_IDLE:?}"),
        }
    }

    /// The fault RNG's seed (and the data's): fixed per cell, so a cell sees the
    /// same sequence of fault decisions every run.
    fn seed(self) -> u64 {
        let i = FAULTS.iter().position(|f| *f == self);
        0x9a00 + i.unwrap_or(FAULTS.len()) as u64
    }

    fn sim(self) -> SimConfig {
        let faults = match self {
            Fault::Loss(p) => Faults::lossy(p),
            Fault::Duplicate => Faults {
                duplicate: 0.05,
                ..Faults::default()
            },
            Fault::Reorder => Faults {
                reorder: 0.05,
                reorder_delay: Duration::from_micros(200),
                ..Faults::default()
            },
            Fault::CorruptPayload => Faults {
                corrupt: 0.02,
                ..Faults::default()
            },
            // The sim has no jitter distribution: a fixed delay plus a share of
            // packets held back longer is the jitter it can make.
            Fault::DelayJitter => Faults {
                delay: DELAY,
                reorder: 0.1,
                reorder_delay: JITTER,
                ..Faults::default()
            },
            _ => Faults::default(),
        };
        SimConfig {
            faults,
            seed: self.seed(),
            ..SimConfig::default()
        }
    }

    /// The data receiver's socket: a tiny receive queue in the starvation cell.
    fn server_socket(self) -> SocketConfig {
        match self {
            Fault::Starvation => SocketConfig {
                recv_depth: STARVED_DEPTH,
                repost_batch: 4,
                ..SocketConfig::default()
            },
            _ => SocketConfig::default(),
        }
    }
}

fn idle(t: Duration) -> impl Fn(&mut TransportConfig) {
    move |c: &mut TransportConfig| {
        c.max_idle_timeout(Some(t.try_into().unwrap()));
    }
}

/// What one cell measured.
struct Measures {
    bytes: u64,
    elapsed: Duration,
    sim: FabricStats,
    client: SocketStats,
    server: SocketStats,
    /// Datagrams the routing check dropped (client, server): see `quic_rdma::quic::RoutingCheck`.
    imm_dropped: (u64, u64),
    /// Packets quinn(-proto) declared lost, both sides.
    quic_lost: u64,
    /// Cell-specific outcome (close reason, RTT, ...).
    note: String,
}

/// The checks every driver must pass for the faults the fabric injects.
fn check_common(fault: Fault, m: &Measures, forged: Forged) {
    let (sim, c, s) = (&m.sim, &m.client, &m.server);
    assert_eq!(sim.ah_destroy_in_use, 0, "an AH was destroyed under a send");
    match fault {
        Fault::Loss(_) => {
            assert!(sim.lost > 0, "loss was injected: {sim:?}");
            assert!(m.quic_lost > 0, "QUIC detected and repaired losses");
        }
        Fault::Duplicate => {
            assert!(sim.duplicated > 0, "{sim:?}");
            assert_eq!(sim.lost, 0);
            // More packets reached receive queues than were ever sent: the
            // duplicates were delivered (and the transfer still verified).
            assert!(
                sim.delivered > c.sent_wrs + s.sent_wrs,
                "delivered {} vs sent {}",
                sim.delivered,
                c.sent_wrs + s.sent_wrs
            );
        }
        Fault::Reorder => {
            assert!(sim.reordered > 0, "{sim:?}");
            assert_eq!(sim.lost, 0);
        }
        Fault::CorruptPayload => {
            assert!(sim.corrupted > 0, "{sim:?}");
            assert_eq!(sim.lost, 0, "every loss below comes from corruption");
            // A flipped byte fails the AEAD tag (or the routing-key check, when
            // it hits the header): the receiver drops it and the sender
            // declares the packet lost.
            assert!(
                m.quic_lost > 0,
                "corrupted packets were dropped and repaired"
            );
        }
        Fault::CorruptHeader => {
            // Exact: each forged header fault is dropped and counted by cause at
            // the receiver, and nothing else in this cell produces such drops.
            let d = s.provider;
            assert_eq!(d.bad_pkey, forged.bad_pkey, "{d:?}");
            assert_eq!(d.bad_qkey, forged.bad_qkey, "{d:?}");
            assert_eq!(d.unknown_qpn, forged.unknown_qpn, "{d:?}");
            assert_eq!(m.imm_dropped.1, forged.imm_mismatch, "{s:?}");
            assert!(forged.bad_pkey > 0 && forged.imm_mismatch > 0);
        }
        Fault::DelayJitter => {
            assert!(sim.reordered > 0, "jitter was injected: {sim:?}");
        }
        Fault::Starvation => {
            assert!(
                s.provider.no_recv_posted > 0,
                "the receive queue ran dry: {:?}",
                s.provider
            );
            assert!(m.quic_lost > 0, "starvation drops were repaired");
        }
        Fault::Migration => {
            assert_eq!(c.gid_changes, 1, "{c:?}");
            assert!(c.ah_rebuilt >= 1, "client rebuilt its AHs: {c:?}");
            // The server needs the new GID's AH (AHs are per GID, not per
            // peer: nothing is "rebuilt" on its side); the cell checks below
            // that it really sends to the new address.
            assert!(
                s.ah_created >= 2,
                "server built an AH to the new GID: {s:?}"
            );
        }
        Fault::QpError => {
            for st in [c, s] {
                assert_eq!(st.qp_recoveries, 1, "{st:?}");
                assert_eq!(st.qp_recovery_failures, 0, "{st:?}");
            }
        }
        Fault::MigrationQpn | Fault::CrashRestart | Fault::IdleTimeout => {}
    }
}

// ---------------------------------------------------------------- quinn driver

fn quinn_cell(fault: Fault) -> Measures {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    match fault {
        Fault::CrashRestart => quinn_crash_restart(&rt),
        Fault::IdleTimeout => quinn_idle_timeout(&rt),
        _ => rt.block_on(quinn_transfer_cell(fault)),
    }
}

/// Wait until `cond` holds, or the transfer ended (then the fault came too late
/// and the cell's checks fail).
async fn until(xfer: &tokio::task::JoinHandle<()>, mut cond: impl FnMut() -> bool) {
    while !cond() && !xfer.is_finished() {
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
}

async fn quinn_transfer_cell(fault: Fault) -> Measures {
    let p = Pair::with_certs(
        fault.sim(),
        false,
        SocketConfig::default(),
        fault.server_socket(),
        |mtu| common::certs_with(mtu, idle(IDLE)),
    );
    let (c, s) = p.connect().await;
    let (client_before, server_before) = (p.client_sock.ud_addr(), p.server_sock.ud_addr());
    let t = Instant::now();
    let (c2, s2, seed) = (c.clone(), s.clone(), fault.seed());
    let xfer = tokio::spawn(async move { quinn_transfer(&c2, &s2, LEN, seed).await });
    let sent = || p.client_sock.stats().sent_bytes;
    let mut forged = Forged::default();
    let mut rebound = None;
    match fault {
        Fault::Migration => {
            until(&xfer, || sent() >= LEN / 2).await;
            p.client_qp.set_gid(moved_gid());
        }
        Fault::MigrationQpn => {
            // A new queue pair on the same port: the client's QPN changes.
            until(&xfer, || sent() >= LEN / 2).await;
            let qp = p
                .fabric
                .create_qp(gid(2, false), SimQpOptions::default())
                .unwrap();
            let sock = Arc::new(
                p.client_sock
                    .rebind(UdSocket::new(qp, SocketConfig::default()).unwrap()),
            );
            p.client.rebind_abstract(sock.clone()).unwrap();
            rebound = Some(sock);
        }
        Fault::QpError => {
            until(&xfer, || sent() >= LEN / 3).await;
            p.server_qp.fail();
            until(&xfer, || sent() >= 2 * LEN / 3).await;
            p.client_qp.fail();
        }
        Fault::CorruptHeader => {
            until(&xfer, || sent() >= LEN / 4).await;
            let mut forger = HeaderForger::new(&p.fabric, gid(9, false));
            forged = forger.inject(p.server_sock.ud_addr(), SERVER_KEY, FORGED_PER_KIND);
        }
        _ => {}
    }
    if let Err(e) = xfer.await {
        std::panic::resume_unwind(e.into_panic());
    }
    let elapsed = t.elapsed();
    let (cs, ss) = (c.stats(), s.stats());
    let m = Measures {
        bytes: LEN,
        elapsed,
        sim: p.fabric.stats(),
        client: p.client_sock.stats(),
        server: p.server_sock.stats(),
        imm_dropped: (
            p.client_sock.routing_stats().imm_mismatch,
            p.server_sock.routing_stats().imm_mismatch,
        ),
        quic_lost: cs.path.lost_packets + ss.path.lost_packets,
        note: format!("rtt {:?}", cs.path.rtt),
    };
    check_common(fault, &m, forged);
    match fault {
        Fault::Migration => {
            // The server follows the client to its new GID.
            let seen = p.server_sock.ud_addr_of(s.remote_address()).unwrap();
            assert_eq!(seen.gid, moved_gid());
            assert_ne!(seen, client_before);
        }
        Fault::MigrationQpn => {
            // The server follows the client to its new queue pair.
            let new = rebound.as_ref().unwrap();
            let seen = p.server_sock.ud_addr_of(s.remote_address()).unwrap();
            assert_eq!(seen, new.ud_addr());
            assert_eq!(seen.gid, client_before.gid);
            assert_ne!(seen.qpn, client_before.qpn);
            let st = new.stats();
            assert!(
                st.sent_wrs > 0 && st.recv_packets > 0,
                "traffic moved: {st:?}"
            );
        }
        Fault::QpError => {
            // Recovery keeps the QPNs: both still reach each other at the old addresses.
            assert_eq!(p.client_sock.ud_addr(), client_before);
            assert_eq!(p.server_sock.ud_addr(), server_before);
        }
        Fault::DelayJitter => {
            assert!(
                cs.path.rtt >= 2 * DELAY,
                "RTT {:?} shows the delay",
                cs.path.rtt
            );
        }
        _ => {}
    }
    m
}

/// A quinn server on its own runtime, so it can crash: dropping the runtime
/// drops every task unpolled, and nothing (no CONNECTION_CLOSE) leaves.
fn spawn_server(
    sock: &SimSocket,
    ep: quinn::EndpointConfig,
    cfg: quinn::ServerConfig,
) -> (tokio::runtime::Runtime, quinn::Endpoint) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let endpoint = {
        let _g = rt.enter();
        quinn::Endpoint::new_with_abstract_socket(
            ep,
            Some(cfg),
            sock.clone(),
            Arc::new(quinn::TokioRuntime),
        )
        .unwrap()
    };
    rt.spawn(serve(endpoint.clone()));
    (rt, endpoint)
}

/// Accept connections; answer each bidirectional stream with the byte count
/// and sha256 of what it carried (the server half of `common::transfer`).
async fn serve(endpoint: quinn::Endpoint) {
    while let Some(incoming) = endpoint.accept().await {
        tokio::spawn(async move {
            let Ok(conn) = incoming.await else { return };
            while let Ok((tx, rx)) = conn.accept_bi().await {
                tokio::spawn(answer(tx, rx));
            }
        });
    }
}

async fn answer(mut tx: quinn::SendStream, mut rx: quinn::RecvStream) -> Option<()> {
    let (mut h, mut n) = (Sha256::new(), 0u64);
    while let Some(chunk) = rx.read_chunk(usize::MAX, true).await.ok()? {
        n += chunk.bytes.len() as u64;
        h.update(&chunk.bytes);
    }
    tx.write_all(&n.to_be_bytes()).await.ok()?;
    tx.write_all(&h.finalize()).await.ok()?;
    tx.finish().ok()?;
    let _ = tx.stopped().await;
    Some(())
}

/// The client half: send `len` seeded bytes, check the server's count and
/// sha256. Connection errors are returned (the crash cell expects one). With a
/// `gate`, the second half waits for it (so a fault lands mid-transfer).
async fn send_verified(
    conn: &quinn::Connection,
    len: u64,
    seed: u64,
    mut gate: Option<tokio::sync::oneshot::Receiver<()>>,
) -> Result<(), String> {
    let (mut tx, mut rx) = conn.open_bi().await.map_err(|e| e.to_string())?;
    let (mut h, mut buf) = (Sha256::new(), vec![0u8; 64 * 1024]);
    let (mut left, mut i) = (len, 0);
    while left > 0 {
        if left <= len / 2 {
            if let Some(g) = gate.take() {
                g.await.map_err(|e| e.to_string())?;
            }
        }
        let n = left.min(buf.len() as u64) as usize;
        fill_chunk(&mut buf[..n], seed, i);
        h.update(&buf[..n]);
        tx.write_all(&buf[..n]).await.map_err(|e| e.to_string())?;
        left -= n as u64;
        i += 1;
    }
    tx.finish().map_err(|e| e.to_string())?;
    let reply = rx.read_to_end(40).await.map_err(|e| e.to_string())?;
    assert_eq!(reply.len(), 40, "reply length");
    assert_eq!(u64::from_be_bytes(reply[..8].try_into().unwrap()), len);
    assert_eq!(
        reply[8..],
        h.finalize()[..],
        "sha256 of what arrived equals what was sent"
    );
    Ok(())
}

struct QuinnSetup {
    fabric: SimFabric,
    server_sock: SimSocket,
    client_sock: SimSocket,
    ep_cfg: quinn::EndpointConfig,
    certs: common::Certs,
    client: quinn::Endpoint,
}

fn quinn_setup(rt: &tokio::runtime::Runtime, fault: Fault, idle_timeout: Duration) -> QuinnSetup {
    let fabric = SimFabric::new(fault.sim());
    let (server_sock, _) = socket_on(&fabric, gid(1, false), SocketConfig::default());
    let (client_sock, _) = socket_on(&fabric, gid(2, false), SocketConfig::default());
    let certs = common::certs_with(server_sock.mtu(), idle(idle_timeout));
    // One config for the server and its restart: the same stateless reset key,
    // as a server that keeps it across restarts (RFC 9000 §10.3).
    let ep_cfg = quinn_adapter::FabricConfig::new(server_sock.mtu())
        .routing_key(SERVER_KEY)
        .endpoint_config();
    let client = {
        let _g = rt.enter();
        common::endpoint(&client_sock, None, 0xc1)
    };
    QuinnSetup {
        fabric,
        server_sock,
        client_sock,
        ep_cfg,
        certs,
        client,
    }
}

impl QuinnSetup {
    async fn connect(&self) -> quinn::Connection {
        let addr = self.client_sock.peer_addr(self.server_sock.ud_addr());
        self.client
            .connect_with(self.certs.client.clone(), addr, "localhost")
            .unwrap()
            .await
            .unwrap()
    }
}

/// The server crashes mid-transfer and restarts on the same UD address (its QP
/// survives; the QUIC endpoint is new). The client's next packets reach the new
/// endpoint, which answers with a stateless reset: the client fails at once
/// (not after its idle timeout), reconnects and completes a transfer.
fn quinn_crash_restart(rt: &tokio::runtime::Runtime) -> Measures {
    let fault = Fault::CrashRestart;
    let q = quinn_setup(rt, fault, IDLE);
    let (server_rt, server) =
        spawn_server(&q.server_sock, q.ep_cfg.clone(), q.certs.server.clone());
    let conn = rt.block_on(q.connect());
    let c2 = conn.clone();
    let (go_on, gate) = tokio::sync::oneshot::channel();
    let first = rt.spawn(async move { send_verified(&c2, LEN, 1, Some(gate)).await });
    // The first half on the wire; the second waits for the crash.
    let deadline = Instant::now() + CELL_TIMEOUT;
    while q.client_sock.stats().sent_bytes < LEN / 2 && !first.is_finished() {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_micros(500));
    }
    assert!(!first.is_finished(), "the first half failed");
    // Crash: every server task dropped unpolled; nothing is said to the client.
    drop(server);
    drop(server_rt);
    let crashed = Instant::now();
    let (server_rt, server) =
        spawn_server(&q.server_sock, q.ep_cfg.clone(), q.certs.server.clone());
    go_on.send(()).unwrap();
    let err = rt
        .block_on(first)
        .unwrap()
        .expect_err("the crash failed the transfer");
    let failed_after = crashed.elapsed();
    assert_eq!(
        conn.close_reason(),
        Some(ConnectionError::Reset),
        "the restarted server's stateless reset ended the connection ({err})"
    );
    let t = Instant::now();
    let conn = rt.block_on(q.connect());
    rt.block_on(send_verified(&conn, LEN, 2, None))
        .expect("transfer after the restart");
    let elapsed = t.elapsed();
    let m = Measures {
        bytes: LEN,
        elapsed,
        sim: q.fabric.stats(),
        client: q.client_sock.stats(),
        server: q.server_sock.stats(),
        imm_dropped: (
            q.client_sock.routing_stats().imm_mismatch,
            q.server_sock.routing_stats().imm_mismatch,
        ),
        quic_lost: conn.stats().path.lost_packets,
        note: format!(
            "stateless reset {} ms after the crash",
            failed_after.as_millis()
        ),
    };
    drop((server, server_rt));
    m
}

/// The server goes silent after a verified transfer (it crashes; its QP stays,
/// nobody answers): the client reports the idle timeout it set explicitly.
fn quinn_idle_timeout(rt: &tokio::runtime::Runtime) -> Measures {
    let fault = Fault::IdleTimeout;
    let q = quinn_setup(rt, fault, SHORT_IDLE);
    let (server_rt, server) =
        spawn_server(&q.server_sock, q.ep_cfg.clone(), q.certs.server.clone());
    let conn = rt.block_on(q.connect());
    let t = Instant::now();
    rt.block_on(send_verified(&conn, LEN / 2, 3, None)).unwrap();
    let elapsed = t.elapsed();
    drop(server);
    drop(server_rt);
    let silent = Instant::now();
    let reason = rt
        .block_on(async { tokio::time::timeout(CELL_TIMEOUT, conn.closed()).await })
        .expect("the client reported a close");
    let after = silent.elapsed();
    assert_eq!(reason, ConnectionError::TimedOut);
    assert!(
        after <= SHORT_IDLE_BOUND,
        "closed {after:?} after the peer went silent: the explicit {SHORT_IDLE:?} idle timeout applies"
    );
    Measures {
        bytes: LEN / 2,
        elapsed,
        sim: q.fabric.stats(),
        client: q.client_sock.stats(),
        server: q.server_sock.stats(),
        imm_dropped: (
            q.client_sock.routing_stats().imm_mismatch,
            q.server_sock.routing_stats().imm_mismatch,
        ),
        quic_lost: conn.stats().path.lost_packets,
        note: format!(
            "timed out {} ms after the peer went silent",
            after.as_millis()
        ),
    }
}

// --------------------------------------------------------------- engine driver

/// An engine pair for `fault`, and the server's config (for a restart).
fn engine_pair(fault: Fault, idle_timeout: Duration) -> (EnginePair, EngineConfig) {
    let sim = fault.sim();
    let mtu = sim.mtu.bytes();
    let (ccfg, mut scfg) = configs_with(mtu, AcceptPolicy::AcceptAll, idle(idle_timeout));
    scfg.socket = fault.server_socket();
    let p = EnginePair::from_configs(SimFabric::new(sim), ccfg, scfg.clone());
    (p, scfg)
}

fn engine_cell(fault: Fault) -> Measures {
    match fault {
        Fault::CrashRestart => engine_crash_restart(),
        Fault::IdleTimeout => engine_idle_timeout(),
        _ => engine_transfer_cell(fault),
    }
}

fn engine_transfer_cell(fault: Fault) -> Measures {
    let (mut p, _) = engine_pair(fault, IDLE);
    let (c, s) = p.connect();
    let (client_before, server_before) = (p.client.local_addr(), p.server.local_addr());
    let mut forger =
        (fault == Fault::CorruptHeader).then(|| HeaderForger::new(&p.fabric, gid(9, false)));
    let mut forged = Forged::default();
    let (mut first, mut second) = (false, false);
    let t = Instant::now();
    engine_transfer(&mut p, c, s, LEN, fault.seed(), |p, _| {
        // Thresholds on the wire, not on what the engine buffered (the stream
        // window takes the whole transfer at once).
        let sent = p.client.socket_stats().sent_bytes;
        match fault {
            Fault::Migration if !first && sent >= LEN / 2 => {
                p.client_qp.set_gid(moved_gid());
                first = true;
            }
            Fault::QpError => {
                if !first && sent >= LEN / 3 {
                    p.server_qp.fail();
                    first = true;
                }
                if !second && sent >= 2 * LEN / 3 {
                    p.client_qp.fail();
                    second = true;
                }
            }
            Fault::CorruptHeader if !first && sent >= LEN / 4 => {
                let to = p.server.local_addr();
                forged = forger
                    .as_mut()
                    .unwrap()
                    .inject(to, SERVER_KEY, FORGED_PER_KIND);
                first = true;
            }
            _ => {}
        }
    });
    let elapsed = t.elapsed();
    let cs = p.client.conn_stats(c).unwrap();
    let ss = p.server.conn_stats(s).unwrap();
    let m = Measures {
        bytes: LEN,
        elapsed,
        sim: p.fabric.stats(),
        client: p.client.socket_stats(),
        server: p.server.socket_stats(),
        imm_dropped: (
            p.client.routing_stats().imm_mismatch,
            p.server.routing_stats().imm_mismatch,
        ),
        quic_lost: cs.path.lost_packets + ss.path.lost_packets,
        note: format!("rtt {:?}", cs.path.rtt),
    };
    check_common(fault, &m, forged);
    match fault {
        Fault::Migration => {
            let now = p.client.local_addr();
            assert_eq!(now.gid, moved_gid());
            assert_eq!(p.server.remote_addr(s).unwrap(), now, "the server followed");
            assert_ne!(now, client_before);
        }
        Fault::QpError => {
            assert_eq!(p.client.local_addr(), client_before);
            assert_eq!(p.server.local_addr(), server_before);
        }
        Fault::DelayJitter => {
            assert!(
                cs.path.rtt >= 2 * DELAY,
                "RTT {:?} shows the delay",
                cs.path.rtt
            );
        }
        _ => {}
    }
    m
}

/// Poll only the client until its connection `c` is lost; the reason.
fn client_until_lost(p: &mut EnginePair, c: quic_rdma::engine::ConnHandle) -> CloseReason {
    let deadline = Instant::now() + CELL_TIMEOUT;
    while Instant::now() < deadline {
        p.cev.clear();
        p.client.poll(Instant::now(), &mut p.cev);
        for e in &p.cev {
            if let Event::ConnectionLost { conn, reason } = *e {
                if conn == c {
                    return reason;
                }
            }
        }
    }
    panic!("the client never reported the connection lost");
}

/// The server engine crashes mid-transfer (dropped with its QP, saying nothing)
/// and restarts on the same port. The `sim` fabric cannot recreate a QPN and an
/// `Engine` owns its QP, so the restart has a new QPN: the client's packets to
/// the old one are dropped by the port (counted as unknown QPN), no stateless
/// reset can come back, and the client fails by its (short, explicit) idle
/// timeout, then reconnects to the new address and completes a transfer.
fn engine_crash_restart() -> Measures {
    let fault = Fault::CrashRestart;
    let (mut p, scfg) = engine_pair(fault, SHORT_IDLE);
    let (c, _) = p.connect();
    let old_server = p.server.local_addr();
    let stream = p.client.open_bi(c).unwrap();
    let mut src = Source::new(stream, LEN, 4);
    let deadline = Instant::now() + CELL_TIMEOUT;
    while p.client.socket_stats().sent_bytes < LEN / 2 {
        assert!(Instant::now() < deadline, "the first transfer stalled");
        src.pump(&mut p.client, c);
        p.step();
    }
    // Crash and restart on the same GID.
    let qp = p
        .fabric
        .create_qp(gid(1, false), SimQpOptions::default())
        .unwrap();
    p.server_qp = qp.handle();
    drop(std::mem::replace(
        &mut p.server,
        Engine::new(qp, scfg).unwrap(),
    ));
    let crashed = Instant::now();
    let reason = {
        // Keep the server polled: it is alive, only the old connection is gone.
        let deadline = Instant::now() + CELL_TIMEOUT;
        let mut lost = None;
        while lost.is_none() {
            assert!(Instant::now() < deadline, "the client never gave up");
            p.step();
            for e in &p.cev {
                if let Event::ConnectionLost { conn, reason } = *e {
                    if conn == c {
                        lost = Some(reason);
                    }
                }
            }
        }
        lost.unwrap()
    };
    let failed_after = crashed.elapsed();
    assert_eq!(reason, CloseReason::TimedOut);
    let new_server = p.server.local_addr();
    assert_eq!(new_server.gid, old_server.gid);
    assert_ne!(new_server.qpn, old_server.qpn);
    let dead_letters = p.server.socket_stats().provider.unknown_qpn;
    assert!(
        dead_letters > 0,
        "the client's packets to the crashed QPN were dropped by the port"
    );
    let (c2, s2) = p.connect();
    let t = Instant::now();
    engine_transfer(&mut p, c2, s2, LEN, 5, |_, _| {});
    let elapsed = t.elapsed();
    let cs = p.client.conn_stats(c2).unwrap();
    let ss = p.server.conn_stats(s2).unwrap();
    Measures {
        bytes: LEN,
        elapsed,
        sim: p.fabric.stats(),
        client: p.client.socket_stats(),
        server: p.server.socket_stats(),
        imm_dropped: (
            p.client.routing_stats().imm_mismatch,
            p.server.routing_stats().imm_mismatch,
        ),
        quic_lost: cs.path.lost_packets + ss.path.lost_packets,
        note: format!(
            "idle timeout {} ms after the crash; {dead_letters} packets to the dead QPN",
            failed_after.as_millis()
        ),
    }
}

/// After a verified transfer the server stops being polled (alive, silent):
/// the client reports its explicit idle timeout.
fn engine_idle_timeout() -> Measures {
    let (mut p, _) = engine_pair(Fault::IdleTimeout, SHORT_IDLE);
    let (c, s) = p.connect();
    let t = Instant::now();
    engine_transfer(&mut p, c, s, LEN / 2, 6, |_, _| {});
    let elapsed = t.elapsed();
    let cs = p.client.conn_stats(c).unwrap();
    let ss = p.server.conn_stats(s).unwrap();
    let silent = Instant::now();
    let reason = client_until_lost(&mut p, c);
    let after = silent.elapsed();
    assert_eq!(reason, CloseReason::TimedOut);
    assert!(
        after <= SHORT_IDLE_BOUND,
        "closed {after:?} after the peer went silent: the explicit {SHORT_IDLE:?} idle timeout applies"
    );
    Measures {
        bytes: LEN / 2,
        elapsed,
        sim: p.fabric.stats(),
        client: p.client.socket_stats(),
        server: p.server.socket_stats(),
        imm_dropped: (
            p.client.routing_stats().imm_mismatch,
            p.server.routing_stats().imm_mismatch,
        ),
        quic_lost: cs.path.lost_packets + ss.path.lost_packets,
        note: format!(
            "timed out {} ms after the peer went silent",
            after.as_millis()
        ),
    }
}

// ---------------------------------------------------------------- the matrix

/// A driver's cell runner.
type Cell = fn(Fault) -> Measures;

/// Run `cell(fault)` on its own thread, bounded by [`CELL_TIMEOUT`].
fn run_cell(driver: &str, fault: Fault, cell: Cell) -> Result<Measures, String> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name(format!("{driver}: {}", fault.name()))
        .spawn(move || {
            let r = std::panic::catch_unwind(|| cell(fault));
            let _ = tx.send(r.map_err(|e| {
                e.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "panicked".into())
            }));
        })
        .unwrap();
    match rx.recv_timeout(CELL_TIMEOUT) {
        Ok(r) => r,
        Err(_) => Err(format!("did not finish within {CELL_TIMEOUT:?}")),
    }
}

fn sim_cell(s: &FabricStats) -> String {
    let parts: Vec<String> = [
        ("lost", s.lost),
        ("dup", s.duplicated),
        ("reord", s.reordered),
        ("corrupt", s.corrupted),
    ]
    .iter()
    .filter(|(_, n)| *n > 0)
    .map(|(k, n)| format!("{k} {n}"))
    .collect();
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(", ")
    }
}

fn drops_cell(c: &SocketStats, s: &SocketStats, imm: (u64, u64)) -> String {
    let mut parts = Vec::new();
    for (side, st, imm) in [("c", c, imm.0), ("s", s, imm.1)] {
        let d = st.provider;
        for (k, n) in [
            ("no_recv", d.no_recv_posted),
            ("bad_pkey", d.bad_pkey),
            ("bad_qkey", d.bad_qkey),
            ("unknown_qpn", d.unknown_qpn),
            ("too_long", d.too_long),
            ("imm", imm),
            ("bad_grh", st.drop_bad_grh),
            ("rx_err", st.recv_errors),
        ] {
            if n > 0 {
                parts.push(format!("{side}.{k} {n}"));
            }
        }
    }
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(", ")
    }
}

#[test]
fn fault_matrix() {
    let started = Instant::now();
    let mut table = String::from(
        "| driver | fault | bytes | ms | sim faults | socket drops by cause (c/s) \
         | QUIC lost pkts | AH rebuilt | QP recoveries | result |\n\
         |---|---|---:|---:|---|---|---:|---:|---:|---|\n",
    );
    let (mut failed, mut cells) = (Vec::new(), 0);
    let drivers: [(&str, Cell); 2] = [("quinn", quinn_cell), ("engine", engine_cell)];
    for (driver, cell) in drivers {
        for fault in FAULTS {
            // FAULT_MATRIX_ONLY=<substring of "driver / fault">: run a subset (debugging).
            let id = format!("{driver} / {}", fault.name());
            if std::env::var("FAULT_MATRIX_ONLY").is_ok_and(|f| !id.contains(&f)) {
                continue;
            }
            cells += 1;
            match run_cell(driver, fault, cell) {
                Ok(m) => {
                    let _ = writeln!(
                        table,
                        "| {driver} | {} | {} | {} | {} | {} | {} | {} | {} | ok: {} |",
                        fault.name(),
                        m.bytes,
                        m.elapsed.as_millis(),
                        sim_cell(&m.sim),
                        drops_cell(&m.client, &m.server, m.imm_dropped),
                        m.quic_lost,
                        m.client.ah_rebuilt + m.server.ah_rebuilt,
                        m.client.qp_recoveries + m.server.qp_recoveries,
                        m.note,
                    );
                }
                Err(e) => {
                    let e = e.replace('\n', " ").replace('|', "/");
                    let _ = writeln!(
                        table,
                        "| {driver} | {} | | | | | | | | **FAILED**: {e} |",
                        fault.name()
                    );
                    failed.push(format!("{driver} / {}: {e}", fault.name()));
                }
            }
        }
    }
    let _ = writeln!(
        table,
        "\n{} cells in {:.1} s; c = client (data sender), s = server (data receiver). \
         A QPN change (quinn's rebind) is tested by `quinn_rebind_to_new_qpn`, quinn \
         only: the engine cannot change its QP.",
        cells,
        started.elapsed().as_secs_f64()
    );
    println!("\n{table}");
    // CARGO_TARGET_TMPDIR is <target>/tmp: the table goes next to it.
    let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .join("fault-matrix.md");
    std::fs::write(&out, &table).unwrap();
    println!("table written to {}", out.display());
    assert!(failed.is_empty(), "failed cells:\n{}", failed.join("\n"));
}

/// The client moves to a new queue pair (its QPN changes) mid-transfer through
/// quinn's `Endpoint::rebind_abstract`. The new socket comes from
/// `RdmaUdpSocket::rebind`, which shares the old socket's peer table, so the
/// synthetic address quinn keeps for the server still resolves; the transfer
/// completes, the server follows the client to its new QPN, and the traffic
/// moves to the new socket (checked in `quinn_transfer_cell`).
#[test]
fn quinn_rebind_to_new_qpn() {
    let m = run_cell("quinn", Fault::MigrationQpn, quinn_cell).unwrap_or_else(|e| panic!("{e}"));
    println!(
        "{} in {} ms; quic lost {}",
        Fault::MigrationQpn.name(),
        m.elapsed.as_millis(),
        m.quic_lost
    );
}
