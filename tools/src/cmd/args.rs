//! Option values and defaults that more than one subcommand takes.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use quic_rdma::fabric::Provider;
use quic_rdma::quic::RetryPolicy;
use quic_rdma::quinn_adapter::{Liveness, RetryGate};

use anyhow::Context as _;

use crate::http::Page;
use crate::listener::{Limits, ListenerStats};

use crate::channel_endpoint::ListenOptions;
pub(crate) use crate::channel_endpoint::DEFAULT_SERVICE_PORT;

/// Parse a byte count with an optional binary suffix (K, M, G, T; "KiB", "MB"... accepted).
///
/// A fraction is taken only when it comes to a whole number of bytes (1.5K is
/// 1536; 1.5 and 1.1K are errors): a size is never silently rounded.
pub(crate) fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let num: String = num.chars().filter(|&c| c != '_').collect();
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        other => return Err(format!("unknown size suffix `{other}` (use K, M, G or T)")),
    };
    let not_a_count = || format!("`{s}` is not a byte count (e.g. 64M, 1G, 4096)");
    // Exact decimal arithmetic: `int.frac` is digits / 10^frac.len().
    let (int, frac) = num.split_once('.').unwrap_or((&num, ""));
    let all_digits = |d: &str| d.bytes().all(|b| b.is_ascii_digit());
    if (int.is_empty() && frac.is_empty()) || !all_digits(int) || !all_digits(frac) {
        return Err(not_a_count());
    }
    let too_big = || format!("`{s}` is more bytes than fit in 64 bits");
    let digits: u128 = format!("{int}{frac}").parse().map_err(|_| too_big())?;
    let scale = u32::try_from(frac.len())
        .ok()
        .and_then(|n| 10u128.checked_pow(n))
        .ok_or_else(too_big)?;
    let scaled = digits.checked_mul(1u128 << shift).ok_or_else(too_big)?;
    if scaled % scale != 0 {
        return Err(format!(
            "`{s}` is not a whole number of bytes: give an integer count, or a \
             fraction of a unit that comes out whole (e.g. 1.5K = 1536)"
        ));
    }
    let bytes = u64::try_from(scaled / scale).map_err(|_| too_big())?;
    if bytes == 0 {
        return Err(format!("`{s}` is not a byte count of at least 1"));
    }
    Ok(bytes)
}

/// `--provider`'s values: the names of [`Provider`] (quic-rdma's, shared with
/// the C API and the benchmarks), each listed in `--help` with what it means
/// for `qr`.
pub(crate) fn provider_parser() -> impl TypedValueParser<Value = Provider> {
    let values = Provider::ALL.map(|p| {
        PossibleValue::new(p.name()).help(match p {
            Provider::Sim => {
                "In-process simulated fabric (MTU 4096, optional fault injection). No \
                 hardware needed"
            }
            Provider::Soft => {
                "Userspace RoCEv2 over UDP sockets (one process per endpoint: `qr serve` / \
                 `qr connect`; `qr demo` runs the server as a child process)"
            }
            Provider::Verbs => {
                "libibverbs: RoCE NICs and kernel rxe (`qr serve` / `qr connect`; built with \
                 the `verbs` cargo feature)"
            }
        })
    });
    PossibleValuesParser::new(values).try_map(|s| s.parse::<Provider>())
}

/// `--provider` and `--udp-port`: which fabric an endpoint lives on, declared
/// once for every command that opens one.
#[derive(Clone, Copy, Debug, clap::Args)]
pub(crate) struct FabricArgs {
    /// Fabric provider.
    #[arg(long, value_parser = provider_parser(), default_value_t = Provider::Soft)]
    pub(crate) provider: Provider,
    /// UDP port of the RoCEv2 socket (`soft`; kernel rxe and NICs use 4791
    /// only): another endpoint on the same IP needs another port.
    #[arg(long, default_value_t = quic_rdma::fabric::ROCEV2_UDP_PORT)]
    pub(crate) udp_port: u16,
}

/// `--ip` and `--service-port`: where a serving command's fabric endpoint
/// and its bootstrap service listen, declared once.
#[derive(Clone, Copy, Debug, clap::Args)]
pub(crate) struct ListenArgs {
    /// Local IP: the fabric endpoint's GID (IPv4-mapped for IPv4) and the
    /// bootstrap service's address. A specific address (not 0.0.0.0 / ::).
    #[arg(long)]
    pub(crate) ip: IpAddr,
    /// TCP port of the bootstrap service that clients dial (on --ip).
    #[arg(long, default_value_t = DEFAULT_SERVICE_PORT)]
    pub(crate) service_port: u16,
}

impl ListenArgs {
    /// A channel server's options: these, `fabric`'s, and `liveness`.
    pub(crate) fn options(&self, fabric: FabricArgs, liveness: Liveness) -> ListenOptions {
        ListenOptions {
            provider: fabric.provider,
            udp_port: fabric.udp_port,
            service_port: self.service_port,
            liveness,
            ..ListenOptions::new(self.ip)
        }
    }
}

/// `--idle-timeout` and `--keep-alive`: how fast a dead peer is noticed. The
/// defaults suit a fabric; a peer that may stall for seconds (an emulated
/// guest, a debugger) needs a longer idle timeout on both ends.
///
/// The idle timeout is judged by the receive path's clock
/// (`quinn_adapter::watch`: a peer silent that long, counting only from
/// packets read off the fabric, is dead), not by quinn's idle timer, which
/// runs in a connection task a busy host can delay by seconds:
/// the QUIC idle timeout sent to the peer is twice it, and at least 30 s
/// (`Liveness::QUINN_ADAPTER_IDLE_TIMEOUT`), and only catches what no
/// watcher does.
#[derive(Clone, Copy, Debug, clap::Args)]
pub(crate) struct LivenessArgs {
    /// Close a connection after this long without hearing from the peer, as
    /// the receive path sees it (e.g. 1.5s, 30s, 500ms; "off" never times out).
    #[arg(long, value_parser = parse_timer, default_value = "1.5s")]
    idle_timeout: Timer,
    /// Send a PING after this long without sending (must be shorter than
    /// --idle-timeout; "off" sends none).
    #[arg(long, value_parser = parse_timer, default_value = "300ms")]
    keep_alive: Timer,
}

/// A timer option: a duration, or `off`.
#[derive(Clone, Copy, Debug)]
struct Timer(Option<Duration>);

fn parse_timer(s: &str) -> Result<Timer, String> {
    if s.eq_ignore_ascii_case("off") {
        return Ok(Timer(None));
    }
    humantime::parse_duration(s)
        .map(|d| Timer(Some(d)))
        .map_err(|e| format!("`{s}` is not a duration (e.g. 300ms, 1.5s, 30s, or off): {e}"))
}

impl LivenessArgs {
    /// The checked timers (a keep-alive not shorter than the idle timeout is
    /// refused): `--idle-timeout` as the watcher's silence
    /// ([`Liveness::dead_after`]), the QUIC idle timeout well above it.
    pub(crate) fn liveness(&self) -> anyhow::Result<Liveness> {
        let err = |e| anyhow::anyhow!("--keep-alive/--idle-timeout: {e}");
        let (keep_alive, silence) = (self.keep_alive.0, self.idle_timeout.0);
        // The user's pair, checked as given (the messages name their values).
        let given = Liveness::new(keep_alive, silence).map_err(err)?;
        let Some(silence) = silence else {
            return Ok(given);
        };
        let quic_idle = silence
            .saturating_mul(2)
            .max(Liveness::QUINN_ADAPTER_IDLE_TIMEOUT);
        Liveness::new(keep_alive, Some(quic_idle))
            .and_then(|l| l.with_dead_after(Some(silence)))
            .map_err(err)
    }

    /// The same options as command-line arguments, for a child `qr`.
    pub(crate) fn to_cli(self) -> [String; 4] {
        let show = |t: Timer| match t.0 {
            Some(d) => humantime::format_duration(d).to_string(),
            None => "off".to_string(),
        };
        [
            "--idle-timeout".into(),
            show(self.idle_timeout),
            "--keep-alive".into(),
            show(self.keep_alive),
        ]
    }
}

/// What `qr connect` and `qr demo` share: the workload's sizes, the time
/// limit, the report's format and the connection's liveness timers.
#[derive(Clone, Copy, Debug, clap::Args)]
pub(crate) struct WorkloadArgs {
    /// Bytes to transfer client -> server. Suffixes K, M, G, T are binary
    /// (KiB, MiB, GiB, TiB): 256M, 1G, 1.5G, 4096.
    #[arg(long, default_value = "64M", value_parser = parse_bytes)]
    pub(crate) bytes: u64,

    /// Round trips of the ping-pong (0 skips it).
    #[arg(long, default_value_t = 10_000)]
    pub(crate) pings: u32,

    /// Size of each ping and pong in bytes.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub(crate) ping_size: u32,

    /// Give up (exit 1) if the run has not finished after this many seconds.
    #[arg(long, default_value_t = 600)]
    pub(crate) timeout: u64,

    /// Print the report as one JSON object instead of the human summary.
    #[arg(long)]
    pub(crate) json: bool,

    /// Liveness timers of the QUIC connection.
    #[command(flatten)]
    pub(crate) liveness: LivenessArgs,
}

/// `--retry`: when a QUIC server over the fabric asks a client to prove its
/// address before keeping any state for it. Every serving command takes it;
/// one [`RetryGate`] per server counts its Retries and its unvalidated
/// handshakes (both on `--metrics`).
#[derive(Clone, Copy, Debug, clap::Args)]
pub(crate) struct RetryArgs {
    /// When to answer connection attempts from unvalidated addresses with a
    /// QUIC Retry (RFC 9000 §8.1.2): auto = only while ≥64 handshakes from
    /// unvalidated addresses are in flight, e.g. during a spoofed-Initial
    /// flood; always = every attempt without a token (one more round trip for
    /// each client); never.
    #[arg(
        long,
        value_name = "auto|always|never",
        default_value_t = RetryPolicy::Auto,
        value_parser = parse_retry_policy
    )]
    retry: RetryPolicy,
}

/// `--retry`'s value, by [`RetryPolicy`]'s `FromStr` (its error names the
/// allowed values).
fn parse_retry_policy(s: &str) -> Result<RetryPolicy, String> {
    s.parse::<RetryPolicy>().map_err(|e| e.to_string())
}

impl RetryArgs {
    /// A gate with the policy, for one server's accept loop (clones share
    /// its counts).
    pub(crate) fn gate(&self) -> RetryGate {
        RetryGate::new(self.retry)
    }
}

/// `--metrics ADDR` and the limits of its listener: every long-running
/// command's Prometheus endpoint, declared once.
#[derive(Clone, Debug, clap::Args)]
pub(crate) struct MetricsArgs {
    /// Serve Prometheus text on http://ADDR/metrics (watch it live with
    /// `qr stats ADDR`); bind it to loopback or a management network.
    #[arg(long, value_name = "ADDR")]
    pub(crate) metrics: Option<SocketAddr>,
    /// Require `Authorization: Bearer TOKEN` on --metrics, TOKEN being the
    /// file's first line (Prometheus: `authorization: {credentials_file: FILE}`;
    /// `qr stats --token-file FILE`).
    #[arg(long, value_name = "FILE", requires = "metrics")]
    pub(crate) metrics_token_file: Option<PathBuf>,
    /// Limits of the TCP listeners.
    #[command(flatten)]
    pub(crate) tcp: TcpLimitsArgs,
}

impl MetricsArgs {
    /// Serve `pages` on `--metrics`, if given, announcing it on stderr as
    /// `command`; the listener runs until the returned task is dropped.
    /// `also`: the command's other TCP listeners, whose counters `/metrics`
    /// carries too.
    pub(crate) async fn serve(
        &self,
        command: &str,
        pages: Vec<Page>,
        also: Vec<Arc<ListenerStats>>,
    ) -> anyhow::Result<Option<tokio::task::JoinHandle<()>>> {
        let Some(addr) = self.metrics else {
            return Ok(None);
        };
        let token = self
            .metrics_token_file
            .as_deref()
            .map(|f| crate::secret::read_first_line(f, "--metrics-token-file"))
            .transpose()?;
        let access = crate::http::Access::bearer(token);
        let (bound, task) = crate::http::serve_pages(addr, self.tcp.limits(), access, pages, also)
            .await
            .with_context(|| format!("--metrics {addr}: is the port taken?"))?;
        tracing::info!(target: "qr::metrics", "{command}: metrics on http://{bound}/metrics");
        Ok(Some(task))
    }
}

/// `--tcp-*`: the limits of every TCP listener a command opens (its
/// `/metrics`, the node agent's OCI API, the KV relay's Redis port).
#[derive(Clone, Copy, Debug, clap::Args)]
pub(crate) struct TcpLimitsArgs {
    /// Open TCP connections at most per listener; past it a new connection
    /// takes the place of the one idle longest.
    #[arg(long, default_value_t = Limits::DEFAULT.max_connections, value_parser = parse_connections)]
    tcp_max_connections: usize,
    /// Time a TCP client has to send a whole request, from connecting or from
    /// its previous response (e.g. 10s).
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    tcp_request_timeout: Duration,
    /// Drop a TCP client that takes no bytes of a response for this long.
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    tcp_stall_timeout: Duration,
}

fn parse_connections(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("a cap of 0 would refuse everyone: give at least 1".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("`{s}` is not a connection count (e.g. 512)")),
    }
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    match humantime::parse_duration(s) {
        Ok(d) if !d.is_zero() => Ok(d),
        Ok(_) => Err("a timeout of 0 would drop every connection: give e.g. 10s".into()),
        Err(e) => Err(format!("`{s}` is not a duration (e.g. 500ms, 10s): {e}")),
    }
}

/// A length of time that may be 0 (e.g. a cache TTL: 0 = always ask).
pub(crate) fn parse_age(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s)
        .map_err(|e| format!("`{s}` is not a duration (e.g. 0s, 30s, 7d): {e}"))
}

impl TcpLimitsArgs {
    /// The limits.
    pub(crate) fn limits(&self) -> Limits {
        Limits {
            max_connections: self.tcp_max_connections,
            request_timeout: self.tcp_request_timeout,
            stall_timeout: self.tcp_stall_timeout,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_suffixes() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("64M"), Ok(64 << 20));
        assert_eq!(parse_bytes("256m"), Ok(256 << 20));
        assert_eq!(parse_bytes("1G"), Ok(1 << 30));
        assert_eq!(parse_bytes("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_bytes("8 MB"), Ok(8 << 20));
        assert_eq!(parse_bytes("1_000"), Ok(1000));
        assert!(parse_bytes("0").is_err());
        assert!(parse_bytes("12X").is_err());
        assert!(parse_bytes("M").is_err());
        // Never rounded: fractions only where they are exact.
        assert_eq!(parse_bytes("1.5K"), Ok(1536));
        assert_eq!(parse_bytes(".5k"), Ok(512));
        assert_eq!(parse_bytes("2."), Ok(2));
        for bad in [
            "1.5",
            "1.1K",
            "0.3",
            "1.2.3",
            ".",
            "1e3",
            "-1",
            "17179869184G",
        ] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
        assert!(parse_bytes("1.5").unwrap_err().contains("whole number"));
        assert_eq!(parse_bytes("16777215T"), Ok(u64::MAX - ((1 << 40) - 1)));
    }

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        liveness: LivenessArgs,
        #[command(flatten)]
        tcp: TcpLimitsArgs,
        #[command(flatten)]
        retry: RetryArgs,
    }

    #[test]
    fn retry_option() {
        use clap::Parser;
        let default = Cli::try_parse_from(["qr"]).unwrap().retry;
        assert_eq!(default.gate().policy(), RetryPolicy::Auto);
        for (arg, policy) in [
            ("auto", RetryPolicy::Auto),
            ("always", RetryPolicy::Always),
            ("never", RetryPolicy::Never),
        ] {
            let got = Cli::try_parse_from(["qr", "--retry", arg]).unwrap().retry;
            assert_eq!(got.gate().policy(), policy, "{arg}");
        }
        let e = Cli::try_parse_from(["qr", "--retry", "sometimes"])
            .unwrap_err()
            .to_string();
        for word in ["--retry", "sometimes", "auto", "always", "never"] {
            assert!(e.contains(word), "{word} not in: {e}");
        }
        // The help states the threshold `auto` really uses.
        let help = <Cli as clap::CommandFactory>::command()
            .render_long_help()
            .to_string();
        let threshold = format!("≥{} handshakes", RetryPolicy::AUTO_THRESHOLD);
        assert!(help.contains(&threshold), "{help}");
        assert!(help.contains("[default: auto]"), "{help}");
    }

    #[test]
    fn tcp_limits_options() {
        use clap::Parser;
        let default = Cli::try_parse_from(["qr"]).unwrap().tcp;
        assert_eq!(default.limits(), Limits::DEFAULT);
        let set = Cli::try_parse_from([
            "qr",
            "--tcp-max-connections",
            "8",
            "--tcp-request-timeout",
            "2s",
            "--tcp-stall-timeout",
            "500ms",
        ])
        .unwrap()
        .tcp;
        assert_eq!(
            set.limits(),
            Limits {
                max_connections: 8,
                request_timeout: Duration::from_secs(2),
                stall_timeout: Duration::from_millis(500),
            }
        );
        for bad in [
            ["qr", "--tcp-max-connections", "0"],
            ["qr", "--tcp-request-timeout", "0s"],
            ["qr", "--tcp-stall-timeout", "soon"],
        ] {
            assert!(Cli::try_parse_from(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn liveness_options() {
        use clap::Parser;
        let ms = Duration::from_millis;
        let default = Cli::try_parse_from(["qr"]).unwrap().liveness;
        // The fabric's 300 ms / 1.5 s, the 1.5 s judged by the receive path
        // (the adapter's defaults: quinn's own idle timer at 30 s).
        assert_eq!(default.liveness().unwrap(), Liveness::quinn_adapter());
        let wide = Cli::try_parse_from(["qr", "--idle-timeout", "30s", "--keep-alive", "1s"])
            .unwrap()
            .liveness;
        assert_eq!(
            wide.liveness().unwrap(),
            Liveness::new(Some(ms(1000)), Some(ms(60_000)))
                .unwrap()
                .with_dead_after(Some(ms(30_000)))
                .unwrap()
        );
        // A child `qr` given to_cli() gets the same timers.
        let mut argv = vec!["qr".to_string()];
        argv.extend(wide.to_cli());
        let again = Cli::try_parse_from(argv).unwrap().liveness;
        assert_eq!(again.liveness().unwrap(), wide.liveness().unwrap());
        // Without keep-alives an idle connection is closed after 1.5 s of
        // silence, as an idle timer would close it.
        let off = Cli::try_parse_from(["qr", "--keep-alive", "off"]).unwrap();
        assert_eq!(
            off.liveness.liveness().unwrap(),
            Liveness::new(None, Some(ms(30_000)))
                .unwrap()
                .with_dead_after(Some(ms(1500)))
                .unwrap()
        );
        let never = Cli::try_parse_from(["qr", "--idle-timeout", "off"]).unwrap();
        assert_eq!(
            never.liveness.liveness().unwrap(),
            Liveness::new(Some(ms(300)), None).unwrap()
        );
        // A keep-alive that cannot keep the connection alive is refused, by name.
        let bad =
            Cli::try_parse_from(["qr", "--idle-timeout", "1s", "--keep-alive", "2s"]).unwrap();
        assert!(bad
            .liveness
            .liveness()
            .unwrap_err()
            .to_string()
            .contains("--keep-alive"));
        assert!(Cli::try_parse_from(["qr", "--idle-timeout", "soon"]).is_err());
    }
}
