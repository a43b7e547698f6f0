//! The serving side of `qr-image/1`: accept connections (mutual TLS was
//! checked by the endpoint's server config), one task per stream, one request
//! per stream (see [`super::wire`]). A registry agent serves its pull-through
//! [`Spool`]; a node agent serves its peers from its verified cache only.
//!
//! Mutual TLS says who the client is; the [`Access`] policy says what it may
//! read: a connection whose certificate is not granted this channel is closed,
//! a request for a repository it is not granted is answered
//! [`Status::Denied`].

use std::sync::Arc;

use sha2::{Digest as _, Sha256};

use super::digest::Digest;
use super::metrics::{RegistryMetrics, RequestKind};
use super::node::Node;
use super::source_error::SourceError;
use super::spool::{read_range, Piece, Spool};
use super::wire::{self, read_frame, Request, Response, Status, MAX_CHUNK, UNHASHED};
use crate::access::{Access, Identity};
use crate::channel_endpoint::Watcher;
use quic_rdma::quinn_adapter::RetryGate;

/// The channel's name in the access policy.
fn channel() -> &'static str {
    std::str::from_utf8(wire::ALPN).expect("the ALPN is ASCII")
}

/// The application error code a connection is closed with when its
/// certificate is not granted the channel.
pub const CLOSE_DENIED: u32 = 0x403;

/// What a server answers from.
#[derive(Clone, Debug)]
pub enum Store {
    /// A registry agent: manifests and blobs from its source, pulled through.
    Registry(Arc<Spool>),
    /// A node agent serving its peers: blobs that are complete and verified in
    /// its cache, nothing else (no manifests: tags move, and the registry
    /// agent is the authority on them; no partial blobs: a peer that lacks a
    /// blob answers "not found" and the asker falls back to the registry agent),
    /// and only under a repository the registry agent confirmed for it.
    Peer(Arc<Node>),
}

/// How a server screens, watches and counts what it serves.
#[derive(Clone, Default)]
pub struct Serving {
    /// Counters.
    pub metrics: Arc<RegistryMetrics>,
    /// The fabric endpoint's watcher: closes connections whose peer died.
    pub watcher: Option<Watcher>,
    /// What each client certificate may read.
    pub access: Arc<Access>,
    /// When attempts get a Retry (address validation).
    pub gate: RetryGate,
}

impl std::fmt::Debug for Serving {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Serving")
            .field("access", &self.access)
            .field("gate", &self.gate)
            .finish_non_exhaustive()
    }
}

/// Serve every connection `endpoint` accepts until it is closed, from `spool`.
pub async fn serve(endpoint: quinn::Endpoint, spool: Arc<Spool>, serving: Serving) {
    serve_store(endpoint, Store::Registry(spool), serving).await
}

/// Serve every connection `endpoint` accepts until it is closed, from `store`.
pub async fn serve_store(endpoint: quinn::Endpoint, store: Store, serving: Serving) {
    while let Some(attempt) = serving.gate.accept(&endpoint).await {
        let (store, serving) = (store.clone(), serving.clone());
        tokio::spawn(async move {
            let Serving {
                metrics,
                watcher,
                access,
                ..
            } = serving;
            let conn = match attempt.await {
                Ok(c) => c,
                Err(e) => {
                    metrics.handshake_failures.inc();
                    tracing::warn!(
                        "handshake refused: {e} (does the node agent's certificate chain to \
                         this agent's --ca, and does it speak ALPN qr-image/1?)"
                    );
                    return;
                }
            };
            let id = Identity::of(&conn).unwrap_or_default();
            if !access.may_use_channel(&id, channel()) {
                metrics.denied.inc();
                tracing::warn!(
                    "{id} from {} is not granted channel {} by the access policy: closed",
                    conn.remote_address(),
                    channel()
                );
                let why = format!("{id} is not granted channel {}", channel());
                conn.close(CLOSE_DENIED.into(), why.as_bytes());
                return;
            }
            metrics.connections.inc();
            if let Some(w) = &watcher {
                w.watch(&conn);
            }
            connection(conn, store, metrics, Arc::new((id, access))).await;
        });
    }
}

/// Who the client is, and what it may read.
type Client = Arc<(Identity, Arc<Access>)>;

async fn connection(
    conn: quinn::Connection,
    store: Store,
    metrics: Arc<RegistryMetrics>,
    client: Client,
) {
    loop {
        let (send, recv) = match conn.accept_bi().await {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!("connection from {} ended: {e}", conn.remote_address());
                return;
            }
        };
        let (store, metrics, client) = (store.clone(), metrics.clone(), client.clone());
        let requester = conn.stable_id() as u64;
        tokio::spawn(async move {
            if let Err(e) = stream(send, recv, &store, &metrics, &client, requester).await {
                tracing::debug!("stream: {e}");
            }
        });
    }
}

fn err(status: Status, message: impl Into<String>) -> Response {
    Response::Err {
        status,
        message: message.into(),
    }
}

fn source_err(e: &SourceError) -> Response {
    let status = match e {
        SourceError::NotFound(_) => Status::NotFound,
        SourceError::Unreachable(_) | SourceError::Upstream(_) | SourceError::Denied(_) => {
            Status::Upstream
        }
        SourceError::DigestMismatch { .. } => Status::DigestMismatch,
        _ => Status::Internal,
    };
    err(status, e.to_string())
}

async fn stream(
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    store: &Store,
    metrics: &RegistryMetrics,
    client: &Client,
    requester: u64,
) -> anyhow::Result<()> {
    metrics.requests.inc();
    let req = match read_frame(&mut recv).await {
        Ok(m) => Request::decode(&m).map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    let start = std::time::Instant::now();
    let kind = match &req {
        Ok(Request::Manifest { .. }) => RequestKind::Manifest,
        Ok(Request::Stat { .. }) => RequestKind::Stat,
        Ok(Request::Blob { .. }) => RequestKind::Blob,
        Ok(Request::Tags { .. }) => RequestKind::Tags,
        Err(_) => RequestKind::Malformed,
    };
    let what = match &req {
        Ok(Request::Manifest {
            repo, reference, ..
        }) => format!("manifest {repo}:{reference}"),
        Ok(Request::Stat {
            repo,
            digest,
            recheck,
        }) => format!(
            "stat {repo}@{digest}{}",
            if *recheck { " (recheck)" } else { "" }
        ),
        // Many per blob, logged only at debug: no line built otherwise.
        Ok(Request::Blob { .. }) if !tracing::enabled!(target: "qr::access", tracing::Level::DEBUG) => {
            String::new()
        }
        Ok(Request::Blob {
            repo,
            digest,
            offset,
            len,
        }) => {
            format!("blob {repo}@{digest} [{offset}+{len}]")
        }
        Ok(Request::Tags { repo }) => format!("tags {repo}"),
        Err(why) => format!("malformed: {why}"),
    };
    let is_blob = kind == RequestKind::Blob;
    let (header, body) = match req {
        Err(why) => {
            metrics.bad_requests.inc();
            (
                err(Status::BadRequest, format!("malformed request: {why}")),
                Vec::new(),
            )
        }
        // Both stores hold a chunk in memory to hash it.
        Ok(Request::Blob { len, .. }) if len > MAX_CHUNK => {
            metrics.bad_requests.inc();
            (
                err(
                    Status::BadRequest,
                    format!("chunk of {len} bytes above {MAX_CHUNK}"),
                ),
                Vec::new(),
            )
        }
        // The policy names repositories, whichever registry serves them.
        Ok(req) if !client.1.may_read(&client.0, channel(), req.plain_repo()) => {
            metrics.denied.inc();
            (
                err(
                    Status::Denied,
                    format!(
                        "{} is not granted repository {}",
                        client.0,
                        req.plain_repo()
                    ),
                ),
                Vec::new(),
            )
        }
        Ok(req) => match store {
            Store::Registry(spool) => match spool.source().canonical(req.repo()) {
                Ok(repo) => answer(req.with_repo(repo), spool, requester).await,
                Err(e) => (source_err(&e), Vec::new()),
            },
            Store::Peer(node) => answer_peer(req, node).await,
        },
    };
    if matches!(header, Response::Err { .. }) {
        metrics.errors.inc();
    }
    send.write_all(&wire::frame(&header.encode())).await?;
    let n = body.len() as u64;
    // Handed over, not copied into quinn's send buffer.
    send.write_chunk(bytes::Bytes::from(body)).await?;
    if is_blob {
        metrics.bytes_sent.add(n);
    }
    send.finish()?;
    // Wait for the peer to have read everything (or to go away) so the stream
    // is not reset by dropping it early.
    let _ = send.stopped().await;
    let took = start.elapsed();
    metrics.request_duration.get(kind).observe(took);
    let status = match &header {
        Response::Ok { stale: true, .. } => "ok (stale)".to_string(),
        Response::Ok { .. } => "ok".to_string(),
        Response::Err { status, message } => format!("{status:?}: {message}"),
    };
    // One line per request; blob chunks (many per blob) only at debug.
    let ms = took.as_secs_f64() * 1e3;
    if is_blob {
        tracing::debug!(target: "qr::access", client = %client.0, "{what} {status} {n}B {ms:.1}ms");
    } else {
        tracing::info!(target: "qr::access", client = %client.0, "{what} {status} {n}B {ms:.1}ms");
    }
    Ok(())
}

fn ok(media_type: &str, digest: Digest, total: u64, body: Vec<u8>) -> (Response, Vec<u8>) {
    ok_stale(media_type, digest, total, body, false)
}

fn ok_stale(
    media_type: &str,
    digest: Digest,
    total: u64,
    body: Vec<u8>,
    stale: bool,
) -> (Response, Vec<u8>) {
    let header = Response::Ok {
        media_type: media_type.to_string(),
        digest,
        total,
        body_len: body.len() as u64,
        body_sha256: Sha256::digest(&body).into(),
        stale,
    };
    (header, body)
}

/// A blob chunk's answer, sent [`UNHASHED`]. A chunk of a blob this agent
/// verified whole (its cache) needs no hash: it would only restate that
/// verification. Nor does a chunk of a blob still arriving from upstream:
/// the download is hashed whole as it arrives and never cached on a
/// mismatch, and the node verifies every blob whole before serving or
/// caching it and refetches it on a mismatch; a chunk hash would only change
/// the node's message, at a second sha256 pass per byte here
/// (benches/results/image-agents.md).
fn ok_chunk(digest: Digest, piece: Piece) -> (Response, Vec<u8>) {
    let Piece {
        data: body,
        size: total,
    } = piece;
    (
        Response::Ok {
            media_type: "application/octet-stream".into(),
            digest,
            total,
            body_len: body.len() as u64,
            body_sha256: UNHASHED,
            stale: false,
        },
        body,
    )
}

/// A blob chunk read from a store, or why not.
async fn chunk(
    digest: Digest,
    offset: u64,
    read: Result<Option<Piece>, SourceError>,
) -> (Response, Vec<u8>) {
    match read {
        Ok(Some(piece)) => ok_chunk(digest, piece),
        Ok(None) => (
            err(
                Status::RangeInvalid,
                format!("offset {offset} is past the blob's end"),
            ),
            Vec::new(),
        ),
        Err(e) => (source_err(&e), Vec::new()),
    }
}

async fn answer(req: Request, spool: &Arc<Spool>, requester: u64) -> (Response, Vec<u8>) {
    match req {
        Request::Manifest {
            repo,
            reference,
            accept,
        } => match spool.manifest(&repo, &reference, &accept).await {
            Ok((m, stale)) => {
                let total = m.body.len() as u64;
                ok_stale(&m.media_type, m.digest, total, m.body.to_vec(), stale)
            }
            Err(e) => (source_err(&e), Vec::new()),
        },
        Request::Tags { repo } => match spool.tags(&repo).await {
            Ok((tags, stale)) => {
                // distribution-spec "Listing Tags": `{"name","tags"}`.
                let body = serde_json::json!({ "name": repo, "tags": tags }).to_string();
                let body = body.into_bytes();
                let (d, total) = (Digest::of(&body), body.len() as u64);
                ok_stale("application/json", d, total, body, stale)
            }
            Err(e) => (source_err(&e), Vec::new()),
        },
        Request::Stat {
            repo,
            digest,
            recheck,
        } => {
            if recheck {
                spool.recheck(&repo, &digest).await;
            }
            match spool.size(&repo, &digest).await {
                Ok(size) => ok("application/octet-stream", digest, size, Vec::new()),
                Err(e) => (source_err(&e), Vec::new()),
            }
        }
        Request::Blob {
            repo,
            digest,
            offset,
            len,
        } => {
            chunk(
                digest,
                offset,
                spool.read(&repo, &digest, offset, len, requester).await,
            )
            .await
        }
    }
}

/// A node agent's answer to a peer: only what its cache holds, which is
/// complete and was verified against its digest before it was committed
/// (cache::TempBlob::commit), so its chunks go [`UNHASHED`] as the registry
/// agent's cached ones do; the asker verifies the whole blob.
async fn answer_peer(req: Request, node: &Node) -> (Response, Vec<u8>) {
    let cache = &node.cache;
    let not_here = |what: &str| {
        (
            err(
                Status::NotFound,
                format!("{what}: not in this node agent's cache"),
            ),
            Vec::new(),
        )
    };
    match req {
        Request::Manifest { reference, .. } => {
            not_here(&format!("manifest {reference} (peers serve blobs only)"))
        }
        Request::Tags { repo } => not_here(&format!("tags of {repo} (peers serve blobs only)")),
        // Only under a repository the registry agent confirmed references
        // the blob (for this node): the cache itself is keyed by digest.
        Request::Stat { repo, digest, .. } | Request::Blob { repo, digest, .. }
            if !node.references.contains(&repo, &digest) =>
        {
            not_here(&format!("{digest} under {repo}"))
        }
        Request::Stat {
            digest, recheck, ..
        } => {
            let m = &node.metrics;
            let corrupt = [&m.cache_corrupt, &m.verify_failures];
            if recheck && !node.cache.recheck(&digest, &corrupt).await {
                return not_here(&digest.to_string());
            }
            match cache.get(&digest) {
                Some((_, size)) => ok("application/octet-stream", digest, size, Vec::new()),
                None => not_here(&digest.to_string()),
            }
        }
        Request::Blob {
            digest,
            offset,
            len,
            ..
        } => {
            let Some((file, size)) = node.cached(&digest).await else {
                return not_here(&digest.to_string());
            };
            chunk(digest, offset, read_range(&file, size, offset, len).await).await
        }
    }
}
