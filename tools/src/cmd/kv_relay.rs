//! `qr kv-relay upstream|downstream`: Redis replication across the fabric
//! (`crate::kv`, `crate::kv::redis`).
//!
//! - `upstream` is a replica of a real Redis master (`--master`) and the
//!   channel's master: it listens on the fabric (`--ip`, bootstrap on
//!   `--service-port`) for downstream relays, with mutual TLS.
//! - `downstream` dials the upstream relay (`--upstream HOST:PORT`) and is a
//!   master to real Redis replicas on TCP `--listen` (point `replicaof` there).
//! - Redis Cluster: `upstream --cluster HOST:PORT` finds the shards with
//!   `CLUSTER SHARDS` and follows each shard's master as its own dataset;
//!   `downstream --shard SLOTS=HOST:PORT` serves each shard's replicas on a
//!   listener of its own, all over the one connection (`crate::kv::datasets`).
//!
//! Both print progress every `--progress` (snapshot bytes, log head, each
//! replica's lag in bytes and seconds; one JSON object per line with
//! `--json`) and serve Prometheus metrics on `--metrics` (`/metrics`, and
//! `/status` as JSON). They run until killed; a failing link (to Redis, to a
//! replica, across the fabric) is logged, counted and re-established without
//! touching the others.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use quic_rdma::quinn_adapter::{Liveness, RetryGate};

use super::args::{parse_bytes, FabricArgs, ListenArgs, LivenessArgs, MetricsArgs, RetryArgs};
use crate::channel_endpoint::{self, ChannelClient, DialOptions};
use crate::endpoint_metrics::retry_gate;
use crate::http::Page;
use crate::identity::{Identity, TlsStats};
use crate::kv::redis::auth::{Credentials, ReplicaAuth};
use crate::kv::redis::cluster;
use crate::kv::redis::downstream::{self, Dialer, Upstream};
use crate::kv::redis::locate::{Locator, MasterSource};
use crate::kv::redis::upstream::{self, UpstreamConfig};
use crate::kv::{self, Datasets, Master, MasterConfig, Metrics};
use crate::listener::ListenerStats;
use crate::pki::MtlsArgs;
use crate::provider::{self};

/// Options of `qr kv-relay`.
#[derive(Debug, clap::Args)]
pub(crate) struct KvRelayArgs {
    #[command(subcommand)]
    side: Side,
}

#[derive(Debug, clap::Subcommand)]
enum Side {
    /// Replica of a real Redis master; serves downstream relays over the fabric.
    Upstream(UpstreamArgs),
    /// Dials an upstream relay; master to real Redis replicas on TCP.
    Downstream(DownstreamArgs),
}

/// Options both sides take.
#[derive(Debug, clap::Args)]
struct Common {
    /// Local IP on the fabric: the endpoint's GID (IPv4-mapped for IPv4).
    #[arg(long)]
    ip: IpAddr,
    #[command(flatten)]
    fabric: FabricArgs,
    /// Mutual TLS identity and CA.
    #[command(flatten)]
    mtls: MtlsArgs,
    /// `--metrics` (also JSON status on /status) and the limits of its listener.
    #[command(flatten)]
    metrics: MetricsArgs,
    /// Progress as one JSON status object per line on stdout.
    #[arg(long)]
    json: bool,
    /// Interval of progress lines ("off" for none).
    #[arg(long, default_value = "2s", value_parser = parse_interval)]
    progress: Interval,
    /// Liveness timers of the QUIC connection.
    #[command(flatten)]
    liveness: LivenessArgs,
}

#[derive(Clone, Copy, Debug)]
struct Interval(Option<Duration>);

fn parse_interval(s: &str) -> Result<Interval, String> {
    if s.eq_ignore_ascii_case("off") {
        return Ok(Interval(None));
    }
    humantime::parse_duration(s)
        .map(|d| Interval(Some(d)))
        .map_err(|e| format!("`{s}`: {e}"))
}

#[derive(Debug, clap::Args)]
#[command(arg(crate::config::option()))]
struct UpstreamArgs {
    #[command(flatten)]
    common: Common,
    /// The Redis master: HOST:PORT. Repeat it to name candidates: the relay
    /// follows whichever one `ROLE` says is the master, and after a failover
    /// the new one (the ACL user then needs `ROLE`).
    #[arg(
        long,
        value_name = "HOST:PORT",
        required_unless_present_any = ["sentinel", "cluster"]
    )]
    master: Vec<String>,
    /// A Redis Sentinel to ask where the master is (HOST:PORT; repeat for
    /// several), with --master-name: the relay follows Sentinel's failovers.
    #[arg(
        long,
        value_name = "HOST:PORT",
        conflicts_with = "master",
        requires = "master_name"
    )]
    sentinel: Vec<String>,
    /// A node of a Redis Cluster (>= 7.0) to ask for its shards (HOST:PORT;
    /// repeat for several): the relay follows every shard's master, each as
    /// a dataset named by its slot ranges (`CLUSTER SHARDS`, e.g. `0-5460`),
    /// through failovers inside a shard. Downstream relays pick shards with
    /// --shard. Slots moving between shards (resharding) are not followed:
    /// restart the relays after one.
    #[arg(long, value_name = "HOST:PORT", conflicts_with_all = ["master", "sentinel"])]
    cluster: Vec<String>,
    /// The name the Sentinels monitor the master under (`sentinel monitor NAME ...`).
    #[arg(long, value_name = "NAME", requires = "sentinel")]
    master_name: Option<String>,
    /// The Sentinels' password (their `requirepass`), if they have one.
    #[arg(long, env = "QR_KV_SENTINEL_PASSWORD", hide_env_values = true)]
    sentinel_password: Option<String>,
    /// File whose first line is the Sentinels' password (instead of
    /// QR_KV_SENTINEL_PASSWORD).
    #[arg(long, value_name = "FILE", conflicts_with = "sentinel_password")]
    sentinel_password_file: Option<PathBuf>,
    /// ACL user to authenticate to the master as (with --master-password).
    #[arg(long)]
    master_user: Option<String>,
    /// The master's password (its `requirepass`, a replica's `masterauth`).
    #[arg(long, env = "QR_KV_MASTER_PASSWORD", hide_env_values = true)]
    master_password: Option<String>,
    /// File whose first line is the master's password (instead of
    /// QR_KV_MASTER_PASSWORD).
    #[arg(long, value_name = "FILE", conflicts_with = "master_password")]
    master_password_file: Option<PathBuf>,
    /// Port announced to the master (`REPLCONF listening-port`), shown as
    /// this relay's `port=` in the master's INFO replication and ROLE.
    /// Default: the --metrics port (where /status describes the relay), else
    /// --service-port; this relay serves no Redis commands itself.
    #[arg(long, alias = "listening-port", value_name = "PORT")]
    announce_port: Option<u16>,
    /// Address announced to the master (`REPLCONF ip-address`, like Redis's
    /// `replica-announce-ip`): shown as this relay's `ip=` instead of the
    /// address the master sees the connection come from (behind NAT, say).
    #[arg(long, value_name = "IP")]
    announce_ip: Option<String>,
    /// TCP port of the bootstrap service on --ip.
    #[arg(long)]
    service_port: u16,
    /// Directory for snapshot files (as large as the dataset) and the resume
    /// state (`state`: replication id and offset, so a restarted relay resumes).
    #[arg(long)]
    dir: PathBuf,
    /// Backlog for partial resync (bytes; K, M, G suffixes).
    #[arg(long, default_value = "64M", value_parser = parse_bytes)]
    backlog: u64,
    /// Credit window per stream: bytes sent ahead of a replica's acks.
    #[arg(long, default_value = "16M", value_parser = parse_bytes)]
    window: u64,
    /// When downstream relays' connection attempts get a Retry (address
    /// validation).
    #[command(flatten)]
    retry: RetryArgs,
}

/// A password from its `--*-password-file` (first line), else its option
/// or environment variable.
fn password(value: &Option<String>, file: &Option<PathBuf>, what: &str) -> Result<Option<String>> {
    match file {
        Some(f) => crate::secret::read_first_line(f, what).map(Some),
        None => Ok(value.clone()),
    }
}

#[derive(Debug, clap::Args)]
#[command(arg(crate::config::option()))]
struct DownstreamArgs {
    #[command(flatten)]
    common: Common,
    /// The upstream relay's bootstrap service: HOST:PORT.
    #[arg(long)]
    upstream: String,
    /// Name the upstream's certificate must carry (default: HOST of --upstream).
    #[arg(long)]
    server_name: Option<String>,
    /// Where real Redis replicas connect (their `replicaof HOST PORT`).
    #[arg(long, required_unless_present = "shard", conflicts_with = "shard")]
    listen: Option<SocketAddr>,
    /// For an upstream relay following a Redis Cluster (--cluster): where
    /// the replicas of one shard connect, as SLOTS=HOST:PORT with the
    /// shard's slot ranges as the upstream names them (`0-5460=127.0.0.1:7100`;
    /// several ranges comma-separated). Repeat it per shard: every shard
    /// travels on the one connection to the upstream relay. The replicas
    /// are plain (non-cluster) Redis servers.
    #[arg(long, value_name = "SLOTS=HOST:PORT", value_parser = parse_shard)]
    shard: Vec<(String, SocketAddr)>,
    /// File whose first line is the password replicas must send (their
    /// `masterauth`); or set it in the environment as QR_KV_REPLICA_PASSWORD.
    #[arg(long, value_name = "FILE")]
    replica_password_file: Option<PathBuf>,
    /// ACL user replicas authenticate as (their `masteruser`; default
    /// "default", i.e. `AUTH password`).
    #[arg(long)]
    replica_user: Option<String>,
    /// Serve replicas on a non-loopback --listen without a password: anyone
    /// who reaches it can read the whole dataset.
    #[arg(long)]
    allow_unauthenticated_replicas: bool,
}

/// `SLOTS=HOST:PORT` of `--shard`.
fn parse_shard(s: &str) -> Result<(String, SocketAddr), String> {
    let (slots, addr) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}`: expected SLOTS=HOST:PORT, e.g. 0-5460=127.0.0.1:7100"))?;
    if !kv::redis::cluster::valid_name(slots) {
        return Err(format!(
            "`{slots}`: expected slot ranges START-END (0..16383), comma-separated, as the \
             upstream relay names the shard, e.g. 0-5460"
        ));
    }
    let addr = addr
        .parse()
        .map_err(|e| format!("`{addr}`: {e} (expected IP:PORT)"))?;
    Ok((slots.to_string(), addr))
}

/// The addresses replicas connect to: `--listen`, or each `--shard`'s,
/// with the shard's name.
fn listeners(a: &DownstreamArgs) -> Vec<(Option<String>, SocketAddr)> {
    match a.listen {
        Some(l) => vec![(None, l)],
        None => a.shard.iter().map(|(n, l)| (Some(n.clone()), *l)).collect(),
    }
}

/// The environment variable that may hold the replicas' password.
const PASSWORD_ENV: &str = "QR_KV_REPLICA_PASSWORD";

/// What replicas must present, from --replica-password-file or the
/// environment; refuses an open relay on a non-loopback address.
fn replica_auth(a: &DownstreamArgs) -> Result<Option<Arc<ReplicaAuth>>> {
    let password = match (&a.replica_password_file, std::env::var(PASSWORD_ENV)) {
        (Some(f), _) => Some(crate::secret::read_first_line(
            f,
            "--replica-password-file",
        )?),
        (None, Ok(p)) if !p.is_empty() => Some(p),
        _ => None,
    };
    match password {
        Some(p) => Ok(Some(Arc::new(ReplicaAuth::new(a.replica_user.clone(), p)))),
        None if a.replica_user.is_some() => {
            bail!("--replica-user needs a password: --replica-password-file or {PASSWORD_ENV}")
        }
        None if !a.allow_unauthenticated_replicas => {
            if let Some((_, l)) = listeners(a)
                .into_iter()
                .find(|(_, l)| !l.ip().is_loopback())
            {
                bail!(
                    "replicas' address {l} is not loopback and replicas need no password: \
                     anyone who reaches it could read the whole dataset. Give \
                     --replica-password-file (the replicas' masterauth), or \
                     --allow-unauthenticated-replicas if this is intended"
                )
            }
            Ok(None)
        }
        None => Ok(None),
    }
}

/// Run `qr kv-relay`: runs until killed; exit 1 if it cannot start, 2 for
/// unusable options.
pub(crate) fn main(args: &KvRelayArgs) -> ExitCode {
    let common = match &args.side {
        Side::Upstream(a) => &a.common,
        Side::Downstream(a) => &a.common,
    };
    if let Err(e) = provider::ensure_built_in(common.fabric.provider) {
        eprintln!("qr kv-relay: {e}");
        return ExitCode::from(2);
    }
    super::run_on_runtime("kv-relay", async {
        match &args.side {
            Side::Upstream(a) => run_upstream(a).await,
            Side::Downstream(a) => run_downstream(a).await,
        }
    })
}

/// Metrics endpoint and progress printer, common to both sides.
///
/// `resp`: the counters of the Redis port's listener, on the downstream side;
/// `gate`: the fabric server's, on the upstream side.
///
/// `shards`: each Redis Cluster shard's own counters, besides `metrics`
/// (empty for a single master: the pages are as they always were).
async fn observe(
    common: &Common,
    metrics: Arc<Metrics>,
    shards: Vec<(String, Arc<Metrics>)>,
    role: &'static str,
    resp: Vec<Arc<ListenerStats>>,
    gate: Option<RetryGate>,
    tls: Arc<TlsStats>,
) -> Result<()> {
    let (m, s) = (metrics.clone(), metrics.clone());
    let shards = Arc::new(shards);
    let (ms, ss, progress_shards) = (shards.clone(), shards.clone(), shards);
    let task = common
        .metrics
        .serve(
            &format!("qr kv-relay {role}"),
            vec![
                Page::metrics(move || {
                    let mut o = if ms.is_empty() {
                        m.prometheus(role)
                    } else {
                        m.prometheus_shards(role, &ms)
                    };
                    if let Some(g) = &gate {
                        retry_gate(&mut o, g);
                    }
                    o.push_str(&tls.render());
                    o
                }),
                Page::status(move || {
                    if ss.is_empty() {
                        s.status(role).to_string()
                    } else {
                        s.status_shards(role, &ss).to_string()
                    }
                }),
            ],
            resp,
        )
        .await?;
    // A dropped JoinHandle detaches its task: it serves for the process's life.
    drop(task);
    if let Some(every) = common.progress.0 {
        let json = common.json;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.tick().await;
            loop {
                tick.tick().await;
                if json && progress_shards.is_empty() {
                    println!("{}", metrics.status(role));
                } else if json {
                    println!("{}", metrics.status_shards(role, &progress_shards));
                } else if progress_shards.is_empty() {
                    tracing::info!(target: "qr::kv", role, "{}", progress_line(&metrics));
                } else {
                    for (name, m) in progress_shards.iter() {
                        tracing::info!(target: "qr::kv", role, "shard {name}: {}", progress_line(m));
                    }
                }
            }
        });
    }
    Ok(())
}

fn progress_line(m: &Metrics) -> String {
    use std::sync::atomic::Ordering::Relaxed;
    let mut s = format!(
        "snapshot in {} B out {} B, log {} B, head {}, backlog {} B, \
         syncs full {} partial {}",
        m.snapshot_source_bytes.load(Relaxed),
        m.snapshot_bytes.load(Relaxed),
        m.log_bytes.load(Relaxed),
        m.head.load(Relaxed),
        m.backlog_bytes.load(Relaxed),
        m.sync_full.load(Relaxed),
        m.sync_partial_ok.load(Relaxed),
    );
    for (id, r) in m.replicas() {
        s.push_str(&format!(
            "; replica {id}: lag {} B {:.3} s",
            r.lag_bytes, r.lag_seconds
        ));
    }
    s
}

/// The port the upstream relay announces to the master: `--announce-port`,
/// else a TCP port of this relay that exists (`--metrics`, else the
/// bootstrap service) — never a made-up 6379.
fn announce_port(a: &UpstreamArgs) -> u16 {
    a.announce_port
        .or_else(|| {
            a.common
                .metrics
                .metrics
                .map(|m| m.port())
                .filter(|&p| p != 0)
        })
        .unwrap_or(a.service_port)
}

async fn run_upstream(a: &UpstreamArgs) -> Result<()> {
    let c = &a.common;
    let identity = Identity::load(&c.mtls)?;
    let liveness: Liveness = c.liveness.liveness()?;
    std::fs::create_dir_all(&a.dir).with_context(|| format!("creating {}", a.dir.display()))?;
    let master_auth = Credentials {
        user: a.master_user.clone(),
        password: password(
            &a.master_password,
            &a.master_password_file,
            "--master-password-file",
        )?,
    };
    let sentinel_auth = Credentials {
        user: None,
        password: password(
            &a.sentinel_password,
            &a.sentinel_password_file,
            "--sentinel-password-file",
        )?,
    };
    // What is followed: one dataset (a master), or one per cluster shard,
    // each with its own directory, master and counters.
    let datasets: Vec<(Option<String>, MasterSource, PathBuf)> = if a.cluster.is_empty() {
        let source = match &a.master_name {
            Some(name) => MasterSource::Sentinel {
                sentinels: a.sentinel.clone(),
                name: name.clone(),
            },
            None => MasterSource::Candidates(a.master.clone()),
        };
        vec![(None, source, a.dir.clone())]
    } else {
        let shards = cluster::discover(&a.cluster, &master_auth)
            .await
            .with_context(|| {
                format!(
                    "finding the shards of the Redis Cluster at {} (--cluster)",
                    a.cluster.join(", ")
                )
            })?;
        // Ask the seeds first, then every node the cluster listed: a
        // failover leaves some node to answer.
        let mut nodes = a.cluster.clone();
        for n in shards.iter().flat_map(|s| &s.nodes) {
            if !nodes.contains(&n.addr) {
                nodes.push(n.addr.clone());
            }
        }
        shards
            .iter()
            .map(|s| {
                let name = s.name();
                let dir = a.dir.join(format!("shard-{}", name.replace(',', "_")));
                let source = MasterSource::ClusterShard {
                    nodes: nodes.clone(),
                    slots: name.clone(),
                };
                (Some(name), source, dir)
            })
            .collect()
    };
    let metrics = Arc::new(Metrics::default());
    let mut shard_metrics = Vec::new();
    let mut masters = Vec::new();
    for (name, source, dir) in datasets {
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        kv::snapshot::remove_stale(&dir);
        let m = match &name {
            Some(n) => {
                let m = Arc::new(Metrics::default());
                shard_metrics.push((n.clone(), m.clone()));
                m
            }
            None => metrics.clone(),
        };
        let mut cfg = MasterConfig::new(dir.clone());
        cfg.backlog = a.backlog;
        cfg.window = a.window;
        // A restarted relay serves the snapshot it kept (kv::snapshot).
        cfg.keep = kv::snapshot::Keep::Latest;
        let locator = Arc::new(Locator::new(
            source,
            master_auth.clone(),
            sentinel_auth.clone(),
        ));
        masters.push((name, Master::new(cfg, m), locator, dir));
    }
    let (ip, service_port) = (c.ip, a.service_port);
    let lo = ListenArgs { ip, service_port }.options(c.fabric, liveness);
    let listening = Arc::new(channel_endpoint::listen(
        &lo,
        &identity.current().server_settings(kv::ALPN),
    )?);
    let rotated = listening.clone();
    identity.reload_on_hangup("qr kv-relay upstream", move |m| {
        rotated.set_tls(&m.server_settings(kv::ALPN))
    });
    let gate = a.retry.gate();
    let tls = identity.stats().clone();
    observe(
        c,
        metrics.clone(),
        shard_metrics,
        "upstream",
        Vec::new(),
        Some(gate.clone()),
        tls,
    )
    .await?;
    for (name, _, locator, _) in &masters {
        let shard = name
            .as_ref()
            .map(|n| format!(" (shard {n})"))
            .unwrap_or_default();
        tracing::info!(
            target: "qr::kv",
            role = "upstream",
            "following Redis {}{shard}; serving downstream relays: {}",
            locator.source(),
            listening.describe()
        );
    }
    crate::notify::ready("following the Redis master");
    for (_, master, locator, dir) in &masters {
        let up = UpstreamConfig {
            master: locator.clone(),
            announce_port: announce_port(a),
            announce_ip: a.announce_ip.clone(),
            ack_interval: Duration::from_secs(1),
            state: Some(dir.join("state")),
        };
        tokio::spawn(upstream::run(up, master.clone()));
    }
    // One master serves its sessions itself; shards are picked per session.
    let serve: Served = match masters.as_slice() {
        [(None, m, _, _)] => Served::One(m.clone()),
        _ => Served::Shards(Datasets::new(
            masters
                .iter()
                .filter_map(|(n, m, _, _)| Some((n.clone()?, m.clone())))
                .collect(),
            metrics.clone(),
        )),
    };
    let endpoint = listening.endpoint.clone();
    let watcher = listening.watcher();
    let accept = async {
        while let Some(attempt) = gate.accept(&endpoint).await {
            let (serve, watcher, metrics) = (serve.clone(), watcher.clone(), metrics.clone());
            tokio::spawn(async move {
                match attempt.await {
                    Ok(conn) => {
                        watcher.watch(&conn);
                        let peer = conn.remote_address();
                        let r = match &serve {
                            Served::One(m) => m.serve(conn).await,
                            Served::Shards(d) => d.serve(conn).await,
                        };
                        if let Err(e) = r {
                            tracing::warn!(
                                target: "qr::kv",
                                role = "upstream",
                                peer = %peer,
                                "downstream {peer}: {e}"
                            );
                        }
                    }
                    Err(e) => {
                        metrics
                            .link_errors
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        tracing::warn!(target: "qr::kv", role = "upstream", "handshake: {e}");
                    }
                }
            });
        }
    };
    tokio::select! {
        () = accept => {}
        sig = crate::shutdown::requested() => {
            tracing::info!(
                target: "qr::kv",
                role = "upstream",
                "{sig}: closing the downstream relays' links"
            );
            crate::shutdown::close(&endpoint).await;
        }
    }
    drop(listening);
    Ok(())
}

/// What the upstream relay serves on each connection.
#[derive(Clone)]
enum Served {
    /// One master's sessions.
    One(Master),
    /// Cluster shards, each session naming its own.
    Shards(Datasets),
}

async fn run_downstream(a: &DownstreamArgs) -> Result<()> {
    let c = &a.common;
    let auth = replica_auth(a)?;
    let identity = Identity::load(&c.mtls)?;
    // Each dial presents the identity in use then: a rotated certificate
    // (SIGHUP) is used from the next reconnect on.
    identity.reload_on_hangup("qr kv-relay downstream", |_| {
        Ok::<(), std::convert::Infallible>(())
    });
    let liveness = c.liveness.liveness()?;
    let server_name = match &a.server_name {
        Some(n) => n.clone(),
        None => a
            .upstream
            .rsplit_once(':')
            .map(|(h, _)| h.trim_start_matches('[').trim_end_matches(']').to_string())
            .with_context(|| format!("`{}` is not HOST:PORT", a.upstream))?,
    };
    let metrics = Arc::new(Metrics::default());
    // Per listener: the shard it serves (None: the one master), the socket,
    // its counters, and the metrics its replicas' sessions update.
    let mut served = Vec::new();
    for (shard, addr) in listeners(a) {
        let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| {
            let of = shard
                .as_deref()
                .map(|n| format!(" of shard {n}"))
                .unwrap_or_default();
            format!("listening for replicas{of} on TCP {addr}")
        })?;
        let (label, m): (&'static str, _) = match &shard {
            None => ("resp", metrics.clone()),
            // A handful per process, made once: the label lives as long.
            Some(n) => (
                Box::leak(format!("resp {n}").into_boxed_str()),
                Arc::new(Metrics::default()),
            ),
        };
        served.push((
            shard,
            addr,
            listener,
            Arc::new(ListenerStats::new(label)),
            m,
        ));
    }
    let shard_metrics = served
        .iter()
        .filter_map(|(n, _, _, _, m)| Some((n.clone()?, m.clone())))
        .collect();
    let tls = identity.stats().clone();
    observe(
        c,
        metrics.clone(),
        shard_metrics,
        "downstream",
        served.iter().map(|s| s.3.clone()).collect(),
        None,
        tls,
    )
    .await?;
    // One client endpoint for the relay's life: the first dial opens it,
    // later ones reconnect on it (its RoCEv2 port stays ours).
    let client: Arc<tokio::sync::Mutex<Option<ChannelClient>>> = Arc::default();
    let client_at_exit = client.clone();
    let mut opts = DialOptions::new();
    opts.provider = c.fabric.provider;
    opts.ip = Some(c.ip);
    opts.udp_port = c.fabric.udp_port;
    opts.liveness = liveness;
    let service = a.upstream.clone();
    let dial: Dialer = Arc::new(move || {
        let (client, identity, service, server_name, opts) = (
            client.clone(),
            identity.clone(),
            service.clone(),
            server_name.clone(),
            opts.clone(),
        );
        Box::pin(async move {
            let cfg = identity
                .current()
                .client_config(kv::ALPN)
                .map_err(|e| format!("{e:#}"))?;
            let mut cur = client.lock().await;
            let r = match cur.as_ref() {
                Some(cl) => cl.connect(&service, cfg, &server_name).await,
                None => match channel_endpoint::dial(&service, &opts, cfg, &server_name).await {
                    Ok((cl, conn)) => {
                        *cur = Some(cl);
                        Ok(conn)
                    }
                    Err(e) => Err(e),
                },
            };
            r.map_err(|e| format!("{e:#}"))
        })
    });
    // One connection for every shard: each replica's session names its own.
    let upstream = Arc::new(Upstream::new(dial, metrics.clone()));
    let mut serving = tokio::task::JoinSet::new();
    for (shard, addr, listener, resp, m) in served {
        let of = shard
            .as_deref()
            .map(|n| format!(" of shard {n}"))
            .unwrap_or_default();
        tracing::info!(
            target: "qr::kv",
            role = "downstream",
            "replicas{of} connect to {addr}; upstream relay {}",
            a.upstream
        );
        serving.spawn(downstream::serve(
            listener,
            c.metrics.tcp.limits(),
            resp,
            auth.clone(),
            upstream.clone(),
            m,
            shard.map(Arc::from),
        ));
    }
    crate::notify::ready("serving replicas");
    // The listeners serve until the process ends.
    let serve = async { while serving.join_next().await.is_some() {} };
    tokio::select! {
        () = serve => {}
        sig = crate::shutdown::requested() => {
            tracing::info!(
                target: "qr::kv",
                role = "downstream",
                "{sig}: closing the link to the upstream relay"
            );
            if let Some(cl) = client_at_exit.lock().await.as_ref() {
                crate::shutdown::close(cl.endpoint()).await;
            }
        }
    }
    Ok(())
}
