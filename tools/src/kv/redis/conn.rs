//! A buffered TCP link to a Redis peer: reply lines for the handshake, raw
//! reads for the snapshot and the command stream.

use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::error::RelayError;
use super::reply::{Reply, MAX_DECODED};
use super::resp::encode_command;

/// Longest reply line accepted in a handshake.
const MAX_REPLY: usize = 1024;

/// How long a handshake reply may take.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// A TCP link with a read buffer.
#[derive(Debug)]
pub struct RedisConn {
    /// The socket.
    pub stream: TcpStream,
    /// Bytes read but not yet consumed.
    pub buf: BytesMut,
}

impl RedisConn {
    /// Wrap an established socket.
    pub fn new(stream: TcpStream) -> RedisConn {
        let _ = stream.set_nodelay(true);
        RedisConn {
            stream,
            buf: BytesMut::with_capacity(256 << 10),
        }
    }

    /// Connect to `addr` (host:port) within 5 s.
    pub async fn connect(addr: &str) -> Result<RedisConn, RelayError> {
        let s = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(addr))
            .await
            .map_err(|_| RelayError::Timeout("connecting to a Redis server"))??;
        Ok(RedisConn::new(s))
    }

    /// Read more bytes into the buffer; an error at end of stream.
    pub async fn fill(&mut self) -> Result<usize, RelayError> {
        if self.buf.capacity() - self.buf.len() < 64 << 10 {
            self.buf.reserve(256 << 10);
        }
        let n = self.stream.read_buf(&mut self.buf).await?;
        if n == 0 {
            return Err(RelayError::Io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the peer closed the connection",
            )));
        }
        Ok(n)
    }

    /// Send a command (RESP array).
    pub async fn send(&mut self, args: &[&[u8]]) -> Result<(), RelayError> {
        self.stream.write_all(&encode_command(args)).await?;
        Ok(())
    }

    /// Read one reply line (without CRLF), skipping the bare newlines a master
    /// sends as keep-alives while it prepares a snapshot.
    pub async fn reply_line(&mut self) -> Result<String, RelayError> {
        tokio::time::timeout(REPLY_TIMEOUT, async {
            loop {
                while self.buf.first() == Some(&b'\n') {
                    let _ = self.buf.split_to(1);
                }
                if let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
                    let line = self.buf.split_to(i + 1);
                    let line = line.strip_suffix(b"\r\n").ok_or_else(|| {
                        RelayError::Handshake("reply line not terminated by CRLF".into())
                    })?;
                    return String::from_utf8(line.to_vec())
                        .map_err(|_| RelayError::Handshake("reply line is not text".into()));
                }
                if self.buf.len() > MAX_REPLY {
                    return Err(RelayError::Handshake(format!(
                        "reply line longer than {MAX_REPLY} bytes"
                    )));
                }
                self.fill().await?;
            }
        })
        .await
        .map_err(|_| RelayError::Timeout("a reply from the Redis master"))?
    }

    /// Read one whole RESP2 reply (a control answer: `ROLE`, `SENTINEL`),
    /// within [`REPLY_TIMEOUT`] and [`MAX_DECODED`] bytes.
    pub async fn reply(&mut self) -> Result<Reply, RelayError> {
        tokio::time::timeout(REPLY_TIMEOUT, async {
            loop {
                if let Some((r, used)) = Reply::decode(&self.buf)? {
                    let _ = self.buf.split_to(used);
                    return Ok(r);
                }
                if self.buf.len() > MAX_DECODED {
                    return Err(RelayError::Handshake(format!(
                        "reply longer than {MAX_DECODED} bytes"
                    )));
                }
                self.fill().await?;
            }
        })
        .await
        .map_err(|_| RelayError::Timeout("a reply from a Redis server"))?
    }

    /// Send a command and require a `+` reply; the reply text.
    pub async fn command_ok(&mut self, args: &[&[u8]]) -> Result<String, RelayError> {
        self.send(args).await?;
        let r = self.reply_line().await?;
        if r.starts_with('+') {
            Ok(r)
        } else {
            Err(RelayError::Handshake(format!(
                "{} answered {r:?}",
                String::from_utf8_lossy(args[0])
            )))
        }
    }
}
