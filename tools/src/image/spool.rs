//! The registry agent's blob store: single-flight pull-through. The first
//! request for a blob starts one upstream read into a cache temp file; every
//! request for that blob — from any node agent, for any range — waits only
//! until its range has arrived and is served from the file. So N nodes asking
//! for one blob at once read it once upstream. The download is hashed as it
//! arrives and committed to the cache only if it matches; on a mismatch the
//! waiters get [`SourceError::DigestMismatch`] and the next request starts afresh.
//!
//! The cache is keyed by digest, but a blob is served under repository R only
//! once the source confirmed that R references it ([`References`]): a blob
//! cached for one repository is not readable under another's name.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use sha2::{Digest as _, Sha256};
use tokio::sync::watch;

use super::cache::{Cache, CacheError};
use super::digest::{Digest, Reference};
use super::manifests::{descriptors, unix_now, Manifest, ManifestCache, Want};
use super::metrics::RegistryMetrics;
use super::references::References;
use super::source::Source;
use super::source_error::SourceError;

#[derive(Clone, Debug)]
enum State {
    /// Bytes `0..n` are in the file.
    Progress(u64),
    /// All there, verified and cached.
    Done,
    /// The download failed.
    Failed(SourceError),
}

#[derive(Debug)]
struct Download {
    file: File,
    size: u64,
    state: watch::Receiver<State>,
    /// The requesters (connections) reading it, so a node that joins is
    /// counted once per blob, not once per chunk request.
    requesters: std::sync::Mutex<std::collections::HashSet<u64>>,
}

impl Download {
    fn new(file: File, size: u64, state: watch::Receiver<State>) -> Download {
        Download {
            file,
            size,
            state,
            requesters: std::sync::Mutex::default(),
        }
    }

    /// Note `requester` as a reader; `true` the first time (bounded: past
    /// 4 096 readers, later ones are not told apart).
    fn first_read_by(&self, requester: u64) -> bool {
        let mut r = self.requesters.lock().unwrap_or_else(|e| e.into_inner());
        r.len() < 4096 && r.insert(requester)
    }
}

/// The single-flight blob store.
#[derive(Debug)]
pub struct Spool {
    source: Arc<Source>,
    cache: Arc<Cache>,
    metrics: Arc<RegistryMetrics>,
    inflight: tokio::sync::Mutex<HashMap<Digest, Arc<Download>>>,
    references: References,
    manifests: Option<ManifestCache>,
}

fn cache_err(e: CacheError) -> SourceError {
    SourceError::Io(e.to_string())
}

impl Spool {
    /// A store over `source`, keeping verified blobs in `cache`.
    pub fn new(source: Arc<Source>, cache: Arc<Cache>, metrics: Arc<RegistryMetrics>) -> Spool {
        Spool {
            source,
            cache,
            metrics,
            inflight: tokio::sync::Mutex::new(HashMap::new()),
            references: References::default(),
            manifests: None,
        }
    }

    /// Keep manifests and tag lists in `cache`, and serve them from it while
    /// the upstream cannot be reached ([`super::manifests`]).
    pub fn with_manifests(mut self, cache: ManifestCache) -> Spool {
        self.manifests = Some(cache);
        self
    }

    /// A manifest or index by tag or digest, and whether it is served stale.
    /// The blobs it references are noted as referenced by `repo`, so they
    /// are served without asking the upstream again (which may be down).
    pub async fn manifest(
        &self,
        repo: &str,
        reference: &Reference,
        accept: &str,
    ) -> Result<(Manifest, bool), SourceError> {
        let mc = self.manifests.as_ref();
        let fetch = async {
            let (body, media_type, digest) = self.source.manifest(repo, reference, accept).await?;
            Ok(Manifest {
                body,
                media_type,
                digest,
            })
        };
        let got = self
            .through(
                |want, now| mc?.get(repo, reference, accept, want, now),
                fetch,
                |m, now| mc.map_or((), |mc| mc.store(repo, reference, m, now)),
            )
            .await;
        if let (Err(SourceError::NotFound(_)), Reference::Tag(t), Some(mc)) = (&got, reference, mc)
        {
            mc.forget_tag(repo, t);
        }
        let (m, stale) = got?;
        for (d, _) in descriptors(&m.body) {
            self.references.insert(repo, &d);
        }
        Ok((m, stale))
    }

    /// Every tag of `repo` in lexical order, and whether served stale.
    pub async fn tags(&self, repo: &str) -> Result<(Vec<String>, bool), SourceError> {
        let mc = self.manifests.as_ref();
        self.through(
            |want, now| mc?.tags(repo, want, now),
            self.source.tags(repo),
            |t, now| mc.map_or((), |mc| mc.store_tags(repo, t, now)),
        )
        .await
    }

    /// The manifest cache's rule, one piece of code for manifests and tag
    /// lists: a fresh cached answer, else the upstream's (kept), else — the
    /// upstream unreachable — a stale cached one.
    async fn through<T>(
        &self,
        cached: impl Fn(Want, u64) -> Option<T>,
        fetch: impl std::future::Future<Output = Result<T, SourceError>>,
        store: impl FnOnce(&T, u64),
    ) -> Result<(T, bool), SourceError> {
        let now = unix_now();
        if let Some(v) = cached(Want::Fresh, now) {
            self.metrics.manifest_cache_hits.inc();
            return Ok((v, false));
        }
        self.metrics.upstream_manifests.inc();
        match fetch.await {
            Ok(v) => {
                store(&v, now);
                Ok((v, false))
            }
            Err(e @ SourceError::Unreachable(_)) => match cached(Want::Stale, unix_now()) {
                Some(v) => {
                    self.metrics.manifests_stale.inc();
                    tracing::warn!("{e}; serving the cached answer, stale");
                    Ok((v, true))
                }
                None => Err(e),
            },
            Err(e) => Err(e),
        }
    }

    /// Confirm (once, then remembered) that `repo` references `d`.
    async fn confirm(&self, repo: &str, d: &Digest) -> Result<(), SourceError> {
        if self.references.contains(repo, d) {
            return Ok(());
        }
        self.source.confirm_reference(repo, d).await?;
        self.references.insert(repo, d);
        Ok(())
    }

    /// The source.
    pub fn source(&self) -> &Source {
        &self.source
    }

    /// A node found blob `d` as served not matching its digest: check the
    /// cached copy again (a rotten one is quarantined, counted and logged,
    /// and the next read fetches the blob afresh).
    pub async fn recheck(&self, repo: &str, d: &Digest) {
        if self.confirm(repo, d).await.is_ok() {
            self.cache.recheck(d, &[&self.metrics.cache_corrupt]).await;
        }
    }

    /// A blob's size, without starting a download.
    pub async fn size(&self, repo: &str, d: &Digest) -> Result<u64, SourceError> {
        self.confirm(repo, d).await?;
        if let Some((_, size)) = self.cache.get(d) {
            return Ok(size);
        }
        if let Some(dl) = self.inflight.lock().await.get(d) {
            return Ok(dl.size);
        }
        self.source.blob_size(repo, d).await
    }

    /// Bytes `offset..offset+len` of blob `d`. `len` is cut at the end of
    /// the blob; an `offset` past it is [`SourceError::NotFound`] only if the
    /// blob is unknown, else `Ok(None)`.
    ///
    /// `requester` tells readers apart (a connection's id): a blob download
    /// another requester started counts as one single-flight join per
    /// requester, however many chunks it reads.
    pub async fn read(
        self: &Arc<Self>,
        repo: &str,
        d: &Digest,
        offset: u64,
        len: u64,
        requester: u64,
    ) -> Result<Option<Piece>, SourceError> {
        self.confirm(repo, d).await?;
        if let Some((f, size)) = self
            .cache
            .get_verified(d, &[&self.metrics.cache_corrupt])
            .await
        {
            return read_range(&f, size, offset, len).await;
        }
        let dl = self.download(repo, d, requester).await?;
        let end = offset.saturating_add(len).min(dl.size);
        let mut state = dl.state.clone();
        loop {
            let s = state.borrow_and_update().clone();
            match s {
                State::Progress(n) if n >= end => break,
                State::Progress(_) => {}
                State::Done => break,
                State::Failed(e) => return Err(e),
            }
            if state.changed().await.is_err() {
                // The download task ended without a final state: it panicked.
                return Err(SourceError::Io("the blob download stopped".into()));
            }
        }
        read_range(&dl.file, dl.size, offset, len).await
    }

    /// The download of `d`, joined or started.
    async fn download(
        self: &Arc<Self>,
        repo: &str,
        d: &Digest,
        requester: u64,
    ) -> Result<Arc<Download>, SourceError> {
        // The map's lock is held across opening the upstream, so two first
        // requests cannot both open it (the upstream would serve the blob twice).
        let mut map = self.inflight.lock().await;
        if let Some(dl) = map.get(d) {
            if dl.first_read_by(requester) {
                self.metrics.single_flight_joins.inc();
            }
            return Ok(dl.clone());
        }
        // It may have completed while we waited for the lock.
        if let Some((f, size)) = self
            .cache
            .get_verified(d, &[&self.metrics.cache_corrupt])
            .await
        {
            let (_tx, rx) = watch::channel(State::Done);
            return Ok(Arc::new(Download::new(f, size, rx)));
        }
        let (reader, size) = self.source.blob(repo, d).await?;
        let temp = self.cache.temp(d, size).map_err(cache_err)?;
        let file = File::open(temp.path()).map_err(|e| SourceError::Io(e.to_string()))?;
        let (tx, rx) = watch::channel(State::Progress(0));
        let dl = Arc::new(Download::new(file, size, rx));
        dl.first_read_by(requester);
        map.insert(*d, dl.clone());
        drop(map);
        self.metrics.upstream_blob_fetches.inc();
        let this = self.clone();
        let d = *d;
        tokio::spawn(async move {
            let outcome = fill(reader, &temp, size, &tx, &this.metrics).await;
            let final_state = match outcome {
                // The fsync of the whole blob, on a blocking thread: on a
                // runtime worker it stalled the serving of the last chunks.
                Ok(actual) if actual == d => {
                    match tokio::task::spawn_blocking(move || temp.commit(actual)).await {
                        Ok(Ok(_)) => State::Done,
                        Ok(Err(e)) => State::Failed(cache_err(e)),
                        Err(e) => State::Failed(SourceError::Io(format!("committing: {e}"))),
                    }
                }
                // The temporary file goes before anyone hears of the failure,
                // so a client that saw the error finds nothing left behind.
                Ok(actual) => {
                    drop(temp);
                    this.metrics.upstream_verify_failures.inc();
                    tracing::warn!("upstream blob {d} hashes to {actual}: not served, not cached");
                    State::Failed(SourceError::DigestMismatch {
                        expected: d,
                        actual,
                    })
                }
                Err(e) => {
                    drop(temp);
                    State::Failed(e)
                }
            };
            // Leave the map first: a request after a failure starts afresh,
            // one after success finds the blob in the cache.
            this.inflight.lock().await.remove(&d);
            let _ = tx.send(final_state);
        });
        Ok(dl)
    }
}

async fn fill(
    mut reader: super::source::BlobReader,
    temp: &super::cache::TempBlob,
    size: u64,
    tx: &watch::Sender<State>,
    metrics: &RegistryMetrics,
) -> Result<Digest, SourceError> {
    let mut hasher = Sha256::new();
    let mut at = 0u64;
    while let Some(piece) = reader.next().await? {
        if at + piece.len() as u64 > size {
            return Err(SourceError::Upstream(format!(
                "blob longer than its Content-Length {size}"
            )));
        }
        hasher.update(&piece);
        // No `fdatasync` every 64 MiB: it stalled this download (and every
        // node waiting on it) at the disk's write rate. The blob is made
        // durable once, when it is committed after it matched its digest;
        // the chunks are served from the page cache as they arrive.
        temp.write_at(at, &piece).map_err(cache_err)?;
        at += piece.len() as u64;
        metrics.upstream_bytes.add(piece.len() as u64);
        let _ = tx.send(State::Progress(at));
    }
    if at != size {
        return Err(SourceError::Upstream(format!(
            "blob ended at {at} of {size} bytes"
        )));
    }
    Ok(Digest::from_bytes(hasher.finalize().into()))
}

/// A range of a blob, read from a store.
#[derive(Debug)]
pub struct Piece {
    /// The bytes.
    pub data: Vec<u8>,
    /// The whole blob's size.
    pub size: u64,
}

/// Bytes `offset..offset+len` of an open blob file of `size` bytes (cut at
/// its end); `None` if `offset` lies past the end.
pub(super) async fn read_range(
    f: &File,
    size: u64,
    offset: u64,
    len: u64,
) -> Result<Option<Piece>, SourceError> {
    if offset > size || (offset == size && len > 0) {
        return Ok(None);
    }
    let n = len.min(size - offset) as usize;
    let f = f.try_clone().map_err(|e| SourceError::Io(e.to_string()))?;
    tokio::task::spawn_blocking(move || {
        let mut buf = vec![0u8; n];
        f.read_exact_at(&mut buf, offset)
            .map(|()| Some(Piece { data: buf, size }))
            .map_err(|e| SourceError::Io(e.to_string()))
    })
    .await
    .map_err(|e| SourceError::Io(e.to_string()))?
}
