//! hyper on a [`crate::listener`]: every connection admitted under its cap,
//! its request head timed (hyper's header read timeout, which also bounds the
//! wait between keep-alive requests), its writes under the stall timeout, and
//! each request marked busy until its response body is sent, so an eviction
//! only ever takes an idle connection.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use crate::listener::{self, Busy, Ended, Limits, ListenerStats, StallTimeout};

/// The response body type.
pub type Body = BoxBody<Bytes, std::io::Error>;

/// A body of `b`, whole.
pub fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).map_err(|n| match n {}).boxed()
}

/// Serve `service` on `tcp` under `limits` until the task is dropped.
pub async fn serve<S, Fut>(tcp: TcpListener, limits: Limits, stats: Arc<ListenerStats>, service: S)
where
    S: Fn(Request<Incoming>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<Body>> + Send + 'static,
{
    let service = Arc::new(service);
    listener::serve(tcp, limits, stats, move |sock, slot| {
        let service = service.clone();
        let remote = sock.peer_addr().ok().map(super::Remote);
        async move {
            let svc = hyper::service::service_fn(move |mut req: Request<Incoming>| {
                if let Some(r) = remote {
                    req.extensions_mut().insert(r);
                }
                let busy = slot.busy();
                let answer = service(req);
                async move {
                    // Busy until hyper drops the body: sent, or the
                    // connection gone.
                    let resp = answer
                        .await
                        .map(|body| Guarded { body, _busy: busy }.boxed());
                    Ok::<_, Infallible>(resp)
                }
            });
            let io = TokioIo::new(StallTimeout::new(sock, limits.stall_timeout));
            let r = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.request_timeout)
                .serve_connection(io, svc)
                .await;
            match r {
                Ok(()) => Ended::Closed,
                Err(e) if timed_out(&e) => Ended::TimedOut,
                Err(e) => {
                    tracing::debug!("HTTP connection: {e}");
                    Ended::Closed
                }
            }
        }
    })
    .await
}

/// A body that holds its request's [`Busy`] mark until dropped; size and
/// end of stream pass through (so a whole body keeps its Content-Length).
struct Guarded {
    body: Body,
    _busy: Busy,
}

impl hyper::body::Body for Guarded {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// hyper's header timeout, or the stall timeout's `TimedOut` beneath it.
fn timed_out(e: &hyper::Error) -> bool {
    if e.is_timeout() {
        return true;
    }
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return io.kind() == std::io::ErrorKind::TimedOut;
        }
        src = s.source();
    }
    false
}
