//! # quic-rdma-ffi
//!
//! The C API of quic-rdma's poll-mode [`Engine`](quic_rdma::engine::Engine):
//! QUIC over RDMA UD for C programs that own one thread and busy-poll it.
//!
//! Conventions (the header `include/quic_rdma.h` is generated from this crate
//! by cbindgen; a test fails when it is stale):
//! - opaque handles with `_new`/`_free` ([`qr_fabric`], [`qr_engine`]);
//!   connections, streams and incoming attempts are plain `uint64_t` ids;
//! - every function returns `QR_OK` (0), a non-negative count, or a negative
//!   `QR_E*` code that [`qr_strerror`] names;
//! - every pointer argument is null-checked (`QR_ENULL`); buffers are the
//!   caller's; events go into the caller's array;
//! - configuration and statistics structs start with `struct_size`, so the ABI
//!   can grow: a caller built against an older header passes a smaller size and
//!   the library reads (or writes) only that prefix;
//! - no panic crosses the boundary: every entry point catches unwinding and
//!   returns `QR_EPANIC`;
//! - time is the monotonic clock, read at each call.

mod affinity;
mod bootstrap;
mod config;
mod conn;
mod datagrams;
mod engine;
mod error;
mod events;
mod fabric;
mod log;
mod options;
mod ptr;
#[cfg(test)]
mod sim_pair;
mod stat_list;
mod stats;
mod streams;
mod tls;
// Completion time stamps (issue 29 gap 7).
mod timestamps;
mod valgrind;
mod version;
mod wait;

pub use affinity::*;
pub use bootstrap::*;
pub use config::*;
pub use conn::*;
pub use datagrams::*;
pub use engine::*;
pub use error::*;
pub use events::*;
pub use fabric::*;
pub use log::*;
pub use options::*;
pub use stat_list::*;
pub use stats::*;
pub use streams::*;
pub use timestamps::*;
pub use tls::*;
pub use version::*;
pub use wait::*;
