//! The quinn drop-in: `quinn::AsyncUdpSocket` over a [`UdSocket`] (docs/architecture.md §5).
//!
//! A quinn application switches from UDP to RDMA UD in a handful of lines:
//!
//! ```
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use quic_rdma::fabric::sim::{SimFabric, SimQpOptions};
//! use quic_rdma::quinn_adapter::{self, RdmaUdpSocket};
//! use quic_rdma::socket::{SocketConfig, UdSocket};
//!
//! let fabric = SimFabric::new(Default::default());
//! let qp = fabric.create_qp("fd00::1".parse::<std::net::Ipv6Addr>()?.into(), SimQpOptions::default())?;
//! let socket = RdmaUdpSocket::new(UdSocket::new(qp, SocketConfig::default())?);
//! // The endpoint and transport configs, both from the socket's MTU:
//! let fabric = quinn_adapter::FabricConfig::of(&socket);
//! // Instead of quinn::Endpoint::client("[::]:0".parse()?):
//! let endpoint = fabric.endpoint(Arc::new(socket), None)?;
//! // ...and set `fabric.transport()` on the ClientConfig; the rest of
//! // the quinn API is unchanged. A peer's `SocketAddr` comes from `socket.peer_addr(ud_addr)`.
//! // To notice a dead peer in ~1.5 s (not the 30 s idle timeout), each connection
//! // gets a watcher: `quinn_adapter::spawn_watch(socket, conn, DEFAULT_DEAD_AFTER)`.
//! # assert_eq!(endpoint.local_addr()?.port(), 4791);
//! # Ok(()) }
//! # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
//! ```

mod coalesce;
mod config;
mod liveness;
mod retry_gate;
mod spin;
mod wake;

use std::fmt;
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};

pub use crate::quic::config::{Liveness, LivenessError};
pub use crate::quic::retry::RetryPolicy;
pub use config::FabricConfig;
pub use liveness::{spawn_watch, spawn_watch_for, watch, Watched, DEFAULT_DEAD_AFTER, PEER_SILENT};
pub use retry_gate::{Attempt, RetryGate};

use crate::fabric::{UdAddr, UdQueuePair};
use crate::quic::peers::{LastSource, PeerLimits, PeerStats, PeerTable};
use crate::quic::routing::{self, RoutingCheck, RoutingLog, RoutingStats};
use crate::socket::{SocketError, SocketStats, UdSocket};
use coalesce::{Coalescer, RECV_SEGMENTS};
use liveness::Stamp;
use spin::IdleSpin;
use wake::{FdReadiness, WakeHub};

/// A [`UdSocket`] as a `quinn::AsyncUdpSocket`.
///
/// quinn addresses a UD peer by the `SocketAddr` [`RdmaUdpSocket::peer_addr`] gives;
/// `may_fragment()` is `false` (a UD message is never fragmented), so quinn may
/// use every byte of the MTU.
pub struct RdmaUdpSocket<Q: UdQueuePair = Box<dyn UdQueuePair>> {
    /// The provider's readiness descriptor registered with the reactor (on first
    /// arm, inside the runtime), for providers that have one; it wakes `hub`.
    readiness: OnceLock<Option<FdReadiness>>,
    hub: Arc<WakeHub>,
    hub_waker: Waker,
    mtu: usize,
    /// Segments per transmit the socket can always post whole.
    max_segments: usize,
    /// How long the receive path polls on after a packet before it sleeps.
    spin: IdleSpin,
    /// The addresses quinn sees for UD peers (see [`RdmaUdpSocket::peer_addr`]),
    /// and the routing check's counters (both touched on every receive). Shared
    /// with the sockets [`rebind`](Self::rebind) makes.
    peers: Arc<Mutex<(PeerTable, RoutingLog)>>,
    routing: RoutingCheck,
    /// When the receive path last found the receive queue empty: its clock,
    /// by which a peer's silence is judged ([`Self::peer_silence`]).
    caught_up: Stamp,
    inner: Mutex<UdSocket<Q>>,
}

impl<Q: UdQueuePair> RdmaUdpSocket<Q> {
    /// The receive path's default spin window ([`with_idle_spin`](Self::with_idle_spin)).
    pub const DEFAULT_IDLE_SPIN: Duration = spin::DEFAULT_IDLE_SPIN;

    /// Wrap a socket, with the default [`PeerLimits`] and [`RoutingCheck`].
    pub fn new(socket: UdSocket<Q>) -> Self {
        Self::with_options(socket, PeerLimits::default(), RoutingCheck::default())
    }

    /// Wrap a socket; its peer table is bounded by `limits` (see [`crate::quic::PeerLimits`]),
    /// and received immediate data is checked as `routing` says.
    pub fn with_options(socket: UdSocket<Q>, limits: PeerLimits, routing: RoutingCheck) -> Self {
        let mtu = socket.mtu();
        let peers = Arc::new(Mutex::new((
            PeerTable::new(limits, mtu),
            RoutingLog::default(),
        )));
        Self::over(socket, peers, routing)
    }

    fn over(
        socket: UdSocket<Q>,
        peers: Arc<Mutex<(PeerTable, RoutingLog)>>,
        routing: RoutingCheck,
    ) -> Self {
        let hub = Arc::new(WakeHub::default());
        RdmaUdpSocket {
            readiness: OnceLock::new(),
            hub_waker: Waker::from(hub.clone()),
            hub,
            mtu: socket.mtu(),
            max_segments: socket.max_segments(),
            spin: IdleSpin::new(spin::DEFAULT_IDLE_SPIN),
            peers,
            routing,
            caught_up: Stamp::new(),
            inner: Mutex::new(socket),
        }
    }

    /// A socket over `socket` (a new queue pair: a new QPN, or another port)
    /// that shares this one's peer table, for `quinn::Endpoint::rebind_abstract`:
    /// quinn keeps addressing its peers by the addresses this table gave them,
    /// and the new socket must know them. Our own address change is a path
    /// change to the peers (RFC 9000 §9); their addresses stay as they were.
    pub fn rebind(&self, socket: UdSocket<Q>) -> Self {
        Self::over(socket, self.peers.clone(), self.routing).with_idle_spin(self.spin.window())
    }

    /// After a packet, keep the receive path awake for `window` before it sleeps
    /// (default [`DEFAULT_IDLE_SPIN`](Self::DEFAULT_IDLE_SPIN): none, it sleeps at
    /// once, as a UDP socket does).
    ///
    /// While the window lasts, quinn's endpoint task polls the queue pair again
    /// each time the runtime comes round to it and yields the CPU in between
    /// (`sched_yield`), instead of sleeping: a steady flow then never pays for
    /// a wake-up, which costs tens of microseconds when the CPU went idle (far
    /// more in a virtual machine). The cost is CPU: up to `window` of polling
    /// after each burst of traffic, and a busy thread while packets keep coming
    /// closer together than `window`. On a machine whose cores are shared with
    /// other busy processes it loses: each yield gives the CPU away for a time
    /// slice. Use it where the endpoint has its cores to itself.
    pub fn with_idle_spin(mut self, window: Duration) -> Self {
        self.spin = IdleSpin::new(window);
        self
    }

    /// The fabric MTU, from which [`FabricConfig::of`] derives the configs.
    pub fn mtu(&self) -> usize {
        self.mtu
    }

    /// Our UD address.
    pub fn ud_addr(&self) -> UdAddr {
        self.lock().local_addr()
    }

    /// The `SocketAddr` to give quinn for the UD peer `ud` (e.g. in
    /// `Endpoint::connect`); `Connection::remote_address` reports the same value.
    ///
    /// It is the peer's GID with a port unique to this peer, flow info and scope 0:
    /// quinn-proto's Retry tokens keep only IP and port, so an address that put the
    /// QPN and Q_Key elsewhere (like [`UdAddr::to_socket_addr`]) would fail every
    /// Retry. Stable per peer, so a peer that moves is a path change.
    ///
    /// Naming a peer admits it to the peer table (see [`crate::quic::PeerLimits`]).
    pub fn peer_addr(&self, ud: UdAddr) -> SocketAddr {
        lock(&self.peers).0.admit(ud, Instant::now())
    }

    /// The UD peer behind an address quinn reported (the inverse of [`Self::peer_addr`]).
    pub fn ud_addr_of(&self, addr: SocketAddr) -> Option<UdAddr> {
        lock(&self.peers).0.ud_addr(addr)
    }

    /// Admit the peer quinn knows as `addr`: its address is validated by
    /// evidence the socket cannot see (RFC 9000 §8.1), e.g. a forwarder that
    /// saw the peer use a connection ID only the far server issued. `false`
    /// if the peer is unknown or the table is full of live peers.
    pub fn confirm_peer(&self, addr: SocketAddr) -> bool {
        lock(&self.peers).0.confirm(addr, Instant::now())
    }

    /// The peer table's counters and bounds.
    pub fn peer_stats(&self) -> PeerStats {
        lock(&self.peers).0.stats()
    }

    /// The routing check's counters (plain SENDs accepted, mismatches dropped).
    pub fn routing_stats(&self) -> RoutingStats {
        lock(&self.peers).1.stats
    }

    /// The socket's counters.
    pub fn stats(&self) -> SocketStats {
        self.lock().stats()
    }

    /// Run `f` on the socket (for controls and inspection).
    pub fn with_socket<R>(&self, f: impl FnOnce(&mut UdSocket<Q>) -> R) -> R {
        f(&mut self.lock())
    }

    fn lock(&self) -> MutexGuard<'_, UdSocket<Q>> {
        lock(&self.inner)
    }

    /// How long the peer quinn knows as `peer` has been silent, as the receive
    /// path sees it: from the last packet read from it to the last moment the
    /// receive path had read everything that had arrived (now, if nothing is
    /// waiting). A busy host delays the reading, not the arriving, so the
    /// silence of a live peer stays short however late the tasks run; `None`
    /// if nothing was ever heard from `peer`.
    pub fn peer_silence(&self, peer: SocketAddr) -> Option<Duration> {
        let heard = lock(&self.peers).0.last_heard(peer)?;
        let now = Instant::now();
        let pending = {
            let mut s = self.lock();
            // Retire send completions first: only receive work waiting means
            // the receive path is behind (our own keep-alives and probes to a
            // dead peer must not freeze its clock).
            s.reap_sends();
            self.arm_hub(&mut s)
        };
        let clock = if pending {
            // Packets wait unread: the receive path (woken by `arm_hub`) is
            // behind, and its clock stops where it last caught up.
            self.caught_up.get().unwrap_or(heard)
        } else {
            self.caught_up.set(now);
            now
        };
        Some(clock.saturating_duration_since(heard))
    }

    /// Register `w` and arm the QP. Returns `true` if a completion may already be
    /// waiting (the caller polls again instead of sleeping: no lost wake-up).
    fn arm(&self, s: &mut UdSocket<Q>, w: &Waker) -> bool {
        self.hub.register(w);
        self.arm_hub(s)
    }

    /// Arm the QP (and the readiness descriptor) to wake the hub. If work is
    /// already waiting, wake every task registered with the hub too: the
    /// provider may have taken the event that would have woken them (`verbs`
    /// consumes the completion channel's events and polls completions ahead
    /// into a stash when it arms, so a writer arming finds receive completions
    /// the sleeping receive task would otherwise never hear of).
    fn arm_hub(&self, s: &mut UdSocket<Q>) -> bool {
        let readiness = self.readiness.get_or_init(|| {
            let fd = s.readiness_fd()?.try_clone_to_owned().ok()?;
            tokio::runtime::Handle::try_current()
                .map_err(
                    |e| tracing::warn!(%e, "no tokio runtime to watch the provider's descriptor"),
                )
                .ok()?;
            FdReadiness::new(fd)
                .map_err(|e| tracing::warn!(%e, "cannot watch the provider's descriptor"))
                .ok()
        });
        if let Some(r) = readiness {
            r.register(&self.hub_waker);
        }
        let pending = s.arm(&self.hub_waker);
        if pending {
            self.hub_waker.wake_by_ref();
        }
        pending
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<Q: UdQueuePair> fmt::Debug for RdmaUdpSocket<Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RdmaUdpSocket")
            .field("mtu", &self.mtu)
            .finish()
    }
}

impl<Q: UdQueuePair> AsyncUdpSocket for RdmaUdpSocket<Q> {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        Box::pin(Writable { socket: self })
    }

    fn try_send(&self, t: &Transmit) -> io::Result<()> {
        // An unknown destination (never seen, or refused by a full table) is a
        // counted drop like a lost packet: an error here would be fatal to the
        // connection in quinn.
        // Likewise what the 3× limit holds back from an unvalidated peer.
        let Some((dest, len)) =
            lock(&self.peers)
                .0
                .on_send(t.destination, t.contents, t.segment_size, Instant::now())
        else {
            tracing::debug!(dest = %t.destination, "transmit dropped by the peer table");
            return Ok(());
        };
        let ecn = t.ecn.map_or(0, |e| e as u8);
        match routing::send(
            &mut self.lock(),
            dest,
            ecn,
            &t.contents[..len],
            t.segment_size,
        ) {
            // Counted by the socket; the unposted segments are lost packets to QUIC.
            Ok(()) | Err(SocketError::PartiallyPosted { .. }) => Ok(()),
            Err(e) => Err(io::Error::from(e)),
        }
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        let max = bufs.len().min(meta.len());
        let mut s = self.lock();
        let mut guard = lock(&self.peers);
        let (peers, routing_log) = &mut *guard;
        let check = self.routing;
        let dst_ip = Some(s.local_addr().gid.to_ipv6().into());
        let now = Instant::now();
        loop {
            // Send completions also wake the QP: retire them here so an armed QP
            // with only send completions pending does not spin this loop.
            s.reap_sends();
            let mut out = Coalescer::new(&mut *bufs, &mut *meta);
            let mut last_source = LastSource::default();
            // Each call may deliver one packet per free entry (none might
            // coalesce); go on while a call filled its quota and entries remain.
            loop {
                let quota = max - out.used();
                let got = s.recv(quota, |r| {
                    if !check.accept(&r, routing_log) {
                        return;
                    }
                    let addr = last_source.on_receive(peers, r.src, r.data, now);
                    out.push(&r, addr, dst_ip);
                });
                if got < quota {
                    // Read dry: everything that arrived by `now` is read.
                    self.caught_up.set(now);
                    break;
                }
                if out.used() == max {
                    break;
                }
            }
            if out.used() > 0 {
                self.spin.on_receive(now);
                return Poll::Ready(Ok(out.used()));
            }
            if self.spin.keep_spinning(Instant::now()) {
                // Poll again instead of sleeping (see `with_idle_spin`): the
                // runtime runs its other ready tasks first, and other threads
                // get this CPU meanwhile; the locks are not held across it.
                drop(guard);
                drop(s);
                cx.waker().wake_by_ref();
                std::thread::yield_now();
                return Poll::Pending;
            }
            if !self.arm(&mut s, cx.waker()) {
                return Poll::Pending;
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.lock().local_addr().to_socket_addr())
    }

    fn max_transmit_segments(&self) -> usize {
        self.max_segments
    }

    /// Packets from one peer arrive back to back and equally sized (a bulk
    /// stream's full-MTU datagrams): the coalescer hands them to quinn like
    /// UDP GRO, so quinn allocates once per batch, not once per packet (it
    /// copies each `RecvMeta`'s buffer into one allocation). The cost: quinn's
    /// receive buffer is MTU × 16 × 32 (2 MiB at MTU 4096) per endpoint.
    fn max_receive_segments(&self) -> usize {
        RECV_SEGMENTS
    }

    fn may_fragment(&self) -> bool {
        false
    }
}

/// Write readiness: room in the send queue and a free send slot.
struct Writable<Q: UdQueuePair> {
    socket: Arc<RdmaUdpSocket<Q>>,
}

impl<Q: UdQueuePair> fmt::Debug for Writable<Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Writable")
    }
}

impl<Q: UdQueuePair> UdpPoller for Writable<Q> {
    /// Ready when the largest transmit quinn may hand over fits whole: room
    /// for one datagram is not enough, since `try_send` posts all of a
    /// transmit's segments or none, and a `WouldBlock` after a ready sends
    /// quinn straight back here, a spin until completions come.
    fn poll_writable(self: Pin<&mut Self>, cx: &mut Context) -> Poll<io::Result<()>> {
        let sock = &self.socket;
        let mut s = sock.lock();
        let segments = sock.max_segments.min(QUINN_MAX_TRANSMIT_SEGMENTS);
        s.reap_sends();
        if s.can_send_datagrams(segments) {
            return Poll::Ready(Ok(()));
        }
        if sock.arm(&mut s, cx.waker()) {
            // Something waits: send completions free room now; receive
            // completions are the receive task's, which `arm` woke. Either
            // way look once more, then let the hub's wake-up poll us again
            // rather than spin here holding the socket's lock.
            s.reap_sends();
            if s.can_send_datagrams(segments) {
                return Poll::Ready(Ok(()));
            }
        }
        Poll::Pending
    }
}

/// quinn 0.11 caps a transmit at this many segments whatever the socket reports
/// (`MAX_TRANSMIT_SEGMENTS` in quinn's connection driver).
const QUINN_MAX_TRANSMIT_SEGMENTS: usize = 10;
