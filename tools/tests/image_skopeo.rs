//! Must-show (a) and (b) with the real parts: an image built with umoci (3
//! layers, one of 200 MiB incompressible), pushed to docker-registry with
//! skopeo, pulled by skopeo through `qr node-agent` ← fabric (`soft`) ←
//! `qr registry-agent` ← docker-registry; every digest equal to the
//! registry's, every blob's sha256 checked. Then the node agent's HTTP
//! answers to Range (206, 416), unknown digests (OCI error JSON 404) and
//! malformed requests (400, and it keeps serving).
//!
//! Addresses: 127.0.111.20 docker-registry (TCP 19120), .21 registry agent
//! (bootstrap 19121, metrics 19122), .22 node agent (HTTP 19123).

mod image_support;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use image_support::*;

const TAG: &str = "v1";
const REPO: &str = "qr/big";

#[test]
fn skopeo_pulls_through_the_agents() {
    require(&["docker-registry", "skopeo", "umoci"]);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let registry = Registry::start(d, "127.0.111.20:19120");
    let layout = build_image(d, TAG, &[200 << 20, 3 << 20, 40 << 10]);
    push(&layout, TAG, &registry.addr, REPO);
    let pki = pki(d, "127.0.111.21");
    let _ra = qr(
        "registry-agent",
        &registry_agent_args(
            &pki,
            "127.0.111.21",
            19121,
            &registry.addr,
            &d.join("rc"),
            "127.0.111.21:19122",
        ),
        &d.join("registry-agent.log"),
    );
    let _na = qr(
        "node-agent",
        &node_agent_args(
            &pki,
            "127.0.111.22",
            "127.0.111.21:19121",
            "127.0.111.22:19123",
            &d.join("nc"),
        ),
        &d.join("node-agent.log"),
    );

    // (a) skopeo through the node agent.
    let start = Instant::now();
    let out = pull("127.0.111.22:19123", REPO, TAG, &d.join("pulled"));
    assert!(
        out.status.success(),
        "skopeo copy through the node agent failed: {}\nnode agent log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(d.join("node-agent.log")).unwrap_or_default()
    );
    eprintln!("skopeo pull through the agents: {:?}", start.elapsed());
    // Every digest of what skopeo wrote is the registry's (both layouts are
    // checked blob by blob: each file hashes to its name).
    let want = layout_digests(&layout);
    let got = layout_digests(&d.join("pulled"));
    assert_eq!(got, want);
    assert!(want.len() >= 5, "manifest, config and 3 layers: {want:?}");
    let ls = layers(&layout, TAG);
    assert_eq!(ls.len(), 3);
    assert!(ls.iter().any(|(_, s)| *s >= 200 << 20), "{ls:?}");
    // And the registry's own stored files are those bytes.
    for (digest, _) in &ls {
        assert_eq!(&sha256_file(&registry.blob_file(digest)), digest);
    }

    // (b) HTTP answers of the node agent, on the big layer (now cached).
    let node = "127.0.111.22:19123";
    let (big, size) = ls.iter().max_by_key(|(_, s)| *s).unwrap().clone();
    let path = format!("/v2/{REPO}/blobs/{big}?ns=127.0.111.20");
    let bytes = std::fs::read(d.join("pulled/blobs/sha256").join(&big[7..])).unwrap();
    for (range, lo, hi) in [
        ("bytes=0-0", 0u64, 0u64),
        ("bytes=1048576-2097151", 1 << 20, (2 << 20) - 1),
        ("bytes=-4096", size - 4096, size - 1),
    ] {
        let (st, hs, body) = http_get(node, &path, &[("Range", range)]);
        assert_eq!(st, 206, "{range}");
        assert_eq!(
            header(&hs, "content-range"),
            Some(format!("bytes {lo}-{hi}/{size}").as_str())
        );
        assert_eq!(body, &bytes[lo as usize..=hi as usize], "{range}");
        assert_eq!(header(&hs, "docker-content-digest"), Some(big.as_str()));
    }
    let (st, hs, _) = http_get(node, &path, &[("Range", &format!("bytes={size}-"))]);
    assert_eq!(st, 416);
    assert_eq!(
        header(&hs, "content-range"),
        Some(format!("bytes */{size}").as_str())
    );

    let missing = "sha256:0000000000000000000000000000000000000000000000000000000000000000";
    let (st, hs, body) = http_get(node, &format!("/v2/{REPO}/blobs/{missing}"), &[]);
    assert_eq!(st, 404);
    assert_eq!(header(&hs, "content-type"), Some("application/json"));
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["errors"][0]["code"], "BLOB_UNKNOWN");
    let (st, _, body) = http_get(node, &format!("/v2/{REPO}/manifests/nosuchtag"), &[]);
    assert_eq!(st, 404);
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["errors"][0]["code"], "MANIFEST_UNKNOWN");

    let (st, _, body) = http_get(node, &format!("/v2/{REPO}/blobs/sha256:not-hex"), &[]);
    assert_eq!(st, 400);
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["errors"][0]["code"], "DIGEST_INVALID");
    // Not HTTP at all: 400 from the parser.
    let mut s = std::net::TcpStream::connect(node).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"\x16\x03\x01 not http\r\n\r\n").unwrap();
    let mut reply = Vec::new();
    let _ = s.read_to_end(&mut reply);
    assert!(
        String::from_utf8_lossy(&reply).starts_with("HTTP/1.1 400"),
        "{reply:?}"
    );
    // Still serving, and the manifest by digest hashes to it.
    let (st, hs, body) = http_get(
        node,
        &format!("/v2/{REPO}/manifests/{TAG}"),
        &[("Accept", "application/vnd.oci.image.manifest.v1+json")],
    );
    assert_eq!(st, 200);
    let md = header(&hs, "docker-content-digest").unwrap().to_string();
    assert_eq!(sha256_bytes(&body), md);
    let (st, _, body2) = http_get(node, &format!("/v2/{REPO}/manifests/{md}"), &[]);
    assert_eq!((st, &body2), (200, &body));

    let (_, _, m) = http_get(node, "/metrics", &[]);
    let m = String::from_utf8(m).unwrap();
    let sample = quic_rdma_tools::image::metrics::sample;
    assert_eq!(sample(&m, "qr_node_bad_requests_total"), Some(1.0), "{m}");
    assert_eq!(sample(&m, "qr_node_verify_failures_total"), Some(0.0));
    assert!(sample(&m, "qr_node_bytes_total{path=\"fabric\"}").unwrap() >= (200 << 20) as f64);
}

fn sha256_bytes(b: &[u8]) -> String {
    use sha2::Digest;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(b)))
}
