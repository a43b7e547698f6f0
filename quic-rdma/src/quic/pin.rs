//! Certificate pinning: a client accepts a server only if the SHA-256 of its
//! end-entity certificate's SubjectPublicKeyInfo (RFC 5280 §4.1.2.7, the DER
//! SEQUENCE with its tag, as RFC 7469 §2.4 hashes it) is one of the pins —
//! on top of the usual chain and name checks, never instead of them, so a
//! pin narrows trust and cannot widen it. Pinning the key rather than the
//! certificate keeps a pin valid across re-issuance with the same key.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};

/// A SHA-256 pin: 32 bytes.
pub type SpkiPin = [u8; 32];

/// SHA-256 of the SubjectPublicKeyInfo of the DER certificate `cert`, or
/// `None` when `cert` is not a certificate webpki parses.
pub fn spki_sha256(cert: &[u8]) -> Option<SpkiPin> {
    let der = CertificateDer::from(cert);
    let ee = webpki::EndEntityCert::try_from(&der).ok()?;
    let spki = ee.subject_public_key_info();
    let d = ring::digest::digest(&ring::digest::SHA256, spki.as_ref());
    d.as_ref().try_into().ok()
}

/// The usual WebPKI verification, then the pin check.
#[derive(Debug)]
pub(crate) struct PinnedServerVerifier {
    pub(crate) inner: Arc<WebPkiServerVerifier>,
    pub(crate) pins: Vec<SpkiPin>,
}

impl ServerCertVerifier for PinnedServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let ok = self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )?;
        match spki_sha256(end_entity) {
            Some(pin) if self.pins.contains(&pin) => Ok(ok),
            _ => {
                tracing::warn!(
                    server = ?server_name,
                    "server certificate refused: its key matches no pinned SPKI SHA-256"
                );
                // rustls answers with the access_denied alert (RFC 8446 §6.2),
                // which sets this apart from an untrusted chain (bad_certificate
                // or unknown_ca).
                Err(rustls::Error::InvalidCertificate(
                    CertificateError::ApplicationVerificationFailure,
                ))
            }
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::quic::{parse_private_key, TlsSettings};

    /// Key-log lines as rustls hands them over: label, client random, secret.
    #[derive(Debug, Default)]
    struct Lines(Mutex<Vec<String>>);

    impl rustls::KeyLog for Lines {
        fn log(&self, label: &str, client_random: &[u8], secret: &[u8]) {
            let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
            self.0
                .lock()
                .unwrap()
                .push(format!("{label} {} {}", hex(client_random), hex(secret)));
        }
    }

    /// A TLS 1.3 handshake in memory between `client` and `server` settings.
    fn handshake(client: &TlsSettings, server: &TlsSettings) -> Result<(), rustls::Error> {
        let mut c = rustls::ClientConnection::new(
            Arc::new(client.rustls_client().unwrap()),
            ServerName::try_from("node").unwrap(),
        )?;
        let mut s = rustls::ServerConnection::new(Arc::new(server.rustls_server().unwrap()))?;
        for _ in 0..10 {
            let mut buf = Vec::new();
            while c.wants_write() {
                c.write_tls(&mut buf).unwrap();
            }
            s.read_tls(&mut &buf[..]).unwrap();
            s.process_new_packets()?;
            let mut buf = Vec::new();
            while s.wants_write() {
                s.write_tls(&mut buf).unwrap();
            }
            c.read_tls(&mut &buf[..]).unwrap();
            c.process_new_packets()?;
            if !c.is_handshaking() && !s.is_handshaking() {
                return Ok(());
            }
        }
        panic!("handshake did not finish");
    }

    fn pair() -> (TlsSettings, TlsSettings, Vec<u8>) {
        let ck = rcgen::generate_simple_self_signed(vec!["node".to_owned()]).unwrap();
        let server = TlsSettings {
            identity: Some((
                vec![ck.cert.der().clone()],
                parse_private_key(&ck.key_pair.serialize_der()).unwrap(),
            )),
            ..TlsSettings::default()
        };
        let client = TlsSettings {
            roots: vec![ck.cert.der().clone()],
            ..TlsSettings::default()
        };
        (client, server, ck.cert.der().to_vec())
    }

    #[test]
    fn the_spki_pin_hashes_the_key_not_the_certificate() {
        let key = rcgen::KeyPair::generate().unwrap();
        let a = rcgen::CertificateParams::new(vec!["a".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let b = rcgen::CertificateParams::new(vec!["b".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        assert_ne!(a.der(), b.der());
        let pin = spki_sha256(a.der()).unwrap();
        assert_eq!(Some(pin), spki_sha256(b.der()));
        let expected = ring::digest::digest(&ring::digest::SHA256, &key.public_key_der());
        assert_eq!(&pin[..], expected.as_ref());
        assert_eq!(spki_sha256(b"not a certificate"), None);
    }

    #[test]
    fn a_matching_pin_connects_and_another_is_refused() {
        let (mut client, server, cert) = pair();
        let pin = spki_sha256(&cert).unwrap();
        client.pinned_spki_sha256 = vec![[7; 32], pin];
        handshake(&client, &server).unwrap();
        let mut wrong = pin;
        wrong[0] ^= 1;
        client.pinned_spki_sha256 = vec![wrong];
        let e = handshake(&client, &server).unwrap_err();
        assert_eq!(
            e,
            rustls::Error::InvalidCertificate(CertificateError::ApplicationVerificationFailure)
        );
    }

    #[test]
    fn both_ends_log_the_same_secrets() {
        let (mut client, mut server, _) = pair();
        let (cl, sl) = (Arc::new(Lines::default()), Arc::new(Lines::default()));
        client.key_log = Some(cl.clone());
        server.key_log = Some(sl.clone());
        handshake(&client, &server).unwrap();
        let mut c = cl.0.lock().unwrap().clone();
        let mut s = sl.0.lock().unwrap().clone();
        // TLS 1.3: handshake and first application secrets, both directions.
        for label in [
            "CLIENT_HANDSHAKE_TRAFFIC_SECRET",
            "SERVER_HANDSHAKE_TRAFFIC_SECRET",
            "CLIENT_TRAFFIC_SECRET_0",
            "SERVER_TRAFFIC_SECRET_0",
        ] {
            assert!(c.iter().any(|l| l.starts_with(label)), "{label}: {c:?}");
        }
        c.sort();
        s.sort();
        assert_eq!(c, s);
    }
}
