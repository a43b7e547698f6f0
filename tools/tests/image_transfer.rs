//! The image channel's transfer logic in one process, over a plain quinn pair
//! on loopback UDP (the fabric is proven elsewhere; the `qr` agents over
//! `soft` are in image_agents.rs): registry agent serving an OCI layout,
//! node agent fetching in parallel adaptive chunks, mutual TLS with the dev
//! CA, resume after the registry agent goes away mid-blob, a corrupt source
//! refused and never cached, a corrupt cached copy quarantined and fetched
//! again, and the node agent's HTTP answers (Range, 416,
//! OCI error JSON, 400). Addresses: 127.0.111.10–19, TCP 19110–19119.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use quic_rdma_tools::access::Access;
use quic_rdma_tools::image::cache::Cache;
use quic_rdma_tools::image::client::{DialFailure, DialFuture, Dialer, FabricClient, FetchError};
use quic_rdma_tools::image::digest::Digest;
use quic_rdma_tools::image::metrics::{NodeMetrics, RegistryMetrics};
use quic_rdma_tools::image::node::Node;
use quic_rdma_tools::image::source::Source;
use quic_rdma_tools::image::spool::Spool;
use quic_rdma_tools::image::transfer::TransferOptions;
use quic_rdma_tools::image::{http, server, wire};
use quic_rdma_tools::pki::{generate_dev_pki, LeafSpec, Mtls};
use rand::RngCore;

const REG_IP: &str = "127.0.111.10";

fn pki(dir: &Path) -> (Mtls, Mtls) {
    generate_dev_pki(
        dir,
        &[
            LeafSpec {
                name: "registry".into(),
                sans: vec![REG_IP.into()],
            },
            LeafSpec {
                name: "node".into(),
                sans: vec!["node".into()],
            },
        ],
    )
    .unwrap();
    let load = |n: &str| {
        Mtls::from_pem_files(
            &dir.join(format!("{n}.pem")),
            &dir.join(format!("{n}-key.pem")),
            &dir.join("ca.pem"),
        )
        .unwrap()
    };
    (load("registry"), load("node"))
}

/// The repository the test layouts are served under.
const REPO: &str = "library/x";

/// An OCI layout (served as [`REPO`]) whose one image has a layer of `size`
/// random bytes; returns the layer's digest and bytes.
fn layout_with_blob(dir: &Path, size: usize) -> (Digest, Vec<u8>) {
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let mut data = vec![0u8; size];
    rand::thread_rng().fill_bytes(&mut data);
    let d = Digest::of(&data);
    std::fs::write(blobs.join(d.hex()), &data).unwrap();
    let config = br#"{"architecture":"amd64","os":"linux"}"#;
    let c = Digest::of(config);
    std::fs::write(blobs.join(c.hex()), config).unwrap();
    let manifest = format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json",
            "config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{c}","size":{}}},
            "layers":[{{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"{d}","size":{size}}}]}}"#,
        config.len()
    );
    let m = Digest::of(manifest.as_bytes());
    std::fs::write(blobs.join(m.hex()), &manifest).unwrap();
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    std::fs::write(
        dir.join("index.json"),
        format!(
            r#"{{"schemaVersion":2,"manifests":[{{"mediaType":"application/vnd.oci.image.manifest.v1+json",
                "digest":"{m}","size":{},"annotations":{{"org.opencontainers.image.ref.name":"v1"}}}}]}}"#,
            manifest.len()
        ),
    )
    .unwrap();
    (d, data)
}

/// A peer that went away is noticed in seconds, not after quinn's default
/// 30 s idle timeout. Looser than the fabric's (docs/architecture.md §5):
/// the node, the registry agent and the disk writes share one process and
/// two worker threads, which a loaded machine once held up for 2 s
/// mid-transfer (a second, unplanned connection loss). A cut agent's
/// CONNECTION_CLOSE is often lost in the full receive buffer of a transfer
/// at loopback speed (12 of 20 runs), and the node then notices by this
/// timeout.
fn transport() -> Arc<quinn::TransportConfig> {
    let mut t = quinn::TransportConfig::default();
    t.max_idle_timeout(Some(Duration::from_secs(5).try_into().unwrap()));
    t.keep_alive_interval(Some(Duration::from_secs(1)));
    Arc::new(t)
}

/// A UDP server's config: the channel's TLS with [`transport`].
fn server_config(m: &Mtls) -> quinn::ServerConfig {
    let settings = m.server_settings(wire::ALPN);
    Arc::unwrap_or_clone(settings.server_config(transport()).unwrap())
}

/// A UDP client's config: the channel's TLS with [`transport`].
fn client_config(m: &Mtls) -> quinn::ClientConfig {
    let mut c = m.client_config(wire::ALPN).unwrap();
    c.transport_config(transport());
    c
}

struct Registry {
    endpoint: quinn::Endpoint,
    metrics: Arc<RegistryMetrics>,
}

fn start_registry(addr: SocketAddr, mtls: &Mtls, layout: &Path, cache: &Path) -> Registry {
    start_registry_with(addr, mtls, layout, cache, Access::Open)
}

/// [`start_registry`] with an access policy.
fn start_registry_with(
    addr: SocketAddr,
    mtls: &Mtls,
    layout: &Path,
    cache: &Path,
    access: Access,
) -> Registry {
    let cfg = server_config(mtls);
    let endpoint = quinn::Endpoint::server(cfg, addr).unwrap();
    let metrics = Arc::new(RegistryMetrics::default());
    let spool = Arc::new(Spool::new(
        Arc::new(Source::Layout {
            dir: layout.to_path_buf(),
            repository: REPO.into(),
        }),
        Cache::open(cache, 1 << 40).unwrap(),
        metrics.clone(),
    ));
    let serving = server::Serving {
        metrics: metrics.clone(),
        access: Arc::new(access),
        ..server::Serving::default()
    };
    tokio::spawn(server::serve(endpoint.clone(), spool, serving));
    Registry { endpoint, metrics }
}

struct UdpDialer {
    server: SocketAddr,
    cfg: quinn::ClientConfig,
}

impl Dialer for UdpDialer {
    fn dial(&self) -> DialFuture<'_> {
        Box::pin(async move {
            let dial = async {
                let mut ep = quinn::Endpoint::client("127.0.111.11:0".parse()?)?;
                ep.set_default_client_config(self.cfg.clone());
                let conn = ep.connect(self.server, REG_IP)?.await?;
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>((ep, conn))
            };
            dial.await.map_err(DialFailure::Other)
        })
    }
}

fn node(server: SocketAddr, mtls: &Mtls, cache: &Path, opts: TransferOptions) -> Arc<Node> {
    let cfg = client_config(mtls);
    Node::new(
        FabricClient::new(Box::new(UdpDialer { server, cfg })),
        Cache::open(cache, 1 << 40).unwrap(),
        Arc::new(NodeMetrics::default()),
        opts,
    )
}

fn read_file(f: &std::fs::File) -> Vec<u8> {
    use std::io::Read;
    let mut v = Vec::new();
    f.try_clone().unwrap().read_to_end(&mut v).unwrap();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blob_in_parallel_chunks_verified_and_cached() {
    let dir = tempfile::tempdir().unwrap();
    let (reg_tls, node_tls) = pki(&dir.path().join("pki"));
    let (d, data) = layout_with_blob(&dir.path().join("layout"), 24 << 20);
    let addr: SocketAddr = format!("{REG_IP}:0").parse().unwrap();
    let reg = start_registry(
        addr,
        &reg_tls,
        &dir.path().join("layout"),
        &dir.path().join("rc"),
    );
    let server = reg.endpoint.local_addr().unwrap();
    let n = node(
        server,
        &node_tls,
        &dir.path().join("nc"),
        TransferOptions::default(),
    );
    let b = n.blob("library/x", &d, &|_, _| {}).await.unwrap();
    assert_eq!(b.size, data.len() as u64);
    assert_eq!(Digest::of(&read_file(&b.file)), d);
    assert!(n.metrics.chunks.get() > 1, "one chunk only: not parallel");
    assert_eq!(n.metrics.bytes_fabric.get(), data.len() as u64);
    // The cache commit runs after the blob is handed over (on a blocking
    // thread, slow on a loaded host): until it is done a second fetch joins
    // the flight instead of hitting the cache. Wait for it.
    b.stored.wait().await.unwrap();
    // Again: from the cache, nothing over the fabric.
    let b2 = n.blob("library/x", &d, &|_, _| {}).await.unwrap();
    assert_eq!(b2.path.name(), "cache");
    assert_eq!(n.metrics.cache_hits.get(), 1);
    assert_eq!(reg.metrics.upstream_blob_fetches.get(), 1);
    // The registry agent holds the blob verified whole: its chunks come
    // unhashed (the node verifies every blob whole, as above).
    let c = FabricClient::new(Box::new(UdpDialer {
        server,
        cfg: client_config(&node_tls),
    }));
    let a = c
        .request(&wire::Request::Blob {
            repo: "library/x".into(),
            digest: d,
            offset: 1000,
            len: 5000,
        })
        .await
        .unwrap();
    assert_eq!(a.body_sha256, wire::UNHASHED);
    assert_eq!(&a.body[..], &data[1000..6000]);
    // Unknown digest: NotFound, not a hang.
    let unknown = Digest::of(b"nope");
    assert!(matches!(
        n.blob("library/x", &unknown, &|_, _| {}).await,
        Err(FetchError::NotFound(_))
    ));
}

/// A registry agent of the CA in `dir/pki` serving one blob, and a node
/// whose identity `node_tls` makes in `dir`: the node's error fetching the
/// blob, and whether the blob reached its cache anyway.
async fn fetch_as(node_tls: impl FnOnce(&Path) -> Mtls) -> (FetchError, bool) {
    let dir = tempfile::tempdir().unwrap();
    let (reg_tls, _) = pki(&dir.path().join("pki"));
    let node_tls = node_tls(dir.path());
    let (d, _) = layout_with_blob(&dir.path().join("layout"), 1000);
    let reg = start_registry(
        format!("{REG_IP}:0").parse().unwrap(),
        &reg_tls,
        &dir.path().join("layout"),
        &dir.path().join("rc"),
    );
    let n = node(
        reg.endpoint.local_addr().unwrap(),
        &node_tls,
        &dir.path().join("nc"),
        TransferOptions::default(),
    );
    let e = n.blob(REPO, &d, &|_, _| {}).await.unwrap_err();
    (e, n.cache.contains(&d))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_of_another_ca_is_refused() {
    let (e, cached) = fetch_as(|dir| pki(&dir.join("other")).1).await;
    assert!(matches!(e, FetchError::Connection(_)), "{e}");
    assert!(!cached);
}

/// A node that trusts the registry agent but shows a certificate of another
/// CA: the agent refuses it after the handshake, and the node says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_client_certificate_is_named_not_a_lost_connection() {
    let (e, cached) = fetch_as(|dir| {
        let other = dir.join("other");
        pki(&other);
        Mtls::from_pem_files(
            &other.join("node.pem"),
            &other.join("node-key.pem"),
            &dir.join("pki").join("ca.pem"),
        )
        .unwrap()
    })
    .await;
    let text = e.to_string();
    assert!(matches!(e, FetchError::Connection(_)), "{text}");
    assert!(text.contains("refused our TLS handshake"), "{text}");
    // The other CA has the same name as ours, so rustls finds "our" issuer
    // and the signature fails: DecryptError; a differently named CA would
    // give UnknownCA. Either way the alert is named.
    assert!(
        ["DecryptError", "UnknownCA", "BadCertificate"]
            .iter()
            .any(|a| text.contains(&format!("alert {a}"))),
        "{text}"
    );
    assert!(!cached);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumes_after_the_registry_agent_goes_away_mid_blob() {
    // Shown only if the test fails: which chunks failed, and why.
    let _ = tracing_subscriber::fmt()
        .with_env_filter("info")
        .with_ansi(false)
        .with_test_writer()
        .try_init();
    let dir = tempfile::tempdir().unwrap();
    let (reg_tls, node_tls) = pki(&dir.path().join("pki"));
    let layout = dir.path().join("layout");
    let (d, _) = layout_with_blob(&layout, 64 << 20);
    let reg = start_registry(
        format!("{REG_IP}:0").parse().unwrap(),
        &reg_tls,
        &layout,
        &dir.path().join("rc"),
    );
    let server = reg.endpoint.local_addr().unwrap();
    let opts = TransferOptions {
        chunk: 256 << 10,
        fixed_chunk: true,
        parallel: 2,
        ..TransferOptions::default()
    };
    let n = node(server, &node_tls, &dir.path().join("nc"), opts);
    let progress = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let p2 = progress.clone();
    let (n2, d2) = (n.clone(), d);
    let pull = tokio::spawn(async move {
        n2.blob(REPO, &d2, &move |v, _| {
            p2.store(v, std::sync::atomic::Ordering::Relaxed)
        })
        .await
    });
    // Cut it once some but not all of it has arrived, then come back on the
    // same address (a restarted agent).
    while progress.load(std::sync::atomic::Ordering::Relaxed) < 8 << 20 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    reg.endpoint.close(0u32.into(), b"killed");
    reg.endpoint.wait_idle().await;
    drop(reg);
    let cut_at = progress.load(std::sync::atomic::Ordering::Relaxed);
    assert!(cut_at < 64 << 20, "finished before the cut");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let reg2 = start_registry(server, &reg_tls, &layout, &dir.path().join("rc"));
    let b = tokio::time::timeout(Duration::from_secs(60), pull)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(Digest::of(&read_file(&b.file)), d);
    // One cut, however it lands: a chunk already on its way may be joined
    // after the first failure, and a redial may reach the closing agent and
    // be refused; neither is a second resume.
    assert_eq!(n.metrics.resumes.get(), 1, "one cut, one resume");
    // The restarted agent sent less than the whole blob: the node went on
    // from what it had.
    assert!(
        reg2.metrics.bytes_sent.get() <= (64 << 20) - cut_at + 2 * (256 << 10),
        "sent {} after a cut at {cut_at}",
        reg2.metrics.bytes_sent.get()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_source_is_an_error_and_never_cached() {
    let dir = tempfile::tempdir().unwrap();
    let (reg_tls, node_tls) = pki(&dir.path().join("pki"));
    let layout = dir.path().join("layout");
    let (d, mut data) = layout_with_blob(&layout, 3 << 20);
    data[1 << 20] ^= 0x40;
    std::fs::write(layout.join("blobs/sha256").join(d.hex()), &data).unwrap();
    let reg = start_registry(
        format!("{REG_IP}:0").parse().unwrap(),
        &reg_tls,
        &layout,
        &dir.path().join("rc"),
    );
    let n = node(
        reg.endpoint.local_addr().unwrap(),
        &node_tls,
        &dir.path().join("nc"),
        TransferOptions::default(),
    );
    let e = n.blob(REPO, &d, &|_, _| {}).await.unwrap_err();
    assert!(matches!(e, FetchError::DigestMismatch(_)), "{e}");
    assert!(!n.cache.contains(&d));
    assert!(n.metrics.verify_failures.get() >= 1);
    assert!(reg.metrics.upstream_verify_failures.get() >= 1);
    // Neither agent's cache holds any blob, and no temp file is left.
    for c in ["nc", "rc"] {
        let p = dir.path().join(c);
        assert_eq!(
            std::fs::read_dir(p.join("blobs/sha256")).unwrap().count(),
            0
        );
        assert_eq!(std::fs::read_dir(p.join("tmp")).unwrap().count(), 0);
    }
}

/// Integrity at rest: a byte flipped in each agent's cached copy (found when
/// the agents restart and read it again) is never served — each copy is
/// quarantined and counted, the blob comes afresh from the source, the node
/// gets the right bytes on the first request, and both caches are repaired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_cached_copy_is_quarantined_and_fetched_again() {
    let dir = tempfile::tempdir().unwrap();
    let (reg_tls, node_tls) = pki(&dir.path().join("pki"));
    let layout = dir.path().join("layout");
    let (d, data) = layout_with_blob(&layout, 3 << 20);
    let (rc, nc) = (dir.path().join("rc"), dir.path().join("nc"));
    let addr: SocketAddr = format!("{REG_IP}:0").parse().unwrap();
    {
        let reg = start_registry(addr, &reg_tls, &layout, &rc);
        let n = node(
            reg.endpoint.local_addr().unwrap(),
            &node_tls,
            &nc,
            TransferOptions::default(),
        );
        n.blob(REPO, &d, &|_, _| {})
            .await
            .unwrap()
            .stored
            .wait()
            .await
            .unwrap();
        reg.endpoint.close(0u32.into(), b"restart");
    }
    for c in [&rc, &nc] {
        let p = c.join("blobs/sha256").join(d.hex());
        // The registry agent commits behind its last chunk.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !p.exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "{} never cached",
                p.display()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut bytes = std::fs::read(&p).unwrap();
        bytes[(2 << 20) + 17] ^= 0x01;
        std::fs::write(&p, bytes).unwrap();
    }
    let reg = start_registry(addr, &reg_tls, &layout, &rc);
    let n = node(
        reg.endpoint.local_addr().unwrap(),
        &node_tls,
        &nc,
        TransferOptions::default(),
    );
    let b = n.blob(REPO, &d, &|_, _| {}).await.unwrap();
    assert_eq!(
        Digest::of(&read_file(&b.file)),
        d,
        "the right bytes, first time"
    );
    assert_eq!(b.path.name(), "fabric");
    assert_eq!(n.metrics.cache_corrupt.get(), 1);
    assert_eq!(n.metrics.verify_failures.get(), 1);
    assert_eq!(reg.metrics.cache_corrupt.get(), 1);
    assert_eq!(reg.metrics.upstream_blob_fetches.get(), 1, "fetched afresh");
    b.stored.wait().await.unwrap();
    for c in [&rc, &nc] {
        // The registry agent commits behind its last chunk, which the node
        // may have read first.
        let p = c.join("blobs/sha256").join(d.hex());
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !p.exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "{} never repaired",
                p.display()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let good = std::fs::read(&p).unwrap();
        assert_eq!(good, data, "{} repaired", c.display());
        let bad = std::fs::read(c.join("quarantine").join(d.hex())).unwrap();
        assert_ne!(bad, data, "the damaged copy kept aside");
    }
    // Served from the repaired cache now, nothing counted again.
    let again = n.blob(REPO, &d, &|_, _| {}).await.unwrap();
    assert_eq!(again.path.name(), "cache");
    assert_eq!(n.metrics.cache_corrupt.get(), 1);
}

/// Issue 23, hole 7: a blob is served under repository R only if R is served
/// and references it — from the registry agent's store, and from a node's
/// cache that holds the blob because another repository's pull put it there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blobs_are_served_only_under_repositories_that_reference_them() {
    let dir = tempfile::tempdir().unwrap();
    let (reg_tls, node_tls) = pki(&dir.path().join("pki"));
    let layout = dir.path().join("layout");
    let (d, data) = layout_with_blob(&layout, 1 << 20);
    // A blob in the layout that no manifest references.
    let stray = b"not part of any image".to_vec();
    let s = Digest::of(&stray);
    std::fs::write(layout.join("blobs/sha256").join(s.hex()), &stray).unwrap();
    let reg = start_registry(
        format!("{REG_IP}:0").parse().unwrap(),
        &reg_tls,
        &layout,
        &dir.path().join("rc"),
    );
    let n = node(
        reg.endpoint.local_addr().unwrap(),
        &node_tls,
        &dir.path().join("nc"),
        TransferOptions::default(),
    );
    let not_found = |r: Result<_, FetchError>| matches!(r, Err(FetchError::NotFound(_)));
    assert!(not_found(
        n.blob("othertenant/secret", &d, &|_, _| {}).await
    ));
    assert!(
        not_found(n.blob(REPO, &s, &|_, _| {}).await),
        "unreferenced"
    );
    assert!(!n.cache.contains(&d) && !n.cache.contains(&s));
    // Pulled under its repository: cached (sha256 equal).
    let b = n.blob(REPO, &d, &|_, _| {}).await.unwrap();
    assert_eq!(Digest::of(&read_file(&b.file)), Digest::of(&data));
    b.stored.wait().await.unwrap();
    assert!(n.cache.contains(&d));
    // In the node's cache now, still not readable under another name.
    assert!(not_found(
        n.blob("othertenant/secret", &d, &|_, _| {}).await
    ));
    assert!(matches!(
        n.blob_size("othertenant/secret", &d).await,
        Err(FetchError::NotFound(_))
    ));
    // Nor over the wire, by asking the registry agent directly.
    let c = FabricClient::new(Box::new(UdpDialer {
        server: reg.endpoint.local_addr().unwrap(),
        cfg: client_config(&node_tls),
    }));
    for req in [
        wire::Request::Blob {
            repo: "othertenant/secret".into(),
            digest: d,
            offset: 0,
            len: 100,
        },
        wire::Request::Manifest {
            repo: "othertenant/secret".into(),
            reference: "v1".parse().unwrap(),
            accept: String::new(),
        },
    ] {
        assert!(matches!(
            c.request(&req).await,
            Err(FetchError::NotFound(_))
        ));
    }
    // The node serving its cache to peers: the blob under the repository it
    // was confirmed for, not under another name.
    let peer_cfg = server_config(&reg_tls);
    let peer_ep =
        quinn::Endpoint::server(peer_cfg, format!("{REG_IP}:0").parse().unwrap()).unwrap();
    tokio::spawn(server::serve_store(
        peer_ep.clone(),
        server::Store::Peer(n.clone()),
        server::Serving::default(),
    ));
    let p = FabricClient::new(Box::new(UdpDialer {
        server: peer_ep.local_addr().unwrap(),
        cfg: client_config(&node_tls),
    }));
    let ask = |repo: &str| wire::Request::Blob {
        repo: repo.into(),
        digest: d,
        offset: 0,
        len: 100,
    };
    assert_eq!(&p.request(&ask(REPO)).await.unwrap().body[..], &data[..100]);
    assert!(matches!(
        p.request(&ask("othertenant/secret")).await,
        Err(FetchError::NotFound(_))
    ));
}

/// Issue 23, hole 7: an access policy grants certificate identities channels
/// and repositories. A certificate from the same CA that is granted only the
/// KV channel (a KV relay's) is refused on the image channel; an image
/// client is refused repositories outside its grant (403 DENIED over HTTP).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_policy_refuses_other_channels_and_repositories() {
    let dir = tempfile::tempdir().unwrap();
    let pki_dir = dir.path().join("pki");
    let (reg_tls, node_tls) = pki(&pki_dir);
    generate_dev_pki(
        &pki_dir,
        &[LeafSpec {
            name: "kv".into(),
            sans: vec!["kv".into()],
        }],
    )
    .unwrap();
    let kv_tls = Mtls::from_pem_files(
        &pki_dir.join("kv.pem"),
        &pki_dir.join("kv-key.pem"),
        &pki_dir.join("ca.pem"),
    )
    .unwrap();
    let layout = dir.path().join("layout");
    let (d, _) = layout_with_blob(&layout, 1 << 16);
    let policy = Access::parse(
        br#"{"grants": [
            {"identities": ["node"], "channels": ["qr-image/1"], "repositories": ["team-a/**"]},
            {"identities": ["kv"], "channels": ["qr-kv/1"]}]}"#,
    )
    .unwrap();
    let reg = start_registry_with(
        format!("{REG_IP}:0").parse().unwrap(),
        &reg_tls,
        &layout,
        &dir.path().join("rc"),
        policy,
    );
    let server = reg.endpoint.local_addr().unwrap();
    // The KV certificate: its connection is closed, nothing is served.
    let kv = node(
        server,
        &kv_tls,
        &dir.path().join("kc"),
        TransferOptions::default(),
    );
    let e = kv.blob(REPO, &d, &|_, _| {}).await.unwrap_err();
    assert!(
        matches!(e, FetchError::Connection(_)) && e.to_string().contains("not granted channel"),
        "{e}"
    );
    // The node certificate: granted team-a/**, not library/x.
    let n = node(
        server,
        &node_tls,
        &dir.path().join("nc"),
        TransferOptions::default(),
    );
    let e = n.blob(REPO, &d, &|_, _| {}).await.unwrap_err();
    assert!(matches!(e, FetchError::Denied(_)), "{e}");
    assert!(
        e.to_string().contains("not granted repository library/x"),
        "{e}"
    );
    assert!(!n.cache.contains(&d));
    assert!(reg.metrics.denied.get() >= 2, "{}", reg.metrics.render());
    // Over the node agent's HTTP API: 403 with the OCI error code DENIED.
    let listener = tokio::net::TcpListener::bind("127.0.111.12:0")
        .await
        .unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(http::serve(
        listener,
        quic_rdma_tools::listener::Limits::DEFAULT,
        n.clone(),
    ));
    let r = reqwest::get(format!("{base}/v2/{REPO}/blobs/{d}"))
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert!(r.text().await.unwrap().contains("DENIED"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_ranges_errors_and_malformed_requests() {
    let dir = tempfile::tempdir().unwrap();
    let (reg_tls, node_tls) = pki(&dir.path().join("pki"));
    let layout = dir.path().join("layout");
    let (d, data) = layout_with_blob(&layout, 1 << 20);
    let reg = start_registry(
        format!("{REG_IP}:0").parse().unwrap(),
        &reg_tls,
        &layout,
        &dir.path().join("rc"),
    );
    let n = node(
        reg.endpoint.local_addr().unwrap(),
        &node_tls,
        &dir.path().join("nc"),
        TransferOptions::default(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.111.12:19110")
        .await
        .unwrap();
    tokio::spawn(http::serve(
        listener,
        quic_rdma_tools::listener::Limits::DEFAULT,
        n.clone(),
    ));
    let base = "http://127.0.111.12:19110";
    let c = reqwest::Client::new();
    let url = format!("{base}/v2/library/x/blobs/{d}?ns=docker.io");

    let r = c
        .get(&url)
        .header("Range", "bytes=100-199")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 206);
    assert_eq!(
        r.headers()["content-range"],
        format!("bytes 100-199/{}", data.len())
    );
    assert_eq!(r.headers()["docker-content-digest"], d.to_string());
    assert_eq!(r.bytes().await.unwrap(), &data[100..200]);
    // The first (cold) request's bytes count once, under the fabric.
    let bytes = |p: &str| {
        quic_rdma_tools::image::metrics::sample(
            &n.metrics.render(),
            &format!("qr_node_bytes_total{{path=\"{p}\"}}"),
        )
    };
    assert_eq!(bytes("fabric"), Some(data.len() as f64));
    assert_eq!(bytes("cache"), Some(0.0));

    let r = c
        .get(&url)
        .header("Range", "bytes=-10")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 206);
    assert_eq!(r.bytes().await.unwrap(), &data[data.len() - 10..]);

    let r = c
        .get(&url)
        .header("Range", format!("bytes={}-", data.len()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 416);
    assert_eq!(
        r.headers()["content-range"],
        format!("bytes */{}", data.len())
    );

    let r = c.get(&url).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-length"], data.len().to_string());
    assert_eq!(Digest::of(&r.bytes().await.unwrap()), d);
    // Warm requests count under the cache: 10 bytes, then the whole blob.
    assert_eq!(bytes("cache"), Some((10 + data.len()) as f64));
    assert_eq!(bytes("fabric"), Some(data.len() as f64));

    let r = c.head(&url).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-length"], data.len().to_string());

    let unknown = format!("{base}/v2/library/x/blobs/{}", Digest::of(b"unknown"));
    let r = c.get(&unknown).send().await.unwrap();
    assert_eq!(r.status(), 404);
    let v: serde_json::Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
    assert_eq!(v["errors"][0]["code"], "BLOB_UNKNOWN");

    let r = c
        .get(format!("{base}/v2/library/x/blobs/sha256:xyz"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: serde_json::Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
    assert_eq!(v["errors"][0]["code"], "DIGEST_INVALID");

    // Garbage on the socket: an HTTP 400 from the parser, and the agent serves on.
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect("127.0.111.12:19110")
            .await
            .unwrap();
        s.write_all(b"\x00\x01GARBAGE \xff\r\n\r\n").await.unwrap();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
        assert!(
            String::from_utf8_lossy(&out).starts_with("HTTP/1.1 400"),
            "{out:?}"
        );
    }
    let r = c.get(format!("{base}/v2/")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["docker-distribution-api-version"],
        "registry/2.0"
    );
    let m = c
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    use quic_rdma_tools::image::metrics::sample;
    assert_eq!(sample(&m, "qr_node_bad_requests_total"), Some(1.0));
    // The first GET fetched it, the three after it were served from the
    // cache; the unknown digest was the other miss.
    assert_eq!(sample(&m, "qr_node_cache_misses_total"), Some(2.0));
    assert_eq!(sample(&m, "qr_node_cache_hits_total"), Some(3.0));
}
