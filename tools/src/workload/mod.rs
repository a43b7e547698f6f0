//! The workload `qr demo`, `qr serve` and `qr connect` run on one QUIC
//! connection, client half and server half: first a bulk transfer client ->
//! server verified by sha256 ([`transfer`]), then a small-message ping-pong
//! timed round trip by round trip ([`ping`]), each on its own bidirectional
//! stream opened by the client.
//!
//! It knows quinn connections only: no provider, no report, no command line.

mod ping;
mod transfer;

pub(crate) use ping::{run_pings, serve_pings};
pub(crate) use transfer::{run_transfer, serve_transfer, TransferOutcome};
