//! The replica side of the channel: sessions on one QUIC connection to a
//! master, each a control stream it opens plus the log (and, for a full sync,
//! snapshot) uni streams the master opens for it.
//!
//! A [`ReplicaConn`] accepts the master's uni streams and routes them to their
//! session by the id in their [`Frame::StreamOpen`]. A [`Session`] hands the
//! application the snapshot and the log as chunks and acknowledges each chunk
//! as it is handed out: the ack is the credit that lets the master send more
//! (docs in [`super::flow`]). Between the QUIC stream and the application sits
//! one bounded queue per stream, so the log keeps arriving while the
//! application is still busy with the snapshot, up to the credit window.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use super::error::ChannelError;
use super::frame::{ErrorCode, Frame, Previous, StreamKind};
use super::metrics::Metrics;
use super::stream::{write_frame, FrameReader};

/// Uni streams that arrived before their session claimed them, at most.
const MAX_UNCLAIMED: usize = 64;

/// Chunks buffered per stream between QUIC and the application.
const QUEUE_CHUNKS: usize = 64;

type Key = (u64, StreamKind);

#[derive(Default)]
struct Routes {
    waiting: HashMap<Key, oneshot::Sender<FrameReader>>,
    arrived: HashMap<Key, FrameReader>,
}

/// One QUIC connection to a master, carrying any number of sessions.
pub struct ReplicaConn {
    conn: quinn::Connection,
    routes: Arc<Mutex<Routes>>,
    metrics: Arc<Metrics>,
    dispatcher: JoinHandle<()>,
}

impl std::fmt::Debug for ReplicaConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicaConn")
            .field("remote", &self.conn.remote_address())
            .finish()
    }
}

impl Drop for ReplicaConn {
    fn drop(&mut self) {
        self.dispatcher.abort();
    }
}

/// How a session begins.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SyncStart {
    /// A snapshot at `position` follows, then the log from there.
    Full {
        /// Replication id.
        replid: String,
        /// Position of the snapshot.
        position: u64,
        /// The id before `replid`, if the history changed ids.
        previous: Option<Previous>,
    },
    /// The log continues from the replica's own position.
    Continue {
        /// The current replication id (the replica's own, or the one that
        /// succeeded it).
        replid: String,
        /// Where the log resumes.
        position: u64,
        /// The id before `replid`, if the history changed ids.
        previous: Option<Previous>,
    },
}

impl ReplicaConn {
    /// Route `conn`'s uni streams to sessions from now on.
    pub fn new(conn: quinn::Connection, metrics: Arc<Metrics>) -> ReplicaConn {
        let routes = Arc::new(Mutex::new(Routes::default()));
        let dispatcher = tokio::spawn(dispatch(conn.clone(), routes.clone(), metrics.clone()));
        ReplicaConn {
            conn,
            routes,
            metrics,
            dispatcher,
        }
    }

    /// The counters this connection's sessions update.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The connection.
    pub fn connection(&self) -> &quinn::Connection {
        &self.conn
    }

    fn claim(&self, key: Key) -> oneshot::Receiver<FrameReader> {
        let (tx, rx) = oneshot::channel();
        let mut r = self.routes.lock().unwrap_or_else(|e| e.into_inner());
        match r.arrived.remove(&key) {
            Some(s) => {
                let _ = tx.send(s);
            }
            None => {
                r.waiting.insert(key, tx);
            }
        }
        rx
    }

    /// Open a session: `have` is the replication id and position the
    /// application already holds (`None`: nothing, a full sync).
    pub async fn open_session(&self, have: Option<(String, u64)>) -> Result<Session, ChannelError> {
        self.open_session_in(None, have).await
    }

    /// Open a session on dataset `dataset` of a master end serving several
    /// (one per Redis Cluster shard: [`Frame::Select`]); `None` for a master
    /// end serving one.
    pub async fn open_session_in(
        &self,
        dataset: Option<&str>,
        have: Option<(String, u64)>,
    ) -> Result<Session, ChannelError> {
        let (mut send, recv) = self.conn.open_bi().await?;
        if let Some(dataset) = dataset {
            let select = Frame::Select {
                dataset: dataset.to_string(),
            };
            write_frame(&mut send, &select).await?;
        }
        let (replid, position) = match have {
            Some((r, p)) => (Some(r), p),
            None => (None, 0),
        };
        write_frame(&mut send, &Frame::Hello { replid, position }).await?;
        let mut ctl = FrameReader::new(recv);
        // The master may wait for a snapshot (it bounds that wait itself).
        let answer = ctl.expect("the master's answer").await?;
        let (session, start) = match answer {
            Frame::FullSync {
                session,
                replid,
                position,
                previous,
            } => (
                session,
                SyncStart::Full {
                    replid,
                    position,
                    previous,
                },
            ),
            Frame::Continue {
                session,
                replid,
                position,
                previous,
            } => (
                session,
                SyncStart::Continue {
                    replid,
                    position,
                    previous,
                },
            ),
            Frame::Error { code, message } => return Err(ChannelError::Remote { code, message }),
            other => {
                return Err(ChannelError::Protocol(format!(
                    "expected FullSync or Continue, got {other:?}"
                )))
            }
        };
        let log_pos = match &start {
            SyncStart::Full { position, .. } | SyncStart::Continue { position, .. } => *position,
        };
        let wait = Duration::from_secs(30);
        let log_rx = self.claim((session, StreamKind::Log));
        let snap_rx = matches!(start, SyncStart::Full { .. })
            .then(|| self.claim((session, StreamKind::Snapshot)));
        let (delivered, delivered_rx) = watch::channel(Delivered {
            log: log_pos,
            snapshot: 0,
            applied: 0,
        });
        let mut tasks = Vec::new();
        let (log_tx, log) = mpsc::channel(QUEUE_CHUNKS);
        let m = self.metrics.clone();
        let tx = log_tx.clone();
        tasks.push(tokio::spawn(async move {
            let r = async {
                let reader = tokio::time::timeout(wait, log_rx)
                    .await
                    .map_err(|_| ChannelError::Timeout("the log stream"))?
                    .map_err(|_| ChannelError::Closed)?;
                pump(reader, &tx, &m, false).await
            }
            .await;
            if let Err(e) = r {
                let _ = tx.send(Err(e)).await;
            }
        }));
        let snapshot = if let Some(snap_rx) = snap_rx {
            let (stx, srx) = mpsc::channel(QUEUE_CHUNKS);
            let m = self.metrics.clone();
            tasks.push(tokio::spawn(async move {
                let r = async {
                    let reader = tokio::time::timeout(wait, snap_rx)
                        .await
                        .map_err(|_| ChannelError::Timeout("the snapshot stream"))?
                        .map_err(|_| ChannelError::Closed)?;
                    pump(reader, &stx, &m, true).await
                }
                .await;
                if let Err(e) = r {
                    let _ = stx.send(Err(e)).await;
                }
            }));
            Some(srx)
        } else {
            None
        };
        // Control: errors from the master end the log; acks and heartbeats go out.
        let tx = log_tx;
        tasks.push(tokio::spawn(async move {
            let r: Result<(), ChannelError> = async {
                loop {
                    match ctl.next().await? {
                        None => return Err(ChannelError::Eof("the control stream")),
                        Some(Frame::Heartbeat { .. }) => {}
                        Some(Frame::Error { code, message }) => {
                            return Err(ChannelError::Remote { code, message })
                        }
                        Some(other) => {
                            return Err(ChannelError::Protocol(format!(
                                "unexpected {other:?} on the control stream"
                            )))
                        }
                    }
                }
            }
            .await;
            if let Err(e) = r {
                let _ = tx.send(Err(e)).await;
            }
        }));
        tasks.push(tokio::spawn(send_acks(send, delivered_rx)));
        Ok(Session {
            start,
            snapshot,
            snapshot_done: false,
            log,
            delivered,
            tasks,
        })
    }
}

/// Accept the master's uni streams and hand each to its session.
async fn dispatch(conn: quinn::Connection, routes: Arc<Mutex<Routes>>, metrics: Arc<Metrics>) {
    while let Ok(recv) = conn.accept_uni().await {
        let routes = routes.clone();
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let mut reader = FrameReader::new(recv);
            let first = tokio::time::timeout(Duration::from_secs(10), reader.next()).await;
            let key = match first {
                Ok(Ok(Some(Frame::StreamOpen { session, kind, .. }))) => (session, kind),
                other => {
                    metrics.malformed.fetch_add(1, Relaxed);
                    tracing::warn!("kv replica: a uni stream did not open properly: {other:?}");
                    return;
                }
            };
            let mut r = routes.lock().unwrap_or_else(|e| e.into_inner());
            match r.waiting.remove(&key) {
                Some(tx) => {
                    let _ = tx.send(reader);
                }
                None if r.arrived.len() < MAX_UNCLAIMED => {
                    r.arrived.insert(key, reader);
                }
                None => tracing::warn!("kv replica: too many unclaimed streams; dropped one"),
            }
        });
    }
}

/// Move one stream's data frames into its queue.
async fn pump(
    mut reader: FrameReader,
    tx: &mpsc::Sender<Result<Bytes, ChannelError>>,
    metrics: &Metrics,
    snapshot: bool,
) -> Result<(), ChannelError> {
    let mut got = 0u64;
    loop {
        let next = match reader.next().await {
            Ok(f) => f,
            Err(e) => {
                // A reset stream: let the control stream's reason arrive first.
                tokio::time::sleep(Duration::from_millis(200)).await;
                return Err(e);
            }
        };
        match next {
            Some(Frame::Data(b)) => {
                got += b.len() as u64;
                let counter = if snapshot {
                    &metrics.snapshot_bytes
                } else {
                    &metrics.log_bytes
                };
                counter.fetch_add(b.len() as u64, Relaxed);
                tx.send(Ok(b)).await.map_err(|_| ChannelError::Closed)?;
            }
            Some(Frame::SnapshotEnd { length }) if snapshot => {
                if length != got {
                    return Err(ChannelError::Protocol(format!(
                        "snapshot ended at {length} bytes, {got} arrived"
                    )));
                }
                // An empty chunk marks the end for the session.
                tx.send(Ok(Bytes::new()))
                    .await
                    .map_err(|_| ChannelError::Closed)?;
                return Ok(());
            }
            Some(other) => {
                return Err(ChannelError::Protocol(format!(
                    "unexpected {other:?} on a data stream"
                )))
            }
            None => {
                // The master closes data streams after saying why on the
                // control stream; give that reason time to arrive first.
                tokio::time::sleep(Duration::from_millis(200)).await;
                return Err(ChannelError::Eof("a data stream"));
            }
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Delivered {
    log: u64,
    snapshot: u64,
    applied: u64,
}

/// Send an Ack whenever delivery advances, and a heartbeat every second.
async fn send_acks(mut send: quinn::SendStream, mut rx: watch::Receiver<Delivered>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            r = rx.changed() => {
                if r.is_err() {
                    return;
                }
                let d = *rx.borrow_and_update();
                let f = Frame::Ack { log: d.log, snapshot: d.snapshot, applied: d.applied };
                if write_frame(&mut send, &f).await.is_err() {
                    return;
                }
            }
            _ = tick.tick() => {
                let position = rx.borrow().log;
                if write_frame(&mut send, &Frame::Heartbeat { position }).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// One replication session, from the replica's side.
pub struct Session {
    /// How it began.
    pub start: SyncStart,
    snapshot: Option<mpsc::Receiver<Result<Bytes, ChannelError>>>,
    snapshot_done: bool,
    log: mpsc::Receiver<Result<Bytes, ChannelError>>,
    delivered: watch::Sender<Delivered>,
    tasks: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("start", &self.start)
            .finish()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Session {
    /// The next snapshot chunk; `Ok(None)` once it is complete (and always for
    /// a partial resync).
    pub async fn next_snapshot(&mut self) -> Result<Option<Bytes>, ChannelError> {
        if self.snapshot_done {
            return Ok(None);
        }
        let Some(rx) = self.snapshot.as_mut() else {
            return Ok(None);
        };
        match rx.recv().await {
            Some(Ok(b)) if b.is_empty() => {
                self.snapshot_done = true;
                Ok(None)
            }
            Some(Ok(b)) => {
                let n = b.len() as u64;
                self.delivered.send_modify(|d| d.snapshot += n);
                Ok(Some(b))
            }
            Some(Err(e)) => Err(e),
            None => Err(ChannelError::Closed),
        }
    }

    /// The next log chunk (in order, from the start position); an error when
    /// the session ends.
    pub async fn next_log(&mut self) -> Result<Bytes, ChannelError> {
        match self.log.recv().await {
            Some(Ok(b)) => {
                let n = b.len() as u64;
                self.delivered.send_modify(|d| d.log += n);
                Ok(b)
            }
            Some(Err(e)) => Err(e),
            None => Err(ChannelError::Closed),
        }
    }

    /// Log position delivered so far.
    pub fn position(&self) -> u64 {
        self.delivered.borrow().log
    }

    /// Report the final consumer's applied position (shown as lag on the master).
    pub fn applied(&self, position: u64) {
        self.delivered.send_if_modified(|d| {
            let changed = d.applied != position;
            d.applied = position;
            changed
        });
    }

    /// Whether the master ended the session because the replica needs a full
    /// resync (its position left the backlog, or the data started anew).
    pub fn needs_full_resync(e: &ChannelError) -> bool {
        matches!(
            e,
            ChannelError::Remote {
                code: ErrorCode::BeyondBacklog | ErrorCode::Reset,
                ..
            }
        )
    }
}
