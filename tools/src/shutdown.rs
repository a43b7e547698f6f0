//! Stopping on request: SIGTERM (what systemd, Kubernetes and `kill` send)
//! or SIGINT (Ctrl-C). A long-running command then closes its QUIC
//! connections with an application close (RFC 9000 §10.2), so its peers
//! learn at once instead of after their idle timeout, tells the service
//! manager it is stopping, and exits 0.

use std::time::Duration;

/// How long the peers get to receive the close before the process exits.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// Resolves on the first SIGTERM or SIGINT, with the signal's name. If the
/// handlers cannot be installed it never resolves (the default action, to
/// exit, stays).
pub(crate) async fn requested() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::warn!("cannot handle SIGTERM/SIGINT: stopping will not close connections");
        return std::future::pending().await;
    };
    let name = tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    };
    crate::notify::stopping();
    name
}

/// Close every connection of `endpoint` (code 0, "shutting down") and wait
/// until the closes are sent, at most [`CLOSE_GRACE`].
pub(crate) async fn close(endpoint: &quinn::Endpoint) {
    endpoint.close(0u32.into(), b"shutting down");
    let _ = tokio::time::timeout(CLOSE_GRACE, endpoint.wait_idle()).await;
}
