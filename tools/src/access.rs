//! Who may use what: a client certificate's identity → the channels (ALPN
//! protocols) and the repositories it may use (SECURITY.md, "Authorization").
//!
//! Mutual TLS says a peer holds a certificate from the CA; it does not say
//! what that peer may read. A policy file grants it (JSON):
//!
//! ```json
//! { "grants": [
//!     { "identities": ["node-*"], "channels": ["qr-image/1"],
//!       "repositories": ["library/*", "team-a/**"] },
//!     { "identities": ["kv-*"], "channels": ["qr-kv/1"] } ] }
//! ```
//!
//! - A certificate's *identity* is its subject common name and its DNS
//!   subject alternative names; a grant applies if any of them matches one of
//!   its `identities` patterns.
//! - A pattern is literal except for `*`, any run of characters within one
//!   path segment (no `/`), and `**`, any run of characters.
//! - Everything not granted is refused; grants add up.
//!
//! Without a policy every certificate from the CA may use every repository of
//! the channel it dialled ([`Access::Open`], logged at start-up).

use std::path::Path;

use serde::Deserialize;

/// Why a policy or a certificate could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AccessError {
    /// The policy file could not be read.
    #[error("reading the access policy {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The policy file is not a valid policy.
    #[error(
        "access policy {path}: {why} (expected {{\"grants\": [{{\"identities\": [..], \
         \"channels\": [..], \"repositories\": [..]}}]}})"
    )]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong.
        why: String,
    },
    /// The peer's certificate could not be parsed.
    #[error("the peer's certificate is not valid X.509: {0}")]
    Certificate(String),
}

/// The names a peer's certificate proves: subject CN and DNS SANs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Identity {
    names: Vec<String>,
}

impl Identity {
    /// The identity in a DER certificate.
    pub fn from_der(der: &[u8]) -> Result<Identity, AccessError> {
        use x509_parser::extensions::GeneralName;
        let (_, cert) = x509_parser::parse_x509_certificate(der)
            .map_err(|e| AccessError::Certificate(e.to_string()))?;
        let mut names: Vec<String> = cert
            .subject()
            .iter_common_name()
            .filter_map(|cn| cn.as_str().ok().map(str::to_owned))
            .collect();
        if let Ok(Some(san)) = cert.subject_alternative_name() {
            names.extend(san.value.general_names.iter().filter_map(|n| match n {
                GeneralName::DNSName(d) => Some((*d).to_owned()),
                _ => None,
            }));
        }
        Ok(Identity { names })
    }

    /// The identity of a connection's peer (its leaf certificate), if it
    /// presented one.
    pub fn of(conn: &quinn::Connection) -> Option<Identity> {
        let certs = conn
            .peer_identity()?
            .downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>()
            .ok()?;
        Identity::from_der(certs.first()?).ok()
    }

    /// An identity with these names (tests, and callers that verified names
    /// another way).
    pub fn with_names(names: impl IntoIterator<Item = impl Into<String>>) -> Identity {
        Identity {
            names: names.into_iter().map(Into::into).collect(),
        }
    }

    /// The names, common name first.
    pub fn names(&self) -> &[String] {
        &self.names
    }
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.names.as_slice() {
            [] => f.write_str("a certificate with no name"),
            names => write!(f, "certificate {}", names.join("/")),
        }
    }
}

/// A name pattern: literal, `*` within a path segment, `**` across segments.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Pattern(String);

impl Pattern {
    /// Whether `s` matches.
    pub fn matches(&self, s: &str) -> bool {
        glob(self.0.as_bytes(), s.as_bytes())
    }
}

fn glob(p: &[u8], s: &[u8]) -> bool {
    match p {
        [] => s.is_empty(),
        [b'*', b'*', rest @ ..] => (0..=s.len()).any(|i| glob(rest, &s[i..])),
        [b'*', rest @ ..] => {
            // Within one segment: stop at the first '/'.
            let seg = s.iter().position(|&c| c == b'/').unwrap_or(s.len());
            (0..=seg).any(|i| glob(rest, &s[i..]))
        }
        [c, rest @ ..] => s.first() == Some(c) && glob(rest, &s[1..]),
    }
}

/// One grant of a policy: identities, and the channels and repositories
/// they may use.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Grant {
    identities: Vec<Pattern>,
    #[serde(default)]
    channels: Vec<String>,
    #[serde(default)]
    repositories: Vec<Pattern>,
}

impl Grant {
    fn applies_to(&self, id: &Identity) -> bool {
        id.names
            .iter()
            .any(|n| self.identities.iter().any(|p| p.matches(n)))
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    grants: Vec<Grant>,
}

/// What peers may use.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub enum Access {
    /// No policy: every certificate from the CA may use everything.
    #[default]
    Open,
    /// Only what the policy grants.
    Policy(Vec<Grant>),
}

impl Access {
    /// The policy in `path`, or [`Access::Open`] without one.
    pub fn load(path: Option<&Path>) -> Result<Access, AccessError> {
        let Some(path) = path else {
            return Ok(Access::Open);
        };
        let text = std::fs::read(path).map_err(|source| AccessError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Access::parse(&text).map_err(|why| AccessError::Invalid {
            path: path.display().to_string(),
            why,
        })
    }

    /// A policy from its JSON text.
    pub fn parse(json: &[u8]) -> Result<Access, String> {
        let f: PolicyFile = serde_json::from_slice(json).map_err(|e| e.to_string())?;
        if let Some(g) = f.grants.iter().find(|g| g.identities.is_empty()) {
            return Err(format!("a grant names no identities: {g:?}"));
        }
        Ok(Access::Policy(f.grants))
    }

    /// Whether `id` may speak `channel` (an ALPN protocol name).
    pub fn may_use_channel(&self, id: &Identity, channel: &str) -> bool {
        match self {
            Access::Open => true,
            Access::Policy(grants) => grants
                .iter()
                .any(|g| g.applies_to(id) && g.channels.iter().any(|c| c == channel)),
        }
    }

    /// Whether `id` may read repository `repo` on `channel`.
    pub fn may_read(&self, id: &Identity, channel: &str, repo: &str) -> bool {
        match self {
            Access::Open => true,
            Access::Policy(grants) => grants.iter().any(|g| {
                g.applies_to(id)
                    && g.channels.iter().any(|c| c == channel)
                    && g.repositories.iter().any(|p| p.matches(repo))
            }),
        }
    }

    /// One line for the start-up log.
    pub fn describe(&self) -> String {
        match self {
            Access::Open => "no access policy: every certificate from the CA may read every \
                             repository (give --access-policy to restrict)"
                .into(),
            Access::Policy(g) => format!("access policy with {} grants", g.len()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_stay_within_segments_unless_doubled() {
        let p = |s: &str| Pattern(s.into());
        assert!(p("library/*").matches("library/alpine"));
        assert!(!p("library/*").matches("library/x/y"));
        assert!(p("team-a/**").matches("team-a/x/y"));
        assert!(!p("team-a/**").matches("team-b/x"));
        assert!(p("node-*").matches("node-7"));
        assert!(p("*").matches(""));
        assert!(!p("a").matches("ab"));
        assert!(p("**").matches("any/thing"));
    }

    #[test]
    fn a_policy_grants_channels_and_repositories_per_identity() {
        let a = Access::parse(
            br#"{"grants": [
                {"identities": ["node-*"], "channels": ["qr-image/1"],
                 "repositories": ["library/*"]},
                {"identities": ["kv"], "channels": ["qr-kv/1"]}]}"#,
        )
        .unwrap();
        let node = Identity::with_names(["node-1"]);
        let kv = Identity::with_names(["kv", "kv.example"]);
        assert!(a.may_use_channel(&node, "qr-image/1"));
        assert!(!a.may_use_channel(&kv, "qr-image/1"), "a KV certificate");
        assert!(a.may_use_channel(&kv, "qr-kv/1"));
        assert!(a.may_read(&node, "qr-image/1", "library/alpine"));
        assert!(!a.may_read(&node, "qr-image/1", "othertenant/secret"));
        assert!(!a.may_read(&kv, "qr-image/1", "library/alpine"));
        assert!(!a.may_use_channel(&Identity::default(), "qr-image/1"));
        assert!(Access::Open.may_read(&Identity::default(), "qr-image/1", "x"));
    }

    #[test]
    fn bad_policies_say_what_is_wrong() {
        assert!(Access::parse(b"{}").unwrap_err().contains("grants"));
        assert!(Access::parse(br#"{"grants": [{"identities": []}]}"#)
            .unwrap_err()
            .contains("no identities"));
        assert!(
            Access::parse(br#"{"grants": [{"identities": ["a"], "chanels": []}]}"#)
                .unwrap_err()
                .contains("chanels")
        );
    }

    #[test]
    fn identities_come_from_the_certificate() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["node-1.example".into()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "node-1");
        let cert = params.self_signed(&key).unwrap();
        let id = Identity::from_der(cert.der()).unwrap();
        assert_eq!(id.names(), ["node-1", "node-1.example"]);
        assert!(Identity::from_der(b"not a certificate").is_err());
    }
}
