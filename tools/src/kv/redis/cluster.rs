//! A Redis Cluster's shards, as `CLUSTER SHARDS` lists them (Redis 7.0;
//! https://redis.io/docs/latest/commands/cluster-shards/): per shard, its
//! `slots` (start and end of each range, inclusive, as integer pairs) and
//! its `nodes`, each a map with `ip`, `endpoint`, `port` (or `tls-port`),
//! `role` (`master` or `replica`) and `health` (`online`, `failed`,
//! `loading`). Under RESP2 a map is a flat array of key, value, ...
//!
//! The upstream relay follows each shard's master as its own dataset, named
//! by the shard's slot ranges ([`Shard::name`]): the ranges stay with the
//! shard across a failover, where its node ids and addresses do not.
//! Resharding (slots moving between shards) is not followed: a shard whose
//! ranges changed is no longer found under its name.

use super::auth::Credentials;
use super::conn::RedisConn;
use super::error::RelayError;
use super::reply::Reply;

/// One shard: its slot ranges and its nodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shard {
    /// Slot ranges, inclusive, in the order `CLUSTER SHARDS` gave them.
    pub slots: Vec<(u16, u16)>,
    /// Its nodes.
    pub nodes: Vec<Node>,
}

/// One node of a shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    /// host:port clients reach it at (its `endpoint`, else its `ip`).
    pub addr: String,
    /// `master` or `replica`.
    pub role: String,
    /// `online`, `failed` or `loading`.
    pub health: String,
}

impl Shard {
    /// The shard's name: its slot ranges as `START-END`, comma-separated,
    /// in `CLUSTER SHARDS` order (`0-5460`; `0-99,200-5460`).
    pub fn name(&self) -> String {
        self.slots
            .iter()
            .map(|(a, b)| format!("{a}-{b}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The address of its master if that node is online.
    pub fn master(&self) -> Option<&str> {
        self.nodes
            .iter()
            .find(|n| n.role == "master" && n.health == "online")
            .map(|n| n.addr.as_str())
    }
}

/// Whether `s` is a shard name as [`Shard::name`] writes it (for options).
pub fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.split(',').all(|r| {
            r.split_once('-').is_some_and(|(a, b)| {
                matches!((a.parse::<u16>(), b.parse::<u16>()), (Ok(a), Ok(b)) if a <= b && b < 16384)
            })
        })
}

fn text(r: &Reply) -> Option<String> {
    match r {
        Reply::Bulk(Some(b)) => Some(String::from_utf8_lossy(b).into_owned()),
        Reply::Simple(s) => Some(s.clone()),
        Reply::Int(i) => Some(i.to_string()),
        _ => None,
    }
}

/// A RESP2 map (flat key, value array): the value of `key`.
fn field<'a>(map: &'a [Reply], key: &str) -> Option<&'a Reply> {
    map.chunks_exact(2)
        .find(|kv| text(&kv[0]).as_deref() == Some(key))
        .map(|kv| &kv[1])
}

fn bad(what: &str) -> RelayError {
    RelayError::Handshake(format!("CLUSTER SHARDS answered {what}"))
}

/// Parse a `CLUSTER SHARDS` reply.
pub fn parse_shards(reply: &Reply) -> Result<Vec<Shard>, RelayError> {
    let shards = match reply {
        Reply::Array(v) => v,
        Reply::Error(e) => {
            return Err(RelayError::Handshake(format!(
                "CLUSTER SHARDS answered {e:?} (a Redis >= 7.0 with cluster-enabled yes is needed)"
            )))
        }
        other => return Err(bad(&format!("{other:?}"))),
    };
    let mut out = Vec::with_capacity(shards.len());
    for s in shards {
        let Reply::Array(map) = s else {
            return Err(bad("a shard that is not a map"));
        };
        let slots = match field(map, "slots") {
            Some(Reply::Array(v)) => v
                .chunks(2)
                .map(|p| match p {
                    [Reply::Int(a), Reply::Int(b)] => {
                        let (a, b) = (u16::try_from(*a).ok()?, u16::try_from(*b).ok()?);
                        (a <= b && b < 16384).then_some((a, b))
                    }
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| bad("slots that are not START END pairs within 0..16384"))?,
            _ => return Err(bad("a shard without slots")),
        };
        let Some(Reply::Array(nodes)) = field(map, "nodes") else {
            return Err(bad("a shard without nodes"));
        };
        let mut ns = Vec::with_capacity(nodes.len());
        for n in nodes {
            let Reply::Array(n) = n else {
                return Err(bad("a node that is not a map"));
            };
            let get = |k| field(n, k).and_then(text);
            let host = get("endpoint")
                .filter(|e| !e.is_empty() && e != "?")
                .or_else(|| get("ip"))
                .ok_or_else(|| bad("a node without endpoint or ip"))?;
            let port = get("port")
                .or_else(|| get("tls-port"))
                .ok_or_else(|| bad("a node without a port"))?;
            // An IPv6 host needs brackets in host:port.
            let addr = if host.contains(':') {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
            };
            ns.push(Node {
                addr,
                role: get("role").unwrap_or_default(),
                health: get("health").unwrap_or_default(),
            });
        }
        out.push(Shard { slots, nodes: ns });
    }
    Ok(out)
}

/// Ask `addr` for the cluster's shards.
pub async fn shards(addr: &str, auth: &Credentials) -> Result<Vec<Shard>, RelayError> {
    let mut c = RedisConn::connect(addr).await?;
    auth.auth(&mut c).await?;
    c.send(&[b"CLUSTER", b"SHARDS"]).await?;
    match c.reply().await? {
        Reply::Error(e) if e.starts_with("NOAUTH") => Err(RelayError::Handshake(format!(
            "{addr} requires a password (--master-password)"
        ))),
        r => parse_shards(&r),
    }
}

/// The shards that hold slots, from the first of `seeds` that answers;
/// the error names each seed's failure.
pub async fn discover(seeds: &[String], auth: &Credentials) -> Result<Vec<Shard>, RelayError> {
    let mut why = Vec::new();
    for s in seeds {
        match shards(s, auth).await {
            // A node without slots (a master just added, or a replica whose
            // role the node asked has not learnt yet) holds no data.
            Ok(v) if v.iter().any(|s| !s.slots.is_empty()) => {
                return Ok(v.into_iter().filter(|s| !s.slots.is_empty()).collect())
            }
            Ok(_) => why.push(format!("{s}: no shard has slots")),
            Err(e) => why.push(format!("{s}: {e}")),
        }
    }
    Err(RelayError::Handshake(format!(
        "no cluster node answered CLUSTER SHARDS: {}",
        why.join("; ")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Reply {
        Reply::bulk(s)
    }

    fn node(ip: &str, port: i64, role: &str, health: &str) -> Reply {
        Reply::Array(vec![
            b("id"),
            b("e0a1"),
            b("port"),
            Reply::Int(port),
            b("ip"),
            b(ip),
            b("endpoint"),
            b(ip),
            b("role"),
            b(role),
            b("replication-offset"),
            Reply::Int(0),
            b("health"),
            b(health),
        ])
    }

    #[test]
    fn parses_shards_and_finds_each_master() {
        let r = Reply::Array(vec![
            Reply::Array(vec![
                b("slots"),
                Reply::Array(vec![
                    Reply::Int(0),
                    Reply::Int(99),
                    Reply::Int(200),
                    Reply::Int(5460),
                ]),
                b("nodes"),
                Reply::Array(vec![
                    node("10.0.0.2", 7001, "replica", "online"),
                    node("10.0.0.1", 7000, "master", "online"),
                ]),
            ]),
            Reply::Array(vec![
                b("slots"),
                Reply::Array(vec![Reply::Int(5461), Reply::Int(16383)]),
                b("nodes"),
                Reply::Array(vec![node("::1", 7002, "master", "failed")]),
            ]),
        ]);
        // Through the wire form, as a server sends it.
        let (r, _) = Reply::decode(&r.encode()).unwrap().unwrap();
        let s = parse_shards(&r).unwrap();
        assert_eq!(s[0].name(), "0-99,200-5460");
        assert_eq!(s[0].master(), Some("10.0.0.1:7000"));
        assert_eq!(s[1].name(), "5461-16383");
        assert_eq!(s[1].nodes[0].addr, "[::1]:7002");
        assert_eq!(s[1].master(), None, "a failed master is no master");
        assert!(valid_name("0-99,200-5460") && valid_name("5-5"));
        for n in ["", "0", "9-1", "0-16384", "a-b", "0-5,"] {
            assert!(!valid_name(n), "{n}");
        }
    }

    #[test]
    fn refuses_malformed_replies() {
        let err = Reply::Error("ERR This instance has cluster support disabled".into());
        let e = parse_shards(&err).unwrap_err().to_string();
        assert!(e.contains("cluster-enabled"), "{e}");
        let odd = Reply::Array(vec![Reply::Array(vec![
            b("slots"),
            Reply::Array(vec![Reply::Int(0)]),
            b("nodes"),
            Reply::Array(vec![]),
        ])]);
        assert!(parse_shards(&odd).is_err());
        let no_port = Reply::Array(vec![Reply::Array(vec![
            b("slots"),
            Reply::Array(vec![]),
            b("nodes"),
            Reply::Array(vec![Reply::Array(vec![b("ip"), b("h")])]),
        ])]);
        assert!(parse_shards(&no_port).is_err());
    }
}
