//! TLS for `qr`: a self-signed certificate made at start, and quinn client and
//! server configs around it. TLS 1.3 only (QUIC has nothing else); the client
//! verifies the server's certificate against the one generated here (`qr demo`)
//! or the one the server wrote out (`qr serve --cert-out` / `qr connect --cert`)
//! — there is no "skip verification" mode. The rustls configs themselves come
//! from [`TlsSettings`], as every other endpoint's do.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use quic_rdma::quic::{
    CipherPreference, SuiteClientConfig, SuiteHandshakeData, TlsSettings, CIPHERS_ENV,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// The name the certificate is issued for and the client asks for (SNI).
pub(crate) const SERVER_NAME: &str = "localhost";

/// The ALPN protocol both sides speak.
pub(crate) const ALPN: &[u8] = b"qr-demo/1";

/// A matched pair of TLS configs, without a transport (the endpoint builder,
/// `crate::endpoint::FabricEndpoint`, adds the fabric's).
pub(crate) struct TlsPair {
    /// Server settings: the self-signed certificate and its key.
    pub(crate) server: TlsSettings,
    /// Client config: trusts exactly that certificate.
    pub(crate) client: quinn::ClientConfig,
}

/// Build the configs around a fresh self-signed certificate.
pub(crate) fn configs() -> Result<TlsPair> {
    let id = ServerIdentity::generate(&[])?;
    let server = server_settings(&id)?;
    let client = client_config(vec![id.cert.clone()])?;
    Ok(TlsPair { server, client })
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
/// single DER certificate ([`quic_rdma::quic::parse_certificates`]).
pub(crate) fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    quic_rdma::quic::parse_certificates(&bytes).with_context(|| path.display().to_string())
}

/// The TLS 1.3 cipher suites every `qr` endpoint offers and their order,
/// from the environment ([`CIPHERS_ENV`]: `aes128` by default, `aes256`,
/// `aes128-only`). A value it does not know is an error naming the variable
/// and the choices.
pub(crate) fn ciphers() -> Result<CipherPreference> {
    CipherPreference::from_env().with_context(|| format!("environment variable {CIPHERS_ENV}"))
}

/// Server side: TLS 1.3, ALPN [`ALPN`], the identity's certificate and key,
/// 0-RTT accepted, NEW_TOKEN frames sent (what `qr` servers always sent).
pub(crate) fn server_settings(id: &ServerIdentity) -> Result<TlsSettings> {
    Ok(TlsSettings {
        identity: Some((
            vec![id.cert.clone()],
            PrivateKeyDer::Pkcs8(id.key.clone_key()),
        )),
        alpn: vec![ALPN.to_vec()],
        accept_0rtt: true,
        ciphers: ciphers()?,
        new_tokens: true,
        ..TlsSettings::default()
    })
}

/// Client side: TLS 1.3, ALPN [`ALPN`], trusting exactly `trusted` (verification
/// always on), no 0-RTT offer, no transport (the endpoint builder adds it).
/// Its connections tell the cipher suite they negotiated
/// ([`SuiteClientConfig`], read by [`TlsInfo`]).
pub(crate) fn client_config(trusted: Vec<CertificateDer<'static>>) -> Result<quinn::ClientConfig> {
    let settings = TlsSettings {
        roots: trusted,
        alpn: vec![ALPN.to_vec()],
        offer_0rtt: false,
        ciphers: ciphers()?,
        ..TlsSettings::default()
    };
    let crypto = settings
        .client_crypto()
        .context("TLS client config (trusting the server's certificate)")?;
    Ok(quinn::ClientConfig::new(Arc::new(SuiteClientConfig::new(
        crypto,
    ))))
}

/// What the TLS handshake agreed on.
#[derive(Clone, Debug, Default)]
pub(crate) struct TlsInfo {
    /// Protocol version of the negotiated suite ("TLSv1.3").
    pub(crate) version: Option<String>,
    /// Negotiated cipher suite, e.g. "TLS13_AES_128_GCM_SHA256".
    pub(crate) cipher_suite: Option<String>,
    /// Negotiated ALPN protocol.
    pub(crate) alpn: Option<String>,
    /// The server name the client asked for.
    pub(crate) server_name: Option<String>,
}

impl TlsInfo {
    /// Collect from both ends of a connection whose client side was made with
    /// [`client_config`]: version, suite and ALPN as the client saw them, the
    /// server name as the server received it (SNI).
    pub(crate) fn of(client: &quinn::Connection, server: &quinn::Connection) -> TlsInfo {
        let server_name = server
            .handshake_data()
            .and_then(|d| d.downcast::<quinn::crypto::rustls::HandshakeData>().ok())
            .and_then(|hd| hd.server_name);
        TlsInfo {
            server_name,
            ..TlsInfo::of_client(client)
        }
    }

    /// Collect from the client's end only (the server is another process): the
    /// server name is the one the client asked for and verified.
    pub(crate) fn client_side(client: &quinn::Connection, server_name: &str) -> TlsInfo {
        TlsInfo {
            server_name: Some(server_name.to_string()),
            ..TlsInfo::of_client(client)
        }
    }

    /// Version, suite and ALPN from a [`client_config`] connection; no server name.
    fn of_client(client: &quinn::Connection) -> TlsInfo {
        let Some(data) = client
            .handshake_data()
            .and_then(|d| d.downcast::<SuiteHandshakeData>().ok())
        else {
            return TlsInfo::default();
        };
        let suite = data.cipher_suite;
        TlsInfo {
            version: suite.map(|s| version_name(s.version().version)),
            cipher_suite: suite.map(|s| {
                let id = s.suite();
                id.as_str()
                    .map_or_else(|| format!("{id:?}"), str::to_string)
            }),
            alpn: data
                .handshake
                .protocol
                .map(|p| String::from_utf8_lossy(&p).into_owned()),
            server_name: None,
        }
    }
}

/// "TLSv1.3" for TLS 1.3 (rustls spells it `TLSv1_3`).
fn version_name(v: rustls::ProtocolVersion) -> String {
    match v {
        rustls::ProtocolVersion::TLSv1_3 => "TLSv1.3".into(),
        rustls::ProtocolVersion::TLSv1_2 => "TLSv1.2".into(),
        other => format!("{other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::{self, FabricOptions};
    use quic_rdma::fabric::Provider;
    use quic_rdma::quinn_adapter::FabricConfig;
    use quinn::crypto::rustls::QuicServerConfig;
    use rustls::crypto::ring::cipher_suite::{
        TLS13_AES_128_GCM_SHA256, TLS13_AES_256_GCM_SHA384, TLS13_CHACHA20_POLY1305_SHA256,
    };
    use rustls::SupportedCipherSuite;

    /// A server config like [`server_settings`]' that offers `suite` alone (QUIC's
    /// Initial packets keep AES-128-GCM, RFC 9001 §5.2). Built by hand: a
    /// single AES-256 or ChaCha20 suite is no [`CipherPreference`] (every
    /// real endpoint offers AES-128-GCM), and this test needs the server to
    /// force the suite.
    fn server_offering(
        id: &ServerIdentity,
        suite: SupportedCipherSuite,
        transport: Arc<quinn::TransportConfig>,
    ) -> quinn::ServerConfig {
        let mut provider = rustls::crypto::ring::default_provider();
        provider.cipher_suites = vec![suite];
        let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(provider))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![id.cert.clone()],
                PrivateKeyDer::Pkcs8(id.key.clone_key()),
            )
            .unwrap();
        tls.alpn_protocols = vec![ALPN.to_vec()];
        let initial = TLS13_AES_128_GCM_SHA256
            .tls13()
            .and_then(|s| s.quic_suite())
            .unwrap();
        let crypto = QuicServerConfig::with_initial(Arc::new(tls), initial).unwrap();
        let mut server = quinn::ServerConfig::with_crypto(Arc::new(crypto));
        server.transport_config(transport);
        server
    }

    /// The suite reported is the one negotiated: the client offers all three
    /// (the config `qr demo` and `qr connect` use), the server only one, in turn,
    /// over the sim fabric. AES-256 and ChaCha20 also show that the Initial
    /// packets' AES-128 keys are not taken for the negotiated suite.
    #[test]
    fn reports_the_negotiated_suite() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        for suite in [
            TLS13_AES_128_GCM_SHA256,
            TLS13_AES_256_GCM_SHA384,
            TLS13_CHACHA20_POLY1305_SHA256,
        ] {
            let pair = provider::open_pair(
                Provider::Sim,
                &FabricOptions {
                    loss_percent: 0.0,
                    seed: 1,
                },
            )
            .unwrap();
            let fabric = FabricConfig::of(&pair.server);
            let id = ServerIdentity::generate(&[]).unwrap();
            let server_cfg = server_offering(&id, suite, fabric.transport());
            let mut client_cfg = client_config(vec![id.cert.clone()]).unwrap();
            client_cfg.transport_config(fabric.transport());
            let info = rt.block_on(async {
                let server = fabric
                    .endpoint(pair.server.clone(), Some(server_cfg))
                    .unwrap();
                let client = fabric.endpoint(pair.client.clone(), None).unwrap();
                let accept = {
                    let server = server.clone();
                    tokio::spawn(async move { server.accept().await.unwrap().await.unwrap() })
                };
                let conn = client
                    .connect_with(
                        client_cfg,
                        pair.client.peer_addr(pair.server.ud_addr()),
                        SERVER_NAME,
                    )
                    .unwrap()
                    .await
                    .unwrap();
                let server_conn = accept.await.unwrap();
                let info = TlsInfo::of(&conn, &server_conn);
                conn.close(0u32.into(), b"done");
                server_conn.close(0u32.into(), b"done");
                client.wait_idle().await;
                info
            });
            let name = suite.suite().as_str().unwrap();
            assert_eq!(info.cipher_suite.as_deref(), Some(name), "{info:?}");
            assert_eq!(info.version.as_deref(), Some("TLSv1.3"), "{info:?}");
            assert_eq!(info.alpn.as_deref().map(str::as_bytes), Some(ALPN));
            assert_eq!(info.server_name.as_deref(), Some(SERVER_NAME));
        }
    }

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
