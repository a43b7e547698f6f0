//! Rows: quic-rdma's poll-mode engine, busy-polled, over any UD provider.
//!
//! Each side owns one [`Engine`] on its own pinned thread and polls it in a
//! loop: spinning when the sides have a core each, yielding the CPU after an
//! idle poll when they share one (otherwise each side would burn its whole
//! time slice before the other could answer). The `+adaptive` rows
//! ([`EngineRow::adaptive`]) drive each side with the engine's spin-then-sleep
//! [`Waiter`] instead: they spin only while work arrives and for its budget
//! after, then sleep on the engine's readiness, so their CPU is what the work
//! needed rather than the wall time. For instruction counts
//! ([`set_idle_sleep`]) an idle side sleeps on the engine's waker instead, so
//! idle polls are not counted as work. A provider is a [`QpPairs`]: it makes
//! the client's and the server's queue pair.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Wake, Waker};
use std::time::{Duration, Instant};

use quic_rdma::engine::{
    ConnHandle, Engine, EngineConfig, EngineError, Event, IdleConfig, StreamId, Waiter,
};
use quic_rdma::fabric::sim::{SimConfig, SimFabric, SimQp, SimQpOptions};
use quic_rdma::fabric::{UdAddr, UdQueuePair};

use super::exchange::{
    bulk_client, bulk_server, handshakes_client, reply_ok, rtt_client, rtt_server, Driver,
};
use super::{
    BulkOutcome, BulkParams, HandshakeOutcome, ProcessSide, Row, RttOutcome, SentPackets,
    SideOutcome,
};
use crate::affinity::Placement;
use crate::cpu::{CpuSpan, CpuUsed};
use crate::data::{self, SinkBuf};
use crate::side::{run_pair, DoneOnDrop, HANG_GUARD};
use crate::tls::{Tls, SERVER_NAME};

/// Longest sleep of an idle side (a bound, in case a wake-up is missed).
const IDLE_PARK_MAX: Duration = Duration::from_millis(1);

/// See [`set_idle_sleep`].
static IDLE_SLEEP: AtomicBool = AtomicBool::new(false);

/// Make idle engine sides that share a core sleep until the engine's waker
/// fires (or its next timer) instead of yielding. Yielding answers fastest on
/// a shared core (the timed runs use it); sleeping keeps idle polls out of
/// instruction counts (`bulk-once --idle sleep`, used by `callgrind.sh`),
/// where `sched_yield` loops would otherwise add a timing-dependent amount.
/// Providers that signal packets only on a descriptor (`soft`) still yield.
pub fn set_idle_sleep(on: bool) {
    IDLE_SLEEP.store(on, Ordering::Relaxed);
}

/// Whether [`set_idle_sleep`] is on.
pub fn idle_sleep() -> bool {
    IDLE_SLEEP.load(Ordering::Relaxed)
}

/// A UD provider for the engine rows: makes (client, server) queue pairs.
pub trait QpPairs: Send + Sync {
    /// The provider's queue pair.
    type Qp: UdQueuePair;
    /// Short provider name (the row is `engine/<name>`).
    fn name(&self) -> String;
    /// One line on the provider's setup.
    fn description(&self) -> String;
    /// A fresh (client, server) pair that can reach each other.
    fn make(&self) -> anyhow::Result<(Self::Qp, Self::Qp)>;
    /// Whether a queue pair can reach one in another process.
    fn crosses_processes(&self) -> bool;
    /// One queue pair reachable from another process.
    fn make_one(&self) -> anyhow::Result<Self::Qp>;
}

/// The `sim` fabric: an ideal in-process NIC (MTU 4096, no faults).
#[derive(Debug)]
pub struct SimPairs {
    fabric: SimFabric,
    next: std::sync::atomic::AtomicU16,
}

impl Default for SimPairs {
    /// A fresh ideal fabric of its own.
    fn default() -> Self {
        SimPairs {
            fabric: SimFabric::new(SimConfig::default()),
            next: 1.into(),
        }
    }
}

impl QpPairs for SimPairs {
    type Qp = SimQp;

    fn name(&self) -> String {
        "sim".into()
    }

    fn description(&self) -> String {
        "sim fabric (in-process ideal NIC), MTU 4096".into()
    }

    fn make(&self) -> anyhow::Result<(SimQp, SimQp)> {
        let n = self.next.fetch_add(2, Ordering::Relaxed);
        let gid = |k: u16| std::net::Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 1, k).into();
        let c = self.fabric.create_qp(gid(n), SimQpOptions::default())?;
        let s = self.fabric.create_qp(gid(n + 1), SimQpOptions::default())?;
        Ok((c, s))
    }

    fn crosses_processes(&self) -> bool {
        false
    }

    fn make_one(&self) -> anyhow::Result<SimQp> {
        anyhow::bail!("the sim fabric lives inside one process: it cannot cross processes")
    }
}

/// Longest sleep of an adaptive side: it also watches flags set by the other
/// side's thread (`done`), which no engine readiness reports.
const WAITER_SLEEP_MAX: Duration = Duration::from_millis(20);

/// The engine, busy-polled (or spin-then-sleep: `idle`), over provider `P`.
#[derive(Debug)]
pub struct EngineRow<P> {
    pairs: P,
    tls: Tls,
    /// `Some`: each side runs a [`Waiter`] with this configuration.
    idle: Option<IdleConfig>,
}

impl EngineRow<SimPairs> {
    /// The engine over a fresh `sim` fabric.
    pub fn sim() -> Self {
        Self::new(SimPairs::default())
    }
}

impl<P: QpPairs> EngineRow<P> {
    /// The engine over `pairs`.
    pub fn new(pairs: P) -> Self {
        EngineRow {
            pairs,
            tls: Tls::new(),
            idle: None,
        }
    }

    /// This row with each side driven by the spin-then-sleep [`Waiter`]
    /// (the default [`IdleConfig`]); named `engine/<provider>+adaptive`.
    pub fn adaptive(mut self) -> Self {
        self.idle = Some(IdleConfig::default());
        self
    }

    /// This process's side of a two-process workload (see [`crate::procs`]):
    /// a server engine whose address is announced (`None`), or a client
    /// engine and the server's address.
    fn process_side(&self, side: ProcessSide<'_>) -> anyhow::Result<(Side<P::Qp>, Option<UdAddr>)> {
        let qp = self.pairs.make_one()?;
        match side {
            ProcessSide::Server(ready) => {
                let e = self.engine(qp, true)?;
                ready(e.local_addr().to_socket_addr())?;
                Ok((self.side(e, Placement::SeparateCores), None))
            }
            ProcessSide::Client(addr) => Ok((
                self.side(self.engine(qp, false)?, Placement::SeparateCores),
                Some(UdAddr::from_socket_addr(addr)?),
            )),
        }
    }

    fn side(&self, e: Engine<P::Qp>, place: Placement) -> Side<P::Qp> {
        let mut s = Side::new(e, place);
        s.waiter = self
            .idle
            .map(|cfg| Waiter::new(cfg).expect("an eventfd for the waiter"));
        s
    }

    /// Connect a client and a server, then leave the connection idle for
    /// `idle` with both sides polling as the row polls; the CPU each side's
    /// thread used meanwhile (client, server). Keep-alives (every 300 ms with
    /// the rows' transport) are the only packets.
    pub fn idle_cpu(&self, idle: Duration, place: Placement) -> anyhow::Result<(CpuUsed, CpuUsed)> {
        let (ce, se) = self.engines()?;
        let server_addr = se.local_addr();
        let done = AtomicBool::new(false);
        let done = &done;
        run_pair(
            place,
            move || {
                let _done = DoneOnDrop(done);
                let mut side = self.side(ce, place);
                let c = side.connect(&server_addr)?;
                let cpu = CpuSpan::start();
                let until = Instant::now() + idle;
                while Instant::now() < until {
                    side.poll()?;
                    side.check_lost(c)?;
                }
                let cpu = cpu.stop();
                side.close(c)?;
                Ok(cpu)
            },
            move || {
                let mut side = self.side(se, place);
                side.accept()?;
                let cpu = CpuSpan::start();
                let until = Instant::now() + idle;
                // The client may close first (its idle period began earlier).
                while Instant::now() < until && side.e.connection_count() > 0 {
                    side.poll()?;
                }
                let cpu = cpu.stop();
                side.linger(done)?;
                Ok(cpu)
            },
        )
    }

    /// Fresh (client, server) engines.
    fn engines(&self) -> anyhow::Result<EnginePair<P::Qp>> {
        let (cq, sq) = self.pairs.make()?;
        Ok((self.engine(cq, false)?, self.engine(sq, true)?))
    }

    /// An engine over `qp`: a server (accepting) or a client.
    fn engine(&self, qp: P::Qp, server: bool) -> anyhow::Result<Engine<P::Qp>> {
        // The socket's datagram MTU: above the fabric MTU below 2048, where
        // datagrams are segmented (docs/architecture.md §6).
        let mtu = quic_rdma::socket::segment::datagram_mtu(qp.attr().active_mtu.bytes());
        let transport = crate::tuning::transport(mtu);
        let config = if server {
            EngineConfig {
                server: Some(std::sync::Arc::new(self.tls.quinn_server(transport))),
                routing_key: 0x5e,
                ..EngineConfig::default()
            }
        } else {
            EngineConfig {
                client: Some(self.tls.quinn_client(transport)),
                routing_key: 0xc1,
                ..EngineConfig::default()
            }
        };
        Ok(Engine::new(qp, config)?)
    }
}

/// (client, server) engines.
type EnginePair<Q> = (Engine<Q>, Engine<Q>);

/// One side: an engine and its poll loop.
struct Side<Q: UdQueuePair> {
    e: Engine<Q>,
    ev: Vec<Event>,
    spin: bool,
    deadline: Instant,
    /// Unparks this side's thread (what the engine wakes when it has work).
    waker: Waker,
    /// The spin-then-sleep driver of the `+adaptive` rows.
    waiter: Option<Waiter>,
}

/// Wakes a parked thread.
struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

impl<Q: UdQueuePair> Side<Q> {
    fn new(e: Engine<Q>, place: Placement) -> Self {
        Side {
            e,
            ev: Vec::with_capacity(256),
            spin: place == Placement::SeparateCores,
            deadline: Instant::now() + HANG_GUARD,
            waker: Waker::from(Arc::new(Unpark(std::thread::current()))),
            waiter: None,
        }
    }

    /// Nothing to do on a shared core: give the core away (see [`set_idle_sleep`]).
    fn idle(&mut self) {
        if !idle_sleep() || self.e.readiness_fd().is_some() {
            std::thread::yield_now();
            return;
        }
        if self.e.arm(&self.waker) {
            return;
        }
        let now = Instant::now();
        let until = self
            .e
            .next_deadline()
            .map_or(IDLE_PARK_MAX, |d| d.saturating_duration_since(now))
            .min(IDLE_PARK_MAX);
        std::thread::park_timeout(until);
    }

    /// One poll; the events are in `self.ev`. Fails past the hang guard.
    fn poll(&mut self) -> anyhow::Result<()> {
        self.ev.clear();
        let now = Instant::now();
        let n = self.e.poll(now, &mut self.ev);
        if let Some(w) = &mut self.waiter {
            let limit = Some((now + WAITER_SLEEP_MAX).min(self.deadline));
            if w.wait(&mut self.e, now, n > 0, limit) == quic_rdma::engine::Wait::Spun
                && n == 0
                && !self.spin
            {
                std::thread::yield_now();
            }
        } else if n == 0 {
            if self.spin {
                std::hint::spin_loop();
            } else {
                self.idle();
            }
        }
        anyhow::ensure!(
            now < self.deadline,
            "engine side did not finish within {HANG_GUARD:?}"
        );
        Ok(())
    }

    /// Server in its own process: poll until the client closed the connection
    /// (bounded by the hang guard).
    fn linger_until_closed(&mut self) -> anyhow::Result<()> {
        while self.e.connection_count() > 0 {
            self.poll()?;
        }
        Ok(())
    }
}

impl<Q: UdQueuePair> Driver for Side<Q> {
    type Conn = ConnHandle;
    type Stream = StreamId;
    type Target = UdAddr;

    fn poll(&mut self) -> anyhow::Result<()> {
        Side::poll(self)
    }

    fn check_lost(&self, conn: ConnHandle) -> anyhow::Result<()> {
        for ev in &self.ev {
            if let Event::ConnectionLost { conn: c, reason } = ev {
                anyhow::ensure!(*c != conn, "connection lost: {reason:?}");
            }
        }
        Ok(())
    }

    fn connect(&mut self, server: &UdAddr) -> anyhow::Result<ConnHandle> {
        let c = self.e.connect(Instant::now(), *server, SERVER_NAME)?;
        loop {
            self.poll()?;
            self.check_lost(c)?;
            if self.ev.contains(&Event::Connected { conn: c }) {
                return Ok(c);
            }
        }
    }

    fn accept(&mut self) -> anyhow::Result<ConnHandle> {
        loop {
            self.poll()?;
            for ev in &self.ev {
                if let Event::Connected { conn } = ev {
                    return Ok(*conn);
                }
            }
        }
    }

    fn open_bi(&mut self, c: ConnHandle) -> anyhow::Result<StreamId> {
        Ok(self.e.open_bi(c)?)
    }

    fn accept_stream(&mut self, conn: ConnHandle) -> anyhow::Result<StreamId> {
        loop {
            for ev in &self.ev {
                if let Event::StreamOpened { conn: c, stream } = ev {
                    if *c == conn {
                        return Ok(*stream);
                    }
                }
            }
            self.poll()?;
            self.check_lost(conn)?;
        }
    }

    fn write_chunk(
        &mut self,
        c: ConnHandle,
        s: StreamId,
        chunk: &mut bytes::Bytes,
    ) -> anyhow::Result<Option<usize>> {
        match self.e.write_chunk(c, s, chunk) {
            Ok(n) => Ok(Some(n)),
            Err(EngineError::WouldBlock) => Ok(None),
            Err(err) => Err(err.into()),
        }
    }

    fn write_all(&mut self, c: ConnHandle, s: StreamId, data: &[u8]) -> anyhow::Result<()> {
        anyhow::ensure!(self.e.write(c, s, data)? == data.len(), "write refused");
        self.e.flush(Instant::now());
        Ok(())
    }

    fn finish(&mut self, c: ConnHandle, s: StreamId) -> anyhow::Result<()> {
        Ok(self.e.finish(c, s)?)
    }

    fn read_some(
        &mut self,
        c: ConnHandle,
        s: StreamId,
        buf: &mut [u8],
        got: &mut usize,
    ) -> anyhow::Result<bool> {
        match self.e.read(c, s, &mut buf[*got..]) {
            Ok(r) => {
                *got += r.len;
                Ok(r.fin)
            }
            Err(EngineError::WouldBlock) => Ok(false),
            Err(err) => Err(err.into()),
        }
    }

    fn close_now(&mut self, c: ConnHandle) -> anyhow::Result<()> {
        Ok(self.e.close(Instant::now(), c, 0, b"done")?)
    }

    fn drain(&mut self, limit: Duration) -> anyhow::Result<()> {
        let until = Instant::now() + limit;
        while self.e.connection_count() > 0 && Instant::now() < until {
            self.poll()?;
        }
        Ok(())
    }

    fn sent_packets(&self, c: ConnHandle) -> Option<SentPackets> {
        self.e.conn_stats(c).ok().map(|s| SentPackets::of(&s))
    }
}

impl<P: QpPairs> Row for EngineRow<P> {
    fn name(&self) -> String {
        let mode = if self.idle.is_some() { "+adaptive" } else { "" };
        format!("engine/{}{mode}", self.pairs.name())
    }

    fn description(&self) -> String {
        let drive = match self.idle {
            None => "busy-polled".to_string(),
            Some(c) => format!(
                "spin-then-sleep (engine::Waiter, budget {:?}..{:?} adaptive)",
                c.spin_min, c.spin_max
            ),
        };
        format!(
            "quic-rdma poll-mode engine over quinn-proto, {drive}, {}",
            self.pairs.description()
        )
    }

    fn bulk(&self, p: BulkParams, place: Placement) -> anyhow::Result<BulkOutcome> {
        let pattern = bytes::Bytes::from(data::pattern());
        let expected = p.verify.then(|| data::expected_digest(&pattern, p.bytes));
        let mut sink = SinkBuf::new(p.bytes, p.verify);
        let (ce, se) = self.engines()?;
        let server_addr = se.local_addr();
        let done = AtomicBool::new(false);
        let (pattern, sink_ref, done) = (&pattern, &mut sink, &done);
        let ((secs, ccpu, reply), scpu) = run_pair(
            place,
            move || {
                let _done = DoneOnDrop(done);
                bulk_client(&mut self.side(ce, place), &server_addr, p, pattern)
            },
            move || {
                let mut side = self.side(se, place);
                let cpu = bulk_server(&mut side, sink_ref)?;
                side.linger(done)?;
                Ok(cpu)
            },
        )?;
        let sha256_ok = sink.received() == p.bytes && reply_ok(reply, expected);
        Ok(BulkOutcome {
            bytes: p.bytes,
            secs,
            sha256_ok,
            client_cpu: ccpu,
            server_cpu: scpu,
        })
    }

    fn crosses_processes(&self) -> bool {
        self.pairs.crosses_processes()
    }

    fn bulk_side(&self, p: BulkParams, side: ProcessSide<'_>) -> anyhow::Result<SideOutcome> {
        match self.process_side(side)? {
            (mut side, None) => {
                let mut sink = SinkBuf::new(p.bytes, p.verify);
                let cpu = bulk_server(&mut side, &mut sink)?;
                side.linger_until_closed()?;
                Ok(SideOutcome {
                    secs: 0.0,
                    cpu,
                    ok: sink.received() == p.bytes,
                })
            }
            (side, Some(server)) => {
                let pattern = bytes::Bytes::from(data::pattern());
                let expected = p.verify.then(|| data::expected_digest(&pattern, p.bytes));
                let (secs, cpu, reply) = bulk_client(&mut { side }, &server, p, &pattern)?;
                Ok(SideOutcome {
                    secs,
                    cpu,
                    ok: reply_ok(reply, expected),
                })
            }
        }
    }

    fn rtt(&self, iters: usize, place: Placement) -> anyhow::Result<RttOutcome> {
        let (ce, se) = self.engines()?;
        let server_addr = se.local_addr();
        let done = AtomicBool::new(false);
        let done = &done;
        let ((samples, client_sent), server_sent) = run_pair(
            place,
            move || {
                let _done = DoneOnDrop(done);
                rtt_client(&mut self.side(ce, place), &server_addr, iters)
            },
            move || {
                let mut side = self.side(se, place);
                let sent = rtt_server(&mut side, done)?;
                side.linger(done)?;
                Ok(sent)
            },
        )?;
        Ok(RttOutcome {
            samples_ns: samples,
            sent: client_sent.zip(server_sent),
        })
    }

    fn handshakes(&self, count: usize, place: Placement) -> anyhow::Result<HandshakeOutcome> {
        let (ce, se) = self.engines()?;
        let server_addr = se.local_addr();
        let done = AtomicBool::new(false);
        let done = &done;
        let (secs, ()) = run_pair(
            place,
            move || {
                let _done = DoneOnDrop(done);
                handshakes_client(&mut self.side(ce, place), &server_addr, count)
            },
            move || {
                let mut side = self.side(se, place);
                side.linger(done)
            },
        )?;
        Ok(HandshakeOutcome {
            count: count as u64,
            secs,
        })
    }

    fn rtt_side(&self, iters: usize, side: ProcessSide<'_>) -> anyhow::Result<Vec<u64>> {
        match self.process_side(side)? {
            (mut side, None) => {
                // No other thread here to say the client is done: the
                // client's close ends the loop.
                rtt_server(&mut side, &AtomicBool::new(false))?;
                side.linger_until_closed()?;
                Ok(vec![])
            }
            (mut side, Some(server)) => Ok(rtt_client(&mut side, &server, iters)?.0),
        }
    }

    fn handshakes_side(&self, count: usize, side: ProcessSide<'_>) -> anyhow::Result<f64> {
        match self.process_side(side)? {
            (mut side, None) => {
                // Serve until `count` connections were accepted and closed.
                let mut accepted = 0;
                while accepted < count || side.e.connection_count() > 0 {
                    side.poll()?;
                    accepted += side
                        .ev
                        .iter()
                        .filter(|ev| matches!(ev, Event::Connected { .. }))
                        .count();
                }
                Ok(0.0)
            }
            (mut side, Some(server)) => handshakes_client(&mut side, &server, count),
        }
    }
}
