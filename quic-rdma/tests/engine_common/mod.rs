//! The engine pair harness: a client and a server [`Engine`] over one `sim`
//! fabric, driven by one loop on the test thread. It shares the quinn
//! harness's certificates, GIDs and test data (`tests/common`), so both
//! transports are exercised with the same inputs.
//!
//! Time: [`EnginePair::new`] and [`EnginePair::with`] run on a fabric on the
//! caller's clock (`SimFabric::manual`): the harness keeps the time
//! ([`EnginePair::now`]), reads the wall clock once for the epoch, and a
//! step that finds nothing to do moves time straight to the next instant
//! anything is due (a QUIC timer or a delayed packet), as quinn's `Pair`
//! does. So timers fire at their exact instants, however slow the machine,
//! and nothing sleeps. [`EnginePair::from_configs`] keeps the clock of the
//! fabric it is given: the soak and fault-matrix tests, which measure wall
//! time on purpose, pass a real-time one.
#![allow(dead_code, unreachable_pub)]

#[path = "../common/mod.rs"]
pub mod common;

use std::time::Instant;

use quic_rdma::engine::{
    AcceptPolicy, ConnHandle, Engine, EngineConfig, EngineError, Event, StreamId,
};
use quic_rdma::fabric::sim::{SimClock, SimConfig, SimFabric, SimQp, SimQpHandle, SimQpOptions};
use quic_rdma::fabric::{Gid, UdQueuePair};
use quic_rdma::socket::SocketConfig;
use sha2::{Digest, Sha256};

pub use common::{fill_chunk, gid};

/// Loop iterations after which a harness loop gives up (a hang guard, not a timing check).
pub const MAX_ITERS: u64 = 200_000_000;

/// A client and a server engine over one `sim` fabric.
pub struct EnginePair {
    pub fabric: SimFabric,
    pub client: Engine<SimQp>,
    pub server: Engine<SimQp>,
    pub client_qp: SimQpHandle,
    pub server_qp: SimQpHandle,
    /// Events of the last step, per side.
    pub cev: Vec<Event>,
    pub sev: Vec<Event>,
    /// The harness's time on a manual-clock fabric (`None`: the wall clock).
    virtual_now: Option<Instant>,
}

/// Engine configs (client, server) trusting one fresh self-signed "localhost" cert.
pub fn configs(mtu: usize, accept: AcceptPolicy) -> (EngineConfig, EngineConfig) {
    configs_with(mtu, accept, |_| {})
}

/// Like [`configs`], with `tweak` applied to both sides' transport (e.g. an
/// explicit idle timeout a test depends on).
pub fn configs_with(
    mtu: usize,
    accept: AcceptPolicy,
    tweak: impl Fn(&mut quinn_proto::TransportConfig),
) -> (EngineConfig, EngineConfig) {
    // The engine's own timers (its default transport), not the quinn adapter's.
    let certs = common::certs_with(mtu, |t| {
        quic_rdma::quic::Liveness::default().apply(t);
        tweak(t)
    });
    let client = EngineConfig {
        client: Some(certs.client),
        routing_key: 0xc1,
        socket: SocketConfig::default(),
        ..EngineConfig::default()
    };
    let server = EngineConfig {
        server: Some(std::sync::Arc::new(certs.server)),
        accept,
        routing_key: 0x5e,
        ..EngineConfig::default()
    };
    (client, server)
}

impl EnginePair {
    pub fn new(cfg: SimConfig) -> Self {
        Self::with(cfg, AcceptPolicy::AcceptAll)
    }

    /// A pair on a real-time fabric, for tests that are not about time and
    /// poll with the wall clock themselves (the allocation counter).
    pub fn real_time(cfg: SimConfig) -> Self {
        // What the socket offers QUIC: above the fabric MTU when it segments.
        let mtu = quic_rdma::socket::segment::datagram_mtu(cfg.mtu.bytes());
        let (ccfg, scfg) = configs(mtu, AcceptPolicy::AcceptAll);
        Self::from_configs(SimFabric::new(cfg), ccfg, scfg)
    }

    /// A pair on a fabric on the harness's clock (see the module docs).
    pub fn with(cfg: SimConfig, accept: AcceptPolicy) -> Self {
        // What the socket offers QUIC: above the fabric MTU when it segments.
        let mtu = quic_rdma::socket::segment::datagram_mtu(cfg.mtu.bytes());
        // The one wall-clock read: the epoch of virtual time.
        let fabric = SimFabric::manual(cfg, Instant::now());
        let (ccfg, scfg) = configs(mtu, accept);
        Self::from_configs(fabric, ccfg, scfg)
    }

    pub fn from_configs(fabric: SimFabric, ccfg: EngineConfig, scfg: EngineConfig) -> Self {
        let sqp = fabric
            .create_qp(gid(1, false), SimQpOptions::default())
            .unwrap();
        let cqp = fabric
            .create_qp(gid(2, false), SimQpOptions::default())
            .unwrap();
        let (server_qp, client_qp) = (sqp.handle(), cqp.handle());
        let virtual_now = match fabric.config().clock {
            SimClock::Manual { .. } => Some(fabric.now()),
            _ => None,
        };
        EnginePair {
            server: Engine::new(sqp, scfg).unwrap(),
            client: Engine::new(cqp, ccfg).unwrap(),
            fabric,
            client_qp,
            server_qp,
            cev: Vec::with_capacity(256),
            sev: Vec::with_capacity(256),
            virtual_now,
        }
    }

    /// The harness's time: virtual on a manual-clock fabric, else the wall
    /// clock. Engine calls made between steps take this `now`.
    pub fn now(&self) -> Instant {
        self.virtual_now.unwrap_or_else(Instant::now)
    }

    /// Whether time is virtual (the fabric is on the harness's clock).
    pub fn is_virtual(&self) -> bool {
        self.virtual_now.is_some()
    }

    /// Poll both engines once at [`EnginePair::now`]; their events are in
    /// `cev` / `sev`. In virtual time a poll that moved nothing (no event, no
    /// packet sent or delivered) is followed by a jump to the next due
    /// instant and a poll there: what the caller did between steps happens
    /// at the instant the last step ended, and idle time costs nothing.
    pub fn step(&mut self) {
        if !self.poll_both() {
            if let Some(t) = self.next_instant() {
                let now = self.virtual_now.as_mut().expect("virtual time");
                *now = (*now).max(t);
                self.poll_both();
            }
        }
    }

    /// One poll of each side; whether anything moved (always `true` in real time).
    fn poll_both(&mut self) -> bool {
        let now = self.now();
        let before = self.fabric.stats();
        self.fabric.advance(now);
        self.cev.clear();
        self.sev.clear();
        self.client.poll(now, &mut self.cev);
        self.server.poll(now, &mut self.sev);
        self.fabric.advance(now);
        let after = self.fabric.stats();
        !self.is_virtual()
            || !self.cev.is_empty()
            || !self.sev.is_empty()
            || (after.sent, after.delivered) != (before.sent, before.delivered)
    }

    /// The next instant anything is due in virtual time: a timer of either
    /// engine or a packet held on the wire (`None` in real time, or when
    /// nothing at all is pending).
    pub fn next_instant(&mut self) -> Option<Instant> {
        if !self.is_virtual() {
            return None;
        }
        [
            self.fabric.next_due(),
            self.client.next_deadline(),
            self.server.next_deadline(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Step until `done` says so (it sees both sides' events of each step).
    pub fn run_until(&mut self, mut done: impl FnMut(&mut EnginePair) -> bool) {
        for _ in 0..MAX_ITERS {
            self.step();
            if done(self) {
                return;
            }
        }
        panic!("harness loop did not finish");
    }

    /// Handshake: the client's and the server's handle of the new connection.
    pub fn connect(&mut self) -> (ConnHandle, ConnHandle) {
        let server_addr = self.server.local_addr();
        let c = self
            .client
            .connect(self.now(), server_addr, "localhost")
            .unwrap();
        let (mut c_ok, mut s_conn) = (false, None);
        self.run_until(|p| {
            c_ok |= p.cev.contains(&Event::Connected { conn: c });
            for e in &p.sev {
                if let Event::Connected { conn } = e {
                    s_conn = Some(*conn);
                }
            }
            c_ok && s_conn.is_some()
        });
        (c, s_conn.unwrap())
    }
}

/// The sending half of a verified transfer: seeded data, written as flow control allows.
pub struct Source {
    pub stream: StreamId,
    len: u64,
    seed: u64,
    sent: u64,
    chunk: Vec<u8>,
    chunk_i: u64,
    off: usize,
    filled: usize,
    finished: bool,
    hash: Sha256,
}

impl Source {
    pub fn new(stream: StreamId, len: u64, seed: u64) -> Self {
        Source {
            stream,
            len,
            seed,
            sent: 0,
            chunk: vec![0; 64 * 1024],
            chunk_i: 0,
            off: 0,
            filled: 0,
            finished: false,
            hash: Sha256::new(),
        }
    }

    /// Bytes handed to the engine so far.
    pub fn sent(&self) -> u64 {
        self.sent
    }

    /// Write what fits; finish the stream after the last byte.
    pub fn pump<Q: UdQueuePair>(&mut self, e: &mut Engine<Q>, conn: ConnHandle) {
        while self.sent < self.len {
            if self.off == self.filled {
                let n = (self.len - self.sent).min(self.chunk.len() as u64) as usize;
                fill_chunk(&mut self.chunk[..n], self.seed, self.chunk_i);
                self.hash.update(&self.chunk[..n]);
                self.chunk_i += 1;
                self.off = 0;
                self.filled = n;
            }
            match e.write(conn, self.stream, &self.chunk[self.off..self.filled]) {
                Ok(n) => {
                    self.off += n;
                    self.sent += n as u64;
                }
                Err(EngineError::WouldBlock) => return,
                Err(err) => panic!("write: {err}"),
            }
        }
        if !self.finished {
            e.finish(conn, self.stream).unwrap();
            self.finished = true;
        }
    }

    pub fn digest(&self) -> [u8; 32] {
        assert_eq!(self.sent, self.len);
        self.hash.clone().finalize().into()
    }
}

/// The receiving half: reads a stream to its end, counting and hashing.
pub struct Sink {
    pub stream: StreamId,
    pub received: u64,
    pub fin: bool,
    buf: Vec<u8>,
    hash: Sha256,
    pub data: Option<Vec<u8>>,
}

impl Sink {
    /// `keep`: also keep the bytes (for small replies).
    pub fn new(stream: StreamId, keep: bool) -> Self {
        Sink {
            stream,
            received: 0,
            fin: false,
            buf: vec![0; 64 * 1024],
            hash: Sha256::new(),
            data: keep.then(Vec::new),
        }
    }

    pub fn pump<Q: UdQueuePair>(&mut self, e: &mut Engine<Q>, conn: ConnHandle) {
        while !self.fin {
            match e.read(conn, self.stream, &mut self.buf) {
                Ok(r) => {
                    self.hash.update(&self.buf[..r.len]);
                    if let Some(d) = &mut self.data {
                        d.extend_from_slice(&self.buf[..r.len]);
                    }
                    self.received += r.len as u64;
                    self.fin = r.fin;
                }
                Err(EngineError::WouldBlock) => return,
                Err(err) => panic!("read: {err}"),
            }
        }
    }

    pub fn digest(&self) -> [u8; 32] {
        self.hash.clone().finalize().into()
    }
}

/// Send `len` bytes client → server on a fresh stream; the server answers with
/// the byte count and sha256 it computed; assert both equal what was sent.
/// `during(pair, bytes_sent)` runs every step (e.g. to migrate mid-transfer).
pub fn transfer(
    p: &mut EnginePair,
    c: ConnHandle,
    s: ConnHandle,
    len: u64,
    seed: u64,
    mut during: impl FnMut(&mut EnginePair, u64),
) {
    let stream = p.client.open_bi(c).unwrap();
    let mut src = Source::new(stream, len, seed);
    let mut reply = Sink::new(stream, true);
    let mut sink: Option<Sink> = None;
    let mut answer: Option<Source> = None;
    let mut answer_bytes = Vec::new();
    src.pump(&mut p.client, c);
    for _ in 0..MAX_ITERS {
        p.step();
        during(p, src.sent());
        for ev in &p.sev {
            if let Event::StreamOpened { conn, stream } = *ev {
                assert_eq!(conn, s);
                sink = Some(Sink::new(stream, false));
            }
        }
        src.pump(&mut p.client, c);
        if let Some(k) = &mut sink {
            k.pump(&mut p.server, s);
            if k.fin && answer.is_none() {
                answer_bytes.extend_from_slice(&k.received.to_be_bytes());
                answer_bytes.extend_from_slice(&k.digest());
                let n = p.server.write(s, k.stream, &answer_bytes).unwrap();
                assert_eq!(n, 40);
                p.server.finish(s, k.stream).unwrap();
                answer = Some(Source::new(k.stream, 0, 0));
            }
        }
        reply.pump(&mut p.client, c);
        if reply.fin {
            let got = reply.data.as_ref().unwrap();
            assert_eq!(got.len(), 40, "reply length");
            assert_eq!(
                u64::from_be_bytes(got[..8].try_into().unwrap()),
                len,
                "byte count"
            );
            assert_eq!(
                &got[8..],
                &src.digest()[..],
                "sha256 of what arrived equals what was sent"
            );
            return;
        }
    }
    panic!("transfer did not finish");
}

/// The GID the migration test moves the client to.
pub fn moved_gid() -> Gid {
    gid(3, false)
}
