//! Text pages over HTTP: each command's `/metrics` (Prometheus text) and the
//! KV relay's `/status` (JSON), rendered at each request. `/metrics` also
//! carries the listener's own counters (`qr_tcp_*`).

use std::net::SocketAddr;
use std::sync::Arc;

use hyper::header::{HeaderValue, ALLOW, AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use hyper::{Method, Response, StatusCode};
use tokio::net::TcpListener;

use super::{full, Body};
use crate::listener::{Limits, ListenerStats};

/// The content type of every `/metrics` page: Prometheus text, exposition
/// format 0.0.4, as `crate::metric` has prometheus-client write it.
pub const METRICS_CONTENT_TYPE: &str = crate::metric::CONTENT_TYPE;

type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// One page: a path, its content type, and how to render it.
#[derive(Clone)]
pub struct Page {
    path: &'static str,
    content_type: &'static str,
    render: Render,
}

impl std::fmt::Debug for Page {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Page").field("path", &self.path).finish()
    }
}

impl Page {
    /// `/metrics`: Prometheus text from `render`.
    pub fn metrics(render: impl Fn() -> String + Send + Sync + 'static) -> Self {
        Self {
            path: "/metrics",
            content_type: METRICS_CONTENT_TYPE,
            render: Arc::new(render),
        }
    }

    /// `/status`: JSON from `render`.
    pub fn status(render: impl Fn() -> String + Send + Sync + 'static) -> Self {
        Self {
            path: "/status",
            content_type: "application/json",
            render: Arc::new(render),
        }
    }
}

/// Who may read the pages.
#[derive(Clone, Default)]
pub struct Access {
    /// The whole `Authorization` value a request must carry, if any.
    authorization: Option<String>,
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Access")
            .field(
                "authorization",
                &self.authorization.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

impl Access {
    /// With `Some(token)`, a request must carry `Authorization: Bearer
    /// <token>` (RFC 6750 §2.1); with `None`, anyone may read.
    pub fn bearer(token: Option<String>) -> Self {
        Self {
            authorization: token.map(|t| format!("Bearer {t}")),
        }
    }

    fn allows(&self, authorization: Option<&[u8]>) -> bool {
        let Some(want) = &self.authorization else {
            return true;
        };
        authorization.is_some_and(|got| crate::secret::equal(got, want.as_bytes()))
    }
}

/// Bind `addr` and serve `pages` there under `limits` until the returned task
/// is dropped or aborted; returns the bound address. `/metrics` carries the
/// counters of this listener (`listener="http"`) and of `also`, the
/// command's other TCP listeners.
pub async fn serve_pages(
    addr: SocketAddr,
    limits: Limits,
    access: Access,
    pages: Vec<Page>,
    also: Vec<Arc<ListenerStats>>,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let tcp = TcpListener::bind(addr).await?;
    let bound = tcp.local_addr()?;
    let stats = Arc::new(ListenerStats::new("http"));
    let mut listeners = vec![stats.clone()];
    listeners.extend(also);
    let pages = Arc::new(pages);
    let task = tokio::spawn(super::serve(tcp, limits, stats, move |req| {
        let resp = if access.allows(req.headers().get(AUTHORIZATION).map(|v| v.as_bytes())) {
            answer(req.method(), req.uri().path(), &pages, &listeners)
        } else {
            let mut r = text(
                StatusCode::UNAUTHORIZED,
                "a bearer token is required\n".into(),
            );
            r.headers_mut()
                .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            r
        };
        async move { resp }
    }));
    Ok((bound, task))
}

fn answer(
    method: &Method,
    path: &str,
    pages: &[Page],
    listeners: &[Arc<ListenerStats>],
) -> Response<Body> {
    let Some(page) = pages.iter().find(|p| p.path == path) else {
        let list: Vec<_> = pages.iter().map(|p| p.path).collect();
        return text(
            StatusCode::NOT_FOUND,
            format!("try {}\n", list.join(" or ")),
        );
    };
    if method != Method::GET && method != Method::HEAD {
        let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "GET or HEAD\n".into());
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    let mut body = (page.render)();
    if page.path == "/metrics" {
        body.push_str(&ListenerStats::prometheus(listeners.iter().map(|l| &**l)));
    }
    // hyper sends a HEAD response's headers only.
    let mut r = Response::new(full(body));
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(page.content_type));
    r
}

fn text(status: StatusCode, body: String) -> Response<Body> {
    let mut r = Response::new(full(body));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    r
}
