//! Cut-through (issue 24 item 3): a cold blob streams to the HTTP client as
//! it arrives over the fabric, instead of after the whole blob is verified.
//!
//! A 128 MiB layer, both agents' caches empty: the first body bytes reach
//! the client while the node agent has fetched only part of the blob (its
//! own `qr_node_bytes_total{path="fabric"}` says so at that moment); the body
//! is the blob (sha256); a second GET started meanwhile waits for the single
//! fetch and gets the same bytes (one fabric fetch for both); the blob is
//! cached once verified.
//!
//! Addresses: 127.0.111.110 docker-registry (TCP 19220), .111 registry agent
//! (bootstrap 19221, metrics 19222), .112 node agent (HTTP 19223).

mod image_support;

use std::time::{Duration, Instant};

use image_support::*;
use quic_rdma_tools::image::metrics::sample;
use sha2::{Digest as _, Sha256};

const UPSTREAM: &str = "127.0.111.110:19220";
const NODE: &str = "127.0.111.112:19223";
const REPO: &str = "qr/cut";

fn metric(name: &str) -> f64 {
    let (_, _, m) = http_get(NODE, "/metrics", &[]);
    sample(&String::from_utf8(m).unwrap(), name).unwrap_or(0.0)
}

#[test]
fn a_cold_blob_streams_before_it_is_whole() {
    require(&["docker-registry", "skopeo", "umoci"]);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let registry = Registry::start(d, UPSTREAM);
    let layout = build_image(d, "v1", &[128 << 20]);
    push(&layout, "v1", &registry.addr, REPO);
    let (big, size) = layers(&layout, "v1")[0].clone();
    let pki = pki(d, "127.0.111.111");
    let _ra = qr(
        "registry-agent",
        &registry_agent_args(
            &pki,
            "127.0.111.111",
            19221,
            UPSTREAM,
            &d.join("rc"),
            "127.0.111.111:19222",
        ),
        &d.join("ra.log"),
    );
    let _na = qr(
        "node-agent",
        &node_agent_args(
            &pki,
            "127.0.111.112",
            "127.0.111.111:19221",
            NODE,
            &d.join("nc"),
        ),
        &d.join("na.log"),
    );
    let path = format!("/v2/{REPO}/blobs/{big}");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (ttfb, fabric_at_first_byte, total, hash, n, path_header, joined) = rt.block_on(async {
        let c = reqwest::Client::new();
        let start = Instant::now();
        let mut r = c.get(format!("http://{NODE}{path}")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let path_header = r
            .headers()
            .get("x-qr-path")
            .map(|v| v.to_str().unwrap().to_string());
        let mut h = Sha256::new();
        let mut n = 0u64;
        let first = r.chunk().await.unwrap().expect("a first piece");
        let ttfb = start.elapsed();
        // What the node had fetched when the client already had bytes.
        let fabric_at_first_byte =
            tokio::task::spawn_blocking(|| metric("qr_node_bytes_total{path=\"fabric\"}"))
                .await
                .unwrap();
        // A second client while the first streams: it joins the one fetch.
        let second = tokio::spawn({
            let url = format!("http://{NODE}{path}");
            async move {
                let b = reqwest::get(url).await.unwrap().bytes().await.unwrap();
                format!("sha256:{}", hex::encode(Sha256::digest(&b)))
            }
        });
        h.update(&first);
        n += first.len() as u64;
        while let Some(piece) = r.chunk().await.unwrap() {
            h.update(&piece);
            n += piece.len() as u64;
        }
        let total = start.elapsed();
        let joined = tokio::time::timeout(Duration::from_secs(120), second)
            .await
            .unwrap()
            .unwrap();
        let hash = format!("sha256:{}", hex::encode(h.finalize()));
        (
            ttfb,
            fabric_at_first_byte,
            total,
            hash,
            n,
            path_header,
            joined,
        )
    });
    eprintln!(
        "{size} bytes: first byte after {ttfb:?} (node had {fabric_at_first_byte} bytes), \
         last after {total:?}"
    );
    assert_eq!((n, hash.as_str()), (size, big.as_str()));
    assert_eq!(joined, big, "the second client got the same blob");
    assert_eq!(path_header.as_deref(), Some("cut-through"));
    assert!(
        fabric_at_first_byte < size as f64,
        "the first byte came before the whole blob ({fabric_at_first_byte} of {size})"
    );
    assert_eq!(
        metric("qr_node_objects_total{path=\"fabric\"}"),
        1.0,
        "one fetch for both"
    );
    assert_eq!(metric("qr_node_verify_failures_total"), 0.0);
    // Verified, then cached: a third GET is a cache hit.
    let (st, hs, body) = http_get(NODE, &path, &[]);
    assert_eq!(st, 200);
    assert_eq!(header(&hs, "x-qr-path"), Some("cache"));
    assert_eq!(body.len() as u64, size);
}
