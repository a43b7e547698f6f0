//! A minimal HTTP/1.1 endpoint for metrics: `GET /metrics` (Prometheus text)
//! and `GET /status` (JSON). One request per connection, bounded reads; it
//! is for scrapers and people on a trusted network, not a web server.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::metrics::Metrics;

/// Serve `metrics` on `addr` until the task is dropped; returns the bound
/// address once listening.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    role: &'static str,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    serve_routes(
        addr,
        Arc::new(move |path: &str| match path {
            "/metrics" => Some(("text/plain; version=0.0.4", metrics.prometheus(role))),
            "/status" => Some(("application/json", metrics.status(role).to_string())),
            _ => None,
        }),
    )
    .await
}

/// What a path answers: (content type, body), or `None` for a 404.
pub type Routes = Arc<dyn Fn(&str) -> Option<(&'static str, String)> + Send + Sync>;

/// Serve `routes` on `addr` until the task is dropped (the HTTP side of every
/// `/metrics` endpoint outside the image channel: kv relays, `qr serve
/// --metrics`, `qr gateway --metrics`); returns the bound address once listening.
pub async fn serve_routes(
    addr: SocketAddr,
    routes: Routes,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let task = tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let routes = routes.clone();
            tokio::spawn(async move {
                let mut req = [0u8; 1024];
                let mut n = 0;
                // Read until the end of the request head (or 1 KiB, or 2 s).
                let _ = tokio::time::timeout(Duration::from_secs(2), async {
                    while n < req.len() {
                        match sock.read(&mut req[n..]).await {
                            Ok(0) | Err(_) => break,
                            Ok(k) => n += k,
                        }
                        if req[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                            break;
                        }
                    }
                })
                .await;
                let head = String::from_utf8_lossy(&req[..n]);
                let path = head.split_whitespace().nth(1).unwrap_or("");
                let (status, ctype, body) = match routes(path) {
                    Some((ctype, body)) => ("200 OK", ctype, body),
                    None => (
                        "404 Not Found",
                        "text/plain",
                        "try /metrics or /status\n".into(),
                    ),
                };
                let resp = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = sock.write_all(resp.as_bytes()).await;
                let _ = sock.shutdown().await;
            });
        }
    });
    Ok((bound, task))
}
