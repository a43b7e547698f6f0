//! Framing of the snapshot (RDB) a Redis master sends after `+FULLRESYNC`,
//! sans-IO. See "Replication internals" in
//! https://redis.io/docs/latest/operate/oss_and_stack/management/replication/
//! and replication.c `readSyncBulkPayload`:
//!
//! - Before the payload the master may send bare `\n` bytes while it prepares
//!   the snapshot (keep-alives), which are skipped.
//! - Disk-based sync: `$<length>\r\n` then exactly that many bytes.
//! - Diskless sync (`capa eof`): `$EOF:<40 random bytes>\r\n`, the payload, then
//!   the same 40 bytes. The payload's length is unknown, so the end is found
//!   as Redis finds it: the last 40 bytes received equal the mark. That is
//!   exact because the master sends nothing more until the replica's first
//!   `REPLCONF ACK` (the replica is put online on that ack).
//!
//! The payload is checked to begin with the RDB magic `REDIS` and four
//! version digits, which catches a link that is not carrying a snapshot.

/// Length of the diskless end-of-file mark (`RDB_EOF_MARK_SIZE`).
pub const EOF_MARK_LEN: usize = 40;

/// Why the bytes are not a framed RDB payload.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RdbError {
    /// Something other than `$` (or keep-alive newlines) before the payload.
    #[error("expected '$' before the RDB payload, got {0:#04x}")]
    Start(u8),
    /// The `$` line is malformed.
    #[error("bad RDB bulk header: {0}")]
    Header(&'static str),
    /// The payload does not begin with `REDIS` and a 4-digit version.
    #[error("the payload is not an RDB file (no REDIS magic)")]
    Magic,
    /// The payload is shorter than the smallest RDB file.
    #[error("RDB payload of {0} bytes is too short")]
    Short(u64),
}

/// The header line limit: `$EOF:` + 40 + CRLF with room to spare.
const MAX_HEADER: usize = 64;

/// Magic plus version.
const MAGIC_LEN: usize = 9;

#[derive(Debug)]
enum State {
    /// Skipping keep-alives, waiting for `$`.
    Start,
    /// In the `$...` line.
    Header(Vec<u8>),
    /// A sized payload with this many bytes left.
    Sized(u64),
    /// A mark-terminated payload; the last bytes seen are kept to find the mark.
    Marked {
        mark: [u8; EOF_MARK_LEN],
        /// Up to 40 bytes received but not yet known to be payload.
        held: Vec<u8>,
    },
    /// Done.
    Done,
}

/// Streaming RDB framing.
#[derive(Debug)]
pub struct Framing {
    state: State,
    total: u64,
    magic: Vec<u8>,
}

impl Default for Framing {
    fn default() -> Self {
        Self::new()
    }
}

impl Framing {
    /// Expecting the `$` header (after any keep-alive newlines).
    pub fn new() -> Framing {
        Framing {
            state: State::Start,
            total: 0,
            magic: Vec::with_capacity(MAGIC_LEN),
        }
    }

    /// Payload bytes so far.
    pub fn payload_len(&self) -> u64 {
        self.total
    }

    /// Whether the transfer is diskless (EOF-marked), once the header is read.
    pub fn is_marked(&self) -> bool {
        matches!(self.state, State::Marked { .. })
    }

    /// Consume `data`; payload bytes are appended to `out`. Returns how many
    /// input bytes were consumed and whether the payload is complete.
    pub fn feed(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(usize, bool), RdbError> {
        let before = out.len();
        let mut i = 0;
        while i < data.len() {
            match &mut self.state {
                State::Start => {
                    match data[i] {
                        b'\n' | b'\r' => {}
                        b'$' => self.state = State::Header(Vec::new()),
                        other => return Err(RdbError::Start(other)),
                    }
                    i += 1;
                }
                State::Header(line) => {
                    let b = data[i];
                    i += 1;
                    if b != b'\n' {
                        if line.len() >= MAX_HEADER {
                            return Err(RdbError::Header("line too long"));
                        }
                        line.push(b);
                        continue;
                    }
                    let line = line
                        .strip_suffix(b"\r")
                        .ok_or(RdbError::Header("not terminated by CRLF"))?
                        .to_vec();
                    self.state = if let Some(mark) = line.strip_prefix(b"EOF:") {
                        let mark: [u8; EOF_MARK_LEN] = mark
                            .try_into()
                            .map_err(|_| RdbError::Header("EOF mark is not 40 bytes"))?;
                        State::Marked {
                            mark,
                            held: Vec::with_capacity(EOF_MARK_LEN),
                        }
                    } else {
                        let len: u64 = std::str::from_utf8(&line)
                            .ok()
                            .filter(|s| !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit()))
                            .and_then(|s| s.parse().ok())
                            .ok_or(RdbError::Header("length is not a number"))?;
                        if len < MAGIC_LEN as u64 {
                            return Err(RdbError::Short(len));
                        }
                        State::Sized(len)
                    };
                }
                State::Sized(left) => {
                    let n = (*left as usize).min(data.len() - i);
                    out.extend_from_slice(&data[i..i + n]);
                    i += n;
                    *left -= n as u64;
                    if *left == 0 {
                        self.state = State::Done;
                    }
                }
                State::Marked { mark, held } => {
                    // Everything but the last 40 bytes seen is surely payload.
                    let rest = &data[i..];
                    held.extend_from_slice(rest);
                    i = data.len();
                    if held.len() > EOF_MARK_LEN {
                        let cut = held.len() - EOF_MARK_LEN;
                        out.extend_from_slice(&held[..cut]);
                        held.drain(..cut);
                    }
                    if held.len() == EOF_MARK_LEN && held[..] == mark[..] {
                        self.state = State::Done;
                    }
                }
                State::Done => break,
            }
        }
        self.check_magic(&out[before..])?;
        self.total += (out.len() - before) as u64;
        let done = matches!(self.state, State::Done);
        if done && self.total < MAGIC_LEN as u64 {
            return Err(RdbError::Short(self.total));
        }
        Ok((i, done))
    }

    fn check_magic(&mut self, new: &[u8]) -> Result<(), RdbError> {
        if self.magic.len() < MAGIC_LEN {
            let take = (MAGIC_LEN - self.magic.len()).min(new.len());
            self.magic.extend_from_slice(&new[..take]);
            let m = &self.magic;
            let ok = m.iter().enumerate().all(|(k, &c)| {
                if k < 5 {
                    c == b"REDIS"[k]
                } else {
                    c.is_ascii_digit()
                }
            });
            if !ok {
                return Err(RdbError::Magic);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn run(wire: &[u8], cut: usize) -> Result<(Vec<u8>, usize, bool), RdbError> {
        let mut f = Framing::new();
        let mut out = Vec::new();
        let mut used = 0;
        for piece in wire.chunks(cut.max(1)) {
            let (n, done) = f.feed(piece, &mut out)?;
            used += n;
            if done {
                return Ok((out, used, true));
            }
        }
        Ok((out, used, false))
    }

    fn rdb(body: &[u8]) -> Vec<u8> {
        let mut v = b"REDIS0010".to_vec();
        v.extend_from_slice(body);
        v
    }

    proptest! {
        #[test]
        fn sized_payload_then_stream(body in proptest::collection::vec(any::<u8>(), 0..500), cut in 1usize..64) {
            let payload = rdb(&body);
            let mut wire = b"\n\n".to_vec();
            wire.extend_from_slice(format!("${}\r\n", payload.len()).as_bytes());
            wire.extend_from_slice(&payload);
            let header = wire.len();
            wire.extend_from_slice(b"*1\r\n$4\r\nPING\r\n");
            let (out, used, done) = run(&wire, cut).unwrap();
            prop_assert!(done);
            prop_assert_eq!(out, payload);
            // What is left of the piece that completed it is the command stream.
            prop_assert!(used <= wire.len() && used >= header.min(used));
        }

        #[test]
        fn marked_payload(body in proptest::collection::vec(any::<u8>(), 0..500), cut in 1usize..64) {
            let payload = rdb(&body);
            // A mark with no border (no proper prefix equal to a suffix): a
            // payload tail can then never complete it early. `[b'm'; 40]` could
            // (a body ending in `m` is a genuinely ambiguous transfer); Redis
            // relies on its 40 random bytes for the same reason.
            let mut mark = [b'b'; EOF_MARK_LEN];
            mark[0] = b'a';
            let mut wire = b"$EOF:".to_vec();
            wire.extend_from_slice(&mark);
            wire.extend_from_slice(b"\r\n");
            wire.extend_from_slice(&payload);
            wire.extend_from_slice(&mark);
            let (out, used, done) = run(&wire, cut).unwrap();
            prop_assert!(done);
            prop_assert_eq!(used, wire.len());
            prop_assert_eq!(out, payload);
        }

        #[test]
        fn garbage_never_panics(data in proptest::collection::vec(any::<u8>(), 0..300), cut in 1usize..64) {
            let _ = run(&data, cut);
        }
    }

    #[test]
    fn sized_stops_at_its_length() {
        let mut wire = b"$9\r\nREDIS0010".to_vec();
        wire.extend_from_slice(b"*1\r\n");
        let mut f = Framing::new();
        let mut out = Vec::new();
        assert_eq!(f.feed(&wire, &mut out), Ok((13, true)));
        assert_eq!(out, b"REDIS0010");
    }

    #[test]
    fn refusals() {
        assert_eq!(run(b"+OK\r\n", 9).unwrap_err(), RdbError::Start(b'+'));
        assert_eq!(
            run(b"$abc\r\n", 9).unwrap_err(),
            RdbError::Header("length is not a number")
        );
        assert_eq!(
            run(b"$EOF:short\r\n", 9).unwrap_err(),
            RdbError::Header("EOF mark is not 40 bytes")
        );
        assert_eq!(run(b"$12\r\nNOTREDIS0000", 9).unwrap_err(), RdbError::Magic);
        assert_eq!(run(b"$3\r\nabc", 9).unwrap_err(), RdbError::Short(3));
    }
}
