//! TLS material as it is deployed: certificates and chains in PEM or DER,
//! private keys in any PEM form (or PKCS#8/PKCS#1/SEC1 DER), mutual TLS and
//! ALPN — turned into rustls and quinn-proto client and server configs, so
//! the engine, the C API, the quinn adapter's users (`qr` and its channels)
//! and TCP peers build TLS one way.
//!
//! The layers, each built from the one below: [`TlsSettings::rustls_server`]
//! / [`TlsSettings::rustls_client`] (TLS 1.3, identity, trust, client
//! authentication, ALPN: what a TCP + TLS peer uses as is),
//! [`TlsSettings::server_crypto`] / [`TlsSettings::client_crypto`] (plus
//! QUIC's 0-RTT rules, as quinn-proto's crypto configs), and
//! [`TlsSettings::server_config`] / [`TlsSettings::client_config`] (plus a
//! transport config and, server side, the NEW_TOKEN policy). QUIC and TCP
//! configs from the same settings therefore differ only where the protocols do.
//!
//! QUIC always runs TLS 1.3 (RFC 9001 §4.2), and so do the TCP configs here
//! (every TCP + TLS peer in this tree is ours); certificate verification is
//! always on, there is no "insecure" switch.

use std::sync::Arc;

use quinn_proto::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn_proto::{ClientConfig, ServerConfig, TransportConfig, ValidationTokenConfig};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;

use crate::quic::pin::{PinnedServerVerifier, SpkiPin};
use crate::quic::suites::CipherPreference;

/// Why TLS material or a TLS config was refused. Each message names the fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// The bytes hold no certificate: neither PEM `CERTIFICATE` blocks nor one DER certificate.
    #[error("no certificate found: give PEM (-----BEGIN CERTIFICATE-----) or one DER certificate")]
    NoCertificate,
    /// A PEM block could not be decoded.
    #[error("bad PEM")]
    Pem(#[source] rustls::pki_types::pem::Error),
    /// The bytes hold no private key in a form rustls reads.
    #[error(
        "no private key found: give a PEM key (PKCS#8 `PRIVATE KEY`, PKCS#1 `RSA PRIVATE KEY` \
         or SEC1 `EC PRIVATE KEY`) or a PKCS#8 DER key"
    )]
    NoKey,
    /// A trust anchor could not be added (not a CA certificate rustls can use).
    #[error("unusable CA certificate: {0}")]
    BadRoot(String),
    /// Client certificates are required but no CA to check them against was given.
    #[error(
        "client certificates are required but no CA was given to verify them: set the CA (roots)"
    )]
    ClientAuthWithoutRoots,
    /// A server config needs a certificate chain and its key.
    #[error("a server needs a certificate chain and its private key")]
    NoIdentity,
    /// A client config needs roots to verify the server against.
    #[error("a client needs at least one trusted CA certificate (roots) to verify servers")]
    NoRoots,
    /// rustls refused the combination (e.g. a key that does not match the certificate).
    #[error("TLS configuration refused: {0} (does the key belong to the certificate?)")]
    Config(String),
}

/// Certificates from `bytes`: PEM (one or more `CERTIFICATE` blocks, a chain
/// leaf first) or a single DER certificate.
pub fn parse_certificates(bytes: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    if bytes.trim_ascii_start().starts_with(b"-----BEGIN") {
        let certs = CertificateDer::pem_slice_iter(bytes)
            .collect::<Result<Vec<_>, _>>()
            .map_err(TlsError::Pem)?;
        if certs.is_empty() {
            return Err(TlsError::NoCertificate);
        }
        Ok(certs)
    } else if bytes.first() == Some(&0x30) {
        // A DER certificate is an ASN.1 SEQUENCE (tag 0x30); rustls checks the rest.
        Ok(vec![CertificateDer::from(bytes.to_vec())])
    } else {
        Err(TlsError::NoCertificate)
    }
}

/// A private key from `bytes`: the first PEM key block of any kind, or DER
/// (PKCS#8, PKCS#1 or SEC1, told apart by their structure).
pub fn parse_private_key(bytes: &[u8]) -> Result<PrivateKeyDer<'static>, TlsError> {
    if bytes.trim_ascii_start().starts_with(b"-----BEGIN") {
        PrivateKeyDer::from_pem_slice(bytes).map_err(|_| TlsError::NoKey)
    } else {
        PrivateKeyDer::try_from(bytes)
            .map(|k| k.clone_key())
            .map_err(|_| TlsError::NoKey)
    }
}

/// Everything TLS needs on one endpoint, client side and server side alike.
#[derive(Debug)]
pub struct TlsSettings {
    /// This endpoint's certificate chain (leaf first) and key: a server's
    /// identity, and a client's certificate for mutual TLS.
    pub identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
    /// Trust anchors: a client verifies servers against them; a server that
    /// requires client certificates verifies clients against them.
    pub roots: Vec<CertificateDer<'static>>,
    /// Server side: refuse clients without a certificate chaining to `roots`
    /// (mutual TLS).
    pub require_client_cert: bool,
    /// ALPN protocols, in preference order (RFC 7301; QUIC requires ALPN to
    /// match when either side sets it, RFC 9001 §8.1). Empty: none offered.
    pub alpn: Vec<Vec<u8>>,
    /// Server side: accept 0-RTT early data from resuming clients. Early
    /// data can be replayed by an attacker (RFC 9001 §9.2, RFC 8446 §8): turn
    /// it on only for requests that are safe to run twice.
    pub accept_0rtt: bool,
    /// Client side: when resuming a session whose ticket allows it, offer
    /// 0-RTT early data (`true` by default; the application still decides
    /// whether to send any). Off, a resuming client's handshake carries no
    /// early-data offer at all.
    pub offer_0rtt: bool,
    /// The cipher suites offered and their order (AES-128-GCM first by default).
    pub ciphers: CipherPreference,
    /// Server side: send NEW_TOKEN frames (RFC 9000 §8.1.3) as quinn-proto's
    /// own default does (two per connection when its `bloom` feature is built
    /// in, as in `qr`), so a returning client skips a Retry. Off by default:
    /// no NEW_TOKEN tokens whatever features a build unifies; Retry tokens
    /// still validate addresses.
    pub new_tokens: bool,
    /// Where rustls writes the session secrets, in the NSS key-log format
    /// (`SSLKEYLOGFILE`), on client and server configs alike; `None` logs
    /// nothing. Anyone holding these lines can decrypt the traffic: for
    /// debugging captures only.
    pub key_log: Option<Arc<dyn rustls::KeyLog>>,
    /// Client side: SHA-256 pins of the server's SubjectPublicKeyInfo
    /// (`quic::spki_sha256`). Empty: no pinning. Otherwise a server whose
    /// chain verifies against `roots` is still refused (TLS alert
    /// access_denied) unless its key matches one pin.
    pub pinned_spki_sha256: Vec<SpkiPin>,
}

impl Default for TlsSettings {
    /// No identity, no roots, no ALPN, no client certificates required, 0-RTT
    /// refused as a server and offered as a client, the default suites.
    fn default() -> Self {
        TlsSettings {
            identity: None,
            roots: Vec::new(),
            require_client_cert: false,
            alpn: Vec::new(),
            accept_0rtt: false,
            // What client configs did before the field existed: keeps every
            // existing caller's handshakes as they were.
            offer_0rtt: true,
            ciphers: CipherPreference::default(),
            new_tokens: false,
            key_log: None,
            pinned_spki_sha256: Vec::new(),
        }
    }
}

impl Clone for TlsSettings {
    fn clone(&self) -> Self {
        TlsSettings {
            identity: self
                .identity
                .as_ref()
                .map(|(c, k)| (c.clone(), k.clone_key())),
            roots: self.roots.clone(),
            require_client_cert: self.require_client_cert,
            alpn: self.alpn.clone(),
            accept_0rtt: self.accept_0rtt,
            offer_0rtt: self.offer_0rtt,
            ciphers: self.ciphers,
            new_tokens: self.new_tokens,
            key_log: self.key_log.clone(),
            pinned_spki_sha256: self.pinned_spki_sha256.clone(),
        }
    }
}

fn config_error(e: impl std::fmt::Display) -> TlsError {
    TlsError::Config(e.to_string())
}

impl TlsSettings {
    fn root_store(&self) -> Result<Arc<RootCertStore>, TlsError> {
        let mut store = RootCertStore::empty();
        for r in &self.roots {
            store
                .add(r.clone())
                .map_err(|e| TlsError::BadRoot(e.to_string()))?;
        }
        Ok(Arc::new(store))
    }

    /// A rustls server config: TLS 1.3, the identity, client certificates
    /// verified against `roots` when required, the ALPN list. What a TCP +
    /// TLS server uses as is; [`TlsSettings::server_crypto`] builds on it.
    pub fn rustls_server(&self) -> Result<rustls::ServerConfig, TlsError> {
        let (chain, key) = self.identity.as_ref().ok_or(TlsError::NoIdentity)?;
        let builder = rustls::ServerConfig::builder_with_provider(self.ciphers.provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(config_error)?;
        let builder = if self.require_client_cert {
            if self.roots.is_empty() {
                return Err(TlsError::ClientAuthWithoutRoots);
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(
                self.root_store()?,
                self.ciphers.provider(),
            )
            .build()
            .map_err(config_error)?;
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let mut tls = builder
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(config_error)?;
        tls.alpn_protocols = self.alpn.clone();
        if let Some(k) = &self.key_log {
            tls.key_log = k.clone();
        }
        Ok(tls)
    }

    /// quinn-proto's server crypto: [`TlsSettings::rustls_server`] with 0-RTT
    /// accepted per `accept_0rtt`. For a caller that assembles its own
    /// `ServerConfig` (quinn's defaults for everything but TLS);
    /// [`TlsSettings::server_config`] is the complete one.
    pub fn server_crypto(&self) -> Result<QuicServerConfig, TlsError> {
        let mut tls = self.rustls_server()?;
        // QUIC allows only 0 or 2^32-1 here (RFC 9001 §4.6.1).
        tls.max_early_data_size = if self.accept_0rtt { u32::MAX } else { 0 };
        QuicServerConfig::try_from(tls).map_err(config_error)
    }

    /// A quinn-proto server config with `transport`, sending NEW_TOKEN
    /// frames as [`new_tokens`](Self::new_tokens) says.
    pub fn server_config(
        &self,
        transport: Arc<TransportConfig>,
    ) -> Result<Arc<ServerConfig>, TlsError> {
        let mut s = ServerConfig::with_crypto(Arc::new(self.server_crypto()?));
        s.transport_config(transport);
        if !self.new_tokens {
            // Spelled out so the behaviour does not follow which quinn-proto
            // features a build happens to unify (its `bloom` feature turns on
            // two NEW_TOKEN frames per connection, RFC 9000 §8.1.3).
            let mut tokens = ValidationTokenConfig::default();
            tokens.sent(0);
            s.validation_token_config(tokens);
        }
        Ok(Arc::new(s))
    }

    /// A rustls client config: TLS 1.3, servers verified against `roots`,
    /// the identity (if any) presented when a server asks for a client
    /// certificate, the ALPN list. What a TCP + TLS client uses as is;
    /// [`TlsSettings::client_crypto`] builds on it.
    pub fn rustls_client(&self) -> Result<rustls::ClientConfig, TlsError> {
        if self.roots.is_empty() {
            return Err(TlsError::NoRoots);
        }
        let builder = rustls::ClientConfig::builder_with_provider(self.ciphers.provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(config_error)?;
        let builder = if self.pinned_spki_sha256.is_empty() {
            builder.with_root_certificates(self.root_store()?)
        } else {
            let inner = WebPkiServerVerifier::builder_with_provider(
                self.root_store()?,
                self.ciphers.provider(),
            )
            .build()
            .map_err(config_error)?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(PinnedServerVerifier {
                    inner,
                    pins: self.pinned_spki_sha256.clone(),
                }))
        };
        let mut tls = match &self.identity {
            Some((chain, key)) => builder
                .with_client_auth_cert(chain.clone(), key.clone_key())
                .map_err(config_error)?,
            None => builder.with_no_client_auth(),
        };
        tls.alpn_protocols = self.alpn.clone();
        if let Some(k) = &self.key_log {
            tls.key_log = k.clone();
        }
        Ok(tls)
    }

    /// quinn-proto's client crypto: [`TlsSettings::rustls_client`] with 0-RTT
    /// offered per `offer_0rtt`. For a caller that wraps it (e.g. in
    /// [`crate::quic::SuiteClientConfig`]) before building its
    /// `ClientConfig`; [`TlsSettings::client_config`] is the plain one.
    pub fn client_crypto(&self) -> Result<QuicClientConfig, TlsError> {
        let mut tls = self.rustls_client()?;
        // Session tickets are kept in rustls's default in-memory cache; a
        // later connection to the same server name may then resume and send
        // 0-RTT data when the server allows it.
        tls.enable_early_data = self.offer_0rtt;
        QuicClientConfig::try_from(tls).map_err(config_error)
    }

    /// A quinn-proto client config with `transport`; it presents the identity
    /// (if any) when the server asks for a client certificate.
    pub fn client_config(&self, transport: Arc<TransportConfig>) -> Result<ClientConfig, TlsError> {
        let mut c = ClientConfig::new(Arc::new(self.client_crypto()?));
        c.transport_config(transport);
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quic::config::transport;

    fn ca_and_leaf() -> (rcgen::CertifiedKey, rcgen::Certificate, rcgen::KeyPair) {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let leaf_key = rcgen::KeyPair::generate().unwrap();
        let leaf = rcgen::CertificateParams::new(vec!["node".to_owned()])
            .unwrap()
            .signed_by(&leaf_key, &ca, &ca_key)
            .unwrap();
        (
            rcgen::CertifiedKey {
                cert: ca,
                key_pair: ca_key,
            },
            leaf,
            leaf_key,
        )
    }

    #[test]
    fn pem_and_der_certificates_and_keys_parse() {
        let (ca, leaf, leaf_key) = ca_and_leaf();
        let chain_pem = format!("{}{}", leaf.pem(), ca.cert.pem());
        let chain = parse_certificates(chain_pem.as_bytes()).unwrap();
        assert_eq!(chain.len(), 2);
        assert_eq!(chain[0].as_ref(), leaf.der().as_ref());
        let der = parse_certificates(leaf.der()).unwrap();
        assert_eq!(der.len(), 1);
        assert!(parse_private_key(leaf_key.serialize_pem().as_bytes()).is_ok());
        assert!(parse_private_key(&leaf_key.serialize_der()).is_ok());
        assert!(matches!(
            parse_certificates(b"hello"),
            Err(TlsError::NoCertificate)
        ));
        assert!(matches!(
            parse_certificates(b"-----BEGIN PRIVATE KEY-----\n-----END PRIVATE KEY-----\n"),
            Err(TlsError::NoCertificate | TlsError::Pem(_))
        ));
        assert!(matches!(parse_private_key(b"junk"), Err(TlsError::NoKey)));
    }

    #[test]
    fn configs_check_what_they_need() {
        let (ca, leaf, leaf_key) = ca_and_leaf();
        let t = transport(4096);
        let mut s = TlsSettings::default();
        assert!(matches!(
            s.server_config(t.clone()),
            Err(TlsError::NoIdentity)
        ));
        assert!(matches!(s.client_config(t.clone()), Err(TlsError::NoRoots)));
        s.identity = Some((
            vec![leaf.der().clone()],
            parse_private_key(&leaf_key.serialize_der()).unwrap(),
        ));
        s.require_client_cert = true;
        assert!(matches!(
            s.server_config(t.clone()),
            Err(TlsError::ClientAuthWithoutRoots)
        ));
        s.roots = vec![ca.cert.der().clone()];
        s.alpn = vec![b"qr-test/1".to_vec()];
        assert!(s.server_config(t.clone()).is_ok());
        assert!(s.client_config(t.clone()).is_ok());
        // A key that is not the certificate's is refused with a hint.
        s.identity = Some((
            vec![leaf.der().clone()],
            parse_private_key(&ca.key_pair.serialize_der()).unwrap(),
        ));
        let e = s.server_config(t).unwrap_err();
        assert!(e.to_string().contains("key belong"), "{e}");
    }

    /// The rustls configs a TCP peer uses come from the same settings as
    /// QUIC's: TLS 1.3 only, the same ALPN; 0-RTT is the QUIC layer's.
    #[test]
    fn tcp_and_quic_configs_share_the_settings() {
        let (ca, leaf, leaf_key) = ca_and_leaf();
        let s = TlsSettings {
            identity: Some((
                vec![leaf.der().clone()],
                parse_private_key(&leaf_key.serialize_der()).unwrap(),
            )),
            roots: vec![ca.cert.der().clone()],
            alpn: vec![b"qr-test/1".to_vec()],
            accept_0rtt: true,
            ..TlsSettings::default()
        };
        let server = s.rustls_server().unwrap();
        let client = s.rustls_client().unwrap();
        assert_eq!(server.alpn_protocols, s.alpn);
        assert_eq!(client.alpn_protocols, s.alpn);
        assert_eq!(server.max_early_data_size, 0, "TCP early data stays off");
        assert!(!client.enable_early_data);
        for suite in client.crypto_provider().cipher_suites.iter() {
            assert_eq!(suite.version(), &rustls::version::TLS13);
        }
        assert!(s.server_crypto().is_ok());
        // offer_0rtt off still builds (the flag only changes the ClientHello).
        let quiet = TlsSettings {
            offer_0rtt: false,
            ..s.clone()
        };
        assert!(quiet.client_crypto().is_ok());
        assert!(
            TlsSettings::default().offer_0rtt,
            "the default keeps 0-RTT offers"
        );
    }
}
