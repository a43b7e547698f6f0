//! Cut-through: a blob the node agent does not hold streams to its HTTP
//! client as it arrives, instead of after the whole blob is verified.
//!
//! Every OCI client verifies a blob's digest itself (distribution-spec
//! "Pulling blobs": the client SHOULD verify the content against the digest),
//! so a mirror may stream what it has not verified yet; what it must not do is
//! *cache* it, or complete a response whose bytes are wrong. So:
//!
//! - the fetch runs on a task of its own ([`super::node::Node::blob_watched`],
//!   the same code as ever: peers, the small-blob direct path or the fabric;
//!   verified whole, committed to the cache only if it matches) and keeps
//!   going if the client leaves;
//! - the response streams the *verified prefix* (bytes written to the temp
//!   file and hashed in order) and holds back the blob's last byte until the
//!   whole blob matched its digest, so a complete response is a verified one;
//! - on a mismatch (or a failed fetch) the body ends with an error: hyper cuts
//!   the connection and the client sees a short body, never a wrong complete
//!   one; nothing is cached, `qr_node_verify_failures_total` counts it, and
//!   the client's retry starts a new fetch. A refetch the node makes by
//!   itself (one, after a mismatch) is a new attempt in a new file: a
//!   response that has sent bytes of the first attempt is cut, one that has
//!   not follows the new attempt.
//!
//! Ranged requests, requests that join a fetch already under way (they wait
//! on its single flight), and requests for a blob whose streamed fetch
//! failed within the last [`CUT_THROUGH_FAILED_FOR`] are answered once the blob is
//! whole, as before — so a client's retry after a cut gets the node's error
//! (502 `DIGEST_INVALID` naming the bad copy) rather than another cut.

use std::fs::File;
use std::sync::Arc;

use bytes::Bytes;
use hyper::body::Frame;
use tokio::sync::{oneshot, watch};

use super::client::FetchError;
use super::digest::Digest;
#[cfg(doc)]
use super::node::CUT_THROUGH_FAILED_FOR;
use super::node::{Blob, Node, Stored, Watch};

/// Bytes read from the file and handed to hyper at a time.
const PIECE: u64 = 1 << 20;

/// The fetch as the streaming response sees it.
#[derive(Clone, Debug, Default)]
struct Growing {
    /// The current attempt's temp file.
    file: Option<Arc<File>>,
    /// The blob's size.
    size: u64,
    /// Attempts started (a refetch is the second).
    attempt: u32,
    /// The current attempt's verified prefix.
    prefix: u64,
}

/// How a GET of a blob is answered.
pub enum Answer {
    /// The blob is whole already (cached, or a flight it joined finished),
    /// or could not be fetched: answered as before.
    Whole(Result<Blob, FetchError>),
    /// Streaming the verified prefix of a fetch under way.
    Streaming(Streaming),
}

/// A streaming answer: its size and its body.
pub struct Streaming {
    /// The blob's size (the response's Content-Length).
    pub size: u64,
    state: State,
}

/// Start fetching `d` under `repo` on a task of its own and wait until it
/// either finished (cache hit, error) or started writing a temp file.
pub async fn start(node: Arc<Node>, repo: String, d: Digest) -> Answer {
    let (tx, mut rx) = watch::channel(Growing::default());
    let (done_tx, mut done) = oneshot::channel();
    tokio::spawn(async move {
        let watch = Watch {
            prefix: &|n, _| tx.send_modify(|g| g.prefix = n),
            started: &|temp| {
                let file = temp.reader().ok().map(Arc::new);
                tx.send_modify(|g| {
                    g.attempt += 1;
                    g.file = file;
                    g.size = temp.size();
                    g.prefix = 0;
                });
            },
        };
        let r = node.blob_watched(&repo, &d, &watch).await;
        // A refetch, or a failure, after bytes may have been streamed: the
        // client's retry is answered whole.
        let attempts = tx.borrow().attempt;
        if r.is_err() || attempts > 1 {
            node.cut_through_failures.note(d);
        }
        let _ = done_tx.send(r);
    });
    loop {
        let started = {
            let g = rx.borrow_and_update();
            g.file.is_some().then(|| (g.size, g.attempt))
        };
        if let Some((size, attempt)) = started {
            return Answer::Streaming(Streaming {
                size,
                state: State {
                    rx,
                    done: Some(done),
                    whole: None,
                    attempt,
                    at: 0,
                    size,
                    ended: false,
                },
            });
        }
        tokio::select! {
            biased;
            r = &mut done => {
                return Answer::Whole(r.unwrap_or_else(|_| {
                    Err(FetchError::Local("the fetch task stopped".into()))
                }));
            }
            changed = rx.changed() => {
                if changed.is_err() {
                    // The task is ending: its result is next.
                    return Answer::Whole(done.await.unwrap_or_else(|_| {
                        Err(FetchError::Local("the fetch task stopped".into()))
                    }));
                }
            }
        }
    }
}

struct State {
    rx: watch::Receiver<Growing>,
    done: Option<oneshot::Receiver<Result<Blob, FetchError>>>,
    /// The verified blob once the fetch finished, and its commit.
    whole: Option<(Arc<File>, Stored)>,
    /// The attempt this response streams.
    attempt: u32,
    at: u64,
    size: u64,
    ended: bool,
}

type Item = Result<Frame<Bytes>, std::io::Error>;

impl Streaming {
    /// The response body.
    pub fn body(self) -> impl futures_util::Stream<Item = Item> + Send {
        futures_util::stream::unfold(self.state, next)
    }
}

fn cut(why: String, mut st: State) -> Option<(Item, State)> {
    st.ended = true;
    tracing::warn!("{why}: the response is cut short (the client retries)");
    Some((Err(std::io::Error::other(why)), st))
}

async fn next(mut st: State) -> Option<(Item, State)> {
    if st.ended || st.at >= st.size {
        return None;
    }
    loop {
        if let Some((file, stored)) = &mut st.whole {
            let n = (st.size - st.at).min(PIECE);
            if st.at + n == st.size {
                // The last piece waits for the commit (as a whole answer's
                // does): a client whose GET completed finds the blob cached.
                if let Err(e) = std::mem::take(stored).wait().await {
                    tracing::warn!("blob not cached: {e}");
                }
            }
            let file = file.clone();
            return read(file, st.at, n, st).await;
        }
        let (file, prefix, attempt) = {
            let g = st.rx.borrow_and_update();
            (g.file.clone(), g.prefix, g.attempt)
        };
        if attempt != st.attempt {
            if st.at > 0 {
                return cut(
                    "the blob did not match its digest and is being fetched again".into(),
                    st,
                );
            }
            st.attempt = attempt;
            continue;
        }
        // Hold back the last byte until the whole blob is verified.
        let limit = prefix.min(st.size.saturating_sub(1));
        if let Some(file) = file.filter(|_| st.at < limit) {
            let n = (limit - st.at).min(PIECE);
            return read(file, st.at, n, st).await;
        }
        let Some(done) = st.done.as_mut() else {
            return cut("the fetch ended without a result".into(), st);
        };
        tokio::select! {
            biased;
            r = done => {
                st.done = None;
                match r {
                    Ok(Ok(blob)) => {
                        let Blob { file, stored, .. } = blob;
                        st.whole = Some((Arc::new(file), stored));
                    }
                    Ok(Err(e)) => return cut(e.to_string(), st),
                    Err(_) => return cut("the fetch task stopped".into(), st),
                }
            }
            _ = st.rx.changed() => {}
        }
    }
}

/// Bytes `at..at+n` of `file`, read on a blocking thread (one copy out of
/// the page cache), as the next frame.
async fn read(file: Arc<File>, at: u64, n: u64, mut st: State) -> Option<(Item, State)> {
    let r = tokio::task::spawn_blocking(move || {
        use std::os::unix::fs::FileExt;
        let mut buf = vec![0u8; n as usize];
        file.read_exact_at(&mut buf, at).map(|()| buf)
    })
    .await
    .unwrap_or_else(|e| Err(std::io::Error::other(e)));
    match r {
        Ok(buf) => {
            st.at += n;
            Some((Ok(Frame::data(Bytes::from(buf))), st))
        }
        Err(e) => {
            st.ended = true;
            Some((Err(e), st))
        }
    }
}
