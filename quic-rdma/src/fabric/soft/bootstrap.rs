//! Finding a `soft` peer from a host name/IP and a service port (DESIGN.md §3).
//!
//! A UD peer is (GID, QPN, Q_Key), plus — for `soft` — the UDP port its socket is
//! bound to. A server publishes those on a TCP *service port*; a client that knows
//! only `host:service_port` asks once, then talks RoCEv2.
//!
//! ## Protocol (version 1), one exchange per TCP connection, ASCII lines
//! ```text
//! client -> server:  QRDMA-SOFT-BOOTSTRAP 1\n
//! server -> client:  QRDMA-SOFT 1 gid=<GID as IPv6 text> qpn=<dec> qkey=<dec> udp_port=<dec> mtu=<dec>\n
//!               or:  ERR <reason>\n
//! ```
//! then the server closes. Lines are at most 512 bytes; unknown `key=value` fields
//! are ignored by clients (room to grow without a version bump), missing ones are
//! an error. A text protocol so `printf 'QRDMA-SOFT-BOOTSTRAP 1\n' | nc host port`
//! debugs it. It is unauthenticated, like the UDP port it points at: QUIC's TLS
//! handshake authenticates the peer afterwards, so a forged answer can only make
//! the connection fail, not impersonate the server.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::{SoftPort, SoftQp};
use crate::fabric::addr::MAX_QPN;
use crate::fabric::{Gid, Mtu, UdAddr, UdQueuePair};

/// The request line.
pub const REQUEST: &str = "QRDMA-SOFT-BOOTSTRAP 1\n";
/// Longest line either side sends.
pub const MAX_LINE: usize = 512;
const REPLY_TAG: &str = "QRDMA-SOFT";
const VERSION: &str = "1";
/// How long a server waits for a client's request line.
const SERVER_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// What a server publishes: how to reach its QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerInfo {
    /// GID, QPN and Q_Key of the server's QP.
    pub addr: UdAddr,
    /// UDP port of the server's `soft` socket (4791 unless configured otherwise).
    pub udp_port: u16,
    /// The server port's active MTU.
    pub mtu: Mtu,
}

/// Why a bootstrap exchange failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BootstrapError {
    /// Connecting, reading or writing failed (including timeouts).
    #[error("bootstrap I/O: {0}")]
    Io(#[from] io::Error),
    /// The peer answered something that is not a version-1 reply.
    #[error("bootstrap protocol error: {0}")]
    Protocol(String),
    /// The server answered `ERR`.
    #[error("bootstrap server refused: {0}")]
    Refused(String),
}

impl PeerInfo {
    /// What to publish for `qp`.
    pub fn of(qp: &SoftQp) -> PeerInfo {
        let a = qp.attr();
        PeerInfo {
            addr: UdAddr::new(a.gid, a.qpn, a.qkey),
            udp_port: qp.port().local_addr().port(),
            mtu: a.active_mtu,
        }
    }

    /// The reply line (with trailing newline).
    pub fn to_line(&self) -> String {
        format!(
            "{REPLY_TAG} {VERSION} gid={} qpn={} qkey={} udp_port={} mtu={}\n",
            self.addr.gid,
            self.addr.qpn,
            self.addr.qkey,
            self.udp_port,
            self.mtu.bytes()
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
        })
    }

    /// Point `port`'s sends to this peer at its UDP port (call before `create_ah`).
    pub fn apply(&self, port: &SoftPort) {
        port.set_peer_port(self.addr.gid, self.udp_port);
    }
}

/// Ask the bootstrap server at `server` (host name or IP, and service port).
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
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    s.write_all(REQUEST.as_bytes())?;
    let line = read_line(&mut s)?;
    PeerInfo::parse(&line)
}

/// Read one '\n'-terminated line of at most [`MAX_LINE`] bytes.
fn read_line(s: &mut TcpStream) -> Result<String, BootstrapError> {
    let mut r = BufReader::new(s.take(MAX_LINE as u64));
    let mut line = String::new();
    r.read_line(&mut line).map_err(|e| match e.kind() {
        io::ErrorKind::InvalidData => BootstrapError::Protocol("line is not UTF-8".into()),
        _ => BootstrapError::Io(e),
    })?;
    if !line.ends_with('\n') {
        return Err(BootstrapError::Protocol(format!(
            "no complete line within {MAX_LINE} bytes"
        )));
    }
    Ok(line)
}

/// A bootstrap server: answers every request with one [`PeerInfo`].
#[derive(Debug)]
pub struct BootstrapServer {
    listener: TcpListener,
    info: PeerInfo,
}

impl BootstrapServer {
    /// Listen on `addr` (the service port) publishing `info`.
    pub fn bind(addr: impl ToSocketAddrs, info: PeerInfo) -> io::Result<BootstrapServer> {
        Ok(BootstrapServer {
            listener: TcpListener::bind(addr)?,
            info,
        })
    }

    /// The listening address (useful after binding port 0).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Accept and answer one client (blocking). Returns the client's address.
    pub fn serve_one(&self) -> io::Result<SocketAddr> {
        let (s, peer) = self.listener.accept()?;
        self.answer(s);
        Ok(peer)
    }

    /// A malformed or slow client only costs its own connection.
    fn answer(&self, mut s: TcpStream) {
        let _ = s.set_nonblocking(false);
        let _ = s.set_read_timeout(Some(SERVER_READ_TIMEOUT));
        let _ = s.set_write_timeout(Some(SERVER_READ_TIMEOUT));
        let reply = match read_line(&mut s) {
            Ok(l) if l == REQUEST || l.trim_end() == REQUEST.trim_end() => self.info.to_line(),
            Ok(_) => "ERR unsupported request (expected QRDMA-SOFT-BOOTSTRAP 1)\n".to_string(),
            Err(_) => return,
        };
        let _ = s.write_all(reply.as_bytes());
    }

    /// Serve on a background thread until the handle is dropped.
    pub fn spawn(self) -> io::Result<BootstrapHandle> {
        self.listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("qr-soft-bootstrap".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    match self.listener.accept() {
                        Ok((s, _)) => self.answer(s),
                        // Non-blocking accept: nothing pending; check `stop` again soon.
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(20))
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(20)),
                    }
                }
            })?;
        Ok(BootstrapHandle {
            stop,
            thread: Some(thread),
        })
    }
}

/// A running [`BootstrapServer`]; dropping it stops the server.
#[derive(Debug)]
pub struct BootstrapHandle {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
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
        }
    }

    #[test]
    fn line_round_trip_and_format() {
        let i = sample();
        let l = i.to_line();
        assert_eq!(
            l,
            "QRDMA-SOFT 1 gid=::ffff:10.1.2.3 qpn=17 qkey=285282561 udp_port=4791 mtu=4096\n"
        );
        assert_eq!(PeerInfo::parse(&l).unwrap(), i);
        // Unknown fields are ignored.
        let extended = l.trim_end().to_string() + " future=1\n";
        assert_eq!(PeerInfo::parse(&extended).unwrap(), i);
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

    proptest! {
        #[test]
        fn parse_never_panics(s in "\\PC{0,200}") {
            let _ = PeerInfo::parse(&s);
        }
    }
}
