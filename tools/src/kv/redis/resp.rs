//! A streaming RESP parser for replication links, sans-IO.
//!
//! Both directions of a Redis replication link carry commands as RESP arrays
//! of bulk strings (the "multibulk" form, https://redis.io/docs/latest/develop/reference/protocol-spec/):
//! the master's command stream to its replica, and the replica's
//! `PING`/`REPLCONF`/`PSYNC` to its master. A replica also sends a bare `\n`
//! while it loads a snapshot (a keep-alive, replication.c
//! `replicationSendNewlineToMaster`), which we accept as an empty command.
//!
//! The parser frames commands without holding them: it walks bulk payloads by
//! length, keeping only the first few short arguments (up to [`MAX_CAPTURE`]
//! of up to [`MAX_CAPTURED_ARG`] bytes), which is all a relay needs to
//! recognise `REPLCONF GETACK` in a master's stream (four kept there, every
//! command of the stream passing through) or a replica's `REPLCONF capa eof
//! capa psync2` (five; eight kept on a client port). Memory stays bounded
//! whatever the sizes.
//!
//! A client of the relay's Redis port (redis-cli, a monitoring tool, someone
//! in telnet) may also send the *inline* form, a line of words ending in LF
//! (RESP spec, "Inline commands"): [`Parser::for_clients`] frames those too,
//! as a [`Command`] marked [`Command::inline`], so the relay can answer it
//! with an error and keep the connection. A master's command stream is never
//! inline: [`Parser::new`] refuses it.

use bytes::Bytes;

/// Arguments of a command kept for inspection.
pub const MAX_CAPTURE: usize = 8;
/// Arguments kept per command of a master's stream ([`Parser::new`]).
const STREAM_CAPTURE: usize = 4;
/// Longest argument kept for inspection (longer ones appear as `None`).
pub const MAX_CAPTURED_ARG: usize = 256;
/// Longest header line (`*<n>\r\n`, `$<n>\r\n`).
const MAX_LINE: usize = 32;
/// Largest bulk string: Redis's default `proto-max-bulk-len` (512 MiB).
pub const MAX_BULK: u64 = 512 << 20;
/// Most elements in one command.
pub const MAX_ELEMENTS: u64 = 1 << 31;
/// Longest inline command line: Redis's `PROTO_INLINE_MAX_SIZE` (64 KiB),
/// beyond which Redis too answers "too big inline request" and closes.
pub const MAX_INLINE: u64 = 64 << 10;

/// Why input is not valid RESP for a replication link.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RespError {
    /// A command must be an array (`*`); this byte starts something else.
    #[error("expected a RESP array ('*') at byte {at}, got {got:#04x}")]
    NotArray {
        /// Stream offset of the offending byte.
        at: u64,
        /// The byte.
        got: u8,
    },
    /// An array element must be a bulk string (`$`).
    #[error("expected a bulk string ('$') at byte {at}, got {got:#04x}")]
    NotBulk {
        /// Stream offset of the offending byte.
        at: u64,
        /// The byte.
        got: u8,
    },
    /// A header line is not a number, too long, or not CRLF-terminated.
    #[error("bad RESP header line at byte {at}: {why}")]
    Header {
        /// Stream offset where the line began.
        at: u64,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A length beyond the limits ([`MAX_BULK`], [`MAX_ELEMENTS`]).
    #[error("RESP length {len} at byte {at} exceeds the limit")]
    TooLong {
        /// Stream offset of the header.
        at: u64,
        /// The length given.
        len: i64,
    },
    /// A bulk string not followed by CRLF.
    #[error("bulk string at byte {at} not terminated by CRLF")]
    Terminator {
        /// Stream offset where CRLF was expected.
        at: u64,
    },
}

/// One complete command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Command {
    /// Stream offset just past its last byte.
    pub end: u64,
    /// Number of arguments (0 for a bare newline keep-alive).
    pub argc: u64,
    /// The first arguments, where short enough (`None` if longer).
    pub args: Vec<Option<Bytes>>,
    /// Sent in the inline form (a line of words), not as a RESP array.
    pub inline: bool,
}

impl Command {
    /// Argument `i` as text, lowercased (command names, subcommands).
    pub fn arg_lower(&self, i: usize) -> Option<String> {
        self.args
            .get(i)?
            .as_ref()
            .map(|b| String::from_utf8_lossy(b).to_ascii_lowercase())
    }

    /// Argument `i` as text.
    pub fn arg(&self, i: usize) -> Option<String> {
        self.args
            .get(i)?
            .as_ref()
            .map(|b| String::from_utf8_lossy(b).into_owned())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Between commands.
    Start,
    /// In the `*<n>` line.
    ArrayLine,
    /// Expecting `$` of the next element.
    Element,
    /// In a `$<n>` line.
    BulkLine,
    /// Inside a bulk payload: bytes left.
    Payload(u64),
    /// Expecting CR then LF after a payload (0: CR next, 1: LF next).
    Crlf(u8),
    /// Inside a bare "\r\n" keep-alive: LF next.
    KeepAliveLf,
    /// Inside an inline command line: bytes so far.
    Inline(u64),
}

/// Streaming parser state.
#[derive(Debug)]
pub struct Parser {
    state: State,
    /// Bytes consumed so far (stream offset).
    offset: u64,
    line: Vec<u8>,
    line_at: u64,
    remaining: u64,
    argc: u64,
    args: Vec<Option<Bytes>>,
    arg: Vec<u8>,
    capturing: bool,
    /// Whether inline commands are framed (a client port) or refused (a
    /// master's stream).
    inline: bool,
    /// Arguments kept per command (at most [`MAX_CAPTURE`]).
    capture: usize,
}

impl Default for Parser {
    fn default() -> Self {
        Self::new()
    }
}

impl Parser {
    /// A parser at stream offset 0 for a replication link: RESP arrays only.
    pub fn new() -> Parser {
        Parser {
            state: State::Start,
            offset: 0,
            line: Vec::with_capacity(MAX_LINE),
            line_at: 0,
            remaining: 0,
            argc: 0,
            args: Vec::new(),
            arg: Vec::new(),
            capturing: false,
            inline: false,
            capture: STREAM_CAPTURE,
        }
    }

    /// A parser for a client port: RESP arrays and inline command lines.
    pub fn for_clients() -> Parser {
        Parser {
            inline: true,
            capture: MAX_CAPTURE,
            ..Parser::new()
        }
    }

    /// Bytes consumed so far.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Whether the parser is between commands.
    pub fn at_boundary(&self) -> bool {
        self.state == State::Start
    }

    /// Consume `data`, pushing each command it completes onto `out`. On error,
    /// the bytes before the offending one are consumed (see [`Parser::offset`])
    /// and the parser must not be fed again.
    pub fn feed(&mut self, data: &[u8], out: &mut Vec<Command>) -> Result<(), RespError> {
        let mut i = 0;
        while i < data.len() {
            let b = data[i];
            match self.state {
                State::Start => match b {
                    b'*' => {
                        self.state = State::ArrayLine;
                        self.line.clear();
                        self.line_at = self.offset;
                        self.args.clear();
                    }
                    b'\n' => out.push(Command {
                        end: self.offset + 1,
                        argc: 0,
                        args: Vec::new(),
                        inline: false,
                    }),
                    b'\r' => self.state = State::KeepAliveLf,
                    _ if self.inline => {
                        self.arg.clear();
                        self.line_at = self.offset;
                        self.state = State::Inline(0);
                        // This byte is the line's first: read it again there.
                        continue;
                    }
                    got => {
                        return Err(RespError::NotArray {
                            at: self.offset,
                            got,
                        })
                    }
                },
                State::KeepAliveLf => {
                    if b != b'\n' {
                        return Err(RespError::Header {
                            at: self.offset,
                            why: "CR not followed by LF",
                        });
                    }
                    self.state = State::Start;
                    out.push(Command {
                        end: self.offset + 1,
                        argc: 0,
                        args: Vec::new(),
                        inline: false,
                    });
                }
                State::Inline(len) => {
                    if b == b'\n' {
                        self.state = State::Start;
                        out.push(self.inline_command());
                    } else {
                        if len >= MAX_INLINE {
                            return Err(RespError::TooLong {
                                at: self.line_at,
                                len: len as i64,
                            });
                        }
                        // Keep what naming the command needs; skip the rest.
                        if self.arg.len() < MAX_CAPTURED_ARG * self.capture {
                            self.arg.push(b);
                        }
                        self.state = State::Inline(len + 1);
                    }
                }
                State::ArrayLine | State::BulkLine => {
                    if b == b'\n' {
                        let n = self.number()?;
                        if self.state == State::ArrayLine {
                            if n < 1 || n as u64 > MAX_ELEMENTS {
                                return Err(RespError::TooLong {
                                    at: self.line_at,
                                    len: n,
                                });
                            }
                            self.argc = n as u64;
                            self.remaining = n as u64;
                            self.state = State::Element;
                        } else {
                            if n < 0 || n as u64 > MAX_BULK {
                                return Err(RespError::TooLong {
                                    at: self.line_at,
                                    len: n,
                                });
                            }
                            self.capturing =
                                self.args.len() < self.capture && n as usize <= MAX_CAPTURED_ARG;
                            self.arg.clear();
                            self.state = if n == 0 {
                                State::Crlf(0)
                            } else {
                                State::Payload(n as u64)
                            };
                        }
                    } else {
                        if self.line.len() >= MAX_LINE {
                            return Err(RespError::Header {
                                at: self.line_at,
                                why: "line too long",
                            });
                        }
                        self.line.push(b);
                    }
                }
                State::Element => {
                    if b != b'$' {
                        return Err(RespError::NotBulk {
                            at: self.offset,
                            got: b,
                        });
                    }
                    self.state = State::BulkLine;
                    self.line.clear();
                    self.line_at = self.offset;
                }
                State::Payload(left) => {
                    // Skip a whole run at once: payloads can be large.
                    let n = (left as usize).min(data.len() - i);
                    if self.capturing {
                        self.arg.extend_from_slice(&data[i..i + n]);
                    }
                    self.offset += n as u64;
                    i += n;
                    self.state = if left == n as u64 {
                        State::Crlf(0)
                    } else {
                        State::Payload(left - n as u64)
                    };
                    continue;
                }
                State::Crlf(k) => {
                    let want = if k == 0 { b'\r' } else { b'\n' };
                    if b != want {
                        return Err(RespError::Terminator { at: self.offset });
                    }
                    if k == 0 {
                        self.state = State::Crlf(1);
                    } else {
                        if self.args.len() < self.capture {
                            let a = self.capturing.then(|| Bytes::copy_from_slice(&self.arg));
                            self.args.push(a);
                        }
                        self.remaining -= 1;
                        if self.remaining == 0 {
                            self.state = State::Start;
                            out.push(Command {
                                end: self.offset + 1,
                                argc: self.argc,
                                args: std::mem::take(&mut self.args),
                                inline: false,
                            });
                        } else {
                            self.state = State::Element;
                        }
                    }
                }
            }
            self.offset += 1;
            i += 1;
        }
        Ok(())
    }

    /// The inline line just completed (without its LF), split into words at
    /// spaces and tabs as Redis's `sdssplitargs` does for unquoted words.
    fn inline_command(&mut self) -> Command {
        let line = self.arg.strip_suffix(b"\r").unwrap_or(&self.arg);
        let words: Vec<&[u8]> = line
            .split(|b| b.is_ascii_whitespace())
            .filter(|w| !w.is_empty())
            .collect();
        Command {
            end: self.offset + 1,
            argc: words.len() as u64,
            args: words
                .iter()
                .take(self.capture)
                .map(|w| (w.len() <= MAX_CAPTURED_ARG).then(|| Bytes::copy_from_slice(w)))
                .collect(),
            inline: true,
        }
    }

    /// The number on the header line just completed (`line` holds it with its CR).
    fn number(&self) -> Result<i64, RespError> {
        let at = self.line_at;
        let Some(body) = self.line.strip_suffix(b"\r") else {
            return Err(RespError::Header {
                at,
                why: "not terminated by CRLF",
            });
        };
        let text = std::str::from_utf8(body).map_err(|_| RespError::Header {
            at,
            why: "not a number",
        })?;
        if text.is_empty() || text.starts_with('+') {
            return Err(RespError::Header {
                at,
                why: "not a number",
            });
        }
        text.parse::<i64>().map_err(|_| RespError::Header {
            at,
            why: "not a number",
        })
    }
}

/// Encode a command as a RESP array of bulk strings.
pub fn encode_command(args: &[&[u8]]) -> Vec<u8> {
    let mut v = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        v.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        v.extend_from_slice(a);
        v.extend_from_slice(b"\r\n");
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parse_all(data: &[u8], cut: usize) -> Result<Vec<Command>, RespError> {
        let mut p = Parser::new();
        let mut out = Vec::new();
        for piece in data.chunks(cut.max(1)) {
            p.feed(piece, &mut out)?;
        }
        Ok(out)
    }

    proptest! {
        /// Commands encoded and cut anywhere parse back with their boundaries.
        #[test]
        fn commands_round_trip(cmds in proptest::collection::vec(
            proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 1..6), 1..10),
            cut in 1usize..50) {
            let mut wire = Vec::new();
            let mut ends = Vec::new();
            for c in &cmds {
                let refs: Vec<&[u8]> = c.iter().map(|a| &a[..]).collect();
                wire.extend_from_slice(&encode_command(&refs));
                ends.push(wire.len() as u64);
            }
            let got = parse_all(&wire, cut).unwrap();
            prop_assert_eq!(got.iter().map(|c| c.end).collect::<Vec<_>>(), ends);
            for (g, c) in got.iter().zip(&cmds) {
                prop_assert_eq!(g.argc, c.len() as u64);
                for (a, want) in g.args.iter().zip(c) {
                    if want.len() <= MAX_CAPTURED_ARG {
                        prop_assert_eq!(a.as_deref(), Some(&want[..]));
                    } else {
                        prop_assert!(a.is_none());
                    }
                }
            }
        }

        /// Garbage never panics, in either mode; an error's offset lies
        /// within the input, and so do command ends.
        #[test]
        fn garbage_is_an_error_not_a_panic(data in proptest::collection::vec(any::<u8>(), 0..512), clients: bool) {
            let mut p = if clients { Parser::for_clients() } else { Parser::new() };
            let mut out = Vec::new();
            if p.feed(&data, &mut out).is_err() {
                prop_assert!(p.offset() <= data.len() as u64);
            }
            for c in &out {
                prop_assert!(c.end <= data.len() as u64);
                prop_assert!(c.args.len() <= MAX_CAPTURE);
            }
        }
    }

    #[test]
    fn keepalives_and_replconf() {
        let mut wire = b"\n\r\n".to_vec();
        wire.extend(encode_command(&[b"REPLCONF", b"GETACK", b"*"]));
        let got = parse_all(&wire, 2).unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].argc, 0);
        assert_eq!(got[2].arg_lower(0).as_deref(), Some("replconf"));
        assert_eq!(got[2].arg_lower(1).as_deref(), Some("getack"));
        assert_eq!(got[2].end, wire.len() as u64);
    }

    #[test]
    fn clients_may_send_inline_commands_masters_may_not() {
        let mut wire = b"PING\r\n  client   setname x\n".to_vec();
        wire.extend(encode_command(&[b"ECHO", b"hi"]));
        let mut p = Parser::for_clients();
        let mut got = Vec::new();
        for piece in wire.chunks(3) {
            p.feed(piece, &mut got).unwrap();
        }
        assert_eq!(got.len(), 3);
        assert!(got[0].inline && got[1].inline && !got[2].inline);
        assert_eq!(got[0].arg_lower(0).as_deref(), Some("ping"));
        assert_eq!(got[0].end, 6);
        assert_eq!(got[1].argc, 3);
        assert_eq!(got[1].arg(2).as_deref(), Some("x"));
        assert_eq!(got[2].arg(1).as_deref(), Some("hi"));
        // A replica's capabilities come in one five-argument command; all
        // are kept on a client port (so `+CONTINUE <replid>` goes to a
        // replica that announced psync2).
        let mut out = Vec::new();
        let capa = encode_command(&[b"REPLCONF", b"capa", b"eof", b"capa", b"psync2"]);
        Parser::for_clients().feed(&capa, &mut out).unwrap();
        assert_eq!(out[0].arg(4).as_deref(), Some("psync2"));
        // A line past Redis's inline limit is an error, not unbounded memory.
        let mut p = Parser::for_clients();
        let long = vec![b'a'; MAX_INLINE as usize + 1];
        assert!(matches!(
            p.feed(&long, &mut Vec::new()),
            Err(RespError::TooLong { at: 0, .. })
        ));
    }

    #[test]
    fn errors_name_the_fault_and_offset() {
        assert_eq!(
            parse_all(b"PING\r\n", 9),
            Err(RespError::NotArray { at: 0, got: b'P' })
        );
        assert_eq!(
            parse_all(b"*1\r\n:5\r\n", 9),
            Err(RespError::NotBulk { at: 4, got: b':' })
        );
        assert!(matches!(
            parse_all(b"*x\r\n", 9),
            Err(RespError::Header { at: 0, .. })
        ));
        assert!(matches!(
            parse_all(b"*1\r\n$-5\r\n", 9),
            Err(RespError::TooLong { len: -5, .. })
        ));
        assert_eq!(
            parse_all(b"*1\r\n$1\r\nab", 9),
            Err(RespError::Terminator { at: 9 })
        );
        assert!(matches!(
            parse_all(b"*1\r\n$99999999999\r\n", 9),
            Err(RespError::TooLong { .. })
        ));
        assert!(matches!(
            parse_all(&[b'*'; 100], 9),
            Err(RespError::Header {
                why: "line too long",
                ..
            })
        ));
    }
}
