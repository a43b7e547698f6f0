//! How `qr` logs: to stderr, one line per event, as text (colour only for a
//! person at a terminal; `NO_COLOR` honoured) or as JSON lines
//! (`--log-format json`: `timestamp`, `level`, `target` and the event's
//! fields at the top level, for a log collector). `RUST_LOG` filters; the
//! default is warnings, plus the access log (`qr::access`, one line per
//! request the agents answer).

/// The format of log lines.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// `TIMESTAMP LEVEL target: message key=value…`.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// The filter when `RUST_LOG` is not set: warnings, plus the access log
/// and certificate reloads (`qr::tls`), which an operator wants to see.
pub const DEFAULT_FILTER: &str = "warn,qr::access=info,qr::tls=info";

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
