//! The content-addressed blob cache: `DIR/blobs/sha256/<hex>` holds only
//! verified blobs, bounded in total size with least-recently-used eviction.
//!
//! Crash safety: a blob is written to `DIR/tmp/`, fsynced, renamed into
//! `blobs/` (atomic within one file system) and the directory fsynced. A
//! crash leaves at most a temp file, which the next [`Cache::open`] deletes:
//! nothing partial is ever taken as complete, because the only way into
//! `blobs/` is the rename after the digest matched.
//!
//! Integrity at rest: a file can still rot or be altered after its commit.
//! A blob this process did not write itself is hashed again before it is
//! first served ([`Cache::get_verified`]); a copy that no longer matches its
//! name is moved to `DIR/quarantine/` (kept for the operator, never served)
//! and the caller fetches the blob afresh — a corrupt copy is served zero
//! times, not once per retry. A copy that rots after that check is found by
//! the scrub ([`Cache::scrub`]): every blob hashed again, at a bounded rate,
//! pass after pass.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, IoSlice};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::digest::Digest;
use quic_rdma::counters::{Counters, Metric};

use crate::metric::{Counter, Text};

/// Why the cache failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CacheError {
    /// A file system operation failed.
    #[error("cache {what} {path}: {source} (check the --cache-dir's permissions and free space)")]
    Io {
        /// What was being done.
        what: &'static str,
        /// On which path.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// The bytes written do not hash to the digest they were stored for.
    #[error("blob {expected} hashed to {actual}: not cached")]
    Mismatch {
        /// The digest asked for.
        expected: Digest,
        /// What the bytes hash to.
        actual: Digest,
    },
}

/// How long the scrub rests between passes over the cache.
pub const SCRUB_PAUSE: std::time::Duration = std::time::Duration::from_secs(60);

/// The sha256 of a whole file, read in 1 MiB pieces at most `rate` bytes a
/// second if given (sleeping the blocking thread between pieces), and the
/// bytes read.
fn hash_file_paced(f: &File, rate: Option<u64>) -> io::Result<(Digest, u64)> {
    crate::file_sha256::sha256_file(f, rate).map(|(d, n)| (Digest::from_bytes(d), n))
}

/// The sha256 of a whole file, as fast as it reads.
fn hash_file(f: &File) -> io::Result<Digest> {
    hash_file_paced(f, None).map(|(d, _)| d)
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> CacheError + 'a {
    move |source| CacheError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

#[derive(Debug)]
struct Entry {
    size: u64,
    last_use: u64,
    /// Hashed by this process (written here, or checked since it started).
    verified: bool,
}

#[derive(Debug, Default)]
struct Index {
    entries: HashMap<Digest, Entry>,
    total: u64,
    clock: u64,
}

/// The blob cache of one agent.
#[derive(Debug)]
pub struct Cache {
    dir: PathBuf,
    max_bytes: u64,
    index: Mutex<Index>,
    /// Held while a copy is hashed again ([`Cache::get_verified`]).
    verifying: tokio::sync::Mutex<()>,
    evictions: AtomicU64,
    temp_seq: AtomicU64,
}

impl Cache {
    /// Open (creating) the cache in `dir`, bounded to `max_bytes`: index the
    /// blobs there, delete temp files a crash left behind.
    pub fn open(dir: &Path, max_bytes: u64) -> Result<Arc<Cache>, CacheError> {
        let blobs = dir.join("blobs/sha256");
        let tmp = dir.join("tmp");
        fs::create_dir_all(&blobs).map_err(io_err("creating", &blobs))?;
        if tmp.exists() {
            fs::remove_dir_all(&tmp).map_err(io_err("clearing", &tmp))?;
        }
        fs::create_dir_all(&tmp).map_err(io_err("creating", &tmp))?;
        let mut index = Index::default();
        for e in fs::read_dir(&blobs).map_err(io_err("listing", &blobs))? {
            let e = e.map_err(io_err("listing", &blobs))?;
            let name = e.file_name();
            let Some(d) = name
                .to_str()
                .and_then(|h| format!("sha256:{h}").parse::<Digest>().ok())
            else {
                continue;
            };
            let size = e.metadata().map_err(io_err("reading", &e.path()))?.len();
            index.clock += 1;
            index.entries.insert(
                d,
                Entry {
                    size,
                    last_use: index.clock,
                    verified: false,
                },
            );
            index.total += size;
        }
        let cache = Arc::new(Cache {
            dir: dir.to_path_buf(),
            max_bytes,
            index: Mutex::new(index),
            verifying: tokio::sync::Mutex::new(()),
            evictions: AtomicU64::new(0),
            temp_seq: AtomicU64::new(0),
        });
        cache.evict(None);
        Ok(cache)
    }

    fn blob_path(&self, d: &Digest) -> PathBuf {
        self.dir.join("blobs/sha256").join(d.hex())
    }

    /// The blob, opened, its bytes checked against its digest unless this
    /// process already did (hashing on a blocking thread), and its size. A
    /// copy that does not match (or cannot be read) is quarantined, logged
    /// with both paths and counted in each of `corrupt`, and is a miss: the
    /// caller fetches the blob afresh (see the [module docs](self)).
    pub async fn get_verified(
        self: &Arc<Self>,
        d: &Digest,
        corrupt: &[&Counter],
    ) -> Option<(File, u64)> {
        let hit = self.get(d)?;
        if self.is_verified(d) {
            return Some(hit);
        }
        // One check at a time: parallel chunk requests for one blob hash it
        // once. Opened again under the lock: another check may have moved
        // the copy aside, and a fresh one been committed, meanwhile.
        let _one = self.verifying.lock().await;
        let (file, size) = self.get(d)?;
        if self.is_verified(d) {
            return Some((file, size));
        }
        let d = *d;
        let checked = tokio::task::spawn_blocking(move || hash_file(&file).map(|a| (file, a)))
            .await
            .unwrap_or_else(|e| Err(io::Error::other(e)));
        let actual = match checked {
            Ok((file, actual)) if actual == d => {
                self.set_verified(&d);
                return Some((file, size));
            }
            Ok((_, actual)) => actual.to_string(),
            Err(e) => format!("unreadable ({e})"),
        };
        self.move_aside(&d, &actual, corrupt, "found on lookup");
        None
    }

    /// Check the copy of `d` against its digest again, even if this process
    /// did before (a reader found it wrong as served: it may have rotted
    /// since): as [`Self::get_verified`], whether an intact copy is held.
    pub async fn recheck(self: &Arc<Self>, d: &Digest, corrupt: &[&Counter]) -> bool {
        self.set_unverified(d);
        self.get_verified(d, corrupt).await.is_some()
    }

    /// Quarantine the corrupt copy of `d` whose bytes are `actual`; if it was
    /// still in the cache, count it in each of `corrupt` and say so (`how`:
    /// who found it). The one way both [`Self::get_verified`] and the scrub
    /// report a corrupt copy.
    fn move_aside(&self, d: &Digest, actual: &str, corrupt: &[&Counter], how: &str) {
        let from = self.blob_path(d);
        let Some(to) = self.quarantine(d) else {
            return;
        };
        for c in corrupt {
            c.inc();
        }
        tracing::warn!(
            "cache copy {} of blob {d} is corrupt ({how}): its bytes hash to {actual}; \
             moved to {}; the blob is fetched again",
            from.display(),
            to.display()
        );
    }

    /// Scrub forever: [`Self::scrub_pass`] at `rate` bytes a second, then a
    /// pause of [`SCRUB_PAUSE`], again and again. Corrupt copies are counted
    /// in each of `corrupt(&metrics)`, bytes read in `scrubbed(&metrics)`.
    pub async fn scrub<M: Send + Sync + 'static>(
        self: Arc<Self>,
        rate: u64,
        metrics: Arc<M>,
        corrupt: fn(&M) -> Vec<&Counter>,
        scrubbed: fn(&M) -> &Counter,
    ) {
        loop {
            self.scrub_pass(rate, &corrupt(&metrics), scrubbed(&metrics))
                .await;
            tokio::time::sleep(SCRUB_PAUSE).await;
        }
    }

    /// Hash every blob in the cache again (verified or not), reading at most
    /// `rate` bytes a second; a copy that no longer matches its digest is
    /// quarantined, logged and counted like one [`Self::get_verified`] finds.
    /// Blobs evicted or replaced meanwhile are skipped.
    pub async fn scrub_pass(self: &Arc<Self>, rate: u64, corrupt: &[&Counter], scrubbed: &Counter) {
        let digests: Vec<Digest> = {
            let idx = self.index.lock().expect("cache index lock");
            idx.entries.keys().copied().collect()
        };
        let rate = rate.max(1);
        for d in digests {
            let Some((file, _)) = self.get(&d) else {
                continue;
            };
            let checked = tokio::task::spawn_blocking(move || {
                hash_file_paced(&file, Some(rate)).map(|(a, n)| (file, a, n))
            })
            .await
            .unwrap_or_else(|e| Err(io::Error::other(e)));
            let (file, actual) = match checked {
                Ok((file, actual, n)) => {
                    scrubbed.add(n);
                    (file, actual)
                }
                // Gone meanwhile, or unreadable: the next lookup checks it.
                Err(_) => continue,
            };
            if actual != d {
                self.reject(
                    &d,
                    &file,
                    &actual.to_string(),
                    corrupt,
                    "found by the scrub",
                );
            }
        }
    }

    /// The copy of `d` read from `file` hashed to `actual`: if `file` is
    /// still the cache's copy, quarantine, log and count it in each of
    /// `corrupt` as [`Self::get_verified`] does (`how`: who found it).
    pub fn reject(&self, d: &Digest, file: &File, actual: &str, corrupt: &[&Counter], how: &str) {
        if !self.still_holds(d, file) {
            return;
        }
        // Verified once, rotted since: take it out whatever its flag says.
        self.set_unverified(d);
        self.move_aside(d, actual, corrupt, how);
    }

    /// Whether `file` is still the cache's copy of `d` (not replaced by a
    /// fresh commit since it was opened).
    fn still_holds(&self, d: &Digest, file: &File) -> bool {
        use std::os::unix::fs::MetadataExt;
        match (file.metadata(), fs::metadata(self.blob_path(d))) {
            (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
            _ => false,
        }
    }

    fn set_unverified(&self, d: &Digest) {
        let mut idx = self.index.lock().expect("cache index lock");
        if let Some(e) = idx.entries.get_mut(d) {
            e.verified = false;
        }
    }

    fn is_verified(&self, d: &Digest) -> bool {
        let idx = self.index.lock().expect("cache index lock");
        idx.entries.get(d).is_some_and(|e| e.verified)
    }

    fn set_verified(&self, d: &Digest) {
        let mut idx = self.index.lock().expect("cache index lock");
        if let Some(e) = idx.entries.get_mut(d) {
            e.verified = true;
        }
    }

    /// Take blob `d` out of the cache: its file moves to `DIR/quarantine/`.
    /// Returns where it went (or would have: if the move fails it is
    /// deleted); `None` if no unverified copy is in the cache any more.
    fn quarantine(&self, d: &Digest) -> Option<PathBuf> {
        {
            let mut idx = self.index.lock().expect("cache index lock");
            if idx.entries.get(d)?.verified {
                return None;
            }
            let e = idx.entries.remove(d)?;
            idx.total -= e.size;
        }
        let dir = self.dir.join("quarantine");
        let to = dir.join(d.hex());
        let from = self.blob_path(d);
        let moved = fs::create_dir_all(&dir).and_then(|()| fs::rename(&from, &to));
        if let Err(e) = moved {
            tracing::warn!(
                "moving {} to {}: {e}; deleting it",
                from.display(),
                to.display()
            );
            let _ = fs::remove_file(&from);
        }
        Some(to)
    }

    /// The blob, opened, and its size (as stored: not hashed again; for
    /// sizes, and for readers that verify themselves); marks it recently used.
    pub fn get(&self, d: &Digest) -> Option<(File, u64)> {
        {
            let mut idx = self.index.lock().expect("cache index lock");
            idx.clock += 1;
            let clock = idx.clock;
            idx.entries.get_mut(d)?.last_use = clock;
        }
        let f = File::open(self.blob_path(d)).ok()?;
        let size = f.metadata().ok()?.len();
        Some((f, size))
    }

    /// Whether the blob is cached (does not count as a use).
    pub fn contains(&self, d: &Digest) -> bool {
        self.index
            .lock()
            .expect("cache index lock")
            .entries
            .contains_key(d)
    }

    /// A new temp file for blob `d` of `size` bytes.
    pub fn temp(self: &Arc<Self>, d: &Digest, size: u64) -> Result<TempBlob, CacheError> {
        let n = self.temp_seq.fetch_add(1, Ordering::Relaxed);
        let path = self
            .dir
            .join("tmp")
            .join(format!("{}.{}.{n}", d.hex(), std::process::id()));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(io_err("creating", &path))?;
        file.set_len(size).map_err(io_err("sizing", &path))?;
        Ok(TempBlob {
            cache: self.clone(),
            path,
            file,
            digest: *d,
            size,
            committed: false,
        })
    }

    /// The cache's size, bound, blob count and evictions as Prometheus text,
    /// each name prefixed `prefix` (`qr_node` or `qr_registry`): generated
    /// from its visitor.
    pub fn prometheus(&self, prefix: &str, o: &mut String) {
        o.push_str(&Text::default().visited(prefix, self).render());
    }

    /// Blobs evicted since the cache was opened.
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    /// Bytes cached now.
    pub fn total_bytes(&self) -> u64 {
        self.index.lock().expect("cache index lock").total
    }

    /// Drop least-recently-used blobs until the total fits the bound, never
    /// `keep` (the blob just added: its requester is about to read it; an open
    /// file outlives its unlinking anyway).
    fn evict(&self, keep: Option<Digest>) {
        let mut victims = Vec::new();
        {
            let mut idx = self.index.lock().expect("cache index lock");
            while idx.total > self.max_bytes {
                let Some((&d, _)) = idx
                    .entries
                    .iter()
                    .filter(|(d, _)| Some(**d) != keep)
                    .min_by_key(|(_, e)| e.last_use)
                else {
                    break;
                };
                let e = idx.entries.remove(&d).expect("entry just found");
                idx.total -= e.size;
                victims.push(d);
            }
        }
        for d in victims {
            let p = self.blob_path(&d);
            if let Err(e) = fs::remove_file(&p) {
                tracing::warn!("evicting {}: {e}", p.display());
            }
            self.evictions.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A blob being written: dropped without [`TempBlob::commit`], its file is
/// deleted.
#[derive(Debug)]
pub struct TempBlob {
    cache: Arc<Cache>,
    path: PathBuf,
    file: File,
    digest: Digest,
    size: u64,
    committed: bool,
}

/// Writes into a [`TempBlob`] from a blocking thread (see [`TempBlob::writer`]).
#[derive(Debug)]
pub struct TempWriter {
    file: File,
    path: PathBuf,
}

impl TempWriter {
    /// As [`TempBlob::write_at`].
    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), CacheError> {
        write_at(&self.file, &self.path, offset, data)
    }

    /// As [`TempWriter::write_at`] for the concatenation of `pieces`, written
    /// with `pwritev` straight from them: a chunk arrives as the pieces quinn
    /// received it in (one per packet), and gathering them into one buffer
    /// first would cost a copy of every byte (benches/results/image-agents.md).
    pub fn write_pieces_at(&self, offset: u64, pieces: &[Bytes]) -> Result<(), CacheError> {
        // Linux takes at most IOV_MAX (1024) buffers per call.
        const IOV_MAX: usize = 1024;
        let (mut i, mut skip, mut at) = (0usize, 0usize, offset);
        while i < pieces.len() {
            if skip == pieces[i].len() {
                (i, skip) = (i + 1, 0);
                continue;
            }
            let iov: Vec<IoSlice<'_>> = std::iter::once(&pieces[i][skip..])
                .chain(pieces[i + 1..].iter().map(|p| &p[..]))
                .take(IOV_MAX)
                .map(IoSlice::new)
                .collect();
            let mut n = rustix::io::pwritev(&self.file, &iov, at)
                .map_err(|e| io_err("writing", &self.path)(e.into()))?;
            if n == 0 {
                return Err(io_err("writing", &self.path)(
                    io::ErrorKind::WriteZero.into(),
                ));
            }
            at += n as u64;
            // Advance over what was written (a short write may end mid-piece).
            while n > 0 {
                let left = pieces[i].len() - skip;
                if n < left {
                    skip += n;
                    n = 0;
                } else {
                    n -= left;
                    (i, skip) = (i + 1, 0);
                }
            }
        }
        Ok(())
    }
}

/// Write `data` at `offset` of a temp blob's file. Nothing is made durable
/// here: a blob is synced once, when it is committed after it matched its
/// digest ([`TempBlob::commit`]).
fn write_at(file: &File, path: &Path, offset: u64, data: &[u8]) -> Result<(), CacheError> {
    file.write_all_at(data, offset)
        .map_err(io_err("writing", path))
}

impl TempBlob {
    /// Write `data` at `offset` (chunks arrive in any order).
    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), CacheError> {
        write_at(&self.file, &self.path, offset, data)
    }

    /// A handle that writes into this temp blob from another thread.
    pub fn writer(&self) -> Result<TempWriter, CacheError> {
        Ok(TempWriter {
            file: self
                .file
                .try_clone()
                .map_err(io_err("opening", &self.path))?,
            path: self.path.clone(),
        })
    }

    /// The temp file, for reading back from another thread.
    pub fn reader(&self) -> Result<File, CacheError> {
        self.file.try_clone().map_err(io_err("opening", &self.path))
    }

    /// Read back `buf.len()` bytes at `offset`.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), CacheError> {
        self.file
            .read_exact_at(buf, offset)
            .map_err(io_err("reading", &self.path))
    }

    /// The blob's size.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The temp file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Store the blob: `actual` is the digest its bytes hashed to while they
    /// arrived. A mismatch deletes the file and is an error; a match is
    /// fsynced, renamed into place and indexed, then the cache is trimmed to
    /// its bound. Returns the committed file, opened for reading.
    pub fn commit(mut self, actual: Digest) -> Result<(File, u64), CacheError> {
        if actual != self.digest {
            return Err(CacheError::Mismatch {
                expected: self.digest,
                actual,
            });
        }
        self.file
            .sync_all()
            .map_err(io_err("fsyncing", &self.path))?;
        let dest = self.cache.blob_path(&self.digest);
        fs::rename(&self.path, &dest).map_err(io_err("renaming into", &dest))?;
        self.committed = true;
        let dir = self.cache.dir.join("blobs/sha256");
        File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(io_err("fsyncing", &dir))?;
        {
            let mut idx = self.cache.index.lock().expect("cache index lock");
            idx.clock += 1;
            let clock = idx.clock;
            if idx
                .entries
                .insert(
                    self.digest,
                    Entry {
                        size: self.size,
                        last_use: clock,
                        // Hashed as it arrived.
                        verified: true,
                    },
                )
                .is_none()
            {
                idx.total += self.size;
            }
        }
        self.cache.evict(Some(self.digest));
        let f = File::open(&dest).map_err(io_err("opening", &dest))?;
        Ok((f, self.size))
    }
}

impl Drop for TempBlob {
    fn drop(&mut self) {
        if !self.committed {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// Read from the cache itself (its index under one short lock), so
/// nothing is copied by hand.
impl Counters for Cache {
    fn visit(&self, f: &mut dyn FnMut(Metric)) {
        struct Now {
            cache_bytes: u64,
            cache_capacity_bytes: u64,
            cache_blobs: u64,
            cache_evictions: u64,
        }
        let now = {
            let idx = self.index.lock().expect("cache index lock");
            Now {
                cache_bytes: idx.total,
                cache_capacity_bytes: self.max_bytes,
                cache_blobs: idx.entries.len() as u64,
                cache_evictions: self.evictions(),
            }
        };
        quic_rdma::visit_fields!(f, now, None;
            cache_bytes: Gauge, Bytes, "Bytes of blobs in the cache";
            cache_capacity_bytes: Gauge, Bytes, "The cache's size bound";
            cache_blobs: Gauge, Count, "Blobs in the cache";
            cache_evictions: Counter, Count, "Blobs evicted (LRU)";
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(c: &Arc<Cache>, data: &[u8]) -> Digest {
        let d = Digest::of(data);
        let t = c.temp(&d, data.len() as u64).unwrap();
        t.write_at(0, data).unwrap();
        t.commit(d).unwrap();
        d
    }

    #[test]
    fn lru_eviction_within_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let c = Cache::open(dir.path(), 250).unwrap();
        let a = put(&c, &[1; 100]);
        let b = put(&c, &[2; 100]);
        assert!(c.get(&a).is_some()); // a is now more recent than b
        let x = put(&c, &[3; 100]);
        assert!(c.contains(&a) && c.contains(&x) && !c.contains(&b));
        assert_eq!(c.evictions(), 1);
        let mut text = String::new();
        c.prometheus("qr_node", &mut text);
        let m = crate::prom_text::parse(&text).unwrap();
        assert_eq!(m.value("qr_node_cache_evictions_total"), Some(1.0));
        assert_eq!(
            m.value("qr_node_cache_blobs"),
            Some(c.index.lock().unwrap().entries.len() as f64)
        );
        assert_eq!(m.value("qr_node_cache_bytes"), Some(c.total_bytes() as f64));
        assert_eq!(
            m.value("qr_node_cache_capacity_bytes"),
            Some(c.max_bytes as f64)
        );
        assert_eq!(c.total_bytes(), 200);
        assert!(!dir.path().join("blobs/sha256").join(b.hex()).exists());
    }

    #[test]
    fn pieces_are_written_in_order_past_the_iovec_limit() {
        let dir = tempfile::tempdir().unwrap();
        let c = Cache::open(dir.path(), 1 << 30).unwrap();
        // 3000 pieces (more than one pwritev takes), some empty, odd sizes.
        let pieces: Vec<Bytes> = (0..3000u32)
            .map(|i| Bytes::from(vec![(i % 251) as u8; (i % 7) as usize * 3]))
            .collect();
        let body: Vec<u8> = pieces.concat();
        let temp = c.temp(&Digest::of(&body), 10 + body.len() as u64).unwrap();
        let w = temp.writer().unwrap();
        w.write_pieces_at(10, &pieces).unwrap();
        let mut back = vec![0u8; body.len()];
        temp.read_at(10, &mut back).unwrap();
        assert_eq!(back, body);
    }

    #[test]
    fn mismatch_is_never_cached_and_temp_files_vanish() {
        let dir = tempfile::tempdir().unwrap();
        let c = Cache::open(dir.path(), 1 << 20).unwrap();
        let d = Digest::of(b"good");
        let t = c.temp(&d, 4).unwrap();
        t.write_at(0, b"evil").unwrap();
        let tmp = t.path().to_path_buf();
        assert!(matches!(
            t.commit(Digest::of(b"evil")),
            Err(CacheError::Mismatch { .. })
        ));
        assert!(!tmp.exists());
        assert!(!c.contains(&d) && c.get(&d).is_none());
    }

    #[tokio::test]
    async fn a_copy_that_rotted_at_rest_is_quarantined_not_served() {
        let dir = tempfile::tempdir().unwrap();
        let (good, bad) = {
            let c = Cache::open(dir.path(), 1 << 20).unwrap();
            (put(&c, b"kept intact"), put(&c, b"to be damaged"))
        };
        let path = dir.path().join("blobs/sha256").join(bad.hex());
        let mut bytes = fs::read(&path).unwrap();
        bytes[3] ^= 0x20;
        fs::write(&path, &bytes).unwrap();
        // Reopened, nothing is taken on trust: both are hashed on first use.
        let c = Cache::open(dir.path(), 1 << 20).unwrap();
        let corrupt = Counter::default();
        let (f, size) = c.get_verified(&good, &[&corrupt]).await.unwrap();
        assert_eq!((size, hash_file(&f).unwrap()), (11, good));
        assert!(c.get_verified(&bad, &[&corrupt]).await.is_none());
        assert_eq!(corrupt.get(), 1);
        assert!(!c.contains(&bad));
        assert_eq!(c.total_bytes(), 11);
        let moved = dir.path().join("quarantine").join(bad.hex());
        assert_eq!(fs::read(moved).unwrap(), bytes, "kept for the operator");
        // A miss now (counted once); the blob can be stored again.
        assert!(c.get_verified(&bad, &[&corrupt]).await.is_none());
        assert_eq!(corrupt.get(), 1);
        assert_eq!(put(&c, b"to be damaged"), bad);
        assert!(c.get_verified(&bad, &[&corrupt]).await.is_some());
    }

    #[tokio::test]
    async fn the_scrub_finds_a_copy_that_rotted_after_it_was_verified() {
        let dir = tempfile::tempdir().unwrap();
        let c = Cache::open(dir.path(), 1 << 20).unwrap();
        let (good, bad) = (put(&c, b"stays whole"), put(&c, b"rots later"));
        let path = dir.path().join("blobs/sha256").join(bad.hex());
        let mut bytes = fs::read(&path).unwrap();
        bytes[0] ^= 1;
        fs::write(&path, &bytes).unwrap();
        let (corrupt, scrubbed) = (Counter::default(), Counter::default());
        // Written (and hashed) by this process: lookups trust it...
        assert!(c.get_verified(&bad, &[&corrupt]).await.is_some());
        // ... the scrub does not.
        c.scrub_pass(1 << 30, &[&corrupt], &scrubbed).await;
        assert_eq!((corrupt.get(), scrubbed.get()), (1, 21));
        assert!(c.contains(&good) && !c.contains(&bad));
        assert!(dir.path().join("quarantine").join(bad.hex()).exists());
        c.scrub_pass(1 << 30, &[&corrupt], &scrubbed).await;
        assert_eq!((corrupt.get(), scrubbed.get()), (1, 32));
    }

    #[test]
    fn scrub_reads_at_the_rate_it_is_given() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        fs::write(&p, vec![7u8; 3 << 20]).unwrap();
        let started = std::time::Instant::now();
        let (_, n) = hash_file_paced(&File::open(&p).unwrap(), Some(10 << 20)).unwrap();
        // 3 MiB at 10 MiB/s: the last piece is due at 300 ms.
        assert_eq!(n, 3 << 20);
        assert!(started.elapsed() >= std::time::Duration::from_millis(290));
    }

    #[test]
    fn reopen_keeps_blobs_and_drops_partials() {
        let dir = tempfile::tempdir().unwrap();
        let d = {
            let c = Cache::open(dir.path(), 1 << 20).unwrap();
            let d = put(&c, b"kept");
            // A crash mid-write: the temp file is left behind.
            let t = c.temp(&Digest::of(b"partial"), 7).unwrap();
            t.write_at(0, b"par").unwrap();
            std::mem::forget(t);
            d
        };
        let c = Cache::open(dir.path(), 1 << 20).unwrap();
        assert!(c.contains(&d));
        assert_eq!(fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0);
        assert_eq!(c.total_bytes(), 4);
    }
}
