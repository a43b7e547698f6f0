//! Peer node agents (`qr node-agent --peer`): a blob another node agent has
//! complete and verified in its cache is fetched from it over the fabric,
//! as P2P image distributors do, sparing the registry agent; the registry
//! agent stays the fallback whenever a peer lacks the blob, cannot be
//! reached, goes away mid-blob or sends bytes that do not hash to the digest.
//! A peer that failed to answer is skipped for [`DOWN_FOR`], so a dead peer
//! costs one short bootstrap wait, not one per blob.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::client::FabricClient;

/// How long a peer's bootstrap service is asked before the peer counts as
/// unreachable (the registry agent's gets the dial options' longer wait).
pub const PEER_WAIT: Duration = Duration::from_secs(2);

/// How long a peer that failed to answer is left out.
pub const DOWN_FOR: Duration = Duration::from_secs(10);

/// One peer node agent.
#[derive(Debug)]
pub struct Peer {
    /// HOST:PORT of its peer bootstrap service (for logs).
    pub name: String,
    /// Its connection, dialled on demand through the node's client endpoint.
    pub client: Arc<FabricClient>,
    down_until: Mutex<Option<Instant>>,
}

impl Peer {
    /// A peer reached through `client`.
    pub fn new(name: &str, client: Arc<FabricClient>) -> Peer {
        Peer {
            name: name.to_string(),
            client,
            down_until: Mutex::new(None),
        }
    }

    /// Whether to ask it now.
    pub fn usable(&self) -> bool {
        let g = self.down_until.lock().unwrap_or_else(|e| e.into_inner());
        g.is_none_or(|t| Instant::now() >= t)
    }

    /// Leave it out for [`DOWN_FOR`].
    pub fn mark_down(&self) {
        *self.down_until.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(Instant::now() + DOWN_FOR);
    }
}
