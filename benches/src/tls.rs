//! TLS for every row: one self-signed certificate, TLS 1.3 only, AES-128-GCM only
//! (forced through the rustls `CryptoProvider`'s cipher-suite list), session
//! resumption off so every handshake is a full one.

use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The server name the certificate is issued for.
pub const SERVER_NAME: &str = "localhost";

/// A certificate, its key, and the provider all configs use.
pub struct Tls {
    cert: CertificateDer<'static>,
    key_der: Vec<u8>,
    provider: Arc<CryptoProvider>,
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
    /// A fresh self-signed certificate for [`SERVER_NAME`] (ECDSA P-256).
    pub fn new() -> Self {
        let ck = rcgen::generate_simple_self_signed(vec![SERVER_NAME.into()])
            .expect("rcgen self-signed certificate");
        let mut provider = rustls::crypto::ring::default_provider();
        provider.cipher_suites = vec![rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256];
        Tls {
            cert: ck.cert.der().clone(),
            key_der: ck.key_pair.serialize_der(),
            provider: Arc::new(provider),
        }
    }

    fn key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(self.key_der.clone().into())
    }

    /// rustls server config: TLS 1.3, AES-128-GCM, no session tickets.
    pub fn rustls_server(&self) -> rustls::ServerConfig {
        let mut c = rustls::ServerConfig::builder_with_provider(self.provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .expect("TLS 1.3 with AES-128-GCM")
            .with_no_client_auth()
            .with_single_cert(vec![self.cert.clone()], self.key())
            .expect("certificate and key match");
        c.send_tls13_tickets = 0;
        c
    }

    /// rustls client config trusting the certificate; resumption disabled.
    pub fn rustls_client(&self) -> rustls::ClientConfig {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.cert.clone()).expect("valid certificate");
        let mut c = rustls::ClientConfig::builder_with_provider(self.provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .expect("TLS 1.3 with AES-128-GCM")
            .with_root_certificates(roots)
            .with_no_client_auth();
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
