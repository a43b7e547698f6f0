//! The node agent's side of `qr-image/1`: one QUIC connection to the
//! registry agent, dialled again when it is lost (a restarted registry agent
//! has a new QPN, so a redial goes through the bootstrap service again).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use sha2::{Digest as _, Sha256};

use super::digest::{Digest, Reference};
use super::wire::{self, read_frame, Request, Response, Status};

/// Why a fabric request failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum FetchError {
    /// The registry agent has no such object (nor has its upstream).
    #[error("not found: {0}")]
    NotFound(String),
    /// This node's certificate is not granted the repository.
    #[error("denied: {0}")]
    Denied(String),
    /// The range asked for lies outside the blob.
    #[error("range outside the blob: {0}")]
    Range(String),
    /// The registry agent's upstream failed or is unreachable.
    #[error("registry agent reports: {0}")]
    Upstream(String),
    /// Bytes did not hash to their digest (a corrupt upstream copy, or a
    /// chunk damaged on the way): never served, never cached.
    #[error("digest mismatch: {0}")]
    DigestMismatch(String),
    /// An answer did not hash to the value its header carried (damaged
    /// between the agents' hashing points): fetched again.
    #[error("chunk corrupt: {0}")]
    ChunkCorrupt(String),
    /// The connection to the registry agent failed or was lost: retried.
    #[error("registry agent connection: {0}")]
    Connection(String),
    /// The registry agent broke the protocol or refused the request.
    #[error("protocol: {0}")]
    Protocol(String),
    /// A local operation failed (cache, file system).
    #[error("local: {0}")]
    Local(String),
}

impl FetchError {
    /// Whether trying again (after a redial) may succeed.
    pub fn retryable(&self) -> bool {
        matches!(
            self,
            FetchError::Connection(_) | FetchError::ChunkCorrupt(_)
        )
    }
}

/// Why a dial of the registry agent (or a peer) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DialFailure {
    /// The client's TLS configuration could not be built from its identity.
    #[error("client TLS: {0}")]
    Tls(#[from] crate::pki::PkiError),
    /// The fabric dial failed: bootstrap query, route, endpoint or handshake.
    #[error(transparent)]
    Fabric(#[from] crate::channel_endpoint::DialError),
    /// Another transport's dial failed (a [`Dialer`] of an embedder's).
    #[error(transparent)]
    Other(Box<dyn std::error::Error + Send + Sync>),
}

/// A boxed future of a dial.
pub type DialFuture<'a> = Pin<
    Box<dyn Future<Output = Result<(quinn::Endpoint, quinn::Connection), DialFailure>> + Send + 'a>,
>;

/// Opens a connection to the registry agent (mutual TLS, ALPN `qr-image/1`).
pub trait Dialer: Send + Sync + 'static {
    /// Dial once.
    fn dial(&self) -> DialFuture<'_>;
}

/// A connection (kept with its endpoint) to the registry agent, redialled on loss.
pub struct FabricClient {
    dialer: Box<dyn Dialer>,
    conn: tokio::sync::Mutex<Option<(quinn::Endpoint, quinn::Connection)>>,
}

impl std::fmt::Debug for FabricClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FabricClient").finish_non_exhaustive()
    }
}

/// An answer's header fields and body.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The object's media type.
    pub media_type: String,
    /// The whole object's digest.
    pub digest: Digest,
    /// The whole object's size.
    pub total: u64,
    /// The body: checked against `body_sha256` already unless it is a blob
    /// chunk (see [`FabricClient::request`]).
    pub body: Bytes,
    /// The sha256 of the body the server sent, from the header.
    pub body_sha256: [u8; 32],
    /// Served from the registry agent's cache past its TTL, the upstream
    /// unreachable ([`super::manifests`]).
    pub stale: bool,
}

/// An answer whose body is kept as the pieces it arrived in
/// ([`FabricClient::request_pieces`]).
#[derive(Debug, Clone)]
pub struct Pieces {
    /// The object's media type.
    pub media_type: String,
    /// The whole object's digest.
    pub digest: Digest,
    /// The whole object's size.
    pub total: u64,
    /// The body, in order, as quinn handed it over.
    pub pieces: Vec<Bytes>,
    /// The body's length (the sum of the pieces' lengths).
    pub body_len: u64,
    /// The sha256 of the body the server sent, from the header.
    pub body_sha256: [u8; 32],
    /// Served stale (see [`Answer::stale`]).
    pub stale: bool,
}

impl FabricClient {
    /// A client dialling with `dialer` when it needs a connection.
    pub fn new(dialer: Box<dyn Dialer>) -> Arc<FabricClient> {
        Arc::new(FabricClient {
            dialer,
            conn: tokio::sync::Mutex::new(None),
        })
    }

    /// The current connection, dialled if there is none or it was lost.
    pub async fn connection(&self) -> Result<quinn::Connection, FetchError> {
        let mut g = self.conn.lock().await;
        if let Some((_, c)) = g.as_ref() {
            if c.close_reason().is_none() {
                return Ok(c.clone());
            }
        }
        *g = None;
        let (ep, c) = tokio::time::timeout(Duration::from_secs(10), self.dialer.dial())
            .await
            .map_err(|_| FetchError::Connection("dial timed out after 10 s".into()))?
            .map_err(|e| FetchError::Connection(crate::logging::chain(&e)))?;
        *g = Some((ep, c.clone()));
        Ok(c)
    }

    /// One request on its own stream; the answer's body is read whole and,
    /// unless it is a blob chunk, checked against the hash in its header.
    pub async fn request(&self, req: &Request) -> Result<Answer, FetchError> {
        let p = self.request_pieces(req).await?;
        let body = match &p.pieces[..] {
            [] => Bytes::new(),
            [one] => one.clone(),
            many => Bytes::from(many.concat()),
        };
        Ok(Answer {
            media_type: p.media_type,
            digest: p.digest,
            total: p.total,
            body,
            body_sha256: p.body_sha256,
            stale: p.stale,
        })
    }

    /// As [`FabricClient::request`], the body kept in the pieces quinn
    /// received it in (no copy: a blob chunk goes from them to the cache
    /// file with one `pwritev`, [`super::cache::TempWriter::write_pieces_at`]).
    pub async fn request_pieces(&self, req: &Request) -> Result<Pieces, FetchError> {
        let conn = self.connection().await?;
        // A certificate the registry agent refused, or a channel it does not
        // grant, is named as such; otherwise why the connection went (a
        // stream error alone says only "connection lost").
        let lost = |e: &dyn std::fmt::Display| {
            FetchError::Connection(crate::refusal::peer_refusal(&conn).unwrap_or_else(|| {
                let what = e.to_string();
                match conn.close_reason().map(|r| r.to_string()) {
                    Some(why) if !what.contains(&why) => format!("{what} ({why})"),
                    _ => what,
                }
            }))
        };
        let (mut send, mut recv) = conn.open_bi().await.map_err(|e| lost(&e))?;
        send.write_all(&wire::frame(&req.encode()))
            .await
            .map_err(|e| lost(&e))?;
        send.finish().map_err(|e| lost(&e))?;
        let header = match read_frame(&mut recv).await {
            Ok(m) => Response::decode(&m).map_err(|e| FetchError::Protocol(e.to_string()))?,
            Err(wire::FrameReadError::Wire(e)) => return Err(FetchError::Protocol(e.to_string())),
            Err(e) => return Err(lost(&e)),
        };
        match header {
            Response::Err { status, message } => Err(match status {
                Status::NotFound => FetchError::NotFound(message),
                Status::Denied => FetchError::Denied(message),
                Status::RangeInvalid => FetchError::Range(message),
                Status::Upstream => FetchError::Upstream(message),
                Status::DigestMismatch => FetchError::DigestMismatch(message),
                _ => FetchError::Protocol(format!("{status:?}: {message}")),
            }),
            Response::Ok {
                media_type,
                digest,
                total,
                body_len,
                body_sha256,
                stale,
            } => {
                let expect = match req {
                    Request::Blob { len, offset, .. } => (*len).min(total.saturating_sub(*offset)),
                    Request::Stat { .. } => 0,
                    Request::Manifest { .. } | Request::Tags { .. } => body_len,
                };
                if body_len != expect || body_len > 64 << 20 {
                    return Err(FetchError::Protocol(format!(
                        "body of {body_len} bytes, expected {expect}"
                    )));
                }
                // Up to READ_BATCH of quinn's received pieces per call (one
                // wake-up and connection lock per batch, not per packet).
                const READ_BATCH: usize = 64;
                let mut pieces = Vec::new();
                let mut got = 0u64;
                let mut batch: [Bytes; READ_BATCH] = std::array::from_fn(|_| Bytes::new());
                while got < body_len {
                    match recv.read_chunks(&mut batch).await.map_err(|e| lost(&e))? {
                        Some(n) => {
                            for b in &mut batch[..n] {
                                got += b.len() as u64;
                                pieces.push(std::mem::take(b));
                            }
                        }
                        None => {
                            return Err(lost(&format!(
                                "stream ended after {got} of {body_len} body bytes"
                            )))
                        }
                    }
                }
                if got != body_len {
                    return Err(FetchError::Protocol(format!(
                        "{got} body bytes, the header said {body_len}"
                    )));
                }
                // A blob chunk's hash is checked by the transfer only if the
                // whole blob does not match its digest (transfer::fetch_blob):
                // one sha256 pass per byte on the node, not two. Anything
                // else (manifests) is checked here.
                if !matches!(req, Request::Blob { .. }) {
                    let mut h = Sha256::new();
                    for p in &pieces {
                        h.update(p);
                    }
                    if <[u8; 32]>::from(h.finalize()) != body_sha256 {
                        return Err(FetchError::ChunkCorrupt(format!(
                            "a {body_len}-byte answer for {digest} does not match its header's hash"
                        )));
                    }
                }
                Ok(Pieces {
                    media_type,
                    digest,
                    total,
                    pieces,
                    body_len,
                    body_sha256,
                    stale,
                })
            }
        }
    }

    /// A manifest; a manifest asked for by digest must hash to it.
    pub async fn manifest(
        &self,
        repo: &str,
        reference: &Reference,
        accept: &str,
    ) -> Result<Answer, FetchError> {
        let a = self
            .request(&Request::Manifest {
                repo: repo.into(),
                reference: reference.clone(),
                accept: accept.into(),
            })
            .await?;
        let actual = Digest::of(&a.body);
        let want = match reference {
            Reference::Digest(d) => *d,
            Reference::Tag(_) => a.digest,
        };
        if actual != want {
            return Err(FetchError::DigestMismatch(format!(
                "manifest {repo}:{reference} is {actual}, expected {want}"
            )));
        }
        Ok(a)
    }

    /// The tag list of `repo` (`{"name","tags"}`, every tag, in lexical order).
    pub async fn tags(&self, repo: &str) -> Result<Answer, FetchError> {
        self.request(&Request::Tags { repo: repo.into() }).await
    }

    /// A blob's size.
    pub async fn stat(&self, repo: &str, digest: &Digest) -> Result<u64, FetchError> {
        Ok(self
            .request(&Request::Stat {
                repo: repo.into(),
                digest: *digest,
                recheck: false,
            })
            .await?
            .total)
    }

    /// Tell the server the blob it served did not match `digest`: it checks
    /// its cached copy again (quarantining a rotten one) before answering.
    pub async fn recheck(&self, repo: &str, digest: &Digest) -> Result<(), FetchError> {
        self.request(&Request::Stat {
            repo: repo.into(),
            digest: *digest,
            recheck: true,
        })
        .await
        .map(|_| ())
    }
}
