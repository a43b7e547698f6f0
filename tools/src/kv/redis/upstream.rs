//! The upstream relay's link to the real Redis master: it is that master's
//! replica (replication.c `syncWithMaster` is the other end), and it feeds
//! the channel's [`Master`]: `+FULLRESYNC` starts a new epoch and a snapshot,
//! the command stream is appended to the backlog after the RESP parser has
//! checked it. `REPLCONF ACK <offset>` goes back every second and on
//! `REPLCONF GETACK`, as a real replica does.
//!
//! When a channel replica needs a full sync and the stored snapshot is older
//! than the backlog, a second, short-lived replica link fetches a fresh one
//! (`PSYNC ? -1`, the RDB, then it closes); the main link's command stream
//! continues the snapshot from its offset.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::AsyncWriteExt;

use super::conn::RedisConn;
use super::error::RelayError;
use super::locate::Locator;
use super::rdb::Framing;
use super::reply::Reply;
use super::resp::{encode_command, Parser};
use crate::kv::frame::Previous;
use crate::kv::master::{in_history, Master};
use crate::kv::snapshot::{discard_stored, Keep, Snapshot, SnapshotWriter, Stored};

/// How to reach and authenticate to the Redis master.
#[derive(Clone, Debug)]
pub struct UpstreamConfig {
    /// Where the master is (a fixed address, candidates, or Sentinel) and
    /// the credentials for it (`masterauth`, an ACL user).
    pub master: Arc<Locator>,
    /// The port announced with `REPLCONF listening-port`: the master shows
    /// it as this replica's `port=` in INFO replication and ROLE, and tools
    /// (Sentinel, exporters, people) connect there to look at the replica.
    pub announce_port: u16,
    /// The address announced with `REPLCONF ip-address` (Redis's
    /// `replica-announce-ip`); without it the master shows the link's peer
    /// address.
    pub announce_ip: Option<String>,
    /// Interval of `REPLCONF ACK`.
    pub ack_interval: Duration,
    /// A file keeping the replication id and the position every live replica
    /// can resume from, so a restarted relay resumes from the master with
    /// `PSYNC` (and its replicas with `+CONTINUE`) instead of a full sync.
    pub state: Option<PathBuf>,
}

/// What the state file keeps: the replication id, the position every live
/// replica can resume from, and the previous id with its end, if any.
type State = (String, u64, Option<Previous>);

/// Read a state file: `<replid> <position> [<replid2> <end of replid2>]`.
fn load_state(path: &Path) -> Option<State> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut w = text.split_whitespace();
    let id = |s: &str| crate::kv::frame::is_replid(s).then(|| s.to_string());
    let replid = id(w.next()?)?;
    let pos = w.next()?.parse().ok()?;
    let previous = match (w.next(), w.next()) {
        (Some(r), Some(p)) => Some(Previous {
            replid: id(r)?,
            position: p.parse().ok()?,
        }),
        _ => None,
    };
    Some((replid, pos, previous))
}

fn state_text((replid, pos, previous): &State) -> String {
    match previous {
        Some(p) => format!("{replid} {pos} {} {}\n", p.replid, p.position),
        None => format!("{replid} {pos}\n"),
    }
}

/// Every second, record where all live replicas could resume (written to a
/// temporary file and renamed, so a crash leaves the old state or the new).
async fn save_state(path: PathBuf, master: Master) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut last = None;
    loop {
        tick.tick().await;
        let (replid, _, previous) = master.history();
        let (Some(replid), Some(pos)) = (replid, master.resume_point()) else {
            continue;
        };
        let state = (replid, pos, previous);
        if last.as_ref() == Some(&state) {
            continue;
        }
        let tmp = path.with_extension("tmp");
        let r =
            std::fs::write(&tmp, state_text(&state)).and_then(|()| std::fs::rename(&tmp, &path));
        match r {
            Ok(()) => last = Some(state),
            Err(e) => tracing::warn!("kv upstream: saving {}: {e}", path.display()),
        }
    }
}

/// Follow the master forever: find it, link, and on any failure log it,
/// count it and link again after a second (resuming by `PSYNC` from where the
/// backlog ends), to whichever server is the master by then.
pub async fn run(cfg: UpstreamConfig, master: Master) {
    let _fetcher = AbortOnDrop(tokio::spawn(fetch_snapshots(cfg.clone(), master.clone())));
    resume(&cfg, &master).await;
    let _saver = cfg
        .state
        .as_ref()
        .map(|p| AbortOnDrop(tokio::spawn(save_state(p.clone(), master.clone()))));
    let mut first = true;
    let mut followed: Option<String> = None;
    loop {
        if !first {
            master.metrics().reconnects.fetch_add(1, Relaxed);
        }
        first = false;
        let r = match cfg.master.locate().await {
            Ok(addr) => {
                if followed.as_ref().is_some_and(|f| *f != addr) {
                    master.metrics().master_changes.fetch_add(1, Relaxed);
                    tracing::warn!(
                        target: "qr::kv",
                        role = "upstream",
                        "the master is now {addr} (was {}); following it",
                        followed.as_deref().unwrap_or_default()
                    );
                }
                followed = Some(addr.clone());
                tokio::select! {
                    r = link(&cfg, &addr, &master) => r,
                    () = left(&cfg.master, &addr) => Err(RelayError::MasterMoved(addr.clone())),
                }
            }
            Err(e) => Err(e),
        };
        master.metrics().master_link_up.store(0, Relaxed);
        if let Err(e) = r {
            master.metrics().link_errors.fetch_add(1, Relaxed);
            if e.is_malformed() {
                master.metrics().malformed.fetch_add(1, Relaxed);
            }
            let at = followed.as_deref().unwrap_or("(not found)");
            tracing::warn!("kv upstream: link to the Redis master {at}: {e}");
            tracing::warn!(
                target: "qr::kv",
                role = "upstream",
                "link to the Redis master {at} closed: {e}"
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Where a restarted relay starts: from its saved state (the position every
/// live replica can resume from: PSYNC asks the master for exactly what
/// follows) and with the snapshot it kept, when that snapshot belongs to the
/// same history and the master's backlog still reaches it. The backlog then
/// starts at the lower of the two, so replicas resume partially and new ones
/// get the kept snapshot and its log instead of a new fetch from the master.
async fn resume(cfg: &UpstreamConfig, master: &Master) {
    let saved = cfg.state.as_deref().and_then(load_state);
    let kept = if master.config().keep == Keep::Latest {
        let dir = master.config().snapshot_dir.clone();
        let d = dir.clone();
        match tokio::task::spawn_blocking(move || Snapshot::open_stored(&d)).await {
            Ok(Stored::Found(s)) => Some(s),
            Ok(Stored::Absent) => None,
            Ok(Stored::Refused(why)) => {
                refused(master, &why);
                None
            }
            Err(e) => {
                refused(master, &format!("checking the kept snapshot: {e}"));
                discard_stored(&dir);
                None
            }
        }
    } else {
        None
    };
    let snap = match (kept, &saved) {
        (Some(s), Some((replid, pos, previous))) => {
            let prev = previous.as_ref().map(|p| (p.replid.as_str(), p.position));
            let ours = in_history(replid, prev, &s.replid, s.position);
            // Starting below the replicas' position costs them their partial
            // resync unless the master's backlog still reaches that far.
            let reach = if !ours || s.position >= *pos {
                Ok(ours)
            } else {
                backlog_reaches(cfg, replid, s.position).await
            };
            match reach {
                Ok(true) => Some(s),
                Ok(false) => {
                    refused(
                        master,
                        &format!(
                            "the kept snapshot ({} at {}) is not in the history the replicas \
                             resume ({replid} from {pos}) or the master's backlog no longer \
                             reaches it",
                            s.replid, s.position
                        ),
                    );
                    discard_stored(&master.config().snapshot_dir);
                    None
                }
                Err(e) => {
                    // Kept for the next restart: the master may answer then.
                    tracing::warn!(
                        target: "qr::kv",
                        role = "upstream",
                        "not serving the kept snapshot: cannot read the master's backlog: {e}"
                    );
                    None
                }
            }
        }
        (kept, _) => kept,
    };
    let (replid, pos, previous) = match (saved, &snap) {
        (Some(s), _) => s,
        (None, Some(s)) => (s.replid.clone(), s.position, None),
        (None, None) => return,
    };
    let from = cfg.state.as_deref().unwrap_or(Path::new("--dir"));
    match snap {
        Some(s) => {
            tracing::info!(
                target: "qr::kv",
                role = "upstream",
                "resuming replication id {replid} at offset {} with the kept snapshot \
                 at {} ({})",
                pos.min(s.position),
                s.position,
                from.display()
            );
            master.restore(&replid, pos, previous, s);
            master
                .metrics()
                .stored_snapshot_restored
                .fetch_add(1, Relaxed);
        }
        None => {
            tracing::info!(
                target: "qr::kv",
                role = "upstream",
                "resuming replication id {replid} at offset {pos} ({})",
                from.display()
            );
            master.reset(&replid, pos, previous);
        }
    }
}

/// Count and log a kept snapshot that will not be served.
fn refused(master: &Master, why: &str) {
    master
        .metrics()
        .stored_snapshot_refused
        .fetch_add(1, Relaxed);
    tracing::warn!(
        target: "qr::kv",
        role = "upstream",
        "not serving the kept snapshot: {why}; a full sync will fetch a new one"
    );
}

/// Whether the master's backlog holds the byte after `position` of `replid`
/// (`INFO replication`; the master accepts `PSYNC` within
/// `repl_backlog_first_byte_offset ..= master_repl_offset + 1` of its id or,
/// up to `second_repl_offset`, of its previous one: replication.c
/// `masterTryPartialResynchronization`).
async fn backlog_reaches(
    cfg: &UpstreamConfig,
    replid: &str,
    position: u64,
) -> Result<bool, RelayError> {
    let addr = cfg.master.locate().await?;
    match cfg
        .master
        .ask_master(&addr, &[b"INFO", b"replication"])
        .await?
    {
        Reply::Bulk(Some(text)) => Ok(info_reaches(
            &String::from_utf8_lossy(&text),
            replid,
            position,
        )),
        other => Err(RelayError::Handshake(format!(
            "INFO replication answered {other:?}"
        ))),
    }
}

/// [`backlog_reaches`] on the text of `INFO replication`.
fn info_reaches(info: &str, replid: &str, position: u64) -> bool {
    let field = |k: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(k)?.strip_prefix(':'))
            .map(str::trim)
    };
    let num = |k: &str| field(k).and_then(|v| v.parse::<i64>().ok());
    let want = position as i64 + 1;
    let ours = field("master_replid") == Some(replid)
        || (field("master_replid2") == Some(replid)
            && num("second_repl_offset").is_some_and(|o| want <= o));
    ours && num("repl_backlog_active") == Some(1)
        && num("repl_backlog_first_byte_offset").is_some_and(|f| f <= want)
        && num("master_repl_offset").is_some_and(|h| want <= h + 1)
}

/// Returns when `addr` stops being the master to follow (asked every
/// second; never, for a single fixed master).
async fn left(locator: &Locator, addr: &str) {
    if !locator.source().can_move() {
        return std::future::pending().await;
    }
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if !locator.still_master(addr).await {
            return;
        }
    }
}

/// Ends a task when its owner goes.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// PING, AUTH, REPLCONF listening-port, REPLCONF ip-address, REPLCONF capa
/// (replication.c `syncWithMaster` order).
async fn handshake(c: &mut RedisConn, cfg: &UpstreamConfig) -> Result<(), RelayError> {
    c.send(&[b"PING"]).await?;
    let pong = c.reply_line().await?;
    // -NOAUTH is expected before AUTH; any other error is not.
    if pong.starts_with('-') && !pong.starts_with("-NOAUTH") {
        return Err(RelayError::Handshake(format!("PING answered {pong:?}")));
    }
    let auth = cfg.master.master_auth();
    if auth.password.is_some() {
        auth.auth(c).await?;
    } else if pong.starts_with("-NOAUTH") {
        return Err(RelayError::Handshake(
            "the master requires a password (--master-password)".into(),
        ));
    }
    let port = cfg.announce_port.to_string();
    c.command_ok(&[b"REPLCONF", b"listening-port", port.as_bytes()])
        .await?;
    if let Some(ip) = &cfg.announce_ip {
        c.command_ok(&[b"REPLCONF", b"ip-address", ip.as_bytes()])
            .await?;
    }
    c.command_ok(&[b"REPLCONF", b"capa", b"eof", b"capa", b"psync2"])
        .await?;
    Ok(())
}

/// Receive the RDB into `writer`; leftover bytes stay in `c.buf`. Returns
/// whether it was EOF-marked (diskless), which obliges an immediate ACK.
async fn receive_rdb(
    c: &mut RedisConn,
    mut writer: SnapshotWriter,
    master: &Master,
) -> Result<bool, RelayError> {
    let mut framing = Framing::new();
    let mut out = Vec::with_capacity(256 << 10);
    loop {
        if c.buf.is_empty() {
            // A master preparing a snapshot sends newlines at least every
            // second; silence for a minute is Redis's own repl-timeout.
            tokio::time::timeout(Duration::from_secs(60), c.fill())
                .await
                .map_err(|_| RelayError::Timeout("the master's snapshot"))??;
        }
        out.clear();
        let (used, done) = match framing.feed(&c.buf, &mut out) {
            Ok(r) => r,
            Err(e) => {
                writer.fail(&e.to_string());
                return Err(e.into());
            }
        };
        let _ = c.buf.split_to(used);
        writer.write(&out).map_err(RelayError::Channel)?;
        master
            .metrics()
            .snapshot_source_bytes
            .fetch_add(out.len() as u64, Relaxed);
        if done {
            let marked = framing.is_marked();
            writer.finish();
            return Ok(marked);
        }
    }
}

async fn link(cfg: &UpstreamConfig, addr: &str, master: &Master) -> Result<(), RelayError> {
    let mut c = RedisConn::connect(addr).await?;
    handshake(&mut c, cfg).await?;
    let (replid, head) = master.position();
    let (id, off) = match &replid {
        // PSYNC names the first byte wanted: our head, 1-based (replication.c).
        Some(r) => (r.clone(), (head + 1).to_string()),
        None => ("?".to_string(), "-1".to_string()),
    };
    c.send(&[b"PSYNC", id.as_bytes(), off.as_bytes()]).await?;
    let reply = c.reply_line().await?;
    let mut words = reply.split_whitespace();
    match words.next() {
        Some("+FULLRESYNC") => {
            let (Some(id), Some(off)) = (words.next(), words.next().and_then(|o| o.parse().ok()))
            else {
                return Err(RelayError::Handshake(format!("bad reply {reply:?}")));
            };
            tracing::info!(
                target: "qr::kv",
                role = "upstream",
                "full resync from the master: replid {id} offset {off}"
            );
            master.reset(id, off, None);
            let writer = master.begin_snapshot(id, off)?;
            let marked = receive_rdb(&mut c, writer, master).await?;
            if marked {
                // The master puts a diskless replica online on its first ACK.
                c.send(&[b"REPLCONF", b"ACK", off.to_string().as_bytes()])
                    .await?;
            }
        }
        Some("+CONTINUE") => {
            if let (Some(new), Some(old)) = (words.next(), &replid) {
                if new != old {
                    // PSYNC2: the master's history goes on under a new id (it
                    // restarted from its RDB, or a failover promoted it), ours
                    // being its previous one. Replicas holding ours resume
                    // under the new id (Master::switch_id).
                    tracing::info!(
                        target: "qr::kv",
                        role = "upstream",
                        "the master's replication id is now {new} (was {old}, up to offset {head})"
                    );
                    master.switch_id(new);
                }
            }
            tracing::info!(
                target: "qr::kv",
                role = "upstream",
                "partial resync from the master at offset {head}"
            );
        }
        _ => return Err(RelayError::Handshake(format!("PSYNC answered {reply:?}"))),
    }
    master.metrics().master_link_up.store(1, Relaxed);
    follow(&mut c, master, cfg.ack_interval).await
}

/// The command stream: check, append, acknowledge.
async fn follow(c: &mut RedisConn, master: &Master, every: Duration) -> Result<(), RelayError> {
    let base = master.position().1;
    let mut parser = Parser::new();
    let mut cmds = Vec::new();
    let mut applied = base;
    let mut tick = tokio::time::interval(every);
    loop {
        if c.buf.is_empty() {
            tokio::select! {
                r = c.fill() => { r?; }
                _ = tick.tick() => {
                    ack(c, applied).await?;
                    continue;
                }
            }
        }
        let data: Bytes = c.buf.split().freeze();
        cmds.clear();
        let before = parser.offset();
        let res = parser.feed(&data, &mut cmds);
        let valid = (parser.offset() - before) as usize;
        master.append(data.slice(..valid));
        for cmd in &cmds {
            applied = base + cmd.end;
            if cmd.arg_lower(0).as_deref() == Some("replconf")
                && cmd.arg_lower(1).as_deref() == Some("getack")
            {
                ack(c, applied).await?;
            }
        }
        res?;
    }
}

async fn ack(c: &mut RedisConn, offset: u64) -> Result<(), RelayError> {
    let o = offset.to_string();
    c.stream
        .write_all(&encode_command(&[b"REPLCONF", b"ACK", o.as_bytes()]))
        .await?;
    Ok(())
}

/// Fetch a fresh snapshot whenever the channel asks for one.
async fn fetch_snapshots(cfg: UpstreamConfig, master: Master) {
    loop {
        master.snapshot_wanted().await;
        tracing::info!(
            target: "qr::kv",
            role = "upstream",
            "a replica needs a newer snapshot; fetching one"
        );
        if let Err(e) = fetch(&cfg, &master).await {
            master.metrics().link_errors.fetch_add(1, Relaxed);
            tracing::warn!(
                target: "qr::kv",
                role = "upstream",
                "fetching a snapshot failed: {e}"
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

async fn fetch(cfg: &UpstreamConfig, master: &Master) -> Result<(), RelayError> {
    let mut c = RedisConn::connect(&cfg.master.locate().await?).await?;
    handshake(&mut c, cfg).await?;
    c.send(&[b"PSYNC", b"?", b"-1"]).await?;
    let reply = c.reply_line().await?;
    let mut words = reply.split_whitespace();
    let (Some("+FULLRESYNC"), Some(id), Some(off)) = (
        words.next(),
        words.next(),
        words.next().and_then(|o| o.parse::<u64>().ok()),
    ) else {
        return Err(RelayError::Handshake(format!(
            "snapshot fetch: PSYNC answered {reply:?}"
        )));
    };
    let writer = master.begin_snapshot(id, off)?;
    receive_rdb(&mut c, writer, master).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "# Replication\r\nrole:master\r\nconnected_slaves:0\r\n\
        master_replid:aaaa\r\nmaster_replid2:bbbb\r\nmaster_repl_offset:5000\r\n\
        second_repl_offset:3001\r\nrepl_backlog_active:1\r\nrepl_backlog_size:1048576\r\n\
        repl_backlog_first_byte_offset:2001\r\nrepl_backlog_histlen:3000\r\n";

    #[test]
    fn the_masters_backlog_reaches_a_position_of_its_history_it_still_holds() {
        // PSYNC asks for the byte after the position: 2001 is the first held.
        assert!(info_reaches(INFO, "aaaa", 2000));
        assert!(!info_reaches(INFO, "aaaa", 1999));
        assert!(info_reaches(INFO, "aaaa", 5000));
        assert!(!info_reaches(INFO, "aaaa", 5001));
        // The previous id, only up to where it ended.
        assert!(info_reaches(INFO, "bbbb", 3000));
        assert!(!info_reaches(INFO, "bbbb", 3001));
        assert!(!info_reaches(INFO, "cccc", 2500));
        let idle = INFO.replace("repl_backlog_active:1", "repl_backlog_active:0");
        assert!(!info_reaches(&idle, "aaaa", 2500));
        assert!(!info_reaches("", "aaaa", 2500));
    }
}
