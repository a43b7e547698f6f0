//! Snapshots on the master side: a file that is read while it is still being
//! written, so a full sync streams to replicas as the source produces it
//! (a Redis master's diskless RDB, for instance) instead of after the end.
//!
//! The file lives in the directory the master is given and is removed when the
//! last reader and the writer are done with it. Disk, not memory: a snapshot
//! is as large as the dataset.
//!
//! A master configured to keep snapshots ([`Keep`]) also links each finished
//! one to `stored-snapshot.rdb` beside a record of what it is
//! (`stored-snapshot.meta`: replication id, position, length, SHA-256), so a
//! restarted relay can serve it again instead of asking its source for a new
//! one ([`Snapshot::open_stored`], which checks length and digest first: data
//! at rest that changed is refused, never served).

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use sha2::{Digest as _, Sha256};
use tokio::sync::watch;

use super::error::ChannelError;

/// How far the writer got.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Progress {
    /// This many bytes are in the file; more may come.
    Writing(u64),
    /// Complete at this length.
    Done(u64),
    /// Abandoned (the source failed).
    Failed(String),
}

/// One snapshot: the state of the data at log `position` of `replid`.
#[derive(Debug)]
pub struct Snapshot {
    /// Replication id the snapshot belongs to.
    pub replid: String,
    /// The log position it corresponds to.
    pub position: u64,
    path: PathBuf,
    file: File,
    progress: watch::Sender<Progress>,
    /// Whether the file goes with the last handle (not for the kept copy a
    /// restarted process opened: the next finished snapshot replaces it).
    remove_on_drop: bool,
}

/// Whether finished snapshots are kept for the next process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Keep {
    /// Removed with their last reader (a relay without state).
    #[default]
    No,
    /// The latest finished one stays in the directory (see the module docs).
    Latest,
}

/// File name of the kept snapshot's data.
pub const STORED_DATA: &str = "stored-snapshot.rdb";
/// File name of the kept snapshot's record.
pub const STORED_META: &str = "stored-snapshot.meta";

/// What [`Snapshot::open_stored`] found.
#[derive(Debug)]
pub enum Stored {
    /// No kept snapshot.
    Absent,
    /// A kept snapshot whose data matches its record.
    Found(Arc<Snapshot>),
    /// A kept snapshot that cannot be served (why); its files were removed.
    Refused(String),
}

/// Remove the kept snapshot of `dir`, if any (it cannot be served any more).
pub fn discard_stored(dir: &Path) {
    let _ = std::fs::remove_file(dir.join(STORED_META));
    let _ = std::fs::remove_file(dir.join(STORED_DATA));
}

/// The record of a kept snapshot: `<replid> <position> <length> <sha256 hex>`.
fn meta_text(replid: &str, position: u64, len: u64, sha256: &[u8]) -> String {
    format!("{replid} {position} {len} {}\n", hex::encode(sha256))
}

/// Parse [`meta_text`]'s output.
fn parse_meta(text: &str) -> Option<(String, u64, u64, Vec<u8>)> {
    let mut w = text.split_whitespace();
    let replid = w.next()?;
    if !super::frame::is_replid(replid) {
        return None;
    }
    let position = w.next()?.parse().ok()?;
    let len = w.next()?.parse().ok()?;
    let sha = hex::decode(w.next()?).ok().filter(|d| d.len() == 32)?;
    w.next()
        .is_none()
        .then(|| (replid.to_string(), position, len, sha))
}

static SNAPSHOT_SEQ: AtomicU64 = AtomicU64::new(0);

/// Remove snapshot files a previous process left in `dir` (it was killed
/// before it could), and half-written copies of a kept one; other files (the
/// kept snapshot itself) are left alone.
pub fn remove_stale(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        let half_kept = name.starts_with("stored-snapshot.") && name.ends_with(".tmp");
        if (name.starts_with("snapshot-") && name.ends_with(".bin")) || half_kept {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

impl Snapshot {
    /// A new, empty snapshot file in `dir`, and the writer that fills it.
    pub fn create(
        dir: &Path,
        replid: &str,
        position: u64,
        keep: Keep,
    ) -> Result<(Arc<Snapshot>, SnapshotWriter), ChannelError> {
        let n = SNAPSHOT_SEQ.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("snapshot-{}-{n}.bin", std::process::id()));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| ChannelError::Snapshot(format!("creating {}: {e}", path.display())))?;
        let (progress, _) = watch::channel(Progress::Writing(0));
        let snap = Arc::new(Snapshot {
            replid: replid.to_string(),
            position,
            path,
            file,
            progress,
            remove_on_drop: true,
        });
        Ok((
            snap.clone(),
            SnapshotWriter {
                snap,
                written: 0,
                done: false,
                keep: (keep == Keep::Latest).then(|| (dir.to_path_buf(), Sha256::new())),
            },
        ))
    }

    /// The snapshot a previous process kept in `dir`, after checking its
    /// length and SHA-256 against its record (reads the whole file: call it
    /// off the async threads). A kept snapshot that fails the check is
    /// removed, and the reason returned for the log and the metrics.
    pub fn open_stored(dir: &Path) -> Stored {
        let (data, meta) = (dir.join(STORED_DATA), dir.join(STORED_META));
        let text = match std::fs::read_to_string(&meta) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let _ = std::fs::remove_file(&data);
                return Stored::Absent;
            }
            Err(e) => return Stored::Refused(format!("reading {}: {e}", meta.display())),
        };
        let refuse = |why: String| {
            discard_stored(dir);
            Stored::Refused(why)
        };
        let Some((replid, position, len, sha)) = parse_meta(&text) else {
            return refuse(format!("{} is not a snapshot record", meta.display()));
        };
        let file = match File::open(&data) {
            Ok(f) => f,
            Err(e) => return refuse(format!("opening {}: {e}", data.display())),
        };
        let (sha_now, at) = match crate::file_sha256::sha256_file(&file, None) {
            Ok(r) => r,
            Err(e) => return refuse(format!("reading {}: {e}", data.display())),
        };
        if at != len {
            return refuse(format!(
                "{} holds {at} bytes, its record says {len}",
                data.display()
            ));
        }
        if sha_now.as_slice() != sha.as_slice() {
            return refuse(format!(
                "{} does not match the SHA-256 in its record (changed on disk)",
                data.display()
            ));
        }
        let (progress, _) = watch::channel(Progress::Done(len));
        Stored::Found(Arc::new(Snapshot {
            replid,
            position,
            path: data,
            file,
            progress,
            remove_on_drop: false,
        }))
    }

    /// Bytes written so far and whether that is all of it.
    pub fn written(&self) -> (u64, bool) {
        match &*self.progress.borrow() {
            Progress::Writing(n) => (*n, false),
            Progress::Done(n) => (*n, true),
            Progress::Failed(_) => (0, false),
        }
    }

    /// Whether the writer abandoned it.
    pub fn failed(&self) -> bool {
        matches!(&*self.progress.borrow(), Progress::Failed(_))
    }

    /// A reader from the first byte.
    pub fn reader(self: &Arc<Snapshot>) -> SnapshotReader {
        SnapshotReader {
            snap: self.clone(),
            progress: self.progress.subscribe(),
            at: 0,
        }
    }
}

impl Drop for Snapshot {
    fn drop(&mut self) {
        if self.remove_on_drop {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Fills a [`Snapshot`]; dropping it unfinished marks the snapshot failed.
#[derive(Debug)]
pub struct SnapshotWriter {
    snap: Arc<Snapshot>,
    written: u64,
    done: bool,
    /// With [`Keep::Latest`]: the directory and the digest so far.
    keep: Option<(PathBuf, Sha256)>,
}

impl SnapshotWriter {
    /// Append bytes (a blocking file write: page cache, small pieces).
    pub fn write(&mut self, data: &[u8]) -> Result<(), ChannelError> {
        (&self.snap.file)
            .write_all(data)
            .map_err(|e| ChannelError::Snapshot(format!("{}: {e}", self.snap.path.display())))?;
        self.written += data.len() as u64;
        if let Some((_, h)) = &mut self.keep {
            h.update(data);
        }
        self.snap
            .progress
            .send_replace(Progress::Writing(self.written));
        Ok(())
    }

    /// Bytes written.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Mark it complete (and, with [`Keep::Latest`], keep it: a failure to
    /// is logged, the snapshot is still served).
    pub fn finish(mut self) {
        self.done = true;
        if let Some((dir, h)) = self.keep.take() {
            if let Err(e) = self.store(&dir, &h.finalize()) {
                tracing::warn!(
                    target: "qr::kv",
                    "keeping the snapshot in {}: {e}; a restart will fetch a new one",
                    dir.display()
                );
            }
        }
        self.snap
            .progress
            .send_replace(Progress::Done(self.written));
    }

    /// Link the finished file to [`STORED_DATA`] and write its record. The
    /// old record goes first, so a crash in between leaves data without a
    /// record (ignored) rather than a record naming other data.
    fn store(&self, dir: &Path, sha256: &[u8]) -> std::io::Result<()> {
        let (data, meta) = (dir.join(STORED_DATA), dir.join(STORED_META));
        let tmp = dir.join(format!("{STORED_DATA}.tmp"));
        let _ = std::fs::remove_file(&tmp);
        match std::fs::remove_file(&meta) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        std::fs::hard_link(&self.snap.path, &tmp)?;
        std::fs::rename(&tmp, &data)?;
        let s = &self.snap;
        let tmp = dir.join(format!("{STORED_META}.tmp"));
        std::fs::write(&tmp, meta_text(&s.replid, s.position, self.written, sha256))?;
        std::fs::rename(&tmp, &meta)
    }

    /// Mark it abandoned, with the reason readers will see.
    pub fn fail(mut self, why: &str) {
        self.done = true;
        self.snap
            .progress
            .send_replace(Progress::Failed(why.to_string()));
    }
}

impl Drop for SnapshotWriter {
    fn drop(&mut self) {
        if !self.done {
            self.snap
                .progress
                .send_replace(Progress::Failed("the snapshot source went away".into()));
        }
    }
}

/// Reads a [`Snapshot`] from the start, waiting for the writer as needed.
#[derive(Debug)]
pub struct SnapshotReader {
    snap: Arc<Snapshot>,
    progress: watch::Receiver<Progress>,
    at: u64,
}

impl SnapshotReader {
    /// The next up to `max` bytes; `Ok(None)` at the end of a complete snapshot.
    pub async fn next(&mut self, max: usize) -> Result<Option<Bytes>, ChannelError> {
        loop {
            let p = self.progress.borrow_and_update().clone();
            let (avail, done) = match p {
                Progress::Writing(n) => (n, false),
                Progress::Done(n) => (n, true),
                Progress::Failed(why) => return Err(ChannelError::Snapshot(why)),
            };
            if avail > self.at {
                let n = ((avail - self.at) as usize).min(max);
                let snap = self.snap.clone();
                let at = self.at;
                let data = tokio::task::spawn_blocking(move || {
                    let mut buf = BytesMut::zeroed(n);
                    snap.file.read_exact_at(&mut buf, at).map(|()| buf.freeze())
                })
                .await
                .map_err(|e| ChannelError::Snapshot(format!("reader task: {e}")))?
                .map_err(|e| ChannelError::Snapshot(format!("reading: {e}")))?;
                self.at += n as u64;
                return Ok(Some(data));
            }
            if done {
                return Ok(None);
            }
            if self.progress.changed().await.is_err() {
                return Err(ChannelError::Snapshot("the snapshot was dropped".into()));
            }
        }
    }

    /// Bytes read so far.
    pub fn position(&self) -> u64 {
        self.at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_reader_follows_the_writer_to_the_end() {
        let dir = std::env::temp_dir().join(format!("kv-snap-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (snap, mut w) = Snapshot::create(&dir, "r", 7, Keep::No).unwrap();
        let path = snap.path.clone();
        let mut r = snap.reader();
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            while let Some(b) = r.next(3).await.unwrap() {
                got.extend_from_slice(&b);
            }
            got
        });
        for piece in [&b"abc"[..], b"defgh", b"", b"ij"] {
            w.write(piece).unwrap();
            tokio::task::yield_now().await;
        }
        w.finish();
        assert_eq!(reader.await.unwrap(), b"abcdefghij");
        drop(snap);
        assert!(!path.exists(), "the file goes with the last handle");
        let (snap, w) = Snapshot::create(&dir, "r", 7, Keep::No).unwrap();
        drop(w);
        assert!(snap.reader().next(10).await.is_err());
        let _ = std::fs::remove_dir(&dir);
    }

    #[test]
    fn a_kept_snapshot_is_served_again_only_while_it_matches_its_record() {
        let dir = std::env::temp_dir().join(format!("kv-snap-keep-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(matches!(Snapshot::open_stored(&dir), Stored::Absent));
        let (snap, mut w) = Snapshot::create(&dir, "abc123", 4242, Keep::Latest).unwrap();
        w.write(b"REDIS0011").unwrap();
        w.write(b"-data-").unwrap();
        w.finish();
        drop(snap);
        // The working file went with its handle; the kept copy stays.
        let Stored::Found(kept) = Snapshot::open_stored(&dir) else {
            panic!("the finished snapshot was not kept");
        };
        assert_eq!((kept.replid.as_str(), kept.position), ("abc123", 4242));
        assert_eq!(kept.written(), (15, true));
        drop(kept);
        // A byte changed at rest: refused and removed, never served.
        let data = dir.join(STORED_DATA);
        let mut bytes = std::fs::read(&data).unwrap();
        bytes[3] ^= 1;
        std::fs::write(&data, &bytes).unwrap();
        let Stored::Refused(why) = Snapshot::open_stored(&dir) else {
            panic!("a changed snapshot was accepted");
        };
        assert!(why.contains("SHA-256"), "{why}");
        assert!(!data.exists() && !dir.join(STORED_META).exists());
        // A cut short one too.
        let (_snap, mut w) = Snapshot::create(&dir, "abc123", 1, Keep::Latest).unwrap();
        w.write(b"0123456789").unwrap();
        w.finish();
        std::fs::write(&data, b"01234").unwrap();
        let Stored::Refused(why) = Snapshot::open_stored(&dir) else {
            panic!("a truncated snapshot was accepted");
        };
        assert!(why.contains("holds 5 bytes"), "{why}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_record_that_is_not_one_is_refused() {
        assert!(parse_meta("abc 1 2 00").is_none());
        assert!(parse_meta(&meta_text("a b", 1, 2, &[0; 32])).is_none());
        assert!(parse_meta(&(meta_text("ab", 1, 2, &[0; 32]) + " x")).is_none());
        assert_eq!(
            parse_meta(&meta_text("ab", 1, 2, &[7; 32])),
            Some(("ab".to_string(), 1, 2, vec![7; 32]))
        );
    }
}
