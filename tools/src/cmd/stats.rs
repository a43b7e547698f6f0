//! `qr stats ADDR`: a live view of any `qr` metrics endpoint (`qr serve
//! --metrics`, `qr gateway --metrics`, the channels' agents): polls
//! http://ADDR/metrics every interval, checks it is valid Prometheus text
//! (`crate::prom_text`) and prints each counter's rate over the interval and
//! each gauge's value — `top` for an endpoint.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::prom_text::{self, Exposition};

/// Options of `qr stats`.
#[derive(Clone, Debug, clap::Args)]
pub(crate) struct StatsArgs {
    /// The metrics endpoint, HOST:PORT (its `/metrics` is polled).
    addr: String,

    /// Time between polls (e.g. 1s, 250ms).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    interval: Duration,

    /// Stop after this many intervals (0: run until interrupted).
    #[arg(long, default_value_t = 0)]
    count: u64,

    /// Only series whose name contains this.
    #[arg(long)]
    filter: Option<String>,

    /// Show series that did not change too.
    #[arg(long)]
    all: bool,

    /// Send `Authorization: Bearer TOKEN`, TOKEN being this file's first
    /// line (for an endpoint started with --metrics-token-file).
    #[arg(long, value_name = "FILE")]
    token_file: Option<std::path::PathBuf>,

    /// One JSON object per interval (`{"elapsed_s", "rates", "gauges"}`) instead of a table.
    #[arg(long)]
    json: bool,
}

/// Run `qr stats`: 0 after --count intervals; 1 when the endpoint fails or
/// answers something that is not Prometheus text.
pub(crate) fn main(args: &StatsArgs) -> ExitCode {
    super::run_on_runtime("stats", run(args))
}

/// One GET of http://addr/metrics, its body.
async fn scrape(client: &reqwest::Client, addr: &str, token: Option<&str>) -> Result<String> {
    let url = format!("http://{addr}/metrics");
    let mut req = client.get(&url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req
        .send()
        .await
        .with_context(|| format!("GET {url} (is the endpoint running with --metrics {addr}?)"))?;
    let status = resp.status();
    if !status.is_success() {
        bail!("{url} answered `{status}`");
    }
    resp.text().await.with_context(|| format!("reading {url}"))
}

async fn poll(
    client: &reqwest::Client,
    args: &StatsArgs,
    token: Option<&str>,
) -> Result<Exposition> {
    let text = scrape(client, &args.addr, token).await?;
    prom_text::parse(&text)
        .with_context(|| format!("{}/metrics is not valid Prometheus text", args.addr))
}

async fn run(args: &StatsArgs) -> Result<()> {
    if args.interval.is_zero() {
        bail!("--interval 0 would poll in a busy loop: give e.g. 1s or 250ms");
    }
    if args.addr.contains('/') {
        bail!("`{}` is not HOST:PORT (`/metrics` is added)", args.addr);
    }
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .context("building the HTTP client")?;
    let token = args
        .token_file
        .as_deref()
        .map(|f| crate::secret::read_first_line(f, "--token-file"))
        .transpose()?;
    let started = Instant::now();
    let mut prev = poll(&client, args, token.as_deref()).await?;
    let mut prev_at = Instant::now();
    let mut n = 0;
    while args.count == 0 || n < args.count {
        tokio::time::sleep(args.interval.saturating_sub(prev_at.elapsed())).await;
        let now = poll(&client, args, token.as_deref()).await?;
        let at = Instant::now();
        let secs = at.duration_since(prev_at).as_secs_f64();
        let old: BTreeMap<String, f64> = prev.samples.iter().map(|s| (s.key(), s.value)).collect();
        let mut rates = BTreeMap::new();
        let mut gauges = BTreeMap::new();
        for s in &now.samples {
            if args
                .filter
                .as_ref()
                .is_some_and(|f| !s.name.contains(f.as_str()))
            {
                continue;
            }
            let before = old.get(&s.key()).copied();
            match now.type_of(&s.name) {
                Some("counter") => {
                    let rate = (s.value - before.unwrap_or(0.0)) / secs;
                    if args.all || rate != 0.0 {
                        rates.insert(s.key(), rate);
                    }
                }
                _ => {
                    if args.all || before != Some(s.value) {
                        gauges.insert(s.key(), s.value);
                    }
                }
            }
        }
        let elapsed = at.duration_since(started).as_secs_f64();
        if args.json {
            println!(
                "{}",
                serde_json::json!({"elapsed_s": elapsed, "interval_s": secs, "rates": rates, "gauges": gauges})
            );
        } else {
            println!("-- {} at {elapsed:.1}s (rates over {secs:.2}s)", args.addr);
            for (k, v) in &rates {
                println!("  {k:<60} {v:>14.1}/s");
            }
            for (k, v) in &gauges {
                println!("  {k:<60} {v:>14}");
            }
            if rates.is_empty() && gauges.is_empty() {
                println!("  (nothing changed)");
            }
        }
        let _ = std::io::stdout().flush();
        prev = now;
        prev_at = at;
        n += 1;
    }
    Ok(())
}
