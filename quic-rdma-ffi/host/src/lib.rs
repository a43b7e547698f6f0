//! # quic-rdma-ffi-host
//!
//! Rust programs that host C code written against quic-rdma's C API in one
//! process, so the C examples are proven against peers that do not go through
//! the C API: servers written in Rust straight on [`quic_rdma::engine`].
//!
//! - [`EchoServer`]: a QUIC echo server on the engine, on its own thread, that
//!   also digests everything it received.
//! - [`c_latency_client`]: the C latency client (`examples/qr_latency.h`, the
//!   measurement `examples/latency.c` prints) against any server address.
//! - [`SelfSigned`]: the certificate the two sides share.
//!
//! The C side is compiled by `build.rs` and linked ahead of `quic-rdma-ffi`.

pub mod c_program;
mod echo;
mod latency;
mod tls;

pub use echo::{EchoReport, EchoServer};
pub use latency::{c_latency_client, sent_request_digest, LatencyResult, MSG};
pub use tls::SelfSigned;
