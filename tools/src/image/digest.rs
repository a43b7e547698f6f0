//! Content digests (`sha256:<64 hex>`), repository names and tags, validated
//! as the OCI distribution spec defines them (distribution-spec v1.1,
//! "Pulling manifests": the `<name>` and `<reference>` grammar; image-spec
//! "Descriptor / Digests" for the digest grammar). Only sha256 is accepted:
//! it is the algorithm every registry and runtime uses, and the one we verify.

use std::fmt;
use std::str::FromStr;

use sha2::{Digest as _, Sha256};

/// Why a name, tag or digest was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    /// Not `sha256:` followed by 64 lowercase hex digits.
    #[error("`{0}` is not a sha256 digest (sha256: followed by 64 lowercase hex digits)")]
    Digest(String),
    /// Not a repository name of the distribution spec's grammar.
    #[error("`{0}` is not a repository name ([a-z0-9] components separated by ., _, __, - or /)")]
    Name(String),
    /// Neither a tag nor a digest.
    #[error("`{0}` is neither a tag ([a-zA-Z0-9_][a-zA-Z0-9._-]{{0,127}}) nor a digest")]
    Reference(String),
    /// Not a registry host (`ns=`): `host[:port]`, at most 255 characters.
    #[error("`{0}` is not a registry host (host or host:port)")]
    Namespace(String),
}

/// A sha256 content digest.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest([u8; 32]);

impl Digest {
    /// The digest of `data`.
    pub fn of(data: &[u8]) -> Digest {
        Digest(Sha256::digest(data).into())
    }

    /// From the 32 raw bytes of a sha256 hash.
    pub fn from_bytes(b: [u8; 32]) -> Digest {
        Digest(b)
    }

    /// The 32 raw bytes.
    pub fn bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The 64 hex digits without the algorithm prefix (the cache's file name).
    pub fn hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl FromStr for Digest {
    type Err = NameError;
    fn from_str(s: &str) -> Result<Digest, NameError> {
        let bad = || NameError::Digest(s.chars().take(100).collect());
        let hexpart = s.strip_prefix("sha256:").ok_or_else(bad)?;
        if hexpart.len() != 64
            || !hexpart
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(bad());
        }
        let mut out = [0u8; 32];
        hex::decode_to_slice(hexpart, &mut out).map_err(|_| bad())?;
        Ok(Digest(out))
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", hex::encode(self.0))
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A manifest reference: a tag or a digest (distribution-spec "Pulling manifests").
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Reference {
    /// A tag: mutable, resolved by the upstream.
    Tag(String),
    /// A digest: the manifest's content must hash to it.
    Digest(Digest),
}

impl FromStr for Reference {
    type Err = NameError;
    fn from_str(s: &str) -> Result<Reference, NameError> {
        if s.contains(':') {
            return s.parse().map(Reference::Digest);
        }
        // distribution-spec: <reference> as a tag MUST be at most 128 characters
        // and match [a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}.
        let b = s.as_bytes();
        let ok = !b.is_empty()
            && b.len() <= 128
            && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
            && b[1..]
                .iter()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'));
        if ok {
            Ok(Reference::Tag(s.to_string()))
        } else {
            Err(NameError::Reference(s.chars().take(130).collect()))
        }
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reference::Tag(t) => f.write_str(t),
            Reference::Digest(d) => fmt::Display::fmt(d, f),
        }
    }
}

/// Check a repository name against the distribution spec's `<name>` grammar:
/// `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*(\/[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*)*`,
/// at most 255 characters (we allow a host:port prefix's characters nowhere:
/// the name is the path part).
pub fn check_name(name: &str) -> Result<(), NameError> {
    let bad = || NameError::Name(name.chars().take(260).collect());
    if name.is_empty() || name.len() > 255 {
        return Err(bad());
    }
    for component in name.split('/') {
        let b = component.as_bytes();
        let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
        if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
            return Err(bad());
        }
        let mut i = 0;
        while i < b.len() {
            if alnum(b[i]) {
                i += 1;
                continue;
            }
            // A separator run: ".", "_", "__" or one or more "-".
            let start = i;
            while i < b.len() && !alnum(b[i]) {
                i += 1;
            }
            let sep = &component[start..i];
            let ok = sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|c| c == b'-');
            if !ok {
                return Err(bad());
            }
        }
    }
    Ok(())
}

/// The separator of a scoped repository name, `NS//NAME`: never part of a
/// name (`check_name` refuses empty components) nor of a host.
const SCOPE: &str = "//";

/// A repository of a named upstream registry: containerd's mirror requests
/// carry the registry the image is from as `?ns=HOST` (containerd
/// docs/hosts.md), and a registry agent in front of several registries picks
/// one by it. Inside both agents such a repository is the one string
/// `NS//NAME`, so every table keyed by repository (references, manifest
/// cache) keeps registries apart; `ns` `None` is the plain name.
pub fn scoped(ns: Option<&str>, name: &str) -> String {
    match ns {
        Some(ns) => format!("{ns}{SCOPE}{name}"),
        None => name.to_string(),
    }
}

/// A scoped repository's registry host (if any) and name.
pub fn split_scope(repo: &str) -> (Option<&str>, &str) {
    match repo.split_once(SCOPE) {
        Some((ns, name)) => (Some(ns), name),
        None => (None, repo),
    }
}

/// Check a registry host as containerd names it in `ns=`: `host[:port]`
/// (letters, digits, `.`, `-`, an IPv6 literal's `[`, `]`, `:`), at most
/// 255 characters.
pub fn check_namespace(ns: &str) -> Result<(), NameError> {
    let ok = !ns.is_empty()
        && ns.len() <= 255
        && ns
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'-' | b':' | b'[' | b']'));
    if ok {
        Ok(())
    } else {
        Err(NameError::Namespace(ns.chars().take(260).collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes() {
        let s = scoped(Some("registry.example:5000"), "a/b");
        assert_eq!(s, "registry.example:5000//a/b");
        assert_eq!(split_scope(&s), (Some("registry.example:5000"), "a/b"));
        assert_eq!(split_scope("a/b"), (None, "a/b"));
        assert_eq!(scoped(None, "a/b"), "a/b");
        check_namespace("docker.io").unwrap();
        check_namespace("[::1]:5000").unwrap();
        for bad in ["", "a/b", "a b", "x?y", &"a".repeat(256)] {
            assert!(check_namespace(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn digests() {
        let d = Digest::of(b"");
        let s = d.to_string();
        assert_eq!(
            s,
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(s.parse::<Digest>().unwrap(), d);
        assert!("sha256:E3B0".parse::<Digest>().is_err());
        assert!("sha512:00".parse::<Digest>().is_err());
        assert!(s.to_uppercase().parse::<Digest>().is_err());
    }

    #[test]
    fn names() {
        for ok in ["a", "library/busybox", "a.b_c__d---e/f0", "x/y/z"] {
            check_name(ok).unwrap();
        }
        for bad in [
            "", "A", "a//b", "/a", "a/", "a..b", "a___b", "-a", "a-", "a b",
        ] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn references() {
        assert_eq!(
            "v1.0".parse::<Reference>().unwrap(),
            Reference::Tag("v1.0".into())
        );
        assert!(".x".parse::<Reference>().is_err());
        assert!("a".repeat(129).parse::<Reference>().is_err());
        let d = Digest::of(b"x");
        assert_eq!(
            d.to_string().parse::<Reference>().unwrap(),
            Reference::Digest(d)
        );
    }
}
