//! Counters of both agents, always on, exported as Prometheus text
//! (`crate::metric::Text`) by the node agent's `/metrics` and the registry
//! agent's `--metrics` listener.

use quic_rdma::counters::{Counters, Kind, Metric};

use crate::metric::Text;
pub use crate::metric::{sample, Counter, Gauge, Histogram, HistogramVec, Label};

/// Where the bytes of an answer came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// The local content-addressed cache.
    Cache,
    /// The registry agent over the fabric.
    Fabric,
    /// The upstream registry over plain HTTP (objects under the threshold).
    Direct,
    /// Another node agent over the fabric (`--peer`).
    Peer,
}

impl Path {
    /// The label value.
    pub fn name(self) -> &'static str {
        match self {
            Path::Cache => "cache",
            Path::Fabric => "fabric",
            Path::Direct => "direct",
            Path::Peer => "peer",
        }
    }
}

/// What an HTTP request of the node agent asked for (the `route` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouteKind {
    /// `/v2/<name>/manifests/<reference>`.
    Manifest,
    /// `/v2/<name>/blobs/<digest>`.
    Blob,
    /// `/v2/<name>/tags/list`.
    Tags,
    /// Anything else (`/v2/`, `/metrics`, errors).
    Other,
}

impl Label for RouteKind {
    const KEY: &'static str = "route";
    const ALL: &'static [Self] = &[
        RouteKind::Manifest,
        RouteKind::Blob,
        RouteKind::Tags,
        RouteKind::Other,
    ];
    fn name(self) -> &'static str {
        match self {
            RouteKind::Manifest => "manifest",
            RouteKind::Blob => "blob",
            RouteKind::Tags => "tags",
            RouteKind::Other => "other",
        }
    }
    fn index(self) -> usize {
        self as usize
    }
}

/// What a `qr-image/1` request asked for (the `request` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestKind {
    /// A manifest or index.
    Manifest,
    /// A blob's size.
    Stat,
    /// A blob chunk.
    Blob,
    /// A tag list.
    Tags,
    /// Not a valid request.
    Malformed,
}

impl Label for RequestKind {
    const KEY: &'static str = "request";
    const ALL: &'static [Self] = &[
        RequestKind::Manifest,
        RequestKind::Stat,
        RequestKind::Blob,
        RequestKind::Tags,
        RequestKind::Malformed,
    ];
    fn name(self) -> &'static str {
        match self {
            RequestKind::Manifest => "manifest",
            RequestKind::Stat => "stat",
            RequestKind::Blob => "blob",
            RequestKind::Tags => "tags",
            RequestKind::Malformed => "malformed",
        }
    }
    fn index(self) -> usize {
        self as usize
    }
}

/// The node agent's counters.
#[derive(Debug, Default)]
pub struct NodeMetrics {
    /// HTTP requests answered.
    pub requests: Counter,
    /// HTTP requests refused as malformed (400).
    pub bad_requests: Counter,
    /// Answers that were errors (4xx/5xx other than 400).
    pub errors: Counter,
    /// Body bytes served from the cache.
    pub bytes_cache: Counter,
    /// Body bytes fetched over the fabric.
    pub bytes_fabric: Counter,
    /// Body bytes fetched straight from the upstream.
    pub bytes_direct: Counter,
    /// Objects fetched by each path.
    pub objects_fabric: Counter,
    /// Objects fetched straight from the upstream.
    pub objects_direct: Counter,
    /// Body bytes fetched from peer node agents.
    pub bytes_peer: Counter,
    /// Objects fetched from peer node agents.
    pub objects_peer: Counter,
    /// Blob fetches from a peer that failed (unreachable, lost, bad data)
    /// and went on to the next peer or the registry agent.
    pub peer_fallbacks: Counter,
    /// This node agent's own peer server (`--serve-peers`): what it served
    /// other node agents from its cache.
    pub peer_server: std::sync::Arc<RegistryMetrics>,
    /// The peer server's Retry gate, once it serves (exported as every
    /// serving command's `qr_quinn_retries_total` and
    /// `qr_quinn_unvalidated_handshakes`).
    pub peer_retry: std::sync::OnceLock<quic_rdma::quinn_adapter::RetryGate>,
    /// The node agent's certificate reloads and expiry (`qr_tls_*`), set
    /// by the agent once its identity is loaded.
    pub tls: std::sync::OnceLock<std::sync::Arc<crate::identity::TlsStats>>,
    /// Manifests and tag lists the registry agent served stale (its
    /// upstream unreachable), each answered with `X-Qr-Stale`.
    pub manifests_stale: Counter,
    /// Blob lookups found in the cache.
    pub cache_hits: Counter,
    /// Blob lookups not found in the cache.
    pub cache_misses: Counter,
    /// Blob requests that joined a fetch under way (and streamed it as it
    /// arrived) instead of starting one.
    pub flight_joins: Counter,
    /// Whole-blob or chunk digests that did not match (cached copies found
    /// corrupt included).
    pub verify_failures: Counter,
    /// Blob responses cut short after their first byte: the fetch they
    /// streamed failed, or gave up their source for another.
    pub responses_cut: Counter,
    /// Blob requests answered `502 DIGEST_INVALID`: no source gave the blob
    /// intact (before the response's first byte).
    pub digest_refusals: Counter,
    /// Cached copies found corrupt when read again or by the scrub,
    /// quarantined and fetched afresh (`cache::Cache::get_verified`).
    pub cache_corrupt: Counter,
    /// Bytes the cache scrub read (`cache::Cache::scrub`).
    pub cache_scrubbed_bytes: Counter,
    /// Transfers resumed after a lost connection or a failed chunk: one per
    /// interruption, however many chunks it failed.
    pub resumes: Counter,
    /// Chunk requests in flight.
    pub inflight_chunks: Gauge,
    /// Chunk requests completed.
    pub chunks: Counter,
    /// The latest adaptive chunk size in bytes.
    pub chunk_size: Gauge,
    /// HTTP request durations (to the body's end), by route.
    pub request_duration: HistogramVec<RouteKind>,
}

impl NodeMetrics {
    /// Count body bytes fetched by `path`.
    pub fn bytes(&self, path: Path, n: u64) {
        match path {
            Path::Cache => self.bytes_cache.add(n),
            Path::Fabric => self.bytes_fabric.add(n),
            Path::Direct => self.bytes_direct.add(n),
            Path::Peer => self.bytes_peer.add(n),
        }
    }

    /// The Prometheus text: the visited values, then the families by path
    /// and the histograms.
    pub fn render(&self) -> String {
        let by_path = |series: &[(Path, &Counter)]| {
            series
                .iter()
                .map(|(p, c)| (p.name(), c.get()))
                .collect::<Vec<_>>()
        };
        let bytes = by_path(&[
            (Path::Cache, &self.bytes_cache),
            (Path::Fabric, &self.bytes_fabric),
            (Path::Direct, &self.bytes_direct),
            (Path::Peer, &self.bytes_peer),
        ]);
        let objects = by_path(&[
            (Path::Fabric, &self.objects_fabric),
            (Path::Direct, &self.objects_direct),
            (Path::Peer, &self.objects_peer),
        ]);
        let mut o = Text::default()
            .visited("qr_node", self)
            .family(
                "qr_node_bytes",
                "Body bytes by path",
                Kind::Counter,
                "path",
                bytes,
            )
            .family(
                "qr_node_objects",
                "Objects fetched by path",
                Kind::Counter,
                "path",
                objects,
            )
            .histograms(
                "qr_node_request_duration_seconds",
                "HTTP request durations, to the end of the response body, by route",
                RouteKind::KEY,
                self.request_duration.each(),
            )
            .render();
        if let Some(gate) = self.peer_retry.get() {
            crate::endpoint_metrics::retry_gate(&mut o, gate);
        }
        if let Some(tls) = self.tls.get() {
            o.push_str(&tls.render());
        }
        o
    }
}

/// The plain counters and gauges (the families by path and the histograms
/// are written by [`NodeMetrics::render`]); each name is `qr_node_` + this
/// one, as the agent has always exported them.
impl Counters for NodeMetrics {
    fn visit(&self, f: &mut dyn FnMut(Metric)) {
        quic_rdma::visit_fields!(f, self, None;
            requests: Counter, Count, "HTTP requests answered";
            bad_requests: Counter, Count, "Malformed HTTP requests (400)";
            errors: Counter, Count, "Error answers other than 400";
            peer_fallbacks: Counter, Count, "Peer fetches that failed and fell back";
        );
        // The peer server's own counters, named as what this node served.
        quic_rdma::visit_fields!(f, self.peer_server, None;
            requests => peer_served_requests: Counter, Count, "Requests served to peers";
            bytes_sent => peer_served_bytes: Counter, Bytes, "Blob bytes served to peers";
            errors => peer_served_errors: Counter, Count, "Error answers to peers (mostly: blob not cached here)";
            handshake_failures => peer_handshake_failures: Counter, Count, "Peer handshakes refused";
        );
        quic_rdma::visit_fields!(f, self, None;
            manifests_stale: Counter, Count, "Manifests and tag lists served stale (the upstream registry unreachable)";
            cache_hits: Counter, Count, "Blob cache hits";
            cache_misses: Counter, Count, "Blob cache misses";
            flight_joins => single_flight_joins: Counter, Count, "Blob requests that joined a fetch under way";
            verify_failures: Counter, Count, "Digest mismatches";
            responses_cut: Counter, Count, "Blob responses cut short after their first byte (the fetch failed or changed source)";
            digest_refusals: Counter, Count, "Blob requests answered 502 DIGEST_INVALID (no source gave the blob intact)";
            cache_corrupt: Counter, Count, "Cached copies found corrupt, quarantined and fetched again";
            cache_scrubbed_bytes: Counter, Bytes, "Bytes the cache scrub read";
            resumes: Counter, Count, "Transfers resumed";
            chunks: Counter, Count, "Chunks fetched";
            inflight_chunks: Gauge, Count, "Chunk requests in flight";
            chunk_size => chunk_size_bytes: Gauge, Bytes, "Current adaptive chunk size";
        );
    }
}

/// The registry agent's counters.
#[derive(Debug, Default)]
pub struct RegistryMetrics {
    /// Connections accepted (mutual TLS passed).
    pub connections: Counter,
    /// Connections refused in the handshake.
    pub handshake_failures: Counter,
    /// Requests served, any kind.
    pub requests: Counter,
    /// Requests refused as malformed.
    pub bad_requests: Counter,
    /// Connections and requests the access policy refused.
    pub denied: Counter,
    /// Requests answered with an error.
    pub errors: Counter,
    /// Blob bytes sent over the fabric.
    pub bytes_sent: Counter,
    /// Manifests and tag lists asked of the upstream.
    pub upstream_manifests: Counter,
    /// Manifests and tag lists answered from the manifest cache without
    /// asking the upstream (by digest, or by tag within the TTL).
    pub manifest_cache_hits: Counter,
    /// Manifests and tag lists served stale: past the TTL, the upstream
    /// unreachable (`manifests::ManifestCache`).
    pub manifests_stale: Counter,
    /// Blobs fetched from the upstream (single-flight: one per blob however
    /// many nodes ask at once).
    pub upstream_blob_fetches: Counter,
    /// Bytes read from the upstream.
    pub upstream_bytes: Counter,
    /// Upstream blobs whose bytes did not hash to their digest.
    pub upstream_verify_failures: Counter,
    /// Cached copies found corrupt when read again or by the scrub,
    /// quarantined and fetched afresh from the source
    /// (`cache::Cache::get_verified`).
    pub cache_corrupt: Counter,
    /// Bytes the cache scrub read (`cache::Cache::scrub`).
    pub cache_scrubbed_bytes: Counter,
    /// Requesters (node connections) that joined a blob fetch already under
    /// way: once per blob each, however many chunks they read.
    pub single_flight_joins: Counter,
    /// Request durations (read to finished answer), by request kind.
    pub request_duration: HistogramVec<RequestKind>,
}

impl RegistryMetrics {
    /// The Prometheus text: the visited counters, then the histogram.
    pub fn render(&self) -> String {
        Text::default()
            .visited("qr_registry", self)
            .histograms(
                "qr_registry_request_duration_seconds",
                "Request durations, from the request read to the answer finished, by request kind",
                RequestKind::KEY,
                self.request_duration.each(),
            )
            .render()
    }
}

/// The plain counters (the histogram is written by
/// [`RegistryMetrics::render`]); each name is `qr_registry_` + this one.
impl Counters for RegistryMetrics {
    fn visit(&self, f: &mut dyn FnMut(Metric)) {
        quic_rdma::visit_fields!(f, self, None;
            connections: Counter, Count, "Connections accepted";
            handshake_failures: Counter, Count, "Handshakes refused";
            requests: Counter, Count, "Requests served";
            bad_requests: Counter, Count, "Malformed requests";
            denied: Counter, Count, "Connections and requests the access policy refused";
            errors: Counter, Count, "Error answers";
            bytes_sent => sent_bytes: Counter, Bytes, "Blob bytes sent";
            upstream_manifests: Counter, Count, "Manifests and tag lists asked of the upstream";
            manifest_cache_hits: Counter, Count, "Manifests and tag lists answered from the cache without the upstream";
            manifests_stale: Counter, Count, "Manifests and tag lists served stale while the upstream was unreachable";
            upstream_blob_fetches: Counter, Count, "Blobs fetched upstream";
            upstream_bytes: Counter, Bytes, "Bytes read upstream";
            upstream_verify_failures: Counter, Count, "Upstream digest mismatches";
            cache_corrupt: Counter, Count, "Cached copies found corrupt, quarantined and fetched again";
            cache_scrubbed_bytes: Counter, Bytes, "Bytes the cache scrub read";
            single_flight_joins: Counter, Count, "Requests joining a fetch under way";
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_and_read_back() {
        let m = NodeMetrics::default();
        m.cache_hits.add(3);
        m.bytes(Path::Fabric, 10);
        let t = m.render();
        assert_eq!(sample(&t, "qr_node_cache_hits_total"), Some(3.0));
        assert_eq!(
            sample(&t, "qr_node_bytes_total{path=\"fabric\"}"),
            Some(10.0)
        );
        assert_eq!(sample(&t, "qr_node_bytes_total{path=\"cache\"}"), Some(0.0));
        // The peer server's Retry counts appear once it serves.
        assert_eq!(sample(&t, "qr_quinn_retries_total"), None);
        let _ = m
            .peer_retry
            .set(quic_rdma::quinn_adapter::RetryGate::default());
        let t = m.render();
        assert_eq!(sample(&t, "qr_quinn_retries_total"), Some(0.0));
        assert_eq!(sample(&t, "qr_quinn_unvalidated_handshakes"), Some(0.0));
        crate::prom_text::parse(&t).unwrap();
    }
}
