//! The self-signed certificate the Rust server presents and the C client trusts.

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// A self-signed certificate for `localhost` and its key.
#[derive(Debug)]
pub struct SelfSigned {
    cert: Vec<u8>,
    key: Vec<u8>,
}

impl SelfSigned {
    /// A fresh certificate for the name `localhost`.
    pub fn localhost() -> Self {
        let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()])
            .expect("rcgen makes a self-signed certificate");
        SelfSigned {
            cert: ck.cert.der().to_vec(),
            key: ck.key_pair.serialize_der(),
        }
    }

    /// The certificate, DER: what a client passes as its trust anchor.
    pub fn cert_der(&self) -> &[u8] {
        &self.cert
    }

    /// The chain a server presents.
    pub fn chain(&self) -> Vec<CertificateDer<'static>> {
        vec![CertificateDer::from(self.cert.clone())]
    }

    /// The private key (PKCS#8).
    pub fn key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key.clone()))
    }
}
