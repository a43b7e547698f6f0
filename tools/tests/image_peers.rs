//! Issue 11 item 6, peers: a node agent fetches blobs from another node agent
//! that has them (`--peer`, over the fabric with the same mutual TLS), and
//! falls back to the registry agent when the peer serves bad data or is gone.
//! Every agent is its own process over `soft`.
//!
//! A pulls the image from the registry agent. B (peer A) gets every blob from
//! A: the registry agent sends no blob byte. One blob is then corrupted in
//! A's cache: C (peer A) drops A's copy of it (whole-blob sha256), caches and
//! serves the registry agent's, and takes the others from A. A is killed: D
//! (peer A) gets everything from the registry agent. Every body is sha256-
//! checked against its digest.
//!
//! Addresses: 127.0.111.70 registry agent (bootstrap 19170, metrics 19171),
//! .71 A (HTTP 19172, peer service 19173), .72 B (19174), .73 C (19175),
//! .74 D (19176).

mod image_support;

use image_support::*;
use quic_rdma_tools::image::digest::Digest;
use quic_rdma_tools::image::metrics::sample;

const REPO: &str = "qr/peers";
const TAG: &str = "v1";
const RA_METRICS: &str = "127.0.111.70:19171";
const A_PEER: &str = "127.0.111.71:19173";

/// Pull the image through a node agent's HTTP API: the manifest, then every
/// blob, each body's sha256 equal to its digest.
/// Pull the image's blobs from `listen` as an OCI client does (retrying a
/// response cut short); how many responses were cut short.
fn pull_http(listen: &str, want: &[(String, u64)]) -> usize {
    let (st, _, body) = http_get(
        listen,
        &format!("/v2/{REPO}/manifests/{TAG}"),
        &[("Accept", "application/vnd.oci.image.manifest.v1+json")],
    );
    assert_eq!(
        st,
        200,
        "manifest via {listen}: {}",
        String::from_utf8_lossy(&body)
    );
    let m: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let got: Vec<String> = std::iter::once(&m["config"])
        .chain(m["layers"].as_array().unwrap())
        .map(|b| b["digest"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(got, want.iter().map(|(d, _)| d.clone()).collect::<Vec<_>>());
    let mut cut_short = 0;
    for (d, size) in want {
        let (st, _, body, cut) = http_get_retrying(listen, &format!("/v2/{REPO}/blobs/{d}"), &[]);
        cut_short += cut;
        assert_eq!(
            st,
            200,
            "blob {d} via {listen}: {}",
            String::from_utf8_lossy(&body)
        );
        assert_eq!(body.len() as u64, *size, "blob {d} via {listen}");
        assert_eq!(&Digest::of(&body).to_string(), d, "blob {d} via {listen}");
    }
    cut_short
}

fn metrics(addr: &str) -> String {
    let (st, _, m) = http_get(addr, "/metrics", &[]);
    assert_eq!(st, 200);
    String::from_utf8(m).unwrap()
}

fn metric(text: &str, name: &str) -> u64 {
    sample(text, name).unwrap_or_else(|| panic!("no {name} in\n{text}")) as u64
}

// Manifests count here too: they always come from the registry agent.
const FABRIC: &str = "qr_node_bytes_total{path=\"fabric\"}";
const PEER: &str = "qr_node_bytes_total{path=\"peer\"}";
const SENT: &str = "qr_registry_sent_bytes_total";

#[test]
fn blobs_come_from_a_peer_and_fall_back_to_the_registry_agent() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let l = write_layout(&d.join("layout"), TAG, &[24 << 20, 4 << 20]);
    let (layout, blobs, mlen) = (l.dir, l.blobs, l.manifest_len);
    let total: u64 = blobs.iter().map(|(_, s)| s).sum();
    let pki = pki(d, "127.0.111.70");
    // The layout instead of an upstream: this test needs no docker-registry.
    let ra_args = layout_registry_agent_args(
        &pki,
        "127.0.111.70",
        19170,
        &layout,
        REPO,
        &d.join("rc"),
        RA_METRICS,
    );
    let _ra = qr("registry-agent", &ra_args, &d.join("ra.log"));
    let node = |name: &str, ip: &str, port: u16, extra: &[&str]| {
        let listen = format!("{ip}:{port}");
        let mut a = node_agent_args(
            &pki,
            ip,
            "127.0.111.70:19170",
            &listen,
            &d.join(format!("cache-{name}")),
        );
        a.extend(extra.iter().map(|s| s.to_string()));
        (qr(name, &a, &d.join(format!("{name}.log"))), listen)
    };
    // Every node agent presents the `node` certificate.
    let peer_a = ["--peer", A_PEER, "--peer-server-name", "node"];

    // A: everything from the registry agent.
    let (mut a, a_http) = node("A", "127.0.111.71", 19172, &["--serve-peers", "19173"]);
    assert_eq!(pull_http(&a_http, &blobs), 0);
    let m = metrics(&a_http);
    assert_eq!(metric(&m, FABRIC), total + mlen, "{m}");
    let sent_a = metric(&metrics(RA_METRICS), SENT);
    assert_eq!(sent_a, total);

    // B: everything from A, not one blob byte from the registry agent.
    let (_b, b_http) = node("B", "127.0.111.72", 19174, &peer_a);
    assert_eq!(pull_http(&b_http, &blobs), 0);
    let m = metrics(&b_http);
    assert_eq!(metric(&m, PEER), total, "{m}");
    assert_eq!(metric(&m, FABRIC), mlen, "{m}");
    assert_eq!(
        metric(&m, "qr_node_objects_total{path=\"peer\"}"),
        blobs.len() as u64
    );
    assert_eq!(
        metric(&metrics(RA_METRICS), SENT),
        sent_a,
        "B's blobs came from A"
    );
    let ma = metrics(&a_http);
    assert_eq!(
        metric(&ma, "qr_node_peer_served_bytes_total"),
        total,
        "{ma}"
    );

    // C: A's copy of the big layer is corrupt (a flipped byte in its cache
    // file): dropped, fetched from the registry agent instead; the rest from A.
    let (big, big_size) = blobs.iter().max_by_key(|(_, s)| *s).unwrap().clone();
    let file = d
        .join("cache-A/blobs/sha256")
        .join(big.strip_prefix("sha256:").unwrap());
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[1000] ^= 0x55;
    std::fs::write(&file, &bytes).unwrap();
    let (_c, c_http) = node("C", "127.0.111.73", 19175, &peer_a);
    // The response streaming A's copy is cut when it fails its digest (a
    // client never gets a complete wrong blob); the retry is served the
    // good copy the node fetched meanwhile.
    assert!(
        pull_http(&c_http, &blobs) <= 1,
        "at most one response cut short"
    );
    let m = metrics(&c_http);
    assert_eq!(metric(&m, FABRIC), big_size + mlen, "{m}");
    assert_eq!(
        metric(&m, "qr_node_objects_total{path=\"peer\"}"),
        blobs.len() as u64 - 1
    );
    assert!(metric(&m, "qr_node_verify_failures_total") >= 1, "{m}");
    assert!(metric(&m, "qr_node_peer_fallbacks_total") >= 1, "{m}");
    assert_eq!(metric(&metrics(RA_METRICS), SENT), sent_a + big_size);
    // What C cached is the good copy.
    let cached = d
        .join("cache-C/blobs/sha256")
        .join(big.strip_prefix("sha256:").unwrap());
    assert_eq!(sha256_file(&cached), big);

    // D: A is gone; everything from the registry agent.
    a.kill();
    let (_d, d_http) = node("D", "127.0.111.74", 19176, &peer_a);
    assert_eq!(pull_http(&d_http, &blobs), 0);
    let m = metrics(&d_http);
    assert_eq!(metric(&m, FABRIC), total + mlen, "{m}");
    assert_eq!(metric(&m, PEER), 0, "{m}");
    assert!(metric(&m, "qr_node_peer_fallbacks_total") >= 1, "{m}");
    assert_eq!(
        metric(&metrics(RA_METRICS), SENT),
        sent_a + big_size + total
    );
}
