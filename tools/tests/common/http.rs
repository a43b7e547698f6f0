//! A plain HTTP/1.1 GET for the tests' scrapes of `/metrics` and `/status`:
//! one request per connection (`Connection: close`), as a scraper sends it.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// GET http://addr{path}: (status code, body).
pub fn get(addr: &str, path: &str) -> std::io::Result<(u16, String)> {
    get_with(addr, path, "")
}

/// GET http://addr{path} with `headers` (each line ending in CRLF).
pub fn get_with(addr: &str, path: &str, headers: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{headers}\r\n"
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, out.clone());
    let (head, body) = out.split_once("\r\n\r\n").ok_or_else(bad)?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(bad)?;
    Ok((code, body.to_string()))
}

/// The body of a 200 answer to GET http://addr{path}, or `None`.
pub fn get_ok(addr: &str, path: &str) -> Option<String> {
    match get(addr, path) {
        Ok((200, body)) => Some(body),
        _ => None,
    }
}

/// Retry `attempt` every 50 ms until it gives a value, for at most 20 s: an
/// endpoint just started. Panics naming `addr` if it never does.
pub fn when_up<T>(addr: &str, mut attempt: impl FnMut() -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(v) = attempt() {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{addr} never answered"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
