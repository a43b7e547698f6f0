//! Where a transfer's chunks go: one blocking thread per blob writes each
//! chunk at its offset, feeds the whole-blob sha256 in order and reports that
//! contiguous prefix to the blob's flight as it grows (so requests stream it:
//! [`super::inflight`]), while the transfer loop goes on receiving and asking
//! for chunks.
//! Before, the loop itself waited for each write, hash and `fdatasync`, and
//! every such wait left a chunk slot of the window empty (benches/RESULTS.md,
//! "Image layers").

use std::collections::BTreeMap;

use bytes::Bytes;
use sha2::{Digest as _, Sha256};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::cache::{CacheError, TempBlob};
use super::client::FetchError;
use super::digest::Digest;
use super::inflight::Feed;

/// The writer and hasher of one blob's chunks.
#[derive(Debug)]
pub struct Sink {
    tx: mpsc::Sender<(u64, Vec<Bytes>)>,
    task: JoinHandle<Result<Digest, CacheError>>,
}

fn local(e: impl std::fmt::Display) -> FetchError {
    FetchError::Local(e.to_string())
}

impl Sink {
    /// A sink into `temp` that queues at most `depth` chunks (the transfer
    /// waits when it is full: memory stays bounded by the window) and tells
    /// `feed` the prefix written and hashed so far.
    pub fn start(temp: &TempBlob, depth: usize, feed: Feed) -> Result<Sink, FetchError> {
        let w = temp.writer().map_err(local)?;
        let (tx, mut rx) = mpsc::channel::<(u64, Vec<Bytes>)>(depth.max(1));
        let task = tokio::task::spawn_blocking(move || {
            let mut hasher = Sha256::new();
            let mut at = 0u64;
            // Chunks that arrived before the ones in front of them.
            let mut pending: BTreeMap<u64, Vec<Bytes>> = BTreeMap::new();
            while let Some((off, body)) = rx.blocking_recv() {
                // No `fdatasync` here: the blob is made durable once, when it
                // is committed to the cache after its verification, behind
                // its first byte (node::Stored). A flush every 64 MiB stalled
                // this thread, then the transfer, at the disk's write rate.
                w.write_pieces_at(off, &body)?;
                pending.insert(off, body);
                // A chunk next in line is hashed right after its write, while
                // its bytes are still in the CPU's caches.
                while let Some(b) = pending.remove(&at) {
                    for p in &b {
                        hasher.update(p);
                        at += p.len() as u64;
                    }
                }
                // After the write returned: a reader of the file told of
                // this prefix finds its bytes (the watch's lock orders the two).
                feed.prefix(at);
            }
            Ok(Digest::from_bytes(hasher.finalize().into()))
        });
        Ok(Sink { tx, task })
    }

    /// Queue chunk `body` (its pieces in order) at `off` (each offset once).
    pub async fn put(&self, off: u64, body: Vec<Bytes>) -> Result<(), FetchError> {
        // A closed channel means the thread stopped on an error: `finish` has it.
        self.tx
            .send((off, body))
            .await
            .map_err(|_| local("the blob writer stopped (see the error that follows)"))
    }

    /// Wait for every queued chunk; what the blob hashed to.
    pub async fn finish(self) -> Result<Digest, FetchError> {
        drop(self.tx);
        self.task
            .await
            .map_err(|e| local(format!("blob writer: {e}")))?
            .map_err(local)
    }
}
