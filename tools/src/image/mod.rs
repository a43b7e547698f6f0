//! Image layers over the fabric (docs/architecture.md §8, "Image layers"): a registry
//! agent serving manifests and blobs over QUIC streams (`qr-image/1`, mutual
//! TLS), and a node agent speaking the OCI distribution pull API on local
//! HTTP, so containerd, skopeo or any OCI client pulls through it unchanged.
//!
//! Layout, bottom up: [`digest`] (names, tags, digests), [`wire`] (the
//! protocol's frames), [`source`]/[`upstream`] (where the registry agent gets
//! images), [`manifests`] (its manifest and tag-list cache, served stale
//! while the upstream is down), [`cache`] (the verified, bounded, crash-safe blob store both
//! agents use), [`spool`] (the registry agent's single-flight pull-through),
//! [`server`] (its QUIC side), [`client`] and [`transfer`] (the node agent's
//! QUIC side: parallel, adaptive, resumable chunk streams, written and hashed
//! by a [`sink`]), [`node`] (the node agent's store; requests follow its
//! fetches as they arrive, [`inflight`]), [`peer`] (other node agents it may
//! fetch from, whose caches the [`server`] also serves), [`http`] (its HTTP
//! side) and [`metrics`];
//! [`references`] remembers which repositories reference which blobs;
//! [`platform`] picks an index's entry for a platform.

pub mod cache;
pub mod client;
pub mod digest;
pub mod fabric;
pub mod http;
pub mod inflight;
pub mod manifests;
pub mod metrics;
pub mod node;
pub mod peer;
pub mod platform;
pub mod references;
pub mod server;
pub mod sink;
pub mod source;
pub mod source_error;
pub mod spool;
pub mod transfer;
pub mod upstream;
pub mod wire;
