//! Must-show (c): the registry agent is killed (SIGKILL) mid-blob and
//! restarted, and the pull completes by resuming — the restarted agent sends
//! only what the node agent did not have; a blob corrupted in the upstream
//! registry's storage yields an error, never data, and nothing corrupt is
//! cached by either agent.
//!
//! Addresses: 127.0.111.30 docker-registry (TCP 19130), .31 registry agent
//! (bootstrap 19131, metrics 19132), .32 node agent (HTTP 19133).

mod image_support;

use std::time::{Duration, Instant};

use image_support::*;
use quic_rdma_tools::image::metrics::sample;

const REPO: &str = "qr/resume";

fn metric(addr: &str, name: &str) -> f64 {
    let (_, _, m) = http_get(addr, "/metrics", &[]);
    sample(&String::from_utf8(m).unwrap(), name).unwrap_or_else(|| panic!("no {name}"))
}

#[test]
fn killed_registry_agent_resumes_and_corrupt_upstream_is_refused() {
    require(&["docker-registry", "skopeo", "umoci"]);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let registry = Registry::start(d, "127.0.111.30:19130");
    let layout = build_image(d, "big", &[160 << 20]);
    push(&layout, "big", &registry.addr, REPO);
    let pki = pki(d, "127.0.111.31");
    let ra_args = registry_agent_args(
        &pki,
        "127.0.111.31",
        19131,
        &registry.addr,
        &d.join("rc"),
        "127.0.111.31:19132",
    );
    let mut ra = qr("registry-agent", &ra_args, &d.join("ra1.log"));
    let mut na_args = node_agent_args(
        &pki,
        "127.0.111.32",
        "127.0.111.31:19131",
        "127.0.111.32:19133",
        &d.join("nc"),
    );
    // Small fixed chunks, few in flight: the cut lands mid-blob for sure.
    na_args.extend(["--chunk-size", "256K", "--fixed-chunk", "--parallel", "2"].map(String::from));
    let _na = qr("node-agent", &na_args, &d.join("na.log"));
    let node = "127.0.111.32:19133";

    let (big, size) = layers(&layout, "big")[0].clone();
    let path = format!("/v2/{REPO}/blobs/{big}");
    let getter = std::thread::spawn(move || http_get("127.0.111.32:19133", &path, &[]));
    // Kill it once a fifth has arrived.
    let deadline = Instant::now() + Duration::from_secs(60);
    let fabric = "qr_node_bytes_total{path=\"fabric\"}";
    while metric(node, fabric) < (size / 5) as f64 {
        assert!(Instant::now() < deadline, "no progress before the kill");
        std::thread::sleep(Duration::from_millis(20));
    }
    ra.kill();
    let at_kill = metric(node, fabric) as u64;
    assert!(at_kill < size, "the blob was complete before the kill");
    std::thread::sleep(Duration::from_millis(500));
    let _ra2 = qr("registry-agent (restarted)", &ra_args, &d.join("ra2.log"));
    let (st, hs, body) = getter.join().unwrap();
    assert_eq!(
        st,
        200,
        "{}",
        String::from_utf8_lossy(&body[..body.len().min(500)])
    );
    assert_eq!(body.len() as u64, size);
    use sha2::Digest;
    assert_eq!(
        format!("sha256:{}", hex::encode(sha2::Sha256::digest(&body))),
        big
    );
    assert_eq!(header(&hs, "docker-content-digest"), Some(big.as_str()));
    assert!(metric(node, "qr_node_resumes_total") >= 1.0);
    // The restarted agent sent what was missing (plus the chunks that were
    // in flight at the kill), not the whole blob again.
    let sent_after = metric("127.0.111.31:19132", "qr_registry_sent_bytes_total") as u64;
    assert!(
        sent_after <= size - at_kill + 4 * (256 << 10),
        "restarted agent sent {sent_after} bytes; {at_kill} of {size} had arrived"
    );
    eprintln!("cut at {at_kill} of {size}; the restarted agent sent {sent_after}");

    // A blob corrupted in the registry's storage.
    let small = build_image(&d.join("small"), "bad", &[4 << 20]);
    push(&small, "bad", &registry.addr, REPO);
    let (victim, vsize) = layers(&small, "bad")[0].clone();
    let file = registry.blob_file(&victim);
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[(vsize / 2) as usize] ^= 0x01;
    std::fs::write(&file, &bytes).unwrap();
    // The first GET streams as the blob arrives and is cut short when it
    // fails its digest (never a complete wrong body); the retry, as every
    // OCI client makes, gets the error.
    let path = format!("/v2/{REPO}/blobs/{victim}");
    let first = http_get_result(node, &path, &[]);
    assert!(
        first.is_err(),
        "the streamed response is cut short, not completed"
    );
    let (st, hs, body) = http_get(node, &path, &[]);
    assert_eq!(
        st,
        502,
        "{}",
        String::from_utf8_lossy(&body[..body.len().min(300)])
    );
    assert_eq!(header(&hs, "content-type"), Some("application/json"));
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["errors"][0]["code"], "DIGEST_INVALID", "{v}");
    assert!(metric(node, "qr_node_verify_failures_total") >= 1.0);
    assert!(
        metric(
            "127.0.111.31:19132",
            "qr_registry_upstream_verify_failures_total"
        ) >= 1.0
    );
    let hex = &victim[7..];
    for cache in ["nc", "rc"] {
        let c = d.join(cache);
        assert!(
            !c.join("blobs/sha256").join(hex).exists(),
            "{cache} cached the corrupt blob"
        );
        // A chunk request that reached the registry agent after the failed
        // download had left its map starts a fresh download (which fails the
        // same way); its temp file is gone once that ends. "Left" means still
        // there when nothing is running any more.
        let tmp = c.join("tmp");
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut temps = std::fs::read_dir(&tmp).unwrap().count();
        while temps > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
            temps = std::fs::read_dir(&tmp).unwrap().count();
        }
        assert_eq!(temps, 0, "{cache} left temp files");
    }
    // A Range request for it gets no bytes either.
    let (st, _, _) = http_get(
        node,
        &format!("/v2/{REPO}/blobs/{victim}"),
        &[("Range", "bytes=0-99")],
    );
    assert_eq!(st, 502);
}
