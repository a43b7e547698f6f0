//! quinn-proto configuration for a UD fabric, shared by the quinn adapter and
//! the engine (docs/architecture.md §5).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use quinn_proto::{EndpointConfig, IdleTimeout, MtuDiscoveryConfig, TransportConfig, VarInt};

use crate::quic::cid::{RoutingCidGenerator, DEFAULT_CID_LEN};

/// An `EndpointConfig` whose `max_udp_payload_size` is the fabric MTU (quinn
/// otherwise caps datagrams at 1472) and whose CIDs carry `routing_key`.
pub fn endpoint_config(mtu: usize, routing_key: u32) -> EndpointConfig {
    let mut c = EndpointConfig::default();
    c.max_udp_payload_size(mtu.min(u16::MAX as usize) as u16)
        .expect("MTU at least 1200 (checked by the socket)");
    c.cid_generator(move || Box::new(RoutingCidGenerator::new(routing_key, DEFAULT_CID_LEN)));
    c
}

/// How fast a dead peer is noticed: the keep-alive interval and the idle
/// timeout of a connection (RFC 9000 §10.1).
///
/// quinn's own defaults (no keep-alive, 30 s idle timeout) are sized for the
/// Internet; on a fabric with RTTs of microseconds they leave an application
/// waiting 30 s to learn that its peer died. The defaults here are
/// [`DEFAULT_KEEP_ALIVE`](Self::DEFAULT_KEEP_ALIVE) = 300 ms and
/// [`DEFAULT_IDLE_TIMEOUT`](Self::DEFAULT_IDLE_TIMEOUT) = 1.5 s, so a killed or
/// unreachable peer is reported within 1.5–1.8 s as
/// `quinn::ConnectionError::TimedOut` (the engine's
/// [`CloseReason::TimedOut`](crate::engine::CloseReason::TimedOut)):
/// - The idle timeout must outlast the loss recovery of a live connection.
///   One PTO on the fabric is the RTT (µs) + max(4·rttvar, 1 ms) + the peer's
///   `max_ack_delay` (25 ms): about 26 ms; quinn-proto never arms the idle
///   timer below 3 PTOs (RFC 9000 §10.1), and 1.5 s covers five backed-off
///   PTOs (26 + 52 + … + 416 ms ≈ 0.8 s) plus a keep-alive interval, so a
///   live peer behind a short outage (a QP recovery, a lost burst) survives.
/// - The keep-alive interval is a fifth of the idle timeout: an idle but
///   live connection sends a PING every 300 ms (RFC 9000 §10.1.2), so several
///   may be lost before the peer times out, and the cost is one small packet
///   per 300 ms of silence. Only one side needs it, but both have it here.
/// - The idle timer restarts on the first ack-eliciting packet sent after a
///   receipt, so the worst case to notice a dead peer is idle timeout +
///   keep-alive interval.
///
/// These defaults suit a driver whose receive path and connections are one
/// loop — the [`Engine`](crate::engine::Engine), which stamps what it reads
/// with the `now` of the poll that reads it and handles it before that poll
/// judges any timer, so a caller's stall does not age what arrived meanwhile
/// and its idle timer measures the peer's silence. The quinn adapter's connections run as tasks that can fall behind
/// the receive path, so it times out idle connections later
/// ([`Liveness::quinn_adapter`]) and notices dead peers by the receive path's
/// own clock instead (`quinn_adapter::watch`).
///
/// The effective idle timeout is the smaller of both peers' (RFC 9000 §10.1),
/// so a peer with a shorter one shortens ours; keep the keep-alive below it.
/// An application that must ride out longer stalls (a debugger, a process
/// stopped for seconds, an emulated guest) raises both with [`Liveness::new`]
/// and [`transport_with`]. An [`Engine`](crate::engine::Engine) counts time
/// only in [`poll`](crate::engine::Engine::poll): a caller that stops polling
/// for longer than the idle timeout finds its connections timed out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Liveness {
    keep_alive: Option<Duration>,
    idle_timeout: Option<Duration>,
    dead_after: Option<Duration>,
}

impl Liveness {
    /// Default keep-alive interval: a PING after 300 ms without sending.
    pub const DEFAULT_KEEP_ALIVE: Duration = Duration::from_millis(300);
    /// Default idle timeout (`max_idle_timeout`, RFC 9000 §18.2): 1.5 s.
    pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_millis(1500);
    /// The quinn adapter's idle timeout: 30 s, quinn's own default. It bounds
    /// how long the local host may starve a connection task (a busy runtime, an
    /// emulated guest) before quinn kills a live connection; a dead peer is
    /// noticed sooner by `quinn_adapter::watch`.
    pub const QUINN_ADAPTER_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
    /// How long a peer may be silent, as the receive path sees it, before the
    /// quinn adapter's watcher calls it dead: 1.5 s, five default keep-alive
    /// intervals, so a dead peer is noticed within ~1.7 s and a live one
    /// survives four lost keep-alives in a row.
    pub const DEFAULT_DEAD_AFTER: Duration = Duration::from_millis(1500);

    /// The quinn adapter's timers: the default keep-alive (300 ms, which the
    /// receive-path watcher needs to tell a live idle peer from a dead one),
    /// [`QUINN_ADAPTER_IDLE_TIMEOUT`](Self::QUINN_ADAPTER_IDLE_TIMEOUT) and
    /// [`DEFAULT_DEAD_AFTER`](Self::DEFAULT_DEAD_AFTER).
    pub const fn quinn_adapter() -> Self {
        Liveness {
            keep_alive: Some(Self::DEFAULT_KEEP_ALIVE),
            idle_timeout: Some(Self::QUINN_ADAPTER_IDLE_TIMEOUT),
            dead_after: Some(Self::DEFAULT_DEAD_AFTER),
        }
    }

    /// Timers for a peer that reaches the fabric from UDP through a gateway
    /// (`qr gateway to-fabric`): its path is the Internet's, not the fabric's.
    /// A 10 s keep-alive holds the gateway's entry and NAT bindings open
    /// (RFC 9308 §3.2), a 25 s idle timeout stays below the gateway's 30 s
    /// client expiry, and there is no dead-peer watcher: a UDP client that is
    /// slow for a second (a busy host, a congested path) is not dead.
    pub const fn udp_path() -> Self {
        Liveness {
            keep_alive: Some(Duration::from_secs(10)),
            idle_timeout: Some(Duration::from_secs(25)),
            dead_after: None,
        }
    }

    /// Timers of one's choosing. `keep_alive: None` sends no keep-alives (an
    /// idle connection then times out unless the peer sends them);
    /// `idle_timeout: None` never times out (a dead peer is then never noticed
    /// while the connection is idle). Refused: a zero or sub-millisecond
    /// timer (the transport parameter counts milliseconds, and 0 means "none"),
    /// a keep-alive not shorter than the idle timeout (it could not keep the
    /// connection alive), and an idle timeout above 2^62 ms.
    pub fn new(
        keep_alive: Option<Duration>,
        idle_timeout: Option<Duration>,
    ) -> Result<Self, LivenessError> {
        if keep_alive.is_some_and(|k| k.is_zero()) {
            return Err(LivenessError::ZeroKeepAlive);
        }
        if let Some(idle) = idle_timeout {
            if idle < Duration::from_millis(1) {
                return Err(LivenessError::IdleTimeoutBelowOneMillisecond(idle));
            }
            if IdleTimeout::try_from(idle).is_err() {
                return Err(LivenessError::IdleTimeoutTooLarge(idle));
            }
            if let Some(k) = keep_alive.filter(|&k| k >= idle) {
                return Err(LivenessError::KeepAliveNotBelowIdleTimeout {
                    keep_alive: k,
                    idle_timeout: idle,
                });
            }
        }
        Ok(Liveness {
            keep_alive,
            idle_timeout,
            dead_after: None,
        })
    }

    /// The same timers, and a peer silent for `dead_after` (as the receive path
    /// sees it) called dead by the quinn adapter's watcher
    /// (`quinn_adapter::watch`); `None`: no watcher, the idle timeout alone.
    /// Local only: nothing of it is sent to the peer. Like the idle timeout,
    /// it closes an idle connection unless someone sends keep-alives. Refused:
    /// a `dead_after` not above this end's keep-alive interval (a live idle
    /// peer answers a keep-alive, so it is heard once per interval) or not
    /// below the idle timeout (the idle timer would always decide first).
    pub fn with_dead_after(self, dead_after: Option<Duration>) -> Result<Self, LivenessError> {
        if let Some(d) = dead_after {
            if let Some(k) = self.keep_alive.filter(|&k| k >= d) {
                return Err(LivenessError::DeadAfterNotAboveKeepAlive {
                    dead_after: d,
                    keep_alive: k,
                });
            }
            if let Some(idle) = self.idle_timeout.filter(|&i| d >= i) {
                return Err(LivenessError::DeadAfterNotBelowIdleTimeout {
                    dead_after: d,
                    idle_timeout: idle,
                });
            }
        }
        Ok(Liveness { dead_after, ..self })
    }

    /// How long a silent peer is given before the quinn adapter's watcher
    /// closes its connection (`None`: no watcher).
    pub fn dead_after(&self) -> Option<Duration> {
        self.dead_after
    }

    /// The keep-alive interval (`None`: no keep-alives).
    pub fn keep_alive(&self) -> Option<Duration> {
        self.keep_alive
    }

    /// The idle timeout this endpoint advertises (`None`: never times out).
    pub fn idle_timeout(&self) -> Option<Duration> {
        self.idle_timeout
    }

    /// Set both timers on `t`.
    pub fn apply(&self, t: &mut TransportConfig) {
        let idle = self
            .idle_timeout
            .map(|d| IdleTimeout::try_from(d).expect("checked by Liveness::new"));
        t.keep_alive_interval(self.keep_alive)
            .max_idle_timeout(idle);
    }
}

impl Default for Liveness {
    /// [`DEFAULT_KEEP_ALIVE`](Self::DEFAULT_KEEP_ALIVE) and
    /// [`DEFAULT_IDLE_TIMEOUT`](Self::DEFAULT_IDLE_TIMEOUT).
    fn default() -> Self {
        Liveness {
            keep_alive: Some(Self::DEFAULT_KEEP_ALIVE),
            idle_timeout: Some(Self::DEFAULT_IDLE_TIMEOUT),
            dead_after: None,
        }
    }
}

/// Why [`Liveness::new`] refused its timers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LivenessError {
    /// A zero keep-alive interval would send PINGs without pause.
    ZeroKeepAlive,
    /// The idle timeout travels in whole milliseconds and 0 means "no timeout".
    IdleTimeoutBelowOneMillisecond(Duration),
    /// The idle timeout does not fit the transport parameter (2^62 ms).
    IdleTimeoutTooLarge(Duration),
    /// A keep-alive at or after the idle timeout cannot keep the connection alive.
    KeepAliveNotBelowIdleTimeout {
        /// The keep-alive interval asked for.
        keep_alive: Duration,
        /// The idle timeout asked for.
        idle_timeout: Duration,
    },
    /// A peer can only be called dead after a silence longer than the
    /// keep-alive interval (a live idle peer is heard once per interval).
    DeadAfterNotAboveKeepAlive {
        /// The silence asked for.
        dead_after: Duration,
        /// The keep-alive interval.
        keep_alive: Duration,
    },
    /// A silence at or after the idle timeout is never seen: the idle timer
    /// closes the connection first.
    DeadAfterNotBelowIdleTimeout {
        /// The silence asked for.
        dead_after: Duration,
        /// The idle timeout.
        idle_timeout: Duration,
    },
}

impl fmt::Display for LivenessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LivenessError::ZeroKeepAlive => {
                write!(
                    f,
                    "keep-alive interval is zero: use None for no keep-alives"
                )
            }
            LivenessError::IdleTimeoutBelowOneMillisecond(d) => write!(
                f,
                "idle timeout {d:?} is below 1 ms (it is sent in whole milliseconds): \
                 use at least 1 ms, or None for no idle timeout"
            ),
            LivenessError::IdleTimeoutTooLarge(d) => write!(
                f,
                "idle timeout {d:?} exceeds 2^62 ms: use None for no idle timeout"
            ),
            LivenessError::KeepAliveNotBelowIdleTimeout {
                keep_alive,
                idle_timeout,
            } => write!(
                f,
                "keep-alive interval {keep_alive:?} is not below the idle timeout \
                 {idle_timeout:?}: pick a keep-alive of at most a third of the idle timeout"
            ),
            LivenessError::DeadAfterNotAboveKeepAlive {
                dead_after,
                keep_alive,
            } => write!(
                f,
                "dead-after {dead_after:?} is not above the keep-alive interval \
                 {keep_alive:?}: a live idle peer is heard only once per interval; pick a \
                 dead-after of at least five keep-alive intervals"
            ),
            LivenessError::DeadAfterNotBelowIdleTimeout {
                dead_after,
                idle_timeout,
            } => write!(
                f,
                "dead-after {dead_after:?} is not below the idle timeout {idle_timeout:?}: \
                 the idle timer would always close first; shorten it or raise the idle timeout"
            ),
        }
    }
}

impl std::error::Error for LivenessError {}

/// A `TransportConfig` tuned for a microsecond fabric with a known MTU:
/// every packet is MTU-sized from the start and no MTU probing goes above it
/// (the path cannot carry more), small initial RTT, windows for high bandwidth,
/// and the default [`Liveness`] (300 ms keep-alive, 1.5 s idle timeout).
pub fn transport_config(mtu: usize) -> TransportConfig {
    transport_config_with(mtu, Liveness::default())
}

/// [`transport_config`] with the keep-alive and idle timeout of `liveness`.
pub fn transport_config_with(mtu: usize, liveness: Liveness) -> TransportConfig {
    let mtu = mtu.min(u16::MAX as usize) as u16;
    let mut t = TransportConfig::default();
    t.initial_mtu(mtu)
        .min_mtu(mtu)
        .mtu_discovery_config(None)
        .initial_rtt(Duration::from_millis(2))
        .stream_receive_window(VarInt::from_u32(16 << 20))
        .receive_window(VarInt::from_u32(64 << 20))
        .send_window(64 << 20)
        .datagram_receive_buffer_size(Some(4 << 20));
    liveness.apply(&mut t);
    t
}

/// A `TransportConfig` for a peer on a UDP path behind a gateway, where the
/// fabric's assumptions do not hold: the first datagrams are 1 200 bytes
/// (RFC 9000 §14.1) and quinn's DPLPMTUD (RFC 8899) probes upward to `mtu`,
/// since the UDP path may carry less than the fabric and a gateway never
/// fragments (a probe it cannot forward is lost, which caps the search); the
/// initial RTT is RFC 9002's 333 ms, not the fabric's 2 ms, so a distant
/// client's first flight is not retransmitted before it could be answered.
/// The windows are the fabric's; `liveness` is usually
/// [`Liveness::udp_path`].
pub fn udp_path_transport_config(mtu: usize, liveness: Liveness) -> TransportConfig {
    let mtu = mtu.clamp(MIN_UDP_PATH_MTU as usize, u16::MAX as usize) as u16;
    let mut discovery = MtuDiscoveryConfig::default();
    discovery.upper_bound(mtu);
    let mut t = TransportConfig::default();
    t.initial_mtu(MIN_UDP_PATH_MTU)
        .min_mtu(MIN_UDP_PATH_MTU)
        .mtu_discovery_config(Some(discovery))
        .stream_receive_window(VarInt::from_u32(16 << 20))
        .receive_window(VarInt::from_u32(64 << 20))
        .send_window(64 << 20)
        .datagram_receive_buffer_size(Some(4 << 20));
    liveness.apply(&mut t);
    t
}

/// The smallest datagram every QUIC path carries (RFC 9000 §14).
const MIN_UDP_PATH_MTU: u16 = crate::quic::cid::MIN_INITIAL_DATAGRAM as u16;

/// [`transport_config`] behind an `Arc`, ready for client and server configs.
pub fn transport(mtu: usize) -> Arc<TransportConfig> {
    Arc::new(transport_config(mtu))
}

/// [`transport_config_with`] behind an `Arc`, ready for client and server configs.
pub fn transport_with(mtu: usize, liveness: Liveness) -> Arc<TransportConfig> {
    Arc::new(transport_config_with(mtu, liveness))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn liveness_refuses_timers_that_cannot_work() {
        let ms = Duration::from_millis;
        assert_eq!(
            Liveness::new(Some(Duration::ZERO), Some(ms(100))),
            Err(LivenessError::ZeroKeepAlive)
        );
        assert_eq!(
            Liveness::new(None, Some(Duration::from_micros(999))),
            Err(LivenessError::IdleTimeoutBelowOneMillisecond(
                Duration::from_micros(999)
            ))
        );
        assert_eq!(
            Liveness::new(Some(ms(100)), Some(ms(100))),
            Err(LivenessError::KeepAliveNotBelowIdleTimeout {
                keep_alive: ms(100),
                idle_timeout: ms(100)
            })
        );
        let huge = Duration::from_secs(u64::MAX);
        assert_eq!(
            Liveness::new(None, Some(huge)),
            Err(LivenessError::IdleTimeoutTooLarge(huge))
        );
        let l = Liveness::new(Some(ms(10)), Some(ms(50))).unwrap();
        assert_eq!(
            (l.keep_alive(), l.idle_timeout()),
            (Some(ms(10)), Some(ms(50)))
        );
        // No idle timeout at all: any keep-alive is allowed.
        assert!(Liveness::new(Some(ms(10)), None).is_ok());
        let msg = LivenessError::KeepAliveNotBelowIdleTimeout {
            keep_alive: ms(2),
            idle_timeout: ms(1),
        }
        .to_string();
        assert!(msg.contains("at most a third"), "{msg}");
    }

    #[test]
    fn dead_after_needs_keep_alives_and_room_below_the_idle_timeout() {
        let ms = Duration::from_millis;
        let a = Liveness::quinn_adapter();
        assert_eq!(a.dead_after(), Some(Liveness::DEFAULT_DEAD_AFTER));
        assert_eq!(
            Liveness::new(a.keep_alive(), a.idle_timeout())
                .unwrap()
                .with_dead_after(a.dead_after()),
            Ok(a)
        );
        assert!(a.keep_alive().unwrap() * 5 <= a.dead_after().unwrap());
        let l = Liveness::new(Some(ms(300)), Some(ms(30_000))).unwrap();
        assert_eq!(l.dead_after(), None, "new() sets no watcher");
        let e = l.with_dead_after(Some(ms(300))).unwrap_err();
        assert!(e.to_string().contains("five keep-alive"), "{e}");
        // Without keep-alives, like an idle timeout without them: allowed.
        let quiet = Liveness::new(None, Some(ms(30_000))).unwrap();
        assert!(quiet.with_dead_after(Some(ms(1500))).is_ok());
        let e = l.with_dead_after(Some(ms(30_000))).unwrap_err();
        assert!(
            e.to_string()
                .contains("idle timer would always close first"),
            "{e}"
        );
        assert_eq!(l.with_dead_after(None), Ok(l));
    }

    #[test]
    fn default_liveness_suits_a_fabric() {
        let l = Liveness::default();
        let (k, i) = (l.keep_alive().unwrap(), l.idle_timeout().unwrap());
        // Accepted by its own checks, several keep-alives per idle period, and a
        // dead peer noticed (idle + keep-alive) within 2 s.
        assert_eq!(Liveness::new(Some(k), Some(i)), Ok(l));
        assert!(k * 3 <= i);
        assert!(i + k <= Duration::from_secs(2));
    }
}
