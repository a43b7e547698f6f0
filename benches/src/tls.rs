//! TLS for every row: one self-signed certificate, TLS 1.3 only, AES-128-GCM only
//! (forced through the rustls `CryptoProvider`'s cipher-suite list), session
//! resumption off so every handshake is a full one.
//!
//! Every row of one process uses the same certificate ([`Tls::new`]), and the
//! side processes of the two-process placement load it from the file
//! [`Tls::export`] wrote (named by the [`TLS_ENV`] environment variable), so a
//! client process trusts its server process.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use quic_rdma::quic::{CipherPreference, TlsSettings};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The server name the certificate is issued for.
pub const SERVER_NAME: &str = "localhost";

/// Environment variable naming the file a side process loads its certificate
/// and key from (see [`Tls::export`]).
pub const TLS_ENV: &str = "QUIC_RDMA_BENCH_TLS";

/// A certificate and its key, which all configs use.
#[derive(Clone)]
pub struct Tls {
    cert: CertificateDer<'static>,
    key_der: Vec<u8>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").finish_non_exhaustive()
    }
}

impl Default for Tls {
    fn default() -> Self {
        Self::new()
    }
}

impl Tls {
    /// This process's certificate for [`SERVER_NAME`] (ECDSA P-256, self-signed):
    /// made on first use, or loaded from the file [`TLS_ENV`] names.
    pub fn new() -> Self {
        static SHARED: OnceLock<Tls> = OnceLock::new();
        SHARED
            .get_or_init(|| match std::env::var_os(TLS_ENV) {
                Some(path) => Self::load(Path::new(&path))
                    .unwrap_or_else(|e| panic!("{TLS_ENV}={}: {e:#}", Path::new(&path).display())),
                None => {
                    let ck = rcgen::generate_simple_self_signed(vec![SERVER_NAME.into()])
                        .expect("rcgen self-signed certificate");
                    Self::of(ck.cert.der().to_vec(), ck.key_pair.serialize_der())
                }
            })
            .clone()
    }

    fn of(cert: Vec<u8>, key_der: Vec<u8>) -> Self {
        Tls {
            cert: CertificateDer::from(cert),
            key_der,
        }
    }

    /// Write the certificate and key to `path` (for side processes: set
    /// [`TLS_ENV`] to it). Test material only: the key is written in the clear.
    pub fn export(&self, path: &Path) -> anyhow::Result<()> {
        let mut out = (self.cert.len() as u32).to_le_bytes().to_vec();
        out.extend_from_slice(&self.cert);
        out.extend_from_slice(&self.key_der);
        std::fs::write(path, out)?;
        Ok(())
    }

    fn load(path: &Path) -> anyhow::Result<Self> {
        let b = std::fs::read(path)?;
        anyhow::ensure!(b.len() > 4, "too short for a certificate and key");
        let n = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
        anyhow::ensure!(b.len() > 4 + n, "certificate length past the end");
        Ok(Self::of(b[4..4 + n].to_vec(), b[4 + n..].to_vec()))
    }

    fn key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(self.key_der.clone().into())
    }

    /// The server's settings ([`TlsSettings`], as every endpoint's): this
    /// certificate, AES-128-GCM only.
    fn server_settings(&self) -> TlsSettings {
        TlsSettings {
            identity: Some((vec![self.cert.clone()], self.key())),
            ciphers: CipherPreference::Aes128Only,
            ..TlsSettings::default()
        }
    }

    /// rustls server config: TLS 1.3, AES-128-GCM, no session tickets.
    pub fn rustls_server(&self) -> rustls::ServerConfig {
        let mut c = self
            .server_settings()
            .rustls_server()
            .expect("certificate and key match");
        c.send_tls13_tickets = 0;
        c
    }

    /// rustls client config trusting the certificate; resumption disabled.
    pub fn rustls_client(&self) -> rustls::ClientConfig {
        let settings = TlsSettings {
            roots: vec![self.cert.clone()],
            ciphers: CipherPreference::Aes128Only,
            ..TlsSettings::default()
        };
        let mut c = settings.rustls_client().expect("valid certificate");
        c.resumption = rustls::client::Resumption::disabled();
        c
    }

    /// QUIC server config with `transport`.
    pub fn quinn_server(&self, transport: Arc<quinn::TransportConfig>) -> quinn::ServerConfig {
        let mut tls = self.rustls_server();
        tls.max_early_data_size = 0;
        let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls)
            .expect("TLS 1.3 with AES-128-GCM suits QUIC");
        let mut c = quinn::ServerConfig::with_crypto(Arc::new(crypto));
        c.transport_config(transport);
        c
    }

    /// QUIC client config with `transport`.
    pub fn quinn_client(&self, transport: Arc<quinn::TransportConfig>) -> quinn::ClientConfig {
        let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(self.rustls_client())
            .expect("TLS 1.3 with AES-128-GCM suits QUIC");
        let mut c = quinn::ClientConfig::new(Arc::new(crypto));
        c.transport_config(transport);
        c
    }
}
