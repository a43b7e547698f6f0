//! `qr stats ADDR`: a live view of any `qr` metrics endpoint (`qr serve
//! --metrics`, `qr gateway --metrics`, the channels' agents): polls
//! http://ADDR/metrics every interval, checks it is valid Prometheus text
//! (`crate::prom_text`) and prints each counter's rate over the interval and
//! each gauge's value — `top` for an endpoint.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

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

    /// One JSON object per interval (`{"elapsed_s", "rates", "gauges"}`) instead of a table.
    #[arg(long)]
    json: bool,
}

/// Run `qr stats`: 0 after --count intervals; 1 when the endpoint fails or
/// answers something that is not Prometheus text.
pub(crate) fn main(args: &StatsArgs) -> ExitCode {
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("qr stats: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// One GET of http://addr/metrics, its body.
pub(crate) fn scrape(addr: &str, timeout: Duration) -> Result<String> {
    let to = addr
        .to_socket_addrs()
        .with_context(|| format!("`{addr}` is not HOST:PORT"))?
        .next()
        .ok_or_else(|| anyhow!("`{addr}` resolved to no address"))?;
    let mut s = TcpStream::connect_timeout(&to, timeout).with_context(|| {
        format!("connecting to {to} (is the endpoint running with --metrics {addr}?)")
    })?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut resp = String::new();
    s.read_to_string(&mut resp)
        .context("reading the response")?;
    let (head, body) = resp
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow!("{to} did not answer HTTP"))?;
    let status = head.lines().next().unwrap_or("");
    if !status.contains(" 200 ") {
        bail!("{to}/metrics answered `{status}`");
    }
    Ok(body.to_string())
}

fn poll(args: &StatsArgs) -> Result<Exposition> {
    let text = scrape(&args.addr, Duration::from_secs(2))?;
    prom_text::parse(&text)
        .with_context(|| format!("{}/metrics is not valid Prometheus text", args.addr))
}

fn run(args: &StatsArgs) -> Result<()> {
    if args.interval.is_zero() {
        bail!("--interval 0 would poll in a busy loop: give e.g. 1s or 250ms");
    }
    let started = Instant::now();
    let mut prev = poll(args)?;
    let mut prev_at = Instant::now();
    let mut n = 0;
    while args.count == 0 || n < args.count {
        std::thread::sleep(args.interval.saturating_sub(prev_at.elapsed()));
        let now = poll(args)?;
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
