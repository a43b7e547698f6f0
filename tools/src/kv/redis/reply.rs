//! RESP2 replies (https://redis.io/docs/latest/develop/reference/protocol-spec/):
//! simple strings, errors, integers, bulk strings and arrays. The relay's
//! Redis port encodes them; the links to Redis servers and Sentinels decode
//! the short control answers they get (`ROLE`, `SENTINEL`, `CLUSTER
//! SHARDS`). Text that came from a client (a command name in an error) is made safe first: a CR or LF
//! in a simple string or error would end the reply early and let the client
//! inject a reply of its own.

use std::fmt::Write as _;

use super::resp::RespError;

/// Largest reply [`Reply::decode`] accepts, in bytes: the relay decodes
/// only short control answers, never data.
pub const MAX_DECODED: usize = 64 << 10;

/// Deepest nesting of arrays [`Reply::decode`] accepts (`ROLE` nests two,
/// `CLUSTER SHARDS` four).
const MAX_DEPTH: usize = 4;

/// One RESP2 reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// `+text` (no CR or LF inside).
    Simple(String),
    /// `-text`: the first word is the error's code (`ERR`, `NOAUTH`, ...).
    Error(String),
    /// `:n`.
    Int(i64),
    /// `$len` and the bytes; `None` is the null bulk string `$-1`.
    Bulk(Option<Vec<u8>>),
    /// `*n` and the elements.
    Array(Vec<Reply>),
}

impl Reply {
    /// `+OK`.
    pub fn ok() -> Reply {
        Reply::Simple("OK".into())
    }

    /// `-ERR <text>`, with `text` made safe for a one-line reply.
    pub fn err(text: &str) -> Reply {
        Reply::Error(format!("ERR {}", printable(text, 512)))
    }

    /// A bulk string of `text`.
    pub fn bulk(text: impl Into<Vec<u8>>) -> Reply {
        Reply::Bulk(Some(text.into()))
    }

    /// The reply's RESP encoding.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode_into(&mut out);
        out
    }

    /// Decode one reply from the front of `buf`: `Ok(None)` while more bytes
    /// are needed, else the reply and the bytes it took. A null array
    /// (`*-1`) decodes as the null bulk string: RESP2 has one null, written
    /// two ways.
    pub fn decode(buf: &[u8]) -> Result<Option<(Reply, usize)>, RespError> {
        let mut at = 0;
        Ok(decode_at(buf, &mut at, 0)?.map(|r| (r, at)))
    }

    fn encode_into(&self, out: &mut Vec<u8>) {
        match self {
            Reply::Simple(s) => line(out, '+', &printable(s, usize::MAX)),
            Reply::Error(s) => line(out, '-', &printable(s, usize::MAX)),
            Reply::Int(n) => line(out, ':', &n.to_string()),
            Reply::Bulk(None) => out.extend_from_slice(b"$-1\r\n"),
            Reply::Bulk(Some(b)) => {
                line(out, '$', &b.len().to_string());
                out.extend_from_slice(b);
                out.extend_from_slice(b"\r\n");
            }
            Reply::Array(v) => {
                line(out, '*', &v.len().to_string());
                for r in v {
                    r.encode_into(out);
                }
            }
        }
    }
}

fn bad(at: usize, why: &'static str) -> RespError {
    RespError::Header { at: at as u64, why }
}

/// The CRLF-terminated line at `*at` (moving past it), or `None` if it is
/// not complete yet.
fn header_line<'a>(buf: &'a [u8], at: &mut usize) -> Result<Option<&'a str>, RespError> {
    let start = *at;
    let Some(i) = buf[start..].iter().position(|&b| b == b'\n') else {
        return if buf.len() - start > MAX_DECODED {
            Err(bad(start, "line too long"))
        } else {
            Ok(None)
        };
    };
    if i > MAX_DECODED {
        return Err(bad(start, "line too long"));
    }
    let line = buf[start..start + i]
        .strip_suffix(b"\r")
        .ok_or(bad(start, "not CRLF-terminated"))?;
    *at = start + i + 1;
    std::str::from_utf8(line)
        .map(Some)
        .map_err(|_| bad(start, "not text"))
}

fn decode_at(buf: &[u8], at: &mut usize, depth: usize) -> Result<Option<Reply>, RespError> {
    let start = *at;
    let Some(&kind) = buf.get(start) else {
        return Ok(None);
    };
    *at += 1;
    let Some(text) = header_line(buf, at)? else {
        return Ok(None);
    };
    let len = || -> Result<Option<usize>, RespError> {
        match text.parse::<i64>() {
            Ok(-1) => Ok(None),
            Ok(n) if (0..=MAX_DECODED as i64).contains(&n) => Ok(Some(n as usize)),
            Ok(len) => Err(RespError::TooLong {
                at: start as u64,
                len,
            }),
            Err(_) => Err(bad(start, "length is not a number")),
        }
    };
    Ok(Some(match kind {
        b'+' => Reply::Simple(text.to_string()),
        b'-' => Reply::Error(text.to_string()),
        b':' => Reply::Int(
            text.parse()
                .map_err(|_| bad(start, "integer is not a number"))?,
        ),
        b'$' => match len()? {
            None => Reply::Bulk(None),
            Some(n) => {
                let Some(body) = buf.get(*at..*at + n + 2) else {
                    return Ok(None);
                };
                if &body[n..] != b"\r\n" {
                    return Err(RespError::Terminator {
                        at: (*at + n) as u64,
                    });
                }
                *at += n + 2;
                Reply::Bulk(Some(body[..n].to_vec()))
            }
        },
        b'*' => match len()? {
            None => Reply::Bulk(None),
            Some(_) if depth >= MAX_DEPTH => return Err(bad(start, "arrays nested too deep")),
            Some(n) => {
                // Each element takes at least 3 bytes: no allocation beyond
                // what the buffer could hold.
                let mut v = Vec::with_capacity(n.min((buf.len() - *at) / 3));
                for _ in 0..n {
                    match decode_at(buf, at, depth + 1)? {
                        Some(r) => v.push(r),
                        None => return Ok(None),
                    }
                }
                Reply::Array(v)
            }
        },
        _ => return Err(bad(start, "not a RESP2 reply type")),
    }))
}

fn line(out: &mut Vec<u8>, kind: char, text: &str) {
    let mut s = String::with_capacity(text.len() + 3);
    let _ = write!(s, "{kind}{text}\r\n");
    out.extend_from_slice(s.as_bytes());
}

/// `text` with every control character (CR and LF among them) replaced by
/// `?`, cut to at most `max` characters.
pub fn printable(text: &str, max: usize) -> String {
    text.chars()
        .take(max)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_resp2() {
        let r = Reply::Array(vec![
            Reply::bulk("master"),
            Reply::Int(42),
            Reply::Array(vec![]),
            Reply::Bulk(None),
            Reply::ok(),
        ]);
        assert_eq!(
            r.encode(),
            b"*5\r\n$6\r\nmaster\r\n:42\r\n*0\r\n$-1\r\n+OK\r\n".to_vec()
        );
    }

    #[test]
    fn decodes_what_it_encodes_and_waits_for_more() {
        let r = Reply::Array(vec![
            Reply::bulk("master"),
            Reply::Int(-42),
            Reply::Array(vec![Reply::Array(vec![Reply::bulk("127.0.0.1")])]),
            Reply::Bulk(None),
            Reply::Error("ERR x".into()),
            Reply::ok(),
        ]);
        let mut b = r.encode();
        b.extend_from_slice(b"+next\r\n");
        for cut in 0..b.len() - 7 {
            assert_eq!(Reply::decode(&b[..cut]).unwrap(), None, "cut at {cut}");
        }
        assert_eq!(Reply::decode(&b).unwrap(), Some((r, b.len() - 7)));
        assert_eq!(
            Reply::decode(b"*-1\r\n").unwrap(),
            Some((Reply::Bulk(None), 5))
        );
    }

    #[test]
    fn refuses_what_is_not_a_reply() {
        for bad in [
            &b"?x\r\n"[..],
            b":12a\r\n",
            b"$3\r\nabcd\r\n",
            b"$-2\r\n",
            b"*99999999\r\n",
            b"+ok\n",
            b"*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n",
        ] {
            assert!(
                Reply::decode(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let long = vec![b'+'; MAX_DECODED + 2];
        assert!(Reply::decode(&long).is_err());
    }

    #[test]
    fn client_text_cannot_inject_a_reply() {
        let r = Reply::err("unknown command 'x\r\n+OK'");
        assert_eq!(r.encode(), b"-ERR unknown command 'x??+OK'\r\n".to_vec());
    }
}
