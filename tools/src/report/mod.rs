//! What a `qr` run reports, in two forms: the JSON schema (`schema.rs`: serde
//! structs, key names stable for scripts) and the human text (`human.rs`: the
//! same figures as a summary and a table, via `Display`).
//!
//! Reports are filled from quinn's, the library's and the workload's own
//! types; nothing here runs anything.

mod human;
mod schema;

pub(crate) use schema::{
    hex, EndpointsReport, FabricReport, PingReport, QuicReport, Report, RttReport, ServeSummary,
    SocketReport, SocketsReport, SoftPortReport, SoftPortsReport, TransferReport, UdEndpointReport,
};
