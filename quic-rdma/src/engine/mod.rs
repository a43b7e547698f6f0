//! The poll-mode engine: QUIC straight over quinn-proto and the UD socket
//! (docs/architecture.md §5), for callers that own one thread and busy-poll it.
//!
//! No runtime, no threads, no locks: the caller drives everything with
//! [`Engine::poll`], passing the current time, and may sleep until
//! [`Engine::next_deadline`] instead of spinning. One `poll`:
//! 1. retires send completions and retries a transmit the send queue refused;
//! 2. receives a batch of datagrams and feeds them to quinn-proto
//!    (`Endpoint::handle` → the connection, or a new incoming attempt);
//! 3. runs expired timers, exchanges endpoint events, and turns connection
//!    events into [`Event`]s;
//! 4. flushes every connection's transmits (GSO-style: one transmit of several
//!    segments is one `post_send`).
//!
//! In steady state no step allocates: received datagrams are copied into
//! chunks split per packet and reclaimed once quinn-proto and the application
//! dropped the pieces (`copy_arena`), as small stream writes and datagrams
//! are on the way out; transmits are built in the socket's
//! registered transmit buffers, which the send WRs point into (no copy) and
//! which return to the socket's pool on completion; events go into the
//! caller's reused `Vec`.
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Instant;
//! use quic_rdma::engine::{Engine, EngineConfig, Event};
//! use quic_rdma::fabric::sim::{SimFabric, SimQpOptions};
//! use quic_rdma::fabric::Gid;
//!
//! let fabric = SimFabric::new(Default::default());
//! let gid: Gid = "fd00::1".parse::<std::net::Ipv6Addr>()?.into();
//! let qp = fabric.create_qp(gid, SimQpOptions::default())?;
//! let mut engine = Engine::new(qp, EngineConfig::default())?;
//! let mut events = Vec::with_capacity(64);
//! engine.poll(Instant::now(), &mut events);
//! assert!(events.is_empty());
//! # Ok(()) }
//! ```

mod config;
mod connection;
mod copy_arena;
mod datagrams;
mod error;
mod events;
mod group;
mod handle;
mod idle;
mod io;
mod rtt;
mod stream_stats;
mod streams;
mod timestamps;
mod waiter;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

use self::copy_arena::CopyArena;
use quinn_proto::{ConnectionError, ConnectionStats, Dir, Endpoint, Incoming, VarInt};
use slab::Slab;

pub use config::{
    client_config, server_config, AcceptPolicy, EngineConfig, DEFAULT_DATAGRAM_RECV_BUFFER,
};
pub use datagrams::DatagramStats;
pub use error::EngineError;
pub use events::{CloseReason, Event, ZeroRtt};
pub use group::EngineGroup;
pub use handle::{ConnHandle, IncomingId};
pub use idle::{Idle, IdleConfig, IdlePolicy};
pub use quinn_proto::StreamId;
pub use rtt::RttStats;
pub use stream_stats::{StreamStats, ENDED_KEPT};
pub use streams::StreamRead;
pub use waiter::{Wait, WaitStats, Waiter};

use crate::fabric::{UdAddr, UdQueuePair};
use crate::quic::config::endpoint_config;
use crate::quic::peers::{PeerStats, PeerTable};
use crate::quic::retry::RetryPolicy;
use crate::quic::routing::{RoutingCheck, RoutingLog, RoutingStats};
use crate::socket::{SocketStats, TxBuf, UdSocket};
use connection::{Conn, ConnTable};
use io::PendingTransmit;

/// A single-threaded QUIC endpoint over one UD queue pair (see the [module docs](self)).
pub struct Engine<Q: UdQueuePair> {
    socket: UdSocket<Q>,
    endpoint: Endpoint,
    conns: ConnTable,
    incoming: Slab<(u32, Incoming)>,
    next_incoming_gen: u32,
    client: Option<quinn_proto::ClientConfig>,
    accept: AcceptPolicy,
    retry: RetryPolicy,
    /// Connections accepted from unvalidated addresses whose handshake is not
    /// complete: what [`RetryPolicy::Auto`] judges load by.
    unvalidated_handshakes: usize,
    has_server: bool,
    recv_batch: usize,
    mtu: usize,
    /// UD addresses ↔ the addresses quinn-proto sees (see [`crate::quic::peers`]).
    peers: PeerTable,
    /// What the receive path does with immediate data, and its counters.
    routing: RoutingCheck,
    routing_log: RoutingLog,
    /// Our address as last seen (a change means our GID moved: tell the connections).
    local: UdAddr,
    /// Received datagrams copied out of their registered buffers for
    /// quinn-proto, which keeps them until the application reads.
    rx_copies: CopyArena,
    /// Small stream writes and datagrams copied for quinn-proto, which keeps
    /// them until the peer acknowledges them.
    tx_copies: CopyArena,
    /// Where quinn-proto writes endpoint-level responses on the receive path
    /// (connection transmits go straight into the socket's transmit buffers).
    response_buf: Vec<u8>,
    /// A transmit the send queue refused, kept (in its transmit buffer) until it fits.
    pending: Option<PendingTransmit>,
    /// A transmit buffer taken but not written (its connection had nothing to
    /// send), kept for the next transmit instead of going back to the pool.
    tx_spare: Option<TxBuf>,
    /// Endpoint-level responses (stateless reset, version negotiation, refusals,
    /// retries) produced while the socket was busy receiving: rare, so owned.
    /// Addressed as quinn-proto sees the peer: sent through the peer table.
    responses: Vec<(SocketAddr, Vec<u8>)>,
    /// Responses dropped because too many were queued.
    responses_dropped: u64,
    /// Attempts answered with a Retry.
    retries: u64,
    /// Events produced inside the receive path, moved to the caller's buffer.
    staged: Vec<Event>,
    /// Connections freed in the last poll, with why they ended: the caller may
    /// still ask ([`Engine::close_reason`]) until the next poll.
    just_closed: Vec<(ConnHandle, Option<ConnectionError>)>,
    /// Datagrams received + transmits sent + timers run: moves when a poll did work.
    activity: u64,
    /// Bytes of received datagrams each connection holds for the application.
    datagram_limit: usize,
    /// Datagrams dropped unread, all connections (closed ones included).
    datagrams_dropped: u64,
}

/// MTU-sized datagrams per chunk of [`Engine::rx_copies`].
const RX_BUF_DATAGRAMS: usize = 64;

/// Chunk of [`Engine::tx_copies`]: 256 messages of 64 bytes. A copy pins its
/// chunk until acknowledged, so the chunk is kept small.
const TX_COPY_CHUNK: usize = 16 << 10;

/// Writes and datagrams up to this size are copied into
/// [`Engine::tx_copies`]; larger ones get their own allocation, as
/// quinn-proto's `write` makes (and a write that flow control cuts short
/// copies only what it takes).
const TX_COPY_MAX: usize = 1 << 10;

impl<Q: UdQueuePair> Engine<Q> {
    /// An engine over `qp`, with `cfg`. Builds the UD socket (registering its
    /// memory and filling the receive queue) and the quinn-proto endpoint, whose
    /// CIDs carry `cfg.routing_key` and whose datagrams are MTU-sized.
    pub fn new(qp: Q, cfg: EngineConfig) -> Result<Self, EngineError> {
        let socket = UdSocket::new(qp, cfg.socket.clone())?;
        let mtu = socket.mtu();
        if cfg.datagram_recv_buffer < mtu {
            // A buffer that cannot hold one datagram would drop every one.
            return Err(EngineError::InvalidArgument(
                "datagram_recv_buffer below the MTU",
            ));
        }
        if cfg.routing_key > crate::quic::cid::ROUTING_KEY_MASK {
            // Never silently masked: two endpoints meant to differ would collide.
            return Err(EngineError::InvalidArgument(
                "routing_key above 20 bits (ROUTING_KEY_MASK)",
            ));
        }
        let mut ep_cfg = endpoint_config(mtu, cfg.routing_key);
        if let Some(seed) = cfg.rng_seed {
            ep_cfg.rng_seed(Some(seed));
        }
        let has_server = cfg.server.is_some();
        // No MTU discovery: the fabric's active MTU is known and nothing above it passes.
        let endpoint = Endpoint::new(Arc::new(ep_cfg), cfg.server, false, None);
        let local = socket.local_addr();
        Ok(Engine {
            socket,
            endpoint,
            conns: ConnTable::new(),
            peers: PeerTable::new(cfg.peers, mtu),
            routing: cfg.routing,
            routing_log: RoutingLog::default(),
            incoming: Slab::new(),
            next_incoming_gen: 0,
            client: cfg.client,
            accept: cfg.accept,
            retry: cfg.retry,
            unvalidated_handshakes: 0,
            has_server,
            recv_batch: cfg.recv_batch.max(1),
            mtu,
            local,
            rx_copies: CopyArena::new(mtu * RX_BUF_DATAGRAMS),
            tx_copies: CopyArena::new(TX_COPY_CHUNK),
            response_buf: Vec::with_capacity(mtu),
            pending: None,
            tx_spare: None,
            responses: Vec::new(),
            responses_dropped: 0,
            retries: 0,
            staged: Vec::with_capacity(64),
            just_closed: Vec::new(),
            activity: 0,
            datagram_limit: cfg.datagram_recv_buffer,
            datagrams_dropped: 0,
        })
    }

    /// Our UD address: what a client passes to [`Engine::connect`].
    pub fn local_addr(&self) -> UdAddr {
        self.socket.local_addr()
    }

    /// The fabric's active MTU (the largest QUIC datagram).
    pub fn mtu(&self) -> usize {
        self.mtu
    }

    /// The UD socket's counters (sends, receives, drops by cause, AHs, ...).
    pub fn socket_stats(&self) -> SocketStats {
        self.socket.stats()
    }

    /// The peer table's counters and bounds (see [`crate::quic::PeerStats`]).
    pub fn peer_stats(&self) -> PeerStats {
        self.peers.stats()
    }

    /// The routing check's counters (plain SENDs accepted, mismatches dropped).
    pub fn routing_stats(&self) -> RoutingStats {
        self.routing_log.stats
    }

    /// Stateless responses (resets, version negotiation) dropped because the send
    /// queue stayed full while more were owed.
    pub fn responses_dropped(&self) -> u64 {
        self.responses_dropped
    }

    /// Attempts answered with a Retry (by [`EngineConfig::retry`], the
    /// [`AcceptPolicy`] or [`retry`](Self::retry)).
    pub fn retries(&self) -> u64 {
        self.retries
    }

    /// Connections accepted from addresses not validated yet whose handshake
    /// is not complete (what [`RetryPolicy::Auto`] judges load by).
    pub fn unvalidated_handshakes(&self) -> usize {
        self.unvalidated_handshakes
    }

    /// quinn-proto's statistics of one connection (RTT, congestion, losses, frames).
    pub fn conn_stats(&self, conn: ConnHandle) -> Result<ConnectionStats, EngineError> {
        Ok(self.conns.get_ref(conn)?.inner.stats())
    }

    /// The peer's current address (changes when it migrates).
    pub fn remote_addr(&self, conn: ConnHandle) -> Result<UdAddr, EngineError> {
        let a = self.conns.get_ref(conn)?.inner.remote_address();
        self.peers
            .ud_addr(a)
            .ok_or(EngineError::InvalidArgument("unknown remote"))
    }

    /// 0-RTT on `conn` (RFC 9001 §4.6): whether early data is possible (a
    /// client resuming a session with a server that allows it may open and
    /// write streams before [`Event::Connected`]; that data rides in 0-RTT
    /// packets) and, once connected, whether the server accepted it. A server
    /// that takes the ticket but then refuses the early data (its policy
    /// changed) makes quinn-proto discard the streams opened early: writes to
    /// them fail, and the application sends again after [`Event::Connected`].
    pub fn zero_rtt(&self, conn: ConnHandle) -> Result<ZeroRtt, EngineError> {
        let c = &self.conns.get_ref(conn)?.inner;
        Ok(ZeroRtt {
            possible: c.has_0rtt(),
            accepted: !c.is_handshaking() && c.accepted_0rtt(),
        })
    }

    /// Start a key update on `conn` now (RFC 9001 §6) instead of at the AEAD's
    /// confidentiality limit: rotates the 1-RTT packet keys at a moment of the
    /// application's choosing (a quiet one). `InvalidArgument` before the
    /// handshake is confirmed, when no key update is possible yet.
    pub fn force_key_update(&mut self, conn: ConnHandle) -> Result<(), EngineError> {
        let c = &mut self.conns.get(conn)?.inner;
        if c.is_handshaking() {
            return Err(EngineError::InvalidArgument(
                "key update before the handshake is confirmed",
            ));
        }
        c.force_key_update();
        Ok(())
    }

    /// Live connections (not yet drained).
    pub fn connection_count(&self) -> usize {
        self.conns.live()
    }

    /// The full reason a connection ended, once it has. Answers until the
    /// [`poll`](Self::poll) after the one that reported [`Event::ConnectionClosed`]
    /// (a connection that times out or is reset is lost and drained in one poll).
    pub fn close_reason(&self, conn: ConnHandle) -> Result<Option<&ConnectionError>, EngineError> {
        if let Some((_, e)) = self.just_closed.iter().find(|(h, _)| *h == conn) {
            return Ok(e.as_ref());
        }
        Ok(self.conns.get_ref(conn)?.error.as_ref())
    }

    /// The underlying socket (for inspection and provider controls).
    pub fn socket(&self) -> &UdSocket<Q> {
        &self.socket
    }

    /// Start a connection to `remote`, verifying the server's certificate
    /// against `server_name`. Reported as [`Event::Connected`] once the
    /// handshake completes; the first flight leaves on the next [`poll`](Self::poll).
    pub fn connect(
        &mut self,
        now: Instant,
        remote: UdAddr,
        server_name: &str,
    ) -> Result<ConnHandle, EngineError> {
        let cfg = self.client.clone().ok_or(EngineError::NoClientConfig)?;
        let addr = self.peers.admit(remote, now);
        let (ch, conn) = self.endpoint.connect(now, cfg, addr, server_name)?;
        Ok(self
            .conns
            .insert(ch, Conn::new(conn, self.datagram_limit, now)))
    }

    /// Accept a pending attempt (reported by [`Event::IncomingConnection`]).
    pub fn accept(&mut self, now: Instant, id: IncomingId) -> Result<ConnHandle, EngineError> {
        let inc = self.take_incoming(id)?;
        self.accept_incoming(now, inc)
            .map_err(EngineError::ConnectionLost)
    }

    /// Refuse a pending attempt: the client sees CONNECTION_REFUSED.
    pub fn refuse(&mut self, id: IncomingId) -> Result<(), EngineError> {
        let inc = self.take_incoming(id)?;
        self.refuse_incoming(inc);
        Ok(())
    }

    /// Answer a pending attempt with a Retry (address validation). Fails with
    /// `InvalidArgument` if the attempt already carries a validated token (then
    /// accept or refuse it); the attempt is consumed either way.
    pub fn retry(&mut self, id: IncomingId) -> Result<(), EngineError> {
        let inc = self.take_incoming(id)?;
        if self.retry_incoming(inc) {
            Ok(())
        } else {
            Err(EngineError::InvalidArgument(
                "attempt already validated: accept or refuse it",
            ))
        }
    }

    /// Drop a pending attempt without answering.
    pub fn ignore(&mut self, id: IncomingId) -> Result<(), EngineError> {
        let inc = self.take_incoming(id)?;
        self.endpoint.ignore(inc);
        Ok(())
    }

    /// Close a connection with an application error code and reason. Queued
    /// data is abandoned; the peer is told on the next [`poll`](Self::poll), and
    /// [`Event::ConnectionClosed`] follows once the connection drained.
    pub fn close(
        &mut self,
        now: Instant,
        conn: ConnHandle,
        code: u64,
        reason: &[u8],
    ) -> Result<(), EngineError> {
        let code = VarInt::from_u64(code)
            .map_err(|_| EngineError::InvalidArgument("error code above 2^62"))?;
        let c = self.conns.get(conn)?;
        c.inner.close(now, code, Bytes::copy_from_slice(reason));
        Ok(())
    }

    /// The earliest time a timer of any connection expires: call
    /// [`poll`](Self::poll) by then even if no packet arrives. `None` with no connections.
    pub fn next_deadline(&mut self) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        for i in 0..self.conns.capacity() {
            if let Some(c) = self.conns.slot_mut(i) {
                if let Some(t) = c.inner.poll_timeout() {
                    next = Some(next.map_or(t, |n| n.min(t)));
                }
            }
        }
        next
    }

    /// For callers that sleep instead of spinning: ask to be woken through
    /// `waker` when a completion or event arrives. `true` if something may
    /// already be waiting: poll again before sleeping. Sleep no later than
    /// [`next_deadline`](Self::next_deadline). Providers with a
    /// [`readiness_fd`](Self::readiness_fd) (`soft`, `verbs`) signal new
    /// packets through that descriptor, so wait on it as well.
    pub fn arm(&mut self, waker: &std::task::Waker) -> bool {
        self.socket.arm(waker)
    }

    /// A counter that moves whenever a poll (or flush) received a datagram,
    /// sent a transmit or ran a timer: how a driver tells a busy poll from an
    /// idle one (the [`Waiter`] spins while it moves).
    pub fn activity(&self) -> u64 {
        self.activity
    }

    /// The provider's readiness descriptor, if it has one (see [`arm`](Self::arm)).
    pub fn readiness_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.socket.readiness_fd()
    }

    /// Drive everything (see the [module docs](self)) and append what happened
    /// to `events`; returns how many were appended. `events` is the caller's and
    /// is only pushed to, so a buffer cleared and reused across calls allocates
    /// nothing once it has grown to the largest burst.
    pub fn poll(&mut self, now: Instant, events: &mut Vec<Event>) -> usize {
        let before = events.len();
        self.just_closed.clear();
        self.socket.reap_sends();
        self.receive(now);
        events.append(&mut self.staged);
        self.notice_local_move();
        for i in 0..self.conns.capacity() {
            self.drive_connection(now, i, events);
        }
        self.flush(now);
        events.len() - before
    }

    /// Flush every connection's pending transmits now (a write made after
    /// [`poll`](Self::poll) otherwise leaves on the next one).
    pub fn flush(&mut self, now: Instant) {
        self.send_responses(now);
        self.flush_connections(now);
    }

    /// Our GID moved (the socket saw `GidChanged` and rebuilt its AHs): tell every
    /// connection, so quinn-proto switches to fresh CIDs on the new path.
    fn notice_local_move(&mut self) {
        let now_local = self.socket.local_addr();
        if now_local == self.local {
            return;
        }
        self.local = now_local;
        for i in 0..self.conns.capacity() {
            if let Some(c) = self.conns.slot_mut(i) {
                c.inner.local_address_changed();
                c.may_send = true;
            }
        }
    }

    /// `data` copied into [`Engine::tx_copies`] (no allocation of its own,
    /// copy_arena.rs) if it is at most [`TX_COPY_MAX`] bytes; `None` for a
    /// larger one, which the caller copies as it needs.
    fn small_copy(&mut self, data: &[u8]) -> Option<Bytes> {
        (data.len() <= TX_COPY_MAX).then(|| self.tx_copies.copy(data).freeze())
    }

    fn local_ip(&self) -> Option<IpAddr> {
        Some(self.socket.local_addr().gid.to_ipv6().into())
    }

    fn take_incoming(&mut self, id: IncomingId) -> Result<Incoming, EngineError> {
        match self.incoming.get(id.0 as usize) {
            Some((gen, _)) if *gen == id.1 => Ok(self.incoming.remove(id.0 as usize).1),
            _ => Err(EngineError::UnknownIncoming),
        }
    }

    fn incoming_remote(&self, inc: &Incoming) -> UdAddr {
        self.peers
            .ud_addr(inc.remote_address())
            .unwrap_or(self.local)
    }

    /// Accept an attempt; a refusal response (if any) is queued.
    fn accept_incoming(
        &mut self,
        now: Instant,
        inc: Incoming,
    ) -> Result<ConnHandle, ConnectionError> {
        let dest = self.incoming_remote(&inc);
        let remote = inc.remote_address();
        let validated = inc.remote_address_validated();
        if validated {
            // A Retry or NEW_TOKEN token proved it (RFC 9000 §8.1.3): no 3× limit.
            self.peers.confirm(remote, now);
        }
        let mut buf = Vec::new();
        match self.endpoint.accept(inc, now, &mut buf, None) {
            Ok((ch, conn)) => {
                let mut conn = Conn::new(conn, self.datagram_limit, now);
                conn.unvalidated_handshake = !validated;
                self.unvalidated_handshakes += usize::from(!validated);
                let h = self.conns.insert(ch, conn);
                self.staged.push(Event::Accepted {
                    conn: h,
                    remote: dest,
                });
                Ok(h)
            }
            Err(e) => {
                if let Some(t) = e.response {
                    buf.truncate(t.size);
                    self.responses.push((remote, buf));
                }
                tracing::debug!(cause = %e.cause, "accept failed");
                Err(e.cause)
            }
        }
    }

    /// Refuse an attempt (CONNECTION_REFUSED, queued).
    fn refuse_incoming(&mut self, inc: Incoming) {
        let remote = inc.remote_address();
        let mut buf = Vec::new();
        let t = self.endpoint.refuse(inc, &mut buf);
        buf.truncate(t.size);
        self.responses.push((remote, buf));
    }

    /// Answer an attempt with a Retry (queued); `false` (the attempt dropped)
    /// if it already carries a validated token.
    fn retry_incoming(&mut self, inc: Incoming) -> bool {
        let remote = inc.remote_address();
        let mut buf = Vec::new();
        match self.endpoint.retry(inc, &mut buf) {
            Ok(t) => {
                buf.truncate(t.size);
                self.responses.push((remote, buf));
                self.retries += 1;
                true
            }
            Err(e) => {
                self.endpoint.ignore(e.into_incoming());
                false
            }
        }
    }

    /// Decide a new attempt by policy (or stage it for the application).
    fn on_incoming(&mut self, now: Instant, inc: Incoming) {
        if !self.has_server {
            self.endpoint.ignore(inc);
            return;
        }
        let asks_retry = matches!(self.accept, AcceptPolicy::AcceptAll | AcceptPolicy::Manual)
            && self.retry.should_retry(
                inc.remote_address_validated(),
                inc.may_retry(),
                self.unvalidated_handshakes,
            );
        if asks_retry {
            self.retry_incoming(inc);
            return;
        }
        match self.accept {
            AcceptPolicy::AcceptAll => {
                let _ = self.accept_incoming(now, inc);
            }
            AcceptPolicy::RetryThenAccept if inc.may_retry() => {
                self.retry_incoming(inc);
            }
            AcceptPolicy::RetryThenAccept => {
                let _ = self.accept_incoming(now, inc);
            }
            AcceptPolicy::RefuseAll => self.refuse_incoming(inc),
            AcceptPolicy::Manual => {
                let remote = self.incoming_remote(&inc);
                self.next_incoming_gen = self.next_incoming_gen.wrapping_add(1).max(1);
                let gen = self.next_incoming_gen;
                let idx = self.incoming.insert((gen, inc));
                self.staged.push(Event::IncomingConnection {
                    incoming: IncomingId(idx as u32, gen),
                    remote,
                });
            }
        }
    }

    /// Timers, endpoint events and application events of connection slot `i`.
    fn drive_connection(&mut self, now: Instant, i: usize, events: &mut Vec<Event>) {
        let Some(h) = self.conns.handle_at(i) else {
            return;
        };
        let Some(c) = self.conns.slot_mut(i) else {
            return;
        };
        if c.inner.poll_timeout().is_some_and(|t| t <= now) {
            c.inner.handle_timeout(now);
            c.may_send = true;
            self.activity += 1;
        }
        let ch = quinn_proto::ConnectionHandle(i);
        while let Some(ev) = c.inner.poll_endpoint_events() {
            if let Some(back) = self.endpoint.handle_event(ch, ev) {
                c.inner.handle_event(back);
                c.may_send = true;
            }
        }
        while let Some(ev) = c.inner.poll() {
            // Accepting a peer's stream (in `translate`) may grant it more.
            c.may_send = true;
            if matches!(ev, quinn_proto::Event::Connected) {
                c.rtt.connected(now);
                // The handshake proved the peer's address (RFC 9000 §8.1).
                self.peers.confirm(c.inner.remote_address(), now);
                if std::mem::take(&mut c.unvalidated_handshake) {
                    self.unvalidated_handshakes -= 1;
                }
            }
            translate(h, c, ev, events);
        }
        // Every poll empties quinn-proto's datagram queue into ours, so its
        // silent drop-oldest only ever sees one poll's arrivals, and ours
        // (bounded by the application's choice) counts and reports drops.
        if c.rx_datagrams.take_from(&mut c.inner, c.last_rx_stamp) > 0 {
            events.push(Event::Datagram { conn: h });
            let count = c.rx_datagrams.newly_dropped(&c.inner.stats());
            if count > 0 {
                self.datagrams_dropped += count;
                events.push(Event::DatagramsDropped { conn: h, count });
            }
        }
        if c.inner.is_drained() {
            if std::mem::take(&mut c.unvalidated_handshake) {
                self.unvalidated_handshakes -= 1;
            }
            let error = self.conns.remove(i).and_then(|c| c.error);
            self.just_closed.push((h, error));
            events.push(Event::ConnectionClosed { conn: h });
        }
    }
}

/// Turn one quinn-proto connection event into engine events.
fn translate(h: ConnHandle, c: &mut Conn, ev: quinn_proto::Event, out: &mut Vec<Event>) {
    use quinn_proto::{Event as E, StreamEvent as S};
    match ev {
        E::HandshakeDataReady => {}
        E::Connected => out.push(Event::Connected { conn: h }),
        E::ConnectionLost { reason } => {
            out.push(Event::ConnectionLost {
                conn: h,
                reason: CloseReason::of(&reason),
            });
            c.error = Some(reason);
        }
        E::Stream(S::Opened { dir }) => {
            while let Some(id) = c.inner.streams().accept(dir) {
                c.note_accepted(id);
                out.push(Event::StreamOpened {
                    conn: h,
                    stream: id,
                });
                out.push(Event::StreamReadable {
                    conn: h,
                    stream: id,
                });
            }
        }
        E::Stream(S::Readable { id }) => {
            // A reset is only visible by asking; report it as its own event.
            match c.inner.recv_stream(id).received_reset() {
                Ok(Some(code)) => {
                    c.stream_stats
                        .update(id, |s| s.reset_received = Some(code.into_inner()));
                    out.push(Event::StreamReset {
                        conn: h,
                        stream: id,
                        code: code.into_inner(),
                    })
                }
                _ => out.push(Event::StreamReadable {
                    conn: h,
                    stream: id,
                }),
            }
        }
        E::Stream(S::Writable { id }) => out.push(Event::StreamWritable {
            conn: h,
            stream: id,
        }),
        E::Stream(S::Finished { id }) => {
            c.stream_stats.update(id, |s| {
                s.finish_acked = true;
                s.send_open = false;
            });
            out.push(Event::StreamFinished {
                conn: h,
                stream: id,
            })
        }
        E::Stream(S::Stopped { id, error_code }) => {
            c.stream_stats.update(id, |s| {
                s.stop_received = Some(error_code.into_inner());
                s.send_open = false;
            });
            out.push(Event::StreamStopped {
                conn: h,
                stream: id,
                code: error_code.into_inner(),
            })
        }
        E::Stream(S::Available { dir }) => out.push(Event::StreamsAvailable {
            conn: h,
            bidi: dir == Dir::Bi,
        }),
        // Reported after the engine took them into its own queue (drive_connection).
        E::DatagramReceived => {}
        E::DatagramsUnblocked => out.push(Event::DatagramsWritable { conn: h }),
    }
}

impl<Q: UdQueuePair> Drop for Engine<Q> {
    fn drop(&mut self) {
        // quinn-proto warns when an Incoming is dropped undecided.
        for (_, inc) in self.incoming.drain() {
            self.endpoint.ignore(inc);
        }
    }
}

impl<Q: UdQueuePair> std::fmt::Debug for Engine<Q> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("local", &self.local)
            .field("connections", &self.conns.live())
            .field("pending_incoming", &self.incoming.len())
            .finish()
    }
}
