//! The registry agent's side of `qr-image/1`: accept connections (mutual TLS
//! was checked by the endpoint's server config), one task per stream, one
//! request per stream (see [`super::wire`]).

use std::sync::Arc;

use sha2::{Digest as _, Sha256};

use super::digest::Digest;
use super::metrics::RegistryMetrics;
use super::source::SourceError;
use super::spool::Spool;
use super::wire::{self, read_frame, Request, Response, Status};

/// Largest chunk a node may ask for in one request: the agent holds a chunk
/// in memory to hash it before sending.
pub const MAX_CHUNK: u64 = 16 << 20;

/// Serve every connection `endpoint` accepts until it is closed.
pub async fn serve(endpoint: quinn::Endpoint, spool: Arc<Spool>, metrics: Arc<RegistryMetrics>) {
    while let Some(incoming) = endpoint.accept().await {
        let (spool, metrics) = (spool.clone(), metrics.clone());
        tokio::spawn(async move {
            let conn = match incoming.await {
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
            metrics.connections.inc();
            connection(conn, spool, metrics).await;
        });
    }
}

async fn connection(conn: quinn::Connection, spool: Arc<Spool>, metrics: Arc<RegistryMetrics>) {
    loop {
        let (send, recv) = match conn.accept_bi().await {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!("connection from {} ended: {e}", conn.remote_address());
                return;
            }
        };
        let (spool, metrics) = (spool.clone(), metrics.clone());
        tokio::spawn(async move {
            if let Err(e) = stream(send, recv, &spool, &metrics).await {
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
        SourceError::Unreachable(_) | SourceError::Upstream(_) => Status::Upstream,
        SourceError::DigestMismatch { .. } => Status::DigestMismatch,
        _ => Status::Internal,
    };
    err(status, e.to_string())
}

async fn stream(
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    spool: &Arc<Spool>,
    metrics: &RegistryMetrics,
) -> anyhow::Result<()> {
    metrics.requests.inc();
    let req = match read_frame(&mut recv).await {
        Ok(m) => Request::decode(&m).map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    let (header, body) = match req {
        Err(why) => {
            metrics.bad_requests.inc();
            (
                err(Status::BadRequest, format!("malformed request: {why}")),
                Vec::new(),
            )
        }
        Ok(req) => answer(req, spool, metrics).await,
    };
    if matches!(header, Response::Err { .. }) {
        metrics.errors.inc();
    }
    send.write_all(&wire::frame(&header.encode())).await?;
    send.write_all(&body).await?;
    metrics.bytes_sent.add(body.len() as u64);
    send.finish()?;
    // Wait for the peer to have read everything (or to go away) so the stream
    // is not reset by dropping it early.
    let _ = send.stopped().await;
    Ok(())
}

fn ok(media_type: &str, digest: Digest, total: u64, body: Vec<u8>) -> (Response, Vec<u8>) {
    let header = Response::Ok {
        media_type: media_type.to_string(),
        digest,
        total,
        body_len: body.len() as u64,
        body_sha256: Sha256::digest(&body).into(),
    };
    (header, body)
}

/// A blob chunk's answer, hashed on a blocking thread: a 4 MiB sha256 takes
/// milliseconds the async workers (and quinn's endpoint driver on them) need.
async fn ok_hashed(digest: Digest, total: u64, body: Vec<u8>) -> (Response, Vec<u8>) {
    match tokio::task::spawn_blocking(move || {
        let sha: [u8; 32] = Sha256::digest(&body).into();
        (body, sha)
    })
    .await
    {
        Ok((body, body_sha256)) => (
            Response::Ok {
                media_type: "application/octet-stream".into(),
                digest,
                total,
                body_len: body.len() as u64,
                body_sha256,
            },
            body,
        ),
        Err(e) => (
            err(Status::Internal, format!("hashing a chunk: {e}")),
            Vec::new(),
        ),
    }
}

async fn answer(
    req: Request,
    spool: &Arc<Spool>,
    metrics: &RegistryMetrics,
) -> (Response, Vec<u8>) {
    match req {
        Request::Manifest {
            repo,
            reference,
            accept,
        } => {
            metrics.upstream_manifests.inc();
            match spool.source().manifest(&repo, &reference, &accept).await {
                Ok((body, mt, digest)) => {
                    let total = body.len() as u64;
                    ok(&mt, digest, total, body.to_vec())
                }
                Err(e) => (source_err(&e), Vec::new()),
            }
        }
        Request::Stat { repo, digest } => match spool.size(&repo, &digest).await {
            Ok(size) => ok("application/octet-stream", digest, size, Vec::new()),
            Err(e) => (source_err(&e), Vec::new()),
        },
        Request::Blob {
            repo,
            digest,
            offset,
            len,
        } => {
            if len > MAX_CHUNK {
                metrics.bad_requests.inc();
                return (
                    err(
                        Status::BadRequest,
                        format!("chunk of {len} bytes above {MAX_CHUNK}"),
                    ),
                    Vec::new(),
                );
            }
            match spool.read(&repo, &digest, offset, len).await {
                Ok(Some((data, size))) => ok_hashed(digest, size, data).await,
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
    }
}
