//! Which Redis server the upstream relay follows: the master among fixed
//! candidates, the one Redis Sentinel names, or the one `CLUSTER SHARDS`
//! lists for a Redis Cluster shard ([`super::cluster`]). After a failover (Sentinel
//! promotes a replica, or an operator does) the relay links to the new master
//! and resumes by `PSYNC` under the old replication id, which the promoted
//! replica keeps as its `replid2` (PSYNC2), as a direct replica would.
//!
//! Sentinel is asked the way its client guidelines say
//! (https://redis.io/docs/latest/develop/reference/sentinel-clients/): try
//! each Sentinel in turn with `SENTINEL get-master-addr-by-name`, the first
//! that answers first next time, then check the address with `ROLE`, since a
//! Sentinel may be partitioned and stale. While linked, the relay asks again
//! every second ([`Locator::still_master`]): a master that stopped being one
//! without closing its replicas' links (a partition, `REPLICAOF` issued by
//! hand) is left too.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use super::auth::Credentials;
use super::cluster;
use super::conn::RedisConn;
use super::error::RelayError;
use super::reply::Reply;

/// Where the master is found.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MasterSource {
    /// host:port of each candidate; the one whose `ROLE` is `master`.
    Candidates(Vec<String>),
    /// Redis Sentinel: its host:port list and the monitored master's name.
    Sentinel {
        /// host:port of each Sentinel.
        sentinels: Vec<String>,
        /// The name the Sentinels monitor the master under (`sentinel monitor NAME ...`).
        name: String,
    },
    /// One shard of a Redis Cluster: the node `CLUSTER SHARDS` lists as the
    /// master of the shard with these slot ranges ([`super::cluster`]).
    ClusterShard {
        /// host:port of cluster nodes to ask, in turn.
        nodes: Vec<String>,
        /// The shard's name, its slot ranges ([`super::cluster::Shard::name`]).
        slots: String,
    },
}

impl MasterSource {
    /// Whether the master can move: several candidates, or Sentinel.
    pub fn can_move(&self) -> bool {
        !matches!(self, MasterSource::Candidates(c) if c.len() == 1)
    }
}

impl std::fmt::Display for MasterSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MasterSource::Candidates(c) if c.len() == 1 => write!(f, "{}", c[0]),
            MasterSource::Candidates(c) => write!(f, "the master among {}", c.join(", ")),
            MasterSource::Sentinel { sentinels, name } => {
                write!(f, "master {name} of Sentinel {}", sentinels.join(", "))
            }
            MasterSource::ClusterShard { slots, .. } => {
                write!(f, "the master of cluster shard {slots}")
            }
        }
    }
}

/// Finds the master: [`MasterSource`] with the credentials for each kind of
/// server, and which Sentinel answered last.
#[derive(Debug)]
pub struct Locator {
    source: MasterSource,
    master_auth: Credentials,
    sentinel_auth: Credentials,
    /// The Sentinel to ask first: the last one that answered.
    first: AtomicUsize,
}

impl Locator {
    /// A locator for `source`; `master_auth` for the data servers,
    /// `sentinel_auth` for the Sentinels (their own `requirepass`).
    pub fn new(source: MasterSource, master_auth: Credentials, sentinel_auth: Credentials) -> Self {
        Locator {
            source,
            master_auth,
            sentinel_auth,
            first: AtomicUsize::new(0),
        }
    }

    /// What is followed, for logs.
    pub fn source(&self) -> &MasterSource {
        &self.source
    }

    /// The credentials for the data servers.
    pub fn master_auth(&self) -> &Credentials {
        &self.master_auth
    }

    /// The master's host:port now. A single fixed address is taken as it
    /// is, without `ROLE` (a replication-only ACL user may not run it).
    pub async fn locate(&self) -> Result<String, RelayError> {
        let mut why = Vec::new();
        match &self.source {
            MasterSource::Candidates(list) if list.len() == 1 => return Ok(list[0].clone()),
            MasterSource::Candidates(list) => {
                for addr in list {
                    match self.role(addr).await {
                        Ok(role) if role == "master" => return Ok(addr.clone()),
                        Ok(role) => why.push(format!("{addr} is a {role}")),
                        Err(e) => why.push(format!("{addr}: {e}")),
                    }
                }
            }
            MasterSource::Sentinel { sentinels, name } => {
                let n = sentinels.len();
                let first = self.first.load(Relaxed);
                for i in (0..n).map(|k| (first + k) % n) {
                    let s = &sentinels[i];
                    let addr = match self.ask_sentinel(s, name).await {
                        Ok(a) => a,
                        Err(e) => {
                            why.push(format!("Sentinel {s}: {e}"));
                            continue;
                        }
                    };
                    self.first.store(i, Relaxed);
                    return match self.role(&addr).await? {
                        role if role == "master" => Ok(addr),
                        role => Err(RelayError::Handshake(format!(
                            "Sentinel {s} names {addr} as master {name}, but it is a {role} \
                             (a failover in progress?)"
                        ))),
                    };
                }
            }
            MasterSource::ClusterShard { nodes, slots } => {
                let n = nodes.len();
                let first = self.first.load(Relaxed);
                for i in (0..n).map(|k| (first + k) % n) {
                    let node = &nodes[i];
                    match cluster::shards(node, &self.master_auth).await {
                        Ok(shards) => {
                            self.first.store(i, Relaxed);
                            match shards.iter().find(|s| s.name() == *slots) {
                                Some(s) => match s.master() {
                                    Some(m) => return Ok(m.to_string()),
                                    None => why.push(format!(
                                        "{node}: shard {slots} has no online master \
                                         (a failover in progress?)"
                                    )),
                                },
                                None => why.push(format!(
                                    "{node}: no shard has exactly the slots {slots} (resharding \
                                     is not followed: restart the relays with the new shards)"
                                )),
                            }
                        }
                        Err(e) => why.push(format!("{node}: {e}")),
                    }
                }
            }
        }
        Err(RelayError::Handshake(format!(
            "no master found: {}",
            why.join("; ")
        )))
    }

    /// Whether `addr` is still the master to follow (a failed question
    /// counts as yes: the link itself shows whether the master is gone).
    pub async fn still_master(&self, addr: &str) -> bool {
        match &self.source {
            MasterSource::Candidates(_) => self.role(addr).await.map_or(true, |r| r == "master"),
            MasterSource::Sentinel { .. } | MasterSource::ClusterShard { .. } => {
                self.locate().await.map_or(true, |a| a == addr)
            }
        }
    }

    /// Ask the server at `addr` one command as the master's user (after
    /// `AUTH`, when credentials are set); a `-NOAUTH` answer is an error
    /// naming the missing option.
    pub async fn ask_master(&self, addr: &str, args: &[&[u8]]) -> Result<Reply, RelayError> {
        let mut c = RedisConn::connect(addr).await?;
        self.master_auth.auth(&mut c).await?;
        c.send(args).await?;
        match c.reply().await? {
            Reply::Error(e) if e.starts_with("NOAUTH") => Err(RelayError::Handshake(format!(
                "{addr} requires a password (--master-password)"
            ))),
            r => Ok(r),
        }
    }

    /// `ROLE`'s first element: `master`, `slave` or `sentinel`.
    async fn role(&self, addr: &str) -> Result<String, RelayError> {
        match self.ask_master(addr, &[b"ROLE"]).await? {
            Reply::Array(v) => match v.first() {
                Some(Reply::Bulk(Some(r))) => Ok(String::from_utf8_lossy(r).into_owned()),
                _ => Err(RelayError::Handshake("ROLE answered an empty array".into())),
            },
            other => Err(RelayError::Handshake(format!("ROLE answered {other:?}"))),
        }
    }

    /// `SENTINEL get-master-addr-by-name NAME` → host:port.
    async fn ask_sentinel(&self, sentinel: &str, name: &str) -> Result<String, RelayError> {
        let mut c = RedisConn::connect(sentinel).await?;
        self.sentinel_auth.auth(&mut c).await?;
        c.send(&[b"SENTINEL", b"get-master-addr-by-name", name.as_bytes()])
            .await?;
        match c.reply().await? {
            Reply::Array(v) => match v.as_slice() {
                [Reply::Bulk(Some(host)), Reply::Bulk(Some(port))] => {
                    let host = String::from_utf8_lossy(host);
                    let port = String::from_utf8_lossy(port);
                    let port: u16 = port.parse().map_err(|_| {
                        RelayError::Handshake(format!("Sentinel answered port {port:?}"))
                    })?;
                    // An IPv6 host needs brackets in host:port.
                    Ok(if host.contains(':') {
                        format!("[{host}]:{port}")
                    } else {
                        format!("{host}:{port}")
                    })
                }
                _ => Err(RelayError::Handshake(format!(
                    "Sentinel answered {v:?} for master {name}"
                ))),
            },
            Reply::Bulk(None) => Err(RelayError::Handshake(format!(
                "Sentinel does not monitor a master named {name} (--master-name)"
            ))),
            Reply::Error(e) if e.starts_with("NOAUTH") => Err(RelayError::Handshake(
                "the Sentinel requires a password (--sentinel-password)".into(),
            )),
            other => Err(RelayError::Handshake(format!(
                "Sentinel answered {other:?}"
            ))),
        }
    }
}
