//! `qr registry-agent`: serve manifests and blobs over the fabric
//! (`qr-image/1`, mutual TLS) from an upstream registry or an OCI layout.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};

use super::args::{
    parse_age, parse_bytes, FabricArgs, ListenArgs, LivenessArgs, MetricsArgs, RetryArgs,
};
use crate::access::Access;
use crate::channel_endpoint::listen;
use crate::endpoint_metrics::retry_gate;
use crate::http::Page;
use crate::identity::Identity;
use crate::image::cache::Cache;
use crate::image::digest::check_namespace;
use crate::image::manifests::{ManifestCache, ManifestPolicy};
use crate::image::metrics::RegistryMetrics;
use crate::image::source::{Source, Upstreams};
use crate::image::spool::Spool;
use crate::image::upstream::{CredentialStore, Upstream, UpstreamOptions};
use crate::image::{server, wire};
use crate::pki::MtlsArgs;

/// Options of `qr registry-agent`.
#[derive(Clone, Debug, clap::Args)]
#[command(arg(crate::config::option()))]
pub(crate) struct RegistryAgentArgs {
    /// An upstream registry, pulled through: `URL` (http://HOST:PORT or
    /// https://HOST), the default, or `NS=URL`, the registry for requests
    /// whose client names registry NS (containerd's `?ns=`: the host of the
    /// image reference, e.g. docker.io=https://registry-1.docker.io).
    /// Repeatable; requests naming no registry listed go to the default.
    #[arg(long, required_unless_present = "layout", conflicts_with = "layout")]
    upstream: Vec<String>,

    /// A PEM file of CA certificates trusted for https:// upstreams (on top
    /// of the public web roots). Repeatable.
    #[arg(long)]
    upstream_ca: Vec<PathBuf>,

    /// Credentials for upstreams, per registry host, in the format of
    /// Docker's config.json (`{"auths":{"HOST:PORT":{"auth":"base64 of
    /// user:password"}}}`, as `docker login` or `skopeo login --authfile`
    /// writes it). Used for Basic auth and to fetch Bearer tokens.
    #[arg(long)]
    upstream_credentials: Option<PathBuf>,

    /// An OCI image-layout directory to serve instead of an upstream.
    #[arg(long, requires = "layout_repository")]
    layout: Option<PathBuf>,

    /// The repository name the --layout directory is served under (e.g.
    /// library/alpine); requests for any other repository are not found.
    #[arg(long, requires = "layout")]
    layout_repository: Option<String>,

    /// A JSON file granting client certificate identities channels and
    /// repositories (see SECURITY.md, "Authorization"). Without it every
    /// certificate from the CA may read every repository.
    #[arg(long)]
    access_policy: Option<PathBuf>,

    /// --ip and --service-port (the bootstrap service node agents dial).
    #[command(flatten)]
    listen: ListenArgs,

    #[command(flatten)]
    fabric: FabricArgs,

    /// Directory of the verified blob cache (pulled-through blobs stay here).
    #[arg(long)]
    cache_dir: PathBuf,

    /// Bytes a second the cache scrub reads, hashing every cached blob again
    /// pass after pass (a corrupt copy is quarantined and fetched afresh);
    /// 0 turns it off.
    #[arg(long, default_value = "16M", value_parser = parse_bytes)]
    cache_scrub_rate: u64,

    /// Size bound of the cache (least recently used blobs go first).
    #[arg(long, default_value = "20G", value_parser = parse_bytes)]
    cache_size: u64,

    /// How long a manifest or tag list fetched by tag is served from the
    /// cache without asking the upstream (by digest they never expire).
    #[arg(long, default_value = "30s", value_parser = parse_age)]
    manifest_ttl: std::time::Duration,

    /// How much longer than --manifest-ttl a cached manifest or tag list is
    /// served, flagged stale (`X-Qr-Stale`), while the upstream registry
    /// cannot be reached.
    #[arg(long, default_value = "7d", value_parser = parse_age)]
    manifest_max_stale: std::time::Duration,

    /// `--metrics` and the limits of its listener.
    #[command(flatten)]
    metrics: MetricsArgs,

    /// Certificate, key and CA (PEM) of mutual TLS with the node agents.
    #[command(flatten)]
    tls: MtlsArgs,

    /// Liveness timers of the QUIC connections.
    #[command(flatten)]
    liveness: LivenessArgs,

    /// When node agents' connection attempts get a Retry (address validation).
    #[command(flatten)]
    retry: RetryArgs,
}

/// The `--upstream` registries with their CA and credentials.
fn upstreams(args: &RegistryAgentArgs) -> Result<Upstreams> {
    let options = UpstreamOptions {
        ca: args.upstream_ca.clone(),
        credentials: match &args.upstream_credentials {
            Some(f) => CredentialStore::load(f)?,
            None => CredentialStore::default(),
        },
    };
    let mut set = Upstreams::default();
    for u in &args.upstream {
        // `NS=URL`; a URL has no `=` before its scheme.
        let (ns, url) = match u.split_once('=') {
            Some((ns, url)) if !ns.contains("://") => (Some(ns), url),
            _ => (None, u.as_str()),
        };
        if let Some(ns) = ns {
            check_namespace(ns).with_context(|| format!("--upstream {u}"))?;
        }
        set.add(ns.map(str::to_string), Upstream::with(url, &options)?);
    }
    Ok(set)
}

/// Run `qr registry-agent` until killed; 1 if it cannot start.
pub(crate) fn main(args: &RegistryAgentArgs) -> ExitCode {
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("qr registry-agent: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &RegistryAgentArgs) -> Result<()> {
    let identity = Identity::load(&args.tls)?;
    let source = match (&args.upstream, &args.layout) {
        (u, None) if !u.is_empty() => Source::Upstream(upstreams(args)?),
        (_, Some(l)) => {
            if !l.join("index.json").exists() {
                anyhow::bail!(
                    "{}: no index.json (give an OCI image-layout directory, e.g. one \
                     `skopeo copy … oci:DIR` or `umoci init` made)",
                    l.display()
                );
            }
            Source::Layout {
                dir: l.clone(),
                repository: args
                    .layout_repository
                    .clone()
                    .expect("clap requires --layout-repository with --layout"),
            }
        }
        _ => unreachable!("clap requires --upstream or --layout"),
    };
    let cache = Cache::open(&args.cache_dir, args.cache_size)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    rt.block_on(async {
        let opts = args.listen.options(args.fabric, args.liveness.liveness()?);
        let server = Arc::new(listen(
            &opts,
            &identity.current().server_settings(wire::ALPN),
        )?);
        let rotated = server.clone();
        identity.reload_on_hangup("qr registry-agent", move |m| {
            rotated.set_tls(&m.server_settings(wire::ALPN))
        });
        let metrics = Arc::new(RegistryMetrics::default());
        if args.cache_scrub_rate > 0 {
            tokio::spawn(cache.clone().scrub(
                args.cache_scrub_rate,
                metrics.clone(),
                |m| vec![&m.cache_corrupt],
                |m| &m.cache_scrubbed_bytes,
            ));
        }
        let gate = args.retry.gate();
        let (m, g, c) = (metrics.clone(), gate.clone(), cache.clone());
        let tls = identity.stats().clone();
        let _metrics_http = args
            .metrics
            .serve(
                "qr registry-agent",
                vec![Page::metrics(move || {
                    let mut o = m.render();
                    c.prometheus("qr_registry", &mut o);
                    retry_gate(&mut o, &g);
                    o.push_str(&tls.render());
                    o
                })],
                vec![],
            )
            .await?;
        let access = Arc::new(Access::load(args.access_policy.as_deref())?);
        let upstream = matches!(source, Source::Upstream(_));
        let from = match &source {
            Source::Upstream(u) => format!("upstream {}", u.describe()),
            Source::Layout { dir, .. } => format!("layout {}", dir.display()),
        };
        let mut spool = Spool::new(Arc::new(source), cache, metrics.clone());
        // A layout directory is local: nothing to outlive.
        if upstream {
            let policy = ManifestPolicy {
                ttl: args.manifest_ttl,
                max_stale: args.manifest_max_stale,
                ..ManifestPolicy::default()
            };
            let dir = args.cache_dir.join("manifests");
            let manifests = ManifestCache::open(&dir, policy, metrics.clone())
                .with_context(|| format!("opening the manifest cache in {}", dir.display()))?;
            spool = spool.with_manifests(manifests);
        }
        let spool = Arc::new(spool);
        println!(
            "qr registry-agent: ready on {} ({}), ALPN {}, {from}; {}",
            args.fabric.provider,
            server.describe(),
            String::from_utf8_lossy(wire::ALPN),
            access.describe()
        );
        crate::notify::ready(&format!("serving on {}, {from}", args.fabric.provider));
        let serving = server::Serving {
            metrics,
            watcher: Some(server.watcher()),
            access,
            gate,
        };
        server::serve(server.endpoint.clone(), spool, serving).await;
        Ok(())
    })
}
