//! Standalone TCP + TLS 1.3 (tokio-rustls), one process per side, as the
//! tokio-rustls examples set it up (`TlsAcceptor`/`TlsConnector` over a
//! `TcpStream`, `write_all`/`read`), a current-thread tokio runtime, the
//! process pinned to one CPU, `TCP_NODELAY`, cipher suite
//! `TLS13_AES_128_GCM_SHA256` only (checked after the handshake). Kernel socket
//! buffers are the defaults.
//!
//! ```text
//! peer-tcp-rustls server --addr 127.0.130.1:19701 --bytes 536870912 --cpu 1 --cert /tmp/c.der
//! peer-tcp-rustls client --addr 127.0.130.1:19701 --bytes 536870912 --cpu 0 --cert /tmp/c.der
//! ```
//! Each prints one JSON line ([`quic_rdma_benches::peer::PeerOutcome`]).

use std::sync::Arc;
use std::time::Instant;

use quic_rdma_benches::cpu::CpuSpan;
use quic_rdma_benches::data::{self, SinkBuf};
use quic_rdma_benches::peer::{PeerArgs, PeerOutcome, Role};
use quic_rdma_benches::rows::WRITE_CHUNK;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    let mut p = rustls::crypto::ring::default_provider();
    p.cipher_suites = vec![rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256];
    Arc::new(p)
}

fn suite_name(c: &rustls::CommonState) -> String {
    c.negotiated_cipher_suite()
        .map_or_else(|| "none".into(), |s| format!("{:?}", s.suite()))
}

async fn server(a: &PeerArgs) -> anyhow::Result<PeerOutcome> {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()])?;
    std::fs::write(&a.cert, ck.cert.der())?;
    let key = PrivateKeyDer::Pkcs8(ck.key_pair.serialize_der().into());
    let tls = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_no_client_auth()
        .with_single_cert(vec![ck.cert.der().clone()], key)?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let listener = TcpListener::bind(a.addr).await?;
    quic_rdma_benches::procs::announce(a.addr)?;

    let mut sink = SinkBuf::new(a.bytes, true);
    let (tcp, _) = listener.accept().await?;
    tcp.set_nodelay(true)?;
    let mut s = acceptor.accept(tcp).await?;
    let suite = suite_name(s.get_ref().1);
    let cpu0 = CpuSpan::start();
    while sink.received() < a.bytes {
        let n = s.read(sink.spare()).await?;
        anyhow::ensure!(n > 0, "peer ended the stream early");
        sink.advance(n);
        anyhow::ensure!(!sink.overrun(), "peer sent more than announced");
    }
    s.write_all(&[1]).await?;
    s.flush().await?;
    let cpu = cpu0.stop();
    // The same exchange as the quinn pair: hash once the client has the
    // acknowledgement and has ended its half.
    anyhow::ensure!(
        s.read(&mut [0u8; 1]).await? == 0,
        "peer sent more than announced"
    );
    let digest = sink.digest().expect("verifying sink");
    s.write_all(&digest).await?;
    s.shutdown().await?;
    Ok(PeerOutcome {
        role: "server".into(),
        bytes: sink.received(),
        secs: 0.0,
        cpu,
        ok: sink.received() == a.bytes,
        suite,
    })
}

async fn client(a: &PeerArgs) -> anyhow::Result<PeerOutcome> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from(std::fs::read(&a.cert)?))?;
    let tls = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(tls));
    // The payload and its digest are ready before dialing, as in the
    // harness's rows and the quinn pair (a client has its data before it
    // connects).
    let pattern = data::pattern();
    let expected = data::expected_digest(&pattern, a.bytes);
    let tcp = TcpStream::connect(a.addr).await?;
    tcp.set_nodelay(true)?;
    let mut s = connector
        .connect(ServerName::try_from("localhost")?, tcp)
        .await?;
    let suite = suite_name(s.get_ref().1);
    let t0 = Instant::now();
    let cpu0 = CpuSpan::start();
    let mut off = 0u64;
    while off < a.bytes {
        let chunk = data::slice_at(&pattern, off, WRITE_CHUNK);
        let chunk = &chunk[..chunk.len().min((a.bytes - off) as usize)];
        s.write_all(chunk).await?;
        off += chunk.len() as u64;
    }
    // rustls may still hold the last records if the socket was full.
    s.flush().await?;
    let mut ack = [0u8; 1];
    s.read_exact(&mut ack).await?;
    let secs = t0.elapsed().as_secs_f64();
    let cpu = cpu0.stop();
    // Half-close as the TLS close_notify: the server hashes and replies.
    s.shutdown().await?;
    let mut got = [0u8; 32];
    s.read_exact(&mut got).await?;
    Ok(PeerOutcome {
        role: "client".into(),
        bytes: a.bytes,
        secs,
        cpu,
        ok: got == expected,
        suite,
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
