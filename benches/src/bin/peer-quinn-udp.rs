//! Standalone quinn 0.11 over UDP, one process per side, as quinn's own
//! documentation and examples set it up (`Endpoint::new` with an
//! `EndpointConfig`, `ServerConfig`/`ClientConfig` from a rustls config,
//! `open_bi`/`accept_bi`, `write_chunk`/`read`), a current-thread tokio runtime,
//! the process pinned to one CPU. MTU 4096 on both sides:
//! `EndpointConfig::max_udp_payload_size(4096)` and the transport's
//! `initial_mtu`/`min_mtu` 4096 (loopback carries it, so no discovery is needed).
//! Tuned exactly as `compare`'s rows (equal tuning on both sides of every
//! comparison): MTU discovery off, initial RTT 2 ms, 16 MiB stream and 64 MiB
//! connection receive windows, 64 MiB send window, 4 MiB datagram receive
//! buffer, 300 ms keep-alive and 1.5 s idle timeout (every value of
//! `quic_rdma::quinn_adapter::transport_config`, spelled out here), and 4 MiB
//! socket buffers (the `soft` provider's). The client builds its payload and
//! the payload's sha256 before it dials, as the harness's rows do. TLS 1.3 with
//! `TLS13_AES_128_GCM_SHA256` only (the suite every row of `compare` runs).
//!
//! ```text
//! peer-quinn-udp server --addr 127.0.130.1:19700 --bytes 536870912 --cpu 1 --cert /tmp/c.der
//! peer-quinn-udp client --addr 127.0.130.1:19700 --bytes 536870912 --cpu 0 --cert /tmp/c.der
//! ```
//! Each prints one JSON line ([`quic_rdma_benches::peer::PeerOutcome`]).

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

use quic_rdma_benches::cpu::CpuSpan;
use quic_rdma_benches::data::{self, SinkBuf};
use quic_rdma_benches::peer::{PeerArgs, PeerOutcome, Role};
use quic_rdma_benches::rows::WRITE_CHUNK;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

const MTU: u16 = 4096;
const SUITE: &str = "TLS13_AES_128_GCM_SHA256";

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    let mut p = rustls::crypto::ring::default_provider();
    p.cipher_suites = vec![rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256];
    Arc::new(p)
}

fn transport() -> anyhow::Result<Arc<quinn::TransportConfig>> {
    let mut t = quinn::TransportConfig::default();
    t.initial_mtu(MTU)
        .min_mtu(MTU)
        .mtu_discovery_config(None)
        .initial_rtt(Duration::from_millis(2))
        .stream_receive_window(quinn::VarInt::from_u32(16 << 20))
        .receive_window(quinn::VarInt::from_u32(64 << 20))
        .send_window(64 << 20)
        .datagram_receive_buffer_size(Some(4 << 20))
        .keep_alive_interval(Some(Duration::from_millis(300)))
        .max_idle_timeout(Some(Duration::from_millis(1500).try_into()?));
    Ok(Arc::new(t))
}

fn endpoint(
    bind: SocketAddr,
    server: Option<quinn::ServerConfig>,
) -> anyhow::Result<quinn::Endpoint> {
    let mut ec = quinn::EndpointConfig::default();
    ec.max_udp_payload_size(MTU)?;
    let sock = UdpSocket::bind(bind)?;
    let s = socket2::SockRef::from(&sock);
    s.set_recv_buffer_size(4 << 20)?;
    s.set_send_buffer_size(4 << 20)?;
    Ok(quinn::Endpoint::new(
        ec,
        server,
        sock,
        Arc::new(quinn::TokioRuntime),
    )?)
}

async fn server(a: &PeerArgs) -> anyhow::Result<PeerOutcome> {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()])?;
    std::fs::write(&a.cert, ck.cert.der())?;
    let key = PrivateKeyDer::Pkcs8(ck.key_pair.serialize_der().into());
    let tls = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_no_client_auth()
        .with_single_cert(vec![ck.cert.der().clone()], key)?;
    let mut sc = quinn::ServerConfig::with_crypto(Arc::new(
        quinn::crypto::rustls::QuicServerConfig::try_from(tls)?,
    ));
    sc.transport_config(transport()?);
    let ep = endpoint(a.addr, Some(sc))?;
    quic_rdma_benches::procs::announce(a.addr)?;

    let mut sink = SinkBuf::new(a.bytes, true);
    let conn = ep
        .accept()
        .await
        .ok_or_else(|| anyhow::anyhow!("endpoint closed"))?
        .await?;
    let cpu0 = CpuSpan::start();
    let (mut send, mut recv) = conn.accept_bi().await?;
    while sink.received() < a.bytes {
        let n = recv.read(sink.spare()).await?;
        let n = n.ok_or_else(|| anyhow::anyhow!("peer ended the stream early"))?;
        sink.advance(n);
        anyhow::ensure!(!sink.overrun(), "peer sent more than announced");
    }
    send.write_all(&[1]).await?;
    let cpu = cpu0.stop();
    // Hash only after the client's end of stream, which it sends once it has
    // the acknowledgement: quinn sends the acknowledgement when its driver
    // task runs on this thread, and hashing first would hold it back.
    anyhow::ensure!(
        recv.read(&mut [0u8; 1]).await?.is_none(),
        "peer sent more than announced"
    );
    let digest = sink.digest().expect("verifying sink");
    send.write_all(&digest).await?;
    send.finish()?;
    conn.closed().await;
    Ok(PeerOutcome {
        role: "server".into(),
        bytes: sink.received(),
        secs: 0.0,
        cpu,
        ok: sink.received() == a.bytes,
        suite: SUITE.into(),
    })
}

async fn client(a: &PeerArgs) -> anyhow::Result<PeerOutcome> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from(std::fs::read(&a.cert)?))?;
    let tls = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let mut cc = quinn::ClientConfig::new(Arc::new(
        quinn::crypto::rustls::QuicClientConfig::try_from(tls)?,
    ));
    cc.transport_config(transport()?);
    // The payload and its digest are ready before dialing, as a client has
    // its data before it connects: hashing 1 GiB between the handshake and
    // the first write stalls this thread ~0.5 s with quinn's driver on it,
    // and the transfer then starts slowly (~70-100 ms lost at its start in
    // alternating runs, `benches/results/peers.md`).
    let pattern = data::pattern();
    let expected = data::expected_digest(&pattern, a.bytes);
    let pattern = bytes::Bytes::from(pattern);
    let ep = endpoint(SocketAddr::new(a.addr.ip(), 0), None)?;
    let conn = ep.connect_with(cc, a.addr, "localhost")?.await?;
    let (mut send, mut recv) = conn.open_bi().await?;
    let t0 = Instant::now();
    let cpu0 = CpuSpan::start();
    let mut off = 0u64;
    while off < a.bytes {
        let s = data::bytes_at(&pattern, off, WRITE_CHUNK, a.bytes);
        off += s.len() as u64;
        send.write_chunk(s).await?;
    }
    let mut ack = [0u8; 1];
    recv.read_exact(&mut ack).await?;
    let secs = t0.elapsed().as_secs_f64();
    let cpu = cpu0.stop();
    // The end of the stream tells the server to hash and reply.
    send.finish()?;
    let mut got = [0u8; 32];
    recv.read_exact(&mut got).await?;
    if std::env::var_os("BENCH_QUINN_STATS").is_some() {
        eprintln!("{:?}", conn.stats().path);
    }
    conn.close(0u32.into(), b"done");
    ep.wait_idle().await;
    Ok(PeerOutcome {
        role: "client".into(),
        bytes: a.bytes,
        secs,
        cpu,
        ok: got == expected,
        suite: SUITE.into(),
    })
}

fn main() -> anyhow::Result<()> {
    let a = PeerArgs::parse()?;
    a.pin();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let out = rt.block_on(async {
        match a.role {
            Role::Server => server(&a).await,
            Role::Client => client(&a).await,
        }
    })?;
    out.print()
}
