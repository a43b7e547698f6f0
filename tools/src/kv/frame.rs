//! The channel's frames: length-delimited, versioned, sans-IO.
//!
//! ```text
//! u32 BE  length of what follows (version + type + body), at most MAX_FRAME
//! u8      version (VERSION)
//! u8      type
//! ...     body (fixed-width integers big-endian; strings as u8 length + bytes)
//! ```
//!
//! The same codec runs on all three streams of a session: control (bidi,
//! opened by the replica), snapshot and log (uni, opened by the master, each
//! beginning with [`Frame::StreamOpen`]). The decoder never allocates beyond
//! one frame and refuses anything longer than [`MAX_FRAME`] before reading it.
//! The framing and field codec is the one both channels share
//! ([`crate::frame`]).

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::frame::{self, FieldError, Reader, StrField, StrWidth};

/// Version byte of every frame; a peer speaking another version is refused.
/// Version 2 added [`Previous`] to [`Frame::FullSync`] and [`Frame::Continue`]
/// and [`ErrorCode::Switched`].
pub const VERSION: u8 = 2;

/// The largest chunk of snapshot or log data one frame carries (the upper end
/// of the adaptive chunk size).
pub const MAX_CHUNK: usize = 1 << 20;

/// The largest frame, header excluded: a maximal chunk plus room for its fields.
pub const MAX_FRAME: usize = MAX_CHUNK + 64;

/// The longest replication id (Redis uses 40 hex digits).
pub const MAX_REPLID: usize = 64;

/// The longest error message carried in [`Frame::Error`].
pub const MAX_MESSAGE: usize = 255;

/// Whether `s` can be a replication id read back from a file this relay
/// wrote: one that fits the wire ([`MAX_REPLID`]) and is alphanumeric, as
/// Redis's 40 hex digits are.
pub fn is_replid(s: &str) -> bool {
    s.len() <= MAX_REPLID && s.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// Replication ids on the wire: a 1-byte length, at most [`MAX_REPLID`].
const REPLID: StrField = StrField::new(StrWidth::U8, MAX_REPLID);

/// The longest dataset name in [`Frame::Select`].
pub const MAX_DATASET: usize = 255;

/// Dataset names on the wire: a 1-byte length, at most [`MAX_DATASET`].
const DATASET: StrField = StrField::new(StrWidth::U8, MAX_DATASET);

/// Error messages on the wire: a 1-byte length, at most [`MAX_MESSAGE`].
const MESSAGE: StrField = StrField::new(StrWidth::U8, MAX_MESSAGE);

/// Which of a session's data streams a uni stream is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StreamKind {
    /// The snapshot, from its first byte to [`Frame::SnapshotEnd`].
    Snapshot,
    /// The ordered log, from the session's start position on.
    Log,
}

/// The history before the current replication id (PSYNC2's `replid2` and
/// the offset where it ended, Redis replication docs, "Replication ID
/// explained"): a replica holding this id at or before `position` holds a
/// prefix of the current history and may continue under the current id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Previous {
    /// The previous replication id.
    pub replid: String,
    /// The last position valid under it (the head when the id changed).
    pub position: u64,
}

/// One frame of the channel protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// Replica → master, before [`Frame::Hello`] when the master end serves
    /// several datasets (the upstream relay of a Redis Cluster: one per
    /// shard): which one this session replicates. A master end serving one
    /// dataset refuses it; one serving several refuses a session without it.
    Select {
        /// The dataset's name (a cluster shard's slot ranges, e.g. `0-5460`).
        dataset: String,
    },
    /// Replica → master, first frame of a session (after [`Frame::Select`],
    /// if any): what it already has.
    Hello {
        /// The replication id its data belongs to; `None` for an empty replica.
        replid: Option<String>,
        /// Its log position within that id (bytes of log applied).
        position: u64,
    },
    /// Master → replica: a snapshot follows at `position`, then the log from there.
    FullSync {
        /// Session id tagging this session's uni streams.
        session: u64,
        /// The replication id of the snapshot and log.
        replid: String,
        /// Log position the snapshot corresponds to.
        position: u64,
        /// The id before `replid`, if the history changed ids.
        previous: Option<Previous>,
    },
    /// Master → replica: partial resync, the log continues from `position`.
    Continue {
        /// Session id tagging this session's uni streams.
        session: u64,
        /// The current replication id (the replica's, or the one that
        /// succeeded it: see `previous`).
        replid: String,
        /// Where the log resumes (the replica's own position).
        position: u64,
        /// The id before `replid`, if the history changed ids.
        previous: Option<Previous>,
    },
    /// Replica → master: credit. Everything up to these marks is delivered.
    Ack {
        /// Log position delivered to the application.
        log: u64,
        /// Snapshot bytes delivered to the application.
        snapshot: u64,
        /// Log position the final consumer reports applied (lag), if it says.
        applied: u64,
    },
    /// Either way, periodically: liveness plus the sender's view.
    Heartbeat {
        /// Master: head of its log; replica: its delivered log position.
        position: u64,
    },
    /// Master → replica, first frame of each uni stream.
    StreamOpen {
        /// The session it belongs to.
        session: u64,
        /// Snapshot or log.
        kind: StreamKind,
        /// Snapshot: 0; log: the position of its first byte.
        position: u64,
    },
    /// A chunk of snapshot or log bytes (at most [`MAX_CHUNK`]).
    Data(Bytes),
    /// Master → replica on the snapshot stream: the snapshot is complete.
    SnapshotEnd {
        /// Its total length, which the replica checks against what it got.
        length: u64,
    },
    /// Either way on the control stream: the session ends, and why.
    Error {
        /// A code from [`ErrorCode`].
        code: ErrorCode,
        /// Human-readable detail (at most [`MAX_MESSAGE`] bytes).
        message: String,
    },
}

/// Why a session ended, as carried in [`Frame::Error`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorCode {
    /// The replica fell out of the backlog: reconnect for a full resync.
    BeyondBacklog,
    /// The master's data started anew (new replication id or offset jump).
    Reset,
    /// A protocol violation by the peer.
    Protocol,
    /// The master has no data to serve yet, or cannot get a snapshot.
    Unavailable,
    /// The history goes on under a new replication id (the source master
    /// restarted, or a failover): reconnect, and resume under the new id.
    Switched,
    /// A code this version does not know.
    Other(u8),
}

impl ErrorCode {
    fn to_u8(self) -> u8 {
        match self {
            ErrorCode::BeyondBacklog => 1,
            ErrorCode::Reset => 2,
            ErrorCode::Protocol => 3,
            ErrorCode::Unavailable => 4,
            ErrorCode::Switched => 5,
            ErrorCode::Other(c) => c,
        }
    }

    fn from_u8(c: u8) -> ErrorCode {
        match c {
            1 => ErrorCode::BeyondBacklog,
            2 => ErrorCode::Reset,
            3 => ErrorCode::Protocol,
            4 => ErrorCode::Unavailable,
            5 => ErrorCode::Switched,
            c => ErrorCode::Other(c),
        }
    }
}

/// Why bytes did not decode as a frame.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The length field exceeds [`MAX_FRAME`] (or is too short for a header).
    #[error("frame length {0} outside 2..={MAX_FRAME}")]
    Length(usize),
    /// The version byte is not [`VERSION`].
    #[error("frame version {0}, this end speaks {VERSION}")]
    Version(u8),
    /// The type byte names no frame.
    #[error("unknown frame type {0}")]
    Type(u8),
    /// The body is shorter or longer than its type requires.
    #[error("malformed body of frame type {0}")]
    Body(u8),
    /// A string field is too long or not UTF-8.
    #[error("bad string field in frame type {0}")]
    Text(u8),
}

const T_HELLO: u8 = 1;
const T_FULLSYNC: u8 = 2;
const T_CONTINUE: u8 = 3;
const T_ACK: u8 = 4;
const T_HEARTBEAT: u8 = 5;
const T_STREAM_OPEN: u8 = 6;
const T_DATA: u8 = 7;
const T_SNAPSHOT_END: u8 = 8;
const T_ERROR: u8 = 9;
const T_SELECT: u8 = 10;

impl Frame {
    /// Append the frame's encoding to `out`. For [`Frame::Data`] this copies
    /// the payload; senders of bulk data use [`Frame::data_header`] instead.
    pub fn encode(&self, out: &mut BytesMut) {
        frame::write(out, |out| self.encode_message(out));
    }

    /// The message: version, type, body.
    fn encode_message(&self, out: &mut BytesMut) {
        out.put_u8(VERSION);
        match self {
            Frame::Select { dataset } => {
                out.put_u8(T_SELECT);
                frame::put_str(out, dataset, DATASET);
            }
            Frame::Hello { replid, position } => {
                out.put_u8(T_HELLO);
                frame::put_str(out, replid.as_deref().unwrap_or(""), REPLID);
                out.put_u64(*position);
            }
            Frame::FullSync {
                session,
                replid,
                position,
                previous,
            }
            | Frame::Continue {
                session,
                replid,
                position,
                previous,
            } => {
                out.put_u8(if matches!(self, Frame::FullSync { .. }) {
                    T_FULLSYNC
                } else {
                    T_CONTINUE
                });
                out.put_u64(*session);
                frame::put_str(out, replid, REPLID);
                out.put_u64(*position);
                // No previous id: an empty string and 0.
                let (r, p) = previous
                    .as_ref()
                    .map_or(("", 0), |p| (p.replid.as_str(), p.position));
                frame::put_str(out, r, REPLID);
                out.put_u64(p);
            }
            Frame::Ack {
                log,
                snapshot,
                applied,
            } => {
                out.put_u8(T_ACK);
                out.put_u64(*log);
                out.put_u64(*snapshot);
                out.put_u64(*applied);
            }
            Frame::Heartbeat { position } => {
                out.put_u8(T_HEARTBEAT);
                out.put_u64(*position);
            }
            Frame::StreamOpen {
                session,
                kind,
                position,
            } => {
                out.put_u8(T_STREAM_OPEN);
                out.put_u64(*session);
                out.put_u8(match kind {
                    StreamKind::Snapshot => 0,
                    StreamKind::Log => 1,
                });
                out.put_u64(*position);
            }
            Frame::Data(b) => {
                out.put_u8(T_DATA);
                out.put_slice(b);
            }
            Frame::SnapshotEnd { length } => {
                out.put_u8(T_SNAPSHOT_END);
                out.put_u64(*length);
            }
            Frame::Error { code, message } => {
                out.put_u8(T_ERROR);
                out.put_u8(code.to_u8());
                frame::put_str(out, message, MESSAGE);
            }
        }
    }

    /// The header of a [`Frame::Data`] of `len` bytes (at most [`MAX_CHUNK`]):
    /// sent before the payload itself, which then goes out without a copy.
    pub fn data_header(len: usize) -> [u8; 6] {
        debug_assert!(len <= MAX_CHUNK);
        let l = frame::prefix(len + 2);
        [l[0], l[1], l[2], l[3], VERSION, T_DATA]
    }

    /// Decode one frame from the front of `buf`, removing it; `Ok(None)` when
    /// `buf` holds less than a whole frame. [`Frame::Data`] payloads share
    /// `buf`'s memory.
    pub fn decode(buf: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        let Some(len) = frame::declared_len(buf, 2..=MAX_FRAME).map_err(FrameError::Length)? else {
            return Ok(None);
        };
        if buf.len() < 4 + len {
            buf.reserve(4 + len - buf.len());
            return Ok(None);
        }
        if buf[4] != VERSION {
            return Err(FrameError::Version(buf[4]));
        }
        let ty = buf[5];
        buf.advance(6);
        let mut body = buf.split_to(len - 2);
        let frame = Self::body(ty, &mut body)?;
        Ok(Some(frame))
    }

    fn body(ty: u8, b: &mut BytesMut) -> Result<Frame, FrameError> {
        if ty == T_DATA {
            if b.len() > MAX_CHUNK {
                return Err(FrameError::Body(ty));
            }
            // The payload keeps sharing the receive buffer: no copy.
            return Ok(Frame::Data(std::mem::take(b).freeze()));
        }
        let mut r = Reader::new(b);
        let frame = Self::fields(ty, &mut r).map_err(|e| match e {
            FieldError::TooLong { .. } | FieldError::Utf8 => FrameError::Text(ty),
            _ => FrameError::Body(ty),
        })?;
        match frame {
            Some(f) => {
                r.end().map_err(|_| FrameError::Body(ty))?;
                Ok(f)
            }
            None => Err(FrameError::Type(ty)),
        }
    }

    /// The fields of a frame of type `ty` (not `Data`); `None` for a type
    /// this version does not know.
    fn fields(ty: u8, r: &mut Reader<'_>) -> Result<Option<Frame>, FieldError> {
        // Fields that parse but disagree: reported as a malformed body
        // (`FrameError::Body`), as a short one is.
        let bad = || FieldError::Truncated;
        Ok(Some(match ty {
            T_SELECT => Frame::Select {
                dataset: r.str(DATASET)?,
            },
            T_HELLO => {
                let replid = r.str(REPLID)?;
                Frame::Hello {
                    replid: (!replid.is_empty()).then_some(replid),
                    position: r.u64()?,
                }
            }
            T_FULLSYNC | T_CONTINUE => {
                let session = r.u64()?;
                let replid = r.str(REPLID)?;
                let position = r.u64()?;
                let previous_id = r.str(REPLID)?;
                let previous_position = r.u64()?;
                let previous = match (previous_id.is_empty(), previous_position) {
                    (false, position) => Some(Previous {
                        replid: previous_id,
                        position,
                    }),
                    (true, 0) => None,
                    // A position without an id encodes nothing: refused, so
                    // every accepted frame encodes back to the same bytes.
                    (true, _) => return Err(bad()),
                };
                if ty == T_FULLSYNC {
                    Frame::FullSync {
                        session,
                        replid,
                        position,
                        previous,
                    }
                } else {
                    Frame::Continue {
                        session,
                        replid,
                        position,
                        previous,
                    }
                }
            }
            T_ACK => Frame::Ack {
                log: r.u64()?,
                snapshot: r.u64()?,
                applied: r.u64()?,
            },
            T_HEARTBEAT => Frame::Heartbeat { position: r.u64()? },
            T_STREAM_OPEN => {
                let session = r.u64()?;
                let kind = match r.u8()? {
                    0 => StreamKind::Snapshot,
                    1 => StreamKind::Log,
                    _ => return Err(bad()),
                };
                Frame::StreamOpen {
                    session,
                    kind,
                    position: r.u64()?,
                }
            }
            T_SNAPSHOT_END => Frame::SnapshotEnd { length: r.u64()? },
            T_ERROR => Frame::Error {
                code: ErrorCode::from_u8(r.u8()?),
                message: r.str(MESSAGE)?,
            },
            _ => return Ok(None),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn previous() -> impl Strategy<Value = Option<Previous>> {
        proptest::option::of(
            ("[0-9a-f]{1,40}", any::<u64>())
                .prop_map(|(replid, position)| Previous { replid, position }),
        )
    }

    fn frames() -> impl Strategy<Value = Frame> {
        let replid = "[0-9a-f]{0,40}";
        prop_oneof![
            "[0-9,-]{0,40}".prop_map(|dataset| Frame::Select { dataset }),
            (proptest::option::of("[0-9a-f]{1,40}"), any::<u64>())
                .prop_map(|(replid, position)| Frame::Hello { replid, position }),
            (any::<u64>(), replid, any::<u64>(), previous()).prop_map(
                |(session, replid, position, previous)| Frame::FullSync {
                    session,
                    replid,
                    position,
                    previous,
                }
            ),
            (any::<u64>(), replid, any::<u64>(), previous()).prop_map(
                |(session, replid, position, previous)| Frame::Continue {
                    session,
                    replid,
                    position,
                    previous,
                }
            ),
            (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(log, snapshot, applied)| {
                Frame::Ack {
                    log,
                    snapshot,
                    applied,
                }
            }),
            any::<u64>().prop_map(|position| Frame::Heartbeat { position }),
            (any::<u64>(), any::<bool>(), any::<u64>()).prop_map(|(session, s, position)| {
                Frame::StreamOpen {
                    session,
                    kind: if s {
                        StreamKind::Snapshot
                    } else {
                        StreamKind::Log
                    },
                    position,
                }
            }),
            proptest::collection::vec(any::<u8>(), 0..4096)
                .prop_map(|v| Frame::Data(Bytes::from(v))),
            any::<u64>().prop_map(|length| Frame::SnapshotEnd { length }),
            (1u8..=5, ".{0,60}").prop_map(|(c, message)| Frame::Error {
                code: ErrorCode::from_u8(c),
                message,
            }),
        ]
    }

    proptest! {
        /// Any sequence of frames, cut into arbitrary pieces, decodes to itself.
        #[test]
        fn round_trip_in_pieces(fs in proptest::collection::vec(frames(), 1..8), cut in 1usize..97) {
            let mut wire = BytesMut::new();
            for f in &fs {
                f.encode(&mut wire);
            }
            let mut buf = BytesMut::new();
            let mut got = Vec::new();
            for piece in wire.chunks(cut) {
                buf.extend_from_slice(piece);
                while let Some(f) = Frame::decode(&mut buf).unwrap() {
                    got.push(f);
                }
            }
            prop_assert!(buf.is_empty());
            prop_assert_eq!(got, fs);
        }

        /// Arbitrary bytes never panic the decoder, and it never hands back
        /// more data than it was given.
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let mut buf = BytesMut::from(&bytes[..]);
            let before = buf.len();
            while let Ok(Some(f)) = Frame::decode(&mut buf) {
                if let Frame::Data(d) = f {
                    prop_assert!(d.len() <= before);
                }
            }
        }
    }

    #[test]
    fn data_header_matches_encode() {
        let payload = Bytes::from_static(b"hello");
        let mut a = BytesMut::new();
        Frame::Data(payload.clone()).encode(&mut a);
        let mut b = BytesMut::from(&Frame::data_header(payload.len())[..]);
        b.extend_from_slice(&payload);
        assert_eq!(a, b);
    }

    #[test]
    fn the_fuzz_seed_is_this_version_s_frames() {
        // tools/fuzz/corpus/kv_frame/session: one frame of each kind, so the
        // fuzzer starts from inputs the decoder accepts.
        let mut buf = BytesMut::from(&include_bytes!("../../fuzz/corpus/kv_frame/session")[..]);
        let mut n = 0;
        while let Some(f) = Frame::decode(&mut buf).unwrap() {
            if let Frame::FullSync { previous, .. } = &f {
                assert_eq!(previous.as_ref().map(|p| p.position), Some(5));
            }
            n += 1;
        }
        assert_eq!((n, buf.len()), (8, 0));
    }

    #[test]
    fn refusals_name_the_fault() {
        let mut over = BytesMut::from(&((MAX_FRAME as u32) + 1).to_be_bytes()[..]);
        assert_eq!(
            Frame::decode(&mut over),
            Err(FrameError::Length(MAX_FRAME + 1))
        );
        let mut v1 = BytesMut::from(&[0, 0, 0, 2, 1, T_HEARTBEAT][..]);
        assert_eq!(Frame::decode(&mut v1), Err(FrameError::Version(1)));
        let mut unknown = BytesMut::from(&[0, 0, 0, 2, VERSION, 99][..]);
        assert_eq!(Frame::decode(&mut unknown), Err(FrameError::Type(99)));
        let mut short = BytesMut::from(&[0, 0, 0, 3, VERSION, T_HEARTBEAT, 1][..]);
        assert_eq!(
            Frame::decode(&mut short),
            Err(FrameError::Body(T_HEARTBEAT))
        );
    }
}
