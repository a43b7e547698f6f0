//! The discovery service: a threaded TCP server answering every request with
//! one [`PeerInfo`], each exchange within a deadline, up to a cap.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::line::read_line_by;
use super::record::{BootstrapError, PeerInfo, MAX_LINE, REQUEST};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::record::tests::sample;
    use crate::discovery::{peer_ip, query};
    use crate::fabric::soft::{SoftConfig, SoftPort};
    use crate::fabric::DEFAULT_QKEY;
    use std::net::IpAddr;

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
}
