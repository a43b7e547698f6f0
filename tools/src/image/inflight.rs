//! One blob on its way into the node agent, streamed to every request for it
//! while it arrives (cut-through; docs/architecture.md §8, "Image layers").
//!
//! A [`Flight`] publishes its [`State`] on a `tokio::sync::watch`: which
//! [`Attempt`] is arriving (one temp file, filled from one source: a peer,
//! the registry agent, or the upstream directly), how long its contiguous
//! prefix is (written and fed to the whole-blob sha256 in order, by the
//! transfer's sink), then the verdict. The request that started the fetch and
//! every request that joined it are [`Follower`]s of that one state, so they
//! all read the same bytes in the same order; a cache hit is a follower of a
//! flight already over ([`Follower::cached`]), so the HTTP side has one way
//! to serve a blob whatever its source.
//!
//! What keeps a client from ever holding a complete wrong blob: a response's
//! last byte is held back until the whole blob matched its digest and its
//! commit to the cache ended. Clients verify digests themselves (the OCI
//! distribution spec, "Pulling blobs": the client checks the content against
//! the digest), so bytes before it may stream unverified. On a mismatch, or
//! when the attempt a response is reading is given up for another source,
//! the body ends in an error and hyper cuts the connection: the client holds
//! fewer bytes than `Content-Length`, an incomplete message (RFC 9110 §8.6),
//! and retries; its next request follows the refetch or finds the cache.
//!
//! A follower may be told to wait for the verdict before its first byte
//! ([`Follower::after_verdict`]): the node does so for a blob whose fetch
//! failed or restarted lately, so a client cut short once gets the blob
//! whole or an error answer on its retry, not another cut
//! (`node::CUT_THROUGH_FAILED_FOR`).

use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use sha2::{Digest as _, Sha256};
use tokio::sync::watch;

use super::client::FetchError;
use super::digest::Digest;
use super::metrics::Path;

/// Bytes of a blob read and handed to the HTTP body at a time.
pub const SERVE_PIECE: u64 = 1 << 20;

/// How far a flight has got.
#[derive(Clone, Debug)]
pub enum State {
    /// Asking the sources (peers' stats); no bytes yet.
    Starting,
    /// An attempt's bytes are arriving.
    Arriving(Attempt),
    /// The attempt hashed whole to the digest; its commit is under way.
    Verified(Attempt),
    /// Verified, and the commit ended: `Err` says why it is not cached (its
    /// bytes were verified all the same).
    Stored(Attempt, Result<(), String>),
    /// No source gave the blob whole and intact: nothing more comes.
    Failed(FetchError),
}

/// One try at a blob from one source, into a file of its own.
#[derive(Clone, Debug)]
pub struct Attempt {
    /// Tells a flight's attempts apart.
    pub seq: u32,
    /// Where its bytes come from.
    pub path: Path,
    /// Its file (a temp file; the cache's copy for a hit), open for reading.
    pub file: Arc<File>,
    /// The blob's size.
    pub size: u64,
    /// Bytes `0..prefix` are in `file`, in order and hashed.
    pub prefix: u64,
}

/// A blob being fetched, shared by everyone who asked for it.
#[derive(Debug)]
pub struct Flight {
    digest: Digest,
    size: u64,
    tx: watch::Sender<State>,
    seq: AtomicU32,
}

impl Flight {
    /// A flight of blob `digest` of `size` bytes, no attempt yet.
    pub fn new(digest: Digest, size: u64) -> Arc<Flight> {
        Arc::new(Flight {
            digest,
            size,
            tx: watch::Sender::new(State::Starting),
            seq: AtomicU32::new(0),
        })
    }

    /// The blob's size.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// How many attempts have started.
    pub fn attempts(&self) -> u32 {
        self.seq.load(Ordering::Relaxed)
    }

    /// A reader of this flight from now on.
    pub fn follow(&self) -> Follower {
        Follower {
            digest: self.digest,
            size: self.size,
            rx: self.tx.subscribe(),
            after_verdict: false,
            check: None,
        }
    }

    /// Start a new attempt from `path` into `file`; its sink reports the
    /// prefix to the returned [`Feed`]. Followers reading an earlier attempt
    /// are cut off (their bytes came from a source given up on).
    pub fn attempt(self: &Arc<Self>, path: Path, file: File) -> Feed {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        self.tx.send_replace(State::Arriving(Attempt {
            seq,
            path,
            file: Arc::new(file),
            size: self.size,
            prefix: 0,
        }));
        Feed {
            flight: self.clone(),
            seq,
        }
    }

    /// The attempt arriving now hashed whole to the digest.
    pub fn verified(&self) {
        self.tx.send_if_modified(|s| match s {
            State::Arriving(a) => {
                a.prefix = a.size;
                *s = State::Verified(a.clone());
                true
            }
            _ => false,
        });
    }

    /// The verified attempt's commit ended with `r`.
    pub fn stored(&self, r: Result<(), String>) {
        self.tx.send_if_modified(|s| match s {
            State::Verified(a) => {
                *s = State::Stored(a.clone(), r);
                true
            }
            _ => false,
        });
    }

    /// The flight failed; a flight already over keeps its end.
    pub fn fail(&self, e: FetchError) {
        self.tx.send_if_modified(|s| {
            if matches!(s, State::Stored(..) | State::Failed(_)) {
                return false;
            }
            *s = State::Failed(e);
            true
        });
    }
}

/// Where one attempt's sink reports its contiguous, hashed prefix (from the
/// sink's blocking thread).
#[derive(Clone, Debug)]
pub struct Feed {
    flight: Arc<Flight>,
    seq: u32,
}

impl Feed {
    /// Bytes `0..n` are written and hashed.
    pub fn prefix(&self, n: u64) {
        self.flight.tx.send_if_modified(|s| match s {
            State::Arriving(a) if a.seq == self.seq && n > a.prefix => {
                a.prefix = n.min(a.size);
                true
            }
            _ => false,
        });
    }
}

/// A request's view of a flight.
#[derive(Debug)]
pub struct Follower {
    digest: Digest,
    size: u64,
    rx: watch::Receiver<State>,
    /// No byte before the whole blob matched its digest.
    after_verdict: bool,
    /// A whole response of a cache hit hashes what it serves.
    check: Option<Reporter>,
}

/// An [`OnCorrupt`] (with a `Debug` for the structs that hold it).
#[derive(Clone)]
struct Reporter(OnCorrupt);

impl std::fmt::Debug for Reporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OnCorrupt")
    }
}

/// What a cache hit's whole response calls, with the file it read and the
/// bytes' actual digest,
/// when what it served does not hash to the blob's: the copy rotted since
/// it was last checked (quarantine it, count it).
pub type OnCorrupt = Arc<dyn Fn(&File, Digest) + Send + Sync>;

/// A whole response's running hash and what to do on a mismatch.
#[derive(Debug)]
struct Check {
    hash: Sha256,
    on_corrupt: Reporter,
}

/// How many bytes of the response `start..end` may go out in `s`, and
/// whether that is all of them; `None` if `s` is not attempt `seq`'s (any
/// attempt's, for `seq` 0) or the flight failed.
///
/// The response's last byte waits for the verdict and the commit: only then
/// is the response complete (see the module docs).
fn servable(s: &State, seq: u32, start: u64, end: u64) -> Option<(u64, bool)> {
    let (a, upto) = match s {
        State::Arriving(a) => (a, a.prefix.min(end.saturating_sub(1))),
        State::Verified(a) => (a, end.saturating_sub(1)),
        State::Stored(a, _) => (a, end),
        State::Starting | State::Failed(_) => return None,
    };
    if seq != 0 && a.seq != seq {
        return None;
    }
    Some((upto.max(start), upto >= end))
}

impl Follower {
    /// A follower of a flight over before it began: the cache's copy
    /// (verified once) of blob `digest`. A whole response of it hashes what
    /// it serves and holds back its last byte until that matched: on a
    /// mismatch the response is cut short and `on_corrupt` hears the actual
    /// digest, so a copy that rotted is never served complete.
    pub fn cached(digest: Digest, file: File, size: u64, on_corrupt: OnCorrupt) -> Follower {
        let a = Attempt {
            seq: 1,
            path: Path::Cache,
            file: Arc::new(file),
            size,
            prefix: size,
        };
        let (_, rx) = watch::channel(State::Stored(a, Ok(())));
        Follower {
            digest,
            size,
            rx,
            after_verdict: false,
            check: Some(Reporter(on_corrupt)),
        }
    }

    /// This follower's response sends no byte before the whole blob matched
    /// its digest: a failure is its answer, never a cut.
    pub fn after_verdict(mut self) -> Follower {
        self.after_verdict = true;
        self
    }

    /// The blob's size.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Wait until `f` makes something of the state (terminal states must
    /// map to `Some`: nothing follows them).
    async fn wait_for<T>(
        &mut self,
        mut f: impl FnMut(&State) -> Option<T>,
    ) -> Result<T, FetchError> {
        loop {
            if let Some(t) = f(&self.rx.borrow_and_update()) {
                return Ok(t);
            }
            if self.rx.changed().await.is_err() {
                // The fetch task ended without a last word: it panicked.
                return Err(FetchError::Local(format!(
                    "the fetch of blob {} stopped",
                    self.digest
                )));
            }
        }
    }

    /// Wait until the first byte of the response `start..end` may go out (or
    /// the whole, empty, response is complete), then read it from the
    /// attempt that has it. An error before that is the request's answer.
    pub async fn bind(mut self, start: u64, end: u64) -> Result<Reading, FetchError> {
        let after_verdict = self.after_verdict;
        let a = self
            .wait_for(|s| match s {
                State::Failed(e) => Some(Err(e.clone())),
                State::Starting | State::Arriving(_) if after_verdict => None,
                s => match servable(s, 0, start, end) {
                    Some((upto, done)) if upto > start || done => Some(Ok(attempt(s).cloned())),
                    _ => None,
                },
            })
            .await??;
        let a = a.ok_or_else(|| FetchError::Local("no attempt to read".into()))?;
        // Only a whole response can be checked against the digest.
        let check = self
            .check
            .filter(|_| start == 0 && end == self.size)
            .map(|on_corrupt| Check {
                hash: Sha256::new(),
                on_corrupt,
            });
        Ok(Reading {
            check,
            digest: self.digest,
            rx: self.rx,
            seq: a.seq,
            path: a.path,
            file: a.file,
            at: start,
            end,
        })
    }

    /// Wait until the whole blob is verified (`progress` hears the prefix
    /// grow): the verified attempt, and this follower to wait for its commit.
    pub async fn verified(
        mut self,
        progress: &(dyn Fn(u64, u64) + Send + Sync),
    ) -> Result<(Attempt, Follower), FetchError> {
        let a = self
            .wait_for(|s| match s {
                State::Arriving(a) => {
                    progress(a.prefix, a.size);
                    None
                }
                State::Verified(a) | State::Stored(a, _) => {
                    progress(a.size, a.size);
                    Some(Ok(a.clone()))
                }
                State::Failed(e) => Some(Err(e.clone())),
                State::Starting => None,
            })
            .await??;
        Ok((a, self))
    }

    /// Wait for the commit of a verified blob: `Ok` once it is cached.
    pub async fn stored(mut self) -> Result<(), FetchError> {
        self.wait_for(|s| match s {
            State::Stored(_, r) => Some(r.clone().map_err(FetchError::Local)),
            State::Failed(e) => Some(Err(e.clone())),
            _ => None,
        })
        .await?
    }
}

fn attempt(s: &State) -> Option<&Attempt> {
    match s {
        State::Arriving(a) | State::Verified(a) | State::Stored(a, _) => Some(a),
        State::Starting | State::Failed(_) => None,
    }
}

/// A response's bytes `at..end`, read from one attempt as its prefix grows.
#[derive(Debug)]
pub struct Reading {
    check: Option<Check>,
    digest: Digest,
    rx: watch::Receiver<State>,
    seq: u32,
    path: Path,
    file: Arc<File>,
    at: u64,
    end: u64,
}

impl Reading {
    /// Where the bytes come from.
    pub fn path(&self) -> Path {
        self.path
    }

    /// The next piece, `None` at the end; an error cuts the response short
    /// (the attempt failed or was given up, or a read failed).
    pub async fn next(&mut self) -> Option<io::Result<Bytes>> {
        if self.at >= self.end {
            return None;
        }
        let (seq, at, end) = (self.seq, self.at, self.end);
        let verdict = loop {
            let now = servable(&self.rx.borrow_and_update(), seq, at, end);
            match now {
                Some((upto, _)) if upto > at => break Ok(upto),
                Some(_) => {}
                None => break Err(self.why_cut()),
            }
            if self.rx.changed().await.is_err() {
                break Err(format!("the fetch of blob {} stopped", self.digest));
            }
        };
        let upto = match verdict {
            Ok(upto) => upto,
            Err(why) => {
                self.at = self.end;
                tracing::warn!(
                    "response for blob {} cut short at byte {at} of {end}: {why}",
                    self.digest
                );
                return Some(Err(io::Error::other(why)));
            }
        };
        let n = (upto - at).min(SERVE_PIECE);
        let f = self.file.clone();
        let mut hash = self.check.as_ref().map(|c| c.hash.clone());
        // Read (and hash) at its offset on a blocking thread: one copy out of
        // the page cache (tokio::fs::File reads into its own buffer, then
        // copies).
        let read = tokio::task::spawn_blocking(move || {
            use std::os::unix::fs::FileExt;
            let mut buf = vec![0u8; n as usize];
            f.read_exact_at(&mut buf, at)?;
            if let Some(h) = &mut hash {
                h.update(&buf);
            }
            Ok::<_, io::Error>((buf, hash))
        })
        .await
        .unwrap_or_else(|e| Err(io::Error::other(e)));
        match read {
            Ok((buf, hash)) => {
                self.at += n;
                if let (Some(c), Some(h)) = (&mut self.check, hash) {
                    c.hash = h;
                    if self.at == self.end {
                        let actual = Digest::from_bytes(c.hash.clone().finalize().into());
                        if actual != self.digest {
                            // The last piece is not sent: the response is cut.
                            (c.on_corrupt.0)(&self.file, actual);
                            return Some(Err(io::Error::other(format!(
                                "the cached copy of blob {} hashes to {actual}: quarantined; \
                                 fetched again on the next request",
                                self.digest
                            ))));
                        }
                    }
                }
                Some(Ok(Bytes::from(buf)))
            }
            Err(e) => {
                self.at = self.end;
                Some(Err(e))
            }
        }
    }

    /// Why the attempt this response reads is no use any more.
    fn why_cut(&self) -> String {
        match &*self.rx.borrow() {
            State::Failed(e) => format!("{e}"),
            _ => "its source failed; the blob is being fetched again".into(),
        }
    }

    /// The pieces as a stream (for an HTTP body).
    pub fn into_stream(self) -> impl futures_util::Stream<Item = io::Result<Bytes>> + Send {
        futures_util::stream::unfold(self, |mut r| async move {
            let piece = r.next().await?;
            Some((piece, r))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file(data: &[u8]) -> (tempfile::NamedTempFile, File) {
        let mut t = tempfile::NamedTempFile::new().unwrap();
        t.write_all(data).unwrap();
        let f = t.reopen().unwrap();
        (t, f)
    }

    async fn drain(mut r: Reading) -> (Vec<u8>, Option<String>) {
        let mut out = Vec::new();
        while let Some(p) = r.next().await {
            match p {
                Ok(b) => out.extend_from_slice(&b),
                Err(e) => return (out, Some(e.to_string())),
            }
        }
        (out, None)
    }

    #[tokio::test]
    async fn the_last_byte_waits_for_the_verdict_and_the_commit() {
        let data: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        let (_t, f) = file(&data);
        let d = Digest::of(&data);
        let flight = Flight::new(d, 5000);
        let follower = flight.follow();
        let feed = flight.attempt(Path::Fabric, f);
        feed.prefix(3000);
        let mut r = follower.bind(0, 5000).await.unwrap();
        assert_eq!(r.path(), Path::Fabric);
        assert_eq!(&r.next().await.unwrap().unwrap()[..], &data[..3000]);
        feed.prefix(5000);
        // All there, but not verified: everything but the last byte.
        assert_eq!(&r.next().await.unwrap().unwrap()[..], &data[3000..4999]);
        let last = tokio::spawn(async move { (r.next().await.unwrap().unwrap(), r) });
        flight.verified();
        tokio::task::yield_now().await;
        assert!(
            !last.is_finished(),
            "the last byte went out before the commit"
        );
        flight.stored(Ok(()));
        let (b, mut r) = last.await.unwrap();
        assert_eq!(&b[..], &data[4999..]);
        assert!(r.next().await.is_none());
    }

    #[tokio::test]
    async fn a_mismatch_cuts_every_follower_short() {
        let data = vec![7u8; 4000];
        let (_t, f) = file(&data);
        let flight = Flight::new(Digest::of(b"something else"), 4000);
        let (a, b) = (flight.follow(), flight.follow());
        let feed = flight.attempt(Path::Peer, f);
        feed.prefix(4000);
        let (mut ra, mut rb) = (
            a.bind(0, 4000).await.unwrap(),
            b.bind(100, 200).await.unwrap(),
        );
        assert_eq!(
            ra.next().await.unwrap().unwrap().len(),
            3999,
            "all but the last byte"
        );
        assert_eq!(&rb.next().await.unwrap().unwrap()[..], &[7u8; 99][..]);
        flight.fail(FetchError::DigestMismatch("bad".into()));
        for r in [ra, rb] {
            let (got, err) = drain(r).await;
            assert!(got.is_empty());
            assert!(err.unwrap().contains("digest mismatch"));
        }
        // A request that had not started yet gets the error as its answer.
        assert!(matches!(
            flight.follow().bind(0, 4000).await,
            Err(FetchError::DigestMismatch(_))
        ));
    }

    #[tokio::test]
    async fn a_new_attempt_cuts_readers_of_the_old_one_and_serves_new_ones() {
        let data = vec![1u8; 3000];
        let (_t1, f1) = file(&data);
        let (_t2, f2) = file(&data);
        let flight = Flight::new(Digest::of(&data), 3000);
        let early = flight.follow();
        flight.attempt(Path::Peer, f1).prefix(2000);
        let mut r = early.bind(0, 3000).await.unwrap();
        assert_eq!(r.next().await.unwrap().unwrap().len(), 2000);
        // Not yet bound: follows whichever attempt has its first byte.
        let late = flight.follow();
        let feed = flight.attempt(Path::Fabric, f2);
        let (got, err) = drain(r).await;
        assert!(got.is_empty());
        assert!(err.unwrap().contains("fetched again"));
        feed.prefix(3000);
        flight.verified();
        flight.stored(Ok(()));
        let r = late.bind(0, 3000).await.unwrap();
        assert_eq!(r.path(), Path::Fabric);
        assert_eq!(drain(r).await, (data, None));
    }

    #[tokio::test]
    async fn a_cache_hit_and_an_empty_blob_are_served_whole() {
        let (_t, f) = file(b"hello world");
        // A range is not checked (only a whole response can be).
        let c = Follower::cached(
            Digest::of(b"hello world"),
            f,
            11,
            Arc::new(|_, _| panic!("a range reported corrupt")),
        );
        assert_eq!(drain(c.bind(6, 11).await.unwrap()).await.0, b"world");
        let (_t, f) = file(b"");
        let flight = Flight::new(Digest::of(b""), 0);
        let follower = flight.follow();
        flight.attempt(Path::Direct, f);
        flight.verified();
        flight.stored(Err("disk full".into()));
        assert_eq!(
            drain(follower.bind(0, 0).await.unwrap()).await,
            (vec![], None)
        );
    }

    #[tokio::test]
    async fn after_the_verdict_a_failure_is_the_answer_and_a_match_is_served_whole() {
        let data = vec![9u8; 4000];
        // A corrupt attempt: its bytes all in, then the mismatch.
        let (_t, f) = file(&data);
        let flight = Flight::new(Digest::of(b"something else"), 4000);
        let waiting = flight.follow().after_verdict();
        let streaming = flight.follow();
        let feed = flight.attempt(Path::Fabric, f);
        feed.prefix(4000);
        let bind = tokio::spawn(waiting.bind(0, 4000));
        // The other follower has its bytes; this one has not even bound.
        let mut r = streaming.bind(0, 4000).await.unwrap();
        assert_eq!(r.next().await.unwrap().unwrap().len(), 3999);
        tokio::task::yield_now().await;
        assert!(!bind.is_finished(), "bound before the verdict");
        flight.fail(FetchError::DigestMismatch("source corrupt".into()));
        assert!(matches!(
            bind.await.unwrap(),
            Err(FetchError::DigestMismatch(m)) if m == "source corrupt"
        ));
        // A good attempt: bound at the verdict, every byte served.
        let (_t, f) = file(&data);
        let flight = Flight::new(Digest::of(&data), 4000);
        let waiting = flight.follow().after_verdict();
        let feed = flight.attempt(Path::Fabric, f);
        assert_eq!(flight.attempts(), 1);
        feed.prefix(4000);
        let bind = tokio::spawn(waiting.bind(0, 4000));
        tokio::task::yield_now().await;
        assert!(!bind.is_finished(), "bound before the verdict");
        flight.verified();
        flight.stored(Ok(()));
        assert_eq!(drain(bind.await.unwrap().unwrap()).await, (data, None));
    }

    #[tokio::test]
    async fn a_cache_hit_that_rotted_is_cut_before_its_last_piece() {
        let n = 3 * SERVE_PIECE as usize + 10;
        let data: Vec<u8> = (0..n).map(|i| (i % 253) as u8).collect();
        let d = Digest::of(&data);
        let mut rotten = data.clone();
        rotten[5] ^= 1;
        let (_t, f) = file(&rotten);
        let heard = Arc::new(std::sync::Mutex::new(None));
        let h = heard.clone();
        let c = Follower::cached(
            d,
            f,
            n as u64,
            Arc::new(move |_, actual| *h.lock().unwrap() = Some(actual)),
        );
        let (got, err) = drain(c.bind(0, n as u64).await.unwrap()).await;
        assert_eq!(
            got.len(),
            3 * SERVE_PIECE as usize,
            "all but the last piece"
        );
        assert!(err.unwrap().contains("quarantined"));
        assert_eq!(*heard.lock().unwrap(), Some(Digest::of(&rotten)));
        // An intact copy is served whole, nothing reported.
        let (_t, f) = file(&data);
        let c = Follower::cached(
            d,
            f,
            n as u64,
            Arc::new(|_, _| panic!("an intact copy reported corrupt")),
        );
        assert_eq!(
            drain(c.bind(0, n as u64).await.unwrap()).await,
            (data, None)
        );
    }

    #[tokio::test]
    async fn a_fetch_that_stopped_without_a_word_is_an_error_not_a_hang() {
        let flight = Flight::new(Digest::of(b"x"), 1);
        let follower = flight.follow();
        drop(flight);
        assert!(matches!(
            follower.bind(0, 1).await,
            Err(FetchError::Local(_))
        ));
    }
}
