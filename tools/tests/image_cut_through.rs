//! Issue 24 item 3, cut-through: the node agent streams a blob to its HTTP
//! client as the blob arrives, in order, hashed on the way; the response's
//! last byte waits for the whole-blob verdict. Both agents are `qr`
//! processes over `soft`, the registry agent serving an OCI layout (no
//! docker-registry needed: the layout's files are the upstream copy this
//! test corrupts and repairs).
//!
//! - A cold 256 MiB blob: the client holds body bytes while the node's
//!   metrics still show the blob in flight (fewer bytes fetched than its
//!   size, no object finished); TTFB and total time are printed.
//! - A source copy that stays corrupt: the streaming GET is cut short
//!   (status 200, a body error, fewer bytes than Content-Length); every
//!   retry is answered `502 DIGEST_INVALID` naming the corrupt copy, never
//!   another cut; both counted; nothing is cached.
//! - A source copy corrupt once (repaired after the cut): the retry waits
//!   for the verdict and gets the blob whole; cached.
//! - A cached copy that rots after the node wrote and verified it: the next
//!   whole GET is cut short before its last byte (never complete), the copy
//!   quarantined and counted; the retry fetches it afresh, whole, and the
//!   cache holds the right bytes again.
//! - Two concurrent GETs of one cold blob: both stream, both bodies hash to
//!   the digest, one fabric fetch (one join).
//!
//! Addresses: 127.0.111.80–88 and .120–123, TCP 19180–19188 and
//! 19340–19345 (three per test).

mod image_support;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use image_support::*;
use quic_rdma_tools::image::digest::Digest;
use quic_rdma_tools::image::metrics::sample;

const REPO: &str = "qr/cut";
const TAG: &str = "v1";

/// One test at a time: the printed times are of one transfer, not three
/// sharing two cores.
static SERIAL: Mutex<()> = Mutex::new(());

/// A registry agent serving `layout` and a node agent in front of it, both
/// over `soft`; `ip` is .N of 127.0.111.N (N, N+1), ports from `port`.
struct Agents {
    _ra: Proc,
    _na: Proc,
    node: String,
    ra_metrics: String,
    node_cache: PathBuf,
}

fn agents(dir: &Path, layout: &Path, ip: u8, port: u16) -> Agents {
    let (ra_ip, na_ip) = (format!("127.0.111.{ip}"), format!("127.0.111.{}", ip + 1));
    let pki = pki(dir, &ra_ip);
    let ra_metrics = format!("{ra_ip}:{}", port + 1);
    let ra_args = layout_registry_agent_args(
        &pki,
        &ra_ip,
        port,
        layout,
        REPO,
        &dir.join("rc"),
        &ra_metrics,
    );
    let ra = qr("registry-agent", &ra_args, &dir.join("ra.log"));
    let node = format!("{na_ip}:{}", port + 2);
    let node_cache = dir.join("nc");
    let na_args = node_agent_args(&pki, &na_ip, &format!("{ra_ip}:{port}"), &node, &node_cache);
    let na = qr("node-agent", &na_args, &dir.join("na.log"));
    Agents {
        _ra: ra,
        _na: na,
        node,
        ra_metrics,
        node_cache,
    }
}

/// One sample of `addr`'s /metrics.
async fn metric(addr: &str, name: &str) -> f64 {
    let text = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    sample(&text, name).unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

const FABRIC_BYTES: &str = "qr_node_bytes_total{path=\"fabric\"}";
const FABRIC_OBJECTS: &str = "qr_node_objects_total{path=\"fabric\"}";

/// What a streaming GET saw.
struct Got {
    status: u16,
    content_length: Option<u64>,
    body: Vec<u8>,
    /// The body's error, if it ended in one (the connection cut).
    error: Option<String>,
    /// From sending the request to the first body bytes.
    ttfb: Option<Duration>,
    total: Duration,
    /// The node's (fabric bytes, fabric objects) when the first body
    /// bytes were in the client's hands.
    at_first_byte: Option<(f64, f64)>,
}

/// GET `path` from the node, reading the body as it comes; at the first
/// body bytes, sample the node's metrics.
async fn stream_get(node: &str, path: &str) -> Got {
    let started = Instant::now();
    let mut r = tokio::time::timeout(
        Duration::from_secs(120),
        reqwest::get(format!("http://{node}{path}")),
    )
    .await
    .expect("headers within 120 s")
    .unwrap();
    let status = r.status().as_u16();
    let content_length = r.content_length();
    let mut got = Got {
        status,
        content_length,
        body: Vec::new(),
        error: None,
        ttfb: None,
        total: Duration::ZERO,
        at_first_byte: None,
    };
    loop {
        match tokio::time::timeout(Duration::from_secs(120), r.chunk())
            .await
            .expect("a body piece within 120 s")
        {
            Ok(Some(piece)) => {
                if got.ttfb.is_none() && !piece.is_empty() {
                    got.ttfb = Some(started.elapsed());
                    got.at_first_byte = Some((
                        metric(node, FABRIC_BYTES).await,
                        metric(node, FABRIC_OBJECTS).await,
                    ));
                }
                got.body.extend_from_slice(&piece);
            }
            Ok(None) => break,
            Err(e) => {
                got.error = Some(format!("{e:?}"));
                break;
            }
        }
    }
    got.total = started.elapsed();
    got
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Poll `f` until it holds (10 s at most).
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "{what}: not within 10 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn first_bytes_arrive_while_a_cold_blob_is_still_in_flight() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let size = 256usize << 20;
    let l = write_layout(&dir.path().join("layout"), TAG, &[size]);
    let (layout, blobs) = (l.dir, l.layers);
    let a = agents(dir.path(), &layout, 80, 19180);
    let (d, _) = &blobs[0];
    let got = rt().block_on(stream_get(&a.node, &format!("/v2/{REPO}/blobs/{d}")));
    assert_eq!(got.status, 200);
    assert_eq!(got.error, None);
    assert_eq!(got.content_length, Some(size as u64));
    assert_eq!(got.body.len(), size);
    assert_eq!(&Digest::of(&got.body), d);
    let (fetched, finished) = got.at_first_byte.unwrap();
    // Structural, not a clock: when the client held its first bytes, the
    // node had fetched only part of the blob and finished no object.
    assert!(
        fetched < size as f64,
        "first byte after the whole blob was fetched ({fetched} bytes)"
    );
    assert_eq!(finished, 0.0, "first byte after the blob was verified");
    let ttfb = got.ttfb.unwrap();
    eprintln!(
        "cold {} MiB: first byte after {:.1} ms ({:.1} MiB fetched by then), whole body after \
         {:.1} ms ({:.1} % of it)",
        size >> 20,
        ttfb.as_secs_f64() * 1e3,
        fetched / (1 << 20) as f64,
        got.total.as_secs_f64() * 1e3,
        100.0 * ttfb.as_secs_f64() / got.total.as_secs_f64()
    );
    // Completed: the client's GET found it cached (the last byte waited for
    // the commit).
    assert!(a.node_cache.join("blobs/sha256").join(d.hex()).exists());
}

/// A layout whose one 64 MiB layer is stored with a byte flipped near its
/// end (the node learns of it only with the whole blob, long after its first
/// bytes went out): the layout, the digest, the good and the bad bytes.
fn corrupt_layout(dir: &Path) -> (PathBuf, Digest, Vec<u8>, Vec<u8>) {
    let size = 64usize << 20;
    let l = write_layout(&dir.join("layout"), TAG, &[size]);
    let (layout, mut blobs) = (l.dir, l.layers);
    let (d, good) = blobs.remove(0);
    let mut bad = good.clone();
    bad[size - 1000] ^= 0x01;
    std::fs::write(layout.join("blobs/sha256").join(d.hex()), &bad).unwrap();
    (layout, d, good, bad)
}

/// The first GET of a blob whose source is corrupt: it streams, then is cut
/// short; what went out is the source's bytes, in order, never all of them.
fn assert_cut(got: &Got, bad: &[u8]) {
    assert_eq!(got.status, 200, "headers went out with the first bytes");
    assert_eq!(got.content_length, Some(bad.len() as u64));
    assert!(got.ttfb.is_some(), "no body byte streamed");
    assert!(
        got.error.is_some(),
        "the body ended cleanly ({} bytes)",
        got.body.len()
    );
    assert!(
        got.body.len() < bad.len(),
        "a complete body of a corrupt blob"
    );
    assert_eq!(
        &got.body[..],
        &bad[..got.body.len()],
        "what went out is the source's bytes, in order"
    );
    eprintln!(
        "corrupt source: cut after {} of {} bytes: {}",
        got.body.len(),
        bad.len(),
        got.error.as_deref().unwrap_or("")
    );
}

/// Neither cache holds `d`, and no temp file is left.
fn assert_nothing_cached(caches: &[&Path], d: &Digest) {
    for cache in caches {
        assert!(
            !cache.join("blobs/sha256").join(d.hex()).exists(),
            "{} cached the corrupt blob",
            cache.display()
        );
        // A chunk request that reached the registry agent after its failed
        // read may start another (failing the same way); its temp file goes
        // when that ends.
        eventually(&format!("{} temp files gone", cache.display()), || {
            std::fs::read_dir(cache.join("tmp")).unwrap().count() == 0
        });
    }
}

#[test]
fn a_source_that_stays_corrupt_is_cut_once_then_refused_with_502() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let (layout, d, _good, bad) = corrupt_layout(dir.path());
    let a = agents(dir.path(), &layout, 83, 19183);
    let path = format!("/v2/{REPO}/blobs/{d}");
    let rt = rt();
    assert_cut(&rt.block_on(stream_get(&a.node, &path)), &bad);
    // Every retry, as an OCI client makes them: the node fetches afresh but
    // sends no byte before the verdict, so the failure is the answer.
    for retry in 1..=2 {
        let got = rt.block_on(stream_get(&a.node, &path));
        assert_eq!(got.error, None, "retry {retry} cut short again");
        assert_eq!(
            got.status,
            502,
            "retry {retry}: {}",
            String::from_utf8_lossy(&got.body)
        );
        let v: serde_json::Value = serde_json::from_slice(&got.body).unwrap();
        assert_eq!(v["errors"][0]["code"], "DIGEST_INVALID", "{v}");
        let why = v["errors"][0]["message"].as_str().unwrap();
        assert!(
            why.contains(&d.to_string()) && why.contains("corrupt"),
            "the reason names the blob and its corrupt copy: {why}"
        );
        eprintln!("retry {retry}: 502 {why}");
    }
    rt.block_on(async {
        assert_eq!(metric(&a.node, "qr_node_responses_cut_total").await, 1.0);
        assert_eq!(metric(&a.node, "qr_node_digest_refusals_total").await, 2.0);
        assert!(metric(&a.node, "qr_node_verify_failures_total").await >= 1.0);
        assert!(metric(&a.ra_metrics, "qr_registry_upstream_verify_failures_total").await >= 1.0);
        assert_eq!(metric(&a.node, FABRIC_OBJECTS).await, 0.0);
    });
    assert_nothing_cached(&[&a.node_cache, &dir.path().join("rc")], &d);
}

#[test]
fn a_source_corrupt_once_is_served_whole_on_the_retry() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let (layout, d, good, bad) = corrupt_layout(dir.path());
    let a = agents(dir.path(), &layout, 120, 19340);
    let path = format!("/v2/{REPO}/blobs/{d}");
    let rt = rt();
    assert_cut(&rt.block_on(stream_get(&a.node, &path)), &bad);
    assert_nothing_cached(&[&a.node_cache, &dir.path().join("rc")], &d);
    // Repaired at the source: the retry fetches it afresh and, after the
    // cut, is answered only once the whole blob matched.
    std::fs::write(layout.join("blobs/sha256").join(d.hex()), &good).unwrap();
    let got = rt.block_on(stream_get(&a.node, &path));
    assert_eq!((got.status, &got.error), (200, &None));
    assert_eq!(got.body.len(), good.len());
    assert_eq!(&Digest::of(&got.body), &d);
    let (_, finished) = got.at_first_byte.unwrap();
    assert_eq!(finished, 1.0, "the retry streamed before the verdict");
    assert!(a.node_cache.join("blobs/sha256").join(d.hex()).exists());
    rt.block_on(async {
        assert_eq!(metric(&a.node, "qr_node_responses_cut_total").await, 1.0);
        assert_eq!(metric(&a.node, "qr_node_digest_refusals_total").await, 0.0);
    });
    // And from the cache from then on.
    let got = rt.block_on(stream_get(&a.node, &path));
    assert_eq!((got.status, &got.error), (200, &None));
    assert_eq!(&Digest::of(&got.body), &d);
    rt.block_on(async {
        assert_eq!(metric(&a.node, "qr_node_cache_hits_total").await, 1.0);
    });
}

#[test]
fn a_cached_copy_that_rots_is_cut_once_then_fetched_again() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let size = 16usize << 20;
    let l = write_layout(&dir.path().join("layout"), TAG, &[size]);
    let (layout, blobs) = (l.dir, l.layers);
    let (d, good) = &blobs[0];
    let a = agents(dir.path(), &layout, 122, 19343);
    let path = format!("/v2/{REPO}/blobs/{d}");
    let rt = rt();
    let got = rt.block_on(stream_get(&a.node, &path));
    assert_eq!((got.status, &got.error), (200, &None));
    assert_eq!(&Digest::of(&got.body), d);
    // Rot behind the node's back in a copy it wrote and verified itself
    // (so no lookup hashes it again).
    let cached = a.node_cache.join("blobs/sha256").join(d.hex());
    let mut bad = good.clone();
    bad[size / 2] ^= 0x10;
    std::fs::write(&cached, &bad).unwrap();
    let got = rt.block_on(stream_get(&a.node, &path));
    assert_eq!(got.status, 200);
    assert!(
        got.error.is_some(),
        "a rotten copy served complete ({} bytes)",
        got.body.len()
    );
    assert!(got.body.len() < size);
    assert_eq!(&got.body[..], &bad[..got.body.len()]);
    eprintln!(
        "rotten cache copy: cut after {} of {size} bytes: {}",
        got.body.len(),
        got.error.as_deref().unwrap_or("")
    );
    rt.block_on(async {
        assert_eq!(metric(&a.node, "qr_node_cache_corrupt_total").await, 1.0);
        assert_eq!(metric(&a.node, "qr_node_responses_cut_total").await, 1.0);
    });
    let kept = std::fs::read(a.node_cache.join("quarantine").join(d.hex())).unwrap();
    assert!(kept == bad, "the rotten copy kept aside");
    // The client's retry: fetched afresh, whole and right; cache repaired.
    let got = rt.block_on(stream_get(&a.node, &path));
    assert_eq!((got.status, &got.error), (200, &None));
    assert_eq!(&Digest::of(&got.body), d);
    assert!(&std::fs::read(&cached).unwrap() == good, "cache repaired");
    rt.block_on(async {
        assert_eq!(metric(&a.node, "qr_node_cache_corrupt_total").await, 1.0);
        assert_eq!(metric(&a.node, FABRIC_OBJECTS).await, 2.0);
    });
}

#[test]
fn two_requests_of_one_cold_blob_stream_one_fabric_fetch() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let size = 128usize << 20;
    let l = write_layout(&dir.path().join("layout"), TAG, &[size]);
    let (layout, blobs) = (l.dir, l.layers);
    let a = agents(dir.path(), &layout, 86, 19186);
    let (d, _) = &blobs[0];
    let path = format!("/v2/{REPO}/blobs/{d}");
    let rt = rt();
    let (one, two) =
        rt.block_on(async { tokio::join!(stream_get(&a.node, &path), stream_get(&a.node, &path)) });
    for (i, got) in [&one, &two].into_iter().enumerate() {
        assert_eq!((got.status, &got.error), (200, &None), "request {i}");
        assert_eq!(&Digest::of(&got.body), d, "request {i}");
        // Both streamed: each had bytes before the one fetch was verified.
        let (fetched, finished) = got.at_first_byte.unwrap();
        assert_eq!(finished, 0.0, "request {i} waited for the whole blob");
        eprintln!(
            "request {i}: first byte after {:.1} ms ({:.1} MiB fetched), body after {:.1} ms",
            got.ttfb.unwrap().as_secs_f64() * 1e3,
            fetched / (1 << 20) as f64,
            got.total.as_secs_f64() * 1e3
        );
    }
    rt.block_on(async {
        assert_eq!(metric(&a.node, FABRIC_OBJECTS).await, 1.0);
        assert_eq!(metric(&a.node, FABRIC_BYTES).await, size as f64);
        assert_eq!(
            metric(&a.node, "qr_node_single_flight_joins_total").await,
            1.0
        );
        assert_eq!(metric(&a.node, "qr_node_cache_misses_total").await, 2.0);
        assert_eq!(
            metric(&a.ra_metrics, "qr_registry_sent_bytes_total").await,
            size as f64,
            "the registry agent sent the blob once"
        );
    });
}
