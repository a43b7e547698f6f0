//! Asking a discovery service for its record: once ([`query`]) or, while the
//! server is still starting or at its connection cap, until a deadline
//! ([`query_within`]).

use std::io::{self, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::line::read_line_by;
use super::record::{BootstrapError, PeerInfo, REQUEST};

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

/// Ask `server` (host:port) for its record, retrying connection failures
/// and `ERR busy` (a server at its connection cap) until `wait` has passed;
/// protocol errors and other refusals fail at once. Each attempt has 2 s.
pub fn query_within(server: &str, wait: Duration) -> Result<PeerInfo, BootstrapError> {
    let deadline = Instant::now() + wait;
    loop {
        match query(server, Duration::from_secs(2)) {
            Ok(info) => return Ok(info),
            Err(e @ BootstrapError::Io(_)) if Instant::now() < deadline => {
                tracing::debug!("bootstrap {server}: {e}; retrying");
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(BootstrapError::Refused(r)) if r == "busy" && Instant::now() < deadline => {
                tracing::debug!("bootstrap {server}: busy; retrying");
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => return Err(e),
        }
    }
}
