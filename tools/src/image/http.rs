//! The node agent's HTTP side: the pull half of the OCI distribution API
//! (distribution-spec v1.1, "Pull"), so containerd, skopeo or any OCI client
//! pulls through the agent unchanged, plus `/metrics` (Prometheus text).
//!
//! Only GET and HEAD exist here: pushing is for the upstream registry.

use std::sync::Arc;

use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{HeaderValue, ACCEPT, CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE, RANGE};
use hyper::{Method, Request, Response, StatusCode};
use tokio::net::TcpListener;

use super::client::FetchError;
use super::digest::{check_name, check_namespace, scoped, split_scope, Digest, Reference};
use super::metrics::{Path, RouteKind};
use super::node::Node;
use crate::http::{full, AccessLog, METRICS_CONTENT_TYPE};
use crate::listener::{Limits, ListenerStats};

pub use crate::http::Body;

/// Serve the OCI pull API (and `/metrics`) on `listener` under `limits`
/// until the task is dropped.
pub async fn serve(listener: TcpListener, limits: Limits, node: Arc<Node>) {
    let stats = Arc::new(ListenerStats::new("http"));
    let s = stats.clone();
    crate::http::serve(listener, limits, stats, move |req| {
        let (node, stats) = (node.clone(), s.clone());
        async move { handle(req, &node, &stats).await }
    })
    .await
}

/// An OCI error response (distribution-spec "Error Codes": a JSON body
/// `{"errors":[{"code","message","detail"}]}`).
fn oci_error(status: StatusCode, code: &str, message: &str) -> Response<Body> {
    let body = serde_json::json!({
        "errors": [{ "code": code, "message": message, "detail": null }]
    });
    let mut r = Response::new(full(body.to_string()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// The route of a `/v2/…` path (distribution-spec "Endpoints": end-1,
/// end-2 (blobs), end-3 (manifests)).
#[derive(Debug, PartialEq, Eq)]
pub enum Route {
    /// `/v2/`: API version check.
    Base,
    /// `/v2/<name>/manifests/<reference>`.
    Manifest(String, Reference),
    /// `/v2/<name>/blobs/<digest>`.
    Blob(String, Digest),
    /// `/v2/<name>/tags/list` (end-8a/8b).
    Tags(String),
    /// `/metrics`.
    Metrics,
}

impl Route {
    /// The route for the repository of registry `ns` (containerd's `?ns=`).
    fn scoped(self, ns: Option<String>) -> Route {
        let Some(ns) = ns else { return self };
        let s = |name: String| scoped(Some(&ns), &name);
        match self {
            Route::Manifest(name, r) => Route::Manifest(s(name), r),
            Route::Blob(name, d) => Route::Blob(s(name), d),
            Route::Tags(name) => Route::Tags(s(name)),
            other => other,
        }
    }
}

/// A request's query parameters, percent-decoded.
fn query(req: &Request<Incoming>) -> form_urlencoded::Parse<'_> {
    form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
}

/// The registry a mirror request is for: containerd appends `?ns=HOST` to
/// every request it sends a mirror (containerd docs/hosts.md); a registry
/// agent with several upstreams picks one by it.
fn namespace(req: &Request<Incoming>) -> Result<Option<String>, super::digest::NameError> {
    let Some((_, ns)) = query(req).find(|(k, _)| k == "ns") else {
        return Ok(None);
    };
    check_namespace(&ns)?;
    Ok(Some(ns.into_owned()))
}

/// Why a path is not a route.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RouteError {
    /// No such endpoint (404).
    #[error("no such endpoint")]
    NotFound,
    /// A name, reference or digest outside the grammar (400, with the OCI code).
    #[error("{0}: {1}")]
    Invalid(&'static str, String),
}

/// Parse a request path (the query, e.g. containerd's `?ns=…`, already cut).
pub fn route(path: &str) -> Result<Route, RouteError> {
    if path == "/metrics" {
        return Ok(Route::Metrics);
    }
    let Some(rest) = path.strip_prefix("/v2") else {
        return Err(RouteError::NotFound);
    };
    if rest.is_empty() || rest == "/" {
        return Ok(Route::Base);
    }
    let rest = rest.strip_prefix('/').ok_or(RouteError::NotFound)?;
    if let Some(name) = rest.strip_suffix("/tags/list") {
        check_name(name).map_err(|e| RouteError::Invalid("NAME_INVALID", e.to_string()))?;
        return Ok(Route::Tags(name.to_string()));
    }
    let (name, kind, tail) = if let Some(i) = rest.rfind("/manifests/") {
        (&rest[..i], "manifests", &rest[i + "/manifests/".len()..])
    } else if let Some(i) = rest.rfind("/blobs/") {
        (&rest[..i], "blobs", &rest[i + "/blobs/".len()..])
    } else {
        return Err(RouteError::NotFound);
    };
    check_name(name).map_err(|e| RouteError::Invalid("NAME_INVALID", e.to_string()))?;
    if kind == "manifests" {
        let r = tail.parse().map_err(|e: super::digest::NameError| {
            RouteError::Invalid("MANIFEST_INVALID", e.to_string())
        })?;
        Ok(Route::Manifest(name.to_string(), r))
    } else {
        let d = tail.parse().map_err(|e: super::digest::NameError| {
            RouteError::Invalid("DIGEST_INVALID", e.to_string())
        })?;
        Ok(Route::Blob(name.to_string(), d))
    }
}

/// A single byte range of a `Range` header (RFC 9110 §14.1.2), resolved
/// against `size`: `Ok(None)` to ignore it (absent, several ranges, or not
/// `bytes=` syntax — a server MAY ignore Range), `Err(())` when unsatisfiable.
#[allow(clippy::result_unit_err)]
pub fn parse_range(h: Option<&str>, size: u64) -> Result<Option<(u64, u64)>, ()> {
    let Some(spec) = h.and_then(|h| h.trim().strip_prefix("bytes=")) else {
        return Ok(None);
    };
    if spec.contains(',') {
        return Ok(None);
    }
    let Some((a, b)) = spec.trim().split_once('-') else {
        return Ok(None);
    };
    let (a, b) = (a.trim(), b.trim());
    let num = |s: &str| s.parse::<u64>().ok();
    match (a.is_empty(), b.is_empty()) {
        // bytes=-N: the last N bytes.
        (true, false) => {
            let Some(n) = num(b) else { return Ok(None) };
            if n == 0 || size == 0 {
                return Err(());
            }
            Ok(Some((size - n.min(size), size - 1)))
        }
        (false, _) => {
            let Some(start) = num(a) else { return Ok(None) };
            let end = if b.is_empty() {
                u64::MAX
            } else {
                match num(b) {
                    Some(e) if e >= start => e,
                    _ => return Ok(None),
                }
            };
            if start >= size {
                return Err(());
            }
            Ok(Some((start, end.min(size - 1))))
        }
        (true, true) => Ok(None),
    }
}

async fn handle(req: Request<Incoming>, node: &Arc<Node>, tcp: &ListenerStats) -> Response<Body> {
    node.metrics.requests.inc();
    let log = AccessLog::begin(&req);
    let kind = match route(req.uri().path()) {
        Ok(Route::Manifest(..)) => RouteKind::Manifest,
        Ok(Route::Blob(..)) => RouteKind::Blob,
        Ok(Route::Tags(..)) => RouteKind::Tags,
        _ => RouteKind::Other,
    };
    let resp = answer(&req, node, tcp).await;
    match resp.status() {
        StatusCode::BAD_REQUEST => node.metrics.bad_requests.inc(),
        s if s.is_client_error() || s.is_server_error() => node.metrics.errors.inc(),
        _ => {}
    }
    let metrics = node.metrics.clone();
    log.finish(resp, move |took| {
        metrics.request_duration.get(kind).observe(took)
    })
}

async fn answer(req: &Request<Incoming>, node: &Arc<Node>, tcp: &ListenerStats) -> Response<Body> {
    let head = req.method() == Method::HEAD;
    if !head && req.method() != Method::GET {
        return oci_error(
            StatusCode::METHOD_NOT_ALLOWED,
            "UNSUPPORTED",
            "this node agent serves pulls only (GET, HEAD); push to the upstream registry",
        );
    }
    let route = match route(req.uri().path()) {
        Ok(r) => r.scoped(match namespace(req) {
            Ok(ns) => ns,
            Err(e) => return oci_error(StatusCode::BAD_REQUEST, "NAME_INVALID", &e.to_string()),
        }),
        Err(RouteError::NotFound) => {
            return oci_error(StatusCode::NOT_FOUND, "NOT_FOUND", "no such endpoint")
        }
        Err(RouteError::Invalid(code, msg)) => {
            return oci_error(StatusCode::BAD_REQUEST, code, &msg)
        }
    };
    match route {
        Route::Metrics => {
            let m = &node.metrics;
            let mut text = m.render();
            node.cache.prometheus("qr_node", &mut text);
            let mut r = Response::new(full(text + &ListenerStats::prometheus([tcp])));
            r.headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static(METRICS_CONTENT_TYPE));
            r
        }
        Route::Base => {
            let mut r = Response::new(full(if head { "" } else { "{}" }));
            let h = r.headers_mut();
            h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            h.insert(
                "Docker-Distribution-API-Version",
                HeaderValue::from_static("registry/2.0"),
            );
            r
        }
        Route::Manifest(name, reference) => {
            let accept = req
                .headers()
                .get_all(ACCEPT)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .collect::<Vec<_>>()
                .join(", ");
            match node.manifest(&name, &reference, &accept).await {
                Ok(a) => {
                    let len = a.body.len();
                    let mut r = Response::new(full(if head { Bytes::new() } else { a.body }));
                    let h = r.headers_mut();
                    set(h, CONTENT_TYPE, &a.media_type);
                    set(h, CONTENT_LENGTH, &len.to_string());
                    set(h, "Docker-Content-Digest", &a.digest.to_string());
                    set(h, "X-Qr-Path", Path::Fabric.name());
                    if a.stale {
                        set(h, STALE, STALE_WHY);
                    }
                    r
                }
                Err(e) => fetch_error(&e, "MANIFEST_UNKNOWN"),
            }
        }
        Route::Blob(name, digest) => blob(req, node, &name, &digest, head).await,
        Route::Tags(name) => tags(req, node, &name, head).await,
    }
}

/// `tags/list`: the registry agent's whole list, paged here
/// (distribution-spec "Listing Tags": `n` tags at most, those lexically after
/// `last`, and a `Link: <…>; rel="next"` header while more remain).
async fn tags(req: &Request<Incoming>, node: &Arc<Node>, repo: &str, head: bool) -> Response<Body> {
    let (ns, name) = split_scope(repo);
    let (mut n, mut last) = (None, None);
    for (k, v) in query(req) {
        match &*k {
            "n" => match v.parse::<usize>() {
                Ok(v) => n = Some(v),
                Err(_) => {
                    return oci_error(
                        StatusCode::BAD_REQUEST,
                        "PAGINATION_NUMBER_INVALID",
                        &format!("n={v} is not a number of tags"),
                    )
                }
            },
            "last" => last = Some(v.into_owned()),
            _ => {}
        }
    }
    let (all, stale) = match node.tags(repo).await {
        Ok(t) => t,
        Err(e) => return fetch_error(&e, "NAME_UNKNOWN"),
    };
    let (page, next) = tag_page(&all, n, last.as_deref());
    let body = serde_json::json!({ "name": name, "tags": page }).to_string();
    let len = body.len();
    let mut r = Response::new(full(if head { String::new() } else { body }));
    let h = r.headers_mut();
    set(h, CONTENT_TYPE, "application/json");
    set(h, CONTENT_LENGTH, &len.to_string());
    if let (Some(next), Some(n)) = (next, n) {
        let mut q = form_urlencoded::Serializer::new(String::new());
        q.append_pair("n", &n.to_string()).append_pair("last", next);
        if let Some(ns) = ns {
            q.append_pair("ns", ns);
        }
        set(
            h,
            "Link",
            &format!("</v2/{name}/tags/list?{}>; rel=\"next\"", q.finish()),
        );
    }
    if stale {
        set(h, STALE, STALE_WHY);
    }
    r
}

/// One page of `all` (sorted): at most `n` tags after `last`, and the last
/// tag of the page if more follow.
pub fn tag_page<'a>(
    all: &'a [String],
    n: Option<usize>,
    last: Option<&str>,
) -> (&'a [String], Option<&'a str>) {
    let start = last.map_or(0, |l| all.partition_point(|t| t.as_str() <= l));
    let rest = &all[start..];
    let take = n.unwrap_or(rest.len()).min(rest.len());
    let page = &rest[..take];
    let more = take < rest.len() && take > 0;
    (page, more.then(|| page[take - 1].as_str()))
}

/// The header naming an answer the registry agent served from its cache
/// past the TTL because the upstream registry could not be reached.
pub const STALE: &str = "X-Qr-Stale";

/// [`STALE`]'s value.
const STALE_WHY: &str = "upstream unreachable; served from the registry agent's cache";

/// The headers of every blob answer (distribution-spec "Pulling blobs"):
/// its length, type, digest, and that ranges are served.
fn blob_headers(h: &mut hyper::HeaderMap, len: u64, digest: &Digest) {
    set(h, CONTENT_LENGTH, &len.to_string());
    set(h, CONTENT_TYPE, "application/octet-stream");
    set(h, "Docker-Content-Digest", &digest.to_string());
    set(h, "Accept-Ranges", "bytes");
}

fn set(h: &mut hyper::HeaderMap, k: impl hyper::header::IntoHeaderName, v: &str) {
    if let Ok(v) = HeaderValue::from_str(v) {
        h.insert(k, v);
    }
}

fn fetch_error(e: &FetchError, unknown_code: &str) -> Response<Body> {
    let msg = e.to_string();
    match e {
        FetchError::NotFound(_) => oci_error(StatusCode::NOT_FOUND, unknown_code, &msg),
        // OCI distribution spec, error codes: DENIED, "requested access to the
        // resource is denied".
        FetchError::Denied(_) => oci_error(StatusCode::FORBIDDEN, "DENIED", &msg),
        FetchError::Range(_) => oci_error(StatusCode::RANGE_NOT_SATISFIABLE, "SIZE_INVALID", &msg),
        FetchError::Connection(_) => oci_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "UNAVAILABLE",
            &format!("{msg} (is `qr registry-agent` running and reachable, and do both agents' certificates chain to one CA?)"),
        ),
        FetchError::DigestMismatch(_) => oci_error(StatusCode::BAD_GATEWAY, "DIGEST_INVALID", &msg),
        _ => oci_error(StatusCode::BAD_GATEWAY, "UNKNOWN", &msg),
    }
}

/// A blob request's error answer; a digest failure is counted
/// (`qr_node_digest_refusals_total`).
fn blob_error(node: &Node, e: &FetchError) -> Response<Body> {
    if matches!(e, FetchError::DigestMismatch(_)) {
        node.metrics.digest_refusals.inc();
    }
    fetch_error(e, "BLOB_UNKNOWN")
}

async fn blob(
    req: &Request<Incoming>,
    node: &Arc<Node>,
    name: &str,
    digest: &Digest,
    head: bool,
) -> Response<Body> {
    let range_h = req.headers().get(RANGE).and_then(|v| v.to_str().ok());
    if head {
        return match node.blob_size(name, digest).await {
            Ok(size) => {
                let mut r = Response::new(full(Bytes::new()));
                let h = r.headers_mut();
                blob_headers(h, size, digest);
                r
            }
            Err(e) => fetch_error(&e, "BLOB_UNKNOWN"),
        };
    }
    // Cut-through: the cache's copy, or the fetch as it arrives, in order.
    // Errors known before the first byte are an error answer; after it, a
    // failed fetch cuts the body short (inflight.rs).
    let follower = match node.open(name, digest).await {
        Ok(f) => f,
        Err(e) => return blob_error(node, &e),
    };
    let size = follower.size();
    let (start, end, status) = match parse_range(range_h, size) {
        Ok(None) => (0, size, StatusCode::OK),
        Ok(Some((s, e))) => (s, e + 1, StatusCode::PARTIAL_CONTENT),
        Err(()) => {
            let mut r = oci_error(
                StatusCode::RANGE_NOT_SATISFIABLE,
                "SIZE_INVALID",
                &format!(
                    "range {} outside the blob's {size} bytes",
                    range_h.unwrap_or("")
                ),
            );
            set(r.headers_mut(), CONTENT_RANGE, &format!("bytes */{size}"));
            return r;
        }
    };
    // A range of a blob still arriving streams once the prefix reaches it,
    // like the whole blob: its last byte, too, waits for the verdict.
    let reading = match follower.bind(start, end).await {
        Ok(r) => r,
        Err(e) => return blob_error(node, &e),
    };
    let len = end - start;
    let path = reading.path();
    // Bytes fetched for this request were counted under their path as they
    // arrived; only a cache hit's are counted here.
    if path == Path::Cache {
        node.metrics.bytes(Path::Cache, len);
    }
    // An error item makes hyper cut the connection: the client holds fewer
    // than Content-Length bytes (RFC 9110 §8.6), never a complete wrong blob.
    let cuts = node.metrics.clone();
    let body = reading.into_stream().map(move |piece| {
        if piece.is_err() {
            cuts.responses_cut.inc();
        }
        piece.map(Frame::data)
    });
    let mut r = Response::new(BodyExt::boxed(StreamBody::new(body)));
    *r.status_mut() = status;
    let h = r.headers_mut();
    blob_headers(h, len, digest);
    set(h, "X-Qr-Path", path.name());
    if status == StatusCode::PARTIAL_CONTENT {
        set(
            h,
            CONTENT_RANGE,
            &format!("bytes {start}-{}/{size}", end - 1),
        );
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(parse_range(None, 10), Ok(None));
        assert_eq!(parse_range(Some("bytes=0-3"), 10), Ok(Some((0, 3))));
        assert_eq!(parse_range(Some("bytes=5-"), 10), Ok(Some((5, 9))));
        assert_eq!(parse_range(Some("bytes=5-100"), 10), Ok(Some((5, 9))));
        assert_eq!(parse_range(Some("bytes=-3"), 10), Ok(Some((7, 9))));
        assert_eq!(parse_range(Some("bytes=-30"), 10), Ok(Some((0, 9))));
        assert_eq!(parse_range(Some("bytes=10-"), 10), Err(()));
        assert_eq!(parse_range(Some("bytes=-0"), 10), Err(()));
        assert_eq!(parse_range(Some("bytes=0-1,3-4"), 10), Ok(None));
        assert_eq!(parse_range(Some("items=0-1"), 10), Ok(None));
        assert_eq!(parse_range(Some("bytes=4-2"), 10), Ok(None));
    }

    #[test]
    fn routes() {
        let d = Digest::of(b"");
        assert_eq!(route("/v2/"), Ok(Route::Base));
        assert_eq!(route("/v2"), Ok(Route::Base));
        assert_eq!(
            route("/v2/a/b/manifests/latest"),
            Ok(Route::Manifest(
                "a/b".into(),
                Reference::Tag("latest".into())
            ))
        );
        assert_eq!(
            route(&format!("/v2/a/blobs/{d}")),
            Ok(Route::Blob("a".into(), d))
        );
        // A repository may itself be called "blobs".
        assert_eq!(
            route(&format!("/v2/x/blobs/blobs/{d}")),
            Ok(Route::Blob("x/blobs".into(), d))
        );
        assert!(matches!(
            route("/v2/a/blobs/sha256:zz"),
            Err(RouteError::Invalid("DIGEST_INVALID", _))
        ));
        assert!(matches!(
            route("/v2/A/manifests/x"),
            Err(RouteError::Invalid("NAME_INVALID", _))
        ));
        assert_eq!(route("/v3/"), Err(RouteError::NotFound));
        assert_eq!(route("/v2/a/b/tags/list"), Ok(Route::Tags("a/b".into())));
        assert!(matches!(
            route("/v2/A/tags/list"),
            Err(RouteError::Invalid("NAME_INVALID", _))
        ));
        assert_eq!(route("/v2/a/tags/lists"), Err(RouteError::NotFound));
    }

    #[test]
    fn tag_pages() {
        let all: Vec<String> = ["a", "b", "c", "d"].iter().map(|s| s.to_string()).collect();
        assert_eq!(tag_page(&all, None, None), (&all[..], None));
        assert_eq!(tag_page(&all, Some(2), None), (&all[..2], Some("b")));
        assert_eq!(tag_page(&all, Some(2), Some("b")), (&all[2..], None));
        assert_eq!(tag_page(&all, Some(3), Some("a")), (&all[1..], None));
        assert_eq!(tag_page(&all, None, Some("bb")), (&all[2..], None));
        assert_eq!(tag_page(&all, Some(0), None), (&all[..0], None));
        assert_eq!(tag_page(&all, Some(5), Some("z")), (&all[4..], None));
    }
}
