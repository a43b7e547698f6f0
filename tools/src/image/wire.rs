//! The `qr-image/1` protocol between a node agent and a registry agent: one
//! QUIC bidirectional stream per request. The node agent writes one request
//! frame and finishes its side; the registry agent answers with one response
//! frame, then (status OK) exactly `body_len` raw bytes, then finishes.
//!
//! A frame is a 4-byte big-endian length (at most [`MAX_FRAME`]) and that many
//! bytes of message. Strings are a 2-byte big-endian length and UTF-8; numbers
//! are big-endian. Decoding never panics and refuses trailing bytes: the
//! parser faces a peer that passed mutual TLS but may still be buggy, and is
//! fuzzed (`tools/fuzz`, target `image_wire`). The framing and field codec is
//! the one both channels share ([`crate::frame`]).

use super::digest::{check_name, check_namespace, scoped, split_scope, Digest, Reference};
use crate::frame::{self, FieldError, Reader, StrField, StrWidth};

/// This protocol's strings: a 2-byte length, any length it can state.
const STR: StrField = StrField::new(StrWidth::U16, u16::MAX as usize);

/// ALPN of this protocol and version: both agents refuse any other.
pub const ALPN: &[u8] = b"qr-image/1";

/// The `body_sha256` of a blob chunk the server did not hash (see
/// [`Response::Ok`]); no body hashes to it (it would be a sha256 preimage).
pub const UNHASHED: [u8; 32] = [0; 32];

/// The request kind wrapping a request for a scoped repository.
const KIND_SCOPED: u8 = 5;

/// [`Response::Ok`]'s flags byte: served stale.
const FLAG_STALE: u8 = 1;
/// [`Request::Stat`]'s flags byte: check the cached copy again.
const RECHECK: u8 = 1;

/// Largest frame message: requests and response headers are small (a
/// manifest body travels after the header, not inside it).
pub const MAX_FRAME: usize = 16 * 1024;

/// Largest chunk a node may ask for in one `Blob` request: the registry
/// agent holds a chunk in memory to hash it before sending, and refuses a
/// larger one (`BadRequest`); the node's transfer never asks for more.
pub const MAX_CHUNK: u64 = 16 << 20;

/// Why bytes are not a valid frame of this protocol.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The message ended before a field did.
    #[error("truncated message")]
    Truncated,
    /// Bytes after the last field.
    #[error("{0} trailing bytes after the message")]
    Trailing(usize),
    /// A frame length above [`MAX_FRAME`].
    #[error("frame of {0} bytes exceeds the {MAX_FRAME}-byte limit")]
    TooLong(usize),
    /// A message kind or status code this version does not know.
    #[error("unknown {what} {value}")]
    Unknown {
        /// Which field.
        what: &'static str,
        /// Its value.
        value: u8,
    },
    /// A string field that is not UTF-8.
    #[error("a string field is not UTF-8")]
    Utf8,
    /// A name, reference or digest outside the distribution spec's grammar.
    #[error(transparent)]
    Name(#[from] super::digest::NameError),
    /// A blob range whose end overflows.
    #[error("range offset {offset} + length {len} overflows")]
    Range {
        /// First byte.
        offset: u64,
        /// Length.
        len: u64,
    },
}

/// What a node agent asks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// A manifest or index by tag or digest; `accept` is the client's `Accept`
    /// header, forwarded upstream (distribution-spec "Pulling manifests").
    Manifest {
        /// Repository name.
        repo: String,
        /// Tag or digest.
        reference: Reference,
        /// The HTTP `Accept` value to forward (may be empty).
        accept: String,
    },
    /// The size of a blob (answers with an empty body).
    Stat {
        /// Repository name.
        repo: String,
        /// Blob digest.
        digest: Digest,
        /// The asker found the blob, as served, not matching its digest:
        /// check the cached copy against it again first (a copy that rotted
        /// after its check is quarantined and fetched afresh). On the wire:
        /// one flags byte (bit 0) after the digest, present only when set,
        /// so a plain stat is what agents before it sent (an agent before it
        /// refuses the byte as malformed, which the asker ignores).
        recheck: bool,
    },
    /// Bytes `offset..offset+len` of a blob (one chunk of a parallel transfer).
    Blob {
        /// Repository name.
        repo: String,
        /// Blob digest.
        digest: Digest,
        /// First byte.
        offset: u64,
        /// Number of bytes.
        len: u64,
    },
    /// A repository's tags (distribution-spec "Listing Tags", end-8a): the
    /// answer's body is `{"name":…,"tags":[…]}`, every tag in lexical order;
    /// the node agent pages it for its clients.
    Tags {
        /// Repository name.
        repo: String,
    },
}

/// The outcome code of a response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Status {
    /// A body follows.
    Ok = 0,
    /// The manifest or blob does not exist upstream.
    NotFound = 1,
    /// The request was not valid.
    BadRequest = 2,
    /// The upstream could not be reached or failed.
    Upstream = 3,
    /// The upstream's bytes do not hash to the digest asked for.
    DigestMismatch = 4,
    /// The range lies outside the blob.
    RangeInvalid = 5,
    /// Anything else on the registry agent.
    Internal = 6,
    /// The client's certificate is not granted that repository (or channel).
    Denied = 7,
}

impl Status {
    fn from_u8(v: u8) -> Result<Status, WireError> {
        Ok(match v {
            0 => Status::Ok,
            1 => Status::NotFound,
            2 => Status::BadRequest,
            3 => Status::Upstream,
            4 => Status::DigestMismatch,
            5 => Status::RangeInvalid,
            6 => Status::Internal,
            7 => Status::Denied,
            value => {
                return Err(WireError::Unknown {
                    what: "status",
                    value,
                })
            }
        })
    }
}

/// The registry agent's answer header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Response {
    /// Success: `body_len` bytes follow.
    Ok {
        /// The object's media type (manifests; `application/octet-stream` for blobs).
        media_type: String,
        /// The whole object's digest.
        digest: Digest,
        /// The whole object's size.
        total: u64,
        /// Bytes in the body that follows.
        body_len: u64,
        /// sha256 of the body that follows, or [`UNHASHED`] (a blob chunk
        /// the server did not hash; this version's agents hash none: the node
        /// verifies every blob whole before serving or caching it). A node
        /// uses chunk hashes, where a server sends them, only to tell chunks
        /// damaged on its side from a server whose bytes are wrong
        /// (`transfer::diagnose`). Manifests are always hashed.
        body_sha256: [u8; 32],
        /// A manifest or tag list served from the registry agent's cache
        /// past its TTL because the upstream could not be reached. On the
        /// wire: one flags byte (bit 0) after `body_sha256`, present only
        /// when set, so a fresh answer is byte for byte what agents before
        /// it sent and understand.
        stale: bool,
    },
    /// Failure.
    Err {
        /// Which failure.
        status: Status,
        /// What went wrong, for people.
        message: String,
    },
}

impl From<FieldError> for WireError {
    fn from(e: FieldError) -> WireError {
        match e {
            FieldError::Trailing(n) => WireError::Trailing(n),
            FieldError::Utf8 => WireError::Utf8,
            // `TooLong` cannot arise: `STR` takes all a 2-byte length states.
            FieldError::Truncated | FieldError::TooLong { .. } => WireError::Truncated,
        }
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    // Strings are names, digests and messages: cut at the 16-bit length on a
    // character boundary rather than fail.
    frame::put_str(out, s, STR);
}

impl Request {
    /// The repository it names.
    pub fn repo(&self) -> &str {
        match self {
            Request::Manifest { repo, .. }
            | Request::Stat { repo, .. }
            | Request::Blob { repo, .. }
            | Request::Tags { repo } => repo,
        }
    }

    /// The message bytes (without the frame length). A request for a
    /// scoped repository ([`super::digest::scoped`]) is wrapped: kind 5, the
    /// registry host, then the request for the plain name — so a request
    /// without one is byte for byte what agents before scoping sent.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(128);
        if let (Some(ns), name) = split_scope(self.repo()) {
            out.push(KIND_SCOPED);
            put_str(&mut out, ns);
            let mut plain = self.clone();
            *plain.repo_mut() = name.to_string();
            out.extend_from_slice(&plain.encode());
            return out;
        }
        match self {
            Request::Manifest {
                repo,
                reference,
                accept,
            } => {
                out.push(1);
                put_str(&mut out, repo);
                put_str(&mut out, &reference.to_string());
                put_str(&mut out, accept);
            }
            Request::Stat {
                repo,
                digest,
                recheck,
            } => {
                out.push(2);
                put_str(&mut out, repo);
                put_str(&mut out, &digest.to_string());
                if *recheck {
                    out.push(RECHECK);
                }
            }
            Request::Blob {
                repo,
                digest,
                offset,
                len,
            } => {
                out.push(3);
                put_str(&mut out, repo);
                put_str(&mut out, &digest.to_string());
                out.extend_from_slice(&offset.to_be_bytes());
                out.extend_from_slice(&len.to_be_bytes());
            }
            Request::Tags { repo } => {
                out.push(4);
                put_str(&mut out, repo);
            }
        }
        out
    }

    /// The repository's name without its registry host (what access
    /// policies and upstream URLs use).
    pub fn plain_repo(&self) -> &str {
        split_scope(self.repo()).1
    }

    /// The same request for repository `repo`.
    pub fn with_repo(mut self, repo: String) -> Request {
        *self.repo_mut() = repo;
        self
    }

    fn repo_mut(&mut self) -> &mut String {
        match self {
            Request::Manifest { repo, .. }
            | Request::Stat { repo, .. }
            | Request::Blob { repo, .. }
            | Request::Tags { repo } => repo,
        }
    }

    /// Parse a message; names, references and digests are validated.
    pub fn decode(b: &[u8]) -> Result<Request, WireError> {
        if b.first() == Some(&KIND_SCOPED) {
            let mut r = Reader::new(&b[1..]);
            let ns = r.str(STR)?;
            check_namespace(&ns)?;
            // One level only: the inner request is a plain one.
            if r.rest().first() == Some(&KIND_SCOPED) {
                return Err(WireError::Unknown {
                    what: "request kind inside a scoped request",
                    value: KIND_SCOPED,
                });
            }
            let mut req = Request::decode_plain(r.rest())?;
            let name = std::mem::take(req.repo_mut());
            *req.repo_mut() = scoped(Some(&ns), &name);
            return Ok(req);
        }
        Request::decode_plain(b)
    }

    fn decode_plain(b: &[u8]) -> Result<Request, WireError> {
        let mut r = Reader::new(b);
        let kind = r.u8()?;
        let repo = r.str(STR)?;
        check_name(&repo)?;
        let req = match kind {
            1 => Request::Manifest {
                repo,
                reference: r.str(STR)?.parse()?,
                accept: r.str(STR)?,
            },
            2 => {
                let digest = r.str(STR)?.parse()?;
                let recheck = match r.rest() {
                    [] => false,
                    _ => match r.u8()? {
                        RECHECK => true,
                        value => {
                            return Err(WireError::Unknown {
                                what: "stat flags",
                                value,
                            })
                        }
                    },
                };
                Request::Stat {
                    repo,
                    digest,
                    recheck,
                }
            }
            3 => {
                let digest = r.str(STR)?.parse()?;
                let (offset, len) = (r.u64()?, r.u64()?);
                if offset.checked_add(len).is_none() {
                    return Err(WireError::Range { offset, len });
                }
                Request::Blob {
                    repo,
                    digest,
                    offset,
                    len,
                }
            }
            4 => Request::Tags { repo },
            value => {
                return Err(WireError::Unknown {
                    what: "request kind",
                    value,
                })
            }
        };
        r.end()?;
        Ok(req)
    }
}

impl Response {
    /// The message bytes (without the frame length).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(160);
        match self {
            Response::Ok {
                media_type,
                digest,
                total,
                body_len,
                body_sha256,
                stale,
            } => {
                out.push(Status::Ok as u8);
                put_str(&mut out, media_type);
                out.extend_from_slice(digest.bytes());
                out.extend_from_slice(&total.to_be_bytes());
                out.extend_from_slice(&body_len.to_be_bytes());
                out.extend_from_slice(body_sha256);
                if *stale {
                    out.push(FLAG_STALE);
                }
            }
            Response::Err { status, message } => {
                out.push(*status as u8);
                put_str(&mut out, message);
            }
        }
        out
    }

    /// Parse a message.
    pub fn decode(b: &[u8]) -> Result<Response, WireError> {
        let mut r = Reader::new(b);
        let status = Status::from_u8(r.u8()?)?;
        let resp = if status == Status::Ok {
            let media_type = r.str(STR)?;
            let d = r.array::<32>()?;
            let (total, body_len) = (r.u64()?, r.u64()?);
            let body_sha256 = r.array::<32>()?;
            let stale = match r.rest() {
                [] => false,
                [FLAG_STALE] => {
                    r.take(1)?;
                    true
                }
                [value, ..] => {
                    return Err(WireError::Unknown {
                        what: "flags",
                        value: *value,
                    })
                }
            };
            Response::Ok {
                media_type,
                digest: Digest::from_bytes(d),
                total,
                body_len,
                body_sha256,
                stale,
            }
        } else {
            Response::Err {
                status,
                message: r.str(STR)?,
            }
        };
        r.end()?;
        Ok(resp)
    }
}

/// A frame: the 4-byte length and the message.
pub fn frame(message: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(frame::PREFIX + message.len());
    frame::write(&mut out, |o| o.extend_from_slice(message));
    out
}

/// Split one frame off the front of `b`: `Ok(None)` when more bytes are
/// needed, else the message and the bytes consumed.
pub fn split_frame(b: &[u8]) -> Result<Option<(&[u8], usize)>, WireError> {
    frame::split(b, 0..=MAX_FRAME).map_err(WireError::TooLong)
}

/// Read one frame's message from a QUIC stream.
pub async fn read_frame(recv: &mut quinn::RecvStream) -> Result<Vec<u8>, FrameReadError> {
    let mut len = [0u8; frame::PREFIX];
    recv.read_exact(&mut len).await?;
    let n = frame::declared_len(&len, 0..=MAX_FRAME)
        .map_err(WireError::TooLong)?
        .unwrap_or_default(); // a whole prefix: always stated
    let mut msg = vec![0u8; n];
    recv.read_exact(&mut msg).await?;
    Ok(msg)
}

/// Why a frame could not be read from a stream.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FrameReadError {
    /// The stream ended or was reset, or the connection was lost.
    #[error("reading a frame: {0}")]
    Stream(#[from] quinn::ReadExactError),
    /// The frame is not valid.
    #[error(transparent)]
    Wire(#[from] WireError),
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn digest() -> impl Strategy<Value = Digest> {
        any::<[u8; 32]>().prop_map(Digest::from_bytes)
    }

    fn request() -> impl Strategy<Value = Request> {
        let repo = "[a-z0-9]{1,8}(/[a-z0-9]{1,8}){0,2}";
        prop_oneof![
            (repo, "[a-zA-Z0-9_][a-zA-Z0-9._-]{0,20}", ".{0,40}").prop_map(|(repo, t, accept)| {
                Request::Manifest {
                    repo,
                    reference: Reference::Tag(t),
                    accept,
                }
            }),
            (repo, digest()).prop_map(|(repo, d)| Request::Manifest {
                repo,
                reference: Reference::Digest(d),
                accept: String::new()
            }),
            (repo, digest(), any::<bool>()).prop_map(|(repo, digest, recheck)| Request::Stat {
                repo,
                digest,
                recheck
            }),
            repo.prop_map(|repo| Request::Tags {
                repo: repo.to_string()
            }),
            (repo, digest(), 0u64..u64::MAX / 2, 0u64..u64::MAX / 2).prop_map(
                |(repo, digest, offset, len)| Request::Blob {
                    repo,
                    digest,
                    offset,
                    len
                }
            ),
        ]
    }

    fn scoped_request() -> impl Strategy<Value = Request> {
        (
            request(),
            proptest::option::of("[a-z0-9.-]{1,20}(:[0-9]{1,5})?"),
        )
            .prop_map(|(mut r, ns)| {
                let name = r.repo().to_string();
                *r.repo_mut() = scoped(ns.as_deref(), &name);
                r
            })
    }

    proptest! {
        #[test]
        fn requests_round_trip(req in scoped_request()) {
            prop_assert_eq!(Request::decode(&req.encode()).unwrap(), req);
        }

        #[test]
        fn responses_round_trip(mt in ".{0,50}", d in digest(), total: u64, len: u64,
                                sha: [u8; 32], stale: bool, msg in ".{0,80}", code in 1u8..=6) {
            let ok = Response::Ok { media_type: mt, digest: d, total, body_len: len, body_sha256: sha, stale };
            prop_assert_eq!(Response::decode(&ok.encode()).unwrap(), ok);
            let err = Response::Err { status: Status::from_u8(code).unwrap(), message: msg };
            prop_assert_eq!(Response::decode(&err.encode()).unwrap(), err);
        }

        #[test]
        fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = Request::decode(&b);
            let _ = Response::decode(&b);
            let _ = split_frame(&b);
        }

        #[test]
        fn truncation_is_an_error(req in scoped_request(), cut in 0usize..200) {
            let b = req.encode();
            let cut = cut % b.len();
            match (&req, Request::decode(&b[..cut])) {
                // The flag byte is optional (absent on a plain stat): cut
                // off, what is left is the plain stat. Frames carry their
                // length, so a request is never cut in practice.
                (Request::Stat { repo, digest, recheck: true }, Ok(got)) if cut == b.len() - 1 => {
                    let plain = Request::Stat { repo: repo.clone(), digest: *digest, recheck: false };
                    prop_assert_eq!(got, plain);
                }
                (_, got) => prop_assert!(got.is_err()),
            }
        }
    }

    #[test]
    fn frames() {
        let f = frame(b"abc");
        assert_eq!(split_frame(&f).unwrap(), Some((&b"abc"[..], 7)));
        assert_eq!(split_frame(&f[..5]).unwrap(), None);
        let big = ((MAX_FRAME + 1) as u32).to_be_bytes();
        assert!(matches!(split_frame(&big), Err(WireError::TooLong(_))));
    }

    #[test]
    fn scoped_requests() {
        let req = Request::Tags {
            repo: scoped(Some("registry.example:5000"), "a/b"),
        };
        let b = req.encode();
        assert_eq!(b[0], KIND_SCOPED);
        assert_eq!(Request::decode(&b).unwrap(), req);
        assert_eq!(req.plain_repo(), "a/b");
        // Plain requests are encoded as before scoping existed.
        let plain = Request::Tags { repo: "a/b".into() };
        assert_eq!(plain.encode()[0], 4);
        // One level only, and the host is checked.
        let mut nested = vec![KIND_SCOPED];
        put_str(&mut nested, "x");
        nested.extend_from_slice(&b);
        assert!(Request::decode(&nested).is_err());
        let mut bad = vec![KIND_SCOPED];
        put_str(&mut bad, "a/b");
        bad.extend_from_slice(&plain.encode());
        assert!(matches!(Request::decode(&bad), Err(WireError::Name(_))));
    }

    #[test]
    fn overflowing_range_refused() {
        let mut b = Request::Blob {
            repo: "a".into(),
            digest: Digest::of(b""),
            offset: u64::MAX,
            len: 0,
        }
        .encode();
        let n = b.len();
        b[n - 1] = 1;
        assert!(matches!(Request::decode(&b), Err(WireError::Range { .. })));
    }
}
