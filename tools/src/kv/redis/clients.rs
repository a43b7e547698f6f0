//! Who is connected to the downstream relay's Redis port, for `CLIENT LIST`,
//! `INFO clients`, and — for the links that became replicas — `INFO
//! replication`'s `slaveN:` lines and `ROLE`'s replica list. One table serves
//! all of them, so they always agree.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

/// Where a replica link is in its sync: the states Redis's INFO shows for a
/// master's replicas (replication.c `replstateToString`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReplicaState {
    /// PSYNC received; waiting for the upstream relay's answer (Redis: the
    /// master waits for its BGSAVE).
    WaitBgsave,
    /// The snapshot is being sent.
    SendBulk,
    /// The command stream flows.
    Online,
}

impl ReplicaState {
    /// The name Redis uses in `INFO replication`.
    pub fn as_str(self) -> &'static str {
        match self {
            ReplicaState::WaitBgsave => "wait_bgsave",
            ReplicaState::SendBulk => "send_bulk",
            ReplicaState::Online => "online",
        }
    }
}

/// A connection that sent `PSYNC`.
#[derive(Clone, Debug)]
pub struct ReplicaLink {
    /// Its sync state.
    pub state: ReplicaState,
    /// The offset of its last `REPLCONF ACK` (or where it started).
    pub ack: u64,
    /// When it last acknowledged (or started).
    pub ack_at: Instant,
}

/// One connection of the Redis port.
#[derive(Clone, Debug)]
pub struct Client {
    /// Its id (`CLIENT ID`, `CLIENT LIST`'s `id=`).
    pub id: u64,
    /// The peer's address.
    pub addr: Option<SocketAddr>,
    /// Our end's address.
    pub laddr: Option<SocketAddr>,
    /// Set by `CLIENT SETNAME`.
    pub name: Option<String>,
    /// When it connected.
    pub since: Instant,
    /// When it last sent a command.
    pub active: Instant,
    /// The last command's name, lowercased (`CLIENT LIST`'s `cmd=`).
    pub last_cmd: String,
    /// `REPLCONF listening-port`: the port its own clients reach it on.
    pub listening_port: u16,
    /// `REPLCONF ip-address`: the address it announces instead of its peer
    /// address (Redis `replica-announce-ip`).
    pub announced_ip: Option<String>,
    /// Set once it sent `PSYNC`.
    pub replica: Option<ReplicaLink>,
}

impl Client {
    /// The address a replica is known by: the one it announced, else its
    /// peer IP (as Redis's INFO and ROLE show it).
    pub fn replica_ip(&self) -> String {
        match (&self.announced_ip, self.addr) {
            (Some(ip), _) => ip.clone(),
            (None, Some(a)) => a.ip().to_string(),
            (None, None) => "?".into(),
        }
    }
}

/// The table of connections.
#[derive(Debug, Default)]
pub struct Clients {
    table: Mutex<BTreeMap<u64, Client>>,
}

impl Clients {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<u64, Client>> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Add connection `id`; it leaves the table when the returned handle drops.
    pub fn register(
        self: &Arc<Self>,
        id: u64,
        addr: Option<SocketAddr>,
        laddr: Option<SocketAddr>,
    ) -> Registration {
        let now = Instant::now();
        self.lock().insert(
            id,
            Client {
                id,
                addr,
                laddr,
                name: None,
                since: now,
                active: now,
                last_cmd: "NULL".into(),
                listening_port: 0,
                announced_ip: None,
                replica: None,
            },
        );
        Registration {
            clients: self.clone(),
            id,
        }
    }

    /// Every connection now, by id.
    pub fn list(&self) -> Vec<Client> {
        self.lock().values().cloned().collect()
    }

    /// The connections that sent `PSYNC`, by id.
    pub fn replicas(&self) -> Vec<Client> {
        self.lock()
            .values()
            .filter(|c| c.replica.is_some())
            .cloned()
            .collect()
    }
}

/// A connection's entry in [`Clients`], removed on drop.
#[derive(Debug)]
pub struct Registration {
    clients: Arc<Clients>,
    id: u64,
}

impl Registration {
    /// The connection's id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Change the connection's entry.
    pub fn update(&self, f: impl FnOnce(&mut Client)) {
        if let Some(c) = self.clients.lock().get_mut(&self.id) {
            f(c);
        }
    }

    /// A copy of the connection's entry.
    pub fn get(&self) -> Option<Client> {
        self.clients.lock().get(&self.id).cloned()
    }

    /// Record the replica's sync state and acknowledged offset.
    pub fn replica(&self, state: ReplicaState, ack: u64) {
        self.update(|c| {
            c.replica = Some(ReplicaLink {
                state,
                ack,
                ack_at: Instant::now(),
            })
        });
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.clients.lock().remove(&self.id);
    }
}
