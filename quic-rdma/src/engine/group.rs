//! An engine group: one [`Engine`] per core, each over its own UD queue pair,
//! connections spread over them (docs/architecture.md §9).
//!
//! A NIC steers a packet to a queue pair by its destination QPN, so the group
//! gives each shard its own QP (on the same port and GID, or — `soft` — a port
//! of its own) and its own routing key. A connection lives on one shard for
//! its life:
//! - **Placement.** The group publishes its shards' addresses (one QPN per
//!   shard, [`EngineGroup::addrs`]); a client picks the destination QPN of a
//!   new connection from that list ([`EngineGroup::connect`]: the *n*-th
//!   connection goes to shard *n* mod N, from the client's shard *n* mod M).
//!   The client chooses because it is the only party that acts before the
//!   first packet: its Initial's DCID is random (RFC 9000 §7.2), so no key in
//!   it can name a shard, and a server that moved a connection after the
//!   handshake would answer from a QPN the client never sent to.
//! - **Keys.** The shard whose QP received the Initial accepts it and issues
//!   every CID with its own 20-bit key, so every later packet carries that
//!   shard's key in its DCID and immediate data (`crate::quic::routing`). The
//!   keys are drawn at random per group and distinct per shard (RFC 9000 §5.1:
//!   nothing linkable beyond the issuer's own routing).
//! - **Wrong core.** Each shard checks that key on receive
//!   ([`RoutingCheck::shard_key`]): a packet carrying another shard's key is
//!   counted ([`RoutingStats::wrong_shard`](crate::quic::routing::RoutingStats))
//!   and dropped, never handed to quinn-proto (see that field for why).
//! - **Nothing shared.** The shards share no state: each has its own engine,
//!   socket, peer table and quinn-proto endpoint. What the providers share
//!   underneath is the provider's (docs/architecture.md §9 measures it).
//!
//! The group is sans-IO like the engine: it only builds and hands out the
//! shards; the caller owns the threads (one per shard, each polling its own
//! engine with its own clock readings).
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Instant;
//! use quic_rdma::engine::{EngineConfig, EngineGroup};
//! use quic_rdma::fabric::sim::{SimFabric, SimQpOptions};
//! use quic_rdma::fabric::Gid;
//!
//! let fabric = SimFabric::new(Default::default());
//! let gid: Gid = "fd00::1".parse::<std::net::Ipv6Addr>()?.into();
//! // Two shards: two QPs on one port (one GID), two routing keys.
//! let qps = vec![
//!     fabric.create_qp(gid, SimQpOptions::default())?,
//!     fabric.create_qp(gid, SimQpOptions::default())?,
//! ];
//! let group = EngineGroup::new(qps, EngineConfig::default())?;
//! assert_eq!(group.addrs().len(), 2); // what a server publishes to clients
//! assert_ne!(group.keys()[0], group.keys()[1]);
//! // One thread per shard; each polls its own engine with its own clock.
//! std::thread::scope(|s| {
//!     for mut engine in group.into_shards() {
//!         s.spawn(move || {
//!             let mut events = Vec::new();
//!             engine.poll(Instant::now(), &mut events);
//!             assert_eq!(engine.routing_stats().wrong_shard, 0);
//!         });
//!     }
//! });
//! # Ok(()) }
//! ```

use std::time::Instant;

use super::{ConnHandle, Engine, EngineConfig, EngineError};
use crate::fabric::{UdAddr, UdQueuePair};
use crate::quic::cid::{random_routing_key, ROUTING_KEY_MASK};
use crate::quic::routing::RoutingCheck;

/// N engines, one per core, each over its own queue pair with its own
/// routing key (see the [module docs](self)).
pub struct EngineGroup<Q: UdQueuePair> {
    shards: Vec<Engine<Q>>,
    keys: Vec<u32>,
}

impl<Q: UdQueuePair> EngineGroup<Q> {
    /// One shard per queue pair in `qps`, each an engine with `cfg` but its
    /// own random routing key (distinct from the others') and the wrong-core
    /// check on. `cfg.routing_key` is not used; `cfg.rng_seed`, if set, is
    /// varied per shard (its last byte XOR the shard's index).
    pub fn new(qps: Vec<Q>, cfg: EngineConfig) -> Result<Self, EngineError> {
        let mut keys: Vec<u32> = Vec::with_capacity(qps.len());
        while keys.len() < qps.len() {
            let k = random_routing_key();
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
        Self::with_keys(qps, cfg, keys)
    }

    /// Like [`new`](Self::new) with the routing keys chosen by the caller
    /// (one per queue pair, distinct, at most 20 bits): for callers that
    /// route by key themselves, and for reproducible tests.
    pub fn with_keys(qps: Vec<Q>, cfg: EngineConfig, keys: Vec<u32>) -> Result<Self, EngineError> {
        if qps.is_empty() {
            return Err(EngineError::InvalidArgument(
                "an engine group needs at least one queue pair",
            ));
        }
        if keys.len() != qps.len() {
            return Err(EngineError::InvalidArgument(
                "an engine group needs one routing key per queue pair",
            ));
        }
        if keys.iter().any(|k| *k > ROUTING_KEY_MASK) {
            return Err(EngineError::InvalidArgument(
                "routing key above 20 bits (ROUTING_KEY_MASK)",
            ));
        }
        if (1..keys.len()).any(|i| keys[..i].contains(&keys[i])) {
            // Two shards with one key could not tell their packets apart.
            return Err(EngineError::InvalidArgument(
                "two shards of an engine group share a routing key: give each its own",
            ));
        }
        let shards = qps
            .into_iter()
            .zip(&keys)
            .enumerate()
            .map(|(i, (qp, &key))| Engine::new(qp, shard_config(&cfg, i, key)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(EngineGroup { shards, keys })
    }

    /// Number of shards.
    pub fn len(&self) -> usize {
        self.shards.len()
    }

    /// Always `false`: a group has at least one shard.
    pub fn is_empty(&self) -> bool {
        self.shards.is_empty()
    }

    /// Every shard's UD address, in shard order: the list a server publishes
    /// so that clients spread their connections over its QPNs.
    pub fn addrs(&self) -> Vec<UdAddr> {
        self.shards.iter().map(Engine::local_addr).collect()
    }

    /// Every shard's routing key, in shard order.
    pub fn keys(&self) -> &[u32] {
        &self.keys
    }

    /// The shard that takes the `nth` connection of a group of `shards`
    /// (round robin): on the client, the shard that opens it; on the server
    /// side, the index into the published [`addrs`](Self::addrs) it goes to.
    pub fn placement(nth: usize, shards: usize) -> usize {
        nth % shards.max(1)
    }

    /// Open the `nth` connection: from shard `nth` mod [`len`](Self::len) to
    /// the server shard `directory[nth mod directory.len()]` (a server
    /// group's [`addrs`](Self::addrs)). Returns the local shard's index and
    /// the connection's handle on that shard.
    pub fn connect(
        &mut self,
        now: Instant,
        nth: usize,
        directory: &[UdAddr],
        server_name: &str,
    ) -> Result<(usize, ConnHandle), EngineError> {
        if directory.is_empty() {
            return Err(EngineError::InvalidArgument(
                "no server address to connect to: pass the server group's addrs()",
            ));
        }
        let shard = Self::placement(nth, self.shards.len());
        let dest = directory[Self::placement(nth, directory.len())];
        let conn = self.shards[shard].connect(now, dest, server_name)?;
        Ok((shard, conn))
    }

    /// Shard `i` (panics if out of range, like slice indexing).
    pub fn shard(&self, i: usize) -> &Engine<Q> {
        &self.shards[i]
    }

    /// Shard `i`, mutably (panics if out of range).
    pub fn shard_mut(&mut self, i: usize) -> &mut Engine<Q> {
        &mut self.shards[i]
    }

    /// All shards, mutably: for a caller driving them from one thread (tests).
    pub fn shards_mut(&mut self) -> &mut [Engine<Q>] {
        &mut self.shards
    }

    /// Wrong-core arrivals summed over the shards (0 in normal operation).
    pub fn wrong_shard(&self) -> u64 {
        self.shards
            .iter()
            .map(|e| e.routing_stats().wrong_shard)
            .sum()
    }

    /// Live connections per shard, in shard order.
    pub fn connections_per_shard(&self) -> Vec<usize> {
        self.shards.iter().map(Engine::connection_count).collect()
    }

    /// The shards, to move one onto each thread.
    pub fn into_shards(self) -> Vec<Engine<Q>> {
        self.shards
    }
}

/// Shard `i`'s config: `cfg` with its key, the wrong-core check, its own RNG seed.
fn shard_config(cfg: &EngineConfig, i: usize, key: u32) -> EngineConfig {
    let mut c = cfg.clone();
    c.routing_key = key;
    c.routing = RoutingCheck {
        shard_key: Some(key),
        ..cfg.routing
    };
    if let Some(seed) = &mut c.rng_seed {
        seed[31] ^= i as u8;
    }
    c
}

impl<Q: UdQueuePair> std::fmt::Debug for EngineGroup<Q> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineGroup")
            .field("shards", &self.shards)
            .field("keys", &self.keys)
            .finish()
    }
}
