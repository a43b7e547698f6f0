//! Every command's `/metrics` page, as its renderers compose it (gateway,
//! registry-agent, node-agent, kv-relay, the TCP listeners), passes
//! `promtool check metrics`: valid Prometheus text whose counters end in
//! `_total`, gauges do not, and units are base units. `qr serve`'s page is
//! scraped live and checked the same way in `serve_metrics.rs`.

mod common;

use quic_rdma_tools::image::cache::Cache;
use quic_rdma_tools::image::metrics::{NodeMetrics, RegistryMetrics};
use quic_rdma_tools::listener::ListenerStats;

#[test]
fn every_commands_metrics_page_passes_promtool() {
    let dir = common::TempDir::new("metrics-promtool");
    let cache = Cache::open(dir.path("cache").as_path(), 1 << 20).unwrap();
    let tcp = [ListenerStats::new("http"), ListenerStats::new("resp")];

    let mut registry = RegistryMetrics::default().render();
    cache.prometheus("qr_registry", &mut registry);
    common::promtool_check("registry-agent", &registry);

    let mut node = NodeMetrics::default().render();
    cache.prometheus("qr_node", &mut node);
    node += &ListenerStats::prometheus([&tcp[0]]);
    common::promtool_check("node-agent", &node);

    common::promtool_check(
        "gateway",
        &quic_rdma_tools::gateway::GatewayStats::default().prometheus(),
    );

    for role in ["master", "replica", "upstream"] {
        let kv = quic_rdma_tools::kv::Metrics::default().prometheus(role)
            + &ListenerStats::prometheus(&tcp);
        common::promtool_check(&format!("kv-relay {role}"), &kv);
    }
}
