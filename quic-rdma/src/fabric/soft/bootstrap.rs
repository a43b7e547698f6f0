//! Finding a `soft` peer from a host name/IP and a service port (docs/architecture.md §3).
//!
//! A UD peer is (GID, QPN, Q_Key), plus — for `soft` — the UDP port its socket is
//! bound to. A server publishes those on a TCP *service port*; a client that knows
//! only `host:service_port` asks once, then talks RoCEv2.
//!
//! ## Protocol (version 1), one exchange per TCP connection, ASCII lines
//! ```text
//! client -> server:  QRDMA-SOFT-BOOTSTRAP 1\n
//! server -> client:  QRDMA-SOFT 1 gid=<GID as IPv6 text> qpn=<dec> qkey=<dec> udp_port=<dec> mtu=<dec> [seg=1]\n
//!               or:  ERR <reason>\n
//! ```
//! `seg=1` says the server's socket reassembles segmented datagrams
//! (docs/architecture.md §6); a reply without it is from a server that does
//! not, which must never be sent parts ([`PeerInfo::check_segmentation`]).
//! Then the server closes. The server gives each exchange 5 s from its accept,
//! however the client paces its bytes, and serves up to 64 clients at once; a
//! connection beyond that is answered `ERR busy` at once (a client may retry).
//! Lines are at most 512 bytes; unknown `key=value` fields
//! are ignored by clients (room to grow without a version bump), missing ones are
//! an error. A text protocol so `printf 'QRDMA-SOFT-BOOTSTRAP 1\n' | nc host port`
//! debugs it. It is unauthenticated, like the UDP port it points at: QUIC's TLS
//! handshake authenticates the peer afterwards, so a forged answer can only make
//! the connection fail, not impersonate the server.

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{SoftPort, SoftQp};
use crate::fabric::addr::MAX_QPN;
use crate::fabric::{Gid, Mtu, UdAddr, UdQueuePair};

/// The request line.
pub const REQUEST: &str = "QRDMA-SOFT-BOOTSTRAP 1\n";
/// Longest line either side sends.
pub const MAX_LINE: usize = 512;
const REPLY_TAG: &str = "QRDMA-SOFT";
const VERSION: &str = "1";

/// What a server publishes: how to reach its QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerInfo {
    /// GID, QPN and Q_Key of the server's QP.
    pub addr: UdAddr,
    /// UDP port of the server's `soft` socket (4791 unless configured otherwise).
    pub udp_port: u16,
    /// The server port's active MTU.
    pub mtu: Mtu,
    /// Whether the server's socket reassembles segmented datagrams (`seg=1`;
    /// docs/architecture.md §6, "Segmented datagrams"). Servers before
    /// segmentation do not publish it.
    pub reassembles: bool,
}

/// Why a bootstrap exchange failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BootstrapError {
    /// Connecting, reading or writing failed (including timeouts). The I/O error
    /// is in the message and deliberately not also a `source()`: error reporters
    /// that print the chain would show it twice.
    #[error("bootstrap I/O: {0}")]
    Io(io::Error),
    /// The peer answered something that is not a version-1 reply.
    #[error("bootstrap protocol error: {0}")]
    Protocol(String),
    /// The server answered `ERR`.
    #[error("bootstrap server refused: {0}")]
    Refused(String),
    /// The peer does not reassemble segmented datagrams, which the path's MTU
    /// needs ([`PeerInfo::check_segmentation`]).
    #[error(
        "the peer at {gid} does not reassemble segmented datagrams (no seg=1 in its \
         bootstrap reply), which a path MTU of {mtu} needs for QUIC's 1200-byte \
         datagrams (RFC 9000 §14): upgrade the peer, or enable jumbo frames on both \
         links (RoCE MTU 2048 or more)"
    )]
    CannotReassemble {
        /// The peer's GID.
        gid: Gid,
        /// The path MTU in bytes.
        mtu: usize,
    },
}

impl From<io::Error> for BootstrapError {
    fn from(e: io::Error) -> Self {
        BootstrapError::Io(e)
    }
}

impl PeerInfo {
    /// What to publish for `qp`, whose socket reassembles (the socket's
    /// default; clear `reassembles` for one configured without segmentation).
    pub fn of(qp: &SoftQp) -> PeerInfo {
        let a = qp.attr();
        PeerInfo {
            addr: UdAddr::new(a.gid, a.qpn, a.qkey),
            udp_port: qp.port().local_addr().port(),
            mtu: a.active_mtu,
            reassembles: true,
        }
    }

    /// Refuse to talk to this peer over a path of `mtu` (the smaller of both
    /// ends' active MTUs) when datagrams would have to go as parts — below
    /// 2048 — and the peer does not reassemble: every part would be dropped
    /// on arrival, and the handshake time out with nothing said.
    pub fn check_segmentation(&self, mtu: Mtu) -> Result<(), BootstrapError> {
        if mtu.bytes() >= 2048 || self.reassembles {
            return Ok(());
        }
        Err(BootstrapError::CannotReassemble {
            gid: self.addr.gid,
            mtu: mtu.bytes(),
        })
    }

    /// The reply line (with trailing newline).
    pub fn to_line(&self) -> String {
        format!(
            "{REPLY_TAG} {VERSION} gid={} qpn={} qkey={} udp_port={} mtu={}{}\n",
            self.addr.gid,
            self.addr.qpn,
            self.addr.qkey,
            self.udp_port,
            self.mtu.bytes(),
            if self.reassembles { " seg=1" } else { "" }
        )
    }

    /// Parse a reply line (trailing newline optional).
    pub fn parse(line: &str) -> Result<PeerInfo, BootstrapError> {
        let line = line.trim_end_matches(['\n', '\r']);
        if let Some(reason) = line.strip_prefix("ERR ") {
            return Err(BootstrapError::Refused(reason.to_string()));
        }
        let bad = |what: &str| BootstrapError::Protocol(format!("{what} in {line:?}"));
        let mut words = line.split(' ');
        if words.next() != Some(REPLY_TAG) || words.next() != Some(VERSION) {
            return Err(bad("not a version-1 reply"));
        }
        let (mut gid, mut qpn, mut qkey, mut udp_port, mut mtu) = (None, None, None, None, None);
        let mut reassembles = false;
        for w in words {
            let Some((k, v)) = w.split_once('=') else {
                return Err(bad("field without '='"));
            };
            match k {
                "gid" => {
                    gid = Some(Gid::from(
                        v.parse::<std::net::Ipv6Addr>()
                            .map_err(|_| bad("bad gid"))?,
                    ))
                }
                "qpn" => qpn = Some(v.parse::<u32>().map_err(|_| bad("bad qpn"))?),
                "qkey" => qkey = Some(v.parse::<u32>().map_err(|_| bad("bad qkey"))?),
                "udp_port" => udp_port = Some(v.parse::<u16>().map_err(|_| bad("bad udp_port"))?),
                "mtu" => {
                    let n = v.parse::<usize>().map_err(|_| bad("bad mtu"))?;
                    mtu = Some(Mtu::from_bytes(n).ok_or_else(|| bad("mtu not an IB MTU"))?)
                }
                // Any other value is a capability we do not know: not ours.
                "seg" => reassembles = v == "1",
                _ => {} // forward compatible: ignore what we do not know
            }
        }
        let (Some(gid), Some(qpn), Some(qkey), Some(udp_port), Some(mtu)) =
            (gid, qpn, qkey, udp_port, mtu)
        else {
            return Err(bad("missing field"));
        };
        if qpn > MAX_QPN {
            return Err(bad("qpn above 24 bits"));
        }
        if udp_port == 0 {
            return Err(bad("udp_port 0"));
        }
        Ok(PeerInfo {
            addr: UdAddr::new(gid, qpn, qkey),
            udp_port,
            mtu,
            reassembles,
        })
    }

    /// Point `port`'s sends to this peer at its UDP port (call before `create_ah`).
    pub fn apply(&self, port: &SoftPort) {
        port.set_peer_port(self.addr.gid, self.udp_port);
    }
}

/// Ask the bootstrap server at `server` (host name or IP, and service port).
///
/// `timeout` bounds the TCP connect, and then the whole exchange (request out,
/// reply in) on each address tried.
pub fn query(server: impl ToSocketAddrs, timeout: Duration) -> Result<PeerInfo, BootstrapError> {
    let mut last = None;
    for addr in server.to_socket_addrs()? {
        match query_one(addr, timeout) {
            Ok(info) => return Ok(info),
            Err(BootstrapError::Io(e)) => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(BootstrapError::Io(last.unwrap_or_else(|| {
        io::Error::new(io::ErrorKind::NotFound, "name resolved to no address")
    })))
}

fn query_one(addr: SocketAddr, timeout: Duration) -> Result<PeerInfo, BootstrapError> {
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    let deadline = Instant::now() + timeout;
    s.set_write_timeout(Some(timeout))?;
    s.write_all(REQUEST.as_bytes())?;
    let line = read_line_by(&mut s, deadline)?;
    PeerInfo::parse(&line)
}

/// Read one '\n'-terminated line of at most [`MAX_LINE`] bytes, all of it by
/// `deadline`: each read waits only for what is left of the time, so a peer that
/// trickles a byte at a time cannot stretch the exchange past it. Bytes after
/// the newline are ignored (one exchange per connection).
fn read_line_by(s: &mut TcpStream, deadline: Instant) -> Result<String, BootstrapError> {
    let timed_out = || {
        BootstrapError::Io(io::Error::new(
            io::ErrorKind::TimedOut,
            "no complete line before the deadline",
        ))
    };
    let mut buf = [0u8; MAX_LINE];
    let mut len = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(timed_out());
        }
        s.set_read_timeout(Some(left))?;
        let n = match s.read(&mut buf[len..]) {
            Ok(0) => {
                return Err(BootstrapError::Protocol(
                    "connection closed before a complete line".into(),
                ))
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            // A read timeout shows as WouldBlock on Unix, TimedOut elsewhere.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(timed_out())
            }
            Err(e) => return Err(BootstrapError::Io(e)),
        };
        if let Some(i) = buf[len..len + n].iter().position(|&b| b == b'\n') {
            let line = &buf[..len + i + 1];
            return String::from_utf8(line.to_vec())
                .map_err(|_| BootstrapError::Protocol("line is not UTF-8".into()));
        }
        len += n;
        if len == MAX_LINE {
            return Err(BootstrapError::Protocol(format!(
                "no complete line within {MAX_LINE} bytes"
            )));
        }
    }
}

/// Most exchanges a server runs at once, by default: each is one thread for at
/// most [`DEFAULT_EXCHANGE_DEADLINE`]; connections beyond it get `ERR busy`.
pub const DEFAULT_MAX_CONNECTIONS: usize = 64;
/// How long one whole exchange (request line in, reply out) may take, by default.
pub const DEFAULT_EXCHANGE_DEADLINE: Duration = Duration::from_secs(5);
/// What a client over the connection cap is told before the server closes.
const BUSY: &[u8] = b"ERR busy\n";
/// Stack of an exchange thread.
const EXCHANGE_STACK: usize = 64 * 1024;
/// How often the accept loop of [`BootstrapServer::spawn`] looks at its stop flag.
const ACCEPT_POLL: Duration = Duration::from_millis(20);

/// Counters of a bootstrap server ([`BootstrapHandle::stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BootstrapStats {
    /// Exchanges in progress now (each holds one thread and one connection).
    pub active: usize,
    /// Most exchanges that were ever in progress at once (never above the cap).
    pub peak_active: usize,
    /// TCP connections accepted (including those refused as busy).
    pub accepted: u64,
    /// Replies sent: the peer record, or `ERR` for a request that is not version 1.
    pub answered: u64,
    /// Of those, `ERR` replies to requests that were not version 1.
    pub bad_requests: u64,
    /// Connections over the cap: told `ERR busy` and closed at once, no thread.
    pub refused_busy: u64,
    /// Exchanges cut off at the deadline (a silent or trickling client).
    pub timed_out: u64,
    /// Exchanges that ended otherwise without a reply (the client closed or sent
    /// something that is not a line).
    pub failed: u64,
}

/// State shared by the accept loop and the exchange threads.
#[derive(Debug)]
struct Shared {
    info: PeerInfo,
    max_connections: usize,
    deadline: Duration,
    active: AtomicUsize,
    peak_active: AtomicUsize,
    accepted: AtomicU64,
    answered: AtomicU64,
    bad_requests: AtomicU64,
    refused_busy: AtomicU64,
    timed_out: AtomicU64,
    failed: AtomicU64,
}

/// One taken place under the connection cap; dropping it gives it back.
struct Slot(Arc<Shared>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Shared {
    fn stats(&self) -> BootstrapStats {
        BootstrapStats {
            active: self.active.load(Ordering::Acquire),
            peak_active: self.peak_active.load(Ordering::Relaxed),
            accepted: self.accepted.load(Ordering::Relaxed),
            answered: self.answered.load(Ordering::Relaxed),
            bad_requests: self.bad_requests.load(Ordering::Relaxed),
            refused_busy: self.refused_busy.load(Ordering::Relaxed),
            timed_out: self.timed_out.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
        }
    }

    /// A place under the cap, or `None` when all are taken.
    fn take_slot(self: &Arc<Self>) -> Option<Slot> {
        let max = self.max_connections;
        let n = self
            .active
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()?;
        self.peak_active.fetch_max(n + 1, Ordering::Relaxed);
        Some(Slot(self.clone()))
    }

    /// A freshly accepted connection: its own thread if there is room, else
    /// `ERR busy` and close, with neither a thread nor any state kept for it.
    fn admit(self: &Arc<Self>, s: TcpStream) {
        self.accepted.fetch_add(1, Ordering::Relaxed);
        let Some(slot) = self.take_slot() else {
            self.refused_busy.fetch_add(1, Ordering::Relaxed);
            refuse_busy(s);
            return;
        };
        let spawned = std::thread::Builder::new()
            .name("qr-soft-bootstrap-conn".into())
            // A 512-byte line buffer and a short reply: no need for 2 MiB.
            .stack_size(EXCHANGE_STACK)
            .spawn(move || {
                let shared = slot.0.clone();
                shared.exchange(s);
                drop(slot);
            });
        // A failed spawn drops the closure, and with it the slot and the stream.
        if spawned.is_err() {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// One exchange, all of it within `self.deadline` of now.
    fn exchange(&self, mut s: TcpStream) {
        let deadline = Instant::now() + self.deadline;
        let _ = s.set_nonblocking(false);
        let reply = match read_line_by(&mut s, deadline) {
            Ok(l) if l.trim_end() == REQUEST.trim_end() => self.info.to_line(),
            Ok(_) => {
                self.bad_requests.fetch_add(1, Ordering::Relaxed);
                "ERR unsupported request (expected QRDMA-SOFT-BOOTSTRAP 1)\n".to_string()
            }
            Err(BootstrapError::Io(e)) if e.kind() == io::ErrorKind::TimedOut => {
                self.timed_out.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Err(_) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        // The reply is one short line: it fits the socket buffer of any client
        // that is still there, so this write does not wait on the client.
        let left = deadline.saturating_duration_since(Instant::now());
        let sent = !left.is_zero()
            && s.set_write_timeout(Some(left)).is_ok()
            && s.write_all(reply.as_bytes()).is_ok();
        if sent {
            self.answered.fetch_add(1, Ordering::Relaxed);
        } else {
            self.timed_out.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Tell a client over the cap `ERR busy` without waiting on it, then close.
fn refuse_busy(mut s: TcpStream) {
    if s.set_nonblocking(true).is_ok() {
        // Take what already arrived (its request), so that closing sends FIN
        // rather than the RST that unread data causes — an RST could discard
        // the reply before the client reads it. Best effort: later bytes may
        // still reset the connection, and the client sees an I/O error.
        let mut sink = [0u8; MAX_LINE];
        let _ = s.read(&mut sink);
        let _ = s.write(BUSY);
        let _ = s.shutdown(std::net::Shutdown::Write);
    }
}

/// A bootstrap server: answers every request with one [`PeerInfo`].
///
/// Clients are served concurrently, one thread per exchange up to a cap
/// ([`DEFAULT_MAX_CONNECTIONS`]); each exchange must finish within a deadline
/// ([`DEFAULT_EXCHANGE_DEADLINE`]) counted from its accept, however the client
/// paces its bytes. A slow, silent or malformed client costs only its own
/// connection; beyond the cap, new connections are answered `ERR busy` and
/// closed at once.
#[derive(Debug)]
pub struct BootstrapServer {
    listener: TcpListener,
    shared: Arc<Shared>,
}

impl BootstrapServer {
    /// Listen on `addr` (the service port) publishing `info`, with the default
    /// cap and deadline.
    pub fn bind(addr: impl ToSocketAddrs, info: PeerInfo) -> io::Result<BootstrapServer> {
        Ok(BootstrapServer {
            listener: TcpListener::bind(addr)?,
            shared: Arc::new(Shared {
                info,
                max_connections: DEFAULT_MAX_CONNECTIONS,
                deadline: DEFAULT_EXCHANGE_DEADLINE,
                active: AtomicUsize::new(0),
                peak_active: AtomicUsize::new(0),
                accepted: AtomicU64::new(0),
                answered: AtomicU64::new(0),
                bad_requests: AtomicU64::new(0),
                refused_busy: AtomicU64::new(0),
                timed_out: AtomicU64::new(0),
                failed: AtomicU64::new(0),
            }),
        })
    }

    /// At most `n` exchanges at once (at least 1); more connections are told
    /// `ERR busy`. Call before [`spawn`](Self::spawn).
    pub fn with_max_connections(mut self, n: usize) -> BootstrapServer {
        self.shared_mut().max_connections = n.max(1);
        self
    }

    /// Each exchange must be done within `d` of its accept (at least 1 ms).
    /// Call before [`spawn`](Self::spawn).
    pub fn with_deadline(mut self, d: Duration) -> BootstrapServer {
        self.shared_mut().deadline = d.max(Duration::from_millis(1));
        self
    }

    /// The shared state, still ours alone before `spawn`/`serve_one` share it.
    fn shared_mut(&mut self) -> &mut Shared {
        Arc::get_mut(&mut self.shared).expect("configured before the server is shared")
    }

    /// The listening address (useful after binding port 0).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Accept and answer one client on this thread (blocking, within the
    /// deadline once accepted). Returns the client's address.
    pub fn serve_one(&self) -> io::Result<SocketAddr> {
        let (s, peer) = self.listener.accept()?;
        self.shared.accepted.fetch_add(1, Ordering::Relaxed);
        self.shared.exchange(s);
        Ok(peer)
    }

    /// Counters so far.
    pub fn stats(&self) -> BootstrapStats {
        self.shared.stats()
    }

    /// Serve on a background thread until the handle is dropped: that thread
    /// only accepts; each exchange runs on its own thread (at most the cap).
    pub fn spawn(self) -> io::Result<BootstrapHandle> {
        self.listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let shared = self.shared.clone();
        let listener = self.listener;
        let thread = std::thread::Builder::new()
            .name("qr-soft-bootstrap".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((s, _)) => shared.admit(s),
                        // Non-blocking accept: nothing pending; check `stop` again soon.
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            std::thread::sleep(ACCEPT_POLL)
                        }
                        // E.g. EMFILE: back off rather than spin.
                        Err(_) => std::thread::sleep(ACCEPT_POLL),
                    }
                }
            })?;
        Ok(BootstrapHandle {
            stop,
            thread: Some(thread),
            shared: self.shared,
        })
    }
}

/// A running [`BootstrapServer`]; dropping it stops accepting (exchanges still
/// in progress end by their deadline).
#[derive(Debug)]
pub struct BootstrapHandle {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    shared: Arc<Shared>,
}

impl BootstrapHandle {
    /// Counters so far.
    pub fn stats(&self) -> BootstrapStats {
        self.shared.stats()
    }
}

impl Drop for BootstrapHandle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The IP a bootstrap answer's GID stands for, for the QUIC-level server name
/// check or logging.
pub fn peer_ip(info: &PeerInfo) -> IpAddr {
    info.addr.gid.to_ip()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::soft::SoftConfig;
    use crate::fabric::DEFAULT_QKEY;
    use proptest::prelude::*;

    fn sample() -> PeerInfo {
        PeerInfo {
            addr: UdAddr::new(
                Gid::from(std::net::Ipv4Addr::new(10, 1, 2, 3)),
                0x11,
                DEFAULT_QKEY,
            ),
            udp_port: 4791,
            mtu: Mtu::M4096,
            reassembles: true,
        }
    }

    #[test]
    fn line_round_trip_and_format() {
        let i = sample();
        let l = i.to_line();
        assert_eq!(
            l,
            "QRDMA-SOFT 1 gid=::ffff:10.1.2.3 qpn=17 qkey=285282561 udp_port=4791 mtu=4096 seg=1\n"
        );
        assert_eq!(PeerInfo::parse(&l).unwrap(), i);
        // Unknown fields are ignored.
        let extended = l.trim_end().to_string() + " future=1\n";
        assert_eq!(PeerInfo::parse(&extended).unwrap(), i);
    }

    #[test]
    fn a_peer_without_seg_is_never_sent_parts() {
        // A reply from before segmentation: no seg field.
        let old = PeerInfo::parse(
            "QRDMA-SOFT 1 gid=::ffff:10.1.2.3 qpn=17 qkey=285282561 udp_port=4791 mtu=4096",
        )
        .unwrap();
        assert!(!old.reassembles);
        assert!(
            old.check_segmentation(Mtu::M2048).is_ok(),
            "no parts at 2048"
        );
        let err = old.check_segmentation(Mtu::M1024).unwrap_err();
        assert!(matches!(
            err,
            BootstrapError::CannotReassemble { mtu: 1024, .. }
        ));
        assert!(err.to_string().contains("seg=1"), "{err}");
        assert!(sample().check_segmentation(Mtu::M1024).is_ok());
        let unknown = PeerInfo::parse(&sample().to_line().replace("seg=1", "seg=2")).unwrap();
        assert!(
            !unknown.reassembles,
            "an unknown capability value is not ours"
        );
    }

    #[test]
    fn rejects_bad_replies() {
        for l in [
            "",
            "QRDMA-SOFT 2 gid=::1 qpn=1 qkey=1 udp_port=1 mtu=4096",
            "QRDMA-SOFT 1 gid=::1 qpn=1 qkey=1 udp_port=1",
            "QRDMA-SOFT 1 gid=::1 qpn=16777216 qkey=1 udp_port=1 mtu=4096",
            "QRDMA-SOFT 1 gid=::1 qpn=1 qkey=1 udp_port=1 mtu=1500",
            "QRDMA-SOFT 1 gid=x qpn=1 qkey=1 udp_port=1 mtu=4096",
            "QRDMA-SOFT 1 gid",
        ] {
            assert!(
                matches!(PeerInfo::parse(l), Err(BootstrapError::Protocol(_))),
                "{l:?}"
            );
        }
        assert!(matches!(
            PeerInfo::parse("ERR busy\n"),
            Err(BootstrapError::Refused(r)) if r == "busy"
        ));
    }

    #[test]
    fn query_a_live_server() {
        let port =
            SoftPort::open(SoftConfig::new("127.85.0.1".parse().unwrap()).with_port(0)).unwrap();
        let qp = port.create_qp(DEFAULT_QKEY).unwrap();
        let info = PeerInfo::of(&qp);
        let server = BootstrapServer::bind("127.0.0.1:0", info).unwrap();
        let at = server.local_addr().unwrap();
        let handle = server.spawn().unwrap();
        let got = query(at, Duration::from_secs(2)).unwrap();
        assert_eq!(got, info);
        assert_eq!(got.udp_port, port.local_addr().port());
        assert_eq!(peer_ip(&got), "127.85.0.1".parse::<IpAddr>().unwrap());
        // A wrong request gets ERR; garbage does not kill the server.
        let mut s = TcpStream::connect(at).unwrap();
        s.write_all(b"HELLO\n").unwrap();
        let mut reply = String::new();
        s.read_to_string(&mut reply).unwrap();
        assert!(reply.starts_with("ERR "), "{reply}");
        assert_eq!(query(at, Duration::from_secs(2)).unwrap(), info);
        drop(handle);
    }

    /// Poll `f` until it holds or `limit` passes; whether it held.
    fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
        let end = Instant::now() + limit;
        while Instant::now() < end {
            if f() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        f()
    }

    /// A client that trickles its request (a byte every 500 ms, so no
    /// per-read timeout ever fires) and 20 idle connections do not delay
    /// anyone else's query: each connection is served on its own, so the query
    /// below does not wait behind the trickler, and the trickler is cut at the
    /// whole-exchange deadline rather than when it stops sending.
    #[test]
    fn slow_and_idle_clients_do_not_block_a_query() {
        let server = BootstrapServer::bind("127.93.0.1:0", sample()).unwrap();
        let at = server.local_addr().unwrap();
        let handle = server.spawn().unwrap();

        let slow = TcpStream::connect(at).unwrap();
        let slow_since = Instant::now();
        let mut trickle = slow.try_clone().unwrap();
        // Up to 12 s of trickling (no newline), stopping once the server has
        // closed: well past the 5 s deadline, so "cut at the deadline" and
        // "cut when the client stops" tell apart.
        let trickler = std::thread::spawn(move || {
            for &b in REQUEST
                .as_bytes()
                .iter()
                .cycle()
                .filter(|&&b| b != b'\n')
                .take(24)
            {
                if trickle.write_all(&[b]).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(500));
            }
        });
        // The trickler is accepted (and, before the fix, being served) first.
        std::thread::sleep(Duration::from_millis(200));
        let idle: Vec<TcpStream> = (0..20).map(|_| TcpStream::connect(at).unwrap()).collect();
        std::thread::sleep(Duration::from_millis(100));

        let t = Instant::now();
        let got = query(at, Duration::from_secs(5));
        let took = t.elapsed();
        assert_eq!(got.unwrap(), sample());
        assert!(took < Duration::from_secs(2), "query took {took:?}");

        // The server closes the trickler at its deadline (5 s after accept).
        let mut slow = slow;
        slow.set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut byte = [0u8; 1];
        let closed = slow.read(&mut byte);
        let cut_after = slow_since.elapsed();
        assert!(
            matches!(closed, Ok(0)) || closed.is_err(),
            "server sent {closed:?} to a client with no request"
        );
        assert!(
            cut_after < Duration::from_secs(9),
            "trickling client held its connection for {cut_after:?}"
        );
        trickler.join().unwrap();
        let st = handle.stats();
        assert!(st.timed_out >= 1, "{st:?}");
        assert!(st.answered >= 1, "{st:?}");
        drop(idle);
        drop(handle);
    }

    /// Beyond the cap, connections get `ERR busy` at once and no
    /// exchange (thread) of their own; once the held ones go, service resumes.
    #[test]
    fn connection_cap_holds() {
        let server = BootstrapServer::bind("127.93.0.2:0", sample())
            .unwrap()
            .with_max_connections(3)
            .with_deadline(Duration::from_secs(30));
        let at = server.local_addr().unwrap();
        let handle = server.spawn().unwrap();
        let held: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(at).unwrap()).collect();
        assert!(
            eventually(Duration::from_secs(5), || handle.stats().active == 3),
            "{:?}",
            handle.stats()
        );
        for i in 0..5 {
            let mut s = TcpStream::connect(at).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let t = Instant::now();
            let mut reply = String::new();
            s.read_to_string(&mut reply).unwrap();
            assert_eq!(reply, "ERR busy\n", "connection {i}");
            assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        }
        // The client side reads it as a refusal.
        assert!(matches!(
            query(at, Duration::from_secs(2)),
            Err(BootstrapError::Refused(r)) if r == "busy"
        ));
        let st = handle.stats();
        assert_eq!((st.active, st.peak_active), (3, 3), "{st:?}");
        assert_eq!((st.accepted, st.refused_busy), (9, 6), "{st:?}");
        assert_eq!(st.answered, 0, "{st:?}");
        // The held clients leave: their exchanges end, the slots come back.
        drop(held);
        assert!(
            eventually(Duration::from_secs(5), || handle.stats().active == 0),
            "{:?}",
            handle.stats()
        );
        assert_eq!(query(at, Duration::from_secs(2)).unwrap(), sample());
        // The server counts the answer after its write, which the client may
        // read first.
        assert!(
            eventually(Duration::from_secs(5), || {
                let st = handle.stats();
                (st.failed, st.answered, st.peak_active, st.active) == (3, 1, 3, 0)
            }),
            "{:?}",
            handle.stats()
        );
    }

    proptest! {
        #[test]
        fn parse_never_panics(s in "\\PC{0,200}") {
            let _ = PeerInfo::parse(&s);
        }
    }
}
