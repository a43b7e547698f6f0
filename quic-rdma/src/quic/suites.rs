//! Which TLS 1.3 cipher suites a QUIC endpoint offers, and in what order: one
//! place for every rustls config the project builds.
//!
//! Default: `TLS13_AES_128_GCM_SHA256` first. It is the suite every TLS 1.3
//! implementation must support (RFC 8446 §9.1) and the AEAD QUIC's Initial
//! packets always use (RFC 9001 §5.2), and on AES-NI/VAES hardware it is the
//! fastest (10 AES rounds against AES-256's 14). rustls/ring's own order puts
//! `TLS13_AES_256_GCM_SHA384` first, which is what endpoints negotiated before.
//! The order is the client's preference; rustls servers follow the client's
//! order unless told otherwise, and both sides get the same list here.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use rustls::crypto::ring::cipher_suite::{
    TLS13_AES_128_GCM_SHA256, TLS13_AES_256_GCM_SHA384, TLS13_CHACHA20_POLY1305_SHA256,
};
use rustls::crypto::CryptoProvider;
use rustls::SupportedCipherSuite;

/// The TLS 1.3 suites offered, in preference order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum CipherPreference {
    /// AES-128-GCM, then AES-256-GCM, then ChaCha20-Poly1305 (the default).
    #[default]
    Aes128First,
    /// AES-256-GCM, then AES-128-GCM, then ChaCha20-Poly1305 (ring's order).
    Aes256First,
    /// AES-128-GCM only (benchmarks: every row runs the same AEAD).
    Aes128Only,
}

impl CipherPreference {
    /// The names [`FromStr`] accepts, for error messages and help text.
    pub const NAMES: &'static str = "aes128 (default), aes256, aes128-only";

    /// The suites, in order.
    pub fn suites(self) -> Vec<SupportedCipherSuite> {
        match self {
            CipherPreference::Aes128First => vec![
                TLS13_AES_128_GCM_SHA256,
                TLS13_AES_256_GCM_SHA384,
                TLS13_CHACHA20_POLY1305_SHA256,
            ],
            CipherPreference::Aes256First => vec![
                TLS13_AES_256_GCM_SHA384,
                TLS13_AES_128_GCM_SHA256,
                TLS13_CHACHA20_POLY1305_SHA256,
            ],
            CipherPreference::Aes128Only => vec![TLS13_AES_128_GCM_SHA256],
        }
    }

    /// ring's `CryptoProvider` offering [`CipherPreference::suites`]; give it to
    /// `rustls::{ClientConfig, ServerConfig}::builder_with_provider` on both sides.
    pub fn provider(self) -> Arc<CryptoProvider> {
        let mut p = rustls::crypto::ring::default_provider();
        p.cipher_suites = self.suites();
        Arc::new(p)
    }
}

impl fmt::Display for CipherPreference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CipherPreference::Aes128First => "aes128",
            CipherPreference::Aes256First => "aes256",
            CipherPreference::Aes128Only => "aes128-only",
        })
    }
}

/// A name [`CipherPreference`] does not know.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownCipherPreference(pub String);

impl fmt::Display for UnknownCipherPreference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown cipher-suite preference {:?}: use one of {}",
            self.0,
            CipherPreference::NAMES
        )
    }
}

impl std::error::Error for UnknownCipherPreference {}

impl FromStr for CipherPreference {
    type Err = UnknownCipherPreference;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "aes128" | "aes-128" | "aes128-first" => Ok(CipherPreference::Aes128First),
            "aes256" | "aes-256" | "aes256-first" => Ok(CipherPreference::Aes256First),
            "aes128-only" => Ok(CipherPreference::Aes128Only),
            _ => Err(UnknownCipherPreference(s.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::CipherSuite;

    #[test]
    fn default_prefers_aes128_gcm() {
        let p = CipherPreference::default();
        assert_eq!(p.suites()[0].suite(), CipherSuite::TLS13_AES_128_GCM_SHA256);
        assert_eq!(
            p.provider().cipher_suites[0].suite(),
            CipherSuite::TLS13_AES_128_GCM_SHA256
        );
        assert_eq!(
            CipherPreference::Aes256First.suites()[0].suite(),
            CipherSuite::TLS13_AES_256_GCM_SHA384
        );
        assert_eq!(CipherPreference::Aes128Only.suites().len(), 1);
    }

    #[test]
    fn names_round_trip_and_unknown_names_the_choices() {
        for p in [
            CipherPreference::Aes128First,
            CipherPreference::Aes256First,
            CipherPreference::Aes128Only,
        ] {
            assert_eq!(p.to_string().parse::<CipherPreference>(), Ok(p));
        }
        let e = "des".parse::<CipherPreference>().unwrap_err().to_string();
        assert!(e.contains("aes128") && e.contains("des"), "{e}");
    }
}
