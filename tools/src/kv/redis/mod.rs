//! The Redis relay: real Redis replication carried over the channel.
//!
//! ```text
//! Redis master --TCP--> upstream relay ==QUIC/fabric==> downstream relay --TCP--> Redis replica(s)
//!                       (a replica to it;               (a master to them;
//!                        the channel's master)            the channel's replica)
//! ```
//!
//! The protocol is Redis's own replication
//! (https://redis.io/docs/latest/operate/oss_and_stack/management/replication/,
//! "How Redis replication works" and "Replication internals"; replication.c):
//! a replica says `PING`, optionally `AUTH`, `REPLCONF listening-port`,
//! `REPLCONF capa eof capa psync2`, then `PSYNC <replid> <offset+1>` (or
//! `PSYNC ? -1`); the master answers `+FULLRESYNC <replid> <offset>` followed by
//! an RDB snapshot and the command stream, or `+CONTINUE [<replid>]` followed by
//! the command stream from the requested offset. The replica acknowledges with
//! `REPLCONF ACK <offset>` every second and when asked (`REPLCONF GETACK`).
//!
//! Positions on the channel are Redis replication offsets, so the replid and
//! offsets a real replica sees are the real master's: the RDB and the command
//! stream pass through byte for byte.
//!
//! Where state lives: the upstream relay holds the channel's backlog and the
//! latest snapshot (a file); the downstream relay holds nothing but bytes in
//! flight. A real replica reconnecting to a downstream relay (restarted or
//! not) names its replid and offset in `PSYNC`; the downstream relay asks the
//! upstream relay for exactly that, and answers `+CONTINUE` when the
//! upstream's backlog still holds it.

pub mod auth;
pub mod clients;
pub mod cluster;
pub mod commands;
pub mod conn;
pub mod downstream;
pub mod error;
pub mod history;
pub mod info;
pub mod locate;
pub mod rdb;
pub mod reply;
pub mod resp;
pub mod upstream;

pub use error::RelayError;
