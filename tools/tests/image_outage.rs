//! A registry outage does not stop pulls of images the agents hold (issue 24
//! item 2): docker-registry serves an image under two tags; skopeo pulls it
//! through `qr node-agent` ← fabric (`soft`) ← `qr registry-agent`; then
//! docker-registry is stopped and the registry agent restarted (its memory
//! gone, its caches on disk), and a *fresh* node agent still serves:
//!
//! - the manifest by digest (immutable: from the cache, not flagged),
//! - by tag, within the TTL unflagged, past it flagged `X-Qr-Stale`, the
//!   same bytes, counted on both agents' `/metrics`,
//! - `tags/list`, paged with `n`/`last` and `Link`,
//! - a whole skopeo pull by tag, every digest equal to the registry's,
//!
//! while a tag never fetched fails with an error naming the unreachable
//! upstream, and a restarted registry makes the tag fresh again.
//!
//! Addresses: 127.0.111.90 docker-registry (TCP 19190), .91 registry agent
//! (bootstrap 19191, metrics 19192), .92 node agent (HTTP 19193).

mod image_support;

use std::path::Path;
use std::time::{Duration, Instant};

use image_support::*;
use quic_rdma_tools::image::metrics::sample;

const REPO: &str = "qr/outage";
const REGISTRY: &str = "127.0.111.90:19190";
const NODE: &str = "127.0.111.92:19193";
const METRICS: &str = "127.0.111.91:19192";
const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// The registry agent's --manifest-ttl.
const TTL: Duration = Duration::from_secs(2);

fn registry_agent(d: &Path, pki: &Path, log: &str) -> Proc {
    let mut args =
        registry_agent_args(pki, "127.0.111.91", 19191, REGISTRY, &d.join("rc"), METRICS);
    args.extend(["--manifest-ttl".into(), format!("{}s", TTL.as_secs())]);
    qr("registry-agent", &args, &d.join(log))
}

fn node_agent(d: &Path, pki: &Path, cache: &str, log: &str, extra: &[&str]) -> Proc {
    let mut args = node_agent_args(
        pki,
        "127.0.111.92",
        "127.0.111.91:19191",
        NODE,
        &d.join(cache),
    );
    args.extend(extra.iter().map(|s| s.to_string()));
    qr("node-agent", &args, &d.join(log))
}

fn manifest(reference: &str) -> (u16, Vec<(String, String)>, Vec<u8>) {
    http_get(
        NODE,
        &format!("/v2/{REPO}/manifests/{reference}"),
        &[("Accept", OCI_MANIFEST)],
    )
}

fn tags(query: &str) -> (serde_json::Value, Vec<(String, String)>) {
    let (st, hs, body) = http_get(NODE, &format!("/v2/{REPO}/tags/list{query}"), &[]);
    assert_eq!(st, 200, "{}", String::from_utf8_lossy(&body));
    (serde_json::from_slice(&body).unwrap(), hs)
}

fn metric(addr: &str, name: &str) -> f64 {
    let (_, _, m) = http_get(addr, "/metrics", &[]);
    let m = String::from_utf8(m).unwrap();
    // Valid exposition text (histograms included), not just a sample.
    if let Err(e) = quic_rdma_tools::prom_text::parse(&m) {
        panic!("{addr}/metrics: {e}\n{m}");
    }
    sample(&m, name).unwrap_or_else(|| panic!("{name} not on {addr}/metrics:\n{m}"))
}

fn pull_ok(d: &Path, tag: &str, dest: &str, log: &str) -> Vec<String> {
    let out = pull(NODE, REPO, tag, &d.join(dest));
    assert!(
        out.status.success(),
        "skopeo pull of {tag} through the node agent failed: {}\nnode agent log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(d.join(log)).unwrap_or_default()
    );
    layout_digests(&d.join(dest))
}

#[test]
fn cached_images_pull_while_the_registry_is_down() {
    require(&["docker-registry", "skopeo", "umoci"]);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut registry = Registry::start(d, REGISTRY);
    let layout = build_image(d, "v1", &[3 << 20, 64 << 10]);
    push(&layout, "v1", REGISTRY, REPO);
    // The same image under a second tag, for the tag list.
    run(std::process::Command::new("skopeo").args([
        "copy",
        "--src-tls-verify=false",
        "--dest-tls-verify=false",
        &format!("docker://{REGISTRY}/{REPO}:v1"),
        &format!("docker://{REGISTRY}/{REPO}:v2"),
    ]));
    let pki = pki(d, "127.0.111.91");
    let mut ra = registry_agent(d, &pki, "ra1.log");
    let mut na = node_agent(d, &pki, "nc1", "na1.log", &[]);

    let want = layout_digests(&layout);
    assert_eq!(pull_ok(d, "v1", "pulled1", "na1.log"), want);
    let (st, hs, body) = manifest("v1");
    assert_eq!(st, 200);
    let digest = header(&hs, "docker-content-digest").unwrap().to_string();
    assert_eq!(header(&hs, "x-qr-stale"), None);
    let (v, _) = tags("");
    assert_eq!(v["tags"], serde_json::json!(["v1", "v2"]), "{v}");

    // The outage: the registry stops; the registry agent restarts (nothing
    // in memory), and a new node agent with an empty cache takes over.
    registry.proc.kill();
    ra.kill();
    na.kill();
    assert!(
        std::net::TcpStream::connect(REGISTRY).is_err(),
        "the registry is down"
    );
    let fetched_at = Instant::now();
    let _ra = registry_agent(d, &pki, "ra2.log");
    // This one logs JSON lines (checked at the end).
    let _na = node_agent(d, &pki, "nc2", "na2.log", &["--log-format", "json"]);

    // By digest: immutable, never stale.
    let (st, hs, by_digest) = manifest(&digest);
    assert_eq!(st, 200, "{}", String::from_utf8_lossy(&by_digest));
    assert_eq!(by_digest, body);
    assert_eq!(header(&hs, "x-qr-stale"), None);
    // By tag within the TTL (if this machine got here that fast): fresh.
    let (st, hs, b) = manifest("v1");
    assert_eq!((st, &b), (200, &body));
    if fetched_at.elapsed() + Duration::from_millis(200) < TTL {
        assert_eq!(header(&hs, "x-qr-stale"), None);
    }
    // Past the TTL: the same bytes, flagged.
    std::thread::sleep(TTL.saturating_sub(fetched_at.elapsed()) + Duration::from_millis(100));
    let (st, hs, b) = manifest("v1");
    assert_eq!((st, &b), (200, &body));
    assert_eq!(header(&hs, "docker-content-digest"), Some(digest.as_str()));
    assert!(
        header(&hs, "x-qr-stale").is_some_and(|v| v.contains("unreachable")),
        "{hs:?}"
    );
    // The tag list, paged (distribution-spec "Listing Tags").
    let (v, hs) = tags("?n=1");
    assert_eq!(v["tags"], serde_json::json!(["v1"]), "{v}");
    assert_eq!(
        header(&hs, "link"),
        Some(format!("</v2/{REPO}/tags/list?n=1&last=v1>; rel=\"next\"").as_str())
    );
    assert!(header(&hs, "x-qr-stale").is_some());
    let (v, hs) = tags("?n=1&last=v1");
    assert_eq!(v["tags"], serde_json::json!(["v2"]), "{v}");
    assert_eq!(header(&hs, "link"), None);

    // A whole pull by tag: blobs from the registry agent's cache over the
    // fabric, confirmed by the cached manifest (the upstream cannot be asked).
    assert_eq!(pull_ok(d, "v1", "pulled2", "na2.log"), want);
    assert!(metric(METRICS, "qr_registry_manifests_stale_total") >= 2.0);
    assert!(metric(METRICS, "qr_registry_manifest_cache_hits_total") >= 1.0);
    assert!(metric(NODE, "qr_node_manifests_stale_total") >= 2.0);
    assert!(metric(NODE, "qr_node_bytes_total{path=\"fabric\"}") >= (3 << 20) as f64);

    // What was never fetched cannot be served: the error names the cause.
    let (st, _, b) = manifest("never-pulled");
    let text = String::from_utf8_lossy(&b);
    assert_eq!(st, 502, "{text}");
    assert!(
        text.contains("unreachable") || text.contains("registry running"),
        "{text}"
    );

    // The registry back: the tag is fresh again.
    let _registry = Registry::start(d, REGISTRY);
    let (st, hs, b) = manifest("v1");
    assert_eq!((st, &b), (200, &body));
    assert_eq!(header(&hs, "x-qr-stale"), None, "{hs:?}");

    // Logs and latency: one access-log line per request, JSON on the node
    // agent that was asked for it; a histogram per route.
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(d.join("na2.log"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let access: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|v| v["target"] == "qr::access")
        .collect();
    let manifest_gets = access
        .iter()
        .filter(|v| {
            v["method"] == "GET"
                && v["target"] == "qr::access"
                && v["status"] == 200
                && v["outcome"] == "complete"
                && v["timestamp"].is_string()
                && v["level"] == "INFO"
                && v.to_string().contains(&format!("/v2/{REPO}/manifests/v1"))
        })
        .count();
    assert!(manifest_gets >= 3, "{access:?}");
    assert!(
        access.iter().any(|v| v["status"] == 502),
        "the failed request is logged too"
    );
    let count = "qr_node_request_duration_seconds_count{route=\"manifest\"}";
    assert!(metric(NODE, count) >= 4.0);
    assert!(
        metric(
            METRICS,
            "qr_registry_request_duration_seconds_count{request=\"manifest\"}"
        ) >= 3.0
    );
    let ra_log = std::fs::read_to_string(d.join("ra2.log")).unwrap();
    assert!(
        ra_log.contains(&format!("manifest {REPO}:v1 ok (stale)")),
        "{ra_log}"
    );
}
