//! Benchmarks of quic-rdma: criterion micro benches (`benches/`), the side-by-side
//! comparison harness (`compare`) and the callgrind driver (`bulk-once`).
//!
//! The harness measures every transport ("row") with the same payloads and the
//! same workloads, one row at a time on one machine:
//! - **bulk**: one stream, client → server, seeded data verified by sha256 end to end;
//! - **rtt**: 64-byte request / 64-byte response on one stream, per-iteration latency;
//! - **handshakes**: connections set up and closed, one after another.
//!
//! Each side of a workload runs in its own OS thread, pinned to a core
//! ([`affinity`]), with its own single-threaded runtime (async rows) or its own
//! busy-poll loop (the engine), so each side's CPU time is the thread's own
//! ([`cpu`]: `getrusage(RUSAGE_THREAD)`, user + system).
//!
//! A row is one small module implementing [`rows::Row`] — async rows implement
//! the narrower [`rows::stack::AsyncStack`] and get `Row` from [`rows::stack::AsyncRow`].

pub mod affinity;
pub mod cli;
pub mod cpu;
pub mod data;
pub mod image;
pub mod latency;
pub mod peer;
pub mod procs;
pub mod report;
pub mod rows;
pub mod side;
pub mod stats;
pub mod tls;
pub mod tuning;
