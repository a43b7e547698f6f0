//! A blob over the fabric as parallel chunk streams.
//!
//! Up to `parallel` chunk requests are in flight, each its own QUIC stream.
//! Each chunk is handed to the blob's [`Sink`], which writes it at its offset
//! and, once every chunk before it is in, feeds it to the whole-blob sha256 in
//! order (the contiguous prefix, which HTTP clients are streamed as it grows:
//! [`super::inflight`]); the hash in a chunk's answer header is
//! checked only if the whole blob does not match (`diagnose`). A lost connection
//! or failed chunk is requested again after a redial: the transfer resumes
//! with every chunk already in, never from zero. Only when the whole blob
//! hashes to its digest may the caller commit it to the cache.
//!
//! Chunk size adapts: each chunk should take about `TARGET_ROUNDS` round trips
//! (so the per-request round trip costs little) but not much more than
//! `TARGET_TIME` (so parallel streams stay balanced and a lost chunk costs
//! little), measured per stream, within [`MIN_CHUNK`] .. [`MAX_CHUNK`].

use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinSet;

use super::cache::TempBlob;
use super::client::{FabricClient, FetchError};
use super::digest::Digest;
use super::inflight::Feed;
use super::metrics::{NodeMetrics, Path};
use super::sink::Sink;
use super::wire::{Request, UNHASHED};

/// Smallest adaptive chunk.
pub const MIN_CHUNK: u64 = 128 << 10;
/// Largest adaptive chunk.
pub const MAX_CHUNK: u64 = 4 << 20;
const TARGET_ROUNDS: u32 = 8;
const TARGET_TIME: Duration = Duration::from_millis(100);

/// How a blob is transferred.
#[derive(Clone, Debug)]
pub struct TransferOptions {
    /// Chunk requests in flight at once.
    pub parallel: usize,
    /// First chunk size; adapted within 128 KiB .. 4 MiB unless `fixed_chunk`.
    pub chunk: u64,
    /// Keep `chunk` fixed.
    pub fixed_chunk: bool,
    /// Give up when no chunk has arrived for this long (redials included).
    pub stall_timeout: Duration,
    /// Request a failed chunk again after a redial. Off for peers: a node
    /// agent with a registry agent behind it gives up on a peer at once.
    pub resume: bool,
}

impl Default for TransferOptions {
    fn default() -> Self {
        TransferOptions {
            parallel: 8,
            chunk: 1 << 20,
            fixed_chunk: false,
            stall_timeout: Duration::from_secs(30),
            resume: true,
        }
    }
}

/// The next chunk size: throughput of one stream × max(8 RTT, ~100 ms).
pub fn adapt(current: u64, bytes: u64, took: Duration, rtt: Duration) -> u64 {
    let secs = took.as_secs_f64().max(1e-6);
    let rate = bytes as f64 / secs; // bytes/s of one stream
    let target = (rtt * TARGET_ROUNDS).max(TARGET_TIME / 4).min(TARGET_TIME);
    let ideal = rate * target.as_secs_f64();
    // Move at most a factor of two per chunk: single measurements are noisy.
    let next = ideal.clamp(current as f64 / 2.0, current as f64 * 2.0) as u64;
    next.clamp(MIN_CHUNK, MAX_CHUNK) / 4096 * 4096
}

/// Fetch blob `digest` of `size` bytes into `temp` from `client`, counting
/// its bytes under `path`; returns what it hashed to. `feed` is told the
/// contiguous prefix, written and hashed, as it grows (up to the whole blob,
/// before the verdict: it is the caller who holds the last byte back).
#[allow(clippy::too_many_arguments)]
pub async fn fetch_blob(
    client: &Arc<FabricClient>,
    path: Path,
    repo: &str,
    digest: &Digest,
    temp: &TempBlob,
    opts: &TransferOptions,
    metrics: &Arc<NodeMetrics>,
    feed: Feed,
) -> Result<Digest, FetchError> {
    let size = temp.size();
    let sink = Sink::start(temp, opts.parallel.max(1) * 2, feed)?;
    // Bytes of chunks handed to the sink.
    let mut received = 0u64;
    // Each chunk's hash as its server sent it, checked only if the whole
    // blob does not match (see `diagnose`).
    let mut hashes: Vec<(u64, u64, [u8; 32])> = Vec::new();
    let mut retry: Vec<(u64, u64)> = Vec::new();
    let mut next = 0u64;
    let mut chunk = opts.chunk.clamp(1, super::wire::MAX_CHUNK);
    let mut tasks = JoinSet::new();
    let mut last_progress = Instant::now();
    let mut backoff = Duration::from_millis(50);
    // Failures until a chunk requested after them arrives are one resume,
    // however many chunks were in flight when the connection went (and
    // however many redials it takes). Each resume starts an episode; a chunk
    // requested before it (already on its way when the connection went, and
    // joined after the first failure) does not end it.
    let mut resuming = false;
    let mut episode = 0u64;
    while received < size {
        // Fill the window.
        while tasks.len() < opts.parallel.max(1) {
            let (off, len) = if let Some(r) = retry.pop() {
                r
            } else if next < size {
                let len = chunk.min(size - next);
                next += len;
                (next - len, len)
            } else {
                break;
            };
            let (c, m) = (client.clone(), metrics.clone());
            let req = Request::Blob {
                repo: repo.to_string(),
                digest: *digest,
                offset: off,
                len,
            };
            m.inflight_chunks.add(1);
            let asked_in = episode;
            tasks.spawn(async move {
                let start = Instant::now();
                let r = c.request_pieces(&req).await;
                m.inflight_chunks.add(-1);
                (off, len, asked_in, start.elapsed(), r)
            });
        }
        let stall = opts
            .stall_timeout
            .saturating_sub(last_progress.elapsed())
            .max(Duration::from_millis(1));
        let joined = match tokio::time::timeout(stall, tasks.join_next()).await {
            Ok(Some(j)) => j.map_err(|e| FetchError::Local(format!("chunk task: {e}")))?,
            Ok(None) => {
                return Err(FetchError::Protocol(
                    "no chunk in flight but the blob is incomplete".into(),
                ))
            }
            Err(_) => {
                return Err(FetchError::Connection(format!(
                    "no progress for {} s at byte {received} of {size} (is the registry agent \
                     running? see its log)",
                    opts.stall_timeout.as_secs()
                )))
            }
        };
        let (off, len, asked_in, took, result) = joined;
        match result {
            Ok(a) => {
                if a.total != size || a.body_len != len {
                    return Err(FetchError::Protocol(format!(
                        "chunk at {off}: {} bytes of a {}-byte blob, expected {len} of {size}",
                        a.body_len, a.total
                    )));
                }
                metrics.chunks.inc();
                metrics.bytes(path, len);
                received += len;
                hashes.push((off, len, a.body_sha256));
                // Written and hashed on the sink's thread; this loop goes on
                // filling the window.
                if let Err(e) = sink.put(off, a.pieces).await {
                    return Err(sink.finish().await.err().unwrap_or(e));
                }
                last_progress = Instant::now();
                if asked_in == episode {
                    backoff = Duration::from_millis(50);
                    resuming = false;
                }
                if !opts.fixed_chunk {
                    let rtt = match client.connection().await {
                        Ok(c) => c.rtt(),
                        Err(_) => Duration::from_millis(1),
                    };
                    chunk = adapt(chunk, len, took, rtt);
                    metrics
                        .chunk_size
                        .add(chunk as i64 - metrics.chunk_size.get());
                }
            }
            Err(e) if e.retryable() && opts.resume => {
                // A chunk that fails its own hash was damaged in flight (the
                // registry agent hashed what it sent): fetch it again. A lost
                // connection: redial (in `request`) and go on from here.
                if matches!(e, FetchError::ChunkCorrupt(_)) {
                    metrics.verify_failures.inc();
                }
                if !resuming {
                    resuming = true;
                    episode += 1;
                    metrics.resumes.inc();
                    tracing::info!(
                        "chunk at {off} failed ({e}); resuming with {received} of {size} bytes in"
                    );
                }
                retry.push((off, len));
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
            Err(e) => return Err(e),
        }
    }
    // Drain the tasks (none should be left) so no write lands after return.
    tasks.shutdown().await;
    let actual = sink.finish().await?;
    if actual != *digest {
        diagnose(temp, hashes, digest, actual).await?;
    }
    Ok(actual)
}

/// The whole blob hashed to `actual`, not `digest`: were chunks damaged
/// between the server's hashing and the sink (each chunk read back from the
/// temp file against the hash its server sent), or are the server's bytes
/// wrong as they are (a corrupt upstream copy, a peer's rotten cache)?
/// Checking chunks only here keeps the node at one sha256 pass per byte on
/// the success path; QUIC's AEAD already protects the bytes in flight, so the
/// chunk hashes guard the servers' and our own memory, disk and code.
async fn diagnose(
    temp: &TempBlob,
    hashes: Vec<(u64, u64, [u8; 32])>,
    digest: &Digest,
    actual: Digest,
) -> Result<(), FetchError> {
    use sha2::{Digest as _, Sha256};
    let file = temp
        .reader()
        .map_err(|e| FetchError::Local(e.to_string()))?;
    let bad = tokio::task::spawn_blocking(move || {
        let mut bad = Vec::new();
        // Chunks of a blob the server had verified whole come unhashed
        // (wire::UNHASHED): nothing to compare them with.
        for (off, len, want) in hashes.into_iter().filter(|h| h.2 != UNHASHED) {
            let mut buf = vec![0u8; len as usize];
            file.read_exact_at(&mut buf, off)?;
            if <[u8; 32]>::from(Sha256::digest(&buf)) != want {
                bad.push(off);
            }
        }
        Ok::<_, std::io::Error>(bad)
    })
    .await
    .map_err(|e| FetchError::Local(format!("checking chunks: {e}")))?
    .map_err(|e| FetchError::Local(format!("reading chunks back: {e}")))?;
    if bad.is_empty() {
        return Ok(());
    }
    Err(FetchError::ChunkCorrupt(format!(
        "blob {digest} hashed to {actual}: {} chunk(s) (first at byte {}) differ from \
         what the server hashed",
        bad.len(),
        bad[0]
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest as _, Sha256};

    #[tokio::test]
    async fn a_mismatching_blob_names_its_damaged_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let cache = super::super::cache::Cache::open(dir.path(), 1 << 20).unwrap();
        let data: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
        let temp = cache.temp(&Digest::of(&data), 3000).unwrap();
        let mut hashes = Vec::new();
        for off in [0u64, 1000, 2000] {
            let c = &data[off as usize..off as usize + 1000];
            temp.write_at(off, c).unwrap();
            hashes.push((off, 1000, <[u8; 32]>::from(Sha256::digest(c))));
        }
        let (want, other) = (Digest::of(&data), Digest::of(b"x"));
        // Every chunk as its server hashed it: the server's bytes are wrong.
        assert!(diagnose(&temp, hashes.clone(), &want, other).await.is_ok());
        // One byte damaged after hashing: named as chunk damage, retryable.
        temp.write_at(1500, &[data[1500] ^ 1]).unwrap();
        // ... but not if its server sent that chunk unhashed (it had verified
        // the blob whole): then nothing tells the damage apart.
        let mut unhashed = hashes.clone();
        unhashed[1].2 = UNHASHED;
        assert!(diagnose(&temp, unhashed, &want, other).await.is_ok());
        match diagnose(&temp, hashes, &want, other).await {
            Err(e @ FetchError::ChunkCorrupt(_)) => {
                assert!(
                    e.to_string().contains("1 chunk(s) (first at byte 1000)"),
                    "{e}"
                )
            }
            r => panic!("{r:?}"),
        }
    }

    #[test]
    fn adapt_stays_in_bounds_and_grows_with_fast_links() {
        // 1 GB/s per stream, 100 µs RTT: ~25 ms target → grows (at most x2).
        let n = adapt(
            1 << 20,
            1 << 20,
            Duration::from_millis(1),
            Duration::from_micros(100),
        );
        assert_eq!(n, 2 << 20);
        // Slow stream: 10 MB/s with a 1 ms RTT → shrinks.
        let n = adapt(
            1 << 20,
            1 << 20,
            Duration::from_millis(100),
            Duration::from_millis(1),
        );
        assert!(n < 1 << 20, "{n}");
        for (c, b, t) in [(MIN_CHUNK, 1, 10_000u64), (MAX_CHUNK, 1 << 30, 1)] {
            let n = adapt(c, b, Duration::from_micros(t), Duration::from_millis(5));
            assert!((MIN_CHUNK..=MAX_CHUNK).contains(&n), "{n}");
            assert_eq!(n % 4096, 0);
        }
    }
}
