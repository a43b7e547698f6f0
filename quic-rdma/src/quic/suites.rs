//! Which TLS 1.3 cipher suites a QUIC endpoint offers, and in what order: one
//! place for every rustls config the project builds; and which suite a
//! connection negotiated ([`SuiteClientConfig`]).
//!
//! Default: `TLS13_AES_128_GCM_SHA256` first. It is the suite every TLS 1.3
//! implementation must support (RFC 8446 §9.1) and the AEAD QUIC's Initial
//! packets always use (RFC 9001 §5.2), and on AES-NI/VAES hardware it is the
//! fastest (10 AES rounds against AES-256's 14). rustls/ring's own order puts
//! `TLS13_AES_256_GCM_SHA384` first, which is what endpoints negotiated before.
//! The order is the client's preference; rustls servers follow the client's
//! order unless told otherwise, and both sides get the same list here.
//!
//! The suites are ring's, each with one addition: deriving QUIC packet keys
//! notes on the calling thread which suite did it. quinn does not expose
//! rustls's `negotiated_cipher_suite()`; a [`SuiteClientConfig`] session reads
//! that note around each handshake step that hands quinn new keys, so it knows
//! the suite its own handshake chose.

use std::any::Any;
use std::cell::Cell;
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, LazyLock};

use quinn_proto::crypto::rustls::{HandshakeData, QuicClientConfig};
use quinn_proto::crypto::{self, ExportKeyingMaterialError, KeyPair, Keys};
use quinn_proto::transport_parameters::TransportParameters;
use quinn_proto::{ConnectError, ConnectionId, Side, TransportError};
use rustls::crypto::cipher::{AeadKey, Iv};
use rustls::crypto::ring::cipher_suite::{
    TLS13_AES_128_GCM_SHA256, TLS13_AES_256_GCM_SHA384, TLS13_CHACHA20_POLY1305_SHA256,
};
use rustls::crypto::CryptoProvider;
use rustls::quic::{self as tls_quic, HeaderProtectionKey, PacketKey};
use rustls::{CipherSuiteCommon, SupportedCipherSuite, Tls13CipherSuite};

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

    /// The suites, in order: ring's, marked so that a [`SuiteClientConfig`]
    /// connection learns which one it negotiated.
    pub fn suites(self) -> Vec<SupportedCipherSuite> {
        let [aes128, aes256, chacha] = marked_suites();
        match self {
            CipherPreference::Aes128First => vec![aes128, aes256, chacha],
            CipherPreference::Aes256First => vec![aes256, aes128, chacha],
            CipherPreference::Aes128Only => vec![aes128],
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

/// The environment variable [`CipherPreference::from_env`] reads: `qr` and
/// the benchmarks let an operator choose the suites without a flag per
/// command.
pub const CIPHERS_ENV: &str = "QR_TLS_CIPHERS";

impl CipherPreference {
    /// The preference named by [`CIPHERS_ENV`] (`aes128`, `aes256`,
    /// `aes128-only`), or the default when it is unset. A value it does not
    /// know is an error naming the choices, not a silent default.
    pub fn from_env() -> Result<CipherPreference, UnknownCipherPreference> {
        match std::env::var(CIPHERS_ENV) {
            Ok(v) => v.parse(),
            Err(_) => Ok(CipherPreference::default()),
        }
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

/// ring's QUIC key builder for one suite (`.0`, ring's own), noting on the
/// calling thread that this suite derived packet keys ([`keys_derived_during`]).
struct MarkedQuic(&'static SupportedCipherSuite);

impl MarkedQuic {
    fn ring(&self) -> &'static dyn tls_quic::Algorithm {
        self.0
            .tls13()
            .and_then(|s| s.quic)
            .expect("ring's TLS 1.3 suites have a QUIC algorithm")
    }
}

impl tls_quic::Algorithm for MarkedQuic {
    fn packet_key(&self, key: AeadKey, iv: Iv) -> Box<dyn PacketKey> {
        DERIVED.set(Some(*self.0));
        self.ring().packet_key(key, iv)
    }

    fn header_protection_key(&self, key: AeadKey) -> Box<dyn HeaderProtectionKey> {
        self.ring().header_protection_key(key)
    }

    fn aead_key_len(&self) -> usize {
        self.ring().aead_key_len()
    }

    fn fips(&self) -> bool {
        self.ring().fips()
    }
}

static MARK_AES128: MarkedQuic = MarkedQuic(&TLS13_AES_128_GCM_SHA256);
static MARK_AES256: MarkedQuic = MarkedQuic(&TLS13_AES_256_GCM_SHA384);
static MARK_CHACHA: MarkedQuic = MarkedQuic(&TLS13_CHACHA20_POLY1305_SHA256);

/// ring's three TLS 1.3 suites with their QUIC algorithm marked, in the order
/// AES-128-GCM, AES-256-GCM, ChaCha20-Poly1305.
static MARKED: LazyLock<[Tls13CipherSuite; 3]> = LazyLock::new(|| {
    [&MARK_AES128, &MARK_AES256, &MARK_CHACHA].map(|mark| {
        let ring = mark.0.tls13().expect("a TLS 1.3 suite");
        Tls13CipherSuite {
            common: CipherSuiteCommon {
                suite: ring.common.suite,
                hash_provider: ring.common.hash_provider,
                confidentiality_limit: ring.common.confidentiality_limit,
            },
            hkdf_provider: ring.hkdf_provider,
            aead_alg: ring.aead_alg,
            quic: Some(mark),
        }
    })
});

fn marked_suites() -> [SupportedCipherSuite; 3] {
    let m: &'static [Tls13CipherSuite; 3] = &MARKED;
    [
        SupportedCipherSuite::Tls13(&m[0]),
        SupportedCipherSuite::Tls13(&m[1]),
        SupportedCipherSuite::Tls13(&m[2]),
    ]
}

thread_local! {
    /// The suite (ring's) whose QUIC packet keys this thread derived last.
    static DERIVED: Cell<Option<SupportedCipherSuite>> = const { Cell::new(None) };
}

/// Run `f`; also say which marked suite derived QUIC packet keys while it ran.
/// rustls derives a connection's keys synchronously inside the call that
/// returns them, so what `f` (one call into one session) derived is that
/// session's.
fn keys_derived_during<R>(f: impl FnOnce() -> R) -> (R, Option<SupportedCipherSuite>) {
    let outer = DERIVED.replace(None);
    let r = f();
    (r, DERIVED.replace(outer))
}

/// quinn-proto's rustls client config, whose connections also say which cipher
/// suite they negotiated: a connection's `handshake_data()` is a
/// [`SuiteHandshakeData`] (quinn's [`HandshakeData`] and the suite) instead of
/// a bare [`HandshakeData`].
///
/// The suite is known when the rustls config was built on
/// [`CipherPreference::provider`] (its suites are marked); on another provider
/// it is `None`.
pub struct SuiteClientConfig(Arc<QuicClientConfig>);

impl SuiteClientConfig {
    /// Wrap `inner`; give the result to `quinn_proto::ClientConfig::new`.
    pub fn new(inner: QuicClientConfig) -> SuiteClientConfig {
        SuiteClientConfig(Arc::new(inner))
    }
}

impl crypto::ClientConfig for SuiteClientConfig {
    fn start_session(
        self: Arc<Self>,
        version: u32,
        server_name: &str,
        params: &TransportParameters,
    ) -> Result<Box<dyn crypto::Session>, ConnectError> {
        let inner = self.0.clone().start_session(version, server_name, params)?;
        Ok(Box::new(SuiteSession { inner, suite: None }))
    }
}

/// What a [`SuiteClientConfig`] connection answers to `handshake_data()`.
#[non_exhaustive]
pub struct SuiteHandshakeData {
    /// What quinn's rustls session reports (ALPN protocol, server name).
    pub handshake: HandshakeData,
    /// The TLS 1.3 cipher suite this connection negotiated (ring's suite of
    /// that name); `None` if the provider's suites are not
    /// [`CipherPreference::suites`].
    pub cipher_suite: Option<SupportedCipherSuite>,
}

/// quinn's rustls session, plus the suite whose keys it handed out.
struct SuiteSession {
    inner: Box<dyn crypto::Session>,
    suite: Option<SupportedCipherSuite>,
}

impl SuiteSession {
    /// Call into the session, noting the suite of any keys the call derived.
    fn deriving<R>(&mut self, f: impl FnOnce(&mut dyn crypto::Session) -> R) -> R {
        let inner = &mut *self.inner;
        let (r, suite) = keys_derived_during(|| f(inner));
        if suite.is_some() {
            self.suite = suite;
        }
        r
    }
}

impl crypto::Session for SuiteSession {
    fn initial_keys(&self, dst_cid: &ConnectionId, side: Side) -> Keys {
        // Initial keys come from the version's fixed salt, not the negotiated suite.
        self.inner.initial_keys(dst_cid, side)
    }

    fn handshake_data(&self) -> Option<Box<dyn Any>> {
        let data = self.inner.handshake_data()?;
        Some(match data.downcast::<HandshakeData>() {
            Ok(handshake) => Box::new(SuiteHandshakeData {
                handshake: *handshake,
                cipher_suite: self.suite,
            }),
            Err(other) => other,
        })
    }

    fn peer_identity(&self) -> Option<Box<dyn Any>> {
        self.inner.peer_identity()
    }

    fn early_crypto(&self) -> Option<(Box<dyn crypto::HeaderKey>, Box<dyn crypto::PacketKey>)> {
        // 0-RTT keys are the resumed session's suite, which the server may refuse.
        self.inner.early_crypto()
    }

    fn early_data_accepted(&self) -> Option<bool> {
        self.inner.early_data_accepted()
    }

    fn is_handshaking(&self) -> bool {
        self.inner.is_handshaking()
    }

    fn read_handshake(&mut self, buf: &[u8]) -> Result<bool, TransportError> {
        self.inner.read_handshake(buf)
    }

    fn transport_parameters(&self) -> Result<Option<TransportParameters>, TransportError> {
        self.inner.transport_parameters()
    }

    fn write_handshake(&mut self, buf: &mut Vec<u8>) -> Option<Keys> {
        // Handshake and 1-RTT keys: derived here, by the negotiated suite.
        self.deriving(|s| s.write_handshake(buf))
    }

    fn next_1rtt_keys(&mut self) -> Option<KeyPair<Box<dyn crypto::PacketKey>>> {
        self.deriving(|s| s.next_1rtt_keys())
    }

    fn is_valid_retry(&self, orig_dst_cid: &ConnectionId, header: &[u8], payload: &[u8]) -> bool {
        self.inner.is_valid_retry(orig_dst_cid, header, payload)
    }

    fn export_keying_material(
        &self,
        output: &mut [u8],
        label: &[u8],
        context: &[u8],
    ) -> Result<(), ExportKeyingMaterialError> {
        self.inner.export_keying_material(output, label, context)
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
