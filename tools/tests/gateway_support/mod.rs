//! The QUIC workload and TLS setup the gateway tests share: the same protocol
//! as `qr serve` / `qr connect` (`crate::workload`), and self-signed
//! certificates each client trusts alone.
#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};

/// Deterministic data, chunk `i`.
pub fn fill(buf: &mut [u8], i: u64) {
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for b in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        b.copy_from_slice(&x.to_le_bytes()[..b.len()]);
    }
}

/// Client: send `len` bytes on a new stream, read the server's verdict
/// (8-byte count, sha256); assert both equal what was sent.
pub async fn send_and_verify(conn: &quinn::Connection, len: u64) {
    let (mut tx, mut rx) = conn.open_bi().await.unwrap();
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let (mut left, mut i) = (len, 0);
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        fill(&mut buf[..n], i);
        h.update(&buf[..n]);
        tx.write_all(&buf[..n]).await.unwrap();
        left -= n as u64;
        i += 1;
    }
    tx.finish().unwrap();
    let sent: [u8; 32] = h.finalize().into();
    let verdict = rx.read_to_end(40).await.unwrap();
    assert_eq!(u64::from_be_bytes(verdict[..8].try_into().unwrap()), len);
    assert_eq!(
        &verdict[8..],
        &sent,
        "sha256 at the server equals the one sent"
    );
}

/// Server: read the first stream to its end, answer count + sha256 (returned),
/// then echo a second stream (`qr connect`'s ping-pong) if one comes.
pub async fn receive_and_answer(conn: quinn::Connection) -> (u64, [u8; 32]) {
    let (mut tx, mut rx) = conn.accept_bi().await.unwrap();
    let mut h = Sha256::new();
    let mut n = 0u64;
    while let Some(c) = rx.read_chunk(usize::MAX, true).await.unwrap() {
        n += c.bytes.len() as u64;
        h.update(&c.bytes);
    }
    let digest: [u8; 32] = h.finalize().into();
    tx.write_all(&n.to_be_bytes()).await.unwrap();
    tx.write_all(&digest).await.unwrap();
    tx.finish().unwrap();
    let c = conn.clone();
    tokio::spawn(async move {
        if let Ok((mut tx, mut rx)) = c.accept_bi().await {
            while let Ok(Some(chunk)) = rx.read_chunk(usize::MAX, true).await {
                if tx.write_chunk(chunk.bytes).await.is_err() {
                    return;
                }
            }
            let _ = tx.finish();
        }
    });
    (n, digest)
}

/// The application protocol of `qr serve` / `qr connect`'s workload (ALPN).
pub const ALPN: &[u8] = b"qr-demo/1";

pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A self-signed certificate for "localhost": (DER, server config with `transport`).
pub fn server_cert(
    transport: Arc<quinn::TransportConfig>,
) -> (
    rustls::pki_types::CertificateDer<'static>,
    quinn::ServerConfig,
) {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let cert = ck.cert.der().clone();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(ck.key_pair.serialize_der().into());
    let mut tls = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.clone()], key)
        .unwrap();
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls).unwrap();
    let mut cfg = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    cfg.transport_config(transport);
    (cert, cfg)
}

pub fn client_trusting(
    cert: rustls::pki_types::CertificateDer<'static>,
    transport: Arc<quinn::TransportConfig>,
) -> quinn::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert).unwrap();
    let mut tls = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap();
    let mut c = quinn::ClientConfig::new(Arc::new(crypto));
    c.transport_config(transport);
    c
}

/// A stock UDP-side transport whose path-MTU search may go up to 4096 bytes
/// (quinn's default stops at 1452, below any fabric MTU).
pub fn udp_transport() -> Arc<quinn::TransportConfig> {
    let mut mtud = quinn::MtuDiscoveryConfig::default();
    mtud.upper_bound(4096).interval(Duration::from_millis(200));
    let mut t = quinn::TransportConfig::default();
    t.mtu_discovery_config(Some(mtud));
    Arc::new(t)
}

/// Scrape a gateway's `/metrics` at `addr` until its own samples
/// (`qr_gateway_*`; the scrapes themselves move the listener's `qr_tcp_*`)
/// stay the same for 300 ms, and assert they reconcile: datagrams in =
/// datagrams out + every `qr_gateway_drop_*_total` the gateway exports
/// (read from the text, so a new kind of drop needs no list here).
pub fn settled_scrape(addr: &str) -> String {
    let gateway = |t: &str| -> Vec<String> {
        t.lines()
            .filter(|l| l.starts_with("qr_gateway_"))
            .map(str::to_string)
            .collect()
    };
    let scrape =
        || crate::common::http::when_up(addr, || crate::common::http::get_ok(addr, "/metrics"));
    let mut last = scrape();
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let now = scrape();
        if gateway(&now) == gateway(&last) {
            let value = |l: &str| -> u64 {
                let v = l.rsplit(' ').next().unwrap();
                v.parse::<f64>().unwrap() as u64
            };
            let sum = |names: &[&str]| -> u64 {
                gateway(&now)
                    .iter()
                    .filter(|l| {
                        names
                            .iter()
                            .any(|n| l.starts_with(&format!("qr_gateway_{n} ")))
                    })
                    .map(|l| value(l))
                    .sum()
            };
            let inn = sum(&["udp_rx_datagrams_total", "fabric_rx_datagrams_total"]);
            let out = sum(&["udp_tx_datagrams_total", "fabric_tx_datagrams_total"]);
            let drop_lines: Vec<String> = gateway(&now)
                .into_iter()
                .filter(|l| l.starts_with("qr_gateway_drop_") && l.contains("_total "))
                .collect();
            assert!(!drop_lines.is_empty(), "no drop counters:\n{now}");
            let drops: u64 = drop_lines.iter().map(|l| value(l)).sum();
            assert_eq!(inn, out + drops, "gateway counters reconcile:\n{now}");
            return now;
        }
        last = now;
    }
}
