//! Issue 24, Must-show "flip a byte in each cache", with the real clients:
//! one layer's byte is flipped in both the node agent's and the registry
//! agent's cache, and the next pull through the node still succeeds, every
//! digest equal to the registry's; each agent counts the corruption it found
//! (`qr_node_cache_corrupt_total`, `qr_registry_cache_corrupt_total`) and its
//! cache file hashes to the digest again (repaired, not just deleted).
//!
//! - Rot while the agents run, after they checked their copies: found while
//!   serving. skopeo (which starts a cut download over) gets at most one
//!   aborted response: the node cuts its rotten copy before the last byte,
//!   fetches the blob again from the registry agent, finds that copy wrong
//!   too and has it rechecked (`Request::Stat` with `recheck`), which
//!   quarantines it and fetches from the registry.
//! - Rot at rest, found after a restart: each agent checks a copy before it
//!   first serves it, so containerd (`ctr`, which resumes a cut download
//!   rather than starting over) gets no aborted response at all.
//!
//! Addresses: 127.0.111.130 docker-registry (TCP 19230), .131 registry
//! agent (bootstrap 19231, metrics 19232), .132 node agent (HTTP 19233),
//! .133 a second node agent (HTTP 19234);
//! .135 docker-registry (19235), .136 registry agent (19236, 19237), .137
//! node agent (19238).

mod image_support;

use std::path::{Path, PathBuf};

use image_support::*;
use quic_rdma_tools::image::metrics::sample;

const REPO: &str = "qr/rot";
const TAG: &str = "v1";

/// Flip one byte in the middle of `file`.
fn flip(file: &Path) {
    let mut b = std::fs::read(file).unwrap();
    let at = b.len() / 2;
    b[at] ^= 0x20;
    std::fs::write(file, b).unwrap();
    assert_ne!(sha256_file(file).as_str(), "", "{}", file.display());
}

fn metric(addr: &str, name: &str) -> f64 {
    let (st, _, body) = http_get(addr, "/metrics", &[]);
    assert_eq!(st, 200);
    let text = String::from_utf8(body).unwrap();
    sample(&text, name).unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

fn cached(cache: &Path, digest: &str) -> PathBuf {
    cache.join("blobs/sha256").join(&digest["sha256:".len()..])
}

/// A registry with the image, and the two agents' arguments.
struct Site {
    _registry: Registry,
    registry_log: PathBuf,
    upstream: String,
    layout: PathBuf,
    layer: String,
    ra_args: Vec<String>,
    na_args: Vec<String>,
    pki: PathBuf,
    bootstrap: String,
    ra_metrics: String,
    node: String,
    rc: PathBuf,
    nc: PathBuf,
}

impl Site {
    /// .N docker-registry, .N+1 registry agent, .N+2 node agent; TCP ports
    /// from `port`.
    fn new(d: &Path, n: u8, port: u16) -> Site {
        let ip = |k: u8| format!("127.0.111.{}", n + k);
        let upstream = format!("{}:{port}", ip(0));
        let registry = Registry::start(d, &upstream);
        let layout = build_image(d, TAG, &[6 << 20, 3 << 20]);
        push(&layout, TAG, &registry.addr, REPO);
        let layer = layers(&layout, TAG)
            .into_iter()
            .max_by_key(|(_, s)| *s)
            .unwrap()
            .0;
        let pki = pki(d, &ip(1));
        let ra_metrics = format!("{}:{}", ip(1), port + 2);
        let node = format!("{}:{}", ip(2), port + 3);
        let (rc, nc) = (d.join("rc"), d.join("nc"));
        let bootstrap = format!("{}:{}", ip(1), port + 1);
        Site {
            registry_log: registry.log.clone(),
            _registry: registry,
            ra_args: registry_agent_args(&pki, &ip(1), port + 1, &upstream, &rc, &ra_metrics),
            na_args: node_agent_args(&pki, &ip(2), &bootstrap, &node, &nc),
            pki,
            bootstrap,
            upstream,
            layout,
            layer,
            ra_metrics,
            node,
            rc,
            nc,
        }
    }

    fn agents(&self, d: &Path, round: u32) -> (Proc, Proc) {
        let ra = qr(
            "registry-agent",
            &self.ra_args,
            &d.join(format!("ra-{round}.log")),
        );
        let na = qr(
            "node-agent",
            &self.na_args,
            &d.join(format!("na-{round}.log")),
        );
        (ra, na)
    }

    /// skopeo through the node agent into `dest`, digests checked.
    fn skopeo(&self, dest: &Path) -> Result<(), String> {
        let out = pull(&self.node, REPO, TAG, dest);
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        assert_eq!(layout_digests(dest), layout_digests(&self.layout));
        Ok(())
    }

    fn rot(&self) {
        for cache in [&self.nc, &self.rc] {
            let f = cached(cache, &self.layer);
            assert_eq!(sha256_file(&f), self.layer, "not cached: {}", f.display());
            flip(&f);
            assert_ne!(sha256_file(&f), self.layer);
        }
    }

    /// Each agent found its copy corrupt once and holds an intact one again.
    fn repaired(&self) {
        assert_eq!(metric(&self.node, "qr_node_cache_corrupt_total"), 1.0);
        assert_eq!(
            metric(&self.ra_metrics, "qr_registry_cache_corrupt_total"),
            1.0
        );
        for cache in [&self.nc, &self.rc] {
            let f = cached(cache, &self.layer);
            assert_eq!(sha256_file(&f), self.layer, "{}", f.display());
        }
    }
}

#[test]
fn rot_found_while_serving_costs_skopeo_at_most_one_attempt() {
    require(&["docker-registry", "skopeo", "umoci"]);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let site = Site::new(d, 130, 19230);
    let _agents = site.agents(d, 1);
    site.skopeo(&d.join("pulled-1")).unwrap();
    // Have each agent serve (and so check) its cached copy once: the node
    // agent to skopeo, the registry agent to a second, empty node agent.
    site.skopeo(&d.join("pulled-2")).unwrap();
    let other = "127.0.111.133:19234";
    let args = node_agent_args(
        &site.pki,
        "127.0.111.133",
        &site.bootstrap,
        other,
        &d.join("nc-other"),
    );
    let _other = qr("node-agent", &args, &d.join("na-other.log"));
    let out = pull(other, REPO, TAG, &d.join("pulled-other"));
    assert!(out.status.success(), "{out:?}");
    site.rot();
    if let Err(e) = site.skopeo(&d.join("pulled-3")) {
        eprintln!("skopeo: first attempt aborted (allowed once): {e}");
        site.skopeo(&d.join("pulled-4"))
            .unwrap_or_else(|e| panic!("skopeo failed twice: {e}"));
    }
    site.repaired();
}

#[test]
fn rot_at_rest_is_found_before_serving_so_ctr_pulls_at_once() {
    require(&["docker-registry", "skopeo", "umoci", "containerd", "ctr"]);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let site = Site::new(d, 135, 19235);
    let agents = site.agents(d, 1);
    site.skopeo(&d.join("pulled-1")).unwrap();
    drop(agents);
    site.rot();
    let _agents = site.agents(d, 2);
    let containerd = Containerd::start(d, &site.node, &[(&site.upstream, "http")]);
    let image = format!("{}/{REPO}:{TAG}", site.upstream);
    // Asserts success on the first try, and `ctr images check` complete.
    containerd.pull(&image, &d.join("na-2.log"));
    assert_eq!(containerd.content(), layout_digests(&site.layout));
    site.repaired();
    let log = std::fs::read_to_string(&site.registry_log).unwrap();
    assert!(
        !log.contains("containerd"),
        "containerd reached docker-registry directly"
    );
}
