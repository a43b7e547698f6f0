//! The master side of the channel: one log and its backlog, the current
//! snapshot, and a session per replica, each at its own position.
//!
//! The application feeds it ([`Master::reset`] when its data starts anew,
//! [`Master::begin_snapshot`], [`Master::append`]) and hands it QUIC
//! connections ([`Master::serve`]). A replica opens a bidirectional control
//! stream and says what it has ([`Frame::Hello`]); [`decide`] answers with a
//! partial resync when the backlog still holds its position, else a full sync
//! from a snapshot whose position the backlog holds — asking the application
//! for a fresh one ([`Master::snapshot_wanted`]) when the stored one is too
//! old. The log and the snapshot then travel on two uni streams, each bounded
//! by the replica's acks ([`super::flow::Credit`]).

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::watch;

use super::backlog::Backlog;
use super::error::ChannelError;
use super::flow::{ChunkSizer, Credit};
use super::frame::{ErrorCode, Frame, Previous, StreamKind};
use super::metrics::{Metrics, ReplicaStatus};
use super::snapshot::{Keep, Snapshot, SnapshotWriter};
use super::stream::{write_data, write_frame, FrameReader};

/// Settings of a [`Master`].
#[derive(Clone, Debug)]
pub struct MasterConfig {
    /// Backlog capacity in bytes (partial resync reach).
    pub backlog: u64,
    /// Credit window per stream: sent-but-unacked bytes allowed.
    pub window: u64,
    /// Where snapshot files go.
    pub snapshot_dir: PathBuf,
    /// How long a full sync waits for a usable snapshot before giving up.
    pub snapshot_wait: Duration,
    /// Interval of heartbeats on the control stream.
    pub heartbeat: Duration,
    /// Whether the latest finished snapshot is kept in `snapshot_dir` for a
    /// restarted process ([`Master::restore`]).
    pub keep: Keep,
}

impl MasterConfig {
    /// Defaults: 64 MiB backlog, 16 MiB window, 120 s snapshot wait, 1 s heartbeat.
    pub fn new(snapshot_dir: PathBuf) -> MasterConfig {
        MasterConfig {
            backlog: 64 << 20,
            window: 16 << 20,
            snapshot_dir,
            snapshot_wait: Duration::from_secs(120),
            heartbeat: Duration::from_secs(1),
            keep: Keep::No,
        }
    }
}

/// What a master answers a replica's [`Frame::Hello`] (sans-IO: see [`decide`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Partial resync from the replica's own position.
    Continue {
        /// Where the log resumes.
        position: u64,
    },
    /// Full sync from the stored snapshot at `position`.
    Full {
        /// The snapshot's position.
        position: u64,
    },
    /// A full sync is needed and no usable snapshot exists: ask for one, wait.
    NeedSnapshot,
    /// The master has no data yet: wait.
    NoData,
    /// The replica is ahead of this master's head in the same history (the
    /// master restarted behind it and is catching up): wait a little for the
    /// head to pass it, then fall back to a full sync.
    Ahead,
}

/// The master's current data, as [`decide`] sees it.
#[derive(Clone, Copy, Debug)]
pub struct View<'a> {
    /// Current replication id, `None` before any data.
    pub replid: Option<&'a str>,
    /// The id before it and the last position valid under that id (PSYNC2).
    pub previous: Option<(&'a str, u64)>,
    /// Backlog range `[start, head]`.
    pub backlog: (u64, u64),
    /// The stored snapshot: its replid, position, and whether it failed.
    pub snapshot: Option<(&'a str, u64, bool)>,
    /// Waiting for a replica ahead of the head is over: decide without it.
    pub snapshot_only: bool,
}

/// The resync decision: partial when the backlog holds the replica's
/// position and that position belongs to our history — under our current
/// id, or under the previous one no later than where it ended (Redis
/// replication.c `masterTryPartialResynchronization`: the replica's id is
/// `replid`, or `replid2` with an offset up to `second_replid_offset`); else
/// full from a snapshot the backlog can continue (its position within the
/// backlog, taken under either id by the same rule).
pub fn decide(view: View<'_>, hello_replid: Option<&str>, hello_position: u64) -> Decision {
    let Some(replid) = view.replid else {
        return Decision::NoData;
    };
    let held = |p: u64| (view.backlog.0..=view.backlog.1).contains(&p);
    let ours = |id: &str, p: u64| in_history(replid, view.previous, id, p);
    if hello_replid.is_some_and(|id| ours(id, hello_position)) {
        if held(hello_position) {
            return Decision::Continue {
                position: hello_position,
            };
        }
        if hello_position > view.backlog.1 && !view.snapshot_only {
            return Decision::Ahead;
        }
    }
    match view.snapshot {
        Some((r, p, false)) if ours(r, p) && held(p) => Decision::Full { position: p },
        _ => Decision::NeedSnapshot,
    }
}

/// Whether position `p` under replication id `id` belongs to the history of
/// a master whose id is `current` and whose previous id ended at the given
/// position (PSYNC2, Redis replication.c `masterTryPartialResynchronization`:
/// the id is `replid`, or `replid2` at an offset up to `second_replid_offset`).
pub fn in_history(current: &str, previous: Option<(&str, u64)>, id: &str, p: u64) -> bool {
    id == current || previous.is_some_and(|(prev, end)| id == prev && p <= end)
}

/// The master side: cheap to clone (all clones share state).
#[derive(Clone, Debug)]
pub struct Master {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    cfg: MasterConfig,
    state: Mutex<State>,
    /// Bumped on every change replicas may wait for.
    version: watch::Sender<u64>,
    metrics: Arc<Metrics>,
}

#[derive(Debug)]
struct State {
    replid: Option<String>,
    /// The id before `replid` and the last position valid under it.
    previous: Option<Previous>,
    epoch: u64,
    backlog: Backlog,
    /// (position, when appended), sampled, for lag in seconds; bounded.
    times: VecDeque<(u64, Instant)>,
    snapshot: Option<Arc<Snapshot>>,
    want_snapshot: bool,
}

/// Session ids, unique in the process: the masters of several datasets
/// (a cluster's shards) serve sessions on one QUIC connection, whose
/// replica end routes uni streams by this id alone.
static NEXT_SESSION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// A session's start, as [`Master::negotiate`] settled it.
struct Negotiated {
    decision: Decision,
    /// The data's epoch then (a reset ends the session).
    epoch: u64,
    session: u64,
    /// The current id then (a switch ends the session).
    replid: String,
    previous: Option<Previous>,
    /// The snapshot a full sync sends.
    snapshot: Option<Arc<Snapshot>>,
}

/// The first frame of a session's control stream, within 10 s.
pub(crate) async fn first_frame(ctl: &mut FrameReader) -> Result<Frame, ChannelError> {
    tokio::time::timeout(Duration::from_secs(10), ctl.expect("hello"))
        .await
        .map_err(|_| ChannelError::Timeout("the replica's hello"))?
}

/// Tell the replica why its session is refused, and close the control stream.
pub(crate) async fn refuse(ctl_send: &mut quinn::SendStream, code: ErrorCode, e: &ChannelError) {
    let _ = write_frame(
        ctl_send,
        &Frame::Error {
            code,
            message: e.to_string(),
        },
    )
    .await;
    let _ = ctl_send.finish();
    // Let the error frame leave before the stream is dropped.
    let _ = tokio::time::timeout(Duration::from_secs(1), ctl_send.stopped()).await;
}

/// How long a replica ahead of the head waits for it (see [`Decision::Ahead`]).
const AHEAD_WAIT: Duration = Duration::from_secs(10);

/// Samples kept for lag-in-seconds (one per append, at most every 10 ms).
const TIME_SAMPLES: usize = 4096;

impl State {
    fn view(&self, snapshot_only: bool) -> View<'_> {
        View {
            snapshot_only,
            replid: self.replid.as_deref(),
            previous: self
                .previous
                .as_ref()
                .map(|p| (p.replid.as_str(), p.position)),
            backlog: (self.backlog.start(), self.backlog.head()),
            snapshot: self
                .snapshot
                .as_ref()
                .map(|s| (s.replid.as_str(), s.position, s.failed())),
        }
    }

    /// When the byte at `position` was appended (the first sample at or after it).
    fn age_of(&self, position: u64, now: Instant) -> f64 {
        if position >= self.backlog.head() {
            return 0.0;
        }
        let i = self.times.partition_point(|&(p, _)| p <= position);
        let at = self.times.get(i.saturating_sub(1)).map(|&(_, t)| t);
        at.map_or(0.0, |t| now.saturating_duration_since(t).as_secs_f64())
    }
}

impl Master {
    /// A master with no data yet.
    pub fn new(cfg: MasterConfig, metrics: Arc<Metrics>) -> Master {
        let backlog = Backlog::new(0, cfg.backlog);
        let (version, _) = watch::channel(0);
        Master {
            shared: Arc::new(Shared {
                cfg,
                state: Mutex::new(State {
                    replid: None,
                    previous: None,
                    epoch: 0,
                    backlog,
                    times: VecDeque::new(),
                    snapshot: None,
                    want_snapshot: false,
                }),
                version,
                metrics,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bump(&self) {
        self.shared.version.send_modify(|v| *v += 1);
    }

    /// The settings it was made with.
    pub fn config(&self) -> &MasterConfig {
        &self.shared.cfg
    }

    /// The metrics this master updates.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.shared.metrics
    }

    /// The data starts anew as `replid` at `position` (a new epoch): the
    /// backlog and snapshot are dropped and every session ends with `Reset`.
    /// `previous`: the id this history continues, if known (a relay resuming
    /// from its saved state).
    pub fn reset(&self, replid: &str, position: u64, previous: Option<Previous>) {
        self.start_epoch(replid, position, previous, None);
    }

    /// [`Master::reset`] with `snapshot` as the stored one, in one step, so
    /// no session sees the new epoch without it (and asks for a fetch).
    fn start_epoch(
        &self,
        replid: &str,
        position: u64,
        previous: Option<Previous>,
        snapshot: Option<Arc<Snapshot>>,
    ) {
        let mut st = self.lock();
        st.replid = Some(replid.to_string());
        st.previous = previous;
        st.epoch += 1;
        st.backlog = Backlog::new(position, self.shared.cfg.backlog);
        st.times.clear();
        st.snapshot = snapshot;
        self.shared.metrics.head.store(position, Relaxed);
        self.shared.metrics.backlog_bytes.store(0, Relaxed);
        drop(st);
        self.bump();
    }

    /// [`Master::reset`] to `replid` at `position` (at most the kept
    /// `snapshot`'s), with that snapshot stored for full syncs: a restarted
    /// relay serves the snapshot it kept while its source's log can still
    /// continue it.
    pub fn restore(
        &self,
        replid: &str,
        position: u64,
        previous: Option<Previous>,
        snapshot: Arc<Snapshot>,
    ) {
        let start = position.min(snapshot.position);
        self.start_epoch(replid, start, previous, Some(snapshot));
    }

    /// The history goes on under `replid` from the head (PSYNC2: the source
    /// restarted or failed over and answered `+CONTINUE <new id>`): the
    /// current id becomes the previous one, valid up to the head; backlog
    /// and snapshot stay. Every session ends with `Switched`, so each
    /// replica reconnects and learns the new id by a partial resync.
    pub fn switch_id(&self, replid: &str) {
        let mut st = self.lock();
        if st.replid.as_deref() == Some(replid) {
            return;
        }
        let head = st.backlog.head();
        st.previous = st.replid.take().map(|r| Previous {
            replid: r,
            position: head,
        });
        st.replid = Some(replid.to_string());
        drop(st);
        self.bump();
    }

    /// The current id, the head, and the previous id if any.
    pub fn history(&self) -> (Option<String>, u64, Option<Previous>) {
        let st = self.lock();
        (st.replid.clone(), st.backlog.head(), st.previous.clone())
    }

    /// Start a new snapshot of `replid` at `position` (which the backlog must
    /// hold, so its log can follow); it replaces the stored one for new full
    /// syncs at once, and sessions stream it while it is written.
    pub fn begin_snapshot(
        &self,
        replid: &str,
        position: u64,
    ) -> Result<SnapshotWriter, ChannelError> {
        let mut st = self.lock();
        if st.replid.as_deref() != Some(replid) {
            return Err(ChannelError::Snapshot(format!(
                "snapshot of replication id {replid}, the log is {:?}",
                st.replid
            )));
        }
        if !st.backlog.contains(position) && position < st.backlog.start() {
            return Err(ChannelError::Snapshot(format!(
                "snapshot at {position} is older than the backlog (from {})",
                st.backlog.start()
            )));
        }
        let (snap, writer) = Snapshot::create(
            &self.shared.cfg.snapshot_dir,
            replid,
            position,
            self.shared.cfg.keep,
        )?;
        st.snapshot = Some(snap);
        st.want_snapshot = false;
        drop(st);
        self.bump();
        Ok(writer)
    }

    /// Append log bytes at the head.
    pub fn append(&self, data: Bytes) {
        if data.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut st = self.lock();
        let at = st.backlog.head();
        let n = data.len() as u64;
        st.backlog.append(data);
        if st
            .times
            .back()
            .is_none_or(|&(_, t)| now - t >= Duration::from_millis(10))
        {
            if st.times.len() == TIME_SAMPLES {
                st.times.pop_front();
            }
            st.times.push_back((at, now));
        }
        let start = st.backlog.start();
        while st.times.len() > 1 && st.times[1].0 <= start {
            st.times.pop_front();
        }
        self.shared.metrics.head.store(st.backlog.head(), Relaxed);
        self.shared
            .metrics
            .backlog_bytes
            .store(st.backlog.len(), Relaxed);
        self.shared.metrics.log_bytes.fetch_add(n, Relaxed);
        drop(st);
        self.bump();
    }

    /// Current replication id and head position.
    pub fn position(&self) -> (Option<String>, u64) {
        let st = self.lock();
        (st.replid.clone(), st.backlog.head())
    }

    /// Where every live replica could resume from: the lowest position any
    /// session's final consumer reports applied (its acked position when it
    /// reports nothing). `None` when no session is live.
    pub fn resume_point(&self) -> Option<u64> {
        self.shared
            .metrics
            .replicas()
            .values()
            .map(|r| {
                if r.applied > 0 {
                    r.applied.min(r.acked)
                } else {
                    r.acked
                }
            })
            .min()
    }

    /// Wait until a full sync needs a fresh snapshot (the stored one is gone
    /// or older than the backlog); the application then calls
    /// [`Master::begin_snapshot`].
    pub async fn snapshot_wanted(&self) {
        let mut rx = self.shared.version.subscribe();
        loop {
            if self.lock().want_snapshot {
                return;
            }
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Serve replica sessions on `conn` until it closes.
    pub async fn serve(&self, conn: quinn::Connection) -> Result<(), ChannelError> {
        while let Some((send, recv)) = next_session(&conn).await? {
            let (master, conn) = (self.clone(), conn.clone());
            tokio::spawn(async move {
                if let Err(e) = master.session(conn, send, recv).await {
                    master.shared.metrics.link_errors.fetch_add(1, Relaxed);
                    if matches!(e, ChannelError::Frame(_) | ChannelError::Protocol(_)) {
                        master.shared.metrics.malformed.fetch_add(1, Relaxed);
                    }
                    tracing::info!("kv master: session ended: {e}");
                }
            });
        }
        Ok(())
    }

    async fn session(
        &self,
        conn: quinn::Connection,
        mut ctl_send: quinn::SendStream,
        ctl_recv: quinn::RecvStream,
    ) -> Result<(), ChannelError> {
        let mut ctl = FrameReader::new(ctl_recv);
        let hello = first_frame(&mut ctl).await?;
        if let Frame::Select { dataset } = &hello {
            // A downstream relay of a cluster talking to a single-master one.
            let e = ChannelError::Protocol(format!(
                "this upstream relay follows one Redis master, not a cluster: it has no \
                 shard {dataset:?} (run it with --cluster, or the downstream without --shard)"
            ));
            refuse(&mut ctl_send, ErrorCode::Unavailable, &e).await;
            return Err(e);
        }
        self.serve_session(conn, ctl_send, ctl, hello).await
    }

    /// Serve one session whose first frame (after any [`Frame::Select`]) was
    /// `hello`, read from `ctl`.
    pub(crate) async fn serve_session(
        &self,
        conn: quinn::Connection,
        mut ctl_send: quinn::SendStream,
        mut ctl: FrameReader,
        hello: Frame,
    ) -> Result<(), ChannelError> {
        let Frame::Hello { replid, position } = hello else {
            return Err(ChannelError::Protocol(format!(
                "expected Hello first, got {hello:?}"
            )));
        };
        // The replica's label in /metrics and /status: the downstream
        // relay's certificate name, else its fabric address.
        let peer = crate::access::Identity::of(&conn)
            .and_then(|i| i.names().first().cloned())
            .unwrap_or_else(|| conn.remote_address().to_string());
        let Negotiated {
            decision,
            epoch,
            session,
            replid: my_replid,
            previous,
            snapshot,
        } = match self.negotiate(replid.as_deref(), position).await {
            Ok(d) => d,
            Err(e) => {
                let _ = write_frame(
                    &mut ctl_send,
                    &Frame::Error {
                        code: ErrorCode::Unavailable,
                        message: e.to_string(),
                    },
                )
                .await;
                let _ = ctl_send.finish();
                return Err(e);
            }
        };
        let m = &self.shared.metrics;
        let (start, full) = match decision {
            Decision::Continue { position } => {
                m.sync_partial_ok.fetch_add(1, Relaxed);
                write_frame(
                    &mut ctl_send,
                    &Frame::Continue {
                        session,
                        replid: my_replid.clone(),
                        position,
                        previous,
                    },
                )
                .await?;
                (position, false)
            }
            Decision::Full { position } => {
                m.sync_full.fetch_add(1, Relaxed);
                if replid.is_some() {
                    m.sync_partial_err.fetch_add(1, Relaxed);
                }
                write_frame(
                    &mut ctl_send,
                    &Frame::FullSync {
                        session,
                        replid: my_replid.clone(),
                        position,
                        previous,
                    },
                )
                .await?;
                (position, true)
            }
            Decision::NeedSnapshot | Decision::NoData | Decision::Ahead => {
                unreachable!("negotiate waits these out")
            }
        };
        m.set_replica(
            session,
            ReplicaStatus {
                acked: start,
                full,
                peer: peer.clone(),
                ..ReplicaStatus::default()
            },
        );
        let (acks_tx, acks_rx) = watch::channel((start, 0u64));
        // The data streams outlive the select below: when a session ends in
        // error, the reason goes out on the control stream before they close,
        // so the replica learns why rather than seeing a stream end early.
        let mut log_uni = conn.open_uni().await?;
        let mut snap_uni = match &snapshot {
            Some(_) => Some(conn.open_uni().await?),
            None => None,
        };
        let result = tokio::select! {
            r = self.send_log(&mut log_uni, session, (epoch, &my_replid), start, acks_rx.clone()) => r,
            r = async {
                // A finished snapshot ends nothing: the log goes on.
                match (snapshot, snap_uni.as_mut()) {
                    (Some(s), Some(uni)) => match self.send_snapshot(uni, session, s, acks_rx.clone()).await {
                        Ok(()) => std::future::pending().await,
                        Err(e) => Err(e),
                    },
                    _ => std::future::pending().await,
                }
            } => r,
            r = self.read_acks(&mut ctl, (session, full, &peer), acks_tx) => r,
            r = self.heartbeats(&mut ctl_send) => r,
        };
        m.remove_replica(session);
        if let Err(e) = &result {
            let code = match e {
                ChannelError::Remote { .. } | ChannelError::Connection(_) => None,
                ChannelError::Protocol(_) | ChannelError::Frame(_) => Some(ErrorCode::Protocol),
                ChannelError::BeyondBacklog { .. } => Some(ErrorCode::BeyondBacklog),
                ChannelError::Reset => Some(ErrorCode::Reset),
                ChannelError::Switched => Some(ErrorCode::Switched),
                _ => Some(ErrorCode::Unavailable),
            };
            if let Some(code) = code {
                refuse(&mut ctl_send, code, e).await;
            }
        }
        result
    }

    /// Decide, waiting (bounded) for data or a snapshot when needed.
    async fn negotiate(
        &self,
        replid: Option<&str>,
        position: u64,
    ) -> Result<Negotiated, ChannelError> {
        let mut rx = self.shared.version.subscribe();
        let now = tokio::time::Instant::now();
        let deadline = now + self.shared.cfg.snapshot_wait;
        // A replica ahead of us waits this long for the head to reach it.
        let ahead_until = now + AHEAD_WAIT;
        loop {
            let ahead = {
                let mut st = self.lock();
                let give_up_ahead = tokio::time::Instant::now() >= ahead_until;
                let d = decide(st.view(give_up_ahead), replid, position);
                match d {
                    Decision::Continue { .. } | Decision::Full { .. } => {
                        let session = NEXT_SESSION.fetch_add(1, Relaxed);
                        let snap = matches!(d, Decision::Full { .. })
                            .then(|| st.snapshot.clone())
                            .flatten();
                        return Ok(Negotiated {
                            decision: d,
                            epoch: st.epoch,
                            session,
                            replid: st.replid.clone().unwrap_or_default(),
                            previous: st.previous.clone(),
                            snapshot: snap,
                        });
                    }
                    Decision::NeedSnapshot => {
                        if !st.want_snapshot {
                            st.want_snapshot = true;
                            drop(st);
                            self.bump();
                        }
                        false
                    }
                    Decision::NoData => false,
                    Decision::Ahead => true,
                }
            };
            if ahead {
                // Wake at the give-up time even if nothing is appended.
                let _ = tokio::time::timeout_at(ahead_until, rx.changed()).await;
                continue;
            }
            if tokio::time::timeout_at(deadline, rx.changed())
                .await
                .is_err()
            {
                return Err(ChannelError::Timeout(
                    "no snapshot the backlog can continue became available",
                ));
            }
        }
    }

    /// Take the replica's ack of `position` on one stream: free credit,
    /// record the turnaround, and feed the chunk sizer (log and snapshot alike).
    fn take_ack(&self, credit: &mut Credit, sizer: &mut ChunkSizer, position: u64) {
        let now = Instant::now();
        let rtt = credit.on_ack(position, now);
        if let Some(r) = rtt {
            self.shared.metrics.turnaround(r);
        }
        sizer.on_ack(credit.acked(), rtt, now);
    }

    async fn send_log(
        &self,
        uni: &mut quinn::SendStream,
        session: u64,
        (epoch, replid): (u64, &str),
        start: u64,
        mut acks: watch::Receiver<(u64, u64)>,
    ) -> Result<(), ChannelError> {
        write_frame(
            uni,
            &Frame::StreamOpen {
                session,
                kind: StreamKind::Log,
                position: start,
            },
        )
        .await?;
        let mut credit = Credit::new(start, self.shared.cfg.window);
        let mut sizer = ChunkSizer::new();
        let mut version = self.shared.version.subscribe();
        loop {
            let (log_ack, _) = *acks.borrow_and_update();
            self.take_ack(&mut credit, &mut sizer, log_ack);
            let avail = credit.available();
            let mut chunk = None;
            if avail > 0 {
                version.borrow_and_update();
                let st = self.lock();
                if st.epoch != epoch {
                    return Err(ChannelError::Reset);
                }
                if st.replid.as_deref() != Some(replid) {
                    return Err(ChannelError::Switched);
                }
                match st
                    .backlog
                    .read(credit.sent(), sizer.chunk().min(avail as usize))
                {
                    None => {
                        return Err(ChannelError::BeyondBacklog {
                            position: credit.sent(),
                            start: st.backlog.start(),
                        })
                    }
                    Some(b) if b.is_empty() => {}
                    Some(b) => chunk = Some(b),
                }
            }
            match chunk {
                Some(b) => {
                    let n = b.len() as u64;
                    write_data(uni, b).await?;
                    credit.on_send(n, Instant::now());
                }
                None => {
                    tokio::select! {
                        r = version.changed() => if r.is_err() { return Ok(()) },
                        r = acks.changed() => if r.is_err() { return Ok(()) },
                    }
                }
            }
        }
    }

    async fn send_snapshot(
        &self,
        uni: &mut quinn::SendStream,
        session: u64,
        snap: Arc<Snapshot>,
        mut acks: watch::Receiver<(u64, u64)>,
    ) -> Result<(), ChannelError> {
        write_frame(
            uni,
            &Frame::StreamOpen {
                session,
                kind: StreamKind::Snapshot,
                position: 0,
            },
        )
        .await?;
        let mut reader = snap.reader();
        let mut credit = Credit::new(0, self.shared.cfg.window);
        let mut sizer = ChunkSizer::new();
        loop {
            let (_, snap_ack) = *acks.borrow_and_update();
            self.take_ack(&mut credit, &mut sizer, snap_ack);
            let avail = credit.available() as usize;
            if avail == 0 {
                if acks.changed().await.is_err() {
                    return Ok(());
                }
                continue;
            }
            match reader.next(sizer.chunk().min(avail)).await? {
                Some(b) => {
                    let n = b.len() as u64;
                    write_data(uni, b).await?;
                    credit.on_send(n, Instant::now());
                    self.shared.metrics.snapshot_bytes.fetch_add(n, Relaxed);
                }
                None => {
                    write_frame(
                        uni,
                        &Frame::SnapshotEnd {
                            length: reader.position(),
                        },
                    )
                    .await?;
                    let _ = uni.finish();
                    return Ok(());
                }
            }
        }
    }

    /// Read the replica's acks of session `(id, began with a full sync,
    /// peer)`, publishing them and its status row.
    async fn read_acks(
        &self,
        ctl: &mut FrameReader,
        (session, full, peer): (u64, bool, &str),
        acks: watch::Sender<(u64, u64)>,
    ) -> Result<(), ChannelError> {
        loop {
            match ctl.next().await? {
                None => return Ok(()),
                Some(Frame::Ack {
                    log,
                    snapshot,
                    applied,
                }) => {
                    acks.send_replace((log, snapshot));
                    let st = self.lock();
                    let head = st.backlog.head();
                    let lag_seconds = st.age_of(log, Instant::now());
                    drop(st);
                    self.shared.metrics.set_replica(
                        session,
                        ReplicaStatus {
                            acked: log,
                            applied,
                            lag_bytes: head.saturating_sub(log),
                            lag_seconds,
                            snapshot_acked: snapshot,
                            full,
                            peer: peer.to_string(),
                        },
                    );
                }
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

    async fn heartbeats(&self, ctl_send: &mut quinn::SendStream) -> Result<(), ChannelError> {
        let mut tick = tokio::time::interval(self.shared.cfg.heartbeat);
        loop {
            tick.tick().await;
            let position = self.lock().backlog.head();
            write_frame(ctl_send, &Frame::Heartbeat { position }).await?;
        }
    }
}

/// The next session (its control stream) a replica opens on `conn`; `None`
/// once the connection is closed by either end in the ordinary way.
pub(crate) async fn next_session(
    conn: &quinn::Connection,
) -> Result<Option<(quinn::SendStream, quinn::RecvStream)>, ChannelError> {
    match conn.accept_bi().await {
        Ok(s) => Ok(Some(s)),
        Err(
            quinn::ConnectionError::ApplicationClosed(_) | quinn::ConnectionError::LocallyClosed,
        ) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view<'a>(snapshot: Option<(&'a str, u64, bool)>) -> View<'a> {
        View {
            replid: Some("A"),
            previous: None,
            backlog: (100, 200),
            snapshot,
            snapshot_only: false,
        }
    }

    #[test]
    fn partial_when_the_backlog_holds_the_position() {
        assert_eq!(
            decide(view(None), Some("A"), 100),
            Decision::Continue { position: 100 }
        );
        assert_eq!(
            decide(view(None), Some("A"), 200),
            Decision::Continue { position: 200 }
        );
    }

    #[test]
    fn the_previous_id_continues_up_to_where_it_ended() {
        // The history switched from "OLD" to "A" at 150 (a restart, a failover).
        let v = View {
            previous: Some(("OLD", 150)),
            ..view(Some(("OLD", 120, false)))
        };
        assert_eq!(
            decide(v, Some("OLD"), 150),
            Decision::Continue { position: 150 }
        );
        assert_eq!(
            decide(v, Some("OLD"), 120),
            Decision::Continue { position: 120 }
        );
        // Past the switch, the old id's history diverged: full sync, from
        // the snapshot taken under the old id before the switch.
        assert_eq!(
            decide(v, Some("OLD"), 151),
            Decision::Full { position: 120 }
        );
        // Out of the backlog under either id: full.
        assert_eq!(decide(v, Some("OLD"), 99), Decision::Full { position: 120 });
        // A snapshot of the old id after its end is not ours.
        let late = View {
            previous: Some(("OLD", 150)),
            ..view(Some(("OLD", 160, false)))
        };
        assert_eq!(decide(late, None, 0), Decision::NeedSnapshot);
    }

    #[test]
    fn full_otherwise_from_a_snapshot_the_backlog_continues() {
        let snap = Some(("A", 150, false));
        assert_eq!(
            decide(view(snap), Some("A"), 99),
            Decision::Full { position: 150 }
        );
        assert_eq!(
            decide(view(snap), Some("B"), 150),
            Decision::Full { position: 150 }
        );
        assert_eq!(
            decide(view(snap), None, 0),
            Decision::Full { position: 150 }
        );
        // Ahead of the head in our history: wait for it, unless told not to.
        assert_eq!(decide(view(snap), Some("A"), 201), Decision::Ahead);
        let impatient = View {
            snapshot_only: true,
            ..view(snap)
        };
        assert_eq!(
            decide(impatient, Some("A"), 201),
            Decision::Full { position: 150 }
        );
        // Too old, another id, or failed: ask for a fresh one.
        assert_eq!(
            decide(view(Some(("A", 99, false))), None, 0),
            Decision::NeedSnapshot
        );
        assert_eq!(
            decide(view(Some(("B", 150, false))), None, 0),
            Decision::NeedSnapshot
        );
        assert_eq!(
            decide(view(Some(("A", 150, true))), None, 0),
            Decision::NeedSnapshot
        );
        assert_eq!(decide(view(None), None, 0), Decision::NeedSnapshot);
        let empty = View {
            replid: None,
            previous: None,
            backlog: (0, 0),
            snapshot: None,
            snapshot_only: false,
        };
        assert_eq!(decide(empty, None, 0), Decision::NoData);
    }
}
