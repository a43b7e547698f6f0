//! The transports compared ("rows") and the workloads each must run.
//!
//! A row is one small module: async transports implement
//! [`stack::AsyncStack`] (listen, dial, open/accept a stream) and get the
//! workloads from [`stack::AsyncRow`]; the busy-polled engine implements [`Row`]
//! directly in [`engine`], generic over the queue pair's provider.

pub mod engine;
mod exchange;
pub mod ideal;
mod quic;
pub mod quinn_sim;
pub mod quinn_udp;
pub mod raw_ud;
pub mod soft;
pub mod stack;
pub mod tcp;

use std::net::SocketAddr;

use quic_rdma::fabric::Mtu;

use serde::{Deserialize, Serialize};

use crate::affinity::Placement;
use crate::cpu::CpuUsed;

/// Size of a request and of a response in the RTT workload.
pub const RTT_MSG: usize = 64;
/// Bytes handed to a stream per write in the bulk workload.
pub const WRITE_CHUNK: usize = 128 << 10;
/// RTT iterations run before sampling starts.
pub const RTT_WARMUP: usize = 1000;

/// One bulk transfer, client → server.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BulkOutcome {
    /// Payload bytes moved.
    pub bytes: u64,
    /// Seconds from the first write to the server's acknowledgement of the last byte.
    pub secs: f64,
    /// The sha256 the server computed over what arrived equals the sender's.
    pub sha256_ok: bool,
    /// Client thread CPU over the transfer.
    pub client_cpu: CpuUsed,
    /// Server thread CPU over the transfer.
    pub server_cpu: CpuUsed,
}

/// Request/response latencies, measured at the client.
#[derive(Clone, Debug, Default)]
pub struct RttOutcome {
    /// One round trip per sample, in nanoseconds.
    pub samples_ns: Vec<u64>,
    /// What each side's connection sent over the whole run (client, server),
    /// from quinn-proto's statistics; `None` for rows that do not run
    /// quinn-proto in this process.
    pub sent: Option<(SentPackets, SentPackets)>,
}

/// Packets one side's QUIC connection sent, from quinn-proto's
/// `ConnectionStats`, read just before the connection closes: two runs of
/// different lengths, subtracted, give the packets of one round trip (how many
/// carry data, how many only acknowledge).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SentPackets {
    /// UDP-equivalent datagrams (QUIC packets, coalesced ones counted once).
    pub datagrams: u64,
    /// ACK frames.
    pub acks: u64,
    /// STREAM frames.
    pub stream_frames: u64,
    /// MAX_DATA and MAX_STREAM_DATA frames (flow-control credit).
    pub credit_frames: u64,
}

impl SentPackets {
    /// The figures of `stats`.
    pub fn of(stats: &quinn_proto::ConnectionStats) -> Self {
        SentPackets {
            datagrams: stats.udp_tx.datagrams,
            acks: stats.frame_tx.acks,
            stream_frames: stats.frame_tx.stream,
            credit_frames: stats.frame_tx.max_data + stats.frame_tx.max_stream_data,
        }
    }
}

/// Connections set up one after another.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct HandshakeOutcome {
    /// Handshakes completed.
    pub count: u64,
    /// Seconds the client spent on them.
    pub secs: f64,
}

/// Workload parameters of one bulk run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BulkParams {
    /// Bytes to move.
    pub bytes: u64,
    /// Keep and hash every received byte (off only for instruction counting).
    pub verify: bool,
}

/// One side of a workload run in a process of its own (the two-process
/// placement, [`crate::procs`]).
pub enum ProcessSide<'a> {
    /// Listen, hand the address to dial to the callback, then serve.
    Server(&'a mut dyn FnMut(SocketAddr) -> anyhow::Result<()>),
    /// Dial this address and run the workload's client.
    Client(SocketAddr),
}

/// A workload of the two-process placement: which one a side process runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// One bulk transfer ([`BulkParams`]).
    Bulk(BulkParams),
    /// This many sampled round trips.
    Rtt(usize),
    /// This many handshakes.
    Handshakes(usize),
}

/// What one side process of a bulk transfer reports.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct SideOutcome {
    /// Client: first write → the server's acknowledgement. Server: 0.
    pub secs: f64,
    /// The process's CPU over its part of the transfer.
    pub cpu: CpuUsed,
    /// Client: the server's sha256 equals the expected one. Server: every byte arrived.
    pub ok: bool,
}

/// A transport under comparison.
pub trait Row: Send + Sync {
    /// Short unique name (used as the JSON key and in the plot).
    fn name(&self) -> String;
    /// One line on what runs: stack, MTU, driver.
    fn description(&self) -> String;
    /// One bulk transfer.
    fn bulk(&self, params: BulkParams, place: Placement) -> anyhow::Result<BulkOutcome>;
    /// `iters` sampled 64-byte round trips (after [`RTT_WARMUP`] unsampled ones).
    fn rtt(&self, iters: usize, place: Placement) -> anyhow::Result<RttOutcome>;
    /// `count` handshakes, each connection closed before the next starts.
    fn handshakes(&self, count: usize, place: Placement) -> anyhow::Result<HandshakeOutcome>;
    /// Whether the two sides can run in separate processes (`false` for the
    /// in-process `sim` fabric).
    fn crosses_processes(&self) -> bool;
    /// Whether the row runs the RTT workload only (the raw-UD floor: no
    /// streams, no handshake); the harness skips its other workloads.
    fn rtt_only(&self) -> bool {
        false
    }
    /// One side of a bulk transfer in this process (see [`crate::procs`]).
    fn bulk_side(&self, p: BulkParams, side: ProcessSide<'_>) -> anyhow::Result<SideOutcome>;
    /// One side of the RTT workload in this process: the client returns its
    /// samples (nanoseconds), the server none.
    fn rtt_side(&self, iters: usize, side: ProcessSide<'_>) -> anyhow::Result<Vec<u64>>;
    /// One side of the handshake workload in this process: the client returns
    /// the seconds it spent, the server 0.
    fn handshakes_side(&self, count: usize, side: ProcessSide<'_>) -> anyhow::Result<f64>;
}

/// Every row this build can run, in table order.
pub fn all_rows() -> Vec<Box<dyn Row>> {
    vec![
        Box::new(raw_ud::RawUd::new(engine::SimPairs::default())),
        Box::new(engine::EngineRow::sim()),
        Box::new(engine::EngineRow::sim().adaptive()),
        Box::new(stack::AsyncRow::new(quinn_sim::QuinnSim::new())),
        Box::new(ideal::Ideal::new()),
        Box::new(raw_ud::RawUd::new(soft::SoftPairs::new())),
        Box::new(engine::EngineRow::new(soft::SoftPairs::new())),
        Box::new(engine::EngineRow::new(soft::SoftPairs::new()).adaptive()),
        Box::new(stack::AsyncRow::new(soft::QuinnSoft::new())),
        Box::new(engine::EngineRow::new(soft::SoftPairs::with_mtu(
            Mtu::M1024,
        ))),
        Box::new(stack::AsyncRow::new(soft::QuinnSoft::with_mtu(Mtu::M1024))),
        Box::new(stack::AsyncRow::new(quinn_udp::QuinnUdp::new(None))),
        Box::new(stack::AsyncRow::new(quinn_udp::QuinnUdp::new(Some(4096)))),
        Box::new(stack::AsyncRow::new(tcp::Tcp::tls())),
        Box::new(stack::AsyncRow::new(tcp::Tcp::plain())),
        // The fair latency peers of the busy-polled engine rows.
        Box::new(stack::AsyncRow::spinning(quinn_udp::QuinnUdp::new(Some(
            4096,
        )))),
        Box::new(stack::AsyncRow::spinning(tcp::Tcp::tls())),
        Box::new(stack::AsyncRow::spinning(tcp::Tcp::plain())),
    ]
}

/// The row the `soft` target is judged on (QUIC over userspace RoCEv2 on loopback).
pub const SOFT_ROW: &str = "engine/soft";
