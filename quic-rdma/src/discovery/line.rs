//! Reading one protocol line within a deadline, for both ends of an exchange.

use std::io::{self, Read};
use std::net::TcpStream;
use std::time::Instant;

use super::record::{BootstrapError, MAX_LINE};

/// Read one '\n'-terminated line of at most [`MAX_LINE`] bytes, all of it by
/// `deadline`: each read waits only for what is left of the time, so a peer that
/// trickles a byte at a time cannot stretch the exchange past it. Bytes after
/// the newline are ignored (one exchange per connection).
pub(super) fn read_line_by(s: &mut TcpStream, deadline: Instant) -> Result<String, BootstrapError> {
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
