//! How `qr` logs: to stderr, one line per event, as text (colour only for a
//! person at a terminal; `NO_COLOR` honoured) or as JSON lines
//! (`--log-format json`: `timestamp`, `level`, `target` and the event's
//! fields at the top level, for a log collector). `RUST_LOG` filters; the
//! default is warnings, plus `qr`'s own events at info (targets `qr::*`: the
//! access log `qr::access`, one line per request the agents answer;
//! `qr::kv`, `qr::tls`, `qr::serve`, `qr::gateway`, `qr::image`,
//! `qr::metrics`). A long-running command's events all go through here, so
//! `--log-format json` gives a collector nothing but JSON lines.

/// `e` and its causes, joined by ": ", for one log line or message.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cause = c.source();
    }
    s
}

/// The format of log lines.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// `TIMESTAMP LEVEL target: message key=value…`.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// The filter when `RUST_LOG` is not set: warnings, and `qr`'s own
/// operational events (targets `qr::*`: the access log, certificate
/// reloads, what a service listens on, KV syncs), which an operator wants.
pub const DEFAULT_FILTER: &str = "warn,qr=info";

/// Install the global subscriber (once, at start).
pub fn init(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_FILTER));
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => b
            // Colour only for a person at a terminal: a log file or a pipe
            // gets plain text (and NO_COLOR, https://no-color.org, is honoured).
            .with_ansi(
                std::io::IsTerminal::is_terminal(&std::io::stderr())
                    && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
            )
            .init(),
        LogFormat::Json => b
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .init(),
    }
}
