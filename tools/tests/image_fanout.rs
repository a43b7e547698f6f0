//! Must-show (d): four node agents (separate processes, separate IPs) pull
//! one image at once through one registry agent; each gets it intact, and
//! the upstream registry served each blob once (its access log, and the
//! registry agent's count of upstream fetches).
//!
//! Addresses: 127.0.111.40 docker-registry (TCP 19140), .41 registry agent
//! (bootstrap 19141, metrics 19142), .42–.45 node agents (HTTP 19143–19146).

mod image_support;

use image_support::*;
use quic_rdma_tools::image::metrics::sample;

const REPO: &str = "qr/fanout";
const TAG: &str = "v1";

#[test]
fn four_node_agents_one_upstream_read_per_blob() {
    require(&["docker-registry", "skopeo", "umoci"]);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let registry = Registry::start(d, "127.0.111.40:19140");
    let layout = build_image(d, TAG, &[64 << 20, 2 << 20, 10 << 10]);
    push(&layout, TAG, &registry.addr, REPO);
    let ls = layers(&layout, TAG);
    // Pushing reads nothing back, but be exact about what the pulls did.
    let before: Vec<usize> = ls.iter().map(|(dg, _)| registry.blob_gets(dg)).collect();
    let pki = pki(d, "127.0.111.41");
    let _ra = qr(
        "registry-agent",
        &registry_agent_args(
            &pki,
            "127.0.111.41",
            19141,
            &registry.addr,
            &d.join("rc"),
            "127.0.111.41:19142",
        ),
        &d.join("ra.log"),
    );
    let mut nodes = Vec::new();
    for i in 0..4u16 {
        let ip = format!("127.0.111.{}", 42 + i);
        let listen = format!("{ip}:{}", 19143 + i);
        nodes.push((
            qr(
                &format!("node-agent {i}"),
                &node_agent_args(
                    &pki,
                    &ip,
                    "127.0.111.41:19141",
                    &listen,
                    &d.join(format!("nc{i}")),
                ),
                &d.join(format!("na{i}.log")),
            ),
            listen,
        ));
    }
    let pulls: Vec<_> = nodes
        .iter()
        .enumerate()
        .map(|(i, (_, listen))| {
            let (listen, dest) = (listen.clone(), d.join(format!("pulled{i}")));
            std::thread::spawn(move || (pull(&listen, REPO, TAG, &dest), dest))
        })
        .collect();
    let want = layout_digests(&layout);
    for (i, p) in pulls.into_iter().enumerate() {
        let (out, dest) = p.join().unwrap();
        assert!(
            out.status.success(),
            "pull through node agent {i}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(layout_digests(&dest), want, "node agent {i}");
    }
    for ((dg, size), b) in ls.iter().zip(before) {
        assert_eq!(
            registry.blob_gets(dg) - b,
            1,
            "upstream GETs of {dg} ({size} bytes): {}",
            std::fs::read_to_string(&registry.log).unwrap_or_default()
        );
    }
    let (_, _, m) = http_get("127.0.111.41:19142", "/metrics", &[]);
    let m = String::from_utf8(m).unwrap();
    // Layers and the config blob, each fetched upstream once.
    assert_eq!(
        sample(&m, "qr_registry_upstream_blob_fetches_total"),
        Some((ls.len() + 1) as f64),
        "{m}"
    );
    assert_eq!(sample(&m, "qr_registry_connections_total"), Some(4.0));
    // Each blob: one node started its fetch, at most the three others joined
    // it (once each, however many chunks they read).
    let joins = sample(&m, "qr_registry_single_flight_joins_total").unwrap();
    assert!(joins <= (3 * (ls.len() + 1)) as f64, "{joins} joins: {m}");
}
