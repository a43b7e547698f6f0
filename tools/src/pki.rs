//! Mutual TLS for the channels (image layers, KV sync): identities and trust
//! anchors from PEM files, quinn configs that require a certificate on both
//! sides, and a development CA that `qr cert` issues them from.
//!
//! There is no plaintext mode and no "skip verification" switch: a channel
//! peer is whoever holds a key whose certificate chains to the configured CA
//! (and, for the server, matches the name the client dialled). TLS 1.3 only
//! (QUIC has nothing else, RFC 9001 §4.2). The rustls configs themselves
//! come from [`TlsSettings`], as every other endpoint's do.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use quic_rdma::quic::{
    parse_certificates, parse_private_key, CipherPreference, TlsError, TlsSettings,
    UnknownCipherPreference, CIPHERS_ENV,
};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::CertificateDer;

/// Why TLS material could not be loaded, issued or made into a config: the
/// error at this module's boundary (channel agents, `qr cert`, the tests).
/// Each message names the file and, where there is one, the fix; the cause
/// is the error's source.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PkiError {
    /// A file could not be read, written or renamed, or a directory created.
    #[error("{action} {}{hint}", path.display())]
    Io {
        /// What was being done ("reading", "writing", "renaming to", "creating").
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// What to do about it, if there is something to say ("" otherwise).
        hint: &'static str,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// A file's contents were refused: no certificate, no key, not a CA.
    #[error("{}{hint}", path.display())]
    Material {
        /// The file.
        path: PathBuf,
        /// What it should hold, after ": " ("" when the cause says it).
        hint: String,
        /// The parser's or rustls's error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The private key does not belong to the certificate.
    #[error("{} with {}", cert.display(), key.display())]
    Mismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// rustls's refusal.
        source: TlsError,
    },
    /// `QR_TLS_CIPHERS` names no cipher-suite preference.
    #[error("environment variable {CIPHERS_ENV}")]
    Ciphers(#[source] UnknownCipherPreference),
    /// rustls refused to build a client config.
    #[error("TLS client config")]
    Config(#[source] TlsError),
    /// Generating or signing a key or certificate failed.
    #[error("{what}")]
    Issue {
        /// What was being made.
        what: String,
        /// rcgen's error.
        source: rcgen::Error,
    },
}

type Result<T, E = PkiError> = std::result::Result<T, E>;

fn io_error(
    action: &'static str,
    path: &Path,
    hint: &'static str,
) -> impl FnOnce(std::io::Error) -> PkiError {
    let path = path.to_path_buf();
    move |source| PkiError::Io {
        action,
        path,
        hint,
        source,
    }
}

fn material(
    path: &Path,
    hint: impl Into<String>,
) -> impl FnOnce(Box<dyn std::error::Error + Send + Sync>) -> PkiError {
    let (path, hint) = (path.to_path_buf(), hint.into());
    move |source| PkiError::Material { path, hint, source }
}

fn issue(what: impl Into<String>) -> impl FnOnce(rcgen::Error) -> PkiError {
    let what = what.into();
    move |source| PkiError::Issue { what, source }
}

/// `--cert`, `--key`, `--ca`: the PEM files of a channel agent's identity and
/// of the CA its peers' certificates must chain to.
#[derive(Clone, Debug, clap::Args)]
pub struct MtlsArgs {
    /// This agent's certificate chain (PEM), e.g. as issued by `qr cert`.
    #[arg(long)]
    pub cert: PathBuf,
    /// This agent's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long)]
    pub key: PathBuf,
    /// The CA certificate(s) (PEM) the peer's certificate must chain to.
    #[arg(long)]
    pub ca: PathBuf,
}

impl MtlsArgs {
    /// Read and check the three files.
    pub fn load(&self) -> Result<Mtls> {
        Mtls::from_pem_files(&self.cert, &self.key, &self.ca)
    }
}

/// A loaded identity plus trust anchors: makes client and server configs that
/// both present a certificate and both verify the other's.
#[derive(Clone, Debug)]
pub struct Mtls {
    /// Identity, CA roots, client certificates required and the suites; the
    /// ALPN is set per channel when a config is made.
    settings: TlsSettings,
    /// The leaf certificate's `notAfter`.
    not_after: SystemTime,
}

impl Mtls {
    /// Load a certificate chain, its private key and the CA certificates.
    /// Errors name the file and what to do about it.
    pub fn from_pem_files(cert: &Path, key: &Path, ca: &Path) -> Result<Mtls> {
        let chain = read_certs(cert)?;
        let not_after = chain
            .first()
            .and_then(|leaf| not_after_of(leaf))
            .ok_or_else(|| {
                material(cert, ": no X.509 certificate with a validity period first")(
                    "unreadable validity".into(),
                )
            })?;
        let key_pem = read(key)?;
        let key_path = key;
        let key = parse_private_key(&key_pem).map_err(|e| {
            material(
                key_path,
                ": give the key file `qr cert` wrote next to the certificate (NAME-key.pem)",
            )(e.into())
        })?;
        let roots = read_certs(ca)?;
        // Checked here, with the CA file's name, not at the first config.
        let mut store = rustls::RootCertStore::empty();
        for c in &roots {
            store
                .add(c.clone())
                .map_err(|e| material(ca, ": not a usable CA certificate")(e.into()))?;
        }
        let ciphers = CipherPreference::from_env().map_err(PkiError::Ciphers)?;
        let m = Mtls {
            settings: TlsSettings {
                identity: Some((chain, key)),
                roots,
                require_client_cert: true,
                ciphers,
                ..TlsSettings::default()
            },
            not_after,
        };
        // Catch a key that does not belong to the certificate now, with the
        // file names, not at the first handshake.
        m.with_alpn(b"check")
            .rustls_server()
            .map_err(|source| PkiError::Mismatch {
                cert: cert.to_path_buf(),
                key: key_path.to_path_buf(),
                source,
            })?;
        Ok(m)
    }

    /// When this identity's certificate expires (its `notAfter`).
    pub fn not_after(&self) -> SystemTime {
        self.not_after
    }

    /// The settings with `alpn` as the one protocol.
    fn with_alpn(&self, alpn: &[u8]) -> TlsSettings {
        TlsSettings {
            alpn: vec![alpn.to_vec()],
            ..self.settings.clone()
        }
    }

    /// The TLS settings of a server speaking `alpn` that accepts only clients
    /// with a certificate chaining to the CA; NEW_TOKEN frames on, as the
    /// channels' servers always sent them. The endpoint builder makes them a
    /// server config with the fabric's transport.
    pub fn server_settings(&self, alpn: &[u8]) -> TlsSettings {
        TlsSettings {
            new_tokens: true,
            ..self.with_alpn(alpn)
        }
    }

    /// A quinn client config speaking `alpn` that presents this identity and
    /// accepts only servers with a certificate chaining to the CA and valid
    /// for the name dialled. It offers no 0-RTT: channel servers accept none.
    /// Built without a transport: the endpoint builder adds the fabric's.
    pub fn client_config(&self, alpn: &[u8]) -> Result<quinn::ClientConfig> {
        let settings = TlsSettings {
            offer_0rtt: false,
            ..self.with_alpn(alpn)
        };
        let crypto = settings.client_crypto().map_err(PkiError::Config)?;
        Ok(quinn::ClientConfig::new(Arc::new(crypto)))
    }
}

/// A DER certificate's `notAfter`, if it parses.
fn not_after_of(leaf_der: &[u8]) -> Option<SystemTime> {
    let (_, cert) = x509_parser::parse_x509_certificate(leaf_der).ok()?;
    let secs = u64::try_from(cert.validity().not_after.timestamp()).ok()?;
    Some(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs))
}

fn read(path: &Path) -> Result<Vec<u8>> {
    fs::read(path).map_err(io_error(
        "reading",
        path,
        " (make a development CA and certificates with `qr cert --dir DIR --leaf NAME=IP`)",
    ))
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    parse_certificates(&read(path)?).map_err(|e| material(path, "")(e.into()))
}

/// One leaf certificate to issue: its file name stem and its subject
/// alternative names (IP addresses become IP SANs, anything else a DNS name).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeafSpec {
    /// File stem: the certificate goes to `NAME.pem`, its key to `NAME-key.pem`.
    pub name: String,
    /// Names the certificate is valid for (servers are dialled by these).
    pub sans: Vec<String>,
}

impl std::str::FromStr for LeafSpec {
    type Err = String;

    /// `NAME=SAN1,SAN2,...` (or just `NAME`, valid for `NAME` itself).
    fn from_str(s: &str) -> Result<Self, String> {
        let (name, sans) = match s.split_once('=') {
            Some((n, sans)) => (n, sans.split(',').map(str::to_string).collect()),
            None => (s, vec![s.to_string()]),
        };
        let file_safe = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
        if name.is_empty() || !name.chars().all(file_safe) || name.starts_with('.') {
            return Err(format!(
                "`{name}`: a leaf name is a file stem of letters, digits, '-', '_' or '.'"
            ));
        }
        if name == "ca" {
            return Err("`ca` is the CA's own file name; pick another leaf name".into());
        }
        if sans.iter().any(String::is_empty) {
            return Err(format!("`{s}`: an empty subject alternative name"));
        }
        Ok(LeafSpec {
            name: name.to_string(),
            sans,
        })
    }
}

/// Issue development certificates into `dir`: a CA (`ca.pem`, `ca-key.pem`),
/// made only if `dir` has none yet, and for each leaf `NAME.pem` (the leaf
/// followed by the CA) and `NAME-key.pem`, usable as client and server.
/// Key files are written with mode 0600, every file atomically (temporary
/// name, then rename). For production, issue certificates from your own CA
/// and hand the agents those files instead.
pub fn generate_dev_pki(dir: &Path, leaves: &[LeafSpec]) -> Result<()> {
    fs::create_dir_all(dir).map_err(io_error("creating", dir, ""))?;
    let (ca_cert_path, ca_key_path) = (dir.join("ca.pem"), dir.join("ca-key.pem"));
    let (ca_cert, ca_key) = if ca_key_path.exists() {
        let key_pem =
            fs::read_to_string(&ca_key_path).map_err(io_error("reading", &ca_key_path, ""))?;
        let key = KeyPair::from_pem(&key_pem)
            .map_err(|e| material(&ca_key_path, ": not a PEM key")(e.into()))?;
        let cert_pem =
            fs::read_to_string(&ca_cert_path).map_err(io_error("reading", &ca_cert_path, ""))?;
        // Re-signing the parsed parameters with the same key yields an issuer
        // with the same name and key: leaves signed by it chain to ca.pem.
        let params = CertificateParams::from_ca_cert_pem(&cert_pem)
            .map_err(|e| material(&ca_cert_path, ": not a CA certificate")(e.into()))?;
        (
            params.self_signed(&key).map_err(issue("loading the CA"))?,
            key,
        )
    } else {
        let key = KeyPair::generate().map_err(issue("generating the CA key"))?;
        let mut params =
            CertificateParams::new(Vec::<String>::new()).map_err(issue("the CA's parameters"))?;
        params
            .distinguished_name
            .push(DnType::CommonName, "quic-rdma development CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = params.self_signed(&key).map_err(issue("signing the CA"))?;
        write_atomic(&ca_key_path, key.serialize_pem().as_bytes(), true)?;
        write_atomic(&ca_cert_path, cert.pem().as_bytes(), false)?;
        (cert, key)
    };
    for leaf in leaves {
        let key = KeyPair::generate().map_err(issue("generating a leaf key"))?;
        let mut params = CertificateParams::new(leaf.sans.clone()).map_err(issue(format!(
            "leaf {}: bad subject alternative name",
            leaf.name
        )))?;
        params
            .distinguished_name
            .push(DnType::CommonName, leaf.name.clone());
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params
            .signed_by(&key, &ca_cert, &ca_key)
            .map_err(issue(format!("signing leaf {}", leaf.name)))?;
        let chain = format!("{}{}", cert.pem(), ca_cert.pem());
        write_atomic(
            &dir.join(format!("{}-key.pem", leaf.name)),
            key.serialize_pem().as_bytes(),
            true,
        )?;
        write_atomic(
            &dir.join(format!("{}.pem", leaf.name)),
            chain.as_bytes(),
            false,
        )?;
    }
    Ok(())
}

fn write_atomic(path: &Path, bytes: &[u8], secret: bool) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(if secret { 0o600 } else { 0o644 })
        .open(&tmp)
        .map_err(io_error("writing", &tmp, ""))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(io_error("writing", &tmp, ""))?;
    fs::rename(&tmp, path).map_err(io_error("renaming to", path, ""))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(s: &str) -> LeafSpec {
        s.parse().unwrap()
    }

    #[test]
    fn leaf_specs() {
        assert_eq!(
            leaf("registry=127.0.0.2,localhost"),
            LeafSpec {
                name: "registry".into(),
                sans: vec!["127.0.0.2".into(), "localhost".into()]
            }
        );
        assert_eq!(leaf("node-1").sans, vec!["node-1".to_string()]);
        for bad in ["", "../x=1.2.3.4", "ca=127.0.0.1", "a b", "n=1.2.3.4,"] {
            assert!(bad.parse::<LeafSpec>().is_err(), "{bad}");
        }
    }

    /// Both sides must show a certificate from the CA: a client of another CA
    /// is refused by the server, and a server of another CA by the client.
    #[test]
    fn mutual_tls_over_a_quinn_pair() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        generate_dev_pki(&a, &[leaf("server=127.0.0.1"), leaf("client=client")]).unwrap();
        generate_dev_pki(&b, &[leaf("client=client")]).unwrap();
        // A later run adds a leaf under the same CA.
        generate_dev_pki(&a, &[leaf("late=late")]).unwrap();
        let load = |d: &Path, n: &str| {
            Mtls::from_pem_files(
                &d.join(format!("{n}.pem")),
                &d.join(format!("{n}-key.pem")),
                &d.join("ca.pem"),
            )
            .unwrap()
        };
        let server = load(&a, "server");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let transport = Arc::new(quinn::TransportConfig::default());
            let sc = server
                .server_settings(b"t/1")
                .server_config(transport)
                .unwrap();
            let ep =
                quinn::Endpoint::server(Arc::unwrap_or_clone(sc), "127.0.0.1:0".parse().unwrap())
                    .unwrap();
            let addr = ep.local_addr().unwrap();
            tokio::spawn(async move {
                while let Some(inc) = ep.accept().await {
                    tokio::spawn(async move {
                        if let Ok(c) = inc.await {
                            let _ = c.closed().await;
                        }
                    });
                }
            });
            let try_with = |m: Mtls| {
                async move {
                    let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
                    ep.set_default_client_config(m.client_config(b"t/1").unwrap());
                    let conn = ep.connect(addr, "127.0.0.1").unwrap().await?;
                    // A refused client certificate shows up after the handshake
                    // from the client's view: wait for the server's verdict.
                    let mut s = conn.open_uni().await?;
                    s.write_all(b"x").await?;
                    s.finish()?;
                    tokio::time::timeout(std::time::Duration::from_millis(500), conn.closed())
                        .await
                        .map_or(Ok(()), Err)
                        .map_err(anyhow::Error::from)
                }
            };
            try_with(load(&a, "client")).await.unwrap();
            try_with(load(&a, "late")).await.unwrap();
            // The server refuses a client certificate of another CA...
            let foreign = Mtls::from_pem_files(
                &b.join("client.pem"),
                &b.join("client-key.pem"),
                &a.join("ca.pem"),
            )
            .unwrap();
            let refused = try_with(foreign).await.unwrap_err();
            assert!(
                format!("{refused:#}").contains("certificate"),
                "{refused:#}"
            );
            // ...and the client a server certificate of another CA.
            let refused = try_with(load(&b, "client")).await.unwrap_err();
            assert!(
                format!("{refused:#}").contains("certificate"),
                "{refused:#}"
            );
        });
        // The key file is private.
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(a.join("server-key.pem"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        // A key that is not the certificate's is caught at load, naming the files.
        let err = Mtls::from_pem_files(
            &a.join("server.pem"),
            &a.join("client-key.pem"),
            &a.join("ca.pem"),
        )
        .unwrap_err();
        assert!(format!("{err:#}").contains("server.pem"), "{err:#}");
    }
}
