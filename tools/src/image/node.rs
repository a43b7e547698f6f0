//! The node agent's object store: blobs from the cache, else from a peer node
//! agent that has them, else from the registry agent over the fabric
//! (single-flight per blob, so concurrent requests for one blob share one
//! transfer), verified whole before they are cached. Requests follow a fetch
//! as it arrives ([`inflight`](super::inflight)): bytes stream out in order,
//! and a response's last byte waits for the verdict.
//!
//! The cache is keyed by digest; a blob is served under repository R only
//! once the registry agent confirmed that this node may read R and that R
//! references it ([`References`], one stat per pair, remembered) — whether the
//! bytes then come from the cache, a peer or the fabric.

use std::collections::HashMap;
use std::fs::File;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::cache::{Cache, TempBlob};
use super::client::{Answer, FabricClient, FetchError};
use super::digest::{split_scope, Digest, Reference};
use super::inflight::{Flight, Follower, OnCorrupt};
use super::metrics::{NodeMetrics, Path};
use super::peer::Peer;
use super::references::References;
use super::transfer::{fetch_blob, TransferOptions};
use super::upstream::Upstream;

/// How many times a blob whose whole digest did not match is fetched again
/// before the request fails (a corrupt upstream copy stays corrupt). A
/// response that already streamed bytes of the failed attempt is cut short
/// ([`inflight`](super::inflight)); the next request follows the refetch.
pub const REFETCHES: u32 = 1;

/// How long after a fetch of a blob failed, or gave up an attempt whose
/// bytes may have streamed, its requests wait for the whole blob's verdict
/// before their first byte: a client whose response was cut short gets the
/// node's error (502 `DIGEST_INVALID` naming the bad copy) on its retry, or
/// the blob whole, rather than another cut.
pub const CUT_THROUGH_FAILED_FOR: Duration = Duration::from_secs(60);

/// Blobs whose fetch failed, or restarted from another source, within
/// [`CUT_THROUGH_FAILED_FOR`] (bounded: no new entries past 4096 live
/// ones). Written by the node's fetch task, read by [`Node::open`].
#[derive(Debug, Default)]
pub struct CutThroughFailures(Mutex<HashMap<Digest, Instant>>);

impl CutThroughFailures {
    /// Note that a fetch of `d` just failed or gave up an attempt.
    fn note(&self, d: Digest) {
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
    /// Blobs whose fetch failed or was restarted recently: their requests
    /// wait for the verdict before their first byte.
    pub cut_through_failures: Arc<CutThroughFailures>,
    flights: Arc<Flights>,
    direct: std::sync::OnceLock<(Arc<Upstream>, u64)>,
    peers: std::sync::OnceLock<Vec<Peer>>,
}

/// The blobs being fetched: one flight each, however many ask.
type Flights = std::sync::Mutex<HashMap<Digest, Arc<Flight>>>;

/// A flight's place in [`Flights`], held by its fetch task: however the task
/// ends (a panic included), the flight leaves the map before its followers
/// hear the end, so a request after a failure starts afresh and one after
/// the commit finds the cache.
struct Ending {
    flights: Arc<Flights>,
    digest: Digest,
    flight: Arc<Flight>,
}

impl Ending {
    fn leave(&self) {
        let mut map = self.flights.lock().unwrap_or_else(|e| e.into_inner());
        if map
            .get(&self.digest)
            .is_some_and(|f| Arc::ptr_eq(f, &self.flight))
        {
            map.remove(&self.digest);
        }
    }
}

impl Drop for Ending {
    fn drop(&mut self) {
        self.leave();
        self.flight.fail(FetchError::Local(format!(
            "the fetch of blob {} stopped",
            self.digest
        )));
    }
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
/// running behind the verdict.
///
/// The verification is what makes a blob servable whole; the cache's crash
/// safety only needs the commit to be done before the blob is *taken from
/// the cache*, which holds as ever (the only way into `blobs/` is the rename
/// after the fsync). Waiting for the fsync before the first byte put the
/// disk's write rate in front of every pull: ~500 MB/s here, about half
/// of what the transfer reaches (benches/results/image-agents.md).
#[derive(Debug, Default)]
pub struct Stored(Option<Follower>);

impl Stored {
    /// Wait for the commit: Ok once the blob is in the cache (at once for a
    /// blob that came from the cache). An error means it could not be cached;
    /// its bytes were verified all the same.
    pub async fn wait(self) -> Result<(), FetchError> {
        match self.0 {
            Some(f) => f.stored().await,
            None => Ok(()),
        }
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
            cut_through_failures: Arc::default(),
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

    /// What a cache hit's whole response does with a copy found corrupt
    /// while serving it: quarantined, counted like one found on lookup, and
    /// noted as a cut, so the retry waits for the fetch's verdict before its
    /// first byte (the registry agent's copy may be rotten too: one aborted
    /// response, not two).
    fn on_corrupt(&self, d: &Digest) -> OnCorrupt {
        let (cache, m, d) = (self.cache.clone(), self.metrics.clone(), *d);
        let cuts = self.cut_through_failures.clone();
        Arc::new(move |file, actual| {
            cuts.note(d);
            cache.reject(
                &d,
                file,
                &actual.to_string(),
                &[&m.cache_corrupt, &m.verify_failures],
                "found while serving",
            )
        })
    }

    /// Blob `d` under `repo` to read as it arrives: the verified cache copy,
    /// else the flight fetching it (joined, or started here). Errors known
    /// before any byte (the repository does not reference the blob, no such
    /// blob, the registry agent unreachable) are returned here; a follower
    /// reports the fetch's own failure. A follower of a blob whose fetch
    /// failed or restarted within [`CUT_THROUGH_FAILED_FOR`] waits for the
    /// verdict before its first byte ([`Follower::after_verdict`]).
    pub async fn open(self: &Arc<Self>, repo: &str, d: &Digest) -> Result<Follower, FetchError> {
        let f = self.open_any(repo, d).await?;
        Ok(if self.cut_through_failures.recent(d) {
            f.after_verdict()
        } else {
            f
        })
    }

    async fn open_any(self: &Arc<Self>, repo: &str, d: &Digest) -> Result<Follower, FetchError> {
        // A blob committed between the cache lookup and the flights' lock
        // is looked up again (at most this often: each time, someone else's
        // flight ended, and a copy that fails its check is quarantined).
        let mut lookups = 0;
        loop {
            lookups += 1;
            if let Some((file, size)) = self.cached(d).await {
                self.confirm(repo, d).await?;
                self.metrics.cache_hits.inc();
                return Ok(Follower::cached(*d, file, size, self.on_corrupt(d)));
            }
            if let Some(f) = self.joinable(d) {
                self.metrics.cache_misses.inc();
                // Confirmed for this repository before it reads a byte:
                // the flight may have been started under another.
                self.confirm(repo, d).await?;
                self.metrics.flight_joins.inc();
                return Ok(f.follow());
            }
            // The size, and the registry agent's word that `repo` references
            // the blob, before a flight exists: a flight's failures are the
            // blob's, never one requester's (denied, not referenced).
            let size = match self.stat(repo, d).await {
                Ok(size) => size,
                Err(e) => {
                    self.metrics.cache_misses.inc();
                    return Err(e);
                }
            };
            let flight = {
                let mut map = self.flights.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(f) = map.get(d) {
                    Err(f.clone())
                } else if lookups < 4 && self.cache.contains(d) {
                    continue;
                } else {
                    let f = Flight::new(*d, size);
                    map.insert(*d, f.clone());
                    Ok(f)
                }
            };
            self.metrics.cache_misses.inc();
            return Ok(match flight {
                Err(theirs) => {
                    self.metrics.flight_joins.inc();
                    theirs.follow()
                }
                Ok(ours) => {
                    let follower = ours.follow();
                    self.start(repo, d, ours);
                    follower
                }
            });
        }
    }

    /// The flight fetching `d`, if one is.
    fn joinable(&self, d: &Digest) -> Option<Arc<Flight>> {
        let map = self.flights.lock().unwrap_or_else(|e| e.into_inner());
        map.get(d).cloned()
    }

    /// Run `flight`'s fetch in a task of its own: it goes on (and caches the
    /// blob) whatever becomes of the requests that follow it.
    fn start(self: &Arc<Self>, repo: &str, d: &Digest, flight: Arc<Flight>) {
        let ending = Ending {
            flights: self.flights.clone(),
            digest: *d,
            flight,
        };
        let (node, repo, d) = (self.clone(), repo.to_string(), *d);
        tokio::spawn(async move {
            let flight = &ending.flight;
            match node.fetch(&repo, &d, flight).await {
                Ok((temp, actual)) => {
                    flight.verified();
                    let r = match tokio::task::spawn_blocking(move || temp.commit(actual)).await {
                        Ok(Ok(_)) => Ok(()),
                        Ok(Err(e)) => Err(e.to_string()),
                        Err(e) => Err(format!("committing blob {d}: {e}")),
                    };
                    if let Err(e) = &r {
                        tracing::warn!("{e} (it was served from its verified temp file)");
                    }
                    // In the cache (or not) before the flight leaves the map.
                    ending.leave();
                    flight.stored(r);
                }
                Err(e) => {
                    // Before anyone hears of it: a retry must find it noted.
                    node.cut_through_failures.note(d);
                    ending.leave();
                    flight.fail(e);
                }
            }
        });
    }

    /// A whole verified blob; `progress` hears the prefix grow.
    pub async fn blob(
        self: &Arc<Self>,
        repo: &str,
        d: &Digest,
        progress: &(dyn Fn(u64, u64) + Send + Sync),
    ) -> Result<Blob, FetchError> {
        let (a, commit) = self.open(repo, d).await?.verified(progress).await?;
        let file = a
            .file
            .try_clone()
            .map_err(|e| FetchError::Local(format!("blob {d}: {e}")))?;
        Ok(Blob {
            file,
            size: a.size,
            path: a.path,
            stored: if a.path == Path::Cache {
                Stored::default()
            } else {
                Stored(Some(commit))
            },
        })
    }

    /// A new temp file for `d` and an attempt of `flight` reading it. A
    /// second attempt cuts the responses reading the first: noted, so that
    /// their retries wait for the verdict.
    fn attempt(
        &self,
        d: &Digest,
        size: u64,
        path: Path,
        flight: &Arc<Flight>,
    ) -> Result<(TempBlob, super::inflight::Feed), FetchError> {
        let temp = self
            .cache
            .temp(d, size)
            .map_err(|e| FetchError::Local(e.to_string()))?;
        let reader = temp
            .reader()
            .map_err(|e| FetchError::Local(e.to_string()))?;
        if flight.attempts() > 0 {
            self.cut_through_failures.note(*d);
        }
        let feed = flight.attempt(path, reader);
        Ok((temp, feed))
    }

    /// A small blob straight from the upstream: hashed as it streams into a
    /// temp file, committed only if it matches (same rule as the fabric path).
    async fn fetch_direct(
        &self,
        up: &Upstream,
        repo: &str,
        d: &Digest,
        size: u64,
        flight: &Arc<Flight>,
    ) -> Result<(TempBlob, Digest), FetchError> {
        use sha2::{Digest as _, Sha256};
        let upstream_err = |e: &dyn std::fmt::Display| FetchError::Upstream(format!("direct: {e}"));
        let mut resp = up.blob(repo, d).await.map_err(|e| upstream_err(&e))?;
        let (temp, feed) = self.attempt(d, size, Path::Direct, flight)?;
        let (mut at, mut h) = (0u64, Sha256::new());
        while let Some(piece) = resp.chunk().await.map_err(|e| upstream_err(&e))? {
            if at + piece.len() as u64 > size {
                return Err(upstream_err(&format!("blob {d} longer than {size} bytes")));
            }
            temp.write_at(at, &piece)
                .map_err(|e| FetchError::Local(e.to_string()))?;
            h.update(&piece);
            at += piece.len() as u64;
            feed.prefix(at);
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
        Ok((temp, actual))
    }

    /// The blob from the first peer that has it whole and sends it intact;
    /// `None` (after counting why) sends the caller to the registry agent.
    /// A peer's bytes pass the same checks as the registry agent's: each
    /// chunk against its header's hash, the whole blob against its digest
    /// before it is committed — a bad copy is dropped, never cached, and a
    /// response streaming it is cut short.
    async fn fetch_from_peers(
        &self,
        repo: &str,
        d: &Digest,
        flight: &Arc<Flight>,
    ) -> Option<(TempBlob, Digest)> {
        let peers = self.peers.get()?;
        let opts = TransferOptions {
            resume: false,
            ..self.transfer.clone()
        };
        for peer in peers.iter().filter(|p| p.usable()) {
            let size = match peer.client.stat(repo, d).await {
                Ok(size) if size == flight.size() => size,
                Ok(size) => {
                    tracing::warn!(
                        "peer {} has blob {d} as {size} bytes, the registry agent {}: skipped",
                        peer.name,
                        flight.size()
                    );
                    self.metrics.peer_fallbacks.inc();
                    continue;
                }
                // It does not have the blob (complete and verified): next.
                Err(FetchError::NotFound(_)) => continue,
                Err(e) => {
                    tracing::info!("peer {}: {e}; leaving it out for a while", peer.name);
                    peer.mark_down();
                    self.metrics.peer_fallbacks.inc();
                    continue;
                }
            };
            let (temp, feed) = match self.attempt(d, size, Path::Peer, flight) {
                Ok(t) => t,
                Err(e) => {
                    tracing::warn!("cache temp for {d}: {e}");
                    return None;
                }
            };
            let got = fetch_blob(
                &peer.client,
                Path::Peer,
                repo,
                d,
                &temp,
                &opts,
                &self.metrics,
                feed,
            )
            .await;
            match got {
                Ok(actual) if actual == *d => {
                    self.metrics.objects_peer.inc();
                    return Some((temp, actual));
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

    /// Fetch `flight`'s blob: from a peer, straight from the upstream if it
    /// is small, else from the registry agent (again after a mismatch, up to
    /// [`REFETCHES`] times). Each try is an attempt of `flight`, streamed to
    /// its followers as it arrives; what is returned hashed to `d` and is
    /// the caller's to commit.
    async fn fetch(
        &self,
        repo: &str,
        d: &Digest,
        flight: &Arc<Flight>,
    ) -> Result<(TempBlob, Digest), FetchError> {
        let size = flight.size();
        // Confirmed by the registry agent (in `open`) before any peer is asked.
        if let Some(b) = self.fetch_from_peers(repo, d, flight).await {
            return Ok(b);
        }
        if let Some((up, threshold)) = self.direct.get() {
            // Only for the direct upstream's own repositories: a client
            // naming another registry (`ns=`) gets it from the registry agent.
            let (ns, name) = split_scope(repo);
            if size < *threshold && ns.is_none_or(|ns| ns == up.host()) {
                return self.fetch_direct(up, name, d, size, flight).await;
            }
        }
        let mut attempt = 0;
        loop {
            let (temp, feed) = self.attempt(d, size, Path::Fabric, flight)?;
            let got = fetch_blob(
                &self.client,
                Path::Fabric,
                repo,
                d,
                &temp,
                &self.transfer,
                &self.metrics,
                feed,
            )
            .await;
            // Dropping `temp` on any path but commit deletes it: nothing
            // corrupt is cached.
            let why = match got {
                Ok(actual) if actual == *d => {
                    self.metrics.objects_fabric.inc();
                    return Ok((temp, actual));
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
            // The registry agent's cached copy may have rotted since it was
            // checked: have it check again before the next attempt. An agent
            // that cannot (an older one) refuses; the attempt goes on.
            if let Err(e) = self.client.recheck(repo, d).await {
                tracing::debug!("asking the registry agent to recheck {d}: {e}");
            }
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
