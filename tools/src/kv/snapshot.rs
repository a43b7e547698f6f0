//! Snapshots on the master side: a file that is read while it is still being
//! written, so a full sync streams to replicas as the source produces it
//! (a Redis master's diskless RDB, for instance) instead of after the end.
//!
//! The file lives in the directory the master is given and is removed when the
//! last reader and the writer are done with it. Disk, not memory: a snapshot
//! is as large as the dataset.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
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
}

static SNAPSHOT_SEQ: AtomicU64 = AtomicU64::new(0);

/// Remove snapshot files a previous process left in `dir` (it was killed
/// before it could); other files are left alone.
pub fn remove_stale(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("snapshot-") && name.ends_with(".bin") {
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
        });
        Ok((
            snap.clone(),
            SnapshotWriter {
                snap,
                written: 0,
                done: false,
            },
        ))
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
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Fills a [`Snapshot`]; dropping it unfinished marks the snapshot failed.
#[derive(Debug)]
pub struct SnapshotWriter {
    snap: Arc<Snapshot>,
    written: u64,
    done: bool,
}

impl SnapshotWriter {
    /// Append bytes (a blocking file write: page cache, small pieces).
    pub fn write(&mut self, data: &[u8]) -> Result<(), ChannelError> {
        (&self.snap.file)
            .write_all(data)
            .map_err(|e| ChannelError::Snapshot(format!("{}: {e}", self.snap.path.display())))?;
        self.written += data.len() as u64;
        self.snap
            .progress
            .send_replace(Progress::Writing(self.written));
        Ok(())
    }

    /// Bytes written.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Mark it complete.
    pub fn finish(mut self) {
        self.done = true;
        self.snap
            .progress
            .send_replace(Progress::Done(self.written));
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
        let (snap, mut w) = Snapshot::create(&dir, "r", 7).unwrap();
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
        let (snap, w) = Snapshot::create(&dir, "r", 7).unwrap();
        drop(w);
        assert!(snap.reader().next(10).await.is_err());
        let _ = std::fs::remove_dir(&dir);
    }
}
