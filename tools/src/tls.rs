//! TLS for `qr`: a self-signed certificate made at start, and quinn client and
//! server configs around it. TLS 1.3 only (QUIC has nothing else); the client
//! verifies the server's certificate against the one generated here (`qr demo`)
//! or the one the server wrote out (`qr serve --cert-out` / `qr connect --cert`)
//! — there is no "skip verification" mode.

use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// The name the certificate is issued for and the client asks for (SNI).
pub(crate) const SERVER_NAME: &str = "localhost";

/// The ALPN protocol both sides speak.
pub(crate) const ALPN: &[u8] = b"qr-demo/1";

/// A matched pair of quinn configs plus what the handshake revealed.
pub(crate) struct TlsPair {
    /// Server config: the self-signed certificate and its key.
    pub(crate) server: quinn::ServerConfig,
    /// Client config: trusts exactly that certificate.
    pub(crate) client: quinn::ClientConfig,
    /// Learns the negotiated cipher suite from the client's key schedule.
    pub(crate) suite: Arc<SuiteProbe>,
}

/// Build the configs. `transport` goes on both sides.
pub(crate) fn configs(transport: Arc<quinn::TransportConfig>) -> Result<TlsPair> {
    let id = ServerIdentity::generate(&[])?;
    let server = server_config(&id, transport.clone())?;
    let suite = Arc::new(SuiteProbe::default());
    let client = client_config(vec![id.cert.clone()], transport, suite.clone())?;
    Ok(TlsPair {
        server,
        client,
        suite,
    })
}

/// A server's self-signed certificate and its private key.
pub(crate) struct ServerIdentity {
    /// The certificate (DER).
    pub(crate) cert: CertificateDer<'static>,
    /// The same certificate, PEM-encoded.
    pub(crate) cert_pem: String,
    key: PrivatePkcs8KeyDer<'static>,
}

impl ServerIdentity {
    /// A fresh self-signed certificate for [`SERVER_NAME`] plus `names` (host
    /// names or IP addresses; IPs become IP-address subject alternative names).
    pub(crate) fn generate(names: &[String]) -> Result<ServerIdentity> {
        let mut sans = vec![SERVER_NAME.to_string()];
        for n in names {
            if !sans.contains(n) {
                sans.push(n.clone());
            }
        }
        let ck = rcgen::generate_simple_self_signed(sans)
            .context("generating the self-signed certificate")?;
        Ok(ServerIdentity {
            cert: ck.cert.der().clone(),
            cert_pem: ck.cert.pem(),
            key: PrivatePkcs8KeyDer::from(ck.key_pair.serialize_der()),
        })
    }

    /// Write the certificate (not the key) to `path`: PEM when the file name ends
    /// in `.pem` or `.crt`, DER otherwise. Written to a temporary name and renamed,
    /// so a reader never sees half a certificate.
    pub(crate) fn write_cert(&self, path: &Path) -> Result<()> {
        let pem = matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("pem" | "crt")
        );
        let bytes: &[u8] = if pem {
            self.cert_pem.as_bytes()
        } else {
            self.cert.as_ref()
        };
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = std::path::PathBuf::from(tmp);
        std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))?;
        Ok(())
    }
}

/// Read the certificates in `path`: PEM (one or more `CERTIFICATE` blocks) or a
/// single DER certificate ([`quic_rdma::quic::tls::parse_certificates`]).
pub(crate) fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    quic_rdma::quic::tls::parse_certificates(&bytes).with_context(|| path.display().to_string())
}

/// Environment variable choosing the TLS 1.3 cipher suites every `qr` endpoint
/// offers and their order: `aes128` (default: AES-128-GCM first), `aes256`, or
/// `aes128-only` (see `quic_rdma::quic::suites`).
pub(crate) const CIPHERS_ENV: &str = "QR_TLS_CIPHERS";

/// The one `CryptoProvider` of every rustls config `qr` builds (this file's and
/// [`crate::pki`]'s): ring with the suites [`CIPHERS_ENV`] chooses. A value it
/// does not know is an error naming the choices.
pub(crate) fn provider() -> Result<Arc<rustls::crypto::CryptoProvider>> {
    use quic_rdma::quic::suites::CipherPreference;
    let pref = match std::env::var(CIPHERS_ENV) {
        Ok(v) => v
            .parse::<CipherPreference>()
            .with_context(|| format!("environment variable {CIPHERS_ENV}"))?,
        Err(_) => CipherPreference::default(),
    };
    Ok(pref.provider())
}

/// Server side: TLS 1.3, ALPN [`ALPN`], the identity's certificate and key.
pub(crate) fn server_config(
    id: &ServerIdentity,
    transport: Arc<quinn::TransportConfig>,
) -> Result<quinn::ServerConfig> {
    let provider = provider()?;
    let key = PrivateKeyDer::Pkcs8(id.key.clone_key());
    let mut server_tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .context("TLS 1.3 server config")?
        .with_no_client_auth()
        .with_single_cert(vec![id.cert.clone()], key)
        .context("server certificate")?;
    server_tls.alpn_protocols = vec![ALPN.to_vec()];
    server_tls.max_early_data_size = u32::MAX;
    let mut server = quinn::ServerConfig::with_crypto(Arc::new(
        QuicServerConfig::try_from(server_tls).context("QUIC server crypto")?,
    ));
    server.transport_config(transport);
    Ok(server)
}

/// Client side: TLS 1.3, ALPN [`ALPN`], trusting exactly `trusted` (verification
/// always on), reporting the suite to `suite`.
pub(crate) fn client_config(
    trusted: Vec<CertificateDer<'static>>,
    transport: Arc<quinn::TransportConfig>,
    suite: Arc<SuiteProbe>,
) -> Result<quinn::ClientConfig> {
    let provider = provider()?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in trusted {
        roots
            .add(cert)
            .context("trusting the server's certificate")?;
    }
    let mut client_tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .context("TLS 1.3 client config")?
        .with_root_certificates(roots)
        .with_no_client_auth();
    client_tls.alpn_protocols = vec![ALPN.to_vec()];
    client_tls.key_log = suite;
    let mut client = quinn::ClientConfig::new(Arc::new(
        QuicClientConfig::try_from(client_tls).context("QUIC client crypto")?,
    ));
    client.transport_config(transport);
    Ok(client)
}

/// What the TLS handshake agreed on, as far as it can be observed.
#[derive(Clone, Debug, Default)]
pub(crate) struct TlsInfo {
    /// Protocol version ("TLSv1.3").
    pub(crate) version: Option<String>,
    /// Negotiated cipher suite, when it could be told apart.
    pub(crate) cipher_suite: Option<String>,
    /// Negotiated ALPN protocol.
    pub(crate) alpn: Option<String>,
    /// The server name the client asked for.
    pub(crate) server_name: Option<String>,
}

impl TlsInfo {
    /// Collect from both ends of a connection and the probe of the client config:
    /// ALPN as the client saw it, the server name as the server received it (SNI).
    pub(crate) fn of(
        client: &quinn::Connection,
        server: &quinn::Connection,
        probe: &SuiteProbe,
    ) -> TlsInfo {
        let data = |c: &quinn::Connection| {
            c.handshake_data()
                .and_then(|d| d.downcast::<quinn::crypto::rustls::HandshakeData>().ok())
        };
        let alpn = data(client)
            .and_then(|hd| hd.protocol)
            .map(|p| String::from_utf8_lossy(&p).into_owned());
        let server_name = data(server).and_then(|hd| hd.server_name);
        let (version, cipher_suite) = probe.get();
        TlsInfo {
            version,
            cipher_suite,
            alpn,
            server_name,
        }
    }
}

impl TlsInfo {
    /// Collect from the client's end only (the server is another process): the
    /// server name is the one the client asked for and verified.
    pub(crate) fn client_side(
        client: &quinn::Connection,
        probe: &SuiteProbe,
        server_name: &str,
    ) -> TlsInfo {
        let alpn = client
            .handshake_data()
            .and_then(|d| d.downcast::<quinn::crypto::rustls::HandshakeData>().ok())
            .and_then(|hd| hd.protocol)
            .map(|p| String::from_utf8_lossy(&p).into_owned());
        let (version, cipher_suite) = probe.get();
        TlsInfo {
            version,
            cipher_suite,
            alpn,
            server_name: Some(server_name.to_string()),
        }
    }
}

/// A rustls `KeyLog` that keeps no secrets: it only notes which TLS 1.3 traffic
/// secret labels appear and how long the secrets are, which names the protocol
/// version (these labels exist only in TLS 1.3) and the suite's hash.
///
/// quinn does not expose the negotiated cipher suite. The secret length gives the
/// hash: 48 bytes is SHA-384, whose only TLS 1.3 suite is `TLS13_AES_256_GCM_SHA384`;
/// 32 bytes is SHA-256, shared by `TLS13_AES_128_GCM_SHA256` and
/// `TLS13_CHACHA20_POLY1305_SHA256` (reported as both).
#[derive(Debug, Default)]
pub(crate) struct SuiteProbe {
    secret_len: Mutex<Option<usize>>,
}

impl SuiteProbe {
    /// (version, cipher suite) once the handshake derived traffic secrets.
    fn get(&self) -> (Option<String>, Option<String>) {
        let len = *self.secret_len.lock().unwrap_or_else(|e| e.into_inner());
        match len {
            None => (None, None),
            Some(48) => (
                Some("TLSv1.3".into()),
                Some("TLS13_AES_256_GCM_SHA384".into()),
            ),
            Some(32) => (
                Some("TLSv1.3".into()),
                Some("TLS13_AES_128_GCM_SHA256 or TLS13_CHACHA20_POLY1305_SHA256".into()),
            ),
            Some(_) => (Some("TLSv1.3".into()), None),
        }
    }
}

impl rustls::KeyLog for SuiteProbe {
    fn log(&self, label: &str, _client_random: &[u8], secret: &[u8]) {
        if label == "CLIENT_TRAFFIC_SECRET_0" {
            *self.secret_len.lock().unwrap_or_else(|e| e.into_inner()) = Some(secret.len());
        }
    }

    fn will_log(&self, label: &str) -> bool {
        label == "CLIENT_TRAFFIC_SECRET_0"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A PEM file that does not decode names the file and keeps the decoder's
    /// error as the source (it was formatted into a string before).
    #[test]
    fn bad_pem_keeps_its_source() {
        let path = std::env::temp_dir().join(format!("qr-tls-bad-pem-{}.pem", std::process::id()));
        std::fs::write(&path, "-----BEGIN CERTIFICATE-----\n!!!\n").unwrap();
        let err = load_certs(&path).unwrap_err();
        std::fs::remove_file(&path).unwrap();
        let chain = format!("{err:#}");
        assert!(
            chain.starts_with(&format!("{}: bad PEM: ", path.display())),
            "{chain}"
        );
        assert!(
            err.root_cause()
                .downcast_ref::<rustls::pki_types::pem::Error>()
                .is_some(),
            "{err:?}"
        );
    }
}
