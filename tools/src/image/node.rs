//! The node agent's object store: blobs from the cache, else from a peer node
//! agent that has them, else from the registry agent over the fabric
//! (single-flight per blob, so concurrent requests for one blob share one
//! transfer), verified whole before they are cached or served.
//!
//! The cache is keyed by digest; a blob is served under repository R only
//! once the registry agent confirmed that this node may read R and that R
//! references it ([`References`], one stat per pair, remembered) — whether the
//! bytes then come from the cache, a peer or the fabric.

use std::collections::HashMap;
use std::fs::File;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, OwnedMutexGuard};

use super::cache::{Cache, TempBlob};
use super::client::{Answer, FabricClient, FetchError};
use super::digest::{split_scope, Digest, Reference};
use super::metrics::{NodeMetrics, Path};
use super::peer::Peer;
use super::references::References;
use super::transfer::{fetch_blob, TransferOptions};
use super::upstream::Upstream;

/// How many times a blob whose whole digest did not match is fetched again
/// before the request fails (a corrupt upstream copy stays corrupt).
pub const REFETCHES: u32 = 1;

/// How long after a streamed fetch of a blob failed (cut-through,
/// [`super::cut_through`]) its requests are answered whole (with the
/// error, if it fails again).
pub const CUT_THROUGH_FAILED_FOR: Duration = Duration::from_secs(60);

/// Blobs whose streamed fetch failed recently (bounded: the oldest go first).
/// Node state that [`super::cut_through`] writes and the HTTP front reads;
/// kept here, with the node, so that `cut_through` uses `node` and not both
/// ways.
#[derive(Debug, Default)]
pub struct CutThroughFailures(Mutex<HashMap<Digest, Instant>>);

impl CutThroughFailures {
    /// Note that a streamed fetch of `d` just failed.
    pub(super) fn note(&self, d: Digest) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        m.retain(|_, at| now.duration_since(*at) < CUT_THROUGH_FAILED_FOR);
        if m.len() < 4096 {
            m.insert(d, now);
        }
    }

    /// Whether a streamed fetch of `d` failed within [`CUT_THROUGH_FAILED_FOR`].
    pub fn recent(&self, d: &Digest) -> bool {
        let m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        m.get(d)
            .is_some_and(|at| at.elapsed() < CUT_THROUGH_FAILED_FOR)
    }
}

/// A node agent's store.
#[derive(Debug)]
pub struct Node {
    /// The fabric connection.
    pub client: Arc<FabricClient>,
    /// The blob cache.
    pub cache: Arc<Cache>,
    /// Counters.
    pub metrics: Arc<NodeMetrics>,
    /// Transfer tuning.
    pub transfer: TransferOptions,
    /// (repository, digest) pairs the registry agent confirmed for this node.
    pub references: References,
    /// Blobs whose streamed fetch failed recently ([`super::cut_through`]).
    pub cut_through_failures: CutThroughFailures,
    flights: Arc<Flights>,
    direct: std::sync::OnceLock<(Arc<Upstream>, u64)>,
    peers: std::sync::OnceLock<Vec<Peer>>,
}

type Flights = std::sync::Mutex<HashMap<Digest, Arc<tokio::sync::Mutex<()>>>>;

/// The single flight of one blob, held by whoever fetches it and then by
/// its commit to the cache: a request for the same blob waits for both, then
/// finds it in the cache.
struct Flight {
    flights: Arc<Flights>,
    digest: Digest,
    _guard: OwnedMutexGuard<()>,
}

impl Drop for Flight {
    fn drop(&mut self) {
        // Before the guard is released (fields drop after this), as before:
        // a request from now on starts its own flight and finds the cache.
        self.flights
            .lock()
            .expect("flights lock")
            .remove(&self.digest);
    }
}

/// Who hears a blob being fetched: the verified prefix as it grows (bytes
/// written to the temp file and hashed in order, and the size), and each
/// attempt's temp file as it is made (a refetch after a mismatch is a new
/// attempt in a new file).
pub struct Watch<'a> {
    /// Verified prefix, size.
    pub prefix: &'a (dyn Fn(u64, u64) + Send + Sync),
    /// A new attempt's temp file.
    pub started: &'a (dyn Fn(&TempBlob) + Send + Sync),
}

/// A verified blob, opened for reading.
#[derive(Debug)]
pub struct Blob {
    /// The file (in the cache; unlinked by eviction but still open; or the
    /// verified temp file while [`Blob::stored`] is pending).
    pub file: File,
    /// Its size.
    pub size: u64,
    /// Where it came from for this request.
    pub path: Path,
    /// When the blob is durable in the cache: a blob fetched just now is
    /// verified whole, then served from its temp file while it is fsynced
    /// and renamed into the cache on a blocking thread.
    pub stored: Stored,
}

/// A fetched blob's commit to the cache (fsync, rename, directory fsync),
/// running behind the first requester's answer.
///
/// The verification is what makes a blob servable; the cache's crash safety
/// only needs the commit to be done before the blob is *taken from the
/// cache*, which holds as ever (the only way into `blobs/` is the rename
/// after the fsync). Waiting for the fsync before the first byte put the
/// disk's write rate in front of every pull: ~500 MB/s here, about half
/// of what the transfer reaches (benches/results/image-agents.md).
#[derive(Debug, Default)]
pub struct Stored(Option<oneshot::Receiver<Result<(), String>>>);

impl Stored {
    /// Wait for the commit: Ok once the blob is in the cache (at once for a
    /// blob that came from the cache). An error means it could not be cached;
    /// its bytes were verified all the same.
    pub async fn wait(self) -> Result<(), FetchError> {
        let Some(rx) = self.0 else { return Ok(()) };
        rx.await
            .unwrap_or_else(|_| Err("the commit task stopped".into()))
            .map_err(FetchError::Local)
    }
}

impl Node {
    /// A store fetching with `client` into `cache`.
    pub fn new(
        client: Arc<FabricClient>,
        cache: Arc<Cache>,
        metrics: Arc<NodeMetrics>,
        transfer: TransferOptions,
    ) -> Arc<Node> {
        Arc::new(Node {
            client,
            cache,
            metrics,
            transfer,
            references: References::default(),
            cut_through_failures: Default::default(),
            flights: Arc::new(std::sync::Mutex::new(HashMap::new())),
            direct: std::sync::OnceLock::new(),
            peers: std::sync::OnceLock::new(),
        })
    }

    /// Fetch blobs smaller than `threshold` bytes straight from `upstream`
    /// over HTTP instead of over the fabric (a round trip to the registry
    /// agent and its chunk machinery buys nothing for a few KiB). Set once;
    /// later calls are ignored.
    pub fn set_direct(&self, upstream: Arc<Upstream>, threshold: u64) {
        let _ = self.direct.set((upstream, threshold));
    }

    /// Ask `peers`, in order, for each blob before the registry agent. Set
    /// once; later calls are ignored.
    pub fn set_peers(&self, peers: Vec<Peer>) {
        let _ = self.peers.set(peers);
    }

    /// A manifest by tag or digest.
    pub async fn manifest(
        &self,
        repo: &str,
        reference: &Reference,
        accept: &str,
    ) -> Result<Answer, FetchError> {
        let a = self.client.manifest(repo, reference, accept).await?;
        self.metrics.objects_fabric.inc();
        self.metrics.bytes(Path::Fabric, a.body.len() as u64);
        self.note_stale(&a);
        Ok(a)
    }

    /// The tag list of `repo`, all of it, in lexical order; the answer
    /// ([`Answer::stale`] says whether the registry agent served it stale).
    pub async fn tags(&self, repo: &str) -> Result<(Vec<String>, bool), FetchError> {
        let a = self.client.tags(repo).await?;
        self.note_stale(&a);
        let v: serde_json::Value = serde_json::from_slice(&a.body)
            .map_err(|e| FetchError::Protocol(format!("tag list of {repo}: {e}")))?;
        let tags = v["tags"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t.as_str().map(str::to_string))
            .collect();
        Ok((tags, a.stale))
    }

    fn note_stale(&self, a: &Answer) {
        if a.stale {
            self.metrics.manifests_stale.inc();
        }
    }

    /// A blob's size: from the cache, else asked over the fabric.
    pub async fn blob_size(&self, repo: &str, d: &Digest) -> Result<u64, FetchError> {
        match self.cache.get(d) {
            Some((_, size)) => self.confirm(repo, d).await.map(|()| size),
            None => self.stat(repo, d).await,
        }
    }

    /// Confirm `repo` may be read and references `d`, unless already known.
    async fn confirm(&self, repo: &str, d: &Digest) -> Result<(), FetchError> {
        if !self.references.contains(repo, d) {
            self.stat(repo, d).await?;
        }
        Ok(())
    }

    /// Ask the registry agent for blob `d` under `repo` (it refuses a
    /// repository this node may not read, or one that does not reference the
    /// blob) and remember the pair.
    async fn stat(&self, repo: &str, d: &Digest) -> Result<u64, FetchError> {
        let size = self.client.stat(repo, d).await?;
        self.references.insert(repo, d);
        Ok(size)
    }

    /// Blob `d` from the cache, its bytes checked (a corrupt copy is
    /// quarantined, counted as a verify failure too, and is a miss).
    pub(crate) async fn cached(&self, d: &Digest) -> Option<(File, u64)> {
        let m = &self.metrics;
        self.cache
            .get_verified(d, &[&m.cache_corrupt, &m.verify_failures])
            .await
    }

    /// A whole verified blob; `progress` hears the verified prefix grow.
    pub async fn blob(
        &self,
        repo: &str,
        d: &Digest,
        progress: &(dyn Fn(u64, u64) + Send + Sync),
    ) -> Result<Blob, FetchError> {
        let watch = Watch {
            prefix: progress,
            started: &|_| {},
        };
        self.blob_watched(repo, d, &watch).await
    }

    /// [`Node::blob`], and `watch.started` hears each fetch attempt's temp
    /// file as it is made, so an answer can stream the verified prefix
    /// before the whole blob is (cut-through, `super::http`).
    pub async fn blob_watched(
        &self,
        repo: &str,
        d: &Digest,
        watch: &Watch<'_>,
    ) -> Result<Blob, FetchError> {
        let progress = watch;
        if let Some((file, size)) = self.cached(d).await {
            self.confirm(repo, d).await?;
            self.metrics.cache_hits.inc();
            (progress.prefix)(size, size);
            return Ok(Blob {
                file,
                size,
                path: Path::Cache,
                stored: Stored::default(),
            });
        }
        let flight = self
            .flights
            .lock()
            .expect("flights lock")
            .entry(*d)
            .or_default()
            .clone();
        let flight = Flight {
            flights: self.flights.clone(),
            digest: *d,
            _guard: flight.lock_owned().await,
        };
        // Whoever held the flight before us may have cached it (for another
        // repository, maybe).
        if let Some((file, size)) = self.cached(d).await {
            self.confirm(repo, d).await?;
            self.metrics.cache_hits.inc();
            (progress.prefix)(size, size);
            return Ok(Blob {
                file,
                size,
                path: Path::Cache,
                stored: Stored::default(),
            });
        }
        self.metrics.cache_misses.inc();
        self.fetch(repo, d, progress, flight).await
    }

    /// A blob verified whole into `temp`: returned at once, served from the
    /// temp file, while a blocking thread commits it to the cache holding
    /// `flight` (see [`Stored`]).
    fn verified(
        &self,
        temp: TempBlob,
        actual: Digest,
        path: Path,
        flight: &mut Option<Flight>,
    ) -> Result<Blob, FetchError> {
        let file = temp
            .reader()
            .map_err(|e| FetchError::Local(e.to_string()))?;
        let size = temp.size();
        let flight = flight.take();
        let (tx, rx) = oneshot::channel();
        tokio::task::spawn_blocking(move || {
            let r = temp.commit(actual).map(drop).map_err(|e| e.to_string());
            if let Err(e) = &r {
                tracing::warn!("{e} (it was served from its verified temp file)");
            }
            drop(flight);
            let _ = tx.send(r);
        });
        Ok(Blob {
            file,
            size,
            path,
            stored: Stored(Some(rx)),
        })
    }

    /// A small blob straight from the upstream: hashed as it streams into a
    /// temp file, committed only if it matches (same rule as the fabric path).
    async fn fetch_direct(
        &self,
        up: &Upstream,
        repo: &str,
        d: &Digest,
        size: u64,
        progress: &Watch<'_>,
        flight: &mut Option<Flight>,
    ) -> Result<Blob, FetchError> {
        use sha2::{Digest as _, Sha256};
        let upstream_err = |e: &dyn std::fmt::Display| FetchError::Upstream(format!("direct: {e}"));
        let mut resp = up.blob(repo, d).await.map_err(|e| upstream_err(&e))?;
        let temp = self
            .cache
            .temp(d, size)
            .map_err(|e| FetchError::Local(e.to_string()))?;
        (progress.started)(&temp);
        let (mut at, mut h) = (0u64, Sha256::new());
        while let Some(piece) = resp.chunk().await.map_err(|e| upstream_err(&e))? {
            if at + piece.len() as u64 > size {
                return Err(upstream_err(&format!("blob {d} longer than {size} bytes")));
            }
            temp.write_at(at, &piece)
                .map_err(|e| FetchError::Local(e.to_string()))?;
            h.update(&piece);
            at += piece.len() as u64;
            (progress.prefix)(at, size);
        }
        let actual = Digest::from_bytes(h.finalize().into());
        if at != size || actual != *d {
            self.metrics.verify_failures.inc();
            return Err(FetchError::DigestMismatch(format!(
                "blob {d} from the upstream ({at} of {size} bytes) is {actual}: not served"
            )));
        }
        self.metrics.objects_direct.inc();
        self.metrics.bytes(Path::Direct, size);
        self.verified(temp, actual, Path::Direct, flight)
    }

    /// The blob from the first peer that has it whole and sends it intact;
    /// `None` (after counting why) sends the caller to the registry agent.
    /// A peer's bytes pass the same checks as the registry agent's: each
    /// chunk against its header's hash, the whole blob against its digest
    /// before it is committed — a bad copy is dropped, never served or cached.
    async fn fetch_from_peers(
        &self,
        repo: &str,
        d: &Digest,
        progress: &Watch<'_>,
        flight: &mut Option<Flight>,
    ) -> Option<Blob> {
        let peers = self.peers.get()?;
        let opts = TransferOptions {
            resume: false,
            ..self.transfer.clone()
        };
        for peer in peers.iter().filter(|p| p.usable()) {
            let size = match peer.client.stat(repo, d).await {
                Ok(size) => size,
                // It does not have the blob (complete and verified): next.
                Err(FetchError::NotFound(_)) => continue,
                Err(e) => {
                    tracing::info!("peer {}: {e}; leaving it out for a while", peer.name);
                    peer.mark_down();
                    self.metrics.peer_fallbacks.inc();
                    continue;
                }
            };
            let temp = match self.cache.temp(d, size) {
                Ok(t) => t,
                Err(e) => {
                    tracing::warn!("cache temp for {d}: {e}");
                    return None;
                }
            };
            (progress.started)(&temp);
            let got = fetch_blob(
                &peer.client,
                Path::Peer,
                repo,
                d,
                &temp,
                &opts,
                &self.metrics,
                &|n| (progress.prefix)(n, size),
            )
            .await;
            match got {
                Ok(actual) if actual == *d => {
                    match self.verified(temp, actual, Path::Peer, flight) {
                        Ok(b) => {
                            self.metrics.objects_peer.inc();
                            return Some(b);
                        }
                        Err(e) => {
                            tracing::warn!("blob {d} from peer {}: {e}", peer.name);
                            return None;
                        }
                    }
                }
                Ok(actual) => {
                    // Dropping `temp` deletes it: nothing corrupt is cached.
                    self.metrics.verify_failures.inc();
                    self.metrics.peer_fallbacks.inc();
                    tracing::warn!(
                        "peer {} sent blob {d} as {actual}: dropped; asking the next peer or \
                         the registry agent",
                        peer.name
                    );
                }
                Err(e) => {
                    self.metrics.peer_fallbacks.inc();
                    if matches!(
                        e,
                        FetchError::ChunkCorrupt(_) | FetchError::DigestMismatch(_)
                    ) {
                        self.metrics.verify_failures.inc();
                    }
                    if matches!(e, FetchError::Connection(_)) {
                        peer.mark_down();
                    }
                    tracing::info!(
                        "peer {} failed on blob {d} ({e}); asking the next peer or the \
                         registry agent",
                        peer.name
                    );
                }
            }
        }
        None
    }

    async fn fetch(
        &self,
        repo: &str,
        d: &Digest,
        progress: &Watch<'_>,
        flight: Flight,
    ) -> Result<Blob, FetchError> {
        let flight = &mut Some(flight);
        // Confirmed by the registry agent before any peer is asked.
        let size = self.stat(repo, d).await?;
        if let Some(b) = self.fetch_from_peers(repo, d, progress, flight).await {
            return Ok(b);
        }
        if let Some((up, threshold)) = self.direct.get() {
            // Only for the direct upstream's own repositories: a client
            // naming another registry (`ns=`) gets it from the registry agent.
            let (ns, name) = split_scope(repo);
            if size < *threshold && ns.is_none_or(|ns| ns == up.host()) {
                return self.fetch_direct(up, name, d, size, progress, flight).await;
            }
        }
        let mut attempt = 0;
        loop {
            let temp = self
                .cache
                .temp(d, size)
                .map_err(|e| FetchError::Local(e.to_string()))?;
            (progress.started)(&temp);
            let got = fetch_blob(
                &self.client,
                Path::Fabric,
                repo,
                d,
                &temp,
                &self.transfer,
                &self.metrics,
                &|n| (progress.prefix)(n, size),
            )
            .await;
            // Dropping `temp` on any path but commit deletes it: nothing
            // corrupt is cached.
            let why = match got {
                Ok(actual) if actual == *d => {
                    self.metrics.objects_fabric.inc();
                    return self.verified(temp, actual, Path::Fabric, flight);
                }
                Ok(actual) => format!(
                    "blob {d} arrived as {actual}: the upstream copy is corrupt (re-push the \
                     image, or repair the registry's storage)"
                ),
                // Chunks damaged after the registry agent hashed them: a
                // fresh transfer may well be intact.
                Err(FetchError::ChunkCorrupt(m)) => m,
                Err(e) => {
                    // The registry agent found the upstream's bytes wrong before we did.
                    if matches!(e, FetchError::DigestMismatch(_)) {
                        self.metrics.verify_failures.inc();
                    }
                    return Err(e);
                }
            };
            self.metrics.verify_failures.inc();
            tracing::warn!("{why} (attempt {})", attempt + 1);
            if attempt >= REFETCHES {
                return Err(FetchError::DigestMismatch(format!(
                    "{why}; {} attempts",
                    attempt + 1
                )));
            }
            attempt += 1;
            self.metrics.resumes.inc();
        }
    }
}
