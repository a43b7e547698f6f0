//! One access-log line per HTTP request, written when its response ends (so
//! it carries the bytes really sent and whether the body was cut short):
//! target `qr::access`, level INFO, the client's address, method, `uri` (path
//! and query), status, bytes, milliseconds, `complete` or `aborted`, and the
//! answer's `X-Qr-Path` when it has one. Text or JSON as `--log-format` says.

use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Frame, SizeHint};
use hyper::{Request, Response};

use super::Body;

/// The client's address, put in every request's extensions by
/// [`super::serve`].
#[derive(Clone, Copy, Debug)]
pub struct Remote(pub SocketAddr);

/// A request being answered: what its log line needs from it.
#[derive(Debug)]
pub struct AccessLog {
    remote: Option<SocketAddr>,
    method: String,
    target: String,
    start: Instant,
}

impl AccessLog {
    /// Start timing `req`.
    pub fn begin<B>(req: &Request<B>) -> AccessLog {
        AccessLog {
            remote: req.extensions().get::<Remote>().map(|r| r.0),
            method: req.method().to_string(),
            target: req
                .uri()
                .path_and_query()
                .map_or_else(|| req.uri().path().to_string(), |p| p.to_string()),
            start: Instant::now(),
        }
    }

    /// `resp`, its body wrapped to write the line and call `done` with the
    /// request's whole duration when the body ends or is dropped.
    pub fn finish(
        self,
        resp: Response<Body>,
        done: impl FnOnce(Duration) + Send + Sync + 'static,
    ) -> Response<Body> {
        let status = resp.status().as_u16();
        let path = resp
            .headers()
            .get("X-Qr-Path")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_string();
        resp.map(|body| {
            Logged {
                body,
                entry: Some(Entry {
                    log: self,
                    status,
                    path,
                    done: Box::new(done),
                }),
                sent: 0,
                ended: false,
            }
            .boxed()
        })
    }
}

struct Entry {
    log: AccessLog,
    status: u16,
    path: String,
    done: Box<dyn FnOnce(Duration) + Send + Sync>,
}

struct Logged {
    body: Body,
    entry: Option<Entry>,
    sent: u64,
    ended: bool,
}

impl Drop for Logged {
    fn drop(&mut self) {
        let Some(e) = self.entry.take() else { return };
        let took = e.log.start.elapsed();
        // hyper stops polling a body that says it has ended (a whole body
        // after its one frame), so the end is asked of the body too.
        let ended = self.ended || hyper::body::Body::is_end_stream(&self.body);
        let outcome = if ended { "complete" } else { "aborted" };
        let remote = e
            .log
            .remote
            .map_or_else(|| "-".to_string(), |r| r.to_string());
        tracing::info!(
            target: "qr::access",
            remote = %remote,
            method = %e.log.method,
            uri = %e.log.target,
            status = e.status,
            bytes = self.sent,
            ms = took.as_secs_f64() * 1e3,
            outcome,
            path = %e.path,
            "{remote} {} {} {} {}B {:.1}ms {outcome}",
            e.log.method,
            e.log.target,
            e.status,
            self.sent,
            took.as_secs_f64() * 1e3,
        );
        (e.done)(took);
    }
}

impl hyper::body::Body for Logged {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        let r = Pin::new(&mut self.body).poll_frame(cx);
        match &r {
            Poll::Ready(Some(Ok(f))) => {
                if let Some(d) = f.data_ref() {
                    self.sent += d.len() as u64;
                }
            }
            Poll::Ready(None) => self.ended = true,
            _ => {}
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
