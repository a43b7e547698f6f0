//! The registry agent's upstream client against a registry that wants a
//! Bearer token (the flow of the Docker token spec: 401 + WWW-Authenticate →
//! token endpoint → retry with Authorization), served here by a small hyper
//! server that counts what it was asked: the token is fetched once and reused,
//! the client's Accept is forwarded, a blob streams whole and verified.
//! Address: 127.0.111.60, TCP 19160.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use quic_rdma_tools::image::digest::{Digest, Reference};
use quic_rdma_tools::image::source::Source;
use quic_rdma_tools::image::source_error::SourceError;
use quic_rdma_tools::image::upstream::Upstream;

const ADDR: &str = "127.0.111.60:19160";
const MANIFEST: &[u8] =
    br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json"}"#;

#[derive(Default)]
struct Seen {
    tokens: AtomicUsize,
    unauthorized: AtomicUsize,
    accept_ok: AtomicUsize,
}

fn answer(
    req: &Request<hyper::body::Incoming>,
    seen: &Seen,
    blob: &Bytes,
) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_string();
    if path == "/token" {
        seen.tokens.fetch_add(1, Ordering::SeqCst);
        let q = req.uri().query().unwrap_or("");
        assert!(q.contains("scope=repository%3Aqr%2Fauth%3Apull"), "{q}");
        assert!(q.contains("service=test-registry"), "{q}");
        return Response::new(Full::new(Bytes::from_static(br#"{"token":"s3cret"}"#)));
    }
    let authorized = req
        .headers()
        .get("authorization")
        .is_some_and(|v| v == "Bearer s3cret");
    if !authorized {
        seen.unauthorized.fetch_add(1, Ordering::SeqCst);
        return Response::builder()
            .status(401)
            .header(
                "www-authenticate",
                format!(
                    r#"Bearer realm="http://{ADDR}/token",service="test-registry",scope="repository:qr/auth:pull""#
                ),
            )
            .body(Full::new(Bytes::new()))
            .unwrap();
    }
    if path.contains("/manifests/") {
        let accept = req
            .headers()
            .get("accept")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if accept.contains("application/vnd.oci.image.manifest.v1+json") {
            seen.accept_ok.fetch_add(1, Ordering::SeqCst);
        }
        return Response::builder()
            .header("content-type", "application/vnd.oci.image.manifest.v1+json")
            .body(Full::new(Bytes::from_static(MANIFEST)))
            .unwrap();
    }
    if path.contains("/blobs/") {
        return Response::new(Full::new(blob.clone()));
    }
    Response::builder()
        .status(404)
        .body(Full::new(Bytes::new()))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bearer_token_flow_accept_and_blob() {
    let seen = Arc::new(Seen::default());
    let blob = Bytes::from(vec![7u8; 3 << 20]);
    let listener = tokio::net::TcpListener::bind(ADDR).await.unwrap();
    let (s2, b2) = (seen.clone(), blob.clone());
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let (s3, b3) = (s2.clone(), b2.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    let r = answer(&req, &s3, &b3);
                    async move { Ok::<_, Infallible>(r) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    let up = Upstream::new(&format!("http://{ADDR}")).unwrap();
    let accept = "application/vnd.oci.image.manifest.v1+json";
    let (body, mt, d) = up
        .manifest("qr/auth", &Reference::Tag("v1".into()), accept)
        .await
        .unwrap();
    assert_eq!(&body[..], MANIFEST);
    assert_eq!(mt, accept);
    assert_eq!(d, Digest::of(MANIFEST));
    // By digest, with the token already held: no second 401, no second token.
    up.manifest("qr/auth", &Reference::Digest(d), accept)
        .await
        .unwrap();
    // A wrong digest is refused, not returned.
    let wrong = Digest::of(b"other");
    assert!(matches!(
        up.manifest("qr/auth", &Reference::Digest(wrong), accept)
            .await,
        Err(SourceError::DigestMismatch { .. })
    ));
    let bd = Digest::of(&blob);
    assert_eq!(
        up.blob_size("qr/auth", &bd).await.unwrap(),
        blob.len() as u64
    );
    let src = Source::Upstream(up.into());
    let (mut reader, size) = src.blob("qr/auth", &bd).await.unwrap();
    assert_eq!(size, blob.len() as u64);
    let mut got = Vec::new();
    while let Some(p) = reader.next().await.unwrap() {
        got.extend_from_slice(&p);
    }
    assert_eq!(Digest::of(&got), bd);
    assert_eq!(seen.tokens.load(Ordering::SeqCst), 1);
    assert_eq!(seen.unauthorized.load(Ordering::SeqCst), 1);
    assert_eq!(seen.accept_ok.load(Ordering::SeqCst), 3);

    // An upstream nobody listens on: the error names the fix.
    let dead = Upstream::new("http://127.0.111.60:19161").unwrap();
    let e = dead
        .manifest("qr/auth", &Reference::Tag("v1".into()), "")
        .await
        .unwrap_err();
    assert!(matches!(e, SourceError::Unreachable(_)), "{e}");
    assert!(e.to_string().contains("--upstream"), "{e}");
}
