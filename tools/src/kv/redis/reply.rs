//! Replies the relay's Redis port sends, encoded as RESP2
//! (https://redis.io/docs/latest/develop/reference/protocol-spec/): simple
//! strings, errors, integers, bulk strings and arrays. Text that came from a
//! client (a command name in an error) is made safe first: a CR or LF in a
//! simple string or error would end the reply early and let the client
//! inject a reply of its own.

use std::fmt::Write as _;

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
    fn client_text_cannot_inject_a_reply() {
        let r = Reply::err("unknown command 'x\r\n+OK'");
        assert_eq!(r.encode(), b"-ERR unknown command 'x??+OK'\r\n".to_vec());
    }
}
