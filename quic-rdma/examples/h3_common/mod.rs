//! HTTP/3 over the fabric with the unmodified `h3` and `h3-quinn` crates: the
//! server and client halves shared by `examples/h3_server.rs`,
//! `examples/h3_client.rs` and `tests/h3_fabric.rs`.
//!
//! Nothing here knows about RDMA: it takes a `quinn::Endpoint` and runs h3 on it
//! exactly as on UDP. The only fabric-specific lines are where the endpoint is
//! made (`quinn::Endpoint::new_with_abstract_socket` over an `RdmaUdpSocket`)
//! and the transport config (`quinn_adapter::FabricConfig::new(mtu).transport()`), in the callers.
//!
//! Resource: `GET /bytes/<n>` answers `n` bytes of deterministic data
//! ([`body_chunk`]), so a client can check the sha256 of what it fetched
//! against [`expected_sha256`] without the body crossing any other channel.
#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{Buf, Bytes};
use sha2::{Digest, Sha256};

/// Boxed error for the examples.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// The ALPN token of HTTP/3 (RFC 9114 §3.1).
pub const ALPN_H3: &[u8] = b"h3";

/// H3_NO_ERROR (RFC 9114 §8.1).
pub const H3_NO_ERROR: u32 = 0x100;

/// Bytes per body chunk the server writes.
const CHUNK: usize = 64 * 1024;

/// Chunk `i` of a deterministic body (xorshift64 seeded by the chunk index).
pub fn body_chunk(buf: &mut [u8], i: u64) {
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for b in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        b.copy_from_slice(&x.to_le_bytes()[..b.len()]);
    }
}

/// The sha256 of the `len`-byte body of `/bytes/<len>`, computed locally.
pub fn expected_sha256(len: u64) -> [u8; 32] {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let (mut left, mut i) = (len, 0);
    while left > 0 {
        let n = left.min(CHUNK as u64) as usize;
        body_chunk(&mut buf[..n], i);
        h.update(&buf[..n]);
        left -= n as u64;
        i += 1;
    }
    h.finalize().into()
}

/// Lower-case hex.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A self-signed certificate for "localhost": (DER certificate, server config
/// announcing ALPN h3 with the fabric transport `transport`).
pub fn server_config(
    transport: Arc<quinn::TransportConfig>,
) -> Result<
    (
        rustls::pki_types::CertificateDer<'static>,
        quinn::ServerConfig,
    ),
    Error,
> {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()])?;
    let cert = ck.cert.der().clone();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(ck.key_pair.serialize_der().into());
    let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])?
    .with_no_client_auth()
    .with_single_cert(vec![cert.clone()], key)?;
    tls.alpn_protocols = vec![ALPN_H3.to_vec()];
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls)?;
    let mut cfg = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    cfg.transport_config(transport);
    Ok((cert, cfg))
}

/// A client config trusting `cert`, offering ALPN h3, with `transport`.
pub fn client_config(
    cert: rustls::pki_types::CertificateDer<'static>,
    transport: Arc<quinn::TransportConfig>,
) -> Result<quinn::ClientConfig, Error> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert)?;
    let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])?
    .with_root_certificates(roots)
    .with_no_client_auth();
    tls.alpn_protocols = vec![ALPN_H3.to_vec()];
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls)?;
    let mut cfg = quinn::ClientConfig::new(Arc::new(crypto));
    cfg.transport_config(transport);
    Ok(cfg)
}

/// Accept connections on `endpoint` and serve HTTP/3 on each until the endpoint closes.
pub async fn serve(endpoint: quinn::Endpoint) {
    while let Some(incoming) = endpoint.accept().await {
        tokio::spawn(async move {
            if let Err(e) = serve_connection(incoming).await {
                eprintln!("h3 server: connection: {e}");
            }
        });
    }
}

async fn serve_connection(incoming: quinn::Incoming) -> Result<(), Error> {
    let conn = incoming.await?;
    let mut h3 = h3::server::Connection::new(h3_quinn::Connection::new(conn)).await?;
    loop {
        match h3.accept().await {
            Ok(Some(resolver)) => {
                tokio::spawn(async move {
                    if let Err(e) = serve_request(resolver).await {
                        eprintln!("h3 server: request: {e}");
                    }
                });
            }
            Ok(None) => return Ok(()),
            // The client closing the connection ends it too.
            Err(e) if e.is_h3_no_error() => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    }
}

async fn serve_request(
    resolver: h3::server::RequestResolver<h3_quinn::Connection, Bytes>,
) -> Result<(), Error> {
    let (req, mut stream) = resolver.resolve_request().await?;
    // Read the request to its end (a GET has no body: this waits for the FIN).
    // Answering first and dropping the stream would abandon its receive half,
    // and quinn then sends STOP_SENDING with code 0, which a client whose FIN
    // is still on the way sees as a reset of its request (RFC 9114 §4.1.2).
    while stream.recv_data().await?.is_some() {}
    let len = req
        .uri()
        .path()
        .strip_prefix("/bytes/")
        .and_then(|n| n.parse::<u64>().ok());
    let Some(len) = len else {
        let resp = http::Response::builder().status(404).body(())?;
        stream.send_response(resp).await?;
        stream.finish().await?;
        return Ok(());
    };
    let resp = http::Response::builder()
        .status(200)
        .header("content-length", len)
        .header("content-type", "application/octet-stream")
        .body(())?;
    stream.send_response(resp).await?;
    let (mut left, mut i) = (len, 0);
    while left > 0 {
        let n = left.min(CHUNK as u64) as usize;
        let mut buf = vec![0u8; n];
        body_chunk(&mut buf, i);
        stream.send_data(Bytes::from(buf)).await?;
        left -= n as u64;
        i += 1;
    }
    stream.finish().await?;
    Ok(())
}

/// What a fetch got.
#[derive(Debug)]
pub struct Fetched {
    /// HTTP status.
    pub status: u16,
    /// Body bytes received.
    pub bytes: u64,
    /// sha256 of the body received.
    pub sha256: [u8; 32],
}

/// Connect to `server` ("localhost" in its certificate) and `GET path` over HTTP/3.
pub async fn fetch(
    endpoint: &quinn::Endpoint,
    cfg: quinn::ClientConfig,
    server: SocketAddr,
    path: &str,
) -> Result<Fetched, Error> {
    let conn = endpoint.connect_with(cfg, server, "localhost")?.await?;
    let (mut driver, mut send) = h3::client::new(h3_quinn::Connection::new(conn.clone())).await?;
    let drive = tokio::spawn(async move { driver.wait_idle().await });
    let req = http::Request::get(format!("https://localhost{path}")).body(())?;
    let mut stream = send.send_request(req).await?;
    stream.finish().await?;
    let resp = stream.recv_response().await?;
    let mut h = Sha256::new();
    let mut bytes = 0u64;
    while let Some(mut chunk) = stream.recv_data().await? {
        while chunk.has_remaining() {
            let c = chunk.chunk();
            h.update(c);
            bytes += c.len() as u64;
            let n = c.len();
            chunk.advance(n);
        }
    }
    drop(stream);
    drop(send);
    // H3_NO_ERROR (RFC 9114 §8.1): a graceful close, not an error, to the server.
    conn.close(H3_NO_ERROR.into(), b"done");
    let _ = drive.await;
    Ok(Fetched {
        status: resp.status().as_u16(),
        bytes,
        sha256: h.finalize().into(),
    })
}
