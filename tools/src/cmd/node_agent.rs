//! `qr node-agent`: the OCI distribution pull API on local HTTP, fetching
//! from a `qr registry-agent` over the fabric.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};

use super::args::{parse_bytes, FabricArgs, ListenArgs, LivenessArgs, RetryArgs, TcpLimitsArgs};
use crate::access::Access;
use crate::channel_endpoint::{listen, ChannelServer, DialOptions};
use crate::identity::Identity;
use crate::image::cache::Cache;
use crate::image::client::FabricClient;
use crate::image::fabric::FabricDialer;
use crate::image::metrics::NodeMetrics;
use crate::image::node::Node;
use crate::image::peer::{Peer, PEER_WAIT};
use crate::image::server::{self, Store};
use crate::image::transfer::TransferOptions;
use crate::image::upstream::Upstream;
use crate::image::{http, wire};
use crate::pki::MtlsArgs;

/// What `qr node-agent` and `qr pull` share: the registry agent to fetch
/// from, the fabric endpoint that dials it, the verified blob cache and how
/// blobs are chunked, declared once.
#[derive(Clone, Debug, clap::Args)]
pub(crate) struct NodeStoreArgs {
    /// The registry agent's bootstrap service: HOST:PORT.
    #[arg(long)]
    registry: String,

    /// Name the registry agent's certificate must be valid for. Default: HOST
    /// of --registry.
    #[arg(long)]
    server_name: Option<String>,

    #[command(flatten)]
    pub(crate) fabric: FabricArgs,

    /// Local IP on the fabric (our GID). Default: the address routed towards
    /// the registry agent.
    #[arg(long)]
    pub(crate) ip: Option<IpAddr>,

    /// Directory of the verified blob cache (a node agent's and `qr pull`'s
    /// may be the same).
    #[arg(long)]
    cache_dir: PathBuf,

    /// Size bound of the cache (least recently used blobs go first).
    #[arg(long, default_value = "10G", value_parser = parse_bytes)]
    cache_size: u64,

    /// Chunk requests in flight per blob.
    #[arg(long, default_value_t = 8)]
    parallel: usize,

    /// First chunk size; adapted to the measured RTT and throughput within
    /// 128K..4M unless --fixed-chunk.
    #[arg(long, default_value = "1M", value_parser = parse_bytes)]
    chunk_size: u64,

    /// Keep --chunk-size fixed.
    #[arg(long)]
    fixed_chunk: bool,

    /// Certificate, key and CA (PEM) of mutual TLS with the registry agent
    /// (and a node agent's peers).
    #[command(flatten)]
    pub(crate) tls: MtlsArgs,

    /// Liveness timers of the QUIC connection.
    #[command(flatten)]
    pub(crate) liveness: LivenessArgs,
}

impl NodeStoreArgs {
    /// The registry agent's bootstrap service, as given.
    pub(crate) fn registry(&self) -> &str {
        &self.registry
    }

    /// Check the provider is built in and open the cache.
    pub(crate) fn open_cache(&self) -> Result<Arc<Cache>> {
        crate::provider::ensure_built_in(self.fabric.provider)?;
        Ok(Cache::open(&self.cache_dir, self.cache_size)?)
    }

    /// `base` with the chunking options set.
    pub(crate) fn transfer(&self, base: TransferOptions) -> TransferOptions {
        TransferOptions {
            parallel: self.parallel.max(1),
            chunk: self.chunk_size,
            fixed_chunk: self.fixed_chunk,
            ..base
        }
    }
}

/// Options of `qr node-agent`.
#[derive(Clone, Debug, clap::Args)]
#[command(arg(crate::config::option()))]
pub(crate) struct NodeAgentArgs {
    #[command(flatten)]
    store: NodeStoreArgs,

    /// HTTP address of the pull API (loopback by default: the hop to the
    /// container runtime is plain HTTP).
    #[arg(long, default_value = "127.0.0.1:5000")]
    listen: SocketAddr,

    /// Limits of the pull API's listener.
    #[command(flatten)]
    tcp: TcpLimitsArgs,

    /// Bytes a second the cache scrub reads, hashing every cached blob again
    /// pass after pass (a corrupt copy is quarantined and fetched afresh);
    /// 0 turns it off.
    #[arg(long, default_value = "16M", value_parser = parse_bytes)]
    cache_scrub_rate: u64,

    /// Fail a blob after this many seconds without progress (redials included).
    #[arg(long, default_value_t = 30)]
    stall_timeout: u64,

    /// The upstream registry (http://HOST:PORT) for blobs under
    /// --direct-threshold: fetched straight over HTTP, not over the fabric.
    #[arg(long, requires = "direct_threshold")]
    direct_upstream: Option<String>,

    /// Size under which a blob goes to --direct-upstream (e.g. 64K).
    #[arg(long, value_parser = parse_bytes, requires = "direct_upstream")]
    direct_threshold: Option<u64>,

    /// A peer node agent's peer service (HOST:PORT, its --serve-peers port):
    /// blobs it has are fetched from it, the registry agent being the
    /// fallback. Repeatable; asked in order.
    #[arg(long = "peer")]
    peers: Vec<String>,

    /// Name the peers' certificates must be valid for. Default: HOST of each --peer.
    #[arg(long)]
    peer_server_name: Option<String>,

    /// Serve this node agent's verified cache to peer node agents: TCP port
    /// of the bootstrap service they dial (on --ip), over the fabric with the
    /// same mutual TLS.
    #[arg(long, requires = "ip")]
    serve_peers: Option<u16>,

    /// UDP port of the peer service's RoCEv2 socket (`soft`: not the fabric
    /// client's 4791, which this node agent already holds).
    #[arg(long, default_value_t = 4792)]
    peer_udp_port: u16,

    /// A JSON file granting peer certificates the channel and repositories
    /// they may fetch from --serve-peers (see SECURITY.md, "Authorization").
    /// Without it every certificate from the CA may (each blob still only
    /// under a repository the registry agent confirmed for this node).
    #[arg(long, requires = "serve_peers")]
    access_policy: Option<PathBuf>,

    /// When peers' connection attempts on --serve-peers get a Retry (address
    /// validation).
    #[command(flatten)]
    retry: RetryArgs,
}

/// Run `qr node-agent` until killed; 1 if it cannot start.
pub(crate) fn main(args: &NodeAgentArgs) -> ExitCode {
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("qr node-agent: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// HOST of HOST:PORT, without IPv6 brackets.
pub(crate) fn host_of(service: &str) -> Result<String> {
    let (host, _) = service
        .rsplit_once(':')
        .with_context(|| format!("`{service}` is not HOST:PORT"))?;
    Ok(host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string())
}

/// The node store of a node agent or `qr pull`, dialling lazily: the
/// registry agent of `store`, and `peers` (verified for `peer_server_name`,
/// by default each one's HOST) asked before it.
pub(crate) fn node(
    store: &NodeStoreArgs,
    tls: &Arc<Identity>,
    cache: Arc<Cache>,
    transfer: TransferOptions,
    peers: &[String],
    peer_server_name: Option<&str>,
) -> Result<Arc<Node>> {
    let mut opts = DialOptions::new();
    opts.provider = store.fabric.provider;
    opts.ip = store.ip;
    opts.udp_port = store.fabric.udp_port;
    opts.liveness = store.liveness.liveness()?;
    let name = match &store.server_name {
        Some(n) => n.clone(),
        None => host_of(&store.registry)?,
    };
    let dialer = FabricDialer::new(&store.registry, &name, opts, tls.clone());
    let mut ps = Vec::new();
    for p in peers {
        let name = match peer_server_name {
            Some(n) => n.to_string(),
            None => host_of(p).context("--peer")?,
        };
        let d = dialer.sharing(p, &name, PEER_WAIT);
        ps.push(Peer::new(p, FabricClient::new(Box::new(d))));
    }
    let node = Node::new(
        FabricClient::new(Box::new(dialer)),
        cache,
        Arc::new(NodeMetrics::default()),
        transfer,
    );
    if !ps.is_empty() {
        node.set_peers(ps);
    }
    Ok(node)
}

/// The peer service: this node agent's verified cache over the fabric.
fn serve_peers(
    args: &NodeAgentArgs,
    identity: &Identity,
    ip: IpAddr,
    port: u16,
    node: &Arc<Node>,
) -> Result<Arc<ChannelServer>> {
    let tls = identity.current().server_settings(wire::ALPN);
    let fabric = FabricArgs {
        udp_port: args.peer_udp_port,
        ..args.store.fabric
    };
    let listen_at = ListenArgs {
        ip,
        service_port: port,
    };
    let opts = listen_at.options(fabric, args.store.liveness.liveness()?);
    let server = Arc::new(listen(&opts, &tls).context("--serve-peers")?);
    println!(
        "qr node-agent: serving peers on {} ({})",
        args.store.fabric.provider,
        server.describe()
    );
    let gate = args.retry.gate();
    let _ = node.metrics.peer_retry.set(gate.clone());
    let serving = server::Serving {
        metrics: node.metrics.peer_server.clone(),
        watcher: Some(server.watcher()),
        access: Arc::new(Access::load(args.access_policy.as_deref())?),
        gate,
    };
    tokio::spawn(server::serve_store(
        server.endpoint.clone(),
        Store::Peer(node.clone()),
        serving,
    ));
    Ok(server)
}

fn run(args: &NodeAgentArgs) -> Result<()> {
    let cache = args.store.open_cache()?;
    let transfer = args.store.transfer(TransferOptions {
        stall_timeout: Duration::from_secs(args.stall_timeout),
        resume: true,
        ..TransferOptions::default()
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let identity = Identity::load(&args.store.tls)?;
    rt.block_on(async {
        let node = node(
            &args.store,
            &identity,
            cache.clone(),
            transfer,
            &args.peers,
            args.peer_server_name.as_deref(),
        )?;
        // Kept for the process's life: dropping it stops the bootstrap service.
        let peer_service = match (args.serve_peers, args.store.ip) {
            (Some(port), Some(ip)) => Some(serve_peers(args, &identity, ip, port, &node)?),
            _ => None,
        };
        // Kept for the process's life: dropping it stops the bootstrap service.
        let _peer_service = peer_service.clone();
        let _ = node.metrics.tls.set(identity.stats().clone());
        // Dials read the current identity; the peer service gets the new
        // one installed.
        identity.reload_on_hangup("qr node-agent", move |m| match &peer_service {
            Some(server) => server.set_tls(&m.server_settings(wire::ALPN)),
            None => Ok(()),
        });
        if let (Some(u), Some(t)) = (&args.direct_upstream, args.direct_threshold) {
            node.set_direct(Arc::new(Upstream::new(u)?), t);
        }
        if args.cache_scrub_rate > 0 {
            tokio::spawn(cache.clone().scrub(
                args.cache_scrub_rate,
                node.metrics.clone(),
                |m| vec![&m.cache_corrupt, &m.verify_failures],
                |m| &m.cache_scrubbed_bytes,
            ));
        }
        // Connect now, so a wrong certificate or an unreachable agent shows at
        // start; a registry agent not up yet is retried per request later.
        if let Err(e) = node.client.connection().await {
            tracing::warn!(
                target: "qr::image",
                "node agent: {e} (retrying on each request)"
            );
        }
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("--listen {}: is the port taken?", args.listen))?;
        println!(
            "qr node-agent: ready on http://{} (registry agent {})",
            args.listen,
            args.store.registry()
        );
        crate::notify::ready(&format!("serving http://{}", args.listen));
        http::serve(listener, args.tcp.limits(), node).await;
        Ok(())
    })
}
