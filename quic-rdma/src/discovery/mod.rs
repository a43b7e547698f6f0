//! Discovery: finding a peer's UD address from a host name/IP and a TCP
//! service port (docs/architecture.md §3, *Bootstrap*).
//!
//! A UD peer is (GID, QPN, Q_Key), plus — for `soft` — the UDP port its socket is
//! bound to. A server publishes those on a TCP *service port*; a client that knows
//! only `host:service_port` asks once, then talks RoCEv2. The service is the same
//! for every provider (`sim` excepted, whose endpoints share a process): a `soft`
//! port, a `verbs` device (UDP port 4791) and the C API's engines publish the same
//! record ([`PeerInfo`]), and `qr` and C clients ask with the same [`query`].
//!
//! It sits above the fabric and the socket (it publishes what they granted) and
//! below everything QUIC: nothing in `fabric` or `socket` depends on it.
//!
//! The record and its one-line text form are [`PeerInfo`]; a client asks with
//! [`query`] (once) or [`query_within`] (until a deadline); [`BootstrapServer`]
//! answers, one thread per exchange.
//!
//! ## Protocol (version 1), one exchange per TCP connection, ASCII lines
//! ```text
//! client -> server:  QRDMA-SOFT-BOOTSTRAP 1\n
//! server -> client:  QRDMA-SOFT 1 gid=<GID as IPv6 text> qpn=<dec> qkey=<dec> udp_port=<dec> mtu=<dec> [seg=1]\n
//!               or:  ERR <reason>\n
//! ```
//! `seg=1` says the server's socket reassembles segmented datagrams
//! (docs/architecture.md §6); a reply without it is from a server that does
//! not, which must never be sent parts ([`PeerInfo::check_segmentation`]).
//! Then the server closes. The server gives each exchange 5 s from its accept,
//! however the client paces its bytes, and serves up to 64 clients at once; a
//! connection beyond that is answered `ERR busy` at once (a client may retry).
//! Lines are at most 512 bytes; unknown `key=value` fields
//! are ignored by clients (room to grow without a version bump), missing ones are
//! an error. A text protocol so `printf 'QRDMA-SOFT-BOOTSTRAP 1\n' | nc host port`
//! debugs it. It is unauthenticated, like the UDP port it points at: QUIC's TLS
//! handshake authenticates the peer afterwards, so a forged answer can only make
//! the connection fail, not impersonate the server.

mod client;
mod line;
mod record;
mod server;

pub use client::{query, query_within};
pub use record::{peer_ip, BootstrapError, PeerInfo, MAX_LINE, REQUEST};
pub use server::{
    BootstrapHandle, BootstrapServer, BootstrapStats, DEFAULT_EXCHANGE_DEADLINE,
    DEFAULT_MAX_CONNECTIONS,
};
