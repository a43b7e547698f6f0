//! The downstream relay's links to real Redis replicas: it is their master
//! (replication.c `syncCommand` / `masterTryPartialResynchronization` is what
//! it stands in for). Each replica's `PSYNC <replid> <offset>` becomes a
//! channel session asking the upstream relay for exactly that; the answer
//! becomes `+FULLRESYNC <replid> <offset>` plus the snapshot (always in the
//! diskless `$EOF:<mark>` form, which needs no length up front) or
//! `+CONTINUE <replid>`; then the command stream follows, and the replica's
//! `REPLCONF ACK <offset>` is passed back as the session's applied position.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::Mutex;

use super::auth::ReplicaAuth;
use super::clients::{Registration, ReplicaState};
use super::commands::Port;
use super::conn::RedisConn;
use super::error::RelayError;
use super::info::Server;
use super::rdb::EOF_MARK_LEN;
use super::reply::printable;
use super::resp::{Command, Parser, RespError};
use crate::kv::metrics::{Metrics, ReplicaStatus};
use crate::kv::replica::{ReplicaConn, SyncStart};
use crate::listener::{Ended, Limits, ListenerStats, Slot};

/// Opens a QUIC connection to the upstream relay.
pub type Dialer = Arc<
    dyn Fn() -> std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<quinn::Connection, String>> + Send>,
        > + Send
        + Sync,
>;

/// The connection to the upstream relay, dialed on demand and again after a loss.
pub struct Upstream {
    dial: Dialer,
    conn: Mutex<Option<Arc<ReplicaConn>>>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream").finish_non_exhaustive()
    }
}

impl Upstream {
    /// Dial with `dial` whenever a connection is needed.
    pub fn new(dial: Dialer, metrics: Arc<Metrics>) -> Upstream {
        Upstream {
            dial,
            conn: Mutex::new(None),
            metrics,
        }
    }

    /// A live connection, dialing if there is none.
    pub async fn get(&self) -> Result<Arc<ReplicaConn>, RelayError> {
        let mut g = self.conn.lock().await;
        if let Some(c) = g.as_ref() {
            if c.connection().close_reason().is_none() {
                return Ok(c.clone());
            }
            self.metrics.reconnects.fetch_add(1, Relaxed);
        }
        let conn = (self.dial)().await.map_err(RelayError::Dial)?;
        let c = Arc::new(ReplicaConn::new(conn, self.metrics.clone()));
        *g = Some(c.clone());
        Ok(c)
    }
}

/// Accept replicas on `listener` under `limits` until the task is dropped;
/// each link fails alone. A connection counts as idle (evictable when the
/// listener is full) until its PSYNC, and must send each handshake command
/// within the request timeout. With `auth`, a replica must `AUTH` before
/// anything but PING is served. Before PSYNC a connection may also ask what
/// a monitoring tool asks a Redis master ([`Port::answer`]). `dataset`
/// names the upstream's dataset these replicas follow (a cluster shard;
/// `None` for a single master): several listeners share one `upstream`.
pub async fn serve(
    listener: TcpListener,
    limits: Limits,
    stats: Arc<ListenerStats>,
    auth: Option<Arc<ReplicaAuth>>,
    upstream: Arc<Upstream>,
    metrics: Arc<Metrics>,
    dataset: Option<Arc<str>>,
) {
    static LINK: AtomicU64 = AtomicU64::new(1);
    let tcp_port = listener.local_addr().map_or(0, |a| a.port());
    let port = Arc::new(Port {
        server: Server::new(tcp_port, limits.max_connections),
        clients: Arc::default(),
        history: Arc::default(),
        metrics: metrics.clone(),
    });
    crate::listener::serve(listener, limits, stats, move |sock, slot| {
        let (upstream, metrics, auth, port, dataset) = (
            upstream.clone(),
            metrics.clone(),
            auth.clone(),
            port.clone(),
            dataset.clone(),
        );
        let id = LINK.fetch_add(1, Relaxed);
        async move {
            let peer = sock.peer_addr().ok();
            let me = port.clients.register(id, peer, sock.local_addr().ok());
            let link = Link {
                slot: &slot,
                request_timeout: limits.request_timeout,
                auth: auth.as_deref(),
                port: &port,
                me: &me,
                dataset: dataset.as_deref(),
            };
            let r = replica_link(RedisConn::new(sock), link, &upstream, &metrics, id).await;
            metrics.remove_replica(id);
            match r {
                Ok(()) => Ended::Closed,
                Err(e) => {
                    metrics.link_errors.fetch_add(1, Relaxed);
                    if e.is_malformed() {
                        metrics.malformed.fetch_add(1, Relaxed);
                    }
                    if matches!(e, RelayError::Unauthenticated(_)) {
                        metrics.auth_failures.fetch_add(1, Relaxed);
                    }
                    if let Some(peer) = peer {
                        tracing::warn!(
                            target: "qr::kv",
                            role = "downstream",
                            peer = %peer,
                            "replica {peer} link closed: {e}"
                        );
                    }
                    match e {
                        RelayError::Timeout(_) => Ended::TimedOut,
                        _ => Ended::Closed,
                    }
                }
            }
        }
    })
    .await
}

/// A replica connection's place in the listener.
struct Link<'a> {
    slot: &'a Slot,
    request_timeout: Duration,
    auth: Option<&'a ReplicaAuth>,
    /// What the port answers besides replication.
    port: &'a Port,
    /// This connection's entry in the port's client table.
    me: &'a Registration,
    /// The upstream's dataset (cluster shard) to replicate, if it has several.
    dataset: Option<&'a str>,
}

/// Commands a replica may send before `AUTH` (each answered `-NOAUTH`)
/// before its link is closed.
const MAX_UNAUTHENTICATED: u32 = 8;

const NOAUTH: &str = "-NOAUTH Authentication required.\r\n";

/// Commands from a replica, in order; a parse error comes after the
/// commands that preceded it (so a valid `PING` before garbage is answered).
#[derive(Debug)]
struct Commands {
    parser: Parser,
    pending: std::collections::VecDeque<Command>,
    error: Option<RespError>,
}

impl Default for Commands {
    fn default() -> Self {
        Commands {
            // People and tools type on this port too: inline lines are framed
            // (and answered with an error) rather than breaking the link.
            parser: Parser::for_clients(),
            pending: Default::default(),
            error: None,
        }
    }
}

impl Commands {
    /// Parse `data`, queueing what it completes.
    fn feed(&mut self, data: &[u8]) {
        if self.error.is_some() {
            return;
        }
        let mut out = Vec::new();
        if let Err(e) = self.parser.feed(data, &mut out) {
            self.error = Some(e);
        }
        self.pending.extend(out);
    }

    /// The next parsed command, or the error after the last of them.
    fn pop(&mut self) -> Option<Result<Command, RelayError>> {
        match self.pending.pop_front() {
            Some(c) => Some(Ok(c)),
            None => self.error.take().map(|e| Err(e.into())),
        }
    }

    /// The next command, reading from `c` as needed.
    async fn next(&mut self, c: &mut RedisConn) -> Result<Command, RelayError> {
        loop {
            if let Some(r) = self.pop() {
                return r;
            }
            if c.buf.is_empty() {
                c.fill().await?;
            }
            let data = c.buf.split();
            self.feed(&data);
        }
    }
}

/// What the replica told us before PSYNC.
#[derive(Debug, Default)]
struct Hello {
    capa_eof: bool,
    capa_psync2: bool,
}

async fn reply(c: &mut RedisConn, s: &str) -> Result<(), RelayError> {
    c.stream.write_all(s.as_bytes()).await?;
    Ok(())
}

async fn replica_link(
    mut c: RedisConn,
    link: Link<'_>,
    upstream: &Upstream,
    metrics: &Metrics,
    id: u64,
) -> Result<(), RelayError> {
    let mut cmds = Commands::default();
    let mut hello = Hello::default();
    let mut authenticated = link.auth.is_none();
    let mut refused = 0;
    // The handshake, up to PSYNC (bounded: a silent peer is dropped).
    let have = loop {
        let cmd = tokio::time::timeout(link.request_timeout, cmds.next(&mut c))
            .await
            .map_err(|_| RelayError::Timeout("the replica's handshake"))??;
        if cmd.argc == 0 {
            // A bare newline: a keep-alive, never answered.
            continue;
        }
        // An inline line is never a handshake command, whatever its words.
        let name = if cmd.inline { None } else { cmd.arg_lower(0) };
        link.me.update(|me| {
            me.active = std::time::Instant::now();
            me.last_cmd = name.clone().unwrap_or_else(|| "inline".into());
        });
        if !authenticated && !matches!(name.as_deref(), Some("auth" | "quit")) {
            // A replica's PING before AUTH gets -NOAUTH too, which Redis
            // replicas accept as a live master; PSYNC never passes.
            reply(&mut c, NOAUTH).await?;
            refused += 1;
            if matches!(name.as_deref(), Some("psync" | "sync")) {
                return Err(RelayError::Unauthenticated("PSYNC before AUTH"));
            }
            if refused >= MAX_UNAUTHENTICATED {
                return Err(RelayError::Unauthenticated("too many commands before AUTH"));
            }
            continue;
        }
        match name.as_deref() {
            Some("auth") => match link.auth {
                // No password configured: accepted, as before.
                None => reply(&mut c, "+OK\r\n").await?,
                Some(auth) => {
                    let arg = |i: usize| cmd.args.get(i).and_then(|a| a.as_deref());
                    let ok = match cmd.argc {
                        2 => arg(1).is_some_and(|p| auth.check(None, p)),
                        3 => match (arg(1), arg(2)) {
                            (Some(u), Some(p)) => auth.check(Some(u), p),
                            _ => false,
                        },
                        _ => false,
                    };
                    if !ok {
                        reply(
                            &mut c,
                            "-WRONGPASS invalid username-password pair or user is disabled.\r\n",
                        )
                        .await?;
                        return Err(RelayError::Unauthenticated("wrong user name or password"));
                    }
                    authenticated = true;
                    reply(&mut c, "+OK\r\n").await?;
                }
            },
            Some("replconf") => {
                let mut i = 1;
                while let Some(k) = cmd.arg_lower(i) {
                    match (k.as_str(), cmd.arg(i + 1)) {
                        ("capa", Some(v)) if v.eq_ignore_ascii_case("eof") => hello.capa_eof = true,
                        ("capa", Some(v)) if v.eq_ignore_ascii_case("psync2") => {
                            hello.capa_psync2 = true
                        }
                        // Where the replica's own clients reach it, shown in
                        // INFO replication and ROLE (Redis replication
                        // handshake: `REPLCONF listening-port`, `ip-address`).
                        ("listening-port", Some(v)) => {
                            if let Ok(p) = v.parse::<u16>() {
                                link.me.update(|me| me.listening_port = p);
                            }
                        }
                        ("ip-address", Some(v)) => {
                            let ip = printable(&v, 64);
                            link.me.update(|me| me.announced_ip = Some(ip));
                        }
                        _ => {}
                    }
                    i += 2;
                }
                // ACK/GETACK get no reply (they never do on a replication link).
                if !matches!(cmd.arg_lower(1).as_deref(), Some("ack" | "getack")) {
                    reply(&mut c, "+OK\r\n").await?;
                }
            }
            Some("psync") => {
                let (Some(replid), Some(off)) = (cmd.arg(1), cmd.arg(2)) else {
                    reply(&mut c, "-ERR wrong number of arguments for 'psync'\r\n").await?;
                    return Err(RelayError::Handshake("PSYNC without replid/offset".into()));
                };
                let off: i64 = off
                    .parse()
                    .map_err(|_| RelayError::Handshake(format!("PSYNC offset {off:?}")))?;
                // PSYNC names the first byte wanted (1-based); the channel
                // speaks positions (bytes held).
                break (replid != "?" && off >= 1).then(|| (replid, off as u64 - 1));
            }
            Some("sync") => {
                reply(
                    &mut c,
                    "-ERR this relay speaks PSYNC only (Redis >= 2.8)\r\n",
                )
                .await?;
                return Err(RelayError::Unsupported("SYNC (pre-2.8 replica)".into()));
            }
            _ => {
                let answer = link.port.answer(link.me, &cmd);
                c.stream.write_all(&answer.reply.encode()).await?;
                if answer.close {
                    return Ok(());
                }
            }
        }
    };
    // A replica from here on: never evicted for a newcomer.
    let _busy = link.slot.busy();
    link.me.replica(ReplicaState::WaitBgsave, 0);
    if !hello.capa_eof {
        reply(
            &mut c,
            "-ERR this relay sends snapshots diskless: the replica must announce capa eof\r\n",
        )
        .await?;
        return Err(RelayError::Unsupported("replica without capa eof".into()));
    }
    let conn = upstream.get().await?;
    let mut session = match conn.open_session_in(link.dataset, have.clone()).await {
        Ok(s) => s,
        Err(e) => {
            reply(
                &mut c,
                "-NOMASTERLINK Can't SYNC while not connected with my master\r\n",
            )
            .await?;
            return Err(e.into());
        }
    };
    // Named as Redis's INFO names a replica: its IP and listening port.
    let peer = link
        .me
        .get()
        .map(|c| format!("{}:{}", c.replica_ip(), c.listening_port))
        .unwrap_or_default();
    let status = |acked, applied, full| ReplicaStatus {
        acked,
        applied,
        lag_bytes: acked - applied.min(acked),
        lag_seconds: 0.0,
        snapshot_acked: 0,
        full,
        peer: peer.clone(),
    };
    match session.start.clone() {
        SyncStart::Continue {
            replid,
            position,
            previous,
        } => {
            link.port.history.observe(&replid, position, previous);
            link.me.replica(ReplicaState::Online, position);
            metrics.sync_partial_ok.fetch_add(1, Relaxed);
            tracing::info!(
                target: "qr::kv",
                role = "downstream",
                session = id,
                "replica link {id}: +CONTINUE at {position}"
            );
            if hello.capa_psync2 {
                reply(&mut c, &format!("+CONTINUE {replid}\r\n")).await?;
            } else {
                reply(&mut c, "+CONTINUE\r\n").await?;
            }
            metrics.set_replica(id, status(position, position, false));
        }
        SyncStart::Full {
            replid,
            position,
            previous,
        } => {
            link.port.history.observe(&replid, position, previous);
            link.me.replica(ReplicaState::SendBulk, position);
            metrics.sync_full.fetch_add(1, Relaxed);
            if have.is_some() {
                metrics.sync_partial_err.fetch_add(1, Relaxed);
            }
            tracing::info!(
                target: "qr::kv",
                role = "downstream",
                session = id,
                "replica link {id}: +FULLRESYNC {replid} {position}"
            );
            reply(&mut c, &format!("+FULLRESYNC {replid} {position}\r\n")).await?;
            let mark: [u8; EOF_MARK_LEN] = {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                let mut rng = rand::thread_rng();
                std::array::from_fn(|_| HEX[rng.gen_range(0..16)])
            };
            c.stream.write_all(b"$EOF:").await?;
            c.stream.write_all(&mark).await?;
            c.stream.write_all(b"\r\n").await?;
            while let Some(chunk) = session.next_snapshot().await? {
                c.stream.write_all(&chunk).await?;
            }
            c.stream.write_all(&mark).await?;
            metrics.set_replica(id, status(position, 0, true));
            // Like a Redis master after a diskless transfer: the replica goes
            // online on its first ACK, sent once it has loaded the snapshot;
            // until then nothing may follow the mark (the replica finds the
            // end of the payload by the mark being the last bytes it read).
            loop {
                let cmd = tokio::time::timeout(Duration::from_secs(3600), cmds.next(&mut c))
                    .await
                    .map_err(|_| RelayError::Timeout("the replica's first ACK"))??;
                if cmd.arg_lower(0).as_deref() == Some("replconf")
                    && cmd.arg_lower(1).as_deref() == Some("ack")
                {
                    link.me.replica(ReplicaState::Online, position);
                    break;
                }
            }
        }
    }
    // The command stream, and the replica's acks (read and write halves
    // apart, so neither waits for the other).
    let replid = match &session.start {
        SyncStart::Full { replid, .. } | SyncStart::Continue { replid, .. } => replid.clone(),
    };
    let RedisConn { stream, mut buf } = c;
    let (mut rd, mut wr) = stream.into_split();
    let on_cmd = |cmd: &Command, session: &crate::kv::replica::Session| {
        if cmd.arg_lower(0).as_deref() == Some("replconf")
            && cmd.arg_lower(1).as_deref() == Some("ack")
        {
            if let Some(off) = cmd.arg(2).and_then(|o| o.parse::<u64>().ok()) {
                session.applied(off);
                link.me.replica(ReplicaState::Online, off);
                metrics.set_replica(id, status(session.position(), off, false));
            }
        }
    };
    while let Some(cmd) = cmds.pop() {
        on_cmd(&cmd?, &session);
    }
    loop {
        tokio::select! {
            chunk = session.next_log() => {
                wr.write_all(&chunk?).await?;
                // The downstream's head: the furthest offset it delivered.
                let head = link.port.history.advance(&replid, session.position());
                metrics.head.store(head, Relaxed);
            }
            r = rd.read_buf(&mut buf) => {
                if r? == 0 {
                    return Err(RelayError::Io(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "the replica closed the connection",
                    )));
                }
                let data = buf.split();
                cmds.feed(&data);
                while let Some(cmd) = cmds.pop() {
                    on_cmd(&cmd?, &session);
                }
                if buf.capacity() < 4096 {
                    buf.reserve(64 << 10);
                }
            }
        }
    }
}
